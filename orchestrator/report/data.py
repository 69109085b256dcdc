"""The morning report's data: read-only SQL over state.db, one dict a template, a terminal
and a script can all use. Lists are cut to the worst ``limit`` items (``None``: all), and
every cut list carries its full count, so a large night stays a small page."""

from __future__ import annotations

import difflib
import json
import shlex
import statistics
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from orchestrator.config import Settings
from orchestrator.kb.notes import read_file
from orchestrator.report.period import Period
from orchestrator.state.files import NOT_TRIED
from orchestrator.state.status import (
    FAILED_SQL,
    NOT_RUN_SQL,
    REWRITE_REPORTS,
    WAITING_SQL,
    WITHDRAWN_SQL,
    OnlyReject,
    agents_failed,
    by_note,
    decide_calls,
    idle_words,
    over_budget_runs,
    pause_why,
    pause_words,
    paused_reviewers,
    quoted,
    redo_call,
    resume_command,
    spent_budgets,
    stale_now,
    unread_report,
    unwritten_fixes,
    waiting_on,
    workers_heard,
)
from orchestrator.state.store import (
    Store,
    control_pid,
    parse_timestamp,
    reasons_column,
    timestamp,
)
from orchestrator.state.words import NEVER_PICKED_UP

TREND_NIGHTS = 14
DIFF_LINES = 200  # per fix: a rewrite of a long note is summarised, not printed whole
REPORT_LINES = 60  # per gate-review report
# An attempt whose agent ran and failed (a charge on the profile's work); one that was no
# run (NOT_RUN_SQL: no worker, program or model) was counted as failed, and a night with
# the workers down showed every reviewer at 100 %.
FAILED_ATTEMPT = f"a.outcome IN ({FAILED_SQL})"
# Open jobs none of whose attempts launched, beat or ended for this long have stalled.
STALLED_AFTER = timedelta(minutes=15)
# A night runs noon to noon on this machine's clock (cron's), so a sweep that crosses
# midnight counts as one night. Noon UTC was 02:00 in Honolulu and 04:00 in California:
# a 01:30 sweep there was two nights' bars.
NIGHT = "date(substr({col}, 1, 19), 'localtime', '-12 hours')"
# Why an applied fix's commit waits for a later tick (another git's lock, a merge), if it does.
_COMMIT_PENDING = (
    "(SELECT d.error FROM fix_writes_due d WHERE d.job_id = j.id AND d.written = 1 "
    f"AND d.error != '{NOT_TRIED}') AS commit_pending"
)


ChangedSince = Callable[[list[dict]], dict[int, str]]


def gather(
    store: Store,
    state_dir: Path,
    period: Period,
    *,
    limit: int | None = 50,
    now: str,
    only_reject: OnlyReject | None = None,
    not_run: list[dict] | None = None,
    settings: Settings | None = None,
    changed_since: ChangedSince | None = None,
) -> dict:
    """``only_reject`` looks at the KB: without it (no KB to read) every escalation is
    shown as decidable; so does ``changed_since`` (escalation rows -> why each pair stale
    since its FAIL is so, by id). ``not_run``: the cron sweeps whose last time ran
    nothing (they need the settings to read), each with the line that says it (``says``).
    ``settings``
    names the ``[[sweeps]]`` entries whose next run takes over what a spent budget holds."""
    scope, args = _scope(period)
    unwritten = unwritten_fixes(store)  # both sections show them
    needs = _needs_you(
        store, state_dir, scope, args, limit, now, unwritten, only_reject, period.run_id, settings
    )
    # A note mended while its escalation waited: a reject, as recommended, holds the mend
    # unreviewed (CONTRACT §7); said under it, as `escalations` says it.
    shown = [e for g in needs["escalations"] for e in g["escalations"]]
    changed = changed_since(shown) if changed_since else {}
    for e in shown:
        e["changed_since_fail"] = changed.get(e["id"])
    # Whatever the period, as a pause is: a night with no sweep looked quiet.
    needs["sweeps_not_run"] = list(not_run or [])
    needs["count"] += len(needs["sweeps_not_run"])
    reviewed = _reviewed(store, scope, _scope(period, spent=True)[0], args, limit, period)
    # The FAILs nothing came of are a person's to take (edit the note, or a --fix sweep
    # from the start): the page said "Nothing" needs you beside them.
    needs["count"] += reviewed["fails_left_total"]
    return {
        "period": period.to_json(),
        "generated_at": now,
        "needs_you": needs,
        "kb_changes": _kb_changes(store, scope, args, limit, unwritten),
        "reviewed": reviewed,
        "trends": _trends(store, period),
    }


