"""The queue tasks: module-level functions that take one message each (shapes and
versions: :mod:`orchestrator.control.messages`). A review message carries everything the
worker needs, so it opens no state folder and needs no KB. ``workers.app`` registers them.

Review queue: :func:`run_review`. Control queue: :func:`deliver_outcome`,
:func:`attempt_heartbeat`, :func:`dispatch`, :func:`tick`; they run in the single
control consumer, the one writer of state.db.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import faults, logs
from orchestrator.config import ReviewerProfile, Settings
from orchestrator.control import messages
from orchestrator.regularfile import private
from orchestrator.state.store import parse_timestamp, timestamp

from . import queues
from .attempt import (
    LAUNCH_FAILURE,
    NO_OUTPUT,
    STOP_ASKED,
    STOPPING,
    AttemptOutcome,
    attempt_folder,
    claim_attempt,
    making_attempt,
    registry_dir,
    run_attempt,
    stop_agent,
)
from .queues import (
    FED_KEY,
    OUTCOME_PATIENCE_S,
    acknowledge,
    claim_queue,
    mark_fed,
    other_feeder,
    queue_clock,
    release,
    requeue,
    send,
    send_once,
    shared_problem,
    stop_requests,
    the_app,
    waiting,
)
from .reviewers import AttemptSpec, for_profile

if TYPE_CHECKING:
    from orchestrator.control.control import Control


_control: Control | None = None
_semaphores: dict[str, threading.BoundedSemaphore] = {}
_sem_lock = threading.Lock()
HOST = socket.gethostname()
WORKER_ID = f"{HOST}:{os.getpid()}"


def _named_anew() -> None:
    # A sweep imports this module before it forks its worker (sweep.Children.fork): taken
    # at the import alone, the worker's id named the sweep's pid in every heartbeat,
    # attempt row and attempt.lost line, the process an operator then looks for.
    global WORKER_ID
    WORKER_ID = f"{HOST}:{os.getpid()}"


os.register_at_fork(after_in_child=_named_anew)
OUTPUT_NAMES = ("bundle-output.md", "fixed-note.md")


@dataclass(frozen=True)
class WorkerPlace:
    """What a worker has of its own: its settings (the queue and how to start each
    reviewer), its private folder (logs/, run/agents/, attempts/) and, if it was given one,
    a read-only copy of the KB root for agents that follow links."""

    settings: Settings
    folder: Path
    kb: Path | None = None


_place: WorkerPlace | None = None


def install_control(control: Control) -> None:
    global _control
    _control = control


def install_worker(place: WorkerPlace) -> None:
    global _place
    _place = place


def _the_control() -> Control:
    if _control is None:
        raise RuntimeError("this process is not the control process")
    return _control


def _the_worker() -> WorkerPlace:
    if _place is None:
        raise RuntimeError("this process is not a worker")
    return _place


class _Beats:
    """An attempt's heartbeats, each sent from a thread of its own. Sent in the loop that
    watches the agent, one waiting out a busy queue (up to two minutes) held the agent's
    exit and its deadline up as long. While one waits, the next is skipped (it would say
    the same); :meth:`wait` lets the last one go out before the attempt's outcome does.

    Nothing is sent as the agent starts: the first beat comes a second later
    (``attempt.FIRST_TICK_S``) and says the launch (``launched``, ``started_at``), then one
    every period; an agent quicker than that is told of by its outcome alone. A worker
    killed before either leaves its attempt dispatched with its message gone from the
    queue, which the control process finds and reaps a lease later. A worker waiting for
    a free agent slot says so (``waiting``) at once and every period, or that attempt
    would be reaped while it waits.
    """

    def __init__(self, job_id: int, attempt: int, opened_at: object = None) -> None:
        self.job_id, self.attempt = job_id, attempt
        self.opened_at = opened_at  # the review message's, sent back as it came
        self._in_flight = threading.Lock()
        self._thread: threading.Thread | None = None
        self._started_at = ""  # the agent's launch, until a beat has said it
        self._said = False
        self.stopped: str | None = None  # why the control asked for the agent's end

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def launched(self, started_at: str) -> None:
        self._started_at = started_at

    def send(self, waiting: bool = False) -> None:
        if not self._in_flight.acquire(blocking=False):
            return
        msg = {
            "v": messages.VERSION,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "worker": WORKER_ID,
            "host": HOST,
            "launched": bool(self._started_at) and not self._said,
        }
        if self.opened_at is not None:
            msg["opened_at"] = self.opened_at
        if waiting:
            msg["waiting"] = True
        elif self._started_at:
            msg["started_at"] = self._started_at  # in each: one may be lost on a busy queue
            self._said = True
        try:
            self._thread = threading.Thread(
                target=self._send, args=(msg,), name="reviewq-beat", daemon=True
            )
            self._thread.start()
        except RuntimeError as exc:  # no thread to be had: a missed beat, not a dead agent
            self._thread = None
            self._said = False
            self._in_flight.release()
            logs.get().warning(
                "attempt.heartbeat_failed", job_id=self.job_id, attempt=self.attempt, error=str(exc)
            )

    def _send(self, msg: dict) -> None:
        try:
            with logs.bound(job_id=self.job_id, attempt=self.attempt):
                send("attempt_heartbeat", msg)
                if self._started_at:
                    self._stop_if_asked()
        except Exception as exc:  # a missed heartbeat is not worth killing the agent for
            logs.get().warning(
                "attempt.heartbeat_failed", job_id=self.job_id, attempt=self.attempt, error=str(exc)
            )
        finally:
            self._in_flight.release()

    def _stop_if_asked(self) -> None:
        """The control no longer wants this attempt (finalized by hand, or given up as
        lost and run again): its agent is stopped, SIGTERM first, SIGKILL if it is still
        there when asked again a beat later. Its outcome goes back as any other, for the
        cost it ran up."""
        reason = stop_requests().asked(self.job_id, self.attempt, self.opened_at)
        if reason is None:
            return
        sig = signal.SIGTERM if self.stopped is None else signal.SIGKILL
        if stop_agent(_the_worker().folder, self.job_id, self.attempt, sig, self.opened_at):
            if self.stopped is None:
                logs.get().warning("attempt.stopping", reason=reason)
            self.stopped = reason


class _Reporting:
    """Heartbeats for the attempts whose outcome is on its way to the control queue. Once
    the agent has ended nothing else beats for them, and an outcome of a few MiB crossing
    a slow link can take longer than a lease: the attempt was reaped as lost, its outcome
    discarded when it came, and after enough of that the job failed for the network's
    sake. One thread for all of them, started the first time it is needed.

    The common outcome (sent in milliseconds) does not wake it: the thread is told of an
    outcome only when its first beat is due before the thread's own next look. Idle, it
    looks again after the shortest period it has been given (a beat added meanwhile is
    due no sooner), instead of being woken for each outcome: that wake-up, a thread
    switch under the GIL for every job, cost ~50 us of the worker's CPU a job."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[_Beats, tuple[float, float]] = {}  # beat -> (next, period)
        self._thread: threading.Thread | None = None
        self._looks_at = -math.inf  # when the waiting thread looks next (monotonic)
        self._shortest = math.inf  # the shortest period given so far

    @contextlib.contextmanager
    def beating(self, beat: _Beats, period_s: float) -> Iterator[None]:
        with self._cond:
            due = time.monotonic() + period_s
            self._due[beat] = (due, period_s)
            self._shortest = min(self._shortest, period_s)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="reviewq-report-beats", daemon=True
                )
                self._thread.start()
            elif due < self._looks_at:
                self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._due.pop(beat, None)
            beat.wait()

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [b for b, (at, _) in self._due.items() if at <= now]
                for b in due:
                    self._due[b] = (now + self._due[b][1], self._due[b][1])
                if not due:
                    self._looks_at = min(
                        (at for at, _ in self._due.values()), default=now + self._shortest
                    )
                    self._cond.wait(self._looks_at - now)
                    self._looks_at = -math.inf
                    continue
            for b in due:
                b.send()


