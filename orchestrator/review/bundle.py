"""The reviewer output contract: parsing ``bundle-output.md`` all or nothing (CONTRACT §4, §5).

A review job asks one agent to judge several (note, gate) pairs. It writes one file that
holds exactly one block per expected pair, named by the note path and the gate *path*::

    === PAIR REVIEW START: kb/notes/x.md :: kb/instructions/review-gates/prose/g.md ===
    ...any markdown: the rationale...
    ## Result: WARN
    === PAIR REVIEW END: kb/notes/x.md :: kb/instructions/review-gates/prose/g.md ===

- Lines are compared with surrounding whitespace stripped, so CRLF and indentation are
  fine. Every Unicode line break counts as one (``str.splitlines``), both here and in
  :func:`sentinel_like_lines`, so the parser and the check that refuses notes and gates
  holding sentinel-like lines always agree on what a line is.
- Text outside blocks is ignored, except a line that claims to be a pair sentinel and is
  malformed.
- The last non-empty line of a block is exactly ``## Result: PASS|WARN|FAIL|ERROR``. No
  other line in the block may look like a verdict (another result line, a ``Verdict:`` or
  ``Decision`` label or heading, a bare ``OK``/``FAIL``...), and aliases such as
  ``## Result: pass`` or ``## Result: INFO`` are invalid.
- Any defect rejects the whole output: :attr:`ParseResult.results` is then empty and
  :attr:`ParseResult.reasons` lists every defect found, each naming its line and pair, so
  a retry prompt can say everything that was wrong at once.

The module is pure (no I/O) and :func:`parse_bundle` never raises on bad output.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from orchestrator.kb.notes import PAIR_SEP as _SEP
from orchestrator.kb.notes import name_problem

SENTINEL_LIKE: re.Pattern[str] = re.compile(r"^===\s.+\s===$")
DECISIONS = ("PASS", "WARN", "FAIL", "ERROR")
_MISSING = "missing pair: "
_MISSING_SOME = " pairs missing from the output: "  # after the count: see condensed
DEFAULT_MAX_BYTES = 5 * 1024 * 1024
# Reasons kept, then a count: a forged 5 MiB output can carry a million, which no retry
# prompt or person needs, and building them all took hundreds of megabytes.
MAX_REASONS = 50
_MORE = re.compile(r"\.\.\. and (\d+) more problem\(s\)")

_RESULT_SHAPE = "'## Result: " + "|".join(DECISIONS) + "'"
_PAIR_SENTINEL = re.compile(r"=== PAIR REVIEW (START|END): (.+) ===")
_RESULT_LINE = re.compile(r"## Result: (" + "|".join(DECISIONS) + ")")
_RESULT_HEADING = re.compile(r"#+\s*result\s*:", re.IGNORECASE)
# Markdown that can dress up a verdict: headings, quotes, bullets, numbering, emphasis.
_DECORATION = re.compile(r"[\s#>*_+\-]*(?:\d+[.)]\s+)?[\s*_]*")
# A label or heading ("Verdict: PASS", "**Decision**", "## Outcome") rather than prose
# that merely starts with the word ("Result of the check...").
_VERDICT_LABEL = re.compile(
    r"(?:final\s+|overall\s+)?(?:result|verdict|outcome|decision)s?"
    r"(?:[\s*_]*(?:[:=]|[-–—](?:\s|$))|[\s*_.!]*$)",
    re.IGNORECASE,
)
_VERDICT_WORD = re.compile(r"(?:PASS|WARN|FAIL|ERROR|INFO|OK|UNKNOWN|PASSED|FAILED)", re.IGNORECASE)
_SLICE = 64 * 1024
_INVISIBLE = re.compile("[\u00ad\u200b-\u200f\u2060-\u2064\ufeff]")
_LEADING_INVISIBLE = re.compile("^[\u00ad\u200b-\u200f\u2060-\u2064\ufeff]+")
_SHOW_LIMIT = 200  # room for a real pair name, not for a megabyte line


@dataclass(frozen=True)
class ExpectedPair:
    note_path: str
    gate_path: str


@dataclass(frozen=True)
class PairResult:
    note_path: str
    gate_path: str
    decision: str  # one of DECISIONS
    rationale: str  # the block between START and the result line, stripped, "\n" line ends


@dataclass(frozen=True)
class ParseResult:
    results: tuple[PairResult, ...]  # empty unless ok; in the order of `expected`
    reasons: tuple[str, ...]  # empty iff ok

    @property
    def ok(self) -> bool:
        return not self.reasons


class _Reasons(list):
    """The first :data:`MAX_REASONS` reasons; those after them are only counted."""

    more = 0

    def append(self, reason: str) -> None:
        if len(self) < MAX_REASONS:
            super().append(reason)
        else:
            self.more += 1

    def extend(self, reasons) -> None:  # noqa: ANN001 - any iterable of reasons
        for reason in reasons:
            self.append(reason)

    def first(self, reason: str) -> None:
        """``reason`` before all others, the last one kept then counted instead."""
        self.insert(0, reason)
        if len(self) > MAX_REASONS:
            self.pop()
            self.more += 1

    def done(self) -> list[str]:
        return [*self, f"... and {self.more} more problem(s)"] if self.more else list(self)


def problem_count(reasons: Sequence[str]) -> int:
    """How many problems ``reasons`` stand for, those the cap left out counted."""
    more = _MORE.fullmatch(reasons[-1]) if reasons else None
    return len(reasons) - 1 + int(more.group(1)) if more else len(reasons)


def condensed(reasons: Sequence[str]) -> list[str]:
    """``reasons`` with their missing pairs said once, each note named once: a job whose
    output held none of its pairs read "missing pair: N :: G1; missing pair: N :: G2; …"
    in every heading that quoted it. One missing pair is left as it is."""
    missing = [r.removeprefix(_MISSING) for r in reasons if r.startswith(_MISSING)]
    if len(missing) < 2:
        return list(reasons)
    gates: dict[str, list[str]] = {}
    for key in missing:
        note, _, gate = key.partition(_SEP)
        gates.setdefault(note, []).append(gate)
    said = "; ".join(f"{note}{_SEP}{', '.join(g)}" for note, g in gates.items())
    first = next(i for i, r in enumerate(reasons) if r.startswith(_MISSING))
    rest = [r for r in reasons if not r.startswith(_MISSING)]
    return [*rest[:first], f"{len(missing)}{_MISSING_SOME}{said}", *rest[first:]]


def missing_named(reason: str) -> set[tuple[str, str]] | None:
    """The (note, gate path) pairs a missing-pair reason names, one or :func:`condensed`'s
    several; None for any other reason. Its text holds every note and gate of them, so
    a pair whose note and gate are both named in it need not be one of them."""
    if reason.startswith(_MISSING):
        note, _, gate = reason.removeprefix(_MISSING).partition(_SEP)
        return {(note, gate)}
    count, sep, said = reason.partition(_MISSING_SOME)
    if not sep or not count.isdigit():
        return None
    named = set()
    for group in said.split("; "):
        note, _, gates = group.partition(_SEP)
        named |= {(note, gate) for gate in gates.split(", ")}
    return named


def start_line(note_path: str, gate_path: str) -> str:
    return f"=== PAIR REVIEW START: {note_path}{_SEP}{gate_path} ==="


def end_line(note_path: str, gate_path: str) -> str:
    return f"=== PAIR REVIEW END: {note_path}{_SEP}{gate_path} ==="


def sentinel_like_lines(text: str) -> list[int]:
    """1-based numbers of the lines of `text` that could be taken for a review sentinel."""
    return [n for n, raw in enumerate(_lines(text), 1) if SENTINEL_LIKE.match(raw.strip())]


def parse_bundle(
    data: bytes | None,
    expected: Sequence[ExpectedPair],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ParseResult:
    """Check a reviewer's output against the pairs of its job; accept all of it or none."""
    keys, invalid = _expected_keys(expected)
    reasons = _Reasons()
    reasons.extend(invalid)
    if data is None:
        reasons.append("output file is missing")
        return _rejected(reasons.done())
    # Measured before decoding so that a runaway agent cannot make us decode gigabytes.
    if len(data) > max_bytes:
        # One byte past the limit is what a reader that stops there hands over
        # (read_output): the file's size is not known then, only that it is over.
        size = f"{len(data)} bytes, over" if len(data) > max_bytes + 1 else "larger than"
        reasons.append(f"output is {size} the {max_bytes}-byte limit")
        return _rejected(reasons.done())
    if empty := emptiness(data):
        reasons.append(empty)
        return _rejected(reasons.done())
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        # Decoded lossily, every pair of it read as missing: the one defect is the encoding.
        reasons.append(
            "output is UTF-16 (it begins with a UTF-16 byte-order mark): save it as UTF-8"
        )
        return _rejected(reasons.done())
    bad: tuple[int, str] | None = None  # where the first byte that is not UTF-8 is
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Said by _scan with its line and block: the byte's offset alone found nothing.
        # Keep going on a lossy decoding: the retry prompt should list every other defect too.
        text = data.decode("utf-8", errors="replace")
        at = len(data[: exc.start].decode("utf-8"))  # what comes before it is UTF-8
        bad = (at, f"output is not UTF-8 (byte {exc.start})")
    if text.startswith("\ufeff"):
        text = text[1:]
        if bad is not None:
            bad = (bad[0] - 1, bad[1])
    found = _scan(text, keys, reasons, bad)
    if reasons:
        return _rejected(reasons.done())
    return ParseResult(
        results=tuple(
            PairResult(pair.note_path, pair.gate_path, *found[key]) for key, pair in keys.items()
        ),
        reasons=(),
    )


