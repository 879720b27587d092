"""Creating a task, the part that needs neither HTTP nor a worker: its record, its RQ job, one script.

Two callers: the web's submit (app.web.service.TaskService.submit) and a schedule's firing in the
scheduler process (workers.firing), which may import the core but not the web.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.core import processors
from app.core.answers import Created, NewTask
from app.core.clock import now_ms
from app.core.ids import new_task_id
from app.core.jobs import JobQueue
from app.core.store import TaskStore


def create_task(store: TaskStore, jobs: JobQueue, member: str, task_type: str, payload: dict[str, Any],
                dedup_digest: str, priority: str | None, *, run_at: int | None = None,
                after: Sequence[str] = ()) -> Created:
    """Create a task of ``task_type`` (registered: KeyError otherwise) with its validated ``payload`` and queue
    its job, unless the member's ``dedup_digest`` is held (see :meth:`TaskStore.create`, which also raises
    ActiveCapReached). ``priority`` None is the processor's own. A ``run_at`` (ms) ahead and/or ``after`` (ids
    the caller checked are the member's, each once) make it wait: its job is replayed by the submit only when
    it may run now (app.core.deferred queues it later)."""
    proc = processors.get(task_type)
    if proc is None:
        raise KeyError(task_type)
    new = NewTask(
        task_id=new_task_id(), member=member, type=task_type, payload=payload, dedup_digest=dedup_digest,
        priority=priority or proc.priority, max_attempts=proc.retries + 1,
    )
    ahead = run_at is not None and run_at > now_ms()
    job = () if ahead else jobs.job_commands(new.task_id, new.priority, proc.timeout)
    return store.create(new, job, run_at=run_at, after=after)
