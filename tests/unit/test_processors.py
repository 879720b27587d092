"""The built-in processors: their payload schemas (the API contract) and their output."""

from __future__ import annotations

import csv
import io
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import openpyxl
import pytest
from marshmallow import ValidationError

import app.core.processors as registry
from app.core.results import LocalResultStore
from tests.unit.recorder import Recorder
from workers.context import TaskContext
from workers.exceptions import TaskCancelled, TaskError
from workers.processors import orders_export

registry.load()


@pytest.fixture
def ctx(report: Recorder, tmp_path: Path) -> TaskContext:
    slept: list[float] = []
    context = TaskContext(
        str(uuid.uuid4()), report, results=LocalResultStore(tmp_path), interval=0, sleep=slept.append
    )
    context.slept = slept  # type: ignore[attr-defined]
    return context


def run(type_: str, payload: dict, ctx: TaskContext) -> dict:
    """Validate like the API, then run like the runner (on the loaded payload)."""
    found = registry.get(type_)
    assert found is not None
    return found.func(registry.validate(type_, payload), ctx)


def errors_of(type_: str, payload: Any) -> dict[str, list[str]]:
    with pytest.raises(ValidationError) as caught:
        registry.validate(type_, payload)
    return registry.flatten_errors(caught.value.messages, "payload")


# -- demo.sleep ---------------------------------------------------------------------------------


def test_sleep_defaults():
    assert registry.validate("demo.sleep", {}) == {
        "seconds": 0,
        "steps": 10,
        "items": 0,
        "item_seconds": 0,
        "fail_items": [],
        "fail_code": None,
        "output": False,
    }


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        ({"seconds": -1}, "payload.seconds"),
        ({"seconds": 3600.5}, "payload.seconds"),
        ({"seconds": "1"}, "payload.seconds"),
        ({"seconds": True}, "payload.seconds"),
        ({"steps": 0}, "payload.steps"),
        ({"steps": 10001}, "payload.steps"),
        ({"steps": 1.5}, "payload.steps"),
        ({"items": -1}, "payload.items"),
        ({"items": 100001}, "payload.items"),
        ({"fail_items": "1"}, "payload.fail_items"),
        ({"fail_items": [1, "x"]}, "payload.fail_items.1"),
        ({"fail_code": "x"}, "payload.fail_code"),
        ({"fail_code": 0}, "payload.fail_code"),
        ({"surprise": 1}, "payload.surprise"),
    ],
)
def test_sleep_rejects(payload: dict, path: str):
    assert list(errors_of("demo.sleep", payload)) == [path]


def test_sleep_accepts_limits():
    loaded = registry.validate(
        "demo.sleep", {"seconds": 3600, "steps": 10000, "items": 100000, "fail_code": None}
    )
    assert loaded["seconds"] == 3600 and loaded["fail_code"] is None


def test_sleep_steps_and_result(ctx: TaskContext, report: Recorder):
    assert run("demo.sleep", {"seconds": 1, "steps": 4}, ctx) == {"slept": 1, "items": 0}
    assert sum(ctx.slept) == pytest.approx(1.0)  # type: ignore[attr-defined]
    assert max(ctx.slept) <= 0.1  # type: ignore[attr-defined]
    assert report.calls == [
        (25, "step 1 of 4", None),
        (50, "step 2 of 4", None),
        (75, "step 3 of 4", None),
        (99, "step 4 of 4", None),
    ]
    assert ctx.item_counts is None


def test_sleep_fractional_seconds_echoed(ctx: TaskContext):
    assert run("demo.sleep", {"seconds": 0.25, "steps": 1}, ctx) == {"slept": 0.25, "items": 0}


def test_sleep_items_and_failures(ctx: TaskContext):
    result = run("demo.sleep", {"items": 6, "fail_items": [1, 4, 99]}, ctx)
    assert result == {"slept": 0, "items": 6}
    assert ctx.item_counts == {"total": 6, "succeeded": 4, "failed": 2}
    assert [(f["item"], f["code"]) for f in ctx.failures] == [("1", 10002), ("4", 10002)]
    assert ctx.error_code == 10002


def test_sleep_progress_moves_through_the_items(ctx: TaskContext, report: Recorder):
    """With items, the steps are the first half of the progress and the items the second (it sat at 99 from the
    first item on: the steps had reached it, and progress never goes down)."""
    run("demo.sleep", {"seconds": 0, "steps": 4, "items": 8}, ctx)
    steps = [p for p, message, _ in report.calls if message.startswith("step")]
    items = [p for p, message, _ in report.calls if message.startswith("item")]
    assert steps[:4] == [12, 25, 37, 50]
    assert items[0] <= 56 and items[-1] == 99 and items == sorted(items) and len(set(items)) >= 7, items


