"""Every Redis key name and every key lifetime rule: nothing else formats a key.

Every key starts with :data:`PREFIX`, ``{tp}:``, and that is the one hash tag any key carries: a Redis
Cluster places a key by the part between its first ``{`` and ``}``, so every taskport key lands on one
slot. A script touches a task's own keys and the shared indexes (expiry, running, stats, audit ...) in
one atomic step, and a Cluster runs a script only on keys of one slot; so the layout stays Cluster-ready
as one slot (tests/unit/test_scripts.py proves every script's keys share it). RQ's own keys (``rq:...``,
which the submit script also writes) are not Cluster-capable: RQ does not run on a Cluster. So we target
one primary; the tag keeps the door open for a Cluster without a new layout.
"""

from __future__ import annotations

from enum import StrEnum

from app.core.states import TaskStatus

PREFIX = "{tp}:"  # the one hash tag: see above


def task(task_id: str) -> str:
    """Hash: the task's status fields (the record; one HGETALL answers a status read)."""
    return f"{PREFIX}task:{task_id}"


class TaskField(StrEnum):
    """The fields of a task's hash (:func:`task`): their only home. The Lua scripts name them as ``@name``
    (rendered by :func:`app.core.scripts.build`), the store and :class:`app.core.task.Task` by these members."""

    TYPE = "type"
    MEMBER = "member"
    STATUS = "status"
    PROGRESS = "progress"  # 0-100, never goes down
    MESSAGE = "message"
    ITEMS_TOTAL = "items_total"  # the three item counts, when the processor reports items
    ITEMS_SUCCEEDED = "items_succeeded"
    ITEMS_FAILED = "items_failed"
    ERROR_CODE = "error_code"
    ERROR_MESSAGE = "error_message"
    ATTEMPTS = "attempts"  # runs started so far
    MAX_ATTEMPTS = "max_attempts"
    PRIORITY = "priority"  # the RQ queue
    CREATED_AT = "created_at"  # every time: ms since the epoch
    STARTED_AT = "started_at"
    UPDATED_AT = "updated_at"
    COMPLETED_AT = "completed_at"
    EXPIRES_AT = "expires_at"
    RUN_ID = "run_id"  # the run that holds the task while PROCESSING
    # the simple worker (its RQ name) whose run holds the task while PROCESSING, dropped with RUN_ID: where a
    # cancel's stop-job command goes and what a takeover finds a dead worker's run by (workers.worker: RQ's job
    # hash does not say so for its taskport jobs)
    WORKER = "worker"
    SEQ = "seq"  # the event sequence number, bumped by every write (see events)
    PAYLOAD_SHA256 = "payload_sha256"  # of the payload JSON, for the audit trail
    JOB = "job"  # the current RQ job id when it is not the task id (a recovery re-queued it)
    RESULT = "result"  # a short result's JSON, inline (see app.core.runstore.INLINE_RESULT_MAX)
    RESUMED = "resumed"  # runs that continued from a checkpoint (the status document's "resumed")
    CHECKPOINTS = "checkpoints"  # checkpoint writes so far (see checkpoint())
    CHECKPOINT_RUN = "checkpoint_run"  # the run that wrote the last checkpoint: its result folder holds the files
    RESUME_MARK = "resume_mark"  # CHECKPOINTS when a lost run was last resumed for free (see TaskStore.recover)
    LOST_RUNS = "lost_runs"  # runs lost since the checkpoint last advanced, each run again free (TaskStore.recover)
    RUN_AT = "run_at"  # ms: the time the submit asked the task to run at (run_at/delay); see DELAYED
    WAITING = "waiting"  # how many of the tasks it runs after (``after``) are not COMPLETED yet; gone at 0
    WAITING_FOR = "waiting_for"  # their ids, comma-separated (the status document's waiting_for); gone at 0
    DEPENDENTS = "dependents"  # '1' once a task waits on this one (see dependents()): its end is pushed on SETTLED
    STORED = "stored"  # bytes it holds that count in its member's quota (STORED_BYTES): payload, results, checkpoint
    BATCH = "batch"  # the ids of the batches it counts in, comma-separated (one, unless a batch's dedup named it)
    THEN_OF = "then_of"  # the batch whose ``then`` task it is: it waits (WAITING, WAITING_FOR) until the batch is done
    CALLBACK_URL = "callback_url"  # where its terminal events are delivered (see CALLBACKS_DUE)
    CALLBACK_EVENTS = "callback_events"  # which statuses are delivered, comma-separated
    CALLBACK_STATE = "callback_state"  # pending | delivered | failed: its latest delivery's (app.core.callbacks)
    CALLBACK_ATTEMPTS = "callback_attempts"  # that delivery's attempts so far, the successful one included
    CALLBACK_LAST_STATUS = "callback_last_status"  # the HTTP status its last attempt got ("" = no answer)
    OUTPUT_LAST = "output_last"  # the id of the last output line ever emitted (see output()); never goes down
    OUTPUT_BYTES = "output_bytes"  # bytes its output list holds now (counted in STORED, see output())
    # concurrency limits (app.core.limits): the limit key whose slot it holds, or has reserved once released
    # from that limit's line; and, while it is parked in a line, why (its status document's waiting_for)
    SLOT = "slot"
    LIMITED = "limited"
    LINE = "line"  # "<ticket> <seq> <job id>": its place in its member's line and its queue, as queued (lines)
    TRACEPARENT = "traceparent"  # the W3C traceparent of the span that submitted it, when tracing is on (tracing)


