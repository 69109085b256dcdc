"""The control process's dispatch, in-process (no queue): what a full disk does to it."""

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
from orchestrator.state.store import Store, utcnow
from orchestrator.state.workspace import Workspace
from orchestrator.sweeps.producer import SweepRequest, enqueue

from .conftest import local_clock, spend


def _open_escalation(ws: Workspace, reason: str, material: list[str], recommend: str) -> int:
    """An open escalation of alpha against prose/clarity, raised as the control would."""
    from orchestrator.cycles.escalations import escalate

    return escalate(
        ws.store, ws.state_dir, ws.root, partition="offline", note_path="kb/notes/alpha.md",
        gate_id="prose/clarity", reason=reason, reviewer="offline", fixer="offline",
        material=material, recommend=recommend,
    )  # fmt: skip


def _one_queued_job(kb):
    """alpha against prose/clarity queued for the offline reviewer, and a control process
    in-process whose review messages land in ``sent``."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    (job,) = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
    sent: list[dict] = []
    return ws, job, sent, Control(ws, send_review=sent.append, hooks=FollowUp(ws))


def test_a_full_disk_at_dispatch_leaves_the_job_queued_until_there_is_room(kb, monkeypatch):
    import orchestrator.control.attempts as attempts

    ws, job, sent, control = _one_queued_job(kb)
    real_write_prompt = attempts._write_prompt

    def disk_full(attempt_dir, prompt, shown):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(attempts, "_write_prompt", disk_full)
    control.dispatch()
    row = ws.store.conn.execute(
        "SELECT status, attempt FROM review_jobs WHERE id = ?", (job.review_job_id,)
    ).fetchone()
    assert tuple(row) == ("queued", 0) and sent == []
    assert ws.store.conn.execute("SELECT count(*) FROM attempts").fetchone()[0] == 0

    monkeypatch.setattr(attempts, "_write_prompt", real_write_prompt)
    control.dispatch()
    assert [m["job_id"] for m in sent] == [job.review_job_id]
    assert sent[0]["attempt"] == 1
    ws.store.close()


@pytest.mark.parametrize(
    "jobs_prompt", ["as rendered", "an earlier release's", "deleted", "a FIFO", "another history's"]
)
def test_a_dispatched_attempt_keeps_its_prompt_only_where_the_jobs_is_not_it(kb, jobs_prompt):
    """N26: a first review attempt's prompt is the job's prompt.md but for the output path
    it names; both were kept (54 MB each after a real KB's night). The attempt's is
    written only where the job's, its path put for the job's, is not the prompt sent."""
    ws, job, sent, control = _one_queued_job(kb)
    folder = ws.state_dir / "jobs" / f"review-job-{job.review_job_id}"
    prompt = folder / "prompt.md"
    if jobs_prompt == "an earlier release's":
        prompt.write_text(prompt.read_text().replace("Write exactly one file", "Write one file"))
    elif jobs_prompt == "deleted":
        prompt.unlink()
    elif jobs_prompt == "a FIFO":  # put there by hand: read as nothing, not waited on
        prompt.unlink()
        os.mkfifo(prompt)
    elif jobs_prompt == "another history's":  # N29: state.db put back, attempt 1 again
        (folder / "attempt-1").mkdir(mode=0o700)
        (folder / "attempt-1" / "prompt.md").write_text("## Your previous attempt was rejected\n")
    control.dispatch()
    [msg] = sent
    kept = folder / "attempt-1" / "prompt.md"
    if jobs_prompt in ("as rendered", "another history's"):
        assert not kept.exists() and (folder / "attempt-1").is_dir()
        shown = (f"`{job.bundle_output_path}`", f"`{msg['output_shown']}`")
        assert prompt.read_text().replace(*shown) == msg["prompt"]
    else:
        assert kept.read_text() == msg["prompt"]
    ws.store.close()


@pytest.mark.parametrize("broken", ["a file where it was", "a full disk"])
def test_dispatch_of_a_job_whose_folder_cannot_be_written_leaves_it_queued(kb, monkeypatch, broken):
    """A person deleted a queued job's folder and put a file there (or deleted it on a
    full disk): dispatch failed the job "without starting" (NotADirectoryError from the
    attempt's folder), or sent its agent to a folder with no MANIFEST.json, whose failure
    was counted against the profile."""
    import orchestrator.state.files as files
    from orchestrator import logs

    ws, job, sent, control = _one_queued_job(kb)
    logs.configure(ws.state_dir)
    folder = ws.state_dir / ws.store.conn.execute("SELECT job_dir FROM review_jobs").fetchone()[0]
    shutil.rmtree(folder)
    real = files.write_manifest
    if broken == "a file where it was":
        folder.write_text("not a folder\n")
    else:

        def disk_full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(files, "write_manifest", disk_full)
    assert control.dispatch() == 0
    assert control.dispatch() == 0  # tried again, said once
    assert sent == []
    row = ws.store.conn.execute("SELECT status, attempt FROM review_jobs").fetchone()
    assert tuple(row) == ("queued", 0)
    assert ws.store.conn.execute("SELECT count(*) FROM attempts").fetchone()[0] == 0
    assert ws.store.conn.execute("SELECT launch_failures FROM reviewer_state").fetchall() in (
        [],
        [(0,)],
    )
    lines = (ws.state_dir / "logs" / "reviewq.jsonl").read_text().splitlines()
    [said] = [e for e in map(json.loads, lines) if e["event"] == "dispatch.deferred"]
    assert said["folder"] == str(folder) and said["reason"], said

    if broken == "a file where it was":
        folder.unlink()
    monkeypatch.setattr(files, "write_manifest", real)
    assert control.dispatch() == 1
    assert [m["job_id"] for m in sent] == [job.review_job_id]
    assert (folder / "MANIFEST.json").is_file()
    ws.store.close()


def test_a_job_folder_that_cannot_be_searched_defers_that_job_only(kb, monkeypatch):
    """A queued job's folder a person left mode 000: the dispatch's look at its
    MANIFEST.json raised EACCES out of the pass, and no job was dispatched, at every
    dispatch, until the folder was mended. Root searches any mode, so the kernel's
    refusal (stat and open under the folder, open of the folder) is made here."""
    import os

    from orchestrator import logs

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("beta")
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    first, second = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    (job_dir,) = ws.store.conn.execute(
        "SELECT job_dir FROM review_jobs WHERE id = ?", (first.review_job_id,)
    ).fetchone()
    folder = ws.state_dir / job_dir
    real_stat, real_open = os.stat, os.open

    def refused(path) -> None:  # noqa: ANN001
        if str(path).startswith(str(folder)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    def stat(path, *args, **kwargs):  # noqa: ANN001, ANN202
        if str(path) != str(folder):  # its own inode is its parent's to show
            refused(path)
        return real_stat(path, *args, **kwargs)

    def open_(path, *args, **kwargs):  # noqa: ANN001, ANN202
        refused(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "open", open_)
    assert control.dispatch() == 1
    assert control.dispatch() == 0  # tried again, said once
    assert [m["job_id"] for m in sent] == [second.review_job_id]
    row = ws.store.conn.execute(
        "SELECT status, attempt FROM review_jobs WHERE id = ?", (first.review_job_id,)
    ).fetchone()
    assert tuple(row) == ("queued", 0)
    lines = (ws.state_dir / "logs" / "reviewq.jsonl").read_text().splitlines()
    [said] = [e for e in map(json.loads, lines) if e["event"] == "dispatch.deferred"]
    assert said["job_id"] == first.review_job_id and "Permission denied" in said["reason"]

    monkeypatch.setattr(os, "stat", real_stat)
    monkeypatch.setattr(os, "open", real_open)
    assert control.dispatch() == 1
    assert [m["job_id"] for m in sent] == [second.review_job_id, first.review_job_id]
    ws.store.close()


def test_files_a_full_disk_kept_from_being_written_are_written_at_the_next_tick(kb, monkeypatch):
    import orchestrator.state.files as reports
    from orchestrator.review.bundle import end_line, start_line
    from orchestrator.review.finalize import finalize

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    (job,) = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
    note, gate = ws.store.conn.execute(
        "SELECT note_path, gate_path FROM review_pairs WHERE job_id = ?", (job.review_job_id,)
    ).fetchone()
    output = f"{start_line(note, gate)}\nFine.\n## Result: PASS\n{end_line(note, gate)}\n"
    real = reports.write_job_files

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(reports, "write_job_files", disk_full)
    res = finalize(ws.store, ws.state_dir, job.review_job_id, output.encode())
    # The review is kept; only its files wait.
    assert res.status == "completed"
    assert ws.store.conn.execute("SELECT decision FROM acceptance").fetchone()[0] == "PASS"
    due = ws.store.conn.execute("SELECT job_id, error FROM job_files_due").fetchall()
    assert [(r[0], "No space left" in r[1]) for r in due] == [(job.review_job_id, True)]
    job_dir = ws.state_dir / ws.store.conn.execute("SELECT job_dir FROM review_jobs").fetchone()[0]
    assert not (job_dir / "results").exists()

    monkeypatch.setattr(reports, "write_job_files", real)
    control = Control(ws, send_review=lambda msg: None, hooks=FollowUp(ws))
    assert control.write_due_files() == 1
    assert ws.store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 0
    assert [
        p.read_text().rstrip().endswith("## Result: PASS") for p in (job_dir / "results").iterdir()
    ] == [True]
    ws.store.close()


def _pass_output(ws, job_id: int) -> bytes:
    from orchestrator.review.bundle import end_line, start_line

    note, gate = ws.store.conn.execute(
        "SELECT note_path, gate_path FROM review_pairs WHERE job_id = ?", (job_id,)
    ).fetchone()
    return f"{start_line(note, gate)}\nFine.\n## Result: PASS\n{end_line(note, gate)}\n".encode()


def test_one_jobs_broken_folder_does_not_keep_the_other_jobs_files_from_being_written(
    kb, monkeypatch
):
    import shutil

    import orchestrator.state.files as files
    from orchestrator.review.finalize import finalize

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("beta")
    ws = Workspace.open(kb.root)
    jobs = [j.review_job_id for j in enqueue(ws, SweepRequest(name="cli", all_gates=True)).jobs]
    real = files.write_job_files

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "write_job_files", disk_full)
    for job_id in jobs:
        assert finalize(ws.store, ws.state_dir, job_id, _pass_output(ws, job_id)).ok
    monkeypatch.setattr(files, "write_job_files", real)
    folders = [
        ws.state_dir / r[0]
        for r in ws.store.conn.execute("SELECT job_dir FROM review_jobs ORDER BY id")
    ]
    # A person replaced the first job's folder by a file: its files cannot be written.
    shutil.rmtree(folders[0])
    folders[0].write_text("not a folder")

    control = Control(ws, send_review=lambda msg: None, hooks=FollowUp(ws))
    assert control.write_due_files() == 1
    assert [p.name.endswith(".md") for p in (folders[1] / "results").iterdir()] == [True]
    due = ws.store.conn.execute("SELECT job_id, error FROM job_files_due").fetchall()
    assert [(r[0], "review-job-1" in r[1]) for r in due] == [(jobs[0], True)]
    ws.store.close()


def _bundle(store, job_id: int, decision: str) -> bytes:
    from orchestrator.review.bundle import end_line, start_line

    return "\n".join(
        f"{start_line(note, gate)}\n- high: thin.\n## Result: {decision}\n{end_line(note, gate)}\n"
        for note, gate in store.conn.execute(
            "SELECT note_path, gate_path FROM review_pairs WHERE job_id = ? ORDER BY id", (job_id,)
        )
    ).encode()


def test_dispatch_does_not_reopen_a_job_finalized_by_hand_meanwhile(kb, monkeypatch):
    """Dispatch read the job before it took the write lock: a `reviewq finalize` that
    committed in between was reopened, run again and accepted twice (one FAIL counted as
    two rejections). The person's commit lands as dispatch asks for the write lock (for
    its pass, or, as it was, for each attempt)."""
    import sys

    from orchestrator.control.followup import finalize_by_hand
    from orchestrator.review.finalize import Provenance

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    (job,) = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
    person = Workspace.open(kb.root)  # another process: `reviewq finalize` by hand
    real_write = ws.store.write

    def write():
        if sys._getframe(1).f_code.co_name in ("dispatch", "open_attempt") and not person_done:
            person_done.append(True)
            bundle = _bundle(person.store, job.review_job_id, "FAIL")
            res, _ = finalize_by_hand(person, job.review_job_id, bundle, Provenance(runner="me"))
            assert res.ok
        return real_write()

    person_done: list[bool] = []
    monkeypatch.setattr(ws.store, "write", write)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    assert control.dispatch() == 0 and person_done and sent == []
    row = ws.store.conn.execute(
        "SELECT status, attempt FROM review_jobs WHERE id = ?", (job.review_job_id,)
    ).fetchone()
    assert tuple(row) == ("completed", 0)
    person.close()
    ws.close()


@pytest.mark.parametrize("kind", ["fix", "audit"])
def test_a_burned_out_fix_or_audit_is_retried_not_split_into_reviews(kb, kind):
    """A burned-out job of several pairs was split into one-pair *review* jobs whatever
    its kind: a fix became re-reviews of the unfixed note (FAILs counted as rejections,
    the fixer's attempt cap bypassed); an audit became reviews whose verdicts were
    accepted, and an auditor's FAIL escalated nothing."""
    kb.gate("prose/clarity", ["body"], audit=kind == "audit")
    kb.gate("prose/brevity", ["body"], audit=kind == "audit")
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    (job,) = enqueue(ws, SweepRequest(name="cli", all_gates=True, fix=kind == "fix")).jobs
    control.dispatch()
    msg = sent.pop(0)
    verdict = "FAIL" if kind == "fix" else "PASS"
    output = _bundle(ws.store, job.review_job_id, verdict)
    control.on_outcome({"v": 4, "job_id": msg["job_id"], "attempt": msg["attempt"], "classification": "output", "output": output})  # fmt: skip
    control.dispatch()
    msg = sent.pop(0)
    assert msg["task"] == kind and len(msg["pairs"]) == 2
    control.on_outcome({"v": 4, "job_id": msg["job_id"], "attempt": msg["attempt"], "classification": "burned-out", "reasons": ["deadline"]})  # fmt: skip
    rows = ws.store.conn.execute(
        "SELECT kind, status FROM review_jobs WHERE id = ? OR parent_job_id = ?",
        (msg["job_id"], msg["job_id"]),
    ).fetchall()
    assert [tuple(r) for r in rows] == [(kind, "queued")]  # tried again, whole
    control.dispatch()
    again = sent.pop(0)
    assert (again["job_id"], again["attempt"], again["task"]) == (msg["job_id"], 2, kind)
    ws.close()


def test_a_job_no_agent_can_run_goes_to_a_person(kb):
    """A job failed at dispatch (its profile removed from reviewq.toml) was failed
    silently: for a fix, the note's FAILs stayed fresh, so no sweep took them up again and
    no person was told."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    (job,) = enqueue(ws, SweepRequest(name="cli", all_gates=True, fix=True)).jobs
    control.dispatch()
    msg = sent.pop(0)
    output = _bundle(ws.store, job.review_job_id, "FAIL")
    control.on_outcome({"v": 4, "job_id": msg["job_id"], "attempt": msg["attempt"], "classification": "output", "output": output})  # fmt: skip
    with ws.store.write():  # the fixer's profile is gone from reviewq.toml
        ws.store.conn.execute("UPDATE review_jobs SET reviewer = 'gone' WHERE kind = 'fix'")
    control.dispatch()
    fix = ws.store.conn.execute("SELECT status FROM review_jobs WHERE kind = 'fix'").fetchone()
    escalated = ws.store.conn.execute(
        "SELECT note_path, gate_id, reason FROM escalations"
    ).fetchall()
    assert fix[0] == "failed"
    assert [tuple(r)[:2] for r in escalated] == [("kb/notes/alpha.md", "prose/clarity")]
    # No attempt ran: the reason said "the fixer failed every attempt".
    assert escalated[0]["reason"] == (
        "the fixer failed without starting: reviewer profile 'gone' is not configured"
    )
    ws.close()


def test_a_sequential_sweep_does_not_ask_again_for_a_pair_just_answered_error(kb):
    """ERROR is never accepted, so the pair stays stale and in the current bundle: the
    next-bundle follow-up queued it again after every job, a paid review each time,
    without end."""
    kb.gate("prose/clarity", ["body"])
    kb.gate("style/tone", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    enqueue(ws, SweepRequest(name="seq", reviewer="offline", all_gates=True, sequential=True))
    for _ in range(5):
        control.dispatch()
        if not sent:
            break
        msg = sent.pop(0)
        output = _bundle(ws.store, msg["job_id"], "ERROR")
        control.on_outcome({"v": 4, "job_id": msg["job_id"], "attempt": msg["attempt"], "classification": "output", "output": output})  # fmt: skip
    jobs = ws.store.conn.execute("SELECT status, lens FROM review_jobs").fetchall()
    assert [tuple(r) for r in jobs] == [("completed", "prose")]  # style waits behind it
    ws.close()


def test_the_parts_of_a_split_re_review_keep_the_fix_they_follow(kb):
    from orchestrator.review.jobs import split_job

    kb.gate("prose/clarity", ["body"])
    kb.gate("prose/brevity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    (job,) = enqueue(ws, SweepRequest(name="cli", all_gates=True)).jobs
    with ws.store.write():
        ws.store.conn.execute(
            "UPDATE review_jobs SET source_job_id = 99 WHERE id = ?", (job.review_job_id,)
        )
    parts = split_job(ws.store, ws.state_dir, ws.root, job.review_job_id)
    sources = ws.store.conn.execute(
        f"SELECT source_job_id FROM review_jobs WHERE id IN ({','.join('?' * len(parts))})",
        parts,
    ).fetchall()
    assert [r[0] for r in sources] == [99, 99]
    ws.close()


def test_a_job_finalized_by_hand_frees_its_reviewer_s_dispatch_slot(kb):
    """`reviewq finalize` of a dispatched job left its attempt open: with no outcome to
    come (workers down, the message expired), it counted against the reviewer's slots for
    good, and at 2 x concurrency such jobs the reviewer never dispatched again."""
    from orchestrator.control.control import PREFETCH
    from orchestrator.control.followup import finalize_by_hand
    from orchestrator.review.finalize import Provenance

    kb.gate("prose/clarity", ["body"])
    ws = Workspace.open(kb.root)
    slots = PREFETCH * ws.settings.reviewers["offline"].concurrency
    for i in range(slots):
        kb.note(f"n{i}")
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    assert control.dispatch() == slots
    for msg in sent:  # no worker takes them: a person does the jobs by hand
        res, _ = finalize_by_hand(
            ws, msg["job_id"], _bundle(ws.store, msg["job_id"], "PASS"), Provenance(runner="me")
        )
        assert res.ok
    outcomes = {r[0] for r in ws.store.conn.execute("SELECT outcome FROM attempts")}
    assert outcomes == {"superseded"}
    kb.note("later")
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    assert control.dispatch() == 1
    ws.close()


def test_a_persons_redo_goes_before_queued_first_reviews_and_an_audit_keeps_its_place(kb):
    """A person's `redo` queued a fix behind the whole night's first reviews (job-id
    order): the person who asked for it at 8 a.m. waited for the night's queue. It is a fix
    like the cycle's, taken first; an audit, queued by a PASS, keeps its place by age (the
    PASS stands meanwhile) and waits behind the first reviews queued before it."""
    kb.gate("prose/clarity", ["body"], audit=True)
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    control.dispatch()
    msg = sent.pop(0)
    control.on_outcome(_outcome(ws, msg, output=_bundle(ws.store, msg["job_id"], "FAIL")))
    esc = _open_escalation(ws, "3 consecutive rejections", ["high: thin."], "reject")
    for i in range(6 * ws.settings.reviewers["offline"].concurrency):
        kb.note(f"n{i}")
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    assert control.dispatch() > 0 and control.dispatch() == 0  # the reviewer's slots full
    _, fixes, _ = FollowUp(ws).decide([esc], None, "redo", "Say what the body means.")
    # An outcome frees a slot: its PASS queues an audit, and the redo's fix takes the slot.
    control.on_outcome(_outcome(ws, sent.pop(0)))
    assert control.dispatch() == 1
    assert (sent[-1]["job_id"], sent[-1]["task"]) == (fixes["kb/notes/alpha.md"], "fix")
    # The next slot goes to a first review queued before the audit, not to the audit.
    control.on_outcome(_outcome(ws, sent.pop(0)))
    assert control.dispatch() == 1
    assert sent[-1]["task"] == "review"
    audits = ws.store.conn.execute(
        "SELECT status FROM review_jobs WHERE kind = 'audit' ORDER BY id"
    ).fetchall()
    assert [a[0] for a in audits] == ["queued", "queued"]
    ws.close()


def test_a_fix_goes_after_the_reviews_of_its_note_queued_before_it(kb):
    """Taken before the queue (C101), a fix rewrote its note before the note's other
    lens, queued behind the night's first reviews, was reviewed: that review judged the
    text the fix replaced, and its FAIL, stale, started no fix and escalated nothing (a
    real `sweep --fix` of four two-lens notes left one pair so). The note's reviews queued
    before its fix go with it, first."""
    kb.gate("prose/clarity", ["body"])
    kb.gate("style/tone", ["body"])
    kb.note("zulu")  # its style job after the other notes'
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    enqueue(ws, SweepRequest(name="cli", selectors=("prose",), fix=True))
    control.dispatch()
    msg = sent.pop(0)
    for i in range(6 * ws.settings.reviewers["offline"].concurrency):
        kb.note(f"n{i}")
    enqueue(ws, SweepRequest(name="cli", selectors=("style",), fix=True))
    (style,) = ws.store.conn.execute(
        "SELECT job_id FROM review_pairs WHERE note_path = 'kb/notes/zulu.md' "
        "AND gate_id = 'style/tone'"
    ).fetchone()
    assert control.dispatch() > 0 and control.dispatch() == 0  # the reviewer's slots full
    assert style not in {m["job_id"] for m in sent}
    control.on_outcome(_outcome(ws, msg, output=_bundle(ws.store, msg["job_id"], "FAIL")))
    control.on_outcome(_outcome(ws, sent.pop(0)))
    assert control.dispatch() == 2
    (fix,) = ws.store.conn.execute("SELECT id FROM review_jobs WHERE kind = 'fix'").fetchone()
    assert [(m["job_id"], m["task"]) for m in sent[-2:]] == [(style, "review"), (fix, "fix")]
    ws.close()


# A profile whose two runs to the timeout fit in a message's expiry (lease / 2 + timeout),
# so that quick agents may keep three open attempts a slot (Control._open_at_most).
QUICK_ENOUGH = '[reviewers.offline]\nkind = "offline"\ntimeout = "20s"\nconcurrency = 4\n'


def _slots_filled(kb, config: str | None = None) -> tuple[Workspace, Control, list[dict], int]:
    """An offline reviewer with 6 x concurrency jobs queued (``config``: its reviewq.toml)
    and a control that has dispatched PREFETCH x concurrency of them: its slots are full."""
    from orchestrator.control.control import PREFETCH

    kb.gate("prose/clarity", ["body"])
    if config is not None:
        kb.write("reviewq.toml", config)
    ws = Workspace.open(kb.root)
    concurrency = ws.settings.reviewers["offline"].concurrency
    for i in range(6 * concurrency):
        kb.note(f"n{i}")
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    assert control.dispatch() == PREFETCH * concurrency
    return ws, control, sent, concurrency


def test_a_reviewer_whose_agents_are_quick_keeps_three_attempts_open_a_slot(kb):
    """With two open attempts a worker slot, agents that end within the control's own
    round (its gather, its transaction) found the review queue empty: the outcomes
    waiting on the control queue still counted as open, and slots waited for the next
    batch (stop 32). An agent that ran under a second and exited 0 lets its reviewer
    three a slot; a slow or failed one takes it back to two (a third message would wait
    behind two long runs, past its expiry). Its timeout is short enough that two runs to
    it fit in a message's expiry (lease / 2 + timeout)."""
    from orchestrator.control.control import PREFETCH

    ws, control, sent, concurrency = _slots_filled(kb, QUICK_ENOUGH)
    # One quick outcome: its slot is refilled, and the reviewer may keep three a slot.
    control.on_messages([], [_outcome(ws, sent[0], duration_s=0.004)], dispatch=True)
    assert len(sent) == PREFETCH * concurrency + 1 + concurrency
    # A slow one, then a quick failure: back to two a slot, so none is opened for them.
    control.on_messages([], [_outcome(ws, sent[1], duration_s=30.0)], dispatch=True)
    control.on_messages([], [_outcome(ws, sent[2], duration_s=0.004, exit_code=1)], dispatch=True)
    assert control.dispatch() == 0
    assert len(sent) == PREFETCH * concurrency + 1 + concurrency
    ws.close()


def test_a_quick_reviewer_whose_runs_could_outlast_the_expiry_keeps_two_a_slot(kb):
    """A third message a slot waits behind two runs. Sent while the agents were quick, it
    passed its expiry (lease / 2 + timeout) when they turned slow, and was dropped unrun
    and given up as "never picked up by a worker" a lease and a timeout later: a reviewer
    whose two runs to the timeout do not fit in the expiry (the offline profile's 120 s
    against a 120-s lease) keeps two a slot however quick its agents."""
    from orchestrator.control.control import PREFETCH

    ws, control, sent, concurrency = _slots_filled(kb)  # the offline profile's defaults
    control.on_messages([], [_outcome(ws, sent[0], duration_s=0.004)], dispatch=True)
    assert len(sent) == PREFETCH * concurrency + 1  # its slot refilled, no third a slot
    ws.close()


def test_an_agent_that_exits_0_at_once_with_no_output_is_not_quick(kb):
    """An agent that exited 0 in milliseconds having written nothing (a misconfigured
    CLI printing its help, an error said on stdout) is no sign of the next runs' pace:
    counted quick, a reviewer whose real runs are long kept a third message a slot,
    which waited behind two of them past its expiry."""
    # Its two runs to the timeout fit in the expiry: counted quick, the outcome would
    # open a third message a slot (with the default 120 s, no outcome could).
    ws, control, sent, concurrency = _slots_filled(kb, QUICK_ENOUGH)
    for kind in ("no-output", "invalid-output"):
        before = len(sent)
        empty = _outcome(ws, sent[0 if kind == "no-output" else 1], duration_s=0.004)
        empty.update(classification=kind, output=None)
        control.on_messages([], [empty], dispatch=True)
        assert len(sent) - before <= 1, kind  # its slot refilled, no third a slot
    ws.close()