def test_sleep_fail_code_fails_at_the_end(ctx: TaskContext):
    with pytest.raises(TaskError) as caught:
        run("demo.sleep", {"items": 2, "fail_code": 10042}, ctx)
    assert caught.value.code == 10042
    assert ctx.item_counts == {"total": 2, "succeeded": 2, "failed": 0}


def test_sleep_is_cancellable_mid_sleep(ctx: TaskContext):
    def sleep(seconds: float) -> None:
        ctx.slept.append(seconds)  # type: ignore[attr-defined]
        if len(ctx.slept) == 5:  # type: ignore[attr-defined]
            ctx.mark_cancelled()

    ctx._sleep = sleep
    with pytest.raises(TaskCancelled):
        run("demo.sleep", {"seconds": 3600, "steps": 1}, ctx)
    assert len(ctx.slept) == 5  # type: ignore[attr-defined]


# -- orders.split -------------------------------------------------------------------------------


def order(*items: Any, **fields: Any) -> dict:
    return {"order_code": "ORD-1", "items": list(items), **fields}


def test_split_defaults():
    assert registry.validate("orders.split", order({"item_code": "A", "quantity": 1})) == {
        "order_code": "ORD-1",
        "account_status": "active",
        "items": [{"item_code": "A", "quantity": 1, "warehouse": "main", "bill_unpaid": False}],
    }


GOOD_ITEM = {"item_code": "A", "quantity": 1}


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        ({"items": [GOOD_ITEM]}, "payload.order_code"),
        (order(GOOD_ITEM, order_code=""), "payload.order_code"),
        (order(GOOD_ITEM, order_code=5), "payload.order_code"),
        (order(GOOD_ITEM, account_status="closed"), "payload.account_status"),
        ({"order_code": "O"}, "payload.items"),
        (order(), "payload.items"),
        (order(*[GOOD_ITEM] * 10001), "payload.items"),
        (order(GOOD_ITEM, {"item_code": "", "quantity": 1}), "payload.items.1.item_code"),
        (order({"quantity": 1}), "payload.items.0.item_code"),
        (order({"item_code": "A"}), "payload.items.0.quantity"),
        (order({"item_code": "A", "quantity": "3"}), "payload.items.0.quantity"),
        (order({"item_code": "A", "quantity": 1.5}), "payload.items.0.quantity"),
        (order({"item_code": "A", "quantity": 1, "warehouse": 5}), "payload.items.0.warehouse"),
        (order({"item_code": "A", "quantity": 1, "bill_unpaid": "yes"}), "payload.items.0.bill_unpaid"),
        (order({"item_code": "A", "quantity": 1, "extra": 1}), "payload.items.0.extra"),
        (order("not-an-object"), "payload.items.0"),
    ],
)
def test_split_rejects(payload: dict, path: str):
    assert list(errors_of("orders.split", payload)) == [path]


def test_split_groups_succeeded_items_by_warehouse(ctx: TaskContext, report: Recorder):
    payload = order(
        {"item_code": "A", "quantity": 2, "warehouse": "east"},
        {"item_code": "B", "quantity": 0},
        {"item_code": "C", "quantity": 1},
        {"item_code": "D", "quantity": 5, "warehouse": "east", "bill_unpaid": True},
        {"item_code": "E", "quantity": 3, "warehouse": "east"},
        {"item_code": "F", "quantity": -1, "warehouse": "west"},
        {"item_code": "G", "quantity": 4, "warehouse": "main"},
    )
    assert run("orders.split", payload, ctx) == {
        "order_code": "ORD-1",
        "shipments": [
            {
                "warehouse": "east",
                "items": [{"item_code": "A", "quantity": 2}, {"item_code": "E", "quantity": 3}],
            },
            {
                "warehouse": "main",
                "items": [{"item_code": "C", "quantity": 1}, {"item_code": "G", "quantity": 4}],
            },
        ],
    }
    assert ctx.item_counts == {"total": 7, "succeeded": 4, "failed": 3}
    assert [(f["item"], f["code"]) for f in ctx.failures] == [("B", 10002), ("D", 10001), ("F", 10002)]
    assert ctx.error_code == 10002
    assert report.messages[-1] == "item 7 of 7"


def test_split_quantity_checked_before_bill(ctx: TaskContext):
    run("orders.split", order({"item_code": "A", "quantity": 0, "bill_unpaid": True}), ctx)
    assert ctx.failures[0]["code"] == 10002


