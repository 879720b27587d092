"""Fair dispatch: within a queue, workers take the members' jobs in turn, and a queued task knows its place.

Each RQ queue keeps, beside RQ's own list (what ``rq info`` and rq-dashboard count, in submit order), one line
per member (``keys.line``: that member's job ids, oldest first) and a ring of the members whose line is not
empty (``keys.ring``). Every job taskport queues is put in line by :data:`PUT_IN_LINE`, the one Lua function
that does it: the job commands carry an ``in_line`` command (:func:`line_command`, appended by app.core.jobs)
that the replay of every script that queues a job (app.core.waitscripts.REPLAY: submit, batch, retry, put
back, recovery, promotion, release, run again, the reconciler) hands to it. The claim
(app.core.jobclaims.CLAIM) serves the ring's head: it takes the head of its line, ``weight`` times in a row,
then moves it to the back of the ring, and takes the chosen id out of RQ's list (LREM: the head of the list
for a member alone). A job queued without a line (RQ's own enqueue, a job of an earlier version) sits at the
head of RQ's list with no line naming it: the claim takes such a head first, as before, so nothing waits for
ever behind the lines.

The counters of ``keys.lines`` (:class:`LinesField`) give a task its place without a scan of the queue: its
``ticket`` (the member's ``in`` count when it was put in line, kept in its hash: ``TaskField.LINE``) less the
member's ``out`` count is its place in its own line, and the ring says how many of every other member's jobs
go before it (:data:`PLACE`, one read-only script: O(members)). The claim keeps the queue's start rate: the
mean gap between two takes while jobs waited (an exponential average), the status document's
``estimated_start``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NamedTuple

import redis

from app.core import keys
from app.core.lua import Command, render
from app.core.states import DEFAULT_QUEUE, QUEUES

LINE = "in_line"  # the job command that puts a job in its member's line: no Redis command, PUT_IN_LINE replays it
GAP_WEIGHT = 0.1  # the weight of the newest gap between two starts in the queue's mean gap (LinesField.GAP)


class LinesField(StrEnum):
    """The fields of a queue's ``keys.lines`` hash; a member's are the prefix and the member's name."""

    IN = "in:"  # + member: the ids put in its line so far (the last one's ticket)
    OUT = "out:"  # + member: the ids taken out of its line so far
    WEIGHT = "w:"  # + member: its weight, when not 1 (how many takes in a row it gets in its turn)
    USED = "used"  # the takes the ring's head had in its current turn
    LAST = "last"  # ms (Redis's clock) of the last take
    BUSY = "busy"  # '1' when jobs still waited after the last take: the next gap measures the rate
    GAP = "gap"  # ms: the mean gap between takes while jobs waited (absent: no rate yet)
    QUEUED = "queued"  # the ids put in line on the queue so far, every member's (the last one's seq)
    TOOK = "took"  # the claim's takes from the queue so far (every WAKE_BATCH-th uses that many wake entries)


# put_in_line(line, job id, ring, lines hash, task hash, member, weight): the job joins the back of the member's
# line, the member the back of the ring when its line was empty, and the task's hash records its ticket, its seq
# in the queue and its job id (TaskField.LINE: "<ticket> <seq> <job id>"). Part of
# REPLAY, so inside the script that queues the job, in the same atomic step as RQ's own RPUSH. ``into`` (a table,
# or nil): that field's pair is appended to it instead of written, for a caller about to write the task's hash
# anyway (a task created: app.core.creation), one HSET fewer.
PUT_IN_LINE = """
local function put_in_line(line, job_id, ring, lines, task, member, weight, into)
  local ticket = redis.call('HINCRBY', lines, 'in:' .. member, 1)
  local seq = redis.call('HINCRBY', lines, 'queued', 1)
  if redis.call('RPUSH', line, job_id) == 1 then redis.call('RPUSH', ring, member) end
  if weight == '1' then redis.call('HDEL', lines, 'w:' .. member)
  else redis.call('HSET', lines, 'w:' .. member, weight) end
  local placed = ticket .. ' ' .. seq .. ' ' .. job_id
  if into then into[#into + 1], into[#into + 2] = @line, placed
  else redis.call('HSET', task, @line, placed) end
end
"""

