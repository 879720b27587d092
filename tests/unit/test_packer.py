"""app.web.packer: the same bytes as redis-py's hiredis packer for every argument type, the same refusals."""

from __future__ import annotations

import pytest
from redis.connection import HiredisRespSerializer
from redis.exceptions import DataError
from rq.job import JobStatus

from app.core.config import Config
from app.core.keys import TaskField
from app.web.packer import LeanPacker
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
