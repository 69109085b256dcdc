"""Kills at random moments (CONTRACT §6, §12: "worker killed at any moment, control killed
mid-finalize: no partial acceptance; the job finishes after restart").

The short campaign here is the CI version of ``scripts/kill_campaign.py``: ~48 one-pair
jobs, a real control process and two real worker processes, 4 SIGKILLs at seeded random
moments, each killed process restarted at once, the drain awaited with a sweep, and every
invariant read back from state.db, the log and /proc.
"""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

from orchestrator.control.attempts import open_attempt
from orchestrator.review.bundle import end_line, start_line
from orchestrator.review.finalize import finalize
from orchestrator.state.workspace import Workspace
from orchestrator.sweeps.producer import SweepRequest, enqueue

from .harness import (
    CampaignConfig,
    build_kb,
    format_row,
    header,
    run_campaign,
    state_db,
    write_config,
)

pytestmark = pytest.mark.integration
SEED = int(os.environ.get("REVIEWQ_KILL_SEED", "7"))


def _report(res) -> str:
    return (
        f"\n{header()}\n{format_row(res.row())}\nkills: {res.kills}\n"
        f"attempts: {res.check.attempts}\nerror events: {res.check.error_events}\n"
        f"folder: {res.root}"
    )


def _assert_campaign(res) -> None:
    problems = res.violations()
    assert not problems, "\n".join(problems) + _report(res)
    c = res.check
    # The kills hit while there was work to lose, and the system still did all of it.
    assert res.kills_with_work_open >= 1, _report(res)
    assert c.losses == [] and c.not_terminal == [], _report(res)
    assert c.job_status.get("completed", 0) >= res.enqueued_jobs, _report(res)


@pytest.mark.timeout(240)
def test_short_kill_campaign_loses_and_duplicates_nothing(tmp_path):
    res = run_campaign(
        CampaignConfig(seed=SEED, jobs=48, gates=4, kills=4, workers=2, threads=2),
        workdir=tmp_path,
    )
    print(_report(res))
    _assert_campaign(res)
    assert res.check.accepted == 48 and res.enqueued_jobs == 48


@pytest.mark.timeout(240)
def test_short_kill_campaign_on_redis(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (CI installs it with apt)")
    from .harness import RedisServer

    redis = RedisServer(tmp_path / "redis.sock", tmp_path / "redis")
    redis.start()
    try:
        res = run_campaign(
            CampaignConfig(
                seed=SEED + 1, jobs=40, gates=4, kills=3, workers=2, threads=2, queue_url=redis.url
            ),
            workdir=tmp_path,
        )
    finally:
        redis.stop()
    print(_report(res))
    _assert_campaign(res)
    assert res.check.accepted == 40
    assert not (res.root / ".reviewq" / "queue").exists()  # the queue really was Redis


@pytest.mark.timeout(240)
def test_short_kill_campaign_with_fixes(tmp_path):
    """Fixes and re-reviews, which dispatch takes before first reviews (C101-C103), under
    the same kills: nothing lost or accepted twice of one text, each fix written once."""
    res = run_campaign(
        CampaignConfig(seed=SEED + 2, jobs=48, gates=4, kills=4, workers=2, threads=2, fix=True),
        workdir=tmp_path,
    )
    print(_report(res))
    _assert_campaign(res)
    with contextlib.closing(state_db(res.root)) as conn:
        fixed = {r[0] for r in conn.execute("SELECT path FROM fix_writes")}
    # Each FAILing note (every other one) fixed. Not every pair PASSes in the end: a first
    # review ending after its note's fix judged the text replaced (RELIABILITY, the review
    # of stop 50's dispatch order).
    assert fixed == {f"kb/notes/note-{n:04d}.md" for n in range(0, 12, 2)}, _report(res)


def _bundle_output(pairs: list[tuple[str, str]]) -> bytes:
    blocks = []
    for note_path, gate_path in pairs:
        blocks.append(
            f"{start_line(note_path, gate_path)}\nSummary: fine.\nFindings:\n- low: none\n"
            f"## Result: PASS\n{end_line(note_path, gate_path)}\n"
        )
    return "\n".join(blocks).encode()


def test_enqueue_races_finalize(tmp_path, monkeypatch):
    """Deterministic form of what the kill campaign's final sweep hits about one seed in
    two: the control process commits a finalize between the enqueue's select and its
    create_jobs. The pair is fresh by then; enqueueing it again is not idempotent."""
    root = tmp_path / "kb"
    (pair,) = build_kb(root, notes=1, gates=1)
    write_config(root)
    ws = Workspace.open(root)
    req = SweepRequest(name="cli", reviewer="fake", all_gates=True, trigger="enqueue")
    first = enqueue(ws, req)
    assert len(first.jobs) == 1
    job_id = first.jobs[0].review_job_id

    import orchestrator.sweeps.producer as sweeps

    real_create_jobs = sweeps.create_jobs

    def finalize_lands_now(*args, **kwargs):
        # The control process finalizes the pair's job after select read the acceptance
        # table and before create_jobs looks at the open jobs.
        opened = open_attempt(ws.store, ws.state_dir, ws.root, job_id, "fake")
        gate_path = ws.store.conn.execute(
            "SELECT gate_path FROM review_pairs WHERE job_id = ?", (job_id,)
        ).fetchone()[0]
        res = finalize(
            ws.store,
            ws.state_dir,
            job_id,
            _bundle_output([(pair[0], gate_path)]),
            attempt=opened.attempt,
            fail_on_invalid=False,
        )
        assert res.ok, res.failure_reasons
        return real_create_jobs(*args, **kwargs)

    monkeypatch.setattr(sweeps, "create_jobs", finalize_lands_now)
    second = enqueue(ws, SweepRequest(name="cli", reviewer="fake", all_gates=True))
    ws.store.close()
    # The pair was accepted a moment before the second enqueue created its jobs.
    assert [j.review_job_id for j in second.jobs] == []


def test_two_enqueues_at_once_pack_a_pair_once(tmp_path, monkeypatch):
    """The other face of the race above: CONTRACT §4 "a pair already in a queued or running
    job is not packed again". The second enqueue commits its job after the first selected
    the pair and before the first takes the write lock (from there on, the first reads the
    open jobs and writes its own in one transaction)."""
    root = tmp_path / "kb"
    build_kb(root, notes=1, gates=1)
    write_config(root)
    ws = Workspace.open(root)
    other = Workspace.open(root)  # another process: its own connection to state.db
    req = SweepRequest(name="cli", reviewer="fake", all_gates=True, trigger="enqueue")

    import orchestrator.sweeps.producer as sweeps

    real_select = sweeps.select
    landed = []

    def other_enqueue_lands_now(*args, **kwargs):
        seen = real_select(*args, **kwargs)
        if not landed:
            landed.append(True)
            assert (
                len(enqueue(other, SweepRequest(name="cron", reviewer="fake", all_gates=True)).jobs)
                == 1
            )
        return seen

    monkeypatch.setattr(sweeps, "select", other_enqueue_lands_now)
    mine = enqueue(ws, req)
    open_jobs = ws.store.conn.execute(
        "SELECT count(*) FROM review_jobs WHERE status IN ('queued', 'running')"
    ).fetchone()[0]
    ws.store.close()
    other.store.close()
    assert mine.jobs == [] and open_jobs == 1
