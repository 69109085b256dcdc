"""Two hosts on one machine (issue 11): redis-server and the control process in one network
namespace, a worker in another, joined by a veth pair, the worker also in a mount namespace
of its own in which the control's KB and state folder are hidden under a tmpfs. A sweep
finishes through the remote worker alone, survives one SIGKILL of it, and accepts each
pair exactly once.

Needs root (network and mount namespaces); it skips, saying why, where it cannot make them.
The addresses (10.231.N.1-2/30) exist only inside the namespaces the test made.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .conftest import process_gone
from .test_queue_integration import FAKE, _await_exit, await_fifo, guard_of, make_fifo

pytestmark = pytest.mark.integration
EXE = str(Path(sys.executable).parent / "reviewq")
PORT = 6379


def sh(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


@pytest.fixture
def hosts():
    """Two network namespaces joined by a veth pair: (control ns, worker ns, control IP)."""
    with namespaces() as made:
        yield made


@contextlib.contextmanager
def namespaces():
    """:func:`hosts`, for a fixture of any scope."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make network and mount namespaces")
    for tool in ("ip", "unshare", "mount", "redis-server"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    tag = f"{os.getpid() % 100000}"
    ctl, wrk = f"rq2h-c{tag}", f"rq2h-w{tag}"
    net = f"10.231.{os.getpid() % 250}"
    made: list[str] = []
    try:
        for ns in (ctl, wrk):
            res = sh("ip", "netns", "add", ns)
            if res.returncode != 0:
                pytest.skip(f"cannot make a network namespace: {res.stderr.strip()}")
            made.append(ns)
        steps = [
            (
                "ip",
                "link",
                "add",
                f"rqc{tag}",
                "netns",
                ctl,
                "type",
                "veth",
                "peer",
                "name",
                f"rqw{tag}",
                "netns",
                wrk,
            ),
            ("ip", "-n", ctl, "addr", "add", f"{net}.1/30", "dev", f"rqc{tag}"),
            ("ip", "-n", wrk, "addr", "add", f"{net}.2/30", "dev", f"rqw{tag}"),
            ("ip", "-n", ctl, "link", "set", f"rqc{tag}", "up"),
            ("ip", "-n", wrk, "link", "set", f"rqw{tag}", "up"),
            ("ip", "-n", ctl, "link", "set", "lo", "up"),
            ("ip", "-n", wrk, "link", "set", "lo", "up"),
        ]
        for step in steps:
            res = sh(*step)
            if res.returncode != 0:
                pytest.skip(f"cannot join the namespaces ({' '.join(step)}): {res.stderr.strip()}")
        yield ctl, wrk, f"{net}.1"
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth pair too
            sh("ip", "netns", "del", ns)


class Procs:
    """Every process the test starts, stopped in teardown whatever happened."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kw)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def test_a_sweep_through_a_worker_on_another_host(hosts, tmp_path):
    ctl, wrk, ip = hosts
    url = f"redis://{ip}:{PORT}/0"
    # The control host: KB and state folder under hidden/, which the worker cannot see.
    hidden = tmp_path / "hidden"
    root = hidden / "site"
    (root / "kb").mkdir(parents=True)
    for g, lens in enumerate(("prose", "frontmatter")):
        gate = root / f"kb/instructions/review-gates/{lens}/check.md"
        gate.parent.mkdir(parents=True, exist_ok=True)
        gate.write_text(
            f"---\ngate_id: {lens}/check\nname: Check {g}\nlens: {lens}\nwatches: [body]\n---\n\n"
            "## Failure mode\n\nIt fails.\n\n## Test\n\nCheck it.\n"
        )
    for n in range(4):
        note = root / f"kb/notes/n{n}.md"
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(f"---\ntitle: N{n}\ndescription: About {n}.\n---\n\nBody {n}.\n")
    (root / "reviewq.toml").write_text(
        f'[reviewers.fake]\nkind = "command"\ncommand = ["{sys.executable}", "{FAKE}"]\n'
        'partition = "fake"\ntimeout = "30s"\nconcurrency = 2\n\n'
        f'[queue]\nurl = "{url}"\nlease_seconds = 2\nreaper_seconds = 0.5\n'
        "launch_backoff_seconds = 0.05\n"
    )
    # The worker host: reviewq, the agent, worker.toml and a folder of its own.
    home = tmp_path / "remote"
    home.mkdir()
    fifo = make_fifo(home, "agent-started")
    (home / "worker.toml").write_text(
        f'[queue]\nurl = "{url}"\npoll_seconds = 0.02\n\n'
        f'[reviewers.fake]\nkind = "command"\ncommand = ["{sys.executable}", "{FAKE}"]\n'
        'partition = "fake"\nconcurrency = 2\n'
        f'env = {{ FAKE_MODE = "slow", FAKE_SLEEP = "0.3", FAKE_NOTIFY_FIFO = "{fifo}" }}\n'
    )
    in_ctl = ["ip", "netns", "exec", ctl]
    # A mount namespace of its own in which the control's folders are an empty tmpfs.
    in_wrk = [
        "ip", "netns", "exec", wrk, "unshare", "--mount", "--propagation", "private",
        "sh", "-c", f'mount -t tmpfs -o size=1m reviewq-hidden "{hidden}" && exec "$0" "$@"',
    ]  # fmt: skip
    worker_argv = [
        *in_wrk, EXE, "--config", str(home / "worker.toml"), "--state", str(home / "state"),
        "worker", "--workers", "2",
    ]  # fmt: skip
    procs = Procs()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REVIEWQ_", "FAKE_"))}
    try:
        redis = procs.start(
            [*in_ctl, "redis-server", "--bind", ip, "--port", str(PORT), "--save", "",
             "--appendonly", "no", "--protected-mode", "no"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for line in redis.stdout:  # await its own "ready" line
            if "ready to accept connections" in line.lower():
                break
        else:
            pytest.fail("redis-server exited before it was ready")
        threading.Thread(target=redis.stdout.read, daemon=True).start()
        # The worker host cannot see the control's folders at all.
        peek = sh(*in_wrk, "ls", "-A", str(hidden))
        assert peek.returncode == 0 and peek.stdout == "", peek
        control = procs.start(
            [*in_ctl, EXE, "--root", str(root), "control"],
            env={**env, "REVIEWQ_LOG_FORMAT": "json"}, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for line in control.stderr:  # up before the sweep looks, or it starts its own
            if "control.started" in line:
                break
        else:
            pytest.fail("the control process exited before it started")
        threading.Thread(target=control.stderr.read, daemon=True).start()
        worker = procs.start(worker_argv, env=env, stderr=subprocess.DEVNULL)
        sweep = procs.start(
            [*in_ctl, EXE, "--root", str(root), "sweep", "--reviewer", "fake", "--workers", "0", "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # One SIGKILL of the remote worker while its first agent runs.
        agent_pid, worker_pid, _ = map(int, await_fifo(fifo, timeout=120).split())
        assert worker_pid == worker.pid
        guard = guard_of(worker_pid)
        os.kill(worker_pid, signal.SIGKILL)
        worker.wait(timeout=30)
        _await_exit([guard])  # it ends the agent and says so before the next worker starts
        os.unlink(fifo)  # later agents need not report
        restarted = procs.start(worker_argv, env=env, stderr=subprocess.DEVNULL)
        out, err = sweep.communicate(timeout=240)
        assert sweep.returncode == 0, err
        orphan_gone = process_gone(agent_pid)
        procs.stop_all()
        assert restarted.returncode is not None
    finally:
        procs.stop_all()
        with contextlib.suppress(ProcessLookupError, UnboundLocalError):
            os.killpg(agent_pid, signal.SIGKILL)
    summary = json.loads(out)
    assert summary["failed"] == [] and summary["jobs"]["fake"]["completed"] == 8
    import sqlite3

    with sqlite3.connect(root / ".reviewq" / "state.db") as conn:
        acc = conn.execute(
            "SELECT count(*), count(DISTINCT note_path || gate_id) FROM acceptance"
        ).fetchone()
        pairs = conn.execute(
            "SELECT count(*) FROM review_pairs WHERE decision IS NOT NULL"
        ).fetchone()
        lost = conn.execute("SELECT count(*) FROM attempts WHERE outcome = 'lost'").fetchone()[0]
        statuses = {r[0] for r in conn.execute("SELECT status FROM review_jobs")}
    assert tuple(acc) == (8, 8) and pairs[0] == 8  # every pair once, none twice
    assert statuses == {"completed"} and lost >= 1  # the killed worker's attempt was re-run
    assert orphan_gone, "the killed worker's agent outlived it"
    # The control host's log tells the whole story, with the remote worker's attempts.
    events = [
        json.loads(x) for x in (root / ".reviewq/logs/reviewq.jsonl").read_text().splitlines()
    ]
    assert any(e["event"] == "attempt.started" and e.get("host") for e in events)
    assert not (root / ".reviewq" / "worker").exists()  # no worker wrote here
    assert (home / "state" / "logs" / "reviewq.jsonl").exists()
