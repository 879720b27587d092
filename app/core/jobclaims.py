"""A job taken by a worker is never in neither a queue nor a claim list (issue 29, finding 6).

RQ takes a job with one BLPOP over the worker's queues. When Redis runs that pop and the answer never reaches
the worker (Redis died after writing it to its AOF, a dropped connection), the id is out of its queue and in
no one's hands: the task stays PENDING with no job until it expires. Redis has no blocking move from several
lists, so the take is split, as BullMQ's is:

- :data:`CLAIM` takes a job in one script: the worker's queues in priority order, paused ones
  (``keys.PAUSED_QUEUES``) skipped, the first id found moved (LMOVE) onto the worker's own claim list
  (``keys.job_claims``), and the job's hash returned with it (where RQ reads it in a second round trip).
- A worker with nothing to take blocks on ``keys.JOB_WAKE``, a list that holds no job: every job queued by
  taskport pushes one entry there (app.core.jobs records it with RQ's enqueue), and a claim uses one. A lost
  answer to that BLPOP costs nothing. A job queued without one (RQ's own enqueue, a queue resumed) is seen
  at the worker's next look, within ``WAKE_WAIT`` s. The claims use the entries in batches (at every
  ``WAKE_BATCH``-th take of a queue, counted in its lines hash, the list is cut to as many entries as jobs wait
  in the worker's queues: two or three LLENs and an LTRIM where there were that many LPOPs): an entry sits on
  the list only while no worker blocks on it (a blocked BLPOP takes a pushed entry at once), and a claim that
  finds nothing empties it. A batch keeps an entry for every job still waiting, so a worker that blocks after an
  empty take is woken by the jobs queued meanwhile (a batch of ``WAKE_BATCH`` LPOPs took theirs too, and the
  worker slept ``WAKE_WAIT`` while they waited); the entries left beyond the jobs wake a worker whose take then
  finds nothing, and bound the list at ``WAKE_BATCH`` - 1 entries a queue beyond the jobs that wait.
- The claim is cleared in the pipeline that starts the job (workers.dequeue; the simple worker's
  workers.worker.StoppableSimpleWorker.execute_job, where START, last on it, makes the task PROCESSING).

A claim left behind goes back to the head of its queue: by the next claim of the same worker (one holds at
most one claim at a time, so a leftover is a take whose answer was lost), by the worker that starts in its
slot, and by housekeeping once the worker's registration in RQ is gone (:func:`give_back_lapsed`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import redis
from rq.job import Job
from rq.registry import ScheduledJobRegistry, StartedJobRegistry
from rq.utils import as_text
from rq.worker import Worker

from app.core import keys
from app.core.lines import BACK_IN_LINE, GAP_WEIGHT, TAKE_FROM
from app.core.lua import Command, Script, Tail, replay
from app.core.states import QUEUES
from app.core.waitscripts import REPLAY

# What the claim's fair dispatch and a give-back reach (app.core.lines): the keys of a task, a line, a ring and a
# queue's counters, each by its prefix (the id, queue or member appended in the script).
_LINES_ARGS = {"task_prefix": "keys.task without the id", "line_prefix": "keys.line without queue and member",
               "ring_prefix": "keys.ring without the queue", "lines_prefix": "keys.lines without the queue"}
_LINES_VALUES = {"task_prefix": keys.task(""), "line_prefix": keys.line("", "")[:-1], "ring_prefix": keys.ring(""),
                 "lines_prefix": keys.lines("")}
REGISTER_EVERY = 60  # seconds between a worker's joins of keys.JOB_CLAIMANTS (housekeeping may drop a lapsed one)
WAKE_WAIT = 1  # seconds an idle worker blocks on keys.JOB_WAKE before it looks at its queues anyway
WAKE_BATCH = 32  # a queue's takes per LPOP of the wake list (that many entries): bench/README.md, issue 32

# Every id left on ``claims`` goes back to the head of its job's queue (first claimed first), with a wake
# entry each; ids whose job hash is gone are dropped (as RQ skips them). Returns how many went back.
_GIVE_BACK = BACK_IN_LINE + """
local function give_back(claims)
  local ids = redis.call('LRANGE', claims, 0, -1)
  local back = 0
  for i = #ids, 1, -1 do
    local origin = redis.call('HGET', job_prefix .. ids[i], 'origin')
    if origin then
      redis.call('LPUSH', queue_prefix .. origin, ids[i])
      back_in_line(ids[i], origin)
      redis.call('RPUSH', wake, origin)
      back = back + 1
    end
  end
  redis.call('DEL', claims)
  return back
