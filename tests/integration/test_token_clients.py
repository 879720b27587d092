"""The Python client's and the CLI's read tokens and output lines (issue 30) against the real stack: gunicorn, a
real RQ worker, a real redis-server, API keys on."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from taskport import Client, NotFound, ProblemError
from taskport import cli as tcli
from tests.integration.harness import Stack, started_stack
from tests.integration.test_clients import run_cli

KEY = "k-tokens"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("token-clients"), api_keys=f"{KEY}:acme") as s:
        yield s


@pytest.fixture
def backend(stack: Stack) -> Iterator[Client]:
    with Client(stack.base_url, KEY) as c:
        yield c


def with_output(seconds: float = 1, steps: int = 4) -> dict[str, Any]:
    return {"seconds": seconds, "steps": steps, "output": True}


def test_a_token_client_reads_its_task_and_its_output_and_nothing_else(stack: Stack, backend: Client) -> None:
    task = backend.submit("demo.sleep", with_output(), read_token=True, idempotency_key=uuid.uuid4().hex)
    other = backend.submit("demo.sleep", {"seconds": 0}, idempotency_key=uuid.uuid4().hex)
    minted = backend.read_token(task["task_id"], ttl=120)
    assert set(task["read_token"]) == set(minted) == {"token", "expires_at"}
    lines: list[dict[str, Any]] = []
    with Client(stack.base_url, token=task["read_token"]["token"]) as reader:
        docs = list(reader.follow(task["task_id"], timeout=60, on_output=lines.append))
        assert docs[-1]["status"] == "COMPLETED"
        assert reader.result(task["task_id"])["result"] == {"slept": 1, "items": 0}
        page = reader.output(task["task_id"])
        assert page["next"] is None and page["lines"] == lines and len(lines) >= 4  # each once, in order
        with pytest.raises(NotFound):
            reader.status(other["task_id"])
        for refused in (lambda: reader.cancel(task["task_id"]), lambda: next(reader.history()),
                        lambda: reader.submit("demo.sleep", {}), lambda: reader.read_token(task["task_id"])):
            with pytest.raises(ProblemError) as exc:
                refused()
            assert exc.value.status == 403
    with Client(stack.base_url, token=minted["token"]) as second:
        assert second.status(task["task_id"])["status"] == "COMPLETED"


def test_a_batch_token_from_submit_batch_reads_the_batch_and_its_tasks_only(stack: Stack, backend: Client) -> None:
    batch = backend.submit_batch([{"type": "demo.sleep", "payload": {"seconds": 0, "steps": 1, "items": i + 1}}
                                  for i in range(3)], read_token=True)
    other = backend.submit("demo.sleep", {"seconds": 0}, idempotency_key=uuid.uuid4().hex)
    assert set(batch["read_token"]) == {"token", "expires_at"}
    with Client(stack.base_url, token=batch["read_token"]["token"]) as reader:
        assert reader.batch(batch["batch_id"])["size"] == 3
        ids = [doc["task_id"] for doc in reader.batch_tasks(batch["batch_id"])]
        assert ids == [task["task_id"] for task in batch["tasks"]]
        assert all(reader.status(task_id)["task_id"] == task_id for task_id in ids)
        with pytest.raises(NotFound):
            reader.status(other["task_id"])
        with pytest.raises(ProblemError) as exc:
            reader.cancel(ids[0])
        assert exc.value.status == 403


def test_polling_with_a_token_hands_on_the_same_lines(stack: Stack, backend: Client) -> None:
    task = backend.submit("demo.sleep", with_output(1.5, 5), read_token=True, idempotency_key=uuid.uuid4().hex)
    lines: list[str] = []
    with Client(stack.base_url, token=task["read_token"]["token"]) as reader:
        reader.wait(task["task_id"], timeout=60, sse=False, on_output=lambda line: lines.append(line["text"]))
    assert lines == [line["text"] for line in backend.output(task["task_id"])["lines"]] and len(lines) >= 5


def test_the_cli_prints_the_output_lines_under_wait(stack: Stack, backend: Client) -> None:
    done = run_cli(stack.base_url, "submit", "demo.sleep", "--payload", '{"seconds": 1, "steps": 3, "output": true}',
                   "--idempotency-key", uuid.uuid4().hex, "--wait", api_key=KEY)
    assert done.returncode == tcli.OK, done.stderr
    task_id = done.stderr.splitlines()[0].split()[1]  # "submitted <id> (demo.sleep)"
    expected = [line["text"] for line in backend.output(task_id)["lines"]]
    shown = done.stderr.splitlines()[1:]
    assert len(expected) >= 3 and shown[:len(expected)] == expected  # each line as it came, then the bar
    assert shown[-1].startswith("COMPLETED") and "100%" in shown[-1]
    assert '"slept": 1' in done.stdout
