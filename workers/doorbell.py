"""A doorbell beside a SQLite queue file, so an idle consumer sees a message at once
instead of at its next look (Redis queues have BRPOP for this).

The bell is a FIFO (``review.bell`` next to ``review.db``). Every enqueue writes one byte
to it after its commit; an idle consumer thread waits in ``poll()`` on it and takes one
byte before it looks at the queue again. A byte stays in the pipe until some consumer
takes it, so a message sent just before a consumer starts to wait still wakes it. Every
process opens the FIFO read-write, so a ring never blocks or fails for want of a reader,
and a waiter never sees end-of-file.

A busy consumer takes messages without taking their bytes, so bytes pile up behind a
burst. A consumer that is about to wait therefore first drops the bytes waiting
(:meth:`Doorbell.drain`) and looks once more, and a consumer that found a message after a
drain or a wake-up rings once to pass the wake-up on, for a message whose byte was dropped.

A process-local pipe is polled beside it: :meth:`Doorbell.interrupt` (a consumer
stopping) wakes every waiting thread of this process and keeps them from waiting again.

Where a FIFO cannot be made or opened (a file system without them, not POSIX), the bell
is unusable: the consumer looks at its queue every ``poll_seconds``, and one
``queue.doorbell_unavailable`` warning says so. A bell replaced on disk while processes
run (deleted and made again by a new process) is opened again by a waiter whose wait ran
out and by a sender at most once a second.
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
_RECHECK_S = 1.0  # how often a sender checks that the bell on disk is still its own


class Doorbell:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._stop_r = self._stop_w = -1
        self._lock = threading.Lock()
        self._broken = False
        self._checked_at = 0.0

    @property
    def usable(self) -> bool:
        return self._open() is not None

    def _open(self) -> int | None:
        if self._fd is not None or self._broken:
            return self._fd
        with self._lock:
            if self._fd is None and not self._broken:
                fd = stop_r = stop_w = -1
                try:
                    fd = self._make()
                    stop_r, stop_w = os.pipe()  # not inherited by agents (PEP 446)
                    os.set_blocking(stop_r, False)
                    os.set_blocking(stop_w, False)
                except OSError as exc:
                    for f in (fd, stop_r, stop_w):
                        if f >= 0:
                            os.close(f)
                    self._broken = True
                    logs.get().warning(
                        "queue.doorbell_unavailable",
                        path=str(self.path),
                        error=str(exc),
                        fallback="looking at the queue every poll_seconds",
                    )
                else:
                    # The stop pipe first: a thread that sees the FIFO sees the pipe too.
                    self._stop_r, self._stop_w = stop_r, stop_w
                    self._fd = fd
        return self._fd

    def _make(self) -> int:
        with contextlib.suppress(FileExistsError):
            os.mkfifo(self.path, 0o600)
        fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "exists and is not a FIFO")
        return fd

    def _still_ours(self, fd: int) -> int:
        """The FIFO to use: ``fd``, now on the bell on disk if it was replaced. The new
        bell takes the old one's descriptor number (dup2): a thread polling that number
        sees the new bell from its next wait, a sender writes to it, and nothing is left
        open. A new number for each replacement leaked one descriptor each time, and
        closing the old one under a thread about to write to it could hand its byte to
        whatever file was opened next with that number."""
        self._checked_at = time.monotonic()
        try:
            if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                return fd
            with self._lock:
                if self._fd == fd:
                    new = self._make()
                    try:
                        os.dup2(new, fd, inheritable=False)
                    finally:
                        os.close(new)
                    logs.get().warning("queue.doorbell_replaced", path=str(self.path))
                return fd
        except OSError:
            return fd  # gone or unreadable: the next check tries again

    def ring(self) -> None:
        """Say one message was sent. Never blocks; a full pipe already wakes everyone."""
        fd = self._open()
        if fd is None:
            return
        if time.monotonic() - self._checked_at >= _RECHECK_S:
            fd = self._still_ours(fd)
        # Under the lock close takes, to a bell still open: the control closes its queues
        # as it stops without waiting for its ticker (N27), whose send may be here; the
        # byte went to whatever file took the closed number next. A bell closed is done
        # with: the message waits in the queue for the next reader, who looks as it starts.
        with self._lock, contextlib.suppress(*_EMPTY):
            if self._fd == fd:
                os.write(fd, b"\0")

    def drain(self) -> int:
        """Drop the bytes waiting (their messages were taken, or are about to be looked
        for by the caller); how many there were."""
        fd = self._open()
        dropped = 0
        while fd is not None:
            try:
                got = len(os.read(fd, 65536))
            except _EMPTY:
                break
            dropped += got
            if got < 65536:
                break
        return dropped

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
                self._still_ours(fd)
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

    def close(self) -> None:
        """Close the FIFO and the stop pipe: the queue is done with (a command ends). A
        bell closed and used again opens anew; never closed under a waiting thread."""
        with self._lock:
            fds, self._fd = (self._fd, self._stop_r, self._stop_w), None
            self._stop_r = self._stop_w = -1
        for fd in fds:
            if fd is not None and fd >= 0:
                os.close(fd)

    def __del__(self) -> None:
        # A bell nothing holds any more (its queue dropped unclosed): its descriptors go
        # with it, not at the process's end.
        with contextlib.suppress(Exception):
            self.close()

    def interrupt(self) -> None:
        """Wake every thread waiting here, now and later: the consumer is stopping."""
        if self._open() is not None:
            with contextlib.suppress(*_EMPTY):
                os.write(self._stop_w, b"\0")
