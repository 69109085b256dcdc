"""The knowledge base on disk: its root, note discovery, notes and their regions (SPEC §1).

Paths are always relative to the KB root with ``/`` separators. A note that cannot be
read (not UTF-8, broken YAML) is reported as a :class:`FileProblem` and left out; the rest
of the KB still loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .frontmatter_fast import parse_simple
from .notecache import NoteCache

REGIONS = ("title", "description", "frontmatter", "body")
NOTES_DIR = "kb/notes"
GATES_DIR = "kb/instructions/review-gates"
TYPES_DIR = "kb/types"

try:  # libyaml is ~10x faster; the pure-Python loader gives the same values
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader


class KBError(Exception):
    """A problem with the KB as a whole (a missing root, a path outside it)."""


@dataclass(frozen=True, slots=True)
class FileProblem:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


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
    if not (text.startswith("---\n") or text.startswith("---\r\n") or text.rstrip("\r\n") == "---"):
        return None, text
    first_nl = text.find("\n")
    pos = first_nl + 1
    while pos <= len(text):
        nl = text.find("\n", pos)
        line = text[pos:] if nl == -1 else text[pos:nl]
        if line.rstrip("\r") in ("---", "..."):
            block = text[first_nl + 1 : pos]
            body = "" if nl == -1 else text[nl + 1 :]
            return block, body
        if nl == -1:
            break
        pos = nl + 1
    raise NoteParseError("frontmatter block is not closed with '---'")


def parse_frontmatter(block: str | None) -> dict:
    """The frontmatter mapping; raises NoteParseError for YAML that is broken or not a mapping."""
    if block is None:
        return {}
    simple = parse_simple(block)
    if simple is not None:
        return simple
    try:
        data = yaml.load(block, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (frontmatter line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise NoteParseError(f"broken YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise NoteParseError("frontmatter is not a mapping")
    return data


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str, separators=(",", ":"))


def _first_heading(body: str) -> str:
    for line in body.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return ""


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

    @classmethod
    def from_text(
        cls, path: str, sha256: str, text: str, meta: dict, root: Path | None = None
    ) -> Note:
        return cls(path, sha256, facts_of(meta), root, text, meta)

    @property
    def text(self) -> str:
        if self._text is None:
            assert self.root is not None
            self._text = decode((self.root / self.path).read_bytes())
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

    @classmethod
    def open(cls, root: str | os.PathLike, note_roots: Iterable[str] = (NOTES_DIR,)) -> KB:
        path = Path(root).resolve()
        if not path.is_dir():
            raise KBError(f"KB root {root} is not a folder")
        return cls(path, tuple(note_roots))

    # --- paths -------------------------------------------------------------------------
    def rel(self, path: str | os.PathLike) -> str:
        """A user-given path (absolute, or relative to the cwd, else to the root) made
        root-relative; a path that leads outside the root is refused."""
        p = Path(path)
        cand = p if p.is_absolute() else Path.cwd() / p
        if not p.is_absolute() and not cand.exists():
            cand = self.root / p
        resolved = cand.resolve()
        try:
            rel = resolved.relative_to(self.root)
        except ValueError:
            raise KBError(f"{path}: outside the KB root {self.root}") from None
        return "" if str(rel) == "." else rel.as_posix()

    def check_rel(self, rel: str) -> str:
        """Refuse a root-relative path that escapes the root (``..``, absolute)."""
        norm = posixpath.normpath(rel)
        if rel.startswith("/") or norm == ".." or norm.startswith("../") or "\x00" in rel:
            raise KBError(f"{rel}: outside the KB root")
        return norm

    def abspath(self, rel: str) -> Path:
        return self.root / self.check_rel(rel)

    # --- notes -------------------------------------------------------------------------
    def note_files(self, under: Iterable[str] | None = None) -> list[str]:
        """Root-relative paths of every note under the note roots (or the given paths)."""
        found: set[str] = set()
        for start in under if under is not None else self.note_roots:
            base = self.root / start
            if base.is_file():
                if base.suffix == ".md":
                    found.add(self.check_rel(start))
                continue
            found.update(self._walk(base))
        return sorted(found)

    def _walk(self, base: Path) -> Iterator[str]:
        stack: list[str | Path] = [base]
        root_len = len(str(self.root)) + 1
        while stack:
            d = stack.pop()
            try:
                entries = list(os.scandir(d))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for e in entries:
                if e.name.startswith("."):
                    continue
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.name.endswith(".md") and e.is_file():
                    yield e.path[root_len:].replace(os.sep, "/")

    def read_note(self, rel: str) -> Note:
        with open(os.path.join(self.root, rel), "rb") as f:
            data = f.read()
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
                st = os.stat(base + rel) if cache is not None else None
                hit = cache.get(rel, st) if cache is not None else None
                if hit is not None:
                    sha, facts, error = hit
                    if error is not None:
                        self.problems.append(FileProblem(rel, error))
                    else:
                        notes.append(Note(rel, sha, facts, self.root))
                    continue
                try:
                    note = self.read_note(rel)
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

    # --- types -------------------------------------------------------------------------
    def type_spec_path(self, value: object, relative_to: str | None = None) -> str | None:
        """The type spec a ``type:`` value names (name, root path or note-relative path)."""
        key = type_key(value, relative_to)
        if key is None:
            return None
        return key if (self.root / key).is_file() else None


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
