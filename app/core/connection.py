"""Redis connections: short timeouts so a dead Redis is a quick 503, never a hang.

Two retry policies, chosen by what the process does while Redis is away:
- the web (the default) answers its clients: one quick retry heals a connection a Redis restart
  dropped, and past that the request fails fast with 503 + Retry-After;
- a worker or the scheduler has nobody to answer: it calls :func:`ride_out_outages` once at start, and
  from then on every command it sends waits for Redis to come back (exponential backoff, capped at
  ``RIDE_OUT_STEP`` seconds) for up to ``TASKPORT_REDIS_RIDE_OUT`` seconds before it raises. RQ's main
  loop and rq-scheduler's both quit on a ConnectionError outside their dequeue, so riding the outage
  out inside redis-py is what keeps them alive through a restart of the embedded redis-server.
"""

from __future__ import annotations

import math
import time
from queue import Empty
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.driver_info import DriverInfo
from redis.retry import Retry

from app.core.config import Config, ConfigError

# No CLIENT SETINFO round trips on connect: every forked work horse opens fresh connections.
NO_SETINFO = DriverInfo(name=None, lib_version=None)
POOL_SIZE = 64  # Redis connections per client (per process): requests beyond it wait for a free one
RIDE_OUT_STEP = 0.5  # seconds: the longest wait between two tries, so a restarted Redis is seen within it
_ride_out = False


class LeanPool(redis.BlockingConnectionPool):
    """redis-py's bounded, blocking pool, less two costs on every command (bench/README.md "Redis client").

    - No ``can_read`` poll of the socket when a connection is taken. It looks for a reply left unread,
      which redis-py itself prevents: a command whose send or read fails or is interrupted (a timeout,
      a greenlet killed) disconnects its connection before it goes back, and the next user reconnects.
      Under gevent that poll is a ``select`` through the hub, about a fifth of a GET's CPU.
    - No per-checkout OpenTelemetry bookkeeping (redis-py records connection counts and wait times even
      when no meter is configured; taskport exports none of it).

    Everything else is the parent's: the pid check after a fork, waiting up to ``timeout`` for a free
    connection, connecting lazily, dropping a connection marked for reconnect, health checks.
    """

    def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        self._checkpid()
        try:
            connection = self.pool.get(block=True, timeout=self.timeout)
        except Empty:
            raise redis.exceptions.ConnectionError("No connection available.") from None
        if connection is None:
            connection = self.make_connection()
        try:
            connection.connect()  # a no-op once connected
        except BaseException:
            self.release(connection)
            raise
        return connection

    def release(self, connection: Any) -> None:
        self._checkpid()
        if not self.owns_connection(connection):
            super().release(connection)  # a connection from before a fork: the parent's handling
            return
        if connection.should_reconnect():
            connection.disconnect()
        self.pool.put_nowait(connection)


def ride_out_outages() -> None:
    """From now on, :func:`connect` in this process (and in the processes it forks) returns clients that
    wait out a Redis outage instead of raising at once. For workers and the scheduler only."""
    global _ride_out
    _ride_out = True


def retry_policy(config: Config, ride_out: bool) -> Retry:
    """The redis-py Retry of a client (see the module docstring)."""
    if not ride_out:
        # one quick retry heals a connection dropped by a Redis restart; more would turn an outage into a hang
        return Retry(ExponentialBackoff(cap=0.05, base=0.01), retries=1)
    # the backoff reaches its cap after a few tries; a try itself fails at once while the port is closed
    return Retry(ExponentialBackoff(cap=RIDE_OUT_STEP, base=0.05),
                 retries=max(1, math.ceil(config.redis_ride_out / RIDE_OUT_STEP)))


def connect(config: Config, *, timeout: float | None = None, ride_out: bool | None = None) -> redis.Redis:
    """A client for ``config.redis_url`` with socket timeouts, health checks and the process's retry policy."""
    if not config.redis_url:
        raise ConfigError("REDIS_URL is not set: run `taskport up`, which starts an embedded Redis")
    t = config.redis_timeout if timeout is None else timeout
    tls = {"ssl_cert_reqs": config.redis_tls_verify} if config.redis_url.startswith("rediss://") else {}
    # A bounded pool that waits up to the timeout for a free connection: under gevent a burst of
    # greenlets would otherwise open a connection each (and fail past redis-py's default of 100).
    pool = LeanPool.from_url(
        config.redis_url, max_connections=POOL_SIZE, timeout=t,
        socket_timeout=t,
        socket_connect_timeout=t,
        health_check_interval=30,
        driver_info=NO_SETINFO,
        retry=retry_policy(config, _ride_out if ride_out is None else ride_out),
        **tls,  # TASKPORT_REDIS_TLS_VERIFY (a plain redis:// URL takes no TLS arguments)
    )
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # as Redis.from_url does: closing the client closes its pool
    return client


def wait_for_redis(conn: redis.Redis, deadline_s: float = 30.0) -> None:
    """Block until Redis answers PING (processes start in no particular order under the supervisor)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            conn.ping()
            return
        except redis.exceptions.ConnectionError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)
