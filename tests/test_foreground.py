"""``reviewq run-job``: one attempt in the foreground, beside a running control process."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.state.workspace import Workspace
from workers.foreground import run_job

from .conftest import reviewq_process
from .test_cycles_integration import queue_fix
from .test_queue_integration import FAST_QUEUE, db, fake_profile, log_lines, rq, small_kb

pytestmark = pytest.mark.integration


def _one_job_for_fake(kb) -> None:
    """Job 1: the note's frontmatter gate for the fake reviewer, made as a person would."""
    sel = rq(kb, "select", "frontmatter", "--model", "fake", "--json")
    made = reviewq_process(
        "--root",
        str(kb.root),
        "create-jobs",
        "--input",
        "-",
        "--grouping",
        "note",
        input=sel.stdout,
    )
    assert made.returncode == 0, made.stderr


def _run_job_in_session(kb, tmp_path, fifo: str, *fifo_vars: str, **env: str):  # noqa: ANN001, ANN202 - fixtures
    """Job 1 of a one-note KB run by `reviewq run-job` in its own session for the fake
    reviewer: the process, and the FIFO named ``fifo`` that each of ``fifo_vars`` (a fault
    point, the agent's pid file) names in its environment with ``env`` (the event a test
    awaits)."""
    import os

    from .test_queue_integration import make_fifo

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile())
    _one_job_for_fake(kb)
    path = make_fifo(tmp_path, fifo)
    env = {**os.environ, **env, **dict.fromkeys(fifo_vars, str(path))}
    exe = str(Path(sys.executable).parent / "reviewq")
    proc = subprocess.Popen(
        [exe, "--root", str(kb.root), "run-job", "1", "--reviewer", "fake"],
        env=env, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    return proc, path


def test_run_job_keeps_its_lease_while_a_control_process_reaps(kb):
    small_kb(kb, notes=1)
    # A lease of 1 s and a reaper every 0.2 s: an attempt with no heartbeats is lost at once.
    kb.write(
        "reviewq.toml",
        fake_profile()
        + FAST_QUEUE.replace("lease_seconds = 2", "lease_seconds = 1").replace(
            "reaper_seconds = 0.5", "reaper_seconds = 0.2"
        ),
    )
    _one_job_for_fake(kb)
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    control = subprocess.Popen([*base, "control"], stderr=subprocess.DEVNULL)
    try:
        res = rq(kb, "run-job", "1", "--reviewer", "fake", env={"FAKE_SLEEP": "3"})
    finally:
        control.send_signal(signal.SIGINT)
        control.wait(timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr
    with db(kb) as conn:
        outcomes = [tuple(r) for r in conn.execute("SELECT attempt, outcome FROM attempts")]
        status = conn.execute("SELECT status FROM review_jobs WHERE id = 1").fetchone()[0]
    assert outcomes == [(1, "finalized")] and status == "completed"
    # Reaped, the job would be queued again and a worker could run a second agent on it.
    assert not [e for e in log_lines(kb) if e["event"] == "attempt.lost"]


def test_a_reaper_between_run_jobs_end_and_its_finalize_does_not_take_the_attempt(kb, monkeypatch):
    """The attempt's end and its finalize are one transaction: a control process's reaper
    that runs between them would otherwise find an attempt that "ended but was not acted
    on", queue the job again, and a worker would run a second agent on it."""
    from orchestrator.control.control import Control
    from orchestrator.control.followup import FollowUp
    from workers import foreground

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile())
    _one_job_for_fake(kb)
    other = Workspace.open(kb.root)  # the control process's own connection
    control = Control(other, send_review=lambda msg: None, hooks=FollowUp(other))
    reaped: list[int] = []
    original = foreground.finalize_by_hand

    def reap_first(*args, **kwargs):
        reaped.append(control.reap())
        return original(*args, **kwargs)

    monkeypatch.setattr(foreground, "finalize_by_hand", reap_first)
    ws = Workspace.open(kb.root)
    res = run_job(ws, 1, "fake")
    assert res.ok, res.outcome.reasons
    assert reaped == [0]
    row = ws.store.conn.execute("SELECT status, attempt FROM review_jobs WHERE id = 1").fetchone()
    assert tuple(row) == ("completed", 1)
    ws.close()
    other.close()


def _a_queued_fix(kb) -> tuple[str, int, Workspace]:
    """A note whose one gate FAILed, and the fix job queued for it (the workspace open)."""
    kb.gate("prose/body-check", ["body"])
    note = kb.note("alpha", body="Alpha body.\n")
    kb.write("reviewq.toml", fake_profile())
    kb.accept("fake", [(note, "prose/body-check")], decision="FAIL")
    ws = Workspace.open(kb.root)
    return note, queue_fix(ws.kb, ws.store, ws.state_dir, note), ws


def test_run_job_of_a_fix_job_applies_the_fixed_note(kb, monkeypatch):
    note, job_id, ws = _a_queued_fix(kb)
    monkeypatch.setenv("FAKE_FIX_APPEND", "FIXED by run-job.")
    res = run_job(ws, job_id, "fake")
    assert res.outcome.classification == "output", res.outcome.reasons
    assert res.ok
    assert "FIXED by run-job." in kb.read(note)
    row = ws.store.conn.execute(
        "SELECT status, result FROM review_jobs WHERE id = ?", (job_id,)
    ).fetchone()
    assert tuple(row) == ("completed", "applied")
    ws.close()


def test_the_note_run_job_gives_a_fixer_is_its_owners_alone_whatever_the_umask(kb):
    """U97: N28 made every file reviewq writes in the state folder 0600, but run-job wrote
    the note it gives a fixer (``attempt-N/note.md``, the note's whole text) with the
    umask's 0644, beside the attempt's 0600 prompt."""
    import os
    import stat

    _, job_id, ws = _a_queued_fix(kb)
    ws.close()
    umask = os.umask(0o022)
    try:
        res = reviewq_process("--root", str(kb.root), "run-job", str(job_id))
    finally:
        os.umask(umask)
    assert res.returncode == 0, res.stderr
    given = kb.state / "jobs" / f"review-job-{job_id}" / "attempt-1" / "note.md"
    assert stat.S_IMODE(given.stat().st_mode) == 0o600


def test_run_job_with_a_reviewer_of_another_partition_is_one_line_and_starts_nothing(kb, run_cli):
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile())
    assert run_cli("enqueue", "--reviewer", "offline").exit_code == 0
    res = run_cli("run-job", "1", "--reviewer", "fake")
    assert (res.exit_code, res.stderr) == (
        1,
        "error: reviewer fake writes partition fake, but job 1 belongs to offline\n",
    )
    with db(kb) as conn:
        assert tuple(conn.execute("SELECT status, attempt FROM review_jobs").fetchone()) == (
            "queued",
            0,
        )
        assert conn.execute("SELECT count(*) FROM attempts").fetchone()[0] == 0


