"""The ``gemini`` kind: Gemini CLI in headless mode (``-p``, ``--output-format json``).

Gemini CLI's file tools work anywhere in its workspace, which includes the KB, and its
flags cannot narrow a tool to a folder. Its policy engine can: each attempt writes a small
policy file that lets ``write_file``/``replace`` through only for paths in the job folder.
In headless mode any tool call that would need a person's approval is refused, so
everything else that writes (and the shell) stays off.
"""

from __future__ import annotations

import json
import re

from .base import AttemptSpec, Command, Reviewer, Telemetry, telemetry_from_file
from .vendor import add_counts, instruction, json_objects

_POLICY = """\
# Written by reviewq for job {job_id} attempt {attempt}: writes only inside the job folder.
[[rule]]
toolName = ["write_file", "replace"]
argsPattern = {pattern}
decision = "allow"
priority = 900

[[rule]]
toolName = ["run_shell_command", "web_fetch", "google_web_search", "save_memory"]
decision = "deny"
priority = 900
"""


def _js_escape(text: str) -> str:
    # Escape only regex syntax characters: those escapes are valid in every JS regex mode.
    return re.sub(r"([\\^$.*+?()\[\]{}|/])", r"\\\1", text)


def policy_text(spec: AttemptSpec) -> str:
    # The engine matches the tool's arguments as JSON text; refuse ".." so that a path
    # cannot climb out of the job folder after matching its prefix.
    job = json.dumps(str(spec.job_dir.resolve()), ensure_ascii=False)[1:-1]
    pattern = f'"file_path":"{_js_escape(job)}/(?:(?!\\.\\.)[^"\\\\])*"'
    return _POLICY.format(job_id=spec.job_id, attempt=spec.attempt, pattern=json.dumps(pattern))


class GeminiReviewer(Reviewer):
    kind = "gemini"

    def command(self, spec: AttemptSpec) -> Command:
        policy = spec.attempt_dir / "gemini-policy.toml"
        policy.parent.mkdir(parents=True, exist_ok=True)
        policy.write_text(policy_text(spec), encoding="utf-8")
        argv = [
            self.profile.executable or "gemini",
            "--output-format",
            "json",
            "--model",
            self.profile.model,
            "--approval-mode",
            "default",  # never auto_edit/yolo from the user's settings
            "--policy",
            str(policy),
            "--include-directories",
            str(spec.job_dir.resolve()),  # the job folder may live outside the KB
            "-p",  # after the array-valued flags, which would swallow a positional
            instruction(spec),
            *self.profile.args,
        ]
        return Command(argv=argv, env=dict(self.profile.env), cwd=spec.root)

    def telemetry(self, spec: AttemptSpec) -> Telemetry:
        docs = [
            o for o in json_objects(spec.stdout_path) if {"stats", "response", "error"} & set(o)
        ]
        if not docs:
            return telemetry_from_file(spec.telemetry_path)
        doc = docs[-1]
        stats = doc.get("stats") if isinstance(doc.get("stats"), dict) else {}
        models = stats.get("models") if isinstance(stats.get("models"), dict) else {}
        t = Telemetry(raw=doc)
        for m in models.values():
            if not isinstance(m, dict):
                continue
            api, tok = (m.get(k) if isinstance(m.get(k), dict) else {} for k in ("api", "tokens"))
            add_counts(t, "num_turns", api.get("totalRequests"))  # one request per model turn
            add_counts(t, "input_tokens", tok.get("prompt"))  # "prompt" includes cached tokens
            add_counts(t, "output_tokens", tok.get("candidates"), tok.get("thoughts"))
        if isinstance(doc.get("session_id"), str):
            t.session_id = doc["session_id"]
        err = doc.get("error")
        if isinstance(err, dict):
            t.error_subtype = str(err.get("type") or "error")
        return t

    def executables(self) -> list[str]:
        return [self.profile.executable or "gemini"]
