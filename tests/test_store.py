"""state.db (CONTRACT §2): migrations, WAL, snapshots, acceptance keyed by gate_id."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from orchestrator.state.migrations import LATEST
from orchestrator.state.store import DAMAGED, ReviewRecord, Store, StoreError


def test_migrations_are_numbered_and_recorded(tmp_path):
    with Store.open(tmp_path) as store:
        rows = store.conn.execute(
            "SELECT version, name FROM schema_migrations ORDER BY version"
        ).fetchall()
        assert [r[0] for r in rows] == list(range(1, LATEST + 1))
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store.conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000
    with Store.open(tmp_path) as again:  # re-opening migrates nothing twice
        assert again.schema_version() == LATEST


def test_newer_schema_is_refused(tmp_path):
    Store.open(tmp_path).close()
    conn = sqlite3.connect(tmp_path / "state.db")
    conn.execute("INSERT INTO schema_migrations VALUES (999, 'future', 'x')")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="schema version 999 is newer"):
        Store.open(tmp_path)


def test_a_schema_that_does_not_match_its_version_is_refused_as_such(run_cli, kb):
    """Migration 10's column already there though its row is not (a restored table, a
    hand edit): the error read "another process holds it ... run the command again",
    which could never help."""
    Store.open(kb.state).close()
    conn = sqlite3.connect(kb.state / "state.db")
    conn.execute("DELETE FROM schema_migrations WHERE version >= 10")
    conn.commit()
    conn.close()
    res = run_cli("status")
    assert res.exit_code == 1
    assert res.stderr.startswith(
        f"error: {kb.state / 'state.db'}: cannot bring the schema from version 9 to 10"
    )
    assert (
        "duplicate column name: written" in res.stderr and "run the command again" not in res.stderr
    )
    conn = sqlite3.connect(kb.state / "state.db")  # nothing was half done
    assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone()[0] == 9
    conn.close()


def test_a_full_disk_during_a_migration_is_not_called_a_broken_schema(tmp_path, monkeypatch):
    """A migration that meets a full disk said "restore a backup": an operator would have
    replaced a sound state.db with an older copy, where freeing space was all it took."""
    path = tmp_path / "state.db"
    conn = _state_db_at(path, 11)
    conn.execute("VACUUM")
    conn.close()
    real = sqlite3.connect

    def full(*args, **kwargs):
        conn = real(*args, **kwargs)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")  # no room for one more page
        return conn

    monkeypatch.setattr(sqlite3, "connect", full)
    with pytest.raises(StoreError) as err:
        Store(path)
    assert "database or disk is full" in str(err.value)
    assert str(err.value).endswith("run the command again once that is fixed")
    assert "restore a backup" not in str(err.value)
    monkeypatch.undo()
    Store(path).close()  # with room again, the migration goes through


def test_not_a_database_is_refused(tmp_path):
    (tmp_path / "state.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a reviewq database"):
        Store.open(tmp_path)


def test_a_state_db_whose_first_page_was_zeroed_is_called_damaged_with_the_way_out(kb, run_cli):
    """Its header gone (a page of zeros after a crash or a disk fault), the state.db of a
    folder full of job folders read "not a reviewq database (file is not a database)":
    false of the record, and naming no fix where a damaged one names a backup or
    `.recover`."""
    kb.note("alpha")
    kb.gate("prose/body-check", ["body"])
    assert run_cli("enqueue", "--all-gates").exit_code == 0
    path = kb.state / "state.db"
    for name in ("state.db-wal", "state.db-shm"):
        (kb.state / name).unlink(missing_ok=True)
    with path.open("r+b") as f:
        f.write(bytes(4096))
    res = run_cli("status")
    assert res.exit_code == 1
    assert res.stderr == f"error: {path} is damaged (file is not a database): {DAMAGED}\n"
    res = run_cli("doctor")
    assert f"problem: state.db: {path} is damaged (file is not a database): {DAMAGED}\n" in (
        res.stdout
    )


def _refused_as_anothers(run_cli, other: Path, tables: str) -> None:
    """``status``, ``enqueue`` and ``doctor`` with ``--state OTHER`` each refuse its
    state.db as another program's in one line, and leave it as it was (no WAL, no queue)."""
    before = (other / "state.db").read_bytes()
    for args in (("status",), ("enqueue", "--all-gates"), ("doctor",)):
        res = run_cli("--state", str(other), *args)
        assert res.exit_code == 1, args
        said = res.stderr if args != ("doctor",) else res.stdout
        assert (
            f"{other / 'state.db'}: a SQLite database without reviewq's tables ({tables}): "
            "not reviewq's state.db, and left as it is (is --state right?)"
        ) in said, (args, said)
    assert (other / "state.db").read_bytes() == before
    assert not any((other / n).exists() for n in ("state.db-wal", "state.db-shm", "queue"))


