"""state.db behind what happened: a nightly `.backup` put back, or a power cut that took
its last commits (``synchronous = NORMAL``), while the queues, the job folders and the
workers went on. Job ids and attempt numbers are handed out again from the older record;
what the lost history left on the queues must not be taken for the new jobs."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.state.workspace import Workspace
from orchestrator.sweeps.producer import SweepRequest, enqueue

from .conftest import stop
from .test_queue_integration import FAST_QUEUE, fake_profile, redis_url

pytestmark = pytest.mark.integration
__all__ = ["redis_url"]  # a fixture, used by name
EXE = str(Path(sys.executable).parent / "reviewq")


def _copy(src: Path, dest: Path) -> None:
    """SQLite's backup API, as `sqlite3 state.db .backup` and `.restore` use it."""
    with sqlite3.connect(src) as a, sqlite3.connect(dest) as b:
        a.backup(b)
    a.close(), b.close()


def _worker(kb, **env: str) -> subprocess.Popen:
    """A real `reviewq worker` with one slot on ``kb``, its fake agent told ``env``."""
    return subprocess.Popen(
        [EXE, "--root", str(kb.root), "worker", "--workers", "1"],
        env={**os.environ, **env},
        stderr=subprocess.DEVNULL,
    )


def _run_worker_until_outcomes(kb, app, count: int, sleep_s: float = 0) -> None:
    """A real worker takes what waits on the review queue; stopped once ``count``
    outcomes wait on the control queue (no control runs meanwhile). Its agents sleep
    ``sleep_s`` first."""
    worker = _worker(kb, FAKE_PASS_IF_CONTAINS="GOOD", FAKE_SLEEP=str(sleep_s))
    try:
        deadline = time.monotonic() + 60
        while app.control.pending_count() < count:
            assert worker.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)  # a queue row, which nothing signals
    finally:
        stop(worker)


def _take_waiting(app) -> None:
    while app.control.pending_count():
        app.control.execute(app.control.dequeue())


@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_an_outcome_of_a_lost_history_is_not_taken_for_the_job_given_its_id(
    kb, tmp_path, monkeypatch, request, queue
):
    """Night 1 reviewed alpha (FAIL: it lacked GOOD), its outcome still on the control
    queue when the control stopped; state.db was then put back from the backup taken
    before that night. Night 2 queued alpha, rewritten (now GOOD), as job 1 again, attempt
    1 again: the old outcome was judged as this attempt's, a FAIL recorded against a text
    no agent had read."""
    from orchestrator.control.control import Control
    from orchestrator.control.followup import FollowUp
    from workers import tasks
    from workers.app import make_app
    from workers.queues import send

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", body="Body, not yet.\n")
    url = f'url = "{request.getfixturevalue("redis_url")}"\n' if queue == "redis" else ""
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + url)
    ws = Workspace.open(kb.root)
    ws.store.install_id()  # state.db made, as by an earlier night
    _copy(ws.state_dir / "state.db", tmp_path / "nightly.db")  # last night's backup
    app = make_app(ws.settings)
    enqueue(ws, SweepRequest(name="cli", reviewer="fake", all_gates=True))
    assert Control(ws, send_review=lambda m: send("run_review", m)).dispatch() == 1
    _run_worker_until_outcomes(kb, app, 1)
    ws.close()

    _copy(tmp_path / "nightly.db", ws.state_dir / "state.db")  # the operator's restore
    kb.note("alpha", body="Body, GOOD now.\n")
    ws = Workspace.open(kb.root)
    enqueue(ws, SweepRequest(name="cli", reviewer="fake", all_gates=True))
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    assert control.dispatch() == 1 and (sent[0]["job_id"], sent[0]["attempt"]) == (1, 1)
    app = make_app(ws.settings)
    monkeypatch.setattr(tasks, "_control", control)
    _take_waiting(app)  # night 1's outcome, for job 1 attempt 1
    conn = ws.store.conn
    assert conn.execute("SELECT count(*) FROM acceptance").fetchone()[0] == 0
    outcomes = conn.execute("SELECT outcome FROM attempts WHERE job_id = 1").fetchall()
    assert [tuple(r) for r in outcomes] == [("dispatched",)]
    assert not (ws.state_dir / "jobs/review-job-1/attempt-1/bundle-output.md").exists()
    # This night's own message runs, and its outcome decides.
    send("run_review", sent[0])
    _run_worker_until_outcomes(kb, app, 1)
    _take_waiting(app)
    decisions = conn.execute("SELECT decision FROM acceptance").fetchall()
    assert [tuple(r) for r in decisions] == [("PASS",)]
    ws.close()


