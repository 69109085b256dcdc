"""A doorbell beside a SQLite queue file, so an idle consumer sees a message at once
instead of at its next look (Redis queues have BRPOP for this).

The bell is a FIFO (``review.bell`` next to ``review.db``). Every enqueue writes one byte
to it; an idle consumer thread waits in ``poll()`` on it and takes one byte before it
looks at the queue again. A byte stays in the pipe until some consumer takes it, so a
message sent just before a consumer starts to wait still wakes it; a byte whose message
another thread took first costs one empty look. Every process opens the FIFO read-write,
so a ring never blocks or fails for want of a reader, and a waiter never sees end-of-file.

A process-local pipe is polled beside it: :meth:`Doorbell.interrupt` (a consumer
stopping) wakes every waiting thread of this process and keeps them from waiting again.

Where a FIFO cannot be made or opened (a file system without them, not POSIX), the bell
is unusable: the consumer looks at its queue every ``poll_seconds`` as before, and one
``queue.doorbell_unavailable`` warning says so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import threading
import time
from pathlib import Path

from orchestrator import logs

_EMPTY = (BlockingIOError, InterruptedError)


class Doorbell:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._stop_r: int | None = None
        self._stop_w: int | None = None
        self._lock = threading.Lock()
        self._broken = False

    @property
    def usable(self) -> bool:
        return self._open() is not None

    def _open(self) -> int | None:
        if self._fd is not None or self._broken:
            return self._fd
        with self._lock:
            if self._fd is None and not self._broken:
                try:
                    self._fd = self._make()
                    self._stop_r, self._stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
                except (OSError, AttributeError) as exc:
                    self._broken = True
                    logs.get().warning(
                        "queue.doorbell_unavailable",
                        path=str(self.path),
                        error=str(exc),
                        fallback="looking at the queue every poll_seconds",
                    )
        return self._fd

    def _make(self) -> int:
        with contextlib.suppress(FileExistsError):
            os.mkfifo(self.path, 0o600)
        fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "exists and is not a FIFO")
        return fd

    def ring(self) -> None:
        """Say one message was sent. Never blocks; a full pipe already wakes everyone."""
        fd = self._open()
        if fd is None:
            return
        with contextlib.suppress(_EMPTY):
            os.write(fd, b"\0")

    def wait(self, timeout: float) -> bool:
        """Block until this thread takes a ring (True) or ``timeout`` seconds pass or the
        bell is interrupted (False). Threads woken together for one ring all but one go
        back to waiting here, without a look at the queue."""
        fd = self._open()
        if fd is None:
            return False
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready = {f for f, _ in poller.poll(left * 1000)}
            if self._stop_r in ready:
                return False
            if fd in ready:
                try:
                    if os.read(fd, 1):
                        return True
                except _EMPTY:
                    continue  # another thread took that ring

    def interrupt(self) -> None:
        """Wake every thread waiting here, now and later: the consumer is stopping."""
        if self._open() is not None:
            with contextlib.suppress(_EMPTY):
                os.write(self._stop_w, b"\0")
