"""Files reviewq writes for people, all renderings of state.db: a job's MANIFEST.json and
per-pair result files (the export of CONTRACT §10 is :mod:`orchestrator.review.export`).

Every file is written atomically (a temp file in the same folder, then a rename), so a
reader never sees half a file and a crash leaves the old one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import itertools
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator import logs
from orchestrator.kb.atomicfile import atomic_write, name_head
from orchestrator.kb.gates import TYPE_LENS, parse_gate
from orchestrator.kb.notes import REGIONS
from orchestrator.regularfile import make_folder, private
from orchestrator.state.store import DISK_FULL, Store, json_column, reasons_column, utcnow

# A job id → its prompt.md text (None: the job has no job-level prompt). Prompts are
# rendered a layer above (orchestrator.review.jobs), which passes this in.
PromptRenderer = Callable[[int], "str | None"]

# A due row's error until a write is tried and fails.
NOT_TRIED = "not written yet"

# Due rows settled together (one transaction) by a pass of write_due_job_files.
SETTLE_EVERY = 64

# Why a folder was not written when another process held its lock (folder_lock without
# ``wait``): that process is writing it, which is routine, not a failure to say.
HELD = "another reviewq process is writing this folder"


# Where the folders of jobs and attempts state.db no longer records go, in STATE/jobs/
# (on the same disk as the folders, when jobs/ is a link to another).
LOST_HISTORY = "lost-history"


class ReportError(Exception):
    pass


def set_aside(jobs: Path, folder: Path, name: str, job_id: int, why: str) -> Path:
    """Move ``folder``, left by a history state.db no longer has (put back from a backup,
    its last commits lost), into ``jobs/lost-history/NAME.TIME``, and say so: its agents'
    outputs and logs are the only record of runs paid for, which a job or attempt given
    its number again must neither delete nor write among. Where it went."""
    aside = jobs / LOST_HISTORY
    aside.mkdir(mode=0o700, exist_ok=True)
    stamp = utcnow().replace(":", "").replace("-", "")
    for n in itertools.count():
        target = aside / (f"{name}.{stamp}" + (f"-{n}" if n else ""))
        if not (target.exists() or target.is_symlink()):
            break
    os.rename(folder, target)
    logs.get().warning(
        "job.folder_set_aside",
        job_id=job_id,
        folder=str(folder),
        moved_to=str(target),
        reason=why,
    )
    return target


def write_manifest(folder: Path, data: dict) -> None:
    # An open job's manifest is read by agents, a finished one by people: the indented
    # encoder is pure Python (~0.15 ms a job), which create-jobs pays thousands of times.
    indent = None if data["status"] in ("queued", "running") else 1
    text = json.dumps(data, indent=indent, ensure_ascii=False) + "\n"
    atomic_write(folder / "MANIFEST.json", text)


NAME_MAX = 255  # bytes in one file name (ext4, xfs, btrfs, tmpfs)


def flat(path: str, suffix: str = "") -> str:
    """A root-relative path as one file-name component: ``/`` becomes ``__``. A name over
    NAME_MAX bytes keeps its head and ends in ``~`` and a hash of the whole, so that a
    note with a long name (a title-as-claim) still has its files, each its own. So does a
    path the ``__`` could be read back from two ways (``a__b.md`` and ``a/b.md``; ``a_/b``
    and ``a/_b``), which shared one file: the one written last was the only one left."""
    name = path.replace("/", "__")
    ambiguous = "__" in path or "_/" in path or "/_" in path
    if not ambiguous and len(os.fsencode(name + suffix)) <= NAME_MAX:
        return name + suffix
    tag = "~" + hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    room = NAME_MAX - len(os.fsencode(tag + suffix))
    return name_head(name, room) + tag + suffix


def result_file_name(note_path: str, gate_id: str) -> str:
    return flat(f"{note_path}--{gate_id}", ".md")


def job_manifest(store: Store, job_id: int) -> dict:
    return _manifest(store, job_id, _pairs(store, job_id))


def _pairs(store: Store, job_id: int) -> list[sqlite3.Row]:
    return store.conn.execute(
        "SELECT p.*, n.sha256 AS note_sha256, g.sha256 AS gate_sha256, g.text AS gate_text "
        "FROM review_pairs p "
        "JOIN snapshots n ON n.id = p.note_snapshot_id JOIN snapshots g ON g.id = p.gate_snapshot_id "
        "WHERE p.job_id = ? ORDER BY p.id",
        (job_id,),
    ).fetchall()


def _manifest(store: Store, job_id: int, pairs: list[sqlite3.Row]) -> dict:
    job = store.conn.execute("SELECT * FROM review_jobs WHERE id = ?", (job_id,)).fetchone()
    if job is None:
        raise ReportError(f"no review job {job_id}")
    attempts = store.conn.execute(
        "SELECT attempt, runner, outcome, exit_code, started_at, ended_at, reasons, num_turns, "
        "input_tokens, output_tokens, cost_usd, duration_s FROM attempts WHERE job_id = ? ORDER BY attempt",
        (job_id,),
    ).fetchall()
    links = {}
    if job["kind"] != "review":
        links = {k: job[k] for k in ("note_path", "source_job_id", "feedback")}
    return {
        "review_job_id": job_id,
        "kind": job["kind"],
        **links,
        "status": job["status"],
        "model_partition": job["model_partition"],
        "grouping": job["grouping"],
        "lens": job["lens"],
        "reviewer": job["reviewer"],
        "prompt_path": "prompt.md",
        "bundle_output_path": "bundle-output.md",
        "created_at": job["created_at"],
        "finished_at": job["finished_at"],
        "failure_reasons": reasons_column(job["failure_reasons"]),
        "provenance": {k: job[k] for k in ("runner", "model", "effort")}
        | {"telemetry": json_column(job["telemetry_json"])},
        "attempts": [{**dict(a), "reasons": reasons_column(a["reasons"])} for a in attempts],
        "pairs": [
            {
                "note_path": p["note_path"],
                "gate_id": p["gate_id"],
                "gate_path": p["gate_path"],
                "lens": p["lens"],
                "watches": _watches(p["gate_path"], p["lens"], p["gate_text"]),
                "note_sha256": p["note_sha256"],
                "gate_sha256": p["gate_sha256"],
                "decision": p["decision"],
                "result_path": f"results/{result_file_name(p['note_path'], p['gate_id'])}"
                if p["decision"]
                else None,
            }
            for p in pairs
        ],
    }


@functools.lru_cache(maxsize=1024)
def _watches(gate_path: str, lens: str, gate_text: str) -> list[str] | None:
    """The regions a pair's gate watches, from the gate text the job was made with
    (agents such as the offline reviewer read them from the manifest)."""
    if lens == TYPE_LENS:
        return list(REGIONS)
    try:
        return list(parse_gate(gate_path, gate_text.encode("utf-8")).watches)
    except ValueError:  # a gate gone or broken since: the agent falls back to every region
        return None


def write_job_files(
    store: Store, job_dir: Path, job_id: int, prompt: PromptRenderer | None = None
) -> None:
    """A job's folder regenerated from the database: MANIFEST.json, one result file per
    decided pair, and (given ``prompt``, if missing) the job's prompt.md."""
    job_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if prompt is not None and not (job_dir / "prompt.md").exists():
        text = prompt(job_id)
        if text is not None:
            atomic_write(job_dir / "prompt.md", text)
    pairs = _pairs(store, job_id)
    manifest = _manifest(store, job_id, pairs)
    rows = [p for p in pairs if p["decision"] is not None]
    if rows:
        # The whole results/ folder is built aside and renamed into place, so a reader
        # sees the old set or the new one, at the cost of one rename, not one per file.
        staging = _staging_folder(job_dir)
        try:
            for p in rows:
                text = (
                    f"# {p['gate_id']} — {p['note_path']}\n\n"
                    f"- decision: {p['decision']}\n- job: {job_id}\n"
                    f"- model partition: {manifest['model_partition']}\n"
                    f"- gate: {p['gate_path']}\n- decided at: {p['decided_at']}\n\n"
                    f"{(p['rationale'] or '').strip()}\n\n## Result: {p['decision']}\n"
                )
                name = staging / result_file_name(p["note_path"], p["gate_id"])
                with open(name, "w", encoding="utf-8", opener=private) as f:
                    f.write(text)
            _swap_folder(staging, job_dir / "results")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    elif (results := job_dir / "results").exists() or results.is_symlink():
        # Decisions state.db does not hold (put back from a backup, its last commits lost):
        # a FAIL shown beside a MANIFEST.json that says queued.
        _remove(results)
    write_manifest(job_dir, manifest)


