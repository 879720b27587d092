"""The soak's nemesis: faults picked at random from a seed, one at a time, against a running `taskport up`.

The faults (``FAULTS``, weighted):

- kill -9 of a worker, the web, the scheduler or the deliverer (the process and its children: supervisor
  starts it again), or of Redis (started again on the same files after a pause);
- SIGSTOP of one of them (all its processes), then SIGCONT after longer than the stall timeout;
- SIGTERM to a worker (its graceful stop; supervisor starts it again);
- replies dropped, or held, by the proxy in front of Redis for a few seconds;
- once, in the middle third of the run, Ctrl-C of the whole stack and `taskport up` again (``restart``).

Every pick comes from ``random.Random(seed)``; the log (``events``) says what was done when, so a failing
run's faults can be read next to the product's logs, and ``TASKPORT_SOAK_SEED`` replays the same picks.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.integration.harness import RedisServer, Up, children
from tests.soak.redisproxy import ReplyProxy

PROCESSES = ("worker", "web", "scheduler", "deliverer")


@dataclass
class Event:
    at: float  # seconds since the soak started
    kind: str  # a FAULTS name, or the restart
    detail: str
    took: float = 0.0


@dataclass
class Nemesis:
    rng: random.Random
    redis: RedisServer
    proxy: ReplyProxy
    up: Callable[[], Up]  # the running `taskport up` (a new one after the restart)
    restart: Callable[[], None]  # Ctrl-C of the stack and `taskport up` again
    stall_timeout: float
    gap: tuple[float, float] = (4.0, 10.0)  # seconds between two faults
    events: list[Event] = field(default_factory=list)
    scheduler_down: list[tuple[float, float]] = field(default_factory=list)  # (from, to) monotonic: fires may collapse
    _stop: threading.Event = field(default_factory=threading.Event)
    _stopped_pids: set[int] = field(default_factory=set)

    def run(self, seconds: float) -> None:
        """Faults until ``seconds`` have passed (or ``stop()``); the Ctrl-C once, in the middle third."""
        began = time.monotonic()
        restart_at = began + seconds * self.rng.uniform(1 / 3, 2 / 3)
        for now in ticks(self.rng, self._stop, self.gap, began, seconds):
            if restart_at and now >= restart_at:
                restart_at = 0.0
                self._timed(began, "Ctrl-C and up again", "", self._restart)
                continue
            kind = pick(self.rng, FAULTS)
            detail, action = FAULTS[kind][1](self)
            self._timed(began, kind, detail, action)

    def stop(self) -> None:
        self._stop.set()

    def heal(self) -> None:
        """Undo whatever fault is still on: SIGCONT every stopped process, the proxy normal, Redis running."""
        thaw(self._stopped_pids)
        self.proxy.heal()
        if not self.redis.running:
            self.redis.start()

    def _timed(self, began: float, kind: str, detail: str, action: Callable[[], None]) -> None:
        timed(self.events, began, kind, detail, action)

    def _restart(self) -> None:
        started = time.monotonic()
        self.restart()
        self.scheduler_down.append((started, time.monotonic()))

    # -- targets -----------------------------------------------------------------------------------
    def _pick(self, role: str | None = None) -> tuple[str, list[int]]:
        """A supervised process (of ``role``, or any) and its pids: the process and its children."""
        pids = self.up().child_pids()
        names = sorted(n for n in pids if n.split(".")[0] in ((role,) if role else PROCESSES))
        name = self.rng.choice(names)
        return name, descendants(pids[name])

    def _down(self, name: str, seconds: float) -> None:
        if name == "scheduler" or name == "redis":
            now = time.monotonic()
            self.scheduler_down.append((now, now + seconds))


def ticks(rng: random.Random, stop: threading.Event, gap: tuple[float, float], began: float,
          seconds: float) -> Iterator[float]:
    """When the next fault goes in (monotonic), after a gap picked from ``rng`` each time, until ``seconds`` since
    ``began`` have passed or ``stop`` is set."""
    while not stop.wait(rng.uniform(*gap)):
        now = time.monotonic()
        if now - began >= seconds:
            return
        yield now


def pick(rng: random.Random, faults: dict[str, tuple[int, Any]]) -> str:
    """A fault's name, by the weights of ``faults`` (name -> (weight, build))."""
    names = list(faults)
    return rng.choices(names, [faults[name][0] for name in names])[0]


