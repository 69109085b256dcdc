"""The ``codex`` kind: OpenAI Codex CLI's ``codex exec`` with ``--json`` events (CONTRACT §8).

Telemetry comes from two places. ``--json`` on stdout names the thread and ends with the
turn's usage or the error that ended it, but it shows no model call the sandbox refused
and no usage at all until the turn ends. Codex also keeps a session log of its own
(``$CODEX_HOME/sessions/…/rollout-…-<thread>.jsonl``) with one usage record per model
response and a running token total, so a run killed at its deadline keeps what it used.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import tomllib
from pathlib import Path

from .base import (
    OUTPUT_LIMIT,
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
    failure_kind,
    first_json_object,
    instruction,
    json_objects,
    last_line,
    refused_said,
    text_head,
)

# Item kinds that are one step of the agent (a model call acting); reasoning is not.
_STEPS = {"agent_message", "command_execution", "file_change", "mcp_tool_call", "web_search"}
# Codex's words, as an error item of --json, for a setting its requirements do not allow,
# which it replaced by the one they require (read-only for reviewq's workspace-write).
_REPLACED = "is disallowed by requirements; falling back to required value"
# ... and the setting it names ("Details: invalid value for `sandbox_mode`: …"). Only one
# of reviewq's command is the machine's failure: one it never gives (`web_search_mode`,
# whose default a requirement that only takes away replaces the same way) changes nothing
# of the review reviewq set up.
_REPLACED_SETTING = re.compile(r"invalid value for `([^`]+)`")
# stderr lines that are Codex talking about itself, never the reason it failed
_CHATTER = re.compile(r"^(Reading additional input from stdin|WARNING: proceeding)")
_SAFE_ID = re.compile(r"[A-Za-z0-9-]{8,80}")
# Codex's words for a response stream that broke after it began: the connection closed, or
# the server sent response.failed ("The server had an error…"). Its context-window and
# quota errors have words of their own, so what follows these is the endpoint's failure.
_BROKEN = "stream disconnected before completion"
# ... except when the model ended its answer itself: Codex says an incomplete response in
# the same words ("…: Incomplete response returned, reason: content_filter"), and a filter
# refusing the job's notes is the job's, not an outage that pauses the profile.
_INCOMPLETE = "Incomplete response returned, reason: "
# Codex's own words for a failure it says without the server's status: a 500 ("We're
# currently experiencing high demand…"; the server's words are dropped), an overloaded
# model (code server_is_overloaded: "Selected model is at capacity…"), and a model the
# key may not use (a 403 or 404 with code model_not_found, in the server's words). None
# is the job's, yet each was a counted no-output once the first turn had been answered.
_SAYS = (
    (
        re.compile(r"experiencing high (?:demand|load)|is at capacity|capacity is unavailable"),
        "server",
    ),
    (
        re.compile(r"does not exist or you do not have access to it|does not have access to model"),
        "not-found",
    ),
)


class CodexReviewer(Reviewer):
    kind = "codex"
    package = "@openai/codex"
    known_versions = ("0.169.0", "0.171.0")

    def command(self, spec: AttemptSpec) -> Command:
        # The machine's managed layers outrank every -c below: what they force, no flag
        # here can undo, so such a machine is refused before Codex starts (a launch
        # failure of the profile, never a verdict on a note).
        if refused := self.machine_problem(spec.job_dir):
            raise ValueError(refused)
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
            # A person's ~/.codex/config.toml may name writable roots (the KB among them):
            # the sandbox would let every command write there.
            "-c",
            "sandbox_workspace_write.writable_roots=[]",
            # ... and a notify program, which Codex runs outside its sandbox.
            "-c",
            "notify=[]",
            # ... and hooks (~/.codex/hooks.json, [hooks] in a config.toml, a plugin's),
            # which it runs outside its sandbox on every event under exec as well once a
            # person has trusted them; the feature off, none is even loaded.
            "-c",
            "features.hooks=false",
            # ... and plugins, whose MCP servers (a plugin's .mcp.json, in no config.toml)
            # it starts outside its sandbox with every session too.
            "-c",
            "features.plugins=false",
            # ... and a command its ~/.codex/rules allow, which it runs unsandboxed.
            "--ignore-rules",
            # ... and the MCP servers of its config.toml, commands Codex starts outside its
            # sandbox with every session: each turned off by name (`-c mcp_servers={}`
            # is merged into the person's table and removes none).
            *_turned_off(self._mcp_servers()),
            # ... and those of a project's .codex/config.toml (the KB's, any folder's from
            # its root down to the job folder), loaded once the person trusted the KB:
            # untrusted for this run, whichever folder Codex takes for the project's root.
            *_untrusted(spec.job_dir.resolve()),
            instruction(spec),
            *self.profile.args,
        ]
        return Command(argv=argv, env=dict(self.profile.env), cwd=spec.root)

    def telemetry(self, spec: AttemptSpec) -> Telemetry:
        t = Telemetry()
        seen = False
        error: str | None = None
        replaced: str | None = None
        words: str | None = None  # the model's last message
        for ev in json_objects(spec.stdout_path):
            kind = ev.get("type")
            if kind == "thread.started" and isinstance(ev.get("thread_id"), str):
                t.session_id, seen = ev["thread_id"], True
            elif kind == "turn.completed" and isinstance(ev.get("usage"), dict):
                # exec runs one turn per prompt; sum anyway in case of several
                add_counts(t, "input_tokens", ev["usage"].get("input_tokens"))
                add_counts(t, "cached_input_tokens", ev["usage"].get("cached_input_tokens"))
                add_counts(t, "output_tokens", ev["usage"].get("output_tokens"))
                seen = True
            elif kind == "item.completed" and isinstance(ev.get("item"), dict):
                if ev["item"].get("type") in _STEPS:
                    add_counts(t, "num_turns", 1)
                    seen = True
                if ev["item"].get("type") == "agent_message":
                    words = last_words(ev["item"].get("text")) or words
                elif _replaced_review_setting(str(ev["item"].get("message"))):
                    replaced = replaced or str(ev["item"]["message"])
            elif kind in ("turn.failed", "error"):
                t.error_subtype, seen = kind.replace(".", "_"), True
                error = _message(ev) or error
                continue
            if kind != "turn.started":
                error = None  # only an error that ended the run speaks for it
        if not seen:
            t = telemetry_from_file(spec.telemetry_path)
        t.last_words = words if error is None else None
        t.session_id = t.session_id or _thread(spec)
        refused = self._from_session(t, spec.root)
        if error and error.endswith(f"reason: {OUTPUT_LIMIT}"):
            # "Incomplete response returned, reason: max_output_tokens": the job is too big.
            t.error, t.error_subtype = bounded(error), OUTPUT_LIMIT
        elif error:
            t.error = bounded(error)
            broken = error.startswith(_BROKEN) and _INCOMPLETE not in error
            said = next((kind for words, kind in _SAYS if words.search(error)), None)
            t.failure = failure_kind(error) or said or ("server" if broken else None)
        elif t.num_turns is None:
            t.error = (
                _refused_arguments(spec.stderr_path)
                or _config_refused(spec.stderr_path)
                or last_line(spec.stderr_path, skip=_CHATTER)
            )
        if t.error is None and t.failure is None:
            t.error = refused_said(refused, "Codex's sandbox")
        if replaced and t.failure is None:
            # A setting of reviewq's command the machine's requirements replaced (from a
            # place `_machine_refuses` does not read): the run was not the one reviewq
            # set up, whatever it did, so it speaks of the machine, never of the job.
            # Its "Details: …" say which setting and who required it; the value it fell
            # back to is a long debug dump.
            said = replaced.partition("Details: ")[2] or replaced
            t.error = bounded(f"Codex's requirements replaced a setting of the review: {said}")
            t.failure = "config"
        return t

    def unreachable(self, spec: AttemptSpec) -> str | None:
        # Codex waits for an endpoint it cannot reach without end ("Reconnecting...");
        # only a run whose last word is such an error, and that never reached a model, is.
        # And only one that failed again: one reconnect that went through may be followed
        # by minutes of reasoning before the next event, and ending it lost the answer.
        last, reached, errors = None, False, 0
        for ev in json_objects(spec.stdout_path):
            kind = ev.get("type")
            if kind in ("error", "turn.failed"):
                last, errors = _message(ev), errors + 1
            elif kind != "turn.started":
                last, errors = None, 0
                reached = reached or _from_model(ev)
        if (
            last
            and not reached
            and errors >= RETRIES_TO_END
            and failure_kind(last) == "unreachable"
        ):
            return bounded(last)
        return None

    def answered(self, spec: AttemptSpec) -> bool:
        events = list(json_objects(spec.stdout_path))
        if any(_from_model(ev) for ev in events):
            return True
        # The session log records each model response, one --json may not show yet.
        t = Telemetry(session_id=_thread(spec))
        self._from_session(t, spec.root)
        return bool(t.num_turns)

    def asked(self, spec: AttemptSpec) -> bool:
        # --json says thread.started before the turn's first request: a run that failed
        # with no event (a flag refused, a config.toml it could not load) asked nothing.
        return next(json_objects(spec.stdout_path), None) is not None

    def forget(self, spec: AttemptSpec) -> None:
        # Codex keeps every run's rollout (the prompt with the notes, each reply) under
        # sessions/YYYY/MM/DD/, one file a run whatever folder it ran in, and rows of the
        # thread in its SQLite files (the same items in thread_history_*.sqlite, the thread
        # in state_*.sqlite, its log lines): the attempt's own, found by the thread its
        # --json named, read before the attempt folder goes.
        thread = _thread(spec)
        path = self._session_log(thread)
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
        if thread is not None and _SAFE_ID.fullmatch(thread):
            for db in self._databases():
                _drop_thread(db, thread)

    def _databases(self) -> list[Path]:
        """Codex's SQLite files: in its sqlite_home (config.toml's, else CODEX_SQLITE_HOME),
        else in its home."""
        place = self.env_value("CODEX_SQLITE_HOME")
        try:
            config = tomllib.loads((self._home() / "config.toml").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            config = {}
        if isinstance(config.get("sqlite_home"), str):
            place = config["sqlite_home"]
        try:
            return sorted(Path(place or self._home()).expanduser().glob("*.sqlite"))
        except OSError:
            return []

    def _from_session(self, t: Telemetry, root: Path) -> list[str]:
        """Turns and tokens from Codex's session log, when it can be found: it counts every
        model response, refused tool calls and runs killed before their end included. It
        returns the agent's commands the sandbox refused a path, and its patches refused
        (its --json stream leaves out a failed command at times and a refused patch always,
        and its stderr names no path of one; the log has each call and its output)."""
        path = self._session_log(t.session_id)
        if path is None:
            return []
        turns, total, refused = 0, None, []
        patches: dict[str, list[str]] = {}  # a call's patched paths, for its output
        for rec in json_objects(path):
            payload = rec.get("payload") if isinstance(rec.get("payload"), dict) else {}
            kind = payload.get("type") if rec.get("type") == "response_item" else None
            if rec.get("type") == "token_usage_record":
                turns += 1
            elif kind in ("function_call", "custom_tool_call"):
                patches[str(payload.get("call_id"))] = _patched(payload)
            elif kind in ("function_call_output", "custom_tool_call_output"):
                output = payload.get("output")
                refused += _sandbox_refused(root, output)
                refused += _patch_refused(root, patches.get(str(payload.get("call_id"))), output)
            elif rec.get("type") == "event_msg" and payload.get("type") == "token_count":
                info = payload.get("info")
                if isinstance(info, dict) and isinstance(info.get("total_token_usage"), dict):
                    total = info["total_token_usage"]
        if turns:
            t.num_turns = turns
        if total is not None:
            for attr, key in (
                ("input_tokens", "input_tokens"),
                ("cached_input_tokens", "cached_input_tokens"),
                ("output_tokens", "output_tokens"),
            ):
                value = _num(total.get(key), int)
                if value is not None:
                    setattr(t, attr, value)
        return refused

    def _home(self) -> Path:
        """The CODEX_HOME the CLI this profile starts reads."""
        home = self.env_value("CODEX_HOME")
        return Path(home or Path(self.env_value("HOME") or Path.home()) / ".codex")

    def _mcp_servers(self) -> list[str]:
        """The MCP servers the person's config.toml names, and the profile file that a
        ``-p``/``--profile`` among the profile's args picks (Codex 0.171:
        ``$CODEX_HOME/<name>.config.toml``). A file it cannot read stops Codex itself."""
        names: list[str] = []
        files = [self._home() / "config.toml"]
        files += [self._home() / f"{p}.config.toml" for p in _profiles(self.profile.args)]
        # The machine's own layers too: its servers start as theirs do. The managed one's
        # are turned off the same way when it leaves `enabled` unsaid (it outranks -c key
        # by key); one it forces on is refused by `_machine_refuses`.
        for path in (*files, _SYSTEM_CONFIG, _MANAGED_CONFIG):
            servers = _layer(path)[0].get("mcp_servers")
            names += [n for n in servers if n not in names] if isinstance(servers, dict) else []
        return names

    def _session_log(self, thread_id: str | None) -> Path | None:
        if not thread_id or not _SAFE_ID.fullmatch(thread_id):
            return None
        try:
            found = sorted((self._home() / "sessions").glob(f"*/*/*/rollout-*{thread_id}.jsonl"))
        except OSError:
            return None
        return found[-1] if found else None

    def executables(self) -> list[str]:
        return [self.profile.executable or "codex"]

    def machine_problem(self, job_dir: Path) -> str | None:
        return _machine_refuses(job_dir.resolve())


def _thread(spec: AttemptSpec) -> str | None:
    """The thread Codex's --json named in its first event (thread.started): a log past
    what :func:`json_objects` reads (8 MiB) no longer holds it in its tail."""
    first = first_json_object(spec.stdout_path) or {}
    thread = first.get("thread_id")
    if not isinstance(thread, str):
        thread = next(
            (ev["thread_id"] for ev in json_objects(spec.stdout_path) if ev.get("thread_id")),
            None,
        )
    return thread if isinstance(thread, str) else None


# The columns by which Codex's tables name a thread (0.171: state, thread_history, logs,
# goals, queue, memories), each row of one thread that thread's alone.
_THREAD_COLUMNS = ("thread_id", "parent_thread_id", "child_thread_id")


def _drop_thread(db: Path, thread: str) -> None:
    """Every row of ``thread`` in the Codex database ``db`` deleted, in one transaction
    beside a Codex that may be writing it (WAL, its busy wait); a file that cannot be
    opened or written is left as it is, the outcome already sent."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=rw", uri=True, timeout=10, isolation_level=None)
    except sqlite3.Error:
        return
    try:
        conn.execute("PRAGMA foreign_keys = ON")  # what Codex cascades, as Codex does
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        conn.execute("BEGIN IMMEDIATE")
        for table in tables:
            cols = {r[1] for r in conn.execute("SELECT * FROM pragma_table_info(?)", (table,))}
            named = [c for c in _THREAD_COLUMNS if c in cols]
            if table == "threads" and "id" in cols:
                named.append("id")
            for col in named:
                conn.execute(f'DELETE FROM "{table}" WHERE "{col}" = ?', (thread,))  # noqa: S608
        conn.execute("COMMIT")
    except sqlite3.Error:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
    finally:
        conn.close()


