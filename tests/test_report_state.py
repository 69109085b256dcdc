"""The morning report over a small state.db made by hand (the real schema, fixed clocks):
what it tells a person to do, which period it covers, and how it scales."""

from __future__ import annotations

import json
import shutil

import pytest
from markupsafe import escape

from orchestrator.config import load_settings
from orchestrator.report import make_report, render
from orchestrator.state.store import Store

T = "2026-11-25T{}:00.000Z"  # T.format("07:00") -> 07:00 UTC on the 25th


@pytest.fixture
def st(tmp_path):
    store = Store(tmp_path / "state.db")
    (tmp_path / "escalations").mkdir()
    yield store, tmp_path
    store.conn.close()


def job(
    store,
    jid,
    *,
    created,
    finished=None,
    status="completed",
    kind="review",
    reviewer="claude",
    sweep="nightly",
    run=None,
):
    store.conn.execute(
        "INSERT INTO review_jobs (id, kind, status, model_partition, grouping, lens, reviewer, job_dir, "
        "attempt, sweep, sweep_run_id, created_at, updated_at, finished_at) "
        "VALUES (?, ?, ?, 'p', 'note', 'prose', ?, ?, 1, ?, ?, ?, ?, ?)",
        (
            jid,
            kind,
            status,
            reviewer,
            f"jobs/review-job-{jid}",
            sweep,
            run,
            created,
            finished or created,
            finished,
        ),
    )


def attempt(store, jid, n, *, started, ended, outcome="finalized", cost=None):
    store.conn.execute(
        "INSERT INTO attempts (job_id, attempt, outcome, started_at, ended_at, cost_usd) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (jid, n, outcome, started, ended, cost),
    )


def failed_job(store, jid, reasons, gates, note="kb/notes/a.md"):
    """A review job that failed at 01:05 for ``reasons``, with one pair per gate of ``note``."""
    job(store, jid, created=T.format("01:00"), finished=T.format("01:05"), status="failed")
    store.conn.execute(
        "UPDATE review_jobs SET failure_reasons = ? WHERE id = ?", (json.dumps(reasons), jid)
    )
    snap = store.snapshot(note, "text")
    for gate in gates:
        store.conn.execute(
            "INSERT INTO review_pairs (job_id, note_path, gate_id, gate_path, lens, "
            "note_snapshot_id, gate_snapshot_id) VALUES (?, ?, ?, ?, 'prose', ?, ?)",
            (jid, note, gate, f"kb/gates/{gate}.md", snap, snap),
        )


def escalation(store, note, gate, call, state_dir):
    cur = store.conn.execute(
        "INSERT INTO escalations (model_partition, note_path, gate_id, reason, cycles, report_path, "
        "raised_at, call) VALUES ('p', ?, ?, 'r', 3, 'escalations/x.md', ?, ?)",
        (note, gate, T.format("03:00"), call),
    )
    (state_dir / "escalations" / "x.md").write_text("Gate review: x\n")
    return cur.lastrowid


def report(store, state_dir, now, **kw):
    return make_report(store, state_dir, now=now, **kw).data


# The terminal summary offers `approve` for notes whose escalations recommend `reject`,
#    and for a note where one gate's reviewer failed every attempt (call 'redo').
def test_the_suggested_command_follows_the_escalations_call(st):
    store, sd = st
    escalation(store, "kb/notes/a.md", "prose/g1", "reject", sd)  # failed its gate 3 times
    escalation(store, "kb/notes/b.md", "prose/g1", "reject", sd)
    escalation(store, "kb/notes/b.md", "prose/g2", "redo", sd)  # reviewer failed: nobody judged
    d = report(store, sd, T.format("07:00"), remember=False)
    by_note = {g["note_path"]: g["suggested"] for g in d["needs_you"]["escalations"]}
    assert by_note["kb/notes/a.md"] == "reject"  # was 'approve'
    assert by_note["kb/notes/b.md"] == "redo"  # approve recorded a PASS for g2 nobody made


