"""``demo.sleep``: a processor for tests, demos and benchmarks.

Its payload is fixed by the API contract ("Built-in task types").

It sleeps ``seconds`` in ``steps`` equal steps (cancellable within ``SLEEP_SLICE``), reporting progress
after each step (with items, the steps are the first half of the progress, the items the second: a progress
that never goes down would otherwise sit at 99 through the items); then processes ``items`` items of
``item_seconds`` each, failing those in ``fail_items`` with 10002; then, with ``fail_code`` set, fails the
whole task with that code. With ``output`` true it emits one output line (``ctx.emit``) per step and per item.

It resumes where a stopped run left off: the steps by its cursor (the last step done), the items by the
context's checkpoint (workers.checkpoint).
"""

from __future__ import annotations

from marshmallow import Schema, fields, validate

from app.core.fields import JsonBoolean, JsonNumber
from app.core.processors import INT64, INT64_MAX, processor
from app.core.states import BusinessCode
from workers.context import TaskContext
from workers.exceptions import ItemError, TaskError

MAX_SECONDS = 3600
MAX_ITEMS = 100000
MAX_ITEM_SECONDS = 60
PROGRESS_STEPS = 100  # with items, the progress moves this many times through them (a call per item would cost)


class SleepSchema(Schema):
    seconds = JsonNumber(load_default=0, validate=validate.Range(0, MAX_SECONDS))
    steps = fields.Integer(strict=True, load_default=10, validate=validate.Range(1, 10000))
    items = fields.Integer(strict=True, load_default=0, validate=validate.Range(0, MAX_ITEMS))
    item_seconds = JsonNumber(load_default=0, validate=validate.Range(0, MAX_ITEM_SECONDS))
    # at most one entry per item; the bound keeps a payload's size in step with what it can mean
    fail_items = fields.List(fields.Integer(strict=True, validate=INT64), load_default=list,
                             validate=validate.Length(max=MAX_ITEMS))
    fail_code = fields.Integer(
        strict=True, load_default=None, allow_none=True, validate=validate.Range(min=1, max=INT64_MAX)
    )
    output = JsonBoolean(load_default=False)  # a line per step and per item (live output)


@processor("demo.sleep", schema=SleepSchema, timeout=MAX_SECONDS + 60)
def sleep(payload: dict, ctx: TaskContext) -> dict:
    """Sleep, process dummy items, optionally fail: see the module docstring."""
    seconds = _plain_number(payload["seconds"])
    steps = payload["steps"]
    done = (ctx.cursor or {}).get("step", 0)
    count = payload["items"]
    for step in range(done + 1, steps + 1):
        ctx.sleep(seconds / steps)
        ctx.save_cursor({"step": step})
        ctx.progress(step, 2 * steps if count else steps, f"step {step} of {steps}")
        if payload["output"]:
            ctx.emit(f"step {step} of {steps}")
    if count:
        failing, pause, emits = set(payload["fail_items"]), payload["item_seconds"], payload["output"]
        every = max(1, count // PROGRESS_STEPS)
        ctx.each(range(count), lambda index: _item(index, failing, pause, ctx, emits, count, every))
    if payload["fail_code"] is not None:
        code = payload["fail_code"]
        raise TaskError(code, f"demo failure requested with code {code}")
    return {"slept": seconds, "items": count}


def _item(index: int, failing: set[int], pause: float, ctx: TaskContext, emits: bool, count: int, every: int) -> int:
    if index % every == 0:  # the second half of the progress (the context's own, index of count, is never more)
        ctx.progress(count + index, 2 * count)
    if pause:
        ctx.sleep(pause)
    if emits:
        ctx.emit(f"item {index}")
    if index in failing:
        raise ItemError(BusinessCode.INVALID_QUANTITY, f"demo item {index} failed as requested")
    return index


def _plain_number(value: float) -> float | int:
    """5.0 -> 5, so the result echoes a whole number of seconds the way it was most likely sent."""
    return int(value) if float(value).is_integer() else value
