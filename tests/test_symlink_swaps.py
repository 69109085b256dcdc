"""Symlinks swapped while a job runs (check, then use): a folder of notes, or a note,
replaced by a link leading outside the KB after reviewq checked its path and before it
read or wrote it. The swap is made at a hook point (a patched function that returns
first, then swaps), never by a race."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import orchestrator.cycles.fixes as fixes
import orchestrator.kb.notes as notes
from orchestrator.control.control import Control
from orchestrator.control.followup import FollowUp
from orchestrator.kb.notes import KB
from orchestrator.review.bundle import end_line, start_line
from orchestrator.state.workspace import Workspace
from orchestrator.sweeps.producer import SweepRequest, enqueue
from tests.test_followup_files import _run

SECRET = "The outside file's text, never the KB's.\n"


@pytest.fixture(params=["proc", "resolved"])
def checked_by(request, monkeypatch):
    """How a KB read tells where the file it opened is: Linux's /proc/self/fd, or (any
    other system) its path resolved again and compared with the descriptor."""
    if request.param == "resolved":
        monkeypatch.setattr(notes, "opened_at", lambda fd: None)
    return request.param


def _bundle(ws: Workspace, job_id: int, decision: str) -> bytes:
    blocks = []
    for note, gate in ws.store.conn.execute(
        "SELECT note_path, gate_path FROM review_pairs WHERE job_id = ? ORDER BY id", (job_id,)
    ):
        blocks.append(
            f"{start_line(note, gate)}\n- high: thin.\n## Result: {decision}\n{end_line(note, gate)}\n"
        )
    return "\n".join(blocks).encode()


def _dispatched(kb) -> tuple[Workspace, Control, object, dict, list[dict]]:  # noqa: ANN001
    """A one-pair job of a new KB, its first attempt dispatched by a control whose review
    messages are kept: the workspace, the control, the job, that message and the list
    the control's next messages go to."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    (job,) = enqueue(ws, SweepRequest(name="cli", all_gates=True)).jobs
    control.dispatch()
    return ws, control, job, sent.pop(0), sent


def _move_out(folder: Path, outside: Path, text: str | None = None) -> Path:
    """A person's move of ``folder`` out of the KB, a link left in its place; ``text``
    (given) replaces every note's body there, a file that was never the KB's."""
    shutil.move(folder, outside)
    folder.symlink_to(outside, target_is_directory=True)
    if text is not None:
        for md in outside.glob("*.md"):
            head, _ = md.read_text().rsplit("---\n", 1)
            md.write_text(f"{head}---\n{text}")
    return outside


def test_a_folder_of_notes_linked_out_between_its_check_and_its_read_sends_no_outside_text(
    kb, tmp_path, monkeypatch, checked_by
):
    """Packing checked kb/notes/sub/beta.md's path inside the KB (check_rel); before its
    read a person moved the folder out of the KB and left a link (or anything else did).
    The read followed the link: the outside file's text became the note's snapshot and
    went into the prompt, sent to the model (F11's check is of the path, not the read)."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("sub/beta", body="Beta body.\n")
    sub = kb.root / "kb" / "notes" / "sub"
    check = KB.check_rel

    def check_then_swap(self, rel):
        checked = check(self, rel)
        if rel == "kb/notes/sub/beta.md" and not sub.is_symlink():
            _move_out(sub, tmp_path / "elsewhere", SECRET)
        return checked

    monkeypatch.setattr(KB, "check_rel", check_then_swap)
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    enqueue(ws, SweepRequest(name="cli", all_gates=True))
    assert sub.is_symlink()
    control.dispatch()
    texts = [t for (t,) in ws.store.conn.execute("SELECT text FROM snapshots")]
    assert texts and not any(SECRET in (t or "") for t in texts)
    prompts = [p.read_text() for p in kb.state.rglob("prompt.md")]
    assert prompts and not any(SECRET in p for p in prompts)
    assert not any(SECRET in str(m) for m in sent)
    notes = {n for (n,) in ws.store.conn.execute("SELECT note_path FROM review_pairs")}
    assert notes == {"kb/notes/alpha.md"}  # alpha is reviewed still
    ws.close()


def _sub_note_failed(kb):
    """kb/notes/sub/beta.md reviewed FAIL in a run with --fix: its fix job is next."""
    kb.gate("prose/clarity", ["body"])
    kb.note("sub/beta", body="Beta body.\n")
    ws = Workspace.open(kb.root)
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    (job,) = enqueue(ws, SweepRequest(name="cli", all_gates=True, fix=True)).jobs
    _run(control, sent, _bundle(ws, job.review_job_id, "FAIL"))
    return ws, control, sent


@pytest.mark.parametrize("what", ["folder", "note"])
def test_a_path_linked_out_between_the_fix_writes_check_and_its_write_writes_nothing_outside(
    kb, tmp_path, monkeypatch, what, checked_by
):
    """The fix's write resolved the note's path inside the KB, then (a person moving the
    folder, or the note, out of the KB and leaving a link; the same text there) read and
    replaced it by the path: the fix was written into the file outside the KB, and the
    job said "applied". The person's change is to be kept and the fix not applied."""
    ws, control, sent = _sub_note_failed(kb)
    sub = kb.root / "kb" / "notes" / "sub"
    note = sub / "beta.md"
    given = note.read_text()
    resolve = fixes._named_file

    def resolve_then_swap(root, rel):
        found = resolve(root, rel)
        if what == "folder":
            _move_out(sub, tmp_path / "elsewhere")
        else:
            shutil.move(note, tmp_path / "beta.md")
            note.symlink_to(tmp_path / "beta.md")
        return found

    monkeypatch.setattr(fixes, "_named_file", resolve_then_swap)
    fix = _run(control, sent, (given + "Fixed.\n").encode())["job_id"]
    outside = tmp_path / ("elsewhere/beta.md" if what == "folder" else "beta.md")
    assert outside.read_text() == given
    assert not list(outside.parent.glob(".beta.md.*"))  # no temp file left there either
    row = ws.store.conn.execute("SELECT result FROM review_jobs WHERE id = ?", (fix,)).fetchone()
    assert row[0] == "not-applied"
    assert ws.store.conn.execute("SELECT count(*) FROM fix_writes_due").fetchone()[0] == 0
    ws.close()


