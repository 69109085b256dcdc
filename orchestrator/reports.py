"""Files reviewq writes for people, all renderings of state.db: a job's MANIFEST.json and
per-pair result files, and the export of SPEC §10 (GATE-REVIEW files and the CSV).

Every file is written atomically (a temp file in the same folder, then a rename), so a
reader never sees half a file and a crash leaves the old one.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import logs
from .kb import canonical_json, parse_note_text
from .store import Store, utcnow

EXPORT_DIR = "kb/reports/reviews"
CSV_HEADER = [
    "note_path",
    "gate_id",
    "model_partition",
    "gate_hash",
    "recorded_commit",
    "watched_hash",
    "recorded_at",
]


class ReportError(Exception):
    pass


def atomic_write(path: Path, data: str | bytes, *, durable: bool = False) -> None:
    """Write via a temp file and a rename. Files regenerable from state.db skip fsync
    (``durable=False``): a crash can lose them, never leave half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_manifest(folder: Path, data: dict, *, new_folder: bool = False) -> None:
    if new_folder:
        # Nobody reads a folder still being made: a plain, compact write will do (the
        # indented encoder is pure Python and costs ~0.15 ms a job). Finalize rewrites it.
        text = json.dumps(data, ensure_ascii=False) + "\n"
        (folder / "MANIFEST.json").write_text(text, encoding="utf-8")
    else:
        atomic_write(
            folder / "MANIFEST.json", json.dumps(data, indent=1, ensure_ascii=False) + "\n"
        )


def flat(path: str) -> str:
    """A root-relative path as one file-name component: ``/`` becomes ``__``."""
    return path.replace("/", "__")


def result_file_name(note_path: str, gate_id: str) -> str:
    return f"{flat(note_path)}--{flat(gate_id)}.md"


def job_manifest(store: Store, job_id: int) -> dict:
    job = store.conn.execute("SELECT * FROM review_jobs WHERE id = ?", (job_id,)).fetchone()
    if job is None:
        raise ReportError(f"no review job {job_id}")
    pairs = store.conn.execute(
        "SELECT p.*, n.sha256 AS note_sha256, g.sha256 AS gate_sha256 FROM review_pairs p "
        "JOIN snapshots n ON n.id = p.note_snapshot_id JOIN snapshots g ON g.id = p.gate_snapshot_id "
        "WHERE p.job_id = ? ORDER BY p.id",
        (job_id,),
    ).fetchall()
    attempts = store.conn.execute(
        "SELECT attempt, runner, outcome, exit_code, started_at, ended_at, reasons, num_turns, "
        "input_tokens, output_tokens, cost_usd, duration_s FROM attempts WHERE job_id = ? ORDER BY attempt",
        (job_id,),
    ).fetchall()
    return {
        "review_job_id": job_id,
        "kind": job["kind"],
        "status": job["status"],
        "model_partition": job["model_partition"],
        "grouping": job["grouping"],
        "lens": job["lens"],
        "reviewer": job["reviewer"],
        "prompt_path": "prompt.md",
        "bundle_output_path": "bundle-output.md",
        "created_at": job["created_at"],
        "finished_at": job["finished_at"],
        "failure_reasons": json.loads(job["failure_reasons"] or "[]"),
        "provenance": {k: job[k] for k in ("runner", "model", "effort")}
        | {"telemetry": json.loads(job["telemetry_json"]) if job["telemetry_json"] else None},
        "attempts": [{**dict(a), "reasons": json.loads(a["reasons"] or "[]")} for a in attempts],
        "pairs": [
            {
                "note_path": p["note_path"],
                "gate_id": p["gate_id"],
                "gate_path": p["gate_path"],
                "lens": p["lens"],
                "note_sha256": p["note_sha256"],
                "gate_sha256": p["gate_sha256"],
                "decision": p["decision"],
                "result_path": f"results/{result_file_name(p['note_path'], p['gate_id'])}"
                if p["decision"]
                else None,
            }
            for p in pairs
        ],
    }


def write_job_files(store: Store, job_dir: Path, job_id: int) -> None:
    """MANIFEST.json and one result file per decided pair, regenerated from the database."""
    manifest = job_manifest(store, job_id)
    rows = store.conn.execute(
        "SELECT note_path, gate_id, gate_path, decision, rationale, decided_at FROM review_pairs "
        "WHERE job_id = ? AND decision IS NOT NULL",
        (job_id,),
    ).fetchall()
    if rows:
        # The whole results/ folder is built aside and renamed into place, so a reader
        # sees the old set or the new one, at the cost of one rename, not one per file.
        staging = Path(tempfile.mkdtemp(dir=job_dir, prefix=".results."))
        try:
            for p in rows:
                text = (
                    f"# {p['gate_id']} — {p['note_path']}\n\n"
                    f"- decision: {p['decision']}\n- job: {job_id}\n"
                    f"- model partition: {manifest['model_partition']}\n"
                    f"- gate: {p['gate_path']}\n- decided at: {p['decided_at']}\n\n"
                    f"{(p['rationale'] or '').strip()}\n\n## Result: {p['decision']}\n"
                )
                (staging / result_file_name(p["note_path"], p["gate_id"])).write_text(
                    text, encoding="utf-8"
                )
            _swap_folder(staging, job_dir / "results")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    write_manifest(job_dir, manifest)


