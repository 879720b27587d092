"""The HTTP contract on the Flask test client with fakeredis: status codes, headers, bodies."""

from __future__ import annotations

import uuid

import orjson
import pytest
from rq import SimpleWorker

from app.core import keys
from app.core.config import Config
from app.core.jobs import JobQueue
from app.core.states import QUEUES
from app.web import create_app

PROBLEM = "application/problem+json"


def submit(client, body, **kw):
    return client.post("/api/v1/tasks", json=body, **kw)


def run_queued(conn, config):
    """Run every queued job in this process (SimpleWorker: fakeredis cannot serve a forked worker)."""
    from workers import runner

    runner.use(runner.Runner(config, conn))
    queues = JobQueue(conn, config).queues
    SimpleWorker([queues[q] for q in QUEUES], connection=conn).work(burst=True)


def test_submit_answers_202_with_location_and_pending_document(client):
    r = submit(client, {"type": "demo.sleep", "payload": {"seconds": 0}})
    assert r.status_code == 202
    doc = r.get_json()
    assert r.headers["Location"] == f"/api/v1/tasks/{doc['task_id']}"
    assert r.headers["Retry-After"] == "1"
    assert r.headers["Content-Type"] == "application/json; charset=utf-8"
    assert doc["status"] == "PENDING" and doc["progress"] == 0 and doc["attempts"] == 0
    assert doc["items"] is None and doc["error"] is None and doc["completed_at"] is None
    assert doc["created_at"].endswith("Z") and doc["expires_at"] > doc["created_at"]
    assert doc["links"]["events"] == f"/api/v1/tasks/{doc['task_id']}/events"
    assert uuid.UUID(doc["task_id"]).version == 4


def test_status_then_result_after_the_worker_ran(client, conn, config):
    doc = submit(client, {"type": "orders.split", "payload": {"order_code": "A1", "items": [
        {"item_code": "x", "quantity": 2}, {"item_code": "y", "quantity": 0}]}}).get_json()
    pending = client.get(doc["links"]["self"])
    assert pending.status_code == 200 and pending.headers["Retry-After"] == "1"
    assert client.get(doc["links"]["result"]).status_code == 202
    run_queued(conn, config)
    done = client.get(doc["links"]["self"])
    assert done.status_code == 200 and "Retry-After" not in done.headers
    assert done.get_json()["status"] == "COMPLETED" and done.get_json()["progress"] == 100
    result = client.get(doc["links"]["result"]).get_json()
    assert result["status"] == "COMPLETED" and result["error_code"] == 10002
    assert result["items"] == {"total": 2, "succeeded": 1, "failed": 1}
    assert result["failures"][0]["item"] == "y" and result["failures"][0]["code"] == 10002
    assert result["result"]["shipments"] == [{"warehouse": "main", "items": [{"item_code": "x", "quantity": 2}]}]


def test_duplicate_submit_is_409_naming_the_existing_task(client, conn):
    first = submit(client, {"type": "demo.sleep", "payload": {"seconds": 1, "steps": 2}})
    second = submit(client, {"type": "demo.sleep", "payload": {"steps": 2, "seconds": 1}})
    assert first.status_code == 202 and second.status_code == 409
    body = second.get_json()
    assert second.headers["X-Task-Deduplicated"] == "true"
    assert second.headers["Location"] == first.headers["Location"]
    assert body["status"] == "DUPLICATE" and body["duplicate"] is True
    assert body["task_id"] == first.get_json()["task_id"] == body["existing"]["task_id"]
    assert conn.lrange("rq:queue:default", 0, -1) == [body["task_id"].encode()]  # the refused one's job is gone


def test_dedup_hash_covers_the_payload_as_sent(client):
    assert submit(client, {"type": "demo.sleep", "payload": {"steps": 3, "seconds": 0}}).status_code == 202
    assert submit(client, {"type": "demo.sleep", "payload": {"seconds": 0, "steps": 3}}).status_code == 409
    assert submit(client, {"type": "demo.sleep", "payload": {"seconds": 0.0, "steps": 3}}).status_code == 202


