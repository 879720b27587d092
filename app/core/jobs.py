"""The RQ side of a task: one job per delivery chain, whose only argument is the task id.

The first job's id is the task id. A recovery (housekeeping taking a task whose heartbeat stopped)
re-queues it under a job id of its own (:func:`attempt_job_id`), recorded in the task's hash: the
stalled delivery may still be alive, and when it ends RQ deletes *its* job, which must not be the
re-queued one (that would leave the task PENDING with no job until it expires).

RQ's own job data stays small and short-lived: the task hash is the record, so a job keeps no
result record (``RESULT_TTL``). What operators read in rq-dashboard is each task's end (workers.outcome,
``RecordsOutcome``): a COMPLETED task's job stays in the finished registry for ``FINISHED_JOB_TTL``, a FAILED
one's in the failed registry, with the task's code and message, for ``FAILED_JOB_TTL``, a cancelled one's in
the canceled registry for ``CANCELED_JOB_TTL``; housekeeping trims the three (:meth:`JobQueue.trim_finished`)
and drops a task's job from them when the task itself expires (:meth:`JobQueue.forget`). A queued job has
no TTL of its own: housekeeping removes it when its task expires (a job that vanished while its id sat in
a queue would be skipped silently).
"""

from __future__ import annotations

import logging
import re
import zlib
from typing import Any, NamedTuple, cast

import redis
from redis.connection import Encoder
from rq import Callback, Queue
from rq.command import send_stop_job_command
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.results import Result
from rq.utils import as_text, current_timestamp, now

from app.core import keys, processors
from app.core.clock import rq_time
from app.core.config import Config
from app.core.lines import LINE, line_command
from app.core.lua import Command
from app.core.processors import DEFAULT_TIMEOUT
from app.core.states import QUEUES
from app.core.task import Task

RUN_TASK = "workers.runner.run_task"
ON_STOPPED = Callback("workers.runner.on_stopped")  # the worker removes what a killed work horse wrote
# RQ deletes a finished job at once. Keeping it 1 s instead spares the worker a synchronous delete
# (~10% more no-op jobs per second, measured) but leaves two keys per task behind for that second,
# which grow Redis's tables (~+700 B per finished task in the 10,000-task memory benchmark):
# see bench/README.md, "Optimizations".
RESULT_TTL = 0
FAILED_JOB_TTL = 3600  # seconds RQ keeps a failed job for operators in rq-dashboard
CANCELED_JOB_TTL = FAILED_JOB_TTL  # and a job stopped on request in its canceled registry (trimmed by housekeeping)
# Seconds a COMPLETED task's job stays in the finished registry, so rq-dashboard's "Finished" shows the last ten
# minutes (RQ's own default result window, 500 s, rounded up). Each such job costs Redis memory for that long, its
# hash and its registry entry (measured: docs/operations.md, "Monitoring"): N x 600 of them at N completions a
# second, cut to FINISHED_JOBS_KEPT per queue (the newest) by every housekeeping pass, so a busy queue's
# window is shorter and its cost bounded whatever the throughput.
FINISHED_JOB_TTL = 600
FINISHED_JOBS_KEPT = 1000
REGISTRIES_OF_ENDS = ("finished_job_registry", "failed_job_registry", "canceled_job_registry")

log = logging.getLogger(__name__)


def attempt_job_id(task_id: str, attempt: int) -> str:
    """The RQ job id under which a recovery re-queues a task after ``attempt`` (RQ allows [A-Za-z0-9_-])."""
    return f"{task_id}_{attempt}"


def task_of_job(job_id: str) -> str:
    """The task id of an RQ job id: the task id itself, or one of the ids above (the task id and a suffix)."""
    return job_id.split("_", 1)[0]


def resume_job_id(task_id: str, seq: int) -> str:
    """The RQ job id under which a task goes back on its queue to resume from its checkpoint (a graceful stop,
    or a lost run whose checkpoint advanced): unique per run (``seq`` grows with every write), so it never
    names the job of the run that is still ending."""
    return f"{task_id}_r{seq}"


