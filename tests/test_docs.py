"""The documents as a contract, read against the code: what an operator or the next
engineer looks up in docs/ must be there, and must name what the code has. Each test
reads the documents as text and the code as it runs (the CLI's click commands, a
migrated state.db, the loader, the message the control sends)."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import click
import pytest

from orchestrator.cli import cli
from orchestrator.config import ReviewerProfile, load_settings
from orchestrator.control.attempts import OpenedAttempt
from orchestrator.control.control import Control
from orchestrator.state.store import Store

from .conftest import reviewq_process
from .test_queue_integration import FAST_QUEUE

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _text(name: str) -> str:
    return (REPO / "docs" / name).read_text(encoding="utf-8")


def _commands() -> dict[str, click.Command]:
    ctx = click.Context(cli)
    return {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}


def _contract_cli_rows() -> dict[str, str]:
    """CONTRACT §10's table: each command its row names (a row may name two, `a` / `b`)."""
    lines = _text("CONTRACT.md").splitlines()
    start = lines.index("| command | does | exits 1 when |")
    rows: dict[str, str] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cell = line.replace("\\|", "¦").split("|")[1]
        for name in re.findall(r"`([a-z][a-z-]*)[^`]*`", cell):
            rows[name] = rows.get(name, "") + cell
    rows["sweep"] += rows["enqueue"]  # "`sweep` (the options of `enqueue`)"
    return rows


def test_every_command_and_its_options_have_their_row_in_contract_cli_table():
    """CONTRACT §10 is the promise of the CLI: a command it leaves out (rewrite-files) or
    an option (decide --fixer) is one an operator meets only by reading --help."""
    rows = _contract_cli_rows()
    missing = []
    for name, command in _commands().items():
        if name not in rows:
            missing.append(f"{name}: no row")
            continue
        for param in command.params:
            given = param.opts + param.secondary_opts  # `-f` for -f/--follow
            # As a whole word: `--fix` is not in `--fixer`, nor `-f` in `--full`.
            said = (re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", rows[name]) for o in given)
            if isinstance(param, click.Option) and not any(said):
                missing.append(f"{name} {'/'.join(param.opts)}")
    assert not missing, missing
    assert set(rows) <= set(_commands()), set(rows) - set(_commands())


def _block_lines(text: str) -> list[tuple[int, str, bool]]:
    """Each line with its number and whether it is in a code block; a code line ending in
    a backslash joined with the ones it continues (a `# ` a unit file's comment starts
    them with dropped), so that a command's options on its next line are its own."""
    out: list[tuple[int, str, bool]] = []
    block, joined = False, None
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if joined is not None:  # a block's last line ended in a backslash
                out.append((*joined, True))
            block, joined = not block, None
            continue
        if block and joined is not None:
            joined = (joined[0], joined[1] + " " + line.strip().lstrip("#").strip())
        elif block:
            joined = (n, line.rstrip())
        if block and joined[1].endswith("\\"):
            joined = (joined[0], joined[1][:-1].rstrip())
            continue
        out.append((*joined, True) if block else (n, line, False))
        joined = None
    return out


def test_every_command_a_document_runs_takes_the_options_it_is_given():
    """`reviewq CMD --opt` in a code block or backticks (a unit's `ExecStart=/…/reviewq`
    too): CMD exists and has --opt. --root, --state and --config are the group's, so
    before CMD: after it click refuses them ("No such option: --root")."""
    commands = _commands()
    own = {"--help", "-h"}
    wrong = []
    for doc in DOCS:
        for n, line, block in _block_lines(doc.read_text(encoding="utf-8")):
            for text in [line] if block else re.findall(r"`([^`]+)`", line):
                for m in re.finditer(
                    r"(?:^|[\s(/])reviewq((?:\s+--(?:root|state|config)[ =]\S+)*)\s+([a-z][a-z-]+)(.*)",
                    text,
                ):
                    name, rest = m.group(2), m.group(3)
                    if name not in commands:
                        continue  # prose: "reviewq writes", "reviewq fix: …" (a commit subject)
                    rest = re.split(r"\s(?:\||&&|;|>>?|#|\)|2>)|;", rest)[0]
                    opts = {o for p in commands[name].params for o in p.opts + p.secondary_opts}
                    for opt in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest):
                        if opt not in opts | own:
                            wrong.append(f"{doc.name}:{n}: {name} has no {opt}")
    assert not wrong, wrong


