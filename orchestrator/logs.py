"""Structured logs (CONTRACT §11): one pipeline for reviewq's events and Huey's records.

Every line is one JSON object with ``timestamp`` (UTC ISO), ``level``, ``event`` (dotted
names such as ``job.finalized``) and the ids it concerns, bound per task with
:func:`bound` and cleared after. Lines go to ``STATE/logs/reviewq.jsonl`` and to stderr:
a long-running process's as JSON (a console format on a terminal), a command's as one
``warning:`` line each. Tracebacks carry no local variables, and every known secret is
redacted: secret-looking environment variables' values, the settings' passwords and keys
(:func:`add_secrets`), and in an outcome another machine's (:func:`spanned`).

Read back for ``reviewq logs`` and ``status``: :func:`lines` and :func:`record`, and
:func:`entries`, the lines a :class:`Wanted` takes from the log and from the rotated
copies a period reaches into.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import errno
import functools
import importlib
import json
import logging
import os
import re
import resource
import sys
import time
import unicodedata
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.events import EVENTS, FOREIGN

if TYPE_CHECKING:
    import structlog

LOG_NAME = "reviewq"


def import_without(module: str, hidden: str) -> None:
    """Import ``module`` (if no one has) as if the optional package ``hidden`` were not
    installed, where ``module`` imports it at once for a feature of it reviewq does not
    use; ``hidden`` stays importable for whoever needs it later."""
    if module in sys.modules or hidden in sys.modules:
        return
    sys.modules[hidden] = None  # type: ignore[assignment]  # `import hidden` raises ImportError
    try:
        __import__(module)
    finally:
        del sys.modules[hidden]


# The last word of a variable's name (split at `_`, `-` and camelCase; a number after it
# aside) says it holds a secret: OPENAI_API_KEY, GH-TOKEN, openaiApiKey, API_KEYS,
# ANTHROPIC_AUTHTOKEN, MY_SECRETKEY, DB_PASSWORD_2. A word inside the name does not
# (SSH_AUTH_SOCK, PASSWORD_STORE_DIR, SSH_KEY_PATH), nor letters inside a word that
# means something else (GIT_AUTHOR_NAME, MONKEY_BUSINESS and MAX_THINKING_TOKENS hold
# none, and their values were redacted out of every stored rationale naming the author).
_SECRET_WORD = re.compile(
    r"(?:[A-Z0-9]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL)S?\d*"
    r"|O?AUTH|AUTHORIZATION|PASS|PAT|DSN)",
    re.IGNORECASE,
)
_NOT_SECRET_WORDS = {"MONKEY", "DONKEY", "TURKEY", "JOCKEY", "HOCKEY", "WHISKEY", "HOTKEY"}
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z0-9]+(?![a-z])")
_configured: dict[str, object] = {}


def _files_limit(code: int | None) -> str | None:
    if code == errno.EMFILE:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return (
            f"this process had all the {soft} files its open-files limit allows open: "
            "raise RLIMIT_NOFILE (ulimit -n, systemd's LimitNOFILE=)"
        )
    if code == errno.ENFILE:
        return "the system's table of open files is full (sysctl fs.file-max)"
    return None


def out_of_files() -> str | None:
    """What a process out of file descriptors should say, or None when it has one to
    spare. SQLite says EMFILE as "unable to open database file": a control past its
    RLIMIT_NOFILE said that of its queue every few seconds for as long as it ran,
    sending the operator to the file's path and modes instead of to the limit."""
    try:
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return _files_limit(exc.errno)
    os.close(fd)
    return None


def error_said(exc: BaseException) -> str:
    """``str(exc)``, and the limit of open files when that is what it is short of: an
    EMFILE of its own (the descriptors may be back by now), or none to be had now."""
    why = _files_limit(getattr(exc, "errno", None)) or out_of_files()
    return f"{exc} ({why})" if why else str(exc)


def log_path(state_dir: Path) -> Path:
    return state_dir / "logs" / "reviewq.jsonl"


# Secrets that are not in this process's environment: a reviewer profile's `env` table,
# a password in the queue URL. Registered when settings load (config.load_settings).
_extra_secrets: set[str] = set()
_cache: dict[str, object] = {}


# A last line without its end, looked at again this many times, this far apart, before
# it is taken for one cut short: a line longer than a page is copied into the file page
# by page, and a reader in between saw half of it.
_UNFINISHED_LOOKS = 10
_UNFINISHED_WAIT_S = 0.02


def lines(
    path: Path,
    follow: bool = False,
    wait: Callable[[], None] | None = None,
    said: Callable[[str], None] | None = None,
) -> Iterator[str]:
    """The log's whole lines; with ``follow``, then each new one as it is written, for
    ever (``wait`` between looks). A line still being written waits for its end; without
    ``follow``, a few looks at most, then it is given as it is (cut short by a crash). A
    file truncated in place (``copytruncate``, as OPERATIONS §5 rotates it) or replaced
    by a new one is read again from its start when followed, once the lines written to
    it since the last look are read from the copy (else told to ``said``); without
    ``follow``, one truncated under the read raises :class:`Truncated` (the rest is in
    the copy)."""
    if wait is None:
        wait = functools.partial(time.sleep, 0.5 if follow else _UNFINISHED_WAIT_S)
    while follow and not path.exists():
        wait()
    looks = 0
    while True:
        # Bytes, decoded line by line: the place read up to is a byte offset, which the
        # copy copytruncate made is read on from.
        with open(path, "rb") as f:
            partial, last, shown, end = b"", None, b"", 0
            while True:
                chunk = f.readline()
                if follow:
                    # Checked after the read (before, it could be emptied in between).
                    if _overwritten(f, end, shown + partial):
                        # Emptied in place and written past the place read up to while
                        # the follower was held (a pager not read, a suspend, or only
                        # between two looks), which its size and inode do not tell.
                        yield from _copied_since(path, end, shown, partial, said)
                        break
                    end += len(chunk)
                if chunk.endswith(b"\n"):
                    shown = partial + chunk
                    yield _decoded(shown)
                    partial = b""
                    continue
                partial += chunk  # the end of the file, for now
                if not follow:
                    if _truncated(f, path):
                        # Copied and emptied (copytruncate) under the read: the half line
                        # and the rest are whole in the copy; said as damage, they were not.
                        raise Truncated(path)
                    if partial and looks < _UNFINISHED_LOOKS:
                        # Else a line read while its writer wrote it was said as damaged.
                        looks += 1
                        wait()
                        continue
                    if partial:
                        yield _decoded(partial)
                    return
                now = _end_of(path)
                if now is not None and _started_again(f, now, last if not chunk else None):
                    if now[0] != os.fstat(f.fileno()).st_ino:
                        # Renamed away: what was written to it since the last look first.
                        for chunk in f:
                            partial += chunk
                            if partial.endswith(b"\n"):
                                yield _decoded(partial)
                                partial = b""
                    elif f.tell():  # emptied in place: what it held since the last look
                        yield from _copied_since(path, f.tell(), shown, partial, said)
                    break
                last = now
                wait()


def _overwritten(f, end: int, read: bytes) -> bool:  # noqa: ANN001 - an open file
    """The bytes of ``f`` before ``end`` are no longer ``read``, the ones read there."""
    return bool(read) and os.pread(f.fileno(), len(read), end - len(read)) != read


