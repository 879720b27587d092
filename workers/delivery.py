"""Callback deliveries, run: the scheduler's tick that hands them out, the job that makes one attempt, and the
deliverer process that runs those jobs (what is sent, signed and retried how: app.core.callbacks).

- :class:`Dispatch` is a tick of the scheduler's half-second loop (workers.timers): it claims the deliveries
  that are due and enqueues one job each on the callbacks queue (``CALLBACK_QUEUE``). Any number of schedulers
  may run it: a claim is one compare-and-set, so each due attempt is enqueued once.
- :func:`deliver` is that job: it takes its claim, makes one attempt (the URL policy checked again first, since
  DNS can change) and records the outcome: delivered, retried later, or given up. Never in a web request.
- :func:`main` is ``taskport deliverer``: an RQ worker on the callbacks queue only. A receiver that answers
  slowly ties up a deliverer, never a task worker; and it holds the signing secrets, which task workers (which
  run processors) never do (app.core.config.TRUSTED_ROLES).
"""

from __future__ import annotations

import logging
import ssl
import time

import orjson
import redis
from rq import Queue, SimpleWorker

from app.core import keys, tracing
from app.core.batches import read_document
from app.core.callback_http import Refused, post, resolve
from app.core.callbacks import (
    ATTEMPT_GRACE_MS,
    KINDS,
    TASK,
    CallbackState,
    Deliveries,
    DeliveryId,
    Record,
    job_timeout,
    next_attempt,
    signed_headers,
)
from app.core.clock import now_ms
from app.core.config import Config
from app.core.connection import connect, ride_out_outages, wait_for_redis
from app.core.jobs import FAILED_JOB_TTL
from app.core.logs import rq_log_level, setup_logging, task_logger
from app.core.states import CALLBACK_QUEUE
from app.core.task import Task
from app.core.urls import status_document
from workers import timers
from workers.lease import Leased, lease_seconds
from workers.stopping import PromptUnsubscribe

log = logging.getLogger(__name__)
DELIVER = "workers.delivery.deliver"  # the job's function, as RQ names it
ROUND = 100  # deliveries claimed per tick at most (the rest half a second later)


class Dispatch:
    """The tick: claim what is due, enqueue a job for each (one round trip for the claim, one for the jobs)."""

    def __init__(self, conn: redis.Redis, config: Config) -> None:
        self.deliveries = Deliveries(conn, config.call_record_ms)
        self.queue = Queue(CALLBACK_QUEUE, connection=conn)
        self.timeout = job_timeout(config.callback_timeout)

    def round(self, now: int | None = None) -> int:
        """Enqueue every delivery due at ``now`` (default: the clock), up to ROUND; returns how many."""
        claimed, claim = self.deliveries.claim(now_ms() if now is None else now, ROUND)
        if claimed:  # a crash before this enqueue loses nothing: the claims come due again
            self.queue.enqueue_many([
                Queue.prepare_data(DELIVER, (delivery_id, claim), timeout=self.timeout, result_ttl=0,
                                   failure_ttl=FAILED_JOB_TTL, description=f"callback {delivery_id}")
                for delivery_id in claimed])
        return len(claimed)


