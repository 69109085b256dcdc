"""``reviewq run-job ID``: one attempt of one job, in the foreground, then finalize.

The same launch/wait/kill/classify code the queue workers use, with no queue: useful to
try a reviewer profile on a single job, and for tests of the lifecycle itself.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from orchestrator import faults, logs
from orchestrator.control.attempts import (
    AttemptError,
    answered,
    back_off,
    heartbeat,
    is_current,
    log_paused,
    lose,
    not_the_jobs,
    open_attempt,
    record_end,
    set_outcome,
    supersede,
)
from orchestrator.control.followup import (
    Followed,
    fail_by_hand,
    finalize_by_hand,
    fix_output_by_hand,
)
from orchestrator.cycles.fixes import changes_not_the_agents, judged_without_the_change
from orchestrator.regularfile import private
from orchestrator.review.finalize import FinalizeResult, Provenance
from orchestrator.review.jobs import prompt_renderer, split_job
from orchestrator.state.files import (
    mark_job_files_due,
    unwritten_job_folder,
    write_due_job_files,
)
from orchestrator.state.store import utcnow
from orchestrator.state.workspace import Workspace

from .attempt import (
    BURNED_OUT,
    LAUNCH_FAILURE,
    OUTPUT,
    REVIEWER_FAILURE,
    TOUCHED_KB,
    AttemptOutcome,
    reap_orphans,
    registry_dir,
    run_attempt,
)
from .guard import RUN_JOB, Guard
from .parent import terminate_raises
from .reviewers import AttemptSpec, for_profile


@dataclass
class ForegroundResult:
    outcome: AttemptOutcome
    finalized: FinalizeResult | None
    followed: Followed = field(default_factory=Followed)
    # The job's status when this attempt was found taken back (None: it was not).
    job_status: str | None = None
    # The profile's pause this attempt's failure met or began (None: not paused).
    paused_until: str | None = None

    @property
    def ok(self) -> bool:
        return self.finalized is not None and self.finalized.ok


def run_job(ws: Workspace, job_id: int, reviewer_name: str) -> ForegroundResult:
    profile = ws.settings.reviewer(reviewer_name)
    reviewer = for_profile(profile)
    store = ws.store
    reap_orphans(ws.state_dir, said="a run-job that left them was killed")  # with SIGKILL
    # As dispatch does: a job made while its folder could not be written (a full disk)
    # has its MANIFEST.json written before its agent starts; so does one whose folder a
    # person deleted or edited (the agent runs in it, and the offline reviewer reads the
    # manifest): the folder renders state.db, and one job's costs nothing to write again.
    row = store.conn.execute(
        "SELECT job_dir FROM review_jobs WHERE id = ? AND status IN ('queued', 'running')",
        (job_id,),
    ).fetchone()
    if row is not None and row[0]:  # a person's decision has no folder; STATE is not one
        mark_job_files_due(store, [job_id])
    write_due_job_files(
        store, ws.state_dir, [job_id], prompt_renderer(store, ws.state_dir, ws.root), late=False
    )
    if row is not None and row[0]:
        _refuse_unwritten(store, ws.state_dir / row[0], job_id)
    # Killed outright (SIGKILL, the OOM killer), a run-job left its agent running and its
    # attempt open until the next run-job of that job: its guard ends the one and gives
    # up the other, as a worker's ends its agents (K96).
    guard = _guarded(ws.state_dir)
    try:
        with terminate_raises([], ctrl_c=True):
            with store.write():
                opened = open_attempt(
                    store,
                    ws.state_dir,
                    ws.root,
                    job_id,
                    profile.name,
                    partition=profile.partition,
                    note_roots=ws.settings.note_roots,
                )
                if guard is not None:
                    guard.tell(job_id, opened.attempt, opened.opened_at)
            try:
                result = _run(ws, job_id, profile, reviewer, opened)
                faults.point("run_job.ended")  # its end committed, its guard not yet told
                return result
            except BaseException as exc:
                # Ctrl-C, SIGTERM, a closed terminal (or an error), at any moment after
                # the attempt opened: the agent is stopped (run_attempt kills its group)
                # and the job queued again. Left as they were, the job and attempt stayed
                # running for good without a control process, whether the agent ran or
                # its output was being finalized.
                _stopped(store, job_id, opened.attempt, exc)
                raise
    finally:
        if guard is not None:
            guard.leave()


def _guarded(state_dir: Path) -> Guard | None:
    """This run-job's guard; None, said, where it cannot start (a pids limit)."""
    try:
        return Guard(state_dir, of=RUN_JOB)
    except OSError as exc:
        logs.get().warning(
            "run_job.unguarded",
            reason=f"cannot start its guard ({exc}): a kill of this run-job leaves its "
            "agent running and its attempt open until the next run-job of the job",
        )
        return None


