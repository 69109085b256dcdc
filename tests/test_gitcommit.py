"""A fix's git commit in repositories as people keep them: line endings converted, a
detached HEAD, a note whose name is a glob, another git holding the index for a moment,
and a run that died after committing. Real git, called as the fix path calls it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading

import pytest

from orchestrator.kb import gitcommit
from orchestrator.kb.gitcommit import commit_fix, message

from .test_fix_commits import git

NOTE = "kb/notes/alpha.md"


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "kbroot"
    _committed(root, root, "the KB")
    return root


def _committed(root, top, message: str) -> None:
    """A KB at ``root`` with its one note, committed in a repository at ``top``."""
    (root / "kb" / "notes").mkdir(parents=True)
    (root / NOTE).write_bytes(b"# Alpha\n\nAlpha body.\n")
    git(top, "init", "-q", "-b", "main")
    git(top, "config", "user.name", "A Person")
    git(top, "config", "user.email", "person@example.org")
    git(top, "add", "-A")
    git(top, "commit", "-q", "-m", message)


def fix(root, rel: str = NOTE, job_id: int = 7):
    """Write the fixed note as the fix path does, then commit it."""
    before = (root / rel).read_bytes()
    after = before.replace(b"Alpha body.", b"Alpha body, FIXED.")
    (root / rel).write_bytes(after)
    msg = message(rel, ["prose/body-check"], job_id, "fake", "fake")
    return commit_fix(root, rel, before, after, msg)


def commits(root) -> list[str]:
    return git(root, "log", "--format=%s").splitlines()


def test_a_repository_that_converts_line_endings_gets_its_commit(repo):
    """The raw bytes were hashed as they are: with eol=crlf the note never matched HEAD,
    and every fix was left uncommitted as 'the note had uncommitted edits'."""
    (repo / ".gitattributes").write_text("*.md text eol=crlf\n")
    git(repo, "add", ".gitattributes")
    git(repo, "commit", "-q", "-m", "crlf")
    (repo / NOTE).unlink()
    git(repo, "checkout", "--", NOTE)
    assert b"\r\n" in (repo / NOTE).read_bytes() and git(repo, "status", "--porcelain") == ""
    out = fix(repo)
    assert out.why_not is None and out.sha
    assert commits(repo)[0].startswith(f"reviewq fix: {NOTE}")
    assert git(repo, "status", "--porcelain") == ""


def test_a_detached_head_gets_no_commit(repo):
    """A commit on a detached HEAD was left behind at the next checkout of the branch,
    which put the old note back without a word while state.db said committed."""
    git(repo, "checkout", "-q", "--detach")
    out = fix(repo)
    assert out.sha is None and out.why_not.startswith("HEAD is detached")
    assert commits(repo) == ["the KB"]


def _another_commit(repo, name: str) -> None:
    (repo / name).write_text(f"{name}\n")
    git(repo, "add", name)
    git(repo, "commit", "-q", "-m", name)


@pytest.mark.parametrize("busy", ["rebase", "bisect"])
def test_a_rebase_or_bisect_in_progress_holds_the_commit_until_it_ends(repo, busy):
    """A rebase stopped at a commit, or a bisect, leaves HEAD detached for a while: the
    fix's commit was given up at once as for a tag checked out, and the person, their
    rebase or bisect done, found the fix uncommitted for good. It waits, as for a merge."""
    _another_commit(repo, "one.txt")
    _another_commit(repo, "two.txt")
    if busy == "rebase":  # stopped at the last commit, to edit it
        subprocess.run(
            ["git", "rebase", "-q", "-i", "HEAD~1"],
            cwd=repo,
            env={**os.environ, "GIT_SEQUENCE_EDITOR": "sed -i s/^pick/edit/"},
            check=True,
            capture_output=True,
        )
    else:
        git(repo, "bisect", "start", "HEAD", "HEAD~2")  # checks out the commit between
    before = (repo / NOTE).read_bytes()
    out = fix(repo)
    assert out.sha is None and out.again, out
    assert out.why_not == f"HEAD is detached during a {busy}; the commit is made once it ends"
    if busy == "rebase":  # git continues only a clean tree: the fix is put aside meanwhile
        git(repo, "stash", "-q")
        git(repo, "rebase", "--continue")
        git(repo, "stash", "pop", "-q")
    else:
        git(repo, "bisect", "reset")
    after = (repo / NOTE).read_bytes()
    msg = message(NOTE, ["prose/body-check"], 7, "fake", "fake")
    done = commit_fix(repo, NOTE, before, after, msg)
    assert done.sha and done.sha == git(repo, "rev-parse", "HEAD").strip(), done
    assert git(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/main"


def _assert_reason_is_gits_partial_commit_error(repo) -> None:
    """A merge left open makes git refuse a commit of one path: the reason kept must be
    git's own error, whatever else git was asked to write to stderr."""
    git(repo, "checkout", "-q", "-b", "side")
    _another_commit(repo, "side.txt")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "--no-commit", "side")
    out = fix(repo)
    assert out.again and out.why_not.startswith("git commit failed: fatal: cannot do a partial"), (
        out
    )


