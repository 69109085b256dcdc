"""The morning report (issue 13): what a night of sweeps did, for a person with a coffee.

Data gathering reads state.db (:mod:`.data`); rendering is Jinja2 templates and pygal
charts (:mod:`.render`). It reads the state and KB layers only, never the queue, so it
can run while the control process works.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.kb.atomicfile import atomic_write
from orchestrator.report import data as _data
from orchestrator.report import period as _period
from orchestrator.report import render
from orchestrator.report.period import Period, ReportError
from orchestrator.state.store import Store, utcnow

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
) -> Report:
    """Gather the period's data and, with ``html_path``, write the page. ``remember``
    records a report of the default period so the next one starts where it ends."""
    now = now or utcnow()
    period = _period.resolve(store, since=since, sweep=sweep, run=run, now=now)
    data = _data.gather(store, state_dir, period, limit=None if full else limit, now=now)
    if html_path is not None:
        # The page renders rows already committed. It is written before the report is
        # remembered: a page that could not be written was shown to nobody, so the next
        # report must still cover its period.
        page = render.html(data)
        try:
            atomic_write(html_path, page, mode=0o644)
        except OSError as exc:
            raise ReportError(f"--html {html_path}: cannot write ({exc.strerror or exc})") from None
    if remember and not (since or sweep or run is not None):
        # Only a report of the default period moves "since the last report": a look at
        # the last two hours or one run would leave the rest of the night in no report.
        _period.record(store, period, str(html_path) if html_path else None)
    return Report(data, html_path)