def test_a_locked_database_at_dispatch_leaves_the_job_queued(kb, monkeypatch):
    import sqlite3

    import pytest

    import orchestrator.control.control as control_module

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    (job,) = enqueue(ws, SweepRequest(name="cli", all_gates=True)).jobs
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    real = control_module.open_attempt

    def locked(*args, **kwargs):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(control_module, "open_attempt", locked)
    # The control task fails (Huey runs it again); the job is not failed for it.
    with pytest.raises(sqlite3.OperationalError):
        control.dispatch()
    row = ws.store.conn.execute("SELECT status, failure_reasons FROM review_jobs").fetchone()
    assert tuple(row) == ("queued", None) and sent == []

    monkeypatch.setattr(control_module, "open_attempt", real)
    control.dispatch()
    assert [m["job_id"] for m in sent] == [job.review_job_id]
    ws.store.close()


def test_a_cron_sweep_whose_enqueue_failed_is_enqueued_at_the_next_tick(kb, monkeypatch):
    import contextlib
    import sqlite3
    from datetime import datetime

    import orchestrator.sweeps.producer as producer
    from workers import tasks

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\n')
    ws = Workspace.open(kb.root)
    clock = [datetime(2026, 1, 2, 2, 59).astimezone()]
    control = Control(ws, send_review=lambda m: None, now=lambda: clock[0], hooks=FollowUp(ws))
    monkeypatch.setattr(tasks, "_control", control)
    tasks.tick()  # the first check starts the clock
    real = producer.enqueue
    calls = []

    def locked_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise sqlite3.OperationalError("database is locked")
        return real(*args, **kwargs)

    monkeypatch.setattr(producer, "enqueue", locked_once)
    clock[0] = datetime(2026, 1, 2, 3, 0, 10).astimezone()
    with contextlib.suppress(sqlite3.OperationalError):
        tasks.tick()  # the enqueue fails: state.db locked past the busy timeout
    clock[0] = datetime(2026, 1, 2, 3, 0, 40).astimezone()
    tasks.tick()  # Huey runs the tick again (or the next one comes)
    runs = ws.store.conn.execute("SELECT name, trigger, jobs FROM sweep_runs").fetchall()
    assert [tuple(r) for r in runs] == [("nightly", "cron", 1)]
    ws.store.close()


def _a_night_missed_and_failed(
    kb, monkeypatch, back_after: int = 20, meanwhile=lambda ws: None, suspended: bool = False
) -> tuple[str, str]:
    """A control whose clocks start at 02:59, stopped until 04:00:20 (``back_after``
    seconds past 04:00): `nightly` (03:00) missed, `lens` (04:00) failed for good, its lens
    renamed meanwhile (and ``meanwhile`` done). Their minutes in UTC. ``suspended``: the
    control ran all along, its machine suspended meanwhile (CLOCK_BOOTTIME counts it)."""
    from datetime import UTC, datetime, timedelta

    from workers import tasks

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.write(
        "reviewq.toml",
        '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\n'
        '[[sweeps]]\nname = "lens"\ncron = "0 4 * * *"\nselect = ["prose"]\n',
    )
    ws = Workspace.open(kb.root)
    clock = [datetime(2026, 1, 2, 2, 59).astimezone()]
    control = Control(ws, send_review=lambda m: None, now=lambda: clock[0], hooks=FollowUp(ws))
    if suspended:
        control.clocks = lambda: (clock[0].timestamp(), clock[0].timestamp() - 1e9)
    monkeypatch.setattr(tasks, "_control", control)
    tasks.tick()  # the clocks start; then the control stops for the night
    gate = "kb/instructions/review-gates/prose/clarity.md"
    kb.write(gate.replace("prose", "style"), kb.read(gate).replace("prose", "style"))
    (kb.root / gate).unlink()  # renamed
    meanwhile(ws)
    back = datetime(2026, 1, 2, 4, 0) + timedelta(seconds=back_after)
    clock[0] = back.astimezone()  # back at 04:00: 03:00 missed
    tasks.tick()
    ws.store.close()
    return tuple(f"{datetime(2026, 1, 2, h, 0).astimezone(UTC):%Y-%m-%dT%H:%M}Z" for h in (3, 4))


def test_status_says_a_cron_sweep_missed_or_failed_until_a_run_of_it_starts(
    kb, monkeypatch, run_cli
):
    """A nightly sweep missed (no control at 03:00) or failed for good (a lens since
    renamed) was said in the log alone: status at 7 a.m. showed a quiet night, as if
    nothing had been stale."""
    three, four = _a_night_missed_and_failed(kb, monkeypatch)
    out = run_cli("status").stdout
    assert (
        f"sweep 'nightly': its run of {three} was missed: no control process "
        "looked at its clock then, or the entry was left out of the settings or had no cron; "
        "it runs at its next time, or now with reviewq enqueue --name nightly\n"
    ) in out, out
    assert f"sweep 'lens': its run of {four} failed: SelectionError: " in out, out
    said = json.loads(run_cli("status", "--json").stdout)["sweeps_not_run"]
    assert [(n["sweep"], n["event"]) for n in said] == [
        ("lens", "sweep.failed"),
        ("nightly", "sweep.missed"),
    ]
    assert run_cli("enqueue", "--name", "nightly").exit_code == 0  # run now, as it says
    out = run_cli("status").stdout
    assert "sweep 'nightly': its run" not in out and "sweep 'lens': its run" in out


@pytest.fixture
def kolkata(monkeypatch):
    """The process's zone is Kolkata's (UTC+05:30, no daylight time)."""
    with local_clock(monkeypatch, "Asia/Kolkata"):
        yield


def test_a_controls_zone_from_a_copied_localtime_is_compared_by_its_rules(tmp_path, monkeypatch):
    """/etc/localtime copied, not linked (some images do), names no zone: compared by
    name, a control reading it as Berlin was said to be off the clock of a shell with
    TZ=Europe/Berlin."""
    from orchestrator.state.when import same_clock

    copy = tmp_path / "localtime"
    shutil.copyfile("/usr/share/zoneinfo/Europe/Berlin", copy)
    with local_clock(monkeypatch, "Europe/Berlin"):
        assert same_clock(str(copy))
        assert not same_clock("Asia/Kolkata")


def _as_control_then_shell(monkeypatch, state_dir, control_tz, between=lambda: None):
    """Keep a control's zone as one started with TZ=``control_tz`` does (``between``: done
    after its start), and return what this process, as a shell, reads back."""
    import os
    import time

    from orchestrator.state.status import control_zone, keep_zone
    from orchestrator.state.when import local_zone

    monkeypatch.setenv("TZ", control_tz)
    time.tzset()
    keep_zone(state_dir, local_zone())
    between()
    return control_zone(state_dir, os.getpid())


def test_a_controls_zone_read_from_a_file_is_kept_as_the_control_read_it(kb, monkeypatch, tmp_path):
    """TZ=:/etc/localtime (a unit's usual setting, sparing a stat per call) or a copied
    /etc/localtime: the control reads the file at its start, and `timedatectl
    set-timezone` replaces the file, not the rules the control read. Named by its path and
    compared with the file as `status` found it, a control still on UTC read as on the
    shell's new Berlin clock: nothing said the restart OPERATIONS asks for. A link was
    named `/etc/localtime`, not its zone."""
    import os
    import time

    from orchestrator.state.status import zone_said

    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 2 * * *"\n')
    ws = Workspace.open(kb.root)
    copy, link = tmp_path / "copied", tmp_path / "linked"
    shutil.copyfile("/usr/share/zoneinfo/Etc/UTC", copy)
    link.symlink_to("/usr/share/zoneinfo/Etc/UTC")

    def set_timezone_berlin() -> None:  # as timedatectl does: the file replaced
        shutil.copyfile("/usr/share/zoneinfo/Europe/Berlin", tmp_path / "new")
        os.replace(tmp_path / "new", copy)
        link.unlink()
        link.symlink_to("/usr/share/zoneinfo/Europe/Berlin")

    try:
        ws.state_dir.mkdir(exist_ok=True)
        kept_copy = _as_control_then_shell(monkeypatch, ws.state_dir, f":{copy}")
        kept_link = _as_control_then_shell(
            monkeypatch, ws.state_dir, f":{link}", set_timezone_berlin
        )
        monkeypatch.setenv("TZ", "Europe/Berlin")
        time.tzset()
        said_copy, said_link = zone_said(ws.settings, kept_copy), zone_said(ws.settings, kept_link)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert said_link is not None and said_link.startswith(
        "[[sweeps]] cron times are on the control's clock, Etc/UTC (now +00:00), not this "
        "shell's, Europe/Berlin"
    ), said_link
    assert said_copy is not None and f"control's clock, {copy} (now +00:00)" in said_copy


def test_a_controls_zone_given_as_a_posix_rule_is_compared_by_its_rules(kb, monkeypatch):
    """A control started with TZ=CET-1CEST,M3.5.0,M10.5.0/3 (Berlin's rules, as POSIX
    writes them) was compared with the shell by name: a shell with TZ=Europe/Berlin was
    told of another clock, one in Kolkata given no offset for the control's."""
    import time

    from orchestrator.state.status import zone_said

    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 2 * * *"\n')
    ws = Workspace.open(kb.root)
    rule = "CET-1CEST,M3.5.0,M10.5.0/3"
    try:
        ws.state_dir.mkdir(exist_ok=True)
        kept = _as_control_then_shell(monkeypatch, ws.state_dir, rule)
        said = {}
        for shell in ("Europe/Berlin", "Asia/Kolkata"):
            monkeypatch.setenv("TZ", shell)
            time.tzset()
            said[shell] = zone_said(ws.settings, kept)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert said["Europe/Berlin"] is None, said
    assert said["Asia/Kolkata"] is not None
    assert f"control's clock, {rule} (now +0" in said["Asia/Kolkata"], said


def test_zones_whose_daylight_time_starts_days_apart_are_not_one_clock(monkeypatch):
    """Athens and Jerusalem are both +02:00 in winter and +03:00 in summer, but Israel's
    daylight time starts on the Friday before the last Sunday of March: two days in which
    `0 3 * * *` fires an hour apart. Compared on a day a month over the year, the two read
    as one clock whenever no sampled day fell in those two (from 10 November 2026, none did),
    and a shell in Jerusalem was told nothing of a control in Athens."""
    from datetime import UTC, datetime

    from orchestrator.state import when

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):  # noqa: ANN206 - datetime's own
            return datetime(2026, 11, 10, 12, 0, tzinfo=UTC).astimezone(tz)

    monkeypatch.setattr(when, "datetime", Frozen)
    with local_clock(monkeypatch, "Asia/Jerusalem"):
        assert not when.same_clock("Europe/Athens")
        assert when.same_clock("Asia/Tel_Aviv")  # another name of Jerusalem's clock


def test_a_cron_sweep_missed_off_utc_is_said_at_its_cron_time_on_the_controls_clock(
    kb, monkeypatch, run_cli, kolkata
):
    """In Kolkata a `0 3 * * *` sweep missed was said as "its run of 2026-01-01T21:30Z
    was missed": at 7 a.m. the operator read a time their cron never names, on the day
    before, and took it for a run of the night before last."""
    three, four = _a_night_missed_and_failed(kb, monkeypatch)
    assert (three, four) == ("2026-01-01T21:30Z", "2026-01-01T22:30Z")
    out = run_cli("status").stdout
    assert (
        "sweep 'nightly': its run of 03:00 on 2026-01-02 on the control's clock "
        "(2026-01-01T21:30Z) was missed: no control process looked"
    ) in out, out
    assert (
        "sweep 'lens': its run of 04:00 on 2026-01-02 on the control's clock "
        "(2026-01-01T22:30Z) failed: SelectionError: "
    ) in out, out


def test_a_cron_sweep_missed_while_the_control_was_suspended_says_so(kb, monkeypatch, run_cli):
    """A control that ran all night on a machine suspended from 02:59 to 04:00 (a laptop's
    lid) said its 03:00 sweep was missed as "no control process looked at its clock then,
    or the entry was left out of the settings": the operator looked for a crash, or a bad
    entry, in the log of a control that had never stopped."""
    three, _ = _a_night_missed_and_failed(kb, monkeypatch, suspended=True)
    out = run_cli("status").stdout
    assert (
        f"sweep 'nightly': its run of {three} was missed: the control process was away "
        "then (its machine suspended or paused, the process stopped, or its clock stepped "
        "forward); it runs at its next time, or now with reviewq enqueue --name nightly\n"
    ) in out, out


def test_a_cron_sweep_run_by_hand_after_its_missed_time_is_not_said_missed(
    kb, monkeypatch, run_cli
):
    """A person who knew the control was down at 03:00 (an upgrade, OPERATIONS 1) ran
    `enqueue --name nightly` at 03:30, before the control was back: status then said the
    03:00 run "was missed … or now with reviewq enqueue --name nightly", as if it had not
    been run, since only runs after the control noticed counted."""
    from datetime import datetime

    from orchestrator.state.store import timestamp
    from orchestrator.sweeps import producer

    def by_hand(ws):
        with monkeypatch.context() as m:
            m.setattr(producer, "utcnow", lambda: timestamp(datetime(2026, 1, 2, 3, 30)))
            nightly = ws.settings.sweeps["nightly"]
            enqueue(ws, SweepRequest.from_config(nightly, ws.root, trigger="cli"))

    _a_night_missed_and_failed(kb, monkeypatch, meanwhile=by_hand)
    said = json.loads(run_cli("status", "--json").stdout)["sweeps_not_run"]
    assert [n["sweep"] for n in said] == ["lens"], said


def test_a_cron_sweep_that_failed_is_said_at_its_cron_time_not_the_ticks(kb, monkeypatch, run_cli):
    """A tick comes up to reaper_seconds after the cron minute (or, N5, a sweep is retried
    past it): the failed run was said as "its run of 04:03Z failed", a time no cron names,
    where a missed one says its minute."""
    _, four = _a_night_missed_and_failed(kb, monkeypatch, back_after=200)
    (said,) = [
        n
        for n in json.loads(run_cli("status", "--json").stdout)["sweeps_not_run"]
        if n["sweep"] == "lens"
    ]
    assert said["event"] == "sweep.failed" and said["at"].startswith(four[:-1]), said
    assert f"sweep 'lens': its run of {four} failed: SelectionError: " in run_cli("status").stdout


def test_a_cron_sweep_that_failed_on_a_file_name_with_a_line_break_is_one_report_line(
    kb, monkeypatch, run_cli
):
    """The error of a sweep failed for good names what it failed on, a file name that may
    hold a line break or an escape: status showed it as one printable line, the report's
    text wrote it raw, the rest of the name on a line of its own."""
    from datetime import datetime

    from orchestrator.sweeps.producer import cron_fired

    _a_night_missed_and_failed(kb, monkeypatch)
    ws = Workspace.open(kb.root)
    reason = "KBError: --note kb/notes/a\nb\x1b[31m.md: no such note"
    at = "2026-01-02T05:00:00Z"
    failed = {"event": "sweep.failed", "at": at, "reason": reason}
    cron_fired(ws, "lens", datetime(2026, 1, 2, 5, 0, 20).astimezone(), failed)
    ws.close()
    shown = "KBError: --note kb/notes/a\\nb\\x1b[31m.md: no such note"
    for out in (run_cli("status").stdout, run_cli("report").stdout):
        (line,) = [x for x in out.splitlines() if "sweep 'lens': its run" in x]
        assert f"failed: {shown}; it runs at its next time" in line, out


def test_the_morning_report_says_a_cron_sweep_missed_or_failed(kb, monkeypatch, run_cli):
    """The report of a night whose sweeps did not run said "needs you: nothing", the page
    "Nothing: … no job is stuck": a quiet night, read over coffee."""
    three, four = _a_night_missed_and_failed(kb, monkeypatch)
    page = kb.root / "report.html"
    out = run_cli("report", "--html", str(page)).stdout
    assert "needs you: 2 cron sweep(s) that did not run\n" in out, out
    assert f"  sweep 'nightly': its run of {three} was missed: " in out
    assert f"  sweep 'lens': its run of {four} failed: SelectionError: " in out
    html = page.read_text()
    assert "Cron sweeps that did not run" in html and "Nothing: no escalation" not in html
    needs = json.loads(run_cli("report", "--json").stdout)["needs_you"]
    assert [n["sweep"] for n in needs["sweeps_not_run"]] == ["lens", "nightly"]
    assert needs["count"] == 2


def test_create_jobs_writes_the_job_folders_outside_the_write_lock(kb, monkeypatch):
    import sqlite3

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("beta")
    ws = Workspace.open(kb.root)
    real_mkdir = pathlib.Path.mkdir
    lock_free: list[bool] = []

    def mkdir(self, *args, **kwargs):
        if self.name.startswith("review-job-"):
            probe = sqlite3.connect(ws.state_dir / "state.db", timeout=0, isolation_level=None)
            try:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
                lock_free.append(True)
            except sqlite3.OperationalError:
                lock_free.append(False)
            finally:
                probe.close()
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    jobs = enqueue(ws, SweepRequest(name="cli", all_gates=True)).jobs
    monkeypatch.setattr(pathlib.Path, "mkdir", real_mkdir)
    assert len(jobs) == 2 and lock_free and all(lock_free), lock_free
    for job in jobs:
        assert (kb.root / job.prompt_path).is_file()
        assert (kb.root / job.prompt_path).with_name("MANIFEST.json").is_file()
    assert ws.store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 0
    ws.store.close()


def test_a_redo_whose_fix_job_cannot_be_queued_leaves_the_escalation_open(kb, run_cli, monkeypatch):
    import sqlite3

    import orchestrator.control.followup as followup
    from orchestrator.review.finalize import finalize

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    (job,) = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
    output = _pass_output(ws, job.review_job_id).replace(b"## Result: PASS", b"## Result: FAIL")
    assert finalize(ws.store, ws.state_dir, job.review_job_id, output).status == "completed"
    esc_id = _open_escalation(ws, "three rejections", ["- major: unclear"], "say it plainly")
    ws.store.close()
    real = followup.create_fix_job

    def locked(*args, **kwargs):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(followup, "create_fix_job", locked)
    res = run_cli("decide", str(esc_id), "redo", "--feedback", "Say what it means.")
    assert res.exit_code == 1 and "run the command again" in res.stderr
    # As the error says, nothing was changed: the person's redo is not lost half-way.
    monkeypatch.setattr(followup, "create_fix_job", real)
    res = run_cli("decide", str(esc_id), "redo", "--feedback", "Say what it means.")
    assert res.exit_code == 0, res.stderr
    with Workspace.open(kb.root).store as store:
        fix = store.conn.execute("SELECT feedback FROM review_jobs WHERE kind = 'fix'").fetchall()
        decided = store.conn.execute("SELECT decision FROM escalations").fetchall()
    assert [tuple(r) for r in fix] == [("Say what it means.",)]
    assert [tuple(r) for r in decided] == [("redo",)]


def test_enqueued_jobs_carry_their_sweep_run_from_the_commit_that_creates_them(kb, monkeypatch):
    import sqlite3

    import orchestrator.sweeps.producer as producer

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    real = producer.create_jobs

    def then_locked(*args, **kwargs):
        # The jobs are made: once committed a control process may dispatch and finish
        # them, and the next write of this enqueue may hit a busy timeout.
        real(*args, **kwargs)
        raise sqlite3.OperationalError("database is locked")

    def runs_of_jobs() -> list[bool | None]:
        rows = ws.store.conn.execute(
            "SELECT r.options FROM review_jobs j LEFT JOIN sweep_runs r ON r.id = j.sweep_run_id"
        ).fetchall()
        # Its follow-ups read the job's run: without one, fixing would be off for it.
        return [json.loads(r[0] or "{}").get("fix") for r in rows]

    req = SweepRequest(name="cli", reviewer="offline", all_gates=True, fix=True)
    monkeypatch.setattr(producer, "create_jobs", then_locked)
    with pytest.raises(sqlite3.OperationalError):
        enqueue(ws, req)
    # The run, its jobs and its counts are one transaction: none of it committed.
    assert runs_of_jobs() == []
    assert ws.store.conn.execute("SELECT count(*) FROM sweep_runs").fetchone()[0] == 0
    monkeypatch.setattr(producer, "create_jobs", real)
    enqueue(ws, req)
    assert runs_of_jobs() == [True]
    ws.store.close()


def _packed_note(ws: Workspace, job_id: int) -> tuple[str, str]:
    """The text and sha256 of the note snapshot a one-pair job packed."""
    return tuple(
        ws.store.conn.execute(
            "SELECT s.text, s.sha256 FROM review_pairs p "
            "JOIN snapshots s ON s.id = p.note_snapshot_id WHERE p.job_id = ?",
            (job_id,),
        ).fetchone()
    )


def test_an_enqueue_packs_the_note_texts_its_selection_read_reading_each_once(kb, monkeypatch):
    """A sweep's selection reads and hashes every note; packing its pairs read and hashed
    each again (~15 % of a sweep's time before its first dispatch, and twice the KB's text
    held at once)."""
    import orchestrator.kb.notes as notes

    kb.gate("prose/clarity", ["body"])
    alpha = kb.note("alpha", "As selected.\n")
    ws = Workspace.open(kb.root)
    selected = (kb.root / alpha).read_bytes()
    reads: list[str] = []

    def counted(path: pathlib.Path) -> bytes:
        reads.append(pathlib.Path(path).name)
        return real_read(path)

    def counted_in_kb(self, rel: str) -> bytes:  # a KB file's read, checked inside the root
        if self.in_note_roots(rel):  # the gates' are not the notes' reads
            reads.append(pathlib.PurePosixPath(rel).name)
        return real_read_in_kb(self, rel)

    real_read, real_read_in_kb = notes.read_file, notes.KB.read_bytes
    monkeypatch.setattr(notes, "read_file", counted)
    monkeypatch.setattr(notes.KB, "read_bytes", counted_in_kb)
    res = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    assert reads == ["alpha.md"]
    [job] = res.jobs
    assert _packed_note(ws, job.review_job_id) == (selected.decode(), notes.sha256_bytes(selected))
    ws.store.close()


@pytest.mark.parametrize("reviewed", [False, True], ids=["edited", "edited and reviewed"])
def test_an_enqueue_packs_a_note_edited_since_its_selection_as_it_is_now(kb, monkeypatch, reviewed):
    """Y1 packed the text the selection read though the note was edited before the
    commit: a text gone from the KB was reviewed, and when the text after it had been
    reviewed meanwhile (a fix's re-review, a sweep beside) the old text's verdict replaced
    that review's, the pair back to a FAIL of a text the note no longer has. A note
    changed since the selection read it is packed as it is now, as create-jobs packs it,
    and skipped when its review came meanwhile."""
    import orchestrator.sweeps.producer as producer
    from orchestrator.review.finalize import finalize

    kb.gate("prose/clarity", ["body"])
    alpha = kb.root / kb.note("alpha", "As selected.\n")
    ws = Workspace.open(kb.root)
    real = producer.select
    edited: list[bytes] = []

    def then_edited(*args, **kwargs):
        selection = real(*args, **kwargs)
        if not edited:
            edited.append(alpha.read_bytes().replace(b"As selected.", b"Edited since."))
            alpha.write_bytes(edited[0])
            if reviewed:
                beside = Workspace.open(kb.root)
                req = SweepRequest(name="beside", reviewer="offline", all_gates=True)
                [job] = enqueue(beside, req).jobs
                out = _pass_output(beside, job.review_job_id)
                assert finalize(beside.store, beside.state_dir, job.review_job_id, out).ok
                beside.close()
        return selection

    monkeypatch.setattr(producer, "select", then_edited)
    res = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    if reviewed:
        assert res.jobs == []
        assert [s.why for s in res.skipped] == ["reviewed since it was selected: fresh"]
    else:
        [job] = res.jobs
        assert _packed_note(ws, job.review_job_id)[0] == edited[0].decode()
    ws.store.close()


@pytest.mark.parametrize(
    ("since", "why"),
    [
        ("deleted", "No such file or directory"),
        ("renamed", "No such file or directory"),
        ("a folder", "Is a directory"),
        ("a FIFO", "not a regular file (a FIFO, socket or device)"),
        ("grown", "over [limits] max_note_bytes (4096); not reviewed"),
    ],
)
def test_an_enqueue_packs_no_note_gone_since_its_selection_read_it(kb, monkeypatch, since, why):
    """The texts the selection read are packed, but the note must still be there: one
    deleted, renamed, made a folder or grown past the size limit between the selection
    and the commit was packed, a review paid for a note that is gone (its FAIL escalated
    to a person, as no sweep reviews the pair again). It is skipped, as it was when
    every note was read again."""
    import os

    import orchestrator.sweeps.producer as producer

    kb.write("reviewq.toml", "[limits]\nmax_note_bytes = 4096\n")
    kb.gate("prose/clarity", ["body"])
    alpha = kb.root / kb.note("alpha")
    kb.note("beta")
    ws = Workspace.open(kb.root)
    real = producer.create_jobs

    def changed_meanwhile(*args, **kwargs):
        if since == "renamed":
            alpha.rename(alpha.with_name("gamma.md"))
        elif since == "grown":
            alpha.write_text(alpha.read_text() + "More words. " * 400)
        else:
            alpha.unlink()
            if since == "a folder":
                alpha.mkdir()
            elif since == "a FIFO":
                os.mkfifo(alpha)
        return real(*args, **kwargs)

    monkeypatch.setattr(producer, "create_jobs", changed_meanwhile)
    res = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    assert [p.note_path for j in res.jobs for p in j.pairs] == ["kb/notes/beta.md"]
    [skipped] = res.skipped
    assert skipped.note_path == "kb/notes/alpha.md" and skipped.why.endswith(why), skipped
    ws.store.close()


