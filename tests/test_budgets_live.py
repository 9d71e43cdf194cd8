"""GPU-hour budgets, the audit trail and the accounting export on a real server (issue 30).

A group with a budget of 1 GPU-hour (time compressed: `budget_hour_seconds` seconds of one
GPU count as one GPU-hour) uses it up: its users are warned at 80 % and at 100 % through
their own notification channel (a real HTTP receiver), its next job waits with the reason
while other jobs run, the quota report (what the panel and the widget show) says what is
left, and all of it outlives a restart; raising the budget lets the job run. Every admin
action leaves an audit row; the per-job export adds up to the usage report's GPU-hours.
"""

from __future__ import annotations

import csv
import io
import time
from typing import Any

import pytest
from servers import wait_job, wait_until
from test_notify import Receiver

from jupyter_gpujobs.client import GPUJobsClient, GPUJobsError

USERS = {"tok-admin": "admin", "tok-alice": "alice", "tok-bob": "bob"}  # the CLI runs as the first
HOUR_S = 6  # seconds of one GPU that count as one GPU-hour here


@pytest.fixture
def receiver() -> Any:
    r = Receiver()
    yield r
    r.stop()


def _clients(server: Any) -> dict[str, GPUJobsClient]:
    return {name: GPUJobsClient(url=server.url, token=tok) for tok, name in USERS.items()}


def _vision(client: GPUJobsClient) -> dict[str, Any]:
    return next(b for b in client.budgets() if (b["scope"], b["name"]) == ("groups", "vision"))


