"""The Lua function that creates one task: the submit script's (app.core.scripts.SUBMIT) and, once per task, the
batch create's (app.core.batchscripts.BATCH), so a task made either way is made the same way.

``create(t)`` writes the task whose keys and ARGV positions the table ``t`` gives: ``id``, its keys ``task``,
``payload`` and ``dedup``; its hash's field pairs ``fields_from..fields_to`` of ARGV (``fields_to`` nil: to its
end); ``key_ttl``, ``expiry_ms``, ``payload_json``; ``run_at`` ('' = now) and ``after_ids`` (comma list, '' =
none) whose hash and dependents set are ``command_keys[k]``, ``command_keys[k + 1]``... in order; the job's
commands ``job_from..job_to`` of ARGV or of the table ``job`` (a submit's template: app.core.jobs.JobTemplate.lua;
``job_to`` excluded) on the command keys after those (or on the table ``job_keys``: a batch's); ``hold`` (a batch
id, or nil): the task waits for that batch instead (a ``then``). ``args`` (a table, or nil): where those
positions point instead of ARGV (the batch create rebuilds each task's from a template and its differences).
Its hash's fields include ``stored`` (the payload's length, counted in keys.STORED_BYTES here: see QUOTA).
It uses the names a calling script's preamble binds (dedup_window_s, created_ms, member and the shared keys, among
them ``waiting_tasks``, keys.WAITING, which a task that waits for others joins)
and the ``replay`` and ``audit_values`` functions. A script creating many tasks (the batch create) calls
``fold_start()`` first (``fold``: see app.core.waitscripts.REPLAY): each ``create`` then collects its writes to
the keys every task shares (the history, the expiry index, the counters; its job's queue entry; the audit
trim) and ``fold_writes()`` makes them once, in order, at the end: a batch runs 6 commands per task instead of
19 (bench/README.md, "Batch submit per task").
``create`` returns the id of a task it runs after that ended otherwise already ('' = none: the caller fails it
-6) and the ids it waits for (comma list).
"""

from __future__ import annotations

from app.core.keys import TaskField as F

# The first field pairs of every created task's hash, in this order (app.core.store.TaskStore.task_fields writes
# them so, for a submit and for each task of a batch): ``create`` reads the audit entry's values at their places
# here (app.core.scripts.AUDIT: member, type, status, attempts and the payload's digest; a new task has no error
# code) instead of a table of every field by name, ~2 µs of Lua a task (bench/README.md, "Submit, fifth
# pass").
CREATED_HEAD = (F.TYPE, F.MEMBER, F.STATUS, F.PROGRESS, F.ATTEMPTS, F.CREATED_AT, F.UPDATED_AT, F.EXPIRES_AT, F.SEQ,
                F.PAYLOAD_SHA256)

# sibling(key, id, other): the key of the same kind as ``key`` (which names ``id``) for ``other``: how a script
# names the hash of a task (or batch) whose id it learns only by reading (on the same slot: see app.core.keys).
SIBLING = """
local function sibling(key, id, other)
  local at = string.find(key, id, 1, true)
  return string.sub(key, 1, at - 1) .. other .. string.sub(key, at + #id)
end
"""

# held_bytes(task, {keys}): what the task holds now that counts in its member's quota (keys.STORED_BYTES): the
# lengths of those of its keys (payload, result, checkpoint, cursor), of its hash's inline result and of its output
# (@output_bytes: kept by app.core.outputscripts.EMIT, since a list has no STRLEN).
# account(task, member, before, after): the task's STORED field and its member's sum move to ``after``.
QUOTA = """
local function held_bytes(task_key, counted)
  local n = redis.call('HSTRLEN', task_key, @result)
  n = n + (tonumber(redis.call('HGET', task_key, @output_bytes)) or 0)
  for _, k in ipairs(counted) do n = n + redis.call('STRLEN', k) end
  return n
end
local function account_member(member, before, after)  -- the member's sum only (TRANSITION writes @stored itself)
  if redis.call('HINCRBY', stored_bytes, member, after - before) <= 0 then redis.call('HDEL', stored_bytes, member) end
end
local function account(task_key, member, before, after)
  before = tonumber(before) or 0
  if after == before or not member then return end
  redis.call('HSET', task_key, @stored, after)
  account_member(member, before, after)
end
"""

