"""A Python client of the taskport HTTP API (``/api/v1``), importable without Flask or Redis.

    from taskport import Client, TaskFailed

    with Client("http://127.0.0.1:8000", api_key=None) as tp:
        task = tp.submit("orders.split", {"order_code": "SO-1", "items": [...]})
        try:
            done = tp.wait(task["task_id"], timeout=120)       # the result document
        except TaskFailed as exc:
            print(exc.code, exc.message)                        # e.g. 10001: bill unpaid
        else:
            if done["error_code"] == 10001: ...                # partial failure, see docs/api.md

A backend that holds the key can hand a frontend (or another program) a read token for one task instead:

    token = tp.read_token(task["task_id"], ttl=600)["token"]      # or submit(..., read_token=True)
    with Client("http://127.0.0.1:8000", token=token) as reader:  # may read that task, and nothing else
        reader.wait(task["task_id"], on_output=lambda line: print(line["text"]))

Documents are returned as the plain JSON dicts of docs/api.md (status document, result document).
Errors are the typed exceptions of :mod:`taskport.errors`. The schedule and batch calls are mixed in from
modules of their own (:mod:`taskport.schedules`, :mod:`taskport.batches`).

Why httpx (and httpx-sse): one well-kept library gives a sync client with connection pooling, per-
phase timeouts and response streaming, which the event stream and file downloads need; httpx-sse
(by an httpx maintainer) parses ``text/event-stream`` so this module does not carry its own parser.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.message import Message
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote

import httpx
import httpx_sse

from taskport.batches import BatchCalls, Callback, callback_body  # submit_batch, batch ... (their own module)
from taskport.errors import (
    ENDED,
    Doc,
    DuplicateTask,
    ProblemError,
    ServiceUnreachable,
    StillRunning,
    StreamFailed,
    TaskExpired,
    TaskportError,
    Unavailable,
    problem_class,
)
from taskport.schedules import ScheduleCalls  # create_schedule, list_schedules ... (their own module)
from taskport.settings import ClientSettings
from taskport.states import ACTIVE, STORED, TaskStatus

API = "/api/v1"
TERMINAL = frozenset(s.value for s in STORED - ACTIVE)  # a document with one of these is the task's last
DEFAULT_POLL = 1.0  # seconds between polls when the service gives no Retry-After
# Longest silence tolerated on an event stream: the service sends a keep-alive at least every 15 s.
STREAM_READ_TIMEOUT = 45.0
STREAM_RECONNECTS = 3  # consecutive failed (re)connections before the stream is given up
HISTORY_PAGE = 50
OUTPUT_EVENT = "output"  # the event of a task's stream that carries one line of its output
OUTPUT_PAGE = 1000  # lines per GET /tasks/{id}/output: the service's largest page


@dataclass(frozen=True)
class Event:
    """One event of a stream (``status`` of a task's, ``batch`` of a batch's, and ``output`` when asked for):
    its ``id`` (what ``Last-Event-ID`` resumes from: the write sequence, a number, or an opaque text once a
    task has output), the document (of an ``output`` event, the line ``{"id", "at", "text"}``) and its
    ``event``."""

    id: int | str | None
    doc: Doc
    event: str = "status"


class Client(BatchCalls, ScheduleCalls):
    """A session with one taskport service. ``url`` and ``api_key`` default to ``TASKPORT_URL`` and
    ``TASKPORT_API_KEY`` (see :mod:`taskport.settings`); ``timeout`` bounds each ordinary request.
    ``token``: a read token (:meth:`read_token`) sent instead of any key, for a program that may only read
    one task (or one batch): its status, events, result, file and output. Close it, or use it as a context
    manager."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        settings = ClientSettings.from_env()  # each of url and api_key defaults to its variable
        self.url = (url or settings.url).rstrip("/")
        api_key = api_key if api_key is not None else settings.api_key
        self.timeout = timeout
        self._sleep = sleep
        self._clock = clock
        headers = {"Accept": "application/json", "User-Agent": "taskport-client"}
        credential = token or api_key  # a token given is what this session may do, whatever the key
        if credential:
            headers["Authorization"] = f"Bearer {credential}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- plain requests ---------------------------------------------------------------------------

    def submit(self, type: str, payload: dict[str, Any] | None = None, *, idempotency_key: str | None = None,
               priority: str | None = None, run_at: str | datetime | None = None, delay: float | None = None,
               after: Sequence[str] | None = None, callback: Callback | None = None,
               read_token: bool = False) -> Doc:
        """Submit a task; returns its status document (PENDING). A duplicate within the dedup window
        raises :class:`DuplicateTask`, whose ``existing`` is the earlier task's status document.

        ``run_at`` (an ISO 8601 time, or an aware datetime) or ``delay`` (seconds): it runs then, PENDING
        with ``run_at`` until then. ``after`` (task ids of yours): it runs once they all COMPLETED, PENDING
        with ``waiting_for`` until then, FAILED -6 if one of them ends otherwise. ``callback``: a URL, or
        ``{"url": ..., "events": [...]}``, the service POSTs the status document to (signed) when the task
        ends in one of ``events`` (default all four terminal statuses); a URL it may not call is
        :class:`InvalidRequest` naming ``callback.url``. ``read_token``: the answer also carries
        ``read_token`` (``{"token", "expires_at"}``, as :meth:`read_token` makes) to hand a frontend."""
        body: dict[str, Any] = {"type": type, "payload": payload if payload is not None else {}}
        if priority:
            body["priority"] = priority
        if run_at is not None:
            body["run_at"] = run_at.isoformat() if isinstance(run_at, datetime) else run_at
        if delay is not None:
            body["delay"] = delay
        if after is not None:
            body["after"] = list(after)
        if callback is not None:
            body["callback"] = callback_body(callback)
        if read_token:
            body["read_token"] = True
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        response = self._request("POST", f"{API}/tasks", json=body, headers=headers)
        if response.status_code == 202:
            return _json(response)
        self._raise(response)

    def status(self, task_id: str) -> Doc:
        """The task's status document (an EXPIRED one too: the service answers it with 410)."""
        return self._status(task_id)[0]

    def result(self, task_id: str) -> Doc:
        """The result document of a COMPLETED task (``result``, ``items``, ``failures``, ``error_code``).

        Raises :class:`StillRunning` while it runs, :class:`TaskFailed` (with the task's ``code``) or
        :class:`TaskCancelled` once it ended without a result, :class:`TaskExpired` once expired.
        """
        response = self._request("GET", _task_path(task_id, "/result"))
        if response.status_code == 200:
            return _json(response)
        self._no_result(task_id, response)

    def download(self, task_id: str, dest: str | os.PathLike[str]) -> Path:
        """Save a COMPLETED task's result file to ``dest`` (a file path, or a directory to keep the
        file's own name in) and return the path written. The bytes are streamed to a temporary file
        beside it and renamed into place, so ``dest`` never holds half a file. Raises as :meth:`result`."""
        with self._http.stream("GET", _task_path(task_id, "/result/file")) as response:
            if response.status_code != 200:
                response.read()
                self._no_result(task_id, response)
            target = Path(dest)
            if target.is_dir():
                target = target / _attachment_name(response, task_id)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
            try:
                with os.fdopen(fd, "wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return target

    def output(self, task_id: str, after: str | None = None, *, limit: int | None = None) -> Doc:
        """One page of the task's output lines, oldest first: ``{"lines": [{"id", "at", "text"}], "next"}``,
        the lines after the line ``after`` (an id from an earlier page; None: from the first). Pass ``next``
        back as ``after``; it is None once the task has ended and every line was served."""
        params: dict[str, Any] = {}
        if after is not None:
            params["after"] = after
        if limit is not None:
            params["limit"] = limit
        response = self._request("GET", _task_path(task_id, "/output"), params=params)
        if response.status_code == 200:
            return _json(response)
        if response.status_code == 410:
            raise TaskExpired(task_id, _json(response))
        self._raise(response)

    def read_token(self, task_id: str, ttl: int | None = None) -> Doc:
        """A read token for the task: ``{"token", "expires_at"}``, valid ``ttl`` seconds (1 to 86,400; the
        service's default 3,600). Whoever holds it may read that task (status, events, result, file, output)
        and nothing else: hand it to a page instead of the key. An EXPIRED task raises :class:`TaskExpired`."""
        response = self._request("POST", _task_path(task_id, "/tokens"), json=_ttl_body(ttl))
        if response.status_code == 410:
            raise TaskExpired(task_id, _json(response))
        return self._created(response)

    def batch_read_token(self, batch_id: str, ttl: int | None = None) -> Doc:
        """A read token for the batch, as :meth:`read_token`: it reads the batch document, its tasks, its events,
        and every document of its tasks."""
        path = f"{API}/batches/{quote(str(batch_id), safe='')}/tokens"
        return self._created(self._request("POST", path, json=_ttl_body(ttl)))

    def cancel(self, task_id: str) -> None:
        """Cancel a PENDING or PROCESSING task. An ended task raises :class:`Conflict` (``task_status``)."""
        response = self._request("DELETE", _task_path(task_id))
        if response.status_code != 204:
            self._raise(response)

    def retry(self, task_id: str) -> Doc:
        """Run a FAILED or CANCELLED task again under its own id; returns its status document (PENDING).
        Any other state raises :class:`Conflict` (``task_status``), an EXPIRED task :class:`TaskExpired`."""
        response = self._request("POST", _task_path(task_id, "/retry"))
        if response.status_code == 202:
            return _json(response)
        if response.status_code == 410:
            raise TaskExpired(task_id, _json(response))
        self._raise(response)

    def history(self, *, status: str | None = None, type: str | None = None,
                page_size: int = HISTORY_PAGE) -> Iterator[Doc]:
        """The member's tasks, newest first, following ``next_cursor`` page after page lazily."""
        params: dict[str, Any] = {"limit": page_size}
        if status:
            params["status"] = status
        if type:
            params["type"] = type
        while True:
            response = self._request("GET", f"{API}/tasks", params=params)
            if response.status_code != 200:
                self._raise(response)
            page = _json(response)
            yield from page["tasks"]
            if not page.get("next_cursor"):
                return
            params["cursor"] = page["next_cursor"]

    # -- following a task -------------------------------------------------------------------------

    def events(self, task_id: str, last_event_id: int | str | None = None, *,
               reconnects: int = STREAM_RECONNECTS, output: bool = False) -> Iterator[Event]:
        """The task's Server-Sent Events, until its terminal (or EXPIRED) event.

        A dropped connection is reopened with ``Last-Event-ID`` (the id of the last event received), so
        the service sends only what changed since; after ``reconnects`` consecutive failures
        :class:`StreamFailed` is raised. An expired task yields its EXPIRED document once. With ``output``
        the task's output lines come too, as events ``output`` (the line as ``doc``).
        """
        yield from self._stream(_task_stream(task_id, output), last_event_id, reconnects, None, lambda: None)

    def follow(self, task_id: str, *, timeout: float | None = None, max_attempts: int | None = None,
               sse: bool = True, on_output: Callable[[Doc], None] | None = None) -> Iterator[Doc]:
        """Status documents of the task as it changes, ending with its terminal one.

        The event stream first (when ``sse``); if it cannot be opened or keeps failing, polling that
        waits as the service's ``Retry-After`` says. Every poll and every stream connection is an
        attempt; after ``max_attempts`` attempts, or ``timeout`` seconds, :class:`StillRunning` is
        raised: the task may still finish, check later. With neither limit it follows to the end.

        ``on_output`` sees each line of the task's output once, in order (``{"id", "at", "text"}``): from
        the stream as they come, read from :meth:`output` after each poll, and the rest before the
        terminal document is yielded.
        """
        lines = None if on_output is None else _Output(lambda after: self.output(task_id, after), on_output)
        yield from self._follow(_task_stream(task_id, lines is not None), lambda: self._status(task_id),
                                timeout=timeout, max_attempts=max_attempts, sse=sse, lines=lines)

    def wait(self, task_id: str, *, timeout: float | None = None, max_attempts: int | None = None,
             sse: bool = False, on_update: Callable[[Doc], None] | None = None,
             on_output: Callable[[Doc], None] | None = None) -> Doc:
        """Wait for the task to end and return its result document (as :meth:`result`).

        Polls (honouring ``Retry-After``) unless ``sse``; ``on_update`` sees every status document, and
        ``on_output`` every output line (as :meth:`follow`).
        Raises :class:`TaskFailed` (``code``: the business or service code), :class:`TaskCancelled`,
        :class:`TaskExpired`, or :class:`StillRunning` when ``timeout``/``max_attempts`` ran out.
        """
        last: Doc = {}
        for doc in self.follow(task_id, timeout=timeout, max_attempts=max_attempts, sse=sse, on_output=on_output):
            last = doc
            if on_update is not None:
                on_update(doc)
        if last["status"] == TaskStatus.COMPLETED:
            return self.result(task_id)
        raise ENDED[last["status"]](task_id, last)

    # -- internals --------------------------------------------------------------------------------

    def _follow(self, stream: Stream, read: Callable[[], tuple[Doc, float | None]], *, timeout: float | None,
                max_attempts: int | None, sse: bool, lines: _Output | None = None) -> Iterator[Doc]:
        """What :meth:`follow` does, for any stream (a task's, a batch's): ``read`` is its one status read,
        ``lines`` the output lines to hand on (a task's, when asked for)."""
        stop_at = None if timeout is None else self._clock() + timeout
        watch = _Watch(stream.id, max_attempts, stop_at, self._clock, stream.kind)
        if sse:
            try:
                for event in self._stream(stream, None, STREAM_RECONNECTS, stop_at, watch.attempt):
                    if event.event == OUTPUT_EVENT and lines is not None:
                        lines.line(event.doc)
                        continue
                    watch.last = event.doc
                    if stream.ends(event.doc) and lines is not None:
                        lines.catch_up(event.doc)
                    yield event.doc
                    if stream.ends(event.doc):
                        return
                    watch.check_time()
            except StreamFailed:
                pass  # fall back to polling below
            watch.check_time()
        yield from self._poll(stream, read, watch, lines)

    def _poll(self, stream: Stream, read: Callable[[], tuple[Doc, float | None]], watch: _Watch,
              lines: _Output | None = None) -> Iterator[Doc]:
        while True:
            watch.attempt()
            try:
                doc, retry_after = read()
            except Unavailable as exc:
                retry_after = exc.retry_after
            else:
                watch.last = doc
                if lines is not None:
                    lines.catch_up(doc if stream.ends(doc) else None)
                yield doc
                if stream.ends(doc):
                    return
            watch.check_attempts()  # give up now rather than after one more wait
            self._sleep(watch.clamp(retry_after or DEFAULT_POLL))
            watch.check_time()

    def _stream(self, stream: Stream, last_id: int | str | None, reconnects: int, stop_at: float | None,
                before_connect: Callable[[], None]) -> Iterator[Event]:
        """The events of ``stream`` until its last document, reopened with ``Last-Event-ID`` after a drop."""
        failures = 0
        while True:
            before_connect()
            try:
                for event in self._connection(stream, last_id, stop_at):
                    failures = 0
                    last_id = event.id if event.id is not None else last_id
                    yield event
                    if event.event == stream.event and stream.ends(event.doc):
                        return
                reason = f"the stream ended before the {stream.kind} did"
                delay = 0.0
            except (httpx.TransportError, httpx_sse.SSEError) as exc:
                reason, delay = f"{type(exc).__name__}: {exc}", 0.0
            except Unavailable as exc:
                reason, delay = exc.describe(), exc.retry_after or DEFAULT_POLL
            if stop_at is not None and self._clock() >= stop_at:
                return
            failures += 1
            if failures > reconnects:
                raise StreamFailed(f"event stream of {stream.kind} {stream.id}: {reason}")
            self._sleep(min(delay or 0.2 * failures, _remaining(stop_at, self._clock)))

    def _created(self, response: httpx.Response) -> Doc:
        if response.status_code == 201:
            return _json(response)
        self._raise(response)

    def _connection(self, stream: Stream, last_id: int | str | None, stop_at: float | None) -> Iterator[Event]:
        headers = {} if last_id is None else {"Last-Event-ID": str(last_id)}
        read = min(STREAM_READ_TIMEOUT, max(0.01, _remaining(stop_at, self._clock)))
        timeout = httpx.Timeout(self.timeout, read=read)
        with httpx_sse.connect_sse(self._http, "GET", stream.path, headers=headers, timeout=timeout) as source:
            response = source.response
            if response.status_code == 410:
                response.read()
                yield Event(None, _json(response))
                return
            if response.status_code != 200:
                response.read()
                self._raise(response)
            for sse in source.iter_sse():
                if sse.event == stream.event or (stream.output and sse.event == OUTPUT_EVENT):
                    yield Event(_event_id(sse.id), json.loads(sse.data), sse.event)

    def _status(self, task_id: str) -> tuple[Doc, float | None]:
        response = self._request("GET", _task_path(task_id))
        if response.status_code in (200, 410):
            return _json(response), _retry_after(response)
        self._raise(response)

    def _no_result(self, task_id: str, response: httpx.Response) -> NoReturn:
        """Raise what an answer other than 200 from /result or /result/file means."""
        if response.status_code == 202:
            raise StillRunning(task_id, _json(response), attempts=1)
        if response.status_code == 410:
            raise TaskExpired(task_id, _json(response))
        body = _json_or_none(response) or {}
        if response.status_code == 409 and body.get("task_status") in ENDED:
            error = body.get("error") or {}
            raise ENDED[body["task_status"]](task_id, None, error.get("code"), str(error.get("message", "")))
        self._raise(response)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServiceUnreachable(f"no answer from {self.url}: {type(exc).__name__}: {exc}") from None

    @staticmethod
    def _raise(response: httpx.Response) -> NoReturn:
        body = _json_or_none(response)
        status = response.status_code
        if status == 409 and isinstance(body, dict) and body.get("duplicate"):
            raise DuplicateTask(status, body)
        cls = problem_class(status) if status >= 400 else ProblemError
        raise cls(status, body if isinstance(body, dict) else None, _retry_after(response))


@dataclass(frozen=True)
class Stream:
    """An event stream to follow: what it follows (``kind`` and ``id``), its ``path``, the ``event`` that carries
    a document and what ``ends`` it (the document after which the service closes it)."""

    kind: str
    id: str
    path: str
    event: str
    ends: Callable[[Doc], bool]
    output: bool = False  # its ``output`` events are wanted too


def _task_stream(task_id: str, output: bool = False) -> Stream:
    return Stream("task", task_id, _task_path(task_id, "/events"), "status", lambda doc: doc["status"] in TERMINAL,
                  output)


class _Output:
    """The output lines of one :meth:`Client.follow`: each handed to ``on_line`` once, in order, whether the
    stream brought it or a page of ``read(after)`` (GET /tasks/{id}/output) did. Output never decides how a
    follow ends: a page that cannot be read is left to the next poll, or, once the task ended, dropped."""

    def __init__(self, read: Callable[[str | None], Doc], on_line: Callable[[Doc], None]) -> None:
        self.read = read
        self.on_line = on_line
        self.after: str | None = None  # the id of the last line handed on

    def line(self, line: Doc) -> None:
        if line["id"] == self.after:
            return  # the same line again (a stream resumed at it)
        self.after = line["id"]
        self.on_line(line)

    def catch_up(self, ended: Doc | None) -> None:
        """The lines not yet handed on: while the task runs, full page after full page; once it has ended
        (``ended``, its terminal document), every page up to ``next: null`` (none for an EXPIRED task: its
        output went with it)."""
        if ended is not None and ended["status"] == TaskStatus.EXPIRED:
            return
        while True:
            try:
                page = self.read(self.after)
            except TaskportError:
                return
            for line in page["lines"]:
                self.line(line)
            if page["next"] is None or not page["lines"] or (ended is None and len(page["lines"]) < OUTPUT_PAGE):
                return


class _Watch:
    """The limits of one :meth:`Client.follow` (or ``watch_batch``): attempts made, the deadline, the last
    document seen. ``kind`` names what is followed in :class:`StillRunning`."""

    def __init__(self, task_id: str, max_attempts: int | None, stop_at: float | None,
                 clock: Callable[[], float], kind: str = "task") -> None:
        self.task_id = task_id
        self.kind = kind
        self.max_attempts = max_attempts
        self.stop_at = stop_at
        self.clock = clock
        self.attempts = 0
        self.last: Doc | None = None

    def attempt(self) -> None:
        """Count one more attempt, or raise StillRunning if none is left."""
        self.check_time()
        self.check_attempts()
        self.attempts += 1

    def check_attempts(self) -> None:
        if self.max_attempts is not None and self.attempts >= self.max_attempts:
            raise StillRunning(self.task_id, self.last, self.attempts, self.kind)

    def check_time(self) -> None:
        if self.stop_at is not None and self.clock() >= self.stop_at:
            raise StillRunning(self.task_id, self.last, self.attempts, self.kind)

    def clamp(self, delay: float) -> float:
        return min(delay, _remaining(self.stop_at, self.clock))


def _event_id(raw: str) -> int | str | None:
    """An event's id as ``Last-Event-ID`` sends it back: a number (a status write's sequence), else the text."""
    if not raw:
        return None
    return int(raw) if raw.isascii() and raw.isdigit() else raw


def _ttl_body(ttl: int | None) -> dict[str, Any] | None:
    return None if ttl is None else {"ttl": ttl}


def _remaining(stop_at: float | None, clock: Callable[[], float]) -> float:
    return float("inf") if stop_at is None else max(0.0, stop_at - clock())


def _task_path(task_id: str, suffix: str = "") -> str:
    return f"{API}/tasks/{quote(str(task_id), safe='')}{suffix}"


def _json(response: httpx.Response) -> Doc:
    body = _json_or_none(response)
    if not isinstance(body, dict):
        raise ProblemError(response.status_code, None)
    return body


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds when it is a number (the service sends whole seconds), else None."""
    raw = response.headers.get("Retry-After", "").strip()
    return float(raw) if raw.isascii() and raw.isdigit() and len(raw) < 8 else None


def _attachment_name(response: httpx.Response, task_id: str) -> str:
    """The file name of ``Content-Disposition``, reduced to a bare name (never a path)."""
    message = Message()
    message["Content-Disposition"] = response.headers.get("Content-Disposition", "")
    name = Path(message.get_filename() or "").name
    return name if name not in ("", ".", "..") else f"{task_id}.result"
