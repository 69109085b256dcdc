"""Examples of the bundle-output contract (CONTRACT §5): what is accepted, and every rejection."""

from __future__ import annotations

import pytest

from orchestrator.review.bundle import (
    DECISIONS,
    DEFAULT_MAX_BYTES,
    MAX_REASONS,
    SENTINEL_LIKE,
    ExpectedPair,
    ParseResult,
    end_line,
    parse_bundle,
    problem_count,
    sentinel_like_lines,
    start_line,
)

GATE = "kb/instructions/review-gates/prose/source-residue.md"
A = ExpectedPair("kb/notes/a.md", GATE)
B = ExpectedPair("kb/notes/b.md", GATE)
C = ExpectedPair("kb/notes/sub/c.md", "kb/instructions/review-gates/meta/title.md")
KEY_A = f"{A.note_path} :: {A.gate_path}"
KEY_B = f"{B.note_path} :: {B.gate_path}"


def start(pair: ExpectedPair) -> str:
    return start_line(pair.note_path, pair.gate_path)


def end(pair: ExpectedPair) -> str:
    return end_line(pair.note_path, pair.gate_path)


def block(pair: ExpectedPair, body: str = "Looks fine.", result: str = "## Result: PASS") -> str:
    return f"{start(pair)}\n{body}\n{result}\n{end(pair)}\n"


def parse(text: str, expected: tuple[ExpectedPair, ...] = (A,), **kwargs: int) -> ParseResult:
    return parse_bundle(text.encode(), expected, **kwargs)


def assert_rejected(result: ParseResult, *fragments: str) -> None:
    assert not result.ok
    assert result.results == ()
    for fragment in fragments:
        assert any(fragment in reason for reason in result.reasons), (fragment, result.reasons)


# --- the API's fixed parts -------------------------------------------------------------


def test_sentinel_lines_have_the_documented_shape() -> None:
    assert start_line("kb/notes/x.md", GATE) == (
        f"=== PAIR REVIEW START: kb/notes/x.md :: {GATE} ==="
    )
    assert end_line("kb/notes/x.md", GATE) == f"=== PAIR REVIEW END: kb/notes/x.md :: {GATE} ==="
    assert SENTINEL_LIKE.match(start_line("kb/notes/x.md", GATE))
    assert DECISIONS == ("PASS", "WARN", "FAIL", "ERROR")
    assert DEFAULT_MAX_BYTES == 5 * 1024 * 1024


def test_sentinel_like_lines_finds_every_line_that_could_pass_for_a_sentinel() -> None:
    text = "\n".join(
        [
            "# Title",  # 1
            "=== PAIR REVIEW START: a :: b ===",  # 2
            "  === anything at all ===  ",  # 3: surrounding whitespace is stripped
            "===no spaces===",  # 4: not sentinel-like
            "text === inside === text",  # 5
            "=== x ===\r",  # 6
        ]
    )
    assert sentinel_like_lines(text) == [2, 3, 6]
    assert sentinel_like_lines("") == []
    assert sentinel_like_lines("\ufeff=== at the start ===\n") == [1]


# --- accepted outputs --------------------------------------------------------------------


def test_one_pair_is_accepted_with_its_decision_and_rationale() -> None:
    result = parse(block(A, body="## Summary\nThe note is clean.\n\n- minor: a stray link"))
    assert result.ok
    assert result.reasons == ()
    [pair] = result.results
    assert (pair.note_path, pair.gate_path, pair.decision) == (A.note_path, A.gate_path, "PASS")
    assert pair.rationale == "## Summary\nThe note is clean.\n\n- minor: a stray link"


def test_several_pairs_come_back_in_the_order_expected_whatever_the_file_order() -> None:
    text = (
        block(C, result="## Result: ERROR")
        + block(A, result="## Result: WARN")
        + block(B, result="## Result: FAIL")
    )
    result = parse(text, (A, B, C))
    assert result.ok
    assert [(r.note_path, r.gate_path, r.decision) for r in result.results] == [
        (A.note_path, A.gate_path, "WARN"),
        (B.note_path, B.gate_path, "FAIL"),
        (C.note_path, C.gate_path, "ERROR"),
    ]


