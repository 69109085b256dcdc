"""The two long-running consumers: ``reviewq worker`` and ``reviewq control``.

Signals (Huey's): SIGINT stops gracefully, letting running attempts finish; SIGTERM stops
at once, killing running agents, and the interrupted tasks are queued again.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import heapq
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path

from orchestrator import logs
from orchestrator.config import ConfigError, Settings
from orchestrator.control.messages import VERSION
from orchestrator.regularfile import private
from orchestrator.state.store import PROBE_WAIT_S
from orchestrator.state.workspace import Workspace

from . import tasks
from .app import make_app
from .attempt import (
    KILL_GRACE_S,
    STOP_ASKED,
    STOPPING,
    become_subreaper,
    limits_unseen,
    reap_orphans,
    remove_unclaimed,
    stop_launching,
    unclaimed_due_s,
    worker_folder,
)
from .guard import Guard
from .parent import follow_parent
from .queues import (
    CLAIM_KEY,
    Consumer,
    ConsumerStopped,
    StopRequests,
    ThreadEnvironment,
    attempts_on,
    beside_a_control,
    check_queue,
    check_server,
    claim_problem,
    claim_queue,
    claim_when_up,
    eviction_risk,
    fed_by,
    fed_late,
    full_problem,
    move_left_behind,
    profiles_unlike,
    queue_clock,
    refuses_writes,
    release_unlike,
    send,
    send_once,
    shown_url,
    stale_problem,
    unclaim_queue,
    unfed_problem,
)
from .reviewers.base import python_module
from .reviewers.openai import key_problem


class AlreadyRunning(RuntimeError):
    pass


class QueueConsumer(Consumer):
    """Huey's consumer, whose stop also wakes the threads waiting on a SQLite queue's
    doorbell, so a stop is not held up by their wait (``poll_seconds``); and whose
    graceful stop SIGTERM cuts short, as a second SIGINT does."""

    def get_environment(self, worker_type):  # noqa: ANN001, ANN201 - Huey's signature
        return _Threads(self._graceful_sig, self._interrupt_sig)

    # The process ("control", "worker") and the settings it started with, set by its run_*:
    # a SIGHUP reads the file again before its drain (see _reload_refused).
    reload_of: tuple[str, Settings] | None = None
    _kept_on = False  # this stop was a reload refused: the loop goes on

    def take_signals(self) -> None:
        """Take SIGINT, SIGTERM and SIGHUP now, as a stop (or a reload) the first look
        of the loop acts on. Huey sets its handlers last in its start, its threads
        running: a stop asked while the process said it had started (`systemctl stop`
        right after a start, a test stopping it at `control.started`) ended it with exit
        130 and a SIGHUP then killed it, neither with its stop's clean-up."""
        self._set_signal_handlers()

    def loop(self, health_check_ts=None):  # noqa: ANN001, ANN201 - Huey's signature
        try:
            return super().loop(health_check_ts)
        except ConsumerStopped:
            if not self._kept_on:
                raise
            self._kept_on = False
            return health_check_ts

    def _reload_refused(self) -> bool:
        """A SIGHUP's restart would read reviewq.toml again and end at its start when the
        file is wrong (an edit half-saved, a bad value): drained for nothing, the process
        gone, and a service's Restart= failing alike until someone fixed the file. Read
        now, a wrong file refuses the reload, said in one line, and nothing stops."""
        if self.reload_of is None:
            return False
        process, settings = self.reload_of
        while True:
            hups = self._hups
            try:
                now = settings.reread()
                if now is not None:
                    # As the command checks it before its start: a url whose host name was
                    # mistyped reads well, and the new program ended at its start anyway.
                    check_queue(now)
            except ConfigError as exc:
                problem = str(exc)
            else:
                return False
            if not (self._signum == signal.SIGHUP and self.restart_asked):
                return False  # a stop came during the read: it stands
            if self._hups == hups:
                break
            # Another SIGHUP during the check (up to 5 s on a queue that answers late),
            # sent once the file was mended: it asks for the file as it is now.
        self._signum, self._restart, self.restart_asked = None, False, False
        STOP_ASKED.clear()
        self._kept_on = True
        logs.get().error(
            f"{process}.reload_refused",
            config=str(settings.config_path or settings.root / "reviewq.toml"),
            reason=problem,
            recovery="running on with the settings it started with; fix the file and send "
            "SIGHUP again",
        )
        return True

    def stop(self, graceful=False):  # noqa: ANN001, ANN201 - Huey's signature
        if self.restart_asked and self._reload_refused():
            return
        self.stop_flag.set()
        bell = getattr(self.huey.storage, "bell", None)
        if bell is not None:
            # Interrupted, a wait returns at once: Huey's own pause between looks comes back.
            self.huey.storage.blocking = False
            bell.interrupt()
        try:
            super().stop(graceful)
        finally:
            # Stopped: a signal now only stops what follows (the agents' reaping) halfway.
            # (A handler that does nothing, not one that logs: a log call in a handler
            # can deadlock on the lock the interrupted code holds.)
            if threading.current_thread() is threading.main_thread():
                for signum in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(signum, _ignored)

    _draining = False  # in a graceful stop's wait for the running tasks

    def _join_workers(self):  # noqa: ANN202 - Huey's
        # A graceful stop waits here for every running agent, and Huey cuts the wait
        # short on a second SIGINT only: SIGTERM (`kill`, a sweep giving up on its grace,
        # the kernel's signal when the sweep dies) was ignored until the agents ended,
        # and a SIGKILL after it left them running with no worker. Raised in here, the
        # KeyboardInterrupt is Huey's "shut down now".
        self._draining = True
        try:
            if self._signum == self._interrupt_sig:  # it came while the stop began
                raise KeyboardInterrupt
            return super()._join_workers()
        finally:
            self._draining = False

    # SIGHUP (Huey's "restart": drain, then start again). Huey's own restart execs
    # `python *sys.argv`: a sweep's forked child has "reviewq" there, a name Python looked
    # for in the working folder ("can't open file …/reviewq", exit 2), and it skipped
    # what follows the consumer's run (the worker's reaping and its worker.stopped, the
    # control's lock). Done by restart_if_asked instead; a SIGINT or SIGTERM meanwhile
    # turns it back into a stop.
    restart_asked = False
    _hups = 0  # SIGHUPs taken: one during a reload's check asks for another look

    def _handle_signal(self, signum, frame):  # noqa: ANN001, ANN202 - Huey's signature
        # A SIGHUP after a stop was asked (Ctrl-C, then the terminal closed) is no restart:
        # taken for one, the worker asked to stop ran on without its terminal.
        stopping = self._signum is not None and not self.restart_asked
        self._hups += signum == signal.SIGHUP
        super()._handle_signal(signum, frame)
        self.restart_asked, self._restart = self._restart and not stopping, False
        STOP_ASKED.set()
        self.stop_flag.wake()  # the main loop sees it now, not at the end of its wait
        if self._draining and signum == self._interrupt_sig:
            raise KeyboardInterrupt


