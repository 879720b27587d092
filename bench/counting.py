"""Counting Redis traffic: round trips from the client side, commands from the server side.

A round trip is one ``send_packed_command`` on a connection (a single command, a script call, or a
whole pipeline); :class:`CountingConnection` counts them for every connection of its class, so code
that makes its own clients (the runner, RQ) is counted as long as it shares the pool we patch.
``INFO commandstats`` counts commands on the server, including those run inside Lua scripts (an
EVALSHA whose script does SET, HSET and ZADD counts as 4).
"""

from __future__ import annotations

import threading
from typing import Any

import redis
from redis.connection import Connection, UnixDomainSocketConnection

from app.core.config import Config
from app.core.connection import connect


class CountingConnection(Connection):
    """A redis-py connection that counts round trips (class-wide, thread-safe)."""

    round_trips = 0
    _lock = threading.Lock()

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        with CountingConnection._lock:
            CountingConnection.round_trips += 1
        super().send_packed_command(command, check_health)

    @classmethod
    def reset(cls) -> int:
        with cls._lock:
            value, cls.round_trips = cls.round_trips, 0
        return value


class CountingUnixConnection(UnixDomainSocketConnection):
    """The same count, for a server on a unix socket (the embedded one); it adds to CountingConnection's."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        with CountingConnection._lock:
            CountingConnection.round_trips += 1
        super().send_packed_command(command, check_health)


def counting_client(config: Config) -> redis.Redis:
    """taskport's own client (``app.core.connection.connect``: same timeouts, retry and health checks) whose
    connections count their round trips."""
    conn = connect(config)
    pool = conn.connection_pool
    if isinstance(pool, redis.BlockingConnectionPool):
        created = len(pool._connections)
    else:
        created = pool._created_connections if isinstance(pool, redis.ConnectionPool) else 1
    if created:
        raise RuntimeError("expected a fresh redis.ConnectionPool")
    unix = issubclass(pool.connection_class, UnixDomainSocketConnection)
    pool.connection_class = CountingUnixConnection if unix else CountingConnection
    return conn


def text(value: object) -> str:
    """A Redis reply (bytes) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def commandstats(conn: redis.Redis) -> dict[str, int]:
    """calls per command name, as the server counts them."""
    info = conn.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in info.items()}


def command_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Commands run between two snapshots, without the INFO calls that took them."""
    delta = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    return {name: n for name, n in sorted(delta.items()) if n and name != "info"}


def per_op(delta: dict[str, int], ops: int) -> dict[str, float]:
    return {name: round(n / ops, 3) for name, n in delta.items()}