def timed(events: list[Event], began: float, kind: str, detail: str, action: Callable[[], None]) -> None:
    """One fault: its line printed (seconds since ``began``), ``action`` run, its ``Event`` logged."""
    started = time.monotonic()
    print(f"soak: {started - began:7.1f} s  {kind} {detail}", flush=True)
    action()
    events.append(Event(started - began, kind, detail, time.monotonic() - started))


def kill9(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def freeze(pids: list[int], seconds: float, stop: threading.Event, stopped: set[int]) -> None:
    """SIGSTOP to ``pids``, SIGCONT after ``seconds`` (or at ``stop``); ``stopped`` holds them meanwhile, for
    ``thaw``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            stopped.add(pid)
    stop.wait(seconds)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        stopped.discard(pid)


def thaw(stopped: set[int]) -> None:
    """SIGCONT to every process a fault left stopped."""
    for pid in list(stopped):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    stopped.clear()


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (gunicorn's workers, a fork worker's work horse)."""
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children(found[-1]))
    return found


def _kill9(n: Nemesis) -> tuple[str, Callable[[], None]]:
    name, pids = n._pick()

    def act() -> None:
        n._down(name, 2.0)
        kill9(pids)

    return name, act


def _stop(n: Nemesis) -> tuple[str, Callable[[], None]]:
    name, pids = n._pick()
    seconds = n.stall_timeout + n.rng.uniform(1.0, 4.0)

    def act() -> None:
        n._down(name, seconds)
        freeze(pids, seconds, n._stop, n._stopped_pids)

    return f"{name} for {seconds:.1f} s", act


def _term_worker(n: Nemesis) -> tuple[str, Callable[[], None]]:
    name, pids = n._pick("worker")
    return name, lambda: os.kill(pids[0], signal.SIGTERM)


def _kill9_redis(n: Nemesis) -> tuple[str, Callable[[], None]]:
    pause = n.rng.uniform(0.2, 3.0)

    def act() -> None:
        n._down("redis", pause + 2.0)
        n.redis.kill9()
        n._stop.wait(pause)
        n.redis.start()

    return f"(down {pause:.1f} s)", act


def _stop_redis(n: Nemesis) -> tuple[str, Callable[[], None]]:
    seconds = n.stall_timeout + n.rng.uniform(1.0, 4.0)

    def act() -> None:
        pid = n.redis.pid
        assert pid is not None
        n._down("redis", seconds)
        os.kill(pid, signal.SIGSTOP)
        n._stopped_pids.add(pid)
        n._stop.wait(seconds)
        os.kill(pid, signal.SIGCONT)
        n._stopped_pids.discard(pid)

    return f"for {seconds:.1f} s", act


def _drop(n: Nemesis) -> tuple[str, Callable[[], None]]:
    probability, seconds = n.rng.uniform(0.05, 0.3), n.rng.uniform(2.0, 8.0)

    def act() -> None:
        n.proxy.drop(probability, seconds)
        n._stop.wait(seconds)

    return f"p={probability:.2f} for {seconds:.1f} s", act


def _delay(n: Nemesis) -> tuple[str, Callable[[], None]]:
    probability, seconds, hold = n.rng.uniform(0.05, 0.3), n.rng.uniform(2.0, 8.0), n.rng.uniform(0.2, 3.5)

    def act() -> None:
        n.proxy.delay(probability, seconds, hold)
        n._stop.wait(seconds + hold)

    return f"p={probability:.2f} hold {hold:.1f} s for {seconds:.1f} s", act


# name -> (weight, build(nemesis) -> (target, action))
FAULTS: dict[str, tuple[int, Callable[[Nemesis], tuple[str, Callable[[], None]]]]] = {
    "kill -9": (20, _kill9),
    "SIGSTOP": (15, _stop),
    "SIGTERM": (10, _term_worker),
    "kill -9 redis": (8, _kill9_redis),
    "SIGSTOP redis": (7, _stop_redis),
    "drop replies": (20, _drop),
    "delay replies": (20, _delay),
}