def rerun_job_id(task_id: str, seq: int) -> str:
    """The RQ job id under which a FAILED or CANCELLED task is queued to run again (app.core.rerun): unique per
    write of the task (``seq``), so RQ never takes it for the failed delivery's job still in its registries."""
    return f"{task_id}_a{seq}"


def retry_job_id(task_id: str, attempts: int) -> str:
    """The RQ job id under which a task runs again after its attempt ``attempts`` failed (a retry): unique per
    retry, since a task's attempts before a retry only grow (a refund gives back the same run's start)."""
    return f"{task_id}_t{attempts}"


def delayed_job_id(task: Task) -> str:
    """The RQ job id under which a task of keys.DELAYED is queued when due (app.core.deferred): the task id for
    its first run (a submit's run_at, a then task released), else its retry's (:func:`retry_job_id`), so a
    retry is never queued under the id of the failed delivery that RQ may still be deleting."""
    return retry_job_id(task.id, task.attempts) if task.attempts else task.id


TEMPLATE_ID = "00000000-0000-0000-0000-000000000000"  # the placeholder job id of a JobTemplate's recording
TEMPLATE_MEMBER = "00000000-member"  # and its placeholder member (the line its job joins)


def rq_now() -> str:
    """Now as RQ writes a job's times (``utcformat(now())``, by a cheaper formatter: app.core.clock.rq_time)."""
    return rq_time(now())


# RQ stores a job's data as ``zlib.compress(data)``. For an input this short zlib's memLevel cannot change the
# bytes it writes (memLevel is not in the stream's header; a smaller hash table still chains every true match,
# and its symbol buffer, 1 << (memLevel + 6) entries, holds the whole input, so no block ends early), but the
# default level 8 clears a 128 KiB hash table per call: two thirds of the call for a job's ~85 bytes
# (bench/README.md, "Submit, sixth pass"). Longer data goes through zlib.compress itself.
_SMALL_DATA = 120  # bytes: under the 127 symbols memLevel 1's buffer holds before it ends a block


def rq_compress(data: bytes) -> bytes:
    """``zlib.compress(data)``, the same bytes, cheaper for the short data of a taskport job."""
    if len(data) > _SMALL_DATA:
        return zlib.compress(data)
    packer = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, zlib.MAX_WBITS, 1)
    return packer.compress(data) + packer.flush()


_ENCODER = Encoder("utf-8", "strict", False)
_SEPARATOR = "\x00"  # in no task id, member (from the environment) or key  # redis-py's: the bytes a value is sent as


class FirstJob(NamedTuple):
    """A first job (id = task id) as the submit script takes it: its template's name (the queue), rendered into the
    script (:meth:`JobTemplate.lua`), the keys of its commands, and the values that differ from job to job
    (:data:`JobTemplate.SLOTS`; the task id and the member are the script's own arguments)."""

    queue: str
    keys: list[str]
    at: str
    data: bytes
    timeout: int
    weight: str


