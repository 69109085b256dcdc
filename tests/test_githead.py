"""The commit HEAD is at, read from git's own files (export's recorded-commit, kept as
a job's snapshot of a note is taken): held against `git rev-parse HEAD` in repositories
as people keep them."""

from __future__ import annotations

import os
import subprocess

import pytest

from orchestrator.kb.githead import head_commit

from .test_fix_commits import git
from .test_gitcommit import _committed


def rev_parse(root) -> str:
    return git(root, "rev-parse", "HEAD").strip()


def test_outside_git_and_before_the_first_commit_there_is_none(tmp_path):
    assert head_commit(tmp_path) == ""
    git(tmp_path, "init", "-q", "-b", "main")
    assert head_commit(tmp_path) == ""


@pytest.mark.parametrize(
    "layout", ["loose", "packed", "detached", "a branch with a slash", "a worktree"]
)
def test_head_is_the_one_git_names(tmp_path, layout):
    root = tmp_path / "kbroot"
    _committed(root, root, "the KB")
    git(root, "commit", "-q", "--allow-empty", "-m", "second")
    if layout == "packed":
        git(root, "pack-refs", "--all")
        assert not (root / ".git/refs/heads/main").exists()
    elif layout == "detached":
        git(root, "checkout", "-q", "--detach", "HEAD~1")
    elif layout == "a branch with a slash":
        git(root, "checkout", "-q", "-b", "review/night", "HEAD~1")
    elif layout == "a worktree":  # a .git file naming its folder; refs the repository's
        git(root, "worktree", "add", "-q", "-b", "other", str(tmp_path / "wt"), "HEAD~1")
        git(root, "pack-refs", "--all")
        root = tmp_path / "wt"
        assert (root / ".git").is_file()
    assert head_commit(root) == rev_parse(root)


def test_a_kb_in_a_folder_of_a_larger_repository_names_that_repositorys_head(tmp_path):
    top = tmp_path / "monorepo"
    root = top / "docs" / "kbroot"
    _committed(root, top, "the monorepo")
    assert head_commit(root) == rev_parse(top)
    assert head_commit(root / "kb" / "notes") == rev_parse(top)


def test_a_kb_fenced_off_from_an_enclosing_repository_is_outside_git(tmp_path, monkeypatch):
    """E88: GIT_CEILING_DIRECTORIES is the person's fence, which a fix commit keeps:
    read past it, a KB's reviews named the commit of the repository above it."""
    outer = tmp_path / "srv"
    root = outer / "kbroot"
    _committed(root, outer, "the server")
    assert head_commit(root) == rev_parse(outer)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", f"/nonexistent:{outer}")
    assert head_commit(root) == ""


def git_says(root) -> str:
    """What `git rev-parse HEAD` says at ``root`` as a fix commit's git runs there: ""
    where it finds no repository."""
    p = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    if p.returncode and "not a git repository" in p.stderr:
        return ""
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_a_fence_named_through_a_symbolic_link_is_kept_as_git_keeps_it(tmp_path, monkeypatch):
    """C58: git resolves the links in GIT_CEILING_DIRECTORIES (those before an empty
    entry): a fence named by a link to the enclosing repository's folder, compared as
    written, let its commit be a fenced-off KB's recorded-commit, where git finds none."""
    outer = tmp_path / "srv"
    root = outer / "kbroot"
    _committed(root, outer, "the server")
    (tmp_path / "srv-link").symlink_to(outer)
    for fence in (f"{tmp_path}/srv-link", f"{tmp_path}/srv-link/", f":{tmp_path}/srv-link"):
        monkeypatch.setenv("GIT_CEILING_DIRECTORIES", fence)
        assert head_commit(root) == git_says(root), fence
    assert git_says(root) == rev_parse(outer)  # after an empty entry, git takes it as written


@pytest.fixture
def mounted(tmp_path):
    """A folder in a repository's work tree with a file system of its own mounted on it."""
    if os.geteuid() != 0:
        pytest.skip("mounts a tmpfs: needs root")
    outer = tmp_path / "srv"
    _committed(outer, outer, "the server")
    disk = outer / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_kb_on_a_file_system_mounted_in_a_repository_is_where_git_finds_it(mounted, monkeypatch):
    """C57: git's search for a repository stops at a file system's edge (unless
    GIT_DISCOVERY_ACROSS_FILESYSTEM): read past it, a KB on a disk mounted in the work
    tree of another repository named that repository's commit, where a fix commit finds
    no repository and lands nowhere."""
    root = mounted / "kbroot"
    root.mkdir()
    assert git_says(root) == ""
    assert head_commit(root) == ""
    monkeypatch.setenv("GIT_DISCOVERY_ACROSS_FILESYSTEM", "true")
    assert head_commit(root) == git_says(root) == rev_parse(mounted.parent)


def test_refs_named_beyond_ascii_are_read(tmp_path):
    """C59: refs were read as ASCII: HEAD on a branch named `café`, or a packed-refs
    holding one tag named so, was unknown for every review, and export guessed their
    commit from commit times (E84-E86)."""
    root = tmp_path / "kbroot"
    _committed(root, root, "the KB")
    git(root, "tag", "version-é")
    git(root, "pack-refs", "--all")
    assert head_commit(root) == rev_parse(root)
    git(root, "checkout", "-q", "-b", "café")
    git(root, "commit", "-q", "--allow-empty", "-m", "second")
    assert head_commit(root) == rev_parse(root)
    git(root, "pack-refs", "--all")
    assert head_commit(root) == rev_parse(root)


def test_what_git_files_cannot_say_for_certain_is_unknown(tmp_path):
    """None, not a guess: export reads such reviews' commit from git's history."""
    root = tmp_path / "kbroot"
    _committed(root, root, "the KB")
    (root / ".git/HEAD").write_text("not a ref\n")
    assert head_commit(root) is None
    other = tmp_path / "other"
    other.mkdir()
    (other / ".git").write_bytes(b"gitdir: \xff\n")  # a .git file that is not text
    assert head_commit(other) is None
    (other / ".git").write_text("a note to self\n")  # C60: git: "invalid gitfile format"
    assert head_commit(other) is None
    (root / ".git/HEAD").write_text("ref: refs/heads/.invalid\n")
    (root / ".git/reftable").mkdir()  # git 2.45's binary refs
    assert head_commit(root) is None
