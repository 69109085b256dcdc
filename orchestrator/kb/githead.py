"""The commit a KB's HEAD is at, read from git's own files (CONTRACT §10's
``recorded-commit``, kept with each job's snapshot of a note).

Read where jobs are made (a sweep's batch, the control's re-review of a fix): a ``git``
process each time was milliseconds a job where the control makes a thousand in seconds;
these are a few small reads, and outside git a stat of ``.git`` in each folder up to ``/``.
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
        return None  # a .git file that cannot be read: git cannot say either
    if git_dir is None:
        return ""
    try:
        head = (git_dir / "HEAD").read_text(encoding="ascii").strip()
        common = git_dir
        if (git_dir / "commondir").exists():  # a worktree's folder: refs are the repository's
            common = git_dir / (git_dir / "commondir").read_text(encoding="ascii").strip()
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
    not above a folder of GIT_CEILING_DIRECTORIES: the person's fence, which a fix commit
    keeps too (``gitcommit.git_env``). OSError when a ``.git`` file cannot be read."""
    fences = {
        os.path.normpath(p)
        for p in os.environ.get("GIT_CEILING_DIRECTORIES", "").split(os.pathsep)
        if os.path.isabs(p)
    }
    for folder in (root, *root.parents):
        if folder != root and str(folder) in fences:
            return None
        dot = folder / ".git"
        try:
            mode = os.stat(dot).st_mode  # one call a folder: a KB outside git stats each
        except OSError:
            continue
        if stat.S_ISDIR(mode):
            return dot
        if stat.S_ISREG(mode):
            line = dot.read_text(encoding="utf-8").strip()
            return folder / line[len("gitdir:") :].strip() if line.startswith("gitdir:") else None
    return None


def _ref(git_dir: Path, common: Path, name: str) -> str | None:
    """What ref ``name`` holds (a sha, or "ref: …" for a symbolic one); "" when it does not
    exist, None when it cannot be read."""
    # refs/heads/… and the like are the repository's; HEAD-like names are the worktree's.
    base = common if name.startswith("refs/") else git_dir
    try:
        return (base / name).read_text(encoding="ascii").strip()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        pass  # not a loose ref: packed, or none
    except (OSError, ValueError):
        return None
    try:
        packed = (common / "packed-refs").read_text(encoding="ascii")
    except FileNotFoundError:
        return ""
    except (OSError, ValueError):
        return None
    for line in packed.splitlines():
        sha, _, ref = line.partition(" ")
        if ref == name:
            return sha
    return ""
