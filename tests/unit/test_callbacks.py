"""Callbacks (issue 21, point 4): the URL policy (no SSRF), the signing secrets, the retry schedule, the Standard
Webhooks signature (checked by the standardwebhooks library's own verify), the claim of due deliveries under two
schedulers, and whole attempts against a receiver on loopback (fakeredis for Redis).

The resolver is replaced wherever a name must resolve to an address that is not this machine's, so no test sends
a packet anywhere but to loopback.
"""

from __future__ import annotations

import base64
import http.server
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import orjson
import pytest
from marshmallow import ValidationError
from rq import Queue
from standardwebhooks import Webhook, WebhookVerificationError

from app.core import callback_http, callbacks, keys
from app.core.answers import NewTask
from app.core.callback_http import Refused, Target, is_public, post, refusal, resolve
from app.core.callbacks import CallbackState, Deliveries, DeliveryId, next_attempt, retry_delay, signed_headers
from app.core.config import Config, ConfigError
from app.core.ids import new_task_id
from app.core.keys import BatchField, TaskField
from app.core.states import CALLBACK_QUEUE
from app.core.store import TaskStore
from app.launch.cli import build_parser
from app.launch.supervisor import secret_free, web_only_environ
from app.launch.supervisorconf import WEB_ENV_FLAG, programs
from app.web.callback_schemas import CallbackSchema, check_callback
from workers import delivery
from workers.delivery import DELIVER, Deliverer, Dispatch, rq_log_level

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"another key of thirty-two bytes!").decode()
PUBLIC_V4, PUBLIC_V6 = "93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"


