"""Unattended sweeps through real Huey consumers on real SQLite files, with agents as real
subprocesses (CONTRACT §6, §12): the happy path, kills, a missing binary, a hung agent."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import markupsafe
import pytest

from .conftest import (
    PROJECT,
    dies_with_this_process,
    page_text,
    process_gone,
    ready_within,
    reviewq_process,
    spend,
    stop,
)

pytestmark = pytest.mark.integration
FAKE = Path(__file__).parent / "agents" / "fake_agent.py"
FAST_QUEUE = "[queue]\nlease_seconds = 2\nreaper_seconds = 0.5\nlaunch_backoff_seconds = 0.05\npoll_seconds = 0.02\n"


def fake_profile(timeout: str = '"30s"', command: str | None = None, extra: str = "") -> str:
    cmd = command or f'["{sys.executable}", "{FAKE}"]'
    return (
        f'[reviewers.fake]\nkind = "command"\ncommand = {cmd}\npartition = "fake"\n'
        f"timeout = {timeout}\nconcurrency = 2\n{extra}\n"
    )


def rq(
    kb, *args: str, env: dict | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return reviewq_process("--root", str(kb.root), *args, env=env, timeout=timeout)


def db(kb) -> sqlite3.Connection:
    conn = sqlite3.connect(kb.state / "state.db")
    conn.row_factory = sqlite3.Row
    return conn


def log_lines(kb) -> list[dict]:
    """The control's log, then the local workers' (they keep to STATE/worker/)."""
    lines = []
    for path in (kb.state / "logs" / "reviewq.jsonl", kb.state / "worker/logs/reviewq.jsonl"):
        if path.exists() or path.parent.parent == kb.state:
            lines += path.read_text().splitlines()
    return [json.loads(line) for line in lines]  # every line must be valid JSON


def small_kb(kb, notes: int = 3) -> None:
    kb.gate("frontmatter/title-check", ["title"])
    kb.gate("prose/body-check", ["body"])
    for i in range(notes):
        kb.note(f"n{i}", body=f"Body {i}.\n")


def ticks_past_three(kb) -> None:
    """A control's ticks at 02:59 (the cron clock starts) and 03:00:05 on this machine's
    clock, logged to the state folder: a `0 3 * * *` entry's run, as its tick makes it."""
    from datetime import datetime

    from orchestrator import logs
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps import producer

    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    producer.enqueue_due_sweeps(ws, datetime(2026, 1, 2, 2, 59).astimezone())
    producer.enqueue_due_sweeps(ws, datetime(2026, 1, 2, 3, 0, 5).astimezone())
    ws.close()


def test_sweep_of_the_example_kb_with_the_offline_reviewer(tmp_path):
    root = tmp_path / "example"
    shutil.copytree(PROJECT / "kb", root / "kb")
    res = reviewq_process("--root", str(root), "sweep", "--workers", "2", "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["jobs"]["offline"]["completed"] == out["enqueued_jobs"] > 10
    assert out["failed"] == [] and out["decisions"]["FAIL"] > 0 and out["decisions"]["PASS"] > 0
    sel = reviewq_process(
        "--root", str(root), "select", "--all-gates", "--model", "offline", "--json"
    )
    assert json.loads(sel.stdout)["targets"] == []
    events = [
        rec
        for rec in (
            json.loads(x) for x in (root / ".reviewq/logs/reviewq.jsonl").read_text().splitlines()
        )
    ]
    names = {e["event"] for e in events}
    assert {
        "sweep.enqueued",
        "attempt.dispatched",
        "attempt.started",
        "attempt.ended",
        "job.finalized",
    } <= names
    assert all({"timestamp", "level", "event"} <= e.keys() for e in events)
    finalized = [e for e in events if e["event"] == "job.finalized"]
    assert all("job_id" in e and "attempt" in e and "reviewer" in e for e in finalized)
    # Everything else the sweep wrote is under the state folder.
    assert sorted(p.name for p in root.iterdir()) == [".reviewq", "kb"]


def test_what_a_night_writes_in_the_state_folder_is_its_owners_alone(tmp_path):
    """N28: under umask 022 a sweep of the example KB with fixes left 0644 files and 0755
    folders beside the 0600/0700 ones: every attempt's prompt.md, the result files,
    state.db and the queues, the logs, the job folders and jobs/ itself; each quotes the
    notes or the agents, and a state folder made wider by hand (systemd's
    StateDirectory=) showed them to every user. Each is made owner-only now."""
    root = tmp_path / "example"
    shutil.copytree(PROJECT / "kb", root / "kb")
    umask = os.umask(0o022)
    try:
        res = reviewq_process("--root", str(root), "sweep", "--fix", "--workers", "2", timeout=300)
    finally:
        os.umask(umask)
    assert res.returncode in (0, 1), res.stderr  # 1: escalations wait for a person
    state = root / ".reviewq"
    kinds = {p.relative_to(state).parts[0] for p in state.rglob("*")}
    assert {"jobs", "escalations", "logs", "queue", "state.db", "worker"} <= kinds
    assert _not_owners_alone(state) == {}


def _not_owners_alone(state: Path) -> dict[str, str]:
    """The entries of ``state`` (itself among them) others may read or search, by mode."""
    import stat

    return {
        str(p.relative_to(state)): oct(stat.S_IMODE(p.lstat().st_mode))
        for p in (state, *state.rglob("*"))
        if stat.S_IMODE(p.lstat().st_mode) & 0o077
    }


def test_the_caches_select_and_export_keep_in_the_state_folder_are_its_owners_alone(tmp_path):
    """N30: N28 left the caches' folders out: `select` (its memo of answers), `export`,
    `warn-queue` and the control's follow-ups (the note cache) made `cache/` and
    `cache/select/` 0755 under umask 022, the names of every note readable by all."""
    root = tmp_path / "example"
    shutil.copytree(PROJECT / "kb", root / "kb")
    umask = os.umask(0o022)
    try:
        res = reviewq_process(
            "--root", str(root), "select", "--all-gates", "--model", "offline", "--json"
        )
    finally:
        os.umask(umask)
    assert res.returncode == 0, res.stderr
    state = root / ".reviewq"
    assert (state / "cache" / "select").is_dir()  # its memo of the answer
    assert _not_owners_alone(state) == {}


def _queue_logs(kb) -> dict[str, int]:
    """The SQLite queues' write-ahead logs left in STATE/queue, by name: their sizes."""
    return {p.name: p.stat().st_size for p in (kb.state / "queue").glob("*.db-wal")}


def test_a_sweeps_end_leaves_no_write_ahead_log_of_its_queues(kb):
    """N27: the SQLite queues' WALs stayed after a clean end (4.4 MB of review.db-wal
    after a real night): the control and worker exited with their queue connections
    open, and SQLite checkpoints and removes a WAL as the last connection closes."""
    small_kb(kb)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    res = rq(kb, "sweep", "--reviewer", "fake", "--json")
    assert res.returncode == 0, res.stderr
    assert {name: size for name, size in _queue_logs(kb).items() if size} == {}


def test_a_control_and_worker_stopped_leave_no_write_ahead_log_of_their_queues(kb):
    """N27, as the Procfile runs them: stopped as an operator does (Ctrl-C, systemd's
    SIGINT), the last to close a queue removes its WAL."""
    small_kb(kb, notes=2)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    control = subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([*base, "worker"], stderr=subprocess.DEVNULL)
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "--all-gates").returncode == 0
        _await_logged(kb, "job.finalized", count=4)
    finally:
        for proc in (worker, control):
            stop(proc)
    assert (worker.returncode, control.returncode) == (0, 0)
    assert {name: size for name, size in _queue_logs(kb).items() if size} == {}


def test_a_second_sweep_is_idempotent(kb):
    small_kb(kb)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    first = rq(kb, "sweep", "--reviewer", "fake", "--json")
    assert first.returncode == 0, first.stderr
    again = rq(kb, "sweep", "--reviewer", "fake", "--json")
    assert json.loads(again.stdout)["enqueued_jobs"] == 0
    with db(kb) as conn:
        rows = conn.execute(
            "SELECT note_path, gate_id, count(*) FROM acceptance GROUP BY 1, 2"
        ).fetchall()
    assert len(rows) == 6 and all(r[2] == 1 for r in rows)


def test_a_note_over_the_size_limit_is_said_and_left_out_the_others_reviewed(kb):
    """A 60 MB note became a 60 MB snapshot in state.db, queue message and prompt. Over
    [limits] max_note_bytes it is one warning line naming the file, its size and the
    setting, and the sweep's summary lists it as not reviewed; the other notes are."""
    small_kb(kb, notes=2)
    big = kb.note("big", body="A line of a note that grew.\n" * 200)
    size = (kb.root / big).stat().st_size
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + "[limits]\nmax_note_bytes = 4096\n")
    said = f"kb/notes/big.md: {size} bytes, over [limits] max_note_bytes (4096); not reviewed"
    res = rq(kb, "sweep", "--reviewer", "fake", "--all-gates")
    assert res.returncode == 0, res.stderr
    assert [x for x in res.stderr.splitlines() if "big.md" in x] == [f"warning: {said}"]
    assert f"1 file(s) left out of the sweep:\n  {said}\n" in res.stdout
    with db(kb) as conn:
        reviewed = {r[0] for r in conn.execute("SELECT DISTINCT note_path FROM acceptance")}
        snapped = conn.execute("SELECT max(length(text)) FROM snapshots").fetchone()[0]
    assert reviewed == {"kb/notes/n0.md", "kb/notes/n1.md"} and snapped < 4096
    # A cron sweep has no summary: status says it too, until the note is cut down.
    status = rq(kb, "status")
    assert f"note not reviewed: {said.removesuffix('; not reviewed')}\n" in status.stdout
    # Named in a hand-made job too (create-jobs), it is skipped for the same reason.
    targets = json.dumps(
        {"model_partition": "fake", "targets": [{"note_path": big, "gate_id": "prose/body-check"}]}
    )
    res = reviewq_process(
        "--root", str(kb.root), "create-jobs", "--input", "-", "--grouping", "note", input=targets
    )
    assert res.returncode == 0 and f"skipped: {big} prose/body-check: {said}\n" in res.stderr, (
        res.stderr
    )


def test_excluded_notes_are_counted_never_selected_swept_or_queued(kb):
    """An index and templates kept beside the notes were reviewed at every gate of every
    sweep. Under [kb] exclude (globs relative to the note roots) no sweep, enqueue or
    select picks them, even named with --note; each command says how many, in one line."""
    small_kb(kb, notes=2)
    kb.note("README")
    kb.note("topic/README")
    kb.note("templates/t1")
    kb.note("templates/deep/t2")
    kb.note("templates-not")  # a sibling the folder's glob must not take
    kb.write(
        "reviewq.toml",
        fake_profile() + FAST_QUEUE + '[kb]\nexclude = ["**/README.md", "templates/**"]\n',
    )
    line = "4 note(s) excluded by [kb] exclude: not reviewed"
    sel = rq(kb, "select", "--all-gates", "--model", "fake", "--json")
    assert sel.returncode == 0, sel.stderr
    assert {t["note_path"] for t in json.loads(sel.stdout)["targets"]} == {
        "kb/notes/n0.md",
        "kb/notes/n1.md",
        "kb/notes/templates-not.md",
    }
    assert sel.stderr.splitlines() == [line], sel.stderr
    named = rq(kb, "select", "--all-gates", "--note", "kb/notes/templates", "--json")
    assert json.loads(named.stdout)["targets"] == [] and line.replace("4", "2") in named.stderr
    res = rq(kb, "sweep", "--reviewer", "fake", "--all-gates", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["notes_excluded"] == 4
    assert res.stderr.count("excluded") == 1 and "README" not in res.stderr, res.stderr
    with db(kb) as conn:
        reviewed = {r[0] for r in conn.execute("SELECT DISTINCT note_path FROM acceptance")}
    assert reviewed == {"kb/notes/n0.md", "kb/notes/n1.md", "kb/notes/templates-not.md"}
    kb.note("n2")
    enq = rq(kb, "enqueue", "--reviewer", "fake", "--all-gates", "--json")
    assert enq.returncode == 0, enq.stderr
    out = json.loads(enq.stdout)
    assert out["notes_excluded"] == 4 and {
        p["note_path"] for j in out["jobs"] for p in j["pairs"]
    } == {"kb/notes/n2.md"}, out
    status = rq(kb, "status")
    assert f"\n{line}\n" in status.stdout, status.stdout


def make_fifo(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def await_fifo(path: Path, timeout: float = 60) -> str:
    """The first line a process writes to the FIFO: the test's way to await an event in
    another process, with a bound so a broken run fails instead of hanging."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert ready_within(fd, timeout), f"nothing was written to {path.name} within {timeout} s"
        data = b""
        while not data.endswith(b"\n"):
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                # A line written in parts (one without its newline, closed later): the
                # rest, or the writer's close, is awaited as the first part was.
                assert ready_within(fd, timeout), f"{path.name}: {data!r}, then nothing"
                continue
            if not chunk:
                break
            data += chunk
        # Two writers that were waiting for a reader may both have written (two agents at
        # once): the first line is the event awaited, as said.
        return data.decode().split("\n", 1)[0]
    finally:
        os.close(fd)


def test_worker_killed_mid_attempt_completes_through_the_reaper(kb, tmp_path):
    """The worker dies in its agent's first moments, before it said anything: its message
    is gone from the review queue, so the reaper takes the attempt as silent a lease
    (2 s) after it notices, not as never picked up after lease + the reviewer's timeout
    (here 600 s, past the sweep's wait below)."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + FAST_QUEUE)
    fifo = make_fifo(tmp_path, "started")
    env = {"FAKE_MODE_1": "hang", "FAKE_MODE": "good", "FAKE_NOTIFY_FIFO": str(fifo)}
    sweep = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "reviewq"),
            "--root",
            str(kb.root),
            "sweep",
            "--reviewer",
            "fake",
            "frontmatter",
            "--json",
        ],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    agents = []
    try:
        agent_pid, worker_pid, attempt = map(int, await_fifo(fifo).split())  # the agent runs
        agents.append(agent_pid)
        assert attempt == 1
        # Its first control and worker are forked from it (not started afresh, importing
        # reviewq again); the worker restarted after the kill is started afresh.
        control_pid = int((kb.state / "control.lock").read_text())
        for pid, name in ((worker_pid, "reviewq-worker"), (control_pid, "reviewq-control")):
            stat = Path(f"/proc/{pid}/stat").read_text()
            assert stat[stat.index("(") + 1 : stat.rindex(")")] == name, stat
            assert int(stat.rsplit(")", 1)[1].split()[1]) == sweep.pid, stat
        guard = guard_of(worker_pid)
        os.kill(worker_pid, signal.SIGKILL)
        # The sweep restarts its worker; the reaper sees the lost lease and opens attempt 2.
        os.unlink(fifo)  # later attempts need not report
        out, err = sweep.communicate(timeout=120)
        orphan_gone = process_gone(agent_pid)  # before the cleanup below could kill it
        _await_exit([guard])  # it ends the agent, then says so in the log: not past the test
    finally:
        if sweep.poll() is None:
            sweep.kill()
        for pid in agents:  # the hung first agent may outlive its worker until it is reaped
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    assert sweep.returncode == 0, err
    with db(kb) as conn:
        job = conn.execute("SELECT status, attempt FROM review_jobs").fetchall()
        outcomes = [
            tuple(r) for r in conn.execute("SELECT attempt, outcome FROM attempts ORDER BY attempt")
        ]
        acc = conn.execute(
            "SELECT count(*), count(DISTINCT note_path || gate_id) FROM acceptance"
        ).fetchone()
        lost = conn.execute("SELECT reasons FROM attempts WHERE attempt = 1").fetchone()[0]
    assert [tuple(j) for j in job] == [("completed", 2)]
    assert outcomes == [(1, "lost"), (2, "finalized")]
    # The reaper's, or the restarted worker's word of the agent it reaped, whichever came first.
    (reason,) = json.loads(lost)
    assert reason == "no heartbeat for 2 s" or "found the attempt unfinished" in reason, reason
    assert tuple(acc) == (1, 1)  # exactly one acceptance for the one pair
    # The restarted worker killed the agent its dead predecessor left behind.
    assert orphan_gone, "the first attempt's agent outlived its worker"


def _await_logged(kb, event: str, count: int = 1, message: str = "", timeout: float = 60) -> None:
    """Until the log holds ``count`` lines of ``event`` (whose message holds ``message``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            lines = [x for x in log_lines(kb) if x["event"] == event]
        except FileNotFoundError:  # the control's log, made as the control starts
            lines = []
        if len([x for x in lines if message in x.get("message", "")]) >= count:
            return
        assert time.monotonic() < deadline, f"{count} {event} {message!r} not logged in {timeout} s"
        time.sleep(0.05)


def test_a_sighup_restarts_a_sweeps_control_and_worker_in_place(kb, tmp_path):
    """A SIGHUP (Huey's "restart": drain, then start again) to a sweep's forked control
    or worker exec'd `python reviewq …` (its sys.argv): "can't open file '…/reviewq'",
    exit 2, and the sweep started it afresh (`sweep.child_exited`). Now each is the same
    process again, as a service's control and worker are after a SIGHUP."""
    from .fault.harness import ContinueGate, StartFifo

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + FAST_QUEUE)
    starts, gate = StartFifo(tmp_path / "started"), ContinueGate(tmp_path / "go")
    env = {**os.environ, "FAKE_NOTIFY_FIFO": str(starts.path), "FAKE_CONTINUE_FIFO": str(gate.path)}
    exe = str(Path(sys.executable).parent / "reviewq")
    sweep = subprocess.Popen(
        [exe, "--root", str(kb.root), "sweep", "--reviewer", "fake", "frontmatter", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        worker_pid = int(starts.await_starts(1)[0].split()[1])
        control_pid = int((kb.state / "control.lock").read_text())
        os.kill(control_pid, signal.SIGHUP)
        _await_logged(kb, "control.started", 2)
        os.kill(worker_pid, signal.SIGHUP)
        _await_logged(kb, "huey.consumer", message="Received SIGHUP", count=2)
        gate.open_gate()  # the worker drains: its agent ends and its outcome is delivered
        out, err = sweep.communicate(timeout=120)
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
            sweep.wait()
        gate.close()
        starts.close()
    assert sweep.returncode == 0, err
    said = log_lines(kb)
    assert [x for x in said if x["event"] == "sweep.child_exited"] == []
    assert [x["pid"] for x in said if x["event"] == "control.started"] == [control_pid] * 2
    assert [x["event"] for x in said if x["event"].endswith(".restarting")] == [
        "control.restarting",
        "worker.restarting",
    ]
    assert json.loads(out)["jobs"]["fake"]["completed"] == 1


def test_a_draining_worker_starts_no_agent_for_a_message_it_holds_for_a_slot(kb, tmp_path):
    """A worker's second thread took a message and waited for the profile's one agent
    slot; Ctrl-C (a drain: the running agent finishes) let that slot go to it as the
    agent ended, and the draining worker started a new agent and ran it whole (600 s
    here; a real review's timeout) before it stopped. What it holds unstarted goes back
    to the queue, for the next worker."""
    from .fault.harness import ContinueGate, StartFifo

    small_kb(kb, notes=2)
    one_slot = fake_profile(timeout='"600s"').replace("concurrency = 2", "concurrency = 1")
    kb.write("reviewq.toml", one_slot + FAST_QUEUE)
    starts, gate = StartFifo(tmp_path / "started"), ContinueGate(tmp_path / "go")
    runs = tmp_path / "runs"
    env = {
        **os.environ,
        "FAKE_NOTIFY_FIFO": str(starts.path),
        "FAKE_CONTINUE_FIFO": str(gate.path),
        "FAKE_LOG": str(runs),
    }
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    control = subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)
    worker = subprocess.Popen(
        [*base, "worker", "--workers", "2"], env=env, stderr=subprocess.DEVNULL
    )
    later = None
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        starts.await_starts(1)
        deadline = time.monotonic() + 60
        while True:  # the other message taken, its thread waiting for the slot (its beats)
            with db(kb) as conn:
                held = conn.execute(
                    "SELECT count(*) FROM attempts WHERE outcome = 'dispatched' "
                    "AND taken_at IS NOT NULL"
                ).fetchone()[0]
            if held:
                break
            assert time.monotonic() < deadline, "no worker thread waited for the slot"
            time.sleep(0.05)
        worker.send_signal(signal.SIGINT)
        _await_logged(kb, "huey.consumer", message="Received SIGINT")
        gate.open_gate()  # the running agent ends: its slot is free
        assert worker.wait(timeout=60) == 0
        assert len(runs.read_text().splitlines()) == 1  # before: 2, the second in the drain
        later = subprocess.Popen([*base, "worker"], env=env, stderr=subprocess.DEVNULL)
        _await_logged(kb, "job.finalized", count=2)  # the one held is run by the next worker
    finally:
        for proc in (later, worker, control):
            if proc is not None:
                stop(proc)
        gate.close()
        starts.close()
    assert len(runs.read_text().splitlines()) == 2


def test_a_worker_stopped_at_once_after_its_outcome_went_does_not_queue_the_attempt_again(
    kb, tmp_path
):
    """SIGTERM (a stop at once) to a worker whose thread had sent its attempt's outcome and
    was forgetting the CLI's session and removing the attempt's folder: Huey took the task
    for one it cut short and put the review message back, and the next worker ran the
    agent again, paid for, for an attempt the control had already decided."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    sent = make_fifo(tmp_path, "sent")
    env = {**os.environ, "REVIEWQ_FAULT_WORKER_OUTCOME_SENT": str(sent)}
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    control = subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([*base, "worker"], env=env, stderr=subprocess.DEVNULL)
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        assert int(await_fifo(sent)) == worker.pid  # the outcome is on the control queue
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        with sqlite3.connect(kb.state / "queue" / "review.db") as queue:
            (queued,) = queue.execute("SELECT count(*) FROM task WHERE queue = 'review'").fetchone()
        _await_logged(kb, "job.finalized")
    finally:
        for proc in (worker, control):
            stop(proc)
    assert queued == 0  # before: 1, the decided attempt's message put back
    (interrupted,) = [x for x in log_lines(kb) if x["event"] == "task.interrupted"]
    assert interrupted["requeued"] is False, interrupted


def test_a_worker_stopped_at_once_while_its_outcome_is_on_its_way_queues_it_only_if_unsent(
    kb, tmp_path
):
    """SIGTERM while a thread was sending its attempt's outcome (a control queue held,
    a large outcome on a slow link): Huey put the message back as cut short, and the
    send then went through: the control decided the attempt and the next worker ran its
    agent again for nothing. The send is given the stop's grace, and is not put back
    (C89: one still on its way past the grace is left to the control's reaper)."""
    from .fault.harness import ContinueGate

    small_kb(kb, notes=1)
    # A heartbeat due while control.db is held waits too, and the outcome behind it: on a
    # loaded machine the agent's exit came past its first beat (F119). The first beat is
    # awaited below; the next is a quarter of this lease away.
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE.replace("= 2\n", "= 120\n", 1))
    gate = ContinueGate(tmp_path / "go")
    started = make_fifo(tmp_path, "started")
    env = {**os.environ, "FAKE_NOTIFY_FIFO": str(started), "FAKE_CONTINUE_FIFO": str(gate.path)}
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    control = subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([*base, "worker"], env=env, stderr=subprocess.DEVNULL)
    outcomes = None
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        await_fifo(started)
        _await_logged(kb, "attempt.started")  # its first beat, a second after the launch
        outcomes = sqlite3.connect(kb.state / "queue" / "control.db", isolation_level=None)
        outcomes.execute("BEGIN IMMEDIATE")  # the outcome's send waits (and retries)
        gate.open_gate()
        own = SimpleNamespace(state=kb.state / "worker")
        _await_logged(own, "attempt.exited")  # logged as its outcome's send begins
        worker.send_signal(signal.SIGTERM)
        _await_logged(own, "task.interrupted")  # Huey's word: the send still waits
        outcomes.execute("COMMIT")  # the send goes through, within the stop's grace
        assert worker.wait(timeout=30) == 0
        with sqlite3.connect(kb.state / "queue" / "review.db") as queue:
            (queued,) = queue.execute("SELECT count(*) FROM task WHERE queue = 'review'").fetchone()
        _await_logged(kb, "job.finalized")
    finally:
        if outcomes is not None:
            outcomes.close()
        for proc in (worker, control):
            stop(proc)
        gate.close()
    assert queued == 0  # before: 1, the message put back while its outcome was on its way


def test_a_worker_stopped_at_once_beside_a_paused_redis_ends_and_runs_nothing_twice(
    kb, tmp_path, redis_url
):
    """K103 put back, once its 5 s were over, a message whose outcome was still on its way:
    beside a Redis holding writes (`CLIENT PAUSE ... WRITE`, a failover's tooling) the
    put-back waited on the same Redis, the stop lasted as long as the pause, and as it
    ended both landed: the control finalized the attempt and the next worker ran its
    agent again (C89). The outcome still on its way is left; the worker ends while the
    pause holds, and the attempt is run again once, by the control's reaper."""
    import redis

    from .fault.harness import ContinueGate

    small_kb(kb, notes=1)
    queue = f'[queue]\nurl = "{redis_url}"\nlease_seconds = 3\nreaper_seconds = 0.5\n'
    kb.write("reviewq.toml", fake_profile() + queue)
    gate, runs = ContinueGate(tmp_path / "go"), tmp_path / "runs"
    started = make_fifo(tmp_path, "started")
    env = {**os.environ, "FAKE_NOTIFY_FIFO": str(started), "FAKE_CONTINUE_FIFO": str(gate.path)}
    env["FAKE_LOG"] = str(runs)
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    control = subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([*base, "worker"], env=env, stderr=subprocess.DEVNULL)
    client = redis.Redis.from_url(redis_url)
    paused, after = False, None
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        await_fifo(started)
        client.execute_command("CLIENT", "PAUSE", "600000", "WRITE")
        paused = True
        gate.open_gate()
        own = SimpleNamespace(state=kb.state / "worker")
        _await_logged(own, "attempt.exited")  # logged as its outcome's send begins
        worker.send_signal(signal.SIGTERM)
        _await_logged(own, "task.interrupted")
        try:
            ended = worker.wait(timeout=60)  # before: not while the pause held
        except subprocess.TimeoutExpired:
            ended = None
        client.execute_command("CLIENT", "UNPAUSE")
        paused = False
        assert ended == 0
        after = subprocess.Popen(
            [*base, "worker"], env={**env, "FAKE_NOTIFY_FIFO": "", "FAKE_CONTINUE_FIFO": ""}
        )
        _await_logged(kb, "job.finalized")
    finally:
        if paused:
            client.execute_command("CLIENT", "UNPAUSE")
        client.close()
        for proc in (worker, after, control):
            if proc is not None:
                stop(proc)
        gate.close()
    assert runs.read_text().splitlines() == ["review 1 1", "review 1 2"]  # none run twice
    with db(kb) as conn:
        outcomes = [r[0] for r in conn.execute("SELECT outcome FROM attempts ORDER BY attempt")]
    assert outcomes == ["lost", "finalized"], outcomes


def test_a_sighup_after_a_stop_does_not_make_it_a_restart(kb, tmp_path):
    """Ctrl-C to a foreground worker (a drain while its agent finishes), then its terminal
    closed (SIGHUP): the SIGHUP was taken for a restart, and the worker asked to stop ran
    on with no terminal, taking new messages. A stop asked stays a stop."""
    from .fault.harness import ContinueGate, StartFifo

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + FAST_QUEUE)
    starts, gate = StartFifo(tmp_path / "started"), ContinueGate(tmp_path / "go")
    env = {**os.environ, "FAKE_NOTIFY_FIFO": str(starts.path), "FAKE_CONTINUE_FIFO": str(gate.path)}
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    control = subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([*base, "worker"], env=env, stderr=subprocess.DEVNULL)
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        starts.await_starts(1)
        worker.send_signal(signal.SIGINT)
        _await_logged(kb, "huey.consumer", message="Received SIGINT")
        worker.send_signal(signal.SIGHUP)  # handled as it comes: the drain waits in a join
        gate.open_gate()  # the drained agent ends
        deadline = time.monotonic() + 60
        while worker.poll() is None and time.monotonic() < deadline:
            if any(x["event"] == "worker.restarting" for x in log_lines(kb)):
                break
            time.sleep(0.05)
    finally:
        for proc in (worker, control):
            stop(proc)
        gate.close()
        starts.close()
    assert [x["event"] for x in log_lines(kb) if x["event"] == "worker.restarting"] == []
    assert [x["event"] for x in log_lines(kb) if x["event"] == "worker.started"] == [
        "worker.started"
    ]


