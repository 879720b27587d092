"""Configuration: the one place that reads the environment.

Every setting is a field of :class:`Config`; :meth:`Config.from_env` reads ``os.environ`` (or a given
mapping) once, validates it and returns a frozen object that the rest of the code passes around.
docs/configuration.md lists the same variables; ``Config.describe()`` prints that table from here.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app.core.states import HIGH_QUEUE

LOOPBACK = "127.0.0.1"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")  # binds that listen on every interface
# Settings only the web process reads: API keys, operator credentials, where and to whom it answers.
WEB_ONLY = frozenset({"api_keys", "dashboard_user", "dashboard_password", "host", "allowed_hosts", "allow_open",
                      "rate_limit", "max_active_tasks", "callback_secrets", "token_secret", "cors_origins"})
# The roles that run no processor code, so they get the WEB_ONLY settings too: the web, and the deliverer, which
# signs callbacks with TASKPORT_CALLBACK_SECRETS (workers.delivery). A processor never holds a signing secret.
TRUSTED_ROLES = frozenset({"web", "deliverer"})


class WorkerClass(StrEnum):
    """The values of TASKPORT_WORKER_CLASS; the classes they name are workers.worker.WORKER_CLASSES."""

    FORK = "fork"  # a forked work horse per job: a crash or a stop command kills only the horse
    SIMPLE = "simple"  # runs jobs in-process: fastest; a cancel ignored for a grace period ends the process
    SPAWN = "spawn"  # a posix_spawn'd horse: for platforms where fork is unsafe (macOS)


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
KEYED_RATE_LIMIT = "100/second;3000/minute"  # per member, when API keys are configured and no limit is set
KEYED_MAX_ACTIVE_TASKS = 1000  # unfinished tasks per member, when API keys are configured and no cap is set
KEYED_MAX_STORED_BYTES = 256 * 2**20  # bytes a member's tasks may hold in Redis, with API keys and no quota set
HIGH_PRIORITY_GRANT = HIGH_QUEUE  # the third field of a TASKPORT_API_KEYS entry (key:member:high)
MAX_WEIGHT = 100  # the largest weight a TASKPORT_API_KEYS entry may give its member (key:member:N)
MEMORY_UNITS = {"kb": 1024, "mb": 1024**2, "gb": 1024**3}  # TASKPORT_REDIS_MAXMEMORY's, as redis.conf reads them
WEBHOOK_SECRET_PREFIX = "whsec_"  # a Standard Webhooks secret: this, then the key's bytes in base64
WEBHOOK_KEY_BYTES = (24, 64)  # the key lengths the Standard Webhooks specification recommends
MIN_TOKEN_SECRET = 32  # characters of a TASKPORT_TOKEN_SECRET: a guessable one would let anyone mint read tokens
READ_TOKEN_PREFIX = "tpr."  # every read token starts so (app.web.tokens): no API key may, so the two are told apart


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ConfigError(ValueError):
    """An environment variable has a value that cannot be used."""


def _setting(env: str, default: Any, doc: str) -> Any:
    return field(default=default, metadata={"env": env, "doc": doc})


@dataclass(frozen=True)
class Config:
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
            _check_rate_limit(self.request_limit)
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

    def _validate_limits_and_tokens(self) -> None:
        """The rules of concurrency and rate limits (app.core.limits), CORS and read tokens (app.web.tokens)."""
        self.concurrency_limits  # noqa: B018
        self.rate_limit_table  # noqa: B018
        if self.rate_wait_max < 0:
            raise ConfigError("TASKPORT_RATE_WAIT_MAX must be 0 or more seconds")
        self.cors_allowed  # noqa: B018
        if self.token_secret and len(self.token_secret) < MIN_TOKEN_SECRET:
            raise ConfigError(f"TASKPORT_TOKEN_SECRET must be at least {MIN_TOKEN_SECRET} characters (random: "
                              "python -c 'import secrets; print(secrets.token_urlsafe(32))')")

    @classmethod
    def env_name(cls, name: str) -> str:
        """The environment variable of the field ``name``."""
        return str(cls.__dataclass_fields__[name].metadata["env"])

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """(host, port) of each of REDIS_SENTINELS; empty = REDIS_URL names the one Redis."""
        addresses = []
        for entry in filter(None, (e.strip() for e in self.redis_sentinels.split(","))):
            host, sep, port = entry.rpartition(":")
            if not (sep and host and port.isascii() and port.isdigit() and 0 < int(port) < 65536):
                raise ConfigError(f"REDIS_SENTINELS entries look like host:port, got {entry!r}")
            addresses.append((host.strip("[]"), int(port)))
        if addresses and not self.redis_sentinel_master:
            raise ConfigError("REDIS_SENTINELS needs REDIS_SENTINEL_MASTER, the name the Sentinels know the primary by")
        if addresses and self.redis_url:
            raise ConfigError("set REDIS_SENTINELS or REDIS_URL, not both: the Sentinels name the primary")
        if addresses and self.worker_class == WorkerClass.SPAWN:
            raise ConfigError("TASKPORT_WORKER_CLASS=spawn does not work with REDIS_SENTINELS (RQ's SpawnWorker is "
                              "reported broken with Sentinel: rq/rq#2281): use simple or fork")
        return addresses

    @property
    def external_redis(self) -> bool:
        """A Redis of the operator's (REDIS_URL or REDIS_SENTINELS): `taskport up` starts no embedded one."""
        return bool(self.redis_url or self.sentinel_addresses)

    @property
    def call_record_ms(self) -> int:
        """How long a script's answer to one call is kept for a repeat of that call (app.core.lua.ONCE_KEY): longer
        than any client of ours keeps sending a call again, twice the ride-out plus a try's timeout each way."""
        return int((self.redis_ride_out + self.redis_timeout) * 2000)

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
    def members(self) -> dict[str, str]:
        """API key -> member. Empty in open development mode."""
        return {key: member for key, (member, _) in self.grants.items()}

    @property
    def grants(self) -> dict[str, tuple[str, bool]]:
        """API key -> (member, whether that key may submit ``priority: high``)."""
        return {key: (member, high) for key, (member, high, _) in self._entries().items()}

    @property
    def weights(self) -> dict[str, int]:
        """Member -> its weight in fair dispatch (app.core.lines), for the members given one other than 1: the
        largest of its keys' (``key:member:3``, ``key:member:high:3``)."""
        weights: dict[str, int] = {}
        for member, _, weight in self._entries().values():
            weights[member] = max(weights.get(member, 1), weight)
        return {member: weight for member, weight in weights.items() if weight != 1}

    def _entries(self) -> dict[str, tuple[str, bool, int]]:
        """API key -> (member, may submit high, weight): ``key:member[:high][:weight]``."""
        keys: dict[str, tuple[str, bool, int]] = {}
        for entry in filter(None, (e.strip() for e in self.api_keys.split(","))):
            key, sep, rest = entry.partition(":")
            member, *grants = rest.split(":")
            high = bool(grants) and grants[0] == HIGH_PRIORITY_GRANT
            weight = grants[int(high)] if len(grants) > int(high) else "1"
            if not sep or not key or not member or len(grants) > int(high) + 1 \
                    or not weight.isdigit() or not 1 <= int(weight) <= MAX_WEIGHT:
                raise ConfigError("TASKPORT_API_KEYS entries look like key:member, key:member:high, key:member:N "
                                  f"or key:member:high:N (N: a weight in fair dispatch, 1 to {MAX_WEIGHT})")
            if key.startswith(READ_TOKEN_PREFIX):
                raise ConfigError(f"TASKPORT_API_KEYS: a key may not start with {READ_TOKEN_PREFIX} (read tokens do)")
            keys[key] = (member, high, int(weight))
        return keys

    @property
    def callback_keys(self) -> dict[str, str]:
        """Member -> its callback signing secret (``whsec_...``, as the standardwebhooks library takes it), from
        TASKPORT_CALLBACK_SECRETS. A malformed entry raises ConfigError naming the entry, never showing the secret."""
        secrets: dict[str, str] = {}
        for n, entry in enumerate(filter(None, (e.strip() for e in self.callback_secrets.split(","))), 1):
            member, sep, secret = (part.strip() for part in entry.partition(":"))
            what = ("no member" if not sep or not member else _secret_problem(secret)
                    or ("a member named twice" if member in secrets else ""))
            if what:
                low, high = WEBHOOK_KEY_BYTES
                raise ConfigError(f"TASKPORT_CALLBACK_SECRETS entries look like member:{WEBHOOK_SECRET_PREFIX}<base64 "
                                  f"of {low} to {high} random bytes>; entry {n} has {what}")
            secrets[member] = secret
        return secrets

    @property
    def cors_allowed(self) -> tuple[str, ...]:
        """TASKPORT_CORS_ORIGINS: the exact origins (scheme://host[:port], lower case) whose pages may call the task
        API cross-origin; ConfigError for an entry that is no origin (a path, a ``*``, another scheme)."""
        origins: list[str] = []
        for entry in filter(None, (e.strip() for e in self.cors_origins.split(","))):
            try:
                parts = urlsplit(entry)
                port = parts.port  # ValueError when out of range or no number
                usable = (parts.scheme in ("http", "https") and bool(parts.hostname) and "*" not in entry
                          and parts.path == "" and not (parts.query or parts.fragment or parts.username)
                          and entry.count("//") == 1 and port != 0 and not entry.endswith(":"))
            except ValueError:
                usable = False
            if not usable:
                raise ConfigError(f"TASKPORT_CORS_ORIGINS entries are exact origins like https://app.example.com or "
                                  f"http://localhost:3000 (no path, no *), got {entry!r}")
            default_port = (parts.scheme, port) in (("http", 80), ("https", 443))  # a browser's Origin leaves it out
            origins.append(f"{parts.scheme}://{parts.netloc.lower().removesuffix(f':{port}')}" if default_port
                           else entry.lower())
        return tuple(dict.fromkeys(origins))

    @property
    def callback_hosts(self) -> frozenset[str]:
        """TASKPORT_CALLBACK_ALLOW_HOSTS: host names (lower case, an IPv6 address without brackets) a callback
        may go to whatever they resolve to, over http too."""
        return frozenset(h.strip().strip("[]").lower() for h in self.callback_allow_hosts.split(",") if h.strip())

    @property
    def redis_maxmemory_bytes(self) -> int:
        """TASKPORT_REDIS_MAXMEMORY in bytes (0 = no limit), in Redis' own units: kb, mb and gb are powers of 1024."""
        return _bytes("redis_maxmemory", self.redis_maxmemory)

    @property
    def active_task_cap(self) -> int:
        """Unfinished tasks one member may hold (0 = no cap): on by default with API keys, off in open mode."""
        def whole(raw: str) -> int:
            if not (raw.isascii() and raw.isdigit() and 0 < int(raw) < 2**31):
                raise ConfigError("TASKPORT_MAX_ACTIVE_TASKS must be a positive whole number or off")
            return int(raw)

        return self._member_quota(self.max_active_tasks, KEYED_MAX_ACTIVE_TASKS, whole)

    @property
    def output_caps(self) -> tuple[int, int]:
        """(lines a task's output keeps, bytes a line may take): ConfigError unless both are positive."""
        for name in ("output_max_lines", "output_max_line_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{self.env_name(name)} must be positive")
        return self.output_max_lines, self.output_max_line_bytes

    @property
    def stored_bytes_cap(self) -> int:
        """Bytes one member's tasks may hold in Redis (0 = no quota): on by default with API keys, off in open mode."""
        def size(raw: str) -> int:
            cap = _bytes("max_stored_bytes", raw)
            if not cap:
                raise ConfigError("TASKPORT_MAX_STORED_BYTES must be a positive size (e.g. 256mb) or off")
            return cap

        return self._member_quota(self.max_stored_bytes, KEYED_MAX_STORED_BYTES, size)

    def _member_quota(self, text: str, keyed: int, parse: Callable[[str], int]) -> int:
        """A per-member quota setting: ``off`` = 0 (none); unset = ``keyed`` with API keys, 0 in open mode (one
        trusted user); else ``parse`` of the value (ConfigError naming the variable for a bad one)."""
        raw = text.strip().lower()
        if raw == "off":
            return 0
        if not raw:
            return keyed if self.api_keys.strip() else 0
        return parse(raw)

    @property
    def request_limit(self) -> str:
        """The per-member rate limit in force ("" = none): open mode is one trusted user, so no default."""
        if self.rate_limit.strip().lower() == "off":
            return ""
        return self.rate_limit.strip() or (KEYED_RATE_LIMIT if self.members else "")

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

    @property
    def results_dir(self) -> Path:
        return Path(self.data_dir) / "results"

    @property
    def redis_dir(self) -> Path:
        return Path(self.data_dir) / "redis"

    @property
    def result_location(self) -> tuple[str, str, str]:
        """(scheme, bucket or '', path or prefix) of TASKPORT_RESULT_STORE: ``file``/'' /dir or ``s3``/bucket/prefix."""
        raw = self.result_store.strip()
        if not raw:
            return "file", "", str(self.results_dir)
        scheme, sep, rest = raw.partition("://")
        if scheme == "file" and sep and rest:
            return "file", "", rest
        bucket, _, prefix = rest.partition("/")
        if scheme == "s3" and sep and bucket:
            return "s3", bucket, prefix.strip("/")
        raise ConfigError("TASKPORT_RESULT_STORE must look like file:///path or s3://bucket/prefix")

    @property
    def concurrency_limits(self) -> dict[str, tuple[int, str]]:
        """Task type -> (N, key) of TASKPORT_CONCURRENCY: at most N runs at once per value of the key (``member``,
        ``type``, ``payload.<field>``); N 0 lifts a processor's own limit. ConfigError names a bad entry."""
        limits: dict[str, tuple[int, str]] = {}
        for n, entry in enumerate(filter(None, (e.strip() for e in self.concurrency.split(","))), 1):
            type_, sep, rest = (part.strip() for part in entry.partition("="))
            number, slash, key = (part.strip() for part in rest.partition("/"))
            what = ("no type" if not sep or not type_ else "no N/key after =" if not slash
                    else "N not a whole number" if not (number.isascii() and number.isdigit() and len(number) < 7)
                    else concurrency_key_problem(key) or ("a type named twice" if type_ in limits else ""))
            if what:
                raise ConfigError("TASKPORT_CONCURRENCY entries look like type=N/member, type=N/type or "
                                  f"type=N/payload.<field>; entry {n} ({entry!r}) has {what}")
            limits[type_] = (int(number), key)
        return limits

    @property
    def rate_limit_table(self) -> dict[str, tuple[float, float]]:
        """Rate limit name -> (tokens, per seconds) of TASKPORT_RATE_LIMITS (``erp=20/1s``). ConfigError names a bad
        entry."""
        table: dict[str, tuple[float, float]] = {}
        for n, entry in enumerate(filter(None, (e.strip() for e in self.rate_limits.split(","))), 1):
            name, sep, rest = (part.strip() for part in entry.partition("="))
            rate, _, period = (part.strip() for part in rest.partition("/"))
            per = rate_period(period)
            what = ("no name" if not sep or not RATE_NAME.fullmatch(name) else "a name given twice" if name in table
                    else "no whole number of tokens"
                    if not (rate.isascii() and rate.isdigit() and 0 < int(rate) < 10**9)
                    else "no period (1s, 500ms, 1m, 1h)" if per is None else "")
            if what:
                raise ConfigError(f"TASKPORT_RATE_LIMITS entries look like name=20/1s (a name of letters, digits, "
                                  f"._-, tokens, a period); entry {n} ({entry!r}) has {what}")
            table[name] = (float(rate), per)  # type: ignore[assignment]
        return table

    @property
    def audit_limits(self) -> tuple[int, int]:
        """(max entries, max age in seconds) of the audit stream; 0 = no limit of that kind."""
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        count = age = 0
        for part in filter(None, (p.strip() for p in self.audit_retention.split(","))):
            number, unit = (part[:-1], units.get(part[-1])) if part[-1] in units else (part, None)
            if not (number.isascii() and number.isdigit() and len(number) <= 12):
                raise ConfigError("TASKPORT_AUDIT_RETENTION looks like 30d,1000000 (an age and/or a count)")
            if unit is None:
                count = int(number)
            else:
                age = int(number) * unit
        if not count and not age:
            raise ConfigError("TASKPORT_AUDIT_RETENTION needs an age (30d) or an entry count (1000000)")
        return count, age

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


