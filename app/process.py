"""Process lifetime helpers shared by the worker and the scheduler."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>
_forking_parent: int | None = None  # set just before a fork, read by the child (see forked_children_die_with_me)


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> None:
    """Linux: have the kernel send ``sig`` to this process when its parent dies, even by SIGKILL, so no
    child (a work horse, the housekeeper) outlives the process that owns it. Elsewhere: nothing.

    ``parent``: the pid this process was started by. A parent that died before this call (while the
    child was still starting) would never send the signal, so then it is sent at once."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
        if parent is not None and os.getppid() != parent:
            os.kill(os.getpid(), sig)


def forked_children_die_with_me(sig: int = signal.SIGTERM) -> None:
    """Every child this process forks from now on gets ``die_with_parent(sig)`` (RQ forks its scheduler and
    its work horses itself): a ``kill -9`` of the worker then leaves no orphan holding RQ's locks."""

    def before() -> None:
        global _forking_parent
        _forking_parent = os.getpid()

    os.register_at_fork(before=before, after_in_child=lambda: die_with_parent(sig, _forking_parent))
