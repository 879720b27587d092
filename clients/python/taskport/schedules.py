"""The schedule calls of :class:`taskport.Client` (``/api/v1/schedules``), kept beside it in a module of their own.

    with Client(url) as tp:
        s = tp.create_schedule("*/15 * * * *", "orders.export", {"rows": 100}, timezone="Europe/Paris")
        tp.update_schedule(s["schedule_id"], paused=True)

Documents are the plain schedule documents of docs/api.md; errors the typed exceptions of taskport.errors
(a bad cron, time zone or task: ``InvalidRequest`` with ``errors``; the cap: a ``ProblemError`` of status 429).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import quote

import httpx

from taskport.errors import Doc, json_document

SCHEDULES = "/api/v1/schedules"
SCHEDULE_PAGE = 50


class ScheduleCalls:
    """Mixed into :class:`taskport.client.Client`, whose ``_request`` and ``_raise`` these use."""

    if TYPE_CHECKING:
        def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...

        @staticmethod
        def _raise(response: httpx.Response) -> NoReturn: ...

    def create_schedule(self, cron: str, type: str, payload: dict[str, Any] | None = None, *,
                        timezone: str | None = None, name: str | None = None, priority: str | None = None,
                        paused: bool = False) -> Doc:
        """Create a schedule: every fire time of ``cron`` (5 fields, read in ``timezone``, default UTC) submits
        a task of ``type`` with ``payload``; returns the schedule document."""
        task: dict[str, Any] = {"type": type, "payload": payload if payload is not None else {}}
        if priority:
            task["priority"] = priority
        body: dict[str, Any] = {"cron": cron, "task": task, "paused": paused}
        if timezone:
            body["timezone"] = timezone
        if name:
            body["name"] = name
        return self._document(self._request("POST", SCHEDULES, json=body), 201)

    def list_schedules(self, *, page_size: int = SCHEDULE_PAGE) -> Iterator[Doc]:
        """The member's schedules, newest first, following ``next_cursor`` page after page lazily."""
        params: dict[str, Any] = {"limit": page_size}
        while True:
            page = self._document(self._request("GET", SCHEDULES, params=params))
            yield from page["schedules"]
            if not page.get("next_cursor"):
                return
            params["cursor"] = page["next_cursor"]

    def get_schedule(self, schedule_id: str) -> Doc:
        """The schedule document (someone else's or an unknown id raises NotFound)."""
        return self._document(self._request("GET", _schedule_path(schedule_id)))

    def update_schedule(self, schedule_id: str, *, cron: str | None = None, timezone: str | None = None,
                        task: dict[str, Any] | None = None, paused: bool | None = None) -> Doc:
        """Change what is given (``task`` is a whole ``{"type", "payload", "priority"}``); returns the document."""
        changes = {k: v for k, v in (("cron", cron), ("timezone", timezone), ("task", task), ("paused", paused))
                   if v is not None}
        return self._document(self._request("PATCH", _schedule_path(schedule_id), json=changes))

    def delete_schedule(self, schedule_id: str) -> None:
        """Delete the schedule (the tasks it created stay)."""
        response = self._request("DELETE", _schedule_path(schedule_id))
        if response.status_code != 204:
            self._raise(response)

    def _document(self, response: httpx.Response, expected: int = 200) -> Doc:
        return json_document(response, expected, self._raise)


def _schedule_path(schedule_id: str) -> str:
    return f"{SCHEDULES}/{quote(str(schedule_id), safe='')}"
