"""REDIS_SENTINELS against a real group (tests/integration/sentinels.py: a primary, two replicas, three
Sentinels on loopback): clients that follow a kill -9 of the primary (commands, pub/sub, a blocking pop),
``min-replicas-to-write`` and TASKPORT_REPLICA_ACK with the replicas stopped, the whole stack through a
failover, and the CLI.

One group serves the module; ``group`` heals it before each test (a killed node back as a replica, the
paused continued), so every test starts from a primary with two replicas in sync. Timings are printed
(``pytest -s``): the promotion, and how long a client took to follow it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from app.core import connection, keys, sentinel
from app.core.answers import NewTask
from app.core.config import Config, without_settings
from app.core.connection import NoReplicaError, connect
from app.core.store import TaskStore
from tests.integration.harness import REPO_ROOT, TASKS, Api, Proc, Stack, launch, wait_until
from tests.integration.sentinels import HOST, MIN_REPLICAS_MAX_LAG, PROMOTION_TIMEOUT, SentinelGroup, sentinel_group

pytestmark = pytest.mark.faults  # processes killed, signalled or failing: make test-faults

REQUEST_BOUND = 3.0  # seconds: the longest a request may take while there is no primary (then 503)


@pytest.fixture(scope="module")
def the_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    with sentinel_group(tmp_path_factory.mktemp("sentinels")) as group:
        yield group


@pytest.fixture
def group(the_group: SentinelGroup) -> SentinelGroup:
    the_group.heal()
    return the_group


def config_of(group: SentinelGroup, **overrides: Any) -> Config:
    return Config.from_env({}, **group.settings(), **overrides)


def new_task() -> NewTask:
    task_id = str(uuid.uuid4())
    return NewTask(task_id=task_id, member="public", type="demo.sleep", payload={"seconds": 0},
                   dedup_digest=task_id, priority="default", max_attempts=1)


def cli(group: SentinelGroup, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.launch.cli", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=30, env={**without_settings(os.environ), **group.env(), **env})


# -- the CLI --------------------------------------------------------------------------------------


def test_a_spawn_worker_is_refused_at_start_with_one_line(group: SentinelGroup) -> None:
    done = cli(group, "worker", TASKPORT_WORKER_CLASS="spawn")
    assert done.returncode == 2, done
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "TASKPORT_WORKER_CLASS=spawn" in done.stderr and "rq/rq#2281" in done.stderr


def test_taskport_audit_reads_through_the_sentinels(group: SentinelGroup) -> None:
    config = config_of(group)
    with closing(connect(config)) as conn:
        new = new_task()
        TaskStore(conn, config).create(new)
    done = cli(group, "audit", "--task", new.task_id)
    assert done.returncode == 0, done
    assert new.task_id in done.stdout and "-> PENDING" in done.stdout


# -- without replicas -------------------------------------------------------------------------------


def test_a_primary_without_replicas_refuses_writes_at_once(group: SentinelGroup) -> None:
    """``min-replicas-to-write 1``: once no replica acked for ``min-replicas-max-lag`` s the primary answers
    NOREPLICAS, which a web client raises as NoReplicaError (a 503) at once, a script's write included;
    reads go on; with the replicas back, writes do too."""
    config = config_of(group)
    store = TaskStore(connect(config), config)
    with closing(store.redis) as conn, group.paused(*(r.port for r in group.replicas())) as paused_at:
        wait_until(lambda: group.good_replicas() == 0, timeout=MIN_REPLICAS_MAX_LAG + 5,
                   message="the primary to count no good replica")
        refused_after = time.monotonic() - paused_at
        started = time.monotonic()
        with pytest.raises(NoReplicaError, match="replicas"):
            conn.set("sentinel:write", "1")
        with pytest.raises(NoReplicaError):
            store.create(new_task())
        assert time.monotonic() - started < 1.5  # two refusals and their retries: no hang
        assert conn.get("sentinel:write") is None  # a read is still served
    print(f"\nthe primary refused writes {refused_after:.1f} s after its replicas stopped")
    wait_until(lambda: group.good_replicas() == 2, timeout=10, message="the replicas acking again")
    with closing(connect(config)) as conn:
        assert conn.set("sentinel:write", "1")


def test_replica_ack_confirms_a_write_only_once_a_replica_has_it(group: SentinelGroup) -> None:
    """TASKPORT_REPLICA_ACK: with the replicas stopped (and before min-replicas-max-lag, so the primary
    still takes the write) the submit's WAIT gives up after half the socket timeout: NoReplicaError. With
    them running the submit returns, and a replica already has the task when it does."""
    config = config_of(group, replica_ack=True, redis_timeout=1.0)
    store = TaskStore(connect(config), config)
    store.create(new_task())  # the script loaded, so the timed submit below is one round trip
    with closing(store.redis), group.paused(*(r.port for r in group.replicas())):
        started = time.monotonic()
        with pytest.raises(NoReplicaError, match="reached 0 replicas"):
            store.create(new_task())
        waited = time.monotonic() - started
    assert 0.45 <= waited < 1.5, waited  # WAIT's timeout: 500 ms
    print(f"\nan unconfirmed submit answered after {waited:.2f} s")
    with closing(connect(config)) as conn:
        new = new_task()
        assert TaskStore(conn, config).create(new).created
        on_replicas = [r.ask("HGET", keys.task(new.task_id), "status") for r in group.replicas()]
        assert "PENDING" in on_replicas, on_replicas


def test_an_idle_connection_leaves_a_deposed_primary(group: SentinelGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pooled connection that sat idle through a failover is dropped once the Sentinels name another primary,
    not used on the old one: the next command goes to the promoted replica at once, while the old primary
    (paused here) still holds the connection open, as a healed partition's would. There it would wait out the
    socket timeout, or, once the old primary answers again before its demotion, read what it had (a batch's then
    task summarized nothing in the soak on the bed). ``ASK_EVERY`` (1 s) is 0 here: every checkout asks."""
    monkeypatch.setattr(sentinel, "ASK_EVERY", 0.0)
    config = config_of(group, redis_timeout=5.0)
    old = group.primary_port()
    with closing(connect(config)) as client:
        client.set("sentinel:idle", "before")  # the pool's one connection, to the old primary
        with group.paused(old):
            new = group.wait_promoted(old)
            started = time.monotonic()
            client.set("sentinel:idle", "after")
            took = time.monotonic() - started
            port = client.config_get("port")["port"]
    print(f"\nthe first command after the promotion took {took:.2f} s")
    assert port == str(new) and took < 1.0, (port, new, took)