# Codex's system config layer, which every user of the machine loads under their own.
_SYSTEM_CONFIG = Path("/etc/codex/config.toml")
# ... and the administrator's (Codex 0.171 on Linux): managed_config.toml, a layer above
# the command line's -c, merged key by key; requirements.toml, the values a setting may
# take (one refused falls back to the required value, said only as an item of --json).
_MANAGED_CONFIG = Path("/etc/codex/managed_config.toml")
_REQUIREMENTS = Path("/etc/codex/requirements.toml")
# The settings reviewq's command gives Codex, which a managed layer may set otherwise
# (sandbox_mode and approval_policy are --sandbox and exec's own): a dotted key each.
_CONTAINED = {
    "sandbox_mode": "workspace-write",
    "approval_policy": "never",
    "sandbox_workspace_write.network_access": False,
    "sandbox_workspace_write.exclude_slash_tmp": True,
    "sandbox_workspace_write.exclude_tmpdir_env_var": True,
    "sandbox_workspace_write.writable_roots": [],
    "notify": [],
    "features.hooks": False,
    "features.plugins": False,
}
# The requirements that list the allowed values of a setting, and the one reviewq needs.
_REQUIRED = {
    "allowed_sandbox_modes": "workspace-write",
    "allowed_approval_policies": "never",
}


