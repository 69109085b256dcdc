"""What the real vendor CLIs print when no model answers, and what reviewq makes of it.

The outputs below were captured from Claude Code 2.1.328, Codex CLI 0.169.0 and Gemini CLI
0.61.0 run against tests/vendor_model.py (a 401, a port nothing listens on); the real
programs run in tests/test_vendor_clis.py. Here the adapters read them, the control process
acts on the outcome, and the smaller defects of issue 12 each have a test.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.config import ConfigError, ReviewerProfile, load_settings
from orchestrator.control.control import Control
from orchestrator.control.followup import FollowUp
from orchestrator.state.status import Pause, pause_words, status
from orchestrator.state.words import FAILURES
from orchestrator.state.workspace import Workspace
from orchestrator.sweeps.producer import SweepRequest, enqueue
from workers.attempt import BURNED_OUT, REVIEWER_FAILURE, run_attempt
from workers.reviewers import AttemptSpec, Command, Reviewer, for_profile
from workers.reviewers.vendor import failure_kind, instruction

from .conftest import ends_within, process_gone

CLAUDE_401 = {
    "type": "result",
    "subtype": "success",
    "is_error": True,
    "api_error_status": 401,
    "terminal_reason": "api_error",
    "result": "Invalid API key · Fix external API key",
    "num_turns": 1,
    "total_cost_usd": 0,
    "session_id": "05a05c58-85e0-4871-89a7-1ca176282ee3",
    "usage": {"input_tokens": 0, "output_tokens": 0},
}
CLAUDE_DOWN = {
    **CLAUDE_401,
    "api_error_status": None,
    "result": "API Error: Connection refused — a firewall or proxy may be blocking it (ECONNREFUSED)",
}
# Claude Code 2.1.152 (six months old) ends an API error with terminal_reason "completed":
# its dead endpoint and cut stream were the job's no-output, failing the job.
CLAUDE_OLD_DOWN = {
    **CLAUDE_401,
    "api_error_status": None,
    "terminal_reason": "completed",
    "result": "API Error: Unable to connect to API (ECONNRESET)",
}
CLAUDE_OLD_CUT = {
    **CLAUDE_OLD_DOWN,
    "result": "API Error: API returned an empty or malformed response (HTTP 200) — check for "
    "a proxy or gateway intercepting the request",
}
CLAUDE_MAX_TURNS = {
    "type": "result",
    "subtype": "error_max_turns",
    "is_error": True,
    "api_error_status": None,
    "terminal_reason": "max_turns",
    "num_turns": 8,
}
CODEX_HEAD = [
    {"type": "thread.started", "thread_id": "01a20873-af71-7121-a6d0-754fa97bd063"},
    {
        "type": "item.completed",
        "item": {"id": "item_0", "type": "error", "message": "Model metadata for `m` not found."},
    },
    {"type": "turn.started"},
]
CODEX_401 = [
    *CODEX_HEAD,
    {
        "type": "error",
        "message": "unexpected status 401 Unauthorized: Incorrect API key provided: sk-expired., "
        "url: http://127.0.0.1:8080/auth/v1/responses",
    },
    {
        "type": "turn.failed",
        "error": {
            "message": "unexpected status 401 Unauthorized: Incorrect API key provided: "
            "sk-expired., url: http://127.0.0.1:8080/auth/v1/responses"
        },
    },
]
CODEX_DOWN = [
    *CODEX_HEAD,
    *[
        {
            "type": "error",
            "message": "Reconnecting... waiting for network (Connection failed: error sending request)",
        }
    ]
    * 3,
]
# The server answered a first turn, then broke (tests/vendor_model.py midcut, midevent).
CODEX_CUT = [
    *CODEX_HEAD,
    {"type": "item.completed", "item": {"id": "item_1", "type": "command_execution"}},
    {
        "type": "error",
        "message": "stream disconnected before completion: stream closed before response.completed",
    },
    {
        "type": "turn.failed",
        "error": {
            "message": "stream disconnected before completion: stream closed before response.completed"
        },
    },
]
CODEX_FAILED = [
    {
        **ev,
        "message": "stream disconnected before completion: The server had an error while processing your request.",
    }
    if ev.get("type") == "error"
    else ev
    for ev in CODEX_CUT
]


def _codex_turn_failed(message: str) -> list[dict]:
    """A run whose first turn was answered and whose next request failed, as Codex says it."""
    return [
        *CODEX_CUT[:4],
        {"type": "error", "message": message},
        {"type": "turn.failed", "error": {"message": message}},
    ]


# Codex 0.169 drops a 500's words for its own (tests/vendor_model.py mid-s500), and says a
# 403 or 404 with code model_not_found in the server's words without the status (mid-s403).
CODEX_500 = _codex_turn_failed(
    "We’re currently experiencing high demand, which may cause temporary errors."
)
CODEX_OVERLOADED = _codex_turn_failed(
    "Selected model is at capacity. Please try a different model."
)
CODEX_NO_MODEL = _codex_turn_failed("Project does not have access to model scripted-codex")
CODEX_STDERR = (
    'WARNING: proceeding, even though we could not create PATH aliases: Refusing to create helper binaries under temporary dir "/tmp"\n'
    "Reading additional input from stdin...\n"
)
GEMINI_401_STDERR = """Warning: 256-color support not detected.
Ripgrep is not available. Falling back to GrepTool.
    at async Turn.run (file:///x/bundle/chunk-JDPZ4CE3.js:333001:24) {
  status: 401
}
{
  "session_id": "bf8c2ba4-fc03-4184-aa1b-04368ea24b06",
  "error": {
    "type": "Error",
    "message": "{\\"error\\":{\\"code\\":401,\\"message\\":\\"API key expired. Please renew the API key.\\",\\"status\\":\\"UNAUTHENTICATED\\"}}",
    "code": 401
  }
}
"""
GEMINI_DOWN_STDERR = """Warning: 256-color support not detected.
Error when talking to Gemini API Full report available at: /tmp/gemini-client-error.json Error: exception TypeError: fetch failed sending request
{
  "session_id": "4555cc11-7063-4493-8e8e-d7cbbe0b9e53",
  "error": {
    "type": "Error",
    "message": "exception TypeError: fetch failed sending request",
    "code": 1
  }
}
"""
GEMINI_CUT_STDERR = """Warning: 256-color support not detected.
Ripgrep is not available. Falling back to GrepTool.
Error when talking to Gemini API Full report available at: /tmp/gemini-client-error-Turn.run-sendMessageStream.json Error: Incomplete JSON segment at the end
    at ApiClient.processStreamResponse_1 (file:///x/bundle/chunk-JDPZ4CE3.js:267620:21)
{
  "session_id": "82608280-184f-4936-b421-99153ce9c73a",
  "error": {
    "type": "Error",
    "message": "Incomplete JSON segment at the end",
    "code": 1
  }
}
"""
GEMINI_UNTRUSTED_STDERR = (
    "\x1b[31mGemini CLI is not running in a trusted directory. To proceed, either use "
    "`--skip-trust`, set the `GEMINI_CLI_TRUST_WORKSPACE=true` environment variable, or trust "
    "this directory in interactive mode.\x1b[0m"
)


def _spec(tmp_path: Path) -> AttemptSpec:
    job = tmp_path / "state" / "jobs" / "review-job-1"
    att = job / "attempt-1"
    att.mkdir(parents=True, exist_ok=True)
    return AttemptSpec("review", 1, 1, att / "prompt.md", att / "out.md", job, att, tmp_path, "m")


def _telemetry(tmp_path, kind, stdout="", stderr="", **profile):
    spec = _spec(tmp_path)
    spec.stdout_path.write_text(stdout)
    spec.stderr_path.write_text(stderr)
    p = ReviewerProfile(name=kind, kind=kind, model="m", **profile)
    return for_profile(p).telemetry(spec)


def _lines(events: list[dict]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


@pytest.mark.parametrize(
    ("kind", "stdout", "stderr", "failure", "error"),
    [
        ("claude", json.dumps(CLAUDE_401), "", "auth", "Invalid API key · Fix external API key"),
        ("claude", json.dumps(CLAUDE_DOWN), "", "unreachable", "API Error: Connection refused"),
        ("claude", json.dumps(CLAUDE_OLD_DOWN), "", "unreachable", "API Error: Unable to"),
        ("claude", json.dumps(CLAUDE_OLD_CUT), "", "server", "API Error: API returned an empty"),
        ("codex", _lines(CODEX_401), CODEX_STDERR, "auth", "unexpected status 401 Unauthorized"),
        ("codex", _lines(CODEX_DOWN), CODEX_STDERR, "unreachable", "Reconnecting... waiting"),
        ("gemini", "", GEMINI_401_STDERR, "auth", "API key expired. Please renew the API key."),
        ("gemini", "", GEMINI_DOWN_STDERR, "unreachable", "exception TypeError: fetch failed"),
        ("codex", _lines(CODEX_CUT), CODEX_STDERR, "server", "stream disconnected before"),
        ("codex", _lines(CODEX_FAILED), CODEX_STDERR, "server", "stream disconnected before"),
        ("codex", _lines(CODEX_500), CODEX_STDERR, "server", "We’re currently experiencing"),
        ("codex", _lines(CODEX_OVERLOADED), CODEX_STDERR, "server", "Selected model is at"),
        ("codex", _lines(CODEX_NO_MODEL), CODEX_STDERR, "not-found", "Project does not have"),
        ("gemini", "", GEMINI_CUT_STDERR, "unreachable", "Incomplete JSON segment at the end"),
    ],
)
def test_each_cli_s_own_error_names_a_reviewer_failure(
    tmp_path, kind, stdout, stderr, failure, error
):
    t = _telemetry(tmp_path, kind, stdout, stderr)
    assert t.failure == failure
    assert t.error.startswith(error) and len(t.error) <= 300


def test_a_gemini_policy_the_engine_drops_is_the_profile_s_failure(tmp_path):
    # What Gemini 0.61 printed for the policy reviewq wrote before: no write_file, so no
    # job could ever produce output.
    stderr = (
        "[USER] Policy file error in gemini-policy.toml:\n"
        "  Unsafe regex pattern (potential ReDoS)\n"
        'Pattern: "file_path":"\\/job/(?:(?!\\.\\.)[^"\\\\])*"\n'
    )
    t = _telemetry(tmp_path, "gemini", '{"session_id": "s", "response": "done"}', stderr)
    assert t.failure == "config"
    assert t.error == (
        "Policy file error in gemini-policy.toml: Unsafe regex pattern (potential ReDoS)"
    )


# What Gemini CLI 0.61.0 and Codex CLI 0.169.0 print for a flag they lack (as an older CLI
# lacks one reviewq passes): their complaint, then their usage, whose last line the reason
# was ("-h, --help  Show help [boolean]", "For more information, try '--help'.").
GEMINI_REFUSED_STDERR = (
    "Unknown arguments: bogus-flag, bogusFlag\n"
    "Usage: gemini [options] [command]\n\n"
    "Gemini CLI - Defaults to interactive mode.\n\n"
    "Options:\n"
    "  -v, --version                   Show version number  [boolean]\n"
    "  -h, --help                      Show help  [boolean]\n"
)
CODEX_REFUSED_STDERR = (
    "error: unexpected argument '--bogus-flag' found\n\n"
    "  tip: to pass '--bogus-flag' as a value, use '-- --bogus-flag'\n\n"
    "Usage: codex exec [OPTIONS] [PROMPT] [COMMAND]\n\n"
    "For more information, try '--help'.\n"
)


@pytest.mark.parametrize(
    ("kind", "stderr", "said"),
    [
        ("gemini", GEMINI_REFUSED_STDERR, "Unknown arguments: bogus-flag, bogusFlag"),
        ("codex", CODEX_REFUSED_STDERR, "error: unexpected argument '--bogus-flag' found"),
    ],
)
def test_a_flag_the_cli_does_not_know_is_said_in_its_words_not_its_usage_s_last_line(
    tmp_path, kind, stderr, said
):
    t = _telemetry(tmp_path, kind, "", stderr)
    assert t.error == said


def test_a_gemini_cli_without_write_file_is_the_profile_s_failure_naming_its_version(tmp_path):
    # What Gemini CLI 0.30.1 does with reviewq's flags: headless, its registry has no
    # write_file, the model's call to it fails, and it exits 0 with no output. That was a
    # job that "exited 0 without writing bundle-output.md", failed as the note's.
    stderr = (
        'Error executing tool write_file: Tool "write_file" not found. Did you mean one '
        'of: "read_file", "write_todos", "cli_help"?\n'
    )
    exe = tmp_path / "gemini"
    exe.write_text("#!/bin/sh\necho 0.30.1\n")
    exe.chmod(0o755)
    stdout = '{"session_id": "s", "response": "done", "stats": {}}'
    t = _telemetry(tmp_path, "gemini", stdout, stderr, executable=str(exe))
    assert t.failure == "config"
    assert t.error.startswith(f"{exe} 0.30.1 has no write_file tool"), t.error
    assert t.error.endswith("known to work with 0.61.0"), t.error


@pytest.mark.parametrize(
    "message",
    [
        "API Error: unable to get local issuer certificate",
        "API Error: certificate has expired",
        "API Error: The socket connection was closed unexpectedly.",
        "Request was aborted.",
    ],
)
def test_a_claude_api_error_with_no_http_status_is_a_reviewer_failure(tmp_path, message):
    # api_error_status null: nothing answered, whatever the words; with a turn counted,
    # it was "no-output" before, counted against the job.
    t = _telemetry(tmp_path, "claude", json.dumps({**CLAUDE_DOWN, "result": message}))
    assert (t.failure, t.error) == ("unreachable", message)


def test_a_claude_answer_it_could_not_read_is_the_server_s_failure(tmp_path):
    """A stream cut mid-answer, or one that held an error event: Claude says "API returned
    an empty or malformed response (HTTP 200)" with no api_error_status, and it was named
    `unreachable`, sending the operator to look at a network the server had answered on."""
    message = (
        "API Error: API returned an empty or malformed response (HTTP 200) — check for a "
        "proxy or gateway intercepting the request."
    )
    t = _telemetry(tmp_path, "claude", json.dumps({**CLAUDE_DOWN, "result": message}))
    assert (t.failure, t.error) == ("server", message)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        # Google's words for every 429, a per-minute limit too: a hint, not a quota spent.
        ("Resource has been exhausted (e.g. check quota).", "rate-limit"),
        (
            "You exceeded your current quota, please check your plan and billing details.",
            "quota",
        ),
        ("Rate limit reached for m on tokens per min (TPM): Limit 30000", "rate-limit"),
    ],
)
def test_a_429_is_a_spent_quota_only_when_its_words_say_so(message, kind):
    assert failure_kind(message, 429) == kind


def test_limits_and_job_errors_are_no_reviewer_failure(tmp_path):
    assert _telemetry(tmp_path, "claude", json.dumps(CLAUDE_MAX_TURNS)).failure is None
    too_long = {**CLAUDE_401, "api_error_status": 400, "result": "prompt is too long"}
    assert _telemetry(tmp_path, "claude", json.dumps(too_long)).failure is None


def _codex_failed(message: str, times: int = 1) -> str:
    return _lines([*CODEX_HEAD, *[{"type": "error", "message": message}] * times])


@pytest.mark.parametrize("host", ["network-gw.example", "quota.example", "h.example/login"])
def test_a_codex_error_is_judged_by_its_words_not_the_url_in_it(tmp_path, host):
    """Codex ends its errors with ", url: …": behind a gateway whose address says
    "network" (or "quota", "/login"), a job's own 400 was the reviewer's failure, and
    the job waited instead of being counted; connect_timeout could even end the run."""
    said = (
        "unexpected status 400 Bad Request: prompt is too long, "
        f"url: https://{host}/v1/responses, request id: req-1"
    )
    t = _telemetry(tmp_path, "codex", _codex_failed(said))
    assert (t.failure, t.error) == (None, said)
    spec = _spec(tmp_path)
    spec.stdout_path.write_text(_codex_failed(said, times=3))
    codex = for_profile(ReviewerProfile(name="codex", kind="codex", model="m"))
    assert codex.unreachable(spec) is None
    # Its words still say so when no model answered.
    down = f"Reconnecting... 2/5 (error sending request for url (https://{host}/v1/responses))"
    assert _telemetry(tmp_path, "codex", _codex_failed(down)).failure == "unreachable"


# Gemini CLI 0.61 with a read-only HOME: its critical error, then that error's stack.
GEMINI_CRITICAL_STDERR = """\
An unexpected critical error occurred:Error: EROFS: read-only file system, open '/h/.gemini/projects.json.2c.tmp'
    at async open (node:internal/fs/promises:637:25)
    at new ProjectRegistry (file:///n/@google/gemini-cli/bundle/chunk-JDPZ4CE3.js:252867:7)
    at file:///n/@google/gemini-cli/bundle/chunk-JDPZ4CE3.js:253321:32
    at async main (file:///n/@google/gemini-cli/bundle/gemini-3HFX2LNT.js:17457:5)
"""


@pytest.mark.parametrize(
    ("kind", "stderr", "reason"),
    [
        ("codex", CODEX_STDERR + "Error: unknown model flag\n", "Error: unknown model flag"),
        ("codex", CODEX_STDERR, None),
        ("gemini", GEMINI_401_STDERR, "API key expired. Please renew the API key."),
        ("gemini", GEMINI_UNTRUSTED_STDERR, "Gemini CLI is not running in a trusted directory."),
        ("gemini", GEMINI_CRITICAL_STDERR, "An unexpected critical error occurred:Error: EROFS"),
    ],
)
def test_the_reason_is_the_cli_s_message_never_a_stray_line(tmp_path, kind, stderr, reason):
    # Before: "Reading additional input from stdin..." (Codex) and "}" (Gemini).
    t = _telemetry(tmp_path, kind, "", stderr)
    if reason is None:
        assert t.error is None
    else:
        assert t.error.startswith(reason) and "\x1b" not in t.error


# --- through an attempt: a reviewer failure, not the job's ---------------------------------


def _run(tmp_path, script: str, kind: str = "claude", **fields):
    """run_attempt with a ``kind`` adapter reading what a short Python script prints."""
    spec = _spec(tmp_path)
    reviewer = for_profile(ReviewerProfile(name=kind, kind=kind, model="m", **fields))
    argv = [sys.executable, "-c", script]
    reviewer.command = lambda spec: Command(argv=argv, cwd=tmp_path)  # type: ignore[method-assign]
    return run_attempt(reviewer, spec, timeout_s=fields.get("timeout", 30), max_turns=5)


def test_a_401_after_minutes_of_retries_is_a_reviewer_failure_not_no_output(tmp_path):
    # Claude retries a 401 for minutes, so the launch window has long passed when it exits.
    script = f"import sys; print({json.dumps(json.dumps(CLAUDE_401))}); sys.exit(1)"
    out = _run(tmp_path, script)
    assert out.classification == REVIEWER_FAILURE
    assert out.reasons == ["auth: Invalid API key · Fix external API key"]


# What Claude Code 2.1.328 and Codex 0.169 end with when the model stops at its output-token
# cap (tests/vendor_model.py maxtokens).
CLAUDE_MAX_OUTPUT = {
    **CLAUDE_DOWN,
    "num_turns": 4,
    "api_error": "max_output_tokens",
    "result": "API Error: Claude's response exceeded the 32000 output token maximum. To "
    "configure this behavior, set the CLAUDE_CODE_MAX_OUTPUT_TOKENS environment variable.",
}
CODEX_MAX_OUTPUT = [
    *CODEX_HEAD,
    {"type": "error", "message": "Incomplete response returned, reason: max_output_tokens"},
    {
        "type": "turn.failed",
        "error": {"message": "Incomplete response returned, reason: max_output_tokens"},
    },
]


@pytest.mark.parametrize(
    ("kind", "said"),
    [("claude", json.dumps(CLAUDE_MAX_OUTPUT)), ("codex", _lines(CODEX_MAX_OUTPUT))],
)
def test_a_model_at_its_output_token_limit_is_burned_out_not_an_outage(tmp_path, kind, said):
    # Claude's was "unreachable" (an API error with no status): the profile paused and
    # the job, too big for one answer, waited for good instead of splitting.
    out = _run(tmp_path, f"import sys; print({said!r}); sys.exit(1)", kind)
    assert out.classification == BURNED_OUT, out.reasons
    assert out.reasons[0].startswith("the model reached its output-token limit: ")


CLAUDE_SYNTHETIC = {
    "type": "assistant",
    "message": {"model": "<synthetic>", "content": [{"type": "text", "text": "API Error"}]},
}
CLAUDE_ANSWER = {"type": "assistant", "message": {"id": "msg_1", "model": "claude-sonnet-4-5"}}


@pytest.mark.parametrize(
    ("kind", "events", "answered"),
    [
        ("claude", [{"type": "system", "subtype": "init"}, CLAUDE_SYNTHETIC], False),
        ("claude", [{"type": "system", "subtype": "init"}, CLAUDE_ANSWER], True),
        ("codex", CODEX_HEAD, False),
        ("codex", CODEX_CUT[:4], True),
    ],
)
def test_a_deadline_with_no_model_answer_is_the_reviewer_s_failure(
    tmp_path, kind, events, answered
):
    """Killed at its deadline, a CLI whose model never answered (a hung endpoint) was
    burned out: counted against the job and splitting it. One that had answers is."""
    script = f"import time; print({_lines(events)!r}, flush=True); time.sleep(60)"
    out = _run(tmp_path, script, kind, timeout=2)
    if answered:
        assert out.classification == BURNED_OUT, out.reasons
    else:
        assert out.classification == REVIEWER_FAILURE, out.reasons
        assert out.reasons == ["unreachable: no model answered within the deadline of 2 s"]


# A Claude whose model answered: killed at its deadline, it is burned out.
ANSWERING = f"print({json.dumps(CLAUDE_ANSWER)!r}, flush=True);"


def _gemini_chats(tmp_path: Path) -> tuple[AttemptSpec, Reviewer, Path]:
    """A Gemini profile whose home has a project for the job folder of ``_spec``, and the
    folder of that project's chat logs (empty)."""
    spec = _spec(tmp_path)
    home = tmp_path / "home"
    gemini = for_profile(
        ReviewerProfile(name="g", kind="gemini", model="m", env={"GEMINI_CLI_HOME": str(home)})
    )
    chats = home / ".gemini" / "tmp" / "review-job-1" / "chats"
    chats.mkdir(parents=True)
    projects = {"projects": {str(spec.job_dir.resolve()): "review-job-1"}}
    (home / ".gemini" / "projects.json").write_text(json.dumps(projects))
    return spec, gemini, chats


def test_gemini_answered_is_read_from_its_chat_log(tmp_path):
    spec, gemini, chats = _gemini_chats(tmp_path)
    # No log holds the prompt, which Gemini records as it sends it: never asked.
    assert not gemini.answered(spec)
    unread = chats / "session-2026-11-26T23-01-0badf00d.jsonl"
    unread.mkdir()  # a log that cannot be read: cannot tell, the deadline stays the job's
    assert gemini.answered(spec)
    unread.rmdir()
    user = {"id": "u", "type": "user", "content": [{"text": instruction(spec)}]}
    log = chats / "session-2026-11-26T23-02-4650ae9e.jsonl"
    # The session context before the instruction lists the KB's folders: long for a big KB.
    listing = "".join(f"kb/notes/topic-{i}/\n" for i in range(8000))
    context = {"$set": {"messages": [{"type": "user", "content": [{"text": listing}]}]}}
    log.write_text(_lines([{"sessionId": "4650ae9e", "kind": "main"}, context, user]))
    assert not gemini.answered(spec)
    log.write_text(log.read_text() + _lines([{"id": "g", "type": "gemini", "content": ""}]))
    assert gemini.answered(spec)


def test_each_cli_says_whether_it_sent_its_prompt(tmp_path):
    """What decides a launch failure past the 15 s launch window: a CLI that never asked a
    model failed at its start, however slowly a loaded machine started it."""
    spec, gemini, chats = _gemini_chats(tmp_path)
    assert not gemini.asked(spec)  # it named the job folder, and no log holds the prompt
    unread = chats / "session-2026-11-26T23-01-0badf00d.jsonl"
    unread.mkdir()  # a log that cannot be read: cannot tell, so asked
    assert gemini.asked(spec)
    unread.rmdir()
    user = {"id": "u", "type": "user", "content": [{"text": instruction(spec)}]}
    (chats / "session-2026-11-26T23-02-4650ae9e.jsonl").write_text(_lines([user]))
    assert gemini.asked(spec)
    (tmp_path / "home" / ".gemini" / "projects.json").unlink()
    assert not gemini.asked(spec)  # it did not get as far as the job folder
    for kind, first in (
        ("claude", {"type": "system", "subtype": "init", "session_id": "s"}),
        ("codex", {"type": "thread.started", "thread_id": "t"}),
    ):
        cli = for_profile(ReviewerProfile(name=kind, kind=kind, model="m"))
        spec.stdout_path.write_text("")  # a flag refused: its words on stderr alone
        assert not cli.asked(spec), kind
        spec.stdout_path.write_text(_lines([first]))
        assert cli.asked(spec), kind
    command = for_profile(ReviewerProfile(name="cmd", kind="command", command=("true",)))
    assert command.asked(spec)  # a command says nothing of it: the launch window decides


def test_gemini_asked_finds_its_prompt_in_a_folder_named_with_a_quote(tmp_path):
    """Gemini's chat log is JSON lines (JSON.stringify: a quote and a backslash escaped,
    other characters as they are), so the prompt's path in it was not the path reviewq
    looked for: a Gemini that asked in a KB under a folder named with `"` or `\\`, then
    crashed past the launch window, read as never asked (a launch failure: the note that
    crashed it never failed, the profile paused), and one that answered as unanswered."""
    spec, gemini, chats = _gemini_chats(tmp_path / 'my "kb" \\ é')
    user = {"id": "u", "type": "user", "content": [{"text": instruction(spec)}]}
    model = {"id": "g", "type": "gemini", "content": "ok", "tokens": {"input": 1}}
    log = chats / "session-2026-11-26T23-02-4650ae9e.jsonl"
    log.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in (user, model)))
    assert gemini.asked(spec)
    assert gemini.answered(spec)


def test_gemini_answered_reads_the_newest_chat_log_of_its_attempt(tmp_path):
    """A chat log is named by the minute its session began and a random id: a run of the
    same attempt again in the same folder (its task queued again by a stopping worker)
    within that minute was told apart by the id, and the killed run's answers said a hung
    endpoint's deadline was the job's, or its silence that a model's answers were not."""
    spec, gemini, chats = _gemini_chats(tmp_path)
    user = {"id": "u", "type": "user", "content": [{"text": instruction(spec)}]}
    killed = chats / "session-2026-11-26T23-02-ffffffff.jsonl"
    killed.write_text(_lines([user, {"id": "g", "type": "gemini", "content": ""}]))
    os.utime(killed, (1_000_000_000, 1_000_000_000))
    (chats / "session-2026-11-26T23-02-00000000.jsonl").write_text(_lines([user]))
    assert not gemini.answered(spec)


# What Gemini 0.61 left when the server answered a turn after a tool call with an error
# inside its 200 stream (tests/vendor_model.py midevent): the SDK drops the error object,
# and the turn is recorded as a model message with no content and no usage.
GEMINI_TOOL_TURN = {
    "id": "g1",
    "type": "gemini",
    "content": "",
    "tokens": {"input": 1000, "output": 100, "total": 1100},
    "model": "gemini-2.5-pro",
    "toolCalls": [{"id": "read_file_1", "name": "read_file", "args": {"file_path": "p.md"}}],
}
GEMINI_NOTHING = {"id": "g2", "type": "gemini", "content": [], "thoughts": [], "tokens": None}
GEMINI_EMPTY_DOC = {"session_id": "11a3ee57", "response": "", "stats": {"models": {}}}


@pytest.mark.parametrize(
    ("last", "doc", "failure"),
    [
        (GEMINI_NOTHING, GEMINI_EMPTY_DOC, "server"),
        # On the first turn Gemini retries, then says so in its own words.
        (
            GEMINI_NOTHING,
            {
                **GEMINI_EMPTY_DOC,
                "error": {
                    "type": "INVALID_STREAM",
                    "message": "Model stream ended without a finish reason.",
                },
            },
            "server",
        ),
        # A model's own empty answer carries its usage: the job's.
        ({**GEMINI_NOTHING, "tokens": {"input": 1000, "output": 0}}, GEMINI_EMPTY_DOC, None),
    ],
    ids=["after-a-tool-call", "first-turn", "a-model-s-empty-answer"],
)
def test_a_gemini_turn_the_server_failed_inside_a_200_is_the_reviewer_s_failure(
    tmp_path, last, doc, failure
):
    """Gemini exits 0 with an empty answer: a no-output counted against the job, and
    nothing said that the server had failed."""
    spec, gemini, chats = _gemini_chats(tmp_path)
    user = {"id": "u", "type": "user", "content": [{"text": instruction(spec)}]}
    said = {"id": "r", "type": "user", "content": [{"functionResponse": {"id": "read_file_1"}}]}
    log = chats / "session-2026-11-27T03-30-11a3ee57.jsonl"
    log.write_text(_lines([user, GEMINI_TOOL_TURN, said, last, {"$set": {"lastUpdated": "x"}}]))
    spec.stdout_path.write_text(json.dumps(doc, indent=2))
    spec.stderr_path.write_text("Warning: 256-color support not detected.\n")
    t = gemini.telemetry(spec)
    assert t.failure == failure, t
    if doc is GEMINI_EMPTY_DOC and failure:
        assert t.error.startswith("the endpoint's last answer (HTTP 200) held no content")


@pytest.mark.parametrize("whole", [False, True], ids=["cut-short", "whole"])
def test_a_bundle_left_unfinished_by_a_rate_limit_is_a_reviewer_failure(tmp_path, whole):
    """Claude wrote a long bundle in two steps and was rate-limited between them: the half
    it left was judged as the job's invalid output, counted, and three escalated the
    pairs. A bundle it finished before the outage is still its output."""
    pairs = [("kb/notes/a.md", f"kb/instructions/review-gates/p/g{i}.md") for i in (1, 2)]
    job = _spec(tmp_path).job_dir
    manifest = {"pairs": [{"note_path": n, "gate_path": g} for n, g in pairs]}
    (job / "MANIFEST.json").write_text(json.dumps(manifest))
    blocks = [
        f"=== PAIR REVIEW START: {n} :: {g} ===\nFine.\n## Result: PASS\n"
        f"=== PAIR REVIEW END: {n} :: {g} ===\n"
        for n, g in pairs
    ]
    output = "".join(blocks if whole else blocks[:1])
    limited = {
        **CLAUDE_401,
        "api_error_status": 429,
        "result": "API Error: 429 rate_limit_error: Number of request tokens has exceeded "
        "your per-minute rate limit",
        "num_turns": 6,
    }
    script = (
        "import os, sys\n"
        f"open(os.environ['REVIEWQ_OUTPUT_PATH'], 'w').write({output!r})\n"
        f"print({json.dumps(json.dumps(limited))})\n"
        "sys.exit(1)\n"
    )
    out = _run(tmp_path, script)
    if whole:
        assert out.classification == "output" and out.output == output.encode()
    else:
        assert out.classification == REVIEWER_FAILURE, out.reasons
        assert out.reasons[0].startswith("rate-limit: API Error: 429") and out.output is None
        assert "is not judged: it was left unfinished" in out.reasons[-1]


def test_a_fixer_stopped_at_its_turn_limit_after_writing_the_note_is_applied(tmp_path):
    """Claude exits 1 at its turn limit (error_max_turns), after the turn whose Write left
    the whole note: a stop between turns cuts no file short. Read as "did not end
    cleanly", the finished fix was dropped and counted as burned out "with no output"."""
    import dataclasses

    note = "---\ntitle: A\n---\n# A\n\nThe whole body.\n"
    script = (
        "import os, sys\n"
        f"open(os.environ['REVIEWQ_OUTPUT_PATH'], 'w').write({note!r})\n"
        f"print({json.dumps(json.dumps({**CLAUDE_MAX_TURNS, 'num_turns': 5}))})\n"
        "sys.exit(1)\n"
    )
    spec = dataclasses.replace(_spec(tmp_path), task="fix")
    reviewer = for_profile(ReviewerProfile(name="claude", kind="claude", model="m"))
    argv = [sys.executable, "-c", script]
    reviewer.command = lambda spec: Command(argv=argv, cwd=tmp_path)  # type: ignore[method-assign]
    out = run_attempt(reviewer, spec, timeout_s=30, max_turns=5)
    assert out.classification == "output", out.reasons
    assert out.output == note.encode()


def test_a_fixer_that_failed_after_many_turns_without_a_turn_limit_is_not_applied(tmp_path):
    """Only Claude is given --max-turns and stops between turns at it (error_max_turns).
    A fixer of another kind that ran as many turns and then failed part-way through its
    note is not stopped at a turn limit: its note may be cut short, and is not applied."""
    import dataclasses

    head = "---\ntitle: A\n---\n# A\n"
    script = (
        "import json, os, sys\n"
        f"open(os.environ['REVIEWQ_OUTPUT_PATH'], 'w').write({head!r})\n"
        "open(os.environ['REVIEWQ_TELEMETRY_PATH'], 'w').write(json.dumps({'num_turns': 5}))\n"
        "sys.exit(1)\n"
    )
    spec = dataclasses.replace(_spec(tmp_path), task="fix")
    reviewer = for_profile(ReviewerProfile(name="cmd", kind="command", command=("true",)))
    argv = [sys.executable, "-c", script]
    reviewer.command = lambda spec: Command(argv=argv, cwd=tmp_path)  # type: ignore[method-assign]
    out = run_attempt(reviewer, spec, timeout_s=30, max_turns=5)
    assert out.output is None and out.classification != "output", out.reasons
    assert "may be cut short" in out.reasons[-1]


def test_an_agent_is_given_the_workers_environment_as_it_is_at_its_launch(tmp_path, monkeypatch):
    """The worker's environment is read from ``os.environb``'s own dict (its mapping
    cost ~30 µs an agent): a variable set or removed since the worker started is seen so
    by the agent, as through the mapping."""
    monkeypatch.setenv("REVIEWQ_TEST_SET_LATER", "here")
    monkeypatch.setenv("REVIEWQ_TEST_REMOVED", "there")
    monkeypatch.delenv("REVIEWQ_TEST_REMOVED")
    script = (
        "import os\n"
        "seen = [os.environ.get(k, '-') for k in ('REVIEWQ_TEST_SET_LATER', 'REVIEWQ_TEST_REMOVED')]\n"
        "open(os.environ['REVIEWQ_OUTPUT_PATH'], 'w').write(' '.join(seen))\n"
    )
    out = _run(tmp_path, script, kind="command", command=("true",))
    assert out.output == b"here -", out.reasons


def test_connect_timeout_ends_a_cli_that_cannot_reach_its_endpoint(tmp_path):
    # Codex 0.169 prints "Reconnecting..." until its deadline when the endpoint is down.
    lines = _lines(CODEX_DOWN).replace("\n", "\\n")
    script = f"import sys, time; sys.stdout.write('{lines}'); sys.stdout.flush(); time.sleep(60)"
    out = _run(tmp_path, script, kind="codex", timeout=30, connect_timeout=0.5)
    assert out.classification == "reviewer-failure"
    assert out.duration_s < 10
    assert out.reasons[0].startswith("unreachable: Reconnecting... waiting for network")


def _assert_gone(child: int) -> None:
    """The agent's child is gone within 10 s; killed here if not, so a failing test
    leaves nothing behind."""
    gone = ends_within(child, 10)
    if not process_gone(child):
        os.kill(child, signal.SIGKILL)
    assert gone, f"pid {child} outlived the agent"


def test_a_child_in_a_process_group_of_its_own_is_killed_with_the_agent(tmp_path):
    # Codex 0.169 runs its sandbox (bwrap) in its own process group: killing the agent's
    # group at the deadline left it running, outside any namespace reviewq made.
    pidfile = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time;"
        + ANSWERING
        + "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
        " process_group=0);"
        f"open({str(pidfile)!r}, 'w').write(str(c.pid));"
        "time.sleep(120)"
    )
    out = _run(tmp_path, script, timeout=2)
    assert out.classification == "burned-out"
    _assert_gone(int(pidfile.read_text()))


