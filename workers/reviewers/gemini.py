"""The ``gemini`` kind: Gemini CLI in headless mode (``-p``, ``--output-format json``).

Gemini CLI's file tools work anywhere in its workspace, which includes the KB, and its
flags cannot narrow a tool to a folder. Its policy engine can: each attempt writes a small
policy file that lets ``write_file``/``replace`` through only for paths in the job folder
and refuses any path with ``..``. In headless mode any tool call that would need a
person's approval is refused, so everything else that writes (and the shell) stays off.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from .base import (
    UNREADABLE,
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
    cli_version,
    failure_kind,
    instruction,
    json_objects,
    known_span,
    last_document,
    last_line,
    refused_said,
    remove_tree,
    text_head,
    unwrap,
)

# stderr lines that are Gemini talking about itself, never the reason it failed
_CHATTER = re.compile(r"^(Warning: 256-color|Ripgrep is not available|Loaded cached credentials)")

# Gemini's words for a tool call reviewq's policy denied (a write outside the job folder:
# a fixer's over the KB note), as its chat log keeps them in the call's result; on stderr
# they name the tool, not the file.
_DENIED_WORDS = "Tool execution denied by policy"
_DENIED = re.compile(rf"^Error executing tool (\w+): {_DENIED_WORDS}", re.M)

# Gemini's words when the model calls a file tool its registry lacks.
_NO_WRITE_TOOL = re.compile(r'Tool "(?:write_file|replace)" not found')

_POLICY = """\
# Written by reviewq for job {job_id} attempt {attempt}: writes only inside the job folder.
[[rule]]
toolName = ["write_file", "replace"]
argsPattern = {allow}
decision = "allow"
priority = 900

[[rule]]
toolName = ["write_file", "replace"]
argsPattern = {deny}
decision = "deny"
priority = 950

# Any other write, whatever the person's settings allow (tools.allowed): refused.
[[rule]]
toolName = ["write_file", "replace"]
decision = "deny"
priority = 800

