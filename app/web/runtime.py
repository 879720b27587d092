"""The per-app objects views use (config, service, members, result files, event streams, readiness), built once
in create_app (:meth:`Runtime.build`). Views reach Redis only through these, never through the client itself."""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask, current_app
from flask.globals import _cv_app
from redis import Redis

from app.core.config import Config
from app.core.connection import connect, send_in_one
from app.core.packer import use_lean_packer
from app.core.results import ResultStore, result_store
from app.web.auth import OPEN_MEMBER, Members
from app.web.readiness import Readiness
from app.web.service import TaskService
from app.web.streams import Streams
from app.web.tokens import Tokens

EXTENSION = "taskport"


@dataclass(frozen=True)
class Runtime:
    config: Config
    redis: Redis
    service: TaskService
    members: Members
    results: ResultStore
    streams: Streams  # this process's event hub and the per-member stream slots

    @classmethod
    def build(cls, config: Config, conn: Redis | None = None) -> Runtime:
        if conn is None:
            conn = connect(config)
            use_lean_packer(conn)  # the same bytes, less CPU per command (a submit's ~110 arguments above all)
            send_in_one(conn)  # one send a command, not gevent's Python sendall (app.core.connection.OneSend)
        service = TaskService(conn, config)
        streams = Streams(conn, service.store, config.max_streams_per_member, config.sse_poll)
        members = Members(config, Tokens(conn, config, OPEN_MEMBER))
        return cls(config, conn, service, members, result_store(config), streams)

    def readiness(self) -> Readiness:
        """What /readyz reports, read now (raises redis.RedisError while Redis is away)."""
        return Readiness.read(self.redis, self.config)

    def init_app(self, app: Flask) -> None:
        app.extensions[EXTENSION] = self


def runtime() -> Runtime:
    """The app's Runtime, read through the app context's own variable (Flask's ``current_app`` reads it too): the
    proxy costs ~0.5 µs a lookup, and a submit makes several (bench/README.md, "Submit and status at the floor")."""
    ctx = _cv_app.get(None)
    return (ctx.app if ctx is not None else current_app).extensions[EXTENSION]  # type: ignore[no-any-return]
