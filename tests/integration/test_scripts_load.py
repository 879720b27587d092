"""Every script, as its store renders it (app.core.lua.prune having dropped the functions it never calls), compiles
on a real Valkey: SCRIPT LOAD compiles the source, so a prune that cut a block wrong fails here."""

from __future__ import annotations

import hashlib

import redis

from tests.integration.harness import RedisServer
from tests.unit.test_lua_prune import every_source


def test_every_rendered_script_loads_on_valkey(redis_server: RedisServer) -> None:
    conn = redis.Redis.from_url(redis_server.url)
    sources = every_source()
    assert len(sources) > 20
    for name, source in sources.items():
        assert conn.script_load(source) == hashlib.sha1(source.encode()).hexdigest(), name
