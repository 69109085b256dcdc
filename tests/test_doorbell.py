"""The SQLite queues' doorbell (workers/doorbell.py): a message wakes an idle consumer at
once instead of at its next look, and a stopping consumer does not wait out its look."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable

import pytest
from huey import SqliteHuey
from huey.constants import EmptyData
from huey.storage import SqliteStorage
from structlog.testing import capture_logs

from orchestrator import logs
from workers.consumers import QueueConsumer
from workers.doorbell import Doorbell
from workers.queues import QueueStorage

from .conftest import PROJECT

LONG = 60.0  # a look this long would fail every bounded wait below


def _watch_waits(bell: Doorbell, on_wait: Callable[[], object], woke: list | None = None) -> None:
    """Call ``on_wait`` as a thread starts to wait on ``bell`` (so a test knows it waits);
    each wait's answer goes to ``woke``."""
    plain_wait = bell.wait

    def watched_wait(timeout: float) -> bool:
        on_wait()
        answer = plain_wait(timeout)
        if woke is not None:
            woke.append(answer)
        return answer

    bell.wait = watched_wait  # type: ignore[method-assign]


def test_a_ring_before_the_wait_is_kept_for_it(tmp_path):
    bell = Doorbell(tmp_path / "q.bell")
    bell.ring()
    assert bell.wait(LONG) is True


