"""``test.poison``: a processor whose item ``at`` kills its own process (SIGKILL, as the OOM killer would) on
every run, for tests/integration/test_crash_resume.py.

Its items before ``at`` succeed; item ``at - 1`` takes ``pause`` seconds, so the throttled progress write
after it carries a checkpoint of ``at`` items done before item ``at`` is reached. ``pause`` must be longer
than TASKPORT_HEARTBEAT_INTERVAL + TASKPORT_PROGRESS_INTERVAL (1.5 s by default): the heartbeat's flush
during the pause writes the items before it, and the write after it waits for the progress interval to
have passed since. A run that resumes from that checkpoint starts at item ``at``, and dies there again.
One attempt (no retries), as the built-ins have.
"""

from __future__ import annotations

import os
import signal
import time

from marshmallow import Schema, fields, validate

from workers.context import TaskContext
from workers.processors import processor


class PoisonSchema(Schema):
    items = fields.Integer(required=True, strict=True, validate=validate.Range(2, 1000))
    at = fields.Integer(required=True, strict=True, validate=validate.Range(1, 999))
    pause = fields.Float(load_default=2.5, validate=validate.Range(0, 10))


@processor("test.poison", schema=PoisonSchema, timeout=120)
def poison(payload: dict, ctx: TaskContext) -> dict:
    """Process ``items`` items; item ``at`` ends this process with SIGKILL, every time."""
    ctx.each(range(payload["items"]), lambda index: _item(index, payload["at"], payload["pause"]))
    return {"items": payload["items"]}  # never reached while at < items


def _item(index: int, at: int, pause: float) -> int:
    if index == at - 1:
        time.sleep(pause)  # the progress write after this item carries the checkpoint
    if index == at:
        os.kill(os.getpid(), signal.SIGKILL)
    return index
