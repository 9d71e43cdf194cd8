"""Dispatch of a job in a container image whose image is present, against the same job without
one (issue 29: the container may add at most 1 s).

    sudo .venv-test/bin/python benchmarks/bench_container.py [--runs 5]

Needs root, the test users (scripts/install-multiuser.sh) and rootless podman with the test
image for them (scripts/install-podman.sh). Starts a real Jupyter server as root on fake GPUs
whose jobs run as their owners, and submits as gpujobs-u1, one at a time and alternately, the
same 1-GPU job (`/usr/bin/python3` writing the time its first line runs; the image has the same
Python) without an image and in the image. Dispatch: the job's RUNNING event (the engine decided
and recorded it) to its first line running as its user; submit: the submission to that line.
Every run's figures are printed, then the median of each and the difference of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from servers import live_servers, wait_job  # noqa: E402

from jupyter_gpujobs.client import GPUJobsClient  # noqa: E402

USER = "gpujobs-u1"
IMAGE = os.environ.get("GPUJOBS_TEST_IMAGE", "localhost/gpujobs-test:latest")
TARGET_S = 1.0


def one(client: GPUJobsClient, out: Path, image: str | None) -> tuple[float, float]:
    """(RUNNING to the first line, submit to the first line) of one job, in seconds."""
    code = "import os, time; open(os.environ['GPUJOBS_JOB_ID'] + '.start', 'w').write(repr(time.time()))"
    extra: dict[str, Any] = {"image": image} if image else {}
    submitted = time.time()
    job = client.submit(["/usr/bin/python3", "-c", code], gpus=1, cwd=str(out), time_limit="2m", **extra)
    done = wait_job(client, job["id"], ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "LOST"), timeout=120)
    if done["state"] != "COMPLETED":
        raise SystemExit(f"job {job['id']} {done['state']}: {done['reason']}\n{client.log(job['id'])['data']}")
    started = float((out / f"{job['id']}.start").read_text())
    running = next(e["time"] for e in client.events(job["id"]) if e["state"] == "RUNNING")
    return started - running, started - submitted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="jobs of each kind (default 5)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (jobs run as the test users): sudo .venv-test/bin/python ...")
    probe = subprocess.run(["runuser", "-u", USER, "--", "podman", "image", "exists", IMAGE], cwd="/")
    if probe.returncode != 0:
        raise SystemExit(f"no image {IMAGE} for {USER}: run scripts/install-podman.sh")
    with tempfile.TemporaryDirectory(prefix="gpujobs-bench-container-") as tmp:
        os.chmod(tmp, 0o755)  # the user's job writes into out/
        out = Path(tmp) / "out"
        out.mkdir()
        os.chmod(out, 0o1777)
        factory = live_servers(Path(tmp))
        make = next(factory)
        try:
            server = make(fake_gpus="2xA100", users={"tok-u1": USER},
                          extra_args=["--GPUJobs.allowed_images=localhost/*"])
            client = GPUJobsClient(url=server.url, token="tok-u1")
            one(client, out, None)  # warm-up of both (the first podman run sets up the user's namespace)
            one(client, out, IMAGE)
            figures: dict[str, list[tuple[float, float]]] = {"plain": [], "image": []}
            for i in range(args.runs):
                order = ("plain", "image") if i % 2 == 0 else ("image", "plain")
                for kind in order:
                    figures[kind].append(one(client, out, IMAGE if kind == "image" else None))
                    d, s = figures[kind][-1]
                    print(f"run {i + 1} {kind:5}: dispatch {d * 1000:7.0f} ms   submit to start {s * 1000:7.0f} ms")
        finally:
            next(factory, None)
    load = os.getloadavg()
    medians = {k: (statistics.median(d for d, _ in v), statistics.median(s for _, s in v)) for k, v in figures.items()}
    for kind, (d, s) in medians.items():
        spread = [d2 for d2, _ in figures[kind]]
        print(f"{kind:5}: dispatch median {d * 1000:.0f} ms (range {min(spread) * 1000:.0f}-{max(spread) * 1000:.0f}), "
              f"submit to start median {s * 1000:.0f} ms")
    added = medians["image"][0] - medians["plain"][0]
    print(f"the image adds {added * 1000:.0f} ms to the dispatch (median of {args.runs} runs each; "
          f"target <= {TARGET_S * 1000:.0f} ms); load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0 if added <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
