"""Fix jobs (CONTRACT §7): a fixer agent gets a note, every current FAIL finding for it with
the gate texts and the directive "make the smallest edit"; its output is the whole new
note. reviewq writes it only if the note is still exactly the text the fixer was given,
and only to that one file.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import re
import stat
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from orchestrator import logs
from orchestrator.cycles.escalations import held_pairs
from orchestrator.kb.atomicfile import atomic_write, clear_leftovers, mode_of
from orchestrator.kb.gates import Catalog, Gate
from orchestrator.kb.gitcommit import (
    CHANGED_BEFORE_COMMIT,
    CommitOutcome,
    commit_fix,
    commit_made,
    message,
)
from orchestrator.kb.notes import (
    KB,
    KBError,
    Note,
    NoteParseError,
    OutsideRoot,
    decode,
    parse_note_text,
    sha256_bytes,
    sha256_text,
    split_frontmatter,
)
from orchestrator.review.finalize import decided_since, texts_taken_at, withdraw
from orchestrator.review.freshness import NoteComparison
from orchestrator.review.jobs import clear_job_folder, display_path
from orchestrator.review.prompts import fenced, template
from orchestrator.state.files import (
    NOT_TRIED,
    Later,
    mark_job_files_due,
    settle_due,
    write_each,
    write_job_files_after_commit,
)
from orchestrator.state.status import findings as finding_lines
from orchestrator.state.store import Store, parse_timestamp, utcnow

# A fix commit refused for now (a lock another git holds, a merge in progress) is tried
# again at each tick for this long (a person's git that crashed leaves its lock behind
# until they remove it).
COMMIT_TRIED_FOR = timedelta(days=1)


@dataclass(frozen=True)
class FixTarget:
    gate_id: str
    gate_path: str
    lens: str
    rationale: str


def open_fix_job(store: Store, note_path: str) -> int | None:
    row = store.conn.execute(
        "SELECT id FROM review_jobs WHERE kind = 'fix' AND note_path = ? AND status IN ('queued', 'running')",
        (note_path,),
    ).fetchone()
    return row[0] if row else None


def current_failures(
    kb: KB,
    store: Store,
    catalog: Catalog,
    partition: str,
    note_path: str,
    note: Note,
    include: set[str] | None = None,
) -> list[FixTarget]:
    """Every current FAIL finding for the note, leaving out pairs waiting for a person
    and rejected pairs whose note and gate are unchanged since (as a sweep does);
    ``include`` names pairs to keep anyway, such as the one a redo is about.

    A FAIL about an earlier text is not current, not even for a redo, when the pair is
    stale now (CONTRACT §3): a person edited what the gate watches while its review waited,
    or before deciding. Handed to a fixer with today's text, its findings (about a text
    that is gone) came back "changed nothing" and counted as rejections of the person's
    own fix; the next sweep reviews the person's text instead. One their edit left
    fresh (a region the gate does not watch, a body under its rewrite threshold) is the
    FAIL of the note as it is: no sweep meets it again, so only a fix gets to it. So is
    a FAIL against a gate whose text changed since not current: the fixer got the old
    gate's findings beside the new gate."""
    rows = []
    for r in store.conn.execute(
        "SELECT a.gate_id, p.gate_path, p.lens, p.rationale, s.sha256, g.sha256, s.text "
        "FROM acceptance a JOIN review_pairs p ON p.id = a.review_pair_id "
        "JOIN snapshots s ON s.id = a.note_snapshot_id "
        "JOIN snapshots g ON g.id = a.gate_snapshot_id "
        "WHERE a.model_partition = ? AND a.note_path = ? AND a.decision = 'FAIL' "
        "ORDER BY a.gate_id",
        (partition, note_path),
    ):
        # A type spec a note names by a path is not in the catalog's scan: found where the
        # review recorded it, or its FAILs made no fix and no escalation.
        gate = catalog.recorded(kb, r[0], r[1])
        if gate is not None and gate.sha256 == r[5] and _same_for(gate, r[4], r[6], note):
            rows.append(r)
    current = {}
    for r in rows:
        gate = catalog.recorded(kb, r[0], r[1])
        current[(note_path, r[0])] = (note.sha256, gate.sha256 if gate else None)
    held = {g for n, g in held_pairs(store, partition, current) if n == note_path}
    keep = include or set()
    return [
        FixTarget(r[0], r[1], r[2], r[3] or "") for r in rows if r[0] not in held or r[0] in keep
    ]


