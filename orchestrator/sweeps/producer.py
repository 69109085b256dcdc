"""What to enqueue (CONTRACT §9): a sweep selects stale pairs in its reviewer's partition and
packs them into queued jobs, idempotently; ``[[sweeps]]`` with ``cron`` fire from the
control process.
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
import shlex
import sqlite3
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from orchestrator import logs
from orchestrator.config import ConfigError, Settings, SweepConfig, cron_iter
from orchestrator.cycles import escalations
from orchestrator.kb.gates import SelectionError
from orchestrator.kb.notes import KB, FileProblem, KBError, Note, NoteParseError
from orchestrator.review.acceptance import pair_now
from orchestrator.review.jobs import CreatedJob, Skipped, create_jobs
from orchestrator.review.selector import keeps_no_status, select
from orchestrator.state.files import writing_job_folders
from orchestrator.state.status import (
    entries_taking_over,
    over_budget_runs,
    runs_with_queued_jobs,
)
from orchestrator.state.store import (
    Store,
    control_pid,
    json_column,
    parse_timestamp,
    timestamp,
    utcnow,
)
from orchestrator.state.workspace import Workspace


@dataclass
class SweepRequest:
    name: str
    reviewer: str = "offline"
    selectors: tuple[str, ...] = ()
    all_gates: bool = False
    notes: tuple[str, ...] = ()
    current: bool = False
    grouping: str = "note"
    batch_size: int = 5
    fix: bool = False
    sequential: bool = False
    fixer: str = ""
    auditor: str = ""
    audit: tuple[str, ...] = ()
    budget_usd: float | None = None
    trigger: str = "cli"
    # A run of the [[sweeps]] entry as configured (its cron, or `--name NAME` alone), not
    # an ad-hoc sweep under its name: it takes over the entry's held jobs (_taken_over).
    configured: bool = False

    @classmethod
    def from_config(cls, s: SweepConfig, root: Path, trigger: str = "cron") -> SweepRequest:
        """``root``: the notes an entry names are ROOT's, whatever folder the process runs
        in (read from the working folder, a control started elsewhere failed every night
        on paths `doctor` found fine)."""
        return cls(
            configured=True,
            name=s.name,
            reviewer=s.reviewer,
            selectors=s.select,
            all_gates=s.all_gates,
            notes=tuple(str(root / n) for n in s.notes),
            current=s.current,
            grouping=s.grouping,
            batch_size=s.batch_size,
            fix=s.fix,
            sequential=s.sequential,
            fixer=s.fixer,
            auditor=s.auditor,
            audit=s.audit,
            budget_usd=s.budget_usd,
            trigger=trigger,
        )


def sweep_problems(ws: Workspace, sweep: SweepConfig) -> list[str]:
    """What in a ``[[sweeps]]`` entry names no gate or note of this KB: said by ``doctor``
    and when the control process starts, not by a cron run that fails every night (or an
    audit list that silently audits nothing). The settings load cannot know the KB."""
    where = f"[[sweeps]] {sweep.name!r}"
    problems = []
    catalog = ws.catalog()
    for key, selectors in (("select", sweep.select), ("audit", sweep.audit)):
        for sel in selectors:
            try:
                catalog.resolve([sel])
            except SelectionError as exc:
                problems.append(f"{where} {key}: {exc}")
    for note in sweep.notes:
        try:
            ws.kb.note_selection([ws.root / note])
        except KBError as exc:
            problems.append(f"{where} notes: {str(exc).removeprefix('--note ')}")
    if sweep.current and not problems:
        # What `select --current` warns of, said of an entry too: run by its cron, it
        # selected nothing every night, and nothing said so.
        known = len(ws.kb.problems)
        try:
            paths = (
                ws.kb.note_selection([ws.root / n for n in sweep.notes]) if sweep.notes else None
            )
            notes = ws.kb.load_notes(ws.kb.note_files(paths))
        except (KBError, OSError):
            return problems  # said by every command that reads the KB
        finally:
            del ws.kb.problems[known:]  # the files a selection skips are its own to say
        if keeps_no_status(notes):
            problems.append(
                f"{where} current: no note has a status: field, which current = true reads "
                "(status: current): the entry selects nothing"
            )
    return problems


@dataclass
class EnqueueResult:
    run_id: int
    model_partition: str
    jobs: list[CreatedJob] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    problems: list[FileProblem] = field(default_factory=list)  # files the selection skipped
    hints: list[str] = field(default_factory=list)  # the selection's (Selection.hints)
    excluded: int = 0  # notes [kb] exclude left out (Selection.excluded)
    # Queued jobs of spent runs this run took over (run id -> how many): the command a
    # spent budget's line names said "queued 0 job(s)" of them, as if it had done nothing.
    taken_over: dict[int, int] = field(default_factory=dict)

    def taken_over_words(self) -> str:
        """``; took over …``, or nothing: said beside the jobs a run queued."""
        if not self.taken_over:
            return ""
        runs = ", ".join(str(r) for r in sorted(self.taken_over))
        return (
            f"; took over {sum(self.taken_over.values()):,} queued job(s) of run(s) {runs}, "
            "whose budget was spent"
        )


def enqueue(
    ws: Workspace,
    req: SweepRequest,
    run_id: int | None = None,
    just_reviewed: Collection[tuple[str, str]] = (),
    also: Callable[[], None] | None = None,
    committed: Callable[[list[int]], None] | None = None,
    cron_minute: datetime | None = None,
) -> EnqueueResult:
    """:func:`_enqueue`, then the memory its selection and packing took given back.
    ``cron_minute``: the minute a cron run stands for, which its log line names."""
    try:
        return _enqueue(ws, req, run_id, just_reviewed, also, committed, cron_minute)
    finally:
        give_back_memory()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; musl and macOS have none
    except (AttributeError, OSError):
        return None


def give_back_memory() -> None:
    """Hand the heap's free pages back to the system. What Python frees stays the
    process's, held by the small objects still live among it: a sweep, or the control
    process after a cron sweep's enqueue, kept ~290 MB resident after a twenty-fold KB's
    first night (136 MB once given back), for the sweep's hour or the control's life."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _enqueue(
    ws: Workspace,
    req: SweepRequest,
    run_id: int | None,
    just_reviewed: Collection[tuple[str, str]],
    also: Callable[[], None] | None,
    committed: Callable[[list[int]], None] | None,
    cron_minute: datetime | None = None,
) -> EnqueueResult:
    """Select, create and record queued jobs for one sweep run. Pairs already queued or
    running, and pairs held for a human (escalated), are skipped and counted. With
    ``run_id`` the jobs join that run (the next bundle of a sequential sweep), and the
    (note, gate) pairs ``just_reviewed`` by the job it follows are skipped: one answered
    ERROR is still stale, and asked again after every job it would run without end.

    The run, its jobs and their counts are one transaction, and ``also`` runs inside it:
    what must commit with them or not at all (the cron clock of the sweep it fired).
    The job folders are written once it commits; ``committed`` is called with the new
    jobs' ids before them (a sweep starts its control and worker then)."""
    for option, name in (
        ("--reviewer", req.reviewer),
        ("--fixer", req.fixer),
        ("--auditor", req.auditor),
    ):
        if name:
            try:
                ws.settings.reviewer(name)
            except ConfigError as exc:  # which of the three, said (a [[sweeps]] entry's are
                raise ConfigError(f"{option}: {exc}") from None  # checked as it loads)
    profile = ws.settings.reviewer(req.reviewer)
    note_paths = ws.kb.note_selection(req.notes) if req.notes else None
    selected_at_version = ws.store.acceptance_version()
    selection = select(
        ws.kb,
        ws.catalog(),
        ws.store,
        selectors=req.selectors,
        all_gates=req.all_gates,
        note_paths=note_paths,
        current=req.current,
        model=profile.partition,
        diffs=False,
        state_dir=ws.state_dir,
    )
    store = ws.store
    known = store.partitions_instead(profile.partition) if run_id is None else []
    if known:
        # As select --model says it: a profile's partition misspelt in reviewq.toml, or
        # its model changed, read as nothing reviewed, and the whole KB was paid for again
        # without a word.
        selection.hints.append(
            f"reviewer {profile.name}: no review recorded in its partition "
            f"{profile.partition} (known: {', '.join(known)}); every pair is missing-review"
        )
    # Everything that reads and judges comes before the first write: a refusal leaves no run.
    exclude = escalations.held(ws, profile.partition)
    # Made one at a time as create_jobs takes them: a list of 270,000 dicts beside the
    # selection's targets was ~50 MB of an enqueue's peak.
    targets: Iterable[dict] = (t.to_json() for t in selection.targets)
    waiting: list[Skipped] = []
    if req.sequential:
        targets, waiting = _sequential(ws, profile.partition, req, list(targets))
    if just_reviewed:
        targets = list(targets)
        again = {(t["note_path"], t["gate_id"]) for t in targets} & set(just_reviewed)
        targets = [t for t in targets if (t["note_path"], t["gate_id"]) not in again]
        waiting += [
            Skipped(
                n,
                g,
                "answered ERROR in the job just finished: the next sweep asks again",
                "answered ERROR just now",
            )
            for n, g in sorted(again)
        ]
    options = {k: v for k, v in asdict(req).items() if k not in ("name", "trigger", "budget_usd")}
    if note_paths is not None:
        options["notes"] = note_paths  # root-relative, however they were given
    # One transaction from the run to its counts: a control killed between two of them
    # left a run with no jobs, or jobs on record with their cron clock not moved (the
    # restarted control ran the sweep again). The selection stays outside, and the jobs'
    # notes are packed as it read them (no note is read under the write lock).
    ids: list[int] = []
    taken_over: dict[int, int] = {}
    # Held until the folders are written: a control running beside (a sweep's starts at
    # the commit) leaves them to this process, not writing each a second time.
    with writing_job_folders(ws.state_dir), store.write():
        if committed is not None:
            # First of what runs at the commit: before the folders' writing.
            store.after_commit(lambda: committed(ids))
        if run_id is None:
            run_id = start_run(store, req.name, req.trigger, options, req.budget_usd, cron_minute)
            # Work left queued by an earlier run of this sweep whose budget is spent
            # belongs to this run now, so it is dispatched under this run's budget. Only
            # then: a run still under its budget dispatches its own jobs, and the sweep
            # that started it answers for them (two runs at once, as a sweep started by
            # hand just before its cron time, took each other's work, and the older one's
            # summary lost the failures of what it had enqueued). Which runs: _taken_over.
            taken = _taken_over(ws, req.name, options)
            taken_over = dict(
                store.conn.execute(
                    "SELECT sweep_run_id, count(*) FROM review_jobs WHERE status = 'queued' "
                    "AND sweep_run_id IN (SELECT value FROM json_each(?)) GROUP BY sweep_run_id",
                    (json.dumps(taken),),
                ).fetchall()
            )
            # Under this sweep's name: `report --sweep` and the summary read them as its.
            store.conn.execute(
                "UPDATE review_jobs SET sweep_run_id = ?, sweep = ? WHERE status = 'queued' "
                "AND sweep_run_id IN (SELECT value FROM json_each(?))",
                (run_id, req.name, json.dumps(taken)),
            )
        batch = create_jobs(
            ws.kb,
            ws.catalog(),
            store,
            ws.state_dir,
            targets,
            model_partition=profile.partition,
            grouping=req.grouping,
            batch_size=req.batch_size,
            reviewer=req.reviewer,
            sweep=req.name,
            sweep_run_id=run_id,
            exclude=exclude,
            selected_at_version=selected_at_version,
            selected=selection.notes,
        )
        batch.skipped.extend(waiting)
        ids[:] = [j.review_job_id for j in batch.jobs]
        # Added to: a sequential run's next bundles are enqueued into it note by note.
        store.conn.execute(
            "UPDATE sweep_runs SET jobs = COALESCE(jobs, 0) + ?, skipped = COALESCE(skipped, 0) + ? "
            "WHERE id = ?",
            (len(ids), len(batch.skipped), run_id),
        )
        if req.trigger == "cron":
            forget_empty_runs(store, req.name, run_id)
        if also is not None:
            also()
    counts = selection.counts_json()

    def logged() -> None:
        logs.get().info(
            "sweep.enqueued",
            sweep=req.name,
            sweep_run=run_id,
            reviewer=req.reviewer,
            trigger=req.trigger,
            jobs=len(ids),
            pairs=sum(len(j.pairs) for j in batch.jobs),
            skipped=len(batch.skipped),
            counts=counts,
            excluded=selection.excluded,
            **({"taken_over": taken_over} if taken_over else {}),
            # A run late (a control back at 03:04) stands for its cron minute all the
            # same: said by the tick's time alone, the 03:00 run was one no cron names.
            **({"at": _at(cron_minute), "wall": _wall(cron_minute)} if cron_minute else {}),
        )
        for p in selection.problems:
            logs.get().warning("kb.file_skipped", path=p.path, reason=p.reason)
        if req.trigger == "cron" and not any(counts.values()):
            # No pair in its scope, fresh or stale: a command's "0 pair(s)" is read by the
            # person who ran it, a cron run's zeros by no one, every night.
            reason = (
                "no note in its scope has a gate it selects (a folder emptied, a gate's "
                "requires_type or requires_trait no note there meets)"
            )
            # The catalog's invalid gates are said by every selection, of any scope: the
            # files of its own scope that could not be read are the others.
            invalid = {p.path for p in ws.catalog().problems}
            unread = [p for p in selection.problems if p.path not in invalid]
            if unread:
                # Its notes there, unread (broken YAML…): blaming the folder and the gates
                # sent the person looking at what was right.
                reason = (
                    f"{len(unread)} file(s) in its scope could not be read (kb.file_skipped "
                    "names each, and why), and no note read there has a gate it selects"
                )
            logs.get().warning(
                "sweep.selects_nothing",
                sweep=req.name,
                select=list(req.selectors) or "all gates",
                notes=list(options.get("notes") or []) or "all notes",
                reason=f"{reason}: its runs enqueue nothing until the entry or the KB changes",
                **({"files_skipped": len(unread)} if unread else {}),
            )
        if known:
            # A command says it as its hint; the sweep the control fires, only here.
            logs.get().warning(
                "sweep.partition_unreviewed",
                sweep=req.name,
                reviewer=profile.name,
                partition=profile.partition,
                known=known,
            )

    # At once, or (a sequential run's next bundle) once the outcome's transaction commits.
    store.after_commit(logged)
    return EnqueueResult(
        run_id,
        profile.partition,
        batch.jobs,
        batch.skipped,
        counts,
        list(selection.problems),
        list(selection.hints),
        selection.excluded,
        taken_over,
    )