def test_an_enqueue_holds_one_map_of_the_open_pairs_at_a_time(kb, monkeypatch):
    """create_jobs reads the open pairs, then again under the write lock; the first map was
    still held then: at twenty-fold (270,000 pairs queued) two maps of ~120 MB each were
    the top of an ``enqueue``'s 660 MB. With nothing left to pack, none is read again."""
    import gc
    import weakref

    from orchestrator.state.store import Store

    class Pairs(dict):  # a dict that can be watched
        pass

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("beta")
    ws = Workspace.open(kb.root)
    req = SweepRequest(name="cli", reviewer="offline", all_gates=True)
    enqueue(
        ws,
        SweepRequest(name="cli", reviewer="offline", all_gates=True, notes=("kb/notes/alpha.md",)),
    )
    real = Store.active_pairs
    alive: list[weakref.ref] = []
    held_at_read: list[int] = []

    def watched(self, partition=None):
        gc.collect()
        held_at_read.append(sum(r() is not None for r in alive))
        pairs = Pairs(real(self, partition))
        alive.append(weakref.ref(pairs))
        return pairs

    monkeypatch.setattr(Store, "active_pairs", watched)
    assert len(enqueue(ws, req).jobs) == 1  # beta's; alpha's is queued
    assert held_at_read == [0, 0]
    held_at_read.clear()
    assert enqueue(ws, req).jobs == []  # every pair queued
    assert held_at_read == [0]
    ws.store.close()


def test_an_enqueue_makes_each_targets_json_once(kb, monkeypatch):
    """The targets went to create_jobs as a list of dicts made all at once beside the
    selection's own, and its counts were taken from a second whole ``to_json`` of the
    selection: at twenty-fold, 270,000 dicts (~50 MB) made twice for four numbers."""
    from orchestrator.review.selector import Target

    kb.gate("prose/clarity", ["body"])
    kb.gate("prose/tone", ["body"])
    for name in ("alpha", "beta", "gamma"):
        kb.note(name)
    ws = Workspace.open(kb.root)
    real = Target.to_json
    made: list[str] = []

    def counted(self):
        made.append(self.note_path)
        return real(self)

    monkeypatch.setattr(Target, "to_json", counted)
    res = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    assert sum(len(j.pairs) for j in res.jobs) == 6 and res.counts["missing-review"] == 6
    assert len(made) == 6
    ws.store.close()


_RSS_AROUND_ENQUEUE = """
import sys
from pathlib import Path
from orchestrator.state.workspace import Workspace
from orchestrator.sweeps.producer import SweepRequest, enqueue

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))

ws = Workspace.open(Path(sys.argv[1]))
ws.catalog()
before = rss()
res = enqueue(ws, SweepRequest(name="nightly", reviewer="offline", all_gates=True))
print(len(res.jobs), rss() - before)
"""


@pytest.mark.skipif(
    __import__("platform").libc_ver()[0] != "glibc", reason="malloc_trim is glibc's"
)
def test_an_enqueue_gives_back_the_memory_its_selection_and_packing_took(kb):
    """What an enqueue reads and packs is freed when it returns, but stayed the process's:
    a sweep's parent, and the control process after a cron sweep's enqueue, held ~290 MB
    after a twenty-fold KB's first night, for the sweep's hour or the control's life."""
    import subprocess
    import sys

    kb.gate("prose/clarity", ["body"])
    body = "Words of a note, é. " * 2000  # 40 KB, held as 80 KB of str
    for i in range(300):
        kb.note(f"n{i:03d}", body)
    text = sum(p.stat().st_size for p in (kb.root / "kb" / "notes").iterdir())
    run = subprocess.run(
        [sys.executable, "-c", _RSS_AROUND_ENQUEUE, str(kb.root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    jobs, grew = map(int, run.stdout.split())
    assert jobs == 300
    # Not given back: ~28 MB more for 12 MB of notes; given back, ~6 MB (the result,
    # SQLite's cache, what lives among the freed pages).
    assert grew < text, (grew, text)


def test_an_enqueue_rolled_back_logs_no_job_it_did_not_make(kb):
    """The run, its jobs and the cron clock are one transaction: create_jobs logged
    job.created inside it, so an enqueue whose clock move (or COMMIT) failed on a full
    disk logged jobs that never were, and the next enqueue made the same ids again."""
    from structlog.testing import capture_logs

    from orchestrator import logs

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    req = SweepRequest(name="nightly", reviewer="offline", all_gates=True)

    def disk_full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    logs.get()  # configured before the capture, not inside it
    with capture_logs() as logged:
        with pytest.raises(OSError):
            enqueue(ws, req, also=disk_full)
        assert ws.store.conn.execute("SELECT count(*) FROM review_jobs").fetchone()[0] == 0
        assert [e["event"] for e in logged if e["event"].startswith(("job.", "sweep."))] == []
        res = enqueue(ws, req)
    created = [e["job_id"] for e in logged if e["event"] == "job.created"]
    assert created == [j.review_job_id for j in res.jobs] and len(created) == 1
    assert [e["event"] for e in logged if e["event"].startswith(("job.", "sweep."))] == [
        "job.created",
        "sweep.enqueued",
    ]
    ws.store.close()


def test_an_enqueue_hands_its_committed_jobs_over_before_it_writes_their_folders(kb):
    """A sweep starts its control and worker once its jobs commit, not after the ~0.2 ms a
    job of folder writing: ``committed`` gets the new ids then, the jobs already visible to
    another process and their folders still due; a rolled-back enqueue hands over nothing."""
    import sqlite3 as sqlite

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("beta")
    ws = Workspace.open(kb.root)
    req = SweepRequest(name="cli", reviewer="offline", all_gates=True)
    seen: list[tuple[list[int], int, list[bool]]] = []

    def committed(ids: list[int]) -> None:
        other = sqlite.connect(ws.state_dir / "state.db")
        try:
            visible = other.execute("SELECT count(*) FROM review_jobs").fetchone()[0]
        finally:
            other.close()
        dirs = ws.store.conn.execute("SELECT job_dir FROM review_jobs ORDER BY id").fetchall()
        seen.append((list(ids), visible, [(ws.state_dir / d[0]).exists() for d in dirs]))

    def disk_full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        enqueue(ws, req, also=disk_full, committed=committed)
    assert seen == []
    res = enqueue(ws, req, committed=committed)
    ids = [j.review_job_id for j in res.jobs]
    assert len(ids) == 2 and seen == [(ids, 2, [False, False])]
    for (job_dir,) in ws.store.conn.execute("SELECT job_dir FROM review_jobs"):
        assert (ws.state_dir / job_dir / "MANIFEST.json").is_file()  # once it returns
    ws.store.close()


def test_a_tick_leaves_the_folders_an_enqueue_is_writing_to_the_enqueue(kb, monkeypatch):
    """A sweep's control starts at the commit, while the sweep still writes its jobs'
    folders: the control's tick wrote each of them again (and said each "written late")."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("beta")
    ws = Workspace.open(kb.root)
    other = Workspace.open(kb.root)  # the control process's own connection
    control = Control(other, send_review=lambda m: None, hooks=FollowUp(other))
    real_mkdir = pathlib.Path.mkdir
    by_the_tick: list[int] = []

    def mkdir(self, *args, **kwargs):
        if self.name.startswith("review-job-") and not by_the_tick:
            by_the_tick.append(control.write_due_files())
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    jobs = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
    monkeypatch.setattr(pathlib.Path, "mkdir", real_mkdir)
    assert len(jobs) == 2 and by_the_tick == [0]
    for job in jobs:
        assert (kb.root / job.prompt_path).with_name("MANIFEST.json").is_file()
    assert ws.store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 0
    assert control.write_due_files() == 0
    ws.store.close()
    other.store.close()


@pytest.mark.parametrize("undone", ["transaction", "savepoint"])
def test_a_job_rolled_back_leaves_no_prompt_to_the_job_given_its_id(kb, undone):
    """An enqueue rolled back (a sequential sweep's next bundle, in an outcome's
    transaction that failed) must leave nothing to the next commit: the next job made
    takes the same id, and a pass that kept the rolled-back job's ids (K52) rendered its
    prompt.md with the rolled-back job's notes."""

    class Undone(Exception):
        pass

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("beta")
    ws = Workspace.open(kb.root)

    def made(note: str) -> int:
        req = SweepRequest(name="cli", all_gates=True, notes=(f"kb/notes/{note}.md",))
        (job,) = enqueue(ws, req).jobs
        return job.review_job_id

    def rolled_back() -> int:
        with pytest.raises(Undone), ws.store.write():
            made_id = made("alpha")
            raise Undone
        return made_id

    if undone == "transaction":
        first = rolled_back()
        second = made("beta")
    else:
        with ws.store.write():
            first = rolled_back()
            second = made("beta")
    assert first == second  # SQLite gives the id again
    (job_dir,) = ws.store.conn.execute(
        "SELECT job_dir FROM review_jobs WHERE id = ?", (second,)
    ).fetchone()
    prompt = (ws.state_dir / job_dir / "prompt.md").read_text()
    assert "kb/notes/beta.md" in prompt and "kb/notes/alpha.md" not in prompt
    ws.store.close()


def test_the_jobs_one_commit_decided_have_their_due_rows_settled_together(kb):
    """Each job's folder is written by its own after-commit callback (a rollback drops
    it: K52), and their due rows are settled in one transaction once they all ran, not
    one a job (stop 33); a savepoint rolled back leaves nothing to write or settle."""
    from orchestrator.state.files import write_job_files_after_commit

    class Undone(Exception):
        pass

    kb.gate("prose/clarity", ["body"])
    for note in ("alpha", "beta", "gamma"):
        kb.note(note)
    ws = Workspace.open(kb.root)
    req = SweepRequest(
        name="cli",
        all_gates=True,
        notes=tuple(f"kb/notes/{n}.md" for n in ("alpha", "beta", "gamma")),
    )
    ids = [job.review_job_id for job in enqueue(ws, req).jobs]

    def decide(job_id: int, what: str) -> None:
        ws.store.conn.execute(
            "UPDATE review_jobs SET failure_reasons = ? WHERE id = ?",
            (json.dumps([what]), job_id),
        )
        write_job_files_after_commit(ws.store, ws.state_dir, job_id)

    before = ws.store.transactions
    with ws.store.write():
        for job_id in ids:
            decide(job_id, f"decided {job_id}")
        with pytest.raises(Undone), ws.store.write():
            decide(ids[0], "undone")
            raise Undone
    assert ws.store.transactions - before == 2  # the decisions', then one settle
    assert ws.store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 0
    for job_id in ids:
        (job_dir,) = ws.store.conn.execute(
            "SELECT job_dir FROM review_jobs WHERE id = ?", (job_id,)
        ).fetchone()
        manifest = json.loads((ws.state_dir / job_dir / "MANIFEST.json").read_text())
        assert manifest["failure_reasons"] == [f"decided {job_id}"]
    ws.store.close()


def test_an_escalation_report_a_person_saved_in_another_encoding_is_still_listed(kb, run_cli):

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    esc_id = _open_escalation(ws, "three rejections", ["- major: unclear"], "say it plainly")
    report = ws.state_dir / f"escalations/escalation-{esc_id}.md"
    ws.store.close()
    report.write_bytes(b"# Gate review\nNotes by a person: caf\xe9\nmore\n")  # Latin-1
    res = run_cli("escalations")
    assert res.exit_code == 0 and f"escalation {esc_id}:" in res.stdout, res.stderr
    res = run_cli("report", "--json")
    assert res.exit_code == 0, res.stderr


# --- an attempt's start, from its heartbeat or from its outcome ----------------------------------


def _outcome(ws, msg: dict, **extra) -> dict:
    return {
        "v": 4,
        "job_id": msg["job_id"],
        "attempt": msg["attempt"],
        "classification": "output",
        "runner": "offline",
        "exit_code": 0,
        "started_at": "2030-01-02T03:04:05.678Z",
        "ended_at": "2030-01-02T03:04:05.900Z",
        "duration_s": 0.2,
        "exited_at": 1893553445.9,
        "output": _pass_output(ws, msg["job_id"]),
        "worker": "far:42",
        "host": "far",
        "files": {},
        **extra,
    }


def _story(ws, job_id: int) -> list[tuple[str, str | None]]:
    lines = (ws.state_dir / "logs" / "reviewq.jsonl").read_text().splitlines()
    return [
        (e["event"], e.get("host"))
        for e in map(json.loads, lines)
        if e.get("job_id") == job_id and e["event"].startswith(("attempt.", "job.finalized"))
    ]


def _dispatched(kb, notes: list[str], **control_kw) -> tuple[Workspace, Control, list[dict]]:
    """One gate, these notes, their jobs dispatched by a control that logs to the state
    folder (``control_kw``: more of the control's arguments, its clock); the review
    messages it sent."""
    from orchestrator import logs

    kb.gate("prose/clarity", ["body"])
    for name in notes:
        kb.note(name)
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws), **control_kw)
    assert control.dispatch() == len(notes)
    return ws, control, sent


def test_an_outcome_that_came_without_a_heartbeat_records_and_logs_the_start(kb, run_cli):
    ws, control, sent = _dispatched(kb, ["alpha", "beta", "gamma"])
    quick, slow, together = sent
    # The slow attempt's worker sent the "launched" heartbeat; the quick one's did not.
    beat = {"v": 4, "job_id": slow["job_id"], "attempt": 1, "worker": "near:7", "host": "near"}
    control.on_messages([{**beat, "launched": True}], [])
    control.on_messages([], [_outcome(ws, quick), _outcome(ws, slow, worker="near:7", host="near")])
    rows = {
        r[0]: tuple(r[1:])
        for r in ws.store.conn.execute("SELECT job_id, outcome, worker, launched_at FROM attempts")
    }
    # The quick one's start is the worker's, from its outcome; the slow one's its heartbeat's.
    assert rows[quick["job_id"]] == ("finalized", "far:42", "2030-01-02T03:04:05.678Z")
    assert rows[slow["job_id"]][:2] == ("finalized", "near:7")
    assert rows[slow["job_id"]][2] != "2030-01-02T03:04:05.678Z"
    story = [
        ("attempt.dispatched", None),
        ("attempt.started", "far"),
        ("attempt.ended", "far"),
        ("job.finalized", None),
    ]
    assert _story(ws, quick["job_id"]) == story
    assert _story(ws, slow["job_id"]) == [(e, h and "near") for e, h in story]  # told once
    # A heartbeat that waited in the queue with its outcome: the same story, in order.
    far = {"worker": "far:42", "host": "far"}
    control.on_messages(
        [{**beat, **far, "job_id": together["job_id"], "launched": True}],
        [_outcome(ws, together)],
    )
    assert _story(ws, together["job_id"]) == story
    res = run_cli("logs", "--job", str(quick["job_id"]))
    assert res.stdout.split()[0].endswith("Z")  # UTC, and said so
    told = [line.split()[2] for line in res.stdout.splitlines()]
    assert told == [
        "job.created",
        "attempt.dispatched",
        "attempt.started",
        "attempt.ended",
        "job.finalized",
    ]
    assert "host=far" in res.stdout.splitlines()[2]
    ws.close()


def test_job_n_names_the_worker_each_attempt_ran_on(kb, run_cli):
    """With workers on several machines, `reviewq job N` listed each attempt's outcome and
    exit code but not where it ran: a no-output on the one machine whose CLI is not logged
    in read like any other, and only `logs --job N` told the machines apart."""
    ws, control, sent = _dispatched(kb, ["alpha"])
    control.on_messages([], [_outcome(ws, sent[0], classification="no-output", output=None)])
    assert control.dispatch() == 1
    control.on_messages([], [_outcome(ws, sent[1], worker="near:7", host="near")])
    shown = [
        x for x in run_cli("job", str(sent[0]["job_id"])).stdout.splitlines() if "attempt" in x
    ]
    # In words: --json has the outcome as CONTRACT names it.
    assert shown[0].startswith("  attempt 1: wrote no output, ") and shown[0].endswith(" on far:42")
    assert shown[-1].startswith("  attempt 2: finished, ") and shown[-1].endswith(" on near:7")
    ws.close()


def test_an_agent_that_never_started_is_not_logged_as_started(kb):
    ws, control, sent = _dispatched(kb, ["alpha"])
    # The worker could not start the program: no launch, so no exited_at.
    failed = _outcome(ws, sent[0], classification="launch-failure", output=None, exited_at=0.0)
    control.on_messages([], [failed])
    assert [e for e, _ in _story(ws, sent[0]["job_id"])] == [
        "attempt.dispatched",
        "attempt.ended",
        "attempt.launch_failed",
    ]
    # Never launched, but answered by a worker, which is named (S25): the machine to mend.
    assert ws.store.conn.execute("SELECT worker, launched_at FROM attempts").fetchone()[:] == (
        "far:42",
        None,
    )
    ws.close()


def test_a_launch_or_reviewer_failure_is_logged_with_its_attempt(kb):
    """Every line about an attempt names its job and attempt: these named the job alone."""
    ws, control, sent = _dispatched(kb, ["alpha", "beta"])
    control.on_messages(
        [],
        [
            _outcome(ws, sent[0], classification="launch-failure", output=None),
            _outcome(ws, sent[1], classification="reviewer-failure", output=None),
        ],
    )
    lines = _events(ws, "attempt.launch_failed") + _events(ws, "attempt.reviewer_failed")
    assert [(e["job_id"], e.get("attempt")) for e in lines] == [
        (m["job_id"], m["attempt"]) for m in sent
    ]
    ws.close()


_OOM = (
    "memory: the out-of-memory killer of the worker's memory cgroup killed the agent "
    "(raise its memory.max, or lower the concurrency); no output"
)


_REFUSED = (
    "pids: the worker's pids cgroup refused the agent a process at its pids.max (raise it, "
    "or lower the concurrency); exited 1: BlockingIOError: [Errno 11] Resource temporarily "
    "unavailable"
)


def _killed_by_memory(ws, control, msg: dict, reason: str = _OOM, worker="far:42") -> None:
    control.on_messages(
        [],
        [
            _outcome(
                ws,
                msg,
                classification="reviewer-failure",
                output=None,
                exit_code=-9 if reason.startswith("memory: ") else 1,
                reasons=[reason],
                worker=worker,
                host=worker.partition(":")[0],
            )
        ],
    )


@pytest.mark.parametrize(
    ("reason", "said"), [(_OOM, "more memory than"), (_REFUSED, "more processes than")]
)
def test_a_job_its_agent_always_dies_of_the_memory_limit_fails_and_says_so(kb, reason, said):
    """L43 made an agent the worker's memory cgroup killed the machine's failure: the job
    was queued again, never counted. A job whose agent needs more than the limit every
    time (a huge note) was then tried for good, every backoff, an agent's run and an OOM
    kill each time, while the other jobs answered; no job failed, no person was told.
    Killed twice while another job answered, its next kills are counted as its own; the
    same of a job whose agent is refused processes at the pids limit every time."""
    from datetime import datetime

    clock = [datetime(2030, 1, 2, 3, 0).astimezone()]
    ws, control, sent = _dispatched(kb, ["alpha"], now=lambda: clock[0])
    [huge] = sent
    answer = _answers(kb, ws, control, sent)  # the worker runs other jobs between

    def kill(msg: dict) -> None:
        _killed_by_memory(ws, control, msg, reason)

    kill(huge)
    answer()
    status = _until_settled(ws, control, sent, huge["job_id"], clock, between=answer, end=kill)
    assert status == "failed", status
    outcomes = _crash_outcomes(ws, huge["job_id"])
    assert outcomes == ["reviewer-failure"] * 2 + ["no-output"] * 3, outcomes
    [failed] = _events(ws, "job.failed")
    assert failed["job_id"] == huge["job_id"]
    assert said in failed["reasons"][0], failed
    ws.close()


@pytest.mark.parametrize("reason", [_OOM, _REFUSED])
def test_a_job_killed_by_one_worker_s_limit_where_another_answers_stays_the_worker_s(kb, reason):
    """A worker whose memory (or pids) limit no agent fits in, beside one that answers:
    L45 counted a job's kills as its own once any job answered, of any profile on any
    worker, so each job the small worker took three times more failed, "may need more
    memory than the worker has", for that worker's limit alone."""
    from datetime import datetime

    clock = [datetime(2030, 1, 2, 3, 0).astimezone()]
    ws, control, sent = _dispatched(kb, ["alpha"], now=lambda: clock[0])
    [huge] = sent
    answer = _answers(kb, ws, control, sent, worker="big:43")

    def kill(msg: dict) -> None:
        _killed_by_memory(ws, control, msg, reason, worker="small:42")

    kill(huge)
    answer()
    settled = _until_settled(ws, control, sent, huge["job_id"], clock, between=answer, end=kill)
    assert settled == "queued"
    assert set(_crash_outcomes(ws, huge["job_id"])) == {"reviewer-failure"}
    assert not _events(ws, "job.failed")
    ws.close()


_CRASHED = "exited 139 after 0.1 s with no turns: Segmentation fault (core dumped)"


def _crashed(ws, control, msg: dict, worker: str = "far:42") -> None:
    """The outcome a worker sends for an agent that exited at once without a turn (a
    `command` reviewer cannot say it sent its prompt): a launch failure."""
    control.on_messages(
        [],
        [
            _outcome(
                ws,
                msg,
                classification="launch-failure",
                output=None,
                exit_code=139,
                reasons=[_CRASHED],
                worker=worker,
                host=worker.partition(":")[0],
            )
        ],
    )


def _until_settled(
    ws, control, sent, job_id, clock, worker="far:42", between=None, end=None
) -> str:
    """Crash ``job_id``'s agent (or ``end`` its attempt's message) at each dispatch
    (bounded) until the job is no longer queued, calling ``between`` after each (another
    job's answer); its status."""
    from datetime import timedelta

    crashed = _latest(sent, job_id)["attempt"]
    for _ in range(12):  # bounded: before, every one of these queued the job again
        status = ws.store.conn.execute(
            "SELECT status FROM review_jobs WHERE id = ?", (job_id,)
        ).fetchone()[0]
        if status not in ("queued", "running"):  # running: dispatched with another job's
            return status
        clock[0] += timedelta(hours=1)  # past the backoff and any pause
        control.dispatch()  # it may have gone with another job's, right after a no-output
        msg = _latest(sent, job_id)
        assert msg["attempt"] > crashed, msg
        (end or (lambda m: _crashed(ws, control, m, worker)))(msg)
        crashed = msg["attempt"]
        if between is not None:
            between()
    return status


def _latest(sent: list[dict], job_id: int) -> dict:
    return [m for m in sent if m["job_id"] == job_id][-1]


def _answers(kb, ws, control, sent, worker="far:42"):
    """A call that makes a new job (a note added, a sweep), dispatches it and has
    ``worker`` answer it: an agent of the profile launched after the crashes before it."""
    names = iter(range(100))

    def answer() -> None:
        kb.note(f"answered-{next(names)}")
        (job,) = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
        control.dispatch()
        msg = _latest(sent, job.review_job_id)
        host = worker.partition(":")[0]
        control.on_messages([], [_outcome(ws, msg, worker=worker, host=host)])

    return answer


def _in_flight(ws, control, msgs: list[dict]):
    """A call that has the next of ``msgs`` (attempts dispatched before) answer."""
    return lambda: control.on_messages([], [_outcome(ws, msgs.pop(0))]) if msgs else None


def _crash_outcomes(ws, job_id: int) -> list[str]:
    return [
        r[0]
        for r in ws.store.conn.execute(
            "SELECT outcome FROM attempts WHERE job_id = ? ORDER BY attempt", (job_id,)
        )
    ]


def test_a_job_its_agent_always_crashes_on_fails_and_says_so(kb):
    """A `command` reviewer that crashed at once on one note (a segfault in its first
    0.1 s) was a launch failure each time: the job was tried again all night with a
    backoff, never failed nor named, and five in a row paused the profile for every
    other job. Crashed twice on a machine where the profile's agents answer other jobs,
    its next crashes there are counted as its own, as the memory limit's kills are."""
    from datetime import datetime

    clock = [datetime(2030, 1, 2, 3, 0).astimezone()]
    ws, control, sent = _dispatched(kb, ["crashes"], now=lambda: clock[0])
    [crashes] = sent
    answer = _answers(kb, ws, control, sent)  # the profile answers on that worker
    _crashed(ws, control, crashes)
    answer()
    assert _until_settled(ws, control, sent, crashes["job_id"], clock, between=answer) == "failed"
    outcomes = _crash_outcomes(ws, crashes["job_id"])
    assert outcomes == ["launch-failure"] * 2 + ["no-output"] * 3, outcomes
    [failed] = _events(ws, "job.failed")
    assert failed["job_id"] == crashes["job_id"]
    assert failed["reasons"][0].startswith(_CRASHED), failed
    assert (
        "5 times on worker far:42, where other jobs of offline answered since"
        in failed["reasons"][0]
    ), failed
    assert not _events(ws, "reviewer.paused")
    ws.close()


def test_a_job_that_crashes_only_where_no_job_answers_stays_the_machine_s(kb):
    """The same crash on a machine where no job of the profile answers (a CLI broken on
    that one; the others answer elsewhere) says nothing of the job: it waits, and that
    machine's failures pause the profile as before."""
    from datetime import datetime

    clock = [datetime(2030, 1, 2, 3, 0).astimezone()]
    ws, control, sent = _dispatched(kb, ["crashes", "fine"], now=lambda: clock[0])
    crashes, fine = sent
    _crashed(ws, control, crashes, worker="broken:7")
    control.on_messages([], [_outcome(ws, fine)])  # on far
    assert _until_settled(ws, control, sent, crashes["job_id"], clock, "broken:7") == "queued"
    assert not _events(ws, "job.failed")
    assert _events(ws, "reviewer.paused")
    ws.close()


def test_a_job_that_crashed_once_before_an_outage_is_not_failed_by_the_outage(kb):
    """A job whose agent crashed once early in the night (a flag the profile's CLI refused
    until the operator mended it; the previous night), other jobs answering after, then
    the CLI's login expired: every agent exits at once without a turn and none answers.
    Counted from that first crash, with answers since, its next two crashes made it the
    job's own: three `no-output`s failed it for the machine's fault, and each reset the
    profile's run of launch failures, so the profile did not pause for the outage."""
    from datetime import datetime

    clock = [datetime(2030, 1, 2, 3, 0).astimezone()]
    ws, control, sent = _dispatched(kb, ["crashes", "fine"], now=lambda: clock[0])
    crashes, fine = sent
    _crashed(ws, control, crashes)
    control.on_messages([], [_outcome(ws, fine)])  # answered before the login expired
    assert _until_settled(ws, control, sent, crashes["job_id"], clock) == "queued"
    assert set(_crash_outcomes(ws, crashes["job_id"])) == {"launch-failure"}
    assert not _events(ws, "job.failed")
    assert _events(ws, "reviewer.paused")
    ws.close()


def _crashes_stay_the_machine_s(ws, control, sent, crashes, clock, answer) -> None:
    """``crashes``' agent crashes at each try, ``answer`` answering another job between:
    the job waits, its every crash a launch failure, and nothing fails."""
    _crashed(ws, control, crashes)
    answer()
    assert _until_settled(ws, control, sent, crashes["job_id"], clock, between=answer) == "queued"
    assert set(_crash_outcomes(ws, crashes["job_id"])) == {"launch-failure"}
    assert not _events(ws, "job.failed")
    ws.close()


def test_answers_of_agents_launched_before_a_job_s_crash_do_not_make_it_its_own(kb):
    """The CLI broke under a running worker (updated, its login expired) while long
    reviews it had launched before ran on and answered one after another: each answer
    recorded after the job's last crash made its next crash the job's own, and three
    `no-output`s failed it for the machine's fault. An agent launched before the crash
    says nothing of the CLI as it is now."""
    from datetime import datetime

    clock = [datetime(2030, 1, 2, 3, 0).astimezone()]
    notes = ["crashes", *(f"long-{i}" for i in range(7))]  # the profile's 8 slots
    ws, control, sent = _dispatched(kb, notes, now=lambda: clock[0])
    crashes, *running = sent
    _crashes_stay_the_machine_s(ws, control, sent, crashes, clock, _in_flight(ws, control, running))


def test_a_job_crashing_on_a_worker_whose_neighbour_answers_stays_the_worker_s(kb):
    """Two workers on one host, one started with a PATH (or HOME) whose CLI crashes at
    once: the other's answers on that host made each job the broken one took three
    times a job of its own, failed for a worker's fault."""
    from datetime import datetime

    clock = [datetime(2030, 1, 2, 3, 0).astimezone()]
    ws, control, sent = _dispatched(kb, ["crashes"], now=lambda: clock[0])
    crashes = sent[0]
    answer = _answers(kb, ws, control, sent, worker="far:43")
    _crashes_stay_the_machine_s(ws, control, sent, crashes, clock, answer)


def test_jobs_all_killed_by_the_memory_limit_wait_with_the_profile_paused(kb):
    """A worker whose memory limit no agent fits in: every job's agent killed, none
    answered. That is the machine's failure, never a verdict on the notes: no job fails,
    the profile pauses (L45 counts a job's kills against it only while others answer)."""
    from datetime import datetime, timedelta

    clock = [datetime(2030, 1, 2, 3, 0).astimezone()]
    ws, control, sent = _dispatched(kb, ["alpha", "beta"], now=lambda: clock[0])
    for msg in sent:
        _killed_by_memory(ws, control, msg)
    for _ in range(6):
        clock[0] += timedelta(hours=1)
        n = control.dispatch()
        for msg in sent[-n:] if n else []:
            _killed_by_memory(ws, control, msg)
    statuses = {r[0] for r in ws.store.conn.execute("SELECT status FROM review_jobs")}
    assert statuses == {"queued"}, statuses
    assert not _events(ws, "job.failed")
    assert _events(ws, "reviewer.paused")
    ws.close()


@pytest.mark.parametrize("notes", [["huge"], ["alpha", "beta"]])
def test_a_pause_over_the_memory_limit_names_the_jobs_it_killed(kb, run_cli, notes):
    """A lone job killed by the memory limit (or every job: a limit no agent fits in)
    never fails (L45) and pauses its profile, again after each pause. `reviewq status`
    said the pause's reason, the limit's words only: nothing named the job, its note or
    what to do about a job too big for the worker, so a person at 7 a.m. had to read the
    log's `attempt.reviewer_failed` lines to learn which note it was."""
    from datetime import datetime, timedelta

    clock = [datetime(2030, 1, 2, 3, 0).astimezone()]
    ws, control, sent = _dispatched(kb, notes, now=lambda: clock[0])
    for msg in sent:
        _killed_by_memory(ws, control, msg)
    for _ in range(8):  # bounded: until the profile pauses
        if _events(ws, "reviewer.paused"):
            break
        clock[0] += timedelta(minutes=10)  # past the backoff
        n = control.dispatch()
        for msg in sent[-n:] if n else []:
            _killed_by_memory(ws, control, msg)
    [paused] = _events(ws, "reviewer.paused")
    jobs = {m["job_id"]: f"kb/notes/{name}.md" for m, name in zip(sent, notes, strict=False)}
    out = run_cli("status").stdout
    for job_id, note in jobs.items():
        assert f"job {job_id} ({note}," in paused["reason"], paused
        assert f"job {job_id} ({note}," in out, out
        assert f"reviewq job {job_id}" in out, out
    assert "memory.max" in out, out
    # No job of the profile ever answered: "since reviewer offline last answered" named
    # an answer that never came.
    assert "reviewer offline has not answered yet, the limit ended job" in out, out
    assert "last answered" not in out, out
    ws.close()


def test_a_workers_notices_are_read_as_data(kb):
    """An outcome's ``notices`` (S7) come from a worker, maybe on another machine. One that
    was not a list of notices (a number; an event that is a list) made the control's
    handling of the outcome raise: the outcome was never kept, and the attempt, its agent's
    run done, was lost a lease later. And each notice of a known event, of any size, was a
    line of the control's log: a worker could write it a thousand times over."""
    ws, control, sent = _dispatched(kb, ["alpha", "beta", "gamma"])
    stale = {"event": "attempt.kb_stale", "note_path": "kb/notes/alpha.md", "reason": "x" * 10**5}
    control.on_messages([], [_outcome(ws, sent[0], notices=7)])
    junk = [{"event": ["attempt.kb_stale"]}, "attempt.kb_stale", None, {"event": "job.failed"}]
    control.on_messages([], [_outcome(ws, sent[1], notices=junk)])
    control.on_messages([], [_outcome(ws, sent[2], notices=[stale] * 1000)])
    kept = [r[0] for r in ws.store.conn.execute("SELECT outcome FROM attempts ORDER BY job_id")]
    assert kept == ["finalized"] * 3
    [said] = _events(ws, "attempt.kb_stale")  # once, bounded, from the one good notice
    assert said["job_id"] == sent[2]["job_id"] and said["host"] == "far"
    assert said["note_path"] == "kb/notes/alpha.md" and 100 < len(said["reason"]) <= 1000
    assert not _events(ws, "job.failed")
    ws.close()


def test_a_notice_of_a_batch_rolled_back_is_said_once_it_is_kept(kb):
    """The control said a worker's notice (S7) as it read the outcome, inside the batch's
    transaction: a batch that then failed (a locked state.db, another outcome it could
    not handle) was taken again one by one, and the notice was said twice, the first time
    of an outcome not yet kept."""
    ws, control, sent = _dispatched(kb, ["alpha", "beta"])
    stale = {"event": "attempt.kb_stale", "note_path": "kb/notes/alpha.md", "reason": "stale"}
    good = _outcome(ws, sent[0], notices=[stale])
    bad = {k: v for k, v in _outcome(ws, sent[1]).items() if k != "classification"}
    with pytest.raises(KeyError):
        control.on_messages([], [good, bad])
    assert not _events(ws, "attempt.kb_stale")
    control.on_messages([], [good])  # as _one_by_one takes it again
    assert len(_events(ws, "attempt.kb_stale")) == 1
    ws.close()


def test_the_reaper_gives_a_silent_attempt_lease_and_timeout_and_a_running_one_a_lease(kb):
    # An attempt no worker has announced stays 'dispatched' (its message may wait in the
    # queue behind others): the reaper gives it lease + timeout, a running one a lease.
    from datetime import UTC, datetime, timedelta

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("beta")
    kb.write("reviewq.toml", "[queue]\nlease_seconds = 10\n")
    ws = Workspace.open(kb.root)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    t0 = datetime.now(UTC)
    clock = [t0]
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, now=lambda: clock[0], hooks=FollowUp(ws))
    assert control.dispatch() == 2
    silent, beating = sent
    beat = {"v": 4, "job_id": beating["job_id"], "attempt": 1, "worker": "w:1", "host": "w"}
    clock[0] = t0 + timedelta(seconds=1)
    control.on_messages([{**beat, "launched": True}], [])
    timeout = ws.settings.reviewer("offline").timeout  # 120 s, far over the lease

    def lost() -> dict[int, str]:
        rows = ws.store.conn.execute("SELECT job_id, reasons FROM attempts WHERE outcome = 'lost'")
        return {r[0]: json.loads(r[1])[0] for r in rows}

    clock[0] = t0 + timedelta(seconds=10)
    assert control.reap() == 0
    clock[0] = t0 + timedelta(seconds=12)  # the heartbeat is 11 s old: over the lease
    assert control.reap() == 1
    assert lost() == {beating["job_id"]: "no heartbeat for 10 s"}
    clock[0] = t0 + timedelta(seconds=10 + timeout - 1)
    assert control.reap() == 0
    clock[0] = t0 + timedelta(seconds=10 + timeout + 2)
    assert control.reap() == 1
    assert lost()[silent["job_id"]] == "never picked up by a worker"
    ws.close()


