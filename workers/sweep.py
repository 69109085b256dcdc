"""``reviewq sweep``: enqueue, then run a control process and a worker process as children
until every job is terminal or waits on a paused reviewer, showing progress.

The children are the same ``reviewq control`` and ``reviewq worker`` an operator runs
from the Procfile; when a control process already runs for this state folder, the sweep
uses it instead of starting its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG

from orchestrator import logs
from orchestrator.cycles.escalations import only_reject_check
from orchestrator.regularfile import private
from orchestrator.state.status import (
    OPEN_SQL,
    Pause,
    Progress,
    SweepJobs,
    last_refusal,
    over_budget_runs,
    paused_reviewers,
    progress,
    refusal_said,
    summary,
)
from orchestrator.state.store import control_pid, no_room, utcnow
from orchestrator.state.workspace import Workspace
from orchestrator.sweeps.producer import EnqueueResult, SweepRequest, enqueue

from .app import make_app
from .attempt import reap_orphans, wait_for_exit, worker_folder
from .parent import PARENT_ENV, first_raises, terminate_raises
from .queues import App, send_once
from .reviewers.base import python_module

POLL_S = 0.2  # how often the progress display reads state.db


class Looks:
    """How long the sweep waits before its next look at state.db. :data:`POLL_S`, but
    :attr:`ENDING_S` while its last open jobs are still moving (one ended within
    :attr:`MOVING_S`): a sweep's end waited ~0.1 s on average for a look after its last
    job, while a few more looks at its end cost ~0.5-1.5 ms each. The last: :attr:`FEW`,
    or as many as ended over the last :data:`POLL_S` (its pace): at ~200 jobs a second
    the last 8 end within one look's wait, and the look before them, seeing 30 open,
    waited the whole of it after they had. Jobs that wait (a paused reviewer, a long
    agent) are looked at every :data:`POLL_S` again. Never sooner than :attr:`SHARE`
    times the CPU the last look spent: a look counts every job of the sweep, so one of
    50,000 jobs took ~40 ms of CPU, five times a second, for the hour the sweep ran (a
    fifth of a core; the looks' sum grew with the square of the jobs)."""

    ENDING_S = 0.02
    FEW = 8
    MOVING_S = 1.0
    SHARE = 20  # a look's time to the wait after it: the looks take <= 5% of a core

    def __init__(self) -> None:
        self.open: int | None = None
        self.moved_at = 0.0
        # The pace (jobs ended a second) over at least POLL_S: over one quick look, one
        # job more or less read as a pace of 0 or 50 a second.
        self.since: tuple[int, float] | None = None
        self.pace = 0.0

    def wait_after(self, open_jobs: int, now: float, took: float = 0.0) -> float:
        """``took``: the CPU the look that saw ``open_jobs`` spent, in seconds."""
        if open_jobs != self.open:
            self.open, self.moved_at = open_jobs, now
        if self.since is None:
            self.since = (open_jobs, now)
        elif now - self.since[1] >= POLL_S:
            self.pace = (self.since[0] - open_jobs) / (now - self.since[1])
            self.since = (open_jobs, now)
        last = max(self.FEW, self.pace * POLL_S)
        ending = open_jobs <= last and now - self.moved_at < self.MOVING_S
        return max(self.ENDING_S if ending else POLL_S, took * self.SHARE)


@dataclass
class SweepOutcome:
    enqueued: EnqueueResult
    since_job_id: int
    summary: dict
    progress: Progress
    paused: dict[str, Pause] = field(default_factory=dict)
    children_failed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not self.summary["failed"]
            and self.progress.waiting_paused == 0
            and self.progress.waiting_budget == 0
            and not self.children_failed
        )


def control_running(state_dir: Path) -> bool:
    return control_pid(state_dir) is not None


def _base_argv(ws: Workspace) -> list[str]:
    argv = [
        *python_module("orchestrator"),
        "--root",
        str(ws.root),
        "--state",
        str(ws.state_dir),
    ]
    if ws.settings.config_path:
        argv += ["--config", str(ws.settings.config_path)]
    return argv


def _a_sweeps_control(state_dir: Path) -> bool:
    """Whether the control process holding the state folder is a sweep's child (not a
    service's, not one a person started): one a sweep may replace once it is gone."""
    try:
        pid = int((state_dir / "control.lock").read_text())
        stat = Path(f"/proc/{pid}/stat").read_text()
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        argv = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return False
    return b"sweep" in argv


