"""The Lua scripts of tasks that wait before they are queued: for their ``run_at`` (PROMOTE) or for the tasks
they run after (RELEASE, SETTLE_DONE). Each is one compare-and-set, like those of app.core.scripts (which
lists them with its own, so every TaskStore loads them); the submit and transition scripts there put a task in
``keys.DELAYED`` and a finished task on ``keys.SETTLED``, these take them off.

A task waiting for its time has no RQ job: its job is built when it is due, from the task, by the caller
(:meth:`app.core.jobs.JobQueue.requeue_commands`) and replayed here, so a promotion queues it exactly once
(the ZREM that answers 1 to one caller only) and nothing of a job waits in Redis meanwhile.
"""

from __future__ import annotations

from app.core.lines import PUT_IN_LINE
from app.core.lua import FIRST, LATE, Script, Tail

# A Lua function replaying the job commands of a script's tail (lua.replay): ARGV (or the table ``from``) from
# index i up to (not including) stop, the n-th command on command_keys[k + n - 1] (or on ``keys_from``'s: the
# batch create's job keys, each of a batch's constant ones sent once). While ``fold`` is a table
# (the batch create: many jobs in one script), what RQ writes per job to keys its jobs share is collected
# instead, in order, for fold_writes() to make once: each RPUSH of one id onto a queue (one RPUSH per queue
# with every id, so the queue order is the same) and each SADD of one member (made once). In every replay a
# job's consecutive HSETs of one key go as one: RQ writes its job hash in two (its status, then every field, the
# status again), one command fewer per job (a submit's 26 became 25), the same hash to the byte (the fields in
# RQ's order: tests/integration/test_submit_round_trips.py). Nothing in a replay reads, and the script is
# atomic, so no one sees the difference.
# An ``in_line`` command (app.core.lines.line_command) is no Redis command: PUT_IN_LINE puts the job in line
# (``into``: the table its task hash's field pair goes into, for the caller to write; nil: written here). While
# ``fold`` is a table, ``fold_line`` does it instead (as ``fold.line``: a script that never folds, the submit, has no
# call of it, so app.core.lua.prune drops it from that script): the line's ticket and the queue's seq are read once and
# counted on here (each job gets the same ticket and seq as its PUT_IN_LINE would have), and ``fold_lines()``
# (called by the batch create before fold_writes) pushes each line's ids in one RPUSH, puts its member in the ring
# when the line was empty, and writes the counters and the weight once: 4 commands a job become 4 a line.
REPLAY = PUT_IN_LINE + """
local fold = nil
local function fold_line(line, job_id, ring, lines, member, weight, into)
  if not fold.lines then fold.lines, fold.line_order, fold.seqs = {}, {}, {} end
  local f = fold.lines[line]
  if not f then
    f = {ring = ring, lines = lines, member = member, ids = {},
         ticket = tonumber(redis.call('HGET', lines, 'in:' .. member)) or 0}
    fold.lines[line] = f
    fold.line_order[#fold.line_order + 1] = line
    if not fold.seqs[lines] then
      fold.seqs[lines] = {tonumber(redis.call('HGET', lines, 'queued')) or 0, 0}
    end
  end
  local seq = fold.seqs[lines]
  f.ticket, seq[1], seq[2], f.weight = f.ticket + 1, seq[1] + 1, seq[2] + 1, weight
  f.ids[#f.ids + 1] = job_id
  into[#into + 1], into[#into + 2] = @line, f.ticket .. ' ' .. seq[1] .. ' ' .. job_id
end
local function fold_lines()
  if not fold.lines then return end
  for _, line in ipairs(fold.line_order) do
    local f = fold.lines[line]
    redis.call('HINCRBY', f.lines, 'in:' .. f.member, #f.ids)
    if redis.call('RPUSH', line, unpack(f.ids)) == #f.ids then redis.call('RPUSH', f.ring, f.member) end
    if f.weight == '1' then redis.call('HDEL', f.lines, 'w:' .. f.member)
    else redis.call('HSET', f.lines, 'w:' .. f.member, f.weight) end
  end
  for lines, seq in pairs(fold.seqs) do redis.call('HINCRBY', lines, 'queued', seq[2]) end
end
local function replay(i, stop, k, from, into, keys_from)
  local src, keys_of = from or ARGV, keys_from or command_keys
  local hkey, hat, hargs = nil, nil, nil  -- an HSET held back: its key, and its place in src or (merged) its args
  while i < stop do
    local name, argc = unpack(src, i, i + 1)
    argc = tonumber(argc)
    local key = keys_of[k]
    if hkey and (name ~= 'HSET' or key ~= hkey) then
      if hargs then redis.call('HSET', hkey, unpack(hargs))
      else redis.call('HSET', hkey, unpack(src, hat + 2, hat + 1 + tonumber(src[hat + 1]))) end
      hkey = nil
    end
    if name == 'in_line' and fold and into then
      local a = i + 2
      fold.line(key, src[a], src[a + 1], src[a + 2], src[a + 4], src[a + 5], into)
    elseif name == 'in_line' then
      local a = i + 2  -- the line, the command's six arguments, then ``into``
      put_in_line(key, src[a], src[a + 1], src[a + 2], src[a + 3], src[a + 4], src[a + 5], into)
    elseif fold and name == 'SADD' and argc == 1 then
      local one = key .. ' ' .. src[i + 2]
      if not fold.added[one] then
        fold.added[one] = true
        fold.adds[#fold.adds + 1] = {key, src[i + 2]}
      end
    elseif fold and name == 'RPUSH' and argc == 1 then
      local ids = fold.pushes[key]
      if not ids then
        ids = {}
        fold.pushes[key] = ids
        fold.queues[#fold.queues + 1] = key
      end
      ids[#ids + 1] = src[i + 2]
    elseif name == 'HSET' and hkey and not hargs and tonumber(src[hat + 1]) == 2 then  -- RQ's status, then its fields
      redis.call('HSET', key, src[hat + 2], src[hat + 3], unpack(src, i + 2, i + 1 + argc))
      hkey = nil
    elseif name == 'HSET' and hkey then  -- a third HSET of the key, or a second after a longer first: one table
      if not hargs then hargs = {unpack(src, hat + 2, hat + 1 + tonumber(src[hat + 1]))} end
      for j = i + 2, i + 1 + argc do hargs[#hargs + 1] = src[j] end
    elseif name == 'HSET' then
      hkey, hat, hargs = key, i, nil
    else
      redis.call(name, key, unpack(src, i + 2, i + 1 + argc))
    end
    i, k = i + 2 + argc, k + 1
  end
  if hkey and hargs then redis.call('HSET', hkey, unpack(hargs))
  elseif hkey then redis.call('HSET', hkey, unpack(src, hat + 2, hat + 1 + tonumber(src[hat + 1]))) end
end
"""
_COMMANDS = Tail("command_keys", "one key per job command, in order")
_JOB = Tail("command", "the job's commands (name, argc, args... each; job_argc entries in all)")