REPORTING = _Reporting()


@contextlib.contextmanager
def _agent_slot(profile: ReviewerProfile, beat: _Beats, msg: dict) -> Iterator[bool]:
    """One of the profile's agent slots (True), or False once the message expired while
    it waited. Meanwhile the worker holds a message the queue no longer has, and says so
    at once and every heartbeat period; not past its expiry, after which the control
    process gives the attempt up as one no worker took."""
    sem = _semaphore(profile)
    got = sem.acquire(blocking=False)
    while not got and not STOP_ASKED.is_set():  # a drain starts no agent: see _run_prepared
        late = _late_s(msg)
        if late is not None and late > 0:
            break
        beat.send(waiting=True)
        got = sem.acquire(timeout=msg["heartbeat_s"])
    try:
        yield got
    finally:
        if got:
            sem.release()


def _semaphore(profile: ReviewerProfile) -> threading.BoundedSemaphore:
    with _sem_lock:
        sem = _semaphores.get(profile.name)
        if sem is None:
            sem = _semaphores[profile.name] = threading.BoundedSemaphore(profile.concurrency)
        return sem


# --- review queue -----------------------------------------------------------------------------


def run_review(msg: dict) -> None:
    """Run one attempt (CONTRACT §6 steps 1-5) in a private folder and send its outcome, with
    the output and the evidence, to the control queue."""
    refused = messages.refusal("review", msg)
    if refused is not None:
        logs.get().error("message.refused", **{**refused, "worker": WORKER_ID})
        _say_refused(msg)
        return
    if (bad := messages.malformed("review", msg)) is not None:
        logs.get().error("message.malformed", **{**bad, "worker": WORKER_ID})
        return
    place = _the_worker()
    if _expired(msg):
        # A run of it this worker's stop interrupted kept its folder for the run queued
        # again; declined, nothing else would ever remove it (a prompt quoting notes).
        _remove(attempt_folder(place.folder, msg["job_id"], msg["attempt"], msg.get("opened_at")))
        return
    job_id, attempt, name = msg["job_id"], msg["attempt"], msg["reviewer"]
    with logs.bound(job_id=job_id, attempt=attempt, reviewer=name):
        profile = place.settings.reviewers.get(name)
        reason = _cannot_take(place, profile, name, msg)
        if reason is not None:
            logs.get().error("attempt.not_started", reason=reason)
            _report(
                AttemptOutcome(job_id, attempt, LAUNCH_FAILURE, name, reasons=[reason]), {}, msg
            )
            return
        folder = attempt_folder(place.folder, job_id, attempt, msg.get("opened_at"))
        kb, notices = _kb_for(place.kb, msg)
        try:
            with making_attempt(place.folder):
                spec = _prepare(folder, msg, profile, kb)
                # Held while the attempt runs here: a worker starting beside this one
                # (sharing its folder), and a reap of a dead one's agent, remove the
                # attempt folders nobody holds.
                claim = _hold(folder)
        except OSError as exc:
            # This worker's disk (full, read-only): not the job's fault, and said at once
            # rather than by a lease running out.
            reason = (
                f"worker {WORKER_ID} could not prepare its attempt folder: {logs.error_said(exc)}"
            )
            logs.get().error("attempt.not_started", reason=reason)
            # Its folder, made in part (a prompt begun), goes too: left, only a worker's
            # start removed it, and a full disk left one for each attempt taken (K102).
            _remove(folder)
            failed = AttemptOutcome(job_id, attempt, LAUNCH_FAILURE, name, reasons=[reason])
            failed.notices = notices
            _report(failed, {}, msg)
            return

        try:
            _run_prepared(place, msg, profile, spec, kb, notices)
        finally:
            _let_go(folder, claim)


