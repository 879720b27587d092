"""The scheduler's clock: work that must happen within a second of its time, every ``TICK`` seconds.

rq-scheduler polls every ``TASKPORT_SCHEDULER_INTERVAL`` (5 s) and housekeeping runs every minute: too
coarse for a task due at 02:00:00 or a schedule's fire time. So each scheduler process also runs this
loop in a thread of its own. :data:`TICKS` holds builders: the loop calls each once with its connection and
config (a builder makes what its tick needs, a store, its processors loaded) and then calls the ticks they
return every round. Any number of scheduler processes run it at once: each tick function must be safe under that
(a compare-and-set per item, a dedup key per fire time), so a second scheduler only adds availability.

A tick that raises a Redis error is logged once per outage (the loop carries on, the connection rides
the outage out); any other error is logged with its traceback and the loop carries on as well.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from app.core.config import Config
from app.core.connection import connect

log = logging.getLogger(__name__)

TICK = 0.5  # seconds between two rounds: what is due is acted on within this (plus the round's own time)
Tick = Callable[[], object]
TICKS: list[Callable[[redis.Redis, Config], Tick]] = []  # tick builders, registered by the modules that own them


def start(config: Config, stop: threading.Event) -> threading.Thread:
    """Run the rounds in a daemon thread until ``stop`` is set."""
    thread = threading.Thread(target=_run, args=(config, stop), name="taskport-timers", daemon=True)
    thread.start()
    return thread


def _run(config: Config, stop: threading.Event) -> None:
    conn = connect(config)
    ticks = [build(conn, config) for build in TICKS]
    failing = False
    while not stop.wait(TICK):
        for tick in ticks:
            try:
                tick()
            except redis.RedisError as exc:
                if not failing:
                    log.warning("timers: redis unavailable (%s); retrying every %s s", exc, TICK)
                failing = True
                break
            except Exception:
                log.exception("timers: %s failed", getattr(tick, "__name__", tick))
        else:
            if failing:
                log.info("timers: redis is back")
            failing = False
