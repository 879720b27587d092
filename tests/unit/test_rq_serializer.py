"""workers.worker takes RQ's default serializer as resolved: the same object, without the Protocol check that cost
~6% of a no-op delivery's worker CPU; any other serializer is still checked as RQ checks it."""

from __future__ import annotations

import typing

import pytest
from rq.job import Job
from rq.serializers import DefaultSerializer, JSONSerializer

import workers.worker  # noqa: F401  (what the worker processes import)


@pytest.fixture
def protocol_walks(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    walks: list[object] = []
    real = typing._get_protocol_attrs  # type: ignore[attr-defined]
    monkeypatch.setattr(typing, "_get_protocol_attrs", lambda cls: walks.append(cls) or real(cls))
    return walks


def test_a_jobs_default_serializer_is_not_checked_again(conn, protocol_walks: list[object]) -> None:
    job = Job("j1", connection=conn, serializer=DefaultSerializer)
    registries = [job.started_job_registry, job.finished_job_registry]
    assert protocol_walks == []
    assert job.serializer is DefaultSerializer and all(r.serializer is DefaultSerializer for r in registries)


def test_other_serializers_are_checked_as_rq_checks_them(conn, protocol_walks: list[object]) -> None:
    assert Job("j2", connection=conn, serializer=JSONSerializer).serializer is JSONSerializer
    assert protocol_walks
    with pytest.raises(NotImplementedError):
        Job("j3", connection=conn, serializer=object())
