"""/api/v1/tasks: submit, status, result, result file, cancel, retry (run again), history."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from flask import Blueprint, Response, request, send_file
from marshmallow import Schema, ValidationError
from werkzeug.datastructures import Headers
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.wsgi import get_input_stream

from app.core import processors
from app.core.clock import iso, iso_or_none, now_ms
from app.core.filebody import streamed_body
from app.core.ids import digest
from app.core.results import StoreUnavailable, unspill
from app.core.states import ACTIVE, TaskStatus
from app.core.task import Task
from app.core.urls import API_PREFIX, file_url, status_document, task_path
from app.web.api import json_response
from app.web.deferred import retry_after
from app.web.errors import (
    BadRequest,
    Conflict,
    Duplicate,
    NotFound,
    Unavailable,
    UnsupportedMediaType,
    ValidationFailed,
)
from app.web.intake import load_submission
from app.web.readiness import WARNING_HEADER
from app.web.rerun import run_again
from app.web.runtime import runtime
from app.web.schemas import MAX_DEDUP_KEY, HistoryQuerySchema, RetrySchema
from app.web.service import BadCursor, check_cursor

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

bp = Blueprint("tasks", __name__, url_prefix=API_PREFIX)
_history_schema = HistoryQuerySchema()
_retry_schema = RetrySchema()
RETRY_AFTER = {"Retry-After": "1"}
NOT_A_CURSOR = "Not a cursor from a previous page."
JSON_TYPE = "application/json"
log = logging.getLogger(__name__)
T = TypeVar("T")
_PENDING, _EXPIRED = TaskStatus.PENDING, TaskStatus.EXPIRED  # read once: ~50 ns each time on Python 3.11


@bp.post("/tasks")
def submit() -> Response:
    """Submit a task: 202 with its status document, or 409 naming the task that holds the dedup key."""
    rt = runtime()
    member = rt.members.current()
    environ = request.environ
    body = _json_body(environ)
    wants_token = _wants_read_token(body)
    now = now_ms()
    sub = load_submission(body, rt.members, rt.config, now)
    dedup_key = _dedup_key(environ, sub.dedup_key)
    outcome = rt.service.submit(member, sub.type, sub.payload, dedup_key, sub.priority, submitted=sub.submitted,
                                run_at=sub.run_at, after=sub.after, callback=sub.callback)
    location = {"Location": task_path(outcome.task_id)}
    if outcome.created:
        assert outcome.task is not None
        doc = status_document(outcome.task, now)
        if wants_token:
            from app.web.api.tokens import read_token  # here: that module builds on this one
            from app.web.tokens import TASK

            doc["read_token"] = read_token(TASK, outcome.task_id, now=now)
        return _Accepted.of(doc, _accepted(outcome.task, now))
    if outcome.task is not None and _key_reused_for_another_request(environ, outcome.task, sub.type, sub.payload):
        raise ValidationFailed({IDEMPOTENCY_KEY: ["Used within the deduplication window for a different request."]},
                               "this Idempotency-Key was used for a request with another type or payload")
    existing = status_document(outcome.task, now_ms()) if outcome.task else None
    message = "an identical task was submitted within the deduplication window"
    raise Duplicate(message, headers={**location, "X-Task-Deduplicated": "true"}, task_id=outcome.task_id,
                    status=TaskStatus.DUPLICATE, duplicate=True, message=message, existing=existing)


def _wants_read_token(body: dict[str, Any]) -> bool:
    """The submit's ``read_token`` (taken out of the body: it asks for a token, it is no part of the task); 422
    unless a boolean. A batch's tasks take none: the batch's own ``read_token`` covers them."""
    wanted = body.pop(READ_TOKEN, False)
    if not isinstance(wanted, bool):
        raise ValidationFailed({READ_TOKEN: ["Not a valid boolean."]})
    return wanted


READ_TOKEN = "read_token"


class _Accepted(Response):
    """A submit's 202 (``json_response(doc, 202, headers)``, the same answer), whose WSGI headers skip what werkzeug
    does for a ``Location`` that is not a plain path yet: ``iri_to_uri`` and the header set again (~3 µs a submit,
    bench/README.md "Submit, eighth pass"). The view's ``Location`` is :func:`task_path` of a task id: letters,
    digits, ``-`` and ``/``, which ``iri_to_uri`` gives back unchanged, so werkzeug's answer is the copy of the
    headers; any other case (a hook that changed them, a status without a body) goes through werkzeug's own."""

    plain_location: str | None = None

    @classmethod
    def of(cls, doc: dict[str, Any], headers: dict[str, str]) -> _Accepted:
        response = json_response(doc, 202, headers, kind=cls)  # filled directly, not werkzeug's constructor
        response.plain_location = headers["Location"]
        return response

    def get_wsgi_headers(self, environ: WSGIEnvironment) -> Headers:
        status = self.status_code
        if self.plain_location is not None and not (100 <= status < 200 or status in (204, 304)):
            headers = Headers(self.headers)
            location = length = None
            for key, value in headers:
                name = key.lower()
                if name == "location":
                    location = value
                elif name == "content-length":
                    length = value
                elif name == "content-location":
                    break
            else:
                if length is not None and location == self.plain_location and not self.autocorrect_location_header:
                    return headers
        return super().get_wsgi_headers(environ)


