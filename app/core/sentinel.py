"""Finding the primary through Redis Sentinel (REDIS_SENTINELS), and following it across a failover.

redis-py's own ``Sentinel.master_for`` pool is close, with two gaps this module fills:

- **Reconnects follow the promotion.** redis-py 8.1's ``SentinelManagedConnection`` asks the Sentinels
  only in ``connect()``; a command whose connection dropped reconnects through ``send_packed_command``
  -> ``connect_check_health``, which dials the *cached* address: the dead primary, again and again, for as
  long as the retry policy lasts (a worker riding out an outage retried it for a minute). Here every
  connect, however it is reached, asks the Sentinels first (a round trip, on a reconnect only).
- **A deposed primary is left within a second.** A connection that sat idle in the pool through a failover
  still points at the old primary; if that server comes back before the Sentinels demote it (a partition
  that heals), it answers as a primary with what it had: a read there misses every write made since. The
  pool asks the Sentinels again when a connection is taken and the last answer is older than
  ``ASK_EVERY``; a new answer drops the idle connections to the old server (redis-py's proxy does that).
- **The pool stays bounded.** ``SentinelConnectionPool`` is unbounded; a gevent web would open a
  connection per greenlet. :class:`app.core.connection.SentinelPool` is ``LeanPool`` (bounded,
  blocking, lean) with the Sentinel connection class, and drops on release a connection that still
  points at a primary the Sentinels no longer name.

While the Sentinels name no primary (mid-failover), a connect raises ``MasterNotFoundError``, a
``ConnectionError``: the web answers 503 + Retry-After, and workers and the scheduler ride it out like any
outage (app/core/connection.py). A demoted primary answers writes with READONLY, which redis-py's Sentinel
connection turns into a disconnect plus ``ConnectionError``: the same path.
"""

from __future__ import annotations

import time
from typing import Any

from redis.connection import AbstractConnection
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPoolProxy, SentinelManagedConnection

from app.core.config import Config

# seconds: a Sentinel that does not answer within this is skipped for the next one, so three dead
# Sentinels cost a request at most 3 x this before its 503
SENTINEL_TIMEOUT = 0.5
ASK_EVERY = 1.0  # seconds: the oldest answer of the Sentinels a pool hands out a connection on


class FollowingConnection(SentinelManagedConnection):
    """A connection to whichever server the Sentinels name primary *now*, asked on every connect."""

    def connect(self) -> None:
        AbstractConnection.connect(self)  # the whole connect retried by the policy; no address cached across tries

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:  # noqa: ARG002
        if self._sock:
            return
        self.host, self.port = self.connection_pool.get_master_address()
        # never redial the address within one connect: a timeout (a primary cut off) must ask the Sentinels again
        super().connect_check_health(check_health=check_health, retry_socket_connect=False)


def sentinels(config: Config, timeout: float) -> Sentinel:
    """The Sentinel client of ``config``: short timeouts per Sentinel, their own password if any."""
    t = min(timeout, SENTINEL_TIMEOUT)
    return Sentinel(
        config.sentinel_addresses,
        sentinel_kwargs={"socket_timeout": t, "socket_connect_timeout": t,
                         "password": config.redis_sentinel_password or None},
    )


def pool_options(config: Config, timeout: float) -> dict[str, Any]:
    """What ``SentinelPool`` takes beyond the common options: the service and its Sentinels."""
    return {"service_name": config.redis_sentinel_master, "sentinel_manager": sentinels(config, timeout),
            "password": config.redis_password or None}


class FollowsSentinels:
    """Mixed into a bounded pool class (app.core.connection.SentinelPool): its server is whichever one the
    Sentinels name primary, and a connection to any other is dropped when it comes back."""

    is_master = True  # what SentinelConnectionPoolProxy and redis-py's Sentinel connection ask their pool

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        self.service_name = service_name
        self.proxy = SentinelConnectionPoolProxy(
            connection_pool=self, is_master=True, check_connection=False,
            service_name=service_name, sentinel_manager=sentinel_manager)
        super().__init__(connection_class=FollowingConnection, **kwargs)  # type: ignore[call-arg]
        self.connection_kwargs["connection_pool"] = self.proxy  # type: ignore[attr-defined]
        self._asked = time.monotonic()

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        """A connection to the primary the Sentinels named at most ``ASK_EVERY`` ago (see the module docstring).
        With no primary named (mid-failover) the connection in hand is used: it fails, or it serves."""
        now = time.monotonic()
        if now - self._asked >= ASK_EVERY:
            self._asked = now
            try:
                self.proxy.get_master_address()  # a changed answer disconnects the idle connections
            except MasterNotFoundError:
                pass
        return super().get_connection(*args, **kwargs)  # type: ignore[misc]

    def owns_connection(self, connection: Any) -> bool:
        """Only a connection to the current primary goes back to the pool (the pool drops the others)."""
        current = self.proxy.master_address
        return bool(current == (connection.host, connection.port)
                    and super().owns_connection(connection))  # type: ignore[misc]

    def get_master_address(self) -> tuple[str, int]:
        return self.proxy.get_master_address()  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<{type(self).__name__}(service={self.service_name})>"
