"""Live task changes for every open event stream of one web process, and the per-member cap on streams.

:class:`EventHub` holds **one** pub/sub connection per web process, pattern-subscribed to every
task's events channel (``keys.events("*")``), whatever number of streams is open. When a task's
``seq`` is announced it reads the task **once** (one pipeline for every task announced in the same
batch) and hands the :class:`~app.core.task.Task` to each :class:`Watch` of that task; a stream sleeps on
its watch and renders what it is handed. So 1,000 watchers of one task cost one HGETALL per change
and one Redis connection, not 1,000 of each.

Why a pattern subscription and not SUBSCRIBE per watched channel: it is set up once, before any
stream reads its snapshot, so no change can fall between a stream's snapshot and its first
message, and streams never wait for a subscription round trip. The price is that every web process
receives every task's announcements (a few bytes each, at most ~2 per second per running task with
the default progress interval); a deployment with thousands of concurrently *running* tasks per
web process would switch to per-channel subscriptions.

A task's live output (app.core.output) rides on the same channel: an emit announces ``o<line id>`` without a
new ``seq``. For a task whose ``output_last`` moved, the hub also reads the new lines once (one pipeline for
every such task) and hands them with the read (:attr:`Reading.lines`); each watch queues them
(:meth:`Watch.take_lines`). The hub reads from where it last read for that task, so a stream behind that
(one just opened with an old ``Last-Event-ID``, or one whose queue overflowed) reads its own catch-up
(app.web.api.events).

Pub/sub is fire-and-forget, so the hub also re-reads every watched task every ``TASKPORT_SSE_POLL``
seconds (one pipeline per process, not one read per stream), and after every (re)connection.

Redis going away: the hub's reads fail, it closes its connection and reconnects with exponential
backoff (redis-py's :class:`~redis.backoff.ExponentialBackoff`); open streams stay open and keep
sending keep-alive comments; once Redis answers again the hub re-subscribes, re-reads every
watched task and the streams carry on. No request thread or greenlet ever blocks on Redis for a
stream after it started.

:class:`StreamSlots` counts the open streams of each member across every web process in a Redis
sorted set (``keys.streams(member)``: one entry per stream, scored by when its lease runs out).
Opening a stream adds an entry and counts in one MULTI; the hub renews its process's leases every
third of ``keys.STREAM_LEASE_MS``; a stream that ends removes its entry; a killed process's entries
are dropped once their lease has run out (the next open of that member purges them).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import redis
from redis.backoff import ExponentialBackoff

from app.core import keys
from app.core.clock import now_ms
from app.core.lines import Place
from app.core.output import MAX_PAGE, Line, OutputLog
from app.core.store import TaskStore
from app.core.task import Task

log = logging.getLogger(__name__)

BATCH = 500  # tasks read per pipeline; messages drained per wake-up
BACKOFF = ExponentialBackoff(cap=5.0, base=0.1)  # seconds between reconnection attempts: 0.1, 0.2 ... 5
MIN_INTERVAL = 0.01  # seconds: a floor for the configured intervals, so a zero never busy-loops
# seconds the hub keeps collecting announcements after the first one before it reads and delivers:
# changes that land together cost one pipeline and one wake-up of each stream (measured in bench/README.md)
COALESCE = 0.05


# output lines a watch queues at most: a stream further behind reads its own catch-up (app.web.api.events)
WATCH_LINES = 5000


class Reading:
    """One read of a task, shared by every watch of that task: a stream renders it once for all of them."""

    __slots__ = ("task", "place", "rendered", "_chunk", "lines")

    def __init__(self, task: Task, lines: Sequence[Line] = (), place: Place | None = None) -> None:
        self.task = task
        self.lines = lines  # output lines the hub read with it, oldest first, ids up to task.output_last
        self.place = place  # where it waits in line (app.core.lines): a stream's first read only
        # (status shown, the output line id the event's id names, event bytes), set by the first stream
        self.rendered: tuple[str, int, bytes] | None = None
        self._chunk: tuple[bytes, bytes] | None = None  # (event, its HTTP/1.1 chunk)

    def chunk(self, event: bytes) -> bytes:
        """``event`` framed as one HTTP/1.1 chunk, as gunicorn frames a response's writes; framed once
        for every stream that is handed this read."""
        if self._chunk is None or self._chunk[0] is not event:
            self._chunk = (event, b"%X\r\n%s\r\n" % (len(event), event))
        return self._chunk[1]


class Watch:
    """One open stream's mailbox: the newest read of its task (coalesced) and a wake-up flag."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self._news = threading.Event()
        self._latest: Reading | None = None
        self._lines: deque[Line] = deque(maxlen=WATCH_LINES)  # output lines delivered, not yet taken
        self.hung_up = False
        # set while the stream waits and may be written to directly (app.web.api.events.TaskStream.push):
        # True when it took the read, so the stream need not wake
        self.push: Callable[[Reading], bool] | None = None

    def hang_up(self) -> None:
        """The client went away: the stream ends at its next wake-up (now)."""
        self.hung_up = True
        self._news.set()

    def take_lines(self) -> list[Line]:
        """The output lines delivered since the last call, oldest first (a gap where the queue overflowed)."""
        taken = []
        while self._lines:
            taken.append(self._lines.popleft())
        return taken

    @property
    def has_lines(self) -> bool:
        return bool(self._lines)

    def deliver(self, reading: Reading | None) -> None:
        """The hub's latest read of the task (None: the task is gone entirely)."""
        if reading is not None and reading.lines:
            self._lines.extend(reading.lines)
        if reading is not None and self.push is not None:
            if self.push(reading):
                return
            self.push = None  # refused: the stream wakes and takes every read itself until it waits again
        if reading is None or self._latest is None or reading.task.seq >= self._latest.task.seq:
            self._latest = reading
        self._news.set()

    def wait(self, timeout: float) -> tuple[bool, Reading | None]:
        """(True, latest read) once something was delivered, (False, None) after ``timeout`` s."""
        if not self._news.wait(max(timeout, 0.0)):
            return False, None
        self._news.clear()
        return True, None if self.hung_up else self._latest