def write_job_files_after_commit(
    store: Store,
    state_dir: Path,
    job_ids: int | Sequence[int],
    prompt: PromptRenderer | None = None,
) -> None:
    """Render jobs' files once the transaction that changed them commits. The jobs are
    marked due in that same transaction, so files a crash or a full disk kept from being
    written are written by :func:`write_due_job_files` (the control process's tick)."""
    ids = [job_ids] if isinstance(job_ids, int) else list(job_ids)
    mark_job_files_due(store, ids)
    store.after_commit(lambda: write_due_job_files(store, state_dir, ids, prompt, late=False))


def mark_job_files_due(store: Store, job_ids: Sequence[int]) -> None:
    """Mark jobs' files to be rendered again, in the caller's transaction: the control
    process's tick writes them (:func:`write_due_job_files`) when no writer follows."""
    now = utcnow()
    with store.write():
        # A random generation at each marking: a count would start again at the same
        # value once a writer cleared the row, and a writer that read the old row would
        # then clear the new one as well.
        store.conn.executemany(
            "INSERT INTO job_files_due (job_id, since, error, generation) VALUES (?, ?, ?, random()) "
            "ON CONFLICT (job_id) DO UPDATE SET generation = random()",
            [(i, now, NOT_TRIED) for i in job_ids],
        )


