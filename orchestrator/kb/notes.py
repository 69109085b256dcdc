"""The knowledge base on disk: its root, note discovery, notes and their regions (CONTRACT §1).

Paths are always relative to the KB root with ``/`` separators. A note that cannot be
read (not UTF-8, broken YAML) is reported as a :class:`FileProblem` and left out; the rest
of the KB still loads.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import posixpath
import re
import stat
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator import logs
from orchestrator.config import MAX_NOTE_BYTES, glob_regex
from orchestrator.kb.frontmatter import parse_simple
from orchestrator.kb.notecache import NoteCache, file_stamp
from orchestrator.regularfile import FOLDER, SPECIAL, NotRegular, open_regular

REGIONS = ("title", "description", "frontmatter", "body")
NOTES_DIR = "kb/notes"
GATES_DIR = "kb/instructions/review-gates"
TYPES_DIR = "kb/types"
PAIR_SEP = " :: "  # between a note and a gate on a prompt's and a bundle's sentinel lines
# What a sentinel line cannot carry: a line break (splitlines' too) or control character
# ends or garbles the line, and a backslash is read as a Windows separator.
_UNCARRIED = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029\\\\]")

try:  # libyaml is ~10x faster; the pure-Python loader gives the same values
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; a name the file system cannot hold (a component over 255
    bytes: ENAMETOOLONG) names nothing there, where pathlib raised it as an internal error."""
    try:
        return path.exists()
    except OSError:
        return False


