"""What bench/scale.py reads around each measurement window on the bed: the Redis primary's CPU
(``INFO cpu``) and commands (``INFO commandstats``), every bed host's CPU (its processes' ``/proc``
times), and the whole machine's (``/proc/stat``).

Commands the probe itself causes are left out: ``INFO`` (bench.counting's delta drops it), and every
command sent through :meth:`Probe.command` together with the ``HELLO`` and two ``CLIENT SETINFO`` that
the bed helper's fresh connection (one per command) sends first. A window minus an idle one (``minus``)
takes away the background that runs whatever the load: heartbeats, the workers' blocking pops timing
out, scheduler and housekeeping passes, the Sentinels' pings and INFOs, replication acks.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from bench.counting import command_delta
from bench.machine import _machine_busy
from tests.scale.bed import Bed, netns_pids

CONNECTION_SETUP = ("hello", "client|setinfo", "client|setinfo")  # each bed helper connection's first commands
CLK_TCK = os.sysconf("SC_CLK_TCK")


def pid_cpu(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@dataclass(frozen=True)
class Snap:
    at: float  # monotonic seconds
    redis_cpu: float  # used_cpu_user + used_cpu_sys of the primary's process
    calls: dict[str, int]  # commandstats: calls per command
    hosts: dict[str, float]  # host -> CPU seconds of the processes now in it (the primary's host left out)
    busy: float  # CPU seconds the machine spent busy since boot
    sent: Counter[str]  # commands the probe had sent by then, its own INFO and connection set-ups included


@dataclass
class Window:
    """What happened between two snapshots."""

    seconds: float
    redis_cpu: float
    calls: dict[str, float]
    hosts: dict[str, float]
    busy: float
    extra_cpu: dict[str, float] = field(default_factory=dict)  # e.g. the client process's own report

    def minus(self, idle: Window) -> Window:
        """This window without the idle background (``idle``'s rates times this window's length)."""
        k = self.seconds / idle.seconds if idle.seconds else 0.0
        calls = {name: max(0.0, n - k * idle.calls.get(name, 0)) for name, n in self.calls.items()}
        hosts = {name: max(0.0, s - k * idle.hosts.get(name, 0.0)) for name, s in self.hosts.items()}
        return replace(self, redis_cpu=max(0.0, self.redis_cpu - k * idle.redis_cpu), calls=calls, hosts=hosts)

    def group(self, prefix: str) -> float:
        """CPU seconds of the hosts whose name starts with ``prefix`` (``web``, ``work``)."""
        return sum(s for name, s in self.hosts.items() if name.startswith(prefix))

    def per(self, n: int) -> dict[str, Any]:
        """Per operation: commands (all, and by name), and CPU of the primary, the web and worker hosts."""
        n = max(n, 1)
        commands = {name: round(c / n, 3) for name, c in sorted(self.calls.items()) if c / n >= 0.005}
        return {"ops": n, "commands": round(sum(self.calls.values()) / n, 2), "by_command": commands,
                "redis_cpu_us": round(self.redis_cpu / n * 1e6, 1),
                "web_cpu_us": round(self.group("web") / n * 1e6, 1),
                "worker_cpu_us": round(self.group("work") / n * 1e6, 1)}

    def cores(self) -> dict[str, float]:
        """Cores busy on average: the machine, the primary, web hosts, worker hosts, the rest of the bed."""
        s = self.seconds or 1.0
        client = self.hosts.get("client", 0.0) + self.extra_cpu.get("client", 0.0)
        others = sum(v for k, v in self.hosts.items() if not k.startswith(("web", "work", "client")))
        bed = self.redis_cpu + self.group("web") + self.group("work") + client + others
        return {"window_s": round(s, 3), "machine": round(self.busy / s, 2),
                "redis_primary": round(self.redis_cpu / s, 2),
                "web": round(self.group("web") / s, 2), "workers": round(self.group("work") / s, 2),
                "client": round(client / s, 2), "replicas_sentinels": round(others / s, 2),
                "not_bed": round(max(0.0, self.busy - bed) / s, 2)}


class Probe:
    """Snapshots of the bed's primary (through the bed's helper) and of its hosts' processes."""

    def __init__(self, bed: Bed, primary: str) -> None:
        self.bed = bed
        self.remote = bed.redis(primary)
        self.primary = primary
        self.sent: Counter[str] = Counter()

    def command(self, *args: str | int) -> Any:
        """A command to the primary that windows leave out of their counts."""
        self.sent.update([*CONNECTION_SETUP, str(args[0]).lower()])
        return self.remote(*args)

    def snap(self) -> Snap:
        info = self.command("INFO", "cpu", "commandstats")
        calls = {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in info.items()
                 if name.startswith("cmdstat_")}
        hosts = {name: sum(pid_cpu(pid) for pid in netns_pids(host.ns))
                 for name, host in self.bed.hosts.items() if name != self.primary}
        redis_cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return Snap(time.monotonic(), redis_cpu, calls, hosts, _machine_busy(), self.sent.copy())

    @staticmethod
    def window(a: Snap, b: Snap) -> Window:
        delta = Counter(command_delta(a.calls, b.calls))
        delta.subtract(b.sent - a.sent)
        calls = {name: float(n) for name, n in delta.items() if n > 0}
        hosts = {name: max(0.0, b.hosts.get(name, 0.0) - cpu) for name, cpu in a.hosts.items()}
        return Window(b.at - a.at, b.redis_cpu - a.redis_cpu, calls, hosts, b.busy - a.busy)
