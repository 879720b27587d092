"""The processor registry: registration rules, loading user modules and entry points, validation."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
from marshmallow import Schema, ValidationError, fields

import app.core.processors as registry
from app.core.processors import ProcessorLoadError
from workers.context import TaskContext

USER_MODULE = "tests.userprocs.tasks"
REAL_ENTRY_POINTS = registry._entry_points


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A private copy of the registry, and user modules that re-import (and so re-register)."""
    registry.load()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.delitem(sys.modules, USER_MODULE, raising=False)
    monkeypatch.setattr(registry, "_entry_points", lambda: [])


def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


class EmptySchema(Schema):
    pass


def noop(payload: dict, ctx: TaskContext) -> dict:
    return {}


def other(payload: dict, ctx: TaskContext) -> dict:
    return {}


def test_builtins_are_registered():
    types = registry.known_types()
    assert {"demo.sleep", "orders.export", "orders.split"} <= set(types) and types == sorted(types)
    found = registry.get("orders.split")
    assert found is not None and found.type == "orders.split" and found.priority == "default"
    assert isinstance(found.schema, Schema)
    assert registry.get("nope") is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.timeout = 1  # type: ignore[misc]


def test_load_user_module_idempotently():
    registry.load([USER_MODULE])
    registry.load([USER_MODULE])
    assert {"user.echo", "test.flaky", "test.slow"} <= set(registry.known_types())
    echo = registry.get("user.echo")
    assert echo is not None
    assert echo.func({"text": "hi"}, None) == {"echo": "hi"}  # type: ignore[arg-type]
    slow = registry.get("test.slow")
    assert slow is not None and slow.timeout == 1
    flaky = registry.get("test.flaky")
    assert flaky is not None and flaky.retries == 2


def test_reimporting_the_same_function_is_fine():
    registry.load([USER_MODULE])
    first = registry.get("user.echo")
    importlib.reload(sys.modules[USER_MODULE])
    second = registry.get("user.echo")
    assert first is not None and second is not None and second.func is not first.func


def test_duplicate_type_from_another_function_is_an_error():
    registry.processor("x.dup", schema=EmptySchema)(noop)
    registry.processor("x.dup", schema=EmptySchema())(noop)
    with pytest.raises(ValueError, match="x.dup"):
        registry.processor("x.dup", schema=EmptySchema)(other)


def test_user_module_clashing_with_a_builtin_fails_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    name = write_module(
        tmp_path,
        monkeypatch,
        "clash_procs",
        """
        from marshmallow import Schema
        from workers.processors import processor

        @processor("orders.split", schema=Schema)
        def split(payload, ctx):
            return {}
    """,
    )
    with pytest.raises(ProcessorLoadError, match="clash_procs.*already registered"):
        registry.load([name])


def test_missing_or_broken_module_names_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(ProcessorLoadError, match="tests.userprocs.missing"):
        registry.load(["tests.userprocs.missing"])
    name = write_module(tmp_path, monkeypatch, "broken_procs", "raise RuntimeError('oops')\n")
    with pytest.raises(ProcessorLoadError, match="broken_procs.*oops") as caught:
        registry.load([name])
    assert isinstance(caught.value, ImportError)


def test_entry_points_are_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    name = write_module(
        tmp_path,
        monkeypatch,
        "plugin_procs",
        """
        from marshmallow import Schema
        from workers.processors import processor

        @processor("plugin.noop", schema=Schema, priority="low")
        def noop(payload, ctx):
            return {}
    """,
    )
    entry = metadata.EntryPoint(name="plugin", value=name, group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "_entry_points", lambda: [entry])
    registry.load()
    found = registry.get("plugin.noop")
    assert found is not None and found.priority == "low"


def test_broken_entry_point_names_itself(monkeypatch: pytest.MonkeyPatch):
    entry = metadata.EntryPoint(name="bad", value="no_such_module_xyz", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "_entry_points", lambda: [entry])
    with pytest.raises(ProcessorLoadError, match="'bad'.*no_such_module_xyz"):
        registry.load()


def test_real_entry_point_lookup_uses_the_group():
    assert list(REAL_ENTRY_POINTS()) == list(metadata.entry_points(group="taskport.processors"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"type": "", "schema": EmptySchema},
        {"type": "has space", "schema": EmptySchema},
        {"type": "x.ok", "schema": EmptySchema, "priority": "urgent"},
        {"type": "x.ok", "schema": EmptySchema, "timeout": 0},
        {"type": "x.ok", "schema": EmptySchema, "retries": -1},
    ],
)
def test_bad_options_are_rejected(kwargs: dict):
    with pytest.raises(ValueError):
        registry.processor(**kwargs)


def test_schema_must_be_a_marshmallow_schema():
    with pytest.raises(TypeError):
        registry.processor("x.ok", schema=dict)  # type: ignore[arg-type]


class ThingSchema(Schema):
    name = fields.String(required=True)
    count = fields.Integer(strict=True, load_default=1)


def test_validate_applies_defaults_or_raises():
    registry.processor("x.thing", schema=ThingSchema)(noop)
    assert registry.validate("x.thing", {"name": "a"}) == {"name": "a", "count": 1}
    with pytest.raises(ValidationError) as caught:
        registry.validate("x.thing", {"count": "2"})
    assert registry.flatten_errors(caught.value.messages, "payload") == {
        "payload.name": ["Missing data for required field."],
        "payload.count": ["Not a valid integer."],
    }
    with pytest.raises(KeyError):
        registry.validate("x.unknown", {})


def test_validate_rejects_non_objects():
    with pytest.raises(ValidationError) as caught:
        registry.validate("orders.split", ["not", "an", "object"])
    assert registry.flatten_errors(caught.value.messages, "payload") == {"payload": ["Invalid input type."]}


def test_flatten_errors_shapes():
    messages = {
        "items": {
            0: {"quantity": ["Not a valid integer."]},
            3: {"item_code": ["Shorter than minimum length 1."]},
        },
        "order_code": ["Missing data for required field."],
        "_schema": ["Bad."],
        "odd": [{"x": ["y"]}, "z"],
    }
    assert registry.flatten_errors(messages) == {
        "items.0.quantity": ["Not a valid integer."],
        "items.3.item_code": ["Shorter than minimum length 1."],
        "order_code": ["Missing data for required field."],
        "_schema": ["Bad."],
        "odd.x": ["y"],
        "odd": ["z"],
    }
