"""A burst of concurrent submissions is committed together (group commit) yet answered one by
one: every caller gets its own job, a bad submission gets its own error and costs the others
nothing, and a 201 means the job is committed (it survives a SIGKILL right after)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

BURST = 50


def _body(i: int) -> dict[str, Any]:
    return {"command": ["true"], "gpus": 1, "begin": "+1d", "time_limit": "1m", "name": f"burst-{i}"}


async def test_burst_of_submissions(live_server: Any) -> None:
    server = live_server(fake_gpus="2xA100")
    bodies = [_body(i) for i in range(BURST)]
    bodies[7] = {**_body(7), "gpus": 3}  # more than this server has: refused by validation
    bodies[23] = {**_body(23), "name": "\ud800"}  # valid JSON (sent as an escape), not valid Unicode
    bodies[31] = {**_body(31), "array": "0-3"}  # four tasks of one array job
    headers = {"Authorization": f"token {server.token}"}
    limits = httpx.Limits(max_connections=BURST)
    async with httpx.AsyncClient(base_url=server.url + "gpujobs/api/", headers=headers, limits=limits,
                                 timeout=30) as http:
        await http.get("whoami")
        replies = await asyncio.gather(*(http.post("jobs", content=json.dumps(b)) for b in bodies))

    bad = replies[7]
    assert bad.status_code == 400, bad.text
    assert bad.json()["field"] == "gpus" and "only 2" in bad.json()["message"]
    assert replies[23].status_code == 400 and replies[23].json()["field"] == "name", replies[23].text

    accepted = {i: r.json() for i, r in enumerate(replies) if i not in (7, 23)}
    for i, r in enumerate(replies):
        if i not in (7, 23):
            assert r.status_code == 201, (i, r.text)
    for i, job in accepted.items():
        assert job["name"] == f"burst-{i}" and job["state"] == "PENDING"  # each caller got its own job
    tasks = accepted[31]["array_tasks"]
    assert len(tasks) == 4 and tasks[0] == accepted[31]["id"]
    ids = [j["id"] for i, j in accepted.items() if i != 31] + tasks
    assert len(set(ids)) == len(ids) == BURST - 2 + 3

    # a 201 is a commit: the jobs are there after the server is SIGKILLed at once
    server.kill()
    server.start()
    client = server.client()
    stored = {j["id"]: j for j in client.jobs(limit=1000)["jobs"]}
    assert sorted(stored) == sorted(ids)
    assert {stored[i]["name"] for i in ids} == {f"burst-{i}" for i in accepted}
    assert all(stored[t]["array_job_id"] == tasks[0] for t in tasks)
    assert [stored[t]["array_index"] for t in tasks] == [0, 1, 2, 3]
    for job_id in (ids[0], tasks[-1]):
        events = client.events(job_id)
        assert [(e["state"], e["reason"]) for e in events] == [("PENDING", "submitted")]


async def test_a_submission_the_store_refuses_fails_alone(engine: Any, monkeypatch: Any) -> None:
    """When the shared transaction fails (here the store refuses one submission, as a full
    disk or a constraint would), each is stored on its own: only that one fails."""
    real = engine.store.add_submissions

    def picky(batch: list[Any]) -> Any:
        if any(new.specs[0]["name"] == "refused" for new in batch):
            raise RuntimeError("the store refused it")
        return real(batch)

    monkeypatch.setattr(engine.store, "add_submissions", picky)
    bodies = [_body(i) for i in range(6)]
    bodies[3] = {**_body(3), "name": "refused"}
    outcomes = await asyncio.gather(*(engine.submit("alice", b) for b in bodies), return_exceptions=True)
    assert isinstance(outcomes[3], RuntimeError)
    stored = [o for i, o in enumerate(outcomes) if i != 3]
    assert [j.name for [j] in stored] == [f"burst-{i}" for i in (0, 1, 2, 4, 5)]  # type: ignore[misc]
    assert sorted(engine.store.get_many([j.id for [j] in stored])) == sorted(j.id for [j] in stored)  # type: ignore[misc]


async def test_one_turn_is_one_commit(engine: Any) -> None:
    """Submissions of one event-loop turn share one commit, and each gets its own job."""
    from sqlalchemy import event

    commits: list[int] = []
    event.listen(engine.store.engine, "commit", lambda _conn: commits.append(1))
    jobs = await asyncio.gather(*(engine.submit("alice", _body(i)) for i in range(20)))
    assert len(commits) == 1
    ids = [j.id for [j] in jobs]
    assert len(set(ids)) == 20
    assert [j.name for [j] in jobs] == [f"burst-{i}" for i in range(20)]
    assert all(engine.active_job(i) is not None for i in ids)
    stored = engine.store.get_many(ids)  # each id is the row of the submission it was given to
    assert {i: job.name for i, job in stored.items()} == {j.id: j.name for [j] in jobs}


async def test_a_burst_gets_one_cycle_after_it(api: Any, engine: Any) -> None:
    """Submissions one after another (each its own turn and commit) do not each run a
    scheduling cycle: the cycle comes once the burst pauses, and places them all."""
    from servers import wait_for

    await wait_for(lambda: engine.cycle_seconds)  # the engine's first cycle
    before = len(engine.cycle_seconds)
    for i in range(30):
        status, _ = await api("POST", "jobs", _body(i))
        assert status == 201
    assert len(engine.cycle_seconds) - before <= 2  # at most a tick's and a long burst's
    status, queue = await wait_for(lambda: _placed(api), timeout=5)
    assert [j["position"] for j in queue["jobs"]] == list(range(1, 31))


async def _placed(api: Any) -> tuple[int, Any] | None:
    status, queue = await api("GET", "queue")
    return (status, queue) if all(j["position"] for j in queue["jobs"]) else None