def _accepted(task: Task, now: int) -> dict[str, str]:
    """The headers of a 202 that queued ``task`` (a submit, a run again): where to poll, when, and a warning
    when its queue has no worker (not for a task that is not queued yet: it waits for its time or others)."""
    headers = {"Location": task_path(task.id), **retry_after(task, now)}
    queued = task.status == _PENDING and not task.waits(now)
    if queued and runtime().service.unserved(task.priority, task.id):
        headers[WARNING_HEADER] = f"no-worker; queue={task.priority}"
    return headers


def page_query(schema: Schema) -> dict[str, Any]:
    """A paged listing's query string loaded by ``schema``; a cursor that no earlier page gave is 422 on
    ``cursor`` (one message, whatever is wrong with it)."""
    try:
        query: dict[str, Any] = schema.load(request.args.to_dict())
        if query["cursor"]:
            check_cursor(query["cursor"])
    except ValidationError as exc:
        errors = processors.flatten_errors(exc.messages)
        if "cursor" in errors:
            errors["cursor"] = [NOT_A_CURSOR]
        raise ValidationFailed(errors) from None
    except BadCursor:
        raise ValidationFailed({"cursor": [NOT_A_CURSOR]}) from None
    return query


def _json_body(environ: WSGIEnvironment | None = None) -> dict[str, Any]:
    """The request's body, a JSON object (``environ``: the request's, when the caller has it at hand)."""
    if environ is None:
        environ = request.environ
    # the header as clients send it, compared as is before werkzeug's parse of its parameters (~2 µs a submit)
    if environ.get("CONTENT_TYPE") != JSON_TYPE and request.mimetype != JSON_TYPE:
        raise UnsupportedMediaType("send the body as application/json")
    try:
        body = orjson.loads(_body_bytes(runtime().config.max_body, environ))
    except orjson.JSONDecodeError:
        raise BadRequest("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _body_bytes(limit: int, environ: WSGIEnvironment | None = None) -> bytes:
    """The request body, refused with 413 past ``limit`` bytes whether or not it came with a Content-Length.

    Werkzeug's own limit stops a chunked body at the limit without a word (the rest is cut off), so the
    body is read here, unlimited but at most ``limit + 1`` bytes: getting that many means it is too big.
    A body with a Content-Length (not chunked) holds no more than that, so it is read up to it and no
    further read asks the stream for an end it has already reached (~1.5 µs a submit).
    """
    if environ is None:
        environ = request.environ
    stream = get_input_stream(environ, max_content_length=None)  # a Content-Length still bounds it
    wanted = limit + 1
    declared = environ.get("CONTENT_LENGTH")
    if declared and declared.isascii() and declared.isdigit() and environ.get("HTTP_TRANSFER_ENCODING") is None:
        wanted = min(wanted, int(declared))
    chunks: list[bytes] = []
    size = 0
    while size < wanted:
        chunk = stream.read(wanted - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise RequestEntityTooLarge()
    return b"".join(chunks)


IDEMPOTENCY_KEY = "Idempotency-Key"
IDEMPOTENCY_KEY_ENVIRON = "HTTP_IDEMPOTENCY_KEY"  # where werkzeug's request.headers reads it (~1 µs less, direct)


def _dedup_key(environ: WSGIEnvironment, from_body: str | None) -> str | None:
    """The submit's dedup key: its ``Idempotency-Key`` header (one, of one key: the server joins repeated
    headers with commas) or its body's ``dedup_key`` (both: the same)."""
    header = environ.get(IDEMPOTENCY_KEY_ENVIRON)
    if header is None:
        return from_body
    if "," in header:
        raise BadRequest("send one Idempotency-Key header, with one key",
                         errors={IDEMPOTENCY_KEY: ["One key, once: not several headers, and no comma."]})
    if not 1 <= len(header) <= MAX_DEDUP_KEY:
        raise ValidationFailed({IDEMPOTENCY_KEY: [f"Length must be between 1 and {MAX_DEDUP_KEY}."]})
    if from_body is not None and from_body != header:
        raise ValidationFailed({"dedup_key": ["Differs from the Idempotency-Key header."]})
    return header


def _key_reused_for_another_request(environ: WSGIEnvironment, holder: Task, task_type: str,
                                    payload: dict[str, Any]) -> bool:
    """Whether this duplicate named its key in an ``Idempotency-Key`` header while the task holding the key was
    submitted with another type or payload (as validated): the IETF draft for the header answers that 422. A
    body ``dedup_key`` keeps the contract's meaning: the same key is the same task, whatever the payload."""
    if environ.get(IDEMPOTENCY_KEY_ENVIRON) is None:
        return False
    held = holder.payload_sha256  # the holder's digest as the store wrote it
    return holder.type != task_type or (held is not None and held != digest(orjson.dumps(payload)))


@bp.get("/tasks/<task_id>")
def status(task_id: str) -> Response:
    """The task's status document (one Redis read)."""
    rt = runtime()
    task, place = rt.service.find_placed(rt.members.current(), task_id)
    now = now_ms()
    doc = status_document(task, now, place)
    if doc["status"] == _EXPIRED:
        return json_response(doc, 410)
    return json_response(doc, 200, retry_after(task, now) if doc["status"] in ACTIVE else None)


def _completed(view: Callable[[Task, dict[str, Any]], Response]) -> Callable[[str], Response]:
    """A view of a COMPLETED task's result: ``view(task, stored_result)``; before that, the answer the
    contract gives instead (202 while it runs, 409 if it failed or was cancelled, 410 once expired)."""

    @functools.wraps(view)
    def wrapper(task_id: str) -> Response:
        found = _finished_result(task_id)
        return found if isinstance(found, Response) else view(*found)

    return wrapper


def _finished_result(task_id: str) -> tuple[Task, dict[str, Any]] | Response:
    """The COMPLETED task and its stored result, or the answer the contract gives instead."""
    rt = runtime()
    task, stored = rt.service.find_with_result(rt.members.current(), task_id)
    doc = status_document(task, now_ms())
    if doc["status"] == TaskStatus.COMPLETED and stored is not None:
        return task, _from_result_store(lambda: unspill(rt.results.for_run(stored.get("run")), task.id, stored))
    if doc["status"] in ACTIVE:
        return json_response(doc, 202, RETRY_AFTER)
    if doc["status"] in (TaskStatus.FAILED, TaskStatus.CANCELLED):
        raise Conflict(f"task is {doc['status']}: there is no result", task_status=doc["status"], error=doc["error"])
    doc["status"] = TaskStatus.EXPIRED
    return json_response(doc, 410)


@bp.get("/tasks/<task_id>/result")
@_completed
def result(task: Task, stored: dict[str, Any]) -> Response:
    """The result of a COMPLETED task; 202 while it runs, 409 if it failed or was cancelled, 410 once expired."""
    body = {
        "task_id": task.id, "status": TaskStatus.COMPLETED, "result": _linked(task.id, stored["result"]),
        "items": task.items,
        "failures": stored.get("failures", []), "error_code": stored.get("error_code"),
        "completed_at": iso_or_none(task.completed_at), "expires_at": iso(task.expires_at),
    }  # fmt: skip
    return json_response(body)


def _linked(task_id: str, result: Any) -> Any:
    """A file result with its ``file.url`` (the processor records the file; its URL is the web's to say)."""
    if isinstance(result, dict) and isinstance(result.get("file"), dict):
        return {**result, "file": {**result["file"], "url": file_url(task_id)}}
    return result


@bp.get("/tasks/<task_id>/result/file")
@_completed
def result_file(task: Task, stored: dict[str, Any]) -> Response:
    """Stream the file of a COMPLETED task whose result is a file, as an attachment."""
    info = (stored.get("result") or {}).get("file") if isinstance(stored.get("result"), dict) else None
    if not info:
        raise NotFound("this task's result has no file")
    handle = _from_result_store(lambda: runtime().results.for_run(stored.get("run")).open(task.id, info["name"]))
    response = send_file(handle, as_attachment=True, download_name=info["name"], max_age=0)
    response.headers["Content-Type"] = info["content_type"]  # as recorded (Flask would add a second charset)
    response.content_length = info["size"]
    if (blocks := streamed_body(handle)) is not None:  # an object store's stream: see app.core.filebody
        response.response = blocks
    return response


def _from_result_store(read: Callable[[], T]) -> T:
    """``read()`` from the result store: 404 when the object is gone, 503 + Retry-After when the store is down."""
    try:
        return read()
    except FileNotFoundError:
        raise NotFound("the result file is gone") from None
    except StoreUnavailable as exc:
        log.error("result store unavailable during %s %s: %s", request.method, request.path, exc)
        raise Unavailable("the result store is unreachable, retry shortly") from None


@bp.delete("/tasks/<task_id>")
def cancel(task_id: str) -> Response:
    """Cancel a PENDING or PROCESSING task: 204; 409 once it has ended."""
    rt = runtime()
    rt.service.cancel(rt.members.current(), task_id)
    response = Response(status=204)
    del response.headers["Content-Type"]  # no body, no type
    return response


@bp.post("/tasks/<task_id>/retry")
def retry(task_id: str) -> Response:
    """Run a FAILED or CANCELLED task again under its own id: 202 with its status document (PENDING); 409 in
    any other state, 410 once expired."""
    rt = runtime()
    _retry_body(rt.config.max_body)
    task = run_again(rt.service, rt.results, rt.service.find(rt.members.current(), task_id))
    doc = status_document(task, now_ms())
    if doc["status"] == TaskStatus.EXPIRED:
        return json_response(doc, 410)
    return json_response(doc, 202, _accepted(task, now_ms()))


def _retry_body(limit: int) -> None:
    """A retry's body: none, or a JSON object with no member (:class:`RetrySchema`; a member is 422 naming it)."""
    body = optional_object(limit, "send no body, or {} as application/json")
    if body is None:
        return
    try:
        _retry_schema.load(body)
    except ValidationError as exc:
        raise ValidationFailed(processors.flatten_errors(exc.messages)) from None


def optional_object(limit: int, hint: str) -> dict[str, Any] | None:
    """The body of a route whose body is optional: None when there is none (zero bytes), else a JSON object sent
    as application/json (415 with ``hint``, 400 for anything else: whitespace alone is not JSON)."""
    raw = _body_bytes(limit)
    if not raw:
        return None
    if request.mimetype != "application/json":
        raise UnsupportedMediaType(hint)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadRequest("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


@bp.get("/tasks")
def history() -> Response:
    """The caller's tasks, newest first, filtered by status and type, a page at a time."""
    rt = runtime()
    member = rt.members.current()
    query = page_query(_history_schema)
    now = now_ms()
    page = rt.service.history(member, limit=query["limit"], cursor=query["cursor"], status=query["status"],
                              type_=query["type"], now=now)
    return json_response({"tasks": [status_document(t, now) for t in page.tasks], "next_cursor": page.next_cursor})
