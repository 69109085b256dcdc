"""The vendor reviewer kinds (CONTRACT §8): claude, codex and gemini against fake CLIs in
tests/agents/bin, and openai against a small HTTP server, each through the real attempt
lifecycle (workers.attempt.run_attempt via ``run_job``) on a job made with the CLI."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.config import ReviewerProfile
from orchestrator.state.store import Store, parse_timestamp
from orchestrator.state.workspace import Workspace
from workers.foreground import ForegroundResult, run_job
from workers.reviewers import ADAPTERS, AttemptSpec, for_profile
from workers.reviewers.gemini import policy_text

from .conftest import ready_within

BIN = Path(__file__).parent / "agents" / "bin"
NOTE = "kb/notes/alpha.md"
KEY = "sk-test-secret-4f9c"

PROFILES = """
[reviewers.claude]
kind = "claude"
model = "claude-sonnet-4-5"
partition = "fake"
max_turns = 7
timeout = "30s"
args = ["--append-system-prompt", "Be terse."]

[reviewers.codex]
kind = "codex"
model = "gpt-5-codex"
partition = "fake"
timeout = "30s"
args = ["-c", "model_reasoning_effort=high"]

[reviewers.gemini]
kind = "gemini"
model = "gemini-2.5-pro"
partition = "fake"
timeout = "30s"
args = ["--debug"]
"""


@pytest.fixture
def kb2(kb, monkeypatch, tmp_path):
    kb.gate("prose/body-check", ["body"])
    kb.gate("prose/style-check", ["body", "title"])
    kb.note("alpha", body="# Alpha\n\nAlpha body.\n")
    kb.write("reviewq.toml", PROFILES)
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_ARGV_LOG", str(tmp_path / "argv.json"))
    monkeypatch.delenv("FAKE_MODE", raising=False)
    return kb


def make_job(run_cli) -> int:
    """One job of two pairs (one note, one lens), made as a person would: select | create-jobs."""
    sel = run_cli("select", "--all-gates", "--model", "fake", "--note", NOTE, "--json")
    assert sel.exit_code == 0, sel.stderr
    made = run_cli("create-jobs", "--input", "-", "--grouping", "note", "--json", input=sel.stdout)
    assert made.exit_code == 0, made.stderr
    jobs = made.json()["jobs"]
    assert len(jobs) == 1 and len(jobs[0]["pairs"]) == 2
    return jobs[0]["review_job_id"]


def run(kb, job_id: int, reviewer: str) -> ForegroundResult:
    ws = Workspace.open(kb.root)
    try:
        return run_job(ws, job_id, reviewer)
    finally:
        ws.close()


def parts_of(kb, job_id: int) -> list[int]:
    """The one-pair jobs a burned-out job was split into."""
    with Store.open(kb.state) as store:
        sql = "SELECT id FROM review_jobs WHERE parent_job_id = ? ORDER BY id"
        return [r[0] for r in store.conn.execute(sql, (job_id,))]


def argv_of(tmp_path: Path) -> list[str]:
    return json.loads((tmp_path / "argv.json").read_text())


def attempts(kb, job_id: int) -> list[dict]:
    with Store.open(kb.state) as s:
        rows = s.conn.execute("SELECT * FROM attempts WHERE job_id = ?", (job_id,)).fetchall()
        return [dict(r) for r in rows]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# --- the three vendor CLIs -----------------------------------------------------------------

EXPECTED_TELEMETRY = {
    "claude": {
        "num_turns": 3,
        "input_tokens": 3100,  # input + cache creation + cache reads
        "output_tokens": 250,
        "cost_usd": 0.012,
        "session_id": "9c1d6a3e-fake-claude-session",
        "cached_input_tokens": 2000,
    },
    "codex": {
        "num_turns": 3,  # command, file change, message: reasoning is not a step
        "input_tokens": 5000,
        "output_tokens": 600,
        "session_id": "0199-fake-codex-thread",
        "cached_input_tokens": 4000,
    },
    "gemini": {
        "num_turns": 4,
        "input_tokens": 1200,
        "output_tokens": 350,  # candidates + thoughts
        "session_id": "fake-gemini-session",
        "cached_input_tokens": 1000,
    },
}


@pytest.mark.parametrize("kind", ["claude", "codex", "gemini"])
def test_vendor_cli_reviews_a_job(kb2, run_cli, tmp_path, kind):
    job_id = make_job(run_cli)
    res = run(kb2, job_id, kind)
    assert res.outcome.classification == "output", res.outcome.reasons
    assert res.outcome.exit_code == 0
    assert res.outcome.telemetry == EXPECTED_TELEMETRY[kind]
    assert res.ok and [p["decision"] for p in res.finalized.pairs] == ["PASS", "PASS"]
    [row] = attempts(kb2, job_id)
    assert (row["outcome"], row["num_turns"]) == (
        "finalized",
        EXPECTED_TELEMETRY[kind]["num_turns"],
    )
    argv = argv_of(tmp_path)
    profile = Workspace.open(kb2.root).settings.reviewer(kind)
    assert argv[-len(profile.args) :] == list(profile.args)  # profile args come last
    assert KEY not in json.dumps(argv)


def test_claude_flags(kb2, run_cli, tmp_path):
    job_id = make_job(run_cli)
    assert run(kb2, job_id, "claude").ok
    argv = argv_of(tmp_path)
    job_dir = next(kb2.state.rglob("MANIFEST.json")).parent.resolve()
    root = kb2.root.resolve()
    assert argv[0] == "-p" and "prompt.md" in argv[1]  # the instruction, not the prompt
    assert flag(argv, "--output-format") == "stream-json" and "--verbose" in argv
    assert flag(argv, "--model") == "claude-sonnet-4-5"
    assert flag(argv, "--max-turns") == "7"
    assert flag(argv, "--permission-mode") == "dontAsk"
    assert flag(argv, "--tools") == "Read,Glob,Grep,Edit,Write"
    assert flag(argv, "--add-dir") == str(job_dir)
    i = argv.index("--allowedTools")
    assert argv[i + 1 : i + 4] == [
        f"Read(/{root}/**)",
        f"Read(/{job_dir}/**)",
        f"Edit(/{job_dir}/**)",
    ]
    assert argv[i + 1].startswith("Read(//")  # "//" = an absolute path in a rule
    assert "Bash" in flag(argv, "--disallowedTools")
    assert "--safe-mode" in argv  # no installed plugin's language server or hooks


def test_codex_flags(kb2, run_cli, tmp_path, monkeypatch):
    # A person's MCP servers: Codex starts each outside its sandbox unless it is named.
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        '[mcp_servers.kb]\ncommand = "sh"\n[mcp_servers."my-db"]\nurl = "http://x"\n'
    )
    monkeypatch.setenv("CODEX_HOME", str(home))
    job_id = make_job(run_cli)
    assert run(kb2, job_id, "codex").ok
    argv = argv_of(tmp_path)
    job_dir = next(kb2.state.rglob("MANIFEST.json")).parent.resolve()
    assert argv[:2] == ["exec", "--json"]
    assert flag(argv, "--model") == "gpt-5-codex"
    assert flag(argv, "--sandbox") == "workspace-write"
    assert flag(argv, "--cd") == str(job_dir)  # the only writable workspace
    assert "--skip-git-repo-check" in argv
    configs = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert "sandbox_workspace_write.network_access=false" in configs
    assert "features.hooks=false" in configs  # a person's trusted hooks run unsandboxed
    assert "features.plugins=false" in configs  # a plugin's MCP servers run unsandboxed
    assert "--ignore-rules" in argv  # a command a person's rules allow runs unsandboxed
    assert 'mcp_servers={"kb"={enabled=false},"my-db"={enabled=false}}' in configs
    # No project is trusted (the KB's .codex/config.toml names MCP servers of its own).
    [projects] = [c for c in configs if c.startswith("projects=")]
    assert projects.startswith(f'projects={{"{job_dir}"={{trust_level="untrusted"}},')
    assert f'"{kb2.root.resolve()}"={{trust_level="untrusted"}}' in projects
    assert projects.endswith(',"/"={trust_level="untrusted"}}')
    assert "--dangerously-bypass-approvals-and-sandbox" not in argv


@pytest.mark.parametrize(
    "args",
    [("-p", "work"), ("-pwork",), ("--profile", "work"), ("--profile=work",)],
    ids=["-p NAME", "-pNAME", "--profile NAME", "--profile=NAME"],
)
def test_codex_turns_off_the_mcp_servers_of_the_profile_file_its_args_pick(tmp_path, args):
    from workers.reviewers import for_profile

    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text('[mcp_servers."kb.tools"]\ncommand = "sh"\n')
    (home / "work.config.toml").write_text('[mcp_servers.db]\ncommand = "sh"\n')
    (home / "other.config.toml").write_text('[mcp_servers.other]\ncommand = "sh"\n')
    profile = ReviewerProfile(
        name="x", kind="codex", model="m", args=args, env={"CODEX_HOME": str(home)}
    )
    assert for_profile(profile)._mcp_servers() == ["kb.tools", "db"]


def test_gemini_flags_and_policy(kb2, run_cli, tmp_path):
    job_id = make_job(run_cli)
    assert run(kb2, job_id, "gemini").ok
    argv = argv_of(tmp_path)
    job_dir = next(kb2.state.rglob("MANIFEST.json")).parent.resolve()
    assert flag(argv, "--output-format") == "json"
    assert flag(argv, "--model") == "gemini-2.5-pro"
    assert flag(argv, "--approval-mode") == "default"
    assert flag(argv, "--include-directories") == str(kb2.root.resolve())
    assert "prompt.md" in flag(argv, "-p")
    assert "--yolo" not in argv and "yolo" not in argv
    rules = tomllib.loads(Path(flag(argv, "--policy")).read_text())["rule"]
    allow = next(r for r in rules if r["decision"] == "allow")
    assert set(allow["toolName"]) == {"write_file", "replace"}
    shell = next(r for r in rules if "run_shell_command" in r["toolName"])
    assert shell["decision"] == "deny" and "argsPattern" not in shell
    cmd = for_profile(ReviewerProfile(name="g", kind="gemini", model="m")).command(
        AttemptSpec(
            "review", 1, 1, job_dir / "p", job_dir / "o", job_dir, job_dir / "a", kb2.root, "m"
        )
    )
    # The job folder is the workspace (the KB's .gitignore would hide the prompt from
    # read_file), and the folder is trusted for this run only.
    assert cmd.cwd == job_dir and cmd.env["GEMINI_CLI_TRUST_WORKSPACE"] == "true"
    # ... and its settings, which outrank the person's, turn hooks off.
    settings = json.loads((job_dir / ".gemini" / "settings.json").read_text())
    assert settings == {
        "hooksConfig": {"enabled": False},
        "tools": {"discoveryCommand": ""},
        "model": {"maxSessionTurns": -1},
    }
    # No MCP server of the person's starts (none has that name), nor an extension.
    assert flag(argv, "--allowed-mcp-server-names") == "reviewq-allows-no-mcp-server"
    assert flag(argv, "--extensions") == "none"


def _gemini_args(path: str) -> str:
    # Gemini's policy engine matches the tool arguments as compact JSON text.
    return json.dumps({"content": "x", "file_path": path}, separators=(",", ":"))


def _gemini_accepts(pattern: str) -> bool:
    """Gemini CLI 0.61's isSafeRegExp (policy/utils.ts): it drops a rule whose pattern has
    a group followed by a quantifier, or is over 2048 characters long."""
    return len(pattern) <= 2048 and not re.search(r"\([^)]*[*+?{].*\)[*+?{]", pattern)


def _gemini_decides(rules: list[dict], tool: str, path: str) -> str:
    """The engine's choice: the highest-priority rule that matches; headless, a call no
    rule allows needs a person's approval and is refused."""
    for r in sorted(rules, key=lambda r: -r["priority"]):
        if tool in r["toolName"] and (
            "argsPattern" not in r or re.search(r["argsPattern"], _gemini_args(path))
        ):
            return r["decision"]
    return "deny"


def test_a_relative_gemini_executable_runs_from_the_kb_root_as_doctor_finds_it(
    kb2, run_cli, tmp_path
):
    """doctor finds `executable = "tools/gemini"` under the KB root, where agents start;
    Gemini starts in its job folder, where no tools/gemini is: each attempt failed to start."""
    (kb2.root / "tools").mkdir()
    (kb2.root / "tools" / "gemini").symlink_to(BIN / "gemini")
    kb2.write(
        "reviewq.toml",
        PROFILES.replace('kind = "gemini"\n', 'kind = "gemini"\nexecutable = "tools/gemini"\n'),
    )
    assert "ok: reviewer gemini (gemini)" in run_cli("doctor").stdout
    res = run(kb2, make_job(run_cli), "gemini")
    assert res.outcome.classification == "output", res.outcome.reasons


