"""The ``taskport`` command: one entry point for every process of the Procfile, and ``up`` for development.

    taskport web          gunicorn serving the Flask app on $PORT
    taskport worker       one RQ worker (queues high, default, low)
    taskport scheduler    rq-scheduler (periodic housekeeping)
    taskport up           all of the above under supervisor (restarted when they die), plus an embedded
                          Redis when REDIS_URL is unset (see app/supervisor.py, docs/self-healing.md)
    taskport config       the configuration table (markdown)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from app.config import Config, ConfigError
from app.embedded import EmbeddedRedisError, port_in_use
from app.logs import setup_logging
from workers.exceptions import ProcessorLoadError

# gunicorn, chosen for a service whose requests are short except SSE streams:
# - gthread: a request holds a thread, not a process, so an SSE stream costs one thread and pollers
#   are still served by the others; idle keep-alive connections wait in the poller and hold no thread.
# - --timeout is the worker's heartbeat from its main loop, not a request deadline (that loop keeps
#   beating while threads stream), so gunicorn's 30 s stays: it restarts only a truly stuck worker.
# - --graceful-timeout 5: on SIGTERM in-flight requests get 5 s; an SSE stream never ends by itself,
#   so a longer grace only delays every deploy (and honcho SIGKILLs after 5 s anyway).
# - --keep-alive 5: pollers asked to come back in 1 s (Retry-After) find their connection still open.
# - --reuse-port: one listening socket per worker, so a burst of connects spreads over all of them.
# - --no-control-socket: gunicorn 27 would otherwise create ~/.gunicorn/gunicorn.ctl.
GUNICORN_TIMEOUT = 30
GUNICORN_GRACEFUL_TIMEOUT = 5
GUNICORN_KEEPALIVE = 5


def web_command(config: Config) -> list[str]:
    """The gunicorn command line that ``taskport web`` execs."""
    level = logging.getLevelName(logging.getLevelNamesMapping().get(config.log_level.upper(), logging.INFO))
    return [
        sys.executable, "-m", "gunicorn", "app:create_app()",
        "--worker-class", "gthread",
        "--workers", str(config.web_concurrency),
        "--threads", str(config.web_threads),
        "--bind", f"{config.host}:{config.port}",
        "--reuse-port",
        "--no-control-socket",
        "--timeout", str(GUNICORN_TIMEOUT),
        "--graceful-timeout", str(GUNICORN_GRACEFUL_TIMEOUT),
        "--keep-alive", str(GUNICORN_KEEPALIVE),
        "--logger-class", "app.weblog.GunicornLogger",
        "--log-level", level.lower(),
    ]


def cmd_web(args: argparse.Namespace) -> int:
    """Replace this process with gunicorn (so signals and the pid are gunicorn's own)."""
    command = web_command(Config.from_env())  # fail here, readably, on a bad environment
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)
    return 0  # not reached


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.worker import main as worker_main

    return worker_main(Config.from_env(), name=args.name)


def cmd_scheduler(args: argparse.Namespace) -> int:
    from workers.scheduler import main as scheduler_main

    return scheduler_main(Config.from_env(), name=args.name)


def cmd_config(args: argparse.Namespace) -> int:
    """Print every setting as a markdown table (the README's configuration section)."""
    print("| Variable | Default | Meaning |")
    print("| --- | --- | --- |")
    for env, default, doc in Config.describe():
        shown = f"`{default}`" if default not in ("", "None") else "(unset)"
        meaning = doc.replace("|", "\\|")
        print(f"| `{env}` | {shown} | {meaning} |")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    """Run web, workers and scheduler under supervisor, with an embedded Redis unless REDIS_URL is set."""
    from app.supervisor import Launcher

    config = Config.from_env()
    config = replace(config, data_dir=Path(config.data_dir).resolve())
    setup_logging(config, "up")
    if port_in_use(config.port):
        raise ConfigError(f"PORT {config.port} is in use by another process: set PORT to a free one")
    return Launcher(config).run()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taskport", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("web", help="serve the HTTP API with gunicorn on $PORT").set_defaults(run=cmd_web)
    for role, run, what in (("worker", cmd_worker, "one RQ worker"), ("scheduler", cmd_scheduler, "rq-scheduler")):
        p = sub.add_parser(role, help=f"run {what}")
        p.add_argument("--name", help="its name in Redis (default: random)")
        p.set_defaults(run=run)
    sub.add_parser("up", help="run everything locally (embedded Redis unless REDIS_URL is set)").set_defaults(
        run=cmd_up)
    sub.add_parser("config", help="print the configuration table as markdown").set_defaults(run=cmd_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``taskport`` console script and of ``python -m app.cli``."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except (ConfigError, EmbeddedRedisError, ProcessorLoadError) as exc:
        print(f"taskport: error: {exc}", file=sys.stderr)  # a known condition: one line, no traceback
        return 2 if isinstance(exc, ConfigError) else 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
