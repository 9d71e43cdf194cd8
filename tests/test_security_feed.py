"""The events websocket between users of one shared engine, as real Unix users against a real
root engine (`tests/team.py`):

- a budget's warning goes to the users whose budget it is (and admins), never to every
  websocket: another's GPU-hours are theirs, as `GET budgets` keeps them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from team import USERS, Team, missing
from test_security_api import EventFeed, wait_for

U1, U2 = USERS
pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


@pytest.fixture(scope="module")
def team() -> Iterator[Team]:
    # one GPU-hour of a budget is one GPU-second here: a job uses up 2 of them in 2 s
    with Team(fake_gpus="2xA100", engine_args=["--GPUJobs.budget_hour_seconds=1"]) as t:
        yield t


def test_a_budget_warning_goes_only_to_whom_it_concerns(team: Team) -> None:
    s1 = team.servers[U1]
    with team.socket_client() as root:
        r = root.put("budgets", json={"scope": "users", "name": U1, "budget": {"gpu_hours": 2, "period": "week"}})
        assert r.status_code == 200, r.text
    try:
        with EventFeed(s1) as mine, EventFeed(team.servers[U2]) as theirs:
            r = s1.api("POST", "jobs", json={"command": ["sleep", "60"], "gpus": 1})
            assert r.status_code == 201, r.text
            jid = r.json()["id"]
            warning = wait_for("the budget's warning on its user's websocket", lambda: [
                m for m in mine.messages if m["type"] == "budget"])
            assert warning[0]["users"] == [U1] and warning[0]["budget"]["name"] == U1
            assert s1.api("DELETE", f"jobs/{jid}").status_code == 200
            # the other user's feed has passed the warning: it has the job's end, published after it
            wait_for("the job's end on the other user's websocket", lambda: any(
                m["type"] == "job" and m["job"]["id"] == jid and m["job"]["state"] == "CANCELLED"
                for m in theirs.messages))
            assert [m for m in theirs.messages if m["type"] == "budget"] == []
            assert team.servers[U2].api("GET", "budgets").json()["budgets"] == []  # as GET budgets says
    finally:
        with team.socket_client() as root:
            root.put("budgets", json={"scope": "users", "name": U1, "budget": None})

