"""``reviewq report``: the morning report. Registered on the group in :mod:`orchestrator.cli`."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from orchestrator.cli.common import (
    RUN_ID,
    BadValue,
    Checked,
    Moment,
    Refused,
    cli,
    emit_json,
    not_blank,
    refuse_domain_errors,
    root_reports,
)
from orchestrator.cycles.escalations import changed_since_fail, only_reject_check
from orchestrator.kb.notes import GATES_DIR, TYPES_DIR
from orchestrator.state.workspace import Workspace


def _one_period(since: str | None, sweep: str | None, run_id: int | None, **_: object) -> None:
    from orchestrator.report.period import period_clash  # a report's import only

    if (clash := period_clash(since, sweep, run_id)) is not None:
        raise BadValue(clash)


@cli.command("report", cls=Checked, check=_one_period)
@click.option(
    "--since",
    type=Moment(),
    default=None,
    callback=not_blank,
    help="A duration back from now (24h, 90m), a date/time (2026-11-22T08:00) or a time of "
    "day (08:00: the last time this machine's clock read it).",
)
@click.option("--sweep", default=None, callback=not_blank, help="The last run of this sweep.")
@click.option("--run", "run_id", type=RUN_ID, default=None, help="One sweep run.")
@click.option(
    "--html",
    "html",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the page here [default: STATE/report.html].",
)
@click.option("--json", "as_json", is_flag=True, help="The data as JSON (writes no page).")
@click.option("--full", is_flag=True, help="Every item, not the worst 50 of each list.")
@click.pass_obj
@refuse_domain_errors
def report_cmd(
    ws: Workspace,
    since: str | None,
    sweep: str | None,
    run_id: int | None,
    html: str | None,
    as_json: bool,
    full: bool,
) -> None:
    """What happened overnight: what needs you, what changed in the KB, what was reviewed
    and what it cost. Without a period: since the last report (else the last 24 h).

    \b
    Examples:
      reviewq report
      reviewq report --since 24h --html ~/night.html
      reviewq report --sweep nightly --json
    """
    from orchestrator.report import ReportError, make_report
    from orchestrator.sweeps.producer import sweeps_not_run

    try:
        page = _page(ws, html, as_json)
    except OSError as exc:  # a name too long for the file system: an internal error before
        raise Refused(f"--html {html}: {exc.strerror or exc}") from None
    # A state folder never used is refused: a mistyped --state reported "nothing".
    store = ws.read_store()
    try:
        rep = make_report(
            store,
            ws.state_dir,
            since=since,
            sweep=sweep,
            run=run_id,
            html_path=page,
            full=full,
            # A script's --json does not move "since the last report" under a person's feet.
            remember=not as_json,
            only_reject=only_reject_check(ws),
            changed_since=functools.partial(changed_since_fail, ws, store),
            not_run=functools.partial(sweeps_not_run, settings=ws.settings),
            settings=ws.settings,
            page_given=html is not None,
        )
    except ReportError as exc:
        raise Refused(str(exc)) from None
    if as_json:
        needs_you = rep.data["needs_you"]
        notes = [
            {**n, "escalations": root_reports(ws, n["escalations"])}
            for n in needs_you["escalations"]
        ]
        emit_json(
            {
                **rep.data,
                "needs_you": {**needs_you, "escalations": notes},
                "html_path": str(page) if page else None,
            }
        )
    else:
        click.echo(rep.text(), nl=False)


def _page(ws: Workspace, html: str | None, as_json: bool) -> Path | None:
    """The page to write: --html's file, checked, or STATE/report.html (none with --json)."""
    if html is not None and Path(html).is_dir():
        raise Refused(f"--html {html}: is a folder; name the file to write")
    page = Path(html).resolve() if html else (None if as_json else ws.state_dir / "report.html")
    if html is not None and page is not None:
        # A mistyped folder was made, and a page inside the KB was read as a note.
        if not page.parent.is_dir():
            raise Refused(f"--html {html}: no folder {page.parent}; name a file in one that exists")
        for rel in (*ws.settings.note_roots, GATES_DIR, TYPES_DIR):
            read = (ws.root / rel).resolve()
            if page.is_relative_to(read):
                raise Refused(f"--html {html}: inside {read}, where sweeps read notes and gates")
    return page