def test_split_all_failed_gives_no_shipments(ctx: TaskContext):
    result = run("orders.split", order({"item_code": "A", "quantity": 1, "bill_unpaid": True}), ctx)
    assert result == {"order_code": "ORD-1", "shipments": []}
    assert ctx.failures == [
        {"item": "A", "code": 10001, "message": "bill unpaid: settle the bill for this item first"}
    ]


def test_split_suspended_account_fails_task(ctx: TaskContext):
    with pytest.raises(TaskError) as caught:
        run("orders.split", order(GOOD_ITEM, account_status="suspended"), ctx)
    assert (caught.value.code, caught.value.message) == (10001, "bill unpaid: settle the account first")
    assert ctx.item_counts is None


# -- orders.export ------------------------------------------------------------------------------


def test_export_defaults():
    assert registry.validate("orders.export", {"rows": 1}) == {"rows": 1, "format": "csv"}


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        ({}, "payload.rows"),
        ({"rows": 0}, "payload.rows"),
        ({"rows": 1_000_001}, "payload.rows"),
        ({"rows": "5"}, "payload.rows"),
        ({"rows": 1, "format": "pdf"}, "payload.format"),
        ({"rows": 1, "start_date": "2026-13-01"}, "payload.start_date"),
        ({"rows": 1, "start_date": "2026/01/01"}, "payload.start_date"),
        ({"rows": 1, "start_date": "20260101"}, "payload.start_date"),
        ({"rows": 1, "end_date": "2026-02-30"}, "payload.end_date"),
        ({"rows": 1, "end_date": 20260101}, "payload.end_date"),
        ({"rows": 1, "start_date": "2026-03-02", "end_date": "2026-03-01"}, "payload.end_date"),
        # bounded range: no 3.65 M dates for one row, no overflow past 9999-12-31
        ({"rows": 1, "start_date": "0001-01-01", "end_date": "2026-01-01"}, "payload.start_date"),
        ({"rows": 1, "start_date": "2026-01-01", "end_date": "9999-12-31"}, "payload.end_date"),
        ({"rows": 1, "start_date": "9999-12-31"}, "payload.start_date"),
        ({"rows": 1, "end_date": "0001-01-01"}, "payload.end_date"),
        ({"rows": 1, "start_date": "1900-01-01", "end_date": "2100-12-31"}, "payload.end_date"),
        ({"rows": 1, "start_date": "2000-01-01", "end_date": "2010-01-08"}, "payload.end_date"),
    ],
)
def test_export_rejects(payload: dict, path: str):
    assert list(errors_of("orders.export", payload)) == [path]


def test_export_accepts_the_bounds_of_its_range():
    for payload in ({"rows": 1, "start_date": "1900-01-01"}, {"rows": 1, "end_date": "2100-12-31"},
                    {"rows": 1, "start_date": "2100-12-31"}, {"rows": 1, "end_date": "1900-01-01"},
                    {"rows": 1, "start_date": "2000-01-01", "end_date": "2010-01-07"}):
        assert registry.validate("orders.export", payload)["rows"] == 1, payload


def test_export_accepts_single_day_range():
    payload = {"rows": 1, "format": "xlsx", "start_date": "2026-03-01", "end_date": "2026-03-01"}
    assert registry.validate("orders.export", payload) == payload


def test_loaded_payloads_reload_unchanged():
    for type_, payload in [
        ("demo.sleep", {"seconds": 1.5}),
        ("orders.split", order(GOOD_ITEM)),
        ("orders.export", {"rows": 3, "start_date": "2026-01-01"}),
    ]:
        loaded = registry.validate(type_, payload)
        assert registry.validate(type_, loaded) == loaded


def read_csv(ctx: TaskContext, name: str) -> list[list[str]]:
    with ctx.results.open(ctx.task_id, name) as fh:
        text = fh.read().decode("utf-8")
    return list(csv.reader(io.StringIO(text, newline="")))


def test_export_csv(ctx: TaskContext, report: Recorder):
    payload = {"rows": 5, "start_date": "2026-03-01", "end_date": "2026-03-03"}
    result = run("orders.export", payload, ctx)
    name = "orders_2026-03-01_2026-03-03.csv"
    size = ctx.results.info(ctx.task_id, name, "").size
    assert result == {
        "rows": 5,
        "file": {
            "name": name,
            "size": size,
            "content_type": "text/csv; charset=utf-8",
        },
    }  # the result read adds file.url (the web's to say: tests/unit/test_api.py, the integration tests)
    rows = read_csv(ctx, name)
    assert rows[0] == list(orders_export.HEADER)
    assert len(rows) == 6
    assert [r[0] for r in rows[1:]] == [f"ORD-000000{i}" for i in range(1, 6)]
    dates = [r[1] for r in rows[1:]]
    assert dates == sorted(dates) and dates[0] == "2026-03-01" and dates[-1] == "2026-03-03"
    assert all(float(r[4]) >= 1 for r in rows[1:]) and {r[6] for r in rows[1:]} <= set(orders_export.STATUSES)
    assert report.messages == ["row 5 of 5"]


