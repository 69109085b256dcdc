"""What every ``reviewq`` command shares: the click group, the domain errors that become one
``error:`` line (exit code 1; 2 for bad usage), and the small printing helpers."""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import sqlite3
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from orchestrator import logs
from orchestrator.config import gates_named
from orchestrator.logs import one_line as shown
from orchestrator.state.store import DAMAGED, DISK_FULL, disk_error, is_damage, no_room
from orchestrator.state.workspace import Workspace, workers_own

if TYPE_CHECKING:
    from orchestrator.control.followup import Followed
    from orchestrator.kb.notes import FileProblem

# The domain errors that become one ``error:`` line, by module and name. Looked for among
# the modules the process has loaded, not imported here: an error whose module was never
# loaded cannot have been raised, and importing them all gave every command (a worker
# too) the control's, the cycles' and the KB parser's modules to load.
_DOMAIN_ERRORS = (
    ("orchestrator.config", "ConfigError"),
    ("orchestrator.kb.notes", "KBError"),
    ("orchestrator.kb.gates", "SelectionError"),
    ("orchestrator.review.selector", "SelectError"),
    ("orchestrator.state.store", "StoreError"),
    ("orchestrator.review.jobs", "JobError"),
    ("orchestrator.review.finalize", "FinalizeError"),
    ("orchestrator.review.acceptance", "AckError"),
    ("orchestrator.control.attempts", "AttemptError"),
    ("orchestrator.state.files", "ReportError"),
    ("orchestrator.cycles.escalations", "DecideError"),
)


def domain_errors() -> tuple[type[Exception], ...]:
    """The domain error classes of the modules loaded so far (for an ``except``)."""
    loaded = sys.modules
    return tuple(
        getattr(module, name)
        for path, name in _DOMAIN_ERRORS
        if (module := loaded.get(path)) is not None and hasattr(module, name)
    )


# The module of each command: a process imports only the one its command is in.
COMMANDS = {
    **dict.fromkeys(
        (
            "enqueue",
            "worker",
            "control",
            "sweep",
            "resume",
            "rewrite-files",
            "status",
            "jobs",
            "job",
            "logs",
            "doctor",
            "escalations",
            "decide",
        ),
        "orchestrator.cli.queue",
    ),
    "report": "orchestrator.cli.report",
    **dict.fromkeys(
        ("gates", "select", "create-jobs", "finalize", "run-job", "ack", "warn-queue", "export"),
        "orchestrator.cli.review",
    ),
}


READ_ONLY = {"select", "gates", "status", "jobs", "job", "warn-queue", "logs", "escalations"}
# Commands about what has run: a state folder where nothing has is a mistake to name.
NEEDS_STATE = {
    "status",
    "jobs",
    "job",
    "escalations",
    "warn-queue",
    "export",
    "report",
    "decide",
    "resume",
    "rewrite-files",
}
# Commands about what has run whose note path is checked first: one outside the root, or a
# symlink loop, is the mistake to say, whatever the state folder (a path to no file is not:
# the state folder is refused first). They call require_state and open_log themselves.
STATE_AFTER_ARGS = {"ack"}
# Commands with a use outside a KB root: a worker on another machine, and doctor, which
# says what is missing.
NO_KB = {"worker", "doctor"}
# What becomes of a [[sweeps]] entry reviewq.toml gets wrong (config.Settings.sweeps_left_out).
LEFT_OUT = "the entry is left out until it is fixed: no cron run, no run by name"


def _asks_for_help(ctx: click.Context) -> bool:
    # The group runs before its command reads its options: `reviewq enqueue --help` must
    # still print the help wherever it is typed (Group.invoke saw the command's words).
    return bool(ctx.meta.get("reviewq.help"))


