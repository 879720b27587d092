"""OpenTelemetry traces, an optional extra (``pip install '.[otel]'``): one trace from a submit to its runs and
its callback deliveries (docs/operations.md, "Tracing").

Configured only by OpenTelemetry's own ``OTEL_*`` variables: :func:`setup` turns tracing on in a process when
the extra is installed and a traces exporter is asked for (``OTEL_TRACES_EXPORTER`` other than ``none``, or an
``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``), and ``OTEL_SDK_DISABLED`` is not true. The SDK reads the rest itself:
the OTLP endpoint, headers and timeouts, ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``, the sampler.

Off, nothing of OpenTelemetry is imported and the hot paths pay one test of :data:`ON` (docs/operations.md has the
figures): no middleware, no span objects. On:

- the web's :class:`Middleware` makes a server span of every request, child of its ``traceparent`` header;
- a submit keeps that span's W3C ``traceparent`` in the task's hash (keys.TaskField.TRACEPARENT);
- each run of the task is a span (:func:`run_span`), child of it, whatever the attempt (a retry, a resume after
  a worker stop or crash): they are told apart by their attributes ``taskport.attempt``, ``taskport.resumed``;
- each callback delivery attempt is a client span (:func:`delivery_span`), child of it too, and sends its own
  ``traceparent`` to the receiver.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

log = logging.getLogger(__name__)

ON = False  # tracing is set up in this process (see setup): every hook tests this first
NAME = "taskport"  # the tracer's (instrumentation scope) name, and service.name when OTEL_SERVICE_NAME is unset
_tracer: Any = None
_provider: Any = None
FLUSH_MS = 5000  # how long a work horse's last export may hold up its exit (see run_span)
_OFF = contextlib.nullcontext()


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces to be exported."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def setup(role: str, env: Mapping[str, str] | None = None, exporter: Any = None) -> bool:
    """Turn tracing on in this process when the environment asks for it (once; later calls answer the same):
    a tracer provider whose resource says ``taskport.role`` ``role`` (web, worker, deliverer), exporting in
    batches to the exporters ``OTEL_TRACES_EXPORTER`` names, and made OpenTelemetry's global one, so the spans a
    processor makes itself (``opentelemetry.trace.get_tracer``) are children of its run's (``exporter``: a test's
    own, e.g. the SDK's in-memory one, exported at once, and not global). Returns whether tracing is on."""
    global ON, _tracer, _provider
    if ON:
        return True
    env = os.environ if env is None else env
    if exporter is None and not wanted(env):
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        log.warning("OTEL_* variables ask for traces, but the otel extra is not installed (pip install "
                    "'taskport[otel]'): tracing is off")
        return False
    resource = Resource.create({"taskport.role": role})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": NAME}))
    provider = TracerProvider(resource=resource)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        exporters = _exporters(env)
        if not exporters:
            return False
        for each in exporters:
            provider.add_span_processor(BatchSpanProcessor(each))
        from opentelemetry import trace

        trace.set_tracer_provider(provider)
    _provider, _tracer = provider, provider.get_tracer(NAME)
    ON = True
    log.info("tracing on (OpenTelemetry), role %s", role)
    return True


def reset() -> None:
    """Tracing off again, its spans flushed (tests)."""
    global ON, _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    ON, _tracer, _provider = False, None, None