def payload(task_id: str) -> str:
    """String: the validated payload JSON, dropped when the task ends."""
    return f"{PREFIX}task:{task_id}:payload"


def result(task_id: str) -> str:
    """String: the result JSON ({"result", "failures", "error_code", "run"}) of a COMPLETED task ("run": the
    run whose result folder holds its files, when it wrote any)."""
    return f"{PREFIX}task:{task_id}:result"


def checkpoint(task_id: str) -> str:
    """String: the task's checkpoint log, one JSON line appended per checkpoint write (workers.checkpoint);
    lives as long as the task's hash, dropped when the task ends."""
    return f"{PREFIX}task:{task_id}:checkpoint"


def cursor(task_id: str) -> str:
    """String: the JSON of the cursor the task's processor saved last (``ctx.save_cursor``); as checkpoint()."""
    return f"{PREFIX}task:{task_id}:cursor"


def output(task_id: str) -> str:
    """List: the task's live output (``ctx.emit``), one element per line, oldest first, at most
    ``TASKPORT_OUTPUT_MAX_LINES`` (the oldest trimmed); line ids are positions counted from the task's
    ``OUTPUT_LAST`` (app.core.output). Lives as long as the task's hash; run again empties it."""
    return f"{PREFIX}task:{task_id}:output"


EVENTS_TAIL = ":events"  # a task's or a batch's key + this = its events channel (the scripts append it too)


def events(task_id: str) -> str:
    """Pub/sub channel: a message with the task's event sequence number on every change (``events("*")`` is
    the pattern of every task's channel)."""
    return f"{task(task_id)}{EVENTS_TAIL}"


_EVENTS_HEAD, _EVENTS_TAIL = (part.encode() for part in events("\0").split("\0"))


def events_task_id(channel: bytes) -> str | None:
    """The task id in an events channel's name (:func:`events`), None for any other name."""
    if len(channel) > len(_EVENTS_HEAD) + len(_EVENTS_TAIL) and channel.startswith(_EVENTS_HEAD) \
            and channel.endswith(_EVENTS_TAIL):
        return channel[len(_EVENTS_HEAD):-len(_EVENTS_TAIL)].decode()
    return None


def dependents(task_id: str) -> str:
    """Set: the ids of the PENDING tasks that run after this task (``after``), until it ends and the
    settle tick releases or fails each of them (workers.deferred); it lives as long as the task's hash."""
    return f"{PREFIX}dependents:{task_id}"


def batch(batch_id: str) -> str:
    """Hash: a batch's record (:class:`BatchField`), its counters kept by the transition scripts; it lives as long
    as the longest-lived of its tasks."""
    return f"{PREFIX}batch:{batch_id}"


BATCH_HEAD = batch("")  # a batch key without its id: scripts append the ids they read from a task's BATCH field


