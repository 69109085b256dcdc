"""Benchmark of the review pipeline against CONTRACT §13: a sweep of one-pair jobs with an
instant ``command`` reviewer, against a bare loop that spawns the same reviewer.

It builds in a temporary folder a KB of ``--jobs`` notes (in 20 folders) and one gate, so
``--grouping note`` makes one one-pair job per note, and a ``reviewq.toml`` whose
``command`` reviewer ``instant`` runs a tiny agent script written next to it
(``--agent sh``: ``#!/bin/sh`` + sed over the prompt's ``=== PAIR REVIEW START`` lines;
``--agent python``: fake_agent.py's good mode reading MANIFEST.json, run with ``python -I
-S``), ``concurrency = --concurrency``, ``timeout = "30s"`` (short enough for the
control's three open attempts a slot for quick agents: stop 32, ``Control._open_at_most``),
``[queue]`` at its defaults. The agent writes
``exited_at`` and ``time.time()`` (``date +%s.%N``) to stderr just before it exits (the
worker reports stderr to the control process, which keeps it in ``attempt-N/stderr.log``). Each repeat then times:

- the bare loop: the same agent spawned once per job by ``--concurrency`` threads
  (``subprocess.run``), against job folders made beforehand (untimed) by ``reviewq
  create-jobs`` in a separate state folder: the physical limit for subprocess reviewers;
- the pipeline: ``reviewq --root DIR --state S sweep --reviewer instant --workers C
  --json`` as a whole process (enqueue, control, workers, finalize of every job). From
  ``S/logs/reviewq.jsonl`` it splits the wall time into enqueue (process start →
  ``sweep.enqueued``, or the first dispatch when that comes first), startup (→ first ``attempt.dispatched``), steady state (→ last
  ``job.finalized``) and tail (→ process exit), and per job into dispatch → launch (the
  the attempt's ``launched_at`` in state.db: the worker's clock just before the launch when
  the first heartbeat or the outcome carried the start) → agent exit (``exited_at``) → ``attempt.exited`` →
  ``attempt.ended`` → ``job.finalized`` (``attempt.dispatched`` is logged after the
  message is sent, so dispatch → launch can be slightly negative). The RSS (VmRSS and VmHWM) and CPU time of the
  sweep's ``control`` and ``worker`` children and of the sweep itself are sampled from
  /proc every 100 ms.

Then, once (with the first agent), the locking variant: ``reviewq control`` and
``reviewq worker --workers C`` started by the bench, and a producer running ``reviewq enqueue --note kb/notes/gNN`` for
each of the 20 note folders while the workers run; when every job is done, every log line
and stderr file is searched for "database is locked" (and error-level lines are counted).

    .venv/bin/python bench/pipeline.py                  # 1,000 jobs, both agents, ~2 min
    .venv/bin/python bench/pipeline.py --jobs 50        # smoke, about 30 s
    .venv/bin/python bench/pipeline.py --agent sh --repeat 3 --no-locking
    .venv/bin/python bench/pipeline.py --agent sh --no-locking --dir /dev/shm/pb  # on tmpfs

Where the work folder is matters: a pipeline job creates ~15 files, a bare-loop job one.
On an ext4 without a journal (this project's VM), creating inodes slows down as deleted
ones pile up (the kernel skips recently deleted inodes), so runs on / drift slower by up to
2x within an hour of benchmarking; on tmpfs they do not.

Exit status: 0 when every run completed all its jobs (targets are reported, not
enforced), 1 when a run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

TARGET_RATIO = 0.8  # pipeline jobs/s ÷ bare-loop jobs/s
TARGET_NOTICE_MS = 50.0  # output noticed after the agent exits
TARGET_RSS_MB = 120.0  # worker RSS
FOLDERS = 20  # note folders = producer enqueues in the locking variant
LOCKED = "database is locked"
GATE_ID = "prose/body-check"
GATE_TEXT = """---
gate_id: prose/body-check
name: Body check
lens: prose
watches: [body]
---

## Failure mode

The body says nothing.

## Test

Read the body.

- FAIL: it is empty.
- PASS: it says something.
"""

AGENT_SH = r"""#!/bin/sh
# An instant reviewer: a PASS block for each pair sentinel of the prompt, then the time.
sed -n 's/^=== PAIR REVIEW START: \(.*\) ===$/=== PAIR REVIEW START: \1 ===\
Summary: instant review.\
## Result: PASS\
=== PAIR REVIEW END: \1 ===/p' "$REVIEWQ_PROMPT_PATH" > "$REVIEWQ_OUTPUT_PATH"
echo "exited_at $(date +%s.%N)" >&2
"""

AGENT_PY = """\
# An instant reviewer (tests/agents/fake_agent.py's good mode): PASS for every pair of
# MANIFEST.json, then the time, then exit without interpreter shutdown.
import json
import os
import time