def _fix_job_then_a_persons_edit(kb, fixer_toml: str) -> tuple[Workspace, int, str, str]:
    """A FAIL, a fix job queued for it, then a person's edit of the note before it runs."""
    kb.gate("prose/body-check", ["body"])
    note = kb.note("alpha", body="Alpha body.\n")
    kb.write("reviewq.toml", fixer_toml)
    kb.accept("offline", [(note, "prose/body-check")], decision="FAIL")
    ws = Workspace.open(kb.root)
    job_id = queue_fix(ws.kb, ws.store, ws.state_dir, note, partition="offline", fixer="given")
    person = kb.read(note) + "A person's sentence.\n"
    kb.write(note, person)
    return ws, job_id, note, person


# Returns exactly the note it was handed in REVIEWQ_NOTE_FILE: a fix that changes nothing.
GIVEN_BACK = (
    '[reviewers.given]\nkind = "command"\npartition = "offline"\n'
    'command = ["sh", "-c", "cat \\"$REVIEWQ_NOTE_FILE\\" > \\"$REVIEWQ_OUTPUT_PATH\\""]\n'
)


def test_a_fix_that_changed_nothing_after_a_persons_edit_is_not_a_rejection(kb):
    """The person's edit wins (CONTRACT §7): the fix is not applied, and handing back the
    text it was given is not counted against a note the person has changed since."""
    from orchestrator.cycles import escalations as cycles

    ws, job_id, note, person = _fix_job_then_a_persons_edit(kb, GIVEN_BACK)
    before = cycles.count(ws.store, "offline", note, "prose/body-check")
    res = run_job(ws, job_id, "given")
    assert res.outcome.classification == "output", res.outcome.reasons
    row = ws.store.conn.execute(
        "SELECT status, result FROM review_jobs WHERE id = ?", (job_id,)
    ).fetchone()
    assert tuple(row) == ("completed", "not-applied")
    assert cycles.count(ws.store, "offline", note, "prose/body-check") == before
    events = ws.store.conn.execute("SELECT count(*) FROM cycle_events").fetchone()[0]
    assert events == 0
    assert kb.read(note) == person
    ws.close()


