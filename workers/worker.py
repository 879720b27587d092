"""``taskport worker``: one RQ worker process listening on the queues high, default, low (in that order).

It runs RQ's own scheduler alongside (``with_scheduler=True``): a retry with backoff is a scheduled
job, and without a scheduler it would never come back. SIGTERM is RQ's warm shutdown (finish the
current job, then exit); a second SIGTERM is the cold one.

While Redis is unreachable every Redis command waits for it to come back (``ride_out_outages``), so the
worker, its work horse and RQ's scheduler ride out a restart of the embedded redis-server.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rq import Queue, SimpleWorker
from rq.job import Job
from rq.worker import BaseWorker

from app import jobs
from app.config import Config
from app.connection import connect, ride_out_outages, wait_for_redis
from app.jobs import record_stopped_as_canceled, register_queues
from app.logs import setup_logging
from app.process import forked_children_die_with_me
from app.states import QUEUES

log = logging.getLogger(__name__)

class StoppableSimpleWorker(SimpleWorker):
    """RQ's SimpleWorker (jobs run in the worker process), which ignores RQ's stop-job command; here the
    command stops the run in progress: at its next checkpoint, or by ending this process after
    ``workers.runner.CANCEL_GRACE`` if it never checkpoints (the supervisor starts a new worker).

    Also coalesces RQ's worker heartbeats. RQ sends one, unpipelined (three round trips: HSET, EXPIRE,
    EXPIRE), before each dequeue, after it and after each job: 9 of the ~30 round trips of a no-op
    delivery. One that would not push the worker's expiry later than the last one set, within
    ``HEARTBEAT_EVERY`` seconds of it, is skipped (by more than that second); a heartbeat that extends
    the expiry further (before a long dequeue after a job with a short timeout, say) always goes out.
    The expiry in Redis therefore falls short of what RQ asked for by under ``HEARTBEAT_EVERY``
    (against a TTL of minutes), and ``last_heartbeat`` is at most that much older.
    """

    HEARTBEAT_EVERY = 1.0
    _hb_sent = 0.0  # monotonic time of the last heartbeat
    _hb_until = 0.0  # monotonic time at which the last heartbeat's expiry runs out

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        ttl = timeout or self.worker_ttl + 60
        now = time.monotonic()
        recent = now - self._hb_sent < self.HEARTBEAT_EVERY
        if pipeline is None and recent and now + ttl <= self._hb_until + self.HEARTBEAT_EVERY:
            return
        super().heartbeat(timeout, pipeline)
        self._hb_sent, self._hb_until = now, now + ttl

    def kill_horse(self, sig: Any = None) -> None:
        from workers import runner

        runner.stop_current(self.get_current_job_id())

    def handle_job_success(self, job: Job, queue: Queue, *args: Any, **kwargs: Any) -> Any:
        """A job stopped on request (RQ set ``_stopped_job_id`` before calling :meth:`kill_horse`) ends as
        the fork worker's does: in the canceled registry (app.jobs.CancelAware), not as a success."""
        done = super().handle_job_success(job, queue, *args, **kwargs)
        if job.id == getattr(self, "_stopped_job_id", None):
            self._stopped_job_id = None
            record_stopped_as_canceled(job)
        return done


WORKER_CLASSES: dict[str, type[BaseWorker]] = {
    "fork": jobs.Worker,  # a forked work horse per job: a crash or a stop command kills only the horse
    "simple": StoppableSimpleWorker,  # runs jobs in-process: fastest; a cancel ignored for 1 s ends the process
    "spawn": jobs.SpawnWorker,  # posix_spawn'd horse: for platforms where fork is unsafe (macOS)
}


def build_worker(config: Config, name: str | None = None) -> BaseWorker:
    """The RQ worker of ``config.worker_class`` on our queues, connected to ``config.redis_url``.

    ``name`` defaults to RQ's random one: a fixed name (say hostname.pid, which repeats in containers)
    would collide with the registration a killed predecessor leaves behind for a few minutes.
    """
    conn = connect(config)
    wait_for_redis(conn)
    register_queues(conn)
    worker_class = WORKER_CLASSES[config.worker_class]
    return worker_class(list(QUEUES), name=name, connection=conn)


def main(config: Config, name: str | None = None) -> int:
    """Run one worker until it is told to stop; returns the process exit code."""
    setup_logging(config, "worker")
    ride_out_outages()  # a Redis restart is waited out, not a reason to quit (see app.connection)
    forked_children_die_with_me()  # RQ's scheduler child and the work horses go when the worker goes
    from workers import runner  # imported late: it loads the processors, which may import a lot

    worker = build_worker(config, name)
    runner.prepare(config)  # loads the processors once, before the first fork, so work horses inherit them
    log.info("worker %s (%s) listening on %s", worker.name, config.worker_class, ", ".join(QUEUES))
    # after worker_max_jobs jobs the worker exits 0 and its supervisor starts a fresh one: whatever a
    # processor leaks in an in-process (simple) worker is bounded (bench/README.md, "Worker memory")
    worker.work(with_scheduler=True, logging_level=config.log_level.upper(), max_jobs=config.worker_max_jobs or None)
    return 0