def test_a_reason_is_gits_own_words_with_its_traces_asked_for(repo, monkeypatch):
    """GIT_TRACE (or GIT_TRACE2, GIT_TRACE_PACKET…) left set where reviewq runs: git writes
    its trace to stderr before its error, and the reason kept was the trace's first line
    ("06:29:36.876623 common-main.c:50 version 2.39.5"), where git's error was."""
    for name in ("GIT_TRACE", "GIT_TRACE2", "GIT_TRACE_SETUP"):
        monkeypatch.setenv(name, "1")
    _assert_reason_is_gits_partial_commit_error(repo)


def test_a_reason_is_gits_own_words_with_traces_its_config_asks_for(repo, tmp_path, monkeypatch):
    """G14 left the traces a person's global config asks for (``trace2.normalTarget``,
    read from the system and global files only): git still wrote them to stderr first,
    and the reason kept was "common-main.c:50 version 2.39.5"."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(
        "[trace2]\n\tnormalTarget = 2\n\tperfTarget = 2\n\teventTarget = 2\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    _assert_reason_is_gits_partial_commit_error(repo)


def test_a_note_named_like_a_glob_is_that_file_only(repo):
    """'v?.md' as a pathspec also named 'v1.md', whose staged edit refused the fix."""
    rel = "kb/notes/v?.md"
    (repo / rel).write_bytes(b"# V\n\nAlpha body.\n")
    (repo / "kb/notes/v1.md").write_text("# V1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "two notes")
    (repo / "kb/notes/v1.md").write_text("# V1\n\nA person's staged edit.\n")
    git(repo, "add", "kb/notes/v1.md")
    out = fix(repo, rel)
    assert out.why_not is None and out.sha
    assert git(repo, "show", "--name-only", "--format=", out.sha).split() == [rel]
    assert git(repo, "diff", "--cached", "--name-only").split() == ["kb/notes/v1.md"]


def test_an_index_held_for_a_moment_by_another_git_is_waited_out(repo, monkeypatch):
    """One failed try was recorded for good: the fix stayed uncommitted, and every later
    fix of the note was refused for the 'uncommitted edits' the first one left."""
    lock = repo / ".git" / "index.lock"
    real = gitcommit._git
    held = []

    def another_git_holds_the_index_once(root, *args, **kw):
        if args[0] == "commit" and not held:
            held.append(True)
            lock.write_text("")  # a person's editor runs `git status` just then
            try:
                return real(root, *args, **kw)
            finally:
                lock.unlink()
        return real(root, *args, **kw)

    monkeypatch.setattr(gitcommit, "_git", another_git_holds_the_index_once)
    out = fix(repo)
    assert held and out.why_not is None and out.sha
    assert commits(repo)[0].startswith("reviewq fix:")


@pytest.mark.parametrize("pattern_type", [None, "fixed"])
def test_a_commit_made_before_a_crash_is_found_after_a_persons_commit(repo, pattern_type):
    """A run that died after committing and before recording it: the next run looked
    for its commit at HEAD only, and after a person's commit called the note edited.
    [fixed]: the person's `grep.patternType = fixed` made git log take the trailer's
    pattern for a literal string, and the commit was never found."""
    if pattern_type:
        git(repo, "config", "grep.patternType", pattern_type)
    before = (repo / NOTE).read_bytes()
    first = fix(repo, job_id=42)
    assert first.sha
    (repo / "elsewhere.txt").write_text("a person's work\n")
    git(repo, "add", "elsewhere.txt")
    git(repo, "commit", "-q", "-m", "a person's commit")
    after = (repo / NOTE).read_bytes()
    msg = message(NOTE, ["prose/body-check"], 42, "fake", "fake")
    again = commit_fix(repo, NOTE, before, after, msg)
    assert again.sha == first.sha and again.why_not is None
    assert len(commits(repo)) == 3


def test_a_post_commit_hook_that_outlives_the_wait_is_no_failure(repo, monkeypatch):
    """The commit was made, but the slow hook's timeout was recorded as 'git could not
    run', beside a commit that exists."""
    monkeypatch.setattr(gitcommit, "GIT_TIMEOUT_S", 2.0)
    hook = repo / ".git" / "hooks" / "post-commit"
    pid = repo / ".git" / "hook.pid"
    hook.write_text(f"#!/bin/sh\necho $$ > {pid}\nexec sleep 30\n")
    hook.chmod(0o755)
    try:
        out = fix(repo)
    finally:
        # git was killed at the timeout; its hook was not, and is this test's to end.
        if pid.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid.read_text()), signal.SIGKILL)
    assert out.why_not is None and out.sha
    assert git(repo, "rev-parse", "HEAD").strip() == out.sha


