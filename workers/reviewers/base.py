"""The reviewer adapter contract, documented once here; each kind is a short subclass.

An adapter turns one attempt into a process to run and reads back what that process
reported. It never waits, retries, kills or parses bundles: ``workers.attempt`` does that
once for every kind, and ``orchestrator.review.finalize`` judges the output.

What an adapter gets: an :class:`AttemptSpec` — the task (``review``, ``fix`` or ``audit``),
the job id and attempt number, the paths of the prompt, of the output file the agent must
write, of the job and attempt folders and of the telemetry file, the KB root, the model, and
for a fix the note to rewrite (and ``REVIEWQ_NOTE_FILE``, the text the fixer was given) — plus the :class:`ReviewerProfile` it was built from.

What it returns:
- :meth:`Reviewer.command` → a :class:`Command`: argv, extra environment, working folder.
  The agent runs in its own process group with stdin closed, stdout and stderr going to
  the attempt's log files, and inherits reviewq's environment plus ``Command.env``.
- :meth:`Reviewer.telemetry` → a :class:`Telemetry` read after the process ended, from its
  stdout (vendor CLIs print JSON) or from ``REVIEWQ_TELEMETRY_PATH``. When the CLI reports
  an error in its own structured form, ``error`` holds its message (one bounded line) and,
  if that error means no model answered — a rejected key, a rate limit, a spent quota, an
  endpoint out of reach — ``failure`` names the kind (``vendor.failure_kind``; ``config``
  when the CLI refused the set-up reviewq gave it). Such an attempt is the reviewer's
  failure, never a verdict on the job: it does not count, the job waits and the profile
  pauses as after a launch failure. When the model stopped at its output-token limit
  (the job asked for more than one answer holds), ``error_subtype`` is
  :data:`OUTPUT_LIMIT`: the attempt is burned out, so a job of several pairs splits.
  ``last_words`` holds the model's last message of a run that ended without an error
  (one bounded line): said after a no-output's reason, where a refusal ("I can't help
  with that") is the model's answer to the job, as the ``openai`` kind says its refusal.
- :meth:`Reviewer.unreachable` → while the process runs, past the profile's
  ``connect_timeout``: the CLI's own words if its output so far says it has not reached its
  endpoint (it is then ended), else None.
- :meth:`Reviewer.forget` → on a worker, once the attempt has ended there (its outcome
  sent, its agent stopped with the worker, or its folder found at the next start after
  the worker was killed): the CLI's own state kept in its home for the attempt's run (a
  project folder, a session, rows of it) removed, never a person's own.
- :meth:`Reviewer.answered` → after a process killed at its deadline: whether any model
  response reached the CLI, from what it left (its events, its session or chat log). A
  deadline with no answer at all is a hung endpoint, the reviewer's failure; one after
  answers is the job's (too big: burned out). True when a kind cannot tell.
The output itself is the file at ``spec.output_path``: it exists or it does not.
Costs: a CLI that reports no ``cost_usd`` gets one from the profile's per-million-token
prices (:func:`priced`), so sweep budgets hold for every kind.
"""

from __future__ import annotations

import json
import os
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from orchestrator.config import PLACEHOLDERS, ReviewerProfile
from orchestrator.state.store import storable_number

TASKS = ("review", "fix", "audit")
OUTPUT_LIMIT = "max_output_tokens"  # Telemetry.error_subtype: the model's answer hit its cap
_MAX_TELEMETRY_BYTES = 1_000_000  # a few numbers; anything longer is not telemetry
# What reading a CLI's JSON may raise: not JSON, or nested deeper than the parser goes.
UNREADABLE = (ValueError, RecursionError)


