"""Per-member rate limits: on by default with API keys, off in open mode, 429 problem+json with Retry-After."""

from __future__ import annotations

import pytest

from app.core.config import KEYED_RATE_LIMIT, Config, ConfigError
from app.web import create_app

TASKS = "/api/v1/tasks"


def make_client(tmp_path, conn, **env: str):
    config = Config.from_env(env, redis_url="redis://fake", data_dir=tmp_path)
    return create_app(config, conn=conn).test_client()


def test_defaults_are_on_with_keys_and_off_in_open_mode() -> None:
    assert Config.from_env({}).request_limit == ""
    assert Config.from_env({"TASKPORT_API_KEYS": "k:a"}).request_limit == KEYED_RATE_LIMIT
    assert Config.from_env({"TASKPORT_API_KEYS": "k:a", "TASKPORT_RATE_LIMIT": "off"}).request_limit == ""
    assert Config.from_env({"TASKPORT_RATE_LIMIT": "5/second"}).request_limit == "5/second"


def test_a_malformed_limit_stops_the_process_with_one_line() -> None:
    with pytest.raises(ConfigError, match="TASKPORT_RATE_LIMIT"):
        Config.from_env({"TASKPORT_RATE_LIMIT": "lots"})


def test_over_the_limit_is_429_problem_with_retry_after_per_member(tmp_path, conn) -> None:
    client = make_client(tmp_path, conn, TASKPORT_API_KEYS="ka:alice,kb:bob", TASKPORT_RATE_LIMIT="3/minute")
    alice, bob = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
    assert [client.get(TASKS, headers=alice).status_code for _ in range(3)] == [200, 200, 200]
    over = client.get(TASKS, headers=alice)
    assert over.status_code == 429
    assert over.content_type == "application/problem+json"
    assert over.get_json()["status"] == 429
    assert 0 < int(over.headers["Retry-After"]) <= 60
    assert client.get(TASKS, headers=bob).status_code == 200  # bob has a budget of his own
    assert client.get("/healthz").status_code == 200  # outside the task API: never limited


def test_a_missing_key_is_401_not_counted(tmp_path, conn) -> None:
    client = make_client(tmp_path, conn, TASKPORT_API_KEYS="ka:alice", TASKPORT_RATE_LIMIT="1/minute")
    assert [client.get(TASKS).status_code for _ in range(3)] == [401, 401, 401]
    assert client.get(TASKS, headers={"Authorization": "Bearer ka"}).status_code == 200


def test_open_mode_is_never_throttled_unless_asked(tmp_path, conn) -> None:
    client = make_client(tmp_path, conn)
    assert {client.get(TASKS).status_code for _ in range(50)} == {200}