def test_a_job_folder_swapped_for_a_link_is_not_written_through(kb, tmp_path):
    """A job's folder replaced by a link to a folder elsewhere while its job ran (an
    agent's doing, or a person's): the control wrote the job's MANIFEST.json over the
    one out there and renamed that folder's own results/ aside and removed it. A job's
    files are written in the state folder only; the link's folder is left as it was
    and the job's files wait, the reason said, until the link is gone."""
    ws, control, job, msg, sent = _dispatched(kb)
    folder = kb.state / "jobs" / f"review-job-{job.review_job_id}"
    elsewhere = tmp_path / "persons"
    (elsewhere / "results").mkdir(parents=True)
    (elsewhere / "results" / "mine.txt").write_text("a person's file\n")
    (elsewhere / "MANIFEST.json").write_text("{}\n")
    shutil.rmtree(folder)
    folder.symlink_to(elsewhere, target_is_directory=True)
    control.on_outcome(
        {
            "job_id": msg["job_id"],
            "attempt": msg["attempt"],
            "classification": "output",
            "output": _bundle(ws, job.review_job_id, "PASS"),
        }
    )
    control.write_due_files()
    assert (elsewhere / "results" / "mine.txt").read_text() == "a person's file\n"
    assert (elsewhere / "MANIFEST.json").read_text() == "{}\n"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["MANIFEST.json", "results"]
    (error,) = [
        e
        for (e,) in ws.store.conn.execute(
            "SELECT error FROM job_files_due WHERE job_id = ?", (job.review_job_id,)
        )
    ]
    assert "a link" in error and str(folder) in error
    decided = ws.store.conn.execute(
        "SELECT decision FROM review_pairs WHERE job_id = ?", (job.review_job_id,)
    ).fetchall()
    assert [d[0] for d in decided] == ["PASS"]  # the review itself is kept
    folder.unlink()  # the person's way out: the next tick writes it in the state folder
    control.write_due_files()
    assert (folder / "results").is_dir() and not folder.is_symlink()
    ws.close()


@pytest.mark.parametrize("linked", ["attempt", "job"])
def test_an_attempt_folder_swapped_for_a_link_is_not_written_through(kb, tmp_path, linked):
    """The attempt's folder (or its job's) replaced by a link to a folder elsewhere while
    the attempt ran: the control wrote the attempt's output and logs over the files of the
    same names out there. They are evidence only: not written, said in the log, and the
    review is decided from the output the message carries."""
    ws, control, job, msg, sent = _dispatched(kb)
    folder = kb.state / "jobs" / f"review-job-{job.review_job_id}"
    elsewhere = tmp_path / "persons"
    moved = folder if linked == "job" else folder / "attempt-1"
    shutil.move(moved, elsewhere)
    attempt = elsewhere / "attempt-1" if linked == "job" else elsewhere
    (attempt / "bundle-output.md").write_text("a person's file\n")
    (attempt / "stdout.log").write_text("a person's log\n")
    moved.symlink_to(elsewhere, target_is_directory=True)
    with capture_logs() as logged:
        control.on_outcome(
            {
                "job_id": msg["job_id"],
                "attempt": msg["attempt"],
                "classification": "output",
                "output": _bundle(ws, job.review_job_id, "PASS"),
                "files": {"stdout.log": b"the agent's log\n"},
            }
        )
    (said,) = [e for e in logged if e["event"] == "attempt.files_unwritten"]
    assert f"a link to {elsewhere}" in said["error"] and "left unwritten" in said["error"]
    assert (attempt / "bundle-output.md").read_text() == "a person's file\n"
    assert (attempt / "stdout.log").read_text() == "a person's log\n"
    decided = ws.store.conn.execute(
        "SELECT decision FROM review_pairs WHERE job_id = ?", (job.review_job_id,)
    ).fetchall()
    assert [d[0] for d in decided] == ["PASS"]
    ws.close()