def _machine_refuses(job_dir: Path) -> str | None:
    """What the machine's managed Codex layers force that reviewq's command cannot undo,
    in one line naming the file and the setting; None when nothing is."""
    (managed, unread), (requirements, unread_too) = _layer(_MANAGED_CONFIG), _layer(_REQUIREMENTS)
    if unread or unread_too:
        return unread or unread_too
    servers = managed.get("mcp_servers")
    for name, server in servers.items() if isinstance(servers, dict) else ():
        if isinstance(server, dict) and server.get("enabled", False) is not False:
            return (
                f"{_MANAGED_CONFIG} forces on the MCP server {name!r} (enabled = true), "
                "which would start beside the review outside the sandbox; no -c can turn "
                "it off"
            )
    for key, wanted in _CONTAINED.items():
        value = _dotted(managed, key)
        if value is not None and value != wanted:
            return (
                f"{_MANAGED_CONFIG} sets {key} = {json.dumps(value)}, which outranks "
                f"reviewq's {json.dumps(wanted)} and the review needs"
            )
    if trusted := _trusted_project(managed.get("projects"), job_dir):
        folder, config, unread = trusted
        if unread:
            why = f", which this user cannot read ({unread})"
        else:
            why = " (its MCP servers start beside the review)"
        return (
            f"{_MANAGED_CONFIG} trusts {folder}, so Codex would load {config}{why}; "
            "no -c can untrust it"
        )
    for key, wanted in _REQUIRED.items():
        allowed = requirements.get(key)
        if isinstance(allowed, list) and wanted not in allowed:
            return (
                f"{_REQUIREMENTS} has {key} = {json.dumps(allowed)} without "
                f"{json.dumps(wanted)}, which Codex would replace for the review"
            )
    return None


