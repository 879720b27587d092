"""The ``taskport`` command: one entry point for every process of the Procfile, and ``up`` for development.

    taskport web          gunicorn serving the Flask app on $PORT
    taskport worker       one RQ worker (queues high, default, low)
    taskport scheduler    rq-scheduler (periodic housekeeping)
    taskport deliverer    one RQ worker on the callbacks queue only: it delivers the signed callbacks
    taskport up           all of the above under supervisor (restarted when they die), plus an embedded
                          Redis when REDIS_URL is unset (see app/launch/supervisor.py, docs/self-healing.md)
    taskport config       every setting's value in effect and where it came from (--defaults: the markdown table)
    taskport audit        the audit trail of task transitions (--task ID, --member M)
    taskport tokens rotate  a new secret for read tokens: every token minted so far stops counting

and the client commands (submit, status, result, cancel, retry, history, watch, schedules), whose home is
taskport/cli.py (the client distribution, clients/python). Its ``taskport`` console script runs this ``main``,
which pyproject.toml names in the ``taskport.cli`` entry-point group (taskport.cli.script).
"""

from __future__ import annotations

import argparse
import os
import pkgutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.sentinel import MasterNotFoundError

from app.core import audit, connection, processors, tokensecret
from app.core.config import Config, ConfigError
from app.core.logs import setup_logging
from app.core.process import port_in_use
from app.core.processors import ProcessorLoadError
from app.launch.embedded import EmbeddedRedis, EmbeddedRedisError
from taskport.cli import ERROR, INTERRUPTED, USAGE, add_global_options, output_closed
from taskport.cli import add_commands as add_client_commands

# gunicorn, chosen for a service whose requests are short except SSE streams (measured: bench/README.md,
# "Serving model"; documented: docs/streams.md):
# - gevent (default): a connection is a greenlet, so an open SSE stream, a slow client or an idle
#   keep-alive connection costs a few KiB, not one of a handful of threads; up to
#   TASKPORT_WEB_CONNECTIONS per process. gunicorn's gevent worker monkey-patches before the app is
#   imported; redis-py (hiredis included), prometheus_client and rq-dashboard run unchanged on it.
#   The worker class is app.web.webworker.GeventWorker: gunicorn's own, plus a socket timeout, with gunicorn's
#   per-request work trimmed (one write a response, the environ base made once: bench/README.md, "The
#   per-request floor"; gevent_pywsgi and gunicorn_h1c were weighed there).
# - gthread (TASKPORT_WEB_WORKER_CLASS=gthread, for comparison): a request holds a thread for its life.
#   The worker class is app.web.webworker.ThreadWorker: gunicorn's own, answering its own errors as problem+json.
# - --timeout is the worker's heartbeat from its main loop, not a request deadline (that loop keeps
#   beating while streams run), so gunicorn's 30 s stays: it restarts only a truly stuck worker.
# - --graceful-timeout 5: on SIGTERM in-flight requests get 5 s; an SSE stream never ends by itself,
#   so a longer grace only delays every deploy (and honcho SIGKILLs after 5 s anyway).
# - --keep-alive 5: pollers asked to come back in 1 s (Retry-After) find their connection still open.
#   Under gevent it is also the deadline for a whole request head (gunicorn's timeout_ctx), which
#   is what cuts a client trickling its headers a line at a time.
# - --reuse-port: one listening socket per worker, so a burst of connects spreads over all of them.
# - --no-control-socket: gunicorn 27 would otherwise create ~/.gunicorn/gunicorn.ctl.
GUNICORN_TIMEOUT = 30
GUNICORN_GRACEFUL_TIMEOUT = 5
GUNICORN_KEEPALIVE = 5
GUNICORN_GEVENT_WORKER = "app.web.webworker.GeventWorker"
GUNICORN_THREAD_WORKER = "app.web.webworker.ThreadWorker"
# Exit codes of every command (docs/deploy.md), from the one table of the taskport command (taskport.cli):
# 0 stopped on request; 1 a runtime failure (Redis unreachable, the embedded Redis or a process failed);
# 2 a configuration or usage error (argparse's own code too); 130 Ctrl-C.
EXIT_FAILURE, EXIT_CONFIG, EXIT_INTERRUPTED = ERROR, USAGE, INTERRUPTED
# The worker and the scheduler run the workers package, which imports this one: like the Procfile and
# gunicorn ("app.web:create_app()"), the CLI names their entry points and resolves them when the command
# runs, so no module of app imports workers (the packages depend one way: workers -> app).
ROLE_MAINS = {"worker": "workers.worker:main", "scheduler": "workers.scheduler:main",
              "deliverer": "workers.delivery:main"}
