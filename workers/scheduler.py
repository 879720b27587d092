"""``taskport scheduler``: rq-scheduler, which enqueues the housekeeping passes when they fall due,
plus the housekeeper: a SimpleWorker child process that runs them from their own queue.

Any number of scheduler processes may run: rq-scheduler takes a lock in Redis for each pass, so only
one of them enqueues at a time; a periodic job registered under a fixed id is replaced, not
duplicated, when a scheduler restarts; and each pass takes a per-interval lock (see
workers.housekeeping), so even a pass enqueued twice runs once per interval.

Beside them, every scheduler process runs :mod:`workers.timers`: a loop every half second for what is
due to the second.

Why a queue of its own, served by the scheduler's own child: housekeeping must run when every task
worker is busy with hour-long exports, or dead (that is when stall recovery is needed most).
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.process
import os
import signal
import threading
import warnings
from datetime import UTC, datetime

from rq import Queue, SimpleWorker
from rq_scheduler import Scheduler

from app.core import layout
from app.core.config import Config
from app.core.connection import connect, ride_out_outages, wait_for_redis
from app.core.housekeeping_passes import PASSES, job_id
from app.core.housekeeping_passes import QUEUE as HOUSEKEEPING_QUEUE
from app.core.logs import setup_logging
from app.core.process import die_with_parent, forked_children_die_with_me
from app.core.states import DEFAULT_QUEUE
from workers import deferred, delivery, firing, limits, timers  # noqa: F401 - ticks: run_at/after, callbacks...
from workers.lease import Leased, lease_seconds
from workers.stopping import PromptUnsubscribe

log = logging.getLogger(__name__)


def quiet_known_warnings() -> None:
    """Silence exactly the two warnings rq-scheduler 0.14 is known to trigger, nothing else.

    Its cron support calls ``crontab.CronTab.next()`` without ``default_utc`` (a FutureWarning about
    crontab's future default) and it uses the naive ``datetime.utcnow()`` (deprecated from Python 3.12).
    """
    warnings.filterwarnings(
        "ignore", message=r"Version 0\.22\.0\+ of crontab", category=FutureWarning, module=r"rq_scheduler\.")
    warnings.filterwarnings(
        "ignore", message=r"datetime\.datetime\.utcnow\(\) is deprecated", category=DeprecationWarning,
        module=r"rq_scheduler\.")


def register_jobs(scheduler: Scheduler, config: Config) -> None:
    """Register the housekeeping passes, each under a fixed id so a restart replaces it.

    They keep rq-scheduler's default ``result_ttl`` (-1): a periodic job's hash must outlive each run,
    since rq-scheduler re-enqueues that same job at every interval (with 0 RQ would delete it).
    """
    interval = config.housekeeping_interval
    for name in PASSES:
        scheduler.schedule(
            scheduled_time=datetime.now(UTC).replace(tzinfo=None), func=f"workers.housekeeping.{name}_pass",
            interval=interval, id=job_id(name), queue_name=HOUSEKEEPING_QUEUE, timeout=max(60, interval * 5),
            description=f"housekeeping: {name}")


class HousekeepingWorker(Leased, PromptUnsubscribe, SimpleWorker):
    """The housekeeper's RQ worker: RQ's SimpleWorker with a leased registration (workers.lease.Leased)."""


def run_housekeeper(config: Config, parent: int | None = None) -> None:
    """The child process: a SimpleWorker on the housekeeping queue (its scheduler runs alert retries)."""
    die_with_parent(signal.SIGTERM, parent)  # RQ's warm shutdown when the scheduler goes, however it goes
    setup_logging(config, "housekeeper")
    ride_out_outages()
    forked_children_die_with_me()  # the housekeeper's own RQ scheduler child
    conn = connect(config)
    wait_for_redis(conn)
    worker = HousekeepingWorker([Queue(HOUSEKEEPING_QUEUE, connection=conn)], connection=conn)
    worker.lease = lease_seconds(config)  # a killed housekeeper leaves `rq info` within the lease, as workers do
    worker.work(with_scheduler=True, logging_level=config.log_level_name)


def start_housekeeper(config: Config) -> multiprocessing.process.BaseProcess:
    # not a daemon: RQ's worker starts a child of its own (its scheduler, for alert retries)
    child = multiprocessing.get_context("spawn").Process(
        target=run_housekeeper, args=(config, os.getpid()), name="taskport-housekeeper")
    child.start()
    return child


def stop_housekeeper(child: multiprocessing.process.BaseProcess) -> None:
    if child.is_alive():
        child.terminate()  # SIGTERM: RQ's warm shutdown, the running pass finishes
        child.join(15)
    if child.is_alive():
        child.kill()
        child.join()


def build_scheduler(config: Config, name: str | None = None) -> Scheduler:
    """An rq-scheduler polling every ``config.scheduler_interval`` seconds, its jobs registered."""
    conn = connect(config)
    wait_for_redis(conn)
    layout.upgrade(conn)  # a Redis of an earlier key layout: before anything reads it (app.core.layout)
    scheduler = Scheduler(queue_name=DEFAULT_QUEUE, connection=conn, interval=config.scheduler_interval, name=name)
    register_jobs(scheduler, config)
    return scheduler


def main(config: Config, name: str | None = None) -> int:
    """Run the scheduler until SIGTERM/SIGINT (it then registers its death and exits 0)."""
    setup_logging(config, "scheduler")
    ride_out_outages()  # rq-scheduler's loop has no retry of its own: a Redis restart is waited out here
    quiet_known_warnings()
    scheduler = build_scheduler(config, name)
    log.info("scheduler %s polling every %s s; housekeeping every %s s", scheduler.name,
             config.scheduler_interval, config.housekeeping_interval)
    housekeeper = start_housekeeper(config)
    stop_timers = threading.Event()
    timers.start(config, stop_timers)  # what must happen within a second of its time (workers.timers)
    try:
        scheduler.run()
    finally:
        stop_timers.set()
        stop_housekeeper(housekeeper)
    return 0
