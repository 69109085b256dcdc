"""CONTRACT §6 finalize: accept a job's output all-or-nothing, fenced by attempt.

Parsing happens first and changes nothing. On success one IMMEDIATE transaction records
every decision, upserts acceptance for every PASS/WARN/FAIL (ERROR is recorded but never
makes a pair fresh) and completes the job; the result files follow the commit and can be
regenerated from the database at any time.
"""

from __future__ import annotations

import errno
import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import faults, logs
from orchestrator.kb.notes import (
    KB,
    KBError,
    NoteParseError,
    decode,
    parse_note_text,
    sha256_bytes,
)
from orchestrator.regularfile import FOLDER, SYMLINK, NotRegular, open_regular
from orchestrator.review.bundle import ExpectedPair, parse_bundle
from orchestrator.review.freshness import NoteComparison
from orchestrator.state.files import write_job_files_after_commit
from orchestrator.state.status import FAILED_SQL, new_job_words, split_words
from orchestrator.state.store import Store, storable_number, utcnow

ACCEPTED_DECISIONS = ("PASS", "WARN", "FAIL")
# Acceptance a person recorded: a job that read its texts before does not replace it.
PEOPLES = ("human", "ack")


class FinalizeError(ValueError):
    """Finalize refused before changing anything (unknown job, done already, wrong model)."""


@dataclass(frozen=True)
class Provenance:
    runner: str | None = None
    model: str | None = None
    effort: str | None = None
    telemetry: dict | None = None


@dataclass
class FinalizeResult:
    review_job_id: int
    status: str  # completed | failed | invalid (queued attempt to retry) | superseded
    failure_reasons: list[str] = field(default_factory=list)
    pairs: list[dict] = field(default_factory=list)
    # The job's pairs (all columns the follow-ups read) as this transaction left them,
    # in id order, each with its ``decision``, ``rationale`` and whether it was
    # ``accepted``: the follow-ups inside the same transaction need not read them again.
    decided: list[dict] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def to_json(self) -> dict:
        return {
            "review_job_id": self.review_job_id,
            "status": self.status,
            "failure_reasons": self.failure_reasons,
            "pairs": self.pairs,
        }


NOT_REGULAR = "{} is not a regular file (a FIFO, socket or device)"


def read_output(path: Path, max_bytes: int) -> bytes | None:
    """An output file, or None if there is none. At most ``max_bytes + 1`` bytes are read,
    so a 50 MB output costs no more memory than the limit and still fails as too large.
    Anything but a regular file is refused (:class:`FinalizeError`): a symbolic link's
    bytes belong to whatever it points at (a note, a key), and a FIFO would hold the read
    until someone writes to it."""
    try:
        fd = open_regular(path, follow=False)
    except NotRegular as exc:
        if exc.kind == FOLDER:
            return None
        if exc.kind == SYMLINK:
            raise FinalizeError(f"{path.name} is a symbolic link, not a file") from None
        raise FinalizeError(NOT_REGULAR.format(path.name)) from None
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise FinalizeError(f"{path.name} cannot be read: {exc.strerror}") from None
        raise
    if fd is None:
        return None
    with open(fd, "rb") as f:
        # A read of max_bytes + 1 allocates that much first (5 MB: ~18 µs an output, an
        # attempt's every output): what the file holds, and the rest only if it grew.
        want, size = max_bytes + 1, os.fstat(fd).st_size
        data = f.read(min(want, size + 1))
        if size < len(data) < want:
            data += f.read(want - len(data))
        return data


