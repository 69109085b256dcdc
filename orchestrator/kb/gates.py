"""The gate catalog (CONTRACT §1): loading, validation, bundles and the virtual ``type`` lens.

An invalid gate is reported with its file and reason and never reviewed; the others
work. Real catalogs carry extra fields and headings, which are accepted as they are.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from orchestrator.kb.notes import (
    GATES_DIR,
    KB,
    REGIONS,
    TYPES_DIR,
    FileProblem,
    KBError,
    Note,
    NoteParseError,
    as_str_tuple,
    atx_headings,
    decode,
    parse_note_text,
    sha256_bytes,
    type_key,
)

TYPE_LENS = "type"
_GATE_ID = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]*)/([A-Za-z0-9][A-Za-z0-9_.-]*)")
_NOT_ONE_LINE = re.compile("[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]")  # what ends or garbles a line
_REWRITE = re.compile(r"rewrite\(\s*([0-9]*\.?[0-9]+)\s*\)")
_REQUIRED_HEADINGS = ("failure mode", "test")
_SKIP_FILES = {"readme.md"}


class SelectionError(ValueError):
    """A selector (bundle, gate id, type request) that names nothing in the catalog."""


@dataclass(frozen=True, slots=True)
class Gate:
    gate_id: str
    path: str
    lens: str
    name: str
    watches: tuple[str, ...]
    staleness: str  # "changed" or "rewrite"
    threshold: float | None
    text: str
    sha256: str
    body: str
    requires_type: tuple[str, ...] = ()  # normalised type keys (spec paths)
    requires_trait: tuple[str, ...] = ()
    audit: bool = False

    @property
    def is_type(self) -> bool:
        return self.lens == TYPE_LENS

    @property
    def staleness_text(self) -> str:
        return "changed" if self.threshold is None else f"rewrite({self.threshold:g})"


@dataclass
class Catalog:
    gates: dict[str, Gate] = field(default_factory=dict)  # catalog gates by gate_id
    types: dict[str, Gate] = field(default_factory=dict)  # type specs by name, as gates
    problems: list[FileProblem] = field(default_factory=list)

    @property
    def lenses(self) -> list[str]:
        return sorted({g.lens for g in self.gates.values()})

    def by_path(self) -> dict[str, Gate]:
        out = {g.path: g for g in self.gates.values()}
        out.update({g.path: g for g in self.types.values()})
        return out

    def copy(self) -> Catalog:
        """A copy whose dicts and list a caller may change (``create_jobs`` adds the type
        specs notes name relative to themselves); the gates themselves are frozen."""
        return Catalog(dict(self.gates), dict(self.types), list(self.problems))

    def to_json(self) -> dict:
        """``gates --json`` (CONTRACT §10): the gates and type specs by id, the invalid files."""
        return {
            "gates": [
                {
                    "gate_id": g.gate_id,
                    "path": g.path,
                    "lens": g.lens,
                    "name": g.name,
                    "watches": list(g.watches),
                    "staleness": g.staleness_text,
                    "requires_type": list(g.requires_type),
                    "requires_trait": list(g.requires_trait),
                    "audit": g.audit,
                }
                for g in sorted(self.gates.values(), key=lambda g: g.gate_id)
            ],
            "types": [
                {"gate_id": g.gate_id, "path": g.path}
                for g in sorted(self.types.values(), key=lambda g: g.gate_id)
            ],
            "invalid": [{"path": p.path, "reason": p.reason} for p in self.problems],
        }

    def get(self, gate_id: str) -> Gate | None:
        if gate_id.startswith(TYPE_LENS + "/"):
            return self.types.get(gate_id[len(TYPE_LENS) + 1 :])
        return self.gates.get(gate_id)

    def recorded(self, kb: KB, gate_id: str, gate_path: str | None) -> Gate | None:
        """The gate of a recorded pair as it is now: the catalog's, else, for a type
        pair, the type spec at the path the pair recorded. A spec that notes name relative
        to themselves (``./types/x.md``) is outside the scan of ``kb/types/``: select and
        create-jobs add it from the notes, and what reads its reviews back by gate id
        (ack, warn-queue, export, fixes, decide) finds it here. It joins this copy of the
        catalog; None when neither is there (the spec gone, renamed, outside the root).

        Two folders may each hold a spec of one name (``a/types/recipe.md`` and
        ``b/types/recipe.md``: both ``type/recipe``), each reviewed when a selection named
        only its notes. The one a note-relative lookup added answers for its own path
        only: answering for the other's, it lent its text and sha256 to reviews of the
        other spec (warn-queue dropped their WARNs as gate-changed, a rejected pair read
        as changed and was released, export wrote the wrong watched regions). The scan's
        ``kb/types/NAME.md`` is what ``type/NAME`` means, as select says."""
        gate = self.get(gate_id)
        if not gate_id.startswith(TYPE_LENS + "/") or not gate_path:
            return gate
        if gate is not None and (
            gate.path == gate_path or gate.path.rsplit("/", 1)[0] == TYPES_DIR
        ):
            return gate
        name = gate_id[len(TYPE_LENS) + 1 :]
        try:
            rel = kb.check_rel(gate_path)  # resolves symlinks: one out of the root is none
            if gate is not None and gate.path == rel:
                return gate
            if rel.rsplit("/", 1)[-1] != f"{name}.md":
                return None
            found = type_gate(rel, kb.read_bytes(rel))
        except (KBError, OSError, NoteParseError):
            return None
        self.types.setdefault(name, found)
        return found

    def resolve(self, selectors: Sequence[str], all_gates: bool = False) -> list[Gate]:
        """The gates that bundle names, gate ids, ``type`` and ``type/NAME`` select."""
        chosen: dict[str, Gate] = {}
        if all_gates and not self.gates and not self._gate_files_found():
            # A gate folder missing or misnamed (review_gates, a --root one level off) read
            # as "0 pairs", which looks like "all fresh": a nightly all-gates sweep reviewed
            # nothing, and said so with exit 0, every night.
            # (Not "--all-gates: ...": an enqueue or sweep with no selector asks the same.)
            raise SelectionError(
                f"every gate was asked for, and {GATES_DIR} holds none "
                "(is --root the folder that holds kb/?)"
            )
        if all_gates:
            chosen.update(self.gates)
        for sel in selectors:
            sel = sel.strip().strip("/")
            if sel == TYPE_LENS:
                chosen.update({g.gate_id: g for g in self.types.values()})
            elif sel.startswith(TYPE_LENS + "/"):
                g = self.types.get(sel[len(TYPE_LENS) + 1 :])
                if g is None:
                    raise SelectionError(f"{sel}: no type spec {TYPES_DIR}/{sel[5:]}.md")
                chosen[g.gate_id] = g
            elif sel in self.gates:
                chosen[sel] = self.gates[sel]
            elif "/" not in sel and any(g.lens == sel for g in self.gates.values()):
                chosen.update({g.gate_id: g for g in self.gates.values() if g.lens == sel})
            else:
                invalid = [p for p in self.problems if names_invalid(sel, p.path)]
                why = f" (invalid: {invalid[0].reason})" if invalid else ""
                raise SelectionError(f"{sel}: not a bundle, gate id or type request{why}")
        return sorted(chosen.values(), key=lambda g: g.gate_id)

    def _gate_files_found(self) -> bool:
        """Whether any file of the gate tree was met, if only as an invalid gate (each one
        already a warning line of its own)."""
        return any(p.path.startswith(f"{GATES_DIR}/") for p in self.problems)


def names_invalid(sel: str, path: str) -> bool:
    """Whether a selector names the invalid file at ``path``: its lens folder, its
    ``lens/name`` or the path itself. A part of a path is no name: a typo (``pros``) or
    a word (``kb``) was told of the first invalid gate whose path held it, as its reason."""
    return path in (sel, f"{GATES_DIR}/{sel}.md") or path.startswith(f"{GATES_DIR}/{sel}/")


def applies(gate: Gate, note: Note) -> bool:
    """Whether a gate is asked of a note: type gates by the note's type, others by
    ``requires_type`` (any of) and ``requires_trait`` (any of)."""
    if gate.is_type:
        return type_key(note.type_value, note.path) == gate.path
    if gate.requires_type and type_key(note.type_value, note.path) not in gate.requires_type:
        return False
    return not gate.requires_trait or bool(set(gate.requires_trait) & set(note.traits))


def not_asked(gate: Gate, note: Note) -> str | None:
    """Why a gate is not asked of a note, as :func:`applies` judges it; None when it is."""
    if applies(gate, note):
        return None
    key = type_key(note.type_value, note.path)
    has = f"the note's type is {key}" if key else "the note has no type"
    if gate.is_type:
        why = f"{has} (this gate is the spec {gate.path})"
    elif gate.requires_type and key not in gate.requires_type:
        why = f"the gate asks for type {' or '.join(gate.requires_type)}; {has}"
    else:
        has = f"the note's are {', '.join(note.traits)}" if note.traits else "the note has none"
        why = f"the gate asks for trait {' or '.join(gate.requires_trait)}; {has}"
    return f"{gate.gate_id} does not apply to {note.path}: {why}"


def _headings(body: str) -> set[str]:
    """The level-2 headings of a gate's body, lowercased: as CommonMark reads them, so an
    indented '## Test' or one closed by '##' counts, and one quoted in a code block does not
    (the gate had no test of its own)."""
    return {text.lower() for level, text in atx_headings(body) if level == 2}


def _parse_staleness(value: object) -> tuple[str, float | None]:
    if value is None or value == "changed":
        return "changed", None
    if isinstance(value, str):
        m = _REWRITE.fullmatch(value.strip())
        if m:
            t = float(m.group(1))
            if 0 < t <= 1:
                return "rewrite", t
            raise ValueError(f"staleness {value!r}: the threshold must be in (0, 1]")
    raise ValueError(f"staleness {value!r}: expected 'changed' or 'rewrite(T)'")


def _type_list(meta: dict, field_name: str) -> tuple[str, ...]:
    """The values of ``field_name`` in a gate's frontmatter; () when the key is absent."""
    if field_name not in meta:
        return ()
    value = meta[field_name]
    if value is None:
        # The key with its value deleted (`requires_trait:`) read as absent: the gate,
        # meant for some notes, was asked of every note, silently, and paid for.
        raise ValueError(f"{field_name} names an empty value (leave it out to ask every note)")
    if isinstance(value, str) or (
        isinstance(value, list) and all(isinstance(v, str) for v in value)
    ):
        values = as_str_tuple(value)
        if not values or not all(v.strip() for v in values):
            # An empty type or trait is no note's: the gate was asked of no note, silently,
            # where an empty list was already refused.
            raise ValueError(f"{field_name} names an empty value (leave it out to ask every note)")
        return values
    raise ValueError(f"{field_name} must be a string or a list of strings")


