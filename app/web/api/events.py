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

A task's live output (``ctx.emit``, app.core.output) goes on the same stream: ``event: output`` with one line
object ``{"id", "at", "text"}`` as data, oldest first. Once a stream has sent output its ids are
``<seq>-<line id>`` (before: ``<seq>``, as ever), and one ``Last-Event-ID`` resumes both: states after
``seq``, lines after ``line id``. A plain integer resumes the status as before and sends every line kept; a
line id beyond the task's last is ignored (every line kept is sent). A status event that is not final comes
before the lines that arrived with it; the final one comes after every line, so a stream that ended has sent
them all. The hub reads new lines once for every stream of the task; a stream behind it (opened with an old
id, or slow) reads its own catch-up, a page at a time; a Redis error in that read ends the stream with
``: reconnect`` (the client resumes from its id and misses nothing).

With gunicorn's gevent worker (the default) an open stream costs a greenlet and a watch, not a
thread or a Redis connection; a second greenlet notices at once when the client closes the
connection (:func:`app.web.webworker.on_hang_up`). Its slot and watch are released however it ends
(generator ``finally`` plus ``call_on_close`` for a response that is closed before its first chunk).
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import Any

import orjson
import redis
from flask import Blueprint, Response, request

from app.core.clock import now_ms
from app.core.lines import Place
from app.core.output import ID_DIGITS, MAX_PAGE, Line, parse_id
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
FULL_RETRY_AFTER = 10  # seconds: a hint for a member at its stream cap (streams end as tasks end)
LAST_EVENT_ID = "Last-Event-ID"


@bp.get("/tasks/<task_id>/events")
def events(task_id: str) -> Response:
    """Stream the task's status documents until it ends; 404/410 (before streaming) as for status."""
    last_id = task_event_id()
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
    # away from its digit limit and the value within a Redis integer, as the document's pattern says.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= ID_DIGITS):
        raise ValidationFailed({LAST_EVENT_ID: [f"must be an event id this stream sent (at most {ID_DIGITS} digits)"]})
    return int(raw)


def task_event_id() -> tuple[int, int] | None:
    """A task stream's ``Last-Event-ID`` as (status seq, output line id): ``<seq>`` or ``<seq>-<line id>`` (a plain
    integer has line id 0); None when absent; 422 naming the header when it is not an id a stream sent."""
    raw = request.headers.get(LAST_EVENT_ID, "").strip()
    seq_part, dash, line_part = raw.partition("-")
    if not dash:
        seq = last_event_id()
        return None if seq is None else (seq, 0)
    seq, line = parse_id(seq_part), parse_id(line_part)
    if seq is None or line is None:
        raise ValidationFailed({LAST_EVENT_ID: ["must be an event id this stream sent"]})
    return seq, line


def event_id(seq: int, line: int) -> bytes:
    """A task stream's event id: ``<seq>`` until it has sent output, then ``<seq>-<line id>``."""
    return b"%d-%d" % (seq, line) if line else b"%d" % seq


def format_event(seq: int, doc: dict[str, Any], line: int = 0) -> bytes:
    """One ``status`` event. Compact JSON never contains a newline, so one ``data:`` line suffices."""
    return b"event: status\nid: %s\ndata: %s\n\n" % (event_id(seq, line), orjson.dumps(doc))


