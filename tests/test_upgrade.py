"""A release installed over a state folder, a queue and processes left by an earlier one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


def test_a_worker_stops_the_agents_a_dead_worker_of_an_earlier_release_left(tmp_path, monkeypatch):
    """Before messages were versioned, workers shared the control's state folder and
    registered their agents in its run/agents/. A worker of that release SIGKILLed before
    the upgrade left its agents running (a fixer among them writes its note in the KB):
    the new worker reaped only its own folder's registry (STATE/worker/run/agents), and
    the old agents ran on, unwatched, beside the attempts the reaper dispatched again."""
    from orchestrator.config import load_settings
    from workers import attempt, consumers

    settings = load_settings(tmp_path)
    state = settings.state_dir
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    agent = subprocess.Popen(
        ["sleep", "120"], env={**os.environ, "REVIEWQ_JOB_ID": "50"}, start_new_session=True
    )
    try:
        registry = state / "run" / "agents"  # where that release's workers wrote it
        registry.mkdir(parents=True)
        entry = {"worker_pid": dead.pid, "pgid": agent.pid, "job_id": 50, "attempt": 1}
        (registry / f"{socket.gethostname()}-{agent.pid}.json").write_text(json.dumps(entry))

        class _Stopped:  # the consumer, stopped at once (and not for a SIGHUP)
            restart_asked = False

            def __init__(self, *args: object, **kwargs: object) -> None:
                pass

            def take_signals(self) -> None:
                pass

            def run(self) -> None:
                pass

        monkeypatch.setattr(consumers, "QueueConsumer", _Stopped)
        consumers.run_worker(settings, 1)
        assert agent.wait(timeout=10) is not None
        assert not list(registry.iterdir())
    finally:
        # The worker's stop holds this process's agents back for good: the later tests'
        # run_attempt started none ("not started: the worker is stopping").
        attempt.STOPPING.clear()
        if agent.poll() is None:
            agent.kill()
            agent.wait(timeout=10)


def old_state(state: Path, upto: int) -> sqlite3.Connection:
    """A state.db as a release whose newest migration was ``upto`` left it."""
    from orchestrator.state.migrations import MIGRATIONS

    state.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(state / "state.db")
    conn.execute(
        "CREATE TABLE schema_migrations "
        "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    for version, name, sql in MIGRATIONS[:upto]:
        conn.executescript(sql)
        conn.execute(
            "INSERT INTO schema_migrations VALUES (?, ?, '2026-11-23T00:00:00Z')", (version, name)
        )
    conn.commit()
    return conn


def test_an_escalation_raised_before_migration_8_keeps_its_material_when_written_again(tmp_path):
    """Before migration 8 an escalation's report file was the only record of what it
    recommended and quoted. Written again from state.db (a decision, rewrite-files, the
    reports migration 15 marks due), its Material came out empty and its recommendation
    was the bare reason: a person deciding after the upgrade lost the findings."""
    from orchestrator.cycles.escalations import report
    from orchestrator.state.store import Store

    note, gate, t = "kb/notes/a.md", "prose/body-check", "2026-11-23T10:00:0"
    rationale = "Summary: thin.\nFindings:\n- high: the body region is empty.\n## Result: FAIL"
    conn = old_state(tmp_path / "state", 7)
    conn.executescript(
        f"""
        INSERT INTO snapshots VALUES (1, '{note}', 'a', 'text', '{t}0Z');
        INSERT INTO snapshots VALUES (2, 'kb/g.md', 'b', 'gate', '{t}0Z');
        INSERT INTO review_jobs (id, kind, status, model_partition, grouping, job_dir,
            created_at, updated_at) VALUES
            (10, 'review', 'completed', 'offline', 'note', 'jobs/review-job-10', '{t}1Z', '{t}1Z'),
            (44, 'fix', 'completed', 'offline', 'fix', 'jobs/review-job-44', '{t}2Z', '{t}2Z'),
            (47, 'fix', 'completed', 'offline', 'fix', 'jobs/review-job-47', '{t}3Z', '{t}3Z');
        INSERT INTO review_pairs (job_id, note_path, gate_id, gate_path, lens,
            note_snapshot_id, gate_snapshot_id, decision, rationale) VALUES
            (10, '{note}', '{gate}', 'kb/g.md', 'prose', 1, 2, 'FAIL', '{rationale}'),
            (44, '{note}', '{gate}', 'kb/g.md', 'prose', 1, 2, NULL, '{rationale}'),
            (47, '{note}', '{gate}', 'kb/g.md', 'prose', 1, 2, NULL, '{rationale}');
        INSERT INTO cycle_events (model_partition, note_path, gate_id, rejection, kind,
            job_id, gist, at) VALUES
            ('offline', '{note}', '{gate}', 1, 'review-fail', 10, 'high: the body region is empty.', '{t}1Z'),
            ('offline', '{note}', '{gate}', 2, 'fix-unchanged', 44, 'the fix changed nothing', '{t}2Z'),
            ('offline', '{note}', '{gate}', 3, 'fix-unchanged', 47, 'the fix changed nothing', '{t}3Z');
        INSERT INTO escalations (id, model_partition, note_path, gate_id, reason, cycles,
            reviewer, fixer, report_path, raised_at) VALUES
            (1, 'offline', '{note}', '{gate}', '3 consecutive rejections (the last fix changed nothing)',
             3, 'offline', 'offline', 'escalations/escalation-1.md', '{t}4Z'),
            (2, 'offline', 'kb/notes/b.md', '{gate}', 'the reviewer failed every attempt: no output',
             0, 'offline', 'offline', 'escalations/escalation-2.md', '{t}5Z');
        """
    )
    conn.commit()
    conn.close()
    with Store.open(tmp_path / "state") as store:
        first, second = report(store, 1).splitlines(), report(store, 2).splitlines()
    assert first[1] == (
        "Recommend reject: high: the body region is empty; the fixer's last attempt changed "
        "nothing."
    )
    assert first[first.index("Material:") + 1] == "- high: the body region is empty."
    assert second[1] == "Recommend redo: the reviewer failed every attempt: no output."
    assert second[second.index("Material:") + 1] == (
        "- the reviewer failed every attempt: no output"
    )


def test_escalations_shows_the_call_a_migration_gave_before_the_report_is_written(kb, run_cli):
    """Migration 15 changed the call of a fixer's failure from reject to redo and marked
    its report due; the control process writes it at its next tick. Until then
    `reviewq escalations` read the old file and said "Recommend reject", while the
    morning report, from state.db, said to run decide N redo."""
    conn = old_state(kb.state, 14)
    conn.executescript(
        """
        INSERT INTO escalations (id, model_partition, note_path, gate_id, reason, cycles,
            reviewer, fixer, report_path, raised_at, material, recommend) VALUES
            (1, 'offline', 'kb/notes/a.md', 'prose/body-check',
             'the fixer failed every attempt: no output', 0, 'offline', 'offline',
             'escalations/escalation-1.md', '2026-11-23T10:00:00Z',
             '["the fixer failed every attempt: no output"]', 'no output');
        """
    )
    conn.commit()
    conn.close()
    (kb.state / "escalations").mkdir()
    (kb.state / "escalations" / "escalation-1.md").write_text(
        "Gate review: kb/notes/a.md — prose/body-check\nRecommend reject: no output.\n"
    )
    res = run_cli("escalations")
    assert res.exit_code == 0, res.stderr
    assert "      Recommend redo: no output." in res.stdout.splitlines(), res.stdout
    # and its path is not given as if the file said so already
    assert "escalation-1.md (to be written at the control process's next tick)" in res.stdout


def test_the_line_refusing_an_older_releases_outcome_reads_as_a_sentence():
    """The control process started over a queue an older worker had filled logs one
    line per message; of each outcome it said "a outcome message of version 2"."""
    from orchestrator.control.messages import refusal

    assert refusal("outcome", {"v": 2, "job_id": 5, "attempt": 1})["reason"].startswith(
        "an outcome message of version 2, this reviewq speaks 4: "
    )
    assert refusal("heartbeat", {"v": 2})["reason"].startswith("a heartbeat message of version 2")


def test_escalations_made_again_by_migration_19_keep_their_rows_and_due_reports(tmp_path):
    """Migration 19 makes the escalations table again (a CHECK cannot change in place):
    every row, and every report waiting to be written, comes through it."""
    from orchestrator.state.store import Store

    conn = old_state(tmp_path / "state", 18)
    conn.executescript(
        """
        INSERT INTO escalations (id, model_partition, note_path, gate_id, reason, cycles,
            report_path, raised_at, material, recommend, call, job_id) VALUES
            (3, 'offline', 'kb/notes/a.md', 'prose/g', '3 consecutive rejections', 3,
             'escalations/escalation-3.md', '2026-11-23T10:00:00Z', '["m"]', 'r', 'reject', 9),
            (4, 'offline', 'kb/notes/b.md', 'prose/g', 'the reviewer failed every attempt: x', 0,
             'escalations/escalation-4.md', '2026-11-23T10:00:01Z', '[]', 'r', 'redo', NULL);
        INSERT INTO escalation_reports_due VALUES (4, '2026-11-23T10:00:01Z', 'disk full');
        """
    )
    conn.commit()
    conn.close()
    with Store.open(tmp_path / "state") as store:
        rows = [tuple(r) for r in store.conn.execute("SELECT id, call, job_id FROM escalations")]
        due = [tuple(r) for r in store.conn.execute("SELECT * FROM escalation_reports_due")]
        with store.write():
            store.conn.execute("UPDATE escalations SET decision = 'superseded' WHERE id = 3")
        assert store.conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert rows == [(3, "reject", 9), (4, "redo", None)]
    assert due == [(4, "2026-11-23T10:00:01Z", "disk full")]


@contextlib.contextmanager
def an_earlier_control(state: Path) -> Iterator[subprocess.Popen]:
    """A control process of the earlier release on ``state``, as far as its lock shows
    it: control.lock held, its pid written in it, until the block ends."""
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
         "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode()); "
         "print('held', flush=True); sys.stdin.read()",
         str(state / "control.lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.communicate("", timeout=10)


def test_a_control_of_the_earlier_release_still_running_keeps_its_state_db_unmigrated(kb, run_cli):
    """An upgrade installed while the control process of the earlier release still ran
    (pip install over it, then `reviewq status` to look): the first command of the new
    release migrated state.db under that control, which went on writing rows without what
    the new schema keeps beside them; a new control started then migrated it too, and
    only after that refused to run beside the old one."""
    old_state(kb.state, 8).close()
    with an_earlier_control(kb.state) as holder:
        res = run_cli("status")
        assert res.exit_code == 1
        (line,) = res.stderr.splitlines()
        assert "schema version 8 is older than this reviewq's" in line
        assert f"the control process (pid {holder.pid}) of the release that made it" in line
        assert "stop it (systemctl stop reviewq-control)" in line
        with sqlite3.connect(kb.state / "state.db") as conn:
            assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (8,)
    assert run_cli("status").exit_code == 0  # stopped, the next command migrates
    with sqlite3.connect(kb.state / "state.db") as conn:
        from orchestrator.state.migrations import LATEST

        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (LATEST,)


def test_a_command_that_read_the_old_schema_as_a_new_control_migrated_it_is_not_refused(
    kb, run_cli, monkeypatch
):
    """E1 reads the schema's version, then looks at control.lock. A control of this release
    started in between (it migrates state.db, then takes the lock): the command found its
    lock and refused, naming it "the control process of the release that made it", with
    state.db already migrated and no older control anywhere."""
    import signal
    import sys

    from orchestrator.state import store

    old_state(kb.state, 8).close()
    exe = str(Path(sys.executable).parent / "reviewq")
    started: list[subprocess.Popen] = []
    look = store.control_pid

    def a_control_starts_first(state_dir: Path) -> int | None:
        if not started:
            started.append(
                subprocess.Popen(
                    [exe, "--root", str(kb.root), "control"], stderr=subprocess.PIPE, text=True
                )
            )
            for line in started[0].stderr:  # logged once it holds control.lock
                if "control.started" in line:
                    break
        return look(state_dir)

    monkeypatch.setattr(store, "control_pid", a_control_starts_first)
    try:
        res = run_cli("jobs")
    finally:
        for control in started:
            control.send_signal(signal.SIGINT)
            control.communicate(timeout=30)
    assert res.exit_code == 0, res.stderr
    assert started  # the control did start in between


def test_a_control_lock_this_user_cannot_write_or_read_is_no_internal_error(kb, run_cli):
    """E1 made every command on an older state.db open control.lock for writing: one
    another user left (a control once run as root) made each of them an "internal error:
    PermissionError … (please report it)", and one that cannot be read at all (here a
    folder by that name) the same with IsADirectoryError."""
    import shutil

    old_state(kb.state, 8).close()
    lock = kb.state / "control.lock"
    lock.write_text("4242")  # a pid of a control long gone
    # Unwritable even for root (the tests' user): the immutable attribute.
    if not shutil.which("chattr") or subprocess.run(["chattr", "+i", lock]).returncode:
        import pytest

        pytest.skip("chattr +i is not available here")
    try:
        res = run_cli("jobs")
    finally:
        subprocess.run(["chattr", "-i", lock], check=True)
    assert res.exit_code == 0, res.stderr  # read only, the lock still says none holds it
    with sqlite3.connect(kb.state / "state.db") as conn:
        from orchestrator.state.migrations import LATEST

        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (LATEST,)

    old_state(kb.root / "other", 8).close()
    (kb.root / "other" / "control.lock").mkdir()
    res = run_cli("--state", str(kb.root / "other"), "jobs")
    assert res.exit_code == 1
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: {kb.root / 'other' / 'control.lock'}: cannot be read to learn")
    assert "(Is a directory)" in line and "nothing was changed" in line


def test_two_commands_on_an_older_state_db_do_not_take_each_others_look_for_a_control(
    kb, run_cli, monkeypatch
):
    """E1 looks for a control by taking control.lock for a moment, as `status` does. A
    second command on the older state.db (the E read's `control`, `status` and `doctor`
    started at once) looking in that moment found the lock held and refused, naming
    "the control process (pid N)" from the pid a control long gone left in the file."""
    import fcntl

    from orchestrator.state import store

    old_state(kb.state, 8).close()
    (kb.state / "control.lock").write_text("4242")
    probe = os.open(kb.state / "control.lock", os.O_RDWR)
    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the other command's look
    look = store.control_pid

    def its_look_ends_after_this_one(state_dir: Path) -> int | None:
        try:
            return look(state_dir)
        finally:
            with contextlib.suppress(OSError):  # closed already
                os.close(probe)

    monkeypatch.setattr(store, "control_pid", its_look_ends_after_this_one)
    res = run_cli("jobs")
    assert res.exit_code == 0, res.stderr


def test_a_control_of_the_earlier_release_started_during_the_migration_keeps_it_undone(
    kb, run_cli, monkeypatch
):
    """E1 looks for a control before it migrates. One of the earlier release started
    while the migration ran (its schema read before the new one committed, its lock
    taken after E1's look) had state.db migrated beneath it all the same, the very thing
    E1 refuses; a migration of a large state.db takes seconds."""
    from orchestrator.state import store

    old_state(kb.state, 8).close()
    earlier: list[subprocess.Popen] = []
    statements = store._statements

    def a_control_starts_meanwhile(sql: str) -> list[str]:
        if not earlier:
            earlier.append(stack.enter_context(an_earlier_control(kb.state)))
        return statements(sql)

    monkeypatch.setattr(store, "_statements", a_control_starts_meanwhile)
    with contextlib.ExitStack() as stack:
        res = run_cli("jobs")
        assert earlier
        with sqlite3.connect(kb.state / "state.db") as conn:
            assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (8,)
    assert res.exit_code == 1
    (line,) = res.stderr.splitlines()
    assert f"the control process (pid {earlier[0].pid}) of the release that made it" in line


def test_a_state_db_of_release_24_keeps_of_its_cron_runs_of_nothing_the_last_alone(kb, run_cli):
    """A release before N23 kept a `sweep_runs` row a minute of a `* * * * *` entry that
    enqueued nothing: migrated, those go at once, and what reads the runs finds the same
    (the last run of each sweep, those with jobs, those that took jobs over, a person's)."""
    conn = old_state(kb.state, 24)
    runs = [  # (id, name, trigger, jobs)
        (1, "often", "cron", 2), (2, "often", "cron", 0), (3, "often", "cron", 0),
        (4, "often", "enqueue", 0), (5, "often", "cron", 0), (6, "often", "cron", 0),
        (7, "nightly", "cron", 0), (8, "nightly", "cron", 0), (9, "often", "cron", 0),
    ]  # fmt: skip
    conn.executemany(
        "INSERT INTO sweep_runs (id, name, trigger, options, started_at, jobs) "
        "VALUES (?, ?, ?, '{}', '2026-11-26T03:00:00.000Z', ?)",
        runs,
    )
    conn.execute(  # run 5 took a spent run's job over
        "INSERT INTO review_jobs (id, status, model_partition, grouping, reviewer, job_dir, "
        "created_at, updated_at, sweep_run_id) VALUES (1, 'queued', 'm', 'note', 'r', "
        "'jobs/review-job-1', '2026-11-26T03:00:00.000Z', '2026-11-26T03:00:00.000Z', 5)"
    )
    conn.commit()
    conn.close()
    assert run_cli("status", "--json").exit_code == 0
    with contextlib.closing(sqlite3.connect(kb.state / "state.db")) as conn:
        kept = [r[0] for r in conn.execute("SELECT id FROM sweep_runs ORDER BY id")]
    assert kept == [1, 4, 5, 8, 9]


# A reviewq command whose process SIGKILLs itself once migration 23 has run its first N
# statements (its transaction open, its indexes half made or all made and not yet
# recorded), argv[1] the KB root.
_KILLED_MID_MIGRATION = """
import os, signal, sys
from orchestrator.state import store
from orchestrator.cli import main

statements, upto = store._statements, int(sys.argv[2])

def until_killed(sql):
    out = statements(sql)
    if "attempts_started" not in sql:
        return out
    def run():
        yield from out[:upto]
        os.kill(os.getpid(), signal.SIGKILL)
    return run()

store._statements = until_killed
sys.argv = ["reviewq", "--root", sys.argv[1], "status"]
main()
"""


def _a_night_at_schema_22(state: Path) -> tuple[int, float]:
    """A state.db as release 22 left it, with a night of 300 jobs and 900 attempts
    (started, heard from and recorded over the night, one that did not start last);
    returns the attempts and their cost."""
    conn = old_state(state, 22)
    jobs, attempts = [], []
    for j in range(1, 301):
        at = f"2026-11-26T0{j // 100}:{j % 60:02d}:00.000Z"
        jobs.append((j, f"jobs/review-job-{j}", at, at, at))
        for a in (1, 2, 3):
            outcome = "launch-failure" if (j, a) == (300, 3) else "finalized"
            attempts.append((j, a, outcome, "vm:1", at, at, at, at, 0.01 * a))
    conn.executemany(
        "INSERT INTO review_jobs (id, status, model_partition, grouping, reviewer, job_dir, "
        "created_at, updated_at, finished_at) VALUES (?, 'completed', 'm', 'note', 'r', ?, ?, ?, ?)",
        jobs,
    )
    conn.executemany(
        "INSERT INTO attempts (job_id, attempt, outcome, worker, started_at, ended_at, "
        "heartbeat_at, recorded_at, cost_usd) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        attempts,
    )
    conn.execute("PRAGMA journal_mode = WAL")  # as reviewq keeps it
    conn.commit()
    conn.close()
    return len(attempts), round(sum(a[-1] for a in attempts), 6)


def test_a_state_db_of_release_22_killed_mid_migration_keeps_22_and_migrates_next_time(kb, run_cli):
    """Migration 23 (the indexes a year of attempts needs) on a state.db with a night in
    it, SIGKILLed after its first, fourth and last index: each time state.db is release
    22's, whole, without one of the new indexes; the next command migrates it and reads
    the night as release 22 recorded it."""
    import signal
    import sys

    from orchestrator.state.migrations import LATEST, MIGRATIONS

    count, cost = _a_night_at_schema_22(kb.state)
    new = {"attempts_started", "attempts_ended", "attempts_recorded", "attempts_heartbeat",
           "attempts_launch_failures", "review_jobs_created", "review_jobs_finished",
           "review_jobs_updated", "review_jobs_source", "review_jobs_parent"}  # fmt: skip
    assert MIGRATIONS[22][0] == 23
    for upto in (1, 4, len(new)):
        killed = subprocess.run(
            [sys.executable, "-c", _KILLED_MID_MIGRATION, str(kb.root), str(upto)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        with contextlib.closing(sqlite3.connect(kb.state / "state.db")) as conn:
            assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (22,)
            indexes = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
            }
            assert not indexes & new
            assert conn.execute("SELECT count(*) FROM attempts").fetchone() == (count,)
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    res = run_cli("status", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["cost_usd"]["total"] == cost
    assert data["workers"]["last_launch_failure"] == {"job_id": 300, "attempt": 3, "reasons": []}
    assert data["jobs"]["completed"] == 300
    with contextlib.closing(sqlite3.connect(kb.state / "state.db")) as conn:
        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (LATEST,)
        indexes = {
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")
        }
        assert new <= indexes


# Today's reviewq speaking message version 3, as the release before the reap notice did:
# its heartbeats, outcomes and refusal notices are that release's (only the reap notice,
# which it never sends, is new in 4).
_RELEASE_3 = """import sys
from orchestrator.control import messages
messages.VERSION = 3
from orchestrator.cli import main
sys.exit(main())
"""


def release_3(kb, *args: str, **kw) -> subprocess.Popen:
    """A process of the release of message version 3 on the KB, its log on stderr."""
    return subprocess.Popen(
        [sys.executable, "-c", _RELEASE_3, "--root", str(kb.root), *args],
        stderr=subprocess.PIPE,
        **kw,
    )


def test_the_controls_line_names_an_earlier_workers_refusal_notice_as_one(kb, run_cli):
    """A worker of the earlier release on today's control's queue refuses each review
    message and tells the control, which refuses the notice in turn: its line and
    `status` called the notice "an outcome message of version 3", as if an agent had run
    and its review been thrown away."""
    from tests.test_queue_integration import FAST_QUEUE, _until, fake_profile, rq, small_kb

    small_kb(kb, notes=1)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    assert rq(kb, "enqueue", "--reviewer", "fake", "frontmatter").returncode == 0
    exe = str(Path(sys.executable).parent / "reviewq")
    control = subprocess.Popen([exe, "--root", str(kb.root), "control"], stderr=subprocess.PIPE)
    worker = release_3(kb, "worker", stdout=subprocess.DEVNULL)
    try:
        assert _until(control.stderr, "message.refused") == "message.refused"
    finally:
        for proc in (worker, control):
            proc.terminate()
            proc.communicate(timeout=60)
    line = next(
        json.loads(x)
        for x in (kb.state / "logs" / "reviewq.jsonl").read_text().splitlines()
        if '"message.refused"' in x
    )
    assert line["message"] == "refusal notice" and line["refused_version"] == 4
    assert line["reason"].startswith("a refusal notice message of version 3, this reviewq speaks 4")
    assert "a refusal notice message of version 3" in run_cli("status").stdout


def test_a_drained_workers_last_outcome_an_upgrade_left_on_the_queue_is_kept(kb, tmp_path):
    """An upgrade by the book, the worker drained (its agent ended and its outcome was
    sent), then the control stopped before it took that outcome: the new control refused
    the outcome of version 3 ("run the same reviewq release"), though version 4 only
    added the reap notice, and the reaper ran the agent again a lease later: every
    attempt ending as the old release stopped was paid twice."""
    from tests.test_queue_integration import (
        FAST_QUEUE,
        _until,
        await_fifo,
        fake_profile,
        make_fifo,
        rq,
        small_kb,
    )

    small_kb(kb, notes=1)
    started, go, runs = make_fifo(tmp_path, "started"), make_fifo(tmp_path, "go"), tmp_path / "runs"
    env = f'env = {{ FAKE_NOTIFY_FIFO = "{started}", FAKE_CONTINUE_FIFO = "{go}", FAKE_LOG = "{runs}" }}'
    kb.write("reviewq.toml", fake_profile(extra=env) + FAST_QUEUE)
    assert rq(kb, "enqueue", "--reviewer", "fake", "prose").returncode == 0
    old_control = release_3(kb, "control", stdout=subprocess.DEVNULL)
    old_worker = release_3(kb, "worker", stdout=subprocess.DEVNULL)
    exe = str(Path(sys.executable).parent / "reviewq")
    control = None
    try:
        await_fifo(started)  # the agent runs
        old_control.terminate()
        old_control.communicate(timeout=60)
        fd = os.open(go, os.O_WRONLY)
        os.write(fd, b"go\n")
        os.close(fd)
        old_worker.send_signal(signal.SIGINT)  # drains: the outcome is sent
        old_worker.communicate(timeout=60)
        control = subprocess.Popen([exe, "--root", str(kb.root), "control"], stderr=subprocess.PIPE)
        assert _until(control.stderr, "job.finalized", "message.refused") == "job.finalized"
    finally:
        for proc in (old_worker, old_control, control):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.communicate(timeout=60)
    assert runs.read_text().splitlines() == ["review 1 1"]
    with contextlib.closing(sqlite3.connect(kb.state / "state.db")) as conn:
        assert conn.execute("SELECT job_id, attempt, outcome FROM attempts").fetchall() == [
            (1, 1, "finalized")
        ]


def test_a_state_db_of_release_28_with_a_night_queued_finds_its_fixes_by_the_new_index(kb, run_cli):
    """Migration 29 on a state.db with a night queued (2,000 first reviews, a fix and its
    re-review queued behind them, an audit, a fix already run): the next command migrates
    it; the index holds the queued fix and re-review alone, and the control's read of a
    reviewer's cycle jobs goes through it, not through every queued job."""
    from orchestrator.control.control import CYCLE_SQL, QUEUED_SQL
    from orchestrator.state.migrations import LATEST

    conn = old_state(kb.state, 28)
    at = "2026-11-28T18:00:00.000Z"
    rows = [(j, "review", "queued", None) for j in range(1, 2001)]
    rows += [
        (2001, "fix", "completed", 7),
        (2002, "fix", "queued", 9),
        (2003, "review", "queued", 2002),
    ]
    rows += [(2004, "audit", "queued", 11)]
    conn.executemany(
        "INSERT INTO review_jobs (id, kind, status, source_job_id, model_partition, grouping, "
        "reviewer, job_dir, created_at, updated_at) VALUES (?, ?, ?, ?, 'm', 'note', 'r', "
        "'jobs/review-job-' || ?1, ?5, ?5)",
        [(*r, at) for r in rows],
    )
    conn.execute("PRAGMA journal_mode = WAL")
    conn.commit()
    conn.close()
    res = run_cli("status")
    assert res.exit_code == 0, res.stderr
    read = QUEUED_SQL.format(which=CYCLE_SQL)
    args = ("r", at, "[]", 50)
    with contextlib.closing(sqlite3.connect(kb.state / "state.db")) as conn:
        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (LATEST,)
        assert [r[0] for r in conn.execute(read, args)] == [2002, 2003]
        plan = " ".join(r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {read}", args))
        assert "USING INDEX review_jobs_cycle_queued" in plan, plan
        indexed = conn.execute(
            "SELECT id FROM review_jobs INDEXED BY review_jobs_cycle_queued "
            f"WHERE status = 'queued' AND {CYCLE_SQL} ORDER BY id"
        ).fetchall()
        assert indexed == [(2002,), (2003,)]
