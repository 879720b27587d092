"""The batch calls of :class:`taskport.Client` (``/api/v1/batches``), kept beside it in a module of their own.

    with Client(url) as tp:
        batch = tp.submit_batch([{"type": "orders.split", "payload": order} for order in orders],
                                then={"type": "demo.sleep", "payload": {"seconds": 0}},
                                callback="https://hooks.example/taskport")
        for doc in tp.watch_batch(batch["batch_id"]):    # the batch document on each change, until DONE
            print(doc["progress"], doc["counts"])
        failed = list(tp.batch_tasks(batch["batch_id"], status="FAILED"))

Documents are the plain batch and status documents of docs/api.md; errors the typed exceptions of
taskport.errors: a bad task, ``then`` or callback is :class:`InvalidRequest` whose ``errors`` name the field by
index (``tasks.3.payload.items.0.quantity``), and nothing was stored; the active-task cap, which counts every task
of the batch, :class:`TooManyRequests`; an unknown or someone else's batch :class:`NotFound`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import quote

import httpx

from taskport.errors import Doc, json_document
from taskport.states import BatchStatus

if TYPE_CHECKING:
    from taskport.client import Stream

DONE = BatchStatus.DONE.value  # a batch's status once none of its tasks is PENDING or PROCESSING; its stream ends
BATCH_PAGE = 100  # tasks per page of batch_tasks
Callback = str | Mapping[str, Any]  # a URL, or {"url": ..., "events": [...]}


def callback_body(callback: Callback) -> dict[str, Any]:
    """The ``callback`` of a submit body: ``{"url": callback}`` for a bare URL (every terminal event), else as
    given (``{"url", "events"}``)."""
    return {"url": callback} if isinstance(callback, str) else dict(callback)


class BatchCalls:
    """Mixed into :class:`taskport.client.Client`, whose request, error and stream internals these use."""

    if TYPE_CHECKING:
        def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...

        @staticmethod
        def _raise(response: httpx.Response) -> NoReturn: ...

        def _follow(self, stream: Stream, read: Any, *, timeout: float | None, max_attempts: int | None,
                    sse: bool) -> Iterator[Doc]: ...

    def submit_batch(self, tasks: Iterable[Mapping[str, Any]], then: Mapping[str, Any] | None = None,
                     callback: Callback | None = None, *, read_token: bool = False) -> Doc:
        """Submit ``tasks`` (1 to 1,000 submit bodies: ``{"type", "payload", ...}``, as ``POST /tasks`` takes)
        as one batch, all or nothing; returns the batch document with ``tasks``: ``{"task_id", "status",
        "duplicate"}`` per task, in order (a task whose dedup key is held is that earlier task, ``duplicate``).

        ``then``: one more submit body, queued once every task of the batch has ended (whatever its outcome);
        its processor reads the batch and its tasks' results from its context. ``callback``: a URL (or
        ``{"url": ...}``; a batch's takes no ``events``) the service POSTs the batch document to, signed, once
        the batch is DONE. ``read_token``: the answer also carries ``read_token`` (``{"token", "expires_at"}``, as
        :meth:`batch_read_token` makes), for a frontend that reads the batch and its tasks."""
        body: dict[str, Any] = {"tasks": [dict(task) for task in tasks]}
        if read_token:
            body["read_token"] = True
        if then is not None:
            body["then"] = dict(then)
        if callback is not None:
            body["callback"] = callback_body(callback)
        return self._batch_document(self._request("POST", _batch_path(), json=body), 202)

    def batch(self, batch_id: str) -> Doc:
        """The batch document: ``status`` (RUNNING or DONE), ``counts`` per task status, ``progress``, ``items``,
        ``then_task_id`` and the ``callback``'s delivery state."""
        return self._batch_document(self._request("GET", _batch_path(batch_id)))

    def batch_tasks(self, batch_id: str, status: str | None = None, *, page_size: int = BATCH_PAGE) -> Iterator[Doc]:
        """The status documents of the batch's tasks in submit order (only those in ``status``, if given),
        following ``next_cursor`` page after page lazily."""
        params: dict[str, Any] = {"limit": page_size}
        if status:
            params["status"] = status
        while True:
            page = self._batch_document(self._request("GET", _batch_path(batch_id, "/tasks"), params=params))
            yield from page["tasks"]
            if not page.get("next_cursor"):
                return
            params["cursor"] = page["next_cursor"]

    def watch_batch(self, batch_id: str, *, timeout: float | None = None, max_attempts: int | None = None,
                    sse: bool = True) -> Iterator[Doc]:
        """The batch document as it changes (over its event stream, changes coalesced), ending with the DONE one.

        As :meth:`Client.follow` does for a task: a dropped stream is reopened with ``Last-Event-ID``, one that
        cannot be opened gives way to polling the batch; ``timeout`` (seconds) or ``max_attempts`` (reads and
        stream connections) raise :class:`StillRunning` (``kind`` "batch") while it is still RUNNING."""
        from taskport.client import Stream  # here: taskport.client imports this module

        stream = Stream("batch", batch_id, _batch_path(batch_id, "/events"), "batch", _done)
        yield from self._follow(stream, lambda: (self.batch(batch_id), None), timeout=timeout,
                                max_attempts=max_attempts, sse=sse)

    def cancel_batch(self, batch_id: str) -> None:
        """Cancel the batch's unfinished tasks and its ``then`` task (those already ended stay as they are)."""
        response = self._request("DELETE", _batch_path(batch_id))
        if response.status_code != 204:
            self._raise(response)

    def _batch_document(self, response: httpx.Response, expected: int = 200) -> Doc:
        return json_document(response, expected, self._raise)


def _done(doc: Doc) -> bool:
    return doc.get("status") == DONE


def _batch_path(batch_id: str | None = None, suffix: str = "") -> str:
    from taskport.client import API  # the client's one spelling of the prefix (taskport.client imports this module)

    return f"{API}/batches" if batch_id is None else f"{API}/batches/{quote(str(batch_id), safe='')}{suffix}"