# A task of keys.DELAYED whose run_at has come: out of the set and queued, while it is PENDING and waits for
# nothing else. Any other task leaves the set and is not queued (cancelled, expired: its transition took it
# out already, this is the fallback). Two schedulers promoting the same task: one ZREM answers 1, the other
# queues nothing. Returns {1} when queued, {0, the status found ('' when gone)} otherwise.
PROMOTE = Script(
    "promote",
    once=LATE,
    keys={"task": "hash: the task's record", "delayed": "sorted set: PENDING task id -> run_at (the task leaves it)"},
    args={"task_id": "the task's id", "now_ms": "now", "job_argc": "how many ARGV entries the job's commands take"},
    rest_keys=_COMMANDS, rest=_JOB,
    body=REPLAY + """
local cur = redis.call('HMGET', task, @status, @run_at, @waiting)
if cur[1] ~= $PENDING or (tonumber(cur[3]) or 0) > 0 then
  redis.call('ZREM', delayed, task_id)
  return {0, cur[1] or ''}
end
if (tonumber(cur[2]) or 0) > tonumber(now_ms) then return {0, $PENDING} end
if redis.call('ZREM', delayed, task_id) == 0 then return {0, $PENDING} end
replay(first_command, first_command + tonumber(job_argc), 1)
return {1}
""")

