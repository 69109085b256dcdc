"""``reviewq run-job ID``: one attempt of one job, in the foreground, then finalize.

The same launch/wait/kill/classify code the queue workers use, with no queue: useful to
try a reviewer profile on a single job, and for tests of the lifecycle itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.control.attempts import fail_job, open_attempt, record_end, requeue_job
from orchestrator.cycles.escalations import record_decisions
from orchestrator.review.finalize import FinalizeError, FinalizeResult, Provenance, finalize
from orchestrator.state.workspace import Workspace

from .attempt import LAUNCH_FAILURE, OUTPUT, REVIEWER_FAILURE, AttemptOutcome, run_attempt
from .reviewers import AttemptSpec, for_profile


@dataclass
class ForegroundResult:
    outcome: AttemptOutcome
    finalized: FinalizeResult | None

    @property
    def ok(self) -> bool:
        return self.finalized is not None and self.finalized.ok


def run_job(ws: Workspace, job_id: int, reviewer_name: str) -> ForegroundResult:
    profile = ws.settings.reviewer(reviewer_name)
    reviewer = for_profile(profile)
    store = ws.store
    job = store.conn.execute(
        "SELECT model_partition FROM review_jobs WHERE id = ?", (job_id,)
    ).fetchone()
    if job is not None and job["model_partition"] != profile.partition:
        raise FinalizeError(
            f"reviewer {profile.name} writes partition {profile.partition}, "
            f"but job {job_id} belongs to {job['model_partition']}"
        )
    opened = open_attempt(store, ws.state_dir, ws.root, job_id, profile.name)
    spec = AttemptSpec(
        task="review",
        job_id=job_id,
        attempt=opened.attempt,
        prompt_path=opened.prompt_path,
        output_path=opened.output_path,
        job_dir=opened.job_dir,
        attempt_dir=opened.attempt_dir,
        root=ws.root,
        model=profile.model,
    )
    outcome = run_attempt(
        reviewer,
        spec,
        timeout_s=profile.timeout,
        max_turns=profile.max_turns,
        guarded=opened.guarded,
        trees=opened.trees,
        max_output_bytes=ws.settings.max_output_bytes,
    )
    result: FinalizeResult | None = None
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
    if outcome.classification == OUTPUT:
        result = finalize(
            store,
            ws.state_dir,
            job_id,
            outcome.output,
            attempt=opened.attempt,
            provenance=Provenance(runner=profile.name, telemetry=outcome.telemetry or None),
            max_bytes=ws.settings.max_output_bytes,
            fail_on_invalid=True,
            within=record_decisions,
        )
    elif outcome.classification in (LAUNCH_FAILURE, REVIEWER_FAILURE):
        requeue_job(store, job_id)  # not the job's fault: back to the queue untouched
    else:
        fail_job(store, ws.state_dir, job_id, outcome.reasons)
    return ForegroundResult(outcome, result)
