"""The control process's dispatch, in-process (no queue): what a full disk does to it."""

from __future__ import annotations

import errno
import pathlib

from orchestrator.control.control import Control
from orchestrator.control.followup import FollowUp
from orchestrator.state.workspace import Workspace
from orchestrator.sweeps.producer import SweepRequest, enqueue


def test_a_full_disk_at_dispatch_leaves_the_job_queued_until_there_is_room(kb, monkeypatch):
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    (job,) = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    real_write_text = pathlib.Path.write_text

    def disk_full(self, *args, **kwargs):
        if self.name == "prompt.md":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", disk_full)
    control.dispatch()
    row = ws.store.conn.execute(
        "SELECT status, attempt FROM review_jobs WHERE id = ?", (job.review_job_id,)
    ).fetchone()
    assert tuple(row) == ("queued", 0) and sent == []
    assert ws.store.conn.execute("SELECT count(*) FROM attempts").fetchone()[0] == 0

    monkeypatch.setattr(pathlib.Path, "write_text", real_write_text)
    control.dispatch()
    assert [m["job_id"] for m in sent] == [job.review_job_id]
    assert sent[0]["attempt"] == 1
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
