"""CONTRACT §7: rejection cycles, escalations and human decisions.

A rejection is a FAIL for (note, gate, partition). The count of consecutive rejections is
updated in the same transaction as the decision that changes it (:func:`record_decisions`
runs inside finalize's transaction); PASS, WARN and human decisions reset it. The third
rejection escalates instead of starting another fix. An escalation is a row plus a
gate-review report a person can vote on after three lines.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from orchestrator import logs
from orchestrator.kb.atomicfile import atomic_write
from orchestrator.kb.gates import SelectionError, not_asked
from orchestrator.kb.githead import head_commit
from orchestrator.kb.notes import KBError, Note, NoteParseError, read_file, sha256_bytes
from orchestrator.regularfile import make_folder
from orchestrator.review.acceptance import Acked
from orchestrator.review.finalize import texts_taken_at
from orchestrator.review.jobs import display_path
from orchestrator.review.selector import SelectError, select
from orchestrator.state.files import NOT_TRIED, settle_due, write_each
from orchestrator.state.status import (
    CALLS_SAID,
    REDO_IF,
    REJECT_ON_A_PASS,
    REWRITE_REPORTS,
    decide_calls,
    gist,
    held_by_a_reject,
    needs_asks,
    quoted,
    raised_by_agents,
    unread_report,
)
from orchestrator.state.status import by_note as notes_in_order
from orchestrator.state.store import Store, utcnow
from orchestrator.state.workspace import Workspace

ESCALATE_AT = 3
DECISIONS = ("approve", "redo", "reject")


class DecideError(ValueError):
    """A decision that cannot be taken (unknown or closed escalation, bad call)."""


class NeedsFeedback(DecideError):
    """A redo of a verdict on the note without the person's asks: the call's own mistake
    (bad usage), found once the escalations it names are read."""


def count(store: Store, partition: str, note_path: str, gate_id: str) -> int:
    row = store.conn.execute(
        "SELECT rejections FROM cycles WHERE model_partition = ? AND note_path = ? AND gate_id = ?",
        (partition, note_path, gate_id),
    ).fetchone()
    return row[0] if row else 0


def any_past_three(store: Store, partition: str, note_path: str) -> bool:
    """Whether a pair of the note has reached three rejections in the partition."""
    row = store.conn.execute(
        "SELECT 1 FROM cycles WHERE model_partition = ? AND note_path = ? AND rejections >= ? "
        "LIMIT 1",
        (partition, note_path, ESCALATE_AT),
    ).fetchone()
    return row is not None


def reset(store: Store, partition: str, note_path: str, gate_id: str) -> None:
    store.conn.execute(
        "INSERT INTO cycles VALUES (?, ?, ?, 0, ?) ON CONFLICT (model_partition, note_path, gate_id) "
        "DO UPDATE SET rejections = 0, updated_at = excluded.updated_at",
        (partition, note_path, gate_id, utcnow()),
    )


def reject(
    store: Store,
    partition: str,
    note_path: str,
    gate_id: str,
    kind: str,
    job_id: int | None,
    why: str,
) -> int:
    """One more rejection (inside the caller's transaction); returns the new count."""
    n = store.conn.execute(
        "INSERT INTO cycles VALUES (?, ?, ?, 1, ?) ON CONFLICT (model_partition, note_path, gate_id) "
        "DO UPDATE SET rejections = rejections + 1, updated_at = excluded.updated_at RETURNING rejections",
        (partition, note_path, gate_id, utcnow()),
    ).fetchone()[0]
    store.conn.execute(
        "INSERT INTO cycle_events (model_partition, note_path, gate_id, rejection, kind, job_id, gist, at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (partition, note_path, gate_id, n, kind, job_id, why, utcnow()),
    )
    return n


def rejections(
    store: Store, partition: str, note_path: str, gate_id: str, n: int, until: str | None = None
) -> list[sqlite3.Row]:
    """The pair's last ``n`` rejections (recorded by ``until``), oldest first, each with the
    fix it judged (``fix_id``: the fix job whose re-review it is, or which changed nothing)
    and whether that fix carried the pair (``carried``). A re-review of a fix made for the
    note's other FAILs (this one came in while it was open) judged no fix of this gate."""
    rows = store.conn.execute(
        "SELECT c.rejection, c.kind, c.job_id, c.gist, f.id AS fix_id, "
        "EXISTS (SELECT 1 FROM review_pairs fp WHERE fp.job_id = f.id "
        "AND fp.note_path = c.note_path AND fp.gate_id = c.gate_id) AS carried "
        "FROM cycle_events c LEFT JOIN review_jobs j ON j.id = c.job_id "
        "LEFT JOIN review_jobs f ON f.kind = 'fix' "
        "AND f.id = CASE WHEN j.kind = 'fix' THEN j.id ELSE j.source_job_id END "
        "WHERE c.model_partition = ?1 AND c.note_path = ?2 AND c.gate_id = ?3 "
        "AND (?4 IS NULL OR c.at <= ?4) ORDER BY c.id DESC LIMIT ?5",
        (partition, note_path, gate_id, until, n),
    ).fetchall()
    return rows[::-1]


def fixes_given(store: Store, partition: str, note_path: str, gate_id: str) -> int:
    """How many fixes carried the pair's finding and were judged since its count began:
    the cycle escalates a pair after the fixer was given it twice (CONTRACT §7)."""
    n = count(store, partition, note_path, gate_id)
    return sum(r["carried"] for r in rejections(store, partition, note_path, gate_id, n))


def record_decisions(store: Store, job, results: list[dict]) -> None:
    """Inside finalize's transaction: FAIL counts a rejection, PASS and WARN reset the count.
    Audit jobs judge a PASS, not the note's history, and leave counts alone."""
    if job["kind"] != "review":
        return
    for r in results:
        if not r.get("accepted", True):
            continue  # a person decided the pair since the job read it: theirs stands
        if r["decision"] == "FAIL":
            reject(
                store,
                job["model_partition"],
                r["note_path"],
                r["gate_id"],
                "review-fail",
                job["id"],
                gist(r.get("rationale")),
            )
        elif r["decision"] in ("PASS", "WARN"):
            reset(store, job["model_partition"], r["note_path"], r["gate_id"])
            _supersede(store, job, r)


def record_ack(store: Store, partition: str, acked: list[Acked]) -> None:
    """Inside ack's transaction: a PASS or WARN carried forward is the pair's verdict now,
    and resets its count as it does accepted from a review (one kept out because the
    person acked after its job read the note reset nothing then). A FAIL carried forward
    is the same rejection, counted once already; and an ack is no decision of the
    person's on the finding (CONTRACT §7): a fresh count for it would let acks put off the
    escalation for good. One kept out when its job ended counted nothing: it counts now,
    as accepted from its review it would have (else the pair FAILed past its count)."""
    for a in acked:
        if a.decision in ("PASS", "WARN"):
            reset(store, partition, a.note_path, a.gate_id)
        elif a.kept_out:
            reject(
                store,
                partition,
                a.note_path,
                a.gate_id,
                "review-fail",
                a.job_id,
                gist(a.rationale),
            )

    def log() -> None:
        # The acceptance changed by a person's hand, as a decision does: said, or the log
        # had no word of why a pair the night would have reviewed was fresh.
        for a in acked:
            logs.get().info(
                "acceptance.acked",
                note_path=a.note_path,
                gate_id=a.gate_id,
                model_partition=partition,
                decision=a.decision,
            )

    store.after_commit(log)


def _supersede(store: Store, job, r: dict) -> None:  # noqa: ANN001 - a review_jobs row
    """A PASS or WARN from a job that read the note after the pair was escalated (made
    by hand: sweeps hold the pair) answers the escalation, about the text the person
    mended or a reviewer that failed: left open, the person was asked about it still,
    and sweeps held the pair. Closed as ``superseded`` by that job. Not an auditor's
    refutation of a PASS by a PASS of the same texts: that is the verdict the auditor
    disputes, said again, and closed by it the finding went unseen."""
    now = utcnow()
    ids = [
        i
        for (i,) in store.conn.execute(
            "UPDATE escalations SET decision = 'superseded', decided_at = ?, closed_by_job = ? "
            "WHERE model_partition = ? AND note_path = ? AND gate_id = ? AND decision IS NULL "
            "AND raised_at < ? AND NOT EXISTS (SELECT 1 FROM review_jobs a "
            "JOIN review_pairs ap ON ap.job_id = a.id JOIN review_pairs np ON np.job_id = ? "
            "AND np.note_path = ap.note_path AND np.gate_id = ap.gate_id "
            "JOIN snapshots an ON an.id = ap.note_snapshot_id "
            "JOIN snapshots nn ON nn.id = np.note_snapshot_id "
            "JOIN snapshots ag ON ag.id = ap.gate_snapshot_id "
            "JOIN snapshots ng ON ng.id = np.gate_snapshot_id "
            "WHERE a.id = escalations.job_id AND a.kind = 'audit' "
            "AND ap.note_path = escalations.note_path AND ap.gate_id = escalations.gate_id "
            "AND an.sha256 = nn.sha256 AND ag.sha256 = ng.sha256) RETURNING id",
            (
                now,
                job["id"],
                job["model_partition"],
                r["note_path"],
                r["gate_id"],
                texts_taken_at(store, job),
                job["id"],
            ),
        ).fetchall()
    ]
    for esc_id in ids:
        store.conn.execute(
            "INSERT OR REPLACE INTO escalation_reports_due VALUES (?, ?, ?)",
            (esc_id, now, NOT_TRIED),
        )
        store.after_commit(
            lambda esc_id=esc_id: logs.get().info(
                "escalation.superseded",
                escalation_id=esc_id,
                job_id=job["id"],
                note_path=r["note_path"],
                gate_id=r["gate_id"],
                decision=r["decision"],
            )
        )
    if ids:
        state_dir = store.path.parent
        store.after_commit(lambda: write_due_reports(store, state_dir, ids, late=False))


# --- escalations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Escalation:
    id: int
    note_path: str
    gate_id: str
    model_partition: str
    reason: str
    cycles: int
    report_path: str
    decision: str | None = None
    # What its report recommends: reject after a verdict, else an agent failed (followup).
    call: str = "reject"
    # The job whose outcome raised it: where its attempts and log lines are (none before
    # schema 18).
    job_id: int | None = None
    # The profiles its pair was reviewed and fixed by: who an agent's failure names.
    reviewer: str | None = None
    fixer: str | None = None

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "note_path": self.note_path,
            "gate_id": self.gate_id,
            "model_partition": self.model_partition,
            "reason": self.reason,
            "cycles": self.cycles,
            "report_path": self.report_path,
            "job_id": self.job_id,
        }