class Refused(click.ClickException):
    """The operation was refused or failed: one ``error:`` line, exit 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class BadValue(click.UsageError):
    """An option's value that cannot be read as what it takes, or options that cannot go
    together: bad usage (exit 2, as CONTRACT's exit codes say), its message naming the
    option; said in one line as click's own are (:func:`usage_line`)."""


class Usage(click.UsageError):
    """Bad usage as it is said: one ``error:`` line (exit 2)."""

    def show(self, file: Any = None) -> None:
        click.echo(self.message, err=True)


def usage_line(exc: click.UsageError) -> str:
    """Bad usage in one line naming the command, the option or argument, what is wrong
    and where the command's help is: click's three lines (``Usage:``, ``Try…``,
    ``Error:``) put the reason last, under a usage line that names no option, and its
    MissingParameter of a choice spread its choices over lines of their own."""
    where = _command_words(exc.ctx)
    help_of = where
    if isinstance(exc, click.BadParameter) and not isinstance(exc, click.MissingParameter):
        # Escaped: click's file type quotes a file's name as typed, control characters
        # and all (a line break became a space below, naming another file).
        named = _param_named(exc)
        said = f"{named}: {shown(exc.message)}" if named else shown(exc.message)
    elif (group_option := _groups_option(exc)) is not None:
        # `reviewq status --state DIR`: the group's options come before the command, and
        # the command's help, where the line sent the person, lists none of them (nor is
        # the command's option click found like it, `--note` for `--root`, the one meant).
        words = where.split()
        said = (
            f"{exc.message.rstrip('.')}; {group_option} is reviewq's own option, given "
            f"before the command: {words[0]} {group_option} … {' '.join(words[1:])}"
        )
        help_of = words[0]
    else:
        said = exc.format_message()
    said = " ".join(said.split())
    if said.endswith(".") and not said.endswith(".."):
        said = said[:-1]
    if said[:2].istitle():  # click's sentences ("No such option …"), inside a line
        said = said[0].lower() + said[1:]
    return f"error: {where}: {said} (see {help_of} --help)"


def _groups_option(exc: click.UsageError) -> str | None:
    """The group's option a command was given as its own (an unknown option of the
    command that is one of ``reviewq``'s), or None."""
    if not isinstance(exc, click.NoSuchOption) or exc.ctx is None or exc.ctx.parent is None:
        return None
    group = exc.ctx.find_root().command
    mine = any(exc.option_name in p.opts for p in group.params if isinstance(p, click.Option))
    return exc.option_name if mine else None


def _param_named(exc: click.BadParameter) -> str | None:
    """The option (its longest name) or argument a BadParameter is about, unquoted."""
    hint = exc.param_hint
    if hint is None and exc.param is not None:
        param = exc.param
        if isinstance(param, click.Option):
            return max(param.opts, key=len)
        return param.human_readable_name
    if isinstance(hint, str):
        return hint.strip("'\"")
    return " / ".join(h.strip("'\"") for h in hint) if hint else None


def _command_words(ctx: click.Context | None) -> str:
    """``reviewq`` and the command a context is of (not the program's own name: a test's
    runner names it after the function)."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["reviewq", *reversed(names)])


@contextlib.contextmanager
def usage_in_one_line() -> Iterator[None]:
    """Turn bad usage met inside into :class:`Usage`: the one place every command's (and
    the group's) is said. `reviewq` alone still prints the help."""
    try:
        yield
    except (Usage, click.exceptions.NoArgsIsHelpError):
        raise
    except click.UsageError as exc:
        raise Usage(usage_line(exc), exc.ctx) from None


class Moment(click.ParamType):
    """A moment as ``--since``/``--until`` take it (a duration, a date/time, a time of
    day), read once as the command line is parsed to refuse one that names no time; the
    command reads the text again against its own now."""

    name = "moment"

    def convert(self, value, param, ctx):  # noqa: ANN001, ANN201 - click's signature
        if not _readable(value):
            return value  # not_blank and utf8 say what is wrong with it
        from orchestrator.state.when import MomentError, moment  # a period's import only

        try:
            moment(value, param.opts[-1] if param else "moment", datetime.now(UTC))
        except MomentError as exc:
            raise BadValue(str(exc)) from None
        return value


class Level(click.ParamType):
    """A log level by name (``fatal`` is ``critical``), as ``logs --level`` takes it."""

    name = "level"

    def convert(self, value, param, ctx):  # noqa: ANN001, ANN201 - click's signature
        if _readable(value) and logs.level_rank(value) is None:
            raise BadValue(f"--level {value!r}: not a level ({', '.join(logs.LEVEL_NAMES)})")
        return value


def _readable(value: object) -> bool:
    if not isinstance(value, str) or not value.strip():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def no_kb_here(root: Path) -> str:
    """A --root that holds no kb/, as every command (doctor too) says it."""
    return f"{root}: no kb/ folder here (is --root the folder that holds kb/?)"


def denied(exc: PermissionError) -> Refused:
    """A file the user may not read or write: an operator who is not the service user."""
    return Refused(
        f"{exc.filename or 'a file'}: {exc.strerror or exc} (run reviewq as a user who "
        "may read and write the state folder and the KB)"
    )


def refuse_domain_errors(fn: Callable) -> Callable:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except domain_errors() as exc:
            raise Refused(str(exc)) from None
        except PermissionError as exc:
            raise denied(exc) from None
        except OSError as exc:
            # A file of the state folder on a full disk (the control's pid in its lock):
            # "internal error … (please report it)".
            folder = Path(exc.filename).parent if isinstance(exc.filename, str) else None
            room = no_room(folder) if folder and exc.errno in DISK_FULL else None
            if room is None:
                raise
            raise Refused(f"{exc.filename}: {exc.strerror}; {room}") from None
        except sqlite3.DatabaseError as exc:
            if is_damage(exc):
                # Called an internal error to report, or a lock to wait out, it sent a
                # person the wrong way.
                raise Refused(
                    f"state.db or a queue file is damaged ({exc}); nothing was changed. "
                    f"`reviewq doctor` says which; {DAMAGED}"
                ) from None
            if not isinstance(exc, sqlite3.OperationalError):
                raise  # a constraint, a query: a defect, said as one
            # Nothing was changed: the transaction rolled back. Say what and how to go on.
            ws = click.get_current_context().find_object(Workspace)
            folders = (ws.state_dir, ws.state_dir / "queue") if ws is not None else ()
            if disk_error(exc) and (room := no_room(*folders)):
                raise Refused(
                    f"state.db or a queue file cannot be written ({exc}); {room}. "
                    "Nothing was changed."
                ) from None
            if "readonly" in str(exc) or "unable to open" in str(exc):
                raise Refused(
                    f"state.db or a queue file cannot be written here ({exc}): reviewq needs "
                    "write access to the state folder, even to read it. Nothing was changed."
                ) from None
            raise Refused(
                f"state.db or a queue file is unavailable ({exc}); another process holds it "
                "longer than the busy timeout. Nothing was changed; run the command again."
            ) from None

    return wrapper


# A number that reaches a query (an id, a row limit): SQLite's integers end at 2**63 - 1,
# and a larger one raised OverflowError inside the query instead of saying "no such job".
class Whole(click.ParamType):
    """A whole number from 1, named for what it counts or identifies: click's IntRange
    said "'abc' is not a valid integer range" of `reviewq job abc`."""

    name = "integer"
    MAX = 2**63 - 1

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value, param, ctx):  # noqa: ANN001, ANN201 - click's signature
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        text = str(value).strip()
        if not (text.isascii() and text.isdigit()) or int(text) < 1:
            self.fail(f"{shown(str(value))!r} is not {self.what} (a whole number, 1 or more)")
        if int(text) > self.MAX:
            self.fail(f"{text!r} is too large for {self.what}")
        return int(text)


