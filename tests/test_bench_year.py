"""bench/year.py, the state.db of a year, as its docstring and bench/README.md run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

YEAR = Path(__file__).resolve().parent.parent / "bench" / "year.py"


def year(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(YEAR), *args], capture_output=True, text=True, timeout=120
    )


def test_year_built_twice_or_timed_unbuilt_says_so_in_one_line(tmp_path):
    """Run again on the folder it built, year.py ended in a traceback ("UNIQUE constraint
    failed: snapshots.path"); --time of a folder never built, in another."""
    where = tmp_path / "year"
    timed = year("--dir", str(where), "--time", "--only", "jobs")
    assert timed.returncode == 2 and "Traceback" not in timed.stderr, timed.stderr
    assert "state.db: not there, build it first (without --time)" in timed.stderr
    small = ("--dir", str(where), "--nights", "1", "--jobs", "3", "--notes", "5", "--only", "jobs")
    built = year(*small)
    assert built.returncode == 0, built.stderr
    assert "jobs " in built.stdout and "exit 0" in built.stdout, built.stdout
    again = year(*small)
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr
    assert "state.db: there already, time it with --time or give a new --dir" in again.stderr
