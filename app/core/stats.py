"""The task counters: one hash, ``keys.STATS``, of field -> count (its field names live in app.core.keys).

The scripts add to it in the same compare-and-set as the change they count (a submit, a transition
into a final status, a retry, a recovery); Python adds only what no script does (a housekeeping pass
ran, a submit was answered with the no-worker warning). ``/metrics`` exports every field.
"""

from __future__ import annotations

from typing import Any

import redis

from app.core import keys


class Stats:
    key = keys.STATS

    def __init__(self, conn: redis.Redis) -> None:
        self.redis: Any = conn

    def read(self) -> dict[str, int]:
        """Every counter, as a number."""
        return {name: int(value) for name, value in self.decode(self.redis.hgetall(self.key)).items()}

    def count(self, stat: str, n: int = 1, pipeline: Any = None) -> None:
        """Add ``n`` to counter ``stat``."""
        (self.redis if pipeline is None else pipeline).hincrby(self.key, stat, n)

    @staticmethod
    def decode(raw: dict[bytes, bytes]) -> dict[str, float]:
        """The counters of the hash as read (a caller's pipeline reads ``key`` with HGETALL); a field whose
        value is not a number (written by hand) is left out."""
        counters: dict[str, float] = {}
        for name, value in raw.items():
            try:
                counters[name.decode(errors="replace")] = float(value)
            except ValueError:
                continue
        return counters
