"""Benchmark of ``reviewq create-jobs --grouping note`` on the commonplace KB (CONTRACT §13).

It extracts ``commonplace-kb.tar.gz`` (a real KB: ~356 notes, 7 lenses, kept outside
this repository) into a temporary folder, runs ``reviewq --root DIR
select --all-gates --model bench --json > sel.json`` once, then times

    reviewq --root DIR create-jobs --input sel.json --grouping note --json > /dev/null

as a whole process, ``--repeat`` times, each on a fresh state folder (DIR/.reviewq is
deleted between runs; sel.json is kept). It prints pairs, jobs, wall time (min and
median) and the child's own peak RSS (``os.wait4``), and checks the jobs and pairs
recorded in state.db after every run. The target (CONTRACT §13): ≤ 4 s for about 12,000
pairs / 2,400 jobs; commonplace's own tool takes about 41 s on the reference machine.

    .venv/bin/python bench/create_jobs.py
    .venv/bin/python bench/create_jobs.py --repeat 1 --profile

Exit status: 0 when every run succeeded and its counts check out, or when the corpus
is absent (skipped with a message); 1 when a run fails. The target is reported, not
enforced.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO.parent / "shared" / "corpora" / "commonplace-kb.tar.gz"
TARGET_S = 4.0  # CONTRACT §13, for about 12,000 pairs / 2,400 jobs
TARGET_PAIRS = 12_000
COMMONPLACE_S = 41.0  # commonplace's own tool on the reference machine (CONTRACT §13)


@dataclass
class Run:
    wall: float
    rss_bytes: int
    exit_code: int
    stderr: str


def find_corpus(path: Path) -> Path | None:
    return path if path.is_file() else None


def extract(corpus: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(corpus) as tar:
        tar.extractall(dest, filter="data")


def reviewq_exe() -> str:
    exe = Path(sys.executable).with_name("reviewq")
    return str(exe) if exe.exists() else shutil.which("reviewq") or "reviewq"


def child_env(base: Path) -> dict[str, str]:
    """Bytecode cached under BASE/.pycache (a sandbox may set PYTHONDONTWRITEBYTECODE,
    which would recompile orchestrator/ in every timed run); nothing lands in the project."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(base / ".pycache")
    return env


def warm_bytecode(env: dict[str, str]) -> None:
    """One untimed import, so the timed runs load cached bytecode."""
    subprocess.run([sys.executable, "-c", "import orchestrator.cli, workers"], env=env, check=False)


def run(argv: list[str], stdout_path: str, env: dict[str, str]) -> Run:
    """One process; wall time around it and its own rusage from os.wait4."""
    with open(stdout_path, "wb") as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err.seek(0)
        stderr = err.read().decode("utf-8", errors="replace")
    return Run(wall, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status), stderr)


def select_json(root: Path, out: Path, model: str, env: dict[str, str]) -> int:
    """Runs select once; returns the number of targets."""
    argv = [reviewq_exe(), "--root", str(root), "select", "--all-gates", "--model", model]
    r = run([*argv, "--json"], str(out), env)
    if r.exit_code != 0:
        sys.exit(f"select failed ({r.exit_code}): {r.stderr.strip()[-2000:]}")
    data = json.loads(out.read_text(encoding="utf-8"))
    return len(data["targets"])


def state_counts(state: Path) -> tuple[int, int]:
    """(jobs, pairs) recorded in state.db."""
    conn = sqlite3.connect(state / "state.db")
    try:
        jobs = conn.execute("SELECT count(*) FROM review_jobs").fetchone()[0]
        pairs = conn.execute("SELECT count(*) FROM review_pairs").fetchone()[0]
    finally:
        conn.close()
    return jobs, pairs


def fresh_state(state: Path) -> None:
    if state.exists():
        shutil.rmtree(state)
    os.sync()  # untimed: the previous run's and the deletion's writes are not the next run's


PROFILE_CODE = """
import cProfile, os, pstats, sys
sys.argv = {argv!r}
from orchestrator.cli import main
prof = cProfile.Profile()
real, sys.stdout = sys.stdout, open(os.devnull, "w")
prof.enable()
try:
    main()
except SystemExit:
    pass
prof.disable()
sys.stdout = real
for key in ("cumulative", "tottime"):
    print(f"--- by {{key}}")
    pstats.Stats(prof).sort_stats(key).print_stats({top})
"""


