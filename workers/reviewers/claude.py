"""The ``claude`` kind: Claude Code in headless (print) mode (SPEC §8)."""

from __future__ import annotations

from .base import AttemptSpec, Command, Reviewer, Telemetry, _num, telemetry_from_file
from .vendor import add_counts, bounded, failure_kind, instruction, json_objects, last_line


class ClaudeReviewer(Reviewer):
    kind = "claude"

    def command(self, spec: AttemptSpec) -> Command:
        exe = self.profile.executable or "claude"
        job = spec.job_dir.resolve()
        root = spec.root.resolve()
        argv = [
            exe,
            "-p",  # the prompt right after -p: the variadic flags below cannot swallow it
            instruction(spec),
            "--output-format",
            "json",
            "--model",
            self.profile.model,
            "--max-turns",
            str(self.profile.max_turns),
            # Only file tools exist; dontAsk denies whatever the rules below do not allow.
            "--tools",
            "Read,Glob,Grep,Edit,Write",
            "--permission-mode",
            "dontAsk",
            "--add-dir",
            str(job),  # the job folder may live outside the KB (the state folder)
            # "//" starts an absolute path in permission rules; Edit rules cover Write too.
            "--allowedTools",
            f"Read(/{root}/**)",
            f"Read(/{job}/**)",
            f"Edit(/{job}/**)",
            "--disallowedTools",
            "Bash,WebFetch,WebSearch",  # ends the variadic list before profile args
            *self.profile.args,
        ]
        return Command(argv=argv, env=dict(self.profile.env), cwd=spec.root)

    def telemetry(self, spec: AttemptSpec) -> Telemetry:
        results = [o for o in json_objects(spec.stdout_path) if o.get("type") == "result"]
        if not results:
            t = telemetry_from_file(spec.telemetry_path)
            t.error = last_line(spec.stderr_path)
            return t
        r = results[-1]
        usage = r.get("usage") if isinstance(r.get("usage"), dict) else {}
        subtype = r.get("subtype") if isinstance(r.get("subtype"), str) else None
        if subtype == "success":
            subtype = "error" if r.get("is_error") is True else None
        t = Telemetry(
            num_turns=_num(r.get("num_turns"), int),
            cost_usd=_num(r.get("total_cost_usd"), float),
            session_id=r.get("session_id") if isinstance(r.get("session_id"), str) else None,
            error_subtype=subtype,
            raw=r,
        )
        # Claude counts cached prompt tokens apart; the model read them all the same.
        reads = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        add_counts(t, "input_tokens", *(usage.get(k) for k in reads))
        add_counts(t, "output_tokens", usage.get("output_tokens"))
        add_counts(t, "cached_input_tokens", usage.get("cache_read_input_tokens"))
        if r.get("is_error") is True and isinstance(r.get("result"), str):
            # An API error ends the run with is_error, the HTTP status (null when nothing
            # answered) and the message in "result"; a turn or budget limit has no status.
            t.error = bounded(r["result"])
            status = _num(r.get("api_error_status"), int)
            if status is not None or r.get("terminal_reason") == "api_error":
                t.failure = failure_kind(r["result"], status)
        return t

    def executables(self) -> list[str]:
        return [self.profile.executable or "claude"]
