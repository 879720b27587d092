"""Durable checkpoints in the context: what a run saves with its progress, and a run that resumes from it."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.core.results import LocalResultStore
from tests.unit.recorder import Recorder
from workers.checkpoint import COMPACT_EVERY, Resume, Saved
from workers.context import TaskContext
from workers.exceptions import ItemError, TaskCancelled, TaskError, TaskInterrupted


def stored(report: Recorder) -> tuple[bytes, bytes | None]:
    """The checkpoint as the progress script would hold it after ``report``'s writes."""
    saved = [s for s in report.saved if isinstance(s, Saved)]
    log = b""
    for s in saved:
        if s.line:
            log = (b"" if s.replace else log) + s.line + b"\n"  # SET or APPEND, as the progress script does
    cursors = [s.cursor for s in saved if s.cursor is not None]
    return log, cursors[-1] if cursors else None


def context(report: Recorder, tmp_path: Path, resume: Resume | None = None) -> TaskContext:
    return TaskContext(str(uuid.uuid4()), report, results=LocalResultStore(tmp_path), interval=0, resume=resume)


def interrupted_at(stop: int, calls: list[int], ctx: TaskContext, fail: frozenset[int] = frozenset()):
    def fn(index: int) -> int:
        calls.append(index)
        if index == stop:
            ctx.mark_interrupted()
        if index in fail:
            raise ItemError(10002, f"item {index} bad")
        return index * 10
    return fn


def test_an_interrupted_each_resumes_after_the_items_done(tmp_path: Path):
    report = Recorder()
    first = context(report, tmp_path)
    calls: list[int] = []
    with pytest.raises(TaskInterrupted):
        first.each(range(10), interrupted_at(3, calls, first, frozenset({1})))
    first.flush()
    assert calls == [0, 1, 2, 3]  # the item running when the stop came finished and was saved
    resume = Resume.parse(*stored(report))
    assert resume is not None and resume.items_done == 4

    again = context(Recorder(), tmp_path, resume)
    calls.clear()
    results = again.each(range(10), interrupted_at(-1, calls, again, frozenset({1})))
    assert calls == [4, 5, 6, 7, 8, 9]  # none done twice
    assert results == [0, 20, 30, 40, 50, 60, 70, 80, 90]  # item 1 failed; the earlier results came back
    assert again.item_counts == {"total": 10, "succeeded": 9, "failed": 1}
    assert again.failures == [{"item": "1", "code": 10002, "message": "item 1 bad"}]
    assert again.error_code == 10002


def test_items_resume_too_and_later_runs_are_new(tmp_path: Path):
    report = Recorder()
    first = context(report, tmp_path)
    first.each(range(3), lambda i: None)
    with pytest.raises(TaskInterrupted):
        for scope, row in first.items(range(5)):
            with scope:
                if row == 1:
                    first.mark_interrupted()
    first.flush()  # what the runner does on the way out
    resume = Resume.parse(*stored(report))
    again = context(Recorder(), tmp_path, resume)
    assert again.each(range(3), lambda i: pytest.fail("run 0 was done")) == [None, None, None]
    seen = []
    for scope, row in again.items(range(5)):
        with scope:
            seen.append(row)
    assert seen == [2, 3, 4]
    assert again.each(range(2), lambda i: i) == [0, 1]  # a third run no earlier run reached
    assert again.item_counts == {"total": 10, "succeeded": 10, "failed": 0}


def test_the_cursor_is_saved_with_the_progress_and_read_back(tmp_path: Path):
    report = Recorder()
    first = context(report, tmp_path)
    assert first.cursor is None
    first.save_cursor({"offset": 1024})
    first.mark_interrupted()
    with pytest.raises(TaskInterrupted):
        first.save_cursor({"offset": 2048})  # saved, then the stopping point
    assert report.saved == []  # a cursor goes with the next write: the runner's flush on the way out
    first.flush()
    log, cursor = stored(report)
    assert cursor == b'{"offset":2048}'
    again = context(Recorder(), tmp_path, Resume.parse(log, cursor))
    assert again.cursor == {"offset": 2048}


def test_a_cancel_wins_over_a_stop(tmp_path: Path):
    ctx = context(Recorder(), tmp_path)
    ctx.mark_interrupted()
    ctx.mark_cancelled()
    with pytest.raises(TaskCancelled) as caught:
        ctx.check_cancelled()
    assert type(caught.value) is TaskCancelled


def test_a_failed_write_keeps_the_checkpoint_for_the_next(tmp_path: Path):
    report = Recorder()
    ctx = context(report, tmp_path)
    report.error = ConnectionError("down")
    ctx.each(range(2), lambda i: i)
    report.error = None
    ctx.flush()
    resume = Resume.parse(*stored(report))
    assert resume is not None and resume.runs[0].done == 2 and resume.runs[0].results == [0, 1]


