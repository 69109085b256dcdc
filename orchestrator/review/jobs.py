"""Packing selected pairs into review jobs (CONTRACT §4): snapshots, prompt, job folder.

A pair already inside a queued or running job is not packed again, and a note or gate
holding a line that looks like a review sentinel is refused for that pair (the prompt
could not tell it from the real sentinels). Everything else proceeds.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator import logs
from orchestrator.config import GROUPINGS, Settings
from orchestrator.kb.gates import TYPE_LENS, Catalog, Gate, not_asked, parse_gate, type_gate
from orchestrator.kb.githead import head_commit
from orchestrator.kb.notecache import file_stamp
from orchestrator.kb.notes import (
    KB,
    KBError,
    Note,
    NoteParseError,
    decode,
    note_stat,
    parse_note_text,
    sha256_bytes,
    type_key,
)
from orchestrator.review.bundle import sentinel_like_lines
from orchestrator.review.prompts import PromptGate, PromptPair, render_review
from orchestrator.state.files import PromptRenderer, set_aside, write_job_files_after_commit
from orchestrator.state.store import Store, utcnow


class JobError(ValueError):
    """Jobs cannot be created from this input (bad JSON, no partition, bad grouping)."""


@dataclass(frozen=True, slots=True)
class JobPair:
    note_path: str
    gate_id: str
    gate_path: str


@dataclass
class CreatedJob:
    review_job_id: int
    model_partition: str
    grouping: str
    prompt_path: str
    bundle_output_path: str
    pairs: list[JobPair] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "review_job_id": self.review_job_id,
            "model_partition": self.model_partition,
            "grouping": self.grouping,
            "prompt_path": self.prompt_path,
            "bundle_output_path": self.bundle_output_path,
            "pairs": [
                {"note_path": p.note_path, "gate_id": p.gate_id, "gate_path": p.gate_path}
                for p in self.pairs
            ],
        }


@dataclass(frozen=True, slots=True)
class Skipped:
    note_path: str
    gate_id: str
    why: str
    # Why, in a few words, said where skipped pairs are counted ("skipped 5 (3 waiting
    # for an earlier bundle, ...)"): a bare count read a sequential sweep's held pairs as
    # pairs lost. Set where the pair is skipped, not read back out of ``why``.
    kind: str
    # A file that cannot be reviewed as it is (a sentinel line in the note, a gate gone):
    # a person must act, unlike a pair already queued or waiting for a decision.
    problem: bool = False


def skipped_count(skipped: Sequence[Skipped]) -> str:
    """``skipped N``, and why: ``skipped 5 (3 waiting for an earlier bundle, 2 ...)``."""
    kinds: dict[str, int] = {}
    for s in skipped:
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
    why = ", ".join(f"{n:,} {kind}" for kind, n in kinds.items())
    return f"skipped {len(skipped):,}" + (f" ({why})" if why else "")


QUEUED = "already queued or running"
TO_MEND = "files to mend"
NOT_ASKED = "gate not asked of the note"


def _held_why(store: Store, partition: str, key: tuple[str, str]) -> tuple[str, str]:
    """Why a held pair is skipped, and its kind: a person has yet to decide it, or
    rejected it (held until the note or gate changes; said as waiting, it read as an
    escalation no list showed)."""
    open_one = store.conn.execute(
        "SELECT 1 FROM escalations WHERE model_partition = ? AND note_path = ? AND gate_id = ? "
        "AND decision IS NULL",
        (partition, *key),
    ).fetchone()
    if open_one:
        return "escalated: waits for a human decision", "waiting for a person"
    return "rejected by a person: held until the note or the gate changes", "rejected by a person"


@dataclass
class JobBatch:
    jobs: list[CreatedJob] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "jobs": [j.to_json() for j in self.jobs],
            "skipped": [asdict(s) for s in self.skipped],
        }


def job_dir(state_dir: Path, job_id: int) -> Path:
    return state_dir / "jobs" / f"review-job-{job_id}"


def clear_job_folder(state_dir: Path, job_id: int) -> Path:
    """A new job's folder, made empty inside the transaction that creates the job (its
    files come after the commit). A folder left by a job id used before (a state.db put
    back from a backup or that lost its last commits, an older reviewq that wrote files
    inside a transaction that then rolled back) must not leak an old bundle-output.md
    into this job, nor be lost: it is set aside (:func:`set_aside`). No other process can
    be making this job id now."""
    folder = job_dir(state_dir, job_id)
    if folder.exists() or folder.is_symlink():
        set_aside(
            folder.parent,
            folder,
            folder.name,
            job_id,
            "a job folder state.db does not record (put back from a backup, or its last "
            "commits lost), found where a new job of this id goes",
        )
    return folder


def display_path(root: Path, path: Path) -> str:
    """Root-relative when under the root (CONTRACT §10), else absolute. As
    ``path.relative_to(root)`` says it, from the two paths' text: both are made of
    normalised parts, so being under the root is a prefix that ends at a separator.
    relative_to built both paths' parts and, for a state folder outside the root, raised
    and caught an error: ~5-14 us a call, 3-4 calls a job at enqueue and 2 at dispatch."""
    whole, under = str(path), str(root)
    if whole == under:
        return "."
    head = under if under.endswith(os.sep) else under + os.sep
    return whole[len(head) :] if whole.startswith(head) else whole


def reviewer_for(store: Store, settings: Settings, job_id: int) -> str:
    """The reviewer profile that runs a job: its own, else the one writing its partition."""
    row = store.conn.execute(
        "SELECT reviewer, model_partition FROM review_jobs WHERE id = ?", (job_id,)
    ).fetchone()
    if row is None:
        raise JobError(f"no review job {job_id}")
    if row["reviewer"]:
        return row["reviewer"]
    for name, profile in sorted(settings.reviewers.items()):
        if profile.partition == row["model_partition"]:
            return name
    raise JobError(
        f"no reviewer profile writes partition {row['model_partition']!r}: pass --reviewer"
    )


def parse_select_json(text: str) -> tuple[str | None, list[dict]]:
    """(model_partition, targets) from ``reviewq select --json`` output."""
    try:
        # A selection saved by an editor that writes a byte-order mark, as a bundle with
        # one is accepted.
        data = json.loads(text.removeprefix("\ufeff"))
    except json.JSONDecodeError as exc:
        raise JobError(f"input is not select JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(data, dict) or not isinstance(data.get("targets"), list):
        raise JobError("input is not select JSON: expected an object with a 'targets' list")
    targets = []
    for i, t in enumerate(data["targets"]):
        if not isinstance(t, dict) or not all(
            isinstance(t.get(k), str) for k in ("note_path", "gate_id")
        ):
            raise JobError(f"input target #{i + 1}: needs string note_path and gate_id")
        targets.append(t)
    partition = data.get("model_partition")
    if partition is not None and not isinstance(partition, str):
        # Said as it is: "is null" for a 5 sent the person looking for a missing key.
        raise JobError(f"input's model_partition {partition!r}: expected a partition name")
    return partition, targets


@dataclass
class _Item:
    note_path: str
    gate: Gate
    note_text: str
    note_sha: str
    # The commit HEAD was at when the note's text was taken (export's recorded-commit):
    # "" outside git, None unknown (a pair recorded before state.db kept it).
    note_commit: str | None = None


class _Loader:
    """Reads each note and gate once, with its refusal reason if it cannot be packed."""

    def __init__(
        self,
        kb: KB,
        catalog: Catalog,
        pending: Mapping[str, str],
        selected: Mapping[str, Note],
    ) -> None:
        self.kb, self.catalog, self.pending, self.selected = kb, catalog, pending, selected
        self.notes: dict[str, Note | str] = {}
        self.invalid = {p.path: p.reason for p in catalog.problems}
        self.gate_refusals: dict[str, str | None] = {}

    def note(self, given: str) -> Note | str:
        """The note at its normalised path, or why it cannot be packed."""
        if given not in self.notes:
            rel = given
            try:
                rel = self.kb.check_rel(self._under_root(given))  # resolves symlinks
                if not rel.endswith(".md") or not self.kb.in_note_roots(rel):
                    # A type spec, a gate or the targets file itself, reviewed as a note.
                    roots = ", ".join(self.kb.note_roots)
                    self.notes[given] = f"{rel}: not a note (a .md file under {roots})"
                    return self.notes[given]
                pending = self.pending[rel].encode("utf-8") if rel in self.pending else None
                # Judged before it is read: a 60 MB note made a 60 MB snapshot and message.
                # A note the selection read is judged too: one deleted, renamed or grown
                # past the limit since was packed, a review of a note no longer there.
                st = note_stat(self.kb.root / rel) if pending is None else None
                size = len(pending) if st is None else st.st_size
                if (why := self.kb.too_large(size)) is not None:
                    self.notes[given] = f"{rel}: {why}; not reviewed"
                    return self.notes[given]
                chosen = self.selected.get(rel) if st is not None else None
                if chosen is not None and chosen.stamp == file_stamp(st):
                    # The text the pair was selected for, the file unchanged since: read
                    # again, it cost a sweep a second pass over the KB. A note changed since
                    # is read as it is now: its selected text was gone, and reviewed, its
                    # verdict replaced that of the text after it (a fix's re-review).
                    note = chosen
                else:
                    data = pending if pending is not None else self.kb.read_bytes(rel)
                    text = decode(data)
                    # Its frontmatter says which gates it has (select judges it so too).
                    note = Note.from_text(rel, sha256_bytes(data), text, parse_note_text(text).meta)
                self.notes[given] = self._refused(note) or note
            except KBError as exc:
                self.notes[given] = str(exc)
            except NoteParseError as exc:
                self.notes[given] = f"{rel}: {exc}"
            except OSError as exc:
                self.notes[given] = f"{rel}: {exc.strerror or exc}"
        return self.notes[given]

    @staticmethod
    def _refused(note: Note) -> str | None:
        lines = sentinel_like_lines(note.text)
        return f"{note.path} line {lines[0]}: looks like a review sentinel" if lines else None

    def _under_root(self, given: str) -> str:
        """An absolute path into the KB root (a target edited by hand; ack takes one too)
        as the root-relative path it names; any other path as given, for check_rel to
        judge ("outside the KB root" was said of a note inside it)."""
        if not given.startswith("/"):
            return given
        try:
            return Path(os.path.normpath(given)).relative_to(self.kb.root).as_posix()
        except ValueError:
            return given

    def gate(self, gate_id: str, gate_path: str | None) -> Gate | str:
        # A type spec a note names relative to itself is not in the catalog's types/ scan.
        gate = self.catalog.recorded(self.kb, gate_id, gate_path)
        if gate is None:
            if gate_path and gate_path in self.invalid:
                return f"{gate_path}: invalid gate: {self.invalid[gate_path]}"
            return f"{gate_id}: no such gate"
        if gate.gate_id not in self.gate_refusals:
            lines = sentinel_like_lines(gate.text)
            self.gate_refusals[gate.gate_id] = (
                f"{gate.path} line {lines[0]}: looks like a review sentinel" if lines else None
            )
        return self.gate_refusals[gate.gate_id] or gate


def _groups(items: list[_Item], grouping: str, batch_size: int) -> list[list[_Item]]:
    buckets: dict[tuple[str, str], list[_Item]] = {}
    if grouping == "note":
        for it in items:
            buckets.setdefault((it.note_path, it.gate.lens), []).append(it)
        return [sorted(b, key=lambda i: i.gate.gate_id) for _, b in sorted(buckets.items())]
    for it in items:
        buckets.setdefault((it.gate.gate_id, ""), []).append(it)
    out = []
    for _, bucket in sorted(buckets.items()):
        bucket.sort(key=lambda i: i.note_path)
        out.extend(bucket[i : i + batch_size] for i in range(0, len(bucket), batch_size))
    return out


def create_jobs(
    kb: KB,
    catalog: Catalog,
    store: Store,
    state_dir: Path,
    targets: Iterable[dict],
    *,
    model_partition: str,
    grouping: str = "note",
    batch_size: int = 5,
    reviewer: str | None = None,
    sweep: str | None = None,
    sweep_run_id: int | None = None,
    exclude: Iterable[tuple[str, str]] = (),
    selected_at_version: int | None = None,
    pending: Mapping[str, str] | None = None,
    selected: Mapping[str, Note] | None = None,
) -> JobBatch:
    """Queued jobs for the targets; pairs that cannot be packed come back as ``skipped``.

    ``sweep_run_id`` is written with each job: a control process may dispatch a job, and
    read its run's options for the follow-ups, as soon as this commits.

    ``pending`` maps note paths to texts decided in the open transaction but written to
    the KB only after it commits (an applied fix): those are the texts packed.

    ``selected`` maps note paths to the notes the targets were selected from (a
    selection's ``notes``): their texts are packed, as select read and hashed them.

    ``selected_at_version`` is the store's acceptance version read before the targets
    were selected: a pair whose review was accepted since, for exactly the texts about
    to be packed, is skipped instead of reviewed twice."""
    if grouping not in GROUPINGS:
        raise JobError(f"grouping {grouping!r}: choose note or gate")
    if batch_size < 1:
        raise JobError("--batch-size must be at least 1")
    if not model_partition:
        raise JobError("no model partition: pass --model (the input's model_partition is null)")
    batch = JobBatch()
    # Where the KB's history stands as the notes' texts are taken for the prompts: what
    # each review judges is that snapshot, not the note when its verdict comes back (a
    # commit, a rebase meanwhile), so the commit is kept with it (CONTRACT §10). Read
    # once for the batch from git's own files, no git process: the control makes a
    # re-review's jobs as outcomes arrive. A fix's text, written and committed after
    # this commits, is given its commit then (cycles.fixes._rereviews_judge).
    commit = head_commit(kb.root)
    loader = _Loader(kb, catalog, pending or {}, selected or {})
    active = store.active_pairs(model_partition)
    held = set(exclude)
    seen: set[tuple[str, str]] = set()
    items: list[_Item] = []
    for t in targets:
        raw, gate_id = t["note_path"], t["gate_id"]
        note = loader.note(raw)
        if isinstance(note, str):
            batch.skipped.append(Skipped(raw, gate_id, note, TO_MEND, problem=True))
            continue
        # As check_rel spells it: "./kb/notes/a.md" and "kb/notes//a.md" are one pair, which
        # two items would make twice (a UNIQUE failure that created no job at all).
        key = (note.path, gate_id)
        if key in seen:
            continue
        seen.add(key)
        if key in active:
            job_id, status = active[key]
            batch.skipped.append(Skipped(raw, gate_id, f"already in {status} job {job_id}", QUEUED))
            continue
        if key in held:
            batch.skipped.append(Skipped(raw, gate_id, *_held_why(store, model_partition, key)))
            continue
        gate_path = t.get("gate_path")
        if not gate_path and gate_id.startswith(TYPE_LENS + "/"):
            # A hand-written target of a spec the note names by a path: the catalog's
            # kb/types/ scan has no such type/NAME (said as "no such gate").
            gate_path = type_key(note.type_value, note.path)
        gate = loader.gate(gate_id, gate_path)
        if isinstance(gate, str):
            batch.skipped.append(Skipped(raw, gate_id, gate, TO_MEND, problem=True))
            continue
        # A hand-written target (or a note edited since it was selected) may pair a note
        # with a gate its type or traits do not ask for: reviewed, its verdict was recorded
        # for a gate the note does not have.
        why = not_asked(gate, note)
        if why is not None:
            batch.skipped.append(Skipped(raw, gate_id, why, NOT_ASKED, problem=True))
            continue
        items.append(_Item(note.path, gate, note.text, note.sha256, commit))
    # Let go before the write reads them again: at twenty-fold, 270,000 open pairs are
    # ~120 MB, and two copies at once were the top of an enqueue's peak.
    del active, seen, held, loader

    snap_cache: dict[tuple[str, str], int] = {}
    made: dict[int, Sequence[_Item]] = {}
    with store.write():
        # Another enqueue or a finalize may have committed since the open jobs and the
        # acceptance were read; under the write lock nothing else can, so look again.
        items = _still_wanted(store, items, model_partition, selected_at_version, batch)
        for group in _groups(items, grouping, batch_size):
            job = _create_one(
                kb.root,
                store,
                state_dir,
                group,
                model_partition,
                grouping,
                reviewer,
                sweep,
                sweep_run_id,
                snap_cache,
            )
            batch.jobs.append(job)
            made[job.review_job_id] = group
        # The folders are written after the commit, outside the write lock (and again
        # at the control process's tick if that fails).
        write_job_files_after_commit(
            store, state_dir, list(made), prompt_renderer(store, state_dir, kb.root, made)
        )

    def logged() -> None:
        log = logs.get()
        for job in batch.jobs:
            log.info(
                "job.created",
                job_id=job.review_job_id,
                model_partition=job.model_partition,
                grouping=job.grouping,
                pairs=len(job.pairs),
                reviewer=reviewer,
                sweep=sweep,
            )

    # Logged once the caller's transaction commits (an enqueue's run and cron clock join
    # it): one rolled back had its jobs logged, and their ids made again by the next one.
    store.after_commit(logged)
    return batch


def _still_wanted(
    store: Store,
    items: list[_Item],
    partition: str,
    selected_at_version: int | None,
    batch: JobBatch,
) -> list[_Item]:
    if not items:
        return items  # nothing to look up: the open pairs are read for nothing
    active = store.active_pairs(partition)
    check_fresh = (
        selected_at_version is not None and store.acceptance_version() != selected_at_version
    )
    kept = []
    for item in items:
        key = (item.note_path, item.gate.gate_id)
        if key in active:
            job_id, status = active[key]
            batch.skipped.append(Skipped(*key, f"already in {status} job {job_id}", QUEUED))
        elif check_fresh and store.accepted_as_is(partition, *key, item.note_sha, item.gate.sha256):
            batch.skipped.append(
                Skipped(*key, "reviewed since it was selected: fresh", "reviewed meanwhile")
            )
        else:
            kept.append(item)
    return kept


def _create_one(
    root: Path,
    store: Store,
    state_dir: Path,
    group: Sequence[_Item],
    partition: str,
    grouping: str,
    reviewer: str | None,
    sweep: str | None,
    sweep_run_id: int | None,
    snap_cache: dict[tuple[str, str], int],
) -> CreatedJob:
    def snap(path: str, text: str, sha: str) -> int:
        key = (path, sha)
        if key not in snap_cache:
            snap_cache[key] = store.snapshot(path, text, sha)
        return snap_cache[key]

    now = utcnow()
    lens = group[0].gate.lens if len({i.gate.lens for i in group}) == 1 else None
    job_id = store.conn.execute(
        "INSERT INTO review_jobs (kind, status, model_partition, grouping, lens, reviewer, job_dir, "
        "sweep, sweep_run_id, created_at, updated_at) "
        "VALUES ('review', 'queued', ?, ?, ?, ?, '', ?, ?, ?, ?) RETURNING id",
        (partition, grouping, lens, reviewer, sweep, sweep_run_id, now, now),
    ).fetchone()[0]
    folder = job_dir(state_dir, job_id)
    store.conn.execute(
        "UPDATE review_jobs SET job_dir = ? WHERE id = ?", (display_path(state_dir, folder), job_id)
    )
    pairs: list[JobPair] = []
    for it in group:
        store.conn.execute(
            "INSERT INTO review_pairs (job_id, note_path, gate_id, gate_path, lens, note_snapshot_id, "
            "gate_snapshot_id, note_commit) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                job_id,
                it.note_path,
                it.gate.gate_id,
                it.gate.path,
                it.gate.lens,
                snap(it.note_path, it.note_text, it.note_sha),
                snap(it.gate.path, it.gate.text, it.gate.sha256),
                it.note_commit,
            ),
        )
        pairs.append(JobPair(it.note_path, it.gate.gate_id, it.gate.path))

    clear_job_folder(state_dir, job_id)
    output = folder / "bundle-output.md"
    return CreatedJob(
        job_id,
        partition,
        grouping,
        display_path(root, folder / "prompt.md"),
        display_path(root, output),
        pairs,
    )


def prompt_renderer(
    store: Store, state_dir: Path, root: Path, known: dict[int, Sequence[_Item]] | None = None
) -> PromptRenderer:
    """The job-level prompt.md of a review job, rendered from state.db (``known``: the
    items of jobs just made, so they are not read back)."""

    def render(job_id: int) -> str | None:
        job = store.conn.execute(
            "SELECT kind, job_dir FROM review_jobs WHERE id = ?", (job_id,)
        ).fetchone()
        if job is None or job["kind"] != "review":
            return None
        items = (known or {}).get(job_id) or load_job_items(store, job_id)
        output = display_path(root, state_dir / job["job_dir"] / "bundle-output.md")
        return render_job_prompt(job_id, output, items)

    return render


def render_job_prompt(
    job_id: int, output_path: str, group: Sequence[_Item], retry: str = ""
) -> str:
    notes: dict[str, str] = {}
    gates: dict[str, PromptGate] = {}
    for it in group:
        notes.setdefault(it.note_path, it.note_text)
        g = it.gate
        gates.setdefault(g.gate_id, PromptGate(g.gate_id, g.path, g.name, g.body, g.is_type))
    pairs = [PromptPair(it.note_path, it.gate.gate_id, it.gate.path) for it in group]
    return render_review(job_id, output_path, pairs, notes, list(gates.values()), retry)


def load_job_items(store: Store, job_id: int) -> list[_Item]:
    """A job's pairs rebuilt from the snapshots it was created from (for retry prompts)."""
    rows = store.conn.execute(
        "SELECT p.note_path, p.gate_id, p.gate_path, p.lens, n.text AS note_text, n.sha256 AS note_sha, "
        "g.text AS gate_text, p.note_commit FROM review_pairs p JOIN snapshots n ON n.id = p.note_snapshot_id "
        "JOIN snapshots g ON g.id = p.gate_snapshot_id WHERE p.job_id = ? ORDER BY p.id",
        (job_id,),
    ).fetchall()
    return [
        _Item(
            r["note_path"],
            _snapshot_gate(r["lens"] == TYPE_LENS, r["gate_path"], r["gate_text"]),
            r["note_text"],
            r["note_sha"],
            r["note_commit"],  # a split job's parts judge the texts it was made of
        )
        for r in rows
    ]


@functools.lru_cache(maxsize=256)
def _snapshot_gate(is_type: bool, gate_path: str, gate_text: str) -> Gate:
    """A gate as its snapshot was (Gate is frozen): every job of a sweep shares a handful of
    gate texts, and the control process renders a prompt per attempt."""
    data = gate_text.encode("utf-8")
    return type_gate(gate_path, data) if is_type else parse_gate(gate_path, data)


def split_job(store: Store, state_dir: Path, root: Path, job_id: int) -> list[int]:
    """Replace a multi-pair job by one-pair jobs built from the same snapshots (a job
    that burned out may fit when it asks less)."""
    job = store.conn.execute("SELECT * FROM review_jobs WHERE id = ?", (job_id,)).fetchone()
    items = load_job_items(store, job_id)
    new_ids: list[int] = []
    cache: dict[tuple[str, str], int] = {}
    made: dict[int, Sequence[_Item]] = {}
    with store.write():
        store.conn.execute(
            "UPDATE review_jobs SET status = 'split', updated_at = ?, finished_at = ? WHERE id = ?",
            (utcnow(), utcnow(), job_id),
        )
        for it in items:
            created = _create_one(
                root,
                store,
                state_dir,
                [it],
                job["model_partition"],
                job["grouping"],
                job["reviewer"],
                job["sweep"],
                job["sweep_run_id"],
                cache,
            )
            store.conn.execute(
                # The fix a re-review follows goes with its parts: a person's redo asks
                # reach the next fix through it.
                "UPDATE review_jobs SET parent_job_id = ?, source_job_id = ? WHERE id = ?",
                (job_id, job["source_job_id"], created.review_job_id),
            )
            new_ids.append(created.review_job_id)
            made[created.review_job_id] = [it]
        write_job_files_after_commit(
            store, state_dir, [job_id, *new_ids], prompt_renderer(store, state_dir, root, made)
        )
    return new_ids