def test_a_note_a_person_saves_while_a_sweep_reads_it_is_not_called_outside_the_kb(
    kb, monkeypatch, checked_by
):
    """R13's check of the file read: a person's editor saved the note (a new file renamed
    over it, as vim and most editors do) between the read's open and its check. The path
    then named another file than the one opened, and the note was left out of the sweep
    with "outside the KB root (through a symlink)": no link anywhere, and no review."""
    import os

    kb.gate("prose/clarity", ["body"])
    note = kb.root / kb.note("alpha", "As first saved.\n")
    opened = notes.open_regular
    saved: list[str] = []

    def open_then_save(path, *args, **kwargs):
        fd = opened(path, *args, **kwargs)
        if path == note and not saved:
            new = note.with_name(".alpha.md.swp")
            new.write_text(note.read_text().replace("As first saved.", "As saved again."))
            os.replace(new, note)
            saved.append(str(path))
        return fd

    monkeypatch.setattr(notes, "open_regular", open_then_save)
    ws = Workspace.open(kb.root)
    res = enqueue(ws, SweepRequest(name="cli", all_gates=True))
    assert saved
    assert [p for p in res.problems if "outside" in p.reason] == []
    notes_queued = {n for (n,) in ws.store.conn.execute("SELECT note_path FROM review_pairs")}
    assert notes_queued == {"kb/notes/alpha.md"}
    ws.close()


def test_a_kb_and_state_folder_reached_through_links_are_written_as_before(
    kb, tmp_path, checked_by
):
    """The links a machine is set up with, not swapped: the KB root given through a linked
    parent, the state folder a link (/var/lib/reviewq -> /srv/reviewq) and its jobs/ one
    to another disk. A job's files, its attempt's files and its notes' reads go on as
    before R13-R17 (only a job's or attempt's own folder may not be a link)."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    state = tmp_path / "srv-state"
    (tmp_path / "other-disk-jobs").mkdir()
    state.mkdir()
    (state / "jobs").symlink_to(tmp_path / "other-disk-jobs", target_is_directory=True)
    kb.state.symlink_to(state, target_is_directory=True)
    (tmp_path / "via").symlink_to(tmp_path, target_is_directory=True)
    ws = Workspace.open(tmp_path / "via" / "kbroot")
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    (job,) = enqueue(ws, SweepRequest(name="cli", all_gates=True)).jobs
    texts = [t for (t,) in ws.store.conn.execute("SELECT text FROM snapshots")]
    assert texts and all(t for t in texts)
    _run(
        control,
        sent,
        _bundle(ws, job.review_job_id, "PASS"),
        files={"stdout.log": b"the agent's log\n"},
    )
    control.write_due_files()
    folder = tmp_path / "other-disk-jobs" / f"review-job-{job.review_job_id}"
    assert (folder / "attempt-1" / "stdout.log").read_bytes() == b"the agent's log\n"
    assert (folder / "MANIFEST.json").is_file() and (folder / "results").is_dir()
    assert ws.store.conn.execute("SELECT count(*) FROM job_files_due").fetchone()[0] == 0
    decided = ws.store.conn.execute(
        "SELECT decision FROM review_pairs WHERE job_id = ?", (job.review_job_id,)
    ).fetchall()
    assert [d[0] for d in decided] == ["PASS"]
    ws.close()


def test_a_job_folder_swapped_for_a_link_gets_no_retrys_prompt_through_it(kb, tmp_path):
    """R15 and R17's link, met by the next attempt's dispatch: the job folder replaced by a
    link to a folder elsewhere while attempt 1 ran (an agent's doing), the attempt failed,
    and the retry's dispatch made attempt-2/ out there and wrote its prompt into it, the
    note's text with it, then sent the job to run. Nothing is written through the link;
    the job is not run through it, and says why."""
    ws, control, job, msg, sent = _dispatched(kb)
    folder = kb.state / "jobs" / f"review-job-{job.review_job_id}"
    elsewhere = tmp_path / "persons"
    shutil.move(folder, elsewhere)
    folder.symlink_to(elsewhere, target_is_directory=True)
    before = sorted(p.relative_to(elsewhere) for p in elsewhere.rglob("*"))
    control.on_outcome(
        {
            "job_id": msg["job_id"],
            "attempt": msg["attempt"],
            "classification": "no-output",
            "exit_code": 1,
        }
    )
    with ws.store.write():  # its retry due now
        ws.store.conn.execute("UPDATE review_jobs SET not_before = NULL")
    with capture_logs() as logged:
        control.dispatch()
    assert sorted(p.relative_to(elsewhere) for p in elsewhere.rglob("*")) == before
    assert sent == []
    said = [e for e in logged if e.get("job_id") == job.review_job_id and "reason" in e]
    assert said and f"a link to {elsewhere}" in said[0]["reason"]
    ws.close()
