"""Whether the deployment can process tasks, not only whether Redis answers.

Two facts, read from RQ's own records in Redis (nothing new is written for them):

- **workers per queue**: the RQ workers registered on each of our queues whose registration is still
  alive, as ``rq info`` lists them once RQ's ``clean_worker_registry`` dropped the dead keys from its
  sets. RQ removes a registration when its worker stops. One left by a worker killed with SIGKILL (or
  OOM) is removed at once by the worker that takes its slot (same name: ``taskport up``'s supervisor,
  ``DYNO``), and otherwise expires within the workers' lease (3 stall timeouts, 90 s by default:
  workers.lease.Leased), where RQ's own expiry was up to an hour for a busy in-process worker;
- **housekeeping**: when each periodic pass (a job under a fixed id, see ``app.core.housekeeping_passes``) last
  ended. A pass older than two housekeeping intervals means no scheduler (or no housekeeper) runs.

``/readyz`` reports both, ``/metrics`` exports them, and a submit while no worker listens on the
task's queue gets a ``Taskport-Warning`` header (see :meth:`app.web.service.TaskService.unserved`).

And one fact operators set: the **paused queues** (:class:`QueuePauses`, ``keys.PAUSED_QUEUES``), from which
no worker takes a job until they are resumed (workers.dequeue.HonoursPauses). ``/readyz``, ``/metrics`` and
rq-dashboard show them; a pause is not a problem of readiness (the web still accepts submits, which wait).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from rq.job import Job
from rq.utils import as_text, str_to_date
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from app.core import keys
from app.core.config import Config
from app.core.housekeeping_passes import PASSES
from app.core.housekeeping_passes import job_id as housekeeping_job_id
from app.core.states import QUEUES

STALE_INTERVALS = 2  # housekeeping is stale once its last pass is older than this many intervals
WORKER_CACHE_SECONDS = 1.0  # how long a web process reuses a worker count for submit warnings
WARNING_HEADER = "Taskport-Warning"
STAT_UNSERVED = "submitted_without_worker"  # keys.STATS field: submits answered with the warning


def live_workers(conn: redis.Redis) -> dict[str, int]:
    """Queue -> number of RQ workers listening on it whose registration is alive (two round trips)."""
    pipe = conn.pipeline(transaction=False)
    for name in QUEUES:
        pipe.smembers(WORKERS_BY_QUEUE_KEY % name)
    members = [sorted(as_text(k) for k in keys) for keys in pipe.execute()]
    pipe = conn.pipeline(transaction=False)
    for worker_keys in members:
        for key in worker_keys:
            pipe.exists(key)
    alive = iter(pipe.execute())
    return {name: sum(1 for _ in worker_keys if next(alive)) for name, worker_keys in zip(QUEUES, members, strict=True)}


class QueuePauses:
    """The queues operators paused: read by /readyz, /metrics and the dashboard, set by the operator API."""

    def __init__(self, conn: redis.Redis) -> None:
        self.redis = conn

    def paused(self) -> list[str]:
        """The paused queues, in the workers' order (high, default, low)."""
        names = {as_text(name) for name in self.redis.smembers(keys.PAUSED_QUEUES)}  # type: ignore[union-attr]
        return [name for name in QUEUES if name in names]

    def pause(self, queue: str) -> bool:
        """Pause ``queue`` (one of QUEUES); True if it was not paused yet."""
        return bool(self.redis.sadd(keys.PAUSED_QUEUES, queue))

    def resume(self, queue: str) -> bool:
        """Resume ``queue``; True if it was paused."""
        return bool(self.redis.srem(keys.PAUSED_QUEUES, queue))


def housekeeping_ages(conn: redis.Redis, now: datetime | None = None) -> dict[str, float | None]:
    """Pass -> seconds since it last ended (None: it never ran, or its record is gone)."""
    now = now or datetime.now(UTC)
    pipe = conn.pipeline(transaction=False)
    for name in PASSES:
        pipe.hget(Job.key_for(housekeeping_job_id(name)), "ended_at")
    ages: dict[str, float | None] = {}
    for name, raw in zip(PASSES, pipe.execute(), strict=True):
        ended = str_to_date(raw) if raw else None
        ages[name] = None if ended is None else max(0.0, (now - ended.replace(tzinfo=UTC)).total_seconds())
    return ages


@dataclass(frozen=True)
class Readiness:
    workers: dict[str, int]
    housekeeping: dict[str, float | None]
    interval: int
    problems: list[str] = field(default_factory=list)
    paused: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, conn: redis.Redis, config: Config) -> Readiness:
        workers = live_workers(conn)
        ages = housekeeping_ages(conn)
        paused = QueuePauses(conn).paused()
        limit = STALE_INTERVALS * config.housekeeping_interval
        problems = [f"no worker listens on queue {name}" for name, n in workers.items() if n == 0]
        for name, age in ages.items():
            if age is None:
                problems.append(f"housekeeping pass {name} has never run: is a scheduler running?")
            elif age > limit:
                problems.append(f"housekeeping pass {name} last ran {age:.0f} s ago (limit {limit} s): "
                                "is a scheduler running?")
        return cls(workers, ages, config.housekeeping_interval, problems, paused)

    @property
    def ready(self) -> bool:
        return not self.problems

    def document(self) -> dict[str, Any]:
        """The /readyz body."""
        return {
            "status": "ready" if self.ready else "degraded",
            "store": "ok",  # Redis answered (when it does not, /readyz is a 503 problem instead)
            "workers": self.workers,
            "paused_queues": self.paused,  # no worker takes their jobs until resumed (taskport resume QUEUE)
            "housekeeping": {
                "interval_seconds": self.interval,
                "last_run_seconds_ago": {k: None if v is None else round(v, 1) for k, v in self.housekeeping.items()},
            },
            "problems": self.problems,
        }


class WorkerWatch:
    """Live worker counts for the submit warning, re-read at most once per ``WORKER_CACHE_SECONDS`` per
    process, so a submit costs no extra round trip while workers run."""

    def __init__(self, conn: redis.Redis) -> None:
        self.redis = conn
        self._lock = threading.Lock()
        self._read_at = -WORKER_CACHE_SECONDS
        self._counts: dict[str, int] = {}

    def counts(self) -> dict[str, int]:
        with self._lock:
            if time.monotonic() - self._read_at >= WORKER_CACHE_SECONDS:
                self._counts = live_workers(self.redis)
                self._read_at = time.monotonic()
            return self._counts

    def unserved(self) -> list[str]:
        """Queues no worker listens on right now (usually none)."""
        return [name for name, n in self.counts().items() if n == 0]
