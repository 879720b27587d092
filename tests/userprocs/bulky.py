"""``test.bulky``: a JSON result of ``size`` bytes or more (for results spilled to the result store).

Retries once, so a result store that is down at the end shows both the retry and the final -5.
"""

from __future__ import annotations

from marshmallow import Schema, fields, validate

from workers.context import TaskContext
from workers.processors import processor


class BulkySchema(Schema):
    size = fields.Integer(required=True, strict=True, validate=validate.Range(0, 10_000_000))


@processor("test.bulky", schema=BulkySchema, timeout=60, retries=1)
def bulky(payload: dict, ctx: TaskContext) -> dict:
    """``{"blob": "xx...", "size": n}`` with ``n`` characters of blob."""
    return {"blob": "x" * payload["size"], "size": payload["size"]}