@pytest.mark.parametrize("weird", ["plain", "with space", "dots.and-dash", "quote'd (x)+"])
def test_gemini_policy_allows_only_the_job_folder(tmp_path, weird):
    job_dir = tmp_path / weird / ".reviewq" / "jobs" / "job-1"
    spec = AttemptSpec(
        "review", 1, 1, job_dir / "p.md", job_dir / "o.md", job_dir, job_dir / "a-1", tmp_path, "m"
    )
    rules = tomllib.loads(policy_text(spec))["rule"]
    for r in rules:
        assert "argsPattern" not in r or _gemini_accepts(r["argsPattern"]), r
    for tool in ("write_file", "replace"):
        assert _gemini_decides(rules, tool, f"{job_dir}/attempt-1/bundle-output.md") == "allow"
        for refused in (
            f"{tmp_path}/kb/notes/alpha.md",
            f"{job_dir}/../../../kb/notes/alpha.md",
            f"{job_dir}/attempt-1/../../job-2/x.md",
            f"{job_dir}/..",
            f"{job_dir}-other/x.md",
            f'{job_dir}/a"/../../x.md',
            f"{job_dir}/a\\..\\..\\x.md",
            "attempt-1/bundle-output.md",  # relative: resolved against the workspace
        ):
            assert _gemini_decides(rules, tool, refused) == "deny", refused
    assert _gemini_decides(rules, "run_shell_command", f"{job_dir}/x") == "deny"


def test_the_old_gemini_policy_was_dropped_by_the_engine():
    # The pattern reviewq wrote before 0.61 was tried: a group followed by "*".
    assert not _gemini_accepts('"file_path":"\\/job/(?:(?!\\.\\.)[^"\\\\])*"')


def test_claude_turn_budget_without_output_is_burned_out(kb2, run_cli, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "maxturns")
    res = run(kb2, make_job(run_cli), "claude")
    assert res.outcome.classification == "burned-out"
    assert res.outcome.telemetry["num_turns"] == 7
    assert res.outcome.telemetry["error_subtype"] == "error_max_turns"


def test_claude_cut_off_stdout_falls_back_to_the_telemetry_file(kb2, run_cli, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "garbage")
    res = run(kb2, make_job(run_cli), "claude")
    assert res.outcome.classification == "output"
    assert res.outcome.telemetry == {"num_turns": 2}


@pytest.mark.parametrize("kind", ["claude", "codex", "gemini"])
def test_failing_login_is_a_launch_failure(kb2, run_cli, monkeypatch, kind):
    monkeypatch.setenv("FAKE_MODE", "crash")
    job_id = make_job(run_cli)
    res = run(kb2, job_id, kind)
    assert res.outcome.classification == "launch-failure"
    assert res.outcome.exit_code == 1


def test_a_cli_too_old_for_a_flag_is_a_launch_failure_naming_its_version(
    kb2, run_cli, monkeypatch, tmp_path
):
    """Claude Code 2.0.0 refuses --permission-mode dontAsk: the reason quoted its line,
    and nothing said the CLI was older than any reviewq runs, nor which to install."""
    bin_ = tmp_path / "old-bin"
    bin_.mkdir()
    (bin_ / "claude").write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo "2.0.0 (Claude Code)"; exit 0; }\n'
        "echo \"error: option '--permission-mode <mode>' argument 'dontAsk' is invalid.\" >&2\n"
        "exit 1\n"
    )
    (bin_ / "claude").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    res = run(kb2, make_job(run_cli), "claude")
    assert res.outcome.classification == "launch-failure"
    [reason] = res.outcome.reasons
    assert "argument 'dontAsk' is invalid" in reason, reason
    assert "claude 2.0.0 is older than the versions reviewq is known to work with" in reason
    assert "npm install -g @anthropic-ai/claude-code@" in reason


@pytest.mark.parametrize("kind", ["claude", "codex", "gemini"])
def test_missing_binary_is_a_launch_failure(kb2, run_cli, monkeypatch, tmp_path, kind):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    job_id = make_job(run_cli)
    monkeypatch.setenv("PATH", str(empty))
    res = run(kb2, job_id, kind)
    assert res.outcome.classification == "launch-failure"
    assert res.outcome.exit_code is None
    assert f"could not start {kind!r}" in res.outcome.reasons[0]
    with Store.open(kb2.state) as s:  # not the job's fault: it is queued again
        status = s.conn.execute("SELECT status FROM review_jobs WHERE id = ?", (job_id,))
        assert status.fetchone()[0] == "queued"


def test_executable_and_doctor_names(tmp_path):
    for kind in ("claude", "codex", "gemini"):
        plain = for_profile(ReviewerProfile(name=kind, kind=kind, model="m"))
        assert plain.executables() == [kind]
        custom = for_profile(ReviewerProfile(name=kind, kind=kind, model="m", executable="/x/y"))
        assert custom.executables() == ["/x/y"]
        spec = AttemptSpec("review", 1, 1, *(tmp_path / n for n in "poja"), tmp_path, "m")
        assert custom.command(spec).argv[0] == "/x/y"
    assert {"claude", "codex", "gemini", "openai"} <= set(ADAPTERS)


BAD_STDOUT = [
    b"",
    b"\xff\xfe\x00garbage",
    b'{"type":"result","num_turns":',
    b"[1, 2, 3]",
    b'"just a string"',
    b'{"type":"result","num_turns":"3","usage":"x","total_cost_usd":NaN,"subtype":5}',
    b'{"stats":{"models":{"m":{"api":[],"tokens":{"prompt":true}}}},"error":"boom"}',
    b'{"type":"turn.completed","usage":null}\n{"type":"item.completed","item":"x"}\nnot json\n',
    b'{"stats":{"models":[1]},"session_id":7}',
]


@pytest.mark.parametrize("kind", ["claude", "codex", "gemini", "openai"])
@pytest.mark.parametrize("stdout", BAD_STDOUT)
def test_bad_stdout_never_raises(tmp_path, kind, stdout):
    spec = AttemptSpec(
        "review", 1, 1, tmp_path / "p", tmp_path / "o", tmp_path, tmp_path, tmp_path, "m"
    )
    spec.stdout_path.write_bytes(stdout)
    profile = ReviewerProfile(name=kind, kind=kind, model="m", base_url="http://x")
    t = for_profile(profile).telemetry(spec)
    for value in (t.num_turns, t.input_tokens, t.output_tokens):
        assert value is None or (isinstance(value, int) and not isinstance(value, bool))
    assert t.cost_usd is None or isinstance(t.cost_usd, float)
    json.dumps(t.to_json())


# --- openai: a real HTTP server ------------------------------------------------------------


class FakeServer:
    """An OpenAI-compatible /v1/chat/completions that reviews every pair of the prompt
    with PASS (from the prompt's sentinel lines) and records each request."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.status = 200
        self.headers: dict[str, str] = {}  # sent with every answer
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body}
                )
                if server.status != 200:
                    # A careless server that echoes the request's headers in its error.
                    data = f"boom: {self.headers.get('Authorization')}".encode()
                    self.send_response(server.status)
                elif not self.path.endswith("/v1/chat/completions"):
                    data = b"not found"
                    self.send_response(404)
                else:
                    data = json.dumps(server.answer(body)).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in server.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, body: dict) -> dict:
        return _review(body)


def _review(body: dict) -> dict:
    """A chat completion that reviews every pair of the request's prompt with PASS."""
    return {
        "id": "chatcmpl-fake-1",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": _bundle_for(body["messages"][0]["content"]),
                },
            }
        ],
        "usage": {"prompt_tokens": 321, "completion_tokens": 45, "total_tokens": 366},
    }