@pytest.mark.parametrize("mode", ["good", "nothing"])
def test_run_job_leaves_alone_an_attempt_the_reaper_took_meanwhile(kb, monkeypatch, mode):
    """A run-job stopped for a while (Ctrl-Z) came back after the reaper had taken its
    attempt for lost and a worker had started the next: it rewrote the lost attempt's
    outcome, and with no output failed the job under the running attempt, whose valid
    output was then thrown away."""
    from orchestrator.control.attempts import open_attempt
    from workers import foreground

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile())
    _one_job_for_fake(kb)
    other = Workspace.open(kb.root)  # the control process's connection
    original = foreground.run_attempt

    def reaped_meanwhile(*args, **kwargs):
        outcome = original(*args, **kwargs)
        with other.store.write():
            other.store.conn.execute(
                "UPDATE attempts SET outcome = 'lost', ended_at = '2026-01-01T00:00:00.000Z' "
                "WHERE job_id = 1 AND attempt = 1"
            )
            other.store.conn.execute("UPDATE review_jobs SET status = 'queued' WHERE id = 1")
        open_attempt(other.store, other.state_dir, other.root, 1, "worker", partition="fake")
        return outcome

    monkeypatch.setattr(foreground, "run_attempt", reaped_meanwhile)
    monkeypatch.setenv("FAKE_MODE", mode)
    ws = Workspace.open(kb.root)
    try:
        res = run_job(ws, 1, "fake")
        assert not res.ok
        assert res.finalized is not None and res.finalized.status == "superseded"
        rows = ws.store.conn.execute(
            "SELECT attempt, outcome FROM attempts WHERE job_id = 1 ORDER BY attempt"
        ).fetchall()
        assert [tuple(r) for r in rows] == [(1, "lost"), (2, "running")]
        job = ws.store.conn.execute("SELECT status, attempt FROM review_jobs WHERE id = 1")
        assert tuple(job.fetchone()) == ("running", 2)
    finally:
        ws.close()
        other.close()


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_run_job_stops_its_agent_and_queues_the_job_again(kb, tmp_path, how):
    """Ctrl-C left the job and its attempt running, for good without a control process
    (enqueue then skipped its pairs); SIGTERM or a closed terminal (SIGHUP) left the
    agent running unwatched as well, and no worker ever reaped it."""
    import os

    from .conftest import process_gone
    from .test_queue_integration import await_fifo

    proc, pids = _run_job_in_session(kb, tmp_path, "pids", "FAKE_PIDFILE", FAKE_MODE="hang")
    try:
        leader, child = map(int, await_fifo(pids).split())
        proc.send_signal(how)
        assert proc.wait(timeout=30) == 130
        assert "error: interrupted" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert process_gone(leader) and process_gone(child)
    with db(kb) as conn:
        job = conn.execute("SELECT status FROM review_jobs WHERE id = 1").fetchone()[0]
        attempt = conn.execute("SELECT outcome, reasons FROM attempts WHERE job_id = 1").fetchone()
    assert job == "queued"
    assert attempt["outcome"] == "lost" and "run-job was stopped" in attempt["reasons"]


