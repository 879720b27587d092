"""The per-app objects views use (config, service, members, result files, worker counts, readiness), built once
in create_app. Views reach Redis only through these, never through the client itself."""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask, current_app
from redis import Redis

from app.core.config import Config
from app.core.connection import connect
from app.core.results import ResultStore, result_store
from app.web.auth import Members
from app.web.readiness import Readiness, WorkerWatch
from app.web.service import TaskService

EXTENSION = "taskport"


@dataclass(frozen=True)
class Runtime:
    config: Config
    redis: Redis
    service: TaskService
    members: Members
    results: ResultStore
    workers: WorkerWatch  # live worker counts, cached briefly (the submit warning)

    @classmethod
    def build(cls, config: Config, conn: Redis | None = None) -> Runtime:
        conn = conn if conn is not None else connect(config)
        return cls(config, conn, TaskService(conn, config), Members(config), result_store(config), WorkerWatch(conn))

    def readiness(self) -> Readiness:
        """What /readyz reports, read now (raises redis.RedisError while Redis is away)."""
        return Readiness.read(self.redis, self.config)

    def init_app(self, app: Flask) -> None:
        app.extensions[EXTENSION] = self


def runtime() -> Runtime:
    return current_app.extensions[EXTENSION]  # type: ignore[no-any-return]
