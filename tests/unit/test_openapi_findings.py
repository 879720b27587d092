"""What the fuzzer (make test-fuzz) found the OpenAPI document saying untruly, kept true without a live stack.

Each test failed on the document before its fix: a callback was "any object" (``{}`` is a 422), a batch's tasks
anything, a schema-valid body over TASKPORT_MAX_BODY had no 413 to be (a run again), a cap's 429 carried members
the problem schema forbids, a batch's events were named ``status``, and the only way to /result/file was a guess.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import orjson
import pytest

from app.core import processors
from app.core.urls import file_url
from app.web.api import docs
from app.web.errors import render
from app.web.service import over_active_cap

JSON = "application/json"


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    processors.load()  # the built-in types, as the app loads them
    return docs.build_spec(True).to_dict()  # type: ignore[no-any-return]


def _resolve(spec: dict[str, Any], node: Any) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        target: Any = spec
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, item in spec["paths"].items() for method, op in item.items()
            if method != "parameters"]


def test_an_input_callback_is_the_callback_object_or_null(spec) -> None:
    schemas = spec["components"]["schemas"]
    for name, component in (("SubmitRequest", "Callback"), ("ScheduleTask", "Callback"),
                            ("BatchRequest", "BatchCallback")):
        callback = schemas[name]["properties"]["callback"]
        assert callback["nullable"] and callback["allOf"] == [{"$ref": f"#/components/schemas/{component}"}], name
        assert schemas[component]["required"] == ["url"] and schemas[component]["additionalProperties"] is False
    assert set(schemas["Callback"]["properties"]) == {"url", "events"}
    assert set(schemas["BatchCallback"]["properties"]) == {"url"}  # a batch's fires once, when it is DONE
    assert re.search(schemas["Callback"]["properties"]["url"]["pattern"], "https://example.com/hooks")
    assert not re.search(schemas["Callback"]["properties"]["url"]["pattern"], "ftp://example.com/hooks")


def test_a_batch_holds_submit_bodies_and_a_then_task_without_a_time(spec) -> None:
    schemas = spec["components"]["schemas"]
    batch = schemas["BatchRequest"]["properties"]
    assert batch["tasks"]["items"] == {"$ref": "#/components/schemas/BatchTask"}
    submit = spec["paths"]["/api/v1/tasks"]["post"]["requestBody"]["content"][JSON]["schema"]
    # a submit body, but for POST /tasks' own read_token (a batch asks for one token, on the batch)
    # each variant a component of its own (one class each in a generated client)
    types = processors.known_types()
    assert submit == {"oneOf": [{"$ref": f"#/components/schemas/TaskSubmitRequest.{t}"} for t in types]}
    assert schemas["BatchTask"] == {"oneOf": [{"$ref": f"#/components/schemas/BatchTask.{t}"} for t in types]}
    for t in types:
        assert schemas[f"BatchTask.{t}"] == orjson.loads(orjson.dumps(schemas[f"TaskSubmitRequest.{t}"]).replace(
            b"TaskSubmitRequest", b"SubmitRequest"))
        assert schemas[f"ThenTask.{t}"]["allOf"][0] == {"$ref": "#/components/schemas/ThenRequest"}
    assert len(types) >= 3
    assert set(schemas["TaskSubmitRequest"]["properties"]) == {*schemas["SubmitRequest"]["properties"], "read_token"}
    then = schemas["ThenRequest"]["properties"]
    assert set(then) == set(schemas["SubmitRequest"]["properties"])
    untimed = {name: rule for name, rule in then.items() if rule != schemas["SubmitRequest"]["properties"][name]}
    assert {name: rule["enum"] for name, rule in untimed.items()} == {"after": [None], "run_at": [None],
                                                                      "delay": [None]}
    events = spec["paths"]["/api/v1/batches/{batch_id}/events"]["get"]["responses"]["200"]
    assert events["content"]["text/event-stream"]["itemSchema"]["properties"]["event"]["enum"] == ["batch"]


def test_every_operation_that_takes_a_body_declares_the_413_of_the_body_limit(spec) -> None:
    taking = [(path, method, op) for path, method, op in _operations(spec) if "requestBody" in op]
    assert len(taking) >= 5
    for path, method, op in taking:
        assert "413" in op["responses"], (path, method)
    assert "TASKPORT_MAX_BODY" in spec["components"]["responses"]["PayloadTooLarge"]["description"]


def test_a_cap_429_is_a_problem_the_document_admits(spec) -> None:
    class Reached:
        cap, active = 100, 100

    body = render(over_active_cap(Reached())).get_json()  # type: ignore[arg-type]
    response = _resolve(spec, spec["paths"]["/api/v1/tasks"]["post"]["responses"]["429"])
    schema = _resolve(spec, response["content"]["application/problem+json"]["schema"])
    jsonschema.validate(body, schema)  # "limit", "cap" and "active" were not allowed


def test_only_a_file_result_links_to_its_file(spec) -> None:
    links = [(path, method, name, link) for path, method, op in _operations(spec)
             for response in op["responses"].values() if isinstance(response, dict)
             for name, link in response.get("links", {}).items()]
    assert {op for *_, link in links for op in [link["operationId"]]} >= {"getTask", "cancelTask", "retryTask",
                                                                         "getBatch", "getSchedule", "deleteSchedule"}
    to_file = [(path, method, link) for path, method, _, link in links if link["operationId"] == "getResultFile"]
    assert [(path, method) for path, method, _ in to_file] == [("/api/v1/tasks/{task_id}/result", "get")]
    expression = to_file[0][2]["parameters"]["task_id"]
    pointer, _, pattern = expression.partition("#regex:")
    assert pointer == "$response.body#/result/file/url"
    assert re.search(pattern, file_url("3f1c")).group(1) == "3f1c"  # type: ignore[union-attr]