end
"""

# Take one job for worker ``worker``: any claim it left (a take whose answer was lost) goes back first, then
# the next id of the first unpaused queue that has one moves onto its claim list: the members' in turn
# (app.core.lines.TAKE_FROM: fair dispatch). Returns {i, id, job hash as a flat list}
# (i: the queue's position in ``queues``, from 1) or {0} when there is nothing to take; the wake list is then
# emptied (what it announced is taken or paused). A take uses one entry of it: at every WAKE_BATCH-th take of the
# queue (its lines hash counts them) the list is cut to one entry a job still waiting, so under a load that never
# idles a worker the list holds fewer than WAKE_BATCH entries a queue beyond the jobs that wait. An id whose job
# hash is gone is dropped, as RQ does.
# ``register``: the worker joins keys.JOB_CLAIMANTS (its first take, then once a minute: not per delivery).
CLAIM = Script(
    "claim",
    keys={"paused": "set: the paused queue names", "wake": "list: keys.JOB_WAKE",
          "claims": "list: the worker's claim list", "claimants": "set: keys.JOB_CLAIMANTS"},
    args={"worker": "the worker's RQ name", "job_prefix": "RQ's job hash key without the id",
          "queue_prefix": "RQ's queue key without the name", "register": "'1': add the worker to the claimants",
          **_LINES_ARGS, "gap_weight": "the weight of the newest gap in a queue's mean gap between takes"},
    rest_keys=Tail("queues", "the worker's queue keys, in priority order"),
    rest=Tail("names", "the names of those queues, in the same order"),
    body=_GIVE_BACK + TAKE_FROM + """
if register == '1' then redis.call('SADD', claimants, worker) end
-- what the take must know before it looks, in one read in the usual case: EXISTS counts which of the claim list
-- (a claim left: a take whose answer was lost), the paused set and the first queue exist (an empty list or set is
-- no key). 0: no claim, nothing paused, the first queue empty (SMEMBERS and a LINDEX fewer a delivery: bench/README.md)
local paused_now, first_head, look_first = {}, nil, true
local n = redis.call('EXISTS', claims, paused, queues[1] or claims)  -- no queue: the claim list counts twice
if n == 0 then
  look_first = false
else
  local p = 0
  for _, name in ipairs(redis.call('SMEMBERS', paused)) do paused_now[name], p = true, 1 end
  local claimed = n - p == 2  -- the claim list and the first queue both
  if n - p == 0 then
    look_first = false
  elseif n - p == 1 then  -- one of the two: the first queue's head says which (a paused one's is not read)
    if paused_now[ARGV[first_names]] then claimed = redis.call('EXISTS', claims) == 1
    else
      first_head = redis.call('LINDEX', queues[1], 0)
      claimed = not first_head
    end
  end
  if claimed then  -- its ids back at the heads of their queues, which are looked at afresh
    give_back(claims)
    first_head, look_first = nil, true
  end
