"""The Lua scripts: every task state change is one of these, so it is one atomic compare-and-set.

Each script names the status it expects; if the task is elsewhere it writes nothing and answers
with the status it found. Keys arrive in KEYS[] (built by app.core.keys), never built in Lua (one exception:
SUBMIT reads the hash of the task holding a dedup key, whose id it learns only then).

Each script is a :class:`~app.core.lua.Script`: a table naming its KEYS and ARGV in order with a line on
each, rendered into the Lua as a preamble and used to build every call; its body spells no position, no
status, no field and no counter, only markers (app.core.lua).
"""

from __future__ import annotations

from rq.command import PUBSUB_CHANNEL_TEMPLATE

from app.core.batchscripts import BATCH, SYNC
from app.core.config import Config
from app.core.creation import CREATE, QUOTA, SIBLING
from app.core.jobs import job_templates
from app.core.limitscripts import LIMIT_KEYS, LIMITS, OWN_TASK
from app.core.limitscripts import SCRIPTS as LIMIT_SCRIPTS
from app.core.lua import LATE, Script, Tail, render
from app.core.outputscripts import EMIT
from app.core.runscripts import BATCH_HEAD, FORGET_RUN, PROGRESS, START, STORED_BYTES
from app.core.states import CallbackState
from app.core.waitscripts import REPLAY
from app.core.waitscripts import SCRIPTS as WAIT_SCRIPTS

_WAITING_TASKS = "sorted set: PENDING tasks waiting for other tasks -> ms they began (keys.WAITING)"

# The audit trail, one fragment for every script that changes a task's status: each calls audit(task key,
# id, the status it left ('' at submit)) once after its writes, so a transition and its audit entry are one
# atomic step. build() puts it between a script's preamble (it writes to AUDIT_STREAM) and its body, with
# the retention rendered in. The entry's fields (audit.EntryField) are read from the hash after the change,
# so it says what the task became; its id is the time (ms). The payload's digest goes only into the entries
# that make the task PENDING (submit, run again, a retry's requeue): the payload the next run takes, which
# no later transition changes ('' elsewhere keeps every entry's fields the same, so the stream stores
# their names once per node; the digest in every entry cost memory: bench/README.md). Trimmed with
# MAXLEN ~ (entries) on every entry, cheap (whole stream nodes); 0 = no limit of that kind. The trim by age (MINID
# ~, with a TIME to know the age) is not written per entry: housekeeping's expiry pass runs it
# (workers.housekeeping.Housekeeper.trim_audit), and the batch create, which writes many entries, runs it once at
# its end (``audit_trim``). Two commands a transition, four a delivery (bench/README.md, "A delivery, command by
# command"). A script that has just written the hash's fields passes their values (member, type, status, error
# code, attempts, payload digest: the HMGET of ``audit``) to ``audit_entry(id, from, values)`` instead of reading
# them back (START and TRANSITION, from their first HMGET), or to ``audit_values(id, from, member, ...)`` with no
# table (the create: app.core.creation). The XADD's head (MAXLEN ~ or not) is rendered in by build().
AUDIT = """
local function audit_trim()
  local max_age_ms = __AUDIT_MAX_AGE_MS__
  if max_age_ms > 0 then
    local t = redis.call('TIME')
    local oldest = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - max_age_ms
    redis.call('XTRIM', audit_stream, 'MINID', '~', string.format('%d', oldest))
  end
end
local function audit_values(id, from, member, kind, to, code, attempt, digest)  -- the entry, no table built
  to = to or ''
  redis.call(__AUDIT_XADD__, !task, id, !member, member or '', !type, kind or '', !from, from, !to, to,
             !code, code or '', !attempt, attempt or '0', !payload, to == $PENDING and (digest or '') or '')
end
local function audit_entry(id, from, h)
  audit_values(id, from, h[1], h[2], h[3], h[4], h[5], h[6])
end
local function audit(task_key, id, from)
  audit_values(id, from, unpack(redis.call('HMGET', task_key, @member, @type, @status, @error_code, @attempts,
                                           @payload_sha256)))  -- in audit_values's order
end
"""

