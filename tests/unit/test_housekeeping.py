"""Housekeeping passes on fakeredis: expiry, tombstones, stall recovery, monitoring, the pass lock; and the
recovery at once of a dead worker's run by the worker that takes its slot (workers.takeover)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta

import pytest
from rq import Worker
from rq.command import PUBSUB_CHANNEL_TEMPLATE, parse_payload
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry
from rq.utils import now as rq_now
from rq.utils import utcformat

from app.core import keys, processors
from app.core.answers import NewTask
from app.core.clock import now_ms
from app.core.config import Config
from app.core.jobs import FAILED_JOB_TTL
from app.core.keys import TaskField
from app.core.states import CLAIM_TAKEN, QUEUES, TaskStatus
from workers.housekeeping import Housekeeper, PassReport, recover_now
from workers.takeover import replace_predecessor
from workers.worker import StoppableSimpleWorker

HOUR = 3600 * 1000


@pytest.fixture
def hk(conn, config):
    processors.load()
    return Housekeeper(conn, config)


def make(hk, max_attempts=1):
    new = NewTask(task_id=str(uuid.uuid4()), member="public", type="demo.sleep", payload={},
                  dedup_digest=uuid.uuid4().hex, priority="default", max_attempts=max_attempts)
    hk.store.create(new, hk.jobs.job_commands(new.task_id, "default", 60))
    return new.task_id


def run(hk, task_id, worker=""):
    started = hk.store.start(task_id, "run-1", worker=worker).started
    assert started is not None
    return "run-1"


def pass_(hk, name, now):
    report = PassReport(name)
    getattr(hk, name)(report, now=now)
    return report


def test_expiry_tombstones_terminal_tasks_and_deletes_results(hk, conn, config):
    task_id = make(hk)
    hk.store.complete(task_id, run(hk, task_id), {"x": 1}, items=None, failures=[], error_code=None)
    with hk.results.writer(task_id, "out.csv") as f:
        f.write(b"a,b\n")
    report = pass_(hk, "expire", now_ms() + config.result_ttl * 1000 + 1000)
    assert report.counts["expired_completed"] == 1
    task = hk.store.get(task_id)
    assert task.status == TaskStatus.EXPIRED and task.error_code is None
    assert not conn.exists(keys.result(task_id)) and conn.hget(keys.task(task_id), "result") is None
    with pytest.raises(FileNotFoundError):
        hk.results.open(task_id, "out.csv")
    assert 0 < conn.ttl(keys.task(task_id)) <= config.tombstone_ttl
    assert pass_(hk, "expire", now_ms() + config.result_ttl * 1000 + 2000).counts.get("due") is None


def test_expiry_of_unfinished_tasks_is_minus_4_and_removes_the_job(hk, conn, config):
    task_id = make(hk)
    assert conn.exists(f"rq:job:{task_id}")
    report = pass_(hk, "expire", now_ms() + config.task_ttl * 1000 + 1000)
    assert report.counts["expired_pending"] == 1
    task = hk.store.get(task_id)
    assert task.status == TaskStatus.EXPIRED and task.error_code == -4
    assert not conn.exists(f"rq:job:{task_id}", keys.payload(task_id))


def test_expiry_trims_rqs_finished_registries(hk, conn):
    registry = hk.jobs.queues["default"].finished_job_registry
    conn.zadd(registry.key, {"old-job": 1, "fresh-job": 4_000_000_000})
    pass_(hk, "expire", now_ms())
    assert conn.zrange(registry.key, 0, -1) == [b"fresh-job"]


def test_expiry_leaves_tasks_that_are_not_due(hk, config):
    task_id = make(hk)
    assert pass_(hk, "expire", now_ms()).counts.get("due") is None
    assert hk.store.get(task_id).status == TaskStatus.PENDING


def test_tombstone_past_its_time_leaves_the_index(hk, conn, config):
    task_id = make(hk)
    pass_(hk, "expire", now_ms() + config.task_ttl * 1000 + 1000)
    conn.delete(keys.task(task_id))  # what Redis does when the tombstone's TTL runs out
    pass_(hk, "expire", now_ms() + (config.task_ttl + config.tombstone_ttl) * 1000 + 2000)
    assert conn.zscore(keys.EXPIRY, task_id) is None


def test_history_is_trimmed_of_tasks_that_cannot_exist_any_more(hk, conn, config):
    task_id = make(hk)
    lifetime = (config.task_ttl + config.result_ttl + config.tombstone_ttl) * 1000
    report = pass_(hk, "expire", now_ms() + lifetime + 1000)
    assert report.counts["history_trimmed"] == 1 and conn.zscore(keys.history("public"), task_id) is None


def test_a_stalled_run_is_requeued_without_using_an_attempt(hk, conn, config):
    task_id = make(hk, max_attempts=1)
    run_id = run(hk, task_id)
    hk.jobs.remove(task_id)  # a worker took the job; it died with it
    report = pass_(hk, "recover", now_ms() + int(config.stall_timeout * 1000) + 1000)
    assert report.counts == {"recovered_to_pending": 1}
    task = hk.store.get(task_id)
    assert (task.status, task.attempts, task.lost_runs) == (TaskStatus.PENDING, 0, 1)  # the platform's fault
    # re-queued under a job id of its own, recorded in the task (cancel and expiry act on that job)
    job = hk.store.job_id(task_id)
    assert job.startswith(f"{task_id}_r") and conn.lrange("rq:queue:default", 0, -1) == [job.encode()]
    assert hk.store.report(task_id, run_id, None) == CLAIM_TAKEN  # the lost run's late heartbeat loses
    again = hk.store.start(task_id, "run-2").started
    assert again is not None and again.task.attempts == 1
    assert hk.store.report(task_id, run_id, None) == CLAIM_TAKEN  # never the new run's PROCESSING
    assert hk.stats.read()["recovered"] == 1


def test_a_stalled_simple_worker_runs_job_expires_as_a_failed_job_would(hk, conn, config):
    """The simple worker writes no started registry entry for a taskport run (RQ's clean-up of it filed a dead
    worker's job as abandoned, with a TTL), nor its started state: the recovery gives the lost run's job hash,
    as it was queued, that TTL."""
    task_id = make(hk, max_attempts=2)
    run(hk, task_id, SLOT)
    conn.lrem("rq:queue:default", 0, task_id)
    job = Job.fetch(hk.store.job_id(task_id), connection=conn)
    worker = StoppableSimpleWorker(list(QUEUES), name=SLOT, connection=conn)
    with conn.pipeline(transaction=False) as pipe:
        worker._recorded_start(job, 120, pipe)
        pipe.execute()
    assert conn.ttl(job.key) == -1
    pass_(hk, "recover", now_ms() + int(config.stall_timeout * 1000) + 1000)
    assert hk.store.get(task_id).status == TaskStatus.PENDING
    assert 0 < conn.ttl(job.key) <= FAILED_JOB_TTL


def test_lost_runs_past_the_bound_without_progress_fail_minus_3(hk, config):
    """Finding 12: a crash before the first checkpoint is not the task's fault; only a poison item, lost
    ``lost_runs`` + 1 times in a row without progress, fails it."""
    task_id = make(hk, max_attempts=1)
    for n in range(config.lost_runs + 1):
        run(hk, task_id)
        pass_(hk, "recover", now_ms() + int(config.stall_timeout * 1000) + 1000)
        task = hk.store.get(task_id)
        if n < config.lost_runs:
            assert (task.status, task.attempts, task.lost_runs) == (TaskStatus.PENDING, 0, n + 1)
    assert config.lost_runs >= 2 and task.status == TaskStatus.FAILED and task.error_code == -3


def test_a_live_heartbeat_is_never_recovered(hk, config):
    task_id = make(hk, max_attempts=2)
    run(hk, task_id)
    assert pass_(hk, "recover", now_ms()).counts == {}
    assert hk.store.get(task_id).status == TaskStatus.PROCESSING


def test_slow_tasks_are_logged_once(hk, config, caplog):
    task_id = make(hk)
    run(hk, task_id)
    later = now_ms() + int(config.slow_task_warn * 1000) + 1000
    with caplog.at_level(logging.WARNING):
        assert pass_(hk, "monitor", later).counts["slow_warned"] == 1
        assert "slow_warned" not in pass_(hk, "monitor", later).counts
    assert sum("slow task" in r.getMessage() for r in caplog.records) == 1


def test_failures_over_the_threshold_alert_once_per_window(hk, conn, config, caplog):
    for _ in range(config.alert_failures):
        task_id = make(hk)
        hk.store.fail(task_id, run(hk, task_id), 10001, "nope")
    with caplog.at_level(logging.ERROR):
        assert pass_(hk, "monitor", now_ms()).counts["alerts"] == 1
        assert "alerts" not in pass_(hk, "monitor", now_ms()).counts
    assert any("ALERT" in r.getMessage() for r in caplog.records)
    assert hk.stats.read()["failed"] == config.alert_failures


def test_webhook_alert_is_queued_not_sent_inline(conn, tmp_path):
    config = Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, alert_failures=1,
                             alert_webhook="http://127.0.0.1:9/hook")
    hk = Housekeeper(conn, config)
    task_id = make(hk)
    hk.store.fail(task_id, run(hk, task_id), 1, "x")
    pass_(hk, "monitor", now_ms())
    assert conn.llen("rq:queue:housekeeping") == 1


def test_pass_lock_runs_a_pass_once_per_interval(hk):
    ran = []
    assert not hk.locked("expire", ran.append).skipped
    assert hk.locked("expire", ran.append).skipped
    assert len(ran) == 1


# -- a worker restarted in its slot recovers its dead predecessor's run at once --------------------------
SLOT = "host.0123abcd.worker-1"


def predecessor_running(hk, conn, task_id, name=SLOT):
    """A worker registered under ``name`` that took ``task_id``'s job and died (no death registered)."""
    worker = StoppableSimpleWorker(list(QUEUES), name=name, connection=conn)
    worker.register_birth()
    worker._renewing.set()  # its renewal thread dies with it
    conn.lrem("rq:queue:default", 0, task_id)  # the worker popped the job
    job = Job.fetch(hk.store.job_id(task_id), connection=conn)
    with conn.pipeline() as pipe:
        Execution.create(job, 120, pipe, worker_name=name)
        job.prepare_for_execution(name, pipeline=pipe)
        pipe.execute()
    return worker, job


def test_recover_now_takes_a_run_whose_heartbeat_is_fresh_but_only_of_that_job(hk):
    task_id = make(hk, max_attempts=2)
    run(hk, task_id)  # it beat just now: housekeeping would wait for the stall timeout
    assert recover_now(hk.store, hk.jobs, task_id, f"{task_id}_9") is None  # another job's run: left alone
    task, status = recover_now(hk.store, hk.jobs, task_id, task_id)
    assert (task.status, status) == (TaskStatus.PROCESSING, TaskStatus.PENDING)
    job = hk.store.job_id(task_id)
    assert hk.store.get(task_id).status == TaskStatus.PENDING and job.startswith(f"{task_id}_r")
    assert recover_now(hk.store, hk.jobs, task_id, job) is None  # PENDING: nothing to recover


def test_a_worker_in_a_dead_predecessors_slot_recovers_its_run_and_removes_it_from_rq(hk, conn, config, caplog):
    task_id = make(hk, max_attempts=1)
    run_id = run(hk, task_id)
    hk.store.report(task_id, run_id, 50, items={"total": 4, "succeeded": 2, "failed": 0},
                    checkpoint=b'{"c":[4,2,0],"e":null,"r":[[0,4,2,2]]}')  # a checkpoint: it resumes for free
    predecessor, job = predecessor_running(hk, conn, task_id)
    with caplog.at_level(logging.INFO, logger="workers.worker"):
        replace_predecessor(conn, config, SLOT)
    task = hk.store.get(task_id)
    assert (task.status, task.attempts) == (TaskStatus.PENDING, 0)  # its attempt given back
    assert hk.store.job_id(task_id).startswith(f"{task_id}_r")  # from its checkpoint
    [line] = [r for r in caplog.records if "predecessor" in r.getMessage()]  # one line, with the task id
    assert getattr(line, "task_id", None) == task_id and "now PENDING (from its checkpoint" in line.getMessage()
    # RQ: the dead worker is out of its sets and its registration going; its delivery an abandoned job
    assert Worker.all(connection=conn) == [] and conn.hexists(predecessor.key, "death")
    assert not conn.exists(predecessor.executions_key)
    assert all(conn.zcard(StartedJobRegistry(q, connection=conn).key) == 0 for q in QUEUES)
    assert job.get_status(refresh=True) == JobStatus.FAILED and 0 < conn.ttl(job.key) <= 3600
    successor = StoppableSimpleWorker(list(QUEUES), name=SLOT, connection=conn)
    successor.register_birth()  # RQ takes the name again (it refused it while the dead one was listed)
    successor.register_death()


def test_a_simple_workers_run_is_taken_over_from_the_running_index_and_the_task(hk, conn, config, caplog):
    """The simple worker records nothing of a taskport run in RQ (no execution record, no index of the worker's
    executions, no started registry entry, no started state in the job hash: workers.worker
    StoppableSimpleWorker._recorded_start), so RQ lists no current job for it: its successor finds the run from
    taskport's running index and the task (PROCESSING, its worker field naming the slot, written by START).
    Another worker's run is left alone."""
    task_id, other = make(hk, max_attempts=1), make(hk, max_attempts=1)
    started = []
    for t, name in ((task_id, SLOT), (other, "host.0123abcd.worker-2")):
        run(hk, t, name)
        worker = StoppableSimpleWorker(list(QUEUES), name=name, connection=conn)
        worker.register_birth()
        worker._renewing.set()
        conn.lrem("rq:queue:default", 0, t)
        job = Job.fetch(hk.store.job_id(t), connection=conn)
        with conn.pipeline(transaction=False) as pipe:
            worker._recorded_start(job, 120, pipe)
            pipe.execute()
        started.append(job)
    with caplog.at_level(logging.INFO, logger="workers.worker"):
        replace_predecessor(conn, config, SLOT)
    assert hk.store.get(task_id).status == TaskStatus.PENDING  # recovered at once
    assert hk.store.get(other).status == TaskStatus.PROCESSING  # the other slot's run: not this one's
    assert started[0].get_status(refresh=True) == JobStatus.FAILED  # an abandoned job, as RQ records one
    assert started[1].get_status(refresh=True) == JobStatus.QUEUED
    [line] = [r for r in caplog.records if "predecessor" in r.getMessage()]
    assert getattr(line, "task_id", None) == task_id and "its run recovered at once" in line.getMessage()


def test_a_simple_workers_start_of_a_taskport_job_records_nothing_of_the_job(hk, conn):
    """What RQ would record of the run (the job hash's started state, the execution record, the worker's and the
    job's indexes of executions, the started registry) repeats the task hash and the running index: none is
    written. The worker's name is the task's while its run holds it (START), dropped when the run ends."""
    task_id = make(hk)
    worker = StoppableSimpleWorker(list(QUEUES), name=SLOT, connection=conn)
    job = Job.fetch(hk.store.job_id(task_id), connection=conn)
    before = set(conn.keys("*"))
    with conn.pipeline(transaction=False) as pipe:
        execution = worker._recorded_start(job, 120, pipe)
        pipe.execute()
    assert execution.job_id == job.id and execution.worker_name == SLOT
    assert set(conn.keys("*")) - before == {worker.key.encode()}  # its heartbeat: the worker's registration
    assert conn.hmget(job.key, "status", "worker_name") == [b"queued", b""]  # as queued
    run(hk, task_id, SLOT)
    assert conn.hget(keys.task(task_id), TaskField.WORKER) == SLOT.encode()
    assert hk.store.complete(task_id, "run-1", None, items=None, failures=[], error_code=None)
    assert conn.hget(keys.task(task_id), TaskField.WORKER) is None


def test_a_cancel_of_a_simple_workers_run_sends_rqs_stop_job_command_to_that_worker(hk, conn):
    """RQ's send_stop_job_command finds no worker_name in the job hash of a simple worker's run (nothing of the job
    is written at its start), so the cancel itself sends RQ's command to the worker the task names, in the step
    that cancels it; a run that names no worker (a fork or spawn worker's: RQ's own job hash names it) gets none
    from the cancel, only from RQ's command (app.core.jobs.JobQueue.stop), as before."""
    simple, fork = make(hk), make(hk)
    listener = conn.pubsub()
    listener.psubscribe(PUBSUB_CHANNEL_TEMPLATE % "*")
    assert listener.get_message(timeout=1)["type"] == "psubscribe"
    run(hk, simple, SLOT)
    run(hk, fork)
    assert hk.store.cancel(fork).done and hk.store.cancel(simple).done
    message = listener.get_message(timeout=1)
    assert message["channel"] == (PUBSUB_CHANNEL_TEMPLATE % SLOT).encode()
    assert parse_payload(message) == {"command": "stop-job", "job_id": simple}  # as RQ's send_command writes it
    assert listener.get_message(timeout=0.1) is None  # one command, and none for the fork worker's run
    assert conn.hget(keys.task(simple), TaskField.WORKER) is None


def test_past_the_bound_of_lost_runs_the_predecessors_run_fails_minus_3(hk, conn, tmp_path):
    config = Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, lost_runs=0)
    task_id = make(hk, max_attempts=1)
    run(hk, task_id)
    predecessor_running(hk, conn, task_id)
    replace_predecessor(conn, config, SLOT)
    task = hk.store.get(task_id)
    assert (task.status, task.error_code) == (TaskStatus.FAILED, -3)