class StreamSlots:
    """Open streams per member, counted in Redis across every web process (see the module docstring): the
    owner of ``keys.streams(member)``, a sorted set of slot id -> when its lease runs out."""

    def __init__(self, conn: redis.Redis, cap: int) -> None:
        self.redis = conn
        self.cap = cap
        self._mine: dict[str, str] = {}  # slot id -> member, of this process's open streams
        self._lock = threading.Lock()

    def acquire(self, member: str) -> str | None:
        """A slot id for a new stream of ``member``, or None when the member already holds ``cap``."""
        slot = f"{os.getpid()}:{uuid.uuid4().hex}"
        count = self._open(member, slot)
        if count > self.cap:  # added first, then counted: of two racing opens at the cap the later one yields
            self._close(member, slot)
            return None
        with self._lock:
            self._mine[slot] = member
        return slot

    def release(self, slot: str) -> None:
        """Give the slot back (a second call does nothing; a Redis outage leaves it to its lease)."""
        with self._lock:
            member = self._mine.pop(slot, None)
        if member is None:
            return
        try:
            self._close(member, slot)
        except redis.RedisError as exc:
            log.info("stream slot of %s left to expire: redis error: %s", member, exc)

    def renew(self) -> None:
        """Push the lease of every slot this process holds (raises RedisError when Redis is away)."""
        with self._lock:
            held = list(self._mine.items())
        if not held:
            return
        until = now_ms() + keys.STREAM_LEASE_MS
        pipe = self.redis.pipeline(transaction=False)
        for slot, member in held:
            pipe.zadd(keys.streams(member), {slot: until}, xx=True)  # XX: never revive a slot released meanwhile
        for member in {m for _, m in held}:
            pipe.pexpire(keys.streams(member), keys.STREAM_LEASE_MS)
        pipe.execute()

    def _open(self, member: str, slot: str) -> int:
        """Count an open stream of ``member`` (leased for ``keys.STREAM_LEASE_MS``, expired leases dropped
        first); returns how many the member holds now, this one included (one transaction)."""
        now = now_ms()
        key = keys.streams(member)
        pipe = self.redis.pipeline(transaction=True)
        pipe.zremrangebyscore(key, "-inf", now)  # leases of processes that died without releasing
        pipe.zadd(key, {slot: now + keys.STREAM_LEASE_MS})
        pipe.zcard(key)
        pipe.pexpire(key, keys.STREAM_LEASE_MS)
        return int(pipe.execute()[2])

    def _close(self, member: str, slot: str) -> None:
        self.redis.zrem(keys.streams(member), slot)


