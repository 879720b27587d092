"""What waits, as autoscalers and operators read it: the age of each RQ queue's oldest waiting job, the tasks that
wait for their time or for other tasks, and the callback deliveries due; one read-only script, so /metrics pays
one round trip for all of it (app.web.metrics.BacklogCollector).

**The oldest age.** Fair dispatch (app.core.lines) takes jobs from the members' lines and leaves RQ's queue list
in submit order, taking the chosen id out of it, so the head of that list is the queue's oldest waiting job. Its
age is now (Redis's clock) less the job's ``enqueued_at``: when it was put on the queue, not when the task was
created, so a task that waited for its ``run_at``, for other tasks or for a concurrency slot counts from the moment
it could start. A cancel takes its job out of the list (app.core.jobs.JobQueue.remove) after the transition, so a
job whose task is no longer PENDING can sit at the head only until a worker passes over it, or for good when the
web process died between the two steps. Such a job waits for nothing: the script passes over up to :data:`SCAN`
of them from the head, to the first job whose task is PENDING; a queue with nothing else reads 0 and never grows.
If all :data:`SCAN` ids it looked at are passed over and more follow, it reads the last one's age: more than the
oldest live job's (they are younger), never 0 while jobs may wait behind.

**Waiting.** ``keys.DELAYED`` holds the tasks waiting for their time (a ``run_at``, a retry's backoff; a then task
released, due now, until the next tick), ``keys.WAITING`` those waiting for other tasks (``after``, a batch's
``then``). Tasks parked in a concurrency limit's line are ``taskport_concurrency_parked`` (app.core.limits.in_use).
``keys.CALLBACKS_DUE`` holds the deliveries to attempt: due now, or later (a retry's backoff).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC
from typing import Any, cast

import redis
from rq.job import Job
from rq.queue import Queue
from rq.utils import as_text, utcparse

from app.core import keys
from app.core.lua import render
from app.core.states import QUEUES

SCAN = 16  # ids the script looks at from a queue's head for one whose task is PENDING

BACKLOG = """
local queues, queue_head, job_head, task_head = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local scan = tonumber(ARGV[5])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local out = {now}
for name in string.gmatch(queues, '%S+') do
  local ids, found = redis.call('LRANGE', queue_head .. name, 0, scan - 1), nil
  for _, id in ipairs(ids) do
    local task = task_head .. string.match(id, '^[^_]+')  -- app.core.jobs.task_of_job
    if redis.call('HGET', task, @status) == $PENDING then found = id break end
  end
  if not found and #ids == scan and redis.call('LLEN', queue_head .. name) > scan then found = ids[scan] end
  out[#out + 1] = found and redis.call('HGET', job_head .. found, 'enqueued_at') or ''
end
out[#out + 1] = redis.call('ZCARD', KEYS[1])
out[#out + 1] = redis.call('ZCARD', KEYS[2])
out[#out + 1] = redis.call('ZCOUNT', KEYS[3], '-inf', now)
out[#out + 1] = redis.call('ZCARD', KEYS[3])
return out
"""

# It only reads: declared so, a replica and a server refusing writes (OOM) still answer it (as lines.PLACE).
BACKLOG_SOURCE = "#!lua flags=no-writes\n" + render(BACKLOG)


@dataclass(frozen=True)
class Backlog:
    """What waits now: per queue the oldest waiting job's age in seconds (0: none), the tasks waiting for their
    time (``delayed``) and for other tasks (``after``), the callback deliveries due now and due later."""

    oldest_age: dict[str, float]
    delayed: int
    after: int
    callbacks_due_now: int
    callbacks_due_later: int


def read(conn: redis.Redis) -> Backlog:
    """The backlog, in one round trip (redis-py's Script: EVALSHA, loaded again on NOSCRIPT, as every script)."""
    script = conn.register_script(BACKLOG_SOURCE)
    answer = script(keys=[keys.DELAYED, keys.WAITING, keys.CALLBACKS_DUE],
                    args=[" ".join(QUEUES), Queue.redis_queue_namespace_prefix, Job.redis_job_namespace_prefix,
                          keys.task(""), SCAN])
    return decode(cast(list[Any], answer))


def decode(answer: list[Any]) -> Backlog:
    """A BACKLOG answer as a :class:`Backlog` (``enqueued_at`` is RQ's ``utcformat``; a job's clock ahead of
    Redis's reads 0, not a negative age)."""
    now_ms, rest = int(answer[0]), answer[1:]
    ages: dict[str, float] = {}
    for name, enqueued in zip(QUEUES, rest, strict=False):
        text = as_text(enqueued) if enqueued else ""
        at = utcparse(text) if text else None
        at_ms = (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() * 1000 if at else now_ms
        ages[name] = max(0.0, (now_ms - at_ms) / 1000)
    delayed, after, due_now, due_all = (int(n) for n in rest[len(QUEUES):])
    return Backlog(ages, delayed, after, due_now, due_all - due_now)
