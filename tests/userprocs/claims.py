"""Processors for the run-ownership tests (``TASKPORT_PROCESSORS=tests.userprocs.claims``).

``test.unstorable`` returns an output the store refuses: ``{"kind": "object"}`` something orjson cannot
serialize, ``{"kind": "big", "size": n}`` a string of ``n`` characters.

``test.gated`` announces who runs it (``who <pid>-<thread>``, as its progress message), writes that into
its result file ``out.txt``, then waits (checking for cancellation) for the file ``<gate>/<who>``; with
``explode`` it then raises. After the wait it reports progress once more (a checkpoint that asks
Redis) and returns ``{"who": ..., "file": {...}}``. So a test can stall one run, let another run take
over, and decide which of them goes on first. ``test.gated_resumable`` is the same with a checkpoint first,
so the run that takes over works in the stalled run's folder.
"""

from __future__ import annotations

import os
import threading

from marshmallow import Schema, fields, validate

from workers.context import TaskContext
from workers.processors import processor


class GatedSchema(Schema):
    # defaults everywhere: the OpenAPI document's example of a type is its schema's defaults
    gate = fields.String(load_default="gate", validate=validate.Length(min=1))
    explode = fields.Boolean(load_default=False)  # raise RuntimeError once released, with no checkpoint first


def who() -> str:
    return f"{os.getpid()}-{threading.get_ident()}"


@processor("test.gated", schema=GatedSchema, timeout=120, retries=1)
def gated(payload: dict, ctx: TaskContext) -> dict:
    """Write ``out.txt`` naming this run, wait for ``<gate>/<who>``, report once more, return."""
    me = who()
    ctx.progress(1, message=f"who {me}")
    ctx.flush()
    with ctx.results.writer(ctx.task_id, "out.txt") as fh:
        fh.write(me.encode())
        while not os.path.exists(os.path.join(payload["gate"], me)):
            ctx.sleep(0.02)
        if payload["explode"]:
            raise RuntimeError("what a run meets when a later run removed the files it was writing")
        ctx.progress(90, message="released")
        ctx.flush()
        ctx.check_cancelled()
    info = ctx.results.info(ctx.task_id, "out.txt", "text/plain")
    return {"who": me, "file": {"name": info.name, "size": info.size, "content_type": info.content_type,
                                "url": f"/api/v1/tasks/{ctx.task_id}/result/file"}}


@processor("test.gated_resumable", schema=GatedSchema, timeout=120, retries=1)
def gated_resumable(payload: dict, ctx: TaskContext) -> dict:
    """``test.gated`` with a checkpoint: the first run saves a cursor once ``out.txt`` is written, so a run that
    takes over resumes in the first run's result folder and writes its own ``out.txt`` there."""
    me = who()
    with ctx.results.writer(ctx.task_id, "out.txt") as fh:
        fh.write(me.encode())
    if ctx.cursor is None:
        ctx.save_cursor({"first": me})
    ctx.progress(1, message=f"who {me}")
    ctx.flush()
    while not os.path.exists(os.path.join(payload["gate"], me)):
        ctx.sleep(0.02)
    ctx.progress(90, message="released")
    ctx.flush()
    ctx.check_cancelled()
    info = ctx.results.info(ctx.task_id, "out.txt", "text/plain")
    return {"who": me, "file": {"name": info.name, "size": info.size, "content_type": info.content_type,
                                "url": f"/api/v1/tasks/{ctx.task_id}/result/file"}}


class UnstorableSchema(Schema):
    kind = fields.String(load_default="object", validate=validate.OneOf(["object", "big"]))
    size = fields.Integer(load_default=0)


@processor("test.unstorable", schema=UnstorableSchema, timeout=30, retries=2)
def unstorable(payload: dict, ctx: TaskContext) -> dict:
    """An output that cannot be stored: the task must fail with -1 at once (no retry, no recovery)."""
    if payload["kind"] == "object":
        return {"when": object()}
    return {"big": "x" * payload["size"]}
