"""The context handed to a processor: progress, per-item bookkeeping and cancellation checkpoints.

The runner builds one :class:`TaskContext` per task run and passes it a ``report`` callable that
writes ``(progress, message, items)`` to Redis and answers the task's current status. The context
keeps that traffic small (writes are throttled to one per ``interval`` seconds, the latest values
are always remembered and :meth:`TaskContext.flush` pushes them) and turns any answer other than
``PROCESSING`` into a cancellation that the next cancellation point raises as :class:`TaskCancelled`.

With each write goes the run's durable checkpoint (:mod:`workers.checkpoint`): how far the item runs got
and the processor's own cursor. A context built with a :class:`~workers.checkpoint.Resume` continues from
it: the items already done are skipped (their outcomes counted once, their results handed back), the
cursor is there to read. A worker that must stop (SIGTERM) calls :meth:`TaskContext.mark_interrupted`:
the next cancellation point raises :class:`TaskInterrupted`, and the runner saves and re-queues the task.

Thread model: the processor runs in one thread; the runner's heartbeat thread may call
:meth:`TaskContext.mark_cancelled` and :meth:`TaskContext.flush` at any time. A lock serialises
reports and the counters they read.

The lines of ``ctx.emit`` wait in a buffer of their own, with its own locks (workers.outputbuffer).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from app.core.states import TaskStatus
from workers.checkpoint import MAX_FAILURES, Pending, Resume, Saved
from workers.exceptions import TaskCancelled, TaskInterrupted
from workers.items import PROPAGATE, ItemRun, ItemScope, length
from workers.outputbuffer import BuffersOutput, Emit

if TYPE_CHECKING:
    from app.core.results import ResultStore
    from workers.batchview import BatchView
    from workers.ratelimit import RateLimiter

# MAX_FAILURES (workers.checkpoint): at most this many failure records are kept per task (the counts
# stay exact), so a batch where every item fails cannot blow up the result stored in Redis.
__all__ = ["MAX_FAILURES", "ItemScope", "TaskContext"]
# Longest single sleep inside TaskContext.sleep: a cancellation is noticed within this much time.
SLEEP_SLICE = 0.1

Report = Callable[[int | None, str, dict | None, Saved | None], str]
_Snapshot = tuple[int, str, tuple[int, int, int] | None]

log = logging.getLogger(__name__)


class TaskContext(BuffersOutput):
    """What a processor gets besides its payload. See the module docstring for the threading rules."""

    def __init__(
        self,
        task_id: str,
        report: Report,
        *,
        results: ResultStore,
        interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
        sleep: Callable[[float], None] = time.sleep,
        resume: Resume | None = None,
        emit: Emit | None = None,
        output_limits: tuple[int, int] = (10_000, 4096),
    ) -> None:
        self.task_id = task_id
        self.results = results
        self.batch: BatchView | None = None  # a batch's then task: its batch (set by the runner)
        self.limiter: RateLimiter | None = None  # takes ctx.limit's tokens (set by the runner)
        self.log = logger if logger is not None else log
        self._report_fn = report
        self._interval = interval
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.RLock()
        # a plain flag, as _interrupted: set by the beat thread or RQ's stop-job, read at each cancellation point;
        # nothing waits on it, and a threading.Event (a Condition and its lock) cost ~2 µs a delivery to build
        self._cancelled = False
        self._interrupted = False  # a plain flag: set from a signal handler, which must take no lock
        self.stopping = False  # cancelled or interrupted: what ItemRun.each reads after every item, cheaply
        self._progress = 0
        self._message = ""
        self._counts: list[int] | None = None  # [total, succeeded, failed] once items are processed
        self._failures: list[dict[str, Any]] = []
        self._error_code: int | None = None
        self._resume = resume
        self._cursor: Any = None
        self._item_runs: dict[int, ItemRun] = {}  # the item runs (each/items calls) begun, by number
        self._pending = Pending(resume)
        if resume is not None:
            self._counts = list(resume.counts) if resume.counts is not None else None
            self._failures = list(resume.failures)
            self._error_code = resume.error_code
            self._cursor = resume.cursor
        # The start transition wrote progress 0 and an empty message: that is the first write, so a
        # task that ends within one interval writes no progress at all (its completion says it all).
        self._reported: _Snapshot | None = (0, "", None)
        self._reported_at: float | None = clock()
        self._init_output(emit, output_limits)  # the live output (workers.outputbuffer)

    # -- cancellation ---------------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """True once the task is known to be no longer ours."""
        return self._cancelled

    def mark_cancelled(self) -> None:
        """Note that the task is no longer ours; the next cancellation point raises. Thread-safe."""
        self._cancelled = True
        self.stopping = True

    def mark_interrupted(self) -> None:
        """Note that this worker is stopping: the next cancellation point raises :class:`TaskInterrupted`
        (the runner saves the checkpoint and re-queues the task). Safe in a signal handler and any thread."""
        self._interrupted = True
        self.stopping = True

    @property
    def interrupted(self) -> bool:
        return self._interrupted

    def check_cancelled(self) -> None:
        """Cancellation point: raise :class:`TaskCancelled` if the task is no longer ours, or
        :class:`TaskInterrupted` if this worker is stopping (a cancel wins over a stop)."""
        if self._cancelled:
            raise TaskCancelled(self.task_id)
        if self._interrupted:
            raise TaskInterrupted(self.task_id)

    # -- the processor's own cursor ---------------------------------------------------------------

    @property
    def interval(self) -> float:
        """Seconds between two progress writes (``TASKPORT_PROGRESS_INTERVAL``), so between two checkpoint saves:
        a processor whose cursor costs something to make (a file synced) need not make it more often."""
        return self._interval

    @property
    def cursor(self) -> Any:
        """The cursor this task's processor last saved (:meth:`save_cursor`), in this run or an earlier one;
        None when it never saved one. A processor resumes from it: skip the rows, pages or days it covers."""
        return self._cursor

    def save_cursor(self, value: Any) -> None:
        """Save the processor's own position (any JSON value: a file offset, a page token, a date), durably
        with the next progress write, or the heartbeat's flush (at most a heartbeat away), and at once when
        the run stops. Save it once what it covers is durable (flushed, uploaded): the next run starts from
        it. This is a cancellation point; it writes nothing itself."""
        encoded = orjson.dumps(value)
        with self._lock:
            self._cursor = value
            self._pending.cursor = encoded
        self.check_cancelled()

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` in slices of at most ``SLEEP_SLICE``, checking for cancellation between."""
        remaining = max(0.0, float(seconds))
        while remaining > 0:
            self.check_cancelled()
            step = min(SLEEP_SLICE, remaining)
            self._sleep(step)
            remaining -= step
        self.check_cancelled()

    # -- progress -------------------------------------------------------------------------------

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Record progress ``done`` of ``total`` (or ``done`` percent without a total).

        The percentage is kept within 0..99 (100 belongs to completion) and never goes down. Redis is
        written at most once per ``interval`` seconds, counted from the task's start; values in
        between are remembered for the next write or :meth:`flush`. This is a checkpoint.
        """
        self.check_cancelled()
        percent = done / total * 100 if total else done
        self._update(percent, message)
        self.check_cancelled()

    def flush(self) -> None:
        """Write the latest values now if they differ from the last written ones, and any output lines
        waiting. Never raises TaskCancelled (it only marks the context); safe to call from any thread at any time."""
        self.flush_output()
        with self._lock:
            if self._snapshot() != self._reported or self._pending:
                self._report()

    def _update(self, percent: float | None, message: str | None) -> None:
        with self._lock:
            if percent is not None and math.isfinite(percent):
                self._progress = max(self._progress, int(min(99.0, max(0.0, percent))))
            if message is not None:
                self._message = message
            now = self._clock()
            if self._reported_at is None or now - self._reported_at >= self._interval:
                self._report()

    def _snapshot(self) -> _Snapshot:
        counts = None
        if self._counts is not None:
            counts = (self._counts[0], self._counts[1], self._counts[2])
        return self._progress, self._message, counts

    def _report(self) -> None:
        """Write the current values (caller holds the lock). A failed write is logged and retried
        at the next write: progress is best effort, the runner's final status write is not."""
        snapshot = self._snapshot()
        self._reported_at = self._clock()
        saved = self._pending.take(self._counts, self._error_code)
        try:
            status = self._report_fn(snapshot[0], snapshot[1], self.item_counts, saved)
        except PROPAGATE:
            raise
        except Exception:
            self.log.warning("task %s: progress write failed", self.task_id, exc_info=True)
            return
        self._reported = snapshot
        if saved is not None:
            self._pending.clear(saved)
        if status != TaskStatus.PROCESSING:
            self.mark_cancelled()

    # -- items ----------------------------------------------------------------------------------

    @property
    def item_counts(self) -> dict[str, int] | None:
        """``{"total", "succeeded", "failed"}``, or None when the task never processed items."""
        with self._lock:
            if self._counts is None:
                return None
            total, succeeded, failed = self._counts
            return {"total": total, "succeeded": succeeded, "failed": failed}

    @property
    def failures(self) -> list[dict[str, Any]]:
        """The recorded item failures ``{"item", "code", "message"}`` (the first ``MAX_FAILURES``)."""
        with self._lock:
            return list(self._failures)

    @property
    def error_code(self) -> int | None:
        """The result's ``error_code``: what a client branches on after a partial failure.

        The rule (docs/api.md, "Partial failure"): the code of the *last item failure that carried a
        business code* (a positive code, e.g. 10001); only when no failed item carried one, the code of
        the last failure (the service's own -1); None when no item failed. So an unexpected exception
        in a later item never hides the business code of an earlier one, and a batch that fails for
        business reasons reads the way the seed's ``catch (BusinessException e)`` loop does.
        """
        with self._lock:
            return self._error_code

    def each(
        self,
        items: Iterable[Any],
        fn: Callable[[Any], Any],
        key: Callable[[Any], Any] | None = None,
        total: int | None = None,
    ) -> list[Any]:
        """Call ``fn(item)`` for every item and return the results of the items that succeeded.

        An :class:`ItemError` fails that item with its code; any other exception fails it with -1 and
        a generic message (the traceback goes to the log). ``TaskError``, ``TaskCancelled`` and a job
        timeout end the whole task. A failure names the item by ``str(key(item))``, or by its index
        when there is no ``key``. ``total`` defaults to ``len(items)`` when there is one.
        """
        return ItemRun(self, key, total if total is not None else length(items), keeps_results=True).each(items, fn)

    def items(
        self,
        iterable: Iterable[Any],
        key: Callable[[Any], Any] | None = None,
        total: int | None = None,
    ) -> Iterator[tuple[ItemScope, Any]]:
        """Yield ``(scope, item)`` pairs; do each item's work inside ``with scope:``::

            for scope, row in ctx.items(rows, key=lambda r: r["id"]):
                with scope:
                    handle(row)

        The scope records the item as succeeded or failed exactly as :meth:`each` does and swallows
        the item's exception, so the loop goes on. Leaving a scope unused is a programming error
        (RuntimeError), because that item would be counted neither way.
        """
        run = ItemRun(self, key, total if total is not None else length(iterable), keeps_results=False)
        yield from run.walk(iterable)

    def _begin_run(self, run: ItemRun) -> Any:
        """Number ``run`` (the item runs in the order the processor makes them) and return what an earlier run
        of the task saved of it (None: nothing)."""
        with self._lock:
            run.number = len(self._item_runs)
            self._item_runs[run.number] = run
        return self._resume.runs.get(run.number) if self._resume is not None else None

    def _item_ended(self, run: ItemRun, result: Any, drawn: int, failure: tuple[str, int, str] | None = None) -> None:
        """An item of ``run`` ended: succeeded with ``result``, or failed with ``failure`` (its name, code and
        message); ``drawn`` (0 or 1) adds it to the total. Its counts, failure record and checkpoint entry change
        in one step under the lock, so no write (the heartbeat's flush) saves one without the others: a line whose
        counts say more than its items would have a resumed run count that item again."""
        with self._lock:
            assert self._counts is not None
            self._counts[0] += drawn
            if failure is None:
                self._counts[1] += 1
            else:
                self._record_failure(*failure)
            self._item_done(run, result, failure is None)

    def _item_done(self, run: ItemRun, result: Any, succeeded: bool) -> None:
        """The item's checkpoint entry (the caller holds the lock)."""
        keep = run.results is not None and succeeded
        self._pending.item_done(run.number, run.declared, run.done + 1, result, keep, run.results is not None)

    def _items_succeeded(self, run: ItemRun, results: list[Any], done: int, drawn: int) -> None:
        """``len(results)`` items of ``run`` succeeded, its ``done``-th the last; ``drawn`` of them add to the
        total (drawn past the declared one, or none was declared): :meth:`ItemRun.each`'s fold."""
        with self._lock:
            assert self._counts is not None
            self._counts[0] += drawn
            self._counts[1] += len(results)
            self._pending.items_done(run.number, run.declared, done, results)

    def _begin_items(self, declared: int | None) -> None:
        with self._lock:
            if self._counts is None:
                self._counts = [0, 0, 0]
            self._counts[0] += declared or 0

    def _count(self, slot: int, delta: int = 1) -> None:
        with self._lock:
            assert self._counts is not None
            self._counts[slot] += delta

    def _record_failure(self, item: str, code: int, message: str) -> None:
        """Count a failed item and keep its record (the caller holds the lock: :meth:`_item_ended`)."""
        assert self._counts is not None
        self._counts[2] += 1
        if code > 0 or self._error_code is None or self._error_code <= 0:
            self._error_code = code  # see error_code: a business code is never replaced by a service code
        if len(self._failures) < MAX_FAILURES:
            record = {"item": item, "code": code, "message": message}
            self._failures.append(record)
            self._pending.failures.append(record)

    # -- rate limits --------------------------------------------------------------------------------

    def limit(self, name: str, rate: float | None = None, per: float | None = None) -> None:
        """Take one token of rate limit ``name``, shared by every worker on every host, waiting for it if need be:
        ``rate`` tokens per ``per`` seconds, unless ``name`` is declared (``TASKPORT_RATE_LIMITS`` or
        ``rate_limit(name, rate, per)``), which wins. The wait is a cancellation point (a cancel or a stop ends it).
        A wait longer than ``TASKPORT_RATE_WAIT_MAX`` holds no worker: the task is put back with a run_at when the
        token is due, its checkpoint kept and no attempt used (:class:`~workers.exceptions.RateDeferred`)."""
        self.check_cancelled()
        if self.limiter is None:
            raise RuntimeError("ctx.limit needs the worker's rate limiter (a context built by the runner)")
        self.sleep(self.limiter.take(name, rate, per))
