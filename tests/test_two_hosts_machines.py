"""Which machine did what, read in the morning (stop 46): redis-server and the control on
one host (``ctl46``), a worker on the other (``wrk46``), each in its own network and UTS
namespace (``tests/test_partitions.py``'s ``TwoHosts``, each process under its own host
name). In the night ``wrk46`` holds more ``fake`` messages than it has agent slots, fails a
``broken`` job three times, and is SIGKILLed while its agent runs; a worker on ``ctl46``
takes up what it left. Then `status`, `logs` and `report` (terminal, ``--json`` and the page in
headless Chromium) are read on the control's machine.

One night for the module; each test reads one thing of it. Needs root (namespaces); it
skips, saying why, where it cannot make them.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from .conftest import page_text
from .test_partitions import FAKE, TwoHosts
from .test_report import browser  # noqa: F401 - the module's headless Chromium
from .test_two_hosts import EXE
from .test_two_hosts_morning import a_night, await_exit, rq

pytestmark = pytest.mark.integration

CTL, WRK = "ctl46", "wrk46"


def named(prefix: list[str], host: str) -> list[str]:
    """``prefix`` (a network namespace's) with a UTS namespace of its own named ``host``:
    two namespaces of one machine otherwise share its name, and every worker id with it."""
    return [*prefix, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host]


def profile(name: str, env: str = "") -> str:
    return (
        f'\n[reviewers.{name}]\nkind = "command"\ncommand = ["{sys.executable}", "{FAKE}"]\n'
        f'partition = "{name}"\ntimeout = "60s"\n' + (f"env = {{ {env} }}\n" if env else "")
    )


def waiting(two: TwoHosts) -> bool:
    """Whether state.db has heard both of the worker's `fake` attempts: one's agent beat
    (running), the other's `waiting` beat (taken, no agent started)."""
    with sqlite3.connect(two.root / ".reviewq/state.db") as db:
        return db.execute(
            "SELECT count(*) FILTER (WHERE outcome = 'running'), count(*) FILTER (WHERE "
            "outcome = 'dispatched' AND taken_at IS NOT NULL AND worker IS NOT NULL) "
            "FROM attempts"
        ).fetchone() == (1, 1)


def jobs_of(two: TwoHosts, reviewer: str) -> list[int]:
    with sqlite3.connect(two.root / ".reviewq/state.db") as db:
        return [
            j for (j,) in db.execute("SELECT id FROM review_jobs WHERE reviewer = ?", (reviewer,))
        ]


def the_night(two: TwoHosts) -> SimpleNamespace:
    two.in_ctl, two.in_wrk = named(two.in_ctl, CTL), named(two.in_wrk, WRK)
    bad = 'FAKE_MODE = "bad"'
    settings = two.root / "reviewq.toml"
    settings.write_text(settings.read_text() + profile("broken", bad))
    # wrk46: one `fake` agent at a time, and three threads: of the note's two `fake` jobs
    # one waits there for the slot, and the third thread runs the `broken` job meanwhile.
    worker = two.home / "worker.toml"
    worker.write_text(
        worker.read_text().replace("concurrency = 2", "concurrency = 1") + profile("broken", bad)
    )
    two.threads = 3
    two.start(sweep=False)
    rq(two, "enqueue", "--all-gates", "--reviewer", "fake")
    held = two.agent_started()[0]
    # No line says a message waits for a slot, nor that an agent beat: their beats set
    # the attempts' worker in state.db, looked for here (bounded) before `status` reads it.
    for _ in range(600):
        if waiting(two):
            break
        time.sleep(0.05)
    else:
        pytest.fail("no worker said it waits for an agent slot")
    before = json.loads(rq(two, "status", "--json").stdout)
    said = rq(two, "status").stdout
    rq(two, "enqueue", "prose", "--reviewer", "broken", "--note", str(two.root / "kb/notes/n0.md"))
    two.clog.wait("job.failed", 60, reviewer="broken")
    # ctl46's worker (the control's settings: `fake` answers at once) takes the rest once
    # wrk46 dies holding its agent and its attempts are lost a lease later.
    two.procs.start(
        [*two.in_ctl, EXE, "--root", str(two.root), "worker", "--workers", "2"],
        env=two.env, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    two.worker.send_signal(signal.SIGKILL)
    two.worker.wait(timeout=30)
    two.free_agents()
    await_exit(held)
    two.clog.wait("attempt.lost", 60)
    for job_id in jobs_of(two, "fake"):
        two.clog.wait("job.finalized", 120, job_id=job_id)
    return SimpleNamespace(before=before, said=said)


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    with a_night(tmp_path_factory, "machines", 1, the_night) as made:
        yield made


def test_status_says_the_jobs_a_worker_holds_waiting_for_an_agent_slot(night):
    """`status` said "jobs: running 2" beside "workers: 1 agent(s) running" while the
    second `fake` message waited on wrk46 for its one agent slot: "running" read as a
    contradiction, and nothing said that a worker held the job (stop 46)."""
    two, n = night
    workers = n.before["workers"]
    assert n.before["jobs"]["running"] >= 2, n.before
    assert (workers["agents_running"], workers.get("agents_waiting")) == (1, 1), workers
    assert workers["waiting_hosts"] == [WRK], workers
    (line,) = [x for x in n.said.splitlines() if x.startswith("workers:")]
    assert line.startswith(
        f"workers: 1 agent(s) running on {WRK}, and 1 job(s) taken by a worker on {WRK} with no "
        "agent started yet (it waits for a free agent slot, or is starting one); last heard"
    ), line


def test_a_job_retried_and_failed_on_a_worker_s_machine_names_that_machine(night):
    """`job.retrying` and `job.failed` named no host, where `attempt.reviewer_failed` does
    (U54): with workers on two machines, which one failed the job was in the info line
    before it alone (stop 46)."""
    two, _ = night
    for event in ("job.retrying", "job.failed"):
        lines = [
            json.loads(x) for x in rq(two, "logs", "--event", event, "--json").stdout.splitlines()
        ]
        assert lines, event
        for line in lines:
            assert line["host"] == WRK and line["worker"].startswith(f"{WRK}:"), line
        assert f"host={WRK}" in rq(two, "logs", "--event", event).stdout


def test_the_report_says_which_machine_ran_failed_and_lost_what(night, browser, tmp_path):  # noqa: F811
    """The report named no machine: on a night served by workers on two hosts, a person
    could not tell which host did what, nor that one's worker died with its attempts
    (stop 46)."""
    two, n = night
    data = json.loads(rq(two, "report", "--json").stdout)["reviewed"]
    machines = {m["host"]: m for m in data.get("machines", [])}
    assert sorted(machines) == [CTL, WRK], data.get("machines")
    ctl, wrk = machines[CTL], machines[WRK]
    assert ctl["attempts"] >= 1 and (ctl["failed"], ctl["lost"], ctl["workers"]) == (0, 0, 1)
    # Its agents: the held `fake` one and the `broken` job's three; lost, the two `fake`
    # attempts it held when it died (one running, one waiting for the slot).
    assert (wrk["attempts"], wrk["failed"], wrk["lost"], wrk["workers"]) == (4, 3, 2, 1), wrk
    # Its last word came before it died, and ctl46 ran its jobs after.
    assert wrk["last_heard_at"] < ctl["last_heard_at"], (wrk, ctl)
    (line,) = [x for x in rq(two, "report").stdout.splitlines() if x.startswith("machines:")]
    assert f"{WRK}: 4 attempt(s) run, 3 failed, 2 lost (1 worker" in line
    page = two.root / ".reviewq/report.html"
    said = page_text(page).split('<h3 id="machines">Machines</h3>', 1)[1].split("</table>")[0]
    assert f"<td>{WRK}</td>" in said and f"<td>{CTL}</td>" in said, said
    for width, mobile in ((1280, False), (390, True)):
        shown = browser.open(page.as_uri(), width=width, height=900, mobile=mobile)
        assert shown.evaluate("document.documentElement.scrollWidth") <= width
        cells = shown.evaluate(
            "[...document.querySelectorAll('#machines + .table td')].map(td => td.innerText)"
        )
        assert cells[:4] == [CTL, str(ctl["attempts"]), "0", "0"], cells
        assert cells[5:9] == [WRK, "4", "3", "2"], cells
        box = shown.evaluate(
            "(t => [t.scrollWidth, t.clientWidth])(document.querySelector('#machines + .table'))"
        )
        top = shown.evaluate("document.getElementById('machines').offsetTop")
        shown.screenshot(tmp_path / f"machines-{width}.png", top, 220)
        assert box[0] <= box[1], (width, box)  # the table fits, not scrolled
