"""The floor under issue 11's throughput target: what a job's own work costs when one
Python process does it with no queue, no second process and no framework around it.

``bench/pipeline.py`` measures ``reviewq sweep`` against a bare loop that only spawns the
agent. This script runs, beside the same bare loop and on the same job folders (made by
``reviewq create-jobs``, untimed), a third loop by ``--concurrency`` threads of one
process that does for each job what the contract asks of the pipeline, by hand:

- a state transaction opening the attempt (SQLite, WAL, ``BEGIN IMMEDIATE``);
- the prompt's bytes copied into a private attempt folder (a worker's ``prompt.md``);
- the agent, as the bare loop runs it, its stdout and stderr kept in files;
- the output read and its PASS blocks counted;
- a second transaction recording the decisions and the job as completed;
- the job folder's files: ``attempt-1/`` (prompt, output, stdout, stderr), ``results/``
  with one file per pair, and an indented ``MANIFEST.json``;
- two JSON log lines written to a file.

What it leaves out is what the pipeline adds: the queue messages between processes
(pickled, stored and deleted by Huey), the control and worker processes themselves,
structlog, tenacity, heartbeats, the KB watch, the session sweep after each agent, the
acceptance rules and follow-up checks. So the ratio it prints is an upper bound for any
design that keeps the contract's files and transactions in Python, and the gap between
its CPU per job and the pipeline's is the machinery's share.

    cd /tmp && rm -rf /dev/shm/pf; /path/to/.venv/bin/python /path/to/bench/floor.py --dir /dev/shm/pf
    .venv/bin/python bench/floor.py --jobs 200 --agent python
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline import (
    BareJob,
    bare_jobs,
    build_kb,
    child_env,
    fixture_jobs,
    run_bare,
    write_agents,
    write_config,
)


class Floor:
    """The contract's per-job work, by hand, in one process."""

    def __init__(self, base: Path) -> None:
        self.base = base
        base.mkdir(parents=True)
        self.db = sqlite3.connect(base / "state.db", check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE attempts (job INTEGER PRIMARY KEY, outcome TEXT, at REAL)")
        self.db.execute("CREATE TABLE decisions (job INTEGER, verdict TEXT, text TEXT)")
        self.lock = threading.Lock()  # one writer at a time, as a single control is
        self.log = open(base / "reviewq.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def _write(self, *statements: tuple[str, tuple]) -> None:
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            for sql, params in statements:
                self.db.execute(sql, params)
            self.db.execute("COMMIT")

    def _logline(self, **fields: object) -> None:
        line = json.dumps({**fields, "timestamp": time.time()}) + "\n"
        with self.lock:
            self.log.write(line)
            self.log.flush()

    def run(self, i: int, bare: BareJob, prompt: Path) -> int:
        job = self.base / "jobs" / f"job-{i}"
        attempt = job / "attempt-1"
        attempt.mkdir(parents=True)
        self._write(("INSERT INTO attempts VALUES (?, 'dispatched', ?)", (i, time.time())))
        self._logline(event="attempt.dispatched", job_id=i, attempt=1)
        (attempt / "prompt.md").write_bytes(prompt.read_bytes())
        env = {
            **bare.env,
            "REVIEWQ_PROMPT_PATH": str(attempt / "prompt.md"),
            "REVIEWQ_OUTPUT_PATH": str(attempt / "bundle-output.md"),
        }
        with (
            open(attempt / "stdout.log", "wb") as out,
            open(attempt / "stderr.log", "wb") as err,
        ):
            code = subprocess.run(
                bare.argv, env=env, cwd=attempt, stdin=subprocess.DEVNULL, stdout=out, stderr=err
            ).returncode
        text = (attempt / "bundle-output.md").read_text(encoding="utf-8")
        passes = text.count("## Result: PASS")
        self._write(
            ("UPDATE attempts SET outcome = 'output' WHERE job = ?", (i,)),
            ("INSERT INTO decisions VALUES (?, 'PASS', ?)", (i, text)),
        )
        (job / "results").mkdir()
        (job / "results" / "pair-1.md").write_text(text, encoding="utf-8")
        manifest = {"job_id": i, "status": "completed", "decisions": {"PASS": passes}}
        (job / "MANIFEST.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        self._logline(event="job.finalized", job_id=i, decisions={"PASS": passes})
        return code


def run_floor(jobs: list[BareJob], prompts: list[Path], concurrency: int, base: Path):
    floor = Floor(base)
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        codes = list(pool.map(floor.run, range(1, len(jobs) + 1), jobs, prompts))
    wall = time.perf_counter() - t0
    self1 = resource.getrusage(resource.RUSAGE_SELF)
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if any(codes):
        raise SystemExit(f"floor loop: {sum(1 for c in codes if c)} agent run(s) failed")
    own = (self1.ru_utime + self1.ru_stime) - (self0.ru_utime + self0.ru_stime)
    agents = (kids1.ru_utime + kids1.ru_stime) - (kids0.ru_utime + kids0.ru_stime)
    return wall, own, agents


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000, help="one-pair jobs (= notes)")
    ap.add_argument("--concurrency", type=int, default=4, help="agents at once (all loops)")
    ap.add_argument("--repeat", type=int, default=3, help="bare loop + floor loop runs")
    ap.add_argument("--agent", choices=["sh", "python"], default="sh")
    ap.add_argument("--dir", type=Path, help="work here (absent or empty; kept afterwards)")
    args = ap.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="reviewq-floor-"))
    base.mkdir(parents=True, exist_ok=True)
    if any(base.iterdir()):
        raise SystemExit(f"--dir {base}: not empty")
    root = base / "kb-root"
    build_kb(root, args.jobs)
    argv = write_agents(base)[args.agent]
    config = root / "reviewq.toml"
    write_config(config, argv, args.concurrency)
    env = child_env(base)
    fixture = fixture_jobs(root, base, config, env)
    prompts = [jd / "prompt.md" for jd in fixture]
    print(f"{len(fixture)} one-pair jobs, agent {args.agent}, concurrency {args.concurrency}")
    ratios = []
    for i in range(1, args.repeat + 1):
        bare = run_bare(
            bare_jobs(fixture, base / f"bare-{i}", argv, root, env), args.concurrency, root
        )
        jobs = bare_jobs(fixture, base / f"floor-in-{i}", argv, root, env)
        wall, own, agents = run_floor(jobs, prompts, args.concurrency, base / f"floor-{i}")
        ratios.append(bare.wall / wall)
        print(
            f"[{i}] bare loop {bare.wall:5.2f} s (agents' CPU {bare.cpu_s:.2f} s); floor loop "
            f"{wall:5.2f} s (agents' CPU {agents:.2f} s, its own {own:.2f} s = "
            f"{1000 * own / len(jobs):.2f} ms a job); ratio {bare.wall / wall:.2f}"
        )
    print(f"ratio floor/bare, run by run: {', '.join(f'{r:.2f}' for r in ratios)}")
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
