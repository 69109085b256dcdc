"""One agent run (CONTRACT §6 steps 1-4): launch, wait, deadline, process-group kill, classify.

It knows nothing of state.db: what it needs comes in, an :class:`AttemptOutcome` goes out.
Waiting uses a pidfd, so the output is looked at the moment the process ends rather
than at the next tick of a polling loop.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import math
import os
import re
import resource
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from orchestrator import logs
from orchestrator.config import Settings
from orchestrator.regularfile import private
from orchestrator.review.bundle import ExpectedPair, emptiness, parse_bundle
from orchestrator.review.finalize import FinalizeError, read_output
from orchestrator.state.store import utcnow

from .kbwatch import WATCH, unwatched
from .reviewers import AttemptSpec, Reviewer
from .reviewers.base import OUTPUT_LIMIT, Telemetry, priced
from .reviewers.vendor import bounded, failure_kind, version_said

OUTPUT = "output"
INVALID_OUTPUT = "invalid-output"
BURNED_OUT = "burned-out"
NO_OUTPUT = "no-output"
LAUNCH_FAILURE = "launch-failure"
REVIEWER_FAILURE = "reviewer-failure"  # the CLI never got a model's answer: key, quota, network
TOUCHED_KB = "reviewer-touched-kb"
LAUNCH_WINDOW_S = 15.0
KILL_GRACE_S = 5.0
# Errors that say "try again in a moment", not "this will never work".
_TRANSIENT = {errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.ETXTBSY, errno.EINTR}

# Set by a stopping worker before it kills the agents it registered. A thread that got an
# agent slot only then (the agent it waited for killed by that stop) launched one more,
# with no worker left to time or kill it, for a task Huey had already queued again. A
# launch and its registration are one step under the lock, and none is begun once it is set.
STOPPING = threading.Event()
_LAUNCHING = threading.Lock()
# Set when this process is asked to stop (SIGINT, SIGTERM, SIGHUP to the consumer): an
# agent that ended by such a signal meanwhile got it with its worker (tasks.stopped_with).
STOP_ASKED = threading.Event()


def stop_launching() -> None:
    """No agent starts in this process from now on; one being started is registered
    first (so that the stop that follows finds it)."""
    with _LAUNCHING:
        STOPPING.set()


@dataclass
class AttemptOutcome:
    job_id: int
    attempt: int
    classification: str
    runner: str
    exit_code: int | None = None
    started_at: str = ""
    ended_at: str = ""
    duration_s: float = 0.0
    output: bytes | None = None
    reasons: list[str] = field(default_factory=list)
    telemetry: dict = field(default_factory=dict)
    touched: list[str] = field(default_factory=list)
    touched_hashes: dict[str, str] = field(default_factory=dict)  # path -> sha256 after the run
    exited_at: float = 0.0  # time.time() when the process was seen to end
    # [classification, reasons] as judged without its change to the KB, when it made one:
    # a change found not to be the agent's (a fix reviewq wrote meanwhile) leaves this.
    untouched: list = field(default_factory=list)
    # What the worker said of this attempt that the operator on the control's machine
    # needs too: events ({"event", fields…}) the control logs again (``RELAYED``).
    notices: list = field(default_factory=list)


def file_hashes(root: Path, rels: Iterable[str]) -> dict[str, str]:
    """sha256 of each file (``missing`` if it cannot be read), read with plain system
    calls: through pathlib's and io's layers this cost ~30 µs a file, twice an attempt."""
    out = {}
    base = os.fspath(root)
    for rel in rels:
        try:
            # Without blocking: a FIFO (or a link to one) an agent put in a note's place
            # held the open for good, waiting for a writer, and the attempt never ended.
            fd = os.open(os.path.join(base, rel), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            out[rel] = "missing"
            continue
        digest = hashlib.sha256()
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                out[rel] = "not a regular file"  # a device (/dev/zero) reads forever
                continue
            while chunk := os.read(fd, 1 << 20):
                digest.update(chunk)
            out[rel] = digest.hexdigest()
        except OSError:
            out[rel] = "missing"
        finally:
            os.close(fd)
    return out


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT


_Env = dict[str, str] | dict[bytes, bytes]
_RELAUNCH = {
    "retry": retry_if_exception(_transient),
    "stop": stop_after_attempt(5),
    "wait": wait_exponential(multiplier=0.1, max=2.0),
    "reraise": True,
}


def launch(
    argv: list[str], env: _Env, cwd: Path | None, stdout: Path, stderr: Path
) -> subprocess.Popen:
    """Start the agent in its own process group with stdin closed; only transient OS
    errors are retried (a missing binary is not transient)."""
    try:
        return _start(argv, env, cwd, stdout, stderr)
    except OSError as exc:
        if not _transient(exc):
            raise
        failed = [exc]  # the first try's, raised again as tenacity's own first try
    # The retries alone go through tenacity: its machinery cost every launch ~15 µs.

    def again() -> subprocess.Popen:
        if failed:
            raise failed.pop()
        return _start(argv, env, cwd, stdout, stderr)

    return Retrying(**_RELAUNCH)(again)


def _start(
    argv: list[str], env: _Env, cwd: Path | None, stdout: Path, stderr: Path
) -> subprocess.Popen:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    out = private(stdout, flags)
    try:
        err = private(stderr, flags)
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        finally:
            os.close(err)
    finally:
        os.close(out)
    _AGENTS.add(proc.pid)
    return proc


# An agent's first heartbeat: it says the launch, which counts a worker's death after it
# toward failing the job ("lost their worker"); an agent quicker than this is told of by
# its outcome alone, one queue message a job instead of two.
FIRST_TICK_S = 1.0


class Ticker:
    """Calls ``fn`` every ``period`` seconds of one attempt's wait (the first time after
    :data:`FIRST_TICK_S`, if that is sooner), however many waits it is split into: the
    connect checks cut it into windows, and a clock that started again with each window
    never reached a period shorter than the window (no heartbeat, and a healthy attempt
    reaped as lost)."""

    def __init__(self, fn: Callable[[], None] | None, period: float) -> None:
        self.fn, self.period = fn, period
        self.next = time.monotonic() + min(period, FIRST_TICK_S)

    def due_in(self) -> float:
        return self.next - time.monotonic() if self.fn is not None else math.inf

    def run_if_due(self) -> None:
        if self.fn is not None and time.monotonic() >= self.next:
            self.fn()
            self.next = time.monotonic() + self.period


def wait_for_exit(
    proc: subprocess.Popen,
    deadline: float,
    on_tick: Callable[[], None] | None = None,
    tick_s: float = 30.0,
    ticker: Ticker | None = None,
) -> bool:
    """True when the process exited before ``deadline`` (a monotonic time). ``on_tick``
    runs every ``tick_s`` meanwhile (or ``ticker``'s, kept across several waits)."""
    ticker = ticker or Ticker(on_tick, tick_s)
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    poller = None
    if pidfd is not None:
        poller = select.poll()  # not select(): it fails on descriptors past 1023
        poller.register(pidfd, select.POLLIN)
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return proc.poll() is not None
            step = max(0.0, min(remaining, ticker.due_in()))
            if poller is not None:
                if poller.poll(step * 1000):
                    proc.wait()
                    return True
            else:
                try:
                    proc.wait(timeout=step)
                    return True
                except subprocess.TimeoutExpired:
                    pass
            ticker.run_if_due()
    finally:
        if pidfd is not None:
            os.close(pidfd)


def kill_group(
    proc: subprocess.Popen, grace_s: float = KILL_GRACE_S, marker: tuple[bytes, ...] = ()
) -> None:
    """SIGTERM the whole process group, then SIGKILL whatever is left after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    if proc.poll() is None:
        wait_for_exit(proc, time.monotonic() + grace_s)
    reap_group(proc, marker)


def reap_group(proc: subprocess.Popen, marker: tuple[bytes, ...] = ()) -> None:
    """Leave no process of the agent's group behind (children that outlived it), nor of
    its session: Codex starts its sandbox (bwrap) in a process group of its own, which
    a group kill misses and which outlives Codex. With ``marker`` (:func:`attempt_marker`),
    nor of a session one of its processes started (``setsid``, Node's detached spawn),
    found by the attempt's variables in its environment. In a subreaper
    (:func:`become_subreaper`) whose children are only its agents, none of them is
    left, and the machine's sessions are not looked through."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
        waited = True
    except Exception:  # noqa: BLE001 - a leader stuck in the kernel: looked for as ever
        waited = False
    else:
        _AGENTS.discard(proc.pid)
    # Only once the agent has ended: until then what it started is its, not ours.
    strays = _strays() if waited else None
    if strays is False:
        return
    sessions = _sessions()
    doomed = list(sessions.get(proc.pid, [])) + _marked(sessions, marker, proc.pid)
    killed = []
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    if strays:
        # A subreaper's own children now: waited for here, or each stayed a zombie of
        # the worker until its next agent ended (for good, in a worker left idle).
        _collect(killed)
    if not waited:
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
            _AGENTS.discard(proc.pid)


# --- what an agent left behind -----------------------------------------------------------
# Linux gives an orphan to its nearest ancestor that is a "child subreaper". A worker that
# is one (and starts no process but its agents) has as children, besides its agents, every
# process one of them left running: an agent's child in a session of its own, a daemon's
# double fork. Its children are thus the proof that nothing escaped, in one read of
# /proc per thread, where the sweep of every session of the machine cost ~0.2 ms an agent.
# A process started here other than through the launch (a subprocess.run, a git) would be
# taken for a stray: collected by reap_group, its Popen would read no exit status. Start
# it under _LAUNCHING and keep it in _AGENTS until it is waited for.
_PR_SET_CHILD_SUBREAPER = 36  # prctl(2)
_AGENTS: set[int] = set()  # the agents this process started and has not waited for
_SUBREAPER = [False]
_TASKS = "/proc/self/task"
_children_of: dict[str, int] = {}  # thread id -> its open "children" file
_STRAY_ROUNDS = 100


def become_subreaper() -> bool:
    """Make this process the subreaper of the agents it starts (Linux); True if it is
    one and can read its children, which lets :func:`reap_group` skip its sweep."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    with _LAUNCHING:
        _SUBREAPER[0] = _children() is not None  # CONFIG_PROC_CHILDREN
    return _SUBREAPER[0]


def _children() -> set[int] | None:
    """This process's children, of all its threads; None if /proc cannot say. Called
    under ``_LAUNCHING``. The main thread is read last: a thread that ends hands its
    children to the first live thread, the main one, so none is missed between reads."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    for gone in set(_children_of) - set(tids):
        os.close(_children_of.pop(gone))
    main = str(os.getpid())
    out: set[int] = set()
    for tid in sorted(tids, key=lambda t: t == main):
        fd = _children_of.get(tid)
        try:
            if fd is None:
                fd = _children_of[tid] = os.open(f"{_TASKS}/{tid}/children", os.O_RDONLY)
            # A proc file read again from its start says the children of now.
            data, size = b"", 1 << 14
            while len(data := os.pread(fd, size, 0)) == size:
                size *= 4
            out.update(map(int, data.split()))
        except OSError:
            if tid == main:
                return None
    return out


def _strays() -> bool | None:
    """Whether a process an agent left may still run (True), none does (False), or this
    process cannot tell (None: not a subreaper). Strays that have died are waited for
    here (a subreaper's duty); as their own children then become ours, the children are
    read again until no dead one is left."""
    if not _SUBREAPER[0]:
        return None
    # Under the launch lock: an agent being started is not yet among _AGENTS.
    with _LAUNCHING:
        for _ in range(_STRAY_ROUNDS):
            children = _children()
            if children is None:
                return None
            strays = children - _AGENTS
            if not any([_waited_for(pid) for pid in strays]):
                return bool(strays)
    return True


def _collect(pids: list[int], within_s: float = 5.0) -> list[int]:
    """Wait (up to ``within_s`` in all) for killed processes to end, then for the dead
    among this process's children (:func:`_strays`); those still running by then."""
    deadline = time.monotonic() + within_s
    running = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            continue  # gone already (or no pidfd): what is dead is waited for below
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            if not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
                running.append(pid)
        finally:
            os.close(fd)
    _strays()
    return running


def _waited_for(pid: int) -> bool:
    """Waited for a child of ours that has ended; False while it runs."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True  # gone meanwhile


def attempt_marker(spec: AttemptSpec) -> tuple[bytes, ...]:
    """What only this attempt's processes have in their environment: its job folder is
    this state folder's (or this worker's) own, and its number is the job's current."""
    return _marker(spec.environment())


def _scratch(spec: AttemptSpec, profile_env: dict[str, str]) -> str | None:
    """A temporary folder of the attempt's own, for its agent's TMPDIR; None when the
    profile names a TMPDIR or none can be made (the agent then has the worker's). The CLIs
    leave files there every run (Claude a ``fswatch-probe-*`` folder): a year of nightly
    jobs piled them up in the worker's /tmp, one or more a job."""
    if "TMPDIR" in profile_env:
        return None
    try:
        return tempfile.mkdtemp(prefix=_scratch_prefix(spec.job_id, spec.attempt))
    except OSError:
        return None


def _scratch_prefix(job_id: object, attempt: object) -> str:
    return f"reviewq-job-{job_id}-attempt-{attempt}-"


def _drop(scratch: str | None, say: bool = True) -> None:
    """Remove an agent's TMPDIR; one left all the same (a file made immutable, a mount
    inside: a root agent's) is said, with ``say``, as nothing else will remove it."""
    if not scratch:
        return
    try:
        # What most agents leave: an empty folder, gone in one call. rmtree's walk of it
        # (its checks, a descriptor, a listing: 14 calls) cost ~45 µs a job in a worker.
        os.rmdir(scratch)
        return
    except (FileNotFoundError, NotADirectoryError):
        # A link, a FIFO put in its place: neither followed nor opened (rmtree opens
        # what it removes, and an open of a FIFO waits for a writer for good).
        return
    except OSError:
        pass  # not empty: walked below, as ever
    try:
        shutil.rmtree(scratch, ignore_errors=True)
        if not os.path.isdir(scratch) or os.path.islink(scratch):
            return
        # Kept by a folder the agent left read-only (Go makes its module cache so): a
        # worker that is not root removes nothing under it. Its group has ended, so
        # nothing swaps a folder for a link meanwhile; links are neither followed nor
        # made writable. The folder itself first: the walk lists nothing of one it
        # cannot read (an agent's chmod 000 "$TMPDIR").
        with contextlib.suppress(OSError):
            os.chmod(scratch, 0o700)
        for top, folders, _ in os.walk(scratch):
            for path in [top, *(os.path.join(top, name) for name in folders)]:
                with contextlib.suppress(OSError):
                    if stat.S_ISDIR(os.lstat(path).st_mode):
                        os.chmod(path, 0o700)
        shutil.rmtree(scratch, ignore_errors=True)
    except RecursionError:
        # Folders nested deeper than Python's recursion limit (3.11's rmtree and os.walk
        # recurse a call a level): raised out of the attempt, an agent's thousand-deep
        # `mkdir -p` cost its outcome (the worker's error, a launch failure). Left, said.
        pass
    if say and os.path.isdir(scratch) and not os.path.islink(scratch):
        logs.get().warning(
            "attempt.tmpdir_left",
            folder=scratch,
            reason="an agent's TMPDIR could not be removed: what it holds is left "
            "(an immutable file, a mount inside, folders nested too deep)",
        )


# A worker thread's agents share one TMPDIR, kept between them and emptied after each:
# made and removed for every agent, the folder cost ~60-300 µs of the worker's CPU a job
# (mkdir and rmdir on a disk's /tmp journal an inode and a block each time). Named in
# this process's ``HOST-PID.tmpdirs`` (one path a line, written before the folder is
# made) for as long as it lives: a worker killed between two agents leaves it to the
# next reap, as one killed mid-run leaves its agent's entry.
_KEPT = threading.local()  # .path: this thread's kept TMPDIR
# Every thread's, until the stop's reap removes them, with what it was when made or last
# emptied (:func:`_state`): its agent may put another in its place (a link to a folder
# the emptying then walked), open it to other users or give it away; a /tmp cleaner may
# remove it between two agents, a process its agent left may write in it.
_KEPT_ALL: dict[str, tuple[int, ...]] = {}
_KEPT_SUFFIX = ".tmpdirs"


def _state(st: os.stat_result) -> tuple[int, ...]:
    """A kept TMPDIR's identity (device, inode, owner, mode), then its last change: a
    folder of the same name made again may have the inode the removed one had."""
    return (st.st_dev, st.st_ino, st.st_uid, st.st_mode, st.st_ctime_ns)


def _kept_prefix(pid: int) -> str:
    return f"reviewq-worker-{pid}-"


def _kept_scratch(registry: Path, profile_env: dict[str, str]) -> str | None:
    """This thread's kept TMPDIR (made, and named in the process's list first, when it
    has none); None as :func:`_scratch` says it."""
    if "TMPDIR" in profile_env:
        return None
    path = getattr(_KEPT, "path", None)
    if path is not None and path in _KEPT_ALL:
        with contextlib.suppress(OSError):
            if _state(os.lstat(path)) == _KEPT_ALL[path]:
                return path
        # Gone or changed since it was emptied: not handed on (its list names it still).
        _KEPT_ALL.pop(path, None)
    pid = os.getpid()
    path = os.path.join(tempfile.gettempdir(), _kept_prefix(pid) + os.urandom(8).hex())
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    listed = registry / f"{socket.gethostname()}-{pid}{_KEPT_SUFFIX}"
    try:
        try:
            fd = private(listed, flags)
        except FileNotFoundError:
            registry.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = private(listed, flags)
        try:
            os.write(fd, os.fsencode(path) + b"\n")
        finally:
            os.close(fd)
        os.mkdir(path, 0o700)
        st = os.lstat(path)
    except OSError:
        return None
    _KEPT.path = path
    _KEPT_ALL[path] = _state(st)
    return path


def _empty_kept(path: str) -> None:
    """What an agent left in the kept TMPDIR goes before the next agent has it; a folder
    that cannot be emptied, is gone or is not as it was made is removed and not kept.
    Emptied through a descriptor of the folder itself, never through a link put in its
    place (its contents are reached by /proc's link to that descriptor)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        fd = None
    if fd is not None:
        try:
            st = os.fstat(fd)
            if _state(st)[:4] == _KEPT_ALL.get(path, ())[:4]:
                names = os.listdir(fd)
                for name in names:
                    if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                        _drop(f"/proc/self/fd/{fd}/{name}", say=False)  # said below
                    else:
                        os.unlink(name, dir_fd=fd)
                if not names or not os.listdir(fd):
                    # As it is now, emptied: handed on only if nothing changed it since.
                    _KEPT_ALL[path] = _state(os.fstat(fd) if names else st)
                    return
        except OSError:
            pass
        finally:
            os.close(fd)
    _KEPT_ALL.pop(path, None)
    _drop(path)  # a link in its place is left, and not followed


def _environ() -> dict[bytes, bytes] | os._Environ[bytes]:
    """This process's environment as bytes, as it is now. ``os.environb`` keeps a plain
    dict of it in step with every change made through ``os.environ``: read through the
    mapping itself, each variable is checked and looked up again in Python, ~13 µs an
    agent for 40 variables (~30 µs in a busy worker), against ~0.3 µs for the dict."""
    data = getattr(os.environb, "_data", None)
    return data if isinstance(data, dict) else os.environb


def _encoded(env: dict[str, str]) -> dict[bytes, bytes]:
    return {os.fsencode(k): os.fsencode(v) for k, v in env.items()}


def _marker(env: dict[str, str]) -> tuple[bytes, ...]:
    return tuple(f"\0{k}={env[k]}\0".encode() for k in ("REVIEWQ_JOB_DIR", "REVIEWQ_ATTEMPT"))


def _marked(sessions: dict[int, list[int]], marker: tuple[bytes, ...], skip: int) -> list[int]:
    """The members of the sessions (but ``skip``) one of the attempt's processes started:
    a session's leader carries its environment; a leader gone (a daemon's double fork),
    or ended and not yet reaped (a zombie has no environment to read: an agent whose
    worker died, init not come for it yet), its first other member."""
    if not marker:
        return []
    return [
        pid
        for sid, members in sessions.items()
        if sid != skip and _session_carries(sid, members, marker)
        for pid in members
    ]


def _session_carries(sid: int, members: list[int], marker: tuple[bytes, ...]) -> bool:
    said = _carries(sid, marker) if sid in members else None
    if said is None:
        others = [pid for pid in members if pid != sid]
        said = bool(others) and bool(_carries(others[0], marker))
    return said


def _carries(pid: int, marker: tuple[bytes, ...]) -> bool | None:
    """Whether the process's environment holds ``marker``; None when it has none to
    read (a zombie's read fails with ESRCH; a kernel thread's is empty)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except PermissionError:
        return False  # another user's: not an agent of ours
    except OSError:
        return None
    if not environ:
        return None
    environ = b"\0" + environ
    return all(m in environ for m in marker)


