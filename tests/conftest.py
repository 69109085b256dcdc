"""Shared fixtures: small KBs built in tmp_path, and the CLI run in-process or as a process."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli import cli
from orchestrator.kb.gates import load_catalog
from orchestrator.kb.notes import KB
from orchestrator.state.store import ReviewRecord, Store

from . import leftovers

PROJECT = Path(__file__).resolve().parent.parent
SHARED = PROJECT.parent / "shared"
CORPUS = SHARED / "corpora" / "commonplace-kb.tar.gz"
# The host's temporary folder, read before any test points TMPDIR at a folder of its own.
HOST_TMP = Path(tempfile.gettempdir())
# Agents' TMPDIRs (workers.attempt._scratch) that appeared while a test ran, by test: in
# the process that reports (pytest-xdist's controller, whose own fixtures run no test).
AGENT_TMPDIRS_LEFT: dict[str, set[Path]] = {}
_TMPDIRS_LEFT_KEY = "agent_tmpdirs_left"
# The host's as the run began: those made outside any test's window (a module's fixture,
# set up before the test's own TMPDIR, that SIGKILLs a worker) were named by no test.
_HOST_TMPDIRS_AT_START: set[Path] = set()


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background of a script (`make test &`) has SIGINT ignored,
    # as a shell without job control leaves it for what it starts, and so had every
    # process the tests started: their Ctrl-C was ignored, and the Ctrl-C tests failed.
    # A handler, unlike an ignore, is not inherited: the tests' processes get the default.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The same of SIGHUP under `nohup make test`: the closed-terminal tests' run-job went on
    # to its timeout. The suite itself still outlives its terminal, as nohup asked.
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _hangup_outlived)
    # SIGTERM (a CI job cancelled, `timeout`, a pytest-xdist worker stopped) ended the run
    # at once, with no finalizer run: every process and namespace the tests had going was
    # left. As a Ctrl-C, the run stops and its fixtures stop what they started.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)
    os.environ[leftovers.MARK] = leftovers.RUN_MARK
    # What a run killed outright (SIGKILL, its machine's OOM killer) left, ended before
    # this one starts its own: in each process, the pytest-xdist workers' included.
    for what in leftovers.clean_after_dead_runs():
        print(f"ended, left by a test run that is gone: {what}", file=sys.stderr)
    _HOST_TMPDIRS_AT_START.update(_agent_tmpdirs(HOST_TMP))


def _hangup_outlived(signum: int, frame: object) -> None:
    """SIGHUP, ignored as `nohup` asked, by a handler: unlike an ignore, not inherited."""


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _agent_tmpdirs(folder: Path) -> set[Path]:
    # An attempt's own (run-job's), or a worker thread's kept one (workers.attempt._KEPT).
    return set(folder.glob("reviewq-job-*")) | set(folder.glob("reviewq-worker-*"))


def _not_another_runs(paths: set[Path]) -> set[Path]:
    """``paths`` but those of a worker of another run that still runs (the host's /tmp is
    shared: another checkout's suite, a person's worker), named as this run's before."""

    def others(p: Path) -> bool:
        pid = p.name.split("-")[2] if p.name.startswith("reviewq-worker-") else ""
        if not pid.isdigit():
            return False
        try:
            changed_at = p.stat().st_mtime
        except OSError:
            return False  # gone meanwhile: cannot be told, named as a gone worker's is
        return leftovers.of_another_run(int(pid), changed_at)

    return {p for p in paths if not others(p)}


@pytest.fixture(autouse=True)
def no_process_left() -> Iterator[None]:
    """Every process the test started (and what those started) is gone when it ends, also
    when it failed or was interrupted: by a mark each inherits in its environment, found
    wherever it went (a new session, a double fork), SIGKILLed after a grace of a second,
    and the test fails naming it. A failed Ctrl-C test had left its agent, which ignores
    SIGTERM and SIGINT, running for 34 minutes. (A process given an environment of its
    own carries no mark: tests/test_vendor_clis.py looks for its own by REVIEWQ_ROOT.)"""
    mark = leftovers.new_mark()
    before = os.environ.get(leftovers.MARK)
    os.environ[leftovers.MARK] = mark
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(leftovers.MARK, None)
        else:
            os.environ[leftovers.MARK] = before
    left = leftovers.end(leftovers.running_with(mark), grace=1.0)
    assert not left, f"processes the test started outlived it (now killed): {left}"


