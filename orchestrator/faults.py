"""Named fault-injection points for the fault tests (CONTRACT §12), inert unless asked for.

``point("finalize.mid_transaction")`` does nothing unless the environment variable
``REVIEWQ_FAULT_FINALIZE_MID_TRANSACTION`` names an existing FIFO. Then the process writes
its pid to the FIFO (which blocks until the test reads it), removes the FIFO so the fault
fires once, and waits to be killed: the test decides what happens to it at that moment.
"""

from __future__ import annotations

import contextlib
import os
import threading


def point(name: str) -> None:
    path = os.environ.get("REVIEWQ_FAULT_" + name.upper().replace(".", "_"))
    if not path or not os.path.exists(path):
        return
    with open(path, "w") as fifo:
        fifo.write(f"{os.getpid()}\n")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    threading.Event().wait()  # until killed
