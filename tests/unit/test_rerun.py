"""Run again (app.core.rerun, POST /api/v1/tasks/{id}/retry, rq-dashboard's Requeue): only a FAILED or
CANCELLED task moves, back to PENDING under its own id with its payload, its failed run's outcome reset,
attempts counting on, a job of its own queued, a new lifetime, audited; the HTTP answers around it."""

from __future__ import annotations

import dataclasses
import uuid

import orjson
import pytest
from rq import Queue
from rq.job import Job

from app.core import keys
from app.core.answers import ActiveCapReached, NewTask
from app.core.clock import now_ms
from app.core.jobs import JobQueue, rerun_job_id, task_of_job
from app.core.keys import STAT_RERUN
from app.core.rerun import rerun
from app.core.results import LocalResultStore
from app.core.states import MISSING_PAYLOAD, RERUNNABLE, STORED, TaskStatus
from app.core.stats import Stats
from app.core.store import TaskStore
from app.web import create_app

PAYLOAD = {"seconds": 0, "fail_code": 10001}


def new_task(member: str = "public") -> NewTask:
    task_id = str(uuid.uuid4())
    return NewTask(task_id=task_id, member=member, type="demo.sleep", payload=PAYLOAD, dedup_digest=task_id,
                   priority="default", max_attempts=2)


def make(store: TaskStore, status: str, member: str = "public") -> str:
    """A task brought to ``status`` by the store's own moves (its first job queued, as a submit does)."""
    new = new_task(member)
    store.create(new, JobQueue(store.redis, store.config).job_commands(new.task_id, "default", 60))
    task_id, run = new.task_id, uuid.uuid4().hex
    if status in (TaskStatus.PROCESSING, TaskStatus.COMPLETED, TaskStatus.FAILED):
        assert store.start(task_id, run).started is not None
    if status == TaskStatus.COMPLETED:
        store.complete(task_id, run, {"ok": 1}, items=None, failures=[], error_code=None)
    elif status == TaskStatus.FAILED:
        store.report(task_id, run, 40, "step 4", {"total": 5, "succeeded": 2, "failed": 1},
                     checkpoint=b'{"done": 3}', cursor=b'{"at": 3}')
        store.fail(task_id, run, 10001, "bill unpaid", items={"total": 5, "succeeded": 2, "failed": 1})
    elif status == TaskStatus.CANCELLED:
        store.cancel(task_id)
    elif status == TaskStatus.EXPIRED:
        store.expire_batch([task_id], now_ms() + 10 * store.config.task_ttl * 1000)
    assert store.get(task_id).status == status
    return task_id


def again(store: TaskStore, task_id: str, budget: int = 1):
    task = store.get(task_id)
    job_id = rerun_job_id(task_id, task.seq if task else 0)
    job = JobQueue(store.redis, store.config).requeue_commands(task, job_id) if task else []
    return rerun(store, task_id, job_id, job, budget)


# -- the transition ----------------------------------------------------------------------------------

@pytest.mark.parametrize("status", sorted(STORED))
def test_only_a_failed_or_cancelled_task_runs_again(store, conn, status):
    task_id = make(store, status)
    before = conn.hgetall(keys.task(task_id))
    done = again(store, task_id)
    if status in RERUNNABLE:
        assert done.task is not None and done.task.status == TaskStatus.PENDING
    else:
        assert (done.task, done.status) == (None, status)
        assert conn.hgetall(keys.task(task_id)) == before  # nothing written