def _decoded(line: bytes) -> str:
    return line.decode("utf-8", errors="replace")


def _decoded_lines(f) -> Iterator[str]:  # noqa: ANN001 - a binary file
    """The lines of ``f`` from its place on, decoded."""
    rest = f.readline()
    while rest:
        yield _decoded(rest)
        rest = f.readline()


# How many of the log's copies, newest first, are looked in for what copytruncate took.
_COPIES_LOOKED_IN = 3


def _copied_since(
    path: Path, end: int, shown: bytes, partial: bytes, said: Callable[[str], None] | None
) -> Iterator[str]:
    """The lines a follower had not read when ``path`` was copied and emptied in place
    (logrotate's ``copytruncate``): those of its copy (``.1``, or ``.1.gz`` compressed
    since) from the start of ``partial``, the copy known as the one whose bytes before
    ``end`` are ``shown`` and ``partial``, the last line read and the one begun; then
    the whole of each newer copy, oldest first (rotated again before the next look).
    None found (the copy compressed as reviewq does not read, or removed): said."""
    read = shown + partial
    copies = _newest_first(_whole_copies(_copies(path), path))[:_COPIES_LOOKED_IN]
    for newer, copy in enumerate(copies):
        try:
            with _open_bytes(copy) as f:
                f.seek(end - len(read))
                if f.read(len(read)) != read:
                    continue
                f.seek(end - len(partial))
                yield from _decoded_lines(f)
        except (*_unreadable(), ValueError):  # compressed as reviewq does not read, damaged
            continue
        for copy in reversed(copies[:newer]):
            with contextlib.suppress(*_unreadable(), ValueError), _open_bytes(copy) as f:
                yield from _decoded_lines(f)
        return
    if said is not None:
        said(
            f"warning: {one_line(str(path))}: emptied in place (logrotate's copytruncate): "
            "the lines written since the last look are in its rotated copy, not found "
            "(`reviewq logs --since` reads the copies)"
        )


class Truncated(Exception):  # noqa: N818 - what happened, not a failure of the reader
    """The log was emptied in place (logrotate's ``copytruncate``) while read without
    following it: what was not read yet is in its rotated copy."""


def _truncated(f, path: Path) -> bool:  # noqa: ANN001 - an open file
    """The file open as ``f`` is still the one at ``path`` and now ends before ``f``'s
    place in it. (One renamed away is read to its end: nothing was lost.)"""
    now = _end_of(path)
    return now is not None and now[0] == os.fstat(f.fileno()).st_ino and now[1] < f.tell()


def record(line: str) -> tuple[dict, str] | None:
    """The log line in ``line`` as an object and as its JSON text, or None when it holds
    none. A line a writer cut short (a process killed in its write, a full disk) has the
    next writer's whole line after it, and a power loss leaves NULs before the first
    line written after the boot: that whole line is the one at the end, found by trying
    in turn each ``{"`` that opens an object (a damaged line only, so the cost is no
    one's)."""
    text = line.rstrip("\n")
    first = len(text) - len(text.lstrip())  # json.loads allows blanks around
    found = _whole(text, first)
    if found is not None:
        return found, text
    # Only a `{"key":` is tried, each read in place: `json.loads(text[start:])` of each
    # `{"` copied the rest of the line for each, and a failed read's message counts the
    # line breaks before it: minutes for a few MB of garbage.
    at = _OBJECT_START.search(text, first + 1)
    while at is not None:
        found = _whole(text, at.start())
        if found is not None:
            return found, text[at.start() :]
        at = _OBJECT_START.search(text, at.start() + 1)
    return None


def _whole(text: str, start: int) -> dict | None:
    """The object that starts at ``start`` and ends ``text``, or None."""
    try:
        rec, end = _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):  # garbage nested deeper than Python's limit
        return None
    return rec if isinstance(rec, dict) and _BLANKS.match(text, end).end() == len(text) else None


_DECODER = json.JSONDecoder()
_BLANKS = re.compile(r"[ \t\n\r]*")
_OBJECT_START = re.compile(r'\{"(?:[^"\\]|\\.)*"[ \t\n\r]*:')


def _started_again(f, now: tuple[int, int, int], last: tuple[int, int, int] | None) -> bool:  # noqa: ANN001 - an open file
    """The file at the log's path is not the rest of the one open as ``f``: another file
    by that name, or this one truncated in place; and, when ``last`` is the look before
    this one with nothing read since, truncated and written again to the very size read
    so far, which only its modification time tells."""
    ino, size, mtime = now
    if ino != os.fstat(f.fileno()).st_ino or size < f.tell():
        return True
    return last is not None and last[:2] == (ino, size) and last[2] != mtime


def _end_of(path: Path) -> tuple[int, int, int] | None:
    """The file's inode, size and modification time, or None between a rename and the
    new file."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


@dataclass(frozen=True)
class Wanted:
    """Which lines ``reviewq logs`` shows: the period (UTC, ``until`` excluded), a job, an
    event (:func:`event_matches`), and the least grave level."""

    since: datetime | None = None
    until: datetime | None = None
    job_id: int | None = None
    event: str | None = None
    level: int | None = None

    def takes(self, rec: dict) -> bool:
        if not self.in_period(rec):  # a line that says no time is in no period
            return False
        if self.level is not None:
            rank = level_rank(rec.get("level"))
            # A level no writer reviewq knows of uses is shown: it could be the gravest.
            if rank is not None and rank < self.level:
                return False
        if self.event and not event_matches(self.event, rec.get("event")):
            return False
        return (
            self.job_id is None
            or self.job_id in _jobs_of(rec)
            or _in_ranges(self.job_id, rec.get("job_ranges"))
        )

    def in_period(self, rec: dict) -> bool | None:
        """Whether a line falls in the period (True without one); None when it says no
        time."""
        if not (self.since or self.until):
            return True
        at = _when(rec)
        if at is None:
            return None
        return not ((self.since and at < self.since) or (self.until and at >= self.until))


def event_matches(given: str, event: object) -> bool:
    """``logs --event``: the event named, in any case, or every event under it, whole dotted
    words, with or without the dot (`attempt` and `attempt.` are every `attempt.*`; not
    `attempt.start`, a word cut short). Matched exactly, `JOB.FAILED` and `attempt`
    showed nothing and exited 0, a quiet night to the person who typed them: reviewq's
    events are lower case, and no two differ by case alone. A trailing `*` is the same
    prefix (`attempt.*`, as the help writes it); `*` alone is every event."""
    want = given.casefold().rstrip(".*")
    got = str(event).casefold() if event is not None else ""
    return not want or got == want or got.startswith(want + ".")


def _jobs_of(rec: dict) -> list[object]:
    """The jobs whose story a line is part of. A follow-up's queueing (fix.queued,
    audit.queued) is its source job's story too, and a split (job.split, into=[…]) is
    the story of the jobs it made; so are a fix's re-reviews (fix.rereview, jobs=[…]) and
    their withdrawal (fix.rereview_withdrawn: the one line that says why such a job
    failed), and a pause lifted or run out (reviewer.resumed, reviewer.pause_ended: the jobs
    it held, in job_ranges). So is a
    worker's reap of a dead one's attempts (worker.reaped_orphans, worker.reap_unsent:
    attempts=[[job, attempt], …]), on its own machine the one line about them. A count
    (`jobs=3`, `attempts=3`) names no job."""
    named = [j for ids in (rec.get("into"), rec.get("jobs")) if isinstance(ids, list) for j in ids]
    pairs = rec.get("attempts")
    if isinstance(pairs, list):
        named += [p[0] for p in pairs if isinstance(p, list) and p]
    return [rec.get("job_id"), rec.get("source_job_id"), *named]


# How many runs of consecutive job ids a line names (``job_ranges``); the jobs past them
# are counted. A lifted pause named every job it held, thousands on one line.
RANGES_NAMED = 10


def id_ranges(ids: Iterable[int]) -> tuple[list[list[int]], int]:
    """Job ids as runs of consecutive ones, ``[first, last]``, the first
    :data:`RANGES_NAMED` of them, and how many ids those leave out. The jobs of one
    reviewer a sweep made are most often one run: each named, in a few numbers."""
    ranges: list[list[int]] = []
    for i in sorted(set(ids)):
        if ranges and ranges[-1][1] == i - 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    left = sum(last - first + 1 for first, last in ranges[RANGES_NAMED:])
    return ranges[:RANGES_NAMED], left


def held_jobs(ids: Iterable[int]) -> dict:
    """The fields of a line about the jobs a pause held (``reviewer.resumed``,
    ``reviewer.pause_ended``): how many, and the runs of their ids that name them in each
    one's story (``logs --job N``)."""
    ids = list(ids)
    ranges, unnamed = id_ranges(ids)
    return {
        "held": len(ids),
        "job_ranges": ranges,
        **({"jobs_unnamed": unnamed} if unnamed else {}),
    }