def test_every_command_is_named_in_its_module_s_line_in_architecture():
    """ARCHITECTURE's `orchestrator/cli/` lines say which module holds each command: the
    one a command is in (`COMMANDS`) is where the next engineer looks for it; queue.py's
    list had no `rewrite-files`."""
    from orchestrator.cli.common import COMMANDS

    text = _text("ARCHITECTURE.md")
    section = text[
        text.index("#### `orchestrator/cli/`") : text.index("#### `orchestrator/report/`")
    ]
    # Each **bold** module name (or names: "common.py, review.py") and the text after it.
    parts = re.split(r"\*\*([^*]+)\*\*", section)
    said = {}
    for names, words in zip(parts[1::2], parts[2::2], strict=True):
        for name in re.split(r",\s*", names):
            said[name.strip(" `")] = words
    missing = [
        f"{name} ({module})"
        for name, module in COMMANDS.items()
        if not re.search(
            rf"(?<![\w-]){re.escape(name)}(?![\w-])", said.get(module.rsplit(".", 1)[1] + ".py", "")
        )
    ]
    assert not missing, missing
    assert set(COMMANDS) == set(_commands())


def test_the_documents_config_examples_load(tmp_path):
    """Every ```toml block of the documents is a reviewq.toml the loader takes whole."""
    blocks = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"^([ \t]*)```toml\n(.*?)^\1```", text, re.S | re.M):
            indent = len(m.group(1))
            blocks.append((doc.name, "\n".join(x[indent:] for x in m.group(2).split("\n"))))
    assert blocks
    for i, (name, body) in enumerate(blocks):
        root = tmp_path / str(i)
        root.mkdir()
        (root / "reviewq.toml").write_text(body, encoding="utf-8")
        settings = load_settings(root)
        assert not settings.sweeps_left_out and not settings.sweeps_ignored, name


def test_every_table_of_state_db_is_in_architecture(tmp_path):
    """ARCHITECTURE's "state.db tables" is where the next engineer looks up a table."""
    store = Store(tmp_path / "state.db")
    store.close()
    conn = sqlite3.connect(tmp_path / "state.db")
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    text = _text("ARCHITECTURE.md")
    section = text[text.index("## state.db tables") : text.index("## The attempt lifecycle")]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    assert documented == tables - {"sqlite_sequence"}


def _architecture_fields(kind: str) -> set[str]:
    """The top-level fields of a message's row: its backticked names outside brackets."""
    row = next(x for x in _text("ARCHITECTURE.md").splitlines() if x.startswith(f"| {kind} |"))
    outside, depth = "", 0
    for ch in row.split(" | ", 2)[2]:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        outside += ch if depth == 0 and ch not in "()" else ""
    return set(re.findall(r"`([a-z_]+)`", outside))


def test_the_review_message_architecture_describes_is_the_one_the_control_sends(tmp_path):
    profile = ReviewerProfile(name="r", kind="offline", model="offline", partition="offline")
    opened = OpenedAttempt(
        job_id=1,
        attempt=1,
        kind="review",
        model_partition="offline",
        job_dir=tmp_path,
        attempt_dir=tmp_path / "attempt-1",
        prompt_path=tmp_path / "attempt-1" / "prompt.md",
        output_path=tmp_path / "attempt-1" / "bundle-output.md",
        guarded=(),
    )
    settings = SimpleNamespace(
        queue=SimpleNamespace(lease_seconds=120.0), max_output_bytes=5 * 1024 * 1024
    )
    fake = SimpleNamespace(settings=settings, _ttl_s=lambda _profile: 60.0)
    sent = set(Control.message(fake, opened, profile)) | {"queued_at"}  # stamped by the send
    assert _architecture_fields("review") == sent


