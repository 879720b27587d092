"""Periodic schedules on fakeredis: the endpoints (CRUD, 422s, 404 across members, the cap, pages), the store's
compare-and-sets, and the firing (workers.firing) with a clock the test holds."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from app.core import cron, keys
from app.core.schedules import ScheduleStore
from app.web import create_app
from taskport import Client, InvalidRequest, NotFound
from workers.firing import Firing

PROBLEM = "application/problem+json"
T0 = int(datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC).timestamp() * 1000)  # half past a minute
MINUTE = 60_000
TASK = {"type": "demo.sleep", "payload": {"seconds": 0}}


def body(**extra):
    return {"cron": "* * * * *", "task": TASK, **extra}


def post(client, doc, headers=None):
    return client.post("/api/v1/schedules", json=doc, headers=headers)


def tasks_of(conn, member="public"):
    return [t.decode() for t in conn.zrange(keys.history(member), 0, -1)]


# -- the endpoints ------------------------------------------------------------------------------------


def test_create_read_change_delete(client):
    r = post(client, body(name="every minute", timezone="Europe/Paris"))
    assert r.status_code == 201, r.get_json()
    doc = r.get_json()
    assert r.headers["Location"] == doc["links"]["self"] == f"/api/v1/schedules/{doc['schedule_id']}"
    assert set(doc) == {"schedule_id", "name", "cron", "timezone", "task", "paused", "next_run_at", "last_run_at",
                        "last_task_id", "created_at", "links"}
    task = doc["task"]  # as each fire time submits it: the payload validated, its defaults filled in
    assert task["type"] == "demo.sleep" and task["payload"]["steps"] == 10 and task["priority"] is None
    assert doc["paused"] is False and doc["last_run_at"] is None and doc["next_run_at"].endswith(":00.000Z")
    assert client.get(doc["links"]["self"]).get_json() == doc
    paused = client.patch(doc["links"]["self"], json={"paused": True}).get_json()
    assert paused["paused"] is True and paused["next_run_at"] is None
    moved = client.patch(doc["links"]["self"], json={"paused": False, "cron": "0 3 * * *"}).get_json()
    assert moved["cron"] == "0 3 * * *" and moved["next_run_at"].endswith(":00:00.000Z")
    r = client.delete(doc["links"]["self"])
    assert r.status_code == 204 and not r.data
    assert client.get(doc["links"]["self"]).status_code == 404
    assert client.delete(doc["links"]["self"]).status_code == 404


@pytest.mark.parametrize(("doc", "field"), [
    (body(cron="* * * *"), "cron"),
    (body(cron="61 * * * *"), "cron"),
    (body(cron="* * * * * *"), "cron"),
    (body(cron="0 0 30 2 *"), "cron"),
    (body(timezone="Mars/Olympus"), "timezone"),
    (body(name="x" * 101), "name"),
    (body(bogus=1), "bogus"),
    ({"task": TASK}, "cron"),
    ({"cron": "* * * * *"}, "task"),
    (body(task={**TASK, "dedup_key": "k"}), "task.dedup_key"),
    (body(task={"type": "no.such"}), "task.type"),
    (body(task={"type": "demo.sleep", "payload": {"seconds": "a lot"}}), "task.payload.seconds"),
    (body(task={**TASK, "priority": "urgent"}), "task.priority"),
])
def test_a_bad_schedule_is_422_naming_the_field(client, doc, field):
    r = post(client, doc)
    assert r.status_code == 422 and r.headers["Content-Type"] == PROBLEM
    assert field in r.get_json()["errors"], r.get_json()


def test_a_change_is_checked_as_a_create_is(client):
    link = post(client, body()).get_json()["links"]["self"]
    for change, field in (({"cron": "nope"}, "cron"), ({"timezone": "X/Y"}, "timezone"), ({"name": "n"}, "name"),
                          ({"task": {"type": "demo.sleep", "payload": {"steps": 0}}}, "task.payload.steps")):
        r = client.patch(link, json=change)
        assert r.status_code == 422 and field in r.get_json()["errors"], change
    assert client.patch(link, json=[1]).status_code == 400


def test_another_member_s_schedule_is_404_like_an_unknown_id(config, conn):
    keyed = create_app(config.__class__.from_env({}, redis_url="redis://fake", data_dir=config.data_dir,
                                                 api_keys="ka:alice,kb:bob"), conn=conn).test_client()
    alice, bob = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
    link = post(keyed, body(), alice).get_json()["links"]["self"]
    for method in (keyed.get, keyed.delete):
        assert method(link, headers=bob).status_code == 404
    assert keyed.patch(link, json={"paused": True}, headers=bob).status_code == 404
    assert keyed.get("/api/v1/schedules", headers=bob).get_json() == {"schedules": [], "next_cursor": None}
    assert keyed.get("/api/v1/schedules/not-an-id", headers=alice).status_code == 404
    assert keyed.get(link, headers=alice).status_code == 200


def test_the_per_member_cap_is_429(config, conn):
    capped = create_app(config.__class__.from_env({}, redis_url="redis://fake", data_dir=config.data_dir,
                                                  max_schedules=2), conn=conn).test_client()
    links = [post(capped, body()).get_json()["links"]["self"] for _ in range(2)]
    r = post(capped, body())
    assert r.status_code == 429 and r.headers["Content-Type"] == PROBLEM and r.headers["Retry-After"]
    assert r.get_json()["limit"] == "max_schedules" and r.get_json()["cap"] == 2
    assert capped.delete(links[0]).status_code == 204
    assert post(capped, body()).status_code == 201


def test_the_list_is_paged_newest_first(client):
    ids = [post(client, body(name=str(n))).get_json()["schedule_id"] for n in range(5)]
    first = client.get("/api/v1/schedules?limit=2").get_json()
    assert first["next_cursor"] and len(first["schedules"]) == 2
    seen = [s["schedule_id"] for s in first["schedules"]]
    cursor = first["next_cursor"]
    while cursor:
        page = client.get(f"/api/v1/schedules?limit=2&cursor={cursor}").get_json()
        seen += [s["schedule_id"] for s in page["schedules"]]
        cursor = page["next_cursor"]
    assert sorted(seen) == sorted(ids) and len(seen) == 5
    for bad in ("limit=0", "limit=201", "cursor=@@", "cursor=99999999999999999-1x", "bogus=1"):
        r = client.get(f"/api/v1/schedules?{bad}")
        assert r.status_code == 422, bad


# -- the firing ----------------------------------------------------------------------------------------


@pytest.fixture
def schedules(conn, config):
    return ScheduleStore(conn, config.max_schedules)


def make(schedules, *, paused=False, expression="* * * * *", now=T0):
    task = {"type": "demo.sleep", "payload": {"seconds": 0, "steps": 1}, "priority": None}
    return schedules.create("public", name="", cron_expr=expression, timezone="UTC", task=task, paused=paused,
                            now=now)


def test_a_fire_time_creates_one_task_and_moves_to_the_next(conn, config, schedules):
    s = make(schedules)
    fire = cron.next_fire("* * * * *", "UTC", T0)
    firing = Firing(conn, config)
    assert firing.round(now=fire - 1) == 0
    assert firing.round(now=fire) == 1
    (task_id,) = tasks_of(conn)
    after = schedules.get(s.id)
    assert after.next_run_at == fire + MINUTE and after.last_task_id == task_id and after.last_run_at == fire
    task = conn.hgetall(keys.task(task_id))
    assert task[b"type"] == b"demo.sleep" and task[b"status"] == b"PENDING" and task[b"member"] == b"public"
    assert conn.lrange("rq:queue:default", 0, -1) == [task_id.encode()]  # its job is queued
    assert firing.round(now=fire + 1000) == 0


def test_two_schedulers_on_one_fire_time_create_one_task(conn, config, schedules):
    s = make(schedules)
    fire = s.next_run_at
    one, two = Firing(conn, config), Firing(conn, config)
    seen = schedules.get(s.id)  # both read the schedule before either served it
    assert one.fire(seen, fire, fire + 10) + two.fire(seen, fire, fire + 20) == 1
    assert one.round(now=fire + 30) + two.round(now=fire + 30) == 0
    assert len(tasks_of(conn)) == 1 and schedules.get(s.id).next_run_at == fire + MINUTE


def test_missed_fire_times_make_one_catch_up_task(conn, config, schedules):
    s = make(schedules)
    late = s.next_run_at + 10 * MINUTE + 5000  # ten fire times passed with no scheduler
    firing = Firing(conn, config)
    assert firing.round(now=late) == 1
    assert firing.round(now=late + 100) == 0
    assert len(tasks_of(conn)) == 1
    assert schedules.get(s.id).next_run_at == cron.next_fire("* * * * *", "UTC", late)


def test_a_paused_schedule_never_fires(conn, config, schedules):
    s = make(schedules, paused=True)
    firing = Firing(conn, config)
    assert firing.round(now=T0 + 60 * MINUTE) == 0
    running = schedules.update(s, {"paused": False}, T0 + 60 * MINUTE)
    assert running is not None and schedules.update(running, {"paused": True}, T0 + 61 * MINUTE)
    assert firing.round(now=T0 + 120 * MINUTE) == 0 and tasks_of(conn) == []


def test_a_deleted_or_changed_schedule_is_not_advanced_by_a_stale_firing(conn, config, schedules):
    s = make(schedules)
    changed = schedules.update(s, {"cron": "0 * * * *"}, T0)
    assert changed is not None and changed.next_run_at != s.next_run_at
    assert not schedules.advance(s.id, s.next_run_at, s.next_run_at + MINUTE, T0, None)  # expected the old time
    schedules.delete(changed)
    assert schedules.update(changed, {"paused": True}, T0) is None  # a delete is never undone
    assert conn.zcard(keys.SCHEDULES_DUE) == 0 and not conn.exists(keys.schedule(s.id))


def test_a_fire_time_of_a_type_not_registered_is_skipped(conn, config, schedules):
    s = schedules.create("public", name="", cron_expr="* * * * *", timezone="UTC",
                         task={"type": "gone.type", "payload": {}, "priority": None}, paused=False, now=T0)
    assert Firing(conn, config).round(now=s.next_run_at) == 0
    assert schedules.get(s.id).next_run_at == s.next_run_at + MINUTE and tasks_of(conn) == []


def test_fire_times_are_read_in_the_schedule_s_zone():
    utc_noon = int(datetime(2026, 1, 15, 11, 0, tzinfo=UTC).timestamp() * 1000)  # 12:00 in Paris (CET)
    assert cron.next_fire("0 12 * * *", "Europe/Paris", utc_noon - 1) == utc_noon
    assert cron.next_fire("0 12 * * *", "UTC", utc_noon - 1) == utc_noon + 3600_000


# -- the OpenAPI document and the Python client ---------------------------------------------------------


def test_the_schedule_endpoints_are_documented(client):
    spec = client.get("/api/v1/openapi.json").get_json()
    codes = {("/api/v1/schedules", "post"): {"201", "400", "401", "403", "415", "422", "429"},
             ("/api/v1/schedules", "get"): {"200", "401", "422"},
             ("/api/v1/schedules/{schedule_id}", "get"): {"200", "404"},
             ("/api/v1/schedules/{schedule_id}", "patch"): {"200", "404", "422"},
             ("/api/v1/schedules/{schedule_id}", "delete"): {"204", "404"}}
    for (path, method), expected in codes.items():
        assert expected <= set(spec["paths"][path][method]["responses"]), (path, method)
    assert set(spec["components"]["schemas"]["Schedule"]["properties"]) == {
        "schedule_id", "name", "cron", "timezone", "task", "paused", "next_run_at", "last_run_at", "last_task_id",
        "created_at", "links"}


def test_the_python_client_s_schedule_calls(app):
    with Client("http://127.0.0.1", transport=httpx.WSGITransport(app=app)) as tp:
        made = tp.create_schedule("*/5 * * * *", "demo.sleep", {"seconds": 0}, timezone="Europe/Paris", name="n")
        assert made["timezone"] == "Europe/Paris" and made["name"] == "n"
        assert [s["schedule_id"] for s in tp.list_schedules(page_size=1)] == [made["schedule_id"]]
        assert tp.update_schedule(made["schedule_id"], paused=True)["paused"] is True
        assert tp.get_schedule(made["schedule_id"])["next_run_at"] is None
        with pytest.raises(InvalidRequest):
            tp.create_schedule("nope", "demo.sleep")
        tp.delete_schedule(made["schedule_id"])
        with pytest.raises(NotFound):
            tp.get_schedule(made["schedule_id"])