def test_the_job_folders_of_a_lost_history_are_kept_aside_not_emptied_or_mixed(kb, tmp_path):
    """The nightly backup held job 1 (alpha) queued; night 1 then ran it and job 2 (beta),
    both FAILed, and state.db was put back. Night 2 ran job 1 again and made job 2 anew:
    job 2's creation emptied night 1's folder of that number, and job 1's attempt 1 was
    written into night 1's attempt-1 folder: night 1's outputs and logs, the only record
    of reviews paid for, were gone or overwritten by another night's."""
    from .test_queue_integration import db, rq

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", body="Body a.\n")
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    assert rq(kb, "enqueue", "--reviewer", "fake", "--all-gates").returncode == 0
    _copy(kb.state / "state.db", tmp_path / "nightly.db")  # job 1 queued
    kb.note("beta", body="Body b.\n")
    night = rq(kb, "sweep", "--reviewer", "fake", "--all-gates", env={"FAKE_DECISIONS": "FAIL"})
    assert night.returncode == 0, night.stderr
    jobs = kb.state / "jobs"
    night1 = {p.read_bytes() for p in jobs.glob("review-job-*/attempt-1/bundle-output.md")}
    assert len(night1) == 2 and all(b"## Result: FAIL" in b for b in night1)

    _copy(tmp_path / "nightly.db", kb.state / "state.db")
    night = rq(kb, "sweep", "--reviewer", "fake", "--all-gates")
    assert night.returncode == 0, night.stderr
    with db(kb) as conn:
        rows = conn.execute("SELECT id, status FROM review_jobs ORDER BY id").fetchall()
    assert [tuple(r) for r in rows] == [(1, "completed"), (2, "completed")]
    for i in (1, 2):  # night 2's own, alone
        attempt = jobs / f"review-job-{i}" / "attempt-1"
        assert b"## Result: PASS" in (attempt / "bundle-output.md").read_bytes()
    # Night 1's outputs are where the log says they were put.
    kept = {p.read_bytes() for p in kb.state.rglob("bundle-output.md")}
    assert night1 <= kept
    aside = [
        json.loads(line)
        for line in (kb.state / "logs" / "reviewq.jsonl").read_text().splitlines()
        if '"job.folder_set_aside"' in line
    ]
    assert sorted(Path(e["moved_to"]).name.split(".")[0] for e in aside) == [
        "review-job-1",
        "review-job-2",
    ]


def test_rewrite_files_after_a_restore_leaves_no_result_state_db_does_not_hold(kb, tmp_path):
    """OPERATIONS' restore ends with `rewrite-files`: a job the backup held queued, decided
    after it, kept its results/ (a FAIL here) beside a MANIFEST.json that said queued,
    and doctor said the job files were written. results/ is a rendering of the decisions
    state.db holds: none, no folder."""
    from .test_queue_integration import rq

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", body="Body a.\n")
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    assert rq(kb, "enqueue", "--reviewer", "fake", "--all-gates").returncode == 0
    _copy(kb.state / "state.db", tmp_path / "nightly.db")  # job 1 queued
    night = rq(kb, "sweep", "--reviewer", "fake", "--all-gates", env={"FAKE_DECISIONS": "FAIL"})
    assert night.returncode == 0, night.stderr
    results = kb.state / "jobs" / "review-job-1" / "results"
    assert len(list(results.iterdir())) == 1

    _copy(tmp_path / "nightly.db", kb.state / "state.db")
    done = rq(kb, "rewrite-files")
    assert done.returncode == 0, done.stderr
    manifest = json.loads((results.parent / "MANIFEST.json").read_text())
    assert manifest["status"] == "queued"
    assert not results.exists() and not results.is_symlink()


