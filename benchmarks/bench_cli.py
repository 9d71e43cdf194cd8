"""Wall time of one `jupyter gpujobs` call, as a user in a terminal sees it.

    .venv/bin/python benchmarks/bench_cli.py [--runs 9]

Starts its own `jupyter server` (fake GPUs, temporary dirs, one job in the list), then times
`jupyter gpujobs list` finding that server in Jupyter's runtime dir, and the same call given
`--url`/`--token`. The baseline, measured in the same run, is the interpreter starting and
exiting (`python -c pass`): what any command-line tool written in Python pays.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_api import start_server, stop_job_processes  # bench_api puts tests/ on the path

BIN = Path(sys.executable).parent


def timed(argv: list[str], env: dict[str, str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=9)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        server = start_server(Path(d), "2xA100")
        try:
            server.client().submit(["true"], gpus=1, time_limit="1m")
            env = server.env
            base = timed([sys.executable, "-c", "pass"], env, args.runs)
            found = timed([str(BIN / "jupyter"), "gpujobs", "list"], env, args.runs)
            url = f"http://127.0.0.1:{server.port}/"
            given = timed([str(BIN / "jupyter"), "gpujobs", "--url", url, "--token", server.token, "list"],
                          env, args.runs)
        finally:
            server.stop()
            stop_job_processes(server.state_dir / "run")
    print(f"jupyter gpujobs list, server found in the runtime dir: median {found * 1000:.0f} ms; "
          f"ratio {found / base:.1f} to the baseline")
    print(f"jupyter gpujobs list --url --token: median {given * 1000:.0f} ms; ratio {given / base:.1f}")
    print(f"baseline python -c pass: median {base * 1000:.0f} ms")


if __name__ == "__main__":
    main()
