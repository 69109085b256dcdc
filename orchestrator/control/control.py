"""The control process's decisions (CONTRACT §6): dispatch, outcomes, retries, splits,
reviewer pauses and the reaper.

The control process is the one writer of state.db on the hot path. This module knows
nothing of Huey: review messages leave through the ``send_review`` callable it is given,
and the queue layer (``workers.tasks``) calls :meth:`Control.on_outcome` and friends.

Delivery is at least once, acceptance exactly once: every message names its attempt,
an outcome for any attempt but the job's current one is ignored, and finalize itself is
fenced by attempt inside its transaction.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

from orchestrator import logs
from orchestrator.config import ConfigError, ReviewerProfile
from orchestrator.control import messages
from orchestrator.control.attempts import (
    JobMoved,
    OpenedAttempt,
    answered,
    back_off,
    fail_job,
    heartbeat,
    is_current,
    is_over,
    log_paused,
    lose,
    not_the_jobs,
    open_attempt,
    opened_elsewhere,
    record_end,
    supersede,
    taken,
    the_jobs_own,
    write_attempt_files,
)
from orchestrator.cycles.escalations import (
    mark_reports_due,
    record_decisions,
    write_due_reports,
)
from orchestrator.cycles.fixes import (
    changes_not_the_agents,
    judged_without_the_change,
    write_due_fixes,
)
from orchestrator.review.bundle import condensed
from orchestrator.review.finalize import FinalizeError, Provenance, finalize
from orchestrator.review.jobs import display_path, prompt_renderer, split_job
from orchestrator.state.files import (
    DISK_FULL,
    NOT_TRIED,
    flock_holder,
    held,
    held_job_folders,
    manifest_written,
    mark_job_files_due,
    unwritten_job_folder,
    write_due_job_files,
)
from orchestrator.state.status import (
    FAILED_SQL,
    Pause,
    budgeted_runs_with_queued_jobs,
    keep_stale,
    paused_reviewers,
    reviewers_with_queued_jobs,
    spent_usd,
)
from orchestrator.state.store import (
    Store,
    parse_timestamp,
    storable_number,
    timestamp,
    utcnow,
)
from orchestrator.state.words import NEVER_PICKED_UP, NO_HEARTBEAT
from orchestrator.state.workspace import Workspace

# The worker's events the control logs again from an outcome's ``notices``, and their fields.
RELAYED = {"attempt.kb_stale": ("note_path", "reason"), "attempt.kb_updated": ("reason",)}
NOTICE_CHARS = 1000  # of each of a notice's fields: a worker's line, not its file
PREFETCH = 2  # open attempts per profile = PREFETCH x concurrency; see dispatch()
# ... and QUICK_PREFETCH x concurrency while its agents run shorter than QUICK_S, if two
# runs to the timeout fit in a message's expiry: see _pace and _open_at_most.
QUICK_PREFETCH = 3
QUICK_S = 1.0
# How long past its timeout an agent's run may hold its slot: the worker's kill grace
# (workers.attempt.KILL_GRACE_S, 5 s), its group's reap and its outcome's send.
OVERRUN_S = 10.0
# A job whose folder another process was writing is dispatched again this long after
# (doubled each time it still is, up to reaper_seconds): an enqueue's writer is done in
# milliseconds, and the next tick was a minute away.
HELD_RETRY_S = 0.2

# A clock that counts a suspend and no step of the wall clock (Linux); elsewhere
# CLOCK_MONOTONIC, beside the wall clock, which counts a suspend in any case.
_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)

# The jobs of the feedback cycle (CONTRACT §7), which dispatch takes before a reviewer's
# first reviews: a fix (a person's redo too) and a re-review of one (a one-pair job split
# from it keeps its source). Not an audit: its PASS stands meanwhile, no FAIL waits on it.
# Word for word the review_jobs_cycle_queued index's term: SQLite reads a partial index
# only for a query that has it.
CYCLE_SQL = "(kind = 'fix' OR (kind = 'review' AND source_job_id IS NOT NULL))"
# A reviewer's queued jobs that may go now (a launch failure's backoff over, their run's
# budget not spent), by id, of those ``which`` says. Whether its files are due comes with
# the job: a folder written and not due again (the usual case) then costs one look at its
# MANIFEST.json, not three and a read of job_files_due of its own.
QUEUED_SQL = (
    "SELECT id, kind, reviewer, sweep_run_id, model_partition, job_dir, "
    "EXISTS (SELECT 1 FROM job_files_due d WHERE d.job_id = review_jobs.id) AS due "
    "FROM review_jobs WHERE reviewer = ? AND status = 'queued' "
    "AND (not_before IS NULL OR not_before <= ?) AND (sweep_run_id IS NULL "
    "OR sweep_run_id NOT IN (SELECT value FROM json_each(?))) AND {which} ORDER BY id LIMIT ?"
)

# Of a reviewer's queued first reviews (QUEUED_SQL's ``which``, its one more parameter the
# reviewer), those of a note whose fix, queued for the same reviewer, came after them: they
# read the text the fixer will rewrite, so they go with the cycle, before the fix, as id
# order had them. Gone past them, the fix made their verdicts about a text the note no
# longer has (a FAIL stale, no fix, no escalation; a PASS for nothing), each paid for.
# The fixes come from the cycle's index; a note's pairs from review_pairs_key.
HELD_BY_FIX_SQL = (
    "kind = 'review' AND source_job_id IS NULL AND id IN (SELECT p.job_id FROM review_pairs p "
    "JOIN (SELECT note_path, id AS fix_id FROM review_jobs WHERE reviewer = ? "
    f"AND status = 'queued' AND {CYCLE_SQL} AND kind = 'fix') f "
    "ON p.note_path = f.note_path AND p.job_id < f.fix_id)"
)

# The current attempt of each running job: what the reaper looks at.
_REAPABLE = (
    "SELECT a.job_id, a.attempt, a.outcome, a.heartbeat_at, a.started_at, a.taken_at, "
    "a.worker, j.reviewer "
    "FROM attempts a JOIN review_jobs j ON j.id = a.job_id "
    "WHERE j.status = 'running' AND a.attempt = j.attempt"
)


# What a failure to write a job's prompt says of every job after it, and what then
# lets them go on; any other failure is that job's own.
_EVERY_JOB_ALIKE = {
    **dict.fromkeys(DISK_FULL, "free space in the state folder; queued jobs then go on"),
    **dict.fromkeys(
        (errno.EMFILE, errno.ENFILE, errno.ENOMEM),
        "the control process is short of file handles or memory; queued jobs go on when it "
        "has them again",
    ),
}


class Hooks(Protocol):
    """What the control process does after a job ends (CONTRACT §7), called inside the
    transaction that records the outcome; :class:`orchestrator.control.followup.FollowUp`
    is the one implementation. Without hooks a job's outcome is recorded and nothing
    follows (fix outputs are refused)."""

    def after_completed(
        self, job_id: int, job: sqlite3.Row | None = None, decided: list[dict] | None = None
    ) -> None:
        """``job``: its row read in this transaction before finalize (the fields finalize
        writes, its status and provenance, are stale); ``decided``: finalize's
        :attr:`FinalizeResult.decided`. Either not given is read."""
        ...

    def after_failed(self, job_id: int, reasons: list[str], *, at_once: str = "") -> None:
        """``at_once``: how the job failed without using its attempts, or ""."""
        ...

    def fix_output(self, job: sqlite3.Row, output: bytes | None) -> str | None:
        """Apply a fixer's output; a reason when the attempt failed, else None."""
        ...


class Stops(Protocol):
    """A worker's agent asked to stop (``workers.queues.StopRequests``)."""

    def ask(self, job_id: int, attempt: int, reason: str, opened_at: object = None) -> None: ...

    def forget(self, job_id: int, attempt: int) -> None: ...

    def pending(self) -> list[tuple[int, int]]:
        """The (job, attempt) of every request on the queue."""
        ...