@dataclass(frozen=True)
class AttemptSpec:
    task: str
    job_id: int
    attempt: int
    prompt_path: Path
    output_path: Path
    job_dir: Path
    attempt_dir: Path
    root: Path
    model: str
    note_path: str | None = None  # fix only: the note to rewrite, root-relative
    # fix only: the text the fixer was given, as a file (a worker may have no KB to read)
    note_file: Path | None = None
    # The attempt's opening as the control recorded it (the message's ``opened_at``): two
    # attempts of the same numbers, one of a history state.db lost, are told apart by it.
    opened_at: str | None = None

    @property
    def telemetry_path(self) -> Path:
        return self.attempt_dir / "telemetry.json"

    @property
    def stdout_path(self) -> Path:
        return self.attempt_dir / "stdout.log"

    @property
    def stderr_path(self) -> Path:
        return self.attempt_dir / "stderr.log"

    def placeholders(self) -> dict[str, str]:
        values = {
            "prompt_path": str(self.prompt_path),
            "output_path": str(self.output_path),
            "job_dir": str(self.job_dir),
            "job_id": str(self.job_id),
            "attempt": str(self.attempt),
            "model": self.model,
            "root": str(self.root),
        }
        assert tuple(values) == PLACEHOLDERS  # the config check knows the same names
        return values

    def environment(self) -> dict[str, str]:
        env = {f"REVIEWQ_{k.upper()}": v for k, v in self.placeholders().items()}
        env["REVIEWQ_TASK"] = self.task
        env["REVIEWQ_TELEMETRY_PATH"] = str(self.telemetry_path)
        if self.note_path:
            env["REVIEWQ_NOTE_PATH"] = self.note_path
        if self.note_file:
            env["REVIEWQ_NOTE_FILE"] = str(self.note_file)
        return env


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None


@dataclass
class Telemetry:
    num_turns: int | None = None
    input_tokens: int | None = None  # every prompt token, cached ones included
    output_tokens: int | None = None
    cost_usd: float | None = None
    session_id: str | None = None
    error_subtype: str | None = None
    cached_input_tokens: int | None = None  # of input_tokens, read from a prompt cache
    error: str | None = None  # the CLI's own error message, one bounded line
    failure: str | None = None  # set when that error is the reviewer's, not the job's
    # The seconds the endpoint asked the client to wait before its next request (an HTTP
    # Retry-After with a 429 or 503): the job's wait and the profile's pause honour it.
    retry_after_s: float | None = None
    last_words: str | None = None  # the model's last message, for a run with no output
    raw: dict | None = None

    def to_json(self) -> dict:
        # last_words is said in the reason of an attempt that needs it, not kept twice
        skip = ("raw", "last_words")
        return {k: v for k, v in self.__dict__.items() if k not in skip and v is not None}


def _num(value: object, kind: type) -> int | float | None:
    """A count, a cost or a status code an agent reported; None for what is not one
    (:func:`~orchestrator.state.store.storable_number`)."""
    return kind(value) if storable_number(value) else None


MAX_REASON = 300