# The deliverer yields the CPU to the task processes (a nice value; it applies to its imports too): when
# every process starts at once (a restart, a deploy), the workers resuming tasks come first, a callback can
# wait a second (measured: on 2 cores, a worker's start after kill -9 of everything reached 5.6 s without it).
ROLE_NICENESS = {"deliverer": 10}

DESCRIPTION = ("every process of the Procfile (web, worker, scheduler, deliverer), `up` for development, and the "
               "client commands")


def web_command(config: Config) -> list[str]:
    """The gunicorn command line that ``taskport web`` execs."""
    return [
        sys.executable, "-m", "gunicorn", "app.web:create_app()",
        *_worker_flags(config),
        "--workers", str(config.web_concurrency),
        "--bind", f"{config.host}:{config.port}",
        "--reuse-port",
        "--no-control-socket",
        "--timeout", str(GUNICORN_TIMEOUT),
        "--graceful-timeout", str(GUNICORN_GRACEFUL_TIMEOUT),
        "--keep-alive", str(GUNICORN_KEEPALIVE),
        "--logger-class", "app.web.weblog.GunicornLogger",
        "--log-level", config.log_level_name.lower(),
    ]


def _worker_flags(config: Config) -> list[str]:
    if config.web_worker_class == "gthread":
        return ["--worker-class", GUNICORN_THREAD_WORKER, "--threads", str(config.web_threads)]
    return ["--worker-class", GUNICORN_GEVENT_WORKER, "--worker-connections", str(config.web_connections)]


def cmd_web(args: argparse.Namespace) -> int:
    """Replace this process with gunicorn (so signals and the pid are gunicorn's own)."""
    config = loaded_config()  # fail here, readably, on a bad environment
    # no connection yet: only refuses an unset REDIS_URL, which gunicorn would print as tracebacks
    connection.connect(config)
    host = config.local_host
    # gunicorn would retry, then its workers die with tracebacks. A web restarted after its master was
    # killed finds the old workers still serving their last requests: give them the grace they get.
    deadline = time.monotonic() + GUNICORN_GRACEFUL_TIMEOUT + 2
    while port_in_use(config.port, host):
        if time.monotonic() > deadline:
            raise ConfigError(f"PORT {config.port} is in use by another process: set PORT to a free one")
        time.sleep(0.2)
    command = web_command(config)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)
    return 0  # not reached


def cmd_role(args: argparse.Namespace) -> int:
    """Run the worker's, the scheduler's or the deliverer's ``main(config, name=)``, found by its name in
    ``ROLE_MAINS``, in this process: from here on its signal handling and its exit code are that main's."""
    os.nice(ROLE_NICENESS.get(args.command, 0))
    role_main = pkgutil.resolve_name(ROLE_MAINS[args.command])
    return int(role_main(loaded_config(), name=args.name))


def loaded_config() -> Config:
    """The environment's Config, its processor modules imported: a bad value, or a ``TASKPORT_PROCESSORS`` module
    that cannot be imported, is one line and exit 2 here, before anything connects or starts. Found later, in a
    gunicorn worker or a role under ``taskport up``, it was a traceback per restart until supervisor gave up."""
    config = Config.from_env()
    try:
        processors.load(config.processor_modules)
    except ProcessorLoadError as exc:
        if exc.name in config.processor_modules:
            raise ConfigError(f"TASKPORT_PROCESSORS: {exc}") from None
        raise
    return config


# What `taskport config` never prints: the secrets (shown as set or unset), and the secret parts of URLs.
SECRET_SETTINGS = frozenset({"api_keys", "dashboard_password", "redis_password", "redis_sentinel_password",
                             "callback_secrets"})
