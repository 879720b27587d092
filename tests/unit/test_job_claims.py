"""The job claim (app.core.jobclaims) on fakeredis: a take moves the id onto the worker's claim list in
priority order, skipping paused queues; the claim goes when the job starts; a claim left behind goes back to
the head of its queue (the next take, the slot's successor, housekeeping once the registration lapsed); and
the reconciler puts back a PENDING task whose job is nowhere, once, counted and logged."""

from __future__ import annotations

import logging
import uuid

import pytest
from rq import Queue, Worker

from app.core import keys, processors
from app.core.answers import NewTask
from app.core.jobclaims import WAKE_BATCH, Claims
from app.core.jobs import JobQueue
from app.core.states import QUEUES, TaskStatus
from app.web import create_app
from app.web.metrics import RedisCollector
from tests.unit.test_operator_truth import status, submit
from workers import runner
from workers.housekeeping import Housekeeper, PassReport
from workers.worker import StoppableSimpleWorker, build_worker

QUEUE_PAIRS = [(name, Queue.redis_queue_namespace_prefix + name) for name in QUEUES]


def queued(conn, name):
    return [i.decode() for i in conn.lrange(Queue.redis_queue_namespace_prefix + name, 0, -1)]


def test_a_take_follows_the_priority_order_and_moves_the_id_onto_the_claim_list(conn, enqueue):
    enqueue("low-1", "low", 60)
    enqueue("default-1", "default", 60)
    enqueue("high-1", "high", 60)
    claims = Claims(conn)
    index, job_id, data = claims.take("w1", QUEUE_PAIRS)  # type: ignore[misc]
    assert (QUEUES[index], job_id) == ("high", "high-1") and data[b"origin"] == b"high"
    assert conn.lrange(keys.job_claims("w1"), 0, -1) == [b"high-1"]
    assert queued(conn, "high") == [] and conn.sismember(keys.JOB_CLAIMANTS, "w1")


def test_a_take_skips_paused_queues_inside_the_script(conn, enqueue):
    enqueue("high-1", "high", 60)
    enqueue("low-1", "low", 60)
    conn.sadd(keys.PAUSED_QUEUES, "high")
    taken = Claims(conn).take("w1", QUEUE_PAIRS)
    assert taken is not None and taken[1] == "low-1"
    assert queued(conn, "high") == ["high-1"]  # untouched
    conn.sadd(keys.PAUSED_QUEUES, "low", "default")
    assert Claims(conn).take("w2", QUEUE_PAIRS) is None


def test_an_id_whose_job_hash_is_gone_is_dropped_as_rq_does(conn, enqueue):
    conn.rpush(Queue.redis_queue_namespace_prefix + "default", "ghost")
    enqueue("real", "default", 60)
    taken = Claims(conn).take("w1", QUEUE_PAIRS)
    assert taken is not None and taken[1] == "real"
    assert conn.lrange(keys.job_claims("w1"), 0, -1) == [b"real"]


def test_a_claim_left_behind_goes_back_to_the_head_at_the_next_take(conn, enqueue):
    """A take whose answer was lost (redis-py sends the script again): the job is taken again, not lost."""
    enqueue("first", "default", 60)
    enqueue("second", "default", 60)
    claims = Claims(conn)
    claims.take("w1", QUEUE_PAIRS)  # the answer "lost"
    taken = claims.take("w1", QUEUE_PAIRS)
    assert taken is not None and taken[1] == "first"
    assert queued(conn, "default") == ["second"]


@pytest.mark.parametrize("claim_left", [False, True])
@pytest.mark.parametrize("high_job", [False, True])
@pytest.mark.parametrize("paused", [(), ("high",), ("default",), ("low",)])
def test_the_takes_first_read_tells_a_claim_left_a_pause_and_the_first_queue_apart(conn, enqueue, claim_left,
                                                                                     high_job, paused):
    """The claim reads the claim list, the paused set and the first queue in one EXISTS (a count): in every mix
    of them the take does what it did with a read of each, a claim left going back to its queue first."""
    enqueue("d1", "default", 60)
    enqueue("d2", "default", 60)
    claims = Claims(conn)
    if claim_left:
        claims.take("w1", QUEUE_PAIRS)  # d1, its answer lost
    if high_job:
        enqueue("h1", "high", 60)
    if paused:
        conn.sadd(keys.PAUSED_QUEUES, *paused)
    taken = claims.take("w1", QUEUE_PAIRS)
    expected = "h1" if high_job and "high" not in paused else None if "default" in paused else "d1"
    assert (taken and taken[1]) == expected
    assert conn.lrange(keys.job_claims("w1"), 0, -1) == ([expected.encode()] if expected else [])
    assert queued(conn, "default") == (["d2"] if expected == "d1" else ["d1", "d2"])