def test_idempotency_key_header_and_dedup_key(client):
    a = submit(client, {"type": "demo.sleep"}, headers={"Idempotency-Key": "k1"})
    b = submit(client, {"type": "demo.sleep", "payload": {"seconds": 2}, "dedup_key": "k1"})
    assert (a.status_code, b.status_code) == (202, 409)
    clash = submit(client, {"type": "demo.sleep", "dedup_key": "k2"}, headers={"Idempotency-Key": "k3"})
    assert clash.status_code == 422 and "dedup_key" in clash.get_json()["errors"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"payload": {}}, "type"),
        ({"type": "nope.nope"}, "type"),
        ({"type": "demo.sleep", "payload": []}, "payload"),
        ({"type": "demo.sleep", "priority": "urgent"}, "priority"),
        ({"type": "demo.sleep", "dedup_key": "x" * 129}, "dedup_key"),
        ({"type": "demo.sleep", "extra": 1}, "extra"),
        ({"type": "demo.sleep", "payload": {"seconds": -1}}, "payload.seconds"),
        ({"type": "orders.split", "payload": {"order_code": "A", "items": [{"item_code": "i", "quantity": "x"}]}},
         "payload.items.0.quantity"),
    ],
)
def test_invalid_submit_is_422_with_the_field_and_stores_nothing(client, conn, body, field):
    r = submit(client, body)
    assert r.status_code == 422 and r.headers["Content-Type"] == PROBLEM
    problem = r.get_json()
    assert problem["status"] == 422 and field in problem["errors"]
    assert conn.dbsize() == 0


def test_unknown_type_lists_known_types(client):
    problem = submit(client, {"type": "nope"}).get_json()
    assert "demo.sleep" in problem["known_types"] and "orders.split" in problem["errors"]["type"][0]


def test_bad_bodies(client, conn, config):
    assert client.post("/api/v1/tasks", data="{", content_type="application/json").status_code == 400
    assert client.post("/api/v1/tasks", data="[1]", content_type="application/json").status_code == 400
    r = client.post("/api/v1/tasks", data="type=x", content_type="application/x-www-form-urlencoded")
    assert r.status_code == 415 and r.headers["Content-Type"] == PROBLEM
    big = '{"type": "demo.sleep", "payload": {"pad": "' + "x" * config.max_body + '"}}'
    r = client.post("/api/v1/tasks", data=big, content_type="application/json")
    assert r.status_code == 413 and r.headers["Content-Type"] == PROBLEM
    assert conn.dbsize() == 0


def test_unknown_and_malformed_ids_are_404(client):
    for path in (f"/api/v1/tasks/{uuid.uuid4()}", "/api/v1/tasks/not-a-uuid", "/api/v1/tasks/../etc",
                 f"/api/v1/tasks/{uuid.uuid4()}/result", f"/api/v1/tasks/{uuid.uuid4()}/result/file"):
        r = client.get(path)
        assert r.status_code == 404 and r.headers["Content-Type"] == PROBLEM, path
    r = client.delete(f"/api/v1/tasks/{uuid.uuid4()}")
    assert r.status_code == 404 and r.get_json()["detail"] == "task not found or expired"


def test_cancel_pending_then_409(client, conn, config):
    doc = submit(client, {"type": "demo.sleep"}).get_json()
    deleted = client.delete(doc["links"]["self"])
    assert deleted.status_code == 204 and "Content-Type" not in deleted.headers and deleted.data == b""
    assert client.get(doc["links"]["self"]).get_json()["status"] == "CANCELLED"
    assert not conn.exists(f"rq:job:{doc['task_id']}")
    again = client.delete(doc["links"]["self"])
    assert again.status_code == 409 and again.get_json()["task_status"] == "CANCELLED"
    result = client.get(doc["links"]["result"])
    assert result.status_code == 409 and result.get_json()["task_status"] == "CANCELLED"


def test_failed_task_result_is_409_with_error(client, conn, config):
    doc = submit(client, {"type": "orders.split", "payload": {
        "order_code": "A", "account_status": "suspended", "items": [{"item_code": "i", "quantity": 1}]}}).get_json()
    run_queued(conn, config)
    status = client.get(doc["links"]["self"]).get_json()
    assert status["status"] == "FAILED" and status["error"]["code"] == 10001
    r = client.get(doc["links"]["result"])
    assert r.status_code == 409 and r.get_json()["error"]["code"] == 10001
    assert client.delete(doc["links"]["self"]).status_code == 409


def test_expired_reads_are_410(client, conn):
    doc = submit(client, {"type": "demo.sleep"}).get_json()
    conn.hset(keys.task(doc["task_id"]), "expires_at", 1)
    r = client.get(doc["links"]["self"])
    assert r.status_code == 410 and r.get_json()["status"] == "EXPIRED" and r.get_json()["error"]["code"] == -4
    assert client.get(doc["links"]["result"]).status_code == 410
    assert client.delete(doc["links"]["self"]).status_code == 409


