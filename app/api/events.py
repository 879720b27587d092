"""GET /api/v1/tasks/{id}/events: a task's status documents as Server-Sent Events.

Every write to a task bumps its ``seq`` and PUBLISHes it on the task's events channel (see
:mod:`app.scripts`). A stream subscribes to that channel *before* it reads the snapshot, so no change
falls between the two; on each announcement of a newer ``seq`` it re-reads the task (one HGETALL) and
sends the status document with ``id: <seq>``. Pub/sub is fire-and-forget, so the stream also re-reads
the task every ``TASKPORT_SSE_POLL`` seconds in case a message was lost, and sends a ``: keep-alive``
comment after ``TASKPORT_SSE_HEARTBEAT`` idle seconds (which is also how a gone client is noticed).

Choices where the contract is silent:

- Changes that land between two reads are coalesced: the client gets the latest document, whose
  ``id`` is the latest ``seq`` (ids only ever go up; intermediate states are not stored anywhere).
- A task whose ``expires_at`` passes mid-stream is sent once more as EXPIRED (with an unchanged
  ``id``, since nothing was written) and the stream ends, as a status read would say EXPIRED too.
- ``Last-Event-ID`` not below the task's ``seq`` means the client is up to date: nothing is re-sent
  (a ``: keep-alive`` comment opens the stream at once); if that ``seq`` was the terminal event the
  stream ends empty. A ``Last-Event-ID`` that is not an integer, or beyond the task's ``seq`` (not
  an id this task ever had), is ignored and the current document is sent.

Each open stream holds one thread (gunicorn gthread) and one Redis pub/sub connection until it ends;
the pub/sub connection is closed however the stream ends (generator ``finally`` plus ``call_on_close``
for a response that is closed before its first chunk).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import orjson
import redis
from flask import Blueprint, Response, request
from redis.client import PubSub

from app import keys
from app.api import json_response
from app.runtime import runtime
from app.states import TERMINAL, TaskStatus
from app.store import TaskStore
from app.task import Task, now_ms

bp = Blueprint("events", __name__, url_prefix="/api/v1")
log = logging.getLogger(__name__)

EVENT_STREAM = "text/event-stream"
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
KEEP_ALIVE = b": keep-alive\n\n"
FINAL = TERMINAL | {TaskStatus.EXPIRED}
MIN_INTERVAL = 0.01  # seconds: a floor for the configured intervals, so a zero never busy-loops


@bp.get("/tasks/<task_id>/events")
def events(task_id: str) -> Response:
    """Stream the task's status documents until it ends; 404/410 (before streaming) as for status."""
    rt = runtime()
    task = rt.service.find(rt.members.current(), task_id)
    now = now_ms()
    if task.effective_status(now) == TaskStatus.EXPIRED:
        return json_response(task.to_doc(now), 410)
    stream = TaskStream(rt.service.store, rt.redis.pubsub(), task_id, rt.config.sse_heartbeat, rt.config.sse_poll)
    try:
        stream.subscribe()
        snapshot = rt.service.store.get(task_id)
    except BaseException:
        stream.close()
        raise
    response = Response(stream.run(snapshot, last_event_id()), content_type=EVENT_STREAM, headers=STREAM_HEADERS)
    response.call_on_close(stream.close)
    return response


def last_event_id() -> int | None:
    """The ``Last-Event-ID`` of a reconnecting client, or None (absent or not an integer)."""
    raw = request.headers.get("Last-Event-ID", "").strip()
    return int(raw) if raw.isdigit() else None


def format_event(seq: int, doc: dict[str, Any]) -> bytes:
    """One ``status`` event. Compact JSON never contains a newline, so one ``data:`` line suffices."""
    return b"event: status\nid: %d\ndata: %s\n\n" % (seq, orjson.dumps(doc))


def _announced(message: dict[str, Any] | None) -> int:
    """The ``seq`` a pub/sub message announces (-1 for anything else)."""
    if not message or message.get("type") != "message":
        return -1
    try:
        return int(message["data"])
    except (TypeError, ValueError):
        return -1


class TaskStream:
    """Follows one task over its events channel, rendering each new state as an SSE event."""

    def __init__(self, store: TaskStore, pubsub: PubSub, task_id: str, heartbeat: float, poll: float) -> None:
        self.store = store
        self.pubsub = pubsub
        self.task_id = task_id
        self.heartbeat = max(heartbeat, MIN_INTERVAL)
        self.poll = max(poll, MIN_INTERVAL)
        self._beat_at = time.monotonic() + self.heartbeat

    def subscribe(self) -> None:
        """Listen for the task's changes: call before reading the snapshot."""
        self.pubsub.subscribe(keys.events(self.task_id))

    def close(self) -> None:
        """Release the pub/sub connection (safe to call more than once)."""
        self.pubsub.close()

    def run(self, snapshot: Task | None, last_id: int | None) -> Iterator[bytes]:
        """The stream's chunks, starting from ``snapshot``; ends after the terminal event."""
        try:
            yield from self._follow(snapshot, last_id)
        except redis.RedisError as exc:
            # The client reconnects with Last-Event-ID and gets 503 until Redis is back.
            log.warning("event stream of task %s ended: redis error: %s", self.task_id, exc)
        finally:
            self.close()

    def _follow(self, task: Task | None, last_id: int | None) -> Iterator[bytes]:
        sent = -1
        status: str | None = None
        if task is not None and last_id is not None and last_id <= task.seq:
            sent = last_id
            if last_id == task.seq:
                yield KEEP_ALIVE  # up to date: open the stream now rather than at the first change
        while task is not None:  # None: the task is gone entirely (after its tombstone): just end
            doc = task.to_doc(now_ms())
            if task.seq > sent or (status is not None and doc["status"] != status):
                yield format_event(task.seq, doc)
                self._beat_at = time.monotonic() + self.heartbeat
            sent, status = max(sent, task.seq), doc["status"]
            if status in FINAL:
                return
            yield from self._wait(sent)
            task = self.store.get(self.task_id)

    def _wait(self, sent: int) -> Iterator[bytes]:
        """Send keep-alives until a re-read is due: a newer ``seq`` was announced, or the poll interval passed."""
        poll_at = time.monotonic() + self.poll
        while True:
            now = time.monotonic()
            if now >= self._beat_at:
                yield KEEP_ALIVE
                self._beat_at = now + self.heartbeat
            if now >= poll_at:
                return
            message = self.pubsub.get_message(ignore_subscribe_messages=True, timeout=min(poll_at, self._beat_at) - now)
            if _announced(message) > sent:
                return
