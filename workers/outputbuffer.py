"""The run's side of ``ctx.emit`` (:class:`BuffersOutput`, a mixin of workers.context.TaskContext): the output
lines a processor emits wait here, cut and encoded, and go to Redis in batches (the runner's OutputLog.emit),
oldest first, at most ``OUTPUT_INTERVAL`` after the previous write, and all of them before the run's end.

Its own module because the buffer is a concern of its own: its own locks (a write of lines may run in the
heartbeat's thread while the processor emits more), its own caps and its own retry of a failed write, sharing
with the rest of the context only the clock, the logger and the cancellation. The lines' encoding and the EMIT
script are app.core.output's.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from app.core.output import MAX_SEND, encode, split
from app.core.states import TaskStatus
from workers.items import PROPAGATE

# Writes a run's output lines (encoded, oldest first) after a count of lines dropped unsent, and answers the
# task's status: the runner's OutputLog.emit.
Emit = Callable[[list[bytes], int], str]
# Output lines wait in the context at most this long after the previous write (a line emitted later than that
# is written at once), or until OUTPUT_BATCH of them wait, a progress flush, a heartbeat or the run's end:
# a processor emitting 1,000 lines a second costs ~5 writes a second (bench/README.md, "Live output").
OUTPUT_INTERVAL = 0.2
OUTPUT_BATCH = 1000


class BuffersOutput:
    """Mixin of :class:`~workers.context.TaskContext`: its live output (see the module docstring). The context
    calls :meth:`_init_output` from its constructor."""

    task_id: str
    log: logging.Logger | logging.LoggerAdapter
    _clock: Callable[[], float]
    _cancelled: bool

    mark_cancelled: Callable[[], None]
    check_cancelled: Callable[[], None]

    def _init_output(self, emit: Emit | None, output_limits: tuple[int, int]) -> None:
        self._emit_fn = emit  # None: lines are cut and dropped (a context outside a worker)
        self._output_max_lines, self._output_max_bytes = output_limits
        self._output: list[bytes] = []  # lines emitted and not written yet (see OUTPUT_INTERVAL)
        self._output_skipped = 0  # lines dropped unsent before those (more than the task keeps were waiting)
        self._output_lock = threading.Lock()  # guards _output
        self._output_writing = threading.Lock()  # one write at a time, so lines reach Redis in order
        self._output_written_at = -math.inf

    def emit(self, text: str) -> None:
        """Add ``text`` to the task's live output (``GET /tasks/{id}/output``, ``event: output`` of its event
        stream): one line per ``\n`` in it, each cut to ``TASKPORT_OUTPUT_MAX_LINE_BYTES``. A line is written
        at once when the previous write is ``OUTPUT_INTERVAL`` old, else with the next write; every line is
        written before the run's end is. The task keeps its last ``TASKPORT_OUTPUT_MAX_LINES`` lines. This is
        a cancellation point."""
        at = time.time_ns() // 1_000_000
        lines = [encode(at, line) for line in split(text, self._output_max_bytes)]
        with self._output_lock:
            self._output.extend(lines)
            self._keep_newest()
            due = len(self._output) >= OUTPUT_BATCH or self._clock() - self._output_written_at >= OUTPUT_INTERVAL
        if due:
            self.flush_output()
        self.check_cancelled()

    def flush_output(self) -> None:
        """Write the output lines waiting, oldest first, in calls of at most MAX_SEND lines. A failed write is
        logged and its lines wait for the next one; a run that no longer holds the task drops them (and is
        marked cancelled). Safe from any thread; never raises TaskCancelled."""
        with self._output_writing:
            with self._output_lock:
                lines, self._output = self._output, []
                skipped, self._output_skipped = self._output_skipped, 0
                self._output_written_at = self._clock()
            if not lines or self._emit_fn is None or self._cancelled:
                return
            for start in range(0, len(lines), MAX_SEND):
                try:
                    status = self._emit_fn(lines[start:start + MAX_SEND], skipped)
                except PROPAGATE:
                    raise
                except Exception:
                    self.log.warning("task %s: output write failed (retried with the next one)", self.task_id,
                                     exc_info=True)
                    with self._output_lock:
                        self._output[:0] = lines[start:]
                        self._output_skipped += skipped
                        self._keep_newest()
                    return
                skipped = 0
                if status != TaskStatus.PROCESSING:
                    self.mark_cancelled()
                    return

    def _keep_newest(self) -> None:
        """Drop the oldest lines waiting past what the task keeps (the list would trim them at once), counting
        them: they still take their ids (the caller holds _output_lock)."""
        excess = len(self._output) - self._output_max_lines
        if excess > 0:
            del self._output[:excess]
            self._output_skipped += excess