def _secret_problem(secret: str) -> str:
    """What is wrong with a TASKPORT_CALLBACK_SECRETS secret ('' = nothing), in words that never show it."""
    if not secret.startswith(WEBHOOK_SECRET_PREFIX):
        return f"a secret that does not start with {WEBHOOK_SECRET_PREFIX}"
    encoded = secret[len(WEBHOOK_SECRET_PREFIX):]
    try:  # strict, where the library's own decoding skips what is not base64
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        return "a secret that is not base64"
    low, high = WEBHOOK_KEY_BYTES
    return "" if low <= len(key) <= high else f"a key of {len(key)} bytes"


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


def _bytes(name: str, text: str) -> int:
    """A size setting in bytes: a whole number, or one with kb, mb or gb (powers of 1024, as redis.conf reads
    them); ConfigError naming the variable otherwise."""
    raw = text.strip().lower()
    number, unit = (raw[:-2], raw[-2:]) if raw[-2:] in MEMORY_UNITS else (raw, "")
    if not (number.isascii() and number.isdigit() and len(number) <= 15):
        raise ConfigError(f"{Config.env_name(name)} must be bytes or a number with kb, mb or gb (1gb), got {text!r}")
    return int(number) * MEMORY_UNITS.get(unit, 1)


CONCURRENCY_KEYS = ("member", "type")  # and payload.<field>: what a concurrency limit counts runs per
PAYLOAD_KEY = "payload."
_FIELD_PATH = re.compile(r"[A-Za-z0-9_-]{1,100}(\.[A-Za-z0-9_-]{1,100}){0,4}")
RATE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_PERIOD_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PERIOD = re.compile(r"(\d{0,9}(?:\.\d{1,3})?)(ms|s|m|h)")


def concurrency_key_problem(key: str) -> str:
    """What is wrong with a concurrency key (``member``, ``type``, ``payload.<field>``), '' when nothing."""
    if key in CONCURRENCY_KEYS:
        return ""
    if key.startswith(PAYLOAD_KEY) and _FIELD_PATH.fullmatch(key[len(PAYLOAD_KEY):]):
        return ""
    return f"key {key!r}, not member, type or payload.<field>"


def rate_period(text: str) -> float | None:
    """Seconds of a rate limit's period (``1s``, ``500ms``, ``1m``, ``1h``; ``s`` alone is ``1s``), None if it is
    none of these or not positive."""
    match = _PERIOD.fullmatch(text.strip())
    if match is None:
        return None
    seconds = float(match[1] or "1") * _PERIOD_UNITS[match[2]]
    return seconds if seconds > 0 else None


def _check_rate_limit(text: str) -> None:
    from limits import parse_many  # flask-limiter's own parser: the same grammar it will apply

    try:
        parse_many(text)
    except ValueError as exc:
        raise ConfigError(f"TASKPORT_RATE_LIMIT must look like 100/second;3000/minute, got {text!r}") from exc