# MEMBERS_ADD: a create adds its member to ``members`` (keys.MEMBERS, the members with a history: housekeeping trims
# each one's) only when the member had no other unfinished task (its count in ``active`` comes to 1). A member with
# one is there already: every count up in ``active`` (a create, a batch's, a run again of a task one created) comes
# with or after that task's own SADD, and nothing takes a member out of ``members``. A no-op SADD less per submit
# under a backlog (bench/README.md, "Submit, sixth pass"). The batch create adds its member once per batch anyway.
CREATE = """
local function fold_start()
  fold = {history = {}, expiry = {}, created = 0, bytes = 0, pushes = {}, queues = {}, added = {}, adds = {},
          line = fold_line}
end
local function fold_writes()
  if fold.created > 0 then
    redis.call('ZADD', history, unpack(fold.history))
    redis.call('ZADD', expiry, unpack(fold.expiry))
    redis.call('SADD', members, member)
    redis.call('HINCRBY', stats, &submitted, fold.created)
    redis.call('HINCRBY', active, member, fold.created)
    redis.call('HINCRBY', stored_bytes, member, fold.bytes)
  end
  for _, add in ipairs(fold.adds) do redis.call('SADD', add[1], add[2]) end
  for _, queue in ipairs(fold.queues) do redis.call('RPUSH', queue, unpack(fold.pushes[queue])) end
  fold = nil
  audit_trim()
end
local function create(t)
  redis.call('SET', t.dedup, t.id, 'EX', dedup_window_s)
  redis.call('SET', t.payload, t.payload_json, 'EX', t.key_ttl)
  if fold then
    local h, e = fold.history, fold.expiry
    h[#h + 1], h[#h + 2] = created_ms, t.id
    e[#e + 1], e[#e + 2] = t.expiry_ms, t.id
    fold.created, fold.bytes = fold.created + 1, fold.bytes + #t.payload_json
  else
    redis.call('ZADD', history, created_ms, t.id)
    redis.call('ZADD', expiry, t.expiry_ms, t.id)
    redis.call('HINCRBY', stats, &submitted, 1)
    if redis.call('HINCRBY', active, member, 1) == 1 then redis.call('SADD', members, member) end  -- see MEMBERS_ADD
    redis.call('HINCRBY', stored_bytes, member, #t.payload_json)
  end
  local waiting, ended, n = nil, '', 0  -- no table nor pattern match for a task without ``after``
  if t.after_ids ~= '' then
    waiting = {}
    local open_statuses = $ACTIVE
    for dep in string.gmatch(t.after_ids, '[^,]+') do
      local dep_task, dep_set = command_keys[t.k + 2 * n], command_keys[t.k + 2 * n + 1]
      n = n + 1
      local found = redis.call('HGET', dep_task, @status)
      if found ~= $COMPLETED then
        waiting[#waiting + 1] = dep
        redis.call('SADD', dep_set, t.id)
        local ttl = redis.call('PTTL', dep_task)
        if ttl > 0 then redis.call('PEXPIRE', dep_set, ttl) else redis.call('EXPIRE', dep_set, t.key_ttl) end
        if found then redis.call('HSET', dep_task, @dependents, 1) end
        if not open_statuses[found] then  -- it ended otherwise (or is gone): the settle tick fails this task
          if ended == '' then ended = dep end
          redis.call('LPUSH', settled, dep)
        end
      end
    end
  end
  local src, more = t.args or ARGV, {}  -- the hash's fields this create adds to those of ARGV: one HSET for all
  if t.hold then
    more = {@waiting, 1, @waiting_for, t.hold}
    redis.call('ZADD', waiting_tasks, created_ms, t.id)
  elseif waiting and #waiting > 0 then
    more = {@waiting, #waiting, @waiting_for, table.concat(waiting, ',')}
    redis.call('ZADD', waiting_tasks, created_ms, t.id)
  elseif t.run_at ~= '' then
    redis.call('ZADD', delayed, t.run_at, t.id)
  else
    -- its place in line goes into ``more``
    replay(t.job_from, t.job_to, t.job_keys and 1 or t.k + 2 * n, t.job or t.args, more, t.job_keys)
  end
  if #more == 0 then  -- ``more`` first, so ARGV's fields are passed as they are, not copied into a table
    redis.call('HSET', t.task, unpack(src, t.fields_from, t.fields_to))
  elseif #more == 2 then
    redis.call('HSET', t.task, more[1], more[2], unpack(src, t.fields_from, t.fields_to))
  else
    redis.call('HSET', t.task, more[1], more[2], more[3], more[4], unpack(src, t.fields_from, t.fields_to))
  end
  redis.call('EXPIRE', t.task, t.key_ttl)
  local f = t.fields_from - 1  -- the audited values as the HSET above wrote them, at their places in the head
  audit_values(t.id, '', src[f + __AT_member__], src[f + __AT_type__], src[f + __AT_status__], nil,
               src[f + __AT_attempts__], src[f + __AT_payload_sha256__])
  return ended, waiting and table.concat(waiting, ',') or ''
end
"""
for _at, _field in enumerate(CREATED_HEAD):
    CREATE = CREATE.replace(f"__AT_{_field.value}__", str(2 * _at + 2))
if "__AT_" in CREATE:
    raise RuntimeError("app.core.creation: an audited field is not in CREATED_HEAD")
