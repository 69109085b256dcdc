"""A kill harness for reviewq (CONTRACT §6, §12): a KB in a temp folder, a real ``reviewq
control`` and real ``reviewq worker`` processes, the fake agent as a ``command`` reviewer,
SIGKILLs at random moments, and checks read straight from state.db and the log.

Used by ``tests/fault/test_kills.py`` (a short campaign in CI), ``tests/fault/test_outages.py``
(the cluster and Redis helpers) and ``scripts/kill_campaign.py`` (the long campaign). It
imports nothing from pytest: the script runs it on its own.

Synchronisation is by events, never by sleeping and looking: a process is "up" when it
logs its ``*.started`` line on stderr, an agent "runs" when it writes to a FIFO, and the
end of the work is awaited with ``reviewq sweep --workers 0``, which returns when every
job is terminal. The only timed waits are the scenario's own (the gaps between kills, the
length of an outage).
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import random
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
FAKE_AGENT = PROJECT / "tests" / "agents" / "fake_agent.py"
PARTITION = "fake"
TERMINAL = ("completed", "failed", "split")
WATCHES = (["title"], ["description"], ["body"], ["title", "body"])
LOCKED = "database is locked"
# A campaign with fixes: a review PASSes a note holding this line, FAILs it otherwise, and
# the fixer appends it; half the notes are written with it (their reviews PASS).
FIX_LINE = "Fixed by the fake fixer."


# --- the KB and its configuration -------------------------------------------------------------


def build_kb(root: Path, notes: int, gates: int, fix: bool = False) -> list[tuple[str, str]]:
    """``notes`` notes and ``gates`` gates, each gate in a lens of its own, so that
    ``--grouping note`` packs one pair per job; with ``fix``, every other note holds
    :data:`FIX_LINE`. Returns every (note_path, gate_id)."""
    gate_ids = []
    for g in range(gates):
        lens, name = f"lens{g}", f"check{g}"
        gate_id = f"{lens}/{name}"
        watches = json.dumps(WATCHES[g % len(WATCHES)])
        path = root / "kb" / "instructions" / "review-gates" / lens / f"{name}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f"---\ngate_id: {gate_id}\nname: Check {g}\nlens: {lens}\nwatches: {watches}\n---\n\n"
            f"## Failure mode\n\nThe note fails check {g}.\n\n## Test\n\nDoes it pass check {g}?\n",
            encoding="utf-8",
        )
        gate_ids.append(gate_id)
    note_paths = []
    for n in range(notes):
        rel = f"kb/notes/note-{n:04d}.md"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f"---\ntitle: Note {n}\ndescription: What note {n} says.\n---\n\n"
            f"# Note {n}\n\nThe body of note {n}, long enough to review.\n"
            + (f"{FIX_LINE}\n" if fix and n % 2 else ""),
            encoding="utf-8",
        )
        note_paths.append(rel)
    return [(n, g) for n in note_paths for g in gate_ids]


def write_config(
    root: Path,
    *,
    queue_url: str = "",
    fake_sleep: float = 0.3,
    fake_env: dict[str, str] | None = None,
    timeout: str = "10s",
    concurrency: int = 4,
    lease_seconds: float = 2,
    reaper_seconds: float = 0.5,
    poll_seconds: float = 0.02,
    launch_backoff_seconds: float = 0.05,
    max_attempts: int = 3,
) -> Path:
    """reviewq.toml: the fake agent as a ``command`` reviewer in ``slow`` mode (a random
    time up to ``fake_sleep``) and fast queue settings."""
    env = {"FAKE_MODE": "slow", "FAKE_SLEEP": str(fake_sleep), **(fake_env or {})}
    env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    text = (
        "[reviewers.fake]\n"
        'kind = "command"\n'
        f"command = {json.dumps([sys.executable, str(FAKE_AGENT)])}\n"
        f'partition = "{PARTITION}"\n'
        f'timeout = "{timeout}"\n'
        f"concurrency = {concurrency}\n"
        f"env = {{ {env_toml} }}\n\n"
        "[queue]\n"
        f"lease_seconds = {lease_seconds}\n"
        f"reaper_seconds = {reaper_seconds}\n"
        f"poll_seconds = {poll_seconds}\n"
        f"launch_backoff_seconds = {launch_backoff_seconds}\n"
        f"max_attempts = {max_attempts}\n"
    )
    if queue_url:
        text += f"url = {json.dumps(queue_url)}\n"
    path = root / "reviewq.toml"
    path.write_text(text, encoding="utf-8")
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without reviewq's and the fake agent's variables (a
    leftover REVIEWQ_ROOT would make the orphan scan see reviewq itself), JSON logs."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("REVIEWQ_", "FAKE_")) and k != "PYTEST_CURRENT_TEST"
    }
    env["REVIEWQ_LOG_FORMAT"] = "json"
    env.update(extra)
    return env


# --- processes --------------------------------------------------------------------------------


class Proc:
    """A long-running reviewq process in a session of its own (so a SIGKILL of its group
    takes it and nothing else of ours). Its stderr is copied to a file by a thread that
    sets ``ready`` when the process logs ``marker``: the way to await "it is up"."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path, marker: str):
        self.name = name
        self.ready = threading.Event()
        self.marker = marker.encode()
        self.popen = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        self._log = log
        self._pump = threading.Thread(target=self._copy, name=f"pump-{name}", daemon=True)
        self._pump.start()

    def _copy(self) -> None:
        assert self.popen.stderr is not None
        with open(self._log, "ab") as out:
            for line in self.popen.stderr:
                out.write(line)
                out.flush()
                if not self.ready.is_set() and self.marker in line:
                    self.ready.set()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def await_ready(self, timeout: float = 60) -> None:
        if not self.ready.wait(timeout):
            code = self.popen.poll()
            raise RuntimeError(
                f"{self.name} (pid {self.pid}) did not log {self.marker.decode()!r} within "
                f"{timeout:g} s (exit code {code}); see {self._log}"
            )

    def kill(self) -> None:
        """SIGKILL the process's group and reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait()
        self._pump.join(timeout=10)

    def stop(self, timeout: float = 60) -> int | None:
        """SIGINT (graceful), then SIGKILL if it does not end within ``timeout``."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._pump.join(timeout=10)
        return self.popen.returncode