@pytest.mark.parametrize("end", ["exits", "deadline"])
def test_a_child_that_started_a_session_of_its_own_is_killed_with_the_agent(tmp_path, end):
    # setsid (Node's spawn detached) leaves the agent's group and session: it outlived
    # both the deadline kill and a normal exit, running (and spending) without a deadline.
    pidfile = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time;"
        + ANSWERING
        + "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
        " start_new_session=True);"
        f"open({str(pidfile)!r}, 'w').write(str(c.pid));"
        + ("time.sleep(120)" if end == "deadline" else "sys.exit(0)")
    )
    out = _run(tmp_path, script, timeout=3)
    assert out.classification == ("burned-out" if end == "deadline" else "no-output")
    _assert_gone(int(pidfile.read_text()))


@pytest.mark.parametrize("agent", ["running", "gone", "zombie"])
@pytest.mark.parametrize("session", [True, False])
def test_what_an_agent_started_is_reaped_when_its_worker_died(tmp_path, agent, session):
    """A worker killed while its agent ran: the next worker kills the agent's group from
    the registry, but a process the agent had started in a session of its own (setsid)
    ran on, and when the agent itself had exited nothing at all was killed, not even a
    child left in its group. An agent that had ended but was not yet reaped (a zombie,
    its worker dead and init not come for it yet) reads with no environment: the child
    left in its group ran on, for good (RELIABILITY L13)."""
    import json
    import subprocess

    from workers.attempt import launch, reap_orphans, register_agent, registry_dir

    spec = _spec(tmp_path)
    said = tmp_path / "child.fifo"  # the agent's child says its pid here
    os.mkfifo(said)
    reader = os.open(said, os.O_RDONLY | os.O_NONBLOCK)
    # The child says it itself, once it runs: Popen returns as the child's exec closes its
    # close-on-exec pipe, before the kernel has set up its environment (/proc/PID/environ
    # reads empty a moment more, ~1 spawn in 20 under load), and a reap then found no
    # marker in that session and left the child running.
    child_code = (
        f"import os, time; open({str(said)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    )
    script = (
        "import subprocess, sys, time;"
        f"c = subprocess.Popen([sys.executable, '-c', {child_code!r}],"
        f" start_new_session={session});"
        + ("time.sleep(120)" if agent == "running" else "sys.exit(0)")
    )
    env = {**os.environ, **spec.environment()}
    proc = launch([sys.executable, "-c", script], env, tmp_path, tmp_path / "o", tmp_path / "e")
    worker_state = tmp_path / "worker"
    try:
        entry_path = register_agent(registry_dir(worker_state), spec, proc.pid)
        dead = subprocess.Popen(["true"])
        dead.wait(timeout=10)
        entry = json.loads(entry_path.read_text())
        entry_path.write_text(json.dumps({**entry, "worker_pid": dead.pid}))  # the worker died
        poller = select.poll()  # not select(): it refuses a descriptor past 1023
        poller.register(reader, select.POLLIN)
        assert poller.poll(30_000), "the agent's child did not say its pid within 30 s"
        child = int(os.read(reader, 64))
        if agent == "gone":
            proc.wait(timeout=30)
        elif agent == "zombie":  # ended, and left unreaped as its dead worker left it
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        reap_orphans(worker_state)
        _assert_gone(child)
        assert proc.wait(timeout=10) is not None
    finally:
        os.close(reader)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_a_session_of_another_attempt_is_left_alone(tmp_path):
    """The same job and attempt number in another state folder (another KB on this
    machine) is another attempt: its processes are not this attempt's to kill."""
    import subprocess

    from workers.attempt import attempt_marker, reap_group

    ours, theirs = _spec(tmp_path / "ours"), _spec(tmp_path / "theirs")
    env = {**os.environ, **theirs.environment()}
    other = subprocess.Popen(["sleep", "120"], env=env, start_new_session=True)
    agent = subprocess.Popen(["true"], env={**os.environ, **ours.environment()},
                             start_new_session=True)  # fmt: skip
    try:
        agent.wait(timeout=10)
        reap_group(agent, attempt_marker(ours))
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(timeout=10)


def test_a_reap_leaves_another_kbs_agent_that_took_a_dead_entrys_pid(tmp_path):
    """A dead worker's registry entry whose pid an agent of another KB on this machine
    took since, for a job of the same number (or this job's next attempt, which a live
    worker runs): the reap took that group for the entry's agent by the job's number
    alone, and killed it mid-run."""
    import subprocess

    from workers.attempt import reap_orphans, register_agent, registry_dir

    ours, theirs = _spec(tmp_path / "ours"), _spec(tmp_path / "theirs")
    env = {**os.environ, **theirs.environment()}
    other = subprocess.Popen(["sleep", "120"], env=env, start_new_session=True)
    state = tmp_path / "worker"
    try:
        entry_path = register_agent(registry_dir(state), ours, other.pid)  # the pid it took
        dead = subprocess.Popen(["true"])
        dead.wait(timeout=10)
        entry = json.loads(entry_path.read_text())
        entry_path.write_text(json.dumps({**entry, "worker_pid": dead.pid}))  # the worker died
        assert reap_orphans(state).killed == []
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(timeout=10)


def _dropped_by_a_worker_not_root(fill: Callable[[Path], None], lock: Callable[[Path], None]):
    """An agent's TMPDIR, ``fill``-ed, given to nobody, then ``lock``-ed as the agent left
    it: whether ``workers.attempt._drop`` run as nobody removed it."""
    import shutil
    import subprocess
    import tempfile

    from .conftest import HOST_TMP, PROJECT

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to remove it as a worker that is not root")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if subprocess.run([*nobody, sys.executable, "-c", ""], capture_output=True).returncode:
        # A Python built under root's own home (pyenv's shared libpython in /root): no
        # other user can start it, as no worker not root would run from there.
        pytest.skip(f"nobody cannot run {sys.executable}")
    base = Path(tempfile.mkdtemp(dir=HOST_TMP))  # pytest's basetemp is root's alone
    try:
        scratch = base / "reviewq-job-1-attempt-1-abcdefgh"
        scratch.mkdir()
        fill(scratch)
        for path in [base, *base.rglob("*")]:
            os.chown(path, 65534, 65534)
        lock(scratch)
        drop = f"import workers.attempt as a; a._drop({str(scratch)!r})"
        subprocess.run([*nobody, sys.executable, "-c", drop], cwd=PROJECT, check=True, timeout=60)
        return not scratch.exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_an_agents_read_only_folder_does_not_keep_its_tmpdir_from_a_worker_not_root():
    """An agent that left a read-only folder in its TMPDIR (Go makes its module cache so,
    and a sandboxed CLI may write only there and in its cwd): a worker that is not root
    could remove nothing under it and kept the whole TMPDIR, at every attempt's end and
    every reap, while the registry entry naming it went all the same (L9)."""

    def fill(scratch: Path) -> None:
        (scratch / "go/pkg/mod/example.com@v1").mkdir(parents=True)
        (scratch / "go/pkg/mod/example.com@v1/go.mod").write_text("module example.com\n")

    def lock(scratch: Path) -> None:
        (scratch / "go/pkg/mod/example.com@v1").chmod(0o555)
        (scratch / "go/pkg/mod").chmod(0o555)

    assert _dropped_by_a_worker_not_root(fill, lock)


def test_a_tmpdir_its_agent_made_unreadable_goes_for_a_worker_not_root():
    """L12 made writable again the folders an agent left read-only, found by a walk of its
    TMPDIR: an agent that took the rights off the TMPDIR itself (chmod 000 "$TMPDIR")
    left it to a walk that lists nothing, and it stayed, at every attempt's end and every
    reap, while the entry (or list) naming it went."""

    def fill(scratch: Path) -> None:
        (scratch / "d").mkdir()
        (scratch / "d" / "f").write_text("left\n")

    assert _dropped_by_a_worker_not_root(fill, lambda scratch: scratch.chmod(0))


# Run in a process of its own: a subreaper adopts every orphan of its descendants.
SUBREAPER_SCRIPT = """
import json, os, subprocess, sys, time
from pathlib import Path
import workers.attempt as attempt
from workers.reviewers import AttemptSpec

tmp = Path(sys.argv[1])
att = tmp / "state" / "jobs" / "review-job-1" / "attempt-1"
att.mkdir(parents=True)
spec = AttemptSpec("review", 1, 1, att / "prompt.md", att / "out.md", att.parent, att, tmp, "m")
swept = []
sessions = attempt._sessions
attempt._sessions = lambda: swept.append(1) or sessions()
said = {"subreaper": attempt.become_subreaper()}
env = {**os.environ, **spec.environment()}

def run(script):
    proc = attempt.launch([sys.executable, "-c", script], env, tmp, tmp / "o", tmp / "e")
    proc.wait(timeout=30)
    swept.clear()
    attempt.reap_group(proc, attempt.attempt_marker(spec))
    return len(swept)

said["quiet"] = run("pass")
pidfile = tmp / "child.pid"
escape = (
    "import subprocess, sys; c = subprocess.Popen([sys.executable, '-c',"
    " 'import time; time.sleep(120)'], start_new_session=True);"
    f"open({str(pidfile)!r}, 'w').write(str(c.pid))"
)
said["escaped"] = run(escape)
child = int(pidfile.read_text())
said["zombie_left"] = os.path.exists(f"/proc/{child}")  # killed, and waited for at once
deadline = time.monotonic() + 10
while attempt._strays() and time.monotonic() < deadline:  # the killed child waited for
    time.sleep(0.01)
said["child_left"] = os.path.exists(f"/proc/{child}")
said["after"] = run("pass")
if said["child_left"]:
    os.kill(child, 9)
print(json.dumps(said))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux subreaper")
def test_a_subreaper_sweeps_the_sessions_only_when_an_agent_left_a_process(tmp_path):
    """The sweep of every session of the machine after each agent cost a worker ~0.2 ms
    an agent (more on a busy machine); a worker that adopts its agents' orphans sees by
    its own children whether one left anything, and sweeps only then, killing it."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", SUBREAPER_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said == {
        "subreaper": True,
        "quiet": 0,
        "escaped": 1,
        "zombie_left": False,
        "child_left": False,
        "after": 0,
    }


def test_session_members_are_the_live_processes_of_the_session_in_any_group():
    # What reap_group kills after every attempt: members in a group of their own count,
    # a zombie (already dead, its parent has not waited) does not.
    import subprocess

    from workers.attempt import session_members

    script = (
        "import os, subprocess, sys;"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
        " process_group=0);"
        "z = subprocess.Popen(['true']); os.waitid(os.P_PID, z.pid, os.WEXITED | os.WNOWAIT);"
        "print(c.pid, z.pid, flush=True); sys.stdin.read()"
    )
    leader = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    child = None
    try:
        child, zombie = map(int, leader.stdout.readline().split())
        assert sorted(session_members(leader.pid)) == sorted([leader.pid, child])
        assert zombie not in session_members(leader.pid)
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        if child is not None:
            os.kill(child, signal.SIGKILL)
        leader.wait(10)
        leader.stdout.close()
        leader.stdin.close()


CLAUDE_INIT = {"type": "system", "subtype": "init", "session_id": "bb262194-d4b9"}


def _claude_retry(n: int, status: int | None, error: str) -> dict:
    # Claude Code 2.1.328, stream-json: what it prints while retrying a failing API.
    return {
        "type": "system",
        "subtype": "api_retry",
        "attempt": n,
        "max_retries": 10,
        "retry_delay_ms": 500 * n,
        "error_status": status,
        "error": error,
        "session_id": "bb262194-d4b9",
    }


@pytest.mark.parametrize(
    ("status", "error", "reason"),
    [
        (401, "authentication_failed", "auth: API retry 2/10: status 401, authentication_failed"),
        (None, "unknown", "unreachable: API retry 2/10: no response, unknown"),
    ],
)
def test_connect_timeout_ends_claude_retrying_a_key_or_an_endpoint(tmp_path, status, error, reason):
    # Claude retries a 401 or a dead endpoint ten times, minutes in all, before it exits.
    lines = _lines([CLAUDE_INIT, _claude_retry(1, status, error), _claude_retry(2, status, error)])
    lines = lines.replace("\n", "\\n")
    script = f"import sys, time; sys.stdout.write('{lines}'); sys.stdout.flush(); time.sleep(60)"
    out = _run(tmp_path, script, kind="claude", timeout=30, connect_timeout=0.5)
    assert out.classification == "reviewer-failure"
    assert out.duration_s < 10
    assert out.reasons == [reason]


# Gemini 0.61's stderr while it retries (tests/vendor_model.py s429, a dead port), each
# try followed by its stack trace.
_TRACE = "    at async retryWithBackoff (file:///x/bundle/chunk-JDPZ4CE3.js:308039:23)\n"
GEMINI_429 = '_ApiError: {"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}'
GEMINI_DEAD = "Error: exception TypeError: fetch failed sending request"


def _gemini_retries(n: int, said: str, status: str = "") -> str:
    how = f" with status {status}" if status else ""
    return "Warning: 256-color support not detected.\n" + "".join(
        f"Attempt {i} failed{how}. Retrying with backoff... {said}\n{_TRACE}"
        for i in range(1, n + 1)
    )


@pytest.mark.parametrize(
    ("stderr", "answered", "reason"),
    [
        (
            _gemini_retries(2, GEMINI_429, "429"),
            False,
            "API retry 2: status 429, Resource has been exhausted (e.g. check quota).",
        ),
        (
            _gemini_retries(3, GEMINI_DEAD),
            False,
            "API retry 3: no response, exception TypeError: fetch failed sending request",
        ),
        (_gemini_retries(1, GEMINI_DEAD), False, None),  # one retry may go through
        (_gemini_retries(2, GEMINI_DEAD), True, None),  # a retry between answers
    ],
    ids=["429", "dead", "one-retry", "after-an-answer"],
)
def test_connect_timeout_reads_gemini_s_retries(tmp_path, stderr, answered, reason):
    """Gemini retries a failing API up to ten times, 5-30 s apart: connect_timeout did
    nothing for it, and a deadline that came first said "no model answered", the
    server's words lost."""
    spec, gemini, chats = _gemini_chats(tmp_path)
    user = {"id": "u", "type": "user", "content": [{"text": instruction(spec)}]}
    said = [{"id": "g", "type": "gemini", "content": "reading"}] if answered else []
    (chats / "session-2026-11-27T04-00-0a0b0c0d.jsonl").write_text(_lines([user, *said]))
    spec.stderr_path.write_text(stderr)
    assert gemini.unreachable(spec) == reason


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("claude", [CLAUDE_INIT, _claude_retry(1, 529, "overloaded_error")]),
        (
            "codex",
            [
                *CODEX_HEAD,
                {
                    "type": "error",
                    "message": "Reconnecting... 1/5 (stream disconnected before completion: "
                    "error sending request)",
                },
            ],
        ),
    ],
)
def test_one_retry_that_went_through_is_not_ended_while_the_model_thinks(tmp_path, kind, said):
    """One transient retry, then silence while the model thinks before its first message:
    connect_timeout ended the run and lost the review on its way (and paused the profile)."""
    lines = _lines(said).replace("\n", "\\n")
    script = (
        "import os, sys, time;"
        f"sys.stdout.write('{lines}'); sys.stdout.flush();"
        "time.sleep(1.2);"  # the model thinking: past connect_timeout four times
        "open(os.environ['REVIEWQ_OUTPUT_PATH'], 'w').write('the review')"
    )
    out = _run(tmp_path, script, kind=kind, timeout=30, connect_timeout=0.3)
    assert out.classification == "output", out.reasons


