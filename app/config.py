"""Configuration: the one place that reads the environment.

Every setting is a field of :class:`Config`; :meth:`Config.from_env` reads ``os.environ`` (or a given
mapping) once, validates it and returns a frozen object that the rest of the code passes around.
The table in README.md lists the same variables; ``Config.describe()`` prints it from here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """An environment variable has a value that cannot be used."""


def _setting(env: str, default: Any, doc: str) -> Any:
    return field(default=default, metadata={"env": env, "doc": doc})


@dataclass(frozen=True)
class Config:
    redis_url: str | None = _setting(
        "REDIS_URL", None, "Redis to use; unset = `taskport up` starts an embedded redis-server")
    redis_port: int = _setting(
        "TASKPORT_REDIS_PORT", 6380, "loopback port of the embedded redis-server of `taskport up`; 0 = any free")
    host: str = _setting("TASKPORT_HOST", "0.0.0.0", "interface the web process binds; 127.0.0.1 = local only")
    port: int = _setting("PORT", 8000, "HTTP port of the web process")
    web_concurrency: int = _setting("WEB_CONCURRENCY", 2, "gunicorn worker processes")
    web_threads: int = _setting("TASKPORT_WEB_THREADS", 8, "threads per gunicorn worker (SSE streams hold one)")
    workers: int = _setting("TASKPORT_WORKERS", 2, "RQ worker processes started by `taskport up`")
    worker_class: str = _setting(
        "TASKPORT_WORKER_CLASS", "fork", "RQ worker class: fork (Worker), simple (SimpleWorker), spawn")
    data_dir: Path = _setting("TASKPORT_DATA_DIR", Path("var"), "embedded Redis data and result files")
    redis_fsync: str = _setting("TASKPORT_REDIS_FSYNC", "everysec", "embedded Redis appendfsync: everysec|always")
    task_ttl: int = _setting("TASKPORT_TASK_TTL", 86400, "seconds a task may take from submit before EXPIRED -4")
    result_ttl: int = _setting("TASKPORT_RESULT_TTL", 86400, "seconds a result is kept after completion")
    tombstone_ttl: int = _setting("TASKPORT_TOMBSTONE_TTL", 7 * 86400, "seconds an EXPIRED tombstone is kept")
    dedup_window: int = _setting("TASKPORT_DEDUP_WINDOW", 300, "seconds a dedup key stays held")
    max_body: int = _setting("TASKPORT_MAX_BODY", 1024 * 1024, "largest accepted request body, bytes")
    api_keys: str = _setting("TASKPORT_API_KEYS", "", "comma list key:member; empty = open mode, member public")
    processors: str = _setting("TASKPORT_PROCESSORS", "", "comma list of modules that register processors")
    progress_interval: float = _setting(
        "TASKPORT_PROGRESS_INTERVAL", 0.5, "seconds between progress writes of a running task")
    heartbeat_interval: float = _setting(
        "TASKPORT_HEARTBEAT_INTERVAL", 1.0, "seconds between heartbeats (and cancel checks) of a task")
    retry_backoff: str = _setting("TASKPORT_RETRY_BACKOFF", "1,5,30", "seconds before retry 1, 2, 3...")
    stall_timeout: float = _setting("TASKPORT_STALL_TIMEOUT", 30.0, "seconds without heartbeat = worker lost")
    slow_task_warn: float = _setting("TASKPORT_SLOW_TASK_WARN", 1800.0, "seconds PROCESSING before a warning")
    housekeeping_interval: int = _setting("TASKPORT_HOUSEKEEPING_INTERVAL", 60, "seconds between passes")
    scheduler_interval: float = _setting(
        "TASKPORT_SCHEDULER_INTERVAL", 5.0, "seconds between rq-scheduler polls for due periodic jobs")
    alert_webhook: str = _setting("TASKPORT_ALERT_WEBHOOK", "", "URL that gets a JSON POST on failure alerts")
    alert_failures: int = _setting("TASKPORT_ALERT_FAILURES", 10, "failures within the window that alert")
    alert_window: int = _setting("TASKPORT_ALERT_WINDOW", 300, "seconds of the failure-alert window")
    redis_timeout: float = _setting("TASKPORT_REDIS_TIMEOUT", 2.0, "socket timeout for Redis calls, seconds")
    redis_ride_out: float = _setting(
        "TASKPORT_REDIS_RIDE_OUT", 60.0,
        "seconds workers and the scheduler wait for an unreachable Redis to come back before they exit")
    dashboard_user: str = _setting("TASKPORT_DASHBOARD_USER", "admin", "operator user for /rq")
    dashboard_password: str = _setting("TASKPORT_DASHBOARD_PASSWORD", "", "operator password; empty = /rq off")
    log_level: str = _setting("TASKPORT_LOG_LEVEL", "INFO", "log level of every process")
    sse_heartbeat: float = _setting(
        "TASKPORT_SSE_HEARTBEAT", 15.0, "seconds between keep-alive comments on an idle event stream")
    sse_poll: float = _setting(
        "TASKPORT_SSE_POLL", 1.0, "seconds between fallback re-reads of a streamed task (if a message is lost)")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Build a Config from ``environ`` (default ``os.environ``); ``overrides`` win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f.metadata["env"])
            if raw is None or raw == "":
                continue
            values[f.name] = _parse(f.name, f.metadata["env"], raw, f.default)
        values.update(overrides)
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        if self.worker_class not in ("fork", "simple", "spawn"):
            raise ConfigError("TASKPORT_WORKER_CLASS must be fork, simple or spawn")
        if self.redis_fsync not in ("everysec", "always"):
            raise ConfigError("TASKPORT_REDIS_FSYNC must be everysec or always")
        for name in ("task_ttl", "result_ttl", "tombstone_ttl", "dedup_window", "max_body", "workers"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        self.backoff  # noqa: B018 - parses, raising ConfigError when malformed
        self.members  # noqa: B018

    @property
    def backoff(self) -> list[int]:
        try:
            steps = [int(s) for s in self.retry_backoff.split(",") if s.strip()]
        except ValueError as exc:
            raise ConfigError("TASKPORT_RETRY_BACKOFF must be a comma list of seconds") from exc
        return steps or [0]

    @property
    def members(self) -> dict[str, str]:
        """API key -> member. Empty in open development mode."""
        keys: dict[str, str] = {}
        for entry in filter(None, (e.strip() for e in self.api_keys.split(","))):
            key, sep, member = entry.partition(":")
            if not sep or not key or not member:
                raise ConfigError("TASKPORT_API_KEYS entries look like key:member")
            keys[key] = member
        return keys

    @property
    def processor_modules(self) -> list[str]:
        return [m.strip() for m in self.processors.split(",") if m.strip()]

    @property
    def results_dir(self) -> Path:
        return Path(self.data_dir) / "results"

    @property
    def redis_dir(self) -> Path:
        return Path(self.data_dir) / "redis"

    def child_environ(self) -> dict[str, str]:
        """The environment a child process needs to rebuild this exact Config."""
        env: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                env[f.metadata["env"]] = str(value)
        return env

    @classmethod
    def describe(cls) -> list[tuple[str, str, str]]:
        """(variable, default, meaning) for every setting: the README's configuration table."""
        return [(f.metadata["env"], str(f.default), f.metadata["doc"]) for f in fields(cls)]


def _parse(name: str, env: str, raw: str, default: Any) -> Any:
    kind = type(default)
    try:
        if isinstance(default, bool):
            return raw.lower() in ("1", "true", "yes", "on")
        if kind in (int, float):
            return kind(raw)
        if isinstance(default, Path):
            return Path(raw)
        return raw
    except ValueError as exc:
        raise ConfigError(f"{env} must be a {kind.__name__}, got {raw!r}") from exc
