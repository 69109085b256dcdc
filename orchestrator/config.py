"""reviewq.toml → typed settings: paths, reviewer profiles (CONTRACT §8), the queue, sweeps (§9).

The file is optional; every setting has a default, and an ``offline`` reviewer profile
exists unless the file defines one, so a fresh checkout runs end to end.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import posixpath
import re
import shlex
import string
import tomllib
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, parse_qs, unquote, unquote_plus, urlsplit

from orchestrator import logs
from orchestrator.regularfile import NotRegular, open_regular

if TYPE_CHECKING:
    from croniter import croniter  # imported where used: ~25 ms a process with no cron sweep

KINDS = ("claude", "codex", "gemini", "command", "openai", "offline")
GROUPINGS = ("note", "gate")
# Units in order, each optional; a bare number is seconds only on its own ("1h30" is no
# duration: it read as 1 h 30 s where 90 min was meant).
_DURATION = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)d)?\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?"
    r"\s*(?:(\d+(?:\.\d+)?)s)?\s*$"
)
_SECONDS = re.compile(r"\s*\d+(?:\.\d+)?\s*")


# What a `command` profile's argv may name; workers.reviewers.AttemptSpec fills each.
PLACEHOLDERS = ("prompt_path", "output_path", "job_dir", "job_id", "attempt", "model", "root")


# A note past this is no note a model reads whole (about a million tokens, the largest
# context offered; a pasted log, an embedded image): its text went into state.db's
# snapshot, the queue message and the prompt, 60 MB each. Prompts of 1 MiB travel.
MAX_NOTE_BYTES = 4 * 1024 * 1024


class ConfigError(ValueError):
    """reviewq.toml says something reviewq cannot use; the message names the key."""


_LONGEST = 366 * 86400.0  # past it a duration is a typo (or inf), and time arithmetic fails


def parse_duration(value: object, where: str, years: int = 1) -> float:
    """Seconds from a number or a string such as "30m", "90s", "1h30m", "7d", at most ``years``
    (a setting past a year is a typo; a report may look back further)."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected seconds or a duration like '30m'")
    if isinstance(value, int | float) or (isinstance(value, str) and _SECONDS.fullmatch(value)):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        m = _DURATION.match(value)
        if not m or not any(m.groups()):
            raise ConfigError(
                f"{where}: {value!r} is not a duration like '30m', '90s', '1h30m', '7d'"
            )
        d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        seconds = d * 86400 + h * 3600 + mi * 60 + s
    else:
        raise ConfigError(f"{where}: expected seconds or a duration like '30m'")
    if not 0 < seconds <= years * _LONGEST:  # NaN fails both
        most = "a year" if years == 1 else f"{years} years"
        raise ConfigError(f"{where}: must be more than 0 seconds and at most {most}")
    return seconds


def _queue_url_problem(url: str) -> str | None:
    """What is wrong with a ``[queue] url``, or None. Taken as they were, such URLs ended
    in internal errors, a worker waiting for good, or a silent database 0 that another
    KB's queue shares."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return (
            "only redis://, rediss:// and unix:// URLs are supported (or leave it out for SQLite)"
        )
    parts = urlsplit(url)
    if _password_cut(parts):
        # A / ? or # in the password ended the host part there: what came before it was
        # taken for a host and port, and quoted as such (or the URL whole, its password
        # unseen as one). Nothing of it is said.
        return (
            "its user or password holds a character a URL must escape before its @: write "
            "/ as %2F, ? as %3F, # as %23 (and @ as %40, : as %3A)"
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is no number or out of range
    except ValueError as exc:
        return f"the port is not a number from 1 to 65535 ({exc})"
    if parts.query and (problem := _query_problem(url)):
        return problem
    dbs = parse_qs(parts.query, keep_blank_values=True).get("db", [])
    if parts.scheme == "unix":
        if not parts.path:
            return "no socket path (unix:///run/redis/redis.sock)"
    elif not parts.hostname:
        return "no host (redis://HOST:6379/0)"
    else:
        dbs.append(parts.path.lstrip("/") or "0")
    if not all(db.isdigit() for db in dbs):
        return f"{', '.join(map(repr, dbs))}: not a database number (redis://HOST:6379/0)"
    return None


def _password_cut(parts: SplitResult) -> bool:
    """Whether a / ? or # in a URL's password ended its host part there: an @ after it,
    and before it no user part but what reads as none of a host: anything for a socket
    (whose URL has no host), an empty host, a port that is no number, or an @ where a
    path or a query's name cannot hold one (a query's value can: a certificate's path)."""
    if "@" in parts.netloc or "@" not in f"{parts.path}?{parts.query}#{parts.fragment}":
        return False
    if parts.scheme == "unix":
        return bool(parts.netloc)
    try:
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        return True
    return (
        not parts.hostname
        or "@" in parts.path + parts.fragment
        or any("@" in item.partition("=")[0] for item in parts.query.split("&"))
    )


def _query_problem(url: str) -> str | None:
    """A query parameter the Redis client would not take: passed on as it is, it failed
    every connection ("unexpected keyword argument"), which a worker took for a queue
    out of reach and waited on for good. Those it takes (``ssl_ca_certs``,
    ``socket_timeout``…) are kept."""
    try:
        from redis.connection import Connection, ConnectionPool, parse_url
    except ImportError:
        return None  # said by _redis_missing
    try:
        options = parse_url(url)
    except ValueError as exc:
        return str(exc)
    cls = options.pop("connection_class", None) or Connection  # redis:// names none
    known = {"host", "port", "db", "username", "password", "path"}
    for klass in (*getattr(cls, "__mro__", ()), ConnectionPool):  # max_connections: the pool's
        if "__init__" in vars(klass):
            known |= set(inspect.signature(klass.__init__).parameters)
    known -= {"self", "args", "kwargs", "connection_class"}
    unknown = sorted(set(options) - known)
    if unknown:
        return f"query parameter(s) {', '.join(unknown)}: not settings of a Redis connection"
    return None


def _redis_missing() -> str | None:
    """Without the redis package every queue command ended in "internal error", an
    enqueue after its jobs were recorded. Looked up, not imported: a read-only command
    does not pay for the import."""
    try:
        found = importlib.util.find_spec("redis") is not None
    except ValueError:  # a module named so with no spec: taken as not installed
        found = False
    if not found:
        return "a Redis queue needs the redis package: pip install 'reviewq[redis]'"
    return None


def _shown_http(url: str) -> str:
    """An http URL as a message may show it: a password in it as ``***``."""
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    userinfo, at, host = netloc.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.partition(':')[0]}:***@{host}{slash}{path}"


