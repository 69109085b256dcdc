"""Benchmark of ``reviewq select --all-gates --model P --json`` against CONTRACT §13.

It builds a synthetic KB (N notes x G gates), records an acceptance for every pair
through the store's own API, edits a seeded 5% of the notes and two gates, then times
the select command as a whole process: cold (the first run after the edits) and
unchanged (the same KB again). Every run's counts are checked against the reasons the
edits must cause, computed here independently of orchestrator/ from CONTRACT §3.

    .venv/bin/python bench/selector.py                       # 10,000 notes x 40 gates
    .venv/bin/python bench/selector.py --notes 200 --gates 10  # smoke

Exit status: 0 when the sanity checks pass (CONTRACT §13's targets are reported, not enforced),
1 when they fail or a select run fails.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.state.store import ReviewRecord, Store

NOTES_DIR = "kb/notes"
GATES_DIR = "kb/instructions/review-gates"
LENSES = ("frontmatter", "prose", "structure", "accessibility")
REGIONS = ("title", "description", "frontmatter", "body")
WATCH_CYCLE = (("title",), ("description",), ("body",), ("title", "body"), ("frontmatter",))
REASONS = ("missing-review", "gate-changed", "note-changed")
EDIT_KINDS = ("title", "description", "small-body", "large-body")
EDIT_WEIGHTS = (0.30, 0.10, 0.30, 0.30)
REWRITE_THRESHOLD = 0.5

# CONTRACT §13, for 10,000 notes x 40 gates (400,000 pairs) on the 2-core reference machine.
TARGET_PAIRS = 400_000
TARGET_COLD_S = 1.5
TARGET_COLD_MB = 300
TARGET_UNCHANGED_S = 0.5

AREAS = ("hive", "forage", "queen", "brood", "honey", "pest", "winter", "swarm", "apiary", "wax")
ASPECTS = ("biology", "practice", "season", "equipment", "records")
SUBFOLDERS = tuple(f"{a}-{b}" for a in AREAS for b in ASPECTS)  # 50 folders

NOUNS = (
    "colony",
    "queen",
    "worker",
    "drone",
    "frame",
    "super",
    "brood",
    "comb",
    "nectar",
    "pollen",
    "forage",
    "apiary",
    "hive",
    "entrance",
    "varroa",
    "mite",
    "inspection",
    "record",
    "syrup",
    "stores",
    "cluster",
    "winter",
    "spring",
    "summer",
    "autumn",
    "flow",
    "swarm",
    "cell",
    "cup",
    "larva",
    "egg",
    "pupa",
    "propolis",
    "wax",
    "smoker",
    "veil",
    "beekeeper",
    "yard",
    "orchard",
    "meadow",
    "hedge",
    "lime",
    "clover",
    "heather",
    "rape",
    "ivy",
    "bramble",
    "willow",
    "dandelion",
    "sugar",
    "temperature",
    "humidity",
    "weight",
    "scale",
    "note",
    "evidence",
    "trial",
    "survey",
    "season",
    "council",
    "neighbour",
)
VERBS = (
    "raises",
    "lowers",
    "shapes",
    "drives",
    "limits",
    "feeds",
    "protects",
    "weakens",
    "signals",
    "predicts",
    "delays",
    "triggers",
    "follows",
    "reduces",
    "supports",
    "changes",
    "marks",
    "hides",
    "reveals",
    "measures",
)
ADJECTIVES = (
    "strong",
    "weak",
    "late",
    "early",
    "heavy",
    "light",
    "local",
    "urban",
    "rural",
    "crowded",
    "calm",
    "defensive",
    "gentle",
    "capped",
    "open",
    "sealed",
    "dry",
    "damp",
    "cold",
    "warm",
    "steady",
    "uneven",
    "sparse",
    "dense",
)
LINKS = (
    "in",
    "before",
    "after",
    "during",
    "under",
    "near",
    "across",
    "within",
    "against",
    "without",
)
TAGS = (
    "beekeeping",
    "swarm-control",
    "queen-rearing",
    "forage",
    "winter-prep",
    "varroa",
    "honey-harvest",
    "urban-bees",
    "records",
    "equipment",
    "pollination",
    "bee-health",
    "seasonal",
    "local-rules",
)


# --- the synthetic KB ---------------------------------------------------------------------
def clause(rng: random.Random) -> str:
    words = [
        rng.choice(ADJECTIVES),
        rng.choice(NOUNS),
        rng.choice(VERBS),
        "the",
        rng.choice(NOUNS),
        rng.choice(LINKS),
        rng.choice(ADJECTIVES),
        rng.choice(NOUNS),
    ]
    if rng.random() < 0.3:
        words += [f"by {rng.randint(2, 40)}", rng.choice(("%", "kg", "°C", "days", "frames"))]
    text = " ".join(words)
    return text[0].upper() + text[1:]


def sentence(rng: random.Random) -> str:
    return clause(rng) + rng.choice((".", ".", ".", "; often.", " — usually."))


def body_line(rng: random.Random) -> str:
    return " ".join(sentence(rng) for _ in range(rng.randint(1, 2)))


def make_body(rng: random.Random, title: str) -> list[str]:
    """30-60 lines: a heading, then paragraphs, lists and sub-headings, all seeded."""
    target = rng.randint(30, 60)
    lines = [f"# {title}", ""]
    while len(lines) < target:
        kind = rng.random()
        if kind < 0.5:
            lines += [body_line(rng) for _ in range(rng.randint(2, 5))]
        elif kind < 0.8:
            lines += [f"- {sentence(rng)}" for _ in range(rng.randint(2, 6))]
        else:
            lines.append(f"## {rng.choice(ADJECTIVES).capitalize()} {rng.choice(NOUNS)}")
        lines.append("")
    lines = lines[:target]
    while not lines[-1]:
        lines[-1] = body_line(rng)
    return lines


@dataclass
class NoteSpec:
    index: int
    path: str
    title: str
    description: str
    tags: tuple[str, str]
    folded: bool  # description as a folded block: exercises the real YAML parser
    body: list[str]

    def render(self) -> str:
        if self.folded:
            words = self.description.split(" ")
            half = len(words) // 2
            desc = f">-\n  {' '.join(words[:half])}\n  {' '.join(words[half:])}"
        else:
            desc = self.description
        title = f'"{self.title}"' if ":" in self.title else self.title
        fm = (
            f"title: {title}\ndescription: {desc}\ntype: note\nstatus: current\n"
            f"tags: [{self.tags[0]}, {self.tags[1]}]\n"
        )
        return f"---\n{fm}---\n" + self.body_text()

    def body_text(self) -> str:
        return "\n".join(self.body) + "\n"


def make_note(rng: random.Random, i: int) -> NoteSpec:
    title = f"{rng.choice(ADJECTIVES).capitalize()} {rng.choice(NOUNS)} {rng.choice(VERBS)} "
    title += f"the {rng.choice(NOUNS)} {i}"
    if rng.random() < 0.05:
        title = f"{rng.choice(NOUNS).capitalize()}: {title.lower()}"
    desc = f"{clause(rng)} (note {i})"
    tags = tuple(rng.sample(TAGS, 2))
    path = f"{NOTES_DIR}/{SUBFOLDERS[i % len(SUBFOLDERS)]}/note-{i}.md"
    return NoteSpec(i, path, title, desc, tags, rng.random() < 0.02, make_body(rng, title))


@dataclass
class GateSpec:
    gate_id: str
    path: str
    lens: str
    name: str
    watches: tuple[str, ...]
    threshold: float | None
    text: str = ""


def make_gates(count: int) -> list[GateSpec]:
    """Watches cycle through WATCH_CYCLE; the first [body] gate and the first [title, body]
    gate are ``rewrite(0.5)``, the rest ``changed``."""
    gates: list[GateSpec] = []
    rewrite_given: set[tuple[str, ...]] = set()
    for j in range(count):
        lens = LENSES[j % len(LENSES)]
        watches = WATCH_CYCLE[j % len(WATCH_CYCLE)]
        threshold = None
        if watches in (("body",), ("title", "body")) and watches not in rewrite_given:
            rewrite_given.add(watches)
            threshold = REWRITE_THRESHOLD
        slug = f"{NOUNS[j % len(NOUNS)]}-{'-'.join(watches)}-{j:02d}"
        name = f"Check {j}: the {NOUNS[j % len(NOUNS)]} against {' and '.join(watches)}"
        gate = GateSpec(
            f"{lens}/{slug}", f"{GATES_DIR}/{lens}/{slug}.md", lens, name, watches, threshold
        )
        staleness = "changed" if threshold is None else f"rewrite({threshold})"
        gate.text = (
            f"---\ngate_id: {gate.gate_id}\nname: '{name}'\n"
            f"description: 'Synthetic gate {j} for the select benchmark.'\n"
            f"lens: {lens}\nwatches: [{', '.join(watches)}]\nstaleness: {staleness}\n---\n\n"
            f"## Failure mode\n\nThe note's {' and '.join(watches)} misstates how the "
            f"{NOUNS[j % len(NOUNS)]} behaves, or leaves the reader unable to act on it.\n\n"
            "## Test\n\nRead the watched regions and check every claim against the body.\n\n"
            "- FAIL: a claim contradicts the body.\n- WARN: a claim is vague.\n"
            "- PASS: every claim is specific and supported.\n\n"
            '## Example (fail)\n\n"Colonies always swarm in May."\n\n'
            '## Example (pass)\n\n"Colonies in this apiary swarmed from late April to June."\n'
        )
        gates.append(gate)
    return gates


def wrap(text: str, indent: int = 2) -> str:
    return textwrap.fill(
        text,
        100,
        initial_indent=" " * indent,
        subsequent_indent=" " * (indent + 4),
        break_on_hyphens=False,
    )


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))


# --- edits and the reasons they must cause ----------------------------------------------
@dataclass
class NoteEdit:
    kind: str
    spec: NoteSpec
    old_text: str
    old_body: str
    regions: frozenset[str] = field(default_factory=frozenset)
    ratio: float = 0.0


def edit_note(rng: random.Random, spec: NoteSpec, kind: str) -> NoteEdit:
    edit = NoteEdit(kind, spec, spec.render(), spec.body_text())
    if kind == "title":
        spec.title += " in practice"
    elif kind == "description":
        spec.description = "Revised " + spec.description
    elif kind == "small-body":
        candidates = [k for k, line in enumerate(spec.body) if line and not line.startswith("#")]
        k = rng.choice(candidates)
        spec.body[k] = spec.body[k] + " Checked again this season."
    else:  # large-body: rewrite 60-90% of the lines
        fresh = make_body(rng, spec.title)
        n = min(len(spec.body), len(fresh))
        for k in rng.sample(range(n), int(n * rng.uniform(0.6, 0.9))):
            spec.body[k] = fresh[k]
    new_body = spec.body_text()
    edit.regions = {
        "title": frozenset({"title", "frontmatter"}),
        "description": frozenset({"description", "frontmatter"}),
    }.get(kind, frozenset({"body"}) if new_body != edit.old_body else frozenset())
    matcher = difflib.SequenceMatcher(
        None, edit.old_body.splitlines(), new_body.splitlines(), autojunk=False
    )
    edit.ratio = 1.0 - matcher.ratio()
    return edit


def expected_reason(gate: GateSpec, edit: NoteEdit | None, gate_edited: bool) -> str | None:
    """CONTRACT §3 for a pair whose acceptance exists and whose snapshots are kept."""
    if gate_edited:
        return "gate-changed"
    if edit is None or not edit.regions:
        return None
    watched = edit.regions & set(gate.watches)
    if not watched:
        return None
    if watched - {"body"} or gate.threshold is None:
        return "note-changed"
    return "note-changed" if edit.ratio > gate.threshold else None


# --- timing one whole process ---------------------------------------------------------------
@dataclass
class Run:
    wall: float
    rss_bytes: int
    exit_code: int
    stderr: str


def child_env(root: Path) -> dict[str, str]:
    """The environment of the timed processes: bytecode cached under ROOT/.pycache.

    An installed reviewq has its .pyc files; a sandbox with PYTHONDONTWRITEBYTECODE set
    would recompile orchestrator/ in every run. The cache lives in the benchmark folder,
    so nothing is written into the project.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(root / ".pycache")
    return env