def write_due_job_files(
    store: Store,
    state_dir: Path,
    job_ids: Sequence[int] | None = None,
    prompt: PromptRenderer | None = None,
    *,
    late: bool = True,
) -> int:
    """Write the files of due jobs (``job_ids``, else every due job); the number written.

    Two processes may write one job's files (the control process, a command run by hand):
    each renders what state.db holds when it holds the job folder's lock, so the last one
    to write shows the last decision, and a due row is cleared only by a writer that read
    its generation before it rendered (a decision made meanwhile keeps the row)."""
    sql = (
        "SELECT d.job_id, j.job_dir, d.error, d.generation "
        "FROM job_files_due d JOIN review_jobs j ON j.id = d.job_id"
    )
    ids = None if job_ids is None else list(job_ids)
    params: tuple[str, ...] = ()
    if late and ids is None and folders_being_written(state_dir):
        # The tick: those not tried yet are an enqueue's, which writes them now (a
        # sweep's control starts at its commit; a tick meanwhile wrote each a second time).
        sql, params = sql + " WHERE d.error != ?", (NOT_TRIED,)
    if ids is not None and len(ids) <= 500:
        # Only these rows (dispatch asks about every job it opens, most of them not due).
        rows = store.conn.execute(f"{sql} WHERE d.job_id IN ({', '.join('?' * len(ids))})", ids)
    else:
        rows = store.conn.execute(sql + " ORDER BY d.job_id", params)
    due = {r[0]: (r[1], r[2], r[3]) for r in rows}
    if ids is not None:
        due = {i: due[i] for i in ids if i in due}  # others were written meanwhile

    def write(i: int) -> None:
        job_dir = state_dir / due[i][0]

        def make() -> None:
            make_folder(job_dir.parent, "its job folders")
            job_dir.mkdir(mode=0o700, exist_ok=True)

        # Made only when the lock finds no folder: most are there (a job's end, a
        # dispatch), and three mkdirs of a folder that is there cost more than its lock.
        with folder_lock(job_dir, wait=store.waits_for_folders, make=make, own="a job's files"):
            write_job_files(store, job_dir, i, prompt)

    batch = store.after_callbacks("job_files_due", _DueSettled)
    if batch is not None:
        # Written by an earlier callback of this commit, its row not settled yet.
        due = {i: d for i, d in due.items() if batch.generations.get(i) != d[2]}
    done = 0
    order = list(due)
    # Settled a chunk at a time: a sweep's control starts at its commit and writes again
    # the folder of each job it dispatches whose row is still due, which, settled once at
    # the end of a pass over a thousand folders, was every job dispatched meanwhile.
    for start in range(0, len(order), SETTLE_EVERY):
        chunk = order[start : start + SETTLE_EVERY]
        written, failed = write_each(
            {i: due[i][1] for i in chunk}, write, what="job.files", key="job_id", late=late
        )
        generations = {i: due[i][2] for i in written}
        if batch is None:
            settle_due(store, "job_files_due", "job_id", written, failed, generations)
        else:  # a commit's jobs: their rows settled together once its callbacks ran
            batch.add(written, failed, generations)
        done += len(written)
        if any(disk_full(error) for error in failed.values()):
            break  # as write_each stops: every later file would fail alike
    return done


