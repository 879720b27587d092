"""app.core.connection.LeanPool against a real redis-server: skipping redis-py's "unread reply?" poll on every
checkout is safe because a command that is interrupted never gives its connection back still connected."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from app.core.config import Config
from app.core.connection import LeanPipeline, LeanPool, connect, send_in_one
from app.core.packer import use_lean_packer
from tests.integration.harness import REPO_ROOT, RedisServer, wait_until


@pytest.fixture
def lean(redis_server: RedisServer, redis_conn: redis.Redis, tmp_path: Path) -> Iterator[redis.Redis]:
    client = connect(Config.from_env({}, redis_url=redis_server.url, data_dir=tmp_path), timeout=0.2)
    assert isinstance(client.connection_pool, LeanPool)
    use_lean_packer(client)  # and as the web has them: one string a command, in one send
    send_in_one(client)
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


# -- Client.execute_command's short path (bench/README.md, "A Redis round trip under gevent") ----------------------


def test_a_command_answers_as_redis_pys_own_path_does(lean: redis.Redis, redis_conn: redis.Redis,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Response callbacks, options (NEVER_DECODE, EMPTY_RESPONSE) and error replies as redis-py's path gives them,
    with no OpenTelemetry call on the way (redis-py's path made one per command: each looked for a collector)."""
    redis_conn.hset("{tp}:test:hash", mapping={"a": "1", "b": "2"})
    redis_conn.set("{tp}:test:string", "value")
    dumped = redis_conn.dump("{tp}:test:string")
    recorded: list[str] = []
    monkeypatch.setattr(redis.client, "record_operation_duration", lambda **kw: recorded.append(kw["command_name"]))
    monkeypatch.setattr(redis.client, "record_error_count", lambda **kw: recorded.append("error"))
    plain = redis.Redis(connection_pool=lean.connection_pool)  # redis-py's own path, the same connections
    for client in (lean, plain):
        assert client.get("{tp}:test:missing") is None
        assert client.hgetall("{tp}:test:hash") == {b"a": b"1", b"b": b"2"}  # the HGETALL callback pairs it
        assert client.exists("{tp}:test:hash", "{tp}:test:missing") == 1
        assert client.set("{tp}:test:other", "x") is True  # the SET callback: OK -> True
        assert client.dump("{tp}:test:string") == dumped  # NEVER_DECODE
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            client.get("{tp}:test:hash")
        with pytest.raises(redis.exceptions.NoScriptError):
            client.evalsha("0" * 40, 0)
        if client is lean:
            assert recorded == []
    assert recorded == ["GET", "HGETALL", "EXISTS", "SET", "DUMP", "error", "error"]  # redis-py's path only
    pool = lean.connection_pool
    assert len([c for c in pool.pool.queue if c is not None]) == len(pool._connections)  # every one given back


def test_a_connection_the_server_dropped_is_retried_once_on_a_new_one(lean: redis.Redis,
                                                                      redis_conn: redis.Redis) -> None:
    first = lean.client_id()
    redis_conn.client_kill_filter(_id=first)  # a restart's dropped connection: the pool still holds it
    assert lean.get("{tp}:test:missing") is None  # the read found the socket closed; the retry reconnected
    assert lean.client_id() != first