def _in_ranges(job_id: int, ranges: object) -> bool:
    """Whether ``job_id`` is in a line's ``job_ranges`` (:func:`id_ranges`)."""
    if not isinstance(ranges, list):
        return False
    return any(
        isinstance(r, list)
        and len(r) == 2
        and all(isinstance(x, int) for x in r)
        and r[0] <= job_id <= r[1]
        for r in ranges
    )


def _when(rec: dict) -> datetime | None:
    """A line's ``timestamp`` (UTC; one without a zone is taken as UTC, as reviewq writes
    them), or None."""
    stamp = rec.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


# The names logrotate gives the log's copies: `reviewq.jsonl.1`, `reviewq.jsonl.2.gz`,
# and with `dateext`, `reviewq.jsonl-20261126` (and `.gz`); compressed by another
# `compresscmd`, another `compressext`.
_ROTATED = re.compile(r"(?:\.\d+|-\d[\d_.:-]*?)(?P<ext>\.(?:gz|bz2|xz|zst|lz4|lzo|lz|Z|br))?")
# The compressions read, by the module that reads each (imported when one is read): gzip
# (logrotate's own), and bzip2 and xz (`compresscmd`), which Python reads as well.
_OPENERS = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}
_READ = ("", *_OPENERS)  # and a copy not compressed
# How many lines of a rotated copy are looked at for its first time.
_FIRST_LINES = 100


Listed = tuple[int, int, int] | None  # a file's inode, size and mtime when listed (_end_of)


def rotated(path: Path) -> list[tuple[datetime, Path, Listed]]:
    """The log's rotated copies beside it with the first time each holds, oldest first
    (their names order them only by the rotation's own scheme, `dateformat` its own);
    one whose first lines say no time, by its modification time. Each with the file it
    was when listed."""
    names = {p: _end_of(p) for p in _copies(path) if _compression(p, path) in _READ}
    whole = _whole_copies(names, path)
    return sorted((_first_time(p), p, at) for p, at in names.items() if p in whole)


def _whole_copies(copies: Iterable[Path], path: Path) -> list[Path]:
    """``copies`` but a compressed one whose copy is still beside it: `compress` writes
    `X.gz` beside `X` and removes `X` once the `.gz` is whole; in between, `X` is the
    whole copy (read both, each of its lines came twice)."""
    copies = list(copies)
    compressing = {
        _compressed(p, ext) for p in copies if not _compression(p, path) for ext in _OPENERS
    }
    return [p for p in copies if p not in compressing]


def copies(path: Path) -> list[Path]:
    """The log's rotated copies beside it, newest first (by the last write to each: by
    name, `.10.gz` came before `.2.gz`, and a date extension's oldest first)."""
    return _newest_first(_copies(path))


def _newest_first(copies: Iterable[Path]) -> list[Path]:
    return sorted(copies, key=lambda p: (_end_of(p) or (0, 0, 0))[2], reverse=True)


def _copies(path: Path) -> list[Path]:
    """The files beside the log named as logrotate names its copies."""
    try:
        return [
            p
            for p in path.parent.iterdir()
            if p.name.startswith(path.name)
            and _ROTATED.fullmatch(p.name[len(path.name) :])
            and p.is_file()
        ]
    except OSError:
        return []


def _compression(copy: Path, path: Path) -> str:
    """A copy's compression by its name (`.gz`), or "" for none."""
    return _ROTATED.fullmatch(copy.name[len(path.name) :])["ext"] or ""


def _compressed(copy: Path, ext: str) -> Path:
    return copy.with_name(copy.name + ext)


def _unread_copies(path: Path) -> list[Path]:
    """The log's copies compressed as reviewq cannot read (zstd, lz4…)."""
    return sorted(p for p in _copies(path) if _compression(p, path) not in _READ)


def _unreadable() -> tuple[type[BaseException], ...]:
    """What reading a copy cut short or damaged raises: OSError and EOFError, zlib's error
    and, once xz is read, lzma's own (not an OSError)."""
    lzma = sys.modules.get("lzma")
    return (OSError, EOFError, zlib.error, *((lzma.LZMAError,) if lzma else ()))


def _open_text(path: Path):  # noqa: ANN202 - a text file, compressed or not
    return _opened(path, "rt", encoding="utf-8", errors="replace")


def _open_bytes(path: Path):  # noqa: ANN202 - a binary file, compressed or not
    return _opened(path, "rb")


def _opened(path: Path, mode: str, **text: str):  # noqa: ANN202 - a file, compressed or not
    opener = _OPENERS.get(path.suffix)
    if opener:
        # Imported here: every process imports this module, few read a `.gz` (1-6 ms).
        module = importlib.import_module(opener)
        return module.open(path, mode, **text)
    return open(path, mode, **text)  # noqa: SIM115 - the caller's to close


def _first_time(path: Path) -> datetime:
    """The first time a file's first lines say; else its modification time; else (gone)
    the end of time. Never raises."""
    try:
        with _open_text(path) as f:
            for _, line in zip(range(_FIRST_LINES), f, strict=False):
                found = record(line)
                at = _when(found[0]) if found else None
                if at is not None:
                    return at
    except _unreadable():
        pass  # a copy still being compressed, or damaged: its time on disk
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except OSError:
        return datetime.max.replace(tzinfo=UTC)


