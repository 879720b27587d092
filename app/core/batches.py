"""Batches: many tasks submitted as one, with one status, a ``then`` task and a callback when all are done.

A batch is a record (``keys.batch``) and the list of its task ids (``keys.batch_tasks``); its tasks are ordinary
tasks whose ``batch`` field names it. The record's counters are kept by the scripts that change a task
(app.core.batchscripts), so reading a batch is one HGETALL whatever its size. Writes: the batch create
script (:meth:`BatchStore.create`); cancelling a batch is cancelling its unfinished tasks one by one
(app.web.batch_service), each a transition like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis

from app.core import keys, lua
from app.core.answers import ActiveCapReached, NewTask, StoredBytesReached
from app.core.batchscripts import BATCH
from app.core.clock import iso, iso_or_none, now_ms
from app.core.history import Page, decode_cursor, encode_cursor
from app.core.jobs import TEMPLATES, FirstJob
from app.core.keys import BatchField as B
from app.core.lua import Command
from app.core.states import ACTIVE, STORED, BatchStatus, CallbackState, TaskStatus
from app.core.store import TaskStore
from app.core.urls import batch_document

MAX_TASKS = 1000  # tasks one batch may hold
DONE, RUNNING = BatchStatus.DONE.value, BatchStatus.RUNNING.value  # a batch's status: no unfinished task, or some
COUNTED = tuple(s.value for s in TaskStatus if s in STORED)  # the statuses a batch counts its tasks in, in order
_RAW = {f: f.value.encode() for f in B}


def count_field(status: str) -> B:
    """The field of a batch's record counting its tasks in ``status`` (the Lua lowercases the same way)."""
    return B(status.lower())


class BatchTask(NamedTuple):
    """One task to create in a batch: its record, the commands that queue its job (none when it waits) or its
    first job as a submit sends it (:func:`app.core.submit.first_job_for`: the web's batches), and what it waits
    for. A tuple: a frozen dataclass's four ``object.__setattr__`` cost ~1 µs a task of a batch."""

    new: NewTask
    job: Sequence[Command] | FirstJob = ()
    run_at: int | None = None
    after: Sequence[str] = ()


class Entry(NamedTuple):
    """What the batch create did with one of its tasks: created, or ``duplicate`` (an existing task holding
    its dedup key, counted in the batch at ``status``)."""

    task_id: str
    status: str
    duplicate: bool


