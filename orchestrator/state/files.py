"""Files reviewq writes for people, all renderings of state.db: a job's MANIFEST.json and
per-pair result files (the export of SPEC §10 is :mod:`orchestrator.review.export`).

Every file is written atomically (a temp file in the same folder, then a rename), so a
reader never sees half a file and a crash leaves the old one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from orchestrator import logs
from orchestrator.kb.atomicfile import atomic_write
from orchestrator.state.store import Store, utcnow


class ReportError(Exception):
    pass


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


def files_due(store: Store) -> tuple[int, str | None]:
    """How many jobs' files wait to be written, and one error that kept them back."""
    count, error = store.conn.execute("SELECT count(*), min(error) FROM job_files_due").fetchone()
    return count, error
