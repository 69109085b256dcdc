"""The ``reviewq sweep`` that started this process, if one did: its children must not
outlive it."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # prctl(2)

# Set by ``reviewq sweep`` in its children's environment: its pid.
PARENT_ENV = "REVIEWQ_SWEEP_PID"


def follow_parent() -> None:
    """A sweep's child stops (SIGTERM: at once, its tasks queued again) when the sweep
    dies, however it dies: killed with SIGKILL, it could not stop them itself, and they
    ran on unwatched. Linux only; elsewhere a no-op."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # the sweep died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)