def _same_for(gate: Gate, accepted_sha: str, accepted_text: str | None, note: Note) -> bool:
    """Whether the note as it is now is the text a FAIL judged, as far as ``gate`` is
    concerned: the same text, or a fresh pair by CONTRACT §3's rules."""
    if accepted_sha == note.sha256:
        return True
    if accepted_text is None:
        return False
    try:
        old = parse_note_text(accepted_text)
    except NoteParseError:
        return False  # compared whole, it differs
    return NoteComparison(old, note.parsed()).verdict(gate).reason is None


def create_fix_job(
    kb: KB,
    catalog: Catalog,
    store: Store,
    state_dir: Path,
    *,
    note_path: str,
    partition: str,
    fixer: str,
    review_reviewer: str | None,
    sweep: str | None,
    sweep_run_id: int | None,
    source_job_id: int | None,
    feedback: str | None = None,
    include: set[str] | None = None,
) -> int | None:
    """Queue a fix job for a note, unless one is open already or nothing FAILs."""
    if open_fix_job(store, note_path) is not None:
        logs.get().info(
            "fix.skipped", note_path=note_path, reason="a fix job for this note is open"
        )
        return None
    try:
        rel = kb.check_rel(note_path)
        if (why := kb.note_too_large(rel)) is not None:
            # Grown past the limit since its review: the fixer's prompt and message would
            # carry it whole, as a review's would not.
            logs.get().warning("fix.skipped", note_path=note_path, reason=f"{why}; not fixed")
            return None
        if not feedback and kb.is_excluded(rel):
            # Excluded since its review was queued: the review runs (it was asked for),
            # no fixer rewrites an index or template unasked. A person's redo still does.
            logs.get().info(
                "fix.skipped", note_path=note_path, reason="excluded by [kb] exclude; not fixed"
            )
            return None
        note = kb.read_note(rel)
    except (KBError, NoteParseError, OSError) as exc:
        # Deleted, broken or leading outside the root since its review: nothing to fix.
        logs.get().warning("fix.skipped", note_path=note_path, reason=str(exc))
        return None
    targets = current_failures(kb, store, catalog, partition, note_path, note, include)
    if not targets:
        return None
    with store.write():
        now = utcnow()
        job_id = store.conn.execute(
            "INSERT INTO review_jobs (kind, status, model_partition, grouping, reviewer, job_dir, sweep, sweep_run_id, "
            "note_path, source_job_id, feedback, review_reviewer, created_at, updated_at) "
            "VALUES ('fix', 'queued', ?, 'fix', ?, '', ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (
                partition,
                fixer,
                sweep,
                sweep_run_id,
                note.path,
                source_job_id,
                feedback,
                review_reviewer,
                now,
                now,
            ),
        ).fetchone()[0]
        folder = clear_job_folder(state_dir, job_id)
        store.conn.execute(
            "UPDATE review_jobs SET job_dir = ? WHERE id = ?",
            (display_path(state_dir, folder), job_id),
        )
        note_snap = store.snapshot(note.path, note.text, note.sha256)
        for t in targets:
            gate = catalog.recorded(kb, t.gate_id, t.gate_path)
            gate_text = gate.text if gate else ""
            store.conn.execute(
                "INSERT INTO review_pairs (job_id, note_path, gate_id, gate_path, lens, note_snapshot_id, "
                "gate_snapshot_id, rationale) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    note.path,
                    t.gate_id,
                    t.gate_path,
                    t.lens,
                    note_snap,
                    store.snapshot(t.gate_path, gate_text),
                    t.rationale,
                ),
            )
        write_job_files_after_commit(store, state_dir, job_id)
    # Once it commits: queued inside an outcome's transaction (a batch, all or nothing),
    # one rolled back logged a fix that never was, and its id was made again.
    store.after_commit(
        lambda: logs.get().info(
            "fix.queued",
            job_id=job_id,
            source_job_id=source_job_id,
            note_path=note.path,
            gates=[t.gate_id for t in targets],
            reviewer=fixer,
        )
    )
    return job_id