def bounded(message: str, limit: int = MAX_REASON) -> str:
    """One line of at most ``limit`` characters, secrets redacted, terminal control
    sequences (colours, a window title) gone."""
    from orchestrator import logs

    text = " ".join(logs.redact(message).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# What an agent may say in its telemetry file stopped it: no model could answer. Anything
# else (a prompt too long, a refusal) may be the job's doing, and counts as its attempt.
FAILURES = ("auth", "quota", "rate-limit", "unreachable", "server", "not-found", "config")


def telemetry_from_file(path: Path) -> Telemetry:
    """The ``REVIEWQ_TELEMETRY_PATH`` convention: ``num_turns``, ``input_tokens``,
    ``output_tokens``, ``cost_usd`` (and ``cached_input_tokens``, those of the input read
    from a prompt cache) in a JSON object, and for an agent that got no answer
    from its model ``failure`` (one of :data:`FAILURES`) with ``error``, its words, and
    ``retry_after_s`` when its endpoint said how long to wait (any agent's, as the
    ``openai`` one's); anything unreadable is ignored."""
    try:
        with path.open("rb") as f:
            data = json.loads(f.read(_MAX_TELEMETRY_BYTES).decode("utf-8"))
    except (OSError, *UNREADABLE):
        return Telemetry()
    if not isinstance(data, dict):
        return Telemetry()
    return Telemetry(
        num_turns=_num(data.get("num_turns"), int),
        input_tokens=_num(data.get("input_tokens"), int),
        output_tokens=_num(data.get("output_tokens"), int),
        cached_input_tokens=_num(data.get("cached_input_tokens"), int),
        cost_usd=_num(data.get("cost_usd"), float),
        session_id=data.get("session_id") if isinstance(data.get("session_id"), str) else None,
        error_subtype=data.get("error_subtype")
        if isinstance(data.get("error_subtype"), str)
        else None,
        error=bounded(data["error"]) if isinstance(data.get("error"), str) else None,
        failure=data.get("failure") if data.get("failure") in FAILURES else None,
        retry_after_s=_num(data.get("retry_after_s"), float),
        raw=data,
    )


def last_words(message: object) -> str | None:
    """A model's last message as :attr:`Telemetry.last_words`: one bounded line; None
    for no words."""
    return (bounded(message) or None) if isinstance(message, str) else None


def priced(t: Telemetry, profile: ReviewerProfile) -> Telemetry:
    """Fill ``cost_usd`` from the profile's prices when the CLI reported none."""
    if t.cost_usd is not None or (t.input_tokens is None and t.output_tokens is None):
        return t
    p_in, p_out = profile.price_input_per_mtok, profile.price_output_per_mtok
    if p_in is None and p_out is None:
        return t
    p_cached = profile.price_cached_input_per_mtok
    cached = min(t.cached_input_tokens or 0, t.input_tokens or 0)
    fresh = (t.input_tokens or 0) - cached
    cost = fresh * (p_in or 0.0) + cached * ((p_in or 0.0) if p_cached is None else p_cached)
    cost += (t.output_tokens or 0) * (p_out or 0.0)
    t.cost_usd = cost / 1_000_000
    return t


def python_module(name: str) -> list[str]:
    """The argv that runs a module of this reviewq with this Python. ``-P``: ``-m`` would
    put the working folder first on sys.path, and agents run in the KB root, where a
    ``workers`` package (or a sweep's working folder, an ``orchestrator`` one) would be
    run instead."""
    return [sys.executable, "-P", "-m", name]


class Reviewer(ABC):
    """One reviewer kind. Subclasses set ``kind`` and build the command."""

    kind: ClassVar[str]
    # A vendor CLI's npm package and the (oldest, newest) versions of it reviewq has run
    # end to end (tests/test_vendor_clis.py; docs/OPERATIONS.md §1): what doctor checks.
    package: ClassVar[str | None] = None
    known_versions: ClassVar[tuple[str, str] | None] = None

    def __init__(self, profile: ReviewerProfile) -> None:
        self.profile = profile

    @abstractmethod
    def command(self, spec: AttemptSpec) -> Command:
        """The process that performs this attempt."""

    def telemetry(self, spec: AttemptSpec) -> Telemetry:
        """What the finished process reported; by default the telemetry file."""
        return telemetry_from_file(spec.telemetry_path)

    def unreachable(self, spec: AttemptSpec) -> str | None:
        """Why the running CLI has not reached its endpoint, in its own words; None when
        its output does not say so (the default: no kind can tell)."""
        return None

    def output_altered(self, spec: AttemptSpec, output: bytes) -> str | None:
        """Why ``output`` is not the text the agent's model gave its write tool, when the
        CLI's own record shows it changed it (the default: cannot tell, so None)."""
        return None

    def answered(self, spec: AttemptSpec) -> bool:
        """Whether any model response reached the CLI (the default: cannot tell, so yes)."""
        return True

    def asked(self, spec: AttemptSpec) -> bool:
        """Whether the CLI got as far as sending its prompt to a model (the default:
        cannot tell, so yes). One that failed before then failed at its start, with
        nothing of the job's yet read, however long a loaded machine made that start."""
        return True

    def forget(self, spec: AttemptSpec) -> None:
        """Remove what the CLI keeps in its home for the folder it ran in when that folder
        was the attempt's own (a worker without ``--kb``), once the outcome is sent: a
        folder new for every attempt, so each attempt left one there for good (the default:
        a kind that keeps nothing of the kind)."""
        return None

    def executables(self) -> list[str]:
        """Programs this profile needs on PATH (for ``doctor`` and launch checks)."""
        return []

    def machine_problem(self, job_dir: Path) -> str | None:
        """What this machine forces on the CLI for which an attempt in ``job_dir`` is
        refused before it starts, in one line (``doctor`` says it first); None: nothing."""
        return None

    def env_value(self, name: str) -> str | None:
        """``name`` as the CLI this profile starts sees it: the profile's ``env`` over the
        worker's own environment (where a vendor CLI finds its home, say)."""
        return self.profile.env.get(name, os.environ.get(name))
