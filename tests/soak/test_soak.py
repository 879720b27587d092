"""The fault soak (issue 29, part 6): `taskport up` under steady load while a seeded nemesis breaks it, then
a checker that reads back everything acknowledged. ``make test-soak`` runs it (CI after make test-slow).

- **The stack.** A valkey-server of the test's own (AOF fsync always: an acknowledged write survives a kill -9
  of Redis), a ``ReplyProxy`` in front of it that can lose or hold replies, and ``taskport up`` with
  ``REDIS_URL`` pointing at the proxy: web, three workers, scheduler, deliverer under supervisor. Short
  heartbeat, stall and housekeeping intervals, so a frozen or killed run is recovered within the soak.
- **The load** (tests/soak/load.py): itemized tasks, orders.split, CSV exports, batches with a ``then`` task
  and callbacks to a receiver on loopback, and a once-a-minute schedule of exports.
- **The nemesis** (tests/soak/nemesis.py): a fault every 4-10 s, picked from the seed.
- **The checker** (tests/soak/checker.py): once the stack is healed and quiet (every acknowledged task ended
  and every callback delivered, or ``TASKPORT_SOAK_DRAIN`` s passed), every check; the figures and the seed
  are printed, and the test fails with each broken check's listing.

``TASKPORT_SOAK_SECONDS`` (default 600) is how long the faults go on; ``TASKPORT_SOAK_SEED`` replays a run's
faults and load (the seed is printed first); ``TASKPORT_SOAK_INTERVAL`` is the mean gap between two ops of
the load (default 2 s). The one-hour run by hand: ``TASKPORT_SOAK_SECONDS=3600 make test-soak``.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import pytest
import redis
import requests

from app.core import keys
from app.core.process import free_port
from tests.integration.harness import REPO_ROOT, RedisServer, Up, task_workers, wait_until
from tests.soak.checker import MEMBER, Checker, judge_schedule, schedule_tasks
from tests.soak.load import Acked, Load
from tests.soak.nemesis import Nemesis
from tests.soak.redisproxy import ReplyProxy
from tests.unit.test_callbacks import SECRET, Receiver

SECONDS = float(os.environ.get("TASKPORT_SOAK_SECONDS", "600"))
DRAIN = float(os.environ.get("TASKPORT_SOAK_DRAIN", "60"))  # seconds the stack gets to finish after the faults
# the faults' time, the drain, and the stack's starts and the checks (~4 min at most)
pytestmark = [pytest.mark.soak, pytest.mark.timeout(SECONDS + DRAIN + 240)]
INTERVAL = float(os.environ.get("TASKPORT_SOAK_INTERVAL", "2"))
STALL_TIMEOUT = 3.0
SCHEDULE: dict[str, Any] = {"cron": "* * * * *", "name": "soak",
            "task": {"type": "orders.export", "payload": {"rows": 777, "format": "csv"}}}
ENV = {
    "TASKPORT_WORKERS": "3",
    "TASKPORT_HEARTBEAT_INTERVAL": "0.3",
    "TASKPORT_STALL_TIMEOUT": str(STALL_TIMEOUT),
    "TASKPORT_HOUSEKEEPING_INTERVAL": "1",
    "TASKPORT_SCHEDULER_INTERVAL": "0.5",
    "TASKPORT_STOP_GRACE": "3",
    "TASKPORT_RETRY_BACKOFF": "1",
    "TASKPORT_DEDUP_WINDOW": "7200",  # the schedule's fire times stay readable by their dedup keys
    "TASKPORT_CALLBACK_SECRETS": f"public:{SECRET}",
    "TASKPORT_CALLBACK_ALLOW_HOSTS": "127.0.0.1",
}


class Stack:
    """``taskport up`` on the proxy, with the same port and data dir across its Ctrl-C and restart."""

    def __init__(self, workdir: Path, redis_url: str, redis_server: RedisServer) -> None:
        self.workdir = workdir
        self.server = redis_server
        self.port = free_port()
        self.env = {**ENV, "REDIS_URL": redis_url, "PORT": str(self.port), "TASKPORT_DATA_DIR": str(workdir / "var")}
        self.runs: list[Up] = []
        self.restart_took: list[float] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def up(self) -> Up:
        return self.runs[-1]

    def start(self) -> Up:
        run = self.workdir / f"up-{len(self.runs) + 1}"
        run.mkdir()
        up = Up(run, **self.env)
        up.data_dir = self.workdir / "var"
        self.runs.append(up)
        up.wait_for("taskport is up: http://127.0.0.1:", timeout=90)
        conn = self.server.client()
        wait_until(lambda: len(task_workers(conn)) >= 3, timeout=60, ignore=(redis.RedisError,),
                   message=lambda: f"the workers to register\n{up.tail()}")
        conn.close()
        return up

    def ctrl_c_and_up_again(self) -> None:
        """SIGINT to the group, as a terminal's Ctrl-C, then `taskport up` again on the same data."""
        began = time.monotonic()
        os.killpg(self.up.popen.pid, signal.SIGINT)
        try:
            self.up.popen.wait(timeout=60)
        except Exception:  # noqa: BLE001 - a stack that does not stop is a finding; the soak goes on
            print(f"soak: Ctrl-C did not stop the stack within 60 s:\n{self.up.tail()}", flush=True)
            self.up.kill_everything()
        self.restart_took.append(time.monotonic() - began)
        self.start()

    def kill_everything(self) -> None:
        for up in self.runs:
            up.kill_everything()