def test_another_programs_sqlite_state_db_is_refused_and_left_as_it_was(kb, run_cli, tmp_path):
    """A `--state` naming another program's folder, whose SQLite file is also called
    state.db (a common name): `status` said all was clear, having written reviewq's twenty
    tables into that program's database and turned it to WAL."""
    kb.note("alpha")
    kb.gate("prose/body-check", ["body"])
    other = tmp_path / "otherapp"
    other.mkdir()
    conn = sqlite3.connect(other / "state.db")
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users VALUES (1, 'ada')")
    conn.commit()
    conn.close()
    _refused_as_anothers(run_cli, other, "users")
    # doctor, going on to check the SQLite queue, made queue/ and its files there.
    assert not (other / ".gitignore").exists()


@pytest.mark.parametrize(
    "migrations",
    [
        "version TEXT PRIMARY KEY",  # Rails, dbmate: a timestamp
        "version INTEGER PRIMARY KEY, dirty BOOLEAN",  # golang-migrate, numbered from 1
        "version INTEGER PRIMARY KEY, inserted_at TEXT",  # Ecto, none applied yet
    ],
)
def test_another_programs_schema_migrations_table_is_not_taken_for_reviewqs(
    kb, run_cli, tmp_path, migrations
):
    """`schema_migrations` is the name many migration tools give their table: another
    program's state.db holding one was taken for reviewq's, turned to WAL and then
    migrated into ("table schema_migrations has 1 columns but 3 values were supplied",
    said as another process holding it), read as a version ("internal error: TypeError")
    or as reviewq's own record not matching its tables ("restore a backup")."""
    kb.note("alpha")
    kb.gate("prose/body-check", ["body"])
    other = tmp_path / "otherapp"
    other.mkdir()
    conn = sqlite3.connect(other / "state.db")
    conn.execute(f"CREATE TABLE schema_migrations ({migrations})")
    if "inserted_at" not in migrations:
        conn.execute("INSERT INTO schema_migrations (version) VALUES ('20230101120000')")
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.commit()
    conn.close()
    _refused_as_anothers(run_cli, other, "schema_migrations, users")


@pytest.mark.parametrize("how", ["missing", "empty", "without reviewq's tables"])
def test_a_lost_state_db_does_not_start_a_new_record_over_the_old_jobs_folders(kb, run_cli, how):
    """A state.db deleted, or left empty by a restore whose `.recover` failed (OPERATIONS
    §7), was taken for a new one: the next enqueue numbered its jobs from 1 again and
    emptied review-job-1/ and on, the agents' transcripts and outputs of the old record
    (which nothing brings back) gone without a word."""
    kb.note("alpha")
    kb.gate("prose/body-check", ["body"])
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    evidence = kb.state / "jobs/review-job-1/attempt-1/stdout.log"
    kb.write(str(evidence.relative_to(kb.root)), "what the agent said\n")
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (kb.state / name).unlink(missing_ok=True)
    if how == "empty":
        (kb.state / "state.db").write_bytes(b"")
    elif how != "missing":  # what a `.recover` that stopped part way leaves
        conn = sqlite3.connect(kb.state / "state.db")
        conn.execute("CREATE TABLE lost_and_found (rootpgno, pgno, nfield, id, c0)")
        conn.close()
    for args in (
        ("enqueue", "--all-gates", "--reviewer", "offline"),
        # Reads: "nothing has run with this state folder yet", or every pair missing.
        ("status",),
        ("select", "--all-gates", "--model", "offline"),
    ):
        res = run_cli(*args)
        assert res.exit_code == 1, args
        assert res.stderr.splitlines() == [
            f"error: {kb.state / 'state.db'}: {how}, but {kb.state / 'jobs'} holds the folders "
            "of jobs an earlier state.db recorded; restore state.db from a backup "
            "(docs/OPERATIONS.md, section 7), or move the jobs folder aside to start a new "
            "record"
        ], args
    assert evidence.read_text() == "what the agent said\n"


def test_snapshots_are_stored_once_per_path_and_hash(tmp_path):
    with Store.open(tmp_path) as store:
        a = store.snapshot("kb/notes/a.md", "text")
        assert store.snapshot("kb/notes/a.md", "text") == a
        assert store.snapshot("kb/notes/b.md", "text") != a
        assert store.snapshot("kb/notes/a.md", "other") != a
        assert store.conn.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 3
        assert store.snapshot_text(a) == "text"


