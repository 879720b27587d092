"""TaskContext: throttled monotonic progress, per-item bookkeeping, cancellation checkpoints."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rq.timeouts import JobTimeoutException

from app.core.results import LocalResultStore
from tests.unit.recorder import Recorder
from workers import context as context_module
from workers.context import MAX_FAILURES, SLEEP_SLICE, TaskContext
from workers.exceptions import ItemError, TaskCancelled, TaskError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ctx(report: Recorder, clock: Clock, tmp_path: Path) -> TaskContext:
    """A context one interval into its task: the next progress call writes at once."""
    context = TaskContext(
        str(uuid.uuid4()), report, results=LocalResultStore(tmp_path), interval=0.5, clock=clock
    )
    clock.now += 0.5
    return context


def unthrottled(report: Recorder, tmp_path: Path, **kwargs: Any) -> TaskContext:
    return TaskContext(str(uuid.uuid4()), report, results=LocalResultStore(tmp_path), interval=0, **kwargs)


class TestProgress:
    def test_first_call_reports_at_once_then_throttles(
        self, ctx: TaskContext, report: Recorder, clock: Clock
    ):
        ctx.progress(10, 100, "a")
        assert report.calls == [(10, "a", None)]
        clock.now += 0.2
        ctx.progress(20, 100, "b")
        ctx.progress(30, 100)
        assert len(report.calls) == 1
        clock.now += 0.3
        ctx.progress(40, 100)
        assert report.calls[1:] == [(40, "b", None)]

    def test_flush_writes_latest_pending_values_once(self, ctx: TaskContext, report: Recorder, clock: Clock):
        ctx.progress(5, message="start")
        ctx.progress(7, message="later")
        ctx.flush()
        assert report.calls == [(5, "start", None), (7, "later", None)]
        ctx.flush()
        assert len(report.calls) == 2

    def test_flush_without_any_progress_writes_nothing(self, ctx: TaskContext, report: Recorder):
        ctx.flush()  # the start transition already wrote progress 0 and no message
        assert report.calls == []

    def test_a_task_shorter_than_one_interval_writes_no_progress(
        self, report: Recorder, clock: Clock, tmp_path: Path
    ):
        short = TaskContext(str(uuid.uuid4()), report, results=LocalResultStore(tmp_path), interval=0.5, clock=clock)
        short.progress(1, 1, "done")
        clock.now += 0.4
        short.progress(1, 1, "done")
        assert report.calls == []
        clock.now += 0.1
        short.progress(1, 1, "done")
        assert report.calls == [(99, "done", None)]

    def test_monotonic(self, ctx: TaskContext, report: Recorder, clock: Clock):
        ctx.progress(50)
        clock.now += 1
        ctx.progress(30, message="back")
        assert report.last == (50, "back", None)

    @pytest.mark.parametrize(
        ("done", "total", "expected"),
        [
            (100, None, 99),
            (150, 100, 99),
            (-5, None, 0),
            (1, 3, 33),
            (45, 100, 45),
            (2, 0, 2),
            (99.9, None, 99),
        ],
    )
    def test_percent_and_clamp(
        self, ctx: TaskContext, report: Recorder, done: float, total: Any, expected: int
    ):
        ctx.progress(done, total)
        assert report.last[0] == expected

    def test_non_finite_progress_is_ignored(self, ctx: TaskContext, report: Recorder):
        ctx.progress(float("nan"), message="x")
        assert report.last == (0, "x", None)

    def test_status_other_than_processing_cancels(self, ctx: TaskContext, report: Recorder):
        report.status = "CANCELLED"
        with pytest.raises(TaskCancelled):
            ctx.progress(10)
        assert ctx.cancelled

    def test_flush_marks_but_does_not_raise(self, ctx: TaskContext, report: Recorder):
        report.status = "EXPIRED"
        ctx._update(5, "pending")  # noqa: SLF001 - a value waiting for the next write
        ctx.flush()
        assert ctx.cancelled
        with pytest.raises(TaskCancelled):
            ctx.check_cancelled()

    def test_failed_write_is_logged_and_retried(
        self, ctx: TaskContext, report: Recorder, caplog: pytest.LogCaptureFixture
    ):
        report.error = ConnectionError("redis down")
        with caplog.at_level(logging.WARNING):
            ctx.progress(10)
        assert "progress write failed" in caplog.text
        report.error = None
        ctx.flush()
        assert report.calls == [(10, "", None)]

    def test_timeout_during_write_propagates(self, ctx: TaskContext, report: Recorder):
        report.error = JobTimeoutException("timed out")
        with pytest.raises(JobTimeoutException):
            ctx.progress(10)


class TestCancellation:
    def test_mark_cancelled_from_another_thread(self, ctx: TaskContext):
        assert not ctx.cancelled
        ctx.check_cancelled()
        thread = threading.Thread(target=ctx.mark_cancelled)
        thread.start()
        thread.join()
        assert ctx.cancelled
        with pytest.raises(TaskCancelled):
            ctx.check_cancelled()
        with pytest.raises(TaskCancelled):
            ctx.progress(1)

    def test_each_stops_at_next_item(self, ctx: TaskContext):
        seen: list[int] = []

        def work(item: int) -> int:
            seen.append(item)
            if item == 2:
                ctx.mark_cancelled()
            return item

        with pytest.raises(TaskCancelled):
            ctx.each(range(10), work)
        assert seen == [0, 1, 2]

    def test_sleep_is_sliced_and_cancellable(self, report: Recorder, tmp_path: Path):
        slices: list[float] = []
        ctx = unthrottled(report, tmp_path, sleep=slices.append)
        ctx.sleep(0.35)
        assert slices == pytest.approx([0.1, 0.1, 0.1, 0.05])
        assert max(slices) <= SLEEP_SLICE

        def sleep(seconds: float) -> None:
            slices.append(seconds)
            if len(slices) == 7:
                ctx.mark_cancelled()

        ctx._sleep = sleep
        with pytest.raises(TaskCancelled):
            ctx.sleep(3600)
        assert len(slices) == 7


def failing_work(item: int) -> int:
    if item % 3 == 1:
        raise ItemError(10002, f"bad {item}")
    if item == 5:
        raise ValueError("boom")
    return item * 10


class TestEach:
    def test_records_failures_and_counts(
        self, report: Recorder, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ):
        ctx = unthrottled(report, tmp_path)
        assert ctx.item_counts is None
        with caplog.at_level(logging.ERROR):
            results = ctx.each(range(7), failing_work, key=lambda i: f"k{i}")
        assert results == [0, 20, 30, 60]
        assert ctx.item_counts == {"total": 7, "succeeded": 4, "failed": 3}
        assert ctx.failures == [
            {"item": "k1", "code": 10002, "message": "bad 1"},
            {"item": "k4", "code": 10002, "message": "bad 4"},
            {"item": "k5", "code": -1, "message": "processing error, please retry later"},
        ]
        assert ctx.error_code == 10002  # the later -1 does not hide the business code
        assert "boom" not in str(ctx.failures)
        assert ctx.task_id in caplog.text and "ValueError: boom" in caplog.text
        assert report.last == (99, "item 7 of 7", {"total": 7, "succeeded": 4, "failed": 3})
        assert [call[1] for call in report.calls[:2]] == ["item 1 of 7", "item 2 of 7"]

    @pytest.mark.parametrize(("codes", "expected"), [
        ([], None),                         # nothing failed
        ([-1], -1),                         # only unexpected errors: the service's code
        ([-1, -1], -1),
        ([10001, -1], 10001),               # seed 002: an unexpected error after a 10001 keeps 10001
        ([-1, 10001], 10001),
        ([10001, 10002], 10002),            # several business codes: the last one recorded
        ([10002, -1, 10001, -1], 10001),
    ])
    def test_error_code_is_the_last_business_code(self, ctx: TaskContext, codes: list[int], expected: int | None):
        def work(index: int) -> None:
            code = codes[index]
            if code > 0:
                raise ItemError(code, "business")
            raise RuntimeError("unexpected")

        ctx.each(range(len(codes)), work)
        assert [f["code"] for f in ctx.failures] == codes
        assert ctx.error_code == expected

    def test_key_defaults_to_index_and_calls_accumulate(self, ctx: TaskContext):
        def work(item: str) -> str:
            if item == "y":
                raise ItemError(7, "no")
            return item

        assert ctx.each(["a", "b"], work) == ["a", "b"]
        assert ctx.each(["x", "y"], work) == ["x"]
        assert ctx.failures == [{"item": "1", "code": 7, "message": "no"}]
        assert ctx.item_counts == {"total": 4, "succeeded": 3, "failed": 1}

    def test_broken_key_falls_back_to_index(self, ctx: TaskContext):
        ctx.each([1], lambda item: failing_work(1), key=lambda item: 1 / 0)
        assert ctx.failures[0]["item"] == "0"

    @pytest.mark.parametrize("exc", [TaskError(10001, "stop"), TaskCancelled(), JobTimeoutException("t")])
    def test_task_level_exceptions_propagate(self, ctx: TaskContext, exc: Exception):
        def work(item: int) -> int:
            if item == 1:
                raise exc
            return item

        with pytest.raises(type(exc)):
            ctx.each(range(3), work)
        assert ctx.item_counts == {"total": 3, "succeeded": 1, "failed": 0}
        assert ctx.failures == []

    def test_failure_list_is_capped_counts_exact(self, ctx: TaskContext, monkeypatch: pytest.MonkeyPatch):
        assert MAX_FAILURES >= 100
        monkeypatch.setattr(context_module, "MAX_FAILURES", 5)

        def fail(item: int) -> None:
            raise ItemError(10000 + item, "no")

        ctx.each(range(12), fail)
        assert len(ctx.failures) == 5
        assert ctx.item_counts == {"total": 12, "succeeded": 0, "failed": 12}
        assert ctx.error_code == 10011

    def test_empty_batch_has_zero_counts(self, ctx: TaskContext):
        assert ctx.each([], failing_work) == []
        assert ctx.item_counts == {"total": 0, "succeeded": 0, "failed": 0}

    def test_explicit_total_for_generators(self, report: Recorder, tmp_path: Path):
        ctx = unthrottled(report, tmp_path)
        ctx.each((i for i in range(4)), failing_work, total=4)
        assert report.calls[1] == (50, "item 2 of 4", {"total": 4, "succeeded": 1, "failed": 1})

    def test_unknown_total_counts_as_it_goes(self, report: Recorder, tmp_path: Path):
        ctx = unthrottled(report, tmp_path)
        ctx.each((i for i in range(3)), failing_work)
        assert [c[1:] for c in report.calls] == [
            ("item 1", {"total": 1, "succeeded": 1, "failed": 0}),
            ("item 2", {"total": 2, "succeeded": 1, "failed": 1}),
            ("item 3", {"total": 3, "succeeded": 2, "failed": 1}),
        ]
        assert report.last[0] == 0

    def test_overstated_total_shrinks_to_what_was_seen(self, ctx: TaskContext):
        ctx.each(iter([1, 2]), lambda item: item, total=10)
        assert ctx.item_counts == {"total": 2, "succeeded": 2, "failed": 0}

    def test_understated_total_grows(self, ctx: TaskContext):
        ctx.each([1, 2, 3], lambda item: item, total=1)
        assert ctx.item_counts == {"total": 3, "succeeded": 3, "failed": 0}


class TestItems:
    def test_scopes_catch_item_errors(self, ctx: TaskContext):
        done: list[int] = []
        for scope, item in ctx.items(range(7), key=lambda i: f"row{i}"):
            with scope:
                done.append(failing_work(item))
        assert done == [0, 20, 30, 60]
        assert ctx.item_counts == {"total": 7, "succeeded": 4, "failed": 3}
        assert [f["item"] for f in ctx.failures] == ["row1", "row4", "row5"]

    def test_task_error_leaves_the_loop(self, ctx: TaskContext):
        with pytest.raises(TaskError) as caught:
            for scope, item in ctx.items([1, 2]):
                with scope:
                    raise TaskError(10001, f"stop at {item}")
        assert caught.value.code == 10001 and caught.value.message == "stop at 1"

    def test_unused_scope_is_an_error(self, ctx: TaskContext):
        with pytest.raises(RuntimeError, match="with scope"):
            for _scope, _item in ctx.items([1, 2]):
                pass

    def test_break_is_allowed(self, ctx: TaskContext):
        gen: Iterator[Any] = ctx.items([1, 2, 3])
        for scope, _item in gen:
            with scope:
                pass
            break
        assert ctx.item_counts == {"total": 3, "succeeded": 1, "failed": 0}


def test_exceptions_keep_code_and_message_and_pickle():
    import pickle

    err = pickle.loads(pickle.dumps(TaskError(10001, "bill unpaid")))
    assert (err.code, err.message, str(err)) == (10001, "bill unpaid", "[10001] bill unpaid")
    item = pickle.loads(pickle.dumps(ItemError(10002, "qty")))
    assert (item.code, item.message) == (10002, "qty")