def _run_prepared(
    place: WorkerPlace,
    msg: dict,
    profile: ReviewerProfile,
    spec: AttemptSpec,
    kb: Path | None,
    notices: list[dict],
) -> None:
    """An attempt whose folder is ready: its agent once a slot is free, then its outcome."""
    job_id, attempt, name = msg["job_id"], msg["attempt"], msg["reviewer"]
    folder = spec.attempt_dir
    beat = _Beats(job_id, attempt, msg.get("opened_at"))
    # How far the queue's clock is, read at the launch and again at the end: a clock
    # stepped meanwhile (NTP started, set by hand) ended an attempt before its launch.
    launch_ahead: list[float] = []

    def launched(at: str) -> None:
        launch_ahead.append(_queue_ahead_s())
        beat.launched(_on_queue_clock(at, launch_ahead[0]))

    with _agent_slot(profile, beat, msg) as got:
        if STOP_ASKED.is_set():
            # A drain (Ctrl-C, a reload's SIGHUP) lets the running agents finish. A message
            # held for a slot got the slot of the agent that ended in it, or one was taken
            # as the stop came: the draining worker started its agent and ran it whole (a
            # review's timeout) before it stopped. Not started, it goes back to the queue.
            logs.get().info(
                "attempt.abandoned",
                reason="worker stopping before its agent started; the task was queued again",
            )
            _queue_again(msg)
            _remove(folder)
            return
        if _expired(msg) or not got:  # it waited for a free agent slot past its lease
            _remove(folder)
            return
        try:
            outcome = run_attempt(
                for_profile(profile),
                spec,
                timeout_s=msg["timeout_s"],
                max_turns=profile.max_turns,
                # The KB check needs a KB: a worker without one has nothing to guard.
                guarded=msg.get("guarded") or () if kb else (),
                trees=msg.get("trees") or () if kb else (),
                max_output_bytes=msg["max_output_bytes"],
                on_tick=beat.send,
                tick_s=msg["heartbeat_s"],
                on_launch=launched,
                registry=registry_dir(place.folder),
                keep_tmpdir=True,
            )
        except Exception as exc:  # noqa: BLE001 - said and counted, not lost
            # Raised out of the task, no outcome went back: the attempt was reaped as
            # "never picked up", which counts toward nothing, and ran again for good.
            reason = f"worker {WORKER_ID} could not run the attempt: {type(exc).__name__}: {logs.error_said(exc)}"
            logs.get().error("attempt.worker_error", reason=reason)
            outcome = AttemptOutcome(job_id, attempt, LAUNCH_FAILURE, name, reasons=[reason])
    beat.wait()  # a beat sent goes before the outcome: the attempt's story in order
    if beat.stopped is not None:
        outcome.reasons.append(f"stopped at the control's request: {beat.stopped}")
    if STOPPING.is_set():
        # The worker is stopping and killed this agent; Huey queued the task again.
        logs.get().info("attempt.abandoned", reason="worker stopping; the task was queued again")
        if _still_held(folder):
            _forget(profile, spec)
        return
    if beat.stopped is None and stopped_with(outcome):  # not the control's own stop
        # `systemctl stop` of a unit whose KillMode signals the whole cgroup (systemd's
        # default, control-group) gave the agent the worker's own stop signal: it died
        # with no output and burned an attempt (three such stops failed the job and
        # escalated its pairs), or, early, counted toward pausing the reviewer.
        logs.get().info(
            "attempt.abandoned",
            reason="its agent was stopped with this worker (the stop signal reached the "
            "agent too: KillMode=mixed keeps it to the worker); the task was queued again",
            exit_code=outcome.exit_code,
        )
        _queue_again(msg)
        if _still_held(folder):
            _forget(profile, spec)
        return
    logs.get().info(
        "attempt.exited",
        outcome=outcome.classification,
        exit_code=outcome.exit_code,
        duration_s=round(outcome.duration_s, 3),
    )
    outcome.notices = [*notices, *outcome.notices]
    end_ahead = _queue_ahead_s()
    outcome.started_at = _on_queue_clock(outcome.started_at, (launch_ahead or [end_ahead])[0])
    outcome.ended_at = _on_queue_clock(outcome.ended_at, end_ahead)
    try:
        with _sending(msg), REPORTING.beating(beat, msg["heartbeat_s"]):
            _report(outcome, _evidence(spec), msg)
            _delivered(msg)
        faults.point("worker.outcome_sent")
    finally:
        # Sent, the control keeps what matters; or given up (a queue away past the send's
        # patience), the reaper runs the attempt again in a folder of its own: either way
        # nothing here is read again, and a folder left was a prompt, with the notes, kept
        # until the worker's next start (the CLI's, in its home, for good). What the CLI
        # kept goes first: Codex names its session only in the folder's stdout.log.
        try:
            _forget(profile, spec)
        finally:
            _remove(folder)


def _queue_again(msg: dict) -> None:
    """This worker's review message back on the queue, its agent not run (or stopped with
    the worker), for another worker or this one restarted."""
    try:
        put_back(msg, functools.partial(send, "run_review", msg))
    except Exception as exc:  # noqa: BLE001 - the reaper runs it again a lease later
        logs.get().warning("attempt.requeue_failed", error=str(exc))


def _queue_ahead_s() -> float:
    """How far the queue's clock is ahead of this machine's (behind: negative), or 0
    within a second or where it cannot be read. The control stores an attempt's launch
    and end as its worker says them, beside its own times: a worker's clock ten minutes
    ahead gave an attempt of 6 s a `launched_at` ten minutes after the control's line
    saying it, and `ended_at` ten minutes after its start (a report's window, and which
    attempt ended last, read them so). The queue's clock is the one both sides read."""
    with contextlib.suppress(Exception):  # the queue away: the outcome waits for it anyway
        ahead = queue_clock(the_app().review) - time.time()
        return ahead if abs(ahead) >= 1.0 else 0.0
    return 0.0


def _on_queue_clock(stamp: str, ahead_s: float) -> str:
    """A time this machine's clock gave (state.db's form), moved onto the queue's."""
    if not ahead_s or not stamp:
        return stamp
    try:
        return timestamp(parse_timestamp(stamp) + timedelta(seconds=ahead_s))
    except ValueError:
        return stamp