class Forked:
    """A child the sweep forked (:meth:`Children.fork`), with what the sweep asks of a
    :class:`subprocess.Popen`: ``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already (SIGCHLD ignored): gone, as Popen says
                self.returncode = 0
                return 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            if timeout is not None:
                fd = os.pidfd_open(self.pid)
                try:
                    ready = select.poll()
                    ready.register(fd, select.POLLIN)
                    if not ready.poll(max(0.0, timeout) * 1000):
                        raise subprocess.TimeoutExpired(self.args, timeout)
                finally:
                    os.close(fd)
            try:
                _, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                status = 0
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _sqlite_files_open() -> bool:
    """Whether this process has a file of a SQLite database open (or cannot tell). A child
    forked with one must never close it: SQLite's locks are the process's, per file, and
    the child's close would drop those of its own connection to the same file. A database
    is known by its name's ending or by its header (a queue file may be named anyhow)."""
    try:
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the listing's own descriptor, gone
                if os.readlink(f"/proc/self/fd/{fd}").endswith(_SQLITE_ENDINGS):
                    return True
                if (
                    S_ISREG(os.fstat(int(fd)).st_mode)
                    and os.pread(int(fd), len(_SQLITE_HEADER), 0) == _SQLITE_HEADER
                ):
                    return True
    except OSError:
        return True
    return False


_SQLITE_ENDINGS = (".db", "-wal", "-shm", "-journal")
_SQLITE_HEADER = b"SQLite format 3\x00"


_PR_SET_NAME = 15  # prctl(2)