def test_export_file_is_streamed_as_attachment(client, conn, config):
    doc = submit(client, {"type": "orders.export", "payload": {"rows": 5}}).get_json()
    run_queued(conn, config)
    result = client.get(doc["links"]["result"]).get_json()["result"]
    assert result["rows"] == 5 and result["file"]["url"] == f"{doc['links']['result']}/file"
    with client.get(result["file"]["url"]) as r:
        assert r.status_code == 200 and "attachment" in r.headers["Content-Disposition"]
        assert r.data.count(b"\n") == 6 and len(r.data) == result["file"]["size"]
        assert r.headers["Content-Type"] == "text/csv; charset=utf-8"
        assert int(r.headers["Content-Length"]) == result["file"]["size"]


def test_history_newest_first_with_filters_and_422(client):
    ids = [submit(client, {"type": "demo.sleep", "payload": {"seconds": i}}).get_json()["task_id"] for i in range(3)]
    body = client.get("/api/v1/tasks?limit=2").get_json()
    assert len(body["tasks"]) == 2 and body["next_cursor"]
    rest = client.get(f"/api/v1/tasks?limit=2&cursor={body['next_cursor']}").get_json()
    assert sorted(t["task_id"] for t in body["tasks"] + rest["tasks"]) == sorted(ids)
    assert client.get("/api/v1/tasks?status=PENDING&type=demo.sleep").get_json()["tasks"]
    assert client.get("/api/v1/tasks?status=COMPLETED").get_json() == {"tasks": [], "next_cursor": None}
    for bad, field in (("limit=0", "limit"), ("limit=500", "limit"), ("limit=x", "limit"),
                       ("status=DONE", "status"), ("cursor=@@@", "cursor"), ("bogus=1", "bogus")):
        r = client.get(f"/api/v1/tasks?{bad}")
        assert r.status_code == 422 and field in r.get_json()["errors"], bad


def test_members_see_only_their_own_tasks(config, conn):
    keyed = create_app(config.__class__.from_env({}, redis_url="redis://fake", data_dir=config.data_dir,
                                                 api_keys="ka:alice,kb:bob"), conn=conn).test_client()
    alice = {"Authorization": "Bearer ka"}
    doc = submit(keyed, {"type": "demo.sleep"}, headers=alice).get_json()
    assert keyed.get(doc["links"]["self"], headers=alice).status_code == 200
    assert keyed.get(doc["links"]["self"], headers={"Authorization": "Bearer kb"}).status_code == 404
    assert submit(keyed, {"type": "demo.sleep"}, headers={"Authorization": "Bearer kb"}).status_code == 202
    r = keyed.get(doc["links"]["self"])
    assert r.status_code == 401 and r.headers["Content-Type"] == PROBLEM


def test_redis_down_is_503_with_retry_after(config):
    down = Config.from_env({}, redis_url="redis://127.0.0.1:1/0", data_dir=config.data_dir)
    client = create_app(down).test_client()
    r = client.get(f"/api/v1/tasks/{uuid.uuid4()}")
    assert r.status_code == 503 and r.headers["Retry-After"] and r.headers["Content-Type"] == PROBLEM
    assert "redis" not in r.get_data(as_text=True).lower()
    assert client.get("/readyz").status_code == 503
    assert client.get("/healthz").status_code == 200


def test_unknown_route_and_method_are_problems(client):
    assert client.get("/api/v1/nope").headers["Content-Type"] == PROBLEM
    r = client.put("/api/v1/tasks")
    assert r.status_code == 405 and r.headers["Content-Type"] == PROBLEM


def test_json_content_types_as_sent_or_with_parameters(client):
    """The submit's Content-Type: "application/json" as is (compared before werkzeug parses it), or with
    parameters or in other case (parsed); any other type is 415."""
    for n, content_type in enumerate(("application/json", "application/json; charset=utf-8", "Application/JSON")):
        body = f'{{"type": "demo.sleep", "payload": {{"seconds": {n}}}}}'  # distinct: no dedup
        assert client.post("/api/v1/tasks", data=body, content_type=content_type).status_code == 202, content_type
    body = '{"type": "demo.sleep", "payload": {}}'
    for content_type in ("text/plain", "application/jsonx", "application/json-patch+json"):
        assert client.post("/api/v1/tasks", data=body, content_type=content_type).status_code == 415, content_type


