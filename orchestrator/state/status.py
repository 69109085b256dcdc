"""What the queue holds and what happened (CONTRACT §10 ``status``, ``jobs``, ``job``): read-only
queries over state.db for people and for the sweep's progress and summary."""

from __future__ import annotations

import base64
import json
import os
import shlex
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from orchestrator import logs
from orchestrator.config import GROUPINGS, Settings
from orchestrator.kb.atomicfile import atomic_write
from orchestrator.kb.notes import FileProblem, capped, excluded_words
from orchestrator.regularfile import NotRegular, open_regular
from orchestrator.state.files import NOT_TRIED
from orchestrator.state.store import (
    Store,
    control_pid,
    json_column,
    parse_timestamp,
    reasons_column,
    timestamp,
    utcnow,
)
from orchestrator.state.words import NOT_THE_JOBS, attempt_words, outcome_words, reason_words

if TYPE_CHECKING:
    from orchestrator.state.workspace import Workspace

STATUSES = ("queued", "running", "completed", "failed", "split")
# Attempts that count toward a job's limit: the agent ran and produced nothing usable.
# Launch failures, lost leases and interrupted runs are not the job's fault.
FAILED_OUTCOMES = ("invalid-output", "no-output", "reviewer-touched-kb", "burned-out")
# The same as an SQL list, for `outcome IN (...)`.
FAILED_SQL = ", ".join(f"'{o}'" for o in FAILED_OUTCOMES)
# An attempt opened (``attempt-N/``) that was no run of an agent on the job (CONTRACT §6): its
# program did not start, its CLI reached no model, or no worker launched it (lost or
# superseded before its launch). Infrastructure, not a verdict on the reviewer's work.
# The one definition of a run: the job's reasons ("3 attempt(s) failed") never count
# these, nor do `jobs` and the report; the reaper counts a lost attempt only once
# launched, as here.
NOT_RUN_SQL = (
    "(a.outcome IN ('launch-failure', 'reviewer-failure') OR (a.launched_at IS NULL "
    "AND a.outcome IN ('lost', 'superseded')))"
)
# A failed job ``j`` that was withdrawn, not one that failed: the re-review of a fix that
# was not written (a person's edit came first). It read the fixer's text, which never
# reached the KB; the next sweep reviews the person's, so nothing waits on anyone.
WITHDRAWN_SQL = (
    "EXISTS (SELECT 1 FROM review_jobs f WHERE f.id = j.source_job_id AND f.kind = 'fix' "
    "AND f.result = 'not-applied')"
)
# One still waiting for a worker to launch it: neither a run nor one that failed to be.
# Counted as not run, `jobs` showed every job of a sweep in progress "(+1 not run)".
WAITING_SQL = "(a.launched_at IS NULL AND a.outcome = 'dispatched')"
# The attempts_open index's own term, word for word: SQLite reads a partial index only
# for a query that has it, not for one whose terms imply it (outcome = 'running').
OPEN_SQL = "outcome IN ('dispatched', 'running')"


class NotFound(ValueError):
    pass


def _table_exists(store: Store, name: str) -> bool:
    return (
        store.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)
        ).fetchone()
        is not None
    )


class Pause(NamedTuple):
    until: str
    reason: str | None  # what kind of failure paused it (None: paused before schema 7)
    since: str | None = None  # when it was paused (None: paused before schema 20)


def paused_reviewers(store: Store, now: str) -> dict[str, Pause]:
    """Reviewer profiles paused at ``now`` (after failures in a row), by name."""
    return {
        name: Pause(until, reason, since)
        for name, until, reason, since in store.conn.execute(
            "SELECT name, paused_until, paused_reason, paused_at FROM reviewer_state "
            "WHERE paused_until > ?",
            (now,),
        )
    }


def pause_why(store: Store, name: str, pause: Pause) -> str:
    """Why the profile is paused: its recorded reason (the CLI's own words: a key, a
    quota, an endpoint, a missing program) or, for a pause from before reasons were kept,
    its last attempt's."""
    if pause.reason:
        return pause.reason
    last = store.conn.execute(
        "SELECT a.reasons FROM attempts a JOIN review_jobs j ON j.id = a.job_id WHERE j.reviewer = ? "
        "AND a.reasons IS NOT NULL AND a.reasons != '[]' ORDER BY a.id DESC LIMIT 1",
        (name,),
    ).fetchone()
    reasons = reasons_column(last[0]) if last else []
    return "its agent failed to start several times in a row" + (
        f"; last: {reasons[0]}" if reasons else ""
    )


def pause_words(store: Store, name: str, pause: Pause, waiting: int = 0) -> str:
    """A paused profile as every command, page and summary says it: since when, what ends
    it (its time, or `reviewq resume` once the cause is mended) and why, the reason last
    (the CLI's own words, of any length). Five wordings, one without the reason, others
    without the command, none with the start, told one pause five ways. ``waiting``: the
    queued jobs it holds, said first where a count is wanted (status, the report)."""
    who = (
        f"{waiting:,} job(s) wait for reviewer {name}, paused"
        if waiting
        else f"reviewer {name} is paused"
    )
    return (
        f"{who} {pause_span(pause)} (or until {resume_command(name)}, "
        f"once the cause is mended): {pause_said(store, name, pause)}"
    )


def pause_said(store: Store, name: str, pause: Pause) -> str:
    """:func:`pause_why` as a person reads it: the attempts' reasons after its first ": "
    in words ("the reviewer's endpoint could not be reached: …", not "unreachable: …");
    ``--json`` and the log keep them as stored."""
    head, sep, reasons = pause_why(store, name, pause).partition(": ")
    stored = reasons.split("; ")
    said = [reason_words(r) for r in stored]
    if sep and all(w != r for w, r in zip(said, stored, strict=True)):
        for generic in NOT_THE_JOBS.values():
            if head.startswith(generic):
                # Each reason's kind in words says whose failure it was: "its endpoint
                # failed in a way that is not the job's on vm: the reviewer's endpoint
                # could not be reached: …" said it twice. The host stays.
                host = head.removeprefix(generic).strip()
                return (f"{host}, " if host else "") + "; ".join(said)
    return head + sep + "; ".join(said)


def waiting_on(store: Store, names: Iterable[str], but_runs: Iterable[int] = ()) -> dict[str, int]:
    """The queued jobs of each of ``names`` (paused reviewers: the jobs they hold back);
    neither the report nor status counted them, so a night's backlog behind an outage
    read as one line about a profile. ``but_runs``: not those of these sweep runs (spent
    budgets, which hold them too)."""
    names = list(names)
    return dict.fromkeys(names, 0) | {
        name: n
        for name, n in store.conn.execute(
            "SELECT reviewer, count(*) FROM review_jobs WHERE status = 'queued' "
            "AND reviewer IN (SELECT value FROM json_each(?)) AND (sweep_run_id IS NULL "
            "OR sweep_run_id NOT IN (SELECT value FROM json_each(?))) GROUP BY reviewer",
            (json.dumps(names), json.dumps(sorted(but_runs))),
        )
    }


def pause_span(pause: Pause) -> str:
    """ "since START until END", UTC to the second (no start for a pause from before it
    was kept)."""
    since = f"since {_second(pause.since)} " if pause.since else ""
    return f"{since}until {_second(pause.until)}"


def resume_command(name: str) -> str:
    return f"reviewq resume {shlex.quote(name)}"


def _second(ts: str) -> str:
    """A stored time to the second, UTC: what a person reads of it."""
    return ts[:19] + "Z" if len(ts) > 19 else ts


# Why an open escalation can now only be rejected, given its note and gate, or None
# (``cycles.escalations.only_reject_check``: it reads the KB, which this module does not).
OnlyReject = Callable[[str, str], "str | None"]


def status(store: Store, settings: Settings, only_reject: OnlyReject | None = None) -> dict:
    counts = dict.fromkeys(STATUSES, 0)
    for s, n in store.conn.execute(
        "SELECT status, count(*) FROM review_jobs WHERE grouping != 'human' GROUP BY status"
    ):
        counts[s] = n
    now = utcnow()
    paused = paused_reviewers(store, now)
    waiting = waiting_on(store, paused)
    escalations = open_escalations(store)
    # Both from attempts_started: the day as a range of it, the total from its pages
    # alone (a tenth of the table's); one pass over the table read a year's attempts.
    today = now[:10]
    tomorrow = (date.fromisoformat(today) + timedelta(days=1)).isoformat()
    total = store.conn.execute("SELECT COALESCE(SUM(cost_usd), 0) FROM attempts").fetchone()[0]
    day = store.conn.execute(
        "SELECT COALESCE(SUM(cost_usd), 0) FROM attempts WHERE started_at >= ? AND started_at < ?",
        (today, tomorrow),
    ).fetchone()[0]
    # Made by `create-jobs`: no reviewer, so no control process dispatches them; one a
    # run-job has taken is running, and no more a control's than before.
    by_hand = store.conn.execute(
        "SELECT count(*) FROM review_jobs WHERE status IN ('queued', 'running') "
        "AND reviewer IS NULL AND grouping != 'human'"
    ).fetchone()[0]
    # A cron sweep has no summary to say it: its spent budget holds these until the next
    # run of the sweep takes them over, and no control started runs them before that.
    budgets = [
        {
            "sweep": b["name"],
            "sweep_run": b["id"],
            "budget_usd": b["budget_usd"],
            "jobs_waiting": b["jobs_waiting"],
            "says": b["says"],
        }
        for b in spent_budgets(store, over_budget_runs(store), settings)
    ]
    pid = control_pid(settings.state_dir)
    stale = [name for name in stale_now(settings.state_dir, pid) if name in settings.reviewers]
    waiting |= waiting_on(store, stale)
    return {
        "jobs": counts,
        "jobs_by_hand": by_hand,
        "budgets_spent": budgets,
        "escalations_open": len(escalations),
        "agents_failed": agents_failed(escalations, only_reject),
        "reviewers": {
            name: {
                "paused_until": pause.until if pause else None,
                "paused_reason": pause.reason if pause else None,
                "paused_since": pause.since if pause else None,
                "jobs_waiting": waiting.get(name, 0),
                # Added to reviewq.toml since the control started: it runs none of its
                # jobs until it is restarted.
                "awaits_control_restart": name in stale,
            }
            for name in sorted(settings.reviewers)
            for pause in [paused.get(name)]
        },
        "cost_usd": {"today": round(day, 6), "total": round(total, 6)},
        "fixes_unwritten": unwritten_fixes(store),
        "control": {
            "pid": pid,
            "shared": shared_now(settings.state_dir, pid),
            "zone": zone.name if (zone := control_zone(settings.state_dir, pid)) else None,
            "zone_said": zone_said(settings, zone),
            "queue_down": queue_down(logs.log_path(settings.state_dir), now) if pid else None,
        },
        "workers": {
            **workers_heard(store, control_runs=pid is not None),
            "refused": refused_lately(
                # The control's log, and a worker's beside it (STATE/worker/): one of an
                # earlier release refuses the review messages without telling the control.
                (logs.log_path(settings.state_dir), logs.log_path(settings.state_dir / "worker")),
                timestamp(parse_timestamp(now) - timedelta(seconds=REFUSALS_SINCE_S)),
            ),
        },
    }


