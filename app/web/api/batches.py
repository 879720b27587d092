"""/api/v1/batches: many tasks submitted as one (submit, status, its tasks, its events, cancel).

Each task of a batch is checked exactly as ``POST /tasks`` checks a submit (app.web.intake); any fault in any
of them refuses the whole batch, every field named by its task's index (``tasks.3.payload.items.0.quantity``),
and nothing is stored. The batch's counters are kept by the scripts (app.core.batchscripts), so a status read
is one HGETALL.

A batch submit runs with Python's cyclic garbage collector paused (:func:`collector_paused`): its thousand tasks
are ~30,000 containers alive until the answer, which set off the collector's passes over the whole heap (a tenth
or more of the web's CPU of a batch, bench/README.md "Batch submit per task") and which reference counting frees
when the request ends; the collector resumes with the last batch in flight.

The events stream follows the batch's record: it reads the record's ``seq`` every :data:`POLL` seconds and
sends the document when it moved (changes between two reads coalesce into one event), with the task streams'
caps, keep-alives, lifetime and ``Last-Event-ID``; it ends after the DONE document.
"""

from __future__ import annotations

import gc
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import redis
from flask import Blueprint, Response, current_app, g
from limits import parse_many
from marshmallow import ValidationError

from app.core import processors
from app.core.batches import DONE, MAX_TASKS, Batch
from app.core.clock import now_ms
from app.core.urls import API_PREFIX, batch_document, batch_path, status_document
from app.web.api import json_response
from app.web.api.events import (
    EVENT_STREAM,
    FULL_RETRY_AFTER,
    KEEP_ALIVE,
    MIN_INTERVAL,
    RECONNECT,
    STREAM_HEADERS,
    last_event_id,
)
from app.web.api.tasks import _json_body, page_query
from app.web.batch_schemas import BatchSchema, BatchTasksQuerySchema
from app.web.batch_service import BatchService, refused
from app.web.errors import AppError, TooManyRequests, ValidationFailed
from app.web.intake import Submission, load_callback, load_submission, prefixed
from app.web.readiness import WARNING_HEADER
from app.web.runtime import runtime

bp = Blueprint("batches", __name__, url_prefix=API_PREFIX)
SUBMIT_ENDPOINT = "batches.submit"  # the rate limiter counts its tasks (request_cost)
EXTENSION = "taskport.batches"
POLL = 0.25  # seconds between two reads of a streamed batch's seq
NOT_FOR_THEN = ("after", "run_at", "delay")  # a then task runs when its batch is done, not at a time of its own


_batch_schema = BatchSchema()
_tasks_query = BatchTasksQuerySchema()


def _service() -> BatchService:
    service = current_app.extensions.get(EXTENSION)
    if service is None:
        service = current_app.extensions[EXTENSION] = BatchService(runtime().service)
    return service  # type: ignore[no-any-return]


