"""A checkpoint write can land between any two steps of an item's bookkeeping: the heartbeat's thread calls
``ctx.flush()`` whenever it likes while the processor's thread is inside ``ctx.each`` / ``ctx.items``.

These tests make that interleaving deterministic: a trace hook stops the processor's thread at every line of
workers/items.py and has a second thread flush the context right there (when the lock is free, as the real
heartbeat would find it), so every write happens at every point a real one could. Every log the checkpoint
ever holds must read back (``Resume.parse``, as the next run reads it) with its counts matching its items, and
the last one with every result: issue 29 finding 4 saw a compaction at such a point drop an item's result
(119 results for 120 items, the counts saying 120).
"""

from __future__ import annotations

import itertools
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import workers.items
from app.core.results import LocalResultStore
from workers.checkpoint import COMPACT_EVERY, Resume, Saved
from workers.context import TaskContext
from workers.exceptions import ItemError, TaskInterrupted

N = 120  # more than two compactions' worth of lines (COMPACT_EVERY)


class Checked:
    """A ``report`` that keeps the log as the progress script does (APPEND, or SET for a line that replaces it)
    and checks, at every write, that the log as stored reads back consistent: what it finds wrong goes to
    ``wrong`` (an exception here would be a failed write, which the context logs and retries)."""

    def __init__(self) -> None:
        self.log = b""
        self.cursor: bytes | None = None
        self.replaced = 0
        self.wrong: list[str] = []

    def __call__(self, progress: int | None, message: str, items: dict | None, saved: Saved | None) -> str:
        if saved is not None and saved.line:
            self.replaced += saved.replace
            self.log = (b"" if saved.replace else self.log) + saved.line + b"\n"
            resume = Resume.parse(self.log, None)
            assert resume is not None and resume.counts is not None
            _, succeeded, failed = resume.counts
            if resume.items_done != succeeded + failed:
                self.wrong.append(f"counts {resume.counts}, items done {resume.items_done}")
            for run in resume.runs.values():
                if run.results is not None and len(run.results) != succeeded:  # the only each run of these tests
                    self.wrong.append(f"counts {resume.counts}, {len(run.results)} results")
        if saved is not None and saved.cursor is not None:
            self.cursor = saved.cursor
        return "PROCESSING"

    def resume(self) -> Resume:
        assert self.wrong == []
        resume = Resume.parse(self.log, self.cursor)
        assert resume is not None
        return resume


def flushing_at_every_line(context_of: Callable[[FrameType], TaskContext | None],
                           ) -> Callable[[FrameType, str, Any], Any]:
    """A trace function: at each line of workers/items.py, a second thread flushes the context
    ``context_of(frame)`` names, if any (and is waited for); tests/integration/test_checkpoint_compaction.py's
    too."""

    def flush(ctx: TaskContext) -> None:
        if ctx._lock.acquire(blocking=False):  # held: the real heartbeat would flush at its release, a later line
            try:
                ctx.flush()
            finally:
                ctx._lock.release()

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        ctx = context_of(frame) if event == "line" else None
        if ctx is not None:
            heartbeat = threading.Thread(target=flush, args=(ctx,))
            heartbeat.start()
            heartbeat.join()
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == workers.items.__file__ else None

    return calls


def traced(ctx: TaskContext, body: Callable[[], Any]) -> Any:
    sys.settrace(flushing_at_every_line(lambda frame: ctx))
    try:
        return body()
    finally:
        sys.settrace(None)


def context(report: Checked, tmp_path: Path, resume: Resume | None = None) -> TaskContext:
    # a clock a second on at each read and a write due every second: ctx.each folds after every item, and the
    # processor's own progress writes come between the heartbeat's
    return TaskContext(str(uuid.uuid4()), report, results=LocalResultStore(tmp_path), interval=1,
                       clock=itertools.count(0.0, 1.0).__next__, resume=resume)


def value(i: int) -> int:
    if i % 7 == 3:
        raise ItemError(10002, f"item {i} bad")
    return i * 10


EXPECTED = [i * 10 for i in range(N) if i % 7 != 3]
FAILED = sum(1 for i in range(N) if i % 7 == 3)


@pytest.mark.parametrize(("fn", "expected", "failed"), [(lambda i: i, list(range(N)), 0), (value, EXPECTED, FAILED)],
                         ids=["all-succeed", "some-fail"])
def test_a_write_at_any_point_of_an_each_keeps_every_result(tmp_path: Path, fn, expected, failed):
    report = Checked()
    ctx = context(report, tmp_path)
    assert traced(ctx, lambda: ctx.each(range(N), fn)) == expected
    ctx.flush()
    assert report.replaced >= 2  # the log was replaced (compacted) on the way, more than once
    resume = report.resume()
    assert resume.runs[0].done == N and resume.runs[0].results == expected  # finding 4: 119 results of 120
    assert resume.counts == [N, N - failed, failed]
    again = context(Checked(), tmp_path, resume)  # the next run hands back what the log saved
    assert again.each(range(N), lambda i: pytest.fail(f"item {i} was done")) == expected
    assert again.item_counts == {"total": N, "succeeded": N - failed, "failed": failed}


def test_an_each_interrupted_half_way_and_resumed_returns_every_result(tmp_path: Path):
    report = Checked()
    first = context(report, tmp_path)

    def stop_half_way(i: int) -> int:
        if i == N // 2:
            first.mark_interrupted()
        return value(i)

    with pytest.raises(TaskInterrupted):
        traced(first, lambda: first.each(range(N), stop_half_way))
    first.flush()  # what the runner does on the way out
    again = context(report, tmp_path, report.resume())  # the same task's log, as the store keeps it
    calls: list[int] = []

    def counted(i: int) -> int:
        calls.append(i)
        return value(i)

    assert traced(again, lambda: again.each(range(N), counted)) == EXPECTED
    assert calls == list(range(N // 2 + 1, N))  # none done twice, none skipped
    assert again.item_counts == {"total": N, "succeeded": N - FAILED, "failed": FAILED}
    again.flush()
    resume = report.resume()
    assert resume.runs[0].results == EXPECTED and resume.counts == [N, N - FAILED, FAILED]


def rows() -> Iterator[int]:
    yield from range(N)  # no len(): every item adds to the total when it is drawn


@pytest.mark.parametrize("iterable", [lambda: range(N), rows], ids=["declared", "undeclared"])
def test_a_write_at_any_point_of_an_items_run_saves_counts_that_match_its_items(tmp_path: Path, iterable):
    report = Checked()
    first = context(report, tmp_path)

    def walk(ctx: TaskContext, stop: int | None) -> None:
        for scope, row in ctx.items(iterable()):
            with scope:
                if row == stop:
                    ctx.mark_interrupted()
                if row % 7 == 3:
                    raise ItemError(10002, f"row {row} bad")

    with pytest.raises(TaskInterrupted):
        traced(first, lambda: walk(first, N // 2))
    first.flush()
    resume = report.resume()
    assert resume.counts is not None and resume.items_done == N // 2 + 1
    again = context(report, tmp_path, resume)
    traced(again, lambda: walk(again, None))
    assert again.item_counts == {"total": N, "succeeded": N - FAILED, "failed": FAILED}
    again.flush()
    assert report.resume().counts == [N, N - FAILED, FAILED]


def test_compaction_happens_in_these_tests():
    assert N > 2 * COMPACT_EVERY