def files_for(path: Path, wanted: Wanted) -> list[tuple[Path, Listed]]:
    """The files that can hold lines of ``wanted``'s period, oldest first, each with the
    file it was when listed (None for the log read without a period: nothing to compare):
    the log itself, and with a ``since``, the rotated copies whose lines reach into the
    period (a copy holds the lines from its first time to the next file's)."""
    if wanted.since is None:
        return [(path, None)]
    log = _end_of(path)
    found = rotated(path)
    starts = [t for t, _, _ in found]
    now = _first_time(path) if log and log[1] else None
    ends = [*starts[1:], now]
    return [
        (p, at)
        for (start, p, at), end in zip(found, ends, strict=False)
        if (end is None or end > wanted.since) and (wanted.until is None or start < wanted.until)
    ] + [(path, log)]


def _rotated_since(name: Path, listed: Listed, log: Path) -> bool:
    """Whether logrotate ran between the listing of the files and the read of ``name``:
    a copy is another file by its name (or gone, but for the `.gz` it was compressed
    into), the log another file or emptied (copytruncate)."""
    if listed is None:
        return False
    now = _end_of(name)
    if now is None:
        return name == log or not any(_compressed(name, ext).exists() for ext in _OPENERS)
    return now[0] != listed[0] or (name == log and now[1] < listed[1])


def _events_in(path: Path, wanted: Wanted) -> set[str]:
    """The events of the lines of ``wanted``'s period, whatever its other filters."""
    period = Wanted(wanted.since, wanted.until)
    return {str(rec.get("event")) for rec, _ in entries(path, period, lambda _: None)}


def event_unmatched(path: Path, wanted: Wanted) -> str:
    """Why ``logs --event`` of an event reviewq writes showed nothing, for its one line: no
    line of the log read is that event (a quiet night), or the other filters left its
    lines out."""
    seen = _events_in(path, wanted)
    if any(event_matches(wanted.event or "", e) for e in seen):
        return "no line of that event matched the other filters"
    return f"no line of the log read is that event ({len(seen)} other event(s) in it)"


def known_event(given: str) -> bool:
    """Whether ``logs --event`` names an event reviewq writes or a family of them
    (:func:`event_matches`), or a logger whose records the log takes under its name."""
    return (
        any(event_matches(given, e) for e in EVENTS)
        or given.casefold().partition(".")[0].rstrip("*") in FOREIGN
    )


def event_unknown(path: Path, wanted: Wanted) -> str | None:
    """Why ``logs --event`` names no event at all, or None: reviewq writes no such event
    and no line of the log is one, the rotated copies' too (a misspelt name, with the
    names nearest it). A misspelt event showed nothing and exited 0, a quiet night to the
    person who typed it. A line of a name reviewq does not know (another release's) is
    shown all the same."""
    given = wanted.event
    if not given or known_event(given):
        return None
    # Every copy, not the log alone: after the morning's rotation the night is in them.
    since = wanted.since or datetime.min.replace(tzinfo=UTC)
    seen = _events_in(path, Wanted(since, wanted.until)) if path.exists() else set()
    if any(event_matches(given, e) for e in seen):
        return None
    near = difflib.get_close_matches(given.casefold(), sorted(EVENTS | seen), n=3)
    said = "reviewq writes no such event and no line of the log is one"
    if near:
        return f"{said} (did you mean {', '.join(near)}?)"
    families = sorted({e.partition(".")[0] + "." for e in EVENTS})
    return f"{said} (its events are under {', '.join(families)})"


def entries(
    path: Path,
    wanted: Wanted,
    said: Callable[[str], None],
    *,
    follow: bool = False,
    wait: Callable[[], None] | None = None,
) -> Iterator[tuple[dict, str]]:
    """The lines ``wanted`` takes, as objects and as their JSON text, from the files that
    can hold them (:func:`files_for`); with ``follow``, then each new line of the log.
    A damaged line is told to ``said`` in one ``warning:`` line: with a period, only one
    in it (the line after it is); with a job, only one that names the job's number, the
    others counted in one line at the end."""
    # Damage is told once the line after it shows whether it falls in the period.
    held: list[tuple[Path, str]] = []
    others = 0  # damaged lines in the period passed over that name no job wanted.job_id

    def tell() -> None:
        nonlocal others
        for name, damaged in held:
            if wanted.job_id is None or _names_job(damaged, wanted.job_id):
                said(_damage_words(name, damaged))
            else:
                others += 1
        held.clear()

    def settle(rec: dict | None) -> None:
        keep = True if rec is None else wanted.in_period(rec)
        if keep is None:
            return  # a line with no time: the next one tells
        if keep:
            tell()
        held.clear()

    if wanted.since is not None:
        for copy in _unread_copies(path):
            end = _end_of(copy)  # logrotate keeps the log's time: the copy's last line's
            if end is None or end[2] >= wanted.since.timestamp() * 1e9:
                said(
                    f"warning: {one_line(str(copy))}: compressed as reviewq does not read "
                    f"({copy.suffix}; .gz, .bz2 and .xz are read): its lines are not shown"
                )
    moved = False  # logrotate ran under the read: said once
    try:
        for name, listed in files_for(path, wanted):
            if not moved and _rotated_since(name, listed, path):
                moved = True
                said(
                    f"warning: {one_line(str(path))}: rotated by logrotate while read: "
                    "lines of the period may be missing or out of order "
                    "(`reviewq logs` again reads the set as it is now)"
                )
            for line in _file_lines(name, path, follow, wait, said):
                text = line.rstrip("\n")
                if not text.strip():
                    continue  # nothing lost in it: said, it was "0 NUL bytes (a power loss)"
                found = record(text)
                if found is None or found[1] != text:
                    # Said, not passed over in silence; and a line written after the
                    # damage is shown: it was hidden with the half line it was appended to.
                    held.append((name, text[: len(text) - len(found[1])] if found else text))
                    if not (wanted.since or wanted.until):
                        tell()
                if found is None:
                    continue
                if held:
                    settle(found[0])
                if wanted.takes(found[0]):
                    yield found
        # Damage after the last line: in the period when it has no end.
        if held and wanted.until is None:
            settle(None)
    finally:
        if others:
            said(
                f"warning: {one_line(str(path))}: {others} damaged line(s) passed over that "
                # The same files: with a period, `reviewq logs` alone reads none of the copies.
                f"name no job {wanted.job_id} (the same command without --job says each)"
            )


def _names_job(text: str, job_id: int) -> bool:
    """Whether the text of a damaged line names ``job_id`` as a line of that job does
    (:func:`_jobs_of`): a number in a time or a path is not a job's."""
    return bool(
        re.search(
            rf'"(?:job_id|source_job_id)"\s*:\s*{job_id}(?![\d.])'
            rf'|"(?:into|jobs)"\s*:\s*\[[^\]]*?(?<![\d.]){job_id}(?![\d.])'
            rf'|"attempts"\s*:\s*\[[\d\s,\[\]]*?\[\s*{job_id}\s*,',
            text,
        )
    )


