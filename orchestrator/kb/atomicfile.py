"""The one way reviewq replaces a file: a temp file in the same folder, then a rename, so a
reader sees the old file or the new one, never half of one, and a crash leaves the old."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


def mode_of(path: Path) -> int:
    """The permissions of an existing file, for a replacement that keeps them."""
    return stat.S_IMODE(path.stat().st_mode)


def atomic_write(
    path: Path, data: str | bytes, *, durable: bool = False, mode: int | None = None
) -> None:
    """Write ``data`` to ``path`` via a temp file and a rename. ``durable`` syncs the data
    before the rename: a person's note needs it; files regenerable from state.db skip it
    (a crash can lose them, never leave half of one). ``mode``: the new file's permissions
    (default 0600, the owner's only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
