"""The processor registry: task type -> function, payload schema, timeout, retries, priority.

A processor is a plain function ``func(payload, ctx) -> dict`` registered with :func:`processor`::

    @processor("orders.split", schema=SplitSchema, timeout=600, retries=1)
    def split(payload: dict, ctx: TaskContext) -> dict: ...

:func:`load` imports the built-ins, then the modules named in ``TASKPORT_PROCESSORS``, then every
``taskport.processors`` entry point, so users add task types without touching this code. Both the
web process (to validate submits) and the workers (to run them) call it once at start.

The registry lives in ``app`` so that both sides use it while the packages depend one way (workers ->
app): processor modules import :func:`processor` from here (``workers.processors`` re-exports it for
processor authors), and this module names every processor module only by its dotted name, as Celery's
``include`` and RQ's job function paths do; it never imports the workers package.
"""

from __future__ import annotations

import builtins
import importlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from marshmallow import Schema
from marshmallow.validate import Range

from app.core.config_limits import concurrency_key_problem
from app.core.states import DEFAULT_QUEUE, QUEUES

BUILTIN_MODULES = (
    "workers.processors.demo",
    "workers.processors.orders_split",
    "workers.processors.orders_export",
    "workers.processors.batch_summary",
)
ENTRY_POINT_GROUP = "taskport.processors"
_TYPE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
DEFAULT_TIMEOUT = 600  # seconds: a processor's job limit when its registration names none

# ``func(payload, ctx) -> dict``; ``ctx`` is a workers.context.TaskContext, which the registry stores
# functions for but never builds or calls (so it needs neither the type nor the workers package).
ProcessorFunc = Callable[[dict, Any], dict]
# A JSON integer the service can hold: orjson parses up to 64 bits and Redis integers are signed 64-bit, so
# payload integers without a tighter bound take this one (the OpenAPI document then states it).
INT64_MAX = 2**63 - 1
INT64 = Range(-(2**63), INT64_MAX)


class ProcessorLoadError(ImportError):
    """A processor module (configured or from an entry point) could not be imported."""


@dataclass(frozen=True)
class Processor:
    """A registered task type."""

    type: str
    func: ProcessorFunc
    schema: Schema
    timeout: int
    retries: int
    priority: str
    concurrency: int = 0  # at most this many runs at once per value of concurrency_key (0 = no limit)
    concurrency_key: str = "member"  # member | type | payload.<field> (app.core.limits)


_REGISTRY: dict[str, Processor] = {}


def processor(
    type: str,
    *,
    schema: type[Schema] | Schema,
    timeout: int = DEFAULT_TIMEOUT,
    retries: int = 0,
    priority: str = DEFAULT_QUEUE,
    concurrency: int = 0,
    concurrency_key: str = "member",
) -> Callable[[ProcessorFunc], ProcessorFunc]:
    """Register the decorated function as the processor of task ``type``.

    ``schema`` validates (and fills defaults of) the payload at submit; ``timeout`` is the job's
    limit in seconds; ``retries`` how many times an unexpected exception is retried; ``priority``
    the queue used when a submit names none; ``concurrency`` (N > 0) lets at most N runs of the type go at once
    per value of ``concurrency_key`` (``"member"``, ``"type"``: all of them, ``"payload.<field>"``), the others
    wait in PENDING without holding a worker (app.core.limits; TASKPORT_CONCURRENCY overrides it).
    Registering a type twice from different functions
    raises ValueError; re-importing the same function (same module and name) replaces it.
    """
    _check_options(type, timeout, retries, priority)
    _check_concurrency(type, concurrency, concurrency_key)
    instance = schema() if isinstance(schema, builtins.type) else schema
    if not isinstance(instance, Schema):
        raise TypeError(f"processor {type!r}: schema must be a marshmallow Schema class or instance")

    def register(func: ProcessorFunc) -> ProcessorFunc:
        existing = _REGISTRY.get(type)
        if existing is not None and _origin(existing.func) != _origin(func):
            raise ValueError(
                f"task type {type!r} is already registered by {'.'.join(_origin(existing.func))}"
            )
        _REGISTRY[type] = Processor(type, func, instance, timeout, retries, priority, concurrency, concurrency_key)
        return func

    return register


