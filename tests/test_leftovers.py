"""What a failed or interrupted test run leaves on the machine: nothing. Each test runs a
small test file of its own in a pytest of its own, with the suite's conftest (the
fixtures that end what a test started), fails it or stops it as CI and a person do, and
looks for what it started."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import libfaketime
from .leftovers import SHM, remove_cgroup
from .test_queue_integration import await_fifo, make_fifo

PROJECT = Path(__file__).resolve().parent.parent
# Ignores SIGTERM and SIGINT, as the Ctrl-C tests' stubborn agent does; an hour long.
# Says "ready" on its stdout once it runs its own code: its command line is readable in
# /proc from then on (a parent's Popen returns as the exec begins, before it is).
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "signal.signal(signal.SIGINT, signal.SIG_IGN); print('ready', flush=True); time.sleep(3600)"
)


def _inner_file(folder: Path, body: str) -> Path:
    test = folder / "test_inner.py"
    test.write_text(
        "import subprocess, sys, time\n"
        f"STUBBORN = {STUBBORN!r}\n"
        f"TAG = {str(folder)!r}\n\n"
        "def start(stdout=subprocess.DEVNULL):  # in a session of its own: out of reach of a "
        "kill of the run's group\n"
        "    return subprocess.Popen([sys.executable, '-c', STUBBORN, TAG], "
        "start_new_session=True, stdout=stdout, stderr=subprocess.DEVNULL)\n\n" + body
    )
    return test


def _pytest(folder: Path, test: Path, *opts: str) -> list[str]:
    return [
        sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
        "-p", "tests.conftest", *opts, "--basetemp", str(folder / "base"), str(test),
    ]  # fmt: skip


def _tagged(folder: Path) -> list[int]:
    """The running processes whose command line names ``folder``: the stubborn ones."""
    tag = str(folder).encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            if tag in Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0") and (
                stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
            ):
                found.append(int(entry.name))
    return found


@pytest.fixture
def inner(tmp_path: Path):
    """A folder for the inner run; whatever it left running is killed, after the check."""
    yield tmp_path
    for pid in _tagged(tmp_path):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_failed_test_leaves_no_process_it_started(inner):
    """A test that failed between starting a process and stopping it (the stop after an
    assert) left the process running under init: a failed Ctrl-C test's agent, which
    ignores SIGTERM and SIGINT, was still there 34 minutes later. One that passed and
    forgot its process fails for it."""
    test = _inner_file(
        inner,
        "def test_fails_on_purpose():\n"
        "    proc = start()\n"
        "    assert False, 'on purpose'\n"
        "    proc.kill()\n\n"
        "def test_forgets_its_process():\n"
        "    start()\n",
    )
    done = subprocess.run(
        _pytest(inner, test), cwd=PROJECT, capture_output=True, text=True, timeout=120
    )
    assert _tagged(inner) == []
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 failed, 1 passed, 2 errors" in done.stdout, done.stdout[-3000:]
    assert done.stdout.count("outlived it (now killed)") >= 2, done.stdout[-3000:]


@pytest.mark.parametrize(
    ("how", "workers"),
    [(signal.SIGINT, []), (signal.SIGTERM, []), (signal.SIGTERM, ["-n", "1"])],
    ids=["SIGINT", "SIGTERM", "SIGTERM-xdist"],
)
def test_a_run_stopped_mid_test_leaves_no_process_it_started(inner, how, workers):
    """A run stopped by SIGTERM (CI cancelled, `timeout`) ended at once: no finalizer ran,
    and every process its tests had going was left, under pytest-xdist its workers too.
    Stopped as Ctrl-C stops it, the same: the test's own stop was never reached. (Under
    pytest-xdist the controller gives a worker mid-test 10 s, then SIGTERMs it.)"""
    started = make_fifo(inner, "started")  # the inner test says it is mid-test: awaited
    test = _inner_file(
        inner,
        "def test_runs_a_while():\n"
        "    proc = start(stdout=subprocess.PIPE)\n"
        # Its "ready": _tagged finds it. Said at once, the outer look could come while its
        # exec still loaded Python, its command line empty (seen once in a suite under -n 3).
        "    proc.stdout.readline()\n"
        # Closed in a with: a signal that came in the close of a file object freed unnamed
        # raised in its dealloc, where Python drops the exception (the run went on 60 s).
        f"    with open({str(started)!r}, 'w') as fifo:\n"
        "        fifo.write(f'started {proc.pid}\\n')\n"
        "    time.sleep(60)\n"
        "    proc.kill()\n",
    )
    said = inner / "said.txt"  # a file, not a pipe: what the run left would hold a pipe open
    with open(said, "w") as out:
        run = subprocess.Popen(
            _pytest(inner, test, *workers), cwd=PROJECT, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        await_fifo(started)
        assert _tagged(inner), said.read_text()
        run.send_signal(how)  # the run's own process, as `kill PID` and CI send it
        run.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):  # and its xdist workers, if it left them
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert _tagged(inner) == [], said.read_text()


def test_a_new_run_ends_what_a_run_killed_outright_left(inner):
    """A run killed outright (SIGKILL, an xdist worker killed) runs no finalizer; what it
    left ran on, and its network namespaces (``ip netns``: ``reviewq-vendor-PID`` of
    tests/test_vendor_clis.py) stayed, two of them seen at stop 39, and so did libfaketime's
    files in /dev/shm of a process it ran under. The next run ends them: those named by a
    test process that is gone."""
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid of no process: the run that owned what follows is gone
    # On a clock of its own (tests/test_remote_workers.py's worker): libfaketime's files in
    # /dev/shm, named by its pid, go only with its own exit, which a SIGKILL skips.
    lib = libfaketime()
    clock = {"LD_PRELOAD": str(lib), "FAKETIME": "+600s"} if lib else {}
    left = subprocess.Popen(
        [sys.executable, "-c", STUBBORN, str(inner)],
        env={**os.environ, "REVIEWQ_TEST_PROCESS": f"{gone.pid}.1.1", **clock},
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    assert left.stdout.readline() == b"ready\n"  # its preloaded library has run
    faked = [SHM / f"faketime_shm_{left.pid}", SHM / f"sem.faketime_sem_{left.pid}"]
    assert not lib or all(p.exists() for p in faked)
    namespace = f"reviewq-vendor-{gone.pid}"
    made = None
    if os.geteuid() == 0 and shutil.which("ip"):
        made = subprocess.run(["ip", "netns", "add", namespace], capture_output=True)
    # Chromium's TMPDIR (tests/chromium.py), a pids cgroup (tests/test_machine_limits.py)
    # with a process still in it.
    chromium = Path(f"/tmp/rq-chromium-{gone.pid}-x")
    (chromium / "org.chromium.Chromium.x").mkdir(parents=True)
    group = Path(f"/sys/fs/cgroup/pids/reviewq-test-{gone.pid}")
    with contextlib.suppress(OSError):
        group.mkdir()
        (group / "cgroup.procs").write_text(str(left.pid))
    try:
        test = _inner_file(inner, "def test_nothing():\n    pass\n")
        done = subprocess.run(
            _pytest(inner, test), cwd=PROJECT, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert left.wait(timeout=10) == -signal.SIGKILL
        if made is not None and made.returncode == 0:
            assert not Path("/var/run/netns", namespace).exists()
        assert not chromium.exists()
        assert not group.exists()
        assert not [p for p in faked if p.exists()]
    finally:
        shutil.rmtree(chromium, ignore_errors=True)
        if left.poll() is None:
            left.kill()
            left.wait()
        left.stdout.close()
        for path in faked:
            path.unlink(missing_ok=True)
        if made is not None and made.returncode == 0:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        remove_cgroup(group)


def test_a_run_killed_outright_leaves_no_redis_server_of_its_tests(inner):
    """redis-server writes its title over its environment, the test's mark with it: neither
    the test's end nor the next run found one by its mark, and one of a run killed outright
    (SIGKILL, an xdist worker killed) ran on, its socket in the run's folder, for good."""
    from .conftest import ends_within

    said = make_fifo(inner, "pid")
    test = _inner_file(
        inner,
        "from pathlib import Path\n"
        "import redis\n"
        "from tests.test_queue_integration import redis_server\n\n"
        "def test_holds_a_redis_server():\n"
        # Its socket in this test's folder: one in the inner run's own, deeper, is past a
        # socket path's 107 bytes under pytest-xdist.
        "    with redis_server(Path(TAG)) as url:\n"
        "        pid = redis.Redis.from_url(url).info('server')['process_id']\n"
        f"        with open({str(said)!r}, 'w') as fifo:\n"
        "            fifo.write(f'{pid}\\n')\n"
        "        time.sleep(60)\n",
    )
    out = inner / "out.txt"
    with open(out, "w") as f:
        run = subprocess.Popen(
            _pytest(inner, test), cwd=PROJECT, stdout=f, stderr=subprocess.STDOUT
        )
    pid = None
    try:
        with contextlib.suppress(AssertionError):
            pid = int(await_fifo(said))
        assert pid is not None, out.read_text()[-3000:]
        run.kill()
        run.wait()
        assert ends_within(pid, 10), f"redis-server {pid} outlived the run killed outright"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_an_agents_tmpdir_of_another_runs_live_worker_is_not_named_as_this_runs(tmp_path):
    """The host's /tmp is shared: a worker of another run (another checkout's suite, a
    person's `reviewq worker`) makes its agents' TMPDIRs there while a test runs, and
    the run named each as its own test's, left behind. One whose worker still runs and
    is not this run's is left out; one whose worker is gone cannot be told, and stays."""
    from . import leftovers
    from .conftest import _not_another_runs

    def sleeper(mark: str | None) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k != leftovers.MARK}
        env |= {leftovers.MARK: mark} if mark is not None else {}
        proc = subprocess.Popen(
            [sys.executable, "-c", "print('ready', flush=True); import time; time.sleep(60)"],
            env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout.readline() == "ready\n"  # its environment is readable from now
        return proc

    # Only "ours" carries the test's mark (no_process_left ends what does): each is started
    # in the try that ends it (one that failed to start left those before it for 60 s).
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["a person's"] = sleeper(None)
        # Another run's mark names a live owner (here the person's process): one of a run
        # that is gone ("1.2.3") was ended by any other suite starting on the host meanwhile.
        owner = procs["a person's"].pid
        procs["ours"] = sleeper(os.environ[leftovers.MARK])
        procs["another run's"] = sleeper(f"{owner}.{leftovers._start_time(owner)}.1")
        procs["its pid taken again"] = sleeper(None)
        procs["gone"] = sleeper(None)
        procs["gone"].kill()
        procs["gone"].wait()
        paths = {
            name: tmp_path / f"reviewq-worker-{p.pid}-0123456789abcdef" for name, p in procs.items()
        }
        for path in paths.values():
            path.mkdir()
        # Last changed by this run's worker a minute before the process now of its pid
        # began (pid_max is 32768 here: a run of the suite goes round it).
        a_minute_ago = time.time() - 60
        os.utime(paths["its pid taken again"], (a_minute_ago, a_minute_ago))
        kept = _not_another_runs(set(paths.values()) | {tmp_path / "reviewq-job-1-attempt-1-x"})
        assert kept == {
            paths["ours"],
            paths["gone"],
            paths["its pid taken again"],
            tmp_path / "reviewq-job-1-attempt-1-x",
        }
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
            p.stdout.close()