def test_a_ring_the_bell_is_closed_under_writes_into_no_other_file(tmp_path):
    """U98: the control closes its queues as it stops (N27) without waiting for its ticker,
    whose send may be ringing the bell: the ring had the bell's descriptor, the close
    closed it, and the ring's byte went to that number, the next file opened taking it
    (state.db, a log), or failed as EBADF, logged as the queue unavailable."""
    bell = Doorbell(tmp_path / "q.bell")
    assert bell.usable
    taken: list[int] = []

    def closed_meanwhile(fd: int) -> int:  # between the ring's look at its bell and its write
        bell.close()
        taken.append(os.open(tmp_path / "state.db", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        return fd

    bell._still_ours = closed_meanwhile  # type: ignore[method-assign]
    bell._checked_at = float("-inf")  # its look at the bell on disk is due
    try:
        bell.ring()
    finally:
        for fd in taken:
            os.close(fd)
    assert (tmp_path / "state.db").read_bytes() == b""


def test_one_ring_wakes_one_of_several_waiters(tmp_path):
    bell = Doorbell(tmp_path / "q.bell")
    results: list[bool] = []
    done = threading.Condition()

    def waiter() -> None:
        woke = bell.wait(LONG)
        with done:
            results.append(woke)
            done.notify_all()

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for t in threads:
        t.start()
    bell.ring()
    with done:
        assert done.wait_for(lambda: results, timeout=20), "no waiter took the ring"
    bell.interrupt()  # the other two
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads)
    assert sorted(results) == [False, False, True]


def test_a_message_from_another_process_wakes_a_waiting_consumer(tmp_path):
    """The consumer's look is a minute away; the sender's ring brings the message at once."""
    db = tmp_path / "review.db"
    storage = QueueStorage("review", str(db), idle_look=LONG)
    assert storage.blocking
    waiting, woke, got = threading.Event(), [], []
    _watch_waits(storage.bell, waiting.set, woke)

    def consume() -> None:
        for _ in range(3):  # empty and wait; woken; the message
            data = storage.dequeue()
            if data is not None:
                got.append(data)
                return

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        assert waiting.wait(20), "the consumer never waited on its bell"
        sender = (
            "import sys; from workers.queues import QueueStorage; "
            "QueueStorage('review', sys.argv[1]).enqueue(b'hello', 0)"
        )
        subprocess.run([sys.executable, "-c", sender, str(db)], cwd=PROJECT, check=True, timeout=60)
        consumer.join(20)
        assert not consumer.is_alive(), "the ring did not wake the consumer"
    finally:
        storage.bell.interrupt()
        consumer.join(20)
    assert woke[0] is True and got == [b"hello"]


def test_a_bell_that_is_not_a_fifo_leaves_the_queue_polling_and_says_so(tmp_path):
    (tmp_path / "review.bell").write_text("not a fifo\n")
    logs.get()  # configured before the capture, not inside it
    with capture_logs() as logged:
        storage = QueueStorage("review", str(tmp_path / "review.db"), idle_look=LONG)
        storage.enqueue(b"m", 0)  # the ring is skipped, the message kept
        storage.enqueue(b"n", 0)
    assert storage.blocking is False  # Huey's consumer sleeps poll_seconds between looks
    assert [storage.dequeue(), storage.dequeue(), storage.dequeue()] == [b"m", b"n", None]
    warned = [e for e in logged if e["event"] == "queue.doorbell_unavailable"]
    assert len(warned) == 1 and "not a FIFO" in warned[0]["error"]
    assert (tmp_path / "review.bell").read_text() == "not a fifo\n"


def test_a_stopping_consumer_does_not_wait_out_its_look(tmp_path):
    """A graceful stop of Huey's consumer joins its threads; they wait on the bell for a
    minute, so the stop must wake them (Huey's own stop flag cannot)."""
    huey = SqliteHuey(
        "review", filename=str(tmp_path / "review.db"), storage_class=QueueStorage, idle_look=LONG
    )
    entered = threading.Semaphore(0)
    _watch_waits(huey.storage.bell, entered.release)
    consumer = QueueConsumer(huey, workers=3, periodic=False, initial_delay=LONG, max_delay=LONG)
    consumer.shutdown_timeout = 20  # a broken stop returns after this, its threads alive
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        consumer.start()
        for _ in range(3):
            assert entered.acquire(timeout=20), "a consumer thread never waited on its bell"
        consumer.stop(graceful=True)
        threads = [t for _, t in consumer.worker_threads]
        assert not any(t.is_alive() for t in threads), "a thread still waits on its bell"
        # An interrupted bell returns at once: a look after the stop must not spin on it.
        assert huey.storage.blocking is False
    finally:
        consumer.stop_flag.set()
        huey.storage.bell.interrupt()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_a_consumer_stops_soon_after_its_signal(tmp_path):
    """Huey's main thread looked at its stop flag every 0.1 s, so every stop (a sweep's
    end: its control and its worker) began ~50 ms after the signal on average."""
    from huey.consumer import ConsumerStopped

    huey = SqliteHuey(
        "review", filename=str(tmp_path / "review.db"), storage_class=QueueStorage, idle_look=LONG
    )
    consumer = QueueConsumer(huey, workers=1, periodic=False, initial_delay=LONG, max_delay=LONG)
    consumer.shutdown_timeout = 20
    # Huey's look at its stop flag made a minute long: only the signal's wake-up can end
    # the wait in time (a bound near 0.1 s would measure the machine's load, not the code).
    consumer._stop_flag_timeout = 60
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        consumer.start()
        began = time.monotonic()
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()  # mid-wait
        with pytest.raises(ConsumerStopped):
            consumer.loop()
        took = time.monotonic() - began
        assert not any(t.is_alive() for _, t in consumer.worker_threads)
        assert took < 30, f"the stop began {took:.1f} s after its signal"
    finally:
        consumer.stop_flag.set()
        huey.storage.bell.interrupt()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_a_task_without_a_revoke_flag_takes_no_write_lock_after_it_runs(tmp_path):
    """Huey clears a task's revoke flag after every task; with none set (reviewq never
    revokes) that must not wait for the queue file's write lock, which others hold."""
    db = tmp_path / "review.db"
    storage = QueueStorage("review", str(db), timeout=30)
    storage.put_data("r:flagged", b"1")
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process mid-enqueue
    answers: list[bool] = []
    clearing = threading.Thread(target=lambda: answers.append(storage.delete_data("r:none")))
    clearing.start()
    clearing.join(10)
    waited = clearing.is_alive()
    holder.execute("ROLLBACK")
    clearing.join(60)
    holder.close()
    assert not waited, "clearing an absent flag waited for the write lock"
    assert answers == [False]
    assert storage.delete_data("r:flagged") is True  # a flag that is set is still cleared
    assert storage.peek_data("r:flagged") is EmptyData


def test_a_task_runs_without_a_look_for_revoke_flags(kb):
    """Huey looked for a task's revoke flags before running it and cleared them after:
    two reads of the queue file a message, on each side, for flags reviewq never sets.
    A stop request (a key of reviewq's own) is still read and taken off."""
    from orchestrator.config import load_settings
    from workers.queues import StopRequests, huey_for

    huey = huey_for(load_settings(kb.root), "review")
    ran: list[int] = []
    task = huey.task(name="probe")(ran.append)
    statements: list[str] = []
    huey.storage.conn.set_trace_callback(statements.append)
    huey.execute(huey.dequeue() or task.s(7))
    huey.storage.conn.set_trace_callback(None)
    assert ran == [7]
    assert not [s for s in statements if " kv " in s], statements
    stops = StopRequests(huey)
    stops.ask(3, 1, "finalized by hand")
    assert stops.asked(3, 1) == "finalized by hand"
    stops.ask(3, 2, "lost")
    stops.forget(3, 2)
    assert stops.asked(3, 2) is None


def test_an_interrupt_inside_a_queue_write_rolls_it_back(tmp_path):
    """Huey's storage rolled back on an Exception only: a Ctrl-C inside a write (a sweep's
    nudge, waiting for the lock the control held) left the exclusive transaction open,
    and the queue file locked for the other processes until this one ended."""
    db = tmp_path / "control.db"
    storage = QueueStorage("control", str(db))
    with pytest.raises(KeyboardInterrupt), storage.db(commit=True) as curs:
        curs.execute(
            "insert into task (queue, data, priority) values (?, ?, ?)", ("control", b"half", 0)
        )
        raise KeyboardInterrupt
    other = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None); "
        "c.execute('begin immediate'); c.execute('rollback')"
    )
    writer = subprocess.run(
        [sys.executable, "-c", other, str(db)], capture_output=True, text=True, timeout=60
    )
    assert writer.returncode == 0, f"another process could not write: {writer.stderr[-300:]}"
    storage.enqueue(b"next", 0)  # and this connection writes on
    assert [storage.dequeue(), storage.dequeue()] == [b"next", None]