def _replaced_review_setting(message: str) -> bool:
    """Whether Codex's ``message`` says its requirements replaced a setting reviewq's
    command gives (one whose name it does not say is taken for one)."""
    if _REPLACED not in message:
        return False
    named = _REPLACED_SETTING.search(message)
    return named is None or named.group(1) in _CONTAINED


def _trusted_project(projects: object, job_dir: Path) -> tuple[Path, Path, str | None] | None:
    """The folder at or above ``job_dir`` a managed ``projects`` table trusts and a
    project config Codex would then load (a ``.codex/config.toml`` from that folder down
    to the job folder), when there is one; with why this user cannot tell, for one in a
    ``.codex`` it may not search (neither can Codex rule it out)."""
    if not isinstance(projects, dict):
        return None
    for folder in (job_dir, *job_dir.parents):
        entry = projects.get(str(folder))
        if not isinstance(entry, dict) or entry.get("trust_level") in (None, "untrusted"):
            continue
        for f in (job_dir, *job_dir.parents):
            config = f / ".codex" / "config.toml"
            if not f.is_relative_to(folder):
                continue
            try:  # is_file() passes over only "not found": EACCES raised out of the check
                if config.is_file():
                    return folder, config, None
            except OSError as e:
                return folder, config, e.strerror or str(e)
    return None


