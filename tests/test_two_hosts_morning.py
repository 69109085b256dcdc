"""The morning after a night on two machines (stop 45): redis-server and the control in one
network namespace, the worker in another (``tests/test_two_hosts.py``'s hosts and
``tests/test_partitions.py``'s ``TwoHosts``). In the night the worker is SIGKILLed while its
agents run, the control is stopped, the agents end unheard, a new worker starts and runs
what waits on the queue while no control runs, and the control starts again. Then the
morning's commands are read on the control's machine, and the worker's log on its own.

One night for the module; each test reads one thing of it. Needs root (namespaces); it
skips, saying why, where it cannot make them.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import select
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime
from types import SimpleNamespace

import pytest

from .conftest import page_text
from .test_partitions import TwoHosts
from .test_two_hosts import EXE, namespaces

pytestmark = pytest.mark.integration


def await_exit(pid: int, timeout: float = 60) -> None:
    """Until a process that is not this one's child has ended (its pidfd turns readable)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        assert poller.poll(timeout * 1000), f"process {pid} still runs after {timeout} s"
    finally:
        os.close(fd)


def at(stamp: str) -> datetime:
    """A log line's time or a recorded one (3 or 6 decimals): compared as times."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


# An endpoint on the worker's loopback where nothing listens: no model answers its jobs.
GATEWAY = (
    '\n[reviewers.gateway]\nkind = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:9"\n'
    'connect_timeout = "5s"\n'
)


def the_night(two: TwoHosts) -> SimpleNamespace:
    for settings in (two.root / "reviewq.toml", two.home / "worker.toml"):
        settings.write_text(settings.read_text() + GATEWAY)
    two.start(sweep=False)
    for asked in (
        ["--all-gates", "--reviewer", "fake"],
        ["prose", "--reviewer", "gateway", "--note", str(two.root / "kb/notes/n0.md")],
    ):
        enq = subprocess.run(
            [*two.in_ctl, EXE, "--root", str(two.root), "enqueue", *asked],
            env=two.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert enq.returncode == 0, enq.stderr
    held = [two.agent_started()[0]]  # the first worker's agent runs, held by the test
    dead = f"{two.wlog.wait('worker.started', 1)['worker']}"
    two.worker.send_signal(signal.SIGKILL)
    two.worker.wait(timeout=30)
    two.control.send_signal(signal.SIGINT)  # the control stopped too, cleanly
    two.control.wait(timeout=60)
    two.free_agents()  # the dead worker's agents end with no one to tell
    while True:
        try:
            held.append(int(two._starts.get_nowait().split()[0]))
        except queue.Empty:
            break
    two.agents += held[1:]
    for pid in held:
        await_exit(pid)
    second = two.start_worker()["worker"]  # while no control runs: it runs what waits
    ran = two.wlog.wait("attempt.exited", 60)
    restarted = two.start_control()
    with sqlite3.connect(two.root / ".reviewq/state.db") as db:
        left = [
            j
            for (j,) in db.execute(
                "SELECT id FROM review_jobs WHERE status != 'completed' AND reviewer = 'fake'"
            )
        ]
        failed = db.execute("SELECT 1 FROM attempts WHERE outcome = 'reviewer-failure'").fetchone()
    for job_id in left:
        two.clog.wait("job.finalized", 120, job_id=job_id)
    if failed is None:  # the gateway's first try waited behind the held agents
        two.clog.wait("attempt.reviewer_failed", 60)
    return SimpleNamespace(dead=dead, second=second, ran=ran, restarted=restarted)


@contextlib.contextmanager
def a_night(tmp_path_factory, name: str, notes: int, story: Callable) -> Iterator[tuple]:  # noqa: ANN001
    """A module's night on two hosts: its folders, what ``story`` made of it, and every
    process of it stopped after the module's tests."""
    with namespaces() as hosts:
        two = TwoHosts(tmp_path_factory.mktemp(name), hosts, notes=notes)
        try:
            yield two, story(two)
        finally:
            two.stop()


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    with a_night(tmp_path_factory, "morning", 2, the_night) as made:
        yield made


