"""Advance reservations in the scheduler, on hand-built snapshots: the reserved GPUs are kept
free for their holders (others only backfill jobs that end before), the holders start inside
them, every estimate counts them, and repeating ones come back."""

from __future__ import annotations

import pytest

from jupyter_gpujobs.engine.scheduler import schedule
from jupyter_gpujobs.engine.scheduler.reservations import (
    gpus_text,
    occurrence_at,
    occurrences,
    occurrences_between,
)
from jupyter_gpujobs.model import (
    GPU,
    InvalidInput,
    Job,
    JobState,
    Plan,
    Policy,
    Quota,
    Reservation,
    validate_reservation,
)

NOW = 1_700_000_000.0  # a Tuesday, 22:13 UTC
H = 3600.0
PLAIN = Policy(fairshare=False, weight_age=0.0, weight_size=0.0, preemption=False)


def gpus(n: int = 4, host: str = "h0", name: str = "A100") -> list[GPU]:
    return [GPU(i, f"{host}-{i}", name, host=host) for i in range(n)]


def job(jid: int, user: str = "alice", gpus: int = 1, limit: int = 7200, **kw: object) -> Job:
    return Job(id=jid, user=user, gpus=gpus, time_limit_s=limit, submitted_at=NOW - 1000 + jid, **kw)  # type: ignore[arg-type]


def run(jid: int, idx: tuple[int, ...], user: str = "bob", ends_in: float = 4 * H, host: str = "h0") -> Job:
    return Job(id=jid, user=user, gpus=len(idx), state=JobState.RUNNING, host=host, assigned_gpus=idx,
               started_at=NOW - 100, time_limit_s=int(ends_in + 100), submitted_at=NOW - 200)


def vision(start: float, hours: float = 2, n: int = 2, rid: int = 1, **kw: object) -> Reservation:
    return Reservation(id=rid, gpus=n, start=start, duration_s=int(hours * H), name="vision-weekly",
                       groups=("vision",), **kw)  # type: ignore[arg-type]


def starts(plan: Plan) -> dict[int, tuple[int, ...]]:
    return {s.job_id: s.gpus for s in plan.starts}


def test_reserved_gpus_are_kept_free_and_estimates_count_them() -> None:
    res = [vision(NOW + H)]  # GPUs 0-1 from 23:13 to 01:13
    pending = [job(1), job(2), job(3), job(4)]  # alice: 2 h each, not a holder
    plan = schedule(NOW, pending, [], gpus(), PLAIN, reservations=res)
    assert sorted(starts(plan)) == [1, 2]
    assert all(set(g) <= {2, 3} for g in starts(plan).values())
    assert "GPUs 0-1 are reserved for group vision from 23:13" in plan.reasons[3]
    # GPUs 2-3 free at +2 h, before the reservation ends (+3 h)
    assert plan.expected_start[3] == plan.expected_start[4] == NOW + 2 * H
    # without the reservation all four start now
    assert len(schedule(NOW, pending, [], gpus(), PLAIN).starts) == 4


def test_others_backfill_only_jobs_that_end_before_it_starts() -> None:
    res = [vision(NOW + H)]
    running = [run(10, (2, 3))]  # GPUs 2-3 busy for 4 h
    pending = [job(1, limit=2 * 3600), job(2, limit=1800), job(3, limit=3000)]
    plan = schedule(NOW, pending, running, gpus(), PLAIN, reservations=res)
    assert sorted(starts(plan)) == [2, 3]  # 30 and 50 minutes end before 23:13
    assert set(starts(plan)[2]) | set(starts(plan)[3]) == {0, 1}
    assert plan.expected_start[1] == NOW + 3 * H  # after the reservation ends, not in it
    assert "reserved for group vision from 23:13" in plan.reasons[1]


