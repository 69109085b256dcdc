"""What the import-linter contracts cannot check about where code lives."""

from __future__ import annotations

import ast

from .conftest import PROJECT


def _functions_running_sql(path) -> set[str]:
    found = set()
    for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("execute", "executemany", "executescript")
                ):
                    found.add(f"{path.name}:{fn.name}")
    return found


def test_cli_commands_run_no_sql_of_their_own():
    """SQL lives with the module that owns its table; a command calls one function."""
    found = set()
    for path in sorted((PROJECT / "orchestrator" / "cli").glob("*.py")):
        found |= _functions_running_sql(path)
    assert not found, sorted(found)
