"""``batch.summary``: the ``then`` task of a batch that gathers what its tasks did.

Run as a batch's ``then`` (it fails with 10003 anywhere else), it reads the batch through ``ctx.batch``
(workers.batchview: the worker's own store, no HTTP) and returns the batch's counts and items and, for each
task in submit order, its status, error and result (results past ``MAX_RESULTS`` tasks are left out, their
statuses kept: a result's size is the processor's, and the summary stays one Redis value).
"""

from __future__ import annotations

from typing import Any

from marshmallow import RAISE, Schema

from app.core.processors import processor
from app.core.states import BusinessCode, TaskStatus
from workers.context import TaskContext
from workers.exceptions import TaskError

MAX_RESULTS = 1000


class SummarySchema(Schema):
    class Meta:
        unknown = RAISE


@processor("batch.summary", schema=SummarySchema, timeout=600)
def summary(payload: dict, ctx: TaskContext) -> dict[str, Any]:
    """The batch's counts, items and each task's outcome: see the module docstring."""
    if ctx.batch is None:
        raise TaskError(BusinessCode.NOT_A_THEN, "batch.summary runs only as a batch's then task")
    doc = ctx.batch.document or {}
    tasks = []
    for i, task in enumerate(ctx.batch.tasks()):
        ctx.check_cancelled()
        entry = {"task_id": task["task_id"], "status": task["status"], "error": task["error"]}
        if task["status"] == TaskStatus.COMPLETED and i < MAX_RESULTS:
            entry["result"] = ctx.batch.result(task["task_id"])
        tasks.append(entry)
    return {"batch_id": ctx.batch.id, "counts": doc.get("counts"), "items": doc.get("items"), "tasks": tasks}
