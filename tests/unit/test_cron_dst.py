"""Schedules across daylight-saving changes, with a clock the test holds (app.core.cron, workers.firing).

Issue 29 finding 8: ``30 1 * * *`` in America/New_York fired at 05:30Z and again at 06:30Z on 2025-11-02,
the fall-back day (01:30 EDT, then 01:30 EST). The rule is cron(8)'s (see app.core.cron): a fixed-time
schedule fires once per wall-clock time, at its first occurrence; a wildcard one (minute or hour field
starting with ``*``) at every real time that matches; a time inside a spring-forward gap fires at the first
minute after it.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.core import cron, keys
from app.core.schedules import ScheduleStore
from workers.firing import Firing

HOUR = 3_600_000
MINUTE = 60_000
NEW_YORK = "America/New_York"


def at(text: str) -> int:
    """UTC ms of ``text`` (ISO, in UTC)."""
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def fires(expression: str, timezone: str, start: str, end: str) -> list[str]:
    """Every fire time in (start, end], as the scheduler walks them (each the first one after the last)."""
    found, now, stop = [], at(start), at(end)
    while (now := cron.next_fire(expression, timezone, now)) <= stop:
        found.append(datetime.fromtimestamp(now / 1000, UTC).strftime("%m-%dT%H:%MZ"))
    return found


# fall-back in New York: 2025-11-02 02:00 EDT (06:00Z) becomes 01:00 EST; 01:00-01:59 happens twice
FALL = ("2025-11-01T12:00", "2025-11-03T12:00")
# spring-forward in New York: 2025-03-09 02:00 EST (07:00Z) becomes 03:00 EDT; 02:00-02:59 does not exist
SPRING = ("2025-03-08T12:00", "2025-03-10T12:00")


@pytest.mark.parametrize(("expression", "expected"), [
    # the finding: once, at 01:30 EDT (05:30Z), not again at 01:30 EST (06:30Z)
    ("30 1 * * *", ["11-02T05:30Z", "11-03T06:30Z"]),
    ("0 1 * * 0", ["11-02T05:00Z"]),  # weekly, on the Sunday of the change
    ("0 1 2 11 *", ["11-02T05:00Z"]),  # yearly
    ("0 1-2 * * *", ["11-02T05:00Z", "11-02T07:00Z", "11-03T06:00Z", "11-03T07:00Z"]),  # 01:00 once, 02:00 once
    ("15,45 1 * * *", ["11-02T05:15Z", "11-02T05:45Z", "11-03T06:15Z", "11-03T06:45Z"]),
    ("59 0 * * *", ["11-02T04:59Z", "11-03T05:59Z"]),  # just before the repeated hour: untouched
    ("0 2 * * *", ["11-02T07:00Z", "11-03T07:00Z"]),  # just after it: untouched
])
def test_a_fixed_time_in_the_repeated_hour_fires_once_on_a_fall_back_day(expression: str, expected: list[str]):
    assert fires(expression, NEW_YORK, *FALL) == expected


def test_an_hourly_schedule_fires_every_real_hour_across_fall_back():
    found = fires("0 * * * *", NEW_YORK, "2025-11-02T03:30", "2025-11-02T08:30")
    assert found == ["11-02T04:00Z", "11-02T05:00Z", "11-02T06:00Z", "11-02T07:00Z", "11-02T08:00Z"]
    # 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST, 03:00 EST: both 01:00s are hours of their own


@pytest.mark.parametrize(("expression", "expected"), [
    ("*/30 * * * *", ["11-02T05:00Z", "11-02T05:30Z", "11-02T06:00Z", "11-02T06:30Z"]),
    ("*/30 1 * * *", ["11-02T05:00Z", "11-02T05:30Z", "11-02T06:00Z", "11-02T06:30Z"]),  # a wildcard minute
    ("30 */1 * * *", ["11-02T05:30Z", "11-02T06:30Z"]),  # a wildcard hour
])
def test_a_wildcard_schedule_fires_in_both_passes_of_the_repeated_hour(expression: str, expected: list[str]):
    assert fires(expression, NEW_YORK, "2025-11-02T04:50", "2025-11-02T06:59") == expected


def test_europe_falls_back_the_same_way():
    # Paris, 2025-10-26: 03:00 CEST (01:00Z) becomes 02:00 CET; 02:30 happens at 00:30Z and 01:30Z
    assert fires("30 2 * * *", "Europe/Paris", "2025-10-25T12:00", "2025-10-27T12:00") == \
        ["10-26T00:30Z", "10-27T01:30Z"]
    assert len(fires("*/30 * * * *", "Europe/Paris", "2025-10-26T00:00", "2025-10-26T02:00")) == 4


def test_a_schedule_made_during_the_second_pass_waits_for_the_next_day():
    # made at 01:10 EST: the day's 01:30 happened at 05:30Z already (01:30 EDT), before the schedule existed
    assert cron.next_fire("30 1 * * *", NEW_YORK, at("2025-11-02T06:10")) == at("2025-11-03T06:30")


@pytest.mark.parametrize(("expression", "expected"), [
    ("30 2 * * *", ["03-09T07:00Z", "03-10T06:30Z"]),  # 02:30 does not exist: 03:00 EDT, the first minute after
    ("30,45 2 * * *", ["03-09T07:00Z", "03-10T06:30Z", "03-10T06:45Z"]),  # both in the gap: once, at 03:00
    ("30 1-3 * * *", ["03-09T06:30Z", "03-09T07:00Z", "03-09T07:30Z",  # 01:30 EST, (02:30 →) 03:00, 03:30 EDT
                      "03-10T05:30Z", "03-10T06:30Z", "03-10T07:30Z"]),
    ("30 3 * * *", ["03-09T07:30Z", "03-10T07:30Z"]),  # after the gap: untouched
])
def test_a_fixed_time_in_the_spring_forward_gap_fires_once_at_the_first_minute_after_it(expression, expected):
    assert fires(expression, NEW_YORK, *SPRING) == expected


def test_an_hourly_schedule_skips_the_hour_that_does_not_exist():
    found = fires("0 * * * *", NEW_YORK, "2025-03-09T04:30", "2025-03-09T08:30")
    assert found == ["03-09T05:00Z", "03-09T06:00Z", "03-09T07:00Z", "03-09T08:00Z"]  # 00, 01 EST; 03, 04 EDT


def test_utc_has_no_change_to_make():
    assert fires("30 1 * * *", "UTC", *FALL) == ["11-02T01:30Z", "11-03T01:30Z"]


def test_the_scheduler_creates_one_task_for_the_fall_back_day_s_0130(conn, config):
    """The whole firing path (workers.firing) with the clock stepped a minute at a time across the change."""
    schedules = ScheduleStore(conn, config.max_schedules)
    task = {"type": "demo.sleep", "payload": {"seconds": 0, "steps": 1}, "priority": None}
    start, end = at("2025-11-02T04:00"), at("2025-11-02T08:00")
    schedules.create("public", name="", cron_expr="30 1 * * *", timezone=NEW_YORK, task=task, paused=False,
                     now=start)
    hourly = schedules.create("public", name="", cron_expr="0 * * * *", timezone=NEW_YORK, task=task,
                              paused=False, now=start)
    firing = Firing(conn, config)
    created = sum(firing.round(now=now) for now in range(start, end + 1, MINUTE))
    assert created == 1 + 4  # the 01:30 once; 01:00 EDT, 01:00 EST, 02:00 EST, 03:00 EST
    assert conn.zcard(keys.history("public")) == 5
    assert schedules.get(hourly.id).next_run_at == end + HOUR