def test_the_message_version_architecture_gives_is_the_code_s():
    """The heading and the data flow's review message both say the version; the flow
    still said v3 a release after version 4."""
    from orchestrator.control.messages import VERSION

    text = _text("ARCHITECTURE.md")
    said = re.findall(r"messages\.py`, version (\d+)\)", text)
    said += re.findall(r"review message v(\d+)", text)
    assert said and set(said) == {str(VERSION)}, said


def _source() -> str:
    parts = [*REPO.glob("orchestrator/**/*.py"), *REPO.glob("workers/**/*.py")]
    return "\n".join(p.read_text(encoding="utf-8") for p in parts)


def test_the_names_architecture_cites_are_in_the_code():
    """A function, class or file ARCHITECTURE names in backticks exists: `cron_validator`
    and `requeue_job` sent the reader looking for code that is not there."""
    source = _source()
    files = {p.name for p in REPO.glob("orchestrator/**/*.py")} | {
        p.name for p in REPO.glob("workers/**/*.py")
    }
    missing = []
    for n, line in enumerate(_text("ARCHITECTURE.md").splitlines(), 1):
        for tok in re.findall(r"`([A-Za-z_][\w.]*)(?:\(\))?`", line):
            last = tok.split(".")[-1]
            if last.isupper():
                continue  # a constant of the system's (PR_SET_PDEATHSIG), a key's pattern
            if last == "py":
                if tok not in files:
                    missing.append(f"{n}: {tok}")
            elif ("_" in tok.strip("_") or "." in tok or re.match(r"[A-Z][a-z]+[A-Z]", tok)) and (
                not re.search(rf"\b{last}\b", source)
            ):  # a name of code: snake_case, dotted, or a class's CamelCase (`FollowUp`)
                missing.append(f"{n}: {tok}")
    assert not missing, missing


def test_every_module_has_its_line_in_architecture():
    text = _text("ARCHITECTURE.md")
    missing = [
        str(p.relative_to(REPO))
        for p in [*REPO.glob("orchestrator/**/*.py"), *REPO.glob("workers/**/*.py")]
        if p.name != "__init__.py" and p.name not in text
    ]
    assert not missing, missing


def test_every_import_contract_is_named_in_architecture():
    """ARCHITECTURE's Boundaries is where the next engineer reads what lint-imports keeps:
    it named the core's layers but not the workers' own, nor the report's contract."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    text = _text("ARCHITECTURE.md")
    boundaries = " ".join(text[text.index("## Boundaries") : text.index("## Messages")].split())
    contracts = config["tool"]["importlinter"]["contracts"]
    missing = [c["name"] for c in contracts if f'"{c["name"]}"' not in boundaries]
    assert not missing, missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_test_a_document_names_exists(doc):
    """RELIABILITY's rows (and the other documents) name the test that guards each fix:
    a test renamed without its row leaves the row pointing at nothing."""
    names = set()
    for path in REPO.glob("tests/**/*.py"):
        names |= set(re.findall(r"def (test_\w+)", path.read_text(encoding="utf-8")))
        names.add(path.stem)
    names |= {p.stem for p in REPO.glob("bench/**/*.py")}
    text = doc.read_text(encoding="utf-8")
    # A row may keep the name its fix was first tested under: "`old` (replaced … by `new`)".
    cited = set(re.findall(r"\b(test_\w+)", text)) - set(
        re.findall(r"\b(test_\w+)` \([^)]*?\breplaced\b", text)
    )
    gone = sorted(cited - names)
    assert not gone, gone


def test_readme_s_layout_names_every_part_of_the_core():
    """README's Layout is the map a newcomer reads first: each folder of `orchestrator/`
    (a layer) and each module beside them. `health.py`, made when `doctor`'s reading of
    the state folder left the CLI, was on ARCHITECTURE's map but not on this one."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("## Layout") :]
    layout = layout[: layout.index("\n```\n", layout.index("```") + 3)]
    parts = [
        f"{p.name}/" if p.is_dir() else p.name
        for p in (REPO / "orchestrator").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists())
        or (p.suffix == ".py" and not p.name.startswith("__"))
    ]
    missing = [name for name in parts if not re.search(rf"(?<![\w/.]){re.escape(name)}", layout)]
    assert not missing, missing