# A job id given back to the head of its queue (a claim whose answer was lost, a dead worker's) goes back to the
# head of its member's line too, and its member to the head of the ring, when its task's hash says it was put in
# line as that job (O(members): the ring's LREM).
BACK_IN_LINE = """
local function back_in_line(id, origin)
  local task = task_prefix .. string.match(id, '^[^_]+')
  local held = redis.call('HMGET', task, @line, @member)
  if not held[1] or string.match(held[1], '(%S+)$') ~= id then return end
  local lines = lines_prefix .. origin
  local ring = ring_prefix .. origin
  redis.call('LPUSH', line_prefix .. origin .. ':' .. held[2], id)
  redis.call('LREM', ring, 1, held[2])  -- its member is served next, as the take that was lost would have
  redis.call('LPUSH', ring, held[2])
  redis.call('HSET', lines, 'used', 0)
  redis.call('HINCRBY', lines, 'out:' .. held[2], -1)
end
"""

# take_from(queue key, queue name, claims, its head if the caller read it): the next id of the queue moved onto the
# claim list and the queue's count of takes (LinesField.TOOK, this one included), or nil when the queue is empty.
# The head of RQ's list is taken first when no line holds it (its task's hash names another job, or none, or its
# member's line does not start with it); otherwise the ring's head member's oldest id, out of RQ's list (LREM; an
# id no longer there left the queue another way, a cancel, and is passed over). Each take while jobs wait times the
# gap since the last one.
# The count rides on the counters' one HMGET and HSET (the claim uses the wake list's entries in batches by it:
# app.core.jobclaims.WAKE_BATCH).
TAKE_FROM = """
local function timed(lines, queue, writes, seen, busy)
  local now = redis.call('TIME')
  now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  seen = seen or redis.call('HMGET', lines, 'last', 'busy', 'gap', 'took')
  if seen[2] == '1' and seen[1] then
    local gap = now - tonumber(seen[1])
    if seen[3] then gap = tonumber(seen[3]) * (1 - gap_weight) + gap * gap_weight end
    writes[#writes + 1], writes[#writes + 2] = 'gap', tostring(gap)
  end
  local took = (tonumber(seen[4]) or 0) + 1
  writes[#writes + 1], writes[#writes + 2] = 'took', took
  writes[#writes + 1], writes[#writes + 2] = 'last', now
  writes[#writes + 1], writes[#writes + 2] = 'busy', (busy or redis.call('LLEN', queue) > 0) and '1' or '0'
  redis.call('HSET', lines, unpack(writes))
  return took
end

-- LREM's direction for an id that is not the head of RQ's list: from the tail when fewer ids were queued after it
-- than before it (RQ's list is in the order of the queue's seq), so a member that came after a flood is found
-- near the tail, not past the whole flood
local function toward(id, head_held, newest)
  local mine = redis.call('HGET', task_prefix .. string.match(id, '^[^_]+'), @line)
  local seq = mine and tonumber(string.match(mine, ' (%d+) '))
  local first = tonumber(string.match(head_held, ' (%d+) '))
  if seq and first and newest and seq - first > tonumber(newest) - seq then return -1 end
  return 1
end

local function take_from(queue, name, claims, known)
  local lines, ring = lines_prefix .. name, ring_prefix .. name
  while true do
    local head = known or redis.call('LINDEX', queue, 0)
    known = nil
    if not head then return nil end
    local of_head = redis.call('HMGET', task_prefix .. string.match(head, '^[^_]+'), @line, @member)
    local held, owner, member, seen = of_head[1], of_head[2], nil, nil
    -- the ring's head member, moved to the ring's back as it is read (LMOVE answers what it moved): the turn of a
    -- member of weight 1, the default, ends with this take, so the read is its rotation too (a LINDEX fewer a
    -- delivery: bench/README.md). Put back at the head below when its turn goes on or it is not served
    if held and owner and string.match(held, '(%S+)$') == head then member = redis.call('LMOVE', ring, ring, 'LEFT',
                                                                                          'RIGHT') end
    if member then
      seen = redis.call('HMGET', lines, 'w:' .. member, 'used', 'out:' .. member, 'in:' .. member, 'last', 'busy',
                        'gap', 'queued', 'out:' .. owner, 'took')
      -- the head is in line only when it heads its member's line too (its ticket is the next one out): a job put
      -- back in RQ's list another way (rq-dashboard's requeue) is not, and is taken at the head as before
      if tonumber(string.match(held, '^(%d+)')) ~= (tonumber(seen[9]) or 0) + 1 then
        redis.call('LMOVE', ring, ring, 'RIGHT', 'LEFT')  -- not served: back at the head
        member = nil
      end
    end
    if not member then
      local id = redis.call('LMOVE', queue, claims, 'LEFT', 'RIGHT')
      return id, timed(lines, queue, {})
    end
    local line = line_prefix .. name .. ':' .. member
    local id = redis.call('LPOP', line)
    local out, used, writes, left = tonumber(seen[3]) or 0, (tonumber(seen[2]) or 0) + 1, {}, 0
    if id then
      out = out + 1
      writes = {'out:' .. member, out}
      left = (tonumber(seen[4]) or 0) - out  -- its line's length by the counters; read when they say empty
      if left <= 0 then left = redis.call('LLEN', line) end
    end
    if left <= 0 then  -- its line is empty: it leaves the ring (from the back, where the read moved it)
      redis.call('RPOP', ring)
      used = 0
    elseif used >= (tonumber(seen[1]) or 1) then  -- its turn is over: it stays at the back
      used = 0
    else  -- its turn goes on (a weight above 1): back at the head
      redis.call('LMOVE', ring, ring, 'RIGHT', 'LEFT')
    end
    writes[#writes + 1], writes[#writes + 2] = 'used', used
    local taken = id == head and redis.call('LMOVE', queue, claims, 'LEFT', 'RIGHT')  -- the oldest: the head
    if id and not taken and redis.call('LREM', queue, toward(id, held, seen[8]), id) == 1 then
      taken = redis.call('RPUSH', claims, id)
    end
    if taken then
      return id, timed(lines, queue, writes, {seen[5], seen[6], seen[7], seen[10]}, left > 0 or nil)
    end
    redis.call('HSET', lines, unpack(writes))
  end
end
"""