def test_holders_start_at_once_inside_an_active_reservation() -> None:
    res = [vision(NOW - 600)]  # began 10 minutes ago, 2 hours long
    running = [run(10, (2, 3))]
    pending = [job(1), job(2, user="carol", gpus=2, limit=3600, group="vision")]
    plan = schedule(NOW, pending, running, gpus(), PLAIN, reservations=res)
    assert starts(plan) == {2: (0, 1)}  # the holder, although alice was first in line
    assert plan.reasons[1].startswith("waiting for 1 free GPU")
    assert "GPUs 0-1 are reserved for group vision until 00:03" in plan.reasons[1]
    assert plan.expected_start[1] == NOW + 6600  # when the reservation ends (GPUs 2-3 at +4 h)
    # a user named in the reservation holds it too; a job longer than what is left of it waits
    res_users = [Reservation(id=2, gpus=2, start=NOW - 600, duration_s=7200, users=("dave",))]
    plan = schedule(NOW, [job(3, user="dave", limit=3600), job(4, user="dave", limit=3 * 3600)], running,
                    gpus(), PLAIN, reservations=res_users)
    assert list(starts(plan)) == [3]
    assert plan.expected_start[4] == NOW + 6600  # after it, on GPUs 0-1 as anyone


def test_a_holder_waits_for_an_upcoming_reservation_and_is_named_why() -> None:
    res = [vision(NOW + H, hours=4)]
    running = [run(10, (2, 3), ends_in=6 * H)]
    pending = [job(1, gpus=2), job(2, user="carol", gpus=2, limit=7200, group="vision")]
    plan = schedule(NOW, pending, running, gpus(), PLAIN, reservations=res)
    assert plan.starts == []  # (a job of an hour or less would backfill before it, as anyone's)
    assert plan.expected_start[2] == NOW + H
    assert plan.reasons[2] == "waiting for reservation vision-weekly (GPUs 0-1 from 23:13)"
    assert plan.expected_start[1] == NOW + 5 * H  # others: after it ends
    # a holder's job that can start now outside the reservation does
    plan = schedule(NOW, pending[1:], [], gpus(), PLAIN, reservations=res)
    assert starts(plan) == {2: (2, 3)}


def test_weekly_and_daily_repeats() -> None:
    first = NOW - 3 * 7 * 86400 - 600  # three weeks ago, 10 minutes before this time of day
    weekly = vision(first, hours=2, repeat="weekly")
    assert occurrence_at(weekly, NOW) == (first + 3 * 7 * 86400, first + 3 * 7 * 86400 + 2 * H)
    assert occurrence_at(weekly, NOW + 2 * H) == (first + 4 * 7 * 86400, first + 4 * 7 * 86400 + 2 * H)
    daily = Reservation(id=3, gpus=1, start=first, duration_s=3600, repeat="daily", users=("u",))
    assert len(occurrences_between(daily, NOW, NOW + 7 * 86400)) == 8  # the one on now, and 7 more
    once = Reservation(id=4, gpus=1, start=NOW - 7200, duration_s=3600, users=("u",))
    assert occurrence_at(once, NOW) is None
    weekly = Reservation(id=1, gpus=2, start=first, duration_s=7200, repeat="weekly", groups=("vision",))
    holder = [job(2, user="carol", gpus=2, limit=3600, group="vision")]
    plan = schedule(NOW, holder + [job(1, gpus=4)], [], gpus(), PLAIN, reservations=[weekly])
    assert list(starts(plan)) == [2]  # this week's occurrence is on
    # next week, between occurrences: the GPUs are anyone's until 10 minutes before the hour
    later = NOW + 3 * H
    plan = schedule(later, [job(1, gpus=4, limit=3600)], [], gpus(), PLAIN, reservations=[weekly])
    assert list(starts(plan)) == [1]


