"""Task.from_hash, written out flat for the status read's sake, reads every hash as the plain field-by-field
reading does (the reference below is the one it replaced), and the record stays frozen."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import pickle
from typing import Any

import pytest

from app.core.clock import iso
from app.core.keys import TaskField
from app.core.states import DEFAULT_QUEUE, TaskStatus
from app.core.task import DEFAULT_MAX_ATTEMPTS, Task


def _text(value: bytes | None) -> str | None:
    return (value.decode() or None) if value is not None else None


def _int(value: bytes | None, default: int | None = 0) -> int | None:
    return int(value) if value else default


def reference(h: dict[bytes, bytes], task_id: str) -> Task:
    def g(field: TaskField, default: Any = None) -> Any:
        return h.get(field.value.encode(), default)

    total = g(TaskField.ITEMS_TOTAL)
    items = {"total": int(total), "succeeded": int(g(TaskField.ITEMS_SUCCEEDED) or 0),
             "failed": int(g(TaskField.ITEMS_FAILED) or 0)} if total else None
    first = g(TaskField.BATCH).decode().split(",", 1)[0] if g(TaskField.BATCH) else None
    callback = {"state": _text(g(TaskField.CALLBACK_STATE)) or "pending",
                "attempts": int(g(TaskField.CALLBACK_ATTEMPTS) or 0),
                "last_status": _int(g(TaskField.CALLBACK_LAST_STATUS), None)} if g(TaskField.CALLBACK_URL) else None
    return Task(
        id=task_id, type=g(TaskField.TYPE).decode(), member=g(TaskField.MEMBER).decode(),
        status=g(TaskField.STATUS).decode(), progress=int(g(TaskField.PROGRESS) or 0),
        message=_text(g(TaskField.MESSAGE)), items=items, error_code=_int(g(TaskField.ERROR_CODE), None),
        error_message=_text(g(TaskField.ERROR_MESSAGE)), attempts=int(g(TaskField.ATTEMPTS) or 0),
        max_attempts=int(g(TaskField.MAX_ATTEMPTS) or DEFAULT_MAX_ATTEMPTS), resumed=int(g(TaskField.RESUMED) or 0),
        priority=_text(g(TaskField.PRIORITY)) or DEFAULT_QUEUE, created_at=int(g(TaskField.CREATED_AT)),
        started_at=_int(g(TaskField.STARTED_AT), None), updated_at=int(g(TaskField.UPDATED_AT)),
        completed_at=_int(g(TaskField.COMPLETED_AT), None), expires_at=int(g(TaskField.EXPIRES_AT)),
        run_id=_text(g(TaskField.RUN_ID)), seq=int(g(TaskField.SEQ) or 0),
        checkpoints=int(g(TaskField.CHECKPOINTS) or 0), resume_mark=int(g(TaskField.RESUME_MARK) or 0),
        lost_runs=int(g(TaskField.LOST_RUNS) or 0), checkpoint_run=_text(g(TaskField.CHECKPOINT_RUN)),
        run_at=_int(g(TaskField.RUN_AT), None),
        waiting_for=tuple(g(TaskField.WAITING_FOR).decode().split(",")) if g(TaskField.WAITING_FOR) else (),
        payload_sha256=_text(g(TaskField.PAYLOAD_SHA256)), batch_id=first or _text(g(TaskField.THEN_OF)),
        batches=tuple(g(TaskField.BATCH).decode().split(",")) if g(TaskField.BATCH) else (),
        then_of=_text(g(TaskField.THEN_OF)), callback=callback, output_last=int(g(TaskField.OUTPUT_LAST) or 0),
        limited=_text(g(TaskField.LIMITED)),
    )


BASE = {b"type": b"demo.noop", b"member": b"alice", b"status": b"PENDING", b"created_at": b"1796000000120",
        b"updated_at": b"1796000000130", b"expires_at": b"1796086400120"}
# Each optional field: absent, empty, and one or two values (a comma list where it is one).
OPTIONAL: dict[TaskField, tuple[bytes, ...]] = {
    TaskField.PROGRESS: (b"", b"40"), TaskField.MESSAGE: (b"", b"half way"), TaskField.ITEMS_TOTAL: (b"", b"9"),
    TaskField.ITEMS_SUCCEEDED: (b"3",), TaskField.ITEMS_FAILED: (b"1",), TaskField.ERROR_CODE: (b"", b"-4"),
    TaskField.ERROR_MESSAGE: (b"", b"boom"), TaskField.ATTEMPTS: (b"2",), TaskField.MAX_ATTEMPTS: (b"", b"3"),
    TaskField.RESUMED: (b"1",), TaskField.PRIORITY: (b"", b"high"), TaskField.STARTED_AT: (b"", b"1796000000200"),
    TaskField.COMPLETED_AT: (b"", b"1796000000300"), TaskField.RUN_ID: (b"", b"r1"), TaskField.SEQ: (b"7",),
    TaskField.CHECKPOINTS: (b"2",), TaskField.RESUME_MARK: (b"1",), TaskField.LOST_RUNS: (b"1",),
    TaskField.CHECKPOINT_RUN: (b"", b"r0"), TaskField.RUN_AT: (b"", b"1796000009000"),
    TaskField.WAITING_FOR: (b"", b"a", b"a,b"), TaskField.PAYLOAD_SHA256: (b"", b"ab" * 32),
    TaskField.BATCH: (b"", b"b1", b"b1,b2", b",b2"), TaskField.THEN_OF: (b"", b"b9"),
    TaskField.CALLBACK_URL: (b"", b"https://example.com/hook"), TaskField.CALLBACK_STATE: (b"", b"failed"),
    TaskField.CALLBACK_ATTEMPTS: (b"2",), TaskField.CALLBACK_LAST_STATUS: (b"", b"500"),
    TaskField.OUTPUT_LAST: (b"5",), TaskField.LIMITED: (b"", b"concurrency: demo.noop k v 1/1"),
}


def hashes() -> list[dict[bytes, bytes]]:
    out = [dict(BASE)]
    fields = list(OPTIONAL)
    for field in fields:  # each optional field alone, at each of its values
        out += [{**BASE, field.value.encode(): value} for value in OPTIONAL[field]]
    for n in range(len(OPTIONAL[fields[0]]) + 3):  # and all of them at once, cycling through their values
        out.append({**BASE, **{f.value.encode(): vs[n % len(vs)] for f, vs in OPTIONAL.items()}})
    for a, b in itertools.combinations((TaskField.BATCH, TaskField.THEN_OF, TaskField.PRIORITY), 2):
        for va, vb in itertools.product(OPTIONAL[a], OPTIONAL[b]):
            out.append({**BASE, a.value.encode(): va, b.value.encode(): vb})
    return out


@pytest.mark.parametrize("h", hashes())
def test_from_hash_reads_as_the_plain_reading(h: dict[bytes, bytes]) -> None:
    got, want = Task.from_hash(h, "t1"), reference(h, "t1")
    assert {f.name: getattr(got, f.name) for f in dataclasses.fields(Task)} == dataclasses.asdict(want)
    assert got == want


def test_the_record_stays_frozen() -> None:
    task = Task.from_hash(dict(BASE), "t1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.status = "COMPLETED"  # type: ignore[misc]
    assert hash(task) == hash(reference(dict(BASE), "t1"))


@pytest.mark.parametrize("h", hashes()[:: 7])
def test_the_direct_fill_makes_what_the_dataclasss_init_makes(h: dict[bytes, bytes]) -> None:
    """Task.from_hash and Task.created make their Task through task._make (an unfrozen twin's stores, then its
    class set to Task), not Task(...): the same record, every field, frozen, hashable, copyable as the init's."""
    got = Task.from_hash(h, "t1")
    values = [getattr(got, f.name) for f in dataclasses.fields(Task)]
    built = Task(*values)
    assert type(got) is Task and got == built and hash(got) == hash(built)
    assert [getattr(got, f.name) for f in dataclasses.fields(Task)] == [getattr(built, f.name) for f in
                                                                        dataclasses.fields(Task)]
    assert dataclasses.replace(got) == built and copy.copy(got) == built and pickle.loads(pickle.dumps(got)) == built
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.progress = 9  # type: ignore[misc]
    assert not hasattr(got, "__dict__")  # the slots' layout, nothing added
    assert not hasattr(Task, "__post_init__")  # its __init__ does nothing but set the fields