# Create a task unless the member's dedup key is held or the member is at its cap of unfinished tasks,
# and queue its RQ job in the same step. Atomic so that N concurrent identical submits create exactly one
# task, so that N concurrent submits never take a member past its cap, and so that a task and its job
# reach Redis (and its append-only file) together or not at all; a duplicate or a refusal queues nothing.
# The count in active goes up here and down in TRANSITION when a task leaves PENDING/PROCESSING for good,
# so the check is one HGET. The job's commands are RQ's own enqueue (JobQueue.job_commands, through
# replay()), each on one key: the n-th acts on command_keys[n]. A duplicate's holder hash is the one key
# not passed in (its id is known only once the dedup key is read): the new task's name with the holder's
# id in place of the new one, so a duplicate costs the same one round trip as a new task.
# Safe twice by construction: the same call again finds its own task (holding the dedup key, or existing once the
# key lapsed) and answers as it did, without a call record (a key less per submit). A repeat comes within
# Config.call_record_ms of the first call (the time every script's call record is kept for the same reason), so with
# a dedup window at least that long (the default: 300 s against 124 s) the key the first call set is still there,
# and a call that finds no key is a first call: it looks for its own task (EXISTS) only when the window is shorter
# (``lapse_check``).
# Returns {1, ended dep or '', waiting ids} when created, {0, holder_id, the holder's HGETALL (empty once it is
# gone)} for a duplicate, {2, unfinished_count} at the cap, {3, bytes_held} when its payload would take the member
# past its quota of stored bytes (keys.STORED_BYTES, kept by every script that changes what a task holds:
# app.core.creation.QUOTA).
# The first job of each queue, RQ's own enqueue as a Lua table (app.core.jobs.JobTemplate.lua: RQ's words, not
# taskport's markers), filled in by the call's job_ arguments: ~5 arguments a submit instead of ~59.
JOB_TEMPLATES = job_templates("job_queue", "job", {
    "id": "task_id", "member": "member", "at": "job_at", "data": "job_data", "timeout": "job_timeout",
    "weight": "job_weight"})
