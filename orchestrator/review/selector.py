"""``reviewq select``: every requested (note, gate) pair that needs a review, and why.

The rules are :mod:`freshness`; this module gathers what they need in bulk. Pairs whose
note and gate texts both equal their accepted snapshots are counted inside SQLite and
never become Python objects, which is what keeps a 400,000-pair KB inside CONTRACT §13.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config import type_selector
from orchestrator.kb.gates import Catalog, Gate, SelectionError, applies, lens_folder_warnings
from orchestrator.kb.notecache import NoteCache, RatioMemo, SelectMemo
from orchestrator.kb.notes import (
    GATES_DIR,
    KB,
    TYPES_DIR,
    FileProblem,
    KBError,
    Note,
    NoteParseError,
    ParsedNote,
    parse_note_text,
    type_key,
)
from orchestrator.review.freshness import (
    MISSING,
    NOTE_CHANGED,
    REASONS,
    NoteComparison,
    Verdict,
    judge,
)
from orchestrator.review.freshness import unified_diff as make_diff
from orchestrator.state.store import Store, make_state_folder


class SelectError(ValueError):
    """A selection that cannot run (nothing selected, a bad reason)."""


@dataclass(slots=True)
class Target:
    note_path: str
    gate_id: str
    gate_path: str
    lens: str
    reason: str
    changed_regions: tuple[str, ...] = ()
    change_ratio: float | None = None
    diff: str | None = None

    def to_json(self) -> dict:
        out: dict = {
            "note_path": self.note_path,
            "gate_id": self.gate_id,
            "gate_path": self.gate_path,
            "lens": self.lens,
            "reason": self.reason,
        }
        if self.reason == NOTE_CHANGED:
            out["changed_regions"] = list(self.changed_regions)
            if self.change_ratio is not None:
                out["change_ratio"] = round(self.change_ratio, 4)
            if self.diff is not None:
                out["diff"] = self.diff
        return out


@dataclass
class Selection:
    model_partition: str | None
    targets: list[Target] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    problems: list[FileProblem] = field(default_factory=list)
    notes: dict[str, Note] = field(default_factory=dict)
    json_bytes: bytes | None = None  # the --json answer, when memoised
    hints: list[str] = field(default_factory=list)  # why it may hold less than meant
    excluded: int = 0  # notes [kb] exclude left out

    def to_json(self) -> dict:
        return {
            "model_partition": self.model_partition,
            "targets": [t.to_json() for t in self.targets],
            "counts": self.counts_json(),
        }

    def counts_json(self) -> dict[str, int]:
        """Pairs by reason, every reason named (the ``counts`` of :meth:`to_json`)."""
        counts = {r: self.counts.get(r, 0) for r in REASONS}
        counts["fresh"] = self.counts.get("fresh", 0)
        return counts


def note_root_problems(kb: KB, state_dir: Path | None = None) -> list[str]:
    """What makes a note root unusable: said by ``select`` (and so by every sweep) and
    by ``doctor``. A root mistyped, or a --root without kb/ (a cron job started in the
    wrong folder), read as a KB of no notes: "0 pairs", which looks like "all fresh"."""
    problems = []
    for r in kb.note_roots:
        if r == ".." or r.startswith("../") or not kb.inside(str(kb.root / r)):
            problems.append(f"note root {r}: outside the KB root {kb.root}")
            continue
        if (kb.root / r).exists() and not (kb.root / r).is_dir():
            # "no such folder" sent a person looking for a folder beside the file there.
            problems.append(
                f"note root {r}: a file in {kb.root}, not a folder (see [kb] note_roots)"
            )
            continue
        if not (kb.root / r).is_dir():
            problems.append(
                f"note root {r or '.'}: no such folder in {kb.root} "
                "(is --root the folder that holds kb/? see [kb] note_roots)"
            )
            continue
        for held in (GATES_DIR, TYPES_DIR):
            # "kb" or "." took the gates, the type specs and kb/README.md as notes to
            # review, and as notes a fixer may rewrite.
            if not r or held == r or held.startswith(f"{r}/") or r.startswith(f"{held}/"):
                problems.append(
                    f"note root {r or '.'}: overlaps {held}; name the folders of notes "
                    "(see [kb] note_roots, default kb/notes)"
                )
        if state_dir is not None and _reviewed_inside(kb.root / r, state_dir):
            # Its prompts, reports and escalations were selected as notes, and fixed.
            problems.append(
                f"the state folder {state_dir} lies in the note root {r or '.'}: reviewq's own "
                "files would be reviewed as notes; move it ([state] dir or --state)"
            )
            state_dir = None  # said once
    # The folders agents must leave alone while they run (every note root's top folder,
    # the gates'): reviewq's own files written there were each review's "change".
    watched = {r.split("/", 1)[0] for r in kb.note_roots if r} | {GATES_DIR.split("/", 1)[0]}
    for tree in sorted(watched):
        if state_dir is not None and _reviewed_inside(kb.root / tree, state_dir):
            problems.append(
                f"the state folder {state_dir} lies in {tree}/, which agents must leave alone "
                "while they run: every review would fail on reviewq's own files; move it "
                "([state] dir or --state)"
            )
    return problems


def require_note_roots(kb: KB, state_dir: Path | None = None) -> None:
    """Refuse (:class:`SelectError`, the first of :func:`note_root_problems`) a KB whose
    notes cannot be read as its notes: every command that reads them says so. `export`
    read a `kb/` linked from outside ROOT as a KB of no notes and removed every review's
    file; `warn-queue` said "0 warning(s)"."""
    for problem in note_root_problems(kb, state_dir):
        raise SelectError(problem)


def partition_problem(store: Store, model: str) -> str | None:
    """Why ``--model`` may be a typo, or None: no review is recorded in it while others
    have some. Every pair read as missing-review, and that select's JSON, piped to
    ``create-jobs``, paid for the whole KB again under the misspelt partition."""
    known = store.partitions_instead(model)
    if not known:
        return None  # reviews recorded in it, or a first review: nothing to tell it from
    return (
        f"--model {model}: no review recorded in this partition (known: {', '.join(known)}); "
        "every pair is missing-review"
    )


def _reviewed_inside(folder: Path, path: Path) -> bool:
    """Whether ``path`` lies in ``folder`` where the note scan goes (no hidden folder on
    the way: those are skipped)."""
    try:
        rel = path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return not any(part.startswith(".") for part in rel.parts)


def keeps_no_status(notes: list[Note]) -> bool:
    """Whether none of ``notes`` (some) has a ``status:`` field: ``--current`` (an
    entry's ``current = true``) then selects nothing, said as a KB all fresh."""
    return bool(notes) and all(n.status is None for n in notes)


def current_hint(notes: list[Note]) -> str | None:
    """Why ``--current`` selects nothing of ``notes``, or None when one is current: no
    ``status:`` field at all, or none that says ``current`` as it must be written (a KB
    whose notes say ``Current`` or ``active`` selected nothing, said as a KB all fresh)."""
    if keeps_no_status(notes):
        return (
            "no note has a status: field, which --current reads (status: current): "
            "nothing is selected"
        )
    if not notes or any(n.status == "current" for n in notes):
        return None
    seen = sorted({repr(n.status) for n in notes if n.status is not None})
    shown = ", ".join(seen[:3]) + (f" and {len(seen) - 3} more" if len(seen) > 3 else "")
    return (
        f"no note has status: current, which --current reads (their status: fields say "
        f"{shown}): nothing is selected"
    )


def select(
    kb: KB,
    catalog: Catalog,
    store: Store,
    *,
    selectors: Sequence[str] = (),
    all_gates: bool = False,
    note_paths: Sequence[str] | None = None,
    current: bool = False,
    model: str | None = None,
    reasons: Iterable[str] | None = None,
    diffs: bool = True,
    cache_dir: Path | None = None,
    memo: bool = False,
    state_dir: Path | None = None,
) -> Selection:
    """Stale pairs for a model partition (or model-agnostic coverage when ``model`` is None).

    With ``cache_dir`` (the state folder) unchanged notes are not read (NoteCache); with
    ``memo`` too, an identical question about an identical KB and state gets the stored
    answer in ``Selection.json_bytes`` (SelectMemo). ``state_dir`` (else ``cache_dir``) is
    refused inside a note root."""
    if not selectors and not all_gates:
        raise SelectError("nothing to select: name bundles, gate ids, 'type', or use --all-gates")
    wanted = set(reasons) if reasons else set(REASONS)
    bad = wanted - set(REASONS)
    if bad:
        raise SelectError(f"unknown reason {sorted(bad)[0]!r}: choose from {', '.join(REASONS)}")

    require_note_roots(kb, state_dir or cache_dir)
    if cache_dir is not None and not cache_dir.exists():
        # A first `select` makes the state folder: as private, and as hidden from git, as
        # the first state.db would have made it. Not by a reader who may not write the KB:
        # select only reads, and without its caches it is only slower.
        with contextlib.suppress(OSError):
            make_state_folder(cache_dir, new=True)
    kb.problems.clear()
    paths = kb.note_files(note_paths)
    cache = NoteCache.open(cache_dir) if cache_dir is not None else None
    notes = kb.load_notes(paths, cache)
    if cache is not None:
        if note_paths is None:
            cache.keep_only(paths)
        cache.save()
    sel = Selection(
        model, problems=list(kb.problems) + list(catalog.problems), excluded=len(kb.excluded)
    )
    if current:
        if (hint := current_hint(notes)) is not None:
            sel.hints.append(hint)
        notes = [n for n in notes if n.status == "current"]
    sel.notes = {n.path: n for n in notes}

    if any(type_selector(s) for s in selectors):  # " type " too, as resolve reads it (C29)
        catalog = catalog.copy()  # the workspace's cached catalog stays as the files say
        known = len(catalog.problems)
        add_note_relative_types(kb, catalog, notes)
        sel.problems.extend(catalog.problems[known:])
    # A lens folder that is there but gives no gate: "not a bundle" sent the person
    # looking for a typo in a name ls shows.
    said = {p.path: p.reason for p in lens_folder_warnings(kb, catalog)}
    for s in selectors:
        if (why := said.get(f"{GATES_DIR}/{s.strip().strip('/')}")) is not None:
            raise SelectionError(f"{s.strip().strip('/')}: not a bundle: {why}")
    gates = catalog.resolve(selectors, all_gates)
    if any(s.strip().strip("/") == "type" for s in selectors):
        # A hint, not a file skipped: the note is reviewed for its other gates.
        sel.hints.extend(untyped_notes(catalog, notes, sel.problems))

    key = None
    if memo and cache_dir is not None:
        extent = store.conn.execute(
            "SELECT COALESCE(MAX(id), 0), count(*) FROM snapshots"
        ).fetchone()
        key = SelectMemo.key(
            "select/3",  # bumped when an answer of the same inputs changes
            model,
            sorted(selectors),
            all_gates,
            note_paths,
            current,
            sorted(wanted),
            diffs,
            # Coverage too: a count of rows is shared by two histories of one state.db
            # (a backup restored, then other pairs reviewed), as the version alone was.
            store.acceptance_state(),
            tuple(extent),
            [(g.gate_id, g.path, g.sha256) for g in gates],
            [(n.path, n.sha256) for n in notes],
            [(p.path, p.reason) for p in sel.problems],
        )
        hit = SelectMemo.open(cache_dir).get(key)
        if hit is not None:
            sel.json_bytes = hit
            return sel
    uncond = [g for g in gates if not (g.is_type or g.requires_type or g.requires_trait)]
    cond = [g for g in gates if g not in uncond]

    if model is None:
        _coverage(sel, store, notes, gates, kb, wanted)
    else:
        # Kept by content alone, so sweeps use it too (the note cache trusts file stamps).
        home = cache_dir or state_dir
        ratios = RatioMemo.open(home) if home is not None else None
        _freshness(
            sel,
            store,
            kb,
            notes,
            uncond,
            cond,
            model,
            wanted,
            diffs,
            note_paths is not None or current,
            ratios,
        )
        if ratios is not None:
            ratios.save()
    sel.targets.sort(key=lambda t: (t.note_path, t.gate_id))
    if key is not None:
        sel.json_bytes = json.dumps(sel.to_json(), ensure_ascii=False).encode("utf-8")
        SelectMemo.open(cache_dir).put(key, sel.json_bytes)
    return sel


def current_notes(kb: KB, cache_dir: Path | None = None) -> dict[str, Note | None]:
    """Every note of the KB by path, read through the note cache of ``cache_dir`` when it
    exists; None for a note file that cannot be read or parsed (select names it)."""
    cache = NoteCache.open(cache_dir) if cache_dir is not None and cache_dir.is_dir() else None
    known = len(kb.problems)
    paths = kb.note_files()
    notes: dict[str, Note | None] = dict.fromkeys(paths)
    notes.update((n.path, n) for n in kb.load_notes(paths, cache))
    del kb.problems[known:]
    if cache is not None:
        cache.keep_only(paths)
        cache.save()
    return notes


def with_note_relative_types(kb: KB, catalog: Catalog, cache_dir: Path | None = None) -> Catalog:
    """A copy of the catalog with the type specs every note names by a path (as ``select
    type`` sees them). A spec that cannot join is among the copy's problems."""
    catalog = catalog.copy()
    notes = current_notes(kb, cache_dir).values()
    add_note_relative_types(kb, catalog, [n for n in notes if n is not None])
    return catalog


def add_note_relative_types(kb: KB, catalog: Catalog, notes: list[Note]) -> None:
    """Type specs that notes name by a path outside the catalog's ``kb/types/*.md`` scan
    (``./types/x.md``, ``../types/sub/x.md``, ``kb/types/sub/x.md``) join the catalog."""
    from orchestrator.kb.gates import type_gate

    for note in notes:
        key = type_key(note.type_value, note.path)
        # kb/types/NAME.md is the scan's to read or refuse; a subfolder of it is not scanned
        # (it may hold templates), and its spec, named by a path, went unreviewed silently.
        if key is None or posixpath.dirname(key) == TYPES_DIR:
            continue
        name = key.rsplit("/", 1)[-1][:-3]
        try:
            kb.check_rel(key)  # a symlink to a file outside the root is no spec of this KB
        except KBError as exc:
            problem = FileProblem(key, str(exc).removeprefix(f"{key}: "))
            said = {p.path for p in (*kb.problems, *catalog.problems)}  # as a note, maybe
            if key not in said:
                catalog.problems.append(problem)
            continue
        taken = catalog.types.get(name)
        if taken is not None and taken.path != key and (kb.root / key).is_file():
            # Type specs are gates by name (type/NAME): this one cannot be one beside the
            # other, and its notes' conformance pairs would go unreviewed without a word.
            problem = FileProblem(
                key,
                f"type spec named like {taken.path} (both are type/{name}); the notes that "
                "name this one get no type review until one of the two is renamed",
            )
            if problem not in catalog.problems:
                catalog.problems.append(problem)
            continue
        if taken is not None or not (kb.root / key).is_file():
            continue
        try:
            catalog.types[name] = type_gate(key, kb.read_bytes(key))
        except (NoteParseError, OSError) as exc:
            catalog.problems.append(FileProblem(key, str(exc)))


def untyped_notes(catalog: Catalog, notes: list[Note], said: list[FileProblem]) -> list[str]:
    """Notes whose ``type:`` names no spec there is (``definiton``): ``type`` asks every
    typed note for its conformance pair, and these got none, without a word (a gate's
    ``requires_type`` of no spec is said). One said already (a spec that cannot join) is
    not said again; past three, the rest are counted."""
    specs = {g.path for g in catalog.types.values()}
    known = {p.path for p in said}
    lines = [
        # The path quoted as the value is: a line break in it split the warning in two.
        f"{note.path}: type {note.type_value.strip()!r} names no type spec (no file "
        f"{repr(key)[1:-1]}): the note has no type pair"
        for note in notes
        if (key := type_key(note.type_value, note.path)) is not None
        and key not in specs
        and key not in known
    ]
    if len(lines) > UNTYPED_NAMED + 1:
        more = len(lines) - UNTYPED_NAMED
        lines[UNTYPED_NAMED:] = [f"… and {more} more note(s) whose type names no type spec"]
    return lines


UNTYPED_NAMED = 3


def _coverage(
    sel: Selection, store: Store, notes: list[Note], gates: list[Gate], kb: KB, wanted: set[str]
) -> None:
    covered = store.partitions_covering()
    for note in notes:
        for gate in gates:
            if not applies(gate, note):
                continue
            if (note.path, gate.gate_id) in covered:
                sel.counts["fresh"] += 1
            else:
                sel.counts[MISSING] += 1
                if MISSING in wanted:
                    sel.targets.append(
                        Target(note.path, gate.gate_id, gate.path, gate.lens, MISSING)
                    )


@dataclass(slots=True)
class _Candidate:
    note: Note
    gate: Gate
    note_snap: int
    gate_snap: int
    gate_fresh: bool
    note_same: bool


def _freshness(
    sel: Selection,
    store: Store,
    kb: KB,
    notes: list[Note],
    uncond: list[Gate],
    cond: list[Gate],
    model: str,
    wanted: set[str],
    diffs: bool,
    note_filter: bool,
    ratios: RatioMemo | None = None,
) -> None:
    by_path = {n.path: n for n in notes}
    gates_by_id = {g.gate_id: g for g in (*uncond, *cond)}
    cur_snaps = store.snapshot_ids((n.path, n.sha256) for n in notes)
    cur = {n.path: cur_snaps.get((n.path, n.sha256), -1) for n in notes}
    gate_snaps = store.snapshot_ids_by_sha(g.sha256 for g in gates_by_id.values())
    fresh_gate_snaps = {
        (g.gate_id, sid) for g in gates_by_id.values() for sid in gate_snaps.get(g.sha256, ())
    }
    candidates: list[_Candidate] = []

    def candidate(note: Note, gate: Gate, note_snap: int, gate_snap: int) -> None:
        fresh_gate = (gate.gate_id, gate_snap) in fresh_gate_snaps
        if note_snap == cur[note.path] and fresh_gate:
            sel.counts["fresh"] += 1
        else:
            candidates.append(
                _Candidate(
                    note, gate, note_snap, gate_snap, fresh_gate, note_snap == cur[note.path]
                )
            )

    def missing(note: Note, gate: Gate) -> None:
        _emit(sel, note, gate, Verdict(MISSING), wanted, None)

    # Unconditional gates: one aggregated pass; only notes that are not wholly fresh
    # (or not wholly covered) are looked at row by row.
    if uncond:
        uncond_by_id = {g.gate_id: g for g in uncond}
        seen: set[str] = set()
        scan = store.scan_acceptance(
            model,
            list(uncond_by_id),
            sorted(fresh_gate_snaps),
            [n.path for n in notes] if note_filter else None,
        )
        for note_path, rows, min_snap, max_snap, stale in scan:
            note = by_path.get(note_path)
            if note is None:
                continue  # accepted once, but no longer a note (or filtered out by --current)
            seen.add(note_path)
            if rows == len(uncond_by_id) and min_snap == max_snap == cur[note_path]:
                stale_records = stale.split("\x1e") if stale else []
                sel.counts["fresh"] += rows - len(stale_records)
                for rec in stale_records:
                    gate_id, gate_snap = rec.split("\x1f")
                    candidates.append(
                        _Candidate(
                            note, uncond_by_id[gate_id], min_snap, int(gate_snap), False, True
                        )
                    )
                continue
            accepted = set()
            for gate_id, note_snap, gate_snap in store.acceptance_rows(model, note_path):
                gate = uncond_by_id.get(gate_id)
                if gate is not None:
                    accepted.add(gate_id)
                    candidate(note, gate, note_snap, gate_snap)
            for gate in uncond:
                if gate.gate_id not in accepted:
                    missing(note, gate)
        for note in notes:
            if note.path not in seen:
                for gate in uncond:
                    missing(note, gate)

    # Conditional gates (requires_type/requires_trait, type specs): few pairs, judged row by row.
    if cond:
        accs = {
            (a.note_path, a.gate_id): a
            for a in store.acceptances_for(model, [g.gate_id for g in cond])
        }
        for note in notes:
            for gate in cond:
                if not applies(gate, note):
                    continue
                acc = accs.get((note.path, gate.gate_id))
                if acc is None:
                    missing(note, gate)
                else:
                    candidate(note, gate, acc.note_snapshot_id, acc.gate_snapshot_id)

    _judge_candidates(sel, store, candidates, wanted, diffs, ratios)


def _judge_candidates(
    sel: Selection,
    store: Store,
    candidates: list[_Candidate],
    wanted: set[str],
    diffs: bool,
    ratios: RatioMemo | None = None,
) -> None:
    existing = store.existing_snapshots(
        {c.note_snap for c in candidates} | {c.gate_snap for c in candidates}
    )
    # Old note texts are needed only where the note changed under a current gate.
    texts = store.snapshot_texts(
        {
            c.note_snap
            for c in candidates
            if c.gate_fresh and not c.note_same and c.note_snap in existing
        }
    )
    comparisons: dict[tuple[str, int], NoteComparison] = {}
    diff_cache: dict[tuple[str, int], str] = {}
    unreadable: set[str] = set()
    for c in candidates:
        key = (c.note.path, c.note_snap)
        if c.note.path in unreadable:
            continue

        def compare(c: _Candidate = c, key: tuple[str, int] = key) -> NoteComparison:
            if key not in comparisons:
                comparisons[key] = NoteComparison(
                    _parse_old(texts[c.note_snap]), c.note.parsed(), ratios
                )
            return comparisons[key]

        try:
            verdict = judge(
                c.gate,
                c.note_snap in existing,
                c.gate_fresh if c.gate_snap in existing else None,
                c.note_same,
                compare,
            )
            diff = None
            if verdict.reason == NOTE_CHANGED and diffs and NOTE_CHANGED in wanted:
                if key not in diff_cache:
                    diff_cache[key] = make_diff(
                        c.note.path, texts.get(c.note_snap, ""), c.note.text
                    )
                diff = diff_cache[key]
        except (NoteParseError, OSError) as exc:
            # Read only now (the scan had its hash): edited, broken or gone since.
            unreadable.add(c.note.path)
            reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
            sel.problems.append(FileProblem(c.note.path, reason))
            continue
        _emit(sel, c.note, c.gate, verdict, wanted, diff)


def _parse_old(text: str) -> ParsedNote:
    try:
        return parse_note_text(text)
    except NoteParseError:
        # An accepted text that no longer parses can only be compared whole.
        return ParsedNote({"unparseable": True}, text)


def _emit(
    sel: Selection, note: Note, gate: Gate, verdict: Verdict, wanted: set[str], diff: str | None
) -> None:
    if verdict.reason is None:
        sel.counts["fresh"] += 1
        return
    sel.counts[verdict.reason] += 1
    if verdict.reason in wanted:
        sel.targets.append(
            Target(
                note.path,
                gate.gate_id,
                gate.path,
                gate.lens,
                verdict.reason,
                verdict.changed_regions,
                verdict.change_ratio,
                diff,
            )
        )
