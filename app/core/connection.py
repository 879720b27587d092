"""Redis connections: short timeouts so a dead Redis is a quick 503, never a hang.

Two retry policies, chosen by what the process does while Redis is away:
- the web (the default) answers its clients: one quick retry heals a connection a Redis restart
  dropped, and past that the request fails fast with 503 + Retry-After;
- a worker or the scheduler has nobody to answer: it calls :func:`ride_out_outages` once at start, and
  from then on every command it sends waits for Redis to come back (exponential backoff, capped at
  ``RIDE_OUT_STEP`` seconds) for up to ``TASKPORT_REDIS_RIDE_OUT`` seconds before it raises. RQ's main
  loop and rq-scheduler's both quit on a ConnectionError outside their dequeue, so riding the outage
  out inside redis-py is what keeps them alive through a restart of the embedded redis-server.

Where the Redis is: ``REDIS_URL``, or the primary the Sentinels of ``REDIS_SENTINELS`` name, followed
across a failover (app/core/sentinel.py). A primary that refuses writes for want of replicas
(``min-replicas-to-write``: NOREPLICAS) is "not now" like an unreachable one: :class:`NoReplicaError`, a
ConnectionError, so both policies above apply to it unchanged.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from queue import Empty, Full
from typing import Any

import redis
from redis._parsers import BaseParser
from redis.backoff import ExponentialBackoff
from redis.client import Pipeline
from redis.commands.core import Script
from redis.driver_info import DriverInfo
from redis.retry import Retry

from app.core import sentinel
from app.core.config import Config, ConfigError

# No CLIENT SETINFO round trips on connect: every forked work horse opens fresh connections.
NO_SETINFO = DriverInfo(name=None, lib_version=None)
POOL_SIZE = 64  # Redis connections per client (per process): requests beyond it wait for a free one
# seconds: the longest a TCP connect may take (a server on the network answers a SYN in milliseconds; one
# cut off answers never, and a request pays this once per try before its 503)
CONNECT_TIMEOUT = 1.0
RIDE_OUT_STEP = 0.5  # seconds: the longest wait between two tries, so a restarted Redis is seen within it
_ride_out = False


class NoReplicaError(redis.exceptions.ConnectionError):
    """The primary has no replica to take a write: it refused it (NOREPLICAS), or a write it took reached
    none in time with TASKPORT_REPLICA_ACK (app.core.store). Nothing acknowledged; retry shortly."""


# redis-py's parsers (hiredis and Python alike) share one table of error prefixes: NOREPLICAS joins it,
# for every client of the process (RQ's too). Registered rather than passed as a connection argument, because
# RQ's SpawnWorker writes a connection's arguments into its horse's source as literals.
BaseParser.EXCEPTION_CLASSES["NOREPLICAS"] = NoReplicaError


class LeanPool(redis.BlockingConnectionPool):
    """redis-py's bounded, blocking pool, less two costs on every command (bench/README.md "Redis client").

    - No ``can_read`` poll of the socket when a connection is taken. It looks for a reply left unread,
      which redis-py itself prevents: a command whose send or read fails or is interrupted (a timeout,
      a greenlet killed) disconnects its connection before it goes back, and the next user reconnects.
      Under gevent that poll is a ``select`` through the hub, about a fifth of a GET's CPU.
    - No per-checkout OpenTelemetry bookkeeping (redis-py records connection counts and wait times even
      when no meter is configured; taskport exports none of it).

    - Idle connections in :class:`Slots`, not a ``LifoQueue``: a take and a return touch no lock while a
      connection is free (under gevent the queue's condition and lock are Python code, entered twice a
      command); ``connect()`` only for a connection with no socket. With the two changes beside it, a status
      read's web CPU went down ~0.06-0.08 ms (bench/README.md, "Submit and status at the floor", fourth pass).

    Everything else is the parent's: the pid check after a fork, waiting up to ``timeout`` for a free
    connection, connecting lazily, dropping a connection marked for reconnect, health checks.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("queue_class", Slots)
        super().__init__(*args, **kwargs)

    def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        self._checkpid()
        try:
            connection = self.pool.get(block=True, timeout=self.timeout)
        except Empty:
            raise redis.exceptions.ConnectionError("No connection available.") from None
        if connection is None:
            connection = self.make_connection()
        if connection._sock is None:  # connected: redis-py's connect() would only find that out, through a retry
            try:
                connection.connect()
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


