"""Issue 13: the morning report. One real night over a copy of the example KB (the offline
reviewer with --fix and its escalations, a fix that lands, a crashing reviewer, one that
cannot start, a spent budget); the report's data is checked against state.db, and its
page is opened in real headless Chromium."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from orchestrator.state.status import RESTART_AFTER_AN_EDIT
from orchestrator.state.store import Store

from .chromium import Chromium, executable, group_members
from .conftest import PROJECT, local_clock, page_text, process_gone, reviewq_process
from .fault.harness import ContinueGate
from .test_cycles_integration import profile
from .test_queue_integration import (
    FAST_QUEUE,
    _await_exit,
    _stop_all,
    _until,
    await_fifo,
    fake_profile,
    make_fifo,
    small_kb,
)

pytestmark = pytest.mark.integration
CITY = "kb/notes/city-honey-carries-a-street-tree-signature.md"
FIXED_NOTE = "kb/notes/nectar-flow.md"
GATE = "prose/substantive-body"
QUEUE = FAST_QUEUE.replace(
    "[queue]\n",
    "[queue]\nmax_attempts = 1\nlaunch_failures_before_pause = 1\npause_seconds = 3600\n",
)


class Night:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / ".reviewq"

    def rq(self, *args: str):
        return reviewq_process("--root", str(self.root), *args, timeout=180)

    @contextlib.contextmanager
    def db(self):
        conn = sqlite3.connect(self.state / "state.db")
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        finally:
            conn.close()  # closed, not left to the collector: copies of the folder follow

    def report(self, *args: str) -> dict:
        res = self.rq("report", "--json", "--since", "24h", *args)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)


@pytest.fixture(scope="module")
def night(tmp_path_factory) -> Night:
    root = tmp_path_factory.mktemp("night")
    shutil.copytree(PROJECT / "kb", root / "kb")
    (root / "reviewq.toml").write_text(
        profile("fixer", partition="fix", FAKE_PASS_IF_CONTAINS="FIXED", FAKE_FIX_APPEND="FIXED: now it says more.")
        + profile("crashy", partition="crash", FAKE_MODE="crash", FAKE_TURNS="1")
        + profile("costly", partition="costly", FAKE_TURNS="3")
        + '[reviewers.missing]\nkind = "command"\ncommand = ["/nonexistent/agent"]\npartition = "missing"\n'
        + QUEUE
    )  # fmt: skip
    n = Night(root)
    res = n.rq("sweep", "--reviewer", "offline", "--fix", "--json")
    assert res.returncode == 0, res.stderr
    res = n.rq("sweep", "--reviewer", "fixer", "--fix", "--note", str(root / FIXED_NOTE), GATE)
    assert res.returncode == 0, res.stderr
    # A reviewer that crashes, one that cannot start, a budget spent before the first job:
    # each sweep says so and exits 1, and the report must say it again in the morning.
    # One note each: a pair in an open job is not queued again for another reviewer.
    for reviewer, note, extra in (
        ("crashy", "brood.md", ()),
        ("missing", "extract-only-capped-honey.md", ()),
        ("costly", "inspect-every-seven-days-in-swarm-season.md", ("--budget-usd", "0")),
    ):
        res = n.rq(
            "sweep", "--reviewer", reviewer, "--note", str(root / "kb/notes" / note), GATE, *extra
        )
        # Each reviewer has a partition of its own, with no review yet while others have
        # some: the sweep warns of that first (CONTRACT §3), then says its error.
        said = [line for line in res.stderr.splitlines() if not line.startswith("warning: ")]
        assert res.returncode == 1 and said[0].startswith("error: "), (reviewer, res.stderr)
    return n


def test_the_reports_json_is_the_shape_contract_gives(night):
    """CONTRACT gave `status`, `jobs` and `escalations --json` their shapes, and the
    report's none: a script counting a night's fixes not written read a list cut at 50,
    with nothing to say that `fixes_unwritten_total` stood beside it."""
    import re

    contract = (PROJECT / "docs" / "CONTRACT.md").read_text(encoding="utf-8")
    (said,) = re.findall(r"\n`report --json`:.*?\n\n", contract, re.S)
    data = night.report()
    for key in [*data, *data["needs_you"], *data["needs_you"]["failed_jobs"][:1]]:
        assert f'"{key}"' in said, key
    for cut, total in (
        ("escalations", "escalated_notes"),
        ("failed_jobs", "failed_total"),
        ("fixes_unwritten", "fixes_unwritten_total"),
    ):
        assert f"`{cut}`" in said and f"`{total}`" in said, cut
        assert total in data["needs_you"], total


def test_report_data_matches_state_db(night):
    data = night.report()
    with night.db() as db:
        decisions = dict(
            db.execute(
                "SELECT p.decision, count(*) FROM review_pairs p JOIN review_jobs j ON j.id = p.job_id "
                "WHERE j.kind = 'review' AND j.grouping != 'human' AND p.decision IS NOT NULL GROUP BY 1"
            ).fetchall()
        )
        open_escs = db.execute(
            "SELECT id, note_path, gate_id FROM escalations WHERE decision IS NULL ORDER BY id"
        ).fetchall()
        failed = [r[0] for r in db.execute("SELECT id FROM review_jobs WHERE status = 'failed'")]
        attempts = db.execute(
            "SELECT count(*), COALESCE(SUM(cost_usd), 0) FROM attempts"
        ).fetchone()
        fixes = db.execute(
            "SELECT id, fixed_snapshot_id, fix_commit, fix_no_commit FROM review_jobs "
            "WHERE kind = 'fix' AND result = 'applied'"
        ).fetchall()
        unchanged = db.execute(
            "SELECT count(*) FROM review_jobs WHERE kind = 'fix' AND result = 'unchanged'"
        ).fetchone()[0]
    r, n, k = data["reviewed"], data["needs_you"], data["kb_changes"]
    assert r["decisions"] == decisions and r["pairs"] == sum(decisions.values())
    assert sum(sum(g.values()) for g in r["by_gate"].values()) == r["pairs"]
    assert sum(sum(g.values()) for g in r["by_lens"].values()) == r["pairs"]
    assert sum(x["attempts"] for x in r["reviewers"]) == attempts[0]
    assert r["cost_usd"] == pytest.approx(attempts[1]) and attempts[1] > 0
    cost = {x["reviewer"]: x["cost_usd"] for x in r["reviewers"]}
    assert cost["crashy"] == pytest.approx(0.01) and cost["offline"] == 0
    # Needs you: every open escalation, a note's escalations together, one command for all.
    assert n["escalations_open"] == len(open_escs)
    by_note: dict[str, list[int]] = {}
    for e in open_escs:
        by_note.setdefault(e["note_path"], []).append(e["id"])
    assert {
        g["note_path"]: [e["id"] for e in g["escalations"]] for g in n["escalations"]
    } == by_note
    city = next(g for g in n["escalations"] if g["note_path"] == CITY)
    assert len(city["gates"]) >= 7
    assert city["commands"]["approve"] == f"reviewq decide --note {CITY} approve"
    assert all(e["report"].startswith("Gate review: ") for e in city["escalations"])
    assert [f["result"] for f in city["fix_attempts"]] and all(
        f["result"] == "unchanged" and f["diff"] is None for f in city["fix_attempts"]
    )
    # The failed job raised an escalation (call redo): it needs a person once, there.
    [job] = failed
    with night.db() as db:
        pairs = {
            tuple(r)
            for r in db.execute(
                "SELECT note_path, gate_id FROM review_pairs WHERE job_id = ?", (job,)
            )
        }
    assert pairs <= {(e["note_path"], e["gate_id"]) for e in open_escs}
    assert n["failed_jobs"] == [] and n["failed_total"] == 0
    [redo] = [g for g in n["escalations"] if {g["note_path"]} == {p[0] for p in pairs}]
    assert redo["suggested"] == "redo"
    [paused] = n["paused_reviewers"]
    assert paused["reviewer"] == "missing" and "failed to start" in paused["why"]
    [budget] = n["budgets_reached"]
    with night.db() as db:
        waiting = db.execute(
            "SELECT count(*) FROM review_jobs WHERE sweep_run_id = ? AND status = 'queued'",
            (budget["id"],),
        ).fetchone()[0]
    assert budget["name"] == "cli" and budget["budget_usd"] == 0
    assert budget["jobs_waiting"] == waiting >= 1
    # What changed: the one fix that landed, as a diff; the offline fixer's non-changes.
    [fix] = k["fixes"]
    assert [fix["id"]] == [f["id"] for f in fixes] and fix["note_path"] == FIXED_NOTE
    assert {"kind": "add", "text": "+FIXED: now it says more."} in fix["diff"]["lines"]
    assert fix["diff"]["added"] == 1 and fix["diff"]["removed"] == 0
    assert fix["fix_commit"] is None and fix["fix_no_commit"] is None  # commits are off
    assert k["fix_results"]["unchanged"] == unchanged
    # Trends: the gate that fails every empty description stands out from the rest.
    rates = {g["gate_id"]: g for g in data["trends"]["fail_rate_by_gate"]}
    assert rates[GATE]["decided"] >= 1 and 0 <= rates[GATE]["rate"] <= 1
    assert len(data["trends"]["nights"]) == 14


def test_one_decision_settles_a_notes_escalations(night, tmp_path):
    # A copy: the module's night stays as the other tests expect it.
    copy = Night(tmp_path / "copy")
    # The queues' doorbells are FIFOs, which copytree refuses; any process remakes them.
    shutil.copytree(night.root, copy.root, ignore=shutil.ignore_patterns("*.bell"))
    before = copy.report()["needs_you"]
    city = next(g for g in before["escalations"] if g["note_path"] == CITY)
    singles = [g["escalations"][0]["id"] for g in before["escalations"] if len(g["gates"]) == 1]
    listed = json.loads(copy.rq("escalations", "--json").stdout)["notes"]
    assert {n["note_path"]: n["escalation_ids"] for n in listed} == {
        g["note_path"]: [e["id"] for e in g["escalations"]] for g in before["escalations"]
    }
    assert len(singles) >= 2
    # All or nothing: one id that cannot be decided leaves the others open.
    res = copy.rq("decide", str(singles[0]), "9999", "approve")
    assert (res.returncode, res.stderr) == (1, "error: no escalation 9999\n")
    assert copy.report()["needs_you"]["escalations_open"] == before["escalations_open"]

    res = copy.rq("decide", *map(str, singles), "approve")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("approved: ") == len(singles)
    # The path as the shell sees it works as well as the one the report prints.
    res = copy.rq(
        "decide",
        "--note",
        str(copy.root / CITY),
        "redo",
        "--feedback",
        "Write the body: two paragraphs.",
    )
    assert res.returncode == 0, res.stderr
    line, waits = res.stdout.splitlines()  # no control runs: the fix waits for one
    assert waits.startswith("no control process runs for this state folder")
    assert line.startswith("redo: fix job ") and f"({len(city['gates'])} gate(s): " in line
    job_id = int(line.split()[3])
    with copy.db() as db:
        gates = [
            r[0] for r in db.execute("SELECT gate_id FROM review_pairs WHERE job_id = ?", (job_id,))
        ]
        job = db.execute(
            "SELECT kind, note_path, feedback FROM review_jobs WHERE id = ?", (job_id,)
        ).fetchone()
        decided = db.execute(
            "SELECT decision, count(*) FROM escalations WHERE note_path = ? GROUP BY 1", (CITY,)
        ).fetchall()
    assert sorted(gates) == sorted(city["gates"])
    assert tuple(job) == ("fix", CITY, "Write the body: two paragraphs.")
    assert [tuple(r) for r in decided] == [("redo", len(city["gates"]))]
    after = copy.report()["needs_you"]
    assert CITY not in [g["note_path"] for g in after["escalations"]]
    assert after["escalations_open"] == before["escalations_open"] - len(city["gates"]) - len(
        singles
    )
    res = copy.rq("decide", "--note", CITY, "reject")
    assert (res.returncode, res.stderr) == (
        1,
        f"error: --note {CITY}: no open escalation for this note\n",
    )


def test_decide_note_naming_a_symlink_loop_is_refused_in_one_line(night, tmp_path):
    """A --note path that is a symlink loop matches no escalation: pathlib's error for the
    loop was 'internal error ... please report it'."""
    loop = tmp_path / "loop.md"
    loop.symlink_to(loop)
    res = night.rq("decide", "--note", str(loop), "reject")
    assert (res.returncode, res.stderr) == (
        1,
        f"error: --note {loop}: no open escalation for this note\n",
    )


def test_an_escalation_whose_note_is_gone_says_only_reject_closes_it(night, tmp_path):
    """`decide` refuses approve and redo once the note is deleted or renamed; the morning
    report and `escalations` suggested them all the same, so a person learnt it only
    from the refusal."""
    copy = Night(tmp_path / "copy")
    shutil.copytree(night.root, copy.root, ignore=shutil.ignore_patterns("*.bell"))
    (copy.root / CITY).rename(copy.root / "kb/notes/renamed.md")
    data = copy.report()["needs_you"]
    city = next(g for g in data["escalations"] if g["note_path"] == CITY)
    others = [g for g in data["escalations"] if g["note_path"] != CITY]
    assert len(city["gates"]) > 1 and others
    assert {e["only_reject"] for e in city["escalations"]} == {
        "the note is gone (deleted or renamed)"
    }
    assert city["suggested"] == "reject"
    assert all(e["only_reject"] is None for g in others for e in g["escalations"])
    res = copy.rq("report", "--since", "24h")
    assert res.returncode == 0, res.stderr
    assert (
        f"  {CITY} ({len(city['gates'])} gate(s)): reviewq decide --note {CITY} reject\n"
        "    the note is gone (deleted or renamed): only reject closes it\n"
    ) in res.stdout
    page = (copy.state / "report.html").read_text()
    assert page.count("Only <code>reject</code> closes this escalation") == len(city["gates"])
    listed = copy.rq("escalations")
    assert listed.stdout.count("the note is gone (deleted or renamed): only reject closes it") == (
        len(city["gates"])
    )
    # ... and its line for the whole note offered approve and redo, which decide refuses.
    assert f"  decide them at once: reviewq decide --note {CITY} reject\n" in listed.stdout
    listed = json.loads(copy.rq("escalations", "--json").stdout)["escalations"]
    assert sorted(e["id"] for e in listed if e["only_reject"]) == sorted(
        e["id"] for e in city["escalations"]
    )
    # The night's paused reviewer and spent budget make any sweep exit 1: its summary counts.
    res = copy.rq("sweep", "--reviewer", "offline", "--note", str(copy.root / FIXED_NOTE), GATE)
    assert (
        f"reviewq decide --note {CITY} reject (the note is gone (deleted or renamed): "
        "only reject closes it)"
    ) in res.stdout
    # What the report suggests, decide takes.
    res = copy.rq("decide", "--note", CITY, "reject")
    assert res.returncode == 0, res.stderr


def test_bad_arguments_get_one_line(night):
    # A run past the last was never made: told of cron runs of nothing deleted (N23), the
    # person looked for one.
    with night.db() as conn:
        last = conn.execute("SELECT max(id) FROM sweep_runs").fetchone()[0]
    for args, expected in (
        (
            ("--since", "soon"),
            "error: reviewq report: --since 'soon': not a duration (30m, 12h, 7d), a date "
            "(2026-11-22) or a time of day (08:00) (see reviewq report --help)\n",
        ),
        (
            ("--run", "999"),
            f"error: --run 999: no such sweep run (the last is run {last})\n",
        ),
        (("--sweep", "nope"), "error: --sweep 'nope': no run of this sweep is recorded\n"),
        (
            ("--since", "1h", "--run", "1"),
            "error: reviewq report: --since and --run: choose one period (see reviewq report "
            "--help)\n",
        ),
    ):
        res = night.rq("report", *args)
        # A value that names no time, or two periods at once, is bad usage (CONTRACT: 2);
        # a run or sweep the record lacks is refused (1).
        code = 2 if args[0] == "--since" else 1
        assert (res.returncode, res.stderr) == (code, expected), args


def test_a_page_replaces_only_an_earlier_page(night, tmp_path):
    """--html naming state.db, a note or reviewq.toml replaced it with the page: every
    review, escalation and queued job gone, without a word. A new file in the KB was read
    as a note, and a mistyped folder was made."""
    db = night.state / "state.db"
    before = db.read_bytes()
    note = next((night.root / "kb" / "notes").glob("*.md"))
    text = note.read_text()
    res = night.rq("report", "--html", str(db))
    assert (res.returncode, res.stderr) == (
        1,
        f"error: --html {db}: exists and is not a reviewq report; nothing was written "
        "(remove it or name another file)\n",
    )
    # Where sweeps read even a new file is refused: the page would be read as a note.
    notes = (night.root / "kb" / "notes").resolve()
    for target in (note, note.with_name("report.md")):
        res = night.rq("report", "--html", str(target))
        assert (res.returncode, res.stderr) == (
            1,
            f"error: --html {target}: inside {notes}, where sweeps read notes and gates\n",
        )
    beside = night.root / "kb" / "night.html"  # in the KB, where nothing reads it: fine
    assert night.rq("report", "--since", "24h", "--html", str(beside)).returncode == 0
    missing = tmp_path / "no-such-folder" / "night.html"  # a typo: no folder is made
    res = night.rq("report", "--html", str(missing))
    assert (res.returncode, res.stderr) == (
        1,
        f"error: --html {missing}: no folder {missing.parent}; name a file in one that exists\n",
    )
    assert not missing.parent.exists() and not note.with_name("report.md").exists()
    # A name too long for the file system was "internal error ... please report it".
    too_long = tmp_path / ("a" * 300 + ".html")
    res = night.rq("report", "--html", str(too_long))
    assert (res.returncode, res.stderr) == (1, f"error: --html {too_long}: File name too long\n")
    assert db.read_bytes() == before and note.read_text() == text
    old = tmp_path / "old.html"  # a page written before pages said who made them
    old.write_text(
        '<!DOCTYPE html><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">"
    )
    for _ in range(2):  # over an older page, then over its own
        res = night.rq("report", "--since", "24h", "--html", str(old))
        assert res.returncode == 0, res.stderr
    assert '<meta name="generator" content="reviewq">' in old.read_text()


def test_a_damaged_page_in_the_state_folder_is_written_again(night):
    """STATE/report.html is reviewq's own rendering (OPERATIONS §7: the next report writes
    it again). Emptied, or NULs where a power loss left them, it was "--html …: exists
    and is not a reviewq report" at every morning's report, exit 1, for good, naming an
    option nobody gave. A file of another kind there is still refused, by its path."""
    page = night.state / "report.html"
    for damaged in (b"", b"\0" * 4096, b"<html><body>cut sh"):
        page.write_bytes(damaged)
        res = night.rq("report", "--since", "24h")
        assert res.returncode == 0, res.stderr
        assert '<meta name="generator" content="reviewq">' in page.read_text()
    page.unlink()
    page.mkdir()
    try:
        res = night.rq("report", "--since", "24h")
        assert (res.returncode, res.stderr) == (
            1,
            f"error: {page}: not a regular file; remove it, or give --html another file\n",
        )
    finally:
        page.rmdir()


def test_a_report_may_look_back_more_than_a_year(night):
    """The one-year limit on durations is for reviewq.toml; --since went through the same
    check, so an all-time report (`--since 9000h`) was refused."""
    res = night.rq("report", "--since", "9000h")
    assert res.returncode == 0, res.stderr
    res = night.rq("report", "--since", "7d")  # what a person types for "this week"
    assert res.returncode == 0 and "the last 7d" in res.stdout.splitlines()[0], res.stderr
    res = night.rq("report", "--since", "99999999h")  # past the calendar: one line, bad usage
    assert (res.returncode, res.stderr) == (
        2,
        "error: reviewq report: --since: must be more than 0 seconds and at most 100 years "
        "(see reviewq report --help)\n",
    )


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    exe = executable()
    if exe is None:
        pytest.skip("Chromium is not installed (.ci/run installs the Debian package chromium)")
    with Chromium(exe, Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))) as c:
        c.call("Browser.getVersion")  # started: its singleton socket is made
        assert list(c.tmp_dir.glob("org.chromium.*")), "Chromium's temporary folder is in /tmp"
        yield c
    # Every Chromium process of the group is gone (or a zombie its new parent will reap).
    assert [pid for pid in group_members(c.proc.pid) if not process_gone(pid)] == []


def test_the_page_opens_from_disk_with_nothing_fetched(night, browser, tmp_path):
    page_path = tmp_path / "night.html"
    res = night.rq("report", "--since", "24h", "--html", str(page_path))
    assert res.returncode == 0, res.stderr
    assert f"report: {page_path}" in res.stdout
    data = night.report()
    url = page_path.as_uri()
    page = browser.open(url)
    assert page.requests() == [url]  # the file itself, and nothing else
    assert not [e for e in page.log_entries() if e.get("level") == "error"]
    dom = page.evaluate(
        """({
        sections: [...document.querySelectorAll('main > section')].map(s => s.id),
        notes: [...document.querySelectorAll('article.escalated-note h4')].map(h => h.textContent),
        failed: document.querySelectorAll('tr.failed-job').length,
        paused: document.querySelectorAll('li.paused').length,
        budgets: document.querySelectorAll('li.budget').length,
        fixes: document.querySelectorAll('article.fix').length,
        commands: [...document.querySelectorAll('code.cmd')].map(c => c.textContent),
        figures: document.querySelectorAll('figure.chart svg').length,
        tables: document.querySelectorAll('figure.chart table').length,
        scripts: document.querySelectorAll('script').length,
        added: [...document.querySelectorAll('article.fix .diff .add')].map(s => s.textContent),
    })"""
    )
    assert dom["sections"] == ["needs-you", "kb-changes", "reviewed", "trends"]
    assert dom["notes"] == [g["note_path"] for g in data["needs_you"]["escalations"]]
    # The one failed job is shown as its escalation (call redo), not twice.
    assert (dom["failed"], dom["paused"], dom["budgets"], dom["fixes"]) == (0, 1, 1, 1)
    assert f"reviewq decide --note {CITY} approve" in "\n".join(dom["commands"])
    assert "reviewq resume missing" in dom["commands"]
    assert dom["figures"] == dom["tables"] >= 5 and dom["scripts"] == 0
    assert dom["added"] == ["+FIXED: now it says more."]
    page.screenshot(tmp_path / "report-laptop.png")
    phone = browser.open(url, width=390, height=844, mobile=True)
    # Readable on a phone: nothing wider than the screen but what scrolls inside its box.
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    phone.screenshot(tmp_path / "report-phone.png", 0, 2400)
    for name in ("report-laptop.png", "report-phone.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_escalations_report_on_the_page_leaves_its_calls_to_the_notes_list(
    night, browser, tmp_path
):
    """Each escalation's report repeated its own calls ("Decision: `reviewq decide 39
    approve` accepts …; … redo …; … reject …"), some 45 % of its bytes, under the note's
    list of calls: on a 10,000-job night 0.4 MB of a 0.9 MB page. The page leaves that
    line out (what each call does is said once above); the report's file keeps it."""
    page_path = tmp_path / "reports.html"
    assert night.rq("report", "--since", "24h", "--html", str(page_path)).returncode == 0
    page = browser.open(page_path.as_uri())
    reports = page.evaluate("[...document.querySelectorAll('pre.report')].map(p => p.textContent)")
    files = [p.read_text() for p in (night.state / "escalations").glob("escalation-*.md")]
    assert len(reports) == len(files) >= 4
    assert all("\nDecision: `reviewq decide " in f for f in files)
    assert [r for r in reports if "reviewq decide" in r] == [], reports
    assert all(r.startswith("Gate review: ") and "\nMaterial:" in r for r in reports), reports
    said = page.evaluate("document.querySelector('#escalations + p.meta').textContent")
    assert all(f"{call} " in said for call in ("approve", "redo", "reject")), said


