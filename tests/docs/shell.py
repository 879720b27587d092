"""One bash per page, kept for the whole page, as a reader keeps one terminal open through it.

The pages build on what their earlier commands set (``$API``, ``$TASK``, the ``wait_done`` function), so
every block of a page runs in the same shell, one after the other. bash reads the blocks from a pipe of
its own (fd 3) while its commands get ``/dev/null`` as stdin: a command that reads stdin by mistake gets
end-of-file instead of swallowing the next block. stdout and stderr share one pipe, so what a block
prints reaches us in the order a terminal would show it (``curl -D /dev/stderr`` headers before the
body). After each block a marker line is printed; what came before it is the block's output.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

from app.core.process import kill_session


class ShellTimeout(AssertionError):
    """A block did not finish in time; the shell is stopped (the page's later blocks cannot run)."""


class Shell:
    """A bash session in ``cwd`` with ``env``; ``run(source)`` returns what ``source`` printed."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        read_end, self._commands = os.pipe()
        self._marker = f"__docs_block_done_{uuid.uuid4().hex}__"
        self._proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc", f"/dev/fd/{read_end}"], cwd=cwd, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            pass_fds=(read_end,), start_new_session=True)
        os.close(read_end)
        self._buffer = bytearray()
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="docs-shell-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        while chunk := os.read(self._proc.stdout.fileno(), 65536):
            with self._changed:
                self._buffer += chunk
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def run(self, source: str, timeout: float) -> str:
        """Run ``source`` (one or more commands, as a reader pastes them) and return its output."""
        marker = self._marker.encode()
        os.write(self._commands, f"{source.rstrip()}\nprintf '%s\\n' '{self._marker}'\n".encode())
        deadline = time.monotonic() + timeout
        with self._changed:
            while marker not in self._buffer:
                left = deadline - time.monotonic()
                if self._proc.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"the shell exited ({self._proc.returncode}) after printing:\n"
                                         f"{self._buffer.decode(errors='replace')}")
                if left <= 0:
                    printed = self._buffer.decode(errors="replace")
                    self.close()
                    raise ShellTimeout(f"still running after {timeout:.0f} s; it printed:\n{printed}")
                self._changed.wait(min(left, 0.5))
            output, _, rest = bytes(self._buffer).partition(marker + b"\n")
            self._buffer = bytearray(rest)
        return output.decode(errors="replace")

    def close(self) -> None:
        """Stop the shell and whatever the page left running in its session (a receiver started with ``&``)."""
        if self._commands >= 0:
            os.close(self._commands)
            self._commands = -1
        kill_session(self._proc.pid)
        self._proc.wait()
        self._reader.join(timeout=5)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