def test_a_commit_another_writer_of_the_fix_made_first_is_recorded_as_the_commit(repo, monkeypatch):
    """A run-job and a control tick writing the same due fix both ran git commit; the one
    that found nothing left to commit recorded 'git commit failed', and the first record
    wins, so the real commit's sha could be lost."""
    real = gitcommit._git

    def the_other_writer_commits_first(root, *args, **kw):
        if args[0] == "commit":
            assert real(root, *args, **kw).returncode == 0  # the other process's commit
        return real(root, *args, **kw)

    monkeypatch.setattr(gitcommit, "_git", the_other_writer_commits_first)
    out = fix(repo)
    assert out.why_not is None and out.sha == git(repo, "rev-parse", "HEAD").strip()
    assert len(commits(repo)) == 2


def test_another_notes_commit_under_the_same_job_id_is_not_taken_for_this_fix(repo, monkeypatch):
    """Job ids start again with a new state folder: a failed commit looked for 'its' commit
    by the job trailer alone and took another note's fix for it, so no reason was recorded
    and the report offered a revert of the wrong fix."""
    other = "kb/notes/beta.md"
    (repo / other).write_bytes(b"# Beta\n\nAlpha body.\n")
    git(repo, "add", other)
    git(repo, "commit", "-q", "-m", "beta")
    assert fix(repo, other, job_id=3).sha  # an earlier state folder's job 3
    monkeypatch.setattr(gitcommit, "_LOCK_TRIES", 1)
    (repo / ".git" / "index.lock").write_text("")  # this commit cannot be made
    out = fix(repo, NOTE, job_id=3)
    assert out.sha is None and out.why_not.startswith("git commit failed")


def test_a_persons_message_hooks_do_not_run_on_reviewqs_commit(repo, monkeypatch):
    """--no-verify leaves prepare-commit-msg running: one that waited (on /dev/tty, say)
    was SIGKILLed with git at the timeout, and git's index.lock was left for the person's
    next command to fail on; one that rewrote the message hid the commit from the next
    run after a crash, which called the note edited."""
    monkeypatch.setattr(gitcommit, "GIT_TIMEOUT_S", 5.0)
    hook = repo / ".git" / "hooks" / "prepare-commit-msg"
    hook.write_text('#!/bin/sh\nsleep 8\nsed -i "1s/^/[PROJ-1] /" "$1"\n')
    hook.chmod(0o755)
    before = (repo / NOTE).read_bytes()
    out = fix(repo)
    assert out.why_not is None and out.sha, out
    assert commits(repo)[0].startswith("reviewq fix:")
    assert not (repo / ".git" / "index.lock").exists()
    msg = message(NOTE, ["prose/body-check"], 7, "fake", "fake")
    again = commit_fix(repo, NOTE, before, (repo / NOTE).read_bytes(), msg)
    assert again.sha == out.sha  # found again, as after a crash before it was recorded


def test_git_stopped_at_the_timeout_leaves_no_index_lock(repo, monkeypatch):
    """A commit that outlives the wait (a huge repository; here a slow clean filter while
    git holds the index) was SIGKILLed, and index.lock stayed: every git command the
    person ran failed until they deleted it by hand."""
    monkeypatch.setattr(gitcommit, "GIT_TIMEOUT_S", 2.0)
    count = repo / ".git" / "filter-calls"
    count.write_text("0")
    # Fast for the two hashes reviewq takes before committing, slow from the commit on.
    slow = f'n=$(cat {count}); echo $((n + 1)) > {count}; if [ "$n" -ge 2 ]; then sleep 5; fi; cat'
    git(repo, "config", "filter.slow.clean", slow)
    (repo / ".git" / "info" / "attributes").write_text("*.md filter=slow\n")
    out = fix(repo)
    assert out.sha is None and out.why_not == "git could not run: git commit took longer than 2 s"
    assert not (repo / ".git" / "index.lock").exists()
    (repo / ".git" / "info" / "attributes").unlink()
    git(repo, "commit", "-q", "--allow-empty", "-m", "the person's next commit")