# How much of a log's end is read for its last lines of an event (a log may hold months):
# `status`'s refusals, `doctor`'s worker.started. And how recent a refusal must be to be
# said: an upgrade's leftovers are refused in its first minutes.
TAIL_BYTES = 1024 * 1024
REFUSALS_SINCE_S = 600


def refused_lately(logs_: Iterable[Path], since: str) -> dict | None:
    """The last ``message.refused`` line the logs' ends hold since ``since``: a worker
    of another release still running (a rolling upgrade) has its heartbeats and outcomes
    refused and never in state.db, so it read as no worker at all, its agents as none
    running. ``at`` and ``said`` (``refusal_said``)."""
    lines = []
    for log in logs_:
        try:
            size = log.stat().st_size
        except OSError:
            continue
        line = last_refusal(log, max(0, size - TAIL_BYTES))
        if line is not None and str(line.get("timestamp") or "") >= since:
            lines.append(line)
    if not lines:
        return None
    line = max(lines, key=lambda x: str(x["timestamp"]))
    return {"at": str(line["timestamp"]), "said": refusal_said(line)}


# A control takes what waited on its queue as it starts: an outcome or heartbeat of an
# earlier version it refused within this long of its start was left there by the
# upgrade (a drained worker's last ones); a worker of that release still running is
# refused again at its next heartbeat (every lease/4), and said then, and one with no
# agent is said at once by its notice of refusing this release's review message.
LEFTOVERS_S = 30.0


def _left_by_an_upgrade(line: dict, started: str | None) -> bool:
    """A message of an earlier version that the upgrade left on a queue, refused with
    nothing to do: a review message a worker of this release refused (the control sends
    it again at once, E2), or what the control refused as it started (``started``: the
    time of the last ``control.started`` line before it)."""
    v, expected = line.get("version"), line.get("expected")
    if not (isinstance(v, int) and isinstance(expected, int) and v < expected):
        return False
    if line.get("message") == "review":
        return True
    if isinstance(line.get("refused_version"), int) and line["refused_version"] > v:
        return False  # its worker refused a message of a later release: it runs still
    try:
        after = parse_timestamp(str(line.get("timestamp"))) - parse_timestamp(str(started))
    except (ValueError, TypeError):  # no start in the log's end (started long before)
        return False
    return timedelta(0) <= after <= timedelta(seconds=LEFTOVERS_S)


def _tail_lines(log: Path, start: int, events: tuple[bytes, ...]) -> Iterator[dict]:
    """The lines of the log from byte ``start`` (from its beginning if it is shorter now:
    truncated since) whose event is one of ``events``, parsed as `reviewq logs` reads
    them. Raises OSError."""
    with open(log, "rb") as f:
        f.seek(start if f.seek(0, os.SEEK_END) >= start else 0)
        for raw in f:
            if not any(b'"%s"' % event in raw for event in events):
                continue
            # As `reviewq logs` reads it: a line cut short has the next one after it (O1).
            rec = logs.record(raw.decode("utf-8", "replace"))
            yield rec[0] if rec is not None else {}


def last_refusal(log: Path, start: int) -> dict | None:
    """The last ``message.refused`` line of the log from byte ``start`` that is not of
    what an upgrade left on a queue (``_left_by_an_upgrade``), or None."""
    found, started = None, None
    try:
        for line in _tail_lines(log, start, (b"message.refused", b"control.started")):
            if line.get("event") == "control.started":
                started = line.get("timestamp")
            elif line.get("event") == "message.refused" and not _left_by_an_upgrade(line, started):
                found = line
    except OSError:
        return None
    return found


def last_of(log: Path, events: tuple[bytes, ...]) -> dict | None:
    """The last line of the log's end (``TAIL_BYTES``) whose event is one of
    ``events``, or None (none there, or no log)."""
    found = None
    try:
        start = max(0, log.stat().st_size - TAIL_BYTES)
        for line in _tail_lines(log, start, events):
            found = line
    except OSError:
        return None
    return found


# While its queue is out of reach the control says so once a minute (its reads'
# `queue.unavailable`), and `queue.available` once it is back: a line older than this is
# one whose end went unsaid (a send that failed once), not an outage now.
QUEUE_DOWN_SAID_S = 90


def queue_down(log: Path, now: str) -> dict | None:
    """The control's last ``queue.unavailable`` when nothing since says the queue is back
    (nor a control started since) and it is recent enough to be an outage now, or None:
    state.db, all `status` reads otherwise, does not tell a Redis down."""
    line = last_of(log, (b"queue.unavailable", b"queue.available", b"control.started"))
    if not line or line.get("event") != "queue.unavailable" or not line.get("timestamp"):
        return None
    if _seconds(line["timestamp"], now) > QUEUE_DOWN_SAID_S:
        return None
    return {"at": line["timestamp"], "error": str(line.get("error", ""))}


def worker_of_host(store: Store, host: str, since: str) -> str | None:
    """A worker of ``host`` (its ``HOST:PID``) that took an attempt opened since ``since``,
    or None."""
    # The newest by its time, walked down attempts_started to the first of the host's: by
    # id, SQLite read and sorted every attempt since (a control up for a year: all of them).
    row = store.conn.execute(
        "SELECT worker FROM attempts WHERE started_at >= ? AND substr(worker, 1, ?) = ? "
        "ORDER BY started_at DESC LIMIT 1",
        (since, len(host) + 1, f"{host}:"),
    ).fetchone()
    return row[0] if row is not None else None


def _kept_by(path: Path, pid: int | None) -> dict | None:
    """The object a running control (``pid``) kept in ``path`` (STATE/run/), or None:
    no control, nothing there, or what the control never writes there. It writes a
    regular file (a rename over whatever was there): a FIFO held `status` until someone
    wrote to it, a link's target (another state folder's, /dev/zero) was read as its."""
    if not pid:
        return None
    try:
        fd = open_regular(path, follow=False)
    except (OSError, NotRegular):
        return None
    if fd is None:
        return None
    with open(fd, "rb") as f:
        raw = f.read(_KEPT_MAX + 1)
    try:
        kept = json.loads(raw) if len(raw) <= _KEPT_MAX else None
    except ValueError:
        return None
    return kept if isinstance(kept, dict) else None


# Larger, a kept file is not one a control wrote (a zone's rules are a few KB).
_KEPT_MAX = 1 << 22


# The running control's last ``queue.shared``, kept beside its lock: said once a run, in
# the log alone, it was gone from the log's end once logrotate emptied it (copytruncate)
# or a night's lines pushed it out, while the two controls went on sharing.
SHARED_FILE = Path("run") / "queue-shared.json"


def keep_shared(state_dir: Path, said: str | None, at: str = "") -> None:
    """Keep what this control process said of another feeding its Redis database (its
    ``queue.shared`` reason) at ``at``, for `status`; None: forget a previous run's (at
    start)."""
    path = state_dir / SHARED_FILE
    if said is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(mode=0o700, exist_ok=True)
    atomic_write(path, json.dumps({"pid": os.getpid(), "at": at, "said": said}) + "\n")


# The profiles the running control lacks and waits to be restarted for (its
# ``control.settings_stale``), kept beside its lock: said once in its log alone, `status`
# called such a profile active over its jobs, queued until someone restarted the control.
STALE_FILE = Path("run") / "settings-stale.json"


def keep_stale(state_dir: Path, reviewers: Iterable[str] | None, at: str = "") -> None:
    """Keep the profiles this control process waits to be restarted for, said first at
    ``at``, for `status`; None: forget a previous run's (at start)."""
    path = state_dir / STALE_FILE
    if reviewers is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(mode=0o700, exist_ok=True)
    kept = {"pid": os.getpid(), "at": at, "reviewers": sorted(reviewers)}
    atomic_write(path, json.dumps(kept) + "\n")


def stale_now(state_dir: Path, pid: int | None) -> list[str]:
    """The profiles the running control (``pid``) waits to be restarted for: none when
    none runs, or it has restarted since it said them."""
    if not pid:
        return []
    try:
        kept = json.loads((state_dir / STALE_FILE).read_bytes())
    except (OSError, ValueError):
        return []
    if not isinstance(kept, dict) or kept.get("pid") != pid:
        return []  # a previous run's, its control gone
    return [str(name) for name in kept.get("reviewers") or []]


def shared_now(state_dir: Path, pid: int | None) -> dict | None:
    """The running control's ``queue.shared`` (``pid``: the control that holds the state
    folder), ``at`` and ``said``, until it restarts; None when none runs or it said none."""
    kept = _kept_by(state_dir / SHARED_FILE, pid)
    if kept is None or kept.get("pid") != pid:
        return None  # a previous run's, its control gone
    return {"at": str(kept.get("at")), "said": str(kept.get("said") or "")}


