"""A worker's agents end with it. Each runs in a session of its own, so a worker killed
(SIGKILL, the OOM killer, a crash) left them running unwatched: past their deadline, an
agent of a real vendor paid for the while, until the next worker on that host reaped
them, if one was ever started. The worker's guard, a process of its own, holds the read
end of a pipe whose write end only the worker holds (not inherited by agents, closed by an
exec): the kernel closes it as the worker dies, however it dies, and the guard ends the
agents the worker's registry names. A worker that ends by itself (a stop, a reload's
exec) writes a byte first, and the guard leaves. A ``reviewq run-job`` has one too: it
writes the attempt it opened down the pipe, and its guard, the run-job killed, also gives
that attempt up in state.db (:func:`taken_back`).

``PR_SET_PDEATHSIG`` on each agent was the other way: it needs a ``preexec_fn``, which
costs each launch its vfork and is not safe beside threads, it follows the thread that
started the agent rather than the worker, and it signals the agent alone, not the
processes of its group and the sessions they started."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

# What a worker that ends by itself writes before it closes its end.
LEAVING = b"."
# The guard of a run-job (its third argument): what it is told is an attempt to give up.
RUN_JOB = "run-job"


class Guard:
    """The guard of this worker process, for ``state_dir``'s registry of its agents. One
    that ends under the live worker (killed by hand or by a cgroup's OOM killer) is said,
    and another started: the worker noticed nothing, and a kill of it then left its
    agents running until the next worker's start."""

    def __init__(self, state_dir: Path, of: str = "worker") -> None:
        self._state_dir, self._of = state_dir, of
        self._lock = threading.Lock()  # a leave and a restart, one at a time
        self._leaving = False
        self._told = b""  # what a guard started again is told again
        self._start()
        threading.Thread(target=self._watch, name="guard-watch", daemon=True).start()

    def _start(self) -> None:
        from .attempt import start_own
        from .reviewers.base import python_module

        read, self._write = os.pipe()  # neither inherited by an agent (PEP 446)
        try:
            argv = [*python_module("workers.guard"), str(self._state_dir), str(os.getpid())]
            self.proc = start_own([*argv, self._of] if self._of == RUN_JOB else argv, stdin=read)
            os.write(self._write, self._told)
        except BaseException:
            os.close(self._write)
            raise
        finally:
            os.close(read)

    def _watch(self) -> None:
        from orchestrator import logs

        from .attempt import exit_said, own_ended

        while True:
            ended = self.proc
            ended.wait()
            with self._lock:
                if self._leaving:
                    return
                own_ended(ended, 0)
                os.close(self._write)
                said = f"its guard (pid {ended.pid}) ended ({exit_said(ended.returncode)})"
                try:
                    self._start()
                except OSError as exc:
                    logs.get().warning(
                        "worker.unguarded",
                        reason=f"{said}, and another cannot start ({exc}): a kill of this "
                        "worker leaves its agents running until the next worker started "
                        "on this host",
                    )
                    return
            logs.get().warning(
                "worker.guard_ended", reason=f"{said}; another guards the worker now"
            )

    def tell(self, job_id: int, attempt: int, opened_at: str) -> None:
        """The attempt this run-job opened: given up by the guard if the run-job dies.
        Told inside the transaction that opens it: a kill before its commit leaves no
        such attempt, which the guard then leaves alone (its opening is not there)."""
        line = f"attempt {job_id} {attempt} {opened_at}\n".encode()
        with self._lock:
            self._told += line
            os.write(self._write, line)

    def leave(self) -> None:
        """This worker ends by itself: its guard goes, and ends nothing."""
        from .attempt import own_ended

        with self._lock:
            self._leaving = True
            with contextlib.suppress(OSError):
                os.write(self._write, LEAVING)
            os.close(self._write)
        own_ended(self.proc)


def main(argv: list[str]) -> int:
    state_dir, worker_pid = Path(argv[0]), int(argv[1])
    of = argv[2] if len(argv) > 2 else "worker"
    # Its worker's stop signals are the worker's: a unit whose KillMode signals the whole
    # cgroup (systemd's default), or a `pkill -f` of the state folder's name, ended the
    # guard (SIGINT with a traceback in the worker's journal) and left the worker, still
    # draining or running on, unguarded. It ends by its pipe alone.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    told = b""
    while chunk := os.read(0, 4096):  # until its process closes its end, as it dies
        told += chunk
    if told.endswith(LEAVING):
        return 0
    # Imported only now: a guard waits for months in a bare interpreter.
    import socket

    from orchestrator import logs

    from .attempt import end_agents_of

    if of == RUN_JOB:
        return _run_job_died(state_dir, worker_pid, told)
    groups, attempts = end_agents_of(state_dir, worker_pid)
    # Said as it happens, in the worker's own log: the next worker's start (minutes or
    # days later, if ever) is the only other word of it on this machine.
    logs.configure(state_dir, process="worker")
    logs.get().warning(
        "worker.died",
        worker=f"{socket.gethostname()}:{worker_pid}",
        process_groups=groups,
        attempts=attempts,
        reason="killed or crashed; its guard ended the agents it ran. The next worker "
        "started on this host tells the control, which runs them again (or, with "
        "none, its lease: attempt.lost)",
    )
    return 0


def _run_job_died(state_dir: Path, pid: int, told: bytes) -> int:
    """A run-job killed: its agent ended, and the attempt it had open given up, its job
    queued again, as a stopped run-job does itself. Left running, `status` and `job N`
    said the job ran for good with no control (an `enqueue` skipped its pairs), and
    only the next run-job of that job reaped the agent. No worker follows a run-job to
    take its entry up: the reap is whole here (its TMPDIR too), as the next run-job's."""
    from orchestrator import logs

    from .attempt import reap_orphans

    groups = reap_orphans(state_dir).killed
    lost, kept = [], ""
    for line in told.decode("utf-8", "replace").splitlines():
        match line.split():
            case ["attempt", job, attempt, opened] if job.isdigit() and attempt.isdigit():
                try:
                    if taken_back(state_dir, int(job), int(attempt), opened, pid):
                        lost.append([int(job), int(attempt)])
                except Exception as exc:  # noqa: BLE001 - a locked or full state.db: said
                    kept = (
                        f"its attempt {attempt} of job {job} could not be given up "
                        f"({type(exc).__name__}: {exc}): a control loses it a lease on, or "
                        "the next run-job of the job supersedes it"
                    )
    # What was done, not what might have been: killed after its attempt ended (or before
    # one opened), it left no agent and nothing to give up, and a job said "queued
    # again" was completed (C88).
    ended = "its guard ended its agent" if groups else "no agent of it was running"
    if lost:
        given = "gave its attempt up and queued the job again"
    else:
        given = kept or "it had no attempt open (none opened yet, or its attempt had ended)"
    logs.configure(state_dir, process=RUN_JOB)
    logs.get().warning(
        "run_job.died",
        pid=pid,
        process_groups=groups,
        attempts=lost,
        reason=f"killed or crashed; {ended}; {given}",
    )
    return 0


def taken_back(state_dir: Path, job_id: int, attempt: int, opened_at: str, pid: int) -> bool:
    """A killed run-job's attempt given up by its guard, its job queued again, when it is
    still that job's current attempt, opened when the run-job said (a kill before its
    commit left none, and a control may have opened one of that number since)."""
    from orchestrator.control.attempts import is_current, lose
    from orchestrator.state.store import Store

    with Store.open(state_dir) as store, store.write():
        row = store.conn.execute(
            "SELECT started_at FROM attempts WHERE job_id = ? AND attempt = ?", (job_id, attempt)
        ).fetchone()
        if row is None or row[0] != opened_at or not is_current(store, job_id, attempt):
            return False
        lose(
            store,
            job_id,
            attempt,
            f"run-job (pid {pid}) was killed or crashed; its guard ended its agent and "
            "queued the job again",
        )
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