def _waiting_bytes(bell: Doorbell) -> int:
    buf = bytearray(4)
    fcntl.ioctl(bell._fd, termios.FIONREAD, buf)
    return int.from_bytes(buf, sys.byteorder)


def test_bytes_left_by_a_busy_consumer_are_dropped_before_an_idle_wait(tmp_path):
    """A busy consumer takes messages without their bytes; going idle, one consumer drops
    them instead of making one empty look per byte, each waking every waiter."""
    storage = QueueStorage("review", str(tmp_path / "review.db"), idle_look=0.05)
    for i in range(300):
        storage.enqueue(b"m%d" % i, 0)
    taken = [SqliteStorage.dequeue(storage) for _ in range(300)]  # the busy thread's looks
    assert None not in taken and _waiting_bytes(storage.bell) == 300
    assert storage.dequeue() is None  # idle: drops them, looks again, waits out its look
    assert _waiting_bytes(storage.bell) == 0


def test_a_consumer_that_finds_a_message_passes_the_wake_up_on(tmp_path):
    """Two messages, one byte (the other dropped with stale ones by a drain): the consumer
    woken by it takes one message and rings, so the second waiting consumer takes the
    other at once, not at its next look a minute later."""
    db = str(tmp_path / "review.db")
    consumers = [QueueStorage("review", db, idle_look=LONG) for _ in range(2)]
    waiting = threading.Semaphore(0)
    got: list[bytes] = []
    for c in consumers:
        _watch_waits(c.bell, waiting.release)

    def take(c: QueueStorage) -> None:
        for _ in range(4):
            data = c.dequeue()
            if data is not None:
                got.append(data)
                return

    threads = [threading.Thread(target=take, args=(c,)) for c in consumers]
    for t in threads:
        t.start()
    try:
        for _ in consumers:
            assert waiting.acquire(timeout=20), "a consumer never waited on its bell"
        SqliteStorage.enqueue(consumers[0], b"a", 0)
        SqliteStorage.enqueue(consumers[0], b"b", 0)
        consumers[0].bell.ring()  # one byte for two messages
        for t in threads:
            t.join(20)
        assert not any(t.is_alive() for t in threads), "the wake-up was not passed on"
    finally:
        for c in consumers:
            c.bell.interrupt()
        for t in threads:
            t.join(20)
    assert sorted(got) == [b"a", b"b"]