URL_SETTINGS = frozenset({"redis_url", "result_store"})  # a password in them is masked
SECRET_URL_SETTINGS = frozenset({"alert_webhook"})  # a webhook's path and query are its token: only its host shows
MASK = "********"
VALUE_WIDTH = 30  # the value column of `taskport config` (a longer value pushes its source along)


def cmd_config(args: argparse.Namespace) -> int:
    """Print every setting's value in effect and where it came from (environment or default), secrets masked;
    a bad value fails as every process fails on it (one line, exit 2). ``--defaults``: the markdown table of
    defaults, docs/configuration.md."""
    if args.defaults:
        return _print_defaults()
    config = Config.from_env()  # a bad value raises ConfigError: main prints it in one line, exit 2
    rows = effective_settings(config, os.environ)
    width = max(len(env) for env, _, _ in rows)
    for env, value, source in rows:
        print(f"{env:<{width}}  {value:<{VALUE_WIDTH}}  {source}")
    return 0


def effective_settings(config: Config, environ: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(variable, value in effect as printed, "environment" or "default") for every setting of ``config``."""
    rows = []
    for f in fields(config):
        env = f.metadata["env"]
        source = "environment" if environ.get(env) else "default"  # an empty variable counts as unset
        rows.append((env, _shown(f.name, getattr(config, f.name)), source))
    return rows


def _shown(name: str, value: Any) -> str:
    """A setting's value as ``taskport config`` prints it: secrets masked, (unset) for nothing."""
    if value is None or value == "":
        return "(unset)"
    if isinstance(value, bool):
        return "1" if value else "0"
    text = str(value)
    if name in SECRET_SETTINGS:
        return f"{MASK} (set)"
    if name in SECRET_URL_SETTINGS:
        parts = urlsplit(text)
        return f"{parts.scheme}://{parts.hostname or ''}/{MASK}" if parts.scheme else MASK
    if name in URL_SETTINGS:
        parts = urlsplit(text)
        if parts.password:
            return text.replace(f":{parts.password}@", f":{MASK}@", 1)
    return text


def _print_defaults() -> int:
    """Every setting as a markdown table: docs/configuration.md is this table."""
    print("| Variable | Default | Meaning |")
    print("| --- | --- | --- |")
    for env, default, doc in Config.describe():
        shown = f"`{default}`" if default not in ("", "None") else "(unset)"
        meaning = doc.replace("|", "\\|")
        print(f"| `{env}` | {shown} | {meaning} |")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    """Run web, workers and scheduler under supervisor, with an embedded Redis unless REDIS_URL is set."""
    from app.launch.supervisor import Launcher

    config = loaded_config()
    config = replace(config, data_dir=Path(config.data_dir).resolve())
    setup_logging(config, "up")
    if port_in_use(config.port):
        raise ConfigError(f"PORT {config.port} is in use by another process: set PORT to a free one")
    return Launcher(config).run()


def add_audit_command(sub: Any) -> None:
    """Register ``taskport audit`` on the CLI's subparsers."""
    p = sub.add_parser("audit", help="print the audit trail of task transitions, newest first")
    p.add_argument("--task", help="only this task id")
    p.add_argument("--member", help="only this member's tasks")
    p.add_argument("--limit", type=int, default=100, help="at most this many entries (default 100)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(run=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    """``taskport audit``: print the audit stream (app.core.audit reads it) of the Redis in REDIS_URL (or behind
    REDIS_SENTINELS), else of the embedded one ``taskport up`` runs on the data dir (TASKPORT_DATA_DIR)."""
    config = _operator_config()
    if config is None:
        return EXIT_FAILURE
    limit = max(1, min(args.limit, audit.MAX_LIMIT))
    try:
        page = audit.read(connection.connect(config), task_id=args.task, member=args.member, limit=limit)
    except MasterNotFoundError:
        print(f"taskport: error: the Sentinels name no primary for {config.redis_sentinel_master}", file=sys.stderr)
        return EXIT_FAILURE
    except RedisConnectionError as exc:
        print(f"taskport: error: Redis unreachable: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    for e in page.entries:
        print(orjson.dumps(e).decode() if args.json else _audit_line(e))
    if page.next_cursor:
        print("(more: older entries exist; narrow with --task/--member or raise --limit)", file=sys.stderr)
    return 0


def _operator_config() -> Config | None:
    """The Config of an operator command that talks to Redis itself: REDIS_URL (or REDIS_SENTINELS), else the
    embedded Redis ``taskport up`` runs on the data dir (TASKPORT_DATA_DIR); None (said on stderr) when none runs."""
    config = Config.from_env()
    if not config.external_redis:
        embedded = EmbeddedRedis(config)
        if not embedded.socket.exists():
            print(f"taskport: error: no embedded Redis runs in {embedded.dir}: run this where `taskport up` runs (or "
                  "set TASKPORT_DATA_DIR to its data dir), or set REDIS_URL to the service's Redis", file=sys.stderr)
            return None
        config = replace(config, redis_url=embedded.url)
    return config


def add_tokens_command(sub: Any) -> None:
    """Register ``taskport tokens rotate`` on the CLI's subparsers."""
    p = sub.add_parser("tokens", help="read tokens (operators): rotate their secret")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("rotate", help="replace the secret kept in Redis: every read token minted so far stops "
                                      "counting").set_defaults(run=cmd_tokens_rotate)


def cmd_tokens_rotate(args: argparse.Namespace) -> int:
    """``taskport tokens rotate``: a new stored secret (app.web.tokens.rotate); every web process takes it within
    SECRET_RECHECK seconds. TASKPORT_TOKEN_SECRET, when set, wins over the stored one: say so."""
    config = _operator_config()
    if config is None:
        return EXIT_FAILURE
    tokensecret.rotate(connection.connect(config))
    print(f"rotated: every web process refuses the read tokens minted before now within {tokensecret.RECHECK:g} s")
    if config.token_secret:
        print("taskport: note: TASKPORT_TOKEN_SECRET is set here, and where it is set it wins over the stored secret: "
              "web processes that have it keep their tokens; change that variable (and restart them) instead",
              file=sys.stderr)
    return 0


def _audit_line(e: dict[str, Any]) -> str:
    code = "" if e["error_code"] is None else f" code={e['error_code']}"
    payload = "" if e["payload_sha256"] is None else f" payload={e['payload_sha256']}"
    return (f"{e['at']} {e['task_id']} {e['member']} {e['type']} {e['from'] or '-'} -> {e['to']}"
            f" attempt={e['attempt']}{code}{payload}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taskport", description=DESCRIPTION)
    add_global_options(parser)  # --url, --api-key of the client commands, also before the command
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("web", help="serve the HTTP API with gunicorn on $PORT").set_defaults(run=cmd_web)
    for role, what in (("worker", "one RQ worker"), ("scheduler", "rq-scheduler"),
                       ("deliverer", "the callback deliverer (an RQ worker on the callbacks queue)")):
        p = sub.add_parser(role, help=f"run {what}")
        p.add_argument("--name", help="its name in Redis (default: random)")
        p.set_defaults(run=cmd_role)
    sub.add_parser("up", help="run everything locally (embedded Redis unless REDIS_URL is set)").set_defaults(
        run=cmd_up)
    p = sub.add_parser("config", help="print every setting's value in effect and where it came from")
    p.add_argument("--defaults", action="store_true", help="print the defaults as a markdown table instead")
    p.set_defaults(run=cmd_config)
    add_client_commands(sub)  # submit, status, result, cancel, retry, history, watch, schedules
    add_audit_command(sub)
    add_tokens_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``taskport`` console script and of ``python -m app.launch.cli``."""
    try:
        args = build_parser().parse_args(argv)  # --help writes too
        return int(args.run(args))
    except (ConfigError, EmbeddedRedisError, RedisError, ProcessorLoadError) as exc:
        # A known condition is one line, never a traceback; the exit codes are in docs/deploy.md.
        print(f"taskport: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_CONFIG if isinstance(exc, ConfigError) else EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return output_closed()


def _one_line(exc: Exception) -> str:
    if isinstance(exc, RedisConnectionError):
        return f"Redis is unreachable ({exc}): check REDIS_URL and that Redis runs"
    if isinstance(exc, RedisError):
        return f"Redis answered with an error: {exc}"
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
