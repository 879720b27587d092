"""``taskport schedules create|list|show|pause|resume|delete``: periodic schedules from the shell.

The calls are :class:`taskport.schedules.ScheduleCalls` (``/api/v1/schedules``); the error handling and the
exit codes are those of every client command (``taskport.cli``: 0 done, 1 an error answer such as an unknown
id or the cap's 429, 2 a bad cron, time zone or task). ``taskport.cli.add_commands`` registers them, so
both ``taskport`` and ``python -m taskport`` have them.
"""

from __future__ import annotations

import argparse
import itertools
from typing import TYPE_CHECKING, Any

from taskport.cli import OK, UsageError, _command, _payload, _positive, _print_json
from taskport.states import QUEUES

if TYPE_CHECKING:
    from rich.console import Console

    from taskport.client import Client

Doc = dict[str, Any]


def add_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``schedules`` and its subcommands to ``sub``; ``common`` carries --url, --api-key and --json."""
    top = sub.add_parser("schedules", help="periodic schedules: create, list, show, pause, resume, delete")
    ssub = top.add_subparsers(dest="schedules_command", required=True, metavar="COMMAND")

    p = ssub.add_parser("create", parents=[common], help="create a schedule: a task of TYPE at each fire time")
    p.add_argument("--cron", required=True, metavar="EXPR", help="5-field cron, e.g. '*/15 * * * *'")
    p.add_argument("--timezone", metavar="TZ", help="IANA time zone the cron is read in (default UTC)")
    p.add_argument("--name", metavar="N", help="a name of your own (at most 100 characters)")
    p.add_argument("--priority", choices=QUEUES, help="queue of its tasks (default: the type's own)")
    p.add_argument("--paused", action="store_true", help="create it paused (resume it later)")
    p.add_argument("type", help="the task type, e.g. orders.export")
    p.add_argument("payload", nargs="?", default="{}", metavar="PAYLOAD_JSON",
                   help="the task's payload: JSON text, or @FILE (default {})")
    p.set_defaults(run=_command(cmd_create))

    p = ssub.add_parser("list", parents=[common], help="your schedules, newest first")
    p.add_argument("--limit", type=_positive(int), default=50, help="at most this many (default 50)")
    p.set_defaults(run=_command(cmd_list))

    for name, fn, text in (("show", cmd_show, "a schedule's document"),
                           ("pause", cmd_pause, "pause a schedule (no task until it is resumed)"),
                           ("resume", cmd_resume, "resume a paused schedule from its next fire time"),
                           ("delete", cmd_delete, "delete a schedule (the tasks it created stay)")):
        p = ssub.add_parser(name, parents=[common], help=text)
        p.add_argument("schedule_id", metavar="ID")
        p.set_defaults(run=_command(fn))


# -- the commands ----------------------------------------------------------------------------------

def cmd_create(client: Client, args: argparse.Namespace, err: Console) -> int:
    try:
        payload = _payload(args.payload)
    except UsageError as exc:  # the message names --payload, the submit's flag; here it is an argument
        raise UsageError(str(exc).replace("--payload", "PAYLOAD_JSON")) from None
    doc = client.create_schedule(args.cron, args.type, payload, timezone=args.timezone, name=args.name,
                                 priority=args.priority, paused=args.paused)
    _print_json(doc) if args.json else print(doc["schedule_id"])
    return OK


def cmd_list(client: Client, args: argparse.Namespace, err: Console) -> int:
    docs = list(itertools.islice(client.list_schedules(page_size=min(args.limit, 200)), args.limit))
    _print_json(docs) if args.json else table(docs)
    return OK


def cmd_show(client: Client, args: argparse.Namespace, err: Console) -> int:
    doc = client.get_schedule(args.schedule_id)
    _print_json(doc) if args.json else show(doc)
    return OK


def cmd_pause(client: Client, args: argparse.Namespace, err: Console) -> int:
    return _set_paused(client, args, True)


def cmd_resume(client: Client, args: argparse.Namespace, err: Console) -> int:
    return _set_paused(client, args, False)


def _set_paused(client: Client, args: argparse.Namespace, paused: bool) -> int:
    doc = client.update_schedule(args.schedule_id, paused=paused)
    if args.json:
        _print_json(doc)
    elif paused:
        print(f"paused {doc['schedule_id']}")
    else:
        print(f"resumed {doc['schedule_id']} (next run {doc.get('next_run_at') or '-'})")
    return OK


def cmd_delete(client: Client, args: argparse.Namespace, err: Console) -> int:
    client.delete_schedule(args.schedule_id)
    _print_json({"schedule_id": args.schedule_id, "deleted": True}) if args.json else print(
        f"deleted {args.schedule_id}")
    return OK


# -- how a person sees them ------------------------------------------------------------------------

def task_text(doc: Doc) -> str:
    """``orders.export {"rows": 100}`` (and the queue when the schedule sets one)."""
    import json

    task = doc.get("task") or {}
    text = f"{task.get('type', '')} {json.dumps(task.get('payload', {}), ensure_ascii=False)}"
    return text + (f" ({task['priority']})" if task.get("priority") else "")


def show(doc: Doc, console: Console | None = None) -> None:
    """A schedule document as aligned lines (empty fields left out)."""
    from taskport import render

    out = console or render.stdout()
    rows = [("schedule", doc["schedule_id"]), ("name", doc.get("name") or ""), ("cron", doc["cron"]),
            ("timezone", doc["timezone"]), ("task", task_text(doc)), ("paused", "yes" if doc["paused"] else "no"),
            ("next run", doc.get("next_run_at") or ""), ("last run", doc.get("last_run_at") or ""),
            ("last task", doc.get("last_task_id") or ""), ("created", doc.get("created_at") or "")]
    for name, value in rows:
        if value:
            out.print(f"{name:<10} {value}", markup=False, soft_wrap=True)


def table(docs: list[Doc], console: Console | None = None) -> None:
    """Schedules as a table, newest first."""
    from rich.table import Table

    from taskport import render

    out = console or render.stdout()
    if not docs:
        out.print("no schedules")
        return
    grid = Table()
    grid.add_column("schedule", no_wrap=True, min_width=36)
    for name in ("name", "cron", "timezone", "type", "paused"):
        grid.add_column(name)
    grid.add_column("next run", no_wrap=True)
    grid.add_column("last run", no_wrap=True)
    for doc in docs:
        grid.add_row(doc["schedule_id"], doc.get("name") or "", doc["cron"], doc["timezone"],
                     (doc.get("task") or {}).get("type", ""), "yes" if doc["paused"] else "no",
                     doc.get("next_run_at") or "", doc.get("last_run_at") or "")
    out.print(grid)