def _file_lines(
    name: Path,
    log: Path,
    follow: bool,
    wait: Callable[[], None] | None,
    said: Callable[[str], None],
) -> Iterator[str]:
    """The lines of one file of :func:`entries`: the log itself as :func:`lines` reads
    it, a rotated copy to its end."""
    if name == log:
        try:
            yield from lines(log, follow, wait, said)
        except Truncated:
            said(
                f"warning: {one_line(str(log))}: emptied while read (logrotate's "
                "copytruncate): the lines after the last one shown are in its rotated "
                "copy (`reviewq logs --since` reads it too)"
            )
        return
    try:
        try:
            f = _open_text(name)
        except FileNotFoundError:
            # Compressed since the look at the folder (logrotate removes `X` once `X.gz`
            # is whole): the same lines.
            done = [_compressed(name, e) for e in _OPENERS if _compressed(name, e).exists()]
            if name.suffix in _OPENERS or not done:
                raise
            f = _open_text(done[0])
        with f:
            yield from f
    except _unreadable() as exc:  # a copy still being compressed, or damaged
        said(f"warning: {one_line(str(name))}: cannot read on ({exc}): the rest passed over")


def _damage_words(path: Path, damaged: str) -> str:
    """The ``warning:`` line for the damaged start of a line."""
    # A power loss leaves NULs where the blocks after the last one written were, from
    # the middle of a line on: counted, not quoted as 60 `\x00`s.
    head = damaged.rstrip("\0")
    nuls = len(damaged) - len(head)
    return f"warning: {one_line(str(path))}: a damaged line passed over (cut short by a " + (
        "crash or a full disk, or not a log line): "
        + ", then ".join(
            ([one_line(head[:60]) + ("…" if len(head) > 60 else "")] if head else [])
            + ([f"{nuls} NUL bytes (a power loss)"] if nuls else [])
        )
    )


def line_text(rec: dict) -> str:
    """A log line as ``reviewq logs`` shows it: time, level and event, then the fields
    (:func:`fields_text`). Takes those three and the logger out of ``rec``."""
    # Cut to milliseconds; the zone stays: these are UTC, as every time reviewq shows.
    stamp = str(rec.pop("timestamp", ""))
    stamp = stamp[:-1][:23] + "Z" if stamp.endswith("Z") else stamp
    head = f"{stamp} {str(rec.pop('level', '')):<7} {rec.pop('event', '')}"
    rec.pop("logger", None)
    # One line each, whatever a value holds (a file name with a line break in it
    # printed a log line of its own).
    return one_line(head + "  " + fields_text(rec))


def fields_text(fields: Mapping[str, object]) -> str:
    """A log line's fields as a person reads them: ``key=value``, a string as it is and
    any other value (a dict, a list, null, true) as the JSON the log file holds: Python's
    own form (``{'a': 1}``, ``None``) was neither what the file says nor what ``jq`` reads."""
    return " ".join(
        f"{k}={v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)}"
        for k, v in fields.items()
    )


_MIN_SECRET = 6  # characters: shorter values are words, not keys


def secret_name(name: str) -> bool:
    words = _WORDS.findall(name)
    while words and words[-1].isdigit():  # API_KEY_2
        words.pop()
    if not words:
        return False
    last = words[-1]
    return bool(_SECRET_WORD.fullmatch(last)) and last.upper() not in _NOT_SECRET_WORDS


def _secret_parts(value: str) -> list[str]:
    """What of an environment value under a secret's name is secret: the value, or, in
    one of several words ("Bearer sk-…"), each word long enough to be a key. A number
    is none. (Registered secrets, a password in the queue URL, are taken whole.)"""
    value = value.strip()  # a key read from a file keeps its newline
    if value.isdigit():
        return []
    parts = value.split()
    if len(parts) > 1:
        return [p for p in parts if len(p) >= 8]
    return [value] if len(value) >= _MIN_SECRET else []


def add_secrets(values: Iterable[str]) -> None:
    new = {v for v in values if len(v) >= _MIN_SECRET} - _extra_secrets
    if new:
        _extra_secrets.update(new)
        _cache.clear()


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if environ is None else environ
    vals = {p for k, v in env.items() if secret_name(k) for p in _secret_parts(v)}
    vals |= _extra_secrets
    return sorted(vals, key=len, reverse=True)


def _secrets() -> list[str]:
    # The environment is read again when it changed size (a test, an embedding program).
    key = len(os.environ)
    if _cache.get("key") != key:
        _cache["key"] = key
        _cache["values"] = secret_values()
    return _cache["values"]  # type: ignore[return-value]


# Terminal escape sequences (CSI: colours, cursor moves; OSC: a window title, a link, up
# to its end or the line's; any other ESC pair: a reset) and the other control characters
# but tab and line end (a lone carriage return, as a progress bar writes, is one).
_CONTROLS = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\n]*(?:\x07|\x1b\\)?|[ -~]?)"
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"
)


# Bidi embeddings, overrides and isolates: kept as their escapes, so the words after one
# read in the order they were written (Trojan Source), wherever the text is shown.
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")