def test_a_sighup_after_an_edit_that_broke_the_settings_keeps_them_running(kb, tmp_path):
    """`systemctl reload` (a SIGHUP) after an edit that left reviewq.toml invalid: the
    control and the worker drained (the worker waiting on its agent), exec'd themselves
    and ended at the new program's start ("error: …reviewq.toml: …", exit 2), so the
    service was down for the night (Restart=on-failure failing every 10 s alike). Each now
    reads the file before its drain: refused, the reload is said in one line naming the
    file and the reason, and the process runs on as it was, its agent too."""
    from .fault.harness import ContinueGate, StartFifo

    small_kb(kb, notes=1)
    good = fake_profile(timeout='"600s"') + FAST_QUEUE
    kb.write("reviewq.toml", good)
    starts, gate = StartFifo(tmp_path / "started"), ContinueGate(tmp_path / "go")
    env = {**os.environ, "FAKE_NOTIFY_FIFO": str(starts.path), "FAKE_CONTINUE_FIFO": str(gate.path)}
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    control = subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([*base, "worker"], env=env, stderr=subprocess.DEVNULL)
    opened = False
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        starts.await_starts(1)
        kb.write("reviewq.toml", good + "[queue\n")  # an editor saved half a line
        worker.send_signal(signal.SIGHUP)
        control.send_signal(signal.SIGHUP)
        _await_logged(kb, "worker.reload_refused", timeout=30)
        _await_logged(kb, "control.reload_refused", timeout=30)
        assert worker.poll() is None and control.poll() is None
        gate.open_gate()  # the agent the refused reload left running ends: its job is decided
        opened = True
        _await_logged(kb, "job.finalized", timeout=30)
        kb.write("reviewq.toml", good)
        worker.send_signal(signal.SIGHUP)  # a reload of a good file still restarts
        _await_logged(kb, "worker.started", count=2, timeout=30)
    finally:
        if not opened:
            gate.open_gate()  # a worker draining waits for its agent
        for proc in (worker, control):
            if proc.poll() is None:
                stop(proc)
        gate.close()
        starts.close()
    said = log_lines(kb)
    refused = [x for x in said if x["event"].endswith(".reload_refused")]
    assert {x["process"] for x in refused} == {"control", "worker"}
    for line in refused:
        assert line["level"] == "error" and line["config"] == str(kb.root / "reviewq.toml")
        assert "reviewq.toml" in line["reason"] and "line" in line["reason"]
    assert [x["event"] for x in said if x["event"].endswith(".restarting")] == ["worker.restarting"]
    with db(kb) as conn:
        assert [tuple(r) for r in conn.execute("SELECT status FROM review_jobs")] == [
            ("completed",)
        ]


def _control_taking_sighup(kb) -> subprocess.Popen:  # noqa: ANN001 - the kb fixture
    """A `reviewq control` of the KB, its JSON log on a stderr pipe, once its consumer's
    SIGHUP handler is set (a SIGHUP before it ends the process)."""
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    control = subprocess.Popen([*base, "control"], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not _catches(control.pid, signal.SIGHUP):
        if time.monotonic() > deadline or control.poll() is not None:
            stop(control)
            control.stderr.close()
            raise AssertionError("the control set no SIGHUP handler")
        time.sleep(0.01)
    return control


def test_a_sighup_after_an_edit_naming_a_queue_the_start_refuses_keeps_it_running(kb):
    """The same reload after an edit the file's reading accepts and the command's start
    refuses: `[queue] url` set (§6.6's switch) with its host name mistyped. The check
    before the drain read the file alone, so the control drained, exec'd itself and ended
    at its start ("error: …: the host 'redis-hots.invalid' does not resolve", exit 2),
    though "any error: a command would say" was to refuse the reload. The queue is
    checked as the start checks it."""
    small_kb(kb, notes=1)
    good = fake_profile() + FAST_QUEUE
    kb.write("reviewq.toml", good)
    control = _control_taking_sighup(kb)
    try:
        kb.write("reviewq.toml", good + 'url = "redis://redis-hots.invalid:6379/0"\n')
        control.send_signal(signal.SIGHUP)
        said = _until(control.stderr, "control.reload_refused", "control.restarting")
        assert said == "control.reload_refused"
        assert control.poll() is None
        kb.write("reviewq.toml", good)
        control.send_signal(signal.SIGHUP)  # the file mended: the reload goes through
        assert _until(control.stderr, "control.started") == "control.started"
    finally:
        if control.poll() is None:
            stop(control)
        control.stderr.close()
    (refused,) = [x for x in log_lines(kb) if x["event"] == "control.reload_refused"]
    assert "redis-hots.invalid" in refused["reason"] and "does not resolve" in refused["reason"]


def test_a_sighup_during_a_refused_reloads_check_is_a_reload_of_the_file_as_it_is_then(kb):
    """The check before a reload's drain waits on the queue it names (up to 5 s for a
    reply). A SIGHUP in that time, sent once the file was mended, was dropped with the
    first one's refusal: the control said "fix the file and send SIGHUP again" of a file
    fixed, with that SIGHUP sent, and ran on with its old settings. Here the address
    answers, not as Redis, once the file was mended and the second SIGHUP sent."""
    small_kb(kb, notes=1)
    good = fake_profile() + FAST_QUEUE
    kb.write("reviewq.toml", good)
    listener = socket.create_server(("127.0.0.1", 0))
    asked, answer = threading.Event(), threading.Event()

    def not_redis() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                asked.set()
                answer.wait(30)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    server = threading.Thread(target=not_redis, daemon=True)
    server.start()
    control = _control_taking_sighup(kb)
    try:
        port = listener.getsockname()[1]
        kb.write("reviewq.toml", good + f'url = "redis://127.0.0.1:{port}/0"\n')
        control.send_signal(signal.SIGHUP)
        assert asked.wait(30)  # the check waits for the address's reply
        kb.write("reviewq.toml", good)
        control.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while _sighups_pending(control.pid):  # taken by its handler before the reply
            assert time.monotonic() < deadline
            time.sleep(0.01)
        answer.set()
        said = _until(control.stderr, "control.restarting", "control.reload_refused")
        assert said == "control.restarting"
        assert _until(control.stderr, "control.started") == "control.started"
    finally:
        answer.set()
        listener.close()
        if control.poll() is None:
            stop(control)
        control.stderr.close()
        server.join(timeout=30)


def _sighups_pending(pid: int) -> bool:
    """Whether a SIGHUP waits for the process's handler (its ShdPnd or SigPnd)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return any(
        int(x.split()[1], 16) >> (signal.SIGHUP - 1) & 1
        for x in status.splitlines()
        if x.startswith(("ShdPnd:", "SigPnd:"))
    )


def _catches(pid: int, signum: int) -> bool | None:
    """Whether the process has a handler for ``signum`` (its SigCgt), None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    caught = [x.split()[1] for x in status.splitlines() if x.startswith("SigCgt:")]
    return bool(caught) and bool(int(caught[0], 16) >> (signum - 1) & 1)


@contextlib.contextmanager
def _control_in_its_restart(kb):
    """A control that took a SIGHUP, caught in its restart: the new program runs and has
    not set its handlers yet. Yields the process and the time every wait ends by; after,
    the control is stopped with SIGINT (its exit is its `returncode`)."""
    kb.write("reviewq.toml", FAST_QUEUE)
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    control = subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)
    cmdline = Path(f"/proc/{control.pid}/cmdline")
    try:
        deadline = time.monotonic() + 30
        while not _catches(control.pid, signal.SIGHUP):  # its consumer's handler is set
            assert time.monotonic() < deadline and control.poll() is None, "no handler set"
            time.sleep(0.01)
        control.send_signal(signal.SIGHUP)
        while b"-P" not in cmdline.read_bytes().split(b"\0"):  # the new program runs
            assert time.monotonic() < deadline and control.poll() is None, "no restart"
            time.sleep(0.005)
        yield control, deadline
        while not _catches(control.pid, signal.SIGHUP):  # the restarted consumer's
            assert control.poll() is None, f"the control ended: {control.returncode}"
            assert time.monotonic() < deadline, "the restarted control set no handler"
            time.sleep(0.01)
    finally:
        control.send_signal(signal.SIGINT)
        control.wait(timeout=30)


def test_a_second_sighup_during_the_restart_does_not_end_the_control(kb):
    """`systemctl reload` twice (ExecReload=kill -HUP): the second SIGHUP came while the
    control restarted, in the new program's start before its handlers, and its default
    action ended the process (exit by SIGHUP, which Restart=on-failure takes for a clean
    stop: the service stayed down)."""
    with _control_in_its_restart(kb) as (control, _):
        assert _catches(control.pid, signal.SIGHUP) is False  # its handler is not set yet
        control.send_signal(signal.SIGHUP)
    assert control.returncode == 0
    assert len([x for x in log_lines(kb) if x["event"] == "control.started"]) >= 2


def test_a_control_restarting_keeps_its_lock_across_the_exec(kb):
    """A SIGHUP's restart closed control.lock before the exec: in the new program's start
    (half a second of imports) another control (a cron sweep's) could take it, and the
    restarted one then refused to run ("a control process already runs")."""
    import fcntl

    with (
        _control_in_its_restart(kb) as (control, _),
        open(kb.state / "control.lock", "rb") as other,
        pytest.raises(BlockingIOError),
    ):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert control.returncode == 0
    assert len([x for x in log_lines(kb) if x["event"] == "control.started"]) == 2