def parse_telemetry(value: str | None) -> dict | None:
    """``--telemetry-json``: inline JSON, or the path of a JSON file."""
    if value is None:
        return None
    where = "--telemetry-json"  # and the file's name once it is one
    try:
        data = json.loads(value)
    except json.JSONDecodeError as bad:
        path = Path(value)
        try:
            is_file = path.is_file()
        except OSError:  # a long JSON text with a mistake in it: too long for a file name
            is_file = False
        if not is_file:
            raise FinalizeError(
                f"--telemetry-json: neither JSON ({bad.msg} at line {bad.lineno} column "
                f"{bad.colno}) nor a readable file"
            ) from None
        where = f"--telemetry-json {value}"
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise FinalizeError(f"--telemetry-json {value}: not UTF-8 text") from None
        except OSError as exc:
            raise FinalizeError(f"--telemetry-json {value}: {exc.strerror or exc}") from None
        try:
            # A file saved by an editor that writes a byte-order mark, as a selection
            # (parse_select_json) and a bundle with one are read.
            data = json.loads(text.removeprefix("\ufeff"))
        except json.JSONDecodeError as exc:
            raise FinalizeError(
                f"--telemetry-json {value}: not JSON ({exc.msg} at line {exc.lineno} "
                f"column {exc.colno})"
            ) from None
    if not isinstance(data, dict):
        kind = {list: "a list", str: "a string", bool: "true or false", type(None): "null"}
        got = kind.get(type(data), "a number")
        raise FinalizeError(f"{where}: expected a JSON object, not {got}")
    for key in ("cost_usd", "input_tokens", "output_tokens", "num_turns"):
        # Summed into status, budgets and reports: a negative or infinite cost (JSON
        # takes Infinity and NaN) would stop a budget for good or hide real spend.
        v = data.get(key)
        if v is not None and not storable_number(v):
            raise FinalizeError(f"--telemetry-json: {key} {v!r}: expected a number, 0 or more")
    return data


def _job(store: Store, job_id: int):
    job = store.conn.execute("SELECT * FROM review_jobs WHERE id = ?", (job_id,)).fetchone()
    if job is None:
        raise FinalizeError(f"no review job {job_id}")
    return job


def check_finalizable(store: Store, job_id: int, prov: Provenance, job=None):  # noqa: ANN001
    """The job, if ``prov`` may finalize it; else :class:`FinalizeError`. ``job``: its row,
    when the caller has read it already."""
    job = _job(store, job_id) if job is None else job
    if job["kind"] != "review" and job["kind"] != "audit":
        raise FinalizeError(f"job {job_id} is a {job['kind']} job, not a review")
    if job["status"] == "split":
        # Its pairs are its parts' now: "split already; finalizing it again" sent a person
        # with an output for it looking for a finalize nobody ran.
        raise FinalizeError(split_words(store, job_id))
    if job["status"] in ("completed", "failed"):
        again = new_job_words(store, job_id)
        raise FinalizeError(
            f"job {job_id} is {job['status']} already; finalizing it again is refused"
            + (f"; {again}" if again else "")
        )
    if prov.effort and not prov.model:
        raise FinalizeError("--effort needs --model")
    if prov.model and prov.model != job["model_partition"]:
        raise FinalizeError(
            f"--model {prov.model} does not match job {job_id}'s model partition {job['model_partition']}"
        )
    return job


def manual_output(
    store: Store, state_dir: Path, job_id: int, prov: Provenance, max_bytes: int
) -> bytes | None:
    """The output a person asks ``finalize`` to accept: the job is checked before its
    bundle-output.md is read."""
    check_finalizable(store, job_id, prov)
    path = state_dir / _job(store, job_id)["job_dir"] / "bundle-output.md"
    if path.is_dir() and not path.is_symlink():
        # A worker's agent that leaves a folder left no output; a person's slip (a tool
        # writing into a folder of that name) is refused, as a FIFO or a link is, and
        # does not fail the job as "output file is missing".
        raise FinalizeError(f"{path.name} is a folder, not a file")
    output = read_output(path, max_bytes)
    if output is None:
        # An attempt's prompt (run-job's, cut short) names its own folder's output: failed
        # as "missing", the job lost the output a person had made beside it.
        # Not one an attempt's end already judged (invalid, burned out): moving it as told
        # failed the job on an output a worker had had rejected, and while it lay there a
        # person could never finalize the job without one.
        judged = {
            f"attempt-{r[0]}"
            for r in store.conn.execute(
                f"SELECT attempt FROM attempts WHERE job_id = ? AND outcome IN ({FAILED_SQL})",
                (job_id,),
            )
        }
        made = sorted(
            (p for p in path.parent.glob(f"attempt-*/{path.name}") if p.parent.name not in judged),
            key=_changed_at,
        )
        if made:
            raise FinalizeError(
                f"{path} is missing; {made[-1].relative_to(path.parent)} is there: move it "
                f"to {path} to finalize it (nothing changed)"
            )
    return output