# The status read of a task (one round trip): its hash, and while it is PENDING in a line, its place: {hash} or
# {hash, position} (no rate yet) or {hash, position, gap ms, last take ms, now ms}. position: the jobs of higher
# queues, its own line's ids before it, and for every other member in the ring those it takes before this one's
# turn (round-robin with weights: the members ahead of it in the ring get one turn more).
# Its one key is the task's hash; the prefixes of the keys it derives are written into the source (a status read's
# call carries nothing else). Not a Script: no audit stream, no writes.
# The common case costs least (bench/README.md, "Status read, sixth pass"): the member's own counters and the
# queue's come in one HMGET, the other members' only when the ring holds any (a member alone in it reads none), and
# TIME only when there is a rate to estimate a start from.
PLACE = """
local task = KEYS[1]
local lines_prefix, ring_prefix, queue_prefix, queues = '__LINES__', '__RING__', 'rq:queue:', '__QUEUES__'
local h = redis.call('HGETALL', task)
local f = {}
for i = 1, #h, 2 do f[h[i]] = h[i + 1] end
if f[@status] ~= $PENDING or not f[@line] then return {h} end
local q = f[@priority] or '__DEFAULT__'
local member = f[@member]
local lines = lines_prefix .. q
local mine = redis.call('HMGET', lines, 'out:' .. member, 'used', 'gap', 'last', 'w:' .. member)
local k = tonumber(string.match(f[@line], '^(%d+)')) - (tonumber(mine[1]) or 0)
if k < 1 then return {h} end
local ring = redis.call('LRANGE', ring_prefix .. q, 0, -1)
local at = 0
for i = 1, #ring do if ring[i] == member then at = i break end end
if at == 0 then return {h} end
local used, wm = tonumber(mine[2]) or 0, tonumber(mine[5]) or 1
-- the turn in which its k-th take comes (1: the current one) and whether each member goes before it then
local first = wm
if at == 1 then first = wm - used end
local turn = 1
if k > first then turn = 1 + math.ceil((k - first) / wm) end
local position = k - 1
if #ring > 1 then
  local fields = {}
  for i = 1, #ring do
    local m = ring[i]
    fields[3 * i - 2], fields[3 * i - 1], fields[3 * i] = 'in:' .. m, 'out:' .. m, 'w:' .. m
  end
  local v = redis.call('HMGET', lines, unpack(fields))
  for i = 1, #ring do
    if i ~= at then
      local turns = turn - 1
      if i < at then turns = turn end
      local takes = turns * (tonumber(v[3 * i]) or 1)
      if i == 1 and turns > 0 then takes = takes - used end
      local left = (tonumber(v[3 * i - 2]) or 0) - (tonumber(v[3 * i - 1]) or 0)
      if left < takes then takes = left end
      if takes > 0 then position = position + takes end
    end
  end
end
for name in string.gmatch(queues, '%S+') do
  if name == q then break end
  position = position + redis.call('LLEN', queue_prefix .. name)
end
if not mine[3] then return {h, position} end
local now = redis.call('TIME')
return {h, position, mine[3], mine[4] or '', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)}
"""

