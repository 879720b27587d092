"""The Lua scripts: every task state change is one of these, so it is one atomic compare-and-set.

Each script names the status it expects; if the task is elsewhere it writes nothing and answers
with the status it found. Keys arrive in KEYS[] (built by app.core.keys), never built in Lua (one exception:
SUBMIT reads the hash of the task holding a dedup key, whose id it learns only then).

The scripts never spell a status, a hash field or a stats counter themselves: a source says ``$PENDING``
(a :class:`~app.core.states.TaskStatus`, or ``$TAKEN``, :data:`~app.core.states.CLAIM_TAKEN`), ``@status`` (a
:class:`~app.core.keys.TaskField`) or ``&submitted`` (a field of ``keys.STATS``), and :func:`render` writes
the Lua string literal from that one home; a name it does not know fails at import.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, NamedTuple

from app.core.config import Config
from app.core.keys import STAT_ENTERED, STAT_RECOVERED, STAT_RETRIED, STAT_SUBMITTED, TaskField
from app.core.states import CLAIM_TAKEN, TaskStatus

STATUS_WORDS = {**{s.name: s.value for s in TaskStatus}, "TAKEN": CLAIM_TAKEN}
FIELD_WORDS = {f.value: f.value for f in TaskField}
STAT_WORDS = {name: name for name in (STAT_SUBMITTED, STAT_RETRIED, STAT_RECOVERED, *STAT_ENTERED.values())}
_MARKER = re.compile(r"([$@&])([A-Za-z_0-9]+)")
_TABLES = {"$": STATUS_WORDS, "@": FIELD_WORDS, "&": STAT_WORDS}


def render(source: str) -> str:
    """``source`` with every ``$STATUS``, ``@field`` and ``&stat`` marker written as a Lua string literal."""
    return _MARKER.sub(lambda m: f"'{_TABLES[m[1]][m[2]]}'", source)


class Command(NamedTuple):
    """One Redis command on one key, for a script to replay (see SUBMIT): how the job layer hands over
    the commands that queue a job, so that they run inside the script that creates the task."""

    name: str
    key: str
    args: tuple[Any, ...]


def replay(commands: Iterable[Command]) -> tuple[list[str], list[Any]]:
    """``commands`` as SUBMIT takes them: (their keys, then [name, argc, args...] per command)."""
    keys_: list[str] = []
    args: list[Any] = []
    for command in commands:
        keys_.append(command.key)
        args += [command.name, len(command.args), *command.args]
    return keys_, args

# The audit trail, one fragment for every script that changes a task's status: each calls
# audit(...) once (a one-line splice) after its writes, so a transition and its audit entry are one
# atomic step. build() puts the fragment in front of each script, with the retention rendered in.
# KEYS: the audit stream is the LAST key of every script (TaskStore passes keys.AUDIT last)
# ARGV: none of its own; the call passes the task's key, its id and the status it left ('' at submit).
# Entry fields: task, member, type, from, to, code (error code or ''), attempt, payload (the SHA-256
# of the payload JSON, written into the hash at submit): all read from the hash after the change, so
# the entry says what the task became. The entry id is the time (ms). Trimmed with MAXLEN ~ (entries) and
# MINID ~ (age) so trimming is cheap (whole stream nodes); 0 = no limit of that kind.
AUDIT = """
local function audit(task_key, id, from)
  local h = redis.call('HMGET', task_key, @member, @type, @status, @error_code, @attempts, @payload_sha256)
  local stream, maxlen, max_age_ms = KEYS[#KEYS], __AUDIT_MAXLEN__, __AUDIT_MAX_AGE_MS__
  local cmd = {'XADD', stream}
  if maxlen > 0 then cmd = {'XADD', stream, 'MAXLEN', '~', maxlen} end
  local entry = {'*', 'task', id, 'member', h[1] or '', 'type', h[2] or '', 'from', from, 'to', h[3] or '',
                 'code', h[4] or '', 'attempt', h[5] or '0', 'payload', h[6] or ''}
  for _, v in ipairs(entry) do cmd[#cmd + 1] = v end
  redis.call(unpack(cmd))
  if max_age_ms > 0 then
    local t = redis.call('TIME')
    local oldest = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - max_age_ms
    redis.call('XTRIM', stream, 'MINID', '~', string.format('%d', oldest))
  end
end
"""

# Create a task unless the member's dedup key is held or the member is at its cap of unfinished tasks,
# and queue its RQ job in the same step. Atomic so that N concurrent identical submits create exactly one
# task, so that N concurrent submits never take a member past its cap, and so that a task and its job
# reach Redis (and its append-only file) together or not at all; a duplicate or a refusal queues nothing.
# The per-member count of unfinished tasks (KEYS[8], a hash member -> count) goes up here and down in
# TRANSITION when a task leaves PENDING/PROCESSING for good, so the check is one HGET.
# The job's commands are the ones RQ itself issues to enqueue (app.core.jobs.JobQueue.job_commands, passed
# through replay()), each on one key: the n-th of them acts on KEYS[8 + n].
# KEYS: dedup, task, payload, history, expiry, members, stats, active, then one key per job command
# ARGV: task_id, dedup_window_s, key_ttl_s, created_ms, expiry_ms, payload_json, member,
#       cap (unfinished tasks the member may hold; 0 = no cap),
#       n (how many ARGV entries the job's commands take), then per command: name, argc, args...,
#       then field1, value1, ...  (the task hash)
# The task hash of a duplicate's holder is the one key not passed in: its id is known only once the dedup
# key is read. Its name is the new task's (KEYS[2]) with the holder's id in place of the new one. So a
# duplicate costs the same one round trip as a new task.
# Returns {1} when created, {0, holder_id, the holder's HGETALL (empty once it is gone)} for a duplicate,
# {2, unfinished_count} at the cap.
SUBMIT = """
local held = redis.call('GET', KEYS[1])
if held then
  local at = string.find(KEYS[2], ARGV[1], 1, true)
  local holder = string.sub(KEYS[2], 1, at - 1) .. held .. string.sub(KEYS[2], at + #ARGV[1])
  return {0, held, redis.call('HGETALL', holder)}
end
local cap = tonumber(ARGV[8])
local active = tonumber(redis.call('HGET', KEYS[8], ARGV[7]) or '0')
if cap > 0 and active >= cap then return {2, active} end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
local first_field = 10 + tonumber(ARGV[9])
local pairs = {}
for i = first_field, #ARGV do pairs[#pairs + 1] = ARGV[i] end
redis.call('HSET', KEYS[2], unpack(pairs))
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('SET', KEYS[3], ARGV[6], 'EX', ARGV[3])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[5], ARGV[1])
redis.call('SADD', KEYS[6], ARGV[7])
redis.call('HINCRBY', KEYS[7], &submitted, 1)
redis.call('HINCRBY', KEYS[8], ARGV[7], 1)
local i, k = 10, 9
while i < first_field do
  local argc = tonumber(ARGV[i + 1])
  redis.call(ARGV[i], KEYS[k], unpack(ARGV, i + 2, i + 1 + argc))
  i, k = i + 2 + argc, k + 1
end
audit(KEYS[2], ARGV[1], '')
return {1}
"""

# PENDING -> PROCESSING for one delivery of the job: a second delivery finds PROCESSING and does nothing.
# A task past its expires_at is EXPIRED to every reader already, so it never starts (EXPIRED is final).
# KEYS: task, payload, running, events
# ARGV: run_id, now_ms, task_id
# Returns {1, payload_json, HGETALL} when started, {0, current_status} otherwise.
START = """
local cur = redis.call('HMGET', KEYS[1], @status, @expires_at)
local status = cur[1]
if status ~= $PENDING then return {0, status or ''} end
if (tonumber(cur[2]) or math.huge) <= tonumber(ARGV[2]) then return {0, $EXPIRED} end
local payload = redis.call('GET', KEYS[2])
if not payload then return {0, 'MISSING_PAYLOAD'} end
redis.call('HSET', KEYS[1], @status, $PROCESSING, @run_id, ARGV[1], @started_at, ARGV[2],
           @updated_at, ARGV[2], @message, '')
redis.call('HINCRBY', KEYS[1], @attempts, 1)
local seq = redis.call('HINCRBY', KEYS[1], @seq, 1)
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
redis.call('PUBLISH', KEYS[4], seq)
audit(KEYS[1], ARGV[3], status)
return {1, payload, redis.call('HGETALL', KEYS[1])}
"""

# Progress and heartbeat of a running task: only the run that started it may write, and only while
# PROCESSING, so a late write after a cancel, a retry or a recovery is dropped. Progress never goes down.
# A run whose claim was taken (recovery re-queued the task, maybe another run started it) is told
# 'TAKEN' (app.core.states.CLAIM_TAKEN), never the new run's PROCESSING; past expires_at it is told EXPIRED.
# KEYS: task, running, events
# ARGV: run_id, now_ms, progress ('' = heartbeat only), message, items_total, items_succeeded,
#       items_failed  (items '' = unchanged), task_id
# Returns the status found ('PROCESSING' when written, 'TAKEN' when another run holds the task).
PROGRESS = """
local cur = redis.call('HMGET', KEYS[1], @status, @run_id, @progress, @expires_at)
if cur[1] ~= $PROCESSING or cur[2] ~= ARGV[1] then
  if cur[1] == $PENDING or cur[1] == $PROCESSING then return $TAKEN end
  return cur[1] or ''
end
if (tonumber(cur[4]) or math.huge) <= tonumber(ARGV[2]) then return $EXPIRED end
redis.call('ZADD', KEYS[2], 'XX', ARGV[2], ARGV[8])
if ARGV[3] == '' then return $PROCESSING end
local progress = tonumber(ARGV[3])
if progress < (tonumber(cur[3]) or 0) then progress = tonumber(cur[3]) end
redis.call('HSET', KEYS[1], @progress, progress, @message, ARGV[4], @updated_at, ARGV[2])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], @items_total, ARGV[5], @items_succeeded, ARGV[6], @items_failed, ARGV[7])
end
local seq = redis.call('HINCRBY', KEYS[1], @seq, 1)
redis.call('PUBLISH', KEYS[3], seq)
return $PROCESSING
"""

# Every other transition: expected status(es) -> new status, with its side effects in one step.
# KEYS: task, payload, result, running, expiry, events, stats, failures, active (see SUBMIT)
# ARGV: expected (comma list), run_id ('' = any run), new_status, key_ttl_s ('' = keep),
#       expiry_ms ('' = leave the expiry index), result_json for a key of its own ('' = none, or
#       inline in the hash's 'result' field), result_ttl_s,
#       drop ('payload' | 'all' | ''), stale_before_ms ('' = no check; else the task's heartbeat must be
#       older, so a recovery never takes a task from a live worker), now_ms, stat ('' = none),
#       task_id, field1, value1, ...
# Leaving PENDING/PROCESSING for any other status counts the task off its member's unfinished tasks (once:
# the expected-status check lets only one transition out). Every transition ends the current run: its
# run_id is dropped. Past the task's expires_at only the move to EXPIRED is allowed (readers already see
# EXPIRED; it is final): anything else answers EXPIRED.
# Returns {1, previous_status} when written, {0, current_status} otherwise.
TRANSITION = """
local cur = redis.call('HMGET', KEYS[1], @status, @run_id, @expires_at)
local id = ARGV[12]
local status = cur[1]
if not status then return {0, ''} end
local ok = false
for s in string.gmatch(ARGV[1], '[^,]+') do if s == status then ok = true end end
if not ok or (ARGV[2] ~= '' and cur[2] ~= ARGV[2]) then return {0, status} end
if ARGV[3] ~= $EXPIRED and (tonumber(cur[3]) or math.huge) <= tonumber(ARGV[10]) then return {0, $EXPIRED} end
if ARGV[9] ~= '' then
  local beat = redis.call('ZSCORE', KEYS[4], id)
  if beat and tonumber(beat) > tonumber(ARGV[9]) then return {0, status} end