# The zone the running control reads its cron times in, kept beside its lock: nothing
# said it, and a control under systemd (/etc/localtime, UTC on most servers) fired
# `0 2 * * *` at 03:00 on the clock of an operator whose shell has TZ=Europe/Berlin.
ZONE_FILE = Path("run") / "control-zone.json"


class ControlZone(NamedTuple):
    """The zone a control reads its cron times in: ``name`` (:func:`local_zone`) and, for
    one no name finds again (a file, a POSIX rule), the ``rules`` it read at its start."""

    name: str
    rules: bytes | None = None


def keep_zone(state_dir: Path, zone: str) -> None:
    """Keep the zone this control process reads its clock in (``local_zone``), for `status`;
    with its rules when its name is a file's or a POSIX rule's (``zone_rules``): read again
    by `status`, a file `timedatectl set-timezone` replaced since was not this process's."""
    from orchestrator.state.when import zone_rules

    kept: dict = {"pid": os.getpid(), "zone": zone}
    if (rules := zone_rules(zone)) is not None:
        kept["rules"] = base64.b64encode(rules).decode("ascii")
    path = state_dir / ZONE_FILE
    path.parent.mkdir(mode=0o700, exist_ok=True)
    atomic_write(path, json.dumps(kept) + "\n")


def control_zone(state_dir: Path, pid: int | None) -> ControlZone | None:
    """The zone the running control (``pid``: the one that holds the state folder) reads
    its cron times in; None when none runs or it kept none (an earlier release's)."""
    kept = _kept_by(state_dir / ZONE_FILE, pid)
    if kept is None or kept.get("pid") != pid or not kept.get("zone"):
        return None  # a previous run's, its control gone
    try:
        rules = base64.b64decode(kept["rules"], validate=True) if "rules" in kept else None
    except (TypeError, ValueError):  # damaged: compared by its name, as an older control's
        rules = None
    return ControlZone(str(kept["zone"]), rules)


def zone_said(settings: Settings, zone: ControlZone | None) -> str | None:
    """The line that says a running control reads its cron times on another clock than
    this process (``zone``: the control's), or None: the same clock, no control, or no
    cron sweep."""
    from orchestrator.state.when import local_zone, said_offset, same_clock, zone_offset

    if zone is None or not any(s.cron for s in settings.sweeps.values()):
        return None
    if same_clock(zone.name, zone.rules):
        return None
    theirs = said_offset(zone_offset(zone.name, rules=zone.rules))
    here = said_offset(datetime.now(UTC).astimezone().utcoffset())
    return (
        f"[[sweeps]] cron times are on the control's clock, {zone.name}"
        + (f" (now {theirs})" if theirs else "")
        + f", not this shell's, {local_zone()} (now {here}): the report's nights and a "
        "--since 08:00 are on this one; to fire them on this clock, start the control with "
        "its zone (TZ, else /etc/localtime)"
    )


def control_clock_said(settings: Settings) -> str | None:
    """`status`'s line on a running control that reads its cron times on another clock
    than this command, or None."""
    try:
        pid = control_pid(settings.state_dir)
    except OSError:  # an unreadable lock: the state folder's own check names it
        return None
    return zone_said(settings, control_zone(settings.state_dir, pid))


def refusal_said(line: dict) -> str:
    """Who refused what, as a ``message.refused`` line says it ("far:42 on far: an
    outcome message of version 4, this reviewq speaks 3")."""
    who = " on ".join(str(line[k]) for k in ("worker", "host") if line.get(k))
    what = str(line.get("reason") or "").split(": ", 1)[0]
    return ": ".join(x for x in (who, what) if x) or "message.refused"


def workers_heard(store: Store, control_runs: bool = True) -> dict:
    """What state.db says of the workers, the only trace of them on the control's side:
    the agents running now and on which hosts, when and which worker (host:pid) was
    last heard from (a heartbeat or an outcome, on the control's clock; not a message
    found gone from the queue, which a restarted Redis loses as well), and since when the
    oldest message no worker has taken waits on the review queue. A launch failure is a
    worker's answer too, though it names no worker on its attempt (no agent ran there): a
    worker that answered every message so read as silent for hours; the last one, when
    nothing was heard since, is ``last_launch_failure``. ``unwatched``: the agents
    running when no control runs (``control_runs`` false), which none hears from: a unit
    killed whole (SIGKILL) left them running in state.db. (A run-job's agent is counted
    too: state.db does not say which process runs an attempt.)"""
    # The open attempts through their index: a scan read every attempt ever made.
    running = [
        w
        for (w,) in store.conn.execute(
            f"SELECT worker FROM attempts WHERE {OPEN_SQL} AND outcome = 'running' ORDER BY worker"
        )
    ]
    # (time, worker): with workers on several machines, "last heard from" a time named
    # none of them, and one gone quiet was not told from the others.
    heard = [
        (t, w)
        for sql in (
            "SELECT heartbeat_at, worker FROM attempts WHERE worker IS NOT NULL "
            "ORDER BY heartbeat_at DESC LIMIT 1",
            "SELECT recorded_at, worker FROM attempts WHERE worker IS NOT NULL "
            "AND outcome NOT IN ('dispatched', 'running', 'lost', 'superseded') "
            "ORDER BY recorded_at DESC LIMIT 1",
        )
        for t, w in store.conn.execute(sql)
        if t
    ]
    failed = store.conn.execute(
        "SELECT job_id, attempt, reasons, recorded_at, worker FROM attempts "
        "WHERE outcome = 'launch-failure' AND recorded_at IS NOT NULL "
        "ORDER BY recorded_at DESC, id DESC LIMIT 1"
    ).fetchone()
    last_failure = None
    if failed is not None and (not heard or failed["recorded_at"] >= max(t for t, _ in heard)):
        heard.append((failed["recorded_at"], failed["worker"]))
        last_failure = {
            "job_id": failed["job_id"],
            "attempt": failed["attempt"],
            "reasons": reasons_column(failed["reasons"]),
        }
    last = max(heard, key=lambda h: h[0]) if heard else (None, None)
    # Taken by a worker that has no agent slot free for them yet (its beats say
    # ``waiting``), or gone from the queue before a beat: the jobs' "running" beside
    # "0 agent(s) running" read as a contradiction.
    held = [
        w
        for (w,) in store.conn.execute(
            f"SELECT worker FROM attempts WHERE {OPEN_SQL} "
            "AND outcome = 'dispatched' AND taken_at IS NOT NULL ORDER BY worker"
        )
    ]
    untaken = store.conn.execute(
        f"SELECT count(*), min(started_at) FROM attempts WHERE {OPEN_SQL} "
        "AND outcome = 'dispatched' AND taken_at IS NULL AND worker IS NULL"
    ).fetchone()
    return {
        "agents_running": len(running),
        "unwatched": 0 if control_runs else len(running),
        "hosts": sorted({w.rsplit(":", 1)[0] for w in running if w}),
        "agents_waiting": len(held),
        "waiting_hosts": sorted({w.rsplit(":", 1)[0] for w in held if w}),
        "last_heard_at": last[0],
        "last_heard_from": last[1],
        "last_launch_failure": last_failure,
        "untaken": untaken[0],
        "untaken_since": untaken[1],
    }


def status_lines(ws: Workspace, store: Store, data: dict) -> Iterator[str]:
    """``status`` in words: ``data`` as :func:`status` read it, with the notes not reviewed
    and the sweeps not run that the command adds to it."""
    yield "jobs: " + ", ".join(f"{k} {v:,}" for k, v in data["jobs"].items())
    yield (
        f"escalations open: {data['escalations_open']:,}" + raised_by_agents(data["agents_failed"])
    )
    for a in data["agents_failed"]:
        yield f"  {a['says']}"
    for name, r in data["reviewers"].items():
        if r["paused_until"]:
            pause = Pause(r["paused_until"], r["paused_reason"], r["paused_since"])
            yield pause_words(store, name, pause, r["jobs_waiting"])
        elif r["awaits_control_restart"]:
            yield (
                f"{r['jobs_waiting']:,} job(s) wait for reviewer {name}, added to "
                f"{ws.settings.config_path or ws.root / 'reviewq.toml'} after the control "
                "started: it runs them once restarted (systemctl reload, or kill -HUP "
                f"{data['control']['pid']}; reviewq logs --event control.settings_stale)"
            )
        else:
            yield f"reviewer {name} is active"
    for n in data["sweeps"]:
        yield logs.one_line(n["says"])  # a name is the user's text
    for n in data["sweeps_not_run"]:
        yield logs.one_line(n["says"])
    for b in data["budgets_spent"]:
        yield logs.one_line(b["says"])
    yield (
        # The UTC day: read at 7 a.m. on local time (cron's), "today" said nothing of which.
        f"cost: today (UTC) ${data['cost_usd']['today']:,.4f}, "
        f"total ${data['cost_usd']['total']:,.4f}"
    )
    for f in data["fixes_unwritten"][:UNWRITTEN_SHOWN]:
        yield (
            f"fix not written to the KB: {f['note_path']} (fix job {f['job_id']}, since "
            f"{f['since'][:19]}Z): {f['error']}; the control process tries again at each tick"
        )
    if more := more_unwritten(len(data["fixes_unwritten"])):
        yield more
    yield from (
        capped([FileProblem(**p) for p in data["notes_not_reviewed"]], "note not reviewed: ")
    )
    if data["notes_excluded"]:
        yield excluded_words(data["notes_excluded"])
    yield from liveness(store, data)


def too_large_notes(ws: Workspace) -> list[FileProblem]:
    """The notes over [limits] max_note_bytes, which no sweep reviews; none where the KB
    cannot be read (status is about state.db first)."""
    from orchestrator.kb.notes import KBError

    try:
        return ws.kb.too_large_notes() if (ws.root / "kb").is_dir() else []
    except (KBError, OSError):
        return []