class JobTemplate:
    """RQ's enqueue of a first job (id = task id) on one queue and its place in its member's line
    (app.core.lines.line_command), recorded once with the placeholders ``TEMPLATE_ID`` and ``TEMPLATE_MEMBER`` and
    filled per job where the values depend on it: a key or string argument that holds a placeholder gets the task id
    or the member in its place (the job hash's key, its ``description``, the queue entry, the line's key and
    arguments); the job hash's :data:`FILLED` fields get ``data`` (RQ's serializer over
    ``(RUN_TASK, None, (task_id,), {})``, compressed as RQ's ``Job.to_dict`` does), ``timeout`` and RQ's time
    (``created_at``, ``enqueued_at``: ``utcformat(now())``, read once); the line command's last argument the
    member's weight. A recording that holds a placeholder anywhere else (in bytes, a number) is refused, so an RQ
    that changes its layout fails loudly (and tests/unit/test_job_template.py fails), never silently.

    One recording, two forms: :meth:`fill` gives the commands (the batch create replays them), :meth:`lua` the same
    commands as a Lua table for the submit script, whose call sends only what :meth:`first` gives: the values that
    differ from job to job, ~5 arguments instead of ~59 (bench/README.md, "Submit, seventh pass").
    """

    FILLED = {"created_at": "at", "enqueued_at": "at", "data": "data", "timeout": "timeout"}  # job hash field: slot
    SLOTS = ("at", "data", "timeout", "weight")  # the values of a job that no placeholder names (FirstJob's)

    def __init__(self, recorded: list[Command], serializer: Any, queue: str = "") -> None:
        self.serializer = serializer
        self.queue = queue  # its name in the submit script (FirstJob.queue)
        job_key = Job.key_for(TEMPLATE_ID)
        # a slot is an index into a job's values: SLOTS' first, then each distinct string that holds a placeholder
        self._texts: list[str] = []
        # per command: its name, its key, the key's slot (-1: none), its args, which args to fill in (index: slot)
        self.commands: list[tuple[str, str, int, tuple[Any, ...], dict[int, int]]] = []
        for name, key, args in recorded:
            slots: dict[int, int] = {}
            if name == "HSET" and key == job_key:
                slots = {i + 1: self.SLOTS.index(self.FILLED[args[i]]) for i in range(0, len(args) - 1, 2)
                         if args[i] in self.FILLED}
            elif name == LINE:
                slots = {len(args) - 1: self.SLOTS.index("weight")}
            for i, arg in enumerate(args):
                if i not in slots and isinstance(arg, str) and _placeheld(arg):
                    slots[i] = self._text(arg)
                elif i not in slots and _placeheld(_ENCODER.encode(arg).decode("latin-1")):
                    raise RuntimeError(f"RQ's enqueue holds the job id where taskport does not fill it in: {name}")
            self.commands.append((name, key, self._text(key) if _placeheld(key) else -1, args, slots))
        # every such string in one, filled by two replaces a job (a replace or a format per string cost ~1 µs more)
        if any(_SEPARATOR in text for text in self._texts):
            raise RuntimeError("RQ's enqueue holds a NUL in a string taskport fills in")
        self._joined = _SEPARATOR.join(self._texts)

    def _text(self, text: str) -> int:
        """The slot of a string that holds a placeholder (filled once per job, however often it is used)."""
        if text not in self._texts:
            self._texts.append(text)
        return len(self.SLOTS) + self._texts.index(text)

    @classmethod
    def record(cls, queue: Queue) -> JobTemplate:
        """``queue``'s template: RQ's own enqueue, recorded on a pipeline never sent (no connection is made)."""
        return cls(recorded_enqueue(queue, TEMPLATE_ID, DEFAULT_TIMEOUT, None)
                   + [line_command(queue.name, TEMPLATE_MEMBER, TEMPLATE_ID, TEMPLATE_ID, 1)], queue.serializer,
                   queue.name)

    def fill(self, task_id: str, timeout: int, member: str | None = None, weight: int = 1,
             at: str | None = None) -> list[Command]:
        """RQ's commands for the job of ``task_id``, as its own enqueue would record them now (``at``: the time
        RQ would write, ``utcformat(now())``, read once for a batch's jobs), then its place in ``member``'s line
        (None: none, the job is in RQ's list only)."""
        values: list[Any] = [at or rq_now(), self._data(task_id), timeout, str(weight),
                             *self._texts_filled(task_id, member)]
        commands = []
        for name, key, keyed, args, slots in self.commands:
            if name == LINE and member is None:
                continue
            if slots:
                filled = list(args)
                for i, slot in slots.items():
                    filled[i] = values[slot]
                args = tuple(filled)
            commands.append(Command(name, key if keyed < 0 else values[keyed], args))
        return commands

    def first(self, task_id: str, member: str, timeout: int, weight: int = 1) -> FirstJob:
        """The job of ``task_id`` in ``member``'s line as the submit script takes it (:meth:`lua`)."""
        texts, base = self._texts_filled(task_id, member), len(self.SLOTS)
        keys_ = [key if keyed < 0 else texts[keyed - base] for _, key, keyed, _, _ in self.commands]
        return FirstJob(self.queue, keys_, rq_now(), self._data(task_id), timeout, str(weight))

    def lua(self, names: dict[str, str]) -> str:
        """The template as a Lua table constructor of its commands (name, argc, args... each, as
        app.core.lua.replay lays them out), every constant a literal: ``names`` gives the Lua expression of each
        of :data:`SLOTS` and of the two placeholders' values (keys ``id``, ``member``)."""
        items: list[str] = []
        for name, _, _, args, slots in self.commands:
            items += [_lua_string(name), _lua_string(str(len(args)))]
            for i, arg in enumerate(args):
                slot = slots.get(i, -1)
                items.append(_lua_string(_ENCODER.encode(arg)) if slot < 0 else names[self.SLOTS[slot]]
                             if slot < len(self.SLOTS) else _lua_text(arg, names))
        return "{" + ", ".join(items) + "}"

    def _texts_filled(self, task_id: str, member: str | None) -> list[str]:
        """Each string that holds a placeholder, in slot order, with the task id and the member in their places."""
        joined = self._joined.replace(TEMPLATE_ID, task_id)
        if member is not None:
            joined = joined.replace(TEMPLATE_MEMBER, member)
        return joined.split(_SEPARATOR)

    def _data(self, task_id: str) -> bytes:
        return rq_compress(self.serializer.dumps((RUN_TASK, None, (task_id,), {})))