def test_doctor_says_the_job_folders_state_db_does_not_record(kb, tmp_path):
    """After a restore, or a power cut that took state.db's last commits (nobody knows it
    happened), doctor said "ok" throughout while jobs/ held the folders of jobs the record
    had lost: the night's reviews gone from status, the report and select unsaid."""
    from .test_queue_integration import rq

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", body="Body a.\n")
    kb.note("beta", body="Body b.\n")
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    assert rq(kb, "enqueue", "--reviewer", "fake", "--note", "kb/notes/alpha.md").returncode == 0
    _copy(kb.state / "state.db", tmp_path / "nightly.db")  # job 1
    night = rq(kb, "sweep", "--reviewer", "fake", "--all-gates")
    assert night.returncode == 0, night.stderr
    assert (kb.state / "jobs" / "review-job-2").is_dir()
    before = rq(kb, "doctor")
    assert before.returncode == 0 and "warning" not in before.stdout, before.stdout

    _copy(tmp_path / "nightly.db", kb.state / "state.db")
    doctor = rq(kb, "doctor")
    assert doctor.returncode == 0, doctor.stdout  # a warning: no health check fails for good
    (line,) = [x for x in doctor.stdout.splitlines() if "does not record" in x]
    assert line.startswith("warning: ") and "review-job-2" in line and "lost-history" in line


def _events(kb, name: str) -> list[dict]:
    path = kb.state / "logs" / "reviewq.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(x) for x in lines if f'"{name}"' in x]


def test_a_lost_historys_agent_is_said_once_and_stopped_not_left_to_run(kb, tmp_path):
    """Night 1 dispatched job 1 attempt 1 (alpha, not yet GOOD) and stopped before a
    worker took it; state.db was then put back from the backup taken before that night.
    Night 2's control dispatched job 1 attempt 1 again, for alpha now GOOD, and one
    worker took both messages. The lost history's agent ran to its end for an outcome
    that was dropped, each of its beats (every quarter lease) dropped with a warning of
    its own; and both attempts ran in one folder, `attempts/job-1-attempt-1`: the first to
    end removed it, and night 2's agent, its output gone, failed its attempt. Said once
    for its beats and once for its outcome, the lost agent is asked to stop at its first
    beat; night 2's agent of the same numbers runs on in its own folder and decides."""
    from orchestrator.control.control import Control
    from workers.app import make_app
    from workers.queues import send

    from .test_queue_integration import db, rq

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", body="Body, not yet.\n")
    kb.write("reviewq.toml", fake_profile(timeout='"60s"') + FAST_QUEUE)
    ws = Workspace.open(kb.root)
    ws.store.install_id()  # state.db made, as by an earlier night
    ws.close()
    _copy(kb.state / "state.db", tmp_path / "nightly.db")  # last night's backup
    assert rq(kb, "enqueue", "--reviewer", "fake", "--all-gates").returncode == 0
    ws = Workspace.open(kb.root)
    make_app(ws.settings)
    assert Control(ws, send_review=lambda m: send("run_review", m)).dispatch() == 1
    ws.close()

    _copy(tmp_path / "nightly.db", kb.state / "state.db")
    kb.note("alpha", body="Body, GOOD now.\n")
    assert rq(kb, "enqueue", "--reviewer", "fake", "--all-gates").returncode == 0
    base = [EXE, "--root", str(kb.root)]
    # Each agent sleeps as long as eight beats: the lost one beat all through its run.
    env = {**os.environ, "FAKE_PASS_IF_CONTAINS": "GOOD", "FAKE_SLEEP": "4"}
    control = subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)
    worker = None
    worker_err = tmp_path / "worker.err"
    try:
        deadline = time.monotonic() + 60
        while not _events(kb, "attempt.dispatched"):  # night 2's, behind night 1's
            assert control.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)  # a log line, which nothing signals
        with worker_err.open("wb") as err:
            worker = subprocess.Popen([*base, "worker", "--workers", "2"], env=env, stderr=err)
        while not (
            _decided(kb)
            and any(e["message"] == "outcome" for e in _events(kb, "message.other_history"))
        ):
            assert worker.poll() is None and control.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.1)  # rows and log lines, which nothing signals
    finally:
        stop(control)
        if worker is not None:
            stop(worker)
    said = [e["message"] for e in _events(kb, "message.other_history")]
    assert said == ["heartbeat", "outcome"], said
    with db(kb) as conn:
        decisions = conn.execute("SELECT decision FROM acceptance").fetchall()
        ended = conn.execute("SELECT outcome, reasons FROM attempts WHERE job_id = 1").fetchall()
    assert [tuple(r) for r in decisions] == [("PASS",)]
    assert [r[0] for r in ended] == ["finalized"] and "stopped" not in (ended[0][1] or "")
    # The lost one alone was stopped, at its first beats.
    (stopping,) = [x for x in worker_err.read_text().splitlines() if "attempt.stopping" in x]
    assert "history state.db no longer has" in stopping


