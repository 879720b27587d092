"""The schedule endpoints' steps: ownership, the cap's refusal and the schedule document, over the
schedule store (app.core.schedules). Views call this; nothing here knows about requests."""

from __future__ import annotations

import logging
from typing import Any

import redis

from app.core.clock import iso_or_none
from app.core.config import Config
from app.core.history import decode_cursor
from app.core.ids import is_task_id
from app.core.schedules import Schedule, ScheduleCapReached, SchedulePage, ScheduleStore
from app.core.urls import api_path, task_path
from app.web.errors import NotFound, TooManyRequests

log = logging.getLogger(__name__)
CAP_RETRY_AFTER = 60  # seconds: a 429 for the schedule cap lasts until the member deletes one


def schedule_path(schedule_id: str = "") -> str:
    """The schedule's URL path (the collection's without an id)."""
    return api_path(f"/schedules/{schedule_id}" if schedule_id else "/schedules")


def schedule_document(s: Schedule) -> dict[str, Any]:
    """The contract's schedule document."""
    return {
        "schedule_id": s.id, "name": s.name, "cron": s.cron, "timezone": s.timezone, "task": s.task,
        "paused": s.paused, "next_run_at": iso_or_none(s.next_run_at), "last_run_at": iso_or_none(s.last_run_at),
        "last_task_id": s.last_task_id, "created_at": iso_or_none(s.created_at),
        "links": {"self": schedule_path(s.id), "last_task": task_path(s.last_task_id) if s.last_task_id else None},
    }  # fmt: skip


def schedule_not_found() -> NotFound:
    return NotFound("schedule not found")


class ScheduleService:
    def __init__(self, conn: redis.Redis, config: Config) -> None:
        self.store = ScheduleStore(conn, config.max_schedules, config.call_record_ms)

    def create(self, member: str, data: dict[str, Any], now: int) -> Schedule:
        """A new schedule from a loaded create body (its task's payload validated); 429 at the member's cap."""
        try:
            created = self.store.create(member, name=data["name"], cron_expr=data["cron"], timezone=data["timezone"],
                                        task=data["task"], paused=data["paused"], now=now)
        except ScheduleCapReached as exc:
            log.info("schedule create by %s refused: %s", member, exc)
            raise TooManyRequests(
                f"you have {exc.held} schedules, the most one member may have (TASKPORT_MAX_SCHEDULES): delete some",
                retry_after=CAP_RETRY_AFTER, limit="max_schedules", cap=exc.cap, active=exc.held) from None
        log.info("schedule %s created by %s: %r in %s, %s", created.id, member, created.cron, created.timezone,
                 created.task["type"])
        return created

    def find(self, member: str, schedule_id: str) -> Schedule:
        """The member's schedule, or NotFound (unknown, someone else's and malformed ids look the same)."""
        found = self.store.get(schedule_id) if is_task_id(schedule_id) else None
        if found is None or found.member != member:
            raise schedule_not_found()
        return found

    def page(self, member: str, *, limit: int, cursor: str | None) -> SchedulePage:
        if cursor:
            decode_cursor(cursor)  # ValueError for a cursor no page handed out
        return self.store.page(member, limit=limit, cursor=cursor)

    def update(self, member: str, schedule_id: str, changes: dict[str, Any], now: int) -> Schedule:
        updated = self.store.update(self.find(member, schedule_id), changes, now)
        if updated is None:  # deleted meanwhile
            raise schedule_not_found()
        log.info("schedule %s changed by %s: %s", schedule_id, member, ", ".join(sorted(changes)) or "nothing")
        return updated

    def delete(self, member: str, schedule_id: str) -> None:
        self.store.delete(self.find(member, schedule_id))
        log.info("schedule %s deleted by %s", schedule_id, member)
