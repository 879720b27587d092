"""The client commands of the ``taskport`` CLI: submit, status, result, cancel, retry, history, watch and
schedules.

They run on :class:`taskport.client.Client` against ``TASKPORT_URL`` with ``TASKPORT_API_KEY`` (or
``--url``/``--api-key``, before the command or after it: :func:`add_global_options`). ``app.launch.cli``
registers them beside the server commands (``add_commands``); ``python -m taskport`` runs them on their own,
without the server's packages.

``pause QUEUE`` / ``resume QUEUE`` are the operator's: they call the operator API (app.web.api.operator) with
the dashboard's HTTP Basic credentials, the password asked for on the terminal or read from stdin.

Exit codes (a shell can branch on them; the same for every command that reports a task's state). This is
their one home: the server commands of ``app.launch.cli`` use 0, 1 (a runtime failure), 2 (a configuration
or usage error) and 130 from here.

     0  done: the task COMPLETED with no failed item (or the request succeeded)
     1  error: the service is unreachable or answered an error (unknown task, bad API key, 5xx)
     2  usage error: bad arguments, or the service rejected the request as invalid (400/413/415/422)
     3  the task COMPLETED with failed items (partial failure: see its error_code and failures)
     4  the task FAILED (its error code and message are printed)
     5  the task was CANCELLED
     6  the task EXPIRED
     7  still running: the task had not ended at --timeout / --max-attempts (or was not asked to wait)
   130  interrupted (Ctrl-C)

Status and queue names come from :mod:`taskport.states`, the client's copy of the service's table of them.

The ``taskport`` console script is this distribution's (taskport-client): :func:`script`. Where the service's
distribution is installed too, it runs the service's whole CLI instead (up, web, worker... and these commands).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taskport.states import QUEUES, STORED, TaskStatus

if TYPE_CHECKING:
    from rich.console import Console

    from taskport.client import Client

OK, ERROR, USAGE, PARTIAL, FAILED, CANCELLED, EXPIRED, STILL_RUNNING = range(8)
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports an interrupted command
PIPE_CLOSED = 141  # 128 + SIGPIPE: what reads our output went away (`| head`), as a shell reports it
STATE_EXIT: dict[str, int] = {
    TaskStatus.FAILED: FAILED, TaskStatus.CANCELLED: CANCELLED, TaskStatus.EXPIRED: EXPIRED,
    TaskStatus.PENDING: STILL_RUNNING, TaskStatus.PROCESSING: STILL_RUNNING,
}
COMMANDS = ("submit", "status", "result", "cancel", "retry", "history", "watch", "schedules", "batch", "pause",
            "resume")
STATUSES = tuple(s.value for s in TaskStatus if s in STORED)  # what a task can be (history --status)
# The service's default operator user (its TASKPORT_DASHBOARD_USER); tests/unit/test_operator_cli.py keeps the two
# equal (this package may not import the server's Config).
OPERATOR_USER = "admin"
URL_HELP = "the service's base URL (default: $TASKPORT_URL or http://127.0.0.1:8000)"
API_KEY_HELP = "API key (default: $TASKPORT_API_KEY)"


class UsageError(Exception):
    """A bad argument found after parsing (e.g. --payload that is not JSON): exit 2."""


def exit_code(doc: dict[str, Any]) -> int:
    """The exit code of a status or result document (see the module docstring)."""
    if doc.get("status") == TaskStatus.COMPLETED:
        return PARTIAL if ((doc.get("items") or {}).get("failed") or doc.get("failures")) else OK
    return STATE_EXIT.get(str(doc.get("status")), ERROR)


# -- the parser ------------------------------------------------------------------------------------

def add_global_options(parser: argparse.ArgumentParser) -> None:
    """``--url`` and ``--api-key`` on the top-level ``parser``, so they may come before the command as well as
    after it (the commands' own copies leave a value given before untouched: ``argparse.SUPPRESS``)."""
    parser.add_argument("--url", default=None, help=URL_HELP)
    parser.add_argument("--api-key", default=None, help=API_KEY_HELP)


def add_commands(sub: Any) -> None:
    """Add the client commands to ``sub`` (an argparse subparsers action)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help=URL_HELP)
    common.add_argument("--api-key", default=argparse.SUPPRESS, help=API_KEY_HELP)
    common.add_argument("--json", action="store_true", help="print JSON documents only (for scripts)")
    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--timeout", type=_positive(float), metavar="SECONDS", help="stop waiting after this long")
    waiting.add_argument("--max-attempts", type=_positive(int), metavar="N",
                         help="stop waiting after N status reads or event-stream connections (one stream may "
                              "follow a task to its end: --timeout bounds the time)")

    from taskport import batches_cli, schedules_cli  # here: they import this module

    p = sub.add_parser("submit", parents=[common, waiting], help="submit a task (and --wait for it)")
    p.add_argument("type", help="the task type, e.g. orders.split")
    p.add_argument("--payload", default="{}", help="the payload: JSON text, or @FILE to read it from a file")
    p.add_argument("--wait", action="store_true",
                   help="follow the task with a progress bar (and its output lines) until it ends")
    p.add_argument("--idempotency-key", metavar="K", help="dedup key: a repeat within the window is a duplicate")
    p.add_argument("--priority", choices=QUEUES, help="queue (default: the type's own)")
    later = p.add_mutually_exclusive_group()
    later.add_argument("--delay", type=_positive(float), metavar="SECONDS", help="run it this many seconds from now")
    later.add_argument("--run-at", metavar="TIME", help="run it at this ISO 8601 time, e.g. 2026-11-29T02:00:00Z")
    p.add_argument("--after", action="append", metavar="ID",
                   help="run it once task ID COMPLETED (repeat for several); FAILED -6 if it ends otherwise")
    batches_cli.add_callback_options(p)
    p.set_defaults(run=_command(cmd_submit))

    p = sub.add_parser("status", parents=[common], help="a task's status")
    p.add_argument("task_id", metavar="ID")
    p.set_defaults(run=_command(cmd_status))

    p = sub.add_parser("result", parents=[common], help="a task's result (and its file with --output)")
    p.add_argument("task_id", metavar="ID")
    p.add_argument("--output", "-o", metavar="FILE", help="save the result file here (a directory keeps its name)")
    p.set_defaults(run=_command(cmd_result))

    p = sub.add_parser("cancel", parents=[common], help="cancel a pending or running task")
    p.add_argument("task_id", metavar="ID")
    p.set_defaults(run=_command(cmd_cancel))

    p = sub.add_parser("retry", parents=[common, waiting], help="run a failed or cancelled task again (same id)")
    p.add_argument("task_id", metavar="ID")
    p.add_argument("--wait", action="store_true", help="follow the task with a progress bar until it ends")
    p.set_defaults(run=_command(cmd_retry))

    p = sub.add_parser("history", parents=[common], help="your tasks, newest first")
    p.add_argument("--status", choices=STATUSES, type=str.upper)
    p.add_argument("--type", dest="task_type", metavar="TYPE")
    p.add_argument("--limit", type=_positive(int), default=20, help="at most this many tasks (default 20)")
    p.set_defaults(run=_command(cmd_history))

    p = sub.add_parser("watch", parents=[common, waiting], help="follow a task with a progress bar until it ends")
    p.add_argument("task_id", metavar="ID")
    p.set_defaults(run=_command(cmd_watch))

    schedules_cli.add_commands(sub, common)
    batches_cli.add_commands(sub, common)
    add_operator_commands(sub, common)


def add_operator_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """``pause QUEUE`` and ``resume QUEUE``: the operator API, with the operator's credentials."""
    for name, fn, text in (
            ("pause", cmd_pause, "pause a queue: no worker takes its jobs until it is resumed (operators)"),
            ("resume", cmd_resume, "resume a paused queue (operators)")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("queue", choices=QUEUES)
        p.add_argument("--user", default=OPERATOR_USER,
                       help=f"operator user, the service's TASKPORT_DASHBOARD_USER (default {OPERATOR_USER})")
        p.add_argument("--password-stdin", action="store_true",
                       help="read the operator password from stdin (else it is asked for on the terminal)")
        p.set_defaults(run=_command(fn))


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
        return value

    return parse


def _command(fn: Callable[[Client, argparse.Namespace, Console], int]) -> Callable[[argparse.Namespace], int]:
    """Run ``fn`` with a client and a console; turn every known error into one line and its exit code."""

    def run(args: argparse.Namespace) -> int:
        from rich.console import Console

        from taskport import errors
        from taskport.client import Client

        err = Console(stderr=True, highlight=False)
        try:
            with Client(getattr(args, "url", None), getattr(args, "api_key", None)) as client:
                return fn(client, args, err)
        except UsageError as exc:
            return _fail(err, str(exc), USAGE)
        except errors.InvalidRequest as exc:
            return _fail(err, exc.describe(), USAGE)
        except errors.StillRunning as exc:
            return _fail(err, str(exc), STILL_RUNNING, "taskport")
        except errors.TaskEnded as exc:
            return _fail(err, str(exc), STATE_EXIT[exc.status], "taskport")
        except errors.TaskportError as exc:
            return _fail(err, str(exc), ERROR)

    return run


def _fail(err: Console, text: str, code: int, prefix: str = "taskport: error") -> int:
    err.print(f"{prefix}: {text}", markup=False, soft_wrap=True)
    return code


# -- the commands ----------------------------------------------------------------------------------

def cmd_submit(client: Client, args: argparse.Namespace, err: Console) -> int:
    from taskport import batches_cli
    from taskport.errors import DuplicateTask

    payload = _payload(args.payload)
    try:
        doc = client.submit(args.type, payload, idempotency_key=args.idempotency_key, priority=args.priority,
                            run_at=args.run_at, delay=args.delay, after=args.after,
                            callback=batches_cli.callback_of(args))
    except DuplicateTask as exc:
        doc = exc.existing
        err.print(f"duplicate: following the task submitted earlier, {exc.task_id}", markup=False)
    if not args.wait:
        _print_json(doc) if args.json else print(doc["task_id"])
        return OK
    if not args.json:
        err.print(f"submitted {doc['task_id']} ({doc['type']})", markup=False)
    return _follow(client, doc["task_id"], args, err)


def cmd_watch(client: Client, args: argparse.Namespace, err: Console) -> int:
    return _follow(client, args.task_id, args, err)


def cmd_status(client: Client, args: argparse.Namespace, err: Console) -> int:
    doc = client.status(args.task_id)
    if args.json:
        _print_json(doc)
    else:
        from taskport import render

        render.status(doc)
    return exit_code(doc)


def cmd_result(client: Client, args: argparse.Namespace, err: Console) -> int:
    result = client.result(args.task_id)
    saved = client.download(args.task_id, args.output) if args.output else None
    if args.json:
        _print_json(result)
    else:
        from taskport import render

        render.result(result)
    if saved is not None:
        err.print(f"saved {saved}", markup=False)
    return exit_code(result)


def cmd_cancel(client: Client, args: argparse.Namespace, err: Console) -> int:
    client.cancel(args.task_id)
    if args.json:
        _print_json({"task_id": args.task_id, "cancelled": True})
    else:
        print(f"cancelled {args.task_id}")
    return OK


def cmd_retry(client: Client, args: argparse.Namespace, err: Console) -> int:
    doc = client.retry(args.task_id)
    if not args.wait:
        _print_json(doc) if args.json else print(f"queued again {args.task_id} (attempts so far: {doc['attempts']})")
        return OK
    if not args.json:
        err.print(f"queued again {args.task_id} ({doc['type']})", markup=False)
    return _follow(client, args.task_id, args, err)


def cmd_history(client: Client, args: argparse.Namespace, err: Console) -> int:
    import itertools

    docs = list(itertools.islice(client.history(status=args.status, type=args.task_type,
                                                page_size=min(args.limit, 200)), args.limit))
    if args.json:
        _print_json(docs)
    else:
        from taskport import render

        render.history(docs)
    return OK


def cmd_pause(client: Client, args: argparse.Namespace, err: Console) -> int:
    return _queue_action(client, args, "pause")


def cmd_resume(client: Client, args: argparse.Namespace, err: Console) -> int:
    return _queue_action(client, args, "resume")


def _queue_action(client: Client, args: argparse.Namespace, action: str) -> int:
    """POST the operator API's ``/queues/QUEUE/<action>`` and say what it answered."""
    doc = _operator_post(client.url, args.user, _operator_password(args), f"/queues/{args.queue}/{action}")
    if args.json:
        _print_json(doc)
    elif doc["paused"]:
        print(f"paused {args.queue}: no worker takes its jobs until `taskport resume {args.queue}` "
              "(running ones finish, submits still queue there)")
    else:
        print(f"resumed {args.queue}")
    return OK


def _operator_password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    if sys.stdin.isatty():
        return getpass.getpass(f"operator password for {args.user}: ")
    raise UsageError("the operator password is needed: give it on stdin with --password-stdin")


def _operator_post(url: str, user: str, password: str, path: str) -> dict[str, Any]:
    """POST ``path`` of the API with HTTP Basic credentials; the answer's JSON, or the client's errors."""
    import httpx

    from taskport.client import API
    from taskport.errors import ServiceUnreachable, problem_class

    try:
        response = httpx.post(f"{url}{API}{path}", auth=(user, password), timeout=10.0,
                              headers={"Accept": "application/json", "User-Agent": "taskport-client"})
    except httpx.TransportError as exc:
        raise ServiceUnreachable(f"no answer from {url}: {type(exc).__name__}: {exc}") from None
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code >= 400:
        raise problem_class(response.status_code)(response.status_code, body if isinstance(body, dict) else None)
    return dict(body)


def _follow(client: Client, task_id: str, args: argparse.Namespace, err: Console) -> int:
    """Follow the task (a progress bar on stderr, the task's output lines with it, unless --json), then print its
    outcome."""
    from taskport import render

    on_output = None if args.json else lambda line: render.output_line(line, err)  # the task's output, as it comes
    follow = client.follow(task_id, timeout=args.timeout, max_attempts=args.max_attempts, on_output=on_output)
    last = _last(follow) if args.json else render.progress(follow, err)
    assert last is not None  # follow yields at least one document or raises
    if last["status"] != TaskStatus.COMPLETED:
        if args.json:
            _print_json(last)
        else:
            render.ended(last, err)
        return exit_code(last)
    result = client.result(task_id)
    if args.json:
        _print_json(result)
    else:
        render.result(result)
    return exit_code(result)


def _last(docs: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    last = None
    for last in docs:  # noqa: B007 - only the last one matters
        pass
    return last


def _payload(text: str) -> dict[str, Any]:
    """``--payload``: JSON text or ``@file``; must be a JSON object."""
    source = "--payload"
    if text.startswith("@"):
        source = text[1:]
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--payload: cannot read {source}: {exc.strerror}") from None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{source} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{source} must be a JSON object")
    return value


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m taskport COMMAND ...``: the client commands alone."""
    parser = argparse.ArgumentParser(prog="taskport", description="taskport client")
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_commands(sub)
    try:
        args = parser.parse_args(argv)  # --help writes too
        return int(args.run(args))
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:
        return output_closed()


# The entry-point group where the service's distribution names its CLI (pyproject.toml at the repository's root).
SERVICE_CLI_GROUP = "taskport.cli"


def script() -> int:
    """The ``taskport`` console script. Two distributions may not both install one ``bin/taskport`` (the last
    install would win, and uninstalling either would remove it), so only this one declares it, and the service's
    distribution names its own CLI (``app.launch.cli:main``: these commands and the server's) in the
    ``taskport.cli`` entry-point group. Where one is found, it runs; alone, the client commands do."""
    from importlib.metadata import entry_points

    service = next(iter(entry_points(group=SERVICE_CLI_GROUP, name="service")), None)
    return int(service.load()()) if service is not None else main()


def output_closed() -> int:
    """What reads stdout went away (``taskport history --json | head``): no traceback, and none at exit either
    (Python flushes stdout at exit: it goes to /dev/null instead, as the Python docs advise)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return PIPE_CLOSED
