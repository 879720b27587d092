"""A worker's stop does not wait out RQ's pubsub thread (issue 29, finding 11), on a real Valkey.

RQ 3.0 listens for its commands on a thread that sleeps in ``get_message(timeout=60)``. Its teardown sends
UNSUBSCRIBE, then stops that thread; a thread that reads the reply first waits 60 s for a subscription, and
redis-py 8.2's ``stop()`` joins it: the worker outlived supervisord's stop wait and was SIGKILLed, in most
Ctrl-Cs of ``make up`` on a busy machine. Each test here makes that order certain (UNSUBSCRIBE's reply read
before ``unsubscribe`` goes on), for every RQ worker class taskport runs, and wants the stop within
``UNSUBSCRIBE_WAIT`` (plus slack), the thread gone.

The same wait ended the in-process burst workers of test_worker_bookkeeping.py: under a loaded ``make test``
one sat out the 60 s and the test hit pytest's timeout (issue 29's fresh-clone failure; with redis-py 8.2.0
and the old classes, 4 of 8 runs of that module had a test take 60 s).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from rq import Queue

from tests.integration.harness import wait_until
from workers.delivery import DeliveryWorker
from workers.scheduler import HousekeepingWorker
from workers.stopping import UNSUBSCRIBE_WAIT
from workers.worker import SpawnWorker, StoppableSimpleWorker, Worker

CLASSES = [Worker, SpawnWorker, StoppableSimpleWorker, HousekeepingWorker, DeliveryWorker]
SLACK = 2.0  # seconds over UNSUBSCRIBE_WAIT: a loaded machine's scheduling, never the 60 s sleep


def reply_read_first(pubsub: Any) -> None:
    """Make ``pubsub.unsubscribe()`` return only once the listening thread has read the reply: the order a
    busy machine often gives, which RQ's teardown does not expect."""
    send = pubsub.unsubscribe

    def unsubscribe(*args: Any) -> None:
        send(*args)
        wait_until(lambda: not pubsub.subscribed, timeout=5, message="the pubsub thread to read UNSUBSCRIBE's reply")

    pubsub.unsubscribe = unsubscribe


@pytest.mark.parametrize("worker_class", CLASSES, ids=[c.__name__ for c in CLASSES])
def test_a_stopping_worker_ends_its_pubsub_thread_without_waiting_out_its_sleep(
    redis_conn: redis.Redis, worker_class: type[Any]
) -> None:
    worker = worker_class([Queue("default", connection=redis_conn)], connection=redis_conn)
    worker.subscribe()
    thread = worker.pubsub_thread
    wait_until(lambda: worker.pubsub.subscribed, message="the subscription")
    reply_read_first(worker.pubsub)

    stop = threading.Thread(target=worker.unsubscribe, daemon=True)  # daemon: a hang must not outlive the test
    begun = time.monotonic()
    stop.start()
    stop.join(UNSUBSCRIBE_WAIT + SLACK)
    took = time.monotonic() - begun
    assert not stop.is_alive(), f"{worker_class.__name__}.unsubscribe still waiting after {took:.1f} s"
    wait_until(lambda: not thread.is_alive(), timeout=SLACK, message="the pubsub thread to end")