def test_a_claude_retry_between_answers_is_left_alone(tmp_path):
    answered = {
        "type": "assistant",
        "message": {"id": "msg_1", "usage": {"input_tokens": 1000, "output_tokens": 1}},
    }
    lines = _lines([CLAUDE_INIT, answered, _claude_retry(1, 529, "overloaded")])
    lines = lines.replace("\n", "\\n")
    script = f"import sys, time; sys.stdout.write('{lines}'); sys.stdout.flush(); time.sleep(2)"
    out = _run(tmp_path, script, kind="claude", timeout=30, connect_timeout=0.3)
    assert out.duration_s >= 1.5  # not ended at connect_timeout
    # It then exited with no result, still retrying: the model stopped answering.
    assert out.classification == "reviewer-failure"
    assert out.reasons == ["server: API retry 1/10: status 529, overloaded"]


def test_a_killed_claude_run_keeps_the_calls_its_events_show(tmp_path):
    events = [CLAUDE_INIT]
    for i in range(3):  # a call's usage may come with each of its content blocks
        for _ in range(2):
            events.append(
                {
                    "type": "assistant",
                    "message": {
                        "id": f"msg_{i}",
                        "usage": {
                            "input_tokens": 100,
                            "cache_read_input_tokens": 900,
                            "output_tokens": 1,
                        },
                    },
                }
            )
        events.append({"type": "user", "message": {"content": [{"type": "tool_result"}]}})
    t = _telemetry(tmp_path, "claude", _lines(events))
    assert (t.num_turns, t.input_tokens, t.cached_input_tokens) == (3, 3000, 2700)
    assert t.session_id == "bb262194-d4b9" and t.failure is None