@pytest.mark.parametrize("stepped", [False, True], ids=["suspended", "wall-clock-stepped"])
def test_the_reaper_back_from_a_suspend_or_a_clock_step_waits_a_lease_for_the_agents(kb, stepped):
    """The control's machine suspended for an hour with its worker and agents (a laptop's
    lid, a VM paused), or its wall clock stepped forward by NTP: the reaper's first look
    back found every heartbeat an hour old and gave up each attempt at once, before a
    resumed agent could beat, then ran its job again (paid twice) and stopped the agent.
    A silence is counted from the reaper's return; an agent that does not beat within a
    lease of it is lost as before."""
    from datetime import UTC, datetime

    lease = 120.0
    t0 = datetime.now(UTC)
    wall, boot = [t0.timestamp()], [1000.0]
    ws, control, sent = _dispatched(
        kb,
        ["alpha", "beta", "gamma"],
        now=lambda: datetime.fromtimestamp(wall[0], UTC),
        clocks=lambda: (wall[0], boot[0]),
    )

    def beat(msg: dict) -> None:
        control.on_messages(
            [{"v": 4, "job_id": msg["job_id"], "attempt": 1, "worker": "w:1", "host": "w"}], []
        )

    def after(seconds: float) -> None:
        wall[0] += seconds
        boot[0] += 0 if stepped and seconds > lease else seconds

    for msg in sent[:2]:  # gamma's message waits on the queue for a free agent
        beat(msg)
    after(30)
    assert control.reap() == 0
    after(3600)  # suspended, or the wall clock stepped forward by an hour
    assert control.reap() == 0
    (resumed,) = _events(ws, "control.resumed")
    assert resumed["away_s"] == 3600 and resumed["stepped_s"] == (3600 if stepped else 0)
    after(lease / 4)
    beat(sent[0])  # alpha's agent resumed and beats; beta's worker is gone for good
    assert control.reap() == 0
    after(lease * 3 / 4 + 1)  # a lease and a second since the return: alpha beat since
    # gamma's message expired over the suspend (the worker drops it): it runs again a
    # lease after the return, not a reviewer's timeout more.
    assert control.reap() == 2
    rows = ws.store.conn.execute("SELECT job_id, reasons FROM attempts WHERE outcome = 'lost'")
    assert {r[0]: json.loads(r[1]) for r in rows} == {
        sent[1]["job_id"]: ["no heartbeat for 120 s"],
        sent[2]["job_id"]: ["never picked up by a worker"],
    }
    ws.close()


def test_a_control_slow_at_every_tick_still_gives_up_a_dead_workers_attempt(kb):
    """A control starved at every tick (a heavy machine, state.db locked for minutes):
    each look came more than a tick and half a lease after the last, each was taken for a
    return from a suspend and put the reaper's verdicts off a lease from it, so an attempt
    whose worker had died was never given up and its job never ran again. A live agent's
    beats wait on the queue over a slow tick and are applied before the reaper judges
    (K16): a grace ends with a look before another is given."""
    from datetime import UTC, datetime

    lease, tick = 120.0, 60.0
    wall, boot = [datetime.now(UTC).timestamp()], [1000.0]
    ws, control, sent = _dispatched(
        kb,
        ["alpha"],
        now=lambda: datetime.fromtimestamp(wall[0], UTC),
        clocks=lambda: (wall[0], boot[0]),
    )
    control.on_messages(
        [{"v": 4, "job_id": sent[0]["job_id"], "attempt": 1, "worker": "w:1", "host": "w"}], []
    )
    assert control.reap() == 0  # the worker dies after its first beat
    reaped = 0
    for _ in range(4):
        wall[0] += tick + lease / 2 + 10
        boot[0] += tick + lease / 2 + 10
        reaped += control.reap()
    assert reaped == 1
    assert len(_events(ws, "control.resumed")) >= 1
    ws.close()


def test_a_lost_attempt_names_the_worker_and_host_it_was_lost_on(kb):
    """A worker machine killed, or cut off, shows on the control's side first as
    `attempt.lost`: it named the job alone, and which of several machines went silent
    was in no line of the control's log."""
    from datetime import UTC, datetime, timedelta

    t0 = datetime.now(UTC)
    clock = [t0]
    ws, control, sent = _dispatched(kb, ["alpha"], now=lambda: clock[0])
    beat = {"v": 4, "job_id": sent[0]["job_id"], "attempt": 1, "worker": "far:42", "host": "far"}
    control.on_messages([{**beat, "launched": True}], [])
    clock[0] = t0 + timedelta(seconds=ws.settings.queue.lease_seconds + 2)
    assert control.reap() == 1
    (line,) = _events(ws, "attempt.lost")
    assert (line["worker"], line["host"]) == ("far:42", "far")
    ws.close()


def test_an_attempt_whose_message_left_the_queue_unannounced_is_lost_a_lease_later(kb):
    """A worker says nothing as it launches an agent (its first beat comes a second
    later). One killed before that, or a message the queue lost, left the attempt
    'dispatched' for lease + timeout (here 130 s): the reaper now asks the review queue,
    and an attempt whose message is gone is the worker's, lost a lease after it noticed.
    One whose message is back (a stopping worker's) waits again; past its message's
    expiry a worker drops it unrun, and it is given up as never picked up, as before."""
    from datetime import UTC, datetime, timedelta

    kb.gate("prose/clarity", ["body"])
    for name in ("alpha", "beta", "gamma", "delta"):
        kb.note(name)
    kb.write("reviewq.toml", "[queue]\nlease_seconds = 10\n")  # the offline timeout: 120 s
    ws = Workspace.open(kb.root)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    t0 = datetime.now(UTC)
    clock = [t0]
    sent: list[dict] = []
    asked: list[set] = []
    answer: list[set | None] = [set()]

    def on_queue(wanted: set) -> set | None:
        asked.append(set(wanted))
        return None if answer[0] is None else answer[0] & wanted

    control = Control(
        ws,
        send_review=sent.append,
        now=lambda: clock[0],
        hooks=FollowUp(ws),
        on_review_queue=on_queue,
    )
    assert control.dispatch() == 4
    waiting, taken, back, late = ((m["job_id"], m["attempt"]) for m in sent)

    def at(seconds: float) -> int:
        clock[0] = t0 + timedelta(seconds=seconds)
        return control.reap()

    def lost() -> dict[int, str]:
        rows = ws.store.conn.execute("SELECT job_id, reasons FROM attempts WHERE outcome = 'lost'")
        return {r[0]: json.loads(r[1])[0] for r in rows}

    def taken_at() -> dict[int, bool]:
        rows = ws.store.conn.execute("SELECT job_id, taken_at IS NOT NULL FROM attempts")
        return {r[0]: bool(r[1]) for r in rows}

    assert at(4) == 0 and asked == []  # under half a lease: not asked
    answer[0] = None  # the queue cannot be read: nothing is known, nothing marked
    assert at(6) == 0 and len(asked) == 1 and not any(taken_at().values())
    answer[0] = {waiting, late}
    assert at(7) == 0
    assert taken_at() == {waiting[0]: False, taken[0]: True, back[0]: True, late[0]: False}
    answer[0] = {waiting, late, back}  # put back by a stopping worker
    assert at(8) == 0 and not taken_at()[back[0]]
    assert at(16) == 0  # 9 s after it was found taken
    assert at(18) == 1 and lost() == {taken[0]: "no heartbeat for 10 s"}
    launched = ws.store.conn.execute("SELECT launched_at FROM attempts WHERE job_id = ?", taken[:1])
    assert launched.fetchone()[0] is None  # no launch known: not counted against the job
    answer[0] = {waiting}
    calls = len(asked)
    assert at(126) == 0 and len(asked) == calls  # past the messages' expiry: not asked
    assert at(131) == 3
    assert {lost()[k[0]] for k in (waiting, back, late)} == {"never picked up by a worker"}
    ws.close()


def test_a_worker_waiting_for_an_agent_slot_keeps_its_attempt_dispatched_and_alive(kb):
    """A worker that took a message and waits for a free agent slot says so: the attempt
    stays dispatched (no agent runs), taken, and lives a lease from the last such beat."""
    from datetime import UTC, datetime, timedelta

    ws, control, sent = _dispatched(kb, ["alpha"])
    t0 = datetime.now(UTC)
    clock = [t0]
    control.now = lambda: clock[0]
    lease = ws.settings.queue.lease_seconds
    beat = {"v": 4, "job_id": 1, "attempt": 1, "worker": "w:1", "host": "w", "launched": False}
    for minute in range(1, 4):
        clock[0] = t0 + timedelta(seconds=minute * lease * 0.9)
        control.on_messages([{**beat, "waiting": True}], [])
        assert control.reap() == 0
    row = ws.store.conn.execute(
        "SELECT outcome, worker, launched_at, taken_at IS NOT NULL FROM attempts"
    ).fetchone()
    assert tuple(row) == ("dispatched", "w:1", None, 1)
    clock[0] += timedelta(seconds=lease + 1)  # the worker died waiting
    assert control.reap() == 1
    ws.close()


def test_a_first_heartbeat_records_the_launch_at_the_workers_time(kb):
    """The first beat comes a quarter lease after the launch and carries its time."""
    ws, control, sent = _dispatched(kb, ["alpha"])
    beat = {"v": 4, "job_id": 1, "attempt": 1, "worker": "w:1", "host": "w", "launched": True}
    control.on_messages([{**beat, "started_at": "2030-01-02T03:04:05.678Z"}], [])
    row = ws.store.conn.execute("SELECT outcome, launched_at FROM attempts").fetchone()
    assert tuple(row) == ("running", "2030-01-02T03:04:05.678Z")
    assert [e for e, _ in _story(ws, 1)] == ["attempt.dispatched", "attempt.started"]
    ws.close()


def test_a_success_resets_the_launch_failures_of_its_reviewer_after_any_failure(kb):
    # The control process skips the reset while it knows the count is 0: a failure, even
    # one in the same batch after a success, must make the next success write it again.
    kb.gate("prose/clarity", ["body"])
    for name in ("a", "b", "c", "d"):
        kb.note(name)
    ws = Workspace.open(kb.root)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    from datetime import UTC, datetime, timedelta

    clock = [datetime.now(UTC)]
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, now=lambda: clock[0], hooks=FollowUp(ws))
    assert control.dispatch() == 4
    ok = [_outcome(ws, m) for m in sent]
    failed = [_outcome(ws, m, classification="launch-failure", output=None) for m in sent]

    def failures() -> int:
        row = ws.store.conn.execute("SELECT launch_failures FROM reviewer_state").fetchone()
        return row[0] if row else 0

    control.on_messages([], [failed[0]])
    assert failures() == 1
    control.on_messages([], [ok[1], failed[2]])  # one batch: the failure comes last
    assert failures() == 1
    control.on_messages([], [ok[3]])
    assert failures() == 0
    clock[0] += timedelta(hours=1)  # past the launch-failure backoff
    assert control.dispatch() == 2  # the failed jobs go out again, as attempt 2
    control.on_messages([], [_outcome(ws, sent[4], classification="launch-failure", output=None)])
    assert failures() == 1
    control.on_messages([], [_outcome(ws, sent[5])])
    assert failures() == 0
    ws.close()


def test_a_success_resets_the_failures_a_run_job_counted_meanwhile(kb):
    """run-job counts its reviewer failures against the profile (V9), from its own
    process. The control, which remembered the count as 0 since its last success, skipped
    the reset at its next one: failures that were not in a row paused the profile."""
    from datetime import UTC, datetime

    from orchestrator.control.attempts import back_off
    from orchestrator.state.store import Store

    ws, control, sent = _dispatched(kb, ["alpha", "beta"])
    control.on_messages([], [_outcome(ws, sent[0])])  # a success: the count is 0
    with Store.open(ws.state_dir) as by_hand, by_hand.write():  # a run-job's failures
        for _ in range(ws.settings.queue.launch_failures_before_pause - 1):
            off = back_off(by_hand, ws.settings.queue, 0, "offline", "x", [], datetime.now(UTC))
    assert off.count == ws.settings.queue.launch_failures_before_pause - 1
    control.on_messages([], [_outcome(ws, sent[1])])  # a success between
    (count,) = ws.store.conn.execute("SELECT launch_failures FROM reviewer_state").fetchone()
    assert count == 0
    ws.close()


def _sequential_job_dispatched(kb) -> tuple[Workspace, Control, dict]:
    """A sequential sweep over two bundles of one note; its first job dispatched."""
    from orchestrator import logs

    kb.gate("frontmatter/title-check", ["title"])
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    req = SweepRequest(
        name="cli", reviewer="offline", selectors=("frontmatter", "prose"), sequential=True
    )
    enqueue(ws, req)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    assert control.dispatch() == 1
    return ws, control, sent[0]