def _bidi_shown(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def redact(text: str, also: Iterable[str] = ()) -> str:
    """``text`` with every known secret replaced, its terminal control sequences
    removed and its bidi controls shown by their escapes. Used on agent output quoted in failure reasons and rationales before they are
    stored, so no report, manifest, retry prompt or summary can repeat a key an agent
    printed, nor send the terminal of the person who reads it an agent's escape sequence
    (a window title, a screen reset). ``also``: another process's secrets (:func:`spanned`)."""
    text = _CONTROLS.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _BIDI.sub(_bidi_shown, text)
    secrets = sorted({*_secrets(), *also}, key=len, reverse=True) if also else _secrets()
    for s in secrets:
        if s in text:
            text = text.replace(s, "[redacted]")
    return text


def redact_all(texts: Iterable[str], also: Iterable[str] = ()) -> list[str]:
    also = list(also)
    return [redact(t, also) for t in texts]


def secret_spans(data: bytes) -> list[list[int]]:
    """Where this process's secrets lie in ``data``: byte ranges ``[start, end)``, in
    order, overlaps merged. For a worker's output, which it sends as the agent wrote it
    to a control process that may not know this machine's secrets."""
    found = []
    for secret in _secrets():
        needle = secret.encode()
        at = data.find(needle)
        while at >= 0:
            found.append([at, at + len(needle)])
            at = data.find(needle, at + len(needle))
    merged: list[list[int]] = []
    for start, end in sorted(found):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


# As many distinct secrets as a worker's settings and environment hold, with room: each
# is replaced in every text the control stores of an outcome.
MAX_SPANNED = 64


def spanned(data: bytes, spans: object) -> list[str]:
    """The secrets of another process that ``spans`` (its :func:`secret_spans` of
    ``data``) point at, to redact as this process's own: never the ranges blanked in
    ``data``, which a secret in the output's frame (a pair's path) made another parse.
    Spans out of order, outside ``data``, shorter than a secret or splitting a character
    are passed over; at most :data:`MAX_SPANNED` distinct ones are taken."""
    found: dict[str, None] = {}
    done = 0
    for span in spans if isinstance(spans, list) else []:
        if not (
            isinstance(span, list)
            and len(span) == 2
            and all(type(x) is int for x in span)
            and done <= span[0] < span[1] <= len(data)
        ):
            continue
        done = span[1]
        try:
            secret = data[span[0] : span[1]].decode()
        except UnicodeDecodeError:
            continue
        if len(secret) >= _MIN_SECRET:
            found[secret] = None
        if len(found) >= MAX_SPANNED:
            break
    return list(found)


def redact_data(value: object) -> object:
    """``value`` (JSON data: an agent's telemetry) with every string in it redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_data(v) for v in value]
    return value


class _Redactor:
    def __call__(self, logger: object, name: str, event_dict: dict) -> dict:
        if not _secrets():
            return event_dict
        return {k: redact_data(v) for k, v in event_dict.items()}


def _foreign_event(logger: object, name: str, event_dict: dict) -> dict:
    """Huey's (and any library's) records: a dotted event, the text as ``message``."""
    record = event_dict.get("_record")
    if record is not None and not record.name.startswith(LOG_NAME):
        event_dict["message"] = event_dict.pop("event", "")
        event_dict["event"] = (
            record.name if record.name.startswith("huey") else f"lib.{record.name}"
        )
    return event_dict


def configure(
    state_dir: Path | None,
    *,
    stderr_level: str = "WARNING",
    stderr_format: str | None = None,
    process: str | None = None,
) -> None:
    """Set up logging once per process. ``stderr_format``: json, console, or None to
    choose: a command (no ``process``) says its log lines on stderr as ``warning:``
    lines, on a terminal or not (cron mails a person what it prints: a JSON line beside
    the command's `error:` line was the log file's business, and the file has it); a
    long-running process, console on a terminal and JSON elsewhere (the journal)."""
    # Imported here: a read-only command never pays for it. Its tracebacks for rich are
    # not used (plain_traceback, format_exc_info), and rich costs each process ~40 ms.
    import_without("structlog", "rich")
    import structlog

    # A sweep's children: their stderr is a file kept for crashes, which every info line
    # the log file already holds made as large as the log (and each line cost two writes).
    chosen = (os.environ.get("REVIEWQ_STDERR_LEVEL") or "").upper()
    chosen = "WARNING" if chosen == "WARN" else chosen  # logging's own other name
    if chosen in _LEVELS:
        stderr_level = chosen
    elif chosen:
        _unknown_setting("REVIEWQ_STDERR_LEVEL", ", ".join(_LEVELS))
    forced = (os.environ.get("REVIEWQ_LOG_FORMAT") or "").lower()
    if forced and forced not in ("json", "console"):
        _unknown_setting("REVIEWQ_LOG_FORMAT", "json, console")
        forced = ""
    key = f"{state_dir}|{stderr_level}|{stderr_format}|{process}"
    if _configured.get("key") == key:
        return
    fmt = (
        stderr_format
        or forced
        or ("command" if process is None else "console" if sys.stderr.isatty() else "json")
    )
    shared = [
        _merge_context,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]
    if process:
        shared.append(_add_static("process", process))
    redactor = _Redactor()
    renderer = structlog.processors.JSONRenderer(sort_keys=False)
    json_formatter = _formatted_once(structlog.stdlib.ProcessorFormatter)(
        foreign_pre_chain=[*shared, _foreign_event],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            redactor,
            renderer,
        ],
    )
    console_formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, _foreign_event],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            redactor,
            structlog.dev.ConsoleRenderer(
                colors=False, exception_formatter=structlog.dev.plain_traceback
            ),
        ],
    )
    command_formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, _foreign_event],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            redactor,
            _warning_line,
        ],
    )
    # No record attribute we render needs the caller's file and line, the thread or the
    # process (structlog's event dict is the line): the logging HOWTO's "Optimization"
    # switches: the caller lookup alone walked the stack for every line.
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_reviewq", False):
            root.removeHandler(h)
            h.close()
    root.setLevel(logging.INFO)
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(stderr_level.upper())
    err.setFormatter(
        {"console": console_formatter, "command": command_formatter}.get(fmt, json_formatter)
    )
    err._reviewq = True  # type: ignore[attr-defined]
    # People get one line; tracebacks go to the log file only.
    err.addFilter(_no_traceback)
    if process is None:  # a command: it says these itself, as `warning:` lines
        err.addFilter(_not_said_by_commands)
    root.addHandler(err)
    if state_dir is not None:
        path = log_path(state_dir)
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        if path.exists() or path.is_symlink():  # a link to nowhere fails here too
            # Opened on its first line, a log that cannot be was found only then: a
            # command past its checks went on with tracebacks, the control crashed.
            with open(path, "a", encoding="utf-8"):
                pass
        elif not os.access(path.parent, os.W_OK | os.X_OK):  # it could not be made
            raise PermissionError(errno.EACCES, "cannot be created here", str(path))
        # delay=True: a command that logs nothing leaves no file behind.
        fh = _LogFile(path, encoding="utf-8", delay=True)
        fh.setLevel(logging.INFO)
        fh.setFormatter(json_formatter)
        fh._reviewq = True  # type: ignore[attr-defined]
        root.addHandler(fh)
    # Huey logs two INFO lines per task executed; its warnings and errors, and the
    # consumer's start and stop, are what an operator needs from it.
    logging.getLogger("huey").setLevel(logging.WARNING)
    logging.getLogger("huey.consumer").setLevel(logging.INFO)
    processors = [*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter]
    structlog.configure(
        processors=processors,
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    _configured["key"] = key
    _configured["direct"] = _Direct(processors, json_formatter, redactor, renderer)


# A level as writers spell it, by rank: structlog's `exception` and `warn`, and `fatal`,
# logging's other name for critical, which a writer of another make may put in a line.
_LEVEL_RANKS = {
    "debug": 10,
    "info": 20,
    "warn": 30,
    "warning": 30,
    "error": 40,
    "exception": 40,
    "critical": 50,
    "fatal": 50,
}
LEVEL_NAMES = ("debug", "info", "warning", "error", "critical")
_LEVELS = tuple(name.upper() for name in LEVEL_NAMES)  # as REVIEWQ_STDERR_LEVEL names them


def level_rank(level: object) -> int | None:
    """How grave a line's ``level`` is (logging's numbers), in any case; None for a level
    no writer reviewq knows of uses."""
    return _LEVEL_RANKS.get(level.lower()) if isinstance(level, str) else None


def _unknown_setting(name: str, known: str) -> None:
    """An environment setting that names nothing known, said once per process: ignored
    in silence, a mistyped level (`warn`, `verbose`) left the journal as full as before,
    or a format (`JSON`, `text`) printed JSON, and nothing said why."""
    if _configured.get(f"said {name}"):
        return
    _configured[f"said {name}"] = True
    value = one_line(os.environ.get(name, ""))
    sys.stderr.write(f"warning: {name}={value} is none of {known}: ignored\n")


# How long lines go on in a log renamed away before its path is made again: logrotate's
# `create` follows its rename at once.
_RENAMED_WAIT_S = 2.0


class _LogFile(logging.FileHandler):
    """The log file. A line it cannot write (a full disk, the file made read-only) is
    said on stderr in one line, once until a line goes through again, and the work goes
    on: logging's own handler printed a traceback for every line."""

    _failing = False  # said, and not written since
    _failed = False  # the line being written failed

    _opened: tuple[int, int] | None = None  # the file the stream writes to (device, inode)
    _stuck = False  # the path names a file that cannot be opened: said, not yet opened
    _renamed_at: float | None = None  # when the file written was first seen renamed away

    def _open(self):  # noqa: ANN202 - logging's signature
        # Owner-only, as regularfile.private makes the state folder's files (this layer
        # may not import it): the log quotes notes' paths, gates' words and agents' ends.
        stream = open(  # noqa: SIM115 - logging's stream, closed by the handler
            self.baseFilename,
            self.mode,
            encoding=self.encoding,
            errors=self.errors,
            opener=lambda path, flags: os.open(path, flags, 0o600),
        )
        st = os.fstat(stream.fileno())
        self._opened = (st.st_dev, st.st_ino)
        return stream

    def _follow_path(self) -> None:
        """Go on in the file the log's path names, when it names another than the one
        written. logrotate's `create` (its default) renames the log and makes an empty
        one: a control and a worker running for weeks wrote to the renamed copy, then, once
        `rotate N` deleted it, to a deleted file filling the disk unseen. Called under the
        handler's lock; a stat a line (a stat every so often left the lines of that while
        in the copy, which `compress` without `delaycompress` removes in the same run)."""
        if self.stream is None:
            return
        try:
            now = os.stat(self.baseFilename)
        except OSError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == self._opened:
            self._renamed_at = None
            return
        if now is None and os.fstat(self.stream.fileno()).st_nlink:
            # Renamed, and nothing at the path yet: between logrotate's rename and its
            # `create` a file made here was renamed by logrotate to `-DATE.backup`, which
            # no one reads or rotates. The lines go on in the copy a while; after it (no
            # `create`: `nocreate`, a `mv`) the path is made. One deleted (`rm`) at once.
            at = time.monotonic()
            if self._renamed_at is None:
                self._renamed_at = at
            if at - self._renamed_at < _RENAMED_WAIT_S:
                return
        try:
            stream = self._open()
        except OSError as exc:
            # `create` with an owner or mode this process cannot open: its lines went
            # nowhere, one warning for all. They go on in the copy, and the path is
            # tried again at each line.
            if not self._stuck:
                self._stuck = True
                with contextlib.suppress(Exception):
                    sys.stderr.write(
                        f"warning: {self.baseFilename}: cannot open the log again "
                        f"({exc.strerror or exc}): lines go on in the file it was\n"
                    )
            return
        self._stuck = False
        self._renamed_at = None
        stream, self.stream = self.stream, stream
        with contextlib.suppress(OSError):  # its last line was flushed when written
            stream.close()

    def emit(self, record: logging.LogRecord) -> None:
        self._failed = False
        try:
            self._follow_path()
            super().emit(record)  # on a failed write it calls handleError
        except OSError:  # ... but not on a failed open (a dangling link, a folder made read-only)
            self.handleError(record)
        if not self._failed:
            self._failing = False

    def write_line(self, line: str) -> None:
        """A line rendered already (:class:`_Direct`), written as :meth:`emit` writes a
        record's, without the record."""
        self.acquire()
        try:
            self._failed = False
            try:
                self._follow_path()
                if self.stream is None and (self.mode != "w" or not self._closed):
                    self.stream = self._open()
                if self.stream:
                    self.stream.write(line + self.terminator)
                    self.stream.flush()
            except RecursionError:
                raise
            except Exception:  # noqa: BLE001 - as emit: said once, the work goes on
                self.handleError(None)  # type: ignore[arg-type]
            if not self._failed:
                self._failing = False
        finally:
            self.release()

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        self._failed = True
        if self._failing:
            return
        self._failing = True
        exc = sys.exc_info()[1]
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        with contextlib.suppress(Exception):
            sys.stderr.write(f"warning: {self.baseFilename}: cannot write the log ({why})\n")


