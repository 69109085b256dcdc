"""The morning report (issue 13): what a night of sweeps did, for a person with a coffee.

Data gathering reads state.db (:mod:`.data`); rendering is Jinja2 templates and pygal
charts (:mod:`.render`). It reads the state and KB layers only, never the queue, so it
can run while the control process works.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import Settings
from orchestrator.kb.atomicfile import atomic_write
from orchestrator.regularfile import SYMLINK, NotRegular, open_regular
from orchestrator.report import data as _data
from orchestrator.report import period as _period
from orchestrator.report import render
from orchestrator.report.period import Period, ReportError
from orchestrator.state.store import Store

__all__ = ["Period", "Report", "ReportError", "make_report"]


@dataclass(frozen=True)
class Report:
    data: dict
    html_path: Path | None

    def text(self) -> str:
        return render.text(self.data, str(self.html_path) if self.html_path else None)


def make_report(
    store: Store,
    state_dir: Path,
    *,
    since: str | None = None,
    sweep: str | None = None,
    run: int | None = None,
    html_path: Path | None = None,
    full: bool = False,
    remember: bool = True,
    limit: int = 50,
    now: str | None = None,
    only_reject: _data.OnlyReject | None = None,
    not_run: Callable[[Store], list[dict]] | None = None,
    settings: Settings | None = None,
    page_given: bool = True,
    changed_since: _data.ChangedSince | None = None,
) -> Report:
    """Gather the period's data and, with ``html_path``, write the page. ``remember``
    records a report of the default period so the next one starts where it ends;
    ``only_reject`` tells which escalations can now only be rejected (``changed_since``,
    which changed since their FAIL); ``not_run`` reads
    the cron sweeps whose last time ran nothing (it knows the settings); ``settings``
    names the ``[[sweeps]]`` entries whose next run takes over what a spent budget holds.
    ``page_given``: ``html_path`` is --html's, not the state folder's own page."""
    where = f"--html {html_path}" if page_given else str(html_path)
    if html_path is not None:
        _may_replace(html_path, where, page_given)
    # One snapshot, ending at a time no write in flight was stamped before: the sections
    # of a report made while the control process writes agree, and the next report
    # starts where this one ends with nothing between them.
    with store.settled_read(now) as now:
        period = _period.resolve(store, since=since, sweep=sweep, run=run, now=now)
        data = _data.gather(
            store,
            state_dir,
            period,
            limit=None if full else limit,
            now=now,
            only_reject=only_reject,
            not_run=not_run(store) if not_run is not None else [],
            settings=settings,
            changed_since=changed_since,
        )
    if html_path is not None:
        # The page renders rows already committed. It is written before the report is
        # remembered: a page that could not be written was shown to nobody, so the next
        # report must still cover its period.
        page = render.html(data)
        try:
            atomic_write(html_path, page, mode=0o644)
        except OSError as exc:
            raise ReportError(f"{where}: cannot write ({exc.strerror or exc})") from None
    if remember and not (since or sweep or run is not None):
        # Only a report of the default period moves "since the last report": a look at
        # the last two hours or one run would leave the rest of the night in no report.
        _period.record(store, period, str(html_path) if html_path else None)
    return Report(data, html_path)


# What every page reviewq wrote has in its head: the generator tag, or (pages written
# before it) the policy that forbids fetching anything.
_OURS = (b'<meta name="generator" content="reviewq">', b"default-src 'none'; style-src")


def _may_replace(path: Path, where: str, given: bool) -> None:
    """A page is written only where nothing is, or over an earlier page: ``--html`` naming
    state.db, a note or reviewq.toml replaced it with the page, without a word. The state
    folder's own page (not ``given``) is a rendering of state.db: a file there that is no
    page (emptied, NULs after a power loss) is written over, as OPERATIONS §7 says; it
    was refused at every report, for good. ``where`` names the path in a refusal."""
    try:
        fd = open_regular(path, follow=False)
    except NotRegular as exc:
        what = "is a symbolic link" if exc.kind == SYMLINK else "not a regular file"
        # Nobody named the state folder's page: what to do is to remove what is there.
        remedy = "name the file itself" if exc.kind == SYMLINK else "name the page's own file"
        remedy = remedy if given else "remove it, or give --html another file"
        raise ReportError(f"{where}: {what}; {remedy}") from None
    except OSError as exc:
        raise ReportError(f"{where}: cannot be replaced ({exc.strerror or exc})") from None
    if fd is None:
        return
    try:
        head = os.read(fd, 2048)
    finally:
        os.close(fd)
    if given and not any(mark in head for mark in _OURS):
        raise ReportError(
            f"{where}: exists and is not a reviewq report; nothing was written "
            "(remove it or name another file)"
        )