def _forget(profile: ReviewerProfile, spec: AttemptSpec) -> None:
    """What the CLI kept in its home for an attempt that has ended here (its outcome sent,
    or its agent stopped with this worker, a new run queued): none of it is read again,
    and a run queued again is a new session of its own. One that cannot be removed is
    left, never failing the attempt."""
    with contextlib.suppress(Exception):
        for_profile(profile).forget(spec)


def forget_left(folder: Path) -> None:
    """What the CLIs kept for an attempt folder another run of this worker left, forgotten
    before the folder goes (a worker SIGKILLed mid-attempt, found at the next start): its
    profile is not written down, so each profile's adapter looks, each finding only its
    own CLI's state of that folder (its path, the session its logs name)."""
    place = _place
    if place is None:
        return
    spec = _left_spec(folder, place.kb)
    for profile in place.settings.reviewers.values():
        _forget(profile, spec)


def forget_stopped(folder: Path) -> None:
    """:func:`forget_left` of a folder this stopping worker keeps for the run queued
    again, while it is still the one its attempt made (:func:`_still_held`)."""
    if _still_held(folder):
        forget_left(folder)


# The attempt folders this process holds (claim_attempt's descriptors), by their paths.
_HELD: dict[Path, int] = {}


def _hold(folder: Path) -> int | None:
    """``folder`` claimed for this process's attempt (:func:`claim_attempt`), and kept
    in :data:`_HELD` until :func:`_let_go`."""
    claim = claim_attempt(folder)
    if claim is not None:
        _HELD[folder] = claim
    return claim


def _let_go(folder: Path, claim: int | None) -> None:
    if claim is not None:
        _HELD.pop(folder, None)
        os.close(claim)


def _still_held(folder: Path) -> bool:
    """Whether the folder at ``folder`` is still the one this process's attempt made and
    holds. A stopping worker queues its attempt again before it forgets the CLI's state of
    it; a worker sharing its --state can take the run up at once and make the kept folder
    anew (having forgotten this run's state itself, :func:`_prepare`), and this one's late
    forget then read the new run's logs and removed its live session (Codex's rollout and
    rows, Gemini's chat log). The descriptor held keeps its folder's inode from being
    reused, so a folder made anew is never taken for it."""
    claim = _HELD.get(folder)
    if claim is None:
        return False
    try:
        held, there = os.fstat(claim), os.stat(folder)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


def _left_spec(folder: Path, kb: Path | None) -> AttemptSpec:
    """An attempt folder left as a spec of its own: what ``forget`` reads (its folder, its
    logs, the folder its agent ran in)."""
    return AttemptSpec(
        task="review",
        job_id=0,
        attempt=0,
        prompt_path=folder / "prompt.md",
        output_path=folder / "output",
        job_dir=folder,
        attempt_dir=folder,
        root=kb or folder,
        model="",
    )


# The attempts this process put back on the review queue, each with its send's end. A stop
# at once (SIGTERM) has Huey put back every task it interrupted, from the main thread; the
# thread of an agent the same signal killed a moment before puts its own back: both did,
# and the attempt was queued twice (run twice, side by side on a worker with two slots).
_put_back: dict[tuple[object, object, object], threading.Event] = {}
_put_back_lock = threading.Lock()
# The attempts whose outcome this process sent, the latest few: a stop at once that came
# while the thread forgot the CLI's session and removed the attempt's folder had Huey put
# the task back as one it cut short, and the next worker ran the agent again (K101).
_sent: dict[tuple[object, object, object], None] = {}
_SENT_KEPT = 1024  # far more than a worker's threads: only those in flight matter


def _key(msg: dict) -> tuple[object, object, object]:
    return (msg.get("job_id"), msg.get("attempt"), msg.get("opened_at"))


# The review messages whose attempt's outcome a thread is sending now, by attempt: a stop
# at once that comes meanwhile leaves each to its send, for the stop's grace (K103).
_on_its_way: dict[tuple[object, object, object], dict] = {}
_sends_done = threading.Condition(_put_back_lock)


@contextlib.contextmanager
def _sending(msg: dict) -> Iterator[None]:
    with _put_back_lock:
        _on_its_way[_key(msg)] = msg
    try:
        yield
    finally:
        with _put_back_lock:
            _on_its_way.pop(_key(msg), None)
            _sends_done.notify_all()


def sends_finished(timeout_s: float) -> None:
    """A stopping worker's outcomes on their way get ``timeout_s`` to go. One still on
    its way then is not put back: a queue that holds its writes (Redis under `CLIENT
    PAUSE`, a busy control.db) lands it later, and the put-back beside it, waiting on the
    same queue, had the stop wait for the queue and the agent run again for a decided
    attempt (C89). Never landed, the control's reaper runs the attempt again a lease on."""
    deadline = time.monotonic() + timeout_s
    with _put_back_lock:
        while _on_its_way and _sends_done.wait(max(0.0, deadline - time.monotonic())):
            pass


def _delivered(msg: dict) -> None:
    """The outcome of ``msg``'s attempt is on the control queue: it is never put back."""
    with _put_back_lock:
        _sent[_key(msg)] = None
        while len(_sent) > _SENT_KEPT:
            del _sent[next(iter(_sent))]


def outcome_sent(msg: dict) -> bool:
    """Whether this process sent the outcome of ``msg``'s attempt, or is sending it (then
    :func:`sends_finished` gives it the stop's grace)."""
    with _put_back_lock:
        return _key(msg) in _sent or _key(msg) in _on_its_way


def put_back(msg: dict, enqueue: Callable[[], None]) -> bool:
    """Queue an interrupted review message again with ``enqueue``, unless this process
    has already put its attempt back (False). One that fails may be put back again."""
    key = _key(msg)
    with _put_back_lock:
        if key in _put_back:
            return False
        sent = _put_back[key] = threading.Event()
    try:
        enqueue()
    except BaseException:
        with _put_back_lock:
            del _put_back[key]
        raise
    finally:
        sent.set()
    return True


