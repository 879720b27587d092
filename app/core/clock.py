"""Time as taskport stores and shows it: integer milliseconds since the epoch, ISO 8601 in documents.

Redis keeps an integer in a compact hash in a few bytes, a 24-character ISO string in 25, so every
stored time is ``now_ms()``; it becomes ``iso()`` only when a document is rendered.
"""

from __future__ import annotations

import time
from datetime import datetime
from functools import lru_cache


def now_ms() -> int:
    return int(time.time() * 1000)


@lru_cache(maxsize=4096)
def utc_second(seconds: int) -> str:
    """``2026-11-29T10:00:00`` of a second since the epoch. Cached: a status document renders three to six times,
    most of them seconds that recent documents rendered too, and ``gmtime`` + formatting was ~2% of a status
    read's web CPU (bench/README.md, "Submit and status at the floor"); log lines' times share it (app.core.logs)."""
    t = time.gmtime(seconds)
    return f"{t[0]:04d}-{t[1]:02d}-{t[2]:02d}T{t[3]:02d}:{t[4]:02d}:{t[5]:02d}"


def iso(ms: int) -> str:
    """Milliseconds since the epoch as ``2026-11-29T10:00:00.120Z``."""
    seconds, milli = divmod(ms, 1000)
    return f"{utc_second(seconds)}.{milli:03d}Z"


# date.toordinal() of 1970-01-01: a datetime's day as days since the epoch, without timestamp()'s float
_EPOCH_DAY = 719_163


def rq_time(at: datetime) -> str:
    """A UTC datetime as RQ writes a job's times (``rq.utils.utcformat``: ``2026-11-29T10:00:00.120345Z``), at a
    third of strftime's cost: the second's text is :func:`iso`'s cache (a submit writes two such times)."""
    seconds = (at.toordinal() - _EPOCH_DAY) * 86_400 + at.hour * 3_600 + at.minute * 60 + at.second
    return f"{utc_second(seconds)}.{at.microsecond:06d}Z"


def iso_or_none(ms: int | None) -> str | None:
    return None if ms is None else iso(ms)