def batch_tasks(batch_id: str) -> str:
    """List: the batch's task ids in submit order (the ``tasks`` page reads it); lives as long as :func:`batch`."""
    return f"{batch(batch_id)}{TASKS_TAIL}"


TASKS_TAIL = ":tasks"


def batch_events(batch_id: str) -> str:
    """Pub/sub channel: the batch's record changed (the message is its seq)."""
    return f"{batch(batch_id)}{EVENTS_TAIL}"



class BatchField(StrEnum):
    """The fields of a batch's hash (:func:`batch`): their only home (the scripts name them as ``%name``)."""

    MEMBER = "member"
    SIZE = "size"  # its tasks (``then`` not counted)
    # how many of its tasks are in each status: the status names, lowercased (app.core.batches.count_field)
    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    PROGRESS_SUM = "progress_sum"  # the sum of its tasks' progress (an ended task counts 100)
    ITEMS_TOTAL = "items_total"  # its tasks' item counts, summed
    ITEMS_SUCCEEDED = "items_succeeded"
    ITEMS_FAILED = "items_failed"
    THEN_TASK_ID = "then_task_id"
    THEN_RELEASED = "then_released"  # "1" once the batch was done and its then task was released (once)
    CREATED_AT = "created_at"
    COMPLETED_AT = "completed_at"  # when it was last done ("" while tasks are unfinished)
    EXPIRES_AT = "expires_at"  # the latest expires_at of its tasks
    SEQ = "seq"  # bumped by every change (the events' sequence number)
    CALLBACK_URL = "callback_url"  # delivered once, when the batch is first done
    CALLBACK_FIRED = "callback_fired"  # "1" once that delivery was scheduled
    CALLBACK_STATE = "callback_state"  # as TaskField's
    CALLBACK_ATTEMPTS = "callback_attempts"
    CALLBACK_LAST_STATUS = "callback_last_status"


def call(call_id: str) -> str:
    """String (PX): the answer a script gave to one call, kept so that a repeat of the call (its reply lost)
    is answered from it instead of running again (app.core.lua.ONCE_KEY). Lives Config.call_record_ms."""
    return f"{PREFIX}call:{call_id}"


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
STORED_BYTES = f"{PREFIX}stored-bytes"  # hash: member -> bytes its tasks hold (the sum of their STORED fields)
STATS = f"{PREFIX}stats"  # hash: counters (STAT_* and STAT_ENTERED below, housekeeping_<pass>) for metrics
FAILURES = f"{PREFIX}failures"  # sorted set: recent failures scored by time, for alerting
SLOW_WARNED = f"{PREFIX}slow-warned"  # set: PROCESSING tasks already logged as slow
ALERT_SENT = f"{PREFIX}alert-sent"  # string (SET NX EX window): a failure alert went out in this window
AUDIT = f"{PREFIX}audit"  # stream: one entry per task transition, capped by TASKPORT_AUDIT_RETENTION
ORPHAN_SWEEP = f"{PREFIX}orphan-sweep"  # string: the task id the result store's orphan sweep continues after
LAYOUT = f"{PREFIX}layout"  # string: the key layout this Redis is in (app.core.layout)
DELAYED = f"{PREFIX}delayed"  # sorted set: PENDING task id scored by its run_at (ms), not queued until then
SETTLED = f"{PREFIX}settled"  # list: ended tasks whose dependents the settle tick must release or fail
# sorted set: callback deliveries to attempt, scored by when (ms). A member is "t:<task id>:<seq>:<STATUS>" (a
# task's event: its seq after the transition, the status it entered) or "b:<batch id>:0:DONE" (a batch done);
# the transition scripts add them, app.core.callbacks claims and reschedules them.
CALLBACKS_DUE = f"{PREFIX}callbacks-due"


# Fields of STATS: submits, retries and recoveries, and a counter per status a transition ends in.
STAT_SUBMITTED = "submitted"
STAT_RETRIED = "retried"
STAT_RECOVERED = "recovered"
STAT_RERUN = "rerun"  # tasks run again (POST /tasks/{id}/retry, rq-dashboard's Requeue)
STAT_INTERRUPTED = "interrupted"  # runs put back on their queue by a graceful stop (no attempt used)
STAT_RATE_DEFERRED = "rate_deferred"  # runs put back by ctx.limit, whose wait was too long (no attempt used)
STAT_RECONCILED = "reconciled"  # PENDING tasks with no job anywhere put back by the reconciler (should stay 0)
STAT_ENTERED: dict[str, str] = {
    TaskStatus.COMPLETED: "completed",
    TaskStatus.FAILED: "failed",
    TaskStatus.CANCELLED: "cancelled",
    TaskStatus.EXPIRED: "expired",
}