def test_overlapping_reservations_take_different_gpus() -> None:
    a = vision(NOW + H, n=2, rid=1)
    b = Reservation(id=2, gpus=2, start=NOW + 2 * H, duration_s=3600, users=("dave",))
    c = Reservation(id=3, gpus=1, start=NOW + 10 * H, duration_s=3600, users=("erin",))
    occ = occurrences([c, b, a], gpus(), NOW)
    assert [(o.reservation.id, o.gpus) for o in occ] == [(1, (0, 1)), (2, (2, 3)), (3, (0,))]
    # a typed reservation takes GPUs of its type, on one host
    inv = gpus(2, "h0", "Tesla T4") + gpus(4, "h1", "A100")
    occ = occurrences([Reservation(id=1, gpus=3, gpu_type="A100", start=NOW, duration_s=60, users=("u",))], inv, NOW)
    assert occ[0].host == "h1" and occ[0].gpus == (0, 1, 2)
    assert occurrences([vision(NOW, n=5)], gpus(), NOW) == []  # more than any host has
    assert gpus_text((0, 1, 3)) == "GPUs 0-1, 3"


@pytest.mark.parametrize("estimate", [True, False])
def test_holders_start_from_deep_in_a_long_queue(estimate: bool) -> None:
    res = [vision(NOW - 600, n=2)]
    running = [run(10, (2, 3))]
    deep = [job(i, user=f"u{i % 7}") for i in range(1, 300)]
    holder = job(500, user="carol", gpus=1, limit=3600, group="vision")
    policy = Policy(fairshare=False, weight_age=0.0, weight_size=0.0, preemption=False, reservation_depth=5)
    plan = schedule(NOW, deep + [holder], running, gpus(), policy, estimate=estimate, reservations=res)
    assert starts(plan) == {500: (0,)}
    assert "reserved for group vision" in plan.reasons[299]


def test_a_borrowed_job_on_reserved_gpus_is_no_victim() -> None:

    policy = Policy(fairshare=False, weight_age=0.0, weight_size=0.0,
                    group_quotas={"nlp": Quota(guaranteed_gpus=2)})
    res = [vision(NOW + 4 * H, n=2)]
    running = [Job(id=10, user="bob", gpus=2, state=JobState.RUNNING, host="h0", assigned_gpus=(0, 1),
                   started_at=NOW - 1000, time_limit_s=3 * 3600, borrowed=True, submitted_at=NOW - 2000),
               run(11, (2, 3))]
    plan = schedule(NOW, [job(1, user="nina", gpus=2, group="nlp")], running, gpus(), policy, reservations=res)
    assert plan.preemptions == []


def test_validate_reservation_names_the_wrong_field() -> None:
    ok = validate_reservation({"gpus": 2, "gpu_type": "A100", "start": "+1h", "duration": "4h", "repeat": "weekly",
                               "groups": "vision"}, NOW, gpus())
    assert ok["gpus"] == 2 and ok["start"] == NOW + H and ok["duration_s"] == 4 * 3600
    assert ok["repeat"] == "weekly" and ok["groups"] == ("vision",) and ok["users"] == ()
    cases = [({"start": "+1h", "duration": "1h", "users": "a"}, "gpus"),
             ({"gpus": 0, "start": "+1h", "duration": "1h", "users": "a"}, "gpus"),
             ({"gpus": 9, "start": "+1h", "duration": "1h", "users": "a"}, "gpus"),
             ({"gpus": 1, "gpu_type": "H100", "start": "+1h", "duration": "1h", "users": "a"}, "gpu_type"),
             ({"gpus": 1, "start": "tuesday", "duration": "1h", "users": "a"}, "start"),
             ({"gpus": 1, "start": "+1h", "duration": "soon", "users": "a"}, "duration"),
             ({"gpus": 1, "start": "+1h", "duration": "2d", "repeat": "daily", "users": "a"}, "duration"),
             ({"gpus": 1, "start": "+1h", "duration": "1h", "repeat": "monthly", "users": "a"}, "repeat"),
             ({"gpus": 1, "start": "+1h", "duration": "1h"}, "users"),
             ({"gpus": 1, "start": "+1h", "duration": "1h", "groups": ["bad name"]}, "groups"),
             ({"gpus": 1, "start": NOW - 7200, "duration": "1h", "users": "a"}, "start"),
             ({"gpus": 1, "start": "+1h", "duration": "1h", "users": "a", "colour": "red"}, "colour")]
    for body, field in cases:
        with pytest.raises(InvalidInput) as e:
            validate_reservation(body, NOW, gpus())
        assert e.value.field == field, (body, e.value)


