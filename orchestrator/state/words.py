"""An attempt's outcome and reason as a person reads them. The stored values
(``launch-failure``, ``unreachable: …``) stay what ``--json``, the log and CONTRACT name;
the screens a person reads in the morning (``job N``, the sweep's summary, the report,
``status``) say them in words."""

from __future__ import annotations

OUTCOMES = {
    "finalized": "finished",
    "invalid-output": "wrote an invalid output",
    "no-output": "wrote no output",
    "burned-out": "ran out of time or turns",
    "reviewer-touched-kb": "changed the KB",
    "launch-failure": "the agent did not start",
    "reviewer-failure": "no model answered",
    "lost": "lost (no word from a worker in time)",
    "superseded": "superseded",
    "dispatched": "waiting for a worker",
    "running": "running",
}

# The kind a reviewer failure's reason starts with (workers.reviewers.base.FAILURES, and
# a worker's full disk, memory or process limit).
FAILURES = {
    "unreachable": "the reviewer's endpoint could not be reached",
    "auth": "the reviewer's key or login was refused",
    "quota": "the reviewer's quota is spent",
    "rate-limit": "the reviewer was rate-limited",
    "server": "the reviewer's server failed",
    "not-found": "the reviewer's model was not found",
    "config": "the reviewer's settings were refused",
    "disk": "the worker's disk is full",
    "memory": "the worker's memory limit was reached",
    "pids": "the worker's limit of processes was reached",
}

# Who said that no model answered, in a paused reviewer's stored reason: a vendor CLI, the
# endpoint an openai profile posts to (it has no CLI), or a command's own report.
NOT_THE_JOBS = {
    "cli": "its CLI reported a failure that is not the job's",
    "openai": "its endpoint failed in a way that is not the job's",
    "command": "its command reported a failure that is not the job's",
}


# The reaper's reasons for an attempt no worker spoke of within its lease, the one loss
# "no word from a worker in time" is true of (the control writes them with these words).
NO_HEARTBEAT = "no heartbeat for"
NEVER_PICKED_UP = "never picked up by a worker"


def outcome_words(outcome: str, reason: str | None = None) -> str:
    """An outcome in words; with its first ``reason``, a reviewer failure that was the
    worker's full disk, memory or process limit says so ("no model answered" is false of
    it: the model may have answered every turn), and an attempt lost otherwise than by
    silence (its worker died and the next one said so, a worker refused its message, the
    message was never sent) says "lost" alone, the reason saying why, and so does one
    counted with no reason."""
    kind = (reason or "").partition(": ")[0]
    if outcome == "reviewer-failure" and kind in ("disk", "memory", "pids"):
        return FAILURES[kind]
    if outcome == "lost" and not (reason or "").startswith((NO_HEARTBEAT, NEVER_PICKED_UP)):
        # Without a reason (a count of a night's attempts, the report's and a sweep's) it
        # is no more than lost: a worker that died and was followed did speak.
        return "lost"
    return OUTCOMES.get(outcome, outcome)


def reason_words(reason: str) -> str:
    """A reviewer failure's reason, its leading kind ("unreachable: …") in words; any
    other reason as it is."""
    kind, sep, rest = reason.partition(": ")
    return f"{FAILURES[kind]}: {rest}" if sep and kind in FAILURES else reason


def attempt_words(outcome: str, reason: str | None) -> str:
    """One attempt's end in a sentence: "the agent did not start: …", "the reviewer's
    endpoint could not be reached: …" (a reviewer failure's kind says more than that no
    model answered)."""
    if not reason:
        return outcome_words(outcome)
    if outcome == "reviewer-failure" and reason_words(reason) != reason:
        return reason_words(reason)
    return f"{outcome_words(outcome, reason)}: {reason_words(reason)}"