# The last report was made while this machine's clock ran ahead (a boot before NTP); the
#    clock went back since. "Since the last report" began at its end, after now: an empty
#    window, and what was done between now and that end was in no report.
def test_a_report_after_the_clock_went_back_leaves_nothing_out(st):
    store, sd = st
    store.conn.execute(
        "INSERT INTO report_runs (since, until, made_at) VALUES (?, ?, ?), (?, ?, ?)",
        (T.format("06:00"), T.format("08:00"), T.format("08:00"))
        + (T.format("08:00"), T.format("11:30"), T.format("11:30")),  # the clock ran ahead
    )
    job(store, 1, created=T.format("10:00"), finished=T.format("10:30"))  # after the step
    attempt(store, 1, 1, started=T.format("10:01"), ended=T.format("10:30"), cost=1.0)
    d = report(store, sd, T.format("11:00"))
    assert d["reviewed"]["cost_usd"] == 1.0, d["period"]
    assert d["period"]["since"] == T.format("08:00")
    assert "clock went back" in d["period"]["label"]
    # Remembered: the next report starts at this one's end, as ever.
    assert report(store, sd, T.format("12:00"))["period"]["since"] == T.format("11:00")


# A narrower report (--since 2h, --run, --sweep) is remembered as "the last report", so
#    the next default report starts at its end: what happened before it is in no report.
@pytest.mark.parametrize("narrow", [{"since": "2h"}, {"run": 2}])
def test_a_narrow_look_does_not_skip_the_night(st, narrow):
    store, sd = st
    store.conn.execute(
        "INSERT INTO report_runs (since, until, made_at) VALUES (?, ?, ?)",
        ("2026-11-24T07:00:00.000Z", "2026-11-25T07:00:00.000Z", T.format("07:00")),
    )
    store.conn.execute(
        "INSERT INTO sweep_runs (id, name, trigger, options, started_at) VALUES "
        "(1, 'nightly', 'cron', '{}', ?), (2, 'weekly', 'cron', '{}', ?)",
        (T.format("09:00"), T.format("16:00")),
    )
    job(store, 1, created=T.format("09:00"), finished=T.format("09:10"), run=1)  # nightly, 09:00
    attempt(store, 1, 1, started=T.format("09:01"), ended=T.format("09:10"), cost=1.0)
    job(store, 2, created=T.format("16:00"), finished=T.format("16:10"), run=2, sweep="weekly")
    attempt(store, 2, 1, started=T.format("16:01"), ended=T.format("16:10"), cost=2.0)
    report(store, sd, T.format("17:00"), **narrow)  # a person glances at the last bit
    morning = report(store, sd, "2026-11-26T07:00:00.000Z")  # the next morning's default report
    assert morning["reviewed"]["cost_usd"] >= 1.0, morning[
        "period"
    ]  # job 1 (09:00) was in no report


# One failed job is two things that "need you": its failed-job row and the escalation
#    its failure raised (call 'redo'); the tile and the text add them up.
def test_a_failed_job_needs_you_once(st):
    store, sd = st
    failed_job(store, 1, ["3 attempt(s) failed"], ["prose/g1"])
    escalation(store, "kb/notes/a.md", "prose/g1", "redo", sd)  # its failure raised it
    n = report(store, sd, T.format("07:00"), remember=False)["needs_you"]
    assert n["escalations_open"] + n["failed_total"] == 1  # was 2
    job(store, 2, created=T.format("02:00"), finished=T.format("02:05"), status="failed")
    n = report(store, sd, T.format("07:00"), remember=False)["needs_you"]
    assert [f["id"] for f in n["failed_jobs"]] == [2]  # a failure with no escalation stays
    # Escalations are per partition: another partition's does not stand for this failure.
    store.conn.execute("UPDATE review_jobs SET model_partition = 'codex' WHERE id = 1")
    n = report(store, sd, T.format("07:00"), remember=False)["needs_you"]
    assert [f["id"] for f in n["failed_jobs"]] == [1, 2]


# A failed review job's row said "prose (2 pair(s))" and its terminal line only its
#    reason: which note it was about was in neither, only in `reviewq job N`.
def test_a_failed_jobs_notes_are_named(st):
    from orchestrator.report import render

    store, sd = st
    failed_job(store, 1, ["reviewer profile 'gone' is not configured"], ["prose/g1", "prose/g2"])
    d = report(store, sd, T.format("07:00"), remember=False)
    (failed,) = d["needs_you"]["failed_jobs"]
    assert failed["notes"] == ["kb/notes/a.md"]
    assert "<td>prose: kb/notes/a.md (2 pair(s))</td>" in render.html(d)
    assert "  job 1 failed (prose: kb/notes/a.md): reviewer profile" in render.text(d, None)


