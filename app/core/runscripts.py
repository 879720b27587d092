"""The Lua scripts of a run's own writes: START takes the task for one delivery of its job, PROGRESS reports
the run's progress, heartbeat and checkpoint, and FORGET_RUN drops a task that is not PROCESSING from the running
index (the recovery pass's cleanup). Each is one compare-and-set, like those of app.core.scripts (which lists
them with its own, so every TaskStore loads them, and renders the audit fragment into them); the run's end is
that module's TRANSITION.
"""

from __future__ import annotations

from app.core.batchscripts import SYNC
from app.core.creation import QUOTA
from app.core.limitscripts import LIMIT_KEYS, LIMITS, OWN_TASK
from app.core.lua import FIRST, LATE, Script

# Two keys' lines, shared with app.core.scripts' SUBMIT, TRANSITION and RERUN.
STORED_BYTES = "hash: member -> bytes its tasks hold (payloads, results, checkpoints: TaskField.STORED summed)"
BATCH_HEAD = "a batch key without its id (keys.BATCH_HEAD): the task's batches' keys are built from it (batchscripts)"

# PENDING -> PROCESSING for one delivery of the job: a second delivery finds PROCESSING and does nothing,
# but the same run sending its start again (its answer lost) gets the same answer, so a run is not lost.
# A task past its expires_at is EXPIRED to every reader already, so it never starts (EXPIRED is final).
# A run that finds a checkpoint resumes from it, and counts in @resumed. The checkpoint log and cursor are read
# only when @checkpoints says PROGRESS wrote some (two reads fewer a delivery: bench/README.md).
# A task of a type with a concurrency limit (concurrency: app.core.limits.concurrency_spec) takes a slot of its
# limit key in the same step, or is parked in the limit's line instead: still PENDING, its job dropped by the
# worker, @limited saying why (app.core.limitscripts); a repeat finds it parked and answers alike.
# Returns {1, payload_json, HGETALL, checkpoint log or nil, cursor or nil} when started, {0, current_status}
# otherwise, {2, why} when parked.
START = Script(
    "start",
    keys={"task": "hash: the task's record", "payload": "string: the task's payload JSON (answered)",
          "running": "sorted set: PROCESSING task id -> last heartbeat", "events": "channel: the task's events",
          "checkpoint": "string: the task's checkpoint log (answered)", "cursor": "string: its cursor (answered)",
          "batch_head": BATCH_HEAD, **LIMIT_KEYS},
    args={"run_id": "the run taking the task", "now_ms": "now", "task_id": "the task's id",
          "concurrency": "the concurrency limits, type=N/key;... ('' = none)",
          "stall_ms": "the stall timeout (ms): a slot holder's heartbeat older than it lapses",
          "worker": "the simple worker's RQ name, written as @worker ('' = none: a fork or spawn worker's run, whose "
                    "job hash names its worker as RQ writes it)"},
    body=SYNC + OWN_TASK + LIMITS + """
-- the whole document, read once: the answer is it with this start's writes (no HGETALL after them: bench/README.md)
local doc = redis.call('HGETALL', task)
local at = {}
for i = 1, #doc, 2 do at[doc[i]] = doc[i + 1] end
local cur = {at[@status], at[@expires_at], at[@run_id], at[@batch], at[@attempts], at[@seq], at[@resumed], at[@type],
             at[@member], at[@created_at], at[@limited], at[@started_at], at[@checkpoints], at[@error_code],
             at[@payload_sha256]}
local status = cur[1]
if status == $PROCESSING and cur[3] == run_id then
  -- this run's own start again (its answer was lost to a Redis restart and the client sent it once more)
  return {1, redis.call('GET', payload), redis.call('HGETALL', task), redis.call('GET', checkpoint),
          redis.call('GET', cursor)}
end
if status ~= $PENDING then return {0, status or ''} end
if (tonumber(cur[2]) or math.huge) <= tonumber(now_ms) then return {0, $EXPIRED} end
local payload_json = redis.call('GET', payload)
if not payload_json then return {0, $MISSING_PAYLOAD} end
local lk, cap = nil, 0
if concurrency ~= '' then lk, cap = limit_of(concurrency, cur[8], cur[9], payload_json) end
if lk then
  local why = take_slot(lk, cap, task_id, cur[10], tonumber(now_ms), tonumber(stall_ms))
  if why then
    if cur[11] ~= why then  -- newly parked, or its count changed: the document says why it waits
      redis.call('HSET', task, @slot, lk, @limited, why, @updated_at, now_ms)
      redis.call('PUBLISH', events, redis.call('HINCRBY', task, @seq, 1))
    end
    return {2, why}
  end
  redis.call('HDEL', task, @limited)
end
local before = cur[4] and batch_state(task)
local log, saved = false, false  -- as GET answers a missing key (a nil would end the answer)
if cur[13] then  -- only PROGRESS writes these, counting @checkpoints with them: none counted, none to read
  log, saved = redis.call('GET', checkpoint), redis.call('GET', cursor)
end
local seq = (tonumber(cur[6]) or 0) + 1  -- the counters in the one HSET: a delivery's commands (bench/README.md)
local fields = {@status, $PROCESSING, @run_id, run_id, @updated_at, now_ms, @message, '',
                @attempts, (tonumber(cur[5]) or 0) + 1, @seq, seq}
if not cur[12] then  -- the task's first start: a resume or a retry keeps it (a run again resets it, RERUN)
  fields[#fields + 1] = @started_at
  fields[#fields + 1] = now_ms
end
if lk then
  fields[#fields + 1] = @slot
  fields[#fields + 1] = lk
end
if worker ~= '' then  -- the run's worker, where a cancel's stop-job goes (TRANSITION drops it with @run_id)
  fields[#fields + 1] = @worker
  fields[#fields + 1] = worker
end
if log or saved then  -- written only once it is not 0 (a task's bytes: bench/README.md)
  fields[#fields + 1] = @resumed
  fields[#fields + 1] = (tonumber(cur[7]) or 0) + 1
end
redis.call('HSET', task, unpack(fields))
redis.call('ZADD', running, now_ms, task_id)
redis.call('PUBLISH', events, seq)
batch_sync(task, task_id, before, now_ms, nil)
audit_entry(task_id, status, {cur[9], cur[8], $PROCESSING, cur[14], fields[10], cur[15]})  -- as written above
if cur[4] or lk then  -- a batch's sync or a slot's HDEL wrote more than ``fields``: the document read back
  return {1, payload_json, redis.call('HGETALL', task), log, saved}
end
-- in HGETALL's order for a small (listpack) hash, which a repeat's answer above reads: the fields it had, then
-- the new ones in the order HSET added them (a large hash's order differs; the answer is read as a map)
for i = 1, #fields, 2 do
  local name, value = fields[i], tostring(fields[i + 1])  -- as HSET stored it
  if at[name] == nil then
    doc[#doc + 1] = name
    doc[#doc + 1] = value
  end
  at[name] = value
end
for i = 2, #doc, 2 do doc[i] = at[doc[i - 1]] end
return {1, payload_json, doc, log, saved}
""")

