"""A task's live output: the lines a processor emits (``ctx.emit``), kept in Redis for pollers and event streams.

How lines are kept (a list, ids counted by the task's hash) is :mod:`app.core.outputscripts`'. Here: a line's
shape (:class:`Line`, what the API sends: ``{"id", "at", "text"}``), the caps on a line's bytes
(:func:`split`), and :class:`OutputLog`, the one reader and writer of the list. Line ids are decimal strings
on the wire ("1", "2" ...), increasing; a reader treats them as opaque. ``0`` is the cursor before the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple
from weakref import WeakKeyDictionary

from app.core import keys
from app.core.clock import iso
from app.core.config import Config
from app.core.outputscripts import EMIT, PAGE_SOURCE
from app.core.store import TaskStore

MARKER = "…"  # ends a line cut at TASKPORT_OUTPUT_MAX_LINE_BYTES
MAX_PAGE = 1000  # lines one read returns at most (the route's limit; a stream's catch-up reads)
MAX_SEND = 1000  # lines one EMIT call carries at most (Lua's unpack has a limit near 8,000)
MAX_ID = 2**63 - 1  # a Redis integer
ID_DIGITS = 18  # digits of an id a client sends back (a line id, an event id): 10^18 - 1 is within MAX_ID


class Line(NamedTuple):
    """One output line: its id, when it was emitted (ms) and its text."""

    id: int
    at: int
    text: str

    def doc(self) -> dict[str, Any]:
        return {"id": str(self.id), "at": iso(self.at), "text": self.text}


class Page(NamedTuple):
    """What one read found: the task's status ('' = gone), the id of its last line, and the lines read."""

    status: str
    last: int
    lines: list[Line]


def split(text: str, max_bytes: int) -> list[str]:
    """``text`` as output lines: one per ``\\n`` (a trailing one ends the last line, it opens no empty one; a
    ``\\r`` before it goes too), each cut to ``max_bytes`` of UTF-8 ending in :data:`MARKER` when longer."""
    pieces = str(text).split("\n")
    if len(pieces) > 1 and pieces[-1] == "":
        pieces.pop()
    return [_cut(piece.removesuffix("\r"), max_bytes) for piece in pieces]


def _cut(line: str, max_bytes: int) -> str:
    raw = line.encode("utf-8", "replace")
    if len(raw) <= max_bytes:
        return raw.decode("utf-8")  # a lone surrogate became "?": what is stored is what is read
    room = max(0, max_bytes - len(MARKER.encode()))
    return raw[:room].decode("utf-8", "ignore") + MARKER


def encode(at_ms: int, text: str) -> bytes:
    """A line as the list keeps it: ``<at ms>:<text>``."""
    return b"%d:%s" % (at_ms, text.encode("utf-8", "replace"))


def decode(line_id: int, raw: bytes) -> Line:
    at, _, text = raw.partition(b":")
    return Line(line_id, int(at), text.decode("utf-8", "replace"))


def lines_of(first: int, raws: Sequence[bytes]) -> list[Line]:
    return [decode(first + i, raw) for i, raw in enumerate(raws)]


def parse_id(raw: str) -> int | None:
    """A line id (or cursor) as sent by a client: None when it is not one (ASCII digits, :data:`ID_DIGITS` at most,
    as the document's patterns say: a 19-digit string may be past 2^63 - 1, where the pattern cannot tell)."""
    if raw.isascii() and raw.isdigit() and len(raw) <= ID_DIGITS:
        return int(raw)
    return None


class OutputLog:
    """Reads and writes of task output, through the store (so a write is one of its scripts, sent its way)."""

    @classmethod
    def of(cls, store: TaskStore) -> OutputLog:
        """The store's OutputLog, built once (the web's views and event hub share it)."""
        found = _LOGS.get(store)
        if found is None:
            found = _LOGS[store] = cls(store)
        return found

    def __init__(self, store: TaskStore, config: Config | None = None) -> None:
        self.store = store
        self.config = config or store.config
        self._page = store.redis.register_script(PAGE_SOURCE)

    def emit(self, task_id: str, run_id: str, lines: Sequence[bytes], now_ms: int, skipped: int = 0) -> str:
        """Append ``lines`` (:func:`encode`d, oldest first) for run ``run_id``, after ``skipped`` lines it dropped
        unsent: the status found ('PROCESSING' when written; 'TAKEN' for a run that was taken over, which adds
        nothing). At most MAX_SEND lines a call."""
        answer = self.store.run_script(EMIT.name, *EMIT.call(
            keys={"task": keys.task(task_id), "output": keys.output(task_id), "events": keys.events(task_id),
                  "stored_bytes": keys.STORED_BYTES},
            args={"run_id": run_id, "now_ms": now_ms, "max_lines": self.config.output_max_lines,
                  "count": len(lines), "skipped": int(skipped)},
            rest=lines, record_ms=self.config.call_record_ms))  # fmt: skip
        return answer.decode() if isinstance(answer, bytes) else str(answer)

    def page(self, task_id: str, after: int, limit: int = MAX_PAGE) -> Page:
        """The lines after id ``after`` (at most ``limit``), read in one step with the task's status."""
        return _page(self._page(keys=[keys.task(task_id), keys.output(task_id)], args=[after, limit]))

    def pages(self, wanted: Sequence[tuple[str, int, int]]) -> list[Page]:
        """:meth:`page` for each (task id, after, limit), in one round trip."""
        pipe = self.store.redis.pipeline(transaction=False)
        for task_id, after, limit in wanted:
            pipe.eval(PAGE_SOURCE, 2, keys.task(task_id), keys.output(task_id), after, limit)
        return [_page(answer) for answer in pipe.execute()]

    def held(self, task_id: str) -> tuple[int, int]:
        """(lines kept, bytes they hold as counted in the quota): for tests and the bench."""
        pipe = self.store.redis.pipeline(transaction=False)
        pipe.llen(keys.output(task_id))
        pipe.hget(keys.task(task_id), keys.TaskField.OUTPUT_BYTES)
        count, held = pipe.execute()
        return int(count), int(held or 0)


_LOGS: WeakKeyDictionary[TaskStore, OutputLog] = WeakKeyDictionary()


def _page(answer: list[Any]) -> Page:
    status, last, first, raws = answer
    return Page(status.decode() if isinstance(status, bytes) else str(status), int(last), lines_of(int(first), raws))