def test_created_is_the_task_its_init_makes() -> None:
    made = Task.created("t1", "demo.noop", "public", "", 3, 1796000000000, 1796086400000, None, "ab" * 32,
                        waiting_for="a,b", batch="b1,b2", callback=True)
    assert made == Task(*[getattr(made, f.name) for f in dataclasses.fields(Task)])
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.status = "COMPLETED"  # type: ignore[misc]


@pytest.mark.parametrize("h", hashes())
@pytest.mark.parametrize("now", [1796000000000, 1796000000000 + 10**12])
def test_the_document_reads_each_time_as_iso_does(h: dict[bytes, bytes], now: int) -> None:
    """to_doc reuses created_at's text for an unchanged updated_at and reads TaskStatus's members once: the same
    document as each field rendered on its own."""
    task = Task.from_hash(h, "t1")
    doc = task.to_doc(now)
    assert doc["created_at"] == iso(task.created_at) and doc["updated_at"] == iso(task.updated_at)
    assert doc["expires_at"] == iso(task.expires_at) and doc["status"] == task.effective_status(now)
    expired = now >= task.expires_at and task.status != TaskStatus.EXPIRED
    assert doc["status"] == (TaskStatus.EXPIRED if expired else task.status)
    assert doc["waiting_for"] == ([*task.waiting_for, *([task.limited] if task.limited else [])]
                                  if task.status == TaskStatus.PENDING and (task.waiting_for or task.limited) else None)


def test_a_new_tasks_document_has_its_creation_time_as_its_update() -> None:
    h = {**BASE, TaskField.UPDATED_AT.value.encode(): BASE[TaskField.CREATED_AT.value.encode()]}
    doc = Task.from_hash(h, "t1").to_doc(0)
    assert doc["updated_at"] == doc["created_at"] == iso(int(h[TaskField.CREATED_AT.value.encode()]))