def _http_url_problem(url: str) -> str | None:
    """Why ``url`` is no http(s) address a request can go to, or None."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:  # a bracket left open
        return "not an http or https URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http or https URL"
    if any(c.isspace() or not c.isprintable() for c in url.strip()):
        # http.client refuses it in the request line, and a host with one resolves to
        # nothing: every attempt failed as an endpoint out of reach.
        return "not an address a request can go to: it holds a space or a control character"
    if "@" in parts.netloc:
        # urllib sends no credentials from a URL: it took "user:pw@host" for the host.
        return (
            "not an address reviewq can use: credentials in the URL (USER:PASSWORD@), which "
            "reviewq does not send; put the key in the variable api_key_env names (sent as "
            "a Bearer token)"
        )
    try:
        port = parts.port
    except ValueError:  # not a number, or past 65535
        port = 0
    if port == 0:
        # Port 0 is no port to connect to: taken, every attempt failed as an endpoint out
        # of reach, the profile paused again and again, and nothing named the setting.
        return "not an http or https URL: the port is not a number from 1 to 65535"
    return None


@dataclass(frozen=True)
class ReviewerProfile:
    name: str
    kind: str
    model: str = ""
    partition: str = ""
    max_turns: int = 20
    timeout: float = 1800.0
    concurrency: int = 1
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    command: tuple[str, ...] = ()  # the argv template of the `command` kind
    executable: str = ""  # vendor kinds: the CLI to run (default: the kind's name)
    base_url: str = ""  # openai kind
    api_key_env: str = ""  # openai kind: the variable holding the key, never the key
    # A CLI whose output says it cannot reach its endpoint is ended after this many
    # seconds (a reviewer failure), not left waiting until ``timeout``; None: never.
    connect_timeout: float | None = None
    # USD per million tokens, for CLIs that report no cost (cached: default the input price)
    price_input_per_mtok: float | None = None
    price_output_per_mtok: float | None = None
    price_cached_input_per_mtok: float | None = None


@dataclass(frozen=True)
class QueueSettings:
    url: str = ""  # "" → SQLite files in the state folder; "redis://…" → Redis
    lease_seconds: float = 120.0
    reaper_seconds: float = 60.0
    max_attempts: int = 3
    launch_failures_before_pause: int = 5
    pause_seconds: float = 900.0
    launch_backoff_seconds: float = 5.0
    # How long an idle SQLite consumer waits for its queue's doorbell before it looks anyway
    # (without a doorbell: how often it looks).
    poll_seconds: float = 1.0


@dataclass(frozen=True)
class FixSettings:
    git_commit: bool = False  # commit each applied fix when the KB is in a git repository


@dataclass(frozen=True)
class SweepConfig:
    name: str
    select: tuple[str, ...] = ()
    all_gates: bool = False
    cron: str = ""
    reviewer: str = "offline"
    fixer: str = ""
    auditor: str = ""
    grouping: str = "note"
    batch_size: int = 5
    fix: bool = False
    sequential: bool = False
    audit: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    current: bool = False
    budget_usd: float | None = None


@dataclass(frozen=True)
class Settings:
    root: Path
    state_dir: Path
    config_path: Path | None
    note_roots: tuple[str, ...] = ("kb/notes",)
    exclude: tuple[str, ...] = ()  # [kb] exclude: globs, relative to the note roots
    max_output_bytes: int = 5 * 1024 * 1024
    max_note_bytes: int = MAX_NOTE_BYTES
    reviewers: dict[str, ReviewerProfile] = field(default_factory=dict)
    queue: QueueSettings = field(default_factory=QueueSettings)
    sweeps: dict[str, SweepConfig] = field(default_factory=dict)
    fix: FixSettings = field(default_factory=FixSettings)
    # [[sweeps]] entries left out, by name (or "#N" when the entry has no usable name):
    # one line each, naming the file, the entry and what is wrong. See _sweeps.
    sweeps_left_out: dict[str, str] = field(default_factory=dict)
    # What a usable [[sweeps]] entry says that is not used, one line each (file, entry, key).
    sweeps_ignored: tuple[str, ...] = ()
    # --state named the folder, rather than ROOT's [state] dir: a worker so started keeps
    # its files there (see workers.attempt.worker_folder).
    state_given: bool = False
    # load_settings' arguments, as given: a SIGHUP's restart reads the file as the process
    # did at its start, and checks first that it can (see :meth:`reread`).
    loaded_from: tuple[str | Path, str | Path | None, str | Path | None] | None = None

    def reread(self) -> Settings | None:
        """The settings as the file says them now, as the process's start read them; None
        for settings not read from a file. A :class:`ConfigError` when they are wrong."""
        return None if self.loaded_from is None else load_settings(*self.loaded_from)

    def reviewer(self, name: str) -> ReviewerProfile:
        try:
            return self.reviewers[name]
        except KeyError:
            known = ", ".join(sorted(self.reviewers)) or "none"
            raise ConfigError(f"no reviewer profile {name!r} (known: {known})") from None


OFFLINE = ReviewerProfile(
    name="offline",
    kind="offline",
    model="offline",
    partition="offline",
    timeout=120.0,
    concurrency=4,
)


class _Table:
    """One table of reviewq.toml: its unknown keys refused and its values read with their
    types checked, every error naming the table and the key."""

    def __init__(self, value: object, where: str, keys: set[str]) -> None:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table")
        self.data = value
        self.where = where
        extra = sorted(set(value) - keys)
        if extra:
            known = ", ".join(sorted(keys))
            raise ConfigError(f"{self._at(extra[0])}: unknown key (known: {known})")

    def _at(self, key: str) -> str:
        return f"{self.where} {key}".lstrip()

    def argv(self, key: str) -> tuple[str, ...]:
        """A command as a list, or as one string split the way a shell would."""
        value = self.data.get(key)
        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as exc:
                raise ConfigError(f"{self._at(key)}: {exc}") from None
        return self.strings(key)

    def string(self, key: str, default: str = "") -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            raise ConfigError(f"{self._at(key)}: expected a string")
        return value

    def exact(self, key: str, default: str = "") -> str:
        """A string matched exactly elsewhere (a profile's model and partition: ``--model``
        and every review name the partition). Given blank, or with blanks around it, it
        made reviews ``select --model`` could not name (it refuses a blank one) or that the
        partition written without the blanks never counted; "" meant the default in silence."""
        value = self.string(key, default)
        if key in self.data and not value.strip():
            raise ConfigError(f"{self._at(key)}: empty; name one, or leave the key out")
        if value != value.strip():
            raise ConfigError(f"{self._at(key)}: {value!r} has blanks around it")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self._at(key)}: expected true or false")
        return value

    def count(self, key: str, default: int, minimum: int = 1, maximum: int = 2**31 - 1) -> int:
        """A whole number; bounded above, as past SQLite's INTEGER every dispatch of the
        control failed for good (OverflowError), and a read of that many bytes did too."""
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{self._at(key)}: expected a whole number ≥ {minimum}")
        if value > maximum:
            raise ConfigError(
                f"{self._at(key)}: expected a whole number from {minimum} to {maximum}"
            )
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key)
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(f"{self._at(key)}: expected a string or a list of strings")

    def duration(self, key: str, default: float) -> float:
        return parse_duration(self.data.get(key, default), self._at(key))

    def string_table(self, key: str) -> dict[str, str]:
        value = self.data.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ConfigError(f"{self._at(key)}: expected a table of strings")
        return dict(value)


_PRICES = ("price_input_per_mtok", "price_output_per_mtok", "price_cached_input_per_mtok")


def _price(value: object, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e6:
        raise ConfigError(f"{where}: expected USD per million tokens, a number ≥ 0")
    return float(value)


_REVIEWER_KEYS = {
    "kind",
    "model",
    "partition",
    "max_turns",
    "timeout",
    "concurrency",
    "args",
    "env",
    "command",
    "executable",
    "base_url",
    "api_key_env",
    "connect_timeout",
    *_PRICES,
}
_SWEEP_KEYS = {
    "name",
    "select",
    "all_gates",
    "cron",
    "reviewer",
    "fixer",
    "auditor",
    "grouping",
    "batch_size",
    "fix",
    "sequential",
    "audit",
    "notes",
    "current",
    "budget_usd",
}
_QUEUE_KEYS = {
    "url",
    "lease_seconds",
    "reaper_seconds",
    "max_attempts",
    "launch_failures_before_pause",
    "pause_seconds",
    "launch_backoff_seconds",
    "poll_seconds",
}


def _check_placeholders(parts: tuple[str, ...], where: str) -> None:
    """An unknown ``{name}`` would fail every attempt at launch; refuse it now."""
    for part in parts:
        try:
            names = [f[1] for f in string.Formatter().parse(part) if f[1] is not None]
        except ValueError as exc:
            raise ConfigError(f"{where}: {part!r}: {exc}") from None
        for name in names:
            if name not in PLACEHOLDERS:
                known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                raise ConfigError(
                    f"{where}: unknown placeholder {{{name}}} in {part!r} (known: {known})"
                )


# What the OS refuses in a program's arguments and environment: checked here, or the
# worker's task failed before the agent started, and the job was "never picked up by a
# worker" again and again, for good.
def _launchable(parts: tuple[str, ...], where: str) -> tuple[str, ...]:
    for part in parts:
        if "\x00" in part:
            raise ConfigError(f"{where}: {part!r} holds a NUL character")
    return parts


def _launchable_env(env: dict[str, str], where: str) -> dict[str, str]:
    for name, value in env.items():
        if not name or "=" in name or "\x00" in name:
            raise ConfigError(f"{where}: {name!r} is no variable name")
        if "\x00" in value:
            raise ConfigError(f"{where}: {name}: a NUL character in its value")
    return env


# Keys only some kinds read: set on another, they were taken in silence (a wrapper
# command never run, an executable or an endpoint not used).
_ONLY_FOR = {
    "command": ("command",),
    "executable": ("claude", "codex", "gemini"),
    "base_url": ("openai",),
    "api_key_env": ("openai",),
    # Only these kinds can tell an endpoint out of reach from a slow answer: a command's
    # or offline profile's took it in silence and ran to its deadline, the job's loss.
    "connect_timeout": ("claude", "codex", "gemini", "openai"),
    # The offline reviewer is a program of reviewq's own that reads no argument, and
    # reports one turn and $0: a turn limit or a price given it changed nothing.
    "args": ("claude", "codex", "gemini", "command", "openai"),
    **dict.fromkeys(
        (
            "max_turns",
            "price_input_per_mtok",
            "price_output_per_mtok",
            "price_cached_input_per_mtok",
        ),
        ("claude", "codex", "gemini", "command", "openai"),
    ),
}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# ${NAME} anywhere, or a whole value $NAME in capitals, as a shell writes a variable
# ("$ecret99" is a password).
_ENV_REFERENCE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}|^\$[A-Z_][A-Z0-9_]*$")


# Request fields args may not set, and why. reviewq sets the first three itself: given in
# args, they recorded reviews under a model the partition does not name, or asked for a
# stream the agent cannot read. stream_options goes only with a stream: OpenAI and vLLM
# answer it with a 400, which read as the model's answer to the job and counted against it.
_OWN_FIELDS = {
    "model": "a field reviewq sets itself (the model: the profile's model)",
    "messages": "a field reviewq sets itself (the prompt)",
    "stream": "a field reviewq sets itself: it reads one whole answer, never a stream",
    "stream_options": "for a stream only, and reviewq reads one whole answer (a server "
    "answers it with an error)",
}


_MODEL = "a flag reviewq sets itself (the model: set the profile's model)"
_CONFINED = "a flag that lifts reviewq's confinement of the agent (docs/CONTRACT.md §8)"
# Claude goes on with a session already in the folder it runs in under that session's
# id: with --kb, the person's, whose transcript `forget` then removed with the attempt's.
_SESSION = "a flag that names the session (with --kb, a person's, forgotten with the attempt)"
# Codex's session log is where reviewq reads a killed run's tokens and the calls Codex
# refused (its --json shows neither): a run without one had a fixer's refused patch of the
# KB note said as a bare no-output. reviewq removes the log itself (forget).
_RECORD = (
    "a flag that keeps no session log of the run, where reviewq reads its tokens and the "
    "calls Codex refused"
)
# The CLI's output is where reviewq reads a run's turns, tokens and cost, and the error
# that says no model answered: with Claude's or Gemini's text output an expired key and a
# 500 were "exited 1 with no turns" under a warning line, and budgets counted nothing.
_OUTPUT = "a flag reviewq sets itself (its output, read for the turns, tokens and errors)"
# A vendor CLI's flags args may not give, and why. Profile args come last, so a later
# flag won over reviewq's: reviews made by another model were recorded under the
# profile's partition, or an agent wrote where reviewq keeps it out (the KB).
_OWN_FLAGS = {
    "claude": {
        "--model": _MODEL,
        "--fallback-model": _MODEL,
        "--permission-mode": _CONFINED,
        "--dangerously-skip-permissions": _CONFINED,
        "--allow-dangerously-skip-permissions": _CONFINED,
        "--tools": _CONFINED,
        "--allowedTools": _CONFINED,
        "--allowed-tools": _CONFINED,
        "--settings": _CONFINED,
        # MCP servers and plugins (their hooks, their servers) are commands Claude starts.
        "--mcp-config": _CONFINED,
        "--plugin-dir": _CONFINED,
        "--output-format": _OUTPUT,
        "--continue": _SESSION,
        "-c": _SESSION,
        "--resume": _SESSION,
        "-r": _SESSION,
        "--session-id": _SESSION,
        "--from-pr": _SESSION,
        "--teleport": _SESSION,
    },
    "codex": {
        "--model": _MODEL,
        "-m": _MODEL,
        "--sandbox": _CONFINED,
        "-s": _CONFINED,
        "--dangerously-bypass-approvals-and-sandbox": _CONFINED,
        "--cd": _CONFINED,
        "-C": _CONFINED,
        # A writable root beside the workspace: the KB given, a fixer wrote the note
        # itself, past every check of a fix (Claude's --add-dir and Gemini's
        # --include-directories leave their permissions and policy refusing it).
        "--add-dir": _CONFINED,
        "--ephemeral": _RECORD,
    },
    "gemini": {
        "--model": _MODEL,
        "-m": _MODEL,
        "--approval-mode": _CONFINED,
        "--yolo": _CONFINED,
        "-y": _CONFINED,
        "--policy": _CONFINED,
        # A policy of the admin tier outranks reviewq's own.
        "--admin-policy": _CONFINED,
        "--allowed-tools": _CONFINED,
        # Array flags, which add to reviewq's: a name allowed started the person's MCP
        # server of that name, and an extension beside "none" loads.
        "--allowed-mcp-server-names": _CONFINED,
        "--extensions": _CONFINED,
        "-e": _CONFINED,
        "--output-format": _OUTPUT,
        "-o": _OUTPUT,
    },
}


def _check_own_flags(kind: str, args: tuple[str, ...], where: str) -> None:
    """A vendor CLI profile's args may not give a flag reviewq sets (:data:`_OWN_FLAGS`),
    in any spelling its CLI's parser takes (:func:`_flags_given`)."""
    own = _OWN_FLAGS.get(kind, {})
    for before, arg in zip(("", *args), args, strict=False):
        for given, flag in _flags_given(kind, arg):
            if flag in own:
                raise ConfigError(f"{where}: {given!r} is {own[flag]}")
        if kind == "codex":
            given = _codex_override(before, arg)
            if given is not None and _codex_own_key(given.split()[-1]):
                raise ConfigError(f"{where}: {given!r} is {_CONFINED}")
            if (feature := _codex_enabled(before, arg)) in _CODEX_OWN_FEATURES:
                raise ConfigError(f"{where}: '--enable {feature}' is {_CONFINED}")


