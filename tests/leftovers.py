"""What a test run leaves on the machine when a test fails or the run is stopped, found and
ended: processes a test started (by a mark in their environment) and the network
namespaces named by a test process's pid (tests/test_vendor_clis.py, test_two_hosts.py).

A test that fails between starting a process and stopping it, or whose process outlives
the stop it is given (an agent that ignores SIGTERM and SIGINT), left it running under
init: one was 34 minutes old. A run killed outright (SIGKILL, a CI job cancelled, an
xdist worker killed) runs no finalizer at all: what it left is ended by the next run."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

MARK = "REVIEWQ_TEST_PROCESS"
NETNS_DIR = Path("/var/run/netns")
# A namespace a test process named by its pid: the vendor CLIs' and the two hosts'
# (whose tag is the pid modulo 100000: the pid itself below that).
_NETNS_NAMES = re.compile(r"^(?:reviewq-vendor-|rq2h-[cw])(\d+)$")
_count = itertools.count(1)


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot): with the pid, names one process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


OWNER = f"{os.getpid()}.{_start_time(os.getpid())}"


# What this process starts outside any test (a session's Chromium, a module's model
# server) carries this, so that a run killed outright has that ended by the next too.
RUN_MARK = f"{OWNER}.0"
# Made by a test process and named by its pid: a Chromium's TMPDIR (tests/chromium.py),
# a memory or pids cgroup (tests/test_machine_limits.py).
CHROMIUM_TMP = Path("/tmp")
CGROUP_PARENTS = [
    Path("/sys/fs/cgroup"),
    Path("/sys/fs/cgroup/memory"),
    Path("/sys/fs/cgroup/pids"),
]
SHM = Path("/dev/shm")
_PID_NAMED = re.compile(r"^(?:rq-chromium-|reviewq-test-)(\d+)(?:-.*)?$")


def new_mark() -> str:
    """A value for MARK that no other test, in this run or another, has."""
    return f"{OWNER}.{next(_count)}"


def _marks() -> dict[int, str]:
    """Every running process's MARK, by pid (this process's own left out)."""
    key = f"\0{MARK}=".encode()
    found = {}
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        with contextlib.suppress(OSError):
            environ = b"\0" + Path(f"/proc/{entry.name}/environ").read_bytes()
            if (at := environ.find(key)) >= 0:
                value = environ[at + len(key) :].split(b"\0", 1)[0]
                found[int(entry.name)] = value.decode(errors="replace")
    return found


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _describe(pid: int) -> str:
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return str(pid)
    return f"{pid} {args.decode(errors='replace').strip()[:200]}"


def end(pids: list[int], grace: float) -> list[str]:
    """Those of ``pids`` still running after ``grace`` seconds (one stopped a moment ago
    may be on its way out), SIGKILLed; what they were, for the message."""
    fds = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            fds[os.pidfd_open(pid)] = pid
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + grace
        waiting = set(fds)
        while waiting and (left := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(left * 1000):
                poller.unregister(fd)
                waiting.discard(fd)
        stubborn = [fds[fd] for fd in waiting if _running(fds[fd])]
        said = [_describe(pid) for pid in stubborn]
        for fd in waiting:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)  # the process, never a reuse
            _remove_faketime_files(fds[fd])
        return said
    finally:
        for fd in fds:
            os.close(fd)


def _remove_faketime_files(pid: int) -> None:
    """What libfaketime made for ``pid``, a process ended outright, removed. Preloaded into
    a process whose environment names none (tests/test_remote_workers.py's worker on
    another clock), it makes a semaphore and a shared memory object named by that pid in
    /dev/shm, which only that process's own exit removes: one SIGKILLed left both for good."""
    for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
        with contextlib.suppress(FileNotFoundError):
            (SHM / name).unlink()


