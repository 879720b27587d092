"""The id shapes (app/core/ids.py): one pattern each, used by the API, the result store and the logs."""

from __future__ import annotations

import logging
import uuid

import pytest

from app.core.ids import is_run_id, is_task_id, new_run_id
from app.core.logs import TaskIdFilter
from app.core.results import check_run_id, check_task_id


def test_a_task_id_is_canonical_lower_case_uuid_text():
    task_id = str(uuid.uuid4())
    assert is_task_id(task_id) and check_task_id(task_id) == task_id
    for bad in (task_id.upper(), task_id.replace("-", ""), f" {task_id}", task_id + "0", "", None, 42):
        assert not is_task_id(bad)
    with pytest.raises(ValueError):
        check_task_id("../" + task_id)


def test_a_run_id_is_uuid4_hex_and_new_ones_differ():
    first, second = new_run_id(), new_run_id()
    assert is_run_id(first) and is_run_id(second) and first != second and check_run_id(first) == first
    assert not is_run_id(str(uuid.uuid4())) and not is_run_id(first.upper())
    with pytest.raises(ValueError):
        check_run_id("x" * 32)


def test_rq_lines_naming_a_task_are_stamped_with_its_id():
    task_id = str(uuid.uuid4())
    record = logging.LogRecord("rq.worker", logging.INFO, __file__, 1, "default: Job OK (%s)", (task_id,), None)
    TaskIdFilter("worker").filter(record)
    assert record.task_id == task_id  # type: ignore[attr-defined]
