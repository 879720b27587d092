"""Periodic schedules: their record, their list per member, the index of what is due, and every write.

A schedule is a hash (``keys.schedule``, fields :class:`~app.core.keys.ScheduleField`), listed in its
member's sorted set (``keys.schedules``, by creation time: the list's pages and the cap's count) and, while
not paused, in ``keys.SCHEDULES_DUE`` scored by its next fire time (what the scheduler's tick reads,
workers.firing). Every write keeps the three together: a create, a change and a fire time served are Lua
compare-and-sets (app.core.schedule_scripts), a delete one MULTI (no condition: its owner was checked).

A schedule lives until it is deleted (no TTL); ``Config.schedule_cap`` bounds how many a member holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from app.core import cron, keys
from app.core.config import Config
from app.core.history import decode_cursor, encode_cursor
from app.core.ids import digest, new_task_id
from app.core.keys import ScheduleField as S
from app.core.lua import Script
from app.core.schedule_scripts import ADVANCE, CREATE, SCRIPTS, UPDATE


class ScheduleCapReached(Exception):
    """A create refused: the member already holds ``cap`` schedules (``Config.schedule_cap``)."""

    def __init__(self, cap: int, held: int) -> None:
        super().__init__(f"{held} schedules, the cap is {cap}")
        self.cap, self.held = cap, held


def _ms(raw: bytes | None) -> int | None:
    return int(raw) if raw else None


@dataclass(frozen=True)
class Schedule:
    """A schedule as stored; ``task`` is ``{"type", "payload", "priority"}`` (payload validated, priority None
    = the processor's), ``next_run_at`` None while paused."""

    id: str
    member: str
    name: str
    cron: str
    timezone: str
    task: dict[str, Any]
    paused: bool
    next_run_at: int | None
    last_run_at: int | None
    last_task_id: str | None
    created_at: int
    updated_at: int

    @classmethod
    def from_hash(cls, h: dict[bytes, bytes], schedule_id: str) -> Schedule:
        def text(f: S) -> str:
            return h.get(f.encode(), b"").decode()

        return cls(
            id=schedule_id, member=text(S.MEMBER), name=text(S.NAME), cron=text(S.CRON), timezone=text(S.TIMEZONE),
            task=orjson.loads(h[S.TASK.encode()]), paused=text(S.PAUSED) == "1",
            next_run_at=_ms(h.get(S.NEXT_RUN_AT.encode())), last_run_at=_ms(h.get(S.LAST_RUN_AT.encode())),
            last_task_id=text(S.LAST_TASK_ID) or None, created_at=int(h[S.CREATED_AT.encode()]),
            updated_at=int(h[S.UPDATED_AT.encode()]),
        )  # fmt: skip


@dataclass(frozen=True)
class SchedulePage:
    schedules: list[Schedule]
    next_cursor: str | None


def fire_digest(schedule_id: str, fire_ms: int) -> str:
    """The dedup digest of the task for one fire time of one schedule: every scheduler process, a restart and a
    failover derive the same one, so the submit script creates that task once (app.core.scripts.SUBMIT)."""
    return digest(f"schedule\n{schedule_id}\n{fire_ms}".encode())


class ScheduleStore:
    """Every read and write of the schedules, on ``conn`` (replies as bytes)."""

    def __init__(self, conn: redis.Redis, cap: int, record_ms: int | None = None) -> None:
        self.redis: Any = conn
        self.cap = cap  # schedules per member, 0 = no cap (Config.schedule_cap)
        self.record_ms = Config().call_record_ms if record_ms is None else record_ms  # lua.ONCE_KEY
        self._scripts = {name: conn.register_script(s.source()) for name, s in SCRIPTS.items()}

    def _run(self, script: Script, keys_: dict[str, str], args: dict[str, Any], rest: Sequence[Any] = ()) -> Any:
        names, values = script.call(keys_, args, rest=rest, record_ms=self.record_ms if script.once else "")
        return self._scripts[script.name](keys=[*names, keys.AUDIT], args=values)  # AUDIT: see schedule_scripts

    def create(self, member: str, *, name: str, cron_expr: str, timezone: str, task: dict[str, Any], paused: bool,
               now: int) -> Schedule:
        """A new schedule of ``member`` (``cron_expr`` and ``timezone`` checked by the caller, see app.core.cron);
        ScheduleCapReached, writing nothing, when the member holds ``cap`` already."""
        schedule_id = new_task_id()
        next_ms = None if paused else cron.next_fire(cron_expr, timezone, now)
        fields: dict[S, Any] = {
            S.MEMBER: member, S.NAME: name, S.CRON: cron_expr, S.TIMEZONE: timezone, S.TASK: orjson.dumps(task),
            S.PAUSED: "1" if paused else "0", S.NEXT_RUN_AT: "" if next_ms is None else next_ms, S.LAST_RUN_AT: "",
            S.LAST_TASK_ID: "", S.CREATED_AT: now, S.UPDATED_AT: now,
        }  # fmt: skip
        answer = self._run(CREATE, {"schedule": keys.schedule(schedule_id), "index": keys.schedules(member),
                                    "due": keys.SCHEDULES_DUE},
                           {"schedule_id": schedule_id, "cap": self.cap, "created_ms": now,
                            "next_ms": "" if next_ms is None else next_ms}, _flat(fields))
        if answer[0] == 0:
            raise ScheduleCapReached(self.cap, int(answer[1]))
        return Schedule(schedule_id, member, name, cron_expr, timezone, task, paused, next_ms, None, None, now, now)

    def get(self, schedule_id: str) -> Schedule | None:
        h = self.redis.hgetall(keys.schedule(schedule_id))
        return Schedule.from_hash(h, schedule_id) if h else None

    def page(self, member: str, *, limit: int, cursor: str | None = None) -> SchedulePage:
        """The member's schedules, newest first, ``limit`` at a time; the cursor is a history cursor
        (app.core.history: creation score and how many of that score were passed), so creates never shift a page."""
        top, skip = decode_cursor(cursor) if cursor else (None, 0)
        rows = self.redis.zrevrangebyscore(keys.schedules(member), "+inf" if top is None else top, "-inf",
                                           start=skip, num=limit + 1, withscores=True)
        more, rows = len(rows) > limit, rows[:limit]
        pipe = self.redis.pipeline(transaction=False)
        for schedule_id, _ in rows:
            pipe.hgetall(keys.schedule(schedule_id.decode()))
        found = []
        for (schedule_id, score), h in zip(rows, pipe.execute() if rows else [], strict=True):
            top, skip = (top, skip + 1) if score == top else (int(score), 1)
            if h:
                found.append(Schedule.from_hash(h, schedule_id.decode()))
        return SchedulePage(found, encode_cursor((int(top), skip)) if more and top is not None else None)

    def update(self, schedule: Schedule, changes: dict[str, Any], now: int) -> Schedule | None:
        """``schedule`` with ``changes`` (any of cron, timezone, task, paused; checked by the caller) written;
        None when it was deleted meanwhile. A change of timing or an unpause sets the next fire time from now."""
        new = {**schedule.__dict__, **changes, "updated_at": now}
        timing = any(k in changes for k in ("cron", "timezone")) or ("paused" in changes and not new["paused"])
        next_ms: int | str = "keep"
        if new["paused"]:
            next_ms, new["next_run_at"] = "", None
        elif timing or schedule.next_run_at is None:
            next_ms = new["next_run_at"] = cron.next_fire(new["cron"], new["timezone"], now)
        fields = {S.CRON: new["cron"], S.TIMEZONE: new["timezone"], S.TASK: orjson.dumps(new["task"]),
                  S.PAUSED: "1" if new["paused"] else "0", S.UPDATED_AT: now}
        done = self._run(UPDATE, {"schedule": keys.schedule(schedule.id), "due": keys.SCHEDULES_DUE},
                         {"schedule_id": schedule.id, "member": schedule.member, "next_ms": next_ms}, _flat(fields))
        return Schedule(**new) if done else None

    def delete(self, schedule: Schedule) -> None:
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.schedule(schedule.id))
            pipe.zrem(keys.schedules(schedule.member), schedule.id)
            pipe.zrem(keys.SCHEDULES_DUE, schedule.id)
            pipe.execute()

    # -- firing (workers.firing) ------------------------------------------------------------------
    def due(self, now: int, limit: int) -> list[str]:
        """Ids of unpaused schedules whose next fire time is at or before ``now``, earliest first."""
        return [s.decode() for s in self.redis.zrangebyscore(keys.SCHEDULES_DUE, "-inf", now, start=0, num=limit)]

    def advance(self, schedule_id: str, fire_ms: int, next_ms: int | None, now: int, task_id: str | None) -> bool:
        """From fire time ``fire_ms`` to ``next_ms``, recording ``task_id`` as its last run: only if the schedule
        still expects ``fire_ms`` and is not paused (compare-and-set). True when it moved."""
        return bool(self._run(ADVANCE, {"schedule": keys.schedule(schedule_id), "due": keys.SCHEDULES_DUE},
                              {"schedule_id": schedule_id, "fire_ms": fire_ms,
                               "next_ms": "" if next_ms is None else next_ms, "now_ms": now,
                               "task_id": task_id or ""}))

    def forget(self, schedule_id: str) -> None:
        """Drop a due entry whose schedule is gone (a delete keeps them together: a belt, not a path)."""
        self.redis.zrem(keys.SCHEDULES_DUE, schedule_id)


def _flat(fields: dict[S, Any]) -> list[Any]:
    return [v for pair in ((str(k), val) for k, val in fields.items()) for v in pair]