def is_open(store: Store, partition: str, note_path: str, gate_id: str) -> bool:
    return (
        store.conn.execute(
            "SELECT 1 FROM escalations WHERE model_partition = ? AND note_path = ? AND gate_id = ? "
            "AND decision IS NULL",
            (partition, note_path, gate_id),
        ).fetchone()
        is not None
    )


def escalate(
    store: Store,
    state_dir: Path,
    root: Path,
    *,
    partition: str,
    note_path: str,
    gate_id: str,
    reason: str,
    reviewer: str | None,
    fixer: str | None,
    material: list[str],
    recommend: str,
    call: str = "reject",
    job_id: int | None = None,
) -> int | None:
    """Raise an escalation (one open escalation per pair) and write its report. ``call``
    is what the report recommends: ``reject`` after rejections, ``redo`` when an agent
    failed every attempt (that says nothing about the note). ``job_id``: the job whose
    outcome raised it (`reviewq job N` names it)."""
    if is_open(store, partition, note_path, gate_id):
        return None
    n = count(store, partition, note_path, gate_id)
    with store.write():
        esc_id = store.conn.execute(
            "INSERT INTO escalations (model_partition, note_path, gate_id, reason, cycles, reviewer, fixer, "
            "report_path, raised_at, material, recommend, call, job_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, '', ?, ?, ?, ?, ?) RETURNING id",
            (
                partition,
                note_path,
                gate_id,
                reason,
                n,
                reviewer,
                fixer,
                utcnow(),
                json.dumps(material),
                recommend,
                call,
                job_id,
            ),
        ).fetchone()[0]
        rel = f"escalations/escalation-{esc_id}.md"
        store.conn.execute("UPDATE escalations SET report_path = ? WHERE id = ?", (rel, esc_id))
        # The report is written once this commits (a full disk costs the file, not the
        # escalation), and again at the control process's tick if that fails.
        store.conn.execute(
            "INSERT INTO escalation_reports_due VALUES (?, ?, ?)",
            (esc_id, utcnow(), NOT_TRIED),
        )
    store.after_commit(lambda: write_due_reports(store, state_dir, [esc_id], late=False))
    # Once it commits: said inside a transaction rolled back (the control's batch of
    # outcomes), it named an escalation that was never kept, whose id the next one takes.
    store.after_commit(
        functools.partial(
            logs.get().warning,
            "escalation.raised",
            # Its own: said after a batch's commit, it took the ids bound for the batch's
            # first message, another job's (`logs --job N` missed what job N raised).
            job_id=job_id,
            escalation_id=esc_id,
            note_path=note_path,
            gate_id=gate_id,
            model_partition=partition,
            reason=reason,
            cycles=n,
            # Relative to ROOT, as the line's note_path and every JSON output give a path
            # (CONTRACT §10): it was the only absolute path a person read in the log.
            report_path=display_path(root, state_dir / rel),
        )
    )
    return esc_id