def render_fix_prompt(store: Store, job_id: int, output_path: str, retry: str = "") -> str:
    job = store.conn.execute("SELECT * FROM review_jobs WHERE id = ?", (job_id,)).fetchone()
    pairs = store.conn.execute(
        "SELECT p.gate_id, p.gate_path, p.rationale, n.text AS note_text, g.text AS gate_text FROM review_pairs p "
        "JOIN snapshots n ON n.id = p.note_snapshot_id JOIN snapshots g ON g.id = p.gate_snapshot_id "
        "WHERE p.job_id = ? ORDER BY p.id",
        (job_id,),
    ).fetchall()
    # Each in a fence of its own: a reviewer's markdown (a heading, an unclosed fence)
    # read as the prompt's own gave the fixer a forged section or hid the gates.
    findings = "\n".join(
        f"\n### Against `{p['gate_id']}`\n\n{fenced((p['rationale'] or '').strip(), 'text')}"
        for p in pairs
    )
    gates = "\n".join(
        f"\n### `{p['gate_id']}` (`{p['gate_path']}`)\n\n{fenced(p['gate_text'])}" for p in pairs
    )
    feedback = ""
    if job["feedback"]:
        feedback = (
            "\n## A person's asks (do these)\n\nA person reviewed the earlier attempts and asks for exactly this:\n\n"
            f"{job['feedback'].strip()}\n"
        )
    text = template("fix").substitute(
        job_id=job_id,
        note_path=job["note_path"],
        output_path=output_path,
        feedback_section=feedback,
        findings=findings,
        gates=gates,
        note=fenced(pairs[0]["note_text"] if pairs else ""),
    )
    return retry + text if retry else text


@dataclass(frozen=True)
class FixResult:
    status: str  # applied | unchanged | stale | decided | invalid
    reason: str = ""
    new_sha256: str | None = None
    new_text: str | None = None


def decided_by_a_person(store: Store, job) -> str | None:  # noqa: ANN001 - a review_jobs row
    """Why a fix job's output must not be written: a person approved, rejected into
    their FAIL or acked one of its pairs after the job read the note, or None. Written,
    the fix rewrote the note the person had just decided on for a finding they had
    settled, and its re-review then replaced their decision (as a review job queued
    before it would: finalize keeps that one out, ``acceptance.kept``). The fixer's
    note is one text for all of its findings, so none of it is written."""
    taken_at = texts_taken_at(store, job)
    for pair in store.conn.execute(
        "SELECT note_path, gate_id FROM review_pairs WHERE job_id = ? ORDER BY id", (job["id"],)
    ):
        if (who := decided_since(store, job, pair, taken_at)) is not None:
            what = "an ack" if who == "ack" else "a person's decision"
            return (
                f"{what} on {pair['gate_id']} was recorded after this fix read the note; "
                "it stands, and the fix is not written"
            )
    return None


def in_the_notes_form(new: str, given: str) -> str:
    """The fixer's text with the given note's byte order mark, line ends and final line
    end. A fixer reads the note through a prompt or its tools and writes LF with a final
    newline: given back unchanged, a CRLF note or one with no final newline was "applied"
    (every line rewritten, and committed) where the fix changed nothing."""
    bom = "\ufeff"
    new = bom + new.removeprefix(bom) if given.startswith(bom) else new.removeprefix(bom)
    crlf = given.count("\r\n")
    if crlf and crlf != given.count("\n"):
        # Line ends of both kinds: no one form to give the fixer's text. Given back with
        # one kind only, it changed nothing if it is the same text but for them.
        if _lines_of(new) == _lines_of(given):
            return given
    elif crlf:
        new = _BARE_LF.sub("\r\n", new)
    elif "\r\n" in new:
        new = new.replace("\r\n", "\n")
    if not given.endswith("\n") and new.endswith("\n"):
        new = new.removesuffix("\r\n") if new.endswith("\r\n") else new[:-1]
    elif given.endswith("\n") and new and not new.endswith("\n"):
        new += "\r\n" if given.endswith("\r\n") else "\n"
    return new


def _lines_of(text: str) -> str:
    """The text with LF line ends and no final one: what two forms of it share."""
    return text.replace("\r\n", "\n").removesuffix("\n")


_BARE_LF = re.compile(r"(?<!\r)\n")


# Control characters but tab, line ends and form feed, and C1 codes (U+0085 ends a line).
_CONTROL = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f-\x84\x86-\x9f]")


def _controls_added(new: str, given: str) -> list[str]:
    """The control characters ``new`` holds and ``given`` does not, in order of appearance."""
    had = set(_CONTROL.findall(given))
    return [c for c in dict.fromkeys(_CONTROL.findall(new)) if c not in had]