def _decided(kb) -> bool:
    from .test_queue_integration import db

    with db(kb) as conn:
        return conn.execute("SELECT count(*) FROM acceptance").fetchone()[0] > 0


def _night_1_dispatched(kb, tmp_path, stops: bool = False, url: str = ""):
    """The backup taken before night 1; night 1's job 1 attempt 1 (alpha, not yet GOOD)
    on the review queue (``url``'s, or the SQLite one); its control and message."""
    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", body="Body, not yet.\n")
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + (f'url = "{url}"\n' if url else ""))
    ws = Workspace.open(kb.root)
    ws.store.install_id()  # state.db made, as by an earlier night
    _copy(ws.state_dir / "state.db", tmp_path / "nightly.db")  # last night's backup
    app, control, sent = _dispatched(ws, stops)
    return ws, app, control, sent[0]


def _dispatched(ws: Workspace, stops: bool):
    """A sweep of every gate enqueued, and its one job dispatched by a control of the
    test's own: the app, the control and the review messages it sent."""
    from orchestrator.control.control import Control
    from orchestrator.control.followup import FollowUp
    from workers.app import make_app
    from workers.queues import StopRequests, send

    app = make_app(ws.settings)
    enqueue(ws, SweepRequest(name="cli", reviewer="fake", all_gates=True))
    sent: list[dict] = []
    control = Control(
        ws,
        send_review=lambda m: (sent.append(m), send("run_review", m)),
        hooks=FollowUp(ws),
        stops=StopRequests(app.review) if stops else None,
    )
    assert control.dispatch() == 1
    return app, control, sent


def _night_2_dispatched(kb, tmp_path, monkeypatch):
    """state.db put back, alpha GOOD now, night 2's job 1 attempt 1 on the review queue."""
    from workers import tasks

    _copy(tmp_path / "nightly.db", kb.state / "state.db")  # the operator's restore
    kb.note("alpha", body="Body, GOOD now.\n")
    ws = Workspace.open(kb.root)
    app, control, sent = _dispatched(ws, stops=True)
    assert (sent[0]["job_id"], sent[0]["attempt"]) == (1, 1)
    monkeypatch.setattr(tasks, "_control", control)
    return ws, app, sent


def _night_2_decided(ws, sent) -> None:
    conn = ws.store.conn
    decisions = conn.execute("SELECT decision FROM acceptance").fetchall()
    ended = conn.execute("SELECT outcome, reasons FROM attempts WHERE job_id = 1").fetchall()
    assert [tuple(r) for r in ended] == [("finalized", "[]")]
    assert [tuple(r) for r in decisions] == [("PASS",)] and len(sent) == 1


