"""app.core.connection.Slots: the idle connections of a LeanPool, taken and returned with no lock while one is free."""

from __future__ import annotations

import threading
from queue import Empty, Full

import pytest

from app.core.connection import LeanPool, Slots
from tests.integration.harness import wait_until


def test_the_pool_keeps_its_idle_connections_in_slots() -> None:
    pool = LeanPool.from_url("redis://127.0.0.1:1/0", max_connections=3, timeout=0.1)
    assert isinstance(pool.pool, Slots)
    assert pool.pool.queue == [None, None, None]  # filled until Full, as redis-py fills its LifoQueue


def test_the_last_returned_is_taken_first_and_the_bound_holds() -> None:
    slots = Slots(2)
    slots.put_nowait("a")
    slots.put_nowait("b")
    with pytest.raises(Full):
        slots.put_nowait("c")
    assert slots.get(timeout=0.1) == "b"
    assert slots.get(timeout=0.1) == "a"
    with pytest.raises(Empty):
        slots.get(timeout=0.05)
    with pytest.raises(Empty):
        slots.get(block=False)


def test_a_free_slot_is_taken_and_returned_without_the_condition() -> None:
    slots = Slots(1)
    slots.put_nowait("conn")
    with slots._returned:  # held elsewhere: a take and a return that need no wait must not need it
        done = threading.Event()

        def take_and_return() -> None:
            slots.put_nowait(slots.get(timeout=1))
            done.set()

        threading.Thread(target=take_and_return, daemon=True).start()
        assert done.wait(2)


def test_a_waiting_take_is_woken_by_a_return() -> None:
    slots = Slots(1)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(slots.get(timeout=10)), daemon=True)
    waiter.start()
    wait_until(lambda: slots._waiters == 1, timeout=5)
    slots.put_nowait("conn")
    waiter.join(5)
    assert got == ["conn"]
    assert slots._waiters == 0


def test_many_threads_share_few_slots_and_lose_none() -> None:
    slots = Slots(2)
    slots.put_nowait("a")
    slots.put_nowait("b")
    failures: list[BaseException] = []

    def churn() -> None:
        try:
            for _ in range(2000):
                slots.put_nowait(slots.get(timeout=10))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            failures.append(exc)

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert sorted(slots.queue) == ["a", "b"]
    assert slots._waiters == 0