# A fence's opening line: three or more backticks or tildes, and an info string.
_OPENING_FENCE = re.compile(r"(`{3,}|~{3,})[ \t]*([^`\s]*)[ \t]*")


def _fenced_whole(text: str) -> tuple[str, str, str] | None:
    """The opening and closing lines of a code fence around the whole of ``text``, its
    first line to its last (a note given back fenced), and the text inside; or None."""
    lines = text.removeprefix("\ufeff").strip().splitlines(keepends=True)
    opening = _OPENING_FENCE.fullmatch(lines[0].strip()) if len(lines) >= 2 else None
    if opening is None or lines[-1].strip() != opening.group(1):
        return None
    return lines[0].strip(), opening.group(1), "".join(lines[1:-1])


def _unfenced(text: str, given: str) -> str:
    """The fixer's text, or the note inside a fence around it all when the given note
    starts with frontmatter and is not so fenced: no such note starts with a fence, so the
    fence is a chat model's wrapping (the `openai` agent takes its answer's so), while a
    note without frontmatter may be one code block, and is judged as written."""
    fence = _fenced_whole(text)
    if fence is None or _fenced_whole(given) is not None or not _has_frontmatter(given):
        return text
    return fence[2] if _has_frontmatter(fence[2]) else text


def _has_frontmatter(text: str) -> bool:
    try:
        return split_frontmatter(text)[0] is not None
    except NoteParseError:
        return False


def apply_fix(
    kb: KB, store: Store, job, output: bytes | None, *, git_commit: bool = False
) -> FixResult:
    """Decide whether the fixer's note is applied: only over the text the fixer was given.

    Called inside the transaction that ends the fix job. An applied fix is recorded
    (``fix_writes``, the fixed snapshot, and ``fix_writes_due`` with the old and new
    text's sha256) and the note is written once that transaction commits, with its git
    commit if ``git_commit`` (:func:`write_due_fixes`): a rollback leaves the note as it
    was, and a crash before the write is healed at the next tick."""
    if (decided := decided_by_a_person(store, job)) is not None:
        return FixResult("decided", decided)
    if output is None:
        return FixResult("invalid", "the fixer wrote no output")
    given = store.conn.execute(
        "SELECT n.text FROM review_pairs p JOIN snapshots n ON n.id = p.note_snapshot_id WHERE p.job_id = ? LIMIT 1",
        (job["id"],),
    ).fetchone()[0]
    try:
        new_text = in_the_notes_form(_unfenced(decode(output), given), given)
        new_block, _ = split_frontmatter(new_text)
        parse_note_text(new_text)
    except NoteParseError as exc:
        return FixResult("invalid", f"the fixed note is unusable: {exc}")
    if not new_text.removeprefix("\ufeff").strip() and new_text != given:
        # Before the frontmatter check: said to have "no frontmatter", an empty output
        # sent the retries after frontmatter and told the person the fixer drops it.
        # (An empty note given back empty changed nothing: below. The mark is the given
        # note's, put back by in_the_notes_form: no text of the fixer's.)
        return FixResult("invalid", "the fixed note is empty")
    if (fence := _fenced_whole(new_text)) is not None and _fenced_whole(given) is None:
        # A chat model's habit, though the prompt asks for no fences: applied, a note
        # without frontmatter became one code block (re-reviewed, and committed, so);
        # one whose fence holds no frontmatter the note had was refused as having none,
        # a reason the retry could not act on (one that holds it is taken: _unfenced).
        return FixResult(
            "invalid",
            f"the fixed note is wrapped in a code fence ({fence[0]} … {fence[1]}): "
            "the note's text alone is asked for",
        )
    if new_block is None and _has_frontmatter(given):
        # Title, description and type became body text, and the gates that select the
        # note by its type no longer saw it: no review would have caught it.
        return FixResult("invalid", "the fixed note has no frontmatter; the note it was given had")
    try:
        rel = kb.check_rel(job["note_path"])  # resolves symlinks: never outside the root
        current = decode(kb.read_bytes(rel))
    except (KBError, OSError, NoteParseError) as exc:
        return FixResult("stale", f"the note cannot be read now ({exc}); nothing written")
    # The note first: once a person has edited it, the fixer's answer is moot, whether it
    # changed nothing (not a rejection of the person's text) or matches the person's
    # edit (their work, not the fixer's: it is not recorded or committed as a fix).
    if current != given:
        # "While the fixer ran" was said of an edit made before a queued fix began.
        return FixResult(
            "stale",
            "the note was edited after the fixer was given it (while its fix job was queued "
            "or ran); the person's text is kept",
        )
    if new_text == given:
        # An empty note given back empty changed nothing: called invalid, three of those
        # escalated as a fixer to repair.
        return FixResult("unchanged", "the fix changed nothing")
    if added := _controls_added(new_text, given):
        # A NUL made git take the note for a binary file (the fix's commit showed only
        # "Binary files differ"), and an escape acts on the terminal that prints the note.
        return FixResult(
            "invalid",
            f"the fixed note holds control character(s) the note it was given did not hold "
            f"({', '.join(repr(c) for c in added)}): no markdown needs them",
        )
    if (too_large := kb.too_large(len(new_text.encode("utf-8")))) is not None:
        # Written, no sweep reviewed the note again: its FAIL stood and nothing escalated.
        # After the note's checks: a person's edit still wins, and a note over a limit
        # lowered while its fix waited, given back as it was, is a rejection.
        return FixResult("invalid", f"the fixed note is {too_large}: no review could judge it")
    sha = sha256_text(new_text)
    with store.write():
        now = utcnow()
        fixed = store.snapshot(rel, new_text, sha)  # the report's diff: given → fixed
        store.conn.execute(
            "UPDATE review_jobs SET fixed_snapshot_id = ? WHERE id = ?", (fixed, job["id"])
        )
        store.conn.execute(
            "INSERT OR IGNORE INTO fix_writes VALUES (?, ?, ?, ?)", (rel, sha, job["id"], now)
        )
        store.conn.execute(
            "INSERT OR REPLACE INTO fix_writes_due VALUES (?, ?, ?, ?, ?, ?, 0)",
            (job["id"], rel, sha256_text(given), sha, now, NOT_TRIED),
        )
    store.after_commit(lambda: write_due_fixes(kb, store, [job["id"]], git_commit, late=False))
    return FixResult("applied", new_sha256=sha, new_text=new_text)