def _scope(period: Period, spent: bool = False) -> tuple[str, tuple]:
    """A WHERE clause over ``review_jobs j`` for the jobs the report is about: a run's,
    or those that did something in the window: were queued, ran (an attempt opened),
    ended, or changed (a fix that could not be written, given up when a person edited the
    note). By creation alone, a job queued before the last report and run after it
    (enqueue, a budget or pause that held it) was in neither report. With ``spent``, also
    those with an attempt that ended or had its cost recorded in the window, for what
    attempts cost: a lost agent's outcome that came after the report that showed its job
    put the whole job, decisions and all, in the next report again."""
    if period.run_id is not None:
        return "j.sweep_run_id = ?", (period.run_id,)
    # The ids each time's index gives, read by key: an OR over the times (and an EXISTS
    # per job) was answered by reading every job, and its attempts, ever recorded.
    ids = _ids_in_window("review_jobs", "id", "created_at", "finished_at", "updated_at")
    if spent:
        ids += " UNION " + _ids_in_window(
            "attempts", "job_id", "started_at", "ended_at", "recorded_at"
        )
    return f"j.id IN ({ids})", (period.since, period.until)


def _ids_in_window(table: str, id_column: str, *columns: str) -> str:
    """The ``id_column`` of ``table``'s rows with any of these times in the window (the
    parameters ?1 and ?2), one indexed range a time."""
    return " UNION ".join(
        f"SELECT {id_column} FROM {table} WHERE {c} >= ?1 AND {c} < ?2" for c in columns
    )


def _in_window(*columns: str) -> str:
    """Any of these times in the window, whose bounds are the parameters ?1 and ?2."""
    return "(" + " OR ".join(f"{c} >= ?1 AND {c} < ?2" for c in columns) + ")"


def _rows(store: Store, sql: str, args: tuple = ()) -> list[dict]:
    return [dict(r) for r in store.conn.execute(sql, args)]


def _cut(items: list, limit: int | None) -> list:
    return items if limit is None else items[:limit]


def first_finding(rationale: str | None, width: int = 200) -> str:
    """The first ``- severity: text`` finding of a rationale, else its first line."""
    lines = [ln.strip() for ln in (rationale or "").splitlines() if ln.strip()]
    pick = next(
        (ln[2:] for ln in lines if ln.startswith("- ") and ln[2:].lower() not in ("none", "none.")),
        lines[0] if lines else "no rationale given",
    )
    return pick if len(pick) <= width else pick[: width - 1] + "…"


def diff(before: str | None, after: str | None, path: str) -> dict:
    """A unified diff as lines tagged add/del/hunk/ctx, cut at DIFF_LINES."""
    lines = list(
        difflib.unified_diff(
            (before or "").splitlines(),
            (after or "").splitlines(),
            f"a/{path}",
            f"b/{path}",
            lineterm="",
        )
    )
    tagged = []
    for ln in lines[2:]:
        kind = {"+": "add", "-": "del", "@": "hunk"}.get(ln[:1], "ctx")
        tagged.append({"kind": kind, "text": ln})
    return {
        "lines": tagged[:DIFF_LINES],
        "more": max(0, len(tagged) - DIFF_LINES),
        "added": sum(1 for t in tagged if t["kind"] == "add"),
        "removed": sum(1 for t in tagged if t["kind"] == "del"),
    }


# --- needs you --------------------------------------------------------------------------------


def _needs_you(
    store: Store,
    state_dir: Path,
    scope: str,
    args: tuple,
    limit: int | None,
    now: str,
    unwritten: list[dict],
    only_reject: OnlyReject | None,
    run_id: int | None,
    settings: Settings | None,
) -> dict:
    open_escs = _rows(
        store,
        "SELECT id, note_path, gate_id, model_partition, reason, cycles, reviewer, fixer, "
        "report_path, raised_at, call, job_id FROM escalations WHERE decision IS NULL ORDER BY id",
    )
    ordered = by_note(
        open_escs, lambda e: e["note_path"], lambda e: e["call"]
    )  # as `escalations` lists them
    groups = [
        _escalated_note(store, state_dir, note, escs, only_reject)
        for note, escs in _cut(ordered, limit)
    ]
    failed = _rows(
        store,
        f"SELECT j.id, j.kind, j.reviewer, j.runner, j.lens, j.note_path, j.failure_reasons, "
        "j.finished_at, "
        f"(SELECT count(*) FROM review_pairs p WHERE p.job_id = j.id) AS pairs "
        f"FROM review_jobs j WHERE {scope} AND j.status = 'failed' "
        # A failure that raised an escalation (call redo) needs a person once, there, and
        # not again once that is decided: the failure was answered (it came back under
        # "needs you" after every decide). An audit's is raised in the reviewed job's
        # partition, not the auditor's. Raised before escalations named their job: one
        # raised on its pairs since it failed.
        "AND NOT EXISTS (SELECT 1 FROM escalations e WHERE e.job_id = j.id) "
        "AND NOT EXISTS (SELECT 1 FROM review_pairs p JOIN escalations e "
        "ON e.note_path = p.note_path AND e.gate_id = p.gate_id "
        "AND e.model_partition = COALESCE((SELECT s.model_partition FROM review_jobs s "
        "WHERE j.kind = 'audit' AND s.id = j.source_job_id), j.model_partition) "
        "WHERE p.job_id = j.id AND (e.decision IS NULL "
        "OR (e.job_id IS NULL AND e.raised_at >= j.finished_at))) "
        f"AND NOT {WITHDRAWN_SQL} ORDER BY j.id",
        args,
    )
    for f in failed:
        f["reasons"] = reasons_column(f.pop("failure_reasons"))[:3]
        # A review job records no note of its own: its pairs name the notes it was about.
        f["notes"] = [
            r[0]
            for r in store.conn.execute(
                "SELECT DISTINCT note_path FROM review_pairs WHERE job_id = ? ORDER BY note_path",
                (f["id"],),
            )
        ]
    held = over_budget_runs(store)  # runs whose spent budget holds queued jobs back
    budgets = _budgets(store, held, run_id, settings)
    pauses = paused_reviewers(store, now)
    waiting = waiting_on(store, pauses)  # whatever the period, as the pause itself
    paused = [
        {
            "reviewer": name,
            "paused_since": pause.since,
            "paused_until": pause.until,
            "resume": resume_command(name),
            "why": pause_why(store, name, pause),
            "jobs_waiting": waiting[name],
            # as status says it (doctor and job N without the count)
            "says": pause_words(store, name, pause, waiting[name]),
        }
        for name, pause in sorted(pauses.items())
    ]
    try:  # profiles added since the running control started: their jobs wait for it
        pid = control_pid(state_dir)
        restart = set(stale_now(state_dir, pid))
    except OSError:
        pid, restart = None, set()
    open_jobs = _open_jobs(store, now, held)
    idle = _no_worker(store, now, [r for r in open_jobs if r["reviewer"] not in pauses], pid)
    stalled = _stalled(store, now, open_jobs, {p["reviewer"] for p in paused}, restart)
    return {
        # Everything below that waits on a person, for the page's tile.
        "count": (idle is not None)
        + len(open_escs)
        + len(failed)
        + len(paused)
        + len(budgets)
        + len(unwritten)
        + len(stalled_apart(stalled, idle)),
        "escalations": groups,
        "escalations_open": len(open_escs),
        "agents_failed": agents_failed(open_escs, only_reject),
        "escalated_notes": len(ordered),
        "failed_jobs": _cut(failed, limit),
        "failed_total": len(failed),
        "paused_reviewers": paused,
        "budgets_reached": budgets,
        "fixes_unwritten": _cut(unwritten, limit),
        "fixes_unwritten_total": len(unwritten),
        "stalled": stalled,
        "no_worker": idle,
    }


