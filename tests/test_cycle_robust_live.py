"""One job whose data the scheduler cannot handle does not stop the queue: on a live server
it is set aside with a reason and a finding for the admins, and every other job runs."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from servers import wait_job, wait_until

from jupyter_gpujobs.engine.store import Store

PY = sys.executable


def test_a_job_the_scheduler_cannot_handle_is_set_aside_and_the_rest_run(live_server: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'queue.sqlite'}"
    store = Store(url)
    store.migrate()
    # a row as an older version (or a hand-edited database) could hold: a begin time that no
    # clock can show; another user's job
    (bad,) = store.add_jobs([{"user": "mallory", "command": ["true"], "gpus": 1, "begin": 1e20,
                              "time_limit_s": 60}], "mallory", time.time())
    store.close()

    server = live_server(fake_gpus="2xA100", config={"db_url": url, "sample_interval": 0.3})
    client = server.client()
    mine = [client.submit([PY, "-c", "print('ran')"], gpus=1, name=f"ok{i}")["id"] for i in range(3)]
    for job_id in mine:
        done = wait_job(client, job_id, lambda j: j["state"] not in ("PENDING", "RUNNING"))
        assert done["state"] == "COMPLETED", done

    view = client.job(bad.id)
    assert view["state"] == "PENDING"
    assert view["reason"] == ("set aside: the scheduler could not handle this job (begin time out of range); "
                              "an admin was told")

    def finding() -> Any:
        found = client.api("GET", "findings", params={"kind": "job_set_aside", "open": "1"})["findings"]
        return next((f for f in found if f["job_id"] == bad.id), None)

    f = wait_until(finding, timeout=15)
    assert "begin time out of range" in f["message"] and f["user"] == "mallory" and f["severity"] == "error"
    assert "set aside" in server.server_log()

    # an admin cancels it: it ends, and the finding closes
    assert client.cancel(bad.id)["state"] == "CANCELLED"
    wait_until(lambda: not finding(), timeout=15)
    # the queue still runs
    again = client.submit([PY, "-c", "print('ran')"], gpus=1)["id"]
    wait_job(client, again, ("COMPLETED",))