@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_a_stop_request_of_a_lost_history_does_not_stop_the_attempt_given_its_numbers(
    kb, tmp_path, monkeypatch, request, queue
):
    """Night 1's job 1 attempt 1 ended (FAIL), and a late beat of it (a second agent, a
    send retried) had the control ask its worker to stop that agent: a request keyed by
    the numbers alone, left on the queue when state.db was put back. Night 2's attempt of
    the same numbers read it at its first beat and was stopped: no output, an attempt
    burned, the job run again."""
    from workers import tasks

    url = request.getfixturevalue("redis_url") if queue == "redis" else ""
    ws, app, control, msg = _night_1_dispatched(kb, tmp_path, stops=True, url=url)
    monkeypatch.setattr(tasks, "_control", control)
    _run_worker_until_outcomes(kb, app, 1)
    _take_waiting(app)  # night 1 decides FAIL
    late = {"v": 4, "job_id": 1, "attempt": 1, "worker": "vm:1", "host": "vm"}
    late |= {"launched": True, "started_at": "2026-01-01T00:00:00Z", "opened_at": msg["opened_at"]}
    control.on_messages([late], [])  # its request, as night 1's control asks it
    assert app.review.get("reviewq.stop.1.1", peek=True) is not None  # a table row, a hash
    ws.close()

    ws, app, sent = _night_2_dispatched(kb, tmp_path, monkeypatch)
    _run_worker_until_outcomes(kb, app, 1, sleep_s=2)  # a few beats, each reading requests
    _take_waiting(app)
    _night_2_decided(ws, sent)
    ws.close()


def test_a_reap_notice_of_a_lost_history_does_not_lose_the_attempt_given_its_numbers(
    kb, tmp_path, monkeypatch
):
    """Night 1's worker died (SIGKILL) with its agent of job 1 attempt 1 running, and
    state.db was put back. Night 2 dispatched job 1 attempt 1 again; the worker started
    next on that host reaped the dead one's agent and said so: a notice by numbers alone,
    which lost night 2's attempt (not yet taken by any worker) and ran the job again."""
    import signal

    ws, app, control, msg = _night_1_dispatched(kb, tmp_path)
    worker = _worker(kb, FAKE_SLEEP="60")
    try:
        registry = kb.state / "worker" / "run" / "agents"
        deadline = time.monotonic() + 60
        while not list(registry.glob("*-*[0-9].json")):  # its agent launched
            assert worker.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)  # a file, which nothing signals
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    ws.close()

    ws, app, sent = _night_2_dispatched(kb, tmp_path, monkeypatch)
    _run_worker_until_outcomes(kb, app, 2)  # its reap notice, then night 2's outcome
    _take_waiting(app)
    _night_2_decided(ws, sent)
    ws.close()


def test_a_folder_kept_under_the_name_before_openings_goes_once_its_grace_is_past(kb, tmp_path):
    """A worker of the release before openings named folders (its attempt folder
    `job-1-attempt-1`) was stopped for the upgrade with its agent just launched: it kept
    the folder, prompt and all, for the run it queued again. The upgraded worker, started
    seconds later, left it to its grace (a folder that young may be one being made), and
    ran the attempt in `job-1-attempt-1-OPENING`: nothing took the old one up, as the same
    name had, and it stayed, a prompt quoting notes, until the worker's next start."""
    from orchestrator.control.control import Control
    from workers.app import make_app
    from workers.attempt import _CLAIM_GRACE_S
    from workers.queues import send

    from .test_queue_integration import rq

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", body="Body, GOOD.\n")
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    assert rq(kb, "enqueue", "--reviewer", "fake", "--all-gates").returncode == 0
    ws = Workspace.open(kb.root)
    app = make_app(ws.settings)
    sent: list[dict] = []
    control = Control(ws, send_review=lambda m: (sent.append(m), send("run_review", m)))
    assert control.dispatch() == 1
    ws.close()
    attempts = kb.state / "worker" / "attempts"
    kept = attempts / "job-1-attempt-1"  # the earlier release's name for it
    kept.mkdir(parents=True)
    (kept / "prompt.md").write_text(sent[0]["prompt"])
    young = time.time() - _CLAIM_GRACE_S + 4  # made seconds before the upgrade
    os.utime(kept, (young, young))
    worker = _worker(kb, FAKE_PASS_IF_CONTAINS="GOOD")
    try:
        deadline = time.monotonic() + 30
        while app.control.pending_count() < 1 or kept.exists():
            assert worker.poll() is None and time.monotonic() < deadline, list(attempts.iterdir())
            time.sleep(0.1)  # a queue row and a folder's removal, which nothing signals
    finally:
        stop(worker)
    assert list(attempts.iterdir()) == []