def _sessions() -> dict[int, list[int]]:
    """Every process of this machine by session (Linux /proc; elsewhere none)."""
    out: dict[int, list[int]] = {}
    try:
        pids = [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return out
    for pid in pids:
        # getsid is one system call where reading /proc/PID/stat is three and a parse:
        # this runs after every attempt, over every process of a shared machine.
        try:
            out.setdefault(os.getsid(pid), []).append(pid)
        except OSError:
            continue
    return out


def session_members(sid: int) -> list[int]:
    """The live processes whose session is ``sid``. The kernel does not hand out a pid
    still in use as a session id, so none is a stranger."""
    out = []
    for pid in _sessions().get(sid, []):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # after the command: state, ppid, pgrp, session
        if len(fields) > 3 and fields[3] == str(sid) and fields[0] not in ("Z", "X"):
            out.append(pid)
    return out


_NAMED = 20  # touched files named in the reasons (and so in the retry prompt); then a count
_HASHED = 200  # ... and hashed: a fix write excuses a file only with its hash


def _kb_content(rel: str) -> bool:
    """Whether a change at ``rel`` (besides the job's own notes and gates) is one to the
    KB: a note, gate or type spec (a `.md` file) or a folder of them gone (``dir/``).
    Not reviewq's own reports (``reviewq export`` while reviews run failed them all), nor
    a scratch file beside the notes (vim's ``4913`` probe on every save)."""
    return not unwatched(rel) and rel.endswith((".md", "/"))


def run_attempt(
    reviewer: Reviewer,
    spec: AttemptSpec,
    *,
    timeout_s: float,
    max_turns: int,
    guarded: Iterable[str] = (),
    trees: Iterable[str] = (),
    max_output_bytes: int = 5 * 1024 * 1024,
    on_tick: Callable[[], None] | None = None,
    tick_s: float = 30.0,
    on_launch: Callable[[str], None] | None = None,
    registry: Path | None = None,
    keep_tmpdir: bool = False,
) -> AttemptOutcome:
    """Run one attempt to its end and classify it (CONTRACT §6 step 4). ``on_launch`` runs
    once the agent has started, with the attempt's ``started_at``; ``on_tick`` every ``tick_s`` while it runs. A file under
    ``trees`` that changes, appears or goes away counts as touched like a guarded one.
    ``registry`` is the folder where the running agent is registered for orphan reaping;
    with ``keep_tmpdir`` (a worker's threads) its TMPDIR is the thread's kept one."""
    spec.attempt_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        spec.output_path.unlink()  # a leftover from a run of this attempt that was lost
    guarded = list(guarded)
    before = file_hashes(spec.root, guarded)
    trees = list(trees)
    head = _head(spec.root) if guarded or trees else None
    out = AttemptOutcome(
        spec.job_id, spec.attempt, LAUNCH_FAILURE, reviewer.profile.name, started_at=utcnow()
    )
    start = time.monotonic()
    try:
        cmd = reviewer.command(spec)
    except Exception as exc:
        # The profile cannot make a command (a placeholder the config check did not see,
        # a policy file it could not write): the outcome still goes back at once, as a
        # launch failure, instead of the attempt waiting out its lease as lost.
        out.ended_at = utcnow()
        detail = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        out.reasons = [f"could not build the command of {reviewer.profile.name}: {detail}"]
        return out
    own = spec.environment()
    # As bytes, the form the kernel takes: Popen encodes a str one a variable at a time.
    env = {**_environ(), **_encoded(cmd.env), **_encoded(own)}
    marker = _marker(own)
    # From here to the end of the agent's group, whatever changes under ``trees`` is its.
    window = WATCH.begin(spec.root, trees) if trees else None
    ooms, refused_forks = oom_kills(), forks_refused()
    proc = registered = scratch = None
    kept = keep_tmpdir and registry is not None
    try:
        with _LAUNCHING:
            if not STOPPING.is_set():
                # Made with the agent, and named in its registry entry before a stop can
                # look: made before the window's scan, it was left by a worker's stop or
                # a run-job's interrupt that came meanwhile, with nothing naming it. A
                # kept one is named in the process's list before it is made.
                scratch = _kept_scratch(registry, cmd.env) if kept else _scratch(spec, cmd.env)
                if scratch:  # the profile's env names none, nor does the attempt's
                    env[b"TMPDIR"] = os.fsencode(scratch)
                proc = launch(cmd.argv, env, cmd.cwd, spec.stdout_path, spec.stderr_path)
                if registry is not None:
                    named = None if kept else scratch  # a kept one: its list names it
                    registered = register_agent(registry, spec, proc.pid, marker, named)
    except (OSError, ValueError) as exc:  # ValueError: a NUL, a name with '=' in the env
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        if limit := logs.error_said(exc).removeprefix(str(exc)):
            detail = f"{detail}{limit}"  # the open-files limit it ran into, named
        out.reasons = [f"could not start {cmd.argv[0]!r}: {detail}"]
    finally:
        if proc is None and not kept:
            _drop(scratch)  # an interrupt's way out included: no agent, no entry has it
    if proc is None:
        if window is not None:
            WATCH.end(window)
        out.ended_at = utcnow()
        out.reasons = out.reasons or ["not started: the worker is stopping"]
        return out
    try:
        if on_launch is not None:
            on_launch(out.started_at)
        exited, unreachable = _wait(reviewer, spec, proc, start, timeout_s, on_tick, tick_s)
        out.exited_at = time.time()
        if not exited:
            kill_group(proc, marker=marker)
        else:
            reap_group(proc, marker)
    except BaseException:
        # Never leave an agent behind, whatever stopped us.
        kill_group(proc, grace_s=1.0, marker=marker)
        raise
    finally:
        # Ended on every way out: an open window keeps the watch's log growing.
        changed = WATCH.end(window) if window is not None else set()
        # The agent's group has ended (or was killed) by now. Its TMPDIR goes before the
        # entry that names it: a worker's stop that found the entry gone exited under
        # this thread, and one killed here left the folder for no reap to find. A kept
        # one is emptied for the next agent; its list names it still.
        if kept:
            if scratch:
                _empty_kept(scratch)
        else:
            _drop(scratch)
        if registered is not None:
            registered.unlink(missing_ok=True)
    out.duration_s = time.monotonic() - start
    out.ended_at = utcnow()
    out.exit_code = proc.returncode
    try:
        telemetry = priced(reviewer.telemetry(spec), reviewer.profile)
    except Exception as exc:
        # A report no adapter foresaw must not cost the outcome: the attempt would be
        # reaped as lost and its agent run again, and again.
        telemetry = Telemetry(error=bounded(f"unreadable CLI report: {type(exc).__name__}: {exc}"))
    if unreachable:
        telemetry.error = unreachable
        telemetry.failure = failure_kind(unreachable) or "unreachable"
    elif not exited and telemetry.failure is None and not _answered(reviewer, spec):
        # A hung endpoint (it took the request and never replied) outlasted the deadline:
        # no model answered, so the job was not too big; it waits, the profile pauses.
        telemetry.error = f"no model answered within the deadline of {timeout_s:g} s"
        telemetry.failure = "unreachable"
    # Stored and shown by the control, whose machine may not know this one's secrets.
    out.telemetry = logs.redact_data(telemetry.to_json())
    try:
        out.output, refused = read_output(spec.output_path, max_output_bytes), None
    except FinalizeError as exc:
        out.output, refused = None, str(exc)
    if spec.task == "fix" and out.output is not None:
        # A fixer's note is applied whole: one its CLI changed as it wrote it (Gemini's
        # unescaping) would change the note beyond the findings, and pass a re-review.
        try:
            refused = reviewer.output_altered(spec, out.output)
        except Exception:  # noqa: BLE001 - a record no adapter foresaw: the note as read
            refused = None
        out.output = None if refused else out.output
    too_large = out.output is not None and len(out.output) > max_output_bytes
    if too_large:
        out.output = None  # not carried anywhere: the size is the whole story
    if out.output is not None and emptiness(out.output) and (out.exit_code or telemetry.failure):
        # An empty file a failed agent left (a wrapper's `exec > "$REVIEWQ_OUTPUT_PATH"`
        # before a request that was refused; a byte-order mark or NULs alone, as E64 reads
        # them) is no output: judged as invalid, the reviewer's outage failed the job and
        # escalated it.
        out.output = None
    # A note has no END line: one a fixer left when it failed or was stopped (a streaming
    # CLI whose connection broke, the deadline) may be cut short anywhere, and applied it
    # replaced the whole note. Only a clean exit vouches for a fixer's note being whole,
    # or a stop at the turn limit: that comes between turns, once the last turn's tools
    # (its Write of the note) are done, and Claude exits 1 for it (error_max_turns). Its
    # own report says so: a count of turns does not (no other kind is given a limit, and
    # one that ran as many turns may have failed part-way through the note).
    at_turn_limit = telemetry.error_subtype == "error_max_turns"
    cut = (
        spec.task == "fix"
        and out.output is not None
        and bool((out.exit_code and not at_turn_limit) or telemetry.failure or not exited)
    )
    if cut:
        out.output = None
    # A bundle has END lines, so one cut short shows: left by an agent whose own report
    # says its model stopped answering (a rate limit between two writes of a long bundle),
    # it is that outage, not an invalid output counted against the job; left by one whose
    # model stopped at its output-token limit, it is a job too big for one answer.
    partial = (
        spec.task != "fix"
        and out.output is not None
        and (telemetry.failure is not None or telemetry.error_subtype == OUTPUT_LIMIT)
        and not _whole_bundle(spec, out.output, max_output_bytes)
    )
    if partial:
        out.output = None
    after = file_hashes(spec.root, guarded)
    out.touched = sorted(p for p in guarded if before.get(p) != after.get(p))
    out.touched_hashes = {p: after[p] for p in out.touched}
    if changed:
        others = {p for p in changed if p not in before and _kb_content(p)}
        out.touched_hashes.update(file_hashes(spec.root, sorted(others)[:_HASHED]))
        out.touched = sorted({*out.touched, *others})
    turns = telemetry.num_turns
    slow = out.duration_s >= LAUNCH_WINDOW_S
    if refused:
        out.classification = INVALID_OUTPUT
        out.reasons = [refused]
    elif too_large:
        try:
            size = spec.output_path.stat().st_size
        except OSError:
            size = max_output_bytes + 1
        out.classification = INVALID_OUTPUT
        out.reasons = [f"output is {size} bytes, over the {max_output_bytes}-byte limit"]
    elif out.output is not None:
        out.classification = OUTPUT
    elif telemetry.failure:
        # No model answered (or stopped answering): nothing here speaks of the job.
        out.classification = REVIEWER_FAILURE
        out.reasons = [f"{telemetry.failure}: {telemetry.error or 'no detail'}"]
    elif (
        room := _no_room(spec.output_path.parent, telemetry.error or _tail(spec.stderr_path))
    ) is not None:
        # A full disk is the worker's failure, never the job's: counted, three attempts
        # that could not write their output failed the job and escalated its pairs.
        out.classification = REVIEWER_FAILURE
        why = telemetry.error or _tail(spec.stderr_path)
        out.reasons = [f"disk: {room}; no output: {why}"]
    elif (
        exited
        and out.exit_code == -signal.SIGKILL
        and ooms is not None
        and (oom_kills() or 0) > ooms
    ):
        # Ended by the memory limit of the worker's cgroup, which its other agents share:
        # the machine's failure, as a full disk is. Counted against the job, three such
        # failed it and escalated its pairs, whatever the notes said.
        out.classification = REVIEWER_FAILURE
        out.reasons = [
            "memory: the out-of-memory killer of the worker's memory cgroup killed the "
            "agent (raise its memory.max, or lower the concurrency); no output"
        ]
    elif (
        exited
        and out.exit_code
        and refused_forks is not None
        and _NO_PROCESS_SAID.search(why := telemetry.error or _tail(spec.stderr_path))
        and ((forks_refused() or 0) > refused_forks)
    ):
        # A fork the agent made (a tool, a shell) was refused at the pids.max of the
        # worker's cgroup, which its other agents share: the machine's, as above. Said by
        # the agent too: the count is the cgroup's, and one that failed for a reason of
        # its own while another agent's fork was refused was taken for this.
        out.classification = REVIEWER_FAILURE
        out.reasons = [
            "pids: the worker's pids cgroup refused the agent a process at its pids.max "
            f"(raise it, or lower the concurrency); {exit_said(out.exit_code)}: {why}"
        ]
    elif telemetry.error_subtype == OUTPUT_LIMIT:
        # The model answered until its output-token cap: the job is too big for one
        # answer (split, when it has several pairs), not an outage.
        out.classification = BURNED_OUT
        out.reasons = [
            f"the model reached its output-token limit: {telemetry.error or 'no detail'}"
        ]
    elif not exited:
        out.classification = BURNED_OUT
        out.reasons = [
            f"deadline of {timeout_s:g} s reached with no output; the process group was killed"
        ]
    elif turns is not None and turns >= max_turns:
        out.classification = BURNED_OUT
        out.reasons = [f"used {turns} of {max_turns} turns with no output"]
    elif out.exit_code != 0 and not turns and (not slow or not _asked(reviewer, spec)):
        # Past the launch window too, when the CLI's own output says it never sent its
        # prompt: Gemini takes 7-21 s to start on a loaded machine, and a flag or config
        # it refused after that was a no-output counted against the job.
        out.classification = LAUNCH_FAILURE
        why = telemetry.error or _tail(spec.stderr_path)
        before = " before asking a model" if slow else ""
        out.reasons = [
            f"{exit_said(out.exit_code)} after {out.duration_s:.1f} s with no turns{before}: {why}"
        ]
        said = version_said(reviewer, spec.root)
        if said is not None and said[0] is not True:
            # A CLI older (or newer) than any reviewq has run may refuse a flag it passes:
            # its own line names the flag, this names the version to install.
            out.reasons[0] += f" ({said[1]})"
    else:
        out.classification = NO_OUTPUT
        out.reasons = [
            exit_said(out.exit_code) + ("" if cut else f" without writing {spec.output_path.name}")
        ]
        why = telemetry.error or (_tail(spec.stderr_path) if out.exit_code else "")
        if not why and telemetry.last_words:
            # A refusal reads as a CLI that forgot its task otherwise, to the operator
            # and to the retry's prompt alike.
            why = f"its model ended saying: {telemetry.last_words}"
        if why:
            out.reasons[0] += f": {why}"
        if out.exit_code == -signal.SIGKILL and ooms is None and _in_a_child_cgroup("memory"):
            # Said once as the worker starts (worker.limits_unseen), in its own log: the
            # person reading this job's failure in the morning reads it here.
            out.reasons.append(
                "this worker cannot tell an agent its memory cgroup's out-of-memory killer "
                "ended from one that crashed (no counter found for its memory cgroup: "
                "reviewq doctor --worker on its machine)"
            )
    if cut:
        out.reasons.append(
            f"{spec.output_path.name} is not applied: the fixer did not end cleanly, "
            "so the note it left may be cut short"
        )
    if partial:
        out.reasons.append(
            f"{spec.output_path.name} is not judged: it was left unfinished when the "
            "model stopped answering"
        )
    if out.touched and (update := _updated(spec.root, head, out.touched)) is not None:
        # A `git pull` of the KB (a worker's --kb copy kept up to date) while the agent
        # ran changed the files it watched: each attempt running then ended as the
        # reviewer's change to the KB, counted toward failing its job and escalating its
        # pairs, for a person's update (K100). Judged as without it, and said.
        logs.get().warning("attempt.kb_updated", reason=update)
        out.notices.append({"event": "attempt.kb_updated", "reason": update})
        out.touched, out.touched_hashes = [], {}
    if out.touched:
        out.untouched = [out.classification, out.reasons]
        out.classification = TOUCHED_KB
        out.reasons = [f"the reviewer changed {p}" for p in out.touched[:_NAMED]]
        if len(out.touched) > _NAMED:
            out.reasons.append(f"... and {len(out.touched) - _NAMED} more file(s)")
    return out


def _head(root: Path) -> str | None:
    """The commit the KB's HEAD is at, or None outside git (or where git cannot say)."""
    from orchestrator.kb.githead import head_commit

    return head_commit(root) or None


def _updated(root: Path, head: str | None, touched: list[str]) -> str | None:
    """Why the files an attempt saw change are an update of the KB, not the agent's: its
    HEAD moved while the agent ran, by an update as git's reflog says (a pull, a merge;
    not a commit nor a checkout, which an agent's own edit or branch is, C87), and each
    of them is as the new commit holds it (a file the agent made or edited is not); None
    when they are not."""
    from orchestrator.kb.gitcommit import as_committed, moved_by_update

    now = _head(root)
    if head is None or now is None or now == head:
        return None
    if not moved_by_update(root, head) or not as_committed(root, now, touched):
        return None
    return (
        f"the KB at {root} was updated while the agent ran (HEAD moved from {head[:12]} to "
        f"{now[:12]}; the {len(touched)} file(s) changed are as that commit holds them): "
        "not the agent's doing, the attempt is judged without it; update a worker's --kb "
        "copy while the worker is stopped"
    )


def _asked(reviewer: Reviewer, spec: AttemptSpec) -> bool:
    try:
        return reviewer.asked(spec)
    except Exception:
        return True  # what cannot be read says nothing: the launch window decides


def _answered(reviewer: Reviewer, spec: AttemptSpec) -> bool:
    try:
        return reviewer.answered(spec)
    except Exception:
        return True  # what cannot be read says nothing: the deadline stays the job's


def _wait(
    reviewer: Reviewer,
    spec: AttemptSpec,
    proc: subprocess.Popen,
    start: float,
    timeout_s: float,
    on_tick: Callable[[], None] | None,
    tick_s: float,
) -> tuple[bool, str | None]:
    """Wait for the agent until its deadline; past the profile's ``connect_timeout``, and
    every ``connect_timeout`` after, ask the adapter whether the CLI has reached its
    endpoint, and end it (killed here) when its own output says it has not."""
    deadline = start + timeout_s
    ticker = Ticker(on_tick, tick_s)
    step = reviewer.profile.connect_timeout
    if not step:
        return wait_for_exit(proc, deadline, ticker=ticker), None
    check = start + step
    while check < deadline:
        if wait_for_exit(proc, check, ticker=ticker):
            return True, None
        try:
            reason = reviewer.unreachable(spec)
        except Exception:
            reason = None  # what cannot be read says nothing of the endpoint
        if reason:
            kill_group(proc)
            return False, reason
        check += step
    return wait_for_exit(proc, deadline, ticker=ticker), None


# --- agents left behind by a worker that died ----------------------------------------------
# An agent runs in its own session so the deadline can kill its whole group; the price is
# that it outlives a SIGKILLed worker. Each running agent is registered in the state folder,
# and a worker starting on the same host kills the groups whose worker is gone.


def worker_folder(settings: Settings) -> Path:
    """A worker's private folder: ``--state`` itself on a machine of its own; but when that
    folder is a control process's (it holds state.db or control.lock, the queue is SQLite
    and so lives there, or it is the state folder of a KB's root, named by no --state),
    its subfolder ``worker/``. A worker writes nowhere else."""
    state = settings.state_dir
    if not settings.queue.url or (state / "state.db").exists() or (state / "control.lock").exists():
        return state / "worker"
    # Started a moment before its control, a worker beside the KB found neither file yet
    # and wrote its log and attempts among the control's.
    if not settings.state_given and (settings.root / "kb").is_dir():
        return state / "worker"
    return state


def worker_paths(folder: Path) -> tuple[Path, ...]:
    """The folders a worker writes in ``folder``, its own: its log's, its agents' registry's,
    its attempts'."""
    return (folder, folder / "logs", folder / "run", registry_dir(folder), folder / "attempts")


def unwritable(folder: Path) -> str | None:
    """Why a worker could not keep its files in ``folder``, or None; it looks and makes
    nothing (doctor). Started so, a worker took messages and failed every attempt as
    "could not prepare its attempt folder", a launch failure that paused the profile for
    every worker."""
    # The folders and file it writes in, not those above them: made once, a folder it no
    # longer writes in may be read-only.
    for path in (folder / "logs" / "reviewq.jsonl", *worker_paths(folder)[3:]):
        there = path
        while not there.exists() and there != there.parent:
            there = there.parent  # to be made: in the nearest folder that is there
        if there != path and not there.is_dir():
            return f"cannot make {path}: {there} is not a folder"
        if not os.access(there, os.W_OK | (os.X_OK if there.is_dir() else 0)):
            made = "" if there == path else f"cannot make {path}: "
            return f"{made}{not_writable(there)}"
    return None


def not_writable(path: Path) -> str:
    """Why this process may not write ``path``, as a line says it: a read-only mount, which
    no user can write (root, told its uid could not, looked for permissions to mend), or
    else the permissions."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return f"{path} is on a read-only file system"
    except OSError:
        pass
    return f"{path} cannot be written by this user (uid {os.getuid()})"


def registry_dir(state_dir: Path) -> Path:
    return state_dir / "run" / "agents"


# What a worker does with an attempt folder it removes unsent (its CLI's state forgotten).
Forget = Callable[[Path], None]


def attempt_folder(state_dir: Path, job_id: int, attempt: int, opened_at: object = None) -> Path:
    """A worker's private folder for one attempt, removed once its outcome is sent. Named
    for its opening too when the message says it: a state.db put back from a backup gives
    an attempt's numbers again while the lost history's message of them is still queued,
    and one worker running both made the second's folder over the first's, its agent
    still writing there (the second's outcome read the first's output, or none)."""
    name = f"job-{job_id}-attempt-{attempt}"
    digits = "".join(c for c in opened_at if c.isdigit()) if isinstance(opened_at, str) else ""
    return state_dir / "attempts" / (f"{name}-{digits}" if digits else name)


# How long a new attempt folder is left alone by a starting worker's sweep: what guards
# a folder between its making and its claim is :func:`making_attempt` (a clock stepped
# forward made a new folder old); this spares those of a worker of an earlier release,
# which makes folders and never claims them.
_CLAIM_GRACE_S = 60.0


@contextlib.contextmanager
def making_attempt(state_dir: Path) -> Iterator[None]:
    """Held (shared) while an attempt's folder is made, or a kept one made anew, and
    claimed; :func:`_remove_unheld` (a starting worker's, a reap's) holds it alone. A
    starting worker then never finds a folder between its making and its claim, nor
    removes by its name a folder made anew under the lock it took on the one before (a
    kept folder taken up again by a worker sharing the --state), prompt and all, under
    the attempt holding it."""
    with contextlib.suppress(OSError):  # the worker's first attempt, or attempts/ removed
        (state_dir / "attempts").mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = _attempts_lock(state_dir, fcntl.LOCK_SH)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _attempts_lock(state_dir: Path, how: int) -> int | None:
    """``state_dir``'s attempts/ opened and flocked ``how``; None when it cannot be (a
    filesystem without flock: then no folder can be claimed, and none is removed)."""
    try:
        fd = os.open(state_dir / "attempts", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, how)
    except OSError:
        os.close(fd)
        return None
    return fd


def claim_attempt(folder: Path) -> int | None:
    """Hold ``folder`` as this process's while its attempt lives here (an open descriptor
    with a flock, closed by the caller), so that :func:`_remove_unheld` leaves it be."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def remove_unclaimed(state_dir: Path, forget: Forget | None = None) -> list[str]:
    """Remove the attempt folders in ``state_dir`` no live process holds; their names.
    Those a worker left when it died with no agent running (an attempt waiting for an
    agent slot, or sending its outcome) are in no registry entry for
    :func:`reap_orphans` to find, and nothing else ever removed them. ``forget`` is
    given each folder before it goes (what its CLI kept for it, :func:`_remove_unheld`)."""
    try:
        names = [e.name for e in os.scandir(state_dir / "attempts")]
    except OSError:
        return []
    return _remove_unheld(state_dir, names, time.time() - _CLAIM_GRACE_S, forget)


