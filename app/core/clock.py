"""Time as taskport stores and shows it: integer milliseconds since the epoch, ISO 8601 in documents.

Redis keeps an integer in a compact hash in a few bytes, a 24-character ISO string in 25, so every
stored time is ``now_ms()``; it becomes ``iso()`` only when a document is rendered.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int) -> str:
    """Milliseconds since the epoch as ``2026-11-29T10:00:00.120Z``."""
    seconds, milli = divmod(ms, 1000)
    t = time.gmtime(seconds)
    return f"{t[0]:04d}-{t[1]:02d}-{t[2]:02d}T{t[3]:02d}:{t[4]:02d}:{t[5]:02d}.{milli:03d}Z"


def iso_or_none(ms: int | None) -> str | None:
    return None if ms is None else iso(ms)