def _events(ws, name: str) -> list[dict]:
    lines = (ws.state_dir / "logs" / "reviewq.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def _fail_after_completed(monkeypatch, control, job_id: int):
    """Make the batch's step after a completed job fail for ``job_id`` (a disk I/O error),
    so the batch rolls back; the step as it was is returned, to put back."""
    plain = control.hooks.after_completed

    def fails_for_it(done: int, *read) -> None:  # noqa: ANN002 - the batch's row and pairs
        if done == job_id:
            raise sqlite3.OperationalError("disk I/O error")
        plain(done, *read)

    monkeypatch.setattr(control.hooks, "after_completed", fails_for_it)
    return plain


def _status(ws, job_id: int) -> str:
    return ws.store.conn.execute(
        "SELECT status FROM review_jobs WHERE id = ?", (job_id,)
    ).fetchone()[0]


def test_a_batch_rolled_back_logs_no_job_finalized(kb, monkeypatch):
    """The control logged job.finalized inside the batch's transaction: a batch that one
    outcome failed (or a control killed before its COMMIT) left the job finalized in the
    log and running in state.db, and the retry taken alone logged it a second time."""
    ws, control, sent = _dispatched(kb, ["alpha", "beta"])
    first, second = sent
    plain = _fail_after_completed(monkeypatch, control, second["job_id"])
    with pytest.raises(sqlite3.OperationalError):
        control.on_messages([], [_outcome(ws, first), _outcome(ws, second)])
    assert _status(ws, first["job_id"]) == "running"
    assert _events(ws, "job.finalized") == []
    monkeypatch.setattr(control.hooks, "after_completed", plain)
    control.on_messages([], [_outcome(ws, first)])
    assert [e["job_id"] for e in _events(ws, "job.finalized")] == [first["job_id"]]
    ws.close()


def test_a_batch_rolled_back_logs_no_job_failed(kb, monkeypatch):
    """As job.finalized (K38): the control logged job.failed, and the escalation of the
    job's pair, inside the batch's transaction, so a batch that a later outcome failed had
    the job failed in the log and running in state.db, and the retry taken alone logged it
    a second time."""
    import dataclasses

    ws, control, sent = _dispatched(kb, ["alpha", "beta"])
    first, second = sent
    once = dataclasses.replace(control.settings.queue, max_attempts=1)
    monkeypatch.setattr(control, "settings", dataclasses.replace(control.settings, queue=once))
    burned = {"classification": "burned-out", "output": None, "reasons": ["deadline"]}
    _fail_after_completed(monkeypatch, control, second["job_id"])
    with pytest.raises(sqlite3.OperationalError):
        control.on_messages([], [_outcome(ws, first, **burned), _outcome(ws, second)])
    assert _status(ws, first["job_id"]) == "running"
    assert _events(ws, "job.failed") == []
    assert _events(ws, "escalation.raised") == []  # its id is the next escalation's
    control.on_messages([], [_outcome(ws, first, **burned)])
    assert [e["job_id"] for e in _events(ws, "job.failed")] == [first["job_id"]]
    log = (ws.state_dir / "logs" / "reviewq.jsonl").read_text().splitlines()
    said = [json.loads(line)["event"] for line in log]
    assert said.index("job.failed") < said.index("escalation.raised"), said
    ws.close()


def test_a_job_finalized_is_said_when_its_files_fail_after_the_commit(kb, monkeypatch):
    """job.finalized waits for the commit behind the job's files (K38). The first
    callback that raised after the commit dropped every one after it: a read of state.db
    failing as the files were written lost the job's line, and every later job's of the
    batch, for outcomes that were kept (taken again, they are repeats)."""
    from orchestrator.state import files

    ws, control, sent = _dispatched(kb, ["alpha", "beta"])

    def fails(*args, **kwargs) -> int:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(files, "write_due_job_files", fails)
    with pytest.raises(sqlite3.OperationalError):
        control.on_messages([], [_outcome(ws, m) for m in sent])
    said = [e["job_id"] for e in _events(ws, "job.finalized")]
    assert said == [m["job_id"] for m in sent]
    ws.close()


def test_a_sequential_sweeps_note_renamed_while_its_job_ran_does_not_hold_the_outcome(kb):
    """The next bundle of a note that is gone cannot be enqueued; the outcome is still
    kept. Raised, it rolled the outcome back and the control took it again all night."""
    ws, control, msg = _sequential_job_dispatched(kb)
    (kb.root / "kb/notes/alpha.md").rename(kb.root / "kb/notes/alpha-renamed.md")
    control.on_messages([], [_outcome(ws, msg)])
    status = ws.store.conn.execute(
        "SELECT status FROM review_jobs WHERE id = ?", (msg["job_id"],)
    ).fetchone()[0]
    assert status == "completed"
    assert [e["note_path"] for e in _events(ws, "sequential.skipped")] == ["kb/notes/alpha.md"]
    ws.close()


def test_a_follow_up_that_cannot_be_made_is_logged_and_the_outcome_kept(kb, monkeypatch):
    """A profile gone from the configuration since the job was queued: the next bundle
    cannot be enqueued, which is said once; the decisions stand."""
    ws, control, msg = _sequential_job_dispatched(kb)
    monkeypatch.delitem(ws.settings.reviewers, "offline")
    control.on_messages([], [_outcome(ws, msg)])
    rows = ws.store.conn.execute("SELECT kind, status FROM review_jobs ORDER BY id").fetchall()
    assert [tuple(r) for r in rows] == [("review", "completed")]  # no half-made next bundle
    assert ws.store.conn.execute("SELECT decision FROM acceptance").fetchone()[0] == "PASS"
    (failed,) = _events(ws, "followup.failed")
    assert failed["job_id"] == msg["job_id"] and "offline" in failed["error"]
    ws.close()


def _escalated(kb, decision: str) -> tuple[Workspace, int]:
    """A finalized review of alpha against prose/clarity with ``decision``, and an open
    escalation of that pair."""
    from orchestrator.review.finalize import finalize

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    (job,) = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
    output = _pass_output(ws, job.review_job_id).replace(b"PASS", decision.encode())
    assert finalize(ws.store, ws.state_dir, job.review_job_id, output).status == "completed"
    esc_id = _open_escalation(
        ws, "the auditor refuted a PASS", ["- major: unclear"], "say it plainly"
    )
    return ws, esc_id


def _open_escalations(kb) -> list[int]:
    with Workspace.open(kb.root).store as store:
        rows = store.conn.execute("SELECT id FROM escalations WHERE decision IS NULL")
        return [r[0] for r in rows]


def test_a_redo_that_would_do_nothing_is_refused_and_the_escalation_stays_open(kb, run_cli):
    """A fresh PASS the auditor refuted: no FAIL to fix, nothing to release. Closing the
    escalation as a redo lost the person's asks and the refutation."""
    ws, esc_id = _escalated(kb, "PASS")
    ws.store.close()
    res = run_cli("decide", str(esc_id), "redo", "--feedback", "Say what it means.")
    assert res.exit_code == 1
    assert f"escalation {esc_id} (kb/notes/alpha.md prose/clarity): no FAIL is left" in res.stderr
    assert _open_escalations(kb) == [esc_id]


@pytest.mark.parametrize("named", [False, True], ids=["no-reviewer", "reviewer-moved"])
def test_a_redo_whose_re_review_would_run_in_another_partition_is_refused(kb, run_cli, named):
    """An escalation that names no reviewer has its fixer review the fix; a fixer of
    another model was queued anyway (so was one whose named reviewer has since moved to
    another model), and the re-review failed unrun at dispatch, far from the person."""
    kb.write(
        "reviewq.toml",
        '[reviewers.other]\nkind = "command"\ncommand = ["true"]\npartition = "elsewhere"\n',
    )
    ws, esc_id = _escalated(kb, "FAIL")
    with ws.store.write():
        ws.store.conn.execute(
            "UPDATE escalations SET reviewer = ? WHERE id = ?", ("other" if named else None, esc_id)
        )
    ws.store.close()
    res = run_cli("decide", str(esc_id), "redo", "--feedback", "Say it.", "--fixer", "other")
    assert res.exit_code == 1, res.stdout
    named_text = "its reviewer 'other' is not configured for it, and " if named else ""
    assert res.stderr.splitlines() == [
        f"error: escalation {esc_id}: the fixed note is reviewed again in partition 'offline', "
        f"but {named_text}the fixer 'other' writes partition 'elsewhere'; name with --fixer a "
        "profile of partition 'offline', or approve or reject"
    ]
    assert _open_escalations(kb) == [esc_id]
    with Workspace.open(kb.root).store as store:
        assert (
            store.conn.execute("SELECT count(*) FROM review_jobs WHERE kind = 'fix'").fetchone()[0]
            == 0
        )


def test_a_redo_whose_reviewer_moved_away_is_reviewed_by_its_fixer(kb, run_cli):
    """The escalation's reviewer now writes another partition: the fixer, of the note's,
    reviews the fix (the re-review under the moved reviewer failed unrun at dispatch)."""
    kb.write(
        "reviewq.toml",
        '[reviewers.other]\nkind = "command"\ncommand = ["true"]\npartition = "elsewhere"\n',
    )
    ws, esc_id = _escalated(kb, "FAIL")
    with ws.store.write():
        ws.store.conn.execute("UPDATE escalations SET reviewer = 'other' WHERE id = ?", (esc_id,))
    ws.store.close()
    res = run_cli("decide", str(esc_id), "redo", "--feedback", "Say it.", "--fixer", "offline")
    assert res.exit_code == 0, res.stderr
    with Workspace.open(kb.root).store as store:
        row = store.conn.execute(
            "SELECT reviewer, review_reviewer FROM review_jobs WHERE kind = 'fix'"
        ).fetchone()
    assert tuple(row) == ("offline", "offline")


def test_a_redo_while_the_notes_fix_job_is_open_is_refused(kb, run_cli):
    """The open fix job would not carry the asks; decided anyway, they were lost."""
    from orchestrator.cycles.fixes import create_fix_job

    ws, esc_id = _escalated(kb, "FAIL")
    fix = create_fix_job(
        ws.kb, ws.catalog(), ws.store, ws.state_dir, note_path="kb/notes/alpha.md",
        partition="offline", fixer="offline", review_reviewer="offline", sweep=None,
        sweep_run_id=None, source_job_id=None, include={"prose/clarity"},
    )  # fmt: skip
    ws.store.close()
    res = run_cli("decide", str(esc_id), "redo", "--feedback", "Say what it means.")
    assert res.exit_code == 1 and f"fix job {fix} for this note is still open" in res.stderr
    assert _open_escalations(kb) == [esc_id]


def test_no_fix_job_is_made_of_a_note_past_the_size_limit(kb):
    """A FAIL's fix of a note past [limits] max_note_bytes (the limit lowered since its
    review, the note unchanged: the FAIL still current) carried it whole in the fixer's
    prompt and message, as no review would."""
    from orchestrator.cycles.fixes import create_fix_job

    ws, _ = _escalated(kb, "FAIL")
    ws.store.close()
    kb.write("reviewq.toml", "[limits]\nmax_note_bytes = 16\n")
    ws = Workspace.open(kb.root)
    fix = create_fix_job(
        ws.kb, ws.catalog(), ws.store, ws.state_dir, note_path="kb/notes/alpha.md",
        partition="offline", fixer="offline", review_reviewer="offline", sweep=None,
        sweep_run_id=None, source_job_id=None, include={"prose/clarity"},
    )  # fmt: skip
    assert fix is None
    assert (
        ws.store.conn.execute("SELECT count(*) FROM review_jobs WHERE kind = 'fix'").fetchone()[0]
        == 0
    )
    ws.store.close()


def test_no_automatic_fix_of_a_note_excluded_since_its_review_but_a_redo_is_made(kb):
    """A review queued before its note was excluded ([kb] exclude) still runs; its FAIL's
    automatic fix would have a fixer rewrite an index or template nobody asked about. A
    person's redo (their asks) is still theirs to make."""
    from orchestrator.cycles.fixes import create_fix_job

    ws, _ = _escalated(kb, "FAIL")
    ws.store.close()
    kb.write("reviewq.toml", '[kb]\nexclude = ["alpha.md"]\n')
    ws = Workspace.open(kb.root)
    made = [
        create_fix_job(
            ws.kb, ws.catalog(), ws.store, ws.state_dir, note_path="kb/notes/alpha.md",
            partition="offline", fixer="offline", review_reviewer="offline", sweep=None,
            sweep_run_id=None, source_job_id=None, include={"prose/clarity"}, feedback=asks,
        )
        for asks in (None, "Say what it means.")
    ]  # fmt: skip
    assert made[0] is None and made[1] is not None, made
    ws.store.close()


def test_a_redo_of_a_pair_with_no_fail_on_record_releases_it_for_the_next_sweep(kb, run_cli):
    """A job that failed every attempt recorded no decision: a redo (after the reviewer
    was repaired) queues no fix, closes the escalation, and the next sweep reviews it."""

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    esc_id = _open_escalation(
        ws, "the reviewer failed every attempt", ["no output"], "repair the reviewer"
    )
    ws.store.close()
    res = run_cli("decide", str(esc_id), "redo", "--feedback", "Try again.")
    assert res.exit_code == 0, res.stderr
    assert "released: the next sweep reviews it again" in res.stdout
    assert _open_escalations(kb) == []
    res = run_cli("enqueue", "prose", "--json")
    assert [len(j["pairs"]) for j in res.json()["jobs"]] == [1]


def test_a_rejected_pair_is_fixed_again_once_its_note_has_changed(kb, run_cli):
    """A reject holds the pair until the note or the gate changes (CONTRACT §7), for fixes
    as for sweeps: a new FAIL of the changed note got a review and no fix, ever."""
    from orchestrator.cycles.fixes import create_fix_job

    ws, esc_id = _escalated(kb, "FAIL")
    ws.store.close()
    assert run_cli("decide", str(esc_id), "reject").exit_code == 0

    def fix() -> int | None:
        ws = Workspace.open(kb.root)
        try:
            return create_fix_job(
                ws.kb, ws.catalog(), ws.store, ws.state_dir, note_path="kb/notes/alpha.md",
                partition="offline", fixer="offline", review_reviewer="offline", sweep=None,
                sweep_run_id=None, source_job_id=None,
            )  # fmt: skip
        finally:
            ws.close()

    assert fix() is None  # held: the note is as the person rejected it
    kb.write("kb/notes/alpha.md", kb.read("kb/notes/alpha.md") + "A new paragraph.\n")
    assert fix() is None  # the FAIL was about the old text: the note is stale, not failing
    from orchestrator.review.finalize import finalize

    ws = Workspace.open(kb.root)
    try:
        (job,) = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
        output = _pass_output(ws, job.review_job_id).replace(b"PASS", b"FAIL")
        assert finalize(ws.store, ws.state_dir, job.review_job_id, output).status == "completed"
    finally:
        ws.close()
    assert fix() is not None  # a FAIL of the changed note is fixed, the reject notwithstanding


def test_an_escalation_report_lists_only_the_rejections_that_still_count(kb):
    """A FAIL that a PASS has since reset is history, not a cycle: a report of a job that
    then failed every attempt showed it as "Cycle 1" under "0 consecutive rejection(s)"."""
    from orchestrator.cycles import escalations as cycles

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    pair = ("offline", "kb/notes/alpha.md", "prose/clarity")
    with ws.store.write():
        cycles.reject(ws.store, *pair, "review-fail", 1, "high: the body is empty.")
        cycles.reset(ws.store, *pair)
    esc_id = _open_escalation(
        ws, "the reviewer failed every attempt", ["no output"], "repair the reviewer"
    )
    text = cycles.report(ws.store, esc_id)
    assert "Cycle 1" not in text and "the body is empty" not in text
    assert "- (no rejection cycles: the reviewer failed every attempt)" in text
    ws.close()


def test_a_follow_up_that_cannot_be_made_does_not_undo_a_third_rejections_escalation(
    kb, monkeypatch
):
    """The follow-ups shared one savepoint: the next bundle's failure (its profile gone)
    rolled back the escalation made just before, leaving the pair at three rejections with
    nobody told."""
    from orchestrator.cycles import escalations as cycles

    ws, control, msg = _sequential_job_dispatched(kb)
    pair = ("offline", "kb/notes/alpha.md", "frontmatter/title-check")
    with ws.store.write():
        for job in (101, 102):
            cycles.reject(ws.store, *pair, "review-fail", job, "high: no title.")
    monkeypatch.delitem(ws.settings.reviewers, "offline")
    failing = _outcome(ws, msg, output=_pass_output(ws, msg["job_id"]).replace(b"PASS", b"FAIL"))
    control.on_messages([], [failing])
    escs = ws.store.conn.execute("SELECT note_path, gate_id FROM escalations").fetchall()
    assert [tuple(e) for e in escs] == [pair[1:]]
    (failed,) = _events(ws, "followup.failed")
    assert failed["follow_up"] == "next bundle of kb/notes/alpha.md"
    ws.close()


def test_the_reaper_leaves_an_attempt_finalized_by_hand_since_it_looked(kb):
    """The reaper decides from what it reads under the write lock: a person's
    ``reviewq finalize`` between its look and its write keeps its job and its attempt."""
    from contextlib import contextmanager
    from datetime import UTC, datetime

    from orchestrator.control.followup import finalize_by_hand
    from orchestrator.review.finalize import Provenance

    ws, control, sent = _dispatched(kb, ["alpha"])
    control.now = lambda: datetime(2099, 1, 1, tzinfo=UTC)  # every lease long past
    person = Workspace.open(kb.root)
    write = control.store.write

    @contextmanager
    def finalized_first():
        control.store.write = write  # once
        res, _ = finalize_by_hand(person, 1, _pass_output(person, 1), Provenance(runner="offline"))
        assert res.ok, res.failure_reasons
        with write() as conn:
            yield conn

    control.store.write = finalized_first
    assert control.reap() == 0
    assert ("attempt.lost", None) not in _story(ws, 1)
    row = ws.store.conn.execute("SELECT status FROM review_jobs WHERE id = 1").fetchone()
    assert row[0] == "completed"
    person.close()
    ws.close()


def test_an_outcome_that_comes_again_after_it_was_kept_changes_nothing(kb):
    """A control process stopped between keeping a batch and taking it off the queue
    meets the batch again: the attempt stays as it was decided, and the log says so."""
    ws, control, sent = _dispatched(kb, ["alpha"])
    outcome = _outcome(ws, sent[0], files={"stdout.log": b"the run decided on\n"})
    control.on_messages([], [outcome])
    folder = next(ws.state_dir.glob("jobs/*/attempt-1"))
    kept = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    # Another run's report under the same attempt (a redelivered message): its files did
    # not overwrite the evidence of the decision made from the first.
    again = {**outcome, "output": b"something else", "files": {"stdout.log": b"another run\n"}}
    control.on_messages([], [again])
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == kept
    row = ws.store.conn.execute("SELECT outcome FROM attempts WHERE job_id = 1").fetchone()
    assert row[0] == "finalized"
    assert [e for e, _ in _story(ws, 1) if e != "attempt.dispatched"][-2:] == [
        "job.finalized",
        "attempt.repeated",
    ]
    ws.close()


def test_what_a_late_agent_spent_is_counted(kb):
    """An outcome for an attempt the reaper gave up on is not acted on, but its agent
    ran: its cost and tokens count in status, `job N` and the sweep's budget."""
    from datetime import UTC, datetime

    from orchestrator.state.status import status

    ws, control, sent = _dispatched(kb, ["alpha"])
    now = control.now
    control.now = lambda: datetime(2099, 1, 1, tzinfo=UTC)
    assert control.reap() == 1
    control.now = now
    telemetry = {"cost_usd": 1.25, "input_tokens": 1000, "output_tokens": 50, "num_turns": 3}
    control.on_messages([], [_outcome(ws, sent[0], telemetry=telemetry)])
    row = ws.store.conn.execute(
        "SELECT outcome, cost_usd, input_tokens, num_turns FROM attempts WHERE job_id = 1"
    ).fetchone()
    assert tuple(row) == ("lost", 1.25, 1000, 3)
    assert status(ws.store, ws.settings)["cost_usd"]["total"] == 1.25
    ws.close()


def test_a_job_failed_at_dispatch_keeps_its_files_due_through_a_crash(kb, monkeypatch):
    """fail_job marked the files due in a second transaction: a process that died
    between the two left MANIFEST.json saying "queued" for good."""
    from contextlib import contextmanager

    from orchestrator.review.jobs import create_jobs
    from orchestrator.state import files

    class Killed(BaseException):
        pass

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    targets = [{"note_path": "kb/notes/alpha.md", "gate_id": "prose/clarity"}]
    (job,) = create_jobs(
        ws.kb, ws.catalog(), ws.store, ws.state_dir, targets,
        model_partition="offline", reviewer="removed-since",
    ).jobs  # fmt: skip
    manifest = ws.state_dir / "jobs" / f"review-job-{job.review_job_id}" / "MANIFEST.json"
    write = ws.store.write

    @contextmanager
    def dies_once_the_failure_is_committed():
        with write() as conn:
            yield conn
        failed = ws.store.conn.execute("SELECT status FROM review_jobs").fetchone()[0] == "failed"
        if failed and not ws.store.conn.in_transaction:
            raise Killed

    def killed(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(ws.store, "write", dies_once_the_failure_is_committed)
    monkeypatch.setattr(files, "write_due_job_files", killed)  # nor are the files written
    with pytest.raises(Killed):
        Control(ws, send_review=lambda m: None, hooks=FollowUp(ws)).dispatch()
    monkeypatch.undo()
    again = Workspace.open(kb.root)  # the restarted control process
    Control(again, send_review=lambda m: None, hooks=FollowUp(again)).write_due_files()
    assert json.loads(manifest.read_text())["status"] == "failed"
    again.close()
    ws.close()


def test_attempts_no_worker_picked_up_never_fail_the_job(kb):
    """With no worker up all night, each attempt was reaped as "never picked up" every
    lease + timeout, and the sixth failed the job and escalated its pairs, as if its
    agent took its worker down each time."""
    from datetime import UTC, datetime, timedelta

    ws, control, sent = _dispatched(kb, ["alpha"])
    clock = [datetime.now(UTC)]
    control.now = lambda: clock[0]
    for _ in range(8):
        clock[0] += timedelta(hours=1)  # past lease + timeout
        assert control.reap() == 1
        assert control.dispatch() == 1
    lost = ws.store.conn.execute("SELECT count(*) FROM attempts WHERE outcome = 'lost'")
    assert lost.fetchone()[0] == 8
    row = ws.store.conn.execute("SELECT status FROM review_jobs WHERE id = 1").fetchone()
    assert row[0] == "running"
    # Launched and then silent, six times: that agent takes its worker down. It fails.
    for _ in range(6):
        attempt = ws.store.conn.execute("SELECT attempt FROM review_jobs WHERE id = 1").fetchone()[
            0
        ]
        beat = {"job_id": 1, "attempt": attempt, "worker": "w:1", "host": "w", "launched": True}
        control.on_messages([beat], [])
        clock[0] += timedelta(hours=1)
        assert control.reap() == 1
        control.dispatch()
    row = ws.store.conn.execute("SELECT status FROM review_jobs WHERE id = 1").fetchone()
    assert row[0] == "failed"
    ws.close()


def test_a_lost_attempts_late_cost_is_in_the_next_report(kb, run_cli):
    """A lost agent's late cost is counted (the contract), but the report counted an
    attempt by its start and end: both were before the next report's window, so the money
    was in no morning report."""
    ws, job, sent, control = _one_queued_job(kb)
    control.dispatch()
    (msg,) = sent
    with ws.store.write():  # the reaper gave the attempt up, long ago
        ws.store.conn.execute(
            "UPDATE attempts SET outcome = 'lost', started_at = '2026-01-01T00:00:00.000Z', "
            "ended_at = '2026-01-01T00:10:00.000Z' WHERE job_id = ?",
            (job.review_job_id,),
        )
    ws.close()
    first = json.loads(run_cli("report", "--json").stdout)  # nobody saw it: --json
    assert run_cli("report").exit_code == 0  # the morning report a person saw
    ws = Workspace.open(kb.root)
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    # Its agent's outcome comes in after all, with what it spent.
    control._supersede(msg["job_id"], msg["attempt"], {"cost_usd": 0.5})
    ws.close()
    later = json.loads(run_cli("report", "--json").stdout)
    assert first["reviewed"]["cost_usd"] == 0 and later["reviewed"]["cost_usd"] == 0.5


def test_any_heartbeat_says_the_agent_runs(kb):
    """The launch's own heartbeat lost (a queue busy for a moment), the later ones left the
    attempt 'dispatched': the reaper waited lease + timeout for an agent long running."""
    ws, control, sent = _dispatched(kb, ["alpha"])
    beat = {"v": 4, "job_id": 1, "attempt": sent[0]["attempt"], "worker": "w", "host": "h"}
    control.on_messages([{**beat, "launched": False}], [])
    row = ws.store.conn.execute("SELECT outcome, launched_at FROM attempts").fetchone()
    assert row[0] == "running" and row[1] is not None
    ws.close()


def test_the_late_report_of_an_attempt_closed_without_one_is_kept(kb):
    """A person finalized the job by hand while its agent ran: the attempt was closed
    (superseded) with no report of its own, and the agent's late one, the only evidence
    of what it did, was dropped with the files of repeated outcomes."""
    from orchestrator.control.followup import finalize_by_hand
    from orchestrator.review.finalize import Provenance

    ws, control, sent = _dispatched(kb, ["alpha"])
    person = Workspace.open(kb.root)
    res, _ = finalize_by_hand(person, 1, _pass_output(person, 1), Provenance(runner="me"))
    assert res.ok
    person.close()
    late = _outcome(ws, sent[0], files={"stdout.log": b"the late run\n"})
    control.on_messages([], [late])
    assert next(ws.state_dir.glob("jobs/*/attempt-1/stdout.log")).read_bytes() == b"the late run\n"
    ws.close()


def test_a_failed_jobs_reasons_are_each_said_once(kb):
    """Stored as the summary line and then each reason again, the sweep's summary, `job N`
    and the report said "3 attempt(s) failed; the last: X; X"."""
    from .test_queue_integration import FAST_QUEUE, fake_profile, rq

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", body="Alpha body.\n")
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    res = rq(kb, "sweep", "--reviewer", "fake", "prose", env={"FAKE_MODE": "nothing"})
    assert res.returncode == 1
    reasons = json.loads(rq(kb, "job", "1", "--json").stdout)["failure_reasons"]
    assert reasons[0].startswith("3 attempt(s) failed; the last: exited 0 without writing")
    said = "; ".join(reasons)
    assert said.count("exited 0 without writing") == 1, reasons


@pytest.mark.parametrize("decision", ["FAIL", None, "PASS"], ids=["fail", "none", "pass"])
def test_an_escalation_report_says_what_a_redo_would_do(kb, decision):
    """It said "redo queues a fix" of every escalation: of a pair with no FAIL on record
    (the reviewer failed every attempt, the note edited since) a redo releases it, and of
    an accepted PASS an auditor refuted, decide refuses it."""
    from orchestrator.cycles import escalations as cycles

    if decision is None:
        kb.gate("prose/clarity", ["body"])
        kb.note("alpha")
        ws = Workspace.open(kb.root)
        esc_id = _open_escalation(
            ws, "the reviewer failed every attempt", ["no output"], "repair the reviewer"
        )
    else:
        ws, esc_id = _escalated(kb, decision)
    try:
        text = " ".join(cycles.report(ws.store, esc_id).split())
    finally:
        ws.close()
    assert (
        f'`reviewq decide {esc_id} redo --feedback "..."` queues a fix with your concrete asks '
        "while a FAIL about the note as it is now is on record (a fresh count starts); else it "
        "releases the pair for the next sweep if it needs a review (never reviewed, or the "
        "note or gate changed), and is refused if it would do neither;"
    ) in text, text


def test_a_run_takes_over_the_queued_jobs_of_an_earlier_run_only_once_its_budget_is_spent(kb):
    """OPERATIONS 6.7: the next run adopts leftovers that wait on a spent budget. Before, it
    took every queued job of a run with the same options: two runs at once (a sweep started
    by hand just before its cron time) took each other's work, and the first sweep's
    summary lost the failures of what it had enqueued."""
    kb.gate("prose/clarity", ["body"])
    for name in ("alpha", "beta"):
        kb.note(name)
    ws = Workspace.open(kb.root)
    req = SweepRequest(name="nightly", reviewer="offline", all_gates=True, budget_usd=0.5)
    first = enqueue(ws, req)
    assert len(first.jobs) == 2
    second = enqueue(ws, req)  # the same sweep again while the first waits to dispatch

    def runs() -> list[int]:
        rows = ws.store.conn.execute("SELECT sweep_run_id FROM review_jobs ORDER BY id")
        return [r[0] for r in rows]

    assert second.jobs == [] and runs() == [first.run_id] * 2
    spend(ws.store, first.jobs[0].review_job_id, 0.5)  # the first run's attempts spend its budget
    third = enqueue(ws, req)
    assert runs() == [third.run_id] * 2
    ws.store.close()


def test_status_counts_the_jobs_a_cron_sweeps_last_run_took_over(kb):
    """`enqueue --name nightly` took over the 2 jobs its spent run held and ran them, and
    `status` said of that run "run 3, 0 job(s)": the jobs it runs were in no count."""
    from datetime import UTC, datetime

    from orchestrator.sweeps.producer import sweeps_schedule

    kb.gate("prose/clarity", ["body"])
    for name in ("alpha", "beta"):
        kb.note(name)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 2 * * *"\nbudget_usd = 0.5\n')
    ws = Workspace.open(kb.root)
    req = SweepRequest.from_config(ws.settings.sweeps["nightly"], ws.root)
    first = enqueue(ws, req)
    spend(ws.store, first.jobs[0].review_job_id, 0.5)
    taking = enqueue(ws, req)
    assert taking.taken_over == {first.run_id: 2} and taking.jobs == []
    (said,) = sweeps_schedule(ws.store, ws.settings, datetime.now(UTC))
    assert said["last_run"]["id"] == taking.run_id
    assert (said["last_run"]["jobs"], said["last_run"]["taken_over"]) == (0, 2), said
    assert f"run {taking.run_id}, 0 job(s) and 2 taken over, by its clock)" in said["says"]
    ws.store.close()


def test_the_next_run_of_an_edited_sweeps_entry_takes_over_what_its_spent_budget_held(kb):
    """OPERATIONS 6.7. The takeover compared the runs' options as text: once the entry
    was edited (a batch size, fix = true, another auditor), its next runs never took over
    what its spent run had left queued. Those jobs were held for good, and their pairs
    with them: every later run skipped them as already queued. A run of the entry takes
    over the entry's runs now, whatever else was edited; not an ad-hoc run under its name
    with other options (a job keeps the follow-ups it was enqueued with), nor a run whose
    reviewer writes another model's partition (that budget is not for the old model)."""
    from orchestrator.state.status import held_by_budget

    kb.gate("prose/clarity", ["body"])
    for name in ("alpha", "beta"):
        kb.note(name)
    other = '[reviewers.other]\nkind = "offline"\npartition = "other-model"\n'
    entry = '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\nbudget_usd = 0.5\n'

    def run_of_entry(config: str):  # noqa: ANN202 - an EnqueueResult
        kb.write("reviewq.toml", other + config)
        ws = Workspace.open(kb.root)
        try:
            return enqueue(ws, SweepRequest.from_config(ws.settings.sweeps["nightly"], ws.root))
        finally:
            ws.close()

    first = run_of_entry(entry)
    assert len(first.jobs) == 2
    ws = Workspace.open(kb.root)
    spend(ws.store, first.jobs[0].review_job_id, 0.5)  # the first run's attempts spend its budget

    def runs() -> list[int]:
        rows = ws.store.conn.execute(
            "SELECT sweep_run_id FROM review_jobs WHERE model_partition = 'offline' ORDER BY id"
        )
        return [r[0] for r in rows]

    ad_hoc = enqueue(ws, SweepRequest(name="nightly", all_gates=True, fix=True, budget_usd=1.0))
    assert ad_hoc.jobs == [] and runs() == [first.run_id] * 2
    assert held_by_budget(ws.store, {first.run_id: 2}, ws.settings) == [
        f"2 job(s) of sweep 'nightly' (run {first.run_id}) wait: its budget of $0.5 is spent; "
        "the next run of its [[sweeps]] entry (reviewq enqueue --name nightly) takes them "
        "over (with a new --budget-usd)"
    ]
    elsewhere = run_of_entry(entry + 'reviewer = "other"\n')
    assert len(elsewhere.jobs) == 2 and runs() == [first.run_id] * 2
    edited = run_of_entry(entry + 'batch_size = 10\nfix = true\nauditor = "other"\n')
    assert edited.jobs == [] and runs() == [edited.run_id] * 2
    ws.close()


def test_a_renamed_sweeps_entry_takes_over_what_its_old_names_spent_budget_held(kb):
    """Renamed (`nightly` to `nightly-prose`, the control sent SIGHUP), an entry took over
    none of what its old name's spent run held: those jobs waited for "a run of that
    sweep with the same options" under a name no entry had, and every run of the renamed
    entry skipped their pairs as already queued, each night, for good. Not taken by an
    entry of another model (that budget is not for it)."""
    from orchestrator.state.status import held_by_budget

    kb.gate("prose/clarity", ["body"])
    for name in ("alpha", "beta"):
        kb.note(name)
    other = '[reviewers.other]\nkind = "offline"\npartition = "other-model"\n'
    entry = '[[sweeps]]\nname = "{}"\ncron = "0 3 * * *"\nbudget_usd = 0.5\n'
    kb.write("reviewq.toml", other + entry.format("nightly"))
    ws = Workspace.open(kb.root)
    first = enqueue(ws, SweepRequest.from_config(ws.settings.sweeps["nightly"], ws.root))
    spend(ws.store, first.jobs[0].review_job_id, 0.5)  # the first run's attempts spend its budget
    ws.close()
    kb.write("reviewq.toml", other + entry.format("elsewhere") + 'reviewer = "other"\n')
    ws = Workspace.open(kb.root)
    elsewhere = enqueue(ws, SweepRequest.from_config(ws.settings.sweeps["elsewhere"], ws.root))
    assert len(elsewhere.jobs) == 2  # its own model's pairs; the held ones stay held
    ws.close()
    kb.write("reviewq.toml", other + entry.format("nightly-prose"))
    ws = Workspace.open(kb.root)
    assert held_by_budget(ws.store, {first.run_id: 2}, ws.settings) == [
        f"2 job(s) of sweep 'nightly' (run {first.run_id}) wait: its budget of $0.5 is spent; "
        "the next run of a [[sweeps]] entry now of its model (reviewq enqueue --name "
        "nightly-prose) takes them over (with a new --budget-usd)"
    ]
    renamed = enqueue(ws, SweepRequest.from_config(ws.settings.sweeps["nightly-prose"], ws.root))
    rows = ws.store.conn.execute(
        "SELECT sweep, sweep_run_id FROM review_jobs WHERE model_partition = 'offline'"
    ).fetchall()
    assert (
        renamed.jobs == [] and [tuple(r) for r in rows] == [("nightly-prose", renamed.run_id)] * 2
    )
    ws.close()


def test_enqueue_by_name_says_the_jobs_it_took_over_from_a_spent_run(kb, run_cli):
    """`status` says "the next run of its [[sweeps]] entry (reviewq enqueue --name
    nightly) takes them over"; run, that command said "queued 0 job(s), 0 pair(s) …;
    skipped 2 (2 already queued or running)", as if it had done nothing, and its log line
    said `jobs: 0`: the two jobs it took over were in no word of it."""
    kb.gate("prose/clarity", ["body"])
    for name in ("alpha", "beta"):
        kb.note(name)
    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\nbudget_usd = 0.5\n')

    def spend(run_id: int) -> None:  # a job of the run records the whole budget
        with sqlite3.connect(kb.state / "state.db") as conn:
            job = conn.execute(
                "SELECT id FROM review_jobs WHERE sweep_run_id = ? LIMIT 1", (run_id,)
            ).fetchone()[0]
            conn.execute(
                "INSERT INTO attempts (job_id, attempt, outcome, started_at, ended_at, cost_usd) "
                "VALUES (?, ?, 'invalid-output', ?, ?, 0.5)",
                (job, 10 + run_id, utcnow(), utcnow()),
            )

    first = json.loads(run_cli("enqueue", "--name", "nightly", "--json").stdout)
    assert len(first["jobs"]) == 2 and first["taken_over"] == 0
    spend(first["sweep_run"])
    res = run_cli("enqueue", "--name", "nightly")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.rstrip().endswith(
        "; took over 2 queued job(s) of run(s) 1, whose budget was spent"
    ), res.stdout
    spend(2)
    again = json.loads(run_cli("enqueue", "--name", "nightly", "--json").stdout)
    assert again["jobs"] == [] and again["taken_over"] == 2
    lines = (kb.state / "logs/reviewq.jsonl").read_text().splitlines()
    said = [json.loads(x) for x in lines if '"sweep.enqueued"' in x]
    assert [e.get("taken_over") for e in said] == [None, {"1": 2}, {"2": 2}]


def test_two_sweeps_entries_renamed_into_each_other_take_over_each_others_spent_runs(kb):
    """Two entries of two models swapped names (the control sent SIGHUP): each old name
    was an entry still, of the other model, so neither spent run was taken over. Their
    jobs waited for "a run of that sweep with the same options" and each entry's runs
    skipped their pairs as already queued, every minute of a real control, for good."""
    from orchestrator.state.status import held_by_budget

    kb.gate("prose/clarity", ["body"])
    for name in ("alpha", "beta"):
        kb.note(name)
    other = '[reviewers.other]\nkind = "offline"\npartition = "other-model"\n'
    entry = '[[sweeps]]\nname = "{}"\ncron = "0 3 * * *"\nbudget_usd = 0.5\nreviewer = "{}"\n'

    def settings(a: str, b: str) -> Workspace:
        kb.write("reviewq.toml", other + entry.format(a, "offline") + entry.format(b, "other"))
        return Workspace.open(kb.root)

    ws = settings("prose", "facts")
    spent = {}
    for name in ("prose", "facts"):
        run = enqueue(ws, SweepRequest.from_config(ws.settings.sweeps[name], ws.root))
        spend(ws.store, run.jobs[0].review_job_id, 0.5)  # each run's attempts spend its budget
        spent[name] = run.run_id
    ws.close()
    ws = settings("facts", "prose")  # swapped: "facts" now reviews with offline
    assert held_by_budget(ws.store, {spent["prose"]: 2}, ws.settings) == [
        f"2 job(s) of sweep 'prose' (run {spent['prose']}) wait: its budget of $0.5 is spent; "
        "the next run of a [[sweeps]] entry now of its model (reviewq enqueue --name "
        "facts) takes them over (with a new --budget-usd)"
    ]
    for name in ("facts", "prose"):
        run = enqueue(ws, SweepRequest.from_config(ws.settings.sweeps[name], ws.root))
        assert run.jobs == [] and run.taken_over == {
            spent["prose" if name == "facts" else "facts"]: 2
        }
    rows = ws.store.conn.execute("SELECT model_partition, sweep FROM review_jobs ORDER BY id")
    assert (
        sorted(tuple(r) for r in rows)
        == [("offline", "facts")] * 2 + [("other-model", "prose")] * 2
    )
    ws.close()


def test_a_spent_run_of_an_entry_from_before_the_upgrade_is_taken_over_and_said_so(kb):
    """Runs recorded before their options said 'configured' were never taken over by an
    entry edited since (the jobs held for good that the takeover was made for), and the
    waiting line named `enqueue --name NAME` for runs that run would not take (a reviewer
    now of another partition) or that is refused (the entry gone)."""
    from orchestrator.state.status import held_by_budget

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    other = '[reviewers.other]\nkind = "offline"\npartition = "other-model"\n'
    entry = '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\nbudget_usd = 0.5\n'

    def spent_run(config: str) -> tuple[Workspace, int]:
        kb.write("reviewq.toml", other + config)
        ws = Workspace.open(kb.root)
        res = enqueue(ws, SweepRequest.from_config(ws.settings.sweeps["nightly"], ws.root))
        with ws.store.write():  # recorded before the upgrade; its attempt spent it
            ws.store.conn.execute(
                "UPDATE sweep_runs SET options = json_remove(options, '$.configured')"
            )
            ws.store.conn.execute(
                "INSERT INTO attempts (job_id, attempt, outcome, started_at, ended_at, "
                "cost_usd) VALUES (?, 1, 'invalid-output', ?, ?, 0.5)",
                (res.jobs[0].review_job_id, utcnow(), utcnow()),
            )
        return ws, res.run_id

    def said(ws: Workspace, run_id: int) -> str:
        return held_by_budget(ws.store, {run_id: 1}, ws.settings)[0].split("; ", 1)[1]

    by_entry = "the next run of its [[sweeps]] entry (reviewq enqueue --name nightly) takes"
    by_options = "a run of that sweep with the same options takes"
    ws, first = spent_run(entry)
    assert said(ws, first).startswith(by_entry)
    ws.close()
    kb.write("reviewq.toml", other + entry + 'reviewer = "other"\n')
    ws = Workspace.open(kb.root)
    assert said(ws, first).startswith(by_options)
    enqueue(ws, SweepRequest.from_config(ws.settings.sweeps["nightly"], ws.root))
    rows = ws.store.conn.execute(
        "SELECT sweep_run_id FROM review_jobs WHERE model_partition = 'offline'"
    ).fetchall()
    assert [r[0] for r in rows] == [first]  # not taken: that budget is for the other model
    ws.close()
    kb.write("reviewq.toml", other)  # the entry removed: `--name nightly` is refused
    ws = Workspace.open(kb.root)
    assert said(ws, first).startswith(by_options)
    ws.close()
    kb.write("reviewq.toml", other + entry + "fix = true\n")
    ws = Workspace.open(kb.root)
    edited = enqueue(ws, SweepRequest.from_config(ws.settings.sweeps["nightly"], ws.root))
    rows = ws.store.conn.execute(
        "SELECT sweep_run_id FROM review_jobs WHERE model_partition = 'offline'"
    ).fetchall()
    assert [r[0] for r in rows] == [edited.run_id]
    ws.close()


def test_a_spent_budget_run_does_not_starve_other_jobs_of_its_reviewer(kb):
    """Dispatch reads at most PREFETCH*concurrency + 16 queued jobs per reviewer, by id.
    It read a spent run's and then skipped them: with enough of them in front, a job
    enqueued later by hand (no budget) for the same reviewer was never dispatched, and a
    sweep waiting on it never ended."""
    kb.gate("prose/clarity", ["body"])
    names = [f"n{i:02d}" for i in range(25)]  # offline: concurrency 4 -> limit 8 + 16 = 24
    for name in names:
        kb.note(name)
    kb.note("zz-by-hand")
    ws = Workspace.open(kb.root)
    req = SweepRequest(
        name="nightly", reviewer="offline", all_gates=True, budget_usd=0.5,
        notes=tuple(f"kb/notes/{n}.md" for n in names),
    )  # fmt: skip
    nightly = enqueue(ws, req)
    assert len(nightly.jobs) == 25
    spend(ws.store, nightly.jobs[0].review_job_id, 0.6)  # the nightly run has spent its budget
    # An operator enqueues one note by hand, same reviewer, no budget.
    (mine,) = enqueue(
        ws, SweepRequest(name="cli", reviewer="offline", all_gates=True,
                         notes=("kb/notes/zz-by-hand.md",))
    ).jobs  # fmt: skip
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    control.dispatch()
    assert [m["job_id"] for m in sent] == [mine.review_job_id]
    ws.store.close()


def test_a_queued_job_is_not_run_by_a_profile_that_now_writes_another_partition(kb):
    """OPERATIONS: changing a profile's model or partition "starts from zero". Jobs queued
    before the change were still dispatched to the profile (dispatch opened attempts with
    no partition check, which run-job makes), so the new model's decisions were accepted
    under the old partition: the old model's coverage held another model's verdicts."""

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.write("reviewq.toml", '[reviewers.rev]\nkind = "offline"\npartition = "sonnet"\n')
    ws = Workspace.open(kb.root)
    (job,) = enqueue(ws, SweepRequest(name="cli", reviewer="rev", all_gates=True)).jobs
    ws.store.close()
    # The operator switches the profile to another model and restarts the control.
    kb.write("reviewq.toml", '[reviewers.rev]\nkind = "offline"\npartition = "opus"\n')
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    control.dispatch()
    for msg in sent:
        out = _pass_output(ws, msg["job_id"])
        control.on_outcome({"v": 4, "job_id": msg["job_id"], "attempt": msg["attempt"], "classification": "output", "output": out})  # fmt: skip
    partitions = [r[0] for r in ws.store.conn.execute("SELECT model_partition FROM acceptance")]
    assert "sonnet" not in partitions, "a review by the 'opus' profile was accepted as 'sonnet'"
    failed = ws.store.conn.execute(
        "SELECT status, failure_reasons FROM review_jobs WHERE id = ?", (job.review_job_id,)
    ).fetchone()
    assert failed["status"] == "failed"
    assert "writes partition 'opus', not the job's 'sonnet'" in failed["failure_reasons"]
    ws.store.close()


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE])
def test_a_state_folder_that_cannot_be_written_for_a_moment_does_not_fail_the_queue(
    kb, monkeypatch, code
):
    """Dispatch took only ENOSPC/EDQUOT for "every job would fail alike"; any other
    OSError from writing a prompt failed the job at once (and escalated a fix job's FAILs
    to a person). A moment of EMFILE in the control failed every queued job the dispatch
    reached, a batch at each tick: the whole night's queue."""
    kb.gate("prose/clarity", ["body"])
    for name in ("alpha", "beta", "gamma"):
        kb.note(name)
    ws = Workspace.open(kb.root)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    import orchestrator.control.attempts as attempts

    def broken(attempt_dir, prompt, shown):  # the attempt's prompt.md, written in its folder
        raise OSError(code, errno.errorcode[code])

    monkeypatch.setattr(attempts, "_write_prompt", broken)
    control.dispatch()
    monkeypatch.undo()
    statuses = [r[0] for r in ws.store.conn.execute("SELECT status FROM review_jobs")]
    assert statuses == ["queued"] * 3, statuses
    ws.store.close()


