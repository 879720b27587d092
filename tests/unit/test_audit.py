"""The audit trail on fakeredis: one entry per transition written by the transition's own script,
retention, reading (filters, pages), the operator endpoint and ``taskport audit``."""

from __future__ import annotations

import base64
import hashlib
import uuid

import orjson
import pytest

from app.core import audit, keys, limitscripts, scripts, waitscripts
from app.core.answers import NewTask
from app.core.clock import now_ms
from app.core.config import Config
from app.core.store import TaskStore
from app.launch.cli import main
from app.web import create_app
from workers.housekeeping import Housekeeper, PassReport

CREDS = ("admin", "s3cret")


def new_task(member: str = "public", payload: dict | None = None) -> NewTask:
    task_id = str(uuid.uuid4())
    return NewTask(task_id=task_id, member=member, type="demo.sleep", payload=payload or {"seconds": 0},
                   dedup_digest=task_id, priority="default", max_attempts=2)


def lifecycle(store: TaskStore, new: NewTask, end: str = "complete") -> None:
    store.create(new)
    started = store.start(new.task_id, "run-1").started
    assert started is not None
    if end == "complete":
        store.complete(new.task_id, "run-1", {"ok": True}, items=None, failures=[], error_code=None)
    elif end == "fail":
        store.fail(new.task_id, "run-1", 10001, "bill unpaid")
    elif end == "retry":
        store.retry(new.task_id, "run-1", "again")


def entries(conn, task_id: str | None = None) -> list[dict]:
    return list(reversed(audit.read(conn, task_id=task_id, limit=1000).entries))


def test_every_transition_is_one_entry_with_the_task_s_facts(store, conn):
    payload = {"seconds": 0, "note": "héllo"}
    new = new_task(member="alice", payload=payload)
    lifecycle(store, new)
    assert store.cancel(new.task_id)[0] is False  # a refused transition writes no entry
    store.expire_batch([new.task_id], now_ms())
    trail = entries(conn, new.task_id)
    assert [(e["from"], e["to"]) for e in trail] == [
        (None, "PENDING"), ("PENDING", "PROCESSING"), ("PROCESSING", "COMPLETED"), ("COMPLETED", "EXPIRED")]
    digest = base64.urlsafe_b64encode(hashlib.sha256(orjson.dumps(payload)).digest()).rstrip(b"=").decode()
    for e in trail:
        assert (e["task_id"], e["member"], e["type"]) == (new.task_id, "alice", "demo.sleep")
        assert e["error_code"] is None and e["at"].endswith("Z")
    # the digest of the payload the next run takes, on the entry that made the task PENDING only
    assert [e["payload_sha256"] for e in trail] == [digest, None, None, None]
    assert [e["attempt"] for e in trail] == [0, 1, 1, 1]


def test_failures_retries_and_cancels_are_recorded_with_their_code(store, conn):
    failed, retried, cancelled = new_task(), new_task(), new_task()
    lifecycle(store, failed, "fail")
    lifecycle(store, retried, "retry")
    store.create(cancelled)
    store.cancel(cancelled.task_id)
    assert [(e["to"], e["error_code"]) for e in entries(conn, failed.task_id)][-1] == ("FAILED", 10001)
    assert [e["to"] for e in entries(conn, retried.task_id)] == ["PENDING", "PROCESSING", "PENDING"]
    assert [bool(e["payload_sha256"]) for e in entries(conn, retried.task_id)] == [True, False, True]  # requeued
    assert [(e["from"], e["to"]) for e in entries(conn, cancelled.task_id)][-1] == ("PENDING", "CANCELLED")


def test_a_duplicate_submit_and_progress_write_nothing(store, conn):
    new = new_task()
    store.create(new)
    dup = NewTask(**{**new.__dict__, "task_id": str(uuid.uuid4())})
    assert store.create(dup)[0] is False
    store.start(new.task_id, "run-1")
    store.report(new.task_id, "run-1", 50, "half")
    assert conn.xlen(keys.AUDIT) == 2


def test_the_entry_count_is_capped(conn, config):
    store = TaskStore(conn, Config.from_env({}, redis_url="redis://fake", data_dir=config.data_dir,
                                            audit_retention="150"))
    for _ in range(400):
        store.create(new_task())
    assert 150 <= conn.xlen(keys.AUDIT) < 400  # MAXLEN ~ trims whole stream nodes: at least 150 stay


def test_entries_older_than_the_age_limit_are_trimmed(conn, config):
    for i in range(300):  # three full stream nodes of entries from 1970
        conn.xadd(keys.AUDIT, {"task": "old"}, id=f"{i + 1}-0")
    store = TaskStore(conn, Config.from_env({}, redis_url="redis://fake", data_dir=config.data_dir,
                                            audit_retention="1h"))
    store.create(new_task())
    assert conn.xlen(keys.AUDIT) == 301  # a transition trims by count only: the age is housekeeping's
    Housekeeper(conn, store.config).expire(PassReport("expire"))
    assert [e["task_id"] for e in entries(conn)][-1] != "old" and conn.xlen(keys.AUDIT) < 300


