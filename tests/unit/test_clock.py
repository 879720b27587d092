"""app.core.clock: ``iso`` (its per-second cache) renders every millisecond as datetime does, ``rq_time`` as RQ does."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from rq.utils import utcformat

from app.core.clock import iso, iso_or_none, rq_time


def reference(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def test_iso_matches_datetime_across_seconds_and_repeats() -> None:
    rng = random.Random(32)
    values = [0, 999, 1000, 1_796_000_000_000, 1_796_000_000_999, 1_796_000_001_000]
    values += [rng.randrange(0, 4_102_444_800_000) for _ in range(5_000)]
    for ms in values + values:  # the second pass is served by the cache
        assert iso(ms) == reference(ms), ms


def test_iso_or_none() -> None:
    assert iso_or_none(None) is None
    assert iso_or_none(1_796_000_000_120) == "2026-11-30T00:53:20.120Z"


def test_rq_time_is_rqs_utcformat() -> None:
    rng = random.Random(32)
    start = datetime(1970, 1, 1, tzinfo=UTC)
    moments = [start, start + timedelta(microseconds=1), datetime(2026, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
               datetime(2028, 2, 29, 12, 0, 0, 0, tzinfo=UTC)]
    moments += [start + timedelta(microseconds=rng.randrange(0, 4_102_444_800_000_000)) for _ in range(5_000)]
    for at in moments + moments:
        assert rq_time(at) == utcformat(at), at