def _formatted_once(base: type) -> type:
    """``base`` (structlog's ProcessorFormatter) rendering each record once for all the
    handlers it serves: the log file and a JSON stderr share one formatter, and rendering
    (processors, redaction, JSON) was a tenth of the control process's CPU, done twice."""

    class Once(base):  # type: ignore[misc, valid-type]
        def format(self, record: logging.LogRecord) -> str:
            done = record.__dict__.get("_reviewq_line")
            if done is not None and done[0] is self:
                return done[1]
            line = super().format(record)
            record._reviewq_line = (self, line)  # type: ignore[attr-defined]
            return line

    return Once


# Events a command prints itself as one `warning:` line (`PATH: reason`, as select does):
# on its stderr they came twice, or as a JSON line where select said it plainly. An
# escalation a command raises (finalize, run-job) is its `escalated:` line.
SAID_BY_COMMANDS = frozenset({"kb.file_skipped", "escalation.raised", "sweep.partition_unreviewed"})
# Events the command running now says itself, in its own summary (:func:`said_by_command`).
_SAID_HERE: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "reviewq_said_here", default=frozenset()
)


@contextlib.contextmanager
def said_by_command(*events: str) -> Iterator[None]:
    """Within it, ``events`` stay in the log file and off the command's stderr: the command
    sums them up in one line of its own (`rewrite-files --all` on a read-only jobs/ printed
    a `job.files_failed` line for each of 49 jobs before its own one-line refusal)."""
    token = _SAID_HERE.set(_SAID_HERE.get() | frozenset(events))
    try:
        yield
    finally:
        _SAID_HERE.reset(token)


def _warning_line(logger: object, name: str, event_dict: dict) -> str:
    """A log line on a command's stderr: ``warning: EVENT  key=value…`` (``error:`` for
    an error or worse: cron mail kept its level), one line (the time is the log file's)."""
    event_dict.pop("timestamp", None)
    level = event_dict.pop("level", None) or name
    event_dict.pop("logger", None)
    event = event_dict.pop("event", "")
    said = "error" if (level_rank(level) or 0) >= logging.ERROR else "warning"
    return one_line(f"{said}: {event}" + (f"  {fields_text(event_dict)}" if event_dict else ""))


# Characters a reader cannot see as themselves: controls, format characters (a bidi
# override, a zero-width space, a byte-order mark), line and paragraph separators,
# surrogates, private-use and unassigned code points. Spaces (a no-break one) are left.
_UNSEEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def _letter_outside_latin(c: str) -> bool:
    return c > "\u036f" and unicodedata.category(c)[0] in "LMS"


def _right_to_left(c: str) -> bool:
    return unicodedata.bidirectional(c) in ("R", "AL")


def _written(text: str, i: int) -> bool:
    """Whether the invisible ``text[i]`` is part of the writing around it, not hidden in
    it: a zero-width non-joiner or joiner between two letters, marks or symbols of a
    script past Latin (Persian's half-space in "می‌خواهم", an emoji's ZWJ sequence,
    Devanagari's conjuncts), a left-to-right, right-to-left or Arabic letter mark beside
    a right-to-left letter (where it moves no more than that letter does). Shown as
    escapes, every Persian word and family emoji on the page read as a code."""
    c = text[i]
    if "\U0001f000" <= c <= "\U0001faff":
        # Unassigned in this Python's Unicode (3.11 knows 14.0), a picture in the next:
        # a pink heart (15.0) showed as \U0001fa77. These blocks hold no format character.
        return True
    before, after = text[i - 1 : i], text[i + 1 : i + 2]
    if c in "\u200c\u200d":
        return _letter_outside_latin(before) and _letter_outside_latin(after)
    if c in "\u200e\u200f\u061c":
        return any(map(_right_to_left, before + after))
    return False


