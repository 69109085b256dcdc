"""A control and a worker that run for weeks without a restart, as systemd services do:
many cycles in one process, with real parts, and nothing that grows from one to the next."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import logs
from tests.conftest import bound_by_file_modes


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
    """`select`, `export` and `warn-queue` (a sweep does not) read the KB through the note
    cache, which kept an entry for every path a note ever had: a KB whose notes are
    renamed, moved or deleted (a daily journal note, a folder reorganised) grew
    `cache/notes.pickle`, read and written again by each, without bound. A full look
    drops the paths gone."""
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


def test_a_line_between_logrotates_rename_and_its_create_stays_in_the_copy(tmp_path):
    """logrotate's `create` renames the log, then makes the new one. A line written in
    between made the file itself, which logrotate then found and renamed to
    `reviewq.jsonl-DATE.backup` ("error: destination … already exists"): a file `reviewq
    logs` never reads and logrotate never rotates nor deletes. The real logrotate is held
    between the two by strace (a delay on its rename's return)."""
    if shutil.which("logrotate") is None or shutil.which("strace") is None:
        pytest.skip("needs logrotate and strace")
    state = tmp_path / "state"
    logs.configure(state, process="control")
    log = logs.log_path(state)
    conf = tmp_path / "logrotate.conf"
    conf.write_text(f"{log} {{\n  create\n  rotate 2\n  missingok\n}}\n")
    renames = "rename,renameat,renameat2"
    try:
        logs.get().info("soak.before")
        held = subprocess.Popen(
            ["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={renames}",
             "-e", f"inject={renames}:delay_exit=5000000",  # µs: 5 s after its rename
             "logrotate", "-v", "-f", "-s", str(tmp_path / "lr.state"), str(conf)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # strace and logrotate, killed together on a failure
        )  # fmt: skip
        try:
            for _ in range(2000):  # until the rename (bounded: 20 s)
                if not log.exists() or held.poll() is not None:
                    break
                time.sleep(0.01)
            if held.poll() is not None and "ptrace" in (early := held.communicate()[0]):
                pytest.skip(f"strace cannot trace here: {early.strip()}")
            assert not log.exists(), "logrotate did not rename the log"
            logs.get().info("soak.between")
            out, _ = held.communicate(timeout=60)
        finally:
            if held.poll() is None:
                os.killpg(held.pid, signal.SIGKILL)
                held.wait()
        logs.get().info("soak.after")
        assert held.returncode == 0, out
        assert "already exists" not in out, out
        events = {
            p.name: [json.loads(x)["event"] for x in p.read_text().splitlines()]
            for p in log.parent.iterdir()
        }
        assert events == {
            "reviewq.jsonl.1": ["soak.before", "soak.between"],
            "reviewq.jsonl": ["soak.after"],
        }, out
        assert _open_logs(log.parent) == [str(log)]
    finally:
        logs.configure(None)


def test_a_log_logrotate_makes_that_the_process_cannot_open_keeps_its_lines(tmp_path):
    """`create 0600 OWNER GROUP` naming another user than the service's (a copied
    stanza; nobody's uid here): the new file cannot be opened by the process, and every line after the
    rotation went nowhere (one warning). They go on in the copy, the warning says so."""
    if shutil.which("logrotate") is None or os.geteuid() != 0:
        pytest.skip("needs logrotate, and root to give the new log to another user")
    wrap = bound_by_file_modes()
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    log = logs.log_path(state)
    conf = tmp_path / "logrotate.conf"
    conf.write_text(f"{log} {{\n  create 0600 65534 65534\n  rotate 2\n  missingok\n}}\n")
    writer = (
        "import sys\nfrom pathlib import Path\nfrom orchestrator import logs\n"
        f"logs.configure(Path({str(state)!r}), process='control')\n"
        "for line in sys.stdin:\n"
        "    logs.get().info(line.strip())\n"
        "    print('done', flush=True)\n"
    )
    proc = subprocess.Popen(
        [*wrap, sys.executable, "-c", writer],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=Path(__file__).parent.parent,
    )  # fmt: skip
    try:

        def say(event: str) -> None:
            proc.stdin.write(event + "\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == "done\n"

        say("soak.before")
        subprocess.run(["logrotate", "-f", "-s", str(tmp_path / "lr.state"), str(conf)], check=True)
        say("soak.after")
        say("soak.later")
        proc.stdin.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    copy = log.with_name(log.name + ".1")
    assert [json.loads(x)["event"] for x in copy.read_text().splitlines()] == [
        "soak.before",
        "soak.after",
        "soak.later",
    ]
    assert log.read_text() == ""
    assert err.count("cannot open the log again (Permission denied)") == 1, err


def test_a_log_deleted_is_made_again_and_a_moved_state_folder_keeps_its_lines(
    tmp_path, capfd, monkeypatch
):
    """A log deleted (`rm`, to free the disk) is made again at the next line; a state
    folder moved under the running process (its path gone, the file still there under
    the new name) keeps the lines: they were lost, the path tried and failed at each."""
    clock = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    state = tmp_path / "state"
    logs.configure(state, process="control")
    log = logs.log_path(state)
    try:
        logs.get().info("soak.before")
        log.unlink()
        logs.get().info("soak.deleted")
        assert [json.loads(x)["event"] for x in log.read_text().splitlines()] == ["soak.deleted"]
        moved = tmp_path / "moved"
        state.rename(moved)
        logs.get().info("soak.moved")
        clock[0] += 60  # long after: the path cannot be made, the lines stay
        logs.get().info("soak.later")
        logs.get().info("soak.later")
        lines = logs.log_path(moved).read_text().splitlines()
        assert [json.loads(x)["event"] for x in lines] == [
            "soak.deleted",
            "soak.moved",
            "soak.later",
            "soak.later",
        ]
        assert not state.exists()
        said = [x for x in capfd.readouterr().err.splitlines() if "cannot" in x]
        assert said == [
            f"warning: {log}: cannot open the log again (No such file or directory): "
            "lines go on in the file it was"
        ]
    finally:
        logs.configure(None)


def test_a_log_moved_aside_and_not_made_again_is_made_by_the_next_lines(tmp_path, monkeypatch):
    """`nocreate`, or a `mv` by hand: nothing comes to the path after the rename. The
    lines go on in the copy for the moment logrotate's `create` would take, then the path
    is made again (else they went to the copy until it was deleted)."""
    clock = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    state = tmp_path / "state"
    logs.configure(state, process="control")
    log = logs.log_path(state)
    aside = log.with_name("aside.jsonl")
    try:
        logs.get().info("soak.before")
        log.rename(aside)
        logs.get().info("soak.renamed")
        assert not log.exists()
        clock[0] += 60
        logs.get().info("soak.after")
        events = [json.loads(x)["event"] for x in aside.read_text().splitlines()]
        assert events == ["soak.before", "soak.renamed"]
        assert [json.loads(x)["event"] for x in log.read_text().splitlines()] == ["soak.after"]
        assert _open_logs(log.parent) == [str(log)]
    finally:
        logs.configure(None)