def test_a_predecessor_that_stopped_cleanly_or_moved_on_is_left_alone(hk, conn, config):
    task_id = make(hk, max_attempts=2)
    run(hk, task_id)
    predecessor, _ = predecessor_running(hk, conn, task_id)
    predecessor.register_death()  # a clean stop
    replace_predecessor(conn, config, SLOT)
    assert hk.store.get(task_id).status == TaskStatus.PROCESSING
    other = make(hk, max_attempts=2)
    run(hk, other)
    predecessor_running(hk, conn, other, name="host.0123abcd.worker-2")
    hk.recover(PassReport("recover"), now=now_ms() + int(config.stall_timeout * 1000) + 1000)  # re-queued
    replace_predecessor(conn, config, "host.0123abcd.worker-2")  # its job is no longer the task's
    assert hk.store.get(other).status == TaskStatus.PENDING and hk.store.job_id(other).startswith(f"{other}_r")
    assert Worker.all(connection=conn) == []  # the dead worker is removed all the same


def test_a_predecessor_asked_to_stop_gets_its_grace_to_register_its_death(hk, conn, tmp_path):
    config = Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, stop_grace=1)
    task_id = make(hk, max_attempts=2)
    run(hk, task_id)
    predecessor, _ = predecessor_running(hk, conn, task_id)
    conn.hset(predecessor.key, "shutdown_requested_date", utcformat(rq_now()))  # RQ's mark of a warm stop
    threading.Timer(0.3, predecessor.register_death).start()  # it puts its run back and exits
    started = time.monotonic()
    replace_predecessor(conn, config, SLOT)
    assert 0.2 < time.monotonic() - started < 5 and hk.store.get(task_id).status == TaskStatus.PROCESSING
    # one whose stop was asked for longer ago than its grace (and margin) is dead: taken over at once
    again = make(hk, max_attempts=2)
    run(hk, again)
    late, _ = predecessor_running(hk, conn, again, name="host.0123abcd.worker-3")
    conn.hset(late.key, "shutdown_requested_date", utcformat(rq_now() - timedelta(seconds=60)))
    replace_predecessor(conn, config, "host.0123abcd.worker-3")
    assert hk.store.get(again).status == TaskStatus.PENDING


