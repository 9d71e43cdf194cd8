"""Re-dispatch latency under polling load: a live server with fake GPUs, 10,000 jobs queued,
50 clients polling `GET queue` (the first page) as the widgets and the panel do, and 50
websockets open on the events feed (`events`) as the panels are.

    .venv/bin/python benchmarks/chaos_load.py [--quick] [--clients 50] [--websockets 50] [--interval 1.0]

Every queued job records, on its GPU, when it starts and when it ends (`date +%s.%N` in the
job itself), runs a fraction of a second, and the next job takes its GPU. The re-dispatch
latency is the time from one job's last instruction to the next job's first on the same GPU:
exit noticed + scheduling cycle over the deep queue + supervisor start + exec. It is measured
twice on the same server and queue: with no client (the baseline, same run) and with the
polling clients and the websockets, which read every message the engine sends them. Targets: p99 <= 100 ms under the load, and the ratio to the baseline.

The clients are bounded in number and time, and talk to the loopback interface only.
`run(quick=False)` returns the figures (`benchmarks/chaos.py` calls it); run alone it prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from servers import LiveServer, stop_job_processes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_api import start_server  # noqa: E402

QUEUED = 10_000
GPUS = 4
JOB_SECONDS = 0.3


def _job(marks: Path) -> list[str]:
    stamp = '"$GPUJOBS_GPU_UUIDS $(date +%s.%N)"'
    return ["sh", "-c", f"echo {stamp} > {marks}/s$GPUJOBS_JOB_ID; sleep {JOB_SECONDS}; "
                        f"echo {stamp} > {marks}/e$GPUJOBS_JOB_ID"]


def _queue(server: LiveServer, marks: Path, n: int) -> None:
    """`n` jobs behind the running ones, as arrays of at most 10,000 tasks."""
    client = server.client()
    client.timeout = 300
    left = n
    while left > 0:
        size = min(left, 10_000)
        client.submit(_job(marks), gpus=1, time_limit="10m", name="load", array=f"0-{size - 1}")
        left -= size


def _latencies(marks: Path, since: float, until: float,
               records: dict[int, dict[str, float]] | None = None) -> list[tuple[float, float, float]]:
    """For each job's end in [since, until): (seconds to the next job's first instruction on the
    same GPU, of which until the engine recorded the end, and from the engine's start of the
    next job to its first instruction), the last two when `records` has the jobs' times."""
    runs: dict[str, list[tuple[float, float, int]]] = {}
    for start in marks.glob("s*"):
        end = marks / ("e" + start.name[1:])
        try:
            gpu, t0 = start.read_text().split()
            t1 = float(end.read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # still running, or cut off
        runs.setdefault(gpu, []).append((float(t0), t1, int(start.name[1:])))
    out = []
    records = records or {}
    for intervals in runs.values():
        intervals.sort()
        for (_, prev_end, prev_id), (next_start, _, next_id) in zip(intervals, intervals[1:]):
            if since <= prev_end < until:
                ended = records.get(prev_id, {}).get("ended_at")
                started = records.get(next_id, {}).get("started_at")
                out.append((next_start - prev_end, (ended - prev_end) if ended else float("nan"),
                            (next_start - started) if started else float("nan")))
    return out


async def _poller(server: LiveServer, interval: float, stop_at: float, counts: list[int], sizes: list[int],
                  offset: float) -> None:
    """One client: `GET queue` (the first page) every `interval` seconds on a keep-alive
    connection until `stop_at`, keeping the login cookie as the Python client and browsers do."""
    head = (f"GET {server.base_url}gpujobs/api/queue HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: token {server.token}\r\n").encode()
    request = head + b"\r\n"
    await asyncio.sleep(offset)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        while time.time() < stop_at:
            began = time.monotonic()
            writer.write(request)
            status = await reader.readline()
            assert status.split()[1] == b"200", status
            length, cookie = 0, b""
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
                elif name.lower() == b"set-cookie":
                    cookie = value.strip().split(b";")[0]
            await reader.readexactly(length)
            if cookie:
                request = head + b"Cookie: " + cookie + b"\r\n\r\n"
            counts.append(1)
            sizes.append(length)
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)))
    finally:
        writer.close()