def test_crlf_line_ends_are_accepted_and_the_rationale_uses_newlines() -> None:
    text = block(A, body="first line\r\nsecond line", result="## Result: WARN")
    result = parse(text.replace("\n", "\r\n").replace("\r\r", "\r"))
    assert result.ok
    assert result.results[0].decision == "WARN"
    assert result.results[0].rationale == "first line\nsecond line"


def test_text_outside_blocks_is_ignored() -> None:
    text = (
        "# Review of job 7\n"
        "## Result: FAIL\n"
        "Verdict: everything passes\n"
        "=== a banner ===\n"
        + block(A)
        + "OK\n"
        + "between blocks\n"
        + block(B, result="## Result: FAIL")
        + "\nThat is all.\n"
    )
    result = parse(text, (A, B))
    assert result.ok, result.reasons
    assert [r.decision for r in result.results] == ["PASS", "FAIL"]


def test_surrounding_whitespace_and_blank_lines_are_ignored() -> None:
    text = (
        f"   {start(A)}\t\n\n    indented rationale\n\n\t## Result: PASS   \n\n   \n  {end(A)}  \n"
    )
    result = parse(text)
    assert result.ok, result.reasons
    assert result.results[0].decision == "PASS"
    assert result.results[0].rationale == "indented rationale"


def test_a_block_with_only_a_result_line_has_an_empty_rationale() -> None:
    result = parse(f"{start(A)}\n## Result: PASS\n{end(A)}")
    assert result.ok
    assert result.results[0].rationale == ""


def test_a_utf8_byte_order_mark_is_accepted() -> None:
    result = parse_bundle(("\ufeff" + block(A)).encode(), (A,))
    assert result.ok, result.reasons


def test_prose_that_mentions_verdict_words_is_not_a_verdict() -> None:
    body = (
        "The result of the check is mixed.\n"
        "Outcomes are described in the body.\n"
        "Decision-making is covered in section two.\n"
        "- minor: the note says OK twice\n"
        "It would pass with a better title."
    )
    assert parse(block(A, body=body)).ok


def test_an_output_exactly_at_the_limit_is_accepted() -> None:
    text = block(A)
    assert parse(text, max_bytes=len(text.encode())).ok


def test_a_pair_listed_twice_in_expected_is_reviewed_once() -> None:
    result = parse(block(A), (A, A))
    assert result.ok
    assert len(result.results) == 1


# --- file-level failures ---------------------------------------------------------------


def test_missing_file() -> None:
    assert_rejected(parse_bundle(None, (A,)), "output file is missing")


@pytest.mark.parametrize("data", [b"", b"  \r\n\n\t "])
def test_empty_file(data: bytes) -> None:
    assert_rejected(parse_bundle(data, (A,)), "output is empty")


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"\xef\xbb\xbf", "output is empty (a byte-order mark alone)"),
        (b"\xef\xbb\xbf\r\n \n", "output is empty (a byte-order mark alone)"),
        (b"\0" * 4096, "output is empty (4096 NUL bytes)"),
        (b"\0\n\0 ", "output is empty (2 NUL bytes)"),
        (b"\xef\xbb\xbf\0", "output is empty (1 NUL byte)"),
        (
            "\u00a0\u3000\u2028\n".encode(),
            "output is empty (only Unicode spaces: U+00A0, U+2028, U+3000)",
        ),
        ("\ufeff \u3000\0\u3000".encode(), "output is empty (only Unicode spaces: U+3000)"),
    ],
)
def test_an_output_of_nothing_but_a_bom_or_nuls_is_empty(data: bytes, said: str) -> None:
    """A file an editor saved with nothing in it but its byte-order mark, or one a crash
    left as its size in NULs, was "missing pair" for every pair of the job: the retry and
    the person looked for pairs, where nothing had been written at all."""
    assert parse_bundle(data, (A, B)).reasons == (said,)