def parse_gate(rel: str, data: bytes) -> Gate:
    """One gate file; raises ValueError naming the first problem found."""
    parts = rel[len(GATES_DIR) + 1 :].split("/")
    if len(parts) != 2:
        raise ValueError(f"a gate sits directly in a lens folder ({GATES_DIR}/LENS/NAME.md)")
    folder = parts[0]
    text = decode(data)
    parsed = parse_note_text(text)
    meta = parsed.meta
    gate_id = meta.get("gate_id")
    if not isinstance(gate_id, str) or not gate_id:
        raise ValueError("missing gate_id")
    m = _GATE_ID.fullmatch(gate_id)
    if m is None:
        raise ValueError(f"gate_id {gate_id!r} is not of the form LENS/NAME")
    if m.group(1) != folder:
        raise ValueError(f"gate_id {gate_id!r}: its lens part must be the folder {folder!r}")
    name = meta.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError("missing name")
    if _NOT_ONE_LINE.search(name.strip()):
        raise ValueError("name must be one line of text (it heads the gate in every prompt)")
    lens = meta.get("lens")
    if lens != folder:
        raise ValueError(f"lens {lens!r} must equal the lens folder {folder!r}")
    if lens == TYPE_LENS:
        raise ValueError(f"'{TYPE_LENS}' is the virtual type-conformance lens")
    watches = meta.get("watches")
    if not isinstance(watches, list) or not watches:
        raise ValueError("watches must be a non-empty list")
    bad = [w for w in watches if w not in REGIONS]
    if bad:
        raise ValueError(f"watches {bad}: regions are {', '.join(REGIONS)}")
    staleness, threshold = _parse_staleness(meta.get("staleness"))
    if threshold is not None and "body" not in watches:
        raise ValueError("staleness rewrite(T) applies to the body, which this gate does not watch")
    requires_type = tuple(type_key(t) or t for t in _type_list(meta, "requires_type"))
    requires_trait = _type_list(meta, "requires_trait")
    missing = [h for h in _REQUIRED_HEADINGS if h not in _headings(parsed.body)]
    if missing:
        raise ValueError("body lacks " + " and ".join(f"'## {h.capitalize()}'" for h in missing))
    audit = meta.get("audit", False)
    if not isinstance(audit, bool):
        raise ValueError("audit must be true or false")
    return Gate(
        gate_id=gate_id,
        path=rel,
        lens=lens,
        name=name.strip(),
        watches=tuple(dict.fromkeys(watches)),
        staleness=staleness,
        threshold=threshold,
        text=text,
        sha256=sha256_bytes(data),
        body=parsed.body,
        requires_type=requires_type,
        requires_trait=requires_trait,
        audit=audit,
    )


