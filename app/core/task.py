"""The task record as stored (a flat Redis hash, fields :class:`app.core.keys.TaskField`) and its rendering
as the contract's status document (the web adds the links: :func:`app.core.urls.status_document`).

Rendering is a plain function on the hot path of every status read: no schema library, no extra I/O.
Times are stored as integer milliseconds (see :mod:`app.core.clock`) and rendered as ISO 8601 only here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Any, cast

from app.core.clock import iso, iso_or_none
from app.core.keys import TaskField
from app.core.states import ACTIVE, DEFAULT_QUEUE, ERROR_MESSAGES, CallbackState, ErrorCode, TaskStatus

# A new task's fields at these values are not written (store.TaskStore.task_fields): most tasks have them,
# and a finished task's hash is the bulk of what it holds in Redis (bench/README.md, "Memory per finished task").
DEFAULT_MAX_ATTEMPTS = 1
UNWRITTEN_DEFAULTS: dict[str, object] = {TaskField.MAX_ATTEMPTS: DEFAULT_MAX_ATTEMPTS,
                                         TaskField.PRIORITY: DEFAULT_QUEUE}

# Each field's name as the hash's bytes (replies are not decoded), read by Task.from_hash: _RAW.STATUS is
# b"status". Plain bytes attributes, since looking an enum member up in a dict costs a Python-level hash.
_RAW = SimpleNamespace(**{field.name: field.value.encode() for field in TaskField})


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    text = value.decode()
    return text or None


def _int(value: bytes | None, default: int | None = 0) -> int | None:
    return int(value) if value else default


def _callback(h: dict[bytes, bytes]) -> dict[str, Any]:
    """The status document's ``callback``: its latest delivery's state (pending until the first event)."""
    return {"state": _text(h.get(_RAW.CALLBACK_STATE)) or CallbackState.PENDING.value,
            "attempts": int(h.get(_RAW.CALLBACK_ATTEMPTS) or 0),
            "last_status": _int(h.get(_RAW.CALLBACK_LAST_STATUS), None)}


@dataclass(frozen=True, slots=True)
class Task:
    """One task as read from its hash (written by :class:`app.core.store.TaskStore` and the Lua scripts)."""

    id: str
    type: str
    member: str
    status: str
    progress: int
    message: str | None
    items: dict[str, int] | None
    error_code: int | None
    error_message: str | None
    attempts: int
    max_attempts: int
    resumed: int  # runs that continued from a checkpoint
    priority: str
    created_at: int  # ms since the epoch, like every time here
    started_at: int | None
    updated_at: int
    completed_at: int | None
    expires_at: int
    run_id: str | None
    seq: int
    checkpoints: int = 0  # checkpoint writes so far (see TaskStore.recover)
    resume_mark: int = 0
    lost_runs: int = 0  # runs lost (their worker died or stalled) since the checkpoint last advanced
    checkpoint_run: str | None = None  # the run whose result folder the checkpoint's files are in
    run_at: int | None = None  # the time the submit asked it to run at (run_at/delay), ms
    waiting_for: tuple[str, ...] = ()  # the tasks it runs after (``after``) that are not COMPLETED yet
    payload_sha256: str | None = None  # of its payload's JSON (the audit trail's; a reused Idempotency-Key's check)
    batch_id: str | None = None  # the batch it was submitted in, or whose then task it is
    batches: tuple[str, ...] = ()  # every batch it counts in (a batch's dedup may name a task of another)
    then_of: str | None = None  # the batch whose then task it is
    callback: dict[str, Any] | None = None  # its latest callback delivery: state, attempts, last_status
    output_last: int = 0  # the id of its last output line (0: none yet): what an event stream follows
    limited: str | None = None  # why it waits in a concurrency limit's line (app.core.limits), while it does

    @classmethod
    def from_hash(cls, h: dict[bytes, bytes], task_id: str) -> Task:
        """The task stored in hash ``h`` under ``task_id`` (the id is the key's, not a field).

        On the hot path of every status read, so written out flat: each optional field decoded inline (most
        are absent), and the instance made by :data:`_make` rather than the frozen
        dataclass's ``__init__`` (one ``object.__setattr__`` per field), which halves its cost (bench/README.md,
        "Submit and status at the floor"). The values are those the helpers above give (tests/unit/test_task.py)."""
        g = h.get
        r = _RAW
        total = g(r.ITEMS_TOTAL)
        items = None
        if total:
            items = {
                "total": int(total),
                "succeeded": int(g(r.ITEMS_SUCCEEDED) or 0),
                "failed": int(g(r.ITEMS_FAILED) or 0),
            }
        v = g(r.MESSAGE)
        message = v.decode() or None if v else None
        v = g(r.ERROR_CODE)
        error_code = int(v) if v else None
        v = g(r.ERROR_MESSAGE)
        error_message = v.decode() or None if v else None
        v = g(r.PRIORITY)
        priority = (v.decode() or DEFAULT_QUEUE) if v else DEFAULT_QUEUE
        v = g(r.STARTED_AT)
        started_at = int(v) if v else None
        v = g(r.COMPLETED_AT)
        completed_at = int(v) if v else None
        v = g(r.RUN_ID)
        run_id = v.decode() or None if v else None
        v = g(r.CHECKPOINT_RUN)
        checkpoint_run = v.decode() or None if v else None
        v = g(r.RUN_AT)
        run_at = int(v) if v else None
        v = g(r.WAITING_FOR)
        waiting_for = tuple(v.decode().split(",")) if v else ()
        v = g(r.PAYLOAD_SHA256)
        payload_sha256 = v.decode() or None if v else None
        v = g(r.THEN_OF)
        then_of = v.decode() or None if v else None
        v = g(r.BATCH)
        batches = tuple(v.decode().split(",")) if v else ()
        batch_id = (batches[0] or then_of) if v else then_of
        v = g(r.LIMITED)
        limited = v.decode() or None if v else None
        return _make(
            task_id, h[r.TYPE].decode(), h[r.MEMBER].decode(), h[r.STATUS].decode(), int(g(r.PROGRESS) or 0),
            message, items, error_code, error_message, int(g(r.ATTEMPTS) or 0),
            int(g(r.MAX_ATTEMPTS) or DEFAULT_MAX_ATTEMPTS), int(g(r.RESUMED) or 0), priority, int(h[r.CREATED_AT]),
            started_at, int(h[r.UPDATED_AT]), completed_at, int(h[r.EXPIRES_AT]), run_id, int(g(r.SEQ) or 0),
            int(g(r.CHECKPOINTS) or 0), int(g(r.RESUME_MARK) or 0), int(g(r.LOST_RUNS) or 0), checkpoint_run, run_at,
            waiting_for, payload_sha256, batch_id, batches, then_of,
            _callback(h) if g(r.CALLBACK_URL) else None, int(g(r.OUTPUT_LAST) or 0), limited,
        )

    @classmethod
    def created(cls, task_id: str, task_type: str, member: str, priority: str, max_attempts: int, created_at: int,
                expires_at: int, run_at: int | None, payload_sha256: str, *, waiting_for: str = "", batch: str = "",
                then_of: str = "", callback: bool = False) -> Task:
        """The task a submit has just written (app.core.store.TaskStore.create), from the values it wrote, without
        turning them into the hash's bytes and back through :meth:`from_hash` (~5 µs of a submit: bench/README.md,
        "Submit, sixth pass"); equal to ``from_hash`` of that hash (tests/unit/test_task.py). ``waiting_for``,
        ``batch``: comma lists as in the hash; ``callback``: it has a callback URL."""
        batches = tuple(batch.split(",")) if batch else ()
        return _make(
            task_id, task_type, member, _PENDING_TEXT, 0, None, None, None, None, 0, max_attempts, 0,
            priority or DEFAULT_QUEUE, created_at, None, created_at, None, expires_at, None, 0, 0, 0, 0, None, run_at,
            tuple(waiting_for.split(",")) if waiting_for else (), payload_sha256 or None,
            (batches[0] or then_of or None) if batch else then_of or None, batches, then_of or None,
            _NO_CALLBACK.copy() if callback else None, 0, None,
        )

    @property
    def resumable(self) -> bool:
        """Whether a lost run of the task may resume without using an attempt: its checkpoint advanced since
        the last such resumption (see TaskStore.recover)."""
        return self.checkpoints > self.resume_mark

    def due_in(self, now: int) -> float:
        """Seconds until the task's run_at (0 when it has none or it is due): a poller's wait."""
        return max(0.0, (self.run_at - now) / 1000) if self.run_at is not None else 0.0

    def waits(self, now: int) -> bool:
        """Whether the task is PENDING unqueued: its run_at is ahead, or tasks it runs after are unfinished."""
        return self.status == _PENDING and (bool(self.waiting_for) or self.due_in(now) > 0
                                                      or bool(self.limited))

    def effective_status(self, now: int) -> str:
        """The status a reader sees at ``now`` (ms): EXPIRED once ``expires_at`` has passed, before
        housekeeping runs."""
        if now >= self.expires_at and self.status != _EXPIRED:
            return _EXPIRED
        return self.status

    def error(self, now: int) -> dict[str, Any] | None:
        if self.status in ACTIVE and now >= self.expires_at:
            return {"code": ErrorCode.EXPIRED, "message": ERROR_MESSAGES[ErrorCode.EXPIRED]}
        if self.error_code is None:
            return None
        return {"code": self.error_code, "message": self.error_message or ""}

    def _waiting_doc(self) -> list[str] | None:
        """The document's ``waiting_for`` of a PENDING task: the ids of the tasks it runs after, then why it waits
        for a concurrency slot (``"concurrency: <type> <key> <value> <held>/<N>"``); None when it waits for
        nothing."""
        if self.status != _PENDING or not (self.waiting_for or self.limited):
            return None
        return [*self.waiting_for, *((self.limited,) if self.limited else ())]

    def to_doc(self, now: int) -> dict[str, Any]:
        """The contract's status document as seen at ``now`` (ms), but for its ``links``, which the web adds
        (:func:`app.core.urls.status_document`): the record knows no HTTP path."""
        created_at = iso(self.created_at)
        return {
            "task_id": self.id,
            "type": self.type,
            "status": self.effective_status(now),
            "progress": self.progress,
            "message": self.message,
            "items": self.items,
            "error": self.error(now),
            "attempts": self.attempts,
            "resumed": self.resumed,
            "created_at": created_at,
            "started_at": iso_or_none(self.started_at),
            "updated_at": created_at if self.updated_at == self.created_at else iso(self.updated_at),  # a new task's
            "completed_at": iso_or_none(self.completed_at),
            "expires_at": iso(self.expires_at),
            "run_at": iso_or_none(self.run_at),
            "waiting_for": self._waiting_doc(),
            "batch_id": self.batch_id,
            "callback": self.callback,
        }


def _maker() -> Callable[..., Task]:
    """``_make(*values)``: a Task of its fields' values, positional in the order of its fields, made without the
    frozen ``__init__``'s ``object.__setattr__`` per field (2.0 µs) or a setter call per slot (1.6): the values are
    stored into an unfrozen twin with the same slots, in the same order (plain attribute stores), whose
    ``__class__`` is then set to Task, which CPython allows between classes of one layout (and refuses, TypeError,
    were they ever to differ): 0.35 µs. Made from the dataclass's fields, as the dataclass makes its own
    ``__init__``; tests/unit/test_task.py holds the result equal to ``Task(*values)``, field for field."""
    names = tuple(field.name for field in fields(Task))
    twin = type("_TaskFill", (), {"__slots__": names})
    stores = "".join(f"    t.{name} = {name}\n" for name in names)
    scope: dict[str, Any] = {"_new": object.__new__, "_Twin": twin, "_Task": Task}
    exec(f"def _make({', '.join(names)}):\n    t = _new(_Twin)\n{stores}    t.__class__ = _Task\n    return t\n",
         scope)
    return cast(Callable[..., Task], scope["_make"])


# Task.from_hash and Task.created pass every field's value, in the order of the fields (tests/unit/test_task.py
# checks both against the dataclass's __init__).
_make = _maker()
# TaskStatus's members read once: an enum class's attribute read is ~50 ns on Python 3.11, on every status read
_PENDING, _EXPIRED, _PENDING_TEXT = TaskStatus.PENDING, TaskStatus.EXPIRED, TaskStatus.PENDING.value
_NO_CALLBACK = {"state": CallbackState.PENDING.value, "attempts": 0, "last_status": None}  # none delivered yet