def job_templates(queue: str, into: str, names: dict[str, str]) -> str:
    """Lua that sets ``into`` to the commands of the first job of the queue named by the Lua variable ``queue``
    (its template's table, :meth:`JobTemplate.lua` with ``names``): only that one table is built per call."""
    chain = [f"{'if' if i == 0 else 'elseif'} {queue} == {_lua_string(name)} then {into} = {template.lua(names)}"
             for i, (name, template) in enumerate(TEMPLATES.items())]
    return "\n".join(chain) + "\nend"


def _placeheld(text: str) -> bool:
    return TEMPLATE_ID in text or TEMPLATE_MEMBER in text


_PLACEHOLDERS = re.compile(f"({re.escape(TEMPLATE_ID)}|{re.escape(TEMPLATE_MEMBER)})")


def _lua_text(text: str, names: dict[str, str]) -> str:
    """``text`` as a Lua expression: its pieces, with each placeholder's Lua expression in its place."""
    parts = [names["id"] if part == TEMPLATE_ID else names["member"] if part == TEMPLATE_MEMBER
             else _lua_string(part.encode()) for part in _PLACEHOLDERS.split(text) if part]
    return parts[0] if len(parts) == 1 else "(" + " .. ".join(parts) + ")"


def _lua_string(value: str | bytes) -> str:
    """``value`` as a Lua string literal, byte for byte: printable ASCII as it is, any other byte, a quote, a
    backslash and the markers' sigils (app.core.lua.render: a script's body is rendered after) as ``\\ddd``."""
    raw = value.encode() if isinstance(value, str) else value
    return "'" + "".join(chr(b) if 32 <= b < 127 and b not in _ESCAPED else f"\\{b:03d}" for b in raw) + "'"


_ESCAPED = frozenset(b"'\\$@&!%")