def write_due_fixes(
    kb: KB,
    store: Store,
    job_ids: list[int] | None = None,
    git_commit: bool = False,
    *,
    late: bool = True,
) -> int:
    """Write the notes of applied fixes still due (``job_ids``, else all); the number
    written or found written already."""
    due = {
        r["job_id"]: r
        for r in store.conn.execute("SELECT * FROM fix_writes_due ORDER BY job_id").fetchall()
    }
    if job_ids is not None:
        due = {i: due[i] for i in job_ids if i in due}
    done, failed = write_each(
        {i: r["error"] for i, r in due.items()},
        lambda i: _write_fix(kb, store, due[i], git_commit),
        what="fix.note",
        key="job_id",
        late=late,
    )
    settle_due(store, "fix_writes_due", "job_id", done, failed)
    return len(done)


def _write_fix(kb: KB, store: Store, due, git_commit: bool) -> bool:
    """One decided fix: written over the text the fixer was given, and only over that;
    then, with ``git_commit``, its commit (once: a job with an outcome is not committed
    again when a crash left the row behind). False when a person's text is kept."""
    job = store.conn.execute("SELECT * FROM review_jobs WHERE id = ?", (due["job_id"],)).fetchone()
    # A note that is a symbolic link (to a file inside the root: no other is a note) is
    # fixed in the file it names; replacing the link would leave that file as it was.
    # None: a person pointed the link outside the KB or into a loop since the decision,
    # and the fallback to the link's own path replaced their link with the fixed text.
    real = _named_file(kb.root, due["path"])
    # Read and written through a descriptor of its folder, held to be inside the root:
    # resolved by its path alone, a folder on the way swapped for a link out of the KB
    # after the check (a person moving it) had the fix written into the file out there.
    folder = _folder_of(kb, real) if real is not None else None
    if folder is None:
        real = None
    path = kb.root / (real or due["path"])
    try:
        return _write_fix_in(kb, store, due, job, git_commit, real, path, folder)
    finally:
        if folder is not None:
            os.close(folder)


