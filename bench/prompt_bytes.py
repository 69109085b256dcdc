"""Prompt bytes per pair, ``--grouping note`` against one-pair jobs (CONTRACT §13: ≤ 40%).

On the commonplace KB (see ``bench/create_jobs.py``) it takes, for each lens asked for
(default: ``semantic`` and ``prose``), five of its gates (by default the first five, by
gate id, that apply to every note: no ``requires_type`` / ``requires_trait``), selects
their pairs once with ``reviewq select GATE_ID... --model bench --json``, and creates
jobs for exactly those pairs twice, each time in its own state folder:

- ``create-jobs --grouping note``: one job per note holding its five pairs;
- ``create-jobs --grouping gate --batch-size 1``: one-pair jobs.

It sums the bytes of every job's ``prompt.md`` in each state folder, divides by the
pairs, and prints both figures and their ratio against the target. Nothing is timed, so
``--repeat`` only re-runs the whole comparison to show the figures are deterministic.

    .venv/bin/python bench/prompt_bytes.py
    .venv/bin/python bench/prompt_bytes.py --lens prose --gates 5

Exit status: 0 when every run succeeded (or the corpus is absent: skipped with a
message), 1 when a command fails or the two runs disagree on the pairs. The target is
reported, not enforced.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from create_jobs import DEFAULT_CORPUS, child_env, extract, find_corpus, reviewq_exe

TARGET_RATIO = 0.40  # CONTRACT §13: note-grouped prompt bytes per pair <= 40% of one-pair jobs


def reviewq(args: list[str], env: dict[str, str]) -> dict:
    r = subprocess.run([reviewq_exe(), *args], env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        sys.exit(f"reviewq {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout)


def pick_gates(root: Path, lens: str, count: int, env: dict[str, str]) -> list[str]:
    gates = reviewq(["--root", str(root), "gates", "--json"], env)["gates"]
    in_lens = sorted(
        (g for g in gates if g["lens"] == lens),
        key=lambda g: (bool(g.get("requires_type")) or bool(g.get("requires_trait")), g["gate_id"]),
    )
    if len(in_lens) < count:
        sys.exit(f"lens {lens}: {len(in_lens)} gates, fewer than --gates {count}")
    return [g["gate_id"] for g in in_lens[:count]]


def measure(root: Path, state: Path, sel: Path, grouping: list[str], env) -> tuple[int, int, dict]:
    """(prompt bytes, pairs, pairs-per-job histogram) of one create-jobs run."""
    out = reviewq(
        ["--root", str(root), "--state", str(state), "create-jobs", "--input", str(sel)]
        + grouping
        + ["--json"],
        env,
    )
    if out["skipped"]:
        sys.exit(f"create-jobs {' '.join(grouping)}: {len(out['skipped'])} pairs skipped")
    total = sum((root / j["prompt_path"]).stat().st_size for j in out["jobs"])
    pairs = sum(len(j["pairs"]) for j in out["jobs"])
    return total, pairs, dict(sorted(Counter(len(j["pairs"]) for j in out["jobs"]).items()))


def compare(
    root: Path, base: Path, lens: str, count: int, env: dict[str, str], chosen: list[str]
) -> float:
    gate_ids = chosen or pick_gates(root, lens, count, env)
    sel = base / f"sel-{lens}.json"
    data = reviewq(["--root", str(root), "select", *gate_ids, "--model", "bench", "--json"], env)
    sel.write_text(json.dumps(data), encoding="utf-8")
    targets = len(data["targets"])
    notes = len({t["note_path"] for t in data["targets"]})
    state_note, state_one = base / f"state-{lens}-note", base / f"state-{lens}-one"
    for s in (state_note, state_one):
        shutil.rmtree(s, ignore_errors=True)
    b_note, p_note, h_note = measure(root, state_note, sel, ["--grouping", "note"], env)
    b_one, p_one, h_one = measure(
        root, state_one, sel, ["--grouping", "gate", "--batch-size", "1"], env
    )
    if not p_note == p_one == targets:
        sys.exit(f"lens {lens}: pairs differ: select {targets}, note {p_note}, one-pair {p_one}")
    per_note, per_one = b_note / p_note, b_one / p_one
    ratio = per_note / per_one
    print(f"lens {lens}: gates {', '.join(gate_ids)}")
    print(f"  pairs {targets} over {notes} notes")
    print(
        f"  --grouping note:                 {b_note:>12,} bytes in {sum(h_note.values()):>5} "
        f"jobs (pairs/job {h_note}) = {per_note:>8,.0f} bytes/pair"
    )
    print(
        f"  --grouping gate --batch-size 1:  {b_one:>12,} bytes in {sum(h_one.values()):>5} "
        f"jobs = {per_one:>8,.0f} bytes/pair"
    )
    verdict = "PASS" if ratio <= TARGET_RATIO else "MISS"
    print(f"  ratio {ratio:.1%}   target <= {TARGET_RATIO:.0%} (CONTRACT §13): {verdict}")
    return ratio


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="commonplace-kb.tar.gz")
    ap.add_argument(
        "--lens",
        action="append",
        help="a lens of >= --gates gates (repeatable) [default: semantic and prose]",
    )
    ap.add_argument("--gates", type=int, default=5, help="gates taken from the lens")
    ap.add_argument(
        "--gate",
        action="append",
        default=[],
        metavar="GATE_ID",
        help="these gate ids instead of the lens's first --gates (repeatable; one lens)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="re-run the whole comparison")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    if args.repeat < 1 or args.gates < 1:
        ap.error("--repeat and --gates must be at least 1")
    if args.gate:
        lenses = {g.split("/", 1)[0] for g in args.gate}
        if len(lenses) != 1:
            ap.error("--gate: give gate ids of one lens")
        args.lens, args.gates = sorted(lenses), len(args.gate)
    corpus = find_corpus(args.corpus)
    if corpus is None:
        print(f"skipped: corpus not found at {args.corpus} (pass --corpus PATH)")
        return 0
    base = Path(tempfile.mkdtemp(prefix="reviewq-bench-prompt-bytes-"))
    try:
        root = base / "kb-root"
        extract(corpus, root)
        env = child_env(base)
        ratios: dict[str, list[float]] = {}
        for i in range(args.repeat):
            if args.repeat > 1:
                print(f"--- run {i + 1}")
            for lens in args.lens or ["semantic", "prose"]:
                ratio = compare(root, base, lens, args.gates, env, args.gate)
                ratios.setdefault(lens, []).append(ratio)
        print()
        for lens, values in ratios.items():
            worst = max(values)
            verdict = "PASS" if worst <= TARGET_RATIO else "MISS"
            print(
                f"summary: lens {lens} ({args.gates} gates): note-grouped prompt bytes per pair "
                f"= {worst:.1%} of one-pair jobs; target <= {TARGET_RATIO:.0%}: {verdict}"
            )
    finally:
        if args.keep:
            print(f"kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
