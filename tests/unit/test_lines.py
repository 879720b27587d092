"""Fair dispatch and a task's place in line (app.core.lines) on fakeredis: the claim serves the members in turn,
with their weights, priorities first; a job with no line is still taken; a cancelled job is passed over; a
claim given back returns to the head of its line; the place a status read computes is the order the claim
then follows."""

from __future__ import annotations

import uuid

import pytest
from rq import Queue

from app.core import keys
from app.core.answers import NewTask
from app.core.config import Config, ConfigError
from app.core.jobclaims import Claims
from app.core.jobs import JobQueue, task_of_job
from app.core.lines import Places
from app.core.states import QUEUES
from app.core.store import TaskStore

QUEUE_PAIRS = [(name, Queue.redis_queue_namespace_prefix + name) for name in QUEUES]


@pytest.fixture
def config(tmp_path) -> Config:
    return Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, api_keys="ka:a,kb:b:3,kc:c:high:2")


def submit(conn, config, member: str, priority: str = "default") -> str:
    new = NewTask(task_id=str(uuid.uuid4()), member=member, type="demo.sleep", payload={},
                  dedup_digest=uuid.uuid4().hex, priority=priority, max_attempts=1)
    TaskStore(conn, config).create(new, JobQueue(conn, config).job_commands(
        new.task_id, priority, 60, member=member))
    return new.task_id


def take_all(conn, worker: str = "w1") -> list[str]:
    claims, taken = Claims(conn), []
    while (got := claims.take(worker, QUEUE_PAIRS)) is not None:
        taken.append(got[1])
        conn.delete(keys.job_claims(worker))  # started (the worker's start pipeline clears the claim)
    return taken


def test_the_weights_grammar(tmp_path):
    config = Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path,
                             api_keys="k1:a,k2:b:high,k3:c:3,k4:d:high:2,k5:d:5")
    assert config.weights == {"c": 3, "d": 5}
    assert config.grants == {"k1": ("a", False), "k2": ("b", True), "k3": ("c", False), "k4": ("d", True),
                             "k5": ("d", False)}
    for bad in ("k:a:0", "k:a:x", "k:a:high:3:1", "k:a:3:high", "k:a:101"):
        with pytest.raises(ConfigError, match="key:member:high:N"):
            _ = Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, api_keys=bad).grants


def test_members_are_served_in_turn_not_in_submit_order(conn, config):
    a = [submit(conn, config, "a") for _ in range(5)]
    c = [submit(conn, config, "c") for _ in range(2)]
    assert take_all(conn) == [a[0], c[0], c[1], a[1], a[2], a[3], a[4]]  # c's weight is 2
    assert conn.llen("rq:queue:default") == 0 and conn.llen(keys.ring("default")) == 0


def test_one_task_of_another_member_waits_for_one_take_of_each_other_member(conn, config):
    """And is taken out of RQ's list from the end it is nearer to."""
    a = [submit(conn, config, "a") for _ in range(100)]
    late = submit(conn, config, "z")
    between = submit(conn, config, "a")
    claims, taken = Claims(conn), []
    for _ in range(2):
        taken.append(claims.take("w1", QUEUE_PAIRS)[1])  # type: ignore[index]
        conn.delete(keys.job_claims("w1"))
    assert taken == [a[0], late]
    # the late one was taken out from the tail's side of RQ's list (fewer ids after it): the order is kept
    assert conn.lrange("rq:queue:default", 0, -1) == [x.encode() for x in (*a[1:], between)]
    assert take_all(conn)[0] == a[1]
    assert conn.llen("rq:queue:default") == 0


def test_a_weight_gives_its_share(conn, config):
    a = [submit(conn, config, "a") for _ in range(20)]
    b = [submit(conn, config, "b") for _ in range(20)]
    first = take_all(conn)[:16]
    assert sum(t in b for t in first) == 12 and sum(t in a for t in first) == 4  # 3 : 1