def unclaimed_due_s(state_dir: Path) -> float | None:
    """Seconds until the youngest folder left in ``state_dir``'s attempts/ is past its
    grace (:func:`remove_unclaimed`), or None when none is left."""
    try:
        with os.scandir(state_dir / "attempts") as found:
            times = [e.stat(follow_symlinks=False).st_mtime for e in found]
    except OSError:
        return None
    return max(0.0, max(times) + _CLAIM_GRACE_S - time.time()) if times else None


def _remove_unheld(
    state_dir: Path,
    names: Iterable[str],
    before: float | None = None,
    forget: Forget | None = None,
) -> list[str]:
    """Remove the folders ``names`` of ``state_dir``'s attempts/ that no live process
    holds (:func:`claim_attempt`), and were changed ``before`` then if given; their names.
    Looked at alone (:func:`making_attempt`): a folder being made, or made anew, waits.
    ``forget`` gets each folder first, while its logs still name what the CLI kept in
    its home for it: a worker killed mid-attempt never sent its outcome, so never
    forgot it, and nothing else would."""
    removed: list[str] = []
    held = _attempts_lock(state_dir, fcntl.LOCK_EX)
    if held is None:
        return removed
    try:
        for name in names:
            path = state_dir / "attempts" / name
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue  # not a folder (or gone): not an attempt's
            try:
                if before is not None and os.fstat(fd).st_mtime > before:
                    continue
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: a live worker's
            else:
                if forget is not None:
                    forget(path)
                shutil.rmtree(path, ignore_errors=True)
                removed.append(name)
            finally:
                os.close(fd)
    finally:
        os.close(held)
    return removed