@pytest.fixture(autouse=True)
def no_stop_marks_left() -> Iterator[None]:
    """This process's stop marks clear when a test ends. A test whose Huey consumer took a
    signal (test_doorbell's SIGINT to this process) left STOP_ASKED set, and K98's check
    then abandoned every in-process attempt of a later test of that xdist worker as
    "worker stopping before its agent started": eleven of test_remote_workers' failed
    together, in the order xdist happened to give them (F120)."""
    yield
    attempt = sys.modules.get("workers.attempt")
    if attempt is not None:
        attempt.STOP_ASKED.clear()
        attempt.STOPPING.clear()


@pytest.fixture(autouse=True)
def own_tmpdir(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Path]:
    """A TMPDIR of the test's own, for what it runs in-process and every process it starts
    (workers, sweeps, run-jobs, their agents): a test that SIGKILLs a worker and starts no
    other, or whose cleanup kills one mid-attempt, leaves its agent's TMPDIR behind as any
    crash does, and one CI run left 59 in the host's /tmp. Any left, here or (by a process
    that did not keep this TMPDIR) in the host's /tmp, are named at the end of the run
    (:func:`pytest_terminal_summary`)."""
    # mkdtemp, not tmp_path_factory.mktemp: that lists the whole base folder for a free
    # number on every call, ~2-5 ms a test once it holds a run's thousands of folders.
    folder = Path(tempfile.mkdtemp(prefix="tmpdir-", dir=tmp_path_factory.getbasetemp()))
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    before = _agent_tmpdirs(HOST_TMP)
    yield folder
    attempt = sys.modules.get("workers.attempt")
    if attempt is not None:
        # Kept by the test process's own threads as a worker's (run_review in-process),
        # which no stop of a worker reaps: the next test's agents would have had them.
        for kept in list(attempt._KEPT_ALL):
            attempt._drop(kept)
        attempt._KEPT_ALL.clear()
    if new := _not_another_runs(_agent_tmpdirs(HOST_TMP) - before) | _agent_tmpdirs(folder):
        # On the test's report, not in this process's dict: a pytest-xdist test process
        # prints no summary, and its reports are what reach the one that does.
        request.node.user_properties.append((_TMPDIRS_LEFT_KEY, sorted(map(str, new))))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, paths in report.user_properties:
        if key == _TMPDIRS_LEFT_KEY:
            AGENT_TMPDIRS_LEFT.setdefault(report.nodeid, set()).update(map(Path, paths))


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's reporter
    # Said once the run ended, of those still there: the host's /tmp is shared, and an
    # agent of another run (a worker on this host, another checkout's tests) may have had
    # one there for its moment while a test ran. Not a failure, for the same reason.
    left = {
        test: sorted(str(p) for p in paths if p.exists())
        for test, paths in AGENT_TMPDIRS_LEFT.items()
    }
    named = {p for paths in left.values() for p in paths}
    unowned = sorted(map(str, _not_another_runs(_agent_tmpdirs(HOST_TMP) - _HOST_TMPDIRS_AT_START)))
    if unowned := [p for p in unowned if p not in named]:
        left["made outside any test (a module's fixture?), or by another run"] = unowned
    if left := {test: paths for test, paths in left.items() if paths}:
        terminalreporter.write_sep("=", "agents' TMPDIRs left behind", yellow=True)
        for test, paths in sorted(left.items()):
            terminalreporter.write_line(f"{test}: {', '.join(paths)}")


def spend(store: Store, job_id: int, usd: float, attempt: int = 1) -> None:
    """A first attempt of job ``job_id`` that cost ``usd`` (an invalid output): what a
    budget test spends of a sweep run's budget without running an agent. ``attempt``: a
    number of its own, for a job a real control dispatches afterwards (its attempt 1)."""
    from orchestrator.state.store import utcnow

    with store.write():
        store.conn.execute(
            "INSERT INTO attempts (job_id, attempt, outcome, started_at, ended_at, cost_usd) "
            "VALUES (?, ?, 'invalid-output', ?, ?, ?)",
            (job_id, attempt, utcnow(), utcnow(), usd),
        )