def _ignored(signum: int, frame: object) -> None:
    pass


def restart_if_asked(consumer: QueueConsumer, process: str) -> None:
    """After a consumer stopped for a SIGHUP: the same command again, in this process, as
    ``python -P -m orchestrator`` runs it however this one was started (the console
    script, ``-m``, a sweep's fork)."""
    if not consumer.restart_asked:
        return
    argv = [*python_module("orchestrator"), *sys.argv[1:]]
    logs.get().info(f"{process}.restarting", signal="SIGHUP", argv=argv)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed terminal's: nothing to flush to
            stream.flush()
    # Ignored until the new program's consumer sets its handler (kept across the exec): a
    # second `systemctl reload` in its start ended the process, which Restart=on-failure
    # takes for a clean stop. That reload's settings are the ones it reads anyway.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    os.execv(argv[0], argv)


class _StopFlag(threading.Event):
    """Huey's stop flag, whose wait in the main thread a signal cuts short. Huey's main
    thread waits on it 0.1 s at a time, and its signal handler only notes the signal: a
    stop began ~50 ms after its signal on average (a sweep's end paid it for both its
    children). There the wait is a poll() on a pipe that :meth:`wake` writes to, which a
    handler may call (no lock is taken); the other threads wait on the event as before."""

    def __init__(self) -> None:
        super().__init__()
        self._r, self._w = os.pipe()  # not inherited by agents (PEP 446)
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._poller = select.poll()  # the main thread's alone
        self._poller.register(self._r, select.POLLIN)

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full: it is awake already
            os.write(self._w, b"\0")

    def set(self) -> None:
        super().set()
        self.wake()

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None or threading.current_thread() is not threading.main_thread():
            return super().wait(timeout)
        if not self.is_set():
            self._poller.poll(max(0.0, timeout) * 1000)
            with contextlib.suppress(BlockingIOError):
                os.read(self._r, 4096)
        return self.is_set()


