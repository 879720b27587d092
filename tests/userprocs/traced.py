"""A processor that makes a span of its own with OpenTelemetry's API (tests/integration/test_tracing.py):
``test.traced`` opens ``inner work``, which must be a child of taskport's run span."""

from __future__ import annotations

from marshmallow import Schema
from opentelemetry import trace

from workers.context import TaskContext
from workers.processors import processor


@processor("test.traced", schema=Schema, timeout=30)
def traced(payload: dict, ctx: TaskContext) -> dict:
    with trace.get_tracer(__name__).start_as_current_span("inner work"):
        return {"traced": True}