def type_gate(rel: str, data: bytes) -> Gate:
    """A type spec as the gate of its type-conformance pairs: it watches the whole note."""
    text = decode(data)
    name = rel.rsplit("/", 1)[-1][:-3]
    return Gate(
        gate_id=f"{TYPE_LENS}/{name}",
        path=rel,
        lens=TYPE_LENS,
        name=f"Conformance to type {name}",
        watches=REGIONS,
        staleness="changed",
        threshold=None,
        text=text,
        sha256=sha256_bytes(data),
        body=text,
    )


def _md_files(kb: KB, rel_dir: str, problems: list[FileProblem]) -> list[str]:
    met: list[FileProblem] = []
    found = sorted(rel for rel in kb.walk(kb.root / rel_dir, met) if not _skipped(rel))
    # A README.MD is no more a gate than a README.md: not an invalid one (its name in
    # capitals is a warning among the notes), which failed `gates --check`.
    problems.extend(p for p in met if not _skipped(p.path))
    return found


def _skipped(rel: str) -> bool:
    return rel.rsplit("/", 1)[-1].lower() in _SKIP_FILES


def load_catalog(kb: KB, extra_type_paths: Iterable[str] = ()) -> Catalog:
    """Every gate under the gate tree and every type spec; invalid ones go to ``problems``."""
    cat = Catalog()
    seen: dict[str, list[Gate]] = {}
    for rel in _md_files(kb, GATES_DIR, cat.problems):
        try:
            gate = parse_gate(rel, kb.read_bytes(rel))
        except (ValueError, NoteParseError, OSError) as exc:
            cat.problems.append(FileProblem(rel, str(exc)))
            continue
        seen.setdefault(gate.gate_id, []).append(gate)
    for gate_id, gates in seen.items():
        if len(gates) == 1:
            cat.gates[gate_id] = gates[0]
            continue
        # Reviews are keyed by gate_id, so neither copy can be trusted with them.
        paths = ", ".join(g.path for g in gates)
        for g in gates:
            cat.problems.append(FileProblem(g.path, f"duplicate gate_id {gate_id!r} ({paths})"))
    type_paths = [p for p in _md_files(kb, TYPES_DIR, cat.problems) if p.count("/") == 2]
    for rel in [*type_paths, *extra_type_paths]:
        name = rel.rsplit("/", 1)[-1][:-3]
        if name in cat.types:
            continue
        try:
            cat.types[name] = type_gate(rel, kb.read_bytes(rel))
        except (NoteParseError, OSError) as exc:
            cat.problems.append(FileProblem(rel, str(exc)))
    return cat