def test_priorities_still_come_first(conn, config):
    low = submit(conn, config, "a", "low")
    default = submit(conn, config, "b", "default")
    high = submit(conn, config, "c", "high")
    assert take_all(conn) == [high, default, low]


def test_a_job_queued_without_a_line_is_taken_at_the_head_of_its_queue(conn, config):
    a = [submit(conn, config, "a") for _ in range(3)]
    jobs = JobQueue(conn, config)
    with conn.pipeline() as pipe:  # RQ's own enqueue, or a job of an earlier version: no line command
        for command in jobs.job_commands("bare", "default", 60):
            pipe.execute_command(command.name, command.key, *command.args)
        pipe.execute()
    b = submit(conn, config, "b")
    assert take_all(conn) == [a[0], b, a[1], a[2], "bare"]


def test_a_cancelled_job_is_passed_over(conn, config):
    a = [submit(conn, config, "a") for _ in range(3)]
    assert JobQueue(conn, config).remove(a[0]) == []  # a cancel's removal touches RQ's list only
    assert take_all(conn) == [a[1], a[2]]


def test_a_claim_given_back_returns_to_the_head_of_its_line(conn, config):
    a = [submit(conn, config, "a") for _ in range(2)]
    b = [submit(conn, config, "b") for _ in range(2)]
    claims = Claims(conn)
    assert claims.take("w1", QUEUE_PAIRS)[1] == a[0]  # type: ignore[index]
    assert claims.give_back("w1") == 1
    assert conn.lrange(keys.line("default", "a"), 0, -1) == [x.encode() for x in a]
    assert take_all(conn) == [a[0], *b, a[1]]  # a served first again, then b (weight 3: both), then a


def test_a_take_sent_twice_takes_one_job(conn, config):
    a = [submit(conn, config, "a") for _ in range(2)]
    claims = Claims(conn)
    claims.take("w1", QUEUE_PAIRS)  # the answer lost: the same take again gives its claim back first
    assert claims.take("w1", QUEUE_PAIRS)[1] == a[0]  # type: ignore[index]
    assert conn.lrange("rq:queue:default", 0, -1) == [a[1].encode()]


def test_the_place_is_the_order_the_claim_follows(conn, config):
    ids = [submit(conn, config, m) for m in ("a", "a", "a", "a", "b", "b", "b", "b", "c", "a", "b", "c", "c")]
    ids.append(submit(conn, config, "a", "high"))
    places = Places(conn)
    predicted = {}
    for task_id in ids:
        _, place = places.read(task_id)
        assert place is not None and place.estimated_start is None  # no rate yet
        predicted[task_id] = place.position
    taken = take_all(conn)
    assert {t: taken.index(t) for t in ids} == predicted


def test_the_place_after_takes_and_the_rate(conn, config):
    ids = [submit(conn, config, "a") for _ in range(6)]
    claims = Claims(conn)
    for _ in range(3):
        claims.take("w1", QUEUE_PAIRS)
        conn.delete(keys.job_claims("w1"))
    h, place = Places(conn).read(ids[5])
    assert task_of_job(h[b"line"].decode().split(" ")[2]) == ids[5]
    assert place is not None and place.position == 2
    assert place.estimated_start is not None  # two gaps measured while jobs waited
    taken_id = ids[2]
    assert Places(conn).read(taken_id)[1] is None  # out of its line


def test_the_status_document_carries_the_place_while_queued_only(conn, config):
    from app.web import create_app

    client = create_app(config, conn=conn).test_client()
    auth = {"Authorization": "Bearer ka"}
    ids = [client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {"seconds": 0, "fail_items": [n]}},
                       headers=auth).get_json()["task_id"] for n in range(3)]
    docs = [client.get(f"/api/v1/tasks/{i}", headers=auth).get_json() for i in ids]
    assert [d["queue"] for d in docs] == [{"position": n, "estimated_start": None} for n in range(3)]
    claims = Claims(conn)
    claims.take("w1", QUEUE_PAIRS)  # taken, not started yet: out of its line, no place
    assert "queue" not in client.get(f"/api/v1/tasks/{ids[0]}", headers=auth).get_json()
    assert client.get(f"/api/v1/tasks/{ids[2]}", headers=auth).get_json()["queue"]["position"] == 1
    client.delete(f"/api/v1/tasks/{ids[1]}", headers=auth)
    assert "queue" not in client.get(f"/api/v1/tasks/{ids[1]}", headers=auth).get_json()  # CANCELLED


