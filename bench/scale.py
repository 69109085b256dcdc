"""What an operator's commands cost on the commonplace KB copied ``--copies`` times.

It extracts ``commonplace-kb.tar.gz`` (see ``bench/create_jobs.py``) and puts N copies of
its notes under ``kb/notes/cNN/`` (the links inside each copy stay resolvable), with the
corpus's gates and types. Then, each as a whole process with its wall time and its own
CPU and peak RSS (``os.wait4``): ``select --all-gates --json`` (every pair missing),
``enqueue --all-gates --fix`` (the first night's jobs, queued), ``enqueue`` again (every
pair already queued), ``status``, ``jobs``, ``report`` and ``doctor``. Last, in-process,
the CPU of one look of a sweep at state.db (``orchestrator.state.status.progress`` over
the queued jobs it found): a sweep looks again after at least ``Looks.SHARE`` times the
look's time (stop 33; five times a second before). No job is run: a sweep of the first
night runs one agent per job (bench/pipeline.py measures that).

    .venv/bin/python bench/scale.py                    # 20 copies: ~7,100 notes, ~273,000 pairs
    .venv/bin/python bench/scale.py --copies 1 --dir /dev/shm/s1

Exit status: 0, or when the corpus is absent (skipped with a message); 1 when a command
fails. Nothing is a target here but select's (CONTRACT §13, for its 5%-edited case).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from create_jobs import DEFAULT_CORPUS, child_env, extract, find_corpus, reviewq_exe, warm_bytecode

COMMANDS = [
    ("select --all-gates --json", ["select", "--all-gates", "--model", "offline", "--json"]),
    ("enqueue --all-gates --fix", ["enqueue", "--all-gates", "--fix"]),
    ("enqueue again (all queued)", ["enqueue", "--all-gates", "--fix"]),
    ("status", ["status"]),
    ("jobs", ["jobs"]),
    ("report", ["report"]),
    ("doctor", ["doctor"]),
]


def build(corpus: Path, root: Path, copies: int) -> int:
    src = root / "src"
    extract(corpus, src)
    (root / "kb" / "notes").mkdir(parents=True)
    for part in ("instructions", "types"):
        shutil.copytree(src / "kb" / part, root / "kb" / part)
    for i in range(copies):
        shutil.copytree(src / "kb" / "notes", root / "kb" / "notes" / f"c{i:02d}")
    shutil.rmtree(src)
    return sum(1 for _ in (root / "kb" / "notes").rglob("*.md"))


def timed(argv: list[str], out: str, env: dict[str, str]) -> tuple[float, float, int, int]:
    """(wall s, CPU s, peak RSS bytes, exit code) of one process."""
    with open(out, "wb") as sink, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=sink, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            print(err.read().decode(errors="replace")[-2000:], file=sys.stderr)
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status)


def look_cpu(state: Path, looks: int = 10) -> tuple[int, float]:
    """(queued jobs a sweep would wait for, CPU s of one look at them)."""
    from orchestrator.state.status import SweepJobs, over_budget_runs, paused_reviewers, progress
    from orchestrator.state.store import Store, utcnow

    store = Store(state / "state.db", readonly=True)
    try:
        jobs = SweepJobs.starting(store)
        t0 = time.process_time()
        for _ in range(looks):
            progress(store, jobs, set(paused_reviewers(store, utcnow())), over_budget_runs(store))
        return len(jobs.earlier), (time.process_time() - t0) / looks
    finally:
        store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=20)
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--dir", type=Path, help="an absent or empty folder, kept afterwards")
    args = ap.parse_args()
    corpus = find_corpus(args.corpus)
    if corpus is None:
        print(f"skipped: no corpus at {args.corpus}")
        return 0
    root = args.dir or Path(tempfile.mkdtemp(prefix="reviewq-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        notes = build(corpus, root, args.copies)
        env = child_env(root)
        warm_bytecode(env)
        print(f"{args.copies} copies of the commonplace notes: {notes} notes under {root}")
        print(f"{'command':30} {'wall s':>8} {'CPU s':>8} {'peak RSS MB':>12} {'stdout MB':>10}")
        failed = False
        for label, argv in COMMANDS:
            out = str(root / "stdout.txt")
            wall, cpu, rss, code = timed([reviewq_exe(), "--root", str(root), *argv], out, env)
            size = os.path.getsize(out) / 1e6
            print(f"{label:30} {wall:8.2f} {cpu:8.2f} {rss / 1e6:12.0f} {size:10.1f}")
            failed |= code != 0
        state = root / ".reviewq"
        jobs, cpu = look_cpu(state)
        print(f"a sweep's look at its {jobs} queued jobs: {cpu * 1000:.1f} ms CPU")
        for name in ("state.db", "jobs", "logs", "queue"):
            path = state / name
            size = (
                path.stat().st_size
                if path.is_file()
                else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
            )
            print(f"{name}: {size / 1e6:.1f} MB")
        return 1 if failed else 0
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