def _loops(path: Path) -> bool:
    """Whether ``path`` is caught in a loop of symbolic links (ELOOP)."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def _as_named(path: Path) -> Path:
    """``path`` (absolute) with each part that names nothing replaced by the one entry of
    its folder whose name composes (NFC) the same: a name typed on a keyboard is composed,
    and a KB synced from a Mac keeps its names decomposed (as F62 has it), so
    ``ack kb/notes/café.md`` found "no such file" beside the ``café.md`` that ls shows.
    ``path`` itself when it names a file, or no single entry matches."""
    if _exists(path):
        return path
    out = Path(path.anchor)
    for part in path.parts[1:]:
        step = out / part
        if not _exists(step):
            want = unicodedata.normalize("NFC", part)
            try:
                same = [n for n in os.listdir(out) if unicodedata.normalize("NFC", n) == want]
            except OSError:
                return path
            if len(same) != 1:
                return path
            step = out / same[0]
        out = step
    return out


# A path (anything with a '/' or ending in .md) or a number in a reason, not a word's
# digit ("UTF-8" was "UTF-…" in the count line that quotes the kind).
_PARTICULAR = re.compile(r"[^\s,;()]*/[^\s,;()]*|[^\s,;()]+\.md\b|(?<![\w-])\d+")


class KBError(Exception):
    """A problem with the KB as a whole (a missing root, a path outside it)."""


# A read whose path named another file than the one it opened, opened again (a person's
# saves do not come three in a row within microseconds; a link swapped in and out can).
_OPEN_TRIES = 3


class OutsideRoot(KBError, OSError):
    """A path that led outside the root when it was opened: a link put on it (the file or
    a folder on its way) after :meth:`KB.check_rel` passed it. An OSError too, so every
    reader that skips a file it cannot read skips this one."""


@dataclass(frozen=True, slots=True)
class FileProblem:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"

    @property
    def kind(self) -> str:
        """The reason with what differs from file to file (paths, sizes, line numbers)
        blanked: 200 files skipped for one cause are one kind, said once with a count."""
        return _PARTICULAR.sub("…", self.reason)


NAMED_PER_REASON = 3  # files a warning names for one reason; the rest are counted


def capped(problems: Sequence[FileProblem], prefix: str) -> Iterator[str]:
    """One line a file, up to NAMED_PER_REASON for each kind of reason, then one line for
    each kind with how many more: 200 `.MD` files (or links out of the KB, FIFOs, notes
    over the size limit) were 200 lines at every command, burying everything else. A
    count of one more would take the line its name takes: that one is named."""
    total: dict[str, int] = {}
    for p in problems:
        total[p.kind] = total.get(p.kind, 0) + 1
    named: dict[str, int] = {}
    for p in problems:
        named[p.kind] = named.get(p.kind, 0) + 1
        if named[p.kind] <= NAMED_PER_REASON or total[p.kind] == NAMED_PER_REASON + 1:
            yield f"{prefix}{logs.one_line(p.path)}: {p.reason}"
    for kind, n in total.items():
        if n > NAMED_PER_REASON + 1:
            yield (
                f"{prefix}… and {n - NAMED_PER_REASON} more file(s) for the same reason "
                f"({logs.one_line(kind)}); `reviewq logs --event kb.file_skipped` names each one "
                "a sweep or enqueue left out"
            )


def excluded_words(n: int) -> str:
    """One line for the notes ``[kb] exclude`` left out: counted, never listed (an index
    or template a note is what the setting is for, not news at every command)."""
    return f"{n:,} note(s) excluded by [kb] exclude: not reviewed"


class NoteParseError(ValueError):
    pass


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def split_frontmatter(text: str) -> tuple[str | None, str]:
    """(frontmatter block or None, body). The body is everything after the block."""
    if text.startswith("\ufeff"):
        text = text[1:]
    # Delimiter lines may carry trailing blanks, as Jekyll and python-frontmatter allow: an
    # editor's stray space after the opening '---' turned the whole block into body text.
    first_nl = text.find("\n")
    first = text if first_nl == -1 else text[:first_nl]
    if first.rstrip() != "---":
        return None, text
    pos = first_nl + 1
    while pos <= len(text):
        nl = text.find("\n", pos)
        line = text[pos:] if nl == -1 else text[pos:nl]
        if line.rstrip() in ("---", "..."):
            block = text[first_nl + 1 : pos]
            body = "" if nl == -1 else text[nl + 1 :]
            return block, body
        if nl == -1:
            break
        pos = nl + 1
    raise NoteParseError("frontmatter block is not closed with '---'")


# A frontmatter deeper or larger than this is not a note's metadata but an attack on the
# loader: libyaml's composer recurses in C (a ~30,000-deep block overflows the stack and
# kills the process), and aliases can expand a few hundred bytes into gigabytes.
MAX_DEPTH = 100
MAX_VALUES = 10_000
# Each nesting level needs one of these characters, so fewer of them bound the depth.
_NESTING_CHARS = "[{-:?"
_UNCONSTRUCTABLE = (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError)


def parse_frontmatter(block: str | None) -> dict:
    """The frontmatter mapping; raises NoteParseError for YAML that is broken, not a
    mapping, nested deeper than MAX_DEPTH or expanding to more than MAX_VALUES values."""
    if block is None:
        return {}
    simple = parse_simple(block)
    if simple is not None:
        return simple
    if sum(block.count(c) for c in _NESTING_CHARS) > 1000:
        _check_event_depth(block)
    try:
        data = yaml.load(block, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (frontmatter line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise NoteParseError(f"broken YAML{where}: {problem}") from None
    except _UNCONSTRUCTABLE as exc:
        # A tagged or implicit value YAML resolves but cannot build (`created: 2023-02-29`).
        first = (str(exc).splitlines() or [""])[0][:200]
        raise NoteParseError(f"frontmatter holds a value YAML cannot read: {first}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise NoteParseError("frontmatter is not a mapping")
    _check_shape(data)
    return data


def _check_event_depth(block: str) -> None:
    """Refuse deep nesting from the event stream, which libyaml produces without recursion."""
    depth = 0
    try:
        for event in yaml.parse(block, Loader=_Loader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise NoteParseError(f"frontmatter is nested deeper than {MAX_DEPTH} levels")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError:
        return  # the real load reports it with its line


def _check_shape(data: dict) -> None:
    """Walk the loaded value without recursion. Shared aliases count once per use, so an
    alias bomb trips MAX_VALUES and a self-reference trips MAX_DEPTH."""
    stack: list[tuple[object, int]] = [(data, 1)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise NoteParseError(
                f"frontmatter expands to more than {MAX_VALUES:,} values (aliases?)"
            )
        if isinstance(value, dict):
            children: Iterable[object] = value.values()
        elif isinstance(value, (list, tuple, set, frozenset)):  # tuples: `!!omap`, `!!pairs`
            children = value
        else:
            continue
        if depth > MAX_DEPTH:
            raise NoteParseError(
                f"frontmatter is nested deeper than {MAX_DEPTH} levels (or refers to itself)"
            )
        stack.extend((child, depth + 1) for child in children)


def canonical_json(value: object) -> str:
    try:
        return json.dumps(
            value, sort_keys=True, ensure_ascii=False, default=_plain, separators=(",", ":")
        )
    except TypeError:
        # YAML allows keys that are numbers, dates or null beside strings, which cannot be
        # sorted together; as text they can, and string-keyed notes hash as before.
        return json.dumps(
            _string_keys(value),
            sort_keys=True,
            ensure_ascii=False,
            default=_plain,
            separators=(",", ":"),
        )


def _plain(value: object) -> object:
    """What JSON cannot hold, as text; a set (YAML's ``!!set``) in sorted order: as
    ``str`` it came out in hash order, which differs between processes and between two
    spellings of one set, so a note's frontmatter "changed" with no value changed."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=canonical_json)
    return str(value)


def _string_keys(value: object) -> object:
    if isinstance(value, dict):
        return {_key_text(k): _string_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_string_keys(v) for v in value]
    return value


def _key_text(key: object) -> str:
    if isinstance(key, str):
        return key
    return json.dumps(key) if isinstance(key, (bool, int, float)) or key is None else str(key)


_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)$")
# An ATX heading as CommonMark has it: up to three spaces of indent, one to six '#'s, then
# a blank or the end of the line ('#5' is no heading).
_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*))?$")


