"""The limits a machine sets, met for real (stop 38): a low RLIMIT_NOFILE on a sweep's
control and worker (prlimit), a pids cgroup that fails an agent's launch with EAGAIN, a
memory cgroup whose out-of-memory killer ends an agent. Real parts: a sweep's control and
worker (real Huey consumers on a real SQLite file), agents as real subprocesses. A test
that needs what this machine cannot give (prlimit, a writable cgroup) skips saying so."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .test_queue_integration import FAST_QUEUE, fake_profile, small_kb

pytestmark = pytest.mark.integration


def _lines(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def test_a_control_out_of_open_files_names_the_limit_not_a_database_it_cannot_open(kb):
    """Under `prlimit --nofile=20` the sweep's control could not open its queue's SQLite
    file: it said "unable to open database file" every few seconds for as long as it ran
    (SQLite's words for EMFILE), sending the operator to the file and its permissions
    instead of to the limit of open files."""
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is not installed")
    small_kb(kb, notes=2)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    exe = Path(sys.executable).parent / "reviewq"
    proc = subprocess.Popen(
        ["prlimit", "--nofile=20:20", "--", str(exe), "--root", str(kb.root), "sweep"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    log = kb.state / "logs" / "reviewq.jsonl"
    try:
        said = []
        deadline = time.monotonic() + 15
        while not said and time.monotonic() < deadline and proc.poll() is None:
            said = [e for e in _lines(log) if e["event"] == "queue.unavailable"]
            time.sleep(0.1)  # the log has no event to await; bounded by the deadline
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if not said:
        pytest.skip("the control did not run out of descriptors at 20 here")
    assert "RLIMIT_NOFILE" in said[0]["error"] and "20" in said[0]["error"], said[0]
    retried = [e for e in _lines(log) if e["event"] == "queue.retrying"]
    assert all("RLIMIT_NOFILE" in e["error"] for e in retried), retried