def test_a_review_message_the_queue_lost_runs_again_a_lease_later(kb):
    """A message gone from the review queue with no word from a worker (a Redis restarted
    without its data; here deleted) left its attempt 'dispatched' for lease + the
    reviewer's timeout (600 s here). The control process finds the message gone and
    dispatches the job again a lease later."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + FAST_QUEUE)
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    control = subprocess.Popen([*base, "control"], env=env, stderr=subprocess.PIPE, text=True)
    procs = [control]
    # A bound: a control that never logs what is awaited is killed, and its stream ends.
    guard = threading.Timer(90, lambda: [p.kill() for p in procs])
    guard.start()
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        _until(control.stderr, "attempt.dispatched")
        queue = sqlite3.connect(kb.state / "queue" / "review.db")
        with queue:
            assert queue.execute("DELETE FROM task WHERE queue = 'review'").rowcount == 1
        queue.close()
        _until(control.stderr, "attempt.lost")
        procs.append(
            subprocess.Popen([*base, "worker", "--workers", "1"], stderr=subprocess.DEVNULL)
        )
        _until(control.stderr, "job.finalized")
    finally:
        _stop_all(guard, procs)
    with db(kb) as conn:
        rows = conn.execute("SELECT attempt, outcome, reasons FROM attempts ORDER BY attempt")
        outcomes = [(r[0], r[1], json.loads(r[2] or "[]")) for r in rows]
    assert outcomes == [(1, "lost", ["no heartbeat for 2 s"]), (2, "finalized", [])]


def test_a_machine_suspended_with_its_agents_running_accepts_each_outcome_once(kb, tmp_path):
    """The control's machine suspended with its worker and two agents running (modelled
    by SIGSTOP of each process, 3 leases, then SIGCONT: the control first, its worst
    order): the reaper's first look back gave up both attempts, as silent for a lease,
    before the resumed agents could beat; the jobs ran again (paid twice) and the first
    agents were stopped or their outcomes discarded. Now the control says it was away
    and counts the silences from its return: the agents beat, end and are accepted."""
    from .fault.harness import ContinueGate, StartFifo

    small_kb(kb, notes=2)
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + FAST_QUEUE)
    starts, gate = StartFifo(tmp_path / "started"), ContinueGate(tmp_path / "go")
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    env = {
        **os.environ,
        "REVIEWQ_LOG_FORMAT": "json",
        "FAKE_NOTIFY_FIFO": str(starts.path),
        "FAKE_CONTINUE_FIFO": str(gate.path),
    }
    control = subprocess.Popen([*base, "control"], env=env, stderr=subprocess.PIPE)
    worker = subprocess.Popen(
        [*base, "worker", "--workers", "2"], env=env, stderr=subprocess.DEVNULL
    )
    procs, agents = [control, worker], []
    guard = threading.Timer(120, lambda: [p.kill() for p in procs])
    guard.start()
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        agents = [int(line.split()[0]) for line in starts.await_starts(2)]
        for _ in agents:
            _until(control.stderr, "attempt.started")
        stopped = [control.pid, worker.pid, *agents]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(6)  # the suspend itself: three leases
        os.kill(control.pid, signal.SIGCONT)
        assert _until(control.stderr, "control.resumed", "attempt.lost") == "control.resumed"
        for pid in stopped[1:]:
            os.kill(pid, signal.SIGCONT)
        gate.open_gate()
        for _ in agents:
            assert _until(control.stderr, "job.finalized", "attempt.lost") == "job.finalized"
    finally:
        guard.cancel()
        for pid in [control.pid, worker.pid, *agents]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        gate.close()
        for proc in (worker, control):
            stop(proc)
        starts.close()
        _await_exit(agents, timeout=30)
    with db(kb) as conn:
        outcomes = conn.execute("SELECT attempt, outcome FROM attempts").fetchall()
        acc = conn.execute(
            "SELECT count(*), count(DISTINCT note_path || gate_id) FROM acceptance"
        ).fetchone()
    assert [tuple(r) for r in outcomes] == [(1, "finalized")] * 2
    assert tuple(acc) == (2, 2)


def test_control_killed_mid_finalize_leaves_nothing_partial(kb, tmp_path):
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    fifo = make_fifo(tmp_path, "fault")
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    fault_env = {**os.environ, "REVIEWQ_FAULT_FINALIZE_MID_TRANSACTION": str(fifo)}
    control = subprocess.Popen([*base, "control"], env=fault_env, stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([*base, "worker", "--workers", "1"], stderr=subprocess.DEVNULL)
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        # The control process is inside finalize's transaction now.
        assert int(await_fifo(fifo)) == control.pid
        control.kill()
        control.wait()
        with db(kb) as conn:
            assert conn.execute("SELECT count(*) FROM acceptance").fetchone()[0] == 0
            assert (
                conn.execute(
                    "SELECT count(*) FROM review_pairs WHERE decision IS NOT NULL"
                ).fetchone()[0]
                == 0
            )
            assert conn.execute("SELECT status FROM review_jobs").fetchone()[0] == "running"
    finally:
        if control.poll() is None:
            control.kill()
        worker.send_signal(signal.SIGINT)
        worker.wait(timeout=30)
    # A sweep with a new control process finishes the job.
    res = rq(kb, "sweep", "--reviewer", "fake", "frontmatter", "--json")
    assert res.returncode == 0, res.stderr
    with db(kb) as conn:
        assert conn.execute("SELECT status FROM review_jobs").fetchone()[0] == "completed"
        assert conn.execute("SELECT count(*) FROM acceptance").fetchone()[0] == 1
    log_lines(kb)


def test_a_launch_failures_backoff_ends_on_time_not_at_the_next_tick(kb):
    """A job that failed to launch is dispatched again when its backoff ends (5 s by
    default), not at the control's next tick (reaper_seconds, a minute by default): the
    five failures that pause a profile took five minutes, the backoff said nothing."""
    kb.gate("prose/body-check", ["body"])
    kb.note("n0", body="Body.\n")
    kb.write(
        "reviewq.toml",
        fake_profile(command='["/nonexistent/agent-cli"]')
        + "[queue]\nreaper_seconds = 120\nlaunch_backoff_seconds = 0.2\n"
        "launch_failures_before_pause = 3\npoll_seconds = 0.02\n",
    )
    res = rq(kb, "sweep", "--reviewer", "fake", timeout=100)
    assert res.returncode == 1 and "wait on a paused reviewer: fake" in res.stderr, res.stderr
    failed = [e for e in log_lines(kb) if e["event"] == "attempt.launch_failed"]
    assert len(failed) == 3
    first, last = (datetime.fromisoformat(e["timestamp"]) for e in (failed[0], failed[-1]))
    assert (last - first).total_seconds() < 20  # backoffs of 0.2 and 0.4 s, then dispatch


def test_missing_agent_binary_pauses_the_reviewer_burns_no_attempt_and_resume_lifts_it(kb):
    small_kb(kb, notes=4)
    kb.write("reviewq.toml", fake_profile(command='["/nonexistent/agent-cli"]') + FAST_QUEUE)
    res = rq(kb, "sweep", "--reviewer", "fake", "--json")
    assert res.returncode == 1
    out = json.loads(res.stdout)
    assert out["progress"]["waiting_paused"] > 0 and out["failed"] == []
    with db(kb) as conn:
        outcomes = {r[0] for r in conn.execute("SELECT outcome FROM attempts")}
        statuses = {r[0] for r in conn.execute("SELECT status FROM review_jobs")}
        paused = conn.execute(
            "SELECT paused_until FROM reviewer_state WHERE name = 'fake'"
        ).fetchone()[0]
    assert outcomes == {"launch-failure"} and statuses == {"queued"} and paused
    events = log_lines(kb)
    paused_events = [e for e in events if e["event"] == "reviewer.paused"]
    assert paused_events and "could not start" in paused_events[0]["reason"]
    status = json.loads(rq(kb, "status", "--json").stdout)
    assert status["reviewers"]["fake"]["paused_until"] == paused
    # One sentence wherever a person reads it: since when, until when or what command,
    # and why; the sweep's, status's, doctor's, job N's, the report's and its page's.
    (since,) = [e["paused_since"] for e in paused_events]
    assert status["reviewers"]["fake"]["paused_since"] == since
    said = (
        f"reviewer fake is paused since {since[:19]}Z until {paused[:19]}Z (or until reviewq "
        f"resume fake, once the cause is mended): {paused_events[0]['reason']}"
    )
    assert res.stderr.splitlines()[-1].startswith(
        f"error: {out['progress']['waiting_paused']} job(s) wait on a paused reviewer: {said}"
    )
    # status and the report say first how many jobs the pause holds.
    with db(kb) as conn:
        (waiting,) = conn.execute("SELECT count(*) FROM review_jobs").fetchone()
    held = said.replace(
        "reviewer fake is paused", f"{waiting} job(s) wait for reviewer fake, paused"
    )
    assert held in rq(kb, "status").stdout.splitlines()
    assert f"problem: {said}" in rq(kb, "doctor").stdout.splitlines()
    assert f"  waits: {said}" in rq(kb, "job", "1").stdout.splitlines()
    assert f"  {held}" in rq(kb, "report").stdout.splitlines()
    page = page_text(kb.state / "report.html")
    assert (
        str(markupsafe.escape(held)).replace(
            "reviewq resume fake", '<code class="cmd">reviewq resume fake</code>'
        )
        in page
    )
    (listed,) = json.loads(rq(kb, "report", "--json").stdout)["needs_you"]["paused_reviewers"]
    assert (listed["says"], listed["paused_since"]) == (held, since)
    # The agent installed, a person lifts the pause instead of waiting out pause_seconds.
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    assert rq(kb, "sweep", "--reviewer", "fake").returncode == 1  # still paused
    res = rq(kb, "resume", "fake")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(
        f"reviewer fake resumed (it was paused since {since[:19]}Z until {paused[:19]}Z: its agent"
    )
    assert [e["event"] for e in log_lines(kb)].count("reviewer.resumed") == 1
    res = rq(kb, "sweep", "--reviewer", "fake", "--json")
    assert res.returncode == 0, res.stderr
    with db(kb) as conn:
        assert {r[0] for r in conn.execute("SELECT status FROM review_jobs")} == {"completed"}
    with db(kb) as conn:  # two failures in a row, not yet a pause
        conn.execute("UPDATE reviewer_state SET launch_failures = 2 WHERE name = 'fake'")
    assert rq(kb, "resume", "fake").stdout == "reviewer fake is not paused\n"
    with db(kb) as conn:  # and so nothing of it changed
        assert conn.execute("SELECT launch_failures FROM reviewer_state").fetchone()[0] == 2
    res = rq(kb, "resume", "fakee")
    assert res.returncode == 1 and res.stderr.startswith("error: no reviewer profile 'fakee'")


def test_the_story_of_a_job_a_pause_held_holds_the_resume_that_let_it_run(kb):
    """`logs --job N` of a job the pause held said it waited (`waits_for_pause_until`, 15
    minutes on), then had it run at once: the line that says why, the person's `reviewq
    resume`, named no job and was in no job's story."""
    small_kb(kb, notes=2)
    kb.write("reviewq.toml", fake_profile(command='["/nonexistent/agent-cli"]') + FAST_QUEUE)
    assert rq(kb, "sweep", "--reviewer", "fake").returncode == 1  # paused, the jobs queued
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    assert rq(kb, "resume", "fake").returncode == 0
    assert rq(kb, "sweep", "--reviewer", "fake").returncode == 0
    with db(kb) as conn:
        jobs = [r[0] for r in conn.execute("SELECT id FROM review_jobs ORDER BY id")]
    assert len(jobs) > 1
    for job in jobs:
        res = rq(kb, "logs", "--job", str(job), "--json")
        events = [json.loads(line)["event"] for line in res.stdout.splitlines()]
        resumed = events.index("reviewer.resumed")
        # After the failures that held it, before the attempt that ran it.
        assert "attempt.dispatched" in events[:resumed], (job, events)
        assert events[resumed + 1 :].count("attempt.dispatched") == 1, (job, events)


def test_a_lifted_pause_names_the_jobs_it_held_in_a_bounded_line(kb):
    """`reviewer.resumed` named every job the pause held, one id each: a big KB's paused
    night put thousands of ids on one line of `logs`. Named as runs of ids, at most
    RANGES_NAMED of them, the rest counted, each named job's story still holds it."""
    from orchestrator import logs

    small_kb(kb, notes=20)
    kb.write("reviewq.toml", fake_profile(command='["/nonexistent/agent-cli"]') + FAST_QUEUE)
    assert rq(kb, "sweep", "--reviewer", "fake").returncode == 1  # paused, the jobs queued
    with db(kb) as conn:
        held = [r[0] for r in conn.execute("SELECT id FROM review_jobs WHERE status = 'queued'")]
    assert len(held) == 40
    assert rq(kb, "resume", "fake").returncode == 0
    (line,) = [x for x in log_lines(kb) if x["event"] == "reviewer.resumed"]
    assert (line["held"], line["job_ranges"]) == (40, [[min(held), max(held)]]), line
    shown = rq(kb, "logs", "--event", "reviewer.resumed")
    assert len(shown.stdout) < 400, shown.stdout
    story = rq(kb, "logs", "--job", str(max(held)), "--event", "reviewer.")
    assert story.stdout.count("reviewer.resumed") == 1, story.stdout
    # Runs past the first ten are counted, not named.
    apart = list(range(1, 2 * logs.RANGES_NAMED + 6, 2))  # 1, 3, 5, …: a run each
    assert logs.id_ranges(apart) == ([[i, i] for i in apart[: logs.RANGES_NAMED]], 3)
    assert logs.id_ranges([4, 2, 3, 3, 9]) == ([[2, 4], [9, 9]], 0)


def test_a_pause_that_runs_out_says_so_before_its_jobs_run_again(kb, tmp_path):
    """A reviewer paused after its agent failed to start ran its jobs again once the pause
    ran out, and no line said so: the log said `reviewer.paused … paused_until=…`, then the
    held jobs' attempts, and the person reading it could not tell when work went on, nor
    why those jobs ran. A real control and worker; the agent installed during the pause."""
    kb.gate("prose/body-check", ["body"])
    kb.note("n0", body="Body.\n")  # one job: none dispatched beside it runs the new agent
    agent = tmp_path / "agent.py"  # not there yet: python says so, exit 2, a launch failure
    kb.write(
        "reviewq.toml",
        fake_profile(command=json.dumps([sys.executable, str(agent)]))
        + FAST_QUEUE
        + "launch_failures_before_pause = 1\npause_seconds = 2\n",
    )
    with _started_control(kb) as started:
        started.start_worker()
        log = started.control.stderr
        assert rq(kb, "enqueue", "--all-gates", "--reviewer", "fake").returncode == 0
        assert _until(log, "reviewer.paused") == "reviewer.paused"
        shutil.copy(FAKE, agent)
        said = _until(log, "reviewer.pause_ended", "job.finalized")
        assert said == "reviewer.pause_ended"
        assert _until(log, "job.finalized") == "job.finalized"
    lines = log_lines(kb)
    paused = [x for x in lines if x["event"] == "reviewer.paused"]
    ended = [x for x in lines if x["event"] == "reviewer.pause_ended"]
    # Once each pause (the agent copied in late, a second pause has its own end).
    assert len(ended) == len(paused) and ended[0]["paused_until"] == paused[0]["paused_until"]
    assert ended[0]["reviewer"] == "fake" and "failed to start" in ended[0]["reason"], ended
    with db(kb) as conn:
        jobs = [r[0] for r in conn.execute("SELECT id FROM review_jobs ORDER BY id")]
        assert conn.execute("SELECT paused_until FROM reviewer_state").fetchone()[0] is None
    assert ended[0]["held"] == len(jobs) == 1
    # The night's warnings show each pause and its end: its end at info, `--level warning`
    # showed a reviewer paused at 02:10 and nothing after, paused still to its reader.
    graver = rq(kb, "logs", "--level", "warning", "--event", "reviewer.", "--json").stdout
    said = [json.loads(line)["event"] for line in graver.splitlines()]
    assert said == ["reviewer.paused", "reviewer.pause_ended"] * len(paused), said
    for job in jobs:  # in each held job's story, after the wait, before the run
        res = rq(kb, "logs", "--job", str(job), "--json")
        events = [json.loads(line)["event"] for line in res.stdout.splitlines()]
        end = events.index("reviewer.pause_ended")
        assert "attempt.dispatched" in events[:end], (job, events)
        assert "job.finalized" in events[end:], (job, events)


def test_hung_agent_is_killed_at_the_deadline_with_its_group(kb, tmp_path):
    """The agent is a shell that starts its child and writes both pids first thing: the
    fake agent's Python start (~90 ms of CPU, then its child's) outlasted the 1-s deadline
    under load, and the test found no pids file to check."""
    small_kb(kb, notes=1)
    pidfile = tmp_path / "pids"
    hangs = json.dumps(["sh", "-c", 'sleep 3600 & echo "$$ $!" > "$0"; wait', str(pidfile)])
    kb.write(
        "reviewq.toml",
        fake_profile(timeout="1", command=hangs)
        + FAST_QUEUE.replace("[queue]\n", "[queue]\nmax_attempts = 1\n"),
    )
    res = rq(kb, "sweep", "--reviewer", "fake", "frontmatter", "--json")
    assert res.returncode == 1 and "1 job(s) failed" in res.stderr
    for pid in map(int, pidfile.read_text().split()):
        assert process_gone(pid), f"process {pid} survived the deadline"
    with db(kb) as conn:
        a = conn.execute("SELECT outcome, reasons FROM attempts").fetchone()
    assert a[0] == "burned-out" and "deadline" in a[1]


def test_invalid_output_is_retried_with_the_reasons_then_fails(kb, tmp_path):
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    res = rq(kb, "sweep", "--reviewer", "fake", "frontmatter", "--json", env={"FAKE_MODE": "bad"})
    assert res.returncode == 1
    with db(kb) as conn:
        attempts = [
            tuple(r) for r in conn.execute("SELECT attempt, outcome FROM attempts ORDER BY attempt")
        ]
        job_dir = conn.execute("SELECT job_dir FROM review_jobs").fetchone()[0]
    assert attempts == [(1, "invalid-output"), (2, "invalid-output"), (3, "invalid-output")]
    retry_prompt = (kb.state / job_dir / "attempt-2" / "prompt.md").read_text()
    assert retry_prompt.startswith("## Your previous attempt was rejected")
    assert "invalid result line" in retry_prompt and "Verdict: PASS" in retry_prompt
    # The first attempt's prompt is the job's with its own output path (N26).
    assert not (kb.state / job_dir / "attempt-1" / "prompt.md").exists()
    assert "previous attempt" not in (kb.state / job_dir / "prompt.md").read_text()


def test_a_quick_reviewer_turning_slow_has_no_message_wait_past_its_expiry(kb, tmp_path):
    """Stop 32 let a reviewer whose last agent exited 0 in under a second keep three open
    attempts a slot. When its agents turn slow (a model server that stalls), the third
    message of each slot waits behind two runs: with a timeout longer than half a lease
    that passes its expiry (lease / 2 + timeout), and the attempt is dropped unrun and
    given up as "never picked up by a worker", its job a lease and a timeout late. Here
    two quick runs, then runs of 3.6 s against a 6-s expiry.

    A slow run lasts 3.6 s from its start, the fake agent's own run inside them: slept
    before it, its Python's start on a loaded machine (load 10 on 2 cores: over a second)
    came on top and took the run past its 5-s timeout (burned out). A quick run is the
    shell's own: the fake agent's Python start alone took 1.5-2.2 s under a CPU quota, and
    the test skipped in every such run, untried."""
    small_kb(kb, notes=8)
    runs = tmp_path / "runs"
    agent = tmp_path / "agent.sh"
    agent.write_text(
        "start=$(date +%s%N)\n"
        f'echo run >> "{runs}"\n'
        f'n=$(wc -l < "{runs}")\n'
        'if [ "$n" -le 2 ]; then\n'  # the job's one pair, from its one-line MANIFEST.json
        '  read -r m < "$REVIEWQ_JOB_DIR/MANIFEST.json"\n'
        '  note=${m#*\\"note_path\\": \\"}; note=${note%%\\"*}\n'
        '  gate=${m#*\\"gate_path\\": \\"}; gate=${gate%%\\"*}\n'
        '  pair="$note :: $gate"\n'
        "  printf '=== PAIR REVIEW START: %s ===\\nSummary: quick.\\nFindings:\\n- low: none\\n"
        '## Result: PASS\\n=== PAIR REVIEW END: %s ===\\n\' "$pair" "$pair"'
        ' > "$REVIEWQ_OUTPUT_PATH"\n'
        "  exit 0\n"
        "fi\n"
        f'"{sys.executable}" "{FAKE}"\n'
        "code=$?\n"
        "left=$(( (3600000000 - ($(date +%s%N) - start)) / 1000000 ))\n"
        '[ "$left" -gt 0 ] && sleep "$(printf %d.%03d $((left / 1000)) $((left % 1000)))"\n'
        'exit "$code"\n'
    )
    kb.write(
        "reviewq.toml",
        fake_profile(timeout='"5s"', command=f'["sh", "{agent}"]') + FAST_QUEUE,
    )
    res = rq(kb, "sweep", "--reviewer", "fake", "frontmatter", "--workers", "2", "--json")
    assert res.returncode == 0, res.stderr
    events = [e["event"] for e in log_lines(kb)]
    assert "attempt.expired" not in events and "attempt.lost" not in events
    with db(kb) as conn:
        outcomes = [r[0] for r in conn.execute("SELECT outcome FROM attempts")]
    assert outcomes == ["finalized"] * 8
    assert len(runs.read_text().splitlines()) == 8  # each job's agent once
    from orchestrator.control.control import QUICK_S

    exits = sorted(
        (e["timestamp"], e["duration_s"]) for e in log_lines(kb) if e["event"] == "attempt.exited"
    )
    if not all(took < QUICK_S for _, took in exits[:2]):
        # A shell's start can still pass QUICK_S on a machine loaded enough: the reviewer
        # was never quick, so a broken dispatch would pass too.
        pytest.skip(f"the first two runs were not quick on this machine: {exits[:2]}")


def test_burned_out_multi_pair_job_is_split(kb):
    small_kb(kb, notes=1)
    kb.gate("prose/second", ["body"])
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    # The first attempt uses its whole turn budget without output; the one-pair jobs succeed.
    res = rq(
        kb,
        "sweep",
        "--reviewer",
        "fake",
        "prose",
        "--json",
        env={"FAKE_MODE": "multi-nothing", "FAKE_TURNS": "20"},
    )
    assert res.returncode == 0, res.stderr
    with db(kb) as conn:
        jobs = [
            tuple(r)
            for r in conn.execute("SELECT id, status, parent_job_id FROM review_jobs ORDER BY id")
        ]
    assert jobs[0][1] == "split" and [j[1:] for j in jobs[1:]] == [("completed", jobs[0][0])] * 2


@contextlib.contextmanager
def redis_server(folder: Path, *options: str, prefix: tuple[str, ...] = ()):
    """A redis-server of its own on a unix socket in ``folder``; its URL. ``prefix``: the
    command it runs under (``ip netns exec NS``: in a network namespace)."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (CI installs it with apt)")
    sock = folder / "redis.sock"
    proc = subprocess.Popen(
        [
            *dies_with_this_process(),
            *prefix,
            exe,
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--save",
            "",
            "--appendonly",
            "no",
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for line in proc.stdout:  # await the server's own "ready" line, not a timer
            if "ready to accept connections" in line.lower():
                break
        else:
            pytest.fail("redis-server exited before it was ready")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its pipe drained
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def redis_url(tmp_path):
    with redis_server(tmp_path) as url:
        yield url


@contextlib.contextmanager
def stalled_redis(folder: Path, over: str):
    """A redis-server of its own, over ``over`` ("tcp" or "unix"), whose process is
    stopped (SIGSTOP): it takes connections and answers nothing. Its URL; it is let go
    (SIGCONT) on the way out, and ended."""
    import redis

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with redis_server(folder, "--port", str(port)) as sock_url:
        url = f"redis://127.0.0.1:{port}/0" if over == "tcp" else sock_url
        with contextlib.closing(redis.Redis.from_url(url)) as client:
            pid = client.info("server")["process_id"]
        os.kill(pid, signal.SIGSTOP)
        try:
            yield url
        finally:
            os.kill(pid, signal.SIGCONT)


def test_jobs_of_a_profile_added_since_the_control_started_wait_for_its_restart(kb):
    """A profile added to reviewq.toml while the control ran, and `reviewq enqueue
    --reviewer NEW` (which read the file as it is now) queued its jobs: the control, with
    the settings of its start, failed them within a second as "reviewer profile 'new' is
    not configured", a profile the file configures. They now wait, the control says once
    that it must be restarted to run them, and its SIGHUP runs them."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    with _started_control(kb) as started:
        log = started.control.stderr
        added = (
            fake_profile()
            .replace("[reviewers.fake]", "[reviewers.fake2]")
            .replace('partition = "fake"', 'partition = "fake2"')
        )
        kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + added)
        assert rq(kb, "enqueue", "--reviewer", "fake2", "frontmatter").returncode == 0
        said = _until(log, "control.settings_stale", "job.failed")
        assert said == "control.settings_stale"
        started.control.send_signal(signal.SIGHUP)
        started.start_worker()
        assert _until(log, "job.finalized", "job.failed") == "job.finalized"
    stale = [x for x in log_lines(kb) if x["event"] == "control.settings_stale"]
    assert len(stale) == 1 and stale[0]["reviewer"] == "fake2"
    assert stale[0]["config"] == str(kb.root / "reviewq.toml")


def test_status_says_the_jobs_of_a_profile_added_since_the_control_started_wait_for_it(kb):
    """The jobs of a profile added since the control started wait for its restart, said
    once in the control's log: `status` said "reviewer fake2 is active" over them, the
    morning's look at a night that reviewed none of their pairs. It says what they wait
    for until the control is restarted, and no more once it was."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    with _started_control(kb) as started:
        control = started.control
        added = (
            fake_profile()
            .replace("[reviewers.fake]", "[reviewers.fake2]")
            .replace('partition = "fake"', 'partition = "fake2"')
        )
        kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + added)
        assert rq(kb, "enqueue", "--reviewer", "fake2", "frontmatter").returncode == 0
        assert _until(control.stderr, "control.settings_stale", "job.failed") == (
            "control.settings_stale"
        )
        said = rq(kb, "status").stdout
        assert "reviewer fake2 is active" not in said
        (line,) = [x for x in said.splitlines() if "fake2" in x]
        assert line.startswith("1 job(s) wait for reviewer fake2, added to ")
        assert "once restarted" in line and "kill -HUP" in line
        shown = json.loads(rq(kb, "status", "--json").stdout)["reviewers"]["fake2"]
        assert shown["awaits_control_restart"] and shown["jobs_waiting"] == 1
        with contextlib.closing(db(kb)) as conn, conn:  # queued an hour ago: stalled
            conn.execute("UPDATE review_jobs SET created_at = '2000-01-01T00:00:00.000000Z'")
        report = rq(kb, "report").stdout
        (line,) = [x for x in report.splitlines() if x.startswith("  reviewer fake2: ")]
        assert "added to reviewq.toml" in line and "restarted" in line, report
        control.send_signal(signal.SIGHUP)
        assert _until(control.stderr, "control.started") == "control.started"
        assert "reviewer fake2 is active" in rq(kb, "status").stdout


def test_messages_left_in_the_sqlite_queue_are_moved_to_redis_when_the_url_is_set(kb, tmp_path):
    """`[queue] url` set to a Redis while the SQLite queue still held messages (an agent's
    outcome sent after the control stopped): the control on Redis never read
    STATE/queue/control.db, gave the finished attempt up as lost ("no heartbeat") and
    paid its agent again, and nothing said the file held messages. It moves them over."""
    from .fault.harness import ContinueGate, StartFifo

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + FAST_QUEUE)
    starts, gate = StartFifo(tmp_path / "started"), ContinueGate(tmp_path / "go")
    env = {**os.environ, "FAKE_NOTIFY_FIFO": str(starts.path), "FAKE_CONTINUE_FIFO": str(gate.path)}
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    control = subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)
    worker = subprocess.Popen([*base, "worker"], env=env, stderr=subprocess.DEVNULL)
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        starts.await_starts(1)
        stop(control)
        gate.open_gate()  # the agent ends with its review: the outcome waits in control.db
        stop(worker)  # its drain ends once the outcome is sent
    finally:
        for proc in (worker, control):
            if proc.poll() is None:
                stop(proc)
        gate.close()
        starts.close()
    left = sqlite3.connect(kb.state / "queue" / "control.db")
    with left:
        assert left.execute("SELECT count(*) FROM task").fetchone()[0] > 0
    with redis_server(tmp_path) as url:
        kb.write("reviewq.toml", fake_profile(timeout='"600s"') + FAST_QUEUE + f'url = "{url}"\n')
        assert _control_until(base, "job.finalized", "attempt.lost") == "job.finalized"
    with left:
        assert left.execute("SELECT count(*) FROM task").fetchone()[0] == 0
    left.close()
    moved = [x for x in log_lines(kb) if x["event"] == "queue.moved"]
    assert moved and moved[0]["file"] == str(kb.state / "queue" / "control.db")
    with db(kb) as conn:
        assert [tuple(r) for r in conn.execute("SELECT attempt, outcome FROM attempts")] == [
            (1, "finalized")
        ]


def test_a_scheduled_message_moved_to_redis_leaves_the_one_the_control_holds(kb, tmp_path):
    """The move of C9 runs at each tick, beside the control's consumer, and put a
    scheduled message (a failed control task's retry left in control.db) on the Redis
    queue through the control queue's own add_to_schedule, which also releases the
    message the consumer holds: taken off the queue while its task ran, it was lost with
    its outcome to a control killed before that task's commit. Scheduled, at its time,
    and the held message left held."""
    from datetime import UTC, datetime, timedelta

    from orchestrator.config import load_settings
    from workers.queues import huey_for, move_left_behind

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", FAST_QUEUE)
    left = huey_for(load_settings(kb.root), "control")
    due = datetime.now(UTC).replace(tzinfo=None, microsecond=0) + timedelta(minutes=5)
    left.storage.add_to_schedule(b"a retry", due)  # Huey's own, in UTC
    left.storage.conn.close()
    with redis_server(tmp_path) as url:
        kb.write("reviewq.toml", FAST_QUEUE + f'url = "{url}"\n')
        settings = load_settings(kb.root)
        control = huey_for(settings, "control")
        try:
            control.storage.enqueue(b"an outcome")
            assert control.storage.dequeue() == b"an outcome"  # held while its task runs
            move_left_behind(settings, {"control": control})
            storage = control.storage
            assert storage.conn.lrange(storage.held_key, 0, -1) == [b"an outcome"]
            assert storage.scheduled_items() == [b"a retry"]
            assert storage.conn.zscore(storage.schedule_key, b"a retry") == storage.convert_ts(due)
        finally:
            control.storage.conn.close()
            control.storage.pool.disconnect()


def _a_review_left_in_sqlite(kb, tmp_path: Path) -> tuple[Path, list[str]]:  # noqa: ANN001
    """One review message left in the SQLite queue file (as a KB moved to Redis leaves
    it): the fault FIFO a control stops at, and the command line that starts one."""
    from orchestrator.config import load_settings
    from workers.queues import close_huey, huey_for

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", FAST_QUEUE)
    left = huey_for(load_settings(kb.root), "review")
    left.storage.enqueue(b"a review")
    close_huey(left)
    return make_fifo(tmp_path, "fault"), [
        str(Path(sys.executable).parent / "reviewq"),
        "--root",
        str(kb.root),
    ]


def _kill_control_mid_move(base: list[str], fifo: Path) -> None:
    """A control started with ``base``, SIGKILLed at C25's fault point: the message moved
    to Redis is sent and its row's delete not committed."""
    env = {**os.environ, "REVIEWQ_FAULT_QUEUE_MOVE_SENT": str(fifo)}
    control = subprocess.Popen([*base, "control"], env=env, stderr=subprocess.DEVNULL)
    try:
        assert int(await_fifo(fifo)) == control.pid  # sent, its delete not committed
    finally:
        control.kill()
        control.wait()


class _Started:
    """A control of :func:`_started_control`, and the worker started beside it, if any."""

    def __init__(self, control: subprocess.Popen, base: list[str]) -> None:
        self.control, self.base = control, base
        self.worker: subprocess.Popen | None = None

    def start_worker(self) -> None:
        self.worker = subprocess.Popen([*self.base, "worker"], stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def _started_control(kb) -> Iterator[_Started]:  # noqa: ANN001 - a KBBuilder
    """A real control on ``kb`` whose JSON log lines come on its stderr, once it has said
    `control.started`; the worker started beside it (``start_worker``) and the control are
    stopped at the end, the worker first, if they still run."""
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    control = subprocess.Popen([*base, "control"], env=env, stderr=subprocess.PIPE)
    started = _Started(control, base)
    try:
        _until(control.stderr, "control.started")
        yield started
    finally:
        for proc in (started.worker, control):
            if proc is not None and proc.poll() is None:
                stop(proc)
        control.stderr.close()


def _control_until(base: list[str], *events: str) -> str:
    """A control started with ``base`` until its log says one of ``events`` (the one it
    says is returned), then stopped."""
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    control = subprocess.Popen([*base, "control"], env=env, stderr=subprocess.PIPE)
    try:
        return _until(control.stderr, *events)
    finally:
        stop(control)
        control.stderr.close()


def _start_and_stop_control(base: list[str]) -> None:
    """A control started with ``base`` until it has started (its move done), then stopped."""
    assert _control_until(base, "control.started") == "control.started"


def test_a_sweep_counts_the_attempts_it_ran_that_a_control_before_it_dispatched(kb):
    """A control stopped (an upgrade, a crash) after it dispatched an attempt leaves its
    message on the queue; the sweep after it runs that attempt and pays for it, but
    counted an older job's attempts by when they were opened: its summary and its
    `sweep.finished` line said none of them and none of their cost."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    assert _control_until(base, "attempt.dispatched") == "attempt.dispatched"
    res = rq(kb, "sweep", "--reviewer", "fake", "frontmatter", "--json", env={"FAKE_TURNS": "1"})
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["enqueued_jobs"] == 0  # its pairs are the dispatched job's
    assert out["attempts"] == {"finalized": 1} and out["cost_usd"] == 0.01


def test_a_move_killed_between_its_send_and_its_commit_sends_the_message_once(kb, tmp_path):
    """C9's move sent a message to Redis, then committed its delete from the SQLite file:
    a control killed in between left the message in both, and the next control's move
    sent it again (a review run twice, its agent paid twice). The move marks what it
    sent in the script that sends it, and a message found marked is only taken off."""
    from orchestrator.config import load_settings
    from workers.queues import close_huey, huey_for

    fifo, base = _a_review_left_in_sqlite(kb, tmp_path)
    with redis_server(tmp_path) as url:
        kb.write("reviewq.toml", FAST_QUEUE + f'url = "{url}"\n')
        _kill_control_mid_move(base, fifo)
        _start_and_stop_control(base)  # its start's move meets what was left
        review = huey_for(load_settings(kb.root), "review")
        try:
            assert review.storage.conn.lrange(review.storage.queue_key, 0, -1) == [b"a review"]
            assert review.storage.conn.keys("*moved*") == []  # its mark gone with the row
        finally:
            close_huey(review)
    with contextlib.closing(sqlite3.connect(kb.state / "queue" / "review.db")) as conn:
        assert conn.execute("SELECT count(*) FROM task").fetchone()[0] == 0


def test_a_move_killed_before_its_commit_sends_once_though_a_volatile_policy_evicts(kb, tmp_path):
    """C25's mark expired (30 days), so a Redis under a `volatile-*` policy (which
    OPERATIONS §6.6 allows) evicts it first when full: a control killed between the
    move's send and its commit, then Redis full before the next control's move, had the
    message sent again (a review run twice, its agent paid twice). Here the eviction is
    Redis's own: `maxmemory` set below what it uses, and one command."""
    import redis

    from orchestrator.config import load_settings
    from workers.queues import close_huey, huey_for

    fifo, base = _a_review_left_in_sqlite(kb, tmp_path)
    with redis_server(tmp_path, "--maxmemory-policy", "volatile-lru") as url:
        kb.write("reviewq.toml", FAST_QUEUE + f'url = "{url}"\n')
        _kill_control_mid_move(base, fifo)
        with contextlib.closing(redis.Redis.from_url(url)) as client:
            assert client.keys("*moved*")  # the mark C25 left
            client.config_set("maxmemory", 1)  # full: every key it may evict goes
            client.ping()  # a command, before which Redis evicts
            client.config_set("maxmemory", 0)
            evicted = client.info("stats")["evicted_keys"]
        _start_and_stop_control(base)  # its start's move meets what was left
        review = huey_for(load_settings(kb.root), "review")
        try:
            sent = review.storage.conn.lrange(review.storage.queue_key, 0, -1)
            assert sent == [b"a review"], (sent, evicted)
        finally:
            close_huey(review)


def test_two_reads_back_at_the_same_instant_say_the_queue_back_once(kb, tmp_path):
    """The queue is back when every read that failed (Q8) succeeds again: the consumer's
    and the scheduler's, in two threads. Each took its own failure off, then looked
    whether any was left: back at the same instant, each found none, and both said
    `queue.available` and ran the after-outage claim. Held here where they meet."""
    from datetime import datetime

    from orchestrator.config import load_settings
    from workers.queues import close_huey, huey_for

    small_kb(kb, notes=1)
    with redis_server(tmp_path) as url:
        kb.write("reviewq.toml", FAST_QUEUE + f'url = "{url}"\n')
        huey = huey_for(load_settings(kb.root), "review")
    storage = huey.storage
    try:
        assert storage.dequeue() is None  # the server gone: both reads fail
        assert storage.read_schedule(datetime.now()) == []
        meet = threading.Barrier(2, timeout=3)

        class Meeting(dict):
            def pop(self, *args):  # noqa: ANN002, ANN202
                found = super().pop(*args)
                with contextlib.suppress(threading.BrokenBarrierError):
                    meet.wait()  # the other read, back too, takes its own off
                return found

        storage._pauses = Meeting(storage._pauses)
        backs = []
        storage.after_outage = lambda: backs.append(threading.current_thread().name)
        with redis_server(tmp_path):  # the same socket: the server back
            reads = [
                threading.Thread(target=storage.dequeue, name="consumer"),
                threading.Thread(
                    target=storage.read_schedule, args=(datetime.now(),), name="scheduler"
                ),
            ]
            for read in reads:
                read.start()
            for read in reads:
                read.join(timeout=30)
            assert not any(read.is_alive() for read in reads)
        assert len(backs) == 1, backs
    finally:
        close_huey(huey)


def test_a_sweep_beside_a_running_control_is_dispatched_at_once(kb):
    """The sweep uses the control process already running, whose next tick is ten minutes
    away: the sweep asks it to dispatch, so the jobs do not wait for that tick."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + "[queue]\nreaper_seconds = 600\n")
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    control = subprocess.Popen([*base, "control"], stderr=subprocess.PIPE)
    try:
        # Awaited: under load a sweep that looked first started a control of its own, and
        # this one found the state folder held (exit 1) or took it after both sweeps, when
        # the SIGINT below came during its start-up (exit 130).
        _until(control.stderr, "control.started")
        first = rq(kb, "sweep", "--reviewer", "fake", "--json", timeout=60)
        assert first.returncode == 0, first.stderr  # the control's first tick has passed
        kb.note("later", body="Written after the first sweep.\n")
        second = rq(kb, "sweep", "--reviewer", "fake", "--json", timeout=60)
        assert second.returncode == 0, second.stderr
    finally:
        control.send_signal(signal.SIGINT)
        try:
            said = control.communicate(timeout=30)[1].decode(errors="replace")
        except subprocess.TimeoutExpired:
            control.kill()  # not left running past the test
            control.wait()
            raise
    assert json.loads(second.stdout)["jobs"]["fake"]["completed"] == 2
    assert control.returncode == 0, said


def test_sweep_on_redis_with_two_worker_processes(kb, redis_url):
    small_kb(kb, notes=6)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + f'url = "{redis_url}"\n')
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    workers = [
        subprocess.Popen([*base, "worker", "--workers", "2"], stderr=subprocess.DEVNULL)
        for _ in range(2)
    ]
    try:
        res = rq(
            kb,
            "sweep",
            "--reviewer",
            "fake",
            "--workers",
            "0",
            "--json",
            env={"FAKE_MODE": "slow", "FAKE_SLEEP": "0.3"},
        )
    finally:
        for w in workers:
            w.send_signal(signal.SIGINT)
        for w in workers:
            w.wait(timeout=30)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["jobs"]["fake"]["completed"] == 12
    assert not (kb.state / "queue").exists()  # nothing went to SQLite queue files
    started = [e for e in log_lines(kb) if e["event"] == "attempt.started"]
    assert len({e["worker"] for e in started}) == 2  # both worker processes took jobs


def _control_and_a_hanging_worker(
    kb, tmp_path: Path, workers: int = 1, tmp: Path | None = None, agents: dict | None = None
) -> tuple[list[str], Path, subprocess.Popen, subprocess.Popen]:
    """A control and a worker (``--workers``) whose fake agents hang, each saying its
    start on the FIFO returned; ``tmp``, the worker's TMPDIR; ``agents``, more of the
    fake agents' variables. Returns the reviewq argv to start more with, the FIFO, the
    control and the worker."""
    fifo = make_fifo(tmp_path, "started")
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    env = {**os.environ, "FAKE_MODE": "hang", "FAKE_NOTIFY_FIFO": str(fifo), **(agents or {})}
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    control = subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)
    worker = subprocess.Popen(
        [*base, "worker", "--workers", str(workers)], env=env, stderr=subprocess.DEVNULL
    )
    return base, fifo, control, worker


def _sweep_through_a_new_worker(kb, base: list[str]) -> subprocess.CompletedProcess:
    """A sweep with no workers of its own, waiting while a worker started now takes the
    re-enqueued task; that worker is stopped before this returns."""
    worker = subprocess.Popen([*base, "worker", "--workers", "1"], stderr=subprocess.DEVNULL)
    try:
        return rq(kb, "sweep", "--reviewer", "fake", "frontmatter", "--workers", "0", "--json")
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(timeout=30)


def test_sigterm_to_a_worker_requeues_the_interrupted_attempt(kb, tmp_path):
    small_kb(kb, notes=1)
    kb.write(
        "reviewq.toml",
        fake_profile() + FAST_QUEUE.replace("lease_seconds = 2", "lease_seconds = 60"),
    )
    tmp = tmp_path / "tmp"  # the worker's TMPDIR: the agent's own is made in it
    tmp.mkdir()
    base, fifo, control, worker = _control_and_a_hanging_worker(kb, tmp_path, tmp=tmp)
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        agent_pid = int(await_fifo(fifo).split()[0])
        assert len(list(tmp.iterdir())) == 1
        worker.send_signal(signal.SIGTERM)  # Huey's immediate stop: interrupt, re-enqueue
        assert worker.wait(timeout=30) == 0
        # Its exit means its agents ended: it waited for those it killed, and said so.
        # (It once exited right after the SIGKILL, the agent alive for a moment yet.)
        stopped = [e for e in log_lines(kb) if e["event"] == "worker.stopped"]
        agent_gone = process_gone(agent_pid)
        # Its thread never reached the end of the attempt, which removes the agent's
        # TMPDIR: the worker's exit left it in the worker's TMPDIR for good.
        tmp_left = list(tmp.iterdir())
        os.unlink(fifo)
        res = _sweep_through_a_new_worker(kb, base)
    finally:
        for proc in (worker, control):
            stop(proc)
    assert stopped[0]["agents_killed"] == [agent_pid] and stopped[0]["agents_running"] == []
    assert agent_gone, "the interrupted agent was left running"
    assert tmp_left == []
    assert res.returncode == 0, res.stderr
    with db(kb) as conn:
        job = conn.execute("SELECT status, attempt FROM review_jobs").fetchone()
        outcomes = [tuple(r) for r in conn.execute("SELECT attempt, outcome FROM attempts")]
    # The same attempt ran again: no lease had to expire, no attempt was burned.
    assert tuple(job) == ("completed", 1) and outcomes == [(1, "finalized")]
    assert any(e["event"] == "task.interrupted" for e in log_lines(kb))


@pytest.mark.parametrize(
    ("agents", "exit_code"),
    [({}, -signal.SIGINT), ({"FAKE_SIGINT_EXIT": "0"}, 0)],
    ids=["killed", "exits-0-as-claude-does"],
)
def test_a_stop_signal_sent_to_the_agents_too_burns_no_attempt(kb, tmp_path, agents, exit_code):
    """`systemctl stop` of a worker unit with systemd's default KillMode (control-group)
    sends its KillSignal to every process of the unit, the agents too: each agent died
    of it with no output and its attempt was counted (a launch failure toward the
    reviewer's pause in its first 15 s, then no-output, three of which fail the job and
    escalate its pairs). Now the worker puts the task back on the queue, as for a SIGTERM
    of its own, and the same attempt runs again. Claude Code (the pinned CLI, waiting on
    its model) takes the SIGINT as a person's Ctrl-C and exits 0, writing nothing: that
    was still counted, as "exited 0 without writing bundle-output.md"."""
    small_kb(kb, notes=1)
    kb.write(
        "reviewq.toml",
        fake_profile() + FAST_QUEUE.replace("lease_seconds = 2", "lease_seconds = 60"),
    )
    base, fifo, control, worker = _control_and_a_hanging_worker(kb, tmp_path, agents=agents)
    agent_pid = None
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        agent_pid = int(await_fifo(fifo).split()[0])
        worker.send_signal(signal.SIGINT)  # the unit's KillSignal, to its main process
        os.killpg(agent_pid, signal.SIGINT)  # and to the rest of its cgroup
        assert worker.wait(timeout=30) == 0
        os.unlink(fifo)
        res = _sweep_through_a_new_worker(kb, base)
    finally:
        for proc in (worker, control):
            stop(proc)
        if agent_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent_pid, signal.SIGKILL)  # the hang mode's child
    assert res.returncode == 0, res.stderr
    with db(kb) as conn:
        job = conn.execute("SELECT status, attempt FROM review_jobs").fetchone()
        outcomes = [tuple(r) for r in conn.execute("SELECT attempt, outcome FROM attempts")]
    assert tuple(job) == ("completed", 1) and outcomes == [(1, "finalized")]
    abandoned = [e for e in log_lines(kb) if e["event"] == "attempt.abandoned"]
    assert [e["exit_code"] for e in abandoned] == [exit_code]


def test_an_agent_stopped_with_its_worker_at_once_is_queued_again_once(kb, tmp_path):
    """A SIGTERM to a worker unit's every process (systemd's KillSignal with its default
    KillMode, a `kill` of the group): Huey put each task it interrupted back on the queue,
    and the thread of an agent that died of the same signal a moment earlier put its own
    back too. The attempt was queued twice: run again twice, side by side in one folder
    on a worker with two slots, its agent paid twice. Here the queue file is held while
    both try, so neither is over before the other begins."""
    small_kb(kb, notes=1)
    kb.write(
        "reviewq.toml",
        fake_profile() + FAST_QUEUE.replace("lease_seconds = 2", "lease_seconds = 60"),
    )
    base, fifo, control, worker = _control_and_a_hanging_worker(kb, tmp_path)
    agent = queue = None
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        agent = int(await_fifo(fifo).split()[0])
        queue = sqlite3.connect(kb.state / "queue" / "review.db", isolation_level=None)
        queue.execute("BEGIN IMMEDIATE")  # the worker's writes wait (send retries)
        os.killpg(agent, signal.SIGTERM)  # the rest of the cgroup may come first
        _await_exit([agent], timeout=30)
        worker.send_signal(signal.SIGTERM)  # within the second its thread waits for it
        worker_log = kb.state / "worker" / "logs" / "reviewq.jsonl"
        deadline = time.monotonic() + 30
        while not {"attempt.abandoned", "task.interrupted"} <= {
            json.loads(line)["event"] for line in worker_log.read_text().splitlines()
        }:
            assert time.monotonic() < deadline, "the stop did not put the attempt back"
            time.sleep(0.02)
        queue.execute("COMMIT")
        assert worker.wait(timeout=30) == 0
        (queued,) = queue.execute("SELECT count(*) FROM task WHERE queue = 'review'").fetchone()
    finally:
        if queue is not None:
            queue.close()
        for proc in (worker, control):
            stop(proc)
        if agent is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent, signal.SIGKILL)  # the hang mode's child
    assert queued == 1


def test_status_after_a_unit_killed_whole_says_nobody_watches_its_agents(kb, tmp_path):
    """A unit killed whole (control, worker and agents, SIGKILL) leaves its attempts
    running in state.db, and with no control running status said "1 agent(s) running …
    last heard from … ago" as if they ran: only a control hears them, and none does."""
    small_kb(kb, notes=1)
    kb.write(
        "reviewq.toml",
        fake_profile() + FAST_QUEUE.replace("lease_seconds = 2", "lease_seconds = 60"),
    )
    tmp = tmp_path / "tmp"  # the worker's TMPDIR, which its SIGKILL leaves
    tmp.mkdir()
    base, fifo, control, worker = _control_and_a_hanging_worker(kb, tmp_path, tmp=tmp)
    agent_pid = None
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        agent_pid = int(await_fifo(fifo).split()[0])
        _await_logged(kb, "attempt.started")  # logged in the transaction that records it
        deadline = time.monotonic() + 30
        while (watched := json.loads(rq(kb, "status", "--json").stdout))["workers"][
            "agents_running"
        ] != 1:
            assert time.monotonic() < deadline, watched
        guard = guard_of(worker.pid)
        for pid in (control.pid, worker.pid):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):  # the worker's guard may be first
            os.killpg(agent_pid, signal.SIGKILL)
        assert control.wait(timeout=30) == worker.wait(timeout=30) == -signal.SIGKILL
        _await_exit([guard])  # a unit killed whole: its guard too, here by its own end
    finally:
        for proc in (worker, control):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        if agent_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent_pid, signal.SIGKILL)
    out = rq(kb, "status").stdout
    (line,) = [x for x in out.splitlines() if x.startswith("workers:")]
    assert line.startswith("workers: 1 agent(s) were running on "), line
    assert "; last heard from " in line, line
    assert line.endswith(
        "; no control is running, so nobody is watching them: they may have stopped"
    ), line
    data = json.loads(rq(kb, "status", "--json").stdout)
    assert data["control"]["pid"] is None
    assert (data["workers"]["agents_running"], data["workers"]["unwatched"]) == (1, 1)
    assert watched["workers"]["unwatched"] == 0  # what a running control hears is no guess


def test_an_interrupted_attempt_whose_message_expired_leaves_no_folder(kb, tmp_path):
    """A worker stopped with SIGTERM keeps the folder of the attempt it interrupted, for
    the run of it queued again; started again after that message expired, it declined the
    message and the folder (the prompt, quoting notes) stayed in attempts/ for good."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile(timeout='"2s"') + FAST_QUEUE)
    base, fifo, control, worker = _control_and_a_hanging_worker(kb, tmp_path)
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        await_fifo(fifo)
        worker.send_signal(signal.SIGTERM)  # the task goes back on the queue
        assert worker.wait(timeout=30) == 0
        (kept,) = (kb.state / "worker/attempts").glob("job-1-attempt-1-*")  # and its opening
        assert kept.is_dir()
        # The message expires half a lease (1 s) and the timeout (2 s) after its dispatch,
        # before the attempt started; the reaper gives the attempt up about then.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with db(kb) as conn:
                row = conn.execute(
                    "SELECT outcome, started_at FROM attempts WHERE attempt = 1"
                ).fetchone()
            if row["outcome"] not in ("dispatched", "running"):
                break
            time.sleep(0.1)
        started = datetime.fromisoformat(row["started_at"].replace("Z", "+00:00")).timestamp()
        while time.time() < started + 1 + 2 + 0.5:  # bounded: a few seconds at most
            time.sleep(0.1)
        res = _sweep_through_a_new_worker(kb, base)
    finally:
        for proc in (worker, control):
            stop(proc)
    assert res.returncode == 0, res.stderr
    assert any(e["event"] == "attempt.expired" for e in log_lines(kb))
    assert list((kb.state / "worker/attempts").iterdir()) == []


def test_a_worker_started_removes_the_folder_of_an_attempt_a_dead_one_had_not_launched(
    kb, tmp_path
):
    """A worker killed while an attempt waited for an agent slot left its folder, a prompt
    quoting notes, that no registry entry names: the next worker removed only the folder
    of the agent it reaped, and the other stayed for good."""
    small_kb(kb, notes=2)
    profile = fake_profile().replace("concurrency = 2", "concurrency = 1")
    kb.write(
        "reviewq.toml", profile + FAST_QUEUE.replace("lease_seconds = 2", "lease_seconds = 60")
    )
    tmp = tmp_path / "tmp"  # the worker's TMPDIR: the agent's own is made in it
    tmp.mkdir()
    attempts = kb.state / "worker" / "attempts"
    base, fifo, control, worker = _control_and_a_hanging_worker(kb, tmp_path, 2, tmp)
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        agent_pid = int(await_fifo(fifo).split()[0])
        deadline = time.monotonic() + 30
        while len(list(attempts.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # the second attempt's folder, made before it waits for a slot
        assert len(list(attempts.iterdir())) == 2
        guard = guard_of(worker.pid)
        worker.kill()
        worker.wait(timeout=30)
        # Its guard ends the agent it ran (the next worker reaps its folder), and is gone
        # before that worker starts: else the two reaped side by side.
        _await_exit([agent_pid, guard], timeout=30)
        for left in attempts.iterdir():
            os.utime(left, (time.time() - 600, time.time() - 600))  # left ten minutes ago
        worker = subprocess.Popen([*base, "worker", "--workers", "1"], stderr=subprocess.DEVNULL)
        log = kb.state / "worker" / "logs" / "reviewq.jsonl"
        deadline = time.monotonic() + 30
        while log.read_text().count('"worker.started"') < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p.name for p in attempts.iterdir() if p.name.endswith("-attempt-1")] == []
        assert list(tmp.iterdir()) == []  # the reaped agent's TMPDIR went with its folder
    finally:
        for proc in (worker, control):
            stop(proc)
    assert any(e["event"] == "worker.removed_attempt_folders" for e in log_lines(kb))


@pytest.mark.parametrize("redis", [False, True], ids=["sqlite", "redis"])
def test_an_agent_whose_attempt_was_finalized_by_hand_is_stopped(kb, tmp_path, request, redis):
    """A person finalized a job by hand while a worker's agent ran for it: the control
    superseded the attempt and would discard its output, but nothing told the worker,
    and the agent ran on to its deadline (here 600 s; a real one spends its tokens all
    that time). The control answers the attempt's next heartbeat with a stop request."""
    small_kb(kb, notes=1)
    queue = FAST_QUEUE
    if redis:
        url = request.getfixturevalue("redis_url")
        queue = FAST_QUEUE.replace("[queue]\n", f'[queue]\nurl = "{url}"\n')
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + queue)
    fifo, pidfile = make_fifo(tmp_path, "started"), make_fifo(tmp_path, "pids")
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    env = {
        **os.environ,
        "REVIEWQ_LOG_FORMAT": "json",
        "FAKE_MODE": "hang",
        "FAKE_NOTIFY_FIFO": str(fifo),
        "FAKE_PIDFILE": str(pidfile),
    }
    control = subprocess.Popen([*base, "control"], env=env, stderr=subprocess.DEVNULL)
    worker = subprocess.Popen(
        [*base, "worker", "--workers", "1"], env=env, stderr=subprocess.DEVNULL
    )
    agents: list[int] = []
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        agents.append(int(await_fifo(fifo).split()[0]))
        # Its child's too, said after it started it (a file read after the finalize below
        # could be read before the agent wrote it).
        agents += [int(p) for p in await_fifo(pidfile).split()]
        job_dir = kb.state / "jobs" / "review-job-1"
        (pair,) = json.loads((job_dir / "MANIFEST.json").read_text())["pairs"]
        sentinel = f"{pair['note_path']} :: {pair['gate_path']}"
        (job_dir / "bundle-output.md").write_text(
            f"=== PAIR REVIEW START: {sentinel} ===\nSummary: read by a person.\n"
            f"## Result: PASS\n=== PAIR REVIEW END: {sentinel} ===\n"
        )
        res = rq(kb, "finalize", "--review-job-id", "1", "--model", "fake")
        assert res.returncode == 0, res.stderr
        _await_exit(agents, timeout=30)  # a heartbeat is every 0.5 s here
    finally:
        for proc in (worker, control):
            stop(proc)
        for pid in agents:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    lines = log_lines(kb)
    asked = [e for e in lines if e["event"] == "attempt.stop_asked"]
    assert len(asked) == 1 and asked[0]["job_id"] == 1 and asked[0]["attempt"] == 1
    assert "finalized by hand" in asked[0]["reason"]
    assert '"attempt.stopping"' in (kb.state / "worker/logs/reviewq.jsonl").read_text()
    with db(kb) as conn:
        job = conn.execute("SELECT status, attempt FROM review_jobs").fetchone()
        outcome = conn.execute("SELECT outcome FROM attempts").fetchone()[0]
    assert tuple(job) == ("completed", 1) and outcome == "superseded"
    if redis:
        return
    # The request was taken (by the worker, or by the control once the outcome came).
    with sqlite3.connect(kb.state / "queue" / "review.db") as q:
        assert q.execute("SELECT count(*) FROM kv WHERE key LIKE 'reviewq.stop.%'").fetchone() == (
            0,
        )


def test_budget_stops_new_attempts_and_says_so(kb):
    small_kb(kb, notes=12)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    # Every attempt of the fake agent records a cost of $0.01.
    res = rq(
        kb,
        "sweep",
        "--reviewer",
        "fake",
        "frontmatter",
        "--name",
        "nightly",
        "--budget-usd",
        "0.025",
        "--json",
        env={"FAKE_TURNS": "1"},
    )
    assert res.returncode == 1
    out = json.loads(res.stdout)
    waiting = out["progress"]["waiting_budget"]
    assert (
        f"{waiting} job(s) of sweep 'nightly' (run 1) wait: its budget of $0.025 is spent; a "
        "run of that sweep with the same options takes them over (with a new --budget-usd)"
    ) in res.stderr
    # Another run, with no budget, holds none of them: it said the budget was its own.
    res = rq(kb, "sweep", "--reviewer", "fake", "frontmatter", "--grouping", "gate")
    assert res.returncode == 1 and "of sweep 'cli'" not in res.stderr
    assert f"{waiting} job(s) of sweep 'nightly' (run 1) wait" in res.stderr
    assert out["progress"]["waiting_budget"] > 0
    with db(kb) as conn:
        spent = conn.execute("SELECT SUM(cost_usd), count(*) FROM attempts").fetchone()
        queued = conn.execute(
            "SELECT count(*) FROM review_jobs WHERE status = 'queued'"
        ).fetchone()[0]
    # Dispatch stops once the recorded cost reaches the budget (the third attempt), and
    # a run with a budget is not prefetched: only what was running finishes, one more
    # at concurrency 2. Prefetched, three waiting messages started past the budget.
    assert spent[0] == pytest.approx(0.01 * spent[1]) and spent[1] <= 4
    assert queued == 12 - spent[1]
    events = [e for e in log_lines(kb) if e["event"] == "sweep.budget_reached"]
    assert len(events) == 1 and events[0]["sweep"] == "nightly"
    # Said by the pass inside an outcome batch's transaction, it carried the ids of the
    # batch's first message: `reviewq logs --job N` showed it as that job's story.
    assert "job_id" not in events[0] and "attempt" not in events[0], events[0]


def test_cron_fires_a_configured_sweep_once_per_matching_minute(kb):
    from datetime import datetime

    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import cron_fired, due_sweeps

    small_kb(kb, notes=1)
    kb.write(
        "reviewq.toml",
        fake_profile() + '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\nreviewer = "fake"\n',
    )
    ws = Workspace.open(kb.root)

    def at(h: int, m: int, s: int = 0):
        return datetime(2026, 1, 2, h, m, s).astimezone()  # local time, as cron means it

    assert due_sweeps(ws, at(2, 58)) == []  # the first check only starts the clock
    assert [s.name for s in due_sweeps(ws, at(3, 0, 30))] == ["nightly"]
    cron_fired(ws, "nightly", at(3, 0, 30))  # (the tick's enqueue committed)
    assert due_sweeps(ws, at(3, 1)) == []
    ws.close()
    ws = Workspace.open(kb.root)  # a restarted control process does not fire it again
    assert due_sweeps(ws, at(3, 5)) == []
    assert [s.name for s in due_sweeps(ws, datetime(2026, 1, 3, 3, 0, 5).astimezone())] == [
        "nightly"
    ]
    ws.close()


def test_a_control_whose_first_look_falls_in_the_entrys_minute_runs_it_once(kb):
    """A control started at 02:00:10 only started the clock of a new `0 2 * * *` entry:
    that night's sweep never ran. It runs, once: not again by a restarted control, nor
    after a run of the entry by name in that minute."""
    from datetime import datetime

    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import SweepRequest, cron_fired, due_sweeps, enqueue

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 2 * * *"\n')
    ws = Workspace.open(kb.root)

    def at(h: int, m: int, s: int = 0):
        return datetime(2026, 1, 2, h, m, s).astimezone()

    assert [s.name for s in due_sweeps(ws, at(2, 0, 10))] == ["nightly"]
    cron_fired(ws, "nightly", at(2, 0, 10))  # (the tick's enqueue committed)
    ws.close()
    ws = Workspace.open(kb.root)  # restarted in the same minute: not run again
    assert due_sweeps(ws, at(2, 0, 40)) == []
    ws.close()
    # A first look whose enqueue failed (state.db locked): due at the next tick, as any
    # due sweep is, not left for tomorrow because that tick came in the next minute.
    kb.write("reviewq.toml", '[[sweeps]]\nname = "early"\ncron = "0 1 * * *"\n')
    ws = Workspace.open(kb.root)
    assert [s.name for s in due_sweeps(ws, at(1, 0, 50))] == ["early"]
    assert [s.name for s in due_sweeps(ws, at(1, 1, 20))] == ["early"]
    ws.close()
    # A new entry run by name this minute, then a control's first look: not a second run.
    now = datetime.now().astimezone()
    kb.write("reviewq.toml", f'[[sweeps]]\nname = "by-name"\ncron = "{now:%M %H} * * *"\n')
    ws = Workspace.open(kb.root)
    enqueue(ws, SweepRequest.from_config(ws.settings.sweeps["by-name"], ws.root, "cli"))
    assert due_sweeps(ws, now) == []
    ws.close()


def test_a_cron_edited_to_a_time_already_past_is_not_missed_by_a_running_control(kb):
    """The clock stayed where the last run put it: a cron edited at 10:00 to `0 9 * * *`
    (the control restarted to read it) logged sweep.missed, saying no control had looked
    at 09:00, when one had run all along."""
    from datetime import datetime, timedelta

    from orchestrator import logs
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import cron_fired, due_sweeps

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\n')
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)

    def at(d: int, h: int, m: int, s: int = 0):
        return datetime(2026, 1, d, h, m, s).astimezone()

    assert due_sweeps(ws, at(2, 2, 58)) == []
    assert [s.name for s in due_sweeps(ws, at(2, 3, 0, 30))] == ["nightly"]
    cron_fired(ws, "nightly", at(2, 3, 0, 30))
    tick = at(2, 3, 1, 30)
    while tick < at(2, 10, 0):  # the control's ticks, a minute apart
        assert due_sweeps(ws, tick) == []
        tick += timedelta(minutes=1)
    ws.close()
    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 9 * * *"\n')
    ws = Workspace.open(kb.root)
    assert due_sweeps(ws, at(2, 10, 0, 30)) == []
    log = kb.state / "logs/reviewq.jsonl"
    assert not log.exists() or "sweep.missed" not in log.read_text()
    assert [s.name for s in due_sweeps(ws, at(3, 9, 0, 20))] == ["nightly"]
    ws.close()


def test_a_bad_sweeps_entry_is_left_out_and_the_control_runs_the_others(kb):
    """One bad [[sweeps]] entry refused the whole file: a control restarted in the night
    (systemd trying again every 10 s) fired no other sweep and took no agent's outcome
    until a person came. It starts, says which entry it leaves out, and runs the rest."""
    from datetime import datetime

    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import due_sweeps

    small_kb(kb, notes=1)
    kb.write(
        "reviewq.toml",
        '[[sweeps]]\nname = "bad"\ncron = "99 * * * *"\n'
        '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\nbatch_size = 9\n',
    )
    ws = Workspace.open(kb.root)
    assert due_sweeps(ws, datetime(2026, 1, 2, 2, 58).astimezone()) == []
    assert [s.name for s in due_sweeps(ws, datetime(2026, 1, 2, 3, 0, 30).astimezone())] == [
        "nightly"
    ]
    ws.close()
    exe = str(Path(sys.executable).parent / "reviewq")
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    control = subprocess.Popen(
        [exe, "--root", str(kb.root), "control"], env=env, stderr=subprocess.PIPE, text=True
    )
    guard = threading.Timer(60, control.kill)  # one that never says it is killed
    guard.start()
    said: list[dict] = []
    try:
        for line in control.stderr:
            if '"sweep.invalid"' in line or '"sweep.setting_ignored"' in line:
                said.append(json.loads(line))
            if '"huey.consumer"' in line:  # it runs, and takes SIGTERM as a stop from here
                break
        assert control.poll() is None
    finally:
        guard.cancel()
        control.send_signal(signal.SIGTERM)
        control.wait(timeout=60)
    assert [(e["event"], e.get("sweep"), e["level"]) for e in said] == [
        ("sweep.invalid", "bad", "error"),
        ("sweep.setting_ignored", None, "warning"),  # run, but its batch_size is not used
    ]
    assert said[0]["problem"].startswith(f"{kb.root / 'reviewq.toml'} [[sweeps]] 'bad' cron '99")
    assert "[[sweeps]] 'nightly' batch_size: notes per job" in said[1]["problem"]


def test_a_run_missed_while_no_control_ran_is_not_replayed(kb):
    """OPERATIONS §2: a control process down at the sweep's time does not catch up at
    07:00. Before, any run since the last check fired, however long ago."""
    from datetime import UTC, datetime

    from orchestrator import logs
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import cron_fired, due_sweeps

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\n')
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)

    def at(d: int, h: int, m: int):
        return datetime(2026, 1, d, h, m).astimezone()

    assert due_sweeps(ws, at(2, 2, 58)) == []  # the clock starts; then the control stops
    assert due_sweeps(ws, at(2, 7, 0)) == []
    [missed] = [e for e in log_lines(kb) if e["event"] == "sweep.missed"]
    assert missed["sweep"] == "nightly"
    assert missed["at"] == at(2, 3, 0).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    # Not "no control process was running" alone: a control ran while the entry was left
    # out of the settings (a bad [[sweeps]] entry) and then mended says the same.
    assert missed["checked_at"].startswith(at(2, 2, 58).astimezone(UTC).strftime("%Y-%m-%dT%H:%M"))
    assert "or the entry was left out" in missed["reason"]
    assert due_sweeps(ws, at(3, 2, 59)) == []
    # Restarted a few minutes late, it still runs that night's sweep.
    assert [s.name for s in due_sweeps(ws, at(3, 3, 6))] == ["nightly"]
    cron_fired(ws, "nightly", at(3, 3, 6))
    assert due_sweeps(ws, at(3, 3, 7)) == []
    ws.close()
    # Ticks every 15 minutes: a run is due at the first tick after its minute, 14 min late.
    kb.write("reviewq.toml", '[queue]\nreaper_seconds = "15m"\n' + kb.read("reviewq.toml"))
    ws = Workspace.open(kb.root)
    assert due_sweeps(ws, at(4, 2, 59)) == []
    assert [s.name for s in due_sweeps(ws, at(4, 3, 14))] == ["nightly"]
    ws.close()


def test_a_clock_that_ran_ahead_once_does_not_silence_the_sweep(kb):
    """One tick under a clock set a year ahead stored that time as the last check: every
    night after the clock was put right was skipped without a word."""
    from datetime import datetime

    from orchestrator import logs
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import cron_fired, due_sweeps

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\n')
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    assert due_sweeps(ws, datetime(2026, 1, 2, 2, 58).astimezone()) == []
    assert due_sweeps(ws, datetime(2027, 1, 1, 0, 0).astimezone()) == []  # the bad clock
    cron_fired(ws, "nightly", datetime(2027, 1, 1, 0, 0).astimezone())
    assert due_sweeps(ws, datetime(2026, 1, 2, 3, 30).astimezone()) == []  # put right
    assert [s.name for s in due_sweeps(ws, datetime(2026, 1, 3, 3, 0, 5).astimezone())] == [
        "nightly"
    ]
    [said] = [e for e in log_lines(kb) if e["event"] == "sweep.clock_went_back"]
    assert said["sweep"] == "nightly"
    ws.close()


def test_one_sweeps_passing_failure_does_not_keep_the_others_of_its_minute_from_running(
    kb, monkeypatch
):
    """A locked state.db (or a full disk) in one sweep's enqueue was raised at once: the
    sweeps after it in the same minute were not tried, and ten minutes of it later were
    logged as missed 'as no control process was running'."""
    import sqlite3
    from datetime import datetime

    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps import producer

    small_kb(kb, notes=1)
    kb.write(
        "reviewq.toml",
        '[[sweeps]]\nname = "a"\ncron = "0 3 * * *"\n[[sweeps]]\nname = "b"\ncron = "0 3 * * *"\n',
    )
    ws = Workspace.open(kb.root)
    real = producer.enqueue
    tried: list[str] = []

    def enqueue(ws, req, **kwargs):  # noqa: ANN001, ANN003, ANN202
        tried.append(req.name)
        if req.name == "a":
            raise sqlite3.OperationalError("database is locked")
        return real(ws, req, **kwargs)

    monkeypatch.setattr(producer, "enqueue", enqueue)
    assert producer.due_sweeps(ws, datetime(2026, 1, 2, 2, 58).astimezone()) == []
    with pytest.raises(sqlite3.OperationalError):
        producer.enqueue_due_sweeps(ws, datetime(2026, 1, 2, 3, 0, 5).astimezone())
    assert tried == ["a", "b"]
    # b ran; a is still due at the tick that is run again.
    later = datetime(2026, 1, 2, 3, 1).astimezone()
    assert [s.name for s in producer.due_sweeps(ws, later)] == ["a"]
    ws.close()


def test_a_cron_sweep_whose_enqueue_fails_for_a_passing_reason_past_late_still_runs(
    kb, monkeypatch
):
    """A cron enqueue that met a full disk (or a locked state.db) at each tick was tried
    again for ten minutes; then the night was logged as missed, "no control process
    looked at its clock then", by the control that had tried all along, and not run once
    the disk had room."""
    import sqlite3
    from datetime import datetime, timedelta

    from orchestrator import logs
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps import producer

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\n')
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    real = producer.enqueue
    full = [True]

    def enqueue(ws, req, **kwargs):  # noqa: ANN001, ANN003, ANN202
        if full[0]:
            raise sqlite3.OperationalError("database or disk is full")
        return real(ws, req, **kwargs)

    monkeypatch.setattr(producer, "enqueue", enqueue)
    t = datetime(2026, 1, 2, 2, 59, 10).astimezone()
    producer.enqueue_due_sweeps(ws, t)  # the clock starts
    while t < datetime(2026, 1, 2, 3, 25).astimezone():  # full for 25 minutes
        t += timedelta(minutes=1)
        with pytest.raises(sqlite3.OperationalError):
            producer.enqueue_due_sweeps(ws, t)
    full[0] = False
    producer.enqueue_due_sweeps(ws, t + timedelta(minutes=1))
    runs = ws.store.conn.execute("SELECT name, trigger FROM sweep_runs").fetchall()
    ws.close()
    assert [tuple(r) for r in runs] == [("nightly", "cron")]
    assert not [e for e in log_lines(kb) if e["event"] == "sweep.missed"]


@pytest.mark.parametrize("when", ["its clock starts", "its enqueue failed for good"])
def test_a_sweeps_clock_that_meets_a_locked_database_does_not_keep_the_others_from_running(
    kb, monkeypatch, when
):
    """Moving one sweep's cron clock (the first check of a new entry, or after an enqueue
    that failed for good) raised "database is locked" out of the tick at once: the other
    sweeps of that minute were not tried, and ten minutes of it later were logged as
    missed 'as no control process was running'."""
    import sqlite3
    from datetime import datetime

    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps import producer

    small_kb(kb, notes=1)
    kb.write(
        "reviewq.toml",
        '[[sweeps]]\nname = "a"\ncron = "0 3 * * *"\n[[sweeps]]\nname = "b"\ncron = "0 3 * * *"\n',
    )
    ws = Workspace.open(kb.root)
    real_fired, real_enqueue = producer.cron_fired, producer.enqueue

    def locked_for_a(ws, name, now, *not_run):  # noqa: ANN001, ANN002, ANN202
        if name == "a":
            raise sqlite3.OperationalError("database is locked")
        return real_fired(ws, name, now, *not_run)

    def a_fails(ws, req, **kwargs):  # noqa: ANN001, ANN003, ANN202
        if req.name == "a":
            raise ValueError("a mistake that will not pass")
        return real_enqueue(ws, req, **kwargs)

    if when == "its clock starts":  # b's clock started at 02:58; a is new since
        producer.cron_fired(ws, "b", datetime(2026, 1, 2, 2, 58).astimezone())
    else:
        assert producer.due_sweeps(ws, datetime(2026, 1, 2, 2, 58).astimezone()) == []
        monkeypatch.setattr(producer, "enqueue", a_fails)
    monkeypatch.setattr(producer, "cron_fired", locked_for_a)
    with pytest.raises(sqlite3.OperationalError):
        producer.enqueue_due_sweeps(ws, datetime(2026, 1, 2, 3, 0, 5).astimezone())
    runs = ws.store.conn.execute("SELECT name FROM sweep_runs").fetchall()
    assert [r[0] for r in runs] == ["b"]
    ws.close()


def test_a_control_killed_right_after_a_cron_enqueue_does_not_enqueue_that_minute_again(
    kb, monkeypatch
):
    """The cron clock moved in a transaction of its own after the enqueue's: a control
    process killed between the two had the sweep's run and jobs on record and its clock
    not moved, and the one restarted in the same minutes ran the sweep again (a second
    run, and its own budget to spend on what the first left)."""
    from datetime import datetime

    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps import producer

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\n')
    ws = Workspace.open(kb.root)
    real = producer.enqueue

    def killed_once_done(*args, **kwargs):  # noqa: ANN202
        real(*args, **kwargs)
        raise KeyboardInterrupt  # SIGKILL's stand-in: nothing after the enqueue runs

    assert producer.due_sweeps(ws, datetime(2026, 1, 2, 2, 58).astimezone()) == []
    monkeypatch.setattr(producer, "enqueue", killed_once_done)
    with pytest.raises(KeyboardInterrupt):
        producer.enqueue_due_sweeps(ws, datetime(2026, 1, 2, 3, 0, 5).astimezone())
    ws.close()
    monkeypatch.setattr(producer, "enqueue", real)
    ws = Workspace.open(kb.root)  # the control restarted a minute later
    producer.enqueue_due_sweeps(ws, datetime(2026, 1, 2, 3, 1, 5).astimezone())
    runs = ws.store.conn.execute("SELECT name, trigger FROM sweep_runs").fetchall()
    assert [tuple(r) for r in runs] == [("nightly", "cron")]
    ws.close()


def test_an_entry_removed_then_added_again_is_not_said_missed_for_its_time_away(kb):
    """An entry taken out of reviewq.toml for some nights (or its cron taken out, the
    system's cron running it by name) and put back: the control that ran all along said
    the night it came back "was missed: no control process looked at its clock then",
    in `status` and in the report's "needs you", of a time no entry named. An entry only
    left out as wrong keeps its clock: mended, its missed night is said."""
    from datetime import datetime

    from orchestrator import logs
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import cron_fired, due_sweeps, sweeps_not_run

    small_kb(kb, notes=1)
    other = '[[sweeps]]\nname = "summer"\ncron = "0 4 1 7 *"\n'
    nightly = '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\n'

    def at(d: int, h: int, m: int, s: int = 0):
        return datetime(2026, 1, d, h, m, s).astimezone()

    def control(config: str, *times: datetime) -> list[str]:  # a control's looks
        kb.write("reviewq.toml", config)
        ws = Workspace.open(kb.root)
        logs.configure(ws.state_dir)
        fired = []
        for t in times:
            for sweep in due_sweeps(ws, t):
                fired.append(sweep.name)
                cron_fired(ws, sweep.name, t)
        said = [n["sweep"] for n in sweeps_not_run(ws.store, ws.settings)]
        ws.close()
        return fired + said

    assert control(other + nightly, at(2, 2, 58), at(2, 3, 0, 30)) == ["nightly"]
    for gone in (other, other + '[[sweeps]]\nname = "nightly"\n'):  # removed; its cron only
        assert control(gone, at(2, 10, 0), at(4, 10, 0)) == []
        assert control(other + nightly, at(4, 10, 0, 30), at(5, 3, 0, 30)) == ["nightly"]
    log = kb.state / "logs/reviewq.jsonl"
    assert "sweep.missed" not in log.read_text()
    # Left out as wrong (its cron mistyped) while its night passed: that one is said.
    bad = other + nightly.replace("0 3 * * *", "0 3 * * * *")
    assert control(bad, at(5, 10, 0), at(6, 10, 0)) == []
    assert control(other + nightly, at(6, 10, 0, 30)) == ["nightly"]


def test_a_day_field_with_a_star_must_match_with_the_other_as_in_cron5(kb):
    """`0 3 */2 * 1-5` is odd days that are weekdays in cron(5); croniter's default read
    either, and it fired on weekends too."""
    from datetime import datetime

    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import cron_fired, due_sweeps

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "n"\ncron = "0 3 */2 * 1-5"\n')
    ws = Workspace.open(kb.root)
    assert due_sweeps(ws, datetime(2026, 2, 28, 23, 0).astimezone()) == []  # the clock starts
    fired = []
    for day in range(1, 15):  # Sunday 1 March to Saturday 14, a tick at each 03:00:30
        t = datetime(2026, 3, day, 3, 0, 30).astimezone()
        if due_sweeps(ws, t):
            fired.append(t.strftime("%a %d"))
            cron_fired(ws, "n", t)
    ws.close()
    assert fired == ["Tue 03", "Thu 05", "Mon 09", "Wed 11", "Fri 13"]


@pytest.mark.parametrize(
    ("cron", "fires"),
    [
        ("@daily", ["Sun 01 00:00", "Mon 02 00:00"]),
        ("@weekly", ["Sun 01 00:00"]),
        ("@hourly", [f"Sun 01 {h:02d}:00" for h in range(24)] + ["Mon 02 00:00"]),
    ],
)
def test_a_cron_nickname_of_cron5_fires_as_its_fields_do(kb, cron, fires):
    """`cron = "@daily"`, cron(5)'s own spelling, left the entry out ("expected five
    fields"): a nightly sweep that never ran, said only as a warning line."""
    from datetime import datetime, timedelta

    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import cron_fired, due_sweeps

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", f'[[sweeps]]\nname = "n"\ncron = "{cron}"\n')
    ws = Workspace.open(kb.root)
    assert list(ws.settings.sweeps) == ["n"] and ws.settings.sweeps_left_out == {}
    t = datetime(2026, 2, 28, 23, 55, 30).astimezone()
    assert due_sweeps(ws, t) == []  # the clock starts
    fired = []
    while t < datetime(2026, 3, 2, 0, 30).astimezone():  # a tick a minute, to Monday 00:30
        t += timedelta(minutes=1)
        if due_sweeps(ws, t):
            fired.append(t.strftime("%a %d %H:%M"))
            cron_fired(ws, "n", t)
    ws.close()
    assert fired == fires


def test_a_configured_sweeps_notes_are_roots_and_notes_named_with_it_make_it_ad_hoc(kb, tmp_path):
    """The notes of a [[sweeps]] entry were read from the working folder (a control
    started elsewhere failed every night, on paths `doctor` found fine); and `--name
    NIGHTLY --note X` was refused, though OPERATIONS §2 makes it an ad-hoc sweep."""
    small_kb(kb, notes=2)
    kb.write(
        "reviewq.toml",
        fake_profile()
        + '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\nreviewer = "fake"\n'
        + 'notes = ["kb/notes/n0.md"]\n',
    )
    elsewhere = tmp_path / "elsewhere"  # another checkout, holding the same paths
    (elsewhere / "kb" / "notes").mkdir(parents=True)
    (elsewhere / "kb" / "notes" / "n0.md").write_text("---\ntitle: Other\n---\nOther.\n")
    res = reviewq_process("--root", str(kb.root), "enqueue", "--name", "nightly", cwd=elsewhere)
    assert res.returncode == 0, res.stderr
    res = reviewq_process(
        "--root", str(kb.root), "enqueue", "--name", "nightly", "--reviewer", "fake",
        "--note", "kb/notes/n1.md", "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    with db(kb) as conn:
        runs = conn.execute("SELECT name, options FROM sweep_runs ORDER BY id").fetchall()
    assert [(name, json.loads(o)["notes"]) for name, o in runs] == [
        ("nightly", ["kb/notes/n0.md"]),
        ("nightly", ["kb/notes/n1.md"]),
    ]


def test_an_hour_the_autumn_change_repeats_fires_a_sweep_once(kb, new_york):
    from datetime import UTC, datetime

    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import cron_fired, due_sweeps

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "n"\ncron = "30 1 * * *"\n')
    ws = Workspace.open(kb.root)

    def utc(h: int, m: int):
        return datetime(2026, 11, 1, h, m, 30, tzinfo=UTC)

    assert due_sweeps(ws, utc(4, 0)) == []  # 00:00 EDT: the clock starts
    assert [s.name for s in due_sweeps(ws, utc(5, 30))] == ["n"]  # 01:30 EDT
    cron_fired(ws, "n", utc(5, 30))
    assert due_sweeps(ws, utc(5, 45)) == []
    assert due_sweeps(ws, utc(6, 0)) == []  # 01:00 again, now EST: the wall clock went back
    assert due_sweeps(ws, utc(6, 30)) == []  # 01:30 again
    assert due_sweeps(ws, utc(6, 45)) == []
    ws.close()


@pytest.mark.parametrize(
    ("cron", "fires"),
    [
        # cron(8)'s wildcard entries: run by the clock as it reads again (an hour between).
        ("0 * * * *", ["00:00 EDT", "01:00 EDT", "01:00 EST", "02:00 EST", "03:00 EST"]),
        ("*/30 1 * * *", ["01:00 EDT", "01:30 EDT", "01:00 EST", "01:30 EST"]),
        ("30 1 * * *", ["01:30 EDT"]),  # a fixed time: once
    ],
)
def test_an_hour_the_autumn_change_repeats_runs_wildcard_crons_in_both_readings(
    kb, new_york, cron, fires
):
    """An hourly sweep took each wall time of the repeated hour at its first reading: the
    second 01:00 never ran, two hours between its runs, where cron(8) runs it hourly."""
    from datetime import UTC, datetime, timedelta

    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import cron_fired, due_sweeps

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", f'[[sweeps]]\nname = "n"\ncron = "{cron}"\n')
    ws = Workspace.open(kb.root)
    t = datetime(2026, 11, 1, 3, 59, 30, tzinfo=UTC)  # 23:59:30 EDT, a tick a minute
    assert due_sweeps(ws, t) == []  # the clock starts
    fired = []
    while t < datetime(2026, 11, 1, 8, 30, tzinfo=UTC):  # until 03:30 EST
        t += timedelta(minutes=1)
        if due_sweeps(ws, t):
            fired.append(t.astimezone().strftime("%H:%M %Z"))
            cron_fired(ws, "n", t)
    ws.close()
    assert fired == fires


def test_a_time_the_spring_change_skips_still_fires_once(kb, new_york):
    """On 2026-03-08 New York's clocks go from 02:00 EST to 03:00 EDT: the wall clock never
    shows 02:30. The sweep was read as due an hour earlier than 03:00, so at 03:00 it was
    past LATE: logged as missed (blaming a stopped control) and not run that night. cron(8)
    runs it at 03:00."""
    from datetime import UTC, datetime, timedelta

    from orchestrator import logs
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import cron_fired, due_sweeps

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "n"\ncron = "30 2 * * *"\n')
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    t = datetime(2026, 3, 8, 5, 0, 30, tzinfo=UTC)  # 00:00:30 EST, a control running all night
    assert due_sweeps(ws, t) == []  # the clock starts
    fired = []
    while t < datetime(2026, 3, 8, 8, 0, tzinfo=UTC):  # until 04:00 EDT, a tick a minute
        t += timedelta(minutes=1)
        if due_sweeps(ws, t):
            fired.append(t.astimezone().strftime("%H:%M %Z"))
            cron_fired(ws, "n", t)
    ws.close()
    assert fired == ["03:00 EDT"]
    said = log_lines(kb) if (ws.state_dir / "logs" / "reviewq.jsonl").exists() else []
    assert not [e for e in said if e["event"] == "sweep.missed"]


def test_a_configured_sweep_runs_by_name(kb):
    small_kb(kb, notes=2)
    kb.write(
        "reviewq.toml",
        fake_profile()
        + FAST_QUEUE
        + '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\nselect = ["prose"]\nreviewer = "fake"\n',
    )
    res = rq(kb, "sweep", "--name", "nightly", "--json")
    assert res.returncode == 0, res.stderr
    with db(kb) as conn:
        lenses = {r[0] for r in conn.execute("SELECT lens FROM review_jobs")}
        runs = [tuple(r) for r in conn.execute("SELECT name, trigger FROM sweep_runs")]
    assert lenses == {"prose"} and runs == [("nightly", "sweep")]


@pytest.mark.parametrize("option", [("--fix",), ("--reviewer", "offline"), ("--grouping", "gate")])
def test_an_option_a_configured_sweep_would_ignore_is_refused(kb, run_cli, option):
    small_kb(kb, notes=1)
    kb.write(
        "reviewq.toml",
        fake_profile() + '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\nreviewer = "fake"\n',
    )
    res = run_cli("enqueue", "--name", "nightly", *option)
    assert (res.exit_code, res.stderr) == (
        1,
        f"error: {option[0]}: sweep 'nightly' runs as reviewq.toml configures it; "
        "change it there, or name the gates to run an ad-hoc sweep\n",
    )
    assert not (kb.state / "state.db").exists()  # refused before anything was written


def test_a_name_no_sweep_has_is_refused_when_it_would_mean_every_gate(kb, run_cli):
    """A mistyped `--name nightley` queued every gate of the catalog as an ad-hoc sweep."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + '[[sweeps]]\nname = "nightly"\nreviewer = "fake"\n')
    res = run_cli("enqueue", "--name", "nightley", "--reviewer", "fake")
    assert (res.exit_code, res.stderr) == (
        1,
        "error: --name nightley: no [[sweeps]] entry of that name (configured: nightly); "
        "name gates, --all-gates or --note to run an ad-hoc sweep under it\n",
    )
    assert not (kb.state / "state.db").exists()
    res = run_cli("enqueue", "--name", "adhoc", "--reviewer", "fake", "--all-gates")
    assert res.exit_code == 0, res.stderr
    res = run_cli(
        "enqueue", "--name", "adhoc", "--reviewer", "fake", "--note", str(kb.root / "kb/notes")
    )
    assert res.exit_code == 0, res.stderr  # notes named: every gate on them, as before


@pytest.mark.parametrize("over", ["tcp", "unix"])
def test_enqueue_beside_a_redis_that_answers_nothing_keeps_the_jobs_and_ends(kb, over):
    """A Redis that takes connections and answers nothing (stopped, `CLIENT PAUSE ...
    ALL`): the queue's connections have no read timeout, so that a worker or control
    waits a stall out, and `enqueue`'s dispatch nudge, which is to give up at once (the
    control's next tick dispatches), waited with them for good: over TCP, and over a
    unix socket since K80. A cron's enqueue never ended."""
    small_kb(kb)
    with stalled_redis(kb.root.parent, over) as url:
        kb.write("reviewq.toml", fake_profile() + f'[queue]\nurl = "{url}"\n')
        try:
            res = rq(kb, "enqueue", "--reviewer", "fake", timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail("enqueue still waited on the stalled Redis at 90 s")
    assert res.returncode == 0, res.stderr
    queued = int(res.stdout.split()[1])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: could not nudge"), res.stderr
    with db(kb) as conn:
        rows = conn.execute("SELECT count(*) FROM review_jobs WHERE status = 'queued'").fetchone()
    assert queued > 0 and rows[0] == queued


@pytest.mark.parametrize("down", ["refused", "unanswered"])
def test_enqueue_with_the_queue_down_keeps_the_jobs_and_says_so_in_one_line(kb, down):
    """A person enqueues while Redis is down: the jobs are recorded in state.db (the
    control's next tick dispatches them), and the command says so within seconds, in one
    line, instead of retrying its dispatch nudge for two minutes with log lines on stderr.
    "unanswered": a host that drops connections (a full accept queue drops the SYNs),
    where a connect without a timeout waits out the kernel's SYN retries (~2 min)."""
    small_kb(kb)
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(socket.socket())
        srv.bind(("127.0.0.1", 0))
        port = srv.getsockname()[1]
        # Refused: bound and not listening, kept so (a port closed again may be taken
        # by a test of another pytest-xdist process).
        if down == "unanswered":
            srv.listen(0)
            filler = stack.enter_context(socket.socket())
            filler.connect(("127.0.0.1", port))  # fills the queue; it is never accepted
        kb.write("reviewq.toml", fake_profile() + f'[queue]\nurl = "redis://127.0.0.1:{port}/0"\n')
        res = rq(kb, "enqueue", "--reviewer", "fake", timeout=40)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("queued "), res.stdout
    queued = int(res.stdout.split()[1])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: could not nudge"), res.stderr
    assert "next tick" in lines[0]
    with db(kb) as conn:
        rows = conn.execute("SELECT count(*) FROM review_jobs WHERE status = 'queued'").fetchone()
    assert queued > 0 and rows[0] == queued


@pytest.mark.parametrize("queue", ["control", "review"])
def test_a_corrupt_queue_file_is_named_in_one_line_and_no_job_is_made(kb, queue):
    """A queue file that is not a database was an 'internal error: DatabaseError' naming
    no file, and a sweep enqueued its jobs, then restarted each child four times."""
    small_kb(kb)
    kb.write("reviewq.toml", fake_profile())
    path = kb.state / "queue" / f"{queue}.db"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a database " * 300)
    expected = f"error: {path}: file is not a database. The file holds queue messages only"
    for args in (["control"], ["worker"], ["sweep", "--reviewer", "fake"]):
        res = rq(kb, *args, timeout=60)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 1 and len(lines) == 1, (args, res.stderr)
        assert lines[0].startswith(expected), (args, lines)
    with db(kb) as conn:
        assert conn.execute("SELECT count(*) FROM review_jobs").fetchone()[0] == 0


@pytest.mark.parametrize("what", ["a link to a disk not mounted", "a file"])
def test_a_queue_folder_that_is_not_a_folder_is_named_in_one_line(kb, what):
    """STATE/queue a link to a folder on a disk that is not mounted (or a file): control,
    worker and sweep ended in "internal error: FileExistsError ... (please report it)",
    and doctor said "queue backend: [Errno 17] File exists", neither what is wrong nor
    what to do."""
    small_kb(kb)
    kb.write("reviewq.toml", fake_profile())
    folder = kb.state / "queue"
    folder.parent.mkdir(parents=True)
    if what == "a file":
        folder.write_text("x\n")
        why = "a file"
    else:
        folder.symlink_to(kb.root / "unmounted" / "queue")
        why = f"a link to {kb.root / 'unmounted' / 'queue'}, which is not there"
    expected = (
        f"{folder}: not a folder ({why}); reviewq keeps its SQLite queues in it: "
        "mount or make what it links to, or move it aside"
    )
    for args in (["control"], ["worker"], ["sweep", "--reviewer", "fake"], ["doctor"]):
        res = rq(kb, *args, timeout=60)
        assert res.returncode == 1, (args, res.stderr)
        if args == ["doctor"]:
            assert f"problem: queue backend: {expected}\n" in res.stdout, res.stdout
        else:
            assert res.stderr.strip().splitlines() == [f"error: {expected}"], (args, res.stderr)
    assert not (kb.root / "unmounted").exists()


def test_a_control_on_another_programs_state_folder_makes_nothing_there(kb, tmp_path):
    """`control --state` naming another program's folder (its SQLite file also called
    state.db): refused as U1 refuses it, but only once the control had taken
    control.lock and made queue/ with its two databases in that folder, as `doctor` did
    before U7."""
    small_kb(kb)
    other = tmp_path / "otherapp"
    other.mkdir()
    with contextlib.closing(sqlite3.connect(other / "state.db")) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.commit()
    res = rq(kb, "--state", str(other), "control", timeout=60)
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: {other / 'state.db'}: a SQLite database without reviewq's tables (users): "
        "not reviewq's state.db, and left as it is (is --state right?)"
    )
    assert not any((other / n).exists() for n in ("queue", "control.lock", "state.db-wal"))


def test_a_worker_kb_without_kb_folder_is_refused(kb, tmp_path):
    res = rq(kb, "worker", "--kb", str(kb.root / "kb"))
    assert (res.returncode, res.stderr) == (
        1,
        f"error: --kb {kb.root / 'kb'}: no kb/ folder in it; give the KB root, the folder "
        "that holds kb/\n",
    )


def test_a_redis_server_that_cannot_hold_control_messages_is_refused_in_one_line(kb, tmp_path):
    """Holding a control message takes BLMOVE (Redis 6.2): an older server answered
    "unknown command" at every read, the control queue never ran, and doctor said the
    queue answered. A server with them renamed away stands in for an old one."""
    small_kb(kb)
    renamed = ("--rename-command", "BLMOVE", "", "--rename-command", "LMOVE", "")
    with redis_server(tmp_path, *renamed) as url:
        kb.write("reviewq.toml", fake_profile() + f'[queue]\nurl = "{url}"\n')
        control = rq(kb, "control", timeout=60)
        doctor = rq(kb, "doctor", timeout=60)
    expected = (
        f"{kb.root / 'reviewq.toml'} [queue] url {url}: the Redis server lacks BLMOVE and "
        "LMOVE, which the control queue needs (Redis 6.2 or later)"
    )
    assert (control.returncode, control.stderr) == (1, f"error: {expected}\n")
    assert doctor.returncode == 1 and f"problem: queue backend: {expected}" in doctor.stdout


def test_a_redis_that_takes_no_message_as_large_as_an_outcome_is_refused_in_one_line(kb, tmp_path):
    """A Redis whose `proto-max-bulk-len` is under an outcome's size (an output of up to
    `max_output_bytes`, its logs' tails and telemetry) closes the connection on each send
    of a larger one: taken for an outage, the outcome was retried for an hour as "Broken
    pipe", its attempt kept alive by its beats, then dropped and the agent run again."""
    small_kb(kb)
    with redis_server(tmp_path, "--proto-max-bulk-len", "2mb") as url:
        kb.write("reviewq.toml", fake_profile() + f'[queue]\nurl = "{url}"\n')
        control = rq(kb, "control", timeout=60)
        doctor = rq(kb, "doctor", timeout=60)
        home = tmp_path / "remote"
        home.mkdir()
        (home / "worker.toml").write_text(fake_profile() + f'[queue]\nurl = "{url}"\n')
        worker = reviewq_process(
            "--config", str(home / "worker.toml"), "--state", str(home / "state"), "worker",
            timeout=60,
        )  # fmt: skip
        kb.write(
            "reviewq.toml",
            fake_profile() + f'[queue]\nurl = "{url}"\n[limits]\nmax_output_bytes = 524288\n',
        )
        smaller = rq(kb, "doctor", timeout=60)
    said = (
        f"{kb.root / 'reviewq.toml'} [queue] url {url}: the Redis server takes no message over "
        "2097152 bytes (its proto-max-bulk-len), and an agent's outcome may be 6488064"
    )
    assert control.returncode == 1 and control.stderr.startswith(f"error: {said}"), control.stderr
    assert len(control.stderr.splitlines()) == 1
    assert (
        "CONFIG SET proto-max-bulk-len" in control.stderr and "max_output_bytes" in control.stderr
    )
    assert doctor.returncode == 1 and f"problem: queue backend: {said}" in doctor.stdout
    assert worker.returncode == 1 and "2097152 bytes (its proto-max-bulk-len)" in worker.stderr
    assert "proto-max-bulk-len" not in smaller.stdout, smaller.stdout  # 1.7 MiB fits


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "volatile-lru", "noeviction"])
def test_a_redis_that_evicts_any_key_is_named_by_doctor_and_the_control(kb, tmp_path, policy):
    """A Redis shared as a cache (maxmemory, an allkeys-* policy) evicts the queue's keys
    once full, each holding every message of its queue (seen: 20 review messages gone at
    once, after another application's 818 writes to a 4 MB Redis): the reviews ran again
    a lease later and outcomes were lost, their runs paid again, and neither doctor nor
    the control said a word. A volatile-* policy never evicts the queues' keys (they have
    no expiry). The words said reviewq's keys never expire: the control's claim does."""
    small_kb(kb, notes=1)
    options = ("--maxmemory", "64mb", "--maxmemory-policy", policy)
    with redis_server(tmp_path, *options) as url:
        kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + f'url = "{url}"\n')
        doctor = rq(kb, "doctor", timeout=60)
        sweep = rq(kb, "sweep", "--reviewer", "fake", "--json", timeout=90)
    assert doctor.returncode == 0 and sweep.returncode == 0, (doctor.stdout, sweep.stderr)
    said = [line for line in doctor.stdout.splitlines() if "evicts any key" in line]
    evicting = [r for r in log_lines(kb) if r["event"] == "queue.evicting"]
    if policy.startswith("allkeys-"):
        where = f"{kb.root / 'reviewq.toml'} [queue] url {url}: "
        assert said == [f"warning: {where}{said[0].partition(where)[2]}"], doctor.stdout
        assert f"maxmemory-policy {policy}" in said[0] and "noeviction" in said[0], said
        assert "keys never expire" not in said[0] and "claim" in said[0], said
        assert [r["reason"] for r in evicting] == [said[0].removeprefix("warning: ")]
    else:
        assert said == [] and evicting == [], (doctor.stdout, evicting)


def test_the_controls_doctor_on_one_machine_with_redis_says_a_missing_cli_as_a_problem(
    kb, tmp_path
):
    """S11 made what the control's machine lacks for a reviewer a warning on any Redis
    queue, for workers all on other machines. On one machine with Redis (the Procfile's
    worker beside the control, a sweep's) the agents run here: doctor said `warning:`
    and exit 0 of a CLI not on PATH, and the next sweep's every attempt was a launch
    failure that paused the profile. Once a worker beside the control has started on
    this queue, it is a problem again."""
    small_kb(kb, notes=1)
    missing = '[reviewers.far]\nkind = "command"\ncommand = ["no-such-agent"]\npartition = "fake"\n'
    with redis_server(tmp_path) as url:
        kb.write("reviewq.toml", fake_profile() + missing + FAST_QUEUE + f'url = "{url}"\n')
        before = rq(kb, "doctor", timeout=60)  # nothing has run here yet: no worker known
        sweep = rq(kb, "sweep", "--reviewer", "fake", "--workers", "1", "--json", timeout=90)
        after = rq(kb, "doctor", timeout=60)
    assert sweep.returncode == 0, sweep.stderr
    said = "reviewer far (command): no-such-agent not on PATH"
    assert before.returncode == 0, before.stdout
    assert [x for x in before.stdout.splitlines() if said in x][0].startswith("warning: ")
    assert after.returncode == 1, after.stdout
    assert f"problem: {said}" in after.stdout.splitlines(), after.stdout


def test_the_controls_doctor_on_redis_says_another_programs_state_db_once(kb, tmp_path):
    """Looking for a worker of this host in state.db, doctor on a Redis control opened a
    state.db it had just said was another program's again, and ended in an internal
    error instead of its problem lines."""
    small_kb(kb, notes=1)
    other = tmp_path / "otherapp"
    other.mkdir()
    with contextlib.closing(sqlite3.connect(other / "state.db")) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
        conn.commit()
    (other / "control.lock").touch()
    with redis_server(tmp_path) as url:
        kb.write("reviewq.toml", fake_profile() + f'[queue]\nurl = "{url}"\n')
        res = rq(kb, "--state", str(other), "doctor", timeout=60)
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stderr == "error: 1 problem(s)\n", res.stderr
    (said,) = [x for x in res.stdout.splitlines() if x.startswith("problem: ")]
    assert "a SQLite database without reviewq's tables (users)" in said, said


def test_status_says_a_shared_redis_database_while_the_control_that_said_it_runs(kb, tmp_path):
    """S12's `status` read the control's `queue.shared` line from its log's last MiB: once
    logrotate emptied the log (copytruncate) or a night's lines pushed it out, `status`
    said "control: running" and nothing else while the two controls went on sharing; and
    `status --json` gave a stopped control's line as `control.shared`, its pid null."""
    import redis

    small_kb(kb, notes=1)
    other = tmp_path / "other-site"  # a second KB given the same database by mistake
    shutil.copytree(kb.root / "kb", other / "kb")
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, root: Path) -> subprocess.Popen:
        procs[name] = subprocess.Popen(
            [str(Path(sys.executable).parent / "reviewq"), "--root", str(root), "control"],
            stderr=subprocess.PIPE,
        )
        return procs[name]

    def stop(name: str) -> None:
        procs[name].send_signal(signal.SIGINT)
        assert procs.pop(name).wait(timeout=30) == 0

    def status(*args: str) -> subprocess.CompletedProcess:
        res = rq(kb, "status", *args, timeout=60)
        assert res.returncode == 0, res.stderr
        return res

    with redis_server(tmp_path) as url:
        toml = f'[queue]\nurl = "{url}"\nreaper_seconds = 0.5\n'
        kb.write("reviewq.toml", toml)
        (other / "reviewq.toml").write_text(toml)
        try:
            mine = start("mine", kb.root)
            _until(mine.stderr, "control.started")
            # Started beside a running control, the second is refused (its own test); it
            # shares the database when it started while the first was away past its claim
            # (its machine suspended; here SIGSTOP).
            mine.send_signal(signal.SIGSTOP)
            with contextlib.closing(redis.Redis.from_url(url)) as client:
                deadline = time.monotonic() + 30
                while client.exists("reviewq.control.claim"):
                    assert time.monotonic() < deadline, "the claim never lapsed"
                    time.sleep(0.1)
                _until(start("theirs", other).stderr, "control.started")
            mine.send_signal(signal.SIGCONT)
            _until(mine.stderr, "queue.shared")
            log = kb.state / "logs" / "reviewq.jsonl"
            shutil.copy(log, log.with_name("reviewq.jsonl.1"))  # logrotate's copytruncate
            os.truncate(log, 0)
            (said,) = [x for x in status().stdout.splitlines() if x.startswith("queue shared")]
            assert f"state folder {other / '.reviewq'}" in said, said
            # The command it names reads the rotated copy the line is now in.
            hint = said.rsplit("(reviewq ", 1)[1].split(";")[0].split()
            shown = rq(kb, *hint, timeout=60)
            assert shown.returncode == 0 and "queue.shared" in shown.stdout, (hint, shown)
            stop("mine")
            gone = json.loads(status("--json").stdout)["control"]
            assert (gone["pid"], gone["shared"], gone["zone"]) == (None, None, None)
            stop("theirs")
            # Started again alone: the previous run's line is not this one's.
            mine = start("mine", kb.root)
            _until(mine.stderr, "control.started")
            data = json.loads(status("--json").stdout)["control"]
            assert (data["pid"], data["shared"]) == (mine.pid, None), data
        finally:
            for proc in procs.values():
                proc.kill()
                proc.wait(timeout=30)


def test_a_transaction_a_failover_aborted_is_an_outage_waited_out(tmp_path):
    """A primary made a replica between a transaction's commands and its EXEC (the
    control's release of the message it ran: LREM and HDEL, a batch's LREMs; a message
    larger than the server reads at once leaves that gap) answers EXECABORT "because of:
    READONLY", a plain ResponseError: the release raised it, its retry did not wait, and
    Huey logged a traceback (the 1-in-16 `error huey` of
    test_a_redis_that_refuses_writes_mid_sweep_is_waited_out[demoted])."""
    import redis

    from workers import queues

    with redis_server(tmp_path) as url:
        storage = queues.RedisQueueStorage(
            "reviewq-control", holds=True, connection_pool=queues.redis_pool(url)
        )
        pool = storage.conn.connection_pool
        conn = pool.get_connection()
        with contextlib.closing(redis.Redis.from_url(url)) as admin:
            for command in (("MULTI",), ("LREM", storage.held_key, 1, "m"), ("HDEL", "h", "m")):
                conn.send_command(*command)
                conn.read_response()
            admin.replicaof("127.0.0.1", "1")
            conn.send_command("EXEC")
            try:
                with pytest.raises(queues.QUEUE_UNAVAILABLE, match="READONLY"):
                    conn.read_response()
            finally:
                admin.replicaof("NO", "ONE")
            pool.release(conn)
            # Closed: the next command opens a connection afresh, to the primary.
            assert storage.conn.lpush(storage.queue_key, b"m") == 1
        pool.disconnect()


def test_a_control_started_before_redis_waits_for_it(kb, refused_port):
    """The check of the Redis server's commands met a refused connection at start-up and
    exited ("internal error: ConnectionError"): a control started before Redis at boot
    crash-looped. It waits for the queue, as the consumer always has. Meanwhile `status`
    said "control: running" and nothing of the queue (it reads state.db), exit 0: it says
    the queue is out of reach."""
    small_kb(kb)
    port = refused_port
    kb.write("reviewq.toml", fake_profile() + f'[queue]\nurl = "redis://127.0.0.1:{port}/0"\n')
    exe = Path(sys.executable).parent / "reviewq"
    proc = subprocess.Popen(
        [str(exe), "--root", str(kb.root), "control"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    watchdog = threading.Timer(60, proc.kill)  # a control that says nothing fails, not hangs
    watchdog.start()
    seen = []
    try:
        for line in proc.stderr:  # until it says it waits, or exits
            seen.append(line)
            if "queue.unavailable" in line:
                break
        assert proc.poll() is None, seen
        said = rq(kb, "status", timeout=60)
    finally:
        watchdog.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert any("queue.unavailable" in line for line in seen), seen
    assert not any("internal error" in line for line in seen), seen
    down = [x for x in said.stdout.splitlines() if x.startswith("queue: out of reach, said at ")]
    assert down and "reviewq doctor" in down[0], said.stdout


def _sweep_in_background(kb, env: dict) -> subprocess.Popen:
    """``reviewq sweep --reviewer fake frontmatter`` running, in a session of its own."""
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root), "sweep",
         "--reviewer", "fake", "frontmatter"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip


def _kill_session(sweep: subprocess.Popen) -> None:
    """A background sweep and every process of its session gone, whatever the test asserted."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sweep.pid, signal.SIGKILL)
    sweep.wait()


def _ended_or_explained(sweep: subprocess.Popen, kb, timeout: float) -> tuple[str, str]:
    """``sweep.communicate(timeout)``; past it, an AssertionError that says where each
    process of the sweep's session waits: its state and signal masks, each thread's
    kernel wait, and each thread's Python stack (a reviewq process writes them to its
    stderr on SIGUSR1: the sweep's comes here, its children's go to their files)."""
    try:
        return sweep.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    said = [f"the sweep had not ended {timeout:g} s on; its session:"]
    for pid in _session(sweep.pid):
        said.append(_where_it_waits(pid))
        if _handles(pid, signal.SIGUSR1):  # no other process of it: SIGUSR1 would kill it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
    try:  # the sweep's stacks, and a bound on the wait for the children's
        _, err = sweep.communicate(timeout=5)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr
    said.append("sweep stderr:\n" + (err.decode() if isinstance(err, bytes) else err or ""))
    for child in ("control", "worker"):
        path = kb.state / "logs" / f"sweep-{child}.stderr"
        if path.exists():
            said.append(f"{path.name}:\n" + path.read_text(errors="replace")[-20_000:])
    raise AssertionError("\n".join(said))


def _session(sid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry.name)) == sid:
                    found.append(int(entry.name))
    return found


def _handles(pid: int, signum: int) -> bool:
    """Whether the process has a handler for ``signum`` (its SigCgt mask)."""
    with contextlib.suppress(OSError, StopIteration, ValueError):
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        caught = next(line for line in status if line.startswith("SigCgt:")).split()[1]
        return bool(int(caught, 16) >> (signum - 1) & 1)
    return False


def _where_it_waits(pid: int) -> str:
    """A process's command, state, signal masks and each thread's state and kernel wait."""
    proc = Path(f"/proc/{pid}")
    try:
        argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        keep = ("State:", "SigPnd:", "ShdPnd:", "SigBlk:", "SigIgn:", "SigCgt:")
        status = [x for x in (proc / "status").read_text().splitlines() if x.startswith(keep)]
        threads = []
        for task in sorted(os.scandir(proc / "task"), key=lambda e: int(e.name)):
            stat = Path(task.path, "stat").read_text()
            name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()[0]  # fmt: skip
            threads.append(f"{task.name} {name} {state} {Path(task.path, 'wchan').read_text()}")
    except OSError as exc:
        return f"  {pid}: gone ({exc})"
    return f"  {pid}: {argv}\n    " + " ".join(status) + "\n    " + "\n    ".join(threads)


def _await_exit(pids: list[int], timeout: float = 60) -> None:
    """Wait for processes that are not this one's children to end (pidfds)."""
    fds = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds.append(os.pidfd_open(pid))
    try:
        for fd in fds:
            assert ready_within(fd, timeout), f"a process outlived its sweep by {timeout} s"
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize(
    "sig",
    [(signal.SIGTERM,), (signal.SIGTERM, signal.SIGTERM), (signal.SIGKILL,)],
    ids=["SIGTERM", "SIGTERM-twice", "SIGKILL"],
)
def test_a_sweep_that_is_stopped_or_killed_takes_its_control_and_worker_along(kb, tmp_path, sig):
    """`kill PID` (a closed terminal, a cancelled CI job) ended the sweep alone: its
    control and worker, reparented to init, went on running agents unwatched."""
    small_kb(kb, notes=1)
    # A lease long enough that the next sweep's reaper, on a loaded machine, does not take
    # the interrupted attempt for lost before its worker has started and taken it again.
    queue = FAST_QUEUE.replace("lease_seconds = 2\n", "lease_seconds = 60\n")
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + queue)
    fifo = make_fifo(tmp_path, "started")
    env = {**os.environ, "FAKE_MODE": "hang", "FAKE_NOTIFY_FIFO": str(fifo)}
    sweep = _sweep_in_background(kb, env)
    agent = worker = control = None
    try:
        agent, worker, _ = map(int, await_fifo(fifo).split())  # the agent runs
        control = int((kb.state / "control.lock").read_text())
        sweep.send_signal(sig[0])
        if len(sig) > 1:  # the second once its worker is gone: it stops, then sums up
            _await_exit([worker])
            sweep.send_signal(sig[1])
        _, err = sweep.communicate(timeout=60)
        if sig[0] == signal.SIGTERM:
            assert sweep.returncode == 130 and "error: interrupted" in err, err
        _await_exit([worker, control])  # at once for SIGTERM: the sweep stopped them
        assert process_gone(agent), "the agent outlived its worker"
    finally:
        _kill_session(sweep)
        for pid in (agent, worker, control):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    # The interrupted attempt was put back on the queue: the next sweep runs it, unburned.
    os.unlink(fifo)
    res = rq(kb, "sweep", "--reviewer", "fake", "frontmatter")
    assert res.returncode == 0, res.stderr
    with db(kb) as conn:
        job = conn.execute("SELECT status, attempt FROM review_jobs").fetchone()
    assert tuple(job) == ("completed", 1)


def _start_control(kb, env: dict, owner: str) -> tuple[subprocess.Popen, int]:
    """A control process for the KB, as a service runs it or as a sweep's child (under a
    parent whose argv says ``sweep``); returns the process to wait for and the control's
    pid, once it holds the state folder."""
    exe = str(Path(sys.executable).parent / "reviewq")
    argv = [exe, "--root", str(kb.root), "control"]
    if owner == "sweep":
        argv = [sys.executable, "-c", "import subprocess, sys; subprocess.call(sys.argv[2:])",
                "sweep", *argv]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # the lock is held once it says so
        if '"control.started"' in line:
            return proc, int((kb.state / "control.lock").read_text())
    raise AssertionError(f"the control did not start: {proc.wait()}")


def test_a_sweep_whose_borrowed_control_goes_with_its_sweep_starts_its_own(kb, tmp_path):
    """A sweep uses a control process already running. When another sweep's stopped with
    that sweep, this one waited for good: nothing took its outcomes."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    started, go = make_fifo(tmp_path, "started"), make_fifo(tmp_path, "go")
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    procs: list[subprocess.Popen] = []
    sweep = None
    try:
        control, pid = _start_control(kb, env, "sweep")
        procs.append(control)
        agent_env = {**env, "FAKE_NOTIFY_FIFO": str(started), "FAKE_CONTINUE_FIFO": str(go)}
        sweep = _sweep_in_background(kb, agent_env)
        await_fifo(started)  # the agent runs, dispatched by the borrowed control
        os.kill(pid, signal.SIGINT)
        assert control.wait(timeout=30) == 0
        with open(go, "w") as f:
            f.write("go")
        _, err = sweep.communicate(timeout=60)
        assert sweep.returncode == 0, err
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=30)
        if sweep is not None:
            _kill_session(sweep)
    with db(kb) as conn:
        assert conn.execute("SELECT status FROM review_jobs").fetchone()[0] == "completed"


def test_a_sweep_whose_control_lost_the_race_for_the_lock_uses_the_winner(kb):
    """Two sweeps started together both started a control; the loser's exit ('a control
    process already runs') was counted as a crash, and that sweep exited 1 four restarts
    later while the other one did its work."""
    from orchestrator.state.workspace import Workspace
    from workers.sweep import Children

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    exe = str(Path(sys.executable).parent / "reviewq")
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    winner = subprocess.Popen(
        [exe, "--root", str(kb.root), "control"], env=env, stderr=subprocess.PIPE, text=True
    )
    ws = Workspace.open(kb.root)
    children = Children(ws, workers=0)
    try:
        for line in winner.stderr:
            if '"control.started"' in line:
                break
        children._spawn("control")  # as if it started a moment before the winner's lock
        assert children.procs["control"].wait(timeout=30) == 1
        children.check()
        assert "control" not in children.procs and children.restarts["control"] == 0
        assert children.failed == []
    finally:
        children.stop()
        winner.send_signal(signal.SIGINT)
        winner.wait(timeout=30)
        ws.close()


def test_a_sweep_run_from_a_folder_holding_an_orchestrator_package_runs_its_own(kb, tmp_path):
    """`python -m orchestrator` put the working folder first on sys.path: from an older
    checkout's folder the children were that checkout (or any code named so)."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    impostor = tmp_path / "cwd" / "orchestrator"
    impostor.mkdir(parents=True)
    (impostor / "__init__.py").write_text("")
    (impostor / "__main__.py").write_text("raise SystemExit('this is ./orchestrator')\n")
    res = reviewq_process(
        "--root", str(kb.root), "sweep", "--reviewer", "fake", "frontmatter", cwd=impostor.parent
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("ran_s", [0.0, 600.0], ids=["crash-loop", "long-night"])
def test_only_a_childs_crash_loop_fails_the_sweep(kb, ran_s):
    """Every death of a sweep's child counted toward the four that fail the sweep, however
    long it ran before: four unrelated ones over a long night (an OOM kill, a lost
    Redis) failed it. A child that ran STABLE_S before it died starts its count again."""
    from orchestrator.state.workspace import Workspace
    from workers.sweep import Children

    small_kb(kb, notes=1)
    ws = Workspace.open(kb.root)
    children = Children(ws, workers=1)
    children.specs["worker"] = [sys.executable, "-c", "raise SystemExit(3)"]
    children.STABLE_S = 600.0
    try:
        children._spawn("worker")
        for _ in range(6):  # each death restarts it, until the sweep gives up
            assert children.procs["worker"].wait(timeout=30) == 3
            children.started_at["worker"] -= ran_s  # it ran that long
            children.check()
            if children.failed:
                break
        assert bool(children.failed) is (ran_s == 0.0), children.failed
    finally:
        children.stop()
        ws.close()


def _a_sweeps_children_and_a_hanging_agent(kb, tmp_path, monkeypatch):
    """A one-note KB whose fake agent hangs for its 600 s and says on a FIFO that it
    started, and a sweep's children for one worker, not started yet: (workspace,
    children, the FIFO)."""
    from orchestrator.state.workspace import Workspace
    from workers.sweep import Children

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + FAST_QUEUE)
    fifo = make_fifo(tmp_path, "started")
    monkeypatch.setenv("FAKE_MODE", "hang")
    monkeypatch.setenv("FAKE_NOTIFY_FIFO", str(fifo))
    ws = Workspace.open(kb.root)
    return ws, Children(ws, workers=1), fifo


def test_a_sweep_that_gives_up_on_its_worker_kills_the_agents_it_left(kb, tmp_path, monkeypatch):
    """A worker that died a fourth time was not restarted, and its agent ran on unwatched
    to its timeout: only a next worker on the host kills a dead one's agents. The worker's
    guard (K93) ends them as well; it is held stopped until the agent has ended, so that
    what ended it can only be the sweep."""
    ws, children, fifo = _a_sweeps_children_and_a_hanging_agent(kb, tmp_path, monkeypatch)
    agent = guard = None
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        children.start()
        agent, worker, _ = map(int, await_fifo(fifo).split())
        guard = guard_of(worker)
        os.kill(guard, signal.SIGSTOP)
        children.restarts["worker"] = 3  # three deaths already, in a row
        os.kill(worker, signal.SIGKILL)
        children.procs["worker"].wait(timeout=30)
        children.check()
        assert children.failed and "worker" not in children.procs
        _await_exit([agent], timeout=10)  # killed: it hangs for an hour otherwise
    finally:
        if guard is not None:
            os.kill(guard, signal.SIGCONT)
        children.stop()
        ws.close()
        if agent is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent, signal.SIGKILL)
    _await_exit([guard])  # which says the death in the worker's log, then ends


@pytest.mark.parametrize("owner", ["sweep", "service"])
def test_a_gone_control_is_replaced_by_the_sweep_only_if_it_was_another_sweeps(kb, owner):
    """Replacing a service's control that stopped (a crash, a planned stop) took the state
    folder from it: its restart by systemd failed 'already runs' while the sweep lasted."""
    from orchestrator.state.workspace import Workspace
    from workers.sweep import Children

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    control, pid = _start_control(kb, env, owner)
    ws = Workspace.open(kb.root)
    children = Children(ws, workers=0)
    try:
        children.start()
        assert children.procs == {}  # borrowed
        os.kill(pid, signal.SIGINT)  # (before Huey's handlers are in: KeyboardInterrupt, 130)
        assert control.wait(timeout=30) in (0, 130)
        children.BORROWED_GRACE_S = 0.0  # the service did not come back in time
        children.check()
        assert ("control" in children.procs) is (owner == "sweep")
        children.check()  # ... and the sweep says so rather than wait for good
        assert bool(children.failed) is (owner == "service"), children.failed
    finally:
        children.stop()
        if control.poll() is None:
            control.kill()
            control.wait()
        ws.close()


def test_a_kb_holding_a_workers_package_runs_reviewqs_own_agents(kb):
    """The offline and openai agents run as `python -m workers.…` in the KB root, which
    `-m` put first on sys.path: a `workers` package there was run instead (a launch
    failure each time, and any code in a KB folder run by the worker)."""
    small_kb(kb, notes=1)
    kb.write("workers/__init__.py", "")
    kb.write(
        "workers/offline_agent.py", "raise SystemExit('this is the KB root workers package')\n"
    )
    res = rq(kb, "sweep", "--reviewer", "offline", "frontmatter")
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("first", ["tick", "dispatch"], ids=["tick-first", "tick-second"])
def test_a_tick_waiting_ahead_of_heartbeats_reaps_no_live_attempt(kb, tmp_path, first):
    """The control was down longer than a lease while an agent ran: a tick at the head of
    its queue reaped the attempt as silent, with the worker's heartbeats waiting right
    behind it; its agent ran a second time. First of the restarted control's messages, the
    tick runs alone and leaves the reaping to the next; second, it takes them first."""
    from orchestrator.control import messages
    from orchestrator.state.workspace import Workspace
    from workers.app import make_app
    from workers.queues import send

    small_kb(kb, notes=1)
    # A long lease: the worker's own heartbeats (every lease/4) stay out of the way.
    queue = FAST_QUEUE.replace("lease_seconds = 2", "lease_seconds = 60")
    kb.write("reviewq.toml", fake_profile() + queue)
    started, go = make_fifo(tmp_path, "started"), make_fifo(tmp_path, "go")
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    agent_env = {**env, "FAKE_NOTIFY_FIFO": str(started), "FAKE_CONTINUE_FIFO": str(go)}
    exe = str(Path(sys.executable).parent / "reviewq")
    worker = subprocess.Popen(
        [exe, "--root", str(kb.root), "worker", "--workers", "1"],
        env=agent_env,
        stderr=subprocess.DEVNULL,
    )
    procs = [worker]
    try:
        control, pid = _start_control(kb, env, "service")
        procs.append(control)
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        _, _, attempt = map(int, await_fifo(started).split())
        os.kill(pid, signal.SIGKILL)  # the control goes away...
        control.wait(timeout=30)
        with db(kb) as conn:  # ... for longer than a lease, its last heartbeat long ago
            conn.execute("UPDATE attempts SET heartbeat_at = '2000-01-01T00:00:00.000Z'")
        ws = Workspace.open(kb.root)
        make_app(ws.settings)
        if first == "dispatch":
            send("dispatch")  # the restarted control's first message, run alone
        send("tick")  # ahead of the heartbeat the worker sent meanwhile
        beat = {"v": messages.VERSION, "job_id": 1, "attempt": attempt, "worker": "w",
                "host": "h", "launched": False}  # fmt: skip
        send("attempt_heartbeat", beat)
        ws.close()
        procs.append(_start_control(kb, env, "service")[0])
        with open(go, "w") as f:  # the agent ends
            f.write("go")
        res = rq(kb, "sweep", "--reviewer", "fake", "frontmatter", "--workers", "0")
        assert res.returncode == 0, res.stderr
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=30)
    with db(kb) as conn:
        outcomes = [tuple(r) for r in conn.execute("SELECT attempt, outcome FROM attempts")]
    assert outcomes == [(1, "finalized")]


def test_a_busy_control_queue_does_not_hold_up_the_agents_deadline(kb, tmp_path):
    """The worker's heartbeat waited out a busy queue (two minutes at most) inside the
    loop that watches the agent: its exit and its deadline went unnoticed as long.

    The agent says it runs as the shell it is launched as, before Python starts: the
    fake agent's own start (~90 ms of CPU) outlasted the 1-s deadline under load, and
    an agent killed before it said so failed the test ("nothing was written")."""
    small_kb(kb, notes=1)
    started = make_fifo(tmp_path, "started")
    says_it_runs = json.dumps(
        ["sh", "-c", 'echo $$ > "$0" && exec "$1" "$2"', str(started), sys.executable, str(FAKE)]
    )
    kb.write("reviewq.toml", fake_profile(timeout='"1s"', command=says_it_runs) + FAST_QUEUE)
    env = {**os.environ, "FAKE_MODE": "hang"}
    exe = str(Path(sys.executable).parent / "reviewq")
    base = [exe, "--root", str(kb.root)]
    control = subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)
    worker = subprocess.Popen(
        [*base, "worker", "--workers", "1"], env=env, stderr=subprocess.DEVNULL
    )
    lock = None
    agent = None
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        agent = int(await_fifo(started).split()[0])
        lock = sqlite3.connect(kb.state / "queue" / "control.db", timeout=30)
        lock.execute("BEGIN EXCLUSIVE")  # no heartbeat gets through now
        _await_exit([agent], timeout=20)  # the 1-s deadline, kept
    finally:
        if lock is not None:
            lock.rollback()
            lock.close()
        for proc in (worker, control):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        if agent:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent, signal.SIGKILL)


def guard_of(worker: int) -> int:
    """A live worker's guard (:mod:`workers.guard`): its child, which outlives it a while
    when it is killed (its imports, the agents' end, a log line), longer than the grace
    after a test under load."""
    for task in Path(f"/proc/{worker}/task").iterdir():
        for pid in (task / "children").read_text().split():
            with contextlib.suppress(FileNotFoundError):  # a child just ended
                if b"workers.guard" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return int(pid)
    raise AssertionError(f"worker {worker} has no guard")


def _stop_all(guard: threading.Timer, procs: list[subprocess.Popen]) -> None:
    """The bound called off, and every process the test started stopped and waited for."""
    guard.cancel()
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _until(stream, *events: str, timeout: float = 60) -> str:
    """Read a child's JSON log lines on its stderr until one says one of ``events`` (the
    one it says is returned), for up to ``timeout`` seconds: a child that neither logs it
    nor ends failed the test only when the whole run was killed. A byte at a time from
    the pipe itself, so that nothing after the line is held in a buffer from a later
    reader (``communicate``, the next ``_until``)."""
    fd, line = stream.fileno(), b""
    deadline = time.monotonic() + timeout
    said = " or ".join(events)
    while True:
        ready = ready_within(fd, deadline - time.monotonic())
        assert ready, f"the process logged no {said} within {timeout} s"
        byte = os.read(fd, 1)
        if not byte:
            raise AssertionError(f"the process ended without logging {said}")
        line += byte
        if byte == b"\n":
            for event in events:
                if f'"{event}"'.encode() in line:
                    return event
            line = b""


def test_until_gives_up_on_a_child_that_neither_logs_the_event_nor_ends():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; print('{}', file=sys.stderr, flush=True); time.sleep(60)",
        ],
        stderr=subprocess.PIPE,
    )
    try:
        with pytest.raises(AssertionError, match="logged no job.finalized within 0.5 s"):
            _until(child.stderr, "job.finalized", timeout=0.5)
    finally:
        child.kill()
        child.wait()


def _kill_all(procs: list[subprocess.Popen], agent: int | None) -> None:
    """A test's processes gone, whatever it asserted: its children and the agent's group."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    if agent is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent, signal.SIGKILL)


def test_sigterm_cuts_short_a_workers_graceful_stop(kb, tmp_path):
    """OPERATIONS §3: SIGTERM stops a worker at once. After a SIGINT (`systemctl stop`, a
    Ctrl-C) Huey cut its graceful stop short on a second SIGINT only: SIGTERM was ignored
    until every agent ended, and a sweep's SIGKILL after it left the agents running."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + FAST_QUEUE)
    fifo = make_fifo(tmp_path, "started")
    exe = str(Path(sys.executable).parent / "reviewq")
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    agent_env = {**env, "FAKE_MODE": "hang", "FAKE_NOTIFY_FIFO": str(fifo)}
    control = subprocess.Popen([exe, "--root", str(kb.root), "control"], env=env, stderr=subprocess.DEVNULL)  # fmt: skip
    worker = subprocess.Popen(
        [exe, "--root", str(kb.root), "worker", "--workers", "1"],
        env=agent_env,
        stderr=subprocess.PIPE,
        text=True,
    )
    agent = None
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        agent = int(await_fifo(fifo).split()[0])
        worker.send_signal(signal.SIGINT)
        _until(worker.stderr, "Shutting down gracefully...")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        assert process_gone(agent), "the agent outlived its worker"
    finally:
        _kill_all([worker, control], agent)
    assert any(e["event"] == "task.interrupted" for e in log_lines(kb))  # queued again


def test_an_interrupted_review_names_its_job_and_attempt(kb):
    """A worker stopped with SIGTERM puts its reviews in hand back on the queue: its log
    said `task.interrupted` with the task's name alone, so which jobs a restart of a
    remote worker had cut short was nowhere on its machine."""
    from huey.signals import SIGNAL_INTERRUPTED

    from orchestrator import logs
    from orchestrator.config import load_settings
    from workers.app import make_app

    settings = load_settings(kb.root)
    logs.configure(settings.state_dir)
    app = make_app(settings)
    task = app.wrappers["run_review"].s({"v": 4, "job_id": 7, "attempt": 2})
    app.review._emit(SIGNAL_INTERRUPTED, task)
    (said,) = [e for e in log_lines(kb) if e["event"] == "task.interrupted"]
    assert (said["job_id"], said["attempt"], said["requeued"]) == (7, 2, True)
    assert app.review.pending_count() == 1


def test_sigusr1_makes_a_process_write_its_threads_stacks_and_run_on(kb):
    """A sweep's child that would not stop could not say where it waited: the one flake of
    the second-Ctrl-C test left nothing to go on."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    control, _ = _start_control(kb, {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}, "service")
    try:
        control.send_signal(signal.SIGUSR1)
        # Its main thread's frames; SIGUSR1 unhandled would have ended the process.
        assert any(line.rstrip().endswith(" in run_control") for line in control.stderr)
        assert control.poll() is None
    finally:
        control.send_signal(signal.SIGINT)
        control.wait(timeout=30)


def test_a_reviewq_process_leaves_its_heap_to_the_exit():
    """The interpreter's last collection walked every object the imports made, ~55 ms at
    each exit: a sweep's end waited for it in its control, its worker and itself."""
    script = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count()))\n"
        "sys.argv = ['reviewq', '--help']\n"
        "from orchestrator.cli import main\n"
        "main()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert int(out.split("frozen ")[-1]) > 10_000, out[-300:]


def test_a_second_ctrl_c_stops_the_sweeps_worker_and_its_agents(kb, tmp_path):
    """The second Ctrl-C ended the sweep at once; its worker, told to stop by the kernel
    (SIGTERM) in the middle of a graceful stop, ignored it and ran its agents on, under
    init, to their timeout."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + FAST_QUEUE)
    fifo = make_fifo(tmp_path, "started")
    env = {**os.environ, "FAKE_MODE": "hang", "FAKE_NOTIFY_FIFO": str(fifo), "REVIEWQ_LOG_FORMAT": "json"}  # fmt: skip
    sweep = _sweep_in_background(kb, env)
    agent = worker = control = None
    try:
        agent, worker, _ = map(int, await_fifo(fifo).split())
        control = int((kb.state / "control.lock").read_text())
        sweep.send_signal(signal.SIGINT)
        _until(sweep.stderr, "sweep.stopping")  # it says what it waits for
        sweep.send_signal(signal.SIGINT)
        _, err = _ended_or_explained(sweep, kb, timeout=60)
        assert sweep.returncode == 130, err
        _await_exit([worker, control], timeout=30)
        assert process_gone(agent), "the agent outlived its sweep"
    finally:
        _kill_session(sweep)
        for pid in (agent, worker, control):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_a_sweep_looks_again_soon_while_its_last_jobs_end():
    """A sweep looked at state.db every 0.2 s to its end: ~0.1 s on average between its
    last job's end and its own, a few per cent of a sweep of quick jobs."""
    from workers.sweep import POLL_S, Looks

    looks = Looks()
    assert looks.wait_after(500, now=0.0) == POLL_S  # many open: no hurry
    assert looks.wait_after(3, now=0.5) == Looks.ENDING_S  # the last few, moving
    assert looks.wait_after(3, now=1.2) == Looks.ENDING_S  # still within MOVING_S
    # The same few open for longer (a paused reviewer, a long agent): slow looks again.
    assert looks.wait_after(3, now=0.5 + Looks.MOVING_S + 0.1) == POLL_S
    assert looks.wait_after(2, now=5.0) == Looks.ENDING_S  # one of them ended


def test_a_sweep_of_quick_jobs_looks_again_soon_before_its_last_few():
    """At ~200 jobs a second the last 8 ended within one look's wait: the look before them
    saw ~30 open and waited the whole 0.2 s after the last had ended. Open jobs that may
    all end before the next slow look (as many ended over the last one) are looked at
    soon; a sweep of slow jobs is not."""
    from workers.sweep import POLL_S, Looks

    looks = Looks()
    assert looks.wait_after(1000, now=0.0) == POLL_S
    assert looks.wait_after(960, now=0.2) == POLL_S  # 200 a second, 960 open
    assert looks.wait_after(35, now=4.8) == Looks.ENDING_S  # ~40 end within POLL_S
    # Its quick looks after that neither read a pace of their own nor slow down.
    assert looks.wait_after(35, now=4.82) == Looks.ENDING_S
    assert looks.wait_after(34, now=4.84) == Looks.ENDING_S

    slow = Looks()
    assert slow.wait_after(40, now=0.0) == POLL_S
    assert slow.wait_after(39, now=0.2) == POLL_S  # 5 a second: 30 is many
    assert slow.wait_after(30, now=2.0) == POLL_S


def test_a_sweep_of_many_jobs_looks_no_more_often_than_its_looks_can_pay_for():
    """A look counts every job of the sweep: on a KB twenty times the commonplace corpus
    (49,700 jobs) one took ~40 ms of CPU, five times a second for the sweep's hour, and
    the looks' sum grew with the square of the jobs. A look's time sets the least wait
    after it, at its end too; a quick look still waits as before."""
    from workers.sweep import POLL_S, Looks

    looks = Looks()
    assert looks.wait_after(49_700, now=0.0, took=0.04) == pytest.approx(0.04 * Looks.SHARE)
    assert looks.wait_after(3, now=100.0, took=0.04) == pytest.approx(0.04 * Looks.SHARE)
    assert Looks.SHARE >= 20  # the looks take at most 5% of a core
    quick = Looks()
    assert quick.wait_after(500, now=0.0, took=0.0005) == POLL_S
    assert quick.wait_after(3, now=0.5, took=0.0005) == Looks.ENDING_S


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no os.pidfd_open on this system")
def test_a_sweep_sees_its_children_gone_as_they_go(monkeypatch):
    """Popen.wait with a timeout sleeps up to 50 ms between looks: a sweep's end waited
    that long again after its children had stopped. The wait is on the exit itself, so it
    takes no sleep at all (a wall-clock bound would be the machine's load, not the code)."""
    from workers.sweep import _wait_all

    child = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    slept = []
    real_sleep = time.sleep
    monkeypatch.setattr(time, "sleep", lambda s: (slept.append(s), real_sleep(s)))
    told = threading.Timer(0.165, child.stdin.close)  # cat exits at the end of its input
    try:
        told.start()
        _wait_all([child], timeout=30)
    finally:
        told.cancel()
        child.kill()
        child.wait()
        monkeypatch.undo()
    assert child.returncode == 0
    assert slept == [], f"the wait slept between looks: {slept}"


def test_a_sweeps_children_that_will_not_stop_are_killed_within_one_end_s(kb, tmp_path):
    """A second Ctrl-C gave the worker END_S to stop and then the control END_S more, one
    after the other: two children slow to stop kept the sweep a minute, as long as this
    file's test of a second Ctrl-C waits for it."""
    from orchestrator.state.workspace import Workspace
    from workers.sweep import Children

    small_kb(kb, notes=1)
    ws = Workspace.open(kb.root)
    children = Children(ws, workers=1)
    # One END_S and the kill, not two one after the other (at least 2 * END_S): 3 s
    # leaves the kill and the reap 3 s on a machine loaded by other test processes.
    children.END_S = 3.0
    try:
        for name in ("control", "worker"):
            up = make_fifo(tmp_path, name)
            children.specs[name] = ["sh", "-c", f"trap '' INT TERM; echo up > {up}; exec sleep 600"]  # fmt: skip
            children._spawn(name)
            await_fifo(up)  # deaf to both signals from here
        started = time.monotonic()
        children.stop(at_once=True)
        took = time.monotonic() - started
        assert all(proc.poll() is not None for proc in children.procs.values())
        assert took < 2 * children.END_S, f"stopped in {took:.1f} s"
    finally:
        _kill_all(list(children.procs.values()), None)
        ws.close()


def spawn_both(children, tmp_path: Path, script: str, *args: str) -> None:  # noqa: ANN001
    """A sweep's control and worker as ``python -c script ARGS... UP``, each started once
    it has written a line to its FIFO ``UP``."""
    for name in ("control", "worker"):
        up = make_fifo(tmp_path, name)
        children.specs[name] = [sys.executable, "-c", script, *args, str(up)]
        children._spawn(name)
        await_fifo(up)


def test_a_third_ctrl_c_kills_the_sweeps_children_that_have_not_stopped(kb, tmp_path):
    """The third Ctrl-C came in the wait for the children told to stop at once (SIGTERM),
    and ended the sweep there: a child not stopped yet ran on, and no one reaped its agents."""
    from orchestrator.state.workspace import Workspace
    from workers.sweep import Children

    small_kb(kb, notes=1)
    ws = Workspace.open(kb.root)
    children = Children(ws, workers=1)
    children.END_S = 60.0
    termed = make_fifo(tmp_path, "termed")
    # Slow to stop: told, it says so and goes on (Ctrl-C reaches the sweep alone).
    slow = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], 'w').write('told\\n')); "
        "open(sys.argv[2], 'w').write('up\\n'); [signal.pause() for _ in iter(int, 1)]"
    )
    ctrl_c = threading.Thread(
        target=lambda: await_fifo(termed) and os.kill(os.getpid(), signal.SIGINT)
    )
    handler = signal.getsignal(signal.SIGINT)
    try:
        spawn_both(children, tmp_path, slow, str(termed))
        ctrl_c.start()  # the third Ctrl-C, once the first child was told to stop
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            children.stop(at_once=True)
        took = time.monotonic() - started
        assert all(proc.poll() is not None for proc in children.procs.values())
        assert all(f.closed for f in children.stderr.values())
        assert took < children.END_S / 2, f"stopped in {took:.1f} s"
    finally:
        signal.signal(signal.SIGINT, handler)
        ctrl_c.join(30)
        _kill_all(list(children.procs.values()), None)
        ws.close()


def test_a_ctrl_c_while_the_sweep_reaps_its_workers_agents_does_not_cut_the_reaping_short(
    kb, tmp_path, monkeypatch
):
    """The Ctrl-C that cuts the stop short came after the wait for the children, as the
    sweep killed what was left and reaped its worker's agents: raised there, it ended the
    sweep with those agents running and nothing left to reap them."""
    from orchestrator.state.workspace import Workspace
    from workers.sweep import Children

    small_kb(kb, notes=1)
    ws = Workspace.open(kb.root)
    children = Children(ws, workers=1)
    reaped = []
    reap = children._reap_orphans

    def ctrl_c_then_reap(name: str) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # pressed as the reaping begins
        reap(name)
        reaped.append(name)

    monkeypatch.setattr(children, "_reap_orphans", ctrl_c_then_reap)
    quiet = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').write('up\\n'); [signal.pause() for _ in iter(int, 1)]"
    )
    handler = signal.getsignal(signal.SIGINT)
    try:
        spawn_both(children, tmp_path, quiet)
        with pytest.raises(KeyboardInterrupt):
            children.stop(at_once=True)
        assert reaped == ["worker"]
        assert all(proc.poll() is not None for proc in children.procs.values())
        assert all(f.closed for f in children.stderr.values())
    finally:
        signal.signal(signal.SIGINT, handler)
        _kill_all(list(children.procs.values()), None)
        ws.close()


def test_a_sweeps_stop_ends_agents_past_its_grace_and_queues_their_attempts(kb, tmp_path, monkeypatch):  # fmt: skip
    """One Ctrl-C, with an agent longer than the grace (a real review takes minutes): the
    sweep's SIGTERM to its worker was ignored, its SIGKILL left the agent running with no
    worker timing it, and the attempt was lost."""
    from workers.app import make_app

    ws, children, fifo = _a_sweeps_children_and_a_hanging_agent(kb, tmp_path, monkeypatch)
    children.GRACE_S = 1.0
    agent = None
    try:
        children.start()
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
        agent, worker, _ = map(int, await_fifo(fifo).split())
        children.stop(interrupted=True, control_queue=make_app(ws.settings).control)
        assert all(p.poll() is not None for p in children.procs.values())
        assert process_gone(agent), "the agent outlived its worker"
    finally:
        _kill_all(list(children.procs.values()), agent)
        ws.close()
    assert any(e["event"] == "task.interrupted" for e in log_lines(kb))  # queued again
    with db(kb) as conn:
        outcomes = [r[0] for r in conn.execute("SELECT outcome FROM attempts")]
    assert "lost" not in outcomes, outcomes


def test_ctrl_c_lets_a_running_agent_finish_and_its_outcome_is_taken(kb, tmp_path):
    """Ctrl-C stopped the control and the worker together: the outcome of the agent the
    worker let finish waited in the queue, and state.db said 'running' with no process
    behind it until some later control came."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    started, go = make_fifo(tmp_path, "started"), make_fifo(tmp_path, "go")
    env = {**os.environ, "FAKE_NOTIFY_FIFO": str(started), "FAKE_CONTINUE_FIFO": str(go), "REVIEWQ_LOG_FORMAT": "json"}  # fmt: skip
    sweep = _sweep_in_background(kb, env)
    try:
        await_fifo(started)
        sweep.send_signal(signal.SIGINT)
        _until(sweep.stderr, "sweep.stopping")
        with open(go, "w") as f:
            f.write("go")
        _, err = sweep.communicate(timeout=60)
        assert sweep.returncode == 130, err
    finally:
        _kill_session(sweep)
    with db(kb) as conn:
        assert conn.execute("SELECT status FROM review_jobs").fetchone()[0] == "completed"


def test_a_sweeps_children_keep_only_warnings_on_their_stderr_files(kb):
    """The children's stderr files, kept for crashes, repeated every line of the log:
    as large as reviewq.jsonl by morning, and each line written twice."""
    small_kb(kb, notes=2)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    assert rq(kb, "sweep", "--reviewer", "fake", "frontmatter").returncode == 0
    events = {e["event"] for e in log_lines(kb)}
    assert {"control.started", "attempt.dispatched", "job.finalized"} <= events
    for child in ("control", "worker"):
        kept = (kb.state / "logs" / f"sweep-{child}.stderr").read_text()
        assert '"level": "info"' not in kept, kept[:500]


def test_a_sweep_with_nothing_to_do_starts_no_children(kb, monkeypatch):
    """Started only to be stopped mid-start, they could leave a KeyboardInterrupt
    traceback in STATE/logs/sweep-*.stderr, which are kept for crashes."""
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import SweepRequest
    from workers.sweep import Children, run_sweep

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    assert rq(kb, "sweep", "--reviewer", "fake", "frontmatter").returncode == 0
    started: list[Children] = []
    monkeypatch.setattr(Children, "start", lambda self: started.append(self))
    ws = Workspace.open(kb.root)
    req = SweepRequest(name="cli", reviewer="fake", selectors=("frontmatter",))
    out = run_sweep(ws, req, workers=1)
    ws.close()
    assert out.ok and out.enqueued.jobs == [] and started == []


def test_a_sweep_that_started_no_worker_says_when_none_takes_its_jobs(kb):
    """`sweep --workers 0` with no worker anywhere waited for good without a word."""
    from orchestrator import logs
    from orchestrator.control.control import Control
    from orchestrator.state.workspace import Workspace
    from workers.sweep import NoWorker

    small_kb(kb, notes=1)
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    res = rq(kb, "enqueue", "--reviewer", "offline", "frontmatter")
    assert res.returncode == 0, res.stderr
    watch = NoWorker(ws.store, watching=True)
    watch.next = watch.EVERY_S = 0.0
    watch.check()  # nothing dispatched yet: nothing to say
    Control(ws, send_review=lambda msg: None).dispatch()
    watch.check()
    watch.check()
    said = [e for e in log_lines(kb) if e["event"] == "sweep.no_worker"]
    assert len(said) == 1 and said[0]["attempts_waiting"] == 1, said
    ws.close()


def test_a_sweep_whose_only_worker_runs_another_release_says_so(kb):
    """The only worker ran another release and refused every message (the control refused
    its notices in turn: `message.refused`), and the sweep said "start `reviewq worker`":
    a person started a second worker beside the one that was there all along."""
    from orchestrator import logs
    from orchestrator.control import messages
    from orchestrator.control.control import Control
    from orchestrator.state.workspace import Workspace
    from workers.sweep import NoWorker

    small_kb(kb, notes=1)
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    assert rq(kb, "enqueue", "--reviewer", "offline", "frontmatter").returncode == 0
    watch = NoWorker(ws.store, watching=True, log=logs.log_path(ws.state_dir))
    Control(ws, send_review=lambda msg: None).dispatch()
    # The worker's notice, in its version, as the control process refuses and logs it.
    notice = {"v": 5, "job_id": 1, "attempt": 1, "worker": "far:42", "host": "far"}
    logs.get().error("message.refused", **messages.refusal("outcome", notice))
    watch.next = watch.EVERY_S = 0.0
    watch.check()
    (said,) = [e for e in log_lines(kb) if e["event"] == "sweep.no_worker"]
    assert said["note"].startswith(
        "a worker of another release refuses the messages (far:42 on far: an outcome message "
        "of version 5, this reviewq speaks 4): run the same reviewq release"
    ), said
    assert "start `reviewq worker`" not in said["note"]
    ws.close()


def _sweep_starting(kb, monkeypatch, start, workers: int):  # noqa: ANN001, ANN202
    """A sweep of the frontmatter gates whose children are ``start`` (called as they would
    be started, at the jobs' commit) and which ends at its first look at them: its
    workspace (to close) and outcome."""
    from orchestrator import logs
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import SweepRequest
    from workers.sweep import Children, run_sweep

    def check(self: Children) -> None:  # one look of the sweep's, then it ends
        self.failed.append("ended by the test")

    monkeypatch.setattr(Children, "start", start)
    monkeypatch.setattr(Children, "check", check)
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    req = SweepRequest(name="cli", reviewer="offline", selectors=("frontmatter",))
    return ws, run_sweep(ws, req, workers=workers)


def test_a_sweep_hears_what_its_children_said_while_it_wrote_the_job_folders(kb, monkeypatch):
    """Stop 31 starts the sweep's children once its jobs commit, before it writes their
    folders, but the sweep's look-out for a missing worker began after that writing: a
    worker of another release that refused every message at once (its `message.refused`
    lines all logged by then) was missed, and the sweep said "start `reviewq worker`"."""
    from orchestrator import logs
    from orchestrator.control import messages
    from orchestrator.control.control import Control
    from orchestrator.state.workspace import Workspace
    from workers.sweep import Children, NoWorker

    small_kb(kb, notes=1)
    monkeypatch.setattr(NoWorker, "AFTER_S", 0.0)
    monkeypatch.setattr(NoWorker, "EVERY_S", 0.0)
    control_ws = Workspace.open(kb.root)

    def start(self: Children) -> None:  # its control dispatches, the far worker refuses
        Control(control_ws, send_review=lambda msg: None).dispatch()
        notice = {"v": 5, "job_id": 1, "attempt": 1, "worker": "far:42", "host": "far"}
        logs.get().error("message.refused", **messages.refusal("outcome", notice))

    ws, _ = _sweep_starting(kb, monkeypatch, start, workers=0)
    ws.close()
    control_ws.close()
    (said,) = [e for e in log_lines(kb) if e["event"] == "sweep.no_worker"]
    assert said["note"].startswith("a worker of another release refuses the messages"), said


def test_a_sweep_held_off_the_cpu_during_a_look_looks_again_as_soon_as_before(kb, monkeypatch):
    """Z1 timed a look on the wall clock: a sweep stopped during one (a Ctrl-Z, a frozen
    container, W1's suspend as SIGSTOP) or starved by a loaded machine waited 20 times as
    long before its next look, so a minute stopped was 20 minutes more in which jobs that
    ended and children that died went unseen. What a look costs is the CPU it spends."""
    import workers.sweep as sweep
    from workers.sweep import POLL_S, Looks

    small_kb(kb, notes=1)
    look, wait_after = sweep._progress, Looks.wait_after
    held = [0.5]
    waits: list[float] = []

    def held_off(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        p = look(*args, **kwargs)
        if held:
            time.sleep(held.pop())  # off the CPU mid-look
        return p

    def waited(self: Looks, *args, **kwargs) -> float:  # noqa: ANN002, ANN003
        waits.append(wait_after(self, *args, **kwargs))
        return waits[-1]

    monkeypatch.setattr(sweep, "_progress", held_off)
    monkeypatch.setattr(Looks, "wait_after", waited)
    ws, out = _sweep_starting(kb, monkeypatch, lambda self: None, workers=1)
    ws.close()
    assert len(out.enqueued.jobs) == 1 and waits and waits[0] <= POLL_S, waits


def test_a_sweeps_control_leaves_the_folders_the_sweep_is_writing_to_it(kb, monkeypatch):
    """Stop 31 starts a sweep's control at the commit, before the sweep writes the job
    folders, and the control's tick (at its start, then each reaper period) found every
    new job's folder due and wrote them all too: a 1,000-job sweep's folders written twice
    (~165 ms of CPU) and ~1,000 `job.files_written late=true` lines. While the sweep
    writes them the tick leaves those not tried yet to it; a writer gone, it writes them."""
    from orchestrator.control.control import Control
    from orchestrator.state.files import mark_job_files_due
    from orchestrator.state.workspace import Workspace
    from workers.sweep import Children

    small_kb(kb, notes=3)
    control_ws = Workspace.open(kb.root)
    ticks: list[int] = []

    def start(self: Children) -> None:  # the control's first tick, as it starts
        ticks.append(Control(control_ws, send_review=lambda msg: None).write_due_files())

    ws, out = _sweep_starting(kb, monkeypatch, start, workers=1)
    assert len(out.enqueued.jobs) == 3 and ticks == [0], ticks
    assert ws.store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 0
    late = [e for e in log_lines(kb) if e["event"] == "job.files_written"]
    assert late == [], late
    # A writer that died after its commit (no sweep writing now): the next tick writes it.
    mark_job_files_due(ws.store, [out.enqueued.jobs[0].review_job_id])
    assert Control(control_ws, send_review=lambda msg: None).write_due_files() == 1
    ws.close()
    control_ws.close()


def _await_control_queue_empty(kb, timeout: float = 30) -> None:  # noqa: ANN001 - a KBBuilder
    """Until the control's SQLite queue holds no message: what was sent to it is taken."""
    deadline = time.monotonic() + timeout
    with contextlib.closing(sqlite3.connect(kb.state / "queue" / "control.db")) as queue:
        while queue.execute("SELECT count(*) FROM task").fetchone()[0]:
            assert time.monotonic() < deadline, f"the control took nothing in {timeout} s"
            time.sleep(0.02)


def test_a_job_whose_folder_an_enqueue_is_writing_is_dispatched_once_it_is_written(kb):
    """Stop 31 starts a sweep's control at the jobs' commit, while the sweep still writes
    their folders: its dispatch met a folder the sweep held, logged two ERROR lines and
    left the job to the next tick, a minute away (a one-job sweep sat idle that long).
    The folder held by another process is routine, and the job goes once it is written."""
    from orchestrator.state.files import folder_lock
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import SweepRequest, enqueue
    from workers.app import make_app
    from workers.queues import send_once

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile())  # the default reaper_seconds: a minute
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    control, _ = _start_control(kb, env, "service")
    # The tick the control sends as it starts, taken before the enqueue: run late (a busy
    # machine), it found the job's files due and wrote them itself, in the moment between
    # this test's lock and the enqueue's own write (`late`, below; a fresh clone's run).
    _await_control_queue_empty(kb)
    ws = Workspace.open(kb.root)
    try:
        make_app(ws.settings)

        def committed(ids: list[int]) -> None:  # the folders not written yet
            (job_dir,) = ws.store.conn.execute(
                "SELECT job_dir FROM review_jobs WHERE id = ?", ids
            ).fetchone()
            folder = ws.state_dir / job_dir
            folder.mkdir(parents=True)
            with folder_lock(folder):  # the enqueue's writer, at this folder
                send_once("dispatch")  # as a sweep nudges its control at the commit
                _until(control.stderr, "dispatch.deferred", timeout=30)

        req = SweepRequest(name="cli", reviewer="fake", selectors=("frontmatter",))
        assert len(enqueue(ws, req, committed=committed).jobs) == 1
        _until(control.stderr, "attempt.dispatched", timeout=15)
    finally:
        ws.close()
        control.send_signal(signal.SIGINT)
        control.wait(timeout=30)
    errors = [e for e in log_lines(kb) if e["level"] == "error"]
    assert errors == [], errors
    late = [e for e in log_lines(kb) if e["event"] == "job.files_written"]
    assert late == [], late  # written once, by the enqueue


def test_a_job_folder_a_stopped_command_holds_past_a_tick_is_warned_of(kb):
    """K57 made a folder another process holds routine (info, once): a command stopped
    by Ctrl-Z while writing a job's folder kept the job queued all night, and no warning
    or error said so. Held past a tick, it is warned of once, naming the holder; the
    holder killed, the lock goes with it and the next tick writes the folder."""
    from datetime import UTC, timedelta

    from orchestrator import logs
    from orchestrator.control.control import Control
    from orchestrator.state.files import mark_job_files_due
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import SweepRequest, enqueue

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile())
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    (job,) = enqueue(ws, SweepRequest(name="cli", reviewer="fake", selectors=("frontmatter",))).jobs
    folder = (
        ws.state_dir
        / ws.store.conn.execute(
            "SELECT job_dir FROM review_jobs WHERE id = ?", (job.review_job_id,)
        ).fetchone()[0]
    )
    holder = subprocess.Popen(  # takes the folder's lock, then stops as Ctrl-Z stops it
        [
            sys.executable,
            "-c",
            "import fcntl, os, signal, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nos.kill(os.getpid(), signal.SIGSTOP)",
            str(folder),
        ],
    )
    clock = [datetime(2026, 1, 1, 2, 0, tzinfo=UTC)]
    control = Control(ws, send_review=lambda msg: None, now=lambda: clock[0])
    try:
        assert os.waitpid(holder.pid, os.WUNTRACED)[1] != 0  # stopped, holding it
        mark_job_files_due(ws.store, [job.review_job_id])  # its writer's, stopped
        for _ in range(3):  # the night's ticks
            assert control.write_due_files() == 0
            clock[0] += timedelta(seconds=ws.settings.queue.reaper_seconds)
        said = [e for e in log_lines(kb) if e["event"] == "job.folder_held"]
        assert len(said) == 1 and said[0]["level"] == "warning", said
        assert said[0]["job_id"] == job.review_job_id and said[0]["holder_pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert control.write_due_files() == 1  # its lock went with it
    ws.close()


def test_a_sweep_that_started_no_worker_does_not_call_a_busy_one_missing(kb):
    """A service worker whose slots hold agents launched before the sweep began (reviews
    take minutes) was taken for none: only launches since the sweep's start counted."""
    from orchestrator import logs
    from orchestrator.control.control import Control
    from orchestrator.state.workspace import Workspace
    from workers.sweep import NoWorker

    small_kb(kb, notes=2)
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    assert rq(kb, "enqueue", "--reviewer", "offline", "--note", "kb/notes/n0.md", "frontmatter").returncode == 0  # fmt: skip
    control = Control(ws, send_review=lambda msg: None)
    control.dispatch()
    control.on_messages([{"job_id": 1, "attempt": 1, "worker": "w", "launched": True}], [])
    with ws.store.write():  # launched minutes before the sweep began
        ws.store.conn.execute(
            "UPDATE attempts SET launched_at = '2026-01-01T00:00:00.000Z', "
            "heartbeat_at = '2026-01-01T00:00:00.000Z'"
        )
    watch = NoWorker(ws.store, watching=True)  # begins with that agent running
    assert rq(kb, "enqueue", "--reviewer", "offline", "--note", "kb/notes/n1.md", "frontmatter").returncode == 0  # fmt: skip
    control.dispatch()  # the new job waits for the busy worker's free slot
    control.on_messages([{"job_id": 1, "attempt": 1, "worker": "w"}], [])  # its agent beats
    watch.next = watch.EVERY_S = 0.0
    watch.check()
    assert [e for e in log_lines(kb) if e["event"] == "sweep.no_worker"] == []
    ws.close()


def test_a_stderr_level_that_names_no_level_is_ignored(monkeypatch, tmp_path):
    """REVIEWQ_STDERR_LEVEL=verbose made every command an internal error."""
    import logging

    from orchestrator import logs

    monkeypatch.setenv("REVIEWQ_STDERR_LEVEL", "verbose")
    logs.configure(tmp_path, stderr_level="INFO", process="test")
    (stderr,) = [
        h for h in logging.getLogger().handlers if getattr(h, "stream", None) is sys.stderr
    ]
    assert stderr.level == logging.INFO


def test_a_cron_sweep_in_a_partition_with_no_review_among_others_logs_it(kb):
    """enqueue and sweep said it on stderr, but the nightly sweep the control fires kept
    it in a list no one read: a partition misspelt in reviewq.toml paid for the whole KB
    again, night after night, with not a line in the log."""

    small_kb(kb, notes=1)
    kb.write(
        "reviewq.toml",
        '[reviewers.r]\nkind = "offline"\npartition = "m-1"\n'
        '[[sweeps]]\nname = "nightly"\nreviewer = "r"\ncron = "0 3 * * *"\n',
    )
    kb.accept("m1", [("kb/notes/n0.md", "prose/body-check")])
    ticks_past_three(kb)
    said = [e for e in log_lines(kb) if e["event"] == "sweep.partition_unreviewed"]
    assert [(e["sweep"], e["reviewer"], e["partition"], e["known"]) for e in said] == [
        ("nightly", "r", "m-1", ["m1"])
    ]
    assert said[0]["level"] == "warning"


def test_a_cron_sweep_whose_scope_holds_no_pair_logs_it(kb):
    """An entry whose notes have none of the gates it selects (a `type/NAME` no note there
    is, a folder emptied by a move) enqueued nothing every night, said only by the zeros
    of its `sweep.enqueued` line; an entry with all its pairs fresh says nothing."""

    small_kb(kb, notes=1)
    kb.write("kb/types/definition.md", "---\ntitle: Definition\n---\nA definition.\n")
    kb.write(
        "reviewq.toml",
        '[[sweeps]]\nname = "defs"\ncron = "0 3 * * *"\nselect = ["type/definition"]\n'
        'notes = ["kb/notes"]\n'
        '[[sweeps]]\nname = "all"\ncron = "0 3 * * *"\n',
    )
    kb.accept("offline", [("kb/notes/n0.md", "prose/body-check")])
    kb.accept("offline", [("kb/notes/n0.md", "frontmatter/title-check")])
    ticks_past_three(kb)
    said = [e for e in log_lines(kb) if e["event"] == "sweep.selects_nothing"]
    assert [(e["sweep"], e["select"], e["notes"], e["level"]) for e in said] == [
        ("defs", ["type/definition"], ["kb/notes"], "warning")
    ]
    ran = [e for e in log_lines(kb) if e["event"] == "sweep.enqueued"]
    assert sorted((e["sweep"], e["jobs"]) for e in ran) == [("all", 0), ("defs", 0)]


def test_a_late_cron_run_names_the_cron_minute_it_stands_for(kb):
    """A control down at 03:00 and back at 03:04 runs the `0 3 * * *` entry late (within
    LATE); its `sweep.enqueued` line said only its tick's time, so a person grepping the
    log for the 03:00 run found a run of 03:04 no cron names (`sweep.missed` and
    `sweep.failed` name the cron minute)."""
    from orchestrator import logs
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps import producer

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\n')
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    producer.enqueue_due_sweeps(ws, datetime(2026, 1, 2, 2, 58).astimezone())  # the clock starts
    producer.enqueue_due_sweeps(ws, datetime(2026, 1, 2, 3, 4, 30).astimezone())  # back late
    ws.close()
    three = datetime(2026, 1, 2, 3, 0).astimezone()
    (said,) = [e for e in log_lines(kb) if e["event"] == "sweep.enqueued"]
    assert (said["jobs"], said["trigger"]) == (2, "cron")
    assert said["at"] == three.astimezone(UTC).isoformat().replace("+00:00", "Z"), said
    assert said["wall"] == three.isoformat(timespec="minutes"), said


def test_status_names_the_cron_minute_a_late_run_stands_for_and_when_it_started(kb):
    """A control down at the entry's minute and back five minutes on runs it late (within
    LATE), and `status` said "last ran 03:05 on …": a time no cron names, so the person
    asking whether the 03:00 run ran could not tell it was this one. A real control, its
    clock last looked at before the minute (then it went down)."""
    from orchestrator.state.store import Store, timestamp

    small_kb(kb, notes=1)
    now = datetime.now().astimezone()
    minute = (now - timedelta(minutes=5)).replace(second=0, microsecond=0)
    cron = f"{minute.minute} {minute.hour} * * *"
    kb.write("reviewq.toml", f'[[sweeps]]\nname = "nightly"\ncron = "{cron}"\n' + FAST_QUEUE)
    Store.open(kb.state).close()
    looked = (minute - timedelta(minutes=3)).astimezone(UTC).isoformat()
    with contextlib.closing(db(kb)) as conn, conn:
        conn.execute("INSERT INTO cron_state (name, last_checked) VALUES ('nightly', ?)", (looked,))
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    assert _control_until(base, "sweep.enqueued", "sweep.missed") == "sweep.enqueued"
    res = rq(kb, "status", "--json")
    assert res.returncode == 0, res.stderr
    (nightly,) = json.loads(res.stdout)["sweeps"]
    last = nightly["last_run"]
    assert (last["trigger"], last["cron_at"]) == ("cron", timestamp(minute)), last
    started = datetime.fromisoformat(last["started_at"].replace("Z", "+00:00")).astimezone()
    late = int((started - minute).total_seconds() // 60)
    assert late >= 5, last
    (line,) = [x for x in rq(kb, "status").stdout.splitlines() if x.startswith("sweep 'nightly'")]
    assert line.startswith(
        f"sweep 'nightly' ({cron}): last ran its {minute:%H:%M on %Y-%m-%d} "
        f"({timestamp(minute)[:16]}Z), {late} min late at {started:%H:%M} (run 1, 2 job(s), "
        "by its clock), next "
    ), line


def test_a_cron_sweep_whose_notes_cannot_be_read_does_not_blame_its_gates_or_folders(kb):
    """N15's `sweep.selects_nothing` said "no note in its scope has a gate it selects (a
    folder emptied, a gate's requires_type …)" of an entry whose notes are all there but
    could not be read (broken YAML, beside it in `kb.file_skipped`): the person went looking
    at the folder and the gates, not at the notes."""

    small_kb(kb, notes=1)
    kb.write("kb/notes/pests/mites.md", "---\ntitle: [unclosed\n---\nVarroa.\n")
    kb.write("kb/notes/pests/wax.md", "---\ntitle: Wax moth\n")  # never closed
    kb.write(
        "reviewq.toml",
        '[[sweeps]]\nname = "pests"\ncron = "0 3 * * *"\nnotes = ["kb/notes/pests"]\n',
    )
    ticks_past_three(kb)
    skipped = [e["path"] for e in log_lines(kb) if e["event"] == "kb.file_skipped"]
    assert sorted(skipped) == ["kb/notes/pests/mites.md", "kb/notes/pests/wax.md"]
    (said,) = [e for e in log_lines(kb) if e["event"] == "sweep.selects_nothing"]
    assert said["reason"].startswith("2 file(s) in its scope could not be read"), said
    assert "folder emptied" not in said["reason"] and said["files_skipped"] == 2


def test_a_cron_entry_that_enqueues_nothing_keeps_one_run_of_it_not_one_a_minute(kb, run_cli):
    """A `* * * * *` entry whose pairs are all queued (no worker up, or all fresh) added a
    `sweep_runs` row a minute that no job refers to: 372 bytes a row with its index, 195 MB
    of state.db a year, for runs of nothing. What reads them needs its last run alone
    (`status`'s last run, a missed night's end, `report --sweep`)."""
    from orchestrator import logs
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps import producer

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "often"\ncron = "* * * * *"\n')
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    first = datetime(2026, 1, 2, 3, 0, 5).astimezone()
    producer.enqueue_due_sweeps(ws, first - timedelta(minutes=1))  # the clock starts
    for minute in range(6):
        producer.enqueue_due_sweeps(ws, first + timedelta(minutes=minute))
        if minute == 2:  # a run by hand, of nothing too: a person's, kept
            enqueue = producer.SweepRequest.from_config(
                ws.settings.sweeps["often"], ws.root, "enqueue"
            )
            producer.enqueue(ws, enqueue)
    ws.close()
    with db(kb) as conn:
        runs = [
            tuple(r) for r in conn.execute("SELECT id, trigger, jobs FROM sweep_runs ORDER BY id")
        ]
    assert runs == [(1, "cron", 2), (5, "enqueue", 0), (8, "cron", 0)], runs
    (entry,) = json.loads(run_cli("status", "--json").stdout)["sweeps"]
    assert entry["last_run"]["id"] == 8
    assert "sweep often (run 8)" in run_cli("report", "--sweep", "often").stdout
    gone = run_cli("report", "--run", "7")
    assert gone.exit_code == 1 and "enqueued nothing" in gone.stderr, gone.stderr


def test_a_budget_lowered_below_what_a_cron_run_spent_holds_its_jobs_once_the_control_restarts(
    kb,
):
    """`budget_usd` lowered mid-run (spending faster than meant) and the control sent
    SIGHUP: the run went on spending to the budget it started with, the lowered one
    waiting for the next night, said nowhere. A cron run's open budget follows its entry's
    down as the control starts; a run by name keeps its own (`--budget-usd` is a person's)."""
    from orchestrator.state.store import utcnow
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import SweepRequest, enqueue

    small_kb(kb, notes=4)
    entry = '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\nbudget_usd = {}\n'
    kb.write("reviewq.toml", FAST_QUEUE + entry.format("1.0"))
    ws = Workspace.open(kb.root)
    runs = [
        enqueue(ws, SweepRequest.from_config(ws.settings.sweeps["nightly"], ws.root, trigger))
        for trigger in ("cron", "enqueue")
    ]
    assert len(runs[0].jobs) == 8 and runs[1].jobs == []
    with ws.store.write():  # the cron run spent $0.03 of its $1
        ws.store.conn.execute(
            "INSERT INTO attempts (job_id, attempt, outcome, started_at, ended_at, cost_usd) "
            "VALUES (?, 1, 'invalid-output', ?, ?, 0.03)",
            (runs[0].jobs[0].review_job_id, utcnow(), utcnow()),
        )
        # The run by name holds one job too (taken from the cron run's, for the test).
        ws.store.conn.execute(
            "UPDATE review_jobs SET sweep_run_id = ? WHERE id = ?",
            (runs[1].run_id, runs[0].jobs[1].review_job_id),
        )
    ws.close()
    kb.write("reviewq.toml", FAST_QUEUE + entry.format("0.02"))
    status = _status_once_a_budget_is_reached(kb)
    assert status.returncode == 0, status.stderr
    spent = json.loads(status.stdout)["budgets_spent"]
    assert [(b["sweep_run"], b["budget_usd"], b["jobs_waiting"]) for b in spent] == [
        (runs[0].run_id, 0.02, 7)
    ]
    lowered = [e for e in log_lines(kb) if e["event"] == "sweep.budget_lowered"]
    assert [(e["sweep_run"], e["was"], e["budget_usd"]) for e in lowered] == [
        (runs[0].run_id, 1.0, 0.02)
    ]
    with db(kb) as conn:
        kept = conn.execute("SELECT budget_usd FROM sweep_runs WHERE id = ?", (runs[1].run_id,))
        assert kept.fetchone()[0] == 1.0


def nightly_run_that_spent(kb, entry: str, then=None):  # noqa: ANN001, ANN201
    """The cron run of ``entry`` (a `[[sweeps]]` named nightly, over four notes), $0.03 of
    it spent by hand: what a budget test changes reviewq.toml under. ``then`` is called
    with the workspace before it closes. The enqueue's result."""
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import SweepRequest, enqueue

    small_kb(kb, notes=4)
    kb.write("reviewq.toml", FAST_QUEUE + entry)
    ws = Workspace.open(kb.root)
    run = enqueue(ws, SweepRequest.from_config(ws.settings.sweeps["nightly"], ws.root, "cron"))
    spend(ws.store, run.jobs[0].review_job_id, 0.03, attempt=99)
    if then is not None:
        then(ws)
    ws.close()
    return run


def test_a_lowered_budget_raised_again_gives_the_open_run_its_budget_back(kb):
    """`budget_usd` lowered mid-run held the cron run (N17); the person, having found why it
    spent fast, put the $1 back and sent the control SIGHUP: the run stayed held at the
    $0.02 no line of reviewq.toml said any more, its 7 jobs waiting for the next night.
    Raised again, the run gets its budget back, up to the one it started with."""
    entry = '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\nbudget_usd = {}\n'
    run = nightly_run_that_spent(kb, entry.format("1.0"))  # $0.03 of its $1
    kb.write("reviewq.toml", FAST_QUEUE + entry.format("0.02"))
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    procs = [subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)]
    try:
        _await_logged(kb, "sweep.budget_reached")  # held at the lowered $0.02
        procs.append(
            subprocess.Popen([*base, "worker", "--workers", "2"], stderr=subprocess.DEVNULL)
        )
        kb.write("reviewq.toml", FAST_QUEUE + entry.format("5.0"))  # more than it started with
        procs[0].send_signal(signal.SIGHUP)
        _await_logged(kb, "control.started", 2)
        _await_logged(kb, "job.finalized", 8)
        status = json.loads(rq(kb, "status", "--json").stdout)
    finally:
        for proc in procs:
            stop(proc)
    assert status["jobs"]["completed"] == 8 and status["budgets_spent"] == []
    with db(kb) as conn:
        kept = conn.execute("SELECT budget_usd FROM sweep_runs WHERE id = ?", (run.run_id,))
        assert kept.fetchone()[0] == 1.0  # its own, not the $5 meant for the next night
    said = [e for e in log_lines(kb) if e["event"] == "sweep.budget_restored"]
    assert [(e["sweep_run"], e["was"], e["budget_usd"]) for e in said] == [(run.run_id, 0.02, 1.0)]


def test_a_lowered_budget_holds_the_run_before_a_dispatch_waiting_in_the_queue(kb):
    """A control sent SIGHUP with the budget lowered took first what waited in its queue:
    a dispatch (an attempt's end, a person's `enqueue` or `decide` sent it) ran before its
    first tick lowered the budget, and started attempts of a run the new budget held as
    spent (seen with a real control and worker: job 9 started under the budget before).
    The control's settings move the budgets before it takes a message."""
    from orchestrator.cli.common import nudge_control

    entry = '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\nbudget_usd = {}\n'
    # $0.03 of its $1 spent, and a dispatch waiting in the control's queue.
    run = nightly_run_that_spent(kb, entry.format("1.0"), then=nudge_control)
    kb.write("reviewq.toml", FAST_QUEUE + entry.format("0.02"))
    status = _status_once_a_budget_is_reached(kb)
    assert status.returncode == 0, status.stderr
    assert [e["event"] for e in log_lines(kb) if e["event"] == "attempt.dispatched"] == []
    assert json.loads(status.stdout)["jobs"]["queued"] == len(run.jobs)


def test_a_budget_given_to_an_entry_that_had_none_holds_its_open_run(kb):
    """The brake most wanted: an entry with no `budget_usd` spending faster than meant
    (a reviewer looping on turns), a budget added and the control sent SIGHUP. N17 and
    N22 moved only the runs that had one: the open cron run went on spending, unbounded,
    the new budget the next night's, and nothing said so. It takes the budget, and,
    the line taken out again, gets its none back."""
    entry = '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\n'
    run = nightly_run_that_spent(kb, entry)  # $0.03 of no budget
    kb.write("reviewq.toml", FAST_QUEUE + entry + "budget_usd = 0.02\n")
    status = _status_once_a_budget_is_reached(kb)
    assert status.returncode == 0, status.stderr
    spent = json.loads(status.stdout)["budgets_spent"]
    assert [(b["sweep_run"], b["budget_usd"], b["jobs_waiting"]) for b in spent] == [
        (run.run_id, 0.02, 8)
    ]
    kb.write("reviewq.toml", FAST_QUEUE + entry)
    control = subprocess.Popen(
        [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root), "control"],
        stderr=subprocess.DEVNULL,
    )
    try:
        _await_logged(kb, "sweep.budget_restored")
    finally:
        stop(control)
    moved = [e for e in log_lines(kb) if e["event"].startswith("sweep.budget_")]
    assert [(e["event"], e["was"], e["budget_usd"]) for e in moved if "was" in e] == [
        ("sweep.budget_lowered", None, 0.02),
        ("sweep.budget_restored", 0.02, None),
    ]
    with db(kb) as conn:
        kept = conn.execute("SELECT budget_usd FROM sweep_runs WHERE id = ?", (run.run_id,))
        assert kept.fetchone()[0] is None


def _status_once_a_budget_is_reached(kb) -> subprocess.CompletedProcess:  # noqa: ANN001
    """`status --json` once a control started on the config as it now is held a run's
    budget as reached."""
    control = subprocess.Popen(
        [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root), "control"],
        stderr=subprocess.DEVNULL,
    )
    try:
        _await_logged(kb, "control.started")
        _await_logged(kb, "sweep.budget_reached")
        return rq(kb, "status", "--json")
    finally:
        stop(control)


def test_a_budget_is_lowered_only_on_the_runs_its_entry_takes_over(kb):
    """Two entries of two models swapped names (`prose` of offline at $1, `facts` of
    `other` at $0.5; swapped, `prose` of `other` at $0.02), the control restarted: the
    open cron run named `prose`, of the offline model, took the $0.02 of the entry now
    so named, another model's budget, and was held as spent with $0.03 of its $1, while
    the run of `other` whose jobs that entry takes over (C38) went on to its $0.5. A
    lowered budget holds the runs its entry takes over, as the takeover reads them."""
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import SweepRequest, enqueue

    small_kb(kb, notes=2)
    other = '[reviewers.other]\nkind = "offline"\npartition = "other-model"\n'
    entry = '[[sweeps]]\nname = "{}"\ncron = "0 3 * * *"\nreviewer = "{}"\nbudget_usd = {}\n'
    kb.write(
        "reviewq.toml",
        FAST_QUEUE
        + other
        + entry.format("prose", "offline", 1.0)
        + entry.format("facts", "other", 0.5),
    )
    ws = Workspace.open(kb.root)
    runs = {}
    for name in ("prose", "facts"):
        run = enqueue(ws, SweepRequest.from_config(ws.settings.sweeps[name], ws.root, "cron"))
        spend(ws.store, run.jobs[0].review_job_id, 0.03)  # each spent $0.03 of its budget
        runs[name] = run.run_id
    ws.close()
    kb.write(
        "reviewq.toml",
        FAST_QUEUE
        + other
        + entry.format("facts", "offline", 1.0)
        + entry.format("prose", "other", 0.02),
    )
    status = _status_once_a_budget_is_reached(kb)
    assert status.returncode == 0, status.stderr
    spent = json.loads(status.stdout)["budgets_spent"]
    assert [(b["sweep_run"], b["budget_usd"]) for b in spent] == [(runs["facts"], 0.02)]
    lowered = [e for e in log_lines(kb) if e["event"] == "sweep.budget_lowered"]
    assert [(e["sweep"], e["sweep_run"], e["was"], e["budget_usd"]) for e in lowered] == [
        ("prose", runs["facts"], 0.5, 0.02)
    ]


def test_a_sweep_by_name_says_in_its_json_the_jobs_it_took_over_from_a_spent_run(kb):
    """N18 counted a spent run's jobs a run takes over in `enqueue`'s line and JSON and in
    the sweep's summary; `sweep --json` had no `taken_over`: a script reading it saw
    `enqueued_jobs: 0` of a run that had taken 2 jobs over and run them."""
    from orchestrator.state.workspace import Workspace

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\nbudget_usd = 0.5\n')
    first = json.loads(rq(kb, "enqueue", "--name", "nightly", "--json").stdout)
    assert len(first["jobs"]) == 2
    ws = Workspace.open(kb.root)
    spend(ws.store, first["jobs"][0]["review_job_id"], 0.5, attempt=99)
    ws.close()
    res = rq(kb, "sweep", "--name", "nightly", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert (out["enqueued_jobs"], out["taken_over"], out["progress"]["done"]) == (0, 2, 2), out


def test_status_in_a_shell_off_the_controls_zone_says_which_clock_the_crons_run_on(kb):
    """A control under systemd reads /etc/localtime (UTC on most servers); the operator's
    shell has TZ=Europe/Berlin. `0 2 * * *` fired at 03:00 on their clock, and nothing
    (status, its JSON, the control's log) named the zone the control read its crons in:
    the report's nights and `--since 08:00` were on the shell's clock, the crons on
    another."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", FAST_QUEUE + '[[sweeps]]\nname = "nightly"\ncron = "0 2 * * *"\n')
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    control = subprocess.Popen(
        [*base, "control"], env={**os.environ, "TZ": "UTC"}, stderr=subprocess.DEVNULL
    )
    try:
        _await_logged(kb, "control.started")
        berlin = rq(kb, "status", env={"TZ": "Europe/Berlin"})
        same = rq(kb, "status", env={"TZ": "Etc/UTC"})  # another name of the same clock
        as_json = rq(kb, "status", "--json", env={"TZ": "Europe/Berlin"})
        doctor = rq(kb, "doctor", env={"TZ": "Europe/Berlin"})
    finally:
        stop(control)
    assert berlin.returncode == 0, berlin.stderr
    said = [line for line in berlin.stdout.splitlines() if "cron" in line and "clock" in line]
    from zoneinfo import ZoneInfo

    hours = datetime.now(ZoneInfo("Europe/Berlin")).utcoffset() // timedelta(hours=1)
    assert said == [
        "[[sweeps]] cron times are on the control's clock, UTC (now +00:00), not this "
        f"shell's, Europe/Berlin (now +{hours:02d}:00): the report's nights and a --since 08:00 are "
        "on this one; to fire them on this clock, start the control with its zone (TZ, "
        "else /etc/localtime)"
    ]
    assert not [line for line in same.stdout.splitlines() if "control's clock" in line]
    assert f"warning: {said[0]}" in doctor.stdout.splitlines(), doctor.stdout
    assert json.loads(as_json.stdout)["control"]["zone"] == "UTC"
    started = [x for x in log_lines(kb) if x["event"] == "control.started"]
    assert [x["zone"] for x in started] == ["UTC"]


def open_descriptors() -> set[str]:
    gc.collect()  # what earlier tests dropped unclosed is closed now, not mid-command
    return set(os.listdir("/proc/self/fd"))


def opened_since(before: set[str]) -> set[str]:
    """What the descriptors opened since ``before`` are (a path, a pipe, a socket)."""
    found = set()
    for fd in set(os.listdir("/proc/self/fd")) - before:
        with contextlib.suppress(OSError):  # listdir's own, gone already
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
    return found


IN_PROCESS_COMMANDS = (
    ("doctor",),
    ("doctor", "--worker"),
    ("enqueue", "prose", "--reviewer", "offline"),
    ("resume", "offline"),
    ("sweep", "--reviewer", "offline", "--workers", "1", "--json"),
    ("status",),
    ("jobs",),
    ("job", "1"),
    ("logs",),
    ("report",),
    ("escalations",),
    ("export",),
)


def test_in_process_commands_leave_no_descriptor_open(kb, run_cli):
    """Each command closes the queues it opened (their SQLite connections, doorbell FIFOs
    and stop pipes): doctor, and every command that nudged the control, left ~9 open for
    good, and the test suite's one process passed 1,024 descriptors, where select() fails."""
    small_kb(kb)
    # The first command that logs opens the log file, kept for the process's next lines.
    assert run_cli("enqueue", "frontmatter", "--reviewer", "offline").exit_code == 0
    for args in IN_PROCESS_COMMANDS:
        before = open_descriptors()
        res = run_cli(*args)
        assert res.exit_code == 0, (args, res.stdout, res.stderr)
        assert not opened_since(before), args


def test_a_commands_app_closed_gives_back_the_app_it_replaced(kb):
    """The app a process made (a test's, a sweep's) is its own again after a command's
    app (a nudge of the control, made and closed in between) is closed."""
    from orchestrator.config import load_settings
    from workers.app import make_app
    from workers.queues import the_app

    settings = load_settings(kb.root)
    own = make_app(settings)
    with make_app(settings) as nudge:
        assert the_app() is nudge
    assert the_app() is own
    own.close()


def test_a_control_on_tz_localtime_is_said_off_the_clock_timedatectl_set_since(kb, tmp_path):
    """A unit with TZ=:/etc/localtime (sparing a stat per call): the control reads the
    zone at its start and `timedatectl set-timezone Europe/Berlin` relinks the file. Named
    `/etc/localtime` and compared with the file as `status` found it, the control still on
    UTC read as on the shell's Berlin clock: nothing said it went on firing at UTC times."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", FAST_QUEUE + '[[sweeps]]\nname = "nightly"\ncron = "0 2 * * *"\n')
    localtime = tmp_path / "localtime"
    localtime.symlink_to("/usr/share/zoneinfo/Etc/UTC")
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    control = subprocess.Popen(
        [*base, "control"], env={**os.environ, "TZ": f":{localtime}"}, stderr=subprocess.DEVNULL
    )
    try:
        _await_logged(kb, "control.started")
        localtime.unlink()  # as timedatectl relinks it
        localtime.symlink_to("/usr/share/zoneinfo/Europe/Berlin")
        berlin = rq(kb, "status", "--json", env={"TZ": "Europe/Berlin"})
    finally:
        stop(control)
    assert berlin.returncode == 0, berlin.stderr
    said = json.loads(berlin.stdout)["control"]
    assert said["zone"] == "Etc/UTC", said
    assert (said["zone_said"] or "").startswith(
        "[[sweeps]] cron times are on the control's clock, Etc/UTC (now +00:00), not this "
        "shell's, Europe/Berlin"
    ), said


def test_status_reads_no_fifo_or_link_where_the_control_keeps_its_zone(kb, tmp_path):
    """STATE/run/control-zone.json (and queue-shared.json beside it) were read with
    whatever was there followed: a FIFO held `status` until someone wrote to it, and a
    link's target (another state folder's file, /dev/zero) was read as the control's.
    The control writes them as regular files (replacing whatever was there at its start)."""
    import fcntl

    from orchestrator.state.workspace import Workspace

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", FAST_QUEUE + '[[sweeps]]\nname = "nightly"\ncron = "0 2 * * *"\n')
    Workspace.open(kb.root).store.close()  # state.db, as a control's start makes it
    run = kb.state / "run"
    run.mkdir(exist_ok=True)
    elsewhere = tmp_path / "zone.json"
    elsewhere.write_text(json.dumps({"pid": 4242, "zone": "Asia/Kolkata"}))
    lock = os.open(kb.state / "control.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # this test is the control, pid 4242
        os.write(lock, b"4242")
        (run / "control-zone.json").symlink_to(elsewhere)
        linked = rq(kb, "status", "--json", env={"TZ": "UTC"}, timeout=20)
        (run / "control-zone.json").unlink()
        for name in ("control-zone.json", "queue-shared.json"):
            os.mkfifo(run / name)
        fifo = rq(kb, "status", "--json", timeout=20)
    finally:
        os.close(lock)
    assert linked.returncode == 0, linked.stderr
    assert json.loads(linked.stdout)["control"]["zone"] is None
    assert fifo.returncode == 0, fifo.stderr
    control = json.loads(fifo.stdout)["control"]
    assert (control["pid"], control["zone"], control["shared"]) == (4242, None, None)


def test_a_control_on_a_zone_file_cut_short_starts_and_status_answers(kb, tmp_path):
    """A copied zone file cut short in its last line (a copy that filled the disk; glibc
    reads it all the same): zoneinfo reads that line a byte at a time until a newline
    that never comes, so `status` from another shell never answered, nor did a control
    that kept the file's rules at its start ever start. One whose last line does not open
    with its newline made zoneinfo assert: a traceback."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", FAST_QUEUE + '[[sweeps]]\nname = "nightly"\ncron = "0 2 * * *"\n')
    berlin = Path("/usr/share/zoneinfo/Europe/Berlin").read_bytes()
    cut, damaged = tmp_path / "cut", tmp_path / "damaged"
    cut.write_bytes(berlin[:-8])
    last = berlin.rindex(b"\n", 0, len(berlin) - 1)
    damaged.write_bytes(berlin[:last] + b"X" + berlin[last + 1 :])
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    for zone_file in (cut, damaged):
        control = subprocess.Popen(
            [*base, "control"], env={**os.environ, "TZ": f":{zone_file}"}, stderr=subprocess.DEVNULL
        )
        try:
            _await_logged(kb, "control.started", timeout=30)
            said = rq(kb, "status", "--json", env={"TZ": "Asia/Kolkata"}, timeout=30)
        finally:
            stop(control)
        assert said.returncode == 0, said.stderr
        assert json.loads(said.stdout)["control"]["zone"] == str(zone_file)
        (kb.state / "logs" / "reviewq.jsonl").unlink()  # the next control's start awaited anew


def test_a_retry_due_while_redis_is_full_is_kept_until_it_can_be_queued(tmp_path):
    """A control task's retry (Huey's schedule) due while a Redis shared with another
    application is full under `noeviction`: Huey's schedule script took it off (a delete
    frees memory, so it is let through) and its scheduler's push onto the queue was
    refused, `Error enqueueing` and the retry gone (a deliver_outcome's: the outcome lost,
    the agent run again a lease later). It stays on the schedule until the push goes."""
    import redis
    from huey import RedisHuey
    from huey.consumer import Scheduler

    from workers import queues

    with (
        redis_server(tmp_path, "--maxmemory-policy", "noeviction") as url,
        contextlib.closing(redis.Redis.from_url(url)) as admin,
    ):
        huey = RedisHuey(
            "reviewq-control",
            storage_class=queues.RedisQueueStorage,
            holds=True,
            connection_pool=queues.redis_pool(url),
        )
        retried = huey.task(name="retried", retries=3, retry_delay=3)(lambda n: n)
        task = retried.s(1)
        task.eta = datetime(2000, 1, 1)  # due
        huey.add_schedule(task)
        others = [f"other-app:{i}" for i in range(64)]
        for name in others:
            admin.set(name, b"x" * 65536)
        admin.config_set("maxmemory", admin.info("memory")["used_memory"] - 2**20)
        scheduler = Scheduler(huey, threading.Event(), 1, False)
        scheduler.loop()  # full: the push refused
        assert huey.storage.queue_size() == 0
        admin.delete(*others)
        scheduler._next_loop = time.monotonic()  # the next second's, now
        scheduler.loop()
        assert huey.storage.schedule_size() == 0
        data = huey.storage.dequeue()
        assert data is not None, "the retry was lost"
        assert huey.deserialize_task(data).id == task.id
        huey.storage.close()


@pytest.mark.parametrize(
    ("query", "expected"), [("", 5.0), ("?socket_timeout=1", 1.0), ("?socket_timeout=30", 5.0)]
)
def test_a_nudge_gives_up_no_later_than_the_url_s_own_timeout(kb, query, expected):
    """A person's one-off command gives up its nudge after the probe's 5 s of silence; a
    URL's own shorter `socket_timeout` was raised to those 5 s (K85)."""
    from orchestrator.config import load_settings
    from workers.app import make_app
    from workers.queues import impatient

    kb.write("reviewq.toml", f'[queue]\nurl = "redis://127.0.0.1:1/0{query}"\n')
    with make_app(load_settings(kb.root)) as app:  # no connection is made
        impatient(app)
        timeouts = {
            h.storage.pool.connection_kwargs["socket_timeout"] for h in (app.review, app.control)
        }
    assert timeouts == {expected}


@pytest.mark.parametrize("queue", ["review", "control"])
def test_a_queue_file_deleted_while_its_processes_run_is_followed_to_the_new_one(kb, queue):
    """`rm STATE/queue/review.db*` (or control.db) while the control and a worker ran:
    each went on with the file it had open, deleted, and a process started after (a
    worker restarted) made a new one at the path. The control sent its reviews into the
    deleted file and the new worker waited on the other, for good (the reaper found each
    message still on the control's queue and sent it there again); or the old worker sent
    its outcomes where no control read them. Each process now looks, at most once a
    second, whether the path still names the file it has open, and opens it again."""
    small_kb(kb, notes=2)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    control = subprocess.Popen([*base, "control"], env=env, stderr=subprocess.PIPE)
    worker = subprocess.Popen([*base, "worker", "--workers", "1"], stderr=subprocess.DEVNULL)
    procs = [control, worker]
    # A bound: a control that never logs what is awaited is killed, and its stream ends.
    guard = threading.Timer(90, lambda: [p.kill() for p in procs])
    guard.start()
    review = ("enqueue", "--reviewer", "fake", "frontmatter", "--note")
    try:
        assert rq(kb, *review, "kb/notes/n0.md").returncode == 0
        _until(control.stderr, "job.finalized")
        for path in (kb.state / "queue").glob(f"{queue}.db*"):
            path.unlink()
        stop(worker)  # restarted: it opens the file at the path
        worker = subprocess.Popen([*base, "worker", "--workers", "1"], stderr=subprocess.DEVNULL)
        procs.append(worker)
        assert rq(kb, *review, "kb/notes/n1.md").returncode == 0
        _until(control.stderr, "job.finalized")
    finally:
        _stop_all(guard, procs)
    with db(kb) as conn:
        rows = conn.execute("SELECT job_id, attempt, outcome FROM attempts ORDER BY job_id")
        assert [tuple(r) for r in rows] == [(1, 1, "finalized"), (2, 1, "finalized")]
    replaced = [e for e in log_lines(kb) if e["event"] == "queue.file_replaced"]
    assert replaced and all(e["file"].endswith(f"queue/{queue}.db") for e in replaced)


def _queued_on_a_small_disk(kb, size: str, **limits: int):  # noqa: ANN001, ANN202 - a KBBuilder; a SmallDisk
    """A job queued, then the state folder moved onto a small tmpfs of its own (mounted:
    the caller unmounts it); skips where no tmpfs can be mounted."""
    from .fault.harness import SmallDisk

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs for the state folder")
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile())
    assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
    for bell in (kb.state / "queue").glob("*.bell"):
        bell.unlink()  # FIFOs, which SmallDisk's copy refuses; any process makes them again
    disk = SmallDisk(kb.state, size, **limits)
    try:
        disk.mount()
    except PermissionError as exc:
        pytest.skip(str(exc))
    return disk


def test_commands_on_a_full_state_disk_say_the_disk_is_full(kb):
    """The state folder's disk full (OPERATIONS §6.4): SQLite cannot grow state.db's WAL
    index there and says "disk I/O error", which `status`, `doctor` and every command
    read as "state.db: not a reviewq database"; a worker's queue file the same way was
    "another process holds it longer than the busy timeout … run the command again"; and
    a control whose state.db another process held open (its WAL index made already) met
    ENOSPC writing its pid to control.lock: "internal error … (please report it)"."""
    disk = _queued_on_a_small_disk(kb, "2m")
    full = f"the disk of {kb.state} is full"
    try:
        disk.fill()
        for args in (("status",), ("worker", "--workers", "1"), ("control",)):
            res = rq(kb, *args, timeout=60)
            last = res.stderr.strip().splitlines()[-1]
            assert (res.returncode, last.startswith("error: ")) == (1, True), res.stderr
            assert full in last and "free space there (OPERATIONS §6.4)" in last, res.stderr
        said = rq(kb, "doctor", timeout=60).stdout
        assert f"problem: state.db: {kb.state / 'state.db'}: cannot be opened" in said, said
        assert f"problem: queue backend: disk I/O error; {full}" in said, said
        assert "not a reviewq database" not in said, said
        (kb.state / ".filler").unlink()
        held = sqlite3.connect(kb.state / "state.db")  # another process's, WAL index made
        try:
            held.execute("SELECT count(*) FROM review_jobs").fetchone()
            disk.fill()
            res = rq(kb, "control", timeout=60)
        finally:
            held.close()
        assert res.returncode == 1, res.stderr
        assert res.stderr.strip().splitlines()[-1] == (
            f"error: {kb.state / 'control.lock'}: No space left on device; {full} "
            f"(0 bytes free): free space there (OPERATIONS §6.4)"
        ), res.stderr
    finally:
        disk.unmount()


def test_commands_on_a_state_disk_out_of_inodes_say_so(kb):
    """A state disk with bytes free and no inode left (a tmpfs' nr_inodes, a small ext4's
    many job folders): SQLite cannot make state.db's WAL or its index there and says
    "unable to open database file", which `status` read as "state.db: not a reviewq
    database" the first time and "reviewq needs write access to the state folder" after,
    to root; S49's look at the disk counted its bytes alone."""
    disk = _queued_on_a_small_disk(kb, "64m", inodes=400)
    try:
        disk.fill_inodes()
        for args in (("status",), ("status",), ("worker", "--workers", "1"), ("control",)):
            res = rq(kb, *args, timeout=60)
            last = res.stderr.strip().splitlines()[-1]
            assert (res.returncode, last.startswith("error: ")) == (1, True), res.stderr
            assert f"the disk of {kb.state} is out of inodes" in last, res.stderr
            assert "not a reviewq database" not in last and "access" not in last, last
        said = rq(kb, "doctor", timeout=60).stdout
        assert "is out of inodes" in said and "not a reviewq database" not in said, said
    finally:
        disk.unmount()


def test_a_sweeps_child_whose_stderr_is_on_a_full_disk_is_said_so(kb):
    """A sweep's child that keeps failing has its last stderr line quoted; on a full disk
    that line could not be written, and the sweep said "worker exited 1 four times
    (nothing on stderr)", pointing at the empty file, the disk unnamed. The worker fails
    here because its folder is a file; its stderr's folder is a full tmpfs."""
    from .fault.harness import SmallDisk

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs for the logs")
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
    (kb.state / "worker").write_text("a file where the worker's folder goes\n")
    logs = kb.state / "logs"
    disk = SmallDisk(logs, "256k")
    try:
        disk.mount()
    except PermissionError as exc:
        pytest.skip(str(exc))
    try:
        disk.fill()
        res = rq(kb, "sweep", "--reviewer", "fake", "--workers", "1", timeout=120)
    finally:
        disk.unmount()
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: worker exited 1 four times (nothing on stderr: the disk of {logs} is full "
        f"(0 bytes free): free space there (OPERATIONS §6.4)); see {logs / 'sweep-worker.stderr'}"
    ), res.stderr


def test_a_sweep_waiting_on_a_full_state_disk_says_so_and_goes_on_once_there_is_room(kb):
    """The state folder's disk full while a sweep waits on its jobs: the control defers
    them and says so in a log on that disk, which takes no line, and the sweep in the
    foreground waited without a word. It now says it once (`sweep.disk_full`), goes on
    waiting, and ends once there is room and a worker runs the jobs."""
    from .fault.harness import SmallDisk

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs for the state folder")
    small_kb(kb, notes=2)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    assert rq(kb, "doctor").returncode in (0, 1)  # makes the state folder and state.db
    for bell in (kb.state / "queue").glob("*.bell"):
        bell.unlink()  # FIFOs, which SmallDisk's copy refuses; any process makes them again
    disk = SmallDisk(kb.state, "8m")
    try:
        disk.mount()
    except PermissionError as exc:
        pytest.skip(str(exc))
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    procs: list[subprocess.Popen] = []
    guard = threading.Timer(150, lambda: [p.kill() for p in procs])
    guard.start()
    try:
        sweep = subprocess.Popen(
            [*base, "sweep", "--reviewer", "fake", "--workers", "0"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        procs.append(sweep)
        _await_logged(kb, "control.started")  # the sweep's: filled before, it never starts
        disk.fill()
        _until(sweep.stderr, "sweep.disk_full", timeout=30)
        (kb.state / ".filler").unlink()
        procs.append(
            subprocess.Popen([*base, "worker", "--workers", "1"], stderr=subprocess.DEVNULL)
        )
        _, err = sweep.communicate(timeout=120)
        assert sweep.returncode == 0, err.decode()
        assert err.count(b'"sweep.disk_full"') == 0  # said once, read above
        with contextlib.closing(db(kb)) as conn:
            done = dict(conn.execute("SELECT status, count(*) FROM review_jobs GROUP BY status"))
        assert done == {"completed": 4}
    finally:
        _stop_all(guard, procs)
        disk.unmount()


def test_a_tick_whose_send_waited_out_a_full_queue_disk_is_not_said_lost(kb):
    """The control's queue folder on a full disk for longer than 5 reaper periods: the
    tick's send was retried (`queue.retrying`) until the disk had room, and at the next
    period the tick just queued was said `control.tick_lost waited_s=22.6` ("lost with a
    Redis restarted empty") and a second was sent: the line named the wrong cause, the
    retry time counted as a wait on the queue (stop 45's leftover, stop 46)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs for the queue")
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    folder = kb.state / "queue"
    folder.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    procs: list[subprocess.Popen] = []
    guard = threading.Timer(150, lambda: [p.kill() for p in procs])
    guard.start()
    fill = folder / "fill"
    try:
        procs.append(subprocess.Popen([*base, "control"], env=env, stderr=subprocess.PIPE))
        control = procs[0]
        _until(control.stderr, "control.started")
        with open(fill, "wb") as f, contextlib.suppress(OSError):  # ENOSPC: full
            while True:
                f.write(b"\0" * 65536)
        _until(control.stderr, "queue.retrying")
        full_since = time.monotonic()
        # The sends retried for longer than a tick may wait (10 s here) before the disk
        # has room again.
        while time.monotonic() - full_since < 11:
            assert _until(control.stderr, "queue.retrying", "control.tick_lost") == "queue.retrying"
        # Queued now, run by no tick until the retried one is: its job's finalize comes
        # after the ticker's next look at that tick.
        assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode in (0, 1)
        fill.unlink()
        procs.append(
            subprocess.Popen(
                [*base, "worker", "--workers", "1"], env=env, stderr=subprocess.DEVNULL
            )
        )
        said = _until(control.stderr, "control.tick_lost", "job.finalized", timeout=90)
        assert said == "job.finalized"
    finally:
        _stop_all(guard, procs)
        fill.unlink(missing_ok=True)
        subprocess.run(["umount", str(folder)], check=False)


def test_a_sweep_in_a_process_whose_worker_stopped_runs_its_agents(kb, run_cli):
    """A worker's stop marks (K98's "a drain starts no agent") are the process's: a sweep
    run in a process where a worker had stopped (a test process; a forked child inherits
    them) had its worker abandon every message as "worker stopping before its agent
    started", and the sweep waited for good (the suite's in-process commands test, twice)."""
    from workers.attempt import STOP_ASKED, STOPPING

    small_kb(kb)
    STOP_ASKED.set()
    STOPPING.set()
    try:
        res = run_cli("sweep", "--reviewer", "offline", "--workers", "1", "--json")
    finally:
        STOP_ASKED.clear()
        STOPPING.clear()
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["failed"] == []
