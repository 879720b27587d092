"""The Lua of batches (app.core.batches): the counters every status script keeps, and the batch create.

A batch's record (``keys.batch``) holds how many of its tasks are in each status, the sum of their progress
and of their item counts. Nothing counts them at read time: every script that changes a task's status,
progress or items (start, progress, transition, run again) calls :data:`SYNC`'s ``batch_sync`` after its
writes, with the task's state from before them (``batch_state``), and each batch the task counts in (its
``batch`` field) moves by the difference, in the same atomic step. So a batch status read is one HGETALL
however large the batch.

The transition that leaves a batch with no unfinished task marks it done (``completed_at``) and, the first time
only, releases its ``then`` task (out of its waiting, into ``keys.DELAYED`` due now: the promote tick queues it
once, app.core.deferred) and schedules its callback (``keys.CALLBACKS_DUE``). A task's batch keys are built
here from ``keys.BATCH_HEAD`` (passed in KEYS) and the ids in the task's hash, like the submit's duplicate
holder: on the same ``{tp}`` slot.

Markers as app.core.lua renders them (``%name`` is a :class:`~app.core.keys.BatchField`).
"""

from __future__ import annotations

from app.core.creation import CREATE, SIBLING
from app.core.keys import EVENTS_TAIL, TASKS_TAIL
from app.core.lua import FIRST, Script, Tail
from app.core.states import CallbackState
from app.core.waitscripts import REPLAY

# batch_state(task): the task's state as batch_sync compares it, nil for a task in no batch.
# batch_done(b, bid, cur, task, task_id, now, done): batch ``bid`` (key ``b``, ``cur`` its fields as batch_sync
# reads them) has no unfinished task: done now; the first time, its then task released and its callback due.
# batch_sync(task, task_id, before, now, done): after a script's writes, each of the task's batches moves by
# the difference from ``before``; ``done`` = {delayed = key, due = key, waiting = key} where the script may end a
# batch (the transition), nil elsewhere (a start, a progress write or a run again never leaves a batch with no
# unfinished task).
SYNC = SIBLING + ("""
local function batch_state(task_key)
  local s = redis.call('HMGET', task_key, @batch, @status, @progress, @items_total, @items_succeeded, @items_failed)
  if not s[1] then return nil end
  return s
end
local function batch_done(b, bid, cur, task_key, task_id, now, done)
  redis.call('HSET', b, %completed_at, now)
  if cur[4] and cur[5] ~= '1' then
    redis.call('HSET', b, %then_released, 1)
    local then_key = sibling(task_key, task_id, cur[4])
    if redis.call('HGET', then_key, @status) == $PENDING then
      redis.call('HDEL', then_key, @waiting, @waiting_for)
      redis.call('ZREM', done.waiting, cur[4])
      redis.call('HSET', then_key, @updated_at, now)
      redis.call('ZADD', done.delayed, now, cur[4])
      redis.call('PUBLISH', then_key .. '__EVENTS_TAIL__', redis.call('HINCRBY', then_key, @seq, 1))
    end
  end
  if cur[6] and cur[7] ~= '1' then
    redis.call('HSET', b, %callback_fired, 1, %callback_state, '__CALLBACK_PENDING__', %callback_attempts, 0,
               %callback_last_status, '')
    redis.call('ZADD', done.due, now, 'b:' .. bid .. ':0:DONE')
  end
end
local function batch_sync(task_key, task_id, before, now, done)
  if not before then return end
  local after = batch_state(task_key)
  local open = $ACTIVE
  local function weight(s) if open[s[2]] then return tonumber(s[3]) or 0 end return 100 end
  local moved = before[2] ~= after[2]
  local dp = weight(after) - weight(before)
  local di = {}
  local changed = moved or dp ~= 0
  for j = 4, 6 do
    di[j] = (tonumber(after[j]) or 0) - (tonumber(before[j]) or 0)
    if di[j] ~= 0 then changed = true end
  end
  if not changed then return end
  local expires, ttl = redis.call('HGET', task_key, @expires_at), redis.call('PTTL', task_key)
  for bid in string.gmatch(before[1], '[^,]+') do
    local b = batch_head .. bid
    if redis.call('EXISTS', b) == 1 then
      if moved then
        redis.call('HINCRBY', b, string.lower(before[2]), -1)
        redis.call('HINCRBY', b, string.lower(after[2]), 1)
      end
      if dp ~= 0 then redis.call('HINCRBY', b, %progress_sum, dp) end
      if di[4] ~= 0 then redis.call('HINCRBY', b, %items_total, di[4]) end
      if di[5] ~= 0 then redis.call('HINCRBY', b, %items_succeeded, di[5]) end
      if di[6] ~= 0 then redis.call('HINCRBY', b, %items_failed, di[6]) end
      if moved then
        local cur = redis.call('HMGET', b, %expires_at, %pending, %processing, %then_task_id, %then_released,
                               %callback_url, %callback_fired)
        if (tonumber(expires) or 0) > (tonumber(cur[1]) or 0) then redis.call('HSET', b, %expires_at, expires) end
        if ttl > redis.call('PTTL', b) then
          redis.call('PEXPIRE', b, ttl)
          redis.call('PEXPIRE', b .. '__TASKS_TAIL__', ttl)
        end
        if (tonumber(cur[2]) or 0) + (tonumber(cur[3]) or 0) > 0 then
          redis.call('HDEL', b, %completed_at)
        elseif done then
          batch_done(b, bid, cur, task_key, task_id, now, done)
        end
      end
      redis.call('PUBLISH', b .. '__EVENTS_TAIL__', redis.call('HINCRBY', b, %seq, 1))
    end
  end
end
""").replace("__EVENTS_TAIL__", EVENTS_TAIL).replace("__TASKS_TAIL__", TASKS_TAIL).replace(
    "__CALLBACK_PENDING__", CallbackState.PENDING)