def requires_type_warnings(kb: KB, catalog: Catalog) -> list[FileProblem]:
    """Each ``requires_type`` value of a valid gate that names no type spec, as a problem
    of its gate: a typo (``definiton``) asked the gate of no note, without a word. Said,
    not made invalid: the gate itself is sound, and notes typed with the same value still
    match it. Looked at on each call: a spec may sit outside the folders the catalog
    cache watches (beside its notes)."""
    specs = {g.path for g in catalog.types.values()}
    out = []
    for gate in sorted(catalog.gates.values(), key=lambda g: g.path):
        given = _type_list(parse_note_text(gate.text).meta, "requires_type")
        for value, key in zip(given, gate.requires_type, strict=True):
            if key not in specs and not _is_kb_file(kb, key):
                out.append(
                    FileProblem(
                        gate.path,
                        f"requires_type {value!r} names no type spec (no file {key}): "
                        "no note of an existing type matches it",
                    )
                )
    return out


def lens_folder_warnings(kb: KB, catalog: Catalog) -> list[FileProblem]:
    """Each lens folder that holds no gate file, valid or not: its gates saved as
    ``.markdown`` or ``.txt``, or none written yet. Its name selected nothing ("not a
    bundle") and `gates --check` passed, without a word of the folder. Looked at on each
    call: the catalog cache watches files, and an empty folder holds none."""
    try:
        with os.scandir(kb.root / GATES_DIR) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:
        return []
    folders = [e.name for e in entries if _plain_folder(e)]
    # A lens folder linked in (a catalog shared by two KBs) is not entered, as no
    # symlinked folder is: its gates went missing without a word.
    out = [
        FileProblem(
            f"{GATES_DIR}/{e.name}",
            "a symlink to a folder holding gates, not entered: they are not loaded (link "
            "each gate file, or move the folder in)",
        )
        for e in entries
        if not e.name.startswith(".") and e.is_symlink() and _holds_md(e.path)
    ]
    held = {g.lens for g in catalog.gates.values()}
    for p in catalog.problems:  # an invalid gate is a gate the folder holds, said already
        folder, _, rest = p.path.removeprefix(f"{GATES_DIR}/").partition("/")
        if p.path.startswith(f"{GATES_DIR}/") and rest:
            held.add(folder)
    return out + [
        FileProblem(
            f"{GATES_DIR}/{name}",
            "a lens folder with no gate in it (a gate is a .md file, LENS/NAME.md): "
            "selecting it selects nothing",
        )
        for name in folders
        if name not in held
    ]