def stalled_apart(stalled: list[dict], no_worker: dict | None) -> list[dict]:
    """The reviewers whose jobs do not move that are a thing to do apart from ``no_worker``:
    said, it counts their jobs already (every open job but a paused reviewer's), and a big
    night's one stall was two items of "needs you", the tile counting it twice. A reviewer
    whose jobs wait for the control to be restarted is another thing to do."""
    return [s for s in stalled if no_worker is None or s["awaits_control_restart"]]


# A reviewer's newest launched attempt by ``col``: attempts first (CROSS JOIN), walked
# down ``col``'s index; led by the jobs, SQLite read every attempt of the reviewer's.
_LAST = (
    "(SELECT a.{col} FROM attempts a CROSS JOIN review_jobs j ON j.id = a.job_id "
    "WHERE j.reviewer = ? AND a.launched_at IS NOT NULL AND a.{col} IS NOT NULL "
    "ORDER BY a.{col} DESC LIMIT 1)"
)


def _has(store: Store, reviewer: str, where: str) -> bool:
    """Whether an attempt of ``reviewer``'s has ``where``: led by its jobs (CROSS JOIN),
    found at the first of one with a history, and no more than its own attempts read for
    one without."""
    return (
        store.conn.execute(
            "SELECT 1 FROM review_jobs j CROSS JOIN attempts a ON a.job_id = j.id "
            f"WHERE j.reviewer = ? AND {where} LIMIT 1",
            (reviewer,),
        ).fetchone()
        is not None
    )


def _open_jobs(store: Store, now: str, held: set[int]) -> list[dict]:
    """Each reviewer's open jobs a control process would run at ``now`` (``queued``,
    ``running``, the ``oldest`` one's creation): not those made by hand (create-jobs), in a
    launch's backoff, or queued in a run over its budget (``held``), which wait for its
    next run and are said there."""
    return _rows(
        store,
        "SELECT reviewer, SUM(status = 'queued') AS queued, SUM(status = 'running') AS running, "
        "MIN(created_at) AS oldest FROM review_jobs WHERE reviewer IS NOT NULL "
        "AND (status = 'running' OR (status = 'queued' AND (sweep_run_id IS NULL OR "
        "sweep_run_id NOT IN (SELECT value FROM json_each(?))))) "
        "AND (not_before IS NULL OR not_before <= ?) GROUP BY reviewer ORDER BY reviewer",
        (json.dumps(sorted(held)), now),
    )


def _no_worker(store: Store, now: str, open_jobs: list[dict], pid: int | None) -> dict | None:
    """Jobs that wait (``open_jobs``, but a paused reviewer's) with nothing to run them
    for :data:`STALLED_AFTER`: no control process, or no worker heard from (on the
    control's clock, as `status` reads it). A night whose workers were killed at 01:00 said
    only that each reviewer's jobs did not move, asking whether a control ran: the one
    thing to do, start a worker, was in `status` alone."""
    waiting = sum(r["queued"] + r["running"] for r in open_jobs)
    if not waiting:
        return None
    heard = workers_heard(store, control_runs=pid is not None)
    since = max(heard["last_heard_at"] or "", min(r["oldest"] for r in open_jobs))
    if since >= timestamp(parse_timestamp(now) - STALLED_AFTER):
        return None  # heard from a moment ago, or queued only a moment ago
    return {
        "jobs_waiting": waiting,
        "control_running": pid is not None,
        "last_heard_at": heard["last_heard_at"],
        "last_heard_from": heard["last_heard_from"],
        "says": idle_words(waiting, pid is not None, heard, now),
    }


