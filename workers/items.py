"""The item runs of a processor: one ``ctx.each`` / ``ctx.items`` call, item by item.

An :class:`ItemRun` counts its items into the context's totals, records each item as succeeded or failed
(an :class:`ItemScope` around the item's work), keeps the results ``ctx.each`` returns, and, resumed from
an earlier run's checkpoint, skips the items that run did (:mod:`workers.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rq.timeouts import BaseTimeoutException

from app.core.states import ERROR_MESSAGES, ErrorCode
from workers.exceptions import ItemError, TaskCancelled, TaskError

if TYPE_CHECKING:
    from workers.context import TaskContext

# Never caught as an item failure: they end the whole task (a timeout must stay a timeout).
PROPAGATE: tuple[type[BaseException], ...] = (TaskCancelled, TaskError, BaseTimeoutException)
# ``ctx.each`` folds its successes into the context's counts, checkpoint and progress once FOLD_EVERY seconds
# have passed since the last fold (a clock read per item), at a failure, a cancel or a stop, and at the end:
# what the context (its heartbeat's flush, its progress writes, the checkpoint) does not know yet is at most
# the items of the last FOLD_EVERY seconds plus the one running, and an item that takes that long is folded
# alone, as every item was before. Per item, the fold's work (a lock, three counters, a progress call) cost
# ~20 times a no-op item; once per FOLD_EVERY it costs nothing (bench/README.md, "Per-item overhead"). With
# TASKPORT_PROGRESS_INTERVAL=0 (a write per item) every item is folded alone.
FOLD_EVERY = 0.01


class ItemRun:
    """Bookkeeping of one ``each``/``items`` call: its declared total, how far it got and (for ``each``) the
    results of the items that succeeded. Resumed from what an earlier run saved of it, if any."""

    def __init__(self, ctx: TaskContext, key: Callable[[Any], Any] | None, declared: int | None,
                 keeps_results: bool) -> None:
        self.ctx = ctx
        self.key = key
        self.declared = declared
        self.number = 0
        saved = ctx._begin_run(self)
        self.results: list[Any] | None = [] if keeps_results else None
        self.skip = 0
        if saved is None:
            self.done = 0
            ctx._begin_items(declared)  # a resumed run's items are in the restored counts already
        else:
            self.done = self.skip = saved.done
            if self.results is not None:
                self.results = list(saved.results or [])

    def walk(self, iterable: Iterable[Any]) -> Iterator[tuple[ItemScope, Any]]:
        """The ``(scope, item)`` pairs of :meth:`TaskContext.items`, past the items an earlier run did."""
        seen = 0
        for index, item in enumerate(iterable):
            seen += 1
            if index < self.skip:
                continue  # done by an earlier run: counted, and its result kept, then
            self.ctx.check_cancelled()
            scope = ItemScope(self, index, item)
            yield scope, item
            if not scope.finished:
                raise RuntimeError("ctx.items(): do each item's work inside `with scope:`")
        self.end(seen)

    def each(self, iterable: Iterable[Any], fn: Callable[[Any], Any]) -> list[Any]:
        """``ctx.each``: ``fn(item)`` for every item past those an earlier run did; the results of those that
        succeeded, in order. What :meth:`walk` does per item, but the successes are folded into the context
        every FOLD_EVERY seconds: a failure folds the successes before it first, so counts, results and the
        checkpoint keep the items' order, and every way out of the loop folds what it did."""
        assert self.results is not None  # an each run keeps its results
        ok: list[Any] = []  # the results not folded yet, of the items up to the seen-th drawn
        ctx = self.ctx
        clock, every = ctx._clock, min(FOLD_EVERY, ctx.interval)  # interval 0, a write per item: a fold per item
        fold_at = clock() + every
        seen = 0
        ctx.check_cancelled()  # as walk does before each item; after each, ctx.stopping says when to look
        try:
            for index, item in enumerate(iterable):
                if index < self.skip:
                    seen += 1
                    continue  # done by an earlier run: counted, and its result kept, then
                try:
                    ok.append(fn(item))
                except PROPAGATE:
                    raise
                except Exception as exc:
                    self._fold(ok, seen)
                    seen += 1
                    ctx.check_cancelled()
                    self.failed(index, item, exc)
                    continue
                seen += 1
                if ctx.stopping or clock() >= fold_at:  # a cancel or a stop is noticed after the item, as in walk
                    self._fold(ok, seen)
                    self._tell()
                    fold_at = clock() + every
        finally:
            tail = bool(ok)
            self._fold(ok, seen)  # what it did before an exception ended it (the runner saves the checkpoint)
        if tail:
            self._tell()
        self.end(seen)
        return self.results

    def _fold(self, ok: list[Any], seen: int) -> None:
        """Count the successes in ``ok`` (the items up to the ``seen``-th drawn), keep their results, put them in
        the checkpoint, and empty ``ok``."""
        if not ok:
            return
        assert self.results is not None
        # the ones drawn past the declared total (all of them when none was declared) are counted in it now
        drawn = len(ok) if self.declared is None else max(0, seen - max(self.declared, seen - len(ok)))
        self.ctx._items_succeeded(self, ok, self.done + len(ok), drawn)
        self.results.extend(ok)
        self.done += len(ok)
        ok.clear()

    def _drawn(self, index: int) -> int:
        """1 when item ``index`` adds to the total (it is past the declared total, or none was declared), else 0.
        Counted when the item ends, with its outcome: a write while it runs saves neither, so a resumed run that
        draws it again counts it once."""
        return int(self.declared is None or index >= self.declared)

    def end(self, seen: int) -> None:
        """The iterable ran out: a declared total that was too large shrinks to what was seen."""
        if self.declared is not None and seen < self.declared:
            self.ctx._count(0, seen - self.declared)

    def succeeded(self, index: int, result: Any) -> None:
        if self.results is not None:
            self.results.append(result)
        self.ctx._item_ended(self, result, self._drawn(index))
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
        self.ctx._item_ended(self, None, self._drawn(index), (ident, code, message))
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
        self._tell()

    def _tell(self) -> None:
        """How far the run got, to the context (a progress write when one is due); a cancellation point."""
        if self.declared:
            self.ctx.progress(self.done, self.declared, f"item {self.done} of {self.declared}")
        else:
            self.ctx.check_cancelled()
            self.ctx._update(None, f"item {self.done}")
            self.ctx.check_cancelled()


class ItemScope:
    """Context manager around one item's work (see :meth:`TaskContext.items`)."""

    __slots__ = ("_run", "index", "item", "finished", "result")

    def __init__(self, run: ItemRun, index: int, item: Any) -> None:
        self._run = run
        self.index = index
        self.item = item
        self.finished = False
        self.result: Any = None  # what ctx.each keeps of a succeeded item

    def __enter__(self) -> ItemScope:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        self.finished = True
        if exc is None:
            self._run.succeeded(self.index, self.result)
            return False
        if isinstance(exc, PROPAGATE) or not isinstance(exc, Exception):
            return False
        self._run.failed(self.index, self.item, exc)
        return True


def length(iterable: Iterable[Any]) -> int | None:
    try:
        return len(iterable)  # type: ignore[arg-type]
    except TypeError:
        return None