# An unreadable registry entry younger than this may be one a live worker is writing.
_UNREADABLE_ENTRY_S = 60.0


def register_agent(
    folder: Path,
    spec: AttemptSpec,
    pgid: int,
    marker: tuple[bytes, ...] | None = None,
    scratch: str | None = None,
) -> Path | None:
    path = folder / f"{socket.gethostname()}-{pgid}.json"
    entry = {
        "worker_pid": os.getpid(),
        "pgid": pgid,
        "job_id": spec.job_id,
        "attempt": spec.attempt,
        "opened_at": spec.opened_at,  # which of two attempts of these numbers (stop_agent)
        # What the sessions its processes start carry (latin-1: bytes back).
        "marker": [m.decode("latin-1") for m in marker or attempt_marker(spec)],
        # Its TMPDIR (_scratch): removed by whoever reaps it, its thread having died or
        # been cut short by its worker's exit.
        "scratch": scratch,
    }
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        try:
            fd = private(path, flags)
        except FileNotFoundError:  # the folder is made once, not looked for each agent
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = private(path, flags)
        try:
            os.write(fd, json.dumps(entry).encode())
        finally:
            os.close(fd)
        return path
    except OSError:
        return None


def _alive_worker(pid: int) -> bool:
    """The registering process still runs. A reused pid reads as alive: leaving an
    orphan is better than killing the agent of a live run."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return fields.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _group_is_agent(pgid: int, job_id: int, attempt: int | None = None) -> bool:
    """The group leader still is the agent we started (its pid was not reused), of that
    attempt when it is named: a worker may run a lost attempt's agent beside the current
    one of the same job."""
    try:
        environ = Path(f"/proc/{pgid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"REVIEWQ_JOB_ID={job_id}".encode() in environ and (
        attempt is None or f"REVIEWQ_ATTEMPT={attempt}".encode() in environ
    )


def stop_agent(
    state_dir: Path,
    job_id: int,
    attempt: int,
    sig: int = signal.SIGTERM,
    opened_at: object = None,
) -> bool:
    """Signal the agent group this process runs for an attempt (found in the registry,
    and still that agent: its pid not reused); True when there was one. A SIGTERM lets it
    end as it means to; the thread waiting on it then reaps what is left of its group and
    sessions, as after any exit. With ``opened_at``, not an agent of the same numbers
    opened at another time (another history's)."""
    path = registry_dir(state_dir)
    for entry_path in path.glob(f"{socket.gethostname()}-*.json") if path.is_dir() else []:
        try:
            entry = json.loads(entry_path.read_text())
        except (OSError, ValueError):
            continue
        if (entry.get("worker_pid"), entry.get("job_id"), entry.get("attempt")) != (
            os.getpid(),
            job_id,
            attempt,
        ) or not _group_is_agent(entry["pgid"], job_id, attempt):
            continue
        said = entry.get("opened_at")
        if isinstance(said, str) and isinstance(opened_at, str) and said != opened_at:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(entry["pgid"], sig)
            return True
    return False


class Reaped(NamedTuple):
    killed: list[int]  # the agents' process groups
    running: list[int]  # their processes still running after a bounded wait
    # (job_id, attempt, worker: HOST:PID, opened_at or None) of each attempt whose worker
    # died, for the control
    orphaned: list[tuple[int, int, str, str | None]]


def reap_orphans(
    state_dir: Path, mine: bool = False, said: str = "", forget: Forget | None = None
) -> Reaped:
    """Kill the agent groups on this host whose worker process is gone (or, with
    ``mine``, this process's own, as a stopping worker does), and wait (bounded) for
    them to end. With ``said`` (why they were left), any killed, and the dead workers'
    attempts, are logged as ``worker.reaped_orphans``; ``forget`` gets each attempt folder removed, first, and
    with ``mine`` each of this process's, kept, once its agent has ended."""
    killed, gone, scratches, folders, reaped = [], [], [], [], []
    stopped: list[Path] = []
    orphaned: list[tuple[int, int, str, str | None]] = []
    folder = registry_dir(state_dir)
    entries = []
    for path in folder.glob(f"{socket.gethostname()}-*.json") if folder.is_dir() else []:
        try:
            entries.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):
            # Empty or cut short: left by a worker killed in its write, or being written
            # now by a live one (register_agent makes the file, then writes it), whose
            # agent it alone names. Only an old one is a dead worker's.
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < time.time() - _UNREADABLE_ENTRY_S:
                    path.unlink()
    lists = []  # processes' lists of kept TMPDIRs: a dead one's, or with mine this one's
    for path in folder.glob(f"{socket.gethostname()}-*{_KEPT_SUFFIX}") if folder.is_dir() else []:
        pid = path.name[: -len(_KEPT_SUFFIX)].rsplit("-", 1)[-1]
        if not pid.isdigit() or (int(pid) == os.getpid()) != mine:
            continue
        if not mine and _alive_worker(int(pid)):
            continue
        with contextlib.suppress(OSError):
            for line in path.read_bytes().decode("utf-8", "replace").splitlines():
                if Path(line).name.startswith(_kept_prefix(int(pid))):
                    scratches.append(line)
            lists.append(path)
    if mine:
        with _LAUNCHING:
            _KEPT_ALL.clear()  # its threads make new ones if they run agents again
    # Attempts a live worker runs (one sharing this folder may run an attempt a stopped
    # worker had queued again): their folders are theirs.
    live_attempts = {
        (e.get("job_id"), e.get("attempt"), _opening(e))
        for _, e in entries
        if _alive_worker(e["worker_pid"])
    }
    for path, entry in entries:
        if mine and entry["worker_pid"] != os.getpid():
            continue
        if not mine and _alive_worker(entry["worker_pid"]):
            continue
        group, doomed = _end_agent(entry)
        killed += group
        gone += group + doomed
        key = (entry.get("job_id"), entry.get("attempt"))
        scratch = entry.get("scratch")
        if isinstance(scratch, str) and Path(scratch).name.startswith(_scratch_prefix(*key)):
            scratches.append(scratch)
        opened = _opening(entry)
        if mine and all(isinstance(k, int) for k in key):
            # A stopping worker's own: its folder kept for the run queued again, but the
            # session its CLI kept is this run's alone, and the process exits before the
            # attempt's thread gets to forget it.
            stopped.append(attempt_folder(state_dir, *key, opened))
        if (
            not mine
            and (*key, opened) not in live_attempts
            and all(isinstance(k, int) for k in key)
        ):
            # Its worker died: no outcome will be sent, and nothing else removes the
            # prompt (quoting notes) and what the agent left. (A stopping worker's own
            # attempts were queued again, maybe to a worker sharing this folder: kept,
            # and so is one that worker holds, taking one up that a dead one queued.)
            folders.append(attempt_folder(state_dir, *key, opened).name)
            # Nor is the control told of it when a live worker runs those numbers and
            # either entry names no opening (releases mixed on this folder at an
            # upgrade): that is the attempt queued again, its folder named otherwise.
            if not (
                (opened is None and any(live[:2] == key for live in live_attempts))
                or (*key, None) in live_attempts
            ):
                orphaned.append((*key, f"{socket.gethostname()}:{entry['worker_pid']}", opened))
        reaped.append(path)
    # A SIGKILL is not yet an end: a stopping worker exited with its agents alive a
    # moment more, their files (a TMPDIR) still in use. Those ended, a zombie counts.
    running = _collect(gone) if gone else []
    for kept in stopped if forget is not None else []:
        forget(kept)
    for scratch in scratches:
        _drop(scratch)
    # Only then the entries that name them: a reap cut short (a worker killed as it
    # started, or as it stopped) left them to the next one.
    for path in [*reaped, *lists]:
        path.unlink(missing_ok=True)
    if folders:
        _remove_unheld(state_dir, folders, forget=forget)
    if (killed or orphaned) and said:
        # Said of the attempts too, with or without agents left to kill: a dead worker's
        # agent that had ended before this start (a quick one, a restart minutes later)
        # left no trace in this machine's log of the attempts the control runs again.
        logs.get().warning(
            "worker.reaped_orphans",
            process_groups=killed,
            reason=said,
            attempts=[[o[0], o[1]] for o in orphaned],
            died=sorted({o[2] for o in orphaned}),
        )
    return Reaped(killed, running, orphaned)


