"""A run's heartbeat: the thread that marks the task alive, flushes pending progress and checkpoints, notices
a cancel even while the processor is busy in one long step, and enforces the two graces: a run that is no
longer the task's and ignores it for ``CANCEL_GRACE`` ends its process; a run that does not stop within the
stop grace of a worker stop is put back from its last checkpoint, then its process ends.

The beats of a process's runs come from one thread (:class:`_Beater`), started with the first run and kept: a
thread per run (started, woken to end, joined by the interpreter) was the largest single cost of a no-op
delivery in the simple worker (bench/README.md, "Worker CPU"). The thread needs no word from a run that starts or
ends: it sleeps until the current run's next beat is due (its start plus the interval, then each beat plus the
interval, as before) and, with no run, for the shortest interval it has seen, so a run's first beat is never late.
"""

from __future__ import annotations

import _thread
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from app.core.logs import task_logger
from app.core.results import ResultStore
from app.core.states import ACTIVE, TaskStatus
from app.core.store import TaskStore
from workers.context import TaskContext

log = logging.getLogger(__name__)

# Seconds a run that is no longer the task's (cancelled, expired, taken over) may take to reach a
# cancellation point before its process is ended (exit code ABANDONED_EXIT): the guarantee that a cancel
# stops a processor which never reaches one, in the in-process (simple) worker too. The supervisor (or the
# platform's process manager) starts a new worker; with the fork worker it is the work horse that ends.
CANCEL_GRACE = 1.0
ABANDONED_EXIT = 75
# The exit code of a process whose run did not stop within the stop grace (the task was put back first).
INTERRUPTED_EXIT = 0


class _Ended:
    """A run's end, set once (:meth:`Heartbeat.__exit__`) and waited on only by the rare grace threads (a stop's, a
    cancel's): a lock held from the run's start and released at its end, where a ``threading.Event`` (a Condition
    and its lock built for each run, and its ``set`` taking the Condition's lock to notify no one) cost ~3 µs a
    delivery (bench/README.md, "Worker CPU, fourth pass"). Any number of threads may wait; each gives the lock
    back at once, so the next one sees the end too."""

    __slots__ = ("_held", "_set")

    def __init__(self) -> None:
        self._held = _thread.allocate_lock()
        self._held.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:  # one thread ends a run (its own, in __exit__), once
            self._set = True
            self._held.release()

    def wait(self, timeout: float) -> bool:
        """True once the run ended, waiting up to ``timeout`` seconds for it."""
        if self._held.acquire(timeout=timeout):
            self._held.release()
            return True
        return self._set