def mark_reports_due(store: Store, decided_too: bool = False) -> int:
    """Mark open escalations' reports (with ``decided_too``, every one's) to be written
    again (deleted or damaged by hand: they render state.db); the number marked."""
    which = "" if decided_too else " WHERE decision IS NULL"
    with store.write():
        return store.conn.execute(
            f"INSERT OR REPLACE INTO escalation_reports_due SELECT id, ?, ? FROM escalations{which}",
            (utcnow(), NOT_TRIED),
        ).rowcount


def missing_reports(store: Store, state_dir: Path) -> int:
    """Open escalations whose report file is not there (and not waiting to be written):
    a person reads it to decide. A decided one's may be deleted, as OPERATIONS says."""
    return sum(
        not (state_dir / rel).is_file()
        for (rel,) in store.conn.execute(
            "SELECT report_path FROM escalations WHERE report_path IS NOT NULL "
            "AND decision IS NULL "
            "AND id NOT IN (SELECT escalation_id FROM escalation_reports_due)"
        )
    )


def write_due_reports(
    store: Store, state_dir: Path, ids: list[int] | None = None, *, late: bool = True
) -> int:
    """Write the reports of escalations still due (``ids``, else all); the number written."""
    due = dict(
        store.conn.execute(
            "SELECT escalation_id, error FROM escalation_reports_due ORDER BY escalation_id"
        ).fetchall()
    )
    if ids is not None:
        due = {i: due[i] for i in ids if i in due}

    def write(i: int) -> None:
        path = state_dir / _report_path(store, i)
        make_folder(path.parent, "its escalation reports")
        atomic_write(path, report(store, i))

    written, failed = write_each(
        due,
        write,
        what="escalation.report",
        key="escalation_id",
        late=late,
    )
    settle_due(store, "escalation_reports_due", "escalation_id", written, failed)
    return len(written)


def _closed_by(store: Store, e) -> str:  # noqa: ANN001 - an escalations row
    """What closed a superseded escalation, as its verdict: "passed" read wrong of a WARN."""
    row = store.conn.execute(
        "SELECT decision FROM review_pairs WHERE job_id = ? AND note_path = ? AND gate_id = ?",
        (e["closed_by_job"], e["note_path"], e["gate_id"]),
    ).fetchone()
    return f"review job {e['closed_by_job']} gave the pair {row[0] if row else 'PASS or WARN'}"


def _report_path(store: Store, esc_id: int) -> str:
    return store.conn.execute(
        "SELECT report_path FROM escalations WHERE id = ?", (esc_id,)
    ).fetchone()[0]


