"""The members' history indexes: a page of a member's tasks, its cursor, and the trim of old entries.

``keys.history(member)`` is a sorted set of the member's task ids scored by creation time (ms), and
``keys.MEMBERS`` the set of members that have one; the submit script adds to both. A page reads the
index by score and the tasks through the :class:`~app.core.store.TaskStore`; housekeeping's expiry
pass trims entries of tasks that cannot exist any more.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.core import keys
from app.core.clock import now_ms
from app.core.store import TaskStore
from app.core.task import Task

# A filtered history page examines at most this many index entries per task it may return (see page).
HISTORY_SCAN = 5
# A history cursor: "<creation time in ms>-<entries with that time already passed>", in ASCII digits within
# bounds Redis accepts (its LIMIT offset is a signed 64-bit integer; a score a double). Clients treat it as
# opaque; the OpenAPI document states this exact pattern, so every string it allows is a cursor we accept.
CURSOR_PATTERN = r"^(0|[1-9][0-9]{0,15})-(0|[1-9][0-9]{0,9})$"
_CURSOR = re.compile(CURSOR_PATTERN)


@dataclass(frozen=True)
class Page:
    tasks: list[Task]
    next_cursor: str | None


def encode_cursor(position: tuple[float, int]) -> str:
    return f"{int(position[0])}-{int(position[1])}"


def decode_cursor(cursor: str) -> tuple[int, int]:
    """Raises ValueError for anything that is not a cursor this service made."""
    match = _CURSOR.match(cursor) if len(cursor) <= 64 and cursor.isascii() and "\n" not in cursor else None
    if match is None:
        raise ValueError("malformed cursor")
    return int(match[1]), int(match[2])


class Histories:
    """Every member's history index, read through ``store`` (whose connection it shares)."""

    def __init__(self, store: TaskStore) -> None:
        self.store = store
        self.redis = store.redis

    def page(
        self, member: str, *, limit: int, cursor: str | None = None, status: str | None = None,
        type_: str | None = None, now: int | None = None,
    ) -> Page:
        """The member's tasks, newest first, filtered; ``cursor`` continues a previous page.

        A page costs at most ``1 + HISTORY_SCAN * limit`` Redis commands whatever the filter matches: one
        range read of the member's index, then one HGETALL per entry it examines (in one pipeline): at
        most ``limit`` entries unfiltered, ``HISTORY_SCAN * limit`` with a filter. So a filtered page can
        hold fewer than ``limit`` tasks, even none, with a ``next_cursor`` to go on from; it is the last
        page only when ``next_cursor`` is None. The position is (creation score, how many entries with
        that score were already passed), so tasks created meanwhile never shift a page.
        """
        now = now if now is not None else now_ms()
        top, skip = decode_cursor(cursor) if cursor else (None, 0)
        window = limit * HISTORY_SCAN if status or type_ else limit
        rows = self.redis.zrevrangebyscore(keys.history(member), "+inf" if top is None else top, "-inf",
                                           start=skip, num=window + 1, withscores=True)
        more, rows = len(rows) > window, rows[:window]
        found: list[Task] = []
        for index, ((_, score), task) in enumerate(zip(rows, self.store.get_many([r[0].decode() for r in rows]),
                                                       strict=True)):
            top, skip = (top, skip + 1) if score == top else (int(score), 1)
            if task and _matches(task, status, type_, now):
                found.append(task)
                if len(found) == limit:
                    more = more or index + 1 < len(rows)
                    break
        return Page(found, encode_cursor((int(top), skip)) if more and top is not None else None)

    def trim(self, created_before_ms: int) -> int:
        """Drop the entries of tasks old enough that they cannot exist any more; returns how many."""
        members = [m.decode() for m in self.redis.smembers(keys.MEMBERS)]
        pipe = self.redis.pipeline(transaction=False)
        for member in members:
            pipe.zremrangebyscore(keys.history(member), "-inf", created_before_ms)
        return sum(pipe.execute())


def _matches(task: Task, status: str | None, type_: str | None, now: int) -> bool:
    return (not status or task.effective_status(now) == status) and (not type_ or task.type == type_)
