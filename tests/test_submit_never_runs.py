"""A job that can never run is refused at submit with the reason, instead of waiting forever:
more GPUs than its user's or group's maximum, a time limit over their maximum, more GPUs of
a type than the largest host has, more GPUs than the urgent reserve leaves."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jupyter_gpujobs.engine.scheduler import schedule
from jupyter_gpujobs.engine.scheduler.quotas import Quotas
from jupyter_gpujobs.model import GPU, Job, Policy, Quota

GOOD = {"command": ["python", "-c", "pass"], "gpus": 1, "begin": "+1d"}  # stored, kept waiting


@pytest.fixture
def gpujobs_config(gpujobs_config: dict[str, Any]) -> dict[str, Any]:
    return {**gpujobs_config, "fake_gpus": "4xA100,2xT4",
            "default_user_quota": {"max_gpus": 3, "max_time_limit": "2h"},
            "group_quotas": {"small": {"max_gpus": 1}}}


CASES = [
    ({**GOOD, "gpus": 4}, "gpus", "asked for 4 GPUs but user", "may use at most 3 at a time"),
    ({**GOOD, "gpus": 2, "group": "small"}, "gpus", "asked for 2 GPUs but group small", "at most 1"),
    ({**GOOD, "time_limit": "3h"}, "time_limit", "3h is over the maximum of 2h for user", ""),
    ({**GOOD, "gpus": 3, "gpu_type": "T4"}, "gpus", "asked for 3 but this server has only 2 T4 GPUs", ""),
]


@pytest.mark.parametrize("body,field,words,more", CASES, ids=["user-max", "group-max", "time-limit", "host-size"])
async def test_a_job_that_can_never_run_is_refused(api: Any, engine: Any, body: dict[str, Any], field: str,
                                                   words: str, more: str) -> None:
    await api("POST", "jobs", GOOD)
    before = engine.store.list_jobs(limit=1000)[0]
    status, reply = await api("POST", "jobs", body)
    assert status == 400, reply
    assert reply["field"] == field and words in reply["message"] and more in reply["message"], reply
    assert [j.id for j in engine.store.list_jobs(limit=1000)[0]] == [j.id for j in before]
    # what is within the limits is accepted
    status, job = await api("POST", "jobs", {**GOOD, "gpus": 3, "time_limit": "2h"})
    assert status == 201, job
    assert json.dumps(job)


def _starts_alone(pol: Policy, user: str, group: str | None, gpus: int, urgent: bool, total: int) -> bool:
    """Whether the scheduler starts such a job on `total` idle GPUs with nothing else queued."""
    job = Job(id=1, user=user, group=group, gpus=gpus, priority="urgent" if urgent else "normal")
    plan = schedule(0.0, [job], [], [GPU(i, f"u{i}", "A100") for i in range(total)], pol)
    return [s.job_id for s in plan.starts] == [1]


def test_never_starts_reads_the_scheduler_caps() -> None:
    pol = Policy(urgent_reserve_gpus=2, user_quotas={"eve": Quota(max_running_jobs=0)},
                 group_quotas={"fixed": Quota(guaranteed_gpus=2, max_gpus=6, elastic=False)})
    q = Quotas(pol)
    assert q.never_starts("bob", None, 2, 3600, False, 4) is None
    assert q.never_starts("bob", None, 3, 3600, False, 4) == (
        "gpus", "asked for 3 GPUs but only 2 of this server's 4 may run jobs that are not urgent; "
                "this job could never start")
    assert q.never_starts("bob", None, 3, 3600, True, 4) is None  # urgent work may use the reserve
    assert q.never_starts("bob", "fixed", 3, 3600, True, 8)[1].startswith("asked for 3 GPUs but group fixed "
                                                                          "may use at most 2")
    assert q.never_starts("eve", None, 1, 3600, False, 4) == ("gpus", "user eve may run no jobs")
    # what it refuses, the scheduler would never start, even alone on idle GPUs; what it lets
    # through, the scheduler starts there
    for user, group, gpus, urgent, total in [("bob", None, 2, False, 4), ("bob", None, 3, False, 4),
                                             ("bob", None, 3, True, 4), ("bob", "fixed", 3, True, 8),
                                             ("bob", "fixed", 2, False, 8), ("eve", None, 1, False, 4)]:
        refused = q.never_starts(user, group, gpus, 3600, urgent, total) is not None
        assert _starts_alone(pol, user, group, gpus, urgent, total) is not refused, (user, group, gpus, urgent)
    assert q.never_starts("bob", None, 1, 8 * 86400, False, 4) == (
        "time_limit", "8d is over the maximum of 7d for this server")