def report(store: Store, esc_id: int) -> str:
    """The gate-review report (CONTRACT §7): three lines in, a person can vote."""
    e = store.conn.execute("SELECT * FROM escalations WHERE id = ?", (esc_id,)).fetchone()
    # The rejections up to the escalation: written again later, the report says the same.
    events = rejections(
        store, e["model_partition"], e["note_path"], e["gate_id"], e["cycles"], e["raised_at"]
    )
    recommend, material = quoted(store, e)
    cycles = [
        f"- Cycle {i}: FAIL — {ev['gist']}" + _judged(ev) for i, ev in enumerate(events, 1)
    ] or ["- (no rejection cycles: " + e["reason"] + ")"]
    if together := _raised_with(store, e):
        cycles.append(together)
    # The cycles' fixes carried the person's asks: read without it, a second redo with
    # the same asks looked worth a try (`escalations` said it, the file did not).
    redo = redone_before(store, e["model_partition"], e["note_path"], e["gate_id"], esc_id)
    if redo is not None:
        said = after_a_redo(redo)
        cycles.append(said[0].upper() + said[1:])
    lines = [
        f"Gate review: {e['note_path']} — {e['gate_id']}",
        f"Recommend {e['call']}: {recommend.rstrip('.')}.",
        f"Cycles ({e['cycles']} consecutive rejection(s) in partition {e['model_partition']}):",
        *cycles,
        "",
        "Material:",
        *(f"- {m}" for m in material),
        "",
        f"Assessment: {e['reason']}; reviewer {e['reviewer'] or '-'}, "
        + (
            f"fixer {e['fixer']}."
            if e["fixer"]
            # As FollowUp.redo picks it: the fixer a redo gets when none ran.
            else f"no fixer (a redo is fixed by {e['reviewer'] or 'offline'} unless --fixer "
            "names another)."
        ),
        # Decided, the calls would be refused ("decided already"): the file says what was.
        f"Closed at {e['decided_at'][:19]}Z: {_closed_by(store, e)} since it was raised; "
        "nothing is left to decide."
        if e["decision"] == "superseded"
        else f"Decided: {e['decision']} at {e['decided_at'][:19]}Z"
        + (f", with the asks: {e['feedback']}" if e["feedback"] else "")
        # The asks are a person's sentence, most often with its own full stop.
        + ("" if (e["feedback"] or "").rstrip().endswith((".", "!", "?")) else ".")
        if e["decision"]
        else f"{CALLS_SAID}{esc_id} approve` accepts the note as it is for "
        f"{e['gate_id']} (recorded as a human review); "
        + _redo_does(esc_id, e["call"])
        + f"`reviewq decide {esc_id} reject` stops reviewing this pair until the note or the "
        f"gate changes {REJECT_ON_A_PASS}.",
        "",
    ]
    return "\n".join(lines)


def _raised_with(store: Store, e: sqlite3.Row) -> str | None:
    """The report's line naming the note's other gates escalated after the verdicts of the
    same job (CONTRACT §7: a note's pairs go to a person together, on its last text), or
    None. Of a run without --fix it says only that: "once none of its FAILs was left to
    fix" told of fixes waited for that were never on (C109)."""
    if e["job_id"] is None or e["call"] != "reject" or e["cycles"] < ESCALATE_AT:
        return None
    together = [
        g
        for (g,) in store.conn.execute(
            "SELECT gate_id FROM escalations WHERE job_id = ? AND note_path = ? "
            "AND model_partition = ? AND call = 'reject' AND cycles >= ? AND id != ? "
            "ORDER BY gate_id",
            (e["job_id"], e["note_path"], e["model_partition"], ESCALATE_AT, e["id"]),
        )
    ]
    if not together:
        return None
    job = store.conn.execute(
        "SELECT sweep_run_id FROM review_jobs WHERE id = ?", (e["job_id"],)
    ).fetchone()
    when = (
        "once none of its FAILs was left to fix"
        if job is not None and run_options(store, job).get("fix")
        else "by the same review"
    )
    return f"Raised with {', '.join(together)} of this note, {when}: each is of the same text."


def _judged(ev: sqlite3.Row) -> str:
    """A cycle line's job, and the fix a re-review judged: one made for the note's other
    FAILs read as a try of the fixer's at this gate."""
    if not ev["job_id"]:
        return ""
    if ev["fix_id"] is None or ev["fix_id"] == ev["job_id"]:
        return f" (job {ev['job_id']})"
    which = "which carried this gate" if ev["carried"] else "which did not carry this gate"
    return f" (job {ev['job_id']}, after fix {ev['fix_id']}, {which})"


def _redo_does(esc_id: int, call: str) -> str:
    """What a redo does, as decide does it, judged when it is run (the note may change
    meanwhile). It said "queues a fix" of every escalation: with no FAIL about the note's
    text on record (the reviewer failed every attempt, the note was edited since, an
    auditor refuted a PASS) none is queued."""
    asks = needs_asks(call)
    feedback = ' --feedback "..."' if asks else ""
    return (
        f"`reviewq decide {esc_id} redo{feedback}` queues a fix "
        f"{'with your concrete asks' if asks else '(with your asks, given as --feedback)'} "
        f"{REDO_IF}; "
    )


def open_escalations(store: Store) -> list[Escalation]:
    return [
        Escalation(
            r["id"],
            r["note_path"],
            r["gate_id"],
            r["model_partition"],
            r["reason"],
            r["cycles"],
            r["report_path"],
            call=r["call"],
            job_id=r["job_id"],
            reviewer=r["reviewer"],
            fixer=r["fixer"],
        )
        for r in store.conn.execute("SELECT * FROM escalations WHERE decision IS NULL ORDER BY id")
    ]


def held_pairs(
    store: Store, partition: str, current_sha: dict[tuple[str, str], tuple[str | None, str | None]]
) -> set[tuple[str, str]]:
    """Pairs sweeps must not enqueue: open escalations, and rejected ones whose note and
    gate are unchanged since the decision. ``current_sha`` maps (note, gate) to the
    current (note sha, gate sha) for the rejected pairs asked about."""
    held = {
        (r[0], r[1])
        for r in store.conn.execute(
            "SELECT note_path, gate_id FROM escalations WHERE model_partition = ? AND decision IS NULL",
            (partition,),
        )
    }
    for r in store.conn.execute(
        "SELECT note_path, gate_id, note_sha256, gate_sha256 FROM escalations WHERE model_partition = ? "
        "AND decision = 'reject' AND id IN (SELECT MAX(id) FROM escalations GROUP BY model_partition, note_path, gate_id)",
        (partition,),
    ):
        if current_sha.get((r[0], r[1])) == (r[2], r[3]):
            held.add((r[0], r[1]))
    return held


def held(ws: Workspace, partition: str) -> set[tuple[str, str]]:
    """What a sweep in ``partition`` must skip now: :func:`held_pairs` with the current
    note and gate hashes of the rejected pairs."""
    current: dict[tuple[str, str], tuple[str | None, str | None]] = {}
    cat = ws.catalog()
    for note_path, gate_id in rejected_pairs(ws.store, partition):
        try:
            note_sha = sha256_bytes(ws.kb.read_bytes(ws.kb.check_rel(note_path)))
        except OSError:
            note_sha = None
        gate = gate_of(ws.store, ws.kb, cat, note_path, gate_id)
        current[(note_path, gate_id)] = (note_sha, gate.sha256 if gate else None)
    return held_pairs(ws.store, partition, current)