def test_record_reviews_accepts_all_but_error(tmp_path):
    def rec(d, g):
        return ReviewRecord("kb/notes/a.md", "n", g, f"kb/g/{g}.md", "prose", "gate", d, "why")

    with Store.open(tmp_path) as store:
        v0 = store.acceptance_version()
        store.record_reviews("m", [rec("PASS", "p/a"), rec("FAIL", "p/b"), rec("ERROR", "p/c")])
        assert store.acceptance("m", "kb/notes/a.md", "p/a").decision == "PASS"
        assert store.acceptance("m", "kb/notes/a.md", "p/b").decision == "FAIL"
        assert store.acceptance("m", "kb/notes/a.md", "p/c") is None
        assert store.acceptance_version() == v0 + 2
        assert store.conn.execute("SELECT count(*) FROM review_pairs").fetchone()[0] == 3


def test_a_failed_write_leaves_nothing(tmp_path):
    with Store.open(tmp_path) as store:
        with pytest.raises(RuntimeError), store.write():
            store.snapshot("kb/notes/a.md", "x")
            raise RuntimeError("killed")
        assert store.conn.execute("SELECT count(*) FROM snapshots").fetchone()[0] == 0


def test_a_new_state_folder_is_private(tmp_path):
    # Prompts quote notes, and failure reasons quote agents: only the owner may read them.
    state = tmp_path / "state"
    with Store.open(state):
        pass
    assert state.stat().st_mode & 0o777 == 0o700


def _other(tmp_path) -> sqlite3.Connection:
    return sqlite3.connect(tmp_path / "state.db")


def test_a_failed_commit_is_rolled_back_and_drops_its_callbacks(tmp_path):
    # A deferred foreign key fails at COMMIT, not at the INSERT: the transaction must
    # not stay open for the next write() to join.
    ran: list[str] = []
    with Store.open(tmp_path) as store:
        store.conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        store.conn.execute(
            "CREATE TABLE child (pid INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"
        )
        with pytest.raises(sqlite3.IntegrityError), store.write():
            store.conn.execute("INSERT INTO child VALUES (99)")
            store.after_commit(lambda: ran.append("bad"))
        assert not store.conn.in_transaction and ran == []
        with store.write():
            store.conn.execute("INSERT INTO parent VALUES (1)")
            store.after_commit(lambda: ran.append("good"))
        assert ran == ["good"]
        with _other(tmp_path) as other:
            assert other.execute("SELECT count(*) FROM parent").fetchone()[0] == 1
            assert other.execute("SELECT count(*) FROM child").fetchone()[0] == 0


def test_work_left_to_after_a_commits_callbacks_is_made_by_them_alone(tmp_path):
    """Store.after_callbacks (a commit's jobs settled together, stop 33) gathers only
    from the callbacks a commit runs: not in a transaction, rolled back or not, nor in
    one a callback begins, whose own commit may never come."""
    ran: list[object] = []

    class Gathered(list):
        def __init__(self, store):  # noqa: ANN001
            super().__init__()

        def __call__(self) -> None:
            ran.append(list(self))

    with Store.open(tmp_path) as store:

        def callback(name: str):  # noqa: ANN202
            def run() -> None:
                store.after_callbacks("k", Gathered).append(name)
                with store.write():  # a callback's own transaction
                    ran.append(store.after_callbacks("k", Gathered))

            return run

        with store.write():
            assert store.after_callbacks("k", Gathered) is None
            store.after_commit(callback("a"))
            store.after_commit(callback("b"))
            assert ran == []
        assert ran == [None, None, ["a", "b"]]
        assert store.after_callbacks("k", Gathered) is None


def test_a_nested_write_that_fails_undoes_only_itself(tmp_path):
    ran: list[str] = []
    with Store.open(tmp_path) as store:
        with store.write():
            store.snapshot("kb/notes/a.md", "outer")
            store.after_commit(lambda: ran.append("outer"))
            with pytest.raises(RuntimeError), store.write():
                store.snapshot("kb/notes/b.md", "inner")
                store.after_commit(lambda: ran.append("inner"))
                raise RuntimeError("inner step failed")
            assert ran == []  # nothing runs before the outermost commit
        paths = [r[0] for r in store.conn.execute("SELECT path FROM snapshots")]
        assert paths == ["kb/notes/a.md"] and ran == ["outer"]