def test_the_claims_of_a_dead_worker_go_back_to_the_head_of_their_queues(conn, enqueue):
    enqueue("a", "default", 60)
    enqueue("b", "default", 60)
    claims = Claims(conn)
    claims.take("w1", QUEUE_PAIRS)
    assert claims.give_back("w1") == 1
    assert queued(conn, "default") == ["a", "b"]
    assert not conn.exists(keys.job_claims("w1")) and not conn.sismember(keys.JOB_CLAIMANTS, "w1")


def test_housekeeping_returns_the_claims_of_workers_whose_registration_lapsed_only(conn, config, enqueue):
    enqueue("a", "default", 60)
    enqueue("b", "default", 60)
    claims = Claims(conn)
    claims.take("alive", QUEUE_PAIRS)
    claims.take("gone", QUEUE_PAIRS)
    conn.hset(Worker.redis_worker_namespace_prefix + "alive", "birth", "x")  # registered: left alone
    report = PassReport("reclaim")
    Housekeeper(conn, config).reclaim(report)
    assert report.counts == {"claims_returned": 1}
    assert queued(conn, "default") == ["b"] and conn.lrange(keys.job_claims("alive"), 0, -1) == [b"a"]


def test_a_worker_started_in_a_slot_gives_back_its_predecessors_claims(conn, config, enqueue, monkeypatch):
    enqueue("a", "default", 60)
    Claims(conn).take("slot-1", QUEUE_PAIRS)
    monkeypatch.setattr("workers.worker.connect", lambda config: conn)
    monkeypatch.setattr("workers.worker.wait_for_redis", lambda conn: None)
    build_worker(config, "slot-1")
    assert queued(conn, "default") == ["a"] and not conn.exists(keys.job_claims("slot-1"))


def test_every_queued_job_announces_itself_on_the_wake_list(conn, enqueue):
    enqueue("a", "low", 60)
    enqueue("b", "low", 60)
    assert conn.lrange(keys.JOB_WAKE, 0, -1) == [b"low", b"low"]
    conn.rpush(keys.JOB_WAKE, "low", "low")  # announcements of jobs taken meanwhile by another way
    Claims(conn).take("w1", QUEUE_PAIRS)
    Claims(conn).take("w2", QUEUE_PAIRS)
    assert Claims(conn).take("w3", QUEUE_PAIRS) is None  # nothing to take: the list is emptied
    assert conn.llen(keys.JOB_WAKE) == 0


def test_the_takes_use_the_wake_lists_entries_in_batches_and_keep_it_bounded(conn, enqueue):
    """Under a load that never idles a worker the list stays within WAKE_BATCH entries of the jobs waiting, cut
    every WAKE_BATCH takes (a command fewer a delivery: bench/README.md, issue 32)."""
    for i in range(2 * WAKE_BATCH + 1):
        enqueue(f"j{i}", "low", 60)
    claims = Claims(conn)
    for _ in range(WAKE_BATCH - 1):
        claims.take("w1", QUEUE_PAIRS)
        conn.delete(keys.job_claims("w1"))  # started: the start pipeline's LREM
    assert conn.llen(keys.JOB_WAKE) == 2 * WAKE_BATCH + 1  # no take popped one
    for _ in range(WAKE_BATCH + 1):
        claims.take("w1", QUEUE_PAIRS)
        conn.delete(keys.job_claims("w1"))
        waiting = len(queued(conn, "low"))
        assert waiting <= conn.llen(keys.JOB_WAKE) < waiting + WAKE_BATCH
    assert conn.llen(keys.JOB_WAKE) == 1 and len(queued(conn, "low")) == 1


def test_a_batch_of_the_wake_list_never_takes_the_entry_of_a_job_still_waiting(conn, enqueue):
    """A worker blocks on the wake list only after a take found nothing (the list emptied then). Jobs queued before
    its BLPOP arrives announce themselves there, and a take in between by a busy worker may be its queue's
    WAKE_BATCH-th: its batch must leave an entry for each job still waiting, or the idle worker sleeps WAKE_WAIT
    (1 s) while one waits (the take popped every entry, its own job's and the others')."""
    claims = Claims(conn)
    for i in range(WAKE_BATCH - 1):  # the queue's takes up to the one before a batch
        enqueue(f"j{i}", "low", 60)
        claims.take("busy", QUEUE_PAIRS)
        conn.delete(keys.job_claims("busy"))
    assert claims.take("idle", QUEUE_PAIRS) is None and conn.llen(keys.JOB_WAKE) == 0  # it is about to block
    enqueue("first", "high", 60)
    enqueue("second", "low", 60)
    enqueue("third", "low", 60)
    taken = claims.take("busy", QUEUE_PAIRS)  # high's, first
    assert taken is not None and taken[1] == "first"
    conn.delete(keys.job_claims("busy"))
    taken = claims.take("busy", QUEUE_PAIRS)  # low's WAKE_BATCH-th take: its batch
    assert taken is not None and taken[1] == "second"
    conn.delete(keys.job_claims("busy"))
    assert queued(conn, "low") == ["third"]
    assert conn.llen(keys.JOB_WAKE) >= 1  # the idle worker's BLPOP returns at once, for the job that waits
    assert claims.take("idle", QUEUE_PAIRS)[1] == "third"


