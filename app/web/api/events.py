"""GET /api/v1/tasks/{id}/events: a task's status documents as Server-Sent Events.

Every write to a task bumps its ``seq`` and PUBLISHes it on the task's events channel (see
:mod:`app.core.scripts`). A stream registers a watch with its web process's :class:`~app.web.streams.EventHub`
*before* it reads the snapshot, so no change falls between the two; the hub (one pub/sub connection
per process) reads the task once per announced change and hands it to every watch of that task,
and the stream sends the status document with ``id: <seq>``. The hub also re-reads watched tasks
every ``TASKPORT_SSE_POLL`` seconds in case a message was lost. A stream sends a ``: keep-alive``
comment after ``TASKPORT_SSE_HEARTBEAT`` idle seconds (which is also how a gone client is noticed).

Choices where the contract is silent:

- Changes that land between two reads are coalesced: the client gets the latest document, whose
  ``id`` is the latest ``seq`` (ids only ever go up; intermediate states are not stored anywhere).
- A task whose ``expires_at`` passes mid-stream is sent once more as EXPIRED (with an unchanged
  ``id``, since nothing was written) and the stream ends, as a status read would say EXPIRED too.
- ``Last-Event-ID`` not below the task's ``seq`` means the client is up to date: nothing is re-sent
  (a ``: keep-alive`` comment opens the stream at once); if that ``seq`` was the terminal event the
  stream ends empty. A ``Last-Event-ID`` beyond the task's ``seq`` (not an id this task ever had) is
  ignored and the current document is sent; one that is not an id at all (not ASCII digits, or
  beyond 2^63 - 1) is 422 naming the header, before anything is read.
- A member holds at most ``TASKPORT_MAX_STREAMS_PER_MEMBER`` open streams over all web processes;
  one more is 429 with ``Retry-After`` (see :class:`~app.web.streams.StreamSlots`).
- A stream ends by itself after ``TASKPORT_SSE_MAX_MINUTES`` (less a random 0-10 %, so streams
  opened together do not all come back at once), with a ``: reconnect`` comment: an EventSource
  reconnects by itself with ``Last-Event-ID`` and misses nothing.
- While Redis is away an open stream stays open and sends keep-alives; it carries on once the hub
  has reconnected. A new stream meanwhile is 503, as every read is.

With gunicorn's gevent worker (the default) an open stream costs a greenlet and a watch, not a
thread or a Redis connection; a second greenlet notices at once when the client closes the
connection (:func:`app.web.webworker.on_hang_up`). Its slot and watch are released however it ends
(generator ``finally`` plus ``call_on_close`` for a response that is closed before its first chunk).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import orjson
from flask import Blueprint, Response, request

from app.core.clock import now_ms
from app.core.lines import Place
from app.core.states import TERMINAL, TaskStatus
from app.core.task import Task
from app.core.urls import API_PREFIX, status_document
from app.web.api import json_response
from app.web.errors import TooManyRequests, ValidationFailed
from app.web.runtime import runtime
from app.web.streams import EventHub, Reading, StreamSlots, Watch
from app.web.webworker import direct_socket, on_hang_up

bp = Blueprint("events", __name__, url_prefix=API_PREFIX)

EVENT_STREAM = "text/event-stream"
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
KEEP_ALIVE = b": keep-alive\n\n"
RECONNECT = b": reconnect\n\n"  # the stream reached its lifetime: resume with Last-Event-ID
FINAL = TERMINAL | {TaskStatus.EXPIRED}
MIN_INTERVAL = 0.01  # seconds: a floor for the configured intervals, so a zero never busy-loops
MAX_EVENT_ID = 2**63 - 1  # seq is a Redis integer
FULL_RETRY_AFTER = 10  # seconds: a hint for a member at its stream cap (streams end as tasks end)
LAST_EVENT_ID = "Last-Event-ID"


@bp.get("/tasks/<task_id>/events")
def events(task_id: str) -> Response:
    """Stream the task's status documents until it ends; 404/410 (before streaming) as for status."""
    last_id = last_event_id()
    rt = runtime()
    member = rt.members.current()
    task = rt.service.find(member, task_id)
    now = now_ms()
    if task.effective_status(now) == TaskStatus.EXPIRED:
        return json_response(status_document(task, now), 410)
    streams = rt.streams
    slot = streams.slots.acquire(member)
    if slot is None:
        raise TooManyRequests(f"at most {streams.slots.cap} open event streams per member; close one or retry later",
                              retry_after=FULL_RETRY_AFTER)
    stream = TaskStream(streams.hub, streams.slots, task_id, slot, rt.config.sse_heartbeat,
                        rt.config.sse_max_minutes * 60)
    try:
        snapshot, place = rt.service.snapshot_placed(task_id)  # after the watch: a change from now on reaches it
    except BaseException:
        stream.close()
        raise
    stream.stop_watching_client = on_hang_up(request.environ, stream.hang_up)
    stream.sock = direct_socket(request.environ)
    response = Response(stream.run(snapshot, last_id, place), content_type=EVENT_STREAM, headers=STREAM_HEADERS)
    response.call_on_close(stream.close)
    return response