class _Threads(ThreadEnvironment):
    def get_stop_flag(self) -> _StopFlag:
        return _StopFlag()


def run_worker(settings: Settings, workers: int, kb: Path | None = None) -> None:
    """Consume the review queue with ``workers`` threads, one agent each. The worker opens
    no state folder but its own (``worker_folder``); ``kb`` is an optional read-only copy
    of the KB root for agents that follow links."""
    # Its own stop not asked yet: the marks are the process's, and one forked from a
    # process whose worker had stopped (a test's, a sweep's in-process run after one)
    # abandoned every message as "worker stopping before its agent started" (K104).
    STOP_ASKED.clear()
    STOPPING.clear()
    folder = worker_folder(settings)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    logs.configure(folder, stderr_level="INFO", process="worker")
    follow_parent()
    # What its agents leave running becomes its own child: seen without a sweep of the
    # machine's sessions after each agent (attempt.reap_group).
    become_subreaper()
    app = make_app(settings)
    check_server(app.review, settings)  # a replica or an ACL that refuses its writes
    tasks.install_worker(tasks.WorkerPlace(settings, folder, kb))
    tasks.tell_reaped(
        reap_orphans(folder, said="their worker died", forget=tasks.forget_left).orphaned
    )
    _remove_unclaimed(folder)
    # A folder left for its grace is swept once more when that is past: a worker stopped
    # a moment ago (an upgrade, a reload) kept one for the attempt it queued again, which
    # this one runs in a folder named for its opening (an earlier release's name is not)
    # or another worker takes. Nothing took it up, and it stayed, a prompt quoting notes,
    # until the next start.
    again = None
    if (due := unclaimed_due_s(folder)) is not None:
        again = threading.Timer(due + 1.0, _remove_unclaimed, (folder,))
        again.daemon = True
        again.start()
    if folder != settings.state_dir:
        # Before messages were versioned, workers shared the control's state folder and
        # registered their agents in its run/agents/ (run-job's registry now): a worker of
        # that release killed before an upgrade left agents, a fixer writing its note
        # among them, that nothing else stops. A live run-job's are left alone.
        reap_orphans(settings.state_dir, said="their worker (of an earlier release) died")
    if kb is None and (settings.root / "kb").is_dir():
        # On a machine that has the KB, a worker started without --kb ran its agents with
        # no check that they left the notes alone, and said nothing of it.
        logs.get().warning(
            "worker.kb_unguarded",
            kb=str(settings.root),
            reason="no --kb: this worker's agents are not checked for changes to the KB; "
            f"start it with --kb {settings.root}",
        )
    watch = FeedWatch(settings, app.review) if settings.queue.url else None
    fed = watch.look() if watch is not None else None
    if fed and not beside_a_control(settings):
        for name, problem in profiles_unlike(settings, fed).items():
            logs.get().error("worker.profile_unlike", reviewer=name, reason=problem)
    if (unseen := limits_unseen()) is not None:
        logs.get().warning("worker.limits_unseen", reason=unseen)
    for name, profile in sorted(settings.reviewers.items()):
        if (problem := key_problem(profile)) is not None:
            # Said where the failures will be: each attempt of it ends as a reviewer
            # failure (no key sent), and the profile pauses for every worker.
            logs.get().error("worker.key_unset", reviewer=name, reason=problem)
    poll = settings.queue.poll_seconds
    consumer = QueueConsumer(
        app.review,
        workers=workers,
        periodic=False,
        initial_delay=poll,
        backoff=1.0,
        max_delay=poll,
    )
    consumer.reload_of = ("worker", settings)
    consumer.take_signals()
    logs.get().info(
        "worker.started",
        workers=workers,
        worker=tasks.WORKER_ID,
        queue=queue_described(settings),
        folder=str(folder),
        kb=str(kb) if kb else None,
        messages=VERSION,
    )
    if watch is not None:
        watch.start()
    guard = _guarded(folder)
    try:
        consumer.run()
    finally:
        if watch is not None:
            watch.done.set()
        if again is not None:
            again.cancel()
        # Huey cannot interrupt a thread blocked on an agent: a SIGTERM ends the process
        # with the agents still running, and the interrupted tasks already queued again.
        # Stop them, however the consumer ended; none starts after this.
        stop_launching()
        left = reap_orphans(folder, mine=True, forget=tasks.forget_stopped)
        tasks.sends_finished(KILL_GRACE_S)  # an outcome on its way: its grace to go
        tasks.put_backs_sent(KILL_GRACE_S)  # past that, the reaper's lease runs it again
        app.close()  # the last connection to close a SQLite queue removes its WAL
        logs.get().info(
            "worker.stopped",
            worker=tasks.WORKER_ID,
            agents_killed=left.killed,
            agents_running=left.running,
        )
        if guard is not None:
            guard.leave()
    restart_if_asked(consumer, "worker")