def test_run_job_writes_the_jobs_folder_before_its_agent_starts(kb):
    """A job made while its folder could not be written (a full disk) was run by hand
    with no MANIFEST.json: the agent failed, counted as a launch failure."""
    from orchestrator.state.files import mark_job_files_due

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile())
    _one_job_for_fake(kb)
    ws = Workspace.open(kb.root)
    try:
        manifest = next((kb.state / "jobs").rglob("MANIFEST.json"))
        manifest.unlink()  # as the full disk left it: due, and not there
        mark_job_files_due(ws.store, [1])
        res = run_job(ws, 1, "fake")
        assert res.ok, res.outcome.reasons
        assert manifest.exists()
    finally:
        ws.close()


def test_run_job_splits_a_multi_pair_job_that_burned_out(kb, monkeypatch):
    """CONTRACT §6: a multi-pair job that burns out is split into one-pair jobs, which may
    fit. By hand it was failed, with no split and no escalation."""
    kb.gate("prose/body-check", ["body"])
    kb.gate("prose/tone-check", ["body"])
    kb.note("alpha", body="Alpha body.\n")
    kb.write("reviewq.toml", fake_profile(timeout='"1s"'))
    sel = rq(kb, "select", "prose", "--model", "fake", "--json")
    made = reviewq_process(
        "--root", str(kb.root), "create-jobs", "--input", "-", "--grouping", "note",
        input=sel.stdout,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    monkeypatch.setenv("FAKE_MODE", "hang")
    ws = Workspace.open(kb.root)
    try:
        res = run_job(ws, 1, "fake")
        assert res.outcome.classification == "burned-out"
        assert res.finalized is not None and res.finalized.status == "split"
        rows = ws.store.conn.execute("SELECT id, status FROM review_jobs ORDER BY id").fetchall()
        assert [tuple(r) for r in rows] == [(1, "split"), (2, "queued"), (3, "queued")]
    finally:
        ws.close()


@pytest.mark.parametrize("kb_given", [False, True])
def test_a_worker_without_kb_on_the_kbs_machine_says_its_agents_are_unguarded(kb, kb_given):
    """Started without --kb beside the KB (OPERATIONS showed it so), a worker ran every
    agent with no check that it left the notes alone, and said nothing."""
    import json
    import os

    small_kb(kb, notes=1)
    exe = str(Path(sys.executable).parent / "reviewq")
    argv = [exe, "--root", str(kb.root), "worker", "--workers", "1"]
    argv += ["--kb", str(kb.root)] if kb_given else []
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    events = []
    try:
        for line in proc.stderr:  # up to its start, which is logged after the warning
            if line.startswith("{"):
                events.append(json.loads(line)["event"])
            if "worker.started" in events:
                break
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert "worker.started" in events
    assert ("worker.kb_unguarded" in events) is not kb_given


def test_a_run_job_stopped_while_it_finalizes_queues_the_job_again(kb, tmp_path):
    """Only the agent's run was covered: Ctrl-C while the output was being finalized
    exited 130 and left the job and its attempt running for good."""
    import os

    proc, fifo = _run_job_in_session(
        kb, tmp_path, "finalize", "REVIEWQ_FAULT_FINALIZE_MID_TRANSACTION"
    )
    try:
        with open(fifo) as f:  # the process is mid-finalize once it says its pid
            assert int(f.read().split()[0]) == proc.pid
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130, proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with db(kb) as conn:
        job = conn.execute("SELECT status FROM review_jobs WHERE id = 1").fetchone()[0]
        attempt = conn.execute("SELECT outcome FROM attempts WHERE job_id = 1").fetchone()[0]
    assert (job, attempt) == ("queued", "lost")


def test_a_second_ctrl_c_does_not_leave_an_agent_that_ignores_the_first(kb, tmp_path):
    """An agent that ignores SIGTERM is killed after a grace of a second; a second Ctrl-C
    in that second ended run-job there, with the agent running and its registration,
    by which a later run-job would reap it, already gone."""
    import os

    from .conftest import process_gone
    from .test_queue_integration import await_fifo, make_fifo

    small_kb(kb, notes=1)
    started, termed = make_fifo(tmp_path, "started"), make_fifo(tmp_path, "termed")
    # It says it started, and that the first press's SIGTERM reached it (its grace
    # began), each on a FIFO the test awaits: a second press sent a fixed 0.3 s after the
    # first could come, on a loaded machine, before run-job took the first or after the
    # grace, and the test passed without trying the scenario.
    stubborn = (
        "import os, signal, sys, time; "
        "signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[2], 'w').write('term\\n')); "
        "signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "open(sys.argv[1], 'w').write(str(os.getpid()) + '\\n'); "
        "time.sleep(3600)"
    )
    kb.write(
        "reviewq.toml",
        fake_profile(
            command=json.dumps([sys.executable, "-c", stubborn, str(started), str(termed)])
        ),
    )
    _one_job_for_fake(kb)
    exe = str(Path(sys.executable).parent / "reviewq")
    proc = subprocess.Popen(
        [exe, "--root", str(kb.root), "run-job", "1", "--reviewer", "fake"],
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    agent = None
    try:
        agent = int(await_fifo(started))
        proc.send_signal(signal.SIGINT)
        assert await_fifo(termed) == "term"  # the scenario: within the agent's grace
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert process_gone(agent)


def test_a_run_job_that_fails_says_why_its_attempt_was_lost(kb, monkeypatch):
    """Any error after the attempt opened was recorded as a signal ("run-job was
    stopped"): the real error was not recorded anywhere."""
    from workers import foreground

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile())
    _one_job_for_fake(kb)

    def broken(*args, **kwargs):
        raise RuntimeError("finalize broke")

    monkeypatch.setattr(foreground, "finalize_by_hand", broken)
    ws = Workspace.open(kb.root)
    try:
        with pytest.raises(RuntimeError):
            run_job(ws, 1, "fake")
        row = ws.store.conn.execute("SELECT outcome, reasons FROM attempts WHERE job_id = 1")
        outcome, reasons = row.fetchone()
    finally:
        ws.close()
    assert outcome == "lost"
    assert json.loads(reasons) == [
        "run-job failed (RuntimeError: finalize broke); the job is queued again"
    ]


def test_a_signal_ignored_when_run_job_starts_stays_ignored():
    """nohup and `cmd &` in a script start a process with SIGHUP or SIGINT ignored: taking
    them over made such a run-job (or sweep) stop on a signal it was meant to ignore."""
    from workers.parent import terminate_raises

    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with terminate_raises([], ctrl_c=True):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)