def run_select(cmd: list[str], out_path: Path, err_path: Path, env: dict[str, str]) -> Run:
    """One select process, stdout to a file; rusage from os.wait4 is this child's own."""
    with out_path.open("wb") as out, err_path.open("wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = err_path.read_text(errors="replace")
    return Run(wall, usage.ru_maxrss * 1024, proc.returncode, stderr)  # ru_maxrss: KiB


PROFILE_CODE = """
import cProfile, os, pstats, sys
sys.argv = {argv!r}
from orchestrator.cli import main
prof = cProfile.Profile()
real, sys.stdout = sys.stdout, open(os.devnull, "w")
prof.enable()
try:
    main()
except SystemExit:  # click's standalone mode always ends with sys.exit
    pass
prof.disable()
sys.stdout = real
pstats.Stats(prof).sort_stats("cumulative").print_stats({top})
"""


def profile(argv: list[str], env: dict[str, str], top: int = 30) -> None:
    """Where one select run spends its time: imports (-X importtime) and cProfile."""
    imp = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import orchestrator.cli"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in imp.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), int(parts[0].split(":")[1]), parts[2].rstrip()))
    print("\nProfile: -X importtime of orchestrator.cli (cumulative, self; microseconds)")
    for cumulative, self_us, name in sorted(rows, reverse=True)[:15]:
        print(f"  {cumulative:>8} {self_us:>8} {name}")
    print(f"\nProfile: cProfile of one select run, top {top} by cumulative time")
    code = PROFILE_CODE.format(argv=["reviewq", *argv], top=top)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    print(run.stdout[run.stdout.find("   ncalls") :] if run.returncode == 0 else run.stderr)


def state_fingerprint(state: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(state)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(state.rglob("*"))
        if p.is_file()
    }


# --- the benchmark ----------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notes", type=int, default=10_000, help="notes in the KB (10000)")
    ap.add_argument("--gates", type=int, default=40, help="gates in the catalog (40)")
    ap.add_argument("--model", default="bench-model", help="model partition (bench-model)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per phase (3)")
    ap.add_argument("--dir", type=Path, help="build the KB here (absent or empty; kept)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary KB folder")
    ap.add_argument("--seed", type=int, default=1, help="random seed (1)")
    ap.add_argument("--edit-fraction", type=float, default=0.05, help="notes edited (0.05)")
    ap.add_argument(
        "--prime",
        action="store_true",
        help="run one untimed select before the edits, as last night's run would have",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also print -X importtime and a cProfile of one select run",
    )
    args = ap.parse_args()
    if args.notes < 1 or args.gates < 2 or args.repeat < 1:
        ap.error("need --notes >= 1, --gates >= 2, --repeat >= 1")

    if args.dir is not None:
        if args.dir.exists() and any(args.dir.iterdir()):
            ap.error(f"--dir {args.dir} is not empty")
        args.dir.mkdir(parents=True, exist_ok=True)
        root = args.dir.resolve()
    else:
        root = Path(tempfile.mkdtemp(prefix="reviewq-bench-select-"))
    try:
        return bench(args, root)
    finally:
        if args.dir is None and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"\nKB kept at {root}")