end
for i, queue in ipairs(queues) do
  local name = ARGV[first_names + i - 1]
  if (i > 1 or look_first) and not paused_now[name] then
    local head = i == 1 and first_head or nil
    while true do
      local id, took = take_from(queue, name, claims, head)
      head = nil
      if not id then break end
      -- the announcements the takes used, a batch at once: under a load that never leaves a worker idle the list
      -- would grow by one a job (bench/README.md, the memory row). The batch keeps an entry for each job still
      -- waiting in these queues (a paused one's too): a take's batch that took the entries of jobs queued after
      -- an idle worker's empty take, before its BLPOP, left it asleep for WAKE_WAIT while they waited. The first
      -- queue is not read when the take's first look said it has no key
      if took % __WAKE_BATCH__ == 0 then
        local waiting = 0
        for j, other in ipairs(queues) do
          if j > 1 or look_first then waiting = waiting + redis.call('LLEN', other) end
        end
        if waiting == 0 then redis.call('DEL', wake) else redis.call('LTRIM', wake, -waiting, -1) end
      end
      local job = redis.call('HGETALL', job_prefix .. id)
      if #job > 0 then return {i, id, job} end
      redis.call('LREM', claims, -1, id)
    end
  end
end
redis.call('DEL', wake)
return {0}
""".replace("__WAKE_BATCH__", str(WAKE_BATCH)))

# The claims of worker ``worker`` back to their queues, unless a live worker holds them: ``registration`` (its
# RQ worker hash) is given when the caller does not know it dead, and its existence means alive. Returns how
# many ids went back (-1: the worker is registered, nothing done).
GIVE_BACK = Script(
    "give_back",
    keys={"claims": "list: the worker's claim list", "claimants": "set: keys.JOB_CLAIMANTS",
          "wake": "list: keys.JOB_WAKE", "registration": "hash: the worker's RQ registration, or '' (known dead)"},
    args={"worker": "the worker's RQ name", "job_prefix": "RQ's job hash key without the id",
          "queue_prefix": "RQ's queue key without the name", **_LINES_ARGS},
    body=_GIVE_BACK + """
if registration ~= '' and redis.call('EXISTS', registration) == 1 then return -1 end
local back = give_back(claims)
redis.call('SREM', claimants, worker)
return back
""")

# The reconciler's look at one task (workers.housekeeping): while it is PENDING, waits for nothing (no run_at
# in keys.DELAYED, no task it runs after) and its job is nowhere (no queue, claim list, RQ scheduled or started
# registry), the first look records when (``unqueued``), and a look ``bound_ms`` later puts the job back (its
# commands replayed) and counts ``stat``. Any other look forgets the record. Returns {0} (it has a job, or is
# not PENDING), {1} (no job, within the bound) or {2} (put back).
RECONCILE = Script(
    "reconcile",
    keys={"task": "hash: the task's record", "delayed": "sorted set: keys.DELAYED",
          "unqueued": "hash: keys.UNQUEUED", "claimants": "set: keys.JOB_CLAIMANTS", "stats": "hash: keys.STATS"},
    args={"task_id": "the task's id", "now_ms": "now", "bound_ms": "how long it may stay without a job",
          "job_prefix": "RQ's job hash key without the id", "queue_prefix": "RQ's queue key without the name",
          "zsets": "space-separated keys of RQ's registries",
          "claims_prefix": "keys.job_claims without the worker", "stat": "the STATS field to count in",
          "job_argc": "how many ARGV entries the job's commands take"},
    rest_keys=Tail("command_keys", "one key per job command, in order"),
    rest=Tail("command", "the job's commands (name, argc, args... each; job_argc entries in all)"),
    body=REPLAY + """
local cur = redis.call('HMGET', task, @status, @job, @waiting, @limited)  -- limited: parked (app.core.limits)
local function found() redis.call('HDEL', unqueued, task_id) return {0} end
if cur[1] ~= $PENDING or (tonumber(cur[3]) or 0) > 0 or cur[4] or redis.call('ZSCORE', delayed, task_id) then
  return found()
end
local job = cur[2] or task_id
-- only the queue its job was put on (its hash's origin): the scan stops at the job, which sits near the head
-- for an old task, where scanning every queue would cross whole backlogs of the other ones
local origin = redis.call('HGET', job_prefix .. job, 'origin')
if origin and redis.call('LPOS', queue_prefix .. origin, job) then return found() end
for key in string.gmatch(zsets, '%S+') do
  if redis.call('ZSCORE', key, job) then return found() end
end
for _, name in ipairs(redis.call('SMEMBERS', claimants)) do
  if redis.call('LPOS', claims_prefix .. name, job) then return found() end
end
local since = tonumber(redis.call('HGET', unqueued, task_id))
if not since then
  redis.call('HSET', unqueued, task_id, now_ms)
  return {1}
end
if tonumber(now_ms) - since < tonumber(bound_ms) then return {1} end
redis.call('HDEL', unqueued, task_id)
replay(first_command, first_command + tonumber(job_argc), 1)
redis.call('HINCRBY', stats, stat, 1)
return {2}
""")

SCRIPTS = {s.name: s for s in (CLAIM, GIVE_BACK, RECONCILE)}
JOB_PREFIX = Job.redis_job_namespace_prefix
QUEUE_PREFIX = "rq:queue:"  # RQ's Queue.redis_queue_namespace_prefix
WORKER_PREFIX = Worker.redis_worker_namespace_prefix


class Claims:
    """The three scripts on one connection (EVALSHA, loaded on NOSCRIPT by redis-py)."""

    def __init__(self, conn: redis.Redis) -> None:
        self.redis = conn
        self._registered: dict[str, float] = {}  # worker -> monotonic time it last joined keys.JOB_CLAIMANTS
        self._calls: dict[tuple[str, tuple[tuple[str, str], ...], bool], tuple[list[str], list[Any]]] = {}
        self._scripts = {name: conn.register_script(script.source()) for name, script in SCRIPTS.items()}

    def _run(self, script: Script, call: tuple[list[str], list[Any]], client: Any = None) -> Any:
        keys_, args = call
        return self._scripts[script.name](keys=[*keys_, keys.AUDIT], args=args, client=client)

    def take(self, worker: str, queues: Sequence[tuple[str, str]]) -> tuple[int, str, dict[bytes, bytes]] | None:
        """Claim the first job of ``queues`` ((name, key) pairs in priority order) that are not paused for worker
        ``worker``: (the queue's index in ``queues``, the job id, the job's hash), or None."""
        register = time.monotonic() - self._registered.get(worker, -math.inf) >= REGISTER_EVERY
        answer = self._run(CLAIM, self._take_call(worker, queues, register))
        if register:
            self._registered[worker] = time.monotonic()
        if not answer[0]:
            return None
        flat = answer[2]
        return int(answer[0]) - 1, as_text(answer[1]), dict(zip(flat[::2], flat[1::2], strict=True))

    def _take_call(self, worker: str, queues: Sequence[tuple[str, str]], register: bool) -> tuple[list[str], list[Any]]:
        """CLAIM's keys and arguments, the same for every take of a worker on its queues: built once each way of
        ``register``, not per delivery."""
        at = (worker, tuple(queues), register)
        found = self._calls.get(at)
        if found is None:
            found = self._calls[at] = CLAIM.call(
                keys={"paused": keys.PAUSED_QUEUES, "wake": keys.JOB_WAKE, "claims": keys.job_claims(worker),
                      "claimants": keys.JOB_CLAIMANTS},
                args={"worker": worker, "job_prefix": JOB_PREFIX, "queue_prefix": QUEUE_PREFIX,
                      "register": "1" if register else "0", **_LINES_VALUES, "gap_weight": GAP_WEIGHT},
                rest_keys=[key for _, key in queues], rest=[name for name, _ in queues])
        return found

    def wait(self, seconds: float) -> None:
        """Block until a job is announced on ``keys.JOB_WAKE`` or ``seconds`` pass (the entry is used up)."""
        self.redis.blpop([keys.JOB_WAKE], timeout=seconds)

    def give_back(self, worker: str, *, known_dead: bool = True) -> int:
        """Put the claims of ``worker`` back at the heads of their queues: how many. ``known_dead`` False: only
        once its RQ registration is gone (-1 while it is there)."""
        registration = "" if known_dead else WORKER_PREFIX + worker
        return int(self._run(GIVE_BACK, GIVE_BACK.call(
            keys={"claims": keys.job_claims(worker), "claimants": keys.JOB_CLAIMANTS, "wake": keys.JOB_WAKE,
                  "registration": registration},
            args={"worker": worker, "job_prefix": JOB_PREFIX, "queue_prefix": QUEUE_PREFIX, **_LINES_VALUES})))

    def give_back_lapsed(self) -> dict[str, int]:
        """The claims of every worker whose RQ registration is gone, back on their queues: worker -> ids."""
        back = {}
        for raw in self.redis.smembers(keys.JOB_CLAIMANTS):  # type: ignore[union-attr]
            worker = as_text(raw)
            n = self.give_back(worker, known_dead=False)
            if n > 0:
                back[worker] = n
        return back

    def reconcile(self, task_id: str, job: Sequence[Command], now_ms: int, bound_ms: int, client: Any = None) -> Any:
        """Queue :data:`RECONCILE` for ``task_id`` (``job``: the commands that queue its job again) on
        ``client`` (a pipeline), or run it now."""
        job_keys, job_args = replay(job)
        conn = self.redis
        zsets = [r.key for name in QUEUES
                 for r in (ScheduledJobRegistry(name, connection=conn), StartedJobRegistry(name, connection=conn))]
        return self._run(RECONCILE, RECONCILE.call(
            keys={"task": keys.task(task_id), "delayed": keys.DELAYED, "unqueued": keys.UNQUEUED,
                  "claimants": keys.JOB_CLAIMANTS, "stats": keys.STATS},
            args={"task_id": task_id, "now_ms": now_ms, "bound_ms": bound_ms, "job_prefix": JOB_PREFIX,
                  "queue_prefix": QUEUE_PREFIX, "zsets": " ".join(zsets), "claims_prefix": keys.job_claims(""),
                  "stat": keys.STAT_RECONCILED, "job_argc": len(job_args)},
            rest_keys=job_keys, rest=job_args), client=client)