class Deliverer:
    """What an attempt needs, built once per deliverer process."""

    def __init__(self, config: Config, conn: redis.Redis | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.config = config
        self.conn = conn if conn is not None else connect(config)
        self.deliveries = Deliveries(self.conn, config.call_record_ms)
        self.ssl_context = ssl_context  # None: the system's trust store (a test passes its own CA's)
        self.lease_ms = job_timeout(config.callback_timeout) * 1000 + ATTEMPT_GRACE_MS
        tracing.setup("deliverer")  # OpenTelemetry, when the otel extra is installed and OTEL_* ask for it

    def deliver(self, delivery_id: str, claim: int) -> str | None:
        """One attempt of the delivery, if the claim ``claim`` is still its own; returns the callback state it left
        the target in (None: no attempt, the claim was taken or there is nothing to deliver)."""
        now = now_ms()
        did = DeliveryId.parse(delivery_id)
        if did is None:
            log.warning("callback %r is not a delivery id: dropped", delivery_id)
            self.deliveries.drop(delivery_id)
            return None
        if not self.deliveries.take(delivery_id, claim, now + self.lease_ms):
            return None  # claimed again after its lease ran out, or settled: another job has it
        record = self.deliveries.record(delivery_id) or self._open(did, now)
        if record is None:
            self._logger(did).info("callback %s not sent: its %s is gone", did, _noun(did))
            self.deliveries.drop(delivery_id)
            return None
        return self._attempt(did, record)

    def _open(self, did: DeliveryId, now: int) -> Record | None:
        """The record of a first attempt, written (None: the target is gone)."""
        kind = KINDS[did.kind]
        target = self.deliveries.target(did)
        if not target.get(kind.url.encode()):
            return None
        body = self._body(did, target, now)
        if body is None:
            return None
        record = Record(target[kind.url.encode()].decode(), target[kind.member.encode()].decode(), body, now, 0)
        self.deliveries.open(str(did), record, self.config.callback_max_age)
        return record

    def _body(self, did: DeliveryId, target: dict[bytes, bytes], now: int) -> bytes | None:
        """The document delivered: the task's status document, or the batch document."""
        if did.kind == TASK:
            return orjson.dumps(status_document(Task.from_hash(target, did.target), now))
        doc = read_document(self.conn, did.target, now)
        return None if doc is None else orjson.dumps(doc)

    def _attempt(self, did: DeliveryId, record: Record) -> str:
        tlog = self._logger(did)
        secret = self.config.callback_keys.get(record.member)
        try:
            if secret is None:
                raise Refused(f"TASKPORT_CALLBACK_SECRETS has no signing secret for member {record.member}")
            target = resolve(record.url, self.config)  # again: what the host resolves to may have changed
        except Refused as exc:
            self.deliveries.settle(did, CallbackState.FAILED, record.attempts, None, None)
            tlog.warning("callback %s refused, nothing sent: %s", did, exc)
            return CallbackState.FAILED
        attempts = record.attempts + 1
        headers = signed_headers(secret, str(did), record.body, int(time.time()))
        traced = tracing.ON and did.kind == TASK  # the task's trace (a batch's callback: a trace of its own)
        parent = self.conn.hget(keys.task(did.target), keys.TaskField.TRACEPARENT) if traced else None
        with tracing.delivery_span(parent, str(did), attempts, headers) as span:
            answer = post(target, record.body, headers, self.config.callback_timeout, self.ssl_context)
            got = f"HTTP {answer.status}" if answer.status is not None else answer.error
            tracing.outcome(span, "delivered" if answer.delivered else "not delivered", "" if answer.delivered else got)
        if answer.delivered:
            self.deliveries.settle(did, CallbackState.DELIVERED, attempts, answer.status, None)
            tlog.info("callback %s delivered to %s (%s, attempt %d)", did, target.host, got, attempts)
            return CallbackState.DELIVERED
        now = now_ms()
        later = next_attempt(record.first_at, now, attempts, self.config.callback_max_age)
        state = CallbackState.PENDING if later is not None else CallbackState.FAILED
        self.deliveries.settle(did, state, attempts, answer.status, later)
        if later is None:
            tlog.warning("callback %s to %s given up after %d attempts over %d s (last: %s)", did, target.host,
                         attempts, (now - record.first_at) // 1000, got)
        else:
            tlog.info("callback %s to %s failed (%s, attempt %d): next in %d s", did, target.host, got, attempts,
                      (later - now + 999) // 1000)
        return state

    @staticmethod
    def _logger(did: DeliveryId) -> logging.Logger | logging.LoggerAdapter:
        return task_logger(log, did.target) if did.kind == TASK else log  # a batch's id is in the message


def _noun(did: DeliveryId) -> str:
    return "task" if did.kind == TASK else "batch"


_deliverer: Deliverer | None = None  # the process's Deliverer (see prepare)


def prepare(config: Config, conn: redis.Redis | None = None) -> Deliverer:
    """Build the process's Deliverer (the deliverer's main does, before its first job)."""
    global _deliverer
    _deliverer = Deliverer(config, conn)
    return _deliverer


def deliver(delivery_id: str, claim: int) -> None:
    """RQ's entry point (:data:`DELIVER`): one attempt of the delivery, under the claim the tick made."""
    (_deliverer or prepare(Config.from_env())).deliver(delivery_id, claim)


class DeliveryWorker(Leased, PromptUnsubscribe, SimpleWorker):
    """The deliverer's RQ worker: attempts run in-process (RQ's job timeout bounds each one); its registration
    leased like every worker's (workers.lease.Leased), so a killed deliverer leaves `rq info` soon."""


def main(config: Config, name: str | None = None) -> int:
    """``taskport deliverer``: serve the callbacks queue until SIGTERM (RQ's warm shutdown: the attempt in
    progress ends first); returns the exit code."""
    setup_logging(config, "deliverer")
    ride_out_outages()  # a Redis restart is waited out, as in every worker (app.core.connection)
    conn = connect(config)
    wait_for_redis(conn)
    prepare(config, conn)
    worker = DeliveryWorker([Queue(CALLBACK_QUEUE, connection=conn)], name=name, connection=conn)
    worker.lease = lease_seconds(config)
    log.info("deliverer %s listening on %s", worker.name, CALLBACK_QUEUE)
    worker.work(with_scheduler=False, logging_level=rq_log_level(config), max_jobs=config.worker_max_jobs or None)
    return 0


timers.TICKS.append(lambda conn, config: Dispatch(conn, config).round)