def _stalled(
    store: Store,
    now: str,
    open_jobs: list[dict],
    paused: set[str],
    restart: set[str] = frozenset(),
) -> list[dict]:
    """Reviewers whose open jobs (:func:`_open_jobs`) have not moved for
    :data:`STALLED_AFTER`: no attempt of theirs launched, sent a heartbeat or ended since.
    Read at ``now``, whatever the period: with no worker running, the jobs were queued
    before the window and nothing happened to them in it, so the report said "needs you:
    nothing" over a night's backlog. Jobs that wait on a pause or a spent budget are shown
    there instead."""
    cutoff = timestamp(parse_timestamp(now) - STALLED_AFTER)
    out = []
    for r in open_jobs:
        r = dict(r)
        if r["reviewer"] in paused:
            continue
        # Each read walks the attempts by time from the newest, through their indexes,
        # until one of this reviewer's: the attempts since it last moved, where reading
        # its jobs' attempts read a third of a year's. A walk for what the reviewer has
        # none of is the whole index: asked first of its own jobs' attempts.
        heard = [
            store.conn.execute(f"SELECT {_LAST.format(col=col)}", (r["reviewer"],)).fetchone()[0]
            for col in ("heartbeat_at", "recorded_at")
            if _has(store, r["reviewer"], f"a.launched_at IS NOT NULL AND a.{col} IS NOT NULL")
        ]
        # On the control's clock (a launch's heartbeat, an outcome's recording), as status
        # reads a worker: launched_at and ended_at are a worker's own, and one whose clock
        # ran an hour ahead hid a stall for that hour.
        moved = max(heard, default=None)
        since = max(moved or "", r["oldest"])
        if since >= cutoff:
            continue  # moving, or queued only a moment ago
        r["last_moved"] = moved
        r["awaits_control_restart"] = r["reviewer"] in restart
        ended = _has(store, r["reviewer"], "a.ended_at IS NOT NULL")
        r["never_picked_up"] = (
            store.conn.execute(
                "SELECT count(*) FROM attempts a CROSS JOIN review_jobs j ON j.id = a.job_id "
                "WHERE j.reviewer = ? AND a.outcome = 'lost' AND a.ended_at >= ? "
                "AND a.reasons LIKE ?",
                (r["reviewer"], since, f"%{NEVER_PICKED_UP}%"),
            ).fetchone()[0]
            if ended
            else 0
        )
        # A pause that ran out with no control process left to try again leaves no other
        # trace of the outage the night ended on: the last attempt's own words.
        last = (
            ended
            and store.conn.execute(
                f"SELECT a.outcome, a.reasons, {NOT_RUN_SQL} AS not_run FROM attempts a "
                "CROSS JOIN review_jobs j ON j.id = a.job_id WHERE j.reviewer = ? "
                "AND a.ended_at IS NOT NULL ORDER BY a.ended_at DESC, a.id DESC LIMIT 1",
                (r["reviewer"],),
            ).fetchone()
        )
        r["last_not_run"] = None
        if last and last["not_run"]:
            reasons = reasons_column(last["reasons"])
            r["last_not_run"] = last["outcome"] + (f": {reasons[0]}" if reasons else "")
        out.append(r)
    return out


def _gate_report(store: Store, state_dir: Path, e: dict) -> str:
    """An open escalation's gate-review report as the page shows it: its file, which a
    person may have edited (STATE is theirs to read), shown as it decodes; else what
    state.db holds of it. One the control process has yet to write (a full disk when it
    was raised) says so, even with a file there, as `escalations` reads it
    (``current_report``): the file may be older (an upgrade changed its call), and the
    page recommended reject beside commands recommending redo. One deleted by hand says
    the command that writes it again: "cannot be read: [Errno 2] No such file" named
    neither."""
    row = store.conn.execute(
        "SELECT e.*, d.error FROM escalations e "
        "LEFT JOIN escalation_reports_due d ON d.escalation_id = e.id WHERE e.id = ?",
        (e["id"],),
    ).fetchone()
    if row["error"] is not None:
        why = "" if row["error"] == NOT_TRIED else f" ({row['error']})"
        head = (
            f"(the gate-review report is not written yet{why}; the control process "
            "writes it at its next tick)"
        )
    else:
        try:
            # Anything but a regular file is an OSError: a FIFO there held the page for good.
            return read_file(state_dir / e["report_path"]).decode("utf-8", errors="replace")
        except FileNotFoundError:
            head = f"(the gate-review report's file is missing: {REWRITE_REPORTS})"
        except OSError as exc:
            head = f"(the gate-review report {unread_report(exc)}: {REWRITE_REPORTS})"
    recommend, material = quoted(store, row)
    return "\n".join(
        [
            head,
            f"Recommend {e['call']}: {recommend.rstrip('.')}.",
            *(["Material:", *(f"- {m}" for m in material)] if material else []),
        ]
    )


