"""An applied fix as its own git commit (issue 13): one note, never anything else.

:func:`commit_fix` runs right after the fixed note replaced the old one. It commits only
when the commit would hold exactly reviewq's edit and stay on a branch: the note is
tracked, nothing of it is staged, the text the fixer was given is what HEAD holds (as git
stores it), and HEAD is a branch. Otherwise the fix stays
applied and uncommitted, and the caller records why. ``git commit --only -- PATH`` keeps
a person's staged changes to other files staged and their unstaged changes untouched.
Undoing a fix is ``git revert <sha>``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_exponential

GIT_TIMEOUT_S = 30.0
# Unattended: no editor, no pager, no credential or passphrase prompt may wait for a person.
# Literal pathspecs: a note named "v?.md" is that file, not every "v1.md" beside it.
_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_EDITOR": "true",
    "GIT_PAGER": "cat",
    "LC_ALL": "C",
    "GIT_LITERAL_PATHSPECS": "1",
    # Off, not only unset: a person's global config can ask for the same traces
    # (trace2.normalTarget…), which these override (see _CHATTY).
    "GIT_TRACE2": "0",
    "GIT_TRACE2_PERF": "0",
    "GIT_TRACE2_EVENT": "0",
}
# What a git hook or alias of another repository sets for the git it runs (`git rev-parse
# --local-env-vars`): inherited by reviewq started from one (a person's `git x`), the fix
# commit landed in that repository. GIT_CEILING_DIRECTORIES is not among them: it fences
# the search upward, and is the person's to keep.
_ELSEWHERE = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_CONFIG",
    "GIT_CONFIG_COUNT",
    "GIT_CONFIG_PARAMETERS",
    "GIT_DIR",
    "GIT_GRAFT_FILE",
    "GIT_IMPLICIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_NAMESPACE",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_OBJECT_DIRECTORY",
    "GIT_PREFIX",
    "GIT_REPLACE_REF_BASE",
    "GIT_SHALLOW_FILE",
    "GIT_WORK_TREE",
)


# What makes git write more than its own words to stderr (GIT_TRACE, GIT_TRACE2_*,
# GIT_TRACE_PACKET…, GIT_CURL_VERBOSE): left set in a person's shell, a failed commit's
# reason (stderr's first line) was a trace line, not git's error.
_CHATTY = ("GIT_TRACE", "GIT_CURL_VERBOSE")


def git_env(**extra: str) -> dict[str, str]:
    """The environment a git run on the KB gets: this process's, without what names
    another repository or adds traces to git's words, and unattended (no prompt, editor
    or pager)."""
    return {
        **{
            k: v for k, v in os.environ.items() if k not in _ELSEWHERE and not k.startswith(_CHATTY)
        },
        **_ENV,
        **extra,
    }


# Another git in the same repository (a person's editor running `git status`) holds
# index.lock (or the branch's lock) for a moment: the commit is tried again for a few
# seconds before it is given up.
_LOCK_TRIES = 6
_IDENTITY = {
    "GIT_AUTHOR_NAME": "reviewq",
    "GIT_AUTHOR_EMAIL": "reviewq@localhost",
    "GIT_COMMITTER_NAME": "reviewq",
    "GIT_COMMITTER_EMAIL": "reviewq@localhost",
}


@dataclass(frozen=True)
class CommitOutcome:
    sha: str | None = None  # the commit, when there is one
    why_not: str | None = None  # else why the fix was left uncommitted
    again: bool = False  # refused for now (another git's lock, a merge): try again later

    def to_json(self) -> dict:
        return {"commit": self.sha, "why_not": self.why_not}


class GitTimeout(subprocess.SubprocessError):
    """A git command outlived :data:`GIT_TIMEOUT_S`; it was stopped with SIGTERM."""


class GitFailed(subprocess.SubprocessError):
    """A git command the commit needs failed; the message is git's own first line."""


def in_repository(root: Path) -> bool:
    """Whether ``root`` is in a git work tree; :class:`GitFailed` when git cannot use the
    repository there (dubious ownership, a broken .git), in git's own words: taken for "not
    a repository", it was a KB without history to whoever read what reviewq said."""
    inside = _git(root, "rev-parse", "--is-inside-work-tree")
    if inside.returncode != 0 and "not a git repository" not in inside.stderr:
        raise GitFailed(f"git cannot use the KB's repository: {_first_line(inside)}")
    return inside.returncode == 0 and inside.stdout.strip() == "true"


