"""The client's copy of the contract's names (taskport.states, in the client distribution, which installs
without the service) spells every one as their home, the service's app.core.states, does."""

from __future__ import annotations

import taskport.states as client
from app.core import states as service


def constants(namespace: type) -> dict[str, object]:
    return {name: value for name, value in vars(namespace).items() if name.isupper()}


def test_task_and_batch_statuses_are_the_services() -> None:
    assert {s.name: s.value for s in client.TaskStatus} == {s.name: s.value for s in service.TaskStatus}
    assert {s.name: s.value for s in client.BatchStatus} == {s.name: s.value for s in service.BatchStatus}


def test_the_status_sets_are_the_services() -> None:
    for name in ("ACTIVE", "TERMINAL", "STORED"):
        assert {str(s) for s in getattr(client, name)} == {str(s) for s in getattr(service, name)}, name


def test_the_services_own_error_codes_are_the_services() -> None:
    assert constants(client.ErrorCode) == constants(service.ErrorCode)
    assert constants(client.ErrorCode)  # the comparison saw codes at all


def test_the_queues_are_the_services_in_their_order() -> None:
    assert client.QUEUES == service.QUEUES