def bench(args: argparse.Namespace, root: Path) -> int:
    rng = random.Random(args.seed)
    pairs = args.notes * args.gates
    state = root / ".reviewq"
    print(f"reviewq select benchmark (CONTRACT §13), seed {args.seed}")
    print(f"  KB root: {root}")
    print(f"  {args.notes:,} notes x {args.gates:,} gates = {pairs:,} pairs, model {args.model!r}")
    reviewq = Path(sys.executable).with_name("reviewq")
    exe = str(reviewq) if reviewq.exists() else shutil.which("reviewq") or "reviewq"
    argv = ["--root", str(root), "select", "--all-gates", "--model", args.model, "--json"]
    env = child_env(root)

    specs, gates = build_kb(root, rng, args.notes, args.gates)
    record_all(state, args.model, specs, gates)
    if args.prime:
        run = run_select([exe, *argv], root / "select-out.json", root / "select-err.txt", env)
        print(f"  primed: one untimed select before the edits ({run.wall:.3f} s)")
    edits, edited_gates = apply_edits(root, rng, specs, gates, args.edit_fraction)
    expect = Expectation.of(specs, gates, edits, edited_gates)
    subprocess.run([sys.executable, "-c", "import orchestrator.cli"], env=env, check=True)
    print(f"\n  command: {exe} {' '.join(argv)}")
    print(
        f"  {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} before timing "
        "(other work on the machine skews the figures)"
    )
    print(
        wrap(
            "(whole process; stdout to a file; OS caches not dropped, so 'cold' means the "
            "first run after the edits, with the KB and state.db in the page cache; "
            f"bytecode cached in {root / '.pycache'} by one untimed import first)"
        )
    )
    results, counts, checks = time_runs([exe, *argv], root, state, env, args.repeat, expect)
    if results is None:
        return 1
    sane = report(results, counts, checks, expect, pairs)
    if args.profile:
        profile(argv, env)
    return 0 if sane else 1


