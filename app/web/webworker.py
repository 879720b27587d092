"""gunicorn's gevent and gthread workers with two additions: a socket timeout on every client connection, and
gunicorn's own error answers as problem+json (:func:`write_problem`); and with gunicorn's per-request work trimmed
to what it needs, the same bytes on the wire (:class:`ProblemErrors`: bench/README.md, "The per-request floor").

``--worker-class app.web.webworker.GeventWorker`` or ``ThreadWorker`` (see ``app.launch.cli.web_command``).
gunicorn's own workers put client sockets in blocking mode with no timeout, so a client that stops reading a
response (a file download read slowly, an event stream nobody drains) or stops sending a body would
hold its greenlet (or thread) and socket forever. Here a connection on which no byte moves either way for
``TASKPORT_WEB_IO_TIMEOUT`` seconds while a request's body is read or its response written is closed, with
one info line: a body that stalls is answered 408 first (:class:`ClientBody`), a response that stalls is
cut off. A request *head* has a deadline of its own under gevent: gunicorn's gevent worker reads each head
under ``--keep-alive`` seconds in all. Under gevent nothing of this blocks any other request: each connection
is a greenlet, so polls keep answering meanwhile; under gthread a stalled body or response holds one thread
for at most the timeout.

:func:`on_hang_up` lets a long response (an SSE stream) learn at once that its client closed the
connection, instead of at its next write or two (a first write to a closed socket still succeeds).
"""

from __future__ import annotations

import contextlib
import email.utils
import http
import io
import logging
import resource
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any

import gevent
from gevent import monkey
from gevent.socket import wait_read
from gunicorn import util as gunicorn_util
from gunicorn.config import Config as GunicornConfig
from gunicorn.config import PreRequest
from gunicorn.http import message as gunicorn_message
from gunicorn.http import wsgi as gunicorn_wsgi
from gunicorn.http.body import LengthReader
from gunicorn.workers.ggevent import GeventWorker as _GunicornGeventWorker
from gunicorn.workers.gthread import ThreadWorker as _GunicornThreadWorker

from app.core.config import Config
from app.web.errors import PROBLEM_JSON, BodyStalled, problem

FILES_BESIDES_CONNECTIONS = 256  # Redis connections (a pool of 64), logs, result files being served
log = logging.getLogger(__name__)


def allow_open_files(wanted: int) -> None:
    """Raise this process's open-file soft limit towards ``wanted`` (within the hard limit): a common
    default of 1,024 would otherwise refuse connections long before ``TASKPORT_WEB_CONNECTIONS``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# gunicorn answers a request it cannot parse (an over-long request line: 414, too many or too large headers:
# 431, a transfer coding it does not know: 501, a malformed request: 400) itself, before the app, with an
# HTML page naming what it read. These details say what was wrong without echoing the client's bytes; the
# header at fault, where one is, is named in ``errors`` as the app's problems name theirs.
TRANSFER_CODINGS = "the request's Transfer-Encoding is not one the server supports: send chunked, or a Content-Length"
GUNICORN_DETAILS = {
    414: "the request line (method, path and query) is over the server's limit of 4094 bytes",
    431: "a request header is over the server's limit of 8190 bytes, or there are over 100 of them",
    501: TRANSFER_CODINGS,  # the one 501 gunicorn answers: RFC 9112 6.1 (an unknown transfer coding)
}
GUNICORN_FIELDS = {501: ("Transfer-Encoding", "Only chunked is supported.")}


def write_problem(sock: Any, status: int, reason: str, mesg: str) -> None:
    """gunicorn's ``util.write_error``, answering problem+json like the app instead of an HTML page.

    gunicorn passes the reason "Bad Request" with statuses that are not 400 (its 501, and the 500 of a
    configuration problem): those get their status's own phrase, as title and in the status line."""
    if status != http.HTTPStatus.BAD_REQUEST and reason == http.HTTPStatus.BAD_REQUEST.phrase:
        with contextlib.suppress(ValueError):
            reason = http.HTTPStatus(status).phrase
    detail = GUNICORN_DETAILS.get(status, "the server could not read this request" if status < 500 else
                                  "an internal error occurred")
    named = GUNICORN_FIELDS.get(status)
    extra = {"errors": {named[0]: [named[1]]}} if named else None
    body = problem(status, reason.lower().replace(" ", "-"), reason, detail, extra=extra).get_data()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: {PROBLEM_JSON}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    gunicorn_util.write_nonblock(sock, head.encode("latin-1") + body)