def _escalated_note(
    store: Store, state_dir: Path, note: str, escs: list[dict], only_reject: OnlyReject | None
) -> dict:
    for e in escs:
        # A note deleted or renamed since (or a gate gone) leaves reject as the only call
        # `decide` takes: said here, not after a person tried approve.
        e["only_reject"] = only_reject(note, e["gate_id"]) if only_reject else None
        text = _gate_report(store, state_dir, e)
        lines = text.rstrip("\n").splitlines()
        e["report"] = "\n".join(lines[:REPORT_LINES]) + ("\n…" if len(lines) > REPORT_LINES else "")
    fixes = _rows(
        store,
        "SELECT j.id, j.status, j.result, j.reviewer AS fixer, j.feedback, j.failure_reasons, "
        f"j.finished_at, j.fix_commit, j.fix_no_commit, {_COMMIT_PENDING}, g.text AS given, f.text AS fixed "
        "FROM review_jobs j LEFT JOIN snapshots f ON f.id = j.fixed_snapshot_id "
        "LEFT JOIN snapshots g ON g.id = (SELECT note_snapshot_id FROM review_pairs WHERE job_id = j.id "
        "ORDER BY id LIMIT 1) WHERE j.kind = 'fix' AND j.note_path = ? ORDER BY j.id DESC LIMIT 5",
        (note,),
    )
    attempts = []
    for f in reversed(fixes):
        given, fixed = f.pop("given"), f.pop("fixed")
        f["reasons"] = reasons_column(f.pop("failure_reasons"))[:3]
        f["diff"] = diff(given, fixed, note) if fixed is not None else None
        attempts.append(f)
    ids = " ".join(str(e["id"]) for e in escs)
    target = f"--note {shlex.quote(note)}" if len(escs) > 1 else ids
    calls = decide_calls(note, [(e["id"], e["model_partition"]) for e in escs], store)
    # A redo takes one partition's at a time (one fix job a note): the others next time.
    redo = target if None in calls else next(iter(calls.values()))
    return {
        "note_path": note,
        "escalations": escs,
        # Each once: a gate escalated in two partitions is one gate of the note.
        "gates": list(dict.fromkeys(e["gate_id"] for e in escs)),
        "fix_attempts": attempts,
        # The command the summary shows: the call the escalations recommend (reject after
        # rejections; redo when an agent failed every attempt and judged nothing; approve
        # when only the audit failed). Calls that differ get redo, the one that records
        # no verdict nobody made.
        # A note-wide approve or redo is refused while any of them can only be rejected.
        "suggested": "reject"
        if any(e["only_reject"] for e in escs)
        else escs[0]["call"]
        if len({e["call"] for e in escs}) == 1
        else "redo",
        "commands": {
            "approve": f"reviewq decide {target} approve",
            "redo": redo_call(redo, [e["call"] for e in escs]),
            "reject": f"reviewq decide {target} reject",
        },
    }


def _budgets(
    store: Store, held: set[int], run_id: int | None, settings: Settings | None
) -> list[dict]:
    """The ``held`` runs (a spent budget holds their queued jobs back): each is a person's
    task for as long as its jobs wait, whatever the period (by the period's jobs, the
    morning after it was listed said "nothing" of jobs still waiting); a run's report,
    that run's."""
    return spent_budgets(store, held if run_id is None else held & {run_id}, settings)


# --- what changed in the KB --------------------------------------------------------------------


def _kb_changes(
    store: Store, scope: str, args: tuple, limit: int | None, unwritten: list[dict]
) -> dict:
    counts = dict(
        store.conn.execute(
            f"SELECT COALESCE(j.result, j.status), count(*) FROM review_jobs j WHERE {scope} "
            "AND j.kind = 'fix' GROUP BY 1",
            args,
        ).fetchall()
    )
    committed = store.conn.execute(
        f"SELECT count(*) FROM review_jobs j WHERE {scope} AND j.kind = 'fix' AND j.fix_commit IS NOT NULL",
        args,
    ).fetchone()[0]
    applied = _rows(
        store,
        "SELECT j.id, j.note_path, j.reviewer AS fixer, j.review_reviewer AS reviewer, j.finished_at, "
        f"j.fix_commit, j.fix_no_commit, {_COMMIT_PENDING}, j.feedback, g.text AS given, f.text AS fixed, "
        "(SELECT group_concat(p.gate_id, ', ') FROM review_pairs p WHERE p.job_id = j.id) AS gates, "
        "j.source_job_id FROM review_jobs j JOIN snapshots f ON f.id = j.fixed_snapshot_id "
        "LEFT JOIN snapshots g ON g.id = (SELECT note_snapshot_id FROM review_pairs WHERE job_id = j.id "
        f"ORDER BY id LIMIT 1) WHERE {scope} AND j.kind = 'fix' AND j.result = 'applied' "
        "ORDER BY j.id" + ("" if limit is None else f" LIMIT {int(limit)}"),
        args,
    )
    unwritten_error = {u["job_id"]: u["error"] for u in unwritten}
    for f in applied:
        f["diff"] = diff(f.pop("given"), f.pop("fixed"), f["note_path"])
        f["unwritten"] = unwritten_error.get(f["id"])
    human = _rows(
        store,
        f"SELECT j.id, j.note_path, j.finished_at, j.failure_reasons FROM review_jobs j WHERE {scope} "
        "AND j.kind = 'fix' AND j.result = 'not-applied' ORDER BY j.id",
        args,
    )
    for h in human:
        h["reason"] = (reasons_column(h.pop("failure_reasons")) or ["the note changed"])[0]
    return {
        "fixes": applied,
        "fix_results": counts,
        "fixes_applied": counts.get("applied", 0),
        "fixes_committed": committed,
        "human_edits": _cut(human, limit),
        "human_edits_total": len(human),
    }