def test_a_used_up_group_budget_holds_its_jobs_warns_and_outlives_a_restart(live_server: Any, receiver: Any) -> None:
    began = time.time()
    server = live_server(fake_gpus="2xA100", users=USERS, config={
        "admin_users": "admin", "group_members": {"vision": ["alice", "bob"]}, "budget_hour_seconds": HOUR_S,
        "tick_interval": 0.3, "notify_private_webhooks": True, "notify_timeout": 5})
    c = _clients(server)
    c["alice"].set_notifications(webhook=receiver.url("/alice"), events=["warning"])
    c["bob"].set_notifications(webhook=receiver.url("/bob"))

    # only admins set budgets; a bad one is refused naming its field
    with pytest.raises(GPUJobsError) as err:
        c["alice"].set_budget("groups", "vision", {"gpu_hours": 1})
    assert err.value.status == 403
    for bad, field in (({"gpu_hours": 0}, "gpu_hours"), ({"gpu_hours": 1, "period": "year"}, "period"),
                       ({"gpu_hours": 1, "mode": "kill"}, "mode"), ({"gpu_hours": 1, "period": "dates"}, "start"),
                       ({"gpu_hours": 1, "hours": 2}, "hours")):
        with pytest.raises(GPUJobsError) as err:
            c["admin"].set_budget("groups", "vision", bad)
        assert (err.value.status, err.value.field) == (400, field), bad
    c["admin"].set_budget("groups", "vision", {"gpu_hours": 1, "period": "month"})
    mine = _vision(c["alice"])
    assert (mine["gpu_hours"], mine["used_gpu_hours"], mine["left_gpu_hours"], mine["used_up"]) == (1, 0, 1, False)
    assert c["bob"].budgets() == [mine] and c["admin"].budgets(user="bob") == [mine]

    # one GPU for longer than HOUR_S seconds uses the hour up; the users are warned at 80 and 100 %
    first = c["alice"].submit(f"sleep {HOUR_S * 1.5}", gpus=1, group="vision", name="first")
    wait_job(c["alice"], first["id"], ("RUNNING",))
    wait_until(lambda: _vision(c["alice"])["used_up"], 4 * HOUR_S, "the budget used up")
    warned = ["[gpujobs] the GPU-hour budget of group vision is 80 % used",
              "[gpujobs] the GPU-hour budget of group vision is used up"]
    wait_until(lambda: receiver.texts("/alice") == warned, 20, f"alice warned twice, got {receiver.texts('/alice')}")
    assert "New jobs wait until it renews" in receiver.posts["/alice"][-1]["text"]

    # the group's next job waits with the reason; a job outside the group runs
    held = c["bob"].submit("true", gpus=1, group="vision", name="held")
    free = c["bob"].submit("true", gpus=1, name="free")
    wait_job(c["bob"], free["id"], ("COMPLETED",))
    job = wait_job(c["bob"], held["id"], lambda j: "budget" in (j["reason"] or ""))
    assert job["state"] == "PENDING"
    assert "group vision's budget of 1 GPU-hours for this month is used up" in job["reason"], job["reason"]
    # bob had used none of it and had no job waiting on it then: he was not told
    assert not any("budget" in t for t in receiver.texts("/bob"))
    quota = c["bob"].quota()
    shown = next(b for b in quota["budgets"] if b["name"] == "vision")
    assert shown["left_gpu_hours"] == 0 and shown["percent"] >= 100
    from jupyter_gpujobs.notebook.widgets import QuotaWidget

    widget = QuotaWidget(c["bob"], autostart=False)
    assert "budget of group vision: " in widget.details.value and "0.00 left (used up)" in widget.details.value
    shown_cli = server.cli("quota", "--user", "bob")
    assert "GPU-hour budgets" in shown_cli.stdout and "group vision: " in shown_cli.stdout, shown_cli

    # a restart keeps the budget, the hold and the warnings sent (none twice)
    wait_job(c["alice"], first["id"], ("COMPLETED",), timeout=60)
    server.stop()
    server.start()
    c = _clients(server)
    assert _vision(c["admin"])["used_up"]
    job = wait_job(c["bob"], held["id"], lambda j: "budget" in (j["reason"] or ""))
    assert job["state"] == "PENDING"
    time.sleep(1.0)  # a second warning would come by now
    assert receiver.texts("/alice") == warned

    # raised: the job runs
    c["admin"].set_budget("groups", "vision", {"gpu_hours": 100, "period": "week", "mode": "low"})
    wait_job(c["bob"], held["id"], ("COMPLETED",))

    # every admin action is audited: who, what, before and after; only admins read it
    c["admin"].set_quota("users", "bob", {"max_gpus": 1})
    made = c["admin"].reserve(1, "+2h", "1h", users=["alice"], name="demo")
    c["admin"].delete_reservation(made["id"])
    c["admin"]._call("POST", "gpus/drain", body={"gpu": 1, "draining": True, "reason": "test"})
    c["admin"]._call("POST", "gpus/drain", body={"gpu": 1, "draining": False})
    blocker = c["alice"].submit("sleep 60", gpus=0, name="blocker")
    wait_job(c["alice"], blocker["id"], ("RUNNING",))
    c["admin"].cancel(blocker["id"])
    rows = c["admin"].audit(since=began - 1)
    budget_rows = [(r["actor"], r["target"], r["before"], r["after"]) for r in rows if r["action"] == "budget"]
    assert budget_rows == [
        ("admin", "group:vision", {"gpu_hours": 1.0, "period": "month", "start": None, "end": None, "mode": "hold"},
         {"gpu_hours": 100.0, "period": "week", "start": None, "end": None, "mode": "low"}),
        ("admin", "group:vision", None, {"gpu_hours": 1.0, "period": "month", "start": None, "end": None,
                                         "mode": "hold"}),
    ]
    actions = {(r["action"], r["target"]) for r in rows}
    assert {("quota", "user:bob"), ("cancel", f"job:{blocker['id']}"), ("drain", "gpu:localhost:1")} <= actions, actions
    reservations = [(r["target"], r["before"] is None, r["after"] is None) for r in rows if r["action"] == "reservation"]
    assert reservations == [(f"reservation:{made['id']}", False, True), (f"reservation:{made['id']}", True, False)]
    assert next(r for r in rows if r["action"] == "reservation")["before"]["users"] == ["alice"]
    drains = [(r["before"], r["after"]) for r in rows if r["action"] == "drain"]
    assert drains == [({"draining": True}, {"draining": False, "reason": ""}),
                      ({"draining": False}, {"draining": True, "reason": "test"})]
    cancel = next(r for r in rows if r["action"] == "cancel")
    assert cancel["before"] == {"user": "alice", "state": "RUNNING"} and began <= cancel["time"] <= time.time()
    assert all(began - 1 <= r["time"] for r in rows)
    with pytest.raises(GPUJobsError) as err:
        c["alice"].audit()
    assert err.value.status == 403
    shown = server.cli("audit", "--action", "budget")
    assert shown.returncode == 0, shown.stderr
    assert "admin  budget  group:vision" in shown.stdout

    # the export: one record per job, adding up to the usage report's GPU-hours
    until = time.time()
    report = c["admin"].accounting(since=began - 1, until=until)
    usage = c["admin"]._call("GET", "usage", params={"since": began - 1, "until": until, "by": "group"})
    assert report["total_gpu_hours"] == pytest.approx(usage["total_gpu_hours"], abs=1e-3)
    by_id = {r["job_id"]: r for r in report["records"]}
    assert {first["id"], held["id"], free["id"], blocker["id"]} <= set(by_id)
    rec = by_id[first["id"]]
    assert (rec["user"], rec["group"], rec["gpus"], rec["state"]) == ("alice", "vision", 1, "COMPLETED")
    assert len(rec["gpu_models"]) == 1 and "A100" in rec["gpu_models"][0], rec
    assert rec["gpu_hours"] == pytest.approx(HOUR_S * 1.5 / 3600, rel=0.5)
    assert by_id[held["id"]]["wait_s"] > 1
    # bob sees only his own; the CLI writes CSV that says the same
    assert {r["user"] for r in c["bob"].accounting(since=began - 1)["records"]} == {"bob"}
    with pytest.raises(GPUJobsError) as err:
        c["bob"].accounting(since=began - 1, user="alice")
    assert err.value.status == 403 and err.value.field == "user"
    out = server.cli("accounting", "--since", str(began - 1), "--until", str(until))
    assert out.returncode == 0, out.stderr
    rows_csv = list(csv.DictReader(io.StringIO(out.stdout)))
    assert sum(float(r["gpu_hours"]) for r in rows_csv) == pytest.approx(report["total_gpu_hours"], abs=1e-3)