class ClientBody:
    """A request's body (gunicorn's ``req.body``, which becomes ``wsgi.input``) whose read finds no byte for the
    socket's timeout: :class:`~app.web.errors.BodyStalled` (408, rendered by the app like every error) instead
    of a ``TimeoutError``, which the app would answer 500 with a traceback. One info line says so, and the
    request is marked to close its connection once the 408 is written (gunicorn's ``must_close``: the rest
    of a stalled body is never waited for)."""

    def __init__(self, body: Any, req: Any, client: str, seconds: float) -> None:
        self._body = body
        self._req = req
        self._client = client
        self._seconds = seconds

    def read(self, *size: int | None) -> bytes:
        return self._guarded(self._body.read, *size)  # type: ignore[no-any-return]

    def readline(self, *size: int | None) -> bytes:
        return self._guarded(self._body.readline, *size)  # type: ignore[no-any-return]

    def readlines(self, *hint: int | None) -> list[bytes]:
        return self._guarded(self._body.readlines, *hint)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line

    def _guarded(self, read: Callable[..., Any], *args: Any) -> Any:
        try:
            return read(*args)
        except TimeoutError:
            log.info("request body stalled: no byte from %s for %g s; answered 408 and closed", self._client,
                     self._seconds)
            self._req.must_close = True
            raise BodyStalled(self._seconds) from None


class TimedBody:
    """``req`` with a :class:`ClientBody` while the app runs (gunicorn builds its environ from ``req.body``); its
    own body again afterwards, for gunicorn's drain of what the app left unread, which has timeouts of its own.

    A body of no bytes (gunicorn's reader of length 0: every GET without a body) reads nothing from the socket,
    so it cannot stall and is left as it is. A class rather than a generator-based context manager: it is
    entered once per request (the generator's was ~2 % of a hello's samples)."""

    __slots__ = ("_req", "_body")

    def __init__(self, req: Any, addr: Any, seconds: float) -> None:
        self._req = req
        self._body = body = req.body
        if body is not None and not _empty(body):
            req.body = ClientBody(body, req, _client(addr), seconds)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._req.body = self._body


def _empty(body: Any) -> bool:
    reader = getattr(body, "reader", None)
    return isinstance(reader, LengthReader) and reader.length == 0


def _client(addr: Any) -> str:
    return str(addr[0]) if isinstance(addr, tuple) and addr else "?"


@lru_cache(maxsize=2)
def _http_date_of(second: int) -> str:
    return email.utils.formatdate(second, localtime=False, usegmt=True)  # gunicorn's own call


def http_date(timestamp: float | None = None) -> str:
    """gunicorn's ``util.http_date`` (every response's ``Date``), its text made once a second: email.utils'
    formatdate on every response was ~1 % of a status read's web CPU (bench/README.md, "Submit and status at the
    floor")."""
    return _http_date_of(int(time.time() if timestamp is None else timestamp))


class SettledConfig(GunicornConfig):  # type: ignore[misc]
    """gunicorn's ``Config`` in a worker process, each setting kept as an attribute once read.

    gunicorn reads its settings through ``Config.__getattr__`` (a dict lookup and the setting's ``get()``) a dozen
    times a request (its parser, environ and response): ~2 % of a status read's web CPU (bench/README.md, "Submit
    and status at the floor"). A worker's settings never change (a reload starts new workers), so the first read
    is kept in the instance, where later reads find it without ``__getattr__``. Properties (``address``,
    ``is_ssl``, ...) are the class's and still computed on each read."""

    def __getattr__(self, name: str) -> Any:
        value = super().__getattr__(name)
        self.__dict__[name] = value
        return value


class OneWriteResponse(gunicorn_wsgi.Response):  # type: ignore[misc]
    """gunicorn's HTTP/1 response whose head goes out in the same write as its first body bytes.

    gunicorn writes the head (status line and headers) and then each body chunk with a ``sendall`` of its own: two
    per response for every JSON answer here, each through gevent's Python ``sendall`` (which also asks the
    kernel the socket's send buffer size, a ``getsockopt``, every call) and a ``sendto``. Here the head waits
    for the body's first write and both go in one write (:func:`send_all`; the bytes on the wire are the same, in one
    segment instead of two). A response with no body to write (HEAD, a 204, an empty body, ``sendfile``) sends its head
    alone, as gunicorn does; so does one whose first write fails (the head goes, then the error)."""

    _holding = False
    _head: bytes | None = None
    headers_sent: bool  # gunicorn's, set in its __init__

    def write(self, arg: bytes) -> None:
        if self.headers_sent:
            super().write(arg)
            return
        self._holding = True
        try:
            super().write(arg)
        finally:
            self._holding = False
            head, self._head = self._head, None
            if head is not None:  # nothing of the body was written: the head alone
                gunicorn_util.write(self.sock, head)

    def send_headers(self) -> None:
        if not self._holding or self.headers_sent:
            super().send_headers()
            return
        lines = self.default_headers()
        lines.extend([f"{name}: {value}\r\n" for name, value in self.headers])
        self._head = ("".join(lines) + "\r\n").encode("latin-1")  # gunicorn's own bytes
        self.headers_sent = True

    def _emit_body(self, data: bytes) -> None:
        head, self._head = self._head, None
        if head is None:
            super()._emit_body(data)
        elif self.chunked:  # gunicorn's util.write_chunk framing, after the head
            send_all(self.sock, b"".join((head, b"%X\r\n" % len(data), data, b"\r\n")))
        else:
            send_all(self.sock, head + data)