def write_job_files_after_commit(store: Store, state_dir: Path, job_id: int) -> None:
    """Render a job's files once the transaction that changed it commits. The job is
    marked due in that same transaction, so files a crash or a full disk kept from being
    written are written by :func:`write_due_job_files` (the control process's tick)."""
    with store.write():
        store.conn.execute(
            "INSERT OR IGNORE INTO job_files_due VALUES (?, ?, 'not written yet')",
            (job_id, utcnow()),
        )
    store.after_commit(lambda: _write_due(store, state_dir, job_id))


def _write_due(store: Store, state_dir: Path, job_id: int, *, late: bool = False) -> bool:
    row = store.conn.execute("SELECT job_dir FROM review_jobs WHERE id = ?", (job_id,)).fetchone()
    try:
        if row is not None:
            write_job_files(store, state_dir / row[0], job_id)
    except OSError as exc:
        logs.get().error(
            "job.files_failed",
            job_id=job_id,
            error=str(exc),
            recovery="state.db holds the result; the control process writes the files "
            "again at each tick until it can",
        )
        # state.db may be on the full disk too; the row says 'due' either way.
        with contextlib.suppress(sqlite3.Error), store.write():
            store.conn.execute(
                "UPDATE job_files_due SET error = ? WHERE job_id = ?", (str(exc), job_id)
            )
        return False
    with contextlib.suppress(sqlite3.Error), store.write():  # if not: rewritten next tick
        store.conn.execute("DELETE FROM job_files_due WHERE job_id = ?", (job_id,))
    if late:
        logs.get().info("job.files_written", job_id=job_id, late=True)
    return True


def write_due_job_files(store: Store, state_dir: Path) -> int:
    """Write the files of jobs whose writing failed or was cut short; the number written."""
    written = 0
    for (job_id,) in store.conn.execute(
        "SELECT job_id FROM job_files_due ORDER BY job_id"
    ).fetchall():
        if not _write_due(store, state_dir, job_id, late=True):
            break  # still no room: the next tick tries again
        written += 1
    return written


def _swap_folder(new: Path, target: Path) -> None:
    if target.exists():
        old = target.with_name(f".{target.name}.old.{os.getpid()}")
        os.rename(target, old)
        os.rename(new, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(new, target)


# --- export ---------------------------------------------------------------------------------


def git_blob_hash(text: str) -> str:
    data = text.encode("utf-8")
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git_head(root: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def watched_hash(note_text: str, watches: list[str]) -> str:
    try:
        regions = parse_note_text(note_text).regions()
    except ValueError:
        regions = {"body": note_text}
    picked = {w: regions.get(w, "") for w in sorted(watches)}
    return hashlib.sha256(canonical_json(picked).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ExportResult:
    files: int
    csv_path: Path


def export(
    store: Store, root: Path, model: str | None = None, watches: dict[str, list[str]] | None = None
) -> ExportResult:
    """GATE-REVIEW files and gate_reviews.csv for every (note, gate) with an acceptance:
    in partition ``model``, or else the most recent across partitions."""
    rows = store.conn.execute(
        "SELECT a.*, p.rationale, p.gate_path, n.text AS note_text, g.text AS gate_text "
        "FROM acceptance a JOIN review_pairs p ON p.id = a.review_pair_id "
        "JOIN snapshots n ON n.id = a.note_snapshot_id JOIN snapshots g ON g.id = a.gate_snapshot_id "
        + ("WHERE a.model_partition = ? " if model else "")
        + "ORDER BY a.note_path, a.gate_id, a.accepted_at DESC",
        (model,) if model else (),
    ).fetchall()
    latest: dict[tuple[str, str], object] = {}
    for r in rows:
        latest.setdefault((r["note_path"], r["gate_id"]), r)
    base = root / EXPORT_DIR
    commit = git_head(root)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for (note_path, gate_id), r in sorted(latest.items()):
        _check_component(note_path)
        _check_component(gate_id)
        watch = (watches or {}).get(gate_id) or ["title", "description", "frontmatter", "body"]
        fields = {
            "note_path": note_path,
            "gate_id": gate_id,
            "model_partition": r["model_partition"],
            "gate_hash": git_blob_hash(r["gate_text"]),
            "recorded_commit": commit,
            "watched_hash": watched_hash(r["note_text"], watch),
            "recorded_at": r["accepted_at"],
        }
        header = (
            "<!-- GATE-REVIEW\n"
            + "".join(f"{k.replace('_', '-')}: {v}\n" for k, v in fields.items())
            + "-->\n"
        )
        body = f"\n## {gate_id} — {note_path}\n\n{(r['rationale'] or '').strip()}\n\n## Result: {r['decision']}\n"
        atomic_write(base / "gates" / flat(note_path) / f"{gate_id}.md", header + body)
        writer.writerow([fields[k] for k in CSV_HEADER])
    csv_path = base / "csv" / "gate_reviews.csv"
    atomic_write(csv_path, buf.getvalue())
    return ExportResult(len(latest), csv_path)


def _check_component(value: str) -> None:
    # Paths in the database were validated when recorded; refuse anything that could
    # still steer a write out of the export folder.
    parts = value.split("/")
    if value.startswith("/") or ".." in parts or "\x00" in value or "" in parts:
        raise ReportError(f"refusing to export {value!r}: not a clean relative path")