def housekeeping_stat(name: str) -> str:
    """The STATS field counting the runs of housekeeping pass ``name``."""
    return f"housekeeping_{name}"


def streams(member: str) -> str:
    """Sorted set: the member's open event streams (stream id scored by the ms its lease runs out)."""
    return f"{PREFIX}streams:{member}"


# ms an open stream's slot stays counted without a renewal: its web process renews every third of it,
# so a killed process's slots are dropped at most this long after it died.
STREAM_LEASE_MS = 60_000


def schedule(schedule_id: str) -> str:
    """Hash: a periodic schedule's record (:class:`ScheduleField`); it lives until it is deleted."""
    return f"{PREFIX}schedule:{schedule_id}"


def schedules(member: str) -> str:
    """Sorted set: the member's schedule ids scored by creation time (ms): its list, and its count for the cap."""
    return f"{PREFIX}schedules:{member}"


SCHEDULES_DUE = f"{PREFIX}schedules-due"  # sorted set: unpaused schedule id scored by its next fire time (ms)


class ScheduleField(StrEnum):
    """The fields of a schedule's hash (:func:`schedule`): their only home (app.core.schedule_scripts renders
    them into its Lua as ``%name``)."""

    MEMBER = "member"
    NAME = "name"
    CRON = "cron"
    TIMEZONE = "timezone"
    TASK = "task"  # JSON {"type", "payload" (validated), "priority" (null = the processor's)}
    PAUSED = "paused"  # "1" paused, "0" not
    NEXT_RUN_AT = "next_run_at"  # ms of the next fire time; "" while paused (also its score in SCHEDULES_DUE)
    LAST_RUN_AT = "last_run_at"  # ms when it last created a task ("" = never)
    LAST_TASK_ID = "last_task_id"
    CREATED_AT = "created_at"
    UPDATED_AT = "updated_at"


def delivery(delivery_id: str) -> str:
    """Hash: one callback delivery's record (its attempts, its body once built), a member of CALLBACKS_DUE
    as its id; dropped once delivered or given up (app.core.callbacks)."""
    return f"{PREFIX}delivery:{delivery_id}"


class DeliveryField(StrEnum):
    """The fields of a callback delivery's record (:func:`delivery`): their only home (app.core.callbacks renders
    them into its Lua as ``%name``). Written at its first attempt, so every retry sends what the first one sent."""

    URL = "url"  # where it goes: its target's callback URL at the first attempt
    MEMBER = "member"  # whose secret signs it
    BODY = "body"  # the JSON document sent: the status (or batch) document as it was at the first attempt
    FIRST_AT = "first_at"  # ms of the first attempt: it is retried until TASKPORT_CALLBACK_MAX_AGE after this
    ATTEMPTS = "attempts"  # attempts made so far


def housekeeping_lock(job: str) -> str:
    return f"{PREFIX}housekeeping:{job}:lock"


def all_static() -> list[str]:
    return [EXPIRY, RUNNING, MEMBERS, ACTIVE, STORED_BYTES, STATS, FAILURES, SLOW_WARNED, ALERT_SENT, AUDIT,
            ORPHAN_SWEEP, LAYOUT, SCHEDULES_DUE, DELAYED, SETTLED, CALLBACKS_DUE, PAUSED_QUEUES, JOB_CLAIMANTS,
            JOB_WAKE, UNQUEUED, TOKEN_SECRET, *LIMIT_STATIC, *BACKLOG_STATIC]


# set: the names of the RQ queues operators paused (``taskport pause QUEUE``): workers take no job from them
# (app.core.jobclaims skips them), submits still queue there; it lives until the queue is resumed
PAUSED_QUEUES = f"{PREFIX}paused-queues"


