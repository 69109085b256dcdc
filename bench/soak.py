"""Soak of a long-running ``reviewq control`` and ``reviewq worker``: does their memory
level off?

It builds in a work folder a KB of 12 notes and two gates and a ``reviewq.toml`` with two
``command`` profiles running the suite's fake agent (tests/agents/fake_agent.py) with
``FAKE_PASS_IF_CONTAINS=FIXED``: ``soak`` fixes a note by appending a line that holds the
marker (its re-review PASSes), ``stubborn`` by appending one that does not (three
rejections, then an escalation). ``[queue]`` is at its defaults: SQLite files in
STATE/queue/, or with ``--redis`` a redis-server the script starts on loopback. Then it
starts ``reviewq control`` and ``reviewq worker --workers 2 --kb ROOT`` as a service
would (started once, left running) and drives cycles as fast as they finish:

1. edit 4 of the notes (the next 4 in turn: every note every 3 cycles), each given a new
   body without the marker, so both gates FAIL;
2. queue them: even cycles ``reviewq enqueue --all-gates --fix`` (two notes with
   ``--fixer soak``, two with ``--fixer stubborn``), odd cycles the same as two
   ``reviewq sweep --workers 0`` run at once against the running control;
3. await state.db: no job queued or running (bounded: ``--cycle-timeout``);
4. answer the escalations (``reviewq decide --note N approve``; every third note's
   ``redo --feedback ...`` in a cycle's first round, whose fix is awaited and whose new
   escalations are approved).

Every ``--sample-every`` cycles (and after the first and the last) it records each
process's VmRSS and VmHWM (/proc/PID/status), descriptors, threads, children and zombie
children, state, CPU; the sizes of state.db and its WAL, the queue files, the logs,
``jobs/`` and ``escalations/``; and, with ``--redis``, the server's used memory and
clients. It prints the table, the worker's peak against CONTRACT §13's target (worker RSS
≤ 120 MB; MB = 10^6 bytes) and each process's RSS growth per 100 cycles over the first and
the second half of the samples (least squares): a second-half slope near zero, and well
under the first half's, is RSS levelling off.

``--tracemalloc`` runs both processes under tracemalloc without touching the product: a
``sitecustomize.py`` written to DIR/tracemalloc/ (on PYTHONPATH for the two processes only)
starts it in a process whose command line is ``reviewq control``/``worker`` and writes a
snapshot whenever ``DIR/tracemalloc/PID.req`` appears; the script asks for one after the
first cycle and at the end and prints the lines that grew most between them. It costs
memory and time of its own: RSS figures of such a run are not the product's. ``--probe``
uses the same hook without tracemalloc: at each sample (``PID.probe``) each process writes
SQLite's memory in use (``sqlite3_memory_used``: the page caches tracemalloc cannot see)
and ``sys.getallocatedblocks()``.

    .venv/bin/python bench/soak.py --minutes 50                 # SQLite, as long as it takes
    .venv/bin/python bench/soak.py --cycles 20                  # smoke, about a minute or two
    .venv/bin/python bench/soak.py --minutes 20 --redis
    .venv/bin/python bench/soak.py --cycles 60 --tracemalloc    # what grows
    .venv/bin/python bench/soak.py --minutes 30 --probe         # SQLite's caches, blocks

Everything it starts (the two processes, redis-server, any sweep or enqueue in flight) is
stopped at the end and on Ctrl-C (SIGINT, then SIGKILL after 60 s). Exit status: 0 when
every cycle ended with no job open and both processes alive (targets are reported, not
enforced), 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import (  # bench/: run as a script, its folder on sys.path
    _children,
    reviewq_exe,
    stop,
    work_folder,
)

REPO = Path(__file__).resolve().parent.parent
FAKE = REPO / "tests" / "agents" / "fake_agent.py"
TARGET_RSS_MB = 120.0  # CONTRACT §13: worker RSS
NOTES = 12
EDITED = 4  # notes edited a cycle
MARKER = "FIXED"
GATES = {
    "prose/body-check": ("prose", "The body says nothing.", "Read the body."),
    "semantic/claim-check": ("semantic", "A claim with no ground.", "Read each claim."),
}
CLK_TCK = os.sysconf("SC_CLK_TCK")

SITECUSTOMIZE = """\
# Written by bench/soak.py: probes for `reviewq control` / `reviewq worker` only.
import ctypes
import json
import os
import sys
import threading
import time
import tracemalloc


