"""The result store's orphan sweep: objects of tasks that no longer have a result to serve.

Files normally go with their task: a failed, cancelled or lost run deletes what it wrote, and expiry
deletes a task's files when it tombstones it. What can be left over: a delete that met an unreachable
store (S3 deletes log and go on), or a worker killed outright before its cleanup (with S3, maybe an
unfinished multipart upload and nothing else: the store lists such a folder too). Each housekeeping
expiry pass walks the next ``BATCH`` task folders of the store (continuing where the last pass
stopped, from the id kept by :class:`app.core.indexes.SweepPosition`) and removes those whose task is gone or ended
without a result (FAILED, CANCELLED, EXPIRED). Folders of PENDING, PROCESSING and COMPLETED tasks are
kept: nothing can bring a FAILED, CANCELLED, EXPIRED or unknown task back to a state that reads files.
"""

from __future__ import annotations

import logging

from app.core.indexes import SweepPosition
from app.core.results import ResultStore, StoreUnavailable
from app.core.states import TaskStatus
from app.core.store import TaskStore

log = logging.getLogger(__name__)
BATCH = 500
NO_RESULT = frozenset({TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.EXPIRED})


def sweep(store: TaskStore, results: ResultStore, batch: int = BATCH) -> int:
    """Remove the orphans among the next ``batch`` task folders; returns how many were removed."""
    position = SweepPosition(store.redis)
    after = position.read()
    try:
        ids = results.task_ids(after, batch)
    except StoreUnavailable as exc:
        log.warning("orphan sweep skipped: %s", exc)
        return 0
    removed = 0
    for task_id, task in zip(ids, store.get_many(ids), strict=True):
        if task is None or task.status in NO_RESULT:
            results.delete(task_id)
            removed += 1
    position.save(ids[-1] if len(ids) == batch else "")  # at the end: start over next time
    if removed:
        log.info("orphan sweep removed the files of %d tasks", removed)
    return removed