@pytest.fixture
def server() -> Iterator[FakeServer]:
    srv = FakeServer()
    thread = threading.Thread(target=srv.httpd.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def openai_profile(
    kb,
    base_url: str,
    args: str = '["temperature=0", "max_tokens=2048"]',
    extra: str = "",
    timeout: str = "30s",
) -> None:
    kb.write(
        "reviewq.toml",
        PROFILES + f'\n[reviewers.local]\nkind = "openai"\nmodel = "qwen3:8b"\npartition = "fake"\n'
        f'base_url = "{base_url}"\napi_key_env = "REVIEWQ_TEST_KEY"\ntimeout = "{timeout}"\n'
        f"args = {args}\n{extra}",
    )


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_openai_reviews_a_job(kb2, run_cli, monkeypatch, server, suffix):
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    openai_profile(kb2, server.url + suffix)
    job_id = make_job(run_cli)
    res = run(kb2, job_id, "local")
    assert res.outcome.classification == "output", res.outcome.reasons
    assert res.outcome.telemetry == {
        "num_turns": 1,
        "input_tokens": 321,
        "output_tokens": 45,
        "session_id": "chatcmpl-fake-1",
    }
    assert res.ok and [p["decision"] for p in res.finalized.pairs] == ["PASS", "PASS"]
    [req] = server.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == f"Bearer {KEY}"
    body = req["body"]
    assert body["model"] == "qwen3:8b" and body["stream"] is False
    assert (body["temperature"], body["max_tokens"]) == (0, 2048)  # profile args
    prompt = next(kb2.state.rglob("attempt-1/prompt.md")).read_text()  # the attempt's own
    assert body["messages"] == [{"role": "user", "content": prompt}]


def test_openai_answer_in_parts_or_without_content_is_read_as_the_model_s(
    kb2, run_cli, monkeypatch, server
):
    """A message whose content is a list of parts (Mistral's reasoning models) was read as
    an empty answer and counted against the job; one with no content at all (mlx-lm, a
    model stopped inside its reasoning) was taken for a broken server and paused the
    profile. The first is its text parts, the thinking left out; the second is empty, and
    stopped at max_tokens, the job's: burned out (E60)."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    openai_profile(kb2, server.url)
    server.answer = lambda body: {
        "choices": [
            {"message": {"role": "assistant", "reasoning": "Hmm."}, "finish_reason": "length"}
        ],
        "usage": {"prompt_tokens": 900, "completion_tokens": 2048},
    }
    job_id = make_job(run_cli)
    res = run(kb2, job_id, "local")
    assert res.outcome.classification == "burned-out", res.outcome.reasons
    assert "answered with an empty message (finish_reason length)" in res.outcome.reasons[0]
    plain = FakeServer.answer

    def in_parts(body: dict) -> dict:
        answer = plain(server, body)
        text = answer["choices"][0]["message"]["content"]
        draft = {"type": "text", "text": "=== PAIR REVIEW START: a draft ==="}
        answer["choices"][0]["message"]["content"] = [
            {"type": "thinking", "thinking": [draft]},
            {"type": "text", "text": text},
        ]
        return answer

    server.answer = in_parts
    for part in parts_of(kb2, job_id):  # the first job was split
        res = run(kb2, part, "local")
        assert res.ok, (res.outcome.reasons, res.finalized)
        assert [p["decision"] for p in res.finalized.pairs] == ["PASS"]


def test_openai_prompt_cache_reads_are_priced_as_such(kb2, run_cli, monkeypatch, server):
    """OpenAI and vLLM count cached prompt tokens in ``prompt_tokens_details``; left out,
    every token was priced in full, and a sweep's budget stopped it early."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    prices = "price_input_per_mtok = 1.0\nprice_output_per_mtok = 2.0\n"
    openai_profile(kb2, server.url, extra=prices + "price_cached_input_per_mtok = 0.1\n")
    plain = FakeServer.answer

    def cached(body: dict) -> dict:
        usage = {"prompt_tokens": 1000, "completion_tokens": 100}
        return plain(server, body) | {
            "usage": usage | {"prompt_tokens_details": {"cached_tokens": 800}}
        }

    server.answer = cached
    res = run(kb2, make_job(run_cli), "local")
    assert res.ok, res.outcome.reasons
    t = res.outcome.telemetry
    assert (t["input_tokens"], t["cached_input_tokens"], t["output_tokens"]) == (1000, 800, 100)
    assert t["cost_usd"] == pytest.approx((200 * 1.0 + 800 * 0.1 + 100 * 2.0) / 1e6)


def test_openai_key_never_reaches_argv_or_command_env(kb2, monkeypatch, tmp_path):
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    profile = ReviewerProfile(
        name="local", kind="openai", model="m", base_url="http://x", api_key_env="REVIEWQ_TEST_KEY"
    )
    spec = AttemptSpec("review", 1, 1, *(tmp_path / n for n in "poja"), tmp_path, "m")
    cmd = for_profile(profile).command(spec)
    assert KEY not in json.dumps([cmd.argv, cmd.env])
    assert cmd.env["REVIEWQ_OPENAI_API_KEY_ENV"] == "REVIEWQ_TEST_KEY"
    assert cmd.argv[1:4] == ["-P", "-m", "workers.openai_agent"] and cmd.cwd == tmp_path


def test_openai_works_without_a_key(kb2, run_cli, monkeypatch, server):
    monkeypatch.delenv("REVIEWQ_TEST_KEY", raising=False)
    openai_profile(kb2, server.url, args="[]")
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.classification == "output", res.outcome.reasons
    assert "Authorization" not in server.requests[0]["headers"]


def _stderr(kb) -> str:
    [path] = list(kb.state.rglob("stderr.log"))
    return path.read_text()


def test_openai_server_error_exits_nonzero_without_the_key(kb2, run_cli, monkeypatch, server):
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    server.status = 500
    openai_profile(kb2, server.url)
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.exit_code == 1
    # The server's failure, however long it took to say so: never counted against the job.
    assert res.outcome.classification == "reviewer-failure"
    assert res.outcome.reasons[0].startswith("server: HTTP 500 from ")
    stderr = _stderr(kb2)
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert stderr.startswith("openai reviewer: HTTP 500 from ")
    assert KEY not in stderr and KEY not in json.dumps(res.outcome.reasons)
    assert "Bearer ***" in stderr  # the server echoed it; the agent blanked it


def test_openai_honours_the_retry_after_its_endpoint_asks_for(kb2, run_cli, monkeypatch, server):
    """A 429 or 503 with ``Retry-After``: the job came back after launch_backoff_seconds
    and met the same refusal, and once paused the profile stayed paused for pause_seconds
    whatever the server had said. The job's wait and the pause's length are what the
    server asked for (seconds or an HTTP date), within pause_seconds."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    queue = (
        "\n[queue]\nlaunch_failures_before_pause = 2\nlaunch_backoff_seconds = 1\n"
        "pause_seconds = 900\n"
    )
    openai_profile(kb2, server.url, extra=queue)
    job_id = make_job(run_cli)
    server.status, server.headers = 429, {"Retry-After": "120"}

    def waits(sql: str) -> float:
        with Store.open(kb2.state) as store:
            (at,) = store.conn.execute(sql).fetchone()
        return (parse_timestamp(at) - datetime.now(UTC)).total_seconds()

    res = run(kb2, job_id, "local")
    assert res.outcome.classification == "reviewer-failure", res.outcome.reasons
    assert res.outcome.telemetry["retry_after_s"] == 120
    assert 110 < waits("SELECT not_before FROM review_jobs") <= 120  # not 1 s
    server.status = 503
    server.headers = {
        "Retry-After": format_datetime(datetime.now(UTC) + timedelta(seconds=60), usegmt=True)
    }
    res = run(kb2, job_id, "local")
    assert res.paused_until, res.outcome.reasons
    assert 50 < waits("SELECT paused_until FROM reviewer_state") <= 61  # not 900 s
    # The header as RFC 9110 gives it, and what is not one.
    from workers.openai_agent import retry_after

    assert retry_after("86400") == 86400
    assert retry_after("soon") is None and retry_after("-5") is None
    assert retry_after("Thu, 01 Jan 1970 00:00:00 GMT") == 0


def test_a_retry_after_that_is_no_number_of_seconds_is_no_crash(kb2, run_cli, monkeypatch, server):
    """``str.isdigit`` is true of "²" (and "١٢"), which ``float`` refuses: a 429 whose
    Retry-After was "²" raised a ValueError in the agent, said "server: failed: ValueError",
    the rate limit and the server's words lost. A number too large for a float came back
    infinite, and the control took it for no header at all (a wait of
    launch_backoff_seconds, not pause_seconds)."""
    from workers.openai_agent import retry_after

    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    openai_profile(kb2, server.url)
    job_id = make_job(run_cli)
    server.status, server.headers = 429, {"Retry-After": "\u00b2"}
    res = run(kb2, job_id, "local")
    assert res.outcome.reasons[0].startswith("rate-limit: HTTP 429"), res.outcome.reasons
    assert res.outcome.telemetry.get("retry_after_s") is None
    assert retry_after("\u0661\u0662") is None  # RFC 9110's DIGIT is ASCII
    assert 86400 <= retry_after("9" * 400) < 2**63  # a long wait, a number the control keeps


def test_openai_answer_that_is_about_the_request_is_a_counted_attempt_however_fast(
    kb2, run_cli, monkeypatch, server
):
    """The server answered (a 400 about the request, or an empty message cut at
    max_tokens): quickly it was a launch failure, paused the profile and never failed the
    job; slowly, a counted attempt. One answer now gets one classification, its usage kept
    (the cut one burned out, as a job too big for one answer: E60)."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    openai_profile(kb2, server.url)
    server.status = 400
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.classification == "no-output", res.outcome.reasons
    assert "HTTP 400 from " in res.outcome.reasons[0]
    assert res.outcome.telemetry["num_turns"] == 1
    # Behind a gateway whose path says "network": the URL is no word of the server's.
    openai_profile(kb2, server.url + "/network-gw")
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.classification == "no-output", res.outcome.reasons
    openai_profile(kb2, server.url)
    server.status = 200
    server.answer = lambda body: {
        "choices": [{"index": 0, "message": {"content": None}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 8192},
    }
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.classification == "burned-out", res.outcome.reasons
    assert "answered with an empty message (finish_reason length)" in res.outcome.reasons[0]
    t = res.outcome.telemetry
    assert (t["num_turns"], t["input_tokens"], t["output_tokens"]) == (1, 900, 8192)


def test_openai_error_is_judged_by_the_servers_words_not_the_url(tmp_path):
    """A base_url with "network" (or "quota", "/login") in it made every error that kind."""
    spec = AttemptSpec("review", 1, 1, *(tmp_path / n for n in "poja"), tmp_path, "m")
    spec.attempt_dir.mkdir()
    report = {
        "error": "HTTP 400 from http://h/network/v1/chat/completions: context length exceeded",
        "status": 400,
        "failure": None,
        "detail": "context length exceeded",
        "num_turns": 1,
    }
    spec.telemetry_path.write_text(json.dumps(report))
    profile = ReviewerProfile(name="local", kind="openai", model="m", base_url="http://h")
    assert for_profile(profile).telemetry(spec).failure is None


def _command_profile(kb, tmp_path, script: str, timeout: str = "30s") -> None:
    agent = tmp_path / "agent.sh"
    agent.write_text("#!/bin/sh\n" + script)
    agent.chmod(0o755)
    kb.write(
        "reviewq.toml",
        PROFILES + f'\n[reviewers.cmd]\nkind = "command"\ncommand = ["{agent}"]\n'
        f'partition = "fake"\ntimeout = "{timeout}"\n',
    )


@pytest.mark.parametrize(
    ("script", "classification", "reason"),
    [
        # A wrapper's `exec > $OUT` before a request that was refused: the empty file was
        # judged as output, invalid, and the outage failed the job and escalated it.
        (
            'exec > "$REVIEWQ_OUTPUT_PATH"\necho "curl: (7) Connection refused" >&2\nexit 7\n',
            "launch-failure",
            "exited 7 after",
        ),
        # E64 made an output of a byte-order mark alone, or of NULs, "empty": the same
        # file left by a wrapper that writes the mark first (PowerShell's Out-File) or
        # sets the file's size ahead (truncate) was judged as output, invalid, the job's.
        (
            "printf '\\357\\273\\277' > \"$REVIEWQ_OUTPUT_PATH\"\n"
            'echo "curl: (7) Connection refused" >&2\nexit 7\n',
            "launch-failure",
            "exited 7 after",
        ),
        (
            'truncate -s 4096 "$REVIEWQ_OUTPUT_PATH"\n'
            'echo "curl: (7) Connection refused" >&2\nexit 7\n',
            "launch-failure",
            "exited 7 after",
        ),
        # An agent that says in its telemetry that no model answered: the reviewer's
        # failure, however long it took (past 15 s it was a counted no-output).
        (
            'echo \'{"num_turns": 0, "failure": "rate-limit", "error": "HTTP 429"}\' '
            '> "$REVIEWQ_TELEMETRY_PATH"\nexit 1\n',
            "reviewer-failure",
            "rate-limit: HTTP 429",
        ),
        # A failure that is not one of those kinds counts; its stderr now says why.
        (
            'echo \'{"num_turns": 2}\' > "$REVIEWQ_TELEMETRY_PATH"\n'
            "echo 'model said: prompt too long' >&2\nexit 3\n",
            "no-output",
            "exited 3 without writing bundle-output.md: model said: prompt too long",
        ),
    ],
    ids=["empty-file", "bom-file", "nul-file", "telemetry-failure", "stderr-in-reason"],
)
def test_a_command_agent_that_failed_is_classified_by_what_it_said(
    kb2, run_cli, tmp_path, script, classification, reason
):
    _command_profile(kb2, tmp_path, script)
    res = run(kb2, make_job(run_cli), "cmd")
    assert res.outcome.classification == classification, res.outcome.reasons
    assert res.outcome.reasons[0].startswith(reason) or reason in res.outcome.reasons[0]


def test_a_reviewer_failure_in_run_job_is_in_the_jobs_log(kb2, run_cli, tmp_path):
    """`reviewq run-job` put the job back on the queue without a word in the log: `reviewq
    logs --job N` showed only its creation, while a failed one logs job.failed."""
    _command_profile(
        kb2,
        tmp_path,
        'echo \'{"num_turns": 0, "failure": "rate-limit", "error": "HTTP 429: slow down"}\' '
        '> "$REVIEWQ_TELEMETRY_PATH"\nexit 1\n',
    )
    job_id = make_job(run_cli)
    res = run_cli("run-job", str(job_id), "--reviewer", "cmd")
    assert "not the job's fault)" in res.stderr, res.stderr
    logged = run_cli("logs", "--job", str(job_id), "--json")
    events = [json.loads(line) for line in logged.stdout.splitlines()]
    [failed] = [e for e in events if e["event"] == "attempt.reviewer_failed"]
    assert failed["reasons"] == ["rate-limit: HTTP 429: slow down"], failed
    assert (failed["attempt"], failed["reviewer"]) == (1, "cmd"), failed


@pytest.mark.parametrize(
    ("script", "timeout"),
    [
        # A streaming CLI (`llm ... > "$REVIEWQ_OUTPUT_PATH"`) whose connection broke.
        ('echo "Error: connection reset by peer" >&2\nexit 1\n', "30s"),
        ("sleep 30\n", "2s"),  # stopped at its deadline mid-answer
    ],
    ids=["failed", "deadline"],
)
def test_a_fixer_that_did_not_end_cleanly_leaves_the_note_whole(
    kb2, run_cli, tmp_path, script, timeout
):
    """Its output was applied: the note was replaced by the lines the fixer had written
    when it failed, the rest of the note lost."""
    from .test_cycles_integration import queue_fix

    original = kb2.read(NOTE)
    head = original[: original.index("Alpha body.")]  # frontmatter and heading: it parses
    _command_profile(
        kb2, tmp_path, f"printf '%s' '{head}' > \"$REVIEWQ_OUTPUT_PATH\"\n" + script, timeout
    )
    kb2.accept("fake", [(NOTE, "prose/body-check")], decision="FAIL")
    ws = Workspace.open(kb2.root)
    fix = queue_fix(ws.kb, ws.store, ws.state_dir, NOTE, fixer="cmd")
    ws.close()
    res = run(kb2, fix, "cmd")
    assert res.outcome.classification != "output", res.outcome.reasons
    assert "may be cut short" in res.outcome.reasons[-1]
    assert kb2.read(NOTE) == original


def test_openai_unreachable_server(kb2, run_cli, monkeypatch, refused_port):
    port = refused_port
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    # (A base_url with USER:PASSWORD@ is refused when the settings load.)
    openai_profile(kb2, f"http://127.0.0.1:{port}")
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.exit_code == 1 and res.outcome.classification == "reviewer-failure"
    stderr = _stderr(kb2)
    assert stderr.startswith(f"openai reviewer: cannot reach http://127.0.0.1:{port}/v1/")
    assert "Traceback" not in stderr and KEY not in stderr
    assert KEY not in json.dumps(res.outcome.reasons)


def test_an_openai_profile_paused_for_its_endpoint_is_not_said_to_have_a_cli(
    kb2, monkeypatch, refused_port
):
    """An ``openai`` profile paused because its endpoint was out of reach read "its CLI
    reported a failure that is not the job's" in status, the report, doctor and job N:
    it has no CLI, and the words sent the person looking for one."""
    from .conftest import reviewq_process
    from .test_queue_integration import FAST_QUEUE

    port = refused_port
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    queue = FAST_QUEUE.replace("[queue]\n", "[queue]\nlaunch_failures_before_pause = 1\n")
    openai_profile(kb2, f"http://127.0.0.1:{port}", extra=queue)
    res = reviewq_process("--root", str(kb2.root), "sweep", "--reviewer", "local", timeout=120)
    assert res.returncode == 1 and "wait on a paused reviewer" in res.stderr, res.stderr
    status = reviewq_process("--root", str(kb2.root), "status").stdout
    (line,) = [x for x in status.splitlines() if "wait for reviewer local, paused" in x]
    assert "CLI" not in line, line
    # The endpoint said once, with the host: "its endpoint failed in a way that is not the
    # job's on HOST: the reviewer's endpoint could not be reached: …" said it twice.
    assert (
        f"{socket.gethostname()}, the reviewer's endpoint could not be reached: cannot reach"
        in line
    ), line
    assert line.count("endpoint") == 1, line
    assert f"cannot reach http://127.0.0.1:{port}/v1/chat/completions" in line, line


def test_openai_connection_check_goes_where_the_request_goes(
    kb2, run_cli, monkeypatch, server, refused_port
):
    """no_proxy=host:port sends the request straight to the endpoint (urllib matches the
    host and the port), but the check before it matched the host alone, tried the proxy
    and reported the endpoint out of reach: the profile paused for a proxy never used."""
    dead = refused_port  # a proxy nobody listens on
    port = server.url.rsplit(":", 1)[1]
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{dead}")
    # Another port of the same host goes through the proxy: that is the one checked.
    monkeypatch.setenv("no_proxy", "127.0.0.1:1")
    openai_profile(kb2, server.url)
    job_id = make_job(run_cli)
    res = run(kb2, job_id, "local")
    assert res.outcome.classification == "reviewer-failure", res.outcome.reasons
    assert f"cannot reach http://127.0.0.1:{dead}: " in res.outcome.reasons[0]
    monkeypatch.setenv("no_proxy", f"example.org,127.0.0.1:{port}")
    res = run(kb2, job_id, "local")  # queued again: the proxy's failure, not the job's
    assert res.outcome.classification == "output", res.outcome.reasons


@pytest.mark.parametrize(
    ("status", "body", "failure"),
    [
        (504, "upstream timed out", "server"),
        (429, "slow down", "rate-limit"),
        (401, "bad key", "auth"),
        (403, '{"error": {"message": "Project does not have access to model m"}}', "auth"),
        (529, '{"error": {"type": "overloaded_error", "message": "Overloaded"}}', "server"),
        (503, '{"error": {"message": "The engine is currently overloaded"}}', "server"),
        (None, "did not answer with a chat completion", "server"),
    ],
)
def test_openai_says_why_no_model_answered_however_long_it_took(tmp_path, status, body, failure):
    """The agent's account of an HTTP error in the telemetry file makes the attempt the
    reviewer's failure: past the 15-s launch window it was "no-output" before, counted
    against the job and escalated."""
    spec = AttemptSpec("review", 1, 1, *(tmp_path / n for n in "poja"), tmp_path, "m")
    spec.attempt_dir.mkdir()
    error = f"HTTP {status} from http://h/v1/chat/completions: {body}" if status else body
    report = {"error": error, "status": status, "failure": None if status else "server"}
    spec.telemetry_path.write_text(json.dumps(report))
    profile = ReviewerProfile(name="local", kind="openai", model="m", base_url="http://h")
    t = for_profile(profile).telemetry(spec)
    assert (t.failure, t.error) == (failure, error)


def test_openai_endpoint_that_takes_no_connection_is_unreachable_after_connect_timeout(
    kb2, run_cli, monkeypatch
):
    """An address that drops the connection's packets (here a listener whose backlog is
    full) was waited on until the deadline and taken for a job too big ("burned-out"),
    which splits the job and escalates its pairs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    waiting: list[socket.socket] = []
    try:
        for _ in range(64):  # fill the accept queue until a connect is left unanswered
            c = socket.socket()
            c.setblocking(False)
            waiting.append(c)
            c.connect_ex(("127.0.0.1", port))
            if not ready_within(c, 0.2, select.POLLOUT):
                break  # its SYN was dropped: the agent's will be too
        else:
            pytest.skip("this kernel answered every connection to a full backlog")
        monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
        openai_profile(kb2, f"http://127.0.0.1:{port}", extra='connect_timeout = "1s"\n')
        res = run(kb2, make_job(run_cli), "local")
    finally:
        for c in waiting:
            c.close()
        listener.close()
    assert res.outcome.classification == "reviewer-failure", res.outcome.reasons
    assert res.outcome.reasons[0].startswith("unreachable: cannot reach http://127.0.0.1:")
    assert "within 1 s: timed out" in res.outcome.reasons[0]
    assert res.outcome.duration_s < 20


@contextlib.contextmanager
def _slow_endpoint(
    model_list: str, writes_for: float | None = None, serial: bool = False
) -> Iterator[str]:
    """An endpoint that takes the request and answers it (every pair PASS) after
    ``writes_for`` seconds, the time its model writes, or never. Its model list (a GET)
    ``answers``; ``answers once``, then is held (a server that hung with the request in
    flight); ``answers slowly once busy`` (the first look at once, the next in 0.2 s, as
    a loaded machine schedules the server's process); ``waits for the answer``
    (llama-cpp-python's /v1/models takes the lock its completion holds); or ``closes`` the
    connection at once. ``serial``: one request at a
    time (http.server.HTTPServer, as mlx_lm.server was): a look waits behind the answer."""
    released, answered = threading.Event(), threading.Event()
    looks = 0

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if released.wait(writes_for):  # None: until released
                return  # the test is over: nothing to say
            self._send(json.dumps(_review(body)).encode())
            answered.set()

        def do_GET(self) -> None:  # noqa: N802
            nonlocal looks
            looks += 1
            if model_list == "closes":
                self.close_connection = True
                return
            if model_list == "answers once" and looks > 1:
                released.wait()
                return
            if model_list == "answers slowly once busy" and looks > 1:
                released.wait(0.2)
            if model_list == "waits for the answer":
                answered.wait()
            self._send(b'{"data":[]}')

        def _send(self, data: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = (HTTPServer if serial else ThreadingHTTPServer)(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    # Looks whose agent has gone are answered into closed connections: no traceback.
    httpd.handle_error = lambda *args: None  # type: ignore[method-assign]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        released.set()
        answered.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_openai_endpoint_that_takes_the_request_and_hangs_is_an_outage_not_the_job_s(
    kb2, run_cli, monkeypatch
):
    """A server that took the request and then answered nothing, its model list neither,
    was waited on until the deadline and taken for a job too big for its time: the job
    split and its parts' attempts counted, a night of them escalated for a hung server.
    It is the server's failure, said before the deadline."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    with _slow_endpoint("answers once") as url:
        openai_profile(kb2, url, extra='connect_timeout = "1s"\n')
        job_id = make_job(run_cli)
        res = run(kb2, job_id, "local")
    assert res.outcome.classification == "reviewer-failure", res.outcome.reasons
    assert res.outcome.reasons[0].startswith(
        f"server: {url}/v1/chat/completions took the request, then stopped answering: "
        f"no HTTP answer from {url}/v1/models within 1 s: timed out"
    ), res.outcome.reasons
    assert parts_of(kb2, job_id) == []


def test_openai_endpoint_still_answering_past_the_deadline_burns_the_job_out(
    kb2, run_cli, monkeypatch
):
    """A server that answers its model list while the answer is awaited is busy with the
    job: the deadline stays the job's (burned-out, the job split), not the server's."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    with _slow_endpoint("answers") as url:
        openai_profile(kb2, url, extra='connect_timeout = "2s"\n', timeout="7s")
        job_id = make_job(run_cli)
        res = run(kb2, job_id, "local")
    assert res.outcome.classification == "burned-out", res.outcome.reasons
    assert len(parts_of(kb2, job_id)) == 2


@pytest.mark.parametrize(
    ("model_list", "serial"),
    [("answers", True), ("waits for the answer", False), ("closes", False)],
    ids=["serial-server", "model-list-waits-for-the-model", "model-list-closes"],
)
def test_openai_endpoint_whose_model_list_waits_while_it_writes_is_busy_not_hung(
    kb2, run_cli, monkeypatch, model_list, serial
):
    """E74 called a server hung when two looks at its model list found no HTTP answer: one
    that answers a request at a time (http.server's HTTPServer), or whose list waits for
    the model (llama-cpp-python), or that closes a GET it does not serve, never answers a
    look while it writes, so every job longer than two looks was a reviewer-failure that
    paused the profile, and its retry the same. Silence is a hang only of a server seen
    to answer a look while the request was in flight."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    with _slow_endpoint(model_list, writes_for=5, serial=serial) as url:
        openai_profile(kb2, url, extra='connect_timeout = "0.5s"\n')
        job_id = make_job(run_cli)
        res = run(kb2, job_id, "local")
    assert res.outcome.classification == "output", res.outcome.reasons


def test_openai_connect_timeout_for_a_tcp_handshake_does_not_call_a_busy_server_hung(
    kb2, run_cli, monkeypatch
):
    """E74 waited for a look's HTTP answer no longer than ``connect_timeout``, sized for a
    TCP connection (the kernel's work): at 0.05 s a busy server whose process answered its
    model list in 0.2 s was hung after its first look, and asked it 20 times a second."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    with _slow_endpoint("answers slowly once busy", writes_for=3) as url:
        openai_profile(kb2, url, extra='connect_timeout = "0.05s"\n')
        job_id = make_job(run_cli)
        res = run(kb2, job_id, "local")
    assert res.outcome.classification == "output", res.outcome.reasons


# --- errors before the agent starts ----------------------------------------------------------


def test_an_unknown_placeholder_is_refused_when_the_config_loads(tmp_path, run_cli, kb):
    from orchestrator.config import ConfigError, load_settings

    kb.write("reviewq.toml", '[reviewers.x]\nkind = "command"\ncommand = "echo {prompt_pth}"\n')
    with pytest.raises(ConfigError, match=r"\{prompt_pth\}") as err:
        load_settings(kb.root)
    assert "reviewers.x" in str(err.value) and "command" in str(err.value)
    res = run_cli("doctor")
    assert res.exit_code == 1 and "{prompt_pth}" in res.stderr
    assert "Traceback" not in res.stderr


def test_doctor_checks_the_first_word_of_a_command_string(run_cli, kb):
    kb.write("reviewq.toml", '[reviewers.x]\nkind = "command"\ncommand = "echo {prompt_path}"\n')
    res = run_cli("doctor")
    line = next(x for x in (res.stdout + res.stderr).splitlines() if "reviewer x" in x)
    assert "not on PATH" not in line, line
    kb.write(
        "reviewq.toml", '[reviewers.x]\nkind = "command"\ncommand = "no-such-agent-cli {job_id}"\n'
    )
    res = run_cli("doctor")
    line = next(x for x in (res.stdout + res.stderr).splitlines() if "reviewer x" in x)
    assert "no-such-agent-cli not on PATH" in line, line


def test_doctor_finds_a_relative_program_where_its_agents_start(run_cli, kb, tmp_path, monkeypatch):
    # An agent starts in ROOT (a sweep's, a `worker --kb ROOT`'s), so `tools/review.py`
    # runs from there; doctor run from elsewhere (cron, --root) called it "not on PATH".
    (kb.root / kb.write("tools/review.sh", "#!/bin/sh\nexit 0\n")).chmod(0o755)
    monkeypatch.chdir(tmp_path)
    kb.write(
        "reviewq.toml", '[reviewers.x]\nkind = "command"\ncommand = "tools/review.sh {job_id}"\n'
    )
    res = run_cli("doctor")
    line = next(x for x in (res.stdout + res.stderr).splitlines() if "reviewer x" in x)
    assert line == "ok: reviewer x (command)", line
    kb.write(
        "reviewq.toml", '[reviewers.x]\nkind = "command"\ncommand = "tools/nope.sh {job_id}"\n'
    )
    res = run_cli("doctor")
    line = next(x for x in (res.stdout + res.stderr).splitlines() if "reviewer x" in x)
    assert res.exit_code == 1
    assert "tools/nope.sh is no program under the KB root" in line, line


def test_doctor_says_what_is_wrong_with_a_program_given_by_its_path(run_cli, kb, tmp_path):
    """A program named by its path is looked for there alone: doctor said "not on PATH" of
    a script that was there but not executable (each launch "Permission denied"), of a
    folder, and of an absolute path to nothing, and a person went to mend PATH."""
    script = tmp_path / "review.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    kb.write("tools/plain.sh", "#!/bin/sh\nexit 0\n")
    (kb.root / "tools" / "dir.sh").mkdir()
    for program, said in (
        (script, f"{script} is not executable (chmod +x {script})"),
        (tmp_path, f"{tmp_path} is a folder, not a program"),
        (tmp_path / "gone.sh", f"{tmp_path / 'gone.sh'}: no such file"),
        ("tools/plain.sh", f"tools/plain.sh is not executable (chmod +x {kb.root}/tools/plain.sh)"),
        ("tools/dir.sh", "tools/dir.sh is a folder, not a program"),
        # No shell starts an agent: "is no program under the KB root" of a home's script.
        (
            "~/bin/review.sh",
            "~/bin/review.sh: ~ is not expanded (no shell starts it); give the full path",
        ),
    ):
        kb.write("reviewq.toml", f'[reviewers.x]\nkind = "command"\ncommand = ["{program}"]\n')
        res = run_cli("doctor")
        line = next(x for x in res.stdout.splitlines() if "reviewer x" in x)
        assert (res.exit_code, line) == (1, f"problem: reviewer x (command): {said}")
    kb.write(
        "reviewq.toml", f'[reviewers.c]\nkind = "claude"\nmodel = "m"\nexecutable = "{script}"\n'
    )
    line = next(x for x in run_cli("doctor").stdout.splitlines() if "reviewer c" in x)
    assert line == f"problem: reviewer c (claude): {script} is not executable (chmod +x {script})"


def test_doctor_names_a_program_whose_folder_cannot_be_searched(kb, tmp_path):
    """A program under a folder this user may not search: `Path.is_dir` raised
    PermissionError (it passes over only "not found"), and doctor stopped at that reviewer
    with "error: …: Permission denied (run reviewq as a user who may read and write the
    state folder and the KB)", its later checks not made. Run without the capabilities
    that pass a mode (as root here)."""
    from .conftest import bound_by_file_modes, reviewq_process

    wrap = bound_by_file_modes()
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "review.sh").write_text("#!/bin/sh\nexit 0\n")
    (locked / "review.sh").chmod(0o755)
    kb.write("reviewq.toml", f'[reviewers.x]\nkind = "command"\ncommand = ["{locked}/review.sh"]\n')
    locked.chmod(0o000)
    try:
        res = reviewq_process("--root", str(kb.root), "doctor", wrap=wrap)
    finally:
        locked.chmod(0o755)
    assert re.fullmatch(r"error: \d+ problem\(s\)\n", res.stderr), res.stderr
    line = next(x for x in res.stdout.splitlines() if "reviewer x" in x)
    assert line == (
        f"problem: reviewer x (command): {locked}/review.sh: a folder of its path may not be "
        "searched by this user (Permission denied)"
    )


@pytest.mark.parametrize(
    ("kind", "says", "verdict", "words"),
    [
        # What the real CLIs print; 2.0.0 refuses --permission-mode dontAsk.
        ("claude", "2.0.0 (Claude Code)", "problem", "2.0.0 is older than the versions"),
        ("claude", "2.1.332 (Claude Code)", "ok", "2.1.332, one of the versions"),
        # Each passed a review through a sweep yet failed the rest of the vendor tests:
        # Claude 2.1.152 let a person's settings write into the KB and counted a dead
        # endpoint against the job, Gemini 0.45.2 a stream cut mid-run and 0.57.0 a
        # model that never answered; Codex 0.137.0 counted 3 of 6 turns.
        ("claude", "2.1.152 (Claude Code)", "problem", "2.1.152 is older than the versions"),
        ("codex", "codex-cli 0.137.0", "problem", "0.137.0 is older than the versions"),
        ("gemini", "0.45.2", "problem", "0.45.2 is older than the versions"),
        ("codex", "codex-cli 0.171.0", "ok", "0.171.0, one of the versions"),
        # A wrapper script's (or a release's) "v": it said "said no version".
        ("claude", "claude v2.1.332", "ok", "2.1.332, one of the versions"),
        ("gemini", "9.0.0", "warning", "9.0.0 is newer than the versions"),
        ("gemini", "", "warning", "--version` said no version"),
    ],
)
def test_doctor_names_a_vendor_cli_s_version_and_whether_reviewq_knows_it(
    run_cli, kb, tmp_path, kind, says, verdict, words
):
    """doctor said "ok: reviewer claude (claude)" of any claude on PATH: a months-old one
    refused a flag every attempt passes, and the operator learnt it from paused reviewers."""
    exe = tmp_path / kind
    exe.write_text(f"#!/bin/sh\necho '{says}'\n")
    exe.chmod(0o755)
    kb.write("reviewq.toml", f'[reviewers.x]\nkind = "{kind}"\nexecutable = "{exe}"\nmodel = "m"\n')
    res = run_cli("doctor")
    line = next(x for x in res.stdout.splitlines() if x.startswith(f"{verdict}: reviewer x"))
    assert f"{exe} {words}" in line if says else words in line, line
    assert "is known to work with" in line, line
    if verdict == "problem":
        assert res.exit_code == 1 and "npm install -g @" in line


def test_doctor_names_a_machine_whose_managed_codex_layer_refuses_every_attempt(
    run_cli, kb, tmp_path, monkeypatch
):
    """A managed_config.toml that forces an MCP server on refuses each Codex attempt before
    it starts (B30, shown with the real CLI in test_vendor_clis); doctor said "ok" of the
    profile, and the operator learnt it from a paused reviewer."""
    from workers.reviewers import codex

    managed = tmp_path / "managed_config.toml"
    managed.write_text('[mcp_servers.kb]\ncommand = "true"\nenabled = true\n')
    monkeypatch.setattr(codex, "_MANAGED_CONFIG", managed)
    exe = tmp_path / "codex"
    exe.write_text("#!/bin/sh\necho 'codex-cli 0.171.0'\n")
    exe.chmod(0o755)
    kb.write("reviewq.toml", f'[reviewers.x]\nkind = "codex"\nexecutable = "{exe}"\nmodel = "m"\n')
    res = run_cli("doctor")
    line = next(x for x in res.stdout.splitlines() if x.startswith("problem: reviewer x"))
    assert line == (
        f"problem: reviewer x (codex): {managed} forces on the MCP server 'kb' (enabled = "
        "true), which would start beside the review outside the sandbox; no -c can turn it off"
    ), line
    assert res.exit_code == 1


def test_doctor_reads_the_version_of_a_relative_vendor_cli_where_its_agents_start(
    run_cli, kb, tmp_path, monkeypatch
):
    """`executable = "tools/claude"` runs from the KB root; its --version ran from wherever
    doctor (or the worker) was, found nothing there, and "said no version"."""
    (kb.root / kb.write("tools/claude", "#!/bin/sh\necho '2.1.332 (Claude Code)'\n")).chmod(0o755)
    monkeypatch.chdir(tmp_path)
    kb.write(
        "reviewq.toml", '[reviewers.x]\nkind = "claude"\nexecutable = "tools/claude"\nmodel = "m"\n'
    )
    res = run_cli("doctor")
    line = next(x for x in res.stdout.splitlines() if "reviewer x" in x)
    assert line.startswith("ok: reviewer x (claude): tools/claude 2.1.332, one of"), line


def test_doctor_ends_a_vendor_cli_whose_version_never_comes_and_all_it_started(
    run_cli, kb, tmp_path, monkeypatch
):
    """A CLI that hung on --version was killed after 30 s, but not the node its wrapper
    script (or Gemini, relaunching itself) had started, which each doctor run from cron
    left behind; and doctor said it "said no version"."""
    from tests.conftest import ends_within
    from workers.reviewers import vendor

    monkeypatch.setattr(vendor, "VERSION_TIMEOUT_S", 1.0, raising=False)
    pid_file = tmp_path / "child.pid"
    exe = tmp_path / "claude"
    exe.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {pid_file}\nwait\n")
    exe.chmod(0o755)
    kb.write("reviewq.toml", f'[reviewers.x]\nkind = "claude"\nexecutable = "{exe}"\nmodel = "m"\n')
    res = run_cli("doctor")
    child = int(pid_file.read_text())
    try:
        line = next(x for x in res.stdout.splitlines() if x.startswith("warning: reviewer x"))
        assert f"`{exe} --version` did not answer within 1 s" in line, line
        assert ends_within(child, 5.0), "the CLI's child outlived doctor"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_doctor_reads_an_npm_installed_cli_s_version_without_starting_it(
    run_cli, kb, tmp_path, monkeypatch
):
    """Gemini CLI 0.61.0's --version takes 7-21 s on a loaded machine and exits before its
    write of ~/.gemini/projects.json ends: each doctor run (from cron, every few minutes)
    left two projects.json.*.tmp files in the person's HOME."""
    gemini = Path(__file__).parent / "vendor" / "node_modules" / ".bin" / "gemini"
    if not gemini.exists():
        pytest.skip("the pinned Gemini CLI is not installed (npm ci --prefix tests/vendor)")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    kb.write(
        "reviewq.toml", f'[reviewers.g]\nkind = "gemini"\nexecutable = "{gemini}"\nmodel = "m"\n'
    )
    res = run_cli("doctor")
    line = next(x for x in res.stdout.splitlines() if "reviewer g " in x)
    assert line.startswith(f"ok: reviewer g (gemini): {gemini} 0.61.0, one of"), line
    assert not list(home.rglob("*")), list(home.rglob("*"))


def _npm_cli(prefix: Path, package: str, file: str, version: str, text: str) -> Path:
    """PREFIX/node_modules/.bin/NAME, a link into ``package`` at ``version``, as npm lays
    out an `npm install --prefix PREFIX package`; ``text`` the program's."""
    folder = prefix / "node_modules" / package
    (folder / file).parent.mkdir(parents=True)
    (folder / "package.json").write_text(json.dumps({"name": package, "version": version}))
    (folder / file).write_text(text)
    (folder / file).chmod(0o755)
    exe = prefix / "node_modules" / ".bin" / Path(file).stem
    exe.parent.mkdir(exist_ok=True)
    exe.symlink_to(Path("..", package, file))
    return exe


def test_doctor_says_to_upgrade_a_cli_where_the_profile_s_executable_is(run_cli, kb, tmp_path):
    """A profile's executable in an npm prefix of its own (OPERATIONS: "a full path if not
    on PATH") was told `npm install -g …`, which left that one as old as it was."""
    exe = _npm_cli(
        tmp_path / "clis",
        "@anthropic-ai/claude-code",
        "bin/claude.exe",
        "2.0.0",
        "#!/bin/sh\necho '2.0.0 (Claude Code)'\n",
    )
    kb.write("reviewq.toml", f'[reviewers.x]\nkind = "claude"\nexecutable = "{exe}"\nmodel = "m"\n')
    res = run_cli("doctor")
    line = next(x for x in res.stdout.splitlines() if "reviewer x " in x)
    assert line.startswith(f"problem: reviewer x (claude): {exe} 2.0.0 is older than"), line
    assert f"(npm install --prefix {tmp_path / 'clis'} @anthropic-ai/claude-code@" in line, line


def test_doctor_starts_an_npm_cli_whose_interpreter_is_not_on_path(run_cli, kb, tmp_path):
    """Its version read from package.json, a CLI whose `#!/usr/bin/env node` finds no node
    on the services' PATH (nvm's is an interactive shell's) was "ok", and every attempt
    "exited 127"; asked --version, it says why it cannot start."""
    exe = _npm_cli(
        tmp_path / "clis",
        "@google/gemini-cli",
        "bundle/gemini.js",
        "0.61.0",
        "#!/usr/bin/env reviewq-no-such-node\n",
    )
    kb.write("reviewq.toml", f'[reviewers.g]\nkind = "gemini"\nexecutable = "{exe}"\nmodel = "m"\n')
    res = run_cli("doctor")
    line = next(x for x in res.stdout.splitlines() if x.startswith("warning: reviewer g "))
    assert f"`{exe} --version` exited 127:" in line and "reviewq-no-such-node" in line, line


def test_doctor_asks_each_vendor_cli_its_version_once_and_all_at_once(run_cli, kb, tmp_path):
    """doctor ran --version once per profile, one after another: with two Gemini profiles
    and a Claude it waited ~20 s more than Gemini's own ~10 s on a loaded machine."""

    def cli(name: str, other: str, says: str) -> Path:
        # It says its version only once the other CLI has been asked for its own.
        exe = tmp_path / name
        exe.write_text(
            f"#!/bin/sh\necho asked >> {tmp_path}/{name}.asked\n"
            f"for i in $(seq 100); do [ -e {tmp_path}/{other}.asked ] && break; sleep 0.05; done\n"
            f"[ -e {tmp_path}/{other}.asked ] && echo '{says}'\n"
        )
        exe.chmod(0o755)
        return exe

    claude = cli("claude", "codex", "2.1.332 (Claude Code)")
    codex = cli("codex", "claude", "codex-cli 0.171.0")
    kb.write(
        "reviewq.toml",
        "".join(
            f'[reviewers.{name}]\nkind = "{kind}"\nexecutable = "{exe}"\nmodel = "m"\n'
            for name, kind, exe in [("c1", "claude", claude), ("c2", "claude", claude)]
            + [("x", "codex", codex)]
        ),
    )
    res = run_cli("doctor")
    for name in ("c1", "c2", "x"):
        line = next(x for x in res.stdout.splitlines() if f"reviewer {name} " in x)
        assert line.startswith(f"ok: reviewer {name} ") and "one of the versions" in line, line
    assert (tmp_path / "claude.asked").read_text() == "asked\n"


def test_a_vendor_modules_folder_holding_no_cli_is_said_not_passed_over(tmp_path, monkeypatch):
    """A REVIEWQ_VENDOR_MODULES folder with no CLI in it (a typo, the npm prefix named for
    its node_modules) was passed over: every vendor test ran the pinned CLIs and passed,
    as if the version meant had."""
    from tests.test_vendor_clis import _why_not

    (tmp_path / "node_modules").mkdir()
    monkeypatch.setenv("REVIEWQ_VENDOR_MODULES", str(tmp_path))
    why = _why_not()
    assert why is not None and f"REVIEWQ_VENDOR_MODULES names {tmp_path}, which" in why, why


def test_the_pinned_vendor_clis_are_among_the_versions_doctor_knows():
    """Bumping a pin in tests/vendor without the range doctor checks against made doctor
    call the very version the tests run a stranger."""
    from workers.reviewers.vendor import version_verdict

    pinned = json.loads((Path(__file__).parent / "vendor" / "package.json").read_text())
    for adapter in ADAPTERS.values():
        if adapter.known_versions is None:
            continue
        version = pinned["dependencies"][adapter.package]
        known, _ = version_verdict(adapter.kind, version, adapter.known_versions, "p")
        assert known is True, (adapter.kind, version, adapter.known_versions)


def test_an_adapter_that_raises_before_launch_still_gives_an_outcome(tmp_path):
    from workers.attempt import run_attempt
    from workers.reviewers.base import Reviewer

    class Broken(Reviewer):
        kind = "command"

        def command(self, spec):
            raise KeyError("unknown placeholder {prompt_pth} in command")

    spec = AttemptSpec(
        "review", 1, 1, tmp_path / "p", tmp_path / "o", tmp_path, tmp_path / "a", tmp_path, "m"
    )
    out = run_attempt(
        Broken(ReviewerProfile(name="b", kind="command")), spec, timeout_s=5, max_turns=1
    )
    assert out.classification == "launch-failure"
    assert "{prompt_pth}" in out.reasons[0] and out.ended_at


@pytest.mark.parametrize("errno_", [errno.EAGAIN, errno.ENOENT])
def test_a_launch_is_tried_again_after_a_transient_error_only(tmp_path, monkeypatch, errno_):
    """The launch's first try runs without tenacity (its machinery cost every agent), so
    the retries of a transient fork error (EAGAIN) are checked here; a missing binary is
    not tried again."""
    import subprocess

    from workers import attempt

    tries = []
    real = subprocess.Popen

    def popen(*args, **kwargs):
        tries.append(1)
        if len(tries) < 3:
            raise OSError(errno_, os.strerror(errno_))
        return real(*args, **kwargs)

    monkeypatch.setattr(attempt.subprocess, "Popen", popen)
    out, err = tmp_path / "o", tmp_path / "e"
    if errno_ == errno.ENOENT:
        with pytest.raises(FileNotFoundError):
            attempt.launch(["true"], dict(os.environ), tmp_path, out, err)
        assert len(tries) == 1
        return
    proc = attempt.launch(["true"], dict(os.environ), tmp_path, out, err)
    assert proc.wait(timeout=10) == 0 and len(tries) == 3


def test_heartbeats_keep_coming_when_connect_checks_are_more_frequent(tmp_path):
    """Each connect-check window started the heartbeat clock again, so with a
    connect_timeout at or below the heartbeat period no heartbeat was ever sent and a
    healthy attempt was reaped as lost after one lease. The agent here waits on a FIFO
    that the third heartbeat opens."""
    from workers.attempt import run_attempt

    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    profile = ReviewerProfile(
        name="c", kind="command", command=("sh", "-c", f"read x < {fifo}"), connect_timeout=0.05
    )
    spec = AttemptSpec(
        "review", 1, 1, tmp_path / "p", tmp_path / "o", tmp_path, tmp_path / "a", tmp_path, "m"
    )
    beats: list[float] = []

    def beat() -> None:
        beats.append(time.monotonic())
        if len(beats) == 3:
            fd = os.open(fifo, os.O_WRONLY)  # the agent has it open for reading: no wait
            os.write(fd, b"go\n")
            os.close(fd)

    out = run_attempt(
        for_profile(profile), spec, timeout_s=10, max_turns=1, on_tick=beat, tick_s=0.2
    )
    assert len(beats) >= 3, out.reasons
    assert out.classification == "no-output"  # released by the test, not by the deadline


def test_doctor_probes_an_openai_profiles_base_url(run_cli, kb, tmp_path):
    """doctor checked each kind's CLI, and of an ``openai`` profile only that Python was
    there: "ok" of an endpoint at which every attempt would find nothing listening. A dead
    port is one line naming the profile and the URL; one that takes the connection and
    never answers is given up within the probe's bound, not waited on."""
    from .test_vendor_clis import Model

    def doctor_line(base_url: str) -> tuple[str, float]:
        kb.write(
            "reviewq.toml",
            f'[reviewers.local]\nkind = "openai"\nmodel = "m"\nbase_url = "{base_url}"\n'
            'timeout = "60s"\nconnect_timeout = "2s"\n',
        )
        start = time.monotonic()
        res = run_cli("doctor")
        took = time.monotonic() - start
        (line,) = [x for x in res.stdout.splitlines() if "reviewer local" in x]
        return line, took

    model = Model(None, tmp_path / "requests.jsonl")  # tests/vendor_model.py on loopback
    try:
        line, _ = doctor_line(model.url("review") + "/v1")
        assert line == f"ok: reviewer local (openai): base_url {model.url('review')}/v1 answers"
        assert [r["path"] for r in model.requests("review")] == ["/v1/models"]
    finally:
        model.stop()
    with socket.socket() as dead, socket.socket() as mute:
        dead.bind(("127.0.0.1", 0))  # bound, not listening: the connection is refused
        mute.bind(("127.0.0.1", 0))
        mute.listen(1)  # takes the connection (into its backlog) and never answers
        d, m = dead.getsockname()[1], mute.getsockname()[1]
        for base_url, said in (
            (
                f"http://127.0.0.1:{d}/v1",
                # refused at once: no "within 2 s", which reads as a wait that ran out
                f"cannot reach http://127.0.0.1:{d}/v1/chat/completions: Connection refused",
            ),
            (
                f"http://127.0.0.1:{m}",
                f"no HTTP answer from http://127.0.0.1:{m}/v1/models within 2 s: timed out",
            ),
        ):
            line, took = doctor_line(base_url)
            assert line == f"problem: reviewer local (openai): {said}", line
            assert took < 10, took


def test_doctor_says_when_it_made_the_state_db(run_cli, kb):
    """Run on a mistyped --state, doctor made a state.db there and said 'ok' as if it were
    the night's; after that, status read it as all clear."""
    typo = kb.root / "typo"
    first = run_cli("--state", str(typo), "doctor").stdout
    assert (
        f"ok: state.db created at {typo / 'state.db'}: nothing had run with this state folder "
        "(is --state right?)"
    ) in first
    again = run_cli("--state", str(typo), "doctor").stdout
    assert f"ok: state.db at {typo / 'state.db'}, schema " in again


def test_doctor_names_a_paused_reviewer_and_how_to_lift_the_pause(run_cli, kb):
    """A reviewer paused after failures in a row (an expired key) holds back every job of
    its profile; doctor, the health check, said 'ok' throughout."""
    from orchestrator.state.store import Store

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha")
    kb.write("reviewq.toml", '[reviewers.claude]\nkind = "offline"\n')
    first = run_cli("doctor")
    assert first.exit_code == 0, first.stdout
    with Store.open(kb.state) as s:
        s.conn.execute(
            "INSERT INTO reviewer_state (name, launch_failures, updated_at, paused_until, "
            "paused_reason) VALUES ('claude', 5, '2026-01-01T00:00:00.000Z', "
            "'2999-01-01T00:00:00.000Z', 'auth')"
        )
    res = run_cli("doctor")
    assert res.exit_code == 1
    assert (
        "problem: reviewer claude is paused until 2999-01-01T00:00:00Z (or until reviewq resume "
        "claude, once the cause is mended): auth\n"
    ) in res.stdout


def test_doctor_names_what_a_sweep_entry_selects_that_the_kb_lacks(run_cli, kb):
    """A typo in a [[sweeps]] entry's select failed its cron run every night while doctor
    said ok; one in its audit list audited nothing, silently."""
    kb.gate("prose/body-check", ["body"])
    kb.note("alpha")
    kb.write(
        "reviewq.toml",
        '[[sweeps]]\nname = "n"\ncron = "0 3 * * *"\nselect = ["prose", "prse"]\n'
        'audit = ["/prose", "prose/body-chek"]\nnotes = ["kb/notes/alpha.md", "kb/notes/beta.md"]\n',
    )
    res = run_cli("doctor")
    assert res.exit_code == 1
    cfg = kb.root / "reviewq.toml"
    problems = [line for line in res.stdout.splitlines() if line.startswith("problem: ")]
    assert problems[:3] == [
        f"problem: {cfg}: [[sweeps]] 'n' select: prse: not a bundle, gate id or type request",
        f"problem: {cfg}: [[sweeps]] 'n' audit: prose/body-chek: not a bundle, gate id or type "
        "request",
        f"problem: {cfg}: [[sweeps]] 'n' notes: {kb.root / 'kb/notes/beta.md'}: no such note "
        "file or folder in the KB",
    ]


def test_doctor_says_a_sweeps_entry_fires_only_while_a_control_runs(run_cli, kb):
    """A first [[sweeps]] entry, doctor all ok, and at 01:30 nothing ran: only a control
    process fires them, and none had been started. Not said while one holds the folder."""
    import fcntl

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha")
    kb.write("reviewq.toml", '[[sweeps]]\nname = "nightly"\ncron = "30 1 * * *"\n')
    res = run_cli("doctor")
    assert res.exit_code == 0, res.stdout
    said = [line for line in res.stdout.splitlines() if "nightly" in line]
    assert said == [
        "warning: [[sweeps]] 'nightly' runs at its cron only while a control process runs "
        f"for {kb.state}, and none does: start `reviewq control` (OPERATIONS §3), or have "
        "the system's cron run `reviewq sweep --name nightly`"
    ], res.stdout
    fd = os.open(kb.state / "control.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        res = run_cli("doctor")
    finally:
        os.close(fd)
    assert "nightly" not in res.stdout, res.stdout


def test_doctor_says_nothing_of_a_sweeps_entry_the_systems_cron_runs_by_name(run_cli, kb):
    """doctor's own way on, the system's cron running `reviewq sweep --name nightly`, kept
    its warning for good ("none does: start `reviewq control`"), every morning: nothing
    said the entry was run. A control's run after it, and that control gone, warns again."""
    from .conftest import reviewq_process

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha")
    kb.write(
        "reviewq.toml",
        '[[sweeps]]\nname = "nightly"\ncron = "30 1 * * *"\nreviewer = "offline"\n\n'
        '[[sweeps]]\nname = "weekly"\ncron = "0 3 * * 0"\nreviewer = "offline"\n',
    )
    res = reviewq_process("--root", str(kb.root), "sweep", "--name", "nightly")
    assert res.returncode == 0, res.stderr
    said = [line for line in run_cli("doctor").stdout.splitlines() if "[[sweeps]]" in line]
    assert len(said) == 1 and "'weekly' runs at its cron" in said[0], said
    assert "nightly" not in said[0]
    with Store.open(kb.state) as store, store.write():
        store.conn.execute(
            "INSERT INTO sweep_runs (name, trigger, options, started_at) "
            "VALUES ('nightly', 'cron', '{\"configured\": true}', '2999-01-01T00:00:00Z')"
        )
    said = [line for line in run_cli("doctor").stdout.splitlines() if "[[sweeps]]" in line]
    assert "'nightly', 'weekly' run at their crons" in said[0], said


def test_doctor_for_a_worker_with_no_queue_url_and_no_control_says_it_would_wait(run_cli, tmp_path):
    """`doctor --worker` said "ok: queue backend SQLite answers" of a queue file of the
    worker's own, which no control process feeds, and made it."""
    home = tmp_path / "remote"
    home.mkdir()
    (home / "worker.toml").write_text('[reviewers.x]\nkind = "offline"\n')
    res = run_cli(
        "--root", str(home), "--config", str(home / "worker.toml"), "--state",
        str(home / "state"), "doctor", "--worker",
    )  # fmt: skip
    assert res.exit_code == 1
    assert res.stdout.splitlines()[0].startswith("problem: no [queue] url, and ")
    assert not (home / "state" / "queue").exists()


def test_doctor_for_a_worker_in_a_kb_root_agrees_with_the_worker_that_starts_there(run_cli, kb):
    """A worker in the KB root with no [queue] url starts (the Procfile starts the control
    beside it); `doctor --worker` there called it a problem before any control had run."""
    kb.gate("prose/body-check", ["body"])
    kb.write("reviewq.toml", '[reviewers.x]\nkind = "offline"\n')
    res = run_cli("doctor", "--worker")
    assert res.exit_code == 0, res.stdout
    assert "no [queue] url" not in res.stdout


def test_doctor_outside_a_kb_root_makes_no_state_folder(run_cli, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    res = run_cli("--root", str(empty), "doctor")
    assert res.exit_code == 1
    # It read "problem: KB root EMPTY holds kb/": said of a root that holds none, the one
    # line doctor prints there stated the opposite of what is wrong.
    assert res.stdout.splitlines()[0] == (
        f"problem: {empty}: no kb/ folder here (is --root the folder that holds kb/?)"
    )
    assert list(empty.iterdir()) == []


# --- openai: what an endpoint may answer besides a chat completion -------------------------


class Answering:
    """A loopback HTTP server whose every answer comes from ``handler(request, method,
    body) -> (status, bytes, headers)``, or None when it wrote its answer itself; it
    records (method, path, Authorization)."""

    def __init__(self, handler) -> None:  # noqa: ANN001
        self.seen: list[tuple[str, str, str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.seen.append((method, self.path, self.headers.get("Authorization")))
                answer = handler(self, method, body)
                if answer is None:  # the handler wrote its own answer (a cut chunked body)
                    return
                status, data, headers = answer
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                if "content-length" not in (name.lower() for name, _ in headers):
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self._answer("POST")

            def do_GET(self) -> None:  # noqa: N802
                self._answer("GET")

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def answering() -> Iterator:
    made: list[Answering] = []

    def make(handler) -> Answering:  # noqa: ANN001
        made.append(Answering(handler))
        return made[-1]

    yield make
    for srv in made:
        srv.close()


def _chat(content: str, usage: dict | None = None) -> tuple[int, bytes, list]:
    answer = {"choices": [{"message": {"content": content}}], "usage": usage or {}}
    return 200, json.dumps(answer).encode(), [("Content-Type", "application/json")]


@pytest.mark.parametrize("code", [308, 301])
def test_openai_endpoint_that_redirects_is_the_profiles_failure(
    kb2, run_cli, monkeypatch, answering, code
):
    """http:// where the server wants https://: a 308 was a counted no-output; after a
    301 urllib sent a GET, and the server's 405 was one too. Three of them escalated the
    night's pairs for a base_url to correct."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)

    def redirect(request, method, body):  # noqa: ANN001
        if method == "GET":
            return 405, b'{"detail":"Method Not Allowed"}', []
        return code, b"", [("Location", "https://127.0.0.1:1" + request.path)]

    openai_profile(kb2, answering(redirect).url)
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.classification == "reviewer-failure", res.outcome.reasons
    assert "redirects to https://127.0.0.1:1/v1/chat/completions" in res.outcome.reasons[0]


def test_openai_key_is_not_sent_where_a_redirect_points(kb2, run_cli, monkeypatch, answering):
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    other = answering(lambda request, method, body: (200, b"<html>sign in</html>", []))
    gateway = answering(
        lambda request, method, body: (302, b"", [("Location", other.url + "/sso/login")])
    )
    openai_profile(kb2, gateway.url)
    res = run(kb2, make_job(run_cli), "local")
    assert other.seen == [] and res.outcome.classification == "reviewer-failure"


def test_openai_key_from_a_crlf_env_file_is_sent_without_its_line_end(
    kb2, run_cli, monkeypatch, answering
):
    """A key ending in CR made http.client raise: a traceback whose last line held the
    key went to stderr.log, and from there into the attempt's stored reasons."""
    srv = answering(lambda request, method, body: (500, b"down", []))
    openai_profile(kb2, srv.url, extra="env = { }\n")
    kb2.write("reviewq.toml", kb2.read("reviewq.toml").replace("REVIEWQ_TEST_KEY", "LOCAL_LLM"))
    monkeypatch.setenv("LOCAL_LLM", KEY + "\r")
    job_id = make_job(run_cli)
    res = run(kb2, job_id, "local")
    assert srv.seen[-1][2] == f"Bearer {KEY}"
    assert res.outcome.classification == "reviewer-failure", res.outcome.reasons
    monkeypatch.setenv("LOCAL_LLM", KEY + "\x1btail")
    res = run(kb2, job_id, "local")  # queued again: the server's failure, not the job's
    stderr = [p.read_text() for p in kb2.state.rglob("stderr.log")]
    assert res.outcome.classification == "reviewer-failure", res.outcome.reasons
    assert "LOCAL_LLM holds a key with a space, a control character" in res.outcome.reasons[0]
    assert not any(KEY in s or "Traceback" in s for s in stderr), stderr
    assert KEY not in json.dumps(res.outcome.reasons)


def test_openai_key_echoed_past_the_cut_of_an_error_is_masked_whole(
    kb2, run_cli, monkeypatch, answering
):
    long_key = "eyJ" + "a1b2c3d4" * 15
    monkeypatch.setenv("REVIEWQ_TEST_KEY", long_key)
    srv = answering(
        lambda request, method, body: (
            401,
            ("x" * 250 + f" authorization: {request.headers['Authorization']}").encode(),
            [],
        )
    )
    openai_profile(kb2, srv.url)
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.classification == "reviewer-failure"
    assert long_key[:24] not in _stderr(kb2) + json.dumps(res.outcome.telemetry)


def test_a_key_given_in_the_profiles_env_under_any_name_is_redacted(
    kb2, run_cli, monkeypatch, answering
):
    """``api_key_env`` may name a variable of the profile's own ``env`` table (the agent
    reads it there first); only the environment's was taken for a secret, so under a name
    that says none (LOCAL_LLM) a key an answer quoted was stored in clear."""
    key = "sk-local-in-the-profile-7d41"
    monkeypatch.delenv("LOCAL_LLM", raising=False)

    def quoting(request, method, body):  # noqa: ANN001
        prompt = json.loads(body)["messages"][0]["content"]
        said = request.headers["Authorization"]
        return _chat(
            "\n".join(
                f"{line}\nSummary: sent with {said}.\nFindings:\n- none\n## Result: PASS\n"
                f"{line.replace('START', 'END')}"
                for line in prompt.splitlines()
                if line.startswith("=== PAIR REVIEW START: ")
            )
        )

    srv = answering(quoting)
    openai_profile(kb2, srv.url, extra=f'env = {{ LOCAL_LLM = "{key}" }}\n')
    kb2.write("reviewq.toml", kb2.read("reviewq.toml").replace("REVIEWQ_TEST_KEY", "LOCAL_LLM"))
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.classification == "output" and srv.seen[-1][2] == f"Bearer {key}"
    with Store.open(kb2.state) as s:
        rationales = [r[0] for r in s.conn.execute("SELECT rationale FROM review_pairs")]
    assert len(rationales) == 2 and all("sent with Bearer [redacted]" in r for r in rationales)


def test_openai_answer_that_is_not_json_it_can_read_is_the_servers_failure(
    kb2, run_cli, monkeypatch, answering
):
    """JSON nested past the parser's depth raised RecursionError: a traceback and no
    telemetry, so an answer that took more than 15 s was counted against the job."""
    from workers import attempt

    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    monkeypatch.setattr(attempt, "LAUNCH_WINDOW_S", 0.0)  # as if the answer came slowly
    srv = answering(lambda request, method, body: (200, b"[" * 100_000, []))
    openai_profile(kb2, srv.url)
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.classification == "reviewer-failure", res.outcome.reasons
    assert "Traceback" not in _stderr(kb2)


def test_openai_answer_cut_off_midway_is_said_so_and_is_the_servers_failure(
    kb2, run_cli, monkeypatch, answering
):
    """A body shorter than its Content-Length (a proxy restarted, the connection dropped)
    was said to be "did not answer with a chat completion" of a server that did answer."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    whole = _chat("Summary: fine.")[1]
    srv = answering(
        lambda request, method, body: (200, whole[:20], [("Content-Length", str(len(whole)))])
    )
    openai_profile(kb2, srv.url)
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.classification == "reviewer-failure", res.outcome.reasons
    said = f"cut its answer off after 20 of {len(whole)} bytes"
    assert said in _stderr(kb2) and "Traceback" not in _stderr(kb2)


def test_openai_chunked_answer_cut_off_midway_is_said_so_not_out_of_reach(
    kb2, run_cli, monkeypatch, answering
):
    """A chunked body whose connection closed before its last chunk (a proxy restarted
    mid-answer) was said "cannot reach …: IncompleteRead(0 bytes read)", out of reach:
    the operator looked at a network the server had answered on."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    whole = _chat("Summary: fine.")[1]

    def cut(request, method, body):  # noqa: ANN001
        request.wfile.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            + f"{len(whole):x}\r\n".encode()
            + whole[:20]
        )
        request.close_connection = True

    openai_profile(kb2, answering(cut).url)
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.classification == "reviewer-failure", res.outcome.reasons
    assert res.outcome.reasons[0].startswith("server: http://127.0.0.1:"), res.outcome.reasons
    assert "cut its answer off before the end of its chunked body" in res.outcome.reasons[0]
    assert "Traceback" not in _stderr(kb2)


def _bundle_for(prompt: str) -> str:
    """A PASS for every pair the prompt names, as a model that followed it writes."""
    return "\n".join(
        f"{line}\nSummary: served.\nFindings:\n- none\n## Result: PASS\n"
        f"{line.replace('START', 'END')}\n"
        for line in prompt.splitlines()
        if line.startswith("=== PAIR REVIEW START: ")
    )


@pytest.mark.parametrize(
    ("cut_at", "outcome"),
    [("the second block", "burned-out"), ("nothing", "burned-out"), ("chatter", "output")],
)
def test_openai_answer_stopped_at_its_token_limit_is_burned_out(
    kb2, run_cli, monkeypatch, answering, cut_at, outcome
):
    """``finish_reason: "length"``: the model stopped at max_tokens. Its bundle cut short
    was judged as written: "unterminated block … (no END)" (and, in the retry prompt, an
    END to remember, not less to write) three times over, the job never split, its pairs
    escalated; an empty answer so cut was a no-output. Claude's and Codex's output-token
    limits burn the attempt out (F30); so does this one. A whole bundle whose cut came in
    the chatter after it is the job's output."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)

    def stopped(request, method, body):  # noqa: ANN001
        whole = _bundle_for(json.loads(body)["messages"][0]["content"])
        content = {
            "the second block": whole[: whole.rindex("## Result")],
            "nothing": "",
            "chatter": whole + "\nI hope this review hel",
        }[cut_at]
        choice = {"message": {"content": content}, "finish_reason": "length"}
        usage = {"prompt_tokens": 900, "completion_tokens": 2048}
        return 200, json.dumps({"choices": [choice], "usage": usage}).encode(), []

    openai_profile(kb2, answering(stopped).url)
    job_id = make_job(run_cli)
    res = run(kb2, job_id, "local")
    assert res.outcome.classification == outcome, res.outcome.reasons
    assert res.outcome.telemetry["output_tokens"] == 2048  # what it used counts
    if outcome == "output":
        assert res.ok and [p["decision"] for p in res.finalized.pairs] == ["PASS", "PASS"]
        return
    reason = res.outcome.reasons[0]
    assert reason.startswith("the model reached its output-token limit: http://127.0.0.1:")
    assert reason.endswith("(finish_reason length)"), res.outcome.reasons
    assert len(parts_of(kb2, job_id)) == 2  # split into one-pair jobs
    from workers.openai_agent import OUTPUT_LIMIT
    from workers.reviewers.base import OUTPUT_LIMIT as BASE_OUTPUT_LIMIT

    assert OUTPUT_LIMIT == BASE_OUTPUT_LIMIT  # the agent imports nothing of reviewq's


@pytest.mark.parametrize(
    ("message", "finish", "said"),
    [
        (
            {"content": "=== PAIR REVIEW START: kb/notes/alpha.md :: kb/instr"},
            "content_filter",
            "its provider's content filter stopped its answer after 52 characters "
            "(finish_reason content_filter)",
        ),
        (
            {"content": None, "refusal": "I can't help with\nthat request."},
            "stop",
            "refused: I can't help with that request.",
        ),
    ],
    ids=["content-filter", "refusal"],
)
def test_openai_answer_refused_or_filtered_is_the_job_s_and_says_so(
    kb2, run_cli, monkeypatch, answering, message, finish, said
):
    """A provider's content filter that cut the answer short had the cut text judged as
    the bundle: "unterminated block … (no END)" three times over, and the person the job
    was escalated to never read that a filter had stopped it. A refusal (OpenAI's
    ``refusal``, the content null) was "answered with an empty message (finish_reason
    stop)", its words lost. Each is the job's, as Codex's filter is (F32): a counted
    no-output, in its own words."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    choice = {"message": {"role": "assistant", **message}, "finish_reason": finish}
    answer = json.dumps({"choices": [choice], "usage": {"prompt_tokens": 700}}).encode()
    openai_profile(kb2, answering(lambda request, method, body: (200, answer, [])).url)
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.classification == "no-output", res.outcome.reasons
    assert res.outcome.reasons[0].endswith(f"/v1/chat/completions {said}"), res.outcome.reasons
    assert res.outcome.telemetry["input_tokens"] == 700


@pytest.mark.parametrize(
    ("status", "body", "failure"),
    [
        # A LiteLLM proxy in front of the model, its budget spent (its own words).
        (
            400,
            b'{"error": {"message": "Budget has been exceeded! Current cost: 10.2, '
            b'Max budget: 10.0", "type": "budget_exceeded", "code": "400"}}',
            "quota",
        ),
        (
            400,
            b'{"error": {"message": "ExceededBudget: End User=nightly over budget. '
            b'Spend=2.1, Budget=2.0"}}',
            "quota",
        ),
        # The server (or a proxy) gave up waiting, as a 504 says.
        (408, b'{"error": "request took too long"}', "server"),
    ],
    ids=["litellm-budget", "end-user-budget", "408"],
)
def test_openai_spent_budget_or_request_timeout_is_the_reviewers_failure(
    kb2, run_cli, monkeypatch, answering, status, body, failure
):
    """Both were counted no-outputs: three of them failed the job and escalated its
    pairs for the proxy's budget or the server's patience."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    openai_profile(kb2, answering(lambda request, method, data: (status, body, [])).url)
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.classification == "reviewer-failure", res.outcome.reasons
    assert res.outcome.reasons[0].startswith(f"{failure}: HTTP {status} from ")


def _in_band(content: str, error: dict | None, at: str) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": content}}
    answer = {"id": "gen-1", "choices": [choice], "usage": {"prompt_tokens": 700}}
    if at == "choice":
        choice |= {"finish_reason": "error", "error": error}
    elif at == "top":
        answer |= {"error": error, "choices": []}
    else:  # finish_reason alone
        choice["finish_reason"] = "error"
    return answer


@pytest.mark.parametrize(
    ("content", "error", "at", "reason"),
    [
        ("", {"code": 502, "message": "Provider returned error"}, "choice", "server"),
        ("=== PAIR REVIEW START: a", {"code": 502, "message": "Upstream cut"}, "choice", "server"),
        ("", {"code": 429, "message": "Provider is rate limited"}, "choice", "rate-limit"),
        ("", {"code": "server_error", "message": "Provider disconnected"}, "top", "server"),
        ("", None, "finish_reason", "server"),
    ],
    ids=["empty", "cut-short", "rate-limited", "top-level", "no-error-object"],
)
def test_openai_error_inside_a_200_answer_is_the_reviewers_failure(
    kb2, run_cli, monkeypatch, answering, content, error, at, reason
):
    """OpenRouter answers 200 once a provider has started, and a failure after that comes
    in the body: finish_reason "error", an error object in the choice or at the top, and
    no content (or some of it). Read as an empty answer it was a no-output counted
    against the job; a part of a bundle was judged as the job's output."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    answer = json.dumps(_in_band(content, error, at)).encode()
    openai_profile(kb2, answering(lambda request, method, body: (200, answer, [])).url)
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.classification == "reviewer-failure", res.outcome.reasons
    assert res.outcome.reasons[0].startswith(f"{reason}: http://127.0.0.1:")
    said = error["message"] if error else "answered with an error, with no message"
    assert said in res.outcome.reasons[0]
    assert res.outcome.telemetry["input_tokens"] == 700  # what it used still counts


def test_openai_answer_with_a_lone_surrogate_keeps_its_usage(kb2, run_cli, monkeypatch, answering):
    """An emoji cut in two (\\ud83d) raised writing the output: a traceback, a .part file
    left, and the answer's tokens lost from the budget."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    answer = (
        b'{"choices":[{"message":{"content":"emoji \\ud83d cut"}}],'
        b'"usage":{"prompt_tokens":7000,"completion_tokens":900}}'
    )
    openai_profile(kb2, answering(lambda request, method, body: (200, answer, [])).url)
    res = run(kb2, make_job(run_cli), "local")
    assert res.outcome.telemetry.get("input_tokens") == 7000, res.outcome.telemetry
    assert not list(kb2.state.rglob("*.part"))
    assert "not UTF-8" in " ".join(res.finalized.failure_reasons), res.finalized


def test_openai_prompt_reaches_the_model_as_written(kb2, run_cli, monkeypatch, answering):
    """Read as text, a CRLF note reached the model with LF line ends."""
    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    kb2.write(NOTE, b"---\r\ntitle: Alpha\r\ndescription: About alpha.\r\n---\r\nAlpha.\r\n")
    got: list[str] = []

    def record(request, method, body):  # noqa: ANN001
        got.append(json.loads(body)["messages"][0]["content"])
        return 500, b"down", []

    openai_profile(kb2, answering(record).url)
    run(kb2, make_job(run_cli), "local")
    [prompt] = list(kb2.state.rglob("attempt-1/prompt.md"))
    assert got == [prompt.read_bytes().decode()] and "\r\n" in got[0]


def test_openai_fixer_that_wraps_the_note_in_chatter_gives_the_note(kb2, monkeypatch, answering):
    """A chat model answers "Here is the corrected note:" and a fenced block: written as
    it came, the chatter and the fence became the note, its frontmatter a paragraph."""
    from .test_cycles_integration import queue_fix

    monkeypatch.setenv("REVIEWQ_TEST_KEY", KEY)
    original = kb2.read(NOTE)
    fixed = original.replace("Alpha body.", "Alpha body, fixed.")
    reply = f"Here is the corrected note:\n\n```markdown\n{fixed}```\n\nI changed one line."
    openai_profile(kb2, answering(lambda request, method, body: _chat(reply)).url)
    kb2.accept("fake", [(NOTE, "prose/body-check")], decision="FAIL")
    ws = Workspace.open(kb2.root)
    fix = queue_fix(ws.kb, ws.store, ws.state_dir, NOTE, fixer="local")
    ws.close()
    res = run(kb2, fix, "local")
    assert res.ok, res.outcome.reasons
    assert kb2.read(NOTE) == fixed


@pytest.mark.parametrize(
    ("given", "answer", "taken"),
    [
        # A note without frontmatter that quotes an example note: its answer is the note.
        (
            "# How notes look\n\n```markdown\n---\ntitle: Example\n---\nBody.\n```\n",
            "# How notes look, fixed\n\n```markdown\n---\ntitle: Example\n---\nBody.\n```\n",
            "answer",
        ),
        # An answer that starts with the note's byte order mark is the note as it came.
        (
            "\ufeff---\ntitle: A\n---\nBody.\n",
            "\ufeff---\ntitle: A\n---\nBody, fixed.\n```md\n---\nx: 1\n---\n```\n",
            "answer",
        ),
        # A note without frontmatter fenced whole: left for the fix's checks, which refuse
        # it whatever the kind (it may be one code block), as they do a CLI's file.
        ("# A\n\nBody.\n", "```markdown\n# A\n\nFixed.\n```\n", "answer"),
        # A chat-wrapped answer for a note with frontmatter: the block is the note.
        ("---\ntitle: A\n---\nBody.\n", "Here:\n```md\n---\ntitle: A\n---\nFixed.\n```\n", "block"),
    ],
)
def test_a_fixers_answer_is_unwrapped_only_when_it_wraps_a_note(given, answer, taken):
    from workers.openai_agent import unwrapped_note

    want = answer if taken == "answer" else "---\ntitle: A\n---\nFixed.\n"
    assert unwrapped_note(answer, given) == want


def test_doctor_names_a_failed_write_beside_files_not_tried_yet(run_cli, kb):
    """Job files of two jobs wait: one not tried yet (a commit a moment ago), one whose
    write failed. doctor named the one error that sorted first, "not written yet", and
    said ok of a folder no tick could write."""
    from orchestrator.state.store import Store

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha")
    assert run_cli("doctor").exit_code == 0
    failed = "the folder went away (a mount gone)"
    with Store.open(kb.state) as s:
        for job_id, error in ((1, "not written yet"), (2, failed)):
            s.conn.execute(
                "INSERT INTO review_jobs (status, model_partition, grouping, job_dir, created_at, "
                "updated_at) VALUES ('completed', 'offline', 'note', ?, 'x', 'x')",
                (f"jobs/review-job-{job_id}",),
            )
            s.conn.execute(
                "INSERT INTO job_files_due (job_id, since, error) VALUES (?, 'x', ?)",
                (job_id, error),
            )
    res = run_cli("doctor")
    assert res.exit_code == 1
    [line] = [x for x in res.stdout.splitlines() if "MANIFEST.json" in x]
    assert line.startswith(
        f"problem: 2 job(s) whose MANIFEST.json and results wait to be written ({failed})"
    )


@pytest.mark.parametrize(
    ("error", "then"),
    [
        ("[Errno 28] No space left on device", "the control process writes them at its next tick with room"),
        (
            "[Errno 13] Permission denied: '/srv/kb/.reviewq/jobs/review-job-1/results'",
            "the control process tries again at each tick; mend the cause (reviewq rewrite-files writes them at once)",
        ),
        ("not written yet", "the control process writes them at its next tick"),
        (
            "[Errno 11] another reviewq process is writing this folder: '/srv/kb/.reviewq/jobs/review-job-1'",
            "the control process writes them once that process lets go of the folder; one stopped (Ctrl-Z) or hung holds it for good: resume or end it (the log's job.folder_held names its pid)",
        ),
        # No control process runs: nothing writes them at a tick (doctor said one would).
        ("[Errno 28] No space left on device", "make room; no control process runs for this state folder: reviewq rewrite-files writes them at once"),
        (
            "[Errno 13] Permission denied: '/srv/kb/.reviewq/jobs/review-job-1/results'",
            "mend the cause; no control process runs for this state folder: reviewq rewrite-files writes them at once",
        ),
        ("not written yet", "no control process runs for this state folder: reviewq rewrite-files writes them at once"),
    ],
)  # fmt: skip
def test_doctor_says_how_unwritten_job_files_get_written_by_their_error(run_cli, kb, error, then):
    """doctor said job files kept back by any error are written "at its next tick with
    room": of a folder the service user may not write (EACCES), room is not the matter.
    Of a folder another process holds (K57), it said to run rewrite-files, which waits
    for that lock with no word for as long as the holder (a command stopped by Ctrl-Z)
    keeps it."""
    from orchestrator.state.store import Store

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha")
    assert run_cli("doctor").exit_code == 0
    with Store.open(kb.state) as s:
        s.conn.execute(
            "INSERT INTO review_jobs (status, model_partition, grouping, job_dir, created_at, "
            "updated_at) VALUES ('completed', 'offline', 'note', 'jobs/review-job-1', 'x', 'x')"
        )
        s.conn.execute(
            "INSERT INTO job_files_due (job_id, since, error) VALUES (1, 'x', ?)", (error,)
        )
    lock = (kb.state / "control.lock").open("w")
    if "no control" not in then:  # held as a control process holds it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
    with lock:
        res = run_cli("doctor")
    tried = error != "not written yet"  # not yet tried is no problem: the next tick writes them
    assert res.exit_code == (1 if tried else 0)
    [line] = [x for x in res.stdout.splitlines() if "MANIFEST.json" in x]
    assert line == (
        f"{'problem' if tried else 'ok'}: 1 job(s) whose MANIFEST.json and results wait to be "
        f"written ({error}); {then}"
    )


def test_an_agent_killed_by_a_machine_limit_is_said_by_its_signal(tmp_path):
    """An agent ended by a limit of the machine (here a real RLIMIT_FSIZE: the kernel sends
    SIGXFSZ) was said as "exited -25", naming neither the signal nor the limit to raise."""
    from workers.attempt import run_attempt

    script = 'ulimit -f 1; exec head -c 100000 /dev/zero > "$0/big"'
    profile = ReviewerProfile(name="c", kind="command", command=("sh", "-c", script, str(tmp_path)))
    spec = AttemptSpec(
        "review", 1, 1, tmp_path / "p", tmp_path / "o", tmp_path, tmp_path / "a", tmp_path, "m"
    )
    out = run_attempt(for_profile(profile), spec, timeout_s=30, max_turns=1)
    assert out.exit_code == -signal.SIGXFSZ, out
    assert "killed by SIGXFSZ" in out.reasons[0] and "RLIMIT_FSIZE" in out.reasons[0], out.reasons


def test_a_trusted_folder_whose_codex_folder_cannot_be_searched_is_refused_in_one_line(tmp_path):
    """A managed layer trusts a folder above the job folder whose `.codex` this user may
    not search: `Path.is_file` raised PermissionError there (it passes over only "not
    found"), out of the adapter's check, where Codex cannot rule out a config it would
    load either. Run without the capabilities that pass a mode (as root here)."""
    from .conftest import bound_by_file_modes

    wrap = bound_by_file_modes()
    trusted = tmp_path / "srv"
    job_dir = trusted / "state" / "jobs" / "job-1"
    job_dir.mkdir(parents=True)
    (trusted / ".codex").mkdir()
    (trusted / ".codex" / "config.toml").write_text("[mcp_servers.x]\ncommand = 'true'\n")
    (trusted / ".codex").chmod(0o000)
    managed = tmp_path / "managed_config.toml"
    managed.write_text(f'[projects."{trusted}"]\ntrust_level = "trusted"\n')
    script = (
        "import sys; from pathlib import Path; from workers.reviewers import codex; "
        "codex._MANAGED_CONFIG = Path(sys.argv[1]); print(codex._machine_refuses(Path(sys.argv[2])))"
    )
    try:
        res = subprocess.run(
            [*wrap, sys.executable, "-c", script, str(managed), str(job_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).parent.parent,
        )
    finally:
        (trusted / ".codex").chmod(0o755)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == (
        f"{managed} trusts {trusted}, so Codex would load {trusted}/.codex/config.toml, "
        "which this user cannot read (Permission denied); no -c can untrust it"
    ), res.stdout
