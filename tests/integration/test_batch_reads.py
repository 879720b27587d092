"""A batch's status read on a real server: the same Redis work for 10 tasks as for 1,000 (commandstats), one
HGETALL, because the transition scripts keep its counters (app.core.batchscripts)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import redis

from app.core.config import Config
from app.web import create_app
from tests.integration.harness import RedisServer


def _calls(conn: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in conn.info("commandstats").items()}


def test_a_batch_read_costs_the_same_commands_for_10_and_1000_tasks(redis_server: RedisServer,
                                                                     redis_conn: redis.Redis, tmp_path: Path) -> None:
    config = Config.from_env({}, redis_url=redis_server.url, data_dir=tmp_path)
    app = create_app(config, redis.Redis.from_url(redis_server.url))
    client = app.test_client()
    costs: dict[int, dict[str, int]] = {}
    for size in (10, 1000):
        tasks = [{"type": "demo.sleep", "payload": {"seconds": 0}, "dedup_key": uuid.uuid4().hex}
                 for _ in range(size)]
        answer = client.post("/api/v1/batches", json={"tasks": tasks})
        assert answer.status_code == 202, answer.get_data(as_text=True)
        path = answer.get_json()["links"]["self"]
        assert client.get(path).status_code == 200  # warm: the first request of a path may load more
        before = _calls(redis_conn)
        for _ in range(5):
            doc: Any = client.get(path).get_json()
            assert doc["size"] == size and doc["counts"]["PENDING"] == size
        after = _calls(redis_conn)
        costs[size] = {name: n - before.get(name, 0) for name, n in after.items() if n - before.get(name, 0)}
        costs[size].pop("info", None)  # the commandstats read itself
    assert costs[10] == costs[1000], costs
    assert costs[10] == {"hgetall": 5}, costs  # one HGETALL per read, and nothing else