def test_null_results_cost_a_count_not_a_list(tmp_path: Path):
    report = Recorder()
    ctx = TaskContext(str(uuid.uuid4()), report, results=LocalResultStore(tmp_path), interval=3600)
    ctx.each(range(10_000), lambda i: None)
    ctx.flush()
    log, _ = stored(report)
    assert len(log) < 100, log  # one line: the counts and "10000 nulls", not 10,000 of them
    resume = Resume.parse(log, None)
    assert resume is not None and resume.runs[0].results == [None] * 10_000


def test_no_checkpoint_is_none():
    assert Resume.parse(None, None) is None
    assert Resume.parse(b"", None) is None


def test_results_of_an_each_are_kept_in_item_order(tmp_path: Path):
    report = Recorder()
    ctx = context(report, tmp_path)
    values: list[Any] = [{"a": 1}, None, [2]]
    assert ctx.each(values, lambda v: v) == values
    resume = Resume.parse(*stored(report))
    assert resume is not None and resume.runs[0].results == values


def test_the_log_is_replaced_by_one_line_every_so_often_so_its_size_is_bounded(tmp_path: Path):
    report = Recorder()
    # a clock a second on at each read: every item seems to take one, so each is folded and written alone
    ctx = TaskContext(str(uuid.uuid4()), report, results=LocalResultStore(tmp_path), interval=0,
                      clock=itertools.count(0.0, 1.0).__next__)
    ctx.each(range(3), lambda i: i)  # an earlier run, then one that goes on for many writes
    ctx.each(range(COMPACT_EVERY * 3), lambda i: None)
    log, _ = stored(report)
    assert 1 <= log.count(b"\n") <= COMPACT_EVERY
    assert any(s.replace for s in report.saved if isinstance(s, Saved))
    resume = Resume.parse(log, None)
    assert resume is not None and resume.runs[0].results == [0, 1, 2]
    assert resume.runs[1].done == COMPACT_EVERY * 3 and resume.runs[1].results == [None] * (COMPACT_EVERY * 3)
    assert resume.counts == [3 + COMPACT_EVERY * 3, 3 + COMPACT_EVERY * 3, 0]


BIG = 5000  # items: enough for many folds, were every item folded alone


def frozen_clock() -> float:
    return 0.0  # no time passes: ctx.each folds only at a failure, a cancel or stop, an exception, the end


def test_items_folded_between_writes_are_counted_kept_and_saved_exactly(tmp_path: Path):
    report = Recorder()
    ctx = TaskContext(str(uuid.uuid4()), report, results=LocalResultStore(tmp_path), interval=1, clock=frozen_clock)
    n = BIG

    def fn(i: int) -> int:
        if i % 100 == 99:
            raise ItemError(10002, f"item {i} bad")
        return i

    results = ctx.each(range(n), fn)
    ctx.flush()
    assert results == [i for i in range(n) if i % 100 != 99]
    assert ctx.item_counts == {"total": n, "succeeded": n - n // 100, "failed": n // 100}
    resume = Resume.parse(*stored(report))
    assert resume is not None and resume.runs[0].done == n and resume.runs[0].results == results


def test_what_was_not_folded_yet_when_a_task_level_exception_ends_the_loop_is_counted_and_saved(tmp_path: Path):
    report = Recorder()
    ctx = TaskContext(str(uuid.uuid4()), report, results=LocalResultStore(tmp_path), interval=1, clock=frozen_clock)
    stop = BIG // 2  # between two folds

    def fn(i: int) -> int:
        if i == stop:
            raise TaskError(10001, "upstream gone")
        return i

    with pytest.raises(TaskError):
        ctx.each(range(BIG), fn)
    ctx.flush()
    assert ctx.item_counts == {"total": BIG, "succeeded": stop, "failed": 0}
    resume = Resume.parse(*stored(report))
    assert resume is not None and resume.runs[0].done == stop and resume.runs[0].results == list(range(stop))


@pytest.mark.parametrize("mark", ["mark_cancelled", "mark_interrupted"])
def test_a_cancel_or_stop_between_two_folds_is_noticed_after_that_item(tmp_path: Path, mark: str):
    ctx = TaskContext(str(uuid.uuid4()), Recorder(), results=LocalResultStore(tmp_path), interval=1,
                      clock=frozen_clock)
    calls: list[int] = []

    def fn(i: int) -> int:
        calls.append(i)
        if i == BIG // 2:
            getattr(ctx, mark)()
        return i

    with pytest.raises((TaskCancelled, TaskInterrupted)):
        ctx.each(range(BIG), fn)
    assert calls == list(range(BIG // 2 + 1))