def last_event_id() -> int | None:
    """The ``Last-Event-ID`` of a reconnecting client, None when absent; 422 when it is not an event id."""
    raw = request.headers.get(LAST_EVENT_ID, "").strip()
    if not raw:
        return None
    # isascii first: str.isdigit() is true for "²", which int() rejects; the length check keeps int()
    # away from its digit limit and the value within a Redis integer.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19 and int(raw) <= MAX_EVENT_ID):
        raise ValidationFailed({LAST_EVENT_ID: ["must be an event id this stream sent (an integer 0 to 2^63-1)"]})
    return int(raw)


def format_event(seq: int, doc: dict[str, Any]) -> bytes:
    """One ``status`` event. Compact JSON never contains a newline, so one ``data:`` line suffices."""
    return b"event: status\nid: %d\ndata: %s\n\n" % (seq, orjson.dumps(doc))


class TaskStream:
    """Follows one task through its watch, rendering each new state as an SSE event."""

    def __init__(self, hub: EventHub, slots: StreamSlots, task_id: str, slot: str, heartbeat: float,
                 lifetime: float) -> None:
        self.hub = hub
        self.slots = slots
        self.slot = slot
        self.watch: Watch | None = hub.watch(task_id)
        self.stop_watching_client: Callable[[], None] | None = None  # see app.web.webworker.on_hang_up
        # the client's gevent socket, when the hub may write to it (app.web.webworker.direct_socket)
        self.sock: Any = None
        self.sent = -1  # the seq the client has (-1: none yet)
        self.status: str | None = None  # the status of the last document sent
        self.current: Reading | None = None  # the read the stream stands on while it waits
        self.unsent = b""  # the rest of a chunk a push could not write at once
        self.heartbeat = max(heartbeat, MIN_INTERVAL)
        start = time.monotonic()
        self.end_at = start + max(lifetime, MIN_INTERVAL) * (1 - 0.1 * random.random())
        self._beat_at = start + self.heartbeat

    def hang_up(self) -> None:
        """The client closed the connection: end now (and give the slot back) rather than at a later write."""
        if self.watch is not None:
            self.watch.hang_up()

    def close(self) -> None:
        """Release the watch and the slot (safe to call more than once)."""
        if self.stop_watching_client is not None:
            self.stop_watching_client()
            self.stop_watching_client = None
        if self.watch is not None:
            self.hub.unwatch(self.watch)
            self.watch = None
            self.slots.release(self.slot)

    def run(self, snapshot: Task | None, last_id: int | None, place: Place | None = None) -> Iterator[bytes]:
        """The stream's chunks, starting from ``snapshot`` (``place``: its place in line); ends after the terminal
        event or at its lifetime."""
        try:
            yield from self._follow(snapshot, last_id, place)
        finally:
            self.close()

    def _follow(self, snapshot: Task | None, last_id: int | None, place: Place | None) -> Iterator[bytes]:
        reading = Reading(snapshot, place) if snapshot is not None else None
        self.sent, self.status = -1, None
        if snapshot is not None and last_id is not None and last_id <= snapshot.seq:
            self.sent = last_id
            if last_id == snapshot.seq:
                yield KEEP_ALIVE  # up to date: open the stream now rather than at the first change
        while reading is not None:  # None: the task is gone entirely (after its tombstone): just end
            task = reading.task
            shown, event = render(reading, now_ms())
            if task.seq > self.sent or (self.status is not None and shown != self.status):
                yield event
                self._beat_at = time.monotonic() + self.heartbeat
            self.sent, self.status = max(self.sent, task.seq), shown
            if self.status in FINAL:
                return
            reading = yield from self._wait(reading)

    def _wait(self, reading: Reading) -> Generator[bytes, None, Reading | None]:
        """Send keep-alives until there is something to render: a newer read of the task (None: gone),
        or the same read once its ``expires_at`` has passed. At the stream's lifetime it ends (None).
        Meanwhile the hub may write plain changes straight to the socket (:meth:`push`)."""
        watch = self.watch
        assert watch is not None
        self.current = reading
        while True:
            now = time.monotonic()
            if now >= self.end_at:
                yield RECONNECT
                return None
            if now >= self._beat_at:
                yield KEEP_ALIVE
                self._beat_at = now + self.heartbeat
            expires_in = (self.current.task.expires_at - now_ms()) / 1000
            if expires_in <= 0:
                return self.current
            if self.sock is not None:
                watch.push = self.push  # parked: the hub may write for us until we wake
            try:
                got, latest = watch.wait(min(self.end_at - now, self._beat_at - now, expires_in))
            finally:
                watch.push = None
            if self.unsent:  # what a push could not write at once: the rest of one chunk, written here
                rest, self.unsent = self.unsent, b""
                assert self.sock is not None
                self.sock.sendall(rest)
            if not got:
                continue
            if latest is None or latest.task.seq > self.sent or latest.task.status != self.current.task.status:
                return latest
            self.current = latest  # same state, maybe a new expires_at: wait with that one

    def push(self, reading: Reading) -> bool:
        """The hub's direct delivery while this stream is parked in :meth:`_wait` (gevent only): a newer,
        non-final state is written to the socket as one HTTP chunk, without waking the stream's greenlet
        or passing through Flask and gunicorn's response; the bytes are rendered once for every stream
        of the read. False: the stream wakes and handles the read itself (anything but a plain change,
        a full socket buffer, a socket error)."""
        shown, event = render(reading, now_ms())
        if reading.task.seq <= self.sent or shown in FINAL or self.sock is None:
            return False
        chunk = reading.chunk(event)
        try:
            written = self.sock.send(chunk, 0, timeout=0.0)  # gevent: never waits, so the hub never blocks
        except BlockingIOError:
            written = 0
        except OSError:
            return False  # a dead connection: the stream's own write then fails and ends it
        self.sent, self.status, self.current = reading.task.seq, shown, reading
        self._beat_at = time.monotonic() + self.heartbeat
        if written < len(chunk):
            self.unsent = chunk[written:]
            return False
        return True


def render(reading: Reading, now: int) -> tuple[str, bytes]:
    """(status shown, event bytes) of a read: rendered once per read and status, however many streams
    share it (the status shown changes only when ``expires_at`` passes)."""
    cached = reading.rendered
    if cached is not None and cached[0] == reading.task.effective_status(now):
        return cached
    doc = status_document(reading.task, now, reading.place)
    reading.rendered = (doc["status"], format_event(reading.task.seq, doc))
    return reading.rendered
