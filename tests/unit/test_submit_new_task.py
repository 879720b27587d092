"""app.core.submit.new_task fills a NewTask without its frozen __init__: the same record as NewTask(...) makes."""

from __future__ import annotations

import dataclasses

import pytest

from app.core import processors
from app.core.answers import NewTask
from app.core.submit import new_task


@pytest.mark.parametrize("kw", [
    {},
    {"callback": {"url": "https://example.com/hook", "events": ["COMPLETED", "FAILED"]}},
    {"batch": "b1", "task_id": "2f1c6a0e-8a53-4c1e-9d6b-0b2a4c1f7e21"},
    {"then_of": "b2"},
])
@pytest.mark.parametrize("priority", [None, "high"])
def test_new_task_is_the_record_newtasks_own_init_makes(kw, priority):
    processors.load(())
    made = new_task("public", "demo.sleep", {"seconds": 0}, "d" * 43, priority, **kw)
    built = NewTask(**{f.name: getattr(made, f.name) for f in dataclasses.fields(NewTask)})
    assert made == built and made.__dict__ == built.__dict__  # every field, none more, in the dataclass's order
    assert list(made.__dict__) == [f.name for f in dataclasses.fields(NewTask)]
    assert not hasattr(NewTask, "__post_init__")  # its __init__ does nothing but set the fields
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.member = "other"  # type: ignore[misc]
    proc = processors.get("demo.sleep")
    assert proc is not None
    assert made.priority == (priority or proc.priority) and made.max_attempts == proc.retries + 1
    assert made.callback_events == (tuple(kw["callback"]["events"]) if "callback" in kw else ())
