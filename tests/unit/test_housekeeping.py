"""Housekeeping passes on fakeredis: expiry, tombstones, stall recovery, monitoring, the pass lock."""

from __future__ import annotations

import logging
import uuid

import pytest

from app.core import keys, processors
from app.core.answers import NewTask
from app.core.clock import now_ms
from app.core.states import CLAIM_TAKEN, TaskStatus
from workers.housekeeping import Housekeeper, PassReport

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


def run(hk, task_id):
    started = hk.store.start(task_id, "run-1").started
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


def test_stalled_task_is_requeued_while_attempts_remain(hk, conn, config):
    task_id = make(hk, max_attempts=2)
    run_id = run(hk, task_id)
    hk.jobs.remove(task_id)  # a worker took the job; it died with it
    report = pass_(hk, "recover", now_ms() + int(config.stall_timeout * 1000) + 1000)
    assert report.counts == {"recovered_to_pending": 1}
    assert hk.store.get(task_id).status == TaskStatus.PENDING
    # re-queued under a job id of its own, recorded in the task (cancel and expiry act on that job)
    assert conn.lrange("rq:queue:default", 0, -1) == [f"{task_id}_1".encode()]
    assert hk.store.job_id(task_id) == f"{task_id}_1"
    assert hk.store.report(task_id, run_id, None) == CLAIM_TAKEN  # the lost run's late heartbeat loses
    again = hk.store.start(task_id, "run-2").started
    assert again is not None and again.task.attempts == 2
    assert hk.store.report(task_id, run_id, None) == CLAIM_TAKEN  # never the new run's PROCESSING
    assert hk.stats.read()["recovered"] == 1


def test_stalled_task_without_attempts_left_fails_minus_3(hk, config):
    task_id = make(hk, max_attempts=1)
    run(hk, task_id)
    pass_(hk, "recover", now_ms() + int(config.stall_timeout * 1000) + 1000)
    task = hk.store.get(task_id)
    assert task.status == TaskStatus.FAILED and task.error_code == -3


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
    from app.core.config import Config

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