def _refuse_unwritten(store, folder: Path, job_id: int) -> None:  # noqa: ANN001 - a Store
    """Refuse a job whose folder could not be written (a file where it was, a full disk):
    its attempt's folder raised a traceback, or its agent found no MANIFEST.json."""
    why = unwritten_job_folder(store, folder, job_id)
    if why is not None:
        raise AttemptError(
            f"job {job_id}'s folder {folder} cannot be written ({why}); nothing changed"
        )


def _run(ws: Workspace, job_id: int, profile, reviewer, opened) -> ForegroundResult:  # noqa: ANN001
    store = ws.store
    runner = f"{socket.gethostname()}:{os.getpid()}"

    def beat() -> None:
        # A control process may be running: without heartbeats its reaper takes the
        # attempt for lost after lease_seconds, and a worker runs a second agent on the job.
        try:
            heartbeat(store, job_id, opened.attempt, runner, utcnow())
        except Exception as exc:  # a missed heartbeat is not worth killing the agent for
            logs.get().warning("attempt.heartbeat_failed", job_id=job_id, error=str(exc))

    spec = AttemptSpec(
        task=opened.kind,
        job_id=job_id,
        attempt=opened.attempt,
        prompt_path=opened.prompt_path,
        output_path=opened.output_path,
        job_dir=opened.job_dir,
        attempt_dir=opened.attempt_dir,
        root=ws.root,
        model=profile.model,
        note_path=opened.note_path if opened.kind == "fix" else None,
        note_file=_given_note(opened),
    )
    outcome = run_attempt(
        reviewer,
        spec,
        timeout_s=profile.timeout,
        max_turns=profile.max_turns,
        guarded=opened.guarded,
        trees=opened.trees,
        max_output_bytes=ws.settings.max_output_bytes,
        on_tick=beat,
        registry=registry_dir(ws.state_dir),
        tick_s=max(0.05, ws.settings.queue.lease_seconds / 4),
    )
    result: FinalizeResult | None = None
    followed = Followed()
    paused_until = None
    # The end and what follows it are one transaction: a control process's reaper that
    # saw the end alone would take the attempt for "ended but not acted on" and queue
    # the job again for a worker.
    with store.write():
        if not is_current(store, job_id, opened.attempt):
            supersede(store, job_id, opened.attempt, outcome.telemetry)
            status = store.conn.execute(
                "SELECT status FROM review_jobs WHERE id = ?", (job_id,)
            ).fetchone()[0]
            # Decided meanwhile (a person's `reviewq finalize`, another attempt), queued
            # again (the reaper took this attempt for lost, or another run-job took the
            # job and was stopped), or run by another attempt, which alone decides. Said
            # as "runs on in another attempt" whatever it was, it contradicted `reviewq job`.
            why = (
                f"attempt {opened.attempt} was taken back while it ran (a control process "
                "took it for lost, a finalize by hand, or another run-job); the job is "
                f"{status} now"
            )
            return ForegroundResult(
                outcome, FinalizeResult(job_id, "superseded", [why]), job_status=status
            )
        if outcome.classification == TOUCHED_KB and changes_not_the_agents(
            store, ws.root, job_id, opened.attempt, outcome.touched, outcome.touched_hashes
        ):
            # Judge the output, as the control process does (a fix of a note changed
            # meanwhile is found stale; another job's fix written meanwhile is no fault).
            outcome.classification, outcome.reasons = judged_without_the_change(
                outcome.untouched, outcome.output is not None, outcome.exit_code
            )
        record_end(
            store,
            job_id,
            opened.attempt,
            outcome.classification,
            exit_code=outcome.exit_code,
            ended_at=outcome.ended_at,
            reasons=outcome.reasons,
            telemetry=outcome.telemetry,
            duration_s=outcome.duration_s,
        )
        if outcome.classification not in (LAUNCH_FAILURE, REVIEWER_FAILURE):
            answered(store, profile.name)  # as the control counts failures in a row
        if outcome.classification == OUTPUT and opened.kind == "fix":
            result, followed = _apply_fix(ws, job_id, opened.attempt, outcome, profile.name)
        elif outcome.classification == OUTPUT:
            result, followed = finalize_by_hand(
                ws,
                job_id,
                outcome.output,
                Provenance(runner=profile.name, telemetry=outcome.telemetry or None),
                attempt=opened.attempt,
            )
        elif outcome.classification in (LAUNCH_FAILURE, REVIEWER_FAILURE):
            # Not the job's fault: back to the queue untouched, counted against the profile
            # as the control counts it, so that run-job after run-job (or the control
            # behind them) does not send request after request to an endpoint that said no.
            launch = outcome.classification == LAUNCH_FAILURE
            off = back_off(
                store,
                ws.settings.queue,
                job_id,
                profile.name,
                not_the_jobs(launch, profile, None),
                outcome.reasons,
                datetime.now(UTC),
                outcome.telemetry.get("retry_after_s"),
            )
            # In the job's log as the control says it: else `reviewq logs --job N` showed
            # nothing of why the job is queued again.
            event = "attempt.launch_failed" if launch else "attempt.reviewer_failed"

            def said() -> None:
                log = logs.get()
                log.warning(
                    event,
                    job_id=job_id,
                    attempt=opened.attempt,
                    reviewer=profile.name,
                    by_hand=True,
                    **off.when,
                    reasons=outcome.reasons,
                )
                if off.paused_at:
                    log_paused(log, profile.name, off, by_hand=True)

            store.after_commit(said)
            paused_until = off.paused_until
        elif (
            outcome.classification == BURNED_OUT
            and opened.kind == "review"
            and len(opened.pairs) > 1
        ):
            # As the control process does (CONTRACT §6): asked less, each pair may fit.
            new = split_job(store, ws.state_dir, ws.root, job_id)
            why = f"split into one-pair jobs {', '.join(map(str, new))}"
            result = FinalizeResult(job_id, "split", [*outcome.reasons, why])
        else:
            followed = fail_by_hand(ws, job_id, outcome.reasons, profile.name)
    return ForegroundResult(outcome, result, followed, paused_until=paused_until)