def test_a_rollback_that_fails_does_not_hide_the_error(tmp_path):
    with Store.open(tmp_path) as store:
        with pytest.raises(RuntimeError, match="the real error"), store.write():
            store.conn.execute("ROLLBACK")  # as SQLite does by itself on some errors
            raise RuntimeError("the real error")
        with pytest.raises(sqlite3.OperationalError, match="rolled back by SQLite"), store.write():
            store.conn.execute("ROLLBACK")
            store.snapshot("kb/notes/a.md", "ran in autocommit")
        assert not store.conn.in_transaction


def _kb_in_git(kb) -> None:
    """A KB of one gate and one note, in a git repository of its own."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    subprocess.run(["git", "init", "-q", str(kb.root)], check=True)


def _untracked(kb) -> str:
    """`git status --porcelain` of the KB's repository, every untracked file named."""
    return subprocess.run(
        ["git", "-C", str(kb.root), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_a_new_state_folder_is_ignored_by_the_kbs_git(kb, run_cli):
    """Made inside the KB's repository (ROOT/.reviewq by default), a `git add -A` staged
    state.db, the queue files and prompts that quote notes: nothing told git otherwise."""
    _kb_in_git(kb)
    assert run_cli("enqueue", "--all-gates").exit_code == 0
    status = _untracked(kb)
    assert "kb/notes/alpha.md" in status
    assert ".reviewq" not in status, status


def test_a_first_select_makes_the_state_folder_as_a_new_state_db_does(kb, run_cli):
    """`reviewq select` before anything else ran (the README's manual flow) made
    ROOT/.reviewq for its caches with neither the .gitignore nor mode 0700: a `git add -A`
    then committed the caches (select's answers quote the notes' diffs), and the state.db
    made there later kept the folder readable by every user."""
    _kb_in_git(kb)
    assert run_cli("select", "--all-gates", "--json").exit_code == 0
    assert (kb.state / "cache").is_dir()
    status = _untracked(kb)
    assert ".reviewq" not in status, status
    assert kb.state.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("as_json", [False, True], ids=["lines", "json"])
def test_a_select_by_a_reader_who_cannot_write_the_kb_still_answers(kb, as_json):
    """`select` reads: on a KB its user may not write (a colleague's, a read-only checkout)
    it answered without its caches (a cache not written is only slower). Making the state
    folder at a first select refused it: "Permission denied (run reviewq as a user who
    may read and write ...)"."""
    from .conftest import bound_by_file_modes, reviewq_process

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.root.chmod(0o555)
    try:
        res = reviewq_process(
            "--root",
            str(kb.root),
            "select",
            "--all-gates",
            *(["--json"] if as_json else []),
            wrap=bound_by_file_modes(),
        )
    finally:
        kb.root.chmod(0o755)
    assert res.returncode == 0, res.stderr
    assert "kb/notes/alpha.md" in res.stdout and "prose/clarity" in res.stdout, res.stdout
    assert not kb.state.exists()


def test_a_state_folder_that_is_the_kb_root_gets_no_gitignore(kb, run_cli):
    """`--state .` in ROOT: a .gitignore of `*` there hid the whole KB from git."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    assert run_cli("--state", str(kb.root), "enqueue", "--all-gates").exit_code == 0
    assert not (kb.root / ".gitignore").exists()


def _state_db_at(path, version: int) -> sqlite3.Connection:
    """A state.db as reviewq left it at schema ``version``."""
    from orchestrator.state.migrations import MIGRATIONS
    from orchestrator.state.store import _statements

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
        "applied_at TEXT NOT NULL)"
    )
    for number, name, sql in MIGRATIONS[:version]:
        for statement in _statements(sql):
            conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_migrations VALUES (?, ?, '2026-11-20T00:00:00.000Z')",
            (number, name),
        )
    return conn


def test_an_agents_failure_escalated_before_calls_existed_recommends_redo_or_approve(tmp_path):
    """Migration 9 gave every open escalation 'reject': one raised because the reviewer
    (or the auditor) failed every attempt then had its report tell a person to reject a
    note nobody had judged."""
    conn = _state_db_at(tmp_path / "state.db", 8)
    columns = (
        "model_partition, note_path, gate_id, reason, cycles, reviewer, report_path, "
        "raised_at, recommend"
    )
    for gate, reason in [
        ("g/reviewer", "the reviewer failed every attempt: exited 1 without writing output"),
        ("g/auditor", "the auditor (aud) failed every attempt: exited 1 without writing output"),
        ("g/rejected", "3 consecutive rejections"),
    ]:
        conn.execute(
            f"INSERT INTO escalations ({columns}) VALUES "
            "('p', 'kb/notes/a.md', ?, ?, 0, 'r', 'escalations/e.md', '2026-11-20T02:00:00Z', 'x')",
            (gate, reason),
        )
    conn.close()
    with Store.open(tmp_path) as store:
        calls = dict(store.conn.execute("SELECT gate_id, call FROM escalations"))
        due = {r[0] for r in store.conn.execute("SELECT escalation_id FROM escalation_reports_due")}
    assert calls == {"g/reviewer": "redo", "g/auditor": "approve", "g/rejected": "reject"}
    assert due == {1, 2}  # their reports are written again, with the call


def test_a_runs_spend_is_read_through_an_index_not_a_scan_of_every_job(tmp_path):
    """spent_usd, summed for each budgeted run with queued jobs at every enqueue and five
    times a second by a sweep, scanned every job ever recorded: seconds a call, under the
    write lock, on a year's state.db (400 runs, 200,000 jobs: 6.7 s)."""
    with Store.open(tmp_path / "state") as store:
        plan = " ".join(
            r[3]
            for r in store.conn.execute(
                "EXPLAIN QUERY PLAN SELECT COALESCE(SUM(a.cost_usd), 0) FROM attempts a "
                "JOIN review_jobs j ON j.id = a.job_id JOIN sweep_runs r ON r.id = j.sweep_run_id "
                "WHERE r.id = ? AND a.started_at >= r.started_at",
                (1,),
            )
        )
    assert "SCAN j" not in plan and "review_jobs_run" in plan, plan


def _queued_steps(tmp_path, name: str, jobs: int, read) -> tuple[object, int]:  # noqa: ANN001
    """``read(store)`` over ``jobs`` queued jobs of reviewer ``a`` in budgeted run 1 (and
    one queued job with no reviewer in run 2, without a budget, and a finished one of
    reviewer ``b`` in budgeted run 3): its answer and its SQLite VM steps."""
    with Store.open(tmp_path / name) as store:
        store.conn.executemany(
            "INSERT INTO sweep_runs (id, name, trigger, options, budget_usd, started_at) "
            "VALUES (?, 'cli', 'sweep', '{}', ?, 't')",
            [(1, 5.0), (2, None), (3, 5.0)],
        )
        rows = [("queued", "a", 1)] * jobs + [("queued", None, 2), ("completed", "b", 3)]
        store.conn.executemany(
            "INSERT INTO review_jobs (status, model_partition, grouping, reviewer, job_dir, "
            "created_at, updated_at, sweep_run_id) VALUES (?, 'm', 'note', ?, 'd', 't', 't', ?)",
            rows,
        )
        steps = [0]

        def tick() -> int:
            steps[0] += 1
            return 0

        store.conn.set_progress_handler(tick, 100)
        found = read(store)
        store.conn.set_progress_handler(None, 0)
        return found, steps[0]


def test_reviewers_with_queued_jobs_are_found_without_reading_every_queued_job(tmp_path):
    """Dispatch, run per outcome, read every queued job (SELECT DISTINCT reviewer) to
    learn which reviewers have any: a sweep's dispatching grew with the square of its
    jobs. The reviewers come from the index now, whatever the queue holds."""
    from orchestrator.state.status import reviewers_with_queued_jobs

    few, few_steps = _queued_steps(tmp_path, "few", 100, reviewers_with_queued_jobs)
    many, many_steps = _queued_steps(tmp_path, "many", 5000, reviewers_with_queued_jobs)
    assert few == many == ["a"]  # not the NULL reviewer, not b (nothing queued)
    assert many_steps <= few_steps + 5, (few_steps, many_steps)


def test_budgeted_runs_with_queued_jobs_are_found_without_reading_every_queued_job(tmp_path):
    """The same for the sweep runs a budget may hold back, asked at each dispatch too (and
    five times a second by a sweep's progress)."""
    from orchestrator.state.status import budgeted_runs_with_queued_jobs

    def read(store: Store) -> list[tuple]:
        return [tuple(r) for r in budgeted_runs_with_queued_jobs(store)]

    few, few_steps = _queued_steps(tmp_path, "few", 100, read)
    many, many_steps = _queued_steps(tmp_path, "many", 5000, read)
    assert few == many == [(1, 5.0)]  # not run 2 (no budget), not run 3 (nothing queued)
    assert many_steps <= few_steps + 5, (few_steps, many_steps)
