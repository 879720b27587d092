"""Marshmallow schemas of the HTTP contract's inputs (and of its documents, for the OpenAPI page)."""

from __future__ import annotations

from datetime import datetime

from marshmallow import RAISE, Schema, ValidationError, fields, validate

from app.core.fields import JsonNumber
from app.core.history import CURSOR_PATTERN
from app.core.states import QUEUES, STORED, CallbackState
from app.core.urls import task_path

MAX_DEDUP_KEY = 128
MAX_TYPE = 200  # characters of a task type name (submit, and the history filter)
MAX_AFTER = 100  # task ids a submit's ``after`` may name


def check_timestamp(value: str) -> None:
    """A ``run_at``: an ISO 8601 time with its zone (``Z`` or an offset), else a ValidationError."""
    parse_timestamp(value)


def parse_timestamp(value: str) -> int:
    """ms since the epoch of an ISO 8601 time with its zone; ValidationError for anything else."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        moment = None
    if moment is None or moment.utcoffset() is None:
        raise ValidationError("Not an ISO 8601 time with a zone, e.g. 2026-11-29T02:00:00Z.")
    return int(moment.timestamp() * 1000)


class SubmitSchema(Schema):
    class Meta:
        unknown = RAISE

    type = fields.String(required=True, validate=validate.Length(min=1, max=MAX_TYPE))
    payload = fields.Dict(keys=fields.String(), load_default=dict)
    dedup_key = fields.String(validate=validate.Length(min=1, max=MAX_DEDUP_KEY), load_default=None)
    priority = fields.String(validate=validate.OneOf(QUEUES), load_default=None)
    run_at = fields.String(validate=check_timestamp, load_default=None, metadata={
        "description": "ISO 8601 time (UTC, e.g. 2026-11-29T02:00:00Z) to run the task at, at most "
                       "TASKPORT_MAX_DELAY ahead; one in the past runs now. Not with `delay`", "format": "date-time"})
    delay = JsonNumber(validate=validate.Range(min=0, min_inclusive=False), load_default=None, metadata={
        "description": "seconds from now to run the task in (> 0, at most TASKPORT_MAX_DELAY). Not with `run_at`"})
    after = fields.List(fields.String(), validate=validate.Length(min=1, max=MAX_AFTER), load_default=None, metadata={
        "description": "ids of your tasks (1-100) this one runs after: queued once all are COMPLETED, FAILED -6 "
                       "when one ends otherwise"})
    # a plain object here (the fast envelope path mirrors no Nested field); app.web.intake loads it with
    # app.web.callback_schemas.CallbackSchema, errors named callback.url / callback.events
    callback = fields.Dict(keys=fields.String(), load_default=None, metadata={
        "description": "`{\"url\": \"https://...\", \"events\": [...]}`: a signed POST of the status document "
                       "when the task enters one of `events` (default COMPLETED, FAILED, CANCELLED, EXPIRED); see "
                       "docs/clients.md, Callbacks"})


class HistoryQuerySchema(Schema):
    class Meta:
        unknown = RAISE

    status = fields.String(validate=validate.OneOf(sorted(STORED)), load_default=None)
    type = fields.String(validate=validate.Length(min=1, max=MAX_TYPE), load_default=None)
    limit = fields.Integer(validate=validate.Range(min=1, max=200), load_default=50)
    cursor = fields.String(validate=validate.Regexp(CURSOR_PATTERN), load_default=None,
                           metadata={"description": "opaque: the next_cursor of a previous page, unchanged"})


class RetrySchema(Schema):
    """The body of ``POST /tasks/{id}/retry``: none, or ``{}`` (a field is 422, naming it)."""

    class Meta:
        unknown = RAISE


class ItemsSchema(Schema):
    total = fields.Integer()
    succeeded = fields.Integer()
    failed = fields.Integer()


class ErrorSchema(Schema):
    code = fields.Integer()
    message = fields.String()


class LinksSchema(Schema):
    self = fields.String()
    result = fields.String()
    events = fields.String()


class CallbackStateSchema(Schema):
    state = fields.String(validate=validate.OneOf([s.value for s in CallbackState]))
    attempts = fields.Integer(metadata={"description": "delivery attempts so far, the successful one included"})
    last_status = fields.Integer(allow_none=True, metadata={"description": "the HTTP status of the last attempt"})


class PlaceSchema(Schema):
    """A queued task's place in line (app.core.lines)."""

    position = fields.Integer(validate=validate.Range(min=0), metadata={
        "description": "the tasks that will start before it if nothing new comes (0: it is next)"})
    estimated_start = fields.String(allow_none=True, metadata={
        "description": "when it should start, from its queue's measured rate; null until there is a rate"})