# --- Codex: every model call, and the tokens of a killed run ------------------------------


def _rollout(home: Path, thread: str, calls: int, total_in: int, total_out: int) -> None:
    day = home / "sessions" / "2026" / "11" / "23"
    day.mkdir(parents=True)
    recs = [{"type": "session_meta", "payload": {"id": thread}}]
    for i in range(calls):
        recs += [
            {"type": "response_item", "payload": {"type": "function_call", "name": "exec"}},
            {"type": "token_usage_record", "payload": {"response_id": f"resp_{i}"}},
            {
                "type": "event_msg",
                "payload": {
                    "type": "token_count",
                    "info": {
                        "total_token_usage": {
                            "input_tokens": total_in * (i + 1) // calls,
                            "cached_input_tokens": 100 * (i + 1),
                            "output_tokens": total_out * (i + 1) // calls,
                        }
                    },
                },
            },
        ]
    (day / f"rollout-2026-11-23T12-48-14-{thread}.jsonl").write_text(_lines(recs))


def test_codex_turns_count_refused_calls_and_a_killed_run_keeps_its_tokens(tmp_path):
    # Five model calls; the sandbox refused three commands, which --json never shows, and
    # the run was killed at its deadline before turn.completed.
    thread = "01a20873-291e-7bf0-837a-38d8395a8d2d"
    home = tmp_path / "codex-home"
    _rollout(home, thread, calls=5, total_in=5000, total_out=500)
    stdout = _lines(
        [
            {"type": "thread.started", "thread_id": thread},
            {"type": "turn.started"},
            {"type": "item.completed", "item": {"type": "command_execution", "exit_code": 0}},
        ]
    )
    t = _telemetry(tmp_path, "codex", stdout, env={"CODEX_HOME": str(home)})
    assert (t.num_turns, t.input_tokens, t.output_tokens) == (5, 5000, 500)
    assert t.cached_input_tokens == 500


