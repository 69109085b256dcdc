"""Benchmark of finalizing one 1,000-pair review job against CONTRACT §13 (≤ 250 ms).

It builds a KB of N notes and one gate in a temporary folder, creates ONE job holding
every pair through ``orchestrator.review.jobs.create_jobs`` (``--grouping gate --batch-size N``),
writes a valid ``bundle-output.md`` for it (a few lines of rationale per block and a
seeded mix of PASS, WARN and FAIL), and keeps that state folder as a template. Each
repeat copies the template to a fresh state folder and times the in-process call
``orchestrator.review.finalize.finalize(store, state_dir, job_id, output)``: parse, the write
transaction and the result files with MANIFEST.json. Opening the store and reading the
output file are not timed.

The split is measured inside the same call by wrapping the two names that
``orchestrator.review.finalize`` calls (``parse_bundle`` and ``write_job_files``); the
transaction is the rest. ``parse_bundle`` is also timed alone, repeatedly, on the same
bytes.

    .venv/bin/python bench/finalize.py                 # 1,000 pairs, 5 repeats
    .venv/bin/python bench/finalize.py --pairs 200     # smoke
    .venv/bin/python bench/finalize.py --profile       # cProfile of one more finalize

Exit status: 0 when every finalize completed and its rows and files check out (CONTRACT §13's
target is reported, not enforced), 1 otherwise.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orchestrator.review.finalize as fin
import orchestrator.state.files as reports
from orchestrator.review.bundle import ExpectedPair, end_line, parse_bundle, start_line
from orchestrator.review.jobs import create_jobs
from orchestrator.state.store import Store
from orchestrator.state.workspace import Workspace

TARGET_PAIRS = 1000
TARGET_MS = 250.0  # CONTRACT §13: finalizing a 1,000-pair bundle
LENS = "prose"
GATE_NAME = "claim-support"
GATE_ID = f"{LENS}/{GATE_NAME}"
GATE_PATH = f"kb/instructions/review-gates/{LENS}/{GATE_NAME}.md"
DECISIONS = ("PASS", "WARN", "FAIL")
DECISION_WEIGHTS = (0.6, 0.25, 0.15)
MODEL = "bench-model"

GATE_TEXT = f"""---
gate_id: {GATE_ID}
name: Claim support
description: 'Every claim in the body is supported by the text around it.'
lens: {LENS}
watches: [title, body]
staleness: changed
---

## Failure mode

The note states something as settled that the body never supports.

## Test

Read the body and check every claim against what the note itself shows.

- FAIL: a claim contradicts the body.
- WARN: a claim is vague.
- PASS: every claim is specific and supported.

## Example (fail)

"Colonies always swarm in May."

## Example (pass)

"Colonies in this apiary swarmed from late April to June."
"""

WORDS = [
    "colony",
    "queen",
    "worker",
    "drone",
    "brood",
    "comb",
    "frame",
    "super",
    "hive",
    "apiary",
    "forage",
    "nectar",
    "pollen",
    "varroa",
    "swarm",
    "winter",
    "cluster",
    "syrup",
    "smoker",
    "veil",
    "inspection",
    "season",
    "record",
]


def sentence(rng: random.Random, n: int = 12) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + "."


def note_text(rng: random.Random, i: int) -> str:
    title = f"Note {i}: the {WORDS[i % len(WORDS)]} and the {WORDS[(i * 7) % len(WORDS)]}"
    body = "\n\n".join(" ".join(sentence(rng) for _ in range(4)) for _ in range(6))
    return (
        f"---\ntitle: '{title}'\ndescription: 'Synthetic note {i} for the finalize benchmark.'\n"
        f"type: note\n---\n\n# {title}\n\n{body}\n"
    )


def note_path(i: int) -> str:
    return f"kb/notes/area-{i % 20:02d}/note-{i:05d}.md"


def build_kb(root: Path, pairs: int, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(pairs):
        path = root / note_path(i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(note_text(rng, i), encoding="utf-8")
    gate = root / GATE_PATH
    gate.parent.mkdir(parents=True, exist_ok=True)
    gate.write_text(GATE_TEXT, encoding="utf-8")


def bundle_output(pairs: list[tuple[str, str]], seed: int) -> tuple[str, Counter]:
    """One valid block per pair: a summary, two findings, a result; seeded decisions."""
    rng = random.Random(seed + 1)
    out = ["Review of the whole batch follows; text outside blocks is ignored.", ""]
    counts: Counter = Counter()
    for n, g in pairs:
        decision = rng.choices(DECISIONS, DECISION_WEIGHTS)[0]
        counts[decision] += 1
        out += [
            start_line(n, g),
            f"Summary: {sentence(rng, 16)}",
            "",
            "Findings:",
            f"- minor: {sentence(rng, 10)}",
            f"- info: {sentence(rng, 8)}",
            "",
            f"## Result: {decision}",
            end_line(n, g),
            "",
        ]
    return "\n".join(out), counts


def setup(root: Path, pairs: int, seed: int) -> tuple[int, Path, Counter]:
    """KB, one job of every pair, its bundle-output.md; returns (job id, template, counts)."""
    t0 = time.perf_counter()
    build_kb(root, pairs, seed)
    ws = Workspace.open(root)
    targets = [
        {"note_path": note_path(i), "gate_id": GATE_ID, "gate_path": GATE_PATH}
        for i in range(pairs)
    ]
    batch = create_jobs(
        ws.kb,
        ws.catalog(),
        ws.store,
        ws.state_dir,
        targets,
        model_partition=MODEL,
        grouping="gate",
        batch_size=pairs,
    )
    if len(batch.jobs) != 1 or batch.skipped or len(batch.jobs[0].pairs) != pairs:
        sys.exit(
            f"setup failed: {len(batch.jobs)} job(s), {len(batch.skipped)} skipped "
            f"(first: {batch.skipped[:1]}); expected one job of {pairs} pairs"
        )
    job = batch.jobs[0]
    text, counts = bundle_output([(p.note_path, p.gate_path) for p in job.pairs], seed)
    (root / job.bundle_output_path).write_text(text, encoding="utf-8")
    state = ws.state_dir
    ws.close()
    print(
        f"setup: {pairs} notes x 1 gate, job {job.review_job_id} with {len(job.pairs)} pairs, "
        f"bundle-output.md {len(text.encode()):,} bytes, "
        f"decisions {dict(sorted(counts.items()))} ({time.perf_counter() - t0:.1f} s)"
    )
    return job.review_job_id, state, counts


class Split:
    """Wraps the names orchestrator.review.finalize calls so one finalize can be split in time."""

    def __init__(self) -> None:
        self.parse = 0.0
        self.files = 0.0

    def wrap(self, fn: Callable, attr: str) -> Callable:
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, attr, getattr(self, attr) + time.perf_counter() - t0)

        return timed


def atomic_write_no_fsync(path: Path, data: str | bytes) -> None:
    """What-if only: ``orchestrator.kb.atomicfile.atomic_write`` (temp file + rename) without the
    per-file fsync, to show what the result files would cost without it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(raw)
    os.replace(tmp, path)


