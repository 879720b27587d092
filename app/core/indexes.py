"""The indexes housekeeping reads, one small owner each: its key, its reads and its cleanup.

The Lua scripts of :mod:`app.core.scripts` write these keys in the same compare-and-set as the state
change they follow (a task enters the expiry index when it is created, the running index when it
starts, the failure index when it fails); these classes are everything Python does with them. Each
takes a connection; a method that writes takes an optional ``pipeline`` so a caller can batch it
(``connection = pipeline if pipeline is not None else self.redis``, as rq's registries do).
"""

from __future__ import annotations

from typing import Any

import redis

from app.core import keys
from app.core.clock import now_ms


class _Owner:
    """The connection every index holds (redis-py's bytes|str unions say nothing here: replies are bytes)."""

    def __init__(self, conn: redis.Redis) -> None:
        self.redis: Any = conn


class ScoreIndex(_Owner):
    """A sorted set of task ids scored by a time in ms, which housekeeping acts on oldest first."""

    key: str

    def due(self, before_ms: int, limit: int) -> list[str]:
        """Up to ``limit`` task ids whose score is at most ``before_ms``, oldest first."""
        return [m.decode() for m in self.redis.zrangebyscore(self.key, "-inf", before_ms, start=0, num=limit)]

    def forget(self, task_id: str, pipeline: Any = None) -> None:
        """Drop a task id the index holds for nothing (its task is gone, or past what the index tracks)."""
        (self.redis if pipeline is None else pipeline).zrem(self.key, task_id)


class ExpiryIndex(ScoreIndex):
    """``keys.EXPIRY``: every task, scored by the ms when housekeeping must act on it (expire it when
    unfinished, tombstone it when finished, let the tombstone go). Its cleanup is the expiry pass
    (:meth:`app.core.store.TaskStore.expire_batch`)."""

    key = keys.EXPIRY


class RunningIndex(ScoreIndex):
    """``keys.RUNNING``: the PROCESSING tasks, scored by their last heartbeat. The recovery pass reads
    the stalled ones by score; a task that is not PROCESSING any more leaves it."""

    key = keys.RUNNING

    def ids(self, limit: int = 10_000) -> list[str]:
        """Up to ``limit`` running task ids, the longest silent first."""
        return [m.decode() for m in self.redis.zrange(self.key, 0, limit - 1)]


class SlowTasks(_Owner):
    """``keys.SLOW_WARNED``: the PROCESSING tasks already logged as slow, so each is logged once. The
    monitor pass drops the ids that left the running index."""

    key = keys.SLOW_WARNED

    def warned(self) -> set[str]:
        return {m.decode() for m in self.redis.smembers(self.key)}

    def mark(self, task_id: str) -> None:
        self.redis.sadd(self.key, task_id)

    def unmark(self, *task_ids: str) -> None:
        self.redis.srem(self.key, *task_ids)


class FailureIndex(_Owner):
    """``keys.FAILURES``: recent failures scored by time, for the failure alert."""

    key = keys.FAILURES

    def since(self, start_ms: int) -> int:
        """How many tasks failed since ``start_ms``; older entries leave the index (one round trip)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zremrangebyscore(self.key, "-inf", f"({start_ms}")
        pipe.zcard(self.key)
        return int(pipe.execute()[1])


class SweepPosition(_Owner):
    """``keys.ORPHAN_SWEEP``: the task id the result store's orphan sweep continues after
    (see :mod:`workers.orphans`)."""

    key = keys.ORPHAN_SWEEP

    def read(self) -> str:
        """The id to continue after ('' = from the start)."""
        return (self.redis.get(self.key) or b"").decode()

    def save(self, task_id: str) -> None:
        self.redis.set(self.key, task_id)


class Locks(_Owner):
    """Housekeeping's SET NX keys with a lifetime: a pass's interval lock (``keys.housekeeping_lock``) and
    the failure alert's window (``keys.ALERT_SENT``). Each takes itself down when its time is over."""

    def take_pass(self, name: str, ttl_ms: int) -> bool:
        """True when this caller may run pass ``name`` in this interval, False when another copy did."""
        return self._take(keys.housekeeping_lock(name), ttl_ms, now_ms())

    def take_alert(self, window_ms: int, now: int) -> bool:
        """True when no failure alert went out within the window, and this caller sends it."""
        return self._take(keys.ALERT_SENT, window_ms, now)

    def _take(self, key: str, ttl_ms: int, value: int) -> bool:
        return bool(self.redis.set(key, value, nx=True, px=ttl_ms))


class ActiveCounts(_Owner):
    """``keys.ACTIVE``: member -> how many of its tasks are unfinished, kept by the scripts (the count the
    submit script checks ``Config.active_task_cap`` against)."""

    key = keys.ACTIVE

    def of(self, member: str) -> int:
        return int(self.redis.hget(self.key, member) or 0)
