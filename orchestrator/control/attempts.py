"""The database side of an attempt: opening it (the fence), and recording how it ended.

An attempt gets its own folder, ``attempt-N/``, with its own prompt (carrying the last
attempt's reasons on a retry) and its own output path, so a superseded attempt that is
still running somewhere can never write over the current one's output.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from orchestrator.config import QueueSettings, ReviewerProfile
from orchestrator.cycles.fixes import render_fix_prompt
from orchestrator.regularfile import private
from orchestrator.review.jobs import display_path, load_job_items, render_job_prompt
from orchestrator.review.prompts import render_retry, template
from orchestrator.state.files import (
    atomic_write,
    open_own_folder,
    set_aside,
    write_job_files_after_commit,
)
from orchestrator.state.status import FAILED_SQL, split_words
from orchestrator.state.store import (
    Store,
    parse_timestamp,
    reasons_column,
    storable_number,
    timestamp,
    utcnow,
)
from orchestrator.state.words import NOT_THE_JOBS


class AttemptError(ValueError):
    pass


class JobMoved(AttemptError):
    """The job is no longer in a state this attempt may be opened from (finalized, failed
    or taken by another runner since it was picked)."""


@dataclass(frozen=True)
class OpenedAttempt:
    job_id: int
    attempt: int
    kind: str
    model_partition: str
    job_dir: Path
    attempt_dir: Path
    prompt_path: Path
    output_path: Path
    guarded: tuple[str, ...]  # the notes and gates the agent must not change
    # Folders in which a fixer may change no file at all but its note (it has write access).
    trees: tuple[str, ...] = ()
    prompt: str = ""
    # What an agent reads besides its prompt: the job's pairs (its MANIFEST.json) and, for
    # a fix, the note's path and the text the fixer was given.
    pairs: tuple[dict, ...] = ()
    note_path: str | None = None
    note_text: str | None = None
    output_shown: str = ""  # the output path as the prompt names it
    opened_at: str = ""  # attempts.started_at: what its messages carry (opened_elsewhere)


def open_attempt(
    store: Store,
    state_dir: Path,
    root: Path,
    job_id: int,
    runner: str,
    outcome: str = "running",
    partition: str | None = None,
    statuses: tuple[str, ...] = ("queued", "running"),
    note_roots: tuple[str, ...] = (),
) -> OpenedAttempt:
    """Move a queued job to running under a new attempt number and write its prompt.
    ``outcome`` is ``dispatched`` when the attempt goes to a queue worker, which reports
    back when it has launched the agent (its first heartbeat, a second after the launch,
    or the outcome of an agent that ended sooner).
    With ``partition`` (the runner's), a job of another partition is refused: its
    decisions would be recorded under the wrong model. A fix job records no decision
    (its fixer may write another partition, as the queue allows), so any profile runs it.
    ``statuses``: what the job may be (dispatch takes only queued jobs); otherwise
    :class:`JobMoved`. ``note_roots``: the KB's, every one watched while the agent runs."""
    with store.write():
        # Read under the write lock: a finalize that committed after a read taken before
        # it would be reopened here, and the job accepted twice.
        job = store.conn.execute("SELECT * FROM review_jobs WHERE id = ?", (job_id,)).fetchone()
        if job is None:
            raise AttemptError(f"no review job {job_id}")
        if job["status"] == "split":  # its pairs are its parts', whoever asks
            raise JobMoved(split_words(store, job_id))
        if partition is not None and job["kind"] != "fix" and job["model_partition"] != partition:
            raise AttemptError(
                f"reviewer {runner} writes partition {partition}, "
                f"but job {job_id} belongs to {job['model_partition']}"
            )
        if job["status"] not in statuses:
            raise JobMoved(
                f"job {job_id} is {job['status']}; only {' or '.join(statuses)} jobs run"
            )
        folder = state_dir / job["job_dir"]
        now = utcnow()
        attempt = store.conn.execute(
            "UPDATE review_jobs SET attempt = attempt + 1, status = 'running', updated_at = ? "
            "WHERE id = ? RETURNING attempt",
            (now, job_id),
        ).fetchone()[0]
        # An older attempt still marked running is superseded by this one.
        store.conn.execute(
            "UPDATE attempts SET outcome = 'superseded', ended_at = COALESCE(ended_at, ?) "
            "WHERE job_id = ? AND outcome IN ('running', 'dispatched')",
            (now, job_id),
        )
        store.conn.execute(
            "INSERT INTO attempts (job_id, attempt, runner, outcome, started_at, heartbeat_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (job_id, attempt, runner, outcome, now, now),
        )
        previous = (
            store.conn.execute(
                "SELECT attempt, reasons FROM attempts WHERE job_id = ? AND attempt < ? AND outcome IN "
                f"({FAILED_SQL}) ORDER BY attempt DESC LIMIT 1",
                (job_id, attempt),
            ).fetchone()
            if attempt > 1
            else None  # a first attempt has no reasons to carry
        )
        # The prompt is written inside the transaction: a disk that cannot take it (full)
        # leaves the job queued as it was, not running an attempt that has no prompt.
        attempt_dir = folder / f"attempt-{attempt}"
        retry = ""
        reasons = reasons_column(previous["reasons"]) if previous is not None else []
        if reasons:
            retry = render_retry(previous["attempt"], reasons)
        note_text = None
        if job["kind"] == "fix":
            # A fixer's output is the whole new note, not a bundle.
            output = attempt_dir / "fixed-note.md"
            prompt = render_fix_prompt(store, job_id, display_path(root, output), retry)
            rows = store.conn.execute(
                "SELECT p.note_path, p.gate_id, p.gate_path, p.lens, n.text FROM review_pairs p "
                "JOIN snapshots n ON n.id = p.note_snapshot_id WHERE p.job_id = ? ORDER BY p.id",
                (job_id,),
            ).fetchall()
            pairs = tuple(
                {"note_path": r[0], "gate_id": r[1], "gate_path": r[2], "lens": r[3]} for r in rows
            )
            note_text = rows[0][4] if rows else None
            guarded = tuple(sorted({r[0] for r in rows} | {r[2] for r in rows}))
        else:
            output = attempt_dir / "bundle-output.md"
            items = load_job_items(store, job_id)
            if job["kind"] == "audit":
                retry += render_audit_preamble(store, job_id)
            prompt = render_job_prompt(job_id, display_path(root, output), items, retry)
            pairs = tuple(
                {
                    "note_path": i.note_path,
                    "gate_id": i.gate.gate_id,
                    "gate_path": i.gate.path,
                    "lens": i.gate.lens,
                    "watches": list(i.gate.watches),
                }
                for i in items
            )
            guarded = tuple(sorted({i.note_path for i in items} | {i.gate.path for i in items}))
        # A reviewer must leave the whole KB alone, not only the files it was shown: a note
        # it creates or deletes beside them counts as touched too, in every note root.
        trees = tuple(sorted({p.split("/", 1)[0] for p in (*guarded, *note_roots)}))
        prompt_path = attempt_dir / "prompt.md"
        _another_historys(state_dir, attempt_dir, job_id)
        # A queue worker gets the prompt in its message, so the file is only the record:
        # a first review attempt's is the job's prompt.md but for its output path (54 MB
        # a night twice over on a real KB), and is not kept twice. run-job's agent reads it.
        shown = (display_path(root, folder / "bundle-output.md"), display_path(root, output))
        _write_prompt(attempt_dir, prompt, shown if outcome == "dispatched" else None)
    return OpenedAttempt(
        job_id,
        attempt,
        job["kind"],
        job["model_partition"],
        folder,
        attempt_dir,
        prompt_path,
        output,
        guarded,
        trees,
        prompt,
        pairs,
        job["note_path"] if job["kind"] == "fix" else None,
        note_text,
        display_path(root, output),
        now,
    )


def _another_historys(state_dir: Path, attempt_dir: Path, job_id: int) -> None:
    """An attempt's folder that holds more than a prompt as it opens is another history's
    (state.db put back from a backup, or its last commits lost, numbers the attempt
    again): only this transaction writes there before its commit, a prompt, and a
    transaction rolled back leaves that alone. Set aside, not written among."""
    try:
        if attempt_dir.is_symlink() or not attempt_dir.is_dir():
            return  # none, or a link _write_prompt refuses
        with os.scandir(attempt_dir) as entries:
            if all(e.name == "prompt.md" for e in entries):
                return
    except OSError:
        return  # _write_prompt says what is wrong with it
    set_aside(
        state_dir / "jobs",
        attempt_dir,
        f"{attempt_dir.parent.name}.{attempt_dir.name}",
        job_id,
        "an attempt folder state.db does not record (put back from a backup, or its last "
        "commits lost), found where a new attempt of this number goes",
    )


_PROMPT = "an attempt's prompt"
_NOT_RUN = "the job is not run through it"


def _write_prompt(attempt_dir: Path, prompt: str, shown: tuple[str, str] | None) -> None:
    """An attempt's ``prompt.md``, in its own folder made in its job's: either swapped for
    a link to a folder elsewhere (an agent of an earlier attempt) had the prompt, the
    notes' text in it, written out there, and the job run (:class:`LinkedFolder`).
    ``shown``: the job's output path and the attempt's as the prompts name them, when the
    file is a record only; none is written when the job's ``prompt.md`` with the one put
    for the other is this prompt (CONTRACT §2)."""
    try:
        job = open_own_folder(attempt_dir.parent, _PROMPT, then=_NOT_RUN)
    except FileNotFoundError:  # a person deleted it: made again, as its files are
        attempt_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        job = open_own_folder(attempt_dir.parent, _PROMPT, then=_NOT_RUN)
    try:
        # 0700: the prompt quotes the notes, as the job's own 0600 prompt.md does.
        with contextlib.suppress(FileExistsError):
            os.mkdir(attempt_dir.name, 0o700, dir_fd=job)
        data = prompt.encode("utf-8")
        kept = shown is None or _for_attempt(_the_jobs_prompt(job, len(data)), shown) != data
    finally:
        os.close(job)
    folder = open_own_folder(attempt_dir, _PROMPT, depth=2, then=_NOT_RUN)
    try:
        if not kept:
            # One there is not this attempt's (another history's, state.db put back): it
            # was written over before N26, and read as what this attempt's agent was sent.
            with contextlib.suppress(FileNotFoundError):
                os.unlink("prompt.md", dir_fd=folder)
            return
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with open(private("prompt.md", flags, dir_fd=folder), "wb") as f:
            f.write(data)
    finally:
        os.close(folder)


def _for_attempt(prompt: bytes | None, shown: tuple[str, str]) -> bytes | None:
    """The job's prompt with the attempt's output path where it names its own."""
    if prompt is None:
        return None
    job, attempt = (f"`{s}`".encode() for s in shown)
    return prompt.replace(job, attempt)


def _the_jobs_prompt(job: int, limit: int) -> bytes | None:
    """The job's ``prompt.md`` (``job``: its folder's descriptor), if no longer than
    ``limit`` bytes; None when there is none to compare (not yet written, a link). A FIFO
    put there reads as empty, not waited on."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open("prompt.md", flags, dir_fd=job)
    except OSError:
        return None
    with open(fd, "rb") as f:
        data = f.read(limit + 1)
    return data if len(data) <= limit else None


def render_audit_preamble(store: Store, job_id: int) -> str:
    """The audit instruction with the PASS rationales the auditor is asked to refute."""
    rows = store.conn.execute(
        "SELECT a.note_path, a.gate_id, o.rationale FROM review_pairs a JOIN review_jobs j ON j.id = a.job_id "
        "JOIN review_pairs o ON o.job_id = j.source_job_id AND o.note_path = a.note_path AND o.gate_id = a.gate_id "
        "WHERE a.job_id = ? ORDER BY a.id",
        (job_id,),
    ).fetchall()
    rationales = "\n".join(
        f"- `{r[0]}` against `{r[1]}`: " + " ".join((r[2] or "").split())[:800] for r in rows
    )
    return template("audit").substitute(rationales=rationales)


def heartbeat(
    store: Store,
    job_id: int,
    attempt: int,
    worker: str,
    now: str,
    *,
    started_at: str | None = None,
    waiting: bool = False,
) -> str | None:
    """An open attempt is alive: refresh its lease. A running agent's beat moves the
    attempt to running, launched at ``started_at`` (the worker's clock, when it says) or
    now. A ``waiting`` beat comes from a worker that took the message and waits for a free
    agent slot: the attempt stays dispatched, taken. Returns the attempt's outcome now
    (None: no such attempt): a beat from one ``superseded`` or ``lost`` is an agent still
    running for nothing."""
    with store.write():
        if waiting:
            store.conn.execute(
                "UPDATE attempts SET heartbeat_at = ?, worker = ?, taken_at = COALESCE(taken_at, ?) "
                "WHERE job_id = ? AND attempt = ? AND outcome = 'dispatched'",
                (now, worker, now, job_id, attempt),
            )
        else:
            store.conn.execute(
                "UPDATE attempts SET heartbeat_at = ?, worker = ?, "
                "launched_at = COALESCE(launched_at, ?), "
                "outcome = CASE WHEN outcome = 'dispatched' THEN 'running' ELSE outcome END "
                "WHERE job_id = ? AND attempt = ? AND outcome IN ('dispatched', 'running')",
                (now, worker, started_at or now, job_id, attempt),
            )
        row = store.conn.execute(
            "SELECT outcome FROM attempts WHERE job_id = ? AND attempt = ?", (job_id, attempt)
        ).fetchone()
    return row[0] if row is not None else None


def taken(store: Store, gone: list[tuple[int, int]], back: list[tuple[int, int]], now: str) -> None:
    """Attempts still dispatched whose message is ``gone`` from the review queue: a worker
    took it (or the queue lost it). The lease runs from now: the worker's agent beats a
    second after its launch, and its outcome ends it sooner. Those whose message is
    ``back`` on the queue wait there again as any message does."""
    with store.write():
        store.conn.executemany(
            "UPDATE attempts SET taken_at = ?, heartbeat_at = ? "
            "WHERE job_id = ? AND attempt = ? AND outcome = 'dispatched' AND taken_at IS NULL",
            [(now, now, job_id, attempt) for job_id, attempt in gone],
        )
        store.conn.executemany(
            "UPDATE attempts SET taken_at = NULL "
            "WHERE job_id = ? AND attempt = ? AND outcome = 'dispatched'",
            back,
        )


# Of one job, the failures of the machine's kind taken for the machine's while other jobs
# answer; the next are the job's own. A worker's memory or process limit that ends the
# same job's agent again (L43, L44): a job that needs more (a huge note). An agent that
# exits at once without a turn on the same job again (U45): a note that crashes a
# `command` reviewer, a prompt the CLI refuses at once. Taken all as the machine's, such
# a job was tried all night with a backoff, never failed nor named, and five in a row
# paused the profile for every other job.
MACHINES_FAILURES = 2


# A reviewer failure that was the worker's limit, and what a job its agent keeps meeting
# it may need (L45).
NEEDS_MORE = {
    "memory": "more memory than the worker has",
    "pids": "more processes than the worker's pids.max allows",
}
NO_TURNS = " with no turns"  # the worker's words for an agent that ran and asked nothing
_NAMED_JOBS = 5  # a pause's reason names this many jobs the limit ended, then a count


def limit_killed_said(store: Store, name: str, kind: str) -> str:
    """The jobs of the profile ``name`` whose agents the worker's limit ``kind`` ended
    since the profile last answered, each with its note, its count and the command that
    shows it, and what a job its agent alone keeps meeting the limit may need: said in a
    pause's reason (L45 leaves a lone job, or jobs all ended so, waiting through pauses),
    which named the limit only and sent the person to the log for the note. Inside the
    caller's write."""
    said = _jobs_ended_said(store, name, "reviewer-failure", f'["{kind}: %', "the limit ended")
    if not said:
        return ""
    return f"{said}; a job ended so every time while other jobs answer may need {NEEDS_MORE[kind]}"


def crashed_said(store: Store, name: str) -> str:
    """The jobs of the profile ``name`` whose agents exited at once without a turn since
    the profile last answered, as :func:`limit_killed_said` names them: a pause over an
    agent that crashes on a few notes (its jobs the last of a run, where nothing proves
    the worker sound, U45) quoted the crash alone, and the person at 7 a.m. read a broken
    reviewer where one note was at fault. Inside the caller's write."""
    return _jobs_ended_said(
        store, name, "launch-failure", f"%{NO_TURNS}%", "its agent exited at once on"
    )


def _jobs_ended_said(store: Store, name: str, outcome: str, like: str, what: str) -> str:
    """ "since reviewer NAME last answered, WHAT job N (NOTE, K time(s): reviewq job N), …"
    for the profile's attempts of ``outcome`` with reasons ``LIKE like`` since its last
    answer (all of them, for a profile that never answered); "" when there are none."""
    [answered] = store.conn.execute(
        "SELECT max(b.recorded_at) FROM attempts b JOIN review_jobs k ON k.id = b.job_id "
        "WHERE k.reviewer = ? AND b.outcome NOT IN ('launch-failure', 'reviewer-failure', "
        "'dispatched', 'running', 'lost', 'superseded')",
        (name,),
    ).fetchone()
    rows = store.conn.execute(
        "SELECT a.job_id, count(*), (SELECT min(note_path) FROM review_pairs p WHERE "
        "p.job_id = a.job_id), (SELECT count(DISTINCT note_path) FROM review_pairs p WHERE "
        "p.job_id = a.job_id) FROM attempts a JOIN review_jobs j ON j.id = a.job_id "
        "WHERE j.reviewer = ? AND a.outcome = ? AND a.reasons LIKE ? "
        "AND a.recorded_at > ? GROUP BY a.job_id ORDER BY count(*) DESC, a.job_id",
        (name, outcome, like, answered or ""),
    ).fetchall()
    if not rows:
        return ""
    jobs = [
        f"job {job_id} ({note or 'no note'}"
        + (f" and {notes - 1} more note(s)" if notes > 1 else "")
        + f", {n} time(s): reviewq job {job_id})"
        for job_id, n, note, notes in rows[:_NAMED_JOBS]
    ]
    if len(rows) > _NAMED_JOBS:
        jobs.append(f"{len(rows) - _NAMED_JOBS} more job(s)")
    # A profile that never answered has no "last": every one so far is listed.
    since = (
        f"since reviewer {name} last answered"
        if answered
        else f"reviewer {name} has not answered yet"
    )
    return f"{since}, {what} {', '.join(jobs)}"


def limit_kills(store: Store, job_id: int, reviewer: str, worker: object, kind: str) -> int:
    """How many attempts of the job the worker's limit ``kind`` ended (a reason ``memory:``,
    ``pids:``), counted as :func:`own_failures` counts: a limit no agent fits in is the
    worker's alone, and failing every job for it a verdict on notes nobody read."""
    return own_failures(store, job_id, reviewer, worker, f'["{kind}: %')


def own_failures(store: Store, job_id: int, reviewer: str, worker: object, like: str) -> int:
    """How many attempts of the job failed on ``worker`` with reasons ``LIKE like`` (kept
    so when they became its ``no-output``), when an agent of another job of the profile
    ``reviewer``, dispatched after the last of them, has answered on that worker; 0 when
    none has. The worker, not its host nor any: two workers may differ in their PATH,
    HOME or limits (C28, C31). After the last, not the first: counted from one of an
    earlier night, an outage made the job its own at its second failure where none
    answered (C27). Dispatched after it (a greater attempt id), not recorded after it:
    agents launched before the machine broke answer for minutes after (C30), and the ids
    are one sequence where two clocks may not agree."""
    if not isinstance(worker, str) or not worker:
        return 0
    [n] = store.conn.execute(
        "WITH k AS (SELECT count(*) AS n, max(id) AS last FROM attempts WHERE job_id = ?1 "
        "AND outcome IN ('launch-failure', 'reviewer-failure', 'no-output') "
        "AND reasons LIKE ?4 AND worker = ?2) "
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM k, attempts a JOIN review_jobs j ON j.id = a.job_id "
        "WHERE a.id > k.last AND a.job_id != ?1 AND j.reviewer = ?3 "
        "AND a.outcome IN ('output', 'finalized') AND a.worker = ?2) "
        "THEN k.n ELSE 0 END FROM k",
        (job_id, worker, reviewer, like),
    ).fetchone()
    return n


def own_crashes(store: Store, job_id: int, reviewer: str, worker: object) -> int:
    """How many attempts of the job ended so (a launch failure ``NO_TURNS``, or the
    ``no-output`` it became), counted as :func:`own_failures` counts: an agent broken on
    that worker is the worker's, whatever job it met."""
    return own_failures(store, job_id, reviewer, worker, f"%{NO_TURNS}%")


def the_jobs_own(
    store: Store, job_id: int, reviewer: str, worker: object, outcome: str, reasons: list[str]
) -> list[str] | None:
    """The reasons of a failure of the machine's kind (``outcome``, ``reasons``) that is
    the job's own by :data:`MACHINES_FAILURES`, saying why, for a ``no-output`` counted
    against it so that it fails and the profile does not pause over it; None when it
    stays the machine's. Inside the caller's write."""
    first = reasons[0] if reasons else ""
    kind = first.partition(": ")[0]
    if outcome == "reviewer-failure" and kind in NEEDS_MORE:
        kills = limit_kills(store, job_id, reviewer, worker, kind)
        if kills >= MACHINES_FAILURES:
            return [
                f"{kind}: ended by the worker's limit {kills + 1} times: this job may need "
                f"{NEEDS_MORE[kind]}; {first[len(kind) + 2 :]}"
            ]
    elif outcome == "launch-failure" and NO_TURNS in first:
        crashes = own_crashes(store, job_id, reviewer, worker)
        if crashes >= MACHINES_FAILURES:
            return [
                f"{first}; ended so on this job {crashes + 1} times on worker {worker}, "
                f"where other jobs of {reviewer} answered since: the job's own, most likely",
                *reasons[1:],
            ]
    return None


def record_end(
    store: Store,
    job_id: int,
    attempt: int,
    outcome: str,
    *,
    exit_code: int | None = None,
    ended_at: str | None = None,
    reasons: list[str] | None = None,
    telemetry: dict | None = None,
    duration_s: float | None = None,
) -> None:
    t = telemetry or {}
    with store.write():
        store.conn.execute(
            "UPDATE attempts SET outcome = ?, exit_code = ?, ended_at = ?, reasons = ?, num_turns = ?, "
            "input_tokens = ?, output_tokens = ?, cost_usd = ?, duration_s = ?, session_id = ?, "
            "error_subtype = ?, telemetry_json = ? WHERE job_id = ? AND attempt = ?",
            (
                outcome,
                exit_code,
                ended_at or utcnow(),
                json.dumps(reasons or []),
                _spent(t.get("num_turns")),
                _spent(t.get("input_tokens")),
                _spent(t.get("output_tokens")),
                _spent(t.get("cost_usd")),
                duration_s,
                t.get("session_id"),
                t.get("error_subtype"),
                json.dumps(t) if t else None,
                job_id,
                attempt,
            ),
        )


def supersede(store: Store, job_id: int, attempt: int, telemetry: object = None) -> str | None:
    """The end of an attempt that is no longer the job's current one (the reaper took it
    for lost, or another ran meanwhile): what its agent spent is kept, for status, `job N`
    and budgets, and a live one is marked superseded; nothing else of the job changes.
    Returns the attempt's outcome now (None: no such attempt)."""
    t = telemetry if isinstance(telemetry, dict) else {}
    with store.write():
        store.conn.execute(
            "UPDATE attempts SET outcome = CASE WHEN outcome IN ('dispatched', 'running') "
            "THEN 'superseded' ELSE outcome END, ended_at = COALESCE(ended_at, ?), "
            "cost_usd = COALESCE(cost_usd, ?), input_tokens = COALESCE(input_tokens, ?), "
            "output_tokens = COALESCE(output_tokens, ?), num_turns = COALESCE(num_turns, ?) "
            "WHERE job_id = ? AND attempt = ?",
            (
                utcnow(),
                _spent(t.get("cost_usd")),
                _spent(t.get("input_tokens")),
                _spent(t.get("output_tokens")),
                _spent(t.get("num_turns")),
                job_id,
                attempt,
            ),
        )
        row = store.conn.execute(
            "SELECT outcome FROM attempts WHERE job_id = ? AND attempt = ?", (job_id, attempt)
        ).fetchone()
    return row[0] if row is not None else None


def lose(store: Store, job_id: int, attempt: int, reason: str) -> None:
    """The attempt is lost (its worker or its run-job gone) and the job queued again, for
    the next dispatch: in the caller's transaction."""
    store.conn.execute(
        "UPDATE attempts SET outcome = CASE WHEN outcome IN ('dispatched', 'running') THEN 'lost' "
        "ELSE outcome END, ended_at = COALESCE(ended_at, ?), reasons = COALESCE(reasons, ?) "
        "WHERE job_id = ? AND attempt = ?",
        (utcnow(), json.dumps([reason]), job_id, attempt),
    )
    store.conn.execute(
        "UPDATE review_jobs SET status = 'queued', updated_at = ? WHERE id = ? AND status = 'running'",
        (utcnow(), job_id),
    )


def is_current(store: Store, job_id: int, attempt: int) -> bool:
    """Whether ``attempt`` is the running job's current attempt: only its end decides."""
    row = store.conn.execute(
        "SELECT attempt, status FROM review_jobs WHERE id = ?", (job_id,)
    ).fetchone()
    return row is not None and row[0] == attempt and row[1] == "running"


def opened_elsewhere(store: Store, msg: dict) -> str | None:
    """When ``msg`` (a heartbeat or outcome) names an attempt this state.db opened at
    another time than the review message it answers: the time recorded here (None: take
    it). state.db put back from a backup, or its last commits lost to a power cut, hands
    out its job ids and attempt numbers again, while the queues still hold the lost
    history's messages: one of those is another prompt's run. The opening's time, to the
    millisecond, is what a reused id cannot match; a message without it (a worker of an
    earlier release) is taken as before, and so is one of an attempt not recorded here
    (an unknown job or attempt, said where it is handled)."""
    opened = msg.get("opened_at")
    if not isinstance(opened, str):
        return None
    row = store.conn.execute(
        "SELECT started_at FROM attempts WHERE job_id = ? AND attempt = ?",
        (msg.get("job_id"), msg.get("attempt")),
    ).fetchone()
    return row[0] if row is not None and row[0] != opened else None


def is_over(store: Store, job_id: int, attempt: int) -> bool:
    """Whether no beat moves ``attempt`` any more: its outcome is recorded (or it is gone)."""
    row = store.conn.execute(
        "SELECT outcome FROM attempts WHERE job_id = ? AND attempt = ?", (job_id, attempt)
    ).fetchone()
    return row is None or row[0] not in ("dispatched", "running")


def _spent(value: object) -> float | None:
    """A count or a cost from telemetry, or None (:func:`storable_number`)."""
    return value if storable_number(value) else None


def write_attempt_files(attempt_dir: Path, files: dict[str, bytes]) -> None:
    """What a worker reported of an attempt (its output, log tails, telemetry), kept in the
    attempt's folder as evidence, as a local agent would have left it. Names are checked
    by the caller; each file appears whole or not at all. Written in the folder itself:
    one it or its job's folder was swapped for while the attempt ran (a link to a
    folder elsewhere) had the files of the same names out there written over."""
    folder = open_own_folder(
        attempt_dir, "an attempt's files", depth=2, then="they are left unwritten (evidence only)"
    )
    try:
        for name, data in files.items():
            atomic_write(attempt_dir / name, data, dir_fd=folder)
    finally:
        os.close(folder)


def set_outcome(
    store: Store, job_id: int, attempt: int, outcome: str, reasons: list[str] | None = None
) -> None:
    """What the control side judged of an attempt whose end is already recorded."""
    with store.write():
        store.conn.execute(
            "UPDATE attempts SET outcome = ?, reasons = COALESCE(?, reasons) "
            "WHERE job_id = ? AND attempt = ?",
            (outcome, json.dumps(reasons) if reasons else None, job_id, attempt),
        )


def fail_job(
    store: Store, state_dir: Path, job_id: int, reasons: list[str], runner: str | None = None
) -> None:
    """``runner``: the profile run-job ran it with, recorded as finalize records it: a
    create-jobs job (no reviewer) failed so was no one's in `jobs`, `job N` and the page."""
    with store.write():
        now = utcnow()
        row = store.conn.execute(
            "UPDATE review_jobs SET status = 'failed', failure_reasons = ?, updated_at = ?, "
            "finished_at = ?, runner = COALESCE(?, runner) "
            "WHERE id = ? AND status IN ('queued', 'running') RETURNING job_dir",
            (json.dumps(reasons), now, now, runner, job_id),
        ).fetchone()
        if row is not None:
            # Marked due in the transaction that fails the job: a crash right after its
            # commit must still leave the files to write.
            write_job_files_after_commit(store, state_dir, job_id)


@dataclass(frozen=True)
class Backoff:
    """What a failure that was not the job's (its agent did not start, or no model
    answered it) left: the job's wait, and the profile's pause, if any."""

    delay: float  # seconds the job waits before its next try (its not_before)
    paused_until: str | None  # the profile's pause, this failure's or an earlier one's
    # Set when this failure paused the profile: since when it is paused (an earlier pause
    # that ran out with no answer since, else now).
    paused_at: str | None
    count: int  # the profile's failures in a row, this one included
    reason: str  # the pause's reason, as stored
    not_before: str  # now + delay, as stored

    @property
    def paused_longer(self) -> bool:
        """Whether the pause ends after the job's own backoff. Dispatch waits for both, and
        a pause as short as a Retry-After asked for can end first."""
        return self.paused_until is not None and self.paused_until >= self.not_before

    @property
    def when(self) -> dict:
        """When the job runs again, as the log says it."""
        if self.paused_longer:
            return {"waits_for_pause_until": self.paused_until}
        return {"retry_in_s": self.delay}

    def wait_s(self, now: datetime) -> float:
        """Seconds from ``now`` until the job can run again."""
        if self.paused_longer:
            return max(self.delay, (parse_timestamp(self.paused_until) - now).total_seconds())
        return self.delay


def not_the_jobs(launch: bool, profile: ReviewerProfile | None, host: str | None) -> str:
    """Whose failure a pause names: the agent that did not start, or the profile's kind
    (an ``openai`` profile has no CLI to look for), and on which machine."""
    what = (
        "its agent failed to start"
        if launch
        else NOT_THE_JOBS.get(profile.kind if profile else "", NOT_THE_JOBS["cli"])
    )
    if host:  # which machine to mend, when workers run on several
        what += f" on {host}"
    return what


def back_off(
    store: Store,
    q: QueueSettings,
    job_id: int,
    name: str,
    what: str,
    reasons: list[str],
    now: datetime,
    retry_after: float | None = None,
) -> Backoff:
    """Queue the job again after a failure that was not its own, counting it against the
    profile ``name``, which pauses once ``launch_failures_before_pause`` come in a row.
    One helper for the control and ``run-job``: a person's run-job that met the same
    failure left the profile unpaused, and their next run, or the control, hit the
    endpoint again at once. ``retry_after``: the seconds the endpoint asked for (its
    Retry-After); the job waits at least that long, and a pause lasts that long, each
    within ``pause_seconds``. Inside the caller's write."""
    launches = store.conn.execute(
        "SELECT launch_failures FROM review_jobs WHERE id = ?", (job_id,)
    ).fetchone()
    n = (launches[0] if launches else 0) + 1
    # The doubling stops at the cap: a float power overflowed past ~1,000 failures
    # of one job (an expired login for days), and every outcome of it was rolled back.
    delay = min(300.0, q.launch_backoff_seconds * 2 ** min(n - 1, 32))
    # The server said when to come back: sooner was refused again, and later kept the
    # profile paused for pause_seconds after a one-second rate limit.
    asked = None if retry_after is None else min(retry_after, q.pause_seconds)
    if asked is not None:
        delay = max(delay, asked)
    not_before = timestamp(now + timedelta(seconds=delay))
    store.conn.execute(
        "UPDATE review_jobs SET status = 'queued', launch_failures = ?, not_before = ?, "
        "updated_at = ? WHERE id = ? AND status = 'running'",
        (n, not_before, utcnow(), job_id),
    )
    # An attempt dispatched before its reviewer paused, failing after: its job
    # waits for the pause's end, not for its backoff.
    row = store.conn.execute(
        "SELECT paused_until FROM reviewer_state WHERE name = ? AND paused_until > ?",
        (name, timestamp(now)),
    ).fetchone()
    paused_until = row[0] if row else None
    count = store.conn.execute(
        "INSERT INTO reviewer_state (name, launch_failures, updated_at) VALUES (?, 1, ?) "
        "ON CONFLICT (name) DO UPDATE SET launch_failures = launch_failures + 1, "
        "updated_at = excluded.updated_at RETURNING launch_failures",
        (name, utcnow()),
    ).fetchone()[0]
    reason = f"{what}: {'; '.join(reasons)}" if reasons else what
    paused_at = None
    if count >= q.launch_failures_before_pause and paused_until is None:
        paused_at = timestamp(now)
        # Paused again with no answer since the last pause ran out (answered() clears it):
        # one outage, said since its first pause. "Paused since" the last of them read a
        # night's outage as a quarter of an hour old.
        (since,) = store.conn.execute(
            "SELECT COALESCE(paused_at, ?) FROM reviewer_state WHERE name = ?", (paused_at, name)
        ).fetchone()
        kind = reasons[0].partition(": ")[0] if reasons else ""
        if kind in NEEDS_MORE and (killed := limit_killed_said(store, name, kind)):
            reason += f"; {killed}"
        elif reasons and NO_TURNS in reasons[0] and (crashed := crashed_said(store, name)):
            reason += f"; {crashed}"
        pause = q.pause_seconds if asked is None else max(asked, q.launch_backoff_seconds)
        paused_until = timestamp(now + timedelta(seconds=pause))
        store.conn.execute(
            "UPDATE reviewer_state SET paused_until = ?, paused_reason = ?, "
            "paused_at = ?, launch_failures = 0 WHERE name = ?",
            (paused_until, reason, since, name),
        )
        paused_at = since
    return Backoff(delay, paused_until, paused_at, count, reason, not_before)


def log_paused(log, name: str, off: Backoff, **extra: object) -> None:  # noqa: ANN001 - a logger
    """``reviewer.paused``, the line that says a profile stopped being dispatched."""
    log.error(
        "reviewer.paused",
        reviewer=name,
        paused_since=off.paused_at,
        paused_until=off.paused_until,
        launch_failures=off.count,
        reason=off.reason,
        **extra,
    )


def answered(store: Store, name: str) -> None:
    """The profile ``name`` ran an attempt that was not its failure: its count of failures
    in a row starts over. Inside the caller's write."""
    # A pause that ran out is over once the profile answers: the next one starts anew
    # (back_off keeps paused_at until then, for a pause after pause with no answer).
    now = utcnow()
    store.conn.execute(
        "UPDATE reviewer_state SET launch_failures = 0, paused_at = CASE WHEN paused_until > ? "
        "THEN paused_at END WHERE name = ? AND (launch_failures > 0 OR (paused_at IS NOT NULL "
        "AND NOT COALESCE(paused_until > ?, 0)))",
        (now, name, now),
    )