def test_not_utf8_names_the_offending_byte() -> None:
    data = block(A).encode()[:10] + b"\xff" + block(A).encode()[10:]
    assert_rejected(parse_bundle(data, (A,)), "output is not UTF-8 (byte 10)")


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be"])
def test_an_output_saved_as_utf16_says_so_alone(codec: str) -> None:
    """An output saved as "Unicode" by a Windows editor was "not UTF-8 (byte 0)" and
    then every pair "missing", though each was there: the retry or the person went
    looking for pairs rather than at the encoding."""
    data = ("\ufeff" + block(A)).encode(codec) if codec == "utf-16-be" else block(A).encode(codec)
    res = parse_bundle(data, (A,))
    assert res.reasons == (
        "output is UTF-16 (it begins with a UTF-16 byte-order mark): save it as UTF-8",
    )


def test_not_utf8_names_the_line_and_the_block_of_the_offending_byte() -> None:
    """A byte that is not UTF-8 (a tool that wrote Latin-1 into a rationale) was "output
    is not UTF-8 (byte 4187)": CONTRACT §5 has every defect said with its line and
    pair, and no person or model finds a byte's offset in a bundle."""
    body = "Summary: the note says caf\xe9.\n## Result: PASS"
    data = (block(A) + "\n").encode() + start(B).encode() + b"\r\n" + body.encode("latin-1")
    data += b"\r\n" + end(B).encode() + b"\r\n"
    res = parse_bundle(data, (A, B))
    offset = data.index(b"\xe9")
    assert res.reasons == (f"line 7: output is not UTF-8 (byte {offset}) in block for {KEY_B}",)
    res = parse_bundle(b"\xef\xbb\xbfSee:\n\xff\n" + block(A).encode(), (A,))
    assert res.reasons == ("line 2: output is not UTF-8 (byte 8)",)  # outside any block
    # Said first, as before, however many defects come before its line: past the cap it
    # was only counted, and the retry fixed the rest and met the encoding again.
    forged = "".join(f"=== PAIR REVIEW START: kb/notes/n{i}.md :: g.md ===\n" for i in range(60))
    res = parse_bundle(forged.encode() + b"\xe9\n" + block(A).encode(), (A,))
    said = f"line 61: output is not UTF-8 (byte {len(forged)}) in block for 'kb/notes/n59.md"
    assert res.reasons[0].startswith(said), res.reasons
    assert len(res.reasons) == MAX_REASONS + 1 and problem_count(res.reasons) > 60


def test_not_utf8_still_reports_the_other_defects() -> None:
    data = b"\xc3(\n" + block(B).encode()
    assert_rejected(
        parse_bundle(data, (A,)),
        "not UTF-8 (byte 0)",
        "line 2: unexpected pair",
        f"missing pair: {KEY_A}",
    )


def test_larger_than_the_limit_is_refused_before_decoding() -> None:
    data = b"\xff" * (DEFAULT_MAX_BYTES + 1)
    result = parse_bundle(data, (A,))
    assert_rejected(result)
    # Not a UTF-8 complaint: the size check comes first and the data is never decoded.
    # Read one byte past the limit (as finalize reads a file), not the file's size: the
    # reason said "5242881 bytes" of a 50 MB output.
    assert result.reasons == (f"output is larger than the {DEFAULT_MAX_BYTES}-byte limit",)


def test_the_limit_is_configurable() -> None:
    text = block(A)
    size = len(text.encode())
    assert_rejected(parse(text, max_bytes=size - 2), f"output is {size} bytes, over the")
    assert_rejected(parse(text, max_bytes=size - 1), f"output is larger than the {size - 1}-byte")


# --- pair-level failures ----------------------------------------------------------------


def test_missing_pair() -> None:
    assert_rejected(parse(block(A), (A, B)), f"missing pair: {KEY_B}")


def test_duplicated_pair() -> None:
    text = block(A) + block(A, result="## Result: FAIL")
    assert_rejected(parse(text), f"line 5: duplicated pair: {KEY_A} (first START at line 1)")


def test_unexpected_pair() -> None:
    assert_rejected(parse(block(A) + block(B)), "line 5: unexpected pair: ", KEY_B)