def send_all(sock: Any, data: bytes) -> None:
    """``sock.sendall(data)`` for a response that most often fits the socket's buffer at once: one ``send`` first,
    then ``sendall`` for what it left. gevent's ``sendall`` asks the kernel the send buffer's size (a ``getsockopt``)
    on every call to cut the data into chunks: ~3 % of a hello's samples. Timeouts are the socket's either way."""
    sent = sock.send(data)
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])


class LiveErrors(io.RawIOBase):
    """``wsgi.errors``: gunicorn's ``WSGIErrorsWrapper`` made when written to (rarely: Flask logs through
    ``logging``), so that one environ base serves every request and a log reopened (SIGUSR1) is still found."""

    def __init__(self, cfg: Any) -> None:
        self._cfg = cfg

    def write(self, data: Any) -> None:  # type: ignore[override]
        gunicorn_wsgi.WSGIErrorsWrapper(self._cfg).write(data)


class BaseEnviron:
    """gunicorn's ``wsgi.base_environ`` (every request's environ starts as its copy), made once per worker.

    gunicorn builds it anew per request, a ``WSGIErrorsWrapper`` included, whose ``logging.getLogger`` takes the
    logging module's lock (under gevent a Python RLock): ~3 % of a hello's samples (bench/README.md, "The
    per-request floor"). Its values are the worker's settings, which never change in a worker."""

    def __init__(self, cfg: Any, original: Callable[[Any], dict[str, Any]]) -> None:
        self._cfg = cfg
        self._original = original
        self._base = original(cfg)
        self._base["wsgi.errors"] = LiveErrors(cfg)

    def __call__(self, cfg: Any) -> dict[str, Any]:
        return dict(self._base) if cfg is self._cfg else self._original(cfg)


class AllowedPeers:
    """gunicorn's ``_ip_in_allow_list`` (is the peer one of ``--forwarded-allow-ips``, asked on every request)
    with its answer kept per peer address: gunicorn parses the address with ``ipaddress`` each time (~3 % of a
    hello's samples). An answer is reused only for the very same list objects, which a worker's settled
    settings (:class:`SettledConfig`) pass every time; the table is bounded (a client picks its address)."""

    KEPT = 1024

    def __init__(self, original: Callable[[str, Any, Any], bool]) -> None:
        self._original = original
        self._seen: dict[str, tuple[Any, Any, bool]] = {}

    def __call__(self, ip: str, allow_list: Any, networks: Any) -> bool:
        seen = self._seen.get(ip)
        if seen is not None and seen[0] is allow_list and seen[1] is networks:
            return seen[2]
        answer = self._original(ip, allow_list, networks)
        if len(self._seen) >= self.KEPT:
            self._seen.clear()
        self._seen[ip] = (allow_list, networks, answer)
        return answer


def _no_pre_request(worker: Any, req: Any) -> None:
    """gunicorn's default ``pre_request`` hook without its DEBUG line, for a worker not logging at DEBUG."""


class ProblemErrors:
    """Mixed into a gunicorn worker class: the worker process answers gunicorn's own errors with
    :func:`write_problem` (gunicorn's module-level ``util.write_error`` is this process's own), dates its
    responses with :func:`http_date`, reads its settings as :class:`SettledConfig`, and trims what gunicorn
    does per request to what it needs (:class:`OneWriteResponse`, :class:`BaseEnviron`, :class:`AllowedPeers`,
    and no call of the default ``pre_request`` hook whose one DEBUG line is not logged)."""

    def init_process(self) -> None:
        gunicorn_util.write_error = write_problem
        gunicorn_util.http_date = http_date
        gunicorn_wsgi.Response = OneWriteResponse  # wsgi.create's default response class, read when called
        gunicorn_message._ip_in_allow_list = AllowedPeers(gunicorn_message._ip_in_allow_list)
        cfg = getattr(self, "cfg", None)
        if type(cfg) is GunicornConfig:
            cfg.__class__ = SettledConfig  # the same object, which the worker's log and parser hold too
        if cfg is not None:
            gunicorn_wsgi.base_environ = BaseEnviron(cfg, gunicorn_wsgi.base_environ)
        super().init_process()  # type: ignore[misc]

    def load_wsgi(self) -> None:
        super().load_wsgi()  # type: ignore[misc]
        # after the app is built, so its logging setup is the one asked (gunicorn's log level may be DEBUG)
        cfg = self.cfg  # type: ignore[attr-defined]
        if (isinstance(cfg, SettledConfig) and cfg.pre_request is PreRequest.default
                and not self.log.error_log.isEnabledFor(logging.DEBUG)):  # type: ignore[attr-defined]
            cfg.__dict__["pre_request"] = _no_pre_request