# The job claims (app.core.jobclaims): a worker takes a job by moving its id from its queue onto the worker's own
# claim list, in one script, and clears it in the pipeline that starts the job, so an id is always in a queue, a
# claim list or RQ's started registry.
def job_claims(worker: str) -> str:
    """list: the ids of the jobs worker ``worker`` (its RQ name) took and has not started yet (at most one)."""
    return f"{PREFIX}job-claims:{worker}"


JOB_CLAIMANTS = f"{PREFIX}job-claimants"  # set: the RQ names of the workers that may hold a claim list
JOB_WAKE = f"{PREFIX}job-wake"  # list of queue names, one per job queued: idle workers block on it (it holds no job)
UNQUEUED = f"{PREFIX}unqueued-since"  # hash: PENDING task id -> ms the reconciler first found it with no job


# Concurrency limits and rate limits (app.core.limits, app.core.limitscripts). A limit key names one limit of one
# type and one value of its key: "<type> <key kind>[ <value>]", e.g. "demo.sleep member acme".
LIMIT_HEAD = f"{PREFIX}limit:"  # + a limit key: the scripts build its slots and parked keys from it (below)
SLOTS_TAIL = ":slots"  # sorted set: the tasks holding (or reserved) a slot of the limit -> ms they took it
PARKED_TAIL = ":parked"  # sorted set: the tasks parked in the limit's line -> their created_at (the line's order)
LIMITS = f"{PREFIX}limits"  # hash: limit key -> its cap, while it has slots held or tasks parked
LIMIT_READY = f"{PREFIX}limit-ready"  # sorted set: a task released from a line (slot reserved) -> ms, for the tick


def limit_slots(limit_key: str) -> str:
    """Sorted set: the tasks holding a slot of ``limit_key`` (task id -> ms it took it)."""
    return f"{LIMIT_HEAD}{limit_key}{SLOTS_TAIL}"


def limit_parked(limit_key: str) -> str:
    """Sorted set: the tasks waiting for a slot of ``limit_key`` (task id -> its created_at)."""
    return f"{LIMIT_HEAD}{limit_key}{PARKED_TAIL}"


def rate_bucket(name: str) -> str:
    """String (PX): rate limit ``name``'s token bucket, as the theoretical arrival time of its next token (ms,
    GCRA); it lapses once the bucket is full again."""
    return f"{PREFIX}rate:{name}"


RATE_STATS = f"{PREFIX}rate-stats"  # hash: "<name>:<taken|waited|refused>" -> count (the rate limits' /metrics)
LIMIT_STATIC = [LIMITS, LIMIT_READY, RATE_STATS]  # the limits' fixed keys (all_static lists them)
# Fair dispatch (app.core.lines): within a queue, each member's queued job ids wait in a line of their own, and the
# members with a non-empty line wait in a ring the claim serves in turn; RQ's queue list keeps every id too (what
# ``rq info`` and rq-dashboard count), and the claim takes the chosen id out of it.
def line(queue: str, member: str) -> str:
    """list: the ids of member ``member``'s jobs queued on RQ queue ``queue``, oldest first."""
    return f"{PREFIX}line:{queue}:{member}"


def ring(queue: str) -> str:
    """list: the members with a non-empty line on ``queue``; the head is the one served next."""
    return f"{PREFIX}ring:{queue}"


def lines(queue: str) -> str:
    """hash: ``queue``'s line counters (app.core.lines.LinesField): per member the ids put in line and taken out,
    its weight; the head's takes in its turn; the queue's measured start rate."""
    return f"{PREFIX}lines:{queue}"
# string: the secret that signs read tokens (app.web.tokens) when TASKPORT_TOKEN_SECRET is unset: written once (SET NX)
# by the first web process that needs it, replaced by `taskport tokens rotate`; it never expires
TOKEN_SECRET = f"{PREFIX}token-secret"

# sorted set: the PENDING tasks that wait for other tasks (``after``, or a batch's ``then``: TaskField.WAITING) ->
# the ms they began waiting. Kept by the scripts that set or clear WAITING (create, release, a batch done, run
# again) and by every transition out of PENDING; only /metrics reads it (app.core.backlog: one ZCARD).
WAITING = f"{PREFIX}waiting"
BACKLOG_STATIC = [WAITING]  # the backlog's fixed keys (all_static lists them)