# Codex config keys reviewq sets with -c: Codex applies -c overrides in order, so a
# profile's, which come last, undid them (a writable root at the KB; a notify program
# or hooks or MCP servers, which run outside the sandbox; a project trusted again, whose
# config layer has its own).
_CODEX_OWN_KEYS = ("sandbox_workspace_write", "notify", "mcp_servers", "projects")
# Features reviewq turns off (``features.NAME``, ``--enable NAME``); a whole
# ``features`` table given with -c would replace them too.
_CODEX_OWN_FEATURES = ("hooks", "plugins")


def _codex_own_key(key: str) -> bool:
    """Whether the -c override of ``key`` undoes one reviewq gives."""
    head, _, rest = key.partition(".")
    return head in _CODEX_OWN_KEYS or (head == "features" and rest in ("", *_CODEX_OWN_FEATURES))


def _codex_enabled(before: str, arg: str) -> str | None:
    """The feature ``--enable NAME`` (or ``--enable=NAME``) turns on, ``arg`` after ``before``."""
    if before == "--enable":
        return arg.strip()
    if arg.startswith("--enable="):
        return arg.removeprefix("--enable=").strip()
    return None


def _codex_override(before: str, arg: str) -> str | None:
    """The ``-c KEY=VALUE`` override ``arg`` gives (after ``before``), as "-c KEY"."""
    for flag in ("-c", "--config"):
        if before == flag:
            return f"{flag} {arg.partition('=')[0].strip()}"
        if arg.startswith(flag) and len(arg) > len(flag):
            rest = arg[len(flag) :]
            if flag == "--config" and not rest.startswith("="):
                continue
            return f"{flag} {rest.removeprefix('=').partition('=')[0].strip()}"
    return None