def _changed_at(path: Path) -> float:
    """When a file was last written; 0 for one gone or unreadable meanwhile."""
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def finalize(
    store: Store,
    state_dir: Path,
    job_id: int,
    output: bytes | None,
    *,
    attempt: int | None = None,
    provenance: Provenance = Provenance(),
    max_bytes: int = 5 * 1024 * 1024,
    fail_on_invalid: bool = True,
    within: Callable[[Store, Any, list[dict]], None] | None = None,
    job: Any = None,
    secrets: Sequence[str] = (),
) -> FinalizeResult:
    """Finalize ``output`` for a job. ``attempt`` fences a queued attempt: an output from
    any attempt but the job's current one is ignored. With ``fail_on_invalid`` (the
    manual path) an invalid output fails the job at once and frees its pairs; without
    it the job is left for the caller to retry. ``job``: the job's row, read by a caller
    inside its write transaction (the control's outcome batch). ``secrets``: the worker's,
    redacted with this machine's in what is stored of the output."""
    # Read under this transaction's write lock (the control's batch, finalize_by_hand's
    # write), the job cannot change before the writes below: the fence would read again
    # what it just read.
    fenced = store.writing is not None
    job = check_finalizable(store, job_id, provenance, job if fenced else None)
    if attempt is not None and attempt != job["attempt"]:
        return FinalizeResult(
            job_id, "superseded", [f"attempt {attempt} is not the current attempt {job['attempt']}"]
        )
    pairs = store.conn.execute(
        "SELECT id, note_path, gate_id, gate_path, note_snapshot_id, gate_snapshot_id, note_commit "
        "FROM review_pairs WHERE job_id = ? ORDER BY id",
        (job_id,),
    ).fetchall()
    parsed = parse_bundle(
        output, [ExpectedPair(p["note_path"], p["gate_path"]) for p in pairs], max_bytes=max_bytes
    )
    if not parsed.ok:
        reasons = logs.redact_all(parsed.reasons, secrets)  # capped by the parser
        if attempt is not None:
            with store.write():
                _mark_attempt(store, job_id, attempt, "invalid-output", reasons)
        if fail_on_invalid:
            with store.write():
                now = utcnow()
                if not fenced:
                    _fence(store, job_id, job["attempt"])
                if attempt is None:
                    _supersede_open(store, job_id, now)
                store.conn.execute(
                    "UPDATE review_jobs SET status = 'failed', failure_reasons = ?, updated_at = ?, "
                    "finished_at = ?, runner = ?, model = ?, effort = ?, telemetry_json = ? WHERE id = ?",
                    (json.dumps(reasons), now, now, *_prov(provenance), job_id),
                )
                write_job_files_after_commit(store, state_dir, job_id)
            return FinalizeResult(job_id, "failed", reasons)
        return FinalizeResult(job_id, "invalid", reasons)

    by_key = {(p["note_path"], p["gate_path"]): p for p in pairs}
    results = []
    rationales: list[str] = []
    verdicts: dict[int, tuple[str, str, bool]] = {}
    with store.write():
        now = utcnow()
        if not fenced:
            _fence(store, job_id, job["attempt"])
        taken_at = texts_taken_at(store, job)
        for r in parsed.results:
            p = by_key[(r.note_path, r.gate_path)]
            # Redacted once, for everything that keeps it: the pair, and what ``within``
            # stores of it (a cycle's gist, which escalation reports print).
            rationale = logs.redact(r.rationale, secrets)
            store.conn.execute(
                "UPDATE review_pairs SET decision = ?, rationale = ?, decided_at = ? WHERE id = ?",
                (r.decision, rationale, now, p["id"]),
            )
            # An audit judges someone else's PASS: it records, it does not accept.
            accepted = r.decision in ACCEPTED_DECISIONS and job["kind"] == "review"
            if accepted and (who := decided_since(store, job, p, taken_at)) is not None:
                accepted = False
                _log_kept(store, job_id, p, r.decision, who)
            if accepted:
                store.upsert_acceptance(
                    model_partition=job["model_partition"],
                    note_path=p["note_path"],
                    gate_id=p["gate_id"],
                    review_pair_id=p["id"],
                    note_snapshot_id=p["note_snapshot_id"],
                    gate_snapshot_id=p["gate_snapshot_id"],
                    decision=r.decision,
                    at=now,
                    # The snapshot's, not HEAD's now: the verdict is of the prompt's text.
                    note_commit=p["note_commit"],
                )
            results.append(
                {
                    "note_path": p["note_path"],
                    "gate_id": p["gate_id"],
                    "decision": r.decision,
                    "accepted": accepted,
                }
            )
            rationales.append(rationale)
            verdicts[p["id"]] = (r.decision, rationale, accepted)
            faults.point("finalize.mid_transaction")
        if within is not None:  # rejection counts change in this same transaction
            within(
                store,
                job,
                [dict(x, rationale=t) for x, t in zip(results, rationales, strict=True)],
            )
        if attempt is not None:
            _mark_attempt(store, job_id, attempt, "finalized", [])
        else:
            _supersede_open(store, job_id, now)
        store.conn.execute(
            "UPDATE review_jobs SET status = 'completed', failure_reasons = NULL, updated_at = ?, "
            "finished_at = ?, runner = ?, model = ?, effort = ?, telemetry_json = ? WHERE id = ?",
            (now, now, *_prov(provenance), job_id),
        )
        write_job_files_after_commit(store, state_dir, job_id)
    decided = []
    for p in pairs:
        decision, rationale, accepted = verdicts.get(p["id"], (None, None, False))
        decided.append(dict(p, decision=decision, rationale=rationale, accepted=accepted))
    return FinalizeResult(job_id, "completed", [], results, decided)