def run_once(
    template: Path, state: Path, job_id: int, output: bytes, *, no_fsync: bool = False
) -> tuple[float, Split, fin.FinalizeResult]:
    """Finalize on a fresh copy of the template state folder; times the call only."""
    shutil.copytree(template, state)
    store = Store.open(state)
    # The copy left megabytes of dirty pages; flushed here (untimed) so that the first
    # fsync inside finalize does not pay for writing back the copy.
    os.sync()
    split = Split()
    real_parse, real_files, real_write = (
        fin.parse_bundle,
        reports.write_job_files,
        reports.atomic_write,
    )
    fin.parse_bundle = split.wrap(real_parse, "parse")
    # Rendered after the commit by reports._write_due, which looks the name up in reports.
    reports.write_job_files = split.wrap(real_files, "files")
    if no_fsync:
        reports.atomic_write = atomic_write_no_fsync
    try:
        t0 = time.perf_counter()
        result = fin.finalize(store, state, job_id, output)
        wall = time.perf_counter() - t0
        problems = check(store, state, job_id)
    finally:
        fin.parse_bundle, reports.write_job_files = real_parse, real_files
        reports.atomic_write = real_write
        store.close()
        shutil.rmtree(state)
    if problems:
        sys.exit("sanity check failed: " + "; ".join(problems))
    return wall, split, result


def check(store: Store, state: Path, job_id: int) -> list[str]:
    """The job is completed, every pair decided and accepted, every result file written."""
    c = store.conn
    problems = []
    status = c.execute("SELECT status FROM review_jobs WHERE id = ?", (job_id,)).fetchone()[0]
    if status != "completed":
        problems.append(f"job status {status}")
    pairs = c.execute("SELECT count(*) FROM review_pairs WHERE job_id = ?", (job_id,)).fetchone()
    undecided = c.execute(
        "SELECT count(*) FROM review_pairs WHERE job_id = ? AND decision IS NULL", (job_id,)
    ).fetchone()[0]
    accepted = c.execute(
        "SELECT count(*) FROM acceptance a JOIN review_pairs p ON p.id = a.review_pair_id "
        "WHERE p.job_id = ?",
        (job_id,),
    ).fetchone()[0]
    if undecided or accepted != pairs[0]:
        problems.append(f"{undecided} undecided, {accepted} of {pairs[0]} accepted")
    folder = (
        state / c.execute("SELECT job_dir FROM review_jobs WHERE id = ?", (job_id,)).fetchone()[0]
    )
    files = len(list((folder / "results").glob("*.md")))
    if files != pairs[0]:
        problems.append(f"{files} result files for {pairs[0]} pairs")
    return problems


def expected_pairs(template: Path, job_id: int) -> list[ExpectedPair]:
    store = Store.open(template)
    try:
        rows = store.conn.execute(
            "SELECT note_path, gate_path FROM review_pairs WHERE job_id = ? ORDER BY id", (job_id,)
        ).fetchall()
    finally:
        store.close()
    return [ExpectedPair(r[0], r[1]) for r in rows]