SUBMIT = Script(
    "submit",
    keys={
        "dedup": "string: the id of the task holding the member's dedup key (set here, for the dedup window)",
        "task": "hash: the new task's record",
        "payload": "string: the new task's payload JSON",
        "history": "sorted set: the member's task ids by creation time",
        "expiry": "sorted set: the expiry index (the task's deadline)",
        "members": "set: every member with a history",
        "stats": "hash: the counters (submitted)",
        "active": "hash: member -> its unfinished tasks (the cap's count)",
        "stored_bytes": STORED_BYTES,
        "delayed": "sorted set: PENDING task id -> run_at (a task whose run_at is ahead waits here, unqueued)",
        "settled": "list: ended tasks whose dependents are to be released or failed (workers.deferred)",
        "waiting_tasks": _WAITING_TASKS,
    },
    args={
        "task_id": "the new task's id",
        "dedup_window_s": "the dedup key's lifetime",
        "key_ttl_s": "the task's keys' lifetime",
        "created_ms": "now, the creation time",
        "expiry_ms": "when housekeeping must act on the task (its deadline)",
        "payload_json": "the validated payload",
        "member": "the member submitting",
        "cap": "unfinished tasks the member may hold (0 = no cap)",
        "bytes_cap": "bytes the member's tasks may hold (0 = no quota)",
        "job_argc": "how many ARGV entries the job's commands take",
        "run_at_ms": "when the task is due, if ahead: it waits in delayed instead of being queued ('' = now)",
        "after_ids": "the tasks it runs after, comma-separated ('' = none)",
        "job_queue": "the queue of its first job, whose template (app.core.jobs.TEMPLATES) is in the script: the call "
                     "sends what differs (the job_ args); '' = the job's commands are in the tail, or it has none",
        "job_at": "RQ's time, its job's created_at and enqueued_at (app.core.jobs.rq_now)",
        "job_data": "RQ's data of its job (the call to run, compressed)",
        "job_timeout": "its job's timeout, seconds",
        "job_weight": "its member's weight in fair dispatch (app.core.lines)",
        "lapse_check": "'1' when the dedup key may lapse before a repeat of this call comes (the dedup window is "
                       "shorter than Config.call_record_ms): a call that finds no key looks for its own task; '' = "
                       "the key outlives any repeat, so finding none is proof enough (no EXISTS)",
    },
    rest_keys=Tail("command_keys", "per task of after_ids its hash and its dependents set, then one key per job "
                                   "command, in order"),
    rest=Tail("command", "the job's commands (name, argc, args... each; job_argc entries in all), then the task "
                         "hash's field, value pairs"),
    body=REPLAY + SIBLING + CREATE + """
local holder_id = redis.call('GET', dedup)
if holder_id == task_id or (not holder_id and lapse_check ~= '' and redis.call('EXISTS', task) == 1) then
  -- this call again (its answer lost; its dedup key may have lapsed since): answered as the first time was,
  -- from what it wrote (the tasks it still waits for; the first of them that ended otherwise)
  local waiting, ended, open = redis.call('HGET', task, @waiting_for) or '', '', $ACTIVE
  for dep in string.gmatch(waiting, '[^,]+') do
    if ended == '' and not open[redis.call('HGET', sibling(task, task_id, dep), @status)] then ended = dep end
  end
  return {1, ended, waiting}
end
if holder_id then
  local holder = sibling(task, task_id, holder_id)
  return {0, holder_id, redis.call('HGETALL', holder)}
end
local limit, bytes_limit = tonumber(cap), tonumber(bytes_cap)  -- 0 = off: nothing to read
if limit > 0 then
  local unfinished = tonumber(redis.call('HGET', active, member) or '0')
  if unfinished >= limit then return {2, unfinished} end
end
if bytes_limit > 0 then
  local held = tonumber(redis.call('HGET', stored_bytes, member) or '0')
  if held + #payload_json > bytes_limit then return {3, held} end
end
local first_field = first_command + tonumber(job_argc)
local job = nil  -- its first job's commands from its queue's template, when the call names one
__JOB_TEMPLATES__
local ended, waiting = create({id = task_id, task = task, payload = payload, dedup = dedup, fields_from = first_field,
  key_ttl = key_ttl_s, expiry_ms = expiry_ms, payload_json = payload_json, run_at = run_at_ms,
  after_ids = after_ids, k = 1, job = job, job_from = job and 1 or first_command,
  job_to = job and #job + 1 or first_field})
return {1, ended, waiting}
""".replace("__JOB_TEMPLATES__", JOB_TEMPLATES))