def texts_taken_at(store: Store, job) -> str:  # noqa: ANN001 - a review_jobs row
    """When the job's note and gate texts were read: its own creation, or that of the
    job it was split from (a part reuses its snapshots)."""
    if job["parent_job_id"] is None:
        return job["created_at"]  # the row's own: no read of it again
    return store.conn.execute(
        "SELECT created_at FROM review_jobs WHERE id = ?",
        (job["parent_job_id"] or job["id"],),
    ).fetchone()[0]


def decided_since(store: Store, job, pair, taken_at: str) -> str | None:  # noqa: ANN001
    """A person's acceptance of the pair (``decide approve``, a reject recorded as their
    FAIL, ``ack``) recorded after this job (a review, or a fix) read its texts, or None. The person decided
    with the note as it is in front of them: a verdict of a job queued or running then,
    about that text or an older one, is no newer word, and accepted it undid theirs (an
    approve became a FAIL that started a new cycle; an ack went back to the old text,
    stale again)."""
    acc = store.acceptance(job["model_partition"], pair["note_path"], pair["gate_id"])
    if acc is None or acc.source not in PEOPLES or acc.accepted_at <= taken_at:
        return None
    return acc.source


def _log_kept(store: Store, job_id: int, pair, decision: str, who: str) -> None:  # noqa: ANN001
    what = "an ack" if who == "ack" else "a person's decision"
    note_path, gate_id = pair["note_path"], pair["gate_id"]
    store.after_commit(
        lambda: logs.get().warning(
            "acceptance.kept",
            job_id=job_id,
            note_path=note_path,
            gate_id=gate_id,
            decision=decision,
            reason=f"{what} recorded after this job read the note stands; "
            "this verdict is kept in the job, not accepted",
        )
    )


def _prov(p: Provenance) -> tuple:
    return (
        p.runner,
        p.model,
        p.effort,
        json.dumps(p.telemetry) if p.telemetry is not None else None,
    )


def _supersede_open(store: Store, job_id: int, now: str) -> None:
    """A job finalized by hand ends the attempt a worker may still run: left open, it held
    one of its reviewer's dispatch slots for good when no outcome came (the worker died,
    the message expired). An outcome that does come is recorded as a late one."""
    store.conn.execute(
        "UPDATE attempts SET outcome = 'superseded', ended_at = COALESCE(ended_at, ?) "
        "WHERE job_id = ? AND outcome IN ('dispatched', 'running')",
        (now, job_id),
    )


