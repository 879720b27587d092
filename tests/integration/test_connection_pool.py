"""app.core.connection.LeanPool against a real redis-server: skipping redis-py's "unread reply?" poll on every
checkout is safe because a command that is interrupted never gives its connection back still connected."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from app.core.config import Config
from app.core.connection import LeanPool, connect
from tests.integration.harness import RedisServer, wait_until


@pytest.fixture
def lean(redis_server: RedisServer, redis_conn: redis.Redis, tmp_path: Path) -> Iterator[redis.Redis]:
    client = connect(Config.from_env({}, redis_url=redis_server.url, data_dir=tmp_path), timeout=0.2)
    assert isinstance(client.connection_pool, LeanPool)
    yield client
    client.close()


def _blocked(conn: redis.Redis) -> list[dict[str, object]]:
    return [c for c in conn.client_list() if c.get("cmd") == "blpop"]


def test_a_timed_out_command_leaves_no_reply_behind_for_the_next(lean: redis.Redis, redis_conn: redis.Redis) -> None:
    with pytest.raises(redis.exceptions.TimeoutError):
        lean.blpop(["{tp}:test:list"], timeout=5)  # the server answers in 5 s; the client gives up at 0.2 s
    # The interrupted connection was closed, so the server dropped the blocked BLPOP with it ...
    wait_until(lambda: not _blocked(redis_conn), timeout=5, message="the abandoned BLPOP to be dropped")
    redis_conn.rpush("{tp}:test:list", "item")
    assert redis_conn.llen("{tp}:test:list") == 1  # ... and nothing took this item for a caller long gone
    # the next command on the pool gets its own reply, not one meant for the BLPOP
    redis_conn.set("{tp}:test:key", "value")
    assert lean.get("{tp}:test:key") == b"value"
    assert lean.lpop("{tp}:test:list") == b"item"


def test_an_exception_inside_a_read_closes_the_connection_before_it_goes_back(
    lean: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Interrupted(BaseException):
        """What gevent raises in a greenlet it kills (GreenletExit, Timeout): not an Exception."""

    lean.ping()
    pool = lean.connection_pool
    conn = pool.get_connection()
    pool.release(conn)

    def interrupted(*args: object, **kwargs: object) -> None:
        raise Interrupted

    monkeypatch.setattr(conn._parser, "read_response", interrupted)
    with pytest.raises(Interrupted):
        lean.set("{tp}:test:key", "sent, reply never read")
    monkeypatch.undo()
    assert conn._sock is None  # disconnected: the unread reply went with the socket
    assert lean.get("{tp}:test:key") == b"sent, reply never read"  # reconnected on the next checkout


def test_the_pool_stays_bounded_and_waits_for_a_free_connection(lean: redis.Redis) -> None:
    pool = lean.connection_pool
    held = [pool.get_connection() for _ in range(pool.max_connections)]
    with pytest.raises(redis.exceptions.ConnectionError, match="No connection available"):
        lean.ping()  # waited the pool's timeout (0.2 s) for one, then gave up
    pool.release(held.pop())
    assert lean.ping()
    for conn in held:
        pool.release(conn)


def test_a_script_runs_though_its_load_lands_on_another_server(lean: redis.Redis,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A NOSCRIPT is answered with SCRIPT LOAD and EVALSHA on one pipeline: redis-py's own SCRIPT LOAD, then
    EVALSHA, takes two connections, and a failover between them (the load to the old primary, emulated here by
    a load that leaves the cache empty) failed the call with NOSCRIPT again (a 500 in the soak on the bed)."""
    script = lean.register_script("return redis.call('INCR', KEYS[1])")
    lean.script_flush()
    monkeypatch.setattr(lean, "script_load", lambda source: lean.script_flush() and script.sha)
    assert script(keys=["{tp}:test:counter"]) == 1
    assert lean.script_exists(script.sha) == [True]  # the next call is one EVALSHA
    assert script(keys=["{tp}:test:counter"]) == 2
