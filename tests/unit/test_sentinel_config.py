"""Sentinel settings without a server: REDIS_SENTINELS parsed and its companions checked (Config), the URL the
dashboard names, NOREPLICAS read as NoReplicaError and answered 503, and TASKPORT_REPLICA_ACK's WAIT.

fakeredis has no WAIT, so the replica-ack tests put the answer a primary would give in its place
(``waits``); the real WAIT, against real replicas, is tests/integration/test_sentinel.py's.
"""

from __future__ import annotations

import base64
import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from redis.connection import DefaultParser

from app.core.answers import NewTask
from app.core.config import Config, ConfigError
from app.core.connection import NoReplicaError
from app.core.store import TaskStore
from app.web import create_app
from app.web.dashboard import displayed_url
from app.web.errors import UNAVAILABLE_DETAILS, redis_unavailable

PROBLEM = "application/problem+json"
SENTINELS = {"REDIS_SENTINELS": "10.0.0.1:26379,10.0.0.2:26380", "REDIS_SENTINEL_MASTER": "taskport"}


def sentinel_config(**env: str) -> Config:
    return Config.from_env({**SENTINELS, **env})


# -- Config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "addresses"), [
    ("10.0.0.1:26379,10.0.0.2:26380", [("10.0.0.1", 26379), ("10.0.0.2", 26380)]),
    (" s1.internal:26379 , ,s2.internal:1,", [("s1.internal", 26379), ("s2.internal", 1)]),
    ("[::1]:26379,[fd00::2]:65535", [("::1", 26379), ("fd00::2", 65535)]),
])
def test_sentinels_are_parsed_to_host_port_pairs(raw: str, addresses: list[tuple[str, int]]) -> None:
    config = sentinel_config(REDIS_SENTINELS=raw)
    assert config.sentinel_addresses == addresses
    assert config.external_redis


@pytest.mark.parametrize("entry", ["sentinel", "sentinel:", ":26379", "h:0", "h:65536", "h:-1", "h:2637x",
                                   "h:２６３７９", "[::1]"])
def test_a_bad_sentinel_entry_is_a_config_error_naming_the_variable(entry: str) -> None:
    with pytest.raises(ConfigError, match=r"REDIS_SENTINELS .*host:port") as caught:
        sentinel_config(REDIS_SENTINELS=f"10.0.0.1:26379,{entry}")
    assert repr(entry) in str(caught.value)


def test_sentinels_need_the_masters_name() -> None:
    with pytest.raises(ConfigError, match="REDIS_SENTINEL_MASTER"):
        Config.from_env({"REDIS_SENTINELS": "10.0.0.1:26379"})


def test_sentinels_and_a_redis_url_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="REDIS_SENTINELS or REDIS_URL, not both"):
        sentinel_config(REDIS_URL="redis://10.0.0.3:6379/0")


def test_the_spawn_worker_is_refused_with_sentinels_and_the_others_are_not() -> None:
    with pytest.raises(ConfigError, match=r"TASKPORT_WORKER_CLASS=spawn.*rq/rq#2281"):
        sentinel_config(TASKPORT_WORKER_CLASS="spawn")
    for worker_class in ("simple", "fork"):
        assert sentinel_config(TASKPORT_WORKER_CLASS=worker_class).worker_class == worker_class
    assert Config.from_env({"TASKPORT_WORKER_CLASS": "spawn"}).worker_class == "spawn"  # no Sentinels: allowed


@pytest.mark.parametrize(("env", "external"), [
    ({}, False),
    ({"REDIS_URL": "redis://10.0.0.3:6379/0"}, True),
    (SENTINELS, True),
    ({"REDIS_SENTINELS": " , ", "REDIS_SENTINEL_MASTER": "taskport"}, False),  # no entry: the embedded Redis
])
def test_external_redis_says_whether_taskport_up_starts_none(env: dict[str, str], external: bool) -> None:
    assert Config.from_env(env).external_redis is external


def test_every_process_gets_the_sentinel_settings() -> None:
    """Workers and the scheduler connect through the Sentinels too: none of the settings is the web's alone."""
    config = sentinel_config(REDIS_SENTINEL_PASSWORD="sp", REDIS_PASSWORD="rp", TASKPORT_REPLICA_ACK="1")
    for role in ("web", "worker", "scheduler"):
        child = Config.from_env(config.child_environ(role))
        assert (child.sentinel_addresses, child.redis_sentinel_master, child.redis_sentinel_password,
                child.redis_password, child.replica_ack) == (
            config.sentinel_addresses, "taskport", "sp", "rp", True), role


# -- the dashboard's URL ------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "url"), [
    (SENTINELS, "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/taskport"),
    ({"REDIS_URL": "rediss://:pw@10.0.0.3:6380/0"}, "rediss://:pw@10.0.0.3:6380/0"),
    ({}, "redis://localhost:6379/0"),
])
def test_displayed_url(env: dict[str, str], url: str) -> None:
    assert displayed_url(Config.from_env(env)) == url


def operator() -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(b"admin:s3cret").decode()}