def _become(name: str, argv: list[str], env: dict[str, str], stderr: int) -> int:
    """In a forked child (``name``: control or worker): run ``argv``'s reviewq command as ``python -P -m orchestrator``
    would, with ``env`` and ``stderr``, in the modules the sweep has already imported.
    Its exit code."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.dup2(stderr, 2)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(env)
    # Its command line reads as the sweep's: its name says which child it is (ps -o comm,
    # top), 15 bytes at most.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(
            _PR_SET_NAME, f"reviewq-{name}"[:15].encode(), 0, 0, 0
        )
    # As -P: the working folder (a KB root may hold a workers package) is not searched.
    sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
    sys.argv = ["reviewq", *argv[len(python_module("orchestrator")) :]]
    try:
        runpy.run_module("orchestrator", run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


class Children:
    """The control and worker processes a sweep started, restarted if they die. A control
    process that already runs for the state folder (the operator's, another sweep's) is
    used instead of one of its own, as long as it runs; when another sweep's goes with
    that sweep, this one starts its own. A service's is never replaced: its restart would
    then find the folder taken. Gone for longer than :attr:`BORROWED_GRACE_S`, it fails
    the sweep, which otherwise waited without a word for good."""

    BORROWED_GRACE_S = 30.0
    # A child that ran this long before it died was no crash loop: its count starts again,
    # or four unrelated deaths over a long night (an OOM kill, a reboot of Redis) failed it.
    STABLE_S = 600.0

    def __init__(self, ws: Workspace, workers: int) -> None:
        self.ws = ws
        self.specs: dict[str, list[str]] = {"control": [*_base_argv(ws), "control"]}
        if workers > 0:
            # The sweep's worker sees the KB, so agents may follow links and a reviewer
            # that edits a note is caught.
            self.specs["worker"] = [
                *_base_argv(ws),
                "worker",
                "--workers",
                str(workers),
                "--kb",
                str(ws.root),
            ]
        self.procs: dict[str, subprocess.Popen | Forked] = {}
        self.adopt = False  # the control used is another sweep's: replace it when it goes
        self.gone_since: float | None = None  # when the borrowed control was last missed
        self.restarts: dict[str, int] = dict.fromkeys(self.specs, 0)
        self.started_at: dict[str, float] = {}  # monotonic, of each child's last start
        self.failed: list[str] = []
        self.waiting: dict[str, tuple[int, int]] = {}  # forked, not started: pid, its pipe
        self.env = {
            **os.environ,
            "REVIEWQ_LOG_FORMAT": "json",
            "REVIEWQ_STDERR_LEVEL": "WARNING",  # stderr here is kept for crashes only
            PARENT_ENV: str(os.getpid()),
        }
        log_dir = ws.state_dir / "logs"
        log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The children's stderr: their warnings, errors and last words, kept for crashes
        # (the structured log has the rest).
        self.stderr = {
            name: open(log_dir / f"sweep-{name}.stderr", "ab", opener=private)  # noqa: SIM115 - closed in stop()
            for name in self.specs
        }

    def fork(self) -> None:
        """Fork a child for each of the sweep's processes now, each waiting to run its
        command when :meth:`start` says so. A process started afresh imports reviewq again
        (~0.12-0.15 s of CPU each on a small machine, a quarter of a 1,000-job sweep's
        fixed costs); a forked one has the sweep's modules. Only while the sweep has no
        SQLite file open and no other thread, and on Linux: the children started later
        (restarts) start afresh. Each runs the same ``reviewq control``/``worker``."""
        if (
            not sys.platform.startswith("linux")
            or not hasattr(os, "pidfd_open")
            or threading.active_count() > 1
            or _sqlite_files_open()
        ):
            return
        sys.stdout.flush()
        sys.stderr.flush()
        for name in self.specs:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # never returns: the sweep's stack is not this process's to unwind
                code = 1
                try:
                    os.close(w)
                    for other in self.waiting.values():
                        os.close(other[1])
                    # Its own process group, as a spawned child's: the terminal's Ctrl-C
                    # and SIGHUP reach the sweep alone.
                    os.setpgid(0, 0)
                    code = 0
                    if os.read(r, 1):
                        os.close(r)
                        code = _become(name, self.specs[name], self.env, self.stderr[name].fileno())
                finally:
                    with contextlib.suppress(Exception):
                        sys.stdout.flush()
                        sys.stderr.flush()
                    os._exit(code)
            os.close(r)
            self.waiting[name] = (pid, w)

    def dismiss(self) -> None:
        """The forked children not started: they end, unused."""
        for pid, w in self.waiting.values():
            os.close(w)  # read as "no": the child ends
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.waiting.clear()

    def start(self) -> None:
        for name in self.specs:
            if name != "control" or not control_running(self.ws.state_dir):
                self._spawn(name)
            else:
                self.adopt = _a_sweeps_control(self.ws.state_dir)
        self.dismiss()

    def _spawn(self, name: str) -> None:
        self.started_at[name] = time.monotonic()
        waiting = self.waiting.pop(name, None)
        if waiting is not None:
            pid, w = waiting
            try:
                os.write(w, b"1")
            except BrokenPipeError:  # killed while it waited: started afresh below
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            else:
                self.procs[name] = Forked(pid, self.specs[name])
                return
            finally:
                os.close(w)
        # A process group of their own (a forked child makes its own in fork): a closed
        # terminal's SIGHUP (which Huey takes as "restart") and Ctrl-C reach the sweep
        # alone, and it stops them as it means to.
        self.procs[name] = subprocess.Popen(
            self.specs[name],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr[name],
            process_group=0,
        )

    def check(self) -> None:
        for name, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            if name == "control" and control_running(self.ws.state_dir):
                # Another control took the state folder first (two sweeps started
                # together): it is used, and this is no crash.
                del self.procs[name]
                self.adopt = _a_sweeps_control(self.ws.state_dir)
                continue
            if time.monotonic() - self.started_at[name] >= self.STABLE_S:
                self.restarts[name] = 0
            self.restarts[name] += 1
            logs.get().error(
                "sweep.child_exited", child=name, exit_code=code, restarts=self.restarts[name]
            )
            if self.restarts[name] > 3:
                self.failed.append(
                    f"{name} exited {code} four times ({self._last_words(name)}); "
                    f"see {self.stderr[name].name}"
                )
                del self.procs[name]
                self._reap_orphans(name)
            else:
                self._spawn(name)
        gone = "control" not in self.procs and self.restarts["control"] <= 3
        if not gone or control_running(self.ws.state_dir):
            self.gone_since = None
        elif self.adopt:
            # The control this sweep used belonged to another sweep, which has ended.
            self._spawn("control")
        elif self.gone_since is None:
            self.gone_since = time.monotonic()
        elif time.monotonic() - self.gone_since > self.BORROWED_GRACE_S:
            self.failed.append(
                f"the control process this sweep used (a service's, or one started by hand) "
                f"stopped and has not come back in {self.BORROWED_GRACE_S:g} s; start it "
                "again, or run the sweep once none runs (it then starts its own)"
            )

    def _last_words(self, name: str) -> str:
        """The last line a child wrote to stderr: its one-line refusal, most often."""
        try:
            with open(self.stderr[name].name, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                lines = f.read().decode("utf-8", "replace").strip().splitlines()
        except OSError:
            return "its stderr cannot be read"
        if lines:
            return lines[-1].removeprefix("error: ")
        # Its last words were for a file on a full disk: "nothing on stderr" alone sent a
        # person to an empty file, the disk unnamed.
        room = no_room(Path(self.stderr[name].name).parent)
        return f"nothing on stderr: {room}" if room else "nothing on stderr"

    # How long running agents get to finish after a Ctrl-C, then they are stopped and
    # their attempts put back on the queue (nothing burned): a real review takes minutes.
    GRACE_S = 60.0
    # How long the control gets, the worker stopped, to take the outcomes it sent: left
    # in the queue, their jobs read 'running' in state.db with no process behind them.
    DRAIN_S = 10.0
    END_S = 30.0  # how long a child gets to stop before it is killed

    def stop(self, *, at_once: bool = False, interrupted: bool = False, control_queue=None) -> None:  # noqa: ANN001
        """Stop the children. At the sweep's end both get SIGINT at once (nothing of its
        runs). ``interrupted`` (a Ctrl-C): the worker first, its running agents given
        :attr:`GRACE_S` to finish; then the control, once it has taken the outcomes
        waiting in ``control_queue`` (a Huey). ``at_once``, for whatever is left after
        that, and on a second Ctrl-C: SIGTERM, so agents are killed and their attempts
        queued again; a child still there :attr:`END_S` later is killed (each step gives
        all the children one :attr:`END_S` together), or at once on a third Ctrl-C."""
        try:
            if not at_once:
                if interrupted:
                    self._drain(control_queue)
                for proc in self.procs.values():
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGINT)  # the control's task in hand ends
                _wait_all(self.procs.values(), self.END_S)
        finally:
            self._end()

    def _end(self) -> None:
        """SIGTERM, :attr:`END_S`, then SIGKILL for what is left, and the worker's agents
        reaped. A Ctrl-C here (the third) ended the sweep in the middle of the wait, and
        left a child that had not stopped yet running, and its agents with it: it cuts
        the wait short instead, what is left is killed at once, and it is raised once
        that is done; any Ctrl-C after it is ignored."""
        cut: list[int] = []
        interrupted = False  # by that Ctrl-C, or by the sweep's first SIGTERM
        with first_raises(cut, (signal.SIGINT,)):
            try:
                for proc in self.procs.values():
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGTERM)
                _wait_all(self.procs.values(), self.END_S)
            except KeyboardInterrupt:
                interrupted = True
            # Each of the two handlers raises once: a Ctrl-C (or the first SIGTERM) that
            # came as the rest was killed and reaped ended it there, agents left running.
            # Killing and reaping again is harmless, so it is begun again, whole.
            for _ in range(3):
                try:
                    self._kill_and_reap()
                    break
                except KeyboardInterrupt:
                    interrupted = True
        if interrupted:
            raise KeyboardInterrupt

    def _kill_and_reap(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._reap_orphans("worker")
        self.dismiss()
        for f in self.stderr.values():
            f.close()

    def _reap_orphans(self, name: str) -> None:
        """Kill the agents a dead worker of this sweep left running: a worker that stops
        kills its own, and the next worker on this host those of one that died, but after
        this sweep's worker no other may come."""
        if name != "worker" or name not in self.specs:
            return
        reap_orphans(worker_folder(self.ws.settings), said="the sweep's worker died")

    def _drain(self, control_queue) -> None:  # noqa: ANN001
        """The worker stopped gracefully (always: what state.db says runs lags the agents
        a worker has just started), then the outcomes it sent taken by the control."""
        worker, control = self.procs.get("worker"), self.procs.get("control")
        if worker is None or worker.poll() is not None:
            return
        running = self.ws.store.conn.execute(
            "SELECT count(*) FROM attempts WHERE outcome IN ('dispatched', 'running')"
        ).fetchone()[0]
        logs.get().warning(
            "sweep.stopping",
            attempts_open=running,
            note=f"running agents get {self.GRACE_S:g} s to finish, then they are stopped "
            "and their attempts queued again; Ctrl-C again stops them now",
        )
        worker.send_signal(signal.SIGINT)
        try:
            worker.wait(timeout=self.GRACE_S)
        except subprocess.TimeoutExpired:
            return  # stopped at once, with the control, by stop()
        deadline = time.monotonic() + self.DRAIN_S
        while (
            control is not None
            and control.poll() is None
            and _waiting(control_queue)
            and time.monotonic() < deadline
        ):
            time.sleep(POLL_S)