def put_backs_sent(timeout_s: float) -> None:
    """Wait (``timeout_s`` at most) for the put-backs under way: a stop at once leaves
    each to the one that claimed it, and the process must not end under its send."""
    deadline = time.monotonic() + timeout_s
    with _put_back_lock:
        pending = list(_put_back.values())
    for sent in pending:
        sent.wait(max(0.0, deadline - time.monotonic()))


# A stop's signals, as an agent ends by them: killed (a negative return code), a shell or
# CLI exiting with 128 + the signal's number, or 0: Claude Code takes a SIGINT for a
# person's Ctrl-C and exits 0 having written nothing (counted, that attempt was burned).
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_STOPPED_CODES = {0} | {-s for s in _STOP_SIGNALS} | {128 + s for s in _STOP_SIGNALS}


# How long a starting worker tries to tell the control of a dead worker's attempts:
# past that, the control's reaper gives each up a lease after its last heartbeat.
REAPED_PATIENCE_S = 10.0


def tell_reaped(orphaned: list[tuple]) -> None:
    """Tell the control of the attempts whose worker died and whose agents this starting
    worker reaped (a reap notice, :mod:`orchestrator.control.messages`): each is lost and
    run again at once, where the control would have waited a lease (minutes for a real
    agent) without a beat. A queue that does not take one takes none of the rest either:
    said once for them all, and the worker goes on to its start."""
    for i, (job_id, attempt, dead, *opened) in enumerate(orphaned):
        notice = {
            "v": messages.VERSION,
            "job_id": job_id,
            "attempt": attempt,
            "worker": WORKER_ID,
            "host": HOST,
            "reaped": dead,
        }
        if opened and isinstance(opened[0], str):
            # Which attempt of these numbers: a lost history's does not cost this one.
            notice["opened_at"] = opened[0]
        try:
            send("deliver_outcome", notice, patience_s=REAPED_PATIENCE_S)
        except Exception as exc:  # noqa: BLE001 - the reaper's lease makes good the loss
            logs.get().warning(
                "worker.reap_unsent",
                attempts=[[o[0], o[1]] for o in orphaned[i:]],
                reaped=sorted({o[2] for o in orphaned[i:]}),
                error=f"{type(exc).__name__}: {exc}",
                recovery="the control gives each up a lease after its last heartbeat",
            )
            return


def stopped_with(outcome: AttemptOutcome) -> bool:
    """Whether the agent ended with no output by a stop signal sent to this worker too.
    The signal may reach the worker a moment after its agent (systemd signals the main
    process and the others of the cgroup one by one): a second is waited for it, only
    when the agent ended so."""
    return (
        outcome.classification in (NO_OUTPUT, LAUNCH_FAILURE)
        and outcome.exit_code in _STOPPED_CODES
        and STOP_ASKED.wait(1.0)
    )


def _say_refused(msg: object) -> None:
    """Tell the control process of a review message refused for its version, in this
    worker's own: it refuses that in turn, and its ``message.refused`` line (the job, this
    worker and host, both versions) is then in the log `reviewq logs` reads on the
    control's machine, which showed only an ``attempt.lost`` a lease later."""
    ids = messages.refusal("review", msg) or {}
    if not isinstance(ids.get("job_id"), int):
        return
    notice = {
        "v": messages.VERSION,
        "job_id": ids["job_id"],
        "attempt": ids.get("attempt"),
        "worker": WORKER_ID,
        "host": HOST,
        "refused_version": ids["version"],
    }
    try:
        send_once("deliver_outcome", notice)
    except Exception as exc:  # noqa: BLE001 - said here already; the reaper does the rest
        logs.get().warning("message.refusal_unsent", job_id=ids["job_id"], error=str(exc))


def _cannot_take(
    place: WorkerPlace, profile: ReviewerProfile | None, name: str, msg: dict
) -> str | None:
    """Why this worker must not start the message's attempt, or None."""
    if profile is None:
        return f"worker {WORKER_ID} has no reviewer profile {name!r} in its configuration"
    if msg.get("output_name") not in OUTPUT_NAMES:
        return f"the message names no known output file ({msg.get('output_name')!r})"
    wanted = msg.get("partition")
    if isinstance(wanted, str) and wanted and wanted != profile.partition:
        # The control records the review under its profile's partition: run here under
        # another (a worker.toml left at the old model, whose partition follows it), it
        # would be filed as the control's model's, unseen. The model alone may differ (a
        # provider's own id for it): the partition says which reviews it stands for.
        where = place.settings.config_path or "its configuration"
        return (
            f"worker {WORKER_ID}'s reviewer profile {name!r} writes partition "
            f"{profile.partition!r} (model {profile.model!r}), the control's writes "
            f"{wanted!r}: give [reviewers.{name}] of {where} the control's model, or "
            f"partition = {wanted!r}, and restart the worker"
        )
    return None


def _kb_for(kb: Path | None, msg: dict) -> tuple[Path | None, list[dict]]:
    """The --kb copy for this attempt, or None, and what was said of it for the control
    to say again (on another machine, the worker's log is not the one its operator reads).
    A fix is not shown a copy whose note is not the text the fixer is given: a fixer that
    read the note there, not in its prompt, wrote the old text back with its edit, and
    the control applied it (the note had not changed since the fix was given it), so a
    stale copy undid a person's edits."""
    note, given = msg.get("note_path"), msg.get("note_text")
    if kb is None or msg.get("task") != "fix" or not isinstance(note, str) or given is None:
        return kb, []
    try:
        path = (kb / note).resolve()
        current = path.read_bytes() if path.is_relative_to(kb.resolve()) else None
    except OSError:
        current = None
    if current == str(given).encode("utf-8"):
        return kb, []
    said = {
        "note_path": note,
        "reason": f"{note} in --kb {kb} is not the text the fixer is given (a stale copy: "
        "update it while the worker is stopped; or the note was edited since): the fixer "
        "runs without the KB",
    }
    logs.get().warning("attempt.kb_stale", **said)
    return None, [{"event": "attempt.kb_stale", **said}]


