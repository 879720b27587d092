"""A processor's payload through the web's fast path (app.web.intake.validated_payload, a FastLoad of the
processor's schema where one can be built) is loaded exactly as the schema loads it, down to the JSON it
becomes (0 and 0.0 differ there), and every payload the fast path cannot vouch for gets the schema's own
answer. A schema it cannot mirror (hooks, Nested fields) is loaded by marshmallow alone."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from marshmallow import ValidationError

import workers.processors.demo  # noqa: F401  (registers demo.sleep)
import workers.processors.orders_export  # noqa: F401
import workers.processors.orders_split  # noqa: F401
from app.core import processors
from app.web.errors import ValidationFailed
from app.web.intake import _fast_payload, validated_payload

SLEEP = "demo.sleep"
# payloads the fast path answers itself ...
CARRIED: list[dict[str, Any]] = [
    {},
    {"seconds": 0, "steps": 1, "fail_items": [7]},
    {"seconds": 1.5, "steps": 10000, "items": 3, "item_seconds": 0, "fail_items": [], "fail_code": None},
    {"seconds": 2, "fail_code": 10002, "fail_items": [0, 1, 2]},
]
# ... and those it leaves to the schema: invalid ones, and values marshmallow coerces or refuses
LEFT_TO_THE_SCHEMA: list[Any] = [
    {"seconds": "1"},
    {"seconds": True},
    {"seconds": -1},
    {"seconds": 10**400},
    {"seconds": float("inf")},
    {"seconds": None},
    {"steps": 0},
    {"steps": 1.0},
    {"steps": "2"},
    {"fail_items": "1"},
    {"fail_items": [1.5]},
    {"fail_items": [None]},
    {"fail_items": [2**63]},
    {"fail_code": 0},
    {"unknown": 1},
    [],
    None,
]


def _schema(payload: Any) -> dict[str, Any]:
    try:
        return {"data": orjson.dumps(processors.validate(SLEEP, payload))}
    except ValidationError as exc:
        return {"errors": processors.flatten_errors(exc.messages, prefix="payload")}


def _web(payload: Any) -> dict[str, Any]:
    try:
        return {"data": orjson.dumps(validated_payload(SLEEP, payload))}
    except ValidationFailed as exc:
        return {"errors": exc.extra["errors"]}


def _fast() -> Any:
    proc = processors.get(SLEEP)
    assert proc is not None
    fast = _fast_payload(proc.schema)
    assert fast is not None  # demo.sleep's schema is one the fast path mirrors
    return fast


@pytest.mark.parametrize("payload", CARRIED, ids=range(len(CARRIED)))
def test_a_plainly_valid_payload_is_loaded_by_the_fast_path_as_the_schema_loads_it(payload: dict[str, Any]) -> None:
    assert _fast()(payload) is not None
    assert _web(payload) == _schema(payload)
    assert "data" in _web(payload)


@pytest.mark.parametrize("payload", LEFT_TO_THE_SCHEMA, ids=range(len(LEFT_TO_THE_SCHEMA)))
def test_what_the_fast_path_cannot_vouch_for_gets_the_schema_s_answer(payload: Any) -> None:
    if isinstance(payload, dict):
        assert _fast()(payload) is None
    assert _web(payload) == _schema(payload)


def test_an_int_for_a_json_number_loads_as_the_float_marshmallow_gives() -> None:
    assert orjson.dumps(validated_payload(SLEEP, {"seconds": 0})["seconds"]) == b"0.0"


@pytest.mark.parametrize("task_type", ["orders.export", "orders.split"])
def test_a_schema_the_fast_path_cannot_mirror_is_loaded_by_marshmallow(task_type: str) -> None:
    proc = processors.get(task_type)
    assert proc is not None
    assert _fast_payload(proc.schema) is None
    with pytest.raises(ValidationFailed):
        validated_payload(task_type, {})
