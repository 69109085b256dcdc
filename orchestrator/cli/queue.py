"""The queue commands of ``reviewq`` (CONTRACT §10): enqueue, worker, control, sweep, status,
jobs, job, logs, doctor. Registered on the group of :mod:`orchestrator.cli.common`."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import click
from click.core import ParameterSource

from orchestrator import logs
from orchestrator.cli.common import (
    ESCALATION_ID,
    JOB_ID,
    LEFT_OUT,
    SQL_INT,
    THREADS,
    BadValue,
    Checked,
    Level,
    Moment,
    Numbered,
    NumberWithin,
    Refused,
    WholeWithin,
    all_gates_alone,
    batch_size_needs_gate_grouping,
    budget_usd,
    cli,
    emit_json,
    no_kb_here,
    not_blank,
    nudge_control,
    refuse_domain_errors,
    root_rel,
    root_reports,
    say_if_no_control,
    shown,
    utf8,
    warn,
    warn_enqueued,
)
from orchestrator.config import GROUPINGS, ConfigError, settings_exposed
from orchestrator.state.status import (
    STATUSES,
    control_clock_said,
    held_by_budget,
)
from orchestrator.state.store import DISK_FULL, disk_error, no_room
from orchestrator.state.workspace import Workspace


def _sweep_options(fn):
    for opt in reversed(
        [
            click.argument("selectors", nargs=-1),
            click.option("--all-gates", is_flag=True, help="Every catalog gate."),
            click.option(
                "--note",
                "notes",
                multiple=True,
                callback=not_blank,
                help="Only these note files or folders.",
            ),
            click.option("--current", is_flag=True, help="Only notes with status: current."),
            click.option(
                "--reviewer",
                default="offline",
                show_default=True,
                callback=not_blank,
                help="The reviewer profile.",
            ),
            click.option(
                "--fixer",
                default="",
                callback=not_blank,
                help="The fixer profile [default: the reviewer].",
            ),
            click.option("--auditor", default="", callback=not_blank, help="The auditor profile."),
            click.option(
                "--grouping", type=click.Choice(GROUPINGS), default="note", show_default=True
            ),
            click.option("--batch-size", default=5, show_default=True, type=WholeWithin(min=1)),
            click.option(
                "--fix", is_flag=True, help="Send FAIL notes to the fixer (docs/CONTRACT.md §7)."
            ),
            click.option(
                "--sequential",
                is_flag=True,
                help="A note's later bundles wait for its earlier ones.",
            ),
            click.option(
                "--name",
                "sweep_name",
                default="cli",
                show_default=True,
                callback=not_blank,
                help=(
                    "The run's name (logs, budget, status). Alone (no gates, --all-gates or --note): "
                    "run the [[sweeps]] entry of that name as reviewq.toml configures it."
                ),
            ),
            click.option(
                "--budget-usd",
                type=NumberWithin(),
                default=None,
                callback=budget_usd,
                help="Start no new attempt once this run's recorded cost reaches it.",
            ),
        ]
    ):
        fn = opt(fn)
    return fn


# What a [[sweeps]] entry decides for a run of it by name (its budget may be given anew).
_CONFIGURED = {
    "notes", "current", "reviewer", "fixer", "auditor", "grouping", "batch_size", "fix",
    "sequential",
}  # fmt: skip


def _request(opts: dict, trigger: str, ws: Workspace | None = None):
    from orchestrator.sweeps.producer import SweepRequest

    configured = ws.settings.sweeps.get(opts["sweep_name"]) if ws is not None else None
    if configured is not None and not (opts["selectors"] or opts["all_gates"] or opts["notes"]):
        # `--name NIGHTLY` alone runs a [[sweeps]] entry now, as its cron would. An option
        # it would not use is refused rather than dropped: `--fix` must not mean no fix.
        ctx = click.get_current_context()
        for param in ctx.command.params:
            if (
                param.name in _CONFIGURED
                and ctx.get_parameter_source(param.name) == ParameterSource.COMMANDLINE
            ):
                raise Refused(
                    f"{param.opts[0]}: sweep {configured.name!r} runs as reviewq.toml "
                    "configures it; change it there, or name the gates to run an ad-hoc sweep"
                )
        req = SweepRequest.from_config(configured, ws.root, trigger=trigger)
        if opts["budget_usd"] is not None:
            req.budget_usd = opts["budget_usd"]
        return req

    named = click.get_current_context().get_parameter_source("sweep_name")
    chose = opts["selectors"] or opts["all_gates"] or opts["notes"]
    problem = ws.settings.sweeps_left_out.get(opts["sweep_name"]) if ws is not None else None
    if named == ParameterSource.COMMANDLINE and not chose and problem:
        raise Refused(
            f"{problem}; fix the entry, or name gates to run an ad-hoc sweep under its name"
        )
    if named == ParameterSource.COMMANDLINE and not chose:
        # A mistyped `--name nightly` ran every gate of the catalog, silently.
        known = ", ".join(sorted(ws.settings.sweeps)) if ws is not None else ""
        raise Refused(
            f"--name {opts['sweep_name']}: no [[sweeps]] entry of that name (configured: "
            f"{known or 'none'}); name gates, --all-gates or --note to run an ad-hoc sweep "
            "under it"
        )
    batch_size_needs_gate_grouping(opts["grouping"])
    all_gates = opts["all_gates"] or not opts["selectors"]  # no selection: every catalog gate
    return SweepRequest(
        name=opts["sweep_name"],
        reviewer=opts["reviewer"],
        selectors=tuple(opts["selectors"]),
        all_gates=all_gates,
        notes=tuple(opts["notes"]),
        current=opts["current"],
        grouping=opts["grouping"],
        batch_size=opts["batch_size"],
        fix=opts["fix"],
        sequential=opts["sequential"],
        fixer=opts["fixer"],
        auditor=opts["auditor"],
        budget_usd=opts["budget_usd"],
        trigger=trigger,
    )


@cli.command("enqueue", cls=Checked, check=all_gates_alone)
@_sweep_options
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@refuse_domain_errors
def enqueue_cmd(ws: Workspace, as_json: bool, **opts) -> None:
    """Select stale pairs, create jobs and queue them for the workers (the producer).

    \b
    Example:
      reviewq enqueue prose --reviewer claude --fix
    """
    from orchestrator.sweeps.producer import enqueue

    req = _request(opts, "enqueue", ws)
    res = enqueue(ws, req)
    nudge_control(ws)
    warn_enqueued(res)  # on stderr, --json or not
    if as_json:
        emit_json(
            {
                "sweep_run": res.run_id,
                "model_partition": res.model_partition,
                "jobs": [j.to_json() for j in res.jobs],
                "skipped": [asdict(s) for s in res.skipped],
                "notes_excluded": res.excluded,
                "taken_over": sum(res.taken_over.values()),
            }
        )
        return
    from orchestrator.review.jobs import skipped_count

    pairs = sum(len(j.pairs) for j in res.jobs)
    click.echo(
        f"queued {len(res.jobs):,} job(s), {pairs:,} pair(s) for reviewer {req.reviewer}; "
        f"{skipped_count(res.skipped)}{res.taken_over_words()}"
    )


@cli.command("worker")
@click.option(
    "--workers",
    default=2,
    show_default=True,
    type=WholeWithin(min=1, max=THREADS),
    help="Agents run at once.",
)
@click.option(
    "--kb",
    "kb",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="A read-only copy of the KB root (the folder holding kb/) for agents that "
    "follow links; without it agents work in their attempt folder.",
)
@click.pass_obj
@refuse_domain_errors
def worker_cmd(ws: Workspace, workers: int, kb: Path | None) -> None:
    """Consume the review queue: run agents (SIGINT drains, SIGTERM stops now).

    A worker needs only the queue: on another machine give it a file with `[queue] url`
    and the `[reviewers.*]` profiles, and a folder of its own.

    \b
    Example:
      reviewq worker --workers 4
      reviewq --config worker.toml --state /var/lib/reviewq-worker worker --workers 4
    """
    from workers.attempt import unwritable, worker_folder, worker_paths
    from workers.consumers import run_worker

    if kb is not None and not kb.is_dir():
        raise Refused(f"--kb {shown(str(kb))}: no such folder")
    if kb is not None and not (kb / "kb").is_dir():
        # The notes' own folder given, most likely: agents would follow no link in it.
        raise Refused(
            f"--kb {shown(str(kb))}: no kb/ folder in it; give the KB root, the folder that holds kb/"
        )
    if (unfed := _unfed_queue(ws)) is not None:
        # A second machine whose worker.toml lacks the url: it waited for good and said
        # only worker.started.
        raise Refused(unfed)
    from workers.queues import check_queue

    check_queue(ws.settings)  # a password or address Redis refuses: not an outage to wait out
    folder = worker_folder(ws.settings)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        # ENOSPC with bytes free, as `df -h` shows them, is a disk out of inodes: said.
        room = no_room(folder.parent) if exc.errno in DISK_FULL else None
        raise Refused(
            f"--state {shown(str(ws.settings.state_dir))}: cannot make the worker's folder "
            f"{shown(str(folder))}: {exc.strerror or exc}{f'; {room}' if room else ''}"
        ) from None
    for path in worker_paths(folder)[1:]:
        with contextlib.suppress(OSError):  # said below, with the one it stopped at
            path.mkdir(mode=0o700, exist_ok=True)
    if (problem := unwritable(folder)) is not None:
        # It started, and failed every attempt as a launch failure, which paused the
        # profile for every worker.
        raise Refused(f"--state {shown(str(ws.settings.state_dir))}: {shown(problem)}")
    run_worker(ws.settings, workers, kb.resolve() if kb is not None else None)


@cli.command("control")
@click.pass_obj
@refuse_domain_errors
def control_cmd(ws: Workspace) -> None:
    """Consume the control queue: finalize, retry, reap, fire cron sweeps (run exactly one).

    \b
    Example:
      reviewq control
    """
    from workers.consumers import AlreadyRunning, run_control
    from workers.queues import check_queue

    check_queue(ws.settings)  # a password or address Redis refuses: not an outage to wait out
    try:
        run_control(ws)
    except AlreadyRunning as exc:
        raise Refused(str(exc)) from None


@cli.command("sweep", cls=Checked, check=all_gates_alone)
@_sweep_options
@click.option(
    "--workers",
    default=2,
    show_default=True,
    type=WholeWithin(min=0, max=THREADS),
    help="Worker threads; 0 uses only workers already running.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_obj
@refuse_domain_errors
def sweep_cmd(ws: Workspace, workers: int, as_json: bool, **opts) -> None:
    """Enqueue, then run control and workers until every job is done or waits; print a summary.

    \b
    Example:
      reviewq sweep --reviewer offline --workers 4
    """
    from orchestrator.cli.display import ProgressDisplay, render_summary
    from workers.queues import check_queue, claim_problem, claimed_by_another
    from workers.sweep import Children, run_sweep

    logs.configure(ws.state_dir)
    # Forked first, before state.db or the queue is open: see Children.fork.
    children = Children(ws, workers)
    children.fork()
    try:
        check_queue(ws.settings)  # before its jobs are recorded, for a queue that never answers
        # ... and another KB's control on its Redis database: its own control would be
        # refused, after its worker had taken that KB's review messages meanwhile.
        if ws.settings.queue.url and (
            held := claimed_by_another(ws.settings, ws.store.install_id())
        ):
            raise ConfigError(claim_problem(ws.settings, held))
        req = _request(opts, "sweep", ws)
    except BaseException:
        children.stop(at_once=True)
        raise
    with ProgressDisplay(enabled=not as_json and sys.stderr.isatty()) as display:
        out = run_sweep(ws, req, workers, on_progress=display.update, children=children)
    warn_enqueued(out.enqueued)
    from orchestrator.cycles.escalations import only_reject_check
    from orchestrator.state.status import pause_words

    pauses = [pause_words(ws.store, name, pause) for name, pause in out.paused.items()]
    if as_json:
        emit_json(
            {
                "sweep_run": out.enqueued.run_id,
                "enqueued_jobs": len(out.enqueued.jobs),
                "skipped": len(out.enqueued.skipped),
                "taken_over": sum(out.enqueued.taken_over.values()),
                "files_not_reviewed": [asdict(p) for p in out.enqueued.problems],
                "notes_excluded": out.enqueued.excluded,
                "progress": out.progress.__dict__,
                "paused": {name: pause.until for name, pause in out.paused.items()},
                "paused_reviewers": {
                    name: {
                        "paused_until": pause.until,
                        "paused_reason": pause.reason,
                        "paused_since": pause.since,
                    }
                    for name, pause in out.paused.items()
                },
                **out.summary,
                "escalations": root_reports(ws, out.summary["escalations"]),
            }
        )
    else:
        render_summary(out, only_reject_check(ws), pauses, ws.store)
    problems = []
    if out.summary["failed"]:
        problems.append(f"{len(out.summary['failed'])} job(s) failed")
    problems.extend(held_by_budget(ws.store, out.progress.budget_runs, ws.settings))
    if out.progress.waiting_paused:
        # In full where no summary above says it (--json); the summary's lines otherwise.
        problems.append(
            f"{out.progress.waiting_paused} job(s) wait on a paused reviewer: "
            + ("; ".join(pauses) if as_json else f"{', '.join(out.paused)} (above)")
        )
    if out.summary["fixes_unwritten"]:
        first = out.summary["fixes_unwritten"][0]
        problems.append(
            f"{len(out.summary['fixes_unwritten'])} fixed note(s) not written to the KB "
            f"({first['note_path']}: {first['error']}); the control process tries again at each tick"
        )
    problems.extend(out.children_failed)
    if problems:
        raise Refused("; ".join(problems))


@cli.command("resume")
@click.argument("reviewer", callback=not_blank)
@click.pass_obj
@refuse_domain_errors
def resume_cmd(ws: Workspace, reviewer: str) -> None:
    """Lift a reviewer's pause now that its cause is fixed (a key renewed, a CLI
    installed), instead of waiting out pause_seconds. The control process may keep
    running: it dispatches the reviewer's queued jobs at once.

    \b
    Example:
      reviewq resume claude
    """
    from orchestrator.control.control import lift_pause
    from orchestrator.state.status import pause_said, pause_span

    store = ws.store
    found = lift_pause(store, reviewer, datetime.now(UTC))
    if found is None:
        ws.settings.reviewer(reviewer)  # a mistyped name is an error, not "not paused"
        click.echo(f"reviewer {reviewer} is not paused")
        return
    lifted, held = found
    logs.get().info(
        "reviewer.resumed",
        reviewer=reviewer,
        paused_since=lifted.since,
        paused_until=lifted.until,
        reason=lifted.reason,
        # Each held job's story (logs --job N): why it ran before its pause's end. As
        # runs of ids, bounded: every id, one a job, was thousands on one line.
        **logs.held_jobs(held),
    )
    nudge_control(ws)
    # The pause as status and doctor said it, in the past.
    why = pause_said(store, reviewer, lifted)
    click.echo(f"reviewer {reviewer} resumed (it was paused {pause_span(lifted)}: {why})")


@cli.command("rewrite-files")
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Ended jobs' folders and decided escalations' reports too.",
)
@click.pass_obj
@refuse_domain_errors
def rewrite_files_cmd(ws: Workspace, everything: bool) -> None:
    """Write the folders (MANIFEST.json, results/) of queued and running jobs, of any job
    whose files wait to be written, and the reports of open escalations again from
    state.db: they render it, and this brings back what was deleted or damaged by hand. Fixes are not written to the KB again. A running
    control process may stay up.

    \b
    Examples:
      reviewq rewrite-files
      reviewq rewrite-files --all
    """
    from orchestrator.control.control import rewrite_files

    with logs.said_by_command("job.files_failed", "escalation.report_failed"):
        jobs, reports, left = rewrite_files(ws, everything)
    click.echo(f"wrote the files of {jobs} job(s) and {reports} escalation report(s)")
    if left:
        raise Refused(
            f"{len(left)} job folder(s) or report(s) could not be written: {left[0]}"
            + (f" (and {len(left) - 1} more)" if len(left) > 1 else "")
            + "; state.db still holds them: run reviewq rewrite-files again once that is "
            "fixed (a running control process tries at each tick)"
        )


@cli.command("status")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@refuse_domain_errors
def status_cmd(ws: Workspace, as_json: bool) -> None:
    """What is queued, running, done, failed and escalated; paused reviewers; cost.

    \b
    Example:
      reviewq status --json
    """
    from orchestrator.cycles.escalations import only_reject_check
    from orchestrator.state.status import status, status_lines, too_large_notes
    from orchestrator.sweeps.producer import sweeps_not_run, sweeps_schedule

    store = ws.read_store()
    data = status(store, ws.settings, only_reject_check(ws))
    data["notes_not_reviewed"] = [asdict(p) for p in too_large_notes(ws)]
    data["notes_excluded"] = len(ws.kb.excluded)  # counted by the scan just made
    data["sweeps_not_run"] = sweeps_not_run(store, ws.settings)
    data["sweeps"] = sweeps_schedule(store, ws.settings, datetime.now(UTC))
    if as_json:
        emit_json(data)
        return
    for line in status_lines(ws, store, data):
        click.echo(line)


@cli.command("jobs")
@click.option(
    "--state", "state", type=click.Choice(STATUSES), default=None, help="Only jobs in this state."
)
@click.option("--limit", default=200, show_default=True, type=SQL_INT)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@refuse_domain_errors
def jobs_cmd(ws: Workspace, state: str | None, limit: int, as_json: bool) -> None:
    """Review jobs, newest first.

    \b
    Example:
      reviewq jobs --state failed
    """
    from orchestrator.state.status import job_count, jobs, jobs_line

    store = ws.read_store()
    rows = jobs(store, state, limit)
    # Every job --limit let through, or how many there are: a script reading 200 of
    # 3,500 had no sign of the rest.
    total = len(rows) if len(rows) < limit else job_count(store, state)
    if as_json:
        emit_json({"jobs": rows, "total": total})
        return
    for r in rows:
        click.echo(jobs_line(r))
    if total > len(rows):
        # It stopped at 200 of 3,500 without a word.
        click.echo(f"… {total - len(rows)} older job(s) not shown (--limit N)")


@cli.command("job", cls=Numbered, ids=JOB_ID.what)
@click.argument("job_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@refuse_domain_errors
def job_cmd(ws: Workspace, job_id: int, as_json: bool) -> None:
    """One job: its pairs and decisions, attempts and telemetry.

    \b
    Example:
      reviewq job 12
    """
    from orchestrator.state.status import NotFound, job, job_lines

    try:
        data = job(ws.read_store(), job_id, ws.settings)
    except NotFound as exc:
        raise Refused(str(exc)) from None
    if as_json:
        # A person's decision has no folder (job_dir ''): not the state folder itself.
        folder = data["job_dir"] and root_rel(ws, ws.state_dir / data["job_dir"])
        emit_json({**data, "job_dir": folder, "escalations": root_reports(ws, data["escalations"])})
        return

    for line in job_lines(job_id, data):
        click.echo(line)


def _log_period(
    since: str | None, until: str | None, follow: bool, **_: object
) -> tuple[datetime | None, datetime | None, datetime]:
    """logs' period as its line reads it (:class:`Checked`): its start, its end and now;
    an --until not after --since, or with --follow, is bad usage."""
    now = datetime.now(UTC)
    start = end = None
    if since or until:  # imported for a period only: `reviewq logs` alone is as fast as before
        from orchestrator.state.when import MomentError, moment

        try:
            start = moment(since, "--since", now)[0] if since else None
            end = moment(until, "--until", now)[0] if until else None
        except MomentError as exc:  # read as the line was parsed (Moment); now is later
            raise BadValue(str(exc)) from None
    if start is not None and end is not None and end <= start:
        raise BadValue(f"--until {until!r}: not after --since {since!r}; no line between")
    if end is not None and follow:
        # The lines -f waits for are written after now, past any --until a person names.
        raise BadValue(f"--until {until!r} and --follow: following shows lines yet to come")
    return start, end, now


@cli.command("logs", cls=Checked, check=_log_period)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines.")
@click.option("--job", "job_id", type=JOB_ID, default=None, help="Only lines about this job.")
@click.option(
    "--event",
    default=None,
    callback=not_blank,
    help="Only this event, in any case (job.failed), or every event under a dotted prefix "
    "(attempt, attempt. or 'attempt.*': each attempt.* event; whole words: not attempt.start).",
)
@click.option(
    "--since",
    type=Moment(),
    default=None,
    callback=not_blank,
    help="Only lines from then on: a duration back from now (8h, 90m), a date/time "
    "(2026-11-26T22:00) or a time of day (22:00: the last time this machine's clock read "
    "it), as `report --since`; a bare date or time is on this machine's clock. Reads the "
    "rotated copies beside the log (reviewq.jsonl.1, .2.gz, -20261126…) that reach into "
    "the period, oldest first.",
)
@click.option(
    "--until",
    type=Moment(),
    default=None,
    callback=not_blank,
    help="Only lines before then (read as --since). Without --since, the log file alone.",
)
@click.option(
    "--level",
    type=Level(),
    default=None,
    callback=not_blank,
    help="Only lines this grave or graver: debug, info, warning, error, critical "
    "(fatal is critical).",
)
@click.option("--json", "as_json", is_flag=True, help="The raw JSON lines.")
@click.pass_obj
@refuse_domain_errors
def logs_cmd(
    ws: Workspace,
    follow: bool,
    job_id: int | None,
    event: str | None,
    since: str | None,
    until: str | None,
    level: str | None,
    as_json: bool,
) -> None:
    """The structured log, readable. Without --since, STATE/logs/reviewq.jsonl alone; with
    it, its rotated copies too where the period reaches into them.

    \b
    Examples:
      reviewq logs --event job. --job 12
      reviewq logs --since 22:00 --level warning
    """
    path = logs.log_path(ws.state_dir)
    start, end, now = _log_period(since, until, follow)
    if start is not None and start >= now:
        raise Refused(f"--since {since!r}: after now ({now.isoformat()[:16]}Z); no line yet")
    rank = logs.level_rank(level) if level else None
    if not ws.state_dir.is_dir():  # -f waited for good, in silence, on a mistyped --state
        raise Refused(f"{ws.state_dir}: no state folder here (is --state right?)")
    if not path.exists() and not follow:
        raise Refused(f"no log yet at {path}")
    wanted = logs.Wanted(since=start, until=end, job_id=job_id, event=event, level=rank)
    if unknown := logs.event_unknown(path, wanted):  # before -f waits for good on it
        raise BadValue(f"--event {event!r}: {unknown}")
    shown_any = False
    for rec, line in logs.entries(
        path, wanted, functools.partial(click.echo, err=True), follow=follow
    ):
        shown_any = True
        if as_json:
            click.echo(line)
            continue
        click.echo(logs.line_text(rec))
    # After the morning's rotation the night is in the copies, which --since reads: said
    # alone, as an event "no line of the log read is" would send the person to its name.
    copies = logs.copies(path) if not shown_any and start is None else []
    if event and not shown_any and not follow and not copies:
        said = logs.event_unmatched(path, wanted)
        click.echo(f"warning: --event {shown(event)}: {said}", err=True)
    if job_id is not None and not shown_any and _no_such_job(ws, job_id):
        # A mistyped number read as a job with nothing logged (CONTRACT: refused, 1).
        where = shown(str(ws.state_dir / "state.db"))
        raise Refused(f"--job {job_id}: no review job {job_id} in {where}")
    if copies:
        named = ", ".join(shown(c.name) for c in copies[:3]) + (", …" if len(copies) > 3 else "")
        click.echo(
            f"warning: {shown(str(path))}: no line shown of it, and logrotate left "
            f"{len(copies)} older cop{'y' if len(copies) == 1 else 'ies'} beside it ({named}): "
            "--since reads those too (`reviewq logs --since 3d …`)",
            err=True,
        )


def _no_such_job(ws: Workspace, job_id: int) -> bool:
    """state.db is there and records no job ``job_id``. A worker's folder has none, and
    a state.db that cannot be read says nothing: the log is where its trouble is read."""
    from orchestrator.state.status import job_recorded

    if not (ws.state_dir / "state.db").exists():
        return False
    try:
        return not job_recorded(ws.read_store(), job_id)
    except Exception:  # noqa: BLE001 - a damaged or locked state.db: not the question here
        return False


@cli.command("doctor")
@click.option(
    "--worker",
    "worker_only",
    is_flag=True,
    help="Check only what a worker needs: the queue and the reviewer programs (no KB, no state.db).",
)
@click.pass_obj
def doctor_cmd(ws: Workspace, worker_only: bool) -> None:
    """Check the KB layout, gates, database, queue backend and reviewer binaries.

    \b
    Examples:
      reviewq doctor
      reviewq --config worker.toml --state /var/lib/reviewq-worker doctor --worker
    """
    problems = 0

    def report(ok: bool, text: str) -> None:
        nonlocal problems
        problems += 0 if ok else 1
        click.echo(f"{'ok' if ok else 'problem'}: {text}")

    if not worker_only:  # a worker runs no sweep
        for problem in ws.settings.sweeps_left_out.values():
            report(False, f"{problem} ({LEFT_OUT})")
        for ignored in ws.settings.sweeps_ignored:
            click.echo(f"warning: {shown(ignored)}")
    in_kb = worker_only or _doctor_control_side(ws, report)
    if not in_kb and not ws.settings.queue.url:
        pass  # a SQLite queue lives in the state folder: not made in the wrong folder
    elif worker_only and (unfed := _unfed_queue(ws)) is not None:
        # It said "ok: queue backend SQLite answers" of a queue of the worker's own.
        report(False, unfed)
    else:
        _doctor_queue(ws, report, worker_only, own_control=in_kb)
    if worker_only:
        from workers.attempt import limits_unseen, unwritable, worker_folder

        if (problem := unwritable(worker_folder(ws.settings))) is not None:
            report(False, f"--state {shown(str(ws.state_dir))}: {shown(problem)}")
        if (unseen := limits_unseen()) is not None:
            click.echo(f"warning: {unseen}")
    remote = not worker_only and bool(ws.settings.queue.url) and _worker_here(ws) is None
    _doctor_reviewers(ws, report, remote=remote)
    if (exposed := settings_exposed(ws.settings)) is not None:
        click.echo(f"warning: {shown(exposed)}")
    if problems:
        raise Refused(f"{problems} problem(s)")
    warn([])


def _unfed_queue(ws: Workspace) -> str | None:
    """Why a worker here would wait on a queue no control process feeds, or None: no
    ``[queue] url``, away from the KB (where a control may yet start: the Procfile starts
    both) and from any control's state folder. The worker refuses to start on it, and
    ``doctor --worker`` names it, in the same words."""
    from workers.queues import beside_a_control

    if ws.settings.queue.url or beside_a_control(ws.settings):
        return None
    where = ws.settings.config_path
    return (
        f"no [queue] url, and {shown(str(ws.state_dir))} is no control's state folder: this "
        "worker would wait on a SQLite queue of its own that no control process feeds; set "
        f"[queue] url (Redis){f' in {shown(str(where))}' if where else ''}, or give --state "
        "the control's folder on its machine"
    )


def _fed_from_elsewhere(ws: Workspace) -> bool:
    """A control process of another machine or state folder feeds the Redis queue (the
    queue's check names it): the KB's reviewq.toml on a laptop, its control on a server.
    "start `reviewq control`" there made a second one, every [[sweeps]] entry run twice."""
    if not ws.settings.queue.url:
        return False
    from workers.queues import close_huey, huey_for, other_feeder

    try:
        huey = huey_for(ws.settings, "control")
    except Exception:  # noqa: BLE001 - a queue out of reach: the queue's own check names it
        return False
    try:
        return other_feeder(huey, ws.state_dir) is not None
    except Exception:  # noqa: BLE001 - as above
        return False
    finally:
        close_huey(huey)


def _doctor_control_side(ws: Workspace, report) -> bool:
    """The KB, the gates and state.db: what the control process's machine needs. False
    when ROOT holds no KB (nothing else is checked, and nothing made there) or the state
    folder is another program's (no queue is made there)."""
    kb_dir = ws.root / "kb"
    if not kb_dir.is_dir():
        # In the words every other command refuses it with: "KB root X holds kb/" was
        # printed as the problem, saying the opposite of what was wrong.
        # A worker's machine has none: its doctor is another one.
        hint = "; on a worker's machine, `reviewq doctor --worker`" if ws.settings.queue.url else ""
        report(False, no_kb_here(ws.root) + hint)
        return False  # nothing else to check here, and no state.db to make in the wrong folder
    report(True, f"KB root {ws.root} holds kb/")
    from orchestrator.review.selector import note_root_problems

    # What select refuses (a root overlapping the gates, the state folder inside one),
    # not only whether the folder is there: doctor said ok to roots every sweep refused.
    root_problems = note_root_problems(ws.kb, ws.state_dir)
    for problem in root_problems:
        report(False, problem)
    if not root_problems:
        for rel in ws.settings.note_roots:
            report(True, f"note root {rel}")
    cat = ws.catalog()
    report(bool(cat.gates), f"{len(cat.gates)} gate(s) in {len(cat.lenses)} lens(es)")
    for p in cat.problems:
        report(False, f"invalid gate {p.path}: {p.reason}")
    from orchestrator.kb.gates import gate_warnings

    # A gate asked of no note, a lens folder with none: each named, as `gates` names it.
    warn(gate_warnings(ws.kb, cat), every=True)
    from orchestrator.sweeps.producer import sweep_problems, sweeps_unfired

    for sweep in ws.settings.sweeps.values():
        for problem in sweep_problems(ws, sweep):
            report(False, f"{ws.settings.config_path}: {problem}")
    if (unfired := sweeps_unfired(ws, functools.partial(_fed_from_elsewhere, ws))) is not None:
        click.echo(f"warning: {shown(unfired)}")
    if (other := control_clock_said(ws.settings)) is not None:
        # Where a new unit is checked: its control reads /etc/localtime, not the shell's TZ.
        click.echo(f"warning: {shown(other)}")
    from orchestrator.health import state_folder

    def unwritable(path: Path) -> str:  # the workers' words, imported only when one is met
        from workers.attempt import not_writable

        return not_writable(path)

    return state_folder(ws, report, lambda text: click.echo(f"warning: {text}"), unwritable)


def _doctor_queue(
    ws: Workspace, report, worker_only: bool = False, own_control: bool = True
) -> None:
    """The queue backend answers: what every worker needs. ``own_control`` false: ROOT
    holds no KB, so no control of this folder feeds the queue to share it with another
    (on a worker's machine, the control that feeds it was called "another")."""
    try:
        from workers import queues
        from workers.app import make_app
        from workers.queues import (
            beside_a_control,
            check_queue,
            check_server,
            eviction_risk,
            fed_by,
            fed_late,
            full_problem,
            other_feeder,
            out_of_reach,
            profiles_unlike,
            queue_clock,
            refusal_problem,
            refuses_writes,
            release_unlike,
            shared_problem,
            stale_problem,
            stall_problem,
            unfed_problem,
        )

        if (stalled := stall_problem(ws.settings)) is not None:
            report(False, f"queue backend: {stalled}")  # what follows would wait on it
            return
        check_queue(ws.settings)
        with make_app(ws.settings) as app:
            check_server(app.control, ws.settings)
            check_server(app.review, ws.settings)
            app.control.pending_count()
            backend = "Redis" if ws.settings.queue.url else "SQLite"
            report(True, f"queue backend {backend} answers")
            if (risk := eviction_risk(app.control, ws.settings)) is not None:
                click.echo(f"warning: {risk}")
            fed = fed_by(app.control)
            silent = fed_late(fed, queue_clock(app.control)) if fed else None
            refusal = refuses_writes(app.control) if ws.settings.queue.url else None
            # A Redis that refuses writes (full, unsaved) refuses the control's key too: it
            # may well run (the worker's rule).
            full = refusal if silent is not None else None
            if refusal is not None and (full is None or not worker_only):
                # Else the silent control's line below says it. It was "ok" and no more,
                # to the operator asking why nothing runs.
                click.echo(f"warning: {refusal_problem(ws.settings, refusal)}")
            mine = own_control and not worker_only
            other = other_feeder(app.control, ws.state_dir) if mine else None
    except Exception as exc:
        away = ws.settings.queue.url and isinstance(exc, queues.QUEUE_UNAVAILABLE)
        # A SQLite queue on a full disk is "disk I/O error" alone (its WAL index not grown).
        full = disk_error(exc) and no_room(ws.state_dir, ws.state_dir / "queue")
        said = out_of_reach(ws.settings, exc) if away else f"{exc}; {full}" if full else exc
        report(False, f"queue backend: {said}")
        return
    if other is not None:
        report(False, shared_problem(ws.settings, other))
    if fed is not None and worker_only and (fed or not beside_a_control(ws.settings)):
        # A worker on another database than the control's (redis://host/3 where it uses
        # /0) passed, and then sat idle for good. The worker's own rule (it warns in its
        # log): beside a control, one may yet start and feed the queue. A control that fed
        # it once and stopped (or moved) was "ok" for good.
        report(
            bool(fed) and silent is None,
            unfed_problem(ws.settings)
            if not fed
            else full_problem(ws.settings, fed, full)
            if full is not None
            else stale_problem(ws.settings, fed, silent)
            if silent is not None
            else f"a control process feeds this queue (on {fed.get('host')}, state folder "
            f"{fed.get('state')}, last at {fed.get('at')})",
        )
        if fed and (unlike := release_unlike(fed)) is not None:
            report(False, unlike)
        for problem in profiles_unlike(ws.settings, fed or {}).values():
            report(False, problem)


# Where a Redis queue's workers may be: what the control's machine lacks for a reviewer.
ELSEWHERE = (
    "on this machine: a worker here would fail its jobs, one on another machine is checked "
    "there with reviewq --config worker.toml --state DIR doctor --worker"
)


def _worker_here(ws: Workspace) -> str | None:
    """Which worker runs on this machine for the control's Redis queue, as far as the
    state folder tells: one beside the control (the Procfile's, a sweep's: its log in
    ``STATE/worker/``) that started on this very queue, or one of this host that took an
    attempt opened since the control last started. None: the agents may all run
    elsewhere."""
    import socket

    from orchestrator.state.status import last_of, worker_of_host
    from orchestrator.state.store import timestamp
    from workers.attempt import worker_folder
    from workers.consumers import queue_described

    here = worker_folder(ws.settings)
    if here != ws.state_dir:
        line = last_of(logs.log_path(here), (b"worker.started",))
        if line is not None and line.get("queue") == queue_described(ws.settings):
            return str(line.get("worker") or here)
    if not (ws.state_dir / "state.db").is_file():
        return None
    try:
        since = datetime.fromtimestamp((ws.state_dir / "control.lock").stat().st_mtime, UTC)
        return worker_of_host(ws.store, socket.gethostname(), timestamp(since))
    except Exception:  # noqa: BLE001 - no control.lock, or state.db's own problem, said above
        return None


def _program_problem(root: Path, exe: str) -> str | None:
    """Why ``exe`` cannot be run as its agents run it, or None. A relative path such as
    tools/review.py runs from the folder its agents start in, the KB root (a sweep's, a
    `worker --kb`'s), not from wherever doctor was typed."""
    if os.sep not in exe:
        return None if shutil.which(exe) else f"{exe} not on PATH"
    if exe.startswith("~"):
        # An agent is started with no shell: "no program under the KB root" of ~/bin/x.
        return f"{exe}: ~ is not expanded (no shell starts it); give the full path"
    path = Path(exe) if os.path.isabs(exe) else root / exe
    if shutil.which(str(path)):
        return None
    # A path given is looked for there alone: "not on PATH" sent a person to fix PATH for
    # a script that was there but not executable (the worker's launch said "Permission
    # denied"), or for a path to nothing.
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except PermissionError as exc:
        # A folder on the way this user may not search: is_dir raised, and doctor ended
        # there with a line about the state folder and the KB.
        return f"{exe}: a folder of its path may not be searched by this user ({exc.strerror})"
    except OSError as exc:  # a loop of links, a name too long
        return f"{exe}: {exc.strerror or exc}"
    if mode is not None and stat.S_ISDIR(mode):
        return f"{exe} is a folder, not a program"
    if mode is not None:
        return f"{exe} is not executable (chmod +x {path})"
    if os.path.isabs(exe):
        return f"{exe}: no such file"
    return f"{exe} is no program under the KB root (agents start there)"


def _doctor_reviewers(ws: Workspace, report, remote: bool = False) -> None:
    """Each reviewer's program is on PATH (an ``openai`` profile's endpoint answers), the
    key variable it names is set, and nothing the machine forces refuses its attempts.
    ``remote``: the control's doctor on a Redis queue, whose agents may all run on other
    machines (OPERATIONS §6.6): what this machine lacks is said as a warning, not a
    problem, or a control whose workers are elsewhere never passed its own health check
    (the endpoint reachable only from the workers' network, the CLI installed only there)."""
    from workers.openai_agent import shown as url_shown
    from workers.reviewers import Reviewer, UnsupportedKind, for_profile
    from workers.reviewers.openai import endpoint_problem, key_problem
    from workers.reviewers.vendor import versions_run

    if remote:
        said = report

        def report(ok: bool, text: str) -> None:
            if ok:
                said(ok, text)
            else:
                click.echo(f"warning: {text} ({ELSEWHERE})")

    adapters: dict[str, Reviewer | UnsupportedKind] = {}
    for name, profile in sorted(ws.settings.reviewers.items()):
        try:
            adapters[name] = for_profile(profile)
        except UnsupportedKind as exc:
            adapters[name] = exc
    runs = versions_run([a for a in adapters.values() if isinstance(a, Reviewer)], ws.root)
    for name, adapter in adapters.items():
        if isinstance(adapter, UnsupportedKind):
            report(False, str(adapter))
            continue
        profile = adapter.profile
        head = f"reviewer {name} ({profile.kind})"
        programs = (_program_problem(ws.root, exe) for exe in adapter.executables())
        if missing := [problem for problem in programs if problem is not None]:
            report(False, f"{head}: {', '.join(missing)}")
        elif adapter.known_versions is not None:
            _doctor_version(adapter, ws.root, runs, head, report)
        elif profile.kind != "openai":
            report(True, head)
        elif (problem := endpoint_problem(profile)) is not None:
            # Its program is this Python: what it needs is an endpoint that answers.
            report(False, f"{head}: {problem}")
        else:  # the URL without any user:password@ part
            report(True, f"{head}: base_url {shown(url_shown(profile.base_url))} answers")
        if (problem := key_problem(profile)) is not None:
            # A worker without it sent every request with no key: each attempt a
            # reviewer failure, and the profile paused for every worker.
            report(False, f"reviewer {name} ({profile.kind}): {problem}")
        # The job folders are below the state folder: what the machine forces there
        # (Codex's managed layers) refuses every attempt, said before the first one is.
        if (problem := adapter.machine_problem(ws.state_dir / "jobs")) is not None:
            report(False, f"{head}: {problem}")


def _doctor_version(adapter, root: Path, runs, head: str, report) -> None:
    """A vendor CLI's version against those reviewq has run (docs/OPERATIONS.md §1): an
    older one may refuse a flag every attempt passes, a newer one is said as a warning."""
    from workers.reviewers.vendor import version_said

    known, text = version_said(adapter, root, runs) or (True, "")
    if known is None:
        report(True, head)
        click.echo(f"warning: {head}: {shown(text)} (docs/OPERATIONS.md §1)")
    else:
        report(known, f"{head}: {shown(text)}" if text else head)


@cli.command("escalations")
@click.option("--json", "as_json", is_flag=True)
@click.option("--gate", default=None, callback=not_blank, help="Only the escalations of this gate.")
@click.pass_obj
@refuse_domain_errors
def escalations_cmd(ws: Workspace, as_json: bool, gate: str | None) -> None:
    """The human's queue: pairs rejected three times (or refuted by an audit), by note.

    \b
    Examples:
      reviewq escalations
      reviewq escalations --gate prose/unsupported-figures
    """
    from orchestrator.cycles.escalations import (
        by_note,
        changed_since_fail,
        escalation_lines,
        only_reject_check,
        open_escalations,
    )
    from orchestrator.state.status import agents_failed

    store = ws.read_store()
    items = [e for e in open_escalations(store) if gate is None or e.gate_id == gate]
    groups = by_note(items)
    why_only_reject = only_reject_check(ws)
    agents = agents_failed([asdict(e) for e in items], why_only_reject)
    only = {e.id: why_only_reject(e.note_path, e.gate_id) for e in items}
    changed = changed_since_fail(ws, store, [asdict(e) for e in items])
    if as_json:
        emit_json(
            {
                "escalations": [
                    {
                        **e.to_json(),
                        "report_path": root_rel(ws, ws.state_dir / e.report_path),
                        "only_reject": only[e.id],
                        "changed_since_fail": changed.get(e.id),
                    }
                    for e in items
                ],
                "notes": [
                    {"note_path": note, "escalation_ids": [e.id for e in group]}
                    for note, group in groups
                ],
                "agents_failed": agents,
            }
        )
        return
    for line in escalation_lines(ws, store, items, only, agents, gate, changed):
        click.echo(line)


def _decision(
    args: tuple[str, ...],
    note: str | None,
    feedback: str | None,
    fixer: str | None,
    gate: str | None = None,
    **_: object,
) -> tuple[list[int], str]:
    """decide's escalation ids and decision, read as its line is (:class:`Checked`): a
    call written wrongly is bad usage (exit 2), as click says of a bad option value, and
    said before the state folder is looked at; exit 1 is kept for a call refused (decided
    already, a note gone)."""
    *raw_ids, decision = args
    if decision not in ("approve", "redo", "reject"):
        raise click.BadParameter(
            f"{decision!r} is not approve, redo or reject", param_hint="DECISION"
        )
    ids = []
    for raw in raw_ids:
        # In the words `job`, `logs --job` and `report --run` use of their ids: escalation
        # 0 was "no escalation 0" (a refusal, exit 1) where job 0 is bad usage.
        try:
            ids.append(ESCALATION_ID.convert(raw, None, None))
        except click.BadParameter as exc:
            raise click.BadParameter(exc.message, param_hint="ESCALATION_ID") from None
    if not ids and not note and not gate:
        raise click.UsageError("name escalation ids, --note PATH or --gate GATE_ID")
    if fixer and decision != "redo":
        raise click.UsageError(f"--fixer names the fixer of a redo, not of {decision}")
    if feedback is not None and not feedback.strip():
        raise click.UsageError(
            "--feedback is empty: write the concrete asks for the fixer (after an agent's "
            "failure, a redo needs none: leave it out)"
        )
    if decision == "redo" and feedback and feedback.strip() in ("…", "..."):
        # The placeholder of the call an agent's failed line gives (E90), pasted as it is:
        # its fix jobs were queued with "…" as the person's asks.
        raise click.UsageError(
            f"--feedback {feedback.strip()!r} is the line's placeholder: write the concrete "
            "asks for the fixer in its place"
        )
    return ids, decision


@cli.command("decide", cls=Numbered, ids=ESCALATION_ID.what, check=_decision)
@click.argument("args", nargs=-1, required=True, metavar="[ESCALATION_ID]... DECISION")
@click.option(
    "--note", default=None, callback=not_blank, help="Every open escalation of this note."
)
@click.option(
    "--gate",
    default=None,
    callback=not_blank,
    help="Every open escalation of this gate (with --note: of that note).",
)
@click.option(
    "--feedback",
    default=None,
    callback=utf8,
    help="Concrete asks (required for redo; kept verbatim).",
)
@click.option(
    "--fixer",
    default=None,
    callback=not_blank,
    help="redo: the fixer profile [default: the escalation's].",
)
@click.pass_obj
@refuse_domain_errors
def decide_cmd(
    ws: Workspace,
    args: tuple[str, ...],
    note: str | None,
    gate: str | None,
    feedback: str | None,
    fixer: str | None,
) -> None:
    """Answer escalations at once: approve (accept as is), redo (one fix with your asks
    per note), reject. DECISION is approve, redo or reject.

    \b
    Examples:
      reviewq decide 3 redo --feedback "Say what 'OA' stands for in the first paragraph."
      reviewq decide --note kb/notes/city-honey.md approve
      reviewq decide 4 5 6 reject
      reviewq decide --gate prose/unsupported-figures approve
    """
    from orchestrator.control.followup import FollowUp
    from orchestrator.cycles.escalations import NeedsFeedback

    ids, decision = _decision(args, note, feedback, fixer, gate)
    try:
        escs, jobs, released = FollowUp(ws).decide(ids, note, decision, feedback, fixer, gate)
    except NeedsFeedback as exc:
        # As --fixer without redo: the call's own mistake, not a refusal of it (exit 2).
        raise click.UsageError(str(exc)) from None
    if decision == "redo":
        nudge_control(ws)
        from orchestrator.state.status import job as job_row

        for note_path, job_id in jobs.items():
            # Why, as select says it ("prose/x gate-changed"): "about its current text" was
            # said of a note nobody had edited, its gate changed since the FAIL.
            # Each once: the same gate released in two partitions was said twice.
            why = ", ".join(dict.fromkeys(released.get(note_path, [])))
            if not job_id:
                click.echo(
                    f"redo: no fix job queued ({note_path} has no FAIL on record about its "
                    f"current text and gates{': ' + why if why else ''}); released: the next "
                    "sweep reviews it again"
                    + (", and a fix that review starts carries your asks" if feedback else "")
                )
                continue
            # The job carries every current FAIL of the note, not only the decided ones.
            gates = [p["gate_id"] for p in job_row(ws.store, job_id, ws.settings)["pairs"]]
            click.echo(
                f"redo: fix job {job_id} queued for {note_path} ({len(gates)} gate(s): "
                f"{', '.join(gates)})"
                + (" with your asks" if feedback else "")
                # Decided with them by --note, a pair the fix does not carry was said of
                # nowhere: the next sweep reviews it.
                + (f"; released, for the next sweep to review again: {why}" if why else "")
            )
        if any(jobs.values()):
            say_if_no_control(ws, "the fix")
        return
    from orchestrator.cycles.escalations import changed_since_fail
    from orchestrator.state.status import HELD_AS_IT_IS

    changed = changed_since_fail(ws, ws.store, escs) if decision == "reject" else {}
    for e in escs:
        if decision == "approve":
            click.echo(f"approved: {e['note_path']} {e['gate_id']} (recorded as a human review)")
        else:
            replaced = (
                " (recorded as your FAIL in place of the refuted PASS)" if e["recorded"] else ""
            )
            # "until the note … changes" of a note the person had just mended.
            held = (
                f"; changed since its FAIL ({changed[e['id']]}): {HELD_AS_IT_IS}"
                if e["id"] in changed
                else ""
            )
            click.echo(
                f"rejected: {e['note_path']} {e['gate_id']} is not reviewed again until the "
                f"note or gate changes{replaced}{held}"
            )