@dataclass(frozen=True)
class Batch:
    """A batch as read from its record."""

    id: str
    member: str
    size: int
    counts: dict[str, int]
    progress_sum: int
    items: dict[str, int]
    then_task_id: str | None
    created_at: int
    completed_at: int | None
    expires_at: int
    seq: int
    callback: dict[str, Any] | None = field(default=None)

    @classmethod
    def from_hash(cls, h: dict[bytes, bytes], batch_id: str) -> Batch:
        def num(f: B) -> int:
            return int(h.get(_RAW[f]) or 0)

        def text(f: B) -> str | None:
            value = h.get(_RAW[f])
            return value.decode() if value else None

        callback = None
        if h.get(_RAW[B.CALLBACK_URL]):
            callback = {"state": text(B.CALLBACK_STATE) or CallbackState.PENDING.value,
                        "attempts": num(B.CALLBACK_ATTEMPTS),
                        "last_status": int(h[_RAW[B.CALLBACK_LAST_STATUS]]) if h.get(_RAW[B.CALLBACK_LAST_STATUS])
                        else None}
        return cls(
            id=batch_id, member=h[_RAW[B.MEMBER]].decode(), size=num(B.SIZE),
            counts={s: int(h.get(_RAW[count_field(s)]) or 0) for s in COUNTED},
            progress_sum=num(B.PROGRESS_SUM),
            items={"total": num(B.ITEMS_TOTAL), "succeeded": num(B.ITEMS_SUCCEEDED), "failed": num(B.ITEMS_FAILED)},
            then_task_id=text(B.THEN_TASK_ID), created_at=num(B.CREATED_AT),
            completed_at=int(h[_RAW[B.COMPLETED_AT]]) if h.get(_RAW[B.COMPLETED_AT]) else None,
            expires_at=num(B.EXPIRES_AT), seq=num(B.SEQ), callback=callback,
        )  # fmt: skip

    @property
    def status(self) -> str:
        return RUNNING if any(self.counts[s] for s in ACTIVE) else DONE

    @property
    def progress(self) -> int:
        """0-100: the mean of its tasks' progress, an ended task counting 100."""
        return min(100, self.progress_sum // self.size) if self.size else 100

    def to_doc(self, now: int) -> dict[str, Any]:
        """The contract's batch document, but for its links (app.core.urls.batch_document adds them)."""
        return {
            "batch_id": self.id, "size": self.size, "status": self.status, "counts": dict(self.counts),
            "progress": self.progress, "items": dict(self.items), "then_task_id": self.then_task_id,
            "created_at": iso(self.created_at), "completed_at": iso_or_none(self.completed_at),
            "expires_at": iso(self.expires_at), "callback": self.callback,
        }  # fmt: skip


class BatchCreated(NamedTuple):
    batch: Batch
    entries: list[Entry]


HEAD = 6  # a block's head: key_ttl_s, expiry_ms, run_at_ms, after_ids, n_deps, n_jobs (see batchscripts.BATCH)


class _Template:
    """One shape of block of a batch create (its head, its job's commands and hash fields), sent once: each block
    goes as its differences from it, (position from 1, value) pairs in the order of their positions (the script
    reads the head's first). A value differs when it is unequal or of another type (1 and 1.0 are equal, not
    written alike). The tasks of a batch differ at the same few positions (ids, digests), so the last block's
    positions are tried first: the block with the template's values put back there equal to the template (one C
    comparison of the lists and of their types) differs at those alone; otherwise every value is compared.

    A template of a first job (:class:`~app.core.jobs.FirstJob`, :meth:`_first`) holds its queue's job commands
    as RQ's enqueue would write them for the template's task, and says where they hold the task id (``slots``:
    position, the text before it, the text after it) and RQ's job data (``data_at``): the script puts each
    block's id and data there (:data:`~app.core.batchscripts.BATCH`), so a block's differences are those of its
    head and hash fields only (``own``: the job's values are left out, ``gap`` of them after the head)."""

    def __init__(self, number: int, own: list[Any], job_argc: int, job_args: Sequence[Any] = (),
                 slots: Sequence[Any] = (), data_at: int = 0, consts: Sequence[str] = (),
                 plan: Sequence[int] = (), own_keys: Sequence[int] = ()) -> None:
        """``own``: the values a block sends its differences of; ``job_argc``: how many of the block's values are
        its job's (in ``own`` after the head, or ``job_args`` when they are not). A first job's keys: ``consts``,
        those of every block (sent once), ``plan`` one entry a job command, n > 0 the n-th of ``consts``, n <= 0
        the block's own job key -n (from 0), and ``own_keys`` where each of those is in the block's job keys."""
        self.number, self.values, self.types = number, own, list(map(type, own))
        self.gap, self.consts, self.own_keys = len(job_args), list(consts), list(own_keys)
        self.args = [job_argc, len(own) + self.gap - HEAD - job_argc, len(slots) // 3, data_at, len(consts),
                     len(plan), *slots, *plan, *own[:HEAD], *job_args, *own[HEAD:]]
        self.last: list[int] = []  # 0-based in ``own``
        self.where: list[int] = []  # their positions in the block's values, from 1

    def diffs(self, values: list[Any]) -> list[Any]:
        base, probe = self.values, values.copy()
        for at in self.last:
            probe[at] = base[at]
        if probe != base or list(map(type, probe)) != self.types:
            self.last = [at for at, (value, was) in enumerate(zip(values, base, strict=True))
                         if value != was or type(value) is not type(was)]
            self.where = [at + 1 + (self.gap if at >= HEAD else 0) for at in self.last]
        return [x for at, where in zip(self.last, self.where, strict=True) for x in (where, values[at])]


def _first(number: int, own: list[Any], task_id: str, member: str, job: FirstJob, at: str) -> _Template:
    """The template of a first job's blocks from its first: its queue's commands (RQ's enqueue recorded once,
    :data:`~app.core.jobs.TEMPLATES`), filled for ``task_id``, with the places of the id and of RQ's data found
    (each text holds the id once, nothing else holds it: RuntimeError otherwise, as the job template refuses)."""
    job_keys, job_args = lua.replay(TEMPLATES[job.queue].fill(task_id, job.timeout, member, int(job.weight), at))
    if job_keys != list(job.keys):
        raise RuntimeError(f"the first job's keys are not its template's: {job.keys} != {job_keys}")
    slots: list[Any] = []
    data_at = 0
    for at_, value in enumerate(job_args, HEAD + 1):
        if isinstance(value, bytes) and value == job.data and not data_at:
            data_at = at_
        elif isinstance(value, str) and task_id in value:
            before, _, after = value.partition(task_id)
            if task_id in after:
                raise RuntimeError(f"a job's text holds its task id twice: {value!r}")
            slots += [at_, before, after]
        elif task_id.encode() in (value if isinstance(value, bytes) else str(value).encode()):
            raise RuntimeError(f"a job's value holds its task id where the batch create does not put it: {value!r}")
    if not data_at:
        raise RuntimeError("RQ's job data is not among the first job's values")
    return _Template(number, own, len(job_args), job_args, slots, data_at, *_key_plan(task_id, job.keys))


def _key_plan(task_id: str, job_keys: Sequence[str]) -> tuple[list[str], list[int], list[int]]:
    """A first job's keys as its template sends them (see :class:`_Template`): the constant ones, the plan, and
    where each key holding the task id is first in ``job_keys``."""
    consts: list[str] = []
    plan: list[int] = []
    own_keys: list[int] = []
    for at, key in enumerate(job_keys):
        if task_id in key:
            first = job_keys.index(key)
            if first == at:
                own_keys.append(at)
            plan.append(-own_keys.index(first))
        else:
            consts.append(key)
            plan.append(len(consts))
    return consts, plan, own_keys


class BatchStore:
    """Every read and write of a batch's own keys, over a task store (whose connection and config it shares)."""

    def __init__(self, store: TaskStore) -> None:
        self.store = store
        self.redis: Any = store.redis

    def create(self, batch_id: str, member: str, tasks: Sequence[BatchTask], then: BatchTask | None = None,
               callback_url: str = "") -> BatchCreated:
        """Create the batch, its tasks and their jobs in one script (nothing at all on a refusal): raises
        ActiveCapReached when the member's unfinished tasks plus the new ones would pass its cap. Each task's
        ``new.batch`` (and the then task's ``new.then_of``) must name ``batch_id``. The jobs given as a
        :class:`~app.core.jobs.FirstJob` share one RQ time (the first one's)."""
        c = self.store.config
        created = now_ms()
        command_keys: list[str] = []
        block_args: list[Any] = []
        templates: dict[tuple[Any, ...], _Template] = {}  # the shape of a block -> its template
        longest, at = 0, ""
        for bt in (*tasks, *((then,) if then else ())):
            start, fields, body = self.store.task_fields(bt.new, created, bt.run_at)
            key_ttl = c.task_ttl + c.tombstone_ttl + (start - created) // 1000
            longest = max(longest, key_ttl)
            task_id, job = bt.new.task_id, bt.job
            head = [key_ttl, start + c.task_ttl * 1000, start if start > created else "", ",".join(bt.after),
                    len(bt.after)]
            if isinstance(job, FirstJob):
                data, own = job.data, [*head, len(job.keys), *fields]
                shape: tuple[Any, ...] = (job.queue, job.timeout, job.weight, bt.new.member, len(fields))
                template = templates.get(shape)
                if template is None:
                    at = at or job.at
                    template = templates[shape] = _first(len(templates) + 1, own, task_id, bt.new.member, job, at)
                job_keys = [job.keys[i] for i in template.own_keys]
            else:
                job_keys, job_args = lua.replay(job)
                data, own = b"", [*head, len(job_keys), *job_args, *fields]
                shape = (len(job_args), len(fields))
                template = templates.get(shape)
                if template is None:
                    template = templates[shape] = _Template(len(templates) + 1, own, len(job_args))
            diffs = template.diffs(own)
            command_keys += [keys.dedup(member, bt.new.dedup_digest), keys.task(task_id), keys.payload(task_id),
                             *(key for dep in bt.after for key in (keys.task(dep), keys.dependents(dep))), *job_keys]
            block_args += [task_id, body, template.number, data, len(diffs) // 2, *diffs]
        template_args = [x for template in templates.values() for x in template.args]
        command_keys = [key for template in templates.values() for key in template.consts] + command_keys
        answer = self.store.run_script(BATCH.name, *BATCH.call(
            keys={"history": keys.history(member), "expiry": keys.EXPIRY, "members": keys.MEMBERS, "stats": keys.STATS,
                  "active": keys.ACTIVE, "delayed": keys.DELAYED, "settled": keys.SETTLED,
                  "stored_bytes": keys.STORED_BYTES, "batch": keys.batch(batch_id),
                  "batch_tasks": keys.batch_tasks(batch_id), "callbacks_due": keys.CALLBACKS_DUE,
                  "waiting_tasks": keys.WAITING},
            args={"batch_id": batch_id, "dedup_window_s": c.dedup_window, "created_ms": created, "member": member,
                  "cap": c.active_task_cap, "bytes_cap": c.stored_bytes_cap,
                  "template_count": len(templates), "block_count": len(tasks) + (1 if then else 0),
                  "has_then": "1" if then else "",
                  "key_ttl_s": longest, "callback_url": callback_url},
            rest_keys=command_keys, rest=template_args + block_args, record_ms=c.call_record_ms,
        ), acknowledged=True)  # fmt: skip
        return self._created(batch_id, tasks, answer)

    def _created(self, batch_id: str, tasks: Sequence[BatchTask], answer: Any) -> BatchCreated:
        """The batch create's answer read: its entries and the batch as written (ActiveCapReached,
        StoredBytesReached at a refusal)."""
        c = self.store.config
        if answer[0] == 2:
            raise ActiveCapReached(c.active_task_cap, int(answer[1]))
        if answer[0] == 3:
            raise StoredBytesReached(c.stored_bytes_cap, int(answer[1]))
        entries, failed = [], False
        for bt, outcome in zip(tasks, answer[1:1 + len(tasks)], strict=True):  # "", an ended id, a holder and status
            held, _, status = outcome.decode().partition(" ")
            if status:  # a duplicate: its holder and the holder's status
                entries.append(Entry(held, status, True))
                continue
            if held:  # a task it runs after ended otherwise already: FAILED -6 now, as a submit does
                failed = self.store.fail_waiting(bt.new.task_id, held) or failed
            entries.append(Entry(bt.new.task_id, TaskStatus.PENDING, False))
        # the batch as the script wrote it, in the same state as its tasks' entries (a worker may have started one
        # since), unless a task was failed -6 just now
        flat = answer[-1]
        written = Batch.from_hash(dict(zip(flat[::2], flat[1::2], strict=True)), batch_id)
        found = self.get(batch_id) if failed else written
        assert found is not None  # just written, in the same script as its tasks
        return BatchCreated(found, entries)

    def get(self, batch_id: str) -> Batch | None:
        h = self.redis.hgetall(keys.batch(batch_id))
        return Batch.from_hash(h, batch_id) if h else None

    def seq(self, batch_id: str) -> int | None:
        """The batch's event sequence number (bumped by every change), None once it is gone: one HGET."""
        seq = self.redis.hget(keys.batch(batch_id), B.SEQ)
        return int(seq) if seq is not None else None

    def task_ids(self, batch_id: str) -> list[str]:
        """Every task id of the batch, in submit order."""
        return [i.decode() for i in self.redis.lrange(keys.batch_tasks(batch_id), 0, -1)]

    def page(self, batch_id: str, *, limit: int, cursor: str | None, status: str | None, now: int) -> Page:
        """A page of the batch's tasks in submit order, those in ``status`` only when given (their status as a
        reader sees it at ``now``). A filtered page examines at most ``MAX_TASKS`` entries, so it may hold fewer
        than ``limit`` tasks with a ``next_cursor`` to go on from; the last page's is None."""
        offset = decode_cursor(cursor)[0] if cursor else 0
        window = MAX_TASKS if status else limit
        ids = [i.decode() for i in self.redis.lrange(keys.batch_tasks(batch_id), offset, offset + window)]
        more, ids = len(ids) > window, ids[:window]
        found = []
        for index, task in enumerate(self.store.get_many(ids)):
            if task is not None and (status is None or task.effective_status(now) == status):
                found.append(task)
                if len(found) == limit:
                    more = more or index + 1 < len(ids)
                    window = index + 1
                    break
        return Page(found, encode_cursor((offset + min(window, len(ids)), 0)) if more else None)


def read_document(conn: redis.Redis, batch_id: str, now: int) -> dict[str, Any] | None:
    """The batch document of ``batch_id`` as seen at ``now`` (ms), None once it is gone: for a callback's body."""
    h: Any = conn.hgetall(keys.batch(batch_id))
    return batch_document(Batch.from_hash(h, batch_id), now) if h else None
