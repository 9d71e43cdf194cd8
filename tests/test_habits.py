"""The learned-reservation detector (monitor/habits.py), pure: a weekly pattern planted in a
history of other jobs is found and proposed; noise, too few weeks and old habits are not."""

from __future__ import annotations

import random

from jupyter_gpujobs.config import parse_offpeak
from jupyter_gpujobs.engine.monitor.habits import (
    covered,
    find_habits,
    offpeak_finding,
    proposal_finding,
    quiet_windows,
)
from jupyter_gpujobs.model import Job, JobState, Reservation, validate_reservation

WEEK = 7 * 86400
# Monday 2026-11-30 00:00 UTC; "now" is the Thursday after, 15:00
MONDAY = 1795996800.0
NOW = MONDAY + 3 * 86400 + 15 * 3600


def ended(jid: int, user: str, submitted: float, gpus: int = 1, runtime: float = 3600, group: str | None = None,
          gpu_type: str | None = None, limit: int | None = None) -> Job:
    return Job(id=jid, user=user, gpus=gpus, group=group, gpu_type=gpu_type, time_limit_s=limit,
               state=JobState.COMPLETED, submitted_at=submitted, started_at=submitted + 300,
               ended_at=submitted + 300 + runtime)


def history(weeks: int = 5, seed: int = 7) -> list[Job]:
    """Random jobs of 6 users over the last weeks, and group vision's Friday habit: 2 jobs of
    2 A100 submitted 09:00-09:30 each Friday, 3 h limits (so 4 A100 from 09:00 to 13:00)."""
    rnd = random.Random(seed)
    jobs: list[Job] = []
    for _ in range(600):
        t = NOW - rnd.uniform(0, weeks * WEEK)
        jobs.append(ended(len(jobs) + 1, f"u{rnd.randrange(6)}", t, gpus=rnd.choice([1, 1, 1, 2, 4]),
                          runtime=rnd.uniform(600, 6 * 3600)))
    for w in range(1, weeks + 1):
        friday = MONDAY - w * WEEK + 4 * 86400
        for m in (5, 25):
            jobs.append(ended(len(jobs) + 1, rnd.choice(["carol", "dan"]), friday + 9 * 3600 + m * 60, gpus=2,
                              group="vision", gpu_type="A100", runtime=rnd.uniform(2, 2.8) * 3600, limit=3 * 3600))
    return jobs


def test_a_planted_weekly_pattern_is_found_and_proposed() -> None:
    habits = find_habits(history(), NOW)
    [h] = [h for h in habits if h.name == "vision"]
    assert (h.kind, h.gpu_type, h.weekday, h.start_hour, h.end_hour, h.gpus, h.weeks) == \
        ("group", "A100", 4, 9, 13, 4, 5)
    assert h.next_start == MONDAY + 4 * 86400 + 9 * 3600  # this Friday 09:00
    f = proposal_finding(h)
    assert f.kind == "reservation_proposal" and f.user is None
    assert f.message.startswith("group vision runs jobs on 4 A100 every Friday 09:00–13:00 (5 weeks seen)")
    fields = validate_reservation(f.data["reservation"], NOW)  # what accepting it reserves
    assert (fields["gpus"], fields["gpu_type"], fields["repeat"], fields["groups"]) == (4, "A100", "weekly", ("vision",))
    assert fields["start"] == h.next_start and fields["duration_s"] == 4 * 3600
    # the random users have no habit of their own at this size (few enough to be sure)
    assert all(h.kind == "user" for h in habits if h.name != "vision")


def test_too_few_weeks_an_old_habit_or_a_reserved_one_is_not_proposed() -> None:
    assert not [h for h in find_habits(history(weeks=2), NOW) if h.name == "vision"]
    old = [j for j in history(weeks=8) if not (j.group == "vision" and j.submitted_at > NOW - 3 * WEEK)]
    assert not [h for h in find_habits(old, NOW) if h.name == "vision"]  # stopped three weeks ago
    [h] = [h for h in find_habits(history(), NOW) if h.name == "vision"]
    kept = Reservation(id=1, gpus=4, start=MONDAY - 4 * WEEK + 4 * 86400 + 9 * 3600, duration_s=4 * 3600,
                       repeat="weekly", groups=("vision",))
    assert covered(h, [kept])
    other = Reservation(id=2, gpus=4, start=kept.start, duration_s=kept.duration_s, repeat="weekly", groups=("nlp",))
    assert not covered(h, [other])


def test_a_users_habit_is_theirs_to_see_and_local_time_counts() -> None:
    jobs = [ended(i, "erin", MONDAY - w * WEEK + 1 * 86400 + 20 * 3600 + 600, runtime=1800, limit=3600)
            for i, w in enumerate(range(1, 4), 1)]  # Tuesdays 20:10 UTC = Wednesdays 05:10 at UTC+9
    [h] = find_habits(jobs, NOW)
    assert (h.kind, h.weekday, h.start_hour, h.end_hour, h.gpus) == ("user", 1, 20, 22, 1)
    assert proposal_finding(h).user == "erin"
    [h] = find_habits(jobs, NOW, utc_offset_s=9 * 3600)
    assert (h.weekday, h.start_hour) == (2, 5)


def test_quiet_hours_become_offpeak_windows() -> None:
    busy = [[80.0 if 8 <= h < 20 else 5.0 for h in range(24)] for _ in range(7)]
    busy[6] = [None] * 24  # no readings on Sundays
    busy[2][23] = 50.0  # Wednesday nights run late
    assert quiet_windows(busy) == [(0, 8), (20, 23)]
    assert quiet_windows([[1.0] * 24] * 7) == [(0, 24)]
    assert quiet_windows([[None] * 24] * 7) == []
    assert quiet_windows(busy, threshold=60) == [(20, 32)]  # 20:00-08:00, across midnight
    f = offpeak_finding([(20, 32)], 60)
    assert f is not None and '"mon-sun 20:00-08:00"' in f.message
    w = parse_offpeak("mon-sun 20:00-08:00")  # the config line it suggests reads back
    assert (w.start_hour, w.end_hour, len(w.days)) == (20, 32, 7)


def test_steady_demand_at_every_hour_is_no_habit() -> None:
    jobs = [ended(i, "busy", MONDAY - 4 * WEEK + i * 1800, runtime=3600) for i in range(1, 4 * 7 * 48)]
    assert find_habits(jobs, NOW) == []