class EventHub:
    """One pub/sub connection per web process, fanning task changes out to the open streams' watches.

    Its thread (a greenlet under gevent) starts with the first watch and ends soon after the last one.
    """

    def __init__(self, conn: redis.Redis, store: TaskStore, slots: StreamSlots, poll: float,
                 coalesce: float = COALESCE) -> None:
        self.redis = conn  # for its one pub/sub connection; the tasks are read through ``store``
        self.store = store
        self.slots = slots
        self.poll = max(poll, MIN_INTERVAL)
        self.coalesce = max(coalesce, 0.0)
        self._watches: dict[str, set[Watch]] = {}
        self.output = OutputLog.of(store)
        self._output_read: dict[str, int] = {}  # task id -> the last output line id the hub read of it
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._failures = 0
        self._down_since = 0.0

    # -- streams' side ----------------------------------------------------------------------------
    def watch(self, task_id: str) -> Watch:
        """Register a watch of the task (before reading its snapshot, so no change is missed)."""
        w = Watch(task_id)
        with self._lock:
            self._watches.setdefault(task_id, set()).add(w)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="taskport-event-hub", daemon=True)
                self._thread.start()
        return w

    def unwatch(self, w: Watch) -> None:
        with self._lock:
            watches = self._watches.get(w.task_id)
            if watches is not None:
                watches.discard(w)
                if not watches:
                    del self._watches[w.task_id]
                    self._output_read.pop(w.task_id, None)

    @property
    def watching(self) -> int:
        """Open watches in this process."""
        with self._lock:
            return sum(len(ws) for ws in self._watches.values())

    # -- the hub's thread -------------------------------------------------------------------------
    def _idle(self) -> bool:
        """True (and the thread is forgotten) when nothing is watched: the thread then ends."""
        with self._lock:
            if self._watches:
                return False
            self._thread = None
            return True

    def _run(self) -> None:
        while not self._idle():
            try:
                self._serve()
            except redis.RedisError as exc:
                self._failures += 1
                if self._failures == 1:
                    self._down_since = time.monotonic()
                    log.warning("event hub: redis unavailable (%s); streams stay open, reconnecting", exc)
                time.sleep(BACKOFF.compute(self._failures))
            except Exception:  # a bug, not an outage: say so loudly, but keep the process's streams served
                log.exception("event hub: unexpected error; restarting it")
                time.sleep(BACKOFF.compute(1))

    def _serve(self) -> None:
        """Subscribe, catch up every watch, then deliver announced changes until idle or a Redis error."""
        pubsub = self.redis.pubsub()
        pubsub.psubscribe(keys.events("*"))  # every task's events channel
        try:
            self._read_and_deliver(self._watched())  # whatever changed while unsubscribed
            if self._failures:
                log.info("event hub: redis is back after %.1f s; streams resumed", time.monotonic() - self._down_since)
                self._failures = 0
            next_poll, next_renew = time.monotonic() + self.poll, time.monotonic() + keys.STREAM_LEASE_MS / 3000
            while not self._idle():
                now = time.monotonic()
                announced = self._drain(pubsub, min(next_poll, next_renew) - now)
                now = time.monotonic()
                if now >= next_poll:
                    announced, next_poll = self._watched(), now + self.poll
                self._read_and_deliver(announced)
                if now >= next_renew:
                    self.slots.renew()
                    next_renew = now + keys.STREAM_LEASE_MS / 3000
        finally:
            pubsub.close()

    def _drain(self, pubsub: redis.client.PubSub, timeout: float) -> set[str]:
        """Task ids announced within ``timeout`` s (the first wait), plus those announced in the
        ``coalesce`` s after the first one (or already queued behind it)."""
        announced: set[str] = set()
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=max(timeout, 0.0))
        until = time.monotonic() + self.coalesce
        while message is not None and len(announced) < BATCH:
            if message.get("type") == "pmessage":
                task_id = keys.events_task_id(message["channel"])
                if task_id is not None:
                    announced.add(task_id)
            message = pubsub.get_message(ignore_subscribe_messages=True, timeout=max(until - time.monotonic(), 0.0))
        return announced

    def _watched(self) -> set[str]:
        with self._lock:
            return set(self._watches)

    def _read_and_deliver(self, task_ids: Iterable[str]) -> None:
        with self._lock:
            wanted = [t for t in task_ids if t in self._watches]
        for i in range(0, len(wanted), BATCH):
            batch = wanted[i:i + BATCH]
            tasks = self.store.get_many(batch)
            lines = self._new_lines([t for t in tasks if t is not None])
            for task_id, task in zip(batch, tasks, strict=True):
                reading = Reading(task, lines.get(task_id, ())) if task is not None else None
                with self._lock:
                    watches = list(self._watches.get(task_id, ()))
                for w in watches:
                    w.deliver(reading)


    def _new_lines(self, tasks: list[Task]) -> dict[str, list[Line]]:
        """The output lines of ``tasks`` after those the hub read last (pages in one pipeline a round, until each
        reaches the task's ``output_last`` as read). A task read for the first time starts where it is: its
        streams read what came before themselves."""
        found: dict[str, list[Line]] = {}
        behind: dict[str, int] = {}
        with self._lock:
            for task in tasks:
                read = self._output_read.get(task.id)
                if read is None or read > task.output_last:  # first read, or a task that is another one now
                    self._output_read[task.id] = task.output_last
                elif read < task.output_last:
                    behind[task.id] = task.output_last
        while behind:
            with self._lock:
                wanted = [(t, self._output_read.get(t, last), MAX_PAGE) for t, last in behind.items()]
            for (task_id, _, _), page in zip(wanted, self.output.pages(wanted), strict=True):
                target = behind[task_id]
                got = [line for line in page.lines if line.id <= target]
                found.setdefault(task_id, []).extend(got)
                reached = target  # a short page read to the end; lines missing below target were trimmed
                if len(page.lines) == MAX_PAGE and got and got[-1].id < target:
                    reached = got[-1].id  # a full page: the next one follows on
                with self._lock:
                    if task_id in self._output_read:
                        self._output_read[task_id] = reached
                if reached >= target:
                    del behind[task_id]
        return found


class Streams:
    """The web process's hub and slot counter, built once per app (:meth:`app.web.runtime.Runtime.build`)."""

    def __init__(self, conn: redis.Redis, store: TaskStore, cap: int, poll: float) -> None:
        self.slots = StreamSlots(conn, cap)
        self.hub = EventHub(conn, store, self.slots, poll)
