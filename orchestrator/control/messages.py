"""The messages between the control process and its workers, and their version.

A worker may run on another machine with another release of reviewq. Every message
carries ``v``; a process refuses a message of another version with one log line and
does nothing else with it. Nothing is lost by that: a refused review leaves its attempt
``dispatched`` and a refused heartbeat or outcome leaves it silent, so the reaper takes
it as lost and dispatches it again, for a worker of the matching version to take; such
an attempt was never launched, so it does not count toward failing its job. The control
reads the heartbeats and outcomes of an earlier version whose shape is this one's as its
own (``READ_AS_OWN``).

Shapes (version 4; version 3 had no reap notice, which its control took for an outcome and
failed on; version 2 sent a heartbeat as each agent started, which the control
process relied on to tell a worker's attempts from messages still waiting, and had no
``waiting`` beat; version 1 was the shape before workers held nothing, without ``v``):

- review (control → worker, ``run_review``): ``v``, ``job_id``, ``attempt``, ``task``
  (review/fix/audit), ``reviewer`` (a profile *name*: how to start it is the worker's
  business), ``prompt`` (the text), ``pairs`` (note_path, gate_id, gate_path, lens,
  watches), ``output_name`` and ``output_shown`` (the output path as the prompt names
  it, which the worker replaces with its own), ``note_path`` and ``note_text`` (a fix: the text the fixer
  was given), ``guarded`` and ``trees`` (root-relative, checked when the worker has a
  KB), ``timeout_s`` (the deadline), ``lease_s``, ``heartbeat_s``, ``max_output_bytes``,
  ``expires_at`` (epoch seconds on the control's clock, half a lease before the reaper gives up an
  attempt no worker started), and the same as ``ttl_s`` (seconds) with ``queued_at``
  (the queue's clock when sent: the Redis server's, or the one machine's for SQLite),
  which a worker times it by; all three optional, so no new version: a worker takes them
  as absent, and one of an earlier release reads ``expires_at``. ``partition``: the
  control's partition of the profile, under which the reviews are recorded; a worker whose
  profile of that name writes another (its model moved, and the partition with it) does
  not start the attempt (a launch failure saying so). Optional too: absent, any is taken.
  ``opened_at``: the attempt's opening as state.db records it (``attempts.started_at``),
  which the worker sends back in each heartbeat and outcome of it. Optional: a control
  drops a beat or outcome whose ``opened_at`` is not its attempt's (a job id and attempt
  number given again by a state.db put back from a backup, the lost history's messages
  still queued) and takes one without it as before.
- heartbeat (worker → control, ``attempt_heartbeat``): ``v``, ``job_id``, ``attempt``,
  ``opened_at`` (the review message's, when it had one), ``worker`` (host:pid), ``host``, ``launched``, and ``started_at`` (the launch, the
  worker's clock) or ``waiting``. While the agent runs: the first a second after the
  launch (``launched`` true; or after ``heartbeat_s`` if sooner), then one every
  ``heartbeat_s``, and on every ``heartbeat_s`` while its outcome is sent (a few MiB
  over a slow link outlast a lease); an agent that ends sooner is told of by its
  outcome alone.
  ``waiting`` true: the worker took the message and waits for a free agent slot (at once
  and every ``heartbeat_s`` until the message expires); the attempt stays dispatched.
  A worker that says nothing and dies leaves its message gone from the review queue,
  which the control process finds (``taken_at``) and reaps a lease later.
- outcome (worker → control, ``deliver_outcome``): ``v``, ``job_id``, ``attempt``,
  ``opened_at`` (likewise), ``classification``, ``runner``, ``worker``, ``host``, ``exit_code``, ``started_at``,
  ``ended_at``, ``duration_s``, ``output`` (bytes, or None: none, or over the limit),
  ``reasons``, ``telemetry``, ``touched``, ``touched_hashes``, ``untouched`` (for a
  ``reviewer-touched-kb`` outcome: [classification, reasons] as judged without the
  change, optional: a control takes its absence as before), ``files`` (bounded
  stdout.log/stderr.log tails and telemetry.json, by name), ``redact`` (optional: the
  byte ranges of ``output`` holding the worker's secrets, which the control redacts in
  what it stores of the output, not in the agent's file nor in what it parses; a control
  takes its absence as none), ``notices`` (optional: events the worker logged of the
  attempt that the control logs again, ``{"event", fields…}``, only those it knows, once
  each, their text fields bounded: ``attempt.kb_stale``, ``attempt.kb_updated``; any other entry is passed
  over). An outcome with ``exited_at`` (the agent was launched) for an attempt still
  ``dispatched`` carries its start: the control process records ``worker`` and
  ``started_at`` (as ``launched_at``) and logs ``attempt.started`` from it, as from a
  first heartbeat.
- reap notice (worker → control, ``deliver_outcome``): ``v``, ``job_id``, ``attempt``,
  ``worker``, ``host`` (the sender), ``reaped`` (host:pid of the dead worker), ``opened_at``
  (optional, as in a heartbeat: the reaped agent's, from its registry entry): a worker
  starting on a host killed a dead worker's agent of that attempt. The control loses the
  attempt at once and dispatches the job again if it is still current, dispatched or
  running, and last heard of from that worker or none; otherwise nothing changes.
- refusal notice (worker → control, ``deliver_outcome``): ``v`` (the worker's),
  ``job_id``, ``attempt``, ``worker``, ``host``, ``refused_version``: the worker refused
  that attempt's review message for its version. A control of the worker's version
  loses the attempt at once (still dispatched) and dispatches the job again; one of
  another version refuses the notice, and its ``message.refused`` line names the job,
  the worker and its host on the control's side.

A message of this version lacking a field a process reads, or holding one of another
type (:func:`malformed`), is dropped with one line as one of another version is.

A reap notice whose ``opened_at`` is not its attempt's is dropped as a beat or
outcome is (``message.other_history``). A stop request (``workers.queues.StopRequests``)
holds the opening of the agent it means, as that agent's beat carried it, beside its
reason: a worker stops only its agent of that opening, and one of an earlier release reads
the pair as the reason and stops as before.

An outcome without a heartbeat before it was always valid (a heartbeat can be lost), so
recording the start from it did not change the version.
"""

