"""What a what-if answer (`POST jobs?dry_run=1`) costs against a plain submit, on a 10k queue.

    .venv/bin/python benchmarks/bench_whatif.py [--queue 10000] [--requests 200] [--rounds 5]

A live server with fake GPUs 8xA100,8xT4: every GPU held by a running job, then `--queue`
pending 1-GPU jobs (one burst from 16 connections, as bench_api's "busy" scenario), so the
what-if's line books every one of them. Then, in turns within each round (these machines are
noisy: a ratio compares the same seconds; which goes first alternates, and each starts 2 s
after the other ended, once the cycles a round of submits sets off are done), `--requests`
plain submits and `--requests` what-ifs of the same request (1xA100, 1h: it waits, and has
nearby choices), one after the other on one keep-alive connection: the latency a user sees,
server and HTTP included. Prints
each round's medians and their ratio (target: what-if <= 2x submit), the median of the
ratios, and the what-if's p90 (the answers that rebuilt the line after a new plan).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from bench_api import rate, start_server  # noqa: E402
from servers import LiveServer, stop_job_processes  # noqa: E402

SETTLE_S = 2.0  # > the estimate's "within a second of new jobs"
REQUEST = {"command": ["true"], "gpus": 1, "gpu_type": "A100", "time_limit": "1h", "name": "bench"}


async def latencies(server: LiveServer, path: str, body: dict, n: int) -> list[float]:
    """Seconds per request, `n` requests one after the other on one keep-alive connection."""
    payload = json.dumps(body).encode()
    head = (f"POST {server.base_url}gpujobs/api/{path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: token {server.token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        writer.write(head + payload)
        status = await reader.readline()
        assert status.split()[1] in (b"200", b"201"), status
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        await reader.readexactly(length)
        out.append(time.perf_counter() - t0)
    writer.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queue", type=int, default=10_000)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        server = start_server(Path(d) / "s", "8xA100,8xT4")
        try:
            client = server.client()
            holders = [client.submit(["sleep", "3600"], gpus=1, time_limit="2h")["id"] for _ in client.gpus()]
            deadline = time.monotonic() + 60
            while any(client.job(h)["state"] != "RUNNING" for h in holders):
                assert time.monotonic() < deadline, "the GPU holders did not start"
                time.sleep(0.2)
            asyncio.run(rate(server, "jobs", args.queue, "POST", {"command": ["true"], "gpus": 1, "time_limit": "1h"}))
            while client.queue_page(limit=1)["total"] < args.queue:
                time.sleep(0.2)
            time.sleep(3)  # the estimate of the burst
            answer = client.what_if(**{k: v for k, v in REQUEST.items() if k != "command"}, command=["true"])
            print(f"queue {client.queue_page(limit=1)['total']} pending, {len(holders)} GPUs held; the what-if says: "
                  f"start in {answer['expected_start'] - answer['now']:.0f} s, "
                  f"{len(answer['alternatives'])} nearby choice(s) sooner")
            ratios, whatif_all = [], []
            for r in range(args.rounds):
                phases = {}
                # in turns, each first every other round, each after the server settled (the
                # cycles and the estimate that a round of submits sets off would else fall on
                # whatever comes next)
                for path in (("jobs", "jobs?dry_run=1") if r % 2 == 0 else ("jobs?dry_run=1", "jobs")):
                    time.sleep(SETTLE_S)
                    phases[path] = asyncio.run(latencies(server, path, REQUEST, args.requests))
                sub, dry = phases["jobs"], phases["jobs?dry_run=1"]
                whatif_all += dry
                ms, md = statistics.median(sub) * 1000, statistics.median(dry) * 1000
                ratios.append(md / ms)
                print(f"  round {r + 1}/{args.rounds}: submit median {ms:.2f} ms, what-if median {md:.2f} ms "
                      f"(p90 {sorted(dry)[int(0.9 * (len(dry) - 1))] * 1000:.2f} ms, max {max(dry) * 1000:.1f} ms); "
                      f"ratio {md / ms:.2f}", flush=True)
            p90 = sorted(whatif_all)[int(0.9 * (len(whatif_all) - 1))] * 1000
            print(f"what-if / plain submit on a {args.queue} queue: median ratio {statistics.median(ratios):.2f} "
                  f"(rounds {min(ratios):.2f}-{max(ratios):.2f}; target <= 2); what-if p90 {p90:.2f} ms, "
                  f"mean {statistics.mean(whatif_all) * 1000:.2f} ms")
        finally:
            server.stop()
            stop_job_processes(server.state_dir / "run")


if __name__ == "__main__":
    main()
