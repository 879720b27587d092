"""Every write is safe to send twice: a reply lost after the write ran makes redis-py send the same call again.

The tour of every write script (tests/tour.py) runs on a real server through a client that sends each script
call twice, pipelines of them too (as redis-py's retry does after a lost reply: the same command, the same
arguments), and reads the whole keyspace between the two sends and after the second. The repeat must change
nothing and get the answer the first send got (app.core.lua.ONCE, docs/design.md "Writes sent twice").
"""

from __future__ import annotations

from typing import Any

import redis
from redis.client import Pipeline

from app.core import callbacks, schedule_scripts
from app.core.config import Config
from app.core.jobs import JobQueue
from app.core.store import TaskStore
from tests.integration.harness import RedisServer
from tests.tour import tour

SCRIPT_COMMANDS = ("EVALSHA", "EVAL")
READS: dict[str, Any] = {  # a key's whole value, by its type
    "string": lambda c, k: c.get(k), "hash": lambda c, k: c.hgetall(k), "list": lambda c, k: c.lrange(k, 0, -1),
    "set": lambda c, k: c.smembers(k), "zset": lambda c, k: c.zrange(k, 0, -1, withscores=True),
    "stream": lambda c, k: c.xrange(k),
}


def keyspace(conn: redis.Redis) -> dict[bytes, Any]:
    """Every key: its value as a comparable structure, and whether it has a lifetime."""
    seen: dict[bytes, Any] = {}
    for key in conn.scan_iter(count=1000):
        kind = conn.type(key).decode()
        read = READS[kind]
        value = read(conn, key)
        seen[key] = (kind, value, conn.pttl(key) > 0)
    return seen


class Repeats:
    """What each doubled call did: (what was sent, first answer, second answer, keyspace after each)."""

    def __init__(self, watcher: redis.Redis) -> None:
        self.watcher = watcher
        self.calls: list[tuple[Any, Any, Any, dict[bytes, Any], dict[bytes, Any]]] = []

    def twice(self, sent: Any, send: Any) -> Any:
        first = send()
        between = keyspace(self.watcher)
        second = send()
        self.calls.append((sent, first, second, between, keyspace(self.watcher)))
        return first


class TwicePipeline(Pipeline):
    repeats: Repeats

    def execute(self, raise_on_error: bool = True) -> Any:
        stack = list(self.command_stack)
        if not any(args[0] in SCRIPT_COMMANDS for args, _ in stack):
            return super().execute(raise_on_error)

        def send() -> Any:
            self.command_stack = list(stack)
            return super(TwicePipeline, self).execute(raise_on_error)

        return self.repeats.twice([args[:3] for args, _ in stack], send)


class Twice(redis.Redis):
    """A client that sends every script call, alone or in a pipeline, twice."""

    repeats: Repeats

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args[0] not in SCRIPT_COMMANDS:
            return super().execute_command(*args, **options)
        return self.repeats.twice(args[:3], lambda: super(Twice, self).execute_command(*args, **options))

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = TwicePipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.repeats = self.repeats
        return pipe


def test_every_script_sent_twice_changes_nothing_more_and_answers_the_same(redis_server: RedisServer,
                                                                             tmp_path: Any) -> None:
    watcher = redis_server.client()
    watcher.flushall()
    conn = Twice(unix_socket_path=str(redis_server.socket))
    conn.repeats = Repeats(watcher)
    config = Config.from_env({}, redis_url=redis_server.url, data_dir=tmp_path)
    store = TaskStore(conn, config)
    tour(store, JobQueue(conn, config), conn)

    others = (*callbacks.SCRIPTS, *schedule_scripts.SCRIPTS.values())
    sources = {**store._sources, **{s.name: s.source() for s in others}}
    names = {**{watcher.script_load(source): name for name, source in sources.items()},
             **{source: name for name, source in sources.items()}}  # EVALSHA sends the digest, EVAL the source
    doubled: set[str] = set()
    differ = []
    for sent, first, second, between, after in conn.repeats.calls:
        called = [names[part[1]] for part in (sent if isinstance(sent, list) else [sent]) if part[0] in SCRIPT_COMMANDS]
        doubled.update(called)
        if first != second or between != after:
            changed = sorted(k for k in between.keys() | after.keys() if between.get(k) != after.get(k))
            differ.append((called, first, second, changed))
    assert differ == []
    assert doubled == set(sources)  # every write script was sent twice