def liveness(store: Store, data: dict) -> list[str]:
    """Whether anything is working on the queue: the question at 7 a.m. when the counts
    have not moved. ``data``: what :func:`status` read."""
    # Started now, a control runs none of these before their reviewer's pause ends; those
    # a spent budget holds as well are not among the jobs it would run at all.
    paused = [name for name, r in data["reviewers"].items() if r["paused_until"]]
    spent = [b["sweep_run"] for b in data["budgets_spent"]]
    held = sum(waiting_on(store, paused, spent).values())
    pid, w = data["control"]["pid"], data["workers"]
    by_hand = data["jobs_by_hand"]
    # Nor those a spent budget holds (said above): the sweep's next run takes them over.
    budget = sum(b["jobs_waiting"] for b in data["budgets_spent"])
    queued = data["jobs"]["queued"] + data["jobs"]["running"] - by_hand - budget
    if pid is None:
        lines = [
            "control: not running"
            + (f"; {queued:,} job(s) wait for one (reviewq control)" if queued else "")
            + (f", {held:,} of them for a paused reviewer too (above)" if queued and held else "")
        ]
    else:
        lines = [f"control: running (pid {pid})" if pid else "control: running"]
        if data["control"].get("zone_said"):
            lines.append(logs.one_line(data["control"]["zone_said"]))  # a TZ is the user's text
        if shared := data["control"].get("shared"):
            # Said once a run in its log: the operator of each KB read nothing of it here.
            # From its second on: once logrotate emptied the log, `logs` without --since
            # read the empty file alone and printed nothing.
            at = f"{shared['at'][:19]}Z"
            lines.append(
                f"queue shared, said at {at}: {shared['said']} (reviewq logs --event "
                f"queue.shared --since {at}; said until the control restarts)"
            )
        if down := data["control"].get("queue_down"):
            # The control and its workers wait in silence but for their logs.
            lines.append(
                f"queue: out of reach, said at {down['at'][:19]}Z ({logs.one_line(down['error'])}); "
                "the control and its workers wait for it (reviewq doctor; reviewq logs "
                "--event queue.unavailable)"
            )
    if by_hand:
        lines.append(
            f"{by_hand:,} job(s) made by create-jobs are run by hand (reviewq run-job N, or an "
            "agent's output and reviewq finalize): no control process runs them"
        )
    unwatched = w["unwatched"]
    line = f"workers: {w['agents_running']} agent(s) {'were ' if unwatched else ''}running"
    if w["hosts"]:
        line += " on " + ", ".join(w["hosts"])
    if w.get("agents_waiting"):
        on = f" on {', '.join(w['waiting_hosts'])}" if w.get("waiting_hosts") else ""
        line += (
            f", and {w['agents_waiting']:,} job(s) taken by a worker{on} with no agent started "
            "yet (it waits for a free agent slot, or is starting one)"
        )
    if w["last_heard_at"]:
        who = f"{w['last_heard_from']} at " if w.get("last_heard_from") else ""
        line += f"; last heard from {who}{w['last_heard_at'][:19]}Z ({_ago(_seconds(w['last_heard_at'], utcnow()))})"
        if failed := w.get("last_launch_failure"):
            # Alive, and failing: the reason says where and why.
            said = attempt_words("launch-failure", "; ".join(map(str, failed["reasons"])))
            line += f", with a launch failure (job {failed['job_id']} attempt {failed['attempt']}: {said})"
    else:
        line += "; none heard from yet"
    if unwatched:
        # A unit killed whole left its workers' agents "running" in state.db: only a
        # control hears them, and none does.
        line += "; no control is running, so nobody is watching them: they may have stopped"
    lines.append(line)
    if refused := w.get("refused"):
        # Its agents are in no count above: the control refuses all it says.
        lines.append(
            f"refused: a worker of another release, the last at {refused['at'][:19]}Z "
            f"({refused['said']}); its agents are not counted above: run one reviewq "
            "release everywhere (reviewq logs --event message.refused)"
        )
    if w["untaken"]:
        waited = _seconds(w["untaken_since"], utcnow())
        line = (
            f"review queue: {w['untaken']:,} message(s) no worker has taken yet, the oldest sent "
            f"{w['untaken_since'][:19]}Z ({_ago(waited)})"
        )
        if waited >= 60:
            line += "; is a worker running on this queue? (reviewq doctor --worker on its machine)"
        lines.append(line)
    return lines


def idle_words(waiting: int, control_runs: bool, heard: dict, now: str) -> str:
    """Jobs that wait with nothing to run them, as the report's "needs you" says it, in the
    words :func:`liveness` has for each part: no control process ("reviewq control"), or
    no worker heard from (``heard``: :func:`workers_heard`) since when, and by which."""
    at = heard["last_heard_at"]
    since = "yet"
    if at:
        who = f"; the last was {heard['last_heard_from']}" if heard.get("last_heard_from") else ""
        since = f"since {at[:19]}Z ({_ago(_seconds(at, now))}{who})"
    if not control_runs:
        # A control alone runs nothing: "start one (reviewq control)" left the jobs waiting.
        return (
            f"{waiting:,} job(s) wait and no control process is running, and no worker has "
            f"been heard from {since}: start one of each (reviewq control; reviewq worker)"
        )
    return (
        f"{waiting:,} job(s) wait and no worker has been heard from {since}; start one: "
        "reviewq worker (reviewq doctor --worker on its machine)"
    )


def _seconds(then: str, now: str) -> int:
    return int((datetime.fromisoformat(now) - datetime.fromisoformat(then)).total_seconds())


def _ago(s: int) -> str:
    if s < 120:
        return f"{max(s, 0)} s ago"
    if s < 7200:
        return f"{s // 60} min ago"
    return f"{s // 3600} h {s % 3600 // 60} min ago"


def unwritten_fixes(store: Store, failed_only: bool = False) -> list[dict]:
    """Fixes decided as applied whose note is not in the KB yet (a read-only folder, a full
    disk), with the error that kept each back: the control process writes them again at
    each tick, and until then the KB does not say what the reviews say it does.
    ``failed_only``: those a write was tried for, not those just decided."""
    if not _table_exists(store, "fix_writes_due"):
        return []
    return [
        dict(r)
        for r in store.conn.execute(
            "SELECT job_id, path AS note_path, since, error FROM fix_writes_due WHERE written = 0 "
            "AND (? = 0 OR error != ?) ORDER BY job_id",
            (failed_only, NOT_TRIED),
        )
    ]


# How many fixes not written to the KB a screen names: a KB folder the control cannot
# write (a read-only mount, another owner) keeps every fix of a night out, and status,
# the sweep's summary and the page said each, hundreds of lines burying the rest.
UNWRITTEN_SHOWN = 3
FAILED_SHOWN = 3  # failed jobs a summary names; the rest counted


def more_failed(total: int, shown: int = FAILED_SHOWN) -> str | None:
    """The line that counts the failed jobs past those named, and says where each is."""
    if total <= shown:
        return None
    return f"… {total - shown:,} more failed job(s): reviewq jobs --state failed"


def more_unwritten(total: int, shown: int = UNWRITTEN_SHOWN) -> str | None:
    """The line that counts the fixes not written past those named, and says where each is."""
    if total <= shown:
        return None
    return (
        f"… and {total - shown:,} more fixed note(s) not written to the KB: "
        "reviewq status --json names each"
    )


def jobs(store: Store, state: str | None = None, limit: int = 200) -> list[dict]:
    """The jobs ``jobs`` lists, newest first: each with its first note (``note_path``, by
    name; ``notes``: how many) and, failed, its ``failure_reasons``."""
    sql = (
        "SELECT j.id, j.kind, j.status, j.model_partition, j.reviewer, j.runner, j.lens, j.sweep, j.attempt, "
        "j.created_at, j.finished_at, (SELECT count(*) FROM review_pairs p WHERE p.job_id = j.id) AS pairs, "
        "COALESCE(j.note_path, (SELECT min(p.note_path) FROM review_pairs p WHERE p.job_id = j.id)) "
        "AS note_path, (SELECT count(DISTINCT p.note_path) FROM review_pairs p WHERE p.job_id = j.id) "
        "AS notes, j.failure_reasons, "
        "(SELECT COALESCE(SUM(cost_usd), 0) FROM attempts a WHERE a.job_id = j.id) AS cost_usd, "
        "(SELECT count(*) FROM attempts a WHERE a.job_id = j.id "
        f"AND NOT {NOT_RUN_SQL} AND NOT {WAITING_SQL}) AS attempts, "
        f"(SELECT count(*) FROM attempts a WHERE a.job_id = j.id AND {NOT_RUN_SQL}) AS attempts_not_run "
        "FROM review_jobs j"
    )
    where, args = _in_state(state)
    sql += where + " ORDER BY j.id DESC LIMIT ?"
    return [
        {**dict(r), "failure_reasons": reasons_column(r["failure_reasons"])}
        for r in store.conn.execute(sql, (*args, limit))
    ]


def who_ran(job: dict) -> str:
    """A job's reviewer as `jobs` and the report's failed jobs name it: a job create-jobs
    made has none, and the profile run-job ran it with (its ``runner``) is in brackets."""
    return job["reviewer"] or (f"({job['runner']})" if job["runner"] else "-")


def jobs_line(r: dict) -> str:
    """One row of ``jobs``: a job of :func:`jobs` in a line."""
    who = who_ran(r)
    return (
        f"{r['id']:>6}  {r['status']:<9} {r['kind']:<6} {r['pairs']:>3} pair(s)  {who:<10} "
        f"{r['lens'] or '-':<14} attempts {r['attempts']}"
        # Shown apart: counted in, a job "failed after 3 attempts" read as 5.
        + (f" (+{r['attempts_not_run']} not run)" if r["attempts_not_run"] else "")
        + f"  ${r['cost_usd']:.4f}"
        # Which note, and for a failed job why: a morning's 165 failed rows named neither.
        + (f"  {logs.one_line(r['note_path'])}" if r["note_path"] else "")
        + (f" and {r['notes'] - 1} more note(s)" if r["notes"] > 1 else "")
        + (
            f": {logs.one_line(r['failure_reasons'][0])}"
            if r["status"] == "failed" and r["failure_reasons"]
            else ""
        )
    )


