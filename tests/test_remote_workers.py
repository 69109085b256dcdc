"""Workers that need only the queue (issue 11): a worker with nothing but its own folder,
its profiles and the queue URL runs every kind of job; big prompts and outputs travel in
the messages; messages of another version are refused with one line."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator import logs
from orchestrator.control import messages
from orchestrator.state.workspace import Workspace
from orchestrator.sweeps.producer import SweepRequest, enqueue

from .conftest import libfaketime, ready_within, stop
from .test_queue_integration import (
    FAKE,
    FAST_QUEUE,
    db,
    fake_profile,
    guard_of,
    log_lines,
    redis_url,
    rq,
)

pytestmark = pytest.mark.integration
__all__ = ["redis_url"]  # a fixture, used by name
EXE = str(Path(sys.executable).parent / "reviewq")


def worker_toml(path: Path, url: str, env: dict[str, str] | None = None) -> Path:
    """All a remote worker is given: the queue URL and how to start its reviewers."""
    env_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in (env or {}).items())
    path.write_text(
        f'[queue]\nurl = "{url}"\npoll_seconds = 0.02\n\n'
        f'[reviewers.fake]\nkind = "command"\ncommand = ["{sys.executable}", "{FAKE}"]\n'
        f'partition = "fake"\nconcurrency = 2\nenv = {{ {env_toml} }}\n',
        encoding="utf-8",
    )
    return path


def start_worker(
    tmp_path: Path,
    url: str,
    env: dict[str, str] | None = None,
    *extra: str,
    stderr=None,
    process_env: dict[str, str] | None = None,
):
    """``reviewq --config worker.toml --state W worker`` from an empty folder: no KB, no
    state folder of the control process, nothing but the file and its own folder; its
    stderr to ``stderr`` (a file), or nowhere; ``process_env`` over this process's
    environment (another machine's clock), where ``env`` is its agents'."""
    home = tmp_path / "remote"
    home.mkdir(exist_ok=True)
    config = worker_toml(home / "worker.toml", url, env)
    return subprocess.Popen(
        [
            EXE,
            "--config",
            str(config),
            "--state",
            str(home / "state"),
            "worker",
            "--workers",
            "2",
            *extra,
        ],
        cwd=home,
        env={**os.environ, **process_env} if process_env else None,
        stderr=stderr or subprocess.DEVNULL,
    ), home


def dispatched_message(kb) -> dict:
    """The review message the control process sends for one note and one gate."""
    from orchestrator.control.control import Control

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    sent: list[dict] = []
    Control(ws, send_review=sent.append).dispatch()
    ws.close()
    (msg,) = sent
    return msg


def small(kb, notes: int = 2) -> None:
    kb.gate("prose/body-check", ["body"])
    for i in range(notes):
        kb.note(f"n{i}", body=f"Body {i}.\n")


def test_a_worker_with_only_the_queue_reviews_and_fixes(kb, tmp_path, redis_url):
    small(kb)
    fix_env = {"FAKE_PASS_IF_CONTAINS": "FIXED", "FAKE_FIX_APPEND": "FIXED: more body."}
    # The control side's profile says only what the control decides (its deadline).
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + f'url = "{redis_url}"\n')
    worker, home = start_worker(tmp_path, redis_url, fix_env)
    try:
        res = rq(kb, "sweep", "--reviewer", "fake", "--fix", "--workers", "0", "--json")
    finally:
        stop(worker)
    assert res.returncode == 0, res.stderr
    # Review FAIL, fix applied by the control process, re-review PASS: on both notes.
    for i in range(2):
        assert "FIXED: more body." in kb.read(f"kb/notes/n{i}.md")
    with db(kb) as conn:
        decisions = {r[0] for r in conn.execute("SELECT decision FROM acceptance")}
        fixes = [r[0] for r in conn.execute("SELECT result FROM review_jobs WHERE kind = 'fix'")]
        job_dir = conn.execute("SELECT job_dir FROM review_jobs ORDER BY id").fetchone()[0]
    assert decisions == {"PASS"} and fixes == ["applied", "applied"]
    # The job folder holds what the worker reported, as if the agent had run here.
    attempt = kb.state / job_dir / "attempt-1"
    names = {p.name for p in attempt.iterdir()}
    assert {"bundle-output.md", "stdout.log", "stderr.log"} <= names  # its prompt: the job's
    assert "=== PAIR REVIEW START" in (attempt / "bundle-output.md").read_text()
    # The worker wrote nowhere but its own folder, and keeps no attempt once reported.
    assert not (kb.state / "worker").exists()
    assert sorted(p.name for p in home.iterdir()) == ["state", "worker.toml"]
    assert list((home / "state" / "attempts").iterdir()) == []
    own = [json.loads(x) for x in (home / "state/logs/reviewq.jsonl").read_text().splitlines()]
    assert any(e["event"] == "attempt.exited" for e in own)
    # The control's log tells the story of each attempt, with the worker's host.
    events = log_lines(kb)
    started = [e for e in events if e["event"] == "attempt.started"]
    ended = [e for e in events if e["event"] == "attempt.ended"]
    assert started and all(e["host"] and e["worker"] for e in started)
    assert ended and all(e["host"] and e["outcome"] for e in ended)
    story = rq(kb, "logs", "--job", "1")
    assert "attempt.started" in story.stdout and "attempt.ended" in story.stdout


def _swept_by_a_remote_worker(kb, tmp_path, redis_url, env: dict[str, str], process_env=None):  # noqa: ANN001, ANN202
    """A sweep of one note whose agent runs in a worker with ``env`` (where the agent
    quotes $AGENT_TOKEN in its rationale), the control's settings knowing none of it; the
    worker's process with ``process_env`` (:func:`start_worker`)."""
    small(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + f'url = "{redis_url}"\n')
    env = {"FAKE_QUOTE": "AGENT_TOKEN", **env}
    worker, _ = start_worker(tmp_path, redis_url, env, process_env=process_env)
    try:
        res = rq(kb, "sweep", "--reviewer", "fake", "--workers", "0", "--json")
    finally:
        stop(worker)
    assert res.returncode == 0, res.stderr
    return res


def test_a_secret_only_the_worker_knows_is_redacted_in_what_the_control_stores(
    kb, tmp_path, redis_url
):
    """A key in the worker machine's settings (or environment), which the control's
    machine never has: the control redacted a rationale quoting it with its own secrets
    only, so it was stored in clear (state.db, the result files, `job N`)."""
    token = "tok-WORKER-ONLY-31337"
    _swept_by_a_remote_worker(kb, tmp_path, redis_url, {"AGENT_TOKEN": token})
    with db(kb) as conn:
        (rationale,) = conn.execute("SELECT rationale FROM review_pairs").fetchone()
        job_dir = conn.execute("SELECT job_dir FROM review_jobs").fetchone()[0]
    assert "my AGENT_TOKEN is [redacted]" in rationale, rationale
    # The agent's own output stays as it wrote it, as on the worker's machine (OPERATIONS).
    assert token in (kb.state / job_dir / "attempt-1" / "bundle-output.md").read_text()
    results = list((kb.state / job_dir / "results").iterdir())
    assert results and not [p for p in results if token in p.read_text()]
    shown = rq(kb, "job", "1", "--json")
    assert shown.returncode == 0 and token not in shown.stdout


def test_a_workers_secret_in_the_outputs_frame_changes_no_decision(kb, tmp_path, redis_url):
    """A worker's secret that is also a word of the output's frame (a short password,
    `review`, is in every gate's path `review-gates/`): the control blanked it in the
    output before parsing it, so every sentinel named a pair it did not expect and a
    valid review failed as invalid output, attempt after attempt. Redaction changes what
    is stored of a finding, never the decision."""
    env = {"AGENT_TOKEN": "review", "FAKE_DECISIONS": "FAIL"}
    res = _swept_by_a_remote_worker(kb, tmp_path, redis_url, env)
    with db(kb) as conn:
        (status,) = conn.execute("SELECT status FROM review_jobs").fetchone()
        (decision, rationale) = conn.execute(
            "SELECT decision, rationale FROM review_pairs"
        ).fetchone()
    assert (status, decision) == ("completed", "FAIL"), res.stdout
    assert "my AGENT_TOKEN is [redacted]" in rationale and "review" not in rationale


def test_a_stale_kb_copy_on_a_worker_machine_is_said_in_the_controls_log(kb, tmp_path, redis_url):
    """A remote worker's --kb copy older than the note its fixer is given: the fixer ran
    without it and the worker said `attempt.kb_stale`, in its own log only. The operator
    reads the control's (`reviewq logs` there), which showed a fix that ran as any other,
    and nothing said to update the copy."""
    import shutil

    small(kb, notes=1)
    copy = tmp_path / "copy"
    shutil.copytree(kb.root / "kb", copy / "kb")
    (copy / "kb" / "notes" / "n0.md").write_text("An older text of the note.\n")
    fix_env = {"FAKE_PASS_IF_CONTAINS": "FIXED", "FAKE_FIX_APPEND": "FIXED: more body."}
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + f'url = "{redis_url}"\n')
    worker, home = start_worker(tmp_path, redis_url, fix_env, "--kb", str(copy))
    try:
        res = rq(kb, "sweep", "--reviewer", "fake", "--fix", "--workers", "0", "--json")
    finally:
        stop(worker)
    assert res.returncode == 0, res.stderr
    assert "FIXED: more body." in kb.read("kb/notes/n0.md")  # the fix ran, without the copy
    [stale] = [e for e in log_lines(kb) if e["event"] == "attempt.kb_stale"]
    assert stale["note_path"] == "kb/notes/n0.md" and str(copy) in stale["reason"], stale
    assert stale["host"] and stale["worker"] and stale["job_id"] == 2, stale
    story = rq(kb, "logs", "--job", "2")
    assert "attempt.kb_stale" in story.stdout, story.stdout