def gate_of(store: Store, kb, catalog, note_path: str, gate_id: str):  # noqa: ANN001, ANN201
    """The gate of an escalated pair as it is now (a Gate or None): the catalog's, or a
    type spec the note names by a path, found where the pair's last review recorded it
    (an escalation row keeps no gate path)."""
    gate = catalog.get(gate_id)
    if gate is not None:
        return gate
    row = store.conn.execute(
        "SELECT gate_path FROM review_pairs WHERE note_path = ? AND gate_id = ? "
        "ORDER BY id DESC LIMIT 1",
        (note_path, gate_id),
    ).fetchone()
    return catalog.recorded(kb, gate_id, row[0] if row else None)


def rejected_pairs(store: Store, partition: str) -> list[tuple[str, str]]:
    return [
        (r[0], r[1])
        for r in store.conn.execute(
            "SELECT DISTINCT note_path, gate_id FROM escalations WHERE model_partition = ? AND decision = 'reject'",
            (partition,),
        )
    ]


def by_note(items: list[Escalation]) -> list[tuple[str, list[Escalation]]]:
    """Open escalations grouped by note (a note's escalations are one decision), in the
    order the report lists them (:func:`orchestrator.state.status.by_note`)."""
    return notes_in_order(items, lambda e: e.note_path, lambda e: e.call)


def resolve(
    store: Store,
    ids: list[int],
    note: str | None,
    root: Path | None = None,
    gate: str | None = None,
) -> list[int]:
    """The escalations a decision settles: these ids, and every open one of ``note`` (as
    the report prints it, relative to the KB root, or a path to the file from here) and
    of ``gate`` (both: the note's of that gate)."""
    if not ids and not note and not gate:
        raise DecideError("name escalation ids, --note PATH or --gate GATE_ID")
    out = list(dict.fromkeys(ids))
    if note or gate:
        keys = _note_keys(note, root) if note else None
        rows = open_ids(store, keys, gate)
        if not rows:
            raise DecideError(none_open(store, gate, note, keys))
        out.extend(r for r in rows if r not in out)
    return out


def open_ids(store: Store, notes: list[str] | None, gate: str | None) -> list[int]:
    """The open escalations of any of ``notes`` (None: any note) and of ``gate`` (None:
    any gate), by id."""
    where = ["decision IS NULL"]
    args: list[str] = []
    if notes is not None:
        where.append(f"note_path IN ({', '.join('?' * len(notes))})")
        args += notes
    if gate is not None:
        where.append("gate_id = ?")
        args.append(gate)
    return [
        r[0]
        for r in store.conn.execute(
            f"SELECT id FROM escalations WHERE {' AND '.join(where)} ORDER BY id", args
        )
    ]


def _note_keys(note: str, root: Path | None) -> list[str]:
    """``--note``'s path as the report prints it, and as a path to the file from here."""
    keys = [note.removeprefix("./")]
    if root is not None:
        # Outside the root, or a symlink loop (pathlib's RuntimeError): no match.
        with contextlib.suppress(ValueError, OSError, RuntimeError):
            keys.append(Path(note).resolve().relative_to(root.resolve()).as_posix())
    return keys


def none_open(
    store: Store, gate: str | None, note: str | None = None, keys: list[str] | None = None
) -> str:
    """Why ``--note``/``--gate`` named nothing, with the gates that have open escalations
    (of the note's ``keys``, with a note) when a gate was named (a typo, a lens's name, or
    decided already)."""
    if gate is None:
        return f"--note {note}: no open escalation for this note"
    # The note's own: a gate open on another note, offered here, was refused again.
    of_note = f"AND note_path IN ({', '.join('?' * len(keys))}) " if keys else ""
    opened = ", ".join(
        f"{g} {n}"
        for g, n in store.conn.execute(
            f"SELECT gate_id, count(*) FROM escalations WHERE decision IS NULL {of_note}"
            "GROUP BY gate_id ORDER BY gate_id",
            keys or (),
        )
    )
    named = f"--note {note} --gate {gate}" if note else f"--gate {gate}"
    return (
        f"{named}: no open escalation of this gate{' for this note' if note else ''} "
        f"(open: {opened or 'none'})"
    )


def escalation_row(store: Store, esc_id: int):
    return store.conn.execute("SELECT * FROM escalations WHERE id = ?", (esc_id,)).fetchone()


def decide_many(
    store: Store,
    state_dir: Path,
    kb,  # noqa: ANN001 - a KB
    catalog,  # noqa: ANN001 - a Catalog
    esc_ids: list[int],
    decision: str,
    feedback: str | None,
) -> list[dict]:
    """Record one person's call on several escalations in one transaction: every one is
    checked first, so one that cannot be decided leaves all of them open."""
    found = []
    # Where the KB's history stands as the notes are read: a person's approve or reject
    # is a review of the text as it is now (recorded-commit, CONTRACT §10).
    commit = head_commit(kb.root)
    for esc_id in esc_ids:
        e = escalation_row(store, esc_id)
        note = gate = None
        if e is not None:
            note = _current_note(kb, e["note_path"])
            gate = gate_of(store, kb, catalog, e["note_path"], e["gate_id"])
        found.append((esc_id, e, note, gate))
    # The call that closes every one of them only a reject can: naming the first alone,
    # the person who ran it found the note's others still open, and was refused again.
    stuck = [
        esc_id
        for esc_id, e, note, gate in found
        if e is not None and e["decision"] is None and _undecidable(note, gate) is not None
    ]
    checked = [
        (_check(store, e, esc_id, decision, feedback, note, gate, stuck), note, gate)
        for esc_id, e, note, gate in found
    ]
    decided = []
    with store.write():
        for e, note, gate in checked:
            recorded = _record(store, state_dir, e, decision, feedback, note, gate, commit)
            decided.append({**dict(e), "recorded": recorded})

        def log() -> None:
            for e, _, _ in checked:
                _log_decided(e, decision)

        # Logged once the caller's transaction (a redo's fix jobs join it) commits.
        store.after_commit(log)
    return decided


