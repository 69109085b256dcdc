"""Benchmark of ``reviewq report`` on a large night (issue 13).

It builds a state folder holding one night of ``--jobs`` review jobs (default 10,000; 5
pairs each over ``--notes`` notes and 40 gates in 4 lenses, about 4 % FAIL and 2 % WARN),
one attempt per job with cost and tokens, 3 % failed jobs, a fix job per 20 review jobs
(applied, with the note text before and after), open escalations as a real night leaves
them (``escalate``), and 13 earlier nights of a tenth the size for the trends. Rows go
in with plain SQL in one transaction (the setup time is printed). It then times

    reviewq --root DIR report --since 24h --html DIR/report.html

as a whole process, ``--repeat`` times, and prints wall time (min and median), the page's
size and the child's peak RSS (``os.wait4``); then once with ``--full``. Every run's JSON
twin (``--json``) is checked against counts computed here. Targets: ≤ 2 s and a page under
5 MB (MB = 10^6 bytes) without ``--full``; reported, not enforced.

    .venv/bin/python bench/report.py
    .venv/bin/python bench/report.py --jobs 500 --repeat 1     # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from orchestrator.cycles import escalations  # noqa: E402
from orchestrator.state.store import Store, timestamp  # noqa: E402

TARGET_S = 2.0
TARGET_BYTES = 5_000_000
GATES = [
    f"{lens}/gate-{i:02d}"
    for lens in ("prose", "frontmatter", "access", "links")
    for i in range(10)
]


def note_text(i: int, rng: random.Random) -> str:
    body = "\n".join(
        f"Line {k} of note {i}: "
        + " ".join(
            rng.choice(("bees", "brood", "nectar", "queen", "frame", "varroa")) for _ in range(10)
        )
        for k in range(30)
    )
    return f"---\ntitle: Note {i}\ndescription: About note {i}.\n---\n{body}\n"


def gate_text(gate_id: str) -> str:
    lens, name = gate_id.split("/")
    return (
        f"---\ngate_id: {gate_id}\nname: {name}\nlens: {lens}\nwatches: [body]\n---\n\n"
        "## Failure mode\n\nIt fails.\n\n## Test\n\nCheck it.\n"
    )


def build(root: Path, jobs: int, notes: int, seed: int) -> dict:
    rng = random.Random(seed)
    (root / "kb" / "notes").mkdir(parents=True)
    state = root / ".reviewq"
    now = datetime.now(UTC)
    counts = {
        "jobs": 0,
        "pairs": 0,
        "FAIL": 0,
        "WARN": 0,
        "failed": 0,
        "fixes": 0,
        "escalations": 0,
    }
    with Store.open(state) as store:
        c = store.conn
        with store.write():
            texts = [note_text(i, rng) for i in range(notes)]
            # The KB as the night left it: an escalation whose note or gate is gone can
            # only be rejected, and the page said so of every one.
            for i, text in enumerate(texts):
                (root / f"kb/notes/n{i:05d}.md").write_text(text)
            for g in GATES:
                gate_file = root / f"kb/instructions/review-gates/{g}.md"
                gate_file.parent.mkdir(parents=True, exist_ok=True)
                gate_file.write_text(gate_text(g))
            note_snaps = [
                c.execute(
                    "INSERT INTO snapshots (path, sha256, text, created_at) VALUES (?, ?, ?, ?) RETURNING id",
                    (f"kb/notes/n{i:05d}.md", f"n{i}", texts[i], timestamp(now)),
                ).fetchone()[0]
                for i in range(notes)
            ]
            gate_snaps = [
                c.execute(
                    "INSERT INTO snapshots (path, sha256, text, created_at) VALUES (?, ?, ?, ?) RETURNING id",
                    (f"kb/instructions/review-gates/{g}.md", f"g{g}", f"# {g}\n", timestamp(now)),
                ).fetchone()[0]
                for g in GATES
            ]
            job_id = 0
            for night in range(14):
                n_jobs = jobs if night == 0 else max(1, jobs // 10)
                start = now - timedelta(days=night, hours=8)
                run = c.execute(
                    "INSERT INTO sweep_runs (name, trigger, options, started_at, jobs) VALUES "
                    "('nightly', 'cron', '{}', ?, ?) RETURNING id",
                    (timestamp(start), n_jobs),
                ).fetchone()[0]
                job_rows, pair_rows, attempt_rows = [], [], []
                for k in range(n_jobs):
                    job_id += 1
                    t = start + timedelta(seconds=k * 2)
                    failed = rng.random() < 0.03
                    lens_i = rng.randrange(4)
                    job_rows.append(
                        (job_id, "failed" if failed else "completed", GATES[lens_i * 10].split("/")[0],
                         "claude", run, json.dumps(["exited 1 after 12 s: rate limited"]) if failed else None,
                         timestamp(t), timestamp(t + timedelta(seconds=30)), timestamp(t + timedelta(seconds=30)))
                    )  # fmt: skip
                    note = rng.randrange(notes)
                    if failed and note % ESCALATED_EVERY == 0:
                        # Every 20th note has escalations: a failed job on one of its
                        # pairs is that escalation's in the report, not a failed job to count.
                        note = note + 1 if note + 1 < notes else note - 1
                    for g in range(5):
                        gate = GATES[lens_i * 10 + (k + g) % 10]
                        r = rng.random()
                        decision = (
                            None
                            if failed
                            else ("FAIL" if r < 0.04 else "WARN" if r < 0.06 else "PASS")
                        )
                        pair_rows.append(
                            (job_id, f"kb/notes/n{note:05d}.md", gate, f"kb/instructions/review-gates/{gate}.md",
                             gate.split("/")[0], note_snaps[note], gate_snaps[GATES.index(gate)], decision,
                             f"Summary: s.\nFindings:\n- medium: finding about {gate}\n## Result: {decision}",
                             timestamp(t + timedelta(seconds=30)) if decision else None)
                        )  # fmt: skip
                        if night == 0 and decision:
                            counts["pairs"] += 1
                            counts[decision] = counts.get(decision, 0) + 1
                    attempt_rows.append(
                        (job_id, 1, "queue", "failed" if failed else "finalized", timestamp(t), timestamp(t + timedelta(seconds=30)),
                         3, 12_000, 900, 0.021, 30.0)
                    )  # fmt: skip
                    if night == 0:
                        counts["jobs"] += 1
                        counts["failed"] += failed
                c.executemany(
                    "INSERT INTO review_jobs (id, kind, status, model_partition, grouping, lens, reviewer, job_dir, "
                    "sweep, sweep_run_id, failure_reasons, created_at, updated_at, finished_at) "
                    "VALUES (?, 'review', ?, 'claude', 'note', ?, ?, '', 'nightly', ?, ?, ?, ?, ?)",
                    job_rows,
                )
                c.executemany(
                    "INSERT INTO review_pairs (job_id, note_path, gate_id, gate_path, lens, note_snapshot_id, "
                    "gate_snapshot_id, decision, rationale, decided_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    pair_rows,
                )
                c.executemany(
                    "INSERT INTO attempts (job_id, attempt, runner, outcome, started_at, ended_at, num_turns, "
                    "input_tokens, output_tokens, cost_usd, duration_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    attempt_rows,
                )
                if night:
                    continue
                for k in range(jobs // 20):
                    job_id += 1
                    note = rng.randrange(notes)
                    fixed = (
                        texts[note].replace("Line 3 ", "Line 3 (fixed) ", 1)
                        + "A sentence the fixer added.\n"
                    )
                    fixed_snap = c.execute(
                        "INSERT INTO snapshots (path, sha256, text, created_at) VALUES (?, ?, ?, ?) RETURNING id",
                        (f"kb/notes/n{note:05d}.md", f"f{job_id}", fixed, timestamp(now)),
                    ).fetchone()[0]
                    t = start + timedelta(seconds=k * 3)
                    c.execute(
                        "INSERT INTO review_jobs (id, kind, status, model_partition, grouping, reviewer, job_dir, sweep, "
                        "sweep_run_id, note_path, review_reviewer, result, fixed_snapshot_id, fix_commit, created_at, "
                        "updated_at, finished_at) VALUES (?, 'fix', 'completed', 'claude', 'fix', 'claude', '', "
                        "'nightly', ?, ?, 'claude', 'applied', ?, ?, ?, ?, ?)",
                        (
                            job_id,
                            run,
                            f"kb/notes/n{note:05d}.md",
                            fixed_snap,
                            f"{job_id:040x}",
                            timestamp(t),
                            timestamp(t),
                            timestamp(t),
                        ),
                    )
                    c.execute(
                        "INSERT INTO review_pairs (job_id, note_path, gate_id, gate_path, lens, note_snapshot_id, "
                        "gate_snapshot_id) VALUES (?, ?, ?, ?, 'prose', ?, ?)",
                        (job_id, f"kb/notes/n{note:05d}.md", GATES[0], f"kb/instructions/review-gates/{GATES[0]}.md",
                         note_snaps[note], gate_snaps[0]),
                    )  # fmt: skip
                    counts["fixes"] += 1
                night_run, night_start = run, start
            escalate(
                store, state, job_id, (note_snaps, gate_snaps), night_run, night_start, rng, counts
            )
    return counts


ESCALATED_EVERY = 20  # one note in 20 has open escalations, as on stop 47's real night


def escalate(store, state, job_id, snaps, run, start, rng, counts) -> None:
    """Open escalations as a real night leaves them (stop 47's: 458 on 149 notes, the
    page's 50 with the most gates holding 217): one note in 20, each with 1 to 8 of its
    lens's gates escalated after three rejections (a FAIL, then two fixes that changed
    nothing, each a fix job the page lists under the note), its call, material and report
    file written by the product's own ``escalations.report``. Its first version wrote one
    line-long file for 3 gates of one note in 100: a page of 0.3 MB where a real night of
    1,859 jobs made 0.5 MB."""
    (state / "escalations").mkdir(exist_ok=True)
    c, (note_snaps, gate_snaps) = store.conn, snaps
    for note in range(0, len(note_snaps), ESCALATED_EVERY):
        path = f"kb/notes/n{note:05d}.md"
        lens = rng.randrange(4)
        for g in rng.sample(GATES[lens * 10 : lens * 10 + 10], rng.randint(1, 8)):
            finding = f"high: the note does not meet {g}: its third paragraph says more than its sources do."
            fixes = []
            for k in range(2):
                t = timestamp(start + timedelta(minutes=10 + k))
                job_id += 1
                fixes.append(
                    c.execute(
                        "INSERT INTO review_jobs (id, kind, status, model_partition, grouping, reviewer, job_dir, "
                        "sweep, sweep_run_id, note_path, review_reviewer, result, created_at, updated_at, "
                        "finished_at) VALUES (?, 'fix', 'completed', 'claude', 'fix', 'claude', '', 'nightly', "
                        "?, ?, 'claude', 'unchanged', ?, ?, ?) RETURNING id",
                        (job_id, run, path, t, t, t),
                    ).fetchone()[0]
                )
                c.execute(
                    "INSERT INTO review_pairs (job_id, note_path, gate_id, gate_path, lens, note_snapshot_id, "
                    "gate_snapshot_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (fixes[-1], path, g, f"kb/instructions/review-gates/{g}.md", g.split("/")[0],
                     note_snaps[note], gate_snaps[GATES.index(g)]),
                )  # fmt: skip
            for k, (kind, gist) in enumerate(
                [("review-fail", finding), ("fix-unchanged", "the fix changed nothing"),
                 ("fix-unchanged", "the fix changed nothing")], 1
            ):  # fmt: skip
                c.execute(
                    "INSERT INTO cycle_events (model_partition, note_path, gate_id, rejection, kind, "
                    "job_id, gist, at) VALUES ('claude', ?, ?, ?, ?, ?, ?, ?)",
                    (path, g, k, kind, fixes[k - 2] if k > 1 else None, gist, timestamp(start)),
                )
            esc = c.execute(
                "INSERT INTO escalations (model_partition, note_path, gate_id, reason, cycles, reviewer, "
                "fixer, report_path, raised_at, material, recommend, call, job_id) VALUES ('claude', ?, ?, "
                "'3 consecutive rejections (the last fix changed nothing)', 3, 'claude', 'claude', '', ?, "
                "?, ?, 'reject', ?) RETURNING id",
                (path, g, timestamp(start + timedelta(minutes=12)), json.dumps([finding]),
                 finding + "; the fixer's last attempt changed nothing", fixes[-1]),
            ).fetchone()[0]  # fmt: skip
            rel = f"escalations/escalation-{esc}.md"
            c.execute("UPDATE escalations SET report_path = ? WHERE id = ?", (rel, esc))
            (state / rel).write_text(escalations.report(store, esc))
            counts["escalations"] += 1


def timed(cmd: list[str]) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed: {proc.stderr.read().decode()}")
    proc.stderr.close()
    return wall, usage.ru_maxrss * 1024, proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--notes", type=int, default=3_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--dir", type=Path, default=None, help="Build here and keep it.")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-report-"))
    exe = str(Path(sys.executable).parent / "reviewq")
    try:
        t0 = time.perf_counter()
        counts = build(root, args.jobs, args.notes, args.seed)
        print(f"setup: {time.perf_counter() - t0:.1f} s; {counts}")
        data = json.loads(
            subprocess.run(
                [exe, "--root", str(root), "report", "--json", "--since", "24h"],
                capture_output=True, text=True, check=True,
            ).stdout
        )  # fmt: skip
        r = data["reviewed"]
        checks = {
            "pairs": (r["pairs"], counts["pairs"]),
            "FAIL": (r["decisions"].get("FAIL", 0), counts["FAIL"]),
            "failed jobs": (data["needs_you"]["failed_total"], counts["failed"]),
            "fixes": (data["kb_changes"]["fixes_applied"], counts["fixes"]),
            "escalations": (data["needs_you"]["escalations_open"], counts["escalations"]),
        }
        bad = {k: v for k, v in checks.items() if v[0] != v[1]}
        if bad:
            print(f"bench: the report's counts differ from the built night: {bad}")
            return 1
        page = root / "report.html"
        cmd = [exe, "--root", str(root), "report", "--since", "24h", "--html", str(page)]
        timed(cmd)  # warm: bytecode and the OS cache, as on a second morning
        runs = [timed(cmd) for _ in range(args.repeat)]
        walls = [w for w, _, _ in runs]
        size = page.stat().st_size
        full_wall, full_rss, _ = timed([*cmd, "--full"])
        full_size = page.stat().st_size
        med = statistics.median(walls)
        print(
            f"report of {counts['jobs']:,} jobs ({counts['pairs']:,} pairs): min {min(walls):.2f} s, "
            f"median {med:.2f} s (target ≤ {TARGET_S} s: {'met' if med <= TARGET_S else 'MISSED'}); "
            f"page {size / 1e6:.2f} MB (target < 5 MB: {'met' if size < TARGET_BYTES else 'MISSED'}); "
            f"peak RSS {max(r for _, r, _ in runs) / 1e6:.0f} MB"
        )
        print(
            f"--full: {full_wall:.2f} s, page {full_size / 1e6:.2f} MB, peak RSS {full_rss / 1e6:.0f} MB"
        )
        return 0
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