def test_a_job_with_a_long_history_of_launch_failures_is_still_backed_off(kb):
    """The backoff was computed as backoff * 2 ** (n - 1) before it was capped at 300 s: a
    job's launch_failures is never reset, and from n = 1025 on the product overflowed a
    float. Every launch-failure outcome of that job then raised, the batch was rolled
    back, the attempt stayed open until the reaper called it "never picked up by a
    worker", and the job was dispatched again: a loop with no pause of its reviewer."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    (job,) = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
    job_id = job.review_job_id
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    with ws.store.write():  # ~10 days of an expired login, this job first in line each time
        ws.store.conn.execute(
            "UPDATE review_jobs SET launch_failures = 1024 WHERE id = ?", (job_id,)
        )
    assert control.dispatch() == 1
    msg = sent[0]
    control.on_outcome({"v": 4, "job_id": job_id, "attempt": msg["attempt"], "classification": "launch-failure", "output": None, "reasons": ["could not start 'claude': No such file"]})  # fmt: skip
    row = ws.store.conn.execute(
        "SELECT status, launch_failures, not_before FROM review_jobs WHERE id = ?", (job_id,)
    ).fetchone()
    assert row["status"] == "queued" and row["launch_failures"] == 1025
    ws.store.close()


def test_a_secret_an_agent_quotes_in_a_fail_never_reaches_the_escalation_report(kb, monkeypatch):
    """finalize stored the rationale redacted (review_pairs), but handed the raw one to
    ``within`` (record_decisions), which keeps its gist in cycle_events: the escalation
    report's "- Cycle N: FAIL — {gist}" lines then quoted the key the agent printed."""
    from orchestrator.review.bundle import end_line, start_line

    secret = "sk-PLANTED-SECRET-0123456789"
    monkeypatch.setenv("REVIEWER_API_KEY", secret)
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True, fix=True))
    for _ in range(12):  # review FAIL -> fix -> re-review FAIL ... -> third rejection
        if not control.dispatch() and not sent:
            break
        msg = sent.pop(0)
        if msg["task"] == "fix":
            out = (msg["note_text"] + f"\nFixed {len(sent)}-{msg['job_id']}.\n").encode()
        else:
            note, gate = msg["pairs"][0]["note_path"], msg["pairs"][0]["gate_path"]
            out = (
                f"{start_line(note, gate)}\n- high: the note leaks {secret} in its body.\n"
                f"## Result: FAIL\n{end_line(note, gate)}\n"
            ).encode()
        control.on_outcome({"v": 4, "job_id": msg["job_id"], "attempt": msg["attempt"], "classification": "output", "output": out})  # fmt: skip
    assert ws.store.conn.execute("SELECT count(*) FROM escalations").fetchone()[0] == 1
    stored = [r[0] for r in ws.store.conn.execute("SELECT rationale FROM review_pairs")]
    assert stored and not any(secret in (s or "") for s in stored)  # redacted here...
    gists = [r[0] for r in ws.store.conn.execute("SELECT gist FROM cycle_events")]
    reports = [p.read_text() for p in (ws.state_dir / "escalations").rglob("*.md")]
    assert not any(secret in g for g in gists), gists  # ...but not here
    assert reports and not any(secret in r for r in reports)
    ws.store.close()


def test_a_negative_cost_from_a_worker_is_nobodys_spend(kb):
    """A command reviewer's telemetry file said cost_usd -0.6: the attempt kept it, and it
    lowered its run's spend against its budget (only finalize --telemetry-json refused)."""
    from orchestrator.state.status import spent_usd

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    run = enqueue(ws, SweepRequest(name="n", reviewer="offline", all_gates=True, budget_usd=1.0))
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    control.dispatch()
    msg = sent.pop(0)
    out = _pass_output(ws, msg["job_id"])
    telemetry = {"cost_usd": -0.6, "input_tokens": -5, "output_tokens": 7, "num_turns": 1}
    control.on_outcome({"v": 4, "job_id": msg["job_id"], "attempt": msg["attempt"], "classification": "output", "output": out, "telemetry": telemetry})  # fmt: skip
    row = ws.store.conn.execute(
        "SELECT cost_usd, input_tokens, output_tokens FROM attempts"
    ).fetchone()
    assert tuple(row) == (None, None, 7)
    assert spent_usd(ws.store, run.run_id) == 0
    ws.store.close()


def test_an_audit_queued_before_its_auditor_changed_partition_still_runs(kb):
    """An audit records nothing under its auditor's partition (its findings belong to the
    reviewed job's): refused at dispatch like a review, its PASSes went to a person as
    "the auditor failed without starting", with nothing wrong with the auditor."""

    conf = '[reviewers.rev]\nkind = "offline"\npartition = "sonnet"\n[reviewers.aud]\nkind = "offline"\npartition = "{aud}"\n'  # fmt: skip
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.write("reviewq.toml", conf.format(aud="a1"))
    ws = Workspace.open(kb.root)
    req = SweepRequest(name="cli", reviewer="rev", all_gates=True, auditor="aud", audit=("prose/clarity",))  # fmt: skip
    enqueue(ws, req)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    control.dispatch()
    msg = sent.pop(0)
    out = _pass_output(ws, msg["job_id"])
    control.on_outcome({"v": 4, "job_id": msg["job_id"], "attempt": msg["attempt"], "classification": "output", "output": out})  # fmt: skip
    audit = ws.store.conn.execute("SELECT id FROM review_jobs WHERE kind = 'audit'").fetchone()
    ws.store.close()
    kb.write("reviewq.toml", conf.format(aud="a2"))  # the auditor moves to another model
    ws = Workspace.open(kb.root)
    sent.clear()
    Control(ws, send_review=sent.append, hooks=FollowUp(ws)).dispatch()
    status = ws.store.conn.execute(
        "SELECT status FROM review_jobs WHERE id = ?", (audit["id"],)
    ).fetchone()[0]
    assert status == "running" and [m["task"] for m in sent] == ["audit"]
    assert ws.store.conn.execute("SELECT count(*) FROM escalations").fetchone()[0] == 0
    ws.store.close()


