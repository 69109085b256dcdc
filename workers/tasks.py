"""The queue tasks: module-level functions that take ids (and, for a review, everything
the worker needs, so it never opens state.db). ``workers.app`` registers them.

Review queue: :func:`run_review`. Control queue: :func:`deliver_outcome`,
:func:`attempt_heartbeat`, :func:`dispatch`, :func:`tick`; they run in the single
control consumer, the one writer of state.db.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import logs
from orchestrator.config import ReviewerProfile

from .attempt import run_attempt
from .queues import send
from .reviewers import AttemptSpec, for_profile

if TYPE_CHECKING:
    from orchestrator.control.control import Control


_control: Control | None = None
_semaphores: dict[str, threading.BoundedSemaphore] = {}
_sem_lock = threading.Lock()
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"
STOPPING = threading.Event()  # set by a stopping worker before it kills its agents


def install_control(control: Control) -> None:
    global _control
    _control = control


def _the_control() -> Control:
    if _control is None:
        raise RuntimeError("this process is not the control process")
    return _control


def _profile(data: dict) -> ReviewerProfile:
    known = {f.name for f in fields(ReviewerProfile)}
    values = {k: v for k, v in data.items() if k in known}
    for key in ("args", "command"):
        values[key] = tuple(values.get(key) or ())
    profile = ReviewerProfile(**values)
    logs.add_secrets(v for k, v in profile.env.items() if logs.secret_name(k))
    return profile


def _semaphore(profile: ReviewerProfile) -> threading.BoundedSemaphore:
    with _sem_lock:
        sem = _semaphores.get(profile.name)
        if sem is None:
            sem = _semaphores[profile.name] = threading.BoundedSemaphore(profile.concurrency)
        return sem


# --- review queue -----------------------------------------------------------------------------


def run_review(msg: dict) -> None:
    """Run one attempt (SPEC §6 steps 1-5) and send its outcome to the control queue."""
    profile = _profile(msg["reviewer"])
    job_id, attempt = msg["job_id"], msg["attempt"]
    spec = AttemptSpec(
        task=msg.get("task") or "review",
        job_id=job_id,
        attempt=attempt,
        prompt_path=Path(msg["prompt_path"]),
        output_path=Path(msg["output_path"]),
        job_dir=Path(msg["job_dir"]),
        attempt_dir=Path(msg["attempt_dir"]),
        root=Path(msg["root"]),
        model=profile.model,
        note_path=msg.get("note_path"),
    )
    with _semaphore(profile), logs.bound(job_id=job_id, attempt=attempt, reviewer=profile.name):

        def beat(launched: bool = False) -> None:
            try:
                send("attempt_heartbeat", job_id, attempt, WORKER_ID, launched)
            except Exception as exc:  # a missed heartbeat is not worth killing the agent for
                logs.get().warning("attempt.heartbeat_failed", error=str(exc))

        outcome = run_attempt(
            for_profile(profile),
            spec,
            timeout_s=profile.timeout,
            max_turns=profile.max_turns,
            guarded=msg.get("guarded") or (),
            trees=msg.get("trees") or (),
            max_output_bytes=msg.get("max_output_bytes") or 5 * 1024 * 1024,
            on_tick=beat,
            tick_s=msg.get("heartbeat_s") or 30.0,
            on_launch=lambda: beat(True),  # the agent starts first: no queue write delays it
        )
        if STOPPING.is_set():
            # The worker is stopping and killed this agent; Huey queued the task again.
            logs.get().info(
                "attempt.abandoned", reason="worker stopping; the task was queued again"
            )
            return
        logs.get().info(
            "attempt.exited",
            outcome=outcome.classification,
            exit_code=outcome.exit_code,
            duration_s=round(outcome.duration_s, 3),
        )
        send("deliver_outcome", asdict(outcome))


# --- control queue ----------------------------------------------------------------------------


def said_on_failure(fn: Callable[..., None]) -> Callable[..., None]:
    """A control task that fails (state.db locked past its busy timeout, a full disk) has
    rolled its transaction back and Huey runs it again in 3 s; say so with our own event
    and the task's ids, not only Huey's generic 'Unhandled exception in task <uuid>'."""

    @functools.wraps(fn)
    def run(*args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            first = args[0] if args else None
            ids = (
                {"job_id": first.get("job_id"), "attempt": first.get("attempt")}
                if isinstance(first, dict)
                else {"job_id": first}
                if isinstance(first, int)
                else {}
            )
            logs.get().error(
                "control.task_failed",
                task=fn.__name__,
                error=f"{type(exc).__name__}: {exc}",
                retry_s=3,
                **ids,
            )
            raise

    return run


def deliver_outcome(outcome: dict) -> None:
    with logs.bound(job_id=outcome.get("job_id"), attempt=outcome.get("attempt")):
        control = _the_control()
        control.on_outcome(outcome)
        control.dispatch()


def attempt_heartbeat(job_id: int, attempt: int, worker: str, launched: bool) -> None:
    _the_control().on_heartbeat(job_id, attempt, worker, launched)


def dispatch() -> None:
    _the_control().dispatch()


def tick() -> None:
    from orchestrator.sweeps.producer import SweepRequest, due_sweeps, enqueue

    control = _the_control()
    _tick_sent_at[0] = 0.0
    control.reap()
    control.write_due_files()
    for sweep in due_sweeps(control.ws, control.now()):
        try:
            enqueue(control.ws, SweepRequest.from_config(sweep, trigger="cron"))
        except Exception as exc:
            logs.get().error("sweep.failed", sweep=sweep.name, error=str(exc))
    control.dispatch()


# When the tick now waiting in the queue was sent (0: none waits). Only the ticker
# thread sends and only tick() clears, so a plain list cell is enough.
_tick_sent_at = [0.0]


def request_tick(lost_after: float) -> None:
    """Enqueue a tick unless one is already waiting (the ticker thread calls this). A
    tick waiting longer than ``lost_after`` seconds is taken as lost (a Redis restarted
    without its data), and another is sent: otherwise the reaper would never run again."""
    now = time.monotonic()
    sent = _tick_sent_at[0]
    if sent and now - sent < lost_after:
        return
    if sent:
        logs.get().warning("control.tick_lost", waited_s=round(now - sent, 1))
    _tick_sent_at[0] = now
    try:
        send("tick")
    except BaseException:
        _tick_sent_at[0] = 0.0  # not queued: the next period tries again
        raise
