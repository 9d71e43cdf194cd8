"""CPU cost of one GPU sampling tick of the monitor, with 8 fake GPUs.

Eight real processes each "use" one fake GPU (GPUJOBS_FAKE_GPU_USE, as the fake backend's
docstring says) and carry GPUJOBS_JOB_ID of a running job that holds that GPU, so every part
of a tick has work: the backend reading, storing 8 raw rows and 8 job stats in SQLite (a
file, WAL), the idle-hog and GPU-error detectors, and the rogue-process check (process list,
owner resolution). Printed in the same run:

- baseline: `backend.sample()` alone (what any sampler must pay to read the GPUs)
- sampler:  `Sampler.tick()` (reading + storing + job stats + rollup once a minute)
- monitor:  `Monitor.tick()` (all of the above + detectors + rogue check)

CPU time is `time.process_time()` of this process over many ticks (the fake backend's scan
cache is cleared before each, so every tick really scans /proc).

    .venv/bin/python benchmarks/bench_sampler.py [--ticks 200]
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from jupyter_gpujobs.engine.gpus import FakeBackend
from jupyter_gpujobs.engine.monitor import Monitor, MonitorSettings
from jupyter_gpujobs.engine.runners import LocalRunner
from jupyter_gpujobs.engine.service import JobService
from jupyter_gpujobs.engine.store import Store
from jupyter_gpujobs.model import Job, Policy, parse_fake_gpus

GPUS = 8


def cpu_per_call(fn, ticks: int, reset) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(median, mean) CPU ms of fn() over `ticks` calls, each after reset()."""
    samples = []
    for _ in range(ticks):
        reset()
        c0 = time.process_time()
        fn()
        samples.append((time.process_time() - c0) * 1000)
    return median(samples), sum(samples) / len(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=200)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sampler-"))
    store = Store(f"sqlite:///{tmp / 'db.sqlite'}")
    store.migrate()
    backend = FakeBackend(parse_fake_gpus(f"{GPUS}xA100"))
    service = JobService(store, backend, LocalRunner(tmp / "run"), Policy(), state_dir=tmp / "state", root_dir=tmp)
    monitor = Monitor(service, MonitorSettings(sample_interval=5.0, idle_hog_after_s=3600),
                      logger=logging.getLogger("bench"))
    monitor.install()
    now = time.time()
    jobs = store.add_jobs([{"user": f"u{i}", "command": ["x"], "gpus": 1} for i in range(GPUS)], "bench", now)
    inventory = backend.inventory()
    procs = []
    for i, job in enumerate(jobs):
        started = store.start(job.id, "localhost", [(i, inventory[i].uuid)], now)
        assert started is not None
        service.state.keep(started)
        env = {**os.environ, "GPUJOBS_FAKE_GPU_USE": str(i), "GPUJOBS_JOB_ID": str(job.id),
               "GPUJOBS_FAKE_MEM_MB": "2000"}
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env))
    time.sleep(1.0)
    running: list[Job] = service.running()

    def reset() -> None:
        backend._scan = None  # every reading scans /proc, as readings 5 s apart do

    try:
        monitor.tick(time.time())  # warm caches (process environments, SQLAlchemy statements)
        base = cpu_per_call(backend.sample, args.ticks, reset)
        samp = cpu_per_call(lambda: monitor.sampler.tick(time.time(), running), args.ticks, reset)
        full = cpu_per_call(lambda: monitor.tick(time.time()), args.ticks, reset)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    print(f"{GPUS} fake GPUs, {len(running)} running jobs, {len(procs)} GPU processes, {args.ticks} ticks each, "
          f"SQLite file store")
    print(f"{'part':<36} {'CPU ms/tick (median)':>20} {'mean':>8}")
    for name, (med, mean) in (("baseline: backend.sample()", base), ("Sampler.tick (read+store+stats)", samp),
                              ("Monitor.tick (all detectors)", full)):
        print(f"{name:<36} {med:>20.2f} {mean:>8.2f}")
    print(f"at sample_interval=5s the monitor uses {full[1] / 5000:.3%} of one core")
    rows = monitor.store.count_by_state()
    assert rows.get("RUNNING") == GPUS


if __name__ == "__main__":
    main()