env = os.environ
with open(os.path.join(env["REVIEWQ_JOB_DIR"], "MANIFEST.json")) as f:
    pairs = json.load(f)["pairs"]
blocks = []
for p in pairs:
    s = p["note_path"] + " :: " + p["gate_path"]
    blocks.append(
        f"=== PAIR REVIEW START: {s} ===\\nSummary: instant review.\\n"
        f"## Result: PASS\\n=== PAIR REVIEW END: {s} ===\\n"
    )
out = env["REVIEWQ_OUTPUT_PATH"]
with open(out, "w") as f:
    f.write("\\n".join(blocks))
os.write(2, f"exited_at {time.time()!r}\\n".encode())
os._exit(0)
"""


# --- setup ------------------------------------------------------------------------------------


def reviewq_exe() -> str:
    exe = Path(sys.executable).with_name("reviewq")
    return str(exe) if exe.exists() else shutil.which("reviewq") or "reviewq"


def child_env(base: Path) -> dict[str, str]:
    """Bytecode cached under BASE/.pycache, so no timed run compiles orchestrator/."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(base / ".pycache")
    env["REVIEWQ_LOG_FORMAT"] = "json"
    return env


def build_kb(root: Path, notes: int) -> list[str]:
    """NOTES notes spread over FOLDERS folders, one gate; returns the folders."""
    gate = root / "kb/instructions/review-gates/prose/body-check.md"
    gate.parent.mkdir(parents=True)
    gate.write_text(GATE_TEXT, encoding="utf-8")
    folders = [f"kb/notes/g{k:02d}" for k in range(FOLDERS)]
    for f in folders:
        (root / f).mkdir(parents=True)
    for i in range(notes):
        text = (
            f"---\ntitle: Note {i}\ndescription: About hive inspection {i}.\n---\n\n"
            f"# Note {i}\n\nInspect the hive every {i % 9 + 5} days in spring.\n"
            "Look for eggs, larvae and capped brood; note the temper of the colony.\n"
        )
        (root / folders[i % FOLDERS] / f"n{i:05d}.md").write_text(text, encoding="utf-8")
    return folders


def write_agents(base: Path) -> dict[str, list[str]]:
    sh = base / "agents" / "instant.sh"
    sh.parent.mkdir(parents=True, exist_ok=True)
    sh.write_text(AGENT_SH, encoding="utf-8")
    sh.chmod(0o755)
    py = base / "agents" / "instant.py"
    py.write_text(AGENT_PY, encoding="utf-8")
    return {"sh": [str(sh)], "python": [sys.executable, "-I", "-S", str(py)]}


def write_config(path: Path, argv: list[str], concurrency: int) -> None:
    cmd = ", ".join(json.dumps(a) for a in argv)
    path.write_text(
        f'[reviewers.instant]\nkind = "command"\ncommand = [{cmd}]\npartition = "instant"\n'
        f'concurrency = {concurrency}\ntimeout = "30s"\n',
        encoding="utf-8",
    )


def rq(root: Path, state: Path, config: Path, *args: str) -> list[str]:
    base = [reviewq_exe(), "--root", str(root), "--state", str(state), "--config", str(config)]
    return [*base, *args]