def _end_agent(entry: dict) -> tuple[list[int], list[int]]:
    """SIGKILL a registry entry's agent: its group and session, and the sessions its
    processes started; (its group, when still the agent's; the other processes)."""
    marker = tuple(m.encode("latin-1") for m in entry.get("marker") or [])
    # Still that attempt's agent: its pid, taken since by another KB's agent for a
    # job of the same number (or this job's next attempt, a live worker's), is not.
    ours = _group_is_agent(entry["pgid"], entry["job_id"])
    ours = ours and (not marker or _carries(entry["pgid"], marker))
    group: list[int] = []
    doomed: list[int] = []
    if ours:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(entry["pgid"], signal.SIGKILL)
            group.append(entry["pgid"])
        doomed = session_members(entry["pgid"])
    # Sessions the agent's processes started (setsid, Node's detached spawn) outlive
    # its group, and the agent itself may be gone (then its own session's members
    # too): found by the attempt's marker.
    doomed += _marked(_sessions(), marker, entry["pgid"] if ours else -1)
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return group, doomed


def end_agents_of(state_dir: Path, worker_pid: int) -> tuple[list[int], list[list[int]]]:
    """End the agents a worker that has just died left running (its guard's work,
    :mod:`workers.guard`): their process groups, and the ``[job, attempt]`` each ran.
    Their registry entries, TMPDIRs and attempt folders stay: the next worker started
    there takes the attempts up and tells the control of them (:func:`reap_orphans`)."""
    folder = registry_dir(state_dir)
    ended: list[int] = []
    attempts: list[list[int]] = []
    for path in folder.glob(f"{socket.gethostname()}-*.json") if folder.is_dir() else []:
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # one being written as it died: the next start's reap finds it
        if entry.get("worker_pid") == worker_pid:
            ended += _end_agent(entry)[0]
            key = [entry.get("job_id"), entry.get("attempt")]
            attempts += [key] if all(isinstance(k, int) for k in key) else []
    return sorted(ended), sorted(attempts)