@pytest.mark.parametrize("sentinels", ["10.0.0.1:26379,10.0.0.2:26380", "[::1]:26379,[::1]:26380"])
def test_the_dashboard_names_the_sentinels_and_reads_the_apps_redis(conn: Any, tmp_path: Any, sentinels: str) -> None:
    """/rq answers with the Sentinels named on the page, whatever their addresses. (rq-dashboard's own
    per-request hook parses the URL it is given with redis_sentinel_url, which reads no IPv6 address.)"""
    config = Config.from_env({"REDIS_SENTINELS": sentinels, "REDIS_SENTINEL_MASTER": "taskport",
                              "TASKPORT_DASHBOARD_PASSWORD": "s3cret"}, data_dir=tmp_path)
    client = create_app(config, conn=conn).test_client()
    page = client.get("/rq/", headers=operator())
    assert page.status_code == 200, page.get_data(as_text=True)[:500]
    assert "redis+sentinel://" in page.get_data(as_text=True)
    assert client.get("/rq/0/data/queues.json", headers=operator()).status_code == 200


# -- NOREPLICAS -----------------------------------------------------------------------------------


def test_noreplicas_is_a_no_replica_error_and_the_web_calls_it_so() -> None:
    error = DefaultParser(socket_read_size=65536).parse_error("NOREPLICAS Not enough good replicas to write.")
    assert isinstance(error, NoReplicaError) and isinstance(error, redis.exceptions.ConnectionError)
    assert redis_unavailable(error) == "NOREPLICAS"
    assert redis_unavailable(NoReplicaError("the write reached 0 replicas")) == "NOREPLICAS"
    # a plain ResponseError whose text carries the code (as a script's error may) is read by its text
    wrapped = redis.exceptions.ResponseError(
        "NOREPLICAS Not enough good replicas to write. script: 1a2b, on @user_script:9.")
    assert redis_unavailable(wrapped) == "NOREPLICAS"
    assert "replica" in UNAVAILABLE_DETAILS["NOREPLICAS"]


@dataclass
class Waits:
    """What stands in for WAIT: each one asked is recorded as (replicas, timeout ms) and answered ``answer``."""

    answer: int = 0
    asked: list[tuple[int, int]] = field(default_factory=list)


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> Waits:
    stub = Waits()

    def wait(pipe: Any, num_replicas: int, timeout: int) -> Any:
        stub.asked.append((num_replicas, timeout))
        return pipe.eval(f"return {stub.answer}", 0)  # queued on the pipeline, as the WAIT would be

    monkeypatch.setattr(redis.client.Pipeline, "wait", wait)
    return stub


def new_task() -> NewTask:
    task_id = str(uuid.uuid4())
    return NewTask(task_id=task_id, member="public", type="demo.sleep", payload={"seconds": 0},
                   dedup_digest=task_id, priority="default", max_attempts=1)


@pytest.fixture
def acking(conn: Any, config: Config) -> Callable[[], TaskStore]:
    return lambda: TaskStore(conn, dataclasses.replace(config, replica_ack=True, redis_timeout=3.0))


def test_replica_ack_waits_for_a_replica_and_none_is_a_no_replica_error(
        acking: Callable[[], TaskStore], conn: Any, waits: Waits) -> None:
    store = acking()
    waits.answer = 1
    store.create(new_task())  # a fresh server: this one also loads the script (NOSCRIPT, repeated)
    waits.asked.clear()
    waits.answer = 0
    new = new_task()
    with pytest.raises(NoReplicaError, match="reached 0 replicas"):
        store.create(new)
    assert waits.asked == [(1, 1500)]  # one replica, within half the socket timeout
    waits.answer = 1
    other = new_task()
    assert store.create(other).created
    assert len(waits.asked) == 2
    assert store.cancel(other.task_id).done
    assert len(waits.asked) > 2  # the cancel waited too (its script's first call: twice, NOSCRIPT)
    assert store.get(other.task_id).status == "CANCELLED"  # type: ignore[union-attr]


def test_replica_ack_loads_a_script_a_failover_left_uncached(
        acking: Callable[[], TaskStore], conn: Any, waits: Waits) -> None:
    """A promoted replica's script cache is empty: the EVALSHA's NOSCRIPT loads the script, and the call
    is repeated once (with its WAIT)."""
    store = acking()
    waits.answer = 1
    assert store.create(new_task()).created
    conn.script_flush()
    waits.asked.clear()
    new = new_task()
    assert store.create(new).created
    assert len(waits.asked) == 2
    assert store.get(new.task_id) is not None


def test_without_replica_ack_nothing_waits(store: TaskStore, waits: Waits) -> None:
    new = new_task()
    assert store.create(new).created and store.cancel(new.task_id).done
    assert waits.asked == []


def test_a_submit_no_replica_took_is_a_503_with_retry_after(conn: Any, config: Config, waits: Waits) -> None:
    """503, not 202: nothing was confirmed. The write itself is on the primary (WAIT confirms, it cannot
    undo), so the same submit repeated within the dedup window is a duplicate of it, 409 naming it."""
    client = create_app(dataclasses.replace(config, replica_ack=True), conn=conn).test_client()
    body = {"type": "demo.sleep", "payload": {"seconds": 1}}
    r = client.post("/api/v1/tasks", json=body)
    assert r.status_code == 503 and r.headers["Content-Type"] == PROBLEM
    assert r.headers["Retry-After"] == "5"
    assert r.get_json()["detail"] == UNAVAILABLE_DETAILS["NOREPLICAS"]
    waits.answer = 1
    assert client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {"seconds": 2}}).status_code == 202
    again = client.post("/api/v1/tasks", json=body)
    assert again.status_code == 409 and again.get_json()["existing"]["status"] == "PENDING"
