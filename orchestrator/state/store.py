"""state.db (CONTRACT §2): the connection, migrations, snapshots and acceptance.

state.db is the canonical record; every file reviewq writes for people is a rendering
of it. Writes happen inside :meth:`Store.write`, an IMMEDIATE transaction, so a process
killed mid-way leaves nothing partial.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import secrets
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from orchestrator.kb.notes import sha256_text
from orchestrator.regularfile import make_private, private
from orchestrator.state.migrations import LATEST, MIGRATIONS

BUSY_TIMEOUT_MS = 10_000


class StoreError(Exception):
    """state.db cannot be used (a newer schema, a corrupt file)."""


class NotOurs(StoreError):
    """state.db is another program's database: the folder is not reviewq's to write in."""


def timestamp(at: datetime) -> str:
    """A time as state.db stores it: in UTC, ISO 8601 to the millisecond, with a ``Z``, so
    stored times compare as text."""
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_timestamp(text: str) -> datetime:
    """The time a :func:`timestamp` (or any ISO 8601 text) names."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def storable_number(value: object) -> bool:
    """Whether a cost or a count is one SQLite holds as given and a budget can sum: an int
    or a float from 0 within its 64-bit range, not a bool, NaN or infinity. What is not
    one is nobody's spend (a negative cost lowered a run's spend against its budget)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 2**63


def json_column(text: str | None) -> object:
    """A JSON column as it was written. One edited by hand into something else comes back
    as its text, marked, rather than ending the command, report or control tick that reads
    it."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return f"(not JSON) {text}"


def reasons_column(text: str | None) -> list:
    """A list of reasons (``failure_reasons``, ``attempts.reasons``), read as
    :func:`json_column` reads, and always a list of strings."""
    value = json_column(text or "[]")
    items = value if isinstance(value, list) else [value]
    # Strings, as every reader joins them: `null` or `{"a": 1}` edited in are shown as JSON.
    return [x if isinstance(x, str) else json.dumps(x) for x in items]


def utcnow() -> str:
    return timestamp(datetime.now(UTC))


@dataclass(frozen=True, slots=True)
class Acceptance:
    model_partition: str
    note_path: str
    gate_id: str
    review_pair_id: int
    note_snapshot_id: int
    gate_snapshot_id: int
    decision: str
    source: str
    accepted_at: str
    note_commit: str | None = None  # export's recorded-commit; None: recorded before it was kept


@dataclass(frozen=True, slots=True)
class ReviewRecord:
    """One (note, gate) decision to record outside a queued job (tests, benchmarks, humans)."""

    note_path: str
    note_text: str
    gate_id: str
    gate_path: str
    lens: str
    gate_text: str
    decision: str
    rationale: str = ""


# What reviewq writes in place in a state folder, relative to it: doctor checks that the
# user can write each one there is. With the page it replaces by a rename (the folder's
# write access is what counts for it), a folder holding anything else is not reviewq's alone.
STATE_ENTRIES = (
    *("state.db", "state.db-wal", "state.db-shm", "state.db-journal", "control.lock"),
    *("logs", "logs/reviewq.jsonl", "jobs", "escalations", "cache", "run"),
    *("queue", "queue/review.db", "queue/control.db", "worker"),
)
_TOP_ENTRIES = {entry.partition("/")[0] for entry in (*STATE_ENTRIES, "report.html")}


def _ignored_by_git(folder: Path) -> None:
    """A new state folder says so to git: made inside the KB's repository (ROOT/.reviewq,
    the default), a `git add -A` staged state.db, the queue files and prompts that quote
    notes. As pytest's and ruff's caches do; only in a folder that holds nothing but
    reviewq's own (`--state .` in ROOT would have hidden the whole KB from git)."""
    with contextlib.suppress(OSError):
        ignore = folder / ".gitignore"
        with os.scandir(folder) as entries:
            if ignore.exists() or any(e.name not in _TOP_ENTRIES for e in entries):
                return
        with open(ignore, "w", encoding="utf-8", opener=private) as f:
            f.write("# reviewq's state folder: nothing here belongs in git.\n*\n")


