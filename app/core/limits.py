"""Limits on what runs at once (concurrency) and how fast (rates), shared by every worker on every host.

**Concurrency.** A processor declares ``@processor(..., concurrency=N, concurrency_key="member" | "type" |
"payload.<field>")``; ``TASKPORT_CONCURRENCY`` overrides it per type (:func:`concurrency_table`). The gate is the
start: the START script takes a slot of the task's limit key (``"<type> <key kind>[ <value>]"``), or parks the
task (PENDING, not holding a worker, its job dropped) in the limit's line; the run's end frees the slot and
releases the oldest parked task, whose slot is reserved for it (app.core.limitscripts). The scheduler's tick
(:func:`queue_released`) puts a released task back in line: its job is queued with
:meth:`app.core.jobs.JobQueue.requeue_commands`, the enqueue of every put-back, under :func:`limit_job_id`.
:func:`sweep` is the backstop of every limit key with a line: a slot whose holder died or stalled past the stall
timeout is freed, and the line moves on.

**Rates.** ``ctx.limit(name)`` takes a token of a named bucket (workers.ratelimit, the RATE_TAKE script): declared
in ``TASKPORT_RATE_LIMITS`` or in code with :func:`rate_limit`, or by the call itself (``ctx.limit(name, rate,
per)``); the operator's entry wins, then the code's declaration, then the call's own figures (:func:`rate_of`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from app.core import keys, lua, processors
from app.core.config import Config
from app.core.config_limits import RATE_NAME
from app.core.jobs import JobQueue, delayed_job_id
from app.core.limitscripts import LIMIT_QUEUE, LIMIT_SWEEP
from app.core.states import TaskStatus

if TYPE_CHECKING:
    from app.core.store import TaskStore
    from app.core.task import Task

BATCH = 500  # released tasks queued per round trip
SWEEP_EVERY = 2.0  # seconds between two sweeps of the limit keys with a line (the backstop: an end frees at once)
SWEEP_KEYS = 1000  # limit keys swept per round (the busiest deployments hold a few per member)


# -- concurrency ------------------------------------------------------------------------------------
def concurrency_table(config: Config) -> dict[str, tuple[int, str]]:
    """Task type -> (N, key) of every concurrency limit in force: the processors' own, overridden by
    TASKPORT_CONCURRENCY (N 0 there lifts one). Types without a limit are left out."""
    table = {p.type: (p.concurrency, p.concurrency_key) for p in map(processors.get, processors.known_types())
             if p is not None and p.concurrency > 0}
    table.update(config.concurrency_limits)
    return {t: limit for t, limit in table.items() if limit[0] > 0}


def concurrency_spec(config: Config) -> str:
    """The limits as START takes them: ``type=N/key;...`` ('' when there are none, and START checks nothing)."""
    return ";".join(f"{t}={n}/{key}" for t, (n, key) in sorted(concurrency_table(config).items()))


def limit_name(limit_key: str) -> str:
    """The limit a limit key belongs to, its type and key kind (``demo.sleep member``): /metrics' label, bounded
    by the declarations, where a limit key holds a member or a payload value."""
    return " ".join(limit_key.split(" ", 2)[:2])


def limit_job_id(task_id: str, seq: int) -> str:
    """The RQ job id under which a task released from a limit's line is queued: unique per write of the task
    (``seq``), so it never names the job of the delivery that parked it, which RQ may still be deleting."""
    return f"{task_id}_c{seq}"


def queue_released(store: TaskStore, jobs: JobQueue, limit: int = BATCH) -> int:
    """Queue the tasks released from limits' lines (keys.LIMIT_READY), oldest first: how many were queued. The
    one place a parked task is put back in line."""
    ready = [m.decode() for m in store.redis.zrange(keys.LIMIT_READY, 0, limit - 1)]
    if not ready:
        return 0
    pipe = store.redis.pipeline(transaction=False)
    for task_id, task in zip(ready, store.get_many(ready), strict=True):
        queue_one(store, jobs, task_id, task, pipe)
    return sum(1 for answer in pipe.execute() if answer[0] == 1)


def queue_one(store: TaskStore, jobs: JobQueue, task_id: str, task: Task | None, client: Any = None) -> Any:
    """LIMIT_QUEUE for one released task (``task`` as read), on ``client`` (a pipeline) or now: its job is the
    enqueue of every put-back (:meth:`JobQueue.requeue_commands`) under :func:`limit_job_id`."""
    job_keys: list[str] = []
    job_args: list[Any] = []
    job = ""
    if task is not None and task.status == TaskStatus.PENDING:
        job = limit_job_id(task_id, task.seq)
        job_keys, job_args = lua.replay(jobs.requeue_commands(task, job))
    return store.run_script(LIMIT_QUEUE.name, *LIMIT_QUEUE.call(
        keys={"task": keys.task(task_id), "ready": keys.LIMIT_READY},
        args={"task_id": task_id, "job_id": job, "job_argc": len(job_args)},
        rest_keys=job_keys, rest=job_args, record_ms=store.config.call_record_ms), client=client)


def sweep(store: TaskStore, now: int) -> int:
    """Every limit key's backstop (LIMIT_SWEEP): slots of holders whose run ended or stalled past the stall
    timeout are freed, and parked tasks take the free slots. Returns how many were released."""
    limit_keys = [k.decode() for k in store.redis.hkeys(keys.LIMITS)][:SWEEP_KEYS]
    if not limit_keys:
        return 0
    pipe = store.redis.pipeline(transaction=False)
    for limit_key in limit_keys:
        sweep_one(store, limit_key, now, pipe)
    return sum(int(answer[1]) for answer in pipe.execute() if answer[0] == 1)


def sweep_one(store: TaskStore, limit_key: str, now: int, client: Any = None) -> Any:
    """LIMIT_SWEEP for one limit key, on ``client`` (a pipeline) or now."""
    return store.run_script(LIMIT_SWEEP.name, *LIMIT_SWEEP.call(
        keys={"limit_head": keys.LIMIT_HEAD, "limits": keys.LIMITS, "ready": keys.LIMIT_READY,
              "running": keys.RUNNING, "task_head": keys.task("")},
        args={"limit_key": limit_key, "now_ms": now, "stall_ms": int(store.config.stall_timeout * 1000)},
        record_ms=store.config.call_record_ms), client=client)


@dataclass(frozen=True)
class LimitUse:
    """One limit's use now, summed over its limit keys: slots held (reserved ones included) and tasks parked."""

    held: int = 0
    parked: int = 0


