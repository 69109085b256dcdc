"""The KB watch (workers/kbwatch.py) with real inotify, real files and real agent processes:
what one window reports, what it must not, and the scans it falls back to."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from orchestrator import logs
from workers import kbwatch
from workers.kbwatch import KBWatch, lost, tree_stamps

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or kbwatch.INotify is None, reason="inotify is Linux's"
)

TREES = ("kb",)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    for rel in ("kb/notes/a.md", "kb/notes/sub/b.md", "kb/gates/g.md", "kb/.hidden/h.md"):
        (r / rel).parent.mkdir(parents=True, exist_ok=True)
        (r / rel).write_text(f"{rel}\n")
    (r / "outside").mkdir()
    return r


@pytest.fixture
def watch():
    w = KBWatch()
    yield w
    w.close()


def agent(root: Path, script: str) -> None:
    """Run ``script`` with sh in ``root``, as an agent would, to its end."""
    subprocess.run(["sh", "-ec", script], cwd=root, check=True, timeout=60)


def window(w: KBWatch, root: Path, script: str, trees=TREES) -> set[str]:
    token = w.begin(root, trees)
    assert token.watched == tuple(trees) and not token.scanned  # inotify, not the scans
    agent(root, script)
    return w.end(token)


# --- what a window reports -------------------------------------------------------------------


@pytest.mark.parametrize(
    "script, expected",
    [
        ("echo more >> kb/notes/a.md", {"kb/notes/a.md"}),
        ("echo new > kb/notes/new.md", {"kb/notes/new.md"}),
        ("rm kb/notes/sub/b.md", {"kb/notes/sub/b.md"}),
        ("touch kb/gates/g.md", {"kb/gates/g.md"}),
        ("mv kb/notes/a.md kb/notes/c.md", {"kb/notes/a.md", "kb/notes/c.md"}),
        ("echo x > outside/in.md; mv outside/in.md kb/notes/in.md", {"kb/notes/in.md"}),
        ("mv kb/notes/a.md outside/a.md", {"kb/notes/a.md"}),
        ("echo x > outside/o.md; echo y >> kb/../outside/o.md", set()),  # not under a tree
    ],
    ids=["modify", "create", "delete", "touch", "rename", "move-in", "move-out", "outside"],
)
def test_a_window_reports_each_file_changed_created_deleted_or_moved(watch, root, script, expected):
    assert window(watch, root, script) == expected


def test_a_new_folder_of_notes_reports_every_file_in_it_and_is_watched_from_then_on(watch, root):
    made = window(
        watch,
        root,
        "mkdir -p kb/notes/new/deeper; echo 1 > kb/notes/new/one.md;"
        " echo 2 > kb/notes/new/deeper/two.md",
    )
    assert made == {"kb/notes/new/one.md", "kb/notes/new/deeper/two.md"}
    # A folder filled elsewhere and moved in: its files were written before it was watched.
    moved = window(
        watch,
        root,
        "mkdir -p outside/pack/inner; echo 3 > outside/pack/three.md;"
        " echo 4 > outside/pack/inner/four.md; mv outside/pack kb/notes/pack",
    )
    assert moved == {"kb/notes/pack/three.md", "kb/notes/pack/inner/four.md"}
    later = window(
        watch, root, "echo x >> kb/notes/pack/inner/four.md; echo y >> kb/notes/new/deeper/two.md"
    )
    assert later == {"kb/notes/pack/inner/four.md", "kb/notes/new/deeper/two.md"}


def test_a_folder_moved_away_is_reported_by_its_path_and_no_longer_followed(watch, root):
    assert window(watch, root, "mv kb/notes/sub outside/sub") == {"kb/notes/sub/"}
    # Its watch went with it: what happens to it outside the KB is nobody's business here,
    # and must not come back under its old path.
    assert window(watch, root, "echo x >> outside/sub/b.md; echo y > outside/sub/c.md") == set()
    assert window(watch, root, "rm -r kb/notes") == {"kb/notes/", "kb/notes/a.md"}


def test_a_folder_found_in_a_new_folder_before_its_move_is_read_is_followed_at_its_new_path(
    root,
):
    # Read only at end: the new folder is listed before the move of sub into it is read,
    # so sub's watch turns up again under another path.
    unread = KBWatch(reader=False)
    try:
        token = unread.begin(root, TREES)
        agent(root, "mkdir kb/notes/c; mv kb/notes/sub kb/notes/c/d")
        assert unread.end(token) == {"kb/notes/sub/", "kb/notes/c/d/b.md"}
        token = unread.begin(root, TREES)
        assert token.watched == TREES  # not mistaken for a folder of another KB
        agent(root, "echo x >> kb/notes/c/d/b.md")
        assert unread.end(token) == {"kb/notes/c/d/b.md"}
    finally:
        unread.close()


def test_hidden_entries_are_not_reported(watch, root):
    script = (
        "echo swap > kb/notes/.a.md.swp; echo x >> kb/.hidden/h.md;"
        " mkdir -p kb/notes/.git/objects; echo o > kb/notes/.git/objects/o;"
        " echo z > kb/notes/.tmp; mv kb/notes/.tmp kb/notes/.tmp2"
    )
    assert window(watch, root, script) == set()
    # ... while the same window does see a visible file
    assert window(watch, root, script.replace("; echo z", "; echo v > kb/notes/v.md; echo z")) == {
        "kb/notes/v.md"
    }


def test_a_tree_that_does_not_exist_yet_is_reported_when_it_appears(watch, root):
    trees = ("kb", "gates")
    # A file named like the tree is not a tree (the scans ignored it too).
    assert window(watch, root, "echo g > gates; echo x >> kb/notes/a.md; rm gates", trees) == {
        "kb/notes/a.md"
    }
    assert window(watch, root, "mkdir gates; echo g > gates/g.md", trees) == {"gates/g.md"}
    assert window(watch, root, "echo more >> gates/g.md", trees) == {"gates/g.md"}
    assert window(watch, root, "rm -r gates", trees) == {"gates/", "gates/g.md"}
    # A tree asked for by no window of this one is not reported to it.
    assert window(watch, root, "mkdir gates; echo g > gates/g.md") == set()


# --- the window's bounds ---------------------------------------------------------------------


def test_what_happened_before_begin_or_after_end_is_not_reported(watch, root):
    assert window(watch, root, "true") == set()
    for i in range(30):  # the events are still in the kernel's queue when begin runs
        agent(root, f"echo {i} >> kb/notes/a.md; echo {i} > kb/notes/n{i}.md")
        token = watch.begin(root, TREES)
        agent(root, "true")
        assert watch.end(token) == set(), i
    token = watch.begin(root, TREES)
    agent(root, "echo in >> kb/notes/sub/b.md")
    assert watch.end(token) == {"kb/notes/sub/b.md"}
    agent(root, "echo after >> kb/notes/a.md")
    assert watch.end(token) == set()  # ended once; a second end reports nothing


def test_overlapping_windows_each_see_their_own_span(watch, root):
    first = watch.begin(root, TREES)
    agent(root, "echo 1 >> kb/notes/a.md")
    second = watch.begin(root, TREES)
    agent(root, "echo 2 >> kb/notes/sub/b.md")
    assert watch.end(first) == {"kb/notes/a.md", "kb/notes/sub/b.md"}
    agent(root, "echo 3 >> kb/gates/g.md")
    third = watch.begin(root, TREES)
    agent(root, "echo 4 > kb/notes/d.md")
    assert watch.end(second) == {"kb/notes/sub/b.md", "kb/gates/g.md", "kb/notes/d.md"}
    assert watch.end(third) == {"kb/notes/d.md"}
    # The later window ends first: what came before it stays the earlier one's alone.
    outer = watch.begin(root, TREES)
    agent(root, "echo 5 >> kb/notes/a.md")
    inner = watch.begin(root, TREES)
    agent(root, "echo 6 >> kb/notes/sub/b.md")
    assert watch.end(inner) == {"kb/notes/sub/b.md"}
    assert watch.end(outer) == {"kb/notes/a.md", "kb/notes/sub/b.md"}


def test_windows_on_other_trees_and_roots_do_not_see_each_other(watch, root, tmp_path):
    other = tmp_path / "other"
    (other / "kb").mkdir(parents=True)
    (root / "gates").mkdir()
    kb, gates, elsewhere = (
        watch.begin(root, ["kb"]),
        watch.begin(root, ["gates"]),
        watch.begin(other, TREES),
    )
    agent(root, "echo x >> kb/notes/a.md; echo y > ../other/kb/z.md")
    assert watch.end(gates) == set()
    assert watch.end(kb) == {"kb/notes/a.md"}
    assert watch.end(elsewhere) == {"kb/z.md"}


def test_a_tree_deeper_than_the_root_s_own_folders_or_hidden_is_scanned(watch, root):
    (root / ".hidden-tree").mkdir()
    token = watch.begin(root, ["kb/notes", "kb", ".hidden-tree"])
    assert token.watched == ("kb",) and token.scanned == ("kb/notes", ".hidden-tree")
    agent(root, "echo x >> kb/notes/a.md; echo y >> kb/gates/g.md; echo z > .hidden-tree/z")
    assert watch.end(token) == {"kb/notes/a.md", "kb/gates/g.md", ".hidden-tree/z"}


# --- the log and the kernel's queue ----------------------------------------------------------


def test_nothing_is_kept_while_no_window_is_open(watch, root):
    assert window(watch, root, "echo x >> kb/notes/a.md") == {"kb/notes/a.md"}
    assert watch.held() == 0
    agent(root, "for i in $(seq 300); do echo $i > kb/notes/idle$i.md; done")
    assert watch.settle(30)  # the thread read all of it, with no one to tell
    assert watch.held() == 0
    token = watch.begin(root, TREES)
    agent(root, "for i in $(seq 2000); do echo $i >> kb/notes/a.md; done")
    assert watch.settle(30)
    assert watch.held() == 1  # 4,000 events on one file are one path
    assert watch.end(token) == {"kb/notes/a.md"}
    assert watch.held() == 0


def _queue_limit() -> int:
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if limit > 100_000:
        pytest.skip(f"fs.inotify.max_queued_events is {limit}: too many events to make")
    return limit


def test_the_thread_keeps_the_kernel_queue_from_overflowing(watch, root):
    # Each batch fits the queue; all of them twice over do not: without the thread
    # reading while the agents run, the queue overflows (the next test).
    limit = _queue_limit()
    token = watch.begin(root, TREES)
    for _ in range(8):
        agent(root, f"for i in $(seq {limit // 8}); do echo $i >> kb/notes/a.md; done")
    assert watch.end(token) == {"kb/notes/a.md"}  # and no lost("kb")


def test_an_overflowed_queue_reports_the_whole_tree_and_the_watch_recovers(root):
    limit = _queue_limit()
    unread = KBWatch(reader=False)  # only begin and end read the queue
    try:
        token = unread.begin(root, TREES)
        # A folder made in the gap is seen by the walk that follows the overflow.
        agent(
            root,
            f"for i in $(seq {limit}); do echo $i >> kb/notes/a.md; done;"
            " mkdir kb/notes/unseen; echo u > kb/notes/unseen/u.md",
        )
        changed = unread.end(token)
        assert lost("kb") in changed and changed <= {lost("kb"), "kb/notes/a.md"}
        assert window(unread, root, "echo again >> kb/notes/unseen/u.md") == {
            "kb/notes/unseen/u.md"
        }
    finally:
        unread.close()


# --- the scans it falls back to --------------------------------------------------------------


def _emfile(**_kw):
    raise OSError(errno.EMFILE, "Too many open files")


@pytest.mark.parametrize("cause", ["emfile", "no-module"])
def test_without_inotify_the_scans_still_report_every_change(root, monkeypatch, cause):
    if cause == "no-module":
        monkeypatch.setattr(kbwatch, "INotify", None)
    w = KBWatch(factory=_emfile if cause == "emfile" else None)
    logs.get()  # configured before the capture, not inside it
    try:
        with capture_logs() as logged:
            token = w.begin(root, TREES)
            agent(root, "echo x >> kb/notes/a.md; echo n > kb/notes/sub/n.md; rm kb/gates/g.md")
            changed = w.end(token)
            assert token.scanned == TREES and not token.watched
            assert changed == {"kb/notes/a.md", "kb/notes/sub/n.md", "kb/gates/g.md"}
            second = w.begin(root, TREES)
            assert w.end(second) == set()
        warnings = [e for e in logged if e["event"] == "kbwatch.unavailable"]
        assert len(warnings) == 1 and warnings[0]["log_level"] == "warning"
        assert ("EMFILE" in warnings[0]["reason"] or "Too many" in warnings[0]["reason"]) == (
            cause == "emfile"
        )
    finally:
        w.close()


def _few_watches(n: int):
    """An inotify whose user may add ``n`` watches in all (fs.inotify.max_user_watches)."""

    class Few(kbwatch.INotify):  # type: ignore[misc, valid-type]
        added = 0

        def add_watch(self, path, mask):
            if Few.added >= n:
                raise OSError(errno.ENOSPC, "No space left on device")
            Few.added += 1
            return super().add_watch(path, mask)

    return Few


def test_a_tree_over_the_watch_limit_is_scanned_instead(root):
    w = KBWatch(factory=_few_watches(3))  # the root, kb and one of its four folders
    logs.get()
    try:
        with capture_logs() as logged:
            token = w.begin(root, TREES)
        assert token.scanned == TREES and not token.watched
        agent(root, "echo x >> kb/notes/sub/b.md; echo y > kb/gates/new.md")
        assert w.end(token) == {"kb/notes/sub/b.md", "kb/gates/new.md"}
        assert [e["event"] for e in logged] == ["kbwatch.unavailable"]
        assert "max_user_watches" in logged[0]["reason"]
        assert not [rel for rel in w._roots[str(root)].dirs if rel]  # its watches were freed
    finally:
        w.close()


def test_a_folder_that_cannot_be_watched_mid_window_counts_the_tree_as_touched(root):
    w = KBWatch(factory=_few_watches(5))  # exactly the root and kb's four folders
    try:
        token = w.begin(root, TREES)
        assert token.watched == TREES
        agent(root, "mkdir kb/notes/more; echo m > kb/notes/more/m.md")
        assert lost("kb") in w.end(token)  # events in it from then on would be missed
        token = w.begin(root, TREES)  # later windows scan
        assert token.scanned == TREES
        agent(root, "echo x >> kb/notes/more/m.md")
        assert w.end(token) == {"kb/notes/more/m.md"}
    finally:
        w.close()


def test_a_root_that_is_not_a_folder_is_scanned(watch, tmp_path):
    missing = tmp_path / "nowhere"
    token = watch.begin(missing, TREES)
    assert token.scanned == TREES
    assert watch.end(token) == set()


# --- in an attempt -----------------------------------------------------------------------------


def _attempt(root: Path, script: str, guarded=("kb/notes/a.md",), trees=TREES, **kw):
    from orchestrator.config import ReviewerProfile
    from workers.attempt import run_attempt
    from workers.reviewers import AttemptSpec, Command, for_profile

    folder = root.parent / "attempt"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    spec = AttemptSpec(
        "review", 1, 1, folder / "prompt.md", folder / "out.md", folder, folder, root, "m"
    )
    reviewer = for_profile(ReviewerProfile(name="sh", kind="command", command=["x"]))
    argv = ["sh", "-ec", script + '; echo "## Result: PASS" > "$1"', "agent", str(spec.output_path)]
    reviewer.command = lambda spec: Command(argv=argv, cwd=root)  # type: ignore[method-assign]
    return run_attempt(
        reviewer, spec, timeout_s=30, max_turns=5, guarded=guarded, trees=trees, **kw
    )


def _open_windows() -> int:
    return sum(len(r.open) for r in kbwatch.WATCH._roots.values())


def test_an_agent_that_changes_the_kb_fails_its_attempt_and_says_what_it_changed(root):
    clean = _attempt(root, "cat kb/notes/a.md kb/notes/sub/b.md > /dev/null")
    assert clean.classification == "output" and clean.touched == []
    out = _attempt(root, "echo x >> kb/notes/a.md; echo y > kb/notes/sub/new.md; rm kb/gates/g.md")
    assert out.classification == "reviewer-touched-kb"
    assert out.touched == ["kb/gates/g.md", "kb/notes/a.md", "kb/notes/sub/new.md"]
    assert out.reasons == [f"the reviewer changed {p}" for p in out.touched]
    assert out.touched_hashes == {
        "kb/notes/a.md": hashlib.sha256((root / "kb/notes/a.md").read_bytes()).hexdigest(),
        "kb/notes/sub/new.md": hashlib.sha256(b"y\n").hexdigest(),
        "kb/gates/g.md": "missing",
    }
    assert _open_windows() == 0


def test_an_attempt_that_cannot_launch_closes_its_window(root):
    from orchestrator.config import ReviewerProfile
    from workers.attempt import LAUNCH_FAILURE, run_attempt
    from workers.reviewers import AttemptSpec, Command, for_profile

    folder = root.parent / "attempt"
    folder.mkdir()
    spec = AttemptSpec("review", 1, 1, folder / "p.md", folder / "o.md", folder, folder, root, "m")
    reviewer = for_profile(ReviewerProfile(name="none", kind="command", command=["x"]))
    argv = [str(root / "no-such-agent")]
    reviewer.command = lambda spec: Command(argv=argv, cwd=root)  # type: ignore[method-assign]
    out = run_attempt(reviewer, spec, timeout_s=30, max_turns=5, trees=TREES)
    assert out.classification == LAUNCH_FAILURE
    assert _open_windows() == 0


def test_an_attempt_interrupted_before_its_agent_started_leaves_no_tmpdir(
    root, monkeypatch, own_tmpdir
):
    """The agent's TMPDIR was made before the window's scan: a run-job's Ctrl-C or SIGTERM
    (raised wherever it finds the process), or a worker's stop that exited under the
    thread, came meanwhile and left it, with no agent and no registry entry to name it."""
    from workers import attempt

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(attempt.WATCH, "begin", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _attempt(root, "true")
    assert list(own_tmpdir.glob("reviewq-job-*")) == []


def test_an_agents_tmpdir_goes_before_the_registry_entry_naming_it(root, monkeypatch, own_tmpdir):
    """The attempt's end removed the agent's registry entry, then its TMPDIR: a worker's
    stop that found no entry exited under the thread in between (a SIGKILL there too), and
    the folder stayed with nothing naming it for a reap."""
    from workers import attempt

    state = root.parent / "state"
    drop = attempt._drop

    def cut_short(scratch: str | None) -> None:
        raise SystemExit  # the thread's end, as its worker exits under it

    monkeypatch.setattr(attempt, "_drop", cut_short)
    with pytest.raises(SystemExit):
        _attempt(root, "true", registry=attempt.registry_dir(state))
    [left] = own_tmpdir.glob("reviewq-job-1-attempt-1-*")
    monkeypatch.setattr(attempt, "_drop", drop)
    attempt.reap_orphans(state, mine=True)  # the stop's reap, or the next worker's
    assert not left.exists()


def test_an_empty_tmpdir_goes_without_a_walk_and_one_an_agent_filled_with_one(
    root, monkeypatch, own_tmpdir
):
    """Most agents leave their TMPDIR empty: rmtree's walk of it (its checks, a descriptor,
    a listing: 14 system calls) cost a worker ~45 µs a job for one rmdir's work. What an
    agent left there still goes, by the walk."""
    from workers import attempt

    walked: list[str] = []
    rmtree = attempt.shutil.rmtree

    def walk(path: str, *args: object, **kwargs: object) -> None:
        if Path(path).name.startswith("reviewq-job-"):  # not the test's own folders
            walked.append(path)
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(attempt.shutil, "rmtree", walk)
    assert _attempt(root, "true").classification == "output"
    assert walked == [] and list(own_tmpdir.glob("reviewq-job-*")) == []
    assert _attempt(root, 'mkdir "$TMPDIR/d"; echo x > "$TMPDIR/d/f"').classification == "output"
    assert len(walked) == 1 and list(own_tmpdir.glob("reviewq-job-*")) == []


def test_a_workers_agents_share_a_kept_tmpdir_emptied_between_them(root, own_tmpdir):
    """Made and removed for every agent, the TMPDIR cost a worker ~60-300 µs of CPU a job
    (a disk's /tmp journals the mkdir and the rmdir). A worker thread's agents share one,
    named in its process's list before it is made, emptied of what each agent left
    before the next has it, and removed by the worker's stop."""
    import socket

    from workers import attempt

    registry = attempt.registry_dir(root.parent / "state")
    seen = []
    for script in (
        'mkdir "$TMPDIR/d"; echo x > "$TMPDIR/d/f"; echo y > "$TMPDIR/.h"',
        'test -z "$(ls -A "$TMPDIR")"',  # the first agent's files are gone
    ):
        out = _attempt(root, f'echo "$TMPDIR"; {script}', registry=registry, keep_tmpdir=True)
        assert out.classification == "output", out.reasons
        seen.append((root.parent / "attempt" / "stdout.log").read_text().strip())
    kept = Path(seen[0])
    assert seen == [str(kept)] * 2 and kept.parent == own_tmpdir
    assert kept.name.startswith(f"reviewq-worker-{os.getpid()}-") and list(kept.iterdir()) == []
    listed = registry / f"{socket.gethostname()}-{os.getpid()}.tmpdirs"
    assert listed.read_text().splitlines() == [str(kept)]
    assert [p.name for p in registry.iterdir()] == [listed.name]  # no agent's entry left
    attempt.reap_orphans(root.parent / "state", mine=True)  # the worker's stop
    assert not kept.exists() and not listed.exists()


def _kept_run(root: Path, script: str) -> str:
    """Run ``script`` as a worker thread's agent (its TMPDIR the thread's kept one); the
    TMPDIR it had, after it checked its outcome was an output."""
    from workers import attempt

    registry = attempt.registry_dir(root.parent / "state")
    out = _attempt(root, f'echo "$TMPDIR"; {script}', registry=registry, keep_tmpdir=True)
    assert out.classification == "output", out.reasons
    return (root.parent / "attempt" / "stdout.log").read_text().splitlines()[0]


def test_a_kept_tmpdir_an_agent_swapped_for_a_link_is_not_followed(root, own_tmpdir):
    """An agent that put a link to another folder in its kept TMPDIR's place (it owns
    the folder, so /tmp's sticky bit lets it) had the worker's emptying follow the link
    and remove what that folder held, and the next agent run with the link as TMPDIR."""
    elsewhere = root.parent / "elsewhere"
    (elsewhere / "sub").mkdir(parents=True)
    (elsewhere / "sub" / "f").write_text("not the agent's\n")
    (elsewhere / "keep").write_text("not the agent's\n")
    first = _kept_run(root, f'mv "$TMPDIR" "$TMPDIR.moved"; ln -s {elsewhere} "$TMPDIR"')
    assert sorted(str(p.relative_to(elsewhere)) for p in elsewhere.rglob("*")) == [
        "keep",
        "sub",
        "sub/f",
    ]
    second = _kept_run(
        root, 'test -d "$TMPDIR" && test ! -L "$TMPDIR"; test -z "$(ls -A "$TMPDIR")"'
    )
    assert second != first and Path(second).parent == own_tmpdir
    assert Path(first).is_symlink()  # left as the agent made it, with its folder
    Path(first).unlink()
    shutil.rmtree(f"{first}.moved")


def test_a_kept_tmpdir_an_agent_opened_to_others_is_not_handed_on(root, own_tmpdir):
    """An agent's chmod 0777 "$TMPDIR" (or, as root, a chown) was kept for the next agent,
    whose files other users of the machine could then read, replace or link to: a fresh
    folder made for each agent was the worker's own, 0700, whatever the one before did."""
    first = _kept_run(root, 'chmod 0777 "$TMPDIR"')
    second = _kept_run(root, 'test "$(stat -c %a "$TMPDIR")" = 700')
    assert second != first and not Path(first).exists()


def test_a_kept_tmpdir_removed_between_two_agents_is_made_again(root, own_tmpdir):
    """A kept TMPDIR removed between two agents (a /tmp cleaner: systemd-tmpfiles takes
    an idle folder after 10 days; an operator's rm) was handed to the next agent all the
    same, which found no TMPDIR (`mktemp`: No such file or directory); one put in its
    place by another is not the worker's either."""
    first = _kept_run(root, "true")
    Path(first).rmdir()
    second = _kept_run(root, 'test -d "$TMPDIR"; mktemp > /dev/null')
    Path(second).rmdir()
    Path(second).mkdir(mode=0o755)  # the same name, another's folder
    (Path(second) / "planted").write_text("")
    if os.geteuid() == 0:
        os.chown(second, 65534, 65534)
    third = _kept_run(root, 'test -z "$(ls -A "$TMPDIR")"')
    assert third not in (first, second)
    shutil.rmtree(second)  # not the worker's to remove


def test_a_fifo_an_agent_put_in_its_kept_tmpdirs_place_does_not_hang_the_worker(
    root, own_tmpdir, monkeypatch
):
    """An agent that moved its TMPDIR away and made a FIFO in its place had the worker's
    removal (rmtree, which opens what it removes) wait on the FIFO for a writer for good:
    that worker thread ran no agent again, and its stop hung the same way."""
    import threading

    from workers import attempt

    freed: list[str] = []

    def free(fifo: str) -> None:  # the test's own bound: the worker should need no writer
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            freed.append(fifo)

    timers: list[threading.Timer] = []
    drop = attempt._drop

    def bounded(scratch: str | None, say: bool = True) -> None:
        if scratch and stat.S_ISFIFO(os.lstat(scratch).st_mode):
            timers.append(threading.Timer(10.0, free, [scratch]))
            timers[-1].start()
        drop(scratch, say)

    monkeypatch.setattr(attempt, "_drop", bounded)
    try:
        first = _kept_run(root, 'mv "$TMPDIR" "$TMPDIR.moved"; mkfifo "$TMPDIR"')
    finally:
        for timer in timers:
            timer.cancel()
    assert timers and not freed, "the removal waited on the FIFO for a writer"
    second = _kept_run(root, 'test -d "$TMPDIR"; test -z "$(ls -A "$TMPDIR")"')
    assert second != first
    os.unlink(first)
    shutil.rmtree(f"{first}.moved")


def _warnings(monkeypatch) -> list[tuple[str, dict]]:
    """What the worker's attempt module warns of from now on: (event, fields)."""
    from workers import attempt

    said: list[tuple[str, dict]] = []

    class Log:
        def warning(self, event: str, **fields: object) -> None:
            said.append((event, fields))

    monkeypatch.setattr(attempt.logs, "get", Log)
    return said


def test_a_tmpdir_nested_deeper_than_pythons_recursion_limit_costs_no_outcome(
    root, own_tmpdir, monkeypatch
):
    """Python 3.11's and 3.12's rmtree (and os.walk) recurse a call a folder: an agent that left
    folders 1,500 deep in its TMPDIR (a `mkdir -p` of a long path, a runaway recursion)
    had a RecursionError raised out of the attempt, whose outcome went as the worker's
    error (a launch failure) and whose registry entry stayed; the folder is left, said."""
    said = _warnings(monkeypatch)
    first = _kept_run(
        root, 'cd "$TMPDIR"; i=0; while [ $i -lt 1500 ]; do mkdir d; cd d; i=$((i+1)); done'
    )
    try:
        if sys.version_info >= (3, 13):
            # 3.13's rmtree walks without recursing: the folder is emptied, nothing said.
            assert (said, os.listdir(first)) == ([], [])
            return
        assert [(e, f["folder"]) for e, f in said] == [("attempt.tmpdir_left", first)]
        second = _kept_run(root, 'test -z "$(ls -A "$TMPDIR")"')
        assert second != first
    finally:
        subprocess.run(["rm", "-rf", "--", first], check=True)  # fts: not recursive


def test_a_kept_tmpdir_that_cannot_be_emptied_is_said_and_not_handed_on(
    root, own_tmpdir, monkeypatch
):
    """A file a root agent made immutable (or a mount it left inside) keeps its TMPDIR
    from every removal: the next agent gets a fresh one, and the folder left, which the
    stop's reap leaves too once its list is gone, was left with no word in any log."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr to make a file immutable")
    said = _warnings(monkeypatch)
    first = _kept_run(root, 'touch "$TMPDIR/f"; chattr +i "$TMPDIR/f" || true')
    if not Path(first, "f").exists():
        pytest.skip("this file system takes no immutable flag")
    try:
        second = _kept_run(root, 'test -z "$(ls -A "$TMPDIR")"')
        assert second != first
        assert [(e, f["folder"]) for e, f in said] == [("attempt.tmpdir_left", first)]
    finally:
        subprocess.run(["chattr", "-i", f"{first}/f"], check=False)
        shutil.rmtree(first, ignore_errors=True)


def test_an_attempt_without_inotify_still_fails_a_kb_change(root, monkeypatch):
    from workers import attempt

    scans_only = KBWatch(factory=_emfile)
    monkeypatch.setattr(attempt, "WATCH", scans_only)
    try:
        out = _attempt(root, "echo y > kb/notes/sub/new.md")
        assert out.classification == "reviewer-touched-kb"
        assert out.touched == ["kb/notes/sub/new.md"]
    finally:
        scans_only.close()


def test_what_is_no_note_gate_or_folder_of_them_is_not_the_agents_touch(root):
    """Any change under kb/ failed every attempt running at that moment: reviewq's own
    export (kb/reports/reviews), the probe file vim writes beside a note on every save."""
    out = _attempt(
        root,
        "mkdir -p kb/reports/reviews/x; echo r > kb/reports/reviews/x/g.md;"
        " echo p > kb/notes/4913; rm kb/notes/4913; echo t > kb/notes/scratch.txt",
    )
    assert out.classification == "output", out.reasons
    assert out.touched == []


def test_a_folder_of_notes_moved_away_is_the_agents_touch(root):
    out = _attempt(root, "mv kb/notes/sub outside/sub")
    assert out.classification == "reviewer-touched-kb"
    assert out.touched == ["kb/notes/sub/"]


def test_an_agent_that_changes_thousands_of_notes_is_told_so_in_bounded_words(root):
    """Every changed file was a reason: 20,000 of them made a 920 KB retry prompt."""
    out = _attempt(root, "for i in $(seq 1 300); do echo x > kb/notes/n$i.md; done")
    assert out.classification == "reviewer-touched-kb"
    assert len(out.touched) == 300
    assert len(out.reasons) == 21 and out.reasons[-1] == "... and 280 more file(s)"


def test_an_attempt_the_os_refuses_to_start_is_a_launch_failure(root):
    """An environment the OS refuses (a NUL in a value) raised out of the worker's task:
    no outcome was sent, the window stayed open, the job was reaped as never picked up."""
    from orchestrator.config import ReviewerProfile
    from workers.attempt import LAUNCH_FAILURE, run_attempt
    from workers.reviewers import AttemptSpec, Command, for_profile

    folder = root.parent / "attempt"
    folder.mkdir()
    spec = AttemptSpec("review", 1, 1, folder / "p.md", folder / "o.md", folder, folder, root, "m")
    reviewer = for_profile(ReviewerProfile(name="nul", kind="command", command=["x"]))
    bad = Command(argv=["true"], cwd=root, env={"X": "a\x00b"})
    reviewer.command = lambda spec: bad  # type: ignore[method-assign]
    out = run_attempt(reviewer, spec, timeout_s=30, max_turns=5, trees=TREES)
    assert out.classification == LAUNCH_FAILURE
    assert "could not start 'true'" in out.reasons[0] and "null byte" in out.reasons[0]
    assert _open_windows() == 0


def test_a_touching_attempt_says_how_it_ended_without_the_change(root):
    out = _attempt(root, "echo x >> kb/notes/a.md", guarded=("kb/notes/a.md",))
    assert out.classification == "reviewer-touched-kb"
    assert out.untouched == ["output", []]  # the script writes its output after the command


def test_reviewqs_own_export_folder_takes_no_watch_and_no_scan(root, watch):
    """Every folder of an export (one per note and lens) got an inotify watch, never
    dropped: a large export took every watch the user had, and every window open then
    reported the whole KB as touched."""
    gates = root / "kb" / "reports" / "reviews" / "gates"
    (gates / "kb__notes__a.md" / "prose").mkdir(parents=True)
    token = watch.begin(root, TREES)
    (gates / "kb__notes__b.md" / "prose").mkdir(parents=True)  # an export while it runs
    (gates / "kb__notes__b.md" / "prose" / "g.md").write_text("exported\n")
    assert watch.end(token) == set()
    watched = [rel for state in watch._roots.values() for rel in state.dirs]
    assert "kb/notes" in watched and not [r for r in watched if r.startswith("kb/reports")]
    assert not [p for p in tree_stamps(root, TREES) if p.startswith("kb/reports")]


def test_a_note_an_agent_swaps_for_a_link_to_a_fifo_ends_its_attempt(root):
    """An agent that put a link to a FIFO outside the KB in place of its note: the hash
    taken after its run opened the note through the link and waited for a writer for
    good, the worker's attempt never ended (a link to /dev/zero read forever alike). A
    file that is not a regular one is a change, not read."""
    import threading

    fifo = root / "outside" / "pipe"
    ended: list = []
    script = f"mkfifo {fifo}; ln -sf {fifo} kb/notes/a.md"
    run = threading.Thread(target=lambda: ended.append(_attempt(root, script)), daemon=True)
    run.start()
    run.join(timeout=30)
    hung = run.is_alive()
    if hung:  # a writer lets the hash's open go, so the thread ends with the test
        with open(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK), "wb"):
            pass
        run.join(timeout=30)
    assert not hung
    (out,) = ended
    assert out.classification == "reviewer-touched-kb"
    assert out.touched == ["kb/notes/a.md"]