def _guarded(folder: Path) -> Guard | None:
    """The worker's guard (:mod:`workers.guard`); None, said, where it cannot start."""
    try:
        return Guard(folder)
    except OSError as exc:
        logs.get().warning(
            "worker.unguarded",
            reason=f"cannot start its guard ({exc}): a kill of this worker leaves "
            "its agents running until the next worker started on this host",
        )
        return None


def _remove_unclaimed(folder: Path) -> None:
    if left := remove_unclaimed(folder, tasks.forget_left):
        logs.get().info("worker.removed_attempt_folders", folders=left)


class FeedWatch(threading.Thread):
    """Whether a control process still feeds this worker's Redis queue, looked at as the
    worker starts and then once a control tick (at most a minute): said when it stops
    being true (`worker.queue_unfed`: a control stopped, or moved to another database),
    again each hour while it stays so, and when it is true again (`worker.queue_fed`).
    Said at the start only, a worker started before its control, or whose control moved
    later, told the morning nothing true."""

    REMIND_S = 3600.0

    def __init__(self, settings: Settings, huey) -> None:  # noqa: ANN001 - a Huey
        super().__init__(name="reviewq-feed-watch", daemon=True)
        self.settings, self.huey = settings, huey
        self.done = threading.Event()
        # Until a control says its tick: a look costs one GET.
        self.period = 10.0
        self.unfed_said: float | None = None  # when it was last said (the queue's clock)
        self.last_fed: dict = {}  # what a control last wrote, as this watch saw it
        self.version_seen: object = None  # the control's message version last looked at

    def run(self) -> None:
        while not self.done.wait(self.period):
            self.look()

    def look(self) -> dict | None:
        """Look once, say what changed; what the control last wrote (None: unread)."""
        try:
            fed = fed_by(self.huey)
            now = queue_clock(self.huey)
        except Exception:  # noqa: BLE001 - Redis away: the consumer says so, as ever
            return None
        problem, event = None, "worker.queue_unfed"
        if fed:
            self.last_fed = fed
        # A key gone that this watch saw (Redis restarted without its data, a flush) says
        # nothing of the URL: the control writes it again at its next tick.
        heard = fed or self.last_fed
        if not heard and fed == {}:
            # Beside a control's state folder or KB, one may yet start and feed it.
            problem = None if beside_a_control(self.settings) else unfed_problem(self.settings)
        elif heard and (silent := fed_late(heard, now)) is not None:
            problem = stale_problem(self.settings, heard, silent)
            # A Redis that refuses writes (full, unsaved) refuses the control's key too: the
            # control runs on.
            if (why := refuses_writes(self.huey)) is not None:
                problem, event = full_problem(self.settings, heard, why), "worker.queue_full"
        if fed and fed.get("v") != self.version_seen:
            # A worker upgraded while its control was not (or the control since): its
            # start said nothing, and on a quiet queue nothing was said until the night,
            # each message then refused one by one (`message.refused`).
            self.version_seen = fed.get("v")
            if (unlike := release_unlike(fed)) is not None:
                logs.get().error("worker.release_unlike", reason=unlike)
        if fed and isinstance(fed.get("every"), int | float) and fed["every"] > 0:
            self.period = min(60.0, max(1.0, float(fed["every"])))
        if problem is not None:
            if self.unfed_said is None or now - self.unfed_said >= self.REMIND_S:
                logs.get().warning(event, reason=problem, still=self.unfed_said is not None)
                self.unfed_said = now
        elif self.unfed_said is not None and fed:
            self.unfed_said = None
            logs.get().info(
                "worker.queue_fed", host=fed.get("host"), state=fed.get("state"), at=fed.get("at")
            )
        return fed


def send_review(app, msg: dict) -> None:  # noqa: ANN001 - the App
    """A review message, stamped with the queue's clock (its expiry is timed on it). Not
    read (the queue away for a moment), expires_at serves, and send() waits the queue out
    as it always did: a dispatch is not given up for the stamp."""
    with contextlib.suppress(Exception):
        msg = {**msg, "queued_at": queue_clock(app.review)}
    send("run_review", msg)