def build_kb(
    root: Path, rng: random.Random, n: int, g: int
) -> tuple[list[NoteSpec], list[GateSpec]]:
    t0 = time.perf_counter()
    specs = [make_note(rng, i) for i in range(n)]
    gates = make_gates(g)
    kb_bytes = 0
    for spec in specs:
        text = spec.render()
        kb_bytes += len(text.encode())
        write(root, spec.path, text)
    for gate in gates:
        write(root, gate.path, gate.text)
    print(
        f"  generate KB: {time.perf_counter() - t0:.1f} s "
        f"({kb_bytes / 1e6:.1f} MB of notes in {len(SUBFOLDERS)} folders, "
        f"{sum(s.folded for s in specs)} with a folded YAML description)"
    )
    watch_mix = Counter(
        "[" + ", ".join(x.watches) + "]" + (f" rewrite({x.threshold})" if x.threshold else "")
        for x in gates
    )
    print(wrap("gates: " + ", ".join(f"{k} x{v}" for k, v in sorted(watch_mix.items()))))
    return specs, gates


def record_all(state: Path, model: str, specs: list[NoteSpec], gates: list[GateSpec]) -> None:
    """An acceptance for every pair, through the store's own API, in one transaction."""
    t0 = time.perf_counter()
    texts = {s.path: s.render() for s in specs}
    records = [
        ReviewRecord(s.path, texts[s.path], x.gate_id, x.path, x.lens, x.text, "PASS", "ok")
        for s in specs
        for x in gates
    ]
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    with Store.open(state) as store:
        store.record_reviews(model, records)
    t_record = time.perf_counter() - t0
    db_mb = (state / "state.db").stat().st_size / 1e6
    print(
        f"  setup: record {len(records):,} acceptances with Store.record_reviews "
        f"(one transaction): {t_record:.1f} s"
    )
    print(f"    (+{t_build:.1f} s building the records; state.db {db_mb:.0f} MB)")


