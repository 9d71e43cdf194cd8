"""Local times in a zone with daylight saving (issue 32, item 1): the zone's real offset at
each instant, winter and summer, in the scheduler's texts, off-peak windows, begin times,
habits, and on a live server started with TZ=America/New_York."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from servers import wait_job

from jupyter_gpujobs.config import GPUJobs
from jupyter_gpujobs.engine.scheduler import schedule
from jupyter_gpujobs.model import GPU, Job, OffpeakWindow, Policy, parse_begin

NY = ZoneInfo("America/New_York")
UTC = timezone.utc
WINTER = datetime(2026, 12, 4, 14, 11, tzinfo=UTC).timestamp()  # 09:11 EST (UTC-5)
SUMMER = datetime(2026, 7, 3, 13, 11, tzinfo=UTC).timestamp()  # 09:11 EDT (UTC-4)


@pytest.fixture
def new_york() -> Iterator[None]:
    """The test process's local zone is New York (as the server's would be)."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    yield
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()


def _policy(**settings: Any) -> Policy:
    return GPUJobs(**settings).policy()


def _plan(now: float, job: Job, policy: Policy) -> Any:
    return schedule(now, [job], [], [GPU(0, "g0", "A100")], policy)


@pytest.mark.parametrize("now", [WINTER, SUMMER], ids=["winter", "summer"])
def test_begin_text_and_offpeak_window_use_the_offset_of_the_day(new_york: None, now: float) -> None:
    policy = _policy(offpeak_windows=["mon-sun 09:00-10:00"])
    plan = _plan(now, Job(id=1, user="a", submitted_at=now, begin=now + 7200), policy)
    assert plan.reasons[1] == "begins at 11:11"  # 09:11 local + 2 h, winter and summer alike
    # 09:11 local is inside 09:00-10:00 in both seasons: the off-peak job starts now
    plan = _plan(now, Job(id=2, user="a", submitted_at=now, offpeak=True), policy)
    assert [s.job_id for s in plan.starts] == [2]
    # and 10:00-11:00 is still ahead, at 10:00 local (15:00 UTC in winter, 14:00 in summer)
    later = _policy(offpeak_windows=["mon-sun 10:00-11:00"])
    plan = _plan(now, Job(id=3, user="a", submitted_at=now, offpeak=True), later)
    assert plan.starts == [] and plan.reasons[3] == "waiting for off-peak hours"
    ten = datetime.fromtimestamp(now, NY).replace(hour=10, minute=0).timestamp()
    from jupyter_gpujobs.engine.scheduler.deferral import LocalClock, next_offpeak  # (new in issue 32)

    assert next_offpeak(now, later.offpeak_windows, LocalClock("America/New_York")) == ten


def test_a_window_after_the_change_to_winter_time_opens_at_its_local_hour() -> None:
    from jupyter_gpujobs.engine.scheduler.deferral import LocalClock, next_offpeak

    saturday = datetime(2026, 10, 31, 12, 0, tzinfo=NY).timestamp()  # EDT; EST from Sunday 02:00
    monday_9 = datetime(2026, 11, 2, 9, 0, tzinfo=NY).timestamp()
    assert monday_9 - saturday == 2 * 86400 - 3 * 3600 + 3600
    window = (OffpeakWindow((0,), 9.0, 10.0),)
    assert next_offpeak(saturday, window, LocalClock("America/New_York")) == monday_9


def test_naive_iso_times_are_the_servers_local_time(new_york: None) -> None:
    assert parse_begin("2026-12-04T09:00", WINTER - 86400) == datetime(2026, 12, 4, 14, 0, tzinfo=UTC).timestamp()
    assert parse_begin("2026-07-04T09:00", SUMMER - 86400) == datetime(2026, 7, 4, 13, 0, tzinfo=UTC).timestamp()
    assert parse_begin("2026-12-04T09:00Z", WINTER - 86400) == datetime(2026, 12, 4, 9, 0, tzinfo=UTC).timestamp()


def test_a_habit_keeps_its_local_hour_across_the_change(new_york: None) -> None:
    """Every Monday 09:30 New York time, over the end of summer time: one habit at 09:00."""
    from jupyter_gpujobs.engine.monitor.habits import find_habits
    from jupyter_gpujobs.engine.scheduler.deferral import as_clock

    mondays = [datetime(2026, 10, 12, 9, 30, tzinfo=NY) + timedelta(weeks=w) for w in range(5)]
    jobs = [Job(id=i, user="vision", gpus=2, submitted_at=d.timestamp(), started_at=d.timestamp(),
                ended_at=d.timestamp() + 1800) for i, d in enumerate(mondays, 1)]
    now = (mondays[-1] + timedelta(days=1)).timestamp()
    [habit] = find_habits(jobs, now, as_clock(_policy()))
    assert (habit.weekday, habit.start_hour, habit.weeks) == (0, 9, 5)
    assert habit.next_start == datetime(2026, 11, 16, 9, 0, tzinfo=NY).timestamp()


def test_live_server_in_new_york(live_server: Any) -> None:
    """A real server with TZ=America/New_York: "begins at" and the off-peak window in the
    zone's offset of today (on the old code, an hour off all winter)."""
    now = datetime.now(NY)
    open_from, open_to = now - timedelta(hours=3), now + timedelta(minutes=40)
    window = f"mon-sun {open_from:%H:%M}-{open_to:%H:%M}"  # open now, closed an hour from now
    server = live_server(fake_gpus="1xA100", start=False, extra_args=[f"--GPUJobs.offpeak_windows={window}"])
    server.env["TZ"] = "America/New_York"
    server.start()
    client = server.client()
    later = client.submit(["true"], begin="+2h", time_limit="1m")
    job = wait_job(client, later["id"], lambda j: j.get("reason", "").startswith("begins at"))
    assert job["reason"] == f"begins at {datetime.fromtimestamp(job['begin'], NY):%H:%M}", job
    offpeak = client.submit(["true"], when="offpeak", time_limit="1m")
    job = wait_job(client, offpeak["id"], ("COMPLETED", "FAILED"))
    assert job["state"] == "COMPLETED", job