class Control:
    def __init__(
        self,
        ws: Workspace,
        send_review: Callable[[dict], None],
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        hooks: Hooks | None = None,
        on_review_queue: Callable[[set[tuple[int, int]]], set[tuple[int, int]] | None]
        | None = None,
        dispatch_in: Callable[[float], None] | None = None,
        stops: Stops | None = None,
        clocks: Callable[[], tuple[float, float]] = lambda: (
            time.time(),
            time.clock_gettime(_BOOTTIME),
        ),
    ) -> None:
        """``on_review_queue``: which of the given (job, attempt) have a message on the
        review queue, or None when the queue cannot be read; without it, an attempt no
        worker spoke of waits lease + timeout before it is reaped, as one still on the
        queue does. ``dispatch_in``: told, once it is recorded, that a queued job may go
        in so many seconds (its launch backoff ends, another process writes its folder),
        so that a dispatch then runs it (without it, the next outcome or tick does, up to
        ``reaper_seconds`` later). ``stops``: how a worker is asked to stop an agent still
        running for an attempt this process no longer wants; without it, such an agent
        runs to its end. ``clocks``: the wall clock and CLOCK_BOOTTIME, read at each reap
        to find the time this process was away (:meth:`_away`)."""
        self.ws = ws
        self.store = ws.store
        self.store.waits_for_folders = False
        self.settings = ws.settings
        self.send_review = send_review
        self.on_review_queue = on_review_queue
        self.dispatch_in = dispatch_in
        self.stops = stops
        # When each request was last asked: said once each, and swept by the reaper once
        # no beat has asked again for a lease.
        self._stops_asked: dict[tuple[int, int], datetime] = {}
        # The attempts of a lost history whose beats were said dropped (job, attempt,
        # opening): said once each, not once a beat (:meth:`_this_history`).
        self._other_history: set[tuple[object, object, object]] = set()
        self.now = now
        self.clocks = clocks
        # The clocks at the last reap, and its time.
        self._looked: tuple[float, float, datetime] | None = None
        # Since when the reaper has watched without a break: silences are counted from it.
        self._watching_since: datetime | None = None
        # The last time this process was away (:meth:`_away`): from its last look before,
        # to its return. A cron sweep whose minute fell in it says so when it is missed.
        self.away: tuple[datetime, datetime] | None = None
        self.hooks = hooks
        self.log = logs.get()
        self._budget_logged: set[int] = set()
        # The profiles reviewq.toml names now, read again only when the file changed (its
        # stat), and those this process said it must be restarted to run.
        self._file_profiles: tuple[object, frozenset[str] | None] | None = None
        self._said_stale: set[str] = set()
        # Jobs whose folder could not be written: (the reason, a full disk), said once each.
        self._folder_failures: dict[int, tuple[str, bool]] = {}
        # Jobs whose folder another process held at the last look: the wait asked then.
        self._held: dict[int, float] = {}
        # Due jobs whose folder was held at the tick's write (when first seen so), and
        # those of them warned of.
        self._held_since: dict[int, datetime] = {}
        self._held_said: set[int] = set()
        # Reviewers whose launch_failures count is 0 in state.db (committed), so that every
        # outcome does not write it again. A run-job counts failures too, from its own
        # process: forgotten whenever another connection has committed since (its
        # data_version, read at each batch).
        self._no_launch_failures: set[str] = set()
        self._quick: set[str] = set()  # reviewers whose last agent ran under QUICK_S (_pace)
        self._data_version: int | None = None
        self._prompt = prompt_renderer(self.store, ws.state_dir, ws.root)

    def paused(self) -> dict[str, Pause]:
        return paused_reviewers(self.store, timestamp(self.now()))

    def _end_pauses(self, now: str) -> None:
        """Say each pause that ran out once (``reviewer.pause_ended``), in the dispatch
        pass's transaction, before the attempts it opens for the jobs the pause held: the
        log said when a reviewer was paused, and nothing when its work went on. A warning,
        as the pause is an error: `logs --level warning` showed the pause and not its end,
        and the agent, unrepaired by anyone, is tried again from here."""
        for name, pause, jobs in end_pauses(self.store, now):
            self.store.after_commit(
                functools.partial(
                    self.log.warning,
                    "reviewer.pause_ended",
                    reviewer=name,
                    paused_since=pause.since,
                    paused_until=pause.until,
                    reason=pause.reason,
                    **logs.held_jobs(jobs),
                )
            )

    def dispatch(self) -> int:
        """Open attempts for queued jobs and send them to the review queue.

        Per profile, up to PREFETCH x ``concurrency`` attempts are open at once (more
        for quick agents: :meth:`_open_at_most`), so the next message already waits in the
        queue when an agent ends; the workers' own per-profile semaphores keep the
        number of agents *running* at ``concurrency``.
        The attempts of one pass are opened in one transaction (a commit each was most
        of an attempt's opening) and their messages sent once it commits: a message
        names an attempt a reader can see.
        """
        with self.store.write():
            opened = self._open_due()
        return self._send_opened(opened)

    def _open_due(
        self, unwritten: list[int] | None = None
    ) -> list[tuple[OpenedAttempt, ReviewerProfile]]:
        """The attempts of one dispatch pass, opened in the caller's transaction. Given
        ``unwritten`` (a pass inside an outcome batch's transaction), a job whose folder
        is not written yet is listed there and left for a pass after the commit."""
        now = timestamp(self.now())
        self._end_pauses(now)
        open_counts = dict(
            self.store.conn.execute(
                "SELECT j.reviewer, count(*) FROM attempts a JOIN review_jobs j ON j.id = a.job_id "
                "WHERE a.outcome IN ('dispatched', 'running') GROUP BY j.reviewer"
            ).fetchall()
        )
        paused = self.paused()
        # Runs that spent their budget are left out of the read itself: read and skipped
        # after it, enough of their jobs in front hid every later job of their reviewer
        # (a job queued by hand, another sweep's), and a sweep waiting on them never ended.
        over_budget: dict[int, bool | None] = {
            run["id"]: True
            for run in budgeted_runs_with_queued_jobs(self.store)
            if self._over_budget(run["id"])  # logs sweep.budget_reached once
        }
        spent = json.dumps(list(over_budget))
        # Per reviewer, only as many queued jobs as it has free slots (plus a margin): the
        # queue can hold thousands, dispatch runs per job.
        jobs = []
        front: set[int] = set()  # the ids of the jobs taken first
        for name in reviewers_with_queued_jobs(self.store):
            profile = self.settings.reviewers.get(name)
            if profile is None and self._added_since(name):
                continue  # waits for the restart it said: not read at each pass (per outcome)
            free = 50 if profile is None else self._open_at_most(profile) - open_counts.get(name, 0)
            if name in paused or free <= 0:
                continue
            # The feedback cycle's jobs first (CYCLE_SQL) with the reviews their fixes
            # follow (HELD_BY_FIX_SQL), then the first reviews, each by id: reads of the
            # reviewer's queue through indexes (the cycle's partial one), cut to its free
            # slots.
            room = free + 16
            cycle = self.store.conn.execute(
                QUEUED_SQL.format(which=CYCLE_SQL), (name, now, spent, room)
            ).fetchall()
            if any(j["kind"] == "fix" for j in cycle):
                cycle += self.store.conn.execute(
                    QUEUED_SQL.format(which=HELD_BY_FIX_SQL), (name, now, spent, name, room)
                ).fetchall()
            front.update(j["id"] for j in cycle)
            jobs += cycle
            if len(cycle) < room:
                jobs += [
                    j
                    for j in self.store.conn.execute(
                        QUEUED_SQL.format(which=f"NOT {CYCLE_SQL}"),
                        (name, now, spent, room),
                    )
                    if j["id"] not in front
                ][: room - len(cycle)]
        if not jobs:
            return []
        jobs.sort(key=lambda j: (j["id"] not in front, j["id"]))
        opened_all: list[tuple[OpenedAttempt, ReviewerProfile]] = []
        for job in jobs:
            name = job["reviewer"]
            profile = self.settings.reviewers.get(name)
            if profile is None:
                self._fail_unrun(job, name, f"reviewer profile {name!r} is not configured")
                continue
            if name in paused or open_counts.get(name, 0) >= self._open_at_most(profile):
                continue
            run_id = job["sweep_run_id"]
            if run_id is not None:
                if run_id not in over_budget:
                    over_budget[run_id] = self._over_budget(run_id)
                if over_budget[run_id]:
                    continue
                if over_budget[run_id] is False and open_counts.get(name, 0) >= profile.concurrency:
                    # A run with a budget is not prefetched: a message waiting in the queue
                    # would start after the budget is reached.
                    continue
            there = not job["job_dir"] or manifest_written(self.ws.state_dir / job["job_dir"])
            if unwritten is not None and not there:
                # Most likely a follow-up this very transaction made: rendered here, a
                # batch rolled back would leave the folder of a job state.db never had.
                # Its slot is kept for it, for the pass after the commit: taken by a job
                # behind it here, a fix waited for that job's run (one at a time, under a
                # budget, as many as a slot allows).
                unwritten.append(job["id"])
                open_counts[name] = open_counts.get(name, 0) + 1
                continue
            # A job made by another process has its folder written after that process's
            # commit; an agent must not start before its MANIFEST.json is there.
            if not self._job_folder_written(job, name, there):
                if self._folder_failures[job["id"]][1]:
                    break  # a full disk: every later job's folder would fail alike
                continue
            if job["kind"] == "review" and job["model_partition"] != profile.partition:
                # Run, its verdicts would be accepted as another model's. A fix records no
                # verdict, and an audit's go to the reviewed job's partition: either runs.
                self._fail_unrun(
                    job,
                    name,
                    f"reviewer profile {name!r} writes partition {profile.partition!r}, not the "
                    f"job's {job['model_partition']!r}: the profile changed since the job was "
                    "queued, or this control process was not restarted after reviewq.toml "
                    "changed; its pairs are free for the next sweep",
                )
                continue
            try:
                opened = open_attempt(
                    self.store,
                    self.ws.state_dir,
                    self.ws.root,
                    job["id"],
                    name,
                    outcome="dispatched",
                    statuses=("queued",),
                    note_roots=self.settings.note_roots,
                )
            except JobMoved:
                continue  # finalized, failed or run by hand since the look above
            except OSError as exc:
                recovery = _EVERY_JOB_ALIKE.get(exc.errno)
                if recovery:
                    # No room for a prompt, or no file handle to write it with: every job
                    # would fail alike, and none should. The job stays queued; the next
                    # dispatch (an outcome, a tick) tries again.
                    self.log.error(
                        "dispatch.deferred",
                        job_id=job["id"],
                        reviewer=name,
                        reason=str(exc),
                        recovery=recovery,
                    )
                    break
                self._cannot_open(job, name, exc)  # a job folder that cannot be written
                continue
            except ValueError as exc:  # a prompt that cannot be made from its snapshots
                self._cannot_open(job, name, exc)
                continue
            # Anything else (state.db locked past the busy timeout) can pass: the pass's
            # transaction rolls back, its jobs are still queued, and the control task that
            # raised is run again.
            open_counts[name] = open_counts.get(name, 0) + 1
            opened_all.append((opened, profile))
        return opened_all

    def _open_at_most(self, profile: ReviewerProfile) -> int:
        """PREFETCH x concurrency, or QUICK_PREFETCH x for a quick reviewer whose third
        message a slot cannot pass its expiry whatever its agents do next. That message
        waits behind two runs: sent while the agents were quick, it was dropped unrun and
        its attempt given up as "never picked up by a worker", its job a lease and a
        timeout late, when they turned slow (a model server that stalls), for each slot:
        the pace says so only at the first slow outcome, after the messages went."""
        runs = 2 * (profile.timeout + OVERRUN_S)
        quick = profile.name in self._quick and runs <= self._ttl_s(profile)
        return (QUICK_PREFETCH if quick else PREFETCH) * profile.concurrency

    def _pace(self, outcomes: list[dict]) -> None:
        """Note whose agents are quick: a reviewer's last outcome came from an agent that
        exited 0 in under QUICK_S. Such agents end again while the control gathers and
        judges their outcomes (workers.tasks.GATHER_S), and those outcomes, waiting on the
        control queue, still count as open attempts: with PREFETCH x concurrency the
        review queue ran dry under them and worker slots waited for the control's next
        batch (stop 32). A slow agent keeps PREFETCH: a third message a slot would wait
        behind two agent runs, longer than its expiry (lease / 2 + timeout) allows. One
        that failed as quickly (not launched, a crash, or exit 0 with no output or an
        unreadable one: a CLI printing its help, an error said on stdout) is no sign of the
        next runs' pace. A hint for dispatch only, so the worker's word (``runner``) is
        taken as it is, for a reviewer this control knows."""
        for o in outcomes:
            runner, took = o.get("runner"), o.get("duration_s")
            if not isinstance(runner, str) or runner not in self.settings.reviewers:
                continue
            if (
                o.get("exit_code") == 0
                and o.get("classification") == "output"
                and isinstance(took, (int, float))
                and 0 <= took < QUICK_S
            ):
                self._quick.add(runner)
            else:
                self._quick.discard(runner)

    def _send_opened(self, opened: list[tuple[OpenedAttempt, ReviewerProfile]]) -> int:
        """Send the messages of attempts whose transaction committed; how many went."""
        sent = 0
        for attempt, profile in opened:
            try:
                self.send_review(self.message(attempt, profile))
            except Exception as exc:
                # This attempt stays 'dispatched' (its message may have gone before the
                # error): the reaper's, as ever. Those after it were never sent: given back
                # now, their jobs queued for the next pass, not stranded for the reaper's
                # ~1.5 leases (a queue that cannot take one now takes no other).
                try:
                    back = self._unsent([a for a, _ in opened[sent + 1 :]])
                except sqlite3.Error:
                    back = []  # left for the reaper too, as the one whose send failed
                self.log.error(
                    "queue.unavailable",
                    job_id=attempt.job_id,
                    attempt=attempt.attempt,
                    error=logs.error_said(exc),
                    requeued=back,
                )
                break
            sent += 1
            self.log.info(
                "attempt.dispatched",
                job_id=attempt.job_id,
                attempt=attempt.attempt,
                reviewer=profile.name,
            )
        return sent

    def _unsent(self, attempts: list[OpenedAttempt]) -> list[int]:
        """Give back attempts whose message was never sent (lost, never launched: counted
        toward nothing), their jobs queued again; the ids of those given back. One a
        person acted on meanwhile (finalize, run-job) is left as it is."""
        back = []
        with self.store.write():
            for a in attempts:
                if is_current(self.store, a.job_id, a.attempt) and not is_over(
                    self.store, a.job_id, a.attempt
                ):
                    lose(self.store, a.job_id, a.attempt, "its review message was not sent")
                    back.append(a.job_id)
        return back

    def _job_folder_written(self, job, reviewer: str, there: bool) -> bool:  # noqa: ANN001 - a row
        """Write a job's folder if it is due or gone (a person deleted it); whether its
        MANIFEST.json is there for the agent. ``there``: whether it was at the caller's
        look, and the row's ``due`` whether job_files_due holds the job, read in this
        transaction. One that cannot be written (a file where it was, a full disk) leaves
        the job queued, tried again at each dispatch and said once per reason: the
        machine's fault is neither the job's nor the profile's. One another process holds
        is no failure: the job is dispatched again shortly (:meth:`_wait_for_writer`)."""
        if not job["job_dir"] or (there and not job["due"]):
            self._written(job["id"])
            return True
        folder = self.ws.state_dir / job["job_dir"]
        if not there and not job["due"]:
            # Gone (a person deleted it). A due row is left as it is: marked again, its
            # writer (an enqueue writing its folders now) no longer cleared it, and the
            # tick wrote the folder a second time.
            mark_job_files_due(self.store, [job["id"]])
        wrote = write_due_job_files(
            self.store, self.ws.state_dir, [job["id"]], self._prompt, late=False
        )
        # Written, its MANIFEST.json is there (the last file written); else why not.
        why = None if wrote else unwritten_job_folder(self.store, folder, job["id"])
        if why is None:
            self._written(job["id"])
            return True
        if held(why):
            self._wait_for_writer(job, reviewer, folder, why)
            return False
        full = any(os.strerror(e) in why for e in DISK_FULL)
        if self._folder_failures.get(job["id"], ("", False))[0] != why:
            self.log.error(
                "dispatch.deferred",
                job_id=job["id"],
                reviewer=reviewer,
                folder=str(folder),
                reason=why,
                recovery=_EVERY_JOB_ALIKE[errno.ENOSPC]
                if full
                else "the job stays queued and is dispatched once its folder can be written: "
                "mend the cause (reviewq rewrite-files writes it at once)",
            )
        self._folder_failures[job["id"]] = (why, full)
        return False

    def _written(self, job_id: int) -> None:
        self._folder_failures.pop(job_id, None)
        self._held.pop(job_id, None)

    def _wait_for_writer(self, job, reviewer: str, folder: Path, why: str) -> None:  # noqa: ANN001 - a row
        """Another reviewq process held the job's folder: it is writing it (an enqueue
        beside this control, whose folders follow its commit: a sweep's control starts at
        that commit; a command run by hand). Routine, so said as info, once; dispatched
        again shortly after (its writer may well not nudge this process), not at the next
        tick a minute later. Not waited for here: this pass holds state.db's write lock,
        which that writer wants once its folders are written."""
        wait = min(
            2 * self._held.get(job["id"], HELD_RETRY_S / 2), self.settings.queue.reaper_seconds
        )
        if job["id"] not in self._held:
            self.log.info(
                "dispatch.deferred",
                job_id=job["id"],
                reviewer=reviewer,
                folder=str(folder),
                reason=why,
                recovery=f"dispatched again in {wait:g} s, once that process has written it",
            )
        self._held[job["id"]] = wait
        self._folder_failures[job["id"]] = (why, False)  # not a full disk: the pass goes on
        if self.dispatch_in is not None:
            wake = self.dispatch_in
            self.store.after_commit(lambda: wake(wait))

    def _cannot_open(self, job, reviewer: str, exc: Exception) -> None:
        """An attempt that can never be opened: fail that job only."""
        self._fail_unrun(job, reviewer, f"could not open an attempt: {exc}")

    def _added_since(self, name: str) -> bool:
        """Whether reviewq.toml configures the profile now, though the settings this
        process read at its start do not: added (or renamed) since. `enqueue` reads the
        file as it is, so its jobs for the new profile were failed at once as "not
        configured" by a control that only had to be restarted. They wait instead, said
        once per profile. A file that cannot be read (saved half-way, the person editing
        on) names nothing for certain: every profile the settings lack waits, unsaid, until
        it can be read again."""
        path = self.settings.config_path or self.settings.root / "reviewq.toml"
        try:
            st = os.stat(path)
            seen: object = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            seen = None
        if self._file_profiles is None or self._file_profiles[0] != seen:
            try:
                now = self.settings.reread()
            except ConfigError:
                # Being edited: what it will name is not known. Taken as naming nothing,
                # the jobs already waiting for a profile it adds were failed mid-edit.
                names = None
            else:
                names = frozenset(now.reviewers) - set(self.settings.reviewers)
            self._file_profiles = (seen, names)
        if self._file_profiles[1] is None:
            return True
        if name not in self._file_profiles[1]:
            return False
        if name not in self._said_stale:
            self._said_stale.add(name)
            with contextlib.suppress(OSError):  # said in the log; status misses it alone
                keep_stale(self.ws.state_dir, self._said_stale, timestamp(self.now()))
            self.log.warning(
                "control.settings_stale",
                reviewer=name,
                config=str(path),
                reason=f"reviewer profile {name!r} was added to {path} after this control "
                "process read it: its jobs wait until the control is restarted",
                recovery="restart the control, or send it SIGHUP (systemctl reload)",
            )
        return True

    def _fail_unrun(self, job, reviewer: str, reason: str) -> None:
        """Fail a job no agent can run, at once: the hooks say what follows. Said once
        the dispatch pass's transaction commits."""
        with self.store.write():
            fail_job(self.store, self.ws.state_dir, job["id"], [reason])
            if self.hooks is not None:
                self.hooks.after_failed(job["id"], [reason], at_once="without starting")
            self.store.after_commit(
                functools.partial(
                    self.log.error, "job.failed", job_id=job["id"], reviewer=reviewer, reason=reason
                )
            )

    def message(self, opened: OpenedAttempt, profile: ReviewerProfile) -> dict:
        """Everything a worker needs, so that it holds nothing: no state.db, no job folder,
        no KB (shapes: :mod:`orchestrator.control.messages`). What this process decides
        (deadline, lease, output limit) travels here; how to start the reviewer is the
        worker's own configuration."""
        lease = self.settings.queue.lease_seconds
        return {
            "v": messages.VERSION,
            # The reaper takes an attempt no worker started within lease + timeout of its
            # opening for lost and opens another: a worker that takes this message later
            # does not start it. Half a lease early, so that neither the time this message
            # took to build nor a worker's clock running a little behind lets an agent
            # start for an attempt already given up (a declined one is reaped as before).
            "expires_at": time.time() + self._ttl_s(profile),
            # The same as a duration, for a worker whose clock is not this machine's: the
            # sender stamps the message with the queue's own clock (queued_at), and the
            # worker reads that clock again (workers.queues.queue_clock).
            "ttl_s": self._ttl_s(profile),
            "job_id": opened.job_id,
            "attempt": opened.attempt,
            # The attempt's opening, which its worker's beats and outcome carry back: a
            # job id and attempt number handed out again (state.db behind its queues) do
            # not match it (optional: a worker of an earlier release sends none).
            "opened_at": opened.opened_at,
            "task": opened.kind,
            "reviewer": profile.name,
            # The partition the reviews are recorded under: a worker whose profile writes
            # another does not start the attempt (optional, as ttl_s: no new version).
            "partition": profile.partition,
            "prompt": opened.prompt,
            "pairs": list(opened.pairs),
            "output_name": opened.output_path.name,
            "output_shown": opened.output_shown,
            "note_path": opened.note_path,
            "note_text": opened.note_text,
            "guarded": list(opened.guarded),
            "trees": list(opened.trees),
            "timeout_s": profile.timeout,
            "lease_s": lease,
            "heartbeat_s": max(0.05, lease / 4),
            "max_output_bytes": self.settings.max_output_bytes,
        }

    def _over_budget(self, run_id: int) -> bool | None:
        """Whether a sweep run has spent its budget; None when it has none."""
        run = self.store.conn.execute("SELECT * FROM sweep_runs WHERE id = ?", (run_id,)).fetchone()
        if run is None or run["budget_usd"] is None:
            return None
        spent = spent_usd(self.store, run_id)
        if spent < run["budget_usd"]:
            return False
        if run_id not in self._budget_logged:
            self._budget_logged.add(run_id)
            self.log.warning(
                "sweep.budget_reached",
                sweep=run["name"],
                sweep_run=run_id,
                spent_usd=round(spent, 4),
                budget_usd=run["budget_usd"],
                note="no new attempt starts; the rest waits for the next run",
            )
        return True

    # --- messages from workers --------------------------------------------------------
    def on_outcome(self, o: dict) -> None:
        """Judge an attempt's outcome and start what follows it (retry, split, fix,
        re-review, escalation) in one transaction, so no reader ever sees a job ended
        with its follow-up not yet queued."""
        self.on_messages([], [o])

    def on_messages(
        self, heartbeats: list[dict], outcomes: list[dict], dispatch: bool = False
    ) -> bool:
        """Heartbeats, then outcomes, that were waiting together, in one transaction: one
        commit for the lot is what lets the control process keep up with fast agents.
        All or nothing: if one fails, none is kept (the caller then takes them one by one).

        With ``dispatch`` (the control queue's task, which dispatches after each batch
        anyway), the next dispatch pass too, at the transaction's end: one commit and one
        look at the queued jobs fewer a batch. Its messages go once the commit makes their
        attempts visible. A pass that fails is undone alone (a savepoint) and False is
        returned, for the caller to run one of its own after the commit; so is a pass that
        met a job whose folder is not written yet (a follow-up of the batch: its files
        follow the commit). True when the pass here left nothing for another."""
        # Before anything is written: another history's outcome must not leave its files
        # in this attempt's folder either.
        heartbeats = [h for h in heartbeats if self._this_history(h, "heartbeat")]
        outcomes = [o for o in outcomes if self._this_history(o, messages.kind_of(o))]
        for o in outcomes:
            self._keep_attempt_files(o)
        self._pace(outcomes)
        with self.store.write():
            # Inside the write: no other commit can come between this and the outcomes.
            (version,) = self.store.conn.execute("PRAGMA data_version").fetchone()
            if version != self._data_version:
                self._no_launch_failures.clear()
                self._data_version = version
            for h in heartbeats:
                started_at = h.get("started_at")
                waiting = h.get("waiting") is True
                now_ = heartbeat(
                    self.store,
                    h["job_id"],
                    h["attempt"],
                    h["worker"],
                    timestamp(self.now()),
                    started_at=started_at if isinstance(started_at, str) and started_at else None,
                    waiting=waiting,
                )
                if (
                    now_ not in (None, "dispatched", "running")
                    and self.stops is not None
                    and not waiting
                ):
                    # Not a waiting beat: no agent runs to stop, the worker reads no request
                    # then, and one left unread stayed for good if the message expired. A
                    # beat from an attempt whose outcome is recorded is a second agent of it
                    # (a send retried after its reply was lost), whose output is discarded,
                    # or a late beat of the agent that ended: the reaper sweeps what that
                    # one's request leaves (:meth:`_sweep_stops`).
                    self.store.after_commit(functools.partial(self._ask_stop, h, now_))
                if h.get("launched"):
                    # Before the outcomes of the batch: an attempt's story reads
                    # dispatched, started, ended even when both waited together.
                    self._log_started(h)
            for o in outcomes:
                self._on_outcome(o)
            if not dispatch:
                return False
            unwritten: list[int] = []
            try:
                # The pass is no message's story: its lines (a sweep's budget reached)
                # must not take the ids the task bound for the batch's first message.
                with logs.unbound("job_id", "attempt"), self.store.write():
                    opened = self._open_due(unwritten)
            except Exception:  # noqa: BLE001 - the caller's own pass meets it again, and says it
                return False
            # After the batch's own callbacks (its job files and lines): their attempts
            # are the older news.
            self.store.after_commit(functools.partial(self._send_opened, opened))
        return not unwritten

    def _this_history(self, msg: dict, kind: str) -> bool:
        """Whether ``msg`` answers the attempt this state.db opened under its ids; one that
        does not is dropped (:func:`opened_elsewhere`), said once for its beats (an agent
        beats every quarter lease: a line a beat told nothing new) and once for its
        outcome. An agent still running for it is asked to stop: whatever it does is
        dropped."""
        recorded = opened_elsewhere(self.store, msg)
        if recorded is None:
            return True
        if kind == "heartbeat" and msg.get("waiting") is not True:
            self._stop_other_history(msg)
        key = (msg.get("job_id"), msg.get("attempt"), msg.get("opened_at"))
        if kind == "heartbeat":
            if key in self._other_history:
                return False
            if len(self._other_history) >= 4096:  # an agent that never sent its outcome
                self._other_history.clear()
            self._other_history.add(key)
        else:
            self._other_history.discard(key)
        self.log.warning(
            "message.other_history",
            message=kind,
            job_id=msg.get("job_id"),
            attempt=msg.get("attempt"),
            worker=msg.get("worker"),
            host=msg.get("host"),
            opened_at=msg.get("opened_at"),
            recorded=recorded,
            reason="it answers an attempt of these ids opened at another time: state.db "
            "was put back from a backup or lost its last commits, and gave the ids again; "
            "dropped (the attempt recorded here waits for its own)",
        )
        return False

    def _stop_other_history(self, h: dict) -> None:
        """Ask the worker of a lost history's agent to stop it, for that opening alone (a
        worker running this history's attempt of the same numbers leaves the request)."""
        if self.stops is None:
            return
        job_id, attempt = h.get("job_id"), h.get("attempt")
        try:
            self.stops.ask(
                job_id,
                attempt,
                "it runs for an attempt of a history state.db no longer has (put back from "
                "a backup, or its last commits lost): its outcome would be dropped",
                opened_at=h.get("opened_at"),
            )
        except Exception as exc:
            self.log.warning("attempt.stop_unsent", job_id=job_id, attempt=attempt, error=str(exc))
            return
        self._stops_asked[job_id, attempt] = self.now()

    def _ask_stop(self, h: dict, outcome: str) -> None:
        """Ask the worker that beat for an attempt no longer wanted to stop its agent, at
        each such beat (a worker takes the request once); said once. A queue that cannot
        take it now is asked again at the next beat."""
        job_id, attempt = h["job_id"], h["attempt"]
        if outcome == "superseded":
            why = "the job was finalized by hand or another attempt replaced this one"
        elif outcome == "lost":
            why = "the control process gave this attempt up as lost and runs the job again"
        else:
            why = f"this attempt's outcome ({outcome}) is recorded: a second agent's is discarded"
        try:
            self.stops.ask(job_id, attempt, why, opened_at=h.get("opened_at"))
        except Exception as exc:
            self.log.warning("attempt.stop_unsent", job_id=job_id, attempt=attempt, error=str(exc))
            return
        first = (job_id, attempt) not in self._stops_asked
        self._stops_asked[job_id, attempt] = self.now()
        if first:
            self.log.info(
                "attempt.stop_asked",
                job_id=job_id,
                attempt=attempt,
                worker=h.get("worker"),
                host=h.get("host"),
                reason=why,
            )

    def _refused_by_worker(self, o: dict) -> None:
        """A worker refused an attempt's review message for its version (one another
        release left on the queue, at an upgrade): that message will never run. Still
        dispatched, the attempt is lost now and its job sent again in this release's
        version, not a lease later; one running meanwhile (a copy of the message another
        worker took) is left to end."""
        job_id, attempt = o.get("job_id"), o.get("attempt")
        refused = o.get("refused_version")
        # A notice comes in this process's version: the message it refused was another
        # release's, an earlier one's mostly left on the queue by the upgrade.
        what = (
            messages.earlier_review(messages.VERSION)
            if isinstance(refused, int) and refused < messages.VERSION
            else "run one reviewq release everywhere"
        )
        reason = (
            f"worker {o.get('worker')} refused its review message of version {refused!r}: {what}"
        )
        row = self.store.conn.execute(
            "SELECT j.reviewer FROM attempts a JOIN review_jobs j ON j.id = a.job_id "
            "AND j.attempt = a.attempt AND j.status = 'running' "
            "WHERE a.job_id = ? AND a.attempt = ? AND a.outcome = 'dispatched'",
            (job_id, attempt),
        ).fetchone()
        log = functools.partial(
            self.log.warning, job_id=job_id, attempt=attempt, worker=o.get("worker"),
            host=o.get("host"), reason=reason,
        )  # fmt: skip
        if row is None:
            self.store.after_commit(lambda: log("message.refused_by_worker"))
            return
        lose(self.store, job_id, attempt, reason)
        self.store.after_commit(lambda: log("attempt.lost", reviewer=row["reviewer"]))

    def _reaped_by_worker(self, o: dict) -> None:
        """A worker starting on a host where one died found that one's agent of an attempt
        and stopped it (its reap): no heartbeat or outcome of it will come. Still the
        job's current attempt, still dispatched or running, and last heard of from the
        dead worker (or not yet from any), it is lost now and its job sent again, not a
        lease later. A notice that comes after the attempt ended (its outcome was queued
        before the worker died) or after another worker took it up (a message put back)
        changes nothing."""
        job_id, attempt, dead = o.get("job_id"), o.get("attempt"), o.get("reaped")
        # Its agent was ended by the dead worker's guard as it died (K93), or else by this
        # worker's start: "reaped its agent" was said of both, false of the first (K97).
        reason = (
            f"its worker {dead} died; the worker {o.get('worker')} that followed it found "
            "the attempt unfinished, its agent ended"
        )
        row = self.store.conn.execute(
            _REAPABLE + " AND a.job_id = ? AND a.attempt = ? "
            "AND a.outcome IN ('dispatched', 'running') AND (a.worker IS NULL OR a.worker = ?)",
            (job_id, attempt, dead if isinstance(dead, str) else None),
        ).fetchone()
        log = functools.partial(
            self.log.warning, job_id=job_id, attempt=attempt, worker=dead,
            host=o.get("host"), reason=reason,
        )  # fmt: skip
        if row is None or not isinstance(dead, str):  # a message is data: no name, no loss
            self.store.after_commit(
                lambda: log(
                    "attempt.reap_stale", recovery="the attempt had ended or moved on: kept"
                )
            )
            return
        lose(self.store, job_id, attempt, reason)
        self.store.after_commit(lambda: log("attempt.lost", reviewer=row["reviewer"]))
        self._fail_if_lost_too_often(job_id, row["reviewer"], reason)

    def _keep_attempt_files(self, o: dict) -> None:
        """The worker's report of the attempt into ``attempt-N/``, where `reviewq job`, the
        manual flow and people look: written before the transaction, as the agent itself
        wrote them when workers shared the folder, so a crash between the two loses
        no evidence. Only known names; a folder that is not there is not made. Not over an
        attempt whose outcome was acted on: a repeat of it (a redelivered message) wrote
        another run's output and logs beside the decision made from the first."""
        row = self.store.conn.execute(
            "SELECT j.kind, j.job_dir, a.outcome FROM review_jobs j LEFT JOIN attempts a "
            "ON a.job_id = j.id AND a.attempt = ? WHERE j.id = ?",
            (o.get("attempt"), o.get("job_id")),
        ).fetchone()
        if row is None or not isinstance(o.get("attempt"), int):
            return
        if row["outcome"] not in (None, "dispatched", "running", "lost", "superseded"):
            return  # (lost and superseded: closed without an outcome, which this is)
        folder = self.ws.state_dir / row["job_dir"] / f"attempt-{o['attempt']}"
        sent = o.get("files") if isinstance(o.get("files"), dict) else {}
        files = {
            name: data
            for name, data in sent.items()
            if name in messages.ATTEMPT_FILES and isinstance(data, bytes)
        }
        if isinstance(o.get("output"), bytes):
            files["fixed-note.md" if row["kind"] == "fix" else "bundle-output.md"] = o["output"]
        if not files or not folder.is_dir():
            return
        try:
            write_attempt_files(folder, files)
        except OSError as exc:
            # The decision needs none of these files (the output travels in the message).
            self.log.error(
                "attempt.files_unwritten",
                job_id=o["job_id"],
                attempt=o["attempt"],
                folder=display_path(self.ws.root, folder),  # as escalation.raised's report
                error=str(exc),
            )

    def _on_outcome(self, o: dict) -> None:
        if "refused_version" in o:
            self._refused_by_worker(o)
            return
        if "reaped" in o:
            self._reaped_by_worker(o)
            return
        job_id, attempt = o["job_id"], o["attempt"]
        # A worker elsewhere may not know this machine's secrets; nothing stored quotes them.
        o = {
            **o,
            "reasons": logs.redact_all(o.get("reasons") or []),
            "telemetry": logs.redact_data(o.get("telemetry")),  # a session id that is a key
        }
        job = self.store.conn.execute(
            "SELECT * FROM review_jobs WHERE id = ?", (job_id,)
        ).fetchone()
        if job is None:
            self.log.error("attempt.unknown_job", job_id=job_id, attempt=attempt)
            return
        self._relay(o)
        if attempt != job["attempt"] or job["status"] != "running":
            self._supersede(job_id, attempt, o.get("telemetry"))
            return
        if o.get("exited_at"):
            self._started_with_outcome(o)
        elif isinstance(o.get("worker"), str):
            # An agent that never started (a CLI missing on that machine) beat no heartbeat:
            # `job N` named no machine for it, and with several that is the one to mend.
            self.store.conn.execute(
                "UPDATE attempts SET worker = ? WHERE job_id = ? AND attempt = ? "
                "AND worker IS NULL",
                (o["worker"], job_id, attempt),
            )
        cls = o["classification"]
        if cls == "reviewer-touched-kb" and changes_not_the_agents(
            self.store,
            self.ws.root,
            job_id,
            attempt,
            o.get("touched") or [],
            o.get("touched_hashes") or {},
        ):
            # Judge the output (a fix of a note changed meanwhile is found stale).
            cls, reasons = judged_without_the_change(
                o.get("untouched"), o.get("output") is not None, o.get("exit_code")
            )
            o = {**o, "classification": cls, "reasons": reasons}
        own = the_jobs_own(
            self.store, job_id, job["reviewer"], o.get("worker"), cls, o.get("reasons") or []
        )
        if own is not None:
            o = {**o, "classification": "no-output", "reasons": own}
            cls = "no-output"
        record_end(
            self.store,
            job_id,
            attempt,
            cls,
            exit_code=o.get("exit_code"),
            ended_at=o.get("ended_at"),
            reasons=o.get("reasons"),
            telemetry=o.get("telemetry"),
            duration_s=o.get("duration_s"),
        )
        self.log.info(
            "attempt.ended",
            job_id=job_id,
            attempt=attempt,
            reviewer=job["reviewer"],
            outcome=cls,
            worker=o.get("worker"),
            host=o.get("host"),
            exit_code=o.get("exit_code"),
            duration_s=round(o.get("duration_s") or 0, 3),
            cost_usd=(o.get("telemetry") or {}).get("cost_usd"),
            # When the agent ended there, as the worker's attempt.exited: heard late (the
            # control stopped, the queue away) the line's own time is not that.
            exited_at=o.get("ended_at") if isinstance(o.get("ended_at"), str) else None,
        )
        profile = self.settings.reviewers.get(job["reviewer"] or "")
        if cls == "output" and job["kind"] == "fix":
            self._reset_launch_failures(job["reviewer"])
            problem = (
                self.hooks.fix_output(job, o.get("output"))
                if self.hooks is not None
                else "no fix handler"
            )
            if problem:
                with self.store.write():
                    self.store.conn.execute(
                        "UPDATE attempts SET outcome = 'invalid-output', reasons = ? WHERE job_id = ? AND attempt = ?",
                        (json.dumps([problem]), job["id"], attempt),
                    )
                self._failed_attempt(job, attempt, [problem], _where(o))
            else:
                with self.store.write():
                    self.store.conn.execute(
                        "UPDATE attempts SET outcome = 'finalized' WHERE job_id = ? AND attempt = ?",
                        (job["id"], attempt),
                    )
        elif cls == "output":
            self._reset_launch_failures(job["reviewer"])
            self._finalize(job, attempt, o)
        elif cls in ("launch-failure", "reviewer-failure"):
            # Neither says anything of the job: the agent never started, or no model
            # answered it (a rejected key, a quota, an endpoint out of reach).
            event = (
                "attempt.launch_failed" if cls == "launch-failure" else "attempt.reviewer_failed"
            )
            where = _where(o)
            self._launch_failed(
                job,
                attempt,
                profile,
                o.get("reasons") or [],
                event=event,
                host=where["host"],
                retry_after=_asked(o),
                worker=where["worker"],
            )
        elif cls == "burned-out" and job["kind"] == "review" and self._pair_count(job_id) > 1:
            # Only a review asks less in parts: a fix rewrites its note whole, and an
            # audit split into reviews would accept what it was only to check.
            self._reset_launch_failures(job["reviewer"])
            new = split_job(self.store, self.ws.state_dir, self.ws.root, job_id)
            self.log.warning(
                "job.split", job_id=job_id, attempt=attempt, into=new, reasons=o.get("reasons")
            )
        else:
            self._reset_launch_failures(job["reviewer"])
            self._failed_attempt(job, attempt, o.get("reasons") or [cls], _where(o))

    def _relay(self, o: dict) -> None:
        """Say in this log what the worker said of the attempt in its own (``notices``):
        on another machine, its log is one the operator here never reads. A message is
        data, from a machine less trusted than this one: only the events of
        :data:`RELAYED`, each once, their text fields redacted and bounded; anything else
        is passed over (a field that was no list made the outcome raise, never to be kept)."""
        notices = o.get("notices")
        said: set[str] = set()
        for notice in notices if isinstance(notices, list) else []:
            event = notice.get("event") if isinstance(notice, dict) else None
            if not isinstance(event, str) or event not in RELAYED or event in said:
                continue
            said.add(event)
            fields = {
                k: " ".join(logs.redact(v).split())[:NOTICE_CHARS]
                for k, v in notice.items()
                if k in RELAYED[event] and isinstance(v, str)
            }
            sender = {k: o[k] for k in ("worker", "host") if isinstance(o.get(k), str)}
            # Once the outcome is kept: a batch rolled back is taken again, one by one.
            self.store.after_commit(
                functools.partial(
                    self.log.warning,
                    event,
                    job_id=o["job_id"],
                    attempt=o["attempt"],
                    **sender,
                    **fields,
                )
            )

    def _started_with_outcome(self, o: dict) -> None:
        """An outcome for an attempt still 'dispatched' (an agent that ended before its first
        heartbeat, or that heartbeat lost or behind it): its ``exited_at`` says the agent
        did start, so the start (worker, launch time) is recorded and logged as the
        heartbeat would have been, in the transaction that judges the outcome, before
        ``attempt.ended``."""
        started_at = o.get("started_at")
        now = timestamp(self.now())
        row = self.store.conn.execute(
            "UPDATE attempts SET worker = ?, heartbeat_at = ?, launched_at = COALESCE(launched_at, ?) "
            "WHERE job_id = ? AND attempt = ? AND outcome = 'dispatched' RETURNING attempt",
            (
                o.get("worker"),
                now,
                started_at if isinstance(started_at, str) and started_at else now,
                o["job_id"],
                o["attempt"],
            ),
        ).fetchone()
        if row is not None:
            self._log_started(o)

    def _log_started(self, msg: dict) -> None:
        """``attempt.started`` from a worker's message: its first heartbeat (``launched``)
        or, when that did not come first, its outcome. The line is said when the control
        hears it: ``launched_at`` is when the agent started on its machine (an attempt run
        while no control ran read as started after it had ended)."""
        launched = msg.get("started_at")
        self.log.info(
            "attempt.started",
            job_id=msg["job_id"],
            attempt=msg["attempt"],
            worker=msg.get("worker"),
            host=msg.get("host", ""),
            launched_at=launched if isinstance(launched, str) and launched else None,
        )

    def _finalize(self, job, attempt: int, o: dict) -> None:
        output = o.get("output")
        try:
            res = finalize(
                self.store,
                self.ws.state_dir,
                job["id"],
                output,
                # The worker's secrets, which this machine may not know: redacted in what
                # is stored of the output, which is parsed as it came.
                secrets=logs.spanned(output, o.get("redact")) if isinstance(output, bytes) else [],
                within=record_decisions,
                attempt=attempt,
                provenance=Provenance(runner=job["reviewer"], telemetry=o.get("telemetry") or None),
                max_bytes=self.settings.max_output_bytes,
                fail_on_invalid=False,
                job=job,  # read in this batch's transaction
            )
        except FinalizeError as exc:
            self.log.warning(
                "job.finalize_refused", job_id=job["id"], attempt=attempt, reason=str(exc)
            )
            return
        if res.ok:
            counts: dict[str, int] = {}
            for p in res.pairs:
                counts[p["decision"]] = counts.get(p["decision"], 0) + 1
            # Once the batch commits: logged inside it, a batch rolled back (one outcome
            # of it failed, the control killed before its COMMIT) had the job finalized
            # in the log and running in state.db, and logged again when taken alone.
            self.store.after_commit(
                functools.partial(
                    self.log.info,
                    "job.finalized",
                    job_id=job["id"],
                    attempt=attempt,
                    reviewer=job["reviewer"],
                    decisions=counts,
                )
            )
            if self.hooks is not None:
                # What finalize read and decided in this transaction: not read again.
                self.hooks.after_completed(job["id"], job, res.decided)
        elif res.status == "invalid":
            self._failed_attempt(job, attempt, res.failure_reasons, _where(o))
        else:
            self._supersede(job["id"], attempt)

    def _failed_attempt(self, job, attempt: int, reasons: list[str], where: dict) -> None:
        # Each line names its attempt: in a batch, the one bound for the task is the first
        # message's, and job.failed is written after the commit, outside it. And the
        # machine (``where``, :func:`_where`): on a night of two, the one that failed it.
        reasons = condensed(reasons)
        failed = self.store.conn.execute(
            f"SELECT count(*) FROM attempts WHERE job_id = ? AND outcome IN ({FAILED_SQL})",
            (job["id"],),
        ).fetchone()[0]
        limit = self.settings.queue.max_attempts
        if failed >= limit:
            # The first line names the last attempt's reasons, the rest those it left out:
            # all of them again after it printed each one twice in every summary.
            final = [f"{failed} attempt(s) failed; the last: " + "; ".join(reasons[:5])]
            fail_job(self.store, self.ws.state_dir, job["id"], final + reasons[5:])
            # Once the batch commits, as job.finalized: a batch rolled back had the job
            # failed in the log and running in state.db, and logged again when retried.
            self.store.after_commit(
                functools.partial(
                    self.log.error,
                    "job.failed",
                    job_id=job["id"],
                    attempt=attempt,
                    reviewer=job["reviewer"],
                    attempts=failed,
                    reasons=reasons[:10],
                    **where,
                )
            )
            if self.hooks is not None:
                self.hooks.after_failed(job["id"], reasons)
            return
        self._requeue(job["id"])
        self.log.warning(
            "job.retrying",
            job_id=job["id"],
            attempt=attempt,
            reviewer=job["reviewer"],
            failed_attempts=failed,
            limit=limit,
            reasons=reasons[:10],
            **where,
        )

    def _launch_failed(
        self,
        job,
        attempt: int,
        profile: ReviewerProfile | None,
        reasons: list[str],
        event: str = "attempt.launch_failed",
        host: str | None = None,
        retry_after: float | None = None,
        worker: str | None = None,
    ) -> None:
        q = self.settings.queue
        # Now, and again at the commit: after an earlier outcome's reset of the same batch.
        self._no_launch_failures.discard(job["reviewer"])
        self.store.after_commit(lambda: self._no_launch_failures.discard(job["reviewer"]))
        name = job["reviewer"]
        what = not_the_jobs(event == "attempt.launch_failed", profile, host)
        with self.store.write():
            off = back_off(self.store, q, job["id"], name, what, reasons, self.now(), retry_after)
        if self.dispatch_in is not None:
            # Paused too: a pause a Retry-After shortened ends within seconds, and waiting
            # for the next tick kept the profile idle up to reaper_seconds past it.
            wake, after = self.dispatch_in, off.wait_s(self.now())
            self.store.after_commit(lambda: wake(after))
        # Where it failed: read on the control's machine, "cannot reach
        # http://127.0.0.1:…" named no machine, and the one it names is the worker's.
        self.log.warning(
            event,
            job_id=job["id"],
            attempt=attempt,
            reviewer=name,
            worker=worker,
            host=host,
            **off.when,
            reasons=reasons,
        )
        if off.paused_at:
            log_paused(self.log, name, off)

    def _reset_launch_failures(self, name: str | None) -> None:
        if name and name not in self._no_launch_failures:
            with self.store.write():
                answered(self.store, name)
                self.store.after_commit(lambda: self._no_launch_failures.add(name))

    def _requeue(self, job_id: int) -> None:
        with self.store.write():
            self.store.conn.execute(
                "UPDATE review_jobs SET status = 'queued', updated_at = ? WHERE id = ? AND status = 'running'",
                (utcnow(), job_id),
            )

    def _supersede(self, job_id: int, attempt: int, telemetry: object = None) -> None:
        outcome = supersede(self.store, job_id, attempt, telemetry)
        if outcome is not None and self.stops is not None:
            # Its agent has ended (a second agent of an attempt acted on already, too): a
            # stop request (this process's, or one before a restart) no worker took would
            # wait on the queue for the reaper's sweep.
            self.store.after_commit(functools.partial(self._forget_stop, job_id, attempt))
        if outcome is not None and outcome not in ("superseded", "lost"):
            # Acted on already: a control process stopped after keeping a batch and before
            # taking it off the queue meets its outcomes again.
            self.log.info("attempt.repeated", job_id=job_id, attempt=attempt, outcome=outcome)
            return
        self.log.info("attempt.superseded", job_id=job_id, attempt=attempt)

    def _forget_stop(self, job_id: int, attempt: int) -> None:
        self._stops_asked.pop((job_id, attempt), None)
        try:
            self.stops.forget(job_id, attempt)
        except Exception as exc:  # a key of a few bytes left on the queue
            self.log.warning("attempt.stop_unsent", job_id=job_id, attempt=attempt, error=str(exc))

    def _pair_count(self, job_id: int) -> int:
        return self.store.conn.execute(
            "SELECT count(*) FROM review_pairs WHERE job_id = ?", (job_id,)
        ).fetchone()[0]

    # --- the reaper -------------------------------------------------------------------
    def write_due_files(self) -> int:
        """What a crash or a full disk kept from being written after its transaction
        committed (applied fixes, job folders, escalation reports), written now if it can
        be; the number written."""
        written = (
            write_due_fixes(self.ws.kb, self.store, git_commit=self.settings.fix.git_commit)
            + write_due_job_files(self.store, self.ws.state_dir, prompt=self._prompt)
            + write_due_reports(self.store, self.ws.state_dir)
        )
        self._say_long_held()
        return written

    def _say_long_held(self) -> None:
        """Warn, once, of a job folder another process has held since the last tick or
        longer: a writer is done in milliseconds, so its holder is stopped (Ctrl-Z, a
        SIGSTOP) or hung, and the job waits for it. A held folder is routine and said at
        info only (K57): without this, a job stuck behind a suspended command all night
        showed no warning or error anywhere."""
        now = self.now()
        since = {}
        for job_id, job_dir in held_job_folders(self.store):
            since[job_id] = first = self._held_since.get(job_id, now)
            if job_id in self._held_said or (now - first).total_seconds() < (
                self.settings.queue.reaper_seconds
            ):
                continue
            folder = self.ws.state_dir / job_dir
            holder = flock_holder(folder)
            self.log.warning(
                "job.folder_held",
                job_id=job_id,
                folder=str(folder),
                holder_pid=holder,
                held_since=timestamp(first),
                recovery=f"the process holding it{f' (pid {holder})' if holder else ''} is "
                "stopped or hung: resume it (fg, kill -CONT) or end it; the next tick or "
                "dispatch writes the folder",
            )
            self._held_said.add(job_id)
        self._held_since = since
        self._held_said &= set(since)

    def reap(self) -> int:
        """Re-queue jobs whose attempt lost its lease, was never picked up, or ended while
        the control process was down before its outcome was acted on."""
        now = self.now()
        self._away(now)
        self._note_taken(now)
        rows = self.store.conn.execute(_REAPABLE).fetchall()
        reaped = 0
        for r in rows:
            if self._lost_reason(r, now) is None:
                continue
            with self.store.write():
                # Read again under the lock: a manual finalize or run-job may have acted
                # on the attempt since the look above.
                r = self.store.conn.execute(
                    _REAPABLE + " AND a.job_id = ?", (r["job_id"],)
                ).fetchone()
                lost_reason = self._lost_reason(r, now) if r is not None else None
                if lost_reason is None:
                    continue
                lose(self.store, r["job_id"], r["attempt"], lost_reason)
            reaped += 1
            # Which machine went silent: with workers on several, the first thing asked.
            worker = r["worker"]
            where = {"worker": worker, "host": worker.rpartition(":")[0]} if worker else {}
            self.log.warning(
                "attempt.lost",
                job_id=r["job_id"],
                attempt=r["attempt"],
                reviewer=r["reviewer"],
                reason=lost_reason,
                **where,
            )
            self._fail_if_lost_too_often(r["job_id"], r["reviewer"], lost_reason)
        self._sweep_stops(now)
        return reaped

    def _fail_if_lost_too_often(self, job_id: int, reviewer: str, lost_reason: str) -> None:
        """Fail a job whose attempts keep losing their worker: an agent that takes its
        worker down every time would otherwise retry forever. Only launched attempts
        count: one no worker picked up (none running all night), or one a worker took and
        dropped (another release's, or past its expiry), says nothing of the job, and must
        not fail it by morning."""
        lost = self.store.conn.execute(
            "SELECT count(*) FROM attempts WHERE job_id = ? AND outcome = 'lost' "
            "AND launched_at IS NOT NULL",
            (job_id,),
        ).fetchone()[0]
        if lost < 2 * self.settings.queue.max_attempts:
            return
        reasons = [f"{lost} attempts lost their worker (the last: {lost_reason})"]
        with self.store.write():
            fail_job(self.store, self.ws.state_dir, job_id, reasons)
            if self.hooks is not None:
                self.hooks.after_failed(job_id, reasons)
        self.store.after_commit(
            functools.partial(
                self.log.error, "job.failed", job_id=job_id, reviewer=reviewer, reasons=reasons
            )
        )

    def _away(self, now: datetime) -> None:
        """Look for an absence of this process since its last reap longer than a tick and
        half a lease: its machine suspended (a laptop's lid, a VM paused: CLOCK_BOOTTIME counts
        it), the process stopped (SIGSTOP), or its wall clock stepped forward (NTP). The
        workers on that machine were away as long, and the silence of every attempt then
        said nothing of its agent: judged at once, each was lost and run again, its agent
        stopped at its next beat or its outcome discarded. Silences are counted from now,
        as for a live attempt just heard from."""
        wall, boot = self.clocks()
        last, self._looked = self._looked, (wall, boot, now)
        if last is None:
            return
        away = max(wall - last[0], boot - last[1])
        queue = self.settings.queue
        if away > queue.reaper_seconds + queue.lease_seconds / 2:
            self.away = (last[2], now)
            # A grace ends with a look before another is given: a control slow at every
            # tick (starved, state.db locked) was "back" at each and put off every verdict
            # for ever, a dead worker's attempt never given up. Over a slow tick the live
            # agents' beats wait on the queue and are applied first (K16).
            since = self._watching_since
            lease = timedelta(seconds=queue.lease_seconds)
            graced = since is None or last[2] >= since + lease
            if graced:
                self._watching_since = now
            self.log.warning(
                "control.resumed",
                away_s=round(away, 1),
                stepped_s=round(wall - last[0] - (boot - last[1]), 1),
                recovery=f"no attempt is lost before {queue.lease_seconds:g} s from now"
                if graced
                else "silent attempts are judged now: the last grace ended unseen",
            )

    def _silent(self, at: str, now: datetime, wait: timedelta) -> bool:
        """Whether an attempt last heard of (or dispatched) ``at`` has been silent for
        ``wait``, and for a lease since the reaper's return. A lease only, whatever
        ``wait``: a message left on the queue over a suspend has expired (the worker drops
        it), and waiting a reviewer's timeout more only delayed its job."""
        lease = timedelta(seconds=self.settings.queue.lease_seconds)
        back = self._watching_since
        return parse_timestamp(at) < now - wait and (back is None or back < now - lease)

    def _sweep_stops(self, now: datetime) -> None:
        """Take off the queue the stop requests no agent will read: those of attempts that
        are over, not asked again for a lease. A beat that came after its attempt's outcome
        (queued behind a slow one, or sent again by a restarted worker) set a request that
        nothing else took off. An agent still running for such an attempt beats every
        quarter lease, and each beat asks again; one asked before this process started is
        asked again at its next beat."""
        if self.stops is None:
            return
        try:
            pending = self.stops.pending()
        except Exception as exc:  # the next reap looks again
            self.log.warning("stop.sweep_failed", error=str(exc))
            return
        quiet_since = now - timedelta(seconds=self.settings.queue.lease_seconds)
        for job_id, attempt in pending:
            asked = self._stops_asked.get((job_id, attempt))
            if asked is not None and asked > quiet_since:
                continue
            if is_over(self.store, job_id, attempt):
                self._forget_stop(job_id, attempt)

    def _note_taken(self, now: datetime) -> None:
        """Mark taken the attempts a worker took without a word yet: those dispatched
        half a lease ago or more whose message is gone from the review queue. A worker
        says nothing as it launches an agent (a quick one's outcome says it, a longer
        one's first heartbeat comes a second later): one killed in that time leaves such an
        attempt, now lost a lease later, not lease + timeout later; so does a message the
        queue lost (Redis restarted without its data) or a send that failed. Not past the
        message's expiry, when a worker drops it unrun: that attempt is given up as one no
        worker took, as before. A taken attempt whose message is back on the queue (a
        stopping worker's, put back) waits there as any other."""
        if self.on_review_queue is None:
            return
        lease = self.settings.queue.lease_seconds
        half = timestamp(now - timedelta(seconds=lease / 2))
        quiet = {
            (r["job_id"], r["attempt"]): r
            for r in self.store.conn.execute(
                _REAPABLE + " AND a.outcome = 'dispatched' AND a.started_at < ?", (half,)
            )
            if r["taken_at"] or not self._past_expiry(r, now)
        }
        if not quiet:
            return
        on_queue = self.on_review_queue(set(quiet))
        if on_queue is None:  # the queue cannot be read: nothing is known
            return
        gone = [k for k, r in quiet.items() if not r["taken_at"] and k not in on_queue]
        back = [k for k, r in quiet.items() if r["taken_at"] and k in on_queue]
        if gone or back:
            taken(self.store, gone, back, timestamp(now))

    def _past_expiry(self, r, now: datetime) -> bool:  # noqa: ANN001 - a _REAPABLE row
        """Whether the attempt's message has expired (a worker drops it unrun)."""
        ttl = self._ttl_s(self.settings.reviewers.get(r["reviewer"] or ""))
        return parse_timestamp(r["started_at"]) < now - timedelta(seconds=ttl)

    def _ttl_s(self, profile: ReviewerProfile | None) -> float:
        """How long a review message may wait to start its agent: half a lease before the
        reaper gives up an attempt no worker took (lease + timeout)."""
        return self.settings.queue.lease_seconds / 2 + (profile.timeout if profile else 0)

    def _lost_reason(self, r, now: datetime) -> str | None:  # noqa: ANN001 - a _REAPABLE row
        """Why this running job's current attempt counts as lost, or None while it may
        still end."""
        lease = timedelta(seconds=self.settings.queue.lease_seconds)
        if r["outcome"] == "running" or (r["outcome"] == "dispatched" and r["taken_at"]):
            if self._silent(r["heartbeat_at"], now, lease):
                return f"{NO_HEARTBEAT} {self.settings.queue.lease_seconds:g} s"
            return None
        if r["outcome"] == "dispatched":
            profile = self.settings.reviewers.get(r["reviewer"] or "")
            wait = lease + timedelta(seconds=profile.timeout if profile else 0)
            if self._silent(r["started_at"], now, wait):
                return NEVER_PICKED_UP
            return None
        return f"ended ({r['outcome']}) but was not acted on"

    def tick(self) -> None:
        self.reap()
        self.dispatch()


