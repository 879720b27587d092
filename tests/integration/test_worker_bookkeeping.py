"""The simple worker's shortened RQ bookkeeping (workers.worker.StoppableSimpleWorker), against a real
redis-server, the worker in this process: a taskport job whose task COMPLETED is finished in one MULTI that
keeps it in the finished registry for the window (no result record) and counts in the worker's statistics,
one that ended nothing leaves nothing of RQ's behind; any other job takes RQ's own path (its result kept);
``rq suspend`` still stops the worker from taking jobs."""

from __future__ import annotations

import redis
from flask.testing import FlaskClient
from rq import Queue
from rq.job import Job, JobStatus
from rq.suspension import resume, suspend

from app.core.jobs import FINISHED_JOB_TTL, RUN_TASK
from app.core.states import QUEUES
from tests.integration.in_process import in_process_client, in_process_config  # noqa: F401 - fixtures
from workers.worker import StoppableSimpleWorker


def submit(client: FlaskClient, n: int) -> list[str]:
    ids = []
    for i in range(n):
        r = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {"seconds": 0, "steps": 1},
                                               "dedup_key": f"bookkeeping-{i}"})
        assert r.status_code == 202, r.get_json()
        ids.append(r.get_json()["task_id"])
    return ids


def status(client: FlaskClient, task_id: str) -> str:
    return str(client.get(f"/api/v1/tasks/{task_id}").get_json()["status"])


def burst(conn: redis.Redis) -> StoppableSimpleWorker:
    worker = StoppableSimpleWorker(list(QUEUES), connection=conn)
    worker.work(burst=True, logging_level="WARNING")
    return worker


def test_succeeded_tasks_stay_in_the_finished_registry_for_the_window_and_count_in_the_worker_stats(
        client: FlaskClient, redis_conn: redis.Redis) -> None:
    ids = submit(client, 5)
    worker = burst(redis_conn)
    assert [status(client, i) for i in ids] == ["COMPLETED"] * 5
    for pattern in ("rq:execution:*", "rq:executions:*", "rq:results:*"):  # no result record, no execution left
        assert list(redis_conn.scan_iter(pattern)) == [], pattern
    default = Queue("default", connection=redis_conn)
    assert sorted(default.finished_job_registry.get_job_ids()) == sorted(ids)
    for task_id in ids:
        job = Job.fetch(task_id, connection=redis_conn)
        assert job.get_status() == JobStatus.FINISHED and job.ended_at is not None
        # what rq-dashboard shows of a finished job: its start and worker, written at its end (nothing at its start)
        assert job.started_at is not None and job.started_at <= job.ended_at and job.worker_name == worker.name
        assert 0 < redis_conn.ttl(job.key) <= FINISHED_JOB_TTL
    for name in QUEUES:
        queue = Queue(name, connection=redis_conn)
        assert queue.started_job_registry.get_job_ids() == []
        assert queue.failed_job_registry.get_job_ids() == []
    stats = redis_conn.hmget(worker.key, "successful_job_count", "total_working_time")
    assert int(stats[0] or 0) == 5
    assert float(stats[1] or 0) > 0
    assert redis_conn.scard(f"rq:worker:{worker.name}:executions") == 0


def test_a_delivery_that_ends_nothing_leaves_no_rq_keys(client: FlaskClient, redis_conn: redis.Redis) -> None:
    [task_id] = submit(client, 1)
    assert client.delete(f"/api/v1/tasks/{task_id}").status_code == 204  # its queued job is removed with it
    Queue("default", connection=redis_conn).enqueue_call(RUN_TASK, args=(task_id,), job_id=task_id, result_ttl=0)
    burst(redis_conn)  # a delivery of a CANCELLED task: ignored
    for pattern in ("rq:job:*", "rq:execution:*", "rq:executions:*", "rq:results:*"):
        assert list(redis_conn.scan_iter(pattern)) == [], pattern
    assert Queue("default", connection=redis_conn).finished_job_registry.get_job_ids() == []


def test_another_job_takes_rqs_own_path_and_keeps_its_result(client: FlaskClient, redis_conn: redis.Redis) -> None:
    job = Queue("default", connection=redis_conn).enqueue("builtins.len", "abcd")
    burst(redis_conn)
    job = Job.fetch(job.id, connection=redis_conn)
    assert job.get_status() == JobStatus.FINISHED
    assert job.return_value() == 4
    assert job.id in Queue("default", connection=redis_conn).finished_job_registry.get_job_ids()