class _DueSettled:
    """The job_files_due rows of one commit's jobs, settled in one transaction once its
    callbacks have written their folders: one a job was ~25 µs of the control's per-job
    work (stop 33). A row is kept due until then, so a crash between the two writes the
    folder again at the next tick, as a crash before a job's own settle did."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.written: list[int] = []
        self.failed: dict[int, str] = {}
        self.generations: dict[int, int] = {}

    def add(self, written: list[int], failed: dict[int, str], generations: dict[int, int]) -> None:
        self.written += written
        self.failed.update(failed)
        self.generations.update(generations)
        for i in written:
            self.failed.pop(i, None)
        if len(self.written) + len(self.failed) >= SETTLE_EVERY:
            self()  # a chunk at a time, as a pass alone: an enqueue's thousand folders

    def __call__(self) -> None:
        if self.written or self.failed:
            settle_due(
                self.store, "job_files_due", "job_id", self.written, self.failed, self.generations
            )
        self.written, self.failed, self.generations = [], {}, {}


@contextlib.contextmanager
def writing_job_folders(state_dir: Path):
    """Held (a shared lock on the state folder) by a process from before it commits jobs
    until it has written their folders, while other processes run beside it (a sweep's
    children start at its commit): the control's tick leaves the folders not tried yet
    to it. The kernel lets go of it when its holder dies, and the tick writes them then."""
    fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def folders_being_written(state_dir: Path) -> bool:
    """Whether a process holds :func:`writing_job_folders` now."""
    try:
        fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it the lock, if taken
    return False


def manifest_written(folder: Path) -> bool:
    """Whether a job folder's MANIFEST.json is there. One that cannot be looked at (a
    folder this user may not search: EACCES, which ``is_file`` raises) is not: raised, it
    ended the whole dispatch pass, every other job's with it, at each dispatch."""
    try:
        return (folder / "MANIFEST.json").is_file()
    except OSError:
        return False


def unwritten_job_folder(store: Store, folder: Path, job_id: int) -> str | None:
    """Why a job's folder is not there for its agent (a file where it was, a full disk
    that kept its write back), or None when its MANIFEST.json is. The manifest decides,
    not the due row alone: another process may mark the job again after this one wrote
    it. An agent started without it fails, and its failure is counted against the profile
    for what is the machine's fault."""
    if manifest_written(folder):
        return None
    left = store.conn.execute(
        "SELECT error FROM job_files_due WHERE job_id = ?", (job_id,)
    ).fetchone()
    return left[0] if left is not None and left[0] != NOT_TRIED else "no MANIFEST.json in it"


def held(error: str | None) -> bool:
    """Whether a recorded write error is a folder another process held (:data:`HELD`)."""
    return bool(error) and HELD in error


def held_job_folders(store: Store) -> list[tuple[int, str]]:
    """The due jobs (id, job_dir) whose last try found their folder held by another
    process."""
    return store.conn.execute(
        "SELECT d.job_id, j.job_dir FROM job_files_due d JOIN review_jobs j ON j.id = d.job_id "
        "WHERE instr(d.error, ?) ORDER BY d.job_id",
        (HELD,),
    ).fetchall()


class FolderHeld(BlockingIOError):
    """A folder lock another process held when this one would not wait for it."""


class LockHeld(BlockingIOError):
    """A folder lock another process still held when the wait for it ran out."""

    def __init__(self, folder: Path, holder: int | None) -> None:
        super().__init__(errno.EWOULDBLOCK, "another reviewq process holds its lock", str(folder))
        self.holder = holder