class JobQueue:
    def __init__(self, conn: redis.Redis, config: Config) -> None:
        self.redis = conn
        self.config = config
        self.queues = {name: Queue(name, connection=conn) for name in QUEUES}
        self._weights = config.weights  # member -> its weight in fair dispatch, when not 1 (app.core.lines)

    def requeue_commands(self, task: Task, job_id: str) -> list[Command]:
        """The commands that queue ``task`` again as job ``job_id`` (a recovery, a put-back), with the timeout
        of its processor (the default one if this process has none of that type)."""
        proc = processors.get(task.type)
        timeout = proc.timeout if proc else processors.DEFAULT_TIMEOUT
        return self.job_commands(task.id, task.priority, timeout, job_id, member=task.member)

    def job_commands(self, task_id: str, priority: str, timeout: int, job_id: str | None = None,
                     at: str | None = None, *, member: str | None = None) -> list[Command]:
        """The commands that queue the task's job (id ``job_id``, default the task id), for a script or a
        transaction of the store to replay (:meth:`app.core.store.TaskStore.create`, ``recover``).

        They are RQ's own: RQ writes a job only onto a redis-py pipeline, so its enqueue is recorded on
        one that is never sent. Each of its commands acts on one key (a job hash, a queue list, RQ's set
        of queues), which is what a script that declares its keys needs. A first job (id = task id, every
        submit) is its queue's recording, made once with placeholders, then filled in (:data:`TEMPLATES`;
        tests/unit/test_job_template.py compares the two with RQ's own). ``at``: its times (:func:`rq_now`), for
        the jobs of one batch. ``member``: the task's, whose line the job joins (app.core.lines: fair dispatch);
        None queues it in RQ's list only, taken in its turn there.
        """
        weight = self._weights.get(member, 1) if member is not None else 1
        if job_id is None or job_id == task_id:
            return TEMPLATES[priority].fill(task_id, timeout, member, weight, at)
        commands = recorded_enqueue(self.queues[priority], task_id, timeout, job_id)
        if member is not None:
            commands.append(line_command(priority, member, task_id, job_id, weight))
        return commands

    def first_job(self, task_id: str, priority: str, timeout: int, member: str) -> FirstJob:
        """The first job of a submit's task (id = task id, in ``member``'s line), as the submit script takes it:
        its queue's template is in the script, the call sends what differs (:meth:`JobTemplate.first`)."""
        return TEMPLATES[priority].first(task_id, member, timeout, self._weights.get(member, 1))

    def enqueue_call(self, queue: str, func: str, *args: Any, **options: Any) -> None:
        """A plain RQ job of ``func(*args)`` on ``queue`` (RQ's ``Queue.enqueue`` options), e.g. an alert."""
        Queue(queue, connection=self.redis).enqueue(func, *args, **options)

    def trim_finished(self) -> None:
        """Trim RQ's registries of ended jobs (RQ itself does it only every ten minutes, and never the canceled
        one): drop the entries whose window is over from the finished and failed registries (their job hashes
        expire by themselves), stopped jobs older than ``CANCELED_JOB_TTL`` from the canceled registries, and
        the oldest finished jobs beyond ``FINISHED_JOBS_KEPT`` per queue, with their hashes. One round trip,
        two when something is dropped by id."""
        now = current_timestamp()
        pipe = self.redis.pipeline(transaction=False)
        for queue in self.queues.values():
            pipe.zremrangebyscore(queue.finished_job_registry.key, 0, now)  # what RQ's cleanup() of each does
            pipe.zremrangebyscore(queue.failed_job_registry.key, 0, now)
            pipe.zrangebyscore(queue.canceled_job_registry.key, "-inf", now - CANCELED_JOB_TTL)
            pipe.zrange(queue.finished_job_registry.key, 0, -(FINISHED_JOBS_KEPT + 1))  # oldest first
        answers = iter(pipe.execute())
        pipe = self.redis.pipeline(transaction=False)
        dropped: list[str] = []
        for queue in self.queues.values():
            next(answers), next(answers)
            for key, ids in ((queue.canceled_job_registry.key, next(answers)),
                             (queue.finished_job_registry.key, next(answers))):
                if ids:
                    pipe.zrem(key, *ids)
                    dropped += [as_text(i) for i in cast(list[bytes], ids)]
        if dropped:
            pipe.delete(*(Job.key_for(i) for i in dropped))
            pipe.execute()

    def forget(self, *job_ids: str) -> None:
        """Drop the jobs of ended tasks (their current job ids) from the finished, failed and canceled registries
        of every queue, with their hashes and result records: the task expired, so its job goes with it (one
        round trip, however many)."""
        if not job_ids:
            return
        pipe = self.redis.pipeline(transaction=False)
        for queue in self.queues.values():
            for registry in REGISTRIES_OF_ENDS:
                pipe.zrem(getattr(queue, registry).key, *job_ids)
        pipe.delete(*(Job.key_for(i) for i in job_ids), *(Result.get_key(i) for i in job_ids))
        pipe.execute()

    def forget_failed(self, queue: str, job_id: str) -> None:
        """Drop job ``job_id`` from ``queue``'s failed registry, with its hash and result record, when it is
        there (a task run again: its newer job files its own failure). A job found elsewhere (a run still ending
        after a cancel) is left to its worker. Safe twice: the second finds nothing."""
        if self.redis.zrem(self.queues[queue].failed_job_registry.key, job_id):
            self.redis.delete(Job.key_for(job_id), Result.get_key(job_id))

    def remove(self, *job_ids: str) -> list[str]:
        """Drop queued (or retry-scheduled) jobs so they never start (two round trips at most, however many);
        return the ids found in no queue or schedule: taken by a worker meanwhile (left to it), or gone.

        A job's hash is deleted only once its id is out of every queue and schedule, by this call: a worker
        that popped the id meanwhile still reads and writes the job (RQ's spawned work horse fetches it
        again), runs it, finds its task no longer PENDING and does nothing, and RQ deletes the job as it
        deletes every finished one (``RESULT_TTL``). Deleting it under the worker made RQ raise
        ``NoSuchJobError`` with a traceback and left the delivery in the started registry.
        """
        if not job_ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:
            for queue in self.queues.values():
                queue.remove(job_id, pipeline=pipe)  # LREM: 1 if the id was queued there
                queue.scheduled_job_registry.remove(job_id, pipeline=pipe)  # ZREM: 1 if it waited for a retry
        removed = pipe.execute()
        per_job = 2 * len(self.queues)
        dropped: list[str] = []
        taken: list[str] = []
        for i, job_id in enumerate(job_ids):
            (dropped if any(removed[i * per_job:(i + 1) * per_job]) else taken).append(job_id)
        if dropped:
            self.redis.delete(*(Job.key_for(i) for i in dropped))
        return taken

    def stop(self, job_id: str) -> None:
        """Ask the worker running the job to kill its work horse (fork and spawn workers only)."""
        try:
            send_stop_job_command(self.redis, job_id)
        except (NoSuchJobError, InvalidJobOperation):
            pass  # not running (anymore): the processor's next cancellation point sees the cancel


