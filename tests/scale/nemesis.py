"""The fault soak's nemesis on the multi-host bed (issue 29, part 6): faults picked from a seed, one at a time,
against taskport on the bed (tests/scale/cluster.py), for tests/scale/test_soak_bed.py.

The faults:

- ``kill -9 primary``: the Redis primary's host killed (Sentinel promotes a replica), its server started
  again on its files a few seconds later (Sentinel makes it a replica of the new primary);
- ``partition primary``: the primary's link down (cut off from every other host, its server still running)
  for 6-10 s, then up again (it rejoins as a replica);
- ``kill -9 worker``: a worker process of a worker host and its work horse, started again 0.5-3 s later, as
  a platform restarts a crashed process;
- ``SIGSTOP worker``: the same frozen for longer than the stall timeout, then SIGCONT;
- ``kill -9 web``: a web host's web process, started again 1-3 s later (the load goes to the other one).

Each Redis fault runs once in every soak (the first within its first third, the second by two thirds of
it), more when the seed picks them and time is left; after one, the next fault waits until both replicas
replicate the primary again. Every pick comes from ``random.Random(seed)``; ``events`` says what was done
when, so a failing run's faults can be read next to the product's logs.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.integration.harness import wait_until
from tests.scale.bed import Bed, Proc
from tests.scale.cluster import Cluster
from tests.scale.test_failover import PROMOTION_TIMEOUT, primary_now, restore
from tests.soak.nemesis import Event, descendants, freeze, kill9, pick, thaw, ticks, timed

PRIMARY_FAULTS = ("kill -9 primary", "partition primary")
REDIS_FAULT_ROOM = 25.0  # seconds a Redis fault may still need (failover, rejoin): none starts later in the soak


@dataclass
class BedNemesis:
    rng: random.Random
    bed: Bed
    cluster: Cluster
    stall_timeout: float
    gap: tuple[float, float] = (2.0, 6.0)  # seconds between two faults
    events: list[Event] = field(default_factory=list)
    outages: list[tuple[float, float]] = field(default_factory=list)  # (from, to) monotonic: no primary to write to
    _stop: threading.Event = field(default_factory=threading.Event)
    _stopped_pids: set[int] = field(default_factory=set)
    _cut: str | None = None
    _down: list[tuple[str, str]] = field(default_factory=list)  # (host, role) killed and not started again yet

    def run(self, seconds: float) -> None:
        """Faults until ``seconds`` have passed (or ``stop()``); each Redis fault at least once."""
        began = time.monotonic()
        due = sorted(began + seconds * self.rng.uniform(*span) for span in ((0.05, 0.3), (0.4, 0.6)))
        required = self.rng.sample(PRIMARY_FAULTS, len(PRIMARY_FAULTS))
        for now in ticks(self.rng, self._stop, self.gap, began, seconds):
            if due and now >= due[0]:
                due.pop(0)
                kind = required.pop(0)
            else:
                kind = pick(self.rng, FAULTS)
                if kind in PRIMARY_FAULTS and (began + seconds - now < REDIS_FAULT_ROOM or due):
                    kind = "kill -9 worker"
            detail, action = FAULTS[kind][1](self)
            timed(self.events, began, kind, detail, action)

    def stop(self) -> None:
        self._stop.set()

    def heal(self) -> None:
        """Undo whatever fault is still on: SIGCONT, the link up, every process running, both replicas in sync."""
        thaw(self._stopped_pids)
        if self._cut:
            self.bed.heal(self._cut)
            self._cut = None
        for host, role in list(self._down):
            self._start(host, role)
        restore(self.bed)  # a killed data node started again too

    # -- targets -----------------------------------------------------------------------------------
    def _pick(self, role: str) -> Proc:
        return self.rng.choice(sorted((p for p in self.cluster.procs if p.name == role and p.alive()),
                                      key=lambda p: p.pid))

    def _start(self, host: str, role: str) -> None:
        self.cluster.procs.append(self.bed.start_role(host, role, env=self.cluster.env(host)))
        self._down.remove((host, role))

    def _kill_and_restart(self, role: str, pause: tuple[float, float]) -> tuple[str, Callable[[], None]]:
        proc = self._pick(role)
        seconds = self.rng.uniform(*pause)

        def act() -> None:
            kill9(descendants(proc.pid))
            proc.popen.wait()
            self._down.append((proc.host, role))
            self._stop.wait(seconds)
            self._start(proc.host, role)

        return f"{proc.host} pid {proc.pid}, started again after {seconds:.1f} s", act

    def _freeze(self, proc: Proc, seconds: float) -> None:
        freeze(descendants(proc.pid), seconds, self._stop, self._stopped_pids)

    def _promoted(self, old: str, began: float) -> None:
        """Wait for a replica in place of ``old``, the outage since ``began`` logged."""
        def other() -> str | None:
            now = primary_now(self.bed)
            return now if now != old else None

        new = wait_until(other, timeout=PROMOTION_TIMEOUT, interval=0.05,
                         message=f"a replica promoted in place of {old}")
        promoted = time.monotonic()
        self.outages.append((began, promoted))
        print(f"soak:            {new} promoted after {promoted - began:.1f} s", flush=True)


def _kill_primary(n: BedNemesis) -> tuple[str, Callable[[], None]]:
    old = n.bed.primary()
    pause = n.rng.uniform(1.0, 4.0)

    def act() -> None:
        began = time.monotonic()
        n.bed.kill_host(old)
        n._promoted(old, began)
        n._stop.wait(max(0.0, began + pause - time.monotonic()))
        n.bed.restart_redis(old)
        restore(n.bed)

    return f"{old} (started again {pause:.1f} s after the kill)", act


def _partition_primary(n: BedNemesis) -> tuple[str, Callable[[], None]]:
    old = n.bed.primary()
    seconds = n.rng.uniform(6.0, 10.0)

    def act() -> None:
        began = time.monotonic()
        n.bed.cut(old)
        n._cut = old
        n._promoted(old, began)
        n._stop.wait(max(0.0, began + seconds - time.monotonic()))
        n.bed.heal(old)
        n._cut = None
        restore(n.bed)

    return f"{old} for {seconds:.1f} s", act


def _kill_worker(n: BedNemesis) -> tuple[str, Callable[[], None]]:
    return n._kill_and_restart("worker", (0.5, 3.0))


def _stop_worker(n: BedNemesis) -> tuple[str, Callable[[], None]]:
    proc = n._pick("worker")
    seconds = n.stall_timeout + n.rng.uniform(1.0, 4.0)
    return f"{proc.host} pid {proc.pid} for {seconds:.1f} s", lambda: n._freeze(proc, seconds)


def _kill_web(n: BedNemesis) -> tuple[str, Callable[[], None]]:
    return n._kill_and_restart("web", (1.0, 3.0))


# name -> (weight, build(nemesis) -> (target, action))
FAULTS: dict[str, tuple[int, Callable[[BedNemesis], tuple[str, Callable[[], None]]]]] = {
    "kill -9 primary": (8, _kill_primary),
    "partition primary": (8, _partition_primary),
    "kill -9 worker": (30, _kill_worker),
    "SIGSTOP worker": (25, _stop_worker),
    "kill -9 web": (15, _kill_web),
}
