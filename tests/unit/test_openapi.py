"""GET /api/v1/openapi.json: a well-formed OpenAPI 3 document covering every route and contract status code."""

from __future__ import annotations

import base64
import dataclasses
import re
from typing import Any

import pytest

from app.core import processors
from app.core.history import encode_cursor
from app.web import create_app
from app.web.api import docs, docs_components

PROBLEM = "application/problem+json"
JSON = "application/json"

# (path, method) -> status codes the contract (docs/api) names for it.
CONTRACT: dict[tuple[str, str], set[str]] = {
    ("/api/v1/tasks", "post"): {"202", "400", "401", "403", "409", "413", "415", "422", "429", "503"},
    ("/api/v1/tasks", "get"): {"200", "401", "422"},
    ("/api/v1/tasks/{task_id}", "get"): {"200", "404", "410"},
    ("/api/v1/tasks/{task_id}", "delete"): {"204", "404", "409"},
    ("/api/v1/tasks/{task_id}/result", "get"): {"200", "202", "404", "409", "410"},
    ("/api/v1/tasks/{task_id}/result/file", "get"): {"200", "202", "404", "409", "410"},
    ("/api/v1/tasks/{task_id}/events", "get"): {"200", "404", "410"},
    ("/healthz", "get"): {"200"},
    ("/readyz", "get"): {"200", "503"},
    ("/api/v1/openapi.json", "get"): {"200"},
    ("/metrics", "get"): {"200", "401", "404"},
    ("/rq/", "get"): {"200", "401", "404"},
    ("/", "get"): {"200"},
}


@pytest.fixture
def app(config, conn):
    return create_app(dataclasses.replace(config, dashboard_password="operator"), conn=conn)


@pytest.fixture
def spec(app) -> dict[str, Any]:
    r = app.test_client().get("/api/v1/openapi.json")
    assert r.status_code == 200 and r.headers["Content-Type"] == "application/json; charset=utf-8"
    return r.get_json()


def resolve(spec: dict[str, Any], node: Any) -> Any:
    """Follow a local ``$ref`` (repeatedly) to the object it names."""
    while isinstance(node, dict) and "$ref" in node:
        target: Any = spec
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def all_refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [ref for value in node.values() for ref in all_refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in all_refs(value)]
    return []


def test_the_document_is_openapi_3_with_info_paths_and_components(spec):
    assert spec["openapi"].startswith("3.")
    assert spec["info"]["title"] == "taskport" and spec["info"]["version"]
    assert spec["paths"] and spec["components"]["schemas"]


def test_every_reference_resolves(spec):
    refs = all_refs(spec)
    assert refs
    for ref in refs:
        assert ref.startswith("#/components/"), ref
        assert resolve(spec, {"$ref": ref}) is not None


@pytest.mark.parametrize(("path", "method"), sorted(CONTRACT))
def test_every_contract_endpoint_has_its_status_codes(spec, path, method):
    operation = spec["paths"][path][method]
    assert operation["summary"]
    assert CONTRACT[(path, method)] <= set(operation["responses"])


def test_errors_are_problem_json_and_api_successes_are_json(spec):
    for path, item in spec["paths"].items():
        if not path.startswith("/api/v1/tasks"):
            continue
        for method, operation in item.items():
            if method == "parameters":
                continue
            for code, response in operation["responses"].items():
                content = resolve(spec, response).get("content", {})
                if code in ("400", "401", "404", "409", "413", "415", "422", "500", "503"):
                    assert list(content) == [PROBLEM], (path, method, code)
                elif code in ("200", "202", "410") and not path.endswith(("/events", "/file")):
                    assert list(content) == [JSON], (path, method, code)


def test_sse_and_file_responses_name_their_media_types(spec):
    events = spec["paths"]["/api/v1/tasks/{task_id}/events"]["get"]
    assert list(events["responses"]["200"]["content"]) == ["text/event-stream"]
    assert "Last-Event-ID" in [p["name"] for p in events["parameters"]]
    file = spec["paths"]["/api/v1/tasks/{task_id}/result/file"]["get"]
    assert file["responses"]["200"]["content"]["*/*"]["schema"]["format"] == "binary"


def test_bodies_come_from_the_schemas(spec):
    schemas = spec["components"]["schemas"]
    submit = spec["paths"]["/api/v1/tasks"]["post"]
    assert resolve(spec, submit["responses"]["202"])["content"][JSON]["schema"]["$ref"].endswith("/TaskAccepted")
    assert set(schemas["TaskAccepted"]["properties"]) == {*schemas["StatusDocument"]["properties"], "read_token"}
    assert set(schemas["StatusDocument"]["properties"]) >= {"task_id", "status", "progress", "items", "error", "links"}
    assert set(schemas["Duplicate"]["properties"]) >= {"task_id", "status", "duplicate", "existing"}
    assert set(schemas["Result"]["properties"]) >= {"result", "failures", "error_code", "completed_at"}
    assert set(schemas["HistoryPage"]["properties"]) == {"tasks", "next_cursor"}
    assert set(schemas["Problem"]["properties"]) >= {"type", "title", "status", "detail", "errors"}
    history = spec["paths"]["/api/v1/tasks"]["get"]
    assert {p["name"] for p in history["parameters"]} == {"status", "type", "limit", "cursor"}