def withdraw(store: Store, job_ids: list[int], reason: str) -> list[int]:
    """Fail at once those of ``job_ids`` still queued or running whose review is no longer
    wanted (the text they were made to read never reached the KB), in the caller's
    transaction: an agent running one is superseded, so its outcome is not accepted (it
    is kept as a late one, and its worker asked to stop at the next beat), and their pairs
    are left to the next sweep, as a job failed without starting leaves them. The caller
    marks their files due. Returns the ids withdrawn."""
    now = utcnow()
    withdrawn = []
    for job_id in job_ids:
        row = store.conn.execute(
            "UPDATE review_jobs SET status = 'failed', failure_reasons = ?, updated_at = ?, "
            "finished_at = ? WHERE id = ? AND status IN ('queued', 'running') RETURNING id",
            (json.dumps([reason]), now, now, job_id),
        ).fetchone()
        if row is not None:
            _supersede_open(store, job_id, now)
            withdrawn.append(job_id)
    return withdrawn


def _fence(store: Store, job_id: int, attempt: int) -> None:
    """Inside the write transaction: the job is still open at the attempt we judged."""
    row = store.conn.execute(
        "SELECT status, attempt FROM review_jobs WHERE id = ?", (job_id,)
    ).fetchone()
    if row["status"] not in ("queued", "running") or row["attempt"] != attempt:
        raise FinalizeError(
            f"job {job_id} changed while it was being finalized ({row['status']}, attempt {row['attempt']})"
        )


def _mark_attempt(
    store: Store, job_id: int, attempt: int, outcome: str, reasons: list[str]
) -> None:
    store.conn.execute(
        "UPDATE attempts SET outcome = ?, reasons = ?, ended_at = COALESCE(ended_at, ?) "
        "WHERE job_id = ? AND attempt = ?",
        (outcome, json.dumps(reasons), utcnow(), job_id, attempt),
    )


def notes_changed(store: Store, kb: KB, job_id: int) -> dict[str, tuple[int, str | None]]:
    """The notes of a job whose text at their path is not the text the job read (a person's
    edit while it ran by hand), each with how many of its verdicts name it (verdicts on the
    older text) and why no sweep reviews it now, if it has grown past max_note_bytes: said,
    not read (a note grown to 512 MiB was held whole to be hashed). A note gone or
    unreadable is not among them (:func:`notes_gone` says it), nor a fix's: it gives no
    verdict, and the change is its own. Nor one that reads as the job's did, as select
    reads it (saved with a byte-order mark, its YAML re-quoted)."""
    changed: dict[str, tuple[int, str | None]] = {}
    for note_path, snapshot_id, sha, n in store.conn.execute(
        "SELECT p.note_path, p.note_snapshot_id, s.sha256, count(*) FROM review_jobs j "
        "JOIN review_pairs p ON p.job_id = j.id JOIN snapshots s ON s.id = p.note_snapshot_id "
        "WHERE j.id = ? AND j.kind != 'fix' GROUP BY 1, 2",
        (job_id,),
    ):
        try:
            too_large = kb.too_large(kb.abspath(note_path).stat().st_size)
            now = None if too_large else kb.read_bytes(note_path)
        except (KBError, OSError):
            continue
        if now is None or (
            sha256_bytes(now) != sha and not _reads_alike(store.snapshot_text(snapshot_id), now)
        ):
            changed[note_path] = (changed.get(note_path, (0, None))[0] + n, too_large)
    return changed


def _reads_alike(text: str | None, data: bytes) -> bool:
    """Whether a note's bytes read as ``text`` in every region select compares."""
    try:
        old, new = parse_note_text(text or ""), parse_note_text(decode(data))
    except NoteParseError:
        return False
    return not NoteComparison(old, new).changed


def notes_gone(kb: KB, pairs: list[dict]) -> dict[str, tuple[int, str | None]]:
    """The notes of a finalized job's pairs that are no longer at their path (renamed or
    deleted since the job was made, or unreadable), each with how many verdicts name it:
    recorded under that path, for no note of the KB; and, when the path is there but
    leads out of the KB (which select leaves out), how: neither renamed nor deleted."""
    counts = Counter(p["note_path"] for p in pairs)
    gone = {}
    for note_path, n in counts.items():
        outside = None
        try:
            there = kb.abspath(note_path).is_file()
        except (KBError, OSError):
            there = False
            path = Path(kb.root, note_path)
            if path.is_symlink():
                outside = "has become a symlink out of the KB"
            elif os.path.lexists(path):
                # The note is where it was; a folder on its path is the link, and "the
                # note has become one" sent the person to a file that is no link.
                outside = "now leads out of the KB through a folder made a symlink"
        if not there:
            gone[note_path] = (n, outside)
    return gone