# The terminal's "jobs: 1 completed, 1 failed, 1 queued" was on the page nowhere: a person
#    who opened only the page did not learn that a job still waited, nor how many ran.
def test_the_page_counts_the_jobs_as_the_terminal_does(st):
    from orchestrator.report import render

    store, sd = st
    job(store, 1, created=T.format("01:00"), finished=T.format("01:05"))
    failed_job(store, 2, ["3 attempt(s) failed"], ["prose/g1"])
    job(store, 3, created=T.format("01:00"), status="queued")
    d = report(store, sd, T.format("07:00"), remember=False)
    assert "jobs: 1 completed, 1 failed, 1 queued\n" in render.text(d, None)
    assert "<p>Jobs: 1 completed, 1 failed, 1 queued.\n" in render.html(d)


def test_the_jobs_line_says_the_queue_holds_more_than_the_period_moved(st):
    """ "Jobs: 1 completed, 1 queued." beside "14 job(s) waiting" for a paused reviewer:
    the line counts the jobs that moved in the period, and jobs queued before it that
    never moved were on the page only as the pause's backlog, a sum that disagreed."""
    from orchestrator.report import render

    store, sd = st
    job(store, 1, created=T.format("01:00"), finished=T.format("01:05"))
    job(store, 2, created=T.format("01:00"), status="queued")
    for jid in (3, 4):
        job(store, jid, created="2026-11-22T01:00:00.000Z", status="queued")
    d = report(store, sd, T.format("07:00"), remember=False)
    assert "jobs: 1 completed, 1 queued (3 queued in all)\n" in render.text(d, None)
    assert "<p>Jobs: 1 completed, 1 queued (3 queued in all).\n" in render.html(d)


def test_a_notes_fix_jobs_are_found_by_an_index(st):
    # The report's --full section looks up each escalated note's last fixes: without an
    # index, a scan of every job per note (29.7 s for 2,000 notes over 200,000 jobs).
    store, _ = st
    plan = " ".join(
        r[3]
        for r in store.conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM review_jobs j WHERE j.kind = 'fix' "
            "AND j.note_path = ? ORDER BY j.id DESC LIMIT 5",
            ("kb/notes/a.md",),
        )
    )
    assert "USING INDEX review_jobs_fix_note" in plan, plan


def _pair(store, jid, note, gate, decision):
    snap = store.snapshot(note, "text")
    store.conn.execute(
        "INSERT INTO review_pairs (job_id, note_path, gate_id, gate_path, lens, note_snapshot_id, "
        "gate_snapshot_id, decision, rationale) VALUES (?, ?, ?, 'g', 'prose', ?, ?, ?, '- x')",
        (jid, note, gate, snap, snap, decision),
    )


def test_a_lost_agents_late_cost_is_counted_but_not_its_job_again(st):
    """A job's attempt cost, recorded after the report that showed the job (a lost agent's
    outcome came late), put the whole job in the next report too: its decisions, its WARN
    list, "1 completed", an applied fix again, and a negative wall time."""
    store, sd = st
    job(store, 1, created=T.format("01:00"), finished=T.format("02:30"))
    attempt(store, 1, 1, started=T.format("01:01"), ended=T.format("02:00"), outcome="lost")
    attempt(store, 1, 2, started=T.format("02:01"), ended=T.format("02:30"), cost=1.0)
    store.conn.execute("UPDATE attempts SET recorded_at = ended_at")
    _pair(store, 1, "kb/notes/a.md", "prose/g1", "FAIL")
    _pair(store, 1, "kb/notes/a.md", "prose/g2", "WARN")
    job(store, 2, created=T.format("01:00"), finished=T.format("02:30"), kind="fix")
    fixed = store.snapshot("kb/notes/a.md", "new\n")
    store.conn.execute(
        "UPDATE review_jobs SET result = 'applied', note_path = 'kb/notes/a.md', "
        "fixed_snapshot_id = ? WHERE id = 2",
        (fixed,),
    )
    attempt(store, 2, 1, started=T.format("01:01"), ended=T.format("02:00"), outcome="lost")
    store.conn.execute("UPDATE attempts SET recorded_at = ended_at WHERE job_id = 2")
    first = report(store, sd, T.format("07:00"))
    assert first["reviewed"]["pairs"] == 2 and first["kb_changes"]["fixes_applied"] == 1
    # 08:00: both lost agents' outcomes come after all, with what they cost.
    store.conn.execute("UPDATE attempts SET cost_usd = 0.25 WHERE attempt = 1")
    store.conn.execute(
        "UPDATE attempts SET recorded_at = ? WHERE attempt = 1", (T.format("08:00"),)
    )
    data = report(store, sd, "2026-11-26T07:00:00.000Z")
    second = data["reviewed"]
    assert second["cost_usd"] == 0.5  # the late cost is in the next report
    assert (second["pairs"], second["jobs"], second["warns_total"]) == (0, {}, 0)
    assert data["kb_changes"]["fixes_applied"] == 0 and second["wall_time_s"] >= 0