def start_own(argv: list[str], stdin: int) -> subprocess.Popen:
    """Start a process of this worker's own that is not an agent (its guard), in a
    session of its own (a terminal's Ctrl-C is the worker's to take): a subreaper's
    child outside :data:`_AGENTS` is taken for one an agent left."""
    with _LAUNCHING:
        proc = subprocess.Popen(argv, stdin=stdin, start_new_session=True, cwd="/")
        _AGENTS.add(proc.pid)
    return proc


def own_ended(proc: subprocess.Popen, within_s: float = KILL_GRACE_S) -> None:
    """Wait (bounded) for a process :func:`start_own` started, and forget it."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=within_s)
    with _LAUNCHING:
        if proc.returncode is not None:
            _AGENTS.discard(proc.pid)


def _opening(entry: dict) -> str | None:
    """A registry entry's opening; None from a worker of the release before openings."""
    opened = entry.get("opened_at")
    return opened if isinstance(opened, str) else None


def read_tail(path: Path, limit: int) -> bytes:
    """The last ``limit`` bytes of a file, read without reading the rest."""
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - limit))
        return f.read(limit)


def _whole_bundle(spec: AttemptSpec, output: bytes, limit: int) -> bool:
    """Whether a review's output parses with every pair of the job (MANIFEST.json beside
    the prompt names them; finalize judges it again); True when that cannot be told."""
    try:
        manifest = json.loads((spec.job_dir / "MANIFEST.json").read_bytes())
        pairs = [ExpectedPair(p["note_path"], p["gate_path"]) for p in manifest["pairs"]]
    except (OSError, ValueError, LookupError, TypeError):
        return True
    return parse_bundle(output, pairs, max_bytes=limit).ok


