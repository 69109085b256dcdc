"""The ``codex`` kind: OpenAI Codex CLI's ``codex exec`` with ``--json`` events (SPEC §8)."""

from __future__ import annotations

from .base import AttemptSpec, Command, Reviewer, Telemetry, telemetry_from_file
from .vendor import add_counts, instruction, json_objects

# Item kinds that are one step of the agent (a model call acting); reasoning is not.
_STEPS = {"agent_message", "command_execution", "file_change", "mcp_tool_call", "web_search"}


class CodexReviewer(Reviewer):
    kind = "codex"

    def command(self, spec: AttemptSpec) -> Command:
        argv = [
            self.profile.executable or "codex",
            "exec",  # headless: codex exec never asks for approval
            "--json",
            "--model",
            self.profile.model,
            # The sandbox lets commands read everywhere but write only under --cd, so the
            # job folder is the workspace and the KB stays read-only.
            "--sandbox",
            "workspace-write",
            "--cd",
            str(spec.job_dir.resolve()),
            "--skip-git-repo-check",  # the job folder is rarely a git checkout of its own
            "-c",
            "sandbox_workspace_write.network_access=false",
            "-c",
            "sandbox_workspace_write.exclude_slash_tmp=true",
            "-c",
            "sandbox_workspace_write.exclude_tmpdir_env_var=true",
            instruction(spec),
            *self.profile.args,
        ]
        return Command(argv=argv, env=dict(self.profile.env), cwd=spec.root)

    def telemetry(self, spec: AttemptSpec) -> Telemetry:
        t = Telemetry()
        seen = False
        for ev in json_objects(spec.stdout_path):
            kind = ev.get("type")
            if kind == "thread.started" and isinstance(ev.get("thread_id"), str):
                t.session_id, seen = ev["thread_id"], True
            elif kind == "turn.completed" and isinstance(ev.get("usage"), dict):
                # exec runs one turn per prompt; sum anyway in case of several
                add_counts(t, "input_tokens", ev["usage"].get("input_tokens"))
                add_counts(t, "output_tokens", ev["usage"].get("output_tokens"))
                seen = True
            elif kind == "item.completed" and isinstance(ev.get("item"), dict):
                if ev["item"].get("type") in _STEPS:
                    add_counts(t, "num_turns", 1)
                    seen = True
            elif kind in ("turn.failed", "error"):
                t.error_subtype, seen = kind.replace(".", "_"), True
        # codex reports no cost; cost_usd stays None
        return t if seen else telemetry_from_file(spec.telemetry_path)

    def executables(self) -> list[str]:
        return [self.profile.executable or "codex"]