def apply_edits(
    root: Path, rng: random.Random, specs: list[NoteSpec], gates: list[GateSpec], fraction: float
) -> tuple[dict[str, NoteEdit], set[str]]:
    """A seeded share of the notes edited, and two gates; prints exactly which."""
    n = len(specs)
    chosen = sorted(rng.sample(range(n), max(1, round(n * fraction))))
    kinds = rng.choices(EDIT_KINDS, weights=EDIT_WEIGHTS, k=len(chosen))
    if "description" not in kinds:
        kinds[0] = "description"
    edits: dict[str, NoteEdit] = {}
    for i, kind in zip(chosen, kinds, strict=True):
        edits[specs[i].path] = edit_note(rng, specs[i], kind)
        write(root, specs[i].path, specs[i].render())
    edited = [gates[j] for j in sorted(rng.sample(range(len(gates)), 2))]
    for gate in edited:
        gate.text += "\nA sentence appended by the benchmark changes this gate.\n"
        write(root, gate.path, gate.text)

    by_kind: dict[str, list[int]] = {k: [] for k in EDIT_KINDS}
    for e in edits.values():
        by_kind[e.kind].append(e.spec.index)
    print(
        f"  edited {len(edits)} notes ({len(edits) / n:.1%}), by note number "
        f"(path {NOTES_DIR}/<folder>/note-<number>.md):"
    )
    for kind, idx in by_kind.items():
        extra = ""
        if kind == "large-body" and idx:
            over = sum(edits[specs[i].path].ratio > REWRITE_THRESHOLD for i in idx)
            extra = f"; {over} of them over rewrite({REWRITE_THRESHOLD})"
        print(wrap(f"{kind} ({len(idx)}{extra}): {', '.join(map(str, idx))}", indent=4))
    print(
        f"  edited {len(edited)} gates (a sentence appended): "
        + ", ".join(x.gate_id for x in edited)
    )
    manifest = {
        "notes": {p: {"kind": e.kind, "ratio": round(e.ratio, 4)} for p, e in edits.items()},
        "gates": [x.gate_id for x in edited],
    }
    (root / "bench-edits.json").write_text(json.dumps(manifest, indent=1))
    return edits, {x.gate_id for x in edited}