from __future__ import annotations

VERSION = 4
LOG_TAIL_BYTES = 64 * 1024  # of stdout.log and stderr.log each, in an outcome
TELEMETRY_BYTES = 1024 * 1024
# The only names an outcome's files may have: a worker never chooses a path here.
ATTEMPT_FILES = ("stdout.log", "stderr.log", "telemetry.json")


def version_of(msg: object) -> object:
    """A message's version: version 1 had no ``v`` (and its heartbeat was not a dict)."""
    if isinstance(msg, dict):
        return msg.get("v", 1)
    return 1


# Earlier versions whose messages of a kind this version reads as its own: version 4
# added only the reap notice, so a heartbeat or an outcome of version 3 is one of 4's. A
# drained worker's last outcomes, left on the control queue by an upgrade, were refused and
# their agents' runs paid again. Not a refusal notice: taken, the attempt would be sent
# again at once to the worker of that release that refused it, and again, every tick.
READ_AS_OWN: dict[str, tuple[int, ...]] = {"heartbeat": (3,), "outcome": (3,)}


def refusal(kind: str, msg: object) -> dict | None:
    """What to log when ``msg`` is not of this version, nor of one it reads as its own
    (None: take it). ``kind`` "outcome" is the control queue's task, which carries the
    notices too: each is named as what it is (:func:`kind_of`)."""
    v = version_of(msg)
    if kind == "outcome" and isinstance(msg, dict):
        kind = kind_of(msg)
    if v == VERSION or v in READ_AS_OWN.get(kind, ()):
        return None
    ids: dict = {}
    if isinstance(msg, dict):
        # The sender too, when it says: the control's line then names the worker's host.
        ids = {"job_id": msg.get("job_id"), "attempt": msg.get("attempt")}
        ids |= {k: msg[k] for k in ("worker", "host") if isinstance(msg.get(k), str)}
        if "refused_version" in msg:  # a worker's notice: what it refused in turn
            ids["refused_version"] = msg["refused_version"]
    return {
        "message": kind,
        "version": v,
        "expected": VERSION,
        "reason": f"{_a(kind)} message of version {v!r}, "
        f"this reviewq speaks {VERSION}: {_what_to_do(kind, v)}",
        **ids,
    }