# The status read only reads: declared so, a replica and a server refusing writes (OOM) still answer it.
PLACE_SOURCE = "#!lua flags=no-writes\n" + render(PLACE).replace("__DEFAULT__", DEFAULT_QUEUE).replace(
    "__LINES__", keys.lines("")).replace("__RING__", keys.ring("")).replace("__QUEUES__", " ".join(QUEUES))


class Place(NamedTuple):
    """A queued task's place: the tasks that start before it if nothing new comes, and when it should start
    (ms; None until the queue has a measured rate)."""

    position: int
    estimated_start: int | None


def line_command(queue: str, member: str, task_id: str, job_id: str, weight: int) -> Command:
    """The job command that puts job ``job_id`` of ``task_id`` in ``member``'s line on ``queue`` (PUT_IN_LINE)."""
    return Command(LINE, keys.line(queue, member),
                   (job_id, keys.ring(queue), keys.lines(queue), keys.task(task_id), member, str(weight)))


def place_of(answer: list[Any]) -> Place | None:
    """The place in a PLACE answer (None: the task is not waiting in a line)."""
    if len(answer) < 2:
        return None
    position = int(answer[1])
    if len(answer) < 5:  # no rate yet
        return Place(position, None)
    gap, last, now = answer[2], answer[3], int(answer[4])
    return Place(position, max(now, int(last or now) + round((position + 1) * float(gap))))


class Places:
    """The status read with the task's place (:data:`PLACE`): EVALSHA with the task's key alone, through redis-py's
    Script as every script (loaded again on NOSCRIPT: a restarted or failed-over server)."""

    def __init__(self, conn: redis.Redis) -> None:
        self._place = conn.register_script(PLACE_SOURCE)

    def read(self, task_id: str) -> tuple[dict[bytes, bytes], Place | None]:
        """The task's hash (empty when gone) and its place in line, in one round trip."""
        answer: Any = self._place(keys=[keys.task(task_id)])
        pairs = iter(answer[0])  # HGETALL's field, value, field, value...: paired without two sliced copies
        return dict(zip(pairs, pairs, strict=True)), place_of(answer)
