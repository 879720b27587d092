"""The upgrade of a Redis of the earlier key layout (app/core/layout.py), on fakeredis."""

from __future__ import annotations

import fakeredis

from app.core import keys, layout


def test_layout_1_keys_are_renamed_with_their_values_and_lifetimes_and_then_never_again():
    conn = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    task_id = "0d8b8c3e-6f1a-4a55-9a0e-3c3f3f6d1e2a"
    conn.hset(f"tp:task:{{{task_id}}}", mapping={"status": "PENDING"})
    conn.expire(f"tp:task:{{{task_id}}}", 500)
    conn.set(f"tp:task:{{{task_id}}}:payload", b'{"n": 1}', ex=500)
    conn.zadd("tp:expiry", {task_id: 1})
    conn.set("tp:dedup:public:abc", task_id)
    conn.set("rq:job:x", "RQ's own: untouched")
    assert layout.upgrade(conn) == 4
    assert conn.hget(keys.task(task_id), "status") == b"PENDING" and 0 < conn.ttl(keys.task(task_id)) <= 500
    assert conn.get(keys.payload(task_id)) == b'{"n": 1}'
    assert conn.zscore(keys.EXPIRY, task_id) == 1
    assert conn.get(keys.dedup("public", "abc")) == task_id.encode()
    assert conn.get("rq:job:x") is not None and not list(conn.scan_iter(match="tp:*"))
    conn.set("tp:expiry", "written by an old process after the upgrade")
    assert layout.upgrade(conn) == 0  # the version is recorded: done once


def test_a_new_redis_is_just_marked():
    conn = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    assert layout.upgrade(conn) == 0
    assert conn.get(layout.VERSION_KEY) == str(layout.VERSION).encode()


def test_names():
    assert layout.new_name("tp:task:{abc}:result") == keys.result("abc")
    assert layout.new_name("tp:history:m") == keys.history("m")
    assert layout.new_name("tp:housekeeping:expire:lock") == keys.housekeeping_lock("expire")