def test_a_kb_in_a_subfolder_follows_attributes_written_above_it(tmp_path):
    """hash-object was given "./rel": the repository's .gitattributes pattern for the
    KB's folder never matched, and every fix was taken for a note with uncommitted edits."""
    top = tmp_path / "repo"
    root = top / "sub"
    (root / "kb" / "notes").mkdir(parents=True)
    (root / NOTE).write_bytes(b"# Alpha\n\nAlpha body.\n")
    (top / ".gitattributes").write_text("sub/kb/notes/*.md text eol=crlf\n")
    git(top, "init", "-q", "-b", "main")
    git(top, "config", "user.name", "A Person")
    git(top, "config", "user.email", "person@example.org")
    git(top, "add", "-A")
    git(top, "commit", "-q", "-m", "the KB")
    (root / NOTE).unlink()
    git(top, "checkout", "--", f"sub/{NOTE}")
    assert b"\r\n" in (root / NOTE).read_bytes()
    out = fix(root)
    assert out.why_not is None and out.sha, out


def test_a_repository_git_refuses_says_gits_reason(repo):
    """Any failure of rev-parse was called "not in a git repository": a repository owned
    by another user (git's safe.directory check) was reported as no repository at all."""
    git(repo, "config", "core.repositoryformatversion", "99")
    out = fix(repo)
    assert out.sha is None and out.why_not.startswith("git cannot use the KB's repository: ")


@pytest.mark.timeout(60)
def test_a_helper_that_outlives_git_does_not_hold_the_commit(repo, monkeypatch):
    """A clean filter that leaves a helper in its own session holding git's stderr: git's
    pipes were read to their end, which came when the helper ended (for good, for a
    daemon). The control process waited inside a fix write, and then called a git that
    had finished at once too slow. Git is waited for by its exit."""
    monkeypatch.setattr(gitcommit, "GIT_TIMEOUT_S", 2.0)
    pid = repo / ".git" / "helper.pid"
    helper = f"setsid sh -c 'echo $$ >> {pid}; exec sleep 300' >/dev/null </dev/null & cat"
    git(repo, "config", "filter.helper.clean", helper)
    (repo / ".git" / "info" / "attributes").write_text("*.md filter=helper\n")
    try:
        out = fix(repo)
    finally:
        for helper_pid in pid.read_text().split() if pid.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(helper_pid), signal.SIGKILL)
    assert out.why_not is None and out.sha == git(repo, "rev-parse", "HEAD").strip()


def test_a_process_started_from_another_repositorys_hook_commits_in_the_kbs(
    repo, tmp_path, monkeypatch
):
    """GIT_DIR (set for a git hook or alias, a person's `git x` that runs reviewq) was
    inherited: the fix commit landed in that other repository."""
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q", "-b", "main")
    git(other, "commit", "-q", "--allow-empty", "-m", "other's own")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    out = fix(repo)
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_WORK_TREE")
    assert out.why_not is None and out.sha
    assert commits(repo)[0].startswith(f"reviewq fix: {NOTE}")
    assert commits(other) == ["other's own"]


def test_a_kb_fenced_off_from_an_enclosing_repository_gets_no_commit_there(tmp_path, monkeypatch):
    """GIT_CEILING_DIRECTORIES is the person's fence: dropped with the variables that name
    another repository, git found the repository above the KB and committed there."""
    outer = tmp_path / "srv"
    root = outer / "kbroot"
    _committed(root, outer, "the server")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(outer))
    out = fix(root)
    assert out.sha is None and "not in a git repository" in out.why_not
    monkeypatch.delenv("GIT_CEILING_DIRECTORIES")
    assert git(outer, "log", "--format=%s").splitlines() == ["the server"]


def test_a_clean_filter_that_cannot_run_is_named_in_the_reason(repo):
    """A note under Git LFS on a machine without git-lfs: hashing it failed, and the
    reason recorded and logged was Python's rendering of the git argv ("Command '['git',
    '-c', ...]' returned non-zero exit status 128"), not what git said was wrong."""
    (repo / ".git" / "info" / "attributes").write_text("*.md filter=lfs\n")
    git(repo, "config", "filter.lfs.process", "git-lfs-not-installed filter-process")
    git(repo, "config", "filter.lfs.required", "true")
    out = fix(repo)
    assert out.sha is None and commits(repo) == ["the KB"]
    assert out.why_not.startswith("git hash-object failed: "), out.why_not
    assert "git-lfs-not-installed" in out.why_not and "Command '[" not in out.why_not


