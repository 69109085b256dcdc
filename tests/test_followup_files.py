"""What follows a job, in-process (Control + FollowUp, no queue): the files and the note
a finalize transaction decides are written only after it commits."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import shutil
import sqlite3

import pytest

from orchestrator.control.control import Control
from orchestrator.control.followup import FollowUp
from orchestrator.review.bundle import end_line, start_line
from orchestrator.state.status import SweepJobs, summary
from orchestrator.state.store import utcnow
from orchestrator.state.workspace import Workspace
from orchestrator.sweeps.producer import SweepRequest, enqueue

NOTE = "kb/notes/alpha.md"


def _run(
    control: Control, sent: list[dict], output: bytes, files: dict[str, bytes] | None = None
) -> dict:
    """Dispatch the next queued job and deliver ``output`` (and the agent's ``files``,
    its logs) as its attempt's outcome."""
    control.dispatch()
    msg = sent.pop(0)
    outcome = {
        "job_id": msg["job_id"],
        "attempt": msg["attempt"],
        "classification": "output",
        "output": output,
    }
    control.on_outcome(outcome if files is None else {**outcome, "files": files})
    return msg


def _bundle(ws: Workspace, job_id: int, decision: str) -> bytes:
    blocks = []
    for note, gate in ws.store.conn.execute(
        "SELECT note_path, gate_path FROM review_pairs WHERE job_id = ? ORDER BY id", (job_id,)
    ):
        blocks.append(
            f"{start_line(note, gate)}\n- high: thin.\n## Result: {decision}\n{end_line(note, gate)}\n"
        )
    return "\n".join(blocks).encode()


@pytest.fixture
def cycle(kb):
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha", body="Alpha body.\n")
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    (job,) = enqueue(ws, SweepRequest(name="cli", all_gates=True, fix=True)).jobs
    yield kb, ws, control, sent, job.review_job_id
    ws.store.close()


def test_a_fix_rolled_back_leaves_the_note_and_is_applied_on_the_retry(cycle, monkeypatch):
    kb, ws, control, sent, review = cycle
    _run(control, sent, _bundle(ws, review, "FAIL"))  # a FAIL with fixing on: a fix job
    fixed = kb.read(NOTE).rstrip("\n") + "\nFixed: the body says more now.\n"
    given = kb.read(NOTE)

    def locked(self, *args):  # something later in the same transaction fails
        raise sqlite3.OperationalError("database is locked")

    real = FollowUp._rereview
    monkeypatch.setattr(FollowUp, "_rereview", locked)
    control.dispatch()
    msg = sent.pop(0)
    outcome = {
        "job_id": msg["job_id"],
        "attempt": msg["attempt"],
        "classification": "output",
        "output": fixed.encode(),
    }
    with pytest.raises(sqlite3.OperationalError):
        control.on_outcome(outcome)
    assert kb.read(NOTE) == given  # rolled back: the note is untouched

    monkeypatch.setattr(FollowUp, "_rereview", real)
    control.on_outcome(outcome)  # Huey runs the task again
    assert kb.read(NOTE) == fixed
    result = ws.store.conn.execute(
        "SELECT result FROM review_jobs WHERE id = ?", (msg["job_id"],)
    ).fetchone()[0]
    assert result == "applied"
    # The re-review is queued, for the fixed text.
    (text,) = ws.store.conn.execute(
        "SELECT n.text FROM review_jobs j JOIN review_pairs p ON p.job_id = j.id "
        "JOIN snapshots n ON n.id = p.note_snapshot_id WHERE j.kind = 'review' AND j.status = 'queued'"
    ).fetchone()
    assert text == fixed
    assert ws.store.conn.execute("SELECT count(*) FROM fix_writes_due").fetchone()[0] == 0


def test_a_fix_not_yet_written_is_written_at_the_tick_unless_a_person_edited_the_note(
    cycle, monkeypatch
):
    import orchestrator.cycles.fixes as fixes

    kb, ws, control, sent, review = cycle
    _run(control, sent, _bundle(ws, review, "FAIL"))
    given = kb.read(NOTE)
    fixed = given.rstrip("\n") + "\nFixed.\n"

    def crash(*args):  # the process dies between the commit and the write
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(fixes, "replace_note", crash)
    msg = _run(control, sent, fixed.encode())
    assert kb.read(NOTE) == given
    due = ws.store.conn.execute("SELECT job_id, error FROM fix_writes_due").fetchall()
    assert [(r[0], "Input/output error" in r[1]) for r in due] == [(msg["job_id"], True)]
    monkeypatch.undo()
    assert control.write_due_files() >= 1
    assert kb.read(NOTE) == fixed
    assert ws.store.conn.execute("SELECT count(*) FROM fix_writes_due").fetchone()[0] == 0

    # Written already (the row was left behind): counts as applied, nothing rewritten.
    with ws.store.write():
        ws.store.conn.execute(
            "INSERT INTO fix_writes_due SELECT ?, ?, ?, sha256, 'x', 'x', 0 FROM fix_writes",
            (msg["job_id"], NOTE, "0" * 64),
        )
    assert control.write_due_files() >= 1 and kb.read(NOTE) == fixed
    # A person's edit since the decision is kept.
    with ws.store.write():
        ws.store.conn.execute(
            "INSERT INTO fix_writes_due SELECT ?, ?, sha256, ?, 'x', 'x', 0 FROM fix_writes",
            (msg["job_id"], NOTE, "f" * 64),
        )
    kb.write(NOTE, "A person's own text.\n")
    control.write_due_files()
    assert kb.read(NOTE) == "A person's own text.\n"
    assert ws.store.conn.execute("SELECT count(*) FROM fix_writes_due").fetchone()[0] == 0


def _fix_not_written(cycle, monkeypatch, error: OSError) -> tuple[str, int]:
    """A FAIL, then a fix decided as applied whose note write meets ``error``: the
    fixed text and the fix job's id."""
    import orchestrator.cycles.fixes as fixes

    kb, ws, control, sent, review = cycle
    _run(control, sent, _bundle(ws, review, "FAIL"))
    fixed = kb.read(NOTE).rstrip("\n") + "\nFixed.\n"

    def refused(*args):
        raise error

    monkeypatch.setattr(fixes, "replace_note", refused)
    fix_job = _run(control, sent, fixed.encode())["job_id"]
    monkeypatch.undo()
    return fixed, fix_job


