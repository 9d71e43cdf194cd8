"""Cancels of many jobs at once (issue 32), live: a dependency chain ends in one scheduling
cycle and one store transaction (not one link per cycle: 10,000 links took ~3 hours), and
`POST jobs/cancel` (the CLI's `cancel IDS`, `--user`, `--array`, `--all`) cancels the pending
jobs it names in one transaction, a user's own unless an admin."""

from __future__ import annotations

import sys
from typing import Any

from servers import wait_job

from jupyter_gpujobs.client import GPUJobsClient, GPUJobsError

PY = sys.executable
LATER = {"begin": "+1h"}  # pending until cancelled


def _cancel_times(client: GPUJobsClient, job_id: int) -> list[float]:
    return [e["time"] for e in client.events(job_id) if e["state"] == "CANCELLED"]


def test_a_dependency_chain_is_cancelled_in_one_cycle(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100", users={"tok-bob": "bob"})
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    chain = [bob.submit([PY, "-c", "print(1)"], name="link0", **LATER)["id"]]
    for n in range(1, 60):
        chain.append(bob.submit([PY, "-c", "print(1)"], name=f"link{n}", depends=f"afterok:{chain[-1]}")["id"])
    wait_job(bob, chain[-1], lambda j: j["reason"] == f"waiting for job {chain[-2]} (afterok)")

    assert bob.cancel_many(ids=[chain[0]])["cancelled"] == [chain[0]]
    last = wait_job(bob, chain[-1], ("CANCELLED",))
    assert last["reason"] == f"dependency job {chain[-2]} ended CANCELLED"
    # every link after the head was cancelled by the same cycle, in one transaction
    times = {t for job_id in chain[1:] for t in _cancel_times(bob, job_id)}
    assert len(times) == 1, sorted(times)


def test_many_jobs_are_cancelled_in_one_request(live_server: Any) -> None:
    server = live_server(fake_gpus="1xA100", users={"tok-bob": "bob", "tok-alice": "alice"},
                         config={"admin_users": ["root"]})
    bob = GPUJobsClient(url=server.url, token="tok-bob")
    alice = GPUJobsClient(url=server.url, token="tok-alice")
    array = bob.submit([PY, "-c", "print(1)"], name="sweep", array="0-49", **LATER)
    tasks = array["array_tasks"]
    others = [bob.submit([PY, "-c", "print(1)"], name=f"o{n}", **LATER)["id"] for n in range(5)]
    hers = alice.submit([PY, "-c", "print(1)"], name="hers", **LATER)["id"]

    # an array: all its tasks in one transaction (one time for all their events)
    done = bob.cancel_many(array=tasks[0])
    assert sorted(done["cancelled"]) == sorted(tasks) and done["stopping"] == [] and done["errors"] == {}
    assert len({t for job_id in tasks for t in _cancel_times(bob, job_id)}) == 1
    assert all(bob.job(i)["reason"] == "cancelled by bob" for i in tasks[:3])

    # another's jobs: only theirs or an admin's to cancel; by id, each refusal is named
    try:
        alice.cancel_many(user="bob")
        raise AssertionError("alice cancelled bob's jobs")
    except GPUJobsError as err:
        assert err.status == 403 and "bob" in err.message
    done = alice.cancel_many(ids=[others[0], hers, 999999])
    assert done["cancelled"] == [hers]
    assert set(done["errors"]) == {str(others[0]), "999999"} and "belongs to bob" in done["errors"][str(others[0])]
    # all one may cancel: one's own
    assert alice.cancel_many(all=True) == {"cancelled": [], "stopping": [], "errors": {}}

    # the CLI: ids, --user
    out = server.cli("cancel", str(others[0]), str(others[1]))
    assert out.returncode == 0 and f"job {others[0]} CANCELLED" in out.stdout, out
    out = server.cli("cancel", "--user", "bob")
    assert out.returncode == 0 and all(f"job {i} CANCELLED" in out.stdout for i in others[2:]), out
    assert [bob.job(i)["state"] for i in others] == ["CANCELLED"] * 5
    out = server.cli("cancel", "--all")
    assert out.returncode == 0 and "no active jobs to cancel" in out.stdout, out

    # bad requests say what is wrong
    for body, field in (({}, "body"), ({"ids": [1], "all": True}, "body"), ({"ids": []}, "ids"),
                        ({"ids": ["x"]}, "ids"), ({"array": True}, "array"), ({"all": False}, "body"),
                        ({"everything": True}, "everything"), ({"user": 7}, "user")):
        try:
            bob.api("POST", "jobs/cancel", body=body)
            raise AssertionError(f"accepted {body}")
        except GPUJobsError as err:
            assert err.status == 400 and err.field == field, (body, err.status, err.field, err.message)
