"""``reviewq``: a thin click CLI over the core. Commands parse, call one core function,
print, and turn domain errors into one ``error:`` line with exit code 1."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from .config import ConfigError
from .gates import SelectionError
from .kb import KBError, FileProblem
from .selector import SelectError, select
from .store import StoreError
from .workspace import Workspace

DOMAIN_ERRORS: tuple[type[Exception], ...] = (
    ConfigError,
    KBError,
    SelectionError,
    SelectError,
    StoreError,
)


class Refused(click.ClickException):
    """The operation was refused or failed: one ``error:`` line, exit 1."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def refuse_domain_errors(fn: Callable) -> Callable:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DOMAIN_ERRORS as exc:
            raise Refused(str(exc)) from None

    return wrapper


def warn(problems: list[FileProblem]) -> None:
    for p in problems:
        click.echo(f"warning: {p.path}: {p.reason}", err=True)


def emit_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))
    sys.stdout.write("\n")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--root", default=".", show_default=True, help="The KB root (the folder holding kb/).")
@click.option("--state", default=None, help="The state folder [default: ROOT/.reviewq].")
@click.option("--config", default=None, help="The settings file [default: ROOT/reviewq.toml].")
@click.pass_context
def cli(ctx: click.Context, root: str, state: str | None, config: str | None) -> None:
    """Gate-based LLM reviews of a markdown knowledge base.

    \b
    Example:
      reviewq select --all-gates --model offline --json
    """
    try:
        ws = Workspace.open(root, state, config)
    except DOMAIN_ERRORS as exc:
        raise Refused(str(exc)) from None
    ctx.obj = ws
    ctx.call_on_close(ws.close)


@cli.command()
@click.option("--check", is_flag=True, help="Validate every gate; exit 1 if any is invalid.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
@refuse_domain_errors
def gates(ws: Workspace, check: bool, as_json: bool) -> None:
    """The gate catalog: every gate by lens, and the invalid ones with their reasons.

    \b
    Example:
      reviewq gates --check
    """
    cat = ws.catalog()
    if as_json:
        emit_json(
            {
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
                    for g in sorted(cat.gates.values(), key=lambda g: g.gate_id)
                ],
                "types": [{"gate_id": g.gate_id, "path": g.path} for g in sorted(cat.types.values(), key=lambda g: g.gate_id)],
                "invalid": [{"path": p.path, "reason": p.reason} for p in cat.problems],
            }
        )
    else:
        for lens in cat.lenses:
            click.echo(f"{lens}:")
            for g in sorted(cat.gates.values(), key=lambda g: g.gate_id):
                if g.lens == lens:
                    watches = ",".join(g.watches)
                    click.echo(f"  {g.gate_id:<40} watches {watches:<28} {g.staleness_text}")
        if cat.types:
            click.echo("type: " + " ".join(sorted(g.gate_id for g in cat.types.values())))
        click.echo(f"{len(cat.gates)} gates in {len(cat.lenses)} lenses, {len(cat.problems)} invalid")
    if check:
        for p in cat.problems:
            click.echo(f"invalid: {p.path}: {p.reason}", err=True)
        if cat.problems:
            raise Refused(f"{len(cat.problems)} invalid gate(s)")
    else:
        warn(cat.problems)


@cli.command("select")
@click.argument("selectors", nargs=-1)
@click.option("--all-gates", is_flag=True, help="Every catalog gate (type pairs stay opt-in).")
@click.option("--note", "notes", multiple=True, help="Only these note files or folders.")
@click.option("--current", is_flag=True, help="Only notes with status: current.")
@click.option("--model", default=None, help="The model partition to judge freshness in.")
@click.option(
    "--reason",
    "reasons",
    multiple=True,
    type=click.Choice(["missing-review", "gate-changed", "note-changed"]),
    help="Only pairs stale for this reason.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (SPEC §10).")
@click.pass_obj
@refuse_domain_errors
def select_cmd(
    ws: Workspace,
    selectors: tuple[str, ...],
    all_gates: bool,
    notes: tuple[str, ...],
    current: bool,
    model: str | None,
    reasons: tuple[str, ...],
    as_json: bool,
) -> None:
    """Stale (note, gate) pairs and why: SEL is a bundle, gate id, 'type' or 'type/NAME'.

    \b
    Example:
      reviewq select prose frontmatter/title-body-alignment --model offline --json
    """
    if all_gates and any(s != "type" and not s.startswith("type/") for s in selectors):
        raise click.UsageError("--all-gates selects every catalog gate: name no bundle or gate id with it")
    note_paths = [ws.kb.rel(n) for n in notes] if notes else None
    result = select(
        ws.kb,
        ws.catalog(),
        ws.read_store(),
        selectors=selectors,
        all_gates=all_gates,
        note_paths=note_paths,
        current=current,
        model=model,
        reasons=reasons or None,
        diffs=as_json,
    )
    warn(result.problems)
    if as_json:
        emit_json(result.to_json())
        return
    for t in result.targets:
        extra = ""
        if t.changed_regions:
            extra = " (" + ",".join(t.changed_regions)
            extra += f"; ratio {t.change_ratio:.2f})" if t.change_ratio is not None else ")"
        click.echo(f"{t.reason:<15} {t.note_path}  {t.gate_id}{extra}")
    counts = result.to_json()["counts"]
    click.echo(", ".join(f"{k}: {v}" for k, v in counts.items()))


def main() -> None:
    cli(prog_name="reviewq")
