"""What a queued task's status read costs Redis (app.core.lines.PLACE) on a real server, by commandstats: a member
alone in its queue's ring reads its own counters and nothing of anyone else's, and TIME only when the queue has a
rate to estimate a start from."""

from __future__ import annotations

from pathlib import Path

import redis

from app.core import keys
from app.core.config import Config
from app.core.lines import Places
from app.web import create_app
from tests.integration.harness import RedisServer


def _calls(conn: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in conn.info("commandstats").items()}


def _read_cost(conn: redis.Redis, places: Places, task_id: str) -> dict[str, int]:
    before = _calls(conn)
    assert places.read(task_id)[1] is not None
    after = _calls(conn)
    cost = {name: n - before.get(name, 0) for name, n in after.items() if n - before.get(name, 0)}
    cost.pop("info", None)  # the commandstats read itself
    return cost


def test_a_queued_read_of_a_member_alone_in_its_ring(redis_server: RedisServer, redis_conn: redis.Redis,
                                                     tmp_path: Path) -> None:
    config = Config.from_env({}, redis_url=redis_server.url, data_dir=tmp_path, api_keys="ka:a,kb:b")
    client = create_app(config, redis.Redis.from_url(redis_server.url)).test_client()

    def submit(key: str) -> str:
        answer = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {"seconds": 0}},
                             headers={"Authorization": f"Bearer {key}", "Idempotency-Key": str(len(ids))})
        assert answer.status_code == 202, answer.get_data(as_text=True)
        task_id: str = answer.get_json()["task_id"]
        ids.append(task_id)
        return task_id

    ids: list[str] = []
    places = Places(redis_conn)
    first = submit("ka")
    submit("ka")
    places.read(first)  # loaded
    # the task's hash, the member's and the queue's counters, the ring, the higher queue's length: no rate, no TIME
    assert _read_cost(redis_conn, places, ids[1]) == {"evalsha": 1, "hgetall": 1, "hmget": 1, "lrange": 1,
                                                      "llen": 1}
    redis_conn.hset(keys.lines("default"), mapping={"gap": "100", "last": "1"})  # a rate: the start is estimated
    assert _read_cost(redis_conn, places, ids[1]) == {"evalsha": 1, "hgetall": 1, "hmget": 1, "lrange": 1,
                                                      "llen": 1, "time": 1}
    submit("kb")  # another member in the ring: its counters too, in one more HMGET
    assert _read_cost(redis_conn, places, ids[1]) == {"evalsha": 1, "hgetall": 1, "hmget": 2, "lrange": 1,
                                                      "llen": 1, "time": 1}