def atx_headings(body: str) -> Iterator[tuple[int, str]]:
    """(level, text) of each ATX heading outside fenced code: a shell comment or a
    '## Test' quoted in a code block is no heading. Fences as CommonMark has them: a
    backtick fence's info string holds no backtick, and a closing fence has no info
    string; one never closed runs to the end."""
    fence = ""
    for line in body.splitlines():
        m = _FENCE.match(line)
        if fence:
            closes = m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)
            if closes and not m.group(2).strip():
                fence = ""
            continue
        if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
            fence = m.group(1)
            continue
        h = _ATX.match(line)
        if h:
            yield len(h.group(1)), _heading_text(h.group(2) or "")


def _heading_text(rest: str) -> str:
    """A heading's text without its optional closing '#'s, which a blank must precede
    ('## Test ##' is "Test"; '# C#' is "C#")."""
    text = rest.strip(" \t")
    bare = text.rstrip("#")
    if bare != text and (not bare or bare[-1] in " \t"):
        return bare.rstrip(" \t")
    return text


def _first_heading(body: str) -> str:
    """The text of the first level-1 heading (the title when frontmatter has none)."""
    return next((text for level, text in atx_headings(body) if level == 1), "")


def _as_text(value: object) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else canonical_json(value)


@dataclass(frozen=True, slots=True)
class ParsedNote:
    meta: dict
    body: str

    def regions(self) -> dict[str, str]:
        title = self.meta.get("title")
        return {
            "title": _as_text(title) if title is not None else _first_heading(self.body),
            "description": _as_text(self.meta.get("description")),
            "frontmatter": canonical_json(self.meta),
            "body": self.body,
        }


def parse_note_text(text: str) -> ParsedNote:
    block, body = split_frontmatter(text)
    return ParsedNote(parse_frontmatter(block), body)


def decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NoteParseError(f"not UTF-8 (byte {exc.start})") from None


@dataclass(slots=True)
class Note:
    """A note as the selector sees it: path, hash and the frontmatter facts that decide
    which gates apply. The text and the full frontmatter are read on first use, so a
    note that the note cache knows costs one stat() until it is needed."""

    path: str
    sha256: str
    facts: tuple[str | None, tuple[str, ...], str | None]  # (type, traits, status)
    root: Path | None = None
    _text: str | None = None
    _meta: dict | None = None
    # The file's stamp (notecache.file_stamp) taken before the scan read it: a job packs
    # the text the scan read only while the file still has it.
    stamp: tuple | None = field(default=None, compare=False)

    @classmethod
    def from_text(
        cls, path: str, sha256: str, text: str, meta: dict, root: Path | None = None
    ) -> Note:
        return cls(path, sha256, facts_of(meta), root, text, meta)

    @property
    def text(self) -> str:
        if self._text is None:
            assert self.root is not None
            data = read_file(self.root / self.path)
            if sha256_bytes(data) != self.sha256:
                # Judged by the hash the scan (or the note cache) gave it: this text is
                # another one, and judging it by that hash would be a guess.
                raise NoteParseError("changed while it was being read; run select again")
            self._text = decode(data)
        return self._text

    @property
    def meta(self) -> dict:
        if self._meta is None:
            self._meta = parse_note_text(self.text).meta
        return self._meta

    @property
    def body(self) -> str:
        return split_frontmatter(self.text)[1]

    @property
    def type_value(self) -> str | None:
        return self.facts[0]

    @property
    def traits(self) -> tuple[str, ...]:
        return self.facts[1]

    @property
    def status(self) -> str | None:
        return self.facts[2]

    def parsed(self) -> ParsedNote:
        return ParsedNote(self.meta, self.body)

    def regions(self) -> dict[str, str]:
        return self.parsed().regions()


def facts_of(meta: dict) -> tuple[str | None, tuple[str, ...], str | None]:
    t, s = meta.get("type"), meta.get("status")
    return (
        t if isinstance(t, str) else None,
        as_str_tuple(meta.get("traits")),
        s if isinstance(s, str) else None,
    )