def rq(two: TwoHosts, *args: str) -> subprocess.CompletedProcess:
    """A morning command on the control's machine."""
    res = subprocess.run(
        [*two.in_ctl, EXE, "--root", str(two.root), *args],
        env=two.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res


def story(two: TwoHosts, job_id: int) -> list[dict]:
    return [
        json.loads(x) for x in rq(two, "logs", "--job", str(job_id), "--json").stdout.splitlines()
    ]


def test_the_story_of_an_attempt_run_while_no_control_ran_says_when_it_ran(night):
    """`logs --job N` stamped attempt.started and attempt.ended with the time the control
    heard them: an attempt that ran on the worker while the control was stopped read as
    started at the control's restart and ended a few ms later, its duration of seconds
    beside them, and no line said when the agent had run (stop 45)."""
    two, n = night
    lines = story(two, n.ran["job_id"])
    (started,) = [
        e for e in lines if e["event"] == "attempt.started" and e["attempt"] == n.ran["attempt"]
    ]
    (ended,) = [
        e for e in lines if e["event"] == "attempt.ended" and e["attempt"] == n.ran["attempt"]
    ]
    back = at(n.restarted["timestamp"])
    # Heard after the restart, run before it: each line says when, on the worker.
    assert at(started["timestamp"]) >= back and at(ended["timestamp"]) >= back
    launched, exited = at(started["launched_at"]), at(ended["exited_at"])
    assert launched <= exited <= at(n.ran["timestamp"]) < back, (started, ended, n.ran)
    assert started["host"] == ended["host"] and started["worker"] == n.second


def test_the_workers_own_log_names_the_dead_workers_attempts_it_took_up(night):
    """A worker started after one SIGKILLed on its host told the control of the dead
    worker's attempts (the control's `attempt.lost`), but its own log said nothing of them
    when their agents had ended before it started: on the worker's machine the night read
    as two starts with nothing between (stop 45)."""
    two, n = night
    lost = sorted(
        [e["job_id"], e["attempt"]]
        for e in (
            json.loads(x)
            for x in rq(two, "logs", "--event", "attempt.lost", "--json").stdout.splitlines()
        )
    )
    assert lost, "the night lost no attempt"
    own = [
        json.loads(x)
        for x in (two.home / "state/logs/reviewq.jsonl").read_text().splitlines()
        if '"worker.reaped_orphans"' in x
    ]
    (line,) = own
    assert sorted(line["attempts"]) == lost and line["died"] == [n.dead], line
    assert line["process_groups"] == []  # nothing was left running to kill


def test_the_report_counts_attempts_lost_when_their_worker_died_as_lost(night):
    """The report's "Attempts by outcome" said "lost (no word from a worker in time) 2"
    of attempts whose worker died and whose successor said so at once, where `job N` says
    "lost" and the reason (S27): the page contradicted the job (stop 45)."""
    two, _ = night
    rq(two, "report")
    page = page_text(two.root / ".reviewq/report.html")
    said = page.split("<h3>Attempts by outcome</h3>", 1)[1].split("</p>", 1)[0]
    assert "lost" in said and "no word from a worker" not in said, said


def test_status_names_the_worker_it_last_heard_from(night):
    """`status` said "workers: 0 agent(s) running; last heard from 2026-…Z (52 s ago)": a
    time, not which worker, so with workers on two machines the one gone quiet was not
    named (stop 45)."""
    two, n = night
    data = json.loads(rq(two, "status", "--json").stdout)["workers"]
    assert data["last_heard_from"] == n.second
    (line,) = [x for x in rq(two, "status").stdout.splitlines() if x.startswith("workers:")]
    # The night goes on (the gateway's profile tries again as each pause runs out): the
    # line, read second, may have heard the same worker since.
    said = re.search(r"; last heard from (\S+) at (\S+)Z \(", line)
    assert said is not None, line
    assert said[1] == n.second and said[2] >= data["last_heard_at"][:19], (line, data)


def test_the_morning_commands_on_the_worker_s_machine_say_it_is_a_worker_s_folder(night):
    """On the worker's machine `status` said "no state.db here; nothing has run with this
    state folder yet (is --state or --root right?)" of the folder a worker had run in all
    night, and `report` "no kb/ folder here (is --root …?)": both sent the operator to
    mend a flag that was right, on the wrong machine (stop 45)."""
    two, _ = night
    for args in (["status"], ["report"], ["job", "1"]):
        res = subprocess.run(
            [*two.in_wrk, EXE, "--config", str(two.home / "worker.toml"),
             "--state", str(two.home / "state"), *args],
            env=two.env, capture_output=True, text=True, timeout=60, cwd=two.home,
        )  # fmt: skip
        assert res.returncode == 1, res
        (line,) = res.stderr.splitlines()
        assert line.startswith(f"error: {two.home / 'state'} is a worker's own folder"), line
        assert "`reviewq control` runs" in line and "doctor --worker" in line, line


def test_doctor_on_the_worker_s_machine_says_the_control_is_of_another_release(night):
    """A worker machine given another reviewq release than the control's (a `pip install`
    of a newer checkout): `doctor --worker` said "ok: a control process feeds this queue"
    and exit 0, and the worker it vouched for refused every message (`message.refused`),
    which only the control's `status` told (stop 45). The release is the messages'
    version, set here as a newer reviewq's would be."""
    two, _ = night
    newer = (
        "import sys; from orchestrator.control import messages; messages.VERSION += 1; "
        "from orchestrator.cli import main; sys.argv[0] = 'reviewq'; main()"
    )
    res = subprocess.run(
        [*two.in_wrk, sys.executable, "-c", newer, "--config", str(two.home / "worker.toml"),
         "--state", str(two.home / "state"), "doctor", "--worker"],
        env=two.env, capture_output=True, text=True, timeout=60, cwd=two.home,
    )  # fmt: skip
    assert res.returncode == 1, res.stdout
    (line,) = [x for x in res.stdout.splitlines() if "sends messages of version" in x]
    assert line.startswith("problem: the control process that feeds this queue (on "), line
    assert "install the control's reviewq release on this machine" in line, line


def test_a_failure_of_the_worker_s_machine_names_that_machine_in_the_control_s_log(night):
    """`logs --level warning`, the morning's read, showed `attempt.reviewer_failed …
    reasons=["unreachable: cannot reach http://127.0.0.1:18045/…"]` with no host: on the
    control's machine it read as the control's own loopback, where the endpoint was the
    worker's (the host was only in the `attempt.ended` line, an info line) (stop 45)."""
    two, _ = night
    lines = [
        json.loads(x)
        for x in rq(two, "logs", "--event", "attempt.reviewer_failed", "--json").stdout.splitlines()
    ]
    assert lines
    for line in lines:
        assert line["host"] and line["worker"].startswith(f"{line['host']}:"), line
        assert "127.0.0.1:9" in line["reasons"][0], line