def emptiness(data: bytes) -> str | None:
    """How an output holds nothing, or None. An editor's byte-order mark alone, or the NULs
    a crash leaves of a file's size, are nothing written too: read as text, every pair of
    the job would be "missing", sending the retry and the person after pairs. The one
    reading of "empty": an attempt's agent that failed and left such a file wrote nothing."""
    body = data.removeprefix(b"\xef\xbb\xbf")
    if rest := body.strip(b" \t\r\n\x0b\x0c\0"):
        return _unicode_spaces(rest)
    if nuls := body.count(b"\0"):
        return f"output is empty ({nuls} NUL byte{'s' if nuls > 1 else ''})"
    return (
        "output is empty" if len(body) == len(data) else "output is empty (a byte-order mark alone)"
    )


def _unicode_spaces(rest: bytes) -> str | None:
    """How ``rest`` (an output's bytes past its ASCII blanks) holds nothing but Unicode
    spaces (U+00A0, U+3000, U+2028 …), or None: read as text, such an output was every
    pair "missing" as E64's were. Decoded only when it starts past ASCII: an output with
    a pair in it starts with one (and a large one is not decoded twice for this)."""
    if rest[0] < 0x80:
        return None
    try:
        text = rest.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if text.replace("\0", "").strip():
        return None
    spaces = sorted({f"U+{ord(c):04X}" for c in text if ord(c) > 0x7F})
    return f"output is empty (only Unicode spaces: {', '.join(spaces[:5])})"


