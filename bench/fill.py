"""Creating many tasks (and bare RQ jobs) fast, through the product's own code, a pipeline per batch.

:class:`PipelinedStore` is taskport's ``TaskStore`` whose script calls join a pipeline instead of
running one round trip each, so ``create()`` itself (its key names, fields and script arguments) is
what writes the task: the bench cannot drift from the product's layout. Its answers are not read
back, so it assumes every create succeeds (payloads are unique: the dedup key is never held).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import redis
from rq import Queue

from app.core import processors
from app.core.answers import NewTask
from app.core.config import Config
from app.core.jobs import JobQueue
from app.core.store import TaskStore
from app.web.service import dedup_digest

TASK_TYPE = "demo.sleep"
MEMBER = "public"


def noop_payload(n: int) -> dict[str, Any]:
    """A unique no-op payload (``fail_items`` only matters when ``items`` > 0), as the API's validation
    leaves it (validated once; then only the unique number changes)."""
    global _template
    if _template is None:
        _template = processors.validate(TASK_TYPE, {"seconds": 0, "steps": 1, "fail_items": [0]})
    return {**_template, "fail_items": [n]}


_template: dict[str, Any] | None = None


class PipelinedStore(TaskStore):
    """A TaskStore whose script calls join ``self.pipe`` (sent by the caller, a batch at a time); every
    answer reads as "created" (payloads are unique: the dedup key is never held)."""

    pipe: Any = None

    def use(self, pipe: Any) -> None:
        self.pipe = pipe

    def run_script(self, name: str, keys_: list[str], args: list[Any], client: Any = None, *,
                   acknowledged: bool = False) -> Any:
        super().run_script(name, keys_, args, client=self.pipe)  # queued as EVAL on the batch's pipeline
        return [1, b"", b""]  # created: no task it runs after has ended, none it waits for (TaskStore.create)


def new_task(n: int, base: int = 0) -> NewTask:
    proc = processors.get(TASK_TYPE)
    assert proc is not None
    payload = noop_payload(base + n)
    return NewTask(task_id=str(uuid.uuid4()), member=MEMBER, type=TASK_TYPE, payload=payload,
                   dedup_digest=dedup_digest(TASK_TYPE, payload, None), priority=proc.priority,
                   max_attempts=proc.retries + 1)


def _chunks(n: int, size: int) -> Iterator[range]:
    for start in range(0, n, size):
        yield range(start, min(n, start + size))


def create_tasks(conn: redis.Redis, config: Config, n: int, *, enqueue: bool, base: int = 0,
                 batch: int = 1000) -> list[str]:
    """Create ``n`` PENDING no-op tasks (and, with ``enqueue``, their RQ jobs, as a submit would) in
    pipelined batches; returns their ids."""
    processors.load(config.processor_modules)
    store = PipelinedStore(conn, config)
    jobs = JobQueue(conn, config)
    proc = processors.get(TASK_TYPE)
    assert proc is not None
    ids: list[str] = []
    for chunk in _chunks(n, batch):
        pipe = conn.pipeline(transaction=False)
        store.use(pipe)
        for i in chunk:
            new = new_task(i, base)

            store.create(new, jobs.job_commands(new.task_id, new.priority, proc.timeout, member=new.member)
                         if enqueue else ())
            ids.append(new.task_id)
        pipe.execute()
    return ids


def enqueue_noops(conn: redis.Redis, n: int, queue: str = "default", batch: int = 1000) -> None:
    """``n`` bare RQ jobs of ``bench.noop.noop`` with RQ's defaults, ``enqueue_many`` a batch at a time."""
    q = Queue(queue, connection=conn)
    for chunk in _chunks(n, batch):
        with conn.pipeline() as pipe:
            q.enqueue_many([Queue.prepare_data("bench.noop.noop") for _ in chunk], pipeline=pipe)
            pipe.execute()