# A batch: its tasks created (each as SUBMIT creates one: app.core.creation) and its record written, in one step,
# or nothing at all. A task whose dedup key is held (or named by an earlier task of the batch) is not created:
# the holder counts in the batch (its ``batch`` field gains the batch id) at its status now, EXPIRED when its
# hash is gone. Refused whole when the member's unfinished tasks plus the new ones (``then`` included) would pass
# the cap. The last block is the ``then`` task when there is one: created waiting for the batch (``hold``), not
# counted in it. A batch with no unfinished task (every task a finished duplicate) is done at once.
# A block's head (its key_ttl_s, expiry_ms, run_at_ms, after_ids, n_deps, n_jobs: the same for most tasks of a
# batch), job commands and hash fields come as a template and the block's differences from it (the tasks of a
# batch differ in a few of their ~80 values: ids, digests, RQ's job data), which saves the web packing and Redis
# reading ~65 arguments a task (bench/README.md, batches). A template of a first job (the web's: its queue's job
# as RQ's enqueue writes it, app.core.batches._first) also names where its job's values hold the task id and RQ's
# data: each block's id and data go there, so its differences are its head's and hash fields' only (the
# description, queue entry and line of its job are not sent: bench/README.md, "Batch submit per task, second
# pass"). ARGV's tail: template_count templates, each job_argc, n_fields, n_slots, data_at (its position, 0 =
# none), n_consts, n_plan, n_slots (position, text before the id, text after it) triples, n_plan entries (one a
# job command: n > 0 its key is the template's n-th constant key, n <= 0 the block's own job key -n, from 0), then
# the head's 6 values, the job's commands (job_argc entries: name, argc, args... each) and the hash's field pairs
# (n_fields entries); then per block: task_id, payload_json, its template's number (from 1), its job's data ('' without
# a data_at), n_diffs, then n_diffs pairs in the order of their positions (a position in the template's values,
# from 1; the block's value there). KEYS: each template's n_consts constant job keys (RQ's queue, its set of
# queues, the wake list, the member's line: the same for every block of a first job's template), then per block:
# its dedup key, task hash, payload, 2 per dep (hash, dependents set), and its job's keys (a first job's own ones
# only: its job hash, once; otherwise n_jobs, one a command).
# A block's values are its template's with its id, data and differences put in place for its create (the
# differences taken out after: ``with_block``): no copy of the ~70 values per task.
# Returns {1, per block: '' (created), or the id of a task it runs after that ended otherwise (created), or
# "<holder id> <holder's status>" (held); then the batch's hash as this step wrote it (HGETALL)}, or
# {2, unfinished_count} at the cap, or {3, bytes_held} past the member's quota of stored bytes.
BATCH = Script(
    "batch_create",
    once=FIRST,
    keys={
        "history": "sorted set: the member's task ids by creation time",
        "expiry": "sorted set: the expiry index",
        "members": "set: every member with a history",
        "stats": "hash: the counters (submitted)",
        "active": "hash: member -> its unfinished tasks (the cap's count)",
        "stored_bytes": "hash: member -> bytes its tasks hold (the quota's count)",
        "delayed": "sorted set: PENDING task id -> run_at",
        "settled": "list: ended tasks whose dependents are to be released or failed",
        "batch": "hash: the new batch's record",
        "batch_tasks": "list: the batch's task ids in order",
        "callbacks_due": "sorted set: callback deliveries (the batch's, when it is done at once)",
        "waiting_tasks": "sorted set: PENDING tasks waiting for other tasks -> ms they began (keys.WAITING)",
    },
    args={
        "batch_id": "the new batch's id",
        "dedup_window_s": "a dedup key's lifetime",
        "created_ms": "now, the creation time",
        "member": "the member submitting",
        "cap": "unfinished tasks the member may hold (0 = no cap)",
        "bytes_cap": "bytes the member's tasks may hold (0 = no quota)",
        "template_count": "how many templates come first in the tail",
        "block_count": "how many task blocks follow them (the then task's last)",
        "has_then": "'1' when the last block is the then task, '' otherwise",
        "key_ttl_s": "the batch keys' lifetime (at least its tasks')",
        "callback_url": "where the batch's callback goes ('' = none)",
    },
    rest_keys=Tail("command_keys", "per block: its dedup key, task hash, payload key, dep keys, job command keys"),
    rest=Tail("block", "the templates, then per block its fields (see above)"),
    body=REPLAY + SYNC + CREATE + ("""
local argv = ARGV  -- the tail, read at computed positions (from first_block)
local templates, starts, at_keys, at_jobs, a, k = {}, {}, {}, {}, first_block, 1
for i = 1, tonumber(template_count) do
  local job_argc, n_fields, n_slots, data_at, n_consts, n_plan = unpack(ARGV, a, a + 5)
  job_argc, n_fields, n_slots, n_plan = tonumber(job_argc), tonumber(n_fields), tonumber(n_slots), tonumber(n_plan)
  local slots = {unpack(ARGV, a + 6, a + 5 + 3 * n_slots)}
  for j = 1, #slots, 3 do slots[j] = tonumber(slots[j]) end
  a = a + 6 + 3 * n_slots
  local job_keys, own, n_own = nil, {}, 0  -- a first job's keys: its template's, the block's own put in each time
  if n_plan > 0 then
    job_keys = {}
    for j = 1, n_plan do
      local p = tonumber(argv[a + j - 1])
      if p > 0 then job_keys[j] = command_keys[k + p - 1]
      else
        own[#own + 1], own[#own + 2] = j, -p
        n_own = math.max(n_own, 1 - p)
      end
    end
  end
  a, k = a + n_plan, k + tonumber(n_consts)
  templates[i] = {job_to = 7 + job_argc, fields_to = 6 + job_argc + n_fields, slots = slots,
                  data_at = tonumber(data_at), job_keys = job_keys, own = own, n_own = n_own,
                  values = {unpack(ARGV, a, a + 5 + job_argc + n_fields)}}
  a = a + 6 + job_argc + n_fields
end
for i = 1, tonumber(block_count) do  -- where each block's arguments and keys start: nothing else kept per block
  local n_diffs, tp = tonumber(argv[a + 4]), templates[tonumber(argv[a + 2])]
  local n_deps, n_jobs = tp.values[5], tp.values[6]
  for j = a + 5, a + 3 + 2 * n_diffs, 2 do  -- the head's differences come first
    local at = tonumber(argv[j])
    if at > 6 then break end
    if at == 5 then n_deps = argv[j + 1] elseif at == 6 then n_jobs = argv[j + 1] end
  end
  starts[i], at_keys[i], at_jobs[i] = a, k, k + 3 + 2 * tonumber(n_deps)
  a, k = a + 5 + 2 * n_diffs, at_jobs[i] + (tp.job_keys and tp.n_own or tonumber(n_jobs))
end
local t, was = {job_from = 7}, {}  -- the block being created (one table for all: create keeps none of it)
local function load_block(i)  -- t: block i, its head's differences and its own job keys in place
  local a, k = starts[i], at_keys[i]
  local tp = templates[tonumber(argv[a + 2])]
  local v, own, job_keys = tp.values, tp.own, tp.job_keys
  t.id, t.payload_json, t.data, t.hold = argv[a], argv[a + 1], argv[a + 3], nil
  t.key_ttl, t.expiry_ms, t.run_at, t.after_ids = v[1], v[2], v[3], v[4]
  t.diffs, t.diffs_end = a + 5, a + 3 + 2 * tonumber(argv[a + 4])
  for j = t.diffs, t.diffs_end, 2 do
    local at = tonumber(argv[j])
    if at > 4 then break end
    if at == 1 then t.key_ttl = argv[j + 1] elseif at == 2 then t.expiry_ms = argv[j + 1]
    elseif at == 3 then t.run_at = argv[j + 1] else t.after_ids = argv[j + 1] end
  end
  t.dedup, t.task, t.payload, t.k = command_keys[k], command_keys[k + 1], command_keys[k + 2], k + 3
  t.args, t.job_to, t.fields_from, t.fields_to = v, tp.job_to, tp.job_to, tp.fields_to
  t.slots, t.data_at, t.job_keys = tp.slots, tp.data_at, job_keys
  for j = 1, #own, 2 do job_keys[own[j]] = command_keys[at_jobs[i] + own[j + 1]] end
end
local function with_block()  -- create(t) over its template's values with its id, data and differences in place
  local values, slots, id, n = t.args, t.slots, t.id, 0
  for j = 1, #slots, 3 do values[slots[j]] = slots[j + 1] .. id .. slots[j + 2] end
  if t.data_at > 0 then values[t.data_at] = t.data end
  for j = t.diffs, t.diffs_end, 2 do
    local at = tonumber(argv[j])
    was[n + 1], was[n + 2], n = at, values[at], n + 2
    values[at] = argv[j + 1]
  end
  local ended = create(t)
  for j = n - 1, 1, -2 do values[was[j]] = was[j + 1] end
  return ended
end
local seen, fresh, bytes, dedups, held = {}, 0, 0, {}, {}
for i, k in ipairs(at_keys) do dedups[i] = command_keys[k] end
local holders = redis.call('MGET', unpack(dedups))  -- one read of every dedup key, not a GET a task
for i, dedup in ipairs(dedups) do
  held[i] = holders[i] or seen[dedup]
  if not held[i] then
    local a = starts[i]
    seen[dedup] = argv[a]
    fresh, bytes = fresh + 1, bytes + #argv[a + 1]
  end
end
local limit = tonumber(cap)
local unfinished = tonumber(redis.call('HGET', active, member) or '0')
if limit > 0 and unfinished + fresh > limit then return {2, unfinished} end
local holding = tonumber(redis.call('HGET', stored_bytes, member) or '0')
if tonumber(bytes_cap) > 0 and holding + bytes > tonumber(bytes_cap) then return {3, holding} end
local open = $ACTIVE
local counts = {}
for _, s in ipairs({$PENDING, $PROCESSING, $COMPLETED, $FAILED, $CANCELLED, $EXPIRED}) do counts[s] = 0 end
local progress_sum, items, expires, ttl, ids, answer = 0, {0, 0, 0}, 0, tonumber(key_ttl_s) * 1000, {}, {1}
local then_id = nil
fold_start()
for i = 1, #starts do
  local outcome = ''
  load_block(i)
  if has_then ~= '' and i == #starts then
    t.hold = batch_id
    then_id = t.id
    with_block()
  elseif held[i] then
    local holder = sibling(t.task, t.id, held[i])
    local h = redis.call('HMGET', holder, @status, @progress, @items_total, @items_succeeded, @items_failed,
                         @expires_at, @batch)
    local status = h[1] or $EXPIRED
    counts[status] = counts[status] + 1
    if open[status] then progress_sum = progress_sum + (tonumber(h[2]) or 0) else progress_sum = progress_sum + 100 end
    for j = 1, 3 do items[j] = items[j] + (tonumber(h[j + 2]) or 0) end
    if h[1] then
      redis.call('HSET', holder, @batch, h[7] and (h[7] .. ',' .. batch_id) or batch_id)
      expires = math.max(expires, tonumber(h[6]) or 0)
      ttl = math.max(ttl, redis.call('PTTL', holder))
    end
    ids[#ids + 1] = held[i]
    outcome = held[i] .. ' ' .. status
  else
    outcome = with_block()
    counts[$PENDING] = counts[$PENDING] + 1
    expires = math.max(expires, tonumber(t.expiry_ms))
    ids[#ids + 1] = t.id
  end
  answer[#answer + 1] = outcome
end
fold_lines()
fold_writes()
local record = {%member, member, %size, #ids, %progress_sum, progress_sum, %items_total, items[1],
                %items_succeeded, items[2], %items_failed, items[3], %created_at, created_ms, %expires_at, expires,
                %seq, 0}
for s, n in pairs(counts) do
  record[#record + 1] = string.lower(s)
  record[#record + 1] = n
end
if then_id then
  record[#record + 1] = %then_task_id
  record[#record + 1] = then_id
end
if callback_url ~= '' then
  record[#record + 1] = %callback_url
  record[#record + 1] = callback_url
end
redis.call('HSET', batch, unpack(record))
redis.call('PEXPIRE', batch, ttl)
redis.call('RPUSH', batch_tasks, unpack(ids))
redis.call('PEXPIRE', batch_tasks, ttl)
if counts[$PENDING] + counts[$PROCESSING] == 0 then
  local cur = redis.call('HMGET', batch, %expires_at, %pending, %processing, %then_task_id, %then_released,
                         %callback_url, %callback_fired)
  batch_done(batch, batch_id, cur, command_keys[at_keys[1] + 1], argv[starts[1]], created_ms,
             {delayed = delayed, due = callbacks_due, waiting = waiting_tasks})
end
answer[#answer + 1] = redis.call('HGETALL', batch)  -- as written here: a worker may start a task right after
return answer
"""))
