"""The one way reviewq replaces a file: a temp file in the same folder, then a rename, so a
reader sees the old file or the new one, never half of one, and a crash leaves the old."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import stat
from pathlib import Path

from orchestrator.regularfile import NotRegular, open_regular

# Temp names: this process's pid and a counter (O_EXCL still refuses a leftover of a dead
# process that had the same pid). tempfile.mkstemp's random names cost more than the write.
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_FLAGS |= getattr(os, "O_NOFOLLOW", 0)
_serial = itertools.count()


def mode_of(path: Path, dir_fd: int | None = None) -> int:
    """The permissions of an existing file, for a replacement that keeps them (with
    ``dir_fd``, ``path``'s name in that folder)."""
    if dir_fd is not None:
        return stat.S_IMODE(os.stat(path.name, dir_fd=dir_fd).st_mode)
    return stat.S_IMODE(path.stat().st_mode)


# Bytes of the target's name a temp name keeps: a name near the file system's 255 would
# not fit with the pid and counter beside it, and the file could never be replaced.
_TEMP_HEAD = 200


def name_head(name: str, size: int) -> str:
    """The first ``size`` bytes of a file name, a character cut in two left out."""
    return os.fsencode(name)[:size].decode("utf-8", "ignore")


def _create(path: Path, dir_fd: int | None = None) -> tuple[int, str]:
    """A new temp file beside ``path`` (0600 before the umask, as mkstemp's), its folder
    made if it is missing; with ``dir_fd``, in that folder (its name alone returned)."""
    folder = "" if dir_fd is not None else os.fspath(path.parent)
    head = name_head(path.name, _TEMP_HEAD)
    for attempt in range(100):
        tmp = os.path.join(folder, f".{head}.{os.getpid()}-{next(_serial)}.tmp")
        try:
            return os.open(tmp, _FLAGS, 0o600, dir_fd=dir_fd), tmp
        except FileExistsError:
            continue
        except FileNotFoundError:
            if attempt or dir_fd is not None:
                raise
            path.parent.mkdir(parents=True, exist_ok=True)
    raise FileExistsError(f"no free temp name beside {path}")


# A pid as the kernel gives them (at most 2**22): a longer number is no temp file of ours.
_TEMP_NAME = re.compile(r"\.(?P<head>.+)\.(?P<pid>[1-9]\d{0,6})-\d+\.tmp")


def clear_leftovers(path: Path, dir_fd: int | None = None) -> int:
    """Remove the temp files a write of ``path`` left when its process was killed (SIGKILL,
    a power cut): in a notes folder, a person's ``git add -A`` took one in. Only those of
    a process that is gone; the number removed. ``dir_fd``: as :func:`atomic_write`'s."""
    head = name_head(path.name, _TEMP_HEAD)
    removed = 0
    try:
        entries = os.scandir(path.parent if dir_fd is None else dir_fd)
    except OSError:
        return 0
    with entries:
        for entry in entries:
            m = _TEMP_NAME.fullmatch(entry.name)
            if m is None or m["head"] != head or _alive(int(m["pid"])):
                continue
            with contextlib.suppress(OSError):
                os.unlink(entry.path, dir_fd=dir_fd)  # a scan of a descriptor: its name alone
                removed += 1
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def _of_target(exc: OSError, path: Path) -> OSError:
    """The error of a write, naming the file written rather than its temp file: a person
    told "Is a directory: .gate_reviews.csv.4242-3.tmp" looks for a file that never was."""
    named = [os.path.basename(os.fspath(n)) for n in (exc.filename, exc.filename2) if n]
    if exc.errno is None or not any(_TEMP_NAME.fullmatch(n) for n in named):
        return exc  # a folder that could not be made names that folder
    return OSError(exc.errno, exc.strerror, os.fspath(path))


def atomic_write(
    path: Path,
    data: str | bytes,
    *,
    durable: bool = False,
    mode: int | None = None,
    dir_fd: int | None = None,
) -> None:
    """Write ``data`` to ``path`` via a temp file and a rename. ``durable`` syncs the data
    before the rename: a person's note needs it; files regenerable from state.db skip it
    (a crash can lose them, never leave half of one). ``mode``: the new file's permissions
    (default 0600, the owner's only). ``dir_fd``: a descriptor of ``path``'s folder, in
    which ``path.name`` is written: the file lands in that folder even if a link is put
    on its path meanwhile."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    target = path.name if dir_fd is not None else path
    try:
        fd, tmp = _create(path, dir_fd)
    except OSError as exc:
        raise _of_target(exc, path) from None
    try:
        with open(fd, "wb", closefd=True) as f:
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode, dir_fd=dir_fd)
        os.replace(tmp, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        if isinstance(exc, OSError):
            raise _of_target(exc, path) from None
        raise
    if durable:
        # The rename itself lives in the folder: without this a power cut can undo it
        # while state.db (and git) already say the note was written.
        if dir_fd is not None:
            os.fsync(dir_fd)
            return
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def replace_if_changed(path: Path, data: str | bytes, mode: int | None = None) -> bool:
    """``path`` written as :func:`atomic_write` writes it (``mode`` too), unless it holds
    ``data`` already, with that mode: a view rendered whole on every run (the export's
    12,832 files of a real KB) keeps the files whose bytes are the same as they were,
    inode and mtime too, so `git status` and a backup do not read them all again. Whatever
    is there and not a regular file (a link, a folder) goes to the write, which replaces
    it or says why not. True when written."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if _holds(path, raw, mode):
        return False
    atomic_write(path, raw, mode=mode)
    return True


def _holds(path: Path, raw: bytes, mode: int | None) -> bool:
    try:
        fd = open_regular(path, follow=False)
    except (NotRegular, OSError):
        return False  # a link is not read: its bytes are whatever it points at
    if fd is None:
        return False
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if mode is not None and st.st_mode & 0o7777 != mode:
            return False
        # The size first: a changed file is told without a read, most often.
        return st.st_size == len(raw) and f.read(len(raw) + 1) == raw
