"""gunicorn's gevent worker with one addition: a socket timeout on every client connection.

``--worker-class app.webworker.GeventWorker`` (see ``app.cli.web_command``). gunicorn's own gevent
worker puts client sockets in blocking mode with no timeout, so a client that stops reading a
response (a file download read slowly, an event stream nobody drains) or stops sending a body would
hold its greenlet and socket forever. Here a connection on which no byte moves either way for
``TASKPORT_WEB_IO_TIMEOUT`` seconds is closed. A request *head* has a shorter deadline of its own:
gunicorn bounds reading it by ``--keep-alive`` under gevent. Neither blocks any other request: each
connection is a greenlet, so polls keep answering meanwhile.
"""

from __future__ import annotations

from typing import Any

from gunicorn.workers.ggevent import GeventWorker as _GunicornGeventWorker

from app.config import Config


class GeventWorker(_GunicornGeventWorker):  # type: ignore[misc]
    """gunicorn's ``gevent`` worker whose client sockets time out after ``TASKPORT_WEB_IO_TIMEOUT`` idle s."""

    io_timeout: float = Config.web_io_timeout

    def init_process(self) -> None:
        self.io_timeout = Config.from_env().web_io_timeout
        super().init_process()

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        client.settimeout(self.io_timeout)
        # gunicorn's handle() would set blocking mode (no timeout) first: skip that one step of it
        super(_GunicornGeventWorker, self).handle(listener, client, addr)

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> None:
        try:
            super().handle_request(listener_name, req, sock, addr)
        except TimeoutError:
            # a known condition, not a server fault: one line, no traceback; gunicorn then closes the socket
            self.log.info("closed a connection from %s: no byte moved for %g s", addr[0] if addr else "?",
                          self.io_timeout)
            raise StopIteration from None
