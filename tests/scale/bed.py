"""The multi-host test bed: hosts as Linux network namespaces on one machine (issue 19, part 5).

Every host is a namespace with its own loopback and one veth link whose other end is a port of a bridge
that lives in a namespace of its own (the "switch"): hosts reach each other only through that bridge, and
the root namespace gets no interface, so nothing outside the bed can reach a host or be reached from one.
``redis1`` is the primary, ``redis2``/``redis3`` its replicas (real ``valkey-server`` processes, AOF on),
``sent1..3`` Sentinels, ``web1/2``, ``work1/2`` app hosts, ``client`` the load generators' host.

Names, locks and teardown are ``netns.py``'s (every name carries the bed's tag; ``__exit__``, SIGINT, SIGTERM
and atexit kill every process in the bed's namespaces and delete them), the helper in ``client`` that sends the
servers their commands is ``agent.py``'s; what the tests import from either is re-exported here.

    python -m tests.scale.bed up       # build, start Redis + Sentinels, print the hosts, wait for Ctrl-C
    python -m tests.scale.bed clean    # remove every leftover of a bed that was killed
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from app.core.process import kill_session
from app.launch.embedded import server_executable
from tests.scale import netns
from tests.scale.agent import Agent, Remote, RemoteError
from tests.scale.netns import IP, LOCK_DIR, MADE, BedError, clean, netns_names, netns_pids  # noqa: F401 (re-exports)

# ---- topology: one place for each parameter (the hosts' names and octets, HOSTS, are netns.py's: they name namespaces)
SUBNET = "10.231.0"  # the hosts' /24
PREFIX_LEN = 24
DATA_NODES = ("redis1", "redis2", "redis3")
FIRST_PRIMARY = "redis1"
SENTINELS = ("sent1", "sent2", "sent3")
REDIS_PORT = 6379
SENTINEL_PORT = 26379
MASTER_NAME = "taskport"
QUORUM = 2
DOWN_AFTER_MS = 1500  # a primary silent this long is subjectively down (margin for a busy 2-core host)
FAILOVER_TIMEOUT_MS = 5000
MIN_REPLICAS_TO_WRITE = 1  # a primary cut off from its replicas refuses writes...
MIN_REPLICAS_MAX_LAG = 3  # ...once no replica has acked for this many seconds
REPL_PING_PERIOD = 1  # seconds; with REPL_TIMEOUT: a cut link is noticed within seconds
REPL_TIMEOUT = 4
# ---- machinery
REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: first on every process's PATH
START_TIMEOUT = 30.0
STOP_GRACE = 3.0
_SEQ = iter(range(1 << 30))


@dataclass(frozen=True)
class Host:
    name: str
    ns: str  # network namespace
    ip: str
    iface: str  # its end of the veth (inside ``ns``)
    peer: str  # the other end: a port of the bridge, in the switch namespace


@dataclass
class Proc:
    """A process started inside a host, in a session of its own; output in ``log``."""

    host: str
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self, grace: float = STOP_GRACE) -> int:
        """SIGTERM to its process group, ``grace`` s, then SIGKILL to its whole session; the exit code."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(grace)
        kill_session(self.pid)
        return self.popen.wait()


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _data_conf(host: Host, directory: Path, primary: Host | None) -> str:
    lines = [
        f"bind {host.ip} 127.0.0.1", f"port {REDIS_PORT}", "protected-mode no", f'dir "{directory}"',
        'logfile ""', "save \"\"", "appendonly yes", "appendfsync everysec",
        f"replica-announce-ip {host.ip}", f"min-replicas-to-write {MIN_REPLICAS_TO_WRITE}",
        f"min-replicas-max-lag {MIN_REPLICAS_MAX_LAG}", f"repl-ping-replica-period {REPL_PING_PERIOD}",
        f"repl-timeout {REPL_TIMEOUT}", "repl-diskless-sync yes", "repl-diskless-sync-delay 0",
    ]
    if primary is not None:
        lines.append(f"replicaof {primary.ip} {REDIS_PORT}")
    return "\n".join(lines) + "\n"


