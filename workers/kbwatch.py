"""Which files under a KB's folders changed while an agent ran: a Linux inotify watch, with
the old walk of the whole KB (:class:`SharedScans`) kept as its fallback."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import struct
import sys
import termios
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import logs

try:
    from inotify_simple import INotify
except ImportError:  # not Linux, or the dependency is missing: every tree is scanned
    INotify = None  # type: ignore[assignment,misc]

# inotify(7); spelled out so the module reads the same whether or not inotify_simple loads.
IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_UNMOUNT = 0x2000
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_DONT_FOLLOW = 0x2000000
IN_MASK_ADD = 0x20000000
IN_ISDIR = 0x40000000
# What a reviewer can do to a file. Opening and reading make no event, so an agent that
# only reads the KB costs the worker nothing. IN_MASK_ADD: a folder two roots share keeps
# every bit either asked for.
_EVENTS = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
_MASK = _EVENTS | IN_DELETE | IN_ONLYDIR | IN_MASK_ADD
_GONE = IN_DELETE | IN_MOVED_FROM
_CAME = IN_CREATE | IN_MOVED_TO


# reviewq's own export writes here while reviews run, and that is no agent's doing: it is
# neither watched (a large export's folders took every inotify watch the user had, and
# every window open then reported the whole KB) nor scanned.
UNWATCHED = "kb/reports"


def unwatched(rel: str) -> bool:
    return rel == UNWATCHED or rel.startswith(UNWATCHED + "/")


def tree_stamps(root: Path, trees: Iterable[str]) -> dict[str, tuple[int, int, int]]:
    """(size, mtime, inode) of every file under the folders ``trees`` of ``root``; hidden
    entries (an editor's swap files) are left out."""
    out: dict[str, tuple[int, int, int]] = {}
    prefix = len(str(root)) + 1
    for tree in trees:
        stack = [str(root / tree)]
        while stack:
            try:
                entries = list(os.scandir(stack.pop()))
            except OSError:
                continue
            for e in entries:
                if e.name.startswith("."):
                    continue
                try:
                    if e.is_dir(follow_symlinks=False):
                        if not unwatched(e.path[prefix:]):
                            stack.append(e.path)
                        continue
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                out[e.path[prefix:]] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


class SharedScans:
    """:func:`tree_stamps` for attempts that run at the same time in one worker. A scan
    of a 1,000-note KB costs ~4 ms and each attempt takes two, so with several agents at
    once most of a worker's CPU went to scanning the same folders. A caller that asks while
    a scan of the same folders runs waits for the next one and shares it with everyone who
    asked meanwhile: each still gets a scan that began after it asked, as if it had taken
    its own, so what counts as touched is unchanged. The dict returned is shared: read it,
    never change it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._started: dict[tuple, int] = {}  # (root, trees) -> scans begun
        self._done: dict[tuple, tuple[int, dict]] = {}  # -> (last scan finished, its stamps)
        self._running: set[tuple] = set()

    def stamps(self, root: Path, trees: Iterable[str]) -> dict[str, tuple[int, int, int]]:
        trees = tuple(trees)
        key = (str(root), trees)
        with self._cond:
            wanted = self._started.get(key, 0) + 1  # the next scan to begin
            while self._done.get(key, (0, {}))[0] < wanted:
                if key in self._running:
                    self._cond.wait()
                    continue
                self._running.add(key)
                number = self._started[key] = self._started.get(key, 0) + 1
                self._cond.release()
                try:
                    result = tree_stamps(root, trees)
                finally:
                    self._cond.acquire()
                    self._running.discard(key)
                    self._cond.notify_all()
                self._done[key] = (number, result)
            return self._done[key][1]


SCANS = SharedScans()


def stamps_diff(before: dict, after: dict) -> set[str]:
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


def lost(tree: str) -> str:
    """What a window reports for ``tree`` when events of it may have been lost (the kernel's
    queue overflowed, a watch could not be added): the folder itself, as ``notes/``, so
    the worker's reason reads "the reviewer changed notes/" and no file reviewq wrote can
    be mistaken for it."""
    return tree + "/"


class _Full(Exception):
    """A watch could not be added (fs.inotify.max_user_watches reached, or the folder is
    already watched for another root): the tree goes back to scans."""


@dataclass(eq=False)
class _Root:
    path: str
    # tree -> None while inotify watches it, else why it is scanned instead
    trees: dict[str, str | None] = field(default_factory=dict)
    dirs: dict[str, int] = field(default_factory=dict)  # watched folder (root-relative) -> wd
    log: dict[str, int] = field(default_factory=dict)  # path -> sequence number of its last event
    open: list[int] = field(default_factory=list)  # the sequence number each open window began at
    failed: str | None = None  # why the root itself cannot be watched


@dataclass(eq=False)
class Token:
    """One attempt's window, from :meth:`KBWatch.begin` to :meth:`KBWatch.end`."""

    root: Path
    watched: tuple[str, ...]  # trees inotify reports on
    scanned: tuple[str, ...]  # trees compared by two scans
    seq: int = 0
    state: _Root | None = None
    stamps: dict = field(default_factory=dict)
    ended: bool = False


class KBWatch:
    """The files under some folders (``trees``) of a KB ``root`` that changed, appeared or
    went away between :meth:`begin` and :meth:`end`, as root-relative paths; hidden entries
    (a name starting with '.') are left out, as the scans left them out. One per process:
    one inotify descriptor, a daemon thread that keeps the kernel's queue drained while
    agents run (its queue holds fs.inotify.max_queued_events; what overflows is lost), and
    a log of the paths that had an event, kept only as far back as the oldest open window.

    The window is exact because the kernel queues an event inside the system call that
    caused it: :meth:`begin` reads everything queued under the same lock the thread reads
    under and then takes the current sequence number; :meth:`end`, called once the agent's
    whole group is reaped, reads again and reports what was recorded after that number.

    Beyond the old scans: a file created and removed within the window is reported (it
    did appear), as is a change of mode (IN_ATTRIB); a folder that appears has all its files
    reported, one that goes away is reported by its own path. When events may have been
    lost (IN_Q_OVERFLOW, a watch that could not be added for a new folder) each open window
    reports :func:`lost` for its trees. A tree that does not exist yet is watched through
    the root folder and reported when it appears. A tree is a folder right under the
    root (a deeper or a hidden one is scanned).

    Where inotify cannot be used (not Linux, inotify_simple missing, inotify_init failing
    with EMFILE, a watch failing with ENOSPC), the root or tree concerned is compared by two
    scans as before, with one ``kbwatch.unavailable`` warning. :meth:`begin` and :meth:`end`
    never raise."""

    def __init__(self, factory: Callable[..., object] | None = None, reader: bool = True) -> None:
        self._factory = factory  # a stand-in for INotify (tests); None: inotify_simple's
        self._reader_on = reader  # False (tests): only begin and end read, so the queue can fill
        self._lock = threading.Lock()
        self._read = threading.Condition(self._lock)  # the thread read what was queued
        self._fd = None
        self._wake: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._unavailable: str | None = None
        self._wds: dict[int, tuple[_Root, str]] = {}
        self._roots: dict[str, _Root] = {}
        self._seq = 0

    # --- the window ---------------------------------------------------------------------
    def begin(self, root: Path, trees: Iterable[str]) -> Token:
        trees = tuple(dict.fromkeys(trees))
        token = Token(Path(root), (), trees)
        try:
            with self._lock:
                state = self._watching(Path(root), trees)
                if state is not None:
                    self._drain()
                    token.watched = tuple(
                        t for t in trees if _top(t) and state.trees.get(t) is None
                    )
                    token.scanned = tuple(t for t in trees if t not in token.watched)
                    if token.watched:
                        token.seq, token.state = self._seq, state
                        state.open.append(self._seq)
        except Exception as exc:  # whatever went wrong, the attempt is checked by scans
            self._give_up(f"{type(exc).__name__}: {exc}")
            token.watched, token.scanned, token.state = (), trees, None
        if token.scanned:
            token.stamps = SCANS.stamps(token.root, token.scanned)
        return token

    def end(self, token: Token) -> set[str]:
        if token.ended:
            return set()
        token.ended = True
        changed = set()
        if token.scanned:
            changed |= stamps_diff(token.stamps, SCANS.stamps(token.root, token.scanned))
        state = token.state
        if state is None:
            return changed
        try:
            with self._lock:
                if self._fd is not None:
                    self._drain()
                changed |= {
                    p
                    for p, seq in state.log.items()
                    if seq > token.seq and p.split("/", 1)[0] in token.watched
                }
                self._close(state, token.seq)
        except Exception as exc:  # nothing is known of this window: count it as touched
            self._give_up(f"{type(exc).__name__}: {exc}")
            changed |= {lost(t) for t in token.watched}
        return changed

    def held(self) -> int:
        """Paths kept in the log (none while no window is open)."""
        with self._lock:
            return sum(len(r.log) for r in self._roots.values())

    def settle(self, timeout: float) -> bool:
        """Wait until the thread has read everything the kernel queued (tests, benches)."""
        with self._read:
            return self._read.wait_for(lambda: self._fd is None or not _queued(self._fd), timeout)

    def close(self) -> None:
        """Stop the thread and drop every watch; open windows report :func:`lost`."""
        self._give_up(None)

    # --- setting up ---------------------------------------------------------------------
    def _watching(self, root: Path, trees: tuple[str, ...]) -> _Root | None:
        """The root's state with every tree in ``trees`` watched or marked as scanned;
        None when the whole root is scanned."""
        if self._fd is None and self._unavailable is None:
            self._start()
        if self._unavailable is not None:
            return None
        key = os.path.abspath(root)
        state = self._roots.get(key)
        if state is None:
            state = self._roots[key] = _Root(key)
            try:
                # The root itself, for the trees that appear or go away.
                if not self._add(state, "", _CAME | _GONE | IN_ONLYDIR | IN_MASK_ADD):
                    state.failed = "the KB root is not a folder that can be read"
            except (OSError, _Full) as exc:
                state.failed = _why(exc)
            if state.failed is not None:
                _warn(state.failed, root=key)
        if state.failed is not None:
            return None
        for tree in filter(_top, trees):
            if tree not in state.trees:
                state.trees[tree] = None
                # A tree that does not exist yet is seen appearing through the root's watch.
                if os.path.isdir(os.path.join(key, tree)):
                    self._add_tree(state, tree, record=False, follow=True)
        return state

    def _start(self) -> None:
        factory = self._factory or INotify
        if not sys.platform.startswith("linux") or factory is None:
            self._unavailable = "inotify needs Linux and the inotify_simple package"
        else:
            try:
                self._fd = factory(nonblocking=True)
            except OSError as exc:  # EMFILE: fs.inotify.max_user_instances reached
                self._unavailable = f"inotify_init failed: {exc.strerror or exc}"
        if self._unavailable is not None:
            _warn(self._unavailable)
            return
        if not self._reader_on:
            return
        self._wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread = threading.Thread(
            target=self._reader, args=(self._fd, self._wake[0]), name="kbwatch", daemon=True
        )
        self._thread.start()

    def _add(self, state: _Root, rel: str, mask: int) -> bool:
        """Watch one folder; False when it is gone or not a folder any more (its removal
        is an event of its own, or the scan that found it is already stale)."""
        path = os.path.join(state.path, rel) if rel else state.path
        try:
            wd = self._fd.add_watch(path, mask)  # type: ignore[union-attr]
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ELOOP):
                return False  # the scans skipped an unreadable folder too
            if exc.errno == errno.ENOSPC:
                raise _Full("fs.inotify.max_user_watches reached") from exc
            raise
        owner = self._wds.get(wd)
        if owner is not None and owner[0] is not state:
            raise _Full(f"{path} is already watched for the KB at {owner[0].path}")
        # The same root under another path: the folder moved and its event is still to be
        # read; it is this path now (the old one's entry in ``dirs`` goes with that event).
        self._wds[wd] = (state, rel)
        state.dirs[rel] = wd
        return True

    def _add_tree(self, state: _Root, rel: str, *, record: bool, follow: bool = False) -> None:
        """Watch the folder ``rel`` and every folder under it; with ``record``, each file
        found counts as changed (the folder appeared during a window). The watch is added
        before a folder is listed, so a file created meanwhile is seen one way or the
        other. Subfolders are not followed through symlinks, as the scans did not."""
        tree = rel.split("/", 1)[0]
        stack = [(rel, follow)]
        try:
            while stack:
                folder, deref = stack.pop()
                mask = _MASK if deref else _MASK | IN_DONT_FOLLOW
                if not self._add(state, folder, mask):
                    continue
                try:
                    entries = list(os.scandir(os.path.join(state.path, folder)))
                except OSError:
                    continue
                for e in entries:
                    if e.name.startswith("."):
                        continue
                    sub = f"{folder}/{e.name}"
                    try:
                        is_dir = e.is_dir(follow_symlinks=False)
                    except OSError:
                        is_dir = False
                    if is_dir:
                        if not unwatched(sub):
                            stack.append((sub, False))
                    elif record:
                        self._record(state, sub)
        except _Full as exc:
            self._scan_instead(state, tree, str(exc))

    def _scan_instead(self, state: _Root, tree: str, reason: str) -> None:
        """Stop watching ``tree``: windows open on it report :func:`lost` (what happens in
        it from now on is not seen), later ones scan it."""
        self._record(state, lost(tree))
        for rel in [r for r in state.dirs if r.split("/", 1)[0] == tree and r]:
            self._unwatch(state, rel)
        state.trees[tree] = reason
        _warn(reason, root=state.path, tree=tree)

    def _unwatch(self, state: _Root, rel: str, *, remove: bool = True) -> None:
        wd = state.dirs.pop(rel)
        if self._wds.get(wd) == (state, rel):
            del self._wds[wd]
            if remove:
                with contextlib.suppress(OSError):  # EINVAL: the kernel dropped it already
                    self._fd.rm_watch(wd)  # type: ignore[union-attr]

    # --- events -------------------------------------------------------------------------
    def _reader(self, fd, wake: int) -> None:
        poller = select.poll()
        poller.register(fd.fileno(), select.POLLIN)
        poller.register(wake, select.POLLIN)
        while True:
            ready = {f for f, _ in poller.poll()}
            if wake in ready:
                return
            try:
                with self._lock:
                    if self._fd is not fd:
                        return
                    self._drain()
                    self._read.notify_all()
            except Exception as exc:  # the worker goes on, with scans
                self._give_up(f"{type(exc).__name__}: {exc}")
                return

    def _drain(self) -> None:
        """Read and record everything queued (the lock is held)."""
        for wd, mask, _cookie, name in self._fd.read(timeout=0):  # type: ignore[union-attr]
            if mask & IN_Q_OVERFLOW:
                self._overflowed()
                continue
            owner = self._wds.get(wd)
            if owner is None:
                continue  # a watch dropped meanwhile
            state, folder = owner
            if mask & IN_IGNORED:  # the folder was removed: the kernel dropped its watch
                if state.dirs.get(folder) == wd:
                    self._unwatch(state, folder, remove=False)
                continue
            if mask & IN_UNMOUNT:
                for tree in [t for t, why in state.trees.items() if why is None]:
                    self._record(state, lost(tree))
                continue
            if not name or name.startswith("."):
                continue  # the folder itself (its parent reports it), or a hidden entry
            rel = f"{folder}/{name}" if folder else name
            if state.trees.get(rel.split("/", 1)[0], "") is not None or unwatched(rel):
                continue  # not a tree of this root, one that is scanned instead, or reviewq's
            if not folder:  # at the root: a tree's own folder appeared or went away
                # (a tree that is a symlink to a folder goes away without IN_ISDIR)
                if mask & _GONE and (mask & IN_ISDIR or rel in state.dirs):
                    self._went(state, rel)
                elif mask & _CAME and os.path.isdir(os.path.join(state.path, rel)):
                    self._add_tree(state, rel, record=True, follow=True)
                continue  # a file named like a tree: the scans never looked at it either
            if mask & IN_ISDIR:
                if mask & _GONE:
                    self._went(state, rel)
                elif mask & _CAME:
                    self._add_tree(state, rel, record=True)
                continue  # a folder's own mode or times: the scans never looked at those
            self._record(state, rel)

    def _went(self, state: _Root, rel: str) -> None:
        """The folder ``rel`` was removed or moved away: it is reported by its own path with
        a trailing ``/`` (as :func:`lost` reports a tree), and the watches under it go
        (moved, they would report another place as this one)."""
        for sub in [r for r in state.dirs if r == rel or r.startswith(rel + "/")]:
            self._unwatch(state, sub)
        self._record(state, rel + "/")

    def _record(self, state: _Root, rel: str) -> None:
        if state.open:  # with no window open there is no one to tell
            self._seq += 1
            state.log[rel] = self._seq

    def _overflowed(self) -> None:
        """Events were lost: every open window reports every tree it watches, and every
        watch is set up again from the folders as they are now (a folder that moved unseen
        would otherwise go on reporting under its old path)."""
        for state in list(self._roots.values()):
            for rel in list(state.dirs):
                if rel:
                    self._unwatch(state, rel)
            for tree, why in list(state.trees.items()):
                if why is None:
                    self._record(state, lost(tree))
                    if os.path.isdir(os.path.join(state.path, tree)):
                        self._add_tree(state, tree, record=False, follow=True)

    def _close(self, state: _Root, seq: int) -> None:
        state.open.remove(seq)
        if not state.open:
            state.log.clear()
            return
        oldest = min(state.open)
        for p in [p for p, s in state.log.items() if s <= oldest]:
            del state.log[p]

    def _give_up(self, reason: str | None) -> None:
        """No more inotify in this process: open windows report :func:`lost` for what they
        watch, later ones scan. ``reason`` None is an orderly :meth:`close`."""
        with self._lock:
            for state in self._roots.values():
                for tree, why in state.trees.items():
                    if why is None:
                        self._record(state, lost(tree))
                state.dirs.clear()
            self._wds.clear()
            fd, wake, thread = self._fd, self._wake, self._thread
            self._fd = self._wake = self._thread = None
            self._unavailable = reason or "closed"
            if reason is not None:
                _warn(reason)
            self._read.notify_all()
        if wake is not None:
            os.write(wake[1], b"x")
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        if fd is not None:
            fd.close()
        if wake is not None:
            os.close(wake[0])
            os.close(wake[1])

    def _forget(self) -> None:
        """In a forked child: the parent's thread is not there, its descriptor must not be
        read from here (an event read here is gone for the parent), its lock may be held."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                self._fd.close()
        for end in self._wake or ():
            with contextlib.suppress(OSError):
                os.close(end)
        self.__init__(self._factory, self._reader_on)  # type: ignore[misc]


def _top(tree: str) -> bool:
    """A folder right under the root, as the worker's trees are (the top folders of the
    job's notes and gates); a deeper or a hidden one is scanned."""
    return bool(tree) and not tree.startswith(".") and "/" not in tree and os.sep not in tree


def _queued(fd) -> int:
    buf = fcntl.ioctl(fd.fileno(), termios.FIONREAD, b"\0\0\0\0")
    return struct.unpack("i", buf)[0]


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return f"cannot watch the KB: {exc.strerror or exc}"
    return str(exc)


def _warn(reason: str, **where: str) -> None:
    logs.get().warning("kbwatch.unavailable", reason=reason, fallback="scans", **where)


WATCH = KBWatch()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WATCH._forget)
