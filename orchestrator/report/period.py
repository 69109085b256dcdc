"""Which part of the record a report covers: a time window, or one sweep run."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from orchestrator.config import ConfigError, parse_duration
from orchestrator.state.store import Store, parse_timestamp, timestamp, utcnow

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


_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")
# Ranges are checked after the match: "24:00" or "08:61" said "not a duration".
_TIME_OF_DAY = re.compile(r"(?P<hour>\d{1,2}):(?P<minute>\d{2})(?::(?P<second>\d{2}))?")
# What --since takes as a date/time: fromisoformat alone took any character between date and
# time, so "2026-11-22Z" was local midnight ("Z" read as the separator, "+00:00" as the time)
# and "2026-11-22+05:00" five in the morning on the local clock.
_DATE_TIME = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})(?P<time>[T ]\d{2}(?::?\d{2}(?::?\d{2}(?:\.\d+)?)?)?)?"
    r"(?P<offset>Z|[+-]\d{2}(?::?\d{2})?)?"
)


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
    chosen = [n for n, v in (("--since", since), ("--sweep", sweep), ("--run", run)) if v]
    if len(chosen) > 1:
        raise ReportError(f"{' and '.join(chosen)}: choose one period")
    until = now or utcnow()
    end = parse_timestamp(until)
    if since:
        if _DATE.match(since):
            try:
                start = _date_time(since)
            except (ValueError, OverflowError):
                raise ReportError(f"--since {since!r}: not a date or time") from None
            try:
                if start.tzinfo is None:
                    # A person's "08:00" or "2026-11-22" is on their clock, as cron times
                    # are: read as UTC it was hours off. The label says it in UTC. Its first
                    # reading: on a day whose midnight the clock skips, the window began an
                    # hour into the day before.
                    start = _read_on(start.date(), start.time())[0]
                begin = timestamp(start)
            except (ValueError, OverflowError):
                # A real date the clock cannot place (0001-01-01 on the local clock, or
                # past year 9999 in UTC): "not a date or time" sent a person looking for a typo.
                raise ReportError(
                    f"--since {since!r}: date out of range (too near the calendar's first "
                    "or last year to place in UTC)"
                ) from None
            if begin >= until:
                raise ReportError(
                    f"--since {since!r}: after now ({until[:16]}Z); nothing to report"
                )
            return Period(begin, until, f"since {begin[:16]}Z")
        if m := _TIME_OF_DAY.fullmatch(since.strip()):
            try:
                at = time(int(m["hour"]), int(m["minute"]), int(m["second"] or 0))
            except ValueError:
                raise ReportError(
                    f"--since {since!r}: not a time of day (00:00 to 23:59; midnight is 00:00)"
                ) from None
            start = _last_on_the_clock(at, end)
            begin = timestamp(start)
            # Said in the person's words too: "since 2026-11-21T13:00Z" left them to work
            # out that their 08:00 at seven in the morning was yesterday's.
            day = "today" if start.astimezone().date() == end.astimezone().date() else "yesterday"
            return Period(
                begin, until, f"since {since.strip()} {day} on this machine's clock ({begin[:16]}Z)"
            )
        if since.strip().isdigit():
            # Read as seconds, "20261122" (a date without its dashes) was 234 days back.
            raise ReportError(
                f"--since {since!r}: a duration needs its unit (30m, 12h, 7d), a date its "
                "dashes (2026-11-22)"
            )
        try:
            seconds = parse_duration(since, "--since", years=100)
        except ConfigError as exc:
            raise ReportError(str(exc)) from None
        return Period(
            timestamp(end - timedelta(seconds=seconds)), until, f"the last {since.strip()}"
        )
    if sweep or run is not None:
        if run is not None:
            row = store.conn.execute(
                "SELECT id, name, started_at FROM sweep_runs WHERE id = ?", (run,)
            ).fetchone()
            if row is None:
                raise ReportError(f"--run {run}: no such sweep run")
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


def _last_on_the_clock(at: time, end: datetime) -> datetime:
    """The last time before ``end`` the local clock read ``at``: a person's "08:00" is
    this morning's, or yesterday's when it is not yet eight. Days are counted on the
    clock, so a change to or from daylight time between keeps the hour."""
    today = end.astimezone().date()
    later = [t for t in _read_on(today, at) if t < end]
    return later[-1] if later else _read_on(today - timedelta(days=1), at)[-1]


def _read_on(day: date, at: time) -> list[datetime]:
    """When the local clock read ``at`` on ``day``, earliest first: twice in the hour
    repeated when daylight time ends (fold 0 alone was the first, not the last); in the
    hour skipped when it begins, the moment the clock jumped past it (fold 0 alone was up
    to an hour before the clock read it, or a day back)."""
    wall = datetime.combine(day, at)
    first = wall.astimezone()
    try:
        second = wall.replace(fold=1).astimezone()
    except (ValueError, OverflowError):  # looked for past the calendar's last day
        second = first
    both = sorted({first, second})
    if all(t.replace(tzinfo=None) == wall for t in both):
        return both  # it was read (twice in a fold)
    # Skipped: the first instant the clock read past it, found in whole seconds between
    # the two readings (an hour or so apart, so some twelve halvings).
    lo, hi = int(both[0].timestamp()), int(both[-1].timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid).replace(tzinfo=None) < wall:
            lo = mid
        else:
            hi = mid
    return [datetime.fromtimestamp(hi).astimezone()]


def _date_time(text: str) -> datetime:
    """A --since date or date and time, naive unless it carries an offset; a date with an
    offset is that day's midnight at the offset."""
    m = _DATE_TIME.fullmatch(text.strip())
    if m is None:
        raise ValueError(text)
    return parse_timestamp(m["date"] + (m["time"] or "T00:00") + (m["offset"] or ""))


def record(store: Store, period: Period, html_path: str | None) -> None:
    """Remember a report a person was shown: the next one starts where it ended."""
    with store.write():
        store.conn.execute(
            "INSERT INTO report_runs (since, until, html_path, made_at) VALUES (?, ?, ?, ?)",
            (period.since, period.until, html_path, utcnow()),
        )