def test_a_job_requeued_in_rqs_list_alone_is_not_held_behind_the_lines(conn, config):
    """rq-dashboard's requeue of a failed job pushes its id onto RQ's list only: its task still names that job,
    but no line holds it, so it is taken at the head as before, not after every member's line."""
    first = submit(conn, config, "a")
    assert take_all(conn) == [first]
    conn.rpush("rq:queue:default", first)  # put back by RQ itself: no line
    conn.hset(f"rq:job:{first}", "origin", "default")
    others = [submit(conn, config, m) for m in ("b", "c", "b")]
    assert take_all(conn) == [first, others[0], others[2], others[1]]  # b has the weight 3


def test_a_run_that_ends_its_task_drops_its_place_in_line(conn, config):
    """The task's ``line`` field (~50 bytes) serves only while its job is queued: a finished task keeps none, and a
    task put back (PROCESSING -> PENDING) gets its new place as it is queued again."""
    store = TaskStore(conn, config)
    done, again = submit(conn, config, "a"), submit(conn, config, "a")
    take_all(conn)
    assert store.start(done, "run-1").started is not None
    assert store.complete(done, "run-1", {"ok": True}, items=None, failures=[], error_code=None)
    assert conn.hget(keys.task(done), "line") is None
    assert store.start(again, "run-2").started is not None
    job_id = store.job_id(again)
    placed = conn.hget(keys.task(again), "line")
    job = JobQueue(conn, config).job_commands(again, "default", 60, job_id=job_id, member="a")
    assert store.interrupted(again, "run-2", "stopping", job, job_id)
    assert conn.hget(keys.task(again), "line") not in (None, placed)


@pytest.mark.parametrize("seed", range(8))
def test_every_place_is_the_claims_order_after_any_takes(conn, config, seed):
    """Members with weights (b 3, c 2) part-way through their turns, three queues, lines of every length: the place
    of every queued task is where the claim then takes it."""
    import random

    rng = random.Random(seed)
    claims = Claims(conn)
    for _ in range(rng.randint(10, 40)):
        if rng.random() < 0.25:
            if claims.take("w1", QUEUE_PAIRS) is not None:
                conn.delete(keys.job_claims("w1"))
        else:
            submit(conn, config, rng.choice("aabbc"), rng.choice(("default", "default", "low", "high")))
    queued = [job.decode() for name in QUEUES for job in conn.lrange(f"rq:queue:{name}", 0, -1)]
    places = Places(conn)
    predicted = {}
    for job in queued:
        place = places.read(task_of_job(job))[1]
        assert place is not None
        predicted[task_of_job(job)] = place.position
    taken = take_all(conn)
    assert {t: taken.index(t) for t in predicted} == predicted


def test_the_estimated_start_is_the_last_take_plus_a_gap_per_place(conn, config):
    ids = [submit(conn, config, "a") for _ in range(3)]
    lines = keys.lines("default")
    conn.hset(lines, mapping={"gap": "250.4", "last": "99999999999000"})  # a take to come: after now
    assert Places(conn).read(ids[2])[1] == (2, 99999999999000 + round(3 * 250.4))
    conn.hset(lines, "last", "1000")  # long ago: now, by Redis's clock
    before = int(conn.time()[0]) * 1000
    position, start = Places(conn).read(ids[1])[1]  # type: ignore[misc]
    assert position == 1 and before <= start <= int(conn.time()[0]) * 1000 + 1000
    conn.hdel(lines, "gap")  # no rate
    assert Places(conn).read(ids[0])[1] == (0, None)