def test_a_suspended_worker_takes_no_job(client: FlaskClient, redis_conn: redis.Redis) -> None:
    [task_id] = submit(client, 1)
    suspend(redis_conn)
    burst(redis_conn)  # a suspended burst worker quits at its first check
    assert status(client, task_id) == "PENDING"
    resume(redis_conn)
    burst(redis_conn)
    assert status(client, task_id) == "COMPLETED"


def _calls(conn: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in conn.info("commandstats").items()}


def _burst_calls(conn: redis.Redis) -> dict[str, int]:
    before = _calls(conn)
    burst(conn)
    after = _calls(conn)
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}


def test_a_no_op_delivery_sends_the_commands_bench_readme_lists(client: FlaskClient, redis_conn: redis.Redis) -> None:
    """bench/README.md, "A delivery, command by command": counted as bench/delivery_ab.py counts them (INFO
    commandstats: a script is its EVALSHA and every command it runs), an empty burst's fixed cost subtracted.
    The audit trims by age in housekeeping (no TIME or XTRIM per transition), the end counts stored bytes from
    what it writes (no STRLEN of a key it drops), the worker's counters go at most once a second."""
    burst(redis_conn)  # RQ's registry maintenance, once per worker start: not a delivery's
    fixed = _burst_calls(redis_conn)
    n = 40
    ids = submit(client, n)
    spent = _burst_calls(redis_conn)
    assert [status(client, i) for i in ids] == ["COMPLETED"] * n
    per = {k: (spent.get(k, 0) - fixed.get(k, 0)) / n for k in spent}
    assert round(per["evalsha"]) == 3  # the claim, the start, the end: one script each
    assert per.get("multi", 0) < 0.5, sorted(per.items())  # RQ's end of the job goes inside the end's script
    assert sum(per.values()) <= 36.5, sorted(per.items())  # 36 from a backlog (39 for a lone task)
    # RQ's job hash at the start: nothing (the task names its worker: START); at the end, in TRANSITION, the
    # finished state: two HSETs, the task's, one each at the start and the end, and RQ's end of the job
    assert per.get("hset", 0) < 4.5, sorted(per.items())
    # the claim's first read: one EXISTS of the claim list, the paused set and the first queue (app.core.jobclaims)
    assert per.get("smembers", 0) < 0.5 and per.get("exists", 0) < 1.5, sorted(per.items())
    # the head of the queue with the job; the ring's head is read by the LMOVE that ends its turn (app.core.lines)
    assert per.get("lindex", 0) < 1.5, sorted(per.items())
    # the line's LPOP; the wake list is cut to the jobs waiting every WAKE_BATCH-th take (app.core.jobclaims)
    assert per.get("lpop", 0) < 1.5, sorted(per.items())
    # nothing of RQ's execution for a taskport job (record, indexes, started registry): one ZREM, the running index's
    assert per.get("zrem", 0) < 1.5, sorted(per.items())
    for command in ("sadd", "srem", "del"):  # DEL: the end's of the payload alone
        assert per.get(command, 0) < (1.5 if command == "del" else 0.5), (command, sorted(per.items()))
    assert per.get("time", 0) < 1.5, sorted(per.items())  # the claim's, timing the queue's gaps (app.core.lines)
    assert per.get("get", 0) < 1.5, sorted(per.items())  # the payload: no checkpoint or cursor when none was saved
    assert per.get("hgetall", 0) < 2.5, sorted(per.items())  # the claim's of the job, START's of the task: one each
    for command in ("xtrim", "strlen", "hstrlen", "hget"):
        assert per.get(command, 0) < 0.5, (command, sorted(per.items()))


def test_a_start_sent_on_the_start_pipeline_to_an_emptied_script_cache_still_runs_the_task(
        client: FlaskClient, redis_conn: redis.Redis) -> None:
    """START goes as EVALSHA on the pipeline that records the job's start (workers.runner.Runner.start_on); a Redis
    whose script cache was emptied (a restart) answers NOSCRIPT there, and the run starts itself as before."""
    ids = submit(client, 2)
    redis_conn.script_flush()
    burst(redis_conn)
    assert [status(client, i) for i in ids] == ["COMPLETED"] * 2
    default = Queue("default", connection=redis_conn)
    assert sorted(default.finished_job_registry.get_job_ids()) == sorted(ids)
    assert default.started_job_registry.get_job_ids() == []