def test_status_says_whether_a_control_runs_and_when_a_worker_was_last_heard_from(kb, run_cli):
    """At 7 a.m. the counts have not moved: status says whether a control process holds
    the state folder, which agents run on which hosts, when a worker was last heard from,
    and how long review messages have waited untaken. state.db and the control's lock are
    the only traces of either on the control's side."""
    import fcntl
    import os

    ws, control, sent = _dispatched(kb, ["alpha", "beta"])
    out = run_cli("status").stdout
    assert "control: not running; 2 job(s) wait for one (reviewq control)" in out
    assert "workers: 0 agent(s) running; none heard from yet" in out
    assert "review queue: 2 message(s) no worker has taken yet, the oldest sent " in out
    # A message found gone from the queue is no word from a worker: a restarted Redis
    # loses messages too, and status said a worker was heard from just now with none alive.
    from orchestrator.control.attempts import taken

    taken(ws.store, [(sent[1]["job_id"], 1)], [], utcnow())
    assert json.loads(run_cli("status", "--json").stdout)["workers"]["last_heard_at"] is None

    lock = os.open(ws.state_dir / "control.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(lock, b"4242")
        first, second = sent
        beat = {"v": 4, "job_id": first["job_id"], "attempt": 1, "worker": "far:42", "host": "far"}
        control.on_messages([{**beat, "launched": True}], [])
        data = json.loads(run_cli("status", "--json").stdout)
        assert data["control"] == {
            "pid": 4242,
            "shared": None,
            "zone": None,
            "zone_said": None,
            "queue_down": None,
        }
        heard = data["workers"]
        assert (heard["agents_running"], heard["hosts"], heard["untaken"]) == (1, ["far"], 0)
        assert heard["last_heard_at"] and heard["untaken_since"] is None
        out = run_cli("status").stdout
        assert "control: running (pid 4242)" in out
        # The second message is gone from the queue, no agent of it started yet.
        assert (
            "workers: 1 agent(s) running on far, and 1 job(s) taken by a worker with no agent "
            "started yet (it waits for a free agent slot, or is starting one); last heard from "
        ) in out
        assert "review queue:" not in out

        control.on_messages([], [_outcome(ws, first), _outcome(ws, second)])
        heard = json.loads(run_cli("status", "--json").stdout)["workers"]
        assert (heard["agents_running"], heard["untaken"]) == (0, 0)
        assert heard["last_heard_at"] >= data["workers"]["last_heard_at"]
    finally:
        os.close(lock)
    assert "control: not running" in run_cli("status").stdout
    ws.close()


def test_status_hears_a_worker_that_answers_every_message_with_a_launch_failure(kb, run_cli):
    """A remote worker that could not start any agent answered each message at once, and
    status said "none heard from yet" (or a time going stale): a launch failure records no
    worker on its attempt, as no agent ran there. It is an answer: alive, and failing."""
    ws, control, sent = _dispatched(kb, ["alpha"])
    why = "worker far:42 has no reviewer profile 'offline' in its configuration"
    failure = _outcome(ws, sent[0], classification="launch-failure", reasons=[why], output=None)
    del failure["exited_at"]  # no agent started
    control.on_messages([], [failure])
    heard = json.loads(run_cli("status", "--json").stdout)["workers"]
    assert heard["last_heard_at"], heard
    assert heard["last_launch_failure"] == {
        "job_id": sent[0]["job_id"],
        "attempt": 1,
        "reasons": [why],
    }
    (line,) = [x for x in run_cli("status").stdout.splitlines() if x.startswith("workers:")]
    assert "; last heard from " in line and " s ago)" in line, line
    assert line.endswith(
        f", with a launch failure (job {sent[0]['job_id']} attempt 1: the agent did not start: "
        f"{why})"
    ), line
    ws.close()


def test_status_does_not_send_jobs_made_by_create_jobs_to_a_control(kb, run_cli):
    """Jobs made by `create-jobs` have no reviewer, and no control process runs them (a
    sweep left them queued, its pairs skipped as already queued): status said "2 job(s)
    wait for one (reviewq control)" of them, and a person who started one saw nothing run."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("beta")
    sel = run_cli("select", "--all-gates", "--model", "offline", "--json")
    made = run_cli("create-jobs", "--input", "-", "--grouping", "note", input=sel.stdout)
    assert made.exit_code == 0, made.stderr
    out = run_cli("status").stdout
    assert "wait for one (reviewq control)" not in out
    assert "control: not running\n" in out
    assert (
        "2 job(s) made by create-jobs are run by hand (reviewq run-job N, or an "
        "agent's output and reviewq finalize): no control process runs them" in out
    )
    assert json.loads(run_cli("status", "--json").stdout)["jobs_by_hand"] == 2


def _a_spent_budget(kb, also: str = "", pause: bool = False):
    """Sweep `nightly` (notes alpha and beta, ``budget_usd = 0.5``) enqueued, its first
    attempt spending the budget (it failed, queued again), its reviewer paused if
    ``pause``: the workspace (open) and the run. ``also``: more of reviewq.toml."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("beta")
    toml = '[[sweeps]]\nname = "nightly"\ncron = "0 3 * * *"\nbudget_usd = 0.5\n'
    kb.write("reviewq.toml", also + toml)
    ws = Workspace.open(kb.root)
    run = enqueue(ws, SweepRequest.from_config(ws.settings.sweeps["nightly"], ws.root))
    with ws.store.write():
        ws.store.conn.execute(
            "INSERT INTO attempts (job_id, attempt, outcome, started_at, ended_at, cost_usd) "
            "VALUES (?, 1, 'invalid-output', ?, ?, 0.5)",
            (run.jobs[0].review_job_id, utcnow(), utcnow()),
        )
        if pause:
            ws.store.conn.execute(
                "INSERT INTO reviewer_state (name, launch_failures, updated_at, paused_until, "
                "paused_reason) VALUES (?, 5, ?, '2999-01-01T00:00:00.000Z', 'auth')",
                (ws.settings.sweeps["nightly"].reviewer, utcnow()),
            )
    return ws, run


def test_status_names_the_jobs_a_spent_budget_holds_and_sends_none_to_a_control(kb, run_cli):
    """A cron sweep's budget spent in the night (it has no summary): status at 7 a.m. said
    "jobs: queued 2" and, with the control stopped, that they "wait for one (reviewq
    control)", which started ran none of them; nothing named the budget or the run that
    takes them over."""
    ws, run = _a_spent_budget(kb)
    ws.store.close()
    out = run_cli("status").stdout
    said = (
        f"2 job(s) of sweep 'nightly' (run {run.run_id}) wait: its budget of $0.5 is spent; "
        "the next run of its [[sweeps]] entry (reviewq enqueue --name nightly) takes them "
        "over (with a new --budget-usd)"
    )
    assert f"{said}\n" in out, out
    assert "wait for one (reviewq control)" not in out and "control: not running\n" in out
    # The sentence once, made where the report makes it (status.spent_budgets), and
    # given to a script as sweeps_not_run's are.
    assert json.loads(run_cli("status", "--json").stdout)["budgets_spent"] == [
        {
            "sweep": "nightly",
            "sweep_run": run.run_id,
            "budget_usd": 0.5,
            "jobs_waiting": 2,
            "says": said,
        }
    ]


def test_status_counts_a_paused_reviewers_jobs_a_spent_budget_holds_once(kb, run_cli):
    """A paused reviewer's jobs that a spent budget holds as well were taken off the jobs
    a control would run (N2) and still counted among those "for a paused reviewer": with
    another profile's job queued, status said that job waited for the pause too."""
    other = '[reviewers.other]\nkind = "offline"\npartition = "other-model"\n'
    ws, _ = _a_spent_budget(kb, other, pause=True)
    theirs = enqueue(ws, SweepRequest(name="adhoc", reviewer="other", all_gates=True))
    ws.store.close()
    out = run_cli("status").stdout
    assert len(theirs.jobs) == 2
    assert "control: not running; 2 job(s) wait for one (reviewq control)\n" in out, out


def test_status_does_not_send_a_create_jobs_job_run_job_is_running_to_a_control(kb, run_cli):
    """Once `run-job N` took a job create-jobs made it is running, not queued: status
    counted it again among the jobs that "wait for one (reviewq control)", while the
    run-job ran it (or, cut short, one alone runs it again)."""
    from orchestrator.control.attempts import open_attempt

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("beta")
    sel = run_cli("select", "--all-gates", "--model", "offline", "--json")
    made = run_cli("create-jobs", "--input", "-", "--grouping", "note", "--json", input=sel.stdout)
    first = made.json()["jobs"][0]["review_job_id"]
    ws = Workspace.open(kb.root)
    open_attempt(ws.store, ws.state_dir, ws.root, first, "host:1", partition="offline")  # run-job's
    ws.close()
    out = run_cli("status").stdout
    assert "wait for one (reviewq control)" not in out
    assert "control: not running\n" in out
    assert "2 job(s) made by create-jobs" in out
    assert json.loads(run_cli("status", "--json").stdout)["jobs_by_hand"] == 2


def _one_job_by_hand(kb, run_cli) -> int:
    """One job create-jobs made for note alpha against one gate; its id."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    sel = run_cli("select", "--all-gates", "--model", "offline", "--json")
    made = run_cli("create-jobs", "--input", "-", "--grouping", "note", "--json", input=sel.stdout)
    (job,) = made.json()["jobs"]
    return job["review_job_id"]


def test_run_job_of_a_job_whose_folder_was_deleted_writes_it_again_first(kb, run_cli):
    """A job folder is a rendering of state.db, and a person may delete one. run-job wrote
    only folders marked due, so its agent found no MANIFEST.json: the offline reviewer
    "did not start" with a FileNotFoundError at every try, and the job went back to the
    queue for good."""
    job_id = _one_job_by_hand(kb, run_cli)
    shutil.rmtree(kb.state / "jobs" / f"review-job-{job_id}")
    ran = run_cli("run-job", str(job_id), "--reviewer", "offline")
    assert ran.exit_code == 0, ran.stderr
    assert run_cli("job", str(job_id)).stdout.startswith(f"job {job_id}: completed ")
    assert (kb.state / "jobs" / f"review-job-{job_id}" / "MANIFEST.json").is_file()


def test_run_job_of_a_job_whose_manifest_was_edited_writes_it_again_first(kb, run_cli):
    """The same for a MANIFEST.json edited by hand into something else: the offline
    reviewer failed on it ("JSONDecodeError") at every try."""
    job_id = _one_job_by_hand(kb, run_cli)
    (kb.state / "jobs" / f"review-job-{job_id}" / "MANIFEST.json").write_text("{\n")
    ran = run_cli("run-job", str(job_id), "--reviewer", "offline")
    assert ran.exit_code == 0, ran.stderr
    assert run_cli("job", str(job_id)).stdout.startswith(f"job {job_id}: completed ")
    # Nor is a folder marked due for a job that has none to write, or is no job at all.
    assert run_cli("run-job", "99", "--reviewer", "offline").exit_code == 1
    assert run_cli("run-job", str(job_id), "--reviewer", "offline").exit_code == 1
    with Store.open(kb.state) as store:
        assert store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 0


def test_run_job_of_a_job_whose_folder_cannot_be_written_is_one_line(kb, run_cli):
    """A file where a job's folder was (or a full disk): M2's rewrite failed, and run-job
    went on to make the attempt's folder inside it, a NotADirectoryError traceback."""
    job_id = _one_job_by_hand(kb, run_cli)
    folder = kb.state / "jobs" / f"review-job-{job_id}"
    shutil.rmtree(folder)
    folder.write_text("not a folder\n")
    ran = run_cli("run-job", str(job_id), "--reviewer", "offline")
    assert ran.exit_code == 1
    [line] = ran.stderr.splitlines()
    assert line.startswith(f"error: job {job_id}'s folder {folder} cannot be written (") and (
        line.endswith("; nothing changed")
    ), line
    with Store.open(kb.state) as store:
        assert store.conn.execute("SELECT status FROM review_jobs").fetchone()[0] == "queued"
        assert store.conn.execute("SELECT count(*) FROM attempts").fetchone()[0] == 0


def test_jobs_and_job_name_the_profile_run_job_ran_a_create_jobs_job_with(kb, run_cli):
    """A job create-jobs made has no reviewer; run by `run-job N --reviewer offline`, it
    was listed with reviewer "-" by `jobs` and `job N`, and no line of either said which
    profile had judged its pairs."""
    job_id = _one_job_by_hand(kb, run_cli)
    ran = run_cli("run-job", str(job_id), "--reviewer", "offline")
    assert ran.exit_code == 0, ran.stderr
    (line,) = [ln for ln in run_cli("jobs").stdout.splitlines() if ln.split()[0] == str(job_id)]
    assert " (offline) " in line
    head = run_cli("job", str(job_id)).stdout.splitlines()[0]
    assert head == f"job {job_id}: completed (review, offline, reviewer -, run by hand: offline)"


def test_a_create_jobs_job_run_job_ran_and_failed_names_the_profile(kb, run_cli):
    """`jobs` and the page name the profile `run-job N --reviewer P` ran a create-jobs
    job with (R6, P10), from the job's ``runner``, which only finalize recorded: a run
    whose agent crashed failed the job with none, and `jobs`, the page's failed jobs and
    `job N` all said reviewer "-", the failures in a row on a crashing profile no one's."""
    from .test_cycles_integration import profile

    kb.write(
        "reviewq.toml", profile("crashy", partition="offline", FAKE_MODE="crash", FAKE_TURNS="1")
    )
    job_id = _one_job_by_hand(kb, run_cli)
    ran = run_cli("run-job", str(job_id), "--reviewer", "crashy")
    assert ran.exit_code != 0
    # Failed at once, its pairs free: the one line says how to have them run again.
    assert ran.stderr.splitlines()[-1].startswith(
        f"error: job {job_id} failed; its pairs are free for a new job: reviewq select "
    )
    (line,) = [ln for ln in run_cli("jobs").stdout.splitlines() if ln.split()[0] == str(job_id)]
    assert line.split()[1] == "failed" and " (crashy) " in line, line
    # Which note, and why: a morning's `jobs --state failed` of 165 rows named neither, and
    # each had to be opened with `job N` (stop 47's big night).
    (row,) = run_cli("jobs", "--state", "failed", "--json").json()["jobs"]
    assert (row["note_path"], row["notes"]) == ("kb/notes/alpha.md", 1), row
    assert row["failure_reasons"] and line.endswith(
        f"  kb/notes/alpha.md: {row['failure_reasons'][0]}"
    ), line
    head = run_cli("job", str(job_id)).stdout.splitlines()[0]
    assert head == f"job {job_id}: failed (review, offline, reviewer -, run by hand: crashy)"
    report = run_cli("report", "--since", "1h", "--json").json()
    [failed] = report["needs_you"]["failed_jobs"]
    assert (failed["id"], failed["runner"]) == (job_id, "crashy")


def test_job_names_the_person_who_finalized_a_queued_job_by_hand(kb, run_cli):
    """A sweep's job a person finalized by hand (its agent was slow) was shown as
    "reviewer offline", as if that profile had judged its pairs; its only attempt read
    "superseded", and no line named who had."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    (job,) = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
    job_id = job.review_job_id
    job_dir = ws.store.conn.execute("SELECT job_dir FROM review_jobs").fetchone()[0]
    (ws.state_dir / job_dir / "bundle-output.md").write_bytes(_pass_output(ws, job_id))
    ws.close()
    res = run_cli("finalize", "--review-job-id", str(job_id), "--runner", "me")
    assert res.exit_code == 0, res.stderr
    head = run_cli("job", str(job_id)).stdout.splitlines()[0]
    assert head == f"job {job_id}: completed (review, offline, reviewer offline, run by hand: me)"


def test_status_asks_for_a_worker_when_review_messages_wait_untaken_for_a_minute(kb, run_cli):
    ws, _control, _sent = _dispatched(kb, ["alpha"])
    assert "is a worker running" not in run_cli("status").stdout
    ws.store.conn.execute("UPDATE attempts SET started_at = '2020-01-01T00:00:00.000Z'")
    ws.store.conn.commit()
    out = run_cli("status").stdout
    assert "the oldest sent 2020-01-01T00:00:00Z (" in out
    assert "is a worker running on this queue? (reviewq doctor --worker on its machine)" in out
    ws.close()


def test_a_review_message_a_worker_refused_for_its_version_is_sent_again_at_once(kb):
    """A message another release left on the queue (an upgrade) is refused by every worker
    of this one: the attempt was reaped only a lease later, with "no heartbeat" for a
    reason. The worker's notice (in its own version) loses it now, and the job goes out
    again in this release's version; the log says which worker refused what."""
    from workers import tasks

    ws, control, sent = _dispatched(kb, ["alpha"])
    (msg,) = sent
    notice = {"v": 4, "job_id": msg["job_id"], "attempt": 1, "worker": "far:42",
              "host": "far", "refused_version": 2}  # fmt: skip
    tasks.install_control(control)
    tasks.deliver_outcome(notice)
    row = ws.store.conn.execute(
        "SELECT outcome, reasons FROM attempts WHERE job_id = ? AND attempt = 1", (msg["job_id"],)
    ).fetchone()
    assert row["outcome"] == "lost" and "refused its review message of version 2" in row["reasons"]
    assert [(m["job_id"], m["attempt"]) for m in sent[1:]] == [(msg["job_id"], 2)]
    lost = [e for e in _log(ws) if e["event"] == "attempt.lost"]
    assert lost[-1]["worker"] == "far:42" and lost[-1]["host"] == "far"

    # Told again (a second worker refused a copy), or of an attempt that runs: nothing lost.
    tasks.deliver_outcome(notice)
    beat = {"v": 4, "job_id": msg["job_id"], "attempt": 2, "worker": "near:7", "host": "near"}
    control.on_messages([{**beat, "launched": True}], [])
    tasks.deliver_outcome({**notice, "attempt": 2})
    outcomes = ws.store.conn.execute(
        "SELECT outcome FROM attempts WHERE job_id = ? ORDER BY attempt", (msg["job_id"],)
    ).fetchall()
    assert [r[0] for r in outcomes] == ["lost", "running"]
    said = [e["event"] for e in _log(ws) if e.get("worker") == "far:42"]
    assert said == ["attempt.lost", "message.refused_by_worker", "message.refused_by_worker"]
    ws.close()


def _log(ws) -> list[dict]:
    return [
        json.loads(x) for x in (ws.state_dir / "logs" / "reviewq.jsonl").read_text().splitlines()
    ]


def test_a_review_message_an_earlier_release_left_is_not_said_to_need_a_release_run(kb):
    """After an upgrade done as OPERATIONS says (everything stopped, every machine on the
    new release), the review messages the old control had left on the queue were refused
    by the new worker at error level with "run the same reviewq release on the control and
    the workers", and the job's lost attempt kept "run one reviewq release everywhere":
    advice to do what was done, sending the operator to look for an old worker that is not
    there, while the control sent the job again at once and nothing was to be done."""
    from orchestrator.control import messages
    from workers import tasks

    said = messages.refusal("review", {"v": 2, "job_id": 5, "attempt": 1})["reason"]
    assert said.startswith("a review message of version 2, this reviewq speaks 4: ")
    assert "run the same reviewq release" not in said
    assert "left on the queue by an upgrade" in said and "sends the attempt again at once" in said
    # A later release's message still asks for one release (this worker is the old one).
    assert "run the same reviewq release" in messages.refusal("review", {"v": 5})["reason"]

    ws, control, sent = _dispatched(kb, ["alpha"])
    (msg,) = sent
    tasks.install_control(control)
    tasks.deliver_outcome({"v": 4, "job_id": msg["job_id"], "attempt": 1, "worker": "w:1",
                           "host": "w", "refused_version": 2})  # fmt: skip
    (reasons,) = ws.store.conn.execute(
        "SELECT reasons FROM attempts WHERE job_id = ? AND attempt = 1", (msg["job_id"],)
    ).fetchone()
    assert "run one reviewq release everywhere" not in reasons
    assert "left on the queue by an upgrade" in reasons and "in version 4" in reasons
    ws.close()


def test_status_names_a_worker_of_another_release_whose_messages_are_refused(kb, run_cli):
    """A rolling upgrade: a worker of the earlier release still ran two agents beside the
    new control, which refused its heartbeats and outcomes (never in state.db). `status`
    said "workers: 0 agent(s) running; last heard from ... ago", as if none ran at all, and
    nothing of the refusals; the old worker's refusals of the new messages (in its own log
    beside the control's, STATE/worker/) were not told the control either."""
    from orchestrator import logs
    from orchestrator.control import messages

    ws, _control, _sent = _dispatched(kb, ["alpha"])
    assert "refused" not in run_cli("status").stdout
    beat = {"v": 2, "job_id": 1, "attempt": 1, "worker": "old:7", "host": "old"}
    logs.get().error("message.refused", **messages.refusal("heartbeat", beat))
    out = run_cli("status").stdout.splitlines()
    (line,) = [x for x in out if x.startswith("refused: ")]
    assert "a worker of another release, the last at " in line
    assert "(old:7 on old: a heartbeat message of version 2, this reviewq speaks 4)" in line
    assert "its agents are not counted above: run one reviewq release everywhere" in line
    assert out.index(line) == 1 + next(i for i, x in enumerate(out) if x.startswith("workers:"))

    # Only one said lately: a refusal of last week is no news at 7 a.m.
    log = ws.state_dir / "logs" / "reviewq.jsonl"
    log.write_text(log.read_text().replace('"timestamp": "20', '"timestamp": "19'))
    assert "refused" not in run_cli("status").stdout
    # The worker's own log beside the control's (STATE/worker/), an older worker's refusal.
    (ws.state_dir / "worker" / "logs").mkdir(parents=True)
    (ws.state_dir / "worker" / "logs" / "reviewq.jsonl").write_text(
        json.dumps({"worker": "vm:9", "message": "review", "version": 3, "expected": 2,
                    "reason": "a review message of version 3, this reviewq speaks 2: run the "
                    "same reviewq release on the control and the workers",
                    "event": "message.refused", "timestamp": utcnow()}) + "\n"
    )  # fmt: skip
    said = "(vm:9: a review message of version 3, this reviewq speaks 2)"
    assert said in run_cli("status").stdout

    # A worker of this release refusing what the earlier release left on the queue (E2):
    # nothing to do, and no worker of another release to name.
    leftover = messages.refusal("review", {"v": 2, "job_id": 1, "attempt": 1, "worker": "vm:9"})
    (ws.state_dir / "worker" / "logs" / "reviewq.jsonl").write_text(
        json.dumps({**leftover, "event": "message.refused", "timestamp": utcnow()}) + "\n"
    )
    assert "refused" not in run_cli("status").stdout
    ws.close()


def test_status_finds_a_refusal_written_after_a_damaged_line(kb, run_cli):
    """E4's reading of the log's end parsed each line whole: a `message.refused` line
    written after one cut short (a writer killed in its write, a full disk), or after
    the NULs a power loss leaves, was passed over, which `reviewq logs` finds and shows
    (O1), and status said nothing of the worker of another release."""
    from orchestrator.control import messages

    ws, _control, _sent = _dispatched(kb, ["alpha"])
    beat = {"v": 2, "job_id": 1, "attempt": 1, "worker": "old:7", "host": "old"}
    line = json.dumps(
        {**messages.refusal("heartbeat", beat), "event": "message.refused", "timestamp": utcnow()}
    ).encode()
    said = "(old:7 on old: a heartbeat message of version 2, this reviewq speaks 4)"
    log = ws.state_dir / "logs" / "reviewq.jsonl"
    with open(log, "ab") as f:
        f.write(b'{"timestamp": "2026-11-27T10:00:00.000000Z", "level": "info", "ev' + line + b"\n")
    assert said in run_cli("status").stdout
    log.write_bytes(b"\0" * 4096 + line + b"\n")
    assert said in run_cli("status").stdout
    ws.close()


def test_status_does_not_name_a_worker_for_the_outcomes_an_upgrade_left_on_the_queue(kb, run_cli):
    """An upgrade by the book (workers drained, then the control stopped before it took
    their last outcomes): the new control refused those outcomes of the earlier version
    as it started, and for ten minutes `status` said "refused: a worker of another
    release … its agents are not counted above: run one reviewq release everywhere",
    with no such worker anywhere (seen with real outcomes of version 2 on the SQLite
    queue). One still running is refused again at its next heartbeat, and said then."""
    from datetime import UTC, datetime, timedelta

    from orchestrator.control import messages
    from orchestrator.state.store import timestamp

    ws, _control, _sent = _dispatched(kb, ["alpha"])
    start = datetime.now(UTC) - timedelta(seconds=120)
    old = {"v": 2, "job_id": 1, "attempt": 1, "worker": "vm:7", "host": "vm"}

    def refused(kind: str, after_s: float) -> str:
        at = timestamp(start + timedelta(seconds=after_s))
        return json.dumps(
            {**messages.refusal(kind, old), "event": "message.refused", "timestamp": at}
        )

    started = json.dumps({"event": "control.started", "pid": 7, "timestamp": timestamp(start)})
    log = ws.state_dir / "logs" / "reviewq.jsonl"
    log.write_text(f"{started}\n{refused('outcome', 0.2)}\n{refused('heartbeat', 0.3)}\n")
    assert "refused" not in run_cli("status").stdout
    with open(log, "a") as f:  # a worker of that release still running: its next beat
        f.write(refused("heartbeat", 45) + "\n")
    assert (
        "(vm:7 on vm: a heartbeat message of version 2, this reviewq speaks 4)"
        in run_cli("status").stdout
    )
    # One with no agent refuses this release's review messages, and its notice of that is
    # refused at once, as the control starts: said then.
    old["refused_version"] = 3
    log.write_text(f"{started}\n{refused('outcome', 0.2)}\n")
    assert (
        "(vm:7 on vm: a refusal notice message of version 2, this reviewq speaks 4)"
        in run_cli("status").stdout
    )
    ws.close()


def test_a_control_starting_while_a_command_probes_its_lock_starts(tmp_path):
    """`status`, `decide`, `finalize` and `run-job` ask whether a control runs by taking
    its lock for a moment (control_pid): a control started in that moment refused to run,
    saying another already did, though none ever had."""
    import fcntl
    import os
    import threading

    from orchestrator.state.store import control_pid
    from workers.consumers import AlreadyRunning, _lock

    state = tmp_path / "state"
    state.mkdir()
    probe = os.open(state / "control.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the probe's moment, drawn out
    threading.Timer(0.1, lambda: (fcntl.flock(probe, fcntl.LOCK_UN), os.close(probe))).start()
    fd = _lock(state)
    try:
        assert control_pid(state) == os.getpid()
        with pytest.raises(AlreadyRunning):  # one that runs still refuses a second
            _lock(state)
    finally:
        os.close(fd)


class _Stops:
    """The stop requests a control made (``workers.queues.StopRequests``' calls)."""

    def __init__(self):
        self.asked, self.forgotten = [], []
        self.keys: set[tuple[int, int]] = set()  # the requests on the queue

    def ask(self, job_id, attempt, reason, opened_at=None):
        self.asked.append((job_id, attempt, reason))
        self.keys.add((job_id, attempt))

    def forget(self, job_id, attempt):
        self.forgotten.append((job_id, attempt))
        self.keys.discard((job_id, attempt))

    def pending(self):
        return sorted(self.keys)


def test_a_heartbeat_from_an_attempt_given_up_as_lost_asks_its_worker_to_stop(kb):
    """The reaper gave an attempt up as lost (no heartbeat for a lease: a slow or cut link)
    and the job runs again; the first agent, still alive, ran on to its deadline for an
    output that would be discarded. Its next heartbeat is answered with a stop request,
    said once; the outcome that follows takes the request off the queue."""
    from datetime import UTC, datetime

    ws, control, sent = _dispatched(kb, ["alpha"])
    control.stops = _Stops()
    beat = {"v": 4, "job_id": 1, "attempt": 1, "worker": "far:1", "host": "far"}
    control.on_messages([{**beat, "launched": True, "started_at": "2026-01-01T00:00:00Z"}], [])
    assert control.stops.asked == []  # a live attempt beats as it should
    control.now = lambda: datetime(2099, 1, 1, tzinfo=UTC)  # its lease long past
    assert control.reap() == 1
    control.on_messages([beat], [])
    control.on_messages([beat], [])
    reason = "the control process gave this attempt up as lost and runs the job again"
    assert control.stops.asked == [(1, 1, reason)] * 2
    assert [e for e, _ in _story(ws, 1)].count("attempt.stop_asked") == 1
    control.on_messages([], [_outcome(ws, sent[0])])
    assert control.stops.forgotten == [(1, 1)]
    ws.close()


def test_a_stop_request_set_by_a_beat_after_its_attempts_outcome_is_swept(kb):
    """A beat of an attempt given up as lost that came after the attempt's outcome (queued
    behind a slow one, or sent again by a restarted worker) set a stop request no worker
    read and nothing took off: one key more on the queue for good, each time. The reaper
    takes off a request no beat has asked again for a lease."""
    from datetime import UTC, datetime, timedelta

    ws, control, sent = _dispatched(kb, ["alpha"])
    control.stops = _Stops()
    beat = {"v": 4, "job_id": 1, "attempt": 1, "worker": "far:1", "host": "far"}
    control.on_messages([{**beat, "launched": True, "started_at": "2026-01-01T00:00:00Z"}], [])
    now = datetime(2099, 1, 1, tzinfo=UTC)
    control.now = lambda: now  # its lease long past
    assert control.reap() == 1
    control.on_messages([], [_outcome(ws, sent[0])])
    control.on_messages([beat], [])  # the late beat
    assert control.stops.keys == {(1, 1)}
    lease = timedelta(seconds=ws.settings.queue.lease_seconds)
    now += lease / 2
    control.reap()
    assert control.stops.keys == {(1, 1)}  # asked half a lease ago: an agent may yet read it
    now += lease
    control.reap()
    assert control.stops.keys == set()
    ws.close()


def test_a_second_agent_of_an_attempt_already_acted_on_is_asked_to_stop(kb):
    """A review message sent twice (a Redis send whose reply was lost, retried) ran two
    agents of one attempt; the first outcome finalized the job, and the second agent ran
    on to its deadline for an output that is discarded. Its beat is answered with a stop
    request; its outcome takes the request off the queue."""
    ws, control, sent = _dispatched(kb, ["alpha"])
    control.stops = _Stops()
    first = {"v": 4, "job_id": 1, "attempt": 1, "worker": "far:1", "host": "far"}
    control.on_messages([{**first, "launched": True, "started_at": "2026-01-01T00:00:00Z"}], [])
    control.on_messages([], [_outcome(ws, sent[0])])
    assert ws.store.conn.execute("SELECT outcome FROM attempts").fetchone()[0] == "finalized"
    second = {**first, "worker": "near:2", "host": "near"}
    control.on_messages([{**second, "launched": True, "started_at": "2026-01-01T00:00:01Z"}], [])
    ((job_id, attempt, reason),) = control.stops.asked
    assert (job_id, attempt) == (1, 1) and "(finalized) is recorded" in reason
    (said,) = _events(ws, "attempt.stop_asked")
    assert said["worker"] == "near:2"
    control.on_messages([], [_outcome(ws, sent[0], worker="near:2", host="near")])
    assert control.stops.keys == set()
    assert ws.store.conn.execute("SELECT outcome FROM attempts").fetchone()[0] == "finalized"
    ws.close()


def test_a_launch_failure_after_its_reviewer_paused_says_the_job_waits_for_the_pause(kb):
    """Attempts dispatched before a pause end in launch failures after it: each said
    `retry_in_s=5.0` while its job waited for the pause's end (an hour by default)."""
    ws, control, sent = _dispatched(kb, ["a", "b", "c", "d", "e", "f"])
    failed = [_outcome(ws, m, classification="launch-failure", output=None) for m in sent]
    limit = ws.settings.queue.launch_failures_before_pause
    control.on_messages([], failed[:limit])  # the last of these pauses the reviewer
    (paused,) = _events(ws, "reviewer.paused")
    control.on_messages([], [failed[limit]])  # dispatched before the pause, failed after
    lines = _events(ws, "attempt.launch_failed")
    assert [("retry_in_s" in e, e.get("waits_for_pause_until")) for e in lines] == [
        *[(True, None)] * (limit - 1),
        (False, paused["paused_until"]),  # the one that paused it
        (False, paused["paused_until"]),
    ]
    ws.close()


def test_a_waiting_beat_from_an_attempt_given_up_as_lost_asks_no_stop(kb):
    """A worker cut off while the message waited for a free agent slot beats `waiting`
    once the link is back: it runs no agent, and reads no stop request on such a beat. A
    request set then was said as "asked to stop the agent" of an agent that was not
    there, and stayed on the queue for good once the message expired unrun (no outcome
    follows to take it off). The agent it may yet start is asked at its first beat."""
    from datetime import UTC, datetime

    ws, control, sent = _dispatched(kb, ["alpha"])
    control.stops = _Stops()
    beat = {"v": 4, "job_id": 1, "attempt": 1, "worker": "far:1", "host": "far"}
    control.on_messages([{**beat, "launched": False, "waiting": True}], [])
    control.now = lambda: datetime(2099, 1, 1, tzinfo=UTC)  # its lease long past
    assert control.reap() == 1
    control.on_messages([{**beat, "launched": False, "waiting": True}], [])
    assert control.stops.asked == []
    assert "attempt.stop_asked" not in [e for e, _ in _story(ws, 1)]
    control.on_messages([{**beat, "launched": True, "started_at": "2099-01-01T00:00:00Z"}], [])
    assert [a[:2] for a in control.stops.asked] == [(1, 1)]
    ws.close()


def test_a_dispatch_pass_opens_its_attempts_in_one_transaction_and_sends_after_it(kb):
    """Each attempt a pass opened was a transaction of its own, and its commit most of
    the opening's cost: the pass's attempts now commit together, and each message goes
    once a reader can see the attempt it names."""
    kb.gate("prose/clarity", ["body"])
    for name in ("alpha", "beta", "gamma"):
        kb.note(name)
    ws = Workspace.open(kb.root)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    reader = Store(ws.state_dir / "state.db")
    seen: list[tuple] = []

    def send(msg: dict) -> None:
        seen.append(
            tuple(
                reader.conn.execute(
                    "SELECT outcome FROM attempts WHERE job_id = ? AND attempt = ?",
                    (msg["job_id"], msg["attempt"]),
                ).fetchone()
                or ()
            )
        )

    begun: list[str] = []
    ws.store.conn.set_trace_callback(lambda sql: sql.startswith("BEGIN") and begun.append(sql))
    control = Control(ws, send_review=send, hooks=FollowUp(ws))
    assert control.dispatch() == 3
    ws.store.conn.set_trace_callback(None)
    assert begun == ["BEGIN IMMEDIATE"]
    assert seen == [("dispatched",)] * 3
    reader.close()
    ws.close()


def test_a_send_that_fails_mid_pass_gives_the_unsent_attempts_back_at_once(kb):
    """A pass opens all its attempts before it sends: a queue that failed at the first
    message left every attempt of the pass 'dispatched' with no message, each waiting
    ~1.5 leases for the reaper (and said once each), where a send that failed used to
    leave only its own attempt so and the jobs after it queued. Those never sent are
    queued again at once; the one whose send failed (it may have gone) is the reaper's."""
    from structlog.testing import capture_logs

    kb.gate("prose/clarity", ["body"])
    for name in ("alpha", "beta", "gamma"):
        kb.note(name)
    ws = Workspace.open(kb.root)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    sent: list[int] = []

    def down(msg: dict) -> None:
        raise ConnectionError("the queue is down")

    control = Control(ws, send_review=down, hooks=FollowUp(ws))
    with capture_logs() as logged:
        assert control.dispatch() == 0
    rows = ws.store.conn.execute(
        "SELECT j.id, j.status, a.outcome FROM review_jobs j "
        "JOIN attempts a ON a.job_id = j.id AND a.attempt = j.attempt ORDER BY j.id"
    ).fetchall()
    assert [tuple(r) for r in rows] == [
        (rows[0][0], "running", "dispatched"),
        (rows[1][0], "queued", "lost"),
        (rows[2][0], "queued", "lost"),
    ]
    assert [e["event"] for e in logged].count("queue.unavailable") == 1
    control.send_review = lambda msg: sent.append(msg["job_id"])
    assert control.dispatch() == 2
    assert sent == [rows[1][0], rows[2][0]]
    ws.close()


def test_a_control_task_out_of_retries_is_not_said_to_run_again():
    """Each control.task_failed said `retry_s=3`, the last one too, after which Huey
    drops the task: an operator read a task given up as one that would run again."""
    from huey import MemoryHuey
    from structlog.testing import capture_logs

    from orchestrator import logs
    from workers import tasks

    huey = MemoryHuey(immediate=False)

    def dispatch() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    run = huey.task(retries=1, retry_delay=0, context=True)(tasks.said_on_failure(dispatch))
    logs.get()  # configured before the capture, not inside it
    with capture_logs() as logged:
        run()
        huey.execute(huey.dequeue())  # the first try: one retry left, queued again
        huey.execute(huey.dequeue())  # the last
        assert huey.dequeue() is None and huey.scheduled() == []
    said = [e for e in logged if e["event"] == "control.task_failed"]
    assert [(e.get("retry_s"), e.get("retries_left")) for e in said] == [(3, 1), (None, 0)]


# --- the control's per-job work: what it reads or makes for nothing ----------------------------


def test_dispatch_of_a_job_whose_folder_is_written_reads_it_once_and_writes_nothing(
    kb, monkeypatch
):
    """The folder an enqueue wrote and settled: dispatch looked at its MANIFEST.json
    twice and read job_files_due for it again, to write nothing. A folder due again
    (another writer marked it) is still written before its agent starts."""
    import orchestrator.control.control as control_module

    ws, job, sent, control = _one_queued_job(kb)
    folder = ws.state_dir / ws.store.conn.execute("SELECT job_dir FROM review_jobs").fetchone()[0]
    writes: list[list[int]] = []
    real_write = control_module.write_due_job_files

    def write(store, state_dir, ids=None, *args, **kwargs):  # noqa: ANN001, ANN202
        writes.append(list(ids or []))
        return real_write(store, state_dir, ids, *args, **kwargs)

    looks: list[str] = []
    real_is_file = pathlib.Path.is_file

    def is_file(self):  # noqa: ANN001, ANN202
        if self.name == "MANIFEST.json":
            looks.append(str(self))
        return real_is_file(self)

    monkeypatch.setattr(control_module, "write_due_job_files", write)
    monkeypatch.setattr(pathlib.Path, "is_file", is_file)
    assert control.dispatch() == 1
    assert [m["job_id"] for m in sent] == [job.review_job_id]
    assert writes == [] and looks == [str(folder / "MANIFEST.json")]

    # Due again with its MANIFEST.json there: written before the agent starts.
    from orchestrator.control.attempts import lose
    from orchestrator.state.files import mark_job_files_due

    with ws.store.write():
        lose(ws.store, job.review_job_id, 1, "for the test")
        mark_job_files_due(ws.store, [job.review_job_id])
    (folder / "MANIFEST.json").write_text("{}\n")
    assert control.dispatch() == 1
    assert writes == [[job.review_job_id]]
    assert json.loads((folder / "MANIFEST.json").read_text())["review_job_id"] == job.review_job_id
    assert ws.store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 0
    ws.store.close()


def test_a_written_job_folder_is_written_again_without_being_made_again(kb, monkeypatch):
    """A job's end writes the folder its dispatch found there: it was made again (the jobs
    folder, the job's folder) before its lock, three mkdirs a job for nothing."""
    import orchestrator.state.files as files

    ws, job, sent, control = _one_queued_job(kb)
    control.dispatch()
    made: list[object] = []
    real = files.make_folder
    monkeypatch.setattr(files, "make_folder", lambda *a: made.append(a) or real(*a))
    control.on_outcome(_outcome(ws, sent[0]))
    assert made == []
    manifest = ws.state_dir / ws.store.conn.execute("SELECT job_dir FROM review_jobs").fetchone()[0]
    assert json.loads((manifest / "MANIFEST.json").read_text())["status"] == "completed"
    ws.store.close()


def test_an_outcome_batch_reads_its_jobs_row_once_for_finalize(kb):
    """Finalize inside the control's batch read the job again (its checks, then its fence
    under the lock the batch already held) and its created_at a third time, for the row
    the batch had read in that same transaction."""
    ws, job, sent, control = _one_queued_job(kb)
    control.dispatch()
    said: list[str] = []
    ws.store.conn.set_trace_callback(said.append)
    control.on_outcome(_outcome(ws, sent[0]))
    ws.store.conn.set_trace_callback(None)
    reads = [s for s in said if s.startswith("SELECT") and "FROM review_jobs WHERE id" in s]
    assert not [s for s in reads if "status, attempt" in s or "created_at" in s], reads
    row = ws.store.conn.execute("SELECT status FROM review_jobs").fetchone()
    assert row[0] == "completed"
    ws.store.close()


def test_the_follow_ups_of_a_completed_job_take_what_finalize_read_and_decided(kb):
    """The follow-up check after a completed job (a fix, an escalation, an audit, the
    next bundle) read the job's row, its pairs and each PASS's acceptance again, in the
    transaction where the batch had read the row and finalize the pairs and decided them."""
    ws, job, sent, control = _one_queued_job(kb)
    control.dispatch()
    outcome = _outcome(ws, sent[0])
    said: list[str] = []
    ws.store.conn.set_trace_callback(said.append)
    control.on_outcome(outcome)
    ws.store.conn.set_trace_callback(None)
    said = said[: said.index("COMMIT")]  # the batch's transaction (its files read after)
    row_reads = [s for s in said if s.startswith("SELECT * FROM review_jobs WHERE id")]
    pair_reads = [s for s in said if "FROM review_pairs WHERE job_id" in s]
    accepted_reads = [s for s in said if s.startswith("SELECT * FROM acceptance WHERE")]
    # The batch's row; finalize's pairs; finalize's look for a person's newer decision.
    assert (len(row_reads), len(pair_reads), len(accepted_reads)) == (1, 1, 1), said
    row = ws.store.conn.execute("SELECT status FROM review_jobs").fetchone()
    assert row[0] == "completed"
    ws.store.close()


def test_a_stale_reap_notice_undoes_no_outcome_and_no_other_workers_attempt(kb):
    """A starting worker's reap notice (it killed a dead worker's agent) loses the attempt
    at once, but only while that attempt is current, dispatched or running, and last
    heard of from the dead worker: a notice about an attempt whose outcome came first (a
    worker killed after it sent it) or that another worker took up since must change
    nothing, or a finished job ran again and a live agent's work was thrown away."""
    ws, control, sent = _dispatched(kb, ["alpha", "beta", "gamma"])
    ids = [m["job_id"] for m in sent]

    def beat(job_id: int, worker: str) -> None:
        b = {
            "v": 4,
            "job_id": job_id,
            "attempt": 1,
            "worker": worker,
            "host": "h",
            "launched": True,
        }
        control.on_messages([b], [])

    def notice(job_id: int) -> None:
        control.on_outcome(
            {"v": 4, "job_id": job_id, "attempt": 1, "worker": "h:2", "host": "h", "reaped": "h:1"}
        )

    def state(job_id: int) -> tuple:
        return tuple(
            ws.store.conn.execute(
                "SELECT j.status, j.attempt, a.outcome FROM review_jobs j JOIN attempts a "
                "ON a.job_id = j.id AND a.attempt = 1 WHERE j.id = ?",
                (job_id,),
            ).fetchone()
        )

    ended, moved, dead = ids
    for job_id in ids:
        beat(job_id, "h:1")
    output = _bundle(ws.store, ended, "PASS")
    control.on_outcome({"v": 4, "job_id": ended, "attempt": 1, "classification": "output", "output": output})  # fmt: skip
    beat(moved, "h:3")  # its message put back, and taken by another worker
    before = {job_id: state(job_id) for job_id in (ended, moved)}
    for job_id in ids:
        notice(job_id)
    assert {job_id: state(job_id) for job_id in (ended, moved)} == before
    assert before[ended][0] == "completed" and before[moved] == ("running", 1, "running")
    assert state(dead) == ("queued", 1, "lost")
    assert {e["job_id"] for e in _events(ws, "attempt.reap_stale")} == {ended, moved}
    (lost,) = _events(ws, "attempt.lost")
    assert (
        lost["job_id"] == dead and "found the attempt unfinished, its agent ended" in lost["reason"]
    )
    notice(dead)  # told twice (a redelivered message): no second loss
    assert state(dead) == ("queued", 1, "lost") and len(_events(ws, "attempt.lost")) == 1
    # A message is data: a dead worker named by anything but a string loses nothing.
    control.dispatch()
    odd = {"v": 4, "job_id": dead, "attempt": 2, "worker": "h:2", "host": "h", "reaped": [1]}
    control.on_outcome(odd)
    assert (
        ws.store.conn.execute(
            "SELECT outcome FROM attempts WHERE job_id = ? AND attempt = 2", (dead,)
        ).fetchone()[0]
        == "dispatched"
    )
    ws.close()


def _a_profile_added_after_the_start(kb, notes: int) -> tuple[Workspace, Control, str]:
    """A control started with reviewq.toml naming the offline profile only, then a
    profile ``late`` added to the file and ``notes`` jobs queued for it by an enqueue
    that read the file as it is now."""
    kb.gate("prose/clarity", ["body"])
    for i in range(notes):
        kb.note(f"n{i}")
    kb.write("reviewq.toml", '[reviewers.offline]\nkind = "offline"\n')
    ws = Workspace.open(kb.root)
    control = Control(ws, send_review=lambda msg: None, hooks=FollowUp(ws))
    added = '[reviewers.offline]\nkind = "offline"\n[reviewers.late]\nkind = "offline"\n'
    kb.write("reviewq.toml", added)
    now = Workspace.open(kb.root)
    try:
        assert (
            len(enqueue(now, SweepRequest(name="cli", reviewer="late", all_gates=True)).jobs)
            == notes
        )
    finally:
        now.close()
    return ws, control, added


def _statuses(ws: Workspace) -> list[str]:
    return [r[0] for r in ws.store.conn.execute("SELECT status FROM review_jobs ORDER BY id")]


def test_jobs_waiting_for_a_restart_are_not_failed_while_the_file_is_being_edited(kb):
    """The jobs of a profile added since the control started wait for its restart; the
    file then saved half-written (the person editing on): the control's look at it failed
    them all as "reviewer profile 'late' is not configured", the failure the wait was
    there to spare, for a profile the file still names once saved whole."""
    ws, control, added = _a_profile_added_after_the_start(kb, notes=2)
    control.dispatch()
    assert _statuses(ws) == ["queued", "queued"]
    kb.write("reviewq.toml", added + "[queue\n")  # half a line saved
    control.dispatch()
    assert _statuses(ws) == ["queued", "queued"]
    kb.write("reviewq.toml", added)
    control.dispatch()
    assert _statuses(ws) == ["queued", "queued"]
    kb.write("reviewq.toml", '[reviewers.offline]\nkind = "offline"\n')  # taken out again
    control.dispatch()
    assert _statuses(ws) == ["failed", "failed"]
    ws.close()


def test_jobs_waiting_for_a_restart_are_not_read_again_at_each_dispatch(kb, monkeypatch):
    """Dispatch runs per outcome. The waiting jobs of a profile added since the start
    were read at each pass (its free slots' worth, 66) and reviewq.toml looked at once for
    each of them: a night's other outcomes each paid for jobs that cannot run. Once per
    pass now, and none of them is read."""
    import os

    ws, control, _ = _a_profile_added_after_the_start(kb, notes=20)
    config = str(kb.root / "reviewq.toml")
    looks: list[str] = []
    real_stat = os.stat

    def stat(path, *args, **kwargs):  # noqa: ANN001, ANN202
        if str(path) == config:
            looks.append(config)
        return real_stat(path, *args, **kwargs)

    control.dispatch()
    monkeypatch.setattr(os, "stat", stat)
    control.dispatch()
    monkeypatch.undo()
    assert len(looks) == 1
    assert _statuses(ws) == ["queued"] * 20
    ws.close()


def test_an_escalation_raised_in_a_batch_of_outcomes_names_its_own_job(kb, run_cli):
    """The morning walkthrough (stop 44): two jobs' last attempts failed and their
    outcomes came to the control in one batch. The escalations the second job raised were
    logged with the ids bound for the batch's first message (`escalation.raised job_id=20
    attempt=3` for job 19's pairs): `reviewq logs --job 19` showed the job failed and none
    of what it raised, and `--job 20` showed them as its own."""
    from workers.tasks import _keep

    kb.write("reviewq.toml", "[queue]\nmax_attempts = 1\n")
    ws, control, sent = _dispatched(kb, ["alpha", "beta"])
    crashed = [_outcome(ws, m, classification="no-output", output=None, exit_code=3) for m in sent]
    _keep(control, None, [("outcome", o, None, None) for o in crashed], set(), False)
    raised = dict(ws.store.conn.execute("SELECT id, job_id FROM escalations").fetchall())
    assert sorted(raised.values()) == sorted(m["job_id"] for m in sent)
    lines = (ws.state_dir / "logs" / "reviewq.jsonl").read_text().splitlines()
    said = [e for e in map(json.loads, lines) if e["event"] == "escalation.raised"]
    assert {e["escalation_id"]: e["job_id"] for e in said} == raised
    assert all("attempt" not in e or e["job_id"] == sent[0]["job_id"] for e in said), said
    for m in sent:
        told = run_cli("logs", "--job", str(m["job_id"]), "--event", "escalation.").stdout
        assert len(told.splitlines()) == 1, told
    ws.close()


def test_each_outcome_of_a_batch_is_logged_with_its_own_attempt(kb):
    """The morning walkthrough (stop 44) again: `job.retrying` and `job.failed` of a
    batch's outcomes name their job but not their attempt, so the batch's first message's
    attempt (bound for the task) was merged into the others' lines, and `job.failed`,
    written after the commit, had none. Job alpha's second attempt and beta's first fail
    in one batch: each line says its own."""
    from workers.tasks import _keep

    kb.write("reviewq.toml", "[queue]\nmax_attempts = 2\n")
    ws, control, sent = _dispatched(kb, ["alpha", "beta"])
    alpha, beta = sent

    def failed(m):
        return _outcome(ws, m, classification="no-output", output=None, exit_code=3)

    control.on_messages([], [failed(alpha)])
    assert control.dispatch() == 1
    again = sent[-1]
    assert (again["job_id"], again["attempt"]) == (alpha["job_id"], 2)
    _keep(control, None, [("outcome", failed(m), None, None) for m in (again, beta)], set(), False)
    lines = (ws.state_dir / "logs" / "reviewq.jsonl").read_text().splitlines()
    said = {
        (e["event"], e["job_id"]): e.get("attempt")
        for e in map(json.loads, lines)
        if e["event"] in ("job.retrying", "job.failed")
    }
    assert said == {
        ("job.retrying", alpha["job_id"]): 1,
        ("job.failed", alpha["job_id"]): 2,
        ("job.retrying", beta["job_id"]): 1,
    }, said
    ws.close()


def test_a_pause_over_agents_that_crash_at_once_names_their_jobs(kb):
    """A `command` reviewer that crashes on one note, whose jobs are the last of the run:
    nothing answers after them to prove the worker sound, so they pause the profile (U45
    after C27–C30). The pause quoted the crash alone ("its agent failed to start on far:
    exited 139 … Segmentation fault"): at 7 a.m. it read as a broken reviewer, where the
    other jobs had answered and one note was at fault. It names the jobs, their notes and
    counts, as a pause over the memory limit does (L48)."""
    from datetime import datetime

    clock = [datetime(2030, 1, 2, 3, 0).astimezone()]
    ws, control, sent = _dispatched(kb, ["crashes", "fine"], now=lambda: clock[0])
    crashes, fine = sent
    control.on_messages([], [_outcome(ws, fine)])  # the profile answered, then
    _crashed(ws, control, crashes)
    assert _until_settled(ws, control, sent, crashes["job_id"], clock) == "queued"
    paused, *_ = _events(ws, "reviewer.paused")  # and again after each pause: bounded above
    job = crashes["job_id"]
    assert paused["reason"].endswith(
        "; since reviewer offline last answered, its agent exited at once on "
        f"job {job} (kb/notes/crashes.md, 5 time(s): reviewq job {job})"
    ), paused["reason"]
    # The pause after ten, as status said it while in force; ended by the control's clock
    # (U84), which runs ahead of status's here, it is said once more as it ends.
    again = [e["reason"] for e in _events(ws, "reviewer.paused")][1]
    assert again.endswith(f"kb/notes/crashes.md, 10 time(s): reviewq job {job})"), again
    assert again in [e["reason"] for e in _events(ws, "reviewer.pause_ended")]
    ws.close()


@pytest.fixture
def berlin(monkeypatch):
    """The local clock of Europe/Berlin, whose daylight time a cron's next time crosses."""
    with local_clock(monkeypatch, "Europe/Berlin"):
        yield


@pytest.mark.parametrize(
    ("cron", "now", "after"),
    [
        # The spring change skips 02:30: it runs at 03:00, the first minute there is.
        ("30 2 * * *", "2026-03-28T12:00:00+01:00", "2026-03-29T03:00:00+02:00"),
        # The autumn change repeats 02:30: run at the first, the next is tomorrow's.
        ("30 2 * * *", "2026-10-25T02:40:00+01:00", "2026-10-26T02:30:00+01:00"),
        # A wildcard hour runs by the clock as it reads again (cron(8)): both 02:30s.
        ("30 * * * *", "2026-10-25T02:40:00+02:00", "2026-10-25T02:30:00+01:00"),
        ("0 2 * * *", "2026-11-29T02:00:00+01:00", "2026-11-30T02:00:00+01:00"),
        ("0 2 29 2 *", "2026-11-29T02:00:00+01:00", "2028-02-29T02:00:00+01:00"),
        # Refused when the settings load (the entry left out); if it came here, no time.
        ("0 2 30 2 *", "2026-11-29T02:00:00+01:00", None),
    ],
)
def test_a_cron_sweeps_next_time_is_the_one_its_control_fires(berlin, cron, now, after):
    from datetime import datetime

    from orchestrator.sweeps.producer import next_match

    after = after and datetime.fromisoformat(after)
    assert next_match(cron, datetime.fromisoformat(now)) == after


def test_status_says_each_cron_sweeps_last_run_and_next_time(kb, berlin):
    """`status` said of a `[[sweeps]]` entry only a missed night or a spent budget: after a
    config change an operator could not tell whether the entry was read, when it last ran
    and with what, nor when it runs next."""
    from .conftest import reviewq_process

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.write(
        "reviewq.toml",
        '[[sweeps]]\nname = "nightly"\ncron = "0 2 * * *"\n'
        '[[sweeps]]\nname = "lens"\ncron = "30 4 * * 1"\nselect = ["prose"]\n',
    )
    res = reviewq_process("--root", str(kb.root), "enqueue", "--name", "nightly")
    assert res.returncode == 0, res.stderr
    res = reviewq_process("--root", str(kb.root), "status", "--json")
    assert res.returncode == 0, res.stderr
    nightly, lens = json.loads(res.stdout)["sweeps"]
    assert (nightly["sweep"], nightly["cron"], lens["sweep"]) == ("nightly", "0 2 * * *", "lens")
    assert (nightly["last_run"]["id"], nightly["last_run"]["jobs"]) == (1, 1), nightly
    assert nightly["last_run"]["trigger"] == "enqueue" and lens["last_run"] is None
    assert nightly["next_wall"].endswith(("T02:00+01:00", "T02:00+02:00")), nightly
    assert nightly["next_at"] > nightly["last_run"]["started_at"]
    text = reviewq_process("--root", str(kb.root), "status").stdout
    (line,) = [x for x in text.splitlines() if x.startswith("sweep 'nightly'")]
    assert (
        line.startswith("sweep 'nightly' (0 2 * * *): last ran ")
        and "Z; run 1, 1 job(s), by reviewq enqueue), next 02:00 on " in line
    )
    assert ", next 02:00 on " in line and line.endswith("on this machine's clock (Europe/Berlin)")
    (line,) = [x for x in text.splitlines() if x.startswith("sweep 'lens'")]
    assert line.startswith("sweep 'lens' (30 4 * * 1): never run yet, next 04:30 on "), line
