"""state.db after a year: a state folder of ``--nights`` nightly sweeps (default 365), each
of ``--jobs`` review jobs (default 1,800, 4 pairs each over 7,100 notes and 42 gates, three
reviewers) with 1 to 6 attempts each (the earlier ones lost, not started, rate-limited or
with no output; the last finished, with cost, tokens, worker, heartbeat and recording
times): ~2.3 million attempts, 657,000 jobs, 2.6 million pairs. Rows go in with plain SQL
matching the schema (as ``bench/report.py``); then every read-only command an operator runs
is timed as a whole process (``/usr/bin/time``-like: wall, CPU, peak RSS from ``wait4``):
``status``, ``report``, ``report --since 24h``, ``jobs``, ``job N``, ``escalations``,
``export``, ``doctor``.

    .venv/bin/python bench/year.py --dir /dev/shm/year          # build (~5 min) and time
    .venv/bin/python bench/year.py --dir /dev/shm/year --time   # time an existing one
    .venv/bin/python bench/year.py --dir /tmp/year-smoke --nights 10 --jobs 200   # smoke
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.state.store import Store, timestamp  # noqa: E402

REVIEWERS = ("claude", "codex", "gemini")
GATES = [
    f"{lens}/gate-{i:02d}"
    for lens in ("prose", "frontmatter", "access", "links")
    for i in range(11)
][:42]
EARLIER = (  # an attempt before the last: (outcome, reasons, launched)
    ("lost", '["never picked up by a worker within 10 min"]', False),
    ("launch-failure", '["exited 127: claude: not found"]', False),
    ("reviewer-failure", '["rate-limit: 429 Too Many Requests"]', True),
    ("no-output", '["wrote no output"]', True),
)


def build(root: Path, nights: int, jobs: int, notes: int, seed: int) -> dict:
    rng = random.Random(seed)
    (root / "kb" / "notes").mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC).replace(hour=6, minute=0, second=0, microsecond=0)
    counts = {"jobs": 0, "attempts": 0, "pairs": 0}
    with Store.open(root / ".reviewq") as store:
        c = store.conn
        with store.write():
            note_snaps = [
                c.execute(
                    "INSERT INTO snapshots (path, sha256, text, created_at) VALUES (?, ?, ?, ?) RETURNING id",
                    (f"kb/notes/n{i:05d}.md", f"n{i}", f"# Note {i}\n\nInspect the hive.\n", timestamp(now)),
                ).fetchone()[0]
                for i in range(notes)
            ]  # fmt: skip
            gate_snaps = [
                c.execute(
                    "INSERT INTO snapshots (path, sha256, text, created_at) VALUES (?, ?, ?, ?) RETURNING id",
                    (f"kb/instructions/review-gates/{g}.md", f"g{g}", f"# {g}\n", timestamp(now)),
                ).fetchone()[0]
                for g in GATES
            ]  # fmt: skip
        job_id = 0
        for night in range(nights, 0, -1):
            start = now - timedelta(days=night - 1, hours=4)
            job_rows, pair_rows, attempt_rows = [], [], []
            with store.write():
                run = c.execute(
                    "INSERT INTO sweep_runs (name, trigger, options, started_at, finished_at, jobs) VALUES "
                    "('nightly', 'cron', '{}', ?, ?, ?) RETURNING id",
                    (timestamp(start), timestamp(start + timedelta(hours=3)), jobs),
                ).fetchone()[0]
                for k in range(jobs):
                    job_id += 1
                    t = start + timedelta(seconds=k * 5)
                    reviewer = REVIEWERS[k % 3]
                    lens_i = rng.randrange(4)
                    tries = 1 + rng.randrange(6)
                    end = t + timedelta(seconds=40 * tries)
                    job_rows.append(
                        (job_id, reviewer, GATES[lens_i * 10].split("/")[0], reviewer, f"jobs/job-{job_id}", tries,
                         run, timestamp(t), timestamp(end), timestamp(end))
                    )  # fmt: skip
                    note = rng.randrange(notes)
                    for g in range(4):
                        gate = GATES[(lens_i * 10 + (k + g) % 10) % len(GATES)]
                        r = rng.random()
                        decision = "FAIL" if r < 0.04 else "WARN" if r < 0.06 else "PASS"
                        pair_rows.append(
                            (job_id, f"kb/notes/n{note:05d}.md", gate, f"kb/instructions/review-gates/{gate}.md",
                             gate.split("/")[0], note_snaps[note], gate_snaps[GATES.index(gate)], decision,
                             f"Summary: s.\nFindings:\n- medium: finding about {gate}\n## Result: {decision}",
                             timestamp(end))
                        )  # fmt: skip
                    for a in range(1, tries + 1):
                        a0 = t + timedelta(seconds=40 * (a - 1))
                        a1 = a0 + timedelta(seconds=40)
                        if a < tries:
                            outcome, reasons, launched = EARLIER[rng.randrange(len(EARLIER))]
                            cost = 0.004 if launched else None
                        else:
                            outcome, reasons, launched, cost = "finalized", "[]", True, 0.021
                        attempt_rows.append(
                            (job_id, a, reviewer, outcome, timestamp(a0), timestamp(a1),
                             timestamp(a1) if launched else None, reasons, 3, 12_000, 900, cost, 40.0,
                             f"vm{k % 4}:{1000 + night}" if launched else None,
                             timestamp(a0) if launched else None, timestamp(a1), timestamp(a0))
                        )  # fmt: skip
                c.executemany(
                    "INSERT INTO review_jobs (id, kind, status, model_partition, grouping, lens, reviewer, job_dir, "
                    "attempt, sweep, sweep_run_id, created_at, updated_at, finished_at) "
                    "VALUES (?, 'review', 'completed', ?, 'note', ?, ?, ?, ?, 'nightly', ?, ?, ?, ?)",
                    job_rows,
                )
                c.executemany(
                    "INSERT INTO review_pairs (job_id, note_path, gate_id, gate_path, lens, note_snapshot_id, "
                    "gate_snapshot_id, decision, rationale, decided_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    pair_rows,
                )
                c.executemany(
                    "INSERT INTO attempts (job_id, attempt, runner, outcome, started_at, ended_at, heartbeat_at, "
                    "reasons, num_turns, input_tokens, output_tokens, cost_usd, duration_s, worker, launched_at, "
                    "recorded_at, taken_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    attempt_rows,
                )
                # The acceptance the night's reviews leave (one row per pair, the latest wins).
                c.executemany(
                    "INSERT OR REPLACE INTO acceptance (model_partition, note_path, gate_id, review_pair_id, "
                    "note_snapshot_id, gate_snapshot_id, decision, accepted_at) SELECT j.model_partition, "
                    "p.note_path, p.gate_id, p.id, p.note_snapshot_id, p.gate_snapshot_id, p.decision, "
                    "p.decided_at FROM review_pairs p JOIN review_jobs j ON j.id = p.job_id "
                    "WHERE p.job_id BETWEEN ? AND ?",
                    [(job_id - jobs + 1, job_id)],
                )
            counts["jobs"] += len(job_rows)
            counts["attempts"] += len(attempt_rows)
            counts["pairs"] += len(pair_rows)
        # This morning: each reviewer's last jobs still queued two hours after the sweep
        # began (the report's look for a stalled reviewer reads each one's history).
        with store.write():
            for k in range(30):
                job_id += 1
                t = timestamp(now - timedelta(hours=2))
                c.execute(
                    "INSERT INTO review_jobs (id, kind, status, model_partition, grouping, reviewer, job_dir, "
                    "sweep, sweep_run_id, created_at, updated_at) VALUES (?, 'review', 'queued', ?, 'note', ?, "
                    "?, 'nightly', ?, ?, ?)",
                    (job_id, REVIEWERS[k % 3], REVIEWERS[k % 3], f"jobs/job-{job_id}", run, t, t),
                )
        counts["queued"] = 30
    return counts


COMMANDS = {
    "status": ["status"],
    "status --json": ["status", "--json"],
    "report": ["report"],
    "report --since 24h": ["report", "--since", "24h"],
    "jobs": ["jobs"],
    "job N": ["job", "{job}"],
    "escalations": ["escalations"],
    "export": ["export"],
    "doctor": ["doctor"],
}


def timed(cmd: list[str]) -> tuple[float, float, int, int]:
    """Wall s, CPU s (user + system), peak RSS bytes, exit status of one whole process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return (
        time.perf_counter() - t0,
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss * 1024,
        os.waitstatus_to_exitcode(status),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nights", type=int, default=365)
    ap.add_argument("--jobs", type=int, default=1_800)
    ap.add_argument("--notes", type=int, default=7_100)
    ap.add_argument("--seed", type=int, default=34)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--time", action="store_true", help="Time an existing folder; build nothing.")
    ap.add_argument("--only", action="append", help="Time this command alone (repeatable).")
    args = ap.parse_args()
    db = args.dir / ".reviewq" / "state.db"
    # Built over again, the rows' fixed ids collided ("UNIQUE constraint failed", a
    # traceback); timed with none, the size's stat was one.
    if args.time != db.exists():
        ap.error(
            f"{db}: there already, time it with --time or give a new --dir"
            if db.exists()
            else f"{db}: not there, build it first (without --time)"
        )
    if not args.time:
        t0 = time.perf_counter()
        counts = build(args.dir, args.nights, args.jobs, args.notes, args.seed)
        print(f"setup: {time.perf_counter() - t0:.0f} s; {counts}")
    print(f"state.db: {db.stat().st_size / 1e6:,.0f} MB")
    exe = str(Path(sys.executable).parent / "reviewq")
    last_job = args.nights * args.jobs
    for name, argv in COMMANDS.items():
        if args.only and name not in args.only:
            continue
        cmd = [exe, "--root", str(args.dir), *(a.format(job=last_job) for a in argv)]
        timed(cmd)  # warm: bytecode and the OS cache, as on a second morning
        wall, cpu, rss, code = timed(cmd)
        print(
            f"{name:20} wall {wall:6.2f} s  cpu {cpu:6.2f} s  peak {rss / 1e6:5.0f} MB  exit {code}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