@pytest.fixture
def soak_env() -> Iterator[tuple[Stack, ReplyProxy, RedisServer, Receiver, int]]:
    seed = int(os.environ.get("TASKPORT_SOAK_SEED") or random.SystemRandom().randrange(2**32))
    # not pytest's tmp_path, which other runs rotate away: a failed soak's logs and Redis files are read afterwards
    tmp_path = REPO_ROOT / "build" / "soak" / f"{time.strftime('%Y%m%dT%H%M%S')}-seed-{seed}"
    tmp_path.mkdir(parents=True)
    print(f"\nsoak: seed {seed} (TASKPORT_SOAK_SEED={seed} replays it), {SECONDS:.0f} s of faults, "
          f"logs and Redis files in {tmp_path}", flush=True)
    server = RedisServer(tmp_path / "redis", fsync="always").start()
    proxy = ReplyProxy(str(server.socket), seed)
    receiver = Receiver((200,))
    stack = Stack(tmp_path, proxy.url, server)
    try:
        yield stack, proxy, server, receiver, seed
    finally:
        stack.kill_everything()
        proxy.close()
        receiver.close()
        server.close()


def call(method: str, url: str, **kwargs: Any) -> requests.Response:
    """One HTTP call the harness itself needs (the schedule, the drain), sent until the web answers it."""
    def send() -> requests.Response | None:
        answer = requests.request(method, url, timeout=10, **kwargs)
        return answer if answer.status_code < 500 else None

    return wait_until(send, timeout=60, interval=0.5, ignore=(requests.RequestException,),
                      message=f"{method} {url} to be answered")


def test_soak(soak_env: tuple[Stack, ReplyProxy, RedisServer, Receiver, int]) -> None:
    stack, proxy, server, receiver, seed = soak_env
    began = time.monotonic()
    to_wall = time.time() - began  # monotonic -> epoch seconds
    stack.start()
    made = call("POST", stack.base_url + "/api/v1/schedules", json=SCHEDULE)
    assert made.status_code == 201, made.text
    schedule = made.json()
    load = Load(stack.base_url, receiver.url("/hooks"), seed, INTERVAL)
    nemesis = Nemesis(random.Random(seed), server, proxy, lambda: stack.up, stack.ctrl_c_and_up_again,
                      STALL_TIMEOUT)
    paused_at = under_faults(load, nemesis, SECONDS)
    call("PATCH", f"{stack.base_url}/api/v1/schedules/{schedule['schedule_id']}", json={"paused": True})
    faults_took = paused_at - began

    conn = server.client()
    checker = Checker(stack.base_url, conn, load.ledger, receiver)
    first_ms = schedule_first_fire(schedule)
    fire_times = list(range(first_ms, int((paused_at + to_wall) * 1000) + 1, 60_000))
    outages = [*nemesis.scheduler_down, (paused_at - 3, paused_at)]
    drained, fired, created, results = check(conn, checker, schedule["schedule_id"], fire_times, outages, to_wall,
                                             DRAIN)
    faults = Counter(event.kind for event in nemesis.events)
    print(f"\nsoak: seed {seed}: {faults_took:.0f} s of faults, drained in {drained:.0f} s, "
          f"{len(nemesis.events)} faults {dict(faults)}")
    print(f"soak: proxy dropped {proxy.dropped} and held {proxy.delayed} replies; Ctrl-C + up again took "
          f"{[round(t, 1) for t in stack.restart_took]} s")
    figures(load, checker, len(fire_times), fired, created)
    verdict(results, f"soak seed {seed} (TASKPORT_SOAK_SEED={seed} replays it)")


class Faults(Protocol):
    """A nemesis: tests/soak/nemesis.py's, or the bed's (tests/scale/nemesis.py)."""

    def run(self, seconds: float) -> None: ...
    def stop(self) -> None: ...
    def heal(self) -> None: ...