@dataclass(frozen=True)
class _NoteNow:
    """An escalated note as it is now: its text (None: it does not parse), the hash of
    its bytes (None: it is gone or cannot be read), and why it cannot be decided on."""

    text: str | None
    sha256: str | None
    problem: str | None
    note: Note | None = None


def _current_note(kb, note_path: str) -> _NoteNow:
    try:
        # One read for the text and its hash: an edit between two reads would record an
        # approval of text nobody saw under the hash of the text they did.
        note = kb.read_note(kb.check_rel(note_path))
    except FileNotFoundError:
        return _NoteNow(None, None, "is gone (deleted or renamed)")
    except NoteParseError as exc:
        try:  # a reject still holds the pair until these bytes change
            sha = sha256_bytes(kb.read_bytes(kb.check_rel(note_path)))
        except (OSError, KBError):
            sha = None
        return _NoteNow(None, sha, f"cannot be read ({exc})")
    except (OSError, KBError) as exc:
        return _NoteNow(None, None, f"cannot be read ({getattr(exc, 'strerror', None) or exc})")
    return _NoteNow(note.text, note.sha256, None, note)


def only_reject(store: Store, kb, catalog, note_path: str, gate_id: str) -> str | None:
    """Why an open escalation can now only be rejected (its note is gone or unreadable,
    or its gate left the catalog), or None: what ``decide`` would refuse, said before a
    person tries."""
    gate = gate_of(store, kb, catalog, note_path, gate_id)
    return _undecidable(_current_note(kb, note_path), gate)


def only_reject_check(ws: Workspace) -> Callable[[str, str], str | None]:
    """Which escalations can now only be rejected, judged on the KB as it is; none when
    the KB or its gates cannot be read (the report still shows the night)."""
    try:
        kb, catalog = ws.kb, ws.catalog()
    except (KBError, OSError):
        return lambda note, gate: None
    store = ws.read_store()
    return lambda note, gate: only_reject(store, kb, catalog, note, gate)


def changed_since_fail(ws: Workspace, store: Store, escs: list[dict]) -> dict[int, str]:
    """Which escalations after a verdict have their pair stale now, and why as ``select``
    says it ("prose/x note-changed"): the note (or gate) changed since the FAIL, by a
    person mending it while it waited. A reject holds the pair as it is at the decision
    (CONTRACT §7): their mend stays unreviewed under the FAIL of the earlier text, which
    nothing said, so a person who mended the note and rejected as recommended froze it."""
    try:
        catalog = ws.catalog()
    except (KBError, OSError):
        return {}  # the KB or its gates unreadable: the list is still shown
    by_partition: dict[str, list[dict]] = {}
    for e in escs:
        # An agent's failure judged no text to have changed since; a gate gone from the
        # catalog is a selector select refuses, for every pair asked with it.
        if e["call"] == "reject" and catalog.get(e["gate_id"]) is not None:
            by_partition.setdefault(e["model_partition"], []).append(e)
    out: dict[int, str] = {}
    for partition, mine in by_partition.items():
        try:
            targets = select(
                ws.kb,
                catalog,
                store,
                selectors=sorted({e["gate_id"] for e in mine}),
                note_paths=sorted({e["note_path"] for e in mine}),
                model=partition,
                diffs=False,
            ).targets
        except (SelectionError, SelectError, KBError, OSError):
            continue  # a note or gate gone: `escalations` says only reject closes it
        stale = {(t.note_path, t.gate_id): t.reason for t in targets}
        for e in mine:
            if (why := stale.get((e["note_path"], e["gate_id"]))) is not None:
                out[e["id"]] = f"{e['gate_id']} {why}"
    return out


def _undecidable(note: _NoteNow, gate) -> str | None:  # noqa: ANN001 - a Gate or None
    """What keeps approve and redo from this note and gate, or None."""
    if note.problem is not None:
        return f"the note {note.problem}"
    if gate is None:
        return "the gate is not in the catalog"
    # Retyped since (by a fix or a person): approved, the pair's PASS would stand for a
    # gate the note is no longer asked, and a redo would fix it against that gate.
    return not_asked(gate, note.note) if note.note is not None else None


def _check(
    store: Store,
    e,
    esc_id: int,
    decision: str,
    feedback: str | None,
    note: _NoteNow,
    gate,
    stuck: list[int],
):
    if decision not in DECISIONS:
        raise DecideError(f"decision {decision!r}: choose approve, redo or reject")
    if e is None:
        raise DecideError(f"no escalation {esc_id}")
    if e["decision"] == "superseded":
        raise DecideError(
            f"escalation {esc_id} was closed at {e['decided_at']}: {_closed_by(store, e)} "
            "since it was raised; nothing is left to decide"
        )
    if e["decision"] is not None:
        raise DecideError(
            f"escalation {esc_id} was decided already ({e['decision']} at {e['decided_at']})"
        )
    if decision == "redo" and not (feedback and feedback.strip()) and needs_asks(e["call"]):
        raise NeedsFeedback(
            f"redo needs --feedback with the concrete asks for the fixer: escalation {esc_id} "
            "is a verdict on the note (a redo after an agent's failure needs none)"
        )
    # A reject needs neither text: it holds the pair until the note or the gate is back
    # or changed. Refusing it would leave an escalation of a deleted note open for good.
    if decision == "reject":
        return e
    why = _undecidable(note, gate)
    if why is not None:
        subject = e["note_path"] if note.problem is not None else e["gate_id"]
        them = "them as they are" if len(stuck) > 1 else "the escalation as it is"
        raise DecideError(
            f"{subject}: {why}; nothing decided "
            f"(to close {them}: reviewq decide {' '.join(map(str, stuck))} reject)"
        )
    return e