def _expired(msg: dict) -> bool:
    """Whether the reaper has taken this attempt for lost and queued another (said in
    the log): running it would only spend money on an outcome nobody acts on. Timed on
    the queue's clock when the message was stamped with it: by the expiry the control
    wrote on its own clock, a worker whose clock ran ahead declined every message, and
    one running behind started attempts already given up."""
    late = _late_s(msg)
    if late is None or late <= 0:
        return False
    logs.get().warning(
        "attempt.expired",
        worker=WORKER_ID,
        job_id=msg.get("job_id"),
        attempt=msg.get("attempt"),
        late_s=round(late, 1),
    )
    return True


def _late_s(msg: dict) -> float | None:
    """How far past its expiry the message is (negative: not yet), or None if it says no
    expiry: on the queue's clock when it is stamped with it and that clock can be read,
    else on this machine's against ``expires_at``."""
    ttl, queued = msg.get("ttl_s"), msg.get("queued_at")
    if isinstance(ttl, int | float) and isinstance(queued, int | float):
        with contextlib.suppress(Exception):
            return queue_clock(the_app().review) - queued - ttl
    expires = msg.get("expires_at")
    return time.time() - expires if isinstance(expires, int | float) else None


def _prepare(folder: Path, msg: dict, profile: ReviewerProfile, kb: Path | None) -> AttemptSpec:
    """The attempt's private folder, as the agent expects a job folder to look: its
    prompt, a MANIFEST.json with the pairs and, for a fix, the note it was given."""
    try:
        os.mkdir(folder, 0o700)  # the prompt quotes the notes
    except FileExistsError:  # a run of this attempt that was interrupted
        _forget(profile, _left_spec(folder, kb))  # its CLI's state, that run's alone
        shutil.rmtree(folder, ignore_errors=True)
        os.mkdir(folder, 0o700)
    except FileNotFoundError:  # the worker's first attempt, or attempts/ was removed
        folder.mkdir(mode=0o700, parents=True)
    output = folder / msg["output_name"]
    prompt = msg["prompt"]
    if msg.get("output_shown"):
        prompt = prompt.replace(f"`{msg['output_shown']}`", f"`{output}`")
    _write(folder / "prompt.md", prompt)
    manifest = {"review_job_id": msg["job_id"], "kind": msg["task"], "pairs": msg["pairs"]}
    _write(folder / "MANIFEST.json", json.dumps(manifest))
    note_file = None
    if msg["task"] == "fix" and msg.get("note_text") is not None:
        note_file = folder / "note.md"
        _write(note_file, msg["note_text"])
    return AttemptSpec(
        task=msg["task"],
        job_id=msg["job_id"],
        attempt=msg["attempt"],
        prompt_path=folder / "prompt.md",
        output_path=output,
        job_dir=folder,
        attempt_dir=folder,
        root=kb or folder,
        model=profile.model,
        note_path=msg.get("note_path"),
        note_file=note_file,
        opened_at=msg["opened_at"] if isinstance(msg.get("opened_at"), str) else None,
    )


def _write(path: Path, text: str) -> None:
    """A new file of the attempt's folder, in the fewest system calls (open, write, close)."""
    fd = private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC)
    try:
        data = memoryview(text.encode())
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def _remove(folder: Path) -> None:
    """The attempt's folder: its files unlinked one by one (what rmtree does, without its
    own checks, which cost ~40 µs an attempt), then the folder; whatever else an agent
    left in it (a folder of its own) by rmtree."""
    try:
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)


def _evidence(spec: AttemptSpec) -> dict[str, bytes]:
    """Bounded copies of what the agent left beside its output, for the job folder."""
    files = {}
    for path, limit, tail in (
        (spec.stdout_path, messages.LOG_TAIL_BYTES, True),
        (spec.stderr_path, messages.LOG_TAIL_BYTES, True),
        (spec.telemetry_path, messages.TELEMETRY_BYTES, False),
    ):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:  # a tail, or a head, in one read at its offset
            start = max(0, os.fstat(fd).st_size - limit) if tail else 0
            files[path.name] = os.pread(fd, limit, start)
        except OSError:
            continue
        finally:
            os.close(fd)
    return files


def _report(outcome: AttemptOutcome, files: dict[str, bytes], msg: dict | None = None) -> None:
    """``msg``: the review message answered, whose ``opened_at`` goes back with the
    outcome (absent from one of an earlier release's control: none is sent)."""
    opened = {"opened_at": msg["opened_at"]} if msg and "opened_at" in msg else {}
    send(
        "deliver_outcome",
        {
            **vars(outcome),  # plain data, sent as it is: asdict's deep copy cost ~40 µs
            **opened,
            "v": messages.VERSION,
            "worker": WORKER_ID,
            "host": HOST,
            "files": files,
            # Where this machine's secrets lie in the output: the control redacts what it
            # stores of it with its own, and may run on a machine that has none of these.
            "redact": logs.secret_spans(outcome.output) if outcome.output else [],
        },
        patience_s=OUTCOME_PATIENCE_S,
    )


# --- control queue ----------------------------------------------------------------------------


def said_on_failure(fn: Callable[..., None]) -> Callable[..., None]:
    """A control task that fails (state.db locked past its busy timeout, a full disk) has
    rolled its transaction back and Huey runs it again in 3 s while it has retries left;
    say so with our own event and the task's ids, not only Huey's generic 'Unhandled
    exception in task <uuid>'.
    ``task`` is Huey's (``context=True``)."""

    @functools.wraps(fn)
    def run(*args: Any, task: Any = None) -> None:
        try:
            fn(*args)
        except Exception as exc:
            if not getattr(task, "retries", 0):
                _release()  # out of retries: nothing runs it again, so it goes now
            # else Huey writes the retry, and the queue releases it then (add_to_schedule)
            first = args[0] if args else None
            ids = (
                {"job_id": first.get("job_id"), "attempt": first.get("attempt")}
                if isinstance(first, dict)
                else {"job_id": first}
                if isinstance(first, int)
                else {}
            )
            left = getattr(task, "retries", 0) or 0
            # The last try's line said `retry_s=3` like the others: a task Huey then
            # dropped read as one that would run again.
            logs.get().error(
                "control.task_failed",
                task=fn.__name__,
                error=f"{type(exc).__name__}: {exc}",
                **({"retry_s": 3} if left else {}),
                retries_left=left,
                **ids,
            )
            raise
        _release()  # kept: off the queue (an interrupt leaves it there, to run again)

    return run