@pytest.mark.parametrize("mode", ["nothing", "bad-fix"])
def test_a_fix_job_that_fails_under_run_job_goes_to_a_person(kb, monkeypatch, run_cli, mode):
    """run-job failed a fix job at once and escalated nothing: its FAILs stayed accepted,
    and no sweep starts a fix for an accepted FAIL, so nothing would fix, escalate or
    review the note again. As after a fix that failed every queued attempt, each FAIL
    now waits for a person, and run-job names the escalations."""
    kb.gate("prose/body-check", ["body"])
    note = kb.note("alpha", body="Alpha body.\n")
    # "nothing": no output file; "bad-fix": a fixed note that is not UTF-8.
    blank = '["sh", "-c", "printf \'\\\\377\' > \\"$REVIEWQ_OUTPUT_PATH\\""]'
    kb.write("reviewq.toml", fake_profile(command=blank if mode == "bad-fix" else None))
    kb.accept("fake", [(note, "prose/body-check")], decision="FAIL")
    ws = Workspace.open(kb.root)
    job_id = queue_fix(ws.kb, ws.store, ws.state_dir, note)
    ws.close()
    monkeypatch.setenv("FAKE_MODE", "nothing")
    res = run_cli("run-job", str(job_id), "--reviewer", "fake")
    assert res.exit_code == 1, res.stdout + res.stderr
    assert f"error: job {job_id} failed" in res.stderr
    with db(kb) as conn:
        escalated = [
            tuple(r) for r in conn.execute("SELECT note_path, gate_id, reason FROM escalations")
        ]
    assert [(n, g) for n, g, _ in escalated] == [(note, "prose/body-check")], escalated
    assert "the fixer failed" in escalated[0][2] and "every attempt" not in escalated[0][2]
    assert "escalation" in res.stdout + res.stderr, res.stdout + res.stderr


