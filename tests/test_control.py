"""The control process's dispatch, in-process (no queue): what a full disk does to it."""

from __future__ import annotations

import errno
import pathlib

from orchestrator.control import Control
from orchestrator.followup import FollowUp
from orchestrator.sweeps import SweepRequest, enqueue
from orchestrator.workspace import Workspace


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