def ms(values: list[float]) -> str:
    return f"min {min(values) * 1000:7.1f} ms   median {statistics.median(values) * 1000:7.1f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=TARGET_PAIRS, help="pairs in the one job")
    ap.add_argument("--repeat", type=int, default=5, help="finalize runs, each on a fresh copy")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", type=Path, help="work here (absent or empty; kept afterwards)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument("--profile", action="store_true", help="cProfile one more finalize")
    ap.add_argument(
        "--what-if-no-fsync",
        action="store_true",
        help="also time finalize with the result files written without per-file fsync "
        "(a bench-only patch; interleaved with the real runs)",
    )
    args = ap.parse_args()
    if args.pairs < 1 or args.repeat < 1:
        ap.error("--pairs and --repeat must be at least 1")

    if args.dir is not None:
        if args.dir.exists() and any(args.dir.iterdir()):
            ap.error(f"--dir {args.dir}: not empty")
        args.dir.mkdir(parents=True, exist_ok=True)
        base, keep = args.dir.resolve(), True
    else:
        base, keep = Path(tempfile.mkdtemp(prefix="reviewq-bench-finalize-")), args.keep
    try:
        return bench(args, base)
    finally:
        if keep:
            print(f"kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


def bench(args: argparse.Namespace, base: Path) -> int:
    root = base / "kb-root"
    job_id, state, counts = setup(root, args.pairs, args.seed)
    template = base / "state-template"
    shutil.move(state, template)
    output = (template / "jobs" / f"review-job-{job_id}" / "bundle-output.md").read_bytes()

    # parse_bundle alone, on the same bytes and pairs as finalize sees.
    expected = expected_pairs(template, job_id)
    parse_times = []
    for _ in range(max(args.repeat, 5)):
        t0 = time.perf_counter()
        parsed = parse_bundle(output, expected)
        parse_times.append(time.perf_counter() - t0)
    if not parsed.ok or Counter(r.decision for r in parsed.results) != counts:
        print(f"sanity check failed: parse_bundle: {parsed.reasons[:3]}")
        return 1

    variants = ["as shipped"] + (["what-if: no per-file fsync"] if args.what_if_no_fsync else [])
    runs: dict[str, list[tuple[float, Split]]] = {v: [] for v in variants}
    for i in range(args.repeat):
        for v in variants:  # interleaved, so that both see the same machine
            no_fsync = v != "as shipped"
            wall, split, result = run_once(
                template, base / f"state-{i}", job_id, output, no_fsync=no_fsync
            )
            if not result.ok:
                print(f"finalize {i}: {result.status}: {result.failure_reasons[:3]}")
                return 1
            runs[v].append((wall, split))
            print(
                f"  run {i + 1}{' (no fsync)' if no_fsync else '':11}: finalize "
                f"{wall * 1000:7.1f} ms  (parse {split.parse * 1000:6.1f}, "
                f"transaction {(wall - split.parse - split.files) * 1000:6.1f}, "
                f"result files {split.files * 1000:6.1f})"
            )

    med = 0.0
    for v in variants:
        walls = [w for w, _ in runs[v]]
        parse_in = [s.parse for _, s in runs[v]]
        files = [s.files for _, s in runs[v]]
        txn = [w - s.parse - s.files for w, s in runs[v]]
        print()
        print(f"Finalize one job of {args.pairs} pairs, {v} ({args.repeat} runs, fresh state each)")
        print(f"  finalize (whole call)     {ms(walls)}")
        if v == "as shipped":
            med = statistics.median(walls)
            print(f"  parse_bundle alone        {ms(parse_times)}   ({len(parse_times)} runs)")
        print(f"  - parse inside finalize   {ms(parse_in)}")
        print(f"  - DB transaction + reads  {ms(txn)}")
        fsync = "no fsync" if v != "as shipped" else "as shipped"
        print(f"  - result files+MANIFEST   {ms(files)}   ({args.pairs + 1} files, {fsync})")
    print()
    scaled = "" if args.pairs == TARGET_PAIRS else f" (target is for {TARGET_PAIRS} pairs)"
    verdict = "PASS" if med * 1000 <= TARGET_MS else "MISS"
    print(
        f"target: finalize median <= {TARGET_MS:.0f} ms for {TARGET_PAIRS} pairs (CONTRACT §13): "
        f"{verdict} ({med * 1000:.1f} ms as shipped){scaled}"
    )

    if args.profile:
        state_p = base / "state-profile"
        shutil.copytree(template, state_p)
        store = Store.open(state_p)
        os.sync()
        prof = cProfile.Profile()
        prof.enable()
        fin.finalize(store, state_p, job_id, output)
        prof.disable()
        store.close()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        text = buf.getvalue()
        print("\nProfile: cProfile of one finalize, top 25 by own time")
        print(text[text.find("   ncalls") :])
    return 0


if __name__ == "__main__":
    sys.exit(main())