# A machine's limits end an agent by a signal reviewq did not send: "exited -9" named
# neither the signal nor the limit an operator should look at.
_SIGNAL_HINT = {
    signal.SIGKILL: "as an out-of-memory kill in a memory cgroup does",
    signal.SIGXFSZ: "a file outgrew the file-size limit, RLIMIT_FSIZE",
}


def exit_said(code: int | None) -> str:
    """How an agent ended, in words: its exit code, or the signal that killed it."""
    if code is None or code >= 0:
        return f"exited {code}"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"killed by signal {-code}"
    hint = _SIGNAL_HINT.get(sig)
    return f"killed by {sig.name}" + (f" ({hint})" if hint else "")


def _own_cgroups() -> list[tuple[str, str]]:
    """This process's cgroups as /proc/self/cgroup lists them: (the controllers, comma
    separated, "" for v2's, the cgroup's path); none where that file cannot be read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    return [tuple(line.split(":", 2)[1:]) for line in lines if line.count(":") >= 2]


def _cgroup_mounts() -> list[tuple[str, str, str]]:
    """Each cgroup file system this process sees: (the cgroup at its top, where it is
    mounted, its type and controllers: ``cgroup2``, or v1's options such as ``rw,memory``)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, fs = left.split(), right.split()
        if len(fields) >= 5 and len(fs) >= 3 and fs[0] in ("cgroup", "cgroup2"):
            # mountinfo writes a space, tab, newline or backslash as an octal escape.
            root, point = (
                re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), f) for f in fields[3:5]
            )
            mounts.append((root, point, "cgroup2" if fs[0] == "cgroup2" else fs[2]))
    return mounts


