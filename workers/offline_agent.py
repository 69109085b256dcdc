"""The offline reviewer as a program: ``python -m workers.offline_agent``.

It needs no model. For each pair of the job (from the job's MANIFEST.json) it FAILs when
a region the gate watches is empty in the note, and PASSes otherwise, and every rationale
says it is the offline reviewer. As a fixer it cannot write prose, so it hands the note
back unchanged (which reviewq counts as a fix that changed nothing). It exists so the
whole pipeline runs on a fresh machine and in tests; it is not a judge of prose.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from orchestrator.kb.notes import REGIONS, NoteParseError, parse_note_text
from orchestrator.review.bundle import end_line, start_line

SUMMARY = (
    "The offline reviewer (no model) checked only that the regions this gate watches are not empty."
)


def note_from_prompt(prompt: str, note_path: str) -> str | None:
    """The note text the prompt carries (the snapshot the job was made from), as a real
    agent would read it, rather than the file, which may have changed since. The notes'
    sections are read in order, each fenced block skipped whole: a note that quotes a
    section heading inside its own text must not stand for another note."""
    pos = 0
    while (start := prompt.find("\n### Note `", pos)) >= 0:
        head, _, after = prompt[start + 1 :].partition("\n\n")
        fence_line, _, rest = after.partition("\n")
        fence = fence_line.rstrip("abcdefghijklmnopqrstuvwxyz")
        text, sep, _ = rest.partition("\n" + fence + "\n")
        if not fence.startswith("```") or not sep:
            pos = start + 1  # a heading with no block under it: not a note's section
            continue
        if head == f"### Note `{note_path}`":
            return text + "\n"
        pos = start + 1 + len(head) + 2 + len(fence_line) + 1 + len(text) + len(sep)
    return None


def review_block(root: Path, pair: dict, prompt: str = "") -> str:
    note_path, gate_path = pair["note_path"], pair["gate_path"]
    watches = pair.get("watches") or list(REGIONS)
    try:
        text = note_from_prompt(prompt, note_path)
        if text is None:
            text = (root / note_path).read_text(encoding="utf-8")
        regions = parse_note_text(text).regions()
    except (OSError, UnicodeDecodeError, NoteParseError) as exc:
        findings, result = (
            [f"- high: the offline reviewer could not read the note ({exc})."],
            "ERROR",
        )
    else:
        empty = [w for w in watches if not regions.get(w, "").strip() or regions.get(w) == "{}"]
        findings = [f"- high: the {w} region is empty." for w in empty] or ["- none"]
        result = "FAIL" if empty else "PASS"
    return "\n".join(
        [
            start_line(note_path, gate_path),
            f"Summary: {SUMMARY}",
            "Findings:",
            *findings,
            f"## Result: {result}",
            end_line(note_path, gate_path),
            "",
        ]
    )


def main() -> int:
    task = os.environ.get("REVIEWQ_TASK", "review")
    root = Path(os.environ["REVIEWQ_ROOT"])
    output = Path(os.environ["REVIEWQ_OUTPUT_PATH"])
    if task == "fix":
        # The text the fixer was given; a worker may have no KB (or an older copy of it).
        given = os.environ.get("REVIEWQ_NOTE_FILE")
        note = Path(given) if given else root / os.environ["REVIEWQ_NOTE_PATH"]
        print("offline fixer: cannot write prose; returning the note unchanged", file=sys.stderr)
        output.write_bytes(note.read_bytes())
        return 0
    manifest = json.loads(
        (Path(os.environ["REVIEWQ_JOB_DIR"]) / "MANIFEST.json").read_text(encoding="utf-8")
    )
    prompt = Path(os.environ["REVIEWQ_PROMPT_PATH"]).read_text(encoding="utf-8")
    text = "\n".join(review_block(root, p, prompt) for p in manifest["pairs"])
    tmp = output.with_name(output.name + ".part")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(output)
    Path(os.environ["REVIEWQ_TELEMETRY_PATH"]).write_text(
        json.dumps({"num_turns": 1, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}),
        encoding="utf-8",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
