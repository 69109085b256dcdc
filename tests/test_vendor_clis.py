"""The real vendor CLIs — Claude Code, Codex CLI, Gemini CLI, pinned in tests/vendor — run
by reviewq against a scripted model (tests/vendor_model.py), through ``run-job`` and
through a sweep, as reviewers and as fixers (``sweep --fix``, the fix committed to git).

Everything runs inside a network namespace the test makes, with only ``lo`` up: the
model server, reviewq and the CLIs it starts can reach nothing else. The CLIs are
installed by ``.ci/run`` (``npm ci --prefix tests/vendor``); without them, without root
or without ``ip``, the tests skip and say why.

To run them against other versions (the one npm gives an operator today, an old one),
install those anywhere and name their ``node_modules`` folders, ``:``-separated, in
``REVIEWQ_VENDOR_MODULES``: each CLI is taken from the first folder that has it, then
from tests/vendor. E.g.::

    npm install --prefix /tmp/claude-new @anthropic-ai/claude-code@latest
    REVIEWQ_VENDOR_MODULES=/tmp/claude-new/node_modules pytest tests/test_vendor_clis.py
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.state.store import Store
from orchestrator.state.words import reason_words
from tests.test_gitcommit import _read_only
from tests.vendor_model import REFUSAL
from workers.attempt import LAUNCH_WINDOW_S

HERE = Path(__file__).parent
VENDORS = ("claude", "codex", "gemini")


def _named() -> list[Path]:
    return [Path(f) for f in os.environ.get("REVIEWQ_VENDOR_MODULES", "").split(":") if f]


def _bins() -> dict[str, Path]:
    """Each CLI's program: from REVIEWQ_VENDOR_MODULES's folders first, then tests/vendor."""
    folders = [*_named(), HERE / "vendor" / "node_modules"]
    return {
        v: next(
            (f / ".bin" / v for f in folders if (f / ".bin" / v).exists()), folders[-1] / ".bin" / v
        )
        for v in VENDORS
    }


BIN = _bins()
REVIEWQ = Path(sys.executable).parent / "reviewq"
NOTE = "kb/notes/alpha.md"
DEAD_PORT = 9  # nothing listens there inside the namespace: connection refused
# Per token, the prices the profiles below give Codex and Gemini (USD per million).
PRICES = {"in": 1.25, "out": 10.0, "cached": 0.125}


def _why_not() -> str | None:
    # One holding none of them (a typo, the npm prefix for its node_modules) was passed
    # over, and the pinned CLIs' passing read as the named versions'.
    if empty := [str(f) for f in _named() if not any((f / ".bin" / v).exists() for v in VENDORS)]:
        return (
            f"REVIEWQ_VENDOR_MODULES names {', '.join(empty)}, which holds no "
            f"{', '.join(VENDORS)} in .bin/: name the node_modules folder npm installed into"
        )
    missing = [v for v in VENDORS if not BIN[v].exists()]
    if missing:
        return (
            f"vendor CLIs not installed ({', '.join(missing)}): "
            "run `npm ci --prefix tests/vendor` (.ci/run does)"
        )
    if os.geteuid() != 0:
        return "the vendor CLI tests need root to make a network namespace"
    if shutil.which("ip") is None:
        return "the vendor CLI tests need `ip` (iproute2) to make a network namespace"
    if shutil.which("node") is None or shutil.which("git") is None:
        return "the vendor CLI tests need node and git"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


# --- the namespace and the model ----------------------------------------------------------


class Model:
    """The scripted model server, listening on loopback inside the namespace."""

    def __init__(self, netns: str | None, log: Path) -> None:
        self.netns, self.log = netns, log
        self.proc = subprocess.Popen(
            [*_in(netns), sys.executable, str(HERE / "vendor_model.py"), "--log", str(log)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # poll, not select(): select() refuses a descriptor past 1023, which the suite's
        # process reaches after its earlier modules (a whole run's fixtures and logs).
        poller = select.poll()
        poller.register(self.proc.stdout, select.POLLIN)
        ready = poller.poll(30_000)
        line = self.proc.stdout.readline() if ready else ""  # type: ignore[union-attr]
        if not line.startswith("ready "):
            self.stop()
            raise RuntimeError(f"the model server did not start: {line!r}")
        self.port = int(line.split()[1])

    def url(self, scenario: str) -> str:
        return f"http://127.0.0.1:{self.port}/{scenario}"

    def requests(self, scenario: str) -> list[dict]:
        if not self.log.exists():
            return []
        entries = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [e for e in entries if e["scenario"] == scenario]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _in(netns: str | None) -> list[str]:
    """The command prefix that runs in ``netns``; None: this host's own loopback."""
    return ["ip", "netns", "exec", netns] if netns else []


@pytest.fixture(scope="module")
def netns():
    name = f"reviewq-vendor-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:  # root in a container without CAP_SYS_ADMIN
        pytest.skip(f"cannot make a network namespace: {made.stderr.strip()}")
    try:
        subprocess.run([*_in(name), "ip", "link", "set", "lo", "up"], check=True)
        yield name
        left = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        pids = left.stdout.split()
        for pid in pids:  # fail below, but leave nothing running
            subprocess.run(["kill", "-9", pid], capture_output=True)
        assert pids == [], f"processes left in the namespace: {pids}"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture(scope="module")
def model(netns, tmp_path_factory):
    m = Model(netns, tmp_path_factory.mktemp("model") / "requests.jsonl")
    yield m
    m.stop()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A HOME of the tests' own: no CLI reads the machine's logins or settings. Shared by
    the module: Codex spends seconds setting up a fresh one."""
    h = tmp_path_factory.mktemp("home")
    (h / ".gemini").mkdir(parents=True)
    (h / ".gemini" / "settings.json").write_text(
        json.dumps(
            {
                # With GOOGLE_GEMINI_BASE_URL alone Gemini picks its "gateway" auth, which
                # headless mode refuses; an API key sent to our base URL is what we want.
                "security": {"auth": {"selectedType": "gemini-api-key"}},
                "general": {"maxAttempts": 1},  # no 5-30 s backoff between retries
            }
        )
    )
    (h / "tmp").mkdir()
    return h


# --- the KB and reviewq -------------------------------------------------------------------


def profiles(model: Model, scenario: str, **over: str) -> str:
    """A profile per vendor, each pointed at ``scenario`` of the model (or at a dead port)."""
    base = model.url(scenario) if scenario != "dead" else f"http://127.0.0.1:{DEAD_PORT}/dead"
    prices = (
        f"price_input_per_mtok = {PRICES['in']}\nprice_output_per_mtok = {PRICES['out']}\n"
        f"price_cached_input_per_mtok = {PRICES['cached']}\n"
    )
    # Codex: a model outside 0.169's catalog gets the classic tools (exec_command) the
    # scripted model speaks; catalog models (gpt-6.1-sol…) get "code mode", which it does not.
    provider = (
        f'{{name = "scripted", base_url = "{base}/v1", wire_api = "responses", '
        'env_key = "SCRIPTED_API_KEY", request_max_retries = 0, stream_max_retries = 0}'
    )
    # Claude retries a failing API ten times, minutes in all; most tests want its verdict
    # at once, one wants to see connect_timeout cut the retries short.
    claude_retries = (
        "" if over.get("claude_retries") == "default" else 'CLAUDE_CODE_MAX_RETRIES = "0", '
    )
    # Gemini's only with its default retries (the home of most tests allows one try).
    gemini_connect = (
        f'connect_timeout = "{over["gemini_connect_timeout"]}"\n'
        if "gemini_connect_timeout" in over
        else ""
    )
    return f"""
[queue]
launch_failures_before_pause = 1
launch_backoff_seconds = 0.2
pause_seconds = 600
lease_seconds = 60

[reviewers.claude]
kind = "claude"
executable = "{BIN["claude"]}"
model = "claude-sonnet-4-5"
partition = "scripted"
max_turns = {over.get("max_turns", 8)}
timeout = "{over.get("timeout", "60s")}"
connect_timeout = "{over.get("connect_timeout", "8s")}"
env = {{ ANTHROPIC_BASE_URL = "{base}", ANTHROPIC_API_KEY = "sk-ant-scripted", {claude_retries}DISABLE_AUTOUPDATER = "1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1" }}

[reviewers.codex]
kind = "codex"
executable = "{BIN["codex"]}"
model = "scripted-codex"
partition = "scripted"
timeout = "{over.get("timeout", "60s")}"
connect_timeout = "{over.get("connect_timeout", "8s")}"
args = ["-c", 'model_provider="scripted"', "-c", '''model_providers.scripted={provider}''', "-c", "analytics.enabled=false", "-c", 'otel.metrics_exporter="none"']
env = {{ SCRIPTED_API_KEY = "sk-scripted" }}
{prices}
[reviewers.gemini]
kind = "gemini"
executable = "{BIN["gemini"]}"
model = "gemini-2.5-pro"
partition = "scripted"
timeout = "{over.get("timeout", "60s")}"
{gemini_connect}env = {{ GOOGLE_GEMINI_BASE_URL = "{base}", GEMINI_API_KEY = "scripted-key" }}
{prices}"""


@pytest.fixture
def vkb(kb):
    """One note, one gate: one pair, in a git checkout that ignores the state folder as
    a real KB does (Gemini's read_file applies that .gitignore)."""
    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", body="# Alpha\n\nAlpha body.\n")
    kb.write(".gitignore", ".reviewq/\n")
    subprocess.run(["git", "init", "-q", str(kb.root)], check=True)
    yield kb
    # Nothing an agent started may outlive the test, wherever it went (Codex's sandbox
    # runs in namespaces and a process group of its own): every one carries REVIEWQ_ROOT.
    left = leftovers(kb.root)
    for pid in left:
        subprocess.run(["kill", "-9", str(pid)], capture_output=True)
    assert left == [], f"processes of the test still running: {left}"


def leftovers(root: Path) -> list[int]:
    mark = f"REVIEWQ_ROOT={root}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def reviewq(
    netns: str, home: Path, root: Path, *args: str, timeout: float = 120, input: str | None = None
) -> subprocess.CompletedProcess:
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
        "LANG": "C.UTF-8",
    }
    return subprocess.run(
        [*_in(netns), str(REVIEWQ), "--root", str(root), *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def make_job(netns, home, root) -> int:
    sel = reviewq(netns, home, root, "select", "--all-gates", "--model", "scripted", "--json")
    assert sel.returncode == 0, sel.stderr
    made = reviewq(
        netns,
        home,
        root,
        "create-jobs",
        "--input",
        "-",
        "--grouping",
        "note",
        "--json",
        input=sel.stdout,
    )
    assert made.returncode == 0, made.stderr
    (job,) = json.loads(made.stdout)["jobs"]
    return job["review_job_id"]


def reviewed_leaving_the_kb(
    netns: str,
    model: Model,
    mine: Path,
    vkb,
    vendor: str,
    scenario: str = "review",
    planted: Path | None = None,
) -> None:
    """One review of alpha by ``vendor`` run from the HOME ``mine``: it passes, and the
    KB is as it was, ``planted`` (what the person's set-up would write) not made."""
    (vkb.root / "reviewq.toml").write_text(profiles(model, scenario))
    before = kb_files(vkb.root)
    job_id = make_job(netns, mine, vkb.root)
    res = reviewq(netns, mine, vkb.root, "run-job", str(job_id), "--reviewer", vendor)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS  kb/notes/alpha.md  prose/body-check" in res.stdout
    if planted is not None:
        assert not planted.exists(), planted.read_text()
    assert kb_files(vkb.root) == before


def rows(root: Path, sql: str, *args) -> list[dict]:
    with Store.open(root / ".reviewq") as s:
        return [dict(r) for r in s.conn.execute(sql, args)]


def _counts(sweep: dict) -> dict[str, int]:
    return {k: n for k, n in sweep["progress"]["by_status"].items() if n}


def kb_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "kb").rglob("*") if p.is_file())


# --- reviews ------------------------------------------------------------------------------