def _layer(path: Path) -> tuple[dict, str | None]:
    """The table of a Codex config file (empty when there is none or it cannot be read)
    and why Codex could not read it, or None: absent is fine. One it cannot read stops it
    before any review, its last stderr line then a caret of its TOML error."""
    try:  # no exists(): an /etc/codex this user may not search raised, where Codex refuses
        return tomllib.loads(path.read_text(encoding="utf-8")), None
    except (FileNotFoundError, NotADirectoryError):
        return {}, None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return {}, f"{path}: Codex cannot read it ({why}) and starts no review while it is so"


def _dotted(table: dict, key: str) -> object:
    for part in key.split("."):
        if not isinstance(table, dict):
            return None
        table = table.get(part)
    return table


def _turned_off(names: list[str]) -> list[str]:
    """One ``-c`` that turns off each MCP server of ``names``, as an inline table Codex
    merges into the person's: a key ``mcp_servers.<name>.enabled`` splits at dots, so a
    server named ``kb.tools`` could not be named (and started). Only servers Codex has:
    one it does not is "invalid transport", and Codex does not start."""
    if not names:
        return []
    tables = ",".join(f"{_toml_str(n)}={{enabled=false}}" for n in names)
    return ["-c", f"mcp_servers={{{tables}}}"]


def _toml_str(text: str) -> str:
    """A TOML basic string: JSON's, but with characters beyond U+FFFF as they are, since
    JSON escapes them as a surrogate pair, which TOML refuses (Codex then loads no config,
    and a KB path holding an emoji failed every run at its start)."""
    return json.dumps(text, ensure_ascii=False)


def _untrusted(job_dir: Path) -> list[str]:
    """One ``-c`` that makes the job folder and every folder above it an untrusted project
    for this run (merged into the person's ``projects`` table): Codex reads no project's
    config layer (its MCP servers, hooks, rules) but in a trusted one."""
    folders = ",".join(
        f'{_toml_str(str(f))}={{trust_level="untrusted"}}' for f in (job_dir, *job_dir.parents)
    )
    return ["-c", f"projects={{{folders}}}"]


def _profiles(args: tuple[str, ...] | list[str]) -> list[str]:
    """The Codex profiles ``-p NAME``, ``-pNAME``, ``--profile NAME`` or ``--profile=NAME``
    among a profile's args pick."""
    found = []
    for before, arg in zip(("", *args), args, strict=False):
        if before in ("-p", "--profile"):
            found.append(arg)
        elif arg.startswith("--profile="):
            found.append(arg.removeprefix("--profile="))
        elif arg.startswith("-p") and len(arg) > 2 and not arg.startswith("--"):
            found.append(arg[2:])
    return found