def _taken_over(ws: Workspace, name: str, options: dict) -> list[int]:
    """The spent runs of sweep ``name`` whose queued jobs a new run with ``options``
    takes over (OPERATIONS 6.7): a run with the same options; and for a run of the
    ``[[sweeps]]`` entry as configured, the entry's earlier runs, whatever was edited in
    the entry since (compared as text, an edited entry never took them over: they were
    held for good, and their pairs, which every later run skipped as queued). Left to
    their run: the jobs of an ad-hoc run with other options (a job keeps the follow-ups
    it was enqueued with), and those of a profile, still configured, that writes another
    partition than the new run's reviewer (this budget is for the model the entry uses
    now). Those of a profile since removed are taken over: dispatch fails them, and
    their pairs are free. An entry since renamed (or removed, or of another model now):
    its spent runs are taken over by the runs of an entry now of their model
    (``entries_taking_over``)."""
    now = json.loads(json.dumps(options))  # as stored: lists, not tuples
    same = {**now, "configured": None}  # who started a run is not what its jobs follow
    taken = []
    for run_id, was, text, trigger in ws.store.conn.execute(
        "SELECT id, name, options, trigger FROM sweep_runs WHERE id IN "
        "(SELECT value FROM json_each(?))",
        (json.dumps(sorted(over_budget_runs(ws.store))),),
    ):
        were = json_column(text)
        if not isinstance(were, dict):
            continue
        if (was == name and {**were, "configured": None} == same) or (
            now["configured"] and name in entries_taking_over(ws.settings, was, were, trigger)
        ):
            taken.append(run_id)
    return taken