def under_faults(load: Load, nemesis: Faults, seconds: float) -> float:
    """The load on while the nemesis breaks things for ``seconds``, then every fault undone and the load
    stopped; returns when (monotonic)."""
    load.start()
    try:
        nemesis.run(seconds)
    finally:
        nemesis.stop()
        nemesis.heal()
    load.stop()
    return time.monotonic()


def check(conn: redis.Redis, checker: Checker, schedule_id: str, fire_times: list[int],
          outages: list[tuple[float, float]], to_wall: float, seconds: float, member: str = MEMBER,
          ) -> tuple[float, dict[int, str | None], set[str], dict[str, list[str]]]:
    """Once the faults are over: drain (at most ``seconds``), read everything back, the schedule's tasks with
    it, and run every check; returns (how long the drain took, fire time -> its task, the schedule's tasks,
    check -> what broke it)."""
    drained = drain(conn, checker, seconds)
    checker.read()
    fired, created = schedule_tasks(conn, checker.audit, schedule_id, fire_times, member)
    checker.schedule_tasks = {t: Acked(t, "orders.export", SCHEDULE["task"]["payload"], how="schedule")
                              for t in created | {t for t in fired.values() if t}}
    drain(conn, checker, 10)  # the schedule's last tasks
    checker.read()
    results = {
        "ended COMPLETED": checker.ended(),
        "items counted once": checker.items(),
        "one terminal transition in the audit trail": checker.audit_trail(),
        "then tasks ran once, after their batch": checker.then_tasks(),
        "callbacks delivered under one id": checker.callbacks(),
        "result files byte-identical": checker.files(),
        "schedule fired once per fire time": judge_schedule(fired, created, outages, to_wall),
        "answers within the contract": checker.answers(),
    }
    return drained, fired, created, results


def figures(load: Load, checker: Checker, fire_times: int, fired: dict[int, str | None], created: set[str]) -> None:
    """The load's and the checker's figures, after the faults' line."""
    ledger = load.ledger
    print(f"soak: {load.ops} ops, {len(ledger.tasks)} tasks acknowledged ({len(ledger.batches)} batches), "
          f"{ledger.given_up} ops given up; answers {dict(sorted(ledger.answers.items()))}")
    print(f"soak: schedule: {fire_times} fire times, {sum(1 for t in fired.values() if t)} with a task, "
          f"{len(created)} tasks created; {len(checker.schedule_tasks)} schedule tasks checked")
    print(f"soak: outcomes {dict(checker.figures.get('ended', {}))}; {checker.figures.get('files')} files compared; "
          f"callbacks {checker.figures.get('callbacks')}")


def verdict(results: dict[str, list[str]], title: str) -> None:
    """A line for each check, then the test fails with each broken check's listing (the first 25 lines)."""
    broken = {name: listing for name, listing in results.items() if listing}
    for name, listing in results.items():
        print(f"soak: {'FAIL' if listing else 'ok  '} {name}" + (f": {len(listing)}" if listing else ""))
    report = "\n".join(f"{name} ({len(listing)}):\n" + "\n".join(f"  {line}" for line in listing[:25])
                       + (f"\n  ... and {len(listing) - 25} more" if len(listing) > 25 else "")
                       for name, listing in broken.items())
    assert not broken, f"{title}:\n{report}"


def schedule_first_fire(schedule: dict[str, Any]) -> int:
    return int(datetime.fromisoformat(schedule["next_run_at"].replace("Z", "+00:00")).timestamp() * 1000)


def drain(conn: redis.Redis, checker: Checker, seconds: float) -> float:
    """Wait until every acknowledged task has ended and every asked-for callback has been delivered, at most
    ``seconds``; returns how long it took. Not reaching it fails nothing here: the checks then say what is
    stuck."""
    began = time.monotonic()
    tasks = checker.all_tasks()

    def quiet() -> bool:
        pipe = conn.pipeline(transaction=False)
        for task_id in tasks:
            pipe.hmget(keys.task(task_id), [keys.TaskField.STATUS, keys.TaskField.CALLBACK_STATE])
        states = pipe.execute()
        for acked, (status, callback) in zip(tasks.values(), states, strict=True):
            if (status or b"").decode() not in ("COMPLETED", "FAILED", "CANCELLED", "EXPIRED"):
                return False
            if acked.callback and (callback or b"").decode() == "pending":
                return False
        got = {str(body) for _, body, _ in checker.receiver.got}
        return all(any(batch_id in body for body in got) for batch_id in checker.ledger.batches)

    try:
        wait_until(quiet, timeout=seconds, interval=1.0, ignore=(redis.RedisError,))
    except AssertionError:
        print(f"soak: not quiet after {seconds:.0f} s of drain; judging what there is", flush=True)
    return time.monotonic() - began
