"""The review commands of ``reviewq`` (CONTRACT §10): gates, select, create-jobs, finalize,
run-job, ack, warn-queue, export."""

from __future__ import annotations

import functools
import sys

import click

from orchestrator.cli.common import (
    JOB_ID,
    Checked,
    InputFile,
    Numbered,
    NumberWithin,
    Refused,
    WholeWithin,
    a_number,
    all_gates_alone,
    batch_size_needs_gate_grouping,
    cli,
    emit_json,
    not_blank,
    one_line,
    open_log,
    refuse_domain_errors,
    require_state,
    show_followed,
    shown,
    warn,
)
from orchestrator.config import GROUPINGS
from orchestrator.control.followup import finalize_by_hand
from orchestrator.cycles import escalations as cycles
from orchestrator.kb.gates import gate_warnings
from orchestrator.kb.notes import GATES_DIR, excluded_words
from orchestrator.review.acceptance import ack, warn_queue
from orchestrator.review.bundle import condensed, problem_count
from orchestrator.review.export import EXPORT_DIR, EXPORT_WAIT, export, watches_now
from orchestrator.review.finalize import (
    Provenance,
    manual_output,
    notes_changed,
    notes_gone,
    parse_telemetry,
)
from orchestrator.review.jobs import create_jobs, display_path, parse_select_json, reviewer_for
from orchestrator.review.selector import (
    current_notes,
    partition_problem,
    require_note_roots,
    select,
    with_note_relative_types,
)
from orchestrator.state.status import new_job_words
from orchestrator.state.words import outcome_words, reason_words
from orchestrator.state.workspace import Workspace