def test_export_is_deterministic(ctx: TaskContext, report: Recorder, tmp_path: Path):
    run("orders.export", {"rows": 50}, ctx)
    again = TaskContext(ctx.task_id, report, results=LocalResultStore(tmp_path / "again"))
    result = run("orders.export", {"rows": 50}, again)
    assert result["file"]["name"] == "orders_2026-01-01_2026-12-31.csv"
    assert read_csv(ctx, result["file"]["name"]) == read_csv(again, result["file"]["name"])


def test_export_progress_by_rows(ctx: TaskContext, report: Recorder, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(orders_export, "CHUNK_ROWS", 1000)
    run("orders.export", {"rows": 2500, "end_date": "2026-06-30"}, ctx)
    assert report.messages == ["row 1000 of 2500", "row 2000 of 2500", "row 2500 of 2500"]
    assert [c[0] for c in report.calls] == [40, 80, 99]


def test_export_xlsx_streams_through_a_temp_file_in_the_task_folder(
    ctx: TaskContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from openpyxl.worksheet import _writer

    made: list[str] = []
    real = _writer.create_temporary_file
    monkeypatch.setattr(_writer, "create_temporary_file", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    run("orders.export", {"rows": 3, "format": "xlsx"}, ctx)
    assert made and all(Path(m).parent == tmp_path / ctx.task_id for m in made)
    assert not any(Path(m).exists() for m in made)
    assert tempfile.gettempdir() != str(tmp_path / ctx.task_id)


def test_export_xlsx_is_readable(ctx: TaskContext):
    result = run("orders.export", {"rows": 30, "format": "xlsx", "start_date": "2026-02-01"}, ctx)
    assert result["file"]["name"] == "orders_2026-02-01_2027-01-31.xlsx"
    assert (
        result["file"]["content_type"] == "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    )
    with ctx.results.open(ctx.task_id, result["file"]["name"]) as fh:
        book = openpyxl.load_workbook(fh, read_only=True)
        rows = list(book["orders"].iter_rows(values_only=True))
        book.close()
    assert rows[0] == orders_export.HEADER
    assert len(rows) == 31
    first = orders_export.make_row(0, orders_export.date_range("2026-02-01", None)[0])
    assert rows[1][0] == first[0] and rows[1][1].date() == first[1] and rows[1][4] == first[4] / 100


@pytest.mark.parametrize("fmt", ["csv", "xlsx"])
def test_cancelled_export_leaves_no_file(ctx: TaskContext, fmt: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(orders_export, "CHUNK_ROWS", 10)
    calls = 0

    def cancel_on_third(*args: Any) -> str:
        nonlocal calls
        calls += 1
        return "CANCELLED" if calls == 3 else "PROCESSING"

    ctx._report_fn = cancel_on_third
    with pytest.raises(TaskCancelled):
        run("orders.export", {"rows": 100, "format": fmt}, ctx)
    folder = Path(ctx.results.root) / ctx.task_id  # type: ignore[attr-defined]
    assert list(folder.iterdir()) == []


# -- a user module ------------------------------------------------------------------------------


@pytest.fixture
def user_procs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Load the sample user module into a private copy of the registry (other tests see no trace)."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.delitem(sys.modules, "tests.userprocs.tasks", raising=False)
    registry.load(["tests.userprocs.tasks"])


@pytest.mark.usefixtures("user_procs")
def test_user_echo(ctx: TaskContext):
    assert run("user.echo", {"text": "hi"}, ctx) == {"echo": "hi"}
    assert list(errors_of("user.echo", {})) == ["payload.text"]


@pytest.mark.usefixtures("user_procs")
def test_flaky_counts_calls_in_its_marker(ctx: TaskContext, tmp_path: Path):
    payload = {"marker": str(tmp_path / "calls"), "fail_times": 2}
    for _ in range(2):
        with pytest.raises(RuntimeError):
            run("test.flaky", payload, ctx)
    assert run("test.flaky", payload, ctx) == {"calls": 3}
