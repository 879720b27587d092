"""A schedule's fire times: a 5-field cron expression read in an IANA time zone, by ``croniter``.

croniter (a dependency of rq's own cron scheduler) does the parsing and the calendar. Fire times are computed
in the schedule's zone and handed out as UTC ms, the way every time is stored (app.core.clock).

Daylight saving time, as cron(8) (Vixie cron and its heirs, cronie among them) handles it:

- **Fall-back** (a wall-clock hour happens twice, e.g. 01:00-01:59 on the first Sunday of November in
  America/New_York): a schedule at a fixed time (its minute and hour fields do not start with ``*``, e.g.
  ``30 1 * * *``, ``0 1-2 * * *``) fires once, at the first occurrence of that time; croniter alone would
  fire it again an hour later. A wildcard schedule (its minute or hour field starts with ``*``, e.g.
  ``0 * * * *``, ``*/15 * * * *``, ``*/10 1 * * *``) fires at every real time that matches, in both passes
  of the repeated hour: 01:00 EDT and 01:00 EST are two different hours for an hourly schedule.
- **Spring-forward** (a wall-clock hour does not exist): croniter's choice, which cron(8) makes too for a
  fixed time: a fire time inside the gap fires once, at the first minute after it (``30 2 * * *`` fires at
  03:00 that day); a wildcard schedule fires at the real times that match, so an hourly one skips the hour
  that does not exist.
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

CRON_FIELDS = 5  # minute hour day-of-month month day-of-week: no seconds field, no year field
MAX_CRON = 200  # characters of an expression
MAX_TIMEZONE = 64  # characters of a zone name (the longest IANA name has 32)


def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; ValueError naming the problem for anything else."""
    if not name or len(name) > MAX_TIMEZONE or not name.isascii():
        raise ValueError("Not a known IANA time zone.")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError("Not a known IANA time zone.") from None


def check(expression: str, timezone: str = "UTC") -> None:
    """ValueError, with a message for the client, unless ``expression`` is a 5-field cron expression that
    fires at least once (``0 0 30 2 *`` never does) in ``timezone``."""
    if len(expression) > MAX_CRON or len(expression.split()) != CRON_FIELDS or not croniter.is_valid(expression):
        raise ValueError("Not a 5-field cron expression (minute hour day-of-month month day-of-week).")
    next_fire(expression, timezone, 0)


def next_fire(expression: str, timezone: str, after_ms: int) -> int:
    """The first fire time strictly after ``after_ms`` (UTC ms), in UTC ms. ValueError if it never fires.
    A fixed-time schedule skips the second pass of a repeated wall-clock time (see the module)."""
    where = zone(timezone)
    start = datetime.fromtimestamp(after_ms / 1000, UTC).astimezone(where)
    try:
        times = croniter(expression, start)
        fire = times.get_next(datetime)
        if not wildcard(expression):
            while repeated(fire.timestamp(), where):
                fire = times.get_next(datetime)
    except CroniterBadDateError:
        raise ValueError("This cron expression never fires.") from None
    except CroniterError:
        raise ValueError("Not a 5-field cron expression (minute hour day-of-month month day-of-week).") from None
    return int(fire.timestamp() * 1000)


def wildcard(expression: str) -> bool:
    """Whether the minute or the hour field starts with ``*``: cron(8)'s wildcard job (Vixie cron's MIN_STAR or
    HR_STAR), which fires at every real time that matches; any other fires once per wall-clock time."""
    minute, hour = expression.split()[:2]
    return minute.startswith("*") or hour.startswith("*")


def repeated(timestamp: float, where: ZoneInfo) -> bool:
    """Whether ``timestamp`` is the second occurrence of its wall-clock time in ``where`` (a fall-back hour)."""
    local = datetime.fromtimestamp(timestamp, where)
    return local.fold == 1 and local.replace(fold=0).timestamp() != timestamp