def _sentinel_conf(host: Host, directory: Path, primary: Host) -> str:
    lines = [
        f"bind {host.ip} 127.0.0.1", f"port {SENTINEL_PORT}", "protected-mode no", f'dir "{directory}"',
        'logfile ""', "sentinel resolve-hostnames no", "sentinel announce-hostnames no",
        f"sentinel announce-ip {host.ip}", f"sentinel monitor {MASTER_NAME} {primary.ip} {REDIS_PORT} {QUORUM}",
        f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
        f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
        f"sentinel parallel-syncs {MASTER_NAME} 1",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class Bed:
    """The bed: build it with ``with Bed(workdir) as bed:``; everything goes at the end of the block."""

    workdir: Path
    tag: str | None = field(default=None, kw_only=True)
    hosts: dict[str, Host] = field(init=False)
    procs: list[Proc] = field(init=False, default_factory=list)
    servers: dict[str, Proc] = field(init=False, default_factory=dict)  # host -> its valkey-server

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        self.tag = self.tag or f"{netns.TAG_PREFIX}{os.getpid()}{chr(97 + next(_SEQ) % 26)}"
        if not netns.TAG_PATTERN.fullmatch(self.tag):
            raise BedError(f"a bed tag is {netns.TAG_PATTERN.pattern}, not {self.tag!r}")
        self.hosts = {name: Host(name, f"{self.tag}-{name}", f"{SUBNET}.{octet}", f"{self.tag}h{octet}",
                                 f"{self.tag}b{octet}") for name, octet in netns.HOSTS.items()}
        self.switch = f"{self.tag}-{netns.SWITCH}"
        self.agent = Agent(self.hosts["client"].ns, log=self.log_path("client", "agent"), env=self.env, cwd=REPO_ROOT)
        self._lock_fd: int | None = None
        self._handlers: dict[int, Any] = {}

    # ---- life
    def __enter__(self) -> Bed:
        assert self.tag is not None
        if os.geteuid() != 0:
            raise BedError("the bed makes network namespaces: run it as root")
        self._lock_fd = netns._lock(self.tag)
        if self._lock_fd is None:
            raise BedError(f"a live bed already has the tag {self.tag}")
        MADE.append(self.tag)
        self._catch_signals()
        atexit.register(self.close)
        try:
            netns.destroy(self.tag)  # the lock is ours, so whatever carries the tag is a dead run's leftover
            (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process in the bed's namespaces, delete them; idempotent, uninterruptible."""
        if self._lock_fd is None:
            return
        assert self.tag is not None
        for sig in self._handlers:
            signal.signal(sig, signal.SIG_IGN)
        try:
            netns.destroy(self.tag)
        finally:
            self.agent.close()
            for proc in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(netns.KILL_TIMEOUT)
            netns._unlock(self.tag, self._lock_fd)
            self._lock_fd = None
            atexit.unregister(self.close)
            for sig, handler in self._handlers.items():
                signal.signal(sig, handler)

    def _catch_signals(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
            signal.signal(signal.SIGINT, _raise_interrupt)
            signal.signal(signal.SIGTERM, _raise_exit)

    def _build(self) -> None:
        netns._ip(batch="".join(f"netns add {ns}\n" for ns in [self.switch, *(h.ns for h in self.hosts.values())]))
        bridge = f"{self.tag}br"
        links = [f"link add {bridge} type bridge", f"link set {bridge} up"]
        for host in self.hosts.values():
            links += [f"link add {host.peer} type veth peer name {host.iface} netns {host.ns}",
                      f"link set {host.peer} master {bridge} up"]
        netns._ip(ns=self.switch, batch="\n".join(links) + "\n")
        for host in self.hosts.values():
            netns._ip(ns=host.ns, batch=f"link set lo up\naddr add {host.ip}/{PREFIX_LEN} dev {host.iface}\n"
                                  f"link set {host.iface} up\n")

    # ---- processes
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A platform's clean environment (PATH with the venv first, HOME, LANG) plus ``extra``."""
        base = {"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
        return base | (extra or {})

    def log_path(self, host: str, name: str) -> Path:
        return self.workdir / "logs" / f"{host}.{name}.log"

    def spawn(self, host: str, argv: list[str], *, env: dict[str, str] | None = None, name: str) -> Proc:
        """Start ``argv`` inside ``host`` (cwd the repo root, own session, env = ``env()`` + ``env``)."""
        log = self.log_path(host, name)
        with open(log, "ab") as out:
            popen = subprocess.Popen([IP, "netns", "exec", self.hosts[host].ns, *argv], cwd=REPO_ROOT,
                                     env=self.env(env), stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        proc = Proc(host, name, popen, log)
        self.procs.append(proc)
        return proc

    def start_role(self, host: str, role: str, *, env: dict[str, str]) -> Proc:
        """One Procfile line, run the way a Heroku-style platform runs it: ``/bin/sh -c "<line>"``."""
        lines = dict(line.split(":", 1) for line in (REPO_ROOT / "Procfile").read_text().splitlines() if ":" in line)
        return self.spawn(host, ["/bin/sh", "-c", lines[role].strip()], env=env, name=role)

    def run(self, host: str, argv: list[str], *, env: dict[str, str] | None = None,
            timeout: float) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``host`` to completion; output captured as text."""
        return subprocess.run([IP, "netns", "exec", self.hosts[host].ns, *argv], cwd=REPO_ROOT, env=self.env(env),
                              capture_output=True, text=True, timeout=timeout, check=False)

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(f"----- {p.host}.{p.name} (pid {p.pid}, {'running' if p.alive() else 'exited'})\n"
                         f"{p.tail(lines)}" for p in self.procs)

    # ---- Redis and Sentinel
    def start_redis(self) -> None:
        """Primary, two replicas, three Sentinels; returns once the replicas are in sync and every Sentinel
        sees the primary with two replicas and two other Sentinels."""
        for name in DATA_NODES:
            self._start_server(name)
        self._await(self._in_sync, "the replicas in sync", DATA_NODES)
        for name in SENTINELS:
            self._start_server(name)
        self._await(self._sentinels_ready, "the Sentinels' agreement", DATA_NODES + SENTINELS)

    def restart_redis(self, host: str) -> None:
        """Start the data node or Sentinel of ``host`` again on its files (after ``kill_host``); returns
        once it answers (a data node may still be loading or rejoining)."""
        if host in self.servers and self.servers[host].alive():
            raise BedError(f"the server of {host} is still running")
        self._start_server(host)
        self._await(lambda: self.redis(host)("PING", timeout=0.5) is True, f"{host} answering", (host,))

    def _start_server(self, host: str) -> None:
        directory = self.workdir / host
        directory.mkdir(exist_ok=True)
        conf = directory / ("sentinel.conf" if host in SENTINELS else "valkey.conf")
        if not conf.exists():  # a restart keeps the file the server (or Sentinel) rewrote
            primary = self.hosts[FIRST_PRIMARY]
            conf.write_text(_sentinel_conf(self.hosts[host], directory, primary) if host in SENTINELS
                            else _data_conf(self.hosts[host], directory, None if host == FIRST_PRIMARY else primary))
        argv = [server_executable(), str(conf), *(("--sentinel",) if host in SENTINELS else ())]
        self.servers[host] = self.spawn(host, argv, name="sentinel" if host in SENTINELS else "valkey")

    def _in_sync(self) -> bool:
        links = [self.redis(name).info().get("master_link_status") for name in DATA_NODES if name != FIRST_PRIMARY]
        return links == ["up", "up"] and self.redis(FIRST_PRIMARY).info().get("connected_slaves") == 2

    def _sentinels_ready(self) -> bool:
        for name in SENTINELS:
            state = self.sentinel_master(name)
            if (state.get("flags"), state.get("num-slaves"), state.get("num-other-sentinels")) != ("master", "2", "2"):
                return False
        return True

    def _await(self, ready: Callable[[], bool], what: str, hosts: tuple[str, ...]) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            dead = [self.servers[h] for h in hosts if not self.servers[h].alive()]
            if dead:
                raise BedError(f"waiting for {what}: {dead[0].host} exited:\n{dead[0].tail()}")
            with contextlib.suppress(RemoteError):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise BedError(f"timed out waiting for {what}\n{self.log_tails()}")
            time.sleep(0.05)

    def redis(self, host: str, port: int | None = None) -> Remote:
        """Commands to the server on ``host`` (port: 26379 on a Sentinel host, else 6379), from ``client``."""
        return Remote(self.agent, self.hosts[host].ip, port or (SENTINEL_PORT if host in SENTINELS else REDIS_PORT))

    def sentinel_master(self, sentinel: str) -> dict[str, str]:
        """``SENTINEL MASTER taskport`` on one Sentinel, as a dict (``flags``, ``num-slaves``, ``ip``...)."""
        reply = self.redis(sentinel)("SENTINEL", "MASTER", MASTER_NAME, timeout=1.0)
        return reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2], strict=True))

    def primary(self) -> str:
        """The host of the primary as a majority of the Sentinels report it (BedError without a majority)."""
        votes: dict[str, int] = {}
        for name in SENTINELS:
            with contextlib.suppress(RemoteError):
                ip, _ = self.redis(name)("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME, timeout=1.0)
                votes[ip] = votes.get(ip, 0) + 1
        for ip, count in votes.items():
            if count > len(SENTINELS) // 2:
                return self.host_of(ip)
        raise BedError(f"the Sentinels do not agree on a primary: {votes}")

    def host_of(self, ip: str) -> str:
        return next(host.name for host in self.hosts.values() if host.ip == ip)

    def sentinel_env(self) -> dict[str, str]:
        """The settings that point a taskport process at this bed's Sentinels."""
        sentinels = ",".join(f"{self.hosts[name].ip}:{SENTINEL_PORT}" for name in SENTINELS)
        return {"REDIS_SENTINELS": sentinels, "REDIS_SENTINEL_MASTER": MASTER_NAME}

    # ---- failures
    def reachable(self, host: str, port: int | None = None, *, timeout: float = 1.0) -> bool:
        """Whether a TCP connect from ``client`` to ``host`` succeeds within ``timeout`` s."""
        target = self.redis(host, port)
        with contextlib.suppress(RemoteError):
            return bool(self.agent.request({"op": "connect", "ip": target.ip, "port": target.port,
                                            "timeout": timeout}, timeout))
        return False

    def kill_host(self, host: str) -> None:
        """SIGKILL every process in the host's namespace, as if the machine died."""
        netns.kill_all([self.hosts[host].ns])
        for proc in self.procs:
            if proc.host == host:
                proc.popen.wait()
        if host == "client":
            self.agent.close()

    def cut(self, host: str) -> None:
        """Both ends of the host's link down: a partition; its processes keep running."""
        self._link(host, "down")

    def heal(self, host: str) -> None:
        self._link(host, "up")

    def _link(self, host: str, state: str) -> None:
        netns._ip("link", "set", self.hosts[host].iface, state, ns=self.hosts[host].ns)
        netns._ip("link", "set", self.hosts[host].peer, state, ns=self.switch)


def _up(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir or f"/tmp/taskport-bed-{os.getpid()}")
    try:
        with Bed(workdir, tag=args.tag) as bed:
            bed.start_redis()
            for host in bed.hosts.values():
                print(f"{host.name:8} {host.ip:12} ns {host.ns}")
            print(" ".join(f"{key}={value}" for key, value in bed.sentinel_env().items()))
            print(f"ready: bed {bed.tag} in {workdir} (Ctrl-C tears it down)", flush=True)
            while True:
                signal.pause()
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.scale.bed", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="build the bed, start Redis and the Sentinels, wait for Ctrl-C")
    up.add_argument("--workdir", help="data and logs (default /tmp/taskport-bed-<pid>)")
    up.add_argument("--tag", help="names' tag (default tp<pid><letter>)")
    cleaner = commands.add_parser("clean", help="remove what killed beds left behind")
    cleaner.add_argument("--prefix", default=netns.TAG_PREFIX)
    args = parser.parse_args(argv)
    if args.command == "up":
        return _up(args)
    print("removed:", " ".join(clean(args.prefix)) or "nothing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
