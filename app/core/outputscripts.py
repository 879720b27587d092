"""The scripts of a task's live output (app.core.output): EMIT, a run's lines appended, and PAGE, a read of them.

The output is a list (``keys.output``), one element per line (``<at ms>:<text>``), oldest first. A line's id is
its number among every line the task ever emitted: the task's hash counts them (``@output_last``, the id of
the newest), so the list's first element is line ``output_last - LLEN + 1`` and no id is ever stored or
repeated, a trim and a run again (which empties the list) included. A list rather than a stream: a line costs
its bytes and a few more (bench/README.md, "Live output"), and the bytes a trim drops are known exactly
(the quota counts them, ``@output_bytes``).
"""

from __future__ import annotations

from app.core.creation import QUOTA
from app.core.lua import FIRST, SHEBANG, Script, Tail

# A run's lines: only the run that holds the task may add them, and only while PROCESSING, as PROGRESS decides
# (a run that was taken over is told TAKEN and adds nothing). The list keeps its newest max_lines lines; the
# bytes of the lines it holds count in the member's stored bytes (@output_bytes, summed into @stored). Sent
# twice (a lost reply), a call is answered from its call record and adds nothing: once=FIRST.
# Announces the new last id on the task's events channel ('o<id>', no @seq bump: the status is unchanged, so a
# stream sends no status document for it). Returns the status found ('PROCESSING' when written).
EMIT = Script(
    "emit",
    once=FIRST,
    keys={"task": "hash: the task's record", "output": "list: the task's output lines (appended, trimmed)",
          "events": "channel: the task's events",
          "stored_bytes": "hash: member -> bytes its tasks hold (TaskField.STORED summed)"},
    args={"run_id": "the run emitting", "now_ms": "now", "max_lines": "lines the list keeps at most",
          "count": "how many lines follow",
          "skipped": "lines emitted before them that the run dropped unsent (it held more than max_lines): they "
                     "take their ids, and every line the list holds is older than them, so it is emptied first"},
    rest=Tail("line", "the lines, oldest first, each '<at ms>:<text>'"),
    body=QUOTA + """
local cur = redis.call('HMGET', task, @status, @run_id, @expires_at, @member, @stored, @output_bytes)
if cur[1] ~= $PROCESSING or cur[2] ~= run_id then
  local unfinished = $ACTIVE
  if unfinished[cur[1]] then return $TAKEN end
  return cur[1] or ''
end
if (tonumber(cur[3]) or math.huge) <= tonumber(now_ms) then return $EXPIRED end
local n = tonumber(count)
local lines = {unpack(ARGV, first_line, first_line + n - 1)}
local added = 0
for _, line in ipairs(lines) do added = added + #line end
local dropped = 0
if skipped ~= '0' then
  dropped = tonumber(cur[6]) or 0
  redis.call('DEL', output)
end
local len = redis.call('RPUSH', output, unpack(lines))
local excess = len - tonumber(max_lines)
if excess > 0 then
  for _, old in ipairs(redis.call('LRANGE', output, 0, excess - 1)) do dropped = dropped + #old end
  redis.call('LTRIM', output, excess, -1)
end
local ttl = redis.call('PTTL', task)
if ttl > 0 then redis.call('PEXPIRE', output, ttl) end
local last = redis.call('HINCRBY', task, @output_last, n + tonumber(skipped))
redis.call('HSET', task, @output_bytes, (tonumber(cur[6]) or 0) + added - dropped)
local was = tonumber(cur[5]) or 0
account(task, cur[4], was, was + added - dropped)
redis.call('PUBLISH', events, 'o' .. last)
return $PROCESSING
""")

# Lines after an id, read in one step with what decides their ids and the poller's ``next``: returns {status
# ('' = gone), output_last, the first id returned, the lines (at most ``limit``)}.
PAGE = Script(
    "output_page",
    keys={"task": "hash: the task's record", "output": "list: the task's output lines"},
    args={"after": "the id of the last line the reader has (0: none)", "limit": "lines at most"},
    body="""
local cur = redis.call('HMGET', task, @status, @output_last)
local last = tonumber(cur[2]) or 0
local len = redis.call('LLEN', output)
local first = last - len + 1
local from = math.max(tonumber(after) + 1, first)
local lines = {}
if from <= last then
  local at = from - first
  lines = redis.call('LRANGE', output, at, math.min(at + tonumber(limit), len) - 1)
end
return {cur[1] or '', last, from, lines}
""")
# PAGE writes nothing: declared so, it runs on a replica and on a full server (SHEBANG: app.core.lua)
PAGE_SOURCE = "#!lua flags=no-writes\n" + PAGE.source()[len(SHEBANG):]