def test_doctor_says_when_a_fixed_note_waits_to_be_written(cycle, monkeypatch, run_cli):
    # An operator asking "is anything stuck?" must hear about a decided fix whose note is
    # not on disk yet, not only about job folders.
    kb, ws, control, sent, review = cycle
    _fix_not_written(cycle, monkeypatch, OSError(errno.EIO, "Input/output error"))
    lines = run_cli("doctor").stdout.splitlines()
    assert any(
        "1 fixed note(s) wait to be written" in line and "Input/output error" in line
        for line in lines
    ), lines
    # Not a full disk: no tick mends it by itself ("writes them at its next tick" said so),
    # and no control process runs here (the test's is in-process, holding no lock).
    (line,) = [x for x in lines if "fixed note(s)" in x]
    assert line.endswith(
        "; mend the cause; no control process runs for this state folder: they wait for one "
        "(reviewq control)"
    ), line
    control.write_due_files()
    lines = run_cli("doctor").stdout.splitlines()
    assert not any("wait to be written" in line for line in lines), lines


def test_a_fix_not_written_to_the_kb_is_in_status_and_the_morning_report(
    cycle, monkeypatch, run_cli, tmp_path
):
    # The report showed the fix's diff as applied while the note kept its old text, and
    # only the log (and doctor) said otherwise.
    kb, ws, control, sent, review = cycle
    fixed, fix_job = _fix_not_written(
        cycle, monkeypatch, PermissionError(errno.EPERM, "Operation not permitted")
    )
    status = run_cli("status").stdout
    assert (
        f"fix not written to the KB: {NOTE} (fix job {fix_job}, since " in status
        and "Operation not permitted; the control process tries again at each tick" in status
    ), status
    (row,) = run_cli("status", "--json").json()["fixes_unwritten"]
    assert row["job_id"] == fix_job and "Operation not permitted" in row["error"]
    page = tmp_path / "night.html"
    text = run_cli("report", "--html", str(page)).stdout
    assert "needs you: 1 fixed note(s) not written to the KB" in text, text
    assert f"  fix job {fix_job} not written to {NOTE}: [Errno 1] Operation not permitted" in text
    html = page.read_text()
    assert "Fixes not written to the KB" in html and "Not in the KB yet" in html
    assert "<b>1</b> need you" in html

    control.write_due_files()  # the tick after the folder is writable again
    assert kb.read(NOTE) == fixed
    assert "not written" not in run_cli("status").stdout
    assert "needs you: nothing" in run_cli("report", "--since", "1d").stdout


def test_a_writer_that_read_an_older_row_keeps_a_row_marked_since_it_was_cleared(
    cycle, monkeypatch
):
    """Generations counted from 0 again once a row was cleared, so a writer holding an
    old generation 0 cleared a newer row too, and the folder kept the older render."""
    import json

    from orchestrator.state import files

    kb, ws, control, sent, job_id = cycle
    by_hand = Workspace.open(kb.root)  # a command run by hand, beside the control
    real_settle = files.settle_due
    once = []

    def settle(store, *args, **kwargs):
        if store is by_hand.store and not once:
            once.append(True)
            # The command has rendered "A". Meanwhile the control writes the job (the
            # row goes), decides "B" (a new row) and dies before writing its files.
            assert files.write_due_job_files(ws.store, ws.state_dir) == 1
            monkeypatch.setattr(ws.store, "after_commit", lambda fn: None)
            with ws.store.write():
                ws.store.conn.execute(
                    "UPDATE review_jobs SET failure_reasons = ? WHERE id = ?",
                    (json.dumps(["B decided"]), job_id),
                )
                files.write_job_files_after_commit(ws.store, ws.state_dir, job_id)
        return real_settle(store, *args, **kwargs)

    monkeypatch.setattr(files, "settle_due", settle)
    with by_hand.store.write():
        by_hand.store.conn.execute(
            "UPDATE review_jobs SET failure_reasons = ? WHERE id = ?",
            (json.dumps(["A decided"]), job_id),
        )
        files.write_job_files_after_commit(by_hand.store, by_hand.state_dir, job_id)
    assert once
    # B's row is still due, so the next tick shows B.
    assert ws.store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 1
    monkeypatch.undo()
    control.write_due_files()
    manifest = json.loads(
        (ws.state_dir / "jobs" / f"review-job-{job_id}" / "MANIFEST.json").read_text()
    )
    assert manifest["failure_reasons"] == ["B decided"]
    by_hand.store.close()


def test_the_control_does_not_wait_on_a_folder_a_suspended_command_holds(cycle):
    """A command run by hand holds a job folder's lock while it renders it; suspended
    there (Ctrl-Z), it stopped the control process, and every outcome behind it."""
    import fcntl
    import os
    import threading

    kb, ws, control, sent, job_id = cycle
    control.dispatch()
    msg = sent.pop(0)
    folder = ws.state_dir / "jobs" / f"review-job-{job_id}"
    held = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)  # the suspended command
    try:
        outcome = {
            "job_id": msg["job_id"],
            "attempt": msg["attempt"],
            "classification": "output",
            "output": _bundle(ws, job_id, "PASS"),
        }
        done = threading.Thread(target=control.on_outcome, args=(outcome,), daemon=True)
        done.start()
        done.join(timeout=60)
        assert not done.is_alive(), "the control waited on the folder"
        (error,) = ws.store.conn.execute(
            "SELECT error FROM job_files_due WHERE job_id = ?", (job_id,)
        ).fetchone()
        assert "another reviewq process is writing this folder" in error
    finally:
        os.close(held)
    control.write_due_files()  # its next tick
    assert ws.store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 0
    assert (folder / "results").is_dir()


def test_a_follow_up_made_by_an_outcome_batch_has_its_files_written_after_it_commits(
    cycle, monkeypatch
):
    """Stop 31 ran the control task's dispatch pass inside the outcome batch's transaction:
    it met the fix job that batch had just made, with no MANIFEST.json yet, and rendered
    its folder there, before the commit: a batch rolled back (a kill before its COMMIT)
    left the folder of a job state.db never had. The job waits for the pass after it."""
    from orchestrator.state import files

    kb, ws, control, sent, review = cycle
    control.dispatch()
    msg = sent.pop(0)
    other = sqlite3.connect(ws.store.path)  # what a reader sees: committed rows only
    rendered: list[tuple[int, int]] = []
    real = files.write_job_files

    def spy(store, job_dir, job_id, prompt=None):  # noqa: ANN001, ANN202
        (kept,) = other.execute(
            "SELECT count(*) FROM review_jobs WHERE id = ?", (job_id,)
        ).fetchone()
        rendered.append((job_id, kept))
        return real(store, job_dir, job_id, prompt)

    monkeypatch.setattr(files, "write_job_files", spy)
    outcome = {
        "job_id": msg["job_id"],
        "attempt": msg["attempt"],
        "classification": "output",
        "output": _bundle(ws, review, "FAIL"),  # fixing on: a fix job
    }
    if not control.on_messages([], [outcome], dispatch=True):
        control.dispatch()  # what the control task does then
    other.close()
    (fix,) = ws.store.conn.execute("SELECT id FROM review_jobs WHERE kind = 'fix'").fetchone()
    assert (fix, 0) not in rendered and (fix, 1) in rendered
    assert [(m["job_id"], m["task"]) for m in sent] == [(fix, "fix")]  # dispatched all the same


