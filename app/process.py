"""Process lifetime helpers shared by the worker and the scheduler."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: have the kernel send ``sig`` to this process when its parent dies, even by SIGKILL, so no
    child (a work horse, the housekeeper) outlives the process that owns it. Elsewhere: nothing."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def forked_children_die_with_me(sig: int = signal.SIGTERM) -> None:
    """Every child this process forks from now on gets ``die_with_parent(sig)`` (RQ forks its scheduler and
    its work horses itself): a ``kill -9`` of the worker then leaves no orphan holding RQ's locks."""
    os.register_at_fork(after_in_child=lambda: die_with_parent(sig))
