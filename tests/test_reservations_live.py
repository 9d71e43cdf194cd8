"""Advance reservations on a real Jupyter server with fake GPUs 2xA100: a reserved GPU is not
given to others, its holders start at once, and a learned proposal is accepted with one action."""

from __future__ import annotations

import sys
import time
from typing import Any

from servers import wait_for

PY = sys.executable
SLEEP = [PY, "-c", "import time; time.sleep(30)"]


async def _job(api: Any, job_id: int) -> dict[str, Any]:
    status, body = await api("GET", f"jobs/{job_id}")
    assert status == 200, body
    return body


async def test_a_reserved_gpu_is_kept_for_its_holders(api: Any, engine: Any) -> None:
    status, res = await api("POST", "reservations", {"gpus": 1, "gpu_type": "A100", "start": time.time() - 60,
                                                     "duration": "1h", "groups": ["vision"], "name": "vision-now"})
    assert status == 201, res
    assert res["active"] and res["assigned"]["gpus"] == [0] and res["holders"] == "group vision"
    _, listed = await api("GET", "reservations")
    assert [r["id"] for r in listed["reservations"]] == [res["id"]]

    ids = []
    for _ in range(2):  # not holders: only GPU 1 is theirs
        status, body = await api("POST", "jobs", {"command": SLEEP, "gpus": 1, "time_limit": "2m"})
        assert status == 201, body
        ids.append(body["id"])
    first = await wait_for(lambda: _running(api, ids[0]), timeout=15)
    assert first["assigned_gpus"] == [1]
    await wait_for(lambda: _reason(api, ids[1], "GPU 0 is reserved for group vision until"), timeout=10)
    # a holder's job starts at once on the reserved GPU, although job ids[1] came first
    status, holder = await api("POST", "jobs", {"command": SLEEP, "gpus": 1, "time_limit": "2m", "group": "vision"})
    assert status == 201, holder
    started = await wait_for(lambda: _running(api, holder["id"]), timeout=15)
    assert started["assigned_gpus"] == [0]
    assert (await _job(api, ids[1]))["state"] == "PENDING"

    # removed: the GPU is anyone's again (the holder's job keeps running there)
    status, _ = await api("DELETE", f"reservations/{res['id']}")
    assert status == 200
    _, listed = await api("GET", "reservations")
    assert listed["reservations"] == []
    for jid in [*ids, holder["id"]]:
        await api("DELETE", f"jobs/{jid}")


async def test_bad_reservations_are_refused_naming_the_field(api: Any) -> None:
    for body, field in [({"gpus": 3, "start": "+1h", "duration": "1h", "users": "a"}, "gpus"),
                        ({"gpus": 1, "gpu_type": "H100", "start": "+1h", "duration": "1h", "users": "a"}, "gpu_type"),
                        ({"gpus": 1, "start": "+1h", "duration": "1h", "repeat": "yearly", "users": "a"}, "repeat"),
                        ({"gpus": 1, "start": "+1h", "duration": "1h"}, "users"),
                        ([1, 2], "body")]:
        status, err = await api("POST", "reservations", body)
        assert status == 400 and err["field"] == field, (body, err)
    status, first = await api("POST", "reservations", {"gpus": 2, "start": "+1h", "duration": "2h", "users": "a"})
    assert status == 201
    status, err = await api("POST", "reservations", {"gpus": 1, "start": "+2h", "duration": "2h", "users": "b"})
    assert status == 409 and err["field"] == "gpus" and "not free of other reservations" in err["message"]
    status, _ = await api("POST", "reservations", {"gpus": 2, "start": "+3h", "duration": "2h", "users": "b"})
    assert status == 201  # after the first one ends
    status, err = await api("DELETE", "reservations/99")
    assert status == 404
    status, err = await api("DELETE", "reservations/x")
    assert status == 400 and err["field"] == "id"
    status, err = await api("POST", "reservations", {"proposal": 12345})
    assert status == 404