# The descriptor of control.lock a SIGHUP's restart keeps across its exec: closed before
# it, the lock was free for the new program's start (half a second of imports), and a
# control started then (a cron sweep's) took it, the restarted one refusing to run.
_KEPT_LOCK = "REVIEWQ_CONTROL_LOCK_FD"


def _kept_lock(state_dir: Path) -> int | None:
    """control.lock as the restart of this control left it open, or None."""
    kept = os.environ.pop(_KEPT_LOCK, None)  # not handed on to what this one starts
    if kept is None:
        return None
    try:
        fd = int(kept)
        st, want = os.fstat(fd), (state_dir / "control.lock").stat()
    except (ValueError, OSError):
        return None
    if (st.st_dev, st.st_ino) != (want.st_dev, want.st_ino):
        os.close(fd)  # the settings read again name another state folder
        return None
    os.set_inheritable(fd, False)
    return fd


def _lock(state_dir: Path) -> int:
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = _kept_lock(state_dir)
    if fd is None:
        fd = private(state_dir / "control.lock", os.O_RDWR | os.O_CREAT)
    deadline = time.monotonic() + PROBE_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            os.close(fd)
            raise AlreadyRunning(
                f"a control process already runs for {state_dir} (exactly one may)"
            ) from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
    except OSError as exc:  # a full disk: said naming the file, not as a bug
        os.close(fd)
        raise OSError(exc.errno, exc.strerror, str(state_dir / "control.lock")) from None
    return fd