def test_the_page_says_what_each_call_does_as_the_reports_said_it(night, browser, tmp_path):
    """P63 left each report's line of calls off the page for one line above the notes,
    which said "redo queues one fix": a redo with no FAIL about the note as it is now on
    record (its reviewer failed every attempt, the note edited since) queues none, and a
    reject turns a PASS on record into the person's FAIL, as every report had said."""
    page_path = tmp_path / "calls-said.html"
    assert night.rq("report", "--since", "24h", "--html", str(page_path)).returncode == 0
    page = browser.open(page_path.as_uri())
    said = page.evaluate("document.querySelector('#escalations + p.meta').textContent")
    for f in (night.state / "escalations").glob("escalation-*.md"):
        calls = next(ln for ln in f.read_text().splitlines() if ln.startswith("Decision: "))
        # After the asks, which E96 words by escalation (an agent's failure asks none).
        head, found, tail = calls.partition(" while a FAIL")
        redo_if = (found + tail.partition("; `reviewq decide")[0]).strip()
        assert "redo" in head and found and redo_if in said, (calls, said)
        reject_pass = "(" + calls.rpartition(" (")[2].rstrip(".")
        assert reject_pass.endswith("FAIL)") and reject_pass in said, (reject_pass, said)


def test_the_calls_are_offered_as_the_sweep_offers_them_the_recommended_one_marked(
    night, browser, tmp_path
):
    """The terminal showed the recommended call alone (`reviewq decide --note N reject`),
    which read as the only answer where the sweep's summary offers approve|redo|reject;
    the page listed the three calls with none marked."""
    page_path = tmp_path / "calls.html"
    res = night.rq("report", "--since", "24h", "--html", str(page_path))
    assert res.returncode == 0, res.stderr
    groups = night.report()["needs_you"]["escalations"]
    city = next(g for g in groups if g["note_path"] == CITY)
    assert city["suggested"] == "reject"
    assert (
        f"  {CITY} ({len(city['gates'])} gate(s)): reviewq decide --note {CITY} "
        "approve|redo|reject (recommended: reject)\n"
    ) in res.stdout
    page = browser.open(page_path.as_uri())
    shown = page.evaluate(
        """[...document.querySelectorAll('article.escalated-note')].map(a => [
        [...a.querySelectorAll('ul.calls li')].map(li => li.querySelector('code.cmd').textContent),
        [...a.querySelectorAll('ul.calls li.recommended')].map(li => li.innerText)])"""
    )
    assert len(shown) == len(groups)
    for g, (calls, marked) in zip(groups, shown, strict=True):
        assert calls == [g["commands"][c] for c in ("approve", "redo", "reject")]
        (recommended,) = marked
        assert recommended.lower().startswith("recommended"), recommended
        assert recommended.endswith(g["commands"][g["suggested"]]), recommended


def test_the_jobs_a_paused_reviewer_holds_are_counted(night, browser, tmp_path):
    """Neither the report nor `status` said how many jobs wait behind a paused reviewer
    (an outage's pause): a night's backlog read as one line about a profile."""
    with night.db() as db:
        (held,) = db.execute(
            "SELECT count(*) FROM review_jobs WHERE reviewer = 'missing' AND status = 'queued'"
        ).fetchone()
    assert held >= 1
    said = f"{held} job(s) wait for reviewer missing, paused since "
    status = night.rq("status")
    assert status.returncode == 0, status.stderr
    assert any(line.startswith(said) for line in status.stdout.splitlines()), status.stdout
    assert "(or until reviewq resume missing, once the cause is mended): " in status.stdout
    page_path = tmp_path / "paused.html"
    res = night.rq("report", "--since", "24h", "--html", str(page_path))
    assert f"; 1 paused reviewer(s), {held} job(s) waiting for them" in res.stdout, res.stdout
    assert f"\n  {said}" in res.stdout, res.stdout
    (paused,) = night.report()["needs_you"]["paused_reviewers"]
    assert paused["jobs_waiting"] == held
    page = browser.open(page_path.as_uri())
    shown = page.evaluate(
        """[[...document.querySelectorAll('ul.needs li')].map(li => li.innerText),
        [...document.querySelectorAll('li.paused')].map(li => li.innerText)]"""
    )
    assert f"1 paused reviewer(s), {held} job(s) waiting for them" in shown[0], shown
    assert [line.startswith(said) for line in shown[1]] == [True], shown


@contextlib.contextmanager
def _dead_endpoint(tmp_path, queue: str = QUEUE):
    """A copy of the example KB whose `openai` profile `gateway` points at a loopback port
    bound and never listening (every connection refused) while this holds it; the night
    and that URL."""
    import socket

    root = tmp_path / "kb-root"
    shutil.copytree(PROJECT / "kb", root / "kb")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{held.getsockname()[1]}/llm/gateway"
        (root / "reviewq.toml").write_text(
            f'[reviewers.gateway]\nkind = "openai"\nmodel = "m"\nbase_url = "{url}"\n' + queue
        )
        yield Night(root), url


def _sweep_paused(n: Night) -> dict:
    """One pair for `gateway`: the sweep ends on its pause; the pause as the sweep said it
    when it ended (`paused_until`, `paused_since`)."""
    res = n.rq("sweep", "--json", "--reviewer", "gateway", "--note", str(n.root / FIXED_NOTE), GATE)
    assert res.returncode == 1 and "paused" in res.stderr, res.stderr
    return json.loads(res.stdout)["paused_reviewers"]["gateway"]


def test_a_paused_reviewers_endpoint_keeps_the_page_in_a_phones_screen(browser, tmp_path):
    """The morning walkthrough (stop 44): an `openai` profile whose endpoint was down
    paused, and its reason quoted the URL it could not reach, a run of some 50 characters
    with no space or hyphen. The paused line is no table cell that scrolls in its box: the
    whole page was wider than a 375-px phone, every section scrolling sideways."""
    with _dead_endpoint(tmp_path) as (n, url):
        _sweep_paused(n)
    page_path = tmp_path / "paused-endpoint.html"
    assert n.rq("report", "--html", str(page_path)).returncode == 0
    page = browser.open(page_path.as_uri(), width=375, height=812, mobile=True)
    (said,) = page.evaluate("[...document.querySelectorAll('li.paused')].map(li => li.innerText)")
    assert f"cannot reach {url}/v1/chat/completions" in said, said
    assert page.evaluate("document.documentElement.scrollWidth") <= 375


def test_a_reviewer_paused_again_with_no_answer_between_is_paused_since_the_first(tmp_path):
    """The morning walkthrough (stop 44): an endpoint down all night pauses its profile,
    the pause runs out, the next tries fail, and it pauses again, every `pause_seconds`.
    `status`, the report and `job N` said "paused since" the last of those pauses: at 7
    a.m. an outage that began at 01:30 read as a quarter of an hour old."""
    from datetime import datetime

    queue = QUEUE.replace("pause_seconds = 3600", "pause_seconds = 1")
    with _dead_endpoint(tmp_path, queue) as (n, _):
        # The first pause as the sweep said it: a `status` started after it (a Python's
        # start, over a second on a loaded machine) could find the 1-s pause over.
        first = _sweep_paused(n)
        until = datetime.fromisoformat(first["paused_until"].replace("Z", "+00:00"))
        time.sleep(max(0.0, (until - datetime.now(until.tzinfo)).total_seconds()) + 0.1)
        # The second pause is the hour's, still on when `status` reads it.
        settings = n.root / "reviewq.toml"
        settings.write_text(settings.read_text().replace(queue, QUEUE))
        swept = _sweep_paused(n)  # the queued job tried again once the pause ran out
    again = json.loads(n.rq("status", "--json").stdout)["reviewers"]["gateway"]
    assert again["paused_until"] == swept["paused_until"] > first["paused_until"]
    assert again["paused_since"] == first["paused_since"], (first, again)
    with n.db() as db:
        assert (
            db.execute(
                "SELECT count(*) FROM attempts WHERE outcome = 'reviewer-failure'"
            ).fetchone()[0]
            == 2
        )
    said = f"paused since {first['paused_since'][:19]}Z until {again['paused_until'][:19]}Z"
    assert said in n.rq("status").stdout


def test_a_gate_escalated_in_two_partitions_is_one_gate_of_its_note(browser, tmp_path):
    """The morning walkthrough (stop 44): a note escalated on eleven gates by one reviewer
    and on one of them by another read "(12 gate(s))" in the report and "12 gate(s): …,
    frontmatter/description-present" on the page, that gate named twice: a count of
    escalations under the name of gates."""
    root = tmp_path / "kb-root"
    shutil.copytree(PROJECT / "kb", root / "kb")
    (root / "reviewq.toml").write_text(
        profile("crashy", partition="crash", FAKE_MODE="crash", FAKE_TURNS="1") + QUEUE
    )
    n = Night(root)
    for reviewer, code in (("offline", 0), ("crashy", 1)):  # 3 rejections; a crash
        res = n.rq("sweep", "--reviewer", reviewer, "--fix", "--note", str(root / CITY), GATE)
        assert res.returncode == code, res.stderr
    assert len(json.loads(n.rq("escalations", "--json").stdout)["escalations"]) == 2
    page_path = tmp_path / "two-partitions.html"
    res = n.rq("report", "--html", str(page_path))
    said = f"{CITY} (1 gate(s), 2 escalation(s) in 2 partitions): "
    assert f"\n  {said}" in res.stdout, res.stdout
    (g,) = n.report()["needs_you"]["escalations"]
    assert g["gates"] == [GATE] and len(g["escalations"]) == 2
    page = browser.open(page_path.as_uri())
    (meta,) = page.evaluate(
        "[...document.querySelectorAll('article.escalated-note h4 + p.meta')].map(p => p.innerText)"
    )
    assert meta == f"1 gate(s), 2 escalation(s) in 2 partitions: {GATE}", meta


def test_an_escalation_names_the_job_that_raised_it(night, browser, tmp_path):
    """An escalation read "the reviewer failed every attempt: exited 1 …" in `escalations`,
    its report and on the page, and none of them named the job whose attempts failed:
    its stderr, attempts and log lines (`job N`, `logs --job N`) were out of reach from
    the morning's list, though state.db records the job (schema 18)."""
    with night.db() as db:
        (esc, job) = db.execute(
            "SELECT id, job_id FROM escalations WHERE model_partition = 'crash'"
        ).fetchone()
    assert job is not None
    listed = night.rq("escalations").stdout.splitlines()
    line = (
        f"  escalation {esc}: {GATE}  (crash, the reviewer failed every attempt; reviewq job {job})"
    )
    assert line in listed, listed
    as_json = json.loads(night.rq("escalations", "--json").stdout)["escalations"]
    assert {e["id"]: e["job_id"] for e in as_json}[esc] == job
    page_path = tmp_path / "raised.html"
    assert night.rq("report", "--since", "24h", "--html", str(page_path)).returncode == 0
    page = browser.open(page_path.as_uri())
    said = page.evaluate(
        "[...document.querySelectorAll('details > summary')].map(s => s.innerText)"
    )
    ours = [s for s in said if s.startswith(f"Escalation {esc}: {GATE} — ")]
    assert len(ours) == 1 and ours[0].endswith(f"(raised by job {job}: reviewq job {job})"), said
    assert "escalation.raised" in night.rq("logs", "--job", str(job)).stdout


def test_a_paused_reviewers_sentence_keeps_its_command_in_line(night, browser, tmp_path):
    """The page set `reviewq resume NAME` apart as a block in the middle of the pause's
    sentence: it read "… (or until" / "reviewq resume missing" / ", once the cause is
    mended): …", three lines, the last starting with its comma."""
    page_path = tmp_path / "paused-line.html"
    res = night.rq("report", "--since", "24h", "--html", str(page_path))
    assert res.returncode == 0, res.stderr
    page = browser.open(page_path.as_uri())
    (said,) = page.evaluate("[...document.querySelectorAll('li.paused')].map(li => li.innerText)")
    assert "\n" not in said and "(or until reviewq resume missing, once the cause" in said, said
    assert page.evaluate("document.querySelector('li.paused code.cmd').textContent") == (
        "reviewq resume missing"
    )


def test_a_persons_asks_keep_their_lines(night, browser, tmp_path):
    """`decide redo --feedback` is kept verbatim and the fixer's prompt has it so; the page
    ran a list of asks into one line ("- Say what OA stands for. - Cite the survey.")."""
    from orchestrator.report import render

    data = night.report()
    asks = "Two things:\n- Say what OA stands for.\n- Cite the 2019 survey."
    data["kb_changes"]["fixes"][0]["feedback"] = asks
    page_path = tmp_path / "asks.html"
    page_path.write_text(render.html(data), encoding="utf-8")
    page = browser.open(page_path.as_uri())
    shown = page.evaluate(
        "[...document.querySelectorAll('article.fix p')].map(p => p.innerText)"
        '.filter(t => t.startsWith("A person\'s asks"))'
    )
    assert shown == [f"A person's asks: {asks}"], shown


def test_the_charts_words_follow_the_pages_dark_mode(night, browser, tmp_path):
    """The page follows the system's dark mode, but pygal drew its labels, axes and legends
    near-black: on the dark page the gates' and lenses' names were all but invisible."""
    page_path = tmp_path / "dark.html"
    res = night.rq("report", "--since", "24h", "--html", str(page_path))
    assert res.returncode == 0, res.stderr
    for scheme in ("dark", "light"):
        page = browser.open(page_path.as_uri(), color_scheme=scheme)
        body, fills = page.evaluate(
            """[getComputedStyle(document.body).color, [...new Set([...document.querySelectorAll(
            'figure.chart svg text')].map(t => getComputedStyle(t).fill))]]"""
        )
        assert fills == [body], (scheme, body, fills)
        page.screenshot(tmp_path / f"charts-{scheme}.png")


def _luminance(css: str) -> float:
    """WCAG's relative luminance of a computed ``rgb(r, g, b)``."""
    r, g, b = (int(x) / 255 for x in css[css.index("(") + 1 : css.index(")")].split(",")[:3])
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(fg: str, bg: str) -> float:
    a, b = _luminance(fg), _luminance(bg)
    return (max(a, b) + 0.05) / (min(a, b) + 0.05)


# Each element's computed colour, and the first background behind it that is not transparent.
_COLOURS = """(sel) => [...document.querySelectorAll(sel)].map(el => {
    let bg = el;
    while (bg && getComputedStyle(bg).backgroundColor === 'rgba(0, 0, 0, 0)') bg = bg.parentElement;
    return [el.textContent, getComputedStyle(el).color,
            getComputedStyle(bg || document.body).backgroundColor];
})"""


def test_the_decisions_colours_can_be_read_in_either_mode(night, browser, tmp_path):
    """The tiles' and the summary's PASS, WARN, FAIL and ERROR are coloured: the light
    page's WARN orange was 2.4:1 on white (its tile's figure too), and the dark page kept
    the light page's green and red, 3.5:1 and 3.2:1 on near-black."""
    for scheme, shown, low in _read_in_each_mode(
        night, browser, tmp_path, ".PASS, .WARN, .FAIL, .ERROR"
    ):
        assert len(shown) == 6, shown  # two tiles, the summary's four
        assert low == [], (scheme, low)


def _read_in_each_mode(night, browser, tmp_path, selector):
    """The night's page in the dark and the light scheme: for each, the scheme, the
    ``selector``'s texts with their colours, and those under 4.5:1 on their background."""
    page_path = tmp_path / "page.html"
    res = night.rq("report", "--since", "24h", "--html", str(page_path))
    assert res.returncode == 0, res.stderr
    for scheme in ("dark", "light"):
        page = browser.open(page_path.as_uri(), color_scheme=scheme)
        shown = page.evaluate(f"({_COLOURS})({selector!r})")
        yield scheme, shown, [(t, fg, bg) for t, fg, bg in shown if _contrast(fg, bg) < 4.5]


