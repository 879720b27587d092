"""``taskport batch submit|status|tasks|watch|cancel``: many tasks as one batch, from the shell.

The calls are :class:`taskport.batches.BatchCalls` (``/api/v1/batches``); the error handling and the exit codes
are those of every client command (``taskport.cli``). A batch's state maps onto them as its worst task's:

     0  DONE, every task COMPLETED with no failed item
     3  DONE, no task FAILED, EXPIRED or CANCELLED, but some items failed
     4  DONE, a task FAILED              6  DONE, a task EXPIRED (none FAILED)
     5  DONE, a task was CANCELLED (none FAILED or EXPIRED)
     7  still RUNNING (``status``, or ``watch``/``submit --wait`` at --timeout / --max-attempts)

``submit`` reads the batch from a file or ``-`` (standard input) as the body of ``POST /api/v1/batches``:
``{"tasks": [{"type", "payload", ...}, ...], "then": {...}, "callback": {...}}``. It also provides the callback
options of a single submit (:func:`add_callback_options`, :func:`callback_of`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taskport.batches import DONE
from taskport.cli import (
    CANCELLED,
    EXPIRED,
    FAILED,
    OK,
    PARTIAL,
    STATUSES,
    STILL_RUNNING,
    UsageError,
    _command,
    _positive,
    _print_json,
)
from taskport.states import ACTIVE, STORED, TaskStatus

if TYPE_CHECKING:
    from rich.console import Console

    from taskport.client import Client

Doc = dict[str, Any]
EVENTS = tuple(s.value for s in TaskStatus if s in STORED - ACTIVE)  # what a callback may be sent for
BODY_FIELDS = ("tasks", "then", "callback")  # what a batch file may hold (the body of POST /batches)
WORST = ((TaskStatus.FAILED, FAILED), (TaskStatus.EXPIRED, EXPIRED), (TaskStatus.CANCELLED, CANCELLED))


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``batch`` and its subcommands to ``sub``; ``common`` carries --url, --api-key and --json."""
    top = sub.add_parser("batch", help="many tasks as one: submit, status, tasks, watch, cancel")
    bsub = top.add_subparsers(dest="batch_command", required=True, metavar="COMMAND")
    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--timeout", type=_positive(float), metavar="SECONDS", help="stop watching after this long")
    waiting.add_argument("--max-attempts", type=_positive(int), metavar="N",
                         help="stop watching after N status reads or stream connections")

    p = bsub.add_parser("submit", parents=[common, waiting], help="submit a batch read from FILE (or - for stdin)")
    p.add_argument("file", metavar="FILE", help='a JSON file {"tasks": [...], "then": {...}, "callback": {...}}, or -')
    p.add_argument("--wait", action="store_true", help="follow the batch with a progress bar until it is DONE")
    add_callback_options(p, "POST the batch document here once it is DONE (instead of the file's callback)",
                         events=False)
    p.set_defaults(run=_command(cmd_submit))

    p = bsub.add_parser("status", parents=[common], help="a batch's document: counts, progress, its then task")
    p.add_argument("batch_id", metavar="ID")
    p.set_defaults(run=_command(cmd_status))

    p = bsub.add_parser("tasks", parents=[common], help="a batch's tasks in submit order")
    p.add_argument("batch_id", metavar="ID")
    p.add_argument("--status", choices=STATUSES, type=str.upper, help="only the tasks in this status")
    p.add_argument("--limit", type=_positive(int), default=1000, help="at most this many tasks (default 1000)")
    p.set_defaults(run=_command(cmd_tasks))

    p = bsub.add_parser("watch", parents=[common, waiting], help="follow a batch with a progress bar until DONE")
    p.add_argument("batch_id", metavar="ID")
    p.set_defaults(run=_command(cmd_watch))

    p = bsub.add_parser("cancel", parents=[common], help="cancel a batch's unfinished tasks and its then task")
    p.add_argument("batch_id", metavar="ID")
    p.set_defaults(run=_command(cmd_cancel))


def add_callback_options(parser: argparse.ArgumentParser, text: str = "", events: bool = True) -> None:
    """``--callback-url URL [--callback-event S ...]``: where the service POSTs the document, signed (a batch's
    callback is sent once, when it is DONE: ``events`` False leaves --callback-event out)."""
    parser.add_argument("--callback-url", metavar="URL", help=text or "POST the status document here when it ends")
    parser.set_defaults(callback_event=None)
    if events:
        parser.add_argument("--callback-event", action="append", choices=EVENTS, type=str.upper, metavar="S",
                            help=f"only for this status (repeat for several; default all of {', '.join(EVENTS)})")


