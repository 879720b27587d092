"""Redis connections: short timeouts so a dead Redis is a quick 503, never a hang."""

from __future__ import annotations

import time

import redis

from app.config import Config


def connect(config: Config, *, timeout: float | None = None) -> redis.Redis:
    """A client for ``config.redis_url`` with socket timeouts and health checks."""
    if not config.redis_url:
        raise RuntimeError("REDIS_URL is not set: run `taskport up`, which starts an embedded Redis")
    t = config.redis_timeout if timeout is None else timeout
    return redis.Redis.from_url(
        config.redis_url,
        socket_timeout=t,
        socket_connect_timeout=t,
        health_check_interval=30,
        retry_on_timeout=False,
    )


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
