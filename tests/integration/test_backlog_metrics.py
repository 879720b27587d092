"""/metrics' backlog with real processes (issue 33, point 3): a real Redis, gunicorn, two RQ workers and a scheduler,
with TASKPORT_CONCURRENCY and callback secrets; each waiting gauge is filled by what fills it in production, and the
oldest age of a queue whose task waits (its queue paused) grows from scrape to scrape."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from app.core import keys
from tests.integration.harness import Api, Stack, started_stack, wait_until
from tests.unit.test_callbacks import SECRET


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("backlog"), worker=False, concurrency="demo.sleep=1/member",
                       callback_secrets=f"public:{SECRET}", callback_allow_hosts="127.0.0.1") as s:
        s.start_worker(2)
        s.start_scheduler()
        yield s


def scrape(stack: Stack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = requests.get(stack.url("/metrics"), timeout=5)
    assert answer.status_code == 200, answer.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(answer.text) for s in family.samples}


def gauge(stack: Stack, name: str, **labels: str) -> float:
    return scrape(stack)[(name, tuple(sorted(labels.items())))]


def test_every_waiting_gauge_is_filled_and_a_waiting_queue_s_age_grows(stack: Stack) -> None:
    conn = stack.redis()
    conn.sadd(keys.PAUSED_QUEUES, "low")  # no worker takes its jobs: its task waits, queued
    try:
        with Api(stack.base_url) as api:
            def sleep(seconds: float, **fields: object) -> str:
                return api.create("demo.sleep", {"seconds": seconds, "steps": 1}, dedup_key=uuid.uuid4().hex,
                                  **fields)

            running = sleep(30)
            api.wait_for(running, "PROCESSING", timeout=15)
            parked = sleep(1)  # the limit's one slot is held: the second worker parks it
            wait_until(lambda: api.status(parked)["waiting_for"], timeout=15, message="the task to be parked")
            sleep(1, delay=600)
            sleep(1, after=[running])
            cancelled = sleep(1, delay=600, callback={"url": "http://127.0.0.1:9/hook", "events": ["CANCELLED"]})
            assert api.delete(f"/api/v1/tasks/{cancelled}").status_code == 204  # its delivery is due (no deliverer)
            sleep(1, priority="low")

        first = wait_until(lambda: gauge(stack, "taskport_queue_oldest_age_seconds", queue="low") or None,
                           timeout=10, message="the low queue's oldest age to count")
        samples = scrape(stack)
        assert samples[("taskport_tasks_waiting", (("reason", "run_at"),))] == 1
        assert samples[("taskport_tasks_waiting", (("reason", "after"),))] == 1
        assert samples[("taskport_concurrency_parked", (("limit", "demo.sleep member"),))] == 1
        assert samples[("taskport_callbacks_due", (("when", "now"),))] + \
            samples[("taskport_callbacks_due", (("when", "later"),))] == 1
        assert samples[("taskport_queue_oldest_age_seconds", (("queue", "high"),))] == 0
        assert samples[("taskport_queue_length", (("queue", "low"),))] == 1
        wait_until(lambda: gauge(stack, "taskport_queue_oldest_age_seconds", queue="low") >= first + 1, timeout=10,
                   message="the low queue's oldest age to grow")
    finally:
        conn.srem(keys.PAUSED_QUEUES, "low")
        conn.close()