def test_a_run_that_starts_after_the_recovery_pass_read_its_task_keeps_its_running_entry(hk, conn, config,
                                                                                       monkeypatch):
    """Finding 5: the pass read the task before its run started (not PROCESSING then), and took it out of the
    running index with that stale read: the run was never stall-recovered, and the task ended EXPIRED -4."""
    task_id = make(hk)
    conn.zadd(keys.RUNNING, {task_id: 1})  # an entry older than the stall timeout, the task still PENDING
    stale = hk.store.get_many([task_id])
    read = hk.store.get_many

    def read_then_start(ids):
        assert hk.store.start(task_id, "run-1").started is not None  # the run starts between read and removal
        conn.zadd(keys.RUNNING, {task_id: 1})  # and goes silent at once
        return stale if ids == [task_id] else read(ids)

    monkeypatch.setattr(hk.store, "get_many", read_then_start)
    pass_(hk, "recover", now_ms() + int(config.stall_timeout * 1000) + 1000)
    monkeypatch.setattr(hk.store, "get_many", read)
    assert conn.zscore(keys.RUNNING, task_id) is not None  # kept: the next pass sees the stall
    assert pass_(hk, "recover", now_ms() + int(config.stall_timeout * 1000) + 1000).counts == {
        "recovered_to_pending": 1}


def test_a_put_back_whose_compare_and_set_lost_queues_no_job(hk, conn):
    """Finding 3: the put-back's job commands ran even when its compare-and-set lost (an orphan job, or the same
    job id twice in its queue)."""
    task_id = make(hk)
    hk.jobs.remove(task_id)
    run(hk, task_id)
    assert hk.store.cancel(task_id).done
    task = hk.store.get(task_id)
    assert not hk.store.interrupted(task_id, "run-1", "stopping", hk.jobs.requeue_commands(task, task_id), task_id)
    assert conn.llen("rq:queue:default") == 0 and not conn.exists(f"rq:job:{task_id}")