def test_every_task_type_has_its_payload_schema_and_a_valid_example(spec):
    body = spec["paths"]["/api/v1/tasks"]["post"]["requestBody"]["content"][JSON]
    assert len(body["schema"]["oneOf"]) == len(processors.known_types())
    assert set(body["examples"]) == set(processors.known_types()) >= {"demo.sleep", "orders.split", "orders.export"}
    for task_type, example in body["examples"].items():
        assert f"Payload.{task_type}" in spec["components"]["schemas"]
        assert example["value"]["type"] == task_type
        processors.validate(task_type, example["value"]["payload"])  # raises if the example is invalid
    split = spec["components"]["schemas"]["Payload.orders.split"]
    assert set(split["required"]) == {"order_code", "items"}


def test_every_route_of_the_app_is_documented(app, spec):
    for rule in app.url_map.iter_rules():
        if rule.endpoint in ("static", "favicon") or rule.endpoint.startswith("rq_dashboard.") or "<path:" in rule.rule:
            continue  # static files (the page's, Swagger UI's under /docs/, the icon) and the operators' dashboard
        path = re.sub(r"<(?:[^:>]+:)?([^>]+)>", r"{\1}", rule.rule)
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            assert method.lower() in spec["paths"].get(path, {}), f"{method} {path} is not documented"


def test_security_follows_the_configured_keys(config, conn, spec):
    assert spec["paths"]["/api/v1/tasks"]["post"]["security"] == [{}]
    keyed = create_app(config.__class__.from_env({}, redis_url="redis://fake", data_dir=config.data_dir,
                                                 api_keys="k:alice"), conn=conn)
    doc = keyed.test_client().get("/api/v1/openapi.json").get_json()
    assert doc["paths"]["/api/v1/tasks"]["post"]["security"] == [{"bearerAuth": []}]
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {"type": "http", "scheme": "bearer"}


def test_the_document_is_built_once_per_app(app, monkeypatch):
    client = app.test_client()
    first = client.get("/api/v1/openapi.json").data
    monkeypatch.setattr(docs, "build_spec", lambda *a: pytest.fail("rebuilt"))
    assert client.get("/api/v1/openapi.json").data == first


def test_example_payload_falls_back_to_the_schema_defaults():
    from marshmallow import Schema, fields

    class Custom(Schema):
        name = fields.String(required=True)
        count = fields.Integer(load_default=3)
        tags = fields.List(fields.String(), load_default=list)

    assert docs_components.example_payload("custom.type", Custom()) == {"count": 3, "tags": []}


def test_user_schemas_whose_names_clash_get_their_own_components(monkeypatch):
    from marshmallow import Schema, fields

    class ErrorSchema(Schema):  # same name as the status document's error
        reason = fields.String()

    class OrderItemSchema(Schema):  # same name as orders.split's item
        sku = fields.String()

    class ClashSchema(Schema):
        error = fields.Nested(ErrorSchema)
        items = fields.List(fields.Nested(OrderItemSchema))

    proc = processors.Processor("user.clash", lambda payload, ctx: {}, ClashSchema(), 60, 0, "default")
    monkeypatch.setitem(processors._REGISTRY, "user.clash", proc)
    names = docs.build_spec(False).to_dict()["components"]["schemas"]  # a clash would warn, and warnings fail
    assert names["Error"]["properties"].keys() == {"code", "message"}
    assert names[f"{__name__}.Error"]["properties"].keys() == {"reason"}
    assert names[f"{__name__}.OrderItem"]["properties"].keys() == {"sku"}
    assert "item_code" in names["OrderItem"]["properties"]


def test_operator_routes_are_documented_only_when_served(config, conn) -> None:
    spec = create_app(config, conn=conn).test_client().get("/api/v1/openapi.json").get_json()
    assert "/rq/" not in spec["paths"] and "/api/v1/audit" not in spec["paths"]


def test_the_document_states_what_the_server_enforces(spec) -> None:
    submit = spec["paths"]["/api/v1/tasks"]["post"]
    (key,) = [p for p in submit["parameters"] if p["name"] == "Idempotency-Key"]
    assert (key["schema"]["minLength"], key["schema"]["maxLength"]) == (1, 128)
    assert set(submit["responses"]["202"]["links"]) == {"status", "result", "events", "cancel", "output"}
    cursor = [p for p in spec["paths"]["/api/v1/tasks"]["get"]["parameters"] if p["name"] == "cursor"][0]
    assert re.search(cursor["schema"]["pattern"], encode_cursor((1764558000000.0, 3)))
    export = spec["components"]["schemas"]["Payload.orders.export"]["properties"]
    assert export["start_date"]["format"] == export["end_date"]["format"] == "date"
    variants = [resolve(spec, v) for v in submit["requestBody"]["content"]["application/json"]["schema"]["oneOf"]]
    required = {v["allOf"][1]["properties"]["type"]["enum"][0]: v["allOf"][1].get("required", []) for v in variants}
    assert "payload" in required["orders.split"] and "payload" not in required["demo.sleep"]
    events = spec["paths"]["/api/v1/tasks/{task_id}/events"]["get"]["responses"]["200"]
    kinds = events["content"]["text/event-stream"]["itemSchema"]["oneOf"]
    assert [kind["properties"]["event"]["enum"] for kind in kinds] == [["status"], ["output"]]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            if method != "parameters":
                assert {"414", "431"} <= set(operation["responses"]), (path, method)


