"""Redis connections: short timeouts so a dead Redis is a quick 503, never a hang."""

from __future__ import annotations

import time

import redis
from redis.backoff import ExponentialBackoff
from redis.driver_info import DriverInfo
from redis.retry import Retry

from app.config import Config, ConfigError

# No CLIENT SETINFO round trips on connect: every forked work horse opens fresh connections.
NO_SETINFO = DriverInfo(name=None, lib_version=None)
POOL_SIZE = 64  # Redis connections per client (per process): requests beyond it wait for a free one


def connect(config: Config, *, timeout: float | None = None) -> redis.Redis:
    """A client for ``config.redis_url`` with socket timeouts and health checks."""
    if not config.redis_url:
        raise ConfigError("REDIS_URL is not set: run `taskport up`, which starts an embedded Redis")
    t = config.redis_timeout if timeout is None else timeout
    tls = {"ssl_cert_reqs": config.redis_tls_verify} if config.redis_url.startswith("rediss://") else {}
    # A bounded pool that waits up to the timeout for a free connection: under gevent a burst of
    # greenlets would otherwise open a connection each (and fail past redis-py's default of 100).
    pool = redis.BlockingConnectionPool.from_url(
        config.redis_url, max_connections=POOL_SIZE, timeout=t,
        socket_timeout=t,
        socket_connect_timeout=t,
        health_check_interval=30,
        driver_info=NO_SETINFO,
        # one quick retry heals a connection dropped by a Redis restart; more would turn an outage into a hang
        retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), retries=1),
        **tls,  # TASKPORT_REDIS_TLS_VERIFY (a plain redis:// URL takes no TLS arguments)
    )
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # as Redis.from_url does: closing the client closes its pool
    return client


def wait_for_redis(conn: redis.Redis, deadline_s: float = 30.0) -> None:
    """Block until Redis answers PING (processes start in no particular order under honcho)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            conn.ping()
            return
        except redis.exceptions.ConnectionError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)