def rewrite_files(ws: Workspace, everything: bool = False) -> tuple[int, int, list[str]]:
    """The folders (MANIFEST.json, results/, a missing prompt.md) of queued and running
    jobs, of any job whose files still wait to be written, and the reports of open
    escalations, written again from state.db: files that render state, deleted or
    damaged by hand. With ``everything``, ended jobs' and decided escalations' too;
    without, a disk freed of ended jobs' folders (OPERATIONS 6.4) is not filled again.
    Returns (jobs, reports) written, and what could not be (``review job N: error``,
    ``escalation N: error``). Applied fixes are not: the KB is the person's, and a note
    may have changed since."""
    store = ws.store
    # A person's decision is recorded as a job with no folder (job_dir ''): rendered, its
    # MANIFEST.json, prompt.md and results/ went into STATE itself, each over the last.
    # Due: a job's files follow its finalize, so a write that failed is mostly an ended
    # job's, which doctor sends here ("writes them at once"); left out, they stayed due.
    live = (
        ""
        if everything
        else " AND (status IN ('queued', 'running') OR id IN (SELECT job_id FROM job_files_due))"
    )
    ids = [
        r[0]
        for r in store.conn.execute(
            f"SELECT id FROM review_jobs WHERE grouping != 'human'{live} ORDER BY id"
        )
    ]
    mark_job_files_due(store, ids)
    mark_reports_due(store, everything)
    prompt = prompt_renderer(store, ws.state_dir, ws.root)
    jobs = write_due_job_files(store, ws.state_dir, ids, prompt, late=False)
    reports = write_due_reports(store, ws.state_dir, late=False)
    # Still due after a try, with the error it met (not one marked meanwhile, untried).
    left = [
        f"review job {i}: {error}"
        for i, error in store.conn.execute(
            "SELECT job_id, error FROM job_files_due WHERE error != ? "
            "AND job_id IN (SELECT value FROM json_each(?)) ORDER BY job_id",
            (NOT_TRIED, json.dumps(ids)),
        )
    ]
    left += [
        f"escalation {i}: {error}"
        for i, error in store.conn.execute(
            "SELECT escalation_id, error FROM escalation_reports_due WHERE error != ? "
            "ORDER BY escalation_id",
            (NOT_TRIED,),
        )
    ]
    return jobs, reports, left