# -- following a failover -------------------------------------------------------------------------


class Loop:
    """``step`` called over and over in a thread until ``stop``, like a worker's loop; truthy answers are
    kept in ``got``, an exception ends the loop and is kept in ``errors``."""

    def __init__(self, step: Callable[[], Any]) -> None:
        self.step = step
        self.got: list[Any] = []
        self.errors: list[BaseException] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                value = self.step()
            except Exception as exc:  # kept for the test to show
                self.errors.append(exc)
                return
            if value:
                self.got.append(value)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(5)


# redis-py's own Sentinel client, in a process of its own (so it can be killed while it retries), under
# taskport's ride-out policy, each dial printed with the clock: a worker-like loop of BLPOPs.
STOCK_CLIENT = """
import sys, time
import redis.connection
from redis.sentinel import Sentinel
from app.core.config import Config
from app.core.connection import retry_policy

dial = redis.connection.Connection._connect
def spy(self):
    print(f"dial {self.port} {time.monotonic()}", flush=True)
    return dial(self)
redis.connection.Connection._connect = spy
config = Config.from_env()
t = config.redis_timeout
client = Sentinel(config.sentinel_addresses, sentinel_kwargs={"socket_timeout": 0.5}).master_for(
    config.redis_sentinel_master, retry=retry_policy(config, ride_out=True), socket_timeout=t,
    socket_connect_timeout=t)
client.ping()
print("ready", flush=True)
while not client.blpop(sys.argv[1], timeout=1):
    pass
print("popped", flush=True)
"""


def stock_client(group: SentinelGroup, key: str, logdir: Path) -> Proc:
    env = {**without_settings(os.environ), **group.env(), "PYTHONUNBUFFERED": "1"}
    proc = launch("stock-client", [sys.executable, "-c", STOCK_CLIENT, key], env, logdir / "stock-client.log")
    wait_until(lambda: "ready" in proc.log() or not proc.alive, timeout=15, message="the stock client")
    assert proc.alive, proc.describe()
    return proc