class StatusDocumentSchema(Schema):
    """The task status document (documentation only: the hot path renders it without a schema)."""

    task_id = fields.UUID()
    type = fields.String()
    status = fields.String(validate=validate.OneOf([*sorted(STORED), "DUPLICATE"]))
    progress = fields.Integer()
    message = fields.String(allow_none=True)
    items = fields.Nested(ItemsSchema, allow_none=True)
    error = fields.Nested(ErrorSchema, allow_none=True)
    attempts = fields.Integer()
    resumed = fields.Integer(required=True, validate=validate.Range(min=0), metadata={
        "description": "runs that continued from a checkpoint (after a graceful stop or a lost worker), 0 at "
                       "first; an interruption is not a retry, so `attempts` does not count it"})
    created_at = fields.String()
    started_at = fields.String(allow_none=True)
    updated_at = fields.String()
    completed_at = fields.String(allow_none=True)
    expires_at = fields.String()
    run_at = fields.String(allow_none=True, metadata={
        "description": "the time the submit asked it to run at (`run_at`/`delay`), null without; PENDING and "
                       "not queued until then"})
    waiting_for = fields.List(fields.String(), allow_none=True, metadata={
        "description": "the tasks of its `after` not COMPLETED yet (for a batch's `then` task: the batch id), while "
                       "it is PENDING (null otherwise); then why it waits for a concurrency slot, e.g. "
                       "`concurrency: demo.sleep member acme 3/3`"})
    batch_id = fields.String(allow_none=True, metadata={
        "description": "the batch it was submitted in, or whose `then` task it is (null otherwise)"})
    callback = fields.Nested(CallbackStateSchema, allow_none=True, metadata={
        "description": "its callback's latest delivery (null without a callback)"})
    queue = fields.Nested(PlaceSchema, metadata={
        "description": "its place in line: only on a PENDING task waiting in a queue, in the status read and a "
                       "stream's first event (docs/api.md, Place in line)"})
    links = fields.Nested(LinksSchema)


# -- documentation only (the OpenAPI document of app.web.api.docs); views render these bodies directly --


class ProblemSchema(Schema):
    """RFC 9457 problem details: the body of every error (``application/problem+json``)."""

    type = fields.String(metadata={"example": "/problems/not-found"})
    title = fields.String()
    status = fields.Integer()
    detail = fields.String()
    errors = fields.Dict(keys=fields.String(), values=fields.List(fields.String()),
                         metadata={"description": "validation errors (422 only): field path -> messages"})
    known_types = fields.List(fields.String(), metadata={"description": "422 for an unknown type only"})


class TaskConflictSchema(ProblemSchema):
    """409 from the result endpoint (FAILED or CANCELLED) or from cancel (already ended)."""

    task_status = fields.String(validate=validate.OneOf(sorted(STORED)))
    error = fields.Nested(ErrorSchema, allow_none=True)


class DuplicateSchema(Schema):
    """409 body of a submit whose dedup key is held (``X-Task-Deduplicated: true``)."""

    type = fields.String()
    title = fields.String()
    detail = fields.String()
    task_id = fields.UUID()
    status = fields.String(validate=validate.OneOf(["DUPLICATE"]))
    duplicate = fields.Boolean()
    message = fields.String()
    existing = fields.Nested(StatusDocumentSchema, allow_none=True)


class ResultFileSchema(Schema):
    name = fields.String()
    size = fields.Integer()
    content_type = fields.String()
    url = fields.String(metadata={"description": task_path("{id}", "/result/file")})


class FailureSchema(Schema):
    item = fields.String()
    code = fields.Integer()
    message = fields.String()


class ResultSchema(Schema):
    """200 body of the result endpoint (a COMPLETED task)."""

    task_id = fields.UUID()
    status = fields.String(validate=validate.OneOf(["COMPLETED"]))
    result = fields.Raw(metadata={"description": "the processor's output; `file` (ResultFile) for exports",
                                  "type": "object"})
    items = fields.Nested(ItemsSchema, allow_none=True)
    failures = fields.List(fields.Nested(FailureSchema))
    error_code = fields.Integer(allow_none=True)
    completed_at = fields.String()
    expires_at = fields.String()


class HistoryPageSchema(Schema):
    """200 body of the history endpoint."""

    tasks = fields.List(fields.Nested(StatusDocumentSchema))
    next_cursor = fields.String(allow_none=True)


class TokenRequestSchema(Schema):
    """The body of ``POST /tasks/{id}/tokens`` and ``POST /batches/{id}/tokens``: none, or ``{"ttl": seconds}``."""

    class Meta:
        unknown = RAISE

    ttl = fields.Integer(strict=True, validate=validate.Range(min=1, max=86400), load_default=3600, metadata={
        "description": "seconds the token counts, 1 to 86400 (default 3600)"})


class ReadTokenSchema(Schema):
    """A read token (docs/api.md, Read tokens): send it as ``Authorization: Bearer <token>`` or
    ``?access_token=<token>``."""

    token = fields.String(metadata={"description": "opaque and URL-safe; starts with tpr."})
    expires_at = fields.String(metadata={"description": "ISO 8601: after this the token answers 401"})
