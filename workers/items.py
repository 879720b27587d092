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
            self.start(seen)
            scope = ItemScope(self, index, item)
            yield scope, item
            if not scope.finished:
                raise RuntimeError("ctx.items(): do each item's work inside `with scope:`")
        self.end(seen)

    def start(self, seen: int) -> None:
        """An item was drawn: count it in the total unless the declared total already did."""
        if self.declared is None or seen > self.declared:
            self.ctx._count(0)

    def end(self, seen: int) -> None:
        """The iterable ran out: a declared total that was too large shrinks to what was seen."""
        if self.declared is not None and seen < self.declared:
            self.ctx._count(0, seen - self.declared)

    def succeeded(self, result: Any) -> None:
        self.ctx._count(1)
        if self.results is not None:
            self.results.append(result)
        self.ctx._item_done(self, result, True)
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
        self.ctx._item_done(self, None, False)
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
            self._run.succeeded(self.result)
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
