"""A worker's graceful stop: SIGTERM or SIGINT puts the running task back on its queue instead of failing it.

RQ's own warm shutdown waits for the running job to end, and a second signal turns it into a cold one
that kills it; a platform stops a process with SIGTERM (Heroku: 30 s before SIGKILL, and it may send
SIGTERM more than once; so does make). Here the first signal asks the run in progress to stop at its next
cancellation point (its checkpoint saved, the task put back without using an attempt: workers.runner), the
worker exits once the run is back, and later signals change nothing. A run that does not stop within the
stop grace is put back from its last checkpoint anyway, and its process ends.

The handler takes no lock and does no I/O but RQ's own bookkeeping of a stop: a signal may arrive while the
same thread holds any lock.
"""

from __future__ import annotations

import contextlib
import os
import signal
from types import FrameType
from typing import Any

import redis
from rq.utils import now
from rq.worker import WorkerStatus

UNSUBSCRIBE_WAIT = 1.0  # seconds a stop waits for RQ's pubsub thread to end (RQ's own join timeout)


class GracefulStop:
    """Mixin for an RQ worker class (before it in the bases): the graceful stop of the module docstring."""

    _stopping = False

    def _install_signal_handlers(self) -> None:
        signal.signal(signal.SIGINT, self._stop_gracefully)
        signal.signal(signal.SIGTERM, self._stop_gracefully)

    _waiting = False  # set while the worker blocks for work (workers.dequeue): the one place a stop may raise into

    def _stop_gracefully(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping:
            return  # the stop is under way: a second signal is no reason to kill the run
        self._stopping = True
        worker: Any = self
        worker._shutdown_requested_date = now()
        worker.handle_warm_shutdown_request()
        self._interrupt_run()
        if self._waiting or worker.get_state() == WorkerStatus.BUSY:
            worker._shutdown()  # RQ's: stop after the current job, or at once (StopRequested) when idle
            return
        # Between two steps of a take (the claim, reading its job, its log line): RQ would raise StopRequested
        # into whatever runs, and a log call swallows it (logging's handleError) with a traceback, after which
        # the worker ran the job it had claimed and then waited on forever. RQ's loop ends at its next turn
        # instead, the job just taken run first (a warm stop); the take's loop checks the flag too.
        worker._stop_requested = True
        if worker.scheduler:
            worker.stop_scheduler()

    def _interrupt_run(self) -> None:
        horse = getattr(self, "horse_pid", 0)
        if horse:  # fork and spawn: the run is in the work horse, whose SIGTERM stops it gracefully
            with contextlib.suppress(ProcessLookupError):
                os.kill(horse, signal.SIGTERM)
            return
        from workers import runner  # the in-process run of a simple worker

        runner.interrupt_current()


class PromptUnsubscribe:
    """Mixin for an RQ worker class (before it in the bases): its stop ends RQ's pubsub thread at once.

    RQ 3.0 runs that thread (which hears ``rq`` commands such as stop-job) with ``sleep_time=60``, and its
    ``unsubscribe`` (the last step of a worker's teardown) sends UNSUBSCRIBE, then calls the thread's
    ``stop()``. When the thread reads UNSUBSCRIBE's reply before ``stop()`` lowers its running flag (often,
    on a busy machine), it loops into ``get_message(timeout=60)``, which, now unsubscribed, waits 60 s for a
    subscription. redis-py 8.1's ``stop()`` only lowered the flag and RQ waited 1 s for the thread; 8.2's
    ``stop()`` joins it without a timeout, so the worker sat out the 60 s and was SIGKILLed (issue 29,
    finding 11). Here the flag goes down before UNSUBSCRIBE is sent, so the reply that wakes the thread ends
    its loop; the wait for it is bounded whatever redis-py's version (``stop()``'s join is never called).
    """

    def unsubscribe(self) -> None:
        worker: Any = self
        thread = worker.pubsub_thread
        if thread is None:
            return
        worker.log.info("Worker %s: unsubscribing from channel %s", worker.name, worker.pubsub_channel_name)
        thread._running.clear()  # redis-py's PubSubWorkerThread loops while this is set (8.1 and 8.2 alike)
        # the thread may wake meanwhile (a message, its subscription's own reply), see the flag down and close
        # the connection on its way out: unsubscribed already, so a send that meets it closed is no error
        with contextlib.suppress(redis.exceptions.ConnectionError, OSError):
            worker.pubsub.unsubscribe()
        thread.join(timeout=UNSUBSCRIBE_WAIT)
        worker.pubsub.close()