def test_a_frozen_server_is_a_timeout_within_the_socket_timeouts_and_the_pool_stays_whole(
        lean: redis.Redis, redis_server: RedisServer) -> None:
    """SIGSTOP: the server holds the connection and answers nothing (a hung host). The web's policy is one retry:
    two reads of 0.2 s, one quick backoff; then the connections are all back in the pool, and serve again."""
    lean.ping()
    assert redis_server.pid is not None
    os.kill(redis_server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            lean.get("{tp}:test:key")
        took = time.monotonic() - started
    finally:
        os.kill(redis_server.pid, signal.SIGCONT)
    assert 0.4 <= took < 1.0, took
    pool = lean.connection_pool
    assert len([c for c in pool.pool.queue if c is not None]) == len(pool._connections)
    assert lean.ping()


FROZEN_UNDER_GEVENT = """
import sys, time
from gevent import monkey; monkey.patch_all()
import gevent, redis
from app.core.config import Config
from app.core.connection import connect, send_in_one
from app.core.packer import use_lean_packer
client = connect(Config.from_env({}, redis_url=sys.argv[1]), timeout=0.3)
use_lean_packer(client)  # as app.web.runtime builds the web's
send_in_one(client)
client.ping()
print("ready", flush=True)
sys.stdin.readline()  # the server is frozen now
ticks = []
def tick():
    while True:
        ticks.append(time.monotonic())
        gevent.sleep(0.01)
ticker = gevent.spawn(tick)
started = time.monotonic()
try:
    client.get("{tp}:test:key")
    outcome = "answered"
except redis.exceptions.TimeoutError:
    outcome = "timeout"
took = time.monotonic() - started
ticker.kill()
gaps = [b - a for a, b in zip(ticks, ticks[1:])]
print(outcome, round(took, 3), len(ticks), round(max(gaps), 3), flush=True)
"""


def test_a_frozen_server_blocks_no_other_greenlet_under_gevent(redis_server: RedisServer, tmp_path: Path) -> None:
    """The web's client under gevent, the server frozen: the command times out within its socket timeouts while a
    greenlet beside it keeps ticking every 10 ms (no wait for a reply blocks the process)."""
    with subprocess.Popen([sys.executable, "-c", FROZEN_UNDER_GEVENT, redis_server.url], cwd=REPO_ROOT,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            assert child.stdout.readline().strip() == "ready"
            assert redis_server.pid is not None
            os.kill(redis_server.pid, signal.SIGSTOP)
            try:
                child.stdin.write("go\n")
                child.stdin.flush()
                outcome, took, ticks, widest = child.stdout.readline().split()
            finally:
                os.kill(redis_server.pid, signal.SIGCONT)
            assert child.wait(30) == 0
        finally:
            if child.poll() is None:
                child.kill()
    assert outcome == "timeout"
    assert 0.6 <= float(took) < 1.5, took  # two reads of 0.3 s (the web's one retry) and a quick backoff
    assert int(ticks) >= 30 and float(widest) < 0.1, (ticks, widest)  # ~10 ms apart all along


# -- LeanPipeline's execute (bench/README.md, "Pipelines through the short path") -----------------------------------


def _pipeline_answers(pipe: redis.client.Pipeline) -> list[object]:
    """What a pipeline gives back for a batch with callbacks, NEVER_DECODE and an error reply in it: the list with
    ``raise_on_error=False``, then the error ``execute()`` raises with it on."""
    answers: list[object] = []
    for raise_on_error in (False, True):
        pipe.hgetall("{tp}:test:hash").set("{tp}:test:other", "x").get("{tp}:test:hash")
        pipe.dump("{tp}:test:string").exists("{tp}:test:hash", "{tp}:test:missing")
        try:
            answers.append([(type(r), r.args) if isinstance(r, Exception) else r
                            for r in pipe.execute(raise_on_error)])
        except redis.exceptions.ResponseError as error:
            answers.append((type(error), error.args))
    return answers


def test_a_pipeline_answers_as_redis_pys_own_does(lean: redis.Redis, redis_conn: redis.Redis,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Without and with MULTI/EXEC: the same replies, the same error objects in place, the same annotated error raised,
    an empty pipeline's [], with no OpenTelemetry call (redis-py's execute made one per pipeline: failed before)."""
    redis_conn.hset("{tp}:test:hash", mapping={"a": "1"})
    redis_conn.set("{tp}:test:string", "value")
    recorded: list[str] = []
    monkeypatch.setattr(redis.client, "record_operation_duration", lambda **kw: recorded.append(kw["command_name"]))
    monkeypatch.setattr(redis.client, "record_error_count", lambda **kw: recorded.append("error"))
    for transaction in (False, True):
        ours = lean.pipeline(transaction=transaction)
        assert isinstance(ours, LeanPipeline)
        theirs = redis.client.Pipeline(lean.connection_pool, lean.response_callbacks, transaction, None)
        assert ours.execute() == theirs.execute() == []
        mine = _pipeline_answers(ours)
        assert recorded == []
        assert mine == _pipeline_answers(theirs)
        assert mine[0][0] == {b"a": b"1"} and mine[0][1] is True and "WRONGTYPE" in str(mine[0][2])
        assert mine[1][0] is redis.exceptions.ResponseError and "Command # 3" in str(mine[1][1][0])
        recorded.clear()
    pool = lean.connection_pool
    assert len([c for c in pool.pool.queue if c is not None]) == len(pool._connections)  # every one given back


def test_a_pipeline_on_a_connection_the_server_dropped_is_retried_once_on_a_new_one(lean: redis.Redis,
                                                                                  redis_conn: redis.Redis) -> None:
    first = lean.client_id()
    redis_conn.client_kill_filter(_id=first)
    for transaction in (False, True):
        pipe = lean.pipeline(transaction=transaction)
        pipe.client_id().get("{tp}:test:missing")
        second, missing = pipe.execute()
        assert missing is None and second != first
        redis_conn.client_kill_filter(_id=second)
        first = second


def test_a_watching_pipeline_keeps_redis_pys_execute(lean: redis.Redis, redis_conn: redis.Redis) -> None:
    """A WATCHed key changed: WatchError, and a dropped connection while WATCHing is WatchError too (redis-py's)."""
    with lean.pipeline() as pipe:
        pipe.watch("{tp}:test:watched")
        redis_conn.set("{tp}:test:watched", "changed")
        pipe.multi()
        pipe.set("{tp}:test:watched", "mine")
        with pytest.raises(redis.exceptions.WatchError):
            pipe.execute()
    assert redis_conn.get("{tp}:test:watched") == b"changed"
    with lean.pipeline() as pipe:
        pipe.watch("{tp}:test:watched")
        watching = pipe.connection
        assert watching is not None
        watching.send_command("CLIENT", "ID")
        redis_conn.client_kill_filter(_id=watching.read_response())  # the server drops the WATCHing connection
        pipe.multi()
        pipe.set("{tp}:test:watched", "mine")
        with pytest.raises(redis.exceptions.WatchError):
            pipe.execute()
    assert redis_conn.get("{tp}:test:watched") == b"changed"


def test_a_batch_skips_redis_pys_himport_preflight_unless_it_has_an_himport(lean: redis.Redis,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The pre-flight (a registry lookup and every command's arguments parsed) only for a batch with an HIMPORT: then
    the whole batch is redis-py's own (the server here has no HIMPORT: its error reply, raised in place)."""
    preflights: list[int] = []
    real = redis._himport_exec.pipeline_prepares
    monkeypatch.setattr(redis._himport_exec, "pipeline_prepares",
                        lambda node, conn, batch: preflights.append(len(batch)) or real(node, conn, batch))
    pipe = lean.pipeline(transaction=False)
    assert pipe.get("{tp}:test:missing").ping().execute() == [None, True]
    assert preflights == []
    pipe.get("{tp}:test:missing").execute_command("himport", "SET", "{tp}:test:h", "fieldset", "1")
    with pytest.raises(redis.exceptions.ResponseError, match="Command # 2 .*unknown command"):
        pipe.execute()
    assert preflights == [2]
    assert pipe.get("{tp}:test:missing").execute() == [None]  # the connection in step after the error
