"""TaskStore.task_fields names the hash's fields from module constants (not ``F.NAME`` per submit): the stored
layout is the one written out field by field below, names (as TaskField members), values and order."""

from __future__ import annotations

import orjson
import pytest

from app.core.answers import NewTask
from app.core.config import Config
from app.core.ids import digest
from app.core.keys import TaskField as F
from app.core.states import TaskStatus
from app.core.store import TaskStore


def written_out(new: NewTask, created: int, run_at: int | None, ttl: int) -> list[object]:
    body = orjson.dumps(new.payload)
    start = max(created, run_at or 0)
    fields: list[object] = [
        F.TYPE, new.type, F.MEMBER, new.member, F.STATUS, TaskStatus.PENDING, F.PROGRESS, 0, F.ATTEMPTS, 0,
        F.CREATED_AT, created, F.UPDATED_AT, created, F.EXPIRES_AT, start + ttl * 1000, F.SEQ, 0,
        F.PAYLOAD_SHA256, digest(body), F.STORED, len(body), *([F.RUN_AT, run_at] if run_at is not None else []),
    ]
    fields += [F.MAX_ATTEMPTS, new.max_attempts] if new.max_attempts != 1 else []
    fields += [F.PRIORITY, new.priority] if new.priority != "default" else []
    fields += [F.TRACEPARENT, new.traceparent] if new.traceparent else []
    fields += [F.CALLBACK_URL, new.callback_url, F.CALLBACK_EVENTS, ",".join(new.callback_events)] \
        if new.callback_url else []
    fields += [F.BATCH, new.batch] if new.batch else []
    fields += [F.THEN_OF, new.then_of] if new.then_of else []
    return fields


@pytest.mark.parametrize("extra", [
    {}, {"max_attempts": 3}, {"priority": "high"}, {"traceparent": "00-ab-cd-01"}, {"batch": "b1", "then_of": "b2"},
    {"callback_url": "https://example.com/h", "callback_events": ("COMPLETED", "FAILED")},
])
@pytest.mark.parametrize("run_at", [None, 1796000009000])
def test_task_fields_writes_the_layout_field_by_field(extra: dict[str, object], run_at: int | None) -> None:
    store = object.__new__(TaskStore)
    store.config = Config.from_env({})
    new = NewTask(**{"task_id": "t1", "member": "public", "type": "demo.noop", "payload": {"x": 1},
                     "dedup_digest": "d" * 43, "priority": "default", "max_attempts": 1, **extra})  # type: ignore[arg-type]
    start, fields, body = store.task_fields(new, 1796000000000, run_at)
    assert fields == written_out(new, 1796000000000, run_at, store.config.task_ttl)
    assert [type(name) for name in fields[::2]] == [F] * (len(fields) // 2)  # names still the members
    assert start == max(1796000000000, run_at or 0) and body == orjson.dumps(new.payload)


def test_the_submits_settings_are_the_configs_and_follow_a_new_config() -> None:
    """TaskStore.create reads the caps, TTLs and the call record's time once per Config: the properties' values,
    read again when the store is given another Config."""
    store = object.__new__(TaskStore)
    for env in ({}, {"TASKPORT_MAX_ACTIVE_TASKS": "7", "TASKPORT_MAX_STORED_BYTES": "1mb", "TASKPORT_API_KEYS": "a:k"}):
        c = store.config = Config.from_env(env)
        s = store._submit_settings()
        assert s is store._submit_settings()  # kept
        assert (s.dedup_window, s.key_ttl, s.ttl_ms, s.cap, s.bytes_cap, s.record_ms) == (
            c.dedup_window, c.task_ttl + c.tombstone_ttl, c.task_ttl * 1000, c.active_task_cap, c.stored_bytes_cap,
            c.call_record_ms)
        assert s.lapse_check == ("1" if c.dedup_window * 1000 < c.call_record_ms else "")
    assert store._submit_settings().cap == 7
