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
import zlib
from typing import Any, cast

import redis
from rq import Callback, Queue
from rq.command import send_stop_job_command
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job
from rq.results import Result
from rq.utils import as_text, current_timestamp, now

from app.core import keys, processors
from app.core.clock import rq_time
from app.core.config import Config
from app.core.lines import line_command
from app.core.lua import Command
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


class JobTemplate:
    """RQ's enqueue of a first job (id = task id) for one (queue, timeout), recorded once with the placeholder
    ``TEMPLATE_ID`` and filled per task where RQ's values depend on the task: the job hash's key, the queue
    entry, ``description``, ``data`` (RQ's serializer over ``(RUN_TASK, None, (task_id,), {})``, compressed
    as RQ's ``Job.to_dict`` does) and ``created_at`` / ``enqueued_at`` (RQ's ``utcformat(now())``, in that
    order). A recording that holds the placeholder anywhere else is refused, so an RQ that changes its
    layout fails loudly (and tests/unit/test_job_template.py fails), never silently."""

    FILLED = frozenset({"created_at", "enqueued_at", "data", "description"})

    def __init__(self, recorded: list[Command], serializer: Any) -> None:
        self.serializer = serializer
        job_key = Job.key_for(TEMPLATE_ID)
        # per command: its name, its key (None: the job hash's), its args, and which args to fill in
        self.commands: list[tuple[str, str | None, tuple[Any, ...], dict[int, str]]] = []
        for name, key, args in recorded:
            slots: dict[int, str] = {}
            if name == "HSET" and key == job_key:
                slots = {i + 1: args[i] for i in range(0, len(args) - 1, 2) if args[i] in self.FILLED}
            elif name == "RPUSH" and args == (TEMPLATE_ID,):
                slots = {0: "id"}
            rest = [a for i, a in enumerate(args) if i not in slots]
            if (key != job_key and TEMPLATE_ID in key) or any(TEMPLATE_ID in str(a) for a in rest):
                raise RuntimeError(f"RQ's enqueue holds the job id where taskport does not fill it in: {name} {key}")
            self.commands.append((name, None if key == job_key else key, args, slots))

    def fill(self, task_id: str, at: str | None = None) -> list[Command]:
        """RQ's commands for the job of ``task_id``, as its own enqueue would record them now (``at``: the time
        RQ would write, ``utcformat(now())``, read once for a batch's jobs)."""
        values = {"id": task_id, "description": f"task {task_id}", "created_at": at or rq_now(),
                  "data": rq_compress(self.serializer.dumps((RUN_TASK, None, (task_id,), {})))}
        values["enqueued_at"] = at or rq_now()
        job_key = Job.key_for(task_id)
        commands = []
        for name, key, args, slots in self.commands:
            if slots:
                filled = list(args)
                for i, field in slots.items():
                    filled[i] = values[field]
                args = tuple(filled)
            commands.append(Command(name, job_key if key is None else key, args))
        return commands


class JobQueue:
    def __init__(self, conn: redis.Redis, config: Config) -> None:
        self.redis = conn
        self.config = config
        self.queues = {name: Queue(name, connection=conn) for name in QUEUES}
        self._templates: dict[tuple[str, int], JobTemplate] = {}
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
        submit) is RQ's recording for its (queue, timeout), made once with a placeholder id, then filled in
        (:class:`JobTemplate`; tests/unit/test_job_template.py compares the two with RQ's own). ``at``: its
        times (:func:`rq_now`), for the jobs of one batch. ``member``: the task's, whose line the job joins
        (app.core.lines: fair dispatch); None queues it in RQ's list only, taken in its turn there.
        """
        if job_id is None or job_id == task_id:
            template = self._templates.get((priority, timeout))
            if template is None:
                recorded = self._recorded(TEMPLATE_ID, priority, timeout, None)
                template = JobTemplate(recorded, self.queues[priority].serializer)
                self._templates[(priority, timeout)] = template
            commands = template.fill(task_id, at)
        else:
            commands = self._recorded(task_id, priority, timeout, job_id)
        if member is not None:
            commands.append(line_command(priority, member, task_id, job_id or task_id, self._weights.get(member, 1)))
        return commands

    def _recorded(self, task_id: str, priority: str, timeout: int, job_id: str | None) -> list[Command]:
        """RQ's own enqueue of the task's job, recorded (see :meth:`job_commands`)."""
        recorder = self.redis.pipeline(transaction=True)
        recorder.multi()  # as RQ expects of a caller's pipeline
        queue = self.queues[priority]
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
        return [*commands, Command("RPUSH", keys.JOB_WAKE, (priority,))]  # wakes an idle worker (app.core.jobclaims)

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