def _spent_run(store, name, trigger, options):
    """Sweep run 1: its $1.00 spent by job 1's attempt overnight, job 2 still queued."""
    store.conn.execute(
        "INSERT INTO sweep_runs (id, name, trigger, options, started_at, budget_usd) "
        "VALUES (1, ?, ?, ?, ?, 1.0)",
        (name, trigger, options, T.format("01:00")),
    )
    job(store, 1, created=T.format("01:00"), finished=T.format("01:10"), run=1)
    attempt(store, 1, 1, started=T.format("01:01"), ended=T.format("01:10"), cost=1.0)
    job(store, 2, created=T.format("01:00"), status="queued", run=1)


def test_jobs_a_spent_budget_holds_need_you_every_morning_they_wait(st):
    """Listed only while the run had a job in the report's period: the next morning said
    "needs you: nothing" while its jobs still waited on the spent budget."""
    store, sd = st
    _spent_run(store, "adhoc", "cli", "{}")
    for now in (T.format("07:00"), "2026-11-26T07:00:00.000Z"):
        (held,) = report(store, sd, now)["needs_you"]["budgets_reached"]
        assert (held["name"], held["jobs_waiting"]) == ("adhoc", 1)


def test_a_spent_budget_names_the_run_that_takes_its_jobs_over(st, tmp_path):
    """The report said "sweep nightly (run 1) spent $1.0000 of $1.0000; 1 job(s) wait"
    (the page: "wait for its next run"): no word of the run that takes them over, which
    the sweep's summary and `job N` name (an entry's next run, `enqueue --name`)."""
    store, sd = st
    root = tmp_path / "root"
    root.mkdir()
    (root / "reviewq.toml").write_text(
        '[[sweeps]]\nname = "nightly"\ncron = "0 2 * * *"\nreviewer = "offline"\n'
    )
    _spent_run(store, "nightly", "cron", '{"configured": true, "reviewer": "offline"}')
    rep = make_report(store, sd, now=T.format("07:00"), settings=load_settings(root))
    [held] = rep.data["needs_you"]["budgets_reached"]
    said = (
        "1 job(s) of sweep 'nightly' (run 1) wait: its budget of $1 is spent; the next run of "
        "its [[sweeps]] entry (reviewq enqueue --name nightly) takes them over (with a new "
        "--budget-usd)"
    )
    assert held["says"] == said
    assert f"\n  {said}\n" in rep.text()
    assert f'<li class="budget">{escape(said)}; it spent $1.0000 of $1.0000.</li>' in (
        render.html(rep.data)
    )


def unwritten_fix(store, jid, note, error="[Errno 30] Read-only file system"):
    """Fix job ``jid``, applied at 02:00, whose note could not be written to the KB."""
    job(store, jid, created=T.format("02:00"), finished=T.format("02:00"), kind="fix")
    store.conn.execute(
        "INSERT INTO fix_writes_due (job_id, path, old_sha256, new_sha256, since, error) "
        "VALUES (?, ?, 'a', 'b', ?, ?)",
        (jid, note, T.format("02:00"), error),
    )


def test_the_summarys_cut_lists_say_how_many_more_and_where(st):
    """The terminal named three failed jobs and three fixes not written, and said nothing
    of the rest; past five escalated notes it said "… 2 more note(s)", and where to find
    them nowhere."""
    store, sd = st
    for jid in range(1, 6):
        failed_job(store, jid, ["3 attempt(s) failed"], ["prose/a"], note=f"kb/notes/f{jid}.md")
    for i in range(7):
        escalation(store, f"kb/notes/e{i}.md", "prose/a", "reject", sd)
    for jid in range(10, 14):
        unwritten_fix(store, jid, f"kb/notes/u{jid}.md")
    text = make_report(store, sd, now=T.format("07:00")).text()
    assert "\n  … 2 more note(s): reviewq escalations lists every one\n" in text, text
    assert "\n  … 2 more failed job(s): reviewq jobs --state failed\n" in text, text
    assert (
        "\n  … and 1 more fixed note(s) not written to the KB: reviewq status --json names each\n"
        in text
    )
    assert text.count(" failed (prose: kb/notes/f") == 3 and text.count("not written to kb/") == 3


