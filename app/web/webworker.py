"""gunicorn's gevent worker with one addition: a socket timeout on every client connection (and, for both it and
the gthread worker, gunicorn's own error answers as problem+json: :func:`write_problem`).

``--worker-class app.web.webworker.GeventWorker`` (see ``app.launch.cli.web_command``). gunicorn's own gevent
worker puts client sockets in blocking mode with no timeout, so a client that stops reading a
response (a file download read slowly, an event stream nobody drains) or stops sending a body would
hold its greenlet and socket forever. Here a connection on which no byte moves either way for
``TASKPORT_WEB_IO_TIMEOUT`` seconds while a request's body is read or its response written is closed.
A request *head* has a deadline of its own: gunicorn's gevent worker reads each head under
``--keep-alive`` seconds in all. Neither blocks any other request: each
connection is a greenlet, so polls keep answering meanwhile.

:func:`on_hang_up` lets a long response (an SSE stream) learn at once that its client closed the
connection, instead of at its next write or two (a first write to a closed socket still succeeds).
"""

from __future__ import annotations

import contextlib
import resource
import socket
import warnings
from collections.abc import Callable
from typing import Any

import gevent
from gevent import monkey
from gevent.socket import wait_read
from gunicorn import util as gunicorn_util
from gunicorn.workers.ggevent import GeventWorker as _GunicornGeventWorker
from gunicorn.workers.gthread import ThreadWorker as _GunicornThreadWorker

from app.core.config import Config
from app.web.errors import PROBLEM_JSON, problem

FILES_BESIDES_CONNECTIONS = 256  # Redis connections (a pool of 64), logs, result files being served


def allow_open_files(wanted: int) -> None:
    """Raise this process's open-file soft limit towards ``wanted`` (within the hard limit): a common
    default of 1,024 would otherwise refuse connections long before ``TASKPORT_WEB_CONNECTIONS``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# gunicorn answers a request it cannot parse (an over-long request line: 414, too many or too large headers:
# 431, a malformed request: 400) itself, before the app, with an HTML page naming what it read. These
# details say what limit was broken without echoing the client's bytes.
GUNICORN_DETAILS = {
    414: "the request line (method, path and query) is over the server's limit of 4094 bytes",
    431: "a request header is over the server's limit of 8190 bytes, or there are over 100 of them",
}


def write_problem(sock: Any, status: int, reason: str, mesg: str) -> None:
    """gunicorn's ``util.write_error``, answering problem+json like the app instead of an HTML page."""
    detail = GUNICORN_DETAILS.get(status, "the server could not read this request" if status < 500 else
                                  "an internal error occurred")
    body = problem(status, reason.lower().replace(" ", "-"), reason, detail).get_data()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: {PROBLEM_JSON}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    gunicorn_util.write_nonblock(sock, head.encode("latin-1") + body)


class ProblemErrors:
    """Mixed into a gunicorn worker class: the worker process answers gunicorn's own errors with
    :func:`write_problem` (gunicorn's module-level ``util.write_error`` is this process's own)."""

    def init_process(self) -> None:
        gunicorn_util.write_error = write_problem
        super().init_process()  # type: ignore[misc]


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
            super().handle_request(listener_name, req, sock, addr)
        except TimeoutError:
            # a known condition, not a server fault: one line, no traceback; gunicorn then closes the socket
            self.log.info("closed a connection from %s: no byte moved for %g s", addr[0] if addr else "?",
                          self.io_timeout)
            raise StopIteration from None
        finally:
            with contextlib.suppress(OSError):
                sock.settimeout(None)


class ThreadWorker(ProblemErrors, _GunicornThreadWorker):  # type: ignore[misc]
    """gunicorn's ``gthread`` worker (``TASKPORT_WEB_WORKER_CLASS=gthread``), its own errors as problem+json."""


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
