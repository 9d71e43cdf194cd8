"""Start time of a GPU kernel against a plain local python3 kernel, on an idle server.

    .venv/bin/python benchmarks/bench_kernel_start.py [--runs 15] [--fake-gpus 1xA100] [--max-ratio 1.15]

Starts one `jupyter server` (fake GPUs, only the jupyter-gpujobs extension) in a temporary
folder, installs a GPU kernelspec wrapping python3 there, then, alternating which goes first,
times N starts of each kernel: from `POST /api/kernels` until the kernel's `kernel_info_reply`
(over the connection file, as a notebook front end would see it ready). Each kernel is shut
down (`DELETE`) before the next start, so the GPU is free every time and the GPU start pays
the whole queue round trip (submit, one scheduling cycle, allocation) but no wait.

Prints the medians and their ratio (target: <= 1.15); exits 1 when the ratio is above
--max-ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from queue import Empty

import httpx

LEAN = [*(f"--ServerApp.jpserver_extensions={name}=False"
          for name in ("jupyterlab", "jupyter_lsp", "notebook_shim", "jupyter_server_terminals")),
        # other servers' fake backends on this machine would see marked kernels on "their" GPUs
        "--GPUKernelProvisioner.mark_fake_gpu_use=False"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, folder: Path, fake_gpus: str):
        self.port = _port()
        self.token = "bench"
        self.url = f"http://127.0.0.1:{self.port}/"
        for sub in ("root", "state", "data", "config", "runtime"):
            (folder / sub).mkdir()
        self.env = {**os.environ, "JUPYTER_DATA_DIR": str(folder / "data"),
                    "JUPYTER_CONFIG_DIR": str(folder / "config"), "JUPYTER_RUNTIME_DIR": str(folder / "runtime"),
                    "GPUJOBS_FAKE_GPUS": fake_gpus}
        self.env.pop("GPUJOBS_URL", None)
        self.env.pop("GPUJOBS_TOKEN", None)
        self.runtime = folder / "runtime"
        self.args = ["--no-browser", "--ip=127.0.0.1", f"--port={self.port}", "--port-retries=0",
                     f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={folder / 'root'}",
                     "--ServerApp.jpserver_extensions=jupyter_gpujobs=True", f"--GPUJobs.state_dir={folder / 'state'}",
                     "--allow-root", *LEAN]
        self.log = open(folder / "server.log", "wb")
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"token {self.token}"}, timeout=120)

    def install_gpu_kernelspec(self, name: str) -> None:
        subprocess.run([sys.executable, "-m", "jupyter_gpujobs.cli", "kernelspec", "install", "--user",
                        "--name", name, "--gpus", "1", "--time", "1h"], env=self.env, check=True,
                       capture_output=True)

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "jupyter_server", *self.args], env=self.env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if self.http.get("gpujobs/api/whoami", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SystemExit("the server did not start; see its log")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def time_start(self, kernel_name: str) -> float:
        """Seconds from POST /api/kernels to the kernel's kernel_info_reply; the kernel is then shut down."""
        from jupyter_client import BlockingKernelClient

        t0 = time.perf_counter()
        r = self.http.post("api/kernels", json={"name": kernel_name})
        r.raise_for_status()
        kernel_id = r.json()["id"]
        kc = BlockingKernelClient(connection_file=str(self.runtime / f"kernel-{kernel_id}.json"))
        kc.load_connection_file()
        kc.start_channels()
        try:
            while True:
                if time.perf_counter() - t0 > 120:
                    raise SystemExit(f"kernel {kernel_name} ({kernel_id}) did not answer kernel_info within 120 s")
                kc.kernel_info()
                try:
                    reply = kc.get_shell_msg(timeout=2)
                except Empty:
                    continue
                if reply["msg_type"] == "kernel_info_reply":
                    break
            elapsed = time.perf_counter() - t0
        finally:
            kc.stop_channels()
        self.http.delete(f"api/kernels/{kernel_id}").raise_for_status()
        return elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=15, help="starts of each kernel (default 15)")
    p.add_argument("--fake-gpus", default="1xA100")
    p.add_argument("--max-ratio", type=float, default=1.15)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="gpujobs-bench-") as tmp:
        server = Server(Path(tmp), args.fake_gpus)
        server.install_gpu_kernelspec("bench-gpu")
        server.start()
        try:
            server.time_start("python3")  # warm-up: first starts pay cold caches
            server.time_start("bench-gpu")
            times: dict[str, list[float]] = {"python3": [], "bench-gpu": []}
            for i in range(args.runs):
                order = ["python3", "bench-gpu"] if i % 2 == 0 else ["bench-gpu", "python3"]
                for name in order:
                    times[name].append(server.time_start(name))
            jobs = server.http.get("gpujobs/api/jobs", params={"limit": 1000}).json()["jobs"]
        finally:
            server.stop()
    plain = statistics.median(times["python3"])
    gpu = statistics.median(times["bench-gpu"])
    ratio = gpu / plain
    result = {"runs": args.runs, "python3_median_s": round(plain, 4), "gpu_median_s": round(gpu, 4),
              "ratio": round(ratio, 3), "target": args.max_ratio,
              "gpu_kernel_jobs": len([j for j in jobs if j["kind"] == "kernel"]),
              "python3_s": [round(t, 3) for t in times["python3"]],
              "gpu_s": [round(t, 3) for t in times["bench-gpu"]]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"kernel start, POST /api/kernels -> kernel_info_reply, median of {args.runs}:")
        print(f"  python3 (local)        {plain * 1000:8.1f} ms")
        print(f"  GPU kernel (queued)    {gpu * 1000:8.1f} ms")
        print(f"  ratio                  {ratio:8.3f}  (target <= {args.max_ratio})")
    return 0 if ratio <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