# Lines of a rationale `job N` shows under its verdict: a reviewer's quoting at length
# (an output may be 5 MB) buried the escalation and attempts below under thousands.
RATIONALE_LINES = 20


def job_lines(job_id: int, data: dict) -> Iterator[str]:
    """``job N`` in words: ``data`` as :func:`job` read it."""

    def dash(v: object) -> str:  # "-" for a value never recorded, not "None"
        return "-" if v is None else str(v)

    if data["grouping"] == "human":
        # No reviewer, no attempt, no folder: a person's call on an escalation.
        call = {"approved": "approve", "rejected": "reject"}.get(data["result"], data["result"])
        esc = data["decides_escalation"]
        yield (
            f"job {job_id}: a person's decision: {dash(call)} "
            f"({f'escalation {esc}, ' if esc else ''}{data['model_partition']})"
        )
        yield f"  decided {data['created_at']}"
    else:
        # The profile as the role it played: a failed fix called its fixer the reviewer.
        role = {"fix": "fixer", "audit": "auditor"}.get(data["kind"], "reviewer")
        yield (
            f"job {job_id}: {data['status']} ({data['kind']}, {data['model_partition']}, "
            f"{role} {dash(data['reviewer'])}"
            + (
                f", run by hand: {data['runner']}"
                # A queued job a person finalized, or run-job ran with another profile,
                # was judged by them, not by the reviewer it was queued for.
                if data["runner"] and data["runner"] != data["reviewer"]
                else ""
            )
            + ")"
        )
        finished = f", finished {data['finished_at']}" if data["finished_at"] else ""
        yield f"  created {data['created_at']}{finished}"
    for w in data["waits"]:
        yield f"  waits: {w}"
    if data["kind"] == "fix" and data.get("result"):
        # What became of the fix (applied, unchanged, not-applied) and of its commit.
        commit = (
            f"; commit {data['fix_commit']}"
            if data.get("fix_commit")
            else f"; no commit: {data['fix_no_commit']}"
            if data.get("fix_no_commit")
            else ""
        )
        yield f"  fix: {data['result']}{commit}"
    if data["kind"] == "fix" and data.get("feedback"):
        # What the person asked of the fixer: its prompt carries them, and --json alone
        # showed them. One line, as every value here.
        yield f"  asks (decide redo): {logs.one_line(data['feedback'])}"
    for r in data["failure_reasons"]:
        yield f"  reason: {r}"
    if data.get("new_job"):
        yield f"  {data['new_job']}"
    if data["split_into"]:
        yield f"  split into job(s) {', '.join(map(str, data['split_into']))}"
    if data["parent_job_id"]:
        yield f"  split from job {data['parent_job_id']}"
    if data["source_job_id"] and not data["parent_job_id"]:
        follows = {
            "fix": "fixes the FAILs of job",
            "audit": "audits the PASSes of job",
            "review": "reviews again the note fixed by job",
        }.get(data["kind"], "follows job")
        yield f"  {follows} {data['source_job_id']}"
    for f in data["follow_ups"]:
        yield f"  follow-up: {f['kind'] if f['kind'] != 'review' else 're-review'} job {f['id']}"
    for p in data["pairs"]:
        yield f"  {p['decision'] or '-':<5} {p['note_path']}  {p['gate_id']}"
        # What the reviewer said, under its verdict (CONTRACT §5): a person deciding an
        # escalation opened the job it names and read "FAIL" with no finding. The agent's
        # text, so each line made printable; its first lines, the rest in --json.
        said = [line.rstrip() for line in (p["rationale"] or "").splitlines() if line.strip()]
        for line in said[:RATIONALE_LINES]:
            yield f"        {logs.one_line(line)}"
        if len(said) > RATIONALE_LINES:
            yield f"        … {len(said) - RATIONALE_LINES} more line(s): reviewq job {job_id} --json"
    for e in data["escalations"]:
        state = f"decided: {e['decision']}" if e["decision"] else "open; reviewq escalations"
        yield (
            f"  escalated: {logs.one_line(e['note_path'])} {e['gate_id']} (escalation {e['id']}, {state})"
        )
    for a in data["attempts"]:
        cost = a["cost_usd"]
        first = str(a["reasons"][0]) if a["reasons"] else None
        cost = f"${cost:.4f}" if isinstance(cost, int | float) else dash(cost)
        yield (
            # In words ("the agent did not start"); --json has the outcome as CONTRACT names it.
            f"  attempt {a['attempt']}: {outcome_words(a['outcome'], first)}, "
            f"exit {dash(a['exit_code'])} "
            f"turns {dash(a['num_turns'])} "
            f"tokens {dash(a['input_tokens'])}/{dash(a['output_tokens'])} {cost}"
            # With workers on several machines, which one (`host:pid`, as the log says).
            + (f" on {logs.one_line(a['worker'])}" if a.get("worker") else "")
        )
        for r in a["reasons"]:
            yield f"    {reason_words(str(r))}"


def job_count(store: Store, state: str | None = None) -> int:
    """How many jobs ``jobs`` would list with no limit."""
    where, args = _in_state(state)
    return store.conn.execute(f"SELECT count(*) FROM review_jobs j{where}", args).fetchone()[0]


def _in_state(state: str | None) -> tuple[str, tuple]:
    """The jobs ``jobs`` lists: a person's decisions (grouping ``human``, recorded as jobs
    so they are reviews) are not work anyone ran, and ``status`` does not count them."""
    if state:
        return " WHERE j.grouping != 'human' AND j.status = ?", (state,)
    return " WHERE j.grouping != 'human'", ()


def job_recorded(store: Store, job_id: int) -> bool:
    return (
        store.conn.execute("SELECT 1 FROM review_jobs WHERE id = ?", (job_id,)).fetchone()
        is not None
    )


