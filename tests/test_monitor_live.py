"""The monitor in a real `jupyter server` process: `jupyter gpujobs usage` / `usage --heatmap` /
`findings` in the terminal over seeded history, and `rogue_policy = "kill"` stopping a process
started outside the queue."""

from __future__ import annotations

import sys
from datetime import datetime
from typing import Any

from servers import wait_until

from jupyter_gpujobs.engine.store import Store
from jupyter_gpujobs.engine.store import monitoring as mstore
from jupyter_gpujobs.model import GPU, JobState

PY = sys.executable




def test_cli_usage_heatmap_and_findings(live_server: Any) -> None:
    server = live_server(fake_gpus="2xA100", config={"sample_interval": 0.5})
    store = Store(f"sqlite:///{server.state_dir / 'gpujobs.sqlite'}")
    t0 = datetime(2026, 3, 4, 14, 0).timestamp()  # a Wednesday, local time
    mstore.record_gpus(store, [GPU(0, "GPU-old-0", "V100", "old-host", 16384)], t0)
    for user, hours in (("dora", 3.0), ("eli", 1.5)):
        job = store.add_jobs([{"user": user, "command": ["x"], "gpus": 1, "group": "vision"}], user, t0)[0]
        store.start(job.id, "old-host", [(0, "GPU-old-0")], t0)
        store.transition(job.id, JobState.COMPLETED, "runner", "completed", t0 + hours * 3600)
    mstore.add_samples(store, [mstore.SampleValues("old-host", 0, "GPU-old-0", t0 + 600, utilization=95.0),
                               mstore.SampleValues("old-host", 0, "GPU-old-0", t0 + 86400 + 600, utilization=10.0)])
    store.close()
    since, until = "2026-03-01", "2026-03-08"

    out = server.cli("usage", "--since", since, "--until", until)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split() == ["USER", "GPU-HOURS", "SHARE", "JOBS"]
    assert lines[2].split() == ["dora", "3.00", "66.7%", "1"]
    assert lines[3].split() == ["eli", "1.50", "33.3%", "1"]
    assert lines[-1].split() == ["total", "4.50"]

    out = server.cli("usage", "--heatmap", "--since", since, "--until", until)
    assert out.returncode == 0, out.stderr
    rows = {line[:3]: line[5:] for line in out.stdout.splitlines() if line[:3] in ("Mon", "Wed", "Thu")}
    assert rows["Wed"][28:30] == "██", out.stdout  # 14:00-15:00, 95 %
    assert rows["Thu"][28:30] == "  " and rows["Thu"][0:2] == "··", "10 % shades as blank; no data as dots"
    assert set(rows["Mon"]) == {"·"}

    out = server.cli("usage", "--since", "someday")
    assert out.returncode == 1 and "since" in out.stderr

    out = server.cli("findings", "--kind", "oom")
    assert out.returncode == 0 and out.stdout.strip() == "no findings"


def test_rogue_policy_kill(live_server: Any) -> None:
    server = live_server(fake_gpus="4xA100", config={"sample_interval": 0.3, "rogue_policy": "kill"})
    proc = server.rogue(3, seconds=60)
    try:
        wait_until(lambda: proc.poll() is not None, timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    client = server.client()
    findings = client.api("GET", "findings", params={"kind": "rogue_process"})["findings"]
    mine = [f for f in findings if f["pid"] == proc.pid]
    assert len(mine) == 1 and mine[0]["action"] == "terminated" and "rogue_policy=kill" in mine[0]["message"]
    assert "GPU 3" in server.server_log() and str(proc.pid) in server.server_log()
