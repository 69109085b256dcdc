"""What an operator runs on the two hosts of ``tests/test_two_hosts.py`` (redis-server and
the control in one network namespace, the worker in another) beyond a sweep: the checks of
OPERATIONS §6.6 on each machine, as a second-machine walkthrough found them.

Needs root (network namespaces); it skips, saying why, where it cannot make them.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from .test_partitions import Events, TwoHosts
from .test_two_hosts import EXE, hosts
from .test_vendor_clis import Model

__all__ = ["hosts"]  # the fixture, used by name

pytestmark = pytest.mark.integration


def test_the_controls_doctor_passes_where_only_remote_workers_run_the_agents(hosts, tmp_path):
    """§6.6 step 4: start the control and the workers, `reviewq doctor` says the queue
    answers. It said so, and `problem:` of every reviewer whose CLI is installed only on
    the worker machines and of an `openai` endpoint reachable only from their network,
    exit 1, for good: the control's health check never passed where the agents run
    elsewhere, and a real problem read like the rest."""
    two = TwoHosts(tmp_path, hosts)
    model = Model(two.wrk, tmp_path / "requests.jsonl")  # reachable from the worker's side only
    remote_only = tmp_path / "remote" / "bin" / "remote-agent"  # on the worker's PATH alone
    profiles = (
        f'\n[reviewers.local]\nkind = "openai"\nmodel = "m"\nbase_url = "{model.url("review")}/v1"\n'
        'partition = "fake"\n\n'
        f'[reviewers.far]\nkind = "command"\ncommand = ["{remote_only.name}"]\npartition = "fake"\n'
    )
    with (two.root / "reviewq.toml").open("a") as f:
        f.write(profiles)
    with (two.home / "worker.toml").open("a") as f:
        f.write(profiles)
    remote_only.parent.mkdir(parents=True)
    remote_only.write_text("#!/bin/sh\n")
    remote_only.chmod(0o755)
    try:
        two.start_redis()
        control = subprocess.run(
            [*two.in_ctl, EXE, "--root", str(two.root), "doctor"],
            env=two.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        worker = subprocess.run(
            [*two.in_wrk, EXE, "--config", str(two.home / "worker.toml"),
             "--state", str(two.home / "state"), "doctor", "--worker"],
            env={**two.env, "PATH": f"{remote_only.parent}:{two.env['PATH']}"},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        two.procs.stop_all()
        model.stop()
    assert control.returncode == 0, control.stdout + control.stderr
    lines = control.stdout.splitlines()
    assert "ok: queue backend Redis answers" in lines
    for head in (
        "reviewer local (openai): cannot reach",
        "reviewer far (command): remote-agent not on PATH",
    ):
        (line,) = [x for x in lines if head in x]
        assert line.startswith("warning: ") and "doctor --worker" in line, line
    # On the worker's machine the same profiles are the problems they would be there.
    assert f"ok: reviewer local (openai): base_url {model.url('review')}/v1 answers" in (
        worker.stdout.splitlines()
    ), worker.stdout
    assert "ok: reviewer far (command)" in worker.stdout.splitlines(), worker.stdout


def test_a_second_kb_on_another_host_given_one_redis_database_is_refused_at_start(hosts, tmp_path):
    """Two KBs, one on each host, their reviewq.toml giving one Redis database by mistake:
    both controls ran, each taking the other's ticks and outcomes, and said `queue.shared`
    only a tick later (S12 put it in `status`). The second control is refused at its
    start, in one line naming the first's state folder, before it reads the queue; the
    first's operator has nothing to be told: nothing was shared."""
    two = TwoHosts(tmp_path, hosts)
    other = tmp_path / "other-site"  # the second KB, on the second host
    shutil.copytree(two.root / "kb", other / "kb")
    shutil.copy(two.root / "reviewq.toml", other / "reviewq.toml")
    try:
        two.start_redis()
        proc = two.procs.start(
            [*two.in_ctl, EXE, "--root", str(two.root), "control"],
            env=two.env, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        Events(proc.stderr).wait("control.started", 60)
        second, status = (
            subprocess.run(
                [*where, EXE, "--root", str(root), *args],
                env=two.env,
                capture_output=True,
                text=True,
                timeout=60,
            )  # fmt: skip
            for where, root, args in (
                (two.in_wrk, other, ["control"]),
                (two.in_ctl, two.root, ["status"]),
            )
        )
    finally:
        two.procs.stop_all()
    assert second.returncode == 1, second.stderr
    (line,) = second.stderr.splitlines()
    assert f"pid {proc.pid}, state folder {two.root / '.reviewq'}" in line, line
    assert "its own database" in line, line
    assert status.returncode == 0, status.stderr
    assert "queue shared" not in status.stdout, status.stdout