def test_a_kb_copy_pulled_while_its_agents_run_is_not_their_change(kb, tmp_path, redis_url):
    """A remote worker's --kb copy updated (`git pull`) while its agents ran: every
    running attempt ended `reviewer-touched-kb`, run again and counted toward failing its
    job (and, the third time, escalating its pairs to a person) for an update a person
    made. Files that are as the commit HEAD moved to are the update's, said so on both
    sides; the attempts are judged as their agents left them."""
    from .fault.harness import ContinueGate, StartFifo
    from .test_fix_commits import git

    small(kb, notes=2)
    git(kb.root, "init", "-q")
    git(kb.root, "config", "user.name", "A Person")
    git(kb.root, "config", "user.email", "person@example.org")
    git(kb.root, "add", "kb")
    git(kb.root, "commit", "-qm", "the KB")
    copy = tmp_path / "copy"
    git(tmp_path, "clone", "-q", str(kb.root), str(copy))
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + FAST_QUEUE + f'url = "{redis_url}"\n')
    starts, gate = StartFifo(tmp_path / "started"), ContinueGate(tmp_path / "go")
    env = {"FAKE_NOTIFY_FIFO": str(starts.path), "FAKE_CONTINUE_FIFO": str(gate.path)}
    worker, _ = start_worker(tmp_path, redis_url, env, "--kb", str(copy))
    sweep = subprocess.Popen(
        [EXE, "--root", str(kb.root), "sweep", "--reviewer", "fake", "--workers", "0", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        starts.await_starts(2)  # both agents run, each on a note of kb/notes
        kb.note("n2", body="A note a person added.\n")
        kb.write("kb/notes/n1.md", kb.read("kb/notes/n1.md") + "A person's line.\n")
        git(kb.root, "add", "kb")
        git(kb.root, "commit", "-qm", "a person's edits")
        git(copy, "pull", "-q", "--ff-only")
        gate.open_gate()
        out, err = sweep.communicate(timeout=120)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
        stop(worker)
        gate.close()
        starts.close()
    assert sweep.returncode == 0, err
    with db(kb) as conn:
        outcomes = [r[0] for r in conn.execute("SELECT outcome FROM attempts")]
    assert outcomes == ["finalized", "finalized"], outcomes  # before: reviewer-touched-kb
    said = [e for e in log_lines(kb) if e["event"] == "attempt.kb_updated"]
    assert len(said) == 2 and all("HEAD moved from" in e["reason"] for e in said), said


def test_a_worker_whose_disk_is_full_leaves_no_attempt_folder_behind(kb, tmp_path, redis_url):
    """A worker whose own --state disk filled up (unlisted, tried): each attempt it took
    failed as "could not prepare its attempt folder: No space left on device" (not the
    job's fault: a launch failure, the profile paused after five), and left its folder,
    a prompt begun, for good while it ran: only a worker's start removes those. Each
    attempt's folder goes with its failure."""
    import shutil

    from .fault.harness import SmallDisk
    from .test_queue_integration import _await_logged

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs for the worker's folder")
    small(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + f'url = "{redis_url}"\n')
    state = tmp_path / "remote" / "state"
    state.mkdir(parents=True)
    disk = SmallDisk(state, "256k")
    try:
        disk.mount()
    except PermissionError as exc:
        pytest.skip(str(exc))
    control = subprocess.Popen([EXE, "--root", str(kb.root), "control"], stderr=subprocess.DEVNULL)
    worker = None
    try:
        worker, _ = start_worker(tmp_path, redis_url)
        own = SimpleNamespace(state=state)
        _await_logged(own, "worker.started")
        disk.fill()
        assert rq(kb, "enqueue", "--reviewer", "fake").returncode == 0
        _await_logged(kb, "reviewer.paused")  # five attempts failed on the worker's disk
        stop(worker)
        left = sorted(p.name for p in (state / "attempts").iterdir())
    finally:
        for proc in (worker, control):
            if proc is not None:
                stop(proc)
        subprocess.run(["umount", str(state)], check=False)
    (failed,) = [e for e in log_lines(kb) if e["event"] == "reviewer.paused"]
    assert "No space left on device" in failed["reason"], failed
    assert left == []  # before: job-1-attempt-1-… to job-1-attempt-5-…


@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_a_1_mib_prompt_and_a_5_mib_output_travel_in_the_messages(kb, request, queue):
    kb.gate("prose/body-check", ["body"])
    kb.note("big", body="A long body. " * (1024 * 1024 // 13) + "\n")
    url = f'url = "{request.getfixturevalue("redis_url")}"\n' if queue == "redis" else ""
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + url)
    size = 5 * 1024 * 1024 - 4096  # just under the default limit of 5 MiB
    res = rq(
        kb,
        "sweep",
        "--reviewer",
        "fake",
        "--workers",
        "1",
        "--json",
        env={"FAKE_PAD_BYTES": str(size)},
    )
    assert res.returncode == 0, res.stderr
    with db(kb) as conn:
        job_dir = conn.execute("SELECT job_dir FROM review_jobs").fetchone()[0]
        assert conn.execute("SELECT decision FROM acceptance").fetchone()[0] == "PASS"
    attempt = kb.state / job_dir / "attempt-1"
    assert (kb.state / job_dir / "prompt.md").stat().st_size > 1024 * 1024
    assert abs((attempt / "bundle-output.md").stat().st_size - size) < 64


def test_an_output_over_the_limit_is_refused_by_size_and_not_sent(kb):
    kb.gate("prose/body-check", ["body"])
    kb.note("alpha")
    kb.write(
        "reviewq.toml",
        fake_profile()
        + FAST_QUEUE.replace("[queue]\n", "[queue]\nmax_attempts = 1\n")
        + "[limits]\nmax_output_bytes = 100000\n",
    )
    res = rq(kb, "sweep", "--reviewer", "fake", "--json", env={"FAKE_PAD_BYTES": "300000"})
    assert res.returncode == 1
    with db(kb) as conn:
        outcome, reasons, job_dir = conn.execute(
            "SELECT a.outcome, a.reasons, j.job_dir FROM attempts a JOIN review_jobs j ON j.id = a.job_id"
        ).fetchone()
    assert outcome == "invalid-output"
    assert "over the 100000-byte limit" in reasons and "300" in reasons
    assert not (kb.state / job_dir / "attempt-1" / "bundle-output.md").exists()


# --- message versions (task logic, no consumer) ---------------------------------------------


def test_messages_of_another_version_are_refused_with_one_line(kb, monkeypatch):
    from orchestrator import logs
    from workers import tasks

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha")
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    (job,) = enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True)).jobs
    sent: list[tuple] = []
    monkeypatch.setattr(tasks, "send", lambda *args, **_: sent.append(args))
    told: list[tuple] = []
    monkeypatch.setattr(tasks, "send_once", lambda *args: told.append(args))

    class Control:
        calls: list = []

        def on_messages(self, beats, outcomes):
            self.calls.append((beats, outcomes))

        def dispatch(self):
            pass

    control = Control()
    monkeypatch.setattr(tasks, "_control", control)
    monkeypatch.setattr(tasks, "_place", None)  # a refused review never reaches the worker
    old_review = {"job_id": job.review_job_id, "attempt": 1, "prompt_path": "/x/prompt.md"}
    tasks.run_review(old_review)
    tasks.run_review({**old_review, "v": 2})
    tasks.deliver_outcome({"job_id": job.review_job_id, "attempt": 1, "classification": "output"})
    tasks.attempt_heartbeat(job.review_job_id, 1, "host:1", True)  # version 1: positional
    assert sent == [] and control.calls == []
    refused = [e for e in log_lines(kb) if e["event"] == "message.refused"]
    assert [(e["message"], e["version"]) for e in refused] == [
        ("review", 1),
        ("review", 2),
        ("outcome", 1),
        ("heartbeat", 1),
    ]
    assert all(e["expected"] == messages.VERSION and "release" in e["reason"] for e in refused)
    assert refused[0]["job_id"] == job.review_job_id
    # The worker told the control of each review message it refused, in its own version:
    # the control's log said only "attempt.lost" a lease later.
    assert [(task, m["v"], m["job_id"], m["refused_version"]) for task, m in told] == [
        ("deliver_outcome", messages.VERSION, job.review_job_id, 1),
        ("deliver_outcome", messages.VERSION, job.review_job_id, 2),
    ]
    assert told[0][1]["worker"] == tasks.WORKER_ID and told[0][1]["host"] == tasks.HOST
    ws.close()


def test_the_control_names_the_worker_whose_message_of_another_version_it_refused(kb, monkeypatch):
    """A newer worker's notice of a refused review reaches an older control as a notice
    of another version: its one line names the job, the worker and its host."""
    from orchestrator import logs
    from workers import tasks

    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    monkeypatch.setattr(tasks, "_control", object())  # nothing past the refusal runs
    notice = {"v": messages.VERSION + 1, "job_id": 7, "attempt": 2, "worker": "far:42",
              "host": "far", "refused_version": messages.VERSION}  # fmt: skip
    tasks.deliver_outcome(notice)
    (line,) = [e for e in log_lines(kb) if e["event"] == "message.refused"]
    assert (line["message"], line["version"], line["expected"]) == (
        "refusal notice",
        messages.VERSION + 1,
        messages.VERSION,
    )
    assert (line["job_id"], line["attempt"], line["worker"], line["host"]) == (
        7,
        2,
        "far:42",
        "far",
    )
    ws.close()


# --- outcomes waiting together are taken together ----------------------------------------------


def _three_outcomes_waiting(kb, monkeypatch, request, queue):  # noqa: ANN202
    """Three dispatched jobs, their heartbeats and outcomes waiting on the real control
    queue (SQLite or Redis), and a spy on the control's transactions."""
    from orchestrator.control.control import Control
    from orchestrator.control.followup import FollowUp
    from orchestrator.review.bundle import end_line, start_line
    from workers import tasks
    from workers.app import make_app
    from workers.queues import send

    kb.gate("prose/body-check", ["body"])
    for i in range(3):
        kb.note(f"n{i}")
    if queue == "redis":
        kb.write("reviewq.toml", f'[queue]\nurl = "{request.getfixturevalue("redis_url")}"\n')
    ws = Workspace.open(kb.root)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    assert control.dispatch() == 3
    app = make_app(ws.settings)  # the real control queue
    monkeypatch.setattr(tasks, "_control", control)
    send("dispatch")  # a control process runs its first message alone: past it
    app.control.execute(app.control.dequeue())
    batches: list[tuple[int, int]] = []
    real = control.on_messages

    def spy(beats, outcomes, *dispatch):
        batches.append((len(beats), len(outcomes)))
        return real(beats, outcomes, *dispatch)

    monkeypatch.setattr(control, "on_messages", spy)
    for msg in sent:
        pair = msg["pairs"][0]
        output = (
            f"{start_line(pair['note_path'], pair['gate_path'])}\nSummary: ok.\nFindings:\n- none\n"
            f"## Result: PASS\n{end_line(pair['note_path'], pair['gate_path'])}\n"
        )
        send("attempt_heartbeat", {"v": 4, "job_id": msg["job_id"], "attempt": 1, "worker": "w:1", "host": "w", "launched": True})  # fmt: skip
        send("deliver_outcome", {"v": 4, "job_id": msg["job_id"], "attempt": 1, "classification": "output", "output": output.encode(), "files": {}})  # fmt: skip
    assert app.control.pending_count() == 6
    return ws, app, control, batches


@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_waiting_outcomes_are_taken_in_one_transaction(kb, monkeypatch, request, queue):
    ws, app, control, batches = _three_outcomes_waiting(kb, monkeypatch, request, queue)
    task = app.control.dequeue()  # what the consumer does with one message
    if queue == "redis":
        # Taking what waits must not block: the consumer's blocking read would hold every
        # batch for its read timeout (1 s) once the queue is empty.
        def blocked(*args, **kwargs):
            raise AssertionError("the batch waited on an empty queue")

        monkeypatch.setattr(app.control.storage.conn, "brpop", blocked)
    app.control.execute(task)
    assert batches == [(3, 3)] and app.control.pending_count() == 0
    statuses = [r[0] for r in ws.store.conn.execute("SELECT status FROM review_jobs")]
    assert statuses == ["completed"] * 3
    ws.close()


def test_the_next_dispatch_pass_commits_with_the_outcome_batch(kb, monkeypatch, request):
    """The control task dispatched after each batch in a transaction of its own: a second
    BEGIN/COMMIT and look at the queued jobs a batch (~1.7 outcomes) when it could ride on
    the batch's. Its messages still go only once the commit makes their attempts visible."""
    ws, app, control, batches = _three_outcomes_waiting(kb, monkeypatch, request, "sqlite")
    kb.note("late")  # a job queued meanwhile, which the pass after the batch opens
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    sent = control.send_review.__self__  # the helper's list of the messages sent
    before = ws.store.transactions

    def send_review(msg):
        assert not ws.store.conn.in_transaction  # after the commit
        sent.append(msg)

    monkeypatch.setattr(control, "send_review", send_review)
    app.control.execute(app.control.dequeue())
    assert batches == [(3, 3)] and app.control.pending_count() == 0
    # The batch's transaction, and one settling its finished jobs' files after them all
    # (stop 33; one a job before).
    assert ws.store.transactions - before == 1 + 1
    assert len(sent) == 4 and sent[-1]["job_id"] == 4
    ws.close()


@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_a_control_task_lets_the_messages_behind_its_own_gather(kb, monkeypatch, request, queue):
    """Taken as they came, a batch held ~1.7 messages, and each paid the batch's fixed
    costs (Huey's task, the queue's read and acknowledgement, the commit, the dispatch's
    reads). A task now waits a few ms, no CPU, before it reads what waits behind it."""
    from workers import tasks
    from workers.queues import send

    ws, app, control, batches = _three_outcomes_waiting(kb, monkeypatch, request, queue)
    job_id = ws.store.conn.execute("SELECT min(id) FROM review_jobs").fetchone()[0]
    slept: list[float] = []

    def gathering():
        slept.append(tasks.GATHER_S)  # a heartbeat comes meanwhile
        send("attempt_heartbeat", {"v": 4, "job_id": job_id, "attempt": 1, "worker": "w:1", "host": "w"})  # fmt: skip

    monkeypatch.setattr(tasks, "_let_gather", gathering)
    app.control.execute(app.control.dequeue())
    assert slept == [tasks.GATHER_S] and 0 < tasks.GATHER_S <= 0.02  # bounded
    assert batches == [(4, 3)] and app.control.pending_count() == 0
    ws.close()


def _second_outcome_fails(ws, control, monkeypatch) -> list[int]:
    """The control's transaction fails whenever it holds the second job's outcome (the
    batch, then that message alone); the jobs' ids, in order."""
    jobs = [r[0] for r in ws.store.conn.execute("SELECT id FROM review_jobs ORDER BY id")]
    spy = control.on_messages

    def picky(beats, outcomes, *dispatch):
        if any(o["job_id"] == jobs[1] for o in outcomes):
            raise ValueError("this outcome cannot be handled now")
        return spy(beats, outcomes, *dispatch)

    monkeypatch.setattr(control, "on_messages", picky)
    return jobs


def test_a_message_that_cannot_be_put_back_stays_on_the_queue(kb, monkeypatch, request):
    """Taken one by one after its batch failed, a message that failed again is put back
    with one retry less. When that send failed (the queue file locked), the exception left
    the loop, and every message taken was acknowledged: the failed one and those behind it
    that were never handled, their agents' runs lost."""
    import sqlite3

    from tenacity import stop_after_attempt, wait_none

    from workers import queues

    ws, app, control, batches = _three_outcomes_waiting(kb, monkeypatch, request, "sqlite")
    spy = control.on_messages
    sends: list[object] = []

    def queue_locked(task):
        sends.append(task)
        raise sqlite3.OperationalError("database is locked")

    real_enqueue = app.control.enqueue
    _second_outcome_fails(ws, control, monkeypatch)
    monkeypatch.setattr(app.control, "enqueue", queue_locked)
    # The send waits out a locked queue for two minutes; here, for two tries.
    monkeypatch.setattr(queues.requeue.retry, "stop", stop_after_attempt(2))
    monkeypatch.setattr(queues.requeue.retry, "wait", wait_none())
    app.control.execute(app.control.dequeue())
    statuses = [r[0] for r in ws.store.conn.execute("SELECT status FROM review_jobs ORDER BY id")]
    assert statuses == ["completed", "running", "completed"]
    assert app.control.pending_count() == 1  # job 2's outcome, as it came
    assert len(sends) == 2  # the send was tried again
    monkeypatch.setattr(control, "on_messages", spy)
    monkeypatch.setattr(app.control, "enqueue", real_enqueue)
    app.control.execute(app.control.dequeue())
    statuses = [r[0] for r in ws.store.conn.execute("SELECT status FROM review_jobs ORDER BY id")]
    assert statuses == ["completed"] * 3
    ws.close()


def test_a_message_put_back_after_its_batch_failed_is_counted_as_huey_counts(
    kb, monkeypatch, request
):
    """Taken one by one after its batch failed, a message put back with one retry less
    said `retries_left` one less than the runs still to come: one with a retry left said
    0, which OPERATIONS §5 reads as a message not run again, and it was run again."""
    import datetime

    from structlog.testing import capture_logs

    from orchestrator import logs

    ws, app, control, batches = _three_outcomes_waiting(kb, monkeypatch, request, "sqlite")
    jobs = _second_outcome_fails(ws, control, monkeypatch)
    # Each retry is due 3 s later: the consumer's scheduler and worker, a day on.
    later = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + datetime.timedelta(days=1)
    logs.get()  # configured before the capture, not inside it
    with capture_logs() as logged:
        for _ in range(30):  # the batch, then Huey's 20 retries of the message put back
            for due in app.control.read_schedule(later):
                app.control.enqueue(due)
            task = app.control.dequeue()
            if task is None:
                break
            with contextlib.suppress(ValueError):
                app.control.execute(task, later)
    left = [
        (e["retries_left"], e.get("retry_s"))
        for e in logged
        if e["event"] == "control.task_failed"
        and e.get("job_id") == jobs[1]
        and "retry" not in e  # the batch's own line: its messages are taken one by one
    ]
    assert app.control.dequeue() is None and app.control.scheduled() == []
    assert [n for n, _ in left] == list(range(20, -1, -1))  # 21 runs: 20 more after the first
    assert all((s is not None) == (n > 0) for n, s in left)
    ws.close()


@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_a_batch_stays_on_the_queue_until_its_transaction_commits(kb, monkeypatch, request, queue):
    """A control process stopped mid-batch (here by an interrupt inside the transaction)
    finds the batch's messages again, the one Huey was running among them."""
    from workers.app import make_app

    ws, app, control, batches = _three_outcomes_waiting(kb, monkeypatch, request, queue)

    class Stopped(BaseException):
        pass

    real = control.on_messages

    def stopped(beats, outcomes, *dispatch):
        with ws.store.write():
            real(beats, outcomes, *dispatch)
            raise Stopped

    monkeypatch.setattr(control, "on_messages", stopped)
    with pytest.raises(Stopped):
        app.control.execute(app.control.dequeue())
    monkeypatch.setattr(control, "on_messages", real)
    restarted = make_app(ws.settings)  # the restarted control process's queue
    restarted.control.execute(restarted.control.dequeue())  # its first message, alone
    restarted.control.execute(restarted.control.dequeue())
    # The heartbeat Huey was running came back with the rest.
    assert batches[-2:] == [(1, 0), (2, 3)]
    assert restarted.control.pending_count() == 0
    statuses = [r[0] for r in ws.store.conn.execute("SELECT status FROM review_jobs")]
    assert statuses == ["completed"] * 3
    ws.close()


def _unreadable(huey, what: str) -> bytes:  # noqa: ANN001 - a Huey
    """A message Huey cannot read: a pickle cut short, or a task this release does not
    register (a later release's)."""
    from huey.registry import Message

    if what == "truncated":
        return huey.serializer.serialize(Message(*[None] * len(Message._fields)))[:20]
    fields = dict.fromkeys(Message._fields) | {"id": "x", "name": "deliver_outcomes_v5"}
    return huey.serializer.serialize(Message(**{**fields, "args": (), "kwargs": {}}))


@pytest.mark.parametrize("what", ["truncated", "unknown-task"])
@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_a_message_huey_cannot_read_fails_no_batch_and_is_dropped_in_one_line(
    kb, monkeypatch, request, queue, what
):
    """Waiting behind the message run, an unreadable one made the batch's read raise:
    every batch and every tick failed (a traceback each, each message's retries spent)
    until it reached the head, where Huey read it into a traceback three times before it
    was dropped; on the review queue a worker said only the traceback."""
    ws, app, control, batches = _three_outcomes_waiting(kb, monkeypatch, request, queue)
    logs.configure(ws.state_dir)
    task = app.control.dequeue()
    app.control.storage.enqueue(_unreadable(app.control, what), 0)
    app.control.execute(task)
    assert batches == [(3, 3)] and app.control.pending_count() == 1  # passed over, left
    statuses = [r[0] for r in ws.store.conn.execute("SELECT status FROM review_jobs")]
    assert statuses == ["completed"] * 3
    assert app.control.dequeue() is None and app.control.pending_count() == 0
    app.review.storage.enqueue(_unreadable(app.review, what), 0)  # a worker's read
    assert app.review.dequeue() is None and app.review.pending_count() == 0
    lines = log_lines(kb)
    dropped = [e for e in lines if e["event"] == "message.dropped"]
    assert [e["queue"] for e in dropped] == [app.control.storage.name, app.review.storage.name]
    assert all(e["reason"].startswith("unreadable (") for e in dropped)
    assert not [e for e in lines if "exception" in e or e["event"] == "control.task_failed"]
    ws.close()


@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_a_message_of_the_wrong_shape_is_said_in_one_line_and_run_never(
    kb, monkeypatch, request, queue, tmp_path
):
    """A message of this version lacking a field, or holding one of another type, failed
    its task at every try (Huey's traceback each, 21 of them over a minute), and failed
    each batch it was taken in; some were kept misread (a string of reasons taken letter
    by letter, the attempt counted failed). A worker read a review message so into a
    traceback."""
    from workers import tasks
    from workers.queues import send

    ws, app, control, batches = _three_outcomes_waiting(kb, monkeypatch, request, queue)
    logs.configure(ws.state_dir)
    jobs = [r[0] for r in ws.store.conn.execute("SELECT id FROM review_jobs ORDER BY id")]
    beat = {"v": 4, "job_id": jobs[0], "attempt": 1, "host": "w"}  # no worker
    first = app.control.dequeue()  # the held message runs with those waiting behind it
    send("attempt_heartbeat", beat)
    send("deliver_outcome", {"v": 4, "job_id": jobs[1], "attempt": 1, "classification": "no-output", "reasons": "oops", "files": {}})  # fmt: skip
    app.control.execute(first)
    assert batches == [(3, 3)]  # the rest of the batch kept
    send("deliver_outcome", {"v": 4, "job_id": str(jobs[2]), "attempt": 1, "files": {}})
    app.control.execute(app.control.dequeue())  # one alone, the task's own
    assert app.control.pending_count() == app.control.scheduled_count() == 0
    statuses = [r[0] for r in ws.store.conn.execute("SELECT status FROM review_jobs")]
    assert statuses == ["completed"] * 3
    _, sent = _worker_in_process(tmp_path, monkeypatch)
    tasks.run_review({k: v for k, v in REVIEW_MSG.items() if k != "prompt"})
    assert sent == [] and not (tmp_path / "w" / "attempts").exists()
    lines = log_lines(kb)  # the worker's here too: one process
    said = [
        (e["message"], e["field"], e["reason"]) for e in lines if e["event"] == "message.malformed"
    ]
    assert [s[:2] for s in said] == [
        ("heartbeat", "worker"),
        ("outcome", "reasons"),
        ("outcome", "job_id"),
        ("review", "prompt"),
    ]
    assert "'reasons' is a str (list or null expected)" in said[1][2]
    assert "'job_id' is a str (int expected)" in said[2][2]
    assert "'prompt' is missing (str expected)" in said[3][2]
    assert not [e for e in lines if "exception" in e or e["event"] == "control.task_failed"]
    ws.close()


@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_the_outcome_a_control_process_was_running_when_it_died_is_run_again(
    kb, monkeypatch, request, queue
):
    """Huey takes a message off the queue before it runs it: a control process killed
    inside that message's transaction lost its outcome, and the agent was reaped after a
    lease and run again (paid twice). The message now stays on the queue, held, until its
    transaction commits."""
    from workers import tasks
    from workers.app import make_app
    from workers.queues import send

    ws, app, control, batches = _three_outcomes_waiting(kb, monkeypatch, request, queue)
    while app.control.pending_count():  # keep one outcome alone on the queue
        app.control.execute(app.control.dequeue())
    job_id = ws.store.conn.execute("SELECT max(id) FROM review_jobs").fetchone()[0]
    with ws.store.write():
        ws.store.conn.execute("UPDATE review_jobs SET status = 'running' WHERE id = ?", (job_id,))
        ws.store.conn.execute(
            "UPDATE attempts SET outcome = 'running', ended_at = NULL WHERE job_id = ?", (job_id,)
        )
        ws.store.conn.execute("DELETE FROM acceptance")
    send("deliver_outcome", {"v": 4, "job_id": job_id, "attempt": 1, "classification": "burned-out", "files": {}})  # fmt: skip

    class Killed(BaseException):
        pass

    def killed(beats, outcomes, *dispatch):
        with ws.store.write():
            raise Killed

    monkeypatch.setattr(control, "on_messages", killed)
    with pytest.raises(Killed):
        app.control.execute(app.control.dequeue())
    monkeypatch.undo()
    monkeypatch.setattr(tasks, "_control", control)
    restarted = make_app(ws.settings)  # the restarted control process's queue
    task = restarted.control.dequeue()
    assert task is not None and task.name == "deliver_outcome"
    restarted.control.execute(task)
    outcome = ws.store.conn.execute(
        "SELECT outcome FROM attempts WHERE job_id = ? AND attempt = 1", (job_id,)
    ).fetchone()[0]
    assert outcome == "burned-out"
    assert restarted.control.pending_count() == 0 and restarted.control.dequeue() is None
    ws.close()


REVIEW_MSG = {
    "v": 4, "job_id": 7, "attempt": 2, "task": "review", "reviewer": "fake",
    "prompt": "p", "pairs": [], "output_name": "bundle-output.md", "guarded": [],
    "trees": [], "timeout_s": 5, "lease_s": 2, "heartbeat_s": 0.5,
    "max_output_bytes": 1000,
}  # fmt: skip


def _worker_in_process(tmp_path: Path, monkeypatch):  # noqa: ANN202
    """This process as a worker whose sends are kept in the list returned, not sent."""
    from orchestrator.config import load_settings
    from workers import tasks

    config = worker_toml(tmp_path / "worker.toml", "redis://127.0.0.1:1/0")
    settings = load_settings(tmp_path, tmp_path / "w", config)
    sent: list[tuple] = []
    monkeypatch.setattr(tasks, "send", lambda *args, **_: sent.append(args))
    monkeypatch.setattr(tasks, "_place", tasks.WorkerPlace(settings, tmp_path / "w"))
    return settings, sent


def test_a_worker_that_cannot_start_an_attempt_says_so_at_once(tmp_path, monkeypatch):
    from workers import tasks

    settings, sent = _worker_in_process(tmp_path, monkeypatch)
    msg = {**REVIEW_MSG, "reviewer": "nobody"}
    tasks.run_review(msg)  # a profile this worker's file does not have
    (tmp_path / "blocked").write_text("a file where the attempts folder should be")
    monkeypatch.setattr(tasks, "_place", tasks.WorkerPlace(settings, tmp_path / "blocked"))
    tasks.run_review({**msg, "reviewer": "fake"})  # no attempt folder can be made
    outcomes = [args[1] for args in sent if args[0] == "deliver_outcome"]
    assert [(o["job_id"], o["attempt"], o["classification"]) for o in outcomes] == [
        (7, 2, "launch-failure")
    ] * 2
    assert "no reviewer profile 'nobody'" in outcomes[0]["reasons"][0]
    assert "could not prepare its attempt folder" in outcomes[1]["reasons"][0]
    assert all(o["v"] == messages.VERSION and o["host"] for o in outcomes)


def test_a_worker_whose_profile_writes_another_partition_than_the_controls_refuses(
    tmp_path, monkeypatch
):
    """The control records a review under its profile's partition (which reviews are
    fresh; it follows the model unless set); the worker started its own file's model. A
    worker.toml left at the old model after the control's moved on ran every review of
    the new partition on the old model, recorded as the new one's, and said nothing."""
    from workers import tasks

    settings, sent = _worker_in_process(tmp_path, monkeypatch)
    mine = settings.reviewers["fake"].partition
    tasks.run_review({**REVIEW_MSG, "partition": "house-style-v4"})
    (outcome,) = [args[1] for args in sent if args[0] == "deliver_outcome"]
    assert outcome["classification"] == "launch-failure"
    reason = outcome["reasons"][0]
    assert f"writes partition {mine!r}" in reason and "'house-style-v4'" in reason
    assert "worker.toml" in reason
    assert not (tmp_path / "w" / "attempts").exists()
    # The model alone may be named otherwise (a provider's own id): the partition decides.
    sent.clear()
    tasks.run_review({**REVIEW_MSG, "partition": mine, "model": "another-id"})
    assert not [
        args
        for args in sent
        if args[0] == "deliver_outcome" and args[1]["classification"] == "launch-failure"
    ]


def test_the_attempt_folder_of_a_worker_that_died_goes_with_its_registry_entry(tmp_path):
    """A worker killed while its agent ran left attempts/job-N-attempt-K/ (the prompt,
    quoting notes; the agent's output and logs) for good: its outcome was never sent, and
    the next worker reaped the agent's registry entry but kept the folder. A folder that a
    live worker sharing the folder has registered stays."""
    import socket
    import subprocess

    from workers.attempt import reap_orphans, registry_dir

    folder = tmp_path / "w"
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    entries = {"dead": (dead.pid, 7, 2), "alive": (os.getpid(), 8, 1), "again": (dead.pid, 8, 1)}
    for n, (pid, job, attempt) in enumerate(entries.values()):
        (folder / "attempts" / f"job-{job}-attempt-{attempt}").mkdir(parents=True, exist_ok=True)
        (folder / "attempts" / f"job-{job}-attempt-{attempt}" / "prompt.md").write_text("p")
        registry_dir(folder).mkdir(parents=True, exist_ok=True)
        entry = {
            "worker_pid": pid,
            "pgid": dead.pid + 100000 + n,
            "job_id": job,
            "attempt": attempt,
        }
        (registry_dir(folder) / f"{socket.gethostname()}-{n}.json").write_text(json.dumps(entry))
    reap_orphans(folder, said="their worker died")
    assert sorted(p.name for p in (folder / "attempts").iterdir()) == ["job-8-attempt-1"]
    assert len(list(registry_dir(folder).iterdir())) == 1  # the live worker's


def test_an_attempt_run_again_beside_a_worker_of_the_release_before_openings_is_not_reaped(
    tmp_path,
):
    """Releases mixed on one worker folder at an upgrade: a worker of the release before
    openings (its registry entries name none) died stopping, its agent of job 8 attempt
    1 registered still, the attempt queued again and run by an upgraded worker sharing
    the folder (its entry names the opening), and the other way round. The next worker's
    reap took the two for different attempts: a reap notice for the attempt a live worker
    runs, which the control loses at once when that worker has not beaten yet."""
    import socket
    import subprocess

    from workers.attempt import reap_orphans, registry_dir

    folder = tmp_path / "w"
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    opened = "2026-11-28T01:02:03.456Z"
    entries = [
        (dead.pid, 8, None),  # the earlier release's, dead
        (os.getpid(), 8, opened),  # the upgraded one's, live
        (dead.pid, 9, opened),  # an upgraded one's, dead
        (os.getpid(), 9, None),  # an earlier release's, live
    ]
    registry_dir(folder).mkdir(parents=True)
    for n, (pid, job, at) in enumerate(entries):
        entry = {"worker_pid": pid, "pgid": dead.pid + 100000 + n, "job_id": job, "attempt": 1}
        entry |= {"opened_at": at} if at else {}
        (registry_dir(folder) / f"{socket.gethostname()}-{n}.json").write_text(json.dumps(entry))
    assert reap_orphans(folder, said="their worker died").orphaned == []
    assert len(list(registry_dir(folder).iterdir())) == 2  # the live workers'


def test_the_reap_of_a_dead_workers_agent_leaves_the_folder_a_live_worker_holds(tmp_path):
    """A worker killed during its stop (a sweep's SIGKILL after its grace) had queued its
    attempt again and left its agent's registry entry; a worker sharing its --state took
    the attempt up and waited for an agent slot in the folder it held. The next worker's
    reap of the dead one's agent removed that folder, prompt and all: only a registered
    agent of a live worker kept a folder."""
    import socket
    import subprocess

    from workers.attempt import attempt_folder, claim_attempt, reap_orphans, registry_dir

    folder = tmp_path / "w"
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    taken = attempt_folder(folder, 9, 1)
    taken.mkdir(parents=True)
    (taken / "prompt.md").write_text("p")
    registry_dir(folder).mkdir(parents=True)
    entry = {"worker_pid": dead.pid, "pgid": dead.pid + 100000, "job_id": 9, "attempt": 1}
    (registry_dir(folder) / f"{socket.gethostname()}-0.json").write_text(json.dumps(entry))
    claim = claim_attempt(taken)  # the live worker's, waiting for a slot
    try:
        reap_orphans(folder, said="their worker died")
        assert (taken / "prompt.md").is_file()
    finally:
        os.close(claim)
    assert list(registry_dir(folder).iterdir()) == []


def _reap_cut_short_then_again(
    monkeypatch: pytest.MonkeyPatch, folder: Path, kept_after_the_cut: Path | None = None
) -> None:
    """A dead worker's reap killed as it removed the first TMPDIR, then the next worker's
    reap; ``kept_after_the_cut``: a file the cut reap must have left."""
    from workers import attempt

    drop = attempt._drop

    def cut_short(scratch: str | None) -> None:
        raise SystemExit  # the reaping worker killed there

    monkeypatch.setattr(attempt, "_drop", cut_short)
    with pytest.raises(SystemExit):
        attempt.reap_orphans(folder, said="their worker died")
    assert kept_after_the_cut is None or kept_after_the_cut.exists()
    monkeypatch.setattr(attempt, "_drop", drop)
    attempt.reap_orphans(folder, said="their worker died")  # the next worker's


def test_a_reap_cut_short_leaves_the_entry_of_the_tmpdir_it_had_yet_to_remove(
    tmp_path, monkeypatch, own_tmpdir
):
    """The reap of a dead worker's agents removed their registry entries, then their
    TMPDIRs once the agents ended: a worker killed in between (as it started, or as it
    stopped) left the folders with no entry naming them for the next reap."""
    import socket
    import subprocess

    from workers import attempt

    folder = tmp_path / "w"
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    scratch = own_tmpdir / "reviewq-job-7-attempt-2-abcdefgh"
    scratch.mkdir()
    attempt.registry_dir(folder).mkdir(parents=True)
    entry = {
        "worker_pid": dead.pid,
        "pgid": dead.pid + 100000,
        "job_id": 7,
        "attempt": 2,
        "scratch": str(scratch),
    }
    (attempt.registry_dir(folder) / f"{socket.gethostname()}-0.json").write_text(json.dumps(entry))
    _reap_cut_short_then_again(monkeypatch, folder)
    assert not scratch.exists()
    assert list(attempt.registry_dir(folder).iterdir()) == []


def test_a_dead_workers_kept_tmpdirs_go_with_the_next_reap(tmp_path, monkeypatch, own_tmpdir):
    """A worker thread's TMPDIR is kept between its agents (workers.attempt._KEPT), when
    no agent's entry names it: a worker killed between two agents left it to no reap.
    Its process's list names it; a reap cut short keeps the list for the next one."""
    import socket
    import subprocess

    from workers import attempt

    folder = tmp_path / "w"
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    kept = own_tmpdir / f"reviewq-worker-{dead.pid}-abcdef"
    (kept / "d").mkdir(parents=True)
    (kept / "d" / "f").write_text("left by an agent")
    other = own_tmpdir / "not-a-kept-tmpdir"  # named, but not of that worker's making
    other.mkdir()
    attempt.registry_dir(folder).mkdir(parents=True)
    listed = attempt.registry_dir(folder) / f"{socket.gethostname()}-{dead.pid}.tmpdirs"
    listed.write_text(f"{kept}\n{other}\n{own_tmpdir / 'never-made'}\n")
    _reap_cut_short_then_again(monkeypatch, folder, kept_after_the_cut=listed)
    assert not kept.exists() and other.is_dir()
    assert list(attempt.registry_dir(folder).iterdir()) == []


def test_a_reap_leaves_the_entry_a_live_worker_is_writing(tmp_path, monkeypatch):
    """An agent's registry entry is made, then written: a reap of another process (a
    worker sharing the --state as it starts or stops, a sweep's) that read it in between
    found it empty, took it for one a killed worker left and removed it, the agent's only
    name (and its TMPDIR's) for its worker's stop and for the reap after that worker's
    death. An empty entry a killed worker left still goes, once it is old."""
    import socket
    import subprocess
    import time

    from workers import attempt

    from .test_vendor_errors import _spec

    folder = tmp_path / "w"
    registry = attempt.registry_dir(folder)
    reap = f"import pathlib, workers.attempt as a; a.reap_orphans(pathlib.Path({str(folder)!r}))"
    dumps = json.dumps

    def reaped_meanwhile(entry: object) -> str:
        subprocess.run([sys.executable, "-c", reap], check=True, timeout=60)
        return dumps(entry)

    monkeypatch.setattr(attempt.json, "dumps", reaped_meanwhile)
    entry = attempt.register_agent(registry, _spec(tmp_path), os.getpid(), scratch="s")
    monkeypatch.setattr(attempt.json, "dumps", dumps)
    assert entry is not None and json.loads(entry.read_text())["worker_pid"] == os.getpid()
    left = registry / f"{socket.gethostname()}-1.json"
    left.write_bytes(b"")  # a worker killed between the entry's making and its write
    os.utime(left, (time.time() - 3600,) * 2)
    attempt.reap_orphans(folder)
    assert sorted(registry.iterdir()) == [entry]


def test_a_fixer_is_not_shown_a_kb_copy_older_than_the_note_it_fixes(tmp_path, monkeypatch):
    """A worker's --kb copy left stale: a fixer that read the note there, not in its
    prompt, wrote the old text back with its edit, and the control applied it over the
    current note (a person's new sentence was gone). With the copy's note not the text
    the fixer is given, the fixer runs without the copy, and the worker says so."""
    from orchestrator import logs
    from workers import tasks

    settings, sent = _worker_in_process(tmp_path, monkeypatch)
    copy = tmp_path / "copy"
    (copy / "kb" / "notes").mkdir(parents=True)
    (copy / "kb" / "notes" / "n.md").write_text("old text\n")
    monkeypatch.setattr(tasks, "_place", tasks.WorkerPlace(settings, tmp_path / "w", copy))
    roots = []

    def agent(reviewer, spec, **kw):
        roots.append((spec.root, tuple(kw["guarded"])))
        return tasks.AttemptOutcome(spec.job_id, spec.attempt, "output", "fake")

    monkeypatch.setattr(tasks, "run_attempt", agent)
    logs.configure(tmp_path / "logs")
    fix = {
        **REVIEW_MSG, "task": "fix", "output_name": "fixed-note.md", "note_path": "kb/notes/n.md",
        "guarded": ["kb/notes/n.md"],
    }  # fmt: skip
    tasks.run_review({**fix, "note_text": "old text\n"})  # the copy is current
    tasks.run_review({**fix, "note_text": "old text\nA person's new sentence.\n"})
    assert roots[0] == (copy, ("kb/notes/n.md",))
    assert roots[1][0] != copy and roots[1][1] == ()
    lines = (tmp_path / "logs" / "logs" / "reviewq.jsonl").read_text().splitlines()
    [stale] = [e for e in map(json.loads, lines) if e["event"] == "attempt.kb_stale"]
    assert stale["note_path"] == "kb/notes/n.md" and str(copy) in stale["reason"]


def test_a_worker_whose_attempt_raises_sends_a_launch_failure(tmp_path, monkeypatch):
    """An error out of the attempt left the task with no outcome sent: the attempt was
    reaped as never picked up, which counts toward nothing, and ran again for good."""
    from workers import tasks

    _, sent = _worker_in_process(tmp_path, monkeypatch)

    def broken(*args, **kwargs):
        raise RuntimeError("a defect in the worker")

    monkeypatch.setattr(tasks, "run_attempt", broken)
    tasks.run_review(REVIEW_MSG)
    (outcome,) = [args[1] for args in sent if args[0] == "deliver_outcome"]
    assert outcome["classification"] == "launch-failure"
    assert "RuntimeError: a defect in the worker" in outcome["reasons"][0]
    assert not list((tmp_path / "w" / "attempts").iterdir())


def test_an_outcome_whose_send_fails_leaves_no_attempt_folder_nor_the_cli_s_state(
    tmp_path, monkeypatch
):
    """The queue away past the outcome's patience (an hour): the send raised out of the
    task, and the attempt folder (its prompt quoting the notes) stayed until the worker's
    next start, what the CLI kept for it in the worker's HOME (S26's `forget`) for good;
    the reaper runs the attempt again in a folder of its own, so nothing reads them."""
    from workers import tasks
    from workers.reviewers.base import Reviewer

    _worker_in_process(tmp_path, monkeypatch)

    def away(task: str, *args, **_kw) -> None:
        if task == "deliver_outcome":
            raise ConnectionError("the control queue did not answer for an hour")

    forgot: list[Path] = []
    monkeypatch.setattr(tasks, "send", away)
    monkeypatch.setattr(Reviewer, "forget", lambda self, spec: forgot.append(spec.attempt_dir))
    with pytest.raises(ConnectionError):
        tasks.run_review(REVIEW_MSG)
    assert not list((tmp_path / "w" / "attempts").iterdir())
    assert [p.name for p in forgot] == ["job-7-attempt-2"]


def test_a_worker_does_not_start_an_attempt_the_reaper_has_given_up(kb, tmp_path, monkeypatch):
    """A message left in the queue past lease + timeout (no worker was up) has been
    reaped and dispatched again: the worker that takes it later ran the agent anyway,
    for an outcome nobody acts on, and paid for it."""
    import time

    from orchestrator import logs
    from orchestrator.config import load_settings
    from workers import tasks

    msg = dispatched_message(kb)
    profile = load_settings(kb.root).reviewer("offline")
    # Half a lease before the reaper gives up: the message was built after the attempt
    # was opened, and a remote worker's clock may run a little behind the control's.
    assert 0 < msg["expires_at"] - time.time() <= msg["lease_s"] / 2 + profile.timeout
    logs.configure(tmp_path)
    sent: list[tuple] = []
    monkeypatch.setattr(tasks, "send", lambda *args, **_: sent.append(args))
    monkeypatch.setattr(tasks, "_place", tasks.WorkerPlace(load_settings(kb.root), tmp_path / "w"))
    tasks.run_review({**msg, "expires_at": time.time() - 5})
    assert sent == [] and not (tmp_path / "w" / "attempts").exists()
    lines = (tmp_path / "logs" / "reviewq.jsonl").read_text().splitlines()
    [expired] = [e for e in map(json.loads, lines) if e["event"] == "attempt.expired"]
    assert (expired["job_id"], expired["attempt"]) == (msg["job_id"], msg["attempt"])


@pytest.mark.parametrize("skew_s", [3600, -3600], ids=["ahead", "behind"])
def test_a_worker_whose_clock_is_off_times_expiry_by_the_queues_clock(
    kb, tmp_path, redis_url, skew_s
):
    """The expiry was the control's epoch time, read against the worker's own clock: one
    running ahead declined every message (dispatched, reaped and dispatched again for
    good); one running behind would start attempts already given up."""
    skew = tmp_path / "skew"
    skew.mkdir()
    (skew / "sitecustomize.py").write_text(
        f"import time\n_real = time.time\ntime.time = lambda: _real() + {skew_s}\n"
    )
    _swept_by_a_remote_worker(kb, tmp_path, redis_url, {}, process_env={"PYTHONPATH": str(skew)})
    own = (tmp_path / "remote" / "state" / "logs" / "reviewq.jsonl").read_text()
    assert '"attempt.expired"' not in own and '"attempt.exited"' in own


@pytest.mark.parametrize("skew", ["+600s", "-600s"], ids=["ahead", "behind"])
def test_a_workers_times_of_an_attempt_are_stored_on_the_queues_clock(
    kb, tmp_path, redis_url, skew
):
    """A worker whose clock is ten minutes off (the whole process and its agents, as on
    another machine: libfaketime): the control stored its `launched_at` and `ended_at` as
    the worker said them, beside its own `started_at` and `recorded_at`, so a 1-s attempt
    launched ten minutes after it was dispatched (ahead) or before (behind), and the
    control's `attempt.started` line named a launch ten minutes off its own stamp."""
    from orchestrator.state.store import parse_timestamp

    if (lib := libfaketime()) is None:
        pytest.skip("libfaketime is not installed: no other clock to give a worker")
    clock = {"LD_PRELOAD": str(lib), "FAKETIME": skew}
    _swept_by_a_remote_worker(kb, tmp_path, redis_url, {"FAKE_SLEEP": "1"}, process_env=clock)
    with db(kb) as conn:
        rows = conn.execute(
            "SELECT started_at, launched_at, ended_at, recorded_at FROM attempts"
        ).fetchall()
    assert rows
    for row in rows:
        started, launched, ended, recorded = (parse_timestamp(t).timestamp() for t in row)
        # In the order they came, within the second a clock is taken as agreeing.
        assert started - 2 <= launched <= ended <= recorded + 2, dict(row)


def test_an_attempt_whose_workers_clock_is_stepped_meanwhile_ends_on_the_queues_clock(
    kb, tmp_path, redis_url
):
    """A worker's clock ten minutes ahead, stepped back to the right time while its agent
    runs (NTP started, or the operator set it once told of the skew): how far the queue's
    clock was off was read once, before the launch, and the end moved by it, so the attempt
    ended ten minutes before it was launched (`ended_at` beside `recorded_at`, ten minutes
    behind)."""
    from orchestrator.state.store import parse_timestamp

    from .test_queue_integration import await_fifo, make_fifo

    if (lib := libfaketime()) is None:
        pytest.skip("libfaketime is not installed: no other clock to give a worker")
    small(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + f'url = "{redis_url}"\n')
    started, go = make_fifo(tmp_path, "started"), make_fifo(tmp_path, "go")
    env = {"FAKE_NOTIFY_FIFO": str(started), "FAKE_CONTINUE_FIFO": str(go)}
    home = tmp_path / "remote"
    home.mkdir()
    clock = tmp_path / "clock"
    clock.write_text("+600s\n")
    faked = {
        "LD_PRELOAD": str(lib),
        "FAKETIME_TIMESTAMP_FILE": str(clock),
        "FAKETIME_NO_CACHE": "1",  # the file read at each call: a step seen at once
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # a wall clock's step, as NTP's
    }
    worker = subprocess.Popen(
        [
            EXE,
            "--config",
            str(worker_toml(home / "worker.toml", redis_url, env)),
            "--state",
            str(home / "state"),
            "worker",
        ],
        cwd=home,
        env={**os.environ, **faked},
        stderr=subprocess.DEVNULL,
    )
    sweep = subprocess.Popen(
        [EXE, "--root", str(kb.root), "sweep", "--reviewer", "fake", "--workers", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        await_fifo(started)
        clock.write_text("+0s\n")
        with open(go, "w") as fifo:
            fifo.write("go\n")
        _, err = sweep.communicate(timeout=60)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
        stop(worker)
    assert sweep.returncode == 0, err
    with db(kb) as conn:
        (row,) = conn.execute("SELECT started_at, launched_at, ended_at, recorded_at FROM attempts")
    started_at, launched, ended, recorded = (parse_timestamp(t).timestamp() for t in row)
    assert started_at - 2 <= launched <= ended <= recorded + 2, dict(row)


def test_an_attempt_that_waited_for_an_agent_slot_past_its_lease_is_not_started(
    kb, tmp_path, monkeypatch
):
    """The expiry was looked at before the wait for a free agent slot: a message that
    waited there past its lease (every slot busy with long agents) still started an agent
    the reaper had given up, for an outcome nobody acts on."""
    import contextlib
    import time

    from orchestrator.config import load_settings
    from workers import tasks

    msg = {**dispatched_message(kb), "expires_at": time.time() + 60}
    clock = [time.time()]

    @contextlib.contextmanager
    def busy_slots(profile, beat, msg):
        clock[0] += 120  # the other agents took two minutes to free a slot
        yield True

    sent: list[tuple] = []
    monkeypatch.setattr(tasks, "send", lambda *args, **_: sent.append(args))
    monkeypatch.setattr(tasks, "_place", tasks.WorkerPlace(load_settings(kb.root), tmp_path / "w"))
    monkeypatch.setattr(tasks, "_agent_slot", busy_slots)
    monkeypatch.setattr(tasks.time, "time", lambda: clock[0])
    tasks.run_review(msg)
    assert sent == []  # no launch, no outcome: no agent ran
    assert list((tmp_path / "w" / "attempts").iterdir()) == []


def test_a_starting_worker_leaves_a_kept_folder_a_worker_beside_it_took_up_again(
    kb, tmp_path, monkeypatch
):
    """A stopped worker's kept folder, taken up (removed and made anew) by a worker
    sharing its --state for the attempt queued again, while a worker starting beside it
    removed the folders nobody held: it locked the old folder, then removed by its name
    the new one, prompt and all, under the attempt that held it."""
    import fcntl
    import threading
    import time

    from orchestrator import logs
    from orchestrator.config import load_settings
    from workers import attempt, tasks

    msg = dispatched_message(kb)
    folder = tmp_path / "w"
    kept = attempt.attempt_folder(folder, msg["job_id"], msg["attempt"], msg["opened_at"])
    kept.mkdir(parents=True)
    (kept / "prompt.md").write_text("the interrupted run's")
    os.utime(kept, (time.time() - 600, time.time() - 600))  # kept ten minutes ago
    logs.configure(tmp_path)
    monkeypatch.setattr(tasks, "_place", tasks.WorkerPlace(load_settings(kb.root), folder))
    # Set once the taker waits for the starting worker's look, or holds its new folder.
    ready, looked = threading.Event(), threading.Event()
    seen: list[bool] = []

    def runs(place, msg, profile, spec, kb, notices):  # noqa: ANN001, ANN202
        ready.set()
        looked.wait(30)
        seen.append((spec.attempt_dir / "prompt.md").is_file())

    monkeypatch.setattr(tasks, "_run_prepared", runs)
    taker = threading.Thread(target=tasks.run_review, args=(msg,))
    real = fcntl.flock

    def flock(fd, op):  # noqa: ANN001, ANN202
        if threading.current_thread() is taker and op == fcntl.LOCK_SH:
            ready.set()  # about to wait for the starting worker's look to end
        mine = threading.current_thread() is threading.main_thread()
        real(fd, op)
        if mine and op == fcntl.LOCK_EX | fcntl.LOCK_NB and not taker.is_alive():
            # The starting worker holds the kept folder: the other takes the attempt up
            # now, and it either waits or holds its new folder before the removal.
            taker.start()
            ready.wait(30)

    monkeypatch.setattr(fcntl, "flock", flock)
    try:
        assert attempt.remove_unclaimed(folder) == [kept.name]
    finally:
        looked.set()
        taker.join(30)
    assert seen == [True]


def test_the_prompt_names_the_workers_own_output_path(kb, tmp_path):
    from orchestrator.config import load_settings
    from workers import tasks

    msg = dispatched_message(kb)
    assert f"`{msg['output_shown']}`" in msg["prompt"]  # the control's path, in backticks
    profile = load_settings(kb.root).reviewer("offline")
    spec = tasks._prepare(tmp_path / "attempt", msg, profile, None)
    prompt = spec.prompt_path.read_text()
    assert msg["output_shown"] not in prompt and f"`{spec.output_path}`" in prompt
    assert spec.root == spec.job_dir == tmp_path / "attempt"  # no KB: the folder is all
    manifest = json.loads((spec.job_dir / "MANIFEST.json").read_text())
    assert [p["gate_id"] for p in manifest["pairs"]] == ["prose/body-check"]


def test_a_dispatch_nudge_taken_into_a_batch_of_heartbeats_still_dispatches(kb, monkeypatch):
    from orchestrator.control.control import Control
    from orchestrator.control.followup import FollowUp
    from workers import tasks
    from workers.app import make_app
    from workers.queues import send

    kb.gate("prose/body-check", ["body"])
    kb.note("a")
    ws = Workspace.open(kb.root)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws))
    assert control.dispatch() == 1
    kb.note("b")  # a job queued after the last dispatch, as an `enqueue` makes one
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    app = make_app(ws.settings)
    monkeypatch.setattr(tasks, "_control", control)
    beat = {"v": 4, "job_id": sent[0]["job_id"], "attempt": 1, "worker": "w:1", "host": "w"}
    send("attempt_heartbeat", beat)  # the process's first message, which runs alone
    app.control.execute(app.control.dequeue())
    send("attempt_heartbeat", {**beat, "launched": True})
    send("dispatch")  # the nudge `enqueue` sends
    app.control.execute(app.control.dequeue())
    assert app.control.pending_count() == 0
    assert len(sent) == 2  # job b went out although the nudge was taken into the batch
    ws.close()


def test_a_control_process_runs_its_first_message_alone(kb, monkeypatch):
    """The queue counts the control processes that died holding a message first, and
    drops it after three. Run with the messages waiting behind it, it was blamed for a
    death any of them caused: an innocent outcome was dropped, and its agent's run lost."""
    from orchestrator.control.control import Control
    from orchestrator.control.followup import FollowUp
    from workers import tasks
    from workers.app import make_app
    from workers.queues import send

    kb.gate("prose/body-check", ["body"])
    kb.note("a")
    ws = Workspace.open(kb.root)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    control = Control(ws, send_review=lambda msg: None, hooks=FollowUp(ws))
    assert control.dispatch() == 1
    monkeypatch.setattr(tasks, "_control", control)
    beat = {"v": 4, "job_id": 1, "attempt": 1, "worker": "w:1", "host": "w"}
    app = make_app(ws.settings)
    for _ in range(3):
        send("attempt_heartbeat", beat)
    app.control.execute(app.control.dequeue())
    assert app.control.pending_count() == 2  # the first ran alone
    app.control.execute(app.control.dequeue())
    assert app.control.pending_count() == 0  # later ones take what waits behind them
    ws.close()


def test_doctor_on_a_worker_machine_checks_only_what_a_worker_needs(tmp_path, redis_url):
    # A second machine has no KB and no state.db; `doctor --worker` must not call that a
    # problem, and must still catch a reviewer program that is not there.
    home = tmp_path / "remote"
    home.mkdir()
    config = worker_toml(home / "worker.toml", redis_url)
    from orchestrator.config import load_settings
    from workers.queues import huey_for, mark_fed

    # A control process has fed the queue (else it is a problem: test_worker_startup.py).
    mark_fed(huey_for(load_settings(home, config=config), "control"), Path("/srv/state"))
    args = [EXE, "--root", str(home), "--config", str(config), "--state", str(home / "state")]
    ok = subprocess.run([*args, "doctor", "--worker"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    fed, *rest = ok.stdout.splitlines()[1:]
    assert ok.stdout.splitlines()[:1] + rest == [
        "ok: queue backend Redis answers",
        "ok: reviewer fake (command)",
        "ok: reviewer offline (offline)",
    ]
    assert fed.startswith("ok: a control process feeds this queue (on "), fed
    assert "state folder /srv/state" in fed, fed
    assert not (home / "state" / "state.db").exists()
    # `doctor` without --worker there called the control that feeds the queue "another
    # control process feeds this Redis database too": a control of the same queue is none.
    plain = subprocess.run([*args, "doctor"], capture_output=True, text=True, timeout=60)
    assert "another control process" not in plain.stdout, plain.stdout
    assert f"problem: {home}: no kb/ folder here" in plain.stdout, plain.stdout
    assert "`reviewq doctor --worker`" in plain.stdout, plain.stdout
    config.write_text(
        config.read_text().replace(f'["{sys.executable}", "{FAKE}"]', '["no-such-agent-cli"]')
    )
    bad = subprocess.run([*args, "doctor", "--worker"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert "problem: reviewer fake (command): no-such-agent-cli not on PATH" in bad.stdout


def test_a_worker_of_another_release_than_its_control_says_so_as_it_starts(
    kb, tmp_path, redis_url, monkeypatch
):
    """A worker upgraded while its control was not (§6.6, walked at stop 48): its log
    said `worker.started` and nothing else, though every message either side sent would
    be refused; on a quiet queue nothing was said until the night's first job. The control
    here is of the next release (its `reviewq.control` key, written as it would)."""
    from types import SimpleNamespace

    from orchestrator.config import load_settings
    from workers.queues import huey_for, mark_fed

    from .test_queue_integration import _await_logged

    kb.write("reviewq.toml", f'[queue]\nurl = "{redis_url}"\n')
    monkeypatch.setattr(messages, "VERSION", messages.VERSION + 1)
    mark_fed(huey_for(load_settings(kb.root), "control"), kb.state, every=60.0)
    worker, home = start_worker(tmp_path, redis_url)
    try:
        _await_logged(SimpleNamespace(state=home / "state"), "worker.started")
    finally:
        stop(worker)
    lines = [json.loads(x) for x in (home / "state/logs/reviewq.jsonl").read_text().splitlines()]
    (said,) = [e for e in lines if e["event"] == "worker.release_unlike"]
    assert said["level"] == "error", said
    assert f"sends messages of version {messages.VERSION}, this reviewq speaks " in said["reason"]
    assert "install the control's reviewq release on this machine" in said["reason"], said


def test_a_worker_with_no_queue_url_away_from_the_control_refuses_to_start(tmp_path):
    """A worker.toml without `[queue] url` on a second machine: the worker waited, for
    good, on a SQLite queue of its own that no control process feeds, and said only
    `worker.started`; `doctor --worker` knew, the worker did not."""
    home = tmp_path / "remote"
    home.mkdir()
    config = home / "worker.toml"
    config.write_text(f'[reviewers.fake]\nkind = "command"\ncommand = ["{FAKE}"]\n')
    args = [EXE, "--root", str(home), "--config", str(config), "--state", str(home / "state")]
    try:
        res = subprocess.run([*args, "worker"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the worker started, to wait on a queue no control process feeds")
    assert res.returncode == 1
    assert "no [queue] url" in res.stderr and "set [queue] url" in res.stderr
    assert not (home / "state" / "queue").exists()


# --- what a worker says of an attempt, and when ------------------------------------------------


def _fake_worker(kb, tmp_path, monkeypatch, **msg_extra) -> tuple[dict, list[tuple[str, dict]]]:
    from orchestrator.config import load_settings
    from workers import tasks

    # An offline review's message, sent to the worker's "fake" profile (another partition:
    # the message's is left out, as an earlier control sends it).
    msg = {**dispatched_message(kb), "reviewer": "fake", "partition": "", **msg_extra}
    config = worker_toml(tmp_path / "w.toml", "redis://127.0.0.1:1/0")
    place = tasks.WorkerPlace(load_settings(tmp_path, tmp_path / "w", config), tmp_path / "w")
    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(tasks, "send", lambda name, payload, **_: sent.append((name, payload)))
    monkeypatch.setattr(tasks, "_place", place)
    return msg, sent


def test_a_quick_agent_is_told_of_by_its_outcome_alone(kb, tmp_path, monkeypatch):
    """A "launched" heartbeat went out as every agent started: for an agent quicker than
    a heartbeat period, a second message and a control transaction a job for nothing the
    outcome does not say (its start and its worker)."""
    from workers import attempt, tasks

    # The first heartbeat's second as long as the period: a quick agent's start took
    # over a second at a load of 20 (the fake agent's interpreter), and a heartbeat due
    # then was no "launched" one.
    monkeypatch.setattr(attempt, "FIRST_TICK_S", 30.0)
    msg, sent = _fake_worker(kb, tmp_path, monkeypatch, heartbeat_s=30.0)
    tasks.run_review(msg)
    assert [name for name, _ in sent] == ["deliver_outcome"]
    outcome = sent[0][1]
    assert outcome["classification"] == "output" and outcome["exited_at"] > 0
    assert outcome["started_at"] and outcome["worker"] and outcome["host"]


def test_a_longer_agents_first_heartbeat_says_its_launch_and_when(kb, tmp_path, monkeypatch):
    from workers import tasks

    monkeypatch.setenv("FAKE_SLEEP", "0.5")
    msg, sent = _fake_worker(kb, tmp_path, monkeypatch, heartbeat_s=0.1)
    tasks.run_review(msg)
    names = [name for name, _ in sent]
    assert names[-1] == "deliver_outcome" and names.count("attempt_heartbeat") >= 2
    beats = [payload for name, payload in sent if name == "attempt_heartbeat"]
    assert beats[0]["launched"] is True and all(b["launched"] is False for b in beats[1:])
    # Each says when: one lost on a busy queue leaves the next to say it.
    assert {b["started_at"] for b in beats} == {sent[-1][1]["started_at"]}
    assert not any(b.get("waiting") for b in beats)


@contextlib.contextmanager
def _every_slot_busy(tmp_path, monkeypatch):  # noqa: ANN001, ANN202
    """The fake profile's agent slots, all taken by other agents until the block ends."""
    from orchestrator.config import load_settings
    from workers import tasks

    monkeypatch.setattr(tasks, "_semaphores", {})
    profile = load_settings(tmp_path, tmp_path / "w", tmp_path / "w.toml").reviewer("fake")
    slots = tasks._semaphore(profile)
    while slots.acquire(blocking=False):
        pass
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # every slot given back
            while True:
                slots.release()


def test_a_worker_waiting_for_an_agent_slot_says_it_holds_the_message(kb, tmp_path, monkeypatch):
    """It took the message off the queue: without a word the control process would take
    the attempt for lost a lease later, while it waits for a slot (up to its deadline)."""
    import threading

    from workers import tasks

    msg, sent = _fake_worker(kb, tmp_path, monkeypatch, heartbeat_s=0.05)
    run = threading.Thread(target=tasks.run_review, args=(msg,))
    with _every_slot_busy(tmp_path, monkeypatch):
        run.start()
        for _ in range(200):  # bounded: 10 s
            if sum(1 for name, _ in sent if name == "attempt_heartbeat") >= 2:
                break
            run.join(0.05)
    run.join(30)
    assert not run.is_alive()
    waiting = [p for name, p in sent if name == "attempt_heartbeat" and p.get("waiting")]
    assert len(waiting) >= 2 and all(p["launched"] is False for p in waiting)
    assert sent[0][1].get("waiting") is True and sent[-1][0] == "deliver_outcome"


def test_a_worker_stops_holding_a_message_that_expired_while_it_waited(kb, tmp_path, monkeypatch):
    """Its waiting beats kept an attempt alive past the message's expiry, after which the
    control gives it up as never taken; and the thread waited on for a slot, only to drop
    the message once it had one."""
    import threading
    import time

    from workers import tasks

    msg, sent = _fake_worker(kb, tmp_path, monkeypatch, heartbeat_s=0.05)
    msg = {**msg, "expires_at": time.time() + 0.5}
    msg.pop("ttl_s", None)
    run = threading.Thread(target=tasks.run_review, args=(msg,))
    with _every_slot_busy(tmp_path, monkeypatch):  # for good
        run.start()
        run.join(30)
        alive = run.is_alive()
    run.join(30)
    assert not alive, "the worker went on waiting for a slot past the message's expiry"
    assert sent and all(name == "attempt_heartbeat" and p["waiting"] for name, p in sent)


def test_a_thread_given_an_agent_slot_once_its_worker_stops_starts_no_agent(
    kb, tmp_path, monkeypatch
):
    """A SIGTERM'd worker kills its agents; the thread waiting for an agent slot got the
    slot one of them freed and launched another, after the kill, for a task Huey had
    already queued again: an agent with no worker, and the attempt run twice."""
    import threading

    from workers import tasks

    ran = tmp_path / "agents-run"
    monkeypatch.setenv("FAKE_LOG", str(ran))
    msg, sent = _fake_worker(kb, tmp_path, monkeypatch, heartbeat_s=0.05)
    waits = threading.Event()

    def send(name: str, payload: dict, **_: object) -> None:
        sent.append((name, payload))
        if payload.get("waiting"):
            waits.set()

    monkeypatch.setattr(tasks, "send", send)
    run = threading.Thread(target=tasks.run_review, args=(msg,))
    try:
        with _every_slot_busy(tmp_path, monkeypatch):
            run.start()
            assert waits.wait(30), "the attempt never waited for a slot"
            tasks.STOPPING.set()  # the worker's stop; its agents killed, their slots freed
        run.join(30)
        assert not run.is_alive()
    finally:
        tasks.STOPPING.clear()
    assert not ran.exists(), "an agent started after its worker began to stop"
    assert "deliver_outcome" not in [name for name, _ in sent]  # queued again, not failed


@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_the_reaper_finds_which_attempts_still_have_a_message_on_the_review_queue(
    kb, request, monkeypatch, queue
):
    """Read on the real queue, a few messages at a time; a message that is no review's
    is passed over, and a queue that cannot be read answers nothing (None), not "gone"."""
    import sqlite3

    from workers import queues
    from workers.app import make_app
    from workers.queues import attempts_on, send

    if queue == "redis":
        kb.write("reviewq.toml", f'[queue]\nurl = "{request.getfixturevalue("redis_url")}"\n')
    ws = Workspace.open(kb.root)
    app = make_app(ws.settings)
    for job in range(1, 41):
        send("run_review", {"v": messages.VERSION, "job_id": job, "attempt": 1})
        if job == 20:
            app.review.storage.enqueue(b"not a message", 0)
    assert app.review.dequeue() is not None  # a worker takes one (the oldest: job 1)
    wanted = {(1, 1), (2, 1), (17, 1), (40, 1), (41, 1), (2, 2)}
    assert attempts_on(app.review, wanted) == {(2, 1), (17, 1), (40, 1)}
    assert attempts_on(app.review, {(40, 1)}) == {(40, 1)}

    def corrupt(storage):
        raise sqlite3.DatabaseError("file is not a database")  # not one a retry waits out

    monkeypatch.setattr(queues, "_each_message", corrupt)
    assert attempts_on(app.review, wanted) is None
    ws.close()


def test_a_held_message_that_never_runs_is_given_up_after_three_tries(tmp_path):
    """A control message Huey cannot run (unreadable, or Huey failed around the task) is
    never released: handed out again and again, it would hold the queue for good."""
    from workers.queues import QueueStorage

    queue = QueueStorage("control", str(tmp_path / "control.db"), holds=True, idle_look=0.01)
    queue.enqueue(b"unreadable", 0)
    queue.enqueue(b"next", 0)
    assert [queue.dequeue() for _ in range(4)] == [b"unreadable"] * 3 + [b"next"]
    queue.release()
    assert queue.dequeue() is None and queue.queue_size() == 0


def test_a_queue_folder_removed_under_a_running_process_is_made_again(tmp_path):
    """Followed to the file at the path (K88), a process whose queue folder was removed
    whole (`rm -r STATE/queue`) met "unable to open database file" at every try, where it
    had gone on with the file it had open."""
    from workers.queues import QueueStorage

    folder = tmp_path / "queue"
    folder.mkdir()
    queue = QueueStorage("review", str(folder / "review.db"), idle_look=0.01)
    queue.enqueue(b"before", 0)
    shutil.rmtree(folder)
    queue.enqueue(b"after", 0)  # into a file at the path, its folder made again
    assert (folder / "review.db").is_file()
    assert queue.dequeue() == b"after" and queue.dequeue() is None
    queue.close()


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_a_message_each_control_process_dies_on_is_given_up_after_three(tmp_path, request, backend):
    """A held message that kills the process running it (out of memory, say) was handed
    first to every control process after it: the count of tries lived in the dead
    process, so the control queue never ran again. The first hand-out of each process
    now counts in the queue itself."""
    from workers.queues import QueueStorage, RedisQueueStorage

    def control_process():  # the control queue as a newly started process opens it
        if backend == "sqlite":
            return QueueStorage("control", str(tmp_path / "control.db"), holds=True, idle_look=0.01)
        url = request.getfixturevalue("redis_url")
        return RedisQueueStorage("reviewq-control", url=url, holds=True, read_timeout=1)

    first = control_process()
    first.enqueue(b"kills its process", 0)
    first.enqueue(b"next", 0)
    assert first.dequeue() == b"kills its process"  # ... and the process dies
    assert control_process().dequeue() == b"kills its process"  # and dies again
    assert control_process().dequeue() == b"kills its process"  # three processes died
    fourth = control_process()
    assert fourth.dequeue() == b"next"  # the fourth gives it up
    fourth.release()
    assert control_process().dequeue() is None
    # A first message that ran leaves no count behind: it could not add up over restarts.
    for _ in range(4):
        queue = control_process()
        queue.enqueue(b"a message that runs", 0)
        assert queue.dequeue() == b"a message that runs"
        queue.release()


def test_a_failed_control_task_stays_on_the_queue_until_its_retry_is_written(kb, monkeypatch):
    """The task wrapper released the held message before Huey wrote the retry: a control
    process killed in between lost the message (an outcome: its agent's run)."""
    import sqlite3

    from workers import tasks
    from workers.app import make_app
    from workers.queues import send

    class Killed(BaseException):
        """The process dies here."""

    class Locked:
        def on_messages(self, beats, outcomes):
            raise sqlite3.OperationalError("database is locked")

    ws = Workspace.open(kb.root)
    monkeypatch.setattr(tasks, "_control", Locked())
    app = make_app(ws.settings)
    send("attempt_heartbeat", {"v": 4, "job_id": 1, "attempt": 1, "worker": "w:1", "host": "w"})

    def dies(data, ts):
        raise Killed

    monkeypatch.setattr(app.control.storage, "add_to_schedule", dies)
    with pytest.raises(Killed):
        app.control.execute(app.control.dequeue())
    after = make_app(ws.settings)  # the next control process
    assert after.control.pending_count() == 1
    monkeypatch.undo()
    app = make_app(ws.settings)
    monkeypatch.setattr(tasks, "_control", Locked())
    app.control.execute(app.control.dequeue())  # fails; Huey writes the retry
    assert app.control.pending_count() == 0 and app.control.scheduled_count() == 1
    ws.close()


def test_a_count_left_by_a_message_run_later_is_not_met_again(tmp_path):
    """A message handed first to a process that died, then run by a process that was
    handed another first, left its count behind; SQLite gives a free id again, so a new
    message under that id started with the old count and was given up a death early."""
    from workers.queues import QueueStorage

    def control_process():
        return QueueStorage("control", str(tmp_path / "control.db"), holds=True, idle_look=0.01)

    first = control_process()
    first.enqueue(b"old", 0)
    assert first.dequeue() == b"old"  # ... and the process dies
    second = control_process()
    second.enqueue(b"urgent", 1)  # handed out before the older one
    assert second.dequeue() == b"urgent"
    second.release()
    assert second.dequeue() == b"old"
    second.release()
    second.enqueue(b"new", 0)  # the table is empty: the id of "old" again
    for _ in range(3):  # three processes handed it first die: none gives it up yet
        assert control_process().dequeue() == b"new"
    assert control_process().dequeue() is None  # the fourth does


def test_a_redis_message_whose_count_fails_is_handed_out_at_the_next_read(redis_url, monkeypatch):
    """BLMOVE had moved the message to the held list when writing its count failed (Redis
    gone between the two): it stayed there, unrun, until the next control process."""
    from redis.exceptions import ConnectionError as RedisDown

    from workers.queues import RedisQueueStorage

    queue = RedisQueueStorage("reviewq-control", url=redis_url, holds=True, read_timeout=1)
    queue.enqueue(b"an outcome", 0)
    real = queue._count_first

    def down_once(token, data):
        monkeypatch.setattr(queue, "_count_first", real)
        raise RedisDown("Connection refused")

    monkeypatch.setattr(queue, "_count_first", down_once)
    assert queue.dequeue() is None  # the read waited the outage out
    assert queue.dequeue() == b"an outcome"
    queue.release()
    assert queue.dequeue() is None


@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_a_batch_takes_no_more_bytes_than_its_budget(kb, monkeypatch, request, queue):
    """A hundred waiting outcomes of 6 MiB each were read in one batch: 1.3 GB in the
    control, a MemoryError under a memory cap, and outcomes stranded. What the budget
    leaves waits for the next batch."""
    from workers import tasks

    ws, app, control, batches = _three_outcomes_waiting(kb, monkeypatch, request, queue)
    monkeypatch.setattr(tasks, "BATCH_BYTES", 1)  # one message's worth: each exceeds it
    while app.control.pending_count():
        app.control.execute(app.control.dequeue())
    assert [sum(b) for b in batches] == [2] * 3  # its own message and one more each time
    statuses = [r[0] for r in ws.store.conn.execute("SELECT status FROM review_jobs")]
    assert statuses == ["completed"] * 3
    ws.close()


def test_a_review_message_is_sent_though_the_queues_clock_cannot_be_read(monkeypatch):
    """Read outside the send's patience, a queue away for a moment made the stamp fail and
    the dispatch with it: the attempt waited lease + timeout for the reaper."""
    from types import SimpleNamespace

    from workers import consumers

    def away(huey):
        raise ConnectionError("Redis is restarting")

    sent: list[tuple] = []
    monkeypatch.setattr(consumers, "queue_clock", away)
    monkeypatch.setattr(consumers, "send", lambda *args: sent.append(args))
    consumers.send_review(SimpleNamespace(review=None), {"job_id": 1, "expires_at": 9.0})
    assert sent == [("run_review", {"job_id": 1, "expires_at": 9.0})]


def test_a_heartbeat_with_no_thread_to_be_had_is_a_missed_beat(monkeypatch):
    """A thread that could not start raised out of the loop that watches the agent, which
    then killed it; and the beat's lock stayed taken, so no later beat went out."""
    import threading

    from workers import tasks

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    beats = tasks._Beats(1, 1)
    beats.send()  # no exception
    assert beats._in_flight.acquire(blocking=False)  # free for the next one


def test_an_outcome_outlasts_a_queue_outage_longer_than_an_ordinary_send_waits(
    tmp_path, monkeypatch
):
    """A worker gave up sending an outcome after the two minutes any send waits: the
    agent's paid run was dropped, and it ran again once its attempt was reaped. An
    outcome now waits out a longer outage (here: ordinary sends wait half a second)."""
    import threading

    from orchestrator.config import load_settings
    from workers import queues, tasks
    from workers.app import make_app
    from workers.attempt import OUTPUT, AttemptOutcome

    from .test_queue_integration import redis_server

    monkeypatch.setattr(queues, "SEND_PATIENCE_S", 0.5)
    retrying = threading.Event()
    said = queues.said_retrying

    def noted(rs) -> None:
        said(rs)
        retrying.set()

    monkeypatch.setattr(queues, "said_retrying", noted)
    folder = tmp_path / "redis"
    folder.mkdir()
    with redis_server(folder) as url:
        settings = load_settings(tmp_path, tmp_path / "w", worker_toml(tmp_path / "w.toml", url))
        app = make_app(settings)
    # The server is gone: the outcome is sent into the outage.
    errors: list[BaseException] = []

    def report() -> None:
        try:
            tasks._report(AttemptOutcome(7, 1, OUTPUT, "fake", output=b"x"), {})
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            errors.append(exc)

    sender = threading.Thread(target=report)
    sender.start()
    try:
        assert retrying.wait(timeout=30), "the send did not retry"
        sender.join(timeout=1.5)  # past the ordinary patience, with no server
        assert sender.is_alive() and not errors, errors
        with redis_server(folder):  # back, on the same socket
            sender.join(timeout=60)
            assert not sender.is_alive() and not errors, errors
            task = app.control.dequeue()
            assert task is not None and task.name == "deliver_outcome"
            assert task.args[0]["job_id"] == 7
    finally:
        sender.join(timeout=60)


def test_a_send_says_its_first_failure(monkeypatch):
    """A send was tried once in silence before its retries began: a queue file locked for
    less than two busy timeouts (the first try waits one, the second the rest) left no
    line in any log, and the outage test could not tell it had happened."""
    import sqlite3

    from workers import queues

    tries: list[str] = []

    def locked_once(task, *args) -> None:
        tries.append(task)
        if len(tries) == 1:
            raise sqlite3.OperationalError("database is locked")

    said: list[str] = []
    monkeypatch.setattr(queues, "send_once", locked_once)
    monkeypatch.setattr(
        queues, "said_retrying", lambda rs: said.append(str(rs.outcome.exception()))
    )
    queues.send("deliver_outcome", {})
    assert tries == ["deliver_outcome"] * 2
    assert said == ["database is locked"]


def test_a_sends_patience_counts_its_first_try(monkeypatch):
    """Stop 30 ran a send's first try before tenacity, whose patience then started after
    it: a first try that waited out a busy timeout (30 s on a locked queue file) made a
    two-minute patience two and a half. The first try's wait counts, as it did."""
    import sqlite3
    import time

    from workers import queues

    clock = [1000.0]

    def sleep(s: float) -> None:
        clock[0] += s

    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(queues, "said_retrying", lambda rs: None)
    tries: list[float] = []

    def locked(task, *args) -> None:
        tries.append(clock[0])
        sleep(30.0 if len(tries) == 1 else 0.01)  # the first try waited a busy timeout
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(queues, "send_once", locked)
    with pytest.raises(sqlite3.OperationalError):
        queues.send("deliver_outcome", {}, patience_s=20.0)
    assert tries == [1000.0]  # past its patience after the first try: no second


def test_the_prompts_quoting_notes_are_private_to_their_owner(kb, tmp_path):
    """A prompt quotes the notes (a fix's also the note itself): the attempt folders that
    hold them, the worker's on its own disk and the job's ``attempt-N/``, are 0700 as the
    job's own prompt.md is 0600, even under a --state folder made 0755 by hand."""
    import stat

    from orchestrator.config import load_settings
    from workers import tasks

    msg = dispatched_message(kb)
    attempt_dir = next((kb.state / "jobs").glob("review-job-*/attempt-1"))
    assert stat.S_IMODE(attempt_dir.stat().st_mode) & 0o077 == 0
    (tmp_path / "w").mkdir(mode=0o755)
    profile = load_settings(kb.root).reviewer("offline")
    spec = tasks._prepare(tmp_path / "w" / "attempts" / "job-1-attempt-1", msg, profile, None)
    assert stat.S_IMODE(spec.job_dir.stat().st_mode) & 0o077 == 0


def test_redis_connections_notice_a_dead_link_and_wait_out_a_slow_one(kb):
    """Built from the URL alone, a queue's connections took redis-py's defaults: before
    8.0 no timeout and no keepalive (a worker waiting on BRPOP through a cut the server
    gave up on waited for good: tests/test_partitions.py), from 8.0 a 5-s timeout on a
    whole write (an outcome of a few MiB over a slow link never arrived)."""
    import socket

    from workers.queues import huey_for

    kb.write("reviewq.toml", '[queue]\nurl = "redis://192.0.2.1:6379/0"\n')
    pool = huey_for(Workspace.open(kb.root).settings, "review").storage.pool
    options = pool.connection_kwargs
    assert options["socket_timeout"] is None and options["socket_connect_timeout"] == 10
    assert options["socket_keepalive"] is True
    probes = options["socket_keepalive_options"]
    assert probes[socket.TCP_KEEPIDLE] == 15 and probes[socket.TCP_USER_TIMEOUT] == 30_000
    # What the URL says wins; a unix socket has no link to lose.
    kb.write("reviewq.toml", '[queue]\nurl = "redis://192.0.2.1:6379/0?socket_timeout=7"\n')
    pool = huey_for(Workspace.open(kb.root).settings, "control").storage.pool
    assert pool.connection_kwargs["socket_timeout"] == 7
    kb.write("reviewq.toml", '[queue]\nurl = "unix:///run/redis.sock"\n')
    pool = huey_for(Workspace.open(kb.root).settings, "review").storage.pool
    assert "socket_keepalive" not in pool.connection_kwargs


def test_heartbeats_go_on_while_a_slow_outcome_is_sent(kb, tmp_path, monkeypatch):
    """Nothing beat for an attempt once its agent had ended: an outcome that took longer
    than a lease to cross a slow link had the attempt reaped as lost, its outcome thrown
    away on arrival, and the job failed after enough of that, for the network's sake."""
    import threading

    from orchestrator.config import load_settings
    from workers import tasks

    msg = {**dispatched_message(kb), "heartbeat_s": 0.05}
    beat_after_exit = threading.Event()
    sending = threading.Event()
    got: dict[str, bool] = {}

    def slow_send(task: str, payload, **_) -> None:  # noqa: ANN001
        if task == "attempt_heartbeat" and sending.is_set():
            beat_after_exit.set()
        if task == "deliver_outcome":
            sending.set()
            # The outcome is still crossing the link; the lease must be kept meanwhile.
            got["beat"] = beat_after_exit.wait(timeout=10)

    monkeypatch.setattr(tasks, "send", slow_send)
    monkeypatch.setattr(tasks, "_place", tasks.WorkerPlace(load_settings(kb.root), tmp_path / "w"))
    tasks.run_review(msg)
    assert got == {"beat": True}


def test_a_stop_request_for_an_attempt_never_signals_another_attempts_agent(tmp_path):
    """The registry's process group checked only for the job's id: with a pid reused by
    the same job's next attempt on this worker, a stop request for the lost attempt
    would have signalled the current one's agent."""
    import signal
    import socket
    import subprocess

    from workers.attempt import registry_dir, stop_agent

    from .conftest import process_gone

    folder = tmp_path / "w"
    registry_dir(folder).mkdir(parents=True)
    env = {**os.environ, "REVIEWQ_JOB_ID": "5", "REVIEWQ_ATTEMPT": "2"}
    current = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        # The lost attempt 1's entry, naming the group that is attempt 2's agent now.
        entry = {"worker_pid": os.getpid(), "pgid": current.pid, "job_id": 5, "attempt": 1}
        (registry_dir(folder) / f"{socket.gethostname()}-{current.pid}.json").write_text(
            json.dumps(entry)
        )
        assert stop_agent(folder, 5, 1) is False
        assert not process_gone(current.pid)
    finally:
        os.killpg(current.pid, signal.SIGKILL)
        current.wait(timeout=10)


def _control_on_the_real_queue(kb, request, queue):  # noqa: ANN202
    """One review dispatched, and its first agent's beat taken, by a control whose stop
    requests go on the real review queue (SQLite or Redis)."""
    from orchestrator.control.control import Control
    from orchestrator.control.followup import FollowUp
    from workers.app import make_app
    from workers.queues import stop_requests

    small(kb, notes=1)
    if queue == "redis":
        kb.write("reviewq.toml", f'[queue]\nurl = "{request.getfixturevalue("redis_url")}"\n')
    ws = Workspace.open(kb.root)
    app = make_app(ws.settings)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True))
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, hooks=FollowUp(ws), stops=stop_requests())
    assert control.dispatch() == 1
    beat = {"v": messages.VERSION, "job_id": sent[0]["job_id"], "attempt": 1, "worker": "w:1",
            "host": "w", "launched": True, "started_at": "2026-01-01T00:00:00Z"}  # fmt: skip
    control.on_messages([beat], [])
    return ws, app, control, sent[0], beat


def _stop_keys(app) -> list[str]:  # noqa: ANN001
    return [k for k in app.review.storage.result_items() if k.startswith("reviewq.stop.")]


@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_a_stop_request_a_late_beat_set_is_swept_off_the_queue(kb, request, queue):
    """A beat of an attempt given up as lost that came after its outcome (queued behind a
    slow one, or sent again by a restarted worker) set a key in review.db or Redis that no
    worker read and nothing took off. The reaper takes it off a lease later."""
    from datetime import UTC, datetime, timedelta

    from .test_control import _outcome

    ws, app, control, msg, beat = _control_on_the_real_queue(kb, request, queue)
    lease = timedelta(seconds=ws.settings.queue.lease_seconds)
    now = datetime.now(UTC) + 2 * lease
    control.now = lambda: now
    assert control.reap() == 1  # lost
    control.on_messages([], [_outcome(ws, msg, worker="w:1")])  # superseded
    control.on_messages([beat], [])  # the late beat
    assert _stop_keys(app) == [f"reviewq.stop.{msg['job_id']}.1"]
    now += 2 * lease
    control.reap()
    assert _stop_keys(app) == []
    ws.close()


@pytest.mark.parametrize("queue", ["sqlite", "redis"])
def test_a_second_agent_of_an_attempt_acted_on_reads_a_stop_request(kb, request, queue):
    """A review message sent twice (a Redis send whose reply was lost, retried) ran two
    agents of one attempt: once the first's outcome was acted on, the second ran on to its
    deadline for an output that is discarded. Its worker reads a request to stop it."""
    from workers.queues import stop_requests

    from .test_control import _outcome

    ws, app, control, msg, beat = _control_on_the_real_queue(kb, request, queue)
    control.on_messages([], [_outcome(ws, msg, worker="w:1")])
    control.on_messages([{**beat, "worker": "w:2"}], [])  # the second agent
    reason = stop_requests().asked(msg["job_id"], 1)  # as its worker reads it
    assert reason and "(finalized) is recorded" in reason
    assert _stop_keys(app) == []  # taken
    ws.close()


def test_a_second_agent_of_an_attempt_already_finalized_is_stopped(kb, tmp_path, redis_url):
    """A review message sent twice (a Redis send whose reply was lost, retried; here
    copied on the queue) ran two agents of one attempt on two machines. The first one's
    output finalized the job; the second, neither superseded nor lost, was never asked to
    stop and ran on to its deadline (600 s here) for an output that is discarded."""
    import threading

    from workers.app import make_app

    from .test_queue_integration import _await_exit, _until, await_fifo, make_fifo

    small(kb, notes=1)
    kb.write("reviewq.toml", fake_profile(timeout='"600s"') + FAST_QUEUE + f'url = "{redis_url}"\n')
    fifo, pidfile = make_fifo(tmp_path, "started"), make_fifo(tmp_path, "pids")
    hang = {"FAKE_MODE": "hang", "FAKE_NOTIFY_FIFO": str(fifo), "FAKE_PIDFILE": str(pidfile)}
    env = {**os.environ, "REVIEWQ_LOG_FORMAT": "json"}
    control = subprocess.Popen([EXE, "--root", str(kb.root), "control"], env=env, stderr=subprocess.PIPE)  # fmt: skip
    procs, agents = [control], []
    try:
        assert rq(kb, "enqueue", "--reviewer", "fake", "--all-gates").returncode == 0
        _until(control.stderr, "attempt.dispatched")
        threading.Thread(target=control.stderr.read, daemon=True).start()  # its pipe drained
        ws = Workspace.open(kb.root)
        review = make_app(ws.settings).review.storage
        ws.close()
        review.conn.lpush(review.queue_key, review.conn.lindex(review.queue_key, 0))
        # One machine's agent hangs on one copy; then another's reviews the other.
        (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
        procs.append(start_worker(tmp_path / "a", redis_url, hang, "--workers", "1")[0])
        agents.append(int(await_fifo(fifo).split()[0]))
        # With its child, said once it started it: a file read after the agent's stop
        # was not there when the stop came first.
        agents += [int(p) for p in await_fifo(pidfile).split()]
        procs.append(start_worker(tmp_path / "b", redis_url, {}, "--workers", "1")[0])
        _await_exit(agents, timeout=60)  # a heartbeat is every 0.5 s here
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        for pid in agents:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with db(kb) as conn:
        job = conn.execute("SELECT status, attempt FROM review_jobs").fetchone()
        outcomes = [r[0] for r in conn.execute("SELECT outcome FROM attempts")]
    assert tuple(job) == ("completed", 1) and outcomes == ["finalized"]
    (asked,) = [e for e in log_lines(kb) if e["event"] == "attempt.stop_asked"]
    assert (asked["job_id"], asked["attempt"]) == (1, 1)
    assert "(finalized) is recorded" in asked["reason"]
    stopping = (tmp_path / "a/remote/state/logs/reviewq.jsonl").read_text()
    assert '"attempt.stopping"' in stopping


def test_a_worker_started_before_its_control_keeps_out_of_the_controls_folder(kb, tmp_path):
    """A worker beside the KB, on Redis, started a moment before its control (as `make`
    targets and tests start both): the state folder had no state.db or control.lock yet,
    so the worker took it for a machine of its own and wrote its log and attempts into the
    control's logs/ and attempts/. The state folder of a KB root is the control's."""
    from orchestrator.config import load_settings
    from workers.attempt import worker_folder

    kb.write("reviewq.toml", '[queue]\nurl = "redis://127.0.0.1:1/0"\n')
    settings = load_settings(kb.root)
    assert not settings.state_dir.exists()
    assert worker_folder(settings) == settings.state_dir / "worker"
    remote = load_settings(tmp_path, tmp_path / "w", kb.root / "reviewq.toml")
    assert worker_folder(remote) == tmp_path / "w"  # a machine of its own: --state itself
    named = load_settings(kb.root, kb.root / "workers" / "w1")  # as the fault harness does
    assert worker_folder(named) == kb.root / "workers" / "w1"


def test_outcomes_sent_quickly_do_not_wake_the_reporting_thread():
    """Each outcome woke the thread that beats for outcomes still being sent, to wait
    again: a thread switch under the GIL for every job (~50 us of the worker's CPU a
    job) for a beat due a heartbeat period later, long after the outcome was sent. A
    beat due before the thread's next look still wakes it."""
    import threading

    from workers import tasks

    class Counted(threading.Condition):
        notified = 0

        def notify(self, n: int = 1) -> None:
            Counted.notified += 1
            super().notify(n)

    class Beat:
        def __init__(self) -> None:
            self.sent = threading.Event()

        def send(self) -> None:
            self.sent.set()

        def wait(self) -> None:
            pass

    reporting = tasks._Reporting()
    reporting._cond = Counted()
    for _ in range(50):
        with reporting.beating(Beat(), 30.0):
            pass
    assert Counted.notified == 0
    slow, quick = Beat(), Beat()
    with reporting.beating(slow, 30.0), reporting.beating(quick, 0.05):
        assert quick.sent.wait(timeout=10)
    assert not slow.sent.is_set()


@pytest.mark.parametrize(
    "spans",
    [None, "0-4", [[5, 2]], [[0, 99]], [["0", 8]], [[0, 8], [2, 9]], [[True, 8]], [[0, 4, 8]]],
)
def test_a_workers_secret_ranges_that_make_no_sense_leave_the_output_as_it_came(spans):
    assert logs.spanned(b"abcdefghij", spans) == (["abcdefgh"] if spans == [[0, 8], [2, 9]] else [])


def test_the_controls_concurrency_bounds_every_workers_agents_together(kb, tmp_path, redis_url):
    """OPERATIONS §6.6 (S13): the control keeps at most 2 x its profile's `concurrency`
    attempts open on the queue for all workers together (3 x for quick agents), so at the
    default 1 two remote workers of two slots each ran two agents at a time; raised to
    their slots together, all four run. Its numbers are read from the text, so the cap and
    what the operator is told change together."""
    import re
    import time

    from orchestrator.control.control import PREFETCH, QUICK_PREFETCH

    ops = (Path(__file__).parents[1] / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")
    said = re.search(r"at most (\d) x \((\d) x for quick\s+agents\)", ops)
    assert said and said.groups() == (str(PREFETCH), str(QUICK_PREFETCH)), said
    small(kb, notes=6)
    profile = fake_profile(timeout='"120s"').replace("concurrency = 2", "concurrency = {}")
    queue = FAST_QUEUE.replace("lease_seconds = 2", "lease_seconds = 60") + f'url = "{redis_url}"\n'
    notify, go = tmp_path / "started", tmp_path / "go"
    os.mkfifo(notify)
    os.mkfifo(go)  # never written: each agent waits on it until its worker stops it
    agents = {"FAKE_NOTIFY_FIFO": str(notify), "FAKE_CONTINUE_FIFO": str(go)}
    reader = os.open(notify, os.O_RDONLY | os.O_NONBLOCK)
    # A writer of its own held open: between two agents' writes the FIFO had none, and
    # select said "readable" (a hang-up) of a pipe with nothing in it.
    held = os.open(notify, os.O_WRONLY | os.O_NONBLOCK)
    started: list[str] = []

    def running(n: int) -> int:
        """Await ``n`` agents started in all (each writes a line as it starts); how many
        attempts are then open in state.db, by any worker."""
        deadline, data = time.monotonic() + 60, b""
        while len(started) < n:
            ready = ready_within(reader, deadline - time.monotonic())
            assert ready, f"{len(started)} agent(s) started, not {n}"
            data += os.read(reader, 4096)
            *lines, data = data.split(b"\n")
            started.extend(x.decode() for x in lines)
        with db(kb) as conn:
            return conn.execute(
                "SELECT count(*) FROM attempts WHERE outcome IN ('dispatched', 'running')"
            ).fetchone()[0]

    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    workers = [start_worker(tmp_path / name, redis_url, agents)[0] for name in ("a", "b")]
    control = None
    try:
        kb.write("reviewq.toml", profile.format(1) + queue)
        control = subprocess.Popen([EXE, "--root", str(kb.root), "control"])
        assert rq(kb, "enqueue", "--reviewer", "fake", "--all-gates").returncode == 0
        # Four slots on two machines, six jobs: the one dispatch pass opened two.
        assert running(2) == PREFETCH == len(started)
        stop(control)
        kb.write("reviewq.toml", profile.format(4) + queue)  # the slots of both workers
        control = subprocess.Popen([EXE, "--root", str(kb.root), "control"])
        assert running(4) >= 4
        parents = {line.split()[1] for line in started}  # "pid ppid attempt": the worker
        assert parents == {str(proc.pid) for proc in workers}, (parents, started)
    finally:
        for proc in workers:
            proc.terminate()  # stops its agents now: none would end on its own
            proc.wait(timeout=30)
        if control is not None:
            stop(control)
        os.close(held)
        os.close(reader)


def test_the_controls_doctor_says_a_missing_cli_as_a_problem_where_a_worker_of_its_host_runs(
    kb, tmp_path, redis_url
):
    """A worker on the control's machine with a folder of its own (§6.6's command, run
    there too) runs the agents on that machine: what it lacks for a reviewer is a problem
    there, not the warning S11 gives where the workers may all be elsewhere."""
    small(kb, notes=1)
    missing = '[reviewers.far]\nkind = "command"\ncommand = ["no-such-agent"]\npartition = "fake"\n'
    kb.write("reviewq.toml", fake_profile() + missing + FAST_QUEUE + f'url = "{redis_url}"\n')
    worker, _ = start_worker(tmp_path, redis_url)
    try:
        before = rq(kb, "doctor", timeout=60)
        sweep = rq(kb, "sweep", "--reviewer", "fake", "--workers", "0", "--json", timeout=90)
    finally:
        stop(worker)
    after = rq(kb, "doctor", timeout=60)
    assert sweep.returncode == 0, sweep.stderr
    assert not (kb.state / "worker").exists()  # no worker beside the control
    said = "reviewer far (command): no-such-agent not on PATH"
    assert before.returncode == 0 and f"warning: {said}" in before.stdout, before.stdout
    assert after.returncode == 1 and f"problem: {said}" in after.stdout.splitlines(), after.stdout


def test_a_hostile_workers_ranges_redact_no_more_than_their_bound_in_linear_time():
    """Ranges splitting a character or shorter than a secret are passed over; 100,000
    distinct ones over 5 MiB give at most MAX_SPANNED secrets to replace in each text."""
    data = "é".encode() * 4 + "".join(f"{i:08d}" for i in range(650_000)).encode()
    spans = [[1, 7], [8, 10], *([i, i + 6] for i in range(10, 5_200_000, 52))]
    secrets = logs.spanned(data, spans)
    assert len(secrets) == logs.MAX_SPANNED and all(len(s) == 6 for s in secrets)
    assert "ééé" not in "".join(secrets)


@dataclass
class _Hanging:
    worker: subprocess.Popen
    sweep: subprocess.Popen
    agent: int  # the first attempt's, a 600-s agent
    env: dict[str, str]  # the worker's reviewer's
    fifo: Path  # where each attempt's agent says it runs


@contextlib.contextmanager
def _hanging_agent(kb, tmp_path: Path, redis_url: str, stderr=None) -> Iterator[_Hanging]:
    """A remote worker on a real redis-server running a sweep's one job, whose first
    attempt's agent hangs for 600 s (the next behaves), its heartbeat heard; the sweep,
    the worker (the one a test puts in ``.worker``) and the agent are ended after."""
    from .test_queue_integration import _await_logged, await_fifo, make_fifo

    small(kb, notes=1)
    kb.write(
        "reviewq.toml",
        fake_profile(timeout='"600s"')
        + f'[queue]\nurl = "{redis_url}"\nlease_seconds = 300\nreaper_seconds = 0.5\n'
        "launch_backoff_seconds = 0.05\npoll_seconds = 0.02\n",
    )
    fifo = make_fifo(tmp_path, "started")
    env = {"FAKE_MODE_1": "hang", "FAKE_MODE": "good", "FAKE_NOTIFY_FIFO": str(fifo)}
    worker, _ = start_worker(tmp_path, redis_url, env, stderr=stderr)
    sweep = subprocess.Popen(
        [EXE, "--root", str(kb.root), "sweep", "--reviewer", "fake", "--workers", "0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = None
    try:
        agent, worker_pid, attempt = map(int, await_fifo(fifo).split())
        assert (worker_pid, attempt) == (worker.pid, 1)
        _await_logged(kb, "attempt.started")  # its first heartbeat: running, by that worker
        run = _Hanging(worker, sweep, agent, env, fifo)
        yield run
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
        if run is not None:  # first: a worker's stop waits for the agents it runs
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.agent, signal.SIGKILL)
        ended = run.worker if run is not None else worker
        stop(ended)
        # A killed worker's kept TMPDIR is the next worker's start to remove (its guard
        # leaves it, as it leaves the registry): none starts here.
        for kept in Path(os.environ["TMPDIR"]).glob(f"reviewq-worker-{ended.pid}-*"):
            shutil.rmtree(kept, ignore_errors=True)


def _died(tmp_path: Path) -> list[dict]:
    """The ``worker.died`` lines of :func:`start_worker`'s worker's own log."""
    own = tmp_path / "remote/state/logs/reviewq.jsonl"
    return [e for e in map(json.loads, own.read_text().splitlines()) if e["event"] == "worker.died"]


def test_a_worker_restarted_after_a_crash_tells_the_control_of_the_attempt_it_reaped(
    kb, tmp_path, redis_url
):
    """A worker SIGKILLed with its agent running, started again: its reap at start found
    the dead one's attempt, and said so in its own log alone. The control waited
    a lease without a heartbeat (minutes for a real agent; 300 s here) before it ran the
    job again. The new worker tells it, and the attempt is lost and sent again at once,
    the story in the control's `logs --job`; the one pair accepted once. The agent ended
    with its worker, before any other started (its guard): it ran on, past its deadline
    and paid for, until a worker started on that host, if one ever did."""
    from .test_queue_integration import _await_exit

    with _hanging_agent(kb, tmp_path, redis_url) as run:
        worker_pid, agent, guard = run.worker.pid, run.agent, guard_of(run.worker.pid)
        run.worker.kill()
        run.worker.wait(timeout=10)
        # A 600-s agent: ended by its guard alone, which then says so and ends, before
        # the next worker starts (the order of the two words in the worker's log).
        _await_exit([agent, guard], timeout=30)
        os.unlink(run.fifo)  # the next attempt need not report
        run.worker, _ = start_worker(tmp_path, redis_url, run.env)
        out, err = run.sweep.communicate(timeout=60)  # far less than the lease
    assert run.sweep.returncode == 0, err
    with db(kb) as conn:
        outcomes = [tuple(r) for r in conn.execute("SELECT attempt, outcome FROM attempts")]
        (reasons,) = conn.execute("SELECT reasons FROM attempts WHERE attempt = 1").fetchone()
        acc = conn.execute("SELECT count(*) FROM acceptance").fetchone()[0]
    assert sorted(outcomes) == [(1, "lost"), (2, "finalized")] and acc == 1
    dead = f"{socket.gethostname()}:{worker_pid}"
    (reason,) = json.loads(reasons)
    # Its guard ended the agent (awaited gone above): the next worker found it ended, and
    # the control said that worker "reaped its agent" (K97).
    assert reason == (
        f"its worker {dead} died; the worker {socket.gethostname()}:{run.worker.pid} that "
        "followed it found the attempt unfinished, its agent ended"
    )
    story = rq(kb, "logs", "--job", "1").stdout
    lost = [x for x in story.splitlines() if "attempt.lost" in x]
    assert len(lost) == 1 and "its agent ended" in lost[0] and "reaped" not in lost[0], story
    # And on the worker's machine, its own log's story of the job holds the death, as
    # it came, and the reap (`attempts=[[1, 1]]`): `logs --job 1` there showed nothing.
    home = tmp_path / "remote"
    own = ("--config", str(home / "worker.toml"), "--state", str(home / "state"))
    mine = rq(kb, *own, "logs", "--job", "1", "--event", "worker.").stdout
    events = [x.split()[2] for x in mine.splitlines()]
    assert events == ["worker.died", "worker.reaped_orphans"], mine
    assert f"worker={dead}" in mine.splitlines()[0] and f"process_groups=[{agent}]" in mine, mine
    # `job N` in words: a worker spoke of it (the next one), so not "no word in time".
    said = rq(kb, "job", "1").stdout
    (line,) = [x for x in said.splitlines() if x.strip().startswith("attempt 1:")]
    assert line.strip().startswith("attempt 1: lost, ") and "no word" not in said, said
    assert f"its worker {dead} died; the worker " in said, said


def test_a_guard_given_its_workers_stop_signals_guards_on(kb, tmp_path, redis_url):
    """A unit whose KillMode signals every process of its cgroup (systemd's default), or a
    `pkill -f` of a state folder's name, gave the guard its worker's stop signals: SIGINT
    ended it with a KeyboardInterrupt's traceback in the worker's stderr (its journal),
    SIGTERM and SIGHUP silently, and the worker, still draining or running on, was
    unguarded: killed then, its 600-s agent ran on. The guard ends by its pipe alone."""
    from .test_queue_integration import _await_exit

    with (
        open(tmp_path / "worker.stderr", "wb") as stderr,
        _hanging_agent(kb, tmp_path, redis_url, stderr=stderr) as run,
    ):
        guard = guard_of(run.worker.pid)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            os.kill(guard, sig)
        run.worker.kill()
        run.worker.wait(timeout=10)
        _await_exit([run.agent], timeout=30)
        _await_exit([guard], timeout=30)
    (died,) = _died(tmp_path)
    assert died["process_groups"] == [run.agent], died
    assert "Traceback" not in (tmp_path / "worker.stderr").read_text()


def test_a_worker_whose_guard_ends_says_so_and_starts_another(kb, tmp_path, redis_url):
    """A guard killed (SIGKILL, by hand or a cgroup's OOM killer) under a live worker:
    the worker said nothing, and a kill of it then left its agents running until the next
    worker's start, for good with none. It says `worker.guard_ended` and starts another,
    which ends the agent as the first would have."""
    from .test_queue_integration import _await_exit, _await_logged

    with _hanging_agent(kb, tmp_path, redis_url) as run:
        first = guard_of(run.worker.pid)
        os.kill(first, signal.SIGKILL)
        own = SimpleNamespace(state=tmp_path / "remote/state")
        _await_logged(own, "worker.guard_ended", timeout=30)
        second = guard_of(run.worker.pid)
        assert second != first
        run.worker.kill()
        run.worker.wait(timeout=10)
        _await_exit([run.agent, second], timeout=30)  # the guard logs, then ends
    lines = [json.loads(x) for x in (own.state / "logs/reviewq.jsonl").read_text().splitlines()]
    (said,) = [e for e in lines if e["event"] == "worker.guard_ended"]
    assert said["reason"].startswith(f"its guard (pid {first}) ended (killed by SIGKILL"), said
    assert said["reason"].endswith("another guards the worker now"), said
    (died,) = _died(tmp_path)
    assert died["process_groups"] == [run.agent], died


def test_a_worker_that_cannot_start_its_guard_says_what_a_kill_of_it_leaves(tmp_path, monkeypatch):
    """A guard that cannot start (a pids limit: EAGAIN) does not stop the worker, which
    says in one line that a kill of it leaves its agents to the next worker's start."""
    import errno

    from workers import consumers

    def refused(folder: Path) -> None:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    logs.configure(tmp_path)
    monkeypatch.setattr(consumers, "Guard", refused)
    assert consumers._guarded(tmp_path) is None
    lines = [json.loads(x) for x in (tmp_path / "logs/reviewq.jsonl").read_text().splitlines()]
    (said,) = [e for e in lines if e["event"] == "worker.unguarded"]
    assert said["reason"].startswith("cannot start its guard ([Errno 11] Resource"), said
    assert "leaves its agents running until the next worker" in said["reason"], said


def test_a_starting_worker_whose_queue_is_down_says_the_reaped_attempts_once(tmp_path, monkeypatch):
    """The reap notices go before the worker's start: with the queue down, each waited its
    own patience (10 s) and said its own line; the first failure now says them all, once."""
    from workers import tasks

    logs.configure(tmp_path)
    tries: list[tuple] = []

    def down(*args, **_kw) -> None:
        tries.append(args)
        raise ConnectionError("Redis is restarting")

    monkeypatch.setattr(tasks, "send", down)
    tasks.tell_reaped([(7, 1, "h:10"), (8, 2, "h:10"), (9, 1, "h:11")])
    assert len(tries) == 1
    lines = [json.loads(x) for x in (tmp_path / "logs/reviewq.jsonl").read_text().splitlines()]
    (said,) = [e for e in lines if e["event"] == "worker.reap_unsent"]
    assert said["attempts"] == [[7, 1], [8, 2], [9, 1]] and said["reaped"] == ["h:10", "h:11"]


def test_doctor_does_not_ask_for_a_control_where_one_on_another_machine_feeds_the_queue(
    kb, redis_url, run_cli
):
    """The KB's reviewq.toml ([[sweeps]], [queue] url) on a laptop, its control on a server
    feeding the Redis queue: doctor on the laptop said the entries fire only while a control
    runs, "and none does: start `reviewq control`", a second control whose [[sweeps]]
    would run every night twice (doctor's own line names the one that feeds the queue)."""
    from orchestrator.config import load_settings
    from workers.queues import huey_for, mark_fed

    kb.gate("prose/body-check", ["body"])
    kb.note("alpha")
    kb.write(
        "reviewq.toml",
        f'[queue]\nurl = "{redis_url}"\n\n[[sweeps]]\nname = "nightly"\ncron = "30 1 * * *"\n',
    )
    mark_fed(huey_for(load_settings(kb.root), "control"), Path("/srv/state"), every=60.0)
    said = run_cli("doctor").stdout
    assert "state folder /srv/state" in said, said
    assert "nightly" not in said, said


def test_in_process_commands_on_redis_leave_no_connection_open(kb, run_cli, redis_url):
    """A command's Redis connections are closed as it ends: doctor and every command that
    nudged the control left two sockets open for good in the process that ran it."""
    from .test_queue_integration import open_descriptors, opened_since

    small(kb)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + f'url = "{redis_url}"\n')
    # The first command that logs opens the log file, kept for the process's next lines.
    assert run_cli("enqueue", "--reviewer", "fake").exit_code == 0
    for args in (("doctor",), ("doctor", "--worker"), ("enqueue", "--reviewer", "offline")):
        before = open_descriptors()
        run_cli(*args)  # doctor fails here (no worker, no control): its checks ran
        assert not opened_since(before), args