@dataclass
class Expectation:
    """What the edits must cause, from CONTRACT §3 (not from orchestrator/)."""

    reasons: dict[tuple[str, str], str]  # (note_path, gate_id) -> reason, stale pairs only
    counts: Counter
    regions: dict[str, frozenset[str]]  # note_path -> regions its edit changed

    @classmethod
    def of(
        cls,
        specs: list[NoteSpec],
        gates: list[GateSpec],
        edits: dict[str, NoteEdit],
        edited_gates: set[str],
    ) -> Expectation:
        reasons: dict[tuple[str, str], str] = {}
        for x in gates:
            gate_edited = x.gate_id in edited_gates
            for path in [s.path for s in specs] if gate_edited else edits:
                reason = expected_reason(x, edits.get(path), gate_edited)
                if reason is not None:
                    reasons[(path, x.gate_id)] = reason
        counts = Counter(reasons.values())
        counts["fresh"] = len(specs) * len(gates) - len(reasons)
        return cls(reasons, counts, {p: e.regions for p, e in edits.items()})


def time_runs(
    cmd: list[str], root: Path, state: Path, env: dict[str, str], repeat: int, expect: Expectation
) -> tuple[dict[str, list[Run]] | None, dict[str, dict], list[tuple[str, bool, str]]]:
    """``repeat`` cold runs (each on the post-edit state) then ``repeat`` unchanged runs."""
    out_path, err_path = root / "select-out.json", root / "select-err.txt"
    backup = root / ".state-before-select"
    shutil.copytree(state, backup)
    before = state_fingerprint(state)
    results: dict[str, list[Run]] = {"cold": [], "unchanged": []}
    checks: list[tuple[str, bool, str]] = []
    first_counts: dict[str, dict] = {}
    restored = False
    for phase in ("cold", "unchanged"):
        for rep in range(repeat):
            if phase == "cold" and rep > 0 and state_fingerprint(state) != before:
                shutil.rmtree(state)
                shutil.copytree(backup, state)
                restored = True
            run = run_select(cmd, out_path, err_path, env)
            results[phase].append(run)
            if run.exit_code != 0:
                print(f"  {phase} run {rep + 1}: exit {run.exit_code}\n{run.stderr}")
                return None, first_counts, checks
            if run.stderr.strip():
                print(f"  {phase} run {rep + 1} stderr: {run.stderr.strip()[:500]}")
            data = json.loads(out_path.read_text(encoding="utf-8"))
            if phase not in first_counts:
                first_counts[phase] = data["counts"]
                checks += sanity(phase, data, expect)
            elif data["counts"] != first_counts[phase]:
                name = f"{phase} run {rep + 1}: same counts as run 1"
                checks.append((name, False, f"{data['counts']} != {first_counts[phase]}"))
        if phase == "cold":
            wrote = state_fingerprint(state) != before
            print(
                "  select "
                + ("WROTE to the state folder" if wrote else "left the state folder unchanged")
                + ("; cold repetitions restore it from a copy" if restored else "")
            )
    shutil.rmtree(backup)
    same = first_counts["unchanged"] == first_counts["cold"]
    checks.append(("unchanged run: same counts as cold", same, ""))
    return results, first_counts, checks


