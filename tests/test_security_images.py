"""A job's image is its owner's private data, as its command is: while it is pulled, another
user sees that the job waits for its image, never which image (a path in the owner's folder,
a registry of theirs). Live: a root Jupyter server with named users who are real Unix users,
rootless podman as the owner, fake GPUs (as tests/test_containers_pull_live.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from servers import wait_job
from test_containers_live import U1, _missing
from test_containers_pull_live import slow_image  # noqa: F401 (a fixture)
from test_security_api import EventFeed, wait_for

from jupyter_gpujobs.client import GPUJobsClient

U2 = "gpujobs-u2"
pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def test_another_user_sees_a_pull_but_not_its_image(live_server: Any, open_dir: Path, slow_image: str) -> None:  # noqa: F811
    image = slow_image
    server = live_server(fake_gpus="2xA100", users={"tok-u1": U1, "tok-u2": U2},
                         extra_args=["--GPUJobs.allowed_images=127.0.0.1:*"])
    u1, u2 = (GPUJobsClient(url=server.url, token=t) for t in ("tok-u1", "tok-u2"))
    with EventFeed(SimpleNamespace(port=server.port, token="tok-u2")) as feed:  # type: ignore[arg-type]
        job = u1.submit(["/bin/true"], gpus=1, cwd=str(open_dir), time_limit="1m", image=image)
        try:
            wait_job(u1, job["id"], lambda j: (j["reason"] or "").startswith("pulling image") or j["state"] != "PENDING",
                     timeout=60)
            assert u1.job(job["id"])["reason"].startswith(f"pulling image {image}")  # its owner is told
            theirs = u2.job(job["id"])
            assert theirs["private"] is True and theirs["image"] is None and theirs["state"] == "PENDING", theirs
            assert theirs["reason"].startswith("pulling its image"), theirs
            wait_for("the pull on the other user's websocket", lambda: any(
                m["type"] == "job" and m["job"]["id"] == job["id"] and "pulling" in (m["event"]["reason"] or "")
                for m in feed.messages))
            shown = json.dumps([theirs, u2.queue(), u2.jobs(), feed.messages])
            assert image not in shown, shown
        finally:
            u1.cancel(job["id"])