def visible(text: str, keep: str = "\n\r\t") -> str:
    """Text from input with every character a reader could not see shown by its escape
    (``\\u202e``), but those in ``keep`` and those its script writes with (:func:`_written`):
    a right-to-left override reordered the words around it (Trojan Source) and a
    zero-width space made a changed line read unchanged."""
    if text.isprintable():
        return text
    return "".join(
        c
        if c.isprintable()
        or c in keep
        or unicodedata.category(c) not in _UNSEEN
        or _written(text, i)
        else repr(c)[1:-1]
        for i, c in enumerate(text)
    )


def one_line(text: str) -> str:
    """Text from input as one printable line: control characters (a NUL, a line break an
    input smuggled into a path) are shown escaped, not written to the terminal."""
    return text if text.isprintable() else repr(text)[1:-1]


def _not_said_by_commands(record: logging.LogRecord) -> bool:
    if not isinstance(record.msg, dict):
        return True
    event = record.msg.get("event")
    # A job ended by hand is said by the command that ended it (``finalize``, ``run-job``:
    # its reasons, then the error line); its log line before them said each reason twice.
    return event not in SAID_BY_COMMANDS | _SAID_HERE.get() and not (
        event == "job.failed" and record.msg.get("by_hand")
    )


def _no_traceback(record: logging.LogRecord) -> bool:
    if record.exc_info:
        return False
    # structlog carries the exception in its event dict, not on the record.
    return not (isinstance(record.msg, dict) and record.msg.get("exc_info"))


def _merge_context(logger: object, name: str, event_dict: dict) -> dict:
    """The ids bound for the task (structlog's merge_contextvars), but the bound attempt
    only on lines about the bound job: a follow-up queued while job 94's attempt 1 was
    finalized logged `fix.queued job_id=104 … attempt=1`, an attempt job 104 never had."""
    import structlog

    context = structlog.contextvars.get_contextvars()
    if "attempt" in context and event_dict.get("job_id", context.get("job_id")) != context.get(
        "job_id"
    ):
        del context["attempt"]
    context.update(event_dict)
    return context


def _add_static(key: str, value: str):
    def proc(logger: object, name: str, event_dict: dict) -> dict:
        event_dict.setdefault(key, value)
        return event_dict

    return proc


class _Direct:
    """A line rendered straight to the handlers this module installed, the way
    structlog's chain renders it (the same processors, called in the same order, and the
    JSON formatter's own redactor and renderer), without the bound logger, the stdlib
    logger's record making, nor the formatter's copy of the record: the hot path's
    lines cost ~17 µs each that way, several a job in the control process. Used only
    while the set-up is still the one :func:`configure` made: anything else (a test's
    ``structlog.testing.capture_logs``, which empties the processors list; pytest's
    handlers on the root logger; a console or ``warning:`` stderr that takes this level)
    goes through structlog as before."""

    def __init__(
        self,
        processors: list,
        formatter: logging.Formatter,
        redactor: _Redactor,
        renderer: Callable[..., str],
    ) -> None:
        import structlog

        self.processors = processors  # structlog's list itself: capture_logs edits it in place
        self.expected = list(processors)
        self.chain = processors[:-1]  # all but wrap_for_formatter, which hands over to logging
        self.formatter = formatter
        self.renderer = renderer
        # json.dumps given keywords makes an encoder for every line: the renderer's own
        # keywords, made once (its serializer must be json.dumps for that to be the same).
        kw = getattr(renderer, "_dumps_kw", None)
        if getattr(renderer, "_dumps", None) is json.dumps and isinstance(kw, dict):
            self.render = json.JSONEncoder(**kw).encode
        else:
            self.render = functools.partial(renderer, None, "")
        self.redactor = redactor
        self.root = logging.getLogger()
        self.handlers = [h for h in self.root.handlers if getattr(h, "_reviewq", False)]
        self.logger = logging.getLogger(LOG_NAME)
        self.get_config = structlog.get_config

    def takes(self, levelno: int) -> bool:
        """Whether a line of this level can be written directly now."""
        if (
            self.get_config()["processors"] is not self.processors
            or self.processors != self.expected
            or self.root.handlers != self.handlers
            or not self.logger.isEnabledFor(levelno)
        ):
            return False
        # Every handler that takes the line must render it as the file does.
        return all(h.formatter is self.formatter or levelno < h.level for h in self.handlers)

    def line(self, levelno: int, method: str, event: str, fields: dict) -> None:
        ed = {**fields, "event": event}
        for proc in self.chain:
            ed = proc(None, method, ed)
        line = self.render(self.redactor(None, method, ed))
        record = None
        for h in self.handlers:
            if levelno < h.level:
                continue
            if isinstance(h, _LogFile) and not h.filters:
                h.write_line(line)
                continue
            if record is None:
                record = logging.LogRecord(LOG_NAME, levelno, "", 0, ed, None, None)
                record._reviewq_line = (self.formatter, line)  # type: ignore[attr-defined]
            h.handle(record)


class _Logger:
    """What :func:`get` returns: structlog's logger, whose info, warning and error lines
    are written by :class:`_Direct` while the set-up allows (the same line, a fraction
    of the work)."""

    __slots__ = ()

    def _say(self, levelno: int, method: str, event: str, fields: dict) -> None:
        direct = _configured.get("direct")
        if direct is not None and "exc_info" not in fields and direct.takes(levelno):
            direct.line(levelno, method, event, fields)
        else:
            getattr(_structlog_logger(), method)(event, **fields)

    def info(self, event: str, **fields: object) -> None:
        self._say(logging.INFO, "info", event, fields)

    def warning(self, event: str, **fields: object) -> None:
        self._say(logging.WARNING, "warning", event, fields)

    def error(self, event: str, **fields: object) -> None:
        self._say(logging.ERROR, "error", event, fields)

    def __getattr__(self, name: str) -> object:  # debug, exception, bind…: structlog's own
        return getattr(_structlog_logger(), name)


_LOGGER = _Logger()


def _structlog_logger() -> structlog.stdlib.BoundLogger:
    import structlog

    return structlog.get_logger(LOG_NAME)


def get() -> _Logger:
    if "key" not in _configured:
        configure(None)  # never structlog's default, which prints to stdout
    return _LOGGER


@contextmanager
def bound(**ids: object) -> Iterator[None]:
    """Bind ids (job_id, attempt, note_path, gate_id, reviewer…) for one task, then clear them."""
    import structlog

    tokens = structlog.contextvars.bind_contextvars(
        **{k: v for k, v in ids.items() if v is not None}
    )
    try:
        yield
    finally:
        structlog.contextvars.reset_contextvars(**tokens)


@contextmanager
def unbound(*names: str) -> Iterator[None]:
    """Lift ids bound for the task (:func:`bound`) for a stretch that is about none of
    them, then bind them again: a line there without its own would be told as theirs."""
    import structlog

    # Ellipsis is structlog's own mark of a variable unset: merged into a line, left out.
    tokens = structlog.contextvars.bind_contextvars(**dict.fromkeys(names, ...))
    try:
        yield
    finally:
        structlog.contextvars.reset_contextvars(**tokens)
