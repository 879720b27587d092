"""``taskport scheduler``: rq-scheduler, which enqueues periodic jobs when they fall due.

Any number of scheduler processes may run: rq-scheduler takes a lock in Redis for each pass, so only
one of them enqueues at a time, and a periodic job registered under a fixed id is replaced, not
duplicated, when a scheduler restarts.
"""

from __future__ import annotations

import logging
import warnings

from rq_scheduler import Scheduler

from app.config import Config
from app.connection import connect, wait_for_redis
from app.logs import setup_logging

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
    """Register the periodic jobs. Housekeeping (expiry, stall recovery, monitoring) registers here,
    each job under a fixed id and with a ``result_ttl``, so a restart replaces it and no result piles up.
    """


def build_scheduler(config: Config, name: str | None = None) -> Scheduler:
    """An rq-scheduler polling every ``config.scheduler_interval`` seconds, its jobs registered."""
    conn = connect(config)
    wait_for_redis(conn)
    scheduler = Scheduler(queue_name="default", connection=conn, interval=config.scheduler_interval, name=name)
    register_jobs(scheduler, config)
    return scheduler


def main(config: Config, name: str | None = None) -> int:
    """Run the scheduler until SIGTERM/SIGINT (it then registers its death and exits 0)."""
    setup_logging(config, "scheduler")
    quiet_known_warnings()
    scheduler = build_scheduler(config, name)
    log.info("scheduler %s polling every %s s", scheduler.name, config.scheduler_interval)
    scheduler.run()
    return 0
