"""The ``claude`` kind: Claude Code in headless (print) mode (CONTRACT §8).

Output is ``stream-json``: one event per line while the run goes on, the same ``result``
object as ``--output-format json`` at its end. The live events are what let a run be
judged before it ends (Claude retries a rejected key or a dead endpoint for minutes,
saying so in ``api_retry`` events) and what a run killed at its deadline leaves behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from .base import (
    OUTPUT_LIMIT,
    AttemptSpec,
    Command,
    Reviewer,
    Telemetry,
    _num,
    last_words,
    telemetry_from_file,
)
from .vendor import (
    RETRIES_TO_END,
    add_counts,
    bounded,
    failure_kind,
    instruction,
    json_objects,
    last_line,
    refused_said,
    remove_tree,
)

# Claude Code's longest project folder name: a longer one is cut there and a hash of the
# whole path added (its J$ since 2.1), so the attempt folder of a deep state folder is not
# the name it dashed in full.
_PROJECT_NAME_MAX = 200


def project_name(cwd: str) -> str:
    """The folder under ``projects/`` Claude Code keeps for sessions run in ``cwd``, as it
    names it: each UTF-16 unit that is not an ASCII letter or digit a dash (a character
    past U+FFFF two), past 200 of them the first 200, a dash and the path's 32-bit Java
    string hash in base 36."""
    units = memoryview(cwd.encode("utf-16-le", "surrogatepass")).cast("H")
    name = "".join(chr(u) if chr(u).isascii() and chr(u).isalnum() else "-" for u in units)
    if len(name) <= _PROJECT_NAME_MAX:
        return name
    h = 0
    for u in units:
        h = (h * 31 + u) & 0xFFFFFFFF
    n, digits = abs(h - (1 << 32) if h >> 31 else h), ""
    while True:
        n, d = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[d] + digits
        if not n:
            break
    return f"{name[:_PROJECT_NAME_MAX]}-{digits}"


# A session id as Claude Code makes them (a UUID): nothing else is a file name to remove.
_SESSION_ID = re.compile(r"[0-9a-fA-F-]{8,64}")

# How Claude names the HTTP status of an answer it could not read.
_ANSWERED = re.compile(r"\(HTTP (\d{3})\)")
# The tools no attempt goes without, and what each does for it.
_NEEDED = {"Read": "read its prompt", "Write": "write its output"}
# The administrator's settings on Linux, above every other file's (the drop-ins' too, read
# in name order): their env is put over Claude's environment like the person's.
_MANAGED = Path("/etc/claude-code")


class ClaudeReviewer(Reviewer):
    kind = "claude"
    package = "@anthropic-ai/claude-code"
    known_versions = ("2.1.300", "2.1.332")

    def command(self, spec: AttemptSpec) -> Command:
        if refused := self._env_outranked(spec.root):
            raise ValueError(refused)
        exe = self.profile.executable or "claude"
        job = spec.job_dir.resolve()
        root = spec.root.resolve()
        argv = [
            exe,
            "-p",  # the prompt right after -p: the variadic flags below cannot swallow it
            instruction(spec),
            "--output-format",
            "stream-json",
            # Hooks in the KB's .claude/settings.json or the person's own run shell
            # commands whatever the tools allowed: one wrote into the KB.
            "--settings",
            '{"disableAllHooks": true}',
            # MCP servers of the KB's .mcp.json or the person's settings are commands too.
            "--strict-mcp-config",
            # A plugin the person installed (~/.claude/plugins, enabled in their settings)
            # starts its language servers, commands, beside a review, whatever the tools
            # allowed: one wrote into the KB. Safe mode loads no installed plugin (nor
            # skills, CLAUDE.md, monitors) and keeps the settings files, where a person's
            # env or apiKeyHelper may be their key; --restricted ignores those files, and
            # a key given there left Claude "Not logged in".
            "--safe-mode",
            "--verbose",  # stream-json in print mode requires it
            # No transcript in projects/ (the prompt with its notes, every reply): nothing
            # reads it, stream-json has the counts and the session, and a worker killed
            # mid-attempt never got to forget it. forget stays for what runs before this
            # flag left (an earlier release's attempt folders, reaped at a start).
            "--no-session-persistence",
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
        events = list(json_objects(spec.stdout_path))
        results = [o for o in events if o.get("type") == "result"]
        if not results:
            return self._unfinished(spec, events)
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
            if r.get("api_error") == OUTPUT_LIMIT or "output token maximum" in r["result"]:
                # "Claude's response exceeded the 32000 output token maximum": an API
                # error with no status, yet the model answered; the job is too big.
                t.error_subtype = OUTPUT_LIMIT
                return t
            status = _num(r.get("api_error_status"), int)
            # Claude says an API error "API Error: …"; before terminal_reason said so too
            # (2.1.152 ends one "completed"), those words alone did, and a dead endpoint
            # was the job's no-output.
            api_error = r.get("terminal_reason") == "api_error" or (
                r.get("terminal_reason") in (None, "completed")
                and r.get("subtype") == "success"
                and r["result"].startswith("API Error:")
            )
            if status is None and api_error and (said := _ANSWERED.search(r["result"])):
                # "API returned an empty or malformed response (HTTP 200)": a stream cut
                # short or ending in an error event. The server answered, so it is the
                # server's failure, not an endpoint out of reach (Claude keeps none of
                # its words).
                status = int(said.group(1))
            if status is not None or api_error:
                t.failure = failure_kind(r["result"], status) or (
                    "server" if status is not None and status < 300 else None
                )
            if t.failure is None and status is None and api_error:
                # No HTTP status: no model answered at all (a TLS failure, a closed socket,
                # an aborted request), in whatever words.
                t.failure = "unreachable"
        if r.get("is_error") is not True:
            t.last_words = last_words(r.get("result"))
        if t.error is None and (refused := _refused(spec, r.get("permission_denials"))):
            # Else the attempt said only "exited 0 without writing …": a fixer's write
            # over the KB note, refused by the rules above, was in Claude's log alone.
            t.error = refused
        if t.failure is None and (missing := _missing_tools(events)):
            # A deny rule of the person's (or the KB's) settings takes a tool away before
            # any permission is asked: no attempt can read its prompt or make its output,
            # and each was the job's no-output, failed after three.
            t.failure = "config"
            t.error = bounded(
                f"Claude Code started without its {' and '.join(missing)} tool (a "
                "`permissions.deny` rule of the person's or the KB's settings), so it cannot "
                + " or ".join(_NEEDED[m] for m in missing)
            )
        if t.failure is None and (own := _own_file_denied(spec, r.get("permission_denials"))):
            # Only a rule of the person's (or the KB's) settings refuses the one file
            # reviewq's rules let it write, or the prompt it reads: every attempt's, not
            # the job's doing.
            t.failure = "config"
            t.error = bounded(
                f"Claude Code's permissions refused {own} (a `permissions.deny` rule of "
                "the person's or the KB's settings)"
            )
        return t

    def _unfinished(self, spec: AttemptSpec, events: list[dict]) -> Telemetry:
        """A run with no result (killed, or crashed): the model calls its events show.
        Each call's usage is as streamed at its start, so output tokens fall short."""
        usage: dict[str, dict] = {}
        for ev in events:
            msg = ev.get("message") if ev.get("type") == "assistant" else None
            if isinstance(msg, dict) and isinstance(msg.get("usage"), dict):
                usage[str(msg.get("id"))] = msg["usage"]  # one call may span several events
        if not usage:
            t = telemetry_from_file(spec.telemetry_path)
        else:
            t = Telemetry(num_turns=len(usage))
            reads = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
            for u in usage.values():
                add_counts(t, "input_tokens", *(u.get(k) for k in reads))
                add_counts(t, "output_tokens", u.get("output_tokens"))
                add_counts(t, "cached_input_tokens", u.get("cache_read_input_tokens"))
        for ev in events:
            if ev.get("type") == "system" and isinstance(ev.get("session_id"), str):
                t.session_id = ev["session_id"]
                break
        retry = _retrying(events)
        if retry:
            t.error, t.failure = retry, failure_kind(retry) or "unreachable"
        else:
            t.error = last_line(spec.stderr_path)
        return t

    def unreachable(self, spec: AttemptSpec) -> str | None:
        # Only a run that never got an answer: a retry between answers may pass. And only
        # one that failed again: after a single retry that went through, the model may
        # think for minutes before its first message, and ending it lost the answer.
        events = list(json_objects(spec.stdout_path))
        if any(_from_model(ev) for ev in events):
            return None
        retries = sum(
            ev.get("type") == "system" and ev.get("subtype") == "api_retry" for ev in events
        )
        return _retrying(events) if retries >= RETRIES_TO_END else None

    def answered(self, spec: AttemptSpec) -> bool:
        # Claude's own messages (an API error it reports) are "<synthetic>" assistants.
        return any(_from_model(ev) for ev in json_objects(spec.stdout_path))

    def asked(self, spec: AttemptSpec) -> bool:
        # stream-json says the session's init before its first request: a run that failed
        # with no event (a flag refused, a settings file it could not read) asked nothing.
        return next(json_objects(spec.stdout_path), None) is not None

    def forget(self, spec: AttemptSpec) -> None:
        # Claude keeps each session's transcript in projects/<its cwd, every character but
        # a letter or digit a dash>/: with the attempt's folder as cwd, a folder an attempt.
        cwd = os.path.realpath(spec.root)
        project = self._home() / "projects" / project_name(cwd)
        if cwd == os.path.realpath(spec.attempt_dir):
            remove_tree(project)
            return
        # The KB: one folder for every attempt and the person's own sessions there, so only
        # this attempt's session goes (its transcript, and the folder kept beside it).
        session = next(
            (ev["session_id"] for ev in json_objects(spec.stdout_path) if "session_id" in ev),
            None,
        )
        if isinstance(session, str) and _SESSION_ID.fullmatch(session):
            with contextlib.suppress(OSError):
                (project / f"{session}.jsonl").unlink()
            remove_tree(project / session)

    def executables(self) -> list[str]:
        return [self.profile.executable or "claude"]

    def _home(self) -> Path:
        """The folder the CLI this profile starts keeps its settings and sessions in."""
        home = self.env_value("CLAUDE_CONFIG_DIR")
        return Path(home) if home else Path(self.env_value("HOME") or Path.home(), ".claude")

    def machine_problem(self, job_dir: Path) -> str | None:
        return self._env_outranked(None)

    def _env_outranked(self, root: Path | None) -> str | None:
        """The settings file (the machine's managed ones, the person's, the KB ``root``'s
        own) whose ``env`` gives a variable of the profile's env another value, in one
        line; None: none does. Claude Code puts a settings file's env over its own
        environment: the profile's endpoint and key went unused, and a review went to the
        person's endpoint (an expired key there paused the profile whatever key
        reviewq.toml gave)."""
        try:  # no is_dir(): a folder this user may not read is one Claude cannot either
            drop_ins = sorted(_MANAGED.joinpath("managed-settings.d").glob("[!.]*.json"))
        except OSError:
            drop_ins = []
        files = [_MANAGED / "managed-settings.json", *drop_ins, self._home() / "settings.json"]
        if root is not None:
            files += [root / ".claude" / "settings.json", root / ".claude" / "settings.local.json"]
        for path in files:
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # none, or one Claude says it cannot read in its own words
            env = doc.get("env") if isinstance(doc, dict) else None
            if not isinstance(env, dict):
                continue
            clash = sorted(k for k, v in self.profile.env.items() if k in env and env[k] != v)
            if clash:
                return (
                    f"{path}: its env gives {', '.join(clash)} a value of its own, which "
                    f"Claude Code puts over the profile's env (the review would go to that "
                    f"endpoint or key): remove {', '.join(clash)} from one of the two"
                )
        return None