def test_run_job_of_a_job_finalized_by_hand_while_it_ran_says_the_job_is_done(
    kb, run_cli, monkeypatch
):
    """A person finalized the job by hand while run-job's agent ran: run-job said its
    attempt was taken back by a control process and the job 'runs on in another
    attempt', while state.db had it completed with the person's decisions."""
    from orchestrator.control.followup import finalize_by_hand
    from orchestrator.review.finalize import Provenance
    from workers import foreground

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile())
    _one_job_for_fake(kb)
    other = Workspace.open(kb.root)  # the person's `reviewq finalize`
    original = foreground.run_attempt

    def finalized_meanwhile(*args, **kwargs):
        outcome = original(*args, **kwargs)
        res, _ = finalize_by_hand(other, 1, outcome.output, Provenance(runner="me"))
        assert res.ok, res.failure_reasons
        return outcome

    monkeypatch.setattr(foreground, "run_attempt", finalized_meanwhile)
    try:
        res = run_cli("run-job", "1", "--reviewer", "fake")
    finally:
        other.close()
    assert res.exit_code == 1
    assert "another attempt" not in res.stderr and "control process" not in res.stderr
    said = [x for x in res.stderr.splitlines() if x.startswith(("reason:", "error:"))]
    assert said == [
        "error: job 1 is completed: it was decided while attempt 1 ran (reviewq job 1 "
        "shows it); this attempt's output was not used"
    ]
    with db(kb) as conn:
        job = conn.execute("SELECT status, runner FROM review_jobs WHERE id = 1").fetchone()
    assert tuple(job) == ("completed", "me")


def test_run_job_whose_attempt_was_taken_and_lost_meanwhile_says_the_job_is_queued(
    kb, run_cli, monkeypatch
):
    """Another run-job took the job while this one's agent ran, and was stopped: the job
    is queued again with nobody running it, and run-job said it 'runs on in another
    attempt'."""
    from orchestrator.control.attempts import lose, open_attempt
    from workers import foreground

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile())
    _one_job_for_fake(kb)
    other = Workspace.open(kb.root)  # the other run-job's connection
    original = foreground.run_attempt

    def taken_and_lost_meanwhile(*args, **kwargs):
        outcome = original(*args, **kwargs)
        opened = open_attempt(other.store, other.state_dir, other.root, 1, "fake", partition="fake")
        with other.store.write():
            lose(other.store, 1, opened.attempt, "run-job was stopped")
        return outcome

    monkeypatch.setattr(foreground, "run_attempt", taken_and_lost_meanwhile)
    try:
        res = run_cli("run-job", "1", "--reviewer", "fake")
    finally:
        other.close()
    assert res.exit_code == 1
    said = [x for x in res.stderr.splitlines() if x.startswith("error:")]
    assert said == [
        "error: job 1 is queued again: attempt 1 was taken back while it ran (reviewq job 1 "
        "shows it); this attempt's output was not used"
    ]
    with db(kb) as conn:
        job = conn.execute("SELECT status FROM review_jobs WHERE id = 1").fetchone()
    assert job[0] == "queued"


def test_run_job_says_the_missing_pairs_once(kb, run_cli):
    """An output with none of the job's pairs printed one "reason: missing pair: …" line
    per pair, where the control (the sweep, `job N`) says them once with the count."""
    small_kb(kb, notes=2)
    prose = '["sh", "-c", "echo \'All fine, I think.\' > \\"$REVIEWQ_OUTPUT_PATH\\""]'
    kb.write("reviewq.toml", fake_profile(command=prose))
    sel = run_cli("select", "--all-gates", "--model", "fake", "--json")
    made = run_cli("create-jobs", "--input", "-", "--grouping", "gate", input=sel.stdout)
    assert made.exit_code == 0, made.stderr
    res = run_cli("run-job", "1", "--reviewer", "fake")
    assert res.exit_code == 1, res.stdout + res.stderr
    reasons = [line for line in res.stderr.splitlines() if line.startswith("reason:")]
    assert len(reasons) == 1 and reasons[0].count("missing") == 1, res.stderr
    assert "reason: 2 pairs missing from the output: kb/notes/n0.md :: " in reasons[0], reasons