@dataclass
class _Block:
    """An open block. Its lines are not kept: an output of millions of short lines must
    cost memory in proportion to its size, not a tuple per line."""

    key: str
    name: str  # how reasons show the pair
    start: int  # line number of its START
    body_start: int  # offset in the text of the line after START
    sound: bool = True
    # The last non-empty line so far: (line number, stripped text, offset of the line).
    last: tuple[int, str, int] | None = None


def _scan(
    text: str,
    keys: dict[str, ExpectedPair],
    reasons: _Reasons,
    bad: tuple[int, str] | None = None,
) -> dict[str, tuple[str, str]]:
    """Walk the lines once; return (decision, rationale) per good block, and add every
    defect to ``reasons``. ``bad``: the offset in ``text`` of a byte that was not UTF-8,
    and the reason to say, on its line, first: the file's own defect, past the cap only
    counted, met the retry that mended the rest again."""
    found: dict[str, tuple[str, str]] = {}
    first_start: dict[str, int] = {}
    block: _Block | None = None
    folded: dict[str, str | None] | None = None  # built when a name is not found as is
    for number, (offset, raw, after) in enumerate(_iter_lines(text), 1):
        if bad is not None and bad[0] < after:
            where = f" in block for {block.name}" if block is not None else ""
            reasons.first(f"line {number}: {bad[1]}{where}")
            bad = None
        line = raw.strip()
        if not (line.startswith("===") and SENTINEL_LIKE.match(line)):
            if (line[:1] in "=*_" or _INVISIBLE.match(line)) and _near_sentinel(line):
                # Named as what it is: taken as text, an END copied without its space
                # made the block's good result line "extra" and the next START "nested".
                reasons.append(
                    f"line {number}: malformed sentinel (copy it exactly): {_show(line)}"
                )
                continue
            if block is not None and line:
                if block.last is not None:
                    # No longer the last line, so it must not read as a verdict.
                    _check_inner(block, *block.last[:2], reasons)
                block.last = (number, line, offset)
            continue
        match = _PAIR_SENTINEL.fullmatch(line)
        if match is None:
            if block is not None:
                reasons.append(
                    f"line {number}: forged or unknown sentinel in block for {block.name}: "
                    f"{_show(line)}"
                )
            elif "PAIR REVIEW" in line.upper():
                reasons.append(f"line {number}: malformed sentinel: {_show(line)}")
            continue
        kind, key = match.groups()
        if key not in keys:
            if folded is None:
                folded = _folded(keys)
            key = folded.get(_fold(key)) or key
        if _SEP not in key:
            reasons.append(
                f"line {number}: malformed sentinel, no ' :: ' between note and gate: {_show(line)}"
            )
            continue
        name = key if key in keys else _show(key)
        if kind == "START":
            if block is not None:
                reasons.append(
                    f"line {number}: nested START for {name} inside {block.name} "
                    f"(START at line {block.start})"
                )
            if key not in keys:
                reasons.append(f"line {number}: unexpected pair: {name}")
            elif key in first_start:
                reasons.append(
                    f"line {number}: duplicated pair: {name} "
                    f"(first START at line {first_start[key]})"
                )
            else:
                first_start[key] = number
            block = _Block(key, name, number, after)
        elif block is None:
            reasons.append(f"line {number}: END without START for {name}")
        elif key != block.key:
            reasons.append(
                f"line {number}: END for {name} does not match the open block for "
                f"{block.name} (START at line {block.start})"
            )
            block = None
        else:
            # An unexpected pair is reported once; picking apart its content adds only noise.
            if key in keys:
                outcome = _judge(text, block, reasons)
                if outcome is not None:
                    found.setdefault(key, outcome)
            block = None
    if bad is not None:  # never left unsaid: the reason is what refuses the lossy text
        reasons.first(bad[1])
    if block is not None:
        reasons.append(f"line {block.start}: unterminated block for {block.name} (no END)")
    reasons.extend(f"{_MISSING}{key}" for key in keys if key not in first_start)
    return found


