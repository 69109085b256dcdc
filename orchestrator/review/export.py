"""The export of CONTRACT §10: GATE-REVIEW files and gate_reviews.csv, renderings of the
accepted reviews in state.db."""

from __future__ import annotations

import bisect
import contextlib
import csv
import hashlib
import io
import json
import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from orchestrator.kb.atomicfile import replace_if_changed
from orchestrator.kb.gitcommit import GitFailed, GitTimeout, first_parent_line
from orchestrator.kb.notes import FileProblem, canonical_json, parse_note_text
from orchestrator.regularfile import NotRegular, open_regular
from orchestrator.review.acceptance import pair_now
from orchestrator.review.selector import current_notes
from orchestrator.state.files import LockHeld, ReportError, flat, folder_lock
from orchestrator.state.store import Store
from orchestrator.state.workspace import Workspace

EXPORT_DIR = "kb/reports/reviews"
# How long an export waits for another one writing the folder: long enough for an
# export of a large KB; a holder past it is stuck, and cron's next exports must not pile
# up behind it for good, each silent.
EXPORT_WAIT = 300.0
# A view for people and other tools, in the KB: readable by its other users (a team's
# shared checkout, a site built from it by another account), as the report page is.
VIEW_MODE = 0o644
HEADER = "<!-- GATE-REVIEW\n"  # how an export's own files begin: the only ones it removes
CSV_HEADER = [
    "note_path",
    "gate_id",
    "model_partition",
    "gate_hash",
    "recorded_commit",
    "watched_hash",
    "recorded_at",
]