def test_a_bell_without_its_stop_pipe_is_not_used_half_made(tmp_path, monkeypatch):
    """No pipe for the stop (out of descriptors): the bell is unusable as a whole, its
    FIFO closed, and the queue polls; it never waits on half a bell."""

    def no_pipe() -> tuple[int, int]:
        raise OSError(errno.EMFILE, "Too many open files")

    def bell_fds() -> list[str]:
        # Counting every descriptor of the process was flaky: the collector closes other
        # tests' leftovers meanwhile. What matters is that none holds this bell's FIFO.
        fds = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path / "review.bell")):
                    fds.append(fd)
        return fds

    monkeypatch.setattr(os, "pipe", no_pipe)
    storage = QueueStorage("review", str(tmp_path / "review.db"), idle_look=LONG)
    assert storage.blocking is False and storage.bell.usable is False
    assert (tmp_path / "review.bell").exists() and bell_fds() == []  # closed at once
    assert storage.bell.wait(LONG) is False  # at once, without an error
    storage.enqueue(b"m", 0)
    assert storage.dequeue() == b"m"
    storage.close()
    assert bell_fds() == []


def test_a_bell_made_again_on_disk_is_followed(tmp_path):
    """The bell deleted and made again while a consumer waits (say by a clean-up while
    it ran): the consumer's wait runs out, it opens the new bell, and a ring on the new
    one reaches it."""
    path = tmp_path / "review.bell"
    waiter = Doorbell(path)
    assert waiter.usable
    path.unlink()
    sender = Doorbell(path)  # a process started later makes a new FIFO
    sender.ring()
    woke = [waiter.wait(0.2) for _ in range(3)]
    assert True in woke


def test_a_bell_made_again_many_times_keeps_one_descriptor(tmp_path, monkeypatch):
    """Each replacement of the bell on disk opened the new one under a new descriptor and
    kept the old: one descriptor a replacement, for the life of the process."""
    from workers import doorbell

    monkeypatch.setattr(doorbell, "_RECHECK_S", 0.0)  # every ring checks the bell on disk
    path = tmp_path / "review.bell"
    bell = Doorbell(path)
    assert bell.usable

    def bells_open() -> int:  # this process's descriptors on the bell, replaced ones too
        opened = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                opened += os.readlink(f"/proc/self/fd/{fd}").startswith(str(path))
            except OSError:
                continue  # closed meanwhile (the listing's own)
        return opened

    assert bells_open() == 1
    for _ in range(20):
        path.unlink()
        os.mkfifo(path, 0o600)
        bell.ring()
    assert bells_open() == 1
    assert bell.wait(0.5)  # the last ring is on the bell now on disk


def test_a_bell_closed_or_dropped_leaves_no_descriptor_open(tmp_path):
    """A bell's FIFO and stop pipe close with it: closed (its queue closed as a command
    ends) or collected unclosed (an app made and dropped). Neither did: three descriptors
    a bell, for the rest of the process."""
    import gc

    def descriptors() -> int:
        gc.collect()
        return len(os.listdir("/proc/self/fd"))

    before = descriptors()
    bell = Doorbell(tmp_path / "q.bell")
    bell.ring()
    assert bell.wait(5)
    bell.close()
    assert descriptors() == before
    bell.ring()  # used again after its close: opened anew
    assert bell.wait(5)
    del bell
    assert descriptors() == before
