"""reviewq.toml → typed settings: paths, reviewer profiles (SPEC §8), the queue, sweeps (§9).

The file is optional; every setting has a default, and an ``offline`` reviewer profile
exists unless the file defines one, so a fresh checkout runs end to end.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from croniter import croniter

from orchestrator import logs

KINDS = ("claude", "codex", "gemini", "command", "openai", "offline")
GROUPINGS = ("note", "gate")
_DURATION = re.compile(
    r"^\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*$"
)


class ConfigError(ValueError):
    """reviewq.toml says something reviewq cannot use; the message names the key."""


def parse_duration(value: object, where: str) -> float:
    """Seconds from a number or a string such as "30m", "90s", "1h30m"."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected seconds or a duration like '30m'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        m = _DURATION.match(value)
        if not m or not any(m.groups()):
            raise ConfigError(f"{where}: {value!r} is not a duration like '30m', '90s', '1h30m'")
        h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        seconds = h * 3600 + mi * 60 + s
    else:
        raise ConfigError(f"{where}: expected seconds or a duration like '30m'")
    if seconds <= 0:
        raise ConfigError(f"{where}: must be more than 0 seconds")
    return seconds


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
    poll_seconds: float = 0.05  # how often an idle SQLite consumer looks at its queue


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
    max_output_bytes: int = 5 * 1024 * 1024
    reviewers: dict[str, ReviewerProfile] = field(default_factory=dict)
    queue: QueueSettings = field(default_factory=QueueSettings)
    sweeps: dict[str, SweepConfig] = field(default_factory=dict)
    fix: FixSettings = field(default_factory=FixSettings)

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


def _strs(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"{where}: expected a string or a list of strings")


def _int(value: object, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}: expected a whole number ≥ {minimum}")
    return value


def _known(table: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise ConfigError(f"{where}: unknown key {extra[0]!r}")


_PRICES = ("price_input_per_mtok", "price_output_per_mtok", "price_cached_input_per_mtok")


def _price(value: object, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e6:
        raise ConfigError(f"{where}: expected USD per million tokens, a number ≥ 0")
    return float(value)


def _reviewer(name: str, t: dict) -> ReviewerProfile:
    where = f"[reviewers.{name}]"
    _known(
        t,
        {
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
        },
        where,
    )
    kind = t.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{where} kind: {kind!r} is not one of {', '.join(KINDS)}")
    model = t.get("model", "offline" if kind == "offline" else "")
    if not isinstance(model, str):
        raise ConfigError(f"{where} model: expected a string")
    if kind not in ("offline", "command") and not model:
        raise ConfigError(f"{where} model: required for kind {kind!r}")
    partition = t.get("partition") or ("offline" if kind == "offline" else model or name)
    env = t.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{where} env: expected a table of strings")
    command = _strs(t.get("command"), f"{where} command")
    if kind == "command" and not command:
        raise ConfigError(f"{where} command: required for kind 'command' (an argv list)")
    if kind == "openai" and not t.get("base_url"):
        raise ConfigError(f"{where} base_url: required for kind 'openai'")
    timeout = parse_duration(t.get("timeout", 1800), f"{where} timeout")
    connect_timeout = None
    if "connect_timeout" in t:
        connect_timeout = parse_duration(t["connect_timeout"], f"{where} connect_timeout")
        if connect_timeout >= timeout:
            raise ConfigError(
                f"{where} connect_timeout: must be shorter than timeout ({timeout:g} s)"
            )
    prices = {k: _price(t.get(k), f"{where} {k}") for k in _PRICES}
    return ReviewerProfile(
        name=name,
        kind=kind,
        model=model,
        partition=str(partition),
        max_turns=_int(t.get("max_turns", 20), f"{where} max_turns"),
        timeout=timeout,
        concurrency=_int(t.get("concurrency", 1), f"{where} concurrency"),
        args=_strs(t.get("args"), f"{where} args"),
        env=dict(env),
        command=command,
        executable=str(t.get("executable", "")),
        base_url=str(t.get("base_url", "")),
        api_key_env=str(t.get("api_key_env", "")),
        connect_timeout=connect_timeout,
        **prices,
    )


def _sweep(t: dict, index: int) -> SweepConfig:
    name = t.get("name")
    where = f"[[sweeps]] #{index + 1}"
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: name is required")
    where = f"[[sweeps]] {name!r}"
    _known(
        t,
        {
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
        },
        where,
    )
    grouping = t.get("grouping", "note")
    if grouping not in GROUPINGS:
        raise ConfigError(f"{where} grouping: {grouping!r} is not one of {', '.join(GROUPINGS)}")
    budget = t.get("budget_usd")
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, int | float) or budget < 0
    ):
        raise ConfigError(f"{where} budget_usd: expected a number ≥ 0")
    cron = str(t.get("cron", ""))
    if cron:
        check_cron(cron, f"{where} cron")
    select = _strs(t.get("select"), f"{where} select")
    all_gates = bool(t.get("all_gates", not select))
    return SweepConfig(
        name=name,
        select=select,
        all_gates=all_gates,
        cron=str(t.get("cron", "")),
        reviewer=str(t.get("reviewer", "offline")),
        fixer=str(t.get("fixer", "")),
        auditor=str(t.get("auditor", "")),
        grouping=grouping,
        batch_size=_int(t.get("batch_size", 5), f"{where} batch_size"),
        fix=bool(t.get("fix", False)),
        sequential=bool(t.get("sequential", False)),
        audit=_strs(t.get("audit"), f"{where} audit"),
        notes=_strs(t.get("notes"), f"{where} notes"),
        current=bool(t.get("current", False)),
        budget_usd=None if budget is None else float(budget),
    )


