"""The life of the processes reviewq starts: a ``reviewq sweep``'s children must not
outlive it, and a sweep or a run-job stopped by a signal stops what it started."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Iterator

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


def terminate_raises(
    terminated: list, ctrl_c: bool = False
) -> contextlib.AbstractContextManager[None]:
    """SIGTERM or SIGHUP (``kill PID``, a closed terminal, a CI job cancelled) interrupts
    a sweep or a run-job as Ctrl-C does, so that what it started is stopped: by default
    Python dies at once and leaves its children running agents. Once one came, any
    further one is ignored until the process ends: the children are being stopped, and
    what is owed (a summary, the job queued again) is due. ``terminated`` gets the
    signal's number. With ``ctrl_c``, SIGINT is taken so too (a run-job: a second Ctrl-C
    within the grace given an agent that ignores SIGTERM left it running, its
    registration gone); a sweep keeps it, where a second Ctrl-C means "at once". A
    signal ignored when this starts (``nohup``, ``cmd &`` in a script) stays ignored."""
    wanted = (signal.SIGTERM, signal.SIGHUP)
    return first_raises(terminated, (signal.SIGINT, *wanted) if ctrl_c else wanted)


@contextlib.contextmanager
def first_raises(terminated: list, wanted: tuple[int, ...]) -> Iterator[None]:
    """Within: the first of the ``wanted`` signals raises KeyboardInterrupt (its number
    put in ``terminated``), and any after it is ignored, then and until the process
    ends. A signal ignored when this starts stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        if not terminated:
            terminated.append(signum)
            raise KeyboardInterrupt

    signals = [s for s in wanted if signal.getsignal(s) is not signal.SIG_IGN]
    old = {s: signal.signal(s, interrupt) for s in signals}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, signal.SIG_IGN if terminated else handler)