@pytest.mark.parametrize(
    "pair",
    [
        ExpectedPair("kb/notes/../../etc/passwd", GATE),
        ExpectedPair("/etc/passwd", GATE),
        ExpectedPair("kb/notes/a.md", "../gates/g.md"),
    ],
)
def test_a_pair_outside_the_kb_is_only_ever_unexpected(pair: ExpectedPair) -> None:
    assert_rejected(parse(block(A) + block(pair)), "unexpected pair", pair.note_path)
    # Even a caller that expects it gets no acceptance for it.
    assert_rejected(parse(block(pair), (pair,)), "invalid expected pair", "unexpected pair")


def test_no_expected_pairs_is_refused() -> None:
    assert_rejected(parse(block(A), ()), "no expected pairs")


def test_nested_start() -> None:
    text = f"{start(B)}\nhalf a review\n" + block(A)
    assert_rejected(
        parse(text, (A, B)), f"line 3: nested START for {KEY_A} inside {KEY_B} (START at line 1)"
    )


def test_end_without_start() -> None:
    text = block(A) + f"stray\n{end(A)}\n"
    assert_rejected(parse(text), f"line 6: END without START for {KEY_A}")


def test_end_naming_another_pair() -> None:
    text = f"{start(A)}\nfine\n## Result: PASS\n{end(B)}\n"
    assert_rejected(
        parse(text, (A, B)),
        f"line 4: END for {KEY_B} does not match the open block for {KEY_A} (START at line 1)",
    )


def test_unterminated_block() -> None:
    text = f"{start(A)}\nfine\n## Result: PASS\n"
    assert_rejected(parse(text), f"line 1: unterminated block for {KEY_A} (no END)")


@pytest.mark.parametrize("body", ["", "\n\n   \n"])
def test_empty_block(body: str) -> None:
    text = f"{start(A)}\n{body}{end(A)}\n"
    assert_rejected(parse(text), f"line 1: empty block for {KEY_A}")


def test_missing_result_line() -> None:
    text = block(A, body="The note is fine.", result="Nothing else to say.")
    assert_rejected(parse(text), f"line 1: missing result line for {KEY_A}")


def test_result_line_that_is_not_last_is_missing_and_extra() -> None:
    text = block(A, body="## Result: PASS", result="A closing remark.")
    assert_rejected(parse(text), "line 2: extra result line", "missing result line")


@pytest.mark.parametrize(
    "alias",
    [
        "## Result: OK",
        "## Result: pass",
        "## Result: INFO",
        "## Result: UNKNOWN",
        "## Result: PASSED",
        "## Result:PASS",
        "##  Result: PASS",
        "# Result: PASS",
        "## Result: PASS.",
        "## Result: **PASS**",
        "Result: PASS",
        "Verdict: PASS",
        "**FAIL**",
    ],
)
def test_invalid_result_line(alias: str) -> None:
    assert_rejected(parse(block(A, result=alias)), "line 3: invalid result line for")


@pytest.mark.parametrize("extra", ["## Result: FAIL", "## Result: PASS", "## result: ok"])
def test_extra_result_line(extra: str) -> None:
    text = block(A, body=f"Summary\n{extra}\nmore")
    assert_rejected(parse(text), f"line 3: extra result line in block for {KEY_A}")


@pytest.mark.parametrize(
    "line",
    [
        "Verdict: PASS",
        "## Verdict",
        "**Verdict:** FAIL",
        "- **Outcome** — WARN",
        "Decision: approve",
        "### Decision",
        "Final result = pass",
        "1. Result: fine",
        "> Outcome: ok",
        "OK",
        "ok.",
        "INFO",
        "UNKNOWN",
        "**PASS**",
        "## FAIL",
        "- WARN",
        "Error!",
    ],
)
def test_verdict_like_line(line: str) -> None:
    text = block(A, body=f"Summary\n{line}\nmore", result="## Result: WARN")
    assert_rejected(parse(text), f"line 3: verdict-like line in block for {KEY_A}")