def test_a_note_git_is_told_to_skip_gets_no_commit_and_says_so(repo):
    """`git update-index --skip-worktree` (a person's way to keep local edits out of git):
    git commit saw nothing to commit, and the reason recorded was its first line of
    output, "On branch main"."""
    git(repo, "update-index", "--skip-worktree", NOTE)
    out = fix(repo)
    assert out.sha is None and commits(repo) == ["the KB"]
    assert "skip-worktree" in out.why_not, out.why_not
    assert git(repo, "ls-files", "-v", NOTE).startswith("S ")  # the person's flag stays


def test_a_note_inside_a_submodule_says_so(repo, tmp_path):
    """A note in a submodule of the KB's repository was "not committed in git yet (new or
    untracked)": it is committed, in the submodule's own repository."""
    lib = tmp_path / "lib"
    _committed(lib, lib, "the library")
    add = ["-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib)]
    git(repo, *add, "kb/notes/lib")
    git(repo, "commit", "-q", "-m", "the library as a submodule")
    out = fix(repo, f"kb/notes/lib/{NOTE}")
    assert out.sha is None and "submodule" in out.why_not, out.why_not
    assert "not committed" not in out.why_not


@contextlib.contextmanager
def _read_only(folder):
    """``folder`` as a person's read-only mount (root ignores a folder's modes), or
    without write permission for anyone else."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    mount = ["mount", "--bind", "-o", "ro", str(folder), str(folder)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("no read-only bind mount here")
    try:
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_git_folder_that_cannot_be_written_is_no_lock_to_wait_for(repo, monkeypatch):
    """A read-only .git (a mount, another user's repository): "Unable to create
    '.git/index.lock': Read-only file system" was taken for another git holding the
    lock. The commit was tried six times over three seconds inside the control's write,
    then deferred and tried again at every tick for a day."""
    real = gitcommit._git
    tries = []

    def counted(root, *args, **kw):
        tries.extend(args[:1] if args[0] == "commit" else [])
        return real(root, *args, **kw)

    monkeypatch.setattr(gitcommit, "_git", counted)
    with _read_only(repo / ".git"):
        out = fix(repo)
    assert out.sha is None and "index.lock" in out.why_not, out
    assert not out.again and tries == ["commit"]


@pytest.mark.parametrize("autocrlf", ["input", "true", "text=auto"])
def test_a_note_committed_with_crlf_under_autocrlf_gets_its_commit(repo, autocrlf):
    """A note committed with CRLF line ends (from Windows), and core.autocrlf set since:
    git leaves a file whose committed text has CRs as it is ("safer autocrlf"), but
    hash-object, which reads no index, converts it. The note the person never touched
    was taken for one with uncommitted edits, and no fix of it was ever committed."""
    (repo / NOTE).write_bytes(b"# Alpha\r\n\r\nAlpha body.\r\n")
    git(repo, "commit", "-q", "-am", "from Windows")
    if autocrlf == "text=auto":  # GitHub's suggested .gitattributes, added since
        (repo / ".git" / "info" / "attributes").write_text("* text=auto\n")
    else:
        git(repo, "config", "core.autocrlf", autocrlf)
    assert git(repo, "status", "--porcelain") == ""
    out = fix(repo)
    assert out.why_not is None and out.sha, out
    committed = subprocess.run(["git", "show", f"HEAD:{NOTE}"], cwd=repo, capture_output=True)
    assert committed.stdout == (repo / NOTE).read_bytes()  # CRLF, as the note is
    assert git(repo, "status", "--porcelain") == ""
    assert fix(repo, job_id=7) == out  # a run that died before recording it finds it


def test_a_crlf_note_under_autocrlf_with_a_persons_edit_still_gets_no_commit(repo):
    (repo / NOTE).write_bytes(b"# Alpha\r\n\r\nAlpha body.\r\n")
    git(repo, "commit", "-q", "-am", "from Windows")
    git(repo, "config", "core.autocrlf", "input")
    (repo / NOTE).write_bytes(b"# Alpha\r\n\r\nAlpha body.\r\nA person's line.\r\n")
    out = fix(repo)
    assert out.sha is None and "uncommitted edits" in out.why_not
    assert commits(repo)[0] == "from Windows"


def test_a_persons_save_while_the_commit_waits_for_the_index_is_not_committed(repo, monkeypatch):
    """The commit waits up to seconds for another git's index lock: a person who saved
    the note meanwhile had their text committed as "reviewq fix: ..." (and a warning
    said so afterwards). Each try now first checks the note still holds the fix."""
    lock = repo / ".git" / "index.lock"
    lock.write_text("")  # a person's editor runs `git status` just then
    saved = threading.Event()
    real = gitcommit._git

    def person_saves_during_the_first_try(root, *args, **kw):
        if args[0] == "commit" and not saved.is_set():
            saved.set()
            note = repo / NOTE
            note.write_bytes(note.read_bytes() + b"A person's sentence.\n")
            try:
                return real(root, *args, **kw)
            finally:
                lock.unlink()  # their git is done
        return real(root, *args, **kw)

    monkeypatch.setattr(gitcommit, "_git", person_saves_during_the_first_try)
    out = fix(repo)
    assert saved.is_set() and out.sha is None, out
    assert "changed" in out.why_not and commits(repo) == ["the KB"]
    assert b"A person's sentence." in (repo / NOTE).read_bytes()


def test_a_fix_the_person_committed_themselves_is_not_called_their_uncommitted_edit(repo):
    """The commit waited (an index lock), and the person committed the fixed note with
    their own work meanwhile (`git commit -a`): the next try called it "the note had
    uncommitted edits", sending them to look for edits there are none of."""
    before = (repo / NOTE).read_bytes()
    after = before.replace(b"Alpha body.", b"Alpha body, FIXED.")
    (repo / NOTE).write_bytes(after)
    git(repo, "commit", "-q", "-am", "the person's commit")
    msg = message(NOTE, ["prose/body-check"], 7, "fake", "fake")
    out = commit_fix(repo, NOTE, before, after, msg)
    assert out.sha is None and "committed already" in out.why_not, out
    assert "uncommitted" not in out.why_not and commits(repo)[0] == "the person's commit"


def test_a_branch_lock_another_git_holds_is_waited_for_as_the_index_lock_is(repo, monkeypatch):
    """A person's git updating the branch holds refs/heads/main.lock (and a crashed one
    leaves it): the commit failed for good, where the same refusal for index.lock is
    waited out and then tried again at each tick."""
    monkeypatch.setattr(gitcommit, "_LOCK_TRIES", 2)
    lock = repo / ".git" / "refs" / "heads" / "main.lock"
    lock.write_text("")
    before = (repo / NOTE).read_bytes()
    out = fix(repo)
    assert out.sha is None and out.again and "main.lock" in out.why_not, out
    lock.unlink()
    after = (repo / NOTE).read_bytes()
    msg = message(NOTE, ["prose/body-check"], 7, "fake", "fake")
    assert commit_fix(repo, NOTE, before, after, msg).sha == git(repo, "rev-parse", "HEAD").strip()


def test_a_repository_with_half_an_identity_gets_its_commit_as_reviewq(repo, tmp_path, monkeypatch):
    """user.email set, user.name not, and `user.useConfigOnly` (git may not guess a
    name): git refused the commit, "Author identity unknown", where a machine with no
    identity at all gets its commit as reviewq."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    git(repo, "config", "--unset", "user.name")
    git(repo, "config", "user.useConfigOnly", "true")
    out = fix(repo)
    assert out.why_not is None and out.sha, out
    assert git(repo, "log", "-1", "--format=%an <%ae>") == "reviewq <reviewq@localhost>\n"


def test_a_merge_in_progress_holds_the_commit_until_it_ends(repo):
    """git makes no partial commit during a merge (or a cherry-pick): the fix's commit was
    given up for good, and the person, once their merge was done, found the fix
    uncommitted. It is tried again, as for a lock, and made once the merge ends."""
    git(repo, "checkout", "-q", "-b", "side")
    (repo / "side.txt").write_text("side\n")
    git(repo, "add", "side.txt")
    git(repo, "commit", "-q", "-m", "side")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "--no-commit", "side")
    before = (repo / NOTE).read_bytes()
    out = fix(repo)
    assert out.sha is None and out.again and "during a merge" in out.why_not, out
    git(repo, "commit", "-q", "--no-edit")  # the person ends their merge
    after = (repo / NOTE).read_bytes()
    msg = message(NOTE, ["prose/body-check"], 7, "fake", "fake")
    done = commit_fix(repo, NOTE, before, after, msg)
    assert done.sha and done.sha == git(repo, "rev-parse", "HEAD").strip()
    assert git(repo, "show", "--name-only", "--format=", done.sha).split() == [NOTE]


def test_a_long_note_path_is_shortened_in_the_subject_not_its_gates(tmp_path):
    """The real corpus's notes are named by their claim (80 characters and more): the
    subject cut at 100 characters ended "(prose…", so `git log --oneline` named no gate
    for most fixes, and a second gate never. The path gives way; the body names it whole."""
    rel = "kb/notes/a-knowledge-base-holds-theories-descriptions-and-prescriptions-with.md"
    root = tmp_path / "kbroot"
    (root / "kb" / "notes").mkdir(parents=True)
    (root / rel).write_bytes(b"# Alpha\n\nAlpha body.\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "-c", "user.name=A Person", "-c", "user.email=p@example.org", "commit", "-qm", "kb")
    gates = ["prose/source-residue", "frontmatter/title-as-claim"]
    before = (root / rel).read_bytes()
    (root / rel).write_bytes(before + b"More.\n")
    msg = message(rel, gates, 7, "fake", "fake")
    assert commit_fix(root, rel, before, before + b"More.\n", msg).sha
    subject = commits(root)[0]
    assert len(subject) <= 100, subject
    assert subject.startswith("reviewq fix: kb/notes/a-know"), subject
    assert subject.endswith(f"-with.md ({', '.join(gates)})"), subject
    assert f"edited {rel} to meet" in git(root, "log", "-1", "--format=%b")


def test_a_redo_fix_commit_quotes_the_persons_asks_without_a_trailer_of_theirs(repo):
    """A redo's fix is there because a person asked: the message says what they asked.
    Indented, so an ask that reads like a trailer is never taken for this commit's."""
    before = (repo / NOTE).read_bytes()
    after = before + b"More.\n"
    (repo / NOTE).write_bytes(after)
    asks = "Say it plainly.\nReviewq-Job: 99"
    msg = message(NOTE, ["prose/body-check"], 7, "fake", "fake", asks=asks)
    sha = commit_fix(repo, NOTE, before, after, msg).sha
    body = git(repo, "log", "-1", "--format=%B", sha)
    assert "A person asked (decide redo):\n  Say it plainly.\n  Reviewq-Job: 99\n" in body
    assert git(repo, "log", "--format=%H", "--grep=^Reviewq-Job: 99$") == ""
    assert git(repo, "log", "--format=%H", "--grep=^Reviewq-Job: 7$").strip() == sha


@pytest.mark.parametrize(
    ("found", "asks"),
    [
        ((), "Cut the second paragraph.\n\n\nThen say it plainly."),
        ((f"prose/body-check: high: {'x' * 175} and the rest",), None),
    ],
    ids=["asks-with-two-blank-lines", "finding-cut-at-a-space"],
)
def test_a_fix_commit_quoting_a_persons_text_is_found_after_a_crash(repo, found, asks):
    """git tidies a message's whitespace as it stores it (no blank line twice, no trailing
    space): a redo's asks with two blank lines, or a finding cut at 200 characters just
    after a space, made the stored message differ from the one reviewq wrote, and a run
    that died before recording its commit then called that commit "not reviewq's"."""
    before = (repo / NOTE).read_bytes()
    after = before + b"More.\n"
    (repo / NOTE).write_bytes(after)
    msg = message(NOTE, ["prose/body-check"], 42, "fake", "fake", found=found, asks=asks)
    first = commit_fix(repo, NOTE, before, after, msg)
    assert first.sha
    again = commit_fix(repo, NOTE, before, after, msg)  # the run after the crash
    assert again.sha == first.sha and again.why_not is None, again


def test_a_redos_long_asks_do_not_keep_its_fix_from_its_commit(repo):
    """The message went to git as one argument, and Linux takes none past 128 KiB: asks
    that `decide --feedback` itself could carry, quoted a line each with an indent, made
    the message too long for it, and the fix stayed uncommitted ("git could not run:
    Argument list too long")."""
    asks = "\n".join(["ok"] * 30_000)  # 90 KB: under the 128 KiB one argument may hold
    before = (repo / NOTE).read_bytes()
    after = before + b"More.\n"
    (repo / NOTE).write_bytes(after)
    out = commit_fix(repo, NOTE, before, after, message(NOTE, ["g"], 7, "fake", "fake", asks=asks))
    assert out.sha and out.why_not is None, out
    assert git(repo, "log", "-1", "--format=%b", out.sha).count("\n  ok") == 30_000


def test_a_persons_uncommitted_mode_change_is_not_committed_as_reviewqs(repo):
    """A note made executable by a person (chmod, not committed) went into the fix's
    commit as "mode change 100644 => 100755" under reviewq's name: the fix keeps the
    file's mode, and git commits the file as it is. It gets no commit, as an edit does."""
    os.chmod(repo / NOTE, 0o755)
    out = fix(repo)
    assert out.sha is None and not out.again, out
    assert out.why_not == (
        "the note's file mode was changed (100644 to 100755) and not committed; "
        "a commit would take it as reviewq's"
    )
    assert commits(repo) == ["the KB"]


def test_a_git_am_under_way_holds_the_commit_until_it_ends(repo):
    """`git am` stopped at a patch keeps HEAD on the branch: the fix was committed between
    the patches it had applied, and the person's `git am --abort` then no longer gave
    their branch back ("You seem to have moved HEAD ... Not rewinding"), the half-applied
    series left on it. The commit waits for the am to end, as for a merge."""
    git(repo, "checkout", "-q", "-b", "side")
    _another_commit(repo, "one.txt")
    _another_commit(repo, "two.txt")
    patches = git(repo, "format-patch", "-2", "-o", str(repo.parent / "patches")).split()
    git(repo, "checkout", "-q", "main")
    (repo / "two.txt").write_text("main\n")
    git(repo, "add", "two.txt")
    git(repo, "commit", "-q", "-m", "main's two")
    am = subprocess.run(["git", "am", "-q", *patches], cwd=repo, capture_output=True, check=False)
    assert am.returncode != 0  # the first patch applied, stopped at the second
    before = (repo / NOTE).read_bytes()
    out = fix(repo)
    assert out.sha is None and out.again, out
    assert out.why_not == "a `git am` is under way; the commit is made once it ends"
    git(repo, "am", "--abort")  # the person gives up the series: their branch as it was
    assert commits(repo) == ["main's two", "the KB"]
    after = (repo / NOTE).read_bytes()
    msg = message(NOTE, ["prose/body-check"], 7, "fake", "fake")
    done = commit_fix(repo, NOTE, before, after, msg)
    assert done.sha and commits(repo)[0].startswith(f"reviewq fix: {NOTE}"), done


def test_files_as_the_commit_holds_them_are_an_update_and_an_edit_or_a_new_file_is_not(
    repo, tmp_path
):
    """K100's test of whose change it was: a clone pulled to the next commit holds each
    changed file as that commit does; an edit over it, or a file no commit holds, does
    not (an agent's change while the copy was updated is still the agent's)."""
    copy = tmp_path / "copy"
    git(tmp_path, "clone", "-q", str(repo), str(copy))
    (repo / NOTE).write_bytes(b"# Alpha\n\nA person's edit.\n")
    (repo / "kb/notes/beta.md").write_bytes(b"# Beta\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "edits")
    git(copy, "pull", "-q", "--ff-only")
    head = git(copy, "rev-parse", "HEAD").strip()
    changed = [NOTE, "kb/notes/beta.md", "kb/notes/gone.md"]
    assert gitcommit.as_committed(copy, head, changed)
    (copy / NOTE).write_bytes(b"# Alpha\n\nAn agent's edit.\n")
    assert not gitcommit.as_committed(copy, head, changed)
    git(copy, "checkout", "-q", "--", NOTE)
    (copy / "kb/notes/gone.md").write_bytes(b"an agent's new file\n")
    assert not gitcommit.as_committed(copy, head, changed)


def test_a_pull_or_a_merge_is_an_update_and_a_commit_or_a_checkout_is_not(repo, tmp_path):
    """C87's test of how HEAD moved since a launch, in git's own reflog: a `git pull`
    (fast-forward, or a merge of a copy's own commit) or a fetch and a merge brought
    what was made elsewhere; a commit or a checkout of another branch was made here."""
    copy = tmp_path / "copy"
    git(tmp_path, "clone", "-q", str(repo), str(copy))
    for where in (repo, copy):
        git(where, "config", "user.name", "A Person")
        git(where, "config", "user.email", "person@example.org")

    def upstream_edit(line: str) -> None:
        (repo / "kb/notes/beta.md").write_text(f"# Beta\n\n{line}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", line)

    def head() -> str:
        return git(copy, "rev-parse", "HEAD").strip()

    launch = head()
    upstream_edit("a fast-forward")
    git(copy, "pull", "-q", "--ff-only")
    assert gitcommit.moved_by_update(copy, launch)
    launch = head()
    (copy / "kb/notes/gamma.md").write_text("# Gamma\n")
    git(copy, "add", "-A")
    git(copy, "commit", "-q", "-m", "the copy's own")
    assert not gitcommit.moved_by_update(copy, launch)  # a commit made here
    launch = head()
    upstream_edit("a merge")
    git(copy, "pull", "-q", "--no-rebase", "--no-edit")
    assert gitcommit.moved_by_update(copy, launch)
    launch = head()
    upstream_edit("a fetch and a merge")
    git(copy, "fetch", "-q")
    git(copy, "merge", "-q", "--no-edit", "origin/HEAD")
    assert gitcommit.moved_by_update(copy, launch)
    launch = head()
    git(copy, "checkout", "-q", "-b", "other", "HEAD~1")
    assert not gitcommit.moved_by_update(copy, launch)  # another branch
    assert not gitcommit.moved_by_update(copy, "0" * 40)  # a launch the reflog never saw
