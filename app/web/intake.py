"""One submit body loaded and checked, as ``POST /tasks`` and each task of ``POST /batches`` take it.

:func:`load_submission` answers a :class:`Submission` or raises ValidationFailed (or Forbidden for a priority
the caller's key may not use) naming the field at fault; a batch prefixes those names with the task's place
(:func:`prefixed`). The dedup key of a ``POST /tasks`` may come from its ``Idempotency-Key`` header, which
the view merges in.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from marshmallow import Schema, ValidationError

from app.core import processors
from app.core.config import Config
from app.web.auth import Members
from app.web.callback_schemas import CallbackSchema, check_callback
from app.web.deferred import run_at_ms
from app.web.errors import AppError, ValidationFailed
from app.web.fastload import FastLoad
from app.web.schemas import SubmitSchema

_submit_schema = SubmitSchema()
_fast_envelope = FastLoad(_submit_schema)  # built at import: a field it cannot mirror fails loudly here
_callback_schema = CallbackSchema()
_fast_payloads: dict[Schema, FastLoad | None] = {}  # a processor's schema -> its fast path (see validated_payload)


class Submission(NamedTuple):
    """A submit body, loaded: ``payload`` as its processor validated it, ``submitted`` as the client sent it.
    A named tuple, not a frozen dataclass: made once per submit and per task of a batch, ~0.6 µs against ~2.2
    (a frozen dataclass sets each field through ``object.__setattr__``)."""

    type: str
    payload: dict[str, Any]
    submitted: dict[str, Any]
    dedup_key: str | None
    priority: str | None
    run_at: int | None  # ms, None = now
    after: list[str] | None
    callback: dict[str, Any] | None  # {"url", "events"}


def envelope(body: dict[str, Any]) -> dict[str, Any]:
    """``SubmitSchema().load(body)``: a plainly valid envelope through the fast path derived from the schema
    (:class:`~app.web.fastload.FastLoad`: marshmallow's pass costs ~4 % of a submit), anything else through
    the schema itself, so every error answer is its own."""
    fast = _fast_envelope(body)
    if fast is not None:
        return fast
    try:
        return _submit_schema.load(body)  # type: ignore[no-any-return]
    except ValidationError as exc:
        raise ValidationFailed(processors.flatten_errors(exc.messages)) from None


def load_submission(body: Any, members: Members, config: Config, now: int,
                    dedup_key: str | None = None) -> Submission:
    """``body`` (a submit's JSON) loaded and checked: the envelope, the caller's right to its priority, the
    payload by its processor, its run_at / delay and its callback. ``dedup_key`` (the header's) wins over the
    body's when given (the view checks they agree)."""
    if not isinstance(body, dict):
        raise ValidationFailed({"_schema": ["Must be a JSON object (a submit body)."]})
    data = envelope(body)
    members.check_priority(data["priority"])
    payload = validated_payload(data["type"], data["payload"])
    run_at = run_at_ms(data, config, now)
    callback = None
    if data["callback"] is not None:
        callback = load_callback(data["callback"], members.current(), config)
    return Submission(data["type"], payload, data["payload"], dedup_key or data["dedup_key"], data["priority"],
                      run_at, data["after"], callback)


def load_callback(raw: dict[str, Any], member: str, config: Config) -> dict[str, Any]:
    """A submit's ``callback`` loaded and checked (its URL resolved): ValidationFailed naming ``callback.*``."""
    try:
        loaded: dict[str, Any] = _callback_schema.load(raw)
    except ValidationError as exc:
        raise ValidationFailed(processors.flatten_errors(exc.messages, prefix="callback")) from None
    errors = check_callback(loaded, member, config)
    if errors:
        raise ValidationFailed({f"callback.{name}": messages for name, messages in errors.items()})
    return loaded


def validated_payload(task_type: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The payload as its processor's schema loads it: a plainly valid one through the fast path derived from that
    schema when it can be (:class:`~app.web.fastload.FastLoad`; marshmallow's load was ~40 % of the web's work per
    task of a batch: bench/README.md), anything else through the schema, so every error answer is its own."""
    proc = processors.get(task_type)
    fast = _fast_payload(proc.schema) if proc is not None and type(payload) is dict else None
    loaded = fast(payload) if fast is not None else None
    if loaded is not None:
        return loaded
    try:
        return processors.validate(task_type, payload)
    except KeyError:
        known = processors.known_types()
        raise ValidationFailed({"type": [f"Unknown task type. Known types: {', '.join(known)}."]},
                               f"unknown task type {task_type!r}", known_types=known) from None
    except ValidationError as exc:
        raise ValidationFailed(processors.flatten_errors(exc.messages, prefix="payload")) from None


def _fast_payload(schema: Schema) -> FastLoad | None:
    """The fast path of a processor's payload schema, None for one it cannot mirror (hooks, Nested fields...): built
    once per schema, on its first submit."""
    try:
        return _fast_payloads[schema]
    except KeyError:
        pass
    try:
        fast: FastLoad | None = FastLoad(schema)
    except TypeError:
        fast = None
    _fast_payloads[schema] = fast
    return fast


def prefixed(exc: AppError, prefix: str) -> dict[str, list[str]]:
    """The field errors of a refusal (ValidationFailed, Forbidden) with each name under ``prefix``."""
    errors: dict[str, list[str]] = exc.extra.get("errors") or {"_schema": [exc.detail]}
    return {f"{prefix}.{name}": messages for name, messages in errors.items()}
