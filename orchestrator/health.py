"""What ``reviewq doctor`` reads of the state folder and state.db on the control's machine
(CONTRACT §10): each finding is said through the command's ``report`` (ok or a problem)
and ``warning``; the command prints them. Above the sweeps, cycles and state it reads, and
beside the control process and the report, neither of which it needs."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

from orchestrator.cycles.escalations import missing_reports, reports_due
from orchestrator.state.files import (
    LOST_HISTORY,
    NOT_TRIED,
    files_due,
    first_failure,
    missing_job_files,
    unrecorded_job_folders,
    written_when,
)
from orchestrator.state.status import pause_words, paused_reviewers, unwritten_fixes
from orchestrator.state.store import (
    STATE_ENTRIES,
    NotOurs,
    control_pid,
    damaged_words,
    is_damage,
    utcnow,
)
from orchestrator.state.workspace import Workspace

Report = Callable[[bool, str], None]


def state_folder(
    ws: Workspace,
    report: Report,
    warning: Callable[[str], None],
    not_writable: Callable[[Path], str],
) -> bool:
    """The state folder's entries can be written, state.db opens whole, and the files it
    decided are on disk. False when the folder is another program's (no SQLite queue is
    made in it). ``not_writable``: why this user may not write a path, in the workers'
    words (the worker's own check says it the same way)."""
    # Run as the service user, doctor said all was well of a state folder whose lock, log
    # or job folders that user could not write: the control crashed at its start.
    for name in (".", *STATE_ENTRIES):
        path = ws.state_dir / name
        if path.exists() and not os.access(path, os.W_OK):
            report(False, not_writable(path))
    try:
        new = not (ws.state_dir / "state.db").exists()
        store = ws.store
        damage = store.damage()
        if damage is not None:
            report(False, damaged_words(ws.state_dir, damage))
            return True
        report(
            True,
            f"state.db created at {store.path}: nothing had run with this state folder "
            "(is --state right?)"
            if new
            else f"state.db at {store.path}, schema {store.schema_version()}",
        )
        missing = (missing_job_files(store, ws.state_dir), missing_reports(store, ws.state_dir))
        if any(missing):
            report(
                False,
                f"{missing[0]} queued or running job folder(s) and {missing[1]} open "
                "escalation report(s) are missing their files; reviewq rewrite-files writes "
                "them again from state.db",
            )
        unrecorded = unrecorded_job_folders(store, ws.state_dir)
        if unrecorded:
            # A warning: the folders stay until jobs of those numbers come, and a health
            # check that failed until then would be ignored.
            named = ", ".join(f"review-job-{i}" for i in unrecorded[:3])
            warning(
                f"{ws.state_dir / 'jobs'} holds {len(unrecorded)} folder(s) of jobs "
                f"state.db does not record ({named}{', …' if len(unrecorded) > 3 else ''}): "
                "state.db was put back from a backup or lost its last commits; their reviews "
                "are not in status, the report or select, and a new job given one of those "
                f"numbers moves its folder to {LOST_HISTORY}/"
            )
        try:
            control = control_pid(ws.state_dir) is not None
        except OSError:
            control = True  # a lock that cannot be read: said as it always was
        due, error = files_due(store)
        then = written_when(error, "reviewq rewrite-files writes them at once", control)
        # Not yet tried is no problem (a transaction just committed, or a migration marked
        # them): the next tick writes them. A write that failed is one.
        report(
            due == 0 or error == NOT_TRIED,
            "job files written"
            if due == 0
            else f"{due} job(s) whose MANIFEST.json and results wait to be written "
            f"({error}); {then}",
        )
        # Its jobs held back for as long as it lasts: the health check said "ok" of it.
        for name, pause in sorted(paused_reviewers(store, utcnow()).items()):
            report(False, pause_words(store, name, pause))
        # Files decided in state.db and not yet on disk: said, since nothing else shows them.
        fixes = unwritten_fixes(store)
        for what, (n, why) in (
            ("fixed note(s)", (len(fixes), first_failure([f["error"] for f in fixes]))),
            ("escalation report(s)", reports_due(store)),
        ):
            if n:
                rewrite = "reviewq rewrite-files writes them at once" if "report" in what else None
                report(
                    why == NOT_TRIED,
                    f"{n} {what} wait to be written ({why}); "
                    + written_when(why, rewrite, control),
                )
    except sqlite3.DatabaseError as exc:
        report(
            False, damaged_words(ws.state_dir, str(exc)) if is_damage(exc) else f"state.db: {exc}"
        )
    except NotOurs as exc:
        report(False, f"state.db: {exc}")
        return False  # another program's folder: no SQLite queue is made in it
    except Exception as exc:
        report(False, f"state.db: {exc}")
    return True