# Every other transition: expected status(es) -> new status, with its side effects in one step.
# Leaving PENDING/PROCESSING ($ACTIVE) for any other status counts the task off its member's unfinished
# tasks (once: the expected-status check lets only one transition out). Every transition ends the current
# run: its run_id is dropped. Past the task's expires_at only the move to EXPIRED is allowed (readers
# already see EXPIRED; it is final): anything else answers EXPIRED.
# Returns {1, previous_status} when written, {0, current_status} otherwise.
TRANSITION = Script(
    "transition",
    once=LATE,
    keys={
        "task": "hash: the task's record",
        "payload": "string: the task's payload JSON (dropped with drop)",
        "result": "string: the task's result JSON, when not inline",
        "running": "sorted set: PROCESSING task id -> last heartbeat (the task leaves it)",
        "expiry": "sorted set: the expiry index",
        "events": "channel: the task's events (the sequence number)",
        "stats": "hash: the counters (stat)",
        "failures": "sorted set: recent failures by time",
        "active": "hash: member -> its unfinished tasks (see SUBMIT)",
        "checkpoint": "string: the task's checkpoint log (dropped with the payload)",
        "cursor": "string: the processor's cursor (dropped with the payload)",
        "output": "list: the task's live output (its lifetime follows the hash's; dropped with 'all')",
        "delayed": "sorted set: PENDING task id -> run_at (a task leaving PENDING leaves it)",
        "settled": "list: ended tasks whose dependents are to be released or failed (the task, when it has any)",
        "callbacks_due": "sorted set: callback deliveries to attempt (the task's, when it has a callback for the "
                         "status it enters; its batch's, when this ends the batch)",
        "waiting_tasks": _WAITING_TASKS + " (a task leaving PENDING leaves it; its batch's then task, released)",
        "batch_head": BATCH_HEAD,
        "stored_bytes": STORED_BYTES,
        **LIMIT_KEYS,
    },
    args={
        "expected": "the status(es) the task must be in (comma list)",
        "run_id": "the run that must hold the task ('' = any run)",
        "new_status": "the status it moves to",
        "key_ttl_s": "the task hash's new lifetime ('' = keep)",
        "expiry_ms": "its new time in the expiry index ('' = leave the index)",
        "result_json": "a result for a key of its own ('' = none, or inline in the hash's 'result' field)",
        "result_ttl_s": "that key's lifetime",
        "drop": "'payload' | 'all' (payload and result) | 'checkpoint' (checkpoint and cursor: the payload stays "
                "as long as the hash, for a run again) | ''",
        "stale_before_ms": "'' = no check; else the heartbeat must be older (a recovery never takes a live task)",
        "now_ms": "now",
        "stat": "the stats counter to count ('' = none)",
        "task_id": "the task's id",
        "refund": "'1' = give back the attempt the run used (an interruption is not a retry) | ''",
        "waiting_on": "'' = no check; else a task the task must still wait for (``after``: its -6 is decided once)",
        "job_argc": "how many ARGV entries the commands that queue its job take (0 = none: only a move back to "
                    "PENDING queues one, and only when the compare-and-set won)",
        "run_at_ms": "'' = none; else the task (moving to PENDING) waits in delayed until then: a retry's backoff",
    },
    rest_keys=Tail("command_keys", "one key per job command, in order"),
    rest=Tail("command", "the job's commands (name, argc, args... each; job_argc entries in all), then the task "
                         "hash's field, value pairs to write"),
    body=REPLAY + SYNC + QUOTA + OWN_TASK + LIMITS + """
local first_field = first_command + tonumber(job_argc)
local cur = redis.call('HMGET', task, @status, @run_id, @expires_at, @dependents, @waiting_for, @batch,
                       @callback_url, @callback_events, @stored, @member, @slot, @seq, @type, @error_code,
                       @attempts, @payload_sha256, @output_bytes, @checkpoints, @worker, @job)
local status = cur[1]
if not status then return {0, ''} end
local ok = false
for s in string.gmatch(expected, '[^,]+') do if s == status then ok = true end end
if not ok or (run_id ~= '' and cur[2] ~= run_id) then return {0, status} end
if waiting_on ~= '' and not string.find(',' .. (cur[5] or '') .. ',', ',' .. waiting_on .. ',', 1, true) then
  return {0, status}
end
if new_status ~= $EXPIRED and (tonumber(cur[3]) or math.huge) <= tonumber(now_ms) then return {0, $EXPIRED} end
if stale_before_ms ~= '' then
  local beat = redis.call('ZSCORE', running, task_id)
  if beat and tonumber(beat) > tonumber(stale_before_ms) then return {0, status} end
end
local before = cur[6] and batch_state(task)
local pairs_in, written = {unpack(ARGV, first_field)}, {}  -- the fields this call writes: the audit's and quota's
for i = 1, #pairs_in - 1, 2 do written[pairs_in[i]] = pairs_in[i + 1] end
local unfinished = $ACTIVE
-- what the task will hold (QUOTA's held_bytes after this call's writes), from what this call knows instead of a
-- length per key: what it writes or drops, and the output's count. A result (a key, or the inline field) is
-- written only by the transition out of PROCESSING that completes a task and dropped by a run again (RERUN), so
-- a task leaving an unfinished status has none but what this call writes; a key this call neither writes nor
-- drops keeps its length, read here, before the writes
local inline = written[@result]
if drop == 'all' or (not inline and unfinished[status]) then inline = '' end
local held = inline and #inline or redis.call('HSTRLEN', task, @result)
if drop ~= 'all' then held = held + (tonumber(cur[17]) or 0) end
if drop ~= 'payload' and drop ~= 'all' then held = held + redis.call('STRLEN', payload) end
if result_json ~= '' then held = held + #result_json
elseif drop ~= 'all' and not unfinished[status] then held = held + redis.call('STRLEN', result) end
if drop == '' and cur[18] then held = held + redis.call('STRLEN', checkpoint) + redis.call('STRLEN', cursor) end
local held_before = tonumber(cur[9]) or 0
local seq = (tonumber(cur[12]) or 0) + 1
local fields = {@status, new_status, @seq, seq}  -- seq, stored bytes and a refund in the one HSET (bench/README.md)
for _, v in ipairs(pairs_in) do fields[#fields + 1] = v end
if held ~= held_before and cur[10] then fields[#fields + 1], fields[#fields + 2] = @stored, held end
if refund ~= '' then  -- the attempt the run used, given back
  fields[#fields + 1], fields[#fields + 2] = @attempts, (tonumber(written[@attempts] or cur[15]) or 0) - 1
end
redis.call('HSET', task, unpack(fields))
-- the run ends; a run that ends its task also drops the task's place in line, kept for nothing after its take
-- (~50 bytes of every finished task: a rerun puts the task in line again)
if status == $PROCESSING and not unfinished[new_status] then redis.call('HDEL', task, @run_id, @worker, @line)
else redis.call('HDEL', task, @run_id, @worker) end
if cur[19] and new_status == $CANCELLED then
  -- a simple worker's run cancelled: RQ's stop-job command to that worker in the same step (RQ's
  -- send_stop_job_command finds no worker_name in the job hash of a simple worker's run: workers.worker)
  redis.call('PUBLISH', '__STOP_CHANNEL__' .. cur[19],
             cjson.encode({command = 'stop-job', job_id = cur[20] or task_id}))
end
if cur[11] then  -- its concurrency slot (or its place in a limit's line) goes, and the line moves on
  redis.call('HDEL', task, @slot, @limited)
  limit_leave(cur[11], task_id, tonumber(now_ms))
end
if key_ttl_s ~= '' then redis.call('EXPIRE', task, key_ttl_s) end
-- the output lives as long as the task; only EMIT makes it, setting @output_bytes with it (none: no list)
if key_ttl_s ~= '' and cur[17] then redis.call('EXPIRE', output, key_ttl_s) end
redis.call('ZREM', running, task_id)
if expiry_ms ~= '' then redis.call('ZADD', expiry, expiry_ms, task_id) end
if result_json ~= '' then redis.call('SET', result, result_json, 'EX', result_ttl_s) end
-- the checkpoint log and cursor exist only when @checkpoints counts PROGRESS's writes of them (RERUN drops all
-- three together): a run that saved none has none to delete (bench/README.md, a delivery's commands)
if drop == 'payload' or drop == 'all' then
  if cur[18] then redis.call('DEL', payload, checkpoint, cursor) else redis.call('DEL', payload) end
end
if drop == 'checkpoint' then
  if cur[18] then redis.call('DEL', checkpoint, cursor) end
  if key_ttl_s ~= '' then redis.call('EXPIRE', payload, key_ttl_s) end
end
if drop == 'all' then
  redis.call('DEL', result)
  redis.call('HDEL', task, @result)
end
if drop == 'all' then  -- the tombstone keeps no output (held_bytes counts @output_bytes)
  redis.call('DEL', output)
  redis.call('HDEL', task, @output_bytes)
end
if stat ~= '' then redis.call('HINCRBY', stats, stat, 1) end
if new_status == $FAILED then redis.call('ZADD', failures, now_ms, task_id) end
if unfinished[status] and not unfinished[new_status] then
  local member = cur[10]
  if member and redis.call('HINCRBY', active, member, -1) <= 0 then redis.call('HDEL', active, member) end
  if cur[4] then redis.call('LPUSH', settled, task_id) end  -- the tasks that run after it learn of its end
end
if status == $PENDING then  -- it leaves PENDING (a move to PENDING comes from PROCESSING): it waits no more
  redis.call('ZREM', delayed, task_id)
  redis.call('ZREM', waiting_tasks, task_id)
end
if run_at_ms ~= '' then redis.call('ZADD', delayed, run_at_ms, task_id) end
replay(first_command, first_field, 1)
if held ~= held_before and cur[10] then account_member(cur[10], held_before, held) end  -- @stored: in the HSET above
if cur[7] and string.find(',' .. (cur[8] or '') .. ',', ',' .. new_status .. ',', 1, true) then
  redis.call('HSET', task, @callback_state, '__CALLBACK_PENDING__', @callback_attempts, 0, @callback_last_status, '')
  redis.call('ZADD', callbacks_due, now_ms, 't:' .. task_id .. ':' .. seq .. ':' .. new_status)
end
redis.call('PUBLISH', events, seq)
batch_sync(task, task_id, before, now_ms, {delayed = delayed, due = callbacks_due, waiting = waiting_tasks})
local attempts = written[@attempts] or cur[15]
if refund ~= '' then attempts = fields[#fields] end
audit_entry(task_id, status, {written[@member] or cur[10], written[@type] or cur[13], new_status,
                              written[@error_code] or cur[14], attempts, written[@payload_sha256] or cur[16]})
return {1, status}
""".replace("__CALLBACK_PENDING__", CallbackState.PENDING).replace("__STOP_CHANNEL__", PUBSUB_CHANNEL_TEMPLATE % ""))

