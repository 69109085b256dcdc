"""state.db behind what happened: a nightly `.backup` put back, or a power cut that took
its last commits (``synchronous = NORMAL``), while the queues, the job folders and the
workers went on. Job ids and attempt numbers are handed out again from the older record;
what the lost history left on the queues must not be taken for the new jobs."""

from __future__ import annotations

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
from .test_queue_integration import FAST_QUEUE, fake_profile

pytestmark = pytest.mark.integration
EXE = str(Path(sys.executable).parent / "reviewq")


def _copy(src: Path, dest: Path) -> None:
    """SQLite's backup API, as `sqlite3 state.db .backup` and `.restore` use it."""
    with sqlite3.connect(src) as a, sqlite3.connect(dest) as b:
        a.backup(b)
    a.close(), b.close()


def _run_worker_until_outcomes(kb, app, count: int) -> None:
    """A real worker takes what waits on the review queue; stopped once ``count``
    outcomes wait on the control queue (no control runs meanwhile)."""
    env = {**os.environ, "FAKE_PASS_IF_CONTAINS": "GOOD"}
    worker = subprocess.Popen(
        [EXE, "--root", str(kb.root), "worker", "--workers", "1"],
        env=env,
        stderr=subprocess.DEVNULL,
    )
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


def test_an_outcome_of_a_lost_history_is_not_taken_for_the_job_given_its_id(
    kb, tmp_path, monkeypatch
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
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
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
    # This night's own message runs, and its outcome decides.
    send("run_review", sent[0])
    _run_worker_until_outcomes(kb, app, 1)
    _take_waiting(app)
    decisions = conn.execute("SELECT decision FROM acceptance").fetchall()
    assert [tuple(r) for r in decisions] == [("PASS",)]
    ws.close()