@pytest.mark.parametrize("line", ["=== something ===", "=== PAIR REVIEW RESULT: x :: y ==="])
def test_unknown_sentinel_inside_a_block_is_forged(line: str) -> None:
    text = block(A, body=f"before\n  {line}\nafter")
    assert_rejected(parse(text), f"line 3: forged or unknown sentinel in block for {KEY_A}")


def test_sentinel_without_pair_separator_is_malformed() -> None:
    text = f"=== PAIR REVIEW START: {A.note_path} ===\n" + block(A)
    assert_rejected(parse(text), "line 1: malformed sentinel, no ' :: ' between note and gate")


def test_malformed_pair_sentinel_outside_blocks_is_reported() -> None:
    text = f"=== PAIR REVIEW START {KEY_A} ===\n" + block(A)
    assert_rejected(parse(text), "line 1: malformed sentinel")


def test_inexact_sentinel_is_not_a_sentinel() -> None:
    # Lower case or doubled spaces inside the line do not open a block.
    text = f"=== pair review start: {KEY_A} ===\nfine\n## Result: PASS\n{end(A)}\n"
    assert_rejected(parse(text), "malformed sentinel", "END without START")


def test_every_defect_is_reported_not_just_the_first() -> None:
    text = (
        block(A, body="Verdict: PASS")  # lines 1-4
        + block(A)  # lines 5-8: duplicate
        + f"{start(C)}\n## Result: PASS\n"  # lines 9-10: unterminated, since a START follows
        + block(ExpectedPair("kb/notes/zzz.md", GATE))  # lines 11-14: unexpected
        + f"{start(B)}\n=== forged ===\nno result\n{end(B)}\n"  # lines 15-18
        + f"{end(A)}\n"  # line 19
    )
    result = parse(text, (A, B, C, ExpectedPair("kb/notes/d.md", GATE)))
    assert_rejected(
        result,
        "line 2: verdict-like line",
        "line 5: duplicated pair",
        "line 11: nested START",
        "line 11: unexpected pair",
        "line 16: forged or unknown sentinel",
        "line 15: missing result line",
        "line 19: END without START",
        "missing pair: kb/notes/d.md",
    )
    assert len(result.reasons) == 8


def test_reasons_quote_output_text_safely_and_briefly() -> None:
    long_pair = "kb/notes/" + "x" * 5000 + "\x1b[31m.md :: g.md"
    result = parse(block(A) + block(ExpectedPair(long_pair.split(" :: ")[0], "g.md")))
    [reason] = result.reasons
    assert reason.startswith("line 5: unexpected pair: 'kb/notes/xxx")
    assert len(reason) < 250
    assert "\x1b" not in reason


# --- a sentinel copied not quite exactly ----------------------------------------------------


def test_an_end_line_missing_a_space_is_named_not_its_result_line() -> None:
    """The reasons blamed the block's good result line ("extra result line"), a nested
    START and an unterminated block, and never the END line itself: a retry told so would
    remove its result line."""
    near = end(A).removesuffix(" ===") + "==="
    text = f"{start(A)}\nLooks fine.\n## Result: PASS\n{near}\n{block(B)}"
    res = parse(text, (A, B))
    assert_rejected(res, f"line 4: malformed sentinel (copy it exactly): {near!r}")
    assert not any("extra result line" in r for r in res.reasons), res.reasons


def test_sentinels_dressed_in_markdown_are_named() -> None:
    text = f"**{start(A)}**\nLooks fine.\n## Result: PASS\n**{end(A)}**\n"
    res = parse(text)
    assert_rejected(res, "line 1: malformed sentinel (copy it exactly)", "line 4: malformed")


def test_a_sentinel_behind_an_invisible_character_is_named() -> None:
    """Two outputs joined by hand (`cat a.md b.md`) put the second file's byte-order mark
    in front of its first START: the line was taken for text, and the reasons blamed its
    END ("END without START") and a missing pair, each line looking right in an editor."""
    text = block(A) + "\ufeff" + block(B)
    res = parse(text, (A, B))
    assert_rejected(res, "line 5: malformed sentinel (copy it exactly): '\\ufeff=== PAIR")
    # Inside a block too: its END behind a zero-width space.
    res = parse(f"{start(A)}\nLooks fine.\n## Result: PASS\n\u200b{end(A)}\n")
    assert_rejected(res, "line 4: malformed sentinel (copy it exactly): '\\u200b=== PAIR")