def _fix(t: object) -> FixSettings:
    if not isinstance(t, dict):
        raise ConfigError("[fix]: expected a table")
    _known(t, {"git_commit"}, "[fix]")
    git_commit = t.get("git_commit", False)
    if not isinstance(git_commit, bool):
        raise ConfigError("[fix] git_commit: expected true or false")
    return FixSettings(git_commit=git_commit)


def load_settings(
    root: str | Path = ".", state: str | Path | None = None, config: str | Path | None = None
) -> Settings:
    root_path = Path(root).resolve()
    config_path = Path(config) if config else root_path / "reviewq.toml"
    data: dict = {}
    if config_path.exists():
        try:
            data = tomllib.loads(config_path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{config_path}: {exc}") from None
    elif config:
        raise ConfigError(f"{config_path}: no such file")
    where = str(config_path)
    _known(data, {"kb", "state", "reviewers", "queue", "sweeps", "limits", "fix"}, where)

    kb_t = data.get("kb", {})
    note_roots = _strs(kb_t.get("note_roots"), f"{where} [kb] note_roots") or ("kb/notes",)
    state_dir = (
        Path(state) if state else root_path / str(data.get("state", {}).get("dir", ".reviewq"))
    )
    if not state_dir.is_absolute():
        state_dir = (Path.cwd() / state_dir) if state else (root_path / state_dir)

    reviewers: dict[str, ReviewerProfile] = {}
    for name, table in (data.get("reviewers") or {}).items():
        if not isinstance(table, dict):
            raise ConfigError(f"{where} [reviewers.{name}]: expected a table")
        try:
            reviewers[name] = _reviewer(name, table)
        except ConfigError as exc:
            raise ConfigError(f"{where} {exc}") from None
    reviewers.setdefault("offline", OFFLINE)

    q = data.get("queue", {})
    try:
        _known(
            q,
            {
                "url",
                "lease_seconds",
                "reaper_seconds",
                "max_attempts",
                "launch_failures_before_pause",
                "pause_seconds",
                "launch_backoff_seconds",
                "poll_seconds",
            },
            "[queue]",
        )
        queue = QueueSettings(
            url=str(q.get("url", "")),
            lease_seconds=parse_duration(q.get("lease_seconds", 120), "[queue] lease_seconds"),
            reaper_seconds=parse_duration(q.get("reaper_seconds", 60), "[queue] reaper_seconds"),
            max_attempts=_int(q.get("max_attempts", 3), "[queue] max_attempts"),
            launch_failures_before_pause=_int(
                q.get("launch_failures_before_pause", 5), "[queue] launch_failures_before_pause"
            ),
            pause_seconds=parse_duration(q.get("pause_seconds", 900), "[queue] pause_seconds"),
            launch_backoff_seconds=parse_duration(
                q.get("launch_backoff_seconds", 5), "[queue] launch_backoff_seconds"
            ),
            poll_seconds=parse_duration(q.get("poll_seconds", 0.05), "[queue] poll_seconds"),
        )
        sweeps: dict[str, SweepConfig] = {}
        for i, t in enumerate(data.get("sweeps") or []):
            s = _sweep(t, i)
            if s.name in sweeps:
                raise ConfigError(f"[[sweeps]] {s.name!r}: defined twice")
            sweeps[s.name] = s
        fix = _fix(data.get("fix", {}))
        limits = data.get("limits", {})
        max_output = _int(
            limits.get("max_output_bytes", 5 * 1024 * 1024), "[limits] max_output_bytes"
        )
    except ConfigError as exc:
        raise ConfigError(f"{where} {exc}") from None
    if queue.url and not queue.url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(
            f"{where} [queue] url: only redis:// URLs are supported (or leave it out for SQLite)"
        )

    for profile in reviewers.values():
        logs.add_secrets(v for k, v in profile.env.items() if logs.secret_name(k))
    if queue.url:
        logs.add_secrets([urlsplit(queue.url).password or ""])
    return Settings(
        root=root_path,
        state_dir=state_dir.resolve(),
        config_path=config_path if config_path.exists() else None,
        note_roots=note_roots,
        max_output_bytes=max_output,
        reviewers=reviewers,
        queue=queue,
        sweeps=sweeps,
        fix=fix,
    )


def check_cron(expr: str, where: str = "cron") -> None:
    """A bad cron expression is refused when the settings load, not at 3 a.m."""
    if len(expr.split()) != 5:
        raise ConfigError(f"{where} {expr!r}: expected five fields: minute hour day month weekday")
    if not croniter.is_valid(expr):
        raise ConfigError(f"{where} {expr!r}: not a valid cron expression")