def _wait_all(procs: Iterable[subprocess.Popen], timeout: float) -> None:
    """Wait for every process to end, all of them within one ``timeout``. Each given a
    timeout of its own, one after the other, a control and a worker that were both slow
    to stop held the sweep twice as long: a minute after the Ctrl-C that says "now"."""
    deadline = time.monotonic() + timeout
    for proc in procs:
        # On the exit's pidfd: Popen.wait with a timeout sleeps up to 50 ms between looks,
        # which a sweep's end paid after its children had gone. Reaped ones are left out:
        # their pid may be another process's by now.
        if proc.poll() is None:
            wait_for_exit(proc, deadline)


def _waiting(queue) -> int:  # noqa: ANN001 - a Huey, or None
    """Messages waiting in a queue; 0 when there is none, or it cannot be read."""
    try:
        return queue.pending_count() if queue is not None else 0
    except Exception:  # noqa: BLE001 - the queue away: nothing to wait for then
        return 0


def _nudge() -> None:
    """Ask the control process to dispatch now: one that already ran has had its tick
    before these jobs existed. Once: if the queue cannot take it, the next tick dispatches."""
    try:
        send_once("dispatch")
    except Exception as exc:
        logs.get().warning(
            "sweep.nudge_failed", error=str(exc), recovery="the next tick dispatches"
        )


