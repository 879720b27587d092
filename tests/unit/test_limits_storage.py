"""The rate limiter's storage (app.web.limits.HitStatsStorage): its hit answers the count and the TTL that the
X-RateLimit-* headers need, so a counted request asks Redis nothing more for them. These fail when limits or
flask-limiter change the parts it relies on: the storage methods the headers call, the key the hit writes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import limits
import pytest
from limits.storage import RedisStorage

from app.core.config import Config
from app.web import create_app
from app.web.limits import LIMITS_MAJOR, HitStatsStorage

ALICE = {"Authorization": "Bearer ka"}
TASKS = "/api/v1/tasks"


def keyed_client(tmp_path: Path, conn: Any, limit: str) -> Any:
    config = Config.from_env({"TASKPORT_API_KEYS": "ka:alice", "TASKPORT_RATE_LIMIT": limit},
                             redis_url="redis://fake", data_dir=tmp_path)
    return create_app(config, conn=conn).test_client()


def test_it_extends_the_limits_major_version_installed() -> None:
    assert int(limits.__version__.split(".")[0]) == LIMITS_MAJOR


def test_the_headers_come_from_the_hit_not_from_more_reads(tmp_path: Path, conn: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    client = keyed_client(tmp_path, conn, "5/minute")

    def asked(*_: Any) -> Any:
        raise AssertionError("the headers read Redis again after the hit")

    monkeypatch.setattr(RedisStorage, "get", asked)
    monkeypatch.setattr(RedisStorage, "get_expiry", asked)
    answers = [client.get(TASKS, headers=ALICE) for _ in range(6)]
    assert [a.status_code for a in answers] == [200] * 5 + [429]
    assert [a.headers["X-RateLimit-Remaining"] for a in answers[:5]] == ["4", "3", "2", "1", "0"]
    assert all(a.headers["X-RateLimit-Limit"] == "5" for a in answers[:5])
    reset = int(answers[0].headers["X-RateLimit-Reset"])
    assert time.time() < reset <= time.time() + 61  # the window's end, from the hit's TTL


def test_its_counter_is_the_one_limits_own_storage_reads(conn: Any) -> None:
    """The hit writes limits' own key (prefix and all): the two storages read the same window."""
    ours = HitStatsStorage("taskport+redis://", connection_pool=conn.connection_pool)
    theirs = RedisStorage("redis://", connection_pool=conn.connection_pool)
    assert ours.incr("k", 60, amount=3) == 3 and ours.incr("k", 60) == 4
    assert theirs.get("k") == 4 and 58 <= theirs.get_expiry("k") - time.time() <= 61
    assert ours.get("k") == 4  # outside a request: read from Redis, as limits does
