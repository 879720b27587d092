"""What a batch's ``then`` task sees of its batch: ``ctx.batch`` (a :class:`BatchView`).

The then task runs once every task of its batch has ended; its processor reads the batch (its document, its
task ids, each task's status document and result) here, through the worker's own store, never over HTTP.
Reads are made when asked (the batch is done: nothing of it changes but tasks expiring).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from app.core.batches import BatchStore
from app.core.clock import now_ms
from app.core.results import ResultStore, unspill
from app.core.states import TaskStatus
from app.core.store import TaskStore
from app.core.urls import batch_document, status_document

CHUNK = 200  # tasks read per round trip


class BatchView:
    def __init__(self, store: TaskStore, results: ResultStore, batch_id: str) -> None:
        self.id = batch_id
        self._store = store
        self._batches = BatchStore(store)
        self._results = results

    @property
    def document(self) -> dict[str, Any] | None:
        """The batch document as it is now (None once the batch expired)."""
        batch = self._batches.get(self.id)
        return batch_document(batch, now_ms()) if batch is not None else None

    @property
    def task_ids(self) -> list[str]:
        """Its task ids in submit order (a duplicate's holder once per place it holds)."""
        return self._batches.task_ids(self.id)

    def tasks(self) -> Iterator[dict[str, Any]]:
        """Each task's status document, in submit order (a task already gone is skipped)."""
        ids = self.task_ids
        for at in range(0, len(ids), CHUNK):
            now = now_ms()
            for task in self._store.get_many(ids[at:at + CHUNK]):
                if task is not None:
                    yield status_document(task, now)

    def result(self, task_id: str) -> Any:
        """The result of one of its COMPLETED tasks (a spilled one read back from the result store); None for a
        task that did not complete, or is not the batch's."""
        found = self._store.get_with_result(task_id)
        task, stored = found.task, found.result
        if task is None or stored is None or task.status != TaskStatus.COMPLETED or self.id not in (task.batches or ()):
            return None
        return unspill(self._results.for_run(stored.get("run")), task_id, stored)["result"]

    def results(self) -> Iterator[tuple[str, Any]]:
        """(task id, result) of each COMPLETED task, in submit order."""
        for task_id in dict.fromkeys(self.task_ids):
            result = self.result(task_id)
            if result is not None:
                yield task_id, result