def _check_options(name: str, timeout: int, retries: int, priority: str) -> None:
    if not isinstance(name, str) or not _TYPE_NAME.fullmatch(name):
        raise ValueError(f"invalid task type name {name!r}")
    if not isinstance(timeout, int) or timeout <= 0:
        raise ValueError(f"processor {name!r}: timeout must be a positive number of seconds")
    if not isinstance(retries, int) or retries < 0:
        raise ValueError(f"processor {name!r}: retries must be >= 0")
    if priority not in QUEUES:
        raise ValueError(f"processor {name!r}: priority must be one of {', '.join(QUEUES)}")


def _check_concurrency(name: str, concurrency: int, key: str) -> None:
    if not isinstance(concurrency, int) or concurrency < 0:
        raise ValueError(f"processor {name!r}: concurrency must be a whole number >= 0 (0 = no limit)")
    problem = concurrency_key_problem(key) if isinstance(key, str) else "a key that is not a string"
    if problem:
        raise ValueError(f"processor {name!r}: concurrency_key has {problem}")


def _origin(func: Callable[..., Any]) -> tuple[str, str]:
    return getattr(func, "__module__", "?"), getattr(func, "__qualname__", repr(func))


def get(type: str) -> Processor | None:
    """The processor registered for ``type``, or None."""
    return _REGISTRY.get(type)


def known_types() -> list[str]:
    """Every registered task type, sorted."""
    return sorted(_REGISTRY)


def load(modules: Iterable[str] = ()) -> None:
    """Import the built-ins, then ``modules``, then the ``taskport.processors`` entry points.

    Idempotent (imports are cached). A module or entry point that fails to import raises
    :class:`ProcessorLoadError` naming it, so a misconfigured process fails at start.
    """
    for name in (*BUILTIN_MODULES, *modules):
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise ProcessorLoadError(f"cannot load processor module {name!r}: {exc}", name=name) from exc
    for entry in _entry_points():
        try:
            entry.load()
        except Exception as exc:
            raise ProcessorLoadError(
                f"cannot load processor entry point {entry.name!r} ({entry.value}): {exc}", name=entry.value
            ) from exc


def _entry_points() -> Iterable[metadata.EntryPoint]:
    return metadata.entry_points(group=ENTRY_POINT_GROUP)


def validate(type: str, payload: Any) -> dict:
    """Load ``payload`` with the schema of ``type``: the payload with defaults applied.

    Raises KeyError for an unknown type and ``marshmallow.ValidationError`` (use
    :func:`flatten_errors` on its ``messages``) for an invalid payload. The loaded payload is plain
    JSON data, and loading it again gives the same payload.
    """
    found = _REGISTRY.get(type)
    if found is None:
        raise KeyError(type)
    return found.schema.load(payload)


def flatten_errors(messages: Mapping[Any, Any] | list[Any], prefix: str = "") -> dict[str, list[str]]:
    """Turn marshmallow's nested messages into ``{"items.0.quantity": ["..."]}``.

    ``_schema`` (errors about the object itself, e.g. "Invalid input type.") maps to ``prefix`` (or
    ``"_schema"`` without one), so ``flatten_errors(err.messages, "payload")`` gives ``payload``.
    """
    flat: dict[str, list[str]] = {}
    if isinstance(messages, Mapping):
        for key, value in messages.items():
            if key == "_schema":
                path = prefix or "_schema"
            else:
                path = f"{prefix}.{key}" if prefix else str(key)
            for sub, texts in flatten_errors(value, path).items():
                flat.setdefault(sub, []).extend(texts)
    elif isinstance(messages, list) and all(isinstance(m, str) for m in messages):
        flat[prefix] = list(messages)
    elif isinstance(messages, list):
        for message in messages:
            for sub, texts in flatten_errors(message, prefix).items():
                flat.setdefault(sub, []).extend(texts)
    else:
        flat[prefix] = [str(messages)]
    return flat