def check_run(argv: list[str], env: dict[str, str], what: str) -> str:
    r = subprocess.run(argv, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise SystemExit(f"{what} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return r.stdout


@dataclass
class BareJob:
    argv: list[str]
    env: dict[str, str]
    out: Path


def fixture_jobs(root: Path, base: Path, config: Path, env: dict[str, str]) -> list[Path]:
    """Job folders (MANIFEST.json, prompt.md) for the bare loop, made by create-jobs in a
    state folder of their own; untimed."""
    state = base / "fixture-state"
    sel = base / "sel.json"
    sel.write_text(
        check_run(
            rq(root, state, config, "select", "--all-gates", "--model", "instant", "--json"),
            env,
            "select",
        ),
        encoding="utf-8",
    )
    check_run(
        rq(root, state, config, "create-jobs", "--input", str(sel), "--grouping", "note"),
        env,
        "create-jobs",
    )
    conn = sqlite3.connect(state / "state.db")
    try:
        rows = conn.execute("SELECT job_dir FROM review_jobs ORDER BY id").fetchall()
    finally:
        conn.close()
    return [state / r[0] for r in rows]


def bare_jobs(
    job_dirs: list[Path], out_dir: Path, argv: list[str], root: Path, env: dict[str, str]
) -> list[BareJob]:
    jobs = []
    for i, jd in enumerate(job_dirs, 1):
        d = out_dir / f"job-{i}"
        d.mkdir(parents=True)
        e = {
            **env,
            "REVIEWQ_PROMPT_PATH": str(jd / "prompt.md"),
            "REVIEWQ_OUTPUT_PATH": str(d / "bundle-output.md"),
            "REVIEWQ_JOB_DIR": str(jd),
            "REVIEWQ_JOB_ID": str(i),
            "REVIEWQ_ATTEMPT": "1",
            "REVIEWQ_MODEL": "",
            "REVIEWQ_ROOT": str(root),
            "REVIEWQ_TASK": "review",
            "REVIEWQ_TELEMETRY_PATH": str(d / "telemetry.json"),
        }
        jobs.append(BareJob(argv, e, d / "bundle-output.md"))
    return jobs


# --- /proc sampling ---------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class ProcStat:
    role: str
    pid: int
    hwm_kb: int = 0
    rss_max_kb: int = 0
    cpu_s: float = 0.0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def _role(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return None
    if b"orchestrator" not in args:
        # A child the sweep forked (workers.sweep.Children.fork) keeps the sweep's command
        # line; its name says which it is.
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:
                name = f.read().strip()
        except OSError:
            return None
        return {b"reviewq-control": "control", b"reviewq-worker": "worker"}.get(name)
    for role in (b"control", b"worker"):
        if role in args:
            return role.decode()
    return None


def _read(pid: int, st: ProcStat) -> None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    st.hwm_kb = max(st.hwm_kb, int(line.split()[1]))
                elif line.startswith("VmRSS:"):
                    st.rss_max_kb = max(st.rss_max_kb, int(line.split()[1]))
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        st.cpu_s = (int(rest[11]) + int(rest[12])) / CLK_TCK  # utime + stime
    except (OSError, IndexError, ValueError):
        pass


class Sampler(threading.Thread):
    """VmRSS/VmHWM and CPU time every ``interval`` s of the given processes and of the
    ``control``/``worker`` children of ``parent`` (found through /proc)."""

    def __init__(self, pids: dict[int, str], parent: int | None, interval: float = 0.1):
        super().__init__(daemon=True)
        self.stats: dict[int, ProcStat] = {p: ProcStat(r, p) for p, r in pids.items()}
        self.parent = parent
        self.interval = interval
        self.stop = threading.Event()

    def run(self) -> None:
        while True:
            if self.parent is not None:
                for c in _children(self.parent):
                    if c not in self.stats:
                        role = _role(c)
                        if role:
                            self.stats[c] = ProcStat(role, c)
            for pid, st in self.stats.items():
                _read(pid, st)
            if self.stop.wait(self.interval):
                return

    def finish(self) -> dict[int, ProcStat]:
        self.stop.set()
        self.join()
        return self.stats

    def by_role(self, role: str) -> list[ProcStat]:
        return [s for s in self.stats.values() if s.role == role]


# --- logs -------------------------------------------------------------------------------------


def ts(e: dict) -> float:
    return datetime.fromisoformat(e["timestamp"]).timestamp()


def read_log(state: Path) -> list[dict]:
    """The control's log and the local workers' (STATE/worker/), in time order."""
    events = []
    for path in (state / "logs" / "reviewq.jsonl", state / "worker" / "logs" / "reviewq.jsonl"):
        if path.exists():
            lines = path.read_text(encoding="utf-8").splitlines()
            events += [json.loads(line) for line in lines if line]
    return sorted(events, key=lambda e: e["timestamp"])


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(p * len(s)) - 1)]


def dist(values: list[float]) -> str:
    if not values:
        return "n/a"
    ms = [v * 1000 for v in values]
    return (
        f"median {statistics.median(ms):7.1f}  p95 {pct(ms, 0.95):7.1f}  "
        f"max {max(ms):7.1f}  min {min(ms):7.1f} ms"
    )


def problems_in(state: Path, extra_files: list[Path]) -> tuple[int, int, list[str]]:
    """("database is locked" occurrences, error-level log lines, a few examples) in the
    state folder's reviewq.jsonl, and in the given stderr files (their lines other than
    the structured log, which repeats reviewq.jsonl): the message, or a traceback."""
    locked = errors = 0
    examples: list[str] = []
    for e in read_log(state):
        line = json.dumps(e)
        if LOCKED in line.lower():
            locked += 1
            examples.append(line[:300])
        if e.get("level") in ("error", "critical", "exception"):
            errors += 1
            examples.append(line[:300])
    files = [*extra_files, *(state / "logs").glob("*.stderr")]
    for path in files:
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith('{"') and line.endswith("}"):
                continue  # a structured log line: the same line is in reviewq.jsonl
            if LOCKED in line.lower():
                locked += 1
                examples.append(f"{path.name}: {line[:300]}")
            elif "Traceback" in line:
                errors += 1
                examples.append(f"{path.name}: {line[:300]}")
    return locked, errors, examples[:5]


# --- the runs ---------------------------------------------------------------------------------


@dataclass
class BareRun:
    wall: float
    jobs: int
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.jobs / self.wall


def run_bare(jobs: list[BareJob], concurrency: int, cwd: Path) -> BareRun:
    def one(j: BareJob) -> int:
        return subprocess.run(
            j.argv,
            env=j.env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ).returncode

    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        codes = list(pool.map(one, jobs))
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    bad = [i for i, c in enumerate(codes) if c != 0 or not jobs[i].out.exists()]
    if bad:
        raise SystemExit(f"bare loop: {len(bad)} agent run(s) failed, e.g. {jobs[bad[0]].out}")
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return BareRun(wall, len(jobs), cpu)


@dataclass
class PipelineRun:
    wall: float
    jobs: int
    enqueue_s: float
    startup_s: float
    steady_s: float
    tail_s: float
    cpu_s: float  # the whole process tree, from wait4
    procs: dict[str, ProcStat]  # role -> the largest by VmHWM (control, worker, sweep)
    cpu_by_role: dict[str, float]
    gaps: dict[str, list[float]]
    retried: int
    locked: int
    errors: int
    examples: list[str]

    @property
    def rate(self) -> float:
        return self.jobs / self.wall

    @property
    def steady_rate(self) -> float:
        return self.jobs / self.steady_s


def wait_with_timeout(proc: subprocess.Popen, timeout: float, sampler: Sampler):
    """os.wait4 with a watchdog: SIGINT after ``timeout`` (the sweep stops its children),
    then SIGKILL to it and to the children the sampler saw."""

    def fire() -> None:
        if proc.poll() is None:
            print(f"  timeout after {timeout:.0f} s: stopping the sweep", flush=True)
            proc.send_signal(signal.SIGINT)
            time.sleep(30)
            for pid in [proc.pid, *sampler.stats]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    timer = threading.Timer(timeout, fire)
    timer.daemon = True
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage


def run_pipeline(
    root: Path, state: Path, config: Path, concurrency: int, jobs: int, env: dict[str, str]
) -> PipelineRun:
    argv = rq(root, state, config, "sweep", "--reviewer", "instant")
    argv += ["--workers", str(concurrency), "--json"]
    state.parent.mkdir(parents=True, exist_ok=True)
    out_path, err_path = state.parent / "sweep.stdout", state.parent / "sweep.stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t_start = time.time()
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        sampler = Sampler({proc.pid: "sweep"}, proc.pid)
        sampler.start()
        usage = wait_with_timeout(proc, 120 + jobs * 1.0, sampler)
        wall = time.perf_counter() - t0
        t_end = t_start + wall
    stats = sampler.finish()
    if proc.returncode != 0:
        raise SystemExit(
            f"sweep failed ({proc.returncode}): {err_path.read_text(errors='replace')[-2000:]}"
        )
    summary = json.loads(out_path.read_text(encoding="utf-8"))
    done = summary["jobs"]["instant"]["completed"]
    if done != jobs or summary["failed"]:
        raise SystemExit(f"sweep: {done} of {jobs} jobs completed; failed: {summary['failed']}")

    events = read_log(state)
    first = {}
    by_job: dict[int, dict[str, float]] = {}
    for e in events:
        name = e["event"]
        first.setdefault(name, ts(e))
        if "job_id" in e and e.get("attempt") == 1:
            by_job.setdefault(e["job_id"], {}).setdefault(name, ts(e))
    last_final = max(ts(e) for e in events if e["event"] == "job.finalized")
    # sweep.enqueued comes once the job folders are written, and the sweep's children start
    # at the commit, before them: a dispatch may come first, and then startup is 0.
    t_disp = first["attempt.dispatched"]
    t_enq = min(first["sweep.enqueued"], t_disp)

    conn = sqlite3.connect(state / "state.db")
    try:
        job_dirs = dict(conn.execute("SELECT id, job_dir FROM review_jobs").fetchall())
        launched_at = dict(
            conn.execute(
                "SELECT job_id, launched_at FROM attempts WHERE attempt = 1 AND launched_at IS NOT NULL"
            ).fetchall()
        )
        retried = conn.execute("SELECT count(*) FROM attempts WHERE attempt > 1").fetchone()[0]
    finally:
        conn.close()
    gaps: dict[str, list[float]] = {
        k: []
        for k in (
            "dispatched -> launched",
            "launched -> agent exit",
            "agent exit -> attempt.exited",
            "attempt.exited -> attempt.ended",
            "attempt.ended -> job.finalized",
            "dispatched -> job.finalized",
            "worker slot (launched -> attempt.exited)",
        )
    }
    for job_id, ev in by_job.items():
        attempt_dir = state / job_dirs[job_id] / "attempt-1"
        try:
            # The worker reports the agent's stderr, where it wrote its exit time; the
            # launch is the attempt's launched_at (the worker's clock, from its first
            # heartbeat or its outcome, whichever came first).
            said = (attempt_dir / "stderr.log").read_text().split()
            exited = float(said[said.index("exited_at") + 1])
            launched = ts({"timestamp": launched_at[job_id].replace("Z", "+00:00")})
        except (OSError, ValueError, IndexError, KeyError):
            continue
        need = ("attempt.dispatched", "attempt.exited", "attempt.ended", "job.finalized")
        if not all(k in ev for k in need):
            continue
        gaps["dispatched -> launched"].append(launched - ev["attempt.dispatched"])
        gaps["launched -> agent exit"].append(exited - launched)
        gaps["agent exit -> attempt.exited"].append(ev["attempt.exited"] - exited)
        gaps["attempt.exited -> attempt.ended"].append(ev["attempt.ended"] - ev["attempt.exited"])
        gaps["attempt.ended -> job.finalized"].append(ev["job.finalized"] - ev["attempt.ended"])
        gaps["dispatched -> job.finalized"].append(ev["job.finalized"] - ev["attempt.dispatched"])
        gaps["worker slot (launched -> attempt.exited)"].append(ev["attempt.exited"] - launched)

    procs: dict[str, ProcStat] = {}
    cpu_by_role: dict[str, float] = {}
    for st in stats.values():
        if st.role not in procs or st.hwm_kb > procs[st.role].hwm_kb:
            procs[st.role] = st
        cpu_by_role[st.role] = cpu_by_role.get(st.role, 0.0) + st.cpu_s
    locked, errors, examples = problems_in(state, [err_path])
    return PipelineRun(
        wall=wall,
        jobs=jobs,
        enqueue_s=t_enq - t_start,
        startup_s=t_disp - t_enq,
        steady_s=last_final - t_disp,
        tail_s=t_end - last_final,
        cpu_s=usage.ru_utime + usage.ru_stime,
        procs=procs,
        cpu_by_role=cpu_by_role,
        gaps=gaps,
        retried=retried,
        locked=locked,
        errors=errors,
        examples=examples,
    )


@dataclass
class LockingRun:
    wall: float
    enqueues: int
    jobs: int
    completed: int
    locked: int
    errors: int
    warnings: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    procs: dict[str, ProcStat] = field(default_factory=dict)


def open_jobs(state: Path) -> tuple[int, int]:
    """(open, completed) jobs, read through a short-lived read-only connection."""
    conn = sqlite3.connect(f"file:{state / 'state.db'}?mode=ro", uri=True, timeout=30)
    try:
        rows = dict(conn.execute("SELECT status, count(*) FROM review_jobs GROUP BY status"))
    finally:
        conn.close()
    return rows.get("queued", 0) + rows.get("running", 0), rows.get("completed", 0)


def stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_locking(
    root: Path,
    state: Path,
    config: Path,
    folders: list[str],
    concurrency: int,
    jobs: int,
    env: dict[str, str],
    processes: int = 1,
) -> LockingRun:
    """``reviewq control`` + PROCESSES x ``reviewq worker --workers C/PROCESSES`` + a
    producer of one ``reviewq enqueue`` per note folder, all at once; then grep for
    "database is locked"."""
    logdir = state.parent
    logdir.mkdir(parents=True, exist_ok=True)
    workers = [f"worker-{k}" for k in range(1, processes + 1)]
    files = {n: logdir / f"{n}.stderr" for n in ("control", *workers, "producer")}
    handles = {n: open(p, "wb") for n, p in files.items()}  # noqa: SIM115 - closed below
    procs: list[subprocess.Popen] = []
    t0 = time.perf_counter()
    enqueued = 0
    try:
        control = subprocess.Popen(
            rq(root, state, config, "control"),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=handles["control"],
        )
        procs.append(control)
        threads = str(max(1, concurrency // processes))
        for w in workers:
            procs.append(
                subprocess.Popen(
                    rq(root, state, config, "worker", "--workers", threads),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=handles[w],
                )
            )
        sampler = Sampler({p.pid: "worker" for p in procs[1:]} | {control.pid: "control"}, None)
        sampler.start()
        for folder in folders:
            argv = rq(root, state, config, "enqueue", "--reviewer", "instant")
            argv += ["--note", str(root / folder), "--json"]
            r = subprocess.run(
                argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True
            )
            handles["producer"].write(r.stderr.encode())
            if r.returncode != 0:
                raise SystemExit(f"enqueue {folder} failed ({r.returncode}): {r.stderr[-2000:]}")
            enqueued += len(json.loads(r.stdout)["jobs"])
            for p in procs:
                if p.poll() is not None:
                    raise SystemExit(f"{p.args[-1]} exited {p.returncode}; see {logdir}")
        deadline = time.monotonic() + 120 + jobs * 1.0
        while True:
            n_open, completed = open_jobs(state)
            if n_open == 0:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"locking variant: {n_open} job(s) still open at the deadline")
            for p in procs:
                if p.poll() is not None:
                    raise SystemExit(f"{p.args[-1]} exited {p.returncode}; see {logdir}")
            time.sleep(0.2)
        wall = time.perf_counter() - t0
    finally:
        for p in procs:
            stop(p)
        for h in handles.values():
            h.close()
    stats = sampler.finish()
    locked, errors, examples = problems_in(state, list(files.values()))
    warnings: dict[str, int] = {}
    for e in read_log(state):
        if e.get("level") == "warning":
            warnings[e["event"]] = warnings.get(e["event"], 0) + 1
    return LockingRun(
        wall=wall,
        enqueues=len(folders),
        jobs=enqueued,
        completed=completed,
        locked=locked,
        errors=errors,
        warnings=warnings,
        examples=examples,
        procs={s.role: s for s in sorted(stats.values(), key=lambda s: s.hwm_kb)},
    )


# --- main -------------------------------------------------------------------------------------


def mb(kb: int) -> float:
    return kb * 1024 / 1e6


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000, help="one-pair jobs (= notes)")
    ap.add_argument("--concurrency", type=int, default=4, help="agents at once (both loops)")
    ap.add_argument("--repeat", type=int, default=1, help="bare loop + pipeline runs")
    ap.add_argument(
        "--agent",
        choices=("sh", "python", "both"),
        default="both",
        help="the instant reviewer: sh + sed, python -I -S, or both (default)",
    )
    ap.add_argument("--no-locking", action="store_true", help="skip the locking variant")
    ap.add_argument(
        "--worker-processes",
        type=int,
        default=1,
        help="locking variant: worker processes sharing --concurrency threads (default 1)",
    )
    ap.add_argument("--dir", type=Path, help="work here (absent or empty; kept afterwards)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    if args.jobs < FOLDERS or min(args.concurrency, args.repeat, args.worker_processes) < 1:
        ap.error(f"--jobs must be at least {FOLDERS}; the other counts at least 1")
    with work_folder(ap, args, "reviewq-bench-pipeline-") as base:
        return bench(args, base)


@contextlib.contextmanager
def work_folder(ap: argparse.ArgumentParser, args: argparse.Namespace, prefix: str):
    """The bench's folder: ``--dir`` (absent or empty, kept afterwards), else a temporary
    one, removed at the end unless ``--keep``."""
    if args.dir is not None:
        if args.dir.exists() and any(args.dir.iterdir()):
            ap.error(f"--dir {args.dir}: not empty")
        args.dir.mkdir(parents=True, exist_ok=True)
        base, keep = args.dir.resolve(), True
    else:
        base, keep = Path(tempfile.mkdtemp(prefix=prefix)), args.keep
    try:
        yield base
    finally:
        if keep:
            print(f"kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


def bench(args: argparse.Namespace, base: Path) -> int:
    # The sweep starts its children with `python -m orchestrator`, which puts the current
    # folder first on sys.path: run from a checkout, they imported that checkout's code
    # whatever PYTHONPATH named, and an old-versus-new comparison compared nothing.
    os.chdir(base)
    root = base / "kb-root"
    t = time.perf_counter()
    folders = build_kb(root, args.jobs)
    agents = write_agents(base)
    names = ["sh", "python"] if args.agent == "both" else [args.agent]
    configs = {}
    for name in names:
        configs[name] = root / ("reviewq.toml" if name == names[0] else f"reviewq.{name}.toml")
        write_config(configs[name], agents[name], args.concurrency)
    env = child_env(base)
    subprocess.run([sys.executable, "-c", "import orchestrator.cli, workers.app"], env=env)
    fixture = fixture_jobs(root, base, configs[names[0]], env)
    if len(fixture) != args.jobs:
        print(f"setup: create-jobs made {len(fixture)} jobs, expected {args.jobs}")
        return 1
    print(
        f"setup: {args.jobs} notes x 1 gate -> {len(fixture)} one-pair jobs in {base} "
        f"({time.perf_counter() - t:.1f} s, untimed)"
    )
    print(f"agents: sh = {agents['sh'][0]}; python = {' '.join(agents['python'])}")
    print(
        f"timed: reviewq --root ROOT --state S --config CFG sweep --reviewer instant "
        f"--workers {args.concurrency} --json   (concurrency = {args.concurrency}, [queue] "
        f"defaults)"
    )
    print()

    results: dict[str, tuple[list[BareRun], list[PipelineRun]]] = {}
    for name in names:
        bares: list[BareRun] = []
        pipes: list[PipelineRun] = []
        for i in range(1, args.repeat + 1):
            jobs = bare_jobs(fixture, base / f"bare-{name}-{i}", agents[name], root, env)
            os.sync()
            b = run_bare(jobs, args.concurrency, root)
            bares.append(b)
            print(
                f"[{name} {i}] bare loop: {b.wall:6.2f} s  {b.rate:6.1f} jobs/s  "
                f"(CPU {b.cpu_s:.1f} s of agents)"
            )
            os.sync()
            p = run_pipeline(
                root,
                base / f"run-{name}-{i}" / "state",
                configs[name],
                args.concurrency,
                args.jobs,
                env,
            )
            pipes.append(p)
            print(
                f"[{name} {i}] pipeline:  {p.wall:6.2f} s  {p.rate:6.1f} jobs/s  "
                f"(enqueue {p.enqueue_s:.2f} s, startup {p.startup_s:.2f} s, steady "
                f"{p.steady_s:.2f} s = {p.steady_rate:.1f} jobs/s, tail {p.tail_s:.2f} s; "
                f"CPU {p.cpu_s:.1f} s for the tree)"
            )
            print(
                f"[{name} {i}] ratio {p.rate / b.rate:.2f} (steady state {p.steady_rate / b.rate:.2f})"
            )
        results[name] = (bares, pipes)
    locking = None
    if not args.no_locking:
        name = names[0]
        print()
        print(
            f"[locking] reviewq control + {workers_text(args)} + {FOLDERS} x reviewq enqueue "
            f"--note kb/notes/gNN (agent {name})"
        )
        locking = run_locking(
            root,
            base / "run-locking" / "state",
            configs[name],
            folders,
            args.concurrency,
            args.jobs,
            env,
            args.worker_processes,
        )
        print(
            f"[locking] {locking.jobs} jobs from {locking.enqueues} enqueues, "
            f"{locking.completed} completed in {locking.wall:.2f} s"
        )
    report(args, results, locking)
    return 0


def workers_text(args: argparse.Namespace) -> str:
    n = args.worker_processes
    threads = max(1, args.concurrency // n)
    return f"{n} x reviewq worker --workers {threads}" if n > 1 else f"worker --workers {threads}"


def report(args, results, locking: LockingRun | None) -> None:
    print()
    print(
        f"Pipeline (CONTRACT §13): {args.jobs} one-pair jobs, concurrency {args.concurrency}, "
        f"{args.repeat} run(s) each; medians over runs; MB = 10^6 bytes"
    )
    all_locked = 0
    worker_hwm = 0
    for name, (bares, pipes) in results.items():
        bare = statistics.median(b.rate for b in bares)
        pipe = statistics.median(p.rate for p in pipes)
        steady = statistics.median(p.steady_rate for p in pipes)

        def med(f, pipes=pipes) -> float:
            return statistics.median(f(p) for p in pipes)

        print(f"\n  agent {name}:")
        print(
            f"    bare loop         {statistics.median(b.wall for b in bares):6.2f} s  "
            f"{bare:6.1f} jobs/s   (the physical limit)"
        )
        print(
            f"    pipeline          {med(lambda p: p.wall):6.2f} s  {pipe:6.1f} jobs/s   "
            "(the whole `reviewq sweep` process)"
        )
        print(
            f"      enqueue         {med(lambda p: p.enqueue_s):6.2f} s             "
            "(process start -> sweep.enqueued or the first dispatch)"
        )
        print(
            f"      startup         {med(lambda p: p.startup_s):6.2f} s             "
            "(sweep.enqueued -> first attempt.dispatched)"
        )
        print(
            f"      steady state    {med(lambda p: p.steady_s):6.2f} s  {steady:6.1f} jobs/s   "
            "(first attempt.dispatched -> last job.finalized)"
        )
        print(
            f"      tail            {med(lambda p: p.tail_s):6.2f} s             "
            "(last job.finalized -> process exit)"
        )
        ratio, sratio = pipe / bare, steady / bare
        runs = " ".join(f"{p.rate / b.rate:.2f}" for b, p in zip(bares, pipes, strict=True))
        print(
            f"    ratio pipeline/bare      {ratio:5.2f}   target >= {TARGET_RATIO}: "
            f"{verdict(ratio >= TARGET_RATIO)}   (of the medians; run by run: {runs})"
        )
        print(
            f"    ratio steady-state/bare  {sratio:5.2f}   (dispatch -> finalize only; "
            f"{verdict(sratio >= TARGET_RATIO)} against the same target)"
        )
        p = pipes[-1]
        notice = p.gaps["agent exit -> attempt.exited"]
        worst = max(notice) * 1000 if notice else float("inf")
        p95 = pct(notice, 0.95) * 1000 if notice else float("inf")
        print(
            f"    output noticed after the agent exits ({len(notice)} jobs, last run): "
            f"median {statistics.median(notice) * 1000:.1f} ms, p95 {p95:.1f} ms, "
            f"max {worst:.1f} ms"
        )
        print(
            f"      target <= {TARGET_NOTICE_MS:.0f} ms: {verdict(worst <= TARGET_NOTICE_MS)} "
            f"(max), {verdict(p95 <= TARGET_NOTICE_MS)} (p95)"
        )
        print("    per job, last run (attempt 1; launched = the attempt's launched_at):")
        for k, v in p.gaps.items():
            print(f"      {k:42s} {dist(v)}")
        slot = sum(p.gaps["worker slot (launched -> attempt.exited)"])
        agent = sum(p.gaps["launched -> agent exit"])
        print(
            f"    worker slots busy {slot / (args.concurrency * p.steady_s):.0%} of "
            f"{args.concurrency} x steady state (agents alone: "
            f"{agent / (args.concurrency * p.steady_s):.0%}); retried attempts {p.retried}"
        )
        cpu = ", ".join(f"{r} {c:.2f} s" for r, c in sorted(p.cpu_by_role.items()))
        print(
            f"    CPU (last run): {cpu}; whole tree {p.cpu_s:.2f} s over {p.wall:.2f} s "
            f"wall ({os.cpu_count()} CPUs); bare loop {bares[-1].cpu_s:.2f} s over "
            f"{bares[-1].wall:.2f} s"
        )
        for pr in pipes:
            for role in ("worker", "control", "sweep"):
                if role in pr.procs and role == "worker":
                    worker_hwm = max(worker_hwm, pr.procs[role].hwm_kb)
            all_locked += pr.locked
        mem = ", ".join(
            f"{r} {mb(max(pr.procs[r].hwm_kb for pr in pipes if r in pr.procs)):.1f}"
            for r in ("worker", "control", "sweep")
            if any(r in pr.procs for pr in pipes)
        )
        print(f"    peak RSS (VmHWM, MB): {mem}")
        errs = sum(pr.errors for pr in pipes)
        print(
            f"    'database is locked': {sum(pr.locked for pr in pipes)}; error-level lines: {errs}"
        )
        for ex in [x for pr in pipes for x in pr.examples][:3]:
            print(f"      e.g. {ex}")
    if locking is not None:
        all_locked += locking.locked
        for st in locking.procs.values():
            if st.role == "worker":
                worker_hwm = max(worker_hwm, st.hwm_kb)
        print(
            f"\n  locking variant: control + {workers_text(args)} + producer "
            f"({locking.enqueues} enqueues, {locking.jobs} jobs, {locking.completed} "
            f"completed, {locking.wall:.2f} s)"
        )
        mem = ", ".join(f"{r} {mb(s.hwm_kb):.1f}" for r, s in sorted(locking.procs.items()))
        print(f"    peak RSS (VmHWM, MB): {mem}")
        warn = ", ".join(f"{k} {v}" for k, v in sorted(locking.warnings.items())) or "none"
        print(
            f"    'database is locked': {locking.locked}; error-level lines: "
            f"{locking.errors}; warnings: {warn}"
        )
        for ex in locking.examples[:3]:
            print(f"      e.g. {ex}")
    print("\n  targets:")
    for name, (bares, pipes) in results.items():
        bare = statistics.median(b.rate for b in bares)
        pipe = statistics.median(p.rate for p in pipes)
        print(
            f"    [{verdict(pipe / bare >= TARGET_RATIO)}] sweep >= 80% of the bare loop "
            f"(agent {name}): {pipe:.1f} / {bare:.1f} jobs/s = {pipe / bare:.2f}"
        )
    for name, (_, pipes) in results.items():
        notice = [x for p in pipes for x in p.gaps["agent exit -> attempt.exited"]]
        worst = max(notice) * 1000
        over = sum(1 for x in notice if x * 1000 > TARGET_NOTICE_MS)
        print(
            f"    [{verdict(worst <= TARGET_NOTICE_MS)}] output noticed <= 50 ms after "
            f"exit (agent {name}): max {worst:.1f} ms, p95 {pct(notice, 0.95) * 1000:.1f} "
            f"ms, {over} of {len(notice)} jobs over 50 ms"
        )
    print(
        f"    [{verdict(mb(worker_hwm) <= TARGET_RSS_MB)}] worker RSS <= 120 MB: "
        f"peak VmHWM {mb(worker_hwm):.1f} MB"
    )
    if locking is not None:
        print(
            f"    [{verdict(all_locked == 0)}] zero 'database is locked' with "
            f"{workers_text(args)}, a producer and control: {locking.locked} in the locking variant, {all_locked} "
            "in all runs"
        )


if __name__ == "__main__":
    sys.exit(main())