def follow_budgets(ws: Workspace) -> list[dict]:
    """Move the budget of the cron runs with queued jobs of each ``[[sweeps]]`` entry to
    its ``budget_usd`` now, at the control's tick (its settings are those it started
    with, or a SIGHUP's restart read): down to a lower one (a budget lowered mid-run,
    spending faster than meant, was the next night's, and the run went on spending to the
    old one, said nowhere), and, raised again, back up to the budget the run started with
    (put back, the run stayed held at the lowered one all night, no line of the file
    saying it). Not past it: a raise beyond is the next run's, as the entry's other edits
    are. An entry's runs are those whose jobs it takes over once spent
    (:func:`entries_taking_over`, one entry alone): by name, two entries of two models
    swapped names and each run took the other model's budget. Not a run by name (its
    ``--budget-usd`` may be a person's, given anew). Returns what changed, each logged
    ``sweep.budget_lowered`` or ``sweep.budget_restored``."""
    budgets = {s.name: _or_none(s.budget_usd) for s in ws.settings.sweeps.values()}
    # The runs with queued jobs, as dispatch walks them: a scan of sweep_runs by name at
    # each tick grew with every run ever recorded (a `* * * * *` entry adds 1,440 a day).
    rows = []
    for run_id, name, was, started, text, trigger in ws.store.conn.execute(
        "SELECT id, name, budget_usd, budget_started, options, trigger FROM sweep_runs WHERE "
        "id IN (SELECT value FROM json_each(?)) AND trigger = 'cron' ORDER BY id",
        (json.dumps(runs_with_queued_jobs(ws.store)),),
    ):
        owners = entries_taking_over(ws.settings, name, json_column(text), trigger)
        if len(owners) != 1 or owners[0] not in budgets:
            continue
        # A run started with no budget is moved too: a budget given to an entry that had
        # none (spending faster than meant) is the brake most wanted, and the run went on
        # spending unbounded. Its "none" is kept as infinity, the most it gets back.
        was = _or_none(was)
        entry, own = owners[0], started if started is not None else was
        to = min(own, budgets[entry])
        if to != was:
            rows.append((run_id, name, was, own, to, entry))
    if not rows:
        return []  # read at each tick: no write for nothing
    with ws.store.write():
        ws.store.conn.executemany(
            "UPDATE sweep_runs SET budget_usd = ?, budget_started = ? WHERE id = ?",
            [(_none_or(to), own, run_id) for run_id, _, _, own, to, _ in rows],
        )
    moved = []
    for run_id, name, was, _, to, entry in rows:
        said = {
            "sweep": entry,
            "sweep_run": run_id,
            "was": _none_or(was),
            "budget_usd": _none_or(to),
            **({"run_name": name} if name != entry else {}),
        }
        if to < was:
            logs.get().warning("sweep.budget_lowered", **said)
        else:  # what the person meant: news, not a warning
            logs.get().info("sweep.budget_restored", **said)
        moved.append(said)
    return moved


