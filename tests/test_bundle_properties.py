"""Properties of the bundle-output parser (CONTRACT §5): all or nothing, and never a crash."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.review.bundle import (
    DECISIONS,
    ExpectedPair,
    ParseResult,
    end_line,
    parse_bundle,
    start_line,
)

NOTES = ["kb/notes/a.md", "kb/notes/b.md", "kb/notes/sub/c d.md", "kb/notes/ünï.md"]
GATES = [
    "kb/instructions/review-gates/prose/source-residue.md",
    "kb/instructions/review-gates/prose/title.md",
    "kb/instructions/review-gates/meta/x.md",
]
# No verdict words here, and at least two words a line, so generated prose is never
# verdict-like: any rejection of a generated document is the mutation's doing.
WORDS = ["the", "note", "title", "claims", "source", "body", "clear", "minor", "quote",
         "link", "missing", "summary", "residue", "is", "a", "of", "`code`", "**bold**", "naïve"]  # fmt: skip
PREFIXES = ["", "", "- ", "- minor: ", "### ", "> ", "  ", "\t"]

prose_line = st.builds(
    lambda prefix, words: prefix + " ".join(words),
    st.sampled_from(PREFIXES),
    st.lists(st.sampled_from(WORDS), min_size=2, max_size=6),
)
any_line = st.one_of(prose_line, st.sampled_from(["", "   "]))
pad = st.sampled_from(["", " ", "\t", "  "])
pairs_strategy = st.lists(
    st.builds(ExpectedPair, st.sampled_from(NOTES), st.sampled_from(GATES)),
    min_size=1,
    max_size=4,
    unique=True,
)


@dataclass(frozen=True)
class Doc:
    expected: tuple[ExpectedPair, ...]
    decisions: tuple[str, ...]  # per expected pair
    rationales: tuple[str, ...]  # per expected pair
    lines: tuple[str, ...]
    result_at: dict[int, int]  # line index of a result line -> index of its pair
    spans: dict[int, tuple[int, int]]  # index of a pair -> line indexes of its START and END
    newline: str

    def encode(self, lines: tuple[str, ...] | list[str] | None = None) -> bytes:
        return self.newline.join(self.lines if lines is None else lines).encode()


@st.composite
def valid_docs(draw: st.DrawFn) -> Doc:
    expected = tuple(draw(pairs_strategy))
    decisions = tuple(draw(st.sampled_from(DECISIONS)) for _ in expected)
    bodies = [draw(st.lists(any_line, max_size=5)) for _ in expected]
    lines: list[str] = []
    result_at: dict[int, int] = {}
    spans: dict[int, tuple[int, int]] = {}
    for index in draw(st.permutations(range(len(expected)))):
        pair = expected[index]
        lines += draw(st.lists(any_line, max_size=2))  # text outside blocks
        first = len(lines)
        lines.append(draw(pad) + start_line(pair.note_path, pair.gate_path) + draw(pad))
        lines += bodies[index]
        result_at[len(lines)] = index
        lines.append(draw(pad) + f"## Result: {decisions[index]}" + draw(pad))
        lines += draw(st.lists(st.sampled_from(["", " "]), max_size=2))
        spans[index] = (first, len(lines))
        lines.append(draw(pad) + end_line(pair.note_path, pair.gate_path) + draw(pad))
    lines += draw(st.lists(any_line, max_size=2))
    return Doc(
        expected=expected,
        decisions=decisions,
        rationales=tuple("\n".join(body).strip() for body in bodies),
        lines=tuple(lines),
        result_at=result_at,
        spans=spans,
        newline=draw(st.sampled_from(["\n", "\r\n"])),
    )


def dangerous_lines(expected: tuple[ExpectedPair, ...]) -> list[str]:
    lines = [
        "",
        "## Result: PASS",
        "## Result: FAIL",
        "## Result: WARN",
        "## Result: ERROR",
        "## Result: OK",
        "## Result: pass",
        "Verdict: PASS",
        "**Decision:** FAIL",
        "OK",
        "INFO",
        "=== something ===",
        "=== PAIR REVIEW START: kb/notes/a.md ===",
        start_line("kb/notes/zzz.md", GATES[0]),
        end_line("kb/notes/zzz.md", GATES[0]),
        start_line("kb/notes/../../etc/passwd", GATES[0]),
        start_line("/etc/passwd", GATES[0]),
    ]
    for pair in expected:
        lines += [
            start_line(pair.note_path, pair.gate_path),
            end_line(pair.note_path, pair.gate_path),
        ]
    return lines


def positions(doc: Doc) -> st.SearchStrategy[int]:
    """Any line, often a structural one or its neighbour, where mutations do the most harm."""
    structural = {i for span in doc.spans.values() for i in span} | set(doc.result_at)
    near = sorted({min(max(i + d, 0), len(doc.lines) - 1) for i in structural for d in (-1, 0, 1)})
    return st.one_of(st.integers(0, len(doc.lines) - 1), st.sampled_from(near))


def assert_all_or_nothing(result: ParseResult) -> None:
    assert result.ok == (not result.reasons)
    if not result.ok:
        assert result.results == ()


def decisions_of(result: ParseResult) -> list[tuple[str, str, str]]:
    return [(r.note_path, r.gate_path, r.decision) for r in result.results]


@settings(max_examples=150, deadline=None)
@given(valid_docs())
def test_valid_outputs_are_accepted_with_exactly_their_decisions(doc: Doc) -> None:
    result = parse_bundle(doc.encode(), doc.expected)
    assert result.ok, result.reasons
    assert decisions_of(result) == [
        (pair.note_path, pair.gate_path, decision)
        for pair, decision in zip(doc.expected, doc.decisions, strict=True)
    ]
    assert tuple(r.rationale for r in result.results) == doc.rationales


@settings(max_examples=200, deadline=None)
@given(valid_docs(), st.data())
def test_a_mutated_output_is_accepted_unchanged_or_rejected_never_half_accepted(
    doc: Doc, data: st.DataObject
) -> None:
    lines = list(doc.lines)
    decisions = list(doc.decisions)
    kind = data.draw(
        st.sampled_from(["delete", "duplicate", "swap", "insert", "char", "cut", "copy-block"])
    )
    index = data.draw(positions(doc))
    if kind == "delete":
        del lines[index]
    elif kind == "duplicate":
        lines.insert(index, lines[index])
    elif kind == "swap":
        other = data.draw(positions(doc))
        lines[index], lines[other] = lines[other], lines[index]
        if index in doc.result_at and other in doc.result_at:
            # Two result lines trading places is a well-formed output with different
            # answers; no parser can tell, so the oracle follows the swap.
            a, b = doc.result_at[index], doc.result_at[other]
            decisions[a], decisions[b] = decisions[b], decisions[a]
    elif kind == "insert":
        lines.insert(index, data.draw(st.sampled_from(dangerous_lines(doc.expected))))
    elif kind == "copy-block":
        # A second, well-formed block for a pair, possibly with another answer.
        first, last = doc.spans[data.draw(st.integers(0, len(doc.expected) - 1))]
        copy = [
            f"## Result: {data.draw(st.sampled_from(DECISIONS))}" if i in doc.result_at else line
            for i, line in enumerate(lines[first : last + 1], first)
        ]
        lines[index:index] = copy
    encoded = doc.encode(lines)
    if kind == "char":
        text = doc.newline.join(lines)
        at = data.draw(st.integers(0, len(text) - 1))
        new = data.draw(st.sampled_from(["\n", "\r", " ", "#", "=", ":", "X", "a", "é", "\x85"]))
        encoded = (text[:at] + new + text[at + 1 :]).encode()
    elif kind == "cut":
        encoded = encoded[: data.draw(st.integers(0, len(encoded)))]

    result = parse_bundle(encoded, doc.expected)
    assert_all_or_nothing(result)
    if result.ok:
        assert decisions_of(result) == [
            (pair.note_path, pair.gate_path, decision)
            for pair, decision in zip(doc.expected, decisions, strict=True)
        ]


@settings(max_examples=200, deadline=None)
@given(valid_docs(), st.data())
def test_one_dangerous_line_next_to_a_sentinel_or_result_line_never_changes_an_answer(
    doc: Doc, data: st.DataObject
) -> None:
    # The general test above spreads its examples thin; this one aims at the seams of blocks.
    structural = {i for span in doc.spans.values() for i in span} | set(doc.result_at)
    index = data.draw(st.sampled_from(sorted(structural | {i + 1 for i in structural})))
    lines = list(doc.lines)
    lines.insert(index, data.draw(st.sampled_from(dangerous_lines(doc.expected))))
    result = parse_bundle(doc.encode(lines), doc.expected)
    assert_all_or_nothing(result)
    if result.ok:
        assert decisions_of(result) == decisions_of(parse_bundle(doc.encode(), doc.expected))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096), pairs_strategy, st.integers(0, 5000))
def test_arbitrary_bytes_never_raise(data: bytes, expected: list[ExpectedPair], limit: int) -> None:
    assert_all_or_nothing(parse_bundle(data, expected))
    assert_all_or_nothing(parse_bundle(data, expected, max_bytes=limit))


@settings(max_examples=200, deadline=None)
@given(pairs_strategy, st.data())
def test_outputs_built_from_dangerous_lines_never_raise(
    expected: list[ExpectedPair], data: st.DataObject
) -> None:
    pieces = st.one_of(
        st.sampled_from(dangerous_lines(tuple(expected))), any_line, st.text(max_size=30)
    )
    lines = data.draw(st.lists(pieces, max_size=30))
    newline = data.draw(st.sampled_from(["\n", "\r\n", "\r", "\u2028"]))
    assert_all_or_nothing(parse_bundle(newline.join(lines).encode(), expected))