class Checked(click.Command):
    """Every command (the group's ``command_class``): its options may be checked together
    (``check``, given the values read) as its line is read: checked in its body, after the
    group's look at the folders, `report --since 1h --run 1` or `decide 3 redo` on a folder
    where nothing had run said "no state.db here" (exit 1), not the line's own mistake
    (exit 2)."""

    def __init__(
        self, *args: Any, check: Callable[..., object] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.check = check

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            rest = super().parse_args(ctx, args)
            if self.check is not None and not ctx.resilient_parsing:
                self.check(**ctx.params)
        except click.UsageError as exc:
            # The command it is said of (usage_line): click's parser leaves it out of some
            # (`logs --until` with no value), and a check's own.
            exc.ctx = exc.ctx or ctx
            raise
        return rest


def all_gates_alone(selectors: tuple[str, ...], all_gates: bool, **_: object) -> None:
    """select's, enqueue's and sweep's :class:`Checked` check: --all-gates with a bundle or
    a gate id (CONTRACT's own example of options that cannot go together)."""
    if all_gates and gates_named(selectors):
        raise click.UsageError(
            "--all-gates selects every catalog gate: name no bundle or gate id with it"
        )


class Numbered(Checked):
    """A command whose arguments are ids (``ids``: what they are): `reviewq job -1` read
    the id as an option and said "No such option '-1'"."""

    def __init__(self, *args: Any, ids: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ids = ids

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            token = exc.option_name or ""
            if not (token[1:].isascii() and token[1:].isdigit()):
                raise
            arg = next(p for p in self.params if isinstance(p, click.Argument))
            # decide's "[ESCALATION_ID]... DECISION": named as its own checks name it.
            hint = (arg.metavar or "").split(" ")[0].strip("[].") or None
            raise click.BadParameter(
                f"{token!r} is not {self.ids} (a whole number, 1 or more)", ctx, arg, hint
            ) from None


class InputFile(click.File):
    """click's file to read, ``-`` for stdin: a process started with stdin closed (cron's
    ``<&-``) has none, and click's opening of it ended in an AttributeError."""

    def convert(self, value, param, ctx):  # noqa: ANN001, ANN201 - click's signature
        if value == "-" and sys.stdin is None:
            self.fail("'-': stdin is closed; give the file's path, or pipe it in", param, ctx)
        return super().convert(value, param, ctx)


class WholeWithin(click.IntRange):
    """click's IntRange, named for what it reads: it said "'x' is not a valid integer
    range" of `--workers x`, a range nobody typed."""

    name = "integer"


class NumberWithin(click.FloatRange):
    """click's FloatRange, named as :class:`WholeWithin` is ("not a valid float range")."""

    name = "number"

    def _describe_range(self) -> str:
        # With no bound (a check of its own says what it takes), click's help said
        # "[x<=None]" (P72).
        if self.min is None and self.max is None:
            return ""
        return super()._describe_range()


SQL_INT = Whole("a count")
JOB_ID = Whole("a job id")
RUN_ID = Whole("a sweep run id")
ESCALATION_ID = Whole("an escalation id")
# Threads a process starts, one agent each: past this a typo, which started them all.
THREADS = 256


def budget_usd(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A spending cap: NaN was stored as NULL (no cap at all) and a negative one allowed
    nothing to start, both without a word."""
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise click.BadParameter(f"{value!r}: a cap in dollars, 0 or more")
    return value


def a_number(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A float option's NaN, which every range takes (each comparison is false): an
    export's `--wait nan` waited for good behind another export, not the seconds asked."""
    if value is not None and math.isnan(value):
        raise click.BadParameter(f"{value!r} is not a number")
    return value


def batch_size_needs_gate_grouping(grouping: str) -> None:
    """`--batch-size` given with note grouping (enqueue's and sweep's default) was dropped
    without a word: one job per note and lens, not the batches asked for."""
    ctx = click.get_current_context()
    if grouping != "gate" and ctx.get_parameter_source("batch_size") == ParameterSource.COMMANDLINE:
        raise click.UsageError(
            "--batch-size: notes per job with --grouping gate only; --grouping note makes "
            "one job per note and lens"
        )


def not_blank(ctx: click.Context, param: click.Parameter, value):  # noqa: ANN001, ANN201
    """An option given as '' (an unset shell variable, most likely) is a mistake, not the
    default it would otherwise silently stand for: `--note ''` swept, and with --fix
    rewrote, every note. A repeated option's values are checked each."""
    if param.name and ctx.get_parameter_source(param.name) == ParameterSource.DEFAULT:
        return value
    for one in value if isinstance(value, tuple) else (value,):
        if one is not None and not one.strip():
            raise click.BadParameter("empty")
    return utf8(ctx, param, value)


def one_line(ctx: click.Context, param: click.Parameter, value):  # noqa: ANN001, ANN201
    """A name that is recorded and printed back (``--runner``): a control character in it
    (a line break, a terminal escape) would, printed by `jobs` and `job N`, move the
    operator's cursor or recolour the terminal. Refused where it is given, once, rather
    than cleaned at every place that shows it (tables, JSON, manifests, reports)."""
    for one in value if isinstance(value, tuple) else (value,):
        if isinstance(one, str) and not one.isprintable():
            raise click.BadParameter(
                f"{shown(one)}: a control character (a line break, a terminal escape) in it; "
                "give one printable line"
            )
    return utf8(ctx, param, value)


def utf8(ctx: click.Context, param: click.Parameter, value):  # noqa: ANN001, ANN201
    """Text that will be stored or matched: bytes that are not UTF-8 (a Latin-1 terminal)
    reached SQLite as surrogates and ended in 'internal error: UnicodeEncodeError'."""
    for one in value if isinstance(value, tuple) else (value,):
        if isinstance(one, str):
            try:
                one.encode("utf-8")
            except UnicodeEncodeError:
                raise click.BadParameter(f"{shown(one)}: not UTF-8 text") from None
    return value


def warn(problems: Sequence[FileProblem], *, every: bool = False) -> None:
    """``every``: each file named, uncapped: where a gate's problems are read (`gates`,
    `doctor`), and the cap's pointer would lead to no log line (a requires_type warning
    is never a kb.file_skipped)."""
    from orchestrator.kb.notes import capped

    for line in (
        (f"warning: {shown(p.path)}: {p.reason}" for p in problems)
        if every
        else capped(problems, "warning: ")
    ):
        click.echo(line, err=True)


def warn_enqueued(res) -> None:  # noqa: ANN001 - sweeps.producer.EnqueueResult
    """What an enqueue could not review, as ``warning:`` lines: the files its selection
    skipped (a command's stderr log leaves them out), and one line for each reason a
    file's pairs were skipped, with how many: said as a bare count ("skipped 34"), a
    note with a sentinel line was never named, night after night."""
    from orchestrator.kb.notes import excluded_words

    warn(res.problems)
    # --current on a KB that keeps no status: field; a reviewer's partition with no review
    for hint in res.hints:
        click.echo(f"warning: {hint}", err=True)
    if res.excluded:
        click.echo(excluded_words(res.excluded), err=True)
    counts: dict[str, int] = {}
    for s in res.skipped:
        if s.problem:
            counts[s.why] = counts.get(s.why, 0) + 1
    for why, n in counts.items():
        click.echo(f"warning: {shown(why)} ({n} pair(s) skipped)", err=True)


def root_rel(ws: Workspace, path: Path) -> str:
    """CONTRACT §10: paths in JSON are relative to the root when they lie under it."""
    from orchestrator.review.jobs import display_path

    return display_path(ws.root, path)


def root_reports(ws: Workspace, escalations: list[dict]) -> list[dict]:
    """Escalations with their ``report_path`` relative to ROOT, as JSON gives every path
    (CONTRACT §10) and `escalations --json` gives theirs; state.db keeps it relative to STATE."""
    return [
        {**e, "report_path": root_rel(ws, ws.state_dir / e["report_path"])} for e in escalations
    ]


def emit_json(data: object) -> None:
    # Indented for a person at a terminal; compact into a pipe, where indent=2 would
    # force the pure-Python encoder and cost a third of a large select's time.
    out = sys.stdout  # named here: a write that fails is said as stdout's (cli.main)
    indent = 2 if out.isatty() else None
    out.write(json.dumps(data, indent=indent, ensure_ascii=False))
    out.write("\n")


def nudge_control(ws: Workspace) -> None:
    """Ask the control process to dispatch now. Once: the jobs are recorded, and the
    control's next tick dispatches them if the queue cannot be reached."""
    from workers.app import make_app
    from workers.queues import impatient, send_once

    with make_app(ws.settings) as app:
        impatient(app)
        try:
            send_once("dispatch")
        except Exception as exc:
            click.echo(
                f"warning: could not nudge the control queue ({exc}); the job waits for its "
                "next tick",
                err=True,
            )


def say_if_no_control(ws: Workspace, what: str, err: bool = False) -> None:
    """Jobs were queued for the control process: say so when none runs for the state
    folder (its lock is free), or the person waits for work nothing will start."""
    from workers.sweep import control_running

    try:
        if control_running(ws.state_dir):
            return
    except OSError:
        return  # the lock cannot be read: nothing known to say
    click.echo(
        f"no control process runs for this state folder: {what} waits for one "
        "(reviewq control and a worker, or reviewq sweep, which also runs it)",
        err=err,
    )


def show_followed(ws: Workspace, followed: Followed, err: bool = False) -> None:
    """What a finalize by hand started, one line each; queued jobs are dispatched by a
    running control process (nudged here) or by the next one to start."""
    for job_id, kind in followed.jobs:
        click.echo(f"follow-up: {kind} job {job_id} queued", err=err)
    for esc_id, note_path, gate_id in followed.escalations:
        click.echo(
            f"escalated: {shown(note_path)} {gate_id} (escalation {esc_id}; reviewq escalations)",
            err=err,
        )
    if followed.jobs:
        nudge_control(ws)
        say_if_no_control(ws, "the follow-up", err=err)


class Group(click.Group):
    """The ``reviewq`` group: a bug in any command leaves its traceback in the log file.
    A command's module is imported when the command is asked for (:data:`COMMANDS`)."""

    command_class = Checked

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(COMMANDS[cmd_name])
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        for module in dict.fromkeys(COMMANDS.values()):
            importlib.import_module(module)
        return super().list_commands(ctx)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """The command, its own options and arguments read once as it is found, which
        click does before this group's look at the settings, the KB and the state folder
        (click reads them after it): a line typed wrong was refused for a folder where
        nothing had run (exit 1), its own mistake said only once that was mended. Bad
        usage is exit 2, whatever the folder. The command reads its line again to run."""
        name, cmd, rest = super().resolve_command(ctx, args)
        # Not a command with a file option: reading its line opens the file, and a named
        # pipe opened twice lost its writer's text between the two opens.
        read_now = cmd is not None and not ctx.resilient_parsing and not _asks_for_help(ctx)
        if read_now and not any(isinstance(p.type, click.File) for p in cmd.params):
            with cmd.make_context(name, list(rest), parent=ctx):
                pass
        return name, cmd, rest

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with usage_in_one_line():  # the group's own options (`reviewq --bogus status`)
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        ctx.meta["reviewq.help"] = any(a in ("-h", "--help") for a in ctx.args)
        try:
            with usage_in_one_line():  # the command's name, options and arguments, and body
                return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except PermissionError as exc:
            # Met in this group's own look at the state folder (state.db's stat, before any
            # command's refuse_domain_errors) or in a command without it: `status` as
            # another user than the service's said "internal error … (please report it)".
            raise denied(exc) from None
        except Exception:
            # Read-only commands skip the log file to stay fast and create nothing; a bug
            # in one still needs its traceback where an operator looks (main logs it).
            ws = ctx.obj
            read_only = ctx.invoked_subcommand in READ_ONLY
            if read_only and isinstance(ws, Workspace) and ws.state_dir.is_dir():
                # A log that cannot be opened must not replace the error it was to record.
                with contextlib.suppress(OSError):
                    logs.configure(ws.state_dir)
            raise


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--root",
    default=".",
    show_default=True,
    callback=not_blank,
    help="The KB root (the folder holding kb/).",
)
@click.option(
    "--state",
    default=None,
    callback=not_blank,
    help="The state folder [default: ROOT/.reviewq, or [state] dir].",
)
@click.option(
    "--config",
    default=None,
    callback=not_blank,
    help="The settings file [default: ROOT/reviewq.toml].",
)
@click.pass_context
def cli(ctx: click.Context, root: str, state: str | None, config: str | None) -> None:
    """Gate-based LLM reviews of a markdown knowledge base.

    \b
    Example:
      reviewq select --all-gates --model offline --json
    """
    try:
        ws = Workspace.open(root, state, config)
    except domain_errors() as exc:
        # The paths given (a terminal escape typed or pasted into one), shown as every
        # other refusal shows a name.
        raise Refused(shown(str(exc))) from None
    ctx.obj = ws
    ctx.call_on_close(ws.close)
    # Commands that change state log to the state folder's log and say only warnings on
    # stderr; the consumers reconfigure for their own stream. Read-only commands skip it.
    # A worker logs only to a folder of its own, which it sets up itself.
    if _asks_for_help(ctx):
        return
    if ctx.invoked_subcommand not in ("doctor", "control"):  # they say it their own way
        for problem in ws.settings.sweeps_left_out.values():
            # A file that had to be skipped is a warning (CONTRACT §10), and so is an entry.
            click.echo(f"warning: {shown(problem)} ({LEFT_OUT})", err=True)
        for ignored in ws.settings.sweeps_ignored:
            click.echo(f"warning: {shown(ignored)}", err=True)
    if ctx.invoked_subcommand not in READ_ONLY | NO_KB and not (ws.root / "kb").is_dir():
        # Said before anything is made: a command run in the wrong folder left a .reviewq/
        # (and `export` a kb/reports/) behind in it. On a worker's machine, which has none,
        # the folder given is the worker's own: that is the mistake to name.
        raise Refused(workers_own(ws.state_dir) or no_kb_here(ws.root))
    if ctx.invoked_subcommand in STATE_AFTER_ARGS:
        return
    if ctx.invoked_subcommand in NEEDS_STATE:
        require_state(ws)
    # A worker sets its log up itself; doctor writes none (run in the wrong folder, it
    # left a .reviewq/logs/ there).
    if ctx.invoked_subcommand not in READ_ONLY | NO_KB:
        open_log(ws)


def require_state(ws: Workspace) -> None:
    """Refuse a state folder where nothing has run, in one line; said before the log is set
    up, which made the mistyped folder and its logs/."""
    try:
        ws.require_state()
    except domain_errors() as exc:
        raise Refused(shown(str(exc))) from None


def open_log(ws: Workspace) -> None:
    try:
        logs.configure(ws.state_dir)
    except OSError as exc:
        where = exc.filename or logs.log_path(ws.state_dir)
        raise Refused(f"{where}: cannot open the log: {exc.strerror or exc}") from None
