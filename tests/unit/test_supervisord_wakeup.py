"""supervisord's loop wakes on a signal (app.launch.supervised.wake_on_signals): a child's exit (SIGCHLD) or a
stop request is acted on at once, not at the end of the loop's 1 s poll, which Python resumes after a handler
that only notes the signal, as supervisord's do (issue 29, finding 11: the ticks added up to seconds of a
Ctrl-C)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from supervisor import poller

from app.launch.supervised import wake_on_signals

POLL_TIMEOUT = 3.0  # supervisord's own is 1 s; longer here, so that a poll left to time out cannot pass


@pytest.fixture
def supervisords_poller(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The poller supervisord would make, with a SIGCHLD handler that only notes the signal (as its own)."""
    monkeypatch.setattr(poller, "Poller", poller.Poller)  # wake_on_signals replaces it: put back after the test
    noted: list[int] = []
    previous = signal.signal(signal.SIGCHLD, lambda signum, frame: noted.append(signum))
    wake_on_signals()
    made = poller.Poller(SimpleNamespace(logger=None))
    try:
        yield made
    finally:
        made.close()
        signal.signal(signal.SIGCHLD, previous)


def test_a_signal_ends_supervisords_poll_at_once(supervisords_poller: Any) -> None:
    os.kill(os.getpid(), signal.SIGCHLD)  # what a child's exit sends supervisord
    begun = time.monotonic()
    readables, writables = supervisords_poller.poll(POLL_TIMEOUT)
    assert time.monotonic() - begun < POLL_TIMEOUT / 3
    assert (readables, writables) == ([], [])  # the wakeup pipe stays out of supervisord's sight


def test_the_wakeup_is_read_away_so_the_next_poll_waits_again(supervisords_poller: Any) -> None:
    os.kill(os.getpid(), signal.SIGCHLD)
    supervisords_poller.poll(POLL_TIMEOUT)
    begun = time.monotonic()
    assert supervisords_poller.poll(0.2) == ([], [])
    assert time.monotonic() - begun >= 0.15  # no byte left behind: nothing to wake it
