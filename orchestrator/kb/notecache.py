"""Caches that let an unchanged KB be judged without reading it (CONTRACT §13), and an
edited one without measuring the same change twice.

:class:`NoteCache` remembers, per note file, its sha256 and frontmatter facts (type, traits,
status) under the
file's (size, mtime_ns, ctime_ns, inode, device), so a note that did not change costs one
stat(). Like git's index it trusts those; ctime is among them because tools that copy or
sync files (``cp -p``, ``rsync -a``, ``tar``) set the old mtime on new content, but no
tool can set ctime. An entry written within two seconds of the file's mtime or ctime is
not kept, so an edit in the same clock tick as the cache write is never missed.

:class:`SelectMemo` keeps ``select --json`` outputs under a key made of everything the
output depends on: the options, the partition, the acceptance version counter, the
snapshot table's extent, and the (path, sha256) of every note, gate and type spec.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import time
from collections.abc import Callable, Iterable
from fractions import Fraction
from pathlib import Path

from orchestrator.kb.atomicfile import atomic_write

_VERSION = 3
_RATIO_VERSION = 1
_RACY_S = 2.0


def _entries(path: Path, version: int) -> dict:
    """A cache file's entries; none from a missing, damaged or older file, which is
    rebuilt, never trusted. A damaged pickle can raise nearly anything as it loads."""
    try:
        data = pickle.loads(path.read_bytes())
    except Exception:  # noqa: BLE001 - see above: OSError, KeyError, MemoryError, ...
        return {}
    if isinstance(data, dict) and data.get("version") == version:
        entries = data.get("entries")
        if isinstance(entries, dict):
            return entries
    return {}


def _keep(path: Path, version: int, entries: dict) -> None:
    """Write a cache file that :func:`_entries` reads back."""
    with contextlib.suppress(OSError):  # a cache that cannot be written is only slower
        _write(path, pickle.dumps({"version": version, "entries": entries}, protocol=5))


def _write(path: Path, data: bytes, depth: int = 1) -> None:
    """A cache file, its folders up to ``depth`` above it made owner-only, as every folder
    of the state folder is (N28): made by the umask, they showed others the notes' names."""
    for folder in reversed(path.parents[:depth]):
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
    atomic_write(path, data)


class NoteCache:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, tuple] = _entries(path, _VERSION)
        self.dirty = False

    @classmethod
    def open(cls, state_dir: Path) -> NoteCache:
        return cls(state_dir / "cache" / "notes.pickle")

    def get(self, rel: str, st: os.stat_result) -> tuple[str, tuple | None, str | None] | None:
        e = self.entries.get(rel)
        if e is None or e[0] != file_stamp(st):
            return None
        return e[1], e[2], e[3]

    def put(
        self, rel: str, st: os.stat_result, sha: str, facts: tuple | None, error: str | None
    ) -> None:
        if time.time() - max(st.st_mtime, st.st_ctime) < _RACY_S:
            self.entries.pop(rel, None)
            return
        self.entries[rel] = (file_stamp(st), sha, facts, error)
        self.dirty = True

    def keep_only(self, paths: Iterable[str]) -> None:
        """Drop the entries of notes not in ``paths``, every note of the KB as a full look
        found them: kept, a KB whose notes are renamed or deleted grew the file, read and
        written by every select, export and warn-queue, by a path each, without end."""
        live = set(paths)
        gone = [rel for rel in self.entries if rel not in live]
        for rel in gone:
            del self.entries[rel]
        self.dirty = self.dirty or bool(gone)

    def save(self) -> None:
        if self.dirty:
            _keep(self.path, _VERSION, self.entries)
            self.dirty = False


def file_stamp(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What tells a file's content changed without reading it (as git's index trusts it)."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


class RatioMemo:
    """CONTRACT §3's change ratios of long bodies, by the sha256 of both: its exact difflib
    ratio takes seconds on a note of thousands of lines (more where lines repeat), and a
    note edited under its ``rewrite(T)`` threshold is compared with the same accepted
    text at every select, night after night. Short bodies are measured, not looked up."""

    MIN_CELLS = 250_000  # old lines × new lines under which measuring is cheap
    KEEP = 2_000

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[tuple[str, str], tuple[int, int]] = {
            key: value for key, value in _entries(path, _RATIO_VERSION).items() if _a_ratio(value)
        }
        self.dirty = False

    @classmethod
    def open(cls, state_dir: Path) -> RatioMemo:
        return cls(state_dir / "cache" / "ratios.pickle")

    def ratio(self, old: list[str], new: list[str], measure: Callable[[], Fraction]) -> Fraction:
        if len(old) * len(new) < self.MIN_CELLS:
            return measure()
        key = (_lines_sha(old), _lines_sha(new))
        known = self.entries.get(key)
        if known is not None:
            return Fraction(*known)
        value = measure()
        self.entries[key] = (value.numerator, value.denominator)
        while len(self.entries) > self.KEEP:
            del self.entries[next(iter(self.entries))]  # the oldest first
        self.dirty = True
        return value

    def save(self) -> None:
        if self.dirty:
            _keep(self.path, _RATIO_VERSION, self.entries)
            self.dirty = False


def _a_ratio(value: object) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == 2
        and all(type(n) is int for n in value)
        and 0 <= value[0] <= value[1] > 0
    )


def _lines_sha(lines: list[str]) -> str:
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    return h.hexdigest()


class SelectMemo:
    KEEP = 8

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @classmethod
    def open(cls, state_dir: Path) -> SelectMemo:
        return cls(state_dir / "cache" / "select")

    @staticmethod
    def key(*parts: object) -> str:
        h = hashlib.sha256()
        for p in parts:
            h.update(repr(p).encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
        return h.hexdigest()

    def get(self, key: str) -> bytes | None:
        try:
            return (self.folder / f"{key}.json").read_bytes()
        except OSError:
            return None

    def put(self, key: str, data: bytes) -> None:
        with contextlib.suppress(OSError):
            _write(self.folder / f"{key}.json", data, depth=2)
            files = sorted(
                self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True
            )
            for old in files[self.KEEP :]:
                old.unlink(missing_ok=True)
