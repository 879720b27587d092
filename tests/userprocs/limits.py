"""Processors of the limits' tests (issue 31; tests/integration/test_concurrency_limits.py, test_rate_limits.py):

- ``test.rated``: takes one token of rate limit ``limit`` (``rate`` per ``per`` seconds) per item, for ``items``
  items, and returns the time (``time.time()``) each token was used: what the rate tests measure.
"""

from __future__ import annotations

import time

from marshmallow import Schema, fields, validate

from workers.context import TaskContext
from workers.processors import processor


class RatedSchema(Schema):
    limit = fields.String(required=True, validate=validate.Length(min=1, max=100))
    rate = fields.Float(required=True, validate=validate.Range(0.01, 1e6))
    per = fields.Float(load_default=1.0, validate=validate.Range(0.001, 3600))
    items = fields.Integer(strict=True, required=True, validate=validate.Range(1, 10000))


@processor("test.rated", schema=RatedSchema, timeout=120)
def rated(payload: dict, ctx: TaskContext) -> dict:
    """One token per item; the result lists when each was used (s since the epoch)."""

    def one(item: int) -> float:
        ctx.limit(payload["limit"], payload["rate"], per=payload["per"])
        return time.time()

    return {"used": ctx.each(range(payload["items"]), one)}