def test_the_charts_bars_take_the_decisions_colours_of_either_mode(night, browser, tmp_path):
    """P13 gave PASS, WARN, FAIL and ERROR a colour for each mode, but the charts kept
    their own (charts.COLOURS), drawn at pygal's 70 % opacity: the light page's WARN
    bars were 1.9:1 on white beside a darker WARN in the text, and on the dark page the
    FAIL and PASS bars 2.1:1 and 2.3:1, ERROR's purple 1.5:1 (a bar needs 3:1)."""
    page_path = _four_decisions_page(night, tmp_path)
    for scheme in ("dark", "light"):
        page = browser.open(page_path.as_uri(), color_scheme=scheme)
        text, bars, bg = page.evaluate(
            """[Object.fromEntries(['PASS', 'WARN', 'FAIL'].map(d => [d,
                getComputedStyle(document.querySelector('span.' + d)).color])),
            [...[...document.querySelectorAll('figure.chart')].find(f =>
                f.querySelector('figcaption').textContent === 'Decisions per lens'
            ).querySelectorAll('svg g.series rect')].map(r => {
                const cs = getComputedStyle(r);
                let o = Number(cs.fillOpacity);
                for (let e = r; e; e = e.parentElement) o *= Number(getComputedStyle(e).opacity);
                // A texture's colour is the one under its marks (P57).
                const id = cs.fill.match(/url\\("?#([^")]+)"?\\)/);
                const under = id && document.getElementById(id[1]).querySelector('rect');
                return [under ? getComputedStyle(under).fill : cs.fill, o];
            }),
            getComputedStyle(document.body).backgroundColor]"""
        )
        assert len(bars) == 4, bars  # PASS, WARN, FAIL, ERROR, in that order
        for (fill, _), d in zip(bars, ("PASS", "WARN", "FAIL"), strict=False):
            assert fill == text[d], (scheme, d, fill, text)
        for fill, opacity in bars:
            assert opacity == 1 and _contrast(fill, bg) >= 3, (scheme, fill, opacity, bg)


def _four_decisions_page(night, tmp_path) -> Path:
    """The night's page with a lens of every decision, for the charts' bars."""
    from orchestrator.report import render

    data = night.report()
    data["reviewed"]["by_lens"] = {"prose": {"PASS": 5, "WARN": 3, "FAIL": 2, "ERROR": 1}}
    page_path = tmp_path / "bars.html"
    page_path.write_text(render.html(data), encoding="utf-8")
    return page_path


# Each decision's bars and legend swatch in "Decisions per lens": their fill, and for a
# texture (a pattern) the colour under its marks.
_DECISION_FILLS = """(() => {
    const svg = [...document.querySelectorAll('figure.chart')].find(f =>
        f.querySelector('figcaption').textContent === 'Decisions per lens').querySelector('svg');
    const base = fill => {
        const id = fill.match(/url\\("?#([^")]+)"?\\)/);
        return id ? getComputedStyle(svg.querySelector('#' + CSS.escape(id[1]) + ' > rect')).fill : fill;
    };
    return [0, 1, 2, 3].map(i => {
        const bars = [...svg.querySelectorAll(`g.series.serie-${i} g.bar rect`)]
            .map(r => getComputedStyle(r).fill);
        const swatch = getComputedStyle(svg.querySelector(`.legend rect.color-${i}`)).fill;
        return {bars, swatch, base: base(swatch)};
    });
})()"""


def test_a_decision_is_told_by_more_than_its_colour_in_the_charts(night, browser, tmp_path):
    """The stacked bars told PASS, WARN, FAIL and ERROR apart by colour alone: to a
    reader without red-green vision (Chromium's deuteranopia emulation, as some 5 % of
    men see) the light page's green, orange and red are one olive (#756b38, #827301,
    #817420; 1.01-1.13:1 between them), and the legend's swatches no help. WARN, FAIL and
    ERROR now have a texture each, in their bars and their swatch alike, over the colour."""
    page = browser.open(_four_decisions_page(night, tmp_path).as_uri())
    series = page.evaluate(_DECISION_FILLS)
    fills = [s["swatch"] for s in series]
    for s in series:
        assert s["bars"] == [s["swatch"]], series  # a bar wears its swatch's texture
    assert fills[0].startswith("rgb(") and all(f.startswith("url(") for f in fills[1:]), fills
    assert len(set(fills)) == 4, fills
    browser.call("Emulation.setEmulatedVisionDeficiency", {"type": "deuteranopia"}, page.session)
    page.screenshot(tmp_path / "deuteranopia.png")


def test_the_needs_you_links_can_be_read_in_either_mode(night, browser, tmp_path):
    """The "needs you" list is links to its sections, left in the browser's own blue:
    on the dark page "27 escalation(s) on 6 note(s)" was dark blue on near-black (a
    contrast of about 2:1)."""
    for scheme, links, low in _read_in_each_mode(night, browser, tmp_path, "ul.needs a"):
        assert links, scheme
        assert low == [], (scheme, low)


def test_the_tile_that_needs_you_is_marked_in_forced_colours(night, browser, tmp_path):
    """The "need you" tile was marked by its red border alone: in forced colours (Windows'
    contrast themes, Chromium's emulation of them) every border is the system's one text
    colour, and it looked as the six tiles beside it. Compared as drawn: the tiles'
    borders and outlines, colours aside."""
    page_path = tmp_path / "forced.html"
    assert night.rq("report", "--since", "24h", "--html", str(page_path)).returncode == 0
    for forced in (False, True):
        page = browser.open(page_path.as_uri(), forced_colors=forced)
        assert page.evaluate("matchMedia('(forced-colors: active)').matches") is forced
        drawn = page.evaluate(
            """[...document.querySelectorAll('.tiles li')].map(li => {
            const s = getComputedStyle(li);
            return [li.className, ['Top', 'Right', 'Bottom', 'Left'].map(side =>
                s['border' + side + 'Width'] + ' ' + s['border' + side + 'Style']).join()
                + ' ' + s.outlineWidth + ' ' + s.outlineStyle];
        })"""
        )
        alert = [how for cls, how in drawn if cls == "alert"]
        others = {how for cls, how in drawn if cls != "alert"}
        assert len(alert) == 1 and alert[0] not in others, (forced, drawn)


# A reader's own text spacing, as WCAG 1.4.12 asks a page to bear without loss: a user
# style sheet of the four spacings at their least.
TEXT_SPACING = """(() => { const s = document.createElement('style');
    s.textContent = '* { line-height: 1.5 !important; letter-spacing: 0.12em !important; '
        + 'word-spacing: 0.16em !important; } p { margin-bottom: 2em !important; }';
    document.head.appendChild(s); })()"""


def test_every_tile_holds_its_figure_on_one_line(night, browser, tmp_path):
    """A night's wall time ("59 min 59 s") broke into two lines in its tile, and a cost of
    four figures ran out of its tile's box, at a laptop's width. With WCAG 1.4.12's text
    spacing the cost ran 40 px past its tile's border and widened a phone's page. A
    count of five figures read "48535" beside "141,900,000 tokens"."""
    from orchestrator.report import render

    data = night.report()
    data["reviewed"].update(wall_time_s=3599, cost_usd=1234.5678, pairs=48535)
    page_path = tmp_path / "long-figures.html"
    page_path.write_text(render.html(data), encoding="utf-8")
    screens = ((1280, False), (390, True))
    for (width, mobile), spacing in itertools.product(screens, (None, TEXT_SPACING)):
        page = browser.open(page_path.as_uri(), width=width, height=900, mobile=mobile)
        if spacing:
            page.evaluate(spacing)
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        tiles = page.evaluate(
            """[...document.querySelectorAll('.tiles li')].map(li => {
            const b = li.querySelector('b');
            return [b.textContent, b.getBoundingClientRect().height
                    < 1.5 * parseFloat(getComputedStyle(b).lineHeight),
                    b.scrollWidth <= li.clientWidth];
        })"""
        )
        assert [t for t in tiles if not (t[1] and t[2])] == [], (width, bool(spacing), tiles)
        assert ["59 min 59 s", True, True] in tiles and ["$1,234.5678", True, True] in tiles
        assert ["48,535", True, True] in tiles  # as the page writes tokens: "141,900,000"


def _counted_in_thousands(data: dict) -> None:
    """Every count the page writes, made one of five figures: the night's own counts and
    its charts' decisions (ids, years and commands stay as they are)."""
    big = lambda n: n and 10_000 + n  # noqa: E731 - a zero stays "none"
    r, n, k = data["reviewed"], data["needs_you"], data["kb_changes"]
    r["jobs"] = {who: {st: big(c) for st, c in by.items()} for who, by in r["jobs"].items()}
    r["attempts"] = {o: big(c) for o, c in r["attempts"].items()}
    for chart in ("by_lens", "by_gate"):
        r[chart] = {g: {dn: big(c) for dn, c in by.items()} for g, by in r[chart].items()}
    for row in (*r["reviewers"], *r["machines"], *n["failed_jobs"], *n["stalled"]):
        for key in ("attempts", "failed", "not_run", "lost", "pairs", "queued", "running"):
            if isinstance(row.get(key), int):
                row[key] = big(row[key])
    for d, keys in (
        (r, ("pairs", "queued_all", "fails_total", "warns_total", "fails_left_total")),
        (n, ("count", "escalations_open", "failed_total", "fixes_unwritten_total")),
        (k, ("fixes_applied", "fixes_committed", "human_edits_total")),
    ):
        d.update({key: big(d[key]) for key in keys if isinstance(d.get(key), int)})
    for fix in k["fixes"]:
        if fix.get("diff"):
            fix["diff"]["more"] = 12_345  # a fix that rewrote a long note


def test_the_page_writes_every_count_with_thousands_separators(night, browser, tmp_path):
    """P66 put separators in the tiles, the headings and the tokens, but the reviewers'
    and machines' tables, the attempts by outcome, the jobs' line, the "… and N more"
    lines and the charts' tables of numbers still said "10003" beside "141,900,000"."""
    from orchestrator.report import render

    data = night.report()
    _counted_in_thousands(data)
    page_path = tmp_path / "counts.html"
    page_path.write_text(render.html(data), encoding="utf-8")
    page = browser.open(page_path.as_uri(), width=1280, height=900)
    page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
    text = page.evaluate("document.body.innerText")
    assert _bare_counts(text) == []
    assert "10,00" in text


def test_status_writes_every_count_with_thousands_separators(night):
    """`status` on `bench/report.py`'s state said "jobs: queued 0, running 0, completed
    24120, failed 676" and "escalations open: 10011" where the report writes "24,120"."""
    from orchestrator.state.status import status_lines
    from orchestrator.state.workspace import Workspace

    data = json.loads(night.rq("status", "--json").stdout)
    data["jobs"] = {st: 10_000 + i for i, st in enumerate(data["jobs"])}
    data["escalations_open"] = 10_011
    data["cost_usd"] = {"today": 1234.5, "total": 12345.5}
    ws = Workspace.open(night.root)
    store = ws.read_store()
    try:
        said = "\n".join(status_lines(ws, store, data))
    finally:
        store.close()
    assert _bare_counts(said) == [], said
    assert "escalations open: 10,011" in said and "total $12,345.5000" in said, said


def test_the_no_worker_line_writes_its_count_with_thousands_separators():
    """`status` and the page's "Jobs that do not move" said "20000 job(s) wait and no
    worker has been heard from …" beside counts written "24,120" (U100)."""
    from orchestrator.state.status import idle_words

    heard = {"last_heard_at": "2026-11-29T03:00:00.000Z", "last_heard_from": "host:123"}
    for control_runs in (False, True):
        said = idle_words(20_000, control_runs, heard, "2026-11-29T07:00:00.000Z")
        assert said.startswith("20,000 job(s) wait") and _bare_counts(said) == [], said


def test_a_notes_escalations_changed_since_their_fails_are_one_line_in_the_terminal(night):
    """On `bench/report.py`'s night each of the first five notes, escalated on eight gates
    and edited since, had "changed since its FAIL (…): a reject holds the pair as it is
    now, …" eight times, one a gate: forty near-identical lines before the failed jobs."""
    from orchestrator.report import render

    data = night.report()
    g = next(g for g in data["needs_you"]["escalations"] if len(g["escalations"]) > 2)
    *mended, moved = g["escalations"]
    for e in mended:
        e.update(changed_since_fail=f"{e['gate_id']} note-changed", only_reject=None)
    moved.update(changed_since_fail=f"{moved['gate_id']} gate-changed", only_reject=None)
    held = [ln for ln in render.text(data, None).splitlines() if "changed since" in ln]
    assert held == [
        f"    changed since their FAILs ({', '.join(e['gate_id'] for e in mended)} note-changed; "
        f"{moved['gate_id']} gate-changed): a reject holds each pair as it is now, unreviewed, "
        "under the FAIL of the earlier text (a redo has the next sweep review them; approve "
        "accepts them)"
    ], held


def _bare_counts(text: str) -> list[str]:
    """Five figures or more with no separator, each with the words around it: not a
    date's year, a cost's decimals, a process id (host:pid) or an id in a command or a
    hash (letters beside them)."""
    return [
        text[max(0, m.start() - 30) : m.end() + 10]
        for m in re.finditer(r"(?<![\w.,$:])\d{5,}(?![\w,-])", text)
    ]


def test_the_terminal_writes_every_count_with_thousands_separators(night):
    """The page said "10,003" (P66) where the terminal's report of the same night said
    "pairs reviewed: 10003 (PASS 10001, …)", "10002 failed job(s)", "… 10001 more …"."""
    from orchestrator.report import render

    data = night.report()
    _counted_in_thousands(data)
    data["reviewed"]["decisions"] = {d: 10_000 + i for i, d in enumerate(("PASS", "WARN", "FAIL"))}
    data["kb_changes"]["fix_results"] = {"unchanged": 12_345}
    said = render.text(data, None)
    assert _bare_counts(said) == [], said
    assert "(PASS 10,000, WARN 10,001, FAIL 10,002, ERROR 0)" in said, said


def test_enqueue_and_create_jobs_write_their_counts_with_thousands_separators(kb, run_cli):
    """P71: P67 gave the sweep's summary "enqueued 1,000 job(s) (1,000 pairs)", but the
    same jobs queued by `reviewq enqueue` said "queued 1000 job(s), 1000 pair(s)", and
    `create-jobs` "0 job(s) created, 1000 pair(s) skipped"; --json stays bare."""
    kb.gate("prose/body-check", ["body"])
    for i in range(1000):
        kb.note(f"n{i:04}")
    res = run_cli("enqueue", "--all-gates")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.startswith("queued 1,000 job(s), 1,000 pair(s) for reviewer offline; "), (
        res.stdout
    )
    assert "skipped 0" in res.stdout
    selected = run_cli("select", "--all-gates", "--model", "offline", "--json").stdout
    res = run_cli("create-jobs", "--input", "-", "--grouping", "note", input=selected)
    assert res.exit_code == 0, res.stderr
    assert res.stdout == "0 job(s) created, 1,000 pair(s) skipped\n"
    res = run_cli("create-jobs", "--input", "-", "--grouping", "note", "--json", input=selected)
    assert len(json.loads(res.stdout)["skipped"]) == 1000


def test_a_small_phone_shows_the_tiles_two_a_row(night, browser, tmp_path):
    """On a 320-px phone (or 400 % zoom) the seven tiles stood one a row, some 500 px: the
    first screen held the tiles alone, and what needs you began below it."""
    page_path = tmp_path / "small-phone.html"
    assert night.rq("report", "--since", "24h", "--html", str(page_path)).returncode == 0
    page = browser.open(page_path.as_uri(), width=320, height=568, mobile=True)
    tops = page.evaluate(
        "[...document.querySelectorAll('.tiles li')].map(li => li.getBoundingClientRect().top)"
    )
    assert len(tops) == 7 and len(set(tops)) == 4, tops
    assert page.evaluate("document.documentElement.scrollWidth") <= 320


def test_no_charts_scale_labels_run_into_each_other(night, browser, tmp_path):
    """A sweep of a real KB (356 notes, 42 gates, 13,647 pairs) drew "0 200400600800
    1000…3000" under "Decisions per lens", "120160200240280320" under "Decisions per
    gate" and "0%10%20%…100%" under the FAIL rates: pygal put up to 16 figures on a scale
    the gates' names had left a third of the width, each running into the next."""
    from orchestrator.report import render

    data = night.report()
    lenses = ("accessibility", "complexity", "frontmatter", "prose", "semantic", "sentence")
    gates = [
        f"{lens}/a-gate-named-as-real-catalogs-name-them-{i}" for i in range(7) for lens in lenses
    ]
    data["reviewed"].update(
        by_lens={lens: {"PASS": 1400 + 300 * i, "FAIL": 8} for i, lens in enumerate(lenses)},
        by_gate={g: {"PASS": 330 + i, "FAIL": i % 2} for i, g in enumerate(gates)},
    )
    data["trends"]["fail_rate_by_gate"] = [
        {"gate_id": g, "rate": 0.004 * (i % 3), "suspect": False} for i, g in enumerate(gates)
    ]
    page_path = tmp_path / "a-real-kbs-night.html"
    page_path.write_text(render.html(data), encoding="utf-8")
    for width, mobile in ((1280, False), (390, True)):
        page = browser.open(page_path.as_uri(), width=width, height=900, mobile=mobile)
        scales = page.evaluate(
            r"""[...document.querySelectorAll('figure svg')].map(svg => {
            const caption = svg.closest('figure').querySelector('figcaption');
            return [caption ? caption.textContent : '?',
                    [...svg.querySelectorAll('g.axis')].map(axis =>
                        [...axis.querySelectorAll(':scope > g.guides > text')]
                        .filter(t => t.textContent)
                        .map(t => { const b = t.getBoundingClientRect();
                                    const turn = /rotate\(([-\d.]+)/.exec(t.getAttribute('transform') || '');
                                    return [t.textContent, b.left, b.right, b.top, b.bottom,
                                            turn ? Number(turn[1]) : 0,
                                            parseFloat(getComputedStyle(t).fontSize)]; }))];
        })"""
        )
        assert len(scales) >= 3, scales
        crowded = []
        for caption, axes in scales:
            for labels in axes:
                for a, b in itertools.combinations(labels, 2):
                    if a[5]:  # turned alike: apart by their lines, across the turn
                        across = abs(b[1] - a[1]) * math.sin(math.radians(abs(a[5])))
                        apart = across >= a[6]
                    else:
                        apart = a[2] <= b[1] or b[2] <= a[1] or a[4] <= b[3] or b[4] <= a[3]
                    if not apart:
                        crowded.append((width, caption, a[0], b[0]))
        assert crowded == [], crowded


def test_the_request_check_sees_a_page_that_fetches(browser, tmp_path):
    """The check above can fail: a page with an outside image and style is caught."""
    page_path = tmp_path / "leaky.html"
    page_path.write_text(
        '<!DOCTYPE html><meta http-equiv="Content-Security-Policy" content="default-src \'none\'">'
        '<link rel="stylesheet" href="http://127.0.0.1:9/x.css"><img src="http://127.0.0.1:9/x.png">'
    )
    page = browser.open(page_path.as_uri())
    assert set(page.requests()) == {
        page_path.as_uri(),
        "http://127.0.0.1:9/x.css",
        "http://127.0.0.1:9/x.png",
    }