def test_the_status_document_lists_exactly_the_fields_the_server_sends(app, spec) -> None:
    schema = spec["components"]["schemas"]["StatusDocument"]
    resumed = schema["properties"]["resumed"]
    assert "resumed" in schema["required"] and resumed["type"] == "integer" and resumed["minimum"] == 0
    assert "checkpoint" in resumed["description"]
    client = app.test_client()
    sent = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {"seconds": 0}}).get_json()
    assert set(sent) | {"queue"} == set(schema["properties"]) and sent["resumed"] == 0  # queue: the status read's
    read = client.get(f"/api/v1/tasks/{sent['task_id']}").get_json()
    assert set(read) == set(schema["properties"]) and read["resumed"] == 0


CALLBACK_SECRET = "public:whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
CALLBACK_BODIES = (("/api/v1/tasks", "post"), ("/api/v1/batches", "post"), ("/api/v1/schedules", "post"),
                   ("/api/v1/schedules/{schedule_id}", "patch"))


def properties_reached(spec: dict[str, Any], node: Any, seen: set[int] | None = None) -> set[str]:
    """Every property name of every object schema ``node`` reaches, references followed."""
    seen = set() if seen is None else seen
    node = resolve(spec, node)
    if id(node) in seen:
        return set()
    seen.add(id(node))
    names: set[str] = set()
    if isinstance(node, dict):
        names |= set(node.get("properties", {}))
        for value in node.values():
            names |= properties_reached(spec, value, seen)
    elif isinstance(node, list):
        for value in node:
            names |= properties_reached(spec, value, seen)
    return names


@pytest.mark.parametrize("secrets", ["", CALLBACK_SECRET], ids=["no-secrets", "secrets"])
def test_callback_is_offered_only_where_a_member_may_use_it(config, conn, secrets: str) -> None:
    """Without TASKPORT_CALLBACK_SECRETS every callback is refused (422), so no request body offers one (fuzz ST202:
    a schema-valid submit with a callback was refused); the answers still carry theirs (null): the status, batch
    and schedule documents (fuzz ST108, had the schedule's task lost it)."""
    app = create_app(dataclasses.replace(config, callback_secrets=secrets), conn=conn)
    spec = app.test_client().get("/api/v1/openapi.json").get_json()
    for path, method in CALLBACK_BODIES:
        body = spec["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
        assert ("callback" in properties_reached(spec, body)) == bool(secrets), (path, method)
        answer = spec["paths"][path][method]["responses"]
        assert "callback" in properties_reached(spec, answer), (path, method)
    schemas = spec["components"]["schemas"]
    assert ("BatchCallback" in schemas) == bool(secrets)
    assert all(resolve(spec, {"$ref": ref}) for ref in all_refs(spec) if ref.startswith("#/components/"))
    if not secrets:  # the body the server refuses is invalid by the document, and its 422 documented
        answer = app.test_client().post("/api/v1/tasks", json={"type": "demo.sleep", "callback": {
            "url": "https://example.com/hook"}})
        assert answer.status_code == 422 and list(answer.get_json()["errors"]) == ["callback.url"]
        assert schemas["SubmitRequest"]["additionalProperties"] is False
        assert "422" in spec["paths"]["/api/v1/tasks"]["post"]["responses"]


def test_an_id_a_client_sends_back_has_the_digits_the_server_takes(spec) -> None:
    """18 digits: a 19-digit id may be past 2^63 - 1, which the server refuses (fuzz ST202 on Last-Event-ID)."""
    events = spec["paths"]["/api/v1/tasks/{task_id}/events"]["get"]["parameters"]
    (last_id,) = [p["schema"]["pattern"] for p in events if p["name"] == "Last-Event-ID"]
    output = spec["paths"]["/api/v1/tasks/{task_id}/output"]["get"]["parameters"]
    (after,) = [p["schema"]["pattern"] for p in output if p["name"] == "after"]
    for good in ("9" * 18, "1-" + "9" * 18):
        assert re.fullmatch(last_id, good)
    for bad in ("9" * 19, "1-" + "9" * 19):
        assert not re.fullmatch(last_id, bad)
    assert re.fullmatch(after, "9" * 18) and not re.fullmatch(after, "1" + "0" * 18)
