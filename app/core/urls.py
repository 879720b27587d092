"""The API's paths: ``/api/v1`` is written here and nowhere else in the service.

Blueprints mount at :data:`API_PREFIX`; documents, ``Location`` headers and result links are built by
:func:`task_path` (a status document's links by :func:`status_document`, a file result's by
:func:`file_url`); the OpenAPI document names its paths with :func:`api_path`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.core.clock import iso_or_none
from app.core.states import TaskStatus
from app.core.task import Task

if TYPE_CHECKING:
    from app.core.batches import Batch
    from app.core.lines import Place

API_PREFIX = "/api/v1"


def api_path(path: str) -> str:
    """``path`` (from the API's root, e.g. ``/tasks``) under the API prefix."""
    return f"{API_PREFIX}{path}"


def task_path(task_id: str, suffix: str = "") -> str:
    """The task's URL path, or one of its sub-resources (``suffix`` e.g. ``/result/file``)."""
    return f"{API_PREFIX}/tasks/{task_id}{suffix}"


def links(task_id: str) -> dict[str, str]:
    """A status document's ``links``."""
    path = task_path(task_id)
    return {"self": path, "result": f"{path}/result", "events": f"{path}/events"}


def status_document(task: Task, now: int, place: Place | None = None) -> dict[str, Any]:
    """The contract's status document of ``task`` as seen at ``now`` (ms): the record's, with its links, and
    ``queue`` when ``place`` says where it waits in line (app.core.lines; only while it is PENDING)."""
    doc = task.to_doc(now)
    if place is not None and doc["status"] == TaskStatus.PENDING:
        doc["queue"] = {"position": place.position,
                        "estimated_start": iso_or_none(place.estimated_start)}
    doc["links"] = links(task.id)
    return doc


def file_url(task_id: str) -> str:
    """Where a file result is downloaded: its ``result.file.url``."""
    return task_path(task_id, "/result/file")


def batch_path(batch_id: str, suffix: str = "") -> str:
    """The batch's URL path, or one of its sub-resources (``suffix`` e.g. ``/tasks``); the collection's
    without an id."""
    return f"{API_PREFIX}/batches/{batch_id}{suffix}" if batch_id else f"{API_PREFIX}/batches"


def batch_document(batch: Batch, now: int) -> dict[str, Any]:
    """The contract's batch document of ``batch`` as seen at ``now`` (ms): the record's, with its links."""
    doc = batch.to_doc(now)
    path = batch_path(batch.id)
    doc["links"] = {"self": path, "tasks": f"{path}/tasks", "events": f"{path}/events",
                    "then": task_path(batch.then_task_id) if batch.then_task_id else None}
    return doc