def _holds_md(path: str) -> bool:
    """Whether the folder a symlink names holds a ``.md`` file at its top; False for a
    link to no folder, or a loop."""
    try:
        with os.scandir(path) as it:
            return any(e.name.endswith(".md") and not e.name.startswith(".") for e in it)
    except OSError:
        return False


def _plain_folder(entry: os.DirEntry) -> bool:
    """A folder the gate walk enters: not hidden, not a symlink."""
    try:
        return not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def gate_warnings(kb: KB, catalog: Catalog) -> list[FileProblem]:
    """What is said of a catalog beside its invalid gates (`gates`, `doctor`)."""
    return [*lens_folder_warnings(kb, catalog), *requires_type_warnings(kb, catalog)]


def _is_kb_file(kb: KB, rel: str) -> bool:
    """Whether ``rel`` is a file inside the KB root (a path leading out of it is none)."""
    try:
        return kb.abspath(rel).is_file()
    except KBError:
        return False


class CatalogCache:
    """:func:`load_catalog`, parsed again only when a gate or type spec file changed, came
    or went: an unchanged catalog costs a walk of its two folders and one ``stat()`` per
    file, where a load reads and parses every file (the control process asks for the
    catalog after every completed job). A file is known by (size, mtime, ctime, inode);
    one changed less than :attr:`RACY_NS` ago is not trusted to that stamp (an edit within
    the same clock tick can keep size and mtime), and the catalog is loaded again at every
    call until it is older. Each call returns a copy a caller may change."""

    RACY_NS = 2_000_000_000

    def __init__(self) -> None:
        self._stamp: tuple | None = None
        self._catalog: Catalog | None = None
        self._within: object = None  # the caller's key the last look was taken under

    def load(self, kb: KB, within: object = None) -> Catalog:
        """``within``: a key (not None) under which the files are looked at once: a
        second call with the same key as the last takes the catalog that call had."""
        if within is None or within != self._within or self._catalog is None:
            stamp = catalog_stamp(kb, self.RACY_NS)
            if self._catalog is None or stamp is None or stamp != self._stamp:
                # Stamped before the load: a file changed in between is loaded again next time.
                self._catalog = load_catalog(kb)
                self._stamp = stamp
            self._within = within
        return self._catalog.copy()


def catalog_stamp(kb: KB, racy_ns: int) -> tuple | None:
    """What :func:`load_catalog` reads, as (path, size, mtime, ctime, inode) per file and
    the problems met on the way; None when a file changed within ``racy_ns`` of now or
    could not be looked at (then only a load can tell)."""
    problems: list[FileProblem] = []
    rels = [*_md_files(kb, GATES_DIR, problems), *_md_files(kb, TYPES_DIR, problems)]
    recent = time.time_ns() - racy_ns
    files = []
    for rel in rels:
        try:
            st = os.stat(kb.root / rel)
        except OSError:
            return None
        if st.st_mtime_ns >= recent or st.st_ctime_ns >= recent:
            return None
        files.append((rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return (tuple(files), tuple(problems))
