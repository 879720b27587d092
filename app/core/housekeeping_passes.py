"""The housekeeping schedule: the periodic passes, the fixed RQ job id each runs under, their queue.

One list for the three processes that need it: the scheduler (``workers.scheduler``) registers a
periodic job per pass, the housekeeper runs it (``workers.housekeeping.<name>_pass``), and readiness
(``app.web.readiness``) reads when each pass last ended.
"""

from __future__ import annotations

QUEUE = "housekeeping"  # served by the scheduler's own housekeeper, never by a task worker
PASSES = ("expire", "recover", "monitor")


def job_id(name: str) -> str:
    """The fixed id of pass ``name``'s periodic job: a restarted scheduler replaces it, never adds one."""
    return f"taskport-housekeeping-{name}"
