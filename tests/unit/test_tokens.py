"""Read tokens (app.web.tokens, app.web.auth, app.web.api.tokens) and CORS (app.web.cors) on fakeredis: signing,
expiry, alteration, key removal, rotation, scope; the HTTP rules of each. Real processes: tests/integration/
test_tokens.py."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from app.core import keys
from app.core.config import Config, ConfigError
from app.core.logs import RedactTokenFilter
from app.core.tokensecret import RECHECK as SECRET_RECHECK
from app.core.tokensecret import rotate
from app.web import create_app
from app.web.tokens import BATCH, OPEN_KEY, TASK, VERIFIED_KEPT, InvalidToken, Tokens

KEYS = "ka:alice,kb:bob,kc:alice"
ALICE, BOB, ALICE2 = ({"Authorization": f"Bearer {k}"} for k in ("ka", "kb", "kc"))
ORIGIN = "http://localhost:5173"
NOW = 1_800_000_000_000


def tokens(conn, tmp_path, api_keys: str = KEYS, **settings) -> Tokens:
    return Tokens(conn, Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, api_keys=api_keys,
                                        **settings), "public")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- signing ---------------------------------------------------------------------------------------


def test_a_token_verifies_to_its_scope_and_member(conn, tmp_path):
    t = tokens(conn, tmp_path)
    minted = t.mint(TASK, "task-1", "ka", 60, NOW)
    assert minted["token"].startswith("tpr.") and minted["expires_at"] == "2027-01-15T08:01:00.000Z"
    scope = t.verify(minted["token"], NOW + 59_999)
    assert (scope.kind, scope.id, scope.member, scope.expires_at) == (TASK, "task-1", "alice", NOW + 60_000)


def test_a_token_is_url_safe_and_names_no_member_or_key(conn, tmp_path):
    token = tokens(conn, tmp_path).mint(BATCH, "b-1", "ka", 60, NOW)["token"]
    assert set(token) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
    import base64

    readable = base64.urlsafe_b64decode(token.split(".")[1] + "==")
    assert b"alice" not in readable and b"ka" not in readable and b"b-1" in readable


def test_an_expired_token_does_not_count_even_once_verified(conn, tmp_path):
    t = tokens(conn, tmp_path)
    token = t.mint(TASK, "task-1", "ka", 1, NOW)["token"]
    t.verify(token, NOW + 999)  # kept as verified
    with pytest.raises(InvalidToken, match="expired"):
        t.verify(token, NOW + 1000)
    assert token not in t.signing().verified


@pytest.mark.parametrize("alter", [
    # the signature: its last base64 character carries 4 bits and 2 of padding ("A" and "B" decode alike), so
    # it becomes "A" (0), or "Q" (16) when it was "A": either way a bit of the signature changes
    lambda s: s[:-1] + ("A" if s[-1] != "A" else "Q"),
    lambda s: s[:6] + ("A" if s[6] != "A" else "B") + s[7:],  # the payload
    lambda s: s.replace("tpr.", "tpr.x"),
    lambda s: "tpr.",
])
def test_an_altered_token_does_not_count(conn, tmp_path, alter):
    t = tokens(conn, tmp_path)
    token = t.mint(TASK, "task-1", "ka", 60, NOW)["token"]
    with pytest.raises(InvalidToken):
        t.verify(alter(token), NOW)


def test_a_token_of_a_removed_key_does_not_count_and_its_member_s_other_key_s_still_do(conn, tmp_path):
    minter = tokens(conn, tmp_path)
    by_ka, by_kc = (minter.mint(TASK, "task-1", key, 60, NOW)["token"] for key in ("ka", "kc"))
    after = tokens(conn, tmp_path, api_keys="kb:bob,kc:alice")  # ka removed, the same stored secret
    with pytest.raises(InvalidToken, match="no longer configured"):
        after.verify(by_ka, NOW)
    assert after.verify(by_kc, NOW).member == "alice"


def test_a_key_given_to_another_member_reads_as_that_member(conn, tmp_path):
    token = tokens(conn, tmp_path).mint(TASK, "task-1", "ka", 60, NOW)["token"]
    assert tokens(conn, tmp_path, api_keys="ka:carol").verify(token, NOW).member == "carol"


def test_open_mode_tokens_count_only_while_no_key_is_configured(conn, tmp_path):
    token = tokens(conn, tmp_path, api_keys="").mint(TASK, "task-1", None, 60, NOW)["token"]
    assert tokens(conn, tmp_path, api_keys="").verify(token, NOW).member == "public"
    with pytest.raises(InvalidToken):
        tokens(conn, tmp_path).verify(token, NOW)
    keyed = tokens(conn, tmp_path).mint(TASK, "task-1", "ka", 60, NOW)["token"]
    with pytest.raises(InvalidToken):
        tokens(conn, tmp_path, api_keys="").verify(keyed, NOW)
    assert OPEN_KEY not in tokens(conn, tmp_path).signing().members


def test_the_secret_is_made_once_in_redis_and_shared(conn, tmp_path):
    first, second = tokens(conn, tmp_path), tokens(conn, tmp_path)
    token = first.mint(TASK, "task-1", "ka", 60, NOW)["token"]
    stored = conn.get(keys.TOKEN_SECRET)
    assert stored and len(stored) >= 40
    assert second.verify(token, NOW).id == "task-1"
    assert conn.get(keys.TOKEN_SECRET) == stored


def test_rotation_revokes_within_the_recheck(conn, tmp_path, monkeypatch):
    t = tokens(conn, tmp_path)
    token = t.mint(TASK, "task-1", "ka", 60, NOW)["token"]
    t.verify(token, NOW)
    rotate(conn)
    clock = time.monotonic() + SECRET_RECHECK + 0.01
    monkeypatch.setattr("app.web.tokens.time.monotonic", lambda: clock)
    with pytest.raises(InvalidToken, match="altered, or was signed with a secret since rotated"):
        t.verify(token, NOW)
    assert t.verify(t.mint(TASK, "task-1", "ka", 60, NOW)["token"], NOW).id == "task-1"


def test_taskport_tokens_rotate_replaces_the_stored_secret_and_says_when_the_variable_wins(conn, tmp_path,
                                                                                           monkeypatch, capsys):
    from app.launch.cli import main

    first = tokens(conn, tmp_path).signing().secret
    monkeypatch.setenv("REDIS_URL", "redis://fake")
    monkeypatch.setattr("app.core.connection.connect", lambda config: conn)
    assert main(["tokens", "rotate"]) == 0
    out, err = capsys.readouterr()
    assert "rotated" in out and "2 s" in out and not err
    assert conn.get(keys.TOKEN_SECRET) not in (None, first)
    monkeypatch.setenv("TASKPORT_TOKEN_SECRET", "s" * 40)
    assert main(["tokens", "rotate"]) == 0
    assert "TASKPORT_TOKEN_SECRET is set here" in capsys.readouterr().err


def test_the_configured_secret_wins_over_the_stored_one_and_reads_no_redis(conn, tmp_path):
    t = tokens(conn, tmp_path, token_secret="s" * 40)
    token = t.mint(TASK, "task-1", "ka", 60, NOW)["token"]
    assert conn.get(keys.TOKEN_SECRET) is None
    rotate(conn)
    assert tokens(conn, tmp_path, token_secret="s" * 40).verify(token, NOW).id == "task-1"
    with pytest.raises(InvalidToken):
        tokens(conn, tmp_path, token_secret="t" * 40).verify(token, NOW)
    with pytest.raises(InvalidToken):
        tokens(conn, tmp_path).verify(token, NOW)


def test_the_verified_tokens_kept_are_bounded(conn, tmp_path):
    t = tokens(conn, tmp_path)
    for n in range(VERIFIED_KEPT + 10):
        t.verify(t.mint(TASK, f"task-{n}", "ka", 60, NOW)["token"], NOW)
    assert len(t.signing().verified) == VERIFIED_KEPT


def test_a_configured_secret_is_long_enough():
    with pytest.raises(ConfigError, match="TASKPORT_TOKEN_SECRET must be at least 32"):
        Config.from_env({"TASKPORT_TOKEN_SECRET": "short"})


def test_a_key_may_not_start_with_the_token_prefix():
    with pytest.raises(ConfigError, match="tpr."):
        Config.from_env({"TASKPORT_API_KEYS": "tpr.abc:alice"})


@pytest.mark.parametrize("value", ["*", "https://a.example.com/", "https://a.example.com/x", "ftp://a.example.com",
                                   "https://*.example.com", "a.example.com", "https://a.example.com:0",
                                   "https://u@a.example.com", "https://a.example.com?x=1"])
def test_cors_origins_must_be_exact_origins(value):
    with pytest.raises(ConfigError, match="TASKPORT_CORS_ORIGINS"):
        Config.from_env({"TASKPORT_CORS_ORIGINS": value})


def test_cors_origins_are_kept_as_a_browser_sends_them():
    config = Config.from_env({"TASKPORT_CORS_ORIGINS": "https://A.example.com:443, http://localhost:5173,"})
    assert config.cors_allowed == ("https://a.example.com", "http://localhost:5173")


def test_the_redaction_filter_hides_the_query_parameter_in_any_record():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "GET %s %s", ("/t?a=1&access_token=tpr.SECRET", 200),
                               None)
    assert RedactTokenFilter().filter(record)
    assert "SECRET" not in record.getMessage() and "access_token=[redacted]" in record.getMessage()
    assert "a=1" in record.getMessage()


# -- over HTTP ---------------------------------------------------------------------------------------


@pytest.fixture
def config(tmp_path) -> Config:
    return Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, api_keys=KEYS, cors_origins=ORIGIN,
                           dashboard_password="pw")


def submit(client, headers=ALICE, **body) -> dict:
    body.setdefault("dedup_key", uuid.uuid4().hex)
    answer = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {"seconds": 1}, **body},
                         headers=headers)
    assert answer.status_code == 202, answer.get_data(as_text=True)
    return answer.json


def mint(client, task_id, headers=ALICE, **body) -> str:
    answer = client.post(f"/api/v1/tasks/{task_id}/tokens", json=body or None, headers=headers)
    assert answer.status_code == 201, answer.get_data(as_text=True)
    return answer.json["token"]


def test_a_submit_with_read_token_carries_one_that_reads_the_task(client):
    doc = submit(client, read_token=True)
    token = doc["read_token"]["token"]
    for path in ("", "/result"):
        assert client.get(f"/api/v1/tasks/{doc['task_id']}{path}", headers=bearer(token)).status_code in (200, 202)
    answer = client.get(f"/api/v1/tasks/{doc['task_id']}?access_token={token}")
    assert answer.status_code == 200 and answer.json["task_id"] == doc["task_id"]
    assert "read_token" not in submit(client)


def test_read_token_must_be_a_boolean(client):
    answer = client.post("/api/v1/tasks", json={"type": "demo.sleep", "read_token": "yes"}, headers=ALICE)
    assert answer.status_code == 422 and "read_token" in answer.json["errors"]


def test_minting_takes_a_ttl_of_1_to_86400(client):
    task_id = submit(client)["task_id"]
    answer = client.post(f"/api/v1/tasks/{task_id}/tokens", json={"ttl": 86400}, headers=ALICE)
    assert answer.status_code == 201 and set(answer.json) == {"token", "expires_at"}
    assert client.post(f"/api/v1/tasks/{task_id}/tokens", headers=ALICE).status_code == 201
    for bad in (0, 86401, "60", 1.5, True, None):
        answer = client.post(f"/api/v1/tasks/{task_id}/tokens", json={"ttl": bad}, headers=ALICE)
        assert answer.status_code == 422 and "ttl" in answer.json["errors"], bad
    answer = client.post(f"/api/v1/tasks/{task_id}/tokens", json={"other": 1}, headers=ALICE)
    assert answer.status_code == 422 and answer.json["type"] == "/problems/validation"
    answer = client.post(f"/api/v1/tasks/{task_id}/tokens", data=b" ", content_type="application/json", headers=ALICE)
    assert answer.status_code == 400 and answer.content_type == "application/problem+json"  # whitespace: not JSON


def test_minting_for_a_foreign_or_unknown_task_is_404(client):
    task_id = submit(client)["task_id"]
    assert client.post(f"/api/v1/tasks/{task_id}/tokens", headers=BOB).status_code == 404
    assert client.post("/api/v1/tasks/nope/tokens", headers=ALICE).status_code == 404
    assert client.post(f"/api/v1/tasks/{task_id}/tokens").status_code == 401


def test_a_token_may_not_write_or_leave_its_scope(client):
    task_id = submit(client)["task_id"]
    token = mint(client, task_id)
    for method, path in (("DELETE", f"/tasks/{task_id}"), ("POST", f"/tasks/{task_id}/retry"),
                         ("POST", f"/tasks/{task_id}/tokens"), ("GET", "/tasks"), ("POST", "/tasks"),
                         ("GET", "/schedules"), ("POST", "/batches"), ("PATCH", f"/tasks/{task_id}"),
                         ("GET", f"/batches/{task_id}")):
        answer = client.open(f"/api/v1{path}", method=method, headers=bearer(token), json={})
        assert answer.status_code == 403, (method, path, answer.get_data(as_text=True))
        assert answer.content_type == "application/problem+json"
        assert answer.headers["WWW-Authenticate"] == 'Bearer error="insufficient_scope"'
    for path in ("/api/v1/audit", "/metrics", "/rq/"):
        assert client.get(f"{path}?access_token={token}").status_code == 403


def test_another_task_s_id_is_404_as_a_foreign_task(client):
    mine, other = submit(client)["task_id"], submit(client)["task_id"]
    token = mint(client, mine)
    for path in ("", "/events", "/result", "/result/file"):
        answer = client.get(f"/api/v1/tasks/{other}{path}", headers=bearer(token))
        assert answer.status_code == 404 and answer.json["detail"] == "task not found or expired", path
    assert client.get("/api/v1/tasks/not-an-id", headers=bearer(token)).status_code == 404


def test_a_token_that_does_not_count_is_401_invalid_token(client):
    token = mint(client, submit(client)["task_id"])
    answer = client.get("/api/v1/tasks/x", headers=bearer(token[:-2]))
    assert answer.status_code == 401 and answer.json["type"] == "/problems/invalid-token"
    assert answer.headers["WWW-Authenticate"].startswith('Bearer error="invalid_token"')


def test_with_a_header_the_query_parameter_is_ignored_and_two_parameters_are_400(client):
    task_id = submit(client)["task_id"]
    token = mint(client, task_id)
    assert client.get(f"/api/v1/tasks?access_token={token}", headers=ALICE).status_code == 200  # the key counts
    assert client.get(f"/api/v1/tasks/{task_id}?access_token=tpr.bad", headers=bearer(token)).status_code == 200
    assert client.delete(f"/api/v1/tasks/{task_id}?access_token=x", headers=bearer(token)).status_code == 403
    answer = client.get(f"/api/v1/tasks/{task_id}?access_token={token}&access_token={token}")
    assert answer.status_code == 400 and "access_token" in answer.json["errors"]


def task_body() -> dict:
    return {"type": "demo.sleep", "dedup_key": uuid.uuid4().hex}


def test_a_batch_token_reads_the_batch_and_its_tasks_only(client):
    body = {"tasks": [task_body(), task_body()], "then": {"type": "demo.sleep"}, "read_token": True}
    batch = client.post("/api/v1/batches", json=body, headers=ALICE).json
    token = batch["read_token"]["token"]
    other = client.post("/api/v1/batches", json={"tasks": [task_body()]}, headers=ALICE).json
    h = bearer(token)
    assert client.get(f"/api/v1/batches/{batch['batch_id']}", headers=h).status_code == 200
    page = client.get(f"/api/v1/batches/{batch['batch_id']}/tasks?limit=1&access_token={token}")
    assert page.status_code == 200 and len(page.json["tasks"]) == 1
    for entry in batch["tasks"]:
        assert client.get(f"/api/v1/tasks/{entry['task_id']}", headers=h).status_code == 200
    assert client.get(f"/api/v1/tasks/{batch['then_task_id']}", headers=h).status_code == 200
    assert client.get(f"/api/v1/tasks/{other['tasks'][0]['task_id']}", headers=h).status_code == 404
    assert client.get(f"/api/v1/batches/{other['batch_id']}", headers=h).status_code == 404
    assert client.delete(f"/api/v1/batches/{batch['batch_id']}", headers=h).status_code == 403
    assert client.post(f"/api/v1/batches/{batch['batch_id']}/tokens", headers=BOB).status_code == 404
    assert client.post(f"/api/v1/batches/{batch['batch_id']}/tokens", headers=ALICE).status_code == 201


@pytest.mark.parametrize("value", [1, 0, "true", None, {}])
def test_a_batch_s_read_token_is_true_or_false(client, value):
    answer = client.post("/api/v1/batches", json={"tasks": [task_body()], "read_token": value}, headers=ALICE)
    assert answer.status_code == 422 and "read_token" in answer.json["errors"]


def test_a_task_token_does_not_read_a_batch_of_the_same_id_space(client):
    batch = client.post("/api/v1/batches", json={"tasks": [task_body()]}, headers=ALICE).json
    token = mint(client, batch["tasks"][0]["task_id"])
    assert client.get(f"/api/v1/batches/{batch['batch_id']}", headers=bearer(token)).status_code == 403


def test_a_token_counts_in_its_member_s_rate_limit(tmp_path, conn):
    client = create_app(Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, api_keys=KEYS,
                                        rate_limit="1000/hour"), conn=conn).test_client()
    task_id = submit(client)["task_id"]
    token = mint(client, task_id)

    def remaining(**kwargs) -> int:
        return int(client.get(f"/api/v1/tasks/{task_id}", **kwargs).headers["X-RateLimit-Remaining"])

    before = remaining(headers=ALICE2)
    assert remaining(query_string={"access_token": token}) == before - 1
    assert remaining(headers=ALICE) == before - 2
    assert remaining(headers=BOB) == before  # bob's count is his own (his answer is a 404)


def test_the_access_token_parameter_is_not_seen_by_a_strict_query(client):
    task_id = submit(client)["task_id"]
    token = mint(client, task_id)
    assert client.get(f"/api/v1/tasks?access_token={token}").status_code == 403  # scope, not an unknown-field 422


def test_open_mode_tokens_work_too(tmp_path, conn):
    client = create_app(Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path), conn=conn).test_client()
    doc = submit(client, headers={}, read_token=True)
    token = doc["read_token"]["token"]
    assert client.get(f"/api/v1/tasks/{doc['task_id']}", headers=bearer(token)).status_code == 200
    assert client.delete(f"/api/v1/tasks/{doc['task_id']}", headers=bearer(token)).status_code == 403
    assert client.delete(f"/api/v1/tasks/{doc['task_id']}").status_code == 204


# -- CORS --------------------------------------------------------------------------------------------


def preflight(client, path, origin=ORIGIN, method="GET"):
    return client.options(path, headers={"Origin": origin, "Access-Control-Request-Method": method,
                                         "Access-Control-Request-Headers": "authorization, last-event-id"})


def test_a_preflight_is_answered_without_a_key(client):
    answer = preflight(client, "/api/v1/tasks/abc", method="DELETE")
    assert answer.status_code == 200
    assert answer.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert set(answer.headers["Access-Control-Allow-Methods"].split(", ")) == {"GET", "HEAD", "DELETE", "OPTIONS"}
    assert {h.strip().lower() for h in answer.headers["Access-Control-Allow-Headers"].split(",")} == {
        "authorization", "last-event-id"}
    assert int(answer.headers["Access-Control-Max-Age"]) > 0
    assert "Origin" in answer.headers["Vary"]
    assert "Access-Control-Allow-Credentials" not in answer.headers


def test_a_not_allowed_origin_gets_no_allow_origin(client):
    answer = preflight(client, "/api/v1/tasks", origin="http://evil.example")
    assert "Access-Control-Allow-Origin" not in answer.headers and "Origin" in answer.headers["Vary"]
    answer = client.get("/api/v1/tasks", headers={**ALICE, "Origin": "http://evil.example"})
    assert answer.status_code == 200 and "Access-Control-Allow-Origin" not in answer.headers


def test_a_request_without_origin_gets_no_cors_header(client):
    """curl, a backend: not a cross-origin call (flask-cors' always_send would answer it with the origins)."""
    answer = client.post("/api/v1/tasks", json={"type": "demo.sleep"}, headers=ALICE)
    assert answer.status_code == 202 and not [h for h in answer.headers.keys() if h.startswith("Access-Control-")]
    assert "Origin" in answer.headers["Vary"]  # a shared cache still keys on it


def test_an_allowed_origin_s_answers_carry_cors_and_expose_headers(client):
    answer = client.post("/api/v1/tasks", json={"type": "demo.sleep"}, headers={**ALICE, "Origin": ORIGIN})
    assert answer.headers["Access-Control-Allow-Origin"] == ORIGIN
    exposed = {h.strip() for h in answer.headers["Access-Control-Expose-Headers"].split(",")}
    assert {"Location", "Retry-After", "Link", "X-RateLimit-Limit", "X-RateLimit-Remaining",
            "X-RateLimit-Reset"} <= exposed
    assert "Origin" in answer.headers["Vary"]
    denied = client.get("/api/v1/tasks", headers={"Origin": ORIGIN})
    assert denied.status_code == 401 and denied.headers["Access-Control-Allow-Origin"] == ORIGIN


@pytest.mark.parametrize("path", ["/rq/", "/api/v1/audit", "/metrics", "/api/v1/queues/default/pause", "/healthz",
                                  "/api/v1/openapi.json"])
def test_operator_surfaces_get_no_cors(client, path):
    for answer in (preflight(client, path, method="POST"), client.get(path, headers={"Origin": ORIGIN})):
        assert not [h for h in answer.headers.keys() if h.startswith("Access-Control-")], path


def test_no_origins_no_cors_headers(tmp_path, conn):
    client = create_app(Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, api_keys=KEYS),
                        conn=conn).test_client()
    answer = client.get("/api/v1/tasks", headers={**ALICE, "Origin": ORIGIN})
    assert not [h for h in answer.headers.keys() if h.startswith("Access-Control-")]
    assert preflight(client, "/api/v1/tasks").status_code == 401  # as before: no CORS, no preflight answered
