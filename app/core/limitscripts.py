"""The Lua of concurrency limits and rate limits (app.core.limits says what they are for).

Concurrency. The START script (app.core.runscripts) takes a slot of the task's limit key in the step that starts
it, or parks the task in the limit's line (PENDING, no job, ``@limited`` saying why); TRANSITION frees the slot
in the step that ends the run (any end: complete, fail, cancel, retry, put back, recovery, expiry) and hands the
free slots to the oldest parked tasks, reserving each its slot and putting it on ``keys.LIMIT_READY``, which the
scheduler's tick queues (:data:`LIMIT_QUEUE`). :data:`LIMIT_SWEEP` is the backstop, per limit key: a holder
whose run is gone, or whose heartbeat is older than the stall timeout, loses its slot, and the line moves on.

A task's ``@slot`` names the limit key it counts in: it holds (or has reserved) a slot there, or, while
``@limited`` is set too, waits in its line. A holder is live while it is PENDING with a reserved slot, or
PROCESSING with a fresh heartbeat in ``keys.RUNNING``: :func:`slot_live` below.

Rates. :data:`RATE_TAKE` is a token bucket as GCRA (one stored time per limit: when its bucket is full again).
A take that must wait at most ``wait_max_ms`` takes its token now for the time it may use it (the caller sleeps
until then, so waiting callers queue in order instead of racing); a longer one takes nothing and says how long.
"""

from __future__ import annotations

from app.core import keys
from app.core.lua import FIRST, LATE, Script, Tail
from app.core.waitscripts import REPLAY

# Needs, bound by the script that includes it: limit_head, limits, running, ready (keys) and task_key_of(id), the
# hash of a task by id. A limit key is "<type> <key kind>[ <value>]" (app.core.limits.limit_key).
LIMITS = """
local function limit_keys(lk) return limit_head .. lk .. '__SLOTS__', limit_head .. lk .. '__PARKED__' end
-- spec: "type=N/key;..." (app.core.limits.concurrency_spec); the limit key and N of a task of type ttype
local function limit_of(spec, ttype, member, payload_json)
  for entry in string.gmatch(spec, '[^;]+') do
    local t, cap, kind = string.match(entry, '^(.-)=(%d+)/(.+)$')
    if t == ttype and tonumber(cap) > 0 then
      local value = ''
      if kind == @member then value = member or ''  -- the key kinds member and type are the fields they read
      elseif kind ~= @type then
        local ok, v = pcall(cjson.decode, payload_json)
        if not ok then v = nil end
        for part in string.gmatch(string.sub(kind, 9), '[^.]+') do
          if type(v) == 'table' then v = v[part] else v = nil end
        end
        if type(v) == 'string' or type(v) == 'number' or type(v) == 'boolean' then value = tostring(v) end
        value = string.sub(value, 1, __VALUE_MAX__)
      end
      if value ~= '' then return t .. ' ' .. kind .. ' ' .. value, tonumber(cap) end
      return t .. ' ' .. kind, tonumber(cap)
    end
  end
  return nil, 0
end
local function slot_live(lk, holder, now, stall_ms)
  local f = redis.call('HMGET', task_key_of(holder), @status, @slot, @limited)
  if f[2] ~= lk or f[3] then return false end
  if f[1] == $PENDING then return true end
  if f[1] ~= $PROCESSING then return false end
  local beat = redis.call('ZSCORE', running, holder)
  return beat ~= false and tonumber(beat) > now - stall_ms
end
-- the live holders of lk's slots; the others lose theirs
local function slots_held(lk, now, stall_ms)
  local slots = limit_keys(lk)
  local held = 0
  for _, holder in ipairs(redis.call('ZRANGE', slots, 0, -1)) do
    if slot_live(lk, holder, now, stall_ms) then held = held + 1 else redis.call('ZREM', slots, holder) end
  end
  return held
end
-- a slot of lk for task id, or the reason it waits (it is parked in the line then, by created_at)
local function take_slot(lk, cap, id, created, now, stall_ms)
  local slots, parked = limit_keys(lk)
  redis.call('HSET', limits, lk, cap)
  if not redis.call('ZSCORE', slots, id) then
    local held = redis.call('ZCARD', slots)
    if held >= cap then held = slots_held(lk, now, stall_ms) end
    if held >= cap then
      redis.call('ZADD', parked, 'NX', created, id)
      return 'concurrency: ' .. lk .. ' ' .. held .. '/' .. cap
    end
    redis.call('ZADD', slots, now, id)
  end
  redis.call('ZREM', parked, id)
  return nil
end
-- the free slots of lk to the oldest parked tasks: each gets its slot reserved and goes on ready (queued by the
-- tick); a parked id that is no longer PENDING and parked is dropped. Returns how many were released.
local function release_parked(lk, now)
  local slots, parked = limit_keys(lk)
  local cap = tonumber(redis.call('HGET', limits, lk) or '0')
  local released, looked = 0, 0
  while looked < 100 and (cap <= 0 or redis.call('ZCARD', slots) < cap) do
    local head = redis.call('ZPOPMIN', parked)
    if #head == 0 then break end
    looked = looked + 1
    local other = task_key_of(head[1])
    local f = redis.call('HMGET', other, @status, @slot, @limited)
    if f[1] == $PENDING and f[2] == lk and f[3] then
      redis.call('ZADD', slots, now, head[1])
      redis.call('HDEL', other, @limited)
      redis.call('HSET', other, @updated_at, now)
      redis.call('ZADD', ready, now, head[1])
      redis.call('PUBLISH', other .. '__EVENTS__', redis.call('HINCRBY', other, @seq, 1))
      released = released + 1
    end
  end
  if redis.call('ZCARD', slots) == 0 and redis.call('ZCARD', parked) == 0 then redis.call('HDEL', limits, lk) end
  return released
end
-- task id leaves lk (its run ended, or it left the line): its slot or its place goes, the line moves on
local function limit_leave(lk, id, now)
  local slots, parked = limit_keys(lk)
  redis.call('ZREM', slots, id)
  redis.call('ZREM', parked, id)
  release_parked(lk, now)
end
""".replace("__SLOTS__", keys.SLOTS_TAIL).replace("__PARKED__", keys.PARKED_TAIL).replace(
    "__EVENTS__", keys.EVENTS_TAIL)