def test_prices_give_codex_and_gemini_a_cost(tmp_path):
    stdout = _lines(
        [
            {"type": "thread.started", "thread_id": "x-no-session-log-here"},
            {
                "type": "turn.completed",
                "usage": {"input_tokens": 3000, "cached_input_tokens": 1000, "output_tokens": 300},
            },
        ]
    )
    from workers.reviewers.base import priced

    p = ReviewerProfile(
        name="c",
        kind="codex",
        model="m",
        env={"CODEX_HOME": str(tmp_path / "none")},
        price_input_per_mtok=1.25,
        price_output_per_mtok=10.0,
        price_cached_input_per_mtok=0.125,
    )
    t = priced(_telemetry(tmp_path, "codex", stdout, env=p.env), p)
    assert t.cost_usd == pytest.approx((2000 * 1.25 + 1000 * 0.125 + 300 * 10.0) / 1e6)
    claude = _telemetry(tmp_path, "claude", json.dumps({**CLAUDE_401, "total_cost_usd": 0.5}))
    assert priced(claude, p).cost_usd == 0.5  # a CLI's own figure wins


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('price_input_per_mtok = "cheap"', "price_input_per_mtok: expected USD per million"),
        ("price_output_per_mtok = -1", "price_output_per_mtok: expected USD per million"),
        ("connect_timeout = 0", "connect_timeout: must be more than 0 seconds"),
        ('connect_timeout = "1h"', "connect_timeout: must be shorter than timeout"),
    ],
)
def test_bad_prices_and_connect_timeouts_are_refused_at_load(tmp_path, line, message):
    (tmp_path / "reviewq.toml").write_text(
        f'[reviewers.c]\nkind = "codex"\nmodel = "m"\ntimeout = "30m"\n{line}\n'
    )
    with pytest.raises(ConfigError, match=message):
        load_settings(tmp_path)


