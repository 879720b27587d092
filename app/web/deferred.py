"""A submit's ``run_at`` / ``delay``: when the task is to run, checked against ``TASKPORT_MAX_DELAY``.

The schema (app.web.schemas.SubmitSchema) checks each field alone; what needs both, or the configuration,
is here: one of the two at most, and no further ahead than the setting allows. ``Retry-After`` of a task
waiting for its time (:func:`retry_after`) says how long a poller may wait.
"""

from __future__ import annotations

import math
from typing import Any

from app.core.config import Config
from app.core.task import Task
from app.web.errors import ValidationFailed
from app.web.schemas import parse_timestamp

POLL_CAP = 60  # seconds: the longest Retry-After a task waiting for its run_at is given


def run_at_ms(data: dict[str, Any], config: Config, now: int) -> int | None:
    """The ms the submit ``data`` (the loaded envelope) asks its task to run at, or None (now); a
    ValidationFailed naming the field when both are given or one is past ``config.max_delay``."""
    run_at, delay = data.get("run_at"), data.get("delay")
    if run_at is not None and delay is not None:
        raise ValidationFailed({"delay": ["Give run_at or delay, not both."]})
    if run_at is None and delay is None:
        return None
    limit = f"At most {config.max_delay} seconds ahead (TASKPORT_MAX_DELAY)."
    if delay is not None:
        if delay > config.max_delay:
            raise ValidationFailed({"delay": [limit]})
        return now + math.ceil(delay * 1000)
    at = parse_timestamp(str(run_at))
    if at - now > config.max_delay * 1000:
        raise ValidationFailed({"run_at": [limit]})
    return at


def retry_after(task: Task, now: int) -> dict[str, str]:
    """A status read's ``Retry-After`` for an unfinished task: the seconds until its run_at (at least 1, at
    most :data:`POLL_CAP`), else 1."""
    return {"Retry-After": str(min(POLL_CAP, max(1, math.ceil(task.due_in(now)))))}