VALUE_MAX = 64  # a payload field's value counts by its first this many characters (keys and reasons stay short)
LIMITS = LIMITS.replace("__VALUE_MAX__", str(VALUE_MAX))
# task_key_of(id) in a script that has its own task's key and id (START, TRANSITION): the key ends with the id
OWN_TASK = """
local function task_key_of(id) return string.sub(task, 1, #task - #task_id) .. id end
"""

LIMIT_KEYS = {
    "limit_head": "a limit's key without the limit key (keys.LIMIT_HEAD): its slots and line are built from it",
    "limits": "hash: keys.LIMITS, limit key -> its cap",
    "ready": "sorted set: keys.LIMIT_READY, tasks released from a line, to queue",
}

# A task released from a line (its slot reserved): queued as RQ job job_id (the tail's commands) while it is
# PENDING and holds the reservation; any other leaves ready unqueued. Two ticks at once: one ZREM answers 1.
# Returns {1} when queued, {0, the status found} otherwise.
LIMIT_QUEUE = Script(
    "limit_queue",
    once=LATE,
    keys={"task": "hash: the released task's record", "ready": "sorted set: keys.LIMIT_READY (the task leaves it)"},
    args={"task_id": "the task's id", "job_id": "the RQ job id it is queued under (recorded as its job)",
          "job_argc": "how many ARGV entries the job's commands take"},
    rest_keys=Tail("command_keys", "one key per job command, in order"),
    rest=Tail("command", "the job's commands (name, argc, args... each; job_argc entries in all)"),
    body=REPLAY + """
if redis.call('ZREM', ready, task_id) == 0 then return {0, ''} end
local cur = redis.call('HMGET', task, @status, @slot, @limited)
if cur[1] ~= $PENDING or not cur[2] or cur[3] then return {0, cur[1] or ''} end
redis.call('HSET', task, @job, job_id)
replay(first_command, first_command + tonumber(job_argc), 1)
return {1}
""")

# The backstop of one limit key with a line (the tick, every few seconds): holders whose run is gone or stalled
# past the stall timeout lose their slots, and the line moves on. Returns {1, released} when it released any, else {0}.
LIMIT_SWEEP = Script(
    "limit_sweep",
    once=FIRST,
    keys={**LIMIT_KEYS, "running": "sorted set: keys.RUNNING (the holders' heartbeats)",
          "task_head": "a task's key without its id (keys.task('')): the holders' records are built from it"},
    args={"limit_key": "the limit key", "now_ms": "now", "stall_ms": "the stall timeout (ms)"},
    body="""
local function task_key_of(id) return task_head .. id end
""" + LIMITS + """
local _, parked = limit_keys(limit_key)
if redis.call('ZCARD', parked) == 0 then return {0} end  -- no line: a START sweeps its own key when it is full
slots_held(limit_key, tonumber(now_ms), tonumber(stall_ms))
local released = release_parked(limit_key, tonumber(now_ms))
if released > 0 then return {1, released} end
return {0}
""")

# One token of rate limit ``name`` (rate tokens per per_ms, a bucket of rate tokens): {1, 1, wait ms} taken, to be
# used wait ms from now (0: at once); {1, 0, wait ms} not taken, the wait being longer than wait_max_ms (the task
# is put back for that long). Redis's clock, so every host counts alike. Counts taken, waited and refused in
# keys.RATE_STATS. A call record keeps the answer: a resent take takes no second token.
RATE_TAKE = Script(
    "rate_take",
    once=FIRST,
    keys={"bucket": "string: keys.rate_bucket(name), when the bucket is full again (ms)",
          "stats": "hash: keys.RATE_STATS"},
    args={"name": "the rate limit's name", "rate": "tokens per period (the bucket's size)",
          "per_ms": "the period, ms", "wait_max_ms": "the longest wait a worker is held (ms)"},
    body="""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local size = tonumber(rate)
local interval = tonumber(per_ms) / size
local tat = tonumber(redis.call('GET', bucket) or '0')
if tat < now then tat = now end
local wait = tat + interval - size * interval - now
if wait < 0 then wait = 0 end
if wait > tonumber(wait_max_ms) then
  redis.call('HINCRBY', stats, name .. ':refused', 1)
  return {1, 0, math.ceil(wait)}
end
tat = tat + interval
redis.call('SET', bucket, string.format('%.3f', tat), 'PX', math.ceil(tat - now) + 1000)
redis.call('HINCRBY', stats, name .. ':taken', 1)
if wait > 0 then redis.call('HINCRBY', stats, name .. ':waited', 1) end
return {1, 1, math.ceil(wait)}
""")

SCRIPTS = (LIMIT_QUEUE, LIMIT_SWEEP, RATE_TAKE)