# --- what was reviewed -------------------------------------------------------------------------


def _attempts_in(period: Period) -> str:
    """Which attempts of the jobs in scope count (their cost, tokens, outcomes): a job that
    ran on both sides of a report is in both, each attempt's cost in one."""
    if period.run_id is not None:
        return "1"
    # When its outcome and cost were recorded (migration 13); an open attempt where it
    # started, so tonight's report shows it running and a later one what it came to.
    return _in_window("COALESCE(a.recorded_at, a.started_at)")


def _first_work(store: Store, scope: str, args: tuple) -> str | None:
    """When the window's work began, for jobs queued before it: a job queued last night
    that waited all day on a paused reviewer, a spent budget or a stopped control, and ran
    tonight, counts from its attempt's start, not from the last report (its wait was no
    part of tonight's wall time). An attempt that was running at the window's start counts
    from that start; jobs queued in the window, from their queueing."""
    return store.conn.execute(
        f"SELECT min(t) FROM (SELECT j.created_at AS t FROM review_jobs j WHERE {scope} "
        "AND j.grouping != 'human' AND j.created_at >= ?1 "
        "UNION ALL SELECT max(a.started_at, ?1) FROM review_jobs j CROSS JOIN attempts a "
        f"ON a.job_id = j.id WHERE {scope} AND j.grouping != 'human' "
        "AND a.started_at IS NOT NULL AND (a.ended_at IS NULL OR a.ended_at >= ?1))",
        args,
    ).fetchone()[0]


# The decisions a reader looks for, weightiest first.
WORST = ("FAIL", "ERROR", "WARN")


