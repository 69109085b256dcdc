"""Opening a file that must be a regular file: an agent's output, the settings, a page
about to be replaced. A FIFO there would hold the read until someone writes to it, and a
symbolic link's bytes belong to whatever it points at, so neither is read."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

FOLDER, SYMLINK, SPECIAL = "a folder", "a symbolic link", "not a regular file"


class NotRegular(Exception):
    """What is at the path instead: :data:`FOLDER`, :data:`SYMLINK` or :data:`SPECIAL`
    (a FIFO, a socket, a device)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def open_regular(path: Path, follow: bool = True) -> int | None:
    """A descriptor of ``path`` opened to read without blocking, or None if nothing is
    there; with ``follow`` false a symbolic link is refused. Raises :class:`NotRegular`,
    or the OSError of a file that is there but cannot be opened (no permission)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise NotRegular(SYMLINK) from None
        if exc.errno in (errno.ENXIO, errno.ENODEV, errno.EOPNOTSUPP):
            # open(2) refuses a socket (and an absent device) before any fstat could.
            raise NotRegular(SPECIAL) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegular(FOLDER if stat.S_ISDIR(mode) else SPECIAL)
    return fd


def private(path: str | os.PathLike, flags: int, dir_fd: int | None = None) -> int:
    """``os.open`` of a file of the state folder, made owner-only (0600) whatever the
    umask: prompts, outputs, results and state.db quote notes, and the state folder may
    have been made wider by hand (systemd's ``StateDirectory=``). An ``opener`` for
    ``open``."""
    return os.open(path, flags, 0o600, dir_fd=dir_fd)


def make_private(path: Path) -> None:
    """``path`` made an empty owner-only file unless something is there: a database SQLite
    is about to make (its -wal and -shm take the database's mode). Never opened when it
    is there: closing a descriptor drops the process's locks on the file."""
    with contextlib.suppress(FileExistsError):
        os.close(private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC))


class NotAFolder(OSError):
    """A folder of the state folder that is a file, or a link to nothing, with the way out."""


def make_folder(path: Path, holds: str) -> None:
    """``path`` made (with its parents) if it is not there. One that is a file, or a link to
    a folder on a disk that is not mounted, failed as "[Errno 17] File exists": an internal
    error, or a reason at every job, naming neither the link nor the mount to mend.
    ``holds`` says what reviewq keeps in it."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        link = f"a link to {os.readlink(path)}, " if path.is_symlink() else ""
        why = link + ("a file" if path.exists() else "which is not there")
        raise NotAFolder(
            f"{path}: not a folder ({why}); reviewq keeps {holds} in it: mount or make what "
            "it links to, or move it aside"
        ) from None