def dials(proc: Proc, port: int, after: float) -> int:
    """How many times ``proc`` dialed ``port`` after the monotonic time ``after``."""
    lines = [line.split() for line in proc.log().splitlines() if line.startswith("dial ")]
    return sum(1 for _, p, at in lines if int(p) == port and float(at) > after)


def blocked_clients(group: SentinelGroup) -> int:
    return int(group.node(group.primary_port()).ask("INFO", "clients")["blocked_clients"])


def test_clients_follow_a_kill_of_the_primary(group: SentinelGroup, tmp_path: Path) -> None:
    """A riding-out client's next command, a subscribed PubSub and a worker-like BLPOP loop, all opened
    before the primary is killed, end up on the promoted replica by themselves; redis-py's own
    ``Sentinel.master_for`` client, under the same policy, keeps dialing the dead address instead (its
    reconnect inside a command goes send_packed_command -> connect_check_health, to the cached address)."""
    connection.ride_out_outages()
    config = config_of(group)
    client, popper = connect(config), connect(config)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("sentinel:channel")
    listening = Loop(lambda: pubsub.get_message(timeout=0.2))
    popping = Loop(lambda: popper.blpop("sentinel:ours", timeout=1))
    stock = stock_client(group, "sentinel:stock", tmp_path)
    old = group.primary_port()
    try:
        wait_until(lambda: blocked_clients(group) == 2 and group.node(old).ask(
            "PUBSUB", "NUMSUB", "sentinel:channel")[1] == 1, message="the pop loops blocked, the PubSub subscribed")
        killed_at = time.monotonic()
        group.kill(old)
        client.set("sentinel:after", "1")  # rides the gap out
        followed = time.monotonic() - killed_at
        new = group.wait_promoted(old)
        promoted_at = time.monotonic()
        print(f"\nthe next command succeeded {followed:.2f} s after the kill, on :{new}")
        assert followed < PROMOTION_TIMEOUT
        assert client.config_get("port")["port"] == str(new)
        client.rpush("sentinel:ours", "item")
        client.rpush("sentinel:stock", "item")
        wait_until(lambda: popping.got or popping.errors, timeout=10, message="our pop loop's item")
        assert popping.got == [(b"sentinel:ours", b"item")], popping.errors
        wait_until(lambda: client.publish("sentinel:channel", "after") and listening.got, timeout=10,
                   message=lambda: f"the message, on the re-subscribed PubSub ({listening.errors})")
        assert listening.got[0]["data"] == b"after" and pubsub.connection.port == new  # type: ignore[union-attr]
        assert group.node(new).ask("PUBSUB", "NUMSUB", "sentinel:channel")[1] == 1  # subscribed there again
        print(f"pop loop and PubSub followed within {time.monotonic() - killed_at:.2f} s of the kill")
        wait_until(lambda: dials(stock, old, promoted_at) >= 2, timeout=10, message=stock.describe)
        assert dials(stock, new, killed_at) == 0 and "popped" not in stock.log(), stock.describe()
        assert client.llen("sentinel:stock") == 1  # redis-py's own client never came for its item
    finally:
        stock.reap()
        listening.stop()
        popping.stop()
        pubsub.close()
        client.close()
        popper.close()


@contextmanager
def black_hole() -> Iterator[int]:
    """A loopback port that takes no connection: its one-place backlog is held full, so a connect times out
    there as it does to a host cut off the network."""
    with socket.create_server((HOST, 0), backlog=0) as server:
        port = server.getsockname()[1]
        with socket.create_connection((HOST, port)):
            yield port