def test_a_failed_task_goes_back_to_pending_with_its_outcome_reset(store, conn, config):
    task_id = make(store, TaskStatus.FAILED)
    failed = store.get(task_id)
    assert conn.get(keys.payload(task_id)) is not None and not conn.exists(keys.checkpoint(task_id))
    t = now_ms()
    task = again(store, task_id, budget=3).task
    assert (task.status, task.progress, task.items, task.error_code, task.error_message) == \
        (TaskStatus.PENDING, 0, None, None, None)
    assert (task.started_at, task.completed_at, task.run_id, task.checkpoints, task.checkpoint_run) == \
        (None, None, None, 0, None)
    assert task.to_doc(now_ms())["error"] is None and task.message == "queued to run again"
    assert (task.attempts, task.max_attempts) == (1, 1 + 3)  # attempts keep counting; a fresh budget of runs
    assert task.created_at == failed.created_at and task.seq > failed.seq
    assert t + config.task_ttl * 1000 <= task.expires_at <= now_ms() + config.task_ttl * 1000
    assert conn.zscore(keys.EXPIRY, task_id) == task.expires_at
    lifetime = config.task_ttl + config.tombstone_ttl
    assert lifetime - 5 <= conn.ttl(keys.task(task_id)) <= lifetime
    assert lifetime - 5 <= conn.ttl(keys.payload(task_id)) <= lifetime
    assert not conn.exists(keys.result(task_id), keys.checkpoint(task_id), keys.cursor(task_id))
    assert Stats(conn).read()[STAT_RERUN] == 1
    assert int(conn.hget(keys.ACTIVE, "public")) == 1


def test_the_new_job_is_queued_under_an_id_of_its_own_and_the_new_run_starts(store, conn):
    task_id = make(store, TaskStatus.FAILED)
    job_id = rerun_job_id(task_id, store.get(task_id).seq)
    assert again(store, task_id).task is not None
    assert Queue("default", connection=conn).get_job_ids()[-1] == job_id != task_id  # (the first job: never popped)
    assert task_of_job(job_id) == task_id and store.job_id(task_id) == job_id
    assert Job.fetch(job_id, connection=conn).args == (task_id,)
    started = store.start(task_id, "run-2").started
    assert started is not None and started.payload == PAYLOAD and started.checkpoint is None
    assert started.task.attempts == 2


def test_a_cancelled_task_runs_again_and_can_be_cancelled_again(store, conn):
    task_id = make(store, TaskStatus.CANCELLED)
    first = again(store, task_id).task
    assert first.status == TaskStatus.PENDING
    assert store.cancel(task_id) == (True, TaskStatus.PENDING)
    assert conn.hget(keys.ACTIVE, "public") is None  # counted in and out again
    second = again(store, task_id).task
    assert second.status == TaskStatus.PENDING and store.job_id(task_id) != rerun_job_id(task_id, first.seq - 1)
    assert store.job_id(task_id) in Queue("default", connection=conn).get_job_ids()  # a job id of its own each time


def test_the_transition_is_audited_and_published(store, conn):
    task_id = make(store, TaskStatus.FAILED)
    conn.delete(keys.AUDIT)
    pubsub = conn.pubsub()
    pubsub.subscribe(keys.events(task_id))
    pubsub.get_message(timeout=1)
    seq = again(store, task_id).task.seq
    [(_, entry)] = conn.xrange(keys.AUDIT)
    assert (entry[b"task"].decode(), entry[b"from"], entry[b"to"], entry[b"attempt"], entry[b"code"]) == \
        (task_id, b"FAILED", b"PENDING", b"1", b"")
    assert pubsub.get_message(timeout=1)["data"] == str(seq).encode()
    pubsub.close()


def test_past_its_time_or_without_its_payload_a_task_does_not_run_again(store, conn):
    late, old = make(store, TaskStatus.FAILED), make(store, TaskStatus.CANCELLED)
    conn.hset(keys.task(late), "expires_at", now_ms() - 1)
    conn.delete(keys.payload(old))  # a task that ended before FAILED/CANCELLED tasks kept their payload
    assert again(store, late).status == TaskStatus.EXPIRED and again(store, old).status == MISSING_PAYLOAD
    assert store.get(late).status == TaskStatus.FAILED and store.get(old).status == TaskStatus.CANCELLED
    assert again(store, str(uuid.uuid4())).status == ""


def test_the_member_s_cap_of_unfinished_tasks_holds(conn, config):
    store = TaskStore(conn, dataclasses.replace(config, max_active_tasks="1"))
    task_id = make(store, TaskStatus.FAILED)
    store.create(new_task())  # the member's one unfinished task
    with pytest.raises(ActiveCapReached):
        again(store, task_id)
    assert store.get(task_id).status == TaskStatus.FAILED


