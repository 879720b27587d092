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