# The maps keyed by a name (a reviewer, a status, an outcome, a run id) rather than by a
# key of the shape: their own keys are data; their values' keys are the shape's again.
_NAMED_MAPS = {
    "status": {"reviewers"},
    "sweep": {
        "jobs",
        "decisions",
        "audits",
        "attempts",
        "paused",
        "paused_reviewers",
        "by_status",
        "budget_runs",
        "counts",
    },
}


def _keys(value: object, named: set[str], key: str = "") -> set[str]:
    """Every key of a command's JSON output, its lists' items and its maps' values too."""
    if isinstance(value, list):
        return set().union(*(_keys(v, named, key) for v in value))
    if not isinstance(value, dict):
        return set()
    own = set() if key in named else set(value)
    return own.union(*(_keys(v, named, k) for k, v in value.items()))


def test_every_key_a_command_s_json_carries_is_in_contract_json_shapes(kb, run_cli):
    """CONTRACT §10's JSON shapes are what a script reads a command's output by: `status
    --json` had the reviewers' `awaits_control_restart` and `notes_excluded`, `sweep
    --json` its `audits` and `fixes_unwritten`, none of them there. Run on a real sweep
    (a control and a worker, the offline reviewer and fixer) that escalates a pair."""
    kb.gate("prose/described", ["description"])
    kb.note("empty-description", description="")
    kb.note("described")
    kb.write("reviewq.toml", FAST_QUEUE)
    swept = reviewq_process(
        "--root", str(kb.root), "sweep", "--reviewer", "offline", "--fix", "--json",
        "--workers", "1",
    )  # fmt: skip
    assert swept.returncode == 0, swept.stderr
    outputs = {"sweep": json.loads(swept.stdout)}
    assert outputs["sweep"]["escalations"], outputs["sweep"]  # the shape's lists hold items
    for name in ("status", "jobs", "escalations"):
        res = run_cli(name, "--json")
        assert res.exit_code == 0, res.stderr
        outputs[name] = res.json()
    text = _text("CONTRACT.md")
    shapes = text[text.index("### JSON shapes") : text.index("### Export")]
    said = set(re.findall(r'"([a-z_]+)"', shapes)) | set(re.findall(r"`([a-z_]+)`", shapes))
    missing = sorted(
        f"{name} --json: {key}"
        for name, out in outputs.items()
        for key in _keys(out, _NAMED_MAPS.get(name, set()))
        if key not in said
    )
    assert not missing, missing


def test_every_variable_a_command_agent_gets_is_in_contract_s_reviewers(tmp_path):
    """CONTRACT §8 is "the way to integrate another agent": a fixer written to it could
    not know of `REVIEWQ_NOTE_FILE`, the text it was given, which OPERATIONS tells a
    `command` fixer to work from. A fix's spec, the one with every variable, says what a
    command gets; each of them, and each placeholder of its argv, is in §8."""
    from orchestrator.config import PLACEHOLDERS
    from workers.reviewers.base import AttemptSpec

    folders = (tmp_path / n for n in ("prompt.md", "output.md", "job", "attempt"))
    spec = AttemptSpec(
        "fix", 1, 1, *folders, tmp_path, "m", note_path="kb/notes/a.md", note_file=tmp_path / "n"
    )
    text = _text("CONTRACT.md")
    section = text[text.index("## §8 Reviewers") : text.index("## §9 Sweeps")]
    said = set(re.findall(r"`(REVIEWQ_\w+)`", section)) | set(re.findall(r"`\{(\w+)\}`", section))
    missing = sorted(({*spec.environment()} | set(PLACEHOLDERS)) - said)
    assert not missing, missing