# Progress and heartbeat of a running task: only the run that started it may write, and only while
# PROCESSING, so a late write after a cancel, a retry or a recovery is dropped. Progress never goes down.
# A run whose claim was taken (recovery re-queued the task, maybe another run started it) is told
# 'TAKEN' (app.core.states.CLAIM_TAKEN), never the new run's PROCESSING; past expires_at it is told EXPIRED.
# With the progress goes the run's checkpoint (workers.checkpoint), in the same step: a line appended to
# the log and the cursor, living as long as the task's hash; @checkpoints counts these writes and
# @checkpoint_run names the run whose result folder holds what they cover.
# Returns the status found ('PROCESSING' when written, 'TAKEN' when another run holds the task).
PROGRESS = Script(
    "progress",
    once=FIRST,
    keys={"task": "hash: the task's record", "running": "sorted set: PROCESSING task id -> last heartbeat (moved)",
          "events": "channel: the task's events", "checkpoint": "string: the task's checkpoint log (appended)",
          "cursor": "string: the cursor the processor saved last", "batch_head": BATCH_HEAD,
          "stored_bytes": STORED_BYTES},
    args={
        "run_id": "the run reporting", "now_ms": "now",
        "progress": "0-100 ('' = a heartbeat only)",
        "message": "the progress message",
        "items_total": "how many items the task has ('' = the item counts unchanged)",
        "items_succeeded": "how many of them succeeded so far",
        "items_failed": "how many of them failed so far",
        "task_id": "the task's id",
        "checkpoint_line": "a line for the checkpoint log ('' = none)",
        "cursor_json": "the processor's cursor ('' = unchanged)",
        "files_run": "the run whose result folder holds what the checkpoint covers",
        "replace": "'1' = the line replaces the log (a line that says it all) | '' = it is appended",
    },
    body=SYNC + QUOTA + """
local cur = redis.call('HMGET', task, @status, @run_id, @progress, @expires_at, @batch, @stored, @member)
if cur[1] ~= $PROCESSING or cur[2] ~= run_id then
  local unfinished = $ACTIVE
  if unfinished[cur[1]] then return $TAKEN end
  return cur[1] or ''
end
if (tonumber(cur[4]) or math.huge) <= tonumber(now_ms) then return $EXPIRED end
redis.call('ZADD', running, 'XX', now_ms, task_id)
if progress == '' then return $PROCESSING end
local before = cur[5] and batch_state(task)
local reached = tonumber(progress)
if reached < (tonumber(cur[3]) or 0) then reached = tonumber(cur[3]) end
redis.call('HSET', task, @progress, reached, @message, message, @updated_at, now_ms)
if items_total ~= '' then
  redis.call('HSET', task, @items_total, items_total, @items_succeeded, items_succeeded, @items_failed, items_failed)
end
if checkpoint_line ~= '' or cursor_json ~= '' then
  local saved_before = held_bytes(task, {checkpoint, cursor})
  local ttl = redis.call('PTTL', task)
  if checkpoint_line ~= '' then
    if replace ~= '' then redis.call('SET', checkpoint, checkpoint_line .. '\\n')
    else redis.call('APPEND', checkpoint, checkpoint_line .. '\\n') end
    if ttl > 0 then redis.call('PEXPIRE', checkpoint, ttl) end
  end
  if cursor_json ~= '' then
    redis.call('SET', cursor, cursor_json)
    if ttl > 0 then redis.call('PEXPIRE', cursor, ttl) end
  end
  redis.call('HINCRBY', task, @checkpoints, 1)
  redis.call('HSET', task, @checkpoint_run, files_run)
  local was = tonumber(cur[6]) or 0
  account(task, cur[7], was, was + held_bytes(task, {checkpoint, cursor}) - saved_before)
end
local seq = redis.call('HINCRBY', task, @seq, 1)
redis.call('PUBLISH', events, seq)
batch_sync(task, task_id, before, now_ms, nil)
return $PROCESSING
""")

# A task that is not PROCESSING leaves the running index (the recovery pass's cleanup), decided on its status at
# the moment of the removal: a run that started after the pass read the task keeps its entry, so a stall of
# that run is still seen. Returns 1 when the entry left.
FORGET_RUN = Script(
    "forget_run",
    once=LATE,
    keys={"task": "hash: the task's record", "running": "sorted set: PROCESSING task id -> last heartbeat"},
    args={"task_id": "the task's id"},
    body="""
if redis.call('HGET', task, @status) == $PROCESSING then return 0 end
return redis.call('ZREM', running, task_id)
""")