end
local pairs = {@status, ARGV[3]}
for i = 13, #ARGV do pairs[#pairs + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(pairs))
redis.call('HDEL', KEYS[1], @run_id)
if ARGV[4] ~= '' then redis.call('EXPIRE', KEYS[1], ARGV[4]) end
redis.call('ZREM', KEYS[4], id)
if ARGV[5] ~= '' then redis.call('ZADD', KEYS[5], ARGV[5], id) end
if ARGV[6] ~= '' then redis.call('SET', KEYS[3], ARGV[6], 'EX', ARGV[7]) end
if ARGV[8] == 'payload' or ARGV[8] == 'all' then redis.call('DEL', KEYS[2]) end
if ARGV[8] == 'all' then
  redis.call('DEL', KEYS[3])
  redis.call('HDEL', KEYS[1], @result)
end
if ARGV[11] ~= '' then redis.call('HINCRBY', KEYS[7], ARGV[11], 1) end
if ARGV[3] == $FAILED then redis.call('ZADD', KEYS[8], ARGV[10], id) end
if (status == $PENDING or status == $PROCESSING) and ARGV[3] ~= $PENDING and ARGV[3] ~= $PROCESSING then
  local member = redis.call('HGET', KEYS[1], @member)
  if member and redis.call('HINCRBY', KEYS[9], member, -1) <= 0 then redis.call('HDEL', KEYS[9], member) end
end
local seq = redis.call('HINCRBY', KEYS[1], @seq, 1)
redis.call('PUBLISH', KEYS[6], seq)
audit(KEYS[1], id, status)
return {1, status}
"""

# The scripts as Redis runs them (markers rendered), without the audit fragment: build() puts it in front.
SOURCES = {name: render(source) for name, source in
           {"submit": SUBMIT, "start": START, "progress": PROGRESS, "transition": TRANSITION}.items()}


def build(max_entries: int, max_age_s: int) -> dict[str, str]:
    """Every script with the audit fragment in front, its retention rendered in (0 = no such limit)."""
    fragment = render(AUDIT).replace("__AUDIT_MAXLEN__", str(int(max_entries)))
    fragment = fragment.replace("__AUDIT_MAX_AGE_MS__", str(int(max_age_s) * 1000))
    return {name: fragment + source for name, source in SOURCES.items()}


ALL = build(*Config().audit_limits)  # with the default retention; TaskStore builds its own from its Config