def _exporters(env: Mapping[str, str]) -> list[Any]:
    """The span exporters ``OTEL_TRACES_EXPORTER`` names (default ``otlp``), found by the entry points the SDK's
    exporters register; ``otlp`` is OTLP over ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` (default http/protobuf, the
    one the extra installs)."""
    from importlib.metadata import entry_points

    found = []
    for name in (n.strip().lower() for n in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")):
        if name in ("", "none"):
            continue
        if name == "otlp":
            protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            name = "otlp_proto_grpc" if (protocol or "http/protobuf") == "grpc" else "otlp_proto_http"
        points = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not points:
            log.warning("OTEL_TRACES_EXPORTER names %s, which is not installed: not exported there", name)
            continue
        found.append(next(iter(points)).load()())
    return found


def traceparent() -> str:
    """The W3C ``traceparent`` of the current span ('' when tracing is off or there is none)."""
    if not ON:
        return ""
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def submitted(task_id: str) -> str:
    """A task created under the current span: the span notes its id; returns the ``traceparent`` the task keeps
    ('' when off)."""
    if not ON:
        return ""
    from opentelemetry import trace

    trace.get_current_span().set_attribute("taskport.task_id", task_id)
    return traceparent()


def _parent(parent: str | bytes | None) -> Any:
    """The context of a kept ``traceparent`` (None: a root span)."""
    if not parent:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    text = parent.decode() if isinstance(parent, bytes) else parent
    return TraceContextTextMapPropagator().extract({"traceparent": text})


def run_span(parent: str | bytes | None, task_id: str, task_type: str, run_id: str, attempt: int,
             resumed: bool, *, flush: bool = False) -> contextlib.AbstractContextManager[Any]:
    """The span of one run of a task, child of the submit's ``parent`` (its kept traceparent): ``with`` it around
    the run; its ``taskport.outcome`` is set by :func:`outcome`. A nothing when off. ``flush``: the run's process
    is a work horse (RQ's fork and spawn workers), which ends with ``os._exit`` once its one job is done, so the
    spans it holds are exported as the run ends (for at most FLUSH_MS), or never."""
    if not ON:
        return _OFF
    return _run_span(parent, task_id, task_type, run_id, attempt, resumed, flush)


@contextlib.contextmanager
def _run_span(parent: str | bytes | None, task_id: str, task_type: str, run_id: str, attempt: int,
              resumed: bool, flush: bool) -> Iterator[Any]:
    from opentelemetry.trace import SpanKind

    attributes = {"taskport.task_id": task_id, "taskport.type": task_type, "taskport.run_id": run_id,
                  "taskport.attempt": attempt, "taskport.resumed": resumed}
    try:
        with _tracer.start_as_current_span(f"run {task_type}", context=_parent(parent), kind=SpanKind.CONSUMER,
                                           attributes=attributes) as span:
            yield span
    finally:
        if flush:
            _provider.force_flush(FLUSH_MS)


def outcome(span: Any, what: str, error: str = "") -> None:
    """Note how a run (or delivery) ended on its span (None: tracing is off); ``error``: it failed, saying why."""
    if span is None:
        return
    span.set_attribute("taskport.outcome", what)
    if error:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error))


def delivery_span(parent: str | bytes | None, delivery_id: str, attempt: int,
                  headers: dict[str, str]) -> contextlib.AbstractContextManager[Any]:
    """The client span of one callback delivery attempt, child of the task's kept ``parent``; its own
    ``traceparent`` goes into ``headers`` (the request's). A nothing when off."""
    if not ON:
        return _OFF
    return _delivery_span(parent, delivery_id, attempt, headers)


@contextlib.contextmanager
def _delivery_span(parent: str | bytes | None, delivery_id: str, attempt: int,
                   headers: dict[str, str]) -> Iterator[Any]:
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span("callback", context=_parent(parent), kind=SpanKind.CLIENT,
                                       attributes={"taskport.delivery_id": delivery_id,
                                                   "taskport.attempt": attempt}) as span:
        headers["traceparent"] = traceparent()
        yield span


class Middleware:
    """WSGI: a server span per request, child of the request's ``traceparent`` (the propagators
    ``OTEL_PROPAGATORS`` names: W3C trace context by default), named and given its status as it ends. Installed
    only when tracing is on (app.web.create_app)."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind, Status, StatusCode

        carrier = {"traceparent": environ.get("HTTP_TRACEPARENT", ""), "tracestate": environ.get("HTTP_TRACESTATE", "")}
        method = environ.get("REQUEST_METHOD", "GET")
        with _tracer.start_as_current_span(method, context=propagate.extract(carrier), kind=SpanKind.SERVER,
                                           attributes={"http.request.method": method,
                                                       "url.path": environ.get("PATH_INFO", "")}) as span:
            def traced_start(status: str, headers: list[tuple[str, str]], *args: Any) -> Any:
                code = int(status.split(" ", 1)[0])
                span.set_attribute("http.response.status_code", code)
                if code >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                return start_response(status, headers, *args)

            return self.app(environ, traced_start)


def name_route(method: str, rule: str | None) -> None:
    """The current server span named for its route (``POST /api/v1/tasks``), as OpenTelemetry's HTTP conventions
    name them (Flask's before-request hook, only when on)."""
    if rule is None:
        return
    from opentelemetry import trace

    span = trace.get_current_span()
    span.update_name(f"{method} {rule}")
    span.set_attribute("http.route", rule)
