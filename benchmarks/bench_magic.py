"""Round-trip time of a trivial `%%gpujob` cell on an idle server.

    python benchmarks/bench_magic.py [--runs 15] [--gpus 1xA100]

Starts its own `jupyter server` (fake GPUs, temporary dirs) and a kernel that talks to it, then
times, from `execute_request` to `execute_reply` as a notebook front end sees it:

- the cell `%%gpujob -t 1m` + `x = 1` (submit, schedule, start on a GPU, run, stream, finish);
- the baseline: the same code run in a fresh Python process from the kernel,
  `subprocess.run([sys.executable, "-c", "x = 1"])` — the floor any "run it elsewhere" pays.

Prints the median, best and worst of each, the ratio of the medians and the overhead; the target
is a median of at most 1.5 s for the cell.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from jupyter_client.manager import KernelManager

TARGET_S = 1.5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp: Path, gpus: str) -> tuple[subprocess.Popen[bytes], str, str, dict[str, str]]:
    root, state, home = tmp / "root", tmp / "state", tmp / "home"
    for d in (root, state, home):
        d.mkdir()
    port, token = free_port(), "bench-token"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "GPUJOBS_FAKE_GPUS": gpus, "PYTHONUNBUFFERED": "1",
           "IPYTHONDIR": str(home / "ipython")}
    env.pop("GPUJOBS_URL", None)
    env.pop("GPUJOBS_TOKEN", None)
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--ServerApp.jpserver_extensions=jupyter_gpujobs=True", f"--GPUJobs.state_dir={state}", "--allow-root"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited:\n{(tmp / 'server.log').read_text()[-3000:]}")
        try:
            if httpx.get(url + "gpujobs/api/whoami", headers={"Authorization": f"token {token}"},
                         timeout=1).status_code == 200:
                return proc, url, token, env
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not answer within 60 s")


def timed(kc: object, code: str) -> float:
    """Seconds from sending `code` to its execute_reply; fails on an error reply."""
    t0 = time.perf_counter()
    reply = kc.execute_interactive(code, timeout=60, output_hook=lambda msg: None)  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - t0
    if reply["content"]["status"] != "ok":
        raise SystemExit(f"cell failed: {reply['content'].get('ename')}: {reply['content'].get('evalue')}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--gpus", default="1xA100", help="fake GPUs of the server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-magic-") as tmpdir:
        tmp = Path(tmpdir)
        proc, url, token, env = start_server(tmp, args.gpus)
        km = KernelManager(kernel_name="python3")
        try:
            km.start_kernel(env={**env, "GPUJOBS_URL": url, "GPUJOBS_TOKEN": token}, cwd=str(tmp / "root"))
            kc = km.client()
            kc.start_channels()
            kc.wait_for_ready(timeout=60)
            timed(kc, "%load_ext jupyter_gpujobs\nimport subprocess, sys")
            cell = "%%gpujob -t 1m\nx = 1\n"
            baseline = "subprocess.run([sys.executable, '-c', 'x = 1'], check=True)"
            timed(kc, cell)  # warm up: imports, the first connection
            timed(kc, baseline)
            cells, bases = [], []
            for _ in range(args.runs):
                cells.append(timed(kc, cell))
                bases.append(timed(kc, baseline))
            kc.stop_channels()
        finally:
            km.shutdown_kernel(now=True)
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    med_cell, med_base = statistics.median(cells), statistics.median(bases)
    print(f"%%gpujob trivial cell, {args.runs} runs on an idle server ({args.gpus}):")
    print(f"  %%gpujob    median {med_cell:.3f} s  (best {min(cells):.3f}, worst {max(cells):.3f})")
    print(f"  baseline   median {med_base:.3f} s  (best {min(bases):.3f}, worst {max(bases):.3f})"
          "  subprocess.run([sys.executable, '-c', ...]) from the kernel")
    print(f"  ratio      {med_cell / med_base:.1f}x the baseline; overhead {med_cell - med_base:.3f} s")
    verdict = "meets" if med_cell <= TARGET_S else "MISSES"
    print(f"  target     median <= {TARGET_S} s: {verdict}")


if __name__ == "__main__":
    main()
