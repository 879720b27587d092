"""Creating a task, the part that needs neither HTTP nor a worker: its record, its RQ job, one script.

Two callers: the web's submit (app.web.service.TaskService.submit) and a schedule's firing in the
scheduler process (workers.firing), which may import the core but not the web.
"""

from __future__ import annotations

from typing import Any

from app.core import processors
from app.core.answers import Created, NewTask
from app.core.ids import new_task_id
from app.core.jobs import JobQueue
from app.core.store import TaskStore


def create_task(store: TaskStore, jobs: JobQueue, member: str, task_type: str, payload: dict[str, Any],
                dedup_digest: str, priority: str | None) -> Created:
    """Create a task of ``task_type`` (registered: KeyError otherwise) with its validated ``payload`` and queue
    its job, unless the member's ``dedup_digest`` is held (see :meth:`TaskStore.create`, which also raises
    ActiveCapReached). ``priority`` None is the processor's own."""
    proc = processors.get(task_type)
    if proc is None:
        raise KeyError(task_type)
    new = NewTask(
        task_id=new_task_id(), member=member, type=task_type, payload=payload, dedup_digest=dedup_digest,
        priority=priority or proc.priority, max_attempts=proc.retries + 1,
    )
    return store.create(new, jobs.job_commands(new.task_id, new.priority, proc.timeout))
