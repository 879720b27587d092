"""The API's paths: ``/api/v1`` is written here and nowhere else in the service.

Blueprints mount at :data:`API_PREFIX`; documents, ``Location`` headers and result links are built by
:func:`task_path`; the OpenAPI document names its paths with :func:`api_path`.
"""

from __future__ import annotations

API_PREFIX = "/api/v1"


def api_path(path: str) -> str:
    """``path`` (from the API's root, e.g. ``/tasks``) under the API prefix."""
    return f"{API_PREFIX}{path}"


def task_path(task_id: str, suffix: str = "") -> str:
    """The task's URL path, or one of its sub-resources (``suffix`` e.g. ``/result/file``)."""
    return f"{API_PREFIX}/tasks/{task_id}{suffix}"