class Slots:
    """The part of ``queue.LifoQueue`` a :class:`LeanPool` uses (``get``, ``put_nowait``, ``queue``), the last
    connection returned taken first, with no lock taken while one is free.

    ``list.pop`` and ``list.append`` are atomic (the GIL), so a take or a return is one call. Only a take that
    finds the list empty takes the condition: it counts itself a waiter, looks once more, then waits; a return
    that sees a waiter notifies under the condition. A return between the waiter's count and its wait finds the
    count and its notify waits for the condition, which the waiter releases only inside ``wait``: no wake-up
    is lost. Under gevent the condition and its lock are gevent's (patched ``threading``): a wait yields.
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.queue: list[Any] = []
        self._waiters = 0
        self._returned = threading.Condition(threading.Lock())

    def put_nowait(self, item: Any) -> None:
        if len(self.queue) >= self.maxsize:
            raise Full  # the pool fills its slots with None until Full
        self.queue.append(item)
        if self._waiters:
            with self._returned:
                self._returned.notify()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        try:
            return self.queue.pop()
        except IndexError:
            if not block:
                raise Empty from None
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._returned:
            self._waiters += 1
            try:
                while True:
                    try:
                        return self.queue.pop()
                    except IndexError:
                        pass
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise Empty
                    self._returned.wait(left)
            finally:
                self._waiters -= 1


_PIPELINE_CLASSES: dict[type, bool] = {}


def _is_pipeline(kind: type) -> bool:
    """``isinstance(client, Pipeline)``, answered once per class: redis-py's clients are typing Protocols, whose
    isinstance runs Python code (~0.4 µs) on every script call."""
    try:
        return _PIPELINE_CLASSES[kind]
    except KeyError:
        answer = _PIPELINE_CLASSES[kind] = issubclass(kind, Pipeline)
        return answer


class SureScript(Script):
    """redis-py's registered script, but a NOSCRIPT answer is met with SCRIPT LOAD and EVALSHA on one pipeline:
    one connection, so one server. redis-py's own remedy sends the two as separate commands, each on a
    connection from the pool, and a failover between them sends the load to the old primary and the call to
    the new one, which fails with NOSCRIPT again. Nothing ran on a NOSCRIPT, so the call repeats no write."""

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        client = self.registered_client if client is None else client
        if _is_pipeline(type(client)):
            return super().__call__(keys, args, client)  # the pipeline's own SCRIPT EXISTS check before it runs
        keys, args = keys or [], args or []
        try:  # the command itself: redis-py's evalsha adds two calls, and nothing else, on every status read and submit
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            pipe = client.pipeline(transaction=False)
            pipe.script_load(self.script)
            pipe.evalsha(self.sha, len(keys), *keys, *args)
            return pipe.execute()[1]


def _redis_pys_own(name: Any) -> bool:
    """Whether a command named ``name`` takes redis-py's own path rather than the short ones below: an ``HIMPORT``
    (redis-py's pre-flight for it), or a name that is not a ``str``."""
    return type(name) is not str or name[:7].upper() == "HIMPORT"


def _retried(conn: Any, call: Callable[[], Any]) -> Any:
    """``call()`` under ``conn``'s retry policy, the connection disconnected before each retry: what redis-py's
    failure handler does when nothing is WATCHed."""
    return conn.retry.call_with_retry(call, lambda _error: conn.disconnect())


class LeanPipeline(Pipeline):
    """redis-py's pipeline (:meth:`Client.pipeline`), its :meth:`execute` through a shorter path when nothing is
    WATCHed (bench/README.md, "Pipelines through the short path").

    redis-py's ``execute`` wraps the batch in what taskport does not use: two closures and a list a call, and an
    OpenTelemetry call (``record_operation_duration``) that looks for a metrics collector, finds none, and looks
    again on the next pipeline. Here the batch itself is redis-py's own (``_execute_pipeline`` or, for MULTI/EXEC,
    ``_execute_transaction``: the same bytes, replies, response callbacks, ``raise_on_error`` and errors), run under
    the connection's retry policy with the connection disconnected before each retry (redis-py's failure handler
    does only that when nothing is WATCHed), and the pipeline reset (its connection given back) in any case.

    A WATCHing pipeline (its failure handler raises WatchError) and a pool that is not a :class:`LeanPool` take
    redis-py's own ``execute``. Without MULTI, the batch is :meth:`_execute_pipeline`'s, which skips redis-py's
    HIMPORT pre-flight when the batch has no HIMPORT."""

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = self.command_stack
        if self.watching or not stack or not isinstance(self.connection_pool, LeanPool):
            return super().execute(raise_on_error)  # type: ignore[no-any-return]
        if self.scripts:
            self.load_scripts()
        # the bool Pipeline.__init__ sets as ``self.transaction``, over Redis.transaction (the method mypy sees)
        transaction: bool = self.__dict__["transaction"] or self.explicit_transaction
        execute = self._execute_transaction if transaction else self._execute_pipeline
        conn = self.connection
        if not conn:
            conn = self.connection = self.connection_pool.get_connection()  # reset() gives it back
        try:
            return _retried(conn, lambda: execute(conn, stack, raise_on_error))
        finally:
            self.reset()

    def _execute_pipeline(self, connection: Any, commands: Any, raise_on_error: bool) -> list[Any]:
        """redis-py's, less its HIMPORT pre-flight (a registry lookup, a deferred-discard check and a parse of every
        command's arguments) when no command of the batch is an HIMPORT: the commands packed into one write, every
        reply read (an error reply kept in its place), then the first error raised if ``raise_on_error``. A batch
        with an HIMPORT, or a command name that is not a ``str``, takes redis-py's own."""
        for args, _options in commands:
            name = args[0]
            if _redis_pys_own(name):
                return super()._execute_pipeline(connection, commands, raise_on_error)  # type: ignore[no-any-return]
        connection.send_packed_command(connection.pack_commands([args for args, _options in commands]))
        responses: list[Any] = []
        parse = self.parse_response
        for args, options in commands:
            try:
                responses.append(parse(connection, args[0], **options))
            except redis.exceptions.ResponseError as error:
                responses.append(error)
        if raise_on_error:
            self.raise_first_error(commands, responses)
        return responses


class Client(redis.Redis):
    """The Redis client of every process (:func:`connect`): its registered scripts are :class:`SureScript`, a
    command goes through :meth:`execute_command`'s shorter path, and a pipeline is a :class:`LeanPipeline`."""

    def register_script(self, script: Any) -> SureScript:  # type: ignore[override]
        return SureScript(self, script)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> LeanPipeline:
        return LeanPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)

    def execute_command(self, *args: Any, **options: Any) -> Any:
        """redis-py's ``_execute_command`` less what it does on every command for what taskport does not use
        (bench/README.md, "A Redis round trip under gevent"): its OpenTelemetry calls (each looks for a metrics
        collector, finds none, and looks again on the next command), the check for an ``HIMPORT SET`` and two
        closures a command. ~2-2.5 µs of a command's ~12 µs of client CPU.

        The same steps otherwise: a connection from the pool, the command sent and its reply parsed (redis-py's
        ``send_command`` and ``parse_response``, response callbacks and options included) under the connection's
        retry policy, the connection disconnected before each retry, given back to the pool in any case (where
        :class:`LeanPool` drops one marked for reconnect, and one whose send or read failed or was interrupted was
        disconnected already by redis-py's connection). A single-connection client, a pool that is not a
        :class:`LeanPool`, an ``HIMPORT`` or a command name that is not a ``str`` take redis-py's own path."""
        pool = self.connection_pool
        name = args[0]
        if self.connection is not None or _redis_pys_own(name) or not isinstance(pool, LeanPool):
            return super().execute_command(*args, **options)
        conn = pool.get_connection()
        try:
            return _retried(conn, lambda: self._send_and_parse(conn, name, args, options))
        finally:
            pool.release(conn)

    def _send_and_parse(self, conn: Any, name: str, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
        conn.send_command(*args, **options)
        return self.parse_response(conn, name, **options)


class OneSend:
    """Mixed into a redis-py connection class (:func:`send_in_one`): a command's bytes go out in one ``send``, where
    redis-py calls ``sendall``. Under gevent ``sendall`` is Python code that asks the kernel the socket's send buffer
    size (a ``getsockopt``) on every call before its ``send``: ~1.7 µs a command of the web's ~10 µs (bench/README.md,
    "A Redis round trip under gevent"); the web's own responses had the same cut (app.web.webworker.send_all).

    A command packed as one string (what :class:`app.core.packer.LeanPacker` makes) goes in one ``send`` after
    redis-py's health check; what the send leaves, and any other command, goes through redis-py's own
    ``send_packed_command``. A ``send`` that fails has sent nothing (a stream socket's send fails before any byte
    goes), so the command is handed whole to redis-py's, which meets the same error and answers it its own way
    (disconnect, ConnectionError); a send that waited the socket's timeout to write is redis-py's TimeoutError at
    once (not waited for twice), and an interruption (a greenlet killed, a gevent Timeout) disconnects as redis-py's
    does."""

    _sock: Any

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if self._sock is None or type(command) is not list or len(command) != 1:
            return super().send_packed_command(command, check_health)  # type: ignore[misc,no-any-return]
        if check_health:
            self.check_health()  # type: ignore[attr-defined]
        sock = self._sock
        if sock is None:  # the health check failed and dropped it: redis-py's reconnects
            return super().send_packed_command(command, False)  # type: ignore[misc,no-any-return]
        item = command[0]
        try:
            sent = sock.send(item)
        except TimeoutError:  # the socket's timeout, waiting to write: not waited for again
            self.disconnect()  # type: ignore[attr-defined]
            raise redis.exceptions.TimeoutError("Timeout writing to socket") from None  # redis-py's answer
        except Exception:
            return super().send_packed_command(command, False)  # type: ignore[misc,no-any-return]
        except BaseException:
            self.disconnect()  # type: ignore[attr-defined]
            raise
        if sent < len(item):
            super().send_packed_command([memoryview(item)[sent:]], False)  # type: ignore[misc]
        return None


_ONE_SEND_CLASSES: dict[type, type] = {}


def send_in_one(conn: redis.Redis) -> None:
    """Have the connections ``conn``'s pool opens from now on send a command in one write (:class:`OneSend`).
    For the web (under gevent); a worker's plain socket's ``sendall`` is C, and as quick as its ``send``."""
    pool = conn.connection_pool
    kind = pool.connection_class
    if not issubclass(kind, OneSend):
        if kind not in _ONE_SEND_CLASSES:
            _ONE_SEND_CLASSES[kind] = type(f"OneSend{kind.__name__}", (OneSend, kind), {})
        pool.connection_class = _ONE_SEND_CLASSES[kind]


class SentinelPool(sentinel.FollowsSentinels, LeanPool):
    """:class:`LeanPool` whose server is the primary the Sentinels name (app/core/sentinel.py)."""


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
    """A client for the Redis of ``config`` (REDIS_URL, or the Sentinels' primary) with socket timeouts,
    health checks and the process's retry policy."""
    if not config.external_redis:
        raise ConfigError("REDIS_URL is not set: run `taskport up`, which starts an embedded Redis")
    t = config.redis_timeout if timeout is None else timeout
    # A bounded pool that waits up to the timeout for a free connection: under gevent a burst of
    # greenlets would otherwise open a connection each (and fail past redis-py's default of 100).
    options: dict[str, Any] = {
        "max_connections": POOL_SIZE, "timeout": t, "socket_timeout": t,
        "socket_connect_timeout": min(t, CONNECT_TIMEOUT), "health_check_interval": 30,
        "driver_info": NO_SETINFO,
        "retry": retry_policy(config, _ride_out if ride_out is None else ride_out),
    }
    if config.sentinel_addresses:
        pool: LeanPool = SentinelPool(**sentinel.pool_options(config, t), **options)
    else:
        assert config.redis_url is not None  # external_redis
        if config.redis_url.startswith("rediss://"):  # a plain redis:// URL takes no TLS arguments
            options["ssl_cert_reqs"] = config.redis_tls_verify  # TASKPORT_REDIS_TLS_VERIFY
        pool = LeanPool.from_url(config.redis_url, **options)
    client = Client(connection_pool=pool)
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