_NEXT_TICK = "remove the link and the next tick writes them"


class LinkedFolder(OSError):
    """A folder of the state folder's own replaced by a link (an agent's doing, or a
    person's): written through, a job's MANIFEST.json went over a file out there and that
    folder's own results/ was renamed aside and removed."""

    def __init__(self, folder: Path, holds: str, then: str = _NEXT_TICK) -> None:
        try:
            link = f"a link to {os.readlink(folder)}"
        except OSError:  # removed since: said as it was met
            link = "a link"
        super().__init__(
            errno.ELOOP,
            f"{link}, not a folder of the state folder; reviewq "
            f"writes {holds} only in its own folder: {then}",
            str(folder),
        )


def open_own_folder(folder: Path, holds: str, depth: int = 1, then: str = _NEXT_TICK) -> int:
    """A descriptor of ``folder``, a folder of the state folder's own, it and its parents
    up to ``depth`` levels opened without following a link put in their place
    (:class:`LinkedFolder`); the folder above them may be a link (``jobs/`` kept on
    another disk)."""
    names = []
    base = folder
    for _ in range(depth):
        names.append(base.name)
        base = base.parent
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        path = base
        for name in reversed(names):
            path = path / name
            try:
                inner = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
            except OSError:
                if os.path.islink(path):
                    raise LinkedFolder(path, holds, then) from None
                raise
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def folder_lock(
    folder: Path,
    wait: bool = True,
    on_wait: Callable[[], None] | None = None,
    timeout: float | None = None,
    make: Callable[[], None] | None = None,
    own: str | None = None,
):
    """An exclusive lock on ``folder`` itself (flock on its descriptor): no lock file to
    leave behind, and the kernel lets go of it when its holder dies. Without ``wait``, a
    folder another process holds raises :class:`FolderHeld` (its job's files are tried
    again later).
    ``on_wait`` is called once before waiting for another holder (a person at a terminal
    is told why the command pauses); with ``timeout`` (seconds) the wait ends there in
    :class:`LockHeld`, naming the holder when the kernel says it. ``make`` makes a folder
    that cannot be opened (not there, or not a folder: its error is then make's). ``own``
    (what reviewq keeps in it): a folder of the state folder's own, which a link in its
    place is refused for (:class:`LinkedFolder`), never written through."""
    flags = os.O_RDONLY | os.O_DIRECTORY | (os.O_NOFOLLOW if own else 0)
    try:
        fd = os.open(folder, flags)
    except OSError:
        if own and os.path.islink(folder):
            raise LinkedFolder(folder, own) from None
        if make is None:
            raise
        make()
        fd = os.open(folder, flags)
    try:
        # Asked without blocking first whenever a wait is to be told of or bounded.
        blocking = wait and on_wait is None and timeout is None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            if not wait:
                raise FolderHeld(errno.EWOULDBLOCK, HELD, str(folder)) from None
            if on_wait is not None:
                on_wait()
            if timeout is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            elif not _flock_within(fd, timeout):
                raise LockHeld(folder, flock_holder(folder)) from None
        yield
    finally:
        os.close(fd)


def _flock_within(fd: int, timeout: float) -> bool:
    """Whether the lock was taken within ``timeout`` seconds. flock has no timeout of its
    own (a SIGALRM would reach whatever thread the caller runs), so it is asked again at
    short intervals."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(0.1, left))


def flock_holder(path: Path) -> int | None:
    """The process holding a flock on ``path``, as Linux's /proc/locks says; None where
    it does not (another system, or the lock let go meanwhile)."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        fields = line.split()
        # "N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE START END"; a waiter's has "->".
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key:
            with contextlib.suppress(ValueError):
                return int(fields[4])
    return None