def _where(o: dict) -> dict:
    """The worker (host:pid) and host an outcome came from, each None where it names
    none: a worker's message is read as data."""
    return {k: o[k] if isinstance(o.get(k), str) and o[k] else None for k in ("worker", "host")}


def _asked(o: dict) -> float | None:
    """The wait an outcome's endpoint asked for (its telemetry's ``retry_after_s``), or
    None: a worker's message is read as data, whatever it holds."""
    telemetry = o.get("telemetry")
    asked = telemetry.get("retry_after_s") if isinstance(telemetry, dict) else None
    return float(asked) if storable_number(asked) else None


def lift_pause(store: Store, name: str, now: datetime) -> tuple[Pause, list[int]] | None:
    """Resume a paused reviewer profile at once (its cause fixed: a key renewed, a CLI
    installed), with its queued jobs' launch backoff: the pause that was lifted and the
    jobs it held (the profile's queued ones), or None when ``name`` was not paused. The
    control process reads pauses from state.db at each dispatch, so it need not be
    stopped."""
    with store.write():
        row = store.conn.execute(
            "SELECT paused_until, paused_reason, paused_at FROM reviewer_state "
            "WHERE name = ? AND paused_until > ?",
            (name, timestamp(now)),
        ).fetchone()
        if row is None:
            return None  # and its count of failures in a row stays as it is
        store.conn.execute(
            "UPDATE reviewer_state SET paused_until = NULL, paused_reason = NULL, "
            "paused_at = NULL, launch_failures = 0, updated_at = ? WHERE name = ?",
            (utcnow(), name),
        )
        # Their count too: kept, the first failure after a resume waited as the fifth would.
        store.conn.execute(
            "UPDATE review_jobs SET not_before = NULL, launch_failures = 0 "
            "WHERE reviewer = ? AND status = 'queued'",
            (name,),
        )
    return Pause(row[0], row[1], row[2]), _held(store, name)


def end_pauses(store: Store, now: str) -> list[tuple[str, Pause, list[int]]]:
    """End the pauses whose time ran out by ``now``: each profile's pause (kept as it was
    until now, read as over by every look at ``paused_until > now``) and the jobs it held.
    ``paused_at`` stays: a pause after it with no answer between is one outage
    (:func:`back_off`). Inside the caller's write."""
    # Read before: RETURNING gives the row as the update left it.
    ended = store.conn.execute(
        "SELECT name, paused_until, paused_reason, paused_at FROM reviewer_state "
        "WHERE paused_until <= ?",
        (now,),
    ).fetchall()
    if ended:
        store.conn.execute(
            "UPDATE reviewer_state SET paused_until = NULL, paused_reason = NULL "
            "WHERE paused_until <= ?",
            (now,),
        )
    return [
        (name, Pause(until, why, since), _held(store, name)) for name, until, why, since in ended
    ]


def _held(store: Store, name: str) -> list[int]:
    """The queued jobs of profile ``name``: those its pause held."""
    return [
        job
        for (job,) in store.conn.execute(
            "SELECT id FROM review_jobs WHERE reviewer = ? AND status = 'queued' ORDER BY id",
            (name,),
        )
    ]