def run_sweep(
    ws: Workspace,
    req: SweepRequest,
    workers: int,
    on_progress=None,  # noqa: ANN001
    children: Children | None = None,
) -> SweepOutcome:
    """``children``: made (and forked, :meth:`Children.fork`) by the caller before it
    opened state.db; else made here."""
    # The queue first: one that cannot be opened (a corrupt file) is said in one line
    # before anything is enqueued, not four restarts of each child later.
    with make_app(ws.settings) as app:
        return _sweep(ws, req, workers, on_progress, children, app)


def _sweep(
    ws: Workspace,
    req: SweepRequest,
    workers: int,
    on_progress,  # noqa: ANN001
    children: Children | None,
    app: App,
) -> SweepOutcome:
    store = ws.store
    jobs = SweepJobs.starting(store)
    # Before the enqueue: its children start at the commit, and what they hear while the
    # sweep writes the folders (a worker of another release refusing each message at
    # once) is heard by this look-out too.
    no_worker = NoWorker(store, watching=workers == 0, log=logs.log_path(ws.state_dir))
    no_room_said = NoRoom(ws.state_dir)
    started: list[Children] = []

    def start_children(ids: list[int]) -> None:
        # Once the jobs commit, before the sweep writes their folders: the children's
        # start-up takes the core that writing leaves idle, and a job dispatched before
        # the sweep got to its folder has it written by the control. Not beside the
        # selection: on two cores their start-up only slowed it down.
        if ids:
            started.append(children or Children(ws, workers))
            started[0].start()
            _nudge()

    try:
        enqueued = enqueue(ws, req, committed=start_children)
    except BaseException:
        # A refusal, or the folders' writing interrupted (a Ctrl-C).
        for made in started or ([children] if children else []):
            made.stop(at_once=True)
        raise
    jobs = jobs.of_run(enqueued.run_id)
    children = started[0] if started else (children or Children(ws, workers))
    terminated = []
    interrupted = False
    looks = Looks()
    with terminate_raises(terminated):
        try:
            # Inside the try: a Ctrl-C while they start stops them as any other does.
            if not started and _progress(ws, jobs).open:  # an earlier run's jobs taken over
                # With nothing to wait for, children started only to be stopped mid-start
                # (a KeyboardInterrupt traceback in their stderr files, kept for crashes).
                children.start()
                _nudge()
            while True:
                # The look's own CPU, not the wall's: a sweep stopped or starved
                # mid-look waited 20 times the stop before it looked again.
                looked_at = time.thread_time()
                p = _progress(ws, jobs)
                took = time.thread_time() - looked_at
                if on_progress is not None:
                    on_progress(p)
                if p.open == 0 or children.failed:
                    break
                children.check()
                no_worker.check()
                no_room_said.check()
                time.sleep(looks.wait_after(p.open, time.monotonic(), took=took))
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            children.stop(
                at_once=bool(terminated), interrupted=interrupted, control_queue=app.control
            )
    paused = paused_reviewers(ws.store, utcnow())
    final = _progress(ws, jobs, paused)
    out = SweepOutcome(
        enqueued,
        jobs.first_id,
        summary(store, jobs, only_reject_check(ws)),
        final,
        paused,
        children.failed,
    )
    logs.get().info(
        "sweep.finished",
        sweep=req.name,
        sweep_run=enqueued.run_id,
        jobs=final.by_status,
        waiting_paused=final.waiting_paused,
        cost_usd=out.summary["cost_usd"],
    )
    return out


