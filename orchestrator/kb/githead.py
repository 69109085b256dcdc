"""The commit a KB's HEAD is at, read from git's own files (CONTRACT §10's
``recorded-commit``, kept with each job's snapshot of a note).

Read where jobs are made (a sweep's batch, the control's re-review of a fix): a ``git``
process each time was milliseconds a job where the control makes a thousand in seconds;
these are a few small reads, and outside git two stats in each folder up to ``/`` (the
folder's file system, its ``.git``).
Only what git itself keeps as plain files is read (a ``.git`` folder or a ``.git`` file
naming one, a worktree's ``commondir``, loose refs and ``packed-refs``); a layout it
cannot read with certainty (the reftable format, a ref it cannot make out) is unknown,
not guessed.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# A symbolic ref naming another one, naming another: git gives up after five.
_MAX_DEPTH = 5


def head_commit(root: Path) -> str | None:
    """The commit HEAD of the repository holding ``root`` is at (a branch's tip or a
    detached HEAD's commit): "" outside git or before the first commit, None when git's
    files cannot say it with certainty."""
    try:
        git_dir = _git_dir(root)
    except (OSError, ValueError):
        return None  # a .git file or a folder that cannot be read: git cannot say either
    if git_dir is None:
        return ""
    try:
        head = _text(git_dir / "HEAD")
        common = git_dir
        if (git_dir / "commondir").exists():  # a worktree's folder: refs are the repository's
            common = git_dir / _text(git_dir / "commondir")
    except (OSError, ValueError):
        return None
    if (common / "reftable").is_dir():
        return None  # git's binary ref tables: HEAD there reads "ref: refs/heads/.invalid"
    for _ in range(_MAX_DEPTH):
        if not head.startswith("ref:"):
            return head if _SHA.fullmatch(head) else None
        head = _ref(git_dir, common, head[4:].strip())
        if head is None:
            return None
        if not head:
            return ""  # a branch with no commit yet (``git init``)
    return None


def _git_dir(root: Path) -> Path | None:
    """The git folder of the work tree ``root`` is in, as git finds it: the nearest
    ``.git`` up from ``root`` (a folder, or a file naming one: a worktree, a submodule),
    not above a folder of GIT_CEILING_DIRECTORIES (the person's fence, which a fix commit
    keeps too: ``gitcommit.git_env``) nor past the edge of ``root``'s file system (unless
    GIT_DISCOVERY_ACROSS_FILESYSTEM). OSError when a ``.git`` file cannot be read,
    ValueError when it is not one git reads (git stops there)."""
    fences = _ceilings()
    device = None if _across_file_systems() else os.stat(root).st_dev
    for folder in (root, *root.parents):
        if folder != root:
            if str(folder) in fences:
                return None
            if device is not None and os.stat(folder).st_dev != device:
                return None  # a mount point: git says "not a git repository"
        dot = folder / ".git"
        try:
            mode = os.stat(dot).st_mode  # one call a folder: a KB outside git stats each
        except OSError:
            continue
        if stat.S_ISDIR(mode):
            return dot
        if stat.S_ISREG(mode):
            line = _text(dot)
            if not line.startswith("gitdir:"):
                raise ValueError(f"{dot}: invalid gitfile format")
            return folder / line[len("gitdir:") :].strip()
    return None


def _ceilings() -> set[str]:
    """GIT_CEILING_DIRECTORIES as git compares them with the folders it goes up through
    (real paths, as ``root`` is): each entry with its links resolved, but those after an
    empty entry, which git takes as written; relative entries git ignores."""
    fences = set()
    as_written = False
    for entry in os.environ.get("GIT_CEILING_DIRECTORIES", "").split(os.pathsep):
        if not entry:
            as_written = True
        elif os.path.isabs(entry):
            fences.add(entry if as_written else os.path.realpath(entry))
    return fences


def _across_file_systems() -> bool:
    """GIT_DISCOVERY_ACROSS_FILESYSTEM, read as git reads a boolean."""
    value = os.environ.get("GIT_DISCOVERY_ACROSS_FILESYSTEM", "").strip().lower()
    if value in ("true", "yes", "on"):
        return True
    return value.isdigit() and int(value) != 0


def _text(path: Path) -> str:
    """A file of git's, stripped: ref names are bytes to git, whatever their encoding, and
    ``surrogateescape`` gives a path back those same bytes."""
    return path.read_bytes().decode("utf-8", "surrogateescape").strip()


def _ref(git_dir: Path, common: Path, name: str) -> str | None:
    """What ref ``name`` holds (a sha, or "ref: …" for a symbolic one); "" when it does not
    exist, None when it cannot be read."""
    # refs/heads/… and the like are the repository's; HEAD-like names are the worktree's.
    base = common if name.startswith("refs/") else git_dir
    try:
        return _text(base / name)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        pass  # not a loose ref: packed, or none
    except (OSError, ValueError):
        return None
    try:
        packed = _text(common / "packed-refs")
    except FileNotFoundError:
        return ""
    except (OSError, ValueError):
        return None
    for line in packed.splitlines():
        sha, _, ref = line.partition(" ")
        if ref == name:
            return sha
    return ""
