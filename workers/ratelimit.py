"""``ctx.limit``'s side in the worker: one token of a named rate limit, shared by every worker on every host.

:meth:`RateLimiter.take` runs the RATE_TAKE script (app.core.limitscripts), one round trip: the token is taken for
the time it may be used, and the caller waits until then at a cancellation point (``ctx.sleep``). A wait longer
than ``TASKPORT_RATE_WAIT_MAX`` takes no token: :class:`workers.exceptions.RateDeferred` makes the runner put the
task back with a run_at instead of holding the worker.
"""

from __future__ import annotations

from typing import Any

from app.core import keys
from app.core.config import Config
from app.core.limits import rate_of
from app.core.limitscripts import RATE_TAKE
from workers.exceptions import RateDeferred


class RateLimiter:
    """Takes tokens for one run (its task id names it in a RateDeferred) through the store's scripts."""

    def __init__(self, store: Any, config: Config, task_id: str) -> None:
        self.store = store
        self.config = config
        self.task_id = task_id

    def take(self, name: str, rate: float | None = None, per: float | None = None) -> float:
        """Seconds to wait before the token taken may be used (0: at once); raises RateDeferred when the wait would
        be longer than the longest a worker is held (no token taken then)."""
        tokens, seconds = rate_of(self.config, name, rate, per)
        answer = self.store.run_script(RATE_TAKE.name, *RATE_TAKE.call(
            keys={"bucket": keys.rate_bucket(name), "stats": keys.RATE_STATS},
            args={"name": name, "rate": tokens, "per_ms": seconds * 1000,
                  "wait_max_ms": int(self.config.rate_wait_max * 1000)},
            record_ms=self.config.call_record_ms))
        wait = int(answer[2]) / 1000
        if not int(answer[1]):
            raise RateDeferred(self.task_id, name, wait)
        return wait