def _write_fix_in(
    kb: KB,
    store: Store,
    due,  # noqa: ANN001 - a fix_writes_due row
    job,  # noqa: ANN001 - a review_jobs row
    git_commit: bool,
    real: str | None,
    path: Path,
    folder: int | None,
) -> bool:
    """:func:`_write_fix` once the note's folder is open (``folder``, None with ``real``
    when the note's path leads out of the root, into a loop or to nothing)."""

    def text(sha: str) -> bytes:
        return (
            store.conn.execute(
                "SELECT text FROM snapshots WHERE path = ? AND sha256 = ?", (due["path"], sha)
            )
            .fetchone()[0]
            .encode("utf-8")
        )

    try:
        current = sha256_bytes(_read_in(folder, path.name)) if folder is not None else None
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise  # not a person's doing: tried again at the next tick
        current = None
    if due["written"]:
        if current != due["new_sha256"]:
            # Written, then changed (a person's revert or edit) before its row went: theirs.
            _changed_since(kb, store, job, due["path"], git_commit, real, text(due["new_sha256"]))
            return True  # written, by an earlier pass
    elif current != due["new_sha256"]:  # else written already, by a run that then died
        if current != due["old_sha256"]:
            _not_written(store, job, due["path"])
            return False
        replace_note(path, text(due["new_sha256"]), folder)
    if not due["written"]:
        with store.write():
            store.conn.execute(
                "UPDATE fix_writes_due SET written = 1 WHERE job_id = ?", (due["job_id"],)
            )
            # When it reached the KB (a disk that was full delays it): what it excuses
            # an attempt running then for.
            now = utcnow()
            store.conn.execute(
                "UPDATE fix_writes SET at = ? WHERE path = ? AND sha256 = ?",
                (now, due["path"], due["new_sha256"]),
            )
            if real != due["path"]:
                # A worker's watch sees the write in the file the link names, not at the
                # link: that path excuses an attempt running then too.
                store.conn.execute(
                    "INSERT OR REPLACE INTO fix_writes VALUES (?, ?, ?, ?)",
                    (real, due["new_sha256"], due["job_id"], now),
                )
    commit = None
    if git_commit and job["fix_commit"] is None and job["fix_no_commit"] is None:
        waited = due["written"] and due["error"] != NOT_TRIED  # its commit waited a tick
        commit = commit_applied_fix(
            kb, store, job, real, text(due["old_sha256"]), text(due["new_sha256"]), not waited
        )
        if commit.again:
            if parse_timestamp(due["since"]) > datetime.now(UTC) - COMMIT_TRIED_FOR:
                raise Later("fix.commit_deferred", commit.why_not or "", note_path=due["path"])
            commit = CommitOutcome(why_not=f"{commit.why_not} (tried for a day)")
        _record_commit(store, job, due["path"], commit)
    logs.get().info(
        "fix.applied",
        job_id=job["id"],
        note_path=due["path"],
        sha256=due["new_sha256"],
        gates=_gates(store, job["id"]),
        commit=commit.sha if commit else job["fix_commit"],
    )
    return True


def _folder_of(kb: KB, rel: str) -> int | None:
    """A descriptor of the folder of the note file ``rel``, inside the root; None when it
    is not there or leads out of the root (a person's move: their change)."""
    try:
        return kb.open_folder(posixpath.dirname(rel))
    except OutsideRoot:
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise  # not a person's doing: tried again at the next tick
        return None