def settings(**extra: Any) -> Config:
    return Config.from_env({}, redis_url="redis://fake", callback_secrets=f"public:{SECRET}", **extra)


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Host name -> the addresses it resolves to (getaddrinfo replaced; an unknown name does not resolve, an
    address resolves to itself)."""
    names: dict[str, list[str]] = {}

    def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        found = names.get(host) or ([host] if _is_address(host) else [])
        if not found:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in found]

    monkeypatch.setattr(callback_http.socket, "getaddrinfo", getaddrinfo)
    return names


def _is_address(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        return False
    return True


# -- the URL policy ---------------------------------------------------------------------------------


def test_a_public_https_url_is_accepted_and_its_addresses_pinned(resolver: dict[str, list[str]]) -> None:
    resolver["hooks.example.com"] = [PUBLIC_V6, PUBLIC_V4]
    target = resolve("https://Hooks.Example.com:8443/in/taskport?x=1#frag", settings())
    assert target == Target("https", "hooks.example.com", 8443, "/in/taskport?x=1", (PUBLIC_V6, PUBLIC_V4))
    assert target.host_header == "hooks.example.com:8443"
    assert resolve("https://hooks.example.com", settings()).path == "/"
    assert resolve("https://hooks.example.com", settings()).host_header == "hooks.example.com"
    assert refusal(f"https://[{PUBLIC_V6}]/x", settings()) is None


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.9.9.9", "::1",  # loopback
    "10.0.0.1", "172.16.5.4", "192.168.1.1", "fc00::1", "fd12:3456::1",  # private
    "169.254.169.254", "fe80::1",  # link-local (the cloud metadata address among them)
    "224.0.0.1", "239.255.255.250", "ff02::1",  # multicast
    "240.0.0.1", "0.0.0.0", "::",  # reserved, unspecified
    "100.64.0.1", "100.127.255.254",  # shared address space (carrier-grade NAT)
    "198.18.0.1", "192.0.2.1", "2001:db8::1",  # benchmarking, documentation
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254",  # IPv4-mapped
    "2002:a00:1::1", "64:ff9b::a00:1",  # 6to4 and NAT64 of 10.0.0.1
])
def test_a_host_resolving_to_a_non_public_address_is_refused(resolver: dict[str, list[str]], address: str) -> None:
    resolver["inside.example.com"] = [address]
    reason = refusal("https://inside.example.com/hook", settings())
    assert reason is not None and "non-public address" in reason
    assert address not in reason  # what an internal name resolves to is not told
    literal = f"[{address}]" if ":" in address else address
    assert refusal(f"https://{literal}/hook", settings()) is not None


def test_mapped_6to4_and_nat64_addresses_of_public_ones_are_public() -> None:
    import ipaddress

    for address in ("::ffff:93.184.216.34", "2002:5db8:d822::1", "64:ff9b::5db8:d822", PUBLIC_V6, PUBLIC_V4):
        assert is_public(ipaddress.ip_address(address)), address


@pytest.mark.parametrize("url", ["https://2130706433/", "https://0x7f.1/", "https://0177.0.0.1/", "https://127.1/"])
def test_loopback_spelt_as_a_number_is_still_loopback(url: str) -> None:
    assert "non-public address" in (refusal(url, settings()) or "")  # the resolver's reading of it is judged


def test_one_private_address_among_public_ones_refuses_the_host(resolver: dict[str, list[str]]) -> None:
    resolver["mixed.example.com"] = [PUBLIC_V4, "10.1.2.3"]
    assert refusal("https://mixed.example.com/", settings()) is not None


@pytest.mark.parametrize("url, words", [
    ("http://hooks.example.com/x", "must use https"),
    ("ftp://hooks.example.com/x", "Not an absolute https URL"),
    ("https:///x", "Not an absolute https URL"),
    ("/relative/path", "Not an absolute https URL"),
    ("https://user:pw@hooks.example.com/x", "user name or password"),
    ("https://token@hooks.example.com/x", "user name or password"),
    ("https://hooks.example.com:99999/x", "not a valid port"),
    ("https://hooks.example.com/a b", "spaces"),
    ("https://hooks.example.com/\r\nX-Injected: 1", "control"),
    ("https://bücher.example/x", "non-ASCII"),
    ("https://nowhere.invalid/x", "does not resolve"),
    ("https://hooks.example.com/" + "x" * 2048, "too long"),
])
def test_malformed_or_unsafe_urls_are_refused_with_a_reason(resolver: dict[str, list[str]], url: str,
                                                            words: str) -> None:
    resolver["hooks.example.com"] = [PUBLIC_V4]
    reason = refusal(url, settings())
    assert reason is not None and words in reason, reason


def test_an_allowed_host_may_be_loopback_and_use_http(resolver: dict[str, list[str]]) -> None:
    resolver["receiver.local"] = ["127.0.0.1"]
    allowed = settings(callback_allow_hosts="127.0.0.1, Receiver.Local,[::1]")
    assert allowed.callback_hosts == frozenset({"127.0.0.1", "receiver.local", "::1"})
    assert resolve("http://127.0.0.1:9000/hook", allowed).addresses == ("127.0.0.1",)
    assert refusal("http://receiver.local/hook", allowed) is None
    assert refusal("https://[::1]:8443/hook", allowed) is None
    assert refusal("http://localhost/hook", allowed) is not None  # another name of the same address is not listed
    assert refusal("http://127.0.0.1/hook", settings()) is not None


# -- the secrets ------------------------------------------------------------------------------------


def test_secrets_are_parsed_per_member() -> None:
    config = Config.from_env({"TASKPORT_CALLBACK_SECRETS": f" alice:{SECRET} , bob:{OTHER_SECRET}"})
    assert config.callback_keys == {"alice": SECRET, "bob": OTHER_SECRET}
    assert Config.from_env({}).callback_keys == {}


@pytest.mark.parametrize("entry, what", [
    (f"alice{SECRET}", "no member"),
    (f":{SECRET}", "no member"),
    ("alice:" + SECRET[len("whsec_"):], "does not start with whsec_"),
    ("alice:whsec_not*base64!", "not base64"),
    ("alice:whsec_" + base64.b64encode(b"short").decode(), "a key of 5 bytes"),
    (f"alice:{SECRET},alice:{OTHER_SECRET}", "a member named twice"),
])
def test_a_bad_secret_entry_stops_the_process_naming_the_variable_not_the_secret(entry: str, what: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_env({"TASKPORT_CALLBACK_SECRETS": entry})
    message = str(caught.value)
    assert message.startswith("TASKPORT_CALLBACK_SECRETS entries look like member:whsec_") and what in message
    assert "\n" not in message and SECRET[6:] not in message and OTHER_SECRET[6:] not in message
    assert "not*base64" not in message


def test_only_the_web_and_the_deliverer_hold_the_signing_secrets() -> None:
    config = Config.from_env({"TASKPORT_CALLBACK_SECRETS": f"alice:{SECRET}"})
    for role in ("web", "deliverer"):
        assert Config.from_env(config.child_environ(role)).callback_keys == {"alice": SECRET}
    for role in ("worker", "scheduler"):  # they run processors: what they do not hold, a processor cannot leak
        assert SECRET not in "".join(config.child_environ(role).values())
    # under `taskport up`: in the 0600 file the web and the deliverer read, not in what every program inherits
    assert web_only_environ(config)["TASKPORT_CALLBACK_SECRETS"] == f"alice:{SECRET}"
    assert "TASKPORT_CALLBACK_SECRETS" not in secret_free(config)


@pytest.mark.parametrize("name, value", [("TASKPORT_CALLBACK_TIMEOUT", "0"), ("TASKPORT_CALLBACK_MAX_AGE", "-1")])
def test_the_timeout_and_the_max_age_must_be_positive(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Config.from_env({name: value})


# -- the schedule and the signature -------------------------------------------------------------------


def test_retries_come_after_1_5_and_30_s_then_grow_to_an_hour_apart() -> None:
    delays = [retry_delay(n) for n in range(1, 12)]
    assert delays[:3] == [1, 5, 30]
    assert delays == sorted(delays) and max(delays) == 3600 and delays[-1] == delays[-2] == 3600


def test_a_delivery_is_given_up_once_the_next_attempt_would_pass_the_max_age() -> None:
    first, day = 1_000_000, 86_400
    at, attempts = first, 0
    while (later := next_attempt(first, at, attempts + 1, day)) is not None:
        at, attempts = later, attempts + 1
    assert at <= first + day * 1000 < at + 3_600_000  # the last attempt within the day, the next one past it
    assert 25 < attempts < 35  # 1 + 5 + 30 + 120 + 600 + 1800 s, then hourly for the rest of the day
    assert next_attempt(first, first, 1, 1) == first + 1000
    assert next_attempt(first, first + 1, 1, 1) is None


def test_the_signature_verifies_with_the_standardwebhooks_library_and_is_fresh_per_attempt() -> None:
    body = orjson.dumps({"task_id": "t", "status": "COMPLETED", "note": "ünïcode"})
    now = int(time.time())
    first = signed_headers(SECRET, "t:abc:3:COMPLETED", body, now)
    again = signed_headers(SECRET, "t:abc:3:COMPLETED", body, now + 7)
    assert first["webhook-id"] == again["webhook-id"] == "t:abc:3:COMPLETED"
    assert first["webhook-timestamp"] == str(now) and first["Content-Type"] == "application/json"
    assert first["webhook-signature"] != again["webhook-signature"]
    for headers in (first, again):
        assert Webhook(SECRET).verify(body, headers)["note"] == "ünïcode"
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER_SECRET).verify(body, first)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body.replace(b"COMPLETED", b"FAILED"), first)


def test_delivery_ids_parse_back() -> None:
    task_id = new_task_id()
    assert DeliveryId.parse(f"t:{task_id}:12:EXPIRED") == DeliveryId("t", task_id, 12, "EXPIRED")
    assert str(DeliveryId("b", task_id, 0, "DONE")) == f"b:{task_id}:0:DONE"
    for bad in ("", "x:1:2:DONE", f"t:{task_id}:x:FAILED", f"t:{task_id}:3:PENDING", "t::3:FAILED", "t:only"):
        assert DeliveryId.parse(bad) is None, bad


# -- claims under two schedulers --------------------------------------------------------------------


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


def test_two_claimers_never_claim_the_same_due_delivery(server: fakeredis.FakeServer) -> None:
    one, two = Deliveries(fakeredis.FakeRedis(server=server)), Deliveries(fakeredis.FakeRedis(server=server))
    due = {f"t:{new_task_id()}:1:FAILED": 1000 + n for n in range(5)}
    one.redis.zadd(keys.CALLBACKS_DUE, due)
    one.redis.zadd(keys.CALLBACKS_DUE, {f"t:{new_task_id()}:1:FAILED": 10**9})  # not due yet
    claimed, claim = one.claim(5000, 3)
    more, claim_two = two.claim(5000, 10)
    assert len(claimed) == 3 and len(more) == 2 and not set(claimed) & set(more)
    assert two.claim(5000, 10)[0] == [] and one.claim(5000, 10)[0] == []
    assert claim == claim_two == 5000 + callbacks.CLAIM_LEASE_MS
    # nobody took them: when the lease runs out they are due again, for one claimer
    later = claim + 1
    again, claim_again = two.claim(later, 10)
    assert sorted(again) == sorted(due) and one.claim(later, 10)[0] == []
    # only the latest claim can be taken, once
    first = again[0]
    assert not one.take(first, claim, later + 100)
    assert two.take(first, claim_again, later + 100)
    assert not one.take(first, claim_again, later + 100)
    assert one.redis.zscore(keys.CALLBACKS_DUE, first) == later + 100


def test_claims_made_at_the_same_moment_by_many_threads_split_the_due_set(server: fakeredis.FakeServer) -> None:
    Deliveries(fakeredis.FakeRedis(server=server)).redis.zadd(
        keys.CALLBACKS_DUE, {f"t:{new_task_id()}:1:CANCELLED": n for n in range(200)})
    claimers = [Deliveries(fakeredis.FakeRedis(server=server)) for _ in range(4)]
    got: list[list[str]] = [[] for _ in claimers]
    start = threading.Barrier(len(claimers))

    def claim_all(n: int) -> None:
        start.wait()
        while found := claimers[n].claim(10_000, 7)[0]:
            got[n] += found

    threads = [threading.Thread(target=claim_all, args=(n,)) for n in range(len(claimers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    every = [i for ids in got for i in ids]
    assert len(every) == len(set(every)) == 200


def test_the_tick_enqueues_one_job_per_due_delivery_on_the_callbacks_queue(server: fakeredis.FakeServer) -> None:
    conn = fakeredis.FakeRedis(server=server)
    ids = [f"t:{new_task_id()}:2:COMPLETED" for _ in range(3)]
    conn.zadd(keys.CALLBACKS_DUE, dict.fromkeys(ids, 1))
    dispatch = Dispatch(conn, settings())
    assert dispatch.round(now=5000) == 3 and Dispatch(conn, settings()).round(now=5000) == 0
    jobs = Queue(CALLBACK_QUEUE, connection=conn).get_jobs()
    assert sorted(j.args[0] for j in jobs) == sorted(ids)
    assert {j.func_name for j in jobs} == {DELIVER} and {j.args[1] for j in jobs} == {5000 + callbacks.CLAIM_LEASE_MS}
    assert all(j.timeout == callbacks.job_timeout(5.0) for j in jobs)


# -- whole attempts against a receiver on loopback ----------------------------------------------------


class Receiver:
    """An HTTP(S) server on 127.0.0.1 (or ``host``) answering each POST with the next of ``statuses`` (the last
    one repeats); it keeps every request (its headers, body and path, and when it came: ``times``, monotonic)
    and counts the connections it accepted."""

    def __init__(self, statuses: tuple[int, ...] = (200,), tls: ssl.SSLContext | None = None,
                 answer: Callable[[http.server.BaseHTTPRequestHandler], None] | None = None,
                 host: str = "127.0.0.1") -> None:
        self.statuses = list(statuses)
        self.got: list[tuple[dict[str, str], bytes, str]] = []
        self.times: list[float] = []
        self.connections = 0
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.got.append((dict(self.headers.items()), body, self.path))
                receiver.times.append(time.monotonic())
                if answer is not None:
                    answer(self)
                    return
                status = receiver.statuses.pop(0) if len(receiver.statuses) > 1 else receiver.statuses[0]
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", f"http://127.0.0.1:{receiver.port}/elsewhere")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def verify_request(self, request: Any, client_address: Any) -> bool:
                receiver.connections += 1
                return True

        self.server = Server((host, 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def url(self, path: str = "/hook", scheme: str = "http", host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver_factory() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(*statuses: int, **options: Any) -> Receiver:
        made.append(Receiver(statuses or (200,), **options))
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.fixture
def loopback_config(tmp_path: Path) -> Config:
    return Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, callback_secrets=f"public:{SECRET}",
                           callback_allow_hosts="127.0.0.1", callback_timeout=2.0)


def due_task(conn: Any, config: Config, url: str, member: str = "public") -> str:
    """A task with a callback for CANCELLED, cancelled: the transition script makes its delivery due (and its
    callback state pending). Returns the delivery's id. The callback fields are written here as a submit with a
    ``callback`` writes them."""
    store = TaskStore(conn, config)
    task_id = new_task_id()
    store.create(NewTask(task_id, member, "demo.sleep", {}, task_id, "default", 1))
    conn.hset(keys.task(task_id), mapping={TaskField.CALLBACK_URL: url, TaskField.CALLBACK_EVENTS: "CANCELLED"})
    assert store.cancel(task_id).done
    delivery_id = f"t:{task_id}:{int(conn.hget(keys.task(task_id), TaskField.SEQ))}:CANCELLED"
    assert conn.zscore(keys.CALLBACKS_DUE, delivery_id) is not None
    assert callback_fields(conn, task_id) == ("pending", 0, "")
    return delivery_id


def attempt(deliverer: Deliverer, at_ms: int | None = None) -> list[str | None]:
    """Claim what is due at ``at_ms`` (default now) and make each attempt; the states they left."""
    claimed, claim = deliverer.deliveries.claim(at_ms or int(time.time() * 1000), 100)
    return [deliverer.deliver(d, claim) for d in claimed]


def target_of(delivery_id: str) -> str:
    parsed = DeliveryId.parse(delivery_id)
    assert parsed is not None
    return parsed.target


def callback_fields(conn: Any, task_id: str) -> tuple[str, int, str]:
    h = conn.hmget(keys.task(task_id), TaskField.CALLBACK_STATE, TaskField.CALLBACK_ATTEMPTS,
                   TaskField.CALLBACK_LAST_STATUS)
    return h[0].decode(), int(h[1]), h[2].decode()


def test_a_delivery_retried_after_two_500s_sends_the_same_id_and_body_and_ends_delivered(
        conn: Any, loopback_config: Config, receiver_factory: Callable[..., Receiver]) -> None:
    receiver = receiver_factory(500, 500, 200)
    did = due_task(conn, loopback_config, receiver.url("/in?src=taskport"))
    task_id = target_of(did)
    watcher = conn.pubsub()
    watcher.subscribe(keys.events(task_id))
    deliverer = Deliverer(loopback_config, conn)
    seq = int(conn.hget(keys.task(task_id), TaskField.SEQ))

    assert attempt(deliverer) == [CallbackState.PENDING]
    assert callback_fields(conn, task_id) == ("pending", 1, "500")
    due_at = conn.zscore(keys.CALLBACKS_DUE, did)
    assert 0 < due_at - time.time() * 1000 <= 1000  # the first retry comes about 1 s later
    assert attempt(deliverer) == []  # not due yet
    assert attempt(deliverer, int(due_at)) == [CallbackState.PENDING]
    assert callback_fields(conn, task_id) == ("pending", 2, "500")
    due_at = conn.zscore(keys.CALLBACKS_DUE, did)
    assert 4000 < due_at - time.time() * 1000 <= 5000  # the second about 5 s later
    assert attempt(deliverer, int(due_at)) == [CallbackState.DELIVERED]

    assert callback_fields(conn, task_id) == ("delivered", 3, "200")
    assert not conn.exists(keys.delivery(did)) and conn.zscore(keys.CALLBACKS_DUE, did) is None
    assert int(conn.hget(keys.task(task_id), TaskField.SEQ)) == seq + 3  # an event per attempt for the watchers
    published = [m for m in iter(lambda: watcher.get_message(timeout=0.1), None) if m["type"] == "message"]
    assert [int(m["data"]) for m in published] == [seq + 1, seq + 2, seq + 3]
    bodies = {body for _, body, _ in receiver.got}
    assert len(receiver.got) == 3 and len(bodies) == 1
    assert {h["webhook-id"] for h, _, _ in receiver.got} == {did}
    assert {path for _, _, path in receiver.got} == {"/in?src=taskport"}
    for headers, body, _ in receiver.got:
        assert headers["Content-Type"] == "application/json" and headers["Host"] == f"127.0.0.1:{receiver.port}"
        document = Webhook(SECRET).verify(body, headers)
        assert document["task_id"] == task_id and document["status"] == "CANCELLED"
        assert document["links"]["self"] == f"/api/v1/tasks/{task_id}"


def test_a_redirect_is_a_failed_attempt_and_is_not_followed(
        conn: Any, loopback_config: Config, receiver_factory: Callable[..., Receiver]) -> None:
    receiver = receiver_factory(302)
    did = due_task(conn, loopback_config, receiver.url())
    assert attempt(Deliverer(loopback_config, conn)) == [CallbackState.PENDING]
    assert callback_fields(conn, target_of(did)) == ("pending", 1, "302")
    assert [path for _, _, path in receiver.got] == ["/hook"]


def test_a_host_that_resolves_to_a_private_address_at_delivery_is_refused_without_a_request(
        conn: Any, loopback_config: Config, resolver: dict[str, list[str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    resolver["hooks.example.com"] = [PUBLIC_V4]
    url = "https://hooks.example.com/hook"
    assert refusal(url, loopback_config) is None  # as at submit
    did = due_task(conn, loopback_config, url)
    resolver["hooks.example.com"] = ["10.0.0.7"]  # the name now points inside
    connects: list[Any] = []
    original = callback_http.post

    def never(*args: Any, **kwargs: Any) -> Any:
        connects.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(delivery, "post", never)
    assert attempt(Deliverer(loopback_config, conn)) == [CallbackState.FAILED]
    assert connects == []
    assert callback_fields(conn, target_of(did)) == ("failed", 0, "")
    assert conn.zscore(keys.CALLBACKS_DUE, did) is None and not conn.exists(keys.delivery(did))


def test_a_member_without_a_secret_gets_no_delivery(conn: Any, loopback_config: Config,
                                                    receiver_factory: Callable[..., Receiver]) -> None:
    receiver = receiver_factory(200)
    did = due_task(conn, loopback_config, receiver.url(), member="mallory")
    assert attempt(Deliverer(loopback_config, conn)) == [CallbackState.FAILED]
    assert receiver.connections == 0
    assert callback_fields(conn, target_of(did))[0] == "failed"


def test_past_the_max_age_a_failing_delivery_is_given_up(conn: Any, tmp_path: Path,
                                                        receiver_factory: Callable[..., Receiver]) -> None:
    config = Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, callback_secrets=f"public:{SECRET}",
                             callback_allow_hosts="127.0.0.1", callback_max_age=1)
    receiver = receiver_factory(503)
    did = due_task(conn, config, receiver.url())
    assert attempt(Deliverer(config, conn)) == [CallbackState.FAILED]  # the next retry would fall past 1 s
    assert callback_fields(conn, target_of(did)) == ("failed", 1, "503")
    assert not conn.exists(keys.delivery(did)) and conn.zcard(keys.CALLBACKS_DUE) == 0


def test_a_delivery_whose_task_is_gone_is_dropped(conn: Any, loopback_config: Config) -> None:
    did = f"t:{new_task_id()}:4:FAILED"
    conn.zadd(keys.CALLBACKS_DUE, {did: 0, "nonsense": 0})
    assert attempt(Deliverer(loopback_config, conn)) == [None, None]
    assert conn.zcard(keys.CALLBACKS_DUE) == 0


def test_a_batch_delivery_sends_the_batch_document(conn: Any, loopback_config: Config,
                                                   receiver_factory: Callable[..., Receiver],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    batch_id = new_task_id()
    document = {"batch_id": batch_id, "status": "DONE", "size": 2}
    monkeypatch.setattr(delivery, "read_document", lambda conn_, bid, now: document if bid == batch_id else None)
    receiver = receiver_factory(200)
    conn.hset(keys.batch(batch_id), mapping={BatchField.MEMBER: "public", BatchField.CALLBACK_URL: receiver.url(),
                                             BatchField.SEQ: 7, BatchField.CALLBACK_STATE: "pending"})
    did = f"b:{batch_id}:0:DONE"
    conn.zadd(keys.CALLBACKS_DUE, {did: 0})
    assert attempt(Deliverer(loopback_config, conn)) == [CallbackState.DELIVERED]
    [(headers, body, _)] = receiver.got
    assert Webhook(SECRET).verify(body, headers) == document and headers["webhook-id"] == did
    h = conn.hgetall(keys.batch(batch_id))
    assert (h[b"callback_state"], h[b"callback_attempts"], h[b"callback_last_status"], h[b"seq"]) == \
        (b"delivered", b"1", b"200", b"8")


def test_an_answer_is_read_up_to_the_cap_and_a_slow_one_times_out(receiver_factory: Callable[..., Receiver]) -> None:
    def huge(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(204)
        handler.end_headers()
        try:
            for _ in range(1000):  # 64 MiB if anyone read it all
                handler.wfile.write(b"x" * 65536)
        except OSError:
            pass  # the client closed after the cap, as it should

    def slow(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(40):  # a header line a byte at a time, 0.1 s apart: 4 s, well past the timeout
            try:
                handler.wfile.write(b"X")
                handler.wfile.flush()
            except OSError:
                return
            time.sleep(0.1)

    for answer, expected in ((huge, 204), (slow, None)):
        receiver = receiver_factory(answer=answer)
        target = Target("http", "127.0.0.1", receiver.port, "/", ("127.0.0.1",))
        started = time.monotonic()
        got = post(target, b"{}", {}, timeout=1.0)
        took = time.monotonic() - started
        assert got.status == expected and took < 2.5, (got, took)
        assert (got.error == "timed out") == (expected is None)


def test_nothing_listening_is_a_failed_attempt_with_a_reason() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, never listening: connections are refused
        got = post(Target("http", "127.0.0.1", port, "/", ("127.0.0.1",)), b"{}", {}, timeout=1.0)
    assert got.status is None and "Connection" in got.error and not got.delivered


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=hooks.example.com", "-addext", "subjectAltName=DNS:hooks.example.com", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def test_tls_is_verified_against_the_urls_host_while_the_connection_goes_to_the_pinned_address(
        certificate: tuple[Path, Path], receiver_factory: Callable[..., Receiver]) -> None:
    cert, key = certificate
    serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    serving.load_cert_chain(cert, key)
    receiver = receiver_factory(200, tls=serving)
    trusting = ssl.create_default_context(cafile=str(cert))

    def to(host: str, context: ssl.SSLContext | None) -> Any:
        return post(Target("https", host, receiver.port, "/hook", ("127.0.0.1",)), b"{}", {}, 2.0, context)

    assert to("hooks.example.com", trusting).status == 200  # the pinned address, the URL's name checked
    wrong_name = to("other.example.com", trusting)
    assert wrong_name.status is None and "certificate" in wrong_name.error
    untrusted = to("hooks.example.com", None)  # the system's trust store does not know this certificate
    assert untrusted.status is None and "certificate" in untrusted.error
    assert len(receiver.got) == 1 and receiver.got[0][0]["Host"] == f"hooks.example.com:{receiver.port}"


# -- the submit's schema ----------------------------------------------------------------------------


def test_the_callback_schema_defaults_to_every_terminal_event_and_refuses_unknown_fields() -> None:
    schema = CallbackSchema()
    assert schema.load({"url": "https://x.example"}) == {"url": "https://x.example",
                                                         "events": ["COMPLETED", "FAILED", "CANCELLED", "EXPIRED"]}
    assert schema.load({"url": "https://x.example", "events": ["FAILED", "FAILED"]})["events"] == ["FAILED"]
    for body, field in (({}, "url"), ({"url": ""}, "url"), ({"url": "https://x/" + "a" * 2048}, "url"),
                        ({"url": "https://x", "events": []}, "events"),
                        ({"url": "https://x", "events": ["PENDING"]}, "events"),
                        ({"url": "https://x", "secret": "s"}, "secret"), ({"url": 5}, "url")):
        with pytest.raises(ValidationError) as caught:
            schema.load(body)
        assert field in caught.value.messages, (body, caught.value.messages)


def test_check_callback_names_the_url_for_a_refused_address_or_a_member_without_a_secret(
        resolver: dict[str, list[str]]) -> None:
    resolver["hooks.example.com"] = [PUBLIC_V4]
    resolver["intranet.example.com"] = ["192.168.0.10"]
    config = settings()
    assert check_callback({"url": "https://hooks.example.com/x", "events": ["FAILED"]}, "public", config) == {}
    private = check_callback({"url": "https://intranet.example.com/x", "events": ["FAILED"]}, "public", config)
    assert list(private) == ["url"] and "non-public" in private["url"][0]
    unsigned = check_callback({"url": "https://hooks.example.com/x", "events": ["FAILED"]}, "alice", config)
    assert list(unsigned) == ["url"] and "TASKPORT_CALLBACK_SECRETS" in unsigned["url"][0]
    assert SECRET not in unsigned["url"][0]


# -- the deliverer process ----------------------------------------------------------------------------


def test_the_deliverer_is_a_role_of_the_cli_and_of_taskport_up_with_the_webs_settings_file(tmp_path: Path) -> None:
    assert build_parser().parse_args(["deliverer", "--name", "d1"]).name == "d1"
    found = {p.name: p for p in programs(Config.from_env({}, data_dir=tmp_path), None, tmp_path)}
    command = found["deliverer"].command
    assert command[-2:] == ["app.launch.cli", "deliverer"] and WEB_ENV_FLAG in command
    assert WEB_ENV_FLAG not in found["worker"].command and WEB_ENV_FLAG not in found["scheduler"].command
    procfile = (Path(__file__).resolve().parents[2] / "Procfile").read_text().splitlines()
    assert "deliverer: python -m app.launch.cli deliverer" in procfile


@pytest.mark.parametrize("level, rq_level", [("INFO", "WARNING"), ("DEBUG", "DEBUG"), ("ERROR", "ERROR")])
def test_rqs_per_job_lines_are_quiet_in_the_deliverer_unless_debugging(level: str, rq_level: str) -> None:
    assert rq_log_level(Config.from_env({"TASKPORT_LOG_LEVEL": level})) == rq_level


def test_an_unparsable_url_is_refused_not_raised() -> None:
    with pytest.raises(Refused):
        resolve("https://[::1/x", settings())


def test_the_receiver_in_the_docs_verifies_a_real_delivery_and_handles_it_once(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    import runpy

    page = (Path(__file__).resolve().parents[2] / "docs" / "clients.md").read_text()
    section = page[page.index("\n## Callbacks\n"):]
    source = section[section.index("```python\n") + len("```python\n"):].split("\n```", 1)[0]
    monkeypatch.setenv("TASKPORT_WEBHOOK_SECRET", SECRET)
    (tmp_path / "receiver.py").write_text(source)
    receiver = runpy.run_path(str(tmp_path / "receiver.py"), run_name="receiver")
    client = receiver["app"].test_client()
    body = orjson.dumps({"task_id": "abc", "status": "COMPLETED"})
    headers = signed_headers(SECRET, "t:abc:3:COMPLETED", body, int(time.time()))
    for _ in range(2):  # the same delivery twice (at least once): handled once
        assert client.post("/hooks/taskport", data=body, headers=headers).status_code == 204
    assert capsys.readouterr().out == "task abc is COMPLETED\n"
    forged = signed_headers(OTHER_SECRET, "t:abc:4:COMPLETED", body, int(time.time()))
    assert client.post("/hooks/taskport", data=body, headers=forged).status_code == 400
    stale = signed_headers(SECRET, "t:abc:5:COMPLETED", body, int(time.time()) - 600)
    assert client.post("/hooks/taskport", data=body, headers=stale).status_code == 400