def test_a_worker_runs_its_jobs_through_the_claim_and_leaves_no_claim(config, conn):
    runner.use(runner.Runner(config, conn))
    client = create_app(config, conn=conn).test_client()
    ids = [submit(client, q) for q in ("low", "high")]
    worker = StoppableSimpleWorker(list(QUEUES), connection=conn)
    worker.work(burst=True, logging_level="WARNING")
    assert [status(client, i)["status"] for i in ids] == ["COMPLETED"] * 2
    assert not conn.exists(keys.job_claims(worker.name))
    runner.use(None)


# -- the reconciler ------------------------------------------------------------------------------------


@pytest.fixture
def lost(conn, config):
    """A PENDING task whose job id was taken out of its queue and is nowhere (a BLPOP whose answer was lost)."""
    processors.load()
    hk = Housekeeper(conn, config)
    new = NewTask(task_id=str(uuid.uuid4()), member="public", type="demo.sleep", payload={},
                  dedup_digest=uuid.uuid4().hex, priority="default", max_attempts=1)
    hk.store.create(new, JobQueue(conn, config).job_commands(new.task_id, "default", 60))
    assert conn.lpop(Queue.redis_queue_namespace_prefix + "default") == new.task_id.encode()
    return hk, new.task_id


def test_the_reconciler_puts_back_a_pending_task_with_no_job_once_counted_and_logged(lost, conn, config, caplog):
    hk, task_id = lost
    created = hk.store.get(task_id).created_at  # type: ignore[union-attr]
    bound = int(config.unqueued_bound * 1000)
    caplog.set_level(logging.INFO, logger="workers.housekeeping")
    report = PassReport("reconcile")
    hk.reconcile(report, now=created + bound - 1)  # younger than the bound: not even a candidate
    hk.reconcile(report, now=created + bound + 1)  # first seen without a job
    hk.reconcile(report, now=created + 2 * bound)  # still within the bound of that sighting
    assert report.counts == {"unqueued_seen": 2} and queued(conn, "default") == []
    hk.reconcile(report, now=created + 2 * bound + 2)
    assert report.counts == {"unqueued_seen": 2, "reconciled": 1}
    assert queued(conn, "default") == [task_id]
    hk.reconcile(report, now=created + 4 * bound)  # queued now: nothing more
    assert report.counts == {"unqueued_seen": 2, "reconciled": 1}
    assert hk.stats.read()[keys.STAT_RECONCILED] == 1
    lines = [r for r in caplog.records if "reconciled" in r.getMessage()]
    assert len(lines) == 1 and task_id in str(lines[0].__dict__.get("task_id", "")) + lines[0].getMessage()
    assert hk.store.get(task_id).status == TaskStatus.PENDING  # type: ignore[union-attr]


@pytest.mark.parametrize("where", ["queue", "claim", "delayed", "waiting", "started"])
def test_the_reconciler_leaves_a_task_whose_job_is_somewhere(lost, conn, config, where):
    hk, task_id = lost
    if where == "queue":
        conn.rpush(Queue.redis_queue_namespace_prefix + "default", task_id)
    elif where == "claim":
        conn.rpush(keys.job_claims("w9"), task_id)
        conn.sadd(keys.JOB_CLAIMANTS, "w9")
    elif where == "delayed":
        conn.zadd(keys.DELAYED, {task_id: 1})
    elif where == "waiting":
        conn.hset(keys.task(task_id), keys.TaskField.WAITING, 1)
    else:
        conn.zadd(Queue("default", connection=conn).started_job_registry.key, {task_id: 1})
    created = hk.store.get(task_id).created_at  # type: ignore[union-attr]
    report = PassReport("reconcile")
    for n in range(1, 5):
        hk.reconcile(report, now=created + n * int(config.unqueued_bound * 1000) + n)
    assert report.counts == {} and hk.stats.read().get(keys.STAT_RECONCILED, 0) == 0


def test_metrics_read_the_reconciled_count_as_zero_from_the_start(conn):
    samples = {s.labels.get("event"): s.value for family in RedisCollector(conn).collect()
               if family.name == "taskport_tasks" for s in family.samples}
    assert samples[keys.STAT_RECONCILED] == 0
