"""A schema's ``load`` for plainly valid input, derived from the marshmallow schema itself.

marshmallow's load of the submit envelope costs ~12 µs, this ~1.5 µs (bench/envelope.py); most of it is
the schema's machinery (error store, hooks, the per-field call chain), not the checks. :class:`FastLoad`
reads the schema's fields once (their keys, types, validators, required flags, defaults and ``allow_none``)
and answers what ``schema.load(body)`` would answer for a body it can vouch for, or None for anything
else: the caller then loads that body with the schema, so every error answer is marshmallow's own. The
schema stays the one definition: a field added to it is carried by the fast path, or the fast path refuses
to be built (:class:`TypeError` when the app imports) if it cannot mirror the field exactly.

What is mirrored: the exact field classes of :data:`KINDS` (a subclass such as ``Email`` may change what a
value means, so it is refused); every validator, by calling the validator itself; ``required``,
``load_default`` (a value or a callable), ``allow_none``, ``data_key`` and ``attribute``. What is refused:
other field classes, field-level ``pre_load``/``post_load``, a dotted ``attribute``, schema hooks
(``@pre_load``, ``@post_load``, ``@validates``, ``@validates_schema``), ``many`` and ``partial``.
A body with a key the schema does not load is always left to the schema (whatever ``unknown`` says).
A ``List`` is mirrored when its inner field is (each element loaded as that field).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from marshmallow import Schema, ValidationError, fields, missing
from marshmallow.decorators import POST_LOAD, PRE_LOAD, VALIDATES, VALIDATES_SCHEMA

from app.core.fields import JsonBoolean, JsonNumber

DECLINE: Final = object()  # "not plainly valid": the schema answers this body
Convert = Callable[[Any], Any]  # a present, non-null value -> its loaded value, or DECLINE


def _string(value: Any) -> Any:
    return value if type(value) is str else DECLINE  # JSON gives str only (marshmallow also decodes bytes)


def _integer(value: Any) -> Any:
    return value if type(value) is int else DECLINE  # not bool; marshmallow's int("5") is left to it


def _float(value: Any) -> Any:
    return value if type(value) is float and math.isfinite(value) else DECLINE


def _json_number(value: Any) -> Any:
    """JsonNumber's load (marshmallow's Float of an int or a float: a float)."""
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:  # marshmallow answers "too large" for it
            return DECLINE
    return _float(value)


def _boolean(value: Any) -> Any:
    return value if type(value) is bool else DECLINE


def _dict(value: Any) -> Any:
    return dict(value) if type(value) is dict else DECLINE  # a copy, as marshmallow gives


def _dict_of_string_keys(value: Any) -> Any:
    return dict(value) if type(value) is dict and all(type(k) is str for k in value) else DECLINE


def _boolean_kind(field: fields.Field) -> Convert | None:
    default_sets = field.truthy is fields.Boolean.truthy and field.falsy is fields.Boolean.falsy  # type: ignore[attr-defined]
    return _boolean if default_sets else None  # other truthy/falsy sets give other answers


def _dict_kind(field: fields.Field) -> Convert | None:
    key, value = field.key_field, field.value_field  # type: ignore[attr-defined]
    if value is not None:
        return None
    if key is None:
        return _dict
    plain_key = type(key) is fields.String and not key.validators and not _processors(key)
    return _dict_of_string_keys if plain_key else None


def _list_kind(field: fields.Field) -> Convert | None:
    """A list whose every element loads as its inner field (mirrored itself, validators included) would."""
    element = _present_loader(f"{type(field).__name__} of", field.inner)  # type: ignore[attr-defined]

    def load(value: Any) -> Any:
        if type(value) is not list:
            return DECLINE
        loaded = [element(v) for v in value]
        return DECLINE if any(v is DECLINE for v in loaded) else loaded

    return load


# field class (exactly) -> how a value of such a field is loaded (None: this field is not mirrored)
KINDS: dict[type[fields.Field], Callable[[fields.Field], Convert | None]] = {
    fields.String: lambda _: _string,
    fields.Integer: lambda _: _integer,
    fields.Float: lambda _: _float,
    JsonNumber: lambda _: _json_number,  # an int or a float as JSON gives it; anything else falls back to the schema
    fields.Boolean: _boolean_kind,
    JsonBoolean: lambda _: _boolean,  # true or false only, exactly as _boolean takes them
    fields.Dict: _dict_kind,
    fields.List: _list_kind,
}
_LOAD_HOOKS = (PRE_LOAD, POST_LOAD, VALIDATES, VALIDATES_SCHEMA)


def _processors(field: fields.Field) -> bool:
    return bool(getattr(field, "pre_load", None) or getattr(field, "post_load", None))


def _convert(where: str, field: fields.Field) -> Convert:
    kind = KINDS.get(type(field))
    convert = kind(field) if kind is not None else None
    if convert is None or _processors(field) or "." in (field.attribute or ""):
        raise TypeError(f"{where}: app.web.fastload cannot mirror this {type(field).__name__} field exactly; "
                        "teach it (app.web.fastload.KINDS) or load this schema without FastLoad")
    return convert


def _present_loader(where: str, field: fields.Field) -> Convert:
    """One field's load of a value that is there: its loaded value, or DECLINE."""
    convert = _convert(where, field)
    validators = tuple(field.validators)
    allow_none = field.allow_none

    def load(value: Any) -> Any:
        if value is None:
            return None if allow_none else DECLINE
        value = convert(value)
        if value is DECLINE:
            return DECLINE
        for check in validators:  # the schema's own validators, called as marshmallow calls them
            try:
                check(value)
            except ValidationError:
                return DECLINE
        return value

    return load


class _Default:
    """A field's callable ``load_default``, called for each body that leaves the field out."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def _absent(field: fields.Field) -> Any:
    """What loading a body without the field gives it: DECLINE (required), ``missing`` (left out, as marshmallow
    leaves it), its ``load_default`` (the same object each time, as marshmallow gives it), or a :class:`_Default`."""
    if field.required:
        return DECLINE
    default = field.load_default
    return _Default(default) if callable(default) else default


class FastLoad:
    """``schema.load(body)`` of a plainly valid body, or None: then the caller loads it with the schema."""

    def __init__(self, schema: Schema) -> None:
        name = type(schema).__name__
        hooks = [tag for tag in _LOAD_HOOKS if schema._hooks[tag]]
        if hooks or schema.many or schema.partial:
            raise TypeError(f"{name}: app.web.fastload does not mirror {hooks or 'many/partial'}")
        self._fields = [
            (attr if field.data_key is None else field.data_key, field.attribute or attr,
             _present_loader(f"{name}.{attr}", field), _absent(field))
            for attr, field in schema.load_fields.items()
        ]
        self._keys = frozenset(key for key, _, _, _ in self._fields)

    def __call__(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        if not self._keys.issuperset(body):
            return None
        out: dict[str, Any] = {}
        for key, attribute, load, absent in self._fields:
            value = body.get(key, missing)
            if value is not missing:
                value = load(value)
                if value is DECLINE:
                    return None
            elif absent is missing:
                continue
            elif absent is DECLINE:
                return None
            elif type(absent) is _Default:
                value = absent.make()
            else:
                value = absent
            out[attribute] = value
        return out