def _or_none(budget: float | None) -> float:
    """No budget as the infinite one, which every budget is below."""
    return math.inf if budget is None else budget


def _none_or(budget: float) -> float | None:
    return None if budget == math.inf else budget


def run_by_name(store: Store, names: Collection[str]) -> set[str]:
    """The entries of ``names`` whose last run was ``reviewq sweep --name NAME`` alone, as
    the system's cron runs one with no control process (OPERATIONS §3), not the control's."""
    marks = ", ".join("?" * len(names))
    return {
        name
        for (name,) in store.conn.execute(
            f"SELECT s.name FROM sweep_runs s WHERE s.name IN ({marks}) AND s.trigger = 'sweep' "
            "AND json_extract(s.options, '$.configured') AND s.id = "
            "(SELECT max(id) FROM sweep_runs WHERE name = s.name)",
            tuple(names),
        )
    }


def sweeps_unfired(ws: Workspace, fed_from_elsewhere: Callable[[], bool]) -> str | None:
    """Why the [[sweeps]] entries will not run at their times, or None: no control process
    holds the state folder. A first entry passed doctor, and its night ran nothing.
    ``fed_from_elsewhere``: whether a control of another machine or state folder feeds
    the queue (asked of the queue, only once no control holds this state folder)."""
    names = list(ws.settings.sweeps)
    try:
        if not names or control_pid(ws.state_dir) is not None:
            return None
    except OSError:  # an unreadable lock: the state folder's own check names it
        return None
    if fed_from_elsewhere():
        return None
    # The other way on, the system's cron running `sweep --name`, was told the same for good.
    names = [n for n in names if n not in _by_name_lately(ws, names)]
    if not names:
        return None
    which = ", ".join(repr(n) for n in names)
    return (
        f"[[sweeps]] {which} {'runs at its cron' if len(names) == 1 else 'run at their crons'} "
        f"only while a control process runs for "
        f"{ws.state_dir}, and none does: start `reviewq control` (OPERATIONS §3), or have "
        f"the system's cron run `reviewq sweep --name {names[0]}`"
    )


def _by_name_lately(ws: Workspace, names: list[str]) -> set[str]:
    """:func:`run_by_name` where state.db can be read; none where it cannot."""
    if not (ws.state_dir / "state.db").is_file():
        return set()
    try:
        return run_by_name(ws.read_store(), names)
    except Exception:  # noqa: BLE001 - state.db's own problem: its check names it
        return set()


def forget_empty_runs(store: Store, name: str, run_id: int) -> None:
    """Delete the cron run of sweep ``name`` before ``run_id`` if it enqueued nothing and
    took nothing over (no job refers to it), in the run's transaction: a `* * * * *`
    entry whose pairs are all queued or fresh added a row a minute, 195 MB of state.db a
    year of runs of nothing. What reads them needs the last run alone (`status`'s last
    run, a missed night's end, `report --sweep`), which stays; a person's runs too. The
    one before only, found by the index: each run's own was deleted by the next, and a
    look at every run of the name took 2 s of each minute after a year of runs with jobs
    (those of a release before this, migration 25)."""
    store.conn.execute(
        "DELETE FROM sweep_runs WHERE id = (SELECT id FROM sweep_runs WHERE name = ? AND "
        "id < ? AND trigger = 'cron' ORDER BY started_at DESC, id DESC LIMIT 1) AND jobs = 0 "
        "AND NOT EXISTS (SELECT 1 FROM review_jobs j WHERE j.sweep_run_id = sweep_runs.id)",
        (name, run_id),
    )