def test_a_nights_fixes_not_written_are_counted_past_the_first_few(st, kb, run_cli):
    """A KB folder the control cannot write keeps every fix of the night out: `status`
    and the sweep's summary printed a line for each (hundreds), and the page listed every
    one where its other lists stop at 50."""
    store, sd = st
    for jid in range(1, 6):
        unwritten_fix(store, jid, f"kb/notes/u{jid}.md")
    data = report(store, sd, T.format("07:00"), limit=2)
    n = data["needs_you"]
    assert (len(n["fixes_unwritten"]), n["fixes_unwritten_total"], n["count"]) == (2, 5, 5)
    page = render.html(data)
    assert page.count('<li class="unwritten">') == 2
    since = data["period"]["since"]
    assert f"… and 3 more: <code>reviewq report --full --since {since}</code>" in page
    assert "5 fixed note(s) not written to the KB</a>" in page
    store.conn.close()
    kb.state.mkdir()
    shutil.copy(sd / "state.db", kb.state / "state.db")
    res = run_cli("status")
    assert res.exit_code == 0, res.stderr
    lines = [x for x in res.stdout.splitlines() if "not written to the KB" in x]
    assert len(lines) == 4 and lines[-1] == (
        "… and 2 more fixed note(s) not written to the KB: reviewq status --json names each"
    ), res.stdout
    assert len(run_cli("status", "--json").json()["fixes_unwritten"]) == 5


def test_the_pages_list_of_fixes_not_applied_says_how_many_more(st):
    """Cut at 50 like every list, the fixes a person's edit kept out were the only one
    that stopped without a word of the rest."""
    store, sd = st
    for jid in range(1, 5):
        job(store, jid, created=T.format("02:00"), finished=T.format("02:10"), kind="fix")
        store.conn.execute(
            "UPDATE review_jobs SET result = 'not-applied', note_path = ? WHERE id = ?",
            (f"kb/notes/n{jid}.md", jid),
        )
    data = report(store, sd, T.format("07:00"), limit=3)
    assert data["kb_changes"]["human_edits_total"] == 4
    page = render.html(data)
    assert page.count('<li class="human-edit">') == 3
    since = data["period"]["since"]
    assert f"… and 1 more: <code>reviewq report --full --since {since}</code>" in page


def test_a_failed_job_run_by_hand_names_the_profile_it_ran_with(st):
    """A job create-jobs made and `run-job N --reviewer P` ran and failed: `jobs` lists it
    as `(P)`, the page's failed jobs as reviewer "-"."""
    store, sd = st
    failed_job(store, 1, ["3 attempt(s) failed"], ["prose/a"])
    store.conn.execute("UPDATE review_jobs SET reviewer = NULL, runner = 'offline' WHERE id = 1")
    data = report(store, sd, T.format("07:00"))
    [row] = data["needs_you"]["failed_jobs"]
    assert row["runner"] == "offline"
    assert '<td class="nw">(offline)</td>' in render.html(data)


def test_a_job_that_waited_all_day_counts_its_wall_time_from_its_run_not_the_last_report(st):
    """A job queued last night whose reviewer was paused (or whose budget was spent) ran
    tonight in ten minutes; the morning report's wall time ran from the previous morning's
    report, 18 h 40 min for a ten-minute night. An attempt already running when the
    window opened still counts from the window's start."""
    store, sd = st
    job(store, 1, created=T.format("01:00"), finished="2026-11-26T01:40:00.000Z")
    attempt(
        store, 1, 1, started=T.format("01:00"), ended=T.format("01:01"), outcome="launch-failure"
    )
    attempt(store, 1, 2, started="2026-11-26T01:30:00.000Z", ended="2026-11-26T01:40:00.000Z")
    store.conn.execute("UPDATE attempts SET recorded_at = ended_at")
    report(store, sd, T.format("07:00"))  # the morning after the first night
    night = report(store, sd, "2026-11-26T07:00:00.000Z")["reviewed"]
    assert night["wall_time_s"] == 600
    assert night["first_job_at"] == "2026-11-26T01:30:00.000Z"
    # An agent that ran across 07:00 (started before the report, ended after): from 07:00.
    job(store, 2, created=T.format("06:00"), finished="2026-11-26T07:20:00.000Z")
    attempt(store, 2, 1, started="2026-11-26T06:50:00.000Z", ended="2026-11-26T07:20:00.000Z")
    store.conn.execute("UPDATE attempts SET recorded_at = ended_at WHERE job_id = 2")
    later = report(store, sd, "2026-11-26T08:00:00.000Z")["reviewed"]
    assert later["wall_time_s"] == 1200
