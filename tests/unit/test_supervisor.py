"""`taskport up`'s supervisor policy (read back by supervisor's own config parser), its watchdog, and
the Redis retry policies of the web and of the workers."""

from __future__ import annotations

import io
import json
import math
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from supervisor.options import ServerOptions

from app.core import connection
from app.core.config import Config
from app.launch.supervised import watch
from app.launch.supervisor import Launcher, secret_free, web_only_environ
from app.launch.supervisorconf import (
    GROUP,
    START_RETRIES,
    START_SECS,
    STOP_WAIT,
    WEB_ENV_FLAG,
    data_dir_id,
    render,
    worker_slot_name,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def load(tmp_path: Path, config: Config, redis_command: list[str] | None) -> ServerOptions:
    state = tmp_path / "state%dir"  # a % in a path must survive supervisor's %(name)s expansion
    state.mkdir()
    conf = tmp_path / "supervisord.conf"
    conf.write_text(render(config, state, redis_command))
    options = ServerOptions()
    options.configfile = str(conf)
    options.process_config(do_usage=False)
    return options


def groups(options: ServerOptions) -> dict[str, Any]:
    return {g.name: g for g in options.process_group_configs}


def test_every_process_is_restarted_and_redis_runs_first_and_stops_last(tmp_path: Path) -> None:
    config = Config.from_env({"TASKPORT_WORKERS": "3"}, data_dir=tmp_path)
    options = load(tmp_path, config, ["/opt/redis-server", "--dir", str(tmp_path / "50%")])
    found = groups(options)
    assert set(found) == {"redis", GROUP, "watchdog"}
    processes = {p.name: p for g in found.values() for p in g.process_configs}
    assert set(processes) == {"redis", "web", "worker.1", "worker.2", "worker.3", "scheduler", "deliverer",
                              "watchdog"}
    assert processes["redis"].command == f"/opt/redis-server --dir {tmp_path / '50%'}"
    assert found["redis"].priority < found[GROUP].priority < found["watchdog"].priority
    for name in ("web", "worker.1", "scheduler", "deliverer"):
        proc = processes[name]
        role = name.split(".")[0]
        named = ["--name", worker_slot_name(config, name.split(".")[1])] if role == "worker" else []
        assert shlex.split(proc.command)[-2 - len(named):] == ["app.launch.cli", role, *named]
        assert proc.autorestart is not False and proc.startsecs == START_SECS
        assert proc.startretries == START_RETRIES
        # a worker's run is back on its queue within its stop grace: supervisord waits longer than that
        assert proc.stopwaitsecs == (STOP_WAIT if name != "worker.1" else math.ceil(Config().stop_grace) + STOP_WAIT)
        assert proc.stopasgroup and proc.killasgroup  # gunicorn's workers, RQ's scheduler child
    assert processes["redis"].stopwaitsecs > STOP_WAIT  # time to flush the append-only file
    assert options.pidfile == str(tmp_path / "state%dir" / "supervisord.pid")


def test_with_redis_url_there_is_no_embedded_redis(tmp_path: Path) -> None:
    config = Config.from_env({"REDIS_URL": "redis://elsewhere:6379/0", "TASKPORT_WORKERS": "1"}, data_dir=tmp_path)
    found = groups(load(tmp_path, config, None))
    assert set(found) == {GROUP, "watchdog"}
    assert sorted(p.name for p in found[GROUP].process_configs) == ["deliverer", "scheduler", "web", "worker"]


def test_each_worker_slot_has_a_name_of_its_own_that_its_next_process_gets_again(tmp_path: Path) -> None:
    config = Config.from_env({"TASKPORT_WORKERS": "2"}, data_dir=tmp_path / "var")
    names = {p.name: shlex.split(p.command)[-1] for p in groups(load(tmp_path, config, None))[GROUP].process_configs}
    assert (names["worker.1"], names["worker.2"]) == (worker_slot_name(config, "1"), worker_slot_name(config, "2"))
    assert names["worker.1"] == f"{socket.gethostname()}.{data_dir_id(config)}.worker-1"
    (tmp_path / "lone").mkdir()
    lone = Config.from_env({"TASKPORT_WORKERS": "1"}, data_dir=tmp_path / "var")
    [worker] = [p for p in groups(load(tmp_path / "lone", lone, None))[GROUP].process_configs if p.name == "worker"]
    assert shlex.split(worker.command)[-1] == worker_slot_name(config, "1")  # slot 1 under any count
    # another data dir (maybe on the same Redis) never takes these names; the same dir always gives them
    assert data_dir_id(Config.from_env({}, data_dir=tmp_path / "other")) != data_dir_id(config)
    assert data_dir_id(Config.from_env({}, data_dir=tmp_path / "var" / ".." / "var")) == data_dir_id(config)


def event(name: str, payload: str) -> str:
    header = f"ver:3.0 server:supervisor serial:1 pool:watchdog poolserial:1 eventname:{name} len:{len(payload)}\n"
    return header + payload


def test_the_watchdog_stops_everything_when_supervisor_gives_up(tmp_path: Path) -> None:
    fatal = "processname:worker.2 groupname:taskport from_state:BACKOFF"
    stdin = io.StringIO(event("PROCESS_STATE_FATAL", fatal) + event("PROCESS_STATE_FATAL", fatal))
    stdout = io.StringIO()
    stops: list[bool] = []
    assert watch(tmp_path / "gave-up", stdin, stdout, stop_all=lambda: stops.append(True)) == 0
    assert stdout.getvalue() == "READY\nRESULT 2\nOKREADY\nRESULT 2\nOKREADY\n"  # the listener protocol
    assert stops == [True, True]
    assert (tmp_path / "gave-up").read_text() == "worker.2\nworker.2\n"


def test_the_watchdog_ignores_other_events(tmp_path: Path) -> None:
    stdin = io.StringIO(event("PROCESS_STATE_EXITED", "processname:web groupname:taskport from_state:RUNNING"))
    stops: list[bool] = []
    assert watch(tmp_path / "gave-up", stdin, io.StringIO(), stop_all=lambda: stops.append(True)) == 0
    assert stops == [] and not (tmp_path / "gave-up").exists()


def test_the_web_fails_fast_and_workers_ride_out_an_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    config = Config.from_env({"TASKPORT_REDIS_RIDE_OUT": "30"}, redis_url="redis://127.0.0.1:1/0")
    monkeypatch.setattr(connection, "_ride_out", False)
    assert connection.connect(config).get_retry().get_retries() == 1
    connection.ride_out_outages()
    patient = connection.connect(config).get_retry()
    assert patient.get_retries() == 30 / connection.RIDE_OUT_STEP
    assert connection.connect(config, ride_out=False).get_retry().get_retries() == 1


def test_a_child_whose_parent_died_while_it_started_dies_at_once() -> None:
    code = ("import signal, time; from app.core.process import die_with_parent; "
            "die_with_parent(signal.SIGTERM, 1); time.sleep(30)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, timeout=30, check=False)
    assert done.returncode == -signal.SIGTERM  # its parent is not pid 1: as if the parent it had was gone


def test_only_the_web_gets_the_webs_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    password = 'pa"ss,w%rd\\x \'q'
    monkeypatch.setenv("TASKPORT_API_KEYS", "exported:in-the-shell")  # stripped: the config below wins
    config = Config.from_env({"TASKPORT_API_KEYS": "k1:alice,k2:bob", "TASKPORT_DASHBOARD_PASSWORD": password,
                              "TASKPORT_WORKERS": "2"}, data_dir=tmp_path)
    web_only = web_only_environ(config)
    assert web_only["TASKPORT_API_KEYS"] == "k1:alice,k2:bob" and web_only["TASKPORT_DASHBOARD_PASSWORD"] == password
    inherited = secret_free(config)  # what supervisord, and so every program, starts from
    assert not {"TASKPORT_API_KEYS", "TASKPORT_DASHBOARD_PASSWORD"} & set(inherited)
    assert inherited["TASKPORT_TASK_TTL"] == str(config.task_ttl)
    conf = render(config, tmp_path, None)
    assert "k1:alice" not in conf and "pa" + '"ss' not in conf  # the file names where they are, holds none
    processes = {p.name: p for g in groups(load(tmp_path, config, None)).values() for p in g.process_configs}
    assert f"{WEB_ENV_FLAG} " in processes["web"].command
    assert all(WEB_ENV_FLAG not in processes[n].command for n in ("worker.1", "worker.2", "scheduler"))


def test_the_web_env_file_reaches_the_web_command_exactly(tmp_path: Path) -> None:
    settings = {"TASKPORT_DASHBOARD_PASSWORD": 'pa"ss,w%rd\\x \'q', "TASKPORT_API_KEYS": "k1:alice"}
    env_file = tmp_path / "web-env.json"
    env_file.write_text(json.dumps(settings))
    names = sorted(settings)
    probe = f"import json, os; print(json.dumps({{k: os.environ[k] for k in {names!r}}}))"
    done = subprocess.run([sys.executable, "-m", "app.launch.supervisor", WEB_ENV_FLAG, str(env_file),
                           sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == settings


# -- the stop signal handler: re-entered by a second SIGTERM, it must take no lock ---------------


def test_the_stop_handler_calls_nothing(tmp_path: Path) -> None:
    launcher = Launcher(Config.from_env({}, data_dir=tmp_path))
    handler = Launcher._request_stop.__code__
    calls: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        caller = frame if event.startswith("c_") else frame.f_back
        if event in ("call", "c_call") and caller is not None and caller.f_code is handler:
            calls.append(getattr(arg, "__qualname__", frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        launcher._request_stop(signal.SIGTERM, None)
    finally:
        sys.setprofile(None)
    assert launcher.requested
    assert calls == []  # no Event.set, no logging, no print: nothing that could wait for a lock it holds


def test_the_stop_handler_reentered_at_any_point_returns_at_once(tmp_path: Path) -> None:
    """A second signal runs the handler again at any bytecode boundary of the first run, in any function it
    calls (how Event.set once deadlocked `taskport up`): here it is re-entered at every one of them."""
    launcher = Launcher(Config.from_env({}, data_dir=tmp_path))
    nested: list[int] = []

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            nested.append(1)
            launcher._request_stop(signal.SIGTERM, None)  # untraced: a trace function is not traced itself
        return trace

    def first_signal() -> None:
        sys.settrace(trace)
        try:
            launcher._request_stop(signal.SIGTERM, None)
        finally:
            sys.settrace(None)

    runner = threading.Thread(target=first_signal, daemon=True)
    runner.start()
    runner.join(timeout=5)
    assert not runner.is_alive(), "the re-entered handler blocked"
    assert nested and launcher.requested


SUPERVISE = """
import json, os, signal, subprocess, sys, threading, time
from app.core.config import Config
from app.launch import supervisor
supervisor.STOP_DEADLINE = 1.0
mode, data_dir = sys.argv[1:]
launcher = supervisor.Launcher(Config.from_env({}, data_dir=data_dir, stop_grace=0.01))
launcher._install_signal_handlers()
launcher.proc = subprocess.Popen([sys.executable, "-c", sys.stdin.read(), mode], stdout=subprocess.PIPE,
                                 start_new_session=True, text=True)
assert launcher.proc.stdout.readline() == "ready\\n"
for delay in (0.0, 0.0001, 0.1, 0.2):  # two at once, two while supervisord stops
    threading.Timer(delay, os.kill, (os.getpid(), signal.SIGTERM)).start()
started = time.monotonic()
rc = launcher._supervise()
launcher._stop()
print(json.dumps({"rc": rc, "child": launcher.proc.returncode, "took": time.monotonic() - started,
                  "terms": int(launcher.proc.stdout.read() or 0)}))
"""

FAKE_SUPERVISORD = """
import signal, sys, time
terms = []
signal.signal(signal.SIGTERM, lambda signum, frame: terms.append(signum))
print("ready", flush=True)
while not terms or sys.argv[1] == "stuck":
    time.sleep(0.01)
time.sleep(0.5)  # its orderly stop, during which the launcher gets more SIGTERMs
print(len(terms), flush=True)
"""


def supervise(mode: str, tmp_path: Path) -> dict[str, Any]:
    """Launcher._supervise over a fake supervisord (``clean``: stops 0.5 s after its first SIGTERM;
    ``stuck``: never stops), while four SIGTERMs reach the launcher."""
    done = subprocess.run([sys.executable, "-c", SUPERVISE, mode, str(tmp_path)], input=FAKE_SUPERVISORD,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_repeated_sigterms_ask_supervisord_to_stop_once_and_wait_for_it(tmp_path: Path) -> None:
    found = supervise("clean", tmp_path)
    assert found["terms"] == 1  # the repeats are not passed on: the stop goes on as it began, nothing killed
    assert found["rc"] == found["child"] == 0
    assert found["took"] < 5, found


def test_a_supervisord_that_does_not_stop_within_the_deadline_is_killed(tmp_path: Path) -> None:
    found = supervise("stuck", tmp_path)
    assert found["child"] == -signal.SIGKILL
    assert 1.0 <= found["took"] < 5, found  # stop_deadline (about 1 s here) after the first SIGTERM