def test_a_report_of_nothing_yet(kb, run_cli):
    # A state folder never used is refused, and none is made: read as empty, a mistyped
    # --state reported "needs you: nothing" over a night that needed someone.
    for args in (("report", "--json"), ("report",)):
        res = run_cli(*args)
        assert res.exit_code == 1 and res.stdout == ""
        assert res.stderr == (
            f"error: {kb.state}: no state.db here; nothing has run with this state folder "
            "yet (is --state or --root right?)\n"
        )
    assert not kb.state.exists()
    Store.open(kb.state).close()
    # --json reads only.
    res = run_cli("report", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["reviewed"]["pairs"] == 0 and data["needs_you"]["escalations"] == []
    assert data["html_path"] is None and not (kb.state / "report.html").exists()
    # For a person: a page, and "nothing" where nothing needs them.
    res = run_cli("report")
    assert res.exit_code == 0 and "needs you: nothing" in res.stdout
    assert f"report: {kb.state / 'report.html'}" in res.stdout
    assert "Nothing: no escalation is open" in (kb.state / "report.html").read_text()


def test_a_gate_that_fails_most_notes_is_called_into_question(kb, run_cli):
    # Four notes with no description: the gate watching it fails them all, the rest pass.
    kb.gate("frontmatter/has-description", ["description"])
    for gate in ("prose/has-body", "prose/body-again", "accessibility/has-title"):
        kb.gate(gate, ["title"] if gate.endswith("title") else ["body"])
    for name in ("a", "b", "c", "d"):
        kb.note(name, body=f"Body of {name}.\n", description="")
    res = reviewq_process("--root", str(kb.root), "sweep", "--reviewer", "offline", "--json")
    assert res.returncode == 0, res.stderr
    res = run_cli("report", "--since", "1h", "--json")
    trends = json.loads(res.stdout)["trends"]
    rates = {g["gate_id"]: (g["fail"], g["decided"]) for g in trends["fail_rate_by_gate"]}
    assert rates["frontmatter/has-description"] == (4, 4) and rates["prose/has-body"] == (0, 4)
    assert trends["suspect_gates"] == ["frontmatter/has-description"]
    res = run_cli("report", "--since", "1h", "--html", str(kb.root / "r.html"))
    assert res.exit_code == 0
    assert "gate frontmatter/has-description fails far more notes than the others" in res.stdout
    page = (kb.root / "r.html").read_text()
    assert page.count('class="note suspect-gate"') == 1
    assert "<b>frontmatter/has-description</b> fails 100% of the notes it judged" in page


def test_the_charts_are_worst_first_on_the_page_the_terminal_and_in_json(
    kb, run_cli, browser, tmp_path
):
    """ "FAIL rate per gate" was ordered by gate id: on a night of 17 gates the worst was
    wherever its name fell, and a reader looked for the longest bar. Worst first, ties by
    gate id, in the chart (top down), its table, the suspect gates' lines and --json.
    "Decisions per lens", "Decisions per gate" and the attempt failure rates were still
    by name (stop 48), "Cost per reviewer" too: each is worst (or dearest) first."""
    for gate, watches in (
        ("accessibility/has-title", ["title"]),
        ("frontmatter/has-body", ["body"]),
        ("frontmatter/has-title", ["title"]),
        ("prose/a-description", ["description"]),
        ("prose/description-or-body", ["description", "body"]),
    ):
        kb.gate(gate, watches)
    kb.note("a", description="")
    kb.note("b", description="")
    kb.note("c", body="")
    d = str(kb.root / kb.note("d"))
    res = reviewq_process("--root", str(kb.root), "sweep", "--reviewer", "offline", "--json")
    assert res.returncode == 0, res.stderr
    # A reviewer named after offline that fails every attempt (and costs $0.01 each).
    kb.write("reviewq.toml", profile("zz-crashy", FAKE_MODE="crash", FAKE_TURNS="1") + QUEUE)
    res = reviewq_process(
        "--root", str(kb.root), "sweep", "--reviewer", "zz-crashy", "--note", d, "--json"
    )
    assert res.returncode == 1, res.stderr  # its job failed, as the sweep says
    worst_first = [
        "prose/description-or-body",  # 3 of 4
        "prose/a-description",  # 2 of 4
        "frontmatter/has-body",  # 1 of 4
        "accessibility/has-title",
        "frontmatter/has-title",
    ]
    data = json.loads(run_cli("report", "--since", "1h", "--json").stdout)
    trends = data["trends"]
    assert [g["gate_id"] for g in trends["fail_rate_by_gate"]] == worst_first
    assert trends["suspect_gates"] == worst_first[:2]
    assert list(data["reviewed"]["by_gate"]) == worst_first  # 3, 2, 1, 0 and 0 FAILs
    assert list(data["reviewed"]["by_lens"]) == ["prose", "frontmatter", "accessibility"]
    failing = [r["reviewer"] for r in trends["attempt_failure_by_reviewer"]]
    assert failing == ["zz-crashy", "offline"]
    page_path = tmp_path / "r.html"
    res = run_cli("report", "--since", "1h", "--html", str(page_path))
    said = [x.split()[1] for x in res.stdout.splitlines() if x.startswith("  gate ")]
    assert said == worst_first[:2], res.stdout
    page = browser.open(page_path.as_uri())
    shown = page.evaluate(
        """(() => {
        const chart = caption => {
            const f = [...document.querySelectorAll('figure.chart')]
                .find(f => f.querySelector('figcaption').textContent.startsWith(caption));
            const bars = [...f.querySelectorAll('g.bar')]
                .map(b => [b.querySelector('rect').getBoundingClientRect().top,
                           b.querySelector('title').textContent.split(':')[0]])
                .sort((x, y) => x[0] - y[0]).map(b => b[1]);
            return {bars: [...new Set(bars)],  // a stacked bar's parts, one name
                    rows: [...f.querySelectorAll('tbody th')].map(th => th.textContent)};
        };
        return {rates: chart('FAIL rate'), gates: chart('Decisions per gate'),
                lenses: chart('Decisions per lens'), failing: chart('Attempt failure'),
                cost: chart('Cost per reviewer'),
                suspect: [...document.querySelectorAll('.suspect-gate b')].map(b => b.textContent)};
    })()"""
    )
    lenses = list(data["reviewed"]["by_lens"])
    assert shown == {
        "rates": {"bars": worst_first, "rows": worst_first},
        "gates": {"bars": worst_first, "rows": worst_first},
        "lenses": {"bars": lenses, "rows": lenses},
        "failing": {"bars": failing, "rows": failing},
        "cost": {"bars": ["zz-crashy", "offline"], "rows": ["zz-crashy", "offline"]},
        "suspect": worst_first[:2],
    }, shown


def test_the_fails_of_a_run_without_fix_are_named(kb, run_cli):
    """A first sweep without --fix: its FAILs go to no fixer and no person, and a later
    --fix sweep finds them fresh. The report said "FAIL 2" and "needs you: nothing", and
    named no note: status, jobs and the page did not either."""
    kb.gate("frontmatter/has-description", ["description"])
    kb.gate("prose/has-body", ["body"])
    for name, description in (("a", ""), ("b", ""), ("c", "Says what c is.")):
        kb.note(name, body=f"Body of {name}.\n", description=description)
    res = reviewq_process("--root", str(kb.root), "sweep", "--reviewer", "offline", "--json")
    assert res.returncode == 0, res.stderr
    res = run_cli("report", "--since", "1h", "--html", str(kb.root / "r.html"))
    assert res.exit_code == 0, res.stderr
    said = [ln for ln in res.stdout.splitlines() if ln.startswith("  FAIL ")]
    assert [ln.split(":")[0] for ln in said] == [
        "  FAIL kb/notes/a.md frontmatter/has-description",
        "  FAIL kb/notes/b.md frontmatter/has-description",
    ], res.stdout
    assert "the description region is empty" in said[0] and "reviewq job " in said[0]
    data = json.loads(run_cli("report", "--since", "1h", "--json").stdout)["reviewed"]
    assert data["fails_total"] == 2
    assert [(f["note_path"], f["gate_id"]) for f in data["fails"]] == [
        ("kb/notes/a.md", "frontmatter/has-description"),
        ("kb/notes/b.md", "frontmatter/has-description"),
    ]
    page = (kb.root / "r.html").read_text()
    assert "FAIL findings: 2" in page and page.count('<tr class="fail">') == 2


def test_a_cut_list_names_the_command_that_shows_the_rest_of_its_period(
    kb, run_cli, browser, tmp_path
):
    """A big night's page cut its lists at 50 and said "… and 493 more: reviewq report
    --full". Run after the report it follows, that command reported since that report, a
    period of nothing: the rest were in no page. The cut names the report's own period."""
    kb.gate("frontmatter/has-description", ["description"])
    for i in range(51):  # one past the page's 50
        kb.note(f"n{i:02d}", body=f"Body of n{i:02d}.\n", description="")
    res = reviewq_process(
        "--root", str(kb.root), "sweep", "--reviewer", "offline", "--grouping", "gate",
        "--batch-size", "60",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    res = run_cli("report")  # the morning's: the next one starts where it ends
    assert res.exit_code == 0, res.stderr
    page = browser.open((kb.state / "report.html").as_uri())
    cut = page.evaluate("document.querySelector('#fail-findings ~ p.meta').innerText")
    assert cut.startswith("… and 1 more: reviewq report --full"), cut
    command = page.evaluate("document.querySelector('#fail-findings ~ p.meta code').innerText")
    said = res.stdout
    argv = command.split()
    assert argv[:2] == ["reviewq", "report"], command
    res = run_cli(*argv[1:], "--html", str(tmp_path / "full.html"))
    assert res.exit_code == 0, res.stderr
    full = browser.open((tmp_path / "full.html").as_uri())
    assert full.evaluate("document.querySelectorAll('tr.fail').length") == 51
    # The terminal names the same command for the FAILs it leaves out.
    assert f"on the page, every one with {command}\n" in said, said


def test_a_sweeps_summary_names_a_few_failed_jobs_and_counts_the_rest(kb):
    """A night whose reviewer crashed on some notes printed a `failed job N: …` line for
    each of its 165 failed jobs, above the escalations they raised (cut at 20 notes): the
    mail of the night was 165 lines of one reason before the first thing to decide."""
    kb.gate("prose/has-body", ["body"])
    for i in range(5):
        kb.note(f"n{i}", body=f"Body of n{i}.\n")
    kb.write(
        "reviewq.toml",
        profile("crashy", partition="crash", FAKE_MODE="crash", FAKE_TURNS="1") + QUEUE,
    )
    res = reviewq_process("--root", str(kb.root), "sweep", "--reviewer", "crashy")
    assert res.returncode == 1 and "error: 5 job(s) failed" in res.stderr, res.stderr
    said = [ln for ln in res.stdout.splitlines() if ln.startswith("failed job ")]
    assert len(said) == 3, res.stdout
    assert "\n… 2 more failed job(s): reviewq jobs --state failed\n" in res.stdout, res.stdout


def test_two_sweeps_on_one_machine_are_not_said_a_restarted_worker(kb, run_cli):
    """Each `reviewq sweep` runs a worker process of its own: two nights of `make run` (or
    of the system cron's `reviewq sweep --name`) on one machine, both ending well, and the
    page's machines said "vm (2 workers: restarted)", sending the person after a crash
    that never was. The page says the processes, as the terminal and --json do."""
    kb.gate("prose/has-body", ["body"])
    kb.note("a", body="Body of a.\n")
    for body in ("Body of a.\n", "Body of a, edited.\n"):  # the edit: a second night's pair
        kb.note("a", body=body)
        res = reviewq_process("--root", str(kb.root), "sweep", "--reviewer", "offline")
        assert res.returncode == 0, res.stderr
    (machine,) = json.loads(run_cli("report", "--since", "1h", "--json").stdout)["reviewed"][
        "machines"
    ]
    assert (machine["workers"], machine["attempts"], machine["lost"]) == (2, 2, 0)
    res = run_cli("report", "--since", "1h", "--html", str(kb.root / "r.html"))
    assert "(2 worker process(es), last heard" in res.stdout
    page = page_text(kb.root / "r.html")
    said = page.split('<h3 id="machines">Machines</h3>', 1)[1].split("</table>")[0]
    assert "restarted" not in said and "(2 worker processes)" in said, said


def test_the_fails_no_one_took_are_counted_in_needs_you(kb, run_cli, browser, tmp_path):
    """The terminal said "needs you: nothing" and then listed the FAILs a run without --fix
    sent to no one, under it; the page's Needs you said "Nothing: …" and its tile 0."""
    kb.gate("frontmatter/has-description", ["description"])
    for name in ("a", "b"):
        kb.note(name, body=f"Body of {name}.\n", description="")
    res = reviewq_process("--root", str(kb.root), "sweep", "--reviewer", "offline", "--json")
    assert res.returncode == 0, res.stderr
    page_path = tmp_path / "r.html"
    res = run_cli("report", "--since", "1h", "--html", str(page_path))
    assert "needs you: 2 FAIL finding(s) no fixer or person took\n" in res.stdout, res.stdout
    page = browser.open(page_path.as_uri())
    tile = page.evaluate("document.querySelector('.tiles li').innerText")
    assert tile.split() == ["2", "need", "you"], tile
    needs = page.evaluate("document.querySelector('#needs-you').innerText")
    assert "2 FAIL finding(s) no fixer or person took" in needs and "Nothing" not in needs
    assert page.evaluate("document.querySelector('#fail-findings') !== null")
    # Five columns on a phone: the job's number and heading stay whole ("Jo" over "b").
    phone = browser.open(page_path.as_uri(), width=390, mobile=True)
    lines = phone.evaluate(
        "[...document.querySelectorAll('#fail-findings + .table .n')].map(c => {"
        "const r = document.createRange(); r.selectNodeContents(c); return r.getClientRects().length})"
    )
    assert lines == [1, 1, 1], lines


def test_the_fails_named_are_those_no_fixer_or_person_took(night, tmp_path):
    """A night with --fix sends every FAIL on: nectar-flow's was fixed and passed, the city
    note's were escalated (each note with its decide line). The terminal named the first
    three by path, escalated ones, and "8 more FAIL finding(s)": none needed anyone. The
    FAILs of a run without --fix, acked or not (an ack is no decision on the finding), are
    the ones no one takes."""
    copy = Night(tmp_path / "copy")
    shutil.copytree(night.root, copy.root, ignore=shutil.ignore_patterns("*.bell"))
    res = copy.rq("report", "--since", "24h")
    assert res.returncode == 0, res.stderr
    assert [ln for ln in res.stdout.splitlines() if ln.startswith("  ") and "FAIL" in ln] == []
    left = (
        "swarming-is-driven-by-brood-nest-congestion.md",
        "winter-survival-is-decided-in-late-summer.md",
    )
    for name in left:  # the fixer's reviewer FAILs a note without its marker; no --fix
        res = copy.rq(
            "sweep", "--reviewer", "fixer", "--note", str(copy.root / "kb/notes" / name), GATE
        )
        assert "wait on a paused reviewer" in res.stderr  # the night's other jobs: exit 1
    winter = copy.root / "kb/notes" / left[1]
    winter.write_text(winter.read_text() + "\nA trivial line.\n")
    res = copy.rq("ack", "--model", "fix", str(winter), GATE)
    assert res.returncode == 0, res.stderr
    res = copy.rq("report", "--since", "24h")
    said = [ln for ln in res.stdout.splitlines() if ln.startswith("  ") and "FAIL" in ln]
    assert [ln.split(":")[0] for ln in said] == [f"  FAIL kb/notes/{n} {GATE}" for n in left]
    r = copy.report()["reviewed"]
    then = {(f["note_path"], f["gate_id"]): f["then"] for f in r["fails"]}
    assert then[(FIXED_NOTE, GATE)] == "reviewed-again"
    assert then[(CITY, GATE)] == "escalated"
    assert [k for k, v in then.items() if v is None] == [(f"kb/notes/{n}", GATE) for n in left]
    assert r["fails_left_total"] == 2 and r["fails_total"] == len(r["fails"]) == 13


def test_the_fails_are_listed_worst_first_those_mended_last(night):
    """The page cuts its FAIL findings at 50: on a night of 543, after the FAILs nothing
    came of, it listed them by note path, 18 of its 50 rows FAILs already fixed and
    passed ("reviewed again") ahead of 308 escalated ones still waiting for a person."""
    rank = {None: 0, "escalated": 1, "fix": 2, "reviewed-again": 3}
    fails = night.report()["reviewed"]["fails"]
    then = [f["then"] for f in fails]
    assert {"escalated", "reviewed-again"} <= set(then), then
    assert then == sorted(then, key=rank.__getitem__), then


def test_a_page_that_cannot_be_written_is_not_remembered_as_shown(kb, run_cli):
    Store.open(kb.state).close()
    blocker = kb.root / "not-a-folder"
    blocker.write_text("a file where the page's folder should be\n")
    res = run_cli("report", "--since", "2000-01-01", "--html", str(blocker / "r.html"))
    assert res.exit_code == 1 and res.stderr.startswith("error: --html ")
    assert res.stderr.count("\n") == 1
    # Nobody saw that report: the next one still starts where it would have without it.
    data = json.loads(run_cli("report", "--json").stdout)
    assert data["period"]["label"] == "the last 24 h (no earlier report)"


def test_a_job_queued_before_the_last_report_and_run_after_it_is_in_the_next(kb, run_cli):
    """Reports run "since the last report": by creation time alone, work queued before a
    report a person saw and done after it (enqueue, a budget or a pause that held it)
    was in neither report."""
    kb.gate("frontmatter/has-description", ["description"])
    kb.note("empty", description="")
    kb.note("full")
    kb.write(
        "reviewq.toml",
        '[reviewers.broken]\nkind = "command"\ncommand = ["/nonexistent/agent"]\n'
        'partition = "offline"\n',
    )
    jobs = run_cli("enqueue", "--all-gates", "--json").json()["jobs"]
    # An attempt before the report: its program is missing; the job goes back to the queue.
    assert run_cli("run-job", str(jobs[0]["review_job_id"]), "--reviewer", "broken").exit_code == 1
    res = run_cli("report")  # a person looks: two jobs queued
    assert res.exit_code == 0, res.stderr
    for job in jobs:
        assert run_cli("run-job", str(job["review_job_id"])).exit_code == 0
    data = run_cli("report", "--json").json()
    assert data["reviewed"]["pairs"] == 2
    assert data["reviewed"]["decisions"] == {"PASS": 1, "FAIL": 1}
    # Each attempt counts in the report of its own window: the launch failure was told.
    assert data["reviewed"]["attempts"] == {"finalized": 2}


def _minutes_ago(minutes: int) -> str:
    from datetime import UTC, datetime, timedelta

    from orchestrator.state.store import timestamp

    return timestamp(datetime.now(UTC) - timedelta(minutes=minutes))


def _queued_for_fake(kb, *notes: str) -> None:
    """One gate, these notes, and every pair of them queued for the fake reviewer (no
    worker runs them)."""
    kb.gate("frontmatter/has-description", ["description"])
    for name in notes:
        kb.note(name)
    kb.write("reviewq.toml", profile("fake") + FAST_QUEUE)
    res = reviewq_process("--root", str(kb.root), "enqueue", "--all-gates", "--reviewer", "fake")
    assert res.returncode == 0, res.stderr


def test_jobs_that_do_not_move_need_someone_whatever_the_period(kb, run_cli):
    """With no worker running, a night's jobs stayed queued, none had an attempt in the
    report's window, and the report said 'needs you: nothing'."""
    # Queued only a moment ago: that is no backlog yet.
    _queued_for_fake(kb, "a", "b")
    assert json.loads(run_cli("report", "--json").stdout)["needs_you"]["stalled"] == []
    # Twenty minutes on, nothing ran; the reaper gave up on one attempt no worker took.
    with sqlite3.connect(kb.state / "state.db") as conn:
        conn.execute("UPDATE review_jobs SET created_at = ?", (_minutes_ago(20),))
        job_id = conn.execute("SELECT min(id) FROM review_jobs").fetchone()[0]
        conn.execute(
            "INSERT INTO attempts (job_id, attempt, outcome, started_at, ended_at, reasons) "
            "VALUES (?, 1, 'lost', ?, ?, '[\"never picked up by a worker\"]')",
            (job_id, _minutes_ago(19), _minutes_ago(1)),
        )
    res = run_cli("report", "--since", "10m", "--json")
    needs = json.loads(res.stdout)["needs_you"]
    assert [
        (s["reviewer"], s["queued"], s["running"], s["never_picked_up"]) for s in needs["stalled"]
    ] == [("fake", 2, 0, 1)]
    assert needs["no_worker"]["says"] == (
        "2 job(s) wait and no control process is running, and no worker has been heard from "
        "yet: start one of each (reviewq control; reviewq worker)"
    )
    # One stall, one thing to do: its reviewer's jobs are the two the line above counts
    # (a big night's tile and list said it twice, as two items of "needs you").
    assert needs["count"] == 1
    res = run_cli("report", "--since", "10m")
    assert "needs you: 2 job(s) waiting with no control process\n" in res.stdout
    assert "  reviewer fake: 2 queued and 0 running job(s), nothing has run since " in res.stdout
    assert "1 attempt(s) were never picked up by a worker: is a worker running?" in res.stdout
    page = (kb.state / "report.html").read_text()
    needs_list = page.split('<ul class="needs">', 1)[1].split("</ul>", 1)[0]
    assert needs_list.count("<li>") == 1 and 'href="#no-worker">2 job(s) waiting' in needs_list
    assert '<h3 id="stalled">Jobs that do not move</h3>' in page  # the reviewer's own words
    # A job held by a spent budget waits for its run's next turn: said there, not here.
    with sqlite3.connect(kb.state / "state.db") as conn:
        run = conn.execute(
            "INSERT INTO sweep_runs (name, trigger, options, budget_usd, started_at) "
            "VALUES ('nightly', 'cli', '{}', 0, ?) RETURNING id",
            (_minutes_ago(20),),
        ).fetchone()[0]
        conn.execute("UPDATE review_jobs SET sweep_run_id = ? WHERE id = ?", (run, job_id))
    needs = json.loads(run_cli("report", "--since", "10m", "--json").stdout)["needs_you"]
    assert [(s["reviewer"], s["queued"]) for s in needs["stalled"]] == [("fake", 1)]


def test_jobs_that_do_not_move_are_said_whatever_a_workers_clock_says(kb, run_cli):
    """A worker whose clock runs an hour ahead of the control's: the last attempt it ran
    launched and ended, by its own stamps, an hour from now, and the report took those for
    the reviewer's last move: 'needs you: nothing' over jobs that had not moved for 20
    minutes, for as long as that clock was ahead. Moves are read on the control's clock
    (its heartbeat, the outcome's recording), as `status` reads them."""
    _queued_for_fake(kb, "a", "b")
    with sqlite3.connect(kb.state / "state.db") as conn:
        conn.execute("UPDATE review_jobs SET created_at = ?", (_minutes_ago(30),))
        job_id = conn.execute("SELECT min(id) FROM review_jobs").fetchone()[0]
        conn.execute(
            "INSERT INTO attempts (job_id, attempt, outcome, worker, started_at, launched_at, "
            "heartbeat_at, ended_at, recorded_at, reasons) "
            "VALUES (?, 1, 'launch-failure', 'far:1', ?, ?, ?, ?, ?, '[\"no agent\"]')",
            (
                job_id,
                _minutes_ago(22),
                _minutes_ago(-40),  # the worker's clock: an hour ahead
                _minutes_ago(21),
                _minutes_ago(-40),
                _minutes_ago(20),
            ),
        )
    needs = json.loads(run_cli("report", "--since", "10m", "--json").stdout)["needs_you"]
    assert [(s["reviewer"], s["queued"]) for s in needs["stalled"]] == [("fake", 2)]


def test_jobs_that_do_not_move_after_an_outage_name_it(kb, run_cli):
    """A reviewer whose endpoint was out of reach paused, its pause ran out with no control
    process left to try again, and the morning report asked only "is the control process
    running?": the outage the night ended on was in no line of it."""
    _queued_for_fake(kb, "a")
    unreachable = "unreachable: cannot reach http://127.0.0.1:9/v1/chat/completions"
    with sqlite3.connect(kb.state / "state.db") as conn:
        conn.execute("UPDATE review_jobs SET created_at = ?", (_minutes_ago(40),))
        job_id = conn.execute("SELECT min(id) FROM review_jobs").fetchone()[0]
        for n, outcome, reason in [
            (1, "invalid-output", "missing pair"),
            (2, "reviewer-failure", unreachable),
        ]:
            conn.execute(
                "INSERT INTO attempts (job_id, attempt, outcome, started_at, launched_at, "
                "ended_at, reasons) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (job_id, n, outcome, *[_minutes_ago(40 - n)] * 3, json.dumps([reason])),
            )
    (stalled,) = json.loads(run_cli("report", "--json").stdout)["needs_you"]["stalled"]
    assert stalled["last_not_run"] == f"reviewer-failure: {unreachable}"  # as CONTRACT names it
    # A person reads it in words, not "reviewer-failure: unreachable: cannot reach …".
    said = "the reviewer's endpoint could not be reached: cannot reach http://127.0.0.1:9/"
    res = run_cli("report", "--since", "10m")
    assert f"its last attempt did not run ({said}" in res.stdout, res.stdout
    page = page_text(kb.state / "report.html")
    assert f"({said}" in page.replace("&#39;", "'")
    for shown in (res.stdout, page):
        assert "reviewer-failure" not in shown and "unreachable:" not in shown
    (line,) = [x for x in run_cli("job", str(job_id)).stdout.splitlines() if "attempt 2" in x]
    assert line.startswith("  attempt 2: no model answered, "), line
    assert f"    {said}v1/chat/completions\n" in run_cli("job", str(job_id)).stdout


def test_job_n_says_a_full_disk_not_that_no_model_answered(kb, run_cli):
    """A reviewer failure is also the worker's full disk (the model may have answered
    every turn): `job N` headed it "no model answered", a false lead under which its
    reason said the disk."""
    _queued_for_fake(kb, "a")
    full = "disk: 12 KiB left on /srv/state; no output: exited 0"
    with sqlite3.connect(kb.state / "state.db") as conn:
        job_id = conn.execute("SELECT min(id) FROM review_jobs").fetchone()[0]
        conn.execute(
            "INSERT INTO attempts (job_id, attempt, outcome, started_at, launched_at, "
            "ended_at, reasons) VALUES (?, 1, 'reviewer-failure', ?, ?, ?, ?)",
            (job_id, *[_minutes_ago(5)] * 3, json.dumps([full])),
        )
    out = run_cli("job", str(job_id)).stdout
    (line,) = [x for x in out.splitlines() if "attempt 1:" in x]
    assert line.startswith("  attempt 1: the worker's disk is full, "), line
    assert "no model answered" not in out


def test_a_budget_is_charged_with_its_own_runs_spend_only(kb, run_cli):
    """A run's spend was every attempt of its sweep's name since it began: the next run of
    'nightly' was charged to the first too, which then read 'budget reached'."""
    kb.gate("frontmatter/has-description", ["description"])
    for name in ("a", "b"):
        kb.note(name)
    kb.write("reviewq.toml", profile("fake", FAKE_TURNS="1") + FAST_QUEUE)  # $0.01 an attempt
    for name in ("a", "b"):
        res = reviewq_process(
            "--root", str(kb.root), "sweep", "--reviewer", "fake", "--name", "nightly",
            "--budget-usd", "0.015", "--note", f"kb/notes/{name}.md", "--all-gates",
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
    data = json.loads(run_cli("report", "--since", "1h", "--json").stdout)
    assert data["needs_you"]["budgets_reached"] == [] and data["reviewed"]["cost_usd"] == 0.02
    from orchestrator.state.status import over_budget_runs

    with Store.open(kb.state) as store:
        assert over_budget_runs(store) == set()


def test_attempts_no_agent_answered_are_not_the_reviewers_failures(kb, run_cli):
    """Lost, launch-failure and reviewer-failure attempts were counted as the profile's
    failed attempts: with the workers down, every reviewer showed a 100 % failure rate."""
    _queued_for_fake(kb, "a")
    outcomes = ["lost", "launch-failure", "reviewer-failure", "invalid-output", "finalized"]
    with sqlite3.connect(kb.state / "state.db") as conn:
        job_id = conn.execute("SELECT id FROM review_jobs").fetchone()[0]
        for n, outcome in enumerate(outcomes, 1):
            conn.execute(
                "INSERT INTO attempts (job_id, attempt, outcome, started_at, ended_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (job_id, n, outcome, _minutes_ago(30 - n), _minutes_ago(29 - n)),
            )
    data = json.loads(run_cli("report", "--since", "1h", "--json").stdout)
    (row,) = data["reviewed"]["reviewers"]
    assert (row["attempts"], row["failed"], row["not_run"]) == (5, 1, 3)
    (trend,) = data["trends"]["attempt_failure_by_reviewer"]
    assert (trend["attempts"], trend["failed"], trend["rate"]) == (2, 1, 0.5)


def test_jobs_and_the_report_count_as_run_the_attempts_that_launched_an_agent(kb, run_cli):
    """`jobs` counted a dispatched attempt and one superseded before its launch as runs,
    and the report counted a lost attempt as not run even once its agent had launched:
    the two said different numbers of runs for one job. A run is an attempt that
    launched an agent, in both."""
    _queued_for_fake(kb, "a")
    attempts = [  # (outcome, launched)
        ("lost", True),
        ("lost", False),
        ("superseded", True),
        ("superseded", False),
        ("launch-failure", False),
        ("finalized", True),
        ("dispatched", False),
    ]
    with sqlite3.connect(kb.state / "state.db") as conn:
        job_id = conn.execute("SELECT id FROM review_jobs").fetchone()[0]
        for n, (outcome, launched) in enumerate(attempts, 1):
            conn.execute(
                "INSERT INTO attempts (job_id, attempt, outcome, started_at, launched_at, ended_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, n, outcome, _minutes_ago(30 - n), _minutes_ago(30 - n) if launched else None,
                 None if outcome == "dispatched" else _minutes_ago(29 - n)),
            )  # fmt: skip
    (job,) = json.loads(run_cli("jobs", "--json").stdout)["jobs"]
    # The dispatched one waits for a worker: neither a run nor one that failed to be (as
    # not run, every job of a sweep in progress read "(+1 not run)").
    assert (job["attempts"], job["attempts_not_run"]) == (3, 3)
    (row,) = json.loads(run_cli("report", "--since", "1h", "--json").stdout)["reviewed"][
        "reviewers"
    ]
    assert (row["attempts"] - row["not_run"], row["not_run"]) == (3, 3)


@pytest.mark.skipif(
    not Path("/usr/share/zoneinfo/America/Los_Angeles").exists(), reason="no tzdata here"
)
def test_a_since_without_an_offset_is_the_persons_local_time(kb):
    """An operator in UTC-8 who typed their 08:00 got a window eight hours off."""
    Store.open(kb.state).close()
    la = {"TZ": "America/Los_Angeles"}

    def since(value: str) -> str:
        res = reviewq_process("--root", str(kb.root), "report", "--json", "--since", value, env=la)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)["period"]["since"]

    assert since("2026-11-22T08:00") == "2026-11-22T16:00:00.000Z"
    assert since("2026-11-22") == "2026-11-22T08:00:00.000Z"
    assert since("2026-11-22T08:00Z") == "2026-11-22T08:00:00.000Z"  # an offset is kept
    # A date with an offset was local midnight, or its offset read as a time of day.
    assert since("2026-11-22Z") == "2026-11-22T00:00:00.000Z"
    assert since("2026-11-22-05:00") == "2026-11-22T05:00:00.000Z"
    # Across the change from daylight time (1 November 2026): each on its own day's clock.
    assert since("2026-11-01T00:30") == "2026-11-01T07:30:00.000Z"
    assert since("2026-11-02") == "2026-11-02T08:00:00.000Z"


def test_a_nightly_sweep_is_one_night_of_cost_on_the_local_clock(kb, monkeypatch):
    """A night ran noon to noon UTC: in Honolulu (UTC-10) that is 02:00 to 02:00, so the
    01:30 sweep's cost was two bars of the chart, and the night before last was the last."""
    from datetime import UTC, datetime, timedelta

    from orchestrator.state.store import timestamp

    def hst(day: int, h: int, m: int) -> str:  # Honolulu keeps no daylight time
        return timestamp(datetime(2026, 11, day, h, m, tzinfo=UTC) + timedelta(hours=10))

    with Store.open(kb.state) as store, store.write():
        job = store.conn.execute(
            "INSERT INTO review_jobs (status, model_partition, grouping, reviewer, job_dir, "
            "created_at, updated_at) VALUES ('completed', 'p', 'note', 'fake', 'jobs/x', ?, ?) "
            "RETURNING id",
            (hst(26, 1, 30), hst(26, 3, 0)),
        ).fetchone()[0]
        for n, at in enumerate((hst(26, 1, 31), hst(26, 2, 40)), 1):  # the sweep, 01:30 on
            store.conn.execute(
                "INSERT INTO attempts (job_id, attempt, outcome, started_at, ended_at, cost_usd) "
                "VALUES (?, ?, 'invalid-output', ?, ?, 1.0)",
                (job, n, at, at),
            )
    from orchestrator.report import make_report

    with local_clock(monkeypatch, "Pacific/Honolulu"), Store.open(kb.state) as store:
        # read at 08:00 the next morning
        rep = make_report(store, kb.state, since="12h", remember=False, now=hst(26, 8, 0))
    nights = rep.data["trends"]["cost_by_night"]
    assert nights[-1] == {"night": "2026-11-25", "cost_usd": 2.0}, nights


def test_a_job_a_later_run_takes_over_brings_no_earlier_cost(kb):
    """Queued work of an earlier run moves to the next run of the same sweep; its earlier
    attempts' cost was charged to the new run's budget."""
    from orchestrator.state.status import spent_usd
    from orchestrator.sweeps.producer import start_run

    with Store.open(kb.state) as store:
        with store.write():
            first = start_run(store, "nightly", "cli", {}, 1.0)
            job = store.conn.execute(
                "INSERT INTO review_jobs (status, model_partition, grouping, reviewer, job_dir, "
                "sweep, sweep_run_id, created_at, updated_at) VALUES ('queued', 'p', 'note', "
                "'fake', 'jobs/x', 'nightly', ?, ?, ?) RETURNING id",
                (first, _minutes_ago(60), _minutes_ago(60)),
            ).fetchone()[0]
            store.conn.execute(
                "INSERT INTO attempts (job_id, attempt, outcome, started_at, ended_at, cost_usd) "
                "VALUES (?, 1, 'invalid-output', ?, ?, 0.5)",
                (job, _minutes_ago(59), _minutes_ago(58)),
            )
            second = start_run(store, "nightly", "cli", {}, 1.0)
            store.conn.execute(
                "UPDATE review_jobs SET sweep_run_id = ? WHERE id = ?", (second, job)
            )
        assert spent_usd(store, second) == 0


@pytest.mark.parametrize(
    ("value", "said"),
    [
        # A date the clock cannot place said "not a date or time", sending one to a typo.
        ("9999-12-31T23:00-05:00", "date out of range"),  # past the calendar's end in UTC
        ("0001-01-01T00:00+01:00", "date out of range"),  # before its start
        ("0001-01-01", "date out of range"),  # on the local clock
        ("2026-13-01", "not a date or time"),
        ("2026-11-22x08:00", "not a date or time"),  # any character passed between them
        ("20261122", "a duration needs its unit"),  # read as 234 days of seconds
        # A window that can hold nothing (9999-12-31 itself Python 3.12 and later cannot
        # place on the local clock: it probes the day after, in year 10000).
        ("9998-12-31", "after now"),
        # A time of day out of range said "not a duration like '30m'".
        ("24:00", "not a time of day"),
        ("08:61", "not a time of day"),
    ],
)
def test_a_since_that_names_no_window_is_one_line(kb, run_cli, value, said):
    Store.open(kb.state).close()
    res = run_cli("report", "--json", "--since", value)
    assert res.exit_code == (1 if said == "after now" else 2), res.stdout
    [line] = res.stderr.splitlines()
    where = "" if res.exit_code == 1 else "reviewq report: "  # bad usage names its command
    assert line.startswith(f"error: {where}--since {value!r}: ") and said in line, line


def test_an_escalation_whose_report_is_not_written_yet_shows_what_state_db_holds(kb, tmp_path):
    """Raised while the disk was full, its gate-review file waits to be written: the page
    showed only "cannot be read: No such file", though state.db holds the call and the
    material a person votes on."""
    from orchestrator.report import make_report

    esc, rel = escalated_alpha(kb)
    (kb.state / rel).unlink()
    with Store.open(kb.state) as store:
        with store.write():
            store.conn.execute(
                "INSERT INTO escalation_reports_due VALUES (?, ?, ?)",
                (esc, "2026-11-26T00:00:00Z", "No space left on device"),
            )
        rep = make_report(store, kb.state, since="1h", remember=False)
    [group] = rep.data["needs_you"]["escalations"]
    shown = group["escalations"][0]["report"].splitlines()
    assert shown[0] == (
        "(the gate-review report is not written yet (No space left on device); the control "
        "process writes it at its next tick)"
    )
    assert shown[1:] == [
        "Recommend reject: it stays thin.",
        "Material:",
        "- high: the body is one line.",
    ]
    # Deleted and marked due again (rewrite-files): no error to name, and no full disk.
    with Store.open(kb.state) as store:
        with store.write():
            store.conn.execute("UPDATE escalation_reports_due SET error = 'not written yet'")
        rep = make_report(store, kb.state, since="1h", remember=False)
    [group] = rep.data["needs_you"]["escalations"]
    assert group["escalations"][0]["report"].splitlines()[0] == (
        "(the gate-review report is not written yet; the control process writes it at its "
        "next tick)"
    )


def escalated_alpha(kb):
    """Note alpha escalated for prose/body-check after three rejections: the escalation's
    id and its gate-review file, relative to STATE."""
    from orchestrator.cycles.escalations import escalate

    kb.gate("prose/body-check", ["body"])
    note = kb.note("alpha", body="Alpha body.\n")
    with Store.open(kb.state) as store:
        esc = escalate(
            store, kb.state, kb.root, partition="fake", note_path=note,
            gate_id="prose/body-check", reason="3 consecutive rejections", reviewer="fake",
            fixer="fake", material=["high: the body is one line."], recommend="it stays thin",
        )  # fmt: skip
        (rel,) = store.conn.execute(
            "SELECT report_path FROM escalations WHERE id = ?", (esc,)
        ).fetchone()
    return esc, rel


def test_an_escalation_whose_report_was_deleted_says_how_to_write_it_again(kb, run_cli):
    """An open escalation's gate-review file deleted by hand (OPERATIONS §7 keeps them, but
    a cleanup of STATE takes them): the page said "cannot be read: [Errno 2] No such file
    or directory", `escalations` "(report missing: PATH)" then "report: PATH", neither
    what state.db still holds nor that `reviewq rewrite-files` writes it again."""
    from orchestrator.report import make_report

    _, rel = escalated_alpha(kb)
    (kb.state / rel).unlink()
    with Store.open(kb.state) as store:
        rep = make_report(store, kb.state, since="1h", remember=False)
    [group] = rep.data["needs_you"]["escalations"]
    assert group["escalations"][0]["report"].splitlines() == [
        "(the gate-review report's file is missing: reviewq rewrite-files writes it again "
        "from state.db)",
        "Recommend reject: it stays thin.",
        "Material:",
        "- high: the body is one line.",
    ]
    res = run_cli("escalations")
    assert res.exit_code == 0, res.stderr
    assert "      Recommend reject: it stays thin.\n" in res.stdout, res.stdout
    assert (
        f"      report: {kb.state / rel} (missing: reviewq rewrite-files writes it again from "
        "state.db)\n"
    ) in res.stdout, res.stdout


def test_an_escalations_folder_linked_to_a_disk_not_mounted_is_named_with_the_way_out(
    kb, run_cli, tmp_path
):
    """STATE/escalations a link to a folder on a disk that is not mounted: every open
    escalation's report failed as "[Errno 17] File exists: '.../escalations'", naming
    neither the link nor the mount (U9 of the jobs folder, for the reports)."""
    _, rel = escalated_alpha(kb)
    folder = kb.state / "escalations"
    shutil.rmtree(folder)
    folder.symlink_to(tmp_path / "unmounted" / "escalations")
    res = run_cli("rewrite-files")
    assert res.exit_code == 1, res.stdout
    assert (
        f"{folder}: not a folder (a link to {tmp_path / 'unmounted' / 'escalations'}, which "
        "is not there); reviewq keeps its escalation reports in it: mount or make what it "
        "links to, or move it aside"
    ) in res.stderr, res.stderr
    assert not (tmp_path / "unmounted").exists()


def test_an_escalation_whose_report_cannot_be_read_shows_what_state_db_holds(kb):
    """A FIFO left where an open escalation's gate-review file was (a person's `mkfifo`,
    a tool's pipe in STATE): `escalations` and `report` waited on it for good, for a
    writer that never came. Another file that cannot be read showed its error and no
    recommendation, though state.db holds it, as it does a deleted one's."""
    import os

    _, rel = escalated_alpha(kb)
    (kb.state / rel).unlink()
    os.mkfifo(kb.state / rel)
    res = reviewq_process("--root", str(kb.root), "escalations", timeout=30)
    assert res.returncode == 0, res.stderr
    assert "      Recommend reject: it stays thin.\n" in res.stdout, res.stdout
    assert (
        f"      report: {kb.state / rel} (cannot be read (not a regular file (a FIFO, socket "
        "or device)): reviewq rewrite-files writes it again from state.db)\n"
    ) in res.stdout, res.stdout
    res = reviewq_process("--root", str(kb.root), "report", "--since", "1h", "--json", timeout=30)
    assert res.returncode == 0, res.stderr
    [group] = json.loads(res.stdout)["needs_you"]["escalations"]
    assert group["escalations"][0]["report"].splitlines()[:2] == [
        "(the gate-review report cannot be read (not a regular file (a FIFO, socket or "
        "device)): reviewq rewrite-files writes it again from state.db)",
        "Recommend reject: it stays thin.",
    ]
    fixed = reviewq_process("--root", str(kb.root), "rewrite-files", timeout=30)
    assert fixed.returncode == 0, fixed.stderr
    assert "Recommend reject: it stays thin." in (kb.state / rel).read_text()


def test_the_page_shows_the_call_state_db_holds_while_a_report_waits_to_be_written(kb, run_cli):
    """A report due again over a file still there (an upgrade that changed an open
    escalation's call, as migration 15 did, with no control process running since): the
    page showed the old file, "Recommend reject", beside its own commands recommending
    redo, while `escalations` said redo, read from state.db."""
    from orchestrator.report import make_report
    from orchestrator.state.files import NOT_TRIED

    esc, rel = escalated_alpha(kb)
    assert "Recommend reject: it stays thin." in (kb.state / rel).read_text()
    with Store.open(kb.state) as store:
        with store.write():
            store.conn.execute("UPDATE escalations SET call = 'redo' WHERE id = ?", (esc,))
            store.conn.execute(
                "INSERT INTO escalation_reports_due VALUES (?, ?, ?)",
                (esc, "2026-11-26T00:00:00Z", NOT_TRIED),
            )
        rep = make_report(store, kb.state, since="1h", remember=False)
    [group] = rep.data["needs_you"]["escalations"]
    assert group["suggested"] == "redo"
    assert group["escalations"][0]["report"].splitlines()[:2] == [
        "(the gate-review report is not written yet; the control process writes it at its "
        "next tick)",
        "Recommend redo: it stays thin.",
    ]
    res = run_cli("escalations")
    assert res.exit_code == 0, res.stderr
    assert "      Recommend redo: it stays thin.\n" in res.stdout, res.stdout


def test_a_fix_given_up_after_a_report_said_it_waits_is_in_the_next_report(kb):
    """A fix the morning report listed as applied but not yet written (a read-only KB),
    then given up at a tick because a person edited the note meanwhile, was in no later
    report: its job had no time in the next window."""
    from orchestrator.cycles.fixes import write_due_fixes
    from orchestrator.kb.notes import sha256_text
    from orchestrator.report import make_report
    from orchestrator.state.store import utcnow
    from orchestrator.state.workspace import Workspace

    from .test_cycles_integration import queue_fix

    kb.gate("prose/body-check", ["body"])
    note = kb.note("alpha", body="Alpha body.\n")
    kb.accept("fake", [(note, "prose/body-check")], decision="FAIL")
    ws = Workspace.open(kb.root)
    store = ws.store
    old = kb.read(note)
    new = old + "A sentence the fixer added.\n"
    fix = queue_fix(ws.kb, store, ws.state_dir, note)
    with store.write():
        store.conn.execute(
            "UPDATE review_jobs SET status = 'completed', result = 'applied', created_at = ?1, "
            "updated_at = ?1, finished_at = ?1, fixed_snapshot_id = ?2 WHERE id = ?3",
            (_minutes_ago(60), store.snapshot(note, new, sha256_text(new)), fix),
        )
        store.conn.execute(
            "INSERT INTO fix_writes_due (job_id, path, old_sha256, new_sha256, since, error) "
            "VALUES (?, ?, ?, ?, ?, 'Read-only file system')",
            (fix, note, sha256_text(old), sha256_text(new), utcnow()),
        )
    # The morning's, half an hour ago: the fix waits to be written.
    first = make_report(store, ws.state_dir, now=_minutes_ago(30))
    assert first.data["kb_changes"]["fixes"][0]["unwritten"] == "Read-only file system"
    kb.write(note, old + "The person's own edit.\n")
    write_due_fixes(ws.kb, store)  # the next tick gives the fix up
    second = make_report(store, ws.state_dir, now=_minutes_ago(-1))  # a minute on
    ws.close()
    assert [h["id"] for h in second.data["kb_changes"]["human_edits"]] == [fix]


def test_a_cost_recorded_while_a_report_is_made_is_in_that_report_or_the_next(kb):
    """The control stamps an attempt's recorded_at inside its transaction and commits
    later: a report made between the two ended after the stamp but read before the
    commit, and the next one started where it ended, so the cost was in neither."""
    import threading

    from orchestrator.report import make_report
    from orchestrator.state.store import utcnow

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha")
    assert reviewq_process("--root", str(kb.root), "enqueue", "--all-gates").returncode == 0
    with Store.open(kb.state) as store:
        make_report(store, kb.state, now=_minutes_ago(1))  # the next starts where it ends
        control = sqlite3.connect(
            kb.state / "state.db", isolation_level=None, timeout=10, check_same_thread=False
        )
        control.execute("BEGIN IMMEDIATE")
        t = utcnow()
        control.execute(
            "INSERT INTO attempts (job_id, attempt, outcome, started_at) "
            "VALUES (1, 1, 'running', ?)",
            (t,),
        )
        control.execute(  # the trigger stamps recorded_at, before the commit
            "UPDATE attempts SET outcome = 'finalized', ended_at = ?, cost_usd = 1.5", (t,)
        )
        # ... a moment before the report is asked for, not in its very millisecond.
        control.execute("UPDATE attempts SET recorded_at = ?", (_minutes_ago(0.1),))
        commit = threading.Timer(0.5, lambda: control.execute("COMMIT"))
        commit.start()  # the control's transaction goes on for half a second
        try:
            reports = [make_report(store, kb.state), make_report(store, kb.state)]
        finally:
            commit.join()
            control.close()
    assert sum(r.data["reviewed"]["cost_usd"] or 0 for r in reports) == 1.5


def test_a_failed_or_finalized_job_is_stamped_inside_its_transaction(kb, run_cli, monkeypatch):
    """fail_job and finalize took their time before waiting for the write lock: a report
    that settled its end while they waited ended after their stamp and read before their
    commit, and the next report started after it, so the job was in neither."""
    from orchestrator.control import attempts
    from orchestrator.review import finalize

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha")
    kb.note("beta")
    assert run_cli("enqueue", "--all-gates", "--grouping", "note").exit_code == 0
    inside: list[bool] = []
    for module in (attempts, finalize):
        real = module.utcnow
        monkeypatch.setattr(
            module, "utcnow", lambda real=real: inside.append(store.conn.in_transaction) or real()
        )
    with Store.open(kb.state) as store:
        attempts.fail_job(store, kb.state, 1, ["could not open an attempt"])
        finalize.finalize(store, kb.state, 2, b"garbage", fail_on_invalid=True)
    assert inside and all(inside), inside


def test_a_report_whose_end_cannot_be_settled_says_so(kb, monkeypatch):
    """A write lock busy past the timeout was taken for a state.db this user may only
    read, and the report went on without settling its end."""
    from orchestrator.report import make_report
    from orchestrator.state import store as store_module

    Store.open(kb.state).close()
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_MS", 50)
    holder = sqlite3.connect(kb.state / "state.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with Store.open(kb.state) as store, pytest.raises(sqlite3.OperationalError, match="locked"):
            make_report(store, kb.state, remember=False)  # a report that writes nothing
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_damaged_state_db_is_said_so_and_doctor_names_it(kb):
    """A state.db with damaged pages: `jobs` and `report` said "internal error … please
    report it", `doctor` said "ok: state.db"; a table gone said "another process holds it
    … run the command again"."""
    kb.gate("prose/body-check", ["body"])
    for i in range(30):
        kb.note(f"n{i}", body="A body.\n" * 40)
    res = reviewq_process("--root", str(kb.root), "enqueue", "--reviewer", "offline", "--all-gates")
    assert res.returncode == 0, res.stderr
    path = kb.state / "state.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    data = bytearray(path.read_bytes())
    start = size * (len(data) // size // 2)
    data[start:] = bytes(len(data) - start)  # the second half of its pages
    path.write_bytes(bytes(data))
    for command in ("jobs", "report", "status", "doctor"):
        res = reviewq_process("--root", str(kb.root), command)
        assert res.returncode == 1
        said = [line for line in (res.stdout + res.stderr).splitlines() if "damaged (" in line]
        assert len(said) == 1, (command, res.stdout, res.stderr)
        assert "damaged (database disk image is malformed)" in said[0]
        assert said[0].endswith("(docs/OPERATIONS.md, section 7)"), said
        if command != "doctor":
            assert res.stderr.splitlines() == said, command  # one line, no traceback


def test_a_table_missing_from_state_db_is_called_damage_not_a_busy_database(kb):
    """ "no such table" said "another process holds it longer than the busy timeout …
    run the command again": the next run met the same error."""
    kb.gate("prose/body-check", ["body"])
    kb.note("alpha")
    res = reviewq_process("--root", str(kb.root), "enqueue", "--reviewer", "offline", "--all-gates")
    assert res.returncode == 0, res.stderr
    with contextlib.closing(sqlite3.connect(kb.state / "state.db")) as conn:
        conn.execute("DROP TABLE report_runs")
        conn.commit()
    res = reviewq_process("--root", str(kb.root), "report")
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        "error: state.db or a queue file is damaged (no such table: report_runs); nothing was "
        "changed. `reviewq doctor` says which; restore it from a backup, or recover what it "
        "holds with `sqlite3 FILE .recover` (docs/OPERATIONS.md, section 7)"
    ]
    res = reviewq_process("--root", str(kb.root), "doctor")
    assert res.returncode == 1
    assert (
        f"problem: state.db at {kb.state / 'state.db'} is damaged (missing table report_runs)"
        in res.stdout
    )


def test_a_constraint_or_query_error_is_a_defect_not_damage():
    """Every sqlite3.DatabaseError was called damage, and a constraint failure (a defect)
    sent the operator to replace a sound state.db with a backup."""
    from orchestrator.cli.common import refuse_domain_errors

    @refuse_domain_errors
    def defect() -> None:
        raise sqlite3.IntegrityError("UNIQUE constraint failed: review_jobs.id")

    with pytest.raises(sqlite3.IntegrityError):
        defect()


def test_the_reports_json_costs_and_agent_time_are_rounded(kb, run_cli):
    """A reviewer's cost and agent time were sums of floats, printed as they fell:
    "cost_usd": 0.30000000000000004 in report --json."""
    kb.gate("frontmatter/has-description", ["description"])
    kb.note("a")
    with Store.open(kb.state) as store, store.write():
        job = store.conn.execute(
            "INSERT INTO review_jobs (status, model_partition, grouping, reviewer, job_dir, "
            "created_at, updated_at) VALUES ('completed', 'p', 'note', 'fake', 'jobs/x', ?, ?) "
            "RETURNING id",
            (_minutes_ago(30), _minutes_ago(20)),
        ).fetchone()[0]
        for n, (cost, took) in enumerate([(0.1, 0.1), (0.2, 0.2)], 1):
            store.conn.execute(
                "INSERT INTO attempts (job_id, attempt, outcome, started_at, ended_at, cost_usd, "
                "duration_s) VALUES (?, ?, 'invalid-output', ?, ?, ?, ?)",
                (job, n, _minutes_ago(29), _minutes_ago(28), cost, took),
            )
    data = json.loads(run_cli("report", "--since", "1h", "--json").stdout)
    (r,) = data["reviewed"]["reviewers"]
    assert (r["cost_usd"], r["agent_s"]) == (0.3, 0.3)


def test_a_period_that_cost_nothing_says_so_instead_of_a_chart(kb, run_cli, browser, tmp_path):
    """Cost per night over 14 nights of $0 was a chart with nothing drawn against a
    "$1.0000" axis pygal made up: an empty chart says there was no cost."""
    _queued_for_fake(kb, "a")  # jobs, and not a cent spent
    page_path = tmp_path / "nothing.html"
    assert run_cli("report", "--html", str(page_path)).exit_code == 0
    page = browser.open(page_path.as_uri())
    figures = page.evaluate(
        """Object.fromEntries([...document.querySelectorAll('figure.chart')].map(f => [
        f.querySelector('figcaption').textContent, f.innerText]))"""
    )
    night = figures["Cost per night (USD)"]
    assert "No cost in the last 14 nights." in night and "$1" not in night, night


def test_a_night_with_nothing_to_chart_says_so_in_each_charts_place(kb, run_cli, browser, tmp_path):
    """On a first night (or an empty one) the charts of decisions, of the FAIL rates and
    of the attempts' failures were left out without a word: five of the six headings a
    reader looks for were gone, and the page read as broken."""
    Store.open(kb.state).close()  # a state folder where nothing has run yet
    page_path = tmp_path / "first-night.html"
    assert run_cli("report", "--html", str(page_path)).exit_code == 0
    page = browser.open(page_path.as_uri())
    figures = page.evaluate(
        """[...document.querySelectorAll('figure.chart')].map(f => [
        f.querySelector('figcaption').textContent, f.querySelector('p.empty')?.textContent])"""
    )
    assert figures == [
        ["Decisions per lens", "No pair was decided in this period."],
        ["Decisions per gate", "No pair was decided in this period."],
        ["Cost per reviewer (USD)", "No attempt cost anything in this period."],
        ["FAIL rate per gate, last 14 nights", "No gate decided a note in the last 14 nights."],
        ["Cost per night (USD)", "No cost in the last 14 nights."],
        [
            "Attempt failure rate per reviewer profile (agents that ran)",
            "No agent ran in the last 14 nights.",
        ],
    ], figures


def _since(value: str, now: str) -> str:
    from orchestrator.report.period import resolve

    return resolve(None, since=value, now=now).since  # type: ignore[arg-type]


def test_a_since_that_is_a_time_of_day_is_its_last_time_on_the_local_clock(new_york):
    """`--since 08:00` (the help's "date/time", the code's own example of a person's
    clock) was refused as "not a duration like '30m'"."""
    # 10:00 in New York: this morning's eight, and last night's half past eleven.
    assert _since("08:00", "2026-11-22T15:00:00.000Z") == "2026-11-22T13:00:00.000Z"
    assert _since("23:30", "2026-11-22T15:00:00.000Z") == "2026-11-22T04:30:00.000Z"
    # On the morning daylight time ended (1 November 2026): 00:30 was still EDT.
    assert _since("0:30", "2026-11-01T15:00:00.000Z") == "2026-11-01T04:30:00.000Z"


def test_a_since_time_of_day_across_a_change_of_daylight_time_is_the_clocks_last_reading(
    new_york,
):
    """A time of day in the hour repeated when daylight time ends was its first reading,
    an hour before the last; one in the hour skipped when it begins was an hour before
    the clock jumped past it; one with seconds was "not a duration like '30m'"."""
    # 1 November 2026, 02:00 EST: 01:30 was read at 05:30Z (EDT) and again at 06:30Z (EST).
    assert _since("01:30", "2026-11-01T07:00:00.000Z") == "2026-11-01T06:30:00.000Z"
    assert _since("01:30", "2026-11-01T06:00:00.000Z") == "2026-11-01T05:30:00.000Z"
    # 8 March 2026, 03:10 EDT: the clock jumped past 02:30 at 07:00Z (02:00 EST).
    assert _since("02:30", "2026-03-08T07:10:00.000Z") == "2026-03-08T07:00:00.000Z"
    assert _since("08:00:30", "2026-11-22T15:00:00.000Z") == "2026-11-22T13:00:30.000Z"
    # A time the clock reads at this very moment is yesterday's: today's window is empty.
    assert _since("10:00", "2026-11-22T15:00:00.000Z") == "2026-11-21T15:00:00.000Z"


def test_a_since_time_of_day_says_which_day_it_is(new_york):
    """`--since 08:00` at seven in the morning is yesterday's eight: the label said only
    "since 2026-11-21T13:00Z", leaving a person to work the day out from UTC."""
    from orchestrator.report.period import resolve

    at_seven = "2026-11-22T12:00:00.000Z"
    label = resolve(None, since="08:00", now=at_seven).label  # type: ignore[arg-type]
    assert label == "since 08:00 yesterday on this machine's clock (2026-11-21T13:00Z)"
    label = resolve(None, since="06:00", now=at_seven).label  # type: ignore[arg-type]
    assert label == "since 06:00 today on this machine's clock (2026-11-22T11:00Z)"


def test_a_since_date_on_the_local_clock_says_it_as_given(new_york):
    """`--since 2026-11-22` in New York was labelled "since 2026-11-22T05:00Z" (and in
    Kolkata "since 2026-11-21T18:30Z", the day before the one typed): M14 said a time of
    day in the person's words, a date or date-time only in UTC. One with an offset is
    already in the words typed."""
    from orchestrator.report.period import resolve

    now = "2026-11-23T12:00:00.000Z"
    label = resolve(None, since="2026-11-22", now=now).label  # type: ignore[arg-type]
    assert label == "since 2026-11-22 00:00 on this machine's clock (2026-11-22T05:00Z)"
    label = resolve(None, since="2026-11-22T08:00", now=now).label  # type: ignore[arg-type]
    assert label == "since 2026-11-22 08:00 on this machine's clock (2026-11-22T13:00Z)"
    label = resolve(None, since="2026-11-22T08:00Z", now=now).label  # type: ignore[arg-type]
    assert label == "since 2026-11-22T08:00Z"


def test_a_since_date_whose_midnight_the_clock_skips_starts_when_the_day_does(monkeypatch):
    """In Santiago daylight time begins at midnight (6 September 2026: 23:59:59 -04, then
    01:00 -03): `--since 2026-09-06` began at 23:00 on the 5th, an hour of the day before
    in the window, and `2026-09-06T00:30` at 23:30 on the 5th."""
    with local_clock(monkeypatch, "America/Santiago"):
        now = "2026-09-10T00:00:00.000Z"
        assert _since("2026-09-06", now) == "2026-09-06T04:00:00.000Z"
        assert _since("2026-09-06T00:30", now) == "2026-09-06T04:00:00.000Z"
        assert _since("2026-09-07", now) == "2026-09-07T03:00:00.000Z"


def _crashed_and_rejected(kb) -> tuple[str, str]:
    """Note crashed escalated on two gates by a reviewer that failed every attempt, then
    note rejected on one after three rejections: (crashed, rejected)."""
    from orchestrator.cycles.escalations import escalate

    kb.gate("prose/body-check", ["body"])
    kb.gate("prose/second", ["body"])
    crashed = kb.note("crashed", body="Crashed body.\n")
    rejected = kb.note("rejected", body="Rejected body.\n")
    raised = [
        (crashed, "prose/body-check", "redo"),
        (crashed, "prose/second", "redo"),
        (rejected, "prose/body-check", "reject"),
    ]
    with Store.open(kb.state) as store:
        for note, gate, call in raised:
            escalate(
                store, kb.state, kb.root, partition="fake", note_path=note, gate_id=gate,
                reason="the reviewer failed every attempt: exited 1: model returned garbage"
                if call == "redo" else "3 consecutive rejections", reviewer="fake",
                fixer="fake", material=["high: the body is one line."],
                recommend="see the cycles", call=call,
            )  # fmt: skip
    return crashed, rejected


def test_escalations_that_hold_a_verdict_come_before_those_an_agent_raised(kb, run_cli):
    """A reviewer that crashed on every job escalated every pair of 140 notes, five gates
    each; twelve notes were escalated after three rejections, one gate each. The notes
    with the most open came first: the twelve were past the report's 50 notes, on neither
    the page nor the terminal, under "556 escalation(s)", and last in `escalations`, while
    every note shown recommended repairing the reviewer."""
    crashed, rejected = _crashed_and_rejected(kb)
    listed = run_cli("escalations")
    headed = [line.split(":")[0] for line in listed.stdout.splitlines() if line.startswith("kb/")]
    as_json = [n["note_path"] for n in json.loads(run_cli("escalations", "--json").stdout)["notes"]]
    data = json.loads(run_cli("report", "--json", "--since", "1h").stdout)
    shown = [g["note_path"] for g in data["needs_you"]["escalations"]]
    assert headed == as_json == shown == [rejected, crashed], (headed, as_json, shown)
    text = run_cli("report", "--since", "1h").stdout
    assert text.index(rejected) < text.index(crashed), text


def test_the_escalations_an_agent_raised_are_counted_apart_with_the_agent(
    kb, run_cli, browser, tmp_path
):
    """The morning after a reviewer crashed on every job: "needs you: 556 escalation(s) on
    152 note(s)", on the terminal and the page, as if 556 pairs had been judged; that 544
    came from two broken reviewers, and that repairing them came first, was said only in
    each escalation's own report."""
    crashed, _ = _crashed_and_rejected(kb)
    says = (
        "reviewer fake failed every attempt on 2 pair(s) of 1 note(s), which is no verdict "
        "on them; the last: exited 1: model returned garbage: repair it first"
        f"{RESTART_AFTER_AN_EDIT}, then reviewq decide 1 2 redo"
    )
    page_path = tmp_path / "report.html"
    text = run_cli("report", "--since", "1h", "--html", str(page_path)).stdout
    needs = "needs you: 3 escalation(s) on 2 note(s) (2 of them raised by an agent that failed)"
    assert needs in text.splitlines(), text
    assert f"  {says}" in text.splitlines(), text
    [agent] = json.loads(run_cli("report", "--json", "--since", "1h").stdout)["needs_you"][
        "agents_failed"
    ]
    assert (agent["agent"], agent["escalations"], agent["notes"]) == (
        "reviewer fake failed every attempt",
        2,
        1,
    )
    page = browser.open(page_path.as_uri())
    shown = page.evaluate(
        """[...document.querySelectorAll('ul.needs > li')].map(li => li.innerText)"""
    )
    assert shown[0].startswith(
        "3 escalation(s) on 2 note(s) (2 of them raised by an agent that failed)"
    ), shown
    assert says in shown[0], shown


def test_status_counts_apart_the_escalations_an_agent_raised(kb, run_cli):
    """`status` read "escalations open: 556" the morning after a reviewer crashed on every
    job, as if each were a verdict waiting for a person; the report (P21) said that 544
    came from a broken reviewer, `status` did not."""
    _crashed_and_rejected(kb)
    lines = run_cli("status").stdout.splitlines()
    at = lines.index("escalations open: 3 (2 of them raised by an agent that failed)")
    assert lines[at + 1] == (
        "  reviewer fake failed every attempt on 2 pair(s) of 1 note(s), which is no verdict "
        "on them; the last: exited 1: model returned garbage: repair it first"
        f"{RESTART_AFTER_AN_EDIT}, then reviewq decide 1 2 redo"
    ), lines
    [agent] = run_cli("status", "--json").json()["agents_failed"]
    assert (agent["escalations"], agent["notes"]) == (2, 1), agent


def test_a_fix_made_of_invisible_characters_shows_on_the_page(kb, run_cli, browser, tmp_path):
    """Trojan Source in a fix: the page's diff wrote the fixer's line as it was, so a line
    that differed only by a zero-width space read as unchanged, and a right-to-left
    override showed its words in another order than the note holds them. The page shows
    every invisible or control character by its escape, the text a person approves."""
    kb.gate("prose/has-body", ["body"])
    kb.note("a", body="Body of a.\n")
    added = "FIXED: zero\u200bwidth, \u202eevitan\u202c, mark\ufeff."
    kb.write(
        "reviewq.toml",
        profile("fixer", FAKE_PASS_IF_CONTAINS="FIXED", FAKE_FIX_APPEND=added) + QUEUE,
    )
    res = reviewq_process("--root", str(kb.root), "sweep", "--reviewer", "fixer", "--fix")
    assert res.returncode == 0, res.stderr
    assert added in kb.read("kb/notes/a.md")  # the note holds what the fixer wrote
    page_path = tmp_path / "invisible.html"
    res = run_cli("report", "--since", "1h", "--html", str(page_path))
    assert res.exit_code == 0, res.stderr
    page = browser.open(page_path.as_uri())
    shown = page.evaluate(
        "[...document.querySelectorAll('article.fix .diff .add')].map(s => s.innerText)"
    )
    assert "+FIXED: zero\\u200bwidth, \\u202eevitan\\u202c, mark\\ufeff." in shown, shown
    # The data keeps the note's text as it is: only the page marks it.
    fixes = json.loads(run_cli("report", "--since", "1h", "--json").stdout)["kb_changes"]["fixes"]
    assert f"+{added}" in [ln["text"] for ln in fixes[0]["diff"]["lines"]]


def test_the_invisible_characters_a_script_writes_with_show_as_written(
    kb, run_cli, browser, tmp_path
):
    """Persian writes its half-space with a zero-width non-joiner, an emoji's family or
    profession is a zero-width-joiner sequence, Devanagari's conjuncts take a joiner, and
    Hebrew puts a right-to-left mark after a word before its punctuation: the page showed
    each as a code (`کتاب\\u200cها`, `👩\\u200d💻`), so a note in any of these scripts
    read as escapes. Kept where they join or mark the script around them; the same
    joiner between Latin letters still shows, as it hides a change there. An emoji newer
    than this Python's Unicode tables (a pink heart, 15.0) showed as `\\U0001fa77`."""
    kb.gate("prose/has-body", ["body"])
    kb.note("a", body="Body of a.\n")
    written = "FIXED: کتاب‌ها می‌خواهم, 👩‍💻 👨‍👩‍👧 🏳️‍🌈 🩷, क्‍ष, שלום‏!"
    appended = written + " ab\u200ccd"
    toml = profile("fixer", FAKE_PASS_IF_CONTAINS="FIXED", FAKE_FIX_APPEND=appended) + QUEUE
    # TOML has no surrogate pairs for json's \ud83d\udc69: the emoji as they are.
    kb.write(
        "reviewq.toml", toml.replace(json.dumps(appended), json.dumps(appended, ensure_ascii=False))
    )
    res = reviewq_process("--root", str(kb.root), "sweep", "--reviewer", "fixer", "--fix")
    assert res.returncode == 0, res.stderr
    assert appended in kb.read("kb/notes/a.md")
    page_path = tmp_path / "scripts.html"
    res = run_cli("report", "--since", "1h", "--html", str(page_path))
    assert res.exit_code == 0, res.stderr
    page = browser.open(page_path.as_uri())
    shown = page.evaluate(
        "[...document.querySelectorAll('article.fix .diff .add')].map(s => s.innerText)"
    )
    assert f"+{written} ab\\u200ccd" in shown, shown


LONG_GATE = "prose/" + "substantive-body-that-has-a-very-long-gate-identifier-" * 2 + "end"


def _long_names_page(night, tmp_path) -> Path:
    """The night's page with a gate id of 117 characters beside the kb's own."""
    from orchestrator.report import render

    data = night.report()
    data["reviewed"]["by_gate"][LONG_GATE] = {"PASS": 1, "FAIL": 2}
    page_path = tmp_path / "long-names.html"
    page_path.write_text(render.html(data), encoding="utf-8")
    return page_path


def test_a_long_gate_id_leaves_its_chart_room_for_the_bars(night, browser, tmp_path):
    """pygal cuts no label of a horizontal chart (its truncate_label is for the x axis):
    a gate id of 117 characters took the whole width of "Decisions per gate", its plot
    pushed out of the picture (a width of -147 of 800) and every bar gone. The table under
    the chart names each gate in full."""
    page = browser.open(_long_names_page(night, tmp_path).as_uri(), width=1280, height=900)
    plots = page.evaluate(
        """[...document.querySelectorAll('figure.chart svg')].map(s => [
            s.closest('figure').querySelector('figcaption').textContent,
            Number(s.querySelector('g.plot > rect.background').getAttribute('width')),
            s.viewBox.baseVal.width])"""
    )
    assert len(plots) >= 5
    assert [p for p in plots if p[1] < 0.4 * p[2]] == [], plots
    names = page.evaluate(
        """[...document.querySelectorAll('figure.chart details th[scope=row]')]
        .map(th => th.textContent)"""
    )
    assert LONG_GATE in names  # in full where it is read


def test_the_charts_words_can_be_read_on_a_phone(night, browser, tmp_path):
    """A chart drawn 800 units wide was shrunk to a phone's 356 pixels, its words with it:
    the gates' names, the legend and the axes' figures were 6 pixels high. A chart keeps
    its words at 12 pixels or more and scrolls sideways in its own box; the page does not."""
    url = _long_names_page(night, tmp_path).as_uri()
    for width, mobile in ((375, True), (1280, False)):
        page = browser.open(url, width=width, height=812, mobile=mobile)
        sizes = page.evaluate(
            """[...document.querySelectorAll('figure.chart svg')].map(s => {
            // the scale the text is drawn at, whatever box or limit decided it
            const px = [...s.querySelectorAll('text')].filter(t => t.textContent.trim())
                .map(t => { const m = t.getScreenCTM();  // rotated or not
                    return parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b); });
            return [s.closest('figure').querySelector('figcaption').textContent,
                    Math.round(Math.min(...px) * 10) / 10];
        })"""
        )
        assert len(sizes) >= 5
        assert [s for s in sizes if s[1] < 12] == [], (width, sizes)
        assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.screenshot(tmp_path / "charts-phone.png")


def _split_words(page, cells: str) -> list[str]:
    """The words of the ``cells`` (a CSS selector) the page shows split across lines; a
    line may end after a hyphen or a slash, as it does in any text, and a `.run` (a long
    path or URL quoted) anywhere."""
    return page.evaluate(
        """(cells => {
        for (const d of document.querySelectorAll('details')) d.open = true;
        const out = [];
        for (const cell of document.querySelectorAll(cells)) {
            const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
            for (let t = walk.nextNode(); t; t = walk.nextNode()) {
                if (t.parentElement.closest('.run')) continue;
                for (const m of t.data.matchAll(/[^\\s\\/-]+/g)) {
                    const r = document.createRange();
                    r.setStart(t, m.index);
                    r.setEnd(t, m.index + m[0].length);
                    const tops = new Set([...r.getClientRects()].map(c => Math.round(c.top)));
                    if (tops.size > 1) out.push(m[0]);
                }
            }
        }
        return out;
    })"""
        + f"({json.dumps(cells)})"
    )


def test_a_tables_headers_and_figures_keep_their_words_whole_on_a_phone(night, browser, tmp_path):
    """On a phone the tables squeezed into the screen by breaking anywhere: "Reviewer"
    read "Re / vie / wer", a cost "$0. / 01 / 00", "Tokens in" "Tok / en / s / in". A
    column header's or a figure's words stay whole (a path still breaks at its hyphens);
    a table wider than the screen scrolls in its own box."""
    page = browser.open(
        _long_names_page(night, tmp_path).as_uri(), width=375, height=812, mobile=True
    )
    broken = _split_words(page, "th[scope=col], td.n")
    assert broken == [], broken
    assert page.evaluate("document.documentElement.scrollWidth") <= 375


def test_a_screen_reader_hears_each_tables_name_and_the_notes_under_their_heading(
    night, browser, tmp_path
):
    """Read through Chromium's accessibility tree, as a screen reader gets it: the
    "Reviewers" and "FAIL findings" tables had no name (their heading stood above them,
    tied to nothing), and each escalated note's heading was an h3 like "Escalations: …"
    itself, so a list of headings read the notes as siblings of the escalations, not
    under them."""
    page_path = tmp_path / "ax.html"
    res = night.rq("report", "--since", "24h", "--html", str(page_path))
    assert res.returncode == 0, res.stderr
    page = browser.open(page_path.as_uri(), width=375, height=812, mobile=True)
    page.evaluate("for (const d of document.querySelectorAll('details')) d.open = true")
    browser.call("Accessibility.enable", session=page.session)
    nodes = browser.call("Accessibility.getFullAXTree", {}, page.session)["nodes"]

    def said(role):
        for n in nodes:
            if n.get("role", {}).get("value") == role and not n.get("ignored"):
                props = {p["name"]: p["value"].get("value") for p in n.get("properties", [])}
                yield n.get("name", {}).get("value", ""), props.get("level")

    tables = [name for name, _ in said("table")]
    assert len(tables) >= 7 and "" not in tables, tables  # five charts' numbers, two more
    assert {"Reviewers", "FAIL findings: 11"} <= set(tables), tables
    headings = list(said("heading"))
    notes = {g["note_path"] for g in night.report()["needs_you"]["escalations"]}
    (esc_level,) = [lv for name, lv in headings if name.startswith("Escalations: ")]
    assert [lv for name, lv in headings if name in notes] == [esc_level + 1] * len(notes)
    # In the page's order (the tree's list is not): no level skipped.
    levels = page.evaluate(
        "[...document.querySelectorAll('h1, h2, h3, h4, h5, h6')].map(h => +h.tagName[1])"
    )
    assert all(b <= a + 1 for a, b in zip(levels, levels[1:], strict=False)), levels


def test_every_place_the_keyboard_stops_is_named_and_shows_its_focus(night, browser, tmp_path):
    """At 200 % zoom on a 1,000-px window (500 CSS px), Chromium's Tab stops at each box
    that scrolls sideways and holds nothing focusable: each chart's (its SVG hidden from a
    screen reader, the table under it being its words) and a wide table's. Six of those
    stops had no name and no role: a screen reader said nothing there, or "blank"."""
    page_path = tmp_path / "night.html"
    assert night.rq("report", "--since", "24h", "--html", str(page_path)).returncode == 0
    page = browser.open(page_path.as_uri(), width=500, height=900)
    stops = page.evaluate(
        "document.querySelectorAll('a[href], summary, .plot, .table, pre').length"
    )
    unnamed, unseen, plots = [], [], 0
    for _ in range(stops + 1):  # at most every stop once, and back to the page
        page.press("Tab", 9)
        what = page.evaluate(
            "(e => e === document.body ? null : [e.tagName + '.' + e.className, "
            "e.matches(':focus-visible') && getComputedStyle(e).outlineStyle !== 'none'])"
            "(document.activeElement)"
        )
        if what is None:
            break
        plots += what[0] == "DIV.plot"
        node = page.ax_node("document.activeElement")
        if not (node.get("name") or {}).get("value", "").strip():
            unnamed.append((what[0], node["role"]["value"]))
        if not what[1]:
            unseen.append(what[0])
    assert plots >= 5  # the charts' boxes scroll here, each a stop
    assert unnamed == [] and unseen == [], (unnamed, unseen)


def test_what_a_column_counts_is_said_where_no_mouse_rests(night, browser, tmp_path):
    """The Reviewers table's "Not run" and the Machines table's "Run" and "Lost" said what
    they count in a `title` alone: shown to a mouse resting on the header, never on a
    phone or to the keyboard. Said under each table, and each table described by it."""
    page_path = tmp_path / "night.html"
    assert night.rq("report", "--since", "24h", "--html", str(page_path)).returncode == 0
    page = browser.open(page_path.as_uri(), width=375, height=812, mobile=True)
    shown = page.evaluate("document.body.innerText")
    for said in (
        "Not run: no worker, program or model answered",
        "Run: the attempts whose agent started there",
        "Lost: their worker died or went silent",
    ):
        assert said in shown, said
    assert page.evaluate("document.querySelectorAll('main [title]:not(svg *)').length") == 0
    for table in ("reviewers", "machines"):
        node = page.ax_node(f"document.querySelector('table[aria-labelledby={table}]')")
        assert node["description"]["value"].startswith(("Not run: ", "Run: ")), node


def test_a_screen_reader_hears_each_charts_name(night, browser, tmp_path):
    """A chart's picture is hidden from a screen reader (its numbers are the table under
    it), but the figure around it had no name in Chromium's accessibility tree: six times
    "figure" and nothing to say which, its <figcaption> tied to nothing."""
    page_path = tmp_path / "ax-charts.html"
    res = night.rq("report", "--since", "24h", "--html", str(page_path))
    assert res.returncode == 0, res.stderr
    page = browser.open(page_path.as_uri(), width=375, height=812, mobile=True)
    captions = page.evaluate(
        "[...document.querySelectorAll('figure.chart figcaption')].map(c => c.textContent)"
    )
    named = [name for name in _heard(page, "figure") if not name.startswith("Diff: ")]
    assert len(captions) >= 5 and sorted(named) == sorted(captions), (named, captions)


def _heard(page, role: str) -> list[str]:
    """The names of the page's elements of ``role`` a screen reader is given, in
    Chromium's accessibility tree (those it ignores left out)."""
    page.browser.call("Accessibility.enable", session=page.session)
    nodes = page.browser.call("Accessibility.getFullAXTree", {}, page.session)["nodes"]
    return [
        n.get("name", {}).get("value", "")
        for n in nodes
        if n.get("role", {}).get("value") == role and not n.get("ignored")
    ]


def test_a_screen_reader_hears_which_note_each_list_of_calls_settles(night, browser, tmp_path):
    """Every escalated note's list of calls was named "The calls that settle this note":
    fifty notes on a big night, fifty lists of one name in a screen reader's list of
    lists, each to be entered to learn which note it was for."""
    page_path = tmp_path / "ax-calls.html"
    assert night.rq("report", "--since", "24h", "--html", str(page_path)).returncode == 0
    page = browser.open(page_path.as_uri(), width=375, height=812, mobile=True)
    calls = [name for name in _heard(page, "list") if name.startswith("The calls that settle")]
    notes = [g["note_path"] for g in night.report()["needs_you"]["escalations"]]
    assert len(notes) >= 2 and calls == [f"The calls that settle {n}" for n in notes], calls


def test_a_screen_reader_is_given_each_diffs_name(night, browser, tmp_path):
    """A diff's "Diff: 1 line(s) added, 0 removed" was the `aria-label` of a `<pre>`, a
    generic element, whose name ARIA forbids and screen readers leave unsaid (Chromium's
    tree gave it, as role `generic`)."""
    page_path = tmp_path / "ax-diff.html"
    assert night.rq("report", "--since", "24h", "--html", str(page_path)).returncode == 0
    page = browser.open(page_path.as_uri(), width=375, height=812, mobile=True)
    node = page.ax_node("document.querySelector('article.fix pre.diff')")
    assert (node["role"]["value"], node["name"]["value"]) == (
        "figure",
        "Diff: 1 line(s) added, 0 removed",
    ), node


# A note path of 165 characters with no hyphen to break at (a KB's names need none).
UNBROKEN_NOTE = "kb/notes/" + "Honeybeeforagingrangesacrossurbanandruralapiaries" * 3 + "Final.md"


def _unbroken_path_page(night, tmp_path) -> Path:
    """The night's page with an escalated note and a FAIL on that path."""
    from orchestrator.report import render

    data = night.report()
    data["needs_you"]["escalations"][0]["note_path"] = UNBROKEN_NOTE
    data["reviewed"]["fails"][0]["note_path"] = UNBROKEN_NOTE
    page_path = tmp_path / "unbroken-path.html"
    page_path.write_text(render.html(data), encoding="utf-8")
    return page_path


def test_an_escalated_notes_path_without_a_hyphen_keeps_the_page_in_the_screen(
    night, browser, tmp_path
):
    """Its heading, once an h3 (which breaks anywhere), became an h4 under "Escalations"
    and broke only at hyphens: a path with none widened the whole page, every section
    scrolling sideways, to some 1,550 px on a phone and 1,800 on a laptop."""
    url = _unbroken_path_page(night, tmp_path).as_uri()
    for width, mobile in ((375, True), (1280, False)):
        page = browser.open(url, width=width, height=812, mobile=mobile)
        heads = page.evaluate(
            "[...document.querySelectorAll('article.escalated-note h4')].map(h => h.textContent)"
        )
        assert UNBROKEN_NOTE in heads
        assert page.evaluate("document.documentElement.scrollWidth") <= width


def _table_widths(page) -> dict[str, int]:
    """Each table's width, by the heading or caption that names it, its details open."""
    return page.evaluate(
        """(() => {
        for (const d of document.querySelectorAll('details')) d.open = true;
        return Object.fromEntries([...document.querySelectorAll('div.table > table')].map(t => [
            t.getAttribute('aria-labelledby') || t.caption.textContent, t.offsetWidth]));
    })()"""
    )


def test_a_path_without_a_hyphen_does_not_widen_its_table_on_a_phone(night, browser, tmp_path):
    """A cell breaks a word only where it would overflow (P32), which gives a path with no
    hyphen no break in the column's least width: a FAIL on such a path made "FAIL
    findings" some 1,800 px wide on a 375 px phone. Paths and gate ids break anywhere;
    the table is as wide as it is without that path."""
    plain = tmp_path / "plain.html"
    res = night.rq("report", "--since", "24h", "--html", str(plain))
    assert res.returncode == 0, res.stderr
    widths = {}
    for name, url in (
        ("plain", plain.as_uri()),
        ("unbroken", _unbroken_path_page(night, tmp_path).as_uri()),
    ):
        page = browser.open(url, width=375, height=812, mobile=True)
        widths[name] = _table_widths(page)
    assert UNBROKEN_NOTE in page.evaluate(
        "[...document.querySelectorAll('tr.fail td:first-child')].map(td => td.textContent)"
    )
    assert widths["unbroken"] == widths["plain"], widths


def test_a_fail_findings_note_and_gate_read_in_whole_parts_on_a_phone(night, browser, tmp_path):
    """The morning walkthrough (stop 44): on a 375-px phone "FAIL findings" squeezed its
    note and gate columns to some 50 px, every path broken inside its words, five letters
    a line ("kb/not / es/ext / ract- / only- / cappe / d- / honey. / md", "acces / sibilit /
    y/am / biguo / us-"): P41's break-anywhere gave those cells no least width at all. A
    path breaks at its slashes and hyphens; the table scrolls in its box when it must."""
    page_path = tmp_path / "phone-fails.html"
    assert night.rq("report", "--since", "24h", "--html", str(page_path)).returncode == 0
    page = browser.open(page_path.as_uri(), width=375, height=812, mobile=True)
    assert page.evaluate("document.querySelectorAll('tr.fail td.path').length") >= 2
    assert _split_words(page, "tr.fail td.path, tr.warn td.path") == []
    assert page.evaluate("document.documentElement.scrollWidth") <= 375


UNBROKEN_URL = "https://example.org/" + "honeybeeforagingrangesacrossurbanandruralapiaries" * 3


def test_a_cell_quoting_a_path_or_url_does_not_widen_its_table_on_a_phone(night, browser, tmp_path):
    """P41 let only the note and gate cells break anywhere. A failed job's "What" (its
    notes) and "Why" (reasons quoting paths), and a finding quoting a URL, still gave their
    column such a name's whole length as least width: "Failed jobs" 2,877 px wide on a
    375-px phone, "FAIL findings" 1,592. They break anywhere too, and the words around
    them stay whole."""
    from orchestrator.report import render

    job = {"id": 7, "kind": "review", "reviewer": "offline", "runner": None, "lens": None}
    job |= {"finished_at": None, "pairs": 1}
    pages = {}
    for name, note, url in (
        ("plain", "kb/notes/a.md", "https://example.org/a"),
        ("unbroken", UNBROKEN_NOTE, UNBROKEN_URL),
    ):
        data = night.report()
        why = f"no-output: the agent wrote no review of {note} in its attempt folder"
        failed = {**job, "note_path": note, "notes": [note], "reasons": [why]}
        data["needs_you"]["failed_jobs"], data["needs_you"]["failed_total"] = [failed], 1
        data["reviewed"]["fails"][0]["finding"] = f"The range cited at {url} is not the source."
        pages[name] = tmp_path / f"quoted-{name}.html"
        pages[name].write_text(render.html(data), encoding="utf-8")
    widths = {}
    for name, path in pages.items():
        page = browser.open(path.as_uri(), width=375, height=812, mobile=True)
        widths[name] = {k: v for k, v in _table_widths(page).items() if k.startswith("fail")}
        assert _split_words(page, "tr.fail td:not(.path), tr.failed-job td") == [], name
    assert UNBROKEN_URL in page.evaluate(
        "[...document.querySelectorAll('tr.fail td')].map(td => td.textContent).join()"
    )
    assert set(widths["plain"]) == {"failed-jobs", "fail-findings"}
    assert all(widths["unbroken"][t] <= widths["plain"][t] for t in widths["plain"]), widths


# A4 less Chromium's default margins (0.4 in each side), in CSS pixels.
A4_INCHES, A4_PRINTED_PX = (8.27, 11.69), round((8.27 - 0.8) * 96)


def _pdf_fill_colours(pdf: bytes) -> set[bytes]:
    """Every "r g b rg" fill colour the PDF's content streams set (Skia deflates them)."""
    import re
    import zlib

    found = set()
    for m in re.finditer(rb"stream\r?\n(.*?)endstream", pdf, re.S):
        with contextlib.suppress(zlib.error):
            found |= set(re.findall(rb"([\d.]+ [\d.]+ [\d.]+) rg", zlib.decompress(m.group(1))))
    return found


def test_the_page_printed_in_dark_mode_shows_everything_in_ink(night, browser, tmp_path):
    """Printed on A4 from a screen in dark mode, the page kept the dark page's #e6e6e6
    text, on paper a print dialog leaves white (backgrounds off); every closed <details>
    (the escalations' reports but the first, the fixes' diffs, the charts' numbers)
    printed as its summary alone, and once shown kept its closed marker (▶) above what
    it now showed; a diff's long line and a wide table were cut at the page's edge,
    their scrolling box printed as it stood."""
    import base64

    page = browser.open(
        _unbroken_path_page(night, tmp_path).as_uri(),
        width=A4_PRINTED_PX,
        height=1100,
        color_scheme="dark",
    )
    dark = [{"name": "prefers-color-scheme", "value": "dark"}]
    browser.call("Emulation.setEmulatedMedia", {"media": "print", "features": dark}, page.session)
    seen = page.evaluate(
        """(() => {
        const hidden = [...document.querySelectorAll('details')].filter(d =>
            [...d.children].some(c => c.tagName !== 'SUMMARY' && !c.checkVisibility()))
            .map(d => d.querySelector('summary').textContent.slice(0, 40));
        const cut = [...document.querySelectorAll('.table, pre, .plot, .diff')]
            .filter(b => b.scrollWidth > b.clientWidth + 1)
            .map(b => [b.className, b.clientWidth, b.scrollWidth]);
        const inks = new Set();
        for (const el of document.querySelectorAll('main *'))
            if ([...el.childNodes].some(n => n.nodeType === Node.TEXT_NODE && n.textContent.trim()))
                inks.add(getComputedStyle(el).color);
        const wide = document.documentElement.scrollWidth > innerWidth;
        const marked = [...document.querySelectorAll('summary')].filter(s =>
            getComputedStyle(s).display === 'list-item'
            && getComputedStyle(s).listStyleType !== 'none').length;
        return {hidden, cut, wide, marked, inks: [...inks]};
    })()"""
    )
    white = "rgb(255, 255, 255)"
    faint = [c for c in seen.pop("inks") if _contrast(c, white) < 4.5]
    want = {"hidden": [], "cut": [], "wide": False, "marked": 0}
    assert (seen, faint) == (want, []), (seen, faint)
    # The real print, as its dialog makes it by default: A4, no background graphics.
    w, h = A4_INCHES
    pdf = base64.b64decode(
        browser.call("Page.printToPDF", {"paperWidth": w, "paperHeight": h}, page.session)["data"]
    )
    assert pdf.startswith(b"%PDF-")
    fills = _pdf_fill_colours(pdf)
    assert b"0 0 0" in fills and b".902 .902 .902" not in fills, fills  # the dark page's --fg


def test_the_browsers_own_parts_follow_the_pages_dark_mode(night, browser, tmp_path):
    """The page never said it has a dark mode (`color-scheme`): Chromium drew its own
    parts, a chart's or a table's scrollbar, from its light scheme
    on the dark page. Its system colour Canvas, which those parts are drawn on, says
    which scheme it uses inside the boxes that scroll."""
    page_path = tmp_path / "scheme.html"
    res = night.rq("report", "--since", "24h", "--html", str(page_path))
    assert res.returncode == 0, res.stderr
    canvas = {}
    for scheme in ("light", "dark"):
        page = browser.open(
            page_path.as_uri(), width=375, height=812, mobile=True, color_scheme=scheme
        )
        canvas[scheme] = page.evaluate(
            """[...document.querySelectorAll('.table, figure .plot')].map(box => {
                const probe = box.appendChild(document.createElement('div'));
                probe.style.background = 'Canvas';
                return getComputedStyle(probe).backgroundColor;
            })"""
        )
        assert canvas[scheme], scheme
    assert {c for c in canvas["light"]} == {"rgb(255, 255, 255)"}, canvas
    assert max(_luminance(c) for c in canvas["dark"]) < 0.05, canvas


def test_a_charts_tooltips_name_the_bar_and_its_figure(night, browser, tmp_path):
    """Each chart's SVG kept pygal's <title>Pygal</title>, the tooltip of the whole chart
    to a resting mouse, and a <title> per guide line holding the axis label's position
    ("0.1666666667" beside "prose"); its bars, whose tooltips pygal's script drew, had
    none once the script was taken out. A bar's tooltip names it in full and its figure
    as the table under the chart gives it, a cost in dollars."""
    page = browser.open(_long_names_page(night, tmp_path).as_uri(), width=1280, height=900)
    tips = page.evaluate(
        """[...document.querySelectorAll('figure.chart svg')].map(s => ({
            chart: s.closest('figure').querySelector('figcaption').textContent,
            stray: [...s.querySelectorAll('title, desc')]
                .filter(t => !t.parentElement.matches('g.bar > rect, g.bar'))
                .map(t => t.textContent),
            bars: s.querySelectorAll('g.bar').length,
            said: [...s.querySelectorAll('g.bar > title')].map(t => t.textContent),
        }))"""
    )
    assert len(tips) >= 5
    for chart in tips:
        assert chart["stray"] == [] and len(chart["said"]) == chart["bars"] > 0, chart
    by_gate = next(c["said"] for c in tips if c["chart"] == "Decisions per gate")
    assert f"{LONG_GATE}: FAIL 2" in by_gate, by_gate
    rates = next(c["said"] for c in tips if c["chart"].startswith("FAIL rate per gate"))
    assert all(t.endswith("%") for t in rates), rates
    # A cost is in dollars wherever it is given, as on the rest of the page ("0.01" was
    # a bare number under "Cost per reviewer").
    for chart in ("Cost per reviewer (USD)", "Cost per night (USD)"):
        said = next(c["said"] for c in tips if c["chart"] == chart)
        assert all(": $" in t for t in said), said
        cells = page.evaluate(
            f"""[...document.querySelectorAll('figure.chart')]
            .filter(f => f.querySelector('figcaption').textContent === {json.dumps(chart)})
            .flatMap(f => [...f.querySelectorAll('tbody td:last-child')].map(td => td.textContent))"""
        )
        assert cells and all(c.startswith("$") for c in cells), (chart, cells)


def test_a_chart_of_two_hundred_gates_does_not_fill_the_page(night, browser, tmp_path):
    """With 200 gates, "Decisions per gate" was some 9,300 px tall on a laptop (and the
    FAIL rates as tall again): a person scrolled past it to reach anything under it. A
    chart shows the 25 gates of most FAIL (or of highest rate) and says so; its table
    keeps all 200."""
    from orchestrator.report import render

    data = night.report()
    gates = [f"lens{i % 7}/gate-{i:03d}" for i in range(200)]
    data["reviewed"]["by_gate"] = {
        g: {"PASS": 10, "FAIL": int(i % 13 == 5)} for i, g in enumerate(gates)
    }
    data["reviewed"]["by_gate"]["lens3/gate-199"] = {"PASS": 1, "FAIL": 9}
    data["trends"]["fail_rate_by_gate"] = [
        {"gate_id": g, "fail": i % 40, "decided": 40, "rate": (i % 40) / 40, "suspect": False}
        for i, g in enumerate(gates)
    ]
    page_path = tmp_path / "many-gates.html"
    page_path.write_text(render.html(data), encoding="utf-8")
    page = browser.open(page_path.as_uri(), width=1280, height=900)
    charts = page.evaluate(
        """Object.fromEntries([...document.querySelectorAll('figure.chart')].map(f => [
            f.querySelector('figcaption').textContent, {
            height: f.querySelector('svg')?.getBoundingClientRect().height,
            more: f.querySelector('p.more')?.textContent,
            bars: [...f.querySelectorAll('g.bar > title')].map(t => t.textContent),
            rows: f.querySelectorAll('tbody tr').length}]))"""
    )
    by_gate, rates = charts["Decisions per gate"], charts["FAIL rate per gate, last 14 nights"]
    for chart in (by_gate, rates):
        assert chart["height"] < 1500 and chart["rows"] == 200, chart
        assert "25 of 200" in chart["more"], chart
    assert "lens3/gate-199: FAIL 9" in by_gate["bars"]
    assert len({t.split(":")[0] for t in by_gate["bars"]}) == 25
    # The highest rates: the five gates each of 39, 38, 37, 36 and 35 fails in 40.
    assert {t.split(": ")[0] for t in rates["bars"]} == {
        g for i, g in enumerate(gates) if i % 40 >= 35
    }, rates["bars"]


def test_a_cut_gate_name_keeps_each_letter_whole(browser):
    """A bar's name was cut by code point: an "é" written as e and a combining accent
    lost its accent (or the accent stood alone after the "…"), a family emoji (three
    people joined by zero-width joiners) showed as one of them, a flag as half of it,
    a Hangul syllable written as jamo as its first consonant.
    Chromium's own grapheme segmenter says where a letter may end."""
    from orchestrator.report.charts import LABEL_MOST, _label

    names = [
        "prose/" + "e\u0301" * 40,  # é as e and a combining acute
        "prose/" + "\U0001f468\u200d\U0001f469\u200d\U0001f467" * 10,  # family: man, woman, girl
        "prose/" + "\U0001f44d\U0001f3fd" * 20,  # thumbs up, a skin tone
        "prose/a" + "\U0001f1eb\U0001f1f7" * 20,  # French flags, each two regional indicators
        "prose/" + "\u0915\u094d\u0937" * 15 + "ab",  # Devanagari with virama
        "prose/" + "\u1100\u1161\u11a8" * 20,  # Hangul as jamo: leading, vowel, final
        "prose/a" + "\uac00\u11a8" * 20,  # a precomposed syllable with a final jamo after
        "prose/" + "\uac00" * 40,  # precomposed syllables, each one code point
    ]
    page = browser.open("about:blank")
    for name in names:
        head, _, tail = _label(name).partition("…")
        assert tail and len(head) + len(tail) < LABEL_MOST, (name, head, tail)
        whole = page.evaluate(
            f"""(() => {{
            const name = {json.dumps(name)}, head = {json.dumps(head)}, tail = {json.dumps(tail)};
            const ends = new Set([...new Intl.Segmenter('en', {{granularity: 'grapheme'}})
                .segment(name)].map(s => s.index + s.segment.length));
            return name.startsWith(head) && name.endsWith(tail) && ends.has(head.length)
                && (tail.length === name.length || ends.has(name.length - tail.length));
        }})()"""
        )
        assert whole, (name, head, tail)


def _hours_back(kb, hours: int) -> None:
    """Every time state.db holds of jobs and attempts moved ``hours`` back: the night
    they were stamped in, read the next morning."""
    columns = {
        "review_jobs": ("created_at", "updated_at", "finished_at"),
        "attempts": (
            "started_at", "taken_at", "launched_at", "heartbeat_at", "ended_at", "recorded_at"
        ),
    }  # fmt: skip
    with sqlite3.connect(kb.state / "state.db") as conn:
        for table, cols in columns.items():
            for col in cols:
                conn.execute(
                    f"UPDATE {table} SET {col} = strftime('%Y-%m-%dT%H:%M:%fZ', "
                    f"substr({col}, 1, 23), '-{hours} hours') WHERE {col} IS NOT NULL"
                )


def test_a_night_whose_worker_was_killed_says_no_worker_is_heard_from(kb, browser, tmp_path):
    """The worker killed (SIGKILL) with an agent running, the control kept dispatching its
    job to a queue no one took from, and the morning report said "needs you: nothing",
    where `status` said the worker was last heard from hours ago: a night whose workers
    died read as a quiet one."""
    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + FAST_QUEUE)
    started, gate = make_fifo(tmp_path, "started"), ContinueGate(tmp_path / "go")
    base = [str(Path(sys.executable).parent / "reviewq"), "--root", str(kb.root)]
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    held = {**env, "FAKE_NOTIFY_FIFO": str(started), "FAKE_CONTINUE_FIFO": str(gate.path)}
    control = subprocess.Popen([*base, "control"], env=env, stderr=subprocess.PIPE)
    worker = subprocess.Popen(
        [*base, "worker", "--workers", "1"], env=held, stderr=subprocess.DEVNULL
    )
    procs, agent = [control, worker], None
    guard = threading.Timer(120, lambda: [p.kill() for p in procs])
    guard.start()
    try:
        assert (
            reviewq_process(
                "--root", str(kb.root), "enqueue", "--reviewer", "fake", "frontmatter"
            ).returncode
            == 0
        )
        agent = int(await_fifo(started).split()[0])  # the agent runs, held at the gate
        _until(control.stderr, "attempt.started")  # and the control has heard so
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        _until(control.stderr, "attempt.lost")  # the reaper gave its attempt up
        _hours_back(kb, 6)
        data = json.loads(reviewq_process("--root", str(kb.root), "report", "--json").stdout)
        idle = data["needs_you"]["no_worker"]
        assert (idle["jobs_waiting"], idle["control_running"]) == (1, True), idle
        assert idle["last_heard_from"].endswith(f":{worker.pid}"), idle
        said = (
            f"1 job(s) wait and no worker has been heard from since {idle['last_heard_at'][:19]}Z"
        )
        assert idle["says"].startswith(said) and "6 h " in idle["says"], idle
        assert idle["says"].endswith(
            "start one: reviewq worker (reviewq doctor --worker on its machine)"
        )
        assert data["needs_you"]["count"] >= 1
        page_path = tmp_path / "no-worker.html"
        res = reviewq_process("--root", str(kb.root), "report", "--html", str(page_path))
        assert "needs you: 1 job(s) waiting with no worker" in res.stdout, res.stdout
        assert f"\n  {idle['says']}\n" in res.stdout, res.stdout
        # Each reviewer's jobs that do not move no longer ask what the line answers.
        (line,) = [x for x in res.stdout.splitlines() if x.startswith("  reviewer fake: ")]
        assert "job(s), no attempt has moved since " in line, line  # queued, or sent again
        assert "is the control process running, with workers?" not in res.stdout
        for width in (1280, 390):
            page = browser.open(page_path.as_uri(), width=width, height=900, mobile=width < 500)
            shown = page.evaluate(
                """[[...document.querySelectorAll('ul.needs li')].map(li => li.innerText),
                [...document.querySelectorAll('.no-worker')].map(p => p.innerText)]"""
            )
            assert shown[0][0] == "1 job(s) waiting with no worker", shown
            assert shown[1] == [idle["says"]], shown
            assert "is the control process running" not in page.evaluate("document.body.innerText")
            assert page.evaluate("document.documentElement.scrollWidth") <= width
        # Started as it says, a worker runs the job, and nothing more is said of workers.
        procs.append(subprocess.Popen([*base, "worker"], env=env, stderr=subprocess.DEVNULL))
        _until(control.stderr, "job.finalized")
        data = json.loads(reviewq_process("--root", str(kb.root), "report", "--json").stdout)
        assert data["needs_you"]["no_worker"] is None
    finally:
        _stop_all(guard, procs)
        gate.open_gate()  # the killed worker's agent, left running, ends
        if agent:
            _await_exit([agent])
        gate.close()