def git_blob_hash(text: str) -> str:
    data = text.encode("utf-8")
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HeadHistory:
    """The commits of HEAD's first-parent line, newest first: :meth:`at` names the one
    HEAD was at when a review was recorded, for a review recorded before state.db kept
    its commit (migration 26). Read once an export that has such a review (one ``git
    log``); none outside git or before a first commit; :class:`ReportError` when git
    cannot read it. Commit times are not where HEAD was: after a rebase, a commit dated
    ahead, or a commit in the review's own second it names another commit, which is why
    the commit is now kept as the job's snapshot of the note is taken."""

    def __init__(self, root: Path) -> None:
        self._shas: list[str] = []
        # When each commit could have been made at the earliest: not before its parent
        # (a commit dated back, a clock behind, did not move HEAD back in time). Never
        # rising from the newest, so the newest made before a time is found by bisection.
        self._made: list[int] = []
        try:
            lines = first_parent_line(root)
        except OSError:
            return  # no git to run: outside git, as far as this machine can tell
        except (GitFailed, GitTimeout) as exc:
            # Written empty, as outside git, the commits of a KB that commits its export
            # were rewritten whole, and again by the next export git could read.
            raise ReportError(
                f"cannot read the KB's git history for recorded-commit: {exc}; nothing exported"
            ) from None
        for line in reversed(lines):
            at, _, sha = line.partition(" ")
            with contextlib.suppress(ValueError):
                self._made.append(max(int(at), self._made[-1]) if self._made else int(at))
                self._shas.append(sha)
        self._made.reverse()
        self._shas.reverse()

    def at(self, recorded_at: str) -> str:
        """The commit HEAD was at when ``recorded_at`` (state.db's UTC time): the newest
        made before it; "" before the first. A commit time is whole seconds: one in the
        second the review was recorded in may have come after it (the export committed
        at once), and is not taken."""
        try:
            when = datetime.fromisoformat(recorded_at.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return ""
        i = bisect.bisect_left(self._made, 1 - when, key=operator.neg)
        return self._shas[i] if i < len(self._shas) else ""


def note_regions(note_text: str) -> dict[str, str]:
    try:
        return parse_note_text(note_text).regions()
    except ValueError:
        return {"body": note_text}


def watched_hash(regions: dict[str, str], watches: list[str]) -> str:
    picked = {w: regions.get(w, "") for w in sorted(watches)}
    return hashlib.sha256(canonical_json(picked).encode("utf-8")).hexdigest()


# (note_path, gate_id, gate_path) of a recorded pair -> the regions its gate watches now,
# or None when the pair is no longer one of the KB.
Watches = Callable[[str, str, str], Sequence[str] | None]


def watches_now(
    ws: Workspace, on_problems: Callable[[Sequence[FileProblem]], None] | None = None
) -> Watches:
    """What the gate of each recorded pair watches in the KB as it is now (see
    :data:`Watches`); read when called, which :func:`export` does once it holds its lock,
    not as the KB was when a wait for another export began. ``on_problems`` is given the
    catalog's invalid files: a gate broken while a person edits it has its reviews left
    out of this export, which is to be said, not done in silence."""
    cat = ws.catalog()
    if on_problems is not None:
        on_problems(cat.problems)
    notes = current_notes(ws.kb, ws.state_dir)

    def watches(note_path: str, gate_id: str, gate_path: str) -> list[str] | None:
        gate = pair_now(ws.kb, cat, notes, note_path, gate_id, gate_path)
        return list(gate.watches) if gate is not None else None

    return watches


@dataclass(frozen=True)
class ExportResult:
    files: int
    csv_path: Path


def export(
    store: Store,
    root: Path,
    model: str | None = None,
    watches: Callable[[], Watches] | None = None,
    on_wait: Callable[[], None] | None = None,
    wait: float | None = None,
) -> ExportResult:
    """GATE-REVIEW files and gate_reviews.csv for every (note, gate) with an acceptance:
    in partition ``model``, or else the most recent across partitions. ``watches``, when
    given, is called once the folder's lock is held and reads the KB: what it returns
    gives the regions the gate of a recorded pair watches now, None for a pair no longer
    of the KB (a note since renamed, deleted or retyped, or a gate gone from the catalog
    keeps its acceptance in state.db but has no file). Read before the lock, the KB was
    as it stood when a wait began. One export at a time writes the folder: another one
    waits for it (``on_wait`` is called first) up to ``wait`` seconds (None: as long as
    it takes), then reads state.db and the KB."""
    if (
        model
        and not store.conn.execute(
            "SELECT 1 FROM acceptance WHERE model_partition = ? LIMIT 1", (model,)
        ).fetchone()
    ):
        # A typo would rewrite the index empty while the files of the last export stay.
        known = [
            r[0]
            for r in store.conn.execute(
                "SELECT DISTINCT model_partition FROM acceptance ORDER BY 1"
            )
        ]
        raise ReportError(
            f"--model {model}: no review recorded in this partition "
            f"(known: {', '.join(known) or 'none'}); nothing exported"
        )
    base = root / EXPORT_DIR
    for folder in (base.parent, base, base / "gates", base / "csv"):
        _not_a_link(folder)
    try:
        base.mkdir(parents=True, exist_ok=True)
        # Two exports at once (two cron entries, a person's run beside cron's) each
        # removed the files the other wrote: the folder was left holding parts of both,
        # and fewer files than its index named.
        with folder_lock(base, on_wait=on_wait, timeout=wait):
            for folder in _note_folders(base):  # walked once ``gates`` is known to be no link
                _not_a_link(folder)
            # The commit of the fix that wrote an accepted text, when a fix wrote it: the
            # latest fix's of each text, read once. Asked per acceptance row (no index
            # on the text a fix wrote), it read every job for each row: 80 s of CPU for a
            # KB of 1,775 notes, growing with the square of the KB.
            fix_commits = dict(
                store.conn.execute(
                    "SELECT fixed_snapshot_id, fix_commit FROM review_jobs WHERE kind = 'fix' "
                    "AND fix_commit IS NOT NULL AND fixed_snapshot_id IS NOT NULL ORDER BY id"
                )
            )
            rows = store.conn.execute(
                "SELECT a.*, p.rationale, p.gate_path, n.text AS note_text, g.text AS gate_text "
                "FROM acceptance a JOIN review_pairs p ON p.id = a.review_pair_id "
                "JOIN snapshots n ON n.id = a.note_snapshot_id JOIN snapshots g ON g.id = a.gate_snapshot_id "
                + ("WHERE a.model_partition = ? " if model else "")
                + "ORDER BY a.note_path, a.gate_id, a.accepted_at DESC",
                (model,) if model else (),
            )
            # The commit each review's note text was taken at is kept with it; only the
            # reviews recorded before it was (migration 26) are read from git's history
            # by times, and git is run only when there is one.
            head = (
                HeadHistory(root)
                if store.conn.execute(
                    "SELECT 1 FROM acceptance WHERE note_commit IS NULL "
                    + ("AND model_partition = ? " if model else "")
                    + "LIMIT 1",
                    (model,) if model else (),
                ).fetchone()
                else None
            )
            return _write(rows, base, head, watches() if watches else None, fix_commits)
    except LockHeld as exc:
        holder = f" (pid {exc.holder})" if exc.holder is not None else ""
        raise ReportError(
            f"{EXPORT_DIR}: another reviewq export{holder} still holds its lock (flock on that "
            f"folder) after {wait:g} s; nothing exported"
        ) from None
    except OSError as exc:
        # A file where a folder belongs, a read-only or full disk: said as such.
        where = exc.filename or base
        raise ReportError(f"cannot write the export at {where}: {exc.strerror or exc}") from None


def _write(  # noqa: ANN001 - rows: a cursor
    rows,
    base: Path,
    head: HeadHistory | None,
    watches: Watches | None,
    fix_commits: dict[int, str],
) -> ExportResult:
    """The GATE-REVIEW files and the index, from acceptance rows in (note, gate) order."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    files = 0
    written: set[Path] = set()
    last: tuple[str, str] | None = None
    # A note's rows come together and mostly share its text: parsed once, not once per
    # gate (12,831 parses of 329 notes were half of an unchanged export's time).
    parsed: tuple[int, dict[str, str]] | None = None
    # One row at a time, in (note, gate) order: the first row of a pair is its latest, and
    # memory holds one pair's texts, not every acceptance's.
    for r in rows:
        note_path, gate_id = key = (r["note_path"], r["gate_id"])
        if key == last:
            continue
        last = key
        _check_component(note_path)  # first: a path tampered with is refused, not skipped
        _check_component(gate_id)
        watch = watches(note_path, gate_id, r["gate_path"]) if watches is not None else None
        if watches is not None and watch is None:
            continue
        files += 1
        watch = watch or ["title", "description", "frontmatter", "body"]
        if parsed is None or parsed[0] != r["note_snapshot_id"]:
            parsed = (r["note_snapshot_id"], note_regions(r["note_text"]))
        fields = {
            "note_path": note_path,
            "gate_id": gate_id,
            "model_partition": r["model_partition"],
            "gate_hash": git_blob_hash(r["gate_text"]),
            "recorded_commit": _recorded_commit(r, head),
            "watched_hash": watched_hash(parsed[1], watch),
            "recorded_at": r["accepted_at"],
        }
        fix_commit = fix_commits.get(r["note_snapshot_id"])
        extra = {"fix_commit": fix_commit} if fix_commit else {}
        header = (
            HEADER
            + "".join(
                f"{k.replace('_', '-')}: {_in_comment(v)}\n" for k, v in (fields | extra).items()
            )
            + "-->\n"
        )
        body = f"\n## {gate_id} — {note_path}\n\n{(r['rationale'] or '').strip()}\n\n## Result: {r['decision']}\n"
        path = base / "gates" / flat(note_path) / f"{gate_id}.md"
        _not_a_link(path.parent)
        replace_if_changed(path, header + body, mode=VIEW_MODE)
        written.add(path)
        writer.writerow([fields[k] for k in CSV_HEADER])
    csv_path = base / "csv" / "gate_reviews.csv"
    replace_if_changed(csv_path, buf.getvalue(), mode=VIEW_MODE)
    _remove_others(base / "gates", written)
    return ExportResult(files, csv_path)


def _recorded_commit(row, head: HeadHistory | None) -> str:  # noqa: ANN001 - an acceptance row
    """The commit kept with the review; by times for one recorded before it was kept."""
    if row["note_commit"] is not None:
        return row["note_commit"]
    return head.at(row["accepted_at"]) if head is not None else ""


def _in_comment(value: object) -> str:
    """A header value as the comment can hold it: one that would end the comment (a note
    named `a-->b.md`) is written as a JSON string with its `>` escaped, and so is one that
    begins with a quote, so that a reader can tell the two apart."""
    text = str(value)
    if "-->" not in text and "--!>" not in text and not text.startswith('"'):
        return text
    return json.dumps(text, ensure_ascii=False).replace(">", "\\u003e")


def _remove_others(folder: Path, written: set[Path]) -> None:
    """The export is the view of the reviews now: a file of an earlier export (another
    partition's, a renamed note's, a gate no longer reviewed) would read as current. Only
    files an export wrote go (a person's README stays), and links are not followed."""
    for top, _dirs, names in os.walk(folder, topdown=False):
        here = Path(top)
        try:
            for name in names:
                if here / name not in written and _exported(here / name):
                    (here / name).unlink()
            if here != folder and not any(here.iterdir()):
                here.rmdir()
        except OSError as exc:
            # Said as a write ("cannot write the export at OLD.md"), it sent the person
            # looking for why a file of this export could not be written.
            raise ReportError(
                f"cannot remove {exc.filename or here}, left by an earlier export: "
                f"{exc.strerror or exc} (this export's files and index are written)"
            ) from None


def _exported(path: Path) -> bool:
    """A regular file (not a link) that begins as an export's GATE-REVIEW file does."""
    try:
        fd = open_regular(path, follow=False)
    except (NotRegular, OSError):
        return False
    if fd is None:
        return False
    try:
        return os.read(fd, len(HEADER)) == HEADER.encode()
    finally:
        os.close(fd)


def _note_folders(base: Path) -> list[Path]:
    """Every folder an earlier export made under ``gates/`` (its notes' and their lenses'),
    looked at before the first write, so a link among them stops the export before it
    wrote anything. A linked folder is listed, not entered."""
    return [Path(top) / d for top, dirs, _ in os.walk(base / "gates") for d in dirs]


def _not_a_link(folder: Path) -> None:
    """The export writes and removes files: through a link, it would do both outside the
    KB (a link to /etc, and every file there not of this export was removed)."""
    if folder.is_symlink():
        raise ReportError(
            f"{folder}: is a symbolic link; the export writes only in folders of the KB "
            "itself (replace the link with a folder); nothing exported"
        )


def _check_component(value: str) -> None:
    # Paths in the database were validated when recorded; refuse anything that could
    # still steer a write out of the export folder.
    parts = value.split("/")
    if value.startswith("/") or ".." in parts or "\x00" in value or "" in parts:
        raise ReportError(f"refusing to export {value!r}: not a clean relative path")