# Run a FAILED or CANCELLED task again (POST /tasks/{id}/retry): the same task back to PENDING and its RQ job
# queued as job_id (its commands replayed as in SUBMIT), in one step, so the task is never PENDING without a
# job nor queued twice (a second retry finds PENDING). The failed run's outcome goes (error, result, items,
# progress, checkpoint, cursor, times, any run_at/waiting of its submit: it runs now, except a batch's then task
# whose batch still runs, which waits for it again as at its create); attempts keeps counting,
# and max_attempts becomes attempts + budget, so the new run has a fresh budget of automatic retries. Its
# lifetime starts again as a new task's (expiry_ms, key_ttl_s; the payload's too), and it counts again in
# active, within the member's cap as a submit does. Refused past expires_at (EXPIRED to every reader) and
# when the payload is gone (a task that ended before its payload was kept).
# Returns {1, HGETALL after} when done, {0, status found ('' gone), or EXPIRED / MISSING_PAYLOAD}, or
# {2, unfinished_count} at the cap.
RERUN = Script(
    "rerun",
    once=LATE,
    keys={
        "task": "hash: the task's record",
        "payload": "string: the task's payload JSON (kept since it failed or was cancelled)",
        "result": "string: a result JSON of its own (dropped)",
        "checkpoint": "string: the checkpoint log (dropped)",
        "cursor": "string: the processor's cursor (dropped)",
        "output": "list: the task's live output (dropped: the new run's lines follow, their ids still going up)",
        "expiry": "sorted set: the expiry index (the task's new deadline)",
        "delayed": "sorted set: tasks waiting for their run_at (the task leaves it: it runs now)",
        "waiting_tasks": _WAITING_TASKS + " (the task leaves it, or joins it again: a then task whose batch runs)",
        "events": "channel: the task's events",
        "stats": "hash: the counters (stat)",
        "active": "hash: member -> its unfinished tasks (see SUBMIT)",
        "batch_head": BATCH_HEAD,
        "stored_bytes": STORED_BYTES,
    },
    args={
        "expected": "the statuses a task may be run again from (comma list)",
        "task_id": "the task's id",
        "now_ms": "now",
        "expiry_ms": "its new deadline (now + the task TTL)",
        "key_ttl_s": "its keys' new lifetime",
        "message": "the status document's message",
        "budget": "runs the new run may take, automatic retries included (its processor's retries + 1)",
        "job_id": "the RQ job id it is queued under (recorded as its job)",
        "cap": "unfinished tasks the member may hold (0 = no cap)",
        "stat": "the stats counter to count",
        "job_argc": "how many ARGV entries the job's commands take",
    },
    rest_keys=Tail("command_keys", "one key per job command, in order"),
    rest=Tail("command", "the job's commands (name, argc, args... each; job_argc entries in all)"),
    body=REPLAY + SYNC + QUOTA + """
local cur = redis.call('HMGET', task, @status, @expires_at, @member, @attempts, @batch, @stored, @then_of)
local status, member = cur[1], cur[3]
if not status then return {0, ''} end
local ok = false
for s in string.gmatch(expected, '[^,]+') do if s == status then ok = true end end
if not ok then return {0, status} end
if (tonumber(cur[2]) or math.huge) <= tonumber(now_ms) then return {0, $EXPIRED} end
if redis.call('EXISTS', payload) == 0 then return {0, $MISSING_PAYLOAD} end
local limit = tonumber(cap)
local unfinished = tonumber(redis.call('HGET', active, member) or '0')
if limit > 0 and unfinished >= limit then return {2, unfinished} end
local before = cur[5] and batch_state(task)
redis.call('HDEL', task, @error_code, @error_message, @result, @items_total, @items_succeeded, @items_failed,
           @started_at, @completed_at, @run_id, @checkpoints, @checkpoint_run, @resume_mark, @run_at, @waiting,
           @waiting_for)
redis.call('HSET', task, @status, $PENDING, @progress, 0, @message, message, @updated_at, now_ms,
           @expires_at, expiry_ms, @max_attempts, (tonumber(cur[4]) or 0) + tonumber(budget), @job, job_id)
redis.call('DEL', result, checkpoint, cursor)
redis.call('DEL', output)  -- run again starts afresh: @output_last stays, so line ids never repeat
redis.call('HDEL', task, @output_bytes)
redis.call('EXPIRE', task, key_ttl_s)
redis.call('EXPIRE', payload, key_ttl_s)
redis.call('ZADD', expiry, expiry_ms, task_id)
redis.call('ZREM', delayed, task_id)
redis.call('ZREM', waiting_tasks, task_id)
redis.call('HINCRBY', stats, stat, 1)
redis.call('HINCRBY', active, member, 1)
account(task, member, cur[6], held_bytes(task, {payload, result, checkpoint, cursor}))
local batch_of_then = cur[7] and (batch_head .. cur[7])
if batch_of_then and redis.call('EXISTS', batch_of_then) == 1
    and redis.call('HGET', batch_of_then, %then_released) ~= '1' then
  -- a then task whose batch still runs: back to waiting for it, released (once) when the batch ends
  redis.call('HSET', task, @waiting, 1, @waiting_for, cur[7])
  redis.call('ZADD', waiting_tasks, now_ms, task_id)
  redis.call('HDEL', task, @job)  -- queued under its own id when released (app.core.jobs.delayed_job_id)
else
  replay(first_command, first_command + tonumber(job_argc), 1)
end
local seq = redis.call('HINCRBY', task, @seq, 1)
redis.call('PUBLISH', events, seq)
batch_sync(task, task_id, before, now_ms, nil)
audit(task, task_id, status)
return {1, redis.call('HGETALL', task)}
""")

SCRIPTS = {s.name: s for s in (SUBMIT, START, PROGRESS, TRANSITION, RERUN, BATCH, FORGET_RUN, EMIT, *WAIT_SCRIPTS,
                                *LIMIT_SCRIPTS)}
# The scripts as Redis runs them (preamble, markers rendered), without the audit fragment: build() adds it.
SOURCES = {name: script.source() for name, script in SCRIPTS.items()}


def build(max_entries: int, max_age_s: int) -> dict[str, str]:
    """Every script with the audit fragment after its preamble, its retention rendered in (0 = no such limit)."""
    # the XADD's head, trimmed by MAXLEN ~ or not, chosen here rather than per call
    xadd = "'XADD', audit_stream, " + (f"'MAXLEN', '~', {int(max_entries)}, " if max_entries > 0 else "") + "'*'"
    fragment = render(AUDIT).replace("__AUDIT_XADD__", xadd)
    fragment = fragment.replace("__AUDIT_MAX_AGE_MS__", str(int(max_age_s) * 1000))
    return {name: script.source(fragment) for name, script in SCRIPTS.items()}


ALL = build(*Config().audit_limits)  # with the default retention; TaskStore builds its own from its Config