def _flags_given(kind: str, arg: str) -> list[tuple[str, str]]:
    """The flags one word of args gives, each as written and as :data:`_OWN_FLAGS` names
    it. Listed as written only, they passed: Codex's parser (clap) takes a short flag's
    value in the same word (``-sdanger-full-access``, ``-m=o3``); Gemini's (yargs) takes
    a long name in camelCase (``--approvalMode yolo``) and short flags grouped (``-dy``)."""
    if arg.startswith("--"):
        name = arg.partition("=")[0]
        if kind == "gemini":
            return [(name, re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", name).lower())]
        return [(name, name)]
    if len(arg) < 2 or not arg.startswith("-"):
        return []
    if kind == "gemini":
        return [(f"-{c}", f"-{c}") for c in arg[1:].partition("=")[0]]
    return [(arg[:2], arg[:2])]


def _check_request_fields(args: tuple[str, ...], where: str) -> None:
    """An ``openai`` profile's args are fields of the request, ``name=value``: a CLI's
    ``--temperature 0`` passed the config and failed every attempt at launch."""
    for arg in args:
        field, sep, _ = arg.partition("=")
        if not sep or not field:
            raise ConfigError(f"{where}: {arg!r} is not name=value (a field of the request)")
        if field in _OWN_FIELDS:
            raise ConfigError(f"{where}: {field!r} is {_OWN_FIELDS[field]}")


def _shown_as_is(name: str, where: str) -> None:
    """Refuse a name reviewq prints in every listing (doctor, status, jobs, escalations,
    the report) that holds a character a terminal acts on or a reader cannot see: an
    escape retitled the window, a right-to-left override turned the line around it.
    Refused where it is written, as ``--runner`` is: it travels on to JSON and files.
    What the page shows by its escape (``logs.visible``), not every character Python
    calls unprintable: a Persian name's half-space, an emoji's joiner, a no-break space
    are writing, and refusing them stopped a reviewq.toml that had run for months."""
    if logs.visible(name, keep="") != name:
        raise ConfigError(
            f"{where}: {name!r}: a control or invisible character (a line break, a terminal "
            "escape, a bidi override) in it; reviewq shows this name as it is"
        )


def _reviewer(name: str, value: object) -> ReviewerProfile:
    _shown_as_is(name, f"[reviewers.{name!r}]")
    where = f"[reviewers.{name}]"
    t = _Table(value, where, _REVIEWER_KEYS)
    kind = t.data.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{where} kind: {kind!r} is not one of {', '.join(KINDS)}")
    # Before any value is judged: a connect_timeout not shorter than a command profile's
    # timeout was "must be shorter than timeout", and once shortened, refused anyway.
    for key, kinds in _ONLY_FOR.items():
        if key in t.data and kind not in kinds:
            raise ConfigError(
                f"{where} {key}: not read for kind {kind!r} (only {', '.join(kinds)})"
            )
    model = t.exact("model", "offline" if kind == "offline" else "")
    if kind not in ("offline", "command") and not model:
        raise ConfigError(f"{where} model: required for kind {kind!r}")
    for key, value in (("model", model), ("partition", t.exact("partition"))):
        _shown_as_is(value, f"{where} {key}")
    partition = t.exact("partition") or ("offline" if kind == "offline" else model or name)
    command = t.argv("command")
    if kind == "command":  # only this kind fills placeholders, in its command and args
        _check_placeholders((*command, *t.strings("args")), f"{where} command")
    if kind == "command" and not command:
        raise ConfigError(f"{where} command: required for kind 'command' (an argv list)")
    if kind == "command" and not command[0].strip():
        # Every launch failed ("not on PATH"), said only by doctor, until the profile paused.
        raise ConfigError(f"{where} command: its first word, the program to run, is empty")
    base_url = t.string("base_url")
    if kind == "openai" and not base_url:
        raise ConfigError(f"{where} base_url: required for kind 'openai'")
    if base_url and (problem := _http_url_problem(base_url)):
        # Else every attempt failed as an unreachable endpoint, and doctor saw nothing.
        raise ConfigError(f"{where} base_url: {_shown_http(base_url)!r} is {problem}")
    if kind == "openai":
        _check_request_fields(t.strings("args"), f"{where} args")
    _check_own_flags(kind, t.strings("args"), f"{where} args")
    timeout = t.duration("timeout", 1800)
    connect_timeout = None
    if "connect_timeout" in t.data:
        connect_timeout = t.duration("connect_timeout", timeout)
        if connect_timeout >= timeout:
            raise ConfigError(
                f"{where} connect_timeout: must be shorter than timeout ({timeout:g} s)"
            )
    prices = {k: _price(t.data.get(k), f"{where} {k}") for k in _PRICES}
    profile = ReviewerProfile(
        name=name,
        kind=kind,
        model=model,
        partition=partition,
        max_turns=t.count("max_turns", 20),
        timeout=timeout,
        concurrency=t.count("concurrency", 1),
        args=_launchable(t.strings("args"), f"{where} args"),
        env=_launchable_env(t.string_table("env"), f"{where} env"),
        command=_launchable(command, f"{where} command"),
        # Blank, it was no program at all (or the default, in silence): every launch failed.
        executable=_launchable((t.exact("executable"),), f"{where} executable")[0],
        base_url=base_url,
        api_key_env=t.string("api_key_env"),
        connect_timeout=connect_timeout,
        **prices,
    )
    if profile.api_key_env and not _ENV_NAME.fullmatch(profile.api_key_env):
        raise ConfigError(
            f"{where} api_key_env: names the variable that holds the key (such as "
            "OPENAI_API_KEY), never the key itself"
        )
    for name, value in profile.env.items():
        if _ENV_REFERENCE.search(value):
            raise ConfigError(
                f"{where} env: {name}: values are not expanded; {value!r} would be passed as "
                "it is (leave it out to pass the variable on from the environment)"
            )
    return profile


def gates_named(selectors: tuple[str, ...]) -> list[str]:
    """The selectors that name a bundle or a gate id. All gates (``--all-gates``,
    ``all_gates = true``) combine only with ``type`` and ``type/NAME``: beside them, a
    bundle was dropped without a word and every gate reviewed."""
    return [s for s in selectors if not type_selector(s)]


def type_selector(selector: str) -> bool:
    """Whether a selector asks for the type lens or one type spec (``type``, ``type/NAME``),
    read as the catalog reads it, without the spaces and slashes around it."""
    n = selector.strip().strip("/")
    return n == "type" or n.startswith("type/")


def _sweep(value: object, index: int) -> SweepConfig:
    where = f"[[sweeps]] #{index + 1}"
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a table")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where} name: required, a string")
    if name == "cli":
        # A plain `reviewq enqueue` (--name cli, the default) ran that entry instead of
        # what its options asked for, and refused most of them.
        raise ConfigError(
            f"{where} name 'cli': the name a sweep run from the command line gets; choose another"
        )
    _shown_as_is(name, f"{where} name")
    where = f"[[sweeps]] {name!r}"
    t = _Table(value, where, _SWEEP_KEYS)
    grouping = t.string("grouping", "note")
    if grouping not in GROUPINGS:
        raise ConfigError(f"{where} grouping: {grouping!r} is not one of {', '.join(GROUPINGS)}")
    budget = t.data.get("budget_usd")
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int | float) or not 0 <= budget < 1e12
    ):
        raise ConfigError(f"{where} budget_usd: expected a number ≥ 0")
    for role in ("reviewer", "fixer", "auditor"):
        if t.data.get(role) == "":
            raise ConfigError(f"{where} {role}: empty; name a reviewer profile or leave it out")
    cron = cron_fields(t.string("cron"), f"{where} cron")
    if cron:
        check_cron(cron, f"{where} cron")
    for key in ("notes", "select", "audit"):
        if any(not v.strip() for v in t.strings(key)):
            # As `--note ''` is on the command line (a template's unset variable): notes
            # took it for ROOT, every note, and select and audit for a name no gate has.
            raise ConfigError(f"{where} {key}: an empty entry; name one, or leave it out")
    select = t.strings("select")
    all_gates = t.flag("all_gates", not select)
    if not select and not all_gates:  # else "nothing to select" at every cron minute
        raise ConfigError(f"{where}: selects nothing: name gates in select, or all_gates = true")
    if all_gates and (named := gates_named(select)):
        raise ConfigError(
            f"{where} select: all_gates selects every catalog gate: name no bundle or gate id "
            f"beside it ({', '.join(map(repr, named))})"
        )
    return SweepConfig(
        name=name,
        select=select,
        all_gates=all_gates,
        cron=cron,
        reviewer=t.string("reviewer", "offline"),
        fixer=t.string("fixer"),
        auditor=t.string("auditor"),
        grouping=grouping,
        batch_size=t.count("batch_size", 5),
        fix=t.flag("fix"),
        sequential=t.flag("sequential"),
        audit=t.strings("audit"),
        notes=t.strings("notes"),
        current=t.flag("current"),
        budget_usd=None if budget is None else float(budget),
    )