[[rule]]
toolName = ["run_shell_command", "web_fetch", "google_web_search", "save_memory"]
decision = "deny"
priority = 950
"""


def _js_escape(text: str) -> str:
    # Escape only regex syntax characters: those escapes are valid in every JS regex mode.
    return re.sub(r"([\\^$.*+?()\[\]{}|/])", r"\\\1", text)


def policy_text(spec: AttemptSpec) -> str:
    """The engine matches a regex against the tool's arguments as JSON text, and refuses
    any pattern it suspects of ReDoS (a group followed by a quantifier), so neither rule
    has a group. The allow rule wants the whole path value free of quotes and backslashes
    (nothing escaped can hide in it) under the job folder; the deny rule, ranked above it,
    refuses any ``..`` in such a path, so no path climbs out after matching the prefix."""
    job = json.dumps(str(spec.job_dir.resolve()), ensure_ascii=False)[1:-1]
    allow = f'"file_path":"{_js_escape(job)}/[^"\\\\]*"'
    deny = '"file_path":"[^"\\\\]*\\.\\.'
    return _POLICY.format(
        job_id=spec.job_id, attempt=spec.attempt, allow=json.dumps(allow), deny=json.dumps(deny)
    )


# The job folder's .gemini/settings.json: Gemini ranks a trusted workspace's settings
# over the person's own (~/.gemini/settings.json), whose hooks run shell commands outside
# the policy on every event of a headless run. No flag turns them off, and the system
# settings GEMINI_CLI_SYSTEM_SETTINGS_PATH may name are skipped unless root owns the file
# and every folder above it. With the hook system off, an extension's hooks stay off too.
# The same goes for the command the person's settings run to list tools of their own
# (tools.discoveryCommand), at every start: an empty one runs nothing. A turn limit of the
# person's (model.maxSessionTurns) stopped a review midway, "exit 53", the profile paused
# for their setting: the attempt's deadline and reviewq's own count of turns bound a run.
_WORKSPACE_SETTINGS = {
    "hooksConfig": {"enabled": False},
    "tools": {"discoveryCommand": ""},
    "model": {"maxSessionTurns": -1},
}
# Only MCP servers of this name may start: none has it. The person's own servers (and
# mcp.serverCommand, the server named "mcp") are commands Gemini starts outside its
# policy with every session, and no setting a workspace gives removes them.
_NO_MCP_SERVER = "reviewq-allows-no-mcp-server"


def _workspace_settings(job_dir: Path) -> None:
    folder = job_dir / ".gemini"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(json.dumps(_WORKSPACE_SETTINGS), encoding="utf-8")


class GeminiReviewer(Reviewer):
    kind = "gemini"
    package = "@google/gemini-cli"
    known_versions = ("0.61.0", "0.61.0")

    def command(self, spec: AttemptSpec) -> Command:
        if refused := self.machine_problem(spec.job_dir):
            raise ValueError(refused)
        policy = spec.attempt_dir / "gemini-policy.toml"
        policy.parent.mkdir(parents=True, exist_ok=True)
        policy.write_text(policy_text(spec), encoding="utf-8")
        _workspace_settings(spec.job_dir)
        exe = self.profile.executable or "gemini"
        if os.sep in exe and not os.path.isabs(exe):
            # tools/gemini is the KB root's, where doctor finds it and the other kinds
            # start; Gemini starts in its job folder, which has none.
            exe = os.path.abspath(spec.root / exe)
        argv = [
            exe,
            "--output-format",
            "json",
            "--model",
            self.profile.model,
            "--approval-mode",
            "default",  # never auto_edit/yolo from the user's settings
            "--policy",
            str(policy),
            "--include-directories",
            str(spec.root.resolve()),  # the KB, to read
            "--allowed-mcp-server-names",
            _NO_MCP_SERVER,
            # An extension the person installed brings MCP servers, hooks and policies.
            "--extensions",
            "none",
            "-p",  # after the array-valued flags, which would swallow a positional
            instruction(spec),
            *self.profile.args,
        ]
        # The job folder is the workspace: Gemini applies the .gitignore of its workspace
        # to read_file, and the KB's ignores the state folder, prompt included. Trust is
        # granted per run: headless, an untrusted folder is an exit 55, never a prompt.
        env = {"GEMINI_CLI_TRUST_WORKSPACE": "true", **self.profile.env}
        return Command(argv=argv, env=env, cwd=spec.job_dir)

    def telemetry(self, spec: AttemptSpec) -> Telemetry:
        t = self._telemetry(spec)
        dropped = _policy_error(spec.stderr_path)
        if dropped:
            # A rule the engine refused leaves the agent without write_file: every job
            # would end with no output. That is this profile's fault, not the job's.
            t.error, t.failure = dropped, "config"
        elif _NO_WRITE_TOOL.search(_head(spec.stderr_path)):
            # An older Gemini CLI (0.30) keeps write_file out of headless mode whatever
            # the policy allows: no attempt can write its output. The CLI's, not the job's.
            exe = self.executables()[0]
            said = cli_version(exe, self.package or "", dict(self.profile.env), spec.root)
            version = said[0] or "(version unknown)"
            t.error = bounded(
                f"{exe} {version} has no write_file tool in headless mode, so it cannot "
                f"write its output; reviewq is known to work with {known_span(self.known_versions)}"
            )
            t.failure = "config"
        elif t.error is None and t.failure is None:
            t.error = refused_said(self._denied(spec), "Gemini CLI's policy")
        return t

    def _denied(self, spec: AttemptSpec) -> list[str]:
        """The tool calls Gemini's policy denied, each with the file it named: its chat log
        keeps each call's args and result; its stderr names the tool alone, which is said
        when the log cannot be read."""
        log, _ = self._chat_log(spec, self._project(spec)[1])
        calls = _tool_calls(log) if log is not None else None
        if calls is None:
            return _DENIED.findall(_head(spec.stderr_path))
        under = str(spec.root.resolve()) + "/"
        said = []
        for call in calls.values():
            # An error's words alone: a file read that quotes them is no refusal.
            said_so = _DENIED_WORDS in json.dumps(call.get("result"), ensure_ascii=False)
            if call.get("status") != "error" or not said_so:
                continue
            args = call.get("args") if isinstance(call.get("args"), dict) else {}
            path = args.get("file_path")
            what = str(call.get("name") or "a tool")
            said.append(what + (f" to {path.removeprefix(under)}" if isinstance(path, str) else ""))
        return said

    def _telemetry(self, spec: AttemptSpec) -> Telemetry:
        docs = [
            o for o in json_objects(spec.stdout_path) if {"stats", "response", "error"} & set(o)
        ]
        if not docs:
            # Headless with JSON output, Gemini writes a failed run's document to stderr,
            # after its warnings and a stack trace.
            doc = last_document(spec.stderr_path)
            if doc is None or "error" not in doc:
                t = telemetry_from_file(spec.telemetry_path)
                t.error = _refused_arguments(spec.stderr_path) or last_line(
                    spec.stderr_path, skip=_CHATTER
                )
                return t
            docs = [doc]
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
            add_counts(t, "cached_input_tokens", tok.get("cached"))
            add_counts(t, "output_tokens", tok.get("candidates"), tok.get("thoughts"))
        if isinstance(doc.get("session_id"), str):
            t.session_id = doc["session_id"]
        err = doc.get("error")
        if isinstance(err, dict):
            t.error_subtype = str(err.get("type") or "error")
            if isinstance(err.get("message"), str):
                # The message is often the API's own error document, as text.
                message, status = unwrap(err["message"])
                code = _num(err.get("code"), int)
                if status is None and code is not None and 400 <= code < 600:
                    status = code
                t.error, t.failure = bounded(message), failure_kind(message, status)
                if t.failure is None and status is None and _said(spec.stderr_path, _API_ERROR):
                    # The API call itself failed with no HTTP status: the stream broke
                    # ("Incomplete JSON segment at the end") or nothing answered.
                    t.failure = "unreachable"
                if t.failure is None and _UNFINISHED in message:
                    # Its words, after retries, for a stream that held no answer: the
                    # endpoint's error in a 200, whose own words its SDK dropped.
                    t.failure = "server"
        elif (
            isinstance(doc.get("response"), str)
            and not doc["response"].strip()
            and self._dropped(spec)
        ):
            t.error, t.failure = _DROPPED, "server"
        else:
            t.last_words = last_words(doc.get("response"))
        return t

    def output_altered(self, spec: AttemptSpec, output: bytes) -> str | None:
        # Gemini CLI unescapes \\n, \\" … in write_file's content for a model it takes
        # for neither Gemini 2 nor 3 (0.61's aggressiveUnescape): the text its model gave
        # is the call's args in the chat log. Only when write_file alone wrote the output
        # (an edit since would differ rightly), and only a log that could be read speaks.
        log, _ = self._chat_log(spec, self._project(spec)[1])
        target = spec.output_path.resolve()
        calls: dict[str, tuple[str, object]] = {}
        for key, call in (_tool_calls(log) if log is not None else {}).items():
            args = call.get("args")
            path = args.get("file_path") if isinstance(args, dict) else None
            if isinstance(path, str) and (spec.job_dir / path).resolve() == target:
                calls[key] = (str(call.get("name")), args.get("content"))
        if not calls or any(name != "write_file" for name, _ in calls.values()):
            return None
        meant = list(calls.values())[-1][1]
        if not isinstance(meant, str) or meant.encode("utf-8") == output:
            return None
        return (
            f"Gemini CLI changed {spec.output_path.name} as it wrote it: the text its model "
            f'gave write_file differs from the file (its unescaping of \\n, \\" … for '
            f"model {self.profile.model}, which it takes for neither Gemini 2 nor 3); not applied"
        )

    def _dropped(self, spec: AttemptSpec) -> bool:
        """The last model turn of the run came with no content and no usage: no model
        answered it. After a tool call Gemini takes that for an empty answer and exits 0;
        a model's own empty answer carries its token counts."""
        log, _ = self._chat_log(spec, self._project(spec)[1])
        last = None
        for message in _model_messages(log) if log else ():
            last = message
        return (
            last is not None
            and last.get("tokens") is None
            and not any(last.get(k) for k in ("content", "toolCalls", "thoughts"))
        )

    def unreachable(self, spec: AttemptSpec) -> str | None:
        # Gemini retries a failing API up to ten times, 5-30 s apart, minutes in all, and
        # says each failed try on stderr. As for Claude: only a run no model has answered
        # (a retry between answers may pass), and only one that failed again.
        tries = _RETRY.findall(_head(spec.stderr_path))
        if len(tries) < RETRIES_TO_END or self.answered(spec):
            return None
        n, status, said = tries[-1]
        message, code = unwrap(re.sub(r"^\w*Error: ", "", said.strip()))
        status = status or (str(code) if code else "")
        return bounded(
            f"API retry {n}: " + (f"status {status}, " if status else "no response, ") + message
        )

    def answered(self, spec: AttemptSpec) -> bool:
        # Gemini writes its JSON only at its end; its chat log has each model message as it
        # comes ("type": "gemini"), in the folder its projects.json names for the job folder.
        started, name = self._project(spec)
        if not started:
            # Killed before it named the job folder in projects.json, which it does as it
            # starts (7-21 s on a loaded machine), long before it sends the prompt.
            return False
        log, told = self._chat_log(spec, name)
        if log is None:
            # No chat log holds the prompt, which Gemini records as it sends it (nothing
            # but a full disk turns its recording off): never sent. Unread: cannot tell.
            return not told
        return any(True for _ in _model_messages(log))

    def asked(self, spec: AttemptSpec) -> bool:
        # It records the prompt in its chat log as it sends it (:meth:`answered`); its
        # arguments, settings and key are checked before it names the job folder.
        started, name = self._project(spec)
        if not started:
            return False
        log, told = self._chat_log(spec, name)
        return log is not None or not told

    def forget(self, spec: AttemptSpec) -> None:
        # Gemini keeps tmp/<name>/ (chat logs) and history/<name>/ for each folder it runs
        # in, the job folder, which on a worker is the attempt's: read above, then removed,
        # and the folder's entry in projects.json last (its name is read from there).
        if os.path.realpath(spec.job_dir) != os.path.realpath(spec.attempt_dir):
            return  # the control's job folder: its attempts share one
        _, name = self._project(spec)
        if name and name not in (".", "..") and "/" not in name:
            for kept in ("tmp", "history"):
                remove_tree(self._home() / kept / name)
            _unregister(self._home() / "projects.json", str(spec.job_dir.resolve()), name)

    def machine_problem(self, job_dir: Path) -> str | None:
        """Gemini CLI locks ``projects.json`` in its home as it starts, and in a folder it
        cannot write (a read-only mount) it tries the lock again for good, saying nothing:
        the attempt ran to its deadline, said as "no model answered", and paused the
        reviewer as if its endpoint were down (B58). A home with no ``.gemini`` yet it
        cannot make, Gemini refuses at once in its own words (B48)."""
        home = self._home()
        if home.is_dir() and not os.access(home, os.W_OK):
            return (
                f"{home}: Gemini CLI cannot write its home folder, where it locks "
                "projects.json as it starts (it would wait for that lock until the deadline): "
                "give the profile a HOME or GEMINI_CLI_HOME it can write"
            )
        return None

    def _home(self) -> Path:
        home = self.env_value("GEMINI_CLI_HOME") or self.env_value("HOME")
        return Path(home or Path.home()) / ".gemini"

    def _project(self, spec: AttemptSpec) -> tuple[bool, str | None]:
        """Whether Gemini got as far as naming the job folder in its projects.json (True
        when that cannot be told), and the name it gave the folder, when it did."""
        try:
            projects = json.loads((self._home() / "projects.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return False, None
        except (OSError, *UNREADABLE):
            return True, None
        table = projects.get("projects") if isinstance(projects, dict) else None
        if not isinstance(table, dict):
            return True, None
        name = table.get(str(spec.job_dir.resolve()), False)
        return name is not False, name if isinstance(name, str) else None

    def _chat_log(self, spec: AttemptSpec, name: str | None) -> tuple[Path | None, bool]:
        """This attempt's chat log: the session whose first words name its prompt, in the
        folder ``name`` (as projects.json names the job folder: :meth:`_project`), and
        whether that could be told (False: a log or the folder could not be read)."""
        if name is None:
            return None, False
        try:
            logs = list((self._home() / "tmp" / name / "chats").glob("session-*.jsonl"))
        except (OSError, TypeError):
            return None, False
        # As its JSON lines hold it (JSON.stringify): a quote or backslash in the path
        # escaped, other characters as they are.
        said = json.dumps(f"Read the file {spec.prompt_path} ", ensure_ascii=False)[1:-1]
        # Newest first by when each was last written: a log's name has the minute its
        # session began and a random id, so the same attempt run again within that minute
        # (its task queued again by a stopping worker) sorted by chance before the other.
        told = True
        for log in sorted(logs, key=_written, reverse=True):
            try:
                with log.open("rb") as f:
                    if said in f.read(_CHAT_HEAD_BYTES).decode("utf-8", "replace"):
                        return log, True
            except OSError:
                told = False
        return None, told

    def executables(self) -> list[str]:
        return [self.profile.executable or "gemini"]


# How far into a chat log the instruction is looked for: it follows the session context,
# which lists the folders of the workspace and the KB.
# Gemini 0.61 rewrites projects.json whole under proper-lockfile's lock, a folder beside
# it that it waits up to 10 s for (100 tries, 100 ms apart); reviewq waits no longer.
_LOCK_WAIT_S = 10.0
_LOCK_POLL_S = 0.05


# proper-lockfile's `stale` (Gemini keeps its default): a holder touches its lock every
# half of it, so one older is a killed holder's, which the next taker removes.
_LOCK_STALE_S = 10.0


def _taken_over(lock: Path) -> bool:
    """Whether ``lock`` was a killed holder's and is removed, as Gemini takes it over: a
    Gemini killed while it held it (a worker's stop, its deadline) left it, and every
    forget waited its 10 s and left its entry, a worker's start one wait a folder left
    (the attempts' lock held), until a Gemini ran again.

    Its age is looked at and it is removed under a flock of its folder, which every
    worker's take-over takes: a worker that looked while it was a killed holder's and
    removed it a moment later removed the lock another had taken over meanwhile and
    held, and both rewrote the file at once, one's removal lost (S40). A Gemini taking
    it over at that moment is proper-lockfile's own race, as between two Geminis."""
    try:
        folder = os.open(lock.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)  # held for a stat and an rmdir
        if time.time() - lock.stat().st_mtime <= _LOCK_STALE_S:
            return False
        lock.rmdir()
    except OSError:
        return False
    finally:
        os.close(folder)  # and its flock
    return True


def _unregister(registry: Path, folder: str, name: str) -> None:
    """``folder``'s entry in Gemini's ``registry`` removed when it still names ``name``,
    under the lock Gemini takes to write it, so that a Gemini running beside it (another
    slot's) loses neither its entry nor this removal; left as it is when the lock is
    not had within Gemini's own wait or the file cannot be read or written."""
    lock = Path(f"{registry}.lock")
    deadline = time.monotonic() + _LOCK_WAIT_S
    while True:
        try:
            lock.mkdir()
            break
        except FileExistsError:
            if time.monotonic() > deadline:
                return
            # Another program's lock, a folder: nothing to await but its removal.
            if not _taken_over(lock):
                time.sleep(_LOCK_POLL_S)
        except OSError:
            return
    try:
        data = json.loads(registry.read_text(encoding="utf-8"))
        table = data.get("projects") if isinstance(data, dict) else None
        if not isinstance(table, dict) or table.get(folder) != name:
            return
        del table[folder]
        # As Gemini writes it: a file beside it, renamed over it.
        tmp = registry.with_name(f"{registry.name}.{uuid.uuid4()}.tmp")
        try:
            tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
            tmp.replace(registry)
        finally:
            tmp.unlink(missing_ok=True)
    except (OSError, *UNREADABLE):
        return
    finally:
        with contextlib.suppress(OSError):
            lock.rmdir()


_CHAT_HEAD_BYTES = 1024 * 1024
# What Gemini prints when a request to its model failed (a job's own 400 has a status).
_API_ERROR = "Error when talking to Gemini API"


# What Gemini says, after retries, of a first turn whose stream held no answer.
_UNFINISHED = "Model stream ended without a finish reason"
# An error object inside an HTTP 200 stream: the SDK keeps a response's candidates and
# usage, never its "error", so the server's words are lost before the CLI sees them.
_DROPPED = (
    "the endpoint's last answer (HTTP 200) held no content and no token usage: an error "
    "sent inside its stream, whose words Gemini CLI does not keep"
)


def _model_messages(log: Path) -> Iterator[dict]:
    """Each state of each model message in a chat log, in order: a message is written
    again as it grows (its usage, its tool calls), the last state last."""
    for rec in json_objects(log):
        sets = rec.get("$set") if isinstance(rec.get("$set"), dict) else {}
        messages = sets.get("messages") if isinstance(sets.get("messages"), list) else []
        for m in [*messages, rec]:
            if isinstance(m, dict) and m.get("type") == "gemini":
                yield m


def _tool_calls(log: Path) -> dict[str, dict]:
    """The model's tool calls in a chat log by id, each in its last state: a call is
    written again as it grows (its result, its status)."""
    calls: dict[str, dict] = {}
    for m in _model_messages(log):
        for call in m.get("toolCalls") if isinstance(m.get("toolCalls"), list) else []:
            if isinstance(call, dict):
                calls[str(call.get("id"))] = call
    return calls


def _written(path: Path) -> tuple[float, str]:
    try:
        return path.stat().st_mtime, path.name
    except OSError:
        return 0.0, path.name  # gone meanwhile: looked at last, and skipped then


# Gemini's line for each failed try of its API, before it backs off: "Attempt 2 failed
# with status 429. Retrying with backoff... _ApiError: {…}" (or "failed with 5xx error",
# or no status at all: "… Error: exception TypeError: fetch failed sending request").
_RETRY = re.compile(
    r"^Attempt (\d+) failed(?: with status (\d{3}))?[^.\n]*\. Retrying with backoff\.\.\.(.*)$",
    re.M,
)


def _head(stderr: Path) -> str:
    """The start of Gemini's stderr, where its warnings and retries are."""
    return text_head(stderr, 256 * 1024)


def _said(stderr: Path, words: str) -> bool:
    return words in _head(stderr)


# Gemini's words for a command line it refuses (a flag an older CLI lacks), which it
# follows with its whole usage: the reason was the usage's last line ("-h, --help …").
_REFUSED = re.compile(
    r"^(?:Unknown arguments?|Invalid values?|Missing required arguments?|Not enough "
    r"(?:non-option )?arguments)\b.*$",
    re.M,
)


def _refused_arguments(stderr: Path) -> str | None:
    m = _REFUSED.search(_head(stderr))
    return bounded(m.group(0)) if m else None


def _policy_error(stderr: Path) -> str | None:
    """Gemini's complaint about reviewq's policy file, e.g. "Policy file error in
    gemini-policy.toml: Unsafe regex pattern (potential ReDoS)"."""
    lines = _head(stderr).splitlines()
    for i, line in enumerate(lines):
        if "Policy file error in gemini-policy.toml" in line:
            detail = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return bounded(f"{line.strip()} {detail}".replace("[USER] ", ""))
    return None