def profile(argv: list[str], env: dict[str, str], top: int = 30) -> None:
    code = PROFILE_CODE.format(argv=["reviewq", *argv], top=top)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr)
        return
    for part in r.stdout.split("--- by ")[1:]:
        key, _, rest = part.partition("\n")
        print(f"\nProfile: cProfile of one run, top {top} by {key}")
        print(rest[rest.find("   ncalls") :].rstrip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="commonplace-kb.tar.gz")
    ap.add_argument("--repeat", type=int, default=3, help="timed create-jobs runs")
    ap.add_argument("--model", default="bench", help="the model partition")
    ap.add_argument("--dir", type=Path, help="work here (absent or empty; kept afterwards)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument("--profile", action="store_true", help="cProfile one more run")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    corpus = find_corpus(args.corpus)
    if corpus is None:
        print(f"skipped: corpus not found at {args.corpus} (pass --corpus PATH)")
        return 0
    if args.dir is not None:
        if args.dir.exists() and any(args.dir.iterdir()):
            ap.error(f"--dir {args.dir}: not empty")
        args.dir.mkdir(parents=True, exist_ok=True)
        base, keep = args.dir.resolve(), True
    else:
        base, keep = Path(tempfile.mkdtemp(prefix="reviewq-bench-create-jobs-")), args.keep
    try:
        return bench(args, corpus, base)
    finally:
        if keep:
            print(f"kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


def bench(args: argparse.Namespace, corpus: Path, base: Path) -> int:
    root = base / "kb-root"
    extract(corpus, root)
    env = child_env(base)
    warm_bytecode(env)
    sel = base / "sel.json"
    pairs = select_json(root, sel, args.model, env)
    state = root / ".reviewq"
    argv = ["--root", str(root), "create-jobs", "--input", str(sel), "--grouping", "note"]
    argv.append("--json")
    print(f"corpus: {corpus}")
    print(f"select: {pairs} pairs -> {sel}")
    print(f"timed:  reviewq {' '.join(argv)} > /dev/null")

    runs: list[Run] = []
    jobs = 0
    for i in range(args.repeat):
        fresh_state(state)
        r = run([reviewq_exe(), *argv], os.devnull, env)
        if r.exit_code != 0:
            print(f"run {i + 1} failed ({r.exit_code}): {r.stderr.strip()[-2000:]}")
            return 1
        jobs, recorded = state_counts(state)
        skipped = sum(1 for line in r.stderr.splitlines() if line.startswith("skipped:"))
        if recorded + skipped != pairs or jobs == 0:
            print(f"run {i + 1}: {recorded} pairs recorded + {skipped} skipped != {pairs}")
            return 1
        runs.append(r)
        print(
            f"  run {i + 1}: {r.wall:6.2f} s  peak RSS {r.rss_bytes / 1e6:6.1f} MB  "
            f"{jobs} jobs, {recorded} pairs, {skipped} skipped"
        )

    walls = [r.wall for r in runs]
    med = statistics.median(walls)
    rss = max(r.rss_bytes for r in runs) / 1e6
    print()
    print(f"create-jobs --grouping note on the commonplace KB ({args.repeat} runs, fresh state)")
    print(f"  pairs {pairs}, jobs {jobs}")
    print(f"  wall  min {min(walls):.2f} s   median {med:.2f} s   ({pairs / med:,.0f} pairs/s)")
    print(f"  peak RSS {rss:.1f} MB (max over runs, MB = 10^6 bytes)")
    verdict = "PASS" if med <= TARGET_S else "MISS"
    print(
        f"  target: median <= {TARGET_S:.0f} s for about {TARGET_PAIRS:,} pairs (CONTRACT §13): "
        f"{verdict} ({med:.2f} s; commonplace's own tool: about {COMMONPLACE_S:.0f} s, "
        f"{COMMONPLACE_S / med:.1f}x)"
    )
    if args.profile:
        fresh_state(state)
        profile(argv, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