def _folded(keys: dict[str, ExpectedPair]) -> dict[str, str | None]:
    """Expected keys by :func:`_fold`, None where two share one: a name saved decomposed
    on a Mac and copied composed by a model, or one whose zero-width space or soft hyphen
    the model left out (or put in), names that pair. Copied exactly but for what no
    reader sees, it was "unexpected" and "missing" in two reasons that print the same."""
    out: dict[str, str | None] = {}
    for k in keys:
        f = _fold(k)
        out[f] = None if f in out else k
    return out


def _fold(key: str) -> str:
    """A pair's name as a reader sees it: composed, without invisible characters."""
    return key if key.isascii() else _INVISIBLE.sub("", unicodedata.normalize("NFC", key))


def _near_sentinel(line: str) -> bool:
    """A line meant as a sentinel but not shaped as one (a space left out, bold around
    it). In backticks it is code: a rationale may quote a sentinel so."""
    # An invisible character before it (a byte-order mark where two files were joined)
    # leaves a line that looks like a sentinel in every editor.
    bare = _LEADING_INVISIBLE.sub("", line).strip("*_ \t")
    return bare.startswith("===") and "PAIR REVIEW" in bare[:40].upper()


def _check_inner(block: _Block, number: int, line: str, reasons: list[str]) -> None:
    """Report a line before the last of a block that reads as a result or a verdict."""
    view = _verdict_view(line)
    if _RESULT_LINE.fullmatch(view) or _RESULT_HEADING.match(view):
        problem = "extra result line"
    elif _looks_like_verdict(view):
        problem = "verdict-like line"
    else:
        return
    reasons.append(f"line {number}: {problem} in block for {block.name}: {_show(line)}")
    block.sound = False