def register_queues(conn: redis.Redis) -> None:
    """List every queue in RQ's set of queues now, so rq-dashboard and ``rq info`` show high, default and
    low from the start (RQ adds a queue there only at its first enqueue). One idempotent SADD."""
    conn.sadd(Queue.redis_queues_keys, *(Queue(name, connection=conn).key for name in QUEUES))


def recorded_enqueue(queue: Queue, task_id: str, timeout: int, job_id: str | None) -> list[Command]:
    """RQ's own enqueue of the task's job on ``queue``, recorded on a pipeline that is never sent (see
    :meth:`JobQueue.job_commands`), then the wake of an idle worker (app.core.jobclaims)."""
    recorder = queue.connection.pipeline(transaction=True)
    recorder.multi()  # as RQ expects of a caller's pipeline
    job = queue.create_job(
        RUN_TASK,
        args=(task_id,),
        job_id=job_id or task_id,
        timeout=timeout,  # RQ raises JobTimeoutException in run_task, which fails the task with -2
        result_ttl=RESULT_TTL,
        failure_ttl=FAILED_JOB_TTL,
        description=f"task {task_id}",
        on_stopped=ON_STOPPED,
    )
    queue.enqueue_job(job, pipeline=recorder)
    commands = [Command(name, key, tuple(rest)) for (name, key, *rest), _options in recorder.command_stack]
    recorder.reset()
    return [*commands, Command("RPUSH", keys.JOB_WAKE, (queue.name,))]


def _offline_queue(name: str) -> Queue:
    """Queue ``name`` on a client that never connects: RQ's pipeline records without sending, and the one thing RQ
    reads before an enqueue, the server's version (INFO), is given (RQ writes nothing of it into the job)."""
    queue = Queue(name, connection=redis.Redis())
    queue.redis_server_version = (7, 0, 0)
    return queue


# Each queue's first job, recorded once per process at import: what JobQueue fills in and what the submit script
# holds as Lua (app.core.scripts.SUBMIT). tests/unit/test_job_template.py compares them with RQ's own enqueue.
TEMPLATES = {name: JobTemplate.record(_offline_queue(name)) for name in QUEUES}