def make_state_folder(folder: Path, *, new: bool) -> None:
    """The state folder, private (prompts quote notes, and agents' output may quote their
    environment) and, when ``new``, ignored by git: so whichever command makes it first,
    a `select` writing its caches or the first state.db."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if new:
        _ignored_by_git(folder)


# What to do about a damaged database file, wherever one is met.
DAMAGED = (
    "restore it from a backup, or recover what it holds with `sqlite3 FILE .recover` "
    "(docs/OPERATIONS.md, section 7)"
)


def damaged_words(state_dir: Path, what: str) -> str:
    """The line on a damaged state.db (``what``: SQLite's words) and what to do about it."""
    return f"state.db at {state_dir / 'state.db'} is damaged ({what}): {DAMAGED}"


def is_damage(exc: sqlite3.Error) -> bool:
    """A file SQLite finds corrupt or not a database at all, or a table of the schema
    missing: no retry helps. Not a constraint or a query that is wrong (a defect)."""
    name = getattr(exc, "sqlite_errorname", "")
    return name in ("SQLITE_CORRUPT", "SQLITE_NOTADB") or str(exc).startswith("no such table")


# A full disk or quota: every file after this one would fail alike.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# Less room than this on a state folder's disk is none for reviewq: SQLite grows a WAL
# index and a log a page or a frame at a time, and a job's prompt takes more.
ROOM_BYTES = 1 << 20
# Fewer free inodes than this is none for reviewq: a job's folder is a dozen files, and
# SQLite makes a WAL and its index beside each database it opens.
ROOM_FILES = 64


def no_room(*folders: Path) -> str | None:
    """What to do about the first of ``folders`` whose disk has less than ROOM_BYTES free
    (to this user: root may use the blocks kept for it), or None. SQLite says a WAL index
    it could not grow on a full disk as "disk I/O error" (SQLITE_IOERR_SHMSIZE), never
    "disk is full": read as it came, it was "not a reviewq database" or a lock to wait
    out (OPERATIONS §6.4 says what to free)."""
    for folder in folders:
        try:
            st = os.statvfs(folder)
        except OSError:  # not there (a queue folder not made yet): the next one says
            continue
        root = os.geteuid() == 0
        free = (st.f_bfree if root else st.f_bavail) * st.f_frsize
        if free < ROOM_BYTES:
            return (
                f"the disk of {folder} is full ({free} bytes free): free space there "
                "(OPERATIONS §6.4)"
            )
        # Bytes free and no inode (a tmpfs' nr_inodes, a small ext4 of many job folders):
        # no file can be made. f_files is 0 where the file system counts none (btrfs).
        files = st.f_ffree if root else st.f_favail
        if st.f_files and files < ROOM_FILES:
            return (
                f"the disk of {folder} is out of inodes ({files} free, {free} bytes free): "
                "no file can be made there; delete files there (OPERATIONS §6.4)"
            )
    return None


def disk_error(exc: BaseException) -> bool:
    """Whether SQLite's error is one a full disk gives (SQLITE_FULL, SQLITE_IOERR_*; and
    SQLITE_CANTOPEN, a WAL or its index that could not be made, on a disk out of inodes):
    :func:`no_room` says whether the disk is why."""
    return getattr(exc, "sqlite_errorname", "").startswith(
        ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN")
    )


def lost_record(path: Path, how: str) -> str | None:
    """Why no new record may start at ``path``: state.db ``how`` (missing, empty, damaged,
    without reviewq's tables: deleted, a restore whose `.recover` failed, a crash) in a state
    folder whose jobs/ holds job folders.
    Taken for a new database, its jobs were numbered from 1 again and each new job emptied
    the old folder of that number: the agents' transcripts and outputs of the old record,
    which nothing brings back. None where a new record may start."""
    jobs = path.parent / "jobs"
    try:
        with os.scandir(jobs) as entries:
            if not any(e.name.startswith("review-job-") for e in entries):
                return None
    except OSError:
        return None
    return (
        f"{path}: {how}, but {jobs} holds the folders of jobs an earlier state.db "
        "recorded; restore state.db from a backup (docs/OPERATIONS.md, section 7), or "
        "move the jobs folder aside to start a new record"
    )


def _tables(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]


def _schema(conn: sqlite3.Connection) -> set[tuple[str, str]]:
    return set(conn.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"))


# How long a lock found held is looked at again before a control is taken to hold it:
# `control_pid` (status, decide, finalize, run-job, a sweep's start, a migration's
# look) takes the lock for a moment to learn that no control holds it, and a control
# starting in that moment refused to run, saying another did (``workers.consumers``);
# a migration looking then refused to run beneath a control long gone.
PROBE_WAIT_S = 0.5


def control_pid(state_dir: Path) -> int | None:
    """The pid of the control process that holds ``state_dir`` (0 when it has not written
    it yet), or None when none does. The lock, not the pid in the file, says so: a pid
    outlives its process, a lock does not. OSError when the file cannot be read."""
    lock = state_dir / "control.lock"
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if not isinstance(exc, PermissionError) and exc.errno != errno.EROFS:
            raise
        # Another user's (a control once run as root), or on a read-only mount: a local
        # lock is looked at as well through a descriptor that only reads.
        fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            return int(os.pread(fd, 32, 0) or 0)
        except ValueError:
            return 0
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


# Names each write transaction of this process, across stores: a store opened again
# counts its own from 1, and a look at the files keyed on that count (the gate
# catalog) was taken for the closed store's transaction of the same number.
_WRITES = itertools.count(1)

T = TypeVar("T")


class Store:
    def __init__(
        self, path: str | os.PathLike, *, readonly: bool = False, reading: bool = False
    ) -> None:
        """``readonly``: a state.db that is not there is an empty in-memory schema.
        ``reading``: a command that only reads may read a state folder it may not write
        (a read-only mount, a backup, another user's): opened for reading alone, never
        migrated."""
        self.path = Path(path)
        self._after_commit: list[Callable[[], None]] = []
        # The work a commit's callbacks leave to one step after them all (their due rows
        # settled in one transaction): made only while they run, so a rollback has none.
        self._closing: dict[str, Callable[[], None]] | None = None
        self._savepoints = 0  # depth of nested write() blocks
        # Counts the outermost write transactions begun; ``writing`` names the one under
        # way, uniquely in this process (None outside one, a read transaction too): what
        # was read from the files once in one of them (the gate catalog) holds for the
        # rest of it.
        self.transactions = 0
        self.writing: int | None = None
        # Whether a writer of job folders waits for a folder another process is writing.
        # The control process does not: every outcome would wait behind a command run by
        # hand that is suspended mid-render; the folder stays due for its next tick.
        self.waits_for_folders = True
        if readonly and not self.path.exists():
            # Reads of a state folder that was never used: an empty in-memory schema.
            self.conn = sqlite3.connect(":memory:", isolation_level=None)
            self._migrate()
        else:
            if not self.path.exists() and (lost := lost_record(self.path, "missing")):
                raise StoreError(lost)
            make_state_folder(self.path.parent, new=not self.path.exists())
            with contextlib.suppress(OSError):  # SQLite says what keeps it from the file
                make_private(self.path)
            # check_same_thread=False: the control consumer opens the store in its main
            # thread and uses it from its one worker thread, never from two at once.
            self.conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                timeout=BUSY_TIMEOUT_MS / 1000,
                check_same_thread=False,
            )
            try:
                self.conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                if (foreign := self._foreign()) is not None:
                    self.conn.close()
                    raise NotOurs(foreign)
                self.conn.execute("PRAGMA journal_mode = WAL")
                self.conn.execute("PRAGMA synchronous = NORMAL")
            except sqlite3.DatabaseError as exc:
                self.conn.close()
                self._no_room(exc)
                if "unable to open" in str(exc) or "readonly" in str(exc):
                    if reading and self._read_only():
                        return
                    # A permission, not a damaged file: "not a reviewq database" would send
                    # the operator to repair the one file they must not lose.
                    raise StoreError(
                        f"{self.path}: cannot be opened for writing ({exc}); reviewq needs "
                        "write access to the state folder, even to read it"
                    ) from None
                if disk_error(exc):
                    raise StoreError(f"{self.path}: cannot be opened ({exc})") from None
                name = getattr(exc, "sqlite_errorname", "")
                # No header (a page of zeros after a crash) beside the folders of the jobs
                # it recorded is reviewq's record damaged, not another file.
                if name == "SQLITE_CORRUPT" or (
                    name == "SQLITE_NOTADB" and lost_record(self.path, "damaged") is not None
                ):
                    raise StoreError(f"{self.path} is damaged ({exc}): {DAMAGED}") from None
                raise StoreError(f"{self.path}: not a reviewq database ({exc})") from None
            self._migrate()
        self.conn.execute("PRAGMA foreign_keys = ON")
        self.conn.execute("PRAGMA temp_store = MEMORY")
        self.conn.row_factory = sqlite3.Row

    def _read_only(self) -> bool:
        """Open state.db for reading alone, where it cannot be written: False when even
        that fails (said as before). SQLite reads a WAL database read-only through its
        -shm file; without one it can make, the file is read as immutable, which is whole
        only when no -wal file holds commits not yet copied into it."""
        wal = self.path.with_name(self.path.name + "-wal")
        uri = f"file:{urllib.parse.quote(str(self.path))}?mode=ro"
        tries = [uri] + ([] if wal.exists() and wal.stat().st_size else [uri + "&immutable=1"])
        for each in tries:
            conn = sqlite3.connect(each, uri=True, isolation_level=None, check_same_thread=False)
            try:
                conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                version = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
                current = version.fetchone()[0]
            except sqlite3.DatabaseError:
                conn.close()
                continue
            if current != LATEST:
                conn.close()
                raise StoreError(
                    f"{self.path}: schema version {current}, which this reviewq reads at "
                    f"{LATEST}: migrating it needs write access to the state folder"
                )
            self.conn = conn
            self.conn.execute("PRAGMA foreign_keys = ON")
            self.conn.execute("PRAGMA temp_store = MEMORY")
            self.conn.row_factory = sqlite3.Row
            return True
        return False

    @classmethod
    def open(
        cls, state_dir: str | os.PathLike, *, readonly: bool = False, reading: bool = False
    ) -> Store:
        return cls(Path(state_dir) / "state.db", readonly=readonly, reading=reading)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- schema -----------------------------------------------------------------------
    def damage(self) -> str | None:
        """What is wrong with the file, or None: SQLite's quick check (its first line), or a
        table, index or trigger of the schema missing (dropped by hand)."""
        problems = [r[0] for r in self.conn.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            return problems[0]
        with contextlib.closing(Store(":memory:", readonly=True)) as blank:  # a new schema
            missing = _schema(blank.conn) - _schema(self.conn)
        return f"missing {', '.join(f'{t} {n}' for t, n in sorted(missing))}" if missing else None

    def _foreign(self) -> str | None:
        """Why the file is not reviewq's to migrate: tables and no record of migrations,
        another program's database (state.db is a common name) or a `.recover` that
        stopped part way. Migrated, it had reviewq's tables written into it and its
        journal turned to WAL, by a `status` that then said all was clear. Looked at
        before anything is written, WAL included."""
        tables = [
            name
            for (name,) in self.conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        # By its columns, not its name alone: Rails, dbmate, golang-migrate and Ecto name
        # theirs schema_migrations too, and one was migrated into, or its version read.
        if not tables or (
            "schema_migrations" in tables
            and [r[1] for r in self.conn.execute("PRAGMA table_info(schema_migrations)")]
            == ["version", "name", "applied_at"]
        ):
            return None
        return lost_record(self.path, "without reviewq's tables") or (
            f"{self.path}: a SQLite database without reviewq's tables "
            f"({', '.join(sorted(tables)[:5])}{', ...' if len(tables) > 5 else ''}): not "
            "reviewq's state.db, and left as it is (is --state right?)"
        )

    def schema_version(self) -> int:
        row = self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name='schema_migrations'"
        ).fetchone()
        if row is None:
            return 0
        return self.conn.execute(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations"
        ).fetchone()[0]

    def _no_room(self, exc: sqlite3.DatabaseError) -> None:
        """Raise the StoreError of a state.db that cannot be opened for its disk's want of
        room (bytes or inodes): "not a reviewq database" sent a person to repair or move
        aside the one file they must not lose, and "needs write access" to a permission
        they had."""
        if disk_error(exc) and (room := no_room(self.path.parent)):
            raise StoreError(f"{self.path}: cannot be opened ({exc}); {room}") from None

    def _migrate(self) -> None:
        try:
            current = self.schema_version()
        except sqlite3.DatabaseError as exc:
            self._no_room(exc)
            raise StoreError(f"{self.path}: not a reviewq database ({exc})") from None
        if current > LATEST:
            raise StoreError(
                f"{self.path}: schema version {current} is newer than this reviewq "
                f"understands ({LATEST}); upgrade reviewq"
            )
        if current == LATEST:
            return
        if current and (pid := self._control_pid()) is not None:
            if self.schema_version() != current:
                # Read again: a control of this release, started since the read above,
                # migrated state.db before it took the lock.
                return self._migrate()
            # A control of the release that made this schema: migrated under it, it went
            # on writing rows without what the new release keeps beside them (due files,
            # the times, the fixes' marks), and the new control refused to start anyway.
            raise self._beneath(current, pid)
        if current == 0 and self.path.exists():  # not the in-memory schema of a read
            lost = lost_record(
                self.path, "empty" if not _tables(self.conn) else "without reviewq's tables"
            )
            if lost:
                self.conn.close()
                raise StoreError(lost)
        with self.write():
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            current = self.schema_version()  # another process may have migrated meanwhile
            for version, name, sql in MIGRATIONS:
                if version <= current:
                    continue
                for statement in _statements(sql):
                    try:
                        self.conn.execute(statement)
                    except sqlite3.OperationalError as exc:
                        if "locked" in str(exc) or "busy" in str(exc):
                            raise  # another process: the command may be run again
                        what = f"{self.path}: cannot bring the schema from version {current} to {version} ({name}): {exc}; nothing was changed"
                        if getattr(exc, "sqlite_errorname", "SQLITE_ERROR") != "SQLITE_ERROR":
                            # A full disk, an I/O error, no write access: the database is
                            # sound, and the command works once the cause is gone.
                            raise StoreError(
                                f"{what}; run the command again once that is fixed"
                            ) from None
                        # The schema does not match the version it records: running the
                        # command again would meet the same error.
                        raise StoreError(
                            f"{what} (its recorded version does not match its tables: "
                            "restore a backup)"
                        ) from None
                self.conn.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)", (version, name, utcnow())
                )
            if 0 < current < LATEST and (pid := self._control_pid()) is not None:
                # Looked at again before the commit: one started while the schema was
                # brought up read the earlier version, and took its lock since.
                raise self._beneath(current, pid)

    def _beneath(self, current: int, pid: int) -> StoreError:
        """Why this older state.db is not migrated: a control of the release that
        made it holds the folder (``pid``, 0 when it has not written it yet)."""
        return StoreError(
            f"{self.path}: schema version {current} is older than this reviewq's "
            f"({LATEST}), and the control process "
            f"{f'(pid {pid}) ' if pid else ''}of the release that made it still runs "
            "on this state folder: stop it (systemctl stop reviewq-control) before the "
            "new release migrates state.db, then run the command again; nothing was changed"
        )

    def _control_pid(self) -> int | None:
        """``control_pid`` of this state.db's folder, for a migration to ask: a lock held
        for a moment (another command's look) is waited out, and one it cannot look at
        is said in one line, not as an internal error of every command."""
        deadline = time.monotonic() + PROBE_WAIT_S
        try:
            while (pid := control_pid(self.path.parent)) is not None:
                if time.monotonic() >= deadline:
                    return pid
                time.sleep(0.02)
            return None
        except OSError as exc:
            raise StoreError(
                f"{self.path.parent / 'control.lock'}: cannot be read to learn whether a "
                f"control process of the release that made state.db (schema version "
                f"{self.schema_version()}) still runs ({exc.strerror or exc}); make it a "
                "file this user can read, then run the command again; nothing was changed"
            ) from None

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: all of it commits or none of it does.

        Nested use is a SAVEPOINT inside the outer transaction (as sqlite-utils'
        ``atomic()``): an inner block that raises undoes its own statements and its
        after-commit callbacks, and the outer one goes on if it catches the error. A
        failed COMMIT (a deferred constraint, a full disk) is rolled back, so the
        connection never stays inside a transaction nobody will end."""
        if self.conn.in_transaction:
            yield from self._savepoint()
            return
        self.conn.execute("BEGIN IMMEDIATE")
        self.transactions += 1
        self.writing = next(_WRITES)
        try:
            yield self.conn
            if not self.conn.in_transaction:
                # SQLite ends a transaction by itself on some errors (SQLITE_FULL, IOERR);
                # whatever ran after that ran in autocommit, outside this transaction.
                raise sqlite3.OperationalError("the transaction was rolled back by SQLite")
            self.conn.execute("COMMIT")
        except BaseException:
            self._rollback("ROLLBACK")
            self._after_commit.clear()
            raise
        finally:
            self.writing = None
        # Taken before running: a callback that fails must not leave the others to run
        # after some later, unrelated commit. Nor may it drop them: each says or renders
        # what did commit (a job's files, then its job.finalized line), and a batch's
        # outcomes taken again after the error are repeats, which say nothing.
        callbacks, self._after_commit = self._after_commit, []
        outer, self._closing = self._closing, {}  # a callback's own commit has its own
        failure: Exception | None = None
        try:
            for fn in callbacks:
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - raised below, once the others ran
                    failure = failure or exc
        finally:
            closing, self._closing = self._closing, outer
        for fn in closing.values():
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - as a callback's
                failure = failure or exc
        if failure is not None:
            raise failure

    @contextmanager
    def settled_read(self, now: str | None = None) -> Iterator[str]:
        """One read snapshot, and a time (``now`` unless given) that every write in it
        was stamped before, and no later write was. A writer stamps its rows (an
        attempt's ``recorded_at``) before it commits: a report whose window ended between
        the two left that row out, and the next report, starting where it ended, too.
        The time is taken holding the write lock, so no writer is between its stamps and
        its commit; the snapshot starts before the lock is let go. So writers take the
        times they stamp inside their transaction (``now = utcnow()`` after ``write()``):
        one taken before waiting for the lock may be older than a report's end and commit
        after it. A lock busy past the timeout is raised, as for any write."""
        if self.conn.in_transaction:
            raise RuntimeError("settled_read inside a transaction")
        lock = None
        if now is None and self.path.exists():
            lock = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            try:
                lock.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                lock.close()
                lock = None
                if "readonly" not in str(exc):  # a state.db this user may only read: unsettled
                    raise
        try:
            stamp = now or utcnow()
            self.conn.execute("BEGIN")
            self.conn.execute("SELECT 1 FROM schema_migrations LIMIT 1").fetchall()
        finally:
            if lock is not None:
                lock.execute("ROLLBACK")
                lock.close()
        try:
            yield stamp
        finally:
            if self.conn.in_transaction:
                self.conn.execute("COMMIT")

    def _savepoint(self) -> Iterator[sqlite3.Connection]:
        self._savepoints += 1
        name = f"reviewq_{self._savepoints}"
        kept = len(self._after_commit)
        self.conn.execute(f"SAVEPOINT {name}")
        try:
            yield self.conn
        except BaseException:
            self._rollback(f"ROLLBACK TO {name}", f"RELEASE {name}")
            del self._after_commit[kept:]
            raise
        else:
            self.conn.execute(f"RELEASE {name}")
        finally:
            self._savepoints -= 1

    def _rollback(self, *statements: str) -> None:
        """Undo after an error; a rollback that fails itself (SQLite already rolled the
        transaction back) must not hide the error that led here."""
        for sql in statements:
            try:
                self.conn.execute(sql)
            except sqlite3.Error:
                return

    def after_commit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the current transaction commits (at once outside one); a
        rollback drops it. One that raises does not keep the next from running: the first
        error is raised once they all have. For files rendered from the rows: they must
        never be written for rows that did not commit, and failing to write them must not
        undo the rows."""
        if self.conn.in_transaction:
            self._after_commit.append(fn)
        else:
            fn()

    def after_callbacks(self, key: str, make: Callable[[Store], T]) -> T | None:
        """While a commit's callbacks run: the one ``make(self)`` made for ``key`` in
        them, run (called) once they all have; outside them None, for the caller to do
        its work now. For what each callback would do alone and all of them can do at
        once (their due rows settled in one transaction, not one a job). Made from the
        callbacks that run, which only a commit runs: no rolled-back transaction or
        savepoint has any (K52)."""
        if self._closing is None or self.conn.in_transaction:
            # Inside a transaction a callback began: what it writes settles as it goes,
            # not after the callbacks of the commit before it (that transaction may roll back).
            return None
        if key not in self._closing:
            self._closing[key] = make(self)
        return self._closing[key]  # type: ignore[return-value]

    # --- snapshots --------------------------------------------------------------------
    def snapshot(self, path: str, text: str, sha256: str | None = None) -> int:
        """The id of the snapshot of ``text`` at ``path``, stored once per (path, sha256)."""
        sha = sha256 or sha256_text(text)
        row = self.conn.execute(
            "SELECT id FROM snapshots WHERE path = ? AND sha256 = ?", (path, sha)
        ).fetchone()
        if row is not None:
            return row[0]
        with self.write():
            cur = self.conn.execute(
                "INSERT INTO snapshots (path, sha256, text, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (path, sha256) DO UPDATE SET path = excluded.path RETURNING id",
                (path, sha, text, utcnow()),
            )
            return cur.fetchone()[0]

    def snapshot_text(self, snapshot_id: int) -> str | None:
        row = self.conn.execute(
            "SELECT text FROM snapshots WHERE id = ?", (snapshot_id,)
        ).fetchone()
        return None if row is None else row[0]

    def snapshot_texts(self, ids: Iterable[int]) -> dict[int, str]:
        out: dict[int, str] = {}
        ids = list(set(ids))
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            out.update(
                self.conn.execute(
                    f"SELECT id, text FROM snapshots WHERE id IN ({marks})", chunk
                ).fetchall()
            )
        return out

    def snapshot_ids(self, path_shas: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Existing snapshot ids for (path, sha256) keys; absent keys are left out."""
        self.conn.execute("CREATE TEMP TABLE IF NOT EXISTS want_snap (path TEXT, sha256 TEXT)")
        self.conn.execute("DELETE FROM temp.want_snap")
        self.conn.executemany("INSERT INTO temp.want_snap VALUES (?, ?)", path_shas)
        rows = self.conn.execute(
            "SELECT s.path, s.sha256, s.id FROM temp.want_snap w "
            "JOIN snapshots s ON s.path = w.path AND s.sha256 = w.sha256"
        ).fetchall()
        return {(p, h): i for p, h, i in rows}

    def snapshot_ids_by_sha(self, shas: Iterable[str]) -> dict[str, list[int]]:
        """Every snapshot id holding each text, whatever its path (a renamed gate keeps its reviews)."""
        out: dict[str, list[int]] = {}
        shas = list(set(shas))
        for i in range(0, len(shas), 500):
            chunk = shas[i : i + 500]
            marks = ",".join("?" * len(chunk))
            for sha, sid in self.conn.execute(
                f"SELECT sha256, id FROM snapshots WHERE sha256 IN ({marks})", chunk
            ):
                out.setdefault(sha, []).append(sid)
        return out

    # --- acceptance -------------------------------------------------------------------
    def accepted_as_is(
        self, partition: str, note_path: str, gate_id: str, note_sha: str, gate_sha: str
    ) -> bool:
        """Whether the pair's acceptance is for exactly these note and gate texts."""
        return (
            self.conn.execute(
                "SELECT 1 FROM acceptance a JOIN snapshots n ON n.id = a.note_snapshot_id "
                "JOIN snapshots g ON g.id = a.gate_snapshot_id WHERE a.model_partition = ? "
                "AND a.note_path = ? AND a.gate_id = ? AND n.sha256 = ? AND g.sha256 = ?",
                (partition, note_path, gate_id, note_sha, gate_sha),
            ).fetchone()
            is not None
        )

    def install_id(self) -> int:
        """This state folder's own name, drawn at random the first time it is asked for
        and kept: what a control claims a Redis database under (``queues.claim_queue``),
        the same for a control replaced on another host (a rollout) and another for
        another KB whatever its paths."""
        with self.write():
            self.conn.execute(
                "INSERT OR IGNORE INTO counters VALUES ('install_id', ?)",
                (secrets.randbits(62) + 1,),
            )
            return self.conn.execute(
                "SELECT value FROM counters WHERE name = 'install_id'"
            ).fetchone()[0]

    def acceptance_version(self) -> int:
        return self.conn.execute(
            "SELECT value FROM counters WHERE name = 'acceptance_version'"
        ).fetchone()[0]

    def acceptance_state(self) -> tuple[int, int]:
        """(version, epoch): what names the acceptance table's content for a cache. The
        version counts changes; the epoch, drawn at random at each, tells apart two
        histories of one copy of state.db that made as many changes."""
        rows = dict(
            self.conn.execute(
                "SELECT name, value FROM counters "
                "WHERE name IN ('acceptance_version', 'acceptance_epoch')"
            )
        )
        return rows.get("acceptance_version", 0), rows.get("acceptance_epoch", 0)

    def acceptance(self, model_partition: str, note_path: str, gate_id: str) -> Acceptance | None:
        row = self.conn.execute(
            "SELECT * FROM acceptance WHERE model_partition = ? AND note_path = ? AND gate_id = ?",
            (model_partition, note_path, gate_id),
        ).fetchone()
        return None if row is None else Acceptance(**dict(row))

    def acceptances_for(
        self, model_partition: str, gate_ids: Sequence[str], note_paths: Sequence[str] | None = None
    ) -> list[Acceptance]:
        marks = ",".join("?" * len(gate_ids))
        sql = f"SELECT * FROM acceptance WHERE model_partition = ? AND gate_id IN ({marks})"
        rows = self.conn.execute(sql, (model_partition, *gate_ids)).fetchall()
        out = [Acceptance(**dict(r)) for r in rows]
        if note_paths is not None:
            keep = set(note_paths)
            out = [a for a in out if a.note_path in keep]
        return out

    def scan_acceptance(
        self,
        model_partition: str,
        gates: Sequence[str],
        fresh_gate_snaps: Iterable[tuple[str, int]],
        notes: Sequence[str] | None = None,
    ) -> Iterator[tuple[str, int, int, int, str | None]]:
        """Per note with acceptance among ``gates``: (note_path, rows, min and max note
        snapshot id, the rows whose gate snapshot is not current as ``gate_id US
        gate_snap`` records joined by RS). ``fresh_gate_snaps`` are (gate_id, snapshot id)
        pairs: a snapshot holding one gate's current text says nothing of another gate's.

        One pass over the partition with no join: when min = max = the note's current
        snapshot, every row's note text is current and only the listed gate rows are
        stale. That is the bulk of a nightly KB, and it never becomes Python objects.
        ``notes`` limits the scan to some notes (``--note``).
        """
        c = self.conn
        c.execute(
            "CREATE TEMP TABLE IF NOT EXISTS scan_gates (gate_id TEXT PRIMARY KEY) WITHOUT ROWID"
        )
        c.execute(
            "CREATE TEMP TABLE IF NOT EXISTS scan_fresh_gates "
            "(gate_id TEXT, snap INTEGER, PRIMARY KEY (gate_id, snap)) WITHOUT ROWID"
        )
        c.execute(
            "CREATE TEMP TABLE IF NOT EXISTS scan_notes (path TEXT PRIMARY KEY) WITHOUT ROWID"
        )
        for table in ("scan_gates", "scan_fresh_gates", "scan_notes"):
            c.execute(f"DELETE FROM temp.{table}")
        c.executemany("INSERT INTO temp.scan_gates VALUES (?)", ((g,) for g in gates))
        c.executemany("INSERT OR IGNORE INTO temp.scan_fresh_gates VALUES (?, ?)", fresh_gate_snaps)
        where = ""
        if notes is not None:
            c.executemany("INSERT OR IGNORE INTO temp.scan_notes VALUES (?)", ((n,) for n in notes))
            where = " AND note_path IN temp.scan_notes"
        cur = c.execute(
            "SELECT note_path, count(*), min(note_snapshot_id), max(note_snapshot_id), "
            "group_concat(CASE WHEN (gate_id, gate_snapshot_id) IN temp.scan_fresh_gates THEN NULL "
            "ELSE gate_id || char(31) || gate_snapshot_id END, char(30)) "
            "FROM acceptance WHERE model_partition = ? AND gate_id IN temp.scan_gates"
            + where
            + " GROUP BY note_path",
            (model_partition,),
        )
        cur.row_factory = None
        yield from cur

    def acceptance_rows(self, model_partition: str, note_path: str) -> list[tuple[str, int, int]]:
        """(gate_id, note snapshot id, gate snapshot id) of one note's acceptance."""
        return [
            (r[0], r[1], r[2])
            for r in self.conn.execute(
                "SELECT gate_id, note_snapshot_id, gate_snapshot_id FROM acceptance "
                "WHERE model_partition = ? AND note_path = ?",
                (model_partition, note_path),
            )
        ]

    def existing_snapshots(self, ids: Iterable[int]) -> set[int]:
        out: set[int] = set()
        ids = list(set(ids))
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ",".join("?" * len(chunk))
            out.update(
                r[0]
                for r in self.conn.execute(f"SELECT id FROM snapshots WHERE id IN ({marks})", chunk)
            )
        return out

    def partitions_covering(self) -> set[tuple[str, str]]:
        """(note_path, gate_id) pairs with an acceptance in any partition."""
        return {
            (r[0], r[1])
            for r in self.conn.execute("SELECT DISTINCT note_path, gate_id FROM acceptance")
        }

    def partitions_instead(self, model: str) -> list[str]:
        """The partitions reviews are recorded in when ``model`` has none (a typo, most
        likely), else []; [] too before any review."""
        if self.conn.execute(
            "SELECT 1 FROM acceptance WHERE model_partition = ? LIMIT 1", (model,)
        ).fetchone():
            return []
        return [
            r[0]
            for r in self.conn.execute("SELECT DISTINCT model_partition FROM acceptance ORDER BY 1")
        ]

    def upsert_acceptance(
        self,
        *,
        model_partition: str,
        note_path: str,
        gate_id: str,
        review_pair_id: int,
        note_snapshot_id: int,
        gate_snapshot_id: int,
        decision: str,
        source: str = "review",
        at: str | None = None,
        note_commit: str | None = None,
    ) -> None:
        """``note_commit``: the commit HEAD was at when the accepted note text was taken
        (CONTRACT §10's recorded-commit; "" outside git, None unknown)."""
        self.conn.execute(
            "INSERT INTO acceptance (model_partition, note_path, gate_id, review_pair_id, "
            "note_snapshot_id, gate_snapshot_id, decision, source, accepted_at, note_commit) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (model_partition, note_path, gate_id) DO UPDATE SET "
            "review_pair_id = excluded.review_pair_id, note_snapshot_id = excluded.note_snapshot_id, "
            "gate_snapshot_id = excluded.gate_snapshot_id, decision = excluded.decision, "
            "source = excluded.source, accepted_at = excluded.accepted_at, "
            "note_commit = excluded.note_commit",
            (
                model_partition,
                note_path,
                gate_id,
                review_pair_id,
                note_snapshot_id,
                gate_snapshot_id,
                decision,
                source,
                at or utcnow(),
                note_commit,
            ),
        )

    def record_reviews(
        self, model_partition: str, records: Sequence[ReviewRecord], *, runner: str = "manual"
    ) -> int:
        """Record decisions as one completed job and accept every PASS/WARN/FAIL; returns the job id.

        This is the direct path used by tests, benchmarks and imports; queued work goes
        through finalize, which adds parsing and attempt fencing on top of the same rows.
        """
        now = utcnow()
        with self.write():
            job_id = self.conn.execute(
                "INSERT INTO review_jobs (status, model_partition, grouping, job_dir, runner, "
                "created_at, updated_at, finished_at) VALUES ('completed', ?, 'manual', '', ?, ?, ?, ?) "
                "RETURNING id",
                (model_partition, runner, now, now, now),
            ).fetchone()[0]
            for rec in records:
                note_snap = self.snapshot(rec.note_path, rec.note_text)
                gate_snap = self.snapshot(rec.gate_path, rec.gate_text)
                pair_id = self.conn.execute(
                    "INSERT INTO review_pairs (job_id, note_path, gate_id, gate_path, lens, "
                    "note_snapshot_id, gate_snapshot_id, decision, rationale, decided_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    (
                        job_id,
                        rec.note_path,
                        rec.gate_id,
                        rec.gate_path,
                        rec.lens,
                        note_snap,
                        gate_snap,
                        rec.decision,
                        rec.rationale,
                        now,
                    ),
                ).fetchone()[0]
                if rec.decision != "ERROR":
                    self.upsert_acceptance(
                        model_partition=model_partition,
                        note_path=rec.note_path,
                        gate_id=rec.gate_id,
                        review_pair_id=pair_id,
                        note_snapshot_id=note_snap,
                        gate_snapshot_id=gate_snap,
                        decision=rec.decision,
                        at=now,
                    )
        return job_id

    def active_pairs(self, partition: str | None = None) -> dict[tuple[str, str], tuple[int, str]]:
        """(note_path, gate_id) → (job id, status) for pairs inside a queued or running job
        (of ``partition`` only, when given: each partition reviews a pair on its own)."""
        sql = (
            "SELECT p.note_path, p.gate_id, j.id, j.status FROM review_pairs p JOIN review_jobs j "
            "ON j.id = p.job_id WHERE j.status IN ('queued', 'running') AND j.kind = 'review'"
        )
        args: tuple = ()
        if partition is not None:
            sql += " AND j.model_partition = ?"
            args = (partition,)
        return {(r[0], r[1]): (r[2], r[3]) for r in self.conn.execute(sql, args)}


def _statements(sql: str) -> list[str]:
    """Split a migration script into statements, keeping trigger bodies whole."""
    out: list[str] = []
    buf: list[str] = []
    for line in sql.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("--"):
            continue
        buf.append(line)
        text = "\n".join(buf)
        if stripped.endswith(";") and sqlite3.complete_statement(text):
            out.append(text)
            buf = []
    if buf:
        out.append("\n".join(buf))
    return out