def as_committed(root: Path, commit: str, rels: list[str]) -> bool:
    """Whether each file ``rels`` under ``root`` is as ``commit`` holds it, or is absent
    from both: what an update of the work tree to that commit (a `git pull`) leaves. A
    file the commit does not hold (an agent's new one) is not; git unable to say, no."""
    try:
        tracked = _git(root, "ls-tree", "-r", "-z", "--name-only", commit, "--", *rels)
        if tracked.returncode != 0:
            return False
        held = set(tracked.stdout.split("\0")) - {""}
        if any(rel not in held and os.path.lexists(root / rel) for rel in rels):
            return False
        return not held or _git(root, "diff", "--quiet", commit, "--", *held).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


# How git's reflog of HEAD begins a move that brought the work tree what was made
# elsewhere: a `git pull` (fast-forward, merge or rebase), a fetch then a merge, rebase or
# reset. A commit, a checkout of another branch, a cherry-pick or a revert is a change
# made in this copy (C87). How many moves are read back, at most, to find the launch's.
_UPDATES = ("pull", "merge ", "rebase", "reset: moving to ")
_MOVES = 200


def moved_by_update(root: Path, since: str) -> bool:
    """Whether each move of HEAD since it was at ``since``, as git's reflog of HEAD says
    it, brought what was made elsewhere (:data:`_UPDATES`); git unable to say (no reflog
    back to ``since``), no."""
    try:
        log = _git(root, "log", "-g", f"-n{_MOVES}", "--format=%H %gs", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return False
    moves = []
    for line in log.stdout.splitlines() if log.returncode == 0 else []:
        sha, _, subject = line.partition(" ")
        if sha == since:
            return bool(moves) and all(m.startswith(_UPDATES) for m in moves)
        moves.append(subject)
    return False


def first_parent_line(root: Path) -> list[str]:
    """``git log --first-parent --format='%ct %H'`` of HEAD, newest first: none outside a
    repository or before its first commit. :class:`GitFailed` or :class:`GitTimeout` when
    git cannot read it."""
    if not in_repository(root) or _git(root, "rev-parse", "-q", "--verify", "HEAD").returncode:
        return []
    out = _git(root, "log", "--first-parent", "--format=%ct %H", "HEAD")
    if out.returncode != 0:
        raise GitFailed(f"git log: {_first_line(out)}")
    return out.stdout.splitlines()


def _git(
    root: Path, *args: str, env: dict | None = None, data: bytes | None = None
) -> subprocess.CompletedProcess:
    """One git command, with no hook, no terminal and no input but ``data``. Hooks are a
    person's tools for their own commits: ``--no-verify`` leaves prepare-commit-msg and
    post-commit running, and one that waits on /dev/tty or rewrites the message stalled
    the control, or hid reviewq's own commit from it. Stopped with SIGTERM at the
    timeout, as git cleans up after it: SIGKILL left index.lock, and the person's git
    refused every command until they deleted it."""
    argv = ["git", "-c", "commit.gpgsign=false", "-c", f"core.hooksPath={os.devnull}", *args]
    p = subprocess.Popen(
        argv,
        cwd=root,
        env=git_env(**(env or {})),
        stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    # Git is waited for by its exit, not its pipes: a helper that left its session (a
    # filter's daemon) may hold them open for as long as it lives. Each pipe is read, and
    # closed, by a thread of its own; one still held a moment after git exits is left.
    out: list[bytes] = []
    err: list[bytes] = []
    pipes = [threading.Thread(target=_drain, args=(p.stdout, out), daemon=True)]
    pipes.append(threading.Thread(target=_drain, args=(p.stderr, err), daemon=True))
    if data is not None:
        pipes.append(threading.Thread(target=_feed, args=(p.stdin, data), daemon=True))
    for t in pipes:
        t.start()
    try:
        p.wait(timeout=GIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # Its session: git and what it runs (a filter, a credential helper).
        _signal_group(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _signal_group(p.pid, signal.SIGKILL)
            p.wait()
        raise GitTimeout(f"git {args[0]} took longer than {GIT_TIMEOUT_S:g} s") from None
    for t in pipes:
        t.join(timeout=_PIPE_GRACE_S)
    stdout, stderr = b"".join(out), b"".join(err)
    if data is not None:
        return subprocess.CompletedProcess(argv, p.returncode, stdout, stderr)
    return subprocess.CompletedProcess(
        argv, p.returncode, stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")
    )


_PIPE_GRACE_S = 1.0  # for git's last output after it exits


def _drain(pipe, into: list[bytes]) -> None:  # noqa: ANN001 - a binary pipe
    with pipe:
        while chunk := pipe.read1(65536):
            into.append(chunk)


def _feed(pipe, data: bytes) -> None:  # noqa: ANN001 - a binary pipe
    with contextlib.suppress(OSError), pipe:  # git may exit without reading it all
        pipe.write(data)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _stored_sha(root: Path, rel: str, data: bytes, *, keep_crlf: bool = False) -> str:
    """The blob git would store for ``data`` at ``rel``: after the repository's line-ending
    conversion and clean filters. Raw bytes hashed as they are never matched HEAD in a
    repository with ``eol=crlf`` or ``core.autocrlf``, so no fix there was committed.
    ``--path`` is relative to the KB root, which git prefixes with its place in the
    repository: written "./rel", a .gitattributes pattern above a KB in a subfolder never
    matched, and every fix there was taken for a note with uncommitted edits.
    ``keep_crlf``: stored as it is (:func:`_crlf_kept`); without ``--path`` git hashes
    stdin unconverted."""
    path = () if keep_crlf else (f"--path={rel}",)
    p = _git(root, "hash-object", *path, "--stdin", data=data)
    if p.returncode != 0:
        # A clean filter that cannot run (Git LFS not installed): git's words say which.
        raise GitFailed(f"git hash-object failed: {_first_line(p)}")
    return p.stdout.decode().strip()


_CONVERTING = ("filter", "ident", "working-tree-encoding")


def _crlf_kept(root: Path, rel: str, blob: str) -> bool:
    """Whether git stores the note as it is, CRs and all, where hash-object converts it.
    Where line ends are converted "auto" (core.autocrlf with no text or eol attribute, or
    ``text=auto``), git leaves a file whose committed text (``blob``) has CRs alone, and
    hash-object, which reads no index, does not know it. A note committed from Windows,
    autocrlf or ``* text=auto`` set since: the note no one had touched was taken for one
    with uncommitted edits, and none of its fixes was committed. Only where nothing else
    converts the note (no filter, ident or working-tree-encoding attribute)."""
    said = _git(root, "check-attr", "text", "eol", *_CONVERTING, "--", rel).stdout
    attrs = dict(line.rsplit(": ", 2)[1:] for line in said.splitlines() if line.count(": ") > 1)
    if len(attrs) != 5 or any(attrs[a] != "unspecified" for a in ("eol", *_CONVERTING)):
        return False
    if attrs["text"] == "unspecified":
        autocrlf = _git(root, "config", "core.autocrlf").stdout.strip().lower()
        if autocrlf not in ("true", "yes", "on", "1", "input"):
            return False
    elif attrs["text"] != "auto":
        return False  # ``text`` converts such a file all the same
    return b"\r" in _git(root, "cat-file", "blob", blob, data=b"").stdout  # data: bytes out


def _earlier_commit(root: Path, rel: str, msg: str, fixed: str) -> str | None:
    """The commit of this very fix, if a run that died before recording it (or another
    writer of the same due fix) made one: anywhere in HEAD's history, not only at HEAD (a
    person may have committed since). It must touch the note, carry this message whole
    and hold the fixed text (``fixed``, its blob): a job id alone repeats across state
    folders, and another note's fix under the same id was taken for this one."""
    trailer = next((line for line in msg.splitlines() if line.startswith("Reviewq-Job: ")), None)
    if trailer is None:
        return None
    # --basic-regexp: a person's grep.patternType (fixed) must not make the pattern literal.
    pattern = f"--grep=^{re.escape(trailer)}$"
    found = _git(root, "log", "-5", "--format=%H", "--basic-regexp", pattern, "HEAD", "--", rel)
    if found.returncode != 0:
        return None
    # As git stored it (no blank line twice, no space at a line's end): a person's asks or
    # a finding cut just after a space differ from it, and the commit was called not ours.
    stored = _git(root, "stripspace", data=msg.encode()).stdout.decode("utf-8", "replace")
    for sha in found.stdout.split():
        body = _git(root, "log", "-1", "--format=%B", sha).stdout
        blob = _git(root, "rev-parse", "--verify", "--quiet", f"{sha}:./{rel}").stdout.strip()
        if body.strip() == stored.strip() and blob == fixed:
            return sha
    return None


def _lock_held(p: subprocess.CompletedProcess) -> bool:
    """Whether git was refused for a lock file that exists (index.lock, or the branch's
    ref lock while another git commits): another git's, for a moment or until a person
    removes one a crash left. Not a .git it cannot write (read-only, another user's),
    whose refusal also names the lock: that one is final."""
    return p.returncode != 0 and ".lock': File exists" in p.stderr


# What git keeps in its folder while a rebase or a bisect is under way (`git status` reads
# the same): the operation's name for each.
_UNDER_WAY = (("rebase-merge", "rebase"), ("rebase-apply", "rebase"), ("BISECT_START", "bisect"))


def _in_progress(root: Path) -> str | None:
    """``rebase``, ``git am`` or ``bisect`` when one is under way in the KB's repository,
    else None."""
    p = _git(root, "rev-parse", *(arg for name, _ in _UNDER_WAY for arg in ("--git-path", name)))
    paths = p.stdout.splitlines() if p.returncode == 0 else []
    for path, (_, what) in zip(paths, _UNDER_WAY, strict=False):
        if (root / path).exists():  # relative to the working folder git ran in, or absolute
            # git am keeps its patches where the old rebase did, and says so (`git status`).
            return "git am" if (root / path / "applying").exists() else what
    return None


def _mode_changed(root: Path, rel: str, index_mode: str) -> str | None:
    """The note's change of mode ("100644 to 100755") when its executable bit is not the
    index's (``index_mode``) and git would see it (core.fileMode), else None. A fix keeps
    the file's mode, and git commits the file as it is: a person's chmod went into the
    fix's commit as reviewq's. Read from the file, not `git diff`, which runs the note's
    clean filters."""
    if index_mode not in ("100644", "100755"):
        return None
    said = _git(root, "config", "--type=bool", "core.fileMode").stdout.strip()
    if said == "false":
        return None
    mode = "100755" if (root / rel).stat().st_mode & stat.S_IXUSR else "100644"
    return None if mode == index_mode else f"{index_mode} to {mode}"


def _first_line(p: subprocess.CompletedProcess) -> str:
    said = p.stderr or p.stdout or ""
    if isinstance(said, bytes):  # a run given ``data``
        said = said.decode("utf-8", "replace")
    text = said.strip().splitlines()
    return text[0] if text else f"exit {p.returncode}"


# Findings a message quotes, and the width of each: the rest is in `reviewq job N`.
_FOUND_MAX = 20
_FOUND_WIDTH = 200
# A subject's longest; past it, `git log --oneline` and mail subjects wrap or cut it.
_SUBJECT_MAX = 100


def _subject(note_path: str, gates: str) -> str:
    """The subject line: a path too long for it gives way in its middle (the body names it
    whole), so the gates, what the fix was for, stay readable in `git log --oneline`."""
    subject = f"reviewq fix: {note_path} ({gates})"
    if len(subject) <= _SUBJECT_MAX:
        return subject
    room = _SUBJECT_MAX - len(subject) + len(note_path) - 1  # the path's share, less "…"
    if room < 20:  # gates too many to leave the path a readable share: cut the end
        return subject[: _SUBJECT_MAX - 1] + "…"
    head = room // 2
    return f"reviewq fix: {note_path[:head]}…{note_path[-(room - head) :]} ({gates})"


def message(
    note_path: str,
    gates: list[str],
    job_id: int,
    reviewer: str | None,
    fixer: str | None,
    found: Sequence[str] = (),
    asks: str | None = None,
) -> str:
    """The fix's commit message. ``found``: the findings the fixer was given ("GATE:
    severity: text"), ``asks``: a person's, for a redo; the why of the change, for whoever
    reads `git log` or `git blame` later. The asks are indented: a line of theirs that
    reads as a trailer (``Reviewq-Job: 3``) must not be found as this commit's."""
    why = [f"- {line[:_FOUND_WIDTH]}" for line in found[:_FOUND_MAX]]
    if len(found) > _FOUND_MAX:
        why.append(f"- … and {len(found) - _FOUND_MAX} more")
    return "\n".join(
        [
            _subject(note_path, ", ".join(gates)),
            "",
            f"The fixer {fixer or '-'} edited {note_path} to meet {', '.join(gates)}.",
            *(["The review found:", *why] if why else []),
            *(["A person asked (decide redo):"] if asks and asks.strip() else []),
            *(f"  {line}".rstrip() for line in (asks or "").strip().splitlines()),
            "Undo with `git revert` of this commit.",
            "",
            f"Reviewq-Job: {job_id}",
            *(f"Reviewq-Gate: {g}" for g in gates),
            f"Reviewq-Reviewer: {reviewer or '-'}",
            "",
        ]
    )


def commit_fix(
    root: Path, rel: str, before: bytes, after: bytes, msg: str, *, patient: bool = True
) -> CommitOutcome:
    """Commit the note at ``rel`` (root-relative) that now holds ``after`` and held
    ``before``. Never raises for git's sake: a failure is a reason, and the fix stands.
    ``patient``: wait out an index lock another git holds for a few seconds, else try once."""
    try:
        return _commit(root, rel, before, after, msg, _LOCK_TRIES if patient else 1)
    except GitTimeout as exc:
        # A commit in a huge repository may outlive the wait after it was made: look for
        # it before calling it failed.
        try:
            sha = _earlier_commit(root, rel, msg, _stored_sha(root, rel, after))
        except (OSError, subprocess.SubprocessError):
            sha = None
        return CommitOutcome(sha=sha) if sha else CommitOutcome(why_not=f"git could not run: {exc}")
    except GitFailed as exc:
        return CommitOutcome(why_not=str(exc))
    except (OSError, subprocess.SubprocessError) as exc:
        return CommitOutcome(why_not=f"git could not run: {exc}")


def commit_made(root: Path, rel: str, after: bytes, msg: str) -> str | None:
    """The commit of this very fix (``after``, ``msg``) in HEAD's history, whatever the
    note holds now; None if there is none or git cannot say."""
    try:
        return _earlier_commit(root, rel, msg, _stored_sha(root, rel, after))
    except (OSError, subprocess.SubprocessError):
        return None


CHANGED_BEFORE_COMMIT = "the note was changed after the fix was written, before its commit"


def _commit_unchanged(
    root: Path, rel: str, after: bytes, msg: str, env: dict
) -> subprocess.CompletedProcess | None:
    """``git commit --only`` of the note, or None if it no longer holds the fix: git
    commits the file as it is, and a person's save while the commit waited for another
    git's index lock went in as "reviewq fix: ..."."""
    try:
        if (root / rel).read_bytes() != after:
            return None
    except FileNotFoundError:
        return None
    # The message on stdin: as an argument it may hold no more than 128 KiB (Linux), and a
    # redo's asks quoted in it had the fix left uncommitted as "Argument list too long".
    p = _git(
        root,
        "commit",
        "--quiet",
        "--no-verify",
        "--only",
        "-F",
        "-",
        "--",
        rel,
        env=env,
        data=msg.encode(),
    )
    return subprocess.CompletedProcess(
        p.args,
        p.returncode,
        p.stdout.decode("utf-8", "replace"),
        p.stderr.decode("utf-8", "replace"),
    )


def _commit(
    root: Path, rel: str, before: bytes, after: bytes, msg: str, lock_tries: int
) -> CommitOutcome:
    try:
        if not in_repository(root):
            return CommitOutcome(why_not="the KB is not in a git repository")
    except GitFailed as exc:
        return CommitOutcome(why_not=str(exc))
    # "./" makes the path relative to the KB root, wherever the repository's top is.
    head = _git(root, "rev-parse", "--verify", "--quiet", f"HEAD:./{rel}")
    if head.returncode != 0:
        # A note in a submodule (or a repository inside the KB's) may well be committed,
        # in that repository: "not committed yet" sent the person looking for no reason.
        top = _git(root, "rev-parse", "--show-toplevel").stdout.strip()
        folder = (root / rel).parent
        its = _git(folder, "rev-parse", "--show-toplevel").stdout.strip() if folder.is_dir() else ""
        if its and its != top:
            return CommitOutcome(
                why_not=f"the note is in another git repository ({its}, a submodule or a "
                "repository inside the KB's); fixes are committed only in the KB's repository"
            )
        return CommitOutcome(why_not="the note is not committed in git yet (new or untracked)")
    head_blob = head.stdout.strip()
    if _git(root, "symbolic-ref", "-q", "HEAD").returncode != 0:
        # A tag or commit checked out, a bisect, a rebase: the next checkout of a branch
        # would leave the commit behind and put the old note back without a word.
        busy = _in_progress(root)
        if busy:
            # A rebase or bisect gives the branch back when it ends, as a merge ends: the
            # commit waits for it (given up at once, the fix stayed uncommitted for good).
            return CommitOutcome(
                why_not=f"HEAD is detached during a {busy}; the commit is made once it ends",
                again=True,
            )
        return CommitOutcome(
            why_not="HEAD is detached (no branch is checked out); a commit there would be "
            "left behind at the next checkout"
        )
    if _in_progress(root) == "git am":
        # HEAD stays on the branch between its patches; a commit among them kept the
        # person's `git am --abort` from giving their branch back ("Not rewinding").
        return CommitOutcome(
            why_not="a `git am` is under way; the commit is made once it ends", again=True
        )
    keep_crlf = _crlf_kept(root, rel, head_blob)
    fixed = _stored_sha(root, rel, after, keep_crlf=keep_crlf)
    if head_blob == fixed:
        earlier = _earlier_commit(root, rel, msg, fixed)
        if earlier:  # this very commit, made by a run that died before it was recorded
            return CommitOutcome(sha=earlier)
        # A person's own commit took the fixed note (`git commit -a` while this one waited).
        return CommitOutcome(
            why_not="the fixed note was committed already, in a commit not reviewq's"
        )
    # -v: a tag before the mode ("H" tracked, "S" skip-worktree), then mode, blob, stage.
    staged = _git(root, "ls-files", "-v", "--stage", "--", rel).stdout.split()
    if staged[:1] == ["S"]:
        # The person's way to keep their edits of it out of git: git commit sees none.
        return CommitOutcome(
            why_not="the note is marked skip-worktree in git's index, so git sees no change "
            "to commit (`git update-index --no-skip-worktree` undoes it)"
        )
    index_blob = staged[2] if staged[2:] else ""
    if index_blob != head_blob:
        return CommitOutcome(why_not="the note has staged changes; a commit would take them")
    if head_blob != _stored_sha(root, rel, before, keep_crlf=keep_crlf):
        return CommitOutcome(
            why_not="the note had uncommitted edits; a commit would take them as reviewq's"
        )
    if mode := _mode_changed(root, rel, staged[1]):
        return CommitOutcome(
            why_not=f"the note's file mode was changed ({mode}) and not committed; "
            "a commit would take it as reviewq's"
        )
    env = {}
    # A machine with no git identity still gets a commit, as reviewq; so does one where
    # git may not guess the half that is missing (user.useConfigOnly).
    if (
        _git(root, "config", "user.email").returncode != 0
        or _git(root, "var", "GIT_COMMITTER_IDENT").returncode != 0
    ):
        env = _IDENTITY
    # --no-verify as well as no hooks path (:func:`_git`): a git that reads hooks from
    # elsewhere still skips pre-commit and commit-msg.
    done = Retrying(
        stop=stop_after_attempt(lock_tries),
        wait=wait_exponential(multiplier=0.1, max=2),
        retry=retry_if_result(lambda p: p is not None and _lock_held(p)),
        retry_error_callback=lambda state: state.outcome.result(),
    )(_commit_unchanged, root, rel, after, msg, env)
    if done is None:
        return CommitOutcome(why_not=CHANGED_BEFORE_COMMIT)
    if done.returncode != 0:
        # Another writer of this due fix (a run-job beside the control) committed it first.
        earlier = _earlier_commit(root, rel, msg, fixed)
        if earlier:
            return CommitOutcome(sha=earlier)
        # A merge or cherry-pick in progress takes no partial commit: it ends, and then
        # the commit is made, as when a lock goes.
        again = _lock_held(done) or "cannot do a partial commit during" in done.stderr
        return CommitOutcome(why_not=f"git commit failed: {_first_line(done)}", again=again)
    sha = _git(root, "rev-parse", "HEAD").stdout.strip()
    now = _git(root, "rev-parse", "--verify", "--quiet", f"HEAD:./{rel}").stdout.strip()
    if now != fixed:
        # Someone wrote the note between the fix and the commit: the commit holds their text.
        return CommitOutcome(
            sha=sha, why_not="the note changed while committing; the commit holds that text"
        )
    return CommitOutcome(sha=sha)