def test_the_cron_clock_architecture_describes_is_the_one_stored(kb):
    """ARCHITECTURE's `cron_state` row said "the last minute checked (local time)": the
    control stores the moment it looked, in UTC (a local one would move an hour with the
    autumn's), and the `not_run` that `status` and the report read was not on the row."""
    from datetime import datetime, timedelta, timezone

    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import cron_fired

    ws = Workspace.open(kb.root)
    at = datetime(2026, 10, 25, 2, 30, 15, tzinfo=timezone(timedelta(hours=2)))
    cron_fired(ws, "nightly", at, {"event": "sweep.missed", "at": at.isoformat()})
    stored, not_run = ws.store.conn.execute(
        "SELECT last_checked, not_run FROM cron_state WHERE name = 'nightly'"
    ).fetchone()
    ws.close()
    assert stored == "2026-10-25T00:30:15+00:00" and json.loads(not_run)["event"]
    row = next(x for x in _text("ARCHITECTURE.md").splitlines() if x.startswith("| `cron_state`"))
    assert "local" not in row and "UTC" in row and "`not_run`" in row, row


def test_where_the_documents_give_the_state_folder_s_default_they_name_state_dir(kb):
    """`[state] dir` moves the state folder: `--help`, README and CONTRACT's STATE said
    its default was ROOT/.reviewq alone, and a person whose file moves it looked there."""
    kb.write("reviewq.toml", '[state]\ndir = "elsewhere"\n')
    assert load_settings(kb.root).state_dir == kb.root / "elsewhere"
    state = next(p for p in cli.params if p.name == "state")
    said = {"--help": state.help or ""}
    for doc in DOCS:
        text = " ".join(doc.read_text(encoding="utf-8").split())
        for m in re.finditer(r"--state[^.;]*?default `ROOT/\.reviewq`[^;]*?\)", text):
            said[f"{doc.name}: {m.group()[:50]}"] = m.group()
    assert len(said) > 1
    wrong = [where for where, text in said.items() if "[state] dir" not in text]
    assert not wrong, wrong


def test_the_suspect_gate_rule_operations_gives_is_the_report_s(kb, run_cli):
    """OPERATIONS §4: "A gate that fails at least half of its notes and at least twice the
    median gate's rate gets a note"; the report asks three decisions in the 14 nights
    too, so a gate that failed its two notes got none, where the page promised one."""
    for gate in ("lens/strict", "lens/calm", "lens/quiet"):
        kb.gate(gate, ["body"])
    notes = [kb.note(n) for n in ("one", "two", "three")]
    kb.accept("p", [(n, g) for n in notes for g in ("lens/calm", "lens/quiet")])
    kb.accept("p", [(n, "lens/strict") for n in notes[:2]], decision="FAIL")

    def suspects() -> list[str]:
        res = run_cli("report", "--json", "--since", "1h")
        assert res.exit_code == 0, res.stderr
        return res.json()["trends"]["suspect_gates"]

    assert suspects() == []  # 2 of 2 FAIL, the median 0: decided too few times
    kb.accept("p", [(notes[2], "lens/strict")], decision="FAIL")
    assert suspects() == ["lens/strict"]
    ops = " ".join(_text("OPERATIONS.md").split())
    rule = ops[ops.index("Trends over the last 14 nights") :]
    rule = rule[: rule.index("as likely wrong as the KB is")]
    assert re.search(r"at least (three|3) (of its )?(decisions|notes|pairs)", rule), rule


_EVENT = re.compile(r"[a-z_]+(?:\.[a-z_]+)+")
_LOGS = {"debug", "info", "warning", "error", "exception", "critical"}