def _release() -> None:
    huey = _control_queue()
    if huey is not None:
        release(huey)


BATCH = 100  # messages taken together at most: a bound on one transaction's length
BATCH_BYTES = 64 * 1024 * 1024  # ... and their size: a bound on the control's memory
_DRAIN_BATCHES = 50  # batches a tick takes before it reaps, at most
# How long a control task lets the messages behind its own gather before it reads them:
# a batch's fixed costs (Huey's task, the queue's read and acknowledgement, the commit,
# the dispatch's reads) are paid once however many it holds, and taken as they came a
# batch held ~1.7. A wait, not CPU. Bounded by what a worker slot has in hand: its next
# attempts wait on the review queue (PREFETCH; QUICK_PREFETCH for agents quicker than the
# control's round, whose outcomes pile up behind the wait), and the dispatch that refills
# them comes after it; at 8 ms the bench's 4-ms agents left slots idle, at 4 ms less so.
GATHER_S = 0.004


def deliver_outcome(outcome: dict) -> None:
    _take_waiting("outcome", outcome)


def attempt_heartbeat(msg: dict, *version_1: object) -> None:
    """``version_1``: a worker of version 1 sent (job_id, attempt, worker, launched)."""
    _take_waiting("heartbeat", msg)


def _take_waiting(kind: str | None, first: dict | None) -> int:
    """Handle this message with the outcomes and heartbeats waiting behind it, in one
    transaction, then dispatch once. Those stay on the queue until the transaction has
    committed: a control process killed meanwhile finds them again when it restarts (a
    lost outcome would cost an agent's run). Other tasks are left where they are (a
    dispatch nudge is dropped: the dispatch here does its work). With no message of its
    own (``kind`` None: a tick), only those waiting. Returns how many were taken."""
    if kind is not None and not _taken_as_it_is(kind, first):
        return 0
    control = _the_control()
    huey = _control_queue()
    batch: list[_Taken] = [(kind, first, None, None)] if kind is not None else []
    taken: list[object] = []  # acknowledged once the batch is kept
    stay: set[object] = set()  # ... but for those _one_by_one could not put back
    nudged = False
    # A process's first message runs alone: the queue counts the processes that died
    # holding it first, and in a batch one behind it could have been the killer.
    alone = huey is None or getattr(huey.storage, "holding_first", False)
    if not alone and kind is not None:
        _let_gather()
    for token, task in [] if alone else waiting(huey, BATCH - 1, BATCH_BYTES):
        name = {"deliver_outcome": "outcome", "attempt_heartbeat": "heartbeat"}.get(task.name)
        if name is None:
            if task.name == "dispatch":
                nudged = True  # done below, once
                taken.append(token)
            continue
        taken.append(token)
        msg = task.args[0] if task.args else None
        if _taken_as_it_is(name, msg):
            batch.append((name, msg, task, token))
    # Taken off once kept, or once back on the queue with one retry less (_one_by_one);
    # not on an interrupt, which leaves the transaction uncommitted and the messages owed.
    wanted = nudged or any(b[0] == "outcome" for b in batch)
    dispatched = False
    try:
        if batch:
            dispatched = _keep(control, huey, batch, stay, wanted)
    except Exception:
        _acknowledge(huey, [t for t in taken if t not in stay])
        raise
    _acknowledge(huey, [t for t in taken if t not in stay])
    if wanted and not dispatched:
        control.dispatch()
    return len(taken)


def _taken_as_it_is(kind: str, msg: object) -> bool:
    """Whether a heartbeat or outcome is of this version and shape; one that is not is
    said in one line and taken off the queue unrun."""
    refused = messages.refusal(kind, msg)
    if refused is not None:
        logs.get().error("message.refused", **refused)
        return False
    bad = messages.malformed(kind, msg)  # type: ignore[arg-type] - a dict of this version
    if bad is not None:
        logs.get().error("message.malformed", **bad)
        return False
    return True


def _let_gather() -> None:
    time.sleep(GATHER_S)


def _acknowledge(huey, taken: list[object]) -> None:  # noqa: ANN001
    if huey is not None:
        acknowledge(huey, taken)


# A message of a batch: its kind, payload, Huey task and queue token (None for the
# message Huey is running, which the queue holds).
_Taken = tuple[str, dict, object, object]


def _keep(control: Control, huey, batch: list[_Taken], stay: set[object], dispatch: bool) -> bool:  # noqa: ANN001
    """The batch in one transaction, with the next dispatch pass if ``dispatch``; if that
    fails, its messages one by one. True when that pass left no dispatch to do after the
    commit (:meth:`Control.on_messages`: a follow-up's unwritten folder leaves one)."""
    first = batch[0][1]
    beats = [m for k, m, _, _ in batch if k == "heartbeat"]
    outcomes = [m for k, m, _, _ in batch if k == "outcome"]
    try:
        with logs.bound(job_id=first.get("job_id"), attempt=first.get("attempt")):
            return control.on_messages(beats, outcomes, dispatch)
    except Exception as exc:
        if len(batch) == 1 and batch[0][2] is None:  # the task's own message: Huey retries it
            raise
        # Nothing of the batch was kept: take the messages one by one, so one that cannot
        # be handled now does not hold back the rest.
        logs.get().error(
            "control.task_failed",
            task=f"batch of {len(batch)} (outcomes {len(outcomes)}, heartbeats {len(beats)})",
            error=f"{type(exc).__name__}: {exc}",
            retry="one by one, now",
            job_id=first.get("job_id"),
            attempt=first.get("attempt"),
        )
        _one_by_one(control, huey, batch, stay)
        return False