def callback_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``callback`` the options ask for, or None; --callback-event without --callback-url is a usage error."""
    if args.callback_url is None:
        if args.callback_event:
            raise UsageError("--callback-event needs --callback-url")
        return None
    callback: dict[str, Any] = {"url": args.callback_url}
    if args.callback_event:
        callback["events"] = list(dict.fromkeys(args.callback_event))
    return callback


def batch_exit_code(doc: Doc) -> int:
    """The exit code of a batch document (see the module docstring)."""
    if doc.get("status") != DONE:
        return STILL_RUNNING
    counts = doc.get("counts") or {}
    for status, code in WORST:
        if counts.get(status):
            return code
    return PARTIAL if (doc.get("items") or {}).get("failed") else OK


# -- the commands ----------------------------------------------------------------------------------

def cmd_submit(client: Client, args: argparse.Namespace, err: Console) -> int:
    body = read_body(args.file)
    callback = callback_of(args)
    doc = client.submit_batch(body["tasks"], then=body.get("then"),
                              callback=callback if callback is not None else body.get("callback"))
    if not args.wait:
        _print_json(doc) if args.json else print(doc["batch_id"])
        if not args.json:
            err.print(submitted(doc), markup=False, soft_wrap=True)
        return OK
    if not args.json:
        err.print(submitted(doc), markup=False, soft_wrap=True)
    return _watch(client, doc["batch_id"], args, err)


def cmd_status(client: Client, args: argparse.Namespace, err: Console) -> int:
    doc = client.batch(args.batch_id)
    if args.json:
        _print_json(doc)
    else:
        from taskport import render

        render.batch(doc)
    return batch_exit_code(doc)


def cmd_tasks(client: Client, args: argparse.Namespace, err: Console) -> int:
    docs = list(itertools.islice(client.batch_tasks(args.batch_id, args.status, page_size=min(args.limit, 200)),
                                 args.limit))
    if args.json:
        _print_json(docs)
    else:
        from taskport import render

        render.history(docs)
    return OK


def cmd_watch(client: Client, args: argparse.Namespace, err: Console) -> int:
    return _watch(client, args.batch_id, args, err)


def cmd_cancel(client: Client, args: argparse.Namespace, err: Console) -> int:
    client.cancel_batch(args.batch_id)
    _print_json({"batch_id": args.batch_id, "cancelled": True}) if args.json else print(
        f"cancelled batch {args.batch_id}")
    return OK


def _watch(client: Client, batch_id: str, args: argparse.Namespace, err: Console) -> int:
    """Follow the batch (a progress bar on stderr unless --json) until DONE, then print its document."""
    from taskport import render

    docs = client.watch_batch(batch_id, timeout=args.timeout, max_attempts=args.max_attempts)
    last = None
    if args.json:
        for last in docs:  # noqa: B007 - only the last one matters
            pass
    else:
        last = render.batch_progress(docs, err)
    assert last is not None  # watch_batch yields at least one document or raises
    _print_json(last) if args.json else render.batch(last)
    return batch_exit_code(last)


# -- the batch file --------------------------------------------------------------------------------

def read_body(source: str) -> Doc:
    """The batch body from ``source`` (a path, or ``-`` for standard input): a JSON object of BODY_FIELDS whose
    ``tasks`` is a list. What is wrong with it is a usage error, before any request."""
    name = "standard input" if source == "-" else source
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror}") from None
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise UsageError(f'{name} must be a JSON object: {{"tasks": [...], "then": {{...}}, "callback": {{...}}}}')
    unknown = sorted(set(body) - set(BODY_FIELDS))
    if unknown:
        fields = ", ".join(map(repr, unknown))
        raise UsageError(f"{name}: unknown field {fields} (a batch has {', '.join(BODY_FIELDS)})")
    if not isinstance(body.get("tasks"), list):
        raise UsageError(f'{name}: "tasks" must be a list of tasks ({{"type": ..., "payload": {{...}}}})')
    return body


def submitted(doc: Doc) -> str:
    """``submitted batch ID: 20 tasks (1 duplicate), then TASK_ID``."""
    entries = doc.get("tasks") or []
    duplicates = sum(1 for entry in entries if entry.get("duplicate"))
    text = f"submitted batch {doc['batch_id']}: {doc['size']} task{'' if doc['size'] == 1 else 's'}"
    if duplicates:
        text += f" ({duplicates} already submitted: {'that task' if duplicates == 1 else 'those tasks'} counted)"
    if doc.get("then_task_id"):
        text += f", then {doc['then_task_id']}"
    return text