def _record(  # noqa: ANN001 - e: an escalations row; gate: a Gate or None
    store: Store,
    state_dir: Path,
    e,
    decision: str,
    feedback: str | None,
    note: _NoteNow,
    gate,
    commit: str | None,
) -> str | None:
    """Record the decision; the human review it wrote (PASS, FAIL), if any."""
    esc_id = e["id"]
    with store.write():
        now = utcnow()
        store.conn.execute(
            "UPDATE escalations SET decision = ?, feedback = ?, decided_at = ?, note_sha256 = ?, gate_sha256 = ? "
            "WHERE id = ?",
            (decision, feedback, now, note.sha256, gate.sha256 if gate else None, esc_id),
        )
        reset(store, e["model_partition"], e["note_path"], e["gate_id"])
        store.conn.execute(
            "INSERT OR REPLACE INTO escalation_reports_due VALUES (?, ?, ?)",
            (esc_id, now, NOT_TRIED),
        )
        store.after_commit(lambda: write_due_reports(store, state_dir, [esc_id], late=False))
        if decision == "approve":
            said = f"Approved by a person (escalation {esc_id})."
            _human_review(store, e, note, gate, "PASS", said, feedback, now, commit)
            return "PASS"
        if decision == "reject" and _refuted_pass_stands(store, e, note, gate):
            # An audit's refutation, upheld: the reviewer's PASS stood accepted, so the
            # pair was fresh and exported as passing, and the person's reject showed
            # nowhere. It is now the person's FAIL, held until the note or gate changes.
            said = f"Rejected by a person (escalation {esc_id}): {e['reason']}."
            _human_review(store, e, note, gate, "FAIL", said, feedback, now, commit)
            return "FAIL"
    return None


def _refuted_pass_stands(store: Store, e, note: _NoteNow, gate) -> bool:  # noqa: ANN001
    """An escalation that recommends reject over a PASS still accepted for the note as it
    is: an auditor's refutation (the others recommend reject over FAILs, or redo over an
    agent's failure, which judged nothing). Not a PASS of an earlier text: nobody
    reviewed this one."""
    if e["call"] != "reject" or gate is None or note.problem is not None or note.text is None:
        return False
    accepted = store.acceptance(e["model_partition"], e["note_path"], e["gate_id"])
    if accepted is None or accepted.decision not in ("PASS", "WARN"):
        return False
    sha = store.conn.execute(
        "SELECT sha256 FROM snapshots WHERE id = ?", (accepted.note_snapshot_id,)
    ).fetchone()
    return sha is not None and sha[0] == note.sha256


def _human_review(  # noqa: ANN001 - e: an escalations row; note: _NoteNow; gate: a Gate
    store: Store,
    e,
    note,
    gate,
    decision: str,
    said: str,
    feedback: str | None,
    now: str,
    commit: str | None,
) -> None:
    """A person's decision on the pair, recorded as a review of the note as it is and
    accepted (``source`` human): a job of grouping ``human`` with one pair."""
    job_id = store.conn.execute(
        "INSERT INTO review_jobs (kind, status, model_partition, grouping, lens, reviewer, job_dir, runner, "
        "created_at, updated_at, finished_at, result) VALUES ('review', 'completed', ?, 'human', ?, NULL, '', "
        "'human', ?, ?, ?, ?) RETURNING id",
        (
            e["model_partition"],
            gate.lens,
            now,
            now,
            now,
            "approved" if decision == "PASS" else "rejected",
        ),
    ).fetchone()[0]
    note_snap = store.snapshot(e["note_path"], note.text, note.sha256)
    gate_snap = store.snapshot(gate.path, gate.text, gate.sha256)
    # The person's words quoted: as they were, a line of theirs such as "## Result: FAIL"
    # stood above the real result in the exported review.
    rationale = said
    if feedback and feedback.strip():
        rationale += "\n\n" + "\n".join(f"> {line}".rstrip() for line in feedback.splitlines())
    pair_id = store.conn.execute(
        "INSERT INTO review_pairs (job_id, note_path, gate_id, gate_path, lens, note_snapshot_id, "
        "gate_snapshot_id, decision, rationale, decided_at, note_commit) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (job_id, e["note_path"], gate.gate_id, gate.path, gate.lens, note_snap, gate_snap,
         decision, rationale, now, commit),
    ).fetchone()[0]  # fmt: skip
    store.upsert_acceptance(
        model_partition=e["model_partition"],
        note_path=e["note_path"],
        gate_id=gate.gate_id,
        review_pair_id=pair_id,
        note_snapshot_id=note_snap,
        gate_snapshot_id=gate_snap,
        decision=decision,
        source="human",
        at=now,
        note_commit=commit,
    )


def _log_decided(e, decision: str) -> None:
    logs.get().info(
        "escalation.decided",
        escalation_id=e["id"],
        decision=decision,
        note_path=e["note_path"],
        gate_id=e["gate_id"],
        model_partition=e["model_partition"],
    )


def run_options(store: Store, job) -> dict:
    """The sweep options a job was enqueued with (fix, sequential, fixer, auditor, audit)."""
    if job["sweep_run_id"] is None:
        return {}
    row = store.conn.execute(
        "SELECT options FROM sweep_runs WHERE id = ?", (job["sweep_run_id"],)
    ).fetchone()
    return json.loads(row[0]) if row else {}


def reports_due(store: Store) -> tuple[int, str | None]:
    """How many escalation reports wait to be written, and one error that kept them back
    (for ``reviewq doctor``)."""
    count, error = store.conn.execute(
        "SELECT count(*), coalesce(min(CASE WHEN error != ?1 THEN error END), min(error)) "
        "FROM escalation_reports_due",
        (NOT_TRIED,),
    ).fetchone()
    return count, error