def _a(word: str) -> str:
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def _what_to_do(kind: str, v: object) -> str:
    """What a person does about a refused message: a review message an earlier release
    sent was most likely left on the queue by the upgrade itself, when every process runs
    this release already, and the control process of this one sends it again at once
    (``earlier_review``)."""
    if kind == "review" and isinstance(v, int) and v < VERSION:
        return earlier_review(VERSION)
    return (
        "run the same reviewq release on the control and the workers; the reaper "
        "dispatches the attempt again"
    )


def earlier_review(sent_again: int) -> str:
    """Why a review message of an earlier version needs nothing of a person, when the
    control process is of this release."""
    return (
        "an earlier release sent it (left on the queue by an upgrade): a control process "
        f"of this release sends the attempt again at once, in version {sent_again}; one of "
        "the earlier release still running on this queue must be upgraded"
    )


# The fields of this version a process reads as it takes a message, with their types
# (None: may be absent or null). Those it looks at with care (``notices``, ``files``,
# ``redact``, ``untouched``, the sender's names) are not here.
_NUMBER = (int, float)
_FIELDS: dict[str, dict[str, tuple]] = {
    "review": {
        "job_id": (int,),
        "attempt": (int,),
        "task": (str,),
        "reviewer": (str,),
        "prompt": (str,),
        "pairs": (list,),
        "timeout_s": _NUMBER,
        "heartbeat_s": _NUMBER,
        "max_output_bytes": (int,),
    },
    "heartbeat": {"job_id": (int,), "attempt": (int,), "worker": (str,)},
    "outcome": {
        "job_id": (int,),
        "attempt": (int,),
        "classification": (str,),
        "output": (bytes, None),
        "reasons": (list, None),
        "telemetry": (dict, None),
        "touched": (list, None),
        "touched_hashes": (dict, None),
        "exit_code": (int, None),
        "duration_s": (*_NUMBER, None),
        "started_at": (str, None),
        "ended_at": (str, None),
    },
    "reap notice": {"job_id": (int,), "attempt": (int,)},
    # A worker's notice names the attempt as the message it refused did (maybe not at all).
    "refusal notice": {"job_id": (int,), "attempt": (int, None)},
}


# Each kind's fields as checked, worked out once: ~3 us an outcome, under 1 a heartbeat.
_CHECKS = {
    kind: [
        (name, (tuple(t for t in types if t is not None), None in types))
        for name, types in fields.items()
    ]
    for kind, fields in _FIELDS.items()
}


def malformed(kind: str, msg: dict) -> dict | None:
    """What to log when ``msg``, of this version, lacks a field it must have or holds one
    of another type (None: take it). A message is data from another machine: such a one
    failed its task at every try (Huey's traceback each time, a minute of retries), or
    was kept with its fields misread (a string of reasons taken letter by letter)."""
    kind = kind_of(msg) if kind == "outcome" else kind
    for name, (classes, nullable) in _CHECKS[kind]:
        value = msg.get(name)
        if value is None and nullable:
            continue
        if not isinstance(value, classes) or value is True or value is False:
            types = _FIELDS[kind][name]
            wanted = " or ".join("null" if t is None else t.__name__ for t in types)
            got = (
                "missing"
                if name not in msg
                else "null"
                if value is None
                else _a(type(value).__name__)
            )
            ids = {k: msg.get(k) for k in ("job_id", "attempt") if isinstance(msg.get(k), int)}
            ids |= {k: msg[k] for k in ("worker", "host") if isinstance(msg.get(k), str)}
            return {
                "message": kind,
                "field": name,
                "reason": f"{_a(kind)} message whose "
                f"{name!r} is {got} ({wanted} expected): damaged, or its sender's reviewq is "
                "not this release; dropped (an attempt it leaves unheard of is dispatched again "
                "by the reaper)",
                **ids,
            }
    return None


def kind_of(o: dict) -> str:
    """What a message on the control queue's outcome task is, as a log line names it."""
    if "reaped" in o:
        return "reap notice"
    if "refused_version" in o:
        return "refusal notice"
    return "outcome"