def _from_model(ev: dict) -> bool:
    """An event only a model's answer makes: any item (reasoning too) but Codex's own
    errors, or a turn's end."""
    item = ev.get("item") if isinstance(ev.get("item"), dict) else {}
    kind = str(ev.get("type"))
    return kind == "turn.completed" or (kind.startswith("item.") and item.get("type") != "error")


def _config_refused(stderr: Path) -> str | None:
    """Codex's words for a config layer it could not load, which it says over several
    lines ("Error loading config.toml: invalid type: …" then "in `<setting>`", or a TOML
    error's source line and caret), in one line: the last was the reason, "in `x`" or
    "| ^", naming neither the problem nor, of a managed layer's value, the file."""
    text = text_head(stderr, 64 * 1024)
    m = re.search(r"(?ms)^Error loading config\.toml: (.*)", text)
    if m is None:
        return None
    words = [w for line in m.group(1).splitlines() if (w := line.strip()) and w[0] not in "|^"]
    words = [w for w in words if not re.fullmatch(r"\d+ \|.*", w)]
    return bounded("Codex could not load its config: " + " ".join(words))


def _refused_arguments(stderr: Path) -> str | None:
    """Codex's own line for a command line it refuses ("error: unexpected argument
    '--x' found": a flag an older CLI lacks), which it follows with its usage and "For
    more information, try '--help'.", the line the reason was."""
    text = text_head(stderr, 64 * 1024)
    if "For more information, try '--help'" not in text:
        return None
    m = re.search(r"(?m)^error: .*$", text)
    return bounded(m.group(0)) if m else None


# What a command's shell says of a path the sandbox keeps it from writing (the KB is
# mounted read-only in it): "/bin/bash: line 1: /kb/notes/a.md: Read-only file system".
_SANDBOX_SAYS = re.compile(
    r"(/[^\n:]+): (Read-only file system|Operation not permitted|Permission denied)$", re.M
)


# A failed command's output in the session log: "Process exited with code 1 … Output: …".
_FAILED = re.compile(r"^Process exited with code [1-9]", re.M)


def _sandbox_refused(root: Path, output: object) -> list[str]:
    """The paths a failed command of the agent was refused, each said as a call."""
    if not isinstance(output, str) or not _FAILED.search(output):
        return []
    under = str(root.resolve()) + "/"
    return [
        f"command on {path.removeprefix(under)} ({words})"
        for path, words in _SANDBOX_SAYS.findall(output)
    ]


# The files a patch names (Codex's apply_patch format): "*** Update File: /kb/notes/a.md".
_PATCH_FILES = re.compile(r"^\*\*\* (?:(?:Add|Update|Delete) File|Move to): (.+?)\s*$", re.M)
# Codex's output for a patch it refused: "patch rejected: writing outside of the project;
# rejected by user approval settings" (exec never asks a person, so nothing is approved).
_PATCH_REJECTED = re.compile(r"^patch rejected(?:: ([^;\n]+))?")


def _patched(call: dict) -> list[str]:
    """The files a call of the agent patches: the apply_patch tool's input (a catalog
    model's), or an ``apply_patch`` command (any model's: Codex takes it for the tool)."""
    text = call.get("input")
    if not isinstance(text, str):
        try:
            args = json.loads(str(call.get("arguments")))
        except UNREADABLE:
            args = None
        said = args.values() if isinstance(args, dict) else ()
        text = "\n".join(
            w for v in said for w in (v if isinstance(v, list) else [v]) if isinstance(w, str)
        )
    return _PATCH_FILES.findall(text)


def _patch_refused(root: Path, paths: list[str] | None, output: object) -> list[str]:
    """The files of a patch Codex refused (its output says so), each said as a call."""
    m = _PATCH_REJECTED.match(output) if isinstance(output, str) else None
    if m is None:
        return []
    under = str(root.resolve()) + "/"
    why = f" ({m.group(1).strip()})" if m.group(1) else ""
    if not paths:
        return [f"apply_patch{why}"]
    return [f"apply_patch to {p.removeprefix(under)}{why}" for p in paths]


def _message(ev: dict) -> str | None:
    if isinstance(ev.get("message"), str):
        return ev["message"]
    err = ev.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"]
    return None