def _read_in(folder: int, name: str) -> bytes:
    """The note file ``name`` of ``folder``; a link put in its place since the check is
    ELOOP (the person's change), as is anything but a regular file."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.ELOOP, "not a regular file", name)
        return f.read()


def _changed_since(
    kb: KB, store: Store, job, note_path: str, git_commit: bool, rel: str | None, fixed: bytes
) -> None:
    logs.get().info("fix.changed_since", job_id=job["id"], note_path=note_path)
    if git_commit and job["fix_commit"] is None and job["fix_no_commit"] is None:
        # A run killed after its `git commit`, before recording it: the commit is in `git
        # log`, and "no commit" hid the one a `git revert` of the fix undoes.
        made = rel and commit_made(kb.root, rel, fixed, _commit_message(store, job, rel))
        commit = CommitOutcome(sha=made) if made else CommitOutcome(why_not=CHANGED_BEFORE_COMMIT)
        _record_commit(store, job, note_path, commit)


def _not_written(store: Store, job, note_path: str) -> None:
    reason = (
        "the note was changed or removed by someone since the fix was decided; their text "
        "is kept and the fix is not applied"
    )
    logs.get().warning("fix.not_written", job_id=job["id"], note_path=note_path, reason=reason)
    with store.write():
        # updated_at: the report of the window where this happens says it, after the one
        # that said the fix waited to be written.
        store.conn.execute(
            "UPDATE review_jobs SET result = 'not-applied', failure_reasons = ?, updated_at = ? "
            "WHERE id = ?",
            (json.dumps([reason]), utcnow(), job["id"]),
        )
        # Its re-review, queued with it, reads the fixer's text, which never reached the
        # KB: run, it spent a run on it and a FAIL counted a rejection of the pair (toward
        # the third's escalation) of a text the note never had. The person's text is
        # reviewed at the next sweep (the pair is stale).
        rereviews = withdraw(
            store,
            [
                r[0]
                for r in store.conn.execute(
                    "SELECT id FROM review_jobs WHERE source_job_id = ? AND kind = 'review'",
                    (job["id"],),
                )
            ],
            f"withdrawn: it re-reviews fix job {job['id']}, which was not written to the KB "
            "(the note was changed since the fix was decided); the next sweep reviews the "
            "note as it is",
        )
        mark_job_files_due(store, [job["id"], *rereviews])  # its MANIFEST says the reason too
        if rereviews:
            store.after_commit(
                lambda: logs.get().info(
                    "fix.rereview_withdrawn",
                    job_id=job["id"],
                    note_path=note_path,
                    jobs=rereviews,
                )
            )


def linked_file(root: Path, rel: str) -> str:
    """The root-relative file a note's path names: itself, or for a symbolic link the file
    it leads to (inside the root: no other link is a note), which a KB watch sees change."""
    return _named_file(root, rel) or rel


def _named_file(root: Path, rel: str) -> str | None:
    """:func:`linked_file`, or None when the path leads outside the root or into a loop."""
    try:
        return (root / rel).resolve().relative_to(root.resolve()).as_posix()
    except (OSError, RuntimeError, ValueError):
        return None


def changes_not_the_agents(
    store: Store,
    root: Path,
    job_id: int,
    attempt: int,
    touched: list[str],
    hashes: dict[str, str],
) -> bool:
    """Whether every change an attempt saw in the KB is excused: the note a fix targets
    changed during the fix (whoever changed it, the fix is then judged stale and the text
    kept), or each change is a fix reviewq itself wrote meanwhile (its path and resulting
    hash in ``fix_writes``, written since the attempt opened: any earlier fix excused an
    agent that put its text back over a person's later edit). The control process and
    ``run-job`` ask alike."""
    if not touched:
        return False
    row = store.conn.execute(
        "SELECT j.kind, j.note_path, a.started_at FROM review_jobs j JOIN attempts a "
        "ON a.job_id = j.id AND a.attempt = ? WHERE j.id = ?",
        (attempt, job_id),
    ).fetchone()
    if row is None:
        return False
    note = row["note_path"]
    if row["kind"] == "fix" and note in touched and set(touched) <= {note, linked_file(root, note)}:
        return True
    return all(
        store.conn.execute(
            "SELECT 1 FROM fix_writes WHERE path = ? AND sha256 = ? AND at >= ?",
            (path, hashes.get(path), row["started_at"]),
        ).fetchone()
        for path in touched
    )


# What a worker may judge an attempt as, its change to the KB aside.
_JUDGED_WITHOUT_A_CHANGE = frozenset(
    {"output", "no-output", "burned-out", "launch-failure", "reviewer-failure", "invalid-output"}
)


def judged_without_the_change(
    untouched: object, has_output: bool, exit_code: object
) -> tuple[str, list[str]]:
    """How an attempt whose only change to the KB was not its own is judged: as the
    worker judged it without that change (``untouched``: [classification, reasons]), so
    a burned-out one is split and a reviewer's outage is not counted against the job.
    From a worker that does not say (an older release): its output, or no-output with
    the reason such an attempt gets. Its reasons were cleared: `job N` showed none, and
    the retry's prompt had nothing to tell the agent."""
    if (
        isinstance(untouched, list | tuple)
        and len(untouched) == 2
        and untouched[0] in _JUDGED_WITHOUT_A_CHANGE
        and isinstance(untouched[1], list)
    ):
        # Redacted as any reasons from a worker are: one elsewhere may not know them.
        return untouched[0], logs.redact_all(str(r) for r in untouched[1])
    if has_output:
        return "output", []
    return "no-output", [f"exited {exit_code} without writing its output"]


def replace_note(path: Path, data: bytes, folder: int | None = None) -> None:
    """The one place a fix reaches the KB: the note replaced atomically and durably
    (this is a person's note, not a rendering). Its git commit, if any, follows at once
    (:func:`commit_applied_fix`). A write of it that a crash cut short is cleared first.
    ``folder``: a descriptor of the note's folder, the one it is written in."""
    clear_leftovers(path, folder)
    atomic_write(path, data, durable=True, mode=mode_of(path, folder), dir_fd=folder)


def commit_applied_fix(
    kb: KB, store: Store, job, rel: str, given: bytes, data: bytes, patient: bool = True
) -> CommitOutcome:
    """The fix just written as one git commit of that note alone. Called right after the
    note file is replaced (it compares HEAD with the text the fixer was given). Not
    ``patient`` (its commit already waited a tick), it tries once: a lock still held must
    not stall the tick."""
    return commit_fix(kb.root, rel, given, data, _commit_message(store, job, rel), patient=patient)


def _commit_message(store: Store, job, rel: str) -> str:  # noqa: ANN001 - a review_jobs row
    pairs = store.conn.execute(
        "SELECT gate_id, rationale FROM review_pairs WHERE job_id = ? ORDER BY id", (job["id"],)
    ).fetchall()
    found = [
        f"{p['gate_id']}: {f}" for p in pairs for f in finding_lines(p["rationale"], limit=None)
    ]
    return message(
        rel,
        [p["gate_id"] for p in pairs],
        job["id"],
        job["review_reviewer"],
        job["reviewer"],
        found=found,
        asks=job["feedback"],
    )


def _record_commit(store: Store, job, note_path: str, commit: CommitOutcome) -> None:
    with store.write():
        # Once: a run-job and a tick writing the same due fix must not undo each other.
        store.conn.execute(
            "UPDATE review_jobs SET fix_commit = ?, fix_no_commit = ? "
            "WHERE id = ? AND fix_commit IS NULL AND fix_no_commit IS NULL",
            (commit.sha, commit.why_not, job["id"]),
        )
        if commit.sha:
            _rereviews_judge(store, job["id"], commit.sha)
    if commit.why_not:
        logs.get().warning(
            "fix.uncommitted" if commit.sha is None else "fix.commit_mixed",
            job_id=job["id"],
            note_path=note_path,
            commit=commit.sha,
            reason=commit.why_not,
        )


def _rereviews_judge(store: Store, job_id: int, sha: str) -> None:
    """The fix's re-reviews judge the fixed text, which its commit holds: their jobs were
    made (HEAD read) before the text was written and committed, so this commit is theirs
    (export's recorded-commit), and their acceptance's when one finished first."""
    mine = (
        "SELECT p.id FROM review_pairs p JOIN review_jobs j ON j.id = p.job_id "
        "WHERE j.source_job_id = ?1 AND j.kind = 'review' AND p.note_snapshot_id = "
        "(SELECT fixed_snapshot_id FROM review_jobs WHERE id = ?1)"
    )
    store.conn.execute(
        f"UPDATE review_pairs SET note_commit = ?2 WHERE id IN ({mine})", (job_id, sha)
    )
    store.conn.execute(
        f"UPDATE acceptance SET note_commit = ?2 WHERE review_pair_id IN ({mine}) "
        "AND note_snapshot_id = (SELECT fixed_snapshot_id FROM review_jobs WHERE id = ?1)",
        (job_id, sha),
    )


def _gates(store: Store, job_id: int) -> list[str]:
    return [
        r[0]
        for r in store.conn.execute(
            "SELECT gate_id FROM review_pairs WHERE job_id = ? ORDER BY id", (job_id,)
        )
    ]


def finish_fix_job(
    store: Store, state_dir: Path, job_id: int, status: str, result: str, reason: str
) -> None:
    with store.write():
        now = utcnow()
        store.conn.execute(
            "UPDATE review_jobs SET status = ?, result = ?, failure_reasons = ?, updated_at = ?, finished_at = ? "
            "WHERE id = ?",
            (status, result, json.dumps([reason]) if reason else None, now, now, job_id),
        )
        write_job_files_after_commit(store, state_dir, job_id)