class Heartbeat:
    """A run's beats (by the process's beat thread, :class:`_Beater`): they mark the task alive, flush pending
    progress, and notice a cancel even while the processor is busy in one long step; a run that does not stop
    within CANCEL_GRACE of that ends its process (see :meth:`abandon`)."""

    def __init__(self, store: TaskStore, task_id: str, run_id: str, ctx: TaskContext, interval: float,
                 put_back: Callable[[str], bool] | None = None) -> None:
        self._stop = _Ended()
        self._args = (store, task_id, run_id, ctx, interval)
        self._ctx = ctx
        self._task_id = task_id
        self._abandoning = threading.Lock()
        self._put_back = put_back
        self._interrupting = False
        self._ending = threading.Lock()
        self._decider: int | None = None  # the thread that ends the run (see decide)
        self._interval = interval
        self._due = 0.0  # monotonic time of the next beat (set when the run starts)
        self._beating = False  # between __enter__ and __exit__, until a beat finds the run no longer the task's

    def decide(self) -> bool:
        """Claim the run's ending for the calling thread: the processor's return or exception (complete, fail,
        retry, put back, stop) in the run's thread, or the end after a grace (put back, abandon) in this
        module's. True for the first thread to ask, and again for that thread only: the others leave the run
        alone, so no path acts, nor removes files, after another one has ended the run."""
        me = threading.get_ident()
        with self._ending:
            if self._decider is None:
                self._decider = me
            return self._decider == me

    def interrupt(self, grace: float) -> None:
        """The worker is stopping: the processor stops at its next cancellation point (the runner puts the
        task back); if the run has not ended ``grace`` seconds later, put the task back from here, from its
        last checkpoint, and end the process. Takes no lock (a signal handler calls it); a second call changes
        nothing."""
        if self._interrupting:
            return
        self._interrupting = True
        self._ctx.mark_interrupted()
        _thread.start_new_thread(self._overdue, (grace,))

    def _overdue(self, grace: float) -> None:
        if self._stop.wait(grace) or self._put_back is None:
            return  # the run ended in time
        if not self.decide():
            return  # the run is ending on its own (completing, failing): that end stands, and it comes soon
        try:
            self._put_back(f"did not reach a cancellation point within the {grace:g} s stop grace")
        except Exception as exc:  # the exit must happen regardless; recovery takes the task over then
            task_logger(log, self._task_id).warning("could not put the task back: %s", exc)
        _end_process(INTERRUPTED_EXIT)

    def abandon(self, reason: str) -> None:
        """The run is no longer the task's: tell the processor (its next cancellation point raises TaskCancelled),
        and if it has not returned CANCEL_GRACE seconds later, remove this run's files and end the
        process. Called by the heartbeat thread, or by the worker on RQ's stop-job command."""
        if not self._abandoning.acquire(blocking=False):
            return  # already on its way
        self._ctx.mark_cancelled()
        _thread.start_new_thread(self._watch, (reason,))

    def _watch(self, reason: str) -> None:
        if self._stop.wait(CANCEL_GRACE) or not self.decide():
            return  # the processor noticed in time, or the run is ending on its own
        tlog = task_logger(log, self._task_id)
        tlog.warning("%s, but the processor ignored it for %.1f s: ending process %d (a new worker takes its place)",
                     reason, CANCEL_GRACE, os.getpid())
        store, task_id, run_id = self._args[:3]
        try:
            discard(store, task_id, run_id, self._ctx.results)
        except Exception as exc:  # the orphan sweep removes what is left; the exit must happen regardless
            tlog.warning("could not remove the run's files (left to the orphan sweep): %s", exc)
        _end_process(ABANDONED_EXIT)

    def _beat_once(self) -> None:
        """One beat (in the process's beat thread): pending progress out, the task marked alive; a run that is no
        longer the task's is abandoned and beaten no more."""
        store, task_id, run_id, ctx = self._args[:4]
        ctx.flush()  # progress the processor reported since the last throttled write, at least once per beat
        try:
            status = store.report(task_id, run_id, None)
        except redis.RedisError as exc:
            task_logger(log, task_id).warning("heartbeat failed: %s", exc)
            return
        if status != "PROCESSING":
            self._beating = False
            self.abandon(f"the task is {status or 'gone'}")

    def __enter__(self) -> Heartbeat:
        self._due = time.monotonic() + self._interval
        self._beating = True
        _beater().follow(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._beating = False
        self._stop.set()
        _beater().forget(self)


class _Beater:
    """The thread that beats the run in progress in this process (see the module docstring). A run's start and
    end only set :attr:`current`; the thread is woken only for a run due before the time it sleeps until (runs
    of different intervals: tests; a worker's runs all have its ``TASKPORT_HEARTBEAT_INTERVAL``)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.current: Heartbeat | None = None
        self.idle = float("inf")  # seconds the thread sleeps with no run: the shortest interval seen
        self._until = float("inf")  # monotonic time the thread sleeps until
        self._wake = threading.Event()
        threading.Thread(target=self._loop, name="taskport-heartbeat", daemon=True).start()

    def follow(self, beat: Heartbeat) -> None:
        self.current = beat
        self.idle = min(self.idle, beat._interval)
        if beat._due < self._until:
            self._wake.set()

    def forget(self, beat: Heartbeat) -> None:
        if self.current is beat:
            self.current = None

    def _loop(self) -> None:
        while True:
            beat = self.current
            wait = self.idle
            if beat is not None and beat._beating:
                now = time.monotonic()
                if now >= beat._due:
                    try:
                        beat._beat_once()
                    except Exception:  # this thread beats every later run of the process too: it must go on
                        task_logger(log, beat._task_id).exception("heartbeat failed")
                    beat._due = time.monotonic() + beat._interval
                    continue
                wait = beat._due - now
            self._until = time.monotonic() + wait
            self._wake.wait(None if wait == float("inf") else wait)
            self._wake.clear()


_the_beater: _Beater | None = None


def _beater() -> _Beater:
    """This process's beat thread, started on first use (a forked work horse starts its own: threads do not
    survive a fork)."""
    global _the_beater
    found = _the_beater
    if found is None or found.pid != os.getpid():
        found = _the_beater = _Beater()
    return found


def _end_process(code: int) -> None:
    """End this process now (the run is past its grace), its log lines written first."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(code)


def needed_folders(store: TaskStore, task_id: str, asking: str | None = None) -> set[str]:
    """The result folders (run ids) the task names now: while it is unfinished, its checkpoint's (the next run
    resumes there) and its current run's (unless that is ``asking``, the run on its way out); once COMPLETED,
    its result's. A folder not named now is never named later (a run works in its own new folder or in the
    checkpoint's, and run again starts afresh), so a run may remove one it finds unnamed."""
    found = store.get_with_result(task_id)
    task = found.task
    if task is None:
        return set()
    if task.status in ACTIVE:
        return {run for run in (task.checkpoint_run, task.run_id if task.run_id != asking else None) if run}
    stored = found.result
    if task.status == TaskStatus.COMPLETED and isinstance(stored, dict) and isinstance(stored.get("run"), str):
        return {stored["run"]}
    return set()


def discard(store: TaskStore, task_id: str, run_id: str, results: ResultStore, *, ended: bool = False) -> None:
    """Remove the result folder run ``run_id`` worked in (``results``' view), once its ending is decided, unless
    the task names it (:func:`needed_folders`). A run that lost the task removes a folder only if it created it
    (a resumed run works in the folder of the run that saved the checkpoint); one that ``ended`` the task
    itself (FAILED, or retried) removes the folder it worked in: no other run holds the task then."""
    folder = results.run_id
    if folder is not None and (ended or folder == run_id) and folder not in needed_folders(store, task_id, run_id):
        results.delete(task_id)