@pytest.mark.parametrize("vendor", VENDORS)
def test_run_job_reviews_with_the_real_cli(netns, model, home, vkb, vendor):
    (vkb.root / "reviewq.toml").write_text(profiles(model, "review"))
    job_id = make_job(netns, home, vkb.root)
    res = reviewq(netns, home, vkb.root, "run-job", str(job_id), "--reviewer", vendor)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"job {job_id} completed" in res.stdout
    assert "PASS  kb/notes/alpha.md  prose/body-check" in res.stdout
    [a] = rows(vkb.root, "SELECT * FROM attempts WHERE job_id = ?", job_id)
    assert a["outcome"] == "finalized"
    # Three model calls (read the prompt, write the output, say done) of 1000 + 100
    # tokens each, as the server reported them.
    assert (a["num_turns"], a["input_tokens"], a["output_tokens"]) == (3, 3000, 300)
    if vendor == "claude":
        # Claude prices its own tokens: claude-sonnet-4-5 at $3 / $15 per million.
        assert a["cost_usd"] == pytest.approx(3000 * 3e-6 + 300 * 15e-6)
    else:
        assert a["cost_usd"] == pytest.approx((3000 * PRICES["in"] + 300 * PRICES["out"]) / 1e6)
    calls = [r for r in model.requests("review") if r.get("action")]
    assert [c["action"] for c in calls][-3:] == ["read", "write", "text"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_the_real_cli_is_refused_the_kb_dotdot_paths_and_the_shell(netns, model, home, vkb, vendor):
    (vkb.root / "reviewq.toml").write_text(profiles(model, "hostile"))
    before = kb_files(vkb.root)
    job_id = make_job(netns, home, vkb.root)
    res = reviewq(netns, home, vkb.root, "run-job", str(job_id), "--reviewer", vendor)
    # Every forbidden write was refused, so the review itself goes through.
    assert res.returncode == 0, res.stdout + res.stderr
    assert kb_files(vkb.root) == before
    assert not (vkb.state / "jobs" / "escaped.md").exists()
    # Six model calls: three refused writes, read, write, done. Codex's --json shows no
    # refused command; its session log does.
    [a] = rows(vkb.root, "SELECT num_turns, input_tokens FROM attempts WHERE job_id = ?", job_id)
    assert (a["num_turns"], a["input_tokens"]) == (6, 6000), a
    last = [r for r in model.requests("hostile") if r.get("action")][-1]
    refusals = last["results"][:3]  # what the CLI told the model about its three attempts
    assert len(refusals) == 3, last
    for text in refusals:
        assert any(
            word in text
            for word in ("denied", "Read-only file system", "not found", "No such tool")
        ), text


def _permissive(vendor: str, home: Path, root: Path, into: Path) -> Path:
    """A HOME (and KB) whose CLI settings allow what reviewq forbids, as a person's own
    may: each was obeyed, and the agent wrote into the KB."""
    mine = into / "home"
    shutil.copytree(home, mine, symlinks=True)
    note = root / "kb" / "notes" / "hooked.md"
    if vendor == "claude":  # hooks and MCP servers run commands whatever the tools allowed
        hook = {"type": "command", "command": f"echo hooked >> {note}"}
        (root / ".claude").mkdir(exist_ok=True)
        (root / ".claude" / "settings.json").write_text(
            json.dumps(
                {
                    "permissions": {"allow": ["Write", "Edit", "Bash"]},
                    "hooks": {"PostToolUse": [{"matcher": ".*", "hooks": [hook]}]},
                    "enableAllProjectMcpServers": True,
                }
            )
        )
        server = {"command": "sh", "args": ["-c", f"echo mcp >> {note}; sleep 30"]}
        (root / ".mcp.json").write_text(json.dumps({"mcpServers": {"kb": server}}))
    elif vendor == "gemini":  # tools.allowed outranks a policy that only allows
        settings = mine / ".gemini" / "settings.json"
        data = json.loads(settings.read_text())
        data["tools"] = {"allowed": ["write_file", "replace", "run_shell_command"]}
        settings.write_text(json.dumps(data))
    else:  # the sandbox writes wherever writable_roots says
        config = mine / ".codex" / "config.toml"
        config.parent.mkdir(exist_ok=True)
        old = config.read_text() if config.exists() else ""
        notify = f'notify = ["sh", "-c", "echo notified >> {note}"]\n'
        config.write_text(
            notify + old + f'\n[sandbox_workspace_write]\nwritable_roots = ["{root}"]\n'
        )
    return mine


@pytest.mark.parametrize("vendor", VENDORS)
def test_the_real_cli_is_refused_the_kb_whatever_the_persons_settings_allow(
    netns, model, home, vkb, vendor, tmp_path
):
    mine = _permissive(vendor, home, vkb.root, tmp_path)
    (vkb.root / "reviewq.toml").write_text(profiles(model, "hostile"))
    before = kb_files(vkb.root)
    job_id = make_job(netns, mine, vkb.root)
    res = reviewq(netns, mine, vkb.root, "run-job", str(job_id), "--reviewer", vendor)
    assert res.returncode == 0, res.stdout + res.stderr
    assert kb_files(vkb.root) == before


CODEX_HOOK_EVENTS = ("SessionStart", "UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop")


def _codex_hooks_listed(netns: str, mine: Path, cwd: Path, *args: str) -> list[dict]:
    """The hooks Codex's own app server (``hooks/list``) says a session in ``cwd`` has,
    with their keys and current hashes, as its TUI shows them for a person to trust."""
    proc = subprocess.Popen(
        [*_in(netns), str(BIN["codex"]), *args, "app-server"],
        env={"PATH": os.environ["PATH"], "HOME": str(mine), "TMPDIR": str(mine / "tmp")},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for msg in (
            {
                "id": 1,
                "method": "initialize",
                "params": {"clientInfo": {"name": "t", "version": "1"}},
            },
            {"method": "initialized"},
            {"id": 2, "method": "hooks/list", "params": {"cwds": [str(cwd)]}},
        ):
            proc.stdin.write(json.dumps(msg) + "\n")
        proc.stdin.flush()
        for _ in range(1000):  # notifications may come first
            line = proc.stdout.readline()
            assert line, "the app server ended without answering hooks/list"
            answer = json.loads(line)
            if answer.get("id") == 2:
                return [h for entry in answer["result"]["data"] for h in entry["hooks"]]
        raise AssertionError("no answer to hooks/list")
    finally:
        proc.stdin.close()
        proc.terminate()
        proc.wait(timeout=30)


def _trusted_codex_hooks(netns: str, home: Path, root: Path, into: Path) -> Path:
    """A HOME whose ``~/.codex/hooks.json`` (codex-rs/hooks engine/discovery.rs) has a
    command hook on every event that appends to a KB note, each trusted as the person's
    TUI trusts one: its current hash under ``[hooks.state."<key>"]`` in config.toml. A
    user hook without that trust never runs, which is why a guessed file ran nothing."""
    mine = into / "home"
    shutil.copytree(home, mine, symlinks=True)
    note = root / "kb" / "notes" / "hooked.md"
    (mine / ".codex").mkdir(exist_ok=True)
    (mine / ".codex" / "hooks.json").write_text(
        json.dumps(
            {
                "hooks": {
                    event: [
                        {
                            "matcher": ".*",
                            "hooks": [{"type": "command", "command": f"echo {event} >> {note}"}],
                        }
                    ]
                    for event in CODEX_HOOK_EVENTS
                }
            }
        )
    )
    listed = _codex_hooks_listed(netns, mine, root)
    assert len(listed) == len(CODEX_HOOK_EVENTS), listed
    config = mine / ".codex" / "config.toml"
    old = config.read_text() if config.exists() else ""
    trust = "".join(
        f'\n[hooks.state."{h["key"]}"]\ntrusted_hash = "{h["currentHash"]}"\n' for h in listed
    )
    config.write_text(old + trust)
    assert {h["trustStatus"] for h in _codex_hooks_listed(netns, mine, root)} == {"trusted"}
    return mine


def test_a_persons_trusted_codex_hooks_do_not_run_beside_a_review(
    netns, model, home, vkb, tmp_path
):
    """Codex 0.171 runs a person's trusted hooks (~/.codex/hooks.json or ``[hooks]`` in
    config.toml) outside its sandbox under ``codex exec`` too: each wrote into the KB."""
    mine = _trusted_codex_hooks(netns, home, vkb.root, tmp_path)
    hooked = vkb.root / "kb" / "notes" / "hooked.md"
    reviewed_leaving_the_kb(netns, model, mine, vkb, "codex", planted=hooked)


def test_a_persons_codex_rules_run_no_command_outside_the_sandbox(
    netns, model, home, vkb, tmp_path
):
    """A command a person's ``~/.codex/rules/*.rules`` allows (the TUI appends one there
    for each "always allow") runs outside the sandbox (codex-rs/core exec_policy.rs:
    ``bypass_sandbox`` when every segment of it matches an allow rule): the agent's
    ``touch`` made a KB note. (``echo … > note`` has a redirection, no segment a rule
    names, and stayed sandboxed: so ``hostile`` showed nothing.)"""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    (mine / ".codex" / "rules").mkdir(parents=True, exist_ok=True)
    (mine / ".codex" / "config.toml").touch()  # the user layer, whose folder holds rules/
    (mine / ".codex" / "rules" / "default.rules").write_text(
        "".join(f'prefix_rule(pattern=["{word}"], decision="allow")\n' for word in ("touch", "cat"))
    )
    reviewed_leaving_the_kb(netns, model, mine, vkb, "codex", scenario="ruled")


# Where a person's Codex MCP server may be: their config.toml; there under a name with a
# dot, which no `-c mcp_servers.<name>…` key can name (Codex splits keys at dots); the file
# of a profile (`-p work`: $CODEX_HOME/work.config.toml) the reviewq profile's args name.
CODEX_MCP = {
    "config": ("config.toml", "kb"),
    "dotted": ("config.toml", '"kb.tools"'),
    "profile": ("work.config.toml", "kb"),
    # the KB's own .codex/config.toml, which Codex loads (from the project root down to the
    # job folder) once the person has trusted the KB, as its TUI asks on a first start there
    "project": ("config.toml", "kb"),
}


@pytest.mark.parametrize("where", list(CODEX_MCP))
def test_a_persons_codex_mcp_server_does_not_start_beside_a_review(
    netns, model, home, vkb, tmp_path, where
):
    """An MCP server of a person's Codex set-up is a command Codex starts outside its
    sandbox at the start of every session, ``codex exec``'s too. reviewq turned off only
    those of config.toml it could name: one named with a dot, one of the profile file
    `-p` picks and one of the KB's own .codex/config.toml (a trusted project's) each
    started and wrote into the KB."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    note = vkb.root / "kb" / "notes" / "mcp.md"
    file, name = CODEX_MCP[where]
    config = (vkb.root if where == "project" else mine) / ".codex" / file
    config.parent.mkdir(exist_ok=True)
    old = config.read_text() if config.exists() else ""
    config.write_text(
        old
        + f'\n[mcp_servers.{name}]\ncommand = "sh"\nargs = ["-c", "echo mcp >> {note}; sleep 30"]\n'
    )
    if where == "project":
        trusted = f'[projects."{vkb.root.resolve()}"]\ntrust_level = "trusted"\n'
        (mine / ".codex").mkdir(exist_ok=True)
        (mine / ".codex" / "config.toml").write_text(trusted)
    toml = profiles(model, "review")
    if where == "profile":
        (mine / ".codex" / "config.toml").touch()
        toml = toml.replace(
            'args = ["-c", \'model_provider', 'args = ["-p", "work", "-c", \'model_provider'
        )
    (vkb.root / "reviewq.toml").write_text(toml)
    before = kb_files(vkb.root)
    job_id = make_job(netns, mine, vkb.root)
    res = reviewq(netns, mine, vkb.root, "run-job", str(job_id), "--reviewer", "codex")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS  kb/notes/alpha.md  prose/body-check" in res.stdout
    assert not note.exists(), note.read_text()
    assert kb_files(vkb.root) == before


def _marketplace(market: Path) -> Path:
    """A person's plugin marketplace folder, ``mine``, listing one plugin, ``kbtools``
    (the same file both Codex and Claude read): the plugin's folder, for its files."""
    (market / ".claude-plugin").mkdir(parents=True)
    (market / ".claude-plugin" / "marketplace.json").write_text(
        json.dumps(
            {
                "name": "mine",
                "owner": {"name": "Me"},
                "plugins": [{"name": "kbtools", "source": "./kbtools"}],
            }
        )
    )
    return market / "kbtools"


def test_a_persons_codex_plugin_does_not_start_beside_a_review(netns, model, home, vkb, tmp_path):
    """A plugin installed as a person installs one (``codex plugin marketplace add`` of a
    folder of theirs and ``codex plugin add``, the real CLI's own commands) brings an MCP
    server of its own ``.mcp.json``, none of config.toml's: it started beside a review,
    outside the sandbox, and wrote into the KB."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    note = vkb.root / "kb" / "notes" / "mcp.md"
    market = tmp_path / "market"
    plugin = _marketplace(market)
    (plugin / ".codex-plugin").mkdir(parents=True)
    (plugin / ".codex-plugin" / "plugin.json").write_text(
        json.dumps({"name": "kbtools", "version": "1.0.0", "mcpServers": "./.mcp.json"})
    )
    server = {"command": "sh", "args": ["-c", f"echo plugin >> {note}; sleep 30"]}
    (plugin / ".mcp.json").write_text(json.dumps({"mcpServers": {"kbsrv": server}}))
    (mine / ".codex").mkdir(exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(mine), "TMPDIR": str(mine / "tmp")}
    for args in (("marketplace", "add", str(market)), ("add", "kbtools@mine")):
        done = subprocess.run(
            [*_in(netns), str(BIN["codex"]), "plugin", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    assert (
        '[plugins."kbtools@mine"]\nenabled = true' in (mine / ".codex" / "config.toml").read_text()
    )
    reviewed_leaving_the_kb(netns, model, mine, vkb, "codex", planted=note)


GEMINI_HOOK_EVENTS = (
    "SessionStart",
    "BeforeAgent",
    "BeforeModel",
    "AfterModel",
    "BeforeToolSelection",
    "BeforeTool",
    "AfterTool",
    "AfterAgent",
    "SessionEnd",
)


def test_a_persons_gemini_hooks_do_not_run_beside_a_review(netns, model, home, vkb, tmp_path):
    """Gemini CLI 0.61 runs the hooks of a person's ~/.gemini/settings.json (no trust
    asked of a user's own) on every event of a headless run: each wrote into the KB."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    note = vkb.root / "kb" / "notes" / "hooked.md"
    settings = mine / ".gemini" / "settings.json"
    data = json.loads(settings.read_text())
    data["hooks"] = {
        event: [
            {"matcher": ".*", "hooks": [{"type": "command", "command": f"echo {event} >> {note}"}]}
        ]
        for event in GEMINI_HOOK_EVENTS
    }
    settings.write_text(json.dumps(data))
    reviewed_leaving_the_kb(netns, model, mine, vkb, "gemini", planted=note)


def _a_home_with_a_persons_mcp_server(home, vkb, tmp_path) -> tuple[Path, Path, dict]:
    """A copy of the module's HOME whose Gemini settings (returned, not yet written) start
    a person's MCP server that writes into the KB's note ``started.md``."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    note = vkb.root / "kb" / "notes" / "started.md"
    data = json.loads((mine / ".gemini" / "settings.json").read_text())
    data["mcpServers"] = {"kb": {"command": "sh", "args": ["-c", f"echo mcp >> {note}"]}}
    return mine, note, data


def test_a_persons_gemini_commands_do_not_start_beside_a_review(netns, model, home, vkb, tmp_path):
    """The commands a person's ~/.gemini/settings.json starts with every session, hooks
    aside: its MCP servers, its ``mcp.serverCommand`` and its ``tools.discoveryCommand``
    (run for the tools it lists); each wrote into the KB."""
    mine, note, data = _a_home_with_a_persons_mcp_server(home, vkb, tmp_path)
    settings = mine / ".gemini" / "settings.json"
    data["mcp"] = {"serverCommand": f"sh -c 'echo servercommand >> {note}'"}
    data["tools"] = {"discoveryCommand": f"sh -c 'echo discovery >> {note}; echo []'"}
    settings.write_text(json.dumps(data))
    reviewed_leaving_the_kb(netns, model, mine, vkb, "gemini", planted=note)


def test_a_persons_gemini_turn_limit_does_not_stop_a_review(netns, model, home, vkb, tmp_path):
    """``model.maxSessionTurns`` in ~/.gemini/settings.json (a person's cap on a chat)
    stopped the review after its first turn, "exited 53 … Reached max session turns for
    this session": the profile paused for the person's setting, every job held."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    settings = mine / ".gemini" / "settings.json"
    settings.write_text(
        json.dumps({**json.loads(settings.read_text()), "model": {"maxSessionTurns": 1}})
    )
    reviewed_leaving_the_kb(netns, model, mine, vkb, "gemini")


def test_a_gemini_profile_may_not_allow_the_persons_mcp_server_by_name(
    netns, model, home, vkb, tmp_path
):
    """Gemini's ``--allowed-mcp-server-names`` is an array: given again in a profile's
    args it adds to reviewq's name that no server has, and the person's server so named
    started beside the review and wrote into the KB (the job failed as "the reviewer
    changed kb/notes/started.md"). Refused when the settings load, as ``--yolo`` is."""
    mine, note, data = _a_home_with_a_persons_mcp_server(home, vkb, tmp_path)
    settings = mine / ".gemini" / "settings.json"
    settings.write_text(json.dumps(data))
    job_id = make_job(netns, mine, vkb.root)
    (vkb.root / "reviewq.toml").write_text(
        profiles(model, "review").replace(
            'model = "gemini-2.5-pro"\n',
            'model = "gemini-2.5-pro"\nargs = ["--allowed-mcp-server-names", "kb"]\n',
        )
    )
    res = reviewq(netns, mine, vkb.root, "run-job", str(job_id), "--reviewer", "gemini")
    assert res.returncode != 0 and not note.exists()
    [line] = res.stderr.splitlines()
    assert "'--allowed-mcp-server-names' is a flag that lifts reviewq's confinement" in line


def test_a_persons_gemini_extension_does_not_start_beside_a_review(
    netns, model, home, vkb, tmp_path
):
    """An extension installed as a person installs one (``gemini extensions install`` of
    a folder of theirs, the real CLI's own command, its trust and consent answered) brings
    an MCP server and hooks, commands Gemini starts with every session: ``--extensions
    none`` keeps each from starting (B21 named it without an extension installed)."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    note = vkb.root / "kb" / "notes" / "started.md"
    ext = tmp_path / "kbext"
    (ext / "hooks").mkdir(parents=True)
    server = {"command": "sh", "args": ["-c", f"echo mcp >> {note}; sleep 30"]}
    (ext / "gemini-extension.json").write_text(
        json.dumps({"name": "kbext", "version": "1.0.0", "mcpServers": {"kbsrv": server}})
    )
    hook = [{"matcher": ".*", "hooks": [{"type": "command", "command": f"echo hook >> {note}"}]}]
    (ext / "hooks" / "hooks.json").write_text(
        json.dumps({"hooks": {e: hook for e in ("SessionStart", "BeforeAgent", "BeforeTool")}})
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(mine), "TMPDIR": str(mine / "tmp")}
    done = subprocess.run(
        [*_in(netns), str(BIN["gemini"]), "extensions", "install", str(ext), "--consent"],
        env=env,
        input="y\n",  # "Do you want to trust this folder and continue…?"
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert 'Extension "kbext" installed successfully and enabled.' in done.stdout + done.stderr, (
        done
    )
    reviewed_leaving_the_kb(netns, model, mine, vkb, "gemini", planted=note)


def _claude_plugin(netns: str, home: Path, root: Path, into: Path) -> Path:
    """A HOME with a plugin installed as a person installs one (``claude plugin
    marketplace add`` and ``claude plugin install``, the real CLI's own commands) from a
    folder of theirs: a language server for Markdown, a command, and hooks of its own,
    each appending its name to a KB note."""
    mine = into / "home"
    shutil.copytree(home, mine, symlinks=True)
    note = root / "kb" / "notes" / "hooked.md"
    market = into / "market"
    plugin = _marketplace(market)
    (plugin / ".claude-plugin").mkdir(parents=True)
    server = into / "mdls"
    server.write_text(f"#!/bin/sh\necho lsp >> {note}\nexec sleep 30\n")
    server.chmod(0o755)
    (plugin / ".claude-plugin" / "plugin.json").write_text(
        json.dumps(
            {
                "name": "kbtools",
                "version": "1.0.0",
                "lspServers": {
                    "mdls": {"command": str(server), "extensionToLanguage": {".md": "markdown"}}
                },
            }
        )
    )
    (plugin / "hooks").mkdir()
    hook = [{"matcher": ".*", "hooks": [{"type": "command", "command": f"echo hook >> {note}"}]}]
    (plugin / "hooks" / "hooks.json").write_text(
        json.dumps({"hooks": {e: hook for e in ("SessionStart", "PreToolUse", "PostToolUse")}})
    )
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(mine),
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    for args in (("marketplace", "add", str(market)), ("install", "kbtools@mine")):
        done = subprocess.run(
            [*_in(netns), str(BIN["claude"]), "plugin", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    settings = json.loads((mine / ".claude" / "settings.json").read_text())
    assert settings["enabledPlugins"] == {"kbtools@mine": True}
    return mine


def test_a_persons_claude_plugin_does_not_start_beside_a_review(netns, model, home, vkb, tmp_path):
    mine = _claude_plugin(netns, home, vkb.root, tmp_path)
    note = vkb.root / "kb" / "notes" / "hooked.md"
    reviewed_leaving_the_kb(netns, model, mine, vkb, "claude", planted=note)


def test_a_key_in_the_persons_claude_settings_still_reaches_the_model(
    netns, model, home, vkb, tmp_path
):
    """The key and endpoint a person gives Claude in ~/.claude/settings.json's ``env``
    (the profile names none): ``--restricted``, which ignores that file, left Claude
    "Not logged in"; safe mode keeps reading it."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    (mine / ".claude").mkdir(exist_ok=True)
    (mine / ".claude" / "settings.json").write_text(
        json.dumps(
            {"env": {"ANTHROPIC_BASE_URL": model.url("review"), "ANTHROPIC_API_KEY": "sk-ant-x"}}
        )
    )
    toml = profiles(model, "review")
    given = f'ANTHROPIC_BASE_URL = "{model.url("review")}", ANTHROPIC_API_KEY = "sk-ant-scripted", '
    assert given in toml
    (vkb.root / "reviewq.toml").write_text(toml.replace(given, ""))
    job_id = make_job(netns, mine, vkb.root)
    res = reviewq(netns, mine, vkb.root, "run-job", str(job_id), "--reviewer", "claude")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS  kb/notes/alpha.md  prose/body-check" in res.stdout


def test_a_persons_claude_settings_env_over_the_profile_s_is_refused_naming_it(
    netns, model, home, vkb, tmp_path
):
    """Claude Code puts ~/.claude/settings.json's ``env`` over its environment: a person's
    endpoint and key there took the place of the profile's, the review went to that
    endpoint, and its 401 paused the profile as "auth: Invalid API key" whatever key
    reviewq.toml gave. The attempt is refused before Claude starts, naming the file."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    (mine / ".claude").mkdir(exist_ok=True)
    settings = mine / ".claude" / "settings.json"
    person = {"ANTHROPIC_BASE_URL": model.url("auth"), "ANTHROPIC_API_KEY": "sk-ant-person"}
    settings.write_text(json.dumps({"env": person}))
    (vkb.root / "reviewq.toml").write_text(profiles(model, "review"))
    job_id = make_job(netns, mine, vkb.root)
    asked = len(model.requests("auth"))
    res = reviewq(netns, mine, vkb.root, "run-job", str(job_id), "--reviewer", "claude")
    assert len(model.requests("auth")) == asked  # the person's endpoint was not asked
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "launch-failure", a  # the set-up's, no verdict: the job waits
    [reason] = json.loads(a["reasons"])
    said = f"{settings}: its env gives ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL a value of its own"
    assert said in reason and "sk-ant" not in reason, reason
    assert f"job {job_id} queued again" in res.stderr, res.stderr
    doctor = reviewq(netns, mine, vkb.root, "doctor")
    assert f"problem: reviewer claude (claude): {said}" in doctor.stdout + doctor.stderr


@pytest.mark.parametrize(
    ("denied", "said"),
    [
        (["Write", "Edit"], "Claude Code started without its Write tool"),
        (["Read"], "Claude Code started without its Read tool"),
        (
            ["Edit(**/.reviewq/**)"],
            "Claude Code's permissions refused the write of its output, "
            ".reviewq/jobs/review-job-1/attempt-1/bundle-output.md",
        ),
        (
            ["Read(**/prompt.md)"],
            "Claude Code's permissions refused the read of its prompt, "
            ".reviewq/jobs/review-job-1/attempt-1/prompt.md",
        ),
    ],
    ids=["write", "read", "state-folder", "prompt"],
)
def test_a_persons_claude_deny_of_write_is_the_profile_s_failure_not_the_job_s(
    netns, model, home, vkb, tmp_path, denied, said
):
    """``permissions.deny`` of Write (or of Read) in ~/.claude/settings.json takes the
    tool away before any permission is asked: the model's call was "No such tool
    available" (a Read deny refuses the output's Write too), Claude exited 0, and every
    job was a no-output counted against it (failed at run-job's one attempt) for the
    person's setting. So was one whose rule covers the state folder (B55), and one that
    refuses the read of the attempt's prompt alone (B57: the model, given no task, wrote
    an empty output, and the job failed at once as "output is empty")."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    (mine / ".claude").mkdir(exist_ok=True)
    deny = {"permissions": {"deny": denied}}
    (mine / ".claude" / "settings.json").write_text(json.dumps(deny))
    (vkb.root / "reviewq.toml").write_text(profiles(model, "review"))
    job_id = make_job(netns, mine, vkb.root)
    res = reviewq(netns, mine, vkb.root, "run-job", str(job_id), "--reviewer", "claude")
    assert "not the job's fault); reviewer claude paused until " in res.stderr, res.stderr
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "reviewer-failure", a
    [reason] = json.loads(a["reasons"])
    assert reason.startswith(f"config: {said}"), reason
    [job] = rows(vkb.root, "SELECT status FROM review_jobs")
    assert job["status"] == "queued", job


@pytest.mark.parametrize("place", ["managed-settings.json", "managed-settings.d/10-site.json"])
def test_a_machines_claude_managed_settings_env_over_the_profile_s_is_refused_naming_it(
    netns, model, home, vkb, tmp_path, place
):
    """Claude Code reads the administrator's settings, /etc/claude-code/managed-settings.json
    and the files of managed-settings.d/, above every other, and puts their ``env`` over its
    environment as it does the person's: B52 read the person's file and the KB's alone, so
    such an env sent the review to the machine's endpoint, whose 401 paused the profile as
    "auth: Invalid API key" whatever key reviewq.toml gave. Refused before Claude starts,
    naming the file, and said by doctor."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    site = {"ANTHROPIC_BASE_URL": model.url("auth"), "ANTHROPIC_API_KEY": "sk-ant-site"}
    (vkb.root / "reviewq.toml").write_text(profiles(model, "review"))
    job_id = make_job(netns, mine, vkb.root)
    asked = len(model.requests("auth"))
    prefix = _with_machine_files(tmp_path, "claude-code", {place: json.dumps({"env": site})})
    res = _run_with_machine_files(
        prefix, netns, mine, vkb, "run-job", str(job_id), "--reviewer", "claude"
    )
    assert len(model.requests("auth")) == asked, (
        res.stdout + res.stderr
    )  # the machine's endpoint was not asked
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "launch-failure", a
    [reason] = json.loads(a["reasons"])
    said = f"/etc/claude-code/{place}: its env gives ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL a value of its own"
    assert said in reason and "sk-ant" not in reason, reason
    doctor = _run_with_machine_files(prefix, netns, mine, vkb, "doctor")
    assert f"problem: reviewer claude (claude): {said}" in doctor.stdout + doctor.stderr


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_sweep_with_the_real_cli(netns, model, home, vkb, vendor):
    (vkb.root / "reviewq.toml").write_text(profiles(model, "review"))
    res = reviewq(netns, home, vkb.root, "sweep", "--reviewer", vendor, "--all-gates", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert _counts(out) == {"completed": 1}, out
    decisions = rows(vkb.root, "SELECT decision FROM acceptance")
    assert [d["decision"] for d in decisions] == ["PASS"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_sweep_leaves_nothing_in_the_worker_s_tmpdir(netns, model, home, vkb, vendor):
    # Each agent's TMPDIR is a folder of its attempt's own, gone once it ended: Claude left
    # a fswatch-probe-* folder in the worker's TMPDIR every run, a year of nights' worth.
    (vkb.root / "reviewq.toml").write_text(profiles(model, "review"))
    before = sorted(p.name for p in (home / "tmp").rglob("*"))
    res = reviewq(netns, home, vkb.root, "sweep", "--reviewer", vendor, "--all-gates", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert _counts(json.loads(res.stdout)) == {"completed": 1}
    assert sorted(p.name for p in (home / "tmp").rglob("*")) == before


# --- infrastructure failures: never a verdict on the note ---------------------------------

EXPECTED_REASON = {
    ("claude", "auth"): "auth: Invalid API key",
    ("codex", "auth"): "auth: unexpected status 401 Unauthorized: Incorrect API key",
    ("gemini", "auth"): "auth: API key expired. Please renew the API key.",
    ("claude", "dead"): "unreachable: API Error: Connection refused",
    ("codex", "dead"): "unreachable: Reconnecting... waiting for network",
    ("gemini", "dead"): "unreachable: exception TypeError: fetch failed sending request",
}


@pytest.mark.parametrize("scenario", ["auth", "dead"])
@pytest.mark.parametrize("vendor", VENDORS)
def test_an_expired_key_or_a_dead_endpoint_pauses_the_reviewer(
    netns, model, home, vkb, vendor, scenario
):
    (vkb.root / "reviewq.toml").write_text(profiles(model, scenario, connect_timeout="2s"))
    start = time.monotonic()
    res = reviewq(netns, home, vkb.root, "sweep", "--reviewer", vendor, "--all-gates", "--json")
    took = time.monotonic() - start
    out = json.loads(res.stdout)
    assert _counts(out) == {"queued": 1}, out  # the job waits: it did not fail
    assert out["failed"] == [] and out.get("escalations", []) == []
    assert rows(vkb.root, "SELECT count(*) AS n FROM escalations")[0]["n"] == 0
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "reviewer-failure"
    reason = EXPECTED_REASON[(vendor, scenario)]
    assert json.loads(a["reasons"])[0].startswith(reason), a["reasons"]
    # "1 job(s) wait on a paused reviewer: reviewer X is paused since …: reason", the
    # reason in words ("the reviewer's key or login was refused: …"); the log keeps it.
    assert reason_words(reason) in res.stderr, res.stderr
    st = reviewq(netns, home, vkb.root, "status")
    said = f"1 job(s) wait for reviewer {vendor}, paused since "  # and how many jobs it holds
    assert said in st.stdout and reason_words(reason) in st.stdout, st.stdout
    logged = reviewq(netns, home, vkb.root, "logs", "--event", "reviewer.paused", "--json")
    [event] = [json.loads(line) for line in logged.stdout.splitlines()]
    assert event["reviewer"] == vendor and reason in event["reason"], event
    report = json.loads(reviewq(netns, home, vkb.root, "report", "--json").stdout)
    [paused] = report["needs_you"]["paused_reviewers"]
    assert paused["reviewer"] == vendor and reason in paused["why"], paused
    assert took < 45, f"{vendor} took {took:.0f} s to give up"


# Each CLI's own words for a flag it does not know (an older CLI, one reviewq passes).
REFUSED_FLAG = {
    "claude": "unknown option '--bogus-flag'",
    "codex": "unexpected argument '--bogus-flag'",
    "gemini": "Unknown arguments: bogus-flag, bogusFlag",
}


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_flag_the_cli_does_not_know_pauses_the_reviewer_in_the_cli_s_words(
    netns, model, home, vkb, vendor
):
    """Gemini follows its complaint with its whole usage, and the reason was the usage's
    last line ("-h, --help  Show help [boolean]"): nothing said which flag it refused."""
    toml = profiles(model, "review")
    toml = toml.replace(
        'model = "claude-sonnet-4-5"\n', 'model = "claude-sonnet-4-5"\nargs = ["--bogus-flag"]\n'
    )
    toml = toml.replace(
        'model = "gemini-2.5-pro"\n', 'model = "gemini-2.5-pro"\nargs = ["--bogus-flag"]\n'
    )
    toml = toml.replace(
        'args = ["-c", \'model_provider', 'args = ["--bogus-flag", "-c", \'model_provider'
    )
    (vkb.root / "reviewq.toml").write_text(toml)
    job_id = make_job(netns, home, vkb.root)
    res = reviewq(netns, home, vkb.root, "run-job", str(job_id), "--reviewer", vendor)
    assert f"job {job_id} queued again (the agent did not start)" in res.stderr, res.stderr
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "launch-failure"
    [reason] = json.loads(a["reasons"])
    assert REFUSED_FLAG[vendor] in reason, reason


def _bogus_flag(toml: str) -> str:
    """``toml`` (:func:`profiles`) with a flag no CLI knows given to each profile."""
    toml = toml.replace(
        'model = "claude-sonnet-4-5"\n', 'model = "claude-sonnet-4-5"\nargs = ["--bogus-flag"]\n'
    )
    toml = toml.replace(
        'model = "gemini-2.5-pro"\n', 'model = "gemini-2.5-pro"\nargs = ["--bogus-flag"]\n'
    )
    return toml.replace(
        'args = ["-c", \'model_provider', 'args = ["--bogus-flag", "-c", \'model_provider'
    )


def _read_slowly(fifo: Path, content: bytes, hold_s: float, stop: threading.Event) -> None:
    """Give ``content`` to the first reader of the FIFO ``fifo`` only after ``hold_s`` (or
    ``stop``), then leave a regular file in its place for any later reader: a settings
    file on a slow disk, or a CLI slow to start on a loaded machine, with no load that
    slows every other test. A FIFO served again raced its next reader, who read nothing."""
    fd = os.open(fifo, os.O_WRONLY)  # until the CLI opens it (or the test, to end this)
    try:
        stop.wait(hold_s)
        regular = fifo.with_name(fifo.name + ".tmp")
        regular.write_bytes(content)
        os.replace(regular, fifo)
        with contextlib.suppress(OSError):  # a reader that gave up
            os.write(fd, content)
    finally:
        os.close(fd)


# A file each CLI reads before it parses its arguments, and what it holds in the tests' HOME.
READ_FIRST = {"gemini": ".gemini/settings.json", "codex": ".codex/config.toml"}


@pytest.mark.parametrize("vendor", list(READ_FIRST))
def test_a_cli_that_refuses_a_flag_after_a_slow_start_is_a_launch_failure(
    netns, model, home, vkb, tmp_path, vendor
):
    """Gemini takes 7-21 s to start on a loaded machine. A flag it refused after the
    launch window (15 s) was a no-output counted against the job (and failed it at its
    last attempt), though the CLI had asked no model anything: the profile's fault. Here
    the file it reads first, the person's settings, comes 16 s late."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    fifo = mine / READ_FIRST[vendor]
    fifo.parent.mkdir(parents=True, exist_ok=True)
    content = fifo.read_bytes() if fifo.exists() else b""
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    (vkb.root / "reviewq.toml").write_text(_bogus_flag(profiles(model, "review")))
    job_id = make_job(netns, mine, vkb.root)
    stop = threading.Event()
    server = threading.Thread(
        target=_read_slowly, args=(fifo, content, LAUNCH_WINDOW_S + 1, stop), daemon=True
    )
    server.start()
    try:
        res = reviewq(netns, mine, vkb.root, "run-job", str(job_id), "--reviewer", vendor)
    finally:
        stop.set()
        if stat.S_ISFIFO(os.lstat(fifo).st_mode):  # never read: the server waits to open it
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        server.join(timeout=10)
    assert not server.is_alive()
    assert f"job {job_id} queued again (the agent did not start)" in res.stderr, res.stderr
    [a] = rows(vkb.root, "SELECT outcome, reasons, duration_s FROM attempts")
    assert a["duration_s"] > LAUNCH_WINDOW_S, a
    assert a["outcome"] == "launch-failure", a
    [reason] = json.loads(a["reasons"])
    assert "with no turns before asking a model: " in reason, reason
    assert REFUSED_FLAG[vendor] in reason, reason
    [job] = rows(vkb.root, "SELECT status FROM review_jobs")
    assert job["status"] == "queued", job  # it was failed at once: run-job's one attempt


# What each CLI says when the HOME it keeps its state in is read-only (a service's
# ProtectHome=read-only): Claude Code runs without writing there.
READ_ONLY_HOME = {
    "claude": None,
    "codex": "Read-only file system (os error 30)",
    # Refused before it starts (B58): with a projects.json there from an earlier run, it
    # retried its lock for good, silent, and the attempt ran to its deadline.
    "gemini": ".gemini: Gemini CLI cannot write its home folder",
}


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_home_the_cli_cannot_write_is_a_launch_failure_in_its_words(
    netns, model, home, vkb, tmp_path, vendor
):
    """Gemini CLI 0.61 stops at its start when it cannot write ~/.gemini (its
    installation id, projects.json), ending its stderr with the stack of its critical
    error: the reason was its last frame, "at async main (file:///…/gemini-….js:17457:5)",
    which says nothing of a read-only HOME. Once a run had left its projects.json there
    (the module's HOME, an earlier test's), it tried to lock that file for good instead,
    saying nothing, and the attempt was "no model answered within the deadline" (B58)."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    (vkb.root / "reviewq.toml").write_text(profiles(model, "review"))
    job_id = make_job(netns, mine, vkb.root)
    with _read_only(mine):
        res = reviewq(netns, mine, vkb.root, "run-job", str(job_id), "--reviewer", vendor)
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    said = READ_ONLY_HOME[vendor]
    if said is None:
        assert a["outcome"] == "finalized", a
        return
    assert a["outcome"] == "launch-failure", a  # the machine's, no verdict: the job waits
    assert f"job {job_id} queued again (the agent did not start)" in res.stderr, res.stderr
    [reason] = json.loads(a["reasons"])
    assert said in reason, reason


def test_run_job_pauses_the_reviewer_as_the_control_does(netns, model, home, vkb):
    """`reviewq run-job` met the same expired key a sweep does and put the job back, but
    left the profile unpaused and its count of failures untouched: the person's next
    run-job, and the control behind it, sent request after request to an endpoint that
    had said no. It pauses now as the worker path pauses it, and says so."""
    (vkb.root / "reviewq.toml").write_text(profiles(model, "auth", connect_timeout="2s"))
    job_id = make_job(netns, home, vkb.root)
    res = reviewq(netns, home, vkb.root, "run-job", str(job_id), "--reviewer", "claude")
    assert "not the job's fault); reviewer claude paused until " in res.stderr, res.stderr
    [r] = rows(vkb.root, "SELECT paused_until, paused_reason FROM reviewer_state")
    reason = EXPECTED_REASON[("claude", "auth")]
    assert r["paused_until"] and reason in r["paused_reason"], r
    [job] = rows(vkb.root, "SELECT status, launch_failures FROM review_jobs")
    assert (job["status"], job["launch_failures"]) == ("queued", 1), job
    st = reviewq(netns, home, vkb.root, "status")
    assert "reviewer claude is paused since " in st.stdout, st.stdout
    logged = reviewq(netns, home, vkb.root, "logs", "--event", "reviewer.paused", "--json")
    [event] = [json.loads(line) for line in logged.stdout.splitlines()]
    assert event["reviewer"] == "claude" and event["by_hand"] is True, event


@pytest.mark.parametrize(
    ("scenario", "kind", "detail"),
    [("auth", "auth", "status 401, authentication_failed"), ("dead", "unreachable", "no response")],
)
def test_connect_timeout_cuts_claude_s_retries_short(
    netns, model, home, vkb, scenario, kind, detail
):
    (vkb.root / "reviewq.toml").write_text(
        profiles(model, scenario, claude_retries="default", connect_timeout="3s")
    )
    job_id = make_job(netns, home, vkb.root)
    res = reviewq(netns, home, vkb.root, "run-job", str(job_id), "--reviewer", "claude")
    assert "not the job's fault)" in res.stderr, res.stdout + res.stderr
    [a] = rows(vkb.root, "SELECT outcome, reasons, duration_s FROM attempts")
    assert a["outcome"] == "reviewer-failure"
    # The first retries come after 0.5 s, 1 s, 2 s: by 3 s Claude has said which it is.
    (said,) = json.loads(a["reasons"])
    assert said.startswith(f"{kind}: API retry ") and detail in said, said
    assert a["duration_s"] < 10, a


# What each CLI says (the start of the reason reviewq keeps) when the server answered the
# first turn and then broke; its own words where it drops the server's.
MIDRUN = {
    ("claude", "midfail"): "server: API Error: 503 Service unavailable.",
    ("claude", "middrop"): "unreachable: API Error: Connection",
    # The server answered (HTTP 200) and broke: its failure, not an endpoint out of reach.
    ("claude", "midcut"): "server: API Error: API returned an empty or malformed response",
    ("claude", "midevent"): "server: API Error: API returned an empty or malformed response",
    ("codex", "midfail"): "server: unexpected status 503 Service Unavailable: Service unavailable",
    ("codex", "middrop"): "unreachable: stream disconnected before completion",
    ("codex", "midcut"): "server: stream disconnected before completion",
    ("codex", "midevent"): "server: stream disconnected before completion: The server had an error",
    ("gemini", "midfail"): "server: Service unavailable",
    ("gemini", "middrop"): "unreachable: exception TypeError: fetch failed",
    ("gemini", "midcut"): "unreachable: Incomplete JSON segment at the end",
    # Gemini 0.61's SDK drops an error object inside a 200 stream: after a tool call the
    # turn reads as an empty answer and it exits 0; its chat log shows no model answered.
    ("gemini", "midevent"): "server: the endpoint's last answer (HTTP 200) held no content",
}


@pytest.mark.parametrize(("vendor", "scenario"), list(MIDRUN))
def test_a_model_server_failing_mid_run_is_the_reviewer_s_failure(
    netns, model, home, vkb, vendor, scenario
):
    """The first turn is answered, then the server breaks: a 503, a connection closed with
    no answer, a stream cut after its first event, a stream ending in an error event.
    Codex ("stream disconnected before completion") and Gemini ("Incomplete JSON segment
    at the end") said so in words reviewq did not know: the job failed. Gemini said
    nothing at all of an error event: a no-output counted against the job."""
    (vkb.root / "reviewq.toml").write_text(profiles(model, scenario))
    job_id = make_job(netns, home, vkb.root)
    res = reviewq(netns, home, vkb.root, "run-job", str(job_id), "--reviewer", vendor)
    assert "not the job's fault)" in res.stderr, res.stdout + res.stderr
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "reviewer-failure", a
    assert json.loads(a["reasons"])[0].startswith(MIDRUN[(vendor, scenario)]), a
    assert any(r.get("action") == scenario for r in model.requests(scenario))


@pytest.mark.parametrize(
    ("vendor", "scenario", "reason"),
    [
        # Codex drops a 500's words for its own, and says a model_not_found 403 without
        # its status: neither was known, and after a first answered turn each was a
        # no-output counted against the job (before it, "its agent failed to start").
        ("codex", "mid-s500", "server: We\u2019re currently experiencing high demand"),
        (
            "codex",
            "mid-s403",
            "not-found: Project does not have access to model scripted-codex",
        ),
        # Gemini retries a first turn whose stream holds only an error, then exits 0 with
        # "Model stream ended without a finish reason." as its error: a no-output.
        ("gemini", "event", "server: Model stream ended without a finish reason."),
        ("claude", "mid-s529", "server: API Error: 529 Overloaded."),
    ],
)
def test_an_endpoint_s_error_reaches_the_operator_as_the_reviewer_s_failure(
    netns, model, home, vkb, vendor, scenario, reason
):
    """An HTTP error (or an error inside a 200) from the endpoint, met by a sweep: the
    job waits, and `reviewq job N` and `reviewq logs --job N` say why in the CLI's words."""
    (vkb.root / "reviewq.toml").write_text(profiles(model, scenario))
    res = reviewq(netns, home, vkb.root, "sweep", "--reviewer", vendor, "--all-gates", "--json")
    assert _counts(json.loads(res.stdout)) == {"queued": 1}, res.stdout + res.stderr
    [a] = rows(vkb.root, "SELECT job_id, outcome, reasons FROM attempts")
    assert a["outcome"] == "reviewer-failure", a
    assert json.loads(a["reasons"])[0].startswith(reason), a
    job_id = a["job_id"]
    shown = reviewq(netns, home, vkb.root, "job", str(job_id))
    # job N says the kind in words ("the reviewer's server failed: …"); the log keeps it.
    said = reason_words(reason)
    assert f"job {job_id}: queued " in shown.stdout and said in shown.stdout, shown.stdout
    logged = reviewq(netns, home, vkb.root, "logs", "--job", str(job_id), "--json")
    events = [json.loads(line) for line in logged.stdout.splitlines()]
    [failed] = [e for e in events if e["event"] == "attempt.reviewer_failed"]
    assert failed["reasons"][0].startswith(reason), failed


@pytest.mark.parametrize("vendor", ["claude", "codex"])
def test_a_model_stopped_at_its_output_token_limit_burns_the_attempt_out(
    netns, model, home, vkb, vendor
):
    """Claude ("response exceeded the 32000 output token maximum", an API error with no
    status) was paused as an outage; Codex ("Incomplete response returned, reason:
    max_output_tokens") failed as no-output. The job is too big: burned out, it splits."""
    (vkb.root / "reviewq.toml").write_text(profiles(model, "maxtokens"))
    job_id = make_job(netns, home, vkb.root)
    reviewq(netns, home, vkb.root, "run-job", str(job_id), "--reviewer", vendor)
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "burned-out", a
    assert "output-token limit" in json.loads(a["reasons"])[0], a


def test_a_codex_answer_its_content_filter_stopped_is_the_job_s(netns, model, home, vkb):
    """Codex says an answer the content filter cut off as "stream disconnected before
    completion: Incomplete response returned, reason: content_filter", the words of a
    broken stream: read as the server's failure, the profile paused and the job, whose
    notes the filter refuses every time, waited for good and paused it again at each try."""
    (vkb.root / "reviewq.toml").write_text(profiles(model, "filtered"))
    job_id = make_job(netns, home, vkb.root)
    reviewq(netns, home, vkb.root, "run-job", str(job_id), "--reviewer", "codex")
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "no-output", a
    assert "content_filter" in json.loads(a["reasons"])[0], a


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_model_that_refuses_the_review_is_a_no_output_in_its_words(
    netns, model, home, vkb, vendor
):
    """A model that declines the task in words and writes nothing answered the job (the
    `openai` kind's refusal is the same counted no-output): the reason was "exited 0
    without writing bundle-output.md" alone, a CLI that forgot its task to the operator
    and to the retry's prompt, never the refusal."""
    (vkb.root / "reviewq.toml").write_text(profiles(model, "refuse"))
    job_id = make_job(netns, home, vkb.root)
    res = reviewq(netns, home, vkb.root, "run-job", str(job_id), "--reviewer", vendor)
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "no-output", a
    said = f"exited 0 without writing bundle-output.md: its model ended saying: {REFUSAL}"
    assert json.loads(a["reasons"]) == [said], a
    assert said in res.stdout + res.stderr


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_model_server_that_never_answers_is_the_reviewer_s_failure_at_the_deadline(
    netns, model, home, vkb, vendor
):
    """The server takes each request and never replies: every CLI waits past its deadline
    and is killed. That was burned-out, counted against the job and splitting it as if it
    were too big, though no model had answered anything."""
    (vkb.root / "reviewq.toml").write_text(
        profiles(model, "hung", timeout="8s", connect_timeout="4s")
    )
    job_id = make_job(netns, home, vkb.root)
    res = reviewq(netns, home, vkb.root, "run-job", str(job_id), "--reviewer", vendor)
    assert "not the job's fault)" in res.stderr, res.stdout + res.stderr
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "reviewer-failure", a
    assert json.loads(a["reasons"]) == ["unreachable: no model answered within the deadline of 8 s"]
    assert any(r.get("action") == "hang" for r in model.requests("hung"))


def _gemini_asked(model: Model) -> int:
    """How many of Gemini's requests the module's model server has had on ``hung``: the
    other CLIs' runs on it (a late one among them) counted too, and failed a test under
    load ("4 == 3")."""
    return sum(r.get("api") == "gemini" for r in model.requests("hung"))


def test_a_gemini_killed_before_it_reached_its_model_is_the_reviewer_s_failure(
    netns, model, home, vkb
):
    """Gemini takes 7-21 s to start on a loaded machine, writing no chat log until it
    sends the prompt: killed at a deadline before that, it was burned-out, counted
    against the job as if the note were too big, though no model had been asked."""
    (vkb.root / "reviewq.toml").write_text(
        profiles(model, "hung", timeout="0.5s", connect_timeout="0.2s")
    )
    job_id = make_job(netns, home, vkb.root)
    asked = _gemini_asked(model)
    reviewq(netns, home, vkb.root, "run-job", str(job_id), "--reviewer", "gemini")
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "reviewer-failure", a
    assert json.loads(a["reasons"]) == [
        "unreachable: no model answered within the deadline of 0.5 s"
    ]
    if _gemini_asked(model) != asked:
        # Its request went out in the grace between the deadline's SIGTERM and SIGKILL
        # (a slow machine's kill): right as well, but not the start this test means.
        pytest.skip("Gemini reached its model before it was killed: not the start meant here")


def test_a_gemini_killed_after_it_named_the_job_folder_but_before_its_prompt_is_the_reviewer_s_failure(
    netns, model, home, vkb, tmp_path
):
    """Gemini names the job folder in projects.json first thing, then starts (settings,
    memory, tools, 7-21 s on a loaded machine) and records the prompt in its chat log as
    it sends it. Killed in between, no chat log held the prompt and `answered` said it
    could not tell: the attempt was burned-out, the job's, though no model was asked.
    Here the person's GEMINI.md is a FIFO nobody writes, so Gemini waits on it there."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    os.mkfifo(mine / ".gemini" / "GEMINI.md")
    (vkb.root / "reviewq.toml").write_text(
        profiles(model, "hung", timeout="6s", connect_timeout="3s")
    )
    job_id = make_job(netns, mine, vkb.root)
    asked = _gemini_asked(model)
    reviewq(netns, mine, vkb.root, "run-job", str(job_id), "--reviewer", "gemini")
    assert _gemini_asked(model) == asked  # no request reached the model
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "reviewer-failure", a
    assert json.loads(a["reasons"]) == ["unreachable: no model answered within the deadline of 6 s"]
    projects = mine / ".gemini" / "projects.json"
    named = projects.exists() and any(
        Path(k).name.startswith("review-job-") for k in json.loads(projects.read_text())["projects"]
    )
    if not named:
        # Its start outlasted the deadline (Node, its settings: past 6 s under load):
        # killed before it named the job folder, as the test above means, and said so.
        pytest.skip("Gemini was killed before it named the job folder: not the moment meant here")


def _retrying(home: Path, into: Path) -> Path:
    """A copy of ``home`` whose Gemini keeps its default retries (ten, 5-30 s apart)."""
    mine = into / "home"
    shutil.copytree(home, mine, symlinks=True)
    settings = mine / ".gemini" / "settings.json"
    data = json.loads(settings.read_text())
    del data["general"]["maxAttempts"]
    settings.write_text(json.dumps(data))
    return mine


def test_connect_timeout_cuts_gemini_s_retries_short(netns, model, home, vkb, tmp_path):
    """Gemini retries a 429 for minutes, saying each try on stderr: connect_timeout did
    nothing for it, and a deadline that came first said "no model answered", the
    server's words lost. (Its 429 here comes with retry-after: 1.)"""
    mine = _retrying(home, tmp_path)
    (vkb.root / "reviewq.toml").write_text(
        profiles(model, "s429ra", timeout="60s", gemini_connect_timeout="3s")
    )
    job_id = make_job(netns, mine, vkb.root)
    res = reviewq(netns, mine, vkb.root, "run-job", str(job_id), "--reviewer", "gemini")
    assert "not the job's fault)" in res.stderr, res.stdout + res.stderr
    [a] = rows(vkb.root, "SELECT outcome, reasons, duration_s FROM attempts")
    assert a["outcome"] == "reviewer-failure", a
    (said,) = json.loads(a["reasons"])
    # Google's every 429 says "(e.g. check quota)": a hint, not a quota spent.
    assert said.startswith("rate-limit: API retry ") and said.endswith(
        ": status 429, Resource has been exhausted (e.g. check quota)."
    ), said
    assert a["duration_s"] < 30, a


def test_gemini_retrying_past_its_deadline_with_no_answer_is_the_reviewer_s_failure(
    netns, model, home, vkb, tmp_path
):
    """With its default retries (ten, backing off for minutes) Gemini outlasts the
    deadline against an endpoint that refuses it, and is killed before it says why: only
    its chat log shows that no model answered."""
    mine = _retrying(home, tmp_path)
    (vkb.root / "reviewq.toml").write_text(
        profiles(model, "dead", timeout="8s", connect_timeout="4s")
    )
    job_id = make_job(netns, mine, vkb.root)
    reviewq(netns, mine, vkb.root, "run-job", str(job_id), "--reviewer", "gemini")
    [a] = rows(vkb.root, "SELECT outcome, reasons, duration_s FROM attempts")
    assert a["outcome"] == "reviewer-failure", a
    assert a["duration_s"] >= 8, a  # it was the deadline that ended it


# --- a runaway agent ----------------------------------------------------------------------


API = {"claude": "anthropic", "codex": "responses", "gemini": "gemini"}


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_runaway_agent_ends_and_its_tokens_are_kept(netns, model, home, vkb, vendor):
    (vkb.root / "reviewq.toml").write_text(
        profiles(model, "runaway", max_turns="4", timeout="10s", connect_timeout="4s")
    )
    job_id = make_job(netns, home, vkb.root)
    res = reviewq(netns, home, vkb.root, "run-job", str(job_id), "--reviewer", vendor)
    assert res.returncode != 0
    [a] = rows(vkb.root, "SELECT * FROM attempts WHERE job_id = ?", job_id)
    calls = len([r for r in model.requests("runaway") if r.get("api") == API[vendor]])
    if vendor == "gemini":
        # Gemini's own loop guard ends an agent that keeps reading the same files: it
        # exits 0 with nothing written, and its JSON counts every call.
        # (Gemini resends a request now and then and counts it once.) On a slow machine
        # the deadline may come first: then it is killed, and its JSON never written;
        # killed still starting (past 10 s under load), before a model answered it (its
        # chat log says; a request may go out in the kill's grace), it is the reviewer's
        # failure (B18), no verdict on the job.
        if a["outcome"] == "reviewer-failure":
            assert json.loads(a["reasons"]) == [
                "unreachable: no model answered within the deadline of 10 s"
            ], a
            return
        assert a["outcome"] in ("no-output", "burned-out"), a
        if a["outcome"] == "no-output":
            assert 4 <= a["num_turns"] <= calls, a
            assert a["input_tokens"] == a["num_turns"] * 1000, a
            assert a["cost_usd"] > 0
        return
    if vendor == "claude":
        assert a["outcome"] == "burned-out", a  # --max-turns 4
        assert a["input_tokens"] == calls * 1000 == 4000, a
    else:
        # Codex has no turn limit reviewq can set: killed at the deadline, it keeps the
        # calls and tokens its session log shows (which may lag the last call by one).
        assert a["outcome"] == "burned-out", a
        assert calls - 1 <= a["num_turns"] <= calls, (calls, a)
        assert (calls - 1) * 1000 <= a["input_tokens"] <= calls * 1000, (calls, a)
    assert a["cost_usd"] and a["cost_usd"] > 0


# --- fixes --------------------------------------------------------------------------------
# The model of every fix scenario FAILs a note that says TODO and PASSes one that does not;
# a fix task writes the note without it to its output (tests/vendor_model.py).

FIX_NOTE_BODY = "# Alpha\n\nAlpha body. TODO\n"


@pytest.fixture
def fkb(vkb):
    """``vkb`` with a note its review FAILs, committed in its git repository, and fixes
    committed too."""
    vkb.note("alpha", body=FIX_NOTE_BODY)
    git = ["git", "-C", str(vkb.root), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "the KB"], check=True)
    return vkb


def fix_profiles(model: Model, scenario: str) -> str:
    return profiles(model, scenario) + "\n[fix]\ngit_commit = true\n"


def fix_sweep(netns, home, root: Path, vendor: str) -> dict:
    res = reviewq(
        netns, home, root, "sweep", "--reviewer", vendor, "--all-gates", "--fix", "--json"
    )
    assert res.stdout.startswith("{"), res.stdout + res.stderr
    return json.loads(res.stdout)


def git_log(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(root), "log", "--format=%s", "--name-only"],
        capture_output=True,
        text=True,
        check=True,
    )
    return [line for line in out.stdout.splitlines() if line]


@pytest.mark.parametrize("vendor", VENDORS)
def test_the_real_cli_fixes_a_failing_note_and_its_re_review_passes(
    netns, model, home, fkb, vendor
):
    """FAIL, the fix by the vendor CLI, its re-review PASS: the note written and committed."""
    (fkb.root / "reviewq.toml").write_text(fix_profiles(model, "fix"))
    out = fix_sweep(netns, home, fkb.root, vendor)
    assert out["escalations"] == [], out
    assert fkb.read(NOTE).endswith("# Alpha\n\nAlpha body. done\n")
    fixes = rows(fkb.root, "SELECT result, fix_commit FROM review_jobs WHERE kind = 'fix'")
    assert [f["result"] for f in fixes] == ["applied"] and fixes[0]["fix_commit"], fixes
    [acc] = rows(fkb.root, "SELECT decision FROM acceptance")
    assert acc["decision"] == "PASS"
    log = git_log(fkb.root)
    assert log[1] == NOTE and log[2] == "the KB", log  # one commit, of that note alone
    body = subprocess.run(
        ["git", "-C", str(fkb.root), "log", "-1", "--format=%B"], capture_output=True, text=True
    ).stdout
    assert "the note still says TODO" in body and f"The fixer {vendor} edited" in body, body
    assert kb_changes(fkb.root) == ""


def kb_changes(root: Path) -> str:
    """What git sees changed in the KB's notes since its last commit."""
    return subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--", "kb"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def fix_jobs(root: Path) -> list[dict]:
    return rows(root, "SELECT id, status, result, fix_commit FROM review_jobs WHERE kind = 'fix'")


# How each CLI's refusal of the fixer's write over the KB note is said (Gemini's stderr
# names the tool alone; its chat log, the file too).
REFUSED_WRITE = {
    "claude": f"the agent's Write to {NOTE} refused by Claude Code's permissions",
    "codex": f"the agent's command on {NOTE} (Read-only file system) refused by Codex's sandbox",
    "gemini": f"the agent's write_file to {NOTE} refused by Gemini CLI's policy",
}


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_fixer_writing_the_kb_note_itself_is_refused_and_the_note_kept(
    netns, model, home, fkb, vendor
):
    """The fixer writes its note over the KB's, as the prompt forbids, and no output: each
    CLI refuses the write; every attempt is the fixer's no-output, and the FAIL goes to a
    person with the note as it was."""
    (fkb.root / "reviewq.toml").write_text(fix_profiles(model, "fixkb"))
    out = fix_sweep(netns, home, fkb.root, vendor)
    assert fkb.read(NOTE).endswith(FIX_NOTE_BODY) and kb_changes(fkb.root) == ""
    [esc] = out["escalations"]
    said = "the fixer failed every attempt: exited 0 without writing fixed-note.md: "
    assert esc["reason"] == said + REFUSED_WRITE[vendor]
    assert [f["status"] for f in fix_jobs(fkb.root)] == ["failed"]
    asked = [r["action"] for r in model.requests("fixkb") if r.get("arg") == str(fkb.root / NOTE)]
    assert "write" in asked  # it was asked, and refused


# Codex's words for a patch its sandbox refused, beside the paths the patch named
PATCH_REFUSED = (
    f"the agent's apply_patch to {NOTE} (writing outside of the project), apply_patch to "
    ".reviewq/worker/attempts/../escaped.md (writing outside of the project) refused by "
    "Codex's sandbox"
)


# A model outside Codex's catalog is given no apply_patch tool: its patch comes as a
# command Codex takes for the tool. A catalog model's (gpt-5.5) is the tool's own call.
@pytest.mark.parametrize("codex_model", ["scripted-codex", "gpt-5.5"])
def test_a_codex_fixer_s_patch_of_the_kb_note_refused_is_said(netns, model, home, fkb, codex_model):
    """The Codex fixer patches the KB note in place and adds a file through ``..`` with
    its own apply_patch, and writes no output: Codex refuses both, saying so in its
    session log alone (its --json shows neither call, its stderr no path). The attempt
    said only "exited 0 without writing fixed-note.md"; it names what was refused."""
    toml = fix_profiles(model, "fixpatch").replace('"scripted-codex"', f'"{codex_model}"')
    (fkb.root / "reviewq.toml").write_text(toml)
    out = fix_sweep(netns, home, fkb.root, "codex")
    assert fkb.read(NOTE).endswith(FIX_NOTE_BODY) and kb_changes(fkb.root) == ""
    assert not list(fkb.state.rglob("escaped.md"))
    [esc] = out["escalations"]
    said = "the fixer failed every attempt: exited 0 without writing fixed-note.md: "
    assert esc["reason"] == said + PATCH_REFUSED, esc
    mine = [r for r in model.requests("fixpatch") if str(r.get("arg")).startswith(str(fkb.root))]
    assert [r["action"] for r in mine].count("patch") == 6  # two an attempt, each refused


@pytest.mark.parametrize("codex_model", ["scripted-codex", "gpt-5.5"])
def test_a_codex_fixer_writing_its_note_with_apply_patch_has_it_applied(
    netns, model, home, fkb, codex_model
):
    """Codex's instructions tell its models to make every edit with apply_patch: the
    fixer adds its output so, of a note whose lines end in blanks and whose last has no
    line end, and the fix is applied as the model gave it, committed and re-reviewed."""
    (fkb.root / NOTE).write_text("---\ntitle: Alpha\n---\nTwo blanks.  \n\tAlpha TODO\n\nLast")
    subprocess.run(["git", "-C", str(fkb.root), "-c", "user.name=t", "-c",
                    "user.email=t@example.org", "commit", "-qam", "the KB"], check=True)  # fmt: skip
    toml = fix_profiles(model, "fixpatchout").replace('"scripted-codex"', f'"{codex_model}"')
    (fkb.root / "reviewq.toml").write_text(toml)
    out = fix_sweep(netns, home, fkb.root, "codex")
    assert out["escalations"] == [], out
    assert fkb.read(NOTE) == "---\ntitle: Alpha\n---\nTwo blanks.  \n\tAlpha done\n\nLast"
    assert [f["result"] for f in fix_jobs(fkb.root)] == ["applied"]
    [acc] = rows(fkb.root, "SELECT decision FROM acceptance")
    assert acc["decision"] == "PASS"


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_fixer_writing_beside_its_output_gets_only_its_note_applied(
    netns, model, home, fkb, vendor
):
    """Beside its output the fixer writes a new KB note and a file through ``..``: both are
    refused, the fix itself is applied and committed alone."""
    (fkb.root / "reviewq.toml").write_text(fix_profiles(model, "fixout"))
    out = fix_sweep(netns, home, fkb.root, vendor)
    assert out["escalations"] == [], out
    assert kb_files(fkb.root) == ["kb/instructions/review-gates/prose/body-check.md", NOTE]
    assert not list(fkb.state.rglob("escaped.md"))
    assert [f["result"] for f in fix_jobs(fkb.root)] == ["applied"]
    assert git_log(fkb.root)[:2] == [f"reviewq fix: {NOTE} (prose/body-check)", NOTE]


@pytest.mark.parametrize(
    ("vendor", "scenario", "said"),
    [
        ("codex", "fixsame", "3 consecutive rejections (the last fix changed nothing)"),
        (
            "gemini",
            "fixnofm",
            "the fixer failed every attempt: the fixed note is unusable: broken YAML "
            "(frontmatter line 2)",
        ),
        *(
            (
                vendor,
                "fixhuge",
                "the fixer failed every attempt: the fixed note is 65",  # …595 bytes, over…
            )
            for vendor in VENDORS
        ),
    ],
)
def test_a_fixer_s_note_unchanged_broken_or_too_large_goes_to_a_person(
    netns, model, home, fkb, vendor, scenario, said
):
    """The note given back unchanged, with broken frontmatter, or grown past max_note_bytes
    with text the fixer made up: none is written. The last was written and committed, and
    no sweep reviewed the note again: its FAIL stood, nothing escalated."""
    (fkb.root / "reviewq.toml").write_text(
        fix_profiles(model, scenario) + "\n[limits]\nmax_note_bytes = 16384\n"
    )
    out = fix_sweep(netns, home, fkb.root, vendor)
    assert fkb.read(NOTE).endswith(FIX_NOTE_BODY) and kb_changes(fkb.root) == ""
    assert git_log(fkb.root)[0] == "the KB"
    [esc] = out["escalations"]
    assert esc["reason"].startswith(said), esc
    if scenario == "fixhuge":
        assert "over [limits] max_note_bytes (16384): no review could judge it" in esc["reason"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_the_endpoint_dying_mid_fix_is_the_fixer_s_failure_and_the_fix_is_retried(
    netns, model, home, fkb, vendor
):
    """The endpoint closes the fix's connection after its first turn: the fixer's outage,
    not the note's, and nothing reaches the KB; resumed, the same fix job goes through."""
    (fkb.root / "reviewq.toml").write_text(fix_profiles(model, "fixdrop"))
    out = fix_sweep(netns, home, fkb.root, vendor)
    assert _counts(out) == {"completed": 1, "queued": 1} and out["escalations"] == [], out
    [a] = rows(fkb.root, "SELECT outcome, reasons FROM attempts WHERE job_id = 2")
    assert a["outcome"] == "reviewer-failure", a
    assert json.loads(a["reasons"])[0].startswith("unreachable: "), a
    assert fkb.read(NOTE).endswith(FIX_NOTE_BODY) and kb_changes(fkb.root) == ""
    assert not list(fkb.root.joinpath("kb").rglob(".*"))  # no half-written temp file
    assert reviewq(netns, home, fkb.root, "resume", vendor).returncode == 0
    out = fix_sweep(netns, home, fkb.root, vendor)
    assert out["escalations"] == [], out
    assert fix_jobs(fkb.root)[0]["result"] == "applied"
    [acc] = rows(fkb.root, "SELECT decision FROM acceptance")
    assert acc["decision"] == "PASS"
    assert fkb.read(NOTE).endswith("# Alpha\n\nAlpha body. done\n")
    assert git_log(fkb.root)[0] == f"reviewq fix: {NOTE} (prose/body-check)"


def fixer_profiles(model: Model, scenario: str, fixer_scenario: str) -> str:
    """:func:`fix_profiles` for the reviewers, plus a ``VENDOR-fixer`` profile of each
    vendor pointed at ``fixer_scenario``: the fix meets its own endpoint."""
    fixers = "[reviewers.claude]" + profiles(model, fixer_scenario).split("[reviewers.claude]")[1]
    for vendor in VENDORS:
        fixers = fixers.replace(f"[reviewers.{vendor}]", f"[reviewers.{vendor}-fixer]")
    return fix_profiles(model, scenario) + fixers


def fixer_sweep(netns, home, root: Path, vendor: str) -> dict:  # noqa: ANN001 - fixtures
    res = reviewq(
        netns, home, root, "sweep", "--reviewer", vendor, "--fixer", f"{vendor}-fixer",
        "--all-gates", "--fix", "--json",
    )  # fmt: skip
    assert res.stdout.startswith("{"), res.stdout + res.stderr
    return {**json.loads(res.stdout), "stderr": res.stderr}


def shown(netns, home, root: Path, job_id: int) -> tuple[str, list[dict]]:  # noqa: ANN001
    """What a person sees of job ``job_id``: `reviewq job N`, and `reviewq logs --job N`."""
    said = reviewq(netns, home, root, "job", str(job_id))
    assert said.returncode == 0, said.stderr
    logged = reviewq(netns, home, root, "logs", "--job", str(job_id), "--json")
    return said.stdout, [json.loads(line) for line in logged.stdout.splitlines()]


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_fixer_writing_crlf_and_a_bom_is_applied_in_the_note_s_form(
    netns, model, home, fkb, vendor
):
    """The fixer writes its note with a byte order mark and CRLF line ends, the KB's note
    has neither: the fix is applied in the note's form, and git sees one line changed."""
    (fkb.root / "reviewq.toml").write_text(fix_profiles(model, "fixcrlf"))
    out = fix_sweep(netns, home, fkb.root, vendor)
    assert out["escalations"] == [], out
    assert [f["result"] for f in fix_jobs(fkb.root)] == ["applied"]
    text = (fkb.root / NOTE).read_bytes()
    assert text.endswith(b"# Alpha\n\nAlpha body. done\n") and b"\r" not in text, text
    assert not text.startswith(b"\xef\xbb\xbf"), text
    diff = subprocess.run(
        ["git", "-C", str(fkb.root), "show", "--numstat", "--format=", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert diff.split() == ["1", "1", NOTE], diff
    [acc] = rows(fkb.root, "SELECT decision FROM acceptance")
    assert acc["decision"] == "PASS"


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_fixer_writing_nothing_goes_to_a_person_as_the_fixer_s_failure(
    netns, model, home, fkb, vendor
):
    """The fixer reads its prompt and ends, writing nothing: each attempt a no-output,
    and the FAIL goes to a person as the fixer's failure (redo), not a verdict."""
    (fkb.root / "reviewq.toml").write_text(fix_profiles(model, "fixidle"))
    out = fix_sweep(netns, home, fkb.root, vendor)
    assert fkb.read(NOTE).endswith(FIX_NOTE_BODY) and kb_changes(fkb.root) == ""
    [esc] = out["escalations"]
    assert esc["reason"].startswith(
        "the fixer failed every attempt: exited 0 without writing fixed-note.md"
    ), esc
    assert esc["call"] == "redo", esc
    [fix] = fix_jobs(fkb.root)
    assert fix["status"] == "failed"
    outcomes = rows(fkb.root, "SELECT outcome FROM attempts WHERE job_id = ?", fix["id"])
    assert [a["outcome"] for a in outcomes] == ["no-output"] * 3
    said, events = shown(netns, home, fkb.root, fix["id"])
    assert f"job {fix['id']}: failed" in said and "fixed-note.md" in said, said
    assert "job.failed" in [e["event"] for e in events], events


FIXER_OUTAGE = {
    "auth": "auth: ",
    "mid-s429": "rate-limit: ",
    "mid-s500": "server: ",
}


@pytest.mark.parametrize("scenario", list(FIXER_OUTAGE))
@pytest.mark.parametrize("vendor", VENDORS)
def test_a_fixer_s_outage_holds_the_fix_and_is_no_verdict_on_the_note(
    netns, model, home, fkb, vendor, scenario
):
    """The review FAILs the note; the fixer's endpoint refuses its key, rate-limits it or
    fails: the fix job waits on the paused fixer, nothing is escalated or written, and
    `job N`, `logs --job N` and the report say the fixer's outage."""
    (fkb.root / "reviewq.toml").write_text(fixer_profiles(model, "fix", scenario))
    out = fixer_sweep(netns, home, fkb.root, vendor)
    assert out["escalations"] == [] and out["failed"] == [], out
    assert fkb.read(NOTE).endswith(FIX_NOTE_BODY) and kb_changes(fkb.root) == ""
    [fix] = fix_jobs(fkb.root)
    assert fix["status"] == "queued", fix
    [a] = rows(fkb.root, "SELECT outcome, reasons FROM attempts WHERE job_id = ?", fix["id"])
    assert a["outcome"] == "reviewer-failure", a
    reason = json.loads(a["reasons"])[0]
    assert reason.startswith(FIXER_OUTAGE[scenario]), reason
    said, events = shown(netns, home, fkb.root, fix["id"])
    assert f"job {fix['id']}: queued" in said and reason_words(reason) in said, said
    [failed] = [e for e in events if e["event"] == "attempt.reviewer_failed"]
    assert failed["reasons"][0] == reason, failed
    report = json.loads(reviewq(netns, home, fkb.root, "report", "--json").stdout)
    [paused] = report["needs_you"]["paused_reviewers"]
    assert paused["reviewer"] == f"{vendor}-fixer" and paused["jobs_waiting"] == 1, paused
    assert report["needs_you"]["escalations"] == [], report["needs_you"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_fixer_whose_endpoint_fails_after_it_wrote_the_note_has_nothing_applied(
    netns, model, home, fkb, vendor
):
    """The fixer writes its whole note, then its next turn gets a 500: the CLI did not end
    cleanly, so its note is not applied (it may be cut short); the fixer's outage holds
    the fix job, and nothing is escalated or committed."""
    (fkb.root / "reviewq.toml").write_text(fix_profiles(model, "fixthen-s500"))
    out = fix_sweep(netns, home, fkb.root, vendor)
    assert out["escalations"] == [] and out["failed"] == [], out
    assert fkb.read(NOTE).endswith(FIX_NOTE_BODY) and git_log(fkb.root)[0] == "the KB"
    [fix] = fix_jobs(fkb.root)
    assert fix["status"] == "queued" and fix["result"] is None, fix
    [a] = rows(fkb.root, "SELECT outcome, reasons FROM attempts WHERE job_id = ?", fix["id"])
    reasons = json.loads(a["reasons"])
    assert a["outcome"] == "reviewer-failure" and reasons[0].startswith("server: "), a
    assert reasons[1].startswith("fixed-note.md is not applied: the fixer did not end cleanly")


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_fixer_s_note_wrapped_in_a_code_fence_is_never_applied(netns, model, home, fkb, vendor):
    """The fixer writes its note inside a ```markdown fence, though the prompt says no
    fences, of a note without frontmatter (which may be one code block, so its fence is
    not taken off): before B41 it was applied so, committed and re-reviewed to PASS. Each
    attempt is the fixer's invalid output naming the fence, and nothing reaches the KB."""
    (fkb.root / NOTE).write_text(FIX_NOTE_BODY)
    subprocess.run(["git", "-C", str(fkb.root), "-c", "user.name=t", "-c",
                    "user.email=t@example.org", "commit", "-qam", "the KB"], check=True)  # fmt: skip
    given = fkb.read(NOTE)
    (fkb.root / "reviewq.toml").write_text(fix_profiles(model, "fixfence"))
    out = fix_sweep(netns, home, fkb.root, vendor)
    assert fkb.read(NOTE) == given and kb_changes(fkb.root) == ""
    assert git_log(fkb.root)[0] == "the KB"
    [esc] = out["escalations"]
    assert esc["reason"] == (
        "the fixer failed every attempt: the fixed note is wrapped in a code fence "
        "(```markdown … ```): the note's text alone is asked for"
    ), esc
    [fix] = fix_jobs(fkb.root)
    outcomes = rows(fkb.root, "SELECT outcome FROM attempts WHERE job_id = ?", fix["id"])
    assert [a["outcome"] for a in outcomes] == ["invalid-output"] * 3


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_fixer_s_note_with_frontmatter_wrapped_in_a_code_fence_is_applied_without_it(
    netns, model, home, fkb, vendor
):
    """The same fence around a note with frontmatter, which no note starts with: the
    note inside it is the fixer's, as the `openai` kind's answer so wrapped is taken. It
    was refused from a CLI, three attempts and an escalation, where the `openai` kind's
    was applied; it is applied, committed and re-reviewed."""
    (fkb.root / "reviewq.toml").write_text(fix_profiles(model, "fixfence"))
    out = fix_sweep(netns, home, fkb.root, vendor)
    assert out["escalations"] == [], out
    assert fkb.read(NOTE).endswith("---\n# Alpha\n\nAlpha body. done\n")
    assert "```" not in fkb.read(NOTE)
    assert [f["result"] for f in fix_jobs(fkb.root)] == ["applied"]
    assert git_log(fkb.root)[:2] == [f"reviewq fix: {NOTE} (prose/body-check)", NOTE]
    [acc] = rows(fkb.root, "SELECT decision FROM acceptance")
    assert acc["decision"] == "PASS"


def test_a_gemini_fixer_whose_cli_rewrites_the_note_s_escapes_has_nothing_applied(
    netns, model, home, fkb
):
    """Gemini CLI unescapes ``\\n``, ``\\"`` … in what write_file writes for a model it
    takes for neither Gemini 2 nor 3 (``gemini-flash-latest``, an alias Google serves):
    the code sample of a note its fixer gave back as it was, but for the finding, was
    applied with a line break in its string, committed as the fix and re-reviewed. The
    text the model gave is in Gemini's chat log: the note that differs is not applied."""
    sample = '    printf("a\\n");\n'
    (fkb.root / NOTE).write_text(FIX_NOTE_BODY + "\n" + sample)
    subprocess.run(["git", "-C", str(fkb.root), "-c", "user.name=t", "-c",
                    "user.email=t@example.org", "commit", "-qam", "the KB"], check=True)  # fmt: skip
    given = fkb.read(NOTE)
    toml = fix_profiles(model, "fix").replace(
        'model = "gemini-2.5-pro"', 'model = "gemini-flash-latest"'
    )
    (fkb.root / "reviewq.toml").write_text(toml)
    out = fix_sweep(netns, home, fkb.root, "gemini")
    assert fkb.read(NOTE) == given and git_log(fkb.root)[0] == "the KB"
    [esc] = out["escalations"]
    assert esc["reason"].startswith(
        "the fixer failed every attempt: Gemini CLI changed fixed-note.md as it wrote it"
    ), esc


def _claude_env(home: Path, model) -> dict[str, str]:  # noqa: ANN001 - the model fixture
    """The environment a bare Claude run against the tests' model server is given."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": model.url("review"),
        "ANTHROPIC_API_KEY": "sk-ant-scripted",
        "CLAUDE_CODE_MAX_RETRIES": "0",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


def _claude_forgets(monkeypatch, home: Path, folder: Path, root: Path) -> None:  # noqa: ANN001
    """A worker whose HOME is ``home`` forgets what Claude kept for an attempt run in
    ``root`` (the attempt ``folder`` itself, or the KB), its stream in folder/stdout.log."""
    from orchestrator.config import ReviewerProfile
    from workers.reviewers import for_profile
    from workers.reviewers.base import AttemptSpec

    monkeypatch.setenv("HOME", str(home))  # the worker's HOME, where forget looks
    profile = ReviewerProfile(name="claude", kind="claude", model="claude-sonnet-4-5")
    spec = AttemptSpec(
        "review", 7, 1, folder / "prompt.md", folder / "bundle-output.md", folder, folder,
        root, "claude-sonnet-4-5",
    )  # fmt: skip
    for_profile(profile).forget(spec)


def test_claude_s_projects_folder_of_an_attempt_deep_in_a_state_folder_is_forgotten(
    netns, model, home, tmp_path, monkeypatch
):
    """A worker without --kb runs Claude in the attempt folder and `forget` removes the
    projects/ folder Claude kept for it (S26). Claude names that folder by dashing its cwd,
    but past 200 characters it cuts the name and adds a hash of the path: a worker whose
    state folder lies deep (its attempt folder's path past ~150 characters) kept one a
    prompt, with the notes, for good, `forget` looking for the full dashed name."""
    from workers.attempt import attempt_folder

    state = tmp_path / "srv" / ("reviewq-worker-of-the-night-shift-" * 4) / "state"
    folder = attempt_folder(state, 7, 1, "2026-11-28T16:00:00.123456+00:00")
    folder.mkdir(parents=True)
    assert len(str(folder)) > 200
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)  # with the module's earlier tests' sessions
    projects = mine / ".claude" / "projects"
    before = {p.name for p in projects.iterdir()} if projects.is_dir() else set()
    env = _claude_env(mine, model)
    ran = subprocess.run(
        [*_in(netns), str(BIN["claude"]), "-p", "Say hello.", "--max-turns", "1",
         "--model", "claude-sonnet-4-5", "--output-format", "json"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    kept = {p.name for p in projects.iterdir()} - before if projects.is_dir() else set()
    assert len(kept) == 1, (kept, ran.stdout, ran.stderr)  # the session Claude kept there
    _claude_forgets(monkeypatch, mine, folder, folder)
    assert {p.name for p in projects.iterdir()} == before, "Claude's folder of it was left"


def test_claude_s_session_of_an_attempt_run_in_the_kb_is_forgotten_and_the_person_s_kept(
    netns, model, home, tmp_path, monkeypatch
):
    """A worker with --kb runs Claude in the KB, where Claude keeps every session in one
    projects/ folder, the person's own among them: `forget` left that folder alone, so
    each attempt's transcript (the prompt with its notes, every reply) stayed there, one
    file an attempt, for good. Only the attempt's own session goes now."""
    from workers.reviewers.claude import project_name

    kb, folder = tmp_path / "kb", tmp_path / "attempt"
    kb.mkdir()
    folder.mkdir()
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    env = _claude_env(mine, model)

    def session() -> subprocess.CompletedProcess:
        return subprocess.run(
            [*_in(netns), str(BIN["claude"]), "-p", "Say hello.", "--max-turns", "1",
             "--model", "claude-sonnet-4-5", "--output-format", "stream-json", "--verbose"],
            cwd=kb, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    session()  # the person's own, in their KB
    project = mine / ".claude" / "projects" / project_name(os.path.realpath(kb))
    persons = {p.name for p in project.iterdir()}
    assert any(n.endswith(".jsonl") for n in persons), persons
    ran = session()  # the attempt's
    (folder / "stdout.log").write_text(ran.stdout)
    assert {p.name for p in project.iterdir()} - persons, (ran.stdout, ran.stderr)
    _claude_forgets(monkeypatch, mine, folder, kb)
    assert {p.name for p in project.iterdir()} == persons, "the attempt's session was left"


@pytest.mark.parametrize(
    "flag", [["--continue"], ["-c"], ["--resume"], ["--session-id"]], ids=lambda f: f[0]
)
def test_a_claude_profile_may_not_name_the_session_its_attempts_run_in(
    flag, netns, model, home, tmp_path, monkeypatch, kb
):
    """With --kb, `forget` removes the session Claude's stream-json names (S31). Claude
    run with --continue (or --resume ID, --session-id ID) in the KB goes on with a session
    already there, the person's, under its own id: `forget` removed the person's
    transcript with the attempt's. A profile's args may not name the session, as they may
    not name the model."""
    from orchestrator.config import ConfigError, load_settings
    from workers.reviewers.claude import project_name

    if flag == ["--continue"]:  # what the real CLI does, shown once
        folder = tmp_path / "attempt"
        folder.mkdir()
        mine = tmp_path / "home"
        shutil.copytree(home, mine, symlinks=True)
        env = _claude_env(mine, model)

        def session(*more: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                [*_in(netns), str(BIN["claude"]), "-p", "Say hello.", "--max-turns", "1",
                 "--model", "claude-sonnet-4-5", "--output-format", "stream-json",
                 "--verbose", *more],
                cwd=kb.root, env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip

        session()  # the person's own, in their KB
        project = mine / ".claude" / "projects" / project_name(os.path.realpath(kb.root))
        persons = {p.name for p in project.iterdir()}
        ran = session(*flag)  # the attempt's, under a profile with --continue
        (folder / "stdout.log").write_text(ran.stdout)
        _claude_forgets(monkeypatch, mine, folder, kb.root)
        gone = persons - {p.name for p in project.iterdir()}
        assert gone, (persons, ran.stdout[:2000], ran.stderr)  # the person's, with forget
    ids = (
        ["0b3e8f2a-5a4f-4c43-9d6e-2f6d3f8a9c10"] if flag[0] in ("--resume", "--session-id") else []
    )
    kb.write(
        "reviewq.toml",
        f'[reviewers.x]\nkind = "claude"\nmodel = "m"\nargs = {json.dumps([*flag, *ids])}\n',
    )
    with pytest.raises(ConfigError, match=rf"'{flag[0]}' is a flag that names the session"):
        load_settings(kb.root)


def test_codex_loads_its_config_for_a_job_folder_named_with_an_emoji(tmp_path: Path) -> None:
    """The ``-c projects=`` that untrusts the job folder: a folder named beyond U+FFFF
    was a JSON surrogate pair, which Codex's TOML refused, so it loaded no config."""
    from workers.reviewers.codex import _untrusted

    job = tmp_path / "kb \U0001f600 é" / "job"
    job.mkdir(parents=True)
    home = tmp_path / "codex-home"
    home.mkdir()
    env = {**os.environ, "CODEX_HOME": str(home), "OPENAI_API_KEY": "x"}
    args = _untrusted(job)
    ran = subprocess.run(
        [
            str(BIN["codex"]),
            "exec",
            "--skip-git-repo-check",
            *args,
            "-c",
            'model_provider="none"',
            "hi",
        ],
        cwd=job,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = ran.stdout + ran.stderr
    assert "Error loading config" not in said, said


def _with_machine_files(tmp_path: Path, folder: str, files: dict[str, str]) -> list[str]:
    """The command prefix that runs a command with ``files`` (name: text) in the machine's
    /etc/``folder``: /etc is an overlay of the test's own, in a mount namespace of the
    command's, so nothing is left in the machine's."""
    upper, work = tmp_path / "etc-upper", tmp_path / "etc-work"
    (upper / folder).mkdir(parents=True)
    work.mkdir()
    for name, text in files.items():
        (upper / folder / name).parent.mkdir(parents=True, exist_ok=True)
        (upper / folder / name).write_text(text)
    overlay = f"lowerdir=/etc,upperdir={upper},workdir={work}"
    script = f'mount --make-rprivate / && mount -t overlay overlay -o {overlay} /etc && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, "sh"]


def _run_with_machine_files(
    prefix: list[str], netns, mine: Path, vkb, *args: str
) -> subprocess.CompletedProcess:
    """``reviewq *args`` in ``prefix``'s /etc (:func:`_with_machine_files`)."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(mine),
        "TMPDIR": str(mine / "tmp"),
        "LANG": "C.UTF-8",
    }
    return subprocess.run(
        [*prefix, *_in(netns), str(REVIEWQ), "--root", str(vkb.root), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _run_job_with_machine_codex_files(
    netns, mine: Path, vkb, tmp_path: Path, job_id: int, files: dict[str, str]
) -> subprocess.CompletedProcess:
    """``reviewq run-job`` of ``job_id`` with Codex, with ``files`` in the machine's
    /etc/codex for the run (:func:`_with_machine_files`)."""
    prefix = _with_machine_files(tmp_path, "codex", files)
    res = _run_with_machine_files(
        prefix, netns, mine, vkb, "run-job", str(job_id), "--reviewer", "codex"
    )
    assert not Path("/etc/codex").exists()
    return res


def _mcp_server(name: str, note: Path, *more: str) -> str:
    """A Codex config's MCP server ``name`` that writes a line into ``note`` as it starts."""
    return (
        f'[mcp_servers.{name}]\ncommand = "sh"\n'
        f'args = ["-c", "echo mcp >> {note}; sleep 30"]\n' + "".join(f"{m}\n" for m in more)
    )


@pytest.mark.parametrize("layer", ["config.toml", "managed_config.toml"])
def test_an_mcp_server_of_the_machine_s_codex_config_does_not_start_beside_a_review(
    netns, model, home, vkb, tmp_path, layer
):
    """Codex loads /etc/codex/config.toml (its system layer) under the person's, and
    managed_config.toml (the administrator's) above the command line's -c, key by key:
    reviewq turned off only the servers of the person's files, and one the machine's file
    named started beside the review and wrote into the KB. A managed server that leaves
    `enabled` unsaid is turned off by the same -c."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    note = vkb.root / "kb" / "notes" / "mcp.md"
    (vkb.root / "reviewq.toml").write_text(profiles(model, "review"))
    before = kb_files(vkb.root)
    job_id = make_job(netns, mine, vkb.root)
    files = {layer: _mcp_server("kb", note)}
    res = _run_job_with_machine_codex_files(netns, mine, vkb, tmp_path, job_id, files)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not note.exists(), note.read_text()
    assert kb_files(vkb.root) == before


MANAGED = "/etc/codex/managed_config.toml"
REQUIREMENTS = "/etc/codex/requirements.toml"


@pytest.mark.parametrize(
    ("files", "said"),
    [
        (
            {"managed_config.toml": "{server}enabled = true\n"},
            f"{MANAGED} forces on the MCP server 'kb'",
        ),
        (
            {"managed_config.toml": '[projects."{kb}"]\ntrust_level = "trusted"\n'},
            f"{MANAGED} trusts {{kb}}, so Codex would load {{kb}}/.codex/config.toml",
        ),
        (
            {"managed_config.toml": 'sandbox_mode = "read-only"\n'},
            f'{MANAGED} sets sandbox_mode = "read-only"',
        ),
        (
            {"requirements.toml": 'allowed_sandbox_modes = ["read-only"]\n'},
            f'{REQUIREMENTS} has allowed_sandbox_modes = ["read-only"] without "workspace-write"',
        ),
        (
            {"requirements.toml": 'allowed_approval_policies = ["on-request"]\n'},
            f'{REQUIREMENTS} has allowed_approval_policies = ["on-request"] without "never"',
        ),
        (
            {"managed_config.toml": "model_reasoning_effort = 5\n"},
            "Codex could not load its config: invalid type: integer `5`, expected a string "
            "in `model_reasoning_effort`",
        ),
        (
            {"managed_config.toml": "sandbox_mode = \n"},
            f"{MANAGED}: Codex cannot read it (",
        ),
        (
            {"requirements.toml": "allowed_sandbox_modes = [\n"},
            f"{REQUIREMENTS}: Codex cannot read it (",
        ),
    ],
    ids=[
        "forced-server",
        "trusted-kb",
        "managed-sandbox",
        "required-sandbox",
        "required-approval",
        "bad-managed-value",
        "bad-managed-toml",
        "bad-requirements-toml",
    ],
)
def test_a_machine_whose_managed_codex_layers_outrank_the_review_s_is_refused(
    netns, model, home, vkb, tmp_path, files, said
):
    """What the managed layer forces, no -c undoes: a server it turns on (`enabled =
    true`), and a KB it trusts (the KB's .codex/config.toml, with its MCP server, loads)
    each started beside the review and wrote into the KB; a sandbox mode or approval
    policy it or requirements.toml does not allow, Codex replaced (read-only: the review
    could write nothing) and said so only as an item of its --json. Each is now refused
    before Codex starts, in one line naming the file: a launch failure of the profile,
    the job queued again, nothing counted against the note."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    note = vkb.root / "kb" / "notes" / "mcp.md"
    kb = str(vkb.root.resolve())
    (vkb.root / ".codex").mkdir()
    (vkb.root / ".codex" / "config.toml").write_text(_mcp_server("kb", note))
    (vkb.root / "reviewq.toml").write_text(profiles(model, "review"))
    before = kb_files(vkb.root)
    job_id = make_job(netns, mine, vkb.root)
    files = {k: v.format(server=_mcp_server("kb", note), kb=kb) for k, v in files.items()}
    res = _run_job_with_machine_codex_files(netns, mine, vkb, tmp_path, job_id, files)
    assert not note.exists(), note.read_text()
    assert kb_files(vkb.root) == before
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "launch-failure", (a, res.stdout + res.stderr)
    [reason] = json.loads(a["reasons"])
    assert said.format(kb=kb) in reason, reason
    [job] = rows(vkb.root, "SELECT status FROM review_jobs")
    assert job["status"] == "queued", job


def _run_job_with_codex_in_its_own_etc(
    netns, model, home, vkb, tmp_path: Path, files: dict[str, str], scenario: str = "review"
) -> subprocess.CompletedProcess:
    """``reviewq run-job`` of a new job with Codex, ``files`` in the machine's /etc/codex
    of the CLI's own mount namespace only (through a wrapper ``executable``): what reviewq
    does not read before the start, Codex's --json says."""
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    wrapper = tmp_path / "codex-in-its-own-etc"
    prefix = _with_machine_files(tmp_path, "codex", files)
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.join([*prefix, str(BIN["codex"])])} "$@"\n')
    wrapper.chmod(0o755)
    config = profiles(model, scenario).replace(
        f'executable = "{BIN["codex"]}"', f'executable = "{wrapper}"'
    )
    (vkb.root / "reviewq.toml").write_text(config)
    job_id = make_job(netns, mine, vkb.root)
    res = reviewq(netns, mine, vkb.root, "run-job", str(job_id), "--reviewer", "codex")
    assert not Path("/etc/codex").exists()
    return res


def test_a_requirement_for_a_setting_the_review_does_not_give_is_no_failure(
    netns, model, home, vkb, tmp_path
):
    """A requirement that only takes away what the review never uses (web search off)
    makes Codex replace its default `web_search_mode` in the same words as the review's
    sandbox ("… is disallowed by requirements; falling back to required value …"): a
    review that wrote no bundle on such a machine was a reviewer failure of the profile's
    settings, the job queued again for ever, though the run was the one reviewq set up
    and the missing bundle the review's own."""
    files = {"requirements.toml": 'allowed_web_search_modes = ["disabled"]\n'}
    res = _run_job_with_codex_in_its_own_etc(netns, model, home, vkb, tmp_path, files, "idle")
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "no-output", (a, res.stdout + res.stderr)


def test_a_setting_codex_s_requirements_replaced_is_the_machine_s_failure(
    netns, model, home, vkb, tmp_path
):
    """Requirements reviewq does not read (a ChatGPT workspace's, here a requirements.toml
    only the CLI's own mount namespace holds) made Codex replace the review's
    workspace-write sandbox by read-only, said only as an error item of its --json: the
    review wrote no output and the job failed as a no-output, the machine's setting
    counted against the note. Codex's words make it a reviewer failure of the profile's
    settings, the job queued again."""
    files = {"requirements.toml": 'allowed_sandbox_modes = ["read-only"]\n'}
    res = _run_job_with_codex_in_its_own_etc(netns, model, home, vkb, tmp_path, files)
    [a] = rows(vkb.root, "SELECT outcome, reasons FROM attempts")
    assert a["outcome"] == "reviewer-failure", (a, res.stdout + res.stderr)
    [reason] = json.loads(a["reasons"])
    assert reason == (
        "config: Codex's requirements replaced a setting of the review: invalid value for "
        "`sandbox_mode`: `WorkspaceWrite` is not in the allowed set [ReadOnly] "
        "(set by /etc/codex/requirements.toml)"
    ), reason
    [job] = rows(vkb.root, "SELECT status FROM review_jobs")
    assert job["status"] == "queued", job


def _attempts_kept(home: Path) -> dict[str, list[str]]:
    """What the CLIs keep in ``home`` of a worker's attempt folders (each named for one,
    or holding rows of its run): Claude's projects/ folders, Gemini's tmp/ and history/
    folders and projects.json entries, Codex's rollouts and its SQLite rows of a thread."""
    from .test_two_hosts_vendor import codex_rows

    def named(folder: Path) -> list[str]:
        return (
            sorted(p.name for p in folder.iterdir() if "attempt" in p.name)
            if folder.is_dir()
            else []
        )

    kept = {
        "claude projects": named(home / ".claude/projects"),
        "gemini tmp": named(home / ".gemini/tmp"),
        "gemini history": named(home / ".gemini/history"),
        "codex rollouts": sorted(p.name for p in (home / ".codex").rglob("rollout-*.jsonl")),
        "codex rows": sorted(codex_rows(home / ".codex")) if (home / ".codex").is_dir() else [],
    }
    registry = home / ".gemini/projects.json"
    projects = json.loads(registry.read_text())["projects"] if registry.exists() else {}
    kept["gemini projects.json"] = sorted(p for p in projects if "attempts" in p)
    return {k: v for k, v in kept.items() if v}


@pytest.mark.parametrize("how", ["killed", "stopped"])
@pytest.mark.parametrize("vendor", VENDORS)
def test_a_worker_killed_or_stopped_mid_attempt_forgets_the_cli_s_state_of_it(
    netns, model, vkb, tmp_path, vendor, how
):
    """A worker SIGKILLed while its CLI waits on the model never sent the outcome, so never
    forgot what the CLI kept in its HOME for the attempt (Claude's session, Gemini's chat
    log and projects.json entry, Codex's rollout and rows): the worker started again on
    that --state reaped the agent and removed the attempt folder, and the CLI's copy of
    the prompt, with its notes, stayed for good. A worker stopped (SIGTERM) reaped its
    agent and exited before the attempt's thread got to forget it: the same."""
    from .test_partitions import Events

    (vkb.root / "reviewq.toml").write_text(
        profiles(model, "hung", timeout="300s", connect_timeout="200s").replace(
            "[queue]\n", "[queue]\npoll_seconds = 0.05\n", 1
        )
    )
    mine = tmp_path / "home"
    (mine / "tmp").mkdir(parents=True)
    (mine / ".gemini").mkdir()
    (mine / ".gemini/settings.json").write_text(
        json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}},
                    "general": {"maxAttempts": 1}})
    )  # fmt: skip
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(mine),
        "TMPDIR": str(mine / "tmp"),
        "LANG": "C.UTF-8",
        "REVIEWQ_LOG_FORMAT": "json",
    }
    state = vkb.root / ".reviewq/worker"  # the worker's own folder, beside its control

    def worker() -> tuple[subprocess.Popen, Events]:
        proc = subprocess.Popen(
            [*_in(netns), str(REVIEWQ), "--root", str(vkb.root), "worker", "--workers", "1"],
            env=env, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        return proc, Events(proc.stderr)

    hung = len([r for r in model.requests("hung") if r.get("api") == API[vendor]])
    first, events = worker()
    sweep = second = None
    try:
        events.wait("worker.started", 60)
        sweep = subprocess.Popen(
            [*_in(netns), str(REVIEWQ), "--root", str(vkb.root), "sweep", "--reviewer", vendor,
             "--all-gates", "--workers", "0", "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        # The model's log is the one sign that the CLI sent its prompt (its state written).
        while len([r for r in model.requests("hung") if r.get("api") == API[vendor]]) == hung:
            assert time.monotonic() < deadline, "the CLI never asked the model"
            assert first.poll() is None and sweep.poll() is None
            time.sleep(0.1)
        # (Claude keeps no session since S37; this shows what a worker killed before
        # it left, and that the next start leaves nothing of it.)
        assert vendor == "claude" or _attempts_kept(mine), "the CLI kept nothing of it"
        if how == "stopped":  # SIGTERM: it ends its agent and queues the task again
            first.terminate()
            first.wait(timeout=60)
        else:
            first.kill()
            first.wait(timeout=10)
            # The sweep stopped too: no control to send the attempt again to the next worker.
            sweep.terminate()
            sweep.wait(timeout=60)
            second, events = worker()
            events.wait("worker.started", 60)  # after its reap of the dead one's agent
        kept = _attempts_kept(mine)
    finally:
        for proc in (first, second, sweep):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        for pid in leftovers(vkb.root):  # the hung agent of the second worker, if any
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)
    if how == "killed":  # a stopped worker keeps the folder for the run queued again
        assert not (state / "attempts").is_dir() or list((state / "attempts").iterdir()) == []
    assert kept == {}, f"{vendor} kept the {how} worker's attempt in its HOME: {kept}"


def _run_once(netns, profile, mine: Path, folder: Path, root: Path):  # noqa: ANN001, ANN202
    """The adapter's command for an attempt in ``folder`` (its agent's root ``root``), run
    for real as a worker runs it, with ``mine`` as HOME, its stdout in the folder's
    stdout.log: the adapter and the attempt's spec, to read what it left."""
    from workers.reviewers import for_profile
    from workers.reviewers.base import AttemptSpec

    folder.mkdir(exist_ok=True)  # one a worker made for the attempt, or a new one
    (folder / "prompt.md").write_text("Review nothing; write PASS.\n")
    spec = AttemptSpec(
        "review", 7, 1, folder / "prompt.md", folder / "bundle-output.md", folder, folder,
        root, profile.model,
    )  # fmt: skip
    adapter = for_profile(profile)
    cmd = adapter.command(spec)
    env = {"PATH": os.environ["PATH"], "HOME": str(mine), "TMPDIR": str(mine / "tmp"), **cmd.env}
    with (folder / "stdout.log").open("wb") as out:
        subprocess.run(
            [*_in(netns), *cmd.argv], cwd=cmd.cwd, env=env, stdout=out,
            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip
    return adapter, spec


def test_codex_s_rollout_of_a_run_whose_stdout_passed_8_mib_is_forgotten(
    netns, model, tmp_path, monkeypatch, kb
):
    """Codex names its thread once, in its --json's first event; the logs are read from
    their last 8 MiB (where the result is), so a run that printed more (a chatty agent, a
    long command's output) had no thread: its rollout and rows stayed, and its token
    counts from the rollout were lost. Run for real, its log then grown past 8 MiB."""
    from orchestrator.config import load_settings

    from .test_two_hosts_vendor import codex_rows

    kb.write("reviewq.toml", profiles(model, "review"))
    profile = load_settings(kb.root).reviewers["codex"]
    mine = tmp_path / "home"
    (mine / "tmp").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(mine))  # the worker's HOME, where forget looks
    folder = tmp_path / "attempt"
    adapter, spec = _run_once(netns, profile, mine, folder, folder)
    assert [p.name for p in mine.rglob("rollout-*.jsonl")], "codex kept no rollout"
    told = adapter.telemetry(spec)
    assert told.session_id and told.input_tokens, told
    # The same run, its log past 8 MiB: a command's long output, as Codex reports it.
    lines = (folder / "stdout.log").read_bytes().splitlines(keepends=True)
    chatty = json.dumps(
        {"type": "item.completed", "item": {"id": "item_x", "type": "command_execution",
         "aggregated_output": "x" * (1 << 20), "status": "completed"}}
    ).encode() + b"\n"  # fmt: skip
    (folder / "stdout.log").write_bytes(lines[0] + chatty * 9 + b"".join(lines[1:]))
    big = adapter.telemetry(spec)
    assert (big.session_id, big.input_tokens) == (told.session_id, told.input_tokens), big
    adapter.forget(spec)
    assert [p.name for p in mine.rglob("rollout-*.jsonl")] == [], "the rollout was left"
    assert codex_rows(mine / ".codex") == {}


def test_a_stopping_worker_leaves_the_run_a_worker_beside_it_made_anew_in_its_folder(
    netns, model, tmp_path, monkeypatch, kb
):
    """A stopping worker queues its attempt again, then forgets what the CLI kept of it
    (its reap, or the attempt's thread): a worker sharing its --state takes the run up
    at once and makes the kept folder anew, forgetting the first run's state itself, and
    the late forget then read the new run's stdout.log and removed that run's live
    rollout and rows. Staged as it happens, with the real Codex for both runs."""
    from orchestrator.config import load_settings
    from workers import tasks
    from workers.attempt import attempt_folder

    from .test_two_hosts_vendor import codex_rows

    kb.write("reviewq.toml", profiles(model, "review"))
    settings = load_settings(kb.root)
    profile = settings.reviewers["codex"]
    mine = tmp_path / "home"
    (mine / "tmp").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(mine))  # the workers' HOME, where forget looks
    state = tmp_path / "worker"  # the --state both workers share
    monkeypatch.setattr(tasks, "_place", tasks.WorkerPlace(settings, state, None))
    folder = attempt_folder(state, 7, 1)
    folder.parent.mkdir(parents=True)
    folder.mkdir()
    claim = tasks._hold(folder)  # the stopping worker's attempt, its agent run and killed
    try:
        _run_once(netns, profile, mine, folder, folder)
        first = {p.name for p in mine.rglob("rollout-*.jsonl")}
        assert first, "codex kept no rollout"
        # The worker beside it takes the run queued again: the folder made anew, the first
        # run's state forgotten, the second run's agent started.
        msg = {"task": "review", "job_id": 7, "attempt": 1, "pairs": [],
               "output_name": "bundle-output.md", "prompt": "Review nothing; write PASS.\n"}  # fmt: skip
        tasks._prepare(folder, msg, profile, None)
        assert not {p.name for p in mine.rglob("rollout-*.jsonl")}
        _run_once(netns, profile, mine, folder, folder)
        second = {p.name for p in mine.rglob("rollout-*.jsonl")}
        rows = codex_rows(mine / ".codex")
        assert second and rows, "the second run kept nothing"
        tasks.forget_stopped(folder)  # the stopping worker's reap, its agent ended
    finally:
        tasks._let_go(folder, claim)
    assert {p.name for p in mine.rglob("rollout-*.jsonl")} == second
    assert codex_rows(mine / ".codex") == rows


def test_gemini_s_entry_is_forgotten_past_a_lock_a_killed_gemini_left(
    netns, model, home, tmp_path, monkeypatch, kb
):
    """Gemini rewrites projects.json under proper-lockfile's lock, a folder it touches
    while it holds it; one killed meanwhile (a worker's stop, a deadline) leaves it, and
    the next Gemini takes it over once it is 10 s old. `forget` waited for it to go, then
    left the entry: every forget on that HOME waited 10 s (a starting worker, the
    attempts' lock held, once a folder left) until a Gemini ran again."""
    from orchestrator.config import load_settings

    kb.write("reviewq.toml", profiles(model, "review"))
    profile = load_settings(kb.root).reviewers["gemini"]
    mine = tmp_path / "home"
    shutil.copytree(home, mine, symlinks=True)
    monkeypatch.setenv("HOME", str(mine))  # the worker's HOME, where forget looks
    adapter, spec = _run_once(netns, profile, mine, tmp_path / "attempt", tmp_path / "attempt")
    registry = mine / ".gemini" / "projects.json"
    folder = str(spec.job_dir.resolve())
    assert folder in json.loads(registry.read_text())["projects"], "gemini kept no entry"
    lock = Path(f"{registry}.lock")
    lock.mkdir()  # as a Gemini killed holding it leaves it: touched last a minute ago
    os.utime(lock, (time.time() - 60, time.time() - 60))
    adapter.forget(spec)
    assert folder not in json.loads(registry.read_text())["projects"]
    assert not lock.exists()


# A worker's forget of one Gemini entry: "ready" once imported, then begun when told by
# a line on its stdin.
_UNREGISTER = (
    "import sys; from pathlib import Path; from workers.reviewers.gemini import _unregister; "
    "print('ready', flush=True); sys.stdin.readline(); "
    "_unregister(Path(sys.argv[1]), sys.argv[2], sys.argv[3])"
)


def _held_forget(registry: Path, entry: str, inject: str, said: Path) -> subprocess.Popen:
    """A worker's forget of ``entry`` (:data:`_UNREGISTER`) under strace, which delays the
    calls ``inject`` names and prints the calls a lock is taken and a file written with
    to ``said`` (a FIFO the test reads as they are made, or a file)."""
    return subprocess.Popen(
        ["strace", "-qq", "-e", "signal=none", "-o", str(said),
         "-e", "trace=mkdir,rmdir,%%stat,rename,renameat,renameat2", "-e", f"inject={inject}",
         sys.executable, "-c", _UNREGISTER, str(registry), entry, entry],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, start_new_session=True,
    )  # fmt: skip


def test_two_workers_taking_a_killed_gemini_s_lock_over_at_once_lose_no_removal(tmp_path):
    """S39's take-over looked at the lock's age, then removed it: a worker that looked
    while it was a killed Gemini's and removed it a moment later removed the lock another
    worker had taken over meanwhile and held, and both rewrote projects.json at once, the
    first one's removal lost (its entry left for good). Two real workers on one HOME, the
    first held by strace between its look and its removal, the second between its read of
    the file and its write."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    registry = tmp_path / ".gemini" / "projects.json"
    registry.parent.mkdir()
    registry.write_text(json.dumps({"projects": {"/one": "/one", "/two": "/two"}}))
    lock = Path(f"{registry}.lock")
    lock.mkdir()  # as a Gemini killed holding it leaves it: touched last a minute ago
    os.utime(lock, (time.time() - 60, time.time() - 60))
    renames = "rename,renameat,renameat2"
    os.mkfifo(tmp_path / "first.trace")
    first = _held_forget(
        registry, "/one", "rmdir:delay_enter=3000000:when=1", tmp_path / "first.trace"
    )  # µs
    second = _held_forget(
        registry, "/two", f"{renames}:delay_enter=6000000", tmp_path / "second.trace"
    )
    try:
        # The second imported first: its take-over then falls in the first's held moment.
        assert second.stdout.readline() == "ready\n"
        first.stdin.write("go\n")
        first.stdin.flush()
        with open(tmp_path / "first.trace") as trace:  # strace's end: open while it runs
            for line in trace:  # until its look at the lock, its removal then held
                if "stat" in line and str(lock) in line and "= 0" in line:
                    break
            else:
                pytest.fail(f"the first worker never looked at the lock: {first.communicate()}")
            second.stdin.write("go\n")
            second.stdin.flush()
            for _ in trace:  # what else it says, to its end
                pass
        out = [p.communicate(timeout=60)[1] for p in (first, second)]
        if "ptrace" in out[0]:
            pytest.skip(f"strace cannot trace here: {out[0].strip()}")
    finally:
        for p in (first, second):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert [first.returncode, second.returncode] == [0, 0], out
    assert json.loads(registry.read_text())["projects"] == {}, out
    assert not lock.exists(), out


def test_claude_run_as_a_reviewer_keeps_no_session_and_its_counts(
    netns, model, tmp_path, monkeypatch, kb
):
    """Claude Code 2.1.332 wrote every run's transcript (the prompt with its notes, every
    reply) into projects/ of its cwd, the KB's folder with --kb, the person's sessions
    beside it; only `forget`, after the outcome, removed it, so a worker killed first
    kept it. Run as reviewq runs it, it keeps none, and its stream-json still has the
    session and the counts."""
    from orchestrator.config import load_settings
    from workers.reviewers.claude import project_name

    kb.write("reviewq.toml", profiles(model, "review"))
    profile = load_settings(kb.root).reviewers["claude"]
    mine = tmp_path / "home"
    (mine / "tmp").mkdir(parents=True)
    project = mine / ".claude" / "projects" / project_name(os.path.realpath(kb.root))
    subprocess.run(  # the person's own session in their KB
        [*_in(netns), str(BIN["claude"]), "-p", "Say hello.", "--max-turns", "1",
         "--model", "claude-sonnet-4-5", "--output-format", "json"],
        cwd=kb.root, env=_claude_env(mine, model), capture_output=True, timeout=120,
    )  # fmt: skip
    persons = sorted(p.name for p in project.iterdir())
    assert persons, "the person's session was not kept"
    adapter, spec = _run_once(netns, profile, mine, tmp_path / "attempt", kb.root)
    told = adapter.telemetry(spec)
    assert told.session_id and told.input_tokens and told.num_turns, told
    assert adapter.answered(spec)
    # Nothing of the run among the person's sessions, nor anywhere else under projects/.
    assert sorted(p.name for p in project.iterdir()) == persons
    assert [p.name for p in project.parent.iterdir()] == [project.name]
