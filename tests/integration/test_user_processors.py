"""A processor from the user's own module (``TASKPORT_PROCESSORS=tests.userprocs.tasks``, imported by the
web and the worker processes from the working directory), used over HTTP like a built-in one."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.harness import TASKS, Api, Stack


@pytest.fixture
def stack_settings() -> dict[str, Any]:
    return {"processors": "tests.userprocs.tasks"}


@pytest.fixture
def api(api: Api, stack: Stack) -> Api:
    """The conftest's ``api``, with a worker started."""
    stack.start_worker()
    return api


def test_a_user_processor_runs_over_http(api: Api) -> None:
    task_id = api.create("user.echo", {"text": "hello from my module"})
    done = api.wait_for(task_id, "COMPLETED")
    assert done["type"] == "user.echo" and done["progress"] == 100 and done["items"] is None
    result = api.get(f"{TASKS}/{task_id}/result")
    assert result.status_code == 200
    assert result.json()["result"] == {"echo": "hello from my module"}
    assert result.json()["failures"] == [] and result.json()["error_code"] is None


INVALID: list[tuple[dict[str, Any], str]] = [
    ({}, "payload.text"),
    ({"text": 5}, "payload.text"),
    ({"text": "x" * 1001}, "payload.text"),
    ({"text": "hi", "shout": True}, "payload.shout"),
]


def test_its_payload_schema_errors_are_422_with_payload_paths(api: Api) -> None:
    for payload, field in INVALID:
        response = api.submit("user.echo", payload)
        assert response.status_code == 422, (payload, response.text)
        assert response.headers["Content-Type"].startswith("application/problem+json")
        assert field in response.json()["errors"], (payload, response.json())
    assert api.get(TASKS).json()["tasks"] == []  # nothing stored
    unknown = api.submit("user.missing", {"text": "hi"})
    assert unknown.status_code == 422 and "user.echo" in unknown.json()["known_types"]
    assert "user.echo" in api.get("/api/v1/openapi.json").text


def test_without_the_module_configured_its_type_is_unknown(stack: Stack) -> None:
    stack.start_web()
    with Api(stack.base_url) as api:
        response = api.submit("user.echo", {"text": "hi"})
        assert response.status_code == 422 and "user.echo" not in response.json()["known_types"]