def start_run(
    store: Store,
    name: str,
    trigger: str,
    options: dict,
    budget_usd: float | None = None,
    cron_minute: datetime | None = None,
) -> int:
    """A new ``sweep_runs`` row; its ``options`` are what its jobs' follow-ups read, and
    ``cron_minute`` the minute a cron run stands for (`status` says it)."""
    return store.conn.execute(
        "INSERT INTO sweep_runs (name, trigger, options, budget_usd, started_at, cron_at) "
        "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
        (
            name,
            trigger,
            json.dumps(options),
            budget_usd,
            utcnow(),
            timestamp(cron_minute) if cron_minute else None,
        ),
    ).fetchone()[0]


def _notes(kb: KB, paths: Collection[str]) -> dict[str, Note | None]:
    """The notes of ``paths`` as they are now; None for one that cannot be read."""
    notes: dict[str, Note | None] = {}
    for path in paths:
        try:
            notes[path] = kb.read_note(kb.check_rel(path))
        except (KBError, NoteParseError, OSError):
            notes[path] = None
    return notes


def _sequential(
    ws: Workspace, partition: str, req: SweepRequest, targets: list[dict]
) -> tuple[list[dict], list[Skipped]]:
    """Keep, per note, only the pairs of its first bundle that is not yet fresh with no
    FAIL; the later bundles wait (CONTRACT §7). Bundles are taken in the order named."""
    cat = ws.catalog()
    order: list[str] = []
    selected: dict[str, str] = {}  # gate id -> its bundle
    # Each selector resolved as select resolves it, so "/prose" or "type/x" name a bundle
    # the way they name gates; the selection already refused a selector that names none.
    for sel in req.selectors or tuple(cat.lenses):
        for gate in cat.resolve([sel]):
            selected[gate.gate_id] = gate.lens
            if gate.lens not in order:
                order.append(gate.lens)
    if req.all_gates:
        order += [lens for lens in cat.lenses if lens not in order]
        selected |= {g.gate_id: g.lens for g in cat.resolve([], True)}
    stale_lenses: dict[str, set[str]] = {}
    for t in targets:
        stale_lenses.setdefault(t["note_path"], set()).add(t["lens"])
    fails: dict[str, set[str]] = {}
    notes = _notes(ws.kb, stale_lenses)
    for note_path, gate_id, gate_path in ws.store.conn.execute(
        "SELECT a.note_path, a.gate_id, p.gate_path FROM acceptance a "
        "JOIN review_pairs p ON p.id = a.review_pair_id "
        "WHERE a.model_partition = ? AND a.decision = 'FAIL'",
        (partition,),
    ):
        # Only a gate this sweep reviews holds a bundle back: a FAIL of a gate removed
        # since, or one the sweep does not select, held the later bundles for good. So did
        # one of a gate the note no longer has (retyped by a fix or a person: its
        # re-review skips that pair), as export and warn-queue judge it (pair_now).
        if (
            gate_id in selected
            and pair_now(ws.kb, cat, notes, note_path, gate_id, gate_path) is not None
        ):
            fails.setdefault(note_path, set()).add(selected[gate_id])
    keep, waiting = [], []
    for t in targets:
        note = t["note_path"]
        earlier = order[: order.index(t["lens"])] if t["lens"] in order else []
        blocked_by = next(
            (
                lens
                for lens in earlier
                if lens in stale_lenses.get(note, set()) or lens in fails.get(note, set())
            ),
            None,
        )
        if blocked_by is None:
            keep.append(t)
        else:
            waiting.append(
                Skipped(
                    note,
                    t["gate_id"],
                    f"waits for bundle {blocked_by} to be fresh with no FAIL",
                    "waiting for an earlier bundle",
                )
            )
    return keep, waiting


# --- cron ------------------------------------------------------------------------------------


# A run whose minute passed longer ago than this while no control process checked is
# missed, not replayed: a control restarted at 07:00 does not start the 01:30 sweep. At
# least two ticks (reaper_seconds): with ticks every 15 minutes, a fixed 10 let no run fire.
LATE = timedelta(minutes=10)
# The minute each sweep was due for when its enqueue met a failure that can pass (state.db
# locked, a full disk), by state folder and name: still due once that is past LATE, since
# this control looked and tried at each tick. Missed after ten minutes of it, the night was
# lost "as no control process looked", the failure kept for the next minute cut short.
_retrying: dict[tuple[str, str], datetime] = {}