@contextlib.contextmanager
def local_clock(monkeypatch: pytest.MonkeyPatch, zone: str) -> Iterator[None]:
    """This process's local clock on ``zone`` (``TZ`` and ``time.tzset``) for the block,
    and back after it; the test skips where the zone's tzdata is not installed."""
    import time

    if not Path(f"/usr/share/zoneinfo/{zone}").exists():
        pytest.skip("no tzdata here")
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        yield
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.fixture
def new_york(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The local clock of America/New_York (daylight time ends 2026-11-01 02:00 EDT)."""
    with local_clock(monkeypatch, "America/New_York"):
        yield


def page_text(path: Path) -> str:
    """A report page's HTML without the spans `render.breakable` puts round a run of more
    than 24 characters (a path, a URL), for a test that looks for a sentence in it."""
    import re

    return re.sub(r'<span class="run">(.*?)</span>', r"\1", path.read_text(encoding="utf-8"))


def gate_text(
    gate_id: str,
    watches: list[str],
    staleness: str | None = None,
    body: str = "## Failure mode\n\nIt fails.\n\n## Test\n\nCheck it.\n",
    **extra: object,
) -> str:
    lens = gate_id.split("/")[0]
    meta: dict = {
        "gate_id": gate_id,
        "name": gate_id.split("/")[1].replace("-", " ").title(),
        "lens": lens,
        "watches": watches,
    }
    if staleness:
        meta["staleness"] = staleness
    meta.update(extra)
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n\n" + body


def note_text(body: str = "Some body text.\n", **meta: object) -> str:
    if not meta:
        return body
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n" + body


@dataclass
class KBBuilder:
    root: Path

    @property
    def state(self) -> Path:
        return self.root / ".reviewq"

    def write(self, rel: str, text: str | bytes) -> str:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
        return rel

    def note(self, name: str, body: str = "Some body text.\n", **meta: object) -> str:
        meta.setdefault("title", name.replace("-", " ").capitalize())
        meta.setdefault("description", f"About {name}.")
        return self.write(f"kb/notes/{name}.md", note_text(body, **meta))

    def gate(
        self,
        gate_id: str,
        watches: list[str],
        staleness: str | None = None,
        file: str | None = None,
        **extra: object,
    ) -> str:
        lens, name = gate_id.split("/")
        rel = f"kb/instructions/review-gates/{lens}/{file or name}.md"
        return self.write(rel, gate_text(gate_id, watches, staleness, **extra))

    def type_spec(self, name: str, body: str = "# Type\n\n## Review\n\nConforms.\n") -> str:
        return self.write(f"kb/types/{name}.md", f"---\nname: {name}\n---\n{body}")

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text(encoding="utf-8")

    def accept(self, partition: str, pairs: list[tuple[str, str]], decision: str = "PASS") -> int:
        """Record reviews for (note_path, gate_id) pairs of the KB as it is now."""
        kb = KB.open(self.root)
        cat = load_catalog(kb)
        records = []
        for note_path, gate_id in pairs:
            gate = cat.get(gate_id)
            assert gate is not None, gate_id
            records.append(
                ReviewRecord(
                    note_path,
                    self.read(note_path),
                    gate_id,
                    gate.path,
                    gate.lens,
                    gate.text,
                    decision,
                    "ok",
                )
            )
        with Store.open(self.state) as store:
            return store.record_reviews(partition, records)


@pytest.fixture
def kb(tmp_path: Path) -> KBBuilder:
    root = tmp_path / "kbroot"
    (root / "kb").mkdir(parents=True)  # a KB root holds kb/, even before its first note
    return KBBuilder(root)


@dataclass
class CLIResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        return json.loads(self.stdout)


@pytest.fixture
def run_cli(kb: KBBuilder):
    """Run ``reviewq --root KB ARGS`` in-process (fast, for option and output tests)."""

    def run(*args: str, input: str | None = None, root: Path | None = None) -> CLIResult:
        runner = CliRunner()
        res = runner.invoke(
            cli, ["--root", str(root or kb.root), *args], input=input, catch_exceptions=False
        )
        return CLIResult(res.exit_code, res.stdout, res.stderr)

    return run


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections for the whole test: bound, not listening.
    One bound and closed again is free for any process's bind(0) meanwhile: under
    pytest-xdist another test's server may take it and answer."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def libfaketime() -> Path | None:
    """libfaketime's preload library (a process on a clock of its own), None where it is
    not installed."""
    libs = sorted(Path("/usr").glob("lib*/**/faketime/libfaketime.so.1"))
    return libs[0] if libs else None


def dies_with_this_process() -> list[str]:
    """The command prefix under which a process gets a SIGTERM as this one (the test's)
    dies: for one that writes over its environment (redis-server, its title), where neither
    a test's end nor the next run finds the test's mark. Empty where setpriv is missing."""
    import shutil

    return ["setpriv", "--pdeathsig", "TERM"] if shutil.which("setpriv") else []


def bound_by_file_modes() -> list[str]:
    """The command prefix that makes a process obey file modes: as root, without the
    capabilities that pass them (CAP_DAC_OVERRIDE); skips the test if that cannot be had."""
    import shutil

    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("as root, needs setpriv to drop the capabilities that pass a mode")
    return ["setpriv", "--inh-caps=-all", "--bounding-set=-all"]


def reviewq_process(
    *args: str,
    cwd: Path | None = None,
    env: dict | None = None,
    input: str | None = None,
    timeout: float = 120,
    wrap: list[str] | None = None,
) -> subprocess.CompletedProcess:
    """Run the real ``reviewq`` console script as a process (after ``wrap``, a command
    prefix). In a session of its own, so that a run past ``timeout`` is killed with what
    it started (a sweep's control and worker) instead of leaving them behind."""
    exe = Path(sys.executable).parent / "reviewq"
    full_env = {**os.environ, **(env or {})}
    with subprocess.Popen(
        [*(wrap or []), str(exe), *args],
        cwd=cwd,
        env=full_env,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="session")
def agent_pids(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The folder where the fake agent names the processes it leaves running (FAKE_PIDS_DIR:
    a hanging agent and its child), for every process the tests start."""
    folder = tmp_path_factory.getbasetemp() / "agent-pids"
    folder.mkdir()
    os.environ["FAKE_PIDS_DIR"] = str(folder)
    yield folder
    os.environ.pop("FAKE_PIDS_DIR", None)


@pytest.fixture(autouse=True)
def no_agent_left(agent_pids: Path) -> Iterator[None]:
    """Every process a fake agent named is gone when its test ends; one still running is
    killed and the test fails naming it. (A hanging agent's child, left in the group of
    an agent nothing reaped, ran on under init for an hour after its test.)"""
    yield
    # Its environment names this session's folder: the pid was not reused by a stranger.
    ours = b"\0FAKE_PIDS_DIR=" + bytes(agent_pids) + b"\0"
    left = {}
    for entry in os.scandir(agent_pids):
        os.unlink(entry.path)
        pid = int(entry.name)
        with contextlib.suppress(OSError):  # gone, or a zombie (ESRCH): ended
            if ours in b"\0" + Path(f"/proc/{pid}/environ").read_bytes():
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                left[pid] = f"{pid} {cmdline.decode(errors='replace').strip()}"
    running = [pid for pid in left if not ends_within(pid, 1.0)]
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not running, f"a fake agent's processes outlived the test: {[left[p] for p in running]}"


def ready_within(fd: object, seconds: float, events: int = select.POLLIN) -> bool:
    """``fd`` (a descriptor or anything with fileno()) is readable, or ``events``, or hung
    up or failed, within ``seconds``: what select() said of it. poll, not select():
    select() refuses a descriptor past 1023, which the suite's one process reaches."""
    poller = select.poll()
    poller.register(fd, events)
    return bool(poller.poll(max(0.0, seconds) * 1000))


def ends_within(pid: int, seconds: float) -> bool:
    """The process ends (or is a zombie) within ``seconds``: one killed a moment ago."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(seconds * 1000)) or process_gone(pid)
    finally:
        os.close(fd)


@pytest.fixture(scope="session")
def commonplace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not CORPUS.exists():
        pytest.skip(f"commonplace corpus not found at {CORPUS}")
    import tarfile

    dest = tmp_path_factory.mktemp("commonplace")
    with tarfile.open(CORPUS) as tar:
        tar.extractall(dest, filter="data")
    return dest


def stop(proc: subprocess.Popen) -> None:
    """A control or worker a test started, stopped as an operator's Ctrl-C stops it."""
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)


def process_gone(pid: int) -> bool:
    """Dead: no such process, or a zombie waiting for init to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")