@pytest.mark.parametrize("ignored", [signal.SIGINT, signal.SIGHUP])
def test_the_ctrl_c_tests_hold_in_a_suite_started_with_ctrl_c_ignored(tmp_path, ignored):
    """`make test` started in the background of a script (`cmd &`, where a shell without
    job control ignores SIGINT for what it starts) passed that on to every process the
    suite started: a run-job and a sweep ignored the tests' Ctrl-C, and seven Ctrl-C tests
    failed. Ctrl-C is what they test, so the suite takes it back (conftest). The same of
    SIGHUP under `nohup make test`: the closed-terminal test's run-job ran to its timeout."""
    ctrl_c = (
        "tests/test_foreground.py::test_a_stopped_run_job_stops_its_agent_and_queues_the_job_again"
        f"[{int(ignored)}]"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", ctrl_c]
        + ["--basetemp", str(tmp_path / "suite")],
        preexec_fn=lambda: signal.signal(ignored, signal.SIG_IGN),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent.parent,
    )
    assert done.returncode == 0, done.stdout[-3000:]


def test_a_killed_run_job_s_agent_ends_and_its_job_is_queued_again(kb, tmp_path):
    """A run-job SIGKILLed (the OOM killer, `kill -9`) left its agent running, and its
    job and attempt running in state.db: `status` said "running 1", `job 1` "attempt 1:
    running", `doctor` all ok, an `enqueue` skipped its pairs, all for good without a
    control; only the next run-job of that job reaped the agent, and it recorded the
    attempt as superseded, no word of the kill. Its guard now ends the agent and gives
    the attempt up, as a run-job stopped by a signal does itself."""
    import os

    from .test_queue_integration import _await_exit, _await_logged, await_fifo

    proc, pids = _run_job_in_session(kb, tmp_path, "pids", "FAKE_PIDFILE", FAKE_MODE="hang")
    agent: list[int] = []
    try:
        agent = [int(p) for p in await_fifo(pids).split()]
        proc.kill()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        _await_exit(agent, timeout=30)
        # The guard's word is the event: it has given the attempt up when it says so.
        _await_logged(kb, "run_job.died", timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in agent:  # a run before the guard: the agent's group outlived the test
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    (died,) = [x for x in log_lines(kb) if x["event"] == "run_job.died"]
    assert died["attempts"] == [[1, 1]] and died["pid"] == proc.pid
    with db(kb) as conn:
        job = conn.execute("SELECT status FROM review_jobs WHERE id = 1").fetchone()[0]
        attempt = conn.execute("SELECT outcome, reasons FROM attempts WHERE job_id = 1").fetchone()
    assert job == "queued"
    assert attempt["outcome"] == "lost" and "was killed" in attempt["reasons"]
    shown = rq(kb, "job", "1")
    assert "job 1: queued" in shown.stdout and "attempt 1: lost" in shown.stdout, shown.stdout


@pytest.mark.parametrize(
    "moment, status, given_up",
    [("finalize.mid_transaction", "queued", [[1, 1]]), ("run_job.ended", "completed", [])],
    ids=["while-it-finalizes", "after-its-finalize"],
)
def test_a_run_job_killed_as_it_finalizes_or_after_is_said_as_it_was(
    kb, tmp_path, moment, status, given_up
):
    """K96's guard said "ended its agent and queued the job again" of every run-job
    killed, also of one killed after its finalize's commit: `logs` told of a job queued
    again that was completed, and of an agent that had exited (C88). Killed inside the
    finalize's transaction, the attempt is given up; after its commit, nothing is."""

    from .test_queue_integration import _await_logged, await_fifo

    point = "REVIEWQ_FAULT_" + moment.upper().replace(".", "_")
    proc, fault = _run_job_in_session(kb, tmp_path, "fault", point)
    try:
        assert int(await_fifo(fault)) == proc.pid  # held at the moment
        proc.kill()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        _await_logged(kb, "run_job.died", timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (died,) = [x for x in log_lines(kb) if x["event"] == "run_job.died"]
    assert died["attempts"] == given_up and died["process_groups"] == []
    assert "ended its agent" not in died["reason"], died["reason"]
    assert ("queued the job again" in died["reason"]) == bool(given_up), died["reason"]
    with db(kb) as conn:
        assert conn.execute("SELECT status FROM review_jobs").fetchone()[0] == status
