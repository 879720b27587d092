"""A worker's registration in RQ that expires soon after its process dies (:class:`Leased`), and how long that
lease is (:func:`lease_seconds`).

Its own module because every RQ worker of taskport is leased: the task workers (workers.worker), the
housekeeper (workers.scheduler) and the callback deliverer (workers.delivery), which need this and none of
the task workers' classes.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

import redis
from rq import worker_registration

from app.core.config import Config

log = logging.getLogger("workers.worker")  # the worker's log lines keep the logger name they always had
LEASE_STALLS = 3  # a dead worker's registration expires this many stall timeouts after its last renewal
MIN_LEASE = 30  # seconds, however short the stall timeout


class Leased:
    """Mixin for an RQ worker class (before it in the bases): its registration (``rq:worker:<name>`` and its
    executions index) expires ``lease`` seconds after it was last renewed, busy or idle, so a worker killed
    with SIGKILL (or OOM) leaves `rq info`, the dashboard and ``/readyz`` within that time.

    RQ's own expiry is much later: a busy simple worker's is the job's timeout + 60 s (an hour for
    ``demo.sleep``), an idle worker's its ``worker_ttl`` + 60 s (8 minutes), since nothing renews it while
    the worker waits on its queues or runs a job in-process. Here every RQ heartbeat is capped at the lease,
    and a thread renews it every third of the lease for as long as the process lives (one EXPIRE of each key,
    in one round trip). Should the registration be gone all the same (Redis was away for longer than the
    lease), the thread writes it again.
    """

    lease: int = LEASE_STALLS * 30  # seconds; build_worker sets it from the stall timeout (lease_seconds)
    _renewing: threading.Event | None = None

    def lease_ttl(self, timeout: int | None) -> int:
        """The expiry RQ asked for (``timeout``, else its worker_ttl + 60), capped at the lease."""
        worker: Any = self
        return min(timeout or worker.worker_ttl + 60, self.lease)

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        super().heartbeat(self.lease_ttl(timeout), pipeline)  # type: ignore[misc]

    def register_birth(self) -> None:
        super().register_birth()  # type: ignore[misc]
        worker: Any = self
        worker.connection.expire(worker.key, self.lease)  # RQ's birth sets worker_ttl + 60
        self._renewing = threading.Event()
        threading.Thread(target=self._renew, args=(self._renewing,), name="rq-worker-lease", daemon=True).start()

    def register_death(self) -> None:
        if self._renewing is not None:
            self._renewing.set()
        super().register_death()  # type: ignore[misc]

    def _renew(self, stop: threading.Event) -> None:
        worker: Any = self
        while not stop.wait(self.lease / 3):
            try:
                with worker.connection.pipeline(transaction=False) as pipe:
                    pipe.expire(worker.key, self.lease)
                    pipe.expire(worker.executions_key, self.lease)
                    registered = pipe.execute()[0]
                if not registered and not stop.is_set():
                    self._register_again()
            except redis.RedisError as exc:  # Redis away: the next renewal tries again
                log.warning("worker %s: could not renew its registration: %s", worker.name, exc)

    def _register_again(self) -> None:
        worker: Any = self
        log.warning("worker %s: its registration had expired; registering again", worker.name)
        with worker.connection.pipeline() as pipe:
            pipe.hset(worker.key, mapping={**worker.serialize(), "state": worker.get_state()})
            worker_registration.register(worker, pipe)
            pipe.expire(worker.key, self.lease)
            pipe.execute()


def lease_seconds(config: Config) -> int:
    """How long a worker's registration outlives its process: ``LEASE_STALLS`` stall timeouts (90 s by
    default), at least ``MIN_LEASE``."""
    return max(MIN_LEASE, math.ceil(LEASE_STALLS * config.stall_timeout))