def test_the_default_scripts_carry_the_default_retention():
    """Each script that writes an entry carries the audit's XADD with the default MAXLEN; the batch create, which
    trims by age, carries the default age; the scripts that change no status carry no audit function at all
    (app.core.lua.prune drops the fragment's functions a script never calls)."""
    default = scripts.build(*Config().audit_limits)
    assert scripts.ALL == default and str(30 * 86400 * 1000) in default["batch_create"]
    unchanged = {"progress", "forget_run", "emit", *(s.name for s in (*waitscripts.SCRIPTS, *limitscripts.SCRIPTS))}
    assert {name for name, source in default.items() if "'XADD', audit_stream, 'MAXLEN', '~', 1000000, '*'" in source} \
        == default.keys() - unchanged
    assert all("local function audit" not in default[name] for name in unchanged)


def test_reading_filters_and_pages(store, conn):
    alice, bob = new_task("alice"), new_task("bob")
    lifecycle(store, alice)
    lifecycle(store, bob)
    assert {e["member"] for e in audit.read(conn, member="alice").entries} == {"alice"}
    first = audit.read(conn, limit=4)
    assert len(first.entries) == 4 and first.next_cursor == first.entries[-1]["id"]
    rest = audit.read(conn, limit=4, cursor=first.next_cursor)
    assert len(rest.entries) == 2 and rest.next_cursor is None
    ids = [e["id"] for e in first.entries + rest.entries]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))), reverse=True)


@pytest.fixture
def client(conn, tmp_path):
    config = Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, dashboard_password=CREDS[1])
    return create_app(config, conn=conn).test_client()


def test_the_endpoint_needs_the_operator_credentials(client, conn, tmp_path):
    assert client.get("/api/v1/audit").status_code == 401
    r = client.get("/api/v1/audit", auth=("admin", "wrong"))
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Basic")
    assert r.headers["Content-Type"] == "application/problem+json"
    closed = create_app(Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path), conn=conn).test_client()
    r = closed.get("/api/v1/audit", auth=CREDS)
    assert r.status_code == 404 and r.get_json()["detail"] == "audit trail disabled"


def test_the_endpoint_lists_filters_and_pages(client, store, conn):
    alice, bob = new_task("alice"), new_task("bob")
    lifecycle(store, alice)
    lifecycle(store, bob, "fail")
    r = client.get(f"/api/v1/audit?task_id={bob.task_id}", auth=CREDS)
    assert r.status_code == 200
    assert [e["to"] for e in r.get_json()["entries"]] == ["FAILED", "PROCESSING", "PENDING"]
    page = client.get("/api/v1/audit?member=alice&limit=2", auth=CREDS).get_json()
    assert len(page["entries"]) == 2 and page["next_cursor"]
    more = client.get(f"/api/v1/audit?member=alice&cursor={page['next_cursor']}", auth=CREDS).get_json()
    assert [e["to"] for e in more["entries"]] == ["PENDING"] and more["next_cursor"] is None


@pytest.mark.parametrize(("query", "field"), [
    ("task_id=nope", "task_id"), ("limit=0", "limit"), ("limit=abc", "limit"), ("limit=1001", "limit"),
    ("cursor=12", "cursor"), ("member=" + "m" * 129, "member"), ("limit=²", "limit"),
])
def test_the_endpoint_names_the_bad_field(client, query, field):
    r = client.get(f"/api/v1/audit?{query}", auth=CREDS)
    assert r.status_code == 422 and r.headers["Content-Type"] == "application/problem+json"
    assert list(r.get_json()["errors"]) == [field]


def test_taskport_audit_prints_the_trail(store, conn, monkeypatch, capsys):
    alice, bob = new_task("alice"), new_task("bob")
    lifecycle(store, alice)
    lifecycle(store, bob, "fail")
    monkeypatch.setenv("REDIS_URL", "redis://fake")
    monkeypatch.setattr("app.core.connection.connect", lambda config: conn)
    assert main(["audit", "--task", bob.task_id]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(bob.task_id in line for line in lines)
    assert "PROCESSING -> FAILED attempt=1 code=10001" in lines[0] and "- -> PENDING attempt=0" in lines[2]
    assert main(["audit", "--member", "alice", "--json", "--limit", "1"]) == 0
    out, err = capsys.readouterr()
    assert orjson.loads(out)["to"] == "COMPLETED" and "more" in err


def test_taskport_audit_without_redis_url_or_an_embedded_redis_says_so(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("TASKPORT_DATA_DIR", str(tmp_path))  # where no `taskport up` runs
    assert main(["audit"]) == 1
    err = capsys.readouterr().err
    assert "REDIS_URL" in err and f"no embedded Redis runs in {tmp_path / 'redis'}" in err
