"""Operations on acceptance beyond finalize: ``ack`` (carry a review forward to the
current text) and the WARN queue (CONTRACT §10)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.kb.gates import Catalog, Gate, applies, names_invalid, not_asked
from orchestrator.kb.githead import head_commit
from orchestrator.kb.notes import KB, Note, NoteParseError
from orchestrator.state.store import Store


class AckError(ValueError):
    """Nothing was acked: a pair has no completed review, or a path is bad."""


@dataclass(frozen=True)
class Acked:
    note_path: str
    gate_id: str
    decision: str  # the verdict carried forward
    job_id: int = 0  # the review's
    rationale: str | None = None
    # Not the review accepted before the ack: kept out when its job ended (a person's
    # acceptance stood), its verdict counted nothing then.
    kept_out: bool = False


def ack(
    kb: KB,
    catalog: Catalog,
    store: Store,
    model: str,
    note_path: str,
    gate_ids: Sequence[str],
    within: Callable[[Store, str, list[Acked]], None] | None = None,
) -> list[Acked]:
    """Record the current note and gate texts as accepted, each pointing at the latest
    completed review of the pair in ``model``. All or nothing; ``within`` runs in the
    same transaction (the rejection counts, which a layer above this one owns)."""
    if not note_path.endswith(".md") or not kb.in_note_roots(note_path):
        # A gate's path, or the arguments swapped, was "no completed review" or "No such
        # file": the person looked for a review, or a file, where no note can be.
        roots = ", ".join(r or "." for r in kb.note_roots)
        raise AckError(
            f"{note_path or '.'}: not a note (a .md file under the note roots: {roots}); "
            "the note comes first: reviewq ack --model P NOTE GATE_ID..."
        )
    # Where the KB's history stands as the note is read: the text acked is this one, not
    # the review's (recorded-commit, CONTRACT §10).
    commit = head_commit(kb.root)
    try:
        note = kb.read_note(kb.check_rel(note_path))
    except OSError as exc:  # a folder, a file gone: its reason, not Python's errno
        raise AckError(f"{note_path}: {exc.strerror or exc}") from None
    except NoteParseError as exc:
        raise AckError(f"{note_path}: {exc}") from None
    plan = []
    for gate_id in dict.fromkeys(gate_ids):
        row = store.conn.execute(
            "SELECT p.id, p.decision, p.gate_path, p.job_id, p.rationale FROM review_pairs p JOIN review_jobs j ON j.id = p.job_id "
            # A review's, never an audit's: the audit accepts nothing (it shares the
            # partition when the auditor is the reviewer, as by default).
            "WHERE p.note_path = ?1 AND p.gate_id = ?2 AND j.model_partition = ?3 AND j.status = 'completed' "
            "AND j.kind = 'review' AND p.decision IN ('PASS', 'WARN', 'FAIL') "
            # A person's decision, still the accepted review, first: a later verdict kept
            # out of acceptance (its job read the note before they decided) does not undo
            # their call (CONTRACT §7), and carried forward by an ack it did.
            "ORDER BY (j.grouping = 'human' AND p.id = (SELECT review_pair_id FROM acceptance "
            "WHERE model_partition = ?3 AND note_path = ?1 AND gate_id = ?2)) DESC, "
            "p.decided_at DESC, p.id DESC LIMIT 1",
            (note.path, gate_id, model),
        ).fetchone()
        gate = catalog.recorded(kb, gate_id, row["gate_path"] if row else None)
        if gate is None:
            raise AckError(f"{gate_id}: {_gone_words(catalog, gate_id, row)}; nothing acked")
        if row is None:
            # A misspelt --model reads as a pair never reviewed: said, as select says it.
            known = store.partitions_instead(model)
            none = f" (it holds no review at all; known: {', '.join(known)})" if known else ""
            if not known and (job := _error_only(store, model, note.path, gate_id)):
                # "No completed review" sent the person to `reviewq jobs`, which lists
                # the pair's job as completed.
                none = f" (job {job} answered ERROR, which is never accepted nor carried forward)"
            raise AckError(
                f"{note.path} {gate_id}: no completed review in partition {model}{none}; "
                "nothing acked"
            )
        if (why := not_asked(gate, note)) is not None:
            # The note's type or traits changed since: carried forward, the review read as
            # current for a gate the note no longer has (in export, warn-queue, status).
            raise AckError(f"{why}; nothing acked")
        was = store.acceptance(model, note.path, gate.gate_id)
        kept_out = was is not None and was.review_pair_id != row["id"]
        plan.append((gate, row, kept_out))
    with store.write():
        note_snap = store.snapshot(note.path, note.text, note.sha256)
        for gate, row, _ in plan:
            store.upsert_acceptance(
                model_partition=model,
                note_path=note.path,
                gate_id=gate.gate_id,
                review_pair_id=row["id"],
                note_snapshot_id=note_snap,
                gate_snapshot_id=store.snapshot(gate.path, gate.text, gate.sha256),
                decision=row["decision"],
                source="ack",
                note_commit=commit,
            )
        acked = [
            Acked(note.path, g.gate_id, r["decision"], r["job_id"], r["rationale"], kept)
            for g, r, kept in plan
        ]
        if within is not None:
            within(store, model, acked)
    return acked


def _error_only(store: Store, model: str, note_path: str, gate_id: str) -> int | None:
    """The latest completed review job in ``model`` that answered the pair ERROR."""
    row = store.conn.execute(
        "SELECT p.job_id FROM review_pairs p JOIN review_jobs j ON j.id = p.job_id "
        "WHERE p.note_path = ? AND p.gate_id = ? AND j.model_partition = ? "
        "AND j.status = 'completed' AND j.kind = 'review' AND p.decision = 'ERROR' "
        "ORDER BY p.id DESC LIMIT 1",
        (note_path, gate_id, model),
    ).fetchone()
    return row[0] if row else None


def _gone_words(catalog: Catalog, gate_id: str, row) -> str:  # noqa: ANN001 - a pair row
    """Why a gate id has no gate now: its file invalid (a typo while editing it; "no such
    gate" sent the person looking for a file that is there), else none by that id."""
    paths = {row["gate_path"]} if row is not None else set()
    for p in catalog.problems:
        if p.path in paths or ("/" in gate_id and names_invalid(gate_id, p.path)):
            return f"its gate file is invalid ({p.path}: {p.reason})"
    if gate_id in catalog.lenses or gate_id == "type":
        # A bundle, as `select` and `enqueue` take it: "no such gate" of a lens the
        # person saw listed by `reviewq gates`.
        return f"a bundle, not a gate id: ack names each gate ({gate_id}/NAME, as `reviewq gates` lists them)"
    return "no such gate"


@dataclass(frozen=True)
class WarnItem:
    note_path: str
    gate_id: str
    model_partition: str
    review_job_id: int
    accepted_at: str
    rationale: str

    def to_json(self) -> dict:
        return self.__dict__.copy()


def pair_now(
    kb: KB,
    catalog: Catalog,
    notes: Mapping[str, Note | None],
    note_path: str,
    gate_id: str,
    gate_path: str | None,
) -> Gate | None:
    """The gate of a recorded pair when the pair is one of the KB now: its note there
    (``notes``: the KB's notes by path, None for one that cannot be read), its gate in the
    catalog or at its recorded path, and asked of the note. Renamed or deleted, retyped
    (a type pair of its old type), the finding is about no pair of the KB."""
    if note_path not in notes:
        return None
    gate = catalog.recorded(kb, gate_id, gate_path)
    note = notes[note_path]
    if gate is None or (note is not None and not applies(gate, note)):
        return None
    return gate


def warn_queue(
    kb: KB, store: Store, catalog: Catalog, notes: Mapping[str, Note | None]
) -> list[WarnItem]:
    """The latest WARN per (note, gate) across partitions, leaving out pairs whose gate
    text changed since that review was accepted, and pairs no longer of the KB
    (:func:`pair_now`)."""
    rows = store.conn.execute(
        "SELECT a.note_path, a.gate_id, a.model_partition, a.accepted_at, p.job_id, p.rationale, "
        "p.gate_path, g.sha256 "
        "FROM acceptance a JOIN review_pairs p ON p.id = a.review_pair_id "
        "JOIN snapshots g ON g.id = a.gate_snapshot_id WHERE a.decision = 'WARN' "
        "ORDER BY a.note_path, a.gate_id, a.accepted_at DESC"
    ).fetchall()
    out: list[WarnItem] = []
    seen: set[tuple[str, str]] = set()
    for r in rows:
        key = (r["note_path"], r["gate_id"])
        if key in seen:
            continue
        gate = pair_now(kb, catalog, notes, r["note_path"], r["gate_id"], r["gate_path"])
        if gate is None or gate.sha256 != r["sha256"]:
            # gate-changed, or no pair now: the finding may no longer hold. Another
            # partition's earlier WARN of the gate as it is now still does: a pair taken
            # as said by this one hid it.
            continue
        seen.add(key)
        out.append(
            WarnItem(
                r["note_path"],
                r["gate_id"],
                r["model_partition"],
                r["job_id"],
                r["accepted_at"],
                r["rationale"] or "",
            )
        )
    return out