def due_sweeps(
    ws: Workspace,
    now: datetime,
    failures: list[Exception] | None = None,
    away: tuple[datetime, datetime] | None = None,
) -> list[SweepConfig]:
    """Sweeps whose cron matched a minute since the last check, at most :data:`LATE`
    (or two ticks) ago. A due sweep's clock moves in its enqueue's transaction
    (:func:`cron_fired` inside it), so a sweep whose enqueue failed is still due at the
    next check (past LATE too, while this process retries it), and one whose enqueue
    committed is not; the clock of one not due moves once it is half of LATE old, so that a run missed means no control looked then (not
    a cron edited to a time that passed while a control ran). The first check of an entry
    starts its clock, and runs it if its minute is this one (see :func:`_first_look`).
    Cron minutes are the machine's local wall time, as in crontab(5); the clock is kept
    in UTC, so an hour the autumn change repeats does not fire a sweep twice. A clock that
    cannot be moved now (state.db locked, a full disk) is moved at a later check: the
    failure goes to ``failures``, so that the sweeps due are still tried, or is raised
    once every sweep was looked at. ``away``: when the running control process was last
    away (its machine suspended, the process stopped, its clock stepped forward), from
    its last look to its return; a minute missed in it is said so."""
    own: list[Exception] = [] if failures is None else failures
    due = []
    store = ws.store
    late = max(LATE, 2 * timedelta(seconds=ws.settings.queue.reaper_seconds))
    for sweep in ws.settings.sweeps.values():
        if not sweep.cron:
            continue
        row = store.conn.execute(
            "SELECT last_checked FROM cron_state WHERE name = ?", (sweep.name,)
        ).fetchone()
        if row is None:
            fired = _first_look(ws, sweep, now)
            if fired is not None:
                # Started just before its minute, not left unset: an enqueue that fails
                # leaves it due at the next check (in the next minute, too), as any is.
                _move_clock(ws, sweep.name, fired - timedelta(microseconds=1), own)
                due.append(sweep)
            else:
                _move_clock(ws, sweep.name, now, own)
            continue
        if _instant(row[0]) > now + late:
            # Checked under a clock that ran ahead (a VM booted before NTP, a date set by
            # hand): every night until that time came again was skipped without a word.
            logs.get().warning(
                "sweep.clock_went_back",
                sweep=sweep.name,
                checked_at=row[0],
                note="the sweep's clock starts again now",
            )
            _move_clock(ws, sweep.name, now, own)
            continue
        fired = _last_match(sweep.cron, now)
        if fired is None or fired <= _instant(row[0]):
            if _instant(row[0]) < now - late / 2:
                # Kept by a control that runs: left where the last run put it, a cron
                # edited (and the control restarted) to a time already past that day was
                # "missed" as if no control had run then.
                _move_clock(ws, sweep.name, now, own)
            continue
        if fired < now - late and _retrying.get((str(ws.state_dir), sweep.name)) != fired:
            # A control that ran while the entry was left out (a bad [[sweeps]] entry,
            # since mended) looked at other clocks only: "no control" alone was false.
            why = (
                "no control process looked at its clock then, or the entry was left out of "
                "the settings or had no cron"
            )
            if away is not None and away[0] <= fired <= away[1]:
                # "No control process" sent the operator looking for a crash in the log
                # of a control that had run all along.
                why = (
                    "the control process was away then (its machine suspended or paused, "
                    "the process stopped, or its clock stepped forward)"
                )
            at = _at(fired)
            logs.get().warning(
                "sweep.missed",
                sweep=sweep.name,
                at=at,
                checked_at=row[0],
                reason=f"{why}; the sweep waits for its next time",
            )
            missed = {"event": "sweep.missed", "at": at, "wall": _wall(fired), "reason": why}
            _move_clock(ws, sweep.name, now, own, missed)
            continue
        due.append(sweep)
    _forget_clocks(ws, own)
    if failures is None and own:
        raise own[0]
    return due


def _forget_clocks(ws: Workspace, failures: list[Exception]) -> None:
    """Drop the clock of a sweep no entry has, or whose entry has no cron, while this
    control looks at the others: put back nights later, it starts afresh (its first look)
    rather than be said missed "as no control looked" at a time no entry named. Not while
    an entry is only left out as wrong (one named "#N" may be any): mended, its missed
    night is news."""
    left_out = ws.settings.sweeps_left_out
    if any(name.startswith("#") for name in left_out):
        return
    keep = json.dumps([n for n, s in ws.settings.sweeps.items() if s.cron] + list(left_out))
    gone = "name NOT IN (SELECT value FROM json_each(?))"
    try:
        # Read first: a write at every tick took state.db's lock for nothing.
        if ws.store.conn.execute(f"SELECT 1 FROM cron_state WHERE {gone}", (keep,)).fetchone():
            with ws.store.write():
                ws.store.conn.execute(f"DELETE FROM cron_state WHERE {gone}", (keep,))
    except (sqlite3.OperationalError, OSError) as exc:
        failures.append(exc)


def _first_look(ws: Workspace, sweep: SweepConfig, now: datetime) -> datetime | None:
    """The minute a sweep never looked at before runs for, if it runs now: when its cron
    matches this very minute. Only starting its clock, a control started at 02:00:10
    skipped that night's `0 2 * * *`. Not when a run of the entry was recorded since that
    minute began (run by name, or by a control whose clock state.db lost): it would run
    twice."""
    fired = _last_match(sweep.cron, now)
    if fired is None or fired < now.replace(second=0, microsecond=0):
        return None
    ran = ws.store.conn.execute(
        "SELECT 1 FROM sweep_runs WHERE name = ? AND started_at >= ? LIMIT 1",
        (sweep.name, timestamp(fired)),
    ).fetchone()
    return fired if ran is None else None


def cron_fired(ws: Workspace, name: str, now: datetime, not_run: dict | None = None) -> None:
    """Move a cron sweep's clock to ``now``: checked, and enqueued if it was due.
    ``not_run``: why its time ran nothing (missed, failed for good), for `status` and the
    report (:func:`sweeps_not_run`) until a run of the sweep starts."""
    clock = now.astimezone(UTC).isoformat()
    with ws.store.write():
        if not_run is None:
            ws.store.conn.execute(
                "INSERT INTO cron_state (name, last_checked) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET last_checked = excluded.last_checked",
                (name, clock),
            )
            return
        # Ended by a run started since its minute (`since`), not since the control noticed:
        # one run by hand while the control was down left the night "missed" all the same.
        since = timestamp(parse_timestamp(not_run["at"]))
        ws.store.conn.execute(
            "INSERT INTO cron_state (name, last_checked, not_run) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET last_checked = excluded.last_checked, "
            "not_run = excluded.not_run",
            (name, clock, json.dumps({**not_run, "since": since})),
        )


