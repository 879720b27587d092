"""The simple worker's job timeout (workers.worker.LeanSignalDeathPenalty): RQ's SIGALRM death penalty, its calls
made through ``_signal``. It must still stop a job at its timeout and leave SIGALRM as RQ leaves it."""

from __future__ import annotations

import signal
import time

import pytest
from rq.timeouts import JobTimeoutException, UnixSignalDeathPenalty

from workers.worker import WORKER_CLASSES, LeanSignalDeathPenalty, StoppableSimpleWorker


def test_the_simple_worker_times_its_jobs_with_it() -> None:
    assert StoppableSimpleWorker.death_penalty_class is LeanSignalDeathPenalty
    assert WORKER_CLASSES["simple"] is StoppableSimpleWorker
    assert issubclass(LeanSignalDeathPenalty, UnixSignalDeathPenalty)


def test_a_job_over_its_timeout_is_stopped_with_rqs_exception() -> None:
    started = time.monotonic()
    with pytest.raises(JobTimeoutException, match=r"maximum timeout value \(1 seconds\)"):
        with LeanSignalDeathPenalty(1, JobTimeoutException, job_id="j"):
            time.sleep(10)  # the job: interrupted by the alarm after 1 s
    assert time.monotonic() - started < 5
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL  # put back as RQ's cancel does
    assert signal.alarm(0) == 0  # no alarm left pending


def test_a_job_within_its_timeout_ends_with_the_alarm_cleared_and_the_default_back() -> None:
    with LeanSignalDeathPenalty(30, JobTimeoutException, job_id="j"):
        assert signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, signal.SIG_IGN, None)
    assert signal.alarm(0) == 0
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
