"""The submit envelope's fast path (app.web.api.tasks._envelope) answers exactly what SubmitSchema answers."""

from __future__ import annotations

from typing import Any

import pytest
from marshmallow import ValidationError

from app.core import processors
from app.web.api.tasks import _envelope
from app.web.errors import ValidationFailed
from app.web.schemas import SubmitSchema

BODIES: list[dict[str, Any]] = [
    {"type": "sleep"},
    {"type": "sleep", "payload": {"seconds": 1}},
    {"type": "sleep", "payload": {}, "dedup_key": "k", "priority": "high"},
    {"type": "x" * 200, "dedup_key": "d" * 128, "priority": "low"},
    {"type": "sleep", "dedup_key": None, "priority": None},
    {"type": "x" * 201},
    {"type": ""},
    {"type": None},
    {"type": 3},
    {"type": True},
    {},
    {"payload": {}},
    {"type": "sleep", "payload": None},
    {"type": "sleep", "payload": []},
    {"type": "sleep", "payload": "x"},
    {"type": "sleep", "dedup_key": ""},
    {"type": "sleep", "dedup_key": "d" * 129},
    {"type": "sleep", "dedup_key": 5},
    {"type": "sleep", "priority": "urgent"},
    {"type": "sleep", "priority": ""},
    {"type": "sleep", "priority": 1},
    {"type": "sleep", "extra": 1},
    {"type": "", "priority": "x", "dedup_key": "", "payload": 1, "other": 2},
]


def _schema(body: dict[str, Any]) -> dict[str, Any] | dict[str, list[str]]:
    try:
        return {"data": SubmitSchema().load(body)}
    except ValidationError as exc:
        return {"errors": processors.flatten_errors(exc.messages)}


def _fast(body: dict[str, Any]) -> dict[str, Any] | dict[str, list[str]]:
    try:
        return {"data": _envelope(body)}
    except ValidationFailed as exc:
        return {"errors": exc.extra["errors"]}


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_envelope_answers_what_the_schema_answers(body: dict[str, Any]) -> None:
    assert _fast(body) == _schema(body)


def test_the_payload_is_a_copy_as_marshmallow_gives() -> None:
    payload = {"seconds": 1}
    assert _envelope({"type": "sleep", "payload": payload})["payload"] is not payload