def _judge(text: str, block: _Block, reasons: list[str]) -> tuple[str, str] | None:
    """The (decision, rationale) of a closed block, or None after reporting its defects."""
    if block.last is None:
        reasons.append(f"line {block.start}: empty block for {block.name}")
        return None
    last_number, last, last_offset = block.last
    result = _RESULT_LINE.fullmatch(last)
    if result is None:
        view = _verdict_view(last)
        if _RESULT_HEADING.match(view) or _looks_like_verdict(view):
            reasons.append(
                f"line {last_number}: invalid result line for {block.name}: {_show(last)}, "
                f"must be {_RESULT_SHAPE}"
            )
        else:
            reasons.append(
                f"line {block.start}: missing result line for {block.name}: "
                f"its last non-empty line must be {_RESULT_SHAPE}"
            )
        return None
    if not block.sound:
        return None
    rationale = text[block.body_start : last_offset].strip()
    return result.group(1), "\n".join(rationale.splitlines())


def _verdict_view(line: str) -> str:
    """The line as a reader sees it: look-alike letters folded (fullwidth "ＦＡＩＬ" is
    "FAIL"), invisible characters and code backticks dropped."""
    if line.isascii():
        return line.replace("`", "").strip() if "`" in line else line
    return _INVISIBLE.sub("", unicodedata.normalize("NFKC", line)).replace("`", "").strip()


def _looks_like_verdict(line: str) -> bool:
    core = _DECORATION.sub("", line, count=1)
    if _VERDICT_LABEL.match(core):
        return True
    # A bare verdict word is short; the length bound keeps rstrip off megabyte-long lines.
    return len(core) <= 40 and _VERDICT_WORD.fullmatch(core.rstrip("*_.!: \t")) is not None


def _expected_keys(expected: Sequence[ExpectedPair]) -> tuple[dict[str, ExpectedPair], list[str]]:
    """Sentinel pair text -> pair, in the caller's order (duplicates collapsed); bad pairs."""
    keys: dict[str, ExpectedPair] = {}
    reasons: list[str] = []
    for pair in expected:
        key = f"{pair.note_path}{_SEP}{pair.gate_path}"
        problem = _path_problem(pair.note_path) or _path_problem(pair.gate_path)
        if problem:
            # Such a pair could name a file outside the KB or be matched ambiguously, so it
            # is never expected: a block naming it is reported as unexpected.
            reasons.append(f"invalid expected pair: {_show(key)} ({problem})")
        else:
            keys.setdefault(key, pair)
    if not expected:
        reasons.append("no expected pairs")
    return keys, reasons


def _path_problem(path: str) -> str | None:
    if not path or path != path.strip():
        return "empty or padded path"
    if path.startswith("/") or re.match(r"[A-Za-z]:", path):
        return "not a relative path with / separators"
    if problem := name_problem(path):
        return problem
    segments = path.split("/")
    if ".." in segments:
        return "'..' segment"
    if "." in segments or "" in segments:
        return "not a normalised path ('.' or empty segment)"
    return None


def _lines(text: str) -> list[str]:
    return text.removeprefix("\ufeff").splitlines()


def _iter_lines(text: str) -> Iterator[tuple[int, str, int]]:
    """(offset, line with its break, offset after it) for each line, split exactly as
    ``str.splitlines`` splits. The text is split in slices of about 64 KiB ending at a
    "\n", so a list of lines never holds more than one slice's worth."""
    pos, end = 0, len(text)
    while pos < end:
        cut = text.find("\n", pos + _SLICE)
        cut = end if cut == -1 else cut + 1
        for line in text[pos:cut].splitlines(keepends=True):
            after = pos + len(line)
            yield pos, line, after
            pos = after


def _show(text: str) -> str:
    """Quote text from the output for a reason: bounded, and with control characters escaped."""
    if len(text) > _SHOW_LIMIT:
        text = text[: _SHOW_LIMIT - 1] + "…"
    return repr(text)


def _rejected(reasons: list[str]) -> ParseResult:
    return ParseResult(results=(), reasons=tuple(reasons))