def load_settings(
    root: str | Path = ".", state: str | Path | None = None, config: str | Path | None = None
) -> Settings:
    root_path = Path(root).resolve()
    try:
        is_dir = root_path.is_dir()
    except OSError as exc:  # a name too long for the file system
        raise ConfigError(f"--root {root}: not a folder ({exc.strerror or exc})") from None
    if not is_dir:
        # A mistyped --root would otherwise read as a KB with nothing in it.
        raise ConfigError(f"--root {root}: not a folder")
    config_path = Path(config) if config else root_path / "reviewq.toml"
    data: dict = {}
    # Given as --config, a path to no file (or to a folder) is the option's mistake: say so.
    text = _config_text(config_path, "--config " if config else "")
    if text is not None:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{config_path}: {exc}") from None
    elif config:
        raise ConfigError(f"--config {config_path}: no such file")
    try:
        settings = _settings(data, root_path, state)
    except ConfigError as exc:
        raise ConfigError(f"{config_path} {exc}") from None
    problems = {k: f"{config_path} {v}" for k, v in settings.sweeps_left_out.items()}
    ignored = tuple(f"{config_path} {v}" for v in settings.sweeps_ignored)
    settings = replace(settings, sweeps_left_out=problems, sweeps_ignored=ignored)
    where = "--state" if state else f"{config_path} [state] dir"
    try:
        there = settings.state_dir.exists()
        link = None if there else _link_to_nothing(settings.state_dir)
    except OSError as exc:  # a name too long for the file system
        raise ConfigError(f"{where} {settings.state_dir}: {exc.strerror or exc}") from None
    if link is not None:
        # Resolved, the folder it names was made, under the mount point of a disk not
        # mounted, and a new record started there: every pair queued again for agents.
        raise ConfigError(
            f"{where} {settings.state_dir}: {link} is a symbolic link to {os.readlink(link)}, "
            "which does not exist (a disk not mounted?); mount or make what it links to"
        )
    settings = replace(settings, state_dir=settings.state_dir.resolve())
    if there and not settings.state_dir.is_dir():
        raise ConfigError(f"{where} {settings.state_dir}: not a folder")
    logs.add_secrets(value for _, value in secrets_held(settings))
    for profile in settings.reviewers.values():
        if profile.api_key_env:  # named by the profile: a key, whatever its name says
            logs.add_secrets([os.environ.get(profile.api_key_env, "")])
    return replace(
        settings,
        config_path=config_path if config_path.exists() else None,
        loaded_from=(root, state, config),
    )