class Named:
    """Stands in for the Sentinels: names ``answers`` in turn, the last one from then on."""

    def __init__(self, *answers: tuple[str, int]) -> None:
        self.answers = list(answers)

    def discover_master(self, service_name: str) -> tuple[str, int]:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_a_reconnect_that_times_out_asks_the_sentinels_again(
        group: SentinelGroup, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dropped connection reconnects inside the command's retry (send_packed_command ->
    connect_check_health): when the address the Sentinels named does not answer (a primary cut off, or
    just failed over), the next try asks them again rather than dialing that address again."""
    primary = group.primary_port()
    named = Named((HOST, primary))
    monkeypatch.setattr(sentinel, "sentinels", lambda config, timeout: named)
    dialed: list[int] = []
    dial = sentinel.FollowingConnection._connect

    def spy(self: sentinel.FollowingConnection) -> Any:
        dialed.append(self.port)
        return dial(self)

    monkeypatch.setattr(sentinel.FollowingConnection, "_connect", spy)
    with black_hole() as hole, closing(connect(config_of(group, redis_timeout=0.3, redis_ride_out=5),
                                               ride_out=True)) as client:
        client.ping()
        named.answers = [(HOST, hole), (HOST, primary)]  # the next ask names a dead address, then the live one
        group.node(primary).ask("CLIENT", "KILL", "ID", client.client_id())
        started = time.monotonic()
        assert client.ping()
        took = time.monotonic() - started
    assert dialed.count(hole) == 1, dialed
    assert took < 2.0, took


# -- the stack --------------------------------------------------------------------------------------


def gap_answer(api: Api, task_id: str, seen: list[tuple[int, float]]) -> bool:
    """One status read: True once it is 200; a 503 must be a quick problem with Retry-After."""
    started = time.monotonic()
    r = api.get(f"{TASKS}/{task_id}", timeout=REQUEST_BOUND + 5)
    seen.append((r.status_code, time.monotonic() - started))
    assert r.status_code in (200, 503), (r.status_code, r.text)
    if r.status_code == 503:
        assert r.headers["Retry-After"] and r.headers["Content-Type"] == "application/problem+json", r.headers
    return r.status_code == 200


def submit_after_gap(api: Api, seen: list[int]) -> str | None:
    """A submit (not the first one's payload, which dedup would answer): its id once it is accepted (202);
    a 503 (no primary, or one with no replica yet) is retried."""
    r = api.submit("demo.sleep", {"seconds": 0.2, "steps": 2})
    seen.append(r.status_code)
    assert r.status_code in (202, 503), (r.status_code, r.text)
    return str(r.json()["task_id"]) if r.status_code == 202 else None


def test_the_stack_rides_out_a_kill_of_the_primary(group: SentinelGroup, tmp_path: Path) -> None:
    """web, worker and scheduler on the Sentinel settings alone: a task completes; with the primary killed
    the API answers 503 + Retry-After quickly until the promotion, then 202, and the same worker process
    runs the next task; /rq shows the Sentinels."""
    stack = Stack(None, tmp_path / "stack", **group.settings(), dashboard_password="s3cret")
    try:
        stack.start_web()
        worker = stack.start_worker()[0]
        scheduler = stack.start_scheduler()
        with Api(stack.base_url) as api:
            first = api.create("demo.sleep", {"seconds": 0.1, "steps": 2})
            api.wait_for(first, "COMPLETED", timeout=20)
            old = group.primary_port()
            killed_at = time.monotonic()
            group.kill(old)
            reads: list[tuple[int, float]] = []
            wait_until(lambda: gap_answer(api, first, reads), timeout=PROMOTION_TIMEOUT + 5, interval=0.1,
                       message=lambda: f"a 200 after the failover; answers {reads}")
            submits: list[int] = []
            second = wait_until(lambda: submit_after_gap(api, submits), timeout=10, interval=0.1,
                                message=lambda: f"a 202 after the failover; answers {submits}")
            accepted = time.monotonic() - killed_at
            assert 503 in [status for status, _ in reads], reads
            assert max(took for _, took in reads) < REQUEST_BOUND, reads
            api.wait_for(second, "COMPLETED", timeout=20)
            print(f"\nreads answered 503 for {sum(1 for s, _ in reads if s == 503)} tries, the slowest in "
                  f"{max(t for _, t in reads):.2f} s; a submit was accepted {accepted:.2f} s after the kill, "
                  f"its task done {time.monotonic() - killed_at:.2f} s after the kill")
            assert worker.alive and scheduler.alive, stack.log_tails()
            page = api.get("/rq", auth=("admin", "s3cret"))  # redirected to /rq/
            assert page.status_code == 200
            assert f"redis+sentinel://{group.addresses()}/" in page.text
    except requests.RequestException as exc:
        raise AssertionError(f"{exc}\n{stack.log_tails()}") from exc
    finally:
        stack.teardown()