@pytest.mark.parametrize("status, headers", [(200, None), (202, {"Location": "/x", "Retry-After": "1"}),
                                             (410, {}), (503, {"Content-Type": "text/plain", "Retry-After": "5"}),
                                             (299, None)])
def test_json_response_is_the_response_werkzeugs_constructor_makes(status, headers):
    from flask import Response

    from app.web.api import JSON, json_response

    body = {"a": [1, "é"], "b": None}
    for _ in range(2):  # the status line worked out, then the one kept
        made = json_response(body, status, headers)
        expected = Response(orjson.dumps(body), status=status, content_type=JSON)
        if headers:
            expected.headers.update(headers)
        assert type(made) is Response
        assert vars(made) == vars(expected)
        assert list(made.headers.items()) == list(expected.headers.items())
        assert (made.status, made.status_code, made.get_data()) == (expected.status, expected.status_code,
                                                                     expected.get_data())
    with pytest.raises(ValueError):  # a header value is still checked
        json_response(body, 200, {"Location": "/x\r\nSet-Cookie: a=b"})


def test_a_submits_202_has_the_headers_werkzeug_gives(app):
    """The submit's 202 skips werkzeug's ``iri_to_uri`` of its own plain Location; its WSGI headers are werkzeug's
    for the same answer, and any other Location (a hook's) or a Content-Location still goes through werkzeug."""
    from app.web.api import JSON, json_response
    from app.web.api.tasks import _Accepted

    doc = {"task_id": "2f1c6a0e-8a53-4c1e-9d6b-0b2a4c1f7e21", "status": "PENDING"}
    headers = {"Location": f"/api/v1/tasks/{doc['task_id']}", "Retry-After": "1", "Warning": "no-worker; queue=low"}
    with app.test_request_context("/api/v1/tasks", method="POST") as ctx:
        environ = ctx.request.environ

        def both(change=lambda r: None):
            ours, werkzeugs = _Accepted.of(doc, headers), json_response(doc, 202, headers)
            change(ours), change(werkzeugs)
            assert ours.get_data() == werkzeugs.get_data() and ours.status == werkzeugs.status == "202 ACCEPTED"
            return list(ours.get_wsgi_headers(environ)), list(werkzeugs.get_wsgi_headers(environ))

        ours, theirs = both()
        assert ours == theirs and [k for k, _ in ours] == ["Content-Type", "Content-Length", *headers]
        made = _Accepted.of(doc, headers)  # filled directly (json_response's kind), as werkzeug's constructor makes it
        built = _Accepted(orjson.dumps(doc), status=202, content_type=JSON)
        built.headers.update(headers)
        built.plain_location = headers["Location"]
        assert type(made) is _Accepted and vars(made) == vars(built)
        assert list(made.headers.items()) == list(built.headers.items())
        for change in (lambda r: r.headers.__setitem__("Location", "/api/v1/tâches/é"),
                       lambda r: r.headers.add("Content-Location", "/x/é"),
                       lambda r: r.headers.__delitem__("Content-Length")):
            ours, theirs = both(change)
            assert ours == theirs
        assert dict(both(lambda r: r.headers.__setitem__("Location", "/é"))[0])["Location"] == "/%C3%A9"


class _DeclaredBody:
    """A request body of ``data`` whose reader, like a socket at the end of a Content-Length body, must not be asked
    for more once it gave every byte (the test fails where it is)."""

    def __init__(self, data: bytes) -> None:
        self._data, self.reads = data, 0

    def read(self, size: int = -1) -> bytes:
        assert self._data, "read again past the declared Content-Length"
        self.reads += 1
        chunk, self._data = self._data[:size], self._data[size:]
        return chunk


def test_a_body_with_a_content_length_is_read_to_its_length_and_no_further(app):
    from app.web.api.tasks import _json_body

    body = b'{"type":"demo.sleep","payload":{"seconds":0}}'
    stream = _DeclaredBody(body)
    with app.test_request_context("/api/v1/tasks", method="POST", environ_overrides={
            "wsgi.input": stream, "wsgi.input_terminated": True, "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body))}):
        assert _json_body() == {"type": "demo.sleep", "payload": {"seconds": 0}}
    assert stream.reads == 1