def test_a_zero_width_joiner_in_a_rationale_is_text() -> None:
    """M3 names a sentinel behind an invisible character; a joiner that belongs to the
    text (Devanagari and Sinhala conjuncts, emoji sequences), even at a line's start, is
    not a sentinel and the output is accepted."""
    for body in (
        "\u0915\u094d\u200d\u0937 is written with a joiner; the note is fine.",
        "\u200d\u0dca\u0dba begins with one.",
        "A family \U0001f468\u200d\U0001f469\u200d\U0001f467 emoji === here.",
    ):
        assert parse(block(A, body=body)).ok, body


def test_a_rationale_that_mentions_the_sentinels_is_accepted() -> None:
    body = "The note quotes the PAIR REVIEW START line of another tool, which is fine."
    assert parse(block(A, body=body)).ok
    # Quoted as code on a line of its own, as a reviewer quotes a line it discusses.
    assert parse(block(A, body=f"The line reads:\n`{start(B)}`\nwhich is fine.")).ok


@pytest.mark.parametrize(
    ("on_disk", "written"),
    [("cafe\u0301", "caf\u00e9"), ("caf\u00e9", "cafe\u0301")],
    ids=["decomposed-name", "composed-name"],
)
def test_a_pair_named_in_another_unicode_normal_form_is_that_pair(on_disk, written) -> None:
    """A note saved on a Mac has a decomposed name (e + combining accent); a model copies
    it composed. The pair was 'unexpected' and 'missing' at once, in two reasons that
    print the same."""
    expected = ExpectedPair(f"kb/notes/{on_disk}.md", GATE)
    copied = ExpectedPair(f"kb/notes/{written}.md", GATE)
    res = parse(block(copied), (expected,))
    assert res.ok, res.reasons
    assert res.results[0].note_path == expected.note_path


@pytest.mark.parametrize(
    ("on_disk", "written"),
    [
        ("\u200bzw", "zw"),  # a zero-width space pasted with the name
        ("soft\u00adhyphen", "softhyphen"),
        (
            "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
            "\u0645\u06cc\u062e\u0648\u0627\u0647\u0645",
        ),
        ("plain", "pl\u200bain"),  # and one the copy added
    ],
    ids=["zero-width-space", "soft-hyphen", "persian-half-space", "added"],
)
def test_a_pair_named_without_an_invisible_character_of_its_name_is_that_pair(
    on_disk, written
) -> None:
    """A note whose name holds a character no one sees (a zero-width space, a soft hyphen,
    a Persian half-space) copied by a model that left it out: the pair was "unexpected
    pair: 'kb/notes/zw.md :: …'" and "missing pair: kb/notes/zw.md :: …" at once, two
    reasons that print the same, and a retry that copied it so again failed the same way
    until the job was escalated. It names that pair, as a copy in another normal form
    does; two pairs it could name are not guessed between."""
    expected = ExpectedPair(f"kb/notes/{on_disk}.md", GATE)
    copied = ExpectedPair(f"kb/notes/{written}.md", GATE)
    res = parse(block(copied), (expected,))
    assert res.ok, res.reasons
    assert res.results[0].note_path == expected.note_path
    both = (expected, copied)
    res = parse(block(copied) + block(copied, result="## Result: FAIL"), both)
    assert_rejected(res, "duplicated pair", f"missing pair: {expected.note_path}")


def test_two_pairs_that_differ_only_in_normal_form_are_not_guessed_between() -> None:
    one = ExpectedPair("kb/notes/cafe\u0301.md", GATE)
    two = ExpectedPair("kb/notes/caf\u00e9.md", GATE)
    res = parse(block(one) + block(two, result="## Result: FAIL"), (one, two))
    assert [r.decision for r in res.results] == ["PASS", "FAIL"]
    res = parse(block(two) + block(two), (one, two))
    assert_rejected(res, "duplicated pair", f"missing pair: {one.note_path}")