# --- the control process: no count, no escalation, a pause that says why -------------------

QUEUE = "[queue]\nlaunch_failures_before_pause = 2\nlaunch_backoff_seconds = 1\nmax_attempts = 1\n"


def _one_job_and_its_control(kb, reviewer: str = "offline", profile: str = ""):
    """One queued one-pair job of the ``reviewer`` profile (the offline one, or one the
    ``profile`` text adds) and a control on a clock the test moves: (workspace, the job,
    the clock, the control, ``fails(classification, reason, exit_code)`` that dispatches
    the job and takes that outcome of it)."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.write("reviewq.toml", QUEUE + profile)
    ws = Workspace.open(kb.root)
    (job,) = enqueue(ws, SweepRequest(name="cli", reviewer=reviewer, all_gates=True)).jobs
    clock = [datetime.now(UTC)]
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, now=lambda: clock[0], hooks=FollowUp(ws))

    def fails(
        classification: str, reason: str, exit_code: int | None, telemetry: dict | None = None
    ) -> None:
        assert control.dispatch() == 1
        msg = sent[-1]
        control.on_outcome(
            {
                "job_id": msg["job_id"],
                "attempt": msg["attempt"],
                "classification": classification,
                "reasons": [reason],
                "exit_code": exit_code,
                "telemetry": telemetry or {},
            }
        )

    return ws, job, clock, control, fails


_OPENAI = '[reviewers.local]\nkind = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9"\n'


@pytest.mark.parametrize(
    ("reviewer", "profile", "reason", "what"),
    [
        (
            "offline",
            "",
            "auth: Invalid API key · Fix external API key",
            "its CLI reported a failure that is not the job's",
        ),
        # An openai profile has no CLI: the words were a riddle for whoever read them.
        (
            "local",
            _OPENAI,
            'auth: HTTP 401 from http://127.0.0.1:9/v1/chat/completions: {"error": "bad key"}',
            "its endpoint failed in a way that is not the job's",
        ),
        (
            "cmd",
            '[reviewers.cmd]\nkind = "command"\ncommand = ["agent"]\n',
            "rate-limit: HTTP 429",
            "its command reported a failure that is not the job's",
        ),
    ],
    ids=["cli", "openai", "command"],
)
def test_a_reviewer_failure_fails_no_job_raises_no_escalation_and_pauses_with_the_reason(
    kb, reviewer, profile, reason, what
):
    ws, job, clock, control, fails = _one_job_and_its_control(kb, reviewer, profile)
    for _ in range(2):
        fails("reviewer-failure", reason, 1)
        clock[0] += timedelta(seconds=10)  # past the backoff
    row = ws.store.conn.execute(
        "SELECT status, failure_reasons FROM review_jobs WHERE id = ?", (job.review_job_id,)
    ).fetchone()
    assert tuple(row) == ("queued", None)  # max_attempts = 1, yet two attempts did not count
    outcomes = [r[0] for r in ws.store.conn.execute("SELECT outcome FROM attempts")]
    assert outcomes == ["reviewer-failure", "reviewer-failure"]
    assert ws.store.conn.execute("SELECT count(*) FROM escalations").fetchone()[0] == 0
    assert control.dispatch() == 0  # paused
    shown = status(ws.store, ws.settings)["reviewers"][reviewer]
    assert shown["paused_until"]
    assert shown["paused_reason"] == f"{what}: {reason}"  # --json: the kind as stored
    # status says the kind in words: "auth: HTTP 401" read as a code, not a sentence.
    pause = Pause(shown["paused_until"], shown["paused_reason"], shown["paused_since"])
    line = pause_words(ws.store, reviewer, pause)  # status's, doctor's, the report's line
    kind, detail = reason.split(": ", 1)
    # Said once: "{what}: {FAILURES[kind]}: …" told whose failure it was twice.
    assert line.endswith(f"once the cause is mended): {FAILURES[kind]}: {detail}"), line
    ws.store.close()


def test_the_control_honours_the_retry_after_a_workers_endpoint_asked_for(kb):
    """A worker's outcome whose endpoint said ``Retry-After: 30``: the control queued the
    job again after launch_backoff_seconds, into the same refusal, and paused the profile
    for pause_seconds. It waits what was asked, within pause_seconds (QUEUE: 900 s)."""
    ws, job, clock, control, fails = _one_job_and_its_control(kb)

    def wait_s(sql: str) -> float:
        (after,) = ws.store.conn.execute(sql).fetchone()
        return (datetime.fromisoformat(after.replace("Z", "+00:00")) - clock[0]).total_seconds()

    fails("reviewer-failure", "rate-limit: HTTP 429", 1, {"retry_after_s": 30})
    assert wait_s("SELECT not_before FROM review_jobs") == pytest.approx(30, abs=0.01)
    clock[0] += timedelta(seconds=31)
    fails("reviewer-failure", "rate-limit: HTTP 429", 1, {"retry_after_s": 86400})
    assert wait_s("SELECT paused_until FROM reviewer_state") == pytest.approx(900, abs=0.01)
    ws.store.close()


def test_a_pause_shorter_than_the_jobs_backoff_says_and_wakes_for_the_later(kb):
    """A pause a Retry-After shortened (V6) can end before the job's own backoff, which
    dispatch waits for as well: the log said the job waited for the pause's end, earlier
    than it ran, and the control, told of no backoff while paused, dispatched only at its
    next tick (up to reaper_seconds after a pause of a few seconds)."""
    from orchestrator import logs

    ws, job, clock, control, fails = _one_job_and_its_control(kb)
    logs.configure(ws.state_dir)
    woken: list[float] = []
    control.dispatch_in = woken.append
    fails("reviewer-failure", "rate-limit: HTTP 429", 1)
    clock[0] += timedelta(seconds=2)  # past its backoff of 1 s
    # The second failure in a row pauses it (QUEUE), for the 0 s asked: 1 s at least.
    fails("reviewer-failure", "rate-limit: HTTP 429", 1, {"retry_after_s": 0})
    (paused_until,) = ws.store.conn.execute("SELECT paused_until FROM reviewer_state").fetchone()
    (not_before,) = ws.store.conn.execute("SELECT not_before FROM review_jobs").fetchone()
    assert paused_until < not_before  # a pause of 1 s, a backoff of 2 s
    said = [
        json.loads(line)
        for line in (ws.state_dir / "logs" / "reviewq.jsonl").read_text().splitlines()
    ]
    last = [e for e in said if e["event"] == "attempt.reviewer_failed"][-1]
    assert last.get("retry_in_s") == 2 and "waits_for_pause_until" not in last, last
    assert woken == [1, 2]  # a dispatch when the job can run, not at the next tick
    ws.store.close()


def test_resume_starts_a_queued_jobs_launch_backoff_over(kb):
    """OPERATIONS 6.1: `resume` clears the queued jobs' launch backoff. It cleared their
    wait but not their count: the first failure after it waited as the fifth would have
    (160 s by default), for a job the person had just been told runs at once."""
    from orchestrator.control.control import lift_pause

    ws, job, clock, control, fails = _one_job_and_its_control(kb)

    def launch_fails() -> None:
        fails("launch-failure", "could not start 'x'", None)

    def wait_s() -> float:
        (after,) = ws.store.conn.execute(
            "SELECT not_before FROM review_jobs WHERE id = ?", (job.review_job_id,)
        ).fetchone()
        return (datetime.fromisoformat(after.replace("Z", "+00:00")) - clock[0]).total_seconds()

    for _ in range(2):
        launch_fails()
        clock[0] += timedelta(seconds=60)  # past the backoff
    assert control.dispatch() == 0  # paused
    assert lift_pause(ws.store, "offline", clock[0]) is not None
    launch_fails()
    assert wait_s() == pytest.approx(1.0, abs=0.01)  # launch_backoff_seconds, not 1 x 2^2
    ws.store.close()


# --- smaller defects ----------------------------------------------------------------------


def test_a_note_created_in_the_kb_during_a_review_counts_as_touched(kb, run_cli):
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    script = (
        "import os, pathlib; r = os.environ['REVIEWQ_ROOT'];"
        "pathlib.Path(r, 'kb/notes/planted.md').write_text('x');"
        "pathlib.Path(os.environ['REVIEWQ_OUTPUT_PATH']).write_text('nothing')"
    )
    kb.write(
        "reviewq.toml",
        f'[reviewers.cmd]\nkind = "command"\npartition = "p"\n'
        f"command = {json.dumps([sys.executable, '-c', script])}\n",
    )
    sel = run_cli("select", "--all-gates", "--model", "p", "--json")
    made = run_cli("create-jobs", "--input", "-", "--grouping", "note", "--json", input=sel.stdout)
    job_id = made.json()["jobs"][0]["review_job_id"]
    res = run_cli("run-job", str(job_id), "--reviewer", "cmd")
    assert res.exit_code != 0
    ws = Workspace.open(kb.root)
    outcome, reasons = ws.store.conn.execute(
        "SELECT outcome, reasons FROM attempts WHERE job_id = ?", (job_id,)
    ).fetchone()
    ws.close()
    assert outcome == "reviewer-touched-kb"
    assert json.loads(reasons) == ["the reviewer changed kb/notes/planted.md"]


def test_a_job_queued_in_one_partition_does_not_block_another_partition(kb, run_cli):
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    for model in ("model-a", "model-b"):
        sel = run_cli("select", "--all-gates", "--model", model, "--json")
        made = run_cli(
            "create-jobs", "--input", "-", "--grouping", "note", "--json", input=sel.stdout
        )
        assert made.exit_code == 0, made.stderr
        assert len(made.json()["jobs"]) == 1, (model, made.json())
    # and within one partition, the queued job still holds its pairs
    sel = run_cli("select", "--all-gates", "--model", "model-a", "--json")
    again = run_cli("create-jobs", "--input", "-", "--grouping", "note", "--json", input=sel.stdout)
    assert again.json()["jobs"] == []


# --- what an agent leaves behind is read safely ------------------------------------------


def test_an_agent_that_found_no_room_for_its_output_is_a_reviewer_failure(tmp_path, monkeypatch):
    """The disk where the output goes is full: the agent (here as the openai one does,
    after its model answered) says so and exits. A counted no-output before: three of
    them failed the job and escalated its pairs for the worker's full disk."""
    from workers import attempt

    full = os.statvfs_result((4096, 4096, 1000, 2, 2, 1000, 10, 10, 0, 255))
    monkeypatch.setattr(attempt.os, "statvfs", lambda path: full)
    script = (
        "import json, os, sys\n"
        "open(os.environ['REVIEWQ_TELEMETRY_PATH'], 'w').write(json.dumps({'num_turns': 1}))\n"
        "print('openai reviewer: cannot write: [Errno 28] No space left on device', "
        "file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    out = _run(tmp_path, script, kind="command")
    assert out.classification == REVIEWER_FAILURE, out.reasons
    assert out.reasons[0].startswith("disk: the agent said 'No space left on device'")


@pytest.mark.parametrize(
    ("blocks_free", "expected"), [(256, BURNED_OUT), (2, REVIEWER_FAILURE)], ids=["1MiB", "8KiB"]
)
def test_a_deadline_is_the_disks_only_on_a_disk_nearly_full(
    tmp_path, monkeypatch, blocks_free, expected
):
    """1 MiB free, under the 5-MiB output limit, and an agent that never said it lacked
    room: its deadline, not the disk. Read as the disk, a job too big for its deadline
    waited for good (a reviewer failure is never counted, never split), and every five
    paused its profile; a small disk, or a raised limit, did it to every such job. A
    disk with 8 KiB left is full."""
    from workers import attempt

    free = blocks_free
    disk = os.statvfs_result((4096, 4096, 100_000, free, free, 1000, 10, 10, 0, 255))
    monkeypatch.setattr(attempt.os, "statvfs", lambda path: disk)
    spec = _spec(tmp_path)
    reviewer = for_profile(ReviewerProfile(name="c", kind="command", command=("true",)))
    reviewer.command = lambda spec: Command(
        argv=[sys.executable, "-c", "import time; time.sleep(30)"], cwd=tmp_path
    )
    out = run_attempt(reviewer, spec, timeout_s=1, max_turns=5)
    assert out.classification == expected, out.reasons


def test_an_agent_that_said_its_disk_was_full_is_a_reviewer_failure_whatever_is_free_now(
    tmp_path,
):
    """ENOSPC said by the agent is the evidence (the room may be back by the time the
    worker looks, or the full disk was another, its temporary folder's)."""
    script = (
        "import sys\n"
        "print('write failed: ENOSPC: no space left on device, write', file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    out = _run(tmp_path, script, kind="command")
    assert out.classification == REVIEWER_FAILURE, out.reasons
    assert "ENOSPC" in out.reasons[0]


def _bounded_attempt(tmp_path, script: str, kind: str = "command"):
    """_run in a thread, so an attempt that hangs fails the test instead of holding it."""
    import threading

    done: dict = {}
    thread = threading.Thread(
        target=lambda: done.update(out=_run(tmp_path, script, kind=kind, timeout=3)), daemon=True
    )
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the attempt was still running 27 s past its deadline"
    return done["out"]


def test_an_output_left_as_a_fifo_is_refused_not_waited_on(tmp_path):
    out = _bounded_attempt(tmp_path, "import os; os.mkfifo(os.environ['REVIEWQ_OUTPUT_PATH'])")
    assert out.classification == "invalid-output"
    assert out.reasons == ["out.md is not a regular file (a FIFO, socket or device)"]


def test_an_output_left_as_a_unix_socket_is_refused_not_raised(tmp_path):
    """open(2) refuses a socket with ENXIO before the fstat that refuses a FIFO: the error
    escaped the attempt, the worker sent no outcome, and the agent was run again until
    the job failed as "lost its worker"."""
    out = _bounded_attempt(
        tmp_path,
        # Bound by a relative name: a unix socket's path is at most 107 bytes, and a
        # test process of pytest-xdist's has a longer tmp_path (popen-gw0/).
        "import os, socket; s = socket.socket(socket.AF_UNIX); "
        "p = os.environ['REVIEWQ_OUTPUT_PATH']; os.chdir(os.path.dirname(p)); "
        "s.bind(os.path.basename(p))",
    )
    assert out.classification == "invalid-output"
    assert out.reasons == ["out.md is not a regular file (a FIFO, socket or device)"]


def test_an_output_the_worker_may_not_read_is_refused_not_raised(tmp_path, monkeypatch):
    """An agent that leaves its output mode 000 (the worker runs as its user, not root):
    the EACCES escaped the attempt as the socket's ENXIO did. Root reads any mode, so the
    refusal of open(2) is made here rather than by a file."""
    import errno
    import os

    from orchestrator.review import finalize

    path = tmp_path / "out.md"
    path.write_text("x")

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(os, "open", refused)
    with pytest.raises(finalize.FinalizeError, match=r"^out.md cannot be read: Permission denied$"):
        finalize.read_output(path, 100)


def test_an_output_left_as_a_symlink_is_refused_and_what_it_points_at_is_not_read(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-OUTSIDE-THE-JOB\n")
    out = _bounded_attempt(
        tmp_path, f"import os; os.symlink({str(secret)!r}, os.environ['REVIEWQ_OUTPUT_PATH'])"
    )
    assert out.classification == "invalid-output" and out.output is None
    assert out.reasons == ["out.md is a symbolic link, not a file"]


@pytest.mark.parametrize(
    "report",  # a Python expression: the file's text
    [
        """'{"num_turns": 2, "cost_usd": 1' + '0' * 400 + '}'""",  # float() of it overflows
        """'{"num_turns": 1' + '0' * 30 + '}'""",  # past SQLite's INTEGER
        "'[' * 200_000",  # deeper than the JSON parser goes
    ],
)
def test_a_telemetry_report_past_the_parsers_limits_still_gives_an_outcome(tmp_path, report):
    script = (
        "import os, pathlib; e = os.environ; "
        f"pathlib.Path(e['REVIEWQ_TELEMETRY_PATH']).write_text({report}); "
        "pathlib.Path(e['REVIEWQ_OUTPUT_PATH']).write_text('review')"
    )
    out = _bounded_attempt(tmp_path, script)
    assert out.classification == "output" and out.output == b"review"
    assert "cost_usd" not in out.telemetry
    assert out.telemetry.get("num_turns") in (None, 2)


def test_an_adapter_whose_report_reader_raises_still_gives_an_outcome(tmp_path):
    spec = _spec(tmp_path)
    reviewer = for_profile(ReviewerProfile(name="c", kind="command", command=("true",)))

    def broken(spec):
        raise RuntimeError("a shape nobody foresaw")

    reviewer.telemetry = broken  # type: ignore[method-assign]
    out = run_attempt(reviewer, spec, timeout_s=10, max_turns=5)
    assert out.classification == "no-output"
    assert out.telemetry["error"] == "unreadable CLI report: RuntimeError: a shape nobody foresaw"


def test_an_agent_is_awaited_with_more_than_1024_descriptors_open(tmp_path):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 1100: no descriptor can pass 1023")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    held = []
    try:
        while not held or held[-1] < 1030:
            held.append(os.open(os.devnull, os.O_RDONLY))
        out = _run(tmp_path, "print('ok')", kind="command")
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert out.classification == "no-output" and out.exit_code == 0