@cli.command()
@click.option(
    "--check", is_flag=True, help="Validate every gate; exit 1 if any is invalid or there is none."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
@refuse_domain_errors
def gates(ws: Workspace, check: bool, as_json: bool) -> None:
    """The gate catalog: every gate by lens, and the invalid ones with their reasons.

    \b
    Example:
      reviewq gates --check
    """
    # The type specs notes name by a path are reviewed as type/NAME: listed here too.
    cat = with_note_relative_types(ws.kb, ws.catalog(), ws.state_dir)
    if as_json:
        emit_json(cat.to_json())
    else:
        for lens in cat.lenses:
            click.echo(f"{lens}:")
            for g in sorted(cat.gates.values(), key=lambda g: g.gate_id):
                if g.lens == lens:
                    watches = ",".join(g.watches)
                    click.echo(f"  {g.gate_id:<40} watches {watches:<28} {g.staleness_text}")
        if cat.types:
            click.echo("type: " + " ".join(sorted(g.gate_id for g in cat.types.values())))
        click.echo(
            f"{len(cat.gates)} gates in {len(cat.lenses)} lenses, {len(cat.problems)} invalid"
        )
    # A requires_type naming no spec, a lens folder with no gate: said, not failed (no
    # gate is invalid).
    said = gate_warnings(ws.kb, cat)
    if check:
        warn(said, every=True)
        for p in cat.problems:
            click.echo(f"invalid: {p.path}: {p.reason}", err=True)
        if cat.problems:
            raise Refused(f"{len(cat.problems)} invalid gate(s)")
        if not cat.gates and not cat.types:  # a misnamed folder: doctor refuses it too
            raise Refused(f"no gate in {GATES_DIR} and no type spec: nothing would be reviewed")
    else:
        warn([*cat.problems, *said], every=True)


@cli.command("select", cls=Checked, check=all_gates_alone)
@click.argument("selectors", nargs=-1)
@click.option("--all-gates", is_flag=True, help="Every catalog gate (type pairs stay opt-in).")
@click.option(
    "--note",
    "notes",
    multiple=True,
    callback=not_blank,
    help="Only these note files or folders.",
)
@click.option("--current", is_flag=True, help="Only notes with status: current.")
@click.option(
    "--model", default=None, callback=not_blank, help="The model partition to judge freshness in."
)
@click.option(
    "--reason",
    "reasons",
    multiple=True,
    type=click.Choice(["missing-review", "gate-changed", "note-changed"]),
    help="Only pairs stale for this reason.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (docs/CONTRACT.md §10)."
)
@click.pass_obj
@refuse_domain_errors
def select_cmd(
    ws: Workspace,
    selectors: tuple[str, ...],
    all_gates: bool,
    notes: tuple[str, ...],
    current: bool,
    model: str | None,
    reasons: tuple[str, ...],
    as_json: bool,
) -> None:
    """Stale (note, gate) pairs and why: SEL is a bundle, gate id, 'type' or 'type/NAME'.

    \b
    Example:
      reviewq select prose frontmatter/title-body-alignment --model offline --json
    """
    note_paths = ws.kb.note_selection(notes) if notes else None
    store = ws.read_store(empty_if_new=True)
    result = select(
        ws.kb,
        ws.catalog(),
        store,
        selectors=selectors,
        all_gates=all_gates,
        note_paths=note_paths,
        current=current,
        model=model,
        reasons=reasons or None,
        diffs=as_json,
        cache_dir=ws.state_dir,
        memo=as_json,
    )
    warn(result.problems)
    for hint in result.hints:
        click.echo(f"warning: {hint}", err=True)
    if result.excluded:
        click.echo(excluded_words(result.excluded), err=True)
    if model is not None and (problem := partition_problem(store, model)):
        click.echo(f"warning: {problem}", err=True)
    if as_json:
        if result.json_bytes is not None:
            out = sys.stdout  # named here: a write that fails is said as stdout's (cli.main)
            out.flush()
            out.buffer.write(result.json_bytes + b"\n")
        else:
            emit_json(result.to_json())
        return
    for t in result.targets:
        extra = ""
        if t.changed_regions:
            extra = " (" + ",".join(t.changed_regions)
            extra += f"; ratio {t.change_ratio:.2f})" if t.change_ratio is not None else ")"
        click.echo(f"{t.reason:<15} {t.note_path}  {t.gate_id}{extra}")
    counts = result.counts_json()
    click.echo(", ".join(f"{k}: {v}" for k, v in counts.items()))


@cli.command("create-jobs")
@click.option(
    "--input",
    "input_file",
    required=True,
    type=InputFile("r", encoding="utf-8"),
    help="select --json output, or - for stdin.",
)
@click.option(
    "--grouping",
    type=click.Choice(GROUPINGS),
    required=True,
    help="note: one job per (note, lens); gate: one job per gate and batch of notes.",
)
@click.option(
    "--batch-size",
    default=5,
    show_default=True,
    type=WholeWithin(min=1),
    help="Notes per job with --grouping gate.",
)
@click.option(
    "--model", default=None, callback=not_blank, help="The model partition [default: the input's]."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (docs/CONTRACT.md §10)."
)
@click.pass_obj
@refuse_domain_errors
def create_jobs_cmd(
    ws: Workspace, input_file, grouping: str, batch_size: int, model: str | None, as_json: bool
) -> None:
    """Queued review jobs from select's JSON: a folder per job with prompt.md and MANIFEST.json.

    \b
    Example:
      reviewq select prose --model offline --json | reviewq create-jobs --input - --grouping note
    """
    batch_size_needs_gate_grouping(grouping)
    try:
        text = input_file.read()
    except UnicodeDecodeError as exc:
        raise Refused(
            f"--input {shown(input_file.name)}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    partition, targets = parse_select_json(text)
    batch = create_jobs(
        ws.kb,
        ws.catalog(),
        ws.store,
        ws.state_dir,
        targets,
        model_partition=model or partition or "",
        grouping=grouping,
        batch_size=batch_size,
    )
    if as_json:
        emit_json(batch.to_json())
    else:
        for job in batch.jobs:
            click.echo(
                f"job {job.review_job_id}: {len(job.pairs)} pair(s)  prompt {job.prompt_path}  output {job.bundle_output_path}"
            )
        click.echo(f"{len(batch.jobs):,} job(s) created, {len(batch.skipped):,} pair(s) skipped")
    for s in batch.skipped:
        click.echo(f"skipped: {shown(s.note_path)} {shown(s.gate_id)}: {shown(s.why)}", err=True)


def _effort_with_model(model: str | None, effort: str | None, **_: object) -> None:
    if effort and not model:
        # The call's own mistake, as decide's redo without --feedback: bad usage (exit 2).
        raise click.UsageError("--effort needs --model (the model that reviewed)")


@cli.command("finalize", cls=Checked, check=_effort_with_model)
@click.option(
    "--review-job-id",
    "job_id",
    required=True,
    type=JOB_ID,
    help="The job whose bundle-output.md to accept.",
)
@click.option(
    "--runner", default=None, callback=one_line, help="Who produced the output (recorded)."
)
@click.option(
    "--model",
    default=None,
    callback=not_blank,
    help="The model that reviewed; must match the job's partition.",
)
@click.option("--effort", default=None, help="The reasoning effort (needs --model).")
@click.option(
    "--telemetry-json",
    "telemetry",
    default=None,
    help="Harness telemetry: JSON text or a JSON file.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (docs/CONTRACT.md §10)."
)
@click.pass_obj
@refuse_domain_errors
def finalize_cmd(
    ws: Workspace, job_id: int, runner, model, effort, telemetry, as_json: bool
) -> None:
    """Accept a job's bundle-output.md all-or-nothing; a bad output fails the job with every reason.

    \b
    Example:
      reviewq finalize --review-job-id 3 --runner claude-code --model offline
    """
    prov = Provenance(
        runner=runner, model=model, effort=effort, telemetry=parse_telemetry(telemetry)
    )
    output = manual_output(ws.store, ws.state_dir, job_id, prov, ws.settings.max_output_bytes)
    result, followed = finalize_by_hand(ws, job_id, output, prov)
    if as_json:
        emit_json(result.to_json())
    elif result.ok:
        for p in result.pairs:
            click.echo(f"{p['decision']:<5} {p['note_path']}  {p['gate_id']}")
        click.echo(f"job {job_id} completed")
    if result.ok:
        warn_notes_since(ws, job_id, result.pairs)
    show_followed(ws, followed, err=as_json)
    if not result.ok:
        for r in condensed(result.failure_reasons):  # as run-job and the control say them
            click.echo(f"reason: {r}", err=True)
        again = new_job_words(ws.store, job_id)
        raise Refused(
            f"job {job_id} failed: {problem_count(result.failure_reasons)} problem(s) in its "
            "output; nothing accepted" + (f"; {again}" if again else "")
        )


def warn_notes_since(ws: Workspace, job_id: int, pairs: list[dict]) -> None:
    """One line per note of a finalized job that is no longer the one it read: its verdicts
    printed as any other's read as a review of the note in front of the person, which
    (renamed) is unreviewed at its new path, (deleted) has none to review, and (edited)
    was judged on its older text."""
    for note_path, (n, outside) in notes_gone(ws.kb, pairs).items():
        its = "its verdicts are" if n > 1 else "its verdict is"
        # A link put on the note is there to see: "renamed or deleted" sent the person
        # looking for a rename that never happened.
        click.echo(
            (
                f"warning: {note_path} {outside} since job {job_id} "
                f"was made: {its} recorded under that path, for no note of the "
                "KB; no sweep reviews a note outside the KB"
                if outside
                else f"warning: {note_path} is no longer there (renamed or deleted since job "
                f"{job_id} was made): {its} recorded under that path, for no note of the KB; "
                "a note renamed is missing-review at its new path"
            ),
            err=True,
        )
    for note_path, (n, too_large) in notes_changed(ws.store, ws.kb, job_id).items():
        its = "its verdicts are" if n > 1 else "its verdict is"
        then = (
            f"it is now {too_large}, and no sweep reviews it"
            if too_large
            else "`reviewq select` lists the pair again where a gate watches what changed"
        )
        click.echo(
            f"warning: {note_path} changed since job {job_id} read it: {its} of the text "
            f"the job read, not of the note as it is now ({then})",
            err=True,
        )


@cli.command("run-job", cls=Numbered, ids=JOB_ID.what)
@click.argument("job_id", type=JOB_ID)
@click.option(
    "--reviewer",
    default=None,
    callback=not_blank,
    help="The reviewer profile [default: the job's, else the one of its partition].",
)
@click.pass_obj
@refuse_domain_errors
def run_job_cmd(ws: Workspace, job_id: int, reviewer: str | None) -> None:
    """Run one job's agent in the foreground (own process group, deadline), then finalize it.

    \b
    Example:
      reviewq run-job 3 --reviewer offline
    """
    from workers.foreground import run_job

    name = reviewer or reviewer_for(ws.store, ws.settings, job_id)
    res = run_job(ws, job_id, name)
    out = res.outcome
    # In words, as `job N` and the sweep say it ("the agent did not start"); a program
    # that never ran has no exit code ("exit None" was Python's word for it).
    first = out.reasons[0] if out.reasons else None
    said = "output" if out.classification == "output" else outcome_words(out.classification, first)
    ran = "" if out.exit_code is None else f"exit {out.exit_code}, "
    click.echo(f"job {job_id} attempt {out.attempt}: {said} ({ran}{out.duration_s:.1f} s)")
    if res.finalized is not None and res.finalized.ok:
        for p in res.finalized.pairs:
            click.echo(f"{p['decision']:<5} {p['note_path']}  {p['gate_id']}")
        click.echo(f"job {job_id} completed")
        warn_notes_since(ws, job_id, res.finalized.pairs)
        show_followed(ws, res.followed)
        return
    if res.job_status in ("completed", "failed", "split"):
        raise Refused(
            f"job {job_id} is {res.job_status}: it was decided while attempt {out.attempt} ran "
            f"(reviewq job {job_id} shows it); this attempt's output was not used"
        )
    if res.job_status == "queued":
        raise Refused(
            f"job {job_id} is queued again: attempt {out.attempt} was taken back while it ran "
            f"(reviewq job {job_id} shows it); this attempt's output was not used"
        )
    reasons = res.finalized.failure_reasons if res.finalized is not None else out.reasons
    for r in condensed(reasons):  # several missing pairs in one line, as the control says them
        click.echo(f"reason: {reason_words(r)}", err=True)
    show_followed(ws, res.followed, err=True)  # a failed fix's FAILs, gone to a person
    state = {
        "launch-failure": f"queued again ({outcome_words(out.classification, first)})",
        "reviewer-failure": f"queued again ({outcome_words(out.classification, first)}; "
        "not the job's fault)",
    }.get(out.classification, "failed")
    if res.paused_until:  # the control (and the next run-job's person) should know
        state += (
            f"; reviewer {name} paused until {res.paused_until} (reviewq resume {name} lifts it)"
        )
    if res.finalized is not None and res.finalized.status == "superseded":
        state = f"runs on in another attempt (reviewq job {job_id} shows it)"
    elif res.finalized is not None and res.finalized.status == "split":
        state = "split; its one-pair jobs are queued (reviewq jobs --state queued)"
    again = new_job_words(ws.store, job_id) if state == "failed" else None
    raise Refused(f"job {job_id} {state}" + (f"; {again}" if again else ""))


@cli.command("ack")
@click.option(
    "--model",
    required=True,
    callback=not_blank,
    help="The model partition whose review is carried forward.",
)
@click.argument("note")
@click.argument("gate_ids", nargs=-1, required=True)
@click.pass_obj
@refuse_domain_errors
def ack_cmd(ws: Workspace, model: str, note: str, gate_ids: tuple[str, ...]) -> None:
    """Carry completed reviews forward to the note's current text (all or nothing).

    \b
    Example:
      reviewq ack --model offline kb/notes/brood.md prose/unscoped-advice
    """
    note_path = ws.kb.rel(note)
    require_state(ws)
    open_log(ws)
    acked = ack(ws.kb, ws.catalog(), ws.store, model, note_path, gate_ids, within=cycles.record_ack)
    for a in acked:
        click.echo(f"acked: {a.note_path} {a.gate_id}")


@cli.command("warn-queue")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
@refuse_domain_errors
def warn_queue_cmd(ws: Workspace, as_json: bool) -> None:
    """The latest WARN finding per (note, gate) across partitions, skipping changed gates.

    \b
    Example:
      reviewq warn-queue --json
    """
    require_note_roots(ws.kb)
    notes = current_notes(ws.kb, ws.state_dir)
    catalog = ws.catalog()
    # A gate invalid now (a typo while editing it) hides its findings: said, not silent.
    warn(catalog.problems, every=True)
    items = warn_queue(ws.kb, ws.read_store(), catalog, notes)
    if as_json:
        emit_json({"warnings": [i.to_json() for i in items]})
        return
    for i in items:
        click.echo(f"{i.note_path}  {i.gate_id}  ({i.model_partition}, job {i.review_job_id})")
        for line in i.rationale.strip().splitlines():
            click.echo(f"    {line}")
    click.echo(f"{len(items)} warning(s)")


@cli.command("export")
@click.option(
    "--model",
    default=None,
    callback=not_blank,
    help="Only this partition [default: the latest across partitions].",
)
@click.option(
    "--wait",
    type=NumberWithin(min=0, max=86400),
    callback=a_number,
    default=EXPORT_WAIT,
    show_default=True,
    help="Seconds to wait for another export writing the folder; then exit 1.",
)
@click.pass_obj
@refuse_domain_errors
def export_cmd(ws: Workspace, model: str | None, wait: float) -> None:
    """Write the file view of reviews: GATE-REVIEW files and gate_reviews.csv under kb/reports/reviews.

    \b
    Example:
      reviewq export --model offline
    """

    def waiting() -> None:
        click.echo(
            f"another reviewq export is writing {EXPORT_DIR}: waiting for it to end "
            f"(at most {wait:g} s)",
            err=True,
        )

    require_note_roots(ws.kb)  # before the folder is made: a --root one level off
    # Read once the export holds its lock: the KB as it is then. An invalid gate's files
    # are removed as those of a gate no longer reviewed (CONTRACT §10): its file named.
    watches = functools.partial(watches_now, ws, on_problems=functools.partial(warn, every=True))
    res = export(ws.read_store(), ws.root, model, watches, on_wait=waiting, wait=wait)
    click.echo(f"exported {res.files} review(s); index {display_path(ws.root, res.csv_path)}")