def run_control(ws: Workspace) -> None:
    """Consume the control queue with one thread (the single writer of state.db), and
    enqueue a tick every ``reaper_seconds`` for the reaper, cron sweeps and dispatch."""
    # Here, not at the top: a worker, in the same module, has no use for them.
    from orchestrator.control.control import Control
    from orchestrator.control.followup import FollowUp
    from orchestrator.state.status import keep_shared, keep_stale, keep_zone
    from orchestrator.state.when import local_zone
    from orchestrator.sweeps.producer import follow_budgets, sweep_problems

    settings = ws.settings
    # state.db first: one refused as another program's had control.lock and queue/ made
    # in that program's folder before the refusal.
    ws.store  # noqa: B018 - opened for its refusal; Control uses it
    lock = _lock(ws.state_dir)
    # A previous run's queue.shared is not this one's: said again if it still is.
    with contextlib.suppress(OSError):
        keep_shared(ws.state_dir, None)
    zone = local_zone()
    with contextlib.suppress(OSError):  # `status` then names no zone: nothing else is lost
        keep_zone(ws.state_dir, zone)
    with contextlib.suppress(OSError):  # this run reads reviewq.toml as it is now
        keep_stale(ws.state_dir, None)
    logs.configure(ws.state_dir, stderr_level="INFO", process="control")
    follow_parent()
    app = make_app(settings)
    check_server(app.control, settings)
    install = ws.store.install_id()
    try:
        # Before the first read, which puts back on the queue what a killed control held:
        # on a database another control runs on, that was the message it was running.
        held = claim_when_up(app.control, install, ws.state_dir, settings.queue.reaper_seconds)
    except Exception as exc:  # noqa: BLE001 - an ACL without WATCH or the key: run as before
        held = None
        logs.get().warning(
            "queue.unclaimed",
            key=CLAIM_KEY,
            error=str(exc),
            reason="another KB's control started on this database is not refused at its start; "
            "allow the key and WATCH",
        )
    if held is not None:
        raise ConfigError(claim_problem(settings, held))
    tasks.claimed_as(install)

    def move_sqlite_messages() -> None:
        # At the start and each tick: a SQLite worker not restarted after the switch
        # still sends its outcomes to the file.
        try:
            move_left_behind(settings, {"review": app.review, "control": app.control})
        except Exception as exc:  # noqa: BLE001 - Redis out of reach: the next tick moves them
            logs.get().error("queue.unavailable", error=logs.error_said(exc))

    move_sqlite_messages()

    def reclaim() -> None:
        # Redis back from a restart without its data lost the claim: left to the next
        # tick (a minute by default), a control of another KB restarting meanwhile took it.
        with contextlib.suppress(Exception):  # the next tick claims it, or says whose it is
            claim_queue(app.control, install, ws.state_dir, settings.queue.reaper_seconds)

    app.control.storage.after_outage = reclaim
    if (risk := eviction_risk(app.control, settings)) is not None:
        logs.get().warning("queue.evicting", reason=risk)

    woken = threading.Event()
    # When a queued job may go (monotonic): its launch backoff ends, or a folder another
    # process held is written. The ticker sends a dispatch then. Left to the next tick, a
    # 5 s backoff waited up to reaper_seconds (a minute by default), and so did a job
    # whose folder a sweep wrote.
    dispatches: list[float] = []
    dispatches_lock = threading.Lock()

    def dispatch_in(delay_s: float) -> None:
        with dispatches_lock:
            heapq.heappush(dispatches, time.monotonic() + delay_s)
        woken.set()

    control = Control(
        ws,
        send_review=functools.partial(send_review, app),
        hooks=FollowUp(ws),
        on_review_queue=functools.partial(attempts_on, app.review),
        dispatch_in=dispatch_in,
        stops=StopRequests(app.review),
    )
    tasks.install_control(control)
    poll = settings.queue.poll_seconds
    consumer = QueueConsumer(
        app.control, workers=1, periodic=False, initial_delay=poll, backoff=1.0, max_delay=poll
    )
    consumer.reload_of = ("control", settings)
    consumer.take_signals()
    stop = threading.Event()

    def ticker() -> None:
        next_tick = time.monotonic()
        while not stop.is_set():
            woken.clear()  # before the look: a dispatch_in meanwhile wakes the wait below
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + settings.queue.reaper_seconds
                move_sqlite_messages()
                try:
                    tasks.request_tick(lost_after=max(10.0, 5 * settings.queue.reaper_seconds))
                except Exception as exc:
                    logs.get().error("queue.unavailable", error=logs.error_said(exc))
            with dispatches_lock:
                due = False
                while dispatches and dispatches[0] <= now:
                    heapq.heappop(dispatches)
                    due = True
                wake = min(next_tick, dispatches[0]) if dispatches else next_tick
            if due:
                try:
                    send_once("dispatch")
                except Exception as exc:  # the next tick dispatches
                    logs.get().error("queue.unavailable", error=logs.error_said(exc))
            woken.wait(max(0.0, wake - time.monotonic()))

    thread = threading.Thread(target=ticker, name="reviewq-ticker", daemon=True)
    logs.get().info("control.started", pid=os.getpid(), queue=queue_described(settings), zone=zone)
    for name, problem in settings.sweeps_left_out.items():
        # Said, not refused: a control that would not start (systemd restarting it all
        # night) ran no other sweep either, and left every agent's outcome waiting.
        logs.get().error(
            "sweep.invalid",
            sweep=name,
            problem=problem,
            config=str(settings.config_path),
            recovery="the entry is left out until it is fixed and the control restarted",
        )
    for ignored in settings.sweeps_ignored:
        logs.get().warning("sweep.setting_ignored", problem=ignored)
    for sweep in settings.sweeps.values():
        for problem in sweep_problems(ws, sweep):
            logs.get().error(
                "sweep.invalid", sweep=sweep.name, problem=problem, config=str(settings.config_path)
            )
    # Before the first message: a dispatch waiting in the queue (an attempt's end, a
    # person's `enqueue`, sent before a SIGHUP) ran before the first tick, and started
    # attempts of a run the budget read now holds as spent.
    follow_budgets(ws)
    thread.start()
    try:
        consumer.run()
    finally:
        stop.set()
        woken.set()
        if consumer.restart_asked:
            os.set_inheritable(lock, True)
            os.environ[_KEPT_LOCK] = str(lock)
        else:
            os.close(lock)
            with contextlib.suppress(Exception):  # unreleased, it lapses in five ticks
                unclaim_queue(app.control, install, ws.state_dir)
        # The last connection to close a SQLite queue checkpoints it and removes its WAL
        # (left open to the exit, review.db-wal stayed at its night's high-water mark).
        # The ticker is not waited for: a send it retries (a queue out of reach) would
        # hold the stop; a connection it opens again after this is closed by the exit.
        app.close()
        logs.get().info("control.stopped")
    restart_if_asked(consumer, "control")


def queue_described(settings) -> str:
    """The queue as a process's start line names it (``queue``): its URL without a
    password, or the SQLite queues' folder."""
    return (
        shown_url(settings.queue.url).split("@")[-1]
        if settings.queue.url
        else str(settings.state_dir / "queue")
    )
