"""The context handed to a processor: progress, per-item bookkeeping and cancellation checkpoints.

The runner builds one :class:`TaskContext` per task run and passes it a ``report`` callable that
writes ``(progress, message, items)`` to Redis and answers the task's current status. The context
keeps that traffic small (writes are throttled to one per ``interval`` seconds, the latest values
are always remembered and :meth:`TaskContext.flush` pushes them) and turns any answer other than
``PROCESSING`` into a cancellation that the next checkpoint raises as :class:`TaskCancelled`.

Thread model: the processor runs in one thread; the runner's heartbeat thread may call
:meth:`TaskContext.mark_cancelled` and :meth:`TaskContext.flush` at any time. A lock serialises
reports and the counters they read.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rq.timeouts import BaseTimeoutException

from app.core.states import ERROR_MESSAGES, ErrorCode, TaskStatus
from workers.exceptions import ItemError, TaskCancelled, TaskError

if TYPE_CHECKING:
    from app.core.results import ResultStore

# At most this many failure records are kept per task (the counts stay exact), so a batch where
# every item fails cannot blow up the result stored in Redis.
MAX_FAILURES = 1000
# Longest single sleep inside TaskContext.sleep: a cancellation is noticed within this much time.
SLEEP_SLICE = 0.1
# Never caught as an item failure: they end the whole task (a timeout must stay a timeout).
PROPAGATE: tuple[type[BaseException], ...] = (TaskCancelled, TaskError, BaseTimeoutException)

Report = Callable[[int | None, str, dict | None], str]
_Snapshot = tuple[int, str, tuple[int, int, int] | None]

log = logging.getLogger(__name__)


class TaskContext:
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
    ) -> None:
        self.task_id = task_id
        self.results = results
        self.log = logger if logger is not None else log
        self._report_fn = report
        self._interval = interval
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.RLock()
        self._cancelled = threading.Event()
        self._progress = 0
        self._message = ""
        self._counts: list[int] | None = None  # [total, succeeded, failed] once items are processed
        self._failures: list[dict[str, Any]] = []
        self._error_code: int | None = None
        # The start transition wrote progress 0 and an empty message: that is the first write, so a
        # task that ends within one interval writes no progress at all (its completion says it all).
        self._reported: _Snapshot | None = (0, "", None)
        self._reported_at: float | None = clock()

    # -- cancellation ---------------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """True once the task is known to be no longer ours."""
        return self._cancelled.is_set()

    def mark_cancelled(self) -> None:
        """Note that the task is no longer ours; the next checkpoint raises. Thread-safe."""
        self._cancelled.set()

    def check_cancelled(self) -> None:
        """Checkpoint: raise :class:`TaskCancelled` if the task is no longer ours."""
        if self._cancelled.is_set():
            raise TaskCancelled(self.task_id)

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
        """Write the latest values now if they differ from the last written ones. Never raises
        TaskCancelled (it only marks the context); safe to call from any thread at any time."""
        with self._lock:
            if self._snapshot() != self._reported:
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
        try:
            status = self._report_fn(snapshot[0], snapshot[1], self.item_counts)
        except PROPAGATE:
            raise
        except Exception:
            self.log.warning("task %s: progress write failed", self.task_id, exc_info=True)
            return
        self._reported = snapshot
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
        results: list[Any] = []
        for scope, item in self.items(items, key=key, total=total):
            with scope:
                results.append(fn(item))
        return results

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
        declared = total if total is not None else _length(iterable)
        run = _ItemRun(self, key, declared)
        seen = 0
        for index, item in enumerate(iterable):
            self.check_cancelled()
            seen += 1
            run.start(seen)
            scope = ItemScope(run, index, item)
            yield scope, item
            if not scope.finished:
                raise RuntimeError("ctx.items(): do each item's work inside `with scope:`")
        run.end(seen)

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
        with self._lock:
            assert self._counts is not None
            self._counts[2] += 1
            if code > 0 or self._error_code is None or self._error_code <= 0:
                self._error_code = code  # see error_code: a business code is never replaced by a service code
            if len(self._failures) < MAX_FAILURES:
                self._failures.append({"item": item, "code": code, "message": message})


class _ItemRun:
    """Bookkeeping of one ``each``/``items`` call: its declared total and how far it got."""

    def __init__(self, ctx: TaskContext, key: Callable[[Any], Any] | None, declared: int | None) -> None:
        self.ctx = ctx
        self.key = key
        self.declared = declared
        self.done = 0
        ctx._begin_items(declared)

    def start(self, seen: int) -> None:
        """An item was drawn: count it in the total unless the declared total already did."""
        if self.declared is None or seen > self.declared:
            self.ctx._count(0)

    def end(self, seen: int) -> None:
        """The iterable ran out: a declared total that was too large shrinks to what was seen."""
        if self.declared is not None and seen < self.declared:
            self.ctx._count(0, seen - self.declared)

    def succeeded(self) -> None:
        self.ctx._count(1)
        self._advance()

    def failed(self, index: int, item: Any, exc: BaseException) -> None:
        ident = self._ident(index, item)
        if isinstance(exc, ItemError):
            code, message = exc.code, exc.message
        else:
            code, message = ErrorCode.INTERNAL, ERROR_MESSAGES[ErrorCode.INTERNAL]
            self.ctx.log.error(
                "task %s: item %s failed",
                self.ctx.task_id,
                ident,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
        self.ctx._record_failure(ident, code, message)
        self._advance()

    def _ident(self, index: int, item: Any) -> str:
        if self.key is None:
            return str(index)
        try:
            return str(self.key(item))
        except Exception:  # a broken key function must not hide the item's own failure
            return str(index)

    def _advance(self) -> None:
        self.done += 1
        if self.declared:
            self.ctx.progress(self.done, self.declared, f"item {self.done} of {self.declared}")
        else:
            self.ctx.check_cancelled()
            self.ctx._update(None, f"item {self.done}")
            self.ctx.check_cancelled()


class ItemScope:
    """Context manager around one item's work (see :meth:`TaskContext.items`)."""

    __slots__ = ("_run", "index", "item", "finished")

    def __init__(self, run: _ItemRun, index: int, item: Any) -> None:
        self._run = run
        self.index = index
        self.item = item
        self.finished = False

    def __enter__(self) -> ItemScope:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        self.finished = True
        if exc is None:
            self._run.succeeded()
            return False
        if isinstance(exc, PROPAGATE) or not isinstance(exc, Exception):
            return False
        self._run.failed(self.index, self.item, exc)
        return True


def _length(iterable: Iterable[Any]) -> int | None:
    try:
        return len(iterable)  # type: ignore[arg-type]
    except TypeError:
        return None
