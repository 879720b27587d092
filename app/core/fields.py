"""Marshmallow fields the web's schemas and the processors' payload schemas share."""

from __future__ import annotations

from typing import Any

from marshmallow import fields


class JsonNumber(fields.Float):
    """A JSON number (int or float); unlike ``fields.Float`` it refuses numeric strings like "1.5"."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if isinstance(value, str):
            raise self.make_error("invalid")
        return super()._deserialize(value, attr, data, **kwargs)


class JsonBoolean(fields.Boolean):
    """``true`` or ``false`` as JSON gives them; marshmallow's own also takes "yes", "on", 1, 0..."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> Any:
        if type(value) is not bool:
            raise self.make_error("invalid")
        return value