class Cluster:
    """One KB root with its control process and worker processes."""

    def __init__(
        self, root: Path, *, workers: int = 2, threads: int = 2, env: dict | None = None
    ) -> None:
        self.root = root
        self.state = root / ".reviewq"
        self.logs = root / "proc-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        # A campaign ends its last workers as a crash does, with agents' TMPDIRs nobody
        # reaps: they go with the root, not into the host's /tmp.
        (root / "tmp").mkdir(exist_ok=True)
        self.env = clean_env(TMPDIR=str(root / "tmp"), **(env or {}))
        self.n_workers = workers
        self.threads = threads
        self.procs: dict[str, Proc] = {}
        self.starts: Counter[str] = Counter()
        config = root / "reviewq.toml"
        # On Redis each worker gets a state folder of its own, as on a machine of its own;
        # SQLite queues live in the control's folder, whose worker/ the local workers share.
        self.redis = config.exists() and "\nurl = " in config.read_text(encoding="utf-8")

    @property
    def base(self) -> list[str]:
        return [sys.executable, "-m", "orchestrator", "--root", str(self.root)]

    def rq(self, *args: str, timeout: float = 300, env: dict | None = None):
        """Run one ``reviewq`` command as a process."""
        return subprocess.run(
            [*self.base, *args],
            env={**self.env, **(env or {})},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def _spawn(self, name: str, env: dict | None = None) -> Proc:
        self.starts[name] += 1
        if name == "control":
            argv, marker = [*self.base, "control"], "control.started"
        else:
            private = ["--state", str(self.root / "workers" / name)] if self.redis else []
            argv = [*self.base, *private, "worker", "--workers", str(self.threads)]
            # --kb: agents see the KB, so a reviewer's edit is caught and the orphan scan
            # finds them by REVIEWQ_ROOT.
            argv, marker = [*argv, "--kb", str(self.root)], "worker.started"
        log = self.logs / f"{name}.{self.starts[name]}.stderr"
        proc = Proc(name, argv, {**self.env, **(env or {})}, log, marker)
        self.procs[name] = proc
        return proc

    def worker_names(self) -> list[str]:
        return [f"worker-{i}" for i in range(self.n_workers)]

    def start(self, wait: bool = True, control_env: dict | None = None) -> None:
        self._spawn("control", control_env)
        for name in self.worker_names():
            self._spawn(name)
        if wait:
            for p in self.procs.values():
                p.await_ready()

    def kill(self, name: str) -> dict:
        """SIGKILL one process; returns what it left behind (its agents, now orphans)."""
        proc = self.procs[name]
        agents = [a for a in agent_processes(self.root) if a.ppid == proc.pid]
        proc.kill()
        return {"target": name, "pid": proc.pid, "agents": [a.pid for a in agents]}

    def restart(self, name: str, env: dict | None = None) -> Proc:
        old = self.procs.get(name)
        if old is not None and old.alive():
            raise RuntimeError(f"{name} still runs")
        return self._spawn(name, env)

    def stop(self, names: list[str] | None = None, timeout: float = 60) -> dict[str, int | None]:
        """Stop processes gracefully (workers first, so their outcomes reach control)."""
        order = names or [*self.worker_names(), "control"]
        return {n: self.procs[n].stop(timeout) for n in order if n in self.procs}

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.alive():
                p.kill()

    def sweep(self, *selectors: str, timeout: float = 300, background: bool = False):
        """``reviewq sweep SELECTORS --workers 0``: it enqueues, then uses the running control
        and workers and returns when every job (older ones included) is terminal."""
        argv = [*self.base, "sweep", *selectors, "--reviewer", "fake", "--workers", "0", "--json"]
        if background:
            return subprocess.Popen(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        return self.rq(*argv[len(self.base) :], timeout=timeout)

    def drain(self, timeout: float = 300):
        """Await the drain without enqueueing anything: ``sweep type`` selects the virtual
        type lens (no note here has a type) and waits for every job still open."""
        return self.sweep("type", timeout=timeout)

    def final_sweep(self, timeout: float = 600):
        """Await the drain (nothing new is expected to be enqueued); (result, seconds)."""
        t0 = time.monotonic()
        res = self.sweep("--all-gates", timeout=timeout)
        return res, time.monotonic() - t0


# --- agents and orphans ----------------------------------------------------------------------


@dataclass(frozen=True)
class AgentProc:
    pid: int
    ppid: int
    pgid: int
    state: str
    job_id: str
    attempt: str


def _stat(pid: int) -> tuple[str, int, int] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = stat.rsplit(")", 1)[1].split()
    return rest[0], int(rest[1]), int(rest[2])  # state, ppid, pgrp


def agent_processes(root: Path) -> list[AgentProc]:
    """Processes whose environment holds this KB's REVIEWQ_ROOT: agents (reviewq passes
    REVIEWQ_ROOT to the agents it launches; our own reviewq processes run without it)."""
    needle = f"REVIEWQ_ROOT={root}".encode()
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle not in environ:
            continue
        st = _stat(pid)
        if st is None:
            continue
        state, ppid, pgid = st
        if state in ("Z", "X"):
            continue
        env = dict(e.split(b"=", 1) for e in environ if b"=" in e)
        found.append(
            AgentProc(
                pid,
                ppid,
                pgid,
                state,
                env.get(b"REVIEWQ_JOB_ID", b"?").decode(),
                env.get(b"REVIEWQ_ATTEMPT", b"?").decode(),
            )
        )
    return found


def kill_agents(agents: list[AgentProc]) -> None:
    """Clean-up after the count: the agents found are ours (our workers started them)."""
    for a in agents:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(a.pgid, signal.SIGKILL)


# --- awaiting agents through a FIFO -----------------------------------------------------------


class StartFifo:
    """A FIFO the fake agent writes "pid ppid attempt" to when it starts (FAKE_NOTIFY_FIFO).

    It stays open for reading for its whole life, and this process holds a writer too, so
    an agent never blocks on it and ``select`` never sees a spurious end of file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self.rfd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.wfd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        self.buf = b""
        self.lines: list[str] = []

    def await_starts(self, n: int, timeout: float = 120) -> list[str]:
        """Block until ``n`` agents in all have started; returns their lines."""
        deadline = time.monotonic() + timeout
        while len(self.lines) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"only {len(self.lines)} of {n} agents started in {timeout:g} s")
            # poll, not select(): select() refuses a descriptor past 1023.
            poller = select.poll()
            poller.register(self.rfd, select.POLLIN)
            if poller.poll(remaining * 1000):
                self.buf += os.read(self.rfd, 65536)
                *done, self.buf = self.buf.split(b"\n")
                self.lines.extend(d.decode() for d in done)
        return self.lines[:n]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.wfd)
        with contextlib.suppress(OSError):
            os.close(self.rfd)


class ContinueGate:
    """FAKE_CONTINUE_FIFO: an agent that reaches it waits until the test lets it go, so
    the test can change the world (fill a disk) while the agent is known to be waiting."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self._open = threading.Event()
        self._thread: threading.Thread | None = None

    def open_gate(self) -> None:
        """From now on let every agent through as it arrives."""

        def loop() -> None:
            while not self._open.is_set():
                os.close(os.open(self.path, os.O_WRONLY))

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._open.set()
        if self._thread is not None:  # unblock its pending open with a reader of our own
            with contextlib.suppress(OSError):
                os.close(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK))
            self._thread.join(timeout=5)


# --- a small disk -----------------------------------------------------------------------------


class SmallDisk:
    """A tmpfs of ``size`` mounted over an existing folder, its contents copied in: the
    folder's own disk, which the test can fill. Needs the right to mount (root)."""

    def __init__(self, folder: Path, size: str = "1m", inodes: int | None = None) -> None:
        self.folder = folder
        self.size = size
        self.inodes = inodes  # tmpfs' nr_inodes: a disk that runs out of files, not bytes
        self.mounted = False

    def mount(self) -> None:
        aside = Path(tempfile.mkdtemp(prefix="smalldisk-"))
        shutil.copytree(self.folder, aside / "c")
        try:
            res = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", self._options(), "tmpfs", str(self.folder)],
                capture_output=True,
                text=True,
            )
        except FileNotFoundError:
            shutil.rmtree(aside, ignore_errors=True)
            raise PermissionError("cannot mount a tmpfs: no mount command") from None
        if res.returncode != 0:
            shutil.rmtree(aside, ignore_errors=True)
            raise PermissionError(f"cannot mount a tmpfs: {res.stderr.strip()}")
        self.mounted = True
        shutil.copytree(aside / "c", self.folder, dirs_exist_ok=True)
        shutil.rmtree(aside, ignore_errors=True)

    def _options(self) -> str:
        return f"size={self.size}" + (f",nr_inodes={self.inodes}" if self.inodes else "")

    def fill_inodes(self) -> Path:
        """Take every inode left with empty files, its bytes left free."""
        fillers = self.folder / ".fillers"
        with contextlib.suppress(FileExistsError):
            fillers.mkdir()
        for n in range(self.inodes or 0):
            try:
                (fillers / str(n)).touch()
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return fillers
        raise AssertionError(f"{self.folder} took more files than its nr_inodes")

    def free_bytes(self) -> int:
        st = os.statvfs(self.folder)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int = 0) -> Path:
        """Fill the disk, leaving ``leave`` bytes (whole pages) free."""
        filler = self.folder / ".filler"
        try:
            with open(filler, "ab") as f:
                f.write(b"\0" * (self.free_bytes() - leave))
        except OSError as exc:
            # A process beside it wrote meanwhile: with nothing to leave, full is the aim.
            if leave or exc.errno != errno.ENOSPC:
                raise
        return filler

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.folder)], capture_output=True)
            self.mounted = False


