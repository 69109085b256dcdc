"""Which part of the record a report covers: a time window, or one sweep run."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from orchestrator.state.store import Store, parse_timestamp, timestamp, utcnow
from orchestrator.state.when import MomentError, moment

DEFAULT_WINDOW = timedelta(hours=24)


class ReportError(ValueError):
    """A report that cannot be made; the message names the argument and the reason."""


@dataclass(frozen=True)
class Period:
    since: str  # ISO UTC, inclusive
    until: str  # ISO UTC, exclusive
    label: str  # for people: "since the last report", "sweep nightly (run 4)"
    run_id: int | None = None  # a sweep run: jobs are the run's, whatever their time

    def to_json(self) -> dict:
        return {"since": self.since, "until": self.until, "label": self.label, "run": self.run_id}


def period_clash(since: str | None, sweep: str | None, run: int | None) -> str | None:
    """What is wrong with naming more than one period at once, or None."""
    chosen = [n for n, v in (("--since", since), ("--sweep", sweep), ("--run", run)) if v]
    return f"{' and '.join(chosen)}: choose one period" if len(chosen) > 1 else None


def resolve(
    store: Store,
    *,
    since: str | None = None,
    sweep: str | None = None,
    run: int | None = None,
    now: str | None = None,
) -> Period:
    """``--since`` (a duration back from now, a date/time, or a time of day on the local
    clock), ``--sweep NAME`` (its last run), ``--run ID``; with none of them, since the
    last report (else the last 24 h)."""
    if (clash := period_clash(since, sweep, run)) is not None:
        raise ReportError(clash)
    until = now or utcnow()
    end = parse_timestamp(until)
    if since:
        try:
            at, said = moment(since, "--since", end)
        except MomentError as exc:
            raise ReportError(str(exc)) from None
        begin = timestamp(at)
        if said is None:
            return Period(begin, until, f"the last {since.strip()}")
        if begin >= until:
            raise ReportError(f"--since {since!r}: after now ({until[:16]}Z); nothing to report")
        return Period(begin, until, f"since {said}")
    if sweep or run is not None:
        if run is not None:
            row = store.conn.execute(
                "SELECT id, name, started_at FROM sweep_runs WHERE id = ?", (run,)
            ).fetchone()
            if row is None:
                raise ReportError(f"--run {run}: no such sweep run ({_why_no_run(store, run)})")
        else:
            row = store.conn.execute(
                "SELECT id, name, started_at FROM sweep_runs WHERE name = ? ORDER BY id DESC LIMIT 1",
                (sweep,),
            ).fetchone()
            if row is None:
                raise ReportError(f"--sweep {sweep!r}: no run of this sweep is recorded")
        return Period(row["started_at"], until, f"sweep {row['name']} (run {row['id']})", row["id"])
    last = store.conn.execute("SELECT until FROM report_runs ORDER BY id DESC LIMIT 1").fetchone()
    if last is not None and last[0] <= until:
        return Period(last[0], until, f"since the last report ({last[0][:16]}Z)")
    if last is not None:
        # The last report ended after now: this machine's clock went back since (it ran
        # ahead then: a boot before NTP, a date set by hand). From that end the window
        # was empty, and what was stamped between now and that end was in no report.
        # From the last end not after now: some of it may be shown twice, none lost.
        before = store.conn.execute(
            "SELECT MAX(until) FROM report_runs WHERE until <= ?", (until,)
        ).fetchone()[0] or timestamp(end - DEFAULT_WINDOW)
        return Period(
            before,
            until,
            f"since {before[:16]}Z (the last report ended at {last[0][:16]}Z, after now: "
            "this machine's clock went back since)",
        )
    return Period(timestamp(end - DEFAULT_WINDOW), until, "the last 24 h (no earlier report)")


def record(store: Store, period: Period, html_path: str | None) -> None:
    """Remember a report a person was shown: the next one starts where it ended."""
    with store.write():
        store.conn.execute(
            "INSERT INTO report_runs (since, until, html_path, made_at) VALUES (?, ?, ?, ?)",
            (period.since, period.until, html_path, utcnow()),
        )


def _why_no_run(store: Store, run: int) -> str:
    """Why sweep run ``run`` is not in state.db: past the last, it never was (told of the
    runs of nothing deleted, the person looked for one); else a cron run of nothing,
    kept only until the next run of its sweep."""
    last = store.conn.execute("SELECT max(id) FROM sweep_runs").fetchone()[0]
    if last is None or run > last:
        return f"the last is run {last}" if last else "no run is recorded"
    return "a cron run that enqueued nothing is kept only until its sweep's next run"