def settle_due(
    store: Store,
    table: str,
    key: str,
    done: Sequence[int],
    failed: dict[int, str],
    generations: dict[int, int] | None = None,
) -> None:
    """Clear the due rows of what was written and record why the others were not. When
    state.db cannot take it (locked past its busy timeout, on the full disk too) the rows
    stay, the next tick writes those files again, and the log says why. With
    ``generations`` (id → the row's generation read before rendering), a row marked due
    again since is kept."""
    if not done and not failed:  # no transaction: dispatch asks about every job it opens
        return
    try:
        with store.write():
            if generations is None:
                store.conn.executemany(f"DELETE FROM {table} WHERE {key} = ?", [(i,) for i in done])
            else:
                store.conn.executemany(
                    f"DELETE FROM {table} WHERE {key} = ? AND generation = ?",
                    [(i, generations[i]) for i in done],
                )
            store.conn.executemany(
                f"UPDATE {table} SET error = ? WHERE {key} = ?",
                [(e, i) for i, e in failed.items()],
            )
    except sqlite3.Error as exc:
        logs.get().warning(
            "files_due.not_cleared",
            table=table,
            rows=len(done) + len(failed),
            error=str(exc),
            recovery="the files are written again at the next tick",
        )


class Later(Exception):
    """Raised by a ``write_each`` writer whose work cannot be finished now and is tried
    again at the next tick (not a failure: a lock another program holds for a while).
    ``event`` is logged as a warning when its reason is new, with ``fields`` (what the
    row is about: the id alone names nothing the operator knows)."""

    def __init__(self, event: str, reason: str, **fields: object) -> None:
        super().__init__(reason)
        self.event = event
        self.fields = fields


