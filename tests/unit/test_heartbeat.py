"""workers.heartbeat's beat thread: one per process for all its runs, beating each run on its interval."""

from __future__ import annotations

import _thread
import threading
from typing import Any

import pytest

from tests.integration.harness import wait_until
from workers import heartbeat
from workers.heartbeat import Heartbeat


class Store:
    """What a run's beats use of a TaskStore: ``report`` (answers the task's status)."""

    def __init__(self, status: str = "PROCESSING") -> None:
        self.status = status
        self.reports: list[tuple[str, str]] = []

    def report(self, task_id: str, run_id: str, progress: Any) -> str:
        self.reports.append((task_id, run_id))
        return self.status


class Ctx:
    def __init__(self) -> None:
        self.flushes = 0
        self.cancelled = False

    def flush(self) -> None:
        self.flushes += 1

    def mark_cancelled(self) -> None:
        self.cancelled = True


def beat(store: Store, run: str, interval: float) -> Heartbeat:
    return Heartbeat(store, "t1", run, Ctx(), interval)  # type: ignore[arg-type]


def test_runs_start_no_thread_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread per run was the largest cost of a no-op delivery: many runs, at most one thread started."""
    started: list[object] = []
    real_thread, real_start = _thread.start_new_thread, threading.Thread.start

    def new_thread(*args: Any) -> Any:
        started.append(args)
        return real_thread(*args)

    def start(self: threading.Thread) -> None:
        started.append(self)
        real_start(self)

    monkeypatch.setattr(_thread, "start_new_thread", new_thread)
    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(heartbeat, "_the_beater", None)
    store = Store()
    for i in range(5):
        with beat(store, f"r{i}", 30.0):
            pass
    assert len(started) == 1
    assert store.reports == []  # none of them ran for its interval


def test_each_run_is_beaten_on_its_interval_and_not_after_it_ends() -> None:
    store = Store()
    with beat(store, "long", 60.0):
        pass  # the thread now sleeps for up to 60 s with no run: a shorter run's interval wakes it
    with beat(store, "short", 0.05):
        wait_until(lambda: store.reports.count(("t1", "short")) >= 2, timeout=5, message="two beats of the run")
    after = len(store.reports)
    second = beat(store, "next", 0.05)
    with second:
        wait_until(lambda: ("t1", "next") in store.reports, timeout=5, message="the next run's beat")
    assert ("t1", "long") not in store.reports
    assert store.reports[after:].count(("t1", "short")) <= 1  # at most a beat that was under way as it ended


def test_a_run_no_longer_the_tasks_is_abandoned_and_beaten_no_more(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heartbeat, "CANCEL_GRACE", 5.0)
    store = Store(status="CANCELED")
    run = beat(store, "gone", 0.05)
    with run:
        wait_until(lambda: run._ctx.cancelled, timeout=5, message="the run abandoned")  # type: ignore[attr-defined]
        beats = len(store.reports)
        other = Store()
        with beat(other, "other", 0.05):  # the thread goes on for the process's next run
            wait_until(lambda: other.reports, timeout=5, message="the next run beaten")
    assert len(store.reports) == beats == 1


def test_a_run_due_before_the_thread_wakes_is_beaten_on_time() -> None:
    store = Store()
    with beat(store, "short", 0.05):
        wait_until(lambda: ("t1", "short") in store.reports, timeout=5, message="the short run's beat")
    with beat(store, "long", 60.0) as long:  # the thread comes to sleep until this run's first beat, 60 s on
        wait_until(lambda: heartbeat._beater()._until >= long._due, timeout=5, message="the thread asleep")
    with beat(store, "next", 0.05):
        wait_until(lambda: ("t1", "next") in store.reports, timeout=5, message="the next run's beat, on time")


def test_a_runs_end_is_seen_by_every_thread_waiting_for_it_and_by_later_waits() -> None:
    from workers.heartbeat import _Ended

    ended = _Ended()
    assert ended.wait(0.01) is False  # not ended: the wait runs out
    seen: list[bool] = []
    waiters = [threading.Thread(target=lambda: seen.append(ended.wait(30))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    ended.set()
    ended.set()  # a second end changes nothing
    for waiter in waiters:
        waiter.join(30)
    assert seen == [True, True, True]
    assert ended.wait(0) is True