def _stopped(store, job_id: int, attempt: int, exc: BaseException) -> None:  # noqa: ANN001 - a Store
    """This run-job was stopped: its attempt is lost and the job queued again, for the
    control process or another run-job (as the reaper would, without waiting a lease),
    with what stopped it."""
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        reason = "run-job was stopped (an interrupt or a signal); the job is queued again"
    else:
        reason = f"run-job failed ({type(exc).__name__}: {exc}); the job is queued again"
    with store.write():
        if not is_current(store, job_id, attempt):
            return
        lose(store, job_id, attempt, reason)


def _given_note(opened) -> Path | None:  # noqa: ANN001 - an OpenedAttempt
    """A fixer reads the note it was given from a file beside its prompt, as on a queue
    worker: the live note may change while it runs, and the fix is applied only over
    the text it was given."""
    if opened.kind != "fix" or opened.note_text is None:
        return None
    opened.attempt_dir.mkdir(parents=True, exist_ok=True)
    path = opened.attempt_dir / "note.md"
    with open(path, "w", encoding="utf-8", opener=private) as f:  # the note's text (N28)
        f.write(opened.note_text)
    return path


def _apply_fix(
    ws: Workspace, job_id: int, attempt: int, outcome: AttemptOutcome, runner: str
) -> tuple[FinalizeResult, Followed]:
    """A fixer's output is the note's new text, applied as the control process would; an
    unusable one fails the job at once (:func:`fail_by_hand`)."""
    store = ws.store
    with store.write():
        problem, followed = fix_output_by_hand(ws, job_id, outcome.output)
        set_outcome(
            store,
            job_id,
            attempt,
            "invalid-output" if problem else "finalized",
            [problem] if problem else None,
        )
    if problem:
        failed = fail_by_hand(ws, job_id, [problem], runner)
        return FinalizeResult(job_id, "failed", [problem]), failed
    return FinalizeResult(job_id, "completed"), followed
