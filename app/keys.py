"""Every Redis key name and every key lifetime rule: nothing else formats a key.

A task's own keys share the ``{task_id}`` hash tag so they would land on one cluster slot.
"""

from __future__ import annotations

PREFIX = "tp:"


def task(task_id: str) -> str:
    """Hash: the task's status fields (the record; one HGETALL answers a status read)."""
    return f"{PREFIX}task:{{{task_id}}}"


def payload(task_id: str) -> str:
    """String: the validated payload JSON, dropped when the task ends."""
    return f"{PREFIX}task:{{{task_id}}}:payload"


def result(task_id: str) -> str:
    """String: the result JSON ({"result", "failures", "error_code", "run"}) of a COMPLETED task ("run": the
    run whose result folder holds its files, when it wrote any)."""
    return f"{PREFIX}task:{{{task_id}}}:result"


def events(task_id: str) -> str:
    """Pub/sub channel: a message with the task's event sequence number on every change."""
    return f"{PREFIX}task:{{{task_id}}}:events"


def dedup(member: str, digest: str) -> str:
    """String (SET NX EX): the task id holding this dedup key for the member's window."""
    return f"{PREFIX}dedup:{member}:{digest}"


def history(member: str) -> str:
    """Sorted set: the member's task ids scored by creation time (ms)."""
    return f"{PREFIX}history:{member}"


EXPIRY = f"{PREFIX}expiry"  # sorted set: task id scored by the ms when housekeeping must act on it
RUNNING = f"{PREFIX}running"  # sorted set: PROCESSING task id scored by its last heartbeat (ms)
MEMBERS = f"{PREFIX}members"  # set: every member that has a history index
ACTIVE = f"{PREFIX}active"  # hash: member -> how many of its tasks are unfinished (PENDING or PROCESSING)
STATS = f"{PREFIX}stats"  # hash: counters (submitted, completed, failed, ...) for metrics
FAILURES = f"{PREFIX}failures"  # sorted set: recent failures scored by time, for alerting
SLOW_WARNED = f"{PREFIX}slow-warned"  # set: PROCESSING tasks already logged as slow
ALERT_SENT = f"{PREFIX}alert-sent"  # string (SET NX EX window): a failure alert went out in this window
AUDIT = f"{PREFIX}audit"  # stream: one entry per task transition, capped by TASKPORT_AUDIT_RETENTION
ORPHAN_SWEEP = f"{PREFIX}orphan-sweep"  # string: the task id the result store's orphan sweep continues after


def streams(member: str) -> str:
    """Sorted set: the member's open event streams (stream id scored by the ms its lease runs out)."""
    return f"{PREFIX}streams:{member}"


# ms an open stream's slot stays counted without a renewal: its web process renews every third of it,
# so a killed process's slots are dropped at most this long after it died.
STREAM_LEASE_MS = 60_000


def housekeeping_lock(job: str) -> str:
    return f"{PREFIX}housekeeping:{job}:lock"


def all_static() -> list[str]:
    return [EXPIRY, RUNNING, MEMBERS, ACTIVE, STATS, FAILURES, SLOW_WARNED, ALERT_SENT, AUDIT, ORPHAN_SWEEP]
