"""app.core.packer: the same bytes as redis-py's hiredis packer for every argument type, the same refusals;
who packs with it (the web, the workers)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from redis.connection import HiredisRespSerializer
from redis.exceptions import DataError
from rq.job import JobStatus

from app.core.config import Config
from app.core.keys import TaskField
from app.core.packer import LeanPacker
from app.web.runtime import Runtime

CALLS = [
    ("EVALSHA", "a" * 40, 2, "k1", "k2", "é", b"\x00\xff", 0, -5, 2**70, 1.5, JobStatus.QUEUED, TaskField.STATUS, ""),
    ("HGETALL", "{tp}:task:x"),
    ("SET", "k", bytearray(b"ab")),
    ("SET", "k", memoryview(b"ab")),
    ("CLIENT SETNAME", "web"),
    ("CLIENT\tLIST",),
    (b"GET", "k"),
    (b"CLIENT SETNAME", "web"),
]


@pytest.mark.parametrize("args", CALLS)
def test_same_bytes_as_redis_py(args: tuple) -> None:
    assert LeanPacker().pack(*args) == HiredisRespSerializer().pack(*args)


@pytest.mark.parametrize("bad", [None, object(), [1]])
def test_same_refusal(bad: object) -> None:
    with pytest.raises(DataError):
        HiredisRespSerializer().pack("SET", "k", bad)  # type: ignore[arg-type]
    with pytest.raises(DataError):
        LeanPacker().pack("SET", "k", bad)


def test_the_webs_own_client_packs_lean() -> None:
    rt = Runtime.build(Config.from_env({"REDIS_URL": "redis://127.0.0.1:1/0"}))
    assert isinstance(rt.redis.connection_pool.connection_kwargs["command_packer"], LeanPacker)
    assert isinstance(rt.redis.connection_pool.make_connection()._command_packer, LeanPacker)  # type: ignore[attr-defined]


@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_a_workers_clients_pack_lean(conn, config, monkeypatch, worker_class: str) -> None:
    from workers.runner import Runner
    from workers.worker import build_worker

    monkeypatch.setattr("workers.worker.connect", lambda config: conn)
    monkeypatch.setattr("workers.worker.wait_for_redis", lambda conn: None)
    build_worker(replace(config, worker_class=worker_class))
    assert isinstance(conn.connection_pool.connection_kwargs["command_packer"], LeanPacker)
    runner = Runner(Config.from_env({"REDIS_URL": "redis://127.0.0.1:1/0"}))
    assert isinstance(runner.store.redis.connection_pool.connection_kwargs["command_packer"], LeanPacker)


def test_a_spawn_workers_client_keeps_redis_pys_packer(conn, config, monkeypatch) -> None:
    """RQ's SpawnWorker writes its connection's arguments into the horse's source as literals."""
    from workers.worker import build_worker

    monkeypatch.setattr("workers.worker.connect", lambda config: conn)
    monkeypatch.setattr("workers.worker.wait_for_redis", lambda conn: None)
    build_worker(replace(config, worker_class="spawn"))
    assert "command_packer" not in conn.connection_pool.connection_kwargs
