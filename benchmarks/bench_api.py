"""REST submit throughput and dispatch latency against a live server with fake GPUs.

    .venv/bin/python benchmarks/bench_api.py [--submits 2000] [--rounds 3] [--dispatches 15]

Prints medians, and ratios against baselines measured in the same run on the same server
(these machines are noisy): submissions/s against authenticated `GET whoami` requests/s, and
dispatch latency against the time to spawn the same tiny process directly.

- throughput: N `POST jobs` from 16 concurrent connections, in two scenarios, each on its own
  server: "deferred", jobs with `begin: +1d` (each its own begin time, so each is its own class
  for the scheduler: the costliest queue for its cycles), and "busy", a burst of one spec into a
  cluster whose GPUs are all held (the usual burst: a sweep while the GPUs are taken). Both grow
  the queue, and each scheduling cycle sees it.
- each connection keeps the login cookie the server sets in answer to its token, as
  `jupyter_gpujobs.client` (an httpx client) and browsers do.
- dispatch latency: on one GPU, job A ends; the time from A's last instruction to job B's first
  (both `sh -c 'date +%s.%N'`), i.e. exit noticed + cycle + supervisor start + exec.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from servers import LiveServer, free_port, stop_job_processes  # noqa: E402


def start_server(tmp: Path, fake: str) -> LiveServer:
    root, state, home = tmp / "root", tmp / "state", tmp / "home"
    for d in (root, state, home):
        d.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "c"), "JUPYTER_DATA_DIR": str(home / "d"),
           "JUPYTER_RUNTIME_DIR": str(home / "r"), "GPUJOBS_FAKE_GPUS": fake}
    args = ["--no-browser", "--ip=127.0.0.1", f"--port={port}", "--IdentityProvider.token=bench",
            f"--ServerApp.root_dir={root}", "--ServerApp.jpserver_extensions=jupyter_gpujobs=True",
            f"--GPUJobs.state_dir={state}", "--allow-root", "--ServerApp.log_level=WARN"]
    return LiveServer(root=root, state_dir=state, port=port, token="bench", base_url="/", env=env,
                      args=args).start()


async def rate(server: LiveServer, path: str, n: int, method: str, body: dict | None,
               concurrency: int = 16) -> float:
    """Requests/s over `concurrency` keep-alive connections. A minimal HTTP/1.1 client on
    asyncio streams: a full client library costs more CPU per request than the server does,
    and on a 2-core machine it would measure itself."""
    payload = json.dumps(body).encode() if body is not None else b""
    head = (f"{method} {server.base_url}gpujobs/api/{path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: token {server.token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n").encode()
    counter = iter(range(n))

    async def worker() -> None:
        # like httpx.Client (jupyter_gpujobs.client) and browsers, keep the login cookie the
        # server sets in answer to the token: the server then knows the user without a new one
        cookies: dict[bytes, bytes] = {}
        request = head + b"\r\n" + payload
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        for _ in counter:
            writer.write(request)
            status = await reader.readline()
            assert status.split()[1] in (b"200", b"201"), status
            length = 0
            set_cookie = False
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
                elif name.lower() == b"set-cookie":
                    k, _, v = value.strip().split(b";")[0].partition(b"=")
                    cookies[k] = v
                    set_cookie = True
            await reader.readexactly(length)
            if set_cookie:
                jar = b"; ".join(k + b"=" + v for k, v in cookies.items())
                request = head + b"Cookie: " + jar + b"\r\n\r\n" + payload
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return n / (time.perf_counter() - t0)


def throughput(server: LiveServer, n: int, rounds: int, scenario: str) -> None:
    submit: dict[str, object] = {"command": ["true"], "gpus": 1, "time_limit": "1m"}
    if scenario == "deferred":
        submit["begin"] = "+1d"
    else:  # hold every GPU first: the burst queues behind them
        client = server.client()
        holders = [client.submit(["sleep", "600"], gpus=1, time_limit="20m")["id"] for _ in client.gpus()]
        deadline = time.monotonic() + 30
        while any(client.job(h)["state"] != "RUNNING" for h in holders):
            assert time.monotonic() < deadline, "the GPU holders did not start"
            time.sleep(0.1)
    subs, gets = [], []
    for r in range(rounds):
        gets.append(asyncio.run(rate(server, "whoami", n, "GET", None)))
        subs.append(asyncio.run(rate(server, "jobs", n, "POST", submit)))
        print(f"  {scenario} round {r + 1}/{rounds}: {subs[-1]:.0f} submissions/s, baseline {gets[-1]:.0f} "
              "GET whoami/s", flush=True)
    s, g = statistics.median(subs), statistics.median(gets)
    print(f"REST submit throughput ({scenario}): median {s:.0f} jobs/s (target >= 1000); "
          f"baseline GET whoami {g:.0f} req/s; ratio {s / g:.2f}")



def dispatch(server: LiveServer, runs: int, tmp: Path) -> None:
    client = server.client()
    lat, spawn = [], []
    for i in range(runs):
        a_end, b_start = tmp / f"a{i}", tmp / f"b{i}"
        a = client.submit(["sh", "-c", f"sleep 0.3; date +%s.%N > {a_end}"], gpus=1, time_limit=60)
        b = client.submit(["sh", "-c", f"date +%s.%N > {b_start}"], gpus=1, time_limit=60)
        client.wait(b["id"], timeout=30)
        client.wait(a["id"], timeout=30)
        lat.append(float(b_start.read_text()) - float(a_end.read_text()))
        t0 = time.time()
        out = subprocess.run(["sh", "-c", "date +%s.%N"], capture_output=True, text=True).stdout
        spawn.append(float(out) - t0)
    m, base = statistics.median(lat), statistics.median(spawn)
    print(f"dispatch latency: median {m * 1000:.1f} ms (p90 {sorted(lat)[int(0.9 * (len(lat) - 1))] * 1000:.1f} ms,"
          f" target <= 100 ms); baseline direct spawn {base * 1000:.1f} ms; ratio {m / base:.1f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--submits", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dispatches", type=int, default=15)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        server = start_server(tmp / "s1", "1xA100")
        try:
            dispatch(server, args.dispatches, tmp)
        finally:
            server.stop()
            stop_job_processes(server.state_dir / "run")
        for scenario in ("deferred", "busy"):
            server = start_server(tmp / f"s-{scenario}", "8xA100")
            try:
                throughput(server, args.submits, args.rounds, scenario)
            finally:
                server.stop()
                stop_job_processes(server.state_dir / "run")  # jobs outlive their server


if __name__ == "__main__":
    main()