async def test_a_learned_weekly_habit_is_proposed_and_accepted(api: Any, engine: Any, jp_serverapp: Any) -> None:
    monitor = jp_serverapp.web_app.settings["gpujobs_monitor"]
    now = time.time()
    # four Fridays back, group vision asked for 2 A100 at 09:02 (local = UTC here) for up to 3 hours
    day = int(now // 86400)
    friday = (day - ((day + 3) % 7 - 4) % 7) * 86400.0  # the last Friday, 00:00 UTC
    if friday + 9 * 3600 > now:
        friday -= 7 * 86400
    store = engine.store
    for week in range(4):
        t = friday - week * 7 * 86400 + 9 * 3600 + 120
        [j] = store.add_jobs([{"command": ["true"], "gpus": 2, "gpu_type": "A100", "user": "carol", "group": "vision",
                               "name": "train", "time_limit_s": 3 * 3600}], "carol", t)
        store.update_job(j.id, state="COMPLETED", submitted_at=t, started_at=t + 60, ended_at=t + 60 + 2 * 3600)
    policy = engine.current_policy()
    assert policy.utc_offset_s == 0
    monitor._habits(now)
    status, found = await api("GET", "findings", params={"kind": "reservation_proposal"})
    assert status == 200
    [proposal] = found["findings"]
    assert proposal["message"].startswith("group vision runs jobs on 2 A100 every Friday 09:00–13:00 (4 weeks seen)")
    status, res = await api("POST", "reservations", {"proposal": proposal["id"]})
    assert status == 201, res
    assert (res["gpus"], res["gpu_type"], res["repeat"], res["groups"]) == (2, "A100", "weekly", ["vision"])
    assert res["duration_s"] == 4 * 3600 and res["source"] == f"finding:{proposal['id']}"
    assert time.gmtime(res["next_start"]).tm_wday == 4 and time.gmtime(res["next_start"]).tm_hour == 9
    status, found = await api("GET", "findings", params={"kind": "reservation_proposal"})
    assert not found["findings"][0]["open"] and "accepted by" in found["findings"][0]["action"]
    status, again = await api("POST", "reservations", {"proposal": proposal["id"]})
    assert status == 409
    monitor._habits(now)  # reserved now: not proposed again
    status, found = await api("GET", "findings", params={"kind": "reservation_proposal", "open": "1"})
    assert found["findings"] == []


async def test_a_user_accepts_a_proposal_for_themselves_only_within_quota(api: Any, engine: Any,
                                                                         jp_serverapp: Any) -> None:
    from jupyter_gpujobs.engine.errors import PermissionDenied

    monitor = jp_serverapp.web_app.settings["gpujobs_monitor"]
    now = time.time()
    day = int(now // 86400)
    tuesday = (day - ((day + 3) % 7 - 1) % 7) * 86400.0
    if tuesday + 20 * 3600 > now:
        tuesday -= 7 * 86400
    for week in range(3):  # erin: one GPU on Tuesdays at 20:10 for half an hour
        t = tuesday - week * 7 * 86400 + 20 * 3600 + 600
        [j] = engine.store.add_jobs([{"command": ["true"], "gpus": 1, "user": "erin", "time_limit_s": 3600}], "erin", t)
        engine.store.update_job(j.id, state="COMPLETED", submitted_at=t, started_at=t, ended_at=t + 1800)
    monitor._habits(now)
    status, found = await api("GET", "findings", params={"kind": "reservation_proposal", "open": "1"})
    [proposal] = [f for f in found["findings"] if f["user"] == "erin"]
    assert "user erin runs jobs on 1 GPU every Tuesday 20:00–22:00" in proposal["message"]
    for who, why in (("mallory", "only admins may accept a proposal for someone else"),
                     ("erin", "beyond your quota (no GPU limit is set)")):
        try:
            engine.accept_reservation_proposal(who, proposal["id"])
            raise AssertionError("accepted")
        except PermissionDenied as err:
            assert why in str(err)
    admin = next(iter(engine.admin_users))
    body = {"gpus": 1, "start": "+1h", "duration": "1h", "users": ["erin"]}
    try:
        engine.create_reservation("erin", body)
        raise AssertionError("a user reserved GPUs")
    except PermissionDenied as err:
        assert "only admins may reserve GPUs" in str(err)
    other = engine.create_reservation(admin, body)
    try:
        engine.delete_reservation("erin", other["id"])
        raise AssertionError("a user removed an admin's reservation")
    except PermissionDenied as err:
        assert "only they or an admin may remove it" in str(err)
    engine.delete_reservation(admin, other["id"])
    engine.set_quota(admin, "users", "erin", {"max_gpus": 1})
    made = engine.accept_reservation_proposal("erin", proposal["id"])
    assert made["users"] == ["erin"] and made["created_by"] == "erin" and made["repeat"] == "weekly"
    engine.delete_reservation("erin", made["id"])  # whoever made it may remove it


async def _running(api: Any, job_id: int) -> dict[str, Any] | None:
    body = await _job(api, job_id)
    return body if body["state"] == "RUNNING" else None


async def _reason(api: Any, job_id: int, text: str) -> bool:
    body = await _job(api, job_id)
    return body["state"] == "PENDING" and text in (body.get("reason") or "")


def test_reserve_from_the_command_line(live_server: Any) -> None:
    server = live_server(fake_gpus="4xA100")
    day = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 7 * 86400))
    out = server.cli("reserve", "--gpus", "2", "--type", "A100", "--start", f"{day}T09:00+00:00", "--duration", "4h",
                     "--repeat", "weekly", "--groups", "vision", "--name", "vision-fri")
    assert out.returncode == 0, out.stderr
    assert "vision-fri: 2 A100 (GPUs 0-1) for group vision, 4h every week; next " in out.stdout
    listed = server.cli("reserve")
    assert listed.returncode == 0 and "vision-fri" in listed.stdout
    bad = server.cli("reserve", "--gpus", "2", "--start", "+1h", "--duration", "4h", "--repeat", "weekly")
    assert bad.returncode != 0 and "users" in bad.stderr and "Traceback" not in bad.stderr
    server.kill()  # stored: a restart (even a SIGKILL) keeps it, and it is in force again
    server.start()
    [kept] = server.client().reservations()
    assert kept["name"] == "vision-fri" and kept["assigned"]["gpus"] == [0, 1]
    rid = kept["id"]
    assert server.cli("reserve", "--delete", str(rid)).returncode == 0
    assert server.cli("reserve").stdout.strip() == "no reservations"
