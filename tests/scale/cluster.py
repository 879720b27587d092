"""taskport on the bed: the Procfile's processes on the app hosts, pointed at the bed's Sentinels.

``web1``/``web2`` run the Procfile's ``web`` line; ``work1``/``work2`` run ``worker`` (``workers`` of them
per host) and ``scheduler``, each started as a Heroku-style platform starts it (``Bed.start_role``). The
settings are production's with API keys, shortened intervals so failures are noticed in seconds, and
``extra`` (``TASKPORT_REPLICA_ACK=1``, say). ``load()`` runs tests/scale/load.py on the ``client`` host.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration.harness import wait_until
from tests.scale.bed import Bed, Proc

WEB_HOSTS = ("web1", "web2")
WORKER_HOSTS = ("work1", "work2")
PORT = 8000
API_KEY = "bed-key"
MEMBER = "bed"
OPERATOR_PASSWORD = "bed-operator"
SETTINGS = {  # every app process's, beside the Sentinels'
    "TASKPORT_API_KEYS": f"{API_KEY}:{MEMBER}", "TASKPORT_RATE_LIMIT": "off", "TASKPORT_MAX_ACTIVE_TASKS": "off",
    "TASKPORT_DASHBOARD_PASSWORD": OPERATOR_PASSWORD, "PORT": str(PORT), "WEB_CONCURRENCY": "1",
    "TASKPORT_STALL_TIMEOUT": "4", "TASKPORT_HEARTBEAT_INTERVAL": "0.5", "TASKPORT_HOUSEKEEPING_INTERVAL": "2",
    "TASKPORT_SCHEDULER_INTERVAL": "1", "TASKPORT_RETRY_BACKOFF": "0", "TASKPORT_REDIS_RIDE_OUT": "120",
}
START_TIMEOUT = 60.0


@dataclass
class Cluster:
    bed: Bed
    extra: dict[str, str] = field(default_factory=dict)
    web_hosts: tuple[str, ...] = WEB_HOSTS
    worker_hosts: tuple[str, ...] = WORKER_HOSTS
    workers: int = 2  # worker processes per worker host
    procs: list[Proc] = field(default_factory=list)

    def env(self, host: str) -> dict[str, str]:
        data = self.bed.workdir / "data" / host
        return {**self.bed.sentinel_env(), **SETTINGS, "TASKPORT_DATA_DIR": str(data), **self.extra}

    def start(self) -> Cluster:
        for host in self.web_hosts:
            self.procs.append(self.bed.start_role(host, "web", env=self.env(host)))
        for host in self.worker_hosts:
            self.procs += [self.bed.start_role(host, "worker", env=self.env(host)) for _ in range(self.workers)]
            self.procs.append(self.bed.start_role(host, "scheduler", env=self.env(host)))
        return self

    def stop(self) -> None:
        for proc in self.procs:
            if proc.alive():
                proc.stop()
        self.procs.clear()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.bed.hosts[h].ip}:{PORT}" for h in self.web_hosts]

    def load(self, name: str, **options: Any) -> Load:
        """tests/scale/load.py on the client host, started now; ``Load.go()`` releases it once it is ready."""
        out = self.bed.workdir / f"{name}.json"
        go = self.bed.workdir / f"{name}.go"
        for stale in (out, go, Path(f"{out}.ready")):
            stale.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "tests.scale.load", "--web", ",".join(self.urls), "--key", API_KEY,
                "--out", str(out), "--go", str(go)]
        for option, value in options.items():
            argv += [f"--{option}", str(value)]
        return Load(self.bed.spawn("client", argv, name=name), out, go)

    def logs(self, needle: str) -> list[str]:
        """Every line of the app processes' logs that contains ``needle``."""
        return [line for proc in self.procs for line in proc.log.read_text(errors="replace").splitlines()
                if needle in line]


@dataclass
class Load:
    proc: Proc
    out: Path
    go_file: Path
    started: float = 0.0

    def go(self) -> Load:
        """Once the load's web hosts are ready, start it (``started`` = now, monotonic)."""
        wait_until(lambda: Path(f"{self.out}.ready").exists() or not self.proc.alive(), timeout=START_TIMEOUT,
                   message=lambda: f"the load to be ready\n{self.proc.tail()}")
        assert self.proc.alive(), self.proc.tail()
        self.go_file.write_text("go\n")
        self.started = time.monotonic()
        return self

    def result(self, timeout: float) -> dict[str, Any]:
        wait_until(lambda: not self.proc.alive(), timeout=timeout, interval=0.2,
                   message=lambda: f"the load to finish\n{self.proc.tail()}")
        assert self.out.exists(), self.proc.tail()
        result: dict[str, Any] = json.loads(self.out.read_text())
        return result
