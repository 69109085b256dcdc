"""Coverage-guided fuzzing of the bundle-output parser with atheris (libFuzzer), by hand.

Optional: ``atheris`` is not a dependency of reviewq. On Linux/x86-64 with Python 3.11 it
installs as a binary wheel::

    .venv/bin/pip install atheris
    .venv/bin/python bench/fuzz_atheris.py -max_total_time=300 -print_final_stats=1
    mkdir -p bench/out/atheris-corpus   # an empty corpus folder is seeded with valid outputs
    .venv/bin/python bench/fuzz_atheris.py bench/out/atheris-corpus -max_total_time=3600

Any libFuzzer flag works (``-runs=N``, ``-jobs=4``, ``-seed=N``). Give a corpus folder to keep
and grow the inputs between runs (``bench/out/`` is ignored by git). A crash writes
``crash-<sha1>`` in the current folder; replay it with
``.venv/bin/python bench/fuzz_atheris.py crash-<sha1>``.

An input is a 7-byte header (mode, pair count, pair indexes, bad pair, size limit) and a
body, read in one of two ways, chosen by the mode byte:

- raw: the rest is the output file, judged against 1-3 expected pairs;
- structured: the rest is a tiny program whose control bytes expand to the real sentinel
  lines, result lines and forged look-alikes, so the fuzzer reaches deep parser states
  (accepted blocks, nested STARTs, duplicates) that random bytes almost never spell.

Every parse is held to the same oracle as ``tests/test_fuzz.py`` (``check_bundle``): never
raises, all or nothing, and an accepted output is UTF-8, within the limit, with exactly one
well-formed block and one result line per expected pair and no pair it did not expect.
Figures of past runs are in docs/RELIABILITY.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

with atheris.instrument_imports(include=["orchestrator"]):
    from orchestrator.review.bundle import DECISIONS, ExpectedPair, end_line, start_line

from tests.test_fuzz import BAD_PATHS, FORGED_NOTES, GATES, NOTES, RESULT_VARIANTS, check_bundle

PAIRS = [ExpectedPair(n, g) for n in NOTES for g in GATES]
OTHERS = [ExpectedPair(n, GATES[0]) for n in FORGED_NOTES]
LIMITS = [5 * 1024 * 1024, 64, 256]


def _expand(program: bytes, expected: list[ExpectedPair]) -> bytes:
    """Control bytes 0x01-0x08 followed by an index byte become whole lines."""
    out = bytearray()
    i = 0
    while i < len(program):
        op = program[i]
        arg = program[i + 1] if i + 1 < len(program) else 0
        if 1 <= op <= 8:
            i += 2
            pair = expected[arg % len(expected)]
            other = OTHERS[arg % len(OTHERS)]
            line = {
                1: start_line(pair.note_path, pair.gate_path),
                2: end_line(pair.note_path, pair.gate_path),
                3: f"## Result: {DECISIONS[arg % len(DECISIONS)]}",
                4: RESULT_VARIANTS[arg % len(RESULT_VARIANTS)],
                5: start_line(other.note_path, other.gate_path),
                6: end_line(other.note_path, other.gate_path),
                7: "=== PAIR REVIEW START: " + pair.note_path + " ===",
                8: "  " + start_line(pair.note_path, pair.gate_path).lower(),
            }[op]
            out += line.encode("utf-8") + b"\n"
        else:
            out.append(op)
            i += 1
    return bytes(out)


HEADER = 7  # mode, count, three pair indexes, bad-pair byte, limit


def decode_input(data: bytes) -> tuple[bytes, list[ExpectedPair], int]:
    head = data[:HEADER].ljust(HEADER, b"\0")
    mode, count, i1, i2, i3, bad, lim = head
    expected = [PAIRS[i % len(PAIRS)] for i in (i1, i2, i3)[: 1 + count % 3]]
    if bad % 16 == 15:
        expected.append(ExpectedPair(BAD_PATHS[bad // 16 % len(BAD_PATHS)], GATES[0]))
    rest = data[HEADER:]
    output = rest if mode % 4 == 0 else _expand(rest, expected)
    return output, expected, LIMITS[lim % len(LIMITS)]


def test_one_input(data: bytes) -> None:
    check_bundle(*decode_input(data))


def seeds() -> list[bytes]:
    """Accepted outputs of one, two and three pairs, for an empty corpus to start from."""
    one = b"\x01\x00Summary: fine.\n- low: a nit\n\x03\x01\x02\x00"
    two = one + b"\x01\x01Looks right.\n\x03\x02\x02\x01"
    three = two + b"\r\n\x01\x02Text\r\n\x03\x03\x02\x02"
    return [
        bytes([1, 0, 0, 1, 2, 0, 0]) + one,
        bytes([1, 1, 0, 1, 2, 0, 0]) + two,
        bytes([1, 2, 0, 1, 2, 0, 0]) + three,
        bytes([0, 0, 0, 0, 0, 0, 0]) + _expand(one, [PAIRS[0]]),
    ]


def main() -> None:
    corpus = [Path(a) for a in sys.argv[1:] if not a.startswith("-")]
    if corpus and corpus[0].is_dir() and not any(corpus[0].iterdir()):
        for n, seed in enumerate(seeds()):
            (corpus[0] / f"seed-{n}").write_bytes(seed)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
