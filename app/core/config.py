"""Configuration: the one place that reads the environment.

Every setting is a field of :class:`Config`; :meth:`Config.from_env` reads ``os.environ`` (or a given
mapping) once, validates it and returns a frozen object that the rest of the code passes around.
docs/configuration.md lists the same variables; ``Config.describe()`` prints that table from here.
The parsing of three groups of settings lives in siblings that Config inherits: app.core.config_keys (API keys,
callback secrets, CORS), app.core.config_limits (quotas, concurrency and rate limits) and app.core.config_stores
(Redis, the result store, audit retention); app.core.config_values holds what they share (ConfigError,
WorkerClass, sizes).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app.core.config_limits import (
    KEYED_MAX_ACTIVE_TASKS,
    KEYED_MAX_STORED_BYTES,
    KEYED_RATE_LIMIT,
    LimitSettings,
    check_rate_limit,
)
from app.core.config_stores import StoreSettings
from app.core.config_values import ConfigError, WorkerClass

LOOPBACK = "127.0.0.1"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")  # binds that listen on every interface
# Settings only the web process reads: API keys, operator credentials, where and to whom it answers.
WEB_ONLY = frozenset({"api_keys", "dashboard_user", "dashboard_password", "host", "allowed_hosts", "allow_open",
                      "rate_limit", "max_active_tasks", "callback_secrets", "token_secret", "cors_origins"})
# The roles that run no processor code, so they get the WEB_ONLY settings too: the web, and the deliverer, which
# signs callbacks with TASKPORT_CALLBACK_SECRETS (workers.delivery). A processor never holds a signing secret.
TRUSTED_ROLES = frozenset({"web", "deliverer"})


# Settings with a fixed set of values, and settings that must be above zero (Config.validate).
CHOICES: dict[str, tuple[str, ...]] = {
    "worker_class": tuple(WorkerClass), "redis_fsync": ("everysec", "always"),
    "redis_tls_verify": ("required", "optional", "none"),  # redis-py's ``ssl_cert_reqs`` values
    "web_worker_class": ("gevent", "gthread"),
}
POSITIVE = ("task_ttl", "max_delay", "result_ttl", "tombstone_ttl", "dedup_window", "max_body", "workers",
            "max_result", "web_connections", "web_io_timeout", "max_streams_per_member", "sse_max_minutes",
            "inline_result_max", "result_store_timeout", "stop_grace", "result_part_size",
            "max_schedules", "callback_timeout", "callback_max_age")
MIN_PART_SIZE = 5 * 1024 * 1024  # S3's smallest multipart part (but the last)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _setting(env: str, default: Any, doc: str) -> Any:
    return field(default=default, metadata={"env": env, "doc": doc})


@dataclass(frozen=True)
class Config(StoreSettings, LimitSettings):
    redis_url: str | None = _setting(
        "REDIS_URL", None, "Redis to use; unset = `taskport up` starts an embedded valkey-server (unix socket)")
    redis_sentinels: str = _setting(
        "REDIS_SENTINELS", "", "comma list host:port of Redis Sentinels: every process asks them for the primary "
        "(instead of REDIS_URL; docs/operations.md)")
    redis_sentinel_master: str = _setting(
        "REDIS_SENTINEL_MASTER", "", "the name the Sentinels monitor the primary under (with REDIS_SENTINELS)")
    redis_sentinel_password: str = _setting(
        "REDIS_SENTINEL_PASSWORD", "", "password of the Sentinels themselves (their requirepass), if any")
    redis_password: str = _setting(
        "REDIS_PASSWORD", "", "password of the primary and replicas found through REDIS_SENTINELS (with REDIS_URL "
        "it is part of the URL)")
    replica_ack: bool = _setting(
        "TASKPORT_REPLICA_ACK", False, "1 = submit, cancel and every terminal transition are acknowledged only "
        "once a replica has them (WAIT); none reachable = 503")
    host: str = _setting(
        "TASKPORT_HOST", "", "interface the web binds; unset = 127.0.0.1 without API keys, 0.0.0.0 with them")
    port: int = _setting("PORT", 8000, "HTTP port of the web process")
    web_concurrency: int = _setting("WEB_CONCURRENCY", 2, "gunicorn worker processes")
    web_threads: int = _setting(
        "TASKPORT_WEB_THREADS", 8, "threads per gunicorn worker under gthread (an SSE stream holds one)")
    workers: int = _setting("TASKPORT_WORKERS", 4, "RQ worker processes started by `taskport up`")
    worker_class: str = _setting(
        "TASKPORT_WORKER_CLASS", WorkerClass.SIMPLE.value, "RQ worker class: simple (in-process), fork (Worker), spawn")
    dyno: str = _setting(
        "DYNO", "", "set by Heroku (worker.1...): the worker's RQ name, so the dyno's next process recovers its "
        "run at once")
    worker_max_jobs: int = _setting(
        "TASKPORT_WORKER_MAX_JOBS", 10_000, "jobs after which a worker exits and is restarted (0 = never)")
    data_dir: Path = _setting("TASKPORT_DATA_DIR", Path("var"), "embedded Redis data and result files")
    redis_fsync: str = _setting("TASKPORT_REDIS_FSYNC", "everysec", "embedded Redis appendfsync: everysec|always")
    redis_maxmemory: str = _setting(
        "TASKPORT_REDIS_MAXMEMORY", "1gb", "embedded Redis maxmemory (bytes, or kb/mb/gb; 0 = no limit), with the "
        "noeviction policy: a full Redis refuses writes (503) and never drops a task")
    task_ttl: int = _setting(
        "TASKPORT_TASK_TTL", 86400, "seconds a task may take from submit (or from its run_at) before EXPIRED -4")
    max_delay: int = _setting(
        "TASKPORT_MAX_DELAY", 30 * 86400, "seconds ahead a submit's run_at or delay may be at most; further = 422")
    result_ttl: int = _setting("TASKPORT_RESULT_TTL", 86400, "seconds a result is kept after completion")
    tombstone_ttl: int = _setting("TASKPORT_TOMBSTONE_TTL", 7 * 86400, "seconds an EXPIRED tombstone is kept")
    dedup_window: int = _setting("TASKPORT_DEDUP_WINDOW", 300, "seconds a dedup key stays held")
    max_body: int = _setting("TASKPORT_MAX_BODY", 1024 * 1024, "largest accepted request body, bytes")
    api_keys: str = _setting(
        "TASKPORT_API_KEYS", "", "comma list key:member or key:member:high (that key may submit priority high), "
        "either with :N, the member's weight in fair dispatch (key:member:3, key:member:high:3); "
        "empty = open mode, member public (who may)")
    processors: str = _setting("TASKPORT_PROCESSORS", "", "comma list of modules that register processors")
    progress_interval: float = _setting(
        "TASKPORT_PROGRESS_INTERVAL", 0.5, "seconds between progress writes of a running task")
    heartbeat_interval: float = _setting(
        "TASKPORT_HEARTBEAT_INTERVAL", 1.0, "seconds between heartbeats (and cancel checks) of a task")
    retry_backoff: str = _setting("TASKPORT_RETRY_BACKOFF", "1,5,30", "seconds before retry 1, 2, 3...")
    stall_timeout: float = _setting("TASKPORT_STALL_TIMEOUT", 30.0, "seconds without heartbeat = worker lost")
    lost_runs: int = _setting(
        "TASKPORT_LOST_RUNS", 2,
        "lost runs (worker killed or stalled) in a row without checkpoint progress that run again without using "
        "an attempt; the next one ends the task FAILED -3 (a poison item)")
    stop_grace: float = _setting(
        "TASKPORT_STOP_GRACE", 20.0, "seconds a stopping worker gives its run to reach a checkpoint before it "
        "puts the task back anyway (under Heroku's 30)")
    slow_task_warn: float = _setting("TASKPORT_SLOW_TASK_WARN", 1800.0, "seconds PROCESSING before a warning")
    housekeeping_interval: int = _setting("TASKPORT_HOUSEKEEPING_INTERVAL", 60, "seconds between passes")
    unqueued_bound: float = _setting(
        "TASKPORT_UNQUEUED_BOUND", 300.0, "seconds a PENDING task may have no job anywhere before the reconciler "
        "queues it again")
    scheduler_interval: float = _setting(
        "TASKPORT_SCHEDULER_INTERVAL", 5.0, "seconds between rq-scheduler polls for due periodic jobs")
    alert_webhook: str = _setting(
        "TASKPORT_ALERT_WEBHOOK", "", "http:// or https:// URL that gets a JSON POST on failure alerts")
    alert_failures: int = _setting("TASKPORT_ALERT_FAILURES", 10, "failures within the window that alert")
    alert_window: int = _setting("TASKPORT_ALERT_WINDOW", 300, "seconds of the failure-alert window")
    redis_timeout: float = _setting("TASKPORT_REDIS_TIMEOUT", 2.0, "socket timeout for Redis calls, seconds")
    redis_ride_out: float = _setting(
        "TASKPORT_REDIS_RIDE_OUT", 60.0,
        "seconds workers and the scheduler wait for an unreachable Redis to come back before they exit")
    dashboard_user: str = _setting("TASKPORT_DASHBOARD_USER", "admin", "operator user for /rq")
    dashboard_password: str = _setting(
        "TASKPORT_DASHBOARD_PASSWORD", "", "operator password (/rq, /api/v1/audit); empty = both off")
    log_level: str = _setting("TASKPORT_LOG_LEVEL", "INFO", "log level of every process")
    sse_heartbeat: float = _setting(
        "TASKPORT_SSE_HEARTBEAT", 15.0, "seconds between keep-alive comments on an idle event stream")
    allow_open: bool = _setting(
        "TASKPORT_ALLOW_OPEN", False, "1 = allow a non-loopback TASKPORT_HOST with no API keys (anyone may call)")
    allowed_hosts: str = _setting(
        "TASKPORT_ALLOWED_HOSTS", "", "extra Host names the web answers in open mode (loopback names always)")
    rate_limit: str = _setting(
        "TASKPORT_RATE_LIMIT", "",
        f"task API requests per member, e.g. 100/second;3000/minute; unset = {KEYED_RATE_LIMIT} with API keys, "
        "off in open mode; off = never")
    sse_poll: float = _setting(
        "TASKPORT_SSE_POLL", 1.0, "seconds between fallback re-reads of a streamed task (if a message is lost)")
    result_store: str = _setting(
        "TASKPORT_RESULT_STORE", "", "file:///dir or s3://bucket/prefix; empty = TASKPORT_DATA_DIR/results on disk")
    result_store_timeout: float = _setting(
        "TASKPORT_RESULT_STORE_TIMEOUT", 5.0, "connect and read timeout of s3:// result store calls, seconds")
    result_part_size: int = _setting(
        "TASKPORT_RESULT_PART_SIZE", 8 * 1024 * 1024, "bytes per part of an s3:// upload (at least 5 MiB): a "
        "writer's memory, and how far back a stopped export resumes from")
    inline_result_max: int = _setting(
        "TASKPORT_INLINE_RESULT_MAX", 64 * 1024, "JSON results longer than this many bytes go to the result store")
    audit_retention: str = _setting(
        "TASKPORT_AUDIT_RETENTION", "30d,1000000", "audit stream retention: an age (s/m/h/d) and/or an entry count")
    max_result: int = _setting(
        "TASKPORT_MAX_RESULT", 16 * 1024 * 1024, "largest stored result (output + failures as JSON), bytes; "
        "a larger one fails the task with -1")
    redis_tls_verify: str = _setting(
        "TASKPORT_REDIS_TLS_VERIFY", "required",
        "certificate check of a rediss:// URL: required, optional or none (none: Heroku Redis' self-signed one)")
    web_worker_class: str = _setting(
        "TASKPORT_WEB_WORKER_CLASS", "gevent",
        "gunicorn worker class: gevent (an open stream costs a greenlet) or gthread (it holds a thread)")
    web_connections: int = _setting(
        "TASKPORT_WEB_CONNECTIONS", 2000, "open connections per gevent web process (streams included)")
    web_io_timeout: float = _setting(
        "TASKPORT_WEB_IO_TIMEOUT", 30.0, "seconds a web connection may move no byte while its body is read (then "
        "408) or its response written")
    max_streams_per_member: int = _setting(
        "TASKPORT_MAX_STREAMS_PER_MEMBER", 1000, "open event streams one member may hold (all web processes); "
        "more get 429")
    sse_max_minutes: float = _setting(
        "TASKPORT_SSE_MAX_MINUTES", 30.0, "minutes after which the server ends an event stream (the client "
        "resumes with Last-Event-ID)")

    max_schedules: int = _setting(
        "TASKPORT_MAX_SCHEDULES", 100, "periodic schedules one member may hold; more creates get 429")
    max_active_tasks: str = _setting(
        "TASKPORT_MAX_ACTIVE_TASKS", "",
        f"unfinished (PENDING or PROCESSING) tasks per member; more submits get 429; unset = "
        f"{KEYED_MAX_ACTIVE_TASKS} with API keys, off in open mode; off = never")
    max_stored_bytes: str = _setting(
        "TASKPORT_MAX_STORED_BYTES", "",
        "bytes of payloads, results and checkpoints one member's tasks may hold in Redis (e.g. 268435456 or 256mb); "
        f"a submit past it gets 429; unset = {KEYED_MAX_STORED_BYTES // 2**20}mb with API keys, off in open mode; "
        "off = never")
    callback_secrets: str = _setting(
        "TASKPORT_CALLBACK_SECRETS", "", "comma list member:whsec_<base64 of 24-64 random bytes>: the key that signs "
        "each member's callbacks (Standard Webhooks; open mode's member is public); a member without one may not "
        "ask for callbacks")
    callback_allow_hosts: str = _setting(
        "TASKPORT_CALLBACK_ALLOW_HOSTS", "", "comma list of callback host names (or addresses) exempt from the "
        "public-address rule, which may also use plain http, e.g. 127.0.0.1 for a receiver on this machine")
    callback_timeout: float = _setting(
        "TASKPORT_CALLBACK_TIMEOUT", 5.0, "seconds one callback delivery attempt may take, connect and answer")
    callback_max_age: int = _setting(
        "TASKPORT_CALLBACK_MAX_AGE", 86400, "seconds after its first attempt a failing callback is retried for "
        "(backoff 1 s, 5 s, 30 s... at most an hour apart) before it is given up")
    output_max_lines: int = _setting(
        "TASKPORT_OUTPUT_MAX_LINES", 10_000, "output lines (ctx.emit) kept per task; older ones are trimmed, oldest "
        "first")
    output_max_line_bytes: int = _setting(
        "TASKPORT_OUTPUT_MAX_LINE_BYTES", 4096, "bytes (UTF-8) one output line may take; a longer one is cut, "
        "ending in a marker")
    concurrency: str = _setting(
        "TASKPORT_CONCURRENCY", "", "comma list type=N/member, type=N/type or type=N/payload.<field>: at most N runs "
        "of the type at once per member, in all, or per value of that payload field; overrides the processor's "
        "own concurrency (N 0 = no limit; docs/processors.md)")
    rate_limits: str = _setting(
        "TASKPORT_RATE_LIMITS", "", "comma list name=N/period (erp=20/1s, crm=100/1m, 10/500ms): the rate limits "
        "ctx.limit(name) takes tokens of, shared by every worker; overrides rate_limit() declarations in code")
    rate_wait_max: float = _setting(
        "TASKPORT_RATE_WAIT_MAX", 5.0, "the longest wait a worker is held by ctx.limit, seconds: a longer wait puts "
        "the task back with a run_at instead (no attempt used)")
    token_secret: str = _setting(
        "TASKPORT_TOKEN_SECRET", "", "secret that signs read tokens (every web host the same); unset = one generated "
        "once and kept in Redis (`taskport tokens rotate` replaces it); changing it revokes every token")
    cors_origins: str = _setting(
        "TASKPORT_CORS_ORIGINS", "", "comma list of exact origins (https://app.example.com[:port]) whose pages may "
        "call the task API cross-origin; unset = no CORS headers")

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

    def __post_init__(self) -> None:
        if not self.host:  # the safe default: listen beyond loopback only when callers must show a key
            object.__setattr__(self, "host", "0.0.0.0" if self.api_keys.strip() else LOOPBACK)

    def validate(self) -> None:
        """Every rule a setting must follow; the first one broken raises ConfigError naming the variable."""
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                listed = f"{', '.join(allowed[:-1])} or {allowed[-1]}"
                raise ConfigError(f"{self.env_name(name)} must be {listed}, got {getattr(self, name)!r}")
        self.log_level_name  # noqa: B018
        for name in POSITIVE:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{self.env_name(name)} must be positive")
        self.output_caps  # noqa: B018 - a task's live output (app.core.output)
        if self.worker_max_jobs < 0:
            raise ConfigError("TASKPORT_WORKER_MAX_JOBS must be 0 (never) or positive")
        if self.result_part_size < MIN_PART_SIZE:
            raise ConfigError(f"TASKPORT_RESULT_PART_SIZE must be at least {MIN_PART_SIZE} (S3's smallest part)")
        self.sentinel_addresses  # noqa: B018 - parses, raising ConfigError when malformed
        self.backoff  # noqa: B018
        self.result_location  # noqa: B018
        self.audit_limits  # noqa: B018
        if self.request_limit:
            check_rate_limit(self.request_limit)
        self.active_task_cap  # noqa: B018
        self.stored_bytes_cap  # noqa: B018
        self.members  # noqa: B018
        self.redis_maxmemory_bytes  # noqa: B018
        _check_webhook(self.alert_webhook)
        self.callback_keys  # noqa: B018
        self._validate_limits_and_tokens()
        if not self.members and not is_loopback(self.host) and not self.allow_open:
            raise ConfigError(
                f"TASKPORT_HOST={self.host} with no TASKPORT_API_KEYS would let anyone who reaches the port read "
                "and cancel every task: set TASKPORT_API_KEYS, bind 127.0.0.1, or set TASKPORT_ALLOW_OPEN=1")

    @classmethod
    def env_name(cls, name: str) -> str:
        """The environment variable of the field ``name``."""
        return str(cls.__dataclass_fields__[name].metadata["env"])

    @property
    def backoff(self) -> list[int]:
        try:
            steps = [int(s) for s in self.retry_backoff.split(",") if s.strip()]
        except ValueError as exc:
            raise ConfigError("TASKPORT_RETRY_BACKOFF must be a comma list of seconds") from exc
        return steps or [0]

    @property
    def log_level_name(self) -> str:
        """TASKPORT_LOG_LEVEL as logging's own name of the level (``warn`` -> ``WARNING``): what the root
        logger, RQ and gunicorn (in lower case) are given."""
        level = logging.getLevelNamesMapping().get(self.log_level.upper())
        if level is None:
            raise ConfigError(f"TASKPORT_LOG_LEVEL must be a level name (DEBUG, INFO...), got {self.log_level!r}")
        return logging.getLevelName(level)

    @property
    def output_caps(self) -> tuple[int, int]:
        """(lines a task's output keeps, bytes a line may take): ConfigError unless both are positive."""
        for name in ("output_max_lines", "output_max_line_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{self.env_name(name)} must be positive")
        return self.output_max_lines, self.output_max_line_bytes

    @property
    def binds_everywhere(self) -> bool:
        """The web binds every interface (a wildcard address), not one name."""
        return self.host in WILDCARD_HOSTS

    @property
    def local_host(self) -> str:
        """The address this machine reaches the web on: loopback for a wildcard bind, else the bound one."""
        return LOOPBACK if self.binds_everywhere else self.host

    @property
    def open_hosts(self) -> frozenset[str]:
        """Host names (without port) the web answers in open mode: loopback, the bind address, and
        TASKPORT_ALLOWED_HOSTS. Anything else is a DNS-rebinding attempt from a browser."""
        extra = {h.strip().lower() for h in self.allowed_hosts.split(",") if h.strip()}
        bound = set() if self.binds_everywhere else {self.host.lower()}
        return frozenset({"localhost", "127.0.0.1", "[::1]", *bound, *extra})

    @property
    def processor_modules(self) -> list[str]:
        return [m.strip() for m in self.processors.split(",") if m.strip()]

    def child_environ(self, role: str = "web") -> dict[str, str]:
        """The environment a child process of ``role`` needs to rebuild this Config.

        Workers and the scheduler run user processor code, so they get none of the web's secrets or
        web-only settings (WEB_ONLY): what a process does not hold, a processor cannot leak. The deliverer runs
        none, and signs callbacks: it gets them as the web does (TRUSTED_ROLES).
        """
        env: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and (role in TRUSTED_ROLES or f.name not in WEB_ONLY):
                env[f.metadata["env"]] = str(value)
        return env

    @classmethod
    def describe(cls) -> list[tuple[str, str, str]]:
        """(variable, default, meaning) for every setting: the README's configuration table."""
        return [(f.metadata["env"], str(f.default), f.metadata["doc"]) for f in fields(cls)]


KIND_NAMES = {int: "an integer", float: "a number"}


def without_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` minus every taskport setting: what a child process inherits from its caller, so that a
    value exported in the caller's shell neither overrides nor slips past the Config handed down to it."""
    names = {f.metadata["env"] for f in fields(Config)}
    return {k: v for k, v in environ.items() if k not in names}


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
        raise ConfigError(f"{env} must be {KIND_NAMES.get(kind, kind.__name__)}, got {raw!r}") from exc


def _check_webhook(url: str) -> None:
    """ConfigError unless ``url`` is empty or an http(s) URL with a host. The value is not shown: a webhook URL
    often carries its secret (a Slack or Teams incoming webhook is one)."""
    if not url:
        return
    try:
        parts = urlsplit(url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # an unclosed [, a port that is no number or out of range
        usable = False
    if not usable or any(c.isspace() for c in url):
        raise ConfigError("TASKPORT_ALERT_WEBHOOK must be an http:// or https:// URL with a host name")