@functools.cache
def _cgroup_files(controller: str, events: str) -> tuple[str, ...]:
    """Where this process's cgroup for ``controller`` keeps ``events`` (v2's, or v1's for
    that controller): looked up once, since a worker stays in its cgroup. Found through
    the mounts: in a container without a cgroup namespace of its own, /proc/self/cgroup
    names the container's cgroup by its host path while /sys/fs/cgroup/memory is that
    cgroup itself, and the path joined to /sys/fs/cgroup found nothing. In one with its
    own namespace and the machine's mounts (their root ``/..``, above the namespace's),
    that join found the machine's root cgroup's, a count no kill below it raises."""
    v1 = "memory.oom_control" if controller == "memory" else events
    mounts = _cgroup_mounts()
    files = []
    for controllers, path in _own_cgroups():
        if controllers == "":
            name, seen = events, [(r, p) for r, p, kind in mounts if kind == "cgroup2"]
            guesses = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]  # hybrid mounts
        elif controller in controllers.split(","):
            name = v1
            seen = [(r, p) for r, p, kind in mounts if controller in kind.split(",")]
            guesses = [f"/sys/fs/cgroup/{controller}"]
        else:
            continue
        for root, point in seen:
            if root == "/" or path == root or path.startswith(root + "/"):
                below = path if root == "/" else path[len(root) :]
                files.append(f"{point.rstrip('/')}{below.rstrip('/')}/{name}")
        if not seen:  # no mountinfo: a mount it lists and does not match is no one's
            files += [f"{g}{path.rstrip('/')}/{name}" for g in guesses]
    return tuple(dict.fromkeys(f for f in files if os.path.exists(f)))


def _cgroup_count(controller: str, events: str, key: str) -> int | None:
    """The count ``key`` in this process's cgroup's ``events`` for ``controller``, or None
    where it cannot be read. An agent inherits the worker's cgroup: a count of limit hits
    that rose over an attempt says the limit ended it."""
    for name in _cgroup_files(controller, events):
        try:
            text = _small_file(name)
        except OSError:
            continue
        if m := re.search(rb"^%s (\d+)$" % key.encode(), text, re.M):
            return int(m.group(1))
    return None


def _small_file(name: str, size: int = 65536) -> bytes:
    """A cgroup file read in three system calls (open, read, close): read before every
    attempt, Path.read_text took nine. A cgroup file is a seq_file, which fills the
    buffer it is given to the end of what it shows: a read short of ``size`` has it all."""
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, size)]
        while len(chunks[-1]) == size:
            chunks.append(os.read(fd, size))
    finally:
        os.close(fd)
    return b"".join(chunks)


def oom_kills() -> int | None:
    """How many processes the out-of-memory killer of this process's memory cgroup has
    killed so far (v2's ``memory.events``, v1's ``memory.oom_control``)."""
    return _cgroup_count("memory", "memory.events", "oom_kill")


def forks_refused() -> int | None:
    """How many forks this process's pids cgroup has refused at its ``pids.max``."""
    return _cgroup_count("pids", "pids.events", "max")


# The inode of the machine's own cgroup namespace (the kernel's PROC_CGROUP_INIT_INO).
_INITIAL_CGROUP_NAMESPACE = 0xEFFFFFFB


def _in_a_child_cgroup(controller: str) -> bool:
    """Whether this process's cgroup for ``controller`` (v1's, else v2's) is below the
    root: at the root no limit of the cgroup's own applies, so none is missed. In a
    cgroup namespace of its own (a container's) ``/`` is the container's cgroup, which
    its limits bind: a root there is a child."""
    paths = {c: p for cs, p in _own_cgroups() for c in cs.split(",")}
    if not paths:
        return False  # no cgroups here: no cgroup limit either
    return _own_cgroup_namespace() or paths.get(controller, paths.get("", "/")) != "/"


def _own_cgroup_namespace() -> bool:
    """Whether this process is in a cgroup namespace other than the machine's."""
    try:
        return os.stat("/proc/self/ns/cgroup").st_ino != _INITIAL_CGROUP_NAMESPACE
    except OSError:
        return False  # a kernel without cgroup namespaces


def _nproc_bound() -> int | None:
    """The RLIMIT_NPROC this worker's user may reach, or None: root passes it, and the
    kernel's own default (half of ``kernel.threads-max``, which binds the whole machine
    anyway) on every user is no limit a person set."""
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if nproc == resource.RLIM_INFINITY or os.geteuid() == 0:
        return None
    try:
        default = int(Path("/proc/sys/kernel/threads-max").read_text()) // 2
    except (OSError, ValueError):
        return nproc
    return nproc if nproc < default else None


def limits_unseen() -> str | None:
    """What this worker cannot tell of its agents' ends for want of a count of the limit's
    hits (L43, L44), or None: said once, as it starts and by ``doctor --worker``. Nothing
    said it: on such a machine an OOM kill was a crash of the job's, silently."""
    unseen, hints = [], []
    if oom_kills() is None and _in_a_child_cgroup("memory"):
        unseen.append(
            "an agent its memory cgroup's out-of-memory killer ended from one that crashed "
            "(no memory.events nor memory.oom_control found for its memory cgroup)"
        )
    if forks_refused() is None and _in_a_child_cgroup("pids"):
        unseen.append(
            "an agent refused a process at its cgroup's pids.max from one that failed on "
            "its own (no pids.events found for its pids cgroup)"
        )
    if unseen:
        hints.append(
            "its cgroup's files are looked for through /proc/self/cgroup and "
            "/proc/self/mountinfo; "
            + (
                "mount the container's cgroup file system at /sys/fs/cgroup"
                if _own_cgroup_namespace()
                else "in a container, give it a cgroup namespace of its own "
                "(docker run --cgroupns=private)"
            )
        )
    if (nproc := _nproc_bound()) is not None:
        # The kernel keeps no count of the forks it refused at RLIMIT_NPROC: an agent's
        # tool refused at it (EAGAIN, shared by every process of the user) is its job's.
        unseen.append(
            f"an agent refused a process at RLIMIT_NPROC ({nproc}, shared by every "
            "process of its user) from one that failed on its own"
        )
        hints.append("a pids cgroup's pids.max (systemd's TasksMax=) is a limit it can tell")
    if not unseen:
        return None
    return (
        f"this worker cannot tell {' nor '.join(unseen)}: such attempts count against "
        f"their jobs ({'; '.join(hints)})"
    )


# What an agent says when a process or thread it asked for was refused (EAGAIN): bash's
# "fork: retry: Resource temporarily unavailable", Python's BlockingIOError, node's
# "spawn EAGAIN", a thread that could not start.
_NO_PROCESS_SAID = re.compile(
    r"resource temporarily unavailable|EAGAIN|can't start new thread|cannot fork", re.I
)
# What an agent says when a write found no room: the errno's text or name (a quota too).
_NO_ROOM_SAID = re.compile(r"no space left on device|ENOSPC|disk quota exceeded|EDQUOT", re.I)
_NEARLY_FULL = 64 * 1024  # bytes: no output of a review fits, nor most agents' own files


def _no_room(folder: Path, said: str) -> str | None:
    """Why an attempt without output may have had no room for it, or None: the agent said
    a write found none, or the disk where the output goes is (nearly) full. A threshold at
    the output limit read a small disk, or a raised limit, as full: every job too big for
    its deadline then waited for good (a reviewer failure is never counted nor split)."""
    if m := _NO_ROOM_SAID.search(said):
        return f"the agent said {m.group(0)!r}"
    try:
        st = os.statvfs(folder)
    except OSError:
        return None  # a folder gone says nothing of the disk
    # root writes into the blocks kept back from other users: only their end is full.
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    return f"{free} bytes free in {folder}" if free < _NEARLY_FULL else None


def _tail(path: Path, limit: int = 300) -> str:
    try:
        data = read_tail(path, limit)
    except OSError:
        return ""
    text = data.decode("utf-8", "replace").strip().splitlines()
    return bounded(text[-1]) if text else "(no stderr)"
