"""CONTRACT §3: why one (note, gate) pair needs a review, judged against its accepted snapshots.

Pure functions over texts: the selector gathers the texts and calls :func:`judge`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from orchestrator.kb.gates import Gate
from orchestrator.kb.notes import REGIONS, ParsedNote

MISSING = "missing-review"
GATE_CHANGED = "gate-changed"
NOTE_CHANGED = "note-changed"
REASONS = (MISSING, GATE_CHANGED, NOTE_CHANGED)


@dataclass(frozen=True, slots=True)
class Verdict:
    reason: str | None  # None: fresh
    changed_regions: tuple[str, ...] = ()
    change_ratio: float | None = None


FRESH = Verdict(None)


class RatioMemo(Protocol):
    def ratio(
        self, old: list[str], new: list[str], measure: Callable[[], Fraction]
    ) -> Fraction: ...


def change_ratio(old_body: str, new_body: str, memo: RatioMemo | None = None) -> Fraction:
    """1 - SequenceMatcher ratio over body lines, exactly as CONTRACT §3 defines it, as an
    exact fraction: in floating point, 3 of 10 lines changed came out as
    0.30000000000000004, over a ``rewrite(0.3)`` threshold the contract says it is not.
    ``memo`` keeps the ratios of long bodies from one select to the next."""
    a, b = old_body.splitlines(), new_body.splitlines()
    if not a and not b:
        return Fraction(0)

    def measure() -> Fraction:
        matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
        matched = sum(block.size for block in matcher.get_matching_blocks())
        return 1 - Fraction(2 * matched, len(a) + len(b))

    return memo.ratio(a, b, measure) if memo is not None else measure()


class NoteComparison:
    """The regions of an accepted note text against the current one, computed once and
    shared by every gate judged on the same pair of texts."""

    __slots__ = ("changed", "_old_body", "_new_body", "_ratio", "_memo")
    _ratio: Fraction | None

    def __init__(self, old: ParsedNote, new: ParsedNote, memo: RatioMemo | None = None) -> None:
        old_r, new_r = old.regions(), new.regions()
        self.changed = tuple(r for r in REGIONS if old_r[r] != new_r[r])
        self._old_body, self._new_body = old.body, new.body
        self._ratio = None
        self._memo = memo

    @property
    def ratio(self) -> Fraction:
        if self._ratio is None:
            self._ratio = change_ratio(self._old_body, self._new_body, self._memo)
        return self._ratio

    def verdict(self, gate: Gate) -> Verdict:
        watched_changed = [r for r in self.changed if r in gate.watches]
        if not watched_changed:
            return FRESH  # only unwatched regions differ
        ratio = self.ratio if "body" in self.changed else None
        shown = float(ratio) if ratio is not None else None
        if any(r != "body" for r in watched_changed) or gate.threshold is None:
            return Verdict(NOTE_CHANGED, self.changed, shown)
        # Only the body is watched-and-changed, under rewrite(T): measured against the
        # accepted snapshot, so small edits add up until they cross T. T as written
        # (0.3 is 3/10, not the float nearest it).
        if ratio is not None and ratio > Fraction(str(gate.threshold)):
            return Verdict(NOTE_CHANGED, self.changed, shown)
        return FRESH


def judge(
    gate: Gate,
    note_snapshot_present: bool,
    gate_text_same: bool | None,
    note_text_same: bool,
    compare: Callable[[], NoteComparison],
) -> Verdict:
    """One pair's verdict, rules 1-4 of CONTRACT §3 in order.

    ``note_snapshot_present`` False: no acceptance, or its note snapshot is gone;
    ``gate_text_same`` None: its gate snapshot is gone. ``compare`` builds (or fetches
    from a cache) the region comparison, needed only when the note text differs.
    """
    if not note_snapshot_present or gate_text_same is None:
        return Verdict(MISSING)
    if not gate_text_same:
        return Verdict(GATE_CHANGED)
    if note_text_same:
        return FRESH
    return compare().verdict(gate)


def unified_diff(path: str, old: str, new: str) -> str:
    """A diff that ``patch`` and ``git apply`` take. A line ends at a line feed alone
    (str.splitlines also ended one at a form feed or U+2028), and a line with no end (a
    note's last, with no final newline) gets the marker diff(1) gives it: it was glued
    to the next line of the diff ("-old last+new last")."""
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
        for line in difflib.unified_diff(
            _lines(old), _lines(new), fromfile=f"a/{path}", tofile=f"b/{path}"
        )
    )


def _lines(text: str) -> list[str]:
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]