def test_a_failed_task_keeps_its_payload_until_it_expires_a_completed_one_does_not(store, conn, config):
    failed, done = make(store, TaskStatus.FAILED), make(store, TaskStatus.COMPLETED)
    kept = config.result_ttl + config.tombstone_ttl
    assert kept - 5 <= conn.ttl(keys.payload(failed)) <= kept  # as long as the hash
    assert not conn.exists(keys.payload(done))
    store.expire_batch([failed], now_ms() + 10 * config.result_ttl * 1000)
    assert store.get(failed).status == TaskStatus.EXPIRED and not conn.exists(keys.payload(failed))


# -- the endpoint ------------------------------------------------------------------------------------

def failed_via_api(client, store) -> str:
    task_id = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": PAYLOAD}).get_json()["task_id"]
    assert store.start(task_id, "r1").started is not None
    assert store.fail(task_id, "r1", 10001, "bill unpaid")
    return task_id


@pytest.mark.parametrize("body", [None, b"", b"{}", b" {} "])
def test_retry_answers_202_with_the_status_document(client, store, conn, body):
    task_id = failed_via_api(client, store)
    r = client.post(f"/api/v1/tasks/{task_id}/retry", data=body,
                    content_type="application/json" if body else None)
    assert r.status_code == 202, r.get_json()
    doc = r.get_json()
    assert (doc["task_id"], doc["status"], doc["error"], doc["attempts"]) == (task_id, "PENDING", None, 1)
    assert r.headers["Location"] == f"/api/v1/tasks/{task_id}" and r.headers["Retry-After"] == "1"
    assert client.get(f"/api/v1/tasks/{task_id}").get_json()["status"] == "PENDING"


def test_retry_removes_the_failed_runs_files(client, store, config):
    task_id = failed_via_api(client, store)
    files = LocalResultStore(config.results_dir).for_run(uuid.uuid4().hex)
    with files.writer(task_id, "half.csv") as f:
        f.write(b"a,b\n")
    assert files.has_files(task_id)
    assert client.post(f"/api/v1/tasks/{task_id}/retry").status_code == 202
    assert not files.has_files(task_id)


def test_retry_in_any_other_state_is_409_and_once_expired_410(client, store, conn):
    task_id = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}).get_json()["task_id"]
    for status in ("PENDING", "PROCESSING", "COMPLETED"):
        if status == "PROCESSING":
            store.start(task_id, "r1")
        if status == "COMPLETED":
            store.complete(task_id, "r1", {}, items=None, failures=[], error_code=None)
        r = client.post(f"/api/v1/tasks/{task_id}/retry")
        assert r.status_code == 409 and r.headers["Content-Type"] == "application/problem+json"
        assert r.get_json()["task_status"] == status
    failed = failed_via_api(client, store)
    conn.hset(keys.task(failed), "expires_at", now_ms() - 1)
    r = client.post(f"/api/v1/tasks/{failed}/retry")
    assert r.status_code == 410 and r.get_json()["status"] == "EXPIRED"


@pytest.mark.parametrize("path", [str(uuid.uuid4()), "not-a-uuid"])
def test_retry_of_an_unknown_task_is_404(client, path):
    r = client.post(f"/api/v1/tasks/{path}/retry")
    assert r.status_code == 404 and r.headers["Content-Type"] == "application/problem+json"


@pytest.mark.parametrize("body, ctype, status, field", [
    (b'{"priority": "high"}', "application/json", 422, "priority"),
    (b'{"payload": {}}', "application/json", 422, "payload"),
    (b"[]", "application/json", 400, None),
    (b"{", "application/json", 400, None),
    (b"\t", "application/json", 400, None),  # whitespace alone is a body, and not JSON (the fuzzer's find)
    (b"x=1", "application/x-www-form-urlencoded", 415, None),
])
def test_retry_takes_no_field(client, store, body, ctype, status, field):
    task_id = failed_via_api(client, store)
    r = client.post(f"/api/v1/tasks/{task_id}/retry", data=body, content_type=ctype)
    assert r.status_code == status and r.headers["Content-Type"] == "application/problem+json"
    if field:
        assert list(r.get_json()["errors"]) == [field]
    assert store.get(task_id).status == TaskStatus.FAILED