def write_each(
    due: dict[int, str],
    write: Callable[[int], bool | None],
    *,
    what: str,
    key: str,
    late: bool,
) -> tuple[list[int], dict[int, str]]:
    """Write the renderings of due rows (id → the error the last try recorded): the ids
    settled, and the errors of the others. ``write`` returns False for a row settled with
    nothing written (a fix a person's edit kept out of the KB). A full disk stops the
    pass, since every later file would fail alike; any other failure costs that row's
    files only. A failure is logged (``WHAT_failed``) when its reason is new, not again at
    every tick; a folder another process holds (:class:`FolderHeld`) is recorded and not
    logged here: its holder is writing it (one held past a tick, the control warns of:
    ``Control._say_long_held``)."""
    written: list[int] = []
    failed: dict[int, str] = {}
    for i, before in due.items():
        try:
            wrote = write(i)
        except Later as exc:
            failed[i] = str(exc)
            if str(exc) != before:
                logs.get().warning(
                    exc.event,
                    **{key: i},
                    **exc.fields,
                    reason=str(exc),
                    recovery="tried again at each tick",
                )
            continue
        except FolderHeld as exc:
            # Its holder is writing it (an enqueue's folders follow its commit): recorded,
            # so that the next tick tries it if that holder dies, and not said.
            failed[i] = str(exc)
            continue
        except Exception as exc:  # whatever it is, it must not keep the others unwritten
            error = str(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
            failed[i] = error
            if _reason(error) != _reason(before):
                logs.get().error(
                    f"{what}_failed",
                    **{key: i},
                    error=error,
                    recovery="state.db holds what they render; the control process writes "
                    "them again at each tick until it can",
                )
            if isinstance(exc, OSError) and exc.errno in DISK_FULL:
                break
            continue
        written.append(i)
        if late and wrote is not False:
            logs.get().info(f"{what}_written", **{key: i}, late=True)
    return written, failed


def _reason(error: str) -> str:
    """An error without its file name ("[Errno 28] No space left on device"), to tell a
    new reason from the same one met again (temp file names differ every time)."""
    return error.split(": '", 1)[0]


_staged = itertools.count()


def _staging_folder(job_dir: Path) -> Path:
    """A new empty folder beside results/ (0700, as mkdtemp's), named by this process's pid
    and a counter: a leftover of a dead process with the same pid is skipped."""
    for _ in range(100):
        path = job_dir / f".results.{os.getpid()}-{next(_staged)}"
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free staging folder name in {job_dir}")


def _swap_folder(new: Path, target: Path) -> None:
    # A link counts as there even when it names nothing: renamed over, it failed every
    # rewrite ("Not a directory").
    if target.exists() or target.is_symlink():
        # Named as the staging folder was, not by the pid alone: a leftover of a process
        # killed during the rmtree below (pids repeat in containers) would make every
        # later rename fail with ENOTEMPTY, and the job's files stay stale for good.
        old = target.with_name(f".{target.name}.old.{new.name.rsplit('.', 1)[-1]}")
        _remove(old)
        os.rename(target, old)
        os.rename(new, target)
        _remove(old)
    else:
        os.rename(new, target)


def _remove(path: Path) -> None:
    """What was moved aside, whatever a person made it: rmtree fails on a file or a link
    (and must not follow a link into the person's own folder), and its error, ignored,
    left the thing in the job folder. A folder alone is rmtree's: it opens what it is
    given, and a FIFO held the rewrite (the control's tick too) until a writer came."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def unrecorded_job_folders(store: Store, state_dir: Path) -> list[int]:
    """The numbers of the folders in jobs/ past the last job state.db records: a history
    it no longer has (put back from a backup, or its last commits lost to a power cut),
    which nothing else tells, and whose folders the next jobs of those numbers set aside.
    Jobs are never deleted, so a number past the last is no job of this record's."""
    (last,) = store.conn.execute("SELECT coalesce(max(id), 0) FROM review_jobs").fetchone()
    found = []
    try:
        with os.scandir(state_dir / "jobs") as entries:
            for e in entries:
                head, _, number = e.name.rpartition("-")
                if head == "review-job" and number.isdigit() and int(number) > last:
                    found.append(int(number))
    except OSError:
        return []  # none, or a jobs/ doctor names otherwise
    return sorted(found)


def missing_job_files(store: Store, state_dir: Path) -> int:
    """Queued or running jobs whose folder has no MANIFEST.json (an agent reads it) or, a
    review job's, no prompt.md (a person does: doctor said "ok" of one deleted), and is
    not waiting to be written. An ended job's folder may be deleted to free a disk
    (OPERATIONS 6.4); ``reviewq rewrite-files`` brings it back."""
    return sum(
        not (state_dir / job_dir / "MANIFEST.json").is_file()
        or (kind == "review" and not (state_dir / job_dir / "prompt.md").is_file())
        for job_dir, kind in store.conn.execute(
            "SELECT job_dir, kind FROM review_jobs WHERE status IN ('queued', 'running') "
            "AND id NOT IN (SELECT job_id FROM job_files_due)"
        )
    )


def disk_full(error: str | None) -> bool:
    """Whether a recorded write error (an OSError as text) is a full disk or quota."""
    return bool(error) and any(error.startswith(f"[Errno {n}]") for n in DISK_FULL)


def files_due(store: Store) -> tuple[int, str | None]:
    """How many jobs' files wait to be written, and one error that kept them back: a write
    that failed before one not tried yet (doctor says ok of those alone)."""
    return store.conn.execute(
        "SELECT count(*), coalesce(min(CASE WHEN error != ?1 THEN error END), min(error)) "
        "FROM job_files_due",
        (NOT_TRIED,),
    ).fetchone()


def first_failure(errors: list[str]) -> str | None:
    """A write that failed before one not tried yet: doctor says ok of those alone."""
    return next((e for e in errors if e != NOT_TRIED), errors[0] if errors else None)


NO_CONTROL = "no control process runs for this state folder"


def written_when(error: str | None, rewrite: str | None, control: bool = True) -> str:
    """When files kept back by ``error`` get written: room is what a full disk needs; any
    other error (a folder the service user may not write, an I/O error) is mended by a
    person, whatever the tick does. ``rewrite``: the command that writes them now.
    ``control``: whether a control process runs to do it (doctor said "the control
    process writes them at its next tick" with none running, and the files waited)."""
    if not control and not held(error):
        now = f": {rewrite}" if rewrite else ": they wait for one (reviewq control)"
        if error == NOT_TRIED:
            return NO_CONTROL + now
        if disk_full(error):
            return f"make room; {NO_CONTROL}{now}"
        return f"mend the cause; {NO_CONTROL}{now}"
    if error == NOT_TRIED:
        return "the control process writes them at its next tick"
    if disk_full(error):
        return "the control process writes them at its next tick with room"
    if held(error):
        # Not rewrite-files: it waits for that lock, silently, as long as it is held.
        return (
            "the control process writes them once that process lets go of the folder; one "
            "stopped (Ctrl-Z) or hung holds it for good: resume or end it (the log's "
            "job.folder_held names its pid)"
        )
    return "the control process tries again at each tick; mend the cause" + (
        f" ({rewrite})" if rewrite else ""
    )
