"""The real vendor CLIs on a worker on another host (OPERATIONS §6.6): redis-server and the
control in one network namespace, a worker in another with its own mount namespace in which
the control's KB and state folder are hidden (``tests/test_two_hosts.py``), and on that
worker the pinned Claude Code, Codex CLI and Gemini CLI against the scripted model
(``tests/vendor_model.py``), which listens on the worker's loopback alone. One set-up for
the module: the CLIs are slow to start.

Needs root (namespaces) and the vendor CLIs; it skips, saying why, where it cannot.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from .test_partitions import Events
from .test_two_hosts import EXE, PORT, Procs, namespaces
from .test_vendor_clis import BIN, FIX_NOTE_BODY, VENDORS, Model, _why_not, profiles

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_why_not() is not None, reason=_why_not() or ""),
]


class Site:
    """The control's KB (a note per vendor whose review FAILs, in git), the worker's HOME
    and folder, and the processes of both hosts."""

    def __init__(self, hosts, tmp: Path) -> None:  # noqa: ANN001
        self.ctl, self.wrk, ip = hosts
        url = f"redis://{ip}:{PORT}/0"
        self.hidden = tmp / "hidden"  # the control's: the worker cannot see it
        self.root = root = self.hidden / "site"
        gate = root / "kb/instructions/review-gates/prose/body-check.md"
        gate.parent.mkdir(parents=True)
        gate.write_text(
            "---\ngate_id: prose/body-check\nname: Body check\nlens: prose\nwatches: [body]\n"
            "---\n\n## Failure mode\n\nIt fails.\n\n## Test\n\nCheck it.\n"
        )
        (root / "kb/notes").mkdir()
        for v in (*VENDORS, "absent"):
            (root / f"kb/notes/{v}.md").write_text(
                f"---\ntitle: {v}\ndescription: About {v}.\n---\n\n{FIX_NOTE_BODY}"
            )
        (root / ".gitignore").write_text(".reviewq/\n")
        git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org"]
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", "the KB"], check=True)
        self.model = Model(self.wrk, tmp / "requests.jsonl")
        prof = profiles(self.model, "fix", connect_timeout="4s")
        # A profile whose CLI is installed on the control's machine, not on the worker's.
        absent = prof.split("[reviewers.codex]")[0].split("[reviewers.claude]")[1]
        control_file = prof + "\n[reviewers.absent]" + absent + "\n[fix]\ngit_commit = true\n"
        worker_file = (
            prof
            + "\n[reviewers.absent]"
            + absent.replace(
                f'executable = "{BIN["claude"]}"', 'executable = "/opt/nowhere/claude"'
            )
        )
        (root / "reviewq.toml").write_text(
            control_file.replace("[queue]\n", f'[queue]\nurl = "{url}"\nreaper_seconds = 0.5\n', 1)
        )
        self.far = far = tmp / "remote"
        self.home = far / "home"  # the worker's HOME: the CLIs' own state goes there
        (self.home / ".gemini").mkdir(parents=True)
        (self.home / ".gemini/settings.json").write_text(
            json.dumps(
                {
                    "security": {"auth": {"selectedType": "gemini-api-key"}},
                    "general": {"maxAttempts": 1},
                }
            )
        )
        (self.home / "tmp").mkdir()
        (far / "worker.toml").write_text(
            worker_file.replace("[queue]\n", f'[queue]\nurl = "{url}"\npoll_seconds = 0.05\n', 1)
        )
        self.in_ctl = ["ip", "netns", "exec", self.ctl]
        path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
        base = {"PATH": path, "LANG": "C.UTF-8", "REVIEWQ_LOG_FORMAT": "json"}
        self.cenv = {**base, "HOME": str(tmp / "control-home")}
        wenv = {**base, "HOME": str(self.home), "TMPDIR": str(self.home / "tmp")}
        hide = f'mount -t tmpfs -o size=1m reviewq-hidden "{self.hidden}" && exec "$0" "$@"'
        self.procs = Procs()
        self.procs.start(
            [*self.in_ctl, "redis-server", "--bind", ip, "--port", str(PORT), "--save", "",
             "--appendonly", "no", "--protected-mode", "no"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        control = self.procs.start(
            [*self.in_ctl, EXE, "--root", str(root), "control"],
            env=self.cenv, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        Events(control.stderr).wait("control.started", 60)  # after Redis answered
        worker = self.procs.start(
            ["ip", "netns", "exec", self.wrk, "unshare", "--mount", "--propagation", "private",
             "sh", "-c", hide, EXE, "--config", str(far / "worker.toml"),
             "--state", str(far / "state"), "worker", "--workers", "2"],
            env=wenv, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        Events(worker.stderr).wait("worker.started", 60)

    def reviewq(self, *args: str) -> subprocess.CompletedProcess:
        """A command on the control's host."""
        return subprocess.run(
            [*self.in_ctl, EXE, "--root", str(self.root), *args],
            env=self.cenv, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    def sweep(self, reviewer: str, note: str) -> dict:
        res = self.reviewq(
            "sweep", "--reviewer", reviewer, "--note", note, "--all-gates", "--fix",
            "--workers", "0", "--json",
        )  # fmt: skip
        assert res.stdout.startswith("{"), res.stdout + res.stderr
        return json.loads(res.stdout)

    def stop(self) -> None:
        self.procs.stop_all()
        self.model.stop()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with namespaces() as hosts:
        s = Site(hosts, tmp_path_factory.mktemp("two-hosts-vendor"))
        try:
            yield s
        finally:
            s.stop()


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_review_and_a_fix_by_the_real_cli_on_another_host_leave_its_home_as_they_found_it(
    site, vendor
):
    """FAIL, the fix, its re-review PASS, all three run by the CLI on the worker's host.
    Without --kb each ran in an attempt folder of its own, and the CLI kept state for that
    folder in the worker's HOME (Claude a projects/ folder, Gemini a tmp/ and a history/
    folder) that nothing removed: a folder an attempt, for as long as the worker runs."""
    out = site.sweep(vendor, f"kb/notes/{vendor}.md")
    assert out["failed"] == [] and out["escalations"] == [], out
    assert out["decisions"] == {"FAIL": 1, "PASS": 1} and out["attempts"] == {"finalized": 3}
    assert (site.root / f"kb/notes/{vendor}.md").read_text().endswith("Alpha body. done\n")
    # The job folders on the control have what a local worker leaves there.
    jobs = site.root / ".reviewq/jobs"
    review, fix, again = sorted(
        (p for p in jobs.iterdir() if f"kb/notes/{vendor}.md" in (p / "MANIFEST.json").read_text()),
        key=lambda p: int(p.name.rsplit("-", 1)[1]),
    )
    logs = ["attempt-1/stderr.log", "attempt-1/stdout.log"]
    result = f"results/kb__notes__{vendor}.md--prose__body-check.md"
    for job in (review, again):  # a first review attempt's prompt is the job's (N26)
        assert files(job) == sorted(
            ["MANIFEST.json", "attempt-1", "attempt-1/bundle-output.md", *logs, "prompt.md",
             "results", result]
        ), job  # fmt: skip
    assert files(fix) == sorted(
        ["MANIFEST.json", "attempt-1", "attempt-1/fixed-note.md", "attempt-1/prompt.md", *logs]
    )
    # Nothing of the attempts is left on the worker's host but the CLIs' sessions.
    assert files(site.far / "state/attempts") == []
    assert [p.name for p in (site.home / "tmp").iterdir() if p.name.startswith("reviewq-job")] == []
    kept = {
        "claude": site.home / ".claude/projects",
        "gemini": site.home / ".gemini/tmp",
    }.get(vendor)
    if kept is not None and kept.is_dir():  # Claude keeps no session at all (S37)
        attempts = [p.name for p in kept.iterdir() if "attempts" in p.name or "job-" in p.name]
        assert attempts == [], f"{vendor} kept a folder per attempt in {kept}: {attempts}"
    if vendor == "gemini":
        assert [p.name for p in (site.home / ".gemini/history").iterdir()] == []
    if vendor == "gemini":  # projects.json's entry for each attempt folder, for good
        registry = json.loads((site.home / ".gemini/projects.json").read_text())
        named = [p for p in registry["projects"] if "attempts" in p]
        assert named == [], f"gemini kept an entry an attempt in projects.json: {named}"
    if vendor == "codex":  # a rollout a run, the prompt and notes in each, whatever its cwd
        rollouts = [p.name for p in (site.home / ".codex").rglob("rollout-*.jsonl")]
        assert rollouts == [], f"codex kept a session a run: {rollouts}"
        # ... and rows of each run's thread in its SQLite files: the thread, its turns and
        # items (the prompt and every reply again), its log lines.
        assert codex_rows(site.home / ".codex") == {}, "codex kept rows of each run"


def codex_rows(home: Path) -> dict[str, int]:
    """The rows of any thread in Codex's SQLite files, counted by database and table."""
    found = {}
    for db in sorted(home.glob("*.sqlite")):
        with contextlib.closing(sqlite3.connect(db)) as conn:
            for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
                cols = {r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')}
                if "thread_id" in cols or table == "threads":
                    n = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]  # noqa: S608
                    if n:
                        found[f"{db.name}:{table}"] = n
    return found


def test_a_cli_missing_on_the_worker_s_host_is_named_with_that_host(site):
    """The worker's file names a program its host does not have: the attempt is a launch
    failure, never a verdict, and the profile pauses. `job N` on the control named no
    machine for the attempt (its worker is recorded from heartbeats, and an agent that
    never started beats none): with workers on several machines, not the one to mend."""
    out = site.sweep("absent", "kb/notes/absent.md")
    assert (
        out["failed"] == [] and out["decisions"] == {} and out["attempts"] == {"launch-failure": 1}
    ), out
    with sqlite3.connect(site.root / ".reviewq/state.db") as conn:
        [(job_id,)] = conn.execute("SELECT id FROM review_jobs WHERE reviewer = 'absent'")
    said = site.reviewq("job", str(job_id)).stdout
    assert "attempt 1: the agent did not start" in said, said
    assert "could not start '/opt/nowhere/claude'" in said, said
    host = os.uname().nodename
    [line] = [x for x in said.splitlines() if x.startswith("  attempt 1:")]
    assert f" on {host}:" in line, said
    status = site.reviewq("status").stdout
    assert f"its agent failed to start on {host}" in status, status