def test_another_member_s_task_is_404(config, conn):
    keyed = create_app(config.__class__.from_env({}, redis_url="redis://fake", data_dir=config.data_dir,
                                                 api_keys="ka:alice,kb:bob"), conn=conn).test_client()
    alice, bob = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
    task_id = keyed.post("/api/v1/tasks", json={"type": "demo.sleep"}, headers=alice).get_json()["task_id"]
    store = TaskStore(conn, config)
    store.cancel(task_id)
    assert keyed.post(f"/api/v1/tasks/{task_id}/retry", headers=bob).status_code == 404
    assert store.get(task_id).status == TaskStatus.CANCELLED
    assert keyed.post(f"/api/v1/tasks/{task_id}/retry", headers=alice).status_code == 202


# -- rq-dashboard's Requeue --------------------------------------------------------------------------

SAME_ORIGIN = {"Authorization": "Basic b3BzOnMzY3JldA==", "Origin": "http://localhost"}  # ops:s3cret


@pytest.fixture
def operator(config, conn):
    return create_app(dataclasses.replace(config, dashboard_user="ops", dashboard_password="s3cret"),
                      conn=conn).test_client()


def in_failed_registry(conn, task_id: str) -> Job:
    """The task's job as RQ files a job whose work horse died: out of its queue, in the failed registry."""
    queue = Queue("default", connection=conn)
    job = Job.fetch(task_id, connection=conn)
    queue.remove(job)
    queue.failed_job_registry.add(job, ttl=600)
    return job


def test_requeue_of_a_failed_task_s_job_runs_the_task_again(operator, store, conn):
    task_id = failed_via_api(operator, store)
    in_failed_registry(conn, task_id)
    r = operator.post(f"/rq/job/{task_id}/requeue", headers=SAME_ORIGIN)
    assert r.status_code == 200 and r.get_json() == {"status": "OK", "task_id": task_id, "task_status": "PENDING"}
    queue = Queue("default", connection=conn)
    assert queue.failed_job_registry.get_job_ids() == [] and not conn.exists(f"rq:job:{task_id}")
    assert queue.get_job_ids() == [store.job_id(task_id)] and store.get(task_id).status == TaskStatus.PENDING


def test_requeue_of_a_job_whose_task_cannot_run_again_is_refused_with_why(operator, store, conn):
    task_id = operator.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}).get_json()["task_id"]
    store.start(task_id, "r1")
    store.complete(task_id, "r1", {}, items=None, failures=[], error_code=None)
    in_failed_registry(conn, task_id)
    r = operator.post(f"/rq/job/{task_id}/requeue", headers=SAME_ORIGIN)
    assert r.status_code == 409 and r.headers["Content-Type"] == "application/problem+json"
    assert "COMPLETED" in r.get_json()["detail"] and r.get_json()["task_status"] == "COMPLETED"
    assert Queue("default", connection=conn).failed_job_registry.get_job_ids() == [task_id]  # left as it was


def test_requeue_all_runs_taskport_tasks_again_names_the_refused_and_requeues_other_jobs(operator, store, conn):
    failed = failed_via_api(operator, store)
    done = operator.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {"seconds": 1}}).get_json()["task_id"]
    store.start(done, "r2")
    store.complete(done, "r2", {}, items=None, failures=[], error_code=None)
    for task_id in (failed, done):
        in_failed_registry(conn, task_id)
    queue = Queue("default", connection=conn)
    other = queue.enqueue("builtins.int", "7")
    queue.remove(other)
    queue.failed_job_registry.add(other, ttl=600)
    r = operator.post("/rq/requeue/default", headers=SAME_ORIGIN)
    body = r.get_json()
    assert r.status_code == 200 and (body["status"], body["count"], list(body["refused"])) == ("OK", 2, [done])
    assert sorted(queue.get_job_ids()) == sorted([store.job_id(failed), other.id])
    assert queue.failed_job_registry.get_job_ids() == [done]
    assert orjson.loads(orjson.dumps(body))["refused"][done].startswith(f"task {done} cannot run again")