# A task that runs after dep_id, which COMPLETED: dep_id leaves its waiting list, and with the last one it
# is queued (the job commands of the tail), or put in keys.DELAYED when its run_at is still ahead. Only while
# the task is PENDING and still waits for dep_id, so a second delivery of the same news does nothing. The
# task leaves dep_id's dependents set in any case. Returns {1, how many it still waits for} when it counted,
# {0, the status found} otherwise.
RELEASE = Script(
    "release",
    once=LATE,
    keys={"task": "hash: the waiting task's record", "dependents": "set: the tasks that run after dep_id",
          "delayed": "sorted set: PENDING task id -> run_at", "events": "channel: the waiting task's events",
          "waiting_tasks": "sorted set: PENDING tasks waiting for other tasks (keys.WAITING: it leaves it with the "
                           "last, or when it is no longer PENDING)"},
    args={"task_id": "the waiting task's id", "dep_id": "the task it ran after, which completed", "now_ms": "now",
          "job_argc": "how many ARGV entries the job's commands take"},
    rest_keys=_COMMANDS, rest=_JOB,
    body=REPLAY + """
redis.call('SREM', dependents, task_id)
local cur = redis.call('HMGET', task, @status, @waiting_for, @run_at)
if cur[1] ~= $PENDING then
  redis.call('ZREM', waiting_tasks, task_id)  -- its transition took it out already: the fallback, as PROMOTE's
  return {0, cur[1] or ''}
end
local list = ',' .. (cur[2] or '') .. ','
local at = string.find(list, ',' .. dep_id .. ',', 1, true)
if not at then return {0, cur[1]} end
list = string.sub(list, 1, at) .. string.sub(list, at + #dep_id + 2)
local left = redis.call('HINCRBY', task, @waiting, -1)
redis.call('HSET', task, @waiting_for, string.sub(list, 2, -2), @updated_at, now_ms)
if left <= 0 then
  redis.call('HDEL', task, @waiting, @waiting_for)
  redis.call('ZREM', waiting_tasks, task_id)
  if cur[3] and tonumber(cur[3]) > tonumber(now_ms) then redis.call('ZADD', delayed, cur[3], task_id)
  else replay(first_command, first_command + tonumber(job_argc), 1) end
end
local seq = redis.call('HINCRBY', task, @seq, 1)
redis.call('PUBLISH', events, seq)
return {1, left}
""")

# dep_id's entry of keys.SETTLED is done with: one entry leaves the list when no task waits on dep_id any more
# (its dependents set is empty), or when dep_id is unfinished again (run again: its next end is pushed anew).
# A task that started waiting on dep_id meanwhile keeps an entry there, so it is not forgotten. Returns 1
# when an entry left.
SETTLE_DONE = Script(
    "settle_done",
    once=FIRST,
    keys={"settled": "list: ended tasks whose dependents are to be released or failed",
          "dependents": "set: the tasks that run after dep_id", "dep": "hash: dep_id's record"},
    args={"dep_id": "the ended task"},
    body="""
local unfinished = $ACTIVE
if redis.call('SCARD', dependents) > 0 and not unfinished[redis.call('HGET', dep, @status)] then return 0 end
return redis.call('LREM', settled, -1, dep_id)
""")

SCRIPTS = (PROMOTE, RELEASE, SETTLE_DONE)