def _missing_tools(events: list[dict]) -> list[str]:
    """The tools of :data:`_NEEDED` missing from those Claude's first event (system init)
    lists as given it; none when it lists none."""
    init = next(
        (e for e in events if e.get("type") == "system" and e.get("subtype") == "init"), None
    )
    tools = init.get("tools") if init is not None else None
    return [t for t in _NEEDED if t not in tools] if isinstance(tools, list) else []


def _denied_paths(denials: object) -> Iterator[tuple[str, str | None]]:
    """(the tool, the file it named or None) of each call Claude's permissions refused."""
    for d in denials if isinstance(denials, list) else []:
        if not isinstance(d, dict):
            continue
        inp = d.get("tool_input")
        path = inp.get("file_path") if isinstance(inp, dict) else None
        yield str(d.get("tool_name") or "a tool"), path if isinstance(path, str) else None


def _shown(spec: AttemptSpec, path: str | Path) -> str:
    """``path`` as said to a person: relative to the KB root when under it."""
    return str(path).removeprefix(str(spec.root.resolve()) + "/")


def _own_file_denied(spec: AttemptSpec, denials: object) -> str | None:
    """What of the attempt's own Claude's permissions refused, said ("the write of its
    output, PATH"): the output it writes or the prompt it reads; None if neither."""
    own = {
        os.path.realpath(spec.output_path): ("the write of its output", spec.output_path),
        os.path.realpath(spec.prompt_path): ("the read of its prompt", spec.prompt_path),
    }
    for _, path in _denied_paths(denials):
        if path is not None and (hit := own.get(os.path.realpath(Path(spec.root, path)))):
            return f"{hit[0]}, {_shown(spec, hit[1])}"
    return None


def _refused(spec: AttemptSpec, denials: object) -> str | None:
    """The tool calls Claude's permissions refused, said in one line; None if none."""
    said = [
        tool + (f" to {_shown(spec, path)}" if path is not None else "")
        for tool, path in _denied_paths(denials)
    ]
    return refused_said(said, "Claude Code's permissions")


def _from_model(ev: dict) -> bool:
    """An event carrying a model's message, not one Claude made up to report an error."""
    msg = ev.get("message") if ev.get("type") == "assistant" else None
    return isinstance(msg, dict) and msg.get("model") != "<synthetic>"


def _retrying(events: list[dict]) -> str | None:
    """Claude's own account of an API it keeps retrying, when that is the last thing it
    said: "API retry 4/10: status 401, authentication_failed"; None otherwise."""
    for ev in reversed(events):
        if ev.get("type") == "system" and ev.get("subtype") == "api_retry":
            status = _num(ev.get("error_status"), int)
            return bounded(
                f"API retry {ev.get('attempt')}/{ev.get('max_retries')}: "
                + (f"status {status}, " if status is not None else "no response, ")
                + str(ev.get("error") or "unknown error")
            )
        if ev.get("type") in ("assistant", "user", "result"):
            return None  # it reached the model since
    return None