def test_an_occurrence_days_ahead_keeps_its_gpus_without_hiding_them_before() -> None:
    res = [vision(NOW + 3 * 86400, hours=24, n=1)]  # GPU 0, in three days
    running = [run(10, (1,), ends_in=10 * H)]
    # two GPUs for an hour: booked for when GPU 1 frees (10 h), on GPU 0 as well
    plan = schedule(NOW, [job(1, gpus=2, limit=3600)], running, gpus(2), PLAIN, reservations=res)
    assert plan.expected_start[1] == NOW + 10 * H
    # a job that would run into the occurrence does not start on GPU 0; a shorter one does
    plan = schedule(NOW, [job(2, limit=4 * 86400), job(3, limit=86400)], running, gpus(2), PLAIN, reservations=res)
    assert starts(plan) == {3: (0,)}
    assert "GPU 0 is reserved for group vision from" in plan.reasons[2]


@pytest.mark.parametrize("seed", range(6))
def test_no_other_job_ever_runs_into_an_occurrence(seed: int) -> None:
    """Random queues over four weeks of a weekly and a daily reservation: every start on a
    reserved GPU of someone who does not hold it ends (by its time limit) before the
    occurrence begins; holders start inside it only when they end by its end."""
    import random

    from jupyter_gpujobs.engine.scheduler.reservations import occurrences_between

    rnd = random.Random(seed)
    inv = gpus(4, "h0") + gpus(4, "h1")
    res = [vision(NOW + rnd.uniform(0, 86400), hours=rnd.choice([2, 6]), n=rnd.choice([1, 2, 4]), repeat="weekly"),
           Reservation(id=2, gpus=2, start=NOW + rnd.uniform(0, 86400), duration_s=3 * 3600, repeat="daily",
                       users=("dave",), host="h1")]
    policy = Policy(fairshare=False, weight_age=0.0, weight_size=0.0, preemption=False, reservation_depth=3)
    t, pending, running, n = NOW, {}, {}, 0
    inside = 0  # holders' starts inside an occurrence
    while t < NOW + 28 * 86400:
        for _ in range(rnd.randrange(4)):
            n += 1
            user, group = rnd.choice([("alice", None), ("bob", None), ("carol", "vision"), ("dave", None)])
            pending[n] = Job(id=n, user=user, group=group, gpus=rnd.choice([1, 1, 2, 4]), submitted_at=t,
                             time_limit_s=rnd.choice([1800, 3600, 4 * 3600, 86400]))
        plan = schedule(t, pending, list(running.values()), inv, policy, reservations=res)
        for s in plan.starts:
            j = pending.pop(s.job_id)
            running[j.id] = j.replace(state=JobState.RUNNING, started_at=t, host=s.host, assigned_gpus=s.gpus)
            end = t + (j.time_limit_s or 3600)
            for r in res:
                for o_start, o_end in occurrences_between(r, t, end):
                    occ = [o for o in occurrences([x for x in res if x.id <= r.id], inv, o_start) if o.reservation is r]
                    if not occ or occ[0].host != s.host or not set(occ[0].gpus) & set(s.gpus):
                        continue
                    if r.holds(j.user, j.group) and o_start <= t:
                        assert end <= o_end, (seed, j, r)
                        inside += 1
                    else:
                        assert end <= o_start, (seed, j, r, t, o_start)
        t += rnd.choice([600, 1800, 3600, 4 * 3600])
        for jid in [jid for jid, r in running.items() if r.started_at + r.time_limit_s * rnd.uniform(0.3, 1) <= t]:
            del running[jid]
    assert inside > 0
