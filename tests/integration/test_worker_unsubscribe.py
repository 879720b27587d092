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



def test_a_stop_whose_unsubscribe_meets_the_connection_closed_is_no_error(redis_conn: redis.Redis) -> None:
    """The thread may wake between the stop lowering its flag and the UNSUBSCRIBE (a message, its subscription's
    own reply: a worker stopped right after its start), end, and close the connection on its way out while the
    send is on it: Bad file descriptor (one run of five of make test). That moment cannot be timed from outside,
    so the send here fails as it did then."""
    worker = Worker([Queue("default", connection=redis_conn)], connection=redis_conn)
    worker.subscribe()
    wait_until(lambda: worker.pubsub.subscribed, message="the subscription")

    def closed_under_it(*args: Any) -> None:
        worker.pubsub_thread._running.clear()  # the thread's own way out: it ends at its next wake
        worker.pubsub.ping()  # which this reply gives it
        raise redis.exceptions.ConnectionError("Error 9 while writing to socket. Bad file descriptor.")

    worker.pubsub.unsubscribe = closed_under_it
    worker.unsubscribe()  # raised before
    wait_until(lambda: not worker.pubsub_thread.is_alive(), message="the pubsub thread to end")