def test_a_folder_locks_timeout_bounds_the_wait_with_no_one_told_of_it(tmp_path):
    """Without an ``on_wait`` to call, the lock was asked for blocking at once and the
    ``timeout`` never came into it: a caller with no terminal (export called as a
    library) waited for a stuck holder for good."""
    import fcntl
    import os
    import threading

    from orchestrator.state.files import LockHeld, folder_lock

    held = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)  # a stuck holder
    got: list[object] = []

    def take() -> None:
        try:
            with folder_lock(tmp_path, timeout=0.2):
                got.append("taken")
        except LockHeld as exc:
            got.append(exc)

    waiter = threading.Thread(target=take, daemon=True)
    try:
        waiter.start()
        waiter.join(timeout=20)
    finally:
        os.close(held)  # lets a waiter with no end go, so that it ends with the test
        waiter.join(timeout=20)
    (result,) = got
    assert isinstance(result, LockHeld), result
    assert result.holder == os.getpid()


def test_a_full_disk_for_follow_up_folders_and_reports_keeps_the_review(cycle, monkeypatch):
    """FAIL three times: every follow-up (fix folders, re-review folders, the escalation
    report) meets a full disk, and none of it undoes the review that decided it."""
    import orchestrator.state.files as files

    kb, ws, control, sent, review = cycle
    full = [True]
    real_mkdir, real_atomic = pathlib.Path.mkdir, files.atomic_write

    def mkdir(self, *args, **kwargs):
        if full[0] and self.name.startswith("review-job-"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_mkdir(self, *args, **kwargs)

    def atomic_write(path, *args, **kwargs):
        if full[0] and path.parent.name == "escalations":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_atomic(path, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    monkeypatch.setattr(files, "atomic_write", atomic_write)
    import orchestrator.cycles.escalations as escalations

    monkeypatch.setattr(escalations, "atomic_write", atomic_write)
    job = review
    for _ in range(3):
        # Room for the attempt folder only long enough to open the attempt.
        full[0] = False
        control.dispatch()
        full[0] = True
        msg = sent.pop(0)
        assert msg["job_id"] == job
        control.on_outcome(
            {
                "job_id": job,
                "attempt": msg["attempt"],
                "classification": "output",
                "output": _bundle(ws, job, "FAIL"),
            }
        )
        fix = ws.store.conn.execute(
            "SELECT id FROM review_jobs WHERE kind = 'fix' AND status = 'queued'"
        ).fetchone()
        if fix is None:
            break
        full[0] = False
        control.dispatch()
        full[0] = True
        msg = sent.pop(0)
        text = kb.read(NOTE).rstrip("\n") + "\nAnother try.\n"
        control.on_outcome(
            {
                "job_id": fix[0],
                "attempt": msg["attempt"],
                "classification": "output",
                "output": text.encode(),
            }
        )
        job = ws.store.conn.execute(
            "SELECT id FROM review_jobs WHERE kind = 'review' AND status = 'queued'"
        ).fetchone()[0]

    conn = ws.store.conn
    statuses = [tuple(r) for r in conn.execute("SELECT kind, status FROM review_jobs ORDER BY id")]
    assert statuses == [("review", "completed"), ("fix", "completed")] * 2 + [
        ("review", "completed")
    ]
    (esc_id, report_path) = conn.execute("SELECT id, report_path FROM escalations").fetchone()
    assert not (ws.state_dir / report_path).exists()
    assert conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 5
    assert conn.execute("SELECT count(*) FROM escalation_reports_due").fetchone()[0] == 1

    full[0] = False  # space returns: the tick writes everything
    control.write_due_files()
    assert conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM escalation_reports_due").fetchone()[0] == 0
    report = (ws.state_dir / report_path).read_text().splitlines()
    assert report[0] == f"Gate review: {NOTE} — prose/clarity"
    assert sum(line.startswith("- Cycle ") for line in report) == 3
    assert any(line.startswith("- high: thin.") or "thin" in line for line in report)
    for (folder,) in conn.execute("SELECT job_dir FROM review_jobs"):
        assert (ws.state_dir / folder / "MANIFEST.json").is_file()


def test_due_rows_that_cannot_be_cleared_stay_and_say_why(kb, tmp_path):
    """The files are written but state.db is locked past the busy timeout when their due
    rows would be cleared: the rows stay (the next tick writes the files again) and the log
    says the database was locked, where the error used to be swallowed without a word."""
    import json

    from orchestrator import logs
    from orchestrator.state.files import write_due_job_files

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    store = ws.store
    ids = [r[0] for r in store.conn.execute("SELECT id FROM review_jobs")]
    store.conn.executemany(
        "INSERT INTO job_files_due (job_id, since, error) "
        "VALUES (?, '2030-01-01T00:00:00Z', 'not written yet')",
        [(i,) for i in ids],
    )
    store.conn.commit()
    holder = sqlite3.connect(ws.state_dir / "state.db", isolation_level=None)
    store.conn.execute("PRAGMA busy_timeout = 50")
    try:
        holder.execute("BEGIN EXCLUSIVE")
        assert store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == len(ids)
        assert write_due_job_files(store, ws.state_dir, ids) == len(ids)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    due = store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0]
    assert due == len(ids)  # kept: written again at the next tick
    lines = [json.loads(x) for x in logs.log_path(ws.state_dir).read_text().splitlines()]
    said = [e for e in lines if e["event"] == "files_due.not_cleared"]
    assert said and "database is locked" in said[0]["error"], lines[-3:]
    assert said[0]["table"] == "job_files_due"
    ws.close()


def test_an_enqueue_settles_the_folders_it_has_written_as_it_goes(kb, monkeypatch):
    """A sweep's control starts at its commit and writes again the folder of each job it
    dispatches whose due row is still there: the sweep settled its rows once, at the end
    of its pass over the folders, and the control rewrote every folder it reached before
    then (~7 % of a 1,000-job sweep under load, ~0.2 ms each)."""
    from orchestrator.state import files

    kb.gate("prose/clarity", ["body"])
    for i in range(70):
        kb.note(f"n{i:02d}")
    ws = Workspace.open(kb.root)
    real = files.write_job_files
    due_before: list[int] = []

    def write_job_files(store, *args, **kwargs):  # noqa: ANN001, ANN202
        due_before.append(store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0])
        return real(store, *args, **kwargs)

    monkeypatch.setattr(files, "write_job_files", write_job_files)
    jobs = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
    assert len(jobs) == len(due_before) == 70
    # The last folders were written with the first ones settled already.
    assert due_before[0] == 70 and due_before[-1] <= 70 - 64
    assert ws.store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 0
    ws.close()


