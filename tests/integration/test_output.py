"""A task's live output against the real web (gunicorn, gevent), real workers and a real Valkey: demo.sleep's lines
in order over GET polling and over SSE (a reconnect with Last-Event-ID misses nothing and repeats nothing), the
caps, the quota, the output going with the task, and a run that was taken over adding nothing."""

from __future__ import annotations

from typing import Any

import orjson
import redis

from app.core import keys
from app.core.clock import now_ms
from app.core.store import TaskStore
from tests.integration.harness import TASKS, Api, Stack, wait_until
from tests.integration.test_streams import SseClient

STEPS, ITEMS = 30, 20
EXPECTED = [f"step {n} of {STEPS}" for n in range(1, STEPS + 1)] + [f"item {n}" for n in range(ITEMS)]


def events(client: SseClient, until: Any) -> list[dict[str, Any]]:
    """Events (comments skipped) as {"event", "id", "data"} until ``until(event)`` or the stream's end."""
    got: list[dict[str, Any]] = []
    while chunk := client.next():
        if chunk.startswith(b":"):
            continue
        fields = dict(line.split(": ", 1) for line in chunk.decode().strip().split("\n"))
        got.append({"event": fields["event"], "id": fields["id"], "data": orjson.loads(fields["data"])})
        if until(got[-1]):
            break
    return got


def poll_all(api: Api, task_id: str) -> list[dict[str, Any]]:
    """Every line over GET polling, following ``next`` until null."""
    lines: list[dict[str, Any]] = []
    after: str | None = "0"

    def step() -> bool:
        nonlocal after
        answer = api.get(f"{TASKS}/{task_id}/output", params={"after": after, "limit": 7})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        lines.extend(body["lines"])
        after = body["next"]
        return after is None

    wait_until(step, timeout=30, interval=0.05, message="the output's next to be null")
    return lines


def test_demo_sleep_lines_arrive_in_order_over_polling_and_over_sse_across_a_reconnect(
        stack: Stack, api: Api) -> None:
    stack.start_worker()
    task_id = api.create("demo.sleep", {"seconds": 2, "steps": STEPS, "items": ITEMS, "item_seconds": 0.03,
                                        "output": True})
    first = SseClient(stack.config.port, task_id)
    try:
        seen = events(first, lambda e: e["event"] == "output" and e["data"]["text"] == "step 10 of 30")
    finally:
        first.close()
    resumed = SseClient(stack.config.port, task_id, headers={"Last-Event-ID": seen[-1]["id"]})
    try:
        rest = events(resumed, lambda e: e["event"] == "status" and e["data"]["status"] == "COMPLETED")
        assert resumed.next() == b""  # the stream ended after the final status
    finally:
        resumed.close()
    streamed = [e["data"] for e in seen + rest if e["event"] == "output"]
    assert [line["text"] for line in streamed] == EXPECTED  # nothing missed, nothing repeated
    assert [int(line["id"]) for line in streamed] == list(range(1, len(EXPECTED) + 1))
    assert rest[-1]["event"] == "status"  # the final status after every line
    assert seen[0]["event"] == "status" and seen[0]["id"].isdigit()  # before any output line: today's plain ids
    assert all("-" in e["id"] for e in rest)  # once there is output: <seq>-<line id>
    polled = poll_all(api, task_id)
    assert polled == streamed


def test_a_plain_integer_last_event_id_resumes_the_status_and_sends_every_line(stack: Stack, api: Api) -> None:
    stack.start_worker()
    task_id = api.create("demo.sleep", {"seconds": 0, "steps": 3, "output": True})
    done = api.wait_for(task_id, "COMPLETED")
    client = SseClient(stack.config.port, task_id, headers={"Last-Event-ID": "1"})
    try:
        got = events(client, lambda e: e["event"] == "status")
    finally:
        client.close()
    assert [e["data"]["text"] for e in got if e["event"] == "output"] == ["step 1 of 3", "step 2 of 3", "step 3 of 3"]
    assert got[-1]["data"]["status"] == "COMPLETED" and got[-1]["data"]["updated_at"] == done["updated_at"]


def test_caps_quota_and_the_output_goes_with_the_task(stack: Stack, redis_conn: redis.Redis) -> None:
    stack.configure(output_max_lines=5, output_max_line_bytes=8)
    stack.start_web()
    stack.start_worker()
    with Api(stack.base_url) as api:
        task_id = api.create("demo.sleep", {"seconds": 0, "steps": 12, "output": True})
        api.wait_for(task_id, "COMPLETED")
        lines = poll_all(api, task_id)
    assert [line["id"] for line in lines] == ["8", "9", "10", "11", "12"]  # the oldest trimmed
    assert [line["text"] for line in lines] == ["step …"] * 5  # cut to 8 bytes, the marker included
    kept = redis_conn.lrange(keys.output(task_id), 0, -1)
    held = sum(len(line) for line in kept)
    task = redis_conn.hgetall(keys.task(task_id))
    assert int(task[b"output_bytes"]) == held
    assert int(task[b"stored"]) == held + redis_conn.hstrlen(keys.task(task_id), "result")  # payload gone
    assert int(redis_conn.hget(keys.STORED_BYTES, "public") or 0) == int(task[b"stored"])
    assert abs(redis_conn.ttl(keys.output(task_id)) - redis_conn.ttl(keys.task(task_id))) <= 1
    store = TaskStore(redis_conn, stack.config)
    assert store.expire_batch([task_id], now_ms() + stack.config.result_ttl * 1000 + 1)
    assert redis_conn.exists(keys.output(task_id)) == 0
    assert int(redis_conn.hget(keys.STORED_BYTES, "public") or 0) == 0


def test_a_run_that_was_taken_over_emits_nothing_more(stack: Stack, api: Api, redis_conn: redis.Redis) -> None:
    stack.start_worker()
    task_id = api.create("demo.sleep", {"seconds": 60, "steps": 1200, "output": True})
    wait_until(lambda: int(redis_conn.hget(keys.task(task_id), "output_last") or 0) >= 3, timeout=20,
               message="the run to emit")
    redis_conn.hset(keys.task(task_id), "run_id", "another-run")  # what a take-over leaves: the task is another run's
    taken_at = int(redis_conn.hget(keys.task(task_id), "output_last") or 0)
    wait_until(lambda: "taken over" in "".join(p.log() for p in stack.procs if p.name.startswith("worker")),
               timeout=20, message="the worker's run to notice it lost the task")
    assert int(redis_conn.hget(keys.task(task_id), "output_last") or 0) == taken_at
    assert redis_conn.llen(keys.output(task_id)) == taken_at
