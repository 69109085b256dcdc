"""Rendering the prompt templates shipped in the ``prompts`` package (CONTRACT §4).

A prompt carries the sentinel lines of its own pairs and of no other, the full note
texts, the gate bodies and a per-pair template; on a retry it also says what was wrong.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from string import Template

from orchestrator.review.bundle import end_line, start_line

_BACKTICKS = re.compile(r"`{3,}")


@cache
def template(name: str) -> Template:
    return Template(resources.files("prompts").joinpath(f"{name}.md").read_text(encoding="utf-8"))


@dataclass(frozen=True, slots=True)
class PromptPair:
    note_path: str
    gate_id: str
    gate_path: str


@dataclass(frozen=True, slots=True)
class PromptGate:
    gate_id: str
    path: str
    name: str
    body: str
    is_type: bool = False


def fenced(text: str, info: str = "markdown") -> str:
    """``text`` in a code fence longer than any backtick run inside it."""
    longest = max((len(m.group()) for m in _BACKTICKS.finditer(text)), default=3)
    fence = "`" * max(4, longest + 1)
    body = text if text.endswith("\n") else text + "\n"
    return f"{fence}{info}\n{body}{fence}\n"


def pair_template(n: int, pair: PromptPair) -> str:
    return (
        f"### Pair {n}: `{pair.note_path}` against `{pair.gate_id}`\n\n"
        f"{start_line(pair.note_path, pair.gate_path)}\n"
        "Summary: <one or two sentences about this note and this gate>\n"
        "Findings:\n"
        "- <severity>: <what is wrong, quoting the note>\n"
        "## Result: <one of PASS, WARN, FAIL, ERROR>\n"
        f"{end_line(pair.note_path, pair.gate_path)}\n"
    )


def render_retry(previous_attempt: int, reasons: Sequence[str]) -> str:
    lines = "\n".join(f"- {r}" for r in reasons) or "- (no reason was recorded)"
    return template("retry").substitute(previous_attempt=previous_attempt, reasons=lines)


def render_review(
    job_id: int,
    output_path: str,
    pairs: Sequence[PromptPair],
    notes: dict[str, str],
    gates: Sequence[PromptGate],
    retry: str = "",
) -> str:
    templates = "\n".join(pair_template(i, p) for i, p in enumerate(pairs, 1))
    note_parts = [f"### Note `{path}`\n\n{fenced(text)}" for path, text in notes.items()]
    gate_parts = []
    conformance = template("type_conformance").template.strip()
    for g in gates:
        head = f"### Gate `{g.gate_id}`: {g.name}\n\nFile: `{g.path}`\n\n"
        if g.is_type:
            gate_parts.append(head + conformance + "\n\n" + fenced(g.body))
        else:
            gate_parts.append(head + g.body.strip() + "\n")
    text = template("review").substitute(
        job_id=job_id,
        pair_count=len(pairs),
        output_path=output_path,
        pair_templates="## Pairs\n\n" + templates,
        notes_section="## Notes\n\n" + "\n".join(note_parts),
        gates_section="## Gates\n\n" + "\n".join(gate_parts),
    )
    return (retry + text) if retry else text