def job(store: Store, job_id: int, settings: Settings) -> dict:
    row = store.conn.execute("SELECT * FROM review_jobs WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise NotFound(f"no review job {job_id}")
    out = dict(row)
    out["failure_reasons"] = reasons_column(out["failure_reasons"])
    out["new_job"] = new_job_words(store, job_id)
    out["telemetry"] = json_column(out.pop("telemetry_json"))
    out["pairs"] = [
        dict(r)
        for r in store.conn.execute(
            "SELECT note_path, gate_id, gate_path, decision, rationale FROM review_pairs WHERE job_id = ? ORDER BY id",
            (job_id,),
        )
    ]
    # Where a split job's pairs went: shown nowhere but in the log's job.split line.
    out["split_into"] = split_into(store, job_id)
    out["waits"] = _waits(store, out, settings)
    # The jobs its outcome started (a fix, an audit, a fixed note's re-review); a split
    # re-review's parts are the split's, shown under their parent.
    out["follow_ups"] = [
        dict(r)
        for r in store.conn.execute(
            "SELECT id, kind FROM review_jobs WHERE source_job_id = ? AND parent_job_id IS NULL "
            "ORDER BY id",
            (job_id,),
        )
    ]
    # A person's decision (decide approve, or reject over a refuted PASS) is recorded as
    # a job: the escalation it decided, by the pair and the moment (one transaction).
    decided = None
    if out["grouping"] == "human" and out["pairs"] and _table_exists(store, "escalations"):
        p = out["pairs"][0]
        decided = store.conn.execute(
            "SELECT id FROM escalations WHERE model_partition = ? AND note_path = ? "
            "AND gate_id = ? AND decided_at = ? ORDER BY id DESC LIMIT 1",
            (out["model_partition"], p["note_path"], p["gate_id"], out["created_at"]),
        ).fetchone()
    out["decides_escalation"] = decided[0] if decided else None
    # What its outcome handed to a person (a failure, a third rejection, a refuted PASS).
    out["escalations"] = (
        [
            dict(r)
            for r in store.conn.execute(
                "SELECT id, note_path, gate_id, decision, report_path FROM escalations "
                "WHERE job_id = ? ORDER BY id",
                (job_id,),
            )
        ]
        if _table_exists(store, "escalations")
        else []
    )
    out["attempts"] = []
    for a in store.conn.execute(
        "SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt", (job_id,)
    ):
        d = dict(a)
        d["reasons"] = reasons_column(d["reasons"])
        d.pop("telemetry_json", None)
        out["attempts"].append(d)
    return out


def _waits(store: Store, job: dict, settings: Settings) -> list[str]:
    """Why a queued job is not dispatched now: a paused reviewer, a launch failure's
    backoff, its sweep run's spent budget. Said only in the log before, a held job looked
    like any other queued one."""
    if job["status"] != "queued":
        return []
    now, out = utcnow(), []
    name = job["reviewer"]
    if name and (pause := paused_reviewers(store, now).get(name)):
        out.append(pause_words(store, name, pause))
    if job["not_before"] and job["not_before"] > now:
        out.append(f"not before {job['not_before']} (a launch failure's backoff)")
    if job["sweep_run_id"] is not None and job["sweep_run_id"] in over_budget_runs(store):
        out.extend(held_by_budget(store, {job["sweep_run_id"]: 1}, settings, one_job=True))
    return out


@dataclass
class Progress:
    total: int = 0
    done: int = 0
    open: int = 0
    waiting_paused: int = 0
    waiting_budget: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    budget_runs: dict[int, int] = field(default_factory=dict)  # run id -> its jobs that wait


def budgeted_runs_with_queued_jobs(store: Store) -> list:
    """``(id, budget_usd)`` of the sweep runs a budget may hold back: those with one and
    with queued jobs (only a queued job waits on a budget). Every budgeted run ever
    recorded, each summed, cost seconds a call on a year's state.db (a sweep asks five
    times a second)."""
    return store.conn.execute(
        "SELECT id, budget_usd FROM sweep_runs WHERE budget_usd IS NOT NULL AND id IN "
        "(SELECT value FROM json_each(?)) ORDER BY id",
        (json.dumps(runs_with_queued_jobs(store)),),
    ).fetchall()


def runs_with_queued_jobs(store: Store) -> list[int]:
    """The sweep runs that have queued jobs, one step of the ``(status, sweep_run_id)``
    index each: reading every queued job for them, at each dispatch (per outcome), made a
    sweep's dispatching grow with the square of its jobs."""
    runs: list[int] = []
    while (
        row := store.conn.execute(
            "SELECT sweep_run_id FROM review_jobs WHERE status = 'queued' AND sweep_run_id > ? "
            "ORDER BY sweep_run_id LIMIT 1",
            (runs[-1] if runs else -1,),
        ).fetchone()
    ) is not None:
        runs.append(row[0])
    return runs


def reviewers_with_queued_jobs(store: Store) -> list[str]:
    """The reviewers that have queued jobs. Read as a walk of the distinct reviewers in
    the ``(reviewer, status, id)`` index, each asked for one queued job: a DISTINCT over
    the queued jobs read every one of them at each dispatch, which runs per outcome, so
    a sweep's dispatching grew with the square of its jobs."""
    return [
        r[0]
        for r in store.conn.execute(
            "WITH RECURSIVE names(name) AS (SELECT min(reviewer) FROM review_jobs UNION ALL "
            "SELECT (SELECT min(reviewer) FROM review_jobs WHERE reviewer > names.name) "
            "FROM names WHERE names.name IS NOT NULL) "
            "SELECT name FROM names WHERE name IS NOT NULL AND EXISTS "
            "(SELECT 1 FROM review_jobs WHERE reviewer = names.name AND status = 'queued')"
        )
    ]


def over_budget_runs(store: Store) -> set[int]:
    """Sweep runs with queued jobs whose recorded cost reached their ``budget_usd``."""
    return {
        run["id"]
        for run in budgeted_runs_with_queued_jobs(store)
        if spent_usd(store, run["id"]) >= run["budget_usd"]
    }


def entry_takes_over(settings: Settings, were: object, trigger: str, reviewer: str) -> bool:
    """Whether the next run of a ``[[sweeps]]`` entry whose reviewer is now ``reviewer``
    takes over the queued jobs of a spent run (``were``: its options, ``trigger``) of
    that entry, however the entry was edited since: unless the run's profile, still
    configured, writes another partition (this budget is for the model the entry uses
    now). A run recorded before its options said ``configured`` was the entry's if its
    cron started it: edited since, its jobs were held for good."""
    if not isinstance(were, dict) or not were.get("configured", trigger == "cron"):
        return False
    old = settings.reviewers.get(str(were.get("reviewer")))
    return old is None or old.partition == settings.reviewer(reviewer).partition


def entries_taking_over(settings: Settings, name: str, were: object, trigger: str) -> list[str]:
    """The ``[[sweeps]]`` entries whose next run takes over the queued jobs of a spent run
    of sweep ``name`` (``were``: its options, ``trigger``): its own entry's
    (:func:`entry_takes_over`); and, once no entry has that name (renamed or removed, not
    only left out as wrong) or the entry of that name reviews another model now, any
    entry's of the model its reviewer wrote. Renamed, an entry took over none of what its
    old name's spent run held: the pairs of those jobs were skipped as queued by every run
    of it, each night, for good (two entries whose names were swapped, too)."""
    entry = settings.sweeps.get(name)
    if entry is not None and entry_takes_over(settings, were, trigger, entry.reviewer):
        return [name]
    if name in settings.sweeps_left_out or any(k.startswith("#") for k in settings.sweeps_left_out):
        return []  # perhaps only left out (a "#N" one named none): mended, it takes them
    return [
        e.name
        for e in settings.sweeps.values()
        if entry_takes_over(settings, were, trigger, e.reviewer)
    ]


def held_by_budget(
    store: Store, runs: dict[int, int], settings: Settings | None, one_job: bool = False
) -> list[str]:
    """Who holds queued jobs back, from :attr:`Progress.budget_runs`: each run named, with
    the way to take its jobs over. They hold their pairs from every other run too, so a
    run with no budget of its own said "the sweep's budget is spent" of them.
    ``one_job``: said of the one job `job N` shows, not as a count of the run's."""
    out = []
    for run_id, n in sorted(runs.items()):
        name, budget, options, trigger = store.conn.execute(
            "SELECT name, budget_usd, options, trigger FROM sweep_runs WHERE id = ?", (run_id,)
        ).fetchone()
        options = json_column(options)
        # As sweeps.producer takes them over: an entry's run by the entry's next run,
        # however it was edited since; once gone or of another model, by an entry now of
        # its model (not while it is left out); an ad-hoc run by one with its options.
        entries = [] if settings is None else entries_taking_over(settings, name, options, trigger)
        if entries == [name]:
            command = f"reviewq enqueue --name {shlex.quote(name)}"
            who = f"the next run of its [[sweeps]] entry ({command})"
        elif entries:
            which = " or ".join(f"reviewq enqueue --name {shlex.quote(e)}" for e in entries)
            who = f"the next run of a [[sweeps]] entry now of its model ({which})"
        else:
            who = "a run of that sweep with the same options"
        if one_job:
            out.append(
                f"sweep {name!r} (run {run_id}) has spent its budget of ${budget:g}; {who} "
                "takes this job over (with a new --budget-usd)"
            )
            continue
        out.append(
            f"{n} job(s) of sweep {name!r} (run {run_id}) wait: its budget of ${budget:g} is "
            f"spent; {who} takes them over (with a new --budget-usd)"
        )
    return out


def spent_budgets(store: Store, runs: Iterable[int], settings: Settings | None) -> list[dict]:
    """The spent ``runs`` (:func:`over_budget_runs`) as status and the morning report list
    them: what each spent of its budget, the queued jobs it holds back and, in the words
    of the sweep's summary, which run takes them over. ``settings`` None: no
    ``[[sweeps]]`` entry is known, an ad-hoc run's words are said."""
    out = []
    for rid in sorted(runs):
        run = dict(
            store.conn.execute(
                "SELECT id, name, budget_usd, started_at FROM sweep_runs WHERE id = ?", (rid,)
            ).fetchone()
        )
        waiting = store.conn.execute(
            "SELECT count(*) FROM review_jobs WHERE sweep_run_id = ? AND status = 'queued'", (rid,)
        ).fetchone()[0]
        out.append(
            {
                **run,
                "spent_usd": round(spent_usd(store, rid), 6),
                "jobs_waiting": waiting,
                "says": held_by_budget(store, {rid: waiting}, settings)[0],
            }
        )
    return out


def spent_usd(store: Store, run_id: int) -> float:
    """The recorded cost of a sweep run's attempts: those of its jobs and their follow-ups
    since it began. By the sweep's name and start time, every later run of that name was
    charged to it too, and held its queued jobs back at dispatch; a job a later run took
    over (queued, its budget spent) brings no earlier attempt's cost with it."""
    return store.conn.execute(
        "SELECT COALESCE(SUM(a.cost_usd), 0) FROM attempts a JOIN review_jobs j ON j.id = a.job_id "
        "JOIN sweep_runs r ON r.id = j.sweep_run_id WHERE r.id = ? AND a.started_at >= r.started_at",
        (run_id,),
    ).fetchone()[0]


@dataclass(frozen=True)
class SweepJobs:
    """The jobs a sweep answers for: those of its run (``run_id``: its jobs and their
    follow-ups, queued from ``first_id`` on), and the older ones it found open and waited
    for. By id alone, a job queued earlier by ``enqueue`` that the sweep ran and that failed
    was left out of its summary, and the sweep exited 0; and a sweep running beside it
    answered for the other's jobs (their failures made it exit 1)."""

    first_id: int
    earlier: tuple[int, ...] = ()
    started_at: str = ""
    run_id: int | None = None  # known once the sweep's run is recorded

    @classmethod
    def starting(cls, store: Store) -> SweepJobs:
        first = store.conn.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM review_jobs").fetchone()
        earlier = store.conn.execute(
            "SELECT id FROM review_jobs WHERE status IN ('queued', 'running') "
            "AND reviewer IS NOT NULL ORDER BY id"
        )
        return cls(first[0], tuple(r[0] for r in earlier), utcnow())

    def of_run(self, run_id: int) -> SweepJobs:
        return replace(self, run_id=run_id)

    def _new(self, column: str) -> tuple[str, tuple]:
        """Its own jobs: from ``first_id`` on (the primary key's range), of its run."""
        if self.run_id is None:
            return f"{column} >= ?", (self.first_id,)
        run = column.rpartition(".")[0] + "." if "." in column else ""
        return f"({column} >= ? AND {run}sweep_run_id = ?)", (self.first_id, self.run_id)

    def where(self, column: str = "id") -> tuple[str, tuple]:
        """A condition on a job id column (of ``review_jobs``), and its parameters."""
        new, args = self._new(column)
        return (
            f"({new} OR {column} IN (SELECT value FROM json_each(?)))",
            (*args, json.dumps(self.earlier)),
        )

    def attempts_where(self) -> tuple[str, tuple]:
        """The same over ``attempts a`` joined to ``review_jobs j``: of an older job, only
        the attempts made since the sweep began (not yesterday's retries), opened or
        launched since: a control stopped before it (an upgrade, a crash) left attempts it
        had opened with their messages on the queue, which the sweep's worker runs."""
        new, args = self._new("j.id")
        return (
            f"({new} OR (j.id IN (SELECT value FROM json_each(?)) "
            "AND (a.started_at >= ? OR a.launched_at >= ?)))",
            (*args, json.dumps(self.earlier), self.started_at, self.started_at),
        )


def progress(
    store: Store, jobs: SweepJobs, paused: set[str], over_budget: set[int] = frozenset()
) -> Progress:
    """Jobs the sweep waits for: its own, plus any other still open (queued meanwhile by
    ``enqueue`` or ``decide``). Queued jobs of a paused reviewer or of a sweep run over
    its budget wait; they are not open."""
    ours, args = jobs.where()
    p = Progress(by_status=dict.fromkeys(STATUSES, 0))
    for status_, reviewer, run_id, n in store.conn.execute(
        "SELECT status, reviewer, sweep_run_id, count(*) FROM review_jobs WHERE reviewer IS NOT NULL AND "
        f"({ours} OR status IN ('queued', 'running')) GROUP BY status, reviewer, sweep_run_id",
        args,
    ):
        p.by_status[status_] += n
        p.total += n
        if status_ in ("queued", "running"):
            if status_ == "queued" and reviewer in paused:
                p.waiting_paused += n
            elif status_ == "queued" and run_id in over_budget:
                p.waiting_budget += n
                p.budget_runs[run_id] = p.budget_runs.get(run_id, 0) + n
            else:
                p.open += n
        else:
            p.done += n
    return p


def summary(store: Store, jobs: SweepJobs, only_reject: OnlyReject | None = None) -> dict:
    """Jobs, decisions, attempts and cost of the sweep's jobs (:class:`SweepJobs`);
    ``only_reject``: as :func:`agents_failed` takes it."""
    ours, args = jobs.where("j.id")
    rows = store.conn.execute(
        f"SELECT j.reviewer, j.status, count(*) FROM review_jobs j WHERE {ours} AND j.reviewer IS NOT NULL "
        "GROUP BY j.reviewer, j.status",
        args,
    ).fetchall()
    decisions, audits = {}, {}
    # An audit's decision judges a review's PASS, it accepts nothing: counted with the
    # reviews, an auditor's FAIL read as a third decision for two pairs accepted PASS.
    for kind, decision, n in store.conn.execute(
        "SELECT j.kind, p.decision, count(*) FROM review_pairs p JOIN review_jobs j ON j.id = p.job_id "
        f"WHERE {ours} AND p.decision IS NOT NULL GROUP BY j.kind, p.decision",
        args,
    ):
        (audits if kind == "audit" else decisions)[decision] = n
    tried, tried_args = jobs.attempts_where()
    attempts = dict(
        store.conn.execute(
            "SELECT a.outcome, count(*) FROM attempts a JOIN review_jobs j ON j.id = a.job_id "
            f"WHERE {tried} GROUP BY a.outcome",
            tried_args,
        ).fetchall()
    )
    cost = store.conn.execute(
        f"SELECT COALESCE(SUM(a.cost_usd), 0) FROM attempts a JOIN review_jobs j ON j.id = a.job_id WHERE {tried}",
        tried_args,
    ).fetchone()[0]
    escalations = open_escalations(store)
    by_reviewer: dict[str, dict[str, int]] = {}
    for reviewer, st, n in rows:
        by_reviewer.setdefault(reviewer, dict.fromkeys(STATUSES, 0))[st] = n
    failed = [
        {"job_id": r[0], "reasons": reasons_column(r[1])[:3]}
        for r in store.conn.execute(
            f"SELECT j.id, j.failure_reasons FROM review_jobs j WHERE {ours} AND j.status = 'failed' "
            f"AND NOT {WITHDRAWN_SQL} ORDER BY j.id",
            args,
        )
    ]
    return {
        "jobs": by_reviewer,
        "decisions": decisions,
        "audits": audits,
        "attempts": attempts,
        "cost_usd": round(cost, 6),
        "failed": failed,
        "escalations": escalations,
        "agents_failed": agents_failed(escalations, only_reject),
        # This run's own: an older one is status's and the report's to tell.
        "fixes_unwritten": _of(store, jobs, unwritten_fixes(store, failed_only=True)),
    }


def _of(store: Store, jobs: SweepJobs, rows: list[dict]) -> list[dict]:
    """The rows (with ``job_id``) about the sweep's own jobs."""
    if not rows:
        return []
    ours, args = jobs.where()
    mine = {
        r[0]
        for r in store.conn.execute(
            f"SELECT id FROM review_jobs WHERE id IN (SELECT value FROM json_each(?)) AND {ours}",
            (json.dumps([r["job_id"] for r in rows]), *args),
        )
    }
    return [r for r in rows if r["job_id"] in mine]


def open_escalations(store: Store) -> list[dict]:
    if not _table_exists(store, "escalations"):
        return []
    return [
        {
            "id": r[0],
            "note_path": r[1],
            "gate_id": r[2],
            "model_partition": r[3],
            "reason": r[4],
            "report_path": r[5],
            "call": r[6],
            "reviewer": r[7],
            "fixer": r[8],
        }
        for r in store.conn.execute(
            "SELECT id, note_path, gate_id, model_partition, reason, report_path, call, "
            "reviewer, fixer FROM escalations WHERE decision IS NULL ORDER BY id"
        )
    ]


def agents_failed(open_escs: list[dict], only_reject: OnlyReject | None = None) -> list[dict]:
    """The open escalations raised by an agent that failed every attempt, by agent, most
    first: a crashing reviewer's 527 read as 527 verdicts among "556 escalation(s)", and
    the first thing to do, repair it, was said only inside each one's report. Each says
    what to run once it is repaired (``decide``): ``only_reject(note, gate)``, where the
    KB can be read, leaves out those only a reject can close, which would refuse the call."""
    by: dict[str, list[dict]] = {}
    for e in open_escs:
        if e["call"] == "reject":  # a verdict: rejections, an audit's refutation
            continue
        head, _, why = e["reason"].partition(": ")
        # "the reviewer failed every attempt" names no profile; the row does.
        for role in ("reviewer", "fixer"):
            if head.startswith(f"the {role} ") and e[role]:
                head = f"{role} {e[role]}" + head.removeprefix(f"the {role}")
        by.setdefault(head, []).append({**e, "why": why})
    out = []
    for agent, escs in sorted(by.items(), key=lambda kv: -len(kv[1])):
        notes = {e["note_path"] for e in escs}
        stuck = [e for e in escs if only_reject and only_reject(e["note_path"], e["gate_id"])]
        decide = after_repair([e for e in escs if e not in stuck])
        calls = "; ".join(decide)
        if escs[0]["call"] == "approve":
            # An auditor's: the reviewer's PASS stands and nothing audits it again (a redo
            # has nothing to fix), so its repair is for the audits to come, not first.
            todo = (f"{calls} accepts their PASSes unaudited; " if calls else "") + (
                f"repair it for the audits to come{RESTART_AFTER_AN_EDIT}"
            )
        else:
            todo = f"repair it first{RESTART_AFTER_AN_EDIT}" + (f", then {calls}" if calls else "")
        if stuck:
            todo += f" ({len(stuck)} more that only reject closes: reviewq escalations)"
        out.append(
            {
                "agent": agent,
                "escalations": len(escs),
                "notes": len(notes),
                "last_reason": escs[-1]["why"],
                "decide": decide,
                # One line, printed as it is: a reason may quote a file an agent named
                # with a line break or an escape sequence ("the reviewer changed …").
                "says": logs.one_line(
                    f"{agent} on {len(escs)} pair(s) of {len(notes)} note(s), which is no "
                    f"verdict on them; the last: {escs[-1]['why']}: {todo}"
                ),
            }
        )
    return out


# What `escalations`, `decide reject` and the report say of a pair stale since its FAIL
# (``cycles.escalations.changed_since_fail``: a person mended the note while it waited).
HELD_AS_IT_IS = (
    "a reject holds the pair as it is now, unreviewed, under the FAIL of the earlier text"
)


# How an open escalation's report (CONTRACT §7) starts the line of its own calls: the
# page, which offers a note's calls once above its reports, leaves that line out.
CALLS_SAID = "Decision: `reviewq decide "
# What a redo and a reject do beyond their gist, said in each report's line of calls and
# once on the page above its notes: there, "redo queues one fix" alone was wrong of a note
# with no FAIL on record about it as it is now (its reviewer failed every attempt).
REDO_IF = (
    "while a FAIL about the note as it is now is on record (a fresh count starts); "
    "else it releases the pair for the next sweep if it needs a review (never reviewed, "
    "or the note or gate changed), and is refused if it would do neither"
)
REJECT_ON_A_PASS = "(a PASS on record, as one an auditor refuted, becomes your FAIL)"


def held_by_a_reject(why: str, *more: str) -> str:
    """The line under an escalation whose pair changed since its FAIL (``why``, as select
    says it: "prose/x note-changed"), before the person decides it; or under a note's
    escalations, ``more`` of them so: one line, its gates named by reason (the terminal's
    report said the same long line once for each of a note's eight gates)."""
    if not more:
        return (
            f"changed since its FAIL ({why}): {HELD_AS_IT_IS} (a redo has the next sweep "
            "review it; approve accepts it)"
        )
    gates: dict[str, list[str]] = {}
    for one in (why, *more):
        gate, _, reason = one.partition(" ")
        gates.setdefault(reason, []).append(gate)
    said = "; ".join(f"{', '.join(g)} {reason}" for reason, g in gates.items())
    each = HELD_AS_IT_IS.replace("holds the pair", "holds each pair")
    return (
        f"changed since their FAILs ({said}): {each} (a redo has the next sweep review them; "
        "approve accepts them)"
    )


# A worker reads its profiles at its start: a repair made by editing one, with workers
# running, left them the broken one, and the call run after it failed every attempt again
# (found with a real control and worker).
RESTART_AFTER_AN_EDIT = " (restart the workers, or send them SIGHUP, after an edit of its profile)"


def needs_asks(call: str) -> bool:
    """Whether a redo of an escalation recommending ``call`` needs the person's asks: a
    verdict on the note does (the fixer is told what to change); an agent that failed every
    attempt judged nothing, and its redo runs the job again, with nothing for the person
    to say about the note."""
    return call != "redo"


def redo_call(target: str, calls: Iterable[str]) -> str:
    """The ``decide`` line of a redo of ``target`` (ids, ``--note PATH``), whose
    escalations recommend ``calls``: with the asks' placeholder where one is a verdict."""
    asks = ' --feedback "…"' if any(map(needs_asks, calls)) else ""
    return f"reviewq decide {target} redo{asks}"


def after_repair(escs: list[dict]) -> list[str]:
    """The ``decide`` calls that answer an agent's escalations once it is repaired, each
    with the call their reports recommend (a redo: the job again, or the pairs released
    for the next sweep; approve where an audit failed), one per partition: a note gets
    one fix job, of one partition. "repair it first" named no way on, and the report lists
    five notes' calls of a big night's 24."""
    calls: dict[tuple[str, str], list[int]] = {}
    for e in escs:
        calls.setdefault((e["model_partition"], e["call"]), []).append(e["id"])
    return [
        redo_call(" ".join(map(str, sorted(ids))), [call])
        if call == "redo"
        else f"reviewq decide {' '.join(map(str, sorted(ids)))} {call}"
        for (_, call), ids in sorted(calls.items())
    ]


def raised_by_agents(agents: list[dict]) -> str:
    """What follows a count of open escalations wherever one is said (status, the report,
    the sweep's summary, `escalations`): how many :func:`agents_failed` counts, which are
    no verdict on a note. Said in one place, the total read as that many verdicts."""
    n = sum(a["escalations"] for a in agents)
    return f" ({n:,} of them raised by an agent that failed)" if n else ""


_E = TypeVar("_E")


def by_note(
    escalations: Iterable[_E], note: Callable[[_E], str], call: Callable[[_E], str]
) -> list[tuple[str, list[_E]]]:
    """Open ``escalations`` (in the order they were raised) grouped by ``note(e)``, in the
    order a person deciding them takes them: notes with a verdict to weigh first (one
    escalation whose ``call(e)`` is reject: rejections, an audit's refutation), then those
    whose agent failed every attempt, which judged nothing and wait for the agent's repair
    (a broken reviewer escalates every pair of its jobs: 140 such notes put the twelve
    rejected ones past the report's 50); within each, the note with the most open first
    (one decide settles them all), then the one waiting longest. The report, the
    `escalations` list and the sweep's summary all list them so; two orders lost a
    person working down one list and checking the other their place."""
    groups: dict[str, list[_E]] = {}
    for e in escalations:
        groups.setdefault(note(e), []).append(e)
    first = {n: i for i, n in enumerate(groups)}

    def key(kv: tuple[str, list[_E]]) -> tuple[bool, int, int]:
        return (not any(call(e) == "reject" for e in kv[1]), -len(kv[1]), first[kv[0]])

    return sorted(groups.items(), key=key)


def decide_calls(
    note_path: str, escalations: list[tuple[int, str]], store: Store | None = None
) -> dict[str | None, str]:
    """What `reviewq decide` takes to answer a note's (id, partition) escalations at once:
    the note, or each partition's ids when they are in several that may each want a fix
    (a redo makes one fix job, of one partition, and decide refuses the note). With
    ``store``, a partition that holds no FAIL of the note (its reviewer failed every
    attempt) wants none: its redo only releases the pairs, and the note is one call
    (E97). Partition (None: all) -> arguments."""
    parts: dict[str, list[int]] = {}
    for esc_id, partition in escalations:
        parts.setdefault(partition, []).append(esc_id)
    if len(parts) == 1 or (store is not None and len(_failing_in(store, note_path, parts)) < 2):
        return {None: f"--note {shlex.quote(note_path)}"}
    return {p: " ".join(map(str, ids)) for p, ids in sorted(parts.items())}


def _failing_in(store: Store, note_path: str, partitions: Iterable[str]) -> set[str]:
    """Which of ``partitions`` hold an accepted FAIL of the note, of any text: those a
    redo may make a fix job in (decide's own test, which reads the KB, is narrower)."""
    return {
        p
        for p in partitions
        if store.conn.execute(
            "SELECT 1 FROM acceptance WHERE model_partition = ? AND note_path = ? "
            "AND decision = 'FAIL' LIMIT 1",
            (p, note_path),
        ).fetchone()
    }


# --- what an escalation's report quotes ------------------------------------------------


def gist(rationale: str | None, limit: int = 140) -> str:
    """The first finding of a rationale (``- severity: text``), else its first line."""
    lines = [ln.strip() for ln in (rationale or "").splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("- ") and ln[2:].strip().lower() not in ("none", "none."):
            text = ln[2:]
            return text if len(text) <= limit else text[: limit - 1] + "…"
    text = lines[0] if lines else "no rationale given"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def findings(rationale: str | None, limit: int | None = 10) -> list[str]:
    """The ``- severity: text`` lines of a rationale, without their dash: the first
    ``limit`` (None: all, for a caller that says how many it leaves out)."""
    out = []
    for line in (rationale or "").splitlines():
        line = line.strip()
        if line.startswith("- ") and line[2:].strip().lower() not in ("none", "none."):
            out.append(line[2:].strip())
    return out[:limit]


# What brings back an open escalation's report deleted by hand (`doctor` names them).
REWRITE_REPORTS = "reviewq rewrite-files writes it again from state.db"


def unread_report(exc: OSError) -> str:
    """Why a gate-review report's file was not read, as `escalations` and the page say it
    before :data:`REWRITE_REPORTS`."""
    if isinstance(exc, FileNotFoundError):
        return "missing"
    return f"cannot be read ({exc.strerror or exc})"


def quoted(store: Store, e) -> tuple[str, list[str]]:  # noqa: ANN001 - an escalations row
    """What an escalation's report recommends and quotes (its Material). An escalation
    raised before migration 8 has neither in state.db (its report file was their only
    record): they are drawn again as they were then, from the pair of the job of its
    last rejection (its findings; their gist, and that the fixer changed nothing when
    it did); an agent's failure, which has no rejection, quotes its reason."""
    recommend, material = e["recommend"], e["material"]
    if recommend is not None and material is not None:
        try:
            said = json.loads(material)
        except ValueError:
            said = []
        return recommend, [m for m in said if isinstance(m, str)] if isinstance(said, list) else []
    last = store.conn.execute(
        "SELECT c.kind, p.rationale FROM cycle_events c JOIN review_pairs p ON p.job_id = c.job_id "
        "AND p.note_path = c.note_path AND p.gate_id = c.gate_id WHERE c.model_partition = ? "
        "AND c.note_path = ? AND c.gate_id = ? AND c.at <= ? AND ? > 0 ORDER BY c.id DESC LIMIT 1",
        (e["model_partition"], e["note_path"], e["gate_id"], e["raised_at"], e["cycles"]),
    ).fetchone()
    if last is None:
        return recommend or e["reason"], [e["reason"]]
    was = gist(last["rationale"])
    if last["kind"] == "fix-unchanged":
        was = was.rstrip(".") + "; the fixer's last attempt changed nothing"
    return recommend or was, findings(last["rationale"]) or [e["reason"]]


def split_into(store: Store, job_id: int) -> list[int]:
    """The one-pair jobs a split job became."""
    return [
        r[0]
        for r in store.conn.execute(
            "SELECT id FROM review_jobs WHERE parent_job_id = ? ORDER BY id", (job_id,)
        )
    ]


def new_job_words(store: Store, job_id: int) -> str | None:
    """The commands that make a new job of a failed review job's pairs still free (in no
    open job, decided by no later one, under no open escalation), as a clause; None when
    none is. A failed ``finalize`` or ``run-job`` frees them (CONTRACT §5), and "failed
    already; finalizing it again is refused" left a person with a mended output and no job
    to give it to. With every pair free, the new job's sentinel lines are the old one's."""
    job = store.conn.execute(
        "SELECT kind, status, model_partition, grouping FROM review_jobs WHERE id = ?",
        (job_id,),
    ).fetchone()
    if job is None or job["kind"] != "review" or job["status"] != "failed":
        return None
    free = store.conn.execute(
        "SELECT DISTINCT p.note_path, p.gate_id FROM review_pairs p WHERE p.job_id = ? "
        "AND NOT EXISTS (SELECT 1 FROM review_pairs q JOIN review_jobs o ON o.id = q.job_id "
        "WHERE q.note_path = p.note_path AND q.gate_id = p.gate_id "
        "AND o.model_partition = ? AND (o.status IN ('queued', 'running') "
        "OR (q.job_id > p.job_id AND q.decision IS NOT NULL))) "
        "AND NOT EXISTS (SELECT 1 FROM escalations e WHERE e.note_path = p.note_path "
        "AND e.gate_id = p.gate_id AND e.model_partition = ? AND e.decision IS NULL)",
        (job_id, job["model_partition"], job["model_partition"]),
    ).fetchall()
    if not free:
        return None
    gates = " ".join(shlex.quote(g) for g in sorted({r["gate_id"] for r in free}))
    paths = sorted({r["note_path"] for r in free})
    notes = " ".join(f"--note {shlex.quote(n)}" for n in paths)
    grouping = job["grouping"] if job["grouping"] in GROUPINGS else GROUPINGS[0]
    # One job of all its notes: create-jobs' default batch is five, and a job of more
    # (a sweep's batch_size) was made again as two that its mended output fits neither.
    batch = f" --batch-size {len(paths)}" if grouping == "gate" else ""
    return (
        f"its pairs are free for a new job: reviewq select {gates} {notes} "
        f"--model {shlex.quote(job['model_partition'])} --json "
        f"| reviewq create-jobs --input - --grouping {grouping}{batch}"
    )


def split_words(store: Store, job_id: int) -> str:
    """What a person asking to finalize or run a split job is told instead."""
    parts = ", ".join(map(str, split_into(store, job_id)))
    return f"job {job_id} was split into job(s) {parts}: finalize or run-job those"
