"""The batch endpoints' steps over the batch store (app.core.batches): ownership, the create from loaded submit
bodies, the cap's refusal, cancelling. Views call this; nothing here knows about requests."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from app.core.answers import ActiveCapReached, StoredBytesReached
from app.core.batches import Batch, BatchCreated, BatchStore, BatchTask
from app.core.clock import now_ms
from app.core.ids import digest, is_task_id, new_task_ids
from app.core.logs import task_logger
from app.core.states import ACTIVE
from app.core.submit import first_job_for, new_task
from app.web.errors import AppError, NotFound, ValidationFailed
from app.web.intake import Submission, prefixed
from app.web.service import TaskService, dedup_digest, over_active_cap, over_stored_bytes

log = logging.getLogger(__name__)


def batch_not_found() -> NotFound:
    return NotFound("batch not found")


class BatchService:
    def __init__(self, tasks: TaskService) -> None:
        self.tasks = tasks
        self.store = BatchStore(tasks.store)

    def create(self, member: str, subs: Sequence[Submission], then: Submission | None,
               callback_url: str) -> tuple[BatchCreated, set[str]]:
        """The batch of ``subs`` (each loaded and checked) with its ``then`` task: all created or nothing, and the
        queues its new tasks went on now (for the no-worker warning). ValidationFailed naming
        ``tasks.N.after.M`` for an ``after`` id that is not the member's; 429 at the cap."""
        batch_id, *task_ids = new_task_ids(len(subs) + 2)  # the batch's, its tasks', its then task's
        blocks: list[BatchTask] = []
        errors: dict[str, list[str]] = {}
        for i, (sub, task_id) in enumerate(zip(subs, task_ids, strict=False)):
            after: Sequence[str] = ()
            if sub.after is not None:
                try:
                    after = self.tasks.owned_ids(member, sub.after)
                except ValidationFailed as exc:
                    errors.update(prefixed(exc, f"tasks.{i}"))
                    continue
            new = new_task(member, sub.type, sub.payload, dedup_digest(sub.type, sub.submitted, sub.dedup_key),
                           sub.priority, callback=sub.callback, batch=batch_id, task_id=task_id)
            blocks.append(BatchTask(new, first_job_for(self.tasks.jobs, new, sub.run_at), sub.run_at, after))
        if errors:
            raise refused(errors)
        then_task = None
        if then is not None:  # its dedup key is the batch's own: never held, never holding a submit's
            then_task = BatchTask(new_task(member, then.type, then.payload, digest(b"then\n" + batch_id.encode()),
                                           then.priority, callback=then.callback, then_of=batch_id,
                                           task_id=task_ids[-1]))
        try:
            created = self.store.create(batch_id, member, blocks, then_task, callback_url)
        except ActiveCapReached as exc:
            log.info("batch of %d tasks by %s refused: %s", len(subs), member, exc)
            raise over_active_cap(exc) from None
        except StoredBytesReached as exc:
            log.info("batch of %d tasks by %s refused: %s", len(subs), member, exc)
            raise over_stored_bytes(exc) from None
        duplicates = sum(1 for e in created.entries if e.duplicate)
        log.info("batch %s submitted by %s: %d tasks (%d duplicates)%s", batch_id, member, len(subs), duplicates,
                 f", then {created.batch.then_task_id}" if then_task else "")
        queued = {b.new.priority for b, e in zip(blocks, created.entries, strict=True) if b.job and not e.duplicate}
        return created, queued

    def find(self, member: str, batch_id: str) -> Batch:
        """The member's batch, or NotFound (unknown, someone else's and malformed ids look the same)."""
        found = self.store.get(batch_id) if is_task_id(batch_id) else None
        if found is None or found.member != member:
            raise batch_not_found()
        return found

    def cancel(self, member: str, batch_id: str) -> int:
        """Cancel the batch's unfinished tasks and its then task: how many were cancelled. Each is a cancel like
        any other (its job removed or its run stopped); a task that ended meanwhile is left as it ended."""
        batch = self.find(member, batch_id)
        ids = list(dict.fromkeys(self.store.task_ids(batch_id)))
        if batch.then_task_id:  # first: cancelling the last task must not release it meanwhile
            ids.insert(0, batch.then_task_id)
        now, cancelled = now_ms(), 0
        for task_id, task in zip(ids, self.tasks.store.get_many(ids), strict=True):
            if task is None or task.member != member or task.effective_status(now) not in ACTIVE:
                continue
            try:
                self.tasks.cancel(member, task_id)
                cancelled += 1
            except AppError:  # it ended between the read and the cancel (409): as it ended
                task_logger(log, task_id).info("not cancelled with batch %s: it had ended", batch_id)
        log.info("batch %s cancelled by %s: %d unfinished tasks cancelled", batch_id, member, cancelled)
        return cancelled


def refused(errors: dict[str, list[str]]) -> ValidationFailed:
    """The batch's 422: every field at fault, named by its task's index; nothing was stored."""
    tasks_at_fault = len({name.split(".", 2)[1] for name in errors if name.startswith("tasks.")})
    what = f"{tasks_at_fault} of its tasks" if tasks_at_fault else "the batch"
    return ValidationFailed(errors, f"{what} failed validation ({next(iter(errors))} first): nothing was stored")

