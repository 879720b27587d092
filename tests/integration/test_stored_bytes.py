"""The quota of bytes a member's tasks hold in Redis (TASKPORT_MAX_STORED_BYTES) through a real web and worker:
payloads count until their tasks end, a submit past it is 429 naming it and stores nothing, another member is
not affected, and the bytes come back as tasks complete."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.core import keys
from tests.integration.harness import Api, Stack, started_stack, wait_until


def padded(n: int) -> dict:
    """A demo.sleep payload of ~42 KB (its fail_items, which a task without items never reads): three fit in
    128 KiB, the fourth does not."""
    return {"steps": 1, "fail_items": list(range(100_000 * n, 100_000 * n + 6_000))}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("stored"), worker=False, api_keys="ka:alice,kb:bob",
                       max_stored_bytes="128kb", rate_limit="off") as s:
        yield s


def test_a_submit_past_the_member_s_stored_bytes_is_429_and_completing_tasks_frees_them(stack: Stack) -> None:
    conn = stack.redis()
    with Api(stack.base_url, key="ka") as alice, Api(stack.base_url, key="kb") as bob:
        ids = [alice.create("demo.sleep", padded(i)) for i in range(3)]
        refused = alice.submit("demo.sleep", padded(3))
        assert refused.status_code == 429, refused.text
        problem = refused.json()
        assert problem["limit"] == "max_stored_bytes" and problem["cap"] == 128 * 1024
        assert refused.headers["Retry-After"] == "60" and refused.headers["Content-Type"].startswith(
            "application/problem+json")
        assert int(conn.hget(keys.STORED_BYTES, "alice")) == problem["held"] > 100_000
        assert bob.submit("demo.sleep", padded(9)).status_code == 202  # per member
        stack.start_worker()
        for task_id in ids:
            alice.wait_for(task_id, "COMPLETED", timeout=15)
        wait_until(lambda: int(conn.hget(keys.STORED_BYTES, "alice") or 0) < 1000, timeout=10,
                   message="alice's payloads dropped as her tasks completed")
        assert alice.submit("demo.sleep", padded(4)).status_code == 202