class GeventWorker(ProblemErrors, _GunicornGeventWorker):  # type: ignore[misc]
    """gunicorn's ``gevent`` worker whose client sockets time out after ``TASKPORT_WEB_IO_TIMEOUT`` idle s."""

    io_timeout: float = Config.web_io_timeout

    def init_process(self) -> None:
        config = Config.from_env()
        self.io_timeout = config.web_io_timeout
        allow_open_files(config.web_connections + FILES_BESIDES_CONNECTIONS)
        super().init_process()

    def patch(self) -> None:
        # gunicorn patches in each worker, after the master imported ssl (redis and the config need it).
        # gevent warns about modules that bound ssl's names directly: the one it finds is redis.asyncio,
        # which taskport never uses (redis' sync client reads ssl's attributes, which are patched).
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=monkey.MonkeyPatchWarning)
            super().patch()

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> None:
        # The head was read already (under gunicorn's keep-alive deadline); the timeout covers reading the
        # body and writing the response, and is lifted again before the next head is awaited.
        sock.settimeout(self.io_timeout)
        try:
            with TimedBody(req, addr, self.io_timeout):
                super().handle_request(listener_name, req, sock, addr)
        except TimeoutError:
            # a known condition, not a server fault: one line, no traceback; gunicorn then closes the socket
            log_response_stalled(addr, self.io_timeout)
            raise StopIteration from None
        finally:
            try:
                sock.settimeout(None)
            except OSError:  # the socket is gone: nothing to lift
                pass


class ThreadWorker(ProblemErrors, _GunicornThreadWorker):  # type: ignore[misc]
    """gunicorn's ``gthread`` worker (``TASKPORT_WEB_WORKER_CLASS=gthread``): its own errors as problem+json,
    and client sockets that time out after ``TASKPORT_WEB_IO_TIMEOUT`` idle s while a body is read or a
    response written (gunicorn's leaves them blocking with no timeout: a stalled body held its thread)."""

    io_timeout: float = Config.web_io_timeout

    def init_process(self) -> None:
        self.io_timeout = Config.from_env().web_io_timeout
        super().init_process()

    def handle_request(self, req: Any, conn: Any) -> bool:
        # gunicorn made the socket blocking for this request and makes it non-blocking again for its poller
        # once the request is done; the timeout lives in between.
        conn.sock.settimeout(self.io_timeout)
        try:
            with TimedBody(req, conn.client, self.io_timeout):
                return bool(super().handle_request(req, conn))
        except TimeoutError:
            log_response_stalled(conn.client, self.io_timeout)
            return False  # gunicorn closes the connection
        finally:
            try:
                conn.sock.settimeout(None)
            except OSError:  # the socket is gone: nothing to lift
                pass


def log_response_stalled(addr: Any, seconds: float) -> None:
    """A known condition, not a server fault: one info line, no traceback."""
    log.info("closed a connection from %s: no byte moved for %g s", _client(addr), seconds)


def on_hang_up(environ: dict[str, Any], callback: Callable[[], None]) -> Callable[[], None] | None:
    """Under this worker: call ``callback`` once the client closes the connection of this request.

    Returns the function that stops watching (call it when the response ends, before the connection
    serves its next request), or None when not running under gevent (then nothing is watched).
    """
    sock = environ.get("gunicorn.socket")
    if sock is None or not monkey.is_module_patched("socket"):
        return None

    def watch() -> None:
        try:
            wait_read(sock.fileno())
            closed = sock.recv(1, socket.MSG_PEEK) == b""  # readable with no data: the client hung up
        except OSError:
            closed = True
        if closed:
            callback()

    greenlet = gevent.spawn(watch)
    return lambda: greenlet.kill(block=False)


def direct_socket(environ: dict[str, Any]) -> Any:
    """Under this worker, for a GET over HTTP/1.1 (a chunked response): the client's socket, which the
    event hub may write whole chunks to while the stream waits (``app.web.api.events.TaskStream.push``).
    None otherwise (the stream then writes everything through its response)."""
    sock = environ.get("gunicorn.socket")
    if (sock is None or not monkey.is_module_patched("socket") or environ.get("REQUEST_METHOD") != "GET"
            or environ.get("SERVER_PROTOCOL") != "HTTP/1.1"):
        return None
    return sock