class _Pause:
    """Who holds the collector paused: the first batch in flight pauses it, the last one out resumes it (only
    if it ran when the first came: a process that turned it off keeps it off)."""

    lock = threading.Lock()
    holders = 0
    resume = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the block (see the module's docstring); reference counting
    still frees everything as usual."""
    with _Pause.lock:
        if _Pause.holders == 0:
            _Pause.resume = gc.isenabled()
            gc.disable()
        _Pause.holders += 1
    try:
        yield
    finally:
        with _Pause.lock:
            _Pause.holders -= 1
            if _Pause.holders == 0 and _Pause.resume:
                gc.enable()


@bp.post("/batches")
def submit() -> Response:
    """Submit a batch: 202 with its document and its tasks in order; 422 naming every field at fault (nothing
    stored); 429 when its tasks would take the member past its unfinished-task cap."""
    with collector_paused():
        return _submit()


def _submit() -> Response:
    rt = runtime()
    member = rt.members.current()
    try:
        data: dict[str, Any] = _batch_schema.load(_body_once())
    except ValidationError as exc:
        raise ValidationFailed(processors.flatten_errors(exc.messages)) from None
    over = g.get("over_rate")
    if over:
        raise ValidationFailed({"tasks": [over]})
    now = now_ms()
    subs, then, callback_url = _loaded(data, member, now)
    created, queued = _service().create(member, subs, then, callback_url)
    doc = batch_document(created.batch, now)
    doc["tasks"] = [{"task_id": e.task_id, "status": e.status, "duplicate": e.duplicate} for e in created.entries]
    if data["read_token"]:
        from app.web.api.tokens import read_token  # here: that module imports this one
        from app.web.tokens import BATCH

        doc["read_token"] = read_token(BATCH, created.batch.id, now=now)
    headers = {"Location": batch_path(created.batch.id)}
    unserved = [queue for queue in sorted(queued) if rt.service.unserved(queue, batch_id=created.batch.id)]
    if unserved:
        headers[WARNING_HEADER] = f"no-worker; queue={','.join(unserved)}"
    return json_response(doc, 202, headers)


def _body_once() -> dict[str, Any]:
    """The request's JSON body, read once (the rate limiter's cost reads it before the view; a refusal is kept
    and raised where the view asks, so it is answered as any submit's)."""
    if "batch_body" not in g:
        try:
            with collector_paused():  # its thousand dicts, parsed before the view when the rate limit counts them
                g.batch_body = _json_body()
        except AppError as exc:
            g.batch_body = exc
    if isinstance(g.batch_body, AppError):
        raise g.batch_body
    return g.batch_body  # type: ignore[no-any-return]


def request_cost() -> int:
    """What a batch submit costs against the rate limit: one request per task (and its then task), as that many
    submits would. A batch larger than a limit's whole window could never pass: it costs nothing and the view
    refuses it with a 422 saying how large a batch may be (``g.over_rate``)."""
    try:
        body = _body_once()
    except AppError:
        return 1
    tasks = body.get("tasks")
    cost = max(1, min(len(tasks), MAX_TASKS) if isinstance(tasks, list) else 1) + (1 if body.get("then") else 0)
    rt = runtime()
    smallest = min((item.amount for item in parse_many(rt.config.request_limit)), default=cost) \
        if rt.config.request_limit else cost
    if cost > smallest:
        g.over_rate = (f"A batch counts one request per task (and its then task) against your rate limit "
                       f"(TASKPORT_RATE_LIMIT {rt.config.request_limit}): send at most {smallest} per batch.")
        return 0
    return cost


def _loaded(data: dict[str, Any], member: str, now: int) -> tuple[list[Submission], Submission | None, str]:
    """The batch body's tasks, ``then`` and callback URL, each checked as a submit checks it; the 422 names every
    field at fault in all of them (the refusal of one task does not hide another's)."""
    rt = runtime()
    subs: list[Submission] = []
    errors: dict[str, list[str]] = {}
    for i, body in enumerate(data["tasks"]):
        try:
            subs.append(load_submission(body, rt.members, rt.config, now))
        except AppError as exc:  # a 422 (or the 403 of a priority the key may not use): named, and go on
            errors.update(prefixed(exc, f"tasks.{i}"))
    then = None
    if data["then"] is not None:
        errors.update({f"then.{name}": ["A then task runs when its batch is done: it takes no " + name + "."]
                       for name in NOT_FOR_THEN if data["then"].get(name) is not None})
        try:
            then = load_submission(data["then"], rt.members, rt.config, now)
        except AppError as exc:
            errors.update(prefixed(exc, "then"))
    callback_url = ""
    if data["callback"] is not None:
        if "events" in data["callback"]:
            errors["callback.events"] = ["A batch's callback is sent once, when it is DONE: it takes no events."]
        else:
            try:
                callback_url = load_callback(data["callback"], member, rt.config)["url"]
            except AppError as exc:
                errors.update(exc.extra.get("errors") or {})
    if errors:
        raise refused(errors)
    return subs, then, callback_url


@bp.get("/batches/<batch_id>")
def status(batch_id: str) -> Response:
    """The batch document (one Redis read)."""
    rt = runtime()
    return json_response(batch_document(_service().find(rt.members.current(), batch_id), now_ms()))


@bp.get("/batches/<batch_id>/tasks")
def tasks(batch_id: str) -> Response:
    """The batch's tasks in submit order, filtered by status, a page at a time."""
    rt = runtime()
    service = _service()
    service.find(rt.members.current(), batch_id)
    query = page_query(_tasks_query)
    now = now_ms()
    page = service.store.page(batch_id, limit=query["limit"], cursor=query["cursor"], status=query["status"], now=now)
    return json_response({"tasks": [status_document(t, now) for t in page.tasks], "next_cursor": page.next_cursor})


@bp.delete("/batches/<batch_id>")
def cancel(batch_id: str) -> Response:
    """Cancel the batch's unfinished tasks and its then task: 204."""
    rt = runtime()
    _service().cancel(rt.members.current(), batch_id)
    response = Response(status=204)
    del response.headers["Content-Type"]
    return response


@bp.get("/batches/<batch_id>/events")
def events(batch_id: str) -> Response:
    """Stream the batch document on each change until it is DONE."""
    last_id = last_event_id()
    rt = runtime()
    member = rt.members.current()
    batch = _service().find(member, batch_id)
    slots = rt.streams.slots
    slot = slots.acquire(member)
    if slot is None:
        raise TooManyRequests(f"at most {slots.cap} open event streams per member; close one or retry later",
                              retry_after=FULL_RETRY_AFTER)
    stream = _follow(_service(), batch, last_id, rt.config.sse_heartbeat, rt.config.sse_max_minutes * 60)
    released: list[bool] = []

    def release() -> None:
        if not released:
            released.append(True)
            slots.release(slot)

    def chunks() -> Iterator[bytes]:
        try:
            yield from stream
        finally:
            release()

    response = Response(chunks(), content_type=EVENT_STREAM, headers=STREAM_HEADERS)
    response.call_on_close(release)
    return response


def format_event(batch: Batch, now: int) -> bytes:
    return b"event: batch\nid: %d\ndata: %s\n\n" % (batch.seq, orjson.dumps(batch_document(batch, now)))


def _follow(service: BatchService, batch: Batch, last_id: int | None, heartbeat: float,
            lifetime: float) -> Iterator[bytes]:
    """The stream's chunks from ``batch`` (as read): each newer state once, until DONE or the lifetime."""
    heartbeat = max(heartbeat, MIN_INTERVAL)
    start = time.monotonic()
    end_at = start + max(lifetime, MIN_INTERVAL) * (1 - 0.1 * random.random())
    beat_at = start + heartbeat
    sent = last_id if last_id is not None and last_id <= batch.seq else -1
    if sent == batch.seq:
        yield KEEP_ALIVE  # up to date: open the stream now rather than at the first change
    current: Batch | None = batch
    while current is not None:
        if current.seq > sent:
            yield format_event(current, now_ms())
            sent, beat_at = current.seq, time.monotonic() + heartbeat
        if current.status == DONE:
            return
        while True:
            now = time.monotonic()
            if now >= end_at:
                yield RECONNECT
                return
            if now >= beat_at:
                yield KEEP_ALIVE
                beat_at = now + heartbeat
            time.sleep(min(POLL, max(end_at - now, 0.0)))
            try:
                seq = service.store.seq(batch.id)
                if seq is None or seq > sent:
                    current = service.store.get(batch.id)  # None: gone (expired) - the stream ends
                    break
            except redis.RedisError:
                continue  # Redis away: keep the stream open with keep-alives, as task streams do