def test_a_fix_written_then_reverted_before_its_row_went_is_not_written_again(cycle, monkeypatch):
    """The row of a written fix could outlive it (state.db locked when it was to be
    cleared, or a crash): the next tick took a person's revert to the old text for a
    write still to do, and wrote the fix over it."""
    import orchestrator.cycles.fixes as fixes

    kb, ws, control, sent, job_id = cycle
    note = "kb/notes/alpha.md"
    _run(control, sent, _bundle(ws, job_id, "FAIL"))  # the fix job is queued
    given = ws.root.joinpath(note).read_text()
    fixed = given.rstrip("\n") + "\nFixed.\n"
    monkeypatch.setattr(fixes, "settle_due", lambda *args, **kwargs: None)  # row stays
    _run(control, sent, fixed.encode())
    monkeypatch.undo()
    assert ws.root.joinpath(note).read_text() == fixed
    ws.root.joinpath(note).write_text(given)  # the person undoes it before the next tick
    control.write_due_files()
    assert ws.root.joinpath(note).read_text() == given
    assert ws.store.conn.execute("SELECT count(*) FROM fix_writes_due").fetchone()[0] == 0


def _fix_committed_by_a_run_that_died(kb, monkeypatch):
    """A fix of kb/notes/alpha.md in a real repository, committed by a run killed right
    after `git commit`, before its record: the open workspace and a git runner."""
    import subprocess

    import orchestrator.cycles.fixes as fixes

    class Killed(BaseException):
        pass

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha", body="Alpha body.\n")
    kb.write(".gitignore", ".reviewq/\n")
    kb.write("reviewq.toml", "[fix]\ngit_commit = true\n")

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=kb.root, capture_output=True, text=True, check=True
        ).stdout

    git("init", "-q", "-b", "main")
    git("config", "user.name", "P")
    git("config", "user.email", "p@example.org")
    git("add", "-A")
    git("commit", "-qm", "kb")
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    (job,) = enqueue(ws, SweepRequest(name="cli", all_gates=True, fix=True)).jobs
    _run(control, sent, _bundle(ws, job.review_job_id, "FAIL"))
    fixed = kb.read("kb/notes/alpha.md").rstrip("\n") + "\nFixed.\n"

    def killed(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(fixes, "_record_commit", killed)  # dies right after `git commit`
    with pytest.raises(Killed):
        _run(control, sent, fixed.encode())
    monkeypatch.undo()
    return ws, git


def _next_tick_records(kb) -> tuple:
    """The fix job's (fix_commit, fix_no_commit) once the next control's tick ran."""
    again = Workspace.open(kb.root)
    try:
        Control(again, send_review=lambda m: None, hooks=FollowUp(again)).write_due_files()
        return tuple(
            again.store.conn.execute(
                "SELECT fix_commit, fix_no_commit FROM review_jobs WHERE kind = 'fix'"
            ).fetchone()
        )
    finally:
        again.close()


def test_a_fix_committed_by_a_run_that_died_before_recording_it_keeps_its_commit(kb, monkeypatch):
    """The commit was decided from state.db only: after a crash between `git commit`
    and its record, HEAD held the fixed text, and the job was recorded as "the note had
    uncommitted edits" with no commit."""
    ws, git = _fix_committed_by_a_run_that_died(kb, monkeypatch)
    assert _next_tick_records(kb) == (git("rev-parse", "HEAD").strip(), None)
    assert git("log", "--format=%s").count("reviewq fix:") == 1
    ws.close()


def test_a_fix_committed_before_a_crash_and_edited_since_keeps_its_commit(kb, monkeypatch):
    """A person's edit of the note after the commit a killed run had made, before the next
    tick: the job was recorded as "the note was changed after the fix was written, before
    its commit" with no commit, while `git log` held reviewq's commit of it (the one a
    `git revert` undoes, which the report and `reviewq job` no longer named)."""
    ws, git = _fix_committed_by_a_run_that_died(kb, monkeypatch)
    sha = git("rev-parse", "HEAD").strip()
    kb.write("kb/notes/alpha.md", kb.read("kb/notes/alpha.md") + "A person's line.\n")
    assert _next_tick_records(kb) == (sha, None)
    assert "A person's line." in kb.read("kb/notes/alpha.md")  # theirs, uncommitted
    ws.close()


def _symlinked_note_failed(kb):
    """kb/notes/link.md, a link to shared/real.md (inside the root, outside the note
    roots), reviewed FAIL in a run with --fix: its fix job is the next message sent."""
    kb.gate("prose/clarity", ["body"])
    real = kb.root / "shared" / "real.md"
    real.parent.mkdir()
    real.write_text("---\ntitle: Real\ndescription: About real.\n---\nReal body.\n")
    link = kb.root / "kb" / "notes" / "link.md"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to("../../shared/real.md")
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    (job,) = enqueue(ws, SweepRequest(name="cli", all_gates=True, fix=True)).jobs
    _run(control, sent, _bundle(ws, job.review_job_id, "FAIL"))
    return real, link, ws, control, sent


def test_a_fix_of_a_symlinked_note_is_written_to_the_file_it_names(kb):
    """The link was replaced by a regular file holding the fix, and the file it named
    (the note people edit) kept the old text."""
    real, link, ws, control, sent = _symlinked_note_failed(kb)
    fixed = link.read_text().rstrip("\n") + "\nFixed.\n"
    _run(control, sent, fixed.encode())
    assert link.is_symlink()
    assert real.read_text() == fixed
    ws.close()


@pytest.mark.parametrize("relinked", ["outside", "loop"])
def test_a_symlinked_note_relinked_before_its_fix_is_written_keeps_the_persons_link(
    kb, tmp_path, monkeypatch, relinked
):
    """Between the fix's decision and its write (a full disk held it) a person pointed the
    link outside the KB, or into a loop: the write fell back to the link's own path and
    replaced the person's link with a file holding the fix (outside), or failed at every
    tick (a loop), where their change is to be kept and the fix not applied."""
    import orchestrator.cycles.fixes as fixes

    real, link, ws, control, sent = _symlinked_note_failed(kb)

    def refused(*args):
        raise OSError(errno.ENOSPC, "No space left")

    monkeypatch.setattr(fixes, "replace_note", refused)
    fix_job = _run(control, sent, (real.read_text() + "Fixed.\n").encode())["job_id"]
    monkeypatch.undo()
    link.unlink()
    if relinked == "outside":
        outside = tmp_path / "outside.md"  # the same text, kept out of the KB now
        real.rename(outside)
        link.symlink_to(outside)
    else:
        link.symlink_to("link.md")
    control.write_due_files()
    assert link.is_symlink()
    if relinked == "outside":
        assert "Fixed." not in outside.read_text()
    row = ws.store.conn.execute(
        "SELECT result FROM review_jobs WHERE id = ?", (fix_job,)
    ).fetchone()
    assert row[0] == "not-applied"
    assert ws.store.conn.execute("SELECT count(*) FROM fix_writes_due").fetchone()[0] == 0
    ws.close()


def test_a_fix_of_a_symlinked_note_does_not_blame_an_attempt_running_meanwhile(kb):
    """The fix was recorded as written at the link's path, but a worker's KB watch sees
    the change in the file the link names: every attempt running as it was written ended
    reviewer-touched-kb, a failed attempt counted against its job (a real-KB night: two
    of them, each naming the linked note's file)."""
    import hashlib

    kb.gate("prose/clarity", ["body"])
    real = kb.root / "shared" / "real.md"  # inside the root, outside the note roots
    real.parent.mkdir()
    real.write_text("---\ntitle: Real\ndescription: About real.\n---\nReal body.\n")
    kb.note("alpha", body="Alpha body.\n")
    link = kb.root / "kb" / "notes" / "link.md"
    link.symlink_to("../../shared/real.md")
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    enqueue(ws, SweepRequest(name="cli", all_gates=True, fix=True))
    control.dispatch()
    msgs = {m["job_id"]: m for m in sent}
    sent.clear()
    (link_job,) = [
        j
        for (j,) in ws.store.conn.execute(
            "SELECT job_id FROM review_pairs WHERE note_path = 'kb/notes/link.md'"
        )
    ]
    (other,) = [m for j, m in msgs.items() if j != link_job]
    control.on_outcome(
        {
            "job_id": link_job,
            "attempt": msgs[link_job]["attempt"],
            "classification": "output",
            "output": _bundle(ws, link_job, "FAIL"),
        }
    )
    fixed = link.read_text().rstrip("\n") + "\nFixed.\n"
    _run(control, sent, fixed.encode())  # the fix, applied while `other` runs
    assert real.read_text() == fixed
    touched = "shared/real.md"
    control.on_outcome(
        {
            "job_id": other["job_id"],
            "attempt": other["attempt"],
            "classification": "reviewer-touched-kb",
            "output": _bundle(ws, other["job_id"], "PASS"),
            "exit_code": 0,
            "touched": [touched],
            "touched_hashes": {touched: hashlib.sha256(fixed.encode()).hexdigest()},
            "reasons": [f"the reviewer changed {touched}"],
            "untouched": ["output", []],
        }
    )
    outcome = ws.store.conn.execute(
        "SELECT outcome FROM attempts WHERE job_id = ? AND attempt = ?",
        (other["job_id"], other["attempt"]),
    ).fetchone()[0]
    assert outcome == "finalized"
    ws.close()


def test_a_written_fix_survives_a_power_cut_its_folder_is_synced(tmp_path, monkeypatch):
    import os
    import stat

    from orchestrator.cycles.fixes import replace_note

    note = tmp_path / "note.md"
    note.write_text("old\n")
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    replace_note(note, b"new\n")
    assert synced == ["file", "folder"] and note.read_text() == "new\n"


def test_a_results_folder_left_by_a_killed_rewrite_does_not_block_the_next(cycle):
    """The old results/ was renamed to a name made of the pid alone: a leftover of that
    name (a process killed in the rmtree; pids repeat in containers) made every later
    rewrite of the job's files fail with ENOTEMPTY."""
    import os

    from orchestrator.state.files import write_job_files

    kb, ws, control, sent, job_id = cycle
    _run(control, sent, _bundle(ws, job_id, "PASS"))  # it has results now
    job_dir = ws.state_dir / "jobs" / f"review-job-{job_id}"
    assert (job_dir / "results").is_dir()
    for name in (f".results.old.{os.getpid()}", f".results.old.{os.getpid()}-1"):
        (job_dir / name / "stale").mkdir(parents=True)
    write_job_files(ws.store, job_dir, job_id)
    write_job_files(ws.store, job_dir, job_id)
    assert (job_dir / "results").is_dir()


@pytest.mark.timeout(60)  # a FIFO held the rewrite for good: failed here, not hung
@pytest.mark.parametrize("hand", ["a file", "a link to a folder", "a dangling link", "a fifo"])
def test_a_results_folder_replaced_by_hand_is_rendered_again_and_nothing_is_left(
    cycle, tmp_path, hand
):
    """results/ made a file or a link by a person: the rewrite left the thing it moved
    aside in the job folder as `.results.old.PID-N` (rmtree of a file or a link fails, and
    its error was ignored), and a link to nothing made every rewrite fail ("Not a
    directory"), the job's files stale for good. The folder a link named is the
    person's, and is left as it was. A FIFO there, given to rmtree, held the rewrite
    until a writer came."""
    from orchestrator.state.files import write_job_files

    kb, ws, control, sent, job_id = cycle
    _run(control, sent, _bundle(ws, job_id, "PASS"))
    job_dir = ws.state_dir / "jobs" / f"review-job-{job_id}"
    rendered = {p.name: p.read_bytes() for p in (job_dir / "results").iterdir()}
    shutil.rmtree(job_dir / "results")
    elsewhere = tmp_path / "mine"
    (elsewhere / "keep").mkdir(parents=True)
    if hand == "a file":
        (job_dir / "results").write_text("my notes\n")
    elif hand == "a fifo":  # neither a file nor a folder: rmtree fails on it too
        os.mkfifo(job_dir / "results")
    else:
        (job_dir / "results").symlink_to(
            elsewhere if hand == "a link to a folder" else tmp_path / "gone"
        )
    write_job_files(ws.store, job_dir, job_id)
    results = job_dir / "results"
    assert results.is_dir() and not results.is_symlink()
    assert {p.name: p.read_bytes() for p in results.iterdir()} == rendered
    assert sorted(p.name for p in job_dir.iterdir() if p.name.startswith(".results")) == []
    assert [p.name for p in elsewhere.iterdir()] == ["keep"]


def _two_writers(kb, job_id, a_between, b_write=None):
    """Writer A (one process's store) marks the job due and renders it, and stops at
    ``a_between`` (``"render"``: after it read state.db, ``"settle"``: after it wrote the
    files); meanwhile writer B (another store) decides again and writes, with ``b_write``
    in place of the real writing if given. Each writer in a thread with its own store, as
    two processes would be."""
    import json
    import threading

    from orchestrator.state import files

    a_read, b_waits, go = threading.Event(), threading.Event(), threading.Event()
    real_manifest, real_settle, real_write = (
        files._manifest,
        files.settle_due,
        files.write_job_files,
    )
    real_fcntl = getattr(files, "fcntl", None)
    names = {}

    def me() -> str:
        return names.get(threading.get_ident(), "")

    def manifest(*args):
        out = real_manifest(*args)
        if me() == "A" and a_between == "render":
            a_read.set()
            assert go.wait(10)
        return out

    def settle(*args):
        if me() == "A" and a_between == "settle":
            a_read.set()
            assert go.wait(10)
        return real_settle(*args)

    def write(*args, **kwargs):
        if me() == "B" and b_write is not None:
            return b_write(*args, **kwargs)
        return real_write(*args, **kwargs)

    class Flock:  # says when B is about to wait for A's lock
        LOCK_EX = getattr(real_fcntl, "LOCK_EX", 2)

        @staticmethod
        def flock(fd, op):
            if me() == "B":
                b_waits.set()
            return real_fcntl.flock(fd, op)

    errors = []

    def writer(name: str, reason: str) -> None:
        names[threading.get_ident()] = name
        ws = Workspace.open(kb.root)
        try:
            with ws.store.write():
                ws.store.conn.execute(
                    "UPDATE review_jobs SET failure_reasons = ? WHERE id = ?",
                    (json.dumps([reason]), job_id),
                )
                files.write_job_files_after_commit(ws.store, ws.state_dir, job_id)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            if name == "B":
                b_waits.set()
            ws.close()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(files, "_manifest", manifest)
        mp.setattr(files, "settle_due", settle)
        mp.setattr(files, "write_job_files", write)
        mp.setattr(files, "fcntl", Flock, raising=False)
        a = threading.Thread(target=writer, args=("A", "A decided"))
        a.start()
        assert a_read.wait(10)
        b = threading.Thread(target=writer, args=("B", "B decided"))
        b.start()
        assert b_waits.wait(10)  # B wrote its files, or waits for A's lock
        go.set()
        a.join(10)
        b.join(10)
    assert not errors, errors
    return files


def test_a_writer_that_read_an_older_decision_does_not_write_over_a_newer_one(cycle):
    """Two processes write one job's files (the control process, a command run by hand).
    A read the job, B decided again and wrote the job's files, then A wrote what it had
    read: the folder showed the older decision for good, and no due row was left to
    mend it."""
    import json

    kb, ws, control, sent, job_id = cycle
    _two_writers(kb, job_id, "render")
    job_dir = ws.state_dir / "jobs" / f"review-job-{job_id}"
    manifest = json.loads((job_dir / "MANIFEST.json").read_text())
    assert manifest["failure_reasons"] == ["B decided"]
    assert ws.store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 0


def test_a_decision_made_while_another_writer_wrote_keeps_its_due_row(cycle):
    """A wrote the job's files; before A cleared the due row, B decided again and could
    not write (a full disk). A's clearing took B's row too: the files showed A's decision
    and nothing would ever write B's."""
    import errno
    import json

    kb, ws, control, sent, job_id = cycle

    def full(*args, **kwargs):
        raise OSError(errno.EIO, "I/O error")

    files = _two_writers(kb, job_id, "settle", b_write=full)
    assert ws.store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 1
    assert files.write_due_job_files(ws.store, ws.state_dir) == 1  # the control's tick
    job_dir = ws.state_dir / "jobs" / f"review-job-{job_id}"
    manifest = json.loads((job_dir / "MANIFEST.json").read_text())
    assert manifest["failure_reasons"] == ["B decided"]
    assert ws.store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 0


def test_a_fix_a_person_overtook_says_so_in_its_manifest(cycle, monkeypatch):
    """A due fix not written because a person changed the note meanwhile recorded the
    reason in state.db, but its MANIFEST.json kept saying there was none."""
    kb, ws, control, sent, review = cycle
    _, fix_job = _fix_not_written(cycle, monkeypatch, OSError(errno.EIO, "Input/output error"))
    kb.write(NOTE, "A person's own text.\n")
    control.write_due_files()
    assert kb.read(NOTE) == "A person's own text.\n"
    job_dir = ws.store.conn.execute(
        "SELECT job_dir FROM review_jobs WHERE id = ?", (fix_job,)
    ).fetchone()[0]
    manifest = json.loads((ws.state_dir / job_dir / "MANIFEST.json").read_text())
    assert manifest["failure_reasons"] == [
        "the note was changed or removed by someone since the fix was decided; their text "
        "is kept and the fix is not applied"
    ]


def _rereview_of_a_fix_not_written(cycle, monkeypatch, *, dispatched: bool) -> tuple[int, dict]:
    """A fix decided as applied whose write waits (a full disk), a person's edit, then the
    tick that finds the note changed: the re-review job queued with the fix, and its
    attempt's message if ``dispatched`` before that tick."""
    kb, ws, control, sent, review = cycle
    _, fix_job = _fix_not_written(cycle, monkeypatch, OSError(errno.ENOSPC, "No space left"))
    (rereview,) = ws.store.conn.execute(
        "SELECT id FROM review_jobs WHERE source_job_id = ? AND kind = 'review'", (fix_job,)
    ).fetchone()
    msg = {}
    if dispatched:
        control.dispatch()
        msg = sent.pop(0)
        assert msg["job_id"] == rereview
    kb.write(NOTE, "A person's own text.\n")
    from structlog.testing import capture_logs

    with capture_logs() as logged:
        control.write_due_files()  # fix.not_written
    assert kb.read(NOTE) == "A person's own text.\n"
    said = [e["event"] for e in logged if e.get("job_id") == fix_job]
    # Not also "fix.note_written" (late=True), which said the note was written at last.
    assert "fix.not_written" in said and "fix.note_written" not in said, said
    return rereview, msg


def _rejections(ws: Workspace) -> int:
    return ws.store.conn.execute("SELECT COALESCE(SUM(rejections), 0) FROM cycles").fetchone()[0]


def test_the_rereview_of_a_fix_not_written_does_not_run(cycle, monkeypatch, run_cli):
    """Queued with the fix, it reviewed the fixer's text, which never reached the KB: it
    spent a run, and its FAIL counted a rejection (toward the third's escalation) of a
    text the note never had. The person's text is reviewed at the next sweep."""
    kb, ws, control, sent, review = cycle
    rereview, _ = _rereview_of_a_fix_not_written(cycle, monkeypatch, dispatched=False)
    before = _rejections(ws)
    control.dispatch()
    assert sent == []  # nothing runs
    status, reasons = ws.store.conn.execute(
        "SELECT status, failure_reasons FROM review_jobs WHERE id = ?", (rereview,)
    ).fetchone()
    assert status == "failed" and "was not written" in reasons, (status, reasons)
    assert _rejections(ws) == before
    job_dir = ws.state_dir / "jobs" / f"review-job-{rereview}"
    assert json.loads((job_dir / "MANIFEST.json").read_text())["status"] == "failed"
    # No person is asked about it, nor does its sweep fail for it: the next sweep
    # reviews the person's text.
    assert "failed job" not in run_cli("report", "--since", "1d").stdout
    assert summary(ws.store, SweepJobs(first_id=1, run_id=1))["failed"] == []
    (job,) = enqueue(ws, SweepRequest(name="cli", all_gates=True)).jobs
    (text,) = ws.store.conn.execute(
        "SELECT n.text FROM review_pairs p JOIN snapshots n ON n.id = p.note_snapshot_id "
        "WHERE p.job_id = ?",
        (job.review_job_id,),
    ).fetchone()
    assert text == "A person's own text.\n"


def test_a_running_rereview_of_a_fix_not_written_counts_nothing(cycle, monkeypatch):
    """Its agent ran while the fix waited to be written: its FAIL of the fixer's text
    counted a rejection once the person's edit had kept the fix out of the KB."""
    kb, ws, control, sent, review = cycle
    rereview, msg = _rereview_of_a_fix_not_written(cycle, monkeypatch, dispatched=True)
    before = _rejections(ws)
    control.on_outcome(
        {
            "job_id": msg["job_id"],
            "attempt": msg["attempt"],
            "classification": "output",
            "output": _bundle(ws, rereview, "FAIL"),
        }
    )
    assert _rejections(ws) == before
    outcome = ws.store.conn.execute(
        "SELECT outcome FROM attempts WHERE job_id = ? AND attempt = ?",
        (rereview, msg["attempt"]),
    ).fetchone()[0]
    assert outcome == "superseded"
    assert (
        ws.store.conn.execute(
            "SELECT count(*) FROM review_pairs WHERE job_id = ? AND decision IS NOT NULL",
            (rereview,),
        ).fetchone()[0]
        == 0
    )


def test_a_fix_that_changed_nothing_rejects_no_pair_a_review_passed_meanwhile(cycle):
    """A review of the person's text PASSed while the fix ran (a redo and a sweep at
    once): the fix's 'changed nothing' still counted a rejection, right after the PASS."""
    kb, ws, control, sent, job = cycle
    _run(control, sent, _bundle(ws, job, "FAIL"))  # the fix job is queued
    kb.accept("offline", [("kb/notes/alpha.md", "prose/clarity")])  # a PASS comes in
    _run(control, sent, kb.read("kb/notes/alpha.md").encode())  # the fixer changed nothing
    kinds = [r[0] for r in ws.store.conn.execute("SELECT kind FROM cycle_events ORDER BY id")]
    assert "fix-unchanged" not in kinds
    assert (
        ws.store.conn.execute("SELECT result FROM review_jobs WHERE kind = 'fix'").fetchone()[0]
        == "unchanged"
    )


def test_renderings_deleted_by_hand_are_written_again_from_the_database(kb, run_cli):
    """Job folders and escalation reports render state.db, and nothing wrote them again
    once deleted: doctor said 'job files written', `escalations` pointed at a missing
    report. An ended job's folder may be deleted to free a disk (OPERATIONS 6.4): doctor
    names only what an agent or a person still reads."""
    import shutil

    from .conftest import reviewq_process

    shutil.copytree(pathlib.Path(__file__).parent.parent / "kb", kb.root / "kb", dirs_exist_ok=True)
    sweep = reviewq_process("--root", str(kb.root), "sweep", "--reviewer", "offline", "--fix")
    assert sweep.returncode in (0, 1), sweep.stderr
    note = kb.root / "kb/notes/brood.md"
    note.write_text(note.read_text() + "\nOne more line.\n")
    assert run_cli("enqueue", "--all-gates", "--note", str(note)).exit_code == 0
    jobs = sorted((kb.state / "jobs").iterdir())
    reports = sorted((kb.state / "escalations").glob("escalation-*.md"))
    assert jobs and reports
    ended = next(j for j in jobs if (j / "results").is_dir())
    (first, *_) = run_cli("jobs", "--state", "queued", "--json").json()["jobs"]
    queued = kb.state / "jobs" / f"review-job-{first['id']}"
    before = {
        p: p.read_bytes() for p in [*ended.rglob("*"), *queued.rglob("*"), *reports] if p.is_file()
    }
    shutil.rmtree(ended / "results")
    (ended / "MANIFEST.json").unlink()
    (queued / "MANIFEST.json").unlink()
    reports[0].unlink()
    res = run_cli("doctor")
    assert res.exit_code == 1
    assert (
        "problem: 1 queued or running job folder(s) and 1 open escalation report(s) are missing"
        in res.stdout
    ), res.stdout
    res = run_cli("rewrite-files")  # what an agent or a person reads: not the ended job's
    assert res.exit_code == 0, res.stderr
    assert not (ended / "MANIFEST.json").exists()
    assert run_cli("doctor").exit_code == 0
    res = run_cli("rewrite-files", "--all")
    assert res.exit_code == 0, res.stderr
    assert f"wrote the files of {len(jobs)} job(s) and {len(reports)} escalation report(s)" in (
        res.stdout
    )
    after = {p: p.read_bytes() for p in before if p.is_file()}
    assert after == before
    assert run_cli("doctor").exit_code == 0
    shutil.rmtree(ended)  # an ended job's folder, deleted to free the disk
    assert run_cli("doctor").exit_code == 0


def _excused(cycle, **outcome) -> tuple[str, list[str]]:
    """The next job's attempt ends reviewer-touched-kb, its one change a fix reviewq wrote
    meanwhile (so excused), with ``outcome``'s fields; its recorded outcome and reasons."""
    _, ws, control, sent, _ = cycle
    control.dispatch()
    msg = sent.pop(0)
    note = next(iter(msg["guarded"]))
    sha = "0" * 64
    with ws.store.write():  # written while the attempt ran
        ws.store.conn.execute("INSERT INTO fix_writes VALUES (?, ?, 99, ?)", (note, sha, utcnow()))
    control.on_outcome(
        {
            "job_id": msg["job_id"],
            "attempt": msg["attempt"],
            "classification": "reviewer-touched-kb",
            "output": None,
            "exit_code": 0,
            "touched": [note],
            "touched_hashes": {note: sha},
            "reasons": [f"the reviewer changed {note}"],
            **outcome,
        }
    )
    row = ws.store.conn.execute(
        "SELECT outcome, reasons FROM attempts WHERE job_id = ? AND attempt = ?",
        (msg["job_id"], msg["attempt"]),
    ).fetchone()
    return row[0], json.loads(row[1])


def test_an_attempt_whose_kb_change_was_excused_still_says_why_it_failed(cycle):
    """Its only change to the KB was a fix reviewq wrote meanwhile, so it was judged as
    no-output, with its reasons cleared: `job N` showed none, and the retry's prompt had
    no "previous attempt" section to tell the agent what went wrong. (A worker of an
    earlier release sends no judgement of its own.)"""
    assert _excused(cycle) == ("no-output", ["exited 0 without writing its output"])


def test_an_excused_attempt_is_judged_as_it_ended_without_the_change(cycle):
    """The excuse made every such attempt "output" or "no-output": one that had burned
    out was counted as a failure and not split, and a reviewer's outage counted against
    the job."""
    outage = "rate-limited: 429 Too Many Requests"
    got = _excused(cycle, exit_code=1, untouched=["reviewer-failure", [outage]])
    assert got == ("reviewer-failure", [outage])


def test_an_excused_attempts_own_judgement_is_redacted_and_must_be_a_known_one(cycle):
    """The reasons of the judgement without the change were stored as sent: a secret the
    control knows (and the worker elsewhere did not) reached state.db and the retry."""
    from orchestrator import logs

    logs.add_secrets(["controlsecret-123456"])
    got = _excused(cycle, untouched=["no-output", ["key controlsecret-123456 refused"]])
    assert got == ("no-output", ["key [redacted] refused"])


def test_files_due_that_no_tick_has_tried_yet_are_no_problem_for_doctor(kb, run_cli):
    """An upgrade's migration marks every open escalation's report due (it renders fields
    the old release lacked), and OPERATIONS' upgrade steps run doctor before the control
    starts: doctor exited 1, 'problem: N escalation report(s) wait to be written', for
    files the first tick writes. Not yet tried is said, not counted; a write that failed
    still is (test_doctor_says_when_a_fixed_note_waits_to_be_written)."""
    import shutil

    from orchestrator.cycles.escalations import mark_reports_due
    from orchestrator.state.store import Store

    from .conftest import reviewq_process

    shutil.copytree(pathlib.Path(__file__).parent.parent / "kb", kb.root / "kb", dirs_exist_ok=True)
    sweep = reviewq_process("--root", str(kb.root), "sweep", "--reviewer", "offline", "--fix")
    assert sweep.returncode in (0, 1), sweep.stderr
    with Store.open(kb.state) as store:
        marked = mark_reports_due(store)
    assert marked > 0
    res = run_cli("doctor")
    assert res.exit_code == 0, res.stdout
    assert (
        f"ok: {marked} escalation report(s) wait to be written (not written yet); no control "
        "process runs for this state folder: reviewq rewrite-files writes them at once"
        in res.stdout
    ), res.stdout


def test_a_fix_of_a_note_moved_meanwhile_is_not_called_a_persons_edit(cycle, run_cli):
    """A fix not applied because its note was moved (or deleted, or decided by a person)
    while the fixer ran was counted in the report as "not applied (a person edited the
    note)": on a real KB, a redo's fix for a note moved to another folder sent the person
    looking for an edit nobody made."""
    kb, ws, control, sent, review = cycle
    _run(control, sent, _bundle(ws, review, "FAIL"))
    fixed = kb.read(NOTE) + "Fixed.\n"
    (kb.root / NOTE).rename(kb.root / "kb/notes/moved.md")
    _run(control, sent, fixed.encode())
    res = run_cli("report")
    assert res.exit_code == 0, res.stderr
    assert "a person edited the note" not in res.stdout
    assert "1 not applied (the note was edited, moved or decided before the fix was " in (
        res.stdout
    )
    page = (ws.state_dir / "report.html").read_text()
    assert "because a person edited the note" not in page
    assert "the note cannot be read now" in page


def test_a_fix_kept_out_by_an_edit_after_its_decision_is_not_said_to_meet_it_in_its_run(
    cycle, monkeypatch, run_cli
):
    """A fix whose write waited (a full disk) and whose note a person then edited is not
    applied too, but after the fixer ran: the report's count said every one not applied
    met its edit, move or decision "while the fixer ran", and sent the person to look at
    the fixer's run for an edit made later."""
    _rereview_of_a_fix_not_written(cycle, monkeypatch, dispatched=False)
    res = run_cli("report")
    assert res.exit_code == 0, res.stderr
    assert "while the fixer ran" not in res.stdout
    assert "1 not applied (the note was edited, moved or decided before the fix was " in (
        res.stdout
    )
    page = (cycle[1].state_dir / "report.html").read_text()
    assert "while the fixer ran" not in page


def test_a_person_editing_a_symlinked_note_while_its_fixer_runs_is_not_the_fixers_doing(kb):
    """A fix's own note changing under it is excused (the fix is then found stale and the
    person's text kept), but for a note that is a link the watch also names the file it
    links to: the fixer was failed as reviewer-touched-kb for the person's edit."""
    import hashlib

    real, link, ws, control, sent = _symlinked_note_failed(kb)
    control.dispatch()
    fix = sent.pop(0)
    fixed = real.read_text() + "Fixed.\n"
    real.write_text(real.read_text() + "The person's own line.\n")  # while the fixer runs
    sha = hashlib.sha256(real.read_bytes()).hexdigest()
    touched = ["kb/notes/link.md", "shared/real.md"]
    control.on_outcome(
        {
            "job_id": fix["job_id"],
            "attempt": fix["attempt"],
            "classification": "reviewer-touched-kb",
            "output": fixed.encode(),
            "exit_code": 0,
            "touched": touched,
            "touched_hashes": dict.fromkeys(touched, sha),
            "reasons": [f"the reviewer changed {p}" for p in touched],
            "untouched": ["output", []],
        }
    )
    row = ws.store.conn.execute(
        "SELECT a.outcome, j.result FROM attempts a JOIN review_jobs j ON j.id = a.job_id "
        "WHERE a.job_id = ? AND a.attempt = ?",
        (fix["job_id"], fix["attempt"]),
    ).fetchone()
    assert tuple(row) == ("finalized", "not-applied")
    assert "The person's own line." in real.read_text()
    ws.close()