def format_line(seq: int, line: Line) -> bytes:
    """One ``output`` event: the line object (a line's text holds no newline: app.core.output.split)."""
    return b"event: output\nid: %s\ndata: %s\n\n" % (event_id(seq, line.id), orjson.dumps(line.doc()))


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
        self.line = 0  # the id of the last output line the client has
        self.pending: list[Line] = []  # lines the hub delivered beyond the read being rendered
        self.output = hub.output
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

    def run(self, snapshot: Task | None, last_id: int | tuple[int, int] | None,
            place: Place | None = None) -> Iterator[bytes]:
        """The stream's chunks, starting from ``snapshot`` (``place``: its place in line); ends after the terminal
        event or at its lifetime. ``last_id``: the client's (status seq, output line id), or a plain seq."""
        try:
            yield from self._follow(snapshot, (last_id, 0) if isinstance(last_id, int) else last_id, place)
        except redis.RedisError:  # a catch-up read of output: the client resumes from the last id it got
            yield RECONNECT
        finally:
            self.close()

    def _follow(self, snapshot: Task | None, last_id: tuple[int, int] | None,
                place: Place | None) -> Iterator[bytes]:
        reading = Reading(snapshot, place=place) if snapshot is not None else None
        self.sent, self.status, self.line = -1, None, 0
        if snapshot is not None and last_id is not None:
            seq, line = last_id
            self.line = line if line <= snapshot.output_last else 0  # another task's line id: send them all
            if seq <= snapshot.seq:
                self.sent = seq
                if seq == snapshot.seq and self.line == snapshot.output_last:
                    yield KEEP_ALIVE  # up to date: open the stream now rather than at the first change
        while reading is not None:  # None: the task is gone entirely (after its tombstone): just end
            task = reading.task
            shown = task.effective_status(now_ms())
            due = task.seq > self.sent or (self.status is not None and shown != self.status)
            if due and shown not in FINAL:  # before the lines that came with it (their ids name its seq)
                yield render(reading, now_ms(), self.line)[1]
                self._beat_at = time.monotonic() + self.heartbeat
                self.sent, self.status = max(self.sent, task.seq), shown
            yield from self._lines(task)
            if due and shown in FINAL:  # after every line: a stream that ended sent them all
                yield render(reading, now_ms(), self.line)[1]
                self._beat_at = time.monotonic() + self.heartbeat
            self.sent, self.status = max(self.sent, task.seq), shown
            if self.status in FINAL:
                return
            reading = yield from self._wait(reading)

    def _lines(self, task: Task) -> Iterator[bytes]:
        """Output events for the lines after the client's up to ``task.output_last``: those the hub delivered,
        and any it did not (this stream was behind it) read here, a page at a time. Lines trimmed meanwhile
        are skipped: the next one sent is the oldest kept."""
        target = task.output_last
        assert self.watch is not None
        delivered = [line for line in (*self.pending, *self.watch.take_lines()) if line.id > self.line]
        self.pending = [line for line in delivered if line.id > target]
        queue = deque(line for line in delivered if line.id <= target)
        while self.line < target:
            if queue and queue[0].id == self.line + 1:
                line = queue.popleft()
            else:  # a gap before the next delivered line (or none delivered): read it
                upto = queue[0].id - 1 if queue else target
                page = self.output.page(task.id, self.line, MAX_PAGE)
                read = [line for line in page.lines if line.id <= upto]
                if not read:
                    self.line = upto  # gone (trimmed, or emptied by a run again)
                    continue
                queue.extendleft(reversed(read))
                continue
            yield format_line(max(self.sent, 0), line)
            self.line = line.id
            self._beat_at = time.monotonic() + self.heartbeat

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
            if latest is None or latest.task.seq > self.sent or latest.task.status != self.current.task.status \
                    or latest.task.output_last > self.line:
                return latest
            self.current = latest  # same state, maybe a new expires_at: wait with that one

    def push(self, reading: Reading) -> bool:
        """The hub's direct delivery while this stream is parked in :meth:`_wait` (gevent only): a newer,
        non-final state is written to the socket as one HTTP chunk, without waking the stream's greenlet
        or passing through Flask and gunicorn's response; the bytes are rendered once for every stream
        of the read. False: the stream wakes and handles the read itself (anything but a plain change,
        a full socket buffer, a socket error)."""
        if reading.task.output_last > self.line or self.pending or (self.watch is not None and self.watch.has_lines):
            return False  # output to send first: the stream wakes and sends it in order
        shown, event = render(reading, now_ms(), self.line)
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


def render(reading: Reading, now: int, line: int = 0) -> tuple[str, bytes]:
    """(status shown, event bytes) of a read, its id naming output ``line``: rendered once per read, status and
    line, however many streams share it (the status shown changes only when ``expires_at`` passes; streams that
    are up to date have the same line)."""
    cached = reading.rendered
    if cached is not None and cached[0] == reading.task.effective_status(now) and cached[1] == line:
        return cached[0], cached[2]
    doc = status_document(reading.task, now, reading.place)
    reading.rendered = (doc["status"], line, format_event(reading.task.seq, doc, line))
    return doc["status"], reading.rendered[2]
