"""A schedule's fire times: a 5-field cron expression read in an IANA time zone, by ``croniter``.

croniter (a dependency of rq's own cron scheduler) does the parsing and the calendar, DST included: a
time that does not exist on a spring-forward day fires at the first minute after the gap, an ambiguous
one on a fall-back day once. Fire times are computed in the schedule's zone and handed out as UTC ms,
the way every time is stored (app.core.clock).
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
    """The first fire time strictly after ``after_ms`` (UTC ms), in UTC ms. ValueError if it never fires."""
    start = datetime.fromtimestamp(after_ms / 1000, UTC).astimezone(zone(timezone))
    try:
        fire = croniter(expression, start).get_next(datetime)
    except CroniterBadDateError:
        raise ValueError("This cron expression never fires.") from None
    except CroniterError:
        raise ValueError("Not a 5-field cron expression (minute hour day-of-month month day-of-week).") from None
    return int(fire.timestamp() * 1000)