def secrets_held(settings: Settings) -> list[tuple[str, str]]:
    """The passwords and keys the settings themselves hold, each with where it is: the
    queue URL's password (in its user part, or its query: redis-py takes ``?password=``
    too, and a TLS key's ``ssl_password``), a profile's ``env`` value under a secret's
    name or under the name its ``api_key_env`` gives (its agent reads the table first)."""
    held = []
    if settings.queue.url:
        parts = urlsplit(settings.queue.url)
        query = [
            (f"[queue] url's {k}", v)
            for k, _, v in (i.partition("=") for i in parts.query.split("&"))
            if logs.secret_name(k)
        ]
        for where, written in [("[queue] url's password", parts.password or ""), *query]:
            # As the file writes it (``%40``), and as redis-py sends it (``@``).
            for password in dict.fromkeys([written, unquote(written), unquote_plus(written)]):
                if password:
                    held.append((where, password))
    for name, profile in sorted(settings.reviewers.items()):
        for var, value in profile.env.items():
            if value and (logs.secret_name(var) or var == profile.api_key_env):
                held.append((f"[reviewers.{name}] env {var}", value))
    return held


def settings_exposed(settings: Settings) -> str | None:
    """A settings file holding a password or a key that other users of the machine may
    read (a file written under umask 022 is 0644), or None; never the secret itself."""
    path = settings.config_path
    held = list(dict.fromkeys(where for where, _ in secrets_held(settings)))
    try:
        mode = path.stat().st_mode if path is not None and held else 0
    except OSError:
        return None
    if not mode & 0o044:
        return None
    return (
        f"{path} holds {', '.join(held)} and other users may read it (mode "
        f"{mode & 0o777:04o}): chmod 600 {path}"
    )


def _config_text(path: Path, option: str = "") -> str | None:
    """The settings file's text; None where there is none. A FIFO there held every command
    for good, and a symbolic link to nothing was read as no settings at all. ``option``
    (``--config ``) begins a line about what is at the path."""
    try:
        fd = open_regular(path)
    except NotRegular as exc:
        raise ConfigError(
            f"{option}{path}: {exc.kind}; reviewq reads its settings from a TOML file"
        ) from None
    except OSError as exc:  # no permission
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    if fd is None:
        if path.is_symlink():
            raise ConfigError(
                f"{option}{path}: a symbolic link to {os.readlink(path)}, which does not exist"
            )
        return None
    with open(fd, "rb") as f:
        raw = f.read()
    try:
        # Windows editors save UTF-8 with a BOM, which tomllib takes for a statement.
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start + 1})") from None


def _note_roots(kb: _Table) -> tuple[str, ...]:
    """The note roots, normalised (``./wiki/`` is ``wiki``: as written, the folder watched
    while agents ran was ``.``, all of ROOT): what no KB can make right is refused here,
    before a command reads the KB (what is under ROOT, the selector checks)."""
    roots = kb.strings("note_roots")
    if "note_roots" in kb.data and not roots:
        # An empty list meant the default in silence.
        raise ConfigError("[kb] note_roots: empty; name the folders of notes (default kb/notes)")
    for r in roots:
        if not r.strip() or os.path.normpath(r) == ".":
            raise ConfigError(
                f"[kb] note_roots: {r!r} names all of ROOT, the gates and type specs "
                "included; name the folders of notes (default kb/notes)"
            )
        if os.path.isabs(r):
            raise ConfigError(
                f"[kb] note_roots: {r}: an absolute path; name a folder under ROOT, "
                "relative to it (default kb/notes)"
            )
    return tuple(posixpath.normpath(r.strip()).strip("/") for r in roots)