def _move_clock(
    ws: Workspace,
    name: str,
    now: datetime,
    failures: list[Exception],
    not_run: dict | None = None,
) -> None:
    """:func:`cron_fired`, with a failure that can pass kept in ``failures``: raised at
    once, one sweep's clock that met a locked state.db kept every other sweep of its
    minute from being tried."""
    try:
        cron_fired(ws, name, now, not_run)
    except (sqlite3.OperationalError, OSError) as exc:
        failures.append(exc)


def sweeps_not_run(store: Store, settings: Settings) -> list[dict]:
    """The configured cron sweeps whose last time ran nothing (``event``: sweep.missed or
    sweep.failed; ``at``, UTC; ``reason``; ``says``: the line), and no run of them started
    since: what a quiet night was said of in the log alone. A run by name, or the next
    night's, ends it."""
    out = []
    # `noticed_at`: what a record said before it had `since` (written by b7701d8 alone).
    for name, text in store.conn.execute(
        "SELECT c.name, c.not_run FROM cron_state c WHERE c.not_run IS NOT NULL AND NOT EXISTS "
        "(SELECT 1 FROM sweep_runs r WHERE r.name = c.name AND r.started_at >= COALESCE("
        "json_extract(c.not_run, '$.since'), json_extract(c.not_run, '$.noticed_at'))) "
        "ORDER BY c.name"
    ):
        entry = settings.sweeps.get(name)
        said = json_column(text)
        if entry is None or not entry.cron or not isinstance(said, dict):
            continue  # removed, or no longer on a clock: its old night is no news
        n = {"sweep": name, **{k: said.get(k) for k in ("event", "at", "wall", "reason")}}
        out.append({**n, "says": _not_run_words(n)})
    return out


def _not_run_words(n: dict) -> str:
    """One line of :func:`sweeps_not_run`, for `status` and the report."""
    name = n["sweep"]
    what = "was missed" if n["event"] == "sweep.missed" else "failed"
    at = f"{str(n['at'])[:16]}Z"
    try:
        wall = datetime.fromisoformat(str(n.get("wall")))
    except ValueError:  # recorded before it was kept: UTC alone
        wall = None
    if wall is not None and wall.utcoffset():
        # In the cron's own words too: in Kolkata `0 3 * * *` was "its run of
        # 2026-01-01T21:30Z", a time no cron names, on the day before.
        at = f"{wall:%H:%M} on {wall:%Y-%m-%d} on the control's clock ({at})"
    return (
        f"sweep {name!r}: its run of {at} {what}: {n['reason']}; it runs at "
        f"its next time, or now with reviewq enqueue --name {shlex.quote(name)}"
    )


def _at(fired: datetime) -> str:
    """A cron minute in UTC (``2026-01-01T21:30:00Z``), as the log and `status` say it."""
    return fired.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _wall(fired: datetime) -> str:
    """A cron minute as the control's clock read it (``2026-01-02T03:00+05:30``): how its
    `[[sweeps]]` entry names it, which `status` may read on another clock."""
    return fired.astimezone().isoformat(timespec="minutes")


def enqueue_due_sweeps(
    ws: Workspace, now: datetime, away: tuple[datetime, datetime] | None = None
) -> None:
    """Enqueue the cron sweeps due now (the control process's tick). A failure that can
    pass (state.db locked, a full disk) leaves its sweep due, so the tick that is run
    again enqueues it, and is raised once every other due sweep was tried (one sweep's
    failure kept the others of its minute from running), as is one met moving a sweep's
    clock; any other is logged, and the sweep waits for its next matching minute.
    ``away``: as :func:`due_sweeps` takes it."""
    passing: list[Exception] = []
    for sweep in due_sweeps(ws, now, passing, away):
        retrying = (str(ws.state_dir), sweep.name)
        # The cron minute this run is for: a tick comes up to reaper_seconds after it, and
        # a retried one (N5) later still; said as the tick's time, it named no cron time.
        fired = _last_match(sweep.cron, now)
        try:
            enqueue(
                ws,
                SweepRequest.from_config(sweep, ws.root, trigger="cron"),
                # The clock moves with the run: moved after it, a control killed between
                # the two commits ran the sweep again once restarted.
                also=functools.partial(cron_fired, ws, sweep.name, now),
                cron_minute=fired,
            )
            _retrying.pop(retrying, None)
        except (sqlite3.OperationalError, OSError) as exc:
            if fired is not None:
                _retrying[retrying] = fired
            passing.append(exc)
        except Exception as exc:
            _retrying.pop(retrying, None)
            error = f"{type(exc).__name__}: {exc}"
            logs.get().error(
                "sweep.failed",
                sweep=sweep.name,
                error=error,
                recovery="the sweep runs again at its next matching minute",
            )
            at = _at(fired or now)
            failed = {
                "event": "sweep.failed",
                "at": at,
                "wall": _wall(fired or now),
                "reason": logs.redact(error),
            }
            _move_clock(ws, sweep.name, now, passing, failed)
    if passing:
        raise passing[0]


def _last_match(cron: str, now: datetime) -> datetime | None:
    """The instant of the latest minute at or before ``now`` that ``cron`` matches in
    local wall time; None if it matches none (refused when the settings load)."""
    from croniter import CroniterError  # not at import: most processes have no cron sweep

    wall = now.astimezone().replace(second=0, microsecond=0, tzinfo=None)
    try:
        match = cron_iter(cron, wall + timedelta(minutes=1)).get_prev(datetime)
    except CroniterError:
        return None
    match = _on_the_clock(match)
    if _wildcard(cron) and (again := match.replace(fold=1).astimezone()) <= now:
        return again
    return match.astimezone()


