"""What runs under supervisord, from the launcher's module (``python -m app.launch.supervisor``, its main): supervisord
itself in our log format, the watchdog that stops everything when supervisor gives up on a process, and the
wrapper that hands the web alone its settings file.

supervisord runs through here (``--supervisord``, :func:`run_supervisord`) so that its own lines
(``spawned: 'web' with pid 4101``, ``exited: worker.1 (terminated by SIGKILL; not expected)``) come out in the
format of every other process (app.core.logs), not in supervisor's ``2026-12-01 19:29:56,084 INFO ...``.

Its own module because this code runs in supervisord and its programs, not in ``taskport up``
(:class:`app.launch.supervisor.Launcher`, which starts supervisord and carries out a stop).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from app.core.logs import make_handler
from app.launch.supervisorconf import START_RETRIES

SUPERVISORD_FLAG = "--supervisord"  # python -m app.launch.supervisor --supervisord ARGS: supervisord, our log format
SUPERVISORD_LOGGER = "supervisor"  # the logger name its lines carry


def with_web_env(env_file: Path, command: list[str]) -> None:
    """Exec ``command`` with the settings of ``env_file`` (JSON, written 0600 by the launcher) added to
    the environment: how the web alone gets its secrets under supervisor, whose own ``environment=``
    lines cannot carry every value (its parser has no escapes) and would hand them to every program."""
    os.environ.update(json.loads(env_file.read_text()))
    os.execv(command[0], command)



# -- the watchdog (a supervisor event listener) --------------------------------------------------


def watch(gave_up: Path, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout,
          stop_all: Callable[[], None] | None = None) -> int:
    """Listen for PROCESS_STATE_FATAL (supervisor gave up restarting a process: the service is not whole
    any more): note which one in ``gave_up`` and have supervisord stop everything (``up`` then exits 1).
    Returns 0 when supervisord closes the pipe."""
    from supervisor import childutils

    stop_all = stop_all or (lambda: os.kill(os.getppid(), signal.SIGTERM))
    while True:
        childutils.listener.ready(stdout)
        line = stdin.readline()
        if not line:
            return 0
        headers = childutils.get_headers(line)
        payload = stdin.read(int(headers["len"]))
        if headers["eventname"] == "PROCESS_STATE_FATAL":
            name = childutils.get_headers(payload.split("\n", 1)[0])["processname"]
            print(f"taskport: {name} failed {START_RETRIES + 1} starts in a row: stopping everything",
                  file=sys.stderr, flush=True)
            with open(gave_up, "a") as marker:  # one append each: a second FATAL may come while stopping
                marker.write(name + "\n")
            stop_all()
        childutils.listener.ok(stdout)


# -- supervisord in our log format -----------------------------------------------------------------


def run_supervisord(argv: list[str]) -> int:
    """Run supervisord in this process (``argv``: its command line), its own log lines written to stdout, where
    it wrote them, in the format of every other process: its stdout handler forwards each record to a logger
    with our handler (supervisor's levels are logging's numbers: CRIT 50 ... DEBG 10; its TRAC and BLAT go as
    DEBUG). The programs' output, which supervisord copies to /dev/stdout itself, is untouched."""
    from supervisor import loggers, supervisord

    target = logging.getLogger(SUPERVISORD_LOGGER)
    handler = make_handler("supervisord")
    handler.setStream(sys.stdout)
    target.addHandler(handler)
    target.propagate = False
    target.setLevel(logging.DEBUG)  # supervisord's own loglevel (supervisorconf) decides what it sends

    class Forwarded(loggers.Handler):  # type: ignore[misc]  # supervisor has no type hints
        def emit(self, record: Any) -> None:
            target.log(max(record.level, logging.DEBUG), "%s", record.asdict()["message"].rstrip("\n"))

        def flush(self) -> None:
            handler.flush()

        def close(self) -> None:
            pass  # never our stdout

    def handle_stdout(logger: Any, fmt: str) -> None:
        forwarded = Forwarded()
        forwarded.setLevel(logger.level)
        logger.addHandler(forwarded)

    loggers.handle_stdout = handle_stdout  # what ServerOptions.make_logger calls in the foreground (nodaemon)
    wake_on_signals()
    supervisord.main(argv)
    return 0


def wake_on_signals() -> None:
    """Have every signal wake supervisord's loop at once (a stop request; SIGCHLD, a child's exit).

    The loop polls its children's pipes with a 1 s timeout, and its handlers only note a signal: Python
    resumes the interrupted poll (PEP 475), so supervisord learnt of a stop, and of each exit during it,
    up to 1 s late. A stop takes a turn of the loop per step (the watchdog, the web, workers and scheduler
    together, then Redis), so the ticks added up to several seconds of a Ctrl-C (issue 29, finding 11).
    Here the interpreter writes a byte on every signal to a pipe the poller always watches (the signal
    wakeup fd), and the poll returns; the byte is read away and the pipe kept out of supervisord's sight."""
    from supervisor import poller

    class SignalWoken(poller.Poller):  # type: ignore[misc,name-defined]  # supervisor has no type hints
        def initialize(self) -> None:
            super().initialize()
            self.wakeup, self.writer = os.pipe()
            for fd in (self.wakeup, self.writer):
                os.set_blocking(fd, False)
            signal.set_wakeup_fd(self.writer, warn_on_full_buffer=False)

        def poll(self, timeout: float) -> tuple[list[int], list[int]]:
            self.register_readable(self.wakeup)  # again each time: supervisord drops an fd it does not know
            readables, writables = super().poll(timeout)
            if self.wakeup in readables:
                readables.remove(self.wakeup)
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wakeup, 4096):
                        pass
            return readables, writables

        def close(self) -> None:  # supervisord's own end of a run (a reload makes a new poller)
            super().close()
            signal.set_wakeup_fd(-1)
            os.close(self.wakeup)
            os.close(self.writer)

    poller.Poller = SignalWoken  # what ServerOptions instantiates