def _progress(ws: Workspace, jobs: SweepJobs, paused: dict[str, Pause] | None = None) -> Progress:
    if paused is None:
        paused = paused_reviewers(ws.store, utcnow())
    return progress(ws.store, jobs, set(paused), over_budget_runs(ws.store))


class NoRoom:
    """Said once, by a sweep whose state folder's disk has no room left: its jobs wait
    (dispatch deferred, outcomes retried) until there is, and every line saying so goes
    to a log on that disk, which takes none. A sweep in the foreground waited without a
    word, for good. It goes on waiting: room may come (OPERATIONS §6.4)."""

    EVERY_S = 5.0

    def __init__(self, state_dir: Path) -> None:
        self.folders = (state_dir, state_dir / "queue")
        self.next = time.monotonic()

    def check(self) -> None:
        if time.monotonic() < self.next:
            return
        self.next = time.monotonic() + self.EVERY_S
        if (room := no_room(*self.folders)) is not None:
            self.next = math.inf
            logs.get().warning(
                "sweep.disk_full",
                reason=room,
                recovery="the sweep waits: its jobs go on once there is room",
            )


class NoWorker:
    """Said once, by a sweep that started no worker (``--workers 0``), when its attempts
    wait and no worker has been heard from for :attr:`AFTER_S`: it waited for good
    without a word when no worker ran anywhere. It goes on waiting: a worker may yet
    come. Heard from: a heartbeat or an outcome the control took since the sweep began
    (stamped on the control's clock, as the sweep's start is; a busy worker's agents
    beat every lease/4). A worker of another release is heard from only in ``log``: it
    refuses each message, and the control refuses its notice of that (``message.refused``,
    never in state.db); "start `reviewq worker`" then sent a person to start a second one."""

    AFTER_S = 60.0
    EVERY_S = 5.0

    def __init__(self, store, watching: bool, log: Path | None = None) -> None:  # noqa: ANN001 - a Store
        self.store = store
        self.watching = watching
        self.next = time.monotonic() + self.AFTER_S
        self.started_at = utcnow()
        self.log = log
        try:  # only what is written from now on: the log may hold months
            self.log_from = log.stat().st_size if log is not None else 0
        except OSError:
            self.log_from = 0

    def check(self) -> None:
        if not self.watching or time.monotonic() < self.next:
            return
        self.next = time.monotonic() + self.EVERY_S
        # Each a range of an index (the times since the sweep began, the open attempts):
        # one pass over the table read a year's attempts every 5 s while nothing was sent.
        heard, waiting = self.store.conn.execute(
            "SELECT EXISTS (SELECT 1 FROM attempts WHERE heartbeat_at >= ?1 "
            "AND worker IS NOT NULL) OR EXISTS (SELECT 1 FROM attempts WHERE ended_at >= ?1 "
            "AND worker IS NOT NULL), "
            f"(SELECT count(*) FROM attempts WHERE {OPEN_SQL} AND outcome = 'dispatched')",
            (self.started_at,),
        ).fetchone()
        if heard:
            self.watching = False
        elif waiting:
            self.watching = False
            refused = self._refused()
            if refused is not None:
                logs.get().warning(
                    "sweep.no_worker",
                    attempts_waiting=waiting,
                    note=f"a worker of another release refuses the messages "
                    f"({refused}): run the same reviewq release on the control and the "
                    "workers (reviewq logs --event message.refused)",
                )
                return
            logs.get().warning(
                "sweep.no_worker",
                attempts_waiting=waiting,
                note="no worker has been heard from since the sweep began (it started none: "
                "--workers 0); start `reviewq worker`, or run the sweep without --workers 0",
            )

    def _refused(self) -> str | None:
        """Who refused a message for its version since the sweep began, as the last
        ``message.refused`` line says it ("far:42 on far: an outcome message of version 4,
        this reviewq speaks 3"), or None. Not a refusal of what an upgrade left on a queue
        (:func:`~orchestrator.state.status.last_refusal`): no worker of another release runs."""
        line = last_refusal(self.log, self.log_from) if self.log is not None else None
        return refusal_said(line) if line is not None else None