def _soak_role():
    try:
        with open("/proc/self/cmdline", "rb") as f:
            args = f.read().split(b"\\0")
    except OSError:
        return None
    for role in (b"control", b"worker"):
        if role in args and not any(a.endswith(b"fake_agent.py") for a in args):
            return role.decode()
    return None


def _soak_sqlite():
    try:
        lib = ctypes.CDLL("libsqlite3.so.0")  # the library _sqlite3 links: one counter
    except OSError:
        return None
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    lib.sqlite3_memory_highwater.restype = ctypes.c_int64
    lib.sqlite3_memory_highwater.argtypes = [ctypes.c_int]
    return lib


def _soak_watch(folder):
    pid = os.getpid()
    lib = _soak_sqlite()
    n = 0
    while True:
        time.sleep(0.2)
        snap = os.path.exists(os.path.join(folder, f"{pid}.req"))
        if not snap and not os.path.exists(os.path.join(folder, f"{pid}.probe")):
            continue
        n += 1
        if snap:
            path = os.path.join(folder, f"{pid}.{n}.snap")
            tracemalloc.take_snapshot().dump(path + ".tmp")
            os.rename(path + ".tmp", path)
        probe = {
            "n": n,
            "py_blocks": sys.getallocatedblocks(),
            "sqlite_used": lib.sqlite3_memory_used() if lib else None,
            "sqlite_high": lib.sqlite3_memory_highwater(0) if lib else None,
            "traced": tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None,
        }
        path = os.path.join(folder, f"{pid}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(probe, f)
        os.rename(path + ".tmp", path)
        for what in ("req", "probe"):
            try:
                os.unlink(os.path.join(folder, f"{pid}.{what}"))
            except FileNotFoundError:
                pass


if os.environ.get("SOAK_PROBE") and _soak_role():
    if os.environ.get("SOAK_TRACEMALLOC_FRAMES"):
        tracemalloc.start(int(os.environ["SOAK_TRACEMALLOC_FRAMES"]))
    threading.Thread(target=_soak_watch, args=(os.environ["SOAK_PROBE"],), daemon=True).start()
"""


# --- setup ------------------------------------------------------------------------------------


def gate_text(gate_id: str) -> str:
    lens, failure, test = GATES[gate_id]
    name = gate_id.split("/")[1]
    return (
        f"---\ngate_id: {gate_id}\nname: {name}\nlens: {lens}\nwatches: [body]\n---\n\n"
        f"## Failure mode\n\n{failure}\n\n## Test\n\n{test}\n\n"
        "- FAIL: it does.\n- PASS: it does not.\n"
    )


def note_path(i: int) -> str:
    return f"kb/notes/n{i:02d}.md"


def note_text(i: int, revision: int, marker: bool) -> str:
    body = f"Revision {revision}: inspect hive {i} every {revision % 9 + 5} days in spring.\n"
    if marker:
        body += f"{MARKER}: checked when the KB was made.\n"
    return f"---\ntitle: Note {i}\ndescription: About hive {i}.\n---\n\n# Note {i}\n\n{body}"


def build(root: Path) -> None:
    for gate_id in GATES:
        p = root / "kb/instructions/review-gates" / f"{gate_id}.md"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(gate_text(gate_id), encoding="utf-8")
    (root / "kb/notes").mkdir(parents=True)
    for i in range(NOTES):
        (root / note_path(i)).write_text(note_text(i, 0, True), encoding="utf-8")


def profile(name: str, fix_append: str) -> str:
    env = {"FAKE_PASS_IF_CONTAINS": MARKER, "FAKE_FIX_APPEND": fix_append}
    env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    return (
        f'[reviewers.{name}]\nkind = "command"\n'
        f"command = [{json.dumps(sys.executable)}, {json.dumps(str(FAKE))}]\n"
        f'partition = "soak"\ntimeout = "60s"\nconcurrency = 2\nenv = {{ {env_toml} }}\n'
    )


def write_config(root: Path, redis_url: str | None) -> None:
    text = profile("soak", f"{MARKER}: mended by the fixer.") + profile(
        "stubborn", "Another try by the fixer."
    )
    if redis_url:
        text += f'[queue]\nurl = "{redis_url}"\n'
    (root / "reviewq.toml").write_text(text, encoding="utf-8")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- sampling ---------------------------------------------------------------------------------


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "-"


def sample_proc(pid: int) -> dict:
    st: dict = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                st[key] = int(value.split()[0])
            elif key in ("Threads", "State"):
                st[key] = value.split()[0]
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    st["cpu_s"] = (int(rest[11]) + int(rest[12])) / CLK_TCK
    st["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    kids = _children(pid)
    st["children"] = len(kids)
    st["zombies"] = sum(proc_state(k) == "Z" for k in kids)
    return st


def size(path: Path) -> int:
    """Bytes of a file, or of every file under a folder (0 when absent)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):  # gone since the walk listed it
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def count_files(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


@dataclass
class Sample:
    cycle: int
    t: float
    procs: dict[str, dict]
    files: dict[str, int]
    redis: dict[str, int] = field(default_factory=dict)


def take_sample(cycle: int, t0: float, procs: dict[str, int], state: Path, redis_cli) -> Sample:
    ps = {role: sample_proc(pid) for role, pid in procs.items()}
    files = {
        "state.db": size(state / "state.db"),
        "state.db-wal": size(state / "state.db-wal"),
        "queue": size(state / "queue"),
        "logs": size(state / "logs") + size(state / "worker" / "logs"),
        "jobs": size(state / "jobs"),
        "jobs_n": count_files(state / "jobs"),
        "escalations": size(state / "escalations"),
        "worker_tmp": count_files(state / "worker" / "attempts")
        + count_files(state / "worker" / "run"),
    }
    red = {}
    if redis_cli is not None:
        info = redis_cli.info()
        red = {
            "used_memory": info["used_memory"],
            "clients": info["connected_clients"],
            "keys": sum(v.get("keys", 0) for k, v in info.items() if k.startswith("db")),
        }
    return Sample(cycle, time.monotonic() - t0, ps, files, red)


def slope_per_100(points: list[tuple[int, int]]) -> float | None:
    """Least-squares slope of KB against cycle, times 100 cycles."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return 100 * sum((x - mx) * (y - my) for x, y in points) / sxx


# --- the cycle --------------------------------------------------------------------------------


class Soak:
    def __init__(self, args: argparse.Namespace, base: Path):
        self.args = args
        self.base = base
        self.root = base / "kb-root"
        self.state = base / "state"
        self.env = dict(os.environ)
        self.env["REVIEWQ_LOG_FORMAT"] = "json"
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.running: list[subprocess.Popen] = []  # everything to stop at the end
        self.revision = 0
        self.counts = {"jobs_awaited_s": 0.0, "decided": 0, "redo": 0, "enqueued": 0}

    def rq(self, *args: str) -> list[str]:
        return [reviewq_exe(), "--root", str(self.root), "--state", str(self.state), *args]

    def start(self, argv: list[str]) -> subprocess.Popen:
        """A reviewq command started, its output piped, stopped at the end if still running."""
        p = subprocess.Popen(
            argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.running.append(p)
        return p

    def run(self, argv: list[str], what: str, timeout: float = 300) -> str:
        p = self.start(argv)
        try:
            out, err = p.communicate(timeout=timeout)
        finally:
            self.running.remove(p)
            if p.poll() is None:
                stop(p)
        if p.returncode != 0:
            raise SoakError(f"{what} failed ({p.returncode}): {err.strip()[-1500:]}")
        return out

    def open_jobs(self) -> int:
        conn = sqlite3.connect(f"file:{self.state / 'state.db'}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute(
                "SELECT count(*) FROM review_jobs WHERE status IN ('queued', 'running')"
            ).fetchone()[0]
        finally:
            conn.close()

    def await_idle(self, daemons: list[subprocess.Popen]) -> None:
        """Until no job is queued or running, twice in a row (a fix's re-review is made
        by the control when it finalizes the fix: the gap is its transaction)."""
        t = time.monotonic()
        deadline = t + self.args.cycle_timeout
        idle = 0
        while idle < 2:
            for d in daemons:
                if d.poll() is not None:
                    raise SoakError(f"{d.args[-1]} exited {d.returncode}")
            if time.monotonic() > deadline:
                n = self.open_jobs()
                raise SoakError(f"{n} job(s) still open {self.args.cycle_timeout:.0f} s on")
            idle = idle + 1 if self.open_jobs() == 0 else 0
            time.sleep(0.1)
        self.counts["jobs_awaited_s"] += time.monotonic() - t

    def cycle(self, k: int, daemons: list[subprocess.Popen]) -> None:
        self.revision += 1
        picked = [(k * EDITED + j) % NOTES for j in range(EDITED)]
        for i in picked:
            (self.root / note_path(i)).write_text(note_text(i, self.revision, False), "utf-8")
        groups = {
            "soak": [note_path(i) for i in picked if i % 2 == 0],
            "stubborn": [note_path(i) for i in picked if i % 2 == 1],
        }
        common = ["--all-gates", "--reviewer", "soak", "--fix", "--name", "soak", "--json"]
        if k % 2 == 0 or self.args.via == "enqueue":
            for fixer, notes in groups.items():
                argv = self.rq("enqueue", *common, "--fixer", fixer)
                for n in notes:
                    argv += ["--note", n]
                out = json.loads(self.run(argv, f"enqueue --fixer {fixer}"))
                self.counts["enqueued"] += len(out.get("jobs", []))
        else:
            sweeps = []
            for fixer, notes in groups.items():
                argv = self.rq("sweep", *common, "--fixer", fixer, "--workers", "0")
                for n in notes:
                    argv += ["--note", n]
                sweeps.append((fixer, self.start(argv)))
            for fixer, p in sweeps:
                try:
                    out, err = p.communicate(timeout=self.args.cycle_timeout)
                finally:
                    self.running.remove(p)
                    if p.poll() is None:
                        stop(p)
                if p.returncode != 0:
                    raise SoakError(f"sweep --fixer {fixer} failed ({p.returncode}): {err[-1500:]}")
                self.counts["enqueued"] += json.loads(out).get("enqueued_jobs", 0)
        self.await_idle(daemons)
        for round_ in range(4):
            escalated = json.loads(self.run(self.rq("escalations", "--json"), "escalations"))
            notes = sorted({e["note_path"] for e in escalated["escalations"]})
            if not notes:
                return
            for n in notes:
                if round_ == 0 and int(n[-5:-3]) % 3 == 0:
                    call = ["redo", "--feedback", f"Say more about hive {n[-5:-3]}."]
                    self.counts["redo"] += 1
                else:
                    call = ["approve"]
                self.run(self.rq("decide", "--note", n, *call), f"decide --note {n}")
                self.counts["decided"] += 1
            self.await_idle(daemons)
        raise SoakError("escalations still open after 4 rounds of answers")


class SoakError(Exception):
    pass


# --- report -----------------------------------------------------------------------------------


def mb(kb: float) -> float:
    return kb * 1024 / 1e6


def print_table(samples: list[Sample], roles: list[str]) -> None:
    head = "| cycle | min |"
    for r in roles:
        head += f" {r} RSS / HWM MB | fds | thr | kids (Z) |"
    head += " state.db + WAL MB | queue MB | logs MB | jobs/ MB (files) | esc. MB |"
    redis = bool(samples and samples[0].redis)
    if redis:
        head += " redis MB | clients | keys |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for s in samples:
        row = f"| {s.cycle} | {s.t / 60:.1f} |"
        for r in roles:
            p = s.procs[r]
            row += (
                f" {mb(p['VmRSS']):.2f} / {mb(p['VmHWM']):.2f} | {p['fds']} | {p['Threads']} |"
                f" {p['children']} ({p['zombies']}) |"
            )
        f = s.files
        row += (
            f" {f['state.db'] / 1e6:.2f} + {f['state.db-wal'] / 1e6:.2f} | {f['queue'] / 1e6:.2f} |"
            f" {f['logs'] / 1e6:.2f} | {f['jobs'] / 1e6:.1f} ({f['jobs_n']}) |"
            f" {f['escalations'] / 1e6:.2f} |"
        )
        if redis:
            row += (
                f" {s.redis['used_memory'] / 1e6:.2f} | {s.redis['clients']} | {s.redis['keys']} |"
            )
        print(row)


def report(samples: list[Sample], roles: list[str], soak: Soak, wall: float) -> None:
    print()
    print_table(samples, roles)
    cycles = samples[-1].cycle if samples else 0
    c = soak.counts
    print(
        f"\n{cycles} cycles in {wall / 60:.1f} min ({wall / max(cycles, 1):.1f} s a cycle); "
        f"{c['enqueued']} review jobs enqueued by the bench (fixes and re-reviews not "
        f"counted), {c['decided']} decide calls ({c['redo']} redo)"
    )
    conn = sqlite3.connect(f"file:{soak.state / 'state.db'}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute(
            "SELECT kind, status, count(*) FROM review_jobs GROUP BY kind, status"
        ).fetchall()
        esc = conn.execute("SELECT count(*) FROM escalations").fetchone()[0]
    finally:
        conn.close()
    print(
        "jobs in state.db: "
        + ", ".join(f"{k} {s} {n}" for k, s, n in rows)
        + f"; escalations {esc}"
    )
    if len(samples) < 4:
        print("too few samples for slopes")
        return
    half = samples[len(samples) // 2].cycle
    print(
        f"\nRSS growth per 100 cycles (least squares, /proc's kB = KiB), first half (cycles ≤ {half}) and "
        "second half:"
    )
    for r in roles:
        for key in ("VmRSS", "RssAnon"):
            first = slope_per_100([(s.cycle, s.procs[r][key]) for s in samples if s.cycle <= half])
            second = slope_per_100([(s.cycle, s.procs[r][key]) for s in samples if s.cycle >= half])
            fmt = lambda v: "n/a" if v is None else f"{v:+.0f} KiB"  # noqa: E731
            print(f"  {r:8s} {key:7s} first half {fmt(first)}, second half {fmt(second)}")
        a, b = samples[0].procs[r], samples[-1].procs[r]
        print(
            f"  {r:8s} VmRSS {mb(a['VmRSS']):.2f} → {mb(b['VmRSS']):.2f} MB, VmHWM "
            f"{mb(b['VmHWM']):.2f} MB, fds {a['fds']} → {b['fds']}, threads "
            f"{a['Threads']} → {b['Threads']}, CPU {b['cpu_s']:.0f} s"
        )
    if "sqlite_used" in samples[-1].procs["control"]:
        print("\nprobes (--probe): SQLite's memory in use (sqlite3_memory_used, MB) and Python's")
        print("allocated blocks (sys.getallocatedblocks), each process:")
        print("| cycle | " + " | ".join(f"{r} SQLite MB | {r} blocks" for r in roles) + " |")
        print("|---|" + "---|---|" * len(roles))
        for s in samples:
            cells = []
            for r in roles:
                p = s.procs[r]
                used = p.get("sqlite_used")
                cells += [
                    "-" if used is None else f"{used / 1e6:.2f}",
                    str(p.get("py_blocks", "-")),
                ]
            print(f"| {s.cycle} | " + " | ".join(cells) + " |")
        for r in roles:
            for key, unit in (("sqlite_used", 1024), ("py_blocks", 1)):
                vals = [(s.cycle, s.procs[r].get(key)) for s in samples if s.cycle >= half]
                v = slope_per_100([(c, x // unit) for c, x in vals if x is not None])
                what = "SQLite KiB" if unit > 1 else "blocks"
                print(
                    f"  {r:8s} {what} per 100 cycles, second half: "
                    + ("n/a" if v is None else f"{v:+.0f}")
                )
    worker_hwm = max(mb(s.procs["worker"]["VmHWM"]) for s in samples)
    verdict = "PASS" if worker_hwm <= TARGET_RSS_MB else "MISS"
    print(
        f"\nworker peak RSS (VmHWM) {worker_hwm:.1f} MB, target ≤ {TARGET_RSS_MB:.0f} MB: {verdict}"
        + (" (under tracemalloc: not the product's figure)" if soak.args.tracemalloc else "")
    )


def tracemalloc_diff(folder: Path, roles: dict[str, int], top: int, frames: int) -> None:
    import tracemalloc

    for role, pid in roles.items():
        snaps = sorted(folder.glob(f"{pid}.*.snap"), key=lambda p: int(p.name.split(".")[1]))
        if len(snaps) < 2:
            print(f"tracemalloc {role}: fewer than two snapshots")
            continue
        a = tracemalloc.Snapshot.load(str(snaps[0]))
        b = tracemalloc.Snapshot.load(str(snaps[-1]))
        filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
        a, b = a.filter_traces(filters), b.filter_traces(filters)
        total = sum(s.size for s in b.statistics("filename")) - sum(
            s.size for s in a.statistics("filename")
        )
        print(
            f"\ntracemalloc {role}: traced memory {total / 1e3:+.0f} KB between snapshots; "
            f"top {top} lines by growth:"
        )
        for st in b.compare_to(a, "lineno")[:top]:
            frame = st.traceback[0]
            print(
                f"  {st.size_diff / 1e3:+8.1f} KB {st.count_diff:+6d} blocks  "
                f"{frame.filename}:{frame.lineno}"
            )
        if frames > 1:
            # The same by whole traceback, named by the innermost frame in this project's
            # code (who asked for the memory), when the allocation is in a library's.
            print(f"  by traceback ({frames} frames), the innermost project frame shown:")
            for st in b.compare_to(a, "traceback")[:top]:
                ours = [f for f in st.traceback if f.filename.startswith(str(REPO))]
                inner = st.traceback[-1]  # the most recent frame is last
                where = f"{inner.filename}:{inner.lineno}"
                if ours and ours[-1] != inner:
                    where += f" from {ours[-1].filename}:{ours[-1].lineno}"
                print(f"  {st.size_diff / 1e3:+8.1f} KB {st.count_diff:+6d} blocks  {where}")


def probe(folder: Path, pids: list[int], snapshot: bool, timeout: float = 120) -> dict:
    """Ask each process for its probe (and a tracemalloc snapshot): {pid: probe or {}}."""
    before = {p: _read_probe(folder, p).get("n", 0) for p in pids}
    for p in pids:
        (folder / f"{p}.{'req' if snapshot else 'probe'}").touch()
    deadline = time.monotonic() + timeout
    got: dict[int, dict] = {}
    while time.monotonic() < deadline and len(got) < len(pids):
        for p in pids:
            pr = _read_probe(folder, p)
            if pr.get("n", 0) > before[p]:
                got[p] = pr
        time.sleep(0.2)
    if len(got) < len(pids):
        print("probe: a process did not answer", flush=True)
    return got


def _read_probe(folder: Path, pid: int) -> dict:
    try:
        return json.loads((folder / f"{pid}.json").read_text())
    except (OSError, ValueError):
        return {}


# --- main -------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, help="stop after this many cycles")
    ap.add_argument("--minutes", type=float, help="stop after the cycle that ends past this")
    ap.add_argument("--redis", action="store_true", help="the queues on a redis-server")
    ap.add_argument("--sample-every", type=int, default=5, help="cycles between samples")
    ap.add_argument("--cycle-timeout", type=float, default=600, help="seconds a cycle may take")
    ap.add_argument(
        "--via",
        choices=("alternate", "enqueue"),
        default="alternate",
        help="queue with enqueue and sweep --workers 0 in turn (default), or enqueue only",
    )
    ap.add_argument("--tracemalloc", action="store_true", help="snapshots of both processes")
    ap.add_argument(
        "--probe",
        action="store_true",
        help="at each sample, SQLite's memory and Python's allocated blocks in both processes",
    )
    ap.add_argument("--top", type=int, default=15, help="tracemalloc lines shown")
    ap.add_argument("--frames", type=int, default=12, help="tracemalloc frames kept")
    ap.add_argument("--dir", type=Path, help="work here (absent or empty; kept afterwards)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    if args.cycles is None and args.minutes is None:
        args.cycles = 20
    # SIGTERM as Ctrl-C: the finally blocks stop what was started.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with work_folder(ap, args, "reviewq-bench-soak-") as base:
        try:
            return soak_run(args, base)
        except KeyboardInterrupt:
            print("interrupted: everything started was stopped")
            return 1


def soak_run(args: argparse.Namespace, base: Path) -> int:
    os.chdir(base)  # `python -m` children must not import a checkout in the cwd
    soak = Soak(args, base)
    build(soak.root)
    redis_proc = redis_cli = None
    daemons: list[subprocess.Popen] = []
    logs = {n: open(base / f"{n}.stderr", "wb") for n in ("control", "worker")}  # noqa: SIM115
    try:
        redis_url = None
        if args.redis:
            port = free_port()
            redis_proc = subprocess.Popen(
                [
                    "redis-server",
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(base),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                text=True,
            )
            for line in redis_proc.stdout:
                if "Ready to accept connections" in line:
                    break
            redis_proc.stdout.close()
            import redis as redis_lib

            redis_cli = redis_lib.Redis(host="127.0.0.1", port=port)
            redis_url = f"redis://127.0.0.1:{port}/0"
        write_config(soak.root, redis_url)
        env = soak.env
        tm = base / "tracemalloc"
        if args.tracemalloc or args.probe:
            tm.mkdir()
            (tm / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
            env = dict(env, SOAK_PROBE=str(tm))
            if args.tracemalloc:
                env["SOAK_TRACEMALLOC_FRAMES"] = str(args.frames)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tm), env.get("PYTHONPATH")) if p)
        for role, argv in (
            ("control", soak.rq("control")),
            ("worker", soak.rq("worker", "--workers", "2", "--kb", str(soak.root))),
        ):
            daemons.append(
                subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=logs[role],
                    stderr=logs[role],
                )
            )
        roles = {"control": daemons[0].pid, "worker": daemons[1].pid}
        print(
            f"soak: control pid {roles['control']}, worker pid {roles['worker']}, queue "
            f"{'redis ' + redis_url if redis_url else 'SQLite'}, work folder {base}",
            flush=True,
        )
        samples: list[Sample] = []
        t0 = time.monotonic()
        k = 0
        failed = None
        while True:
            try:
                soak.cycle(k, daemons)
            except SoakError as e:
                failed = f"cycle {k + 1}: {e}"
                print(failed, flush=True)
                break
            k += 1
            if k == 1 and args.tracemalloc:
                probe(tm, list(roles.values()), snapshot=True)
            done = (args.cycles is not None and k >= args.cycles) or (
                args.minutes is not None and time.monotonic() - t0 >= args.minutes * 60
            )
            if k == 1 or k % args.sample_every == 0 or done:
                s = take_sample(k, t0, roles, soak.state, redis_cli)
                if args.probe:
                    got = probe(tm, list(roles.values()), snapshot=False)
                    for role, pid in roles.items():
                        s.procs[role].update(got.get(pid, {}))
                samples.append(s)
                with open(base / "samples.jsonl", "a") as f:  # for a later look
                    f.write(json.dumps(s.__dict__) + "\n")
                w, c = s.procs["worker"], s.procs["control"]
                print(
                    f"cycle {k} at {s.t / 60:.1f} min: control {mb(c['VmRSS']):.2f} MB "
                    f"{c['fds']} fds, worker {mb(w['VmRSS']):.2f} MB {w['fds']} fds "
                    f"{w['children']} children, jobs/ {s.files['jobs'] / 1e6:.1f} MB",
                    flush=True,
                )
            if done:
                break
        if args.tracemalloc:
            probe(tm, list(roles.values()), snapshot=True)
        wall = time.monotonic() - t0
        report(samples, list(roles), soak, wall)
        if args.tracemalloc:
            tracemalloc_diff(base / "tracemalloc", roles, args.top, args.frames)
        return 1 if failed else 0
    finally:
        for p in list(soak.running):
            stop(p)
        for p in reversed(daemons):
            stop(p)
        for h in logs.values():
            h.close()
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(timeout=30)
        for d in daemons:
            if d.returncode not in (0, -signal.SIGINT, 130):
                print(
                    f"{d.args[-1] if 'control' in d.args else 'worker'} exited "
                    f"{d.returncode}; see {base}"
                )


if __name__ == "__main__":
    sys.exit(main())