def _exclude(kb: _Table, note_roots: tuple[str, ...]) -> tuple[str, ...]:
    """``[kb] exclude``: each glob checked as it loads, so a typo is one line at every
    command rather than a note reviewed (or left out) in silence."""
    value = kb.data.get("exclude", [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            '[kb] exclude: expected a list of globs, e.g. ["**/README.md", "templates/**"]'
        )
    for glob in value:
        try:
            glob_regex(glob)
        except ValueError as exc:
            raise ConfigError(f"[kb] exclude: {glob!r}: {exc}") from None
        # Written from ROOT, as note_roots are, it matched no note and said nothing.
        if root := next((r for r in note_roots if glob.startswith(f"{r}/")), None):
            raise ConfigError(
                f"[kb] exclude: {glob!r}: starts with the note root {root!r}; globs are "
                f"relative to the note roots ({glob.removeprefix(root + '/')!r})"
            )
    return tuple(value)


def glob_regex(glob: str) -> re.Pattern[str]:
    """A note glob as a regex over a path relative to a note root, matched whole: ``*``
    and ``?`` stay within one folder, ``[abc]`` is a class, and ``**`` (a whole part
    only) stands for any number of folders, none included (``**/README.md`` matches the
    root's own README.md). ValueError says why a glob cannot be one."""
    if not glob.strip():
        raise ValueError("empty")
    if glob.startswith("/"):
        raise ValueError("starts with '/'; globs are relative to the note roots")
    if "\\" in glob:
        raise ValueError("a backslash; note paths use '/'")
    parts = glob.split("/")
    if glob.endswith("/"):
        raise ValueError("ends with '/'; name the files (a folder's: 'folder/**')")
    out = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part in ("", ".", ".."):
            what = f"a {part!r}" if part else "an empty"
            raise ValueError(f"{what} part; name paths under the note roots")
        if part == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
            continue
        if "**" in part:
            raise ValueError("'**' only as a whole part ('a/**/b', not 'a**')")
        out.append(_part_regex(part) + ("" if last else "/"))
    try:
        # DOTALL: a name may hold a newline (a `templates/**` note too is excluded).
        return re.compile("".join(out), re.DOTALL)
    except re.error as exc:  # '[z-a]': a range backwards
        raise ValueError(f"not a glob ({exc.msg})") from None


def _part_regex(part: str) -> str:
    out, i = [], 0
    while i < len(part):
        c = part[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = i + 1 + (part[i + 1 : i + 2] == "!")
            j += part[j : j + 1] == "]"  # a ']' first is one of the class
            end = part.find("]", j)
            if end == -1:
                raise ValueError("'[' without its ']'")
            body = part[i + 1 : end]
            negated = body.startswith("!")
            # ']' (first, so one of the class), '[', '^' and '&&', '~~', '||' are letters
            # of a glob's class: escaped, not read as regex syntax ('[!]a]' was '[^/]a]',
            # a class then "a]") or warned of as a nested set.
            body = re.sub(r"([\\[\]^&~|])", r"\\\1", body[negated:])
            out.append(("[^/" if negated else "[") + body + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _link_to_nothing(path: Path) -> Path | None:
    """The symbolic link, ``path`` or a folder above it, that names nothing, if one does."""
    for p in (path, *path.parents):
        if p.exists():
            return None
        if p.is_symlink():
            return p
    return None


def _settings(data: dict, root_path: Path, state: str | Path | None) -> Settings:
    """Settings from the parsed file; a ConfigError names the table and the key."""
    top = _Table(data, "", {"kb", "state", "reviewers", "queue", "sweeps", "limits", "fix"})
    kb = _Table(top.data.get("kb"), "[kb]", {"note_roots", "exclude"})
    note_roots = _note_roots(kb)
    exclude = _exclude(kb, note_roots or ("kb/notes",))
    state_dir_name = _Table(top.data.get("state"), "[state]", {"dir"}).string("dir", ".reviewq")
    if not state_dir_name.strip():  # would put state.db, jobs/ and logs/ beside kb/
        raise ConfigError("[state] dir: empty; name the state folder (default .reviewq)")
    limits = _Table(top.data.get("limits"), "[limits]", {"max_output_bytes", "max_note_bytes"})
    max_output = limits.count("max_output_bytes", 5 * 1024 * 1024, maximum=2**30)
    max_note = limits.count("max_note_bytes", MAX_NOTE_BYTES, maximum=2**30)
    fix = FixSettings(
        git_commit=_Table(top.data.get("fix"), "[fix]", {"git_commit"}).flag("git_commit")
    )
    # "~/x" made a folder named "~" in ROOT, which a later `rm -rf ~*` would meet.
    state_dir = Path(state) if state else root_path / Path(state_dir_name).expanduser()
    if not state_dir.is_absolute():
        state_dir = (Path.cwd() / state_dir) if state else (root_path / state_dir)

    reviewers_t = top.data.get("reviewers", {})
    if not isinstance(reviewers_t, dict):
        raise ConfigError("[reviewers]: expected a table")
    reviewers = {name: _reviewer(name, table) for name, table in reviewers_t.items()}
    reviewers.setdefault("offline", OFFLINE)

    q = _Table(top.data.get("queue"), "[queue]", _QUEUE_KEYS)
    queue = QueueSettings(
        url=q.string("url"),
        lease_seconds=q.duration("lease_seconds", 120),
        reaper_seconds=q.duration("reaper_seconds", 60),
        max_attempts=q.count("max_attempts", 3),
        launch_failures_before_pause=q.count("launch_failures_before_pause", 5),
        pause_seconds=q.duration("pause_seconds", 900),
        launch_backoff_seconds=q.duration("launch_backoff_seconds", 5),
        poll_seconds=q.duration("poll_seconds", 1.0),
    )
    if queue.url and (problem := _queue_url_problem(queue.url) or _redis_missing()):
        raise ConfigError(f"[queue] url: {problem}")

    sweeps, left_out, ignored = _sweeps(top.data.get("sweeps", []), reviewers)
    return Settings(
        root=root_path,
        state_dir=state_dir,  # resolved by load_settings, once a link to nothing is refused
        config_path=None,
        note_roots=note_roots or ("kb/notes",),
        exclude=exclude,
        max_output_bytes=max_output,
        max_note_bytes=max_note,
        reviewers=reviewers,
        queue=queue,
        sweeps=sweeps,
        fix=fix,
        sweeps_left_out=left_out,
        sweeps_ignored=ignored,
        state_given=bool(state),
    )


def _sweeps(
    value: object, reviewers: dict[str, ReviewerProfile]
) -> tuple[dict[str, SweepConfig], dict[str, str], tuple[str, ...]]:
    """The usable ``[[sweeps]]`` entries, and why each other one is left out. A bad entry
    is its own problem, not the file's: raised, it stopped every command (`status` at
    7 a.m. included) and a control restarted in the night, whose other sweeps and
    outcomes then waited until a person came. Left out, it neither fires nor runs by
    name; every command says so (a ``warning:`` line), `doctor` fails on it and the
    control logs it as it starts. A name defined twice leaves out both: which one was
    meant is a guess. Third, what a usable entry says that is not used."""
    if not isinstance(value, list):
        return {}, {"[[sweeps]]": "[[sweeps]]: expected an array of tables"}, ()
    sweeps: dict[str, SweepConfig] = {}
    problems: dict[str, str] = {}
    ignored: dict[str, str] = {}
    for i, t in enumerate(value):
        name = t.get("name") if isinstance(t, dict) else None
        key = name if isinstance(name, str) and name and name != "cli" else f"#{i + 1}"
        if key in sweeps or key in problems:
            sweeps.pop(key, None)
            problems[key] = f"[[sweeps]] {key!r}: defined twice; neither runs until one is renamed"
            continue
        try:
            s = _sweep(t, i)
            # Like a bad cron expression: said now, not by a cron run failing every night.
            for role in ("reviewer", "fixer", "auditor"):
                profile = getattr(s, role)
                if profile and profile not in reviewers:
                    known = ", ".join(sorted(reviewers))
                    raise ConfigError(
                        f"[[sweeps]] {s.name!r} {role}: no reviewer profile {profile!r} "
                        f"(known: {known})"
                    )
        except ConfigError as exc:
            problems[key] = str(exc)
            continue
        sweeps[s.name] = s
        if s.grouping == "note" and "batch_size" in t:
            # Dropped without a word, as --batch-size was on the command line (F38). The
            # entry is not left out: it runs as it would without the key.
            ignored[s.name] = (
                f'[[sweeps]] {s.name!r} batch_size: notes per job with grouping = "gate" '
                'only; grouping "note" makes one job per note and lens, so it is not used'
            )
    return sweeps, problems, tuple(v for k, v in ignored.items() if k in sweeps)


_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
# Each field's name and range, as cron(5) gives them (weekday 7 is Sunday too).
_CRON_FIELDS = [
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("weekday", 0, 7),
]
# The names cron(5) takes, as numbers, for the month (field 3) and weekday (field 4).
_CRON_NAMES = {
    3: {m: i for i, m in enumerate(_MONTHS, 1)},
    4: {d: i for i, d in enumerate(_DAYS)},
}


# cron(5)'s nicknames for the five fields (`@daily` was "expected five fields").
_CRON_NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def cron_fields(expr: str, where: str = "cron") -> str:
    """``expr`` as five fields: a nickname of cron(5) (``@daily``) as the fields it stands
    for. ``@reboot`` names no time, and a control restarted in the night would run it."""
    nickname = expr.strip()
    if not nickname.startswith("@"):
        return expr
    if nickname in _CRON_NICKNAMES:
        return _CRON_NICKNAMES[nickname]
    if nickname == "@reboot":
        raise ConfigError(
            f"{where} '@reboot': a sweep runs at a time, not when a process starts; "
            "give one (such as @daily, or '0 2 * * *')"
        )
    raise ConfigError(
        f"{where} {expr!r}: not one of cron(5)'s nicknames ({', '.join(_CRON_NICKNAMES)})"
    )


def cron_iter(expr: str, start: datetime) -> croniter:
    """``expr`` from ``start``, with cron(5)'s days: when the day of month or the weekday
    field starts with ``*`` (``*/2``), a day must match both; croniter's default took
    either, and ``0 3 */2 * 1-5`` (odd days that are weekdays) fired on weekends too."""
    fields = expr.split()
    both = len(fields) == 5 and (fields[2].startswith("*") or fields[4].startswith("*"))
    from croniter import croniter

    return croniter(expr, start, day_or=not both)


def check_cron(expr: str, where: str = "cron") -> None:
    """A bad cron expression is refused when the settings load, not at 3 a.m."""
    if len(expr.split()) != 5:
        raise ConfigError(f"{where} {expr!r}: expected five fields: minute hour day month weekday")
    for i, field_ in enumerate(expr.split()):
        # croniter also takes R (a random value, drawn anew at each check: a daily sweep
        # fired many times a day), H, L, W, #, ? and ranges that run backwards (wrapped
        # around), which cron(8) does not.
        names = _CRON_NAMES.get(i, {})
        odd = re.search(r"[^0-9A-Za-z*,/-]", field_)
        words = [w for w in re.findall(r"[A-Za-z]+", field_) if w.lower() not in names]
        if odd or words:
            what = odd.group() if odd else words[0]
            raise ConfigError(f"{where} {expr!r}: {what!r} is not part of cron(5) syntax")
        # Said as "not a valid cron expression", which field and why left to a guess.
        what, low_, high_ = _CRON_FIELDS[i]
        for item in field_.split(","):
            values, _, step = item.partition("/")
            for v in re.findall(r"\d+", values):
                if not low_ <= int(v) <= high_:
                    raise ConfigError(
                        f"{where} {expr!r}: {what} {v} is out of range ({low_}-{high_})"
                    )
            if step.isdigit() and int(step) == 0:
                raise ConfigError(f"{where} {expr!r}: a step of 0 in the {what} field")
        for low, high in re.findall(r"(\w+)-(\w+)", field_):
            a, b = (int(v) if v.isdigit() else names[v.lower()] for v in (low, high))
            if a > b:
                raise ConfigError(f"{where} {expr!r}: the range {low}-{high} runs backwards")
    from croniter import CroniterBadDateError, croniter

    if not croniter.is_valid(expr):
        raise ConfigError(f"{where} {expr!r}: not a valid cron expression")
    try:
        cron_iter(expr, datetime.now()).get_next()
    except CroniterBadDateError:
        raise ConfigError(f"{where} {expr!r}: matches no date (such as 31 February)") from None