def as_str_tuple(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    return ()


@dataclass
class KB:
    """A KB root and the note roots under it."""

    root: Path
    note_roots: tuple[str, ...] = (NOTES_DIR,)
    problems: list[FileProblem] = field(default_factory=list)
    max_note_bytes: int = MAX_NOTE_BYTES  # [limits] max_note_bytes
    exclude: tuple[str, ...] = ()  # [kb] exclude
    excluded: set[str] = field(default_factory=set)  # by exclude, at the last scan
    _exclude_res: list[re.Pattern[str]] | None = field(default=None, repr=False)

    @classmethod
    def open(
        cls,
        root: str | os.PathLike,
        note_roots: Iterable[str] = (NOTES_DIR,),
        max_note_bytes: int = MAX_NOTE_BYTES,
        exclude: Iterable[str] = (),
    ) -> KB:
        path = Path(root).resolve()
        if not path.is_dir():
            raise KBError(f"KB root {root} is not a folder")
        # "kb/notes/" and "./kb/notes" name the root "kb/notes" that paths are compared with.
        roots = (posixpath.normpath(r).strip("/") for r in note_roots)
        return cls(
            path, tuple("" if r == "." else r for r in roots), [], max_note_bytes, tuple(exclude)
        )

    def is_excluded(self, rel: str) -> bool:
        """Whether ``[kb] exclude`` leaves the note at ``rel`` (root-relative) out: a glob
        is matched against its path relative to each note root that holds it."""
        if not self.exclude:
            return False
        # Both composed (NFC): a KB synced from a Mac keeps names decomposed, a glob
        # typed in reviewq.toml is composed, and 'Übersicht/**' matched neither.
        if self._exclude_res is None:
            self._exclude_res = [glob_regex(unicodedata.normalize("NFC", g)) for g in self.exclude]
        for r in self.note_roots:
            if r and not rel.startswith(f"{r}/"):
                continue
            under = unicodedata.normalize("NFC", rel[len(r) + 1 :] if r else rel)
            if any(rx.fullmatch(under) for rx in self._exclude_res):
                return True
        return False

    def too_large(self, size: int) -> str | None:
        """Why a note of ``size`` bytes is not reviewed, or None. Said, not read: its text
        would be snapshotted, sent in its review's message and made a prompt no model
        takes whole."""
        if size <= self.max_note_bytes:
            return None
        return f"{size} bytes, over [limits] max_note_bytes ({self.max_note_bytes})"

    def note_too_large(self, rel: str) -> str | None:
        """:meth:`too_large` of the note at ``rel`` (root-relative) as it is on disk."""
        return self.too_large(os.stat(self.root / rel).st_size)

    def too_large_notes(self) -> list[FileProblem]:
        """The notes no sweep reviews for their size, for `status`: a cron sweep said so
        only in its log."""
        found = []
        for rel in self.note_files():
            try:
                why = self.too_large(os.stat(self.root / rel).st_size)
            except OSError:  # gone since the walk
                continue
            if why is not None:
                found.append(FileProblem(rel, why))
        return found

    # --- paths -------------------------------------------------------------------------
    def rel(self, path: str | os.PathLike) -> str:
        """A user-given path (absolute, or relative to the cwd, else to the root) made
        root-relative; a path that leads outside the root is refused."""
        p = Path(path)
        cand = _as_named(p if p.is_absolute() else Path.cwd() / p)
        if not p.is_absolute() and not _exists(cand):
            cand = _as_named(self.root / p)
        if (link := self._link_note(cand)) is not None:
            return link
        try:
            resolved = cand.resolve()
        except RuntimeError:  # Python 3.11-3.12's word for a symlink loop: an internal error
            raise KBError(f"{path}: a symlink loop, which names no file") from None
        if _loops(resolved):
            # Python 3.13 resolves a loop as far as it goes, without a word: the path was
            # then said to name no note at all, sending a person looking for a typo.
            raise KBError(f"{path}: a symlink loop, which names no file")
        try:
            rel = resolved.relative_to(self.root)
        except ValueError:
            raise KBError(f"{path}: outside the KB root {self.root}") from None
        return "" if str(rel) == "." else rel.as_posix()

    def _link_note(self, path: Path) -> str | None:
        """The root-relative name of ``path`` when it is a symlinked note the scan reviews
        under its own name (a file kept elsewhere in the root, :meth:`_elsewhere`): every
        link resolved, its pairs were looked up under the name of the file it leads to,
        which no pair has (``ack`` said "no completed review", ``--note`` "not under the
        note roots"). None for any other path: an alias of a note resolves to that note."""
        try:
            if path.name in ("", ".", "..") or not path.is_symlink():
                return None
        except OSError:  # a name the file system cannot hold (ENAMETOOLONG): no link
            return None
        try:
            rel = (path.parent.resolve() / path.name).relative_to(self.root).as_posix()
        except (ValueError, RuntimeError):  # outside the root, or a loop above the link
            return None
        if (
            rel.endswith(".md")
            and self._walked(rel)
            and self.inside(str(self.root / rel))
            and self._elsewhere(rel) is None
        ):
            return self._first_name(rel)
        return None

    def _first_name(self, rel: str) -> str:
        """The name the scan reviews the file a symlinked note ``rel`` leads to under: the
        first by name of the links to it (:meth:`_second_names` skips the others). Taken
        as named, a second link selected, and reviewed, the text again under a name of its
        own. Walked only for a path given as such a link."""
        links: set[str] = set()
        for start in self.note_roots:
            for _ in self.walk(self.root / start, [], notes=True, links=links):
                pass
        target = os.path.realpath(self.root / rel)
        same = [
            link
            for link in links
            if not self.is_excluded(link) and os.path.realpath(self.root / link) == target
        ]
        return min(same, default=rel)

    def note_selection(self, paths: Iterable[str | os.PathLike]) -> list[str]:
        """User-given note files or folders (``--note``), root-relative. One that is not
        there is refused: silently selecting nothing reads as "all fresh"."""
        rels = []
        for path in paths:
            rel = self.rel(path)
            target = self.root / rel
            try:
                there = target.exists()
            except OSError as exc:  # a name too long for the file system
                raise KBError(f"--note {path}: {exc.strerror or exc}") from None
            if not there:
                raise KBError(f"--note {path}: no such note file or folder in the KB")
            if not target.is_file() and not target.is_dir():
                raise KBError(f"--note {path}: not a note file or folder (a special file)")
            if target.is_file() and target.suffix != ".md":
                raise KBError(f"--note {path}: not a note (notes are .md files)")
            if target.is_file() and (problem := name_problem(rel)) is not None:
                shown = repr(str(path))[1:-1]
                raise KBError(f"--note {shown}: {problem}: it cannot name a pair")
            if not self.in_note_roots(rel) and not any(
                r.startswith(f"{rel}/") or not rel for r in self.note_roots
            ):
                roots = ", ".join(self.note_roots)
                raise KBError(f"--note {path}: not under the note roots ({roots})")
            rels.append(rel)
        return rels

    def in_note_roots(self, rel: str) -> bool:
        return any(not r or rel == r or rel.startswith(f"{r}/") for r in self.note_roots)

    def check_rel(self, rel: str) -> str:
        """Refuse a root-relative path that escapes the root: ``..``, absolute, or through
        a symlink whose target is outside (a note read into a prompt, a fix written)."""
        norm = posixpath.normpath(rel)
        if rel.startswith("/") or norm == ".." or norm.startswith("../") or "\x00" in rel:
            raise KBError(f"{rel}: outside the KB root")
        if not self.inside(os.path.join(self.root, norm)):
            raise KBError(f"{rel}: outside the KB root (through a symlink)")
        return norm

    def inside(self, path: str) -> bool:
        """Whether ``path``, every symlink resolved, is under the root."""
        return self._under_root(os.path.realpath(path))

    def _under_root(self, real: str) -> bool:
        """Whether ``real``, a path with every symlink resolved, is under the root."""
        root = str(self.root)
        return real == root or real.startswith(root + os.sep)

    def abspath(self, rel: str) -> Path:
        return self.root / self.check_rel(rel)

    def read_bytes(self, rel: str) -> bytes:
        """The bytes of the file at ``rel`` (root-relative), read only if the file opened
        is inside the root. A check of the path before the read is not enough: a folder
        on the way swapped for a link out of the KB meanwhile (a person moving it, or
        anything else) and the outside file's text became a snapshot sent to a model."""
        path = Path(self.root, rel)
        with open(self._open_inside(rel, lambda: _opened(path)), "rb") as f:
            return f.read()

    def open_folder(self, rel: str) -> int:
        """A descriptor of the folder at ``rel``, which is inside the root: a file written
        through it (``dir_fd``) lands there, whatever is put on its path after."""
        path = Path(self.root, rel)
        return self._open_inside(
            rel, lambda: os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        )

    def _open_inside(self, rel: str, opened: Callable[[], int]) -> int:
        """``opened()``'s descriptor of the file at ``rel`` once it is held to be a file of
        the root: the path, resolved after the open, is under the root and names that same
        file. A link swapped in before the open fails the first; one swapped back after,
        the second (:class:`OutsideRoot`). A path that names another file inside the root
        is most often a person's save (an editor renames a new file over the note) and
        is opened again: taken as a link, the note was left out of a sweep as "outside"."""
        for _ in range(_OPEN_TRIES):
            fd = opened()
            try:
                where = opened_at(fd)
                if where is not None:  # where the file is now: nothing swapped can fool it
                    inside = same = self._under_root(where)
                else:
                    real = os.path.realpath(Path(self.root, rel))
                    inside = self._under_root(real)
                    same = inside and _same_file(real, fd)
            except BaseException:
                os.close(fd)
                raise
            if same:
                return fd
            os.close(fd)
            if not inside:
                break
        raise OutsideRoot(f"{rel}: outside the KB root (through a symlink)")

    # --- notes -------------------------------------------------------------------------
    def note_files(self, under: Iterable[str] | None = None) -> list[str]:
        """Root-relative paths of every note under the note roots (or the given paths, of
        which only what lies under a note root: ``kb`` holds the gates too)."""
        found: set[str] = set()
        links: set[str] = set()  # the symlinks among them
        for start in under if under is not None else self.note_roots:
            base = self.root / start
            if base.is_file():
                if base.suffix == ".md":
                    found.add(self.check_rel(start))
                continue
            found.update(self.walk(base, self.problems, notes=True, links=links))
        if under is not None:
            found = {rel for rel in found if self.in_note_roots(rel)}
        links &= found
        if links and under is not None:
            # Which link is first is judged over all the note roots: judged within a
            # selection, a folder's sweep reviewed a file under a name the full one skips.
            for start in self.note_roots:
                for _ in self.walk(self.root / start, [], notes=True, links=links):
                    pass
        # Left out before any is read: an index or a template is neither reviewed nor
        # said to be broken. Counted, not named (status and the sweep say how many). An
        # excluded link names its file for no one: taken as the first name, the file
        # went unreviewed under the link after it too.
        self.excluded = {rel for rel in found if self.is_excluded(rel)}
        second = self._second_names({rel for rel in links if not self.is_excluded(rel)})
        for rel in sorted(second.keys() & found):
            self.problems.append(FileProblem(rel, second[rel]))
        return sorted(found - second.keys() - self.excluded)

    def _second_names(self, links: set[str]) -> dict[str, str]:
        """Links among the notes that name a file another link names already, with why
        they are skipped: the first by name is its note (each was reviewed, and fixed,
        as a note of its own)."""
        by_target: dict[str, list[str]] = {}
        for rel in links:
            by_target.setdefault(os.path.realpath(os.path.join(self.root, rel)), []).append(rel)
        second: dict[str, str] = {}
        for target, rels in by_target.items():
            first, *others = sorted(rels)
            shown = os.path.relpath(target, self.root).replace(os.sep, "/")
            for rel in others:
                second[rel] = f"a symlink to {shown}, which {first} names too; skipped"
        return second

    def _elsewhere(self, rel: str) -> str | None:
        """Why the symlink at ``rel`` is no note: it leads to a gate or a type spec (it
        would be reviewed and fixed as one), or to a note reviewed under its own name (an
        alias: each pair reviewed twice, at twice the cost, and fixed through two paths
        that each knew nothing of the other's escalations). A link to a file kept
        elsewhere in the root, outside the note roots, is a note, fixed in the file it
        names."""
        target = _under_root(os.path.join(self.root, rel), self.root)
        if target.startswith((f"{GATES_DIR}/", f"{TYPES_DIR}/")):
            return f"a symlink to {target}, a gate or type spec, not a note; skipped"
        if (
            target.endswith(".md")
            and self._walked(target)
            # ... one the scan reviews: else the link is its note
            and _utf8(target)
            and name_problem(target) is None
        ):
            # An excluded one is reviewed under no name: said so, not as an alias.
            if self.is_excluded(target):
                return f"a symlink to {target}, a note [kb] exclude leaves out; skipped"
            return f"a symlink to {target}, a note reviewed under its own name; skipped"
        return None

    def _walked(self, target: str) -> bool:
        """Whether the scan of the note roots enters ``target`` (root-relative, every link
        resolved) under its own name: in a note root, no part of it hidden."""
        parts = [] if target == "." else target.split("/")
        return self.in_note_roots(target) and not any(p.startswith(".") for p in parts)

    def walk(
        self,
        base: Path,
        problems: list[FileProblem],
        notes: bool = False,
        links: set[str] | None = None,
    ) -> Iterator[str]:
        """Root-relative paths of the ``.md`` files under ``base``. Hidden entries and
        symlinked folders are not entered; a file whose name is not UTF-8, or a symlink
        leading outside the root (for ``notes``, to a gate or type spec), is added to
        ``problems`` instead."""
        stack: list[str | Path] = [base]
        root_len = len(str(self.root)) + 1
        while stack:
            d = stack.pop()
            try:
                entries = list(os.scandir(d))
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:  # a folder this user may not read: its notes, not all
                rel = str(d)[root_len:].replace(os.sep, "/") or "."
                problems.append(
                    FileProblem(rel, f"folder cannot be read ({exc.strerror or exc}); skipped")
                )
                continue
            for e in entries:
                if e.name.startswith("."):
                    continue
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                    continue
                if not e.name.endswith(".md"):
                    if e.name.lower().endswith(".md") and not _is_dir(e):
                        rel = e.path[root_len:].replace(os.sep, "/")
                        problems.append(
                            FileProblem(
                                repr(rel)[1:-1],
                                "only names ending in .md (in small letters) are read; skipped",
                            )
                        )
                    elif (
                        notes
                        and e.is_symlink()
                        and _holds_notes(e.path)
                        # (a folder of the note roots: its notes are reviewed there)
                        and not self._walked(_under_root(e.path, self.root))
                    ):
                        # Not entered, as CONTRACT §1 says; unsaid, its notes went missing
                        # from every selection without a word.
                        rel = e.path[root_len:].replace(os.sep, "/")
                        problems.append(
                            FileProblem(
                                repr(rel)[1:-1],
                                "a symlink to a folder holding notes, not entered: they are "
                                "not reviewed (link each note, or move the folder in); skipped",
                            )
                        )
                    continue
                rel = e.path[root_len:].replace(os.sep, "/")
                if not rel.isascii() and not _utf8(rel):
                    shown = os.fsencode(rel).decode("utf-8", "backslashreplace")
                    problems.append(FileProblem(shown, "file name is not UTF-8; skipped"))
                    continue
                if (problem := name_problem(rel)) is not None:
                    shown = repr(rel)[1:-1]  # one line, whatever the name holds
                    problems.append(FileProblem(shown, f"{problem}: no pair can name it; skipped"))
                    continue
                if e.is_symlink():
                    if not self.inside(e.path):
                        problems.append(
                            FileProblem(rel, "a symlink to outside the KB root; skipped")
                        )
                        continue
                    if not _is_file(e):
                        # What it named was moved or deleted, or a loop: taken for a link
                        # to a note, it was "a note reviewed under its own name", one nobody
                        # could find; a gate's went without a word, or (a loop) ended every
                        # command in an internal error.
                        # A folder is there to be found: "no file" sent people looking,
                        # and so is a FIFO, a socket or a device.
                        if _is_dir(e):
                            what = "to a folder, not a file"
                        elif (kind := _special(e, follow=True)) is not None:
                            what = f"to {kind}, not a regular file"
                        else:
                            what = "that leads to no file"
                        problems.append(FileProblem(rel, f"a symlink {what}; skipped"))
                        continue
                    why = self._elsewhere(rel) if notes else None
                    if why:
                        problems.append(FileProblem(rel, why))
                        continue
                    if links is not None:
                        links.add(rel)
                if e.is_file():
                    yield rel
                elif (kind := _special(e)) is not None:
                    # Never read (a FIFO would hold the read), but said: its pairs went
                    # missing from every selection without a word.
                    problems.append(FileProblem(rel, f"not a regular file ({kind}); skipped"))

    def read_note(self, rel: str) -> Note:
        data = self.read_bytes(rel)
        text = decode(data)
        parsed = parse_note_text(text)
        return Note.from_text(rel, sha256_bytes(data), text, parsed.meta, self.root)

    def load_notes(self, paths: Iterable[str], cache: NoteCache | None = None) -> list[Note]:
        """Notes that load; each one that does not is added to ``problems``. With a cache,
        a file whose size, mtime and inode are unchanged is not read at all."""
        notes: list[Note] = []
        base = str(self.root) + os.sep
        for rel in paths:
            try:
                st = os.stat(base + rel)
                if (why := self.too_large(st.st_size)) is not None:
                    self.problems.append(FileProblem(rel, f"{why}; not reviewed"))
                    continue
                hit = cache.get(rel, st) if cache is not None else None
                if hit is not None:
                    sha, facts, error = hit
                    if error is not None:
                        self.problems.append(FileProblem(rel, error))
                    else:
                        notes.append(Note(rel, sha, facts, self.root, stamp=file_stamp(st)))
                    continue
                try:
                    note = self.read_note(rel)
                    note.stamp = file_stamp(st)
                except NoteParseError as exc:
                    if cache is not None:
                        cache.put(rel, st, "", None, str(exc))
                    raise
                if cache is not None:
                    cache.put(rel, st, note.sha256, note.facts, None)
                notes.append(note)
            except NoteParseError as exc:
                self.problems.append(FileProblem(rel, str(exc)))
            except OSError as exc:
                self.problems.append(FileProblem(rel, exc.strerror or str(exc)))
        return notes


def read_file(path: Path) -> bytes:
    """A note's bytes; anything but a regular file is an OSError that says what it is: a
    FIFO held the read (`ack`, create-jobs) for good, waiting for a writer."""
    with open(_opened(path), "rb") as f:
        return f.read()


def _opened(path: Path) -> int:
    """A descriptor of the regular file at ``path``, or the OSError that says what it is."""
    try:
        fd = open_regular(path)
    except NotRegular as exc:
        raise _not_regular(path, exc.kind) from None
    if fd is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    return fd


def note_stat(path: Path) -> os.stat_result:
    """A note's stat, unread; what :func:`read_file` would refuse (nothing there, a
    folder, a FIFO) is the OSError it would raise."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, FOLDER if stat.S_ISDIR(st.st_mode) else SPECIAL)
    return st


def opened_at(fd: int) -> str | None:
    """The path of the file open at ``fd``, every link resolved, as Linux says it
    (``/proc/self/fd``; " (deleted)" after the path of one removed since); None where it
    does not (another system, no /proc). One system call: resolving the path it was opened
    at again costs one a folder on the way, ~5 times the read of a note."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _same_file(path: str, fd: int) -> bool:
    """Whether ``path`` names the file open at ``fd``; False for a path gone since (opened
    again, it says so)."""
    try:
        return os.path.samestat(os.stat(path), os.fstat(fd))
    except OSError:
        return False


def _not_regular(path: Path, kind: str) -> OSError:
    if kind == FOLDER:
        return IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    return OSError(errno.EINVAL, f"{kind} (a FIFO, socket or device)")


def name_problem(rel: str) -> str | None:
    """Why a file's path cannot name a pair on a sentinel line (CONTRACT §5), or None. Every
    bundle check refuses such a pair, so a note or gate named so is skipped at the scan:
    reviewed, it failed each attempt and escalated as the reviewer's failure."""
    if _UNCARRIED.search(rel):
        return "a control character, line break or backslash in the name"
    if PAIR_SEP in rel:
        return f"{PAIR_SEP.strip()!r} in the name"
    return None


def _is_file(entry: os.DirEntry) -> bool:
    """``entry.is_file()``, False for a symlink loop, for which it raises (ELOOP)."""
    try:
        return entry.is_file()
    except OSError:
        return False


def _special(entry: os.DirEntry, follow: bool = False) -> str | None:
    """What a FIFO, socket or device among the files is (with ``follow``, what a symlink
    leads to); None for anything else (a file gone since the scan, a loop)."""
    try:
        mode = entry.stat(follow_symlinks=follow).st_mode
    except OSError:
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else None


def _under_root(path: str, root: Path) -> str:
    """Where ``path`` leads, every link resolved, relative to ``root`` (``../…`` outside)."""
    return os.path.relpath(os.path.realpath(path), root).replace(os.sep, "/")


def _holds_notes(path: str) -> bool:
    """Whether the folder a symlink names holds a ``.md`` file at its top (a look, not a
    walk: this runs at every command); False for a link to no folder, or a loop."""
    try:
        with os.scandir(path) as entries:
            return any(e.name.endswith(".md") and not e.name.startswith(".") for e in entries)
    except OSError:
        return False


def _is_dir(entry: os.DirEntry) -> bool:
    """``entry.is_dir()``, False for a symlink loop, for which it raises (ELOOP)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _utf8(name: str) -> bool:
    """Whether a name from the file system is valid UTF-8 (not surrogate-escaped bytes)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def type_key(value: object, relative_to: str | None = None) -> str | None:
    """A ``type:`` value normalised to a root-relative spec path, existing or not."""
    if not isinstance(value, str) or not value.strip():
        return None
    v = value.strip()
    if v.startswith("./") or v.startswith("../"):
        base = posixpath.dirname(relative_to) if relative_to else ""
        key = posixpath.normpath(posixpath.join(base, v))
    elif "/" in v or v.endswith(".md"):
        key = posixpath.normpath(v)
    else:
        key = f"{TYPES_DIR}/{v}.md"
    if key.startswith("../") or key.startswith("/") or key == "..":
        return None
    return key
