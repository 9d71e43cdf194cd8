"""Dispatch on the shared engine: from a GPU freeing to the next job's process running as its
user, and the makespan of 48 × 1 s jobs on 4 fake GPUs against the ideal 12 s.

    sudo .venv/bin/python benchmarks/bench_dispatch.py [--jobs 48]

Needs root and the test users (`scripts/install-multiuser.sh`). Starts a real shared engine
(`jupyter gpujobs engine`, root, fake GPUs) and submits the jobs alternately as two Unix
users on its socket; each job (`sh`, running as its owner) writes the time it started and
ended. Then, in the same run, the same jobs on an embedded engine (a Jupyter server hosting
it, jobs as the server's user), the figures printed side by side.

Latency: for each GPU, the next job's start minus the previous job's end on that GPU.
Makespan: the first job's start to the last job's end. Targets: median latency ≤ 50 ms and
makespan ≤ 1.05 × ideal on the shared engine.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from servers import live_servers  # noqa: E402
from team import USER_PYTHON, USERS, Team, as_user, missing, user_env  # noqa: E402

GPUS = 4
JOB_S = 1.0


def job_command(out: Path) -> list[str]:
    """A 1 s job that writes when it started and ended (as whoever it runs as)."""
    return ["sh", "-c", f'date +%s.%N > {out}/$GPUJOBS_JOB_ID.start; id -u > {out}/$GPUJOBS_JOB_ID.uid; '
                        f'sleep {JOB_S}; date +%s.%N > {out}/$GPUJOBS_JOB_ID.end']


def job_body(out: Path) -> dict[str, Any]:
    return {"command": job_command(out), "gpus": 1, "time_limit": "5m", "cwd": str(out)}


def measure(ids: list[int], get: Callable[[int], dict[str, Any]], out: Path,
            events: Callable[[int], list[dict[str, Any]]]) -> dict[str, Any]:
    """The figures of jobs `ids` (submitted), once they have all run. Each re-dispatch is also
    split in three from the engine's events: the job's end seen and recorded (`detect`), the
    next job decided and recorded RUNNING (`decide`), its process running as its user (`spawn`)."""
    deadline = time.monotonic() + 60 + len(ids) * JOB_S
    while not all((out / f"{i}.end").exists() for i in ids):
        if time.monotonic() > deadline:
            raise SystemExit("jobs did not finish in time")
        time.sleep(0.2)
    time.sleep(0.5)  # the engine records their ends
    jobs = {i: get(i) for i in ids}
    start = {i: float((out / f"{i}.start").read_text()) for i in ids}
    end = {i: float((out / f"{i}.end").read_text()) for i in ids}
    uids = {i: int((out / f"{i}.uid").read_text()) for i in ids}
    times = {i: {e["state"]: float(e["time"]) for e in events(i)} for i in ids}
    gaps: list[float] = []
    parts: dict[str, list[float]] = {"detect": [], "result": [], "record": [], "decide": [], "spawn": []}
    for gpu in range(GPUS):
        on_gpu = sorted((i for i in ids if jobs[i]["assigned_gpus"] == [gpu]), key=start.__getitem__)
        for a, b in zip(on_gpu, on_gpu[1:]):
            gaps.append(start[b] - end[a])
            ended, running = times[a].get("COMPLETED"), times[b].get("RUNNING")
            if ended is not None and running is not None:
                parts["detect"].append(ended - end[a])
                if jobs[a].get("ended_at"):  # the supervisor's result time
                    parts["result"].append(float(jobs[a]["ended_at"]) - end[a])
                    parts["record"].append(ended - float(jobs[a]["ended_at"]))
                parts["decide"].append(running - ended)
                parts["spawn"].append(start[b] - running)
    first = sorted(start.values())[:GPUS]
    return {"latency": statistics.median(gaps), "p90": sorted(gaps)[int(0.9 * (len(gaps) - 1))],
            "mean_gap": statistics.fmean(gaps), "first_spread": first[-1] - first[0],
            "body": statistics.fmean(end[i] - start[i] for i in ids),
            "makespan": max(end.values()) - min(start.values()), "jobs": jobs, "uids": uids,
            **{k: statistics.median(v) if v else float("nan") for k, v in parts.items()}}


def shared(n: int) -> dict[str, Any]:
    import httpx

    with Team(fake_gpus=f"{GPUS}xA100", users=()) as team:
        out = team.base / "out"
        out.mkdir(mode=0o1777)
        out.chmod(0o1777)
        # each user submits all of their jobs from one process of theirs, on the socket (the
        # submissions are not what is measured)
        code = ("import httpx, json, sys; c = httpx.Client(transport=httpx.HTTPTransport(uds={sock!r}), "
                "base_url='http://x/gpujobs/api/'); body = json.loads(sys.argv[1]); "
                "print(json.dumps([c.post('jobs', json=body).json()['id'] for _ in range({k})]))")
        per_user = {u: n // len(USERS) + (1 if k < n % len(USERS) else 0) for k, u in enumerate(USERS)}
        body = job_body(out)
        ids: list[int] = []
        procs = [subprocess.Popen(as_user(u, [str(USER_PYTHON), "-c", code.format(sock=str(team.socket), k=k),
                                              json.dumps(body)]),
                                  stdout=subprocess.PIPE, text=True, cwd="/", env=user_env(u, Path("/tmp")))
                 for u, k in per_user.items()]
        for p in procs:
            ids += json.loads(p.communicate()[0])
        root = httpx.Client(transport=httpx.HTTPTransport(uds=str(team.socket)), base_url="http://x/gpujobs/api/")
        result = measure(ids, lambda i: root.get(f"jobs/{i}").json(), out,
                         lambda i: root.get(f"jobs/{i}/events").json()["events"])
        owners = {pwd.getpwnam(j["user"]).pw_uid for j in result["jobs"].values()}
        assert all(result["uids"][i] == pwd.getpwnam(j["user"]).pw_uid for i, j in result["jobs"].items()), \
            "a job ran as someone other than its owner"
        result["users"] = len(owners)
        return result


def embedded(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        factory = live_servers(base)
        make = next(factory)
        try:
            server = make(fake_gpus=f"{GPUS}xA100")
            out = base / "out"
            out.mkdir()
            with server.client() as c:
                return measure([c.submit(**job_body(out))["id"] for _ in range(n)], c.job, out, c.events)
        finally:
            next(factory, None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=48)
    args = p.parse_args()
    why = missing()
    if why:
        raise SystemExit(f"bench_dispatch: {why}")
    ideal = args.jobs * JOB_S / GPUS
    s = shared(args.jobs)
    e = embedded(args.jobs)
    print(f"{args.jobs} x {JOB_S:.0f} s jobs on {GPUS} fake GPUs (ideal makespan {ideal:.1f} s); "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'':34}{'shared engine':>16}{'embedded engine':>18}{'target (shared)':>18}")
    print(f"{'GPU free -> next job running, median':34}{s['latency'] * 1000:>13.1f} ms{e['latency'] * 1000:>15.1f} ms"
          f"{'<= 50 ms':>18}")
    print(f"{'  90th percentile':34}{s['p90'] * 1000:>13.1f} ms{e['p90'] * 1000:>15.1f} ms")
    for key, text in (("detect", "end seen and recorded"), ("result", "  supervisor's result"),
                      ("record", "  engine records it"), ("decide", "next job decided, RUNNING"),
                      ("spawn", "its process running")):
        print(f"{'  of which ' + text:34}{s[key] * 1000:>13.1f} ms{e[key] * 1000:>15.1f} ms")
    print(f"{'makespan':34}{s['makespan']:>14.2f} s{e['makespan']:>16.2f} s{'':>18}")
    for key, text in (("first_spread", "first starts, spread"), ("mean_gap", "gaps, mean")):
        print(f"{'  ' + text:34}{s[key] * 1000:>13.1f} ms{e[key] * 1000:>15.1f} ms")
    print(f"{'  job body (start to end), mean':34}{s['body']:>14.3f} s{e['body']:>16.3f} s")
    print(f"{'makespan / ideal':34}{s['makespan'] / ideal:>15.3f}x{e['makespan'] / ideal:>17.3f}x{'<= 1.05x':>18}")
    print(f"shared engine: jobs of {s['users']} users, each ran as its owner's uid")


if __name__ == "__main__":
    main()
