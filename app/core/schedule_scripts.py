"""The Lua scripts of the periodic schedules (app.core.schedules): each write with a condition is one of these.

They are :class:`~app.core.lua.Script` tables like the task scripts (app.core.scripts), with one more marker:
``%name`` is a :class:`~app.core.keys.ScheduleField`, rendered here (a name it does not know fails at
import). They touch no task key and write no audit entry; like every script they take ``keys.AUDIT`` as
their last key (:data:`app.core.lua.AUDIT_STREAM`), unused, so the machinery stays one.
"""

from __future__ import annotations

import re

from app.core.keys import ScheduleField
from app.core.lua import LATE, Script, Tail

_FIELD = re.compile(r"%([a-z_]+)")


def _fields(body: str) -> str:
    return _FIELD.sub(lambda m: f"'{ScheduleField(m[1]).value}'", body)


# A new schedule, unless the member already holds ``cap`` of them: the count and the write in one step, so
# concurrent creates never take a member past the cap. Returns {1} when created, {0, count} at the cap.
CREATE = Script(
    "schedule_create",
    once=LATE,
    keys={"schedule": "hash: the new schedule's record", "index": "sorted set: the member's schedules",
          "due": "sorted set: unpaused schedules by next fire time"},
    args={"schedule_id": "the new schedule's id", "cap": "schedules one member may hold (0 = no cap)",
          "created_ms": "now, its creation time", "next_ms": "its first fire time ('' = paused)"},
    rest=Tail("field", "the schedule hash's field, value pairs"),
    body=_fields("""
local limit = tonumber(cap)
local held = redis.call('ZCARD', index)
if limit > 0 and held >= limit then return {0, held} end
redis.call('HSET', schedule, unpack(ARGV, first_field))
redis.call('ZADD', index, created_ms, schedule_id)
if next_ms ~= '' then redis.call('ZADD', due, next_ms, schedule_id) end
return {1}
"""))

# A change of the member's schedule (PATCH), unless it was deleted meanwhile (so a delete is never undone).
# ``next_ms`` moves its fire time with the change: '' = paused (out of the due index), 'keep' = unchanged.
# Returns 1 when written, 0 when the schedule is gone.
UPDATE = Script(
    "schedule_update",
    keys={"schedule": "hash: the schedule's record", "due": "sorted set: unpaused schedules by next fire time"},
    args={"schedule_id": "the schedule's id", "member": "its owner", "next_ms": "its next fire time, '' or 'keep'"},
    rest=Tail("field", "the schedule hash's field, value pairs to write"),
    body=_fields("""
if redis.call('HGET', schedule, %member) ~= member then return 0 end
redis.call('HSET', schedule, unpack(ARGV, first_field))
if next_ms == '' then
  redis.call('HSET', schedule, %next_run_at, '')
  redis.call('ZREM', due, schedule_id)
elseif next_ms ~= 'keep' then
  redis.call('HSET', schedule, %next_run_at, next_ms)
  redis.call('ZADD', due, next_ms, schedule_id)
end
return 1
"""))

# A fire time served: from ``fire_ms`` to the next fire time, if the schedule still expects ``fire_ms`` and
# is not paused (another scheduler, a PATCH or a delete got there first: nothing is written). With the task
# the firing created, recorded as its last run. Returns 1 when advanced, 0 otherwise.
ADVANCE = Script(
    "schedule_advance",
    once=LATE,
    keys={"schedule": "hash: the schedule's record", "due": "sorted set: unpaused schedules by next fire time"},
    args={"schedule_id": "the schedule's id", "fire_ms": "the fire time served (its next_run_at now)",
          "next_ms": "the fire time after it ('' = none: it leaves the due index)", "now_ms": "now",
          "task_id": "the task created for fire_ms ('' = none)"},
    body=_fields("""
local cur = redis.call('HMGET', schedule, %next_run_at, %paused)
if cur[1] ~= fire_ms or cur[2] == '1' then return 0 end
redis.call('HSET', schedule, %next_run_at, next_ms)
if task_id ~= '' then redis.call('HSET', schedule, %last_run_at, now_ms, %last_task_id, task_id) end
if next_ms == '' then redis.call('ZREM', due, schedule_id) else redis.call('ZADD', due, next_ms, schedule_id) end
return 1
"""))

SCRIPTS = {s.name: s for s in (CREATE, UPDATE, ADVANCE)}