def report(
    results: dict[str, list[Run]],
    counts: dict[str, dict],
    checks: list[tuple[str, bool, str]],
    expect: Expectation,
    pairs: int,
) -> bool:
    """The table, the sanity checks and the CONTRACT §13 summary; True if the checks pass."""
    print(
        f"\n  {'phase':<10} {'pairs':>9} {'wall min':>9} {'median':>8} {'pairs/s':>10} "
        f"{'peak RSS':>9}   runs (s)"
    )
    summary: dict[str, tuple[float, float]] = {}
    for phase, runs in results.items():
        walls = [r.wall for r in runs]
        med = statistics.median(walls)
        rss = max(r.rss_bytes for r in runs) / 1e6
        got = sum(counts[phase].values())
        summary[phase] = (med, rss)
        print(
            f"  {phase:<10} {got:>9,} {min(walls):>8.3f}s {med:>7.3f}s {got / med:>10,.0f} "
            f"{rss:>6.0f} MB   {' '.join(f'{w:.3f}' for w in walls)}"
        )
    cold = counts["cold"]
    print("  counts:   " + ", ".join(f"{k} {v:,}" for k, v in cold.items()))
    print("  expected: " + ", ".join(f"{k} {expect.counts.get(k, 0):,}" for k in cold))
    print("\n  sanity checks:")
    for name, ok, detail in checks:
        print(f"    {'PASS' if ok else 'FAIL'}  {name}" + (f": {detail}" if detail else ""))
    sane = all(ok for _, ok, _ in checks)

    print("\nSummary, CONTRACT §13 targets (median wall, max peak RSS; MB = 10^6 bytes)")
    if pairs != TARGET_PAIRS:
        print(f"  (targets for {TARGET_PAIRS:,} pairs; this run has {pairs:,}: indicative only)")
    (cold_s, cold_mb), (unchanged_s, _) = summary["cold"], summary["unchanged"]
    for label, value, limit, unit in (
        ("cold wall", cold_s, TARGET_COLD_S, "s"),
        ("cold peak RSS", cold_mb, TARGET_COLD_MB, "MB"),
        ("unchanged wall", unchanged_s, TARGET_UNCHANGED_S, "s"),
    ):
        shown = f"{value:.3f} {unit}" if unit == "s" else f"{value:.0f} {unit}"
        verdict = "met" if value <= limit else "NOT MET"
        print(f"  {label:<15} <= {limit:g} {unit:<3} {shown:>10}   {verdict}")
    print(f"  {'counts sanity':<22} {'PASS' if sane else 'FAIL':>14}")
    return sane


def sanity(phase: str, data: dict, expect: Expectation) -> list[tuple[str, bool, str]]:
    """The reasons of one select output against what the edits must cause."""
    counts = data["counts"]
    got = {(t["note_path"], t["gate_id"]): t["reason"] for t in data["targets"]}
    keys = (*REASONS, "fresh")
    out = [
        (
            f"{phase}: counts by reason",
            all(counts.get(k, 0) == expect.counts.get(k, 0) for k in keys),
            ", ".join(f"{k} {counts.get(k, 0):,}/{expect.counts.get(k, 0):,}" for k in keys),
        ),
    ]
    wrong = sorted(set(got.items()) ^ set(expect.reasons.items()))
    out.append(
        (
            f"{phase}: every target's reason is the expected one (by pair)",
            not wrong,
            f"{len(wrong)} differ, e.g. {wrong[:3]}" if wrong else f"{len(got):,} targets",
        )
    )
    bad_regions = bad_diffs = 0
    for t in data["targets"]:
        if t["reason"] != "note-changed":
            continue
        if set(t.get("changed_regions", ())) != expect.regions.get(t["note_path"]):
            bad_regions += 1
        diff = t.get("diff") or ""
        if not diff.startswith(f"--- a/{t['note_path']}\n+++ b/{t['note_path']}\n"):
            bad_diffs += 1
    out.append(
        (
            f"{phase}: note-changed targets carry the edited regions and a unified diff",
            not bad_regions and not bad_diffs,
            f"{bad_regions} wrong regions, {bad_diffs} missing/bad diffs"
            if bad_regions or bad_diffs
            else "",
        )
    )
    return out


if __name__ == "__main__":
    sys.exit(main())
