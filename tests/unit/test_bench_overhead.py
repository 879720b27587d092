"""bench/overhead.py counts what it times: both sides of each pair do the same work with the same outcomes (1 % of
the items failed with the business code, the export's file the same on both sides), and the taskport side really
ran with checkpoints on (read back from Redis). Figures are checked to exist, never against a time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

from app.core.config import Config
from bench import overhead
from workers.runner import Runner

ITEMS = ROWS = 2000


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One small measurement for the whole module (fakeredis, as the unit tests' ``conn``; results on disk)."""
    tmp = tmp_path_factory.mktemp("overhead")
    config = Config.from_env({}, redis_url="redis://fake", data_dir=tmp)
    conn = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    scratch = tmp / "bare"
    scratch.mkdir()
    yield overhead.measure_on(Runner(config, conn=conn), scratch, rounds=1, items=ITEMS, rows=ROWS)
    conn.close()


def test_both_sides_of_the_item_loop_count_the_same_outcomes(out: dict[str, Any]) -> None:
    found = out["per_item"]
    failed = ITEMS // overhead.FAIL_EVERY
    for side in ("taskport", "bare", "no_checkpoints"):
        run = found[side]
        assert (run["succeeded"], run["failed"], run["codes"]) == (ITEMS - failed, failed, [overhead.FAIL_CODE]), side
        assert run["items_per_s"] > 0
    assert found["taskport"]["results"] == ITEMS - failed  # ctx.each handed back every success's result
    assert 0 < found["ratio"] and 0 < found["ratio_no_checkpoints"]


def test_the_taskport_run_saved_its_checkpoint_and_the_variant_without_did_not(out: dict[str, Any]) -> None:
    found = out["per_item"]
    failed = ITEMS // overhead.FAIL_EVERY
    assert (found["taskport"]["checkpoint_done"], found["taskport"]["checkpoint_failed"]) == (ITEMS, failed)
    assert found["no_checkpoints"]["checkpoint_done"] == 0


@pytest.mark.parametrize("fmt", overhead.FORMATS)
def test_the_export_and_the_bare_script_write_the_same_file(out: dict[str, Any], fmt: str) -> None:
    found = out[f"per_row_{fmt}"]
    assert found["identical"]  # CSV: the same bytes; XLSX: the same sheet XML
    assert found["taskport"]["bytes"] > 0 and found["bare"]["bytes"] > 0
    if fmt == "csv":
        assert found["taskport"]["bytes"] == found["bare"]["bytes"]  # a zip's own headers may differ: not XLSX's
    assert found["taskport"]["rows_per_s"] > 0 and found["bare"]["rows_per_s"] > 0 and found["ratio"] > 0


def test_the_table_has_a_row_per_target_with_its_verdict(out: dict[str, Any]) -> None:
    table = overhead.rows(out)
    targeted = [(row.target, row.verdict) for row in table if row.target]
    assert [target for target, _ in targeted] == ["≥ 0.5×", "≥ 0.9×", "≥ 0.9×"]
    assert all(verdict in ("PASS", "FAIL") for _, verdict in targeted)
    assert all(not row.verdict for row in table if not row.target)  # the record's rows carry no verdict