async def _listener(server: LiveServer, stop_at: float, received: list[int]) -> None:
    """One websocket on the events feed, reading every message until `stop_at`."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    url = f"ws://127.0.0.1:{server.port}{server.base_url}gpujobs/api/events"
    ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {server.token}"}))
    try:
        while (left := stop_at - time.time()) > 0:
            try:
                message = await asyncio.wait_for(ws.read_message(), left)
            except asyncio.TimeoutError:
                break
            if message is None:
                raise RuntimeError("the server closed an events websocket")
            received.append(len(message))
    finally:
        ws.close()


async def _load(server: LiveServer, clients: int, interval: float, seconds: float,
                websockets: int = 0) -> tuple[float, int, float]:
    """(polls answered per second, the largest reply, websocket messages received per second)."""
    counts: list[int] = []
    sizes: list[int] = []
    received: list[int] = []
    stop_at = time.time() + seconds
    await asyncio.gather(*(_poller(server, interval, stop_at, counts, sizes, i * interval / clients)
                           for i in range(clients)),
                         *(_listener(server, stop_at, received) for _ in range(websockets)))
    return len(counts) / seconds, (max(sizes) if sizes else 0), len(received) / seconds


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run(quick: bool = False, clients: int = 50, interval: float = 1.0, queued: int = QUEUED,
        websockets: int = 50) -> dict[str, float]:
    """Start a server with fake GPUs, queue `queued` jobs, measure re-dispatch latency with no
    client and then with `clients` clients polling every `interval` s and `websockets` open on
    the events feed; print and return it."""
    seconds = 10.0 if quick else 40.0
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        marks = tmp / "marks"
        marks.mkdir()
        server = start_server(tmp / "server", f"{GPUS}xA100")
        try:
            t0 = time.time()
            _queue(server, marks, queued + int(4 * seconds * GPUS / JOB_SECONDS))
            queued_s = time.time() - t0
            time.sleep(3.0)  # the first cycles over the deep queue, the first jobs started
            idle_from = time.time()
            time.sleep(seconds)
            load_from = time.time()
            polls_per_s, reply_bytes, messages_per_s = asyncio.run(
                _load(server, clients, interval, seconds, websockets))
            load_until = time.time()
            time.sleep(2 * JOB_SECONDS + 1.0)  # the last measured ends get their successors
            client = server.client()
            pending = client.queue_page(limit=1)["total"]
            records: dict[int, dict[str, float]] = {}
            cursor = None
            while len(records) < 5000:
                page = client.jobs(state="COMPLETED", limit=1000, cursor=cursor)
                records.update({j["id"]: j for j in page["jobs"]})
                cursor = page["next"]
                if cursor is None:
                    break
        finally:
            server.stop()
            stop_job_processes(server.state_dir / "run")
        idle_parts = _latencies(marks, idle_from, load_from, records)
        loaded_parts = _latencies(marks, load_from, load_until, records)
        idle = [p[0] for p in idle_parts]
        loaded = [p[0] for p in loaded_parts]
    if not idle or not loaded:
        raise RuntimeError(f"too few dispatches measured (idle {len(idle)}, under load {len(loaded)})")
    result = {
        "redispatch_p50_ms": _pct(loaded, 0.5) * 1000,
        "redispatch_p99_ms": _pct(loaded, 0.99) * 1000,
        "idle_redispatch_p50_ms": _pct(idle, 0.5) * 1000,
        "idle_redispatch_p99_ms": _pct(idle, 0.99) * 1000,
        "dispatches_measured": float(len(loaded)),
        "polls_per_s": polls_per_s,
        "websocket_messages_per_s": messages_per_s,
        "redispatch_p99_ratio": _pct(loaded, 0.99) / _pct(idle, 0.99),
        "queue_reply_kb": reply_bytes / 1024,
        "pending_jobs_after": float(pending),
        "queue_seconds": queued_s,
    }
    print(f"re-dispatch latency with {clients} clients polling GET queue every {interval:g} s and "
          f"{websockets} events websockets, {pending} jobs pending, {GPUS} fake GPUs:")
    print(f"  under load: p50 {result['redispatch_p50_ms']:.1f} ms, p99 {result['redispatch_p99_ms']:.1f} ms "
          f"(target p99 <= 100 ms) over {len(loaded)} dispatches; {polls_per_s:.0f} polls/s answered, "
          f"{result['queue_reply_kb']:.0f} KiB each; {messages_per_s:.0f} websocket messages/s read")
    print(f"  baseline, no client: p50 {result['idle_redispatch_p50_ms']:.1f} ms, "
          f"p99 {result['idle_redispatch_p99_ms']:.1f} ms over {len(idle)} dispatches; "
          f"ratio p99 {result['redispatch_p99_ratio']:.2f} (target <= 1.5 on a busy machine), "
          f"p50 {statistics.median(loaded) / statistics.median(idle):.2f}")
    print(f"  (queueing {queued} jobs took {queued_s:.1f} s)")
    for name, parts in (("under load", loaded_parts), ("baseline", idle_parts)):
        exits = [p[1] for p in parts if p[1] == p[1]]
        starts = [p[2] for p in parts if p[2] == p[2]]
        if exits and starts:
            print(f"  {name}, medians: end of a job to its end recorded {statistics.median(exits) * 1000:.1f} ms; "
                  f"recorded start to the job's first instruction {statistics.median(starts) * 1000:.1f} ms; "
                  f"the engine in between (cycle, launch) "
                  f"{(statistics.median([p[0] for p in parts]) - statistics.median(exits) - statistics.median(starts)) * 1000:.1f} ms")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="10 s per phase instead of 40")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--websockets", type=int, default=50, help="websockets open on the events feed")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between one client's polls")
    p.add_argument("--queued", type=int, default=QUEUED)
    args = p.parse_args()
    if not 1 <= args.clients <= 200 or not 0 <= args.websockets <= 200 or args.interval < 0.01:
        p.error("--clients is 1 to 200, --websockets 0 to 200 and --interval at least 0.01 s")
    run(args.quick, args.clients, args.interval, args.queued, args.websockets)


if __name__ == "__main__":
    main()
