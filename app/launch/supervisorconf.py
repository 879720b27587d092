"""The ``supervisord.conf`` that ``taskport up`` runs (app.launch.supervisor): which programs, in which order,
and the restart and stop policy written into it (see that module's docstring and docs/self-healing.md).

Each supervised worker runs under a name of its own slot (:func:`worker_slot_name`): the host, a short id of
the data dir and the process number supervisor gives it, so the worker that supervisor starts in place of a
dead one finds its predecessor's registration in RQ and takes over its run at once (workers.takeover).
"""

from __future__ import annotations

import hashlib
import math
import os
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from app.core.config import Config

GROUP = "taskport"
START_SECS = 3  # a process that dies within this many seconds of its start failed to start
START_RETRIES = 3  # failed starts in a row (1 + 2 + 3 s of backoff) before supervisor gives up
STOP_WAIT = 5  # seconds between SIGTERM and SIGKILL: gunicorn's graceful timeout, RQ's warm shutdown
REDIS_STOP_WAIT = 10  # seconds redis-server gets to flush its append-only file on SIGTERM
WEB_ENV = "web-env.json"  # in the state dir, 0600: the settings only the web process gets
WEB_ENV_FLAG = "--web-env"
GAVE_UP = "gave-up"  # file the watchdog writes (with the process name) before it stops everything
PROCESS_NUM = "%(process_num)d"  # supervisor's expansion of a process's number, left as is in a command
LAUNCHER = "app.launch.supervisor"  # the module whose main is the watchdog and the web's env wrapper


@dataclass(frozen=True)
class Program:
    """One ``[program:x]`` section: what runs and how it is stopped."""

    name: str
    command: list[str]
    priority: int
    numprocs: int = 1
    stop_wait: int = STOP_WAIT
    as_group: bool = True  # signal the process group: gunicorn's workers, RQ's scheduler child

    def section(self, cwd: Path) -> str:
        # every % is escaped but supervisor's own process number, which names a worker's slot
        command = _escape(shlex.join(self.command)).replace(_escape(PROCESS_NUM), PROCESS_NUM)
        lines = [
            f"[program:{self.name}]",
            f"command={command}",
            f"directory={_escape(str(cwd))}",
            f"priority={self.priority}",
            "autostart=true",
            "autorestart=true",
            f"startsecs={START_SECS}",
            f"startretries={START_RETRIES}",
            "stopsignal=TERM",
            f"stopwaitsecs={self.stop_wait}",
            f"stopasgroup={str(self.as_group).lower()}",
            f"killasgroup={str(self.as_group).lower()}",
            "redirect_stderr=true",
            "stdout_logfile=/dev/stdout",  # supervisord's own stdout: the terminal of `make up`
            "stdout_logfile_maxbytes=0",
        ]
        if self.numprocs > 1:
            lines += ["process_name=%(program_name)s.%(process_num)d", f"numprocs={self.numprocs}"]
        if self.numprocs > 1 or PROCESS_NUM in command:
            lines.append("numprocs_start=1")  # worker.1, worker.2... (and a lone worker's slot is 1 too)
        return "\n".join(lines)


def worker_stop_wait(config: Config) -> int:
    """Seconds supervisord gives a worker between SIGTERM and SIGKILL: its stop grace, by the end of which its
    run is back on its queue (workers.stopping), and STOP_WAIT more for the rest of its stop."""
    return math.ceil(config.stop_grace) + STOP_WAIT


def data_dir_id(config: Config) -> str:
    """A short id of the (resolved) data dir: two ``taskport up`` runs on one host, each on its own data dir
    and maybe one Redis (REDIS_URL), never share a worker name; the same data dir gives the same names."""
    return hashlib.sha256(str(Path(config.data_dir).resolve()).encode()).hexdigest()[:8]


def worker_slot_name(config: Config, process_num: str = PROCESS_NUM) -> str:
    """The RQ name of the worker in slot ``process_num`` (supervisor fills it in): the same for every worker
    supervisor starts in that slot, so a successor knows its predecessor is dead (one process per slot)."""
    return f"{socket.gethostname()}.{data_dir_id(config)}.worker-{process_num}"


def programs(config: Config, redis_command: list[str] | None, state_dir: Path) -> list[Program]:
    """Everything ``up`` runs; ``redis_command`` is the embedded redis-server's (None with REDIS_URL)."""
    role = [sys.executable, "-m", "app.launch.cli"]
    with_web_env = [sys.executable, "-m", LAUNCHER, WEB_ENV_FLAG, str(state_dir / WEB_ENV)]
    worker = [*role, "worker", "--name", worker_slot_name(config)]
    found = [
        Program("web", [*with_web_env, *role, "web"], priority=10),
        Program("worker", worker, priority=10, numprocs=config.workers, stop_wait=worker_stop_wait(config)),
        Program("scheduler", [*role, "scheduler"], priority=10),
        # the web's settings file: the callback signing secrets are among them (app.core.config.TRUSTED_ROLES)
        Program("deliverer", [*with_web_env, *role, "deliverer"], priority=10),
    ]
    if redis_command:
        found.insert(0, Program("redis", redis_command, priority=1, stop_wait=REDIS_STOP_WAIT, as_group=False))
    return found


def render(config: Config, state_dir: Path, redis_command: list[str] | None) -> str:
    """The whole ``supervisord.conf``."""
    procs = programs(config, redis_command, state_dir)
    cwd = Path.cwd()
    head = [
        "[supervisord]",
        "nodaemon=true",  # in the foreground, its log on stdout (not to a log file: /dev/null)
        "logfile=/dev/null",
        "logfile_maxbytes=0",
        "loglevel=info",
        f"pidfile={_escape(str(state_dir / 'supervisord.pid'))}",
        f"childlogdir={_escape(str(state_dir))}",
    ]
    if os.geteuid() == 0:  # as root supervisord logs a CRIT line unless told which user to stay
        head.append("user=root")
    task_programs = [p.name for p in procs if p.name != "redis"]
    watchdog = [
        "[eventlistener:watchdog]",
        f"command={_escape(shlex.join([sys.executable, '-m', LAUNCHER, str(state_dir / GAVE_UP)]))}",
        "events=PROCESS_STATE_FATAL",
        "priority=100",
        "autorestart=true",
        "stderr_logfile=/dev/stdout",
        "stderr_logfile_maxbytes=0",
    ]
    group = [f"[group:{GROUP}]", f"programs={','.join(task_programs)}", "priority=10"]
    sections = ["\n".join(head), *(p.section(cwd) for p in procs), "\n".join(group), "\n".join(watchdog)]
    return "\n\n".join(sections) + "\n"


def _escape(value: str) -> str:
    return value.replace("%", "%%")  # supervisor expands %(name)s in every value
