"""Creating a task, the part that needs neither HTTP nor a worker: its record, its RQ job, one script.

Two callers: the web's submit (app.web.service.TaskService.submit) and a schedule's firing in the
scheduler process (workers.firing), which may import the core but not the web.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.core import processors, tracing
from app.core.answers import Created, NewTask
from app.core.clock import now_ms
from app.core.ids import new_task_id
from app.core.jobs import FirstJob, JobQueue
from app.core.lua import Command
from app.core.store import TaskStore


def new_task(member: str, task_type: str, payload: dict[str, Any], dedup_digest: str, priority: str | None, *,
             callback: dict[str, Any] | None = None, batch: str = "", then_of: str = "", task_id: str = "") -> NewTask:
    """A new task's record: a fresh id (``task_id`` when given: one of app.core.ids.new_task_ids), its processor's
    queue (unless ``priority``) and attempts; KeyError for a type no processor is registered for. ``callback``
    {"url", "events"}; ``batch`` / ``then_of``: see NewTask."""
    proc = processors.get(task_type)
    if proc is None:
        raise KeyError(task_type)
    task_id = task_id or new_task_id()
    # NewTask(...) itself, filled as its frozen __init__ would (which sets each of its 12 fields through
    # object.__setattr__: 3.3 µs against 0.9; tests/unit/test_submit_new_task.py holds the two equal)
    new = object.__new__(NewTask)
    new.__dict__.update(
        task_id=task_id, member=member, type=task_type, payload=payload, dedup_digest=dedup_digest,
        priority=priority or proc.priority, max_attempts=proc.retries + 1,
        callback_url=callback["url"] if callback else "", callback_events=tuple(callback["events"]) if callback else (),
        batch=batch, then_of=then_of, traceparent=tracing.submitted(task_id),
    )
    return new


def job_for(jobs: JobQueue, new: NewTask, run_at: int | None, at: str | None = None) -> list[Command]:
    """The commands that queue ``new``'s job now, or none when its ``run_at`` (ms) is ahead (app.core.deferred
    queues it then). ``at``: the job's times as RQ writes them (app.core.jobs.rq_now), one for a batch's jobs."""
    if _later(run_at):
        return []
    return jobs.job_commands(new.task_id, new.priority, _timeout(new), at=at, member=new.member)


def first_job_for(jobs: JobQueue, new: NewTask, run_at: int | None) -> FirstJob | list[Command]:
    """:func:`job_for` as the submit script takes it: its queue's template is in the script, the call sends what
    differs (app.core.jobs.JobQueue.first_job)."""
    if _later(run_at):
        return []
    return jobs.first_job(new.task_id, new.priority, _timeout(new), new.member)


def _later(run_at: int | None) -> bool:
    """Whether ``run_at`` (ms) is ahead: the job is queued then, not now (app.core.deferred)."""
    return run_at is not None and run_at > now_ms()


def _timeout(new: NewTask) -> int:
    """The job's timeout: its processor's (the default one if this process has none of that type)."""
    proc = processors.get(new.type)
    return proc.timeout if proc else processors.DEFAULT_TIMEOUT


def create_task(store: TaskStore, jobs: JobQueue, member: str, task_type: str, payload: dict[str, Any],
                dedup_digest: str, priority: str | None, *, run_at: int | None = None,
                after: Sequence[str] = (), callback: dict[str, Any] | None = None) -> Created:
    """Create a task of ``task_type`` (registered: KeyError otherwise) with its validated ``payload`` and queue
    its job, unless the member's ``dedup_digest`` is held (see :meth:`TaskStore.create`, which also raises
    ActiveCapReached). ``priority`` None is the processor's own. A ``run_at`` (ms) ahead and/or ``after`` (ids
    the caller checked are the member's, each once) make it wait: its job is replayed by the submit only when
    it may run now (app.core.deferred queues it later). ``callback``: {"url", "events"}, loaded and checked."""
    new = new_task(member, task_type, payload, dedup_digest, priority, callback=callback)
    return store.create(new, first_job_for(jobs, new, run_at), run_at=run_at, after=after)
