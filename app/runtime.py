"""The per-app objects views use (config, service, members, result files, worker counts, readiness), built once
in create_app. Views reach Redis only through these, never through the client itself."""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask, current_app
from redis import Redis

from app.auth import Members
from app.config import Config
from app.connection import connect
from app.readiness import Readiness, WorkerWatch
from app.results import ResultStore, result_store
from app.service import TaskService

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
