"""Prometheus metrics: Redis-wide gauges read at scrape time, plus this process's HTTP request metrics.

Each app gets its own :class:`~prometheus_client.CollectorRegistry` (no global state, so tests can
build many apps). It holds:

- :class:`RedisCollector`, which on every scrape reads, in one pipelined round trip, the RQ queue
  lengths and registry sizes, which queues are paused, the RQ worker count, the number of PROCESSING tasks
  and the task counters (:class:`~app.core.stats.Stats`: every field becomes ``taskport_tasks_total{event="<field>"}``,
  whoever increments it). These describe the whole deployment: any web process answers the same.
- :class:`HttpMetrics`, a counter and a latency histogram of the requests *this process* served,
  updated by a WSGI wrapper around the app. With several gunicorn worker processes each process counts only its
  own requests and a scrape reaches one of them at random (Prometheus' ``multiprocess`` mode, which
  would merge them, is out of scope); sum per instance or scrape each process if that matters.
  For a streamed response (SSE, file download) the latency is the time until the response started.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import redis
from flask import Flask
from gevent.monkey import get_original
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString
from rq import Queue, Worker
from rq.registry import CanceledJobRegistry
from rq.utils import as_text

from app.core import backlog, keys, limits
from app.core.indexes import RunningIndex
from app.core.states import QUEUES
from app.core.stats import Stats
from app.web.readiness import housekeeping_ages, live_workers

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

EXTENSION = "taskport.metrics"
# The method label takes these values and "other": every made-up method a client sends would otherwise
# add a counter series for good (label values must come from a bounded set). Endpoints are the app's
# own (or "unmatched"), statuses the ones it answers.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class RedisCollector:
    """Reads the deployment-wide gauges and counters from Redis on each scrape (one pipeline)."""

    def __init__(self, conn: redis.Redis) -> None:
        self.redis = conn
        self.queue_keys: list[tuple[str, str]] = []  # (queue, key of its job list)
        self.registry_keys: list[tuple[str, str, str]] = []  # (queue, registry, key of its sorted set)
        for name in QUEUES:
            queue = Queue(name, connection=conn)
            self.queue_keys.append((name, queue.key))
            for registry, obj in (("started", queue.started_job_registry), ("failed", queue.failed_job_registry),
                                  ("finished", queue.finished_job_registry),
                                  ("canceled", CanceledJobRegistry(name, connection=conn)),
                                  ("scheduled", queue.scheduled_job_registry),
                                  ("deferred", queue.deferred_job_registry)):
                self.registry_keys.append((name, registry, obj.key))

    def describe(self) -> Iterable[Metric]:
        """The metric names, without touching Redis (used when the collector is registered)."""
        return self._families()

    def collect(self) -> Iterator[Metric]:
        """Read Redis (one pipeline, plus the readiness reads); if it does not answer, report
        ``taskport_redis_up 0`` and nothing else from it."""
        try:
            values = self._read()
            values += [live_workers(self.redis), housekeeping_ages(self.redis)]
        except redis.RedisError:
            up = GaugeMetricFamily("taskport_redis_up", "1 if Redis answered this scrape, else 0")
            up.add_metric([], 0)
            yield up
            return
        yield from self._families(values)

    def _read(self) -> list[Any]:
        pipe = self.redis.pipeline(transaction=False)
        for _, key in self.queue_keys:
            pipe.llen(key)
        for _, _, key in self.registry_keys:
            pipe.zcard(key)
        pipe.scard(Worker.redis_workers_keys)
        pipe.zcard(RunningIndex.key)
        pipe.hgetall(Stats.key)
        pipe.smembers(keys.PAUSED_QUEUES)
        return list(pipe.execute())

    def _families(self, values: list[Any] | None = None) -> list[Metric]:
        up = GaugeMetricFamily("taskport_redis_up", "1 if Redis answered this scrape, else 0")
        queued = GaugeMetricFamily("taskport_queue_length", "jobs waiting in an RQ queue", labels=["queue"])
        registries = GaugeMetricFamily(
            "taskport_rq_jobs",
            "jobs in an RQ queue's registry (started, failed, finished, canceled, scheduled, deferred)",
            labels=["queue", "registry"])
        paused = GaugeMetricFamily(
            "taskport_queue_paused", "1 while operators paused the queue (no worker takes its jobs), else 0",
            labels=["queue"])
        workers = GaugeMetricFamily("taskport_rq_workers", "RQ workers registered in Redis")
        running = GaugeMetricFamily("taskport_tasks_processing", "tasks PROCESSING now (those with a heartbeat)")
        totals = CounterMetricFamily("taskport_tasks", "task lifecycle events since the data began", labels=["event"])
        listening = GaugeMetricFamily(
            "taskport_queue_workers", "RQ workers listening on a queue (0: its tasks stay PENDING)", labels=["queue"])
        housekeeping = GaugeMetricFamily(
            "taskport_housekeeping_age_seconds", "seconds since a housekeeping pass last ended (absent: never)",
            labels=["pass"])
        families: list[Metric] = [up, queued, registries, paused, workers, running, totals, listening, housekeeping]
        if values is None:
            return families
        it = iter(values)
        up.add_metric([], 1)
        for name, _ in self.queue_keys:
            queued.add_metric([name], next(it))
        for name, registry, _ in self.registry_keys:
            registries.add_metric([name, registry], next(it))
        workers.add_metric([], next(it))
        running.add_metric([], next(it))
        # the reconciler's count reads 0 until it ever acts (workers.housekeeping: it should stay 0)
        for field, value in sorted({keys.STAT_RECONCILED: 0.0, **Stats.decode(next(it))}.items()):
            totals.add_metric([field], value)
        held = {as_text(name) for name in next(it)}
        for name, _ in self.queue_keys:
            paused.add_metric([name], 1 if name in held else 0)
        for name, n in next(it).items():
            listening.add_metric([name], n)
        for name, age in next(it).items():
            if age is not None:
                housekeeping.add_metric([name], age)
        return families


allocate_native_lock = get_original("_thread", "allocate_lock")  # _thread's own, patched by gevent or not


class HttpMetrics:
    """Request count and latency by endpoint and status, for this process (see the module docstring).

    Recorded by a WSGI wrapper around the app, not by Flask hooks: a hook pair cost ~12 µs of CPU per
    request (Flask's per-hook dispatch, the ``request`` proxy's lookups, prometheus_client's locked
    counter and histogram children), most of what taskport's middleware added to a status read
    (bench/README.md, "Status path"). Here a request costs two ``perf_counter`` calls and one
    lock-guarded update of plain numbers, which become Prometheus families at scrape time, with the
    same names, labels, buckets and ``_created`` samples as prometheus_client's Counter and Histogram.
    The latency is the time until the response started (``start_response``), as before.
    """

    def __init__(self) -> None:
        # A native lock even under gevent (whose patched Lock is Python code, ~0.3 µs more a request): nothing
        # holding it yields to another greenlet (plain dict and number updates, list copies), so none waits on it.
        self._lock = allocate_native_lock()
        self._counts: dict[tuple[str, str, str], list[float]] = {}  # (endpoint, method, status) -> [n, created]
        # (endpoint, status) -> [count per bucket (not cumulative) ..., count above the last, sum, created]
        self._latency: dict[tuple[str, str], list[float]] = {}

    def wrap(self, wsgi_app: WSGIApplication) -> WSGIApplication:
        """``wsgi_app`` with every response counted and timed."""
        observe = self.observe

        def timed(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            start = time.perf_counter()

            def observed(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
                # called by the response while Flask's request context still holds the request
                req = environ.get("werkzeug.request")
                rule = req.url_rule if req is not None else None
                method = environ.get("REQUEST_METHOD", "").upper()
                observe(rule.endpoint if rule is not None else "unmatched",
                        method if method in METHODS else "other",  # a client picks the method
                        status[:3], time.perf_counter() - start)
                return start_response(status, headers, exc_info)

            return wsgi_app(environ, observed)

        return timed

    def observe(self, endpoint: str, method: str, status: str, seconds: float) -> None:
        with self._lock:
            count = self._counts.get((endpoint, method, status))
            if count is None:
                count = self._counts[(endpoint, method, status)] = [0, time.time()]
            count[0] += 1
            latency = self._latency.get((endpoint, status))
            if latency is None:
                latency = self._latency[(endpoint, status)] = [0.0] * (len(LATENCY_BUCKETS) + 1) + [0.0, time.time()]
            latency[bisect_left(LATENCY_BUCKETS, seconds)] += 1
            latency[-2] += seconds

    def describe(self) -> list[Metric]:
        return self.collect()

    def collect(self) -> list[Metric]:
        requests = CounterMetricFamily("taskport_http_requests", "HTTP requests served by this process",
                                       labels=["endpoint", "method", "status"])
        latency = HistogramMetricFamily("taskport_http_request_duration_seconds",
                                        "time to produce the response, by this process", labels=["endpoint", "status"])
        with self._lock:
            counts = [(key, list(value)) for key, value in self._counts.items()]
            timings = [(key, list(value)) for key, value in self._latency.items()]
        for series, (n, created) in counts:
            requests.add_metric(list(series), n, created=created)
        bounds = [*(floatToGoString(b) for b in LATENCY_BUCKETS), "+Inf"]
        for (endpoint, status), values in timings:
            buckets = list(zip(bounds, accumulate(values[:-2]), strict=True))
            latency.add_metric([endpoint, status], buckets, values[-2])
            latency.samples.append(Sample(latency.name + "_created", {"endpoint": endpoint, "status": status},
                                          values[-1]))
        return [requests, latency]


class ReadAtScrape:
    """A collector whose families come from one read of Redis at scrape time (``_read``); none when Redis fails
    (RedisCollector reports ``taskport_redis_up`` 0); ``describe`` gives the families empty."""

    def __init__(self, conn: redis.Redis) -> None:
        self.redis = conn

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterator[Metric]:
        try:
            read = self._read()
        except redis.RedisError:
            return
        yield from self._families(read)

    def _read(self) -> Any:
        raise NotImplementedError

    def _families(self, read: Any = None) -> list[Metric]:
        raise NotImplementedError


class LimitsCollector(ReadAtScrape):
    """Concurrency and rate limits at scrape time (app.core.limits): slots held and tasks parked per limit, and
    each rate limit's tokens taken, waited for and refused. Labels are bounded by the declarations: a
    concurrency limit is its type and key kind (``demo.sleep member``), never a member or a payload value; a
    rate limit is its name (one series each, so name them in config or code, not from payloads)."""

    def _read(self) -> tuple[dict[str, limits.LimitUse], Any]:
        return limits.in_use(self.redis), self.redis.hgetall(keys.RATE_STATS)

    def _families(self, read: tuple[dict[str, limits.LimitUse], Any] | None = None) -> list[Metric]:
        use, rates = read or (None, None)
        held = GaugeMetricFamily("taskport_concurrency_slots_held",
                                 "slots of a concurrency limit held now (runs, and released tasks not started yet)",
                                 labels=["limit"])
        parked = GaugeMetricFamily("taskport_concurrency_parked",
                                   "tasks PENDING in a concurrency limit's line, holding no worker", labels=["limit"])
        tokens = CounterMetricFamily("taskport_rate_limit_calls",
                                     "ctx.limit calls per rate limit: taken (at once or after a wait), waited (taken "
                                     "for a later time, the worker slept), refused (the wait was longer than "
                                     "TASKPORT_RATE_WAIT_MAX: the task was put back)", labels=["limit", "outcome"])
        families: list[Metric] = [held, parked, tokens]
        for name, now in sorted((use or {}).items()):
            held.add_metric([name], now.held)
            parked.add_metric([name], now.parked)
        for field, value in sorted((rates or {}).items()):
            name, _, outcome = as_text(field).rpartition(":")
            tokens.add_metric([name, outcome], float(value))
        return families


class BacklogCollector(ReadAtScrape):
    """What waits, for autoscalers and operators (app.core.backlog: one read-only script per scrape): each queue's
    oldest waiting job's age, the tasks waiting for their time or for other tasks, the callback deliveries due.
    The tasks waiting for a concurrency slot are LimitsCollector's ``taskport_concurrency_parked``."""

    def _read(self) -> backlog.Backlog:
        return backlog.read(self.redis)

    def _families(self, now: backlog.Backlog | None = None) -> list[Metric]:
        oldest = GaugeMetricFamily(
            "taskport_queue_oldest_age_seconds",
            "seconds the oldest job waiting in an RQ queue has waited since it was queued (0: none waits); jobs "
            "of tasks no longer PENDING are passed over", labels=["queue"])
        waiting = GaugeMetricFamily(
            "taskport_tasks_waiting", "PENDING tasks not queued yet: run_at = waiting for their time (a run_at, a "
            "retry's backoff), after = waiting for other tasks (after, a batch's then)", labels=["reason"])
        due = GaugeMetricFamily("taskport_callbacks_due",
                                "callback deliveries to attempt: now (due, not attempted yet) or later (a retry's "
                                "backoff)", labels=["when"])
        families: list[Metric] = [oldest, waiting, due]
        if now is None:
            return families
        for name, age in now.oldest_age.items():
            oldest.add_metric([name], age)
        waiting.add_metric(["run_at"], now.delayed)
        waiting.add_metric(["after"], now.after)
        due.add_metric(["now"], now.callbacks_due_now)
        due.add_metric(["later"], now.callbacks_due_later)
        return families


def init_app(app: Flask, conn: redis.Redis) -> CollectorRegistry:
    """Give the app its metrics registry and request hooks; register this first so it times everything."""
    registry = CollectorRegistry()
    registry.register(RedisCollector(conn))
    registry.register(LimitsCollector(conn))
    registry.register(BacklogCollector(conn))
    http = HttpMetrics()
    registry.register(http)
    app.wsgi_app = http.wrap(app.wsgi_app)  # type: ignore[method-assign,assignment]  # Flask's middleware idiom
    app.extensions[EXTENSION] = registry
    return registry