def worst_first(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Decisions per lens or gate, the most FAILs first (then ERRORs, WARNs, the name), as
    the FAIL rates are: by name, the worst of 40 gates was wherever its name fell in the
    chart and the JSON."""
    return dict(sorted(counts.items(), key=lambda kv: (*(-kv[1].get(d, 0) for d in WORST), kv[0])))


def _reviewed(
    store: Store, scope: str, spent: str, args: tuple, limit: int | None, period: Period
) -> dict:
    # CROSS JOIN keeps SQLite from scanning every pair ever recorded: the period's jobs
    # first, then their pairs by job id (3x faster on a 10,000-job night).
    pair_scope = (
        f"FROM review_jobs j CROSS JOIN review_pairs p ON p.job_id = j.id WHERE {scope} "
        "AND j.kind = 'review' AND j.grouping != 'human' AND p.decision IS NOT NULL"
    )
    decisions: dict[str, int] = {}
    by_lens: dict[str, dict[str, int]] = {}
    by_gate: dict[str, dict[str, int]] = {}
    for lens, gate, d, n in store.conn.execute(
        f"SELECT p.lens, p.gate_id, p.decision, count(*) {pair_scope} GROUP BY 1, 2, 3 ORDER BY 1, 2",
        args,
    ):
        decisions[d] = decisions.get(d, 0) + n
        by_lens.setdefault(lens, {})[d] = by_lens.get(lens, {}).get(d, 0) + n
        by_gate.setdefault(gate, {})[d] = n
    by_lens, by_gate = worst_first(by_lens), worst_first(by_gate)
    reviewers = _rows(
        store,
        "SELECT COALESCE(j.reviewer, '-') AS reviewer, "
        f"SUM(CASE WHEN {WAITING_SQL} THEN 0 ELSE 1 END) AS attempts, "
        "COALESCE(SUM(a.cost_usd), 0) AS cost_usd, COALESCE(SUM(a.input_tokens), 0) AS input_tokens, "
        "COALESCE(SUM(a.output_tokens), 0) AS output_tokens, COALESCE(SUM(a.duration_s), 0) AS agent_s, "
        f"SUM(CASE WHEN {FAILED_ATTEMPT} THEN 1 ELSE 0 END) AS failed, "
        f"SUM(CASE WHEN {NOT_RUN_SQL} THEN 1 ELSE 0 END) AS not_run "
        f"FROM review_jobs j CROSS JOIN attempts a ON a.job_id = j.id WHERE {spent} "
        f"AND {_attempts_in(period)} GROUP BY 1 ORDER BY 1",
        args,
    )
    for r in reviewers:  # sums of floats: 0.31, not 0.3100000000000001, in --json
        r["cost_usd"], r["agent_s"] = round(r["cost_usd"], 6), round(r["agent_s"], 3)
    machines = _machines(store, spent, args, period)
    attempts = dict(
        store.conn.execute(
            f"SELECT a.outcome, count(*) FROM review_jobs j CROSS JOIN attempts a ON a.job_id = j.id "
            f"WHERE {spent} AND {_attempts_in(period)} GROUP BY 1 ORDER BY 2 DESC",
            args,
        ).fetchall()
    )
    jobs: dict[str, dict[str, int]] = {}
    for kind, st, n in store.conn.execute(
        f"SELECT j.kind, j.status, count(*) FROM review_jobs j WHERE {scope} AND j.grouping != 'human' "
        "GROUP BY 1, 2",
        args,
    ):
        jobs.setdefault(kind, {})[st] = n
    # The period's jobs are those that moved in it; the queue's backlog is said beside them
    # (a pause's "14 job(s) waiting" disagreed with their "1 queued").
    (queued_all,) = store.conn.execute(
        "SELECT count(*) FROM review_jobs WHERE status = 'queued' AND grouping != 'human'"
    ).fetchone()
    first, last = store.conn.execute(
        f"SELECT min(j.created_at), max(COALESCE(j.finished_at, j.updated_at)) FROM review_jobs j "
        f"WHERE {scope} AND j.grouping != 'human'",
        args,
    ).fetchone()
    if first and period.run_id is None and first < period.since:
        first = _first_work(store, scope, args) or period.since
    if first and last:
        last = max(last, first)
    wall = (
        (parse_timestamp(last) - parse_timestamp(first)).total_seconds() if first and last else 0.0
    )
    # FAILs too: a run without --fix sends them to no fixer and no person, and a later
    # --fix run finds them fresh, so the report is where they are named.
    warns, fails = (
        _findings(store, pair_scope, args, limit, decision) for decision in ("WARN", "FAIL")
    )
    cost = sum(r["cost_usd"] for r in reviewers)
    return {
        "pairs": sum(decisions.values()),
        "decisions": decisions,
        "by_lens": by_lens,
        "by_gate": by_gate,
        "reviewers": reviewers,
        "attempts": attempts,
        "machines": machines,
        "jobs": jobs,
        "queued_all": queued_all,
        "cost_usd": round(cost, 6),
        "tokens": sum(r["input_tokens"] + r["output_tokens"] for r in reviewers),
        "wall_time_s": round(wall, 1),
        "first_job_at": first,
        "last_job_at": last,
        "warns": warns,
        "warns_total": decisions.get("WARN", 0),
        "fails": fails,
        "fails_total": decisions.get("FAIL", 0),
        "fails_left_total": store.conn.execute(
            f"SELECT count(*) {pair_scope} AND p.decision = 'FAIL' AND ({FAIL_THEN}) IS NULL", args
        ).fetchone()[0],
    }


def _machines(store: Store, spent: str, args: tuple, period: Period) -> list[dict]:
    """The period's attempts by the host of the worker that took them: with workers on
    two machines the page named none, and which did what, or that one died (its attempts
    lost), was in the logs alone. ``workers``: the worker processes (host:pid) there, a
    restart one more, and each ``reviewq sweep``'s own worker too (so not said to be a
    restart); ``last_heard_at``: its last heartbeat or outcome (the control's clock).
    Attempts no worker took (not run, a ``run-job``'s) are in no row."""
    hosts: dict[str, dict] = {}
    # Heard: a beat or an outcome it sent, as status reads it; not the reaper's record of
    # its attempts lost, which a dead worker's host read as heard from at the reap.
    for worker, run, failed, lost, beat, answered in store.conn.execute(
        "SELECT a.worker, SUM(CASE WHEN a.launched_at IS NULL THEN 0 ELSE 1 END), "
        f"SUM(CASE WHEN {FAILED_ATTEMPT} THEN 1 ELSE 0 END), "
        "SUM(CASE WHEN a.outcome = 'lost' THEN 1 ELSE 0 END), max(a.heartbeat_at), "
        "max(CASE WHEN a.outcome NOT IN ('dispatched', 'running', 'lost', 'superseded') "
        "THEN a.recorded_at END) "
        f"FROM review_jobs j CROSS JOIN attempts a ON a.job_id = j.id WHERE {spent} "
        f"AND {_attempts_in(period)} AND a.worker IS NOT NULL GROUP BY 1",
        args,
    ):
        m = hosts.setdefault(
            worker.rsplit(":", 1)[0],
            {"workers": 0, "attempts": 0, "failed": 0, "lost": 0, "last_heard_at": None},
        )
        m["workers"] += 1
        m["attempts"] += run
        m["failed"] += failed
        m["lost"] += lost
        m["last_heard_at"] = max(
            (t for t in (beat, answered, m["last_heard_at"]) if t), default=None
        )
    return [{"host": h, **m} for h, m in sorted(hosts.items())]


# What came of a FAIL of the period, or NULL when nothing did: a run without --fix sends
# it to no fixer and no person, and a later --fix run finds it fresh (an ack carries it
# forward, and is no decision on it). On a --fix night the others are the report's other
# lines: its escalation's decide line, the fix in What changed.
FAIL_THEN = (
    "CASE WHEN EXISTS (SELECT 1 FROM escalations e WHERE e.model_partition = j.model_partition "
    "AND e.note_path = p.note_path AND e.gate_id = p.gate_id AND e.raised_at >= p.decided_at) "
    "THEN 'escalated' WHEN NOT EXISTS (SELECT 1 FROM acceptance a WHERE a.model_partition = "
    "j.model_partition AND a.note_path = p.note_path AND a.gate_id = p.gate_id "
    "AND a.review_pair_id = p.id) THEN 'reviewed-again' "
    "WHEN EXISTS (SELECT 1 FROM review_jobs x WHERE x.kind = 'fix' AND x.note_path = p.note_path "
    "AND x.source_job_id = j.id) THEN 'fix' END"
)


def _findings(
    store: Store, pair_scope: str, args: tuple, limit: int | None, decision: str
) -> list[dict]:
    """The period's findings of one decision (WARN, FAIL: a constant), by note and gate; a
    FAIL with what came of it (``then``), worst first: those nothing came of, then those
    escalated, sent to a fixer, and reviewed again since (mended) last. By note path after
    the first, a cut page of a big night gave a third of its rows to FAILs already fixed."""
    then = FAIL_THEN if decision == "FAIL" else "NULL"
    rows = _rows(
        store,
        f"SELECT p.note_path, p.gate_id, p.rationale, j.id AS job_id, {then} AS came {pair_scope} "
        f"AND p.decision = '{decision}' ORDER BY came IS NOT NULL, came = 'reviewed-again', "
        "came = 'fix', p.note_path, p.gate_id, j.id"
        + ("" if limit is None else f" LIMIT {int(limit)}"),
        args,
    )
    for r in rows:
        r["finding"] = first_finding(r.pop("rationale"))
        came = r.pop("came")
        if decision == "FAIL":
            r["then"] = came
    return rows


# --- trends ----------------------------------------------------------------------------------


def _trends(store: Store, period: Period) -> dict:
    end = parse_timestamp(period.until)
    start = timestamp(end - timedelta(days=TREND_NIGHTS))
    nights = [
        (end.astimezone() - timedelta(hours=12) - timedelta(days=i)).date().isoformat()
        for i in reversed(range(TREND_NIGHTS))
    ]
    gate_rates = []
    for gate, fails, decided in store.conn.execute(
        "SELECT p.gate_id, SUM(p.decision = 'FAIL'), count(*) FROM review_jobs j CROSS JOIN review_pairs p "
        "ON p.job_id = j.id WHERE j.kind = 'review' AND j.grouping != 'human' AND p.decision IN "
        "('PASS', 'WARN', 'FAIL') AND j.created_at >= ? AND j.created_at < ? GROUP BY 1 ORDER BY 1",
        (start, period.until),
    ):
        gate_rates.append({"gate_id": gate, "fail": fails, "decided": decided})
    for g in gate_rates:
        g["rate"] = round(g["fail"] / g["decided"], 4) if g["decided"] else 0.0
    # Worst first, as a reader looks for it (then the most FAILs, then by id): by gate id,
    # a night's worst of 17 gates was wherever its name fell in the chart and the JSON.
    gate_rates.sort(key=lambda g: (-g["fail"] / (g["decided"] or 1), -g["fail"], g["gate_id"]))
    median = statistics.median([g["rate"] for g in gate_rates]) if gate_rates else 0.0
    for g in gate_rates:
        # Far above the rest: most notes fail it while the typical gate passes them.
        g["suspect"] = (
            g["decided"] >= 3 and g["rate"] >= 0.5 and g["rate"] >= max(2 * median, median + 0.25)
        )
    night = NIGHT.format(col="a.started_at")
    cost = dict(
        store.conn.execute(
            f"SELECT {night}, COALESCE(SUM(a.cost_usd), 0) FROM attempts a WHERE a.started_at >= ? "
            "AND a.started_at < ? GROUP BY 1",
            (start, period.until),
        ).fetchall()
    )
    per_reviewer = _rows(
        store,
        f"SELECT COALESCE(j.reviewer, '-') AS reviewer, count(*) AS attempts, "
        f"SUM(CASE WHEN {FAILED_ATTEMPT} THEN 1 ELSE 0 END) AS failed FROM attempts a "
        "JOIN review_jobs j ON j.id = a.job_id WHERE a.started_at >= ? AND a.started_at < ? "
        f"AND a.outcome NOT IN ('dispatched', 'running') AND NOT {NOT_RUN_SQL} "
        "GROUP BY 1 ORDER BY 1",
        (start, period.until),
    )
    for r in per_reviewer:
        r["rate"] = round(r["failed"] / r["attempts"], 4) if r["attempts"] else 0.0
    per_reviewer.sort(key=lambda r: (-r["rate"], -r["failed"], r["reviewer"]))  # worst first
    return {
        "nights": nights,
        "fail_rate_by_gate": gate_rates,
        "median_fail_rate": round(median, 4),
        "suspect_gates": [g["gate_id"] for g in gate_rates if g["suspect"]],
        "cost_by_night": [{"night": n, "cost_usd": round(cost.get(n, 0.0), 6)} for n in nights],
        "attempt_failure_by_reviewer": per_reviewer,
    }