def next_match(cron: str, now: datetime) -> datetime | None:
    """The instant of the first minute after ``now`` that ``cron`` fires at in local wall
    time, as :func:`_last_match` reads its minutes (`status` says it); None if no date to
    come matches."""
    from croniter import CroniterError  # not at import: most processes have no cron sweep

    # From an hour back: a wall time the autumn change repeats comes again after it passed.
    wall = now.astimezone().replace(second=0, microsecond=0, tzinfo=None) - timedelta(hours=1)
    folds = (0, 1) if _wildcard(cron) else (0,)
    try:
        times = cron_iter(cron, wall)
        for _ in range(24 * 60 + 2):  # at most the hour back's minutes and one more
            match = _on_the_clock(times.get_next(datetime))
            after = [t for f in folds if (t := match.replace(fold=f).astimezone()) > now]
            if after:
                return min(after)
    except CroniterError:
        return None
    return None


def _on_the_clock(match: datetime) -> datetime:
    """A naive wall time as cron(8) runs it: one the spring change skips (02:30 on the
    night 02:00 becomes 03:00) at the first minute that exists after it; astimezone()
    alone would read it as an instant an hour earlier, already past LATE when 03:00 comes.
    One the autumn change repeats stays naive: read at its first instant (fold 0)."""
    for _ in range(24 * 60):
        if match.astimezone().replace(tzinfo=None) == match:
            break
        match += timedelta(minutes=1)
    return match


def _wildcard(cron: str) -> bool:
    """Whether cron(8) runs ``cron`` by the clock as it reads again in the hour the autumn
    change repeats: its minute or hour is `*` (a "wildcard" entry), so `0 * * * *` runs at
    both 01:00s (fold 0 alone left two hours between its runs); others run at the first."""
    minute, hour = cron.split()[:2]
    return "*" in minute[:1] + hour[:1]


def sweeps_schedule(store: Store, settings: Settings, now: datetime) -> list[dict]:
    """Each cron `[[sweeps]]` entry's last run (by its clock or by name: ``last_run``
    ``{"id", "started_at", "trigger", "jobs", "taken_over"}``, null if none yet: the jobs
    it enqueued and those of a spent run it took over) and next time
    (``next_at`` UTC, ``next_wall`` on this machine's clock; null if no date to come
    matches), and the line `status` says: after a config change an operator could not
    tell whether the entry was read, when it last ran nor when it runs next. On this
    machine's clock, as the control reads its crons (status says when it reads another)."""
    from orchestrator.state.when import local_zone

    out = []
    for sweep in settings.sweeps.values():
        if not sweep.cron:
            continue
        row = store.conn.execute(
            "SELECT id, started_at, trigger, jobs, cron_at FROM sweep_runs WHERE name = ? "
            "ORDER BY started_at DESC, id DESC LIMIT 1",
            (sweep.name,),
        ).fetchone()
        last = dict(row) if row is not None else None
        nxt = next_match(sweep.cron, now)
        ran = "never run yet"
        if last is not None:
            last["taken_over"] = _jobs_taken_over(store, last["id"], last["started_at"])
            by = _BY.get(last["trigger"], f"by {last['trigger']}")
            taken = f" and {last['taken_over']} taken over" if last["taken_over"] else ""
            what = f"run {last['id']}, {last['jobs']} job(s){taken}, {by}"
            ran = f"last ran {_ran_when(last, what)}"
        comes = "no time to come matches its cron"
        if nxt:
            comes = "next {} ({})".format(*_wall_said(nxt))
        out.append(
            {
                "sweep": sweep.name,
                "cron": sweep.cron,
                "last_run": last,
                "next_at": timestamp(nxt) if nxt else None,
                "next_wall": _wall(nxt) if nxt else None,
                "says": f"sweep {sweep.name!r} ({sweep.cron}): {ran}, {comes}, on this "
                f"machine's clock ({local_zone()})",
            }
        )
    return out


def _ran_when(last: dict, what: str) -> str:
    """When a run ran, as `status` says it: the cron minute a run by its clock stands for
    and, begun in a later minute (its control down then, or its tick retried), how late and
    when: said by its start alone, the 03:00 run begun at 03:07 was one no cron names."""
    started = parse_timestamp(last["started_at"])
    if not last["cron_at"]:
        return "{} ({}; {what})".format(*_wall_said(started), what=what)
    minute = parse_timestamp(last["cron_at"])
    late = int((started - minute).total_seconds() // 60)
    if late < 1:
        return "{} ({}; {what})".format(*_wall_said(minute), what=what)
    return "its {} ({}), {late} min late at {at:%H:%M} ({what})".format(
        *_wall_said(minute), late=late, at=started.astimezone(), what=what
    )


def _jobs_taken_over(store: Store, run_id: int, started_at: str) -> int:
    """The review jobs of run ``run_id`` made before it started: an earlier run's, whose
    spent budget held them, that it took over (its fixes and re-reviews are its own)."""
    return store.conn.execute(
        "SELECT count(*) FROM review_jobs WHERE sweep_run_id = ? AND created_at < ? "
        "AND kind = 'review' AND source_job_id IS NULL AND parent_job_id IS NULL",
        (run_id, started_at),
    ).fetchone()[0]


# Who started a run, as `status` says it.
_BY = {"cron": "by its clock", "enqueue": "by reviewq enqueue", "sweep": "by reviewq sweep"}


def _wall_said(at: datetime) -> tuple[str, str]:
    """An instant as a person reads it on this machine's clock, and in UTC."""
    return f"{at.astimezone():%H:%M on %Y-%m-%d}", f"{timestamp(at)[:16]}Z"


def _instant(text: str) -> datetime:
    """A stored clock: UTC, or (written before it was) naive local wall time."""
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.astimezone()
