"""The submit envelope's fast path (app.web.intake.envelope, a FastLoad of SubmitSchema) answers exactly
what SubmitSchema answers, and a field added to the schema is carried by it (or refused when the app imports)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from marshmallow import Schema, ValidationError, fields, post_load, validate, validates_schema

from app.core import processors
from app.web.errors import ValidationFailed
from app.web.fastload import FastLoad
from app.web.intake import _fast_envelope
from app.web.intake import envelope as _envelope
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


ABSENT = object()
VALUES = {  # per field: valid and invalid values (ABSENT: the key is left out)
    "type": [ABSENT, "sleep", "", "x" * 200, "x" * 201, None, 3, True],
    "payload": [ABSENT, {}, {"a": [1]}, None, [], "x"],
    "dedup_key": [ABSENT, None, "k", "", "d" * 128, "d" * 129, 5],
    "priority": [ABSENT, None, "high", "low", "urgent", "", 1, False],
}


def test_every_combination_of_field_values_is_answered_as_the_schema_answers() -> None:
    names = list(VALUES)
    bodies = [{k: v for k, v in zip(names, values, strict=True) if v is not ABSENT}
              for values in itertools.product(*VALUES.values())]
    assert len(bodies) == 2688
    assert [b for b in bodies if _fast(b) != _schema(b)] == []
    assert [b for b in bodies if _fast({**b, "extra": 1}) != _schema({**b, "extra": 1})] == []


def test_the_payload_is_a_copy_as_marshmallow_gives() -> None:
    payload = {"seconds": 1}
    assert _envelope({"type": "sleep", "payload": payload})["payload"] is not payload


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_the_fast_path_itself_answers_every_valid_body_and_no_invalid_one(body: dict[str, Any]) -> None:
    assert (_fast_envelope(body) is not None) == ("data" in _schema(body))


class Later(SubmitSchema):
    """SubmitSchema as the next issue might grow it: a field of every kind FastLoad mirrors."""

    run_in = fields.Integer(validate=validate.Range(min=0, max=3600), load_default=None)
    at_most = fields.Float(validate=validate.Range(min=0, min_inclusive=False))
    notify = fields.Boolean(load_default=False)
    label = fields.String(data_key="Label", validate=[validate.Length(max=8), validate.Regexp(r"[a-z]+$")])
    tags = fields.Dict(keys=fields.String(), required=False)
    where = fields.String(validate=validate.OneOf(["here", "there"]), required=True)


# bodies the fast path answers itself (each must equal the schema's answer) ...
CARRIED: list[dict[str, Any]] = [
    {"type": "sleep", "where": "here"},
    {"type": "sleep", "where": "here", "run_in": 0, "at_most": 1.5, "notify": True, "Label": "abc", "tags": {}},
    {"type": "sleep", "where": "there", "run_in": 3600, "at_most": 0.25, "notify": False, "tags": {"a": 1},
     "payload": {"x": 1}, "dedup_key": "k", "priority": "low"},
    {"type": "sleep", "where": "here", "run_in": None},
]
# ... and bodies it leaves to the schema: invalid ones, and values marshmallow coerces ("5", 5.0, "yes", 1, 2)
LEFT_TO_THE_SCHEMA: list[dict[str, Any]] = [
    {"type": "sleep"},
    {"type": "sleep", "where": "nowhere"},
    {"type": "sleep", "where": None},
    {"type": "sleep", "where": "here", "run_in": -1},
    {"type": "sleep", "where": "here", "run_in": 3601},
    {"type": "sleep", "where": "here", "run_in": "5"},
    {"type": "sleep", "where": "here", "run_in": 5.0},
    {"type": "sleep", "where": "here", "run_in": True},
    {"type": "sleep", "where": "here", "at_most": 0.0},
    {"type": "sleep", "where": "here", "at_most": 2},
    {"type": "sleep", "where": "here", "at_most": None},
    {"type": "sleep", "where": "here", "notify": "yes"},
    {"type": "sleep", "where": "here", "notify": 1},
    {"type": "sleep", "where": "here", "notify": None},
    {"type": "sleep", "where": "here", "Label": "ABC"},
    {"type": "sleep", "where": "here", "Label": "abcdefghi"},
    {"type": "sleep", "where": "here", "label": "abc"},
    {"type": "sleep", "where": "here", "tags": []},
    {"type": "sleep", "where": "here", "tags": None},
]


@pytest.mark.parametrize("body", CARRIED, ids=range(len(CARRIED)))
def test_a_field_added_to_the_schema_is_carried_by_the_fast_path(body: dict[str, Any]) -> None:
    assert FastLoad(Later())(body) == Later().load(body)


@pytest.mark.parametrize("body", LEFT_TO_THE_SCHEMA, ids=range(len(LEFT_TO_THE_SCHEMA)))
def test_what_the_fast_path_cannot_vouch_for_is_left_to_the_schema(body: dict[str, Any]) -> None:
    assert FastLoad(Later())(body) is None


def test_the_new_fields_reach_the_loaded_envelope() -> None:
    loaded = FastLoad(Later())({"type": "sleep", "where": "here", "run_in": 7, "Label": "ab"})
    assert loaded == {"type": "sleep", "payload": {}, "dedup_key": None, "priority": None, "run_in": 7,
                      "notify": False, "label": "ab", "where": "here", "run_at": None, "delay": None, "after": None,
                      "callback": None}


class WithDate(SubmitSchema):
    run_at = fields.DateTime()


class WithEmailish(SubmitSchema):
    reply_to = fields.Email()


class WithListedTags(SubmitSchema):
    tags = fields.Dict(keys=fields.String(), values=fields.Integer())


class WithHook(SubmitSchema):
    @validates_schema
    def _check(self, data: dict[str, Any], **kwargs: Any) -> None:
        pass


class WithPostLoad(Schema):
    name = fields.String()

    @post_load
    def _made(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return data


@pytest.mark.parametrize("schema", [WithDate, WithEmailish, WithListedTags, WithHook, WithPostLoad])
def test_a_schema_the_fast_path_cannot_mirror_fails_when_it_is_built(schema: type[Schema]) -> None:
    with pytest.raises(TypeError, match=schema.__name__):
        FastLoad(schema())
