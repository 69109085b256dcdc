"""The worker's own CPU per attempt, without queues or a control process: ``--threads``
threads call ``workers.attempt.run_attempt`` ``--attempts`` times in all, with an instant
``sh`` agent and a KB of ``--notes`` notes as the trees every attempt guards (as the
sweep's worker, which sees the KB). Timed: the wall time and this process's CPU
(``RUSAGE_SELF``: scans of the KB, launch, wait, reaping the session, classifying; the
agents' own CPU is not in it). The figure the pipeline's worker pays per job on top of
its queue traffic, and steadier than a whole sweep on a shared machine.

    .venv/bin/python bench/attempts.py                    # 1,000 notes, 400 attempts, 4 threads
    PYTHONPATH=/path/to/old-checkout .venv/bin/python bench/attempts.py   # the old code

Exit status: 0 when every attempt ended with its output, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchestrator.config import ReviewerProfile
from workers.attempt import OUTPUT, run_attempt
from workers.reviewers import AttemptSpec, Command, for_profile

AGENT = '#!/bin/sh\nprintf "## Result: PASS\\n" > "$1"\n'


def build(base: Path, notes: int) -> Path:
    for i in range(notes):
        folder = base / "kb" / "notes" / f"g{i % 20:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"n{i:05d}.md").write_text(f"# Note {i}\n\nInspect the hive.\n")
    agent = base / "agent.sh"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    return agent


def one(base: Path, agent: Path, i: int) -> str:
    folder = base / "attempts" / f"a{i}"
    folder.mkdir(parents=True)
    spec = AttemptSpec(
        "review", i, 1, folder / "prompt.md", folder / "out.md", folder, folder, base, "m"
    )
    reviewer = for_profile(ReviewerProfile(name="instant", kind="command", command=["x"]))
    argv = [str(agent), str(spec.output_path)]
    reviewer.command = lambda spec: Command(argv=argv, cwd=folder)  # type: ignore[method-assign]
    out = run_attempt(
        reviewer,
        spec,
        timeout_s=30,
        max_turns=5,
        guarded=["kb/notes/g00/n00000.md"],
        trees=["kb"],
    )
    shutil.rmtree(folder, ignore_errors=True)
    return out.classification


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notes", type=int, default=1000, help="notes in the guarded KB")
    ap.add_argument("--attempts", type=int, default=400, help="attempts in all")
    ap.add_argument("--threads", type=int, default=4, help="attempts at once")
    args = ap.parse_args()
    if min(args.notes, args.attempts, args.threads) < 1:
        ap.error("--notes, --attempts and --threads must be at least 1")
    base = Path(tempfile.mkdtemp(prefix="reviewq-bench-attempts-"))
    try:
        agent = build(base, args.notes)
        print(f"load average {os.getloadavg()[0]:.2f}")
        t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        with ThreadPoolExecutor(args.threads) as pool:
            got = list(pool.map(lambda i: one(base, agent, i), range(args.attempts)))
        c1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
    finally:
        shutil.rmtree(base, ignore_errors=True)
    cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    print(
        f"{args.attempts} attempts, {args.threads} threads, {args.notes} notes: wall {wall:.2f} s, "
        f"worker CPU {cpu:.2f} s = {cpu / args.attempts * 1000:.2f} ms an attempt"
    )
    bad = [c for c in got if c != OUTPUT]
    if bad:
        print(f"{len(bad)} attempts did not end with their output: {sorted(set(bad))}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
