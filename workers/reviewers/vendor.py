"""Helpers shared by the vendor CLI adapters (claude, codex, gemini): the one-line
instruction that points an agent at its prompt file, and tolerant readers of their JSON
output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from .base import AttemptSpec, Telemetry, _num

_MAX_LOG_BYTES = 8 * 1024 * 1024


def instruction(spec: AttemptSpec) -> str:
    """What goes on the command line instead of the prompt: prompts carry whole notes and
    easily pass Linux's 128 KiB limit for one argument, and stdin is closed, so the agent
    reads the prompt file itself. Paths are absolute because some CLIs run elsewhere."""
    return (
        f"Read the file {spec.prompt_path} and follow its instructions exactly "
        f"(relative paths in it are relative to {spec.root}). "
        f"Write your complete answer to {spec.output_path}. "
        "Do not create or change any other file."
    )


def json_objects(path: Path) -> Iterator[dict]:
    """Every JSON object in a stdout log, whether it holds one document (a JSON object or
    array) or one per line; anything unreadable is skipped, never raised."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - _MAX_LOG_BYTES))  # a huge log: its end has the result
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
        for line in text.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict):
                yield item
    for item in whole if isinstance(whole, list) else [whole]:
        if isinstance(item, dict):
            yield item


def add_counts(t: Telemetry, attr: str, *values: object) -> None:
    """Add the numbers among ``values`` to a count of ``t``; a count nothing reported
    stays None rather than becoming a misleading 0."""
    for v in values:
        n = _num(v, int)
        if n is not None:
            setattr(t, attr, (getattr(t, attr) or 0) + n)
