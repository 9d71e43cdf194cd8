"""Quotas set through the API and `jupyter gpujobs quota --set` are stored: they survive a
restart (also a SIGKILL), every change is audited (who, when, before and after), and
`GET quota` and the CLI show who set the quota in force and when."""

from __future__ import annotations

import json
import time
from typing import Any


def test_quotas_set_by_an_admin_survive_restarts_with_their_audit(live_server: Any) -> None:
    server = live_server(fake_gpus="4xA100")
    client = server.client()
    admin = client.whoami()["user"]
    before = time.time()
    out = server.cli("quota", "--set", "user:alice", '{"max_gpus": 1, "guaranteed_gpus": 1}')
    assert out.returncode == 0, out.stderr
    client.set_quota("groups", "vision", {"guaranteed_gpus": 3})
    client.set_quota("users", "alice", {"max_gpus": 2, "guaranteed_gpus": 1})  # a second change
    client.set_quota("users", "carol", {"max_gpus": 1})
    client.set_quota("users", "carol", None)  # cleared: the configured quota applies again

    server.kill()
    server.start()
    client = server.client()
    q = client.quota("alice")
    assert (q["max_gpus"], q["guaranteed_gpus"]) == (2, 1)
    assert q["set"]["by"] == admin and q["set"]["quota"] == {"max_gpus": 2, "guaranteed_gpus": 1}
    assert before <= q["set"]["at"] <= time.time()
    changes = q["changes"]
    assert [(c["actor"], c["scope"], c["name"], c["before"], c["after"]) for c in changes] == [
        (admin, "users", "alice", {"max_gpus": 1, "guaranteed_gpus": 1}, {"max_gpus": 2, "guaranteed_gpus": 1}),
        (admin, "groups", "vision", None, {"guaranteed_gpus": 3}),  # a group the report shows
        (admin, "users", "alice", None, {"max_gpus": 1, "guaranteed_gpus": 1}),
    ]
    carol = client.quota("carol")
    assert carol["set"] is None and carol["max_gpus"] is None
    assert [c["after"] for c in carol["changes"] if c["name"] == "carol"] == [None, {"max_gpus": 1}]

    server.stop()  # and a clean restart
    server.start()
    shown = server.cli("quota", "--user", "alice")
    assert shown.returncode == 0, shown.stderr
    assert f"quota set by {admin} at " in shown.stdout and '{"max_gpus": 2, "guaranteed_gpus": 1}' in shown.stdout
    assert "quota changes (newest first)" in shown.stdout
    raw = json.loads(server.cli("quota", "--user", "alice", "--json").stdout)
    assert raw["max_gpus"] == 2
    assert raw["groups"]["vision"]["quota"]["guaranteed_gpus"] == 3
    assert raw["groups"]["vision"]["set"]["by"] == admin
