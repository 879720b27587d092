"""Rate limits (issue 31): ctx.limit's token bucket (RATE_TAKE, workers.ratelimit), the declarations and their
order, and the put-back of a run whose wait would be too long (no attempt used, its run_at set). fakeredis."""

from __future__ import annotations

import uuid

import pytest
from marshmallow import Schema

from app.core import keys, limits, processors
from app.core.answers import NewTask
from app.core.clock import now_ms
from app.core.config import Config
from app.core.jobs import JobQueue
from app.core.states import TaskStatus
from app.core.store import TaskStore
from tests.unit.test_api import run_queued
from workers.exceptions import RateDeferred
from workers.ratelimit import RateLimiter


def limiter(store: TaskStore, config: Config) -> RateLimiter:
    return RateLimiter(store, config, "t1")


def test_a_full_bucket_gives_its_tokens_at_once_then_one_per_interval(store, config) -> None:
    take = limiter(store, config)
    assert [take.take("unit.a", 20, 1) for _ in range(20)] == [0.0] * 20
    due = []  # when the bucket is full again: each token taken moves it one interval (50 ms) on
    for _ in range(5):
        wait = take.take("unit.a", 20, 1)
        assert 0 < wait <= 0.25  # taken for a later time, in turn
        due.append(float(store.redis.get(keys.rate_bucket("unit.a"))))
    assert [round(b - a, 3) for a, b in zip(due, due[1:], strict=False)] == [50.0] * 4
    stats = store.redis.hgetall(keys.RATE_STATS)
    assert stats[b"unit.a:taken"] == b"25" and stats[b"unit.a:waited"] == b"5"


def test_a_wait_longer_than_the_longest_takes_no_token(store) -> None:
    config = Config.from_env({}, redis_url="redis://fake", rate_wait_max=0.1)
    take = limiter(store, config)
    for _ in range(10):
        take.take("unit.b", 10, 1)  # the bucket: 10 tokens at once
    assert 0 < take.take("unit.b", 10, 1) <= 0.1  # the 11th: within 100 ms
    with pytest.raises(RateDeferred) as deferred:
        take.take("unit.b", 10, 1)  # the 12th would wait 200 ms
    assert deferred.value.name == "unit.b" and 0.1 < deferred.value.wait <= 0.2
    assert store.redis.hget(keys.RATE_STATS, "unit.b:refused") == b"1"
    assert store.redis.hget(keys.RATE_STATS, "unit.b:taken") == b"11"  # nothing taken by the refusal


def test_the_operators_figures_win_then_the_codes_then_the_calls(config) -> None:
    limits.rate_limit("unit.erp", 20, per=1)
    try:
        with pytest.raises(ValueError, match="already declared as 20/1s"):
            limits.rate_limit("unit.erp", 30, per=1)
        assert limits.rate_of(config, "unit.erp", 5, 1) == (20.0, 1.0)
        operator = Config.from_env({"TASKPORT_RATE_LIMITS": "unit.erp=50/2s"})
        assert limits.rate_of(operator, "unit.erp") == (50.0, 2.0)
        assert limits.declared_rates(operator)["unit.erp"] == (50.0, 2.0)
    finally:
        limits._RATES.pop("unit.erp")
    assert limits.rate_of(config, "unit.inline", 5, 2) == (5.0, 2.0)
    with pytest.raises(LookupError, match="declared nowhere"):
        limits.rate_of(config, "unit.nowhere")


@pytest.fixture
def slow_api():
    """A processor that takes a token of a limit of 1 a minute per item: its second item must wait a minute."""

    @processors.processor("unit.slowapi", schema=Schema(), timeout=30)
    def slowapi(payload: dict, ctx) -> dict:
        return {"n": len(ctx.each(["a", "b"], lambda item: ctx.limit("unit.minute", 1, per=60)))}

    yield
    processors._REGISTRY.pop("unit.slowapi")


def test_a_long_wait_puts_the_task_back_with_a_run_at_and_uses_no_attempt(slow_api, conn, config) -> None:
    store = TaskStore(conn, config)
    task_id = uuid.uuid4().hex
    jobs = JobQueue(conn, config)
    store.create(NewTask(task_id, "acme", "unit.slowapi", {}, uuid.uuid4().hex, "default", 1),
                 jobs.job_commands(task_id, "default", 30))
    before = now_ms()
    run_queued(conn, config)
    task = store.get(task_id)
    assert task is not None and task.status == TaskStatus.PENDING
    assert task.attempts == 0 and task.error_code is None
    assert task.run_at is not None and before + 55_000 <= task.run_at <= now_ms() + 60_000
    assert conn.zscore(keys.DELAYED, task_id) == task.run_at
    assert task.items == {"total": 2, "succeeded": 1, "failed": 0}  # its checkpoint kept: item a is done
    assert "rate limit unit.minute" in (task.message or "")
    assert conn.hget(keys.STATS, keys.STAT_RATE_DEFERRED) == b"1"
