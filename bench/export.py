"""What ``reviewq export`` costs on a KB already reviewed, and what it leaves changed.

It times ``reviewq --root ROOT export`` ``--repeat`` times as a whole process (wall, and
peak RSS from ``os.wait4``, through ``bench/create_jobs.py``'s ``run``), and after each run
counts the files under ``kb/reports/reviews`` whose inode or mtime changed, and, when ROOT
is a git repository, times ``git status``. Every run exports the same state.db, so the
runs after the first must change no file: a count above 0 is the rewrite of stop 46 (every
file replaced with its own bytes, and `git status` reading them all again).

ROOT is a KB swept already (its `.reviewq/state.db` holds acceptances), e.g. the
commonplace corpus swept by a `command` reviewer as docs/BENCHMARKS.md's "Export on a real
KB" says. The script writes only the export folder of ROOT, as `reviewq export` does.

    .venv/bin/python bench/export.py --root /tmp/kb --repeat 3

Exit status: 1 when an export fails; nothing here is a target.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from create_jobs import child_env, reviewq_exe, run, warm_bytecode

EXPORT = Path("kb") / "reports" / "reviews"


def stamps(folder: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every file under ``folder``: a replaced file has a new inode."""
    out = {}
    for top, _dirs, names in os.walk(folder):
        for name in names:
            st = os.lstat(os.path.join(top, name))
            out[os.path.join(top, name)] = (st.st_ino, st.st_mtime_ns)
    return out


def git_status_s(root: Path) -> float | None:
    if not (root / ".git").exists():
        return None
    t0 = time.perf_counter()
    subprocess.run(["git", "status", "--short"], cwd=root, capture_output=True, check=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="a KB swept already")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    root = args.root.resolve()
    with tempfile.TemporaryDirectory(prefix="bench-export-") as base:
        env = child_env(Path(base))
        warm_bytecode(env)
        print(f"timed: reviewq --root {root} export   (load {os.getloadavg()[0]:.1f})")
        for i in range(args.repeat):
            before = stamps(root / EXPORT)
            r = run([reviewq_exe(), "--root", str(root), "export"], os.devnull, env)
            if r.exit_code != 0:
                print(f"run {i + 1} failed ({r.exit_code}): {r.stderr.strip()[-2000:]}")
                return 1
            after = stamps(root / EXPORT)
            changed = sum(1 for p, s in after.items() if before.get(p) != s)
            git = git_status_s(root)
            print(
                f"  run {i + 1}: {r.wall:6.2f} s  peak RSS {r.rss_bytes / 1e6:6.1f} MB  "
                f"{changed} of {len(after)} files changed"
                + (f"  git status {git:.2f} s" if git is not None else "")
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