def redone_before(
    store: Store, partition: str, note_path: str, gate_id: str, esc_id: int
) -> sqlite3.Row | None:
    """The escalation of the pair a person last decided before ``esc_id``, if that
    decision was a redo: ``esc_id`` is then the pair failing again after their asks,
    which `escalations` and its report read as a new one."""
    row = store.conn.execute(
        "SELECT id, decision, decided_at, feedback FROM escalations WHERE model_partition = ? "
        "AND note_path = ? AND gate_id = ? AND id < ? AND decision IS NOT NULL "
        "ORDER BY id DESC LIMIT 1",
        (partition, note_path, gate_id, esc_id),
    ).fetchone()
    return row if row is not None and row["decision"] == "redo" else None


def after_a_redo(redo: sqlite3.Row) -> str:
    """What an escalation after a redo says of it (:func:`redone_before`'s row)."""
    return (
        f"after a redo of escalation {redo['id']} at {redo['decided_at'][:16]}Z, asking: "
        f"{logs.one_line(redo['feedback'] or '')}"
    )


def escalation_lines(
    ws: Workspace,
    store: Store,
    items: list[Escalation],
    only: dict[int, str | None],
    agents: list[dict],
    gate: str | None = None,
    changed: dict[int, str] | None = None,
) -> Iterator[str]:
    """``escalations`` in words: ``items`` by note, each with its report's recommendation
    (from state.db when the file cannot be read), why it is here and the ``decide`` calls
    that answer it. ``only``: :func:`only_reject_check`'s answer by escalation id;
    ``changed``: :func:`changed_since_fail`'s;
    ``agents``: those an agent raised (``state.status.agents_failed``); ``gate``: the one
    gate ``items`` are of, when the person asked for one."""
    groups = by_note(items)
    changed = changed or {}
    if gate and not items:
        # "0 open escalation(s) of prose" alone read as nothing waiting, where every
        # escalation of the lens did.
        yield none_open(store, gate)
    for note, group in groups:
        yield f"{note}: {len(group)} escalation(s)"
        for e in group:
            path = ws.state_dir / e.report_path
            written, missing = True, ""
            try:
                # The recommendation: the report's next line heads its list of cycles,
                # which shown alone was a header with nothing under it.
                text, written = current_report(store, ws.state_dir, e.id, e.report_path)
                head = text.splitlines()[1:2]
            except OSError as exc:
                # Deleted by hand, or not a file one can read (a FIFO held this for good):
                # its recommendation is in state.db, and so is the file.
                head = report(store, e.id).splitlines()[1:2]
                missing = f" ({unread_report(exc)}: {REWRITE_REPORTS})"
            # Raised by a failed job or an audit, a pair read "0 cycle(s)" (or its earlier
            # rejections): why it is here is the reason's head ("the reviewer failed every
            # attempt").
            # A count past three says how many followed a fix that carried the gate (C100).
            of_them = e.reason.partition(", ")[2].partition(" (")[0]
            why = (
                f"{e.cycles} cycle(s)" + (f", {of_them}" if of_them else "")
                if "consecutive rejections" in e.reason
                else e.reason.partition(": ")[0]
            )
            # The job that raised it: its attempts, stderr and log lines (`logs --job`).
            job = f"; reviewq job {e.job_id}" if e.job_id is not None else ""
            yield f"  escalation {e.id}: {e.gate_id}  ({e.model_partition}, {why}{job})"
            for line in head:
                yield f"      {line}"
            if (
                redo := redone_before(store, e.model_partition, e.note_path, e.gate_id, e.id)
            ) is not None:
                yield f"      {after_a_redo(redo)}"
            if only[e.id]:
                yield f"      {only[e.id]}: only reject closes it"
            elif e.id in changed:
                yield f"      {held_by_a_reject(changed[e.id])}"
            yield (
                f"      report: {path}{missing}"
                + ("" if written else " (to be written at the control process's next tick)")
            )
        # A note's one escalation gets its call too: without it, that note alone was
        # shown with no command to answer it.
        calls = (
            decide_calls(note, [(e.id, e.model_partition) for e in group], store)
            if len(group) > 1
            else {None: str(group[0].id)}
        )
        # A note deleted since (or a gate gone) leaves reject the only call decide takes.
        answers = "reject" if any(only[e.id] for e in group) else "approve|redo|reject"
        for partition, target in calls.items():
            # One escalation (an id alone) is "it": "them at once" was said of one.
            them = "it" if " " not in target else "them at once"
            yield (
                f"  decide {them}{f' ({partition})' if partition else ''}: "
                f"reviewq decide {target} {answers}"
            )
    # Its last line, what `| tail` shows: those an agent raised counted apart, as status says.
    of = f" of {gate}" if gate else ""
    yield (
        f"{len(items)} open escalation(s){of} on {len(groups)} note(s)" + raised_by_agents(agents)
    )
    for a in agents:
        yield f"  {a['says']}"


def current_report(
    store: Store, state_dir: Path, esc_id: int, report_path: str
) -> tuple[str, bool]:
    """An escalation's report as a person should read it now, and whether its file says
    so: the file, unless the report waits to be written (the control process writes it at
    its tick): that file is older than state.db (after an upgrade whose migration changed
    a call, it still recommended what the release before had), or missing, so the report
    is made from state.db. OSError: no file and nothing due."""
    due = store.conn.execute(
        "SELECT 1 FROM escalation_reports_due WHERE escalation_id = ?", (esc_id,)
    ).fetchone()
    if due is not None:
        return report(store, esc_id), False
    # Anything but a regular file is an OSError: a FIFO there held the read for good.
    return read_file(state_dir / report_path).decode("utf-8", errors="replace"), True