def _one_by_one(control: Control, huey, batch: list[_Taken], stay: set[object]) -> None:  # noqa: ANN001
    """This task's own message, if it fails, is raised for Huey to retry; a message taken
    off the queue goes back on it with one retry less, and is dropped with an error line
    when it has none left (as Huey does with a task out of retries). One that cannot be
    put back (the queue unavailable past the send's patience) goes into ``stay``: it is
    left on the queue as it came, for a later batch."""
    failed: Exception | None = None
    for kind, msg, task, token in batch:
        try:
            with logs.bound(job_id=msg.get("job_id"), attempt=msg.get("attempt")):
                if kind == "heartbeat":
                    control.on_messages([msg], [])
                else:
                    control.on_messages([], [msg])
        except Exception as exc:
            if task is None:
                failed = exc
                continue
            left = getattr(task, "retries", 0) or 0
            # Counted as said_on_failure counts, the runs still to come: put back with
            # `left - 1` retries, it runs once more and then those. `left - 1` said 0 of a
            # message put back, as of the one dropped after it.
            logs.get().error(
                "control.task_failed",
                task=kind,
                job_id=msg.get("job_id"),
                attempt=msg.get("attempt"),
                error=f"{type(exc).__name__}: {exc}",
                **({"retry_s": 0} if left else {}),
                retries_left=left,
            )
            if left > 0:
                task.retries = left - 1  # type: ignore[attr-defined]
                try:
                    requeue(huey, task)
                except Exception as lost:  # noqa: BLE001 - any: the message must not go
                    stay.add(token)
                    logs.get().error(
                        "control.requeue_failed",
                        task=kind,
                        job_id=msg.get("job_id"),
                        error=f"{type(lost).__name__}: {lost}",
                        recovery="left on the queue for the next batch",
                    )
    if failed is not None:
        raise failed


def _control_queue():  # noqa: ANN202 - a Huey, or None in a process without the app
    try:
        return the_app().control
    except RuntimeError:
        return None


def dispatch() -> None:
    _the_control().dispatch()


def _applied_waiting() -> bool:
    """Apply the heartbeats and outcomes waiting in the queue before the reaper judges:
    after the control (or the queue) was away longer than a lease, those behind a tick
    are news of live attempts and of attempts that ended. Judged before them, every live
    attempt was "lost" and its agent run again. False when some wait that cannot be taken
    now (a process's first message runs alone): the reaper then waits for the next tick."""
    huey = _control_queue()
    if huey is None:
        return True
    if getattr(huey.storage, "holding_first", False):
        news = ("deliver_outcome", "attempt_heartbeat")
        return not any(task.name in news for _, task in waiting(huey, BATCH, BATCH_BYTES))
    for _ in range(_DRAIN_BATCHES):
        if _take_waiting(None, None) == 0:
            break
    return True


def tick() -> None:
    from orchestrator.sweeps.producer import enqueue_due_sweeps, follow_budgets

    control = _the_control()
    with _tick_lock:
        _tick_sent_at[0] = 0.0
    if _applied_waiting():
        control.reap()
    control.write_due_files()
    follow_budgets(control.ws)  # before dispatch reads them
    enqueue_due_sweeps(control.ws, control.now(), away=control.away)
    control.dispatch()
    _publish(control)


_unmarked = [False]  # said once: the key could not be written
_install: list[int | None] = [None]  # the state folder's name this control claims under


def claimed_as(install: int) -> None:
    """The install this control claimed its Redis database for (run_control's start),
    whose claim each tick renews."""
    _install[0] = install


_shared: set[tuple[object, object]] = set()  # the other controls said to feed this queue
_marked_at: list[float | None] = [None]  # the queue's clock at this control's last mark


def _publish(control: Control) -> None:
    """Write, on a Redis queue, that this control feeds it and its profiles' partitions
    (for doctor --worker, and for a worker's start)."""
    settings = control.settings
    other = None
    if _install[0] is not None:
        try:
            other = claim_queue(
                the_app().control,
                _install[0],
                control.ws.state_dir,
                settings.queue.reaper_seconds,
            )
        except Exception:  # noqa: BLE001 - unread: the mark below meets the same, and says it
            other = None
    # Only a mark written over this control's own tells of another that runs: before its
    # first, the key may be that of the control it replaced (a rollout: a new container,
    # so a new host name, on the same state folder), fresh and never written again.
    if other is None and _marked_at[0] is not None:
        try:
            other = other_feeder(the_app().control, control.ws.state_dir, since=_marked_at[0])
        except Exception:  # noqa: BLE001 - unread: the mark below meets the same, and says it
            other = None
    if other is not None and (seen := (other.get("host"), other.get("state"))) not in _shared:
        _shared.add(seen)  # said once for each: both controls keep writing the key
        from orchestrator.state.status import keep_shared
        from orchestrator.state.store import utcnow

        # Before the line: `status` sends the operator to the log from this second on.
        said, at = shared_problem(settings, other), utcnow()
        logs.get().error("queue.shared", reason=said)
        with contextlib.suppress(OSError):  # said in the log; status misses it alone
            keep_shared(control.ws.state_dir, said, at)
    try:
        _marked_at[0] = mark_fed(
            the_app().control,
            control.ws.state_dir,
            {name: p.partition for name, p in settings.reviewers.items()},
            every=settings.queue.reaper_seconds,
        )
    except queues.QUEUE_UNAVAILABLE:
        pass  # the next tick writes it
    except Exception as exc:  # noqa: BLE001 - an ACL may forbid the key; the tick went on
        if not _unmarked[0]:
            logs.get().warning("queue.unmarked", key=FED_KEY, error=str(exc))
        _unmarked[0] = True


# When the tick now waiting in the queue was sent (0: none waits). Only the ticker
# thread sends and only tick() clears; the lock keeps a clear from being undone by the
# ticker's restamp of a send that took long (see request_tick).
_tick_sent_at = [0.0]
_tick_lock = threading.Lock()


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
    # It waits from when it was queued: a send retried through a full queue disk for 20 s
    # read as a tick "lost" at once (a Redis restarted empty), and a second was sent.
    with _tick_lock:
        if _tick_sent_at[0] == now:  # not run yet
            _tick_sent_at[0] = time.monotonic()
