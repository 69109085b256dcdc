"""A control and a worker that run for weeks without a restart, as systemd services do:
many cycles in one process, with real parts, and nothing that grows from one to the next."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator import logs


def _open_logs(folder: Path) -> list[str]:
    """What this process's descriptors hold in ``folder`` (a deleted file says so)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            held.append(target)
    return sorted(held)


@pytest.mark.parametrize("mode", ["create", "copytruncate"])
def test_the_log_goes_on_in_the_file_logrotate_leaves_whatever_its_mode(tmp_path, mode):
    """logrotate's default mode (`create`, as a distribution's config has it) renames the
    log and makes an empty one: a control and a worker kept writing to the renamed copy,
    which `reviewq logs` does not read, and once `rotate N` had deleted it, to a deleted
    file that filled the disk unseen, for weeks. Each line now goes to the file the path
    names."""
    if shutil.which("logrotate") is None:
        pytest.skip("needs logrotate")
    state = tmp_path / "state"
    logs.configure(state, process="control")
    log = logs.log_path(state)
    conf = tmp_path / "logrotate.conf"
    conf.write_text(f"{log} {{\n  {mode}\n  rotate 2\n  missingok\n}}\n")
    try:
        for cycle in range(6):
            logs.get().info("soak.cycle", cycle=cycle)
            subprocess.run(
                ["logrotate", "-f", "-s", str(tmp_path / "lr.state"), str(conf)], check=True
            )
            logs.get().info("soak.after", cycle=cycle)
            lines = [json.loads(x) for x in log.read_text().splitlines()]
            assert [(x["event"], x["cycle"]) for x in lines] == [("soak.after", cycle)], cycle
            assert _open_logs(log.parent) == [str(log)], cycle
    finally:
        logs.configure(None)


def test_the_note_cache_keeps_only_the_notes_the_kb_has(kb, run_cli, monkeypatch):
    """The control's minutely sweep read the KB through the note cache, which kept an
    entry for every path a note ever had: a KB whose notes are renamed, moved or deleted
    (a daily journal note, a folder reorganised) grew `cache/notes.pickle`, read and
    written again at every sweep, without bound. A full look drops the paths gone."""
    import pickle

    from orchestrator.kb import notecache
    from tests.conftest import note_text

    # A note just written is cached too (its ctime, which the test cannot set back, is now).
    monkeypatch.setattr(notecache, "_RACY_S", 0)

    kb.gate("prose/clarity", ["body"])
    for i in range(3):
        kb.note(f"keep-{i}")
    cache = kb.state / "cache" / "notes.pickle"
    sizes = []
    for day in range(12):
        for old in (kb.root / "kb" / "notes").glob("day-*.md"):
            old.unlink()  # yesterday's note, moved out of the KB
        note = kb.root / "kb" / "notes" / f"day-{day}.md"
        note.write_text(note_text(f"Day {day}.\n", title=f"Day {day}", description="A day."))
        result = run_cli("select", "--all-gates", "--json")
        assert result.exit_code == 0, result.stderr
        entries = pickle.loads(cache.read_bytes())["entries"]
        sizes.append(len(entries))
        assert sorted(entries) == sorted(
            f"kb/notes/{n}.md" for n in ("keep-0", "keep-1", "keep-2", f"day-{day}")
        ), day
    assert set(sizes) == {4}