def _code_strings_and_events() -> tuple[set[str], set[str]]:
    """Every string constant of the code, and the events it logs by a literal name (the
    first argument of a log call, or either name of a conditional one), or composes from
    one: ``write_each``'s ``what`` with ``_failed`` and ``_written``, a ``Later``'s event."""
    import ast

    strings, events = set(), set()
    for path in [*REPO.glob("orchestrator/**/*.py"), *REPO.glob("workers/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                said = {k.arg: k.value for k in node.keywords}
                if node.func.id == "write_each" and isinstance(said.get("what"), ast.Constant):
                    events |= {f"{said['what'].value}_{end}" for end in ("failed", "written")}
                elif node.func.id == "Later" and isinstance(node.args[0], ast.Constant):
                    events.add(node.args[0].value)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _LOGS
                and node.args
            ):
                first = node.args[0]
                named = [first.body, first.orelse] if isinstance(first, ast.IfExp) else [first]
                events |= {
                    n.value
                    for n in named
                    if isinstance(n, ast.Constant)
                    and isinstance(n.value, str)
                    and _EVENT.fullmatch(n.value)
                }
    return strings, events


def test_the_events_operations_names_are_the_ones_the_code_logs():
    """OPERATIONS §5's table is where an operator looks an event up, and `logs --event`
    and the jq recipes are what they run: an event named there that the code no longer
    logs matches nothing, in silence; one the code logs that the table lacks is a line
    nobody can look up. A name may be composed, as the code composes it:
    `control.restarting` from the process's name, `job.files_failed` from `job.files`."""
    strings, logged = _code_strings_and_events()
    ops = _text("OPERATIONS.md")
    table = ops[ops.index("### The events") : ops.index("## 6. When something went wrong")]
    tabled = set()  # the events the table's rows are about
    for line in table.splitlines():
        if line.startswith("| `"):
            tabled |= set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", line.split(" | ")[0]))
    named = set(tabled)
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        named |= set(re.findall(r'\.event ?== ?"([a-z_.]+)"', text))
        named |= {e for e in re.findall(r"--event ([a-z_.]+)", text) if not e.endswith(".")}

    def logged_by_code(event: str) -> bool:
        head, _, tail = event.rpartition(".")
        stem = re.sub(r"_(failed|written)$", "", event)
        return (
            event in strings
            or (head in strings and f".{tail}" in strings)  # f"{process}.restarting"
            or (stem != event and stem in strings)  # f"{what}_failed", what="job.files"
        )

    unknown = sorted(e for e in named if e not in {"huey.consumer"} and not logged_by_code(e))
    assert not unknown, unknown
    untold = sorted(e for e in logged if f"`{e}`" not in table)
    assert not untold, untold
    # The list that ships with the code (`logs --event` reads it; the docs may not be at
    # hand): the table's events and the code's, no more.
    from orchestrator.events import EVENTS

    listed = (tabled - {"huey.consumer"}) | logged
    assert listed == EVENTS, sorted(listed ^ EVENTS)


def test_the_commands_contract_says_fail_on_an_invalid_gate_are_those_that_do(kb, run_cli):
    """CONTRACT §10: "Only `gates --check` turns invalid gates into exit 1", while
    `doctor` fails on one too (a `problem:` line): a person checking a KB with `doctor`
    before a night read exit 1 as a broken set-up the contract said it could not be."""
    kb.gate("lens/fine", ["body"])
    kb.write("kb/instructions/review-gates/lens/broken.md", "---\nbroken: [\n---\nx\n")
    kb.note("one")
    runs = {
        "gates --check": ("gates", "--check"),
        "doctor": ("doctor",),
        "select": ("select", "--all-gates", "--model", "p"),
        "warn-queue": ("warn-queue",),
        "enqueue": ("enqueue", "--all-gates"),
    }
    failing = {name for name, args in runs.items() if run_cli(*args).exit_code == 1}
    text = " ".join(_text("CONTRACT.md").split())
    sentence = re.search(r"Only ([^.]*?) turns? invalid gates into exit 1", text)
    assert sentence, "CONTRACT §10 no longer says which commands fail on an invalid gate"
    named = re.sub(r"\([^)]*\)", "", sentence.group(1))  # "(a `problem:` line …)" aside
    said = {c.split(" [")[0] for c in re.findall(r"`([^`]+)`", named)}
    assert said == failing, (said, failing)


def test_every_file_a_state_folder_holds_is_in_operations_table_of_what_to_delete(kb):
    """OPERATIONS §7 is what an operator reads before deleting anything in STATE. A real
    sweep's state folder held `run/control-zone.json`, and the control keeps
    `run/settings-stale.json` and moves a lost history into `jobs/lost-history/`: none of
    them was in the table. Job folders, reports and the worker's folder count as their
    rows name them."""
    from orchestrator.state import files, status

    kb.gate("lens/described", ["description"])
    kb.note("empty", description="")
    kb.write("reviewq.toml", FAST_QUEUE)
    swept = reviewq_process("--root", str(kb.root), "sweep", "--fix", "--workers", "1")
    assert swept.returncode == 0, swept.stderr
    found = set()
    for path in kb.state.rglob("*"):
        rel = path.relative_to(kb.state).as_posix()
        rel = re.sub(r"^jobs/review-job-\d+(/.*)?$", "jobs/review-job-N/", rel)
        rel = re.sub(r"^escalations/escalation-\d+\.md$", "escalations/escalation-N.md", rel)
        rel = re.sub(r"^logs/sweep-\w+\.stderr$", "logs/sweep-*.stderr", rel)
        rel = re.sub(r"^worker/.*", "worker/", rel)
        if path.is_file() or rel.endswith("/"):
            found.add(rel)
    assert "jobs/review-job-N/" in found and "escalations/escalation-N.md" in found, found
    found |= {
        status.SHARED_FILE.as_posix(),
        status.STALE_FILE.as_posix(),
        status.ZONE_FILE.as_posix(),
        f"jobs/{files.LOST_HISTORY}/",
    }
    ops = _text("OPERATIONS.md")
    table = ops[ops.index("## 7. What is in STATE") : ops.index("### Backups")]
    rows = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| `")]
    named = {name: row for row in rows for name in re.findall(r"`([^`]+)`", row)}

    def in_table(name: str) -> bool:
        base = re.sub(r"-(wal|shm)$", "", name)  # SQLite's own, beside its database
        return base in named and (base == name or f"`-{name[-3:]}`" in named[base])

    missing = sorted(f for f in found if not in_table(f))
    assert not missing, missing


def test_the_mistakes_contract_lists_as_exit_1_are_not_those_that_exit_2(kb, run_cli):
    """CONTRACT §10's decide row gave "`redo` without feedback" as an exit 1, while
    136d4c3 made it bad usage, exit 2, as `--fixer` with approve is: a script telling a
    refusal from a mistyped call by the code read it wrong."""
    kb.gate("lens/one", ["body"])
    kb.accept("p", [(kb.note("one"), "lens/one")])  # a state.db, which decide reads first
    # (A redo of a verdict without asks is bad usage too, once its escalation is read: E96.)
    for args in (
        ("decide", "1", "redo", "--feedback", " "),
        ("decide", "1", "approve", "--fixer", "offline"),
    ):
        assert run_cli(*args).exit_code == 2, args
    row = next(x for x in _text("CONTRACT.md").splitlines() if x.startswith("| `escalations"))
    does, exits_1 = row.replace("\\|", "¦").split(" | ")[1:3]
    assert "without feedback" not in exits_1 and "without `--feedback`" not in exits_1, exits_1
    assert re.search(r"`redo` of a verdict without `--feedback`[^|]*exit 2", does), does