def in_use(conn: Any) -> dict[str, LimitUse]:
    """Limit (:func:`limit_name`) -> its use now, from every limit key in keys.LIMITS (two round trips)."""
    limit_keys = [k.decode() for k in conn.hkeys(keys.LIMITS)][:SWEEP_KEYS]
    if not limit_keys:
        return {}
    pipe = conn.pipeline(transaction=False)
    for limit_key in limit_keys:
        pipe.zcard(keys.limit_slots(limit_key))
        pipe.zcard(keys.limit_parked(limit_key))
    counts = pipe.execute()
    use: dict[str, LimitUse] = {}
    for i, limit_key in enumerate(limit_keys):
        name = limit_name(limit_key)
        was = use.get(name, LimitUse())
        use[name] = LimitUse(was.held + counts[2 * i], was.parked + counts[2 * i + 1])
    return use


# -- rates --------------------------------------------------------------------------------------------
_RATES: dict[str, tuple[float, float]] = {}


def rate_limit(name: str, rate: float, per: float = 1.0) -> None:
    """Declare rate limit ``name`` in code: ``rate`` tokens per ``per`` seconds, shared by every worker (the
    bucket holds ``rate`` tokens). ``TASKPORT_RATE_LIMITS`` overrides it. Declaring a name again with other
    figures raises ValueError."""
    if not isinstance(name, str) or not RATE_NAME.fullmatch(name):
        raise ValueError(f"invalid rate limit name {name!r}")
    figures = _figures(name, rate, per)
    if _RATES.get(name, figures) != figures:
        raise ValueError(f"rate limit {name!r} is already declared as {_RATES[name][0]:g}/{_RATES[name][1]:g}s")
    _RATES[name] = figures


def _figures(name: str, rate: Any, per: Any) -> tuple[float, float]:
    if not isinstance(rate, int | float) or isinstance(rate, bool) or not 0 < rate < 1e9:
        raise ValueError(f"rate limit {name!r}: rate must be a positive number of tokens")
    if not isinstance(per, int | float) or isinstance(per, bool) or not 0 < per <= 86400:
        raise ValueError(f"rate limit {name!r}: per must be a positive number of seconds (at most a day)")
    return float(rate), float(per)


def rate_of(config: Config, name: str, rate: float | None = None, per: float | None = None) -> tuple[float, float]:
    """(tokens, per seconds) of rate limit ``name``: TASKPORT_RATE_LIMITS', else its :func:`rate_limit`
    declaration's, else the call's own ``rate`` and ``per`` (default 1 s). LookupError for a name declared
    nowhere and called without a rate."""
    declared = config.rate_limit_table.get(name) or _RATES.get(name)
    if declared is not None:
        return declared
    if rate is None:
        raise LookupError(f"rate limit {name!r} is declared nowhere (TASKPORT_RATE_LIMITS, rate_limit()) and the "
                          "call gives no rate")
    if not isinstance(name, str) or not RATE_NAME.fullmatch(name):
        raise ValueError(f"invalid rate limit name {name!r}")
    return _figures(name, rate, 1.0 if per is None else per)


def declared_rates(config: Config) -> dict[str, tuple[float, float]]:
    """Every declared rate limit: the code's, overridden by TASKPORT_RATE_LIMITS."""
    return {**_RATES, **config.rate_limit_table}


def deferred_job_id(task: Task) -> str:
    """The job id the promote tick queues a task under once a rate limit put it back (app.core.jobs.delayed_job_id
    of the task as it is then: the attempt its run used given back)."""
    return delayed_job_id(replace(task, attempts=max(0, task.attempts - 1)))