def of_another_run(pid: int, changed_at: float) -> bool:
    """Whether ``pid`` runs now and is no process of this run: a worker of another test
    run on this host, or one a person started, whose agents' TMPDIRs in the host's /tmp
    this run is not to name. (Gone, it cannot be told: it counts as this run's.) One
    that began after ``changed_at``, the folder's last change, is not the worker that
    made it: the pid was taken again (pid_max is 32768 on many hosts)."""
    try:
        environ = b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    if not _running(pid) or _started_at(pid) > changed_at + _START_SLACK_S:
        return False
    key = f"\0{MARK}=".encode()
    at = environ.find(key)
    value = environ[at + len(key) :].split(b"\0", 1)[0].decode(errors="replace") if at >= 0 else ""
    return not value.startswith(f"{OWNER}.")


# /proc gives a start to the clock tick, read against the uptime to the hundredth.
_START_SLACK_S = 1.0


def _started_at(pid: int) -> float:
    """When the process began, on the wall clock (0 when it cannot be read)."""
    ticks = _start_time(pid)
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    if ticks is None:
        return 0.0
    return time.time() - uptime + int(ticks) / os.sysconf("SC_CLK_TCK")


def running_with(mark: str) -> list[int]:
    """The processes that carry ``mark``: those a test started and what they started."""
    return [pid for pid, value in _marks().items() if value == mark and _running(pid)]


def _owner_alive(owner: str) -> bool:
    pid, _, start = owner.partition(".")
    return pid.isdigit() and _start_time(int(pid)) == start


def orphaned_processes() -> list[int]:
    """The processes a test of a run that is gone started, and left running."""
    return [
        pid
        for pid, value in _marks().items()
        if not _owner_alive(value.rsplit(".", 1)[0]) and _running(pid)
    ]


def orphaned_namespaces() -> list[str]:
    """The network namespaces named by a test process that is gone."""
    if not NETNS_DIR.is_dir():
        return []
    named = {
        e.name: int(m.group(1)) for e in os.scandir(NETNS_DIR) if (m := _NETNS_NAMES.match(e.name))
    }
    if not named:
        return []
    # Modulo 100000 as the two hosts' tag is: a pid past it that gives the same tag may be
    # the namespace's owner, alive, and its namespace is left to it.
    alive = {int(e.name) % 100000 for e in os.scandir("/proc") if e.name.isdigit()}
    return [name for name, tag in named.items() if tag % 100000 not in alive]


def delete_namespace(name: str) -> None:
    """``name`` deleted with what still runs in it (its end of a veth pair goes with it)."""
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    end([int(p) for p in pids.stdout.split() if p.isdigit()], grace=0)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _pid_named(folder: Path, prefix: str) -> list[Path]:
    """``folder``'s entries named ``prefix`` and the pid of a process that is gone."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            m = _PID_NAMED.match(entry.name)
            if entry.name.startswith(prefix) and m and not Path(f"/proc/{m.group(1)}").exists():
                found.append(Path(entry.path))
    return found


def remove_cgroup(group: Path) -> None:
    """``group`` removed, what still runs in it killed first (the kernel refuses to remove
    a cgroup with a process in it, and frees an emptied one a moment later)."""
    with contextlib.suppress(OSError):
        pids = (group / "cgroup.procs").read_text().split()
        end([int(p) for p in pids], grace=0)
    deadline = time.monotonic() + 5
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)  # no event says an emptied cgroup is freed


def clean_after_dead_runs() -> list[str]:
    """What runs that ended without their finalizers left, ended; what it was."""
    said = [f"process {p}" for p in end(orphaned_processes(), grace=0)]
    for name in orphaned_namespaces():
        delete_namespace(name)
        said.append(f"network namespace {name}")
    for parent in CGROUP_PARENTS:
        for group in _pid_named(parent, "reviewq-test-"):
            with contextlib.suppress(OSError):
                remove_cgroup(group)
                said.append(f"cgroup {group}")
    for folder in _pid_named(CHROMIUM_TMP, "rq-chromium-"):
        shutil.rmtree(folder, ignore_errors=True)
        said.append(f"Chromium's folder {folder}")
    return said