# --- Redis --------------------------------------------------------------------------------------


class RedisServer:
    """redis-server on a unix socket. ``persist``: an append-only file fsynced on every
    write, so a restart keeps the queue; without it a restart loses every message.
    ``options``: more of redis-server's own (``--maxmemory``, ``--maxmemory-policy``)."""

    def __init__(
        self, sock: Path, workdir: Path, persist: bool = False, options: tuple[str, ...] = ()
    ) -> None:
        self.sock = sock
        self.workdir = workdir
        self.persist = persist
        self.options = options
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    def start(self, timeout: float = 30) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed")
        durability = (
            ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
            if self.persist
            else ["--appendonly", "no", "--save", ""]
        )
        self.starts += 1
        log = open(self.workdir / f"redis.{self.starts}.log", "wb")  # noqa: SIM115 - the thread closes it
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                "0",
                "--unixsocket",
                str(self.sock),
                "--dir",
                str(self.workdir),
                *durability,
                *self.options,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        ready = threading.Event()
        proc = self.proc

        def pump() -> None:
            assert proc.stdout is not None
            with log:
                for line in proc.stdout:
                    log.write(line)
                    log.flush()
                    if b"ready to accept connections" in line.lower():
                        ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout):  # the server's own "ready" line, not a timer
            raise RuntimeError(f"redis-server did not become ready; see {log.name}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


# --- checks ---------------------------------------------------------------------------------


def state_db(root: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{root / '.reviewq' / 'state.db'}?mode=ro", uri=True, timeout=30)
    conn.row_factory = sqlite3.Row
    return conn


def open_jobs(root: Path) -> int:
    try:
        with contextlib.closing(state_db(root)) as conn:
            return conn.execute(
                "SELECT count(*) FROM review_jobs WHERE status IN ('queued', 'running')"
            ).fetchone()[0]
    except sqlite3.Error:
        return -1


def log_paths(state: Path) -> list[Path]:
    """The control's log and the workers' (each keeps to a folder of its own: STATE/worker/
    for local workers on SQLite, ROOT/workers/NAME/ on Redis)."""
    paths = [state / "logs" / "reviewq.jsonl", state / "worker" / "logs" / "reviewq.jsonl"]
    paths += sorted((state.parent / "workers").glob("*/logs/reviewq.jsonl"))
    return [p for p in paths if p.exists()]


def read_log(state: Path) -> tuple[list[dict], list[str]]:
    """Every line of the logs of ``log_paths`` parsed; the lines that are not JSON apart."""
    good, bad = [], []
    lines = []
    for path in log_paths(state):
        lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            bad.append(line[:300])
            continue
        if not isinstance(rec, dict) or not {"timestamp", "level", "event"} <= rec.keys():
            bad.append(line[:300])
        else:
            good.append(rec)
    return good, bad


def locked_mentions(root: Path) -> list[str]:
    """Files under the root that mention 'database is locked' (log, stderr copies)."""
    hits = []
    for path in [root / ".reviewq" / "logs", root / "proc-logs"]:
        if not path.is_dir():
            continue
        for f in sorted(path.iterdir()):
            if f.is_file() and LOCKED in f.read_text(encoding="utf-8", errors="replace"):
                hits.append(str(f.relative_to(root)))
    return hits


@dataclass
class Check:
    """What a campaign (or an outage) left behind, read from state.db and the log."""

    jobs: int = 0
    job_status: dict[str, int] = field(default_factory=dict)
    pairs: int = 0
    accepted: int = 0
    escalated: int = 0
    losses: list[tuple[str, str]] = field(default_factory=list)
    duplicates: list[tuple[str, str, int]] = field(default_factory=list)
    reacceptances: int = 0  # acceptance rows written more than once (counter - rows)
    without_evidence: list[tuple[str, str]] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    multi_finalized: list[int] = field(default_factory=list)
    not_terminal: list[tuple[int, str]] = field(default_factory=list)
    log_lines: int = 0
    bad_log_lines: list[str] = field(default_factory=list)
    error_events: dict[str, int] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    locked: list[str] = field(default_factory=list)
    stale_job_files: list[int] = field(default_factory=list)  # MANIFEST/results behind the DB

    @property
    def other_duplicates(self) -> int:
        """Pairs accepted more than once, and acceptance rows written more than once."""
        return len(self.duplicates) + self.reacceptances

    def violations(self) -> list[str]:
        v = []
        if self.not_terminal:
            v.append(f"{len(self.not_terminal)} job(s) not terminal: {self.not_terminal[:5]}")
        if self.losses:
            v.append(
                f"{len(self.losses)} pair(s) neither accepted nor escalated: {self.losses[:5]}"
            )
        if self.other_duplicates:
            v.append(
                f"{len(self.duplicates)} pair(s) accepted more than once: {self.duplicates[:5]}; "
                f"acceptance rows rewritten {self.reacceptances} time(s)"
            )
        if self.without_evidence:
            v.append(
                f"{len(self.without_evidence)} acceptance row(s) without a decided pair of a "
                f"completed job: {self.without_evidence[:5]}"
            )
        if self.multi_finalized:
            v.append(f"jobs with more than one finalized attempt: {self.multi_finalized[:5]}")
        if self.bad_log_lines:
            v.append(f"{len(self.bad_log_lines)} log line(s) not JSON: {self.bad_log_lines[:2]}")
        if self.locked:
            v.append(f"'{LOCKED}' in {', '.join(self.locked)}")
        return v


def stale_job_files(root: Path, conn: sqlite3.Connection) -> list[int]:
    """Terminal jobs whose MANIFEST.json or result files do not say what state.db says
    (the files are written after the commit, so a kill in between leaves them behind)."""
    stale = []
    for job in conn.execute(
        f"SELECT id, status, job_dir FROM review_jobs WHERE status IN {TERMINAL!r} ORDER BY id"
    ).fetchall():
        folder = root / ".reviewq" / job["job_dir"]
        try:
            manifest = json.loads((folder / "MANIFEST.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            stale.append(job["id"])
            continue
        decided = conn.execute(
            "SELECT note_path, gate_id, decision FROM review_pairs WHERE job_id = ? AND "
            "decision IS NOT NULL",
            (job["id"],),
        ).fetchall()
        in_manifest = {(p["note_path"], p["gate_id"]): p.get("decision") for p in manifest["pairs"]}
        if manifest.get("status") != job["status"] or any(
            in_manifest.get((d[0], d[1])) != d[2] for d in decided
        ):
            stale.append(job["id"])
            continue
        results = folder / "results"
        if decided and (not results.is_dir() or len(list(results.iterdir())) != len(decided)):
            stale.append(job["id"])
    return stale


def check(root: Path, expected: list[tuple[str, str]], partition: str = PARTITION) -> Check:
    c = Check()
    with contextlib.closing(state_db(root)) as conn:
        c.job_status = dict(
            conn.execute("SELECT status, count(*) FROM review_jobs GROUP BY status").fetchall()
        )
        c.jobs = sum(c.job_status.values())
        c.not_terminal = [
            tuple(r)
            for r in conn.execute(
                f"SELECT id, status FROM review_jobs WHERE status NOT IN {TERMINAL!r} ORDER BY id"
            )
        ]
        c.pairs = conn.execute(
            "SELECT count(*) FROM review_pairs p JOIN review_jobs j ON j.id = p.job_id "
            "WHERE j.kind = 'review'"
        ).fetchone()[0]
        accepted = {
            (r[0], r[1])
            for r in conn.execute(
                "SELECT note_path, gate_id FROM acceptance WHERE model_partition = ?", (partition,)
            )
        }
        escalated = {
            (r[0], r[1])
            for r in conn.execute(
                "SELECT note_path, gate_id FROM escalations WHERE model_partition = ?", (partition,)
            )
        }
        c.accepted, c.escalated = len(accepted), len(escalated)
        c.losses = sorted(set(expected) - accepted - escalated)
        # Accepted exactly once: one decided pair of a completed review job per (note, gate)
        # and text of the note (a fix's re-review decides the pair again, of the new text)...
        c.duplicates = [
            (r[0], r[1], r[2])
            for r in conn.execute(
                "SELECT p.note_path, p.gate_id, count(*) FROM review_pairs p JOIN review_jobs j "
                "ON j.id = p.job_id WHERE j.kind = 'review' AND j.status = 'completed' AND "
                "j.model_partition = ? AND p.decision IS NOT NULL "
                "GROUP BY p.note_path, p.gate_id, p.note_snapshot_id HAVING count(*) > 1",
                (partition,),
            )
        ]
        # ...and no acceptance row written twice: every insert or update bumps the counter,
        # once for each such decision.
        version = conn.execute(
            "SELECT value FROM counters WHERE name = 'acceptance_version'"
        ).fetchone()[0]
        decided = conn.execute(
            "SELECT count(*) FROM review_pairs p JOIN review_jobs j ON j.id = p.job_id "
            "WHERE j.kind = 'review' AND j.status = 'completed' AND j.model_partition = ? "
            "AND p.decision IS NOT NULL",
            (partition,),
        ).fetchone()[0]
        rows = conn.execute("SELECT count(*) FROM acceptance").fetchone()[0]
        # (fewer writes than decisions is no rewrite: the losses say what went unaccepted)
        c.reacceptances = max(0, version - max(rows, decided))
        c.without_evidence = [
            (r[0], r[1])
            for r in conn.execute(
                "SELECT a.note_path, a.gate_id FROM acceptance a "
                "LEFT JOIN review_pairs p ON p.id = a.review_pair_id "
                "LEFT JOIN review_jobs j ON j.id = p.job_id "
                "WHERE a.source = 'review' AND (p.id IS NULL OR j.status IS NOT 'completed' "
                "OR p.decision IS NULL OR p.decision != a.decision OR p.note_path != a.note_path "
                "OR p.gate_id != a.gate_id OR p.note_snapshot_id != a.note_snapshot_id)"
            )
        ]
        c.attempts = dict(
            conn.execute("SELECT outcome, count(*) FROM attempts GROUP BY outcome").fetchall()
        )
        c.multi_finalized = [
            r[0]
            for r in conn.execute(
                "SELECT job_id FROM attempts WHERE outcome = 'finalized' GROUP BY job_id "
                "HAVING count(*) > 1"
            )
        ]
        c.stale_job_files = stale_job_files(root, conn)
    events, bad = read_log(root / ".reviewq")
    c.log_lines = len(events) + len(bad)
    c.bad_log_lines = bad
    c.events = dict(Counter(e["event"] for e in events))
    c.error_events = dict(
        Counter(e["event"] for e in events if e.get("level") in ("error", "critical"))
    )
    c.locked = locked_mentions(root)
    return c


def fixes_miswritten(root: Path, notes: set[str]) -> list[str]:
    """The notes whose :data:`FIX_LINE` count is not the number of fixes written to them
    (fix_writes, one row a write): a fix applied twice, or one recorded and not written."""
    with contextlib.closing(state_db(root)) as conn:
        written = Counter(r[0] for r in conn.execute("SELECT path FROM fix_writes"))
    built = {n for n in notes if int(n.rsplit("-", 1)[1].removesuffix(".md")) % 2}
    return sorted(
        n
        for n in notes
        if (root / n).read_text(encoding="utf-8").count(FIX_LINE) != written[n] + (n in built)
    )


# --- the kill campaign --------------------------------------------------------------------------


@dataclass
class CampaignConfig:
    seed: int = 1
    jobs: int = 200
    gates: int = 4
    kills: int = 10
    workers: int = 2  # worker processes
    threads: int = 2  # ``--workers`` of each
    fake_sleep: float = 0.3
    gap: tuple[float, float] = (0.2, 1.5)
    control_weight: float = 1 / 3  # the chance a kill hits the control process
    drain_timeout: float = 600
    queue_url: str = ""
    fix: bool = False  # enqueue with --fix: half the notes FAIL, are fixed and re-reviewed


@dataclass
class CampaignResult:
    config: CampaignConfig
    root: Path
    enqueued_jobs: int = 0
    kills: list[dict] = field(default_factory=list)
    sweep_code: int | None = None
    sweep_new_jobs: int | None = None
    sweep_stderr: str = ""
    drain_s: float = 0.0
    wall_s: float = 0.0
    orphans_left: list[AgentProc] = field(default_factory=list)
    orphans_reaped: int = 0
    stop_codes: dict[str, int | None] = field(default_factory=dict)
    check: Check = field(default_factory=Check)
    error: str = ""
    fixes_miswritten: list[str] = field(default_factory=list)  # (fixes_miswritten)

    @property
    def kills_control(self) -> int:
        return sum(1 for k in self.kills if k["target"] == "control")

    @property
    def kills_worker(self) -> int:
        return sum(1 for k in self.kills if k["target"] != "control")

    @property
    def kills_with_work_open(self) -> int:
        return sum(1 for k in self.kills if k["open_jobs"] > 0)

    @property
    def orphaned_at_kill(self) -> int:
        return sum(len(k["agents"]) for k in self.kills)

    @property
    def lost_attempts(self) -> int:
        return self.check.attempts.get("lost", 0)

    @property
    def superseded_attempts(self) -> int:
        return self.check.attempts.get("superseded", 0)

    def violations(self) -> list[str]:
        """Everything that broke."""
        v = []
        if self.error:
            v.append(self.error)
        if self.sweep_code != 0:
            v.append(
                f"the final sweep exited {self.sweep_code}: {self.sweep_stderr.strip()[-500:]}"
            )
        # With fixes, a fix's write can leave a pair its re-review did not cover stale (a
        # gate watching the whole body): the drain's sweep reviews it, as a night's would.
        if self.sweep_new_jobs and not self.config.fix:
            v.append(f"the final sweep enqueued {self.sweep_new_jobs} new job(s); 0 expected")
        if self.fixes_miswritten:
            v.append(
                f"{len(self.fixes_miswritten)} note(s) whose fixes were not each written once: "
                f"{self.fixes_miswritten[:5]}"
            )
        if self.orphans_left:
            v.append(
                f"{len(self.orphans_left)} agent process(es) left running: "
                + ", ".join(
                    f"pid {a.pid} (job {a.job_id} attempt {a.attempt})"
                    for a in self.orphans_left[:5]
                )
            )
        return v + self.check.violations()

    def row(self) -> dict:
        c = self.check
        return {
            "seed": self.config.seed,
            "jobs": c.jobs,
            "pairs": c.pairs,
            "kills": len(self.kills),
            "k_ctl": self.kills_control,
            "k_wrk": self.kills_worker,
            "k_open": self.kills_with_work_open,
            "accepted": c.accepted,
            "escal": c.escalated,
            "losses": len(c.losses),
            "dups": c.other_duplicates,
            "no_evid": len(c.without_evidence),
            "lost_att": self.lost_attempts,
            "supers": self.superseded_attempts,
            "attempts": sum(c.attempts.values()),
            "orph_kill": self.orphaned_at_kill,
            "orph_reap": self.orphans_reaped,
            "orph_left": len(self.orphans_left),
            "bad_log": len(c.bad_log_lines),
            "locked": len(c.locked),
            "stale_files": len(c.stale_job_files),
            "drain_s": round(self.drain_s, 1),
            "wall_s": round(self.wall_s, 1),
            "ok": not self.violations(),
        }


def run_campaign(cfg: CampaignConfig, workdir: Path | None = None, log=print) -> CampaignResult:
    """One seed: build, start, enqueue, kill K times at random moments (restarting each
    killed process at once), drain with a sweep, stop, check."""
    rng = random.Random(cfg.seed)
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix=f"kills-{cfg.seed}-", dir=workdir)).resolve()
    res = CampaignResult(cfg, root)
    notes = math.ceil(cfg.jobs / cfg.gates)
    expected = build_kb(root, notes, cfg.gates, cfg.fix)
    fixing = {"FAKE_PASS_IF_CONTAINS": FIX_LINE, "FAKE_FIX_APPEND": FIX_LINE} if cfg.fix else None
    write_config(root, queue_url=cfg.queue_url, fake_sleep=cfg.fake_sleep, fake_env=fixing)
    cluster = Cluster(root, workers=cfg.workers, threads=cfg.threads)
    targets = ["control", *cluster.worker_names()]
    try:
        cluster.start()
        fix = ["--fix"] if cfg.fix else []
        enq = cluster.rq("enqueue", "--all-gates", "--reviewer", "fake", *fix, "--json")
        if enq.returncode != 0:
            raise RuntimeError(f"enqueue failed: {enq.stderr.strip()[-500:]}")
        res.enqueued_jobs = len(json.loads(enq.stdout)["jobs"])
        for _ in range(cfg.kills):
            time.sleep(rng.uniform(*cfg.gap))  # a random moment: the scenario, not a sync
            if rng.random() < cfg.control_weight:
                target = "control"
            else:
                target = rng.choice(targets[1:])
            opened = open_jobs(root)
            kill = cluster.kill(target)
            kill["open_jobs"] = opened
            kill["at_s"] = round(time.monotonic() - t0, 2)
            cluster.restart(target)  # right away
            res.kills.append(kill)
        # The sweep must find *our* control running, or it would start its own.
        cluster.procs["control"].await_ready()
        sweep, res.drain_s = cluster.final_sweep(cfg.drain_timeout)
        res.sweep_code, res.sweep_stderr = sweep.returncode, sweep.stderr
        with contextlib.suppress(ValueError):
            res.sweep_new_jobs = json.loads(sweep.stdout)["enqueued_jobs"]
        res.stop_codes = cluster.stop()
    except Exception as exc:  # a broken run is a violation with its reason, not a crash
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        cluster.kill_all()
    # Everything of ours has stopped: any agent process of this KB still running is a leak.
    res.orphans_left = agent_processes(root)
    kill_agents(res.orphans_left)
    res.check = check(root, expected)
    res.fixes_miswritten = fixes_miswritten(root, {n for n, _ in expected}) if cfg.fix else []
    events, _ = read_log(root / ".reviewq")
    res.orphans_reaped = sum(
        len(e.get("process_groups") or []) for e in events if e["event"] == "worker.reaped_orphans"
    )
    res.wall_s = time.monotonic() - t0
    return res


COLUMNS = [
    "seed",
    "jobs",
    "pairs",
    "kills",
    "k_ctl",
    "k_wrk",
    "k_open",
    "accepted",
    "escal",
    "losses",
    "dups",
    "no_evid",
    "lost_att",
    "supers",
    "attempts",
    "orph_kill",
    "orph_reap",
    "orph_left",
    "bad_log",
    "locked",
    "stale_files",
    "drain_s",
    "wall_s",
    "ok",
]


def format_row(row: dict) -> str:
    return "| " + " | ".join(str(row[c]) for c in COLUMNS) + " |"


def header() -> str:
    return "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)


def total_row(rows: list[dict]) -> dict:
    out: dict = {"seed": "total"}
    for c in COLUMNS[1:]:
        if c == "ok":
            out[c] = all(r["ok"] for r in rows)
        else:
            out[c] = round(sum(r[c] for r in rows), 1)
    return out
