"""``reviewq logs --since/--until/--level``: the night, read across the log's rotated copies."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.conftest import reviewq_process
from tests.test_logs_command import logrotate_of, logs_following

NOW = datetime.now(UTC)


def _stamp(at: datetime) -> str:
    return at.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _line(event: str, hours_ago: float, level: str = "info", **fields: object) -> str:
    at = NOW - timedelta(hours=hours_ago)
    return json.dumps({"event": event, "level": level, "timestamp": _stamp(at), **fields})


def _write(path: Path, *lines: str) -> None:
    text = "".join(x + "\n" for x in lines)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text)


@pytest.fixture
def rotated_set(kb):
    """A log rotated as logrotate's `copytruncate` + `compress` + `delaycompress` leaves it:
    three days back in `.2.gz`, the evening before in `.1`, the night in the log itself."""
    logs = kb.state / "logs"
    logs.mkdir(parents=True)
    _write(logs / "reviewq.jsonl.2.gz", _line("three.days", 72), _line("two.days", 50))
    _write(logs / "reviewq.jsonl.1", _line("evening", 12), _line("late.evening", 9))
    _write(logs / "reviewq.jsonl", _line("night", 6, "warning"), _line("morning", 1))
    return logs


def _events(res) -> list[str]:
    return [line.split()[2] for line in res.stdout.splitlines()]


def test_since_reads_the_rotated_copies_that_reach_into_the_period(rotated_set, run_cli):
    res = run_cli("logs", "--since", "10h")
    assert res.exit_code == 0 and res.stderr == "", res.stderr
    assert _events(res) == ["late.evening", "night", "morning"]
    since = _stamp(NOW - timedelta(hours=60))  # a date/time with its zone, into the .gz
    res = run_cli("logs", "--since", since)
    assert _events(res) == ["two.days", "evening", "late.evening", "night", "morning"]
    # Without --since, the log file alone, as before.
    assert _events(run_cli("logs")) == ["night", "morning"]
    for copy in ("reviewq.jsonl.1", "reviewq.jsonl.2.gz"):  # and a log never rotated
        (rotated_set / copy).unlink()
    res = run_cli("logs", "--since", "3h")
    assert res.exit_code == 0 and _events(res) == ["morning"]


def test_nothing_shown_from_a_rotated_log_says_where_the_lines_are(rotated_set, run_cli):
    """At 7 a.m., after cron.daily's logrotate: `logs --job 5` (or `--until 06:00`, or the
    night's event) printed nothing and exited 0, the lines in the copies `--since` reads."""
    said = (
        f"warning: {rotated_set / 'reviewq.jsonl'}: no line shown of it, and logrotate left "
        "2 older copies beside it (reviewq.jsonl.1, reviewq.jsonl.2.gz): --since reads "
        "those too (`reviewq logs --since 3d …`)\n"
    )
    for args in (["--event", "evening"], ["--until", "8h"]):
        res = run_cli("logs", *args)
        assert (res.exit_code, res.stdout, res.stderr) == (0, "", said), args
    assert _events(run_cli("logs", "--event", "evening", "--since", "3d")) == ["evening"]
    res = run_cli("logs", "--event", "morning")  # a line shown: nothing to say
    assert res.stderr == "" and _events(res) == ["morning"]


def test_the_copies_named_when_nothing_is_shown_are_the_newest(rotated_set, run_cli):
    # Named by their names' order, `rotate 14` gave ".1, .10.gz, .11.gz": two of the
    # oldest, not the ones the night is in.
    for n in range(3, 12):
        copy = rotated_set / f"reviewq.jsonl.{n}.gz"
        _write(copy, _line(f"day.{n}", 24 * n))
        os.utime(copy, (time.time() - 86400 * n,) * 2)
    res = run_cli("logs", "--event", "evening")
    assert res.stderr == (
        f"warning: {rotated_set / 'reviewq.jsonl'}: no line shown of it, and logrotate left "
        "11 older copies beside it (reviewq.jsonl.1, reviewq.jsonl.2.gz, reviewq.jsonl.3.gz, "
        "…): --since reads those too (`reviewq logs --since 3d …`)\n"
    )


def test_a_copy_the_period_does_not_reach_is_not_read(rotated_set, run_cli):
    # Cut short (a compression killed half-way): its first line tells its time, its end
    # is said once it is read.
    whole = (rotated_set / "reviewq.jsonl.2.gz").read_bytes()
    (rotated_set / "reviewq.jsonl.2.gz").write_bytes(whole[:-12])
    res = run_cli("logs", "--since", "10h")
    assert res.exit_code == 0 and res.stderr == ""
    res = run_cli("logs", "--since", "3d")
    assert "reviewq.jsonl.2.gz: cannot read on" in res.stderr
    assert _events(res)[-4:] == ["evening", "late.evening", "night", "morning"]


def test_dateext_copies_are_read_in_the_order_of_their_times(kb, run_cli):
    logs = kb.state / "logs"
    logs.mkdir(parents=True)
    # Named day-month-year, a `dateformat` whose names do not sort by time.
    _write(logs / "reviewq.jsonl-01122026", _line("older", 30))
    _write(logs / "reviewq.jsonl-30112026.gz", _line("newer", 20))
    _write(logs / "reviewq.jsonl", _line("now", 1))
    _write(logs / "reviewq.jsonl.bak", _line("not a rotated copy", 25))
    res = run_cli("logs", "--since", "2d")
    assert _events(res) == ["older", "newer", "now"]


def test_until_ends_the_period(rotated_set, run_cli):
    res = run_cli("logs", "--since", "10h", "--until", "5h")
    assert _events(res) == ["late.evening", "night"]
    res = run_cli("logs", "--until", "5h")  # without --since: the log file alone
    assert _events(res) == ["night"]


def test_level_keeps_the_lines_this_grave_or_graver(kb, run_cli):
    logs = kb.state / "logs"
    logs.mkdir(parents=True)
    _write(
        logs / "reviewq.jsonl",
        _line("a.info", 5),
        _line("a.warning", 4, "warning"),
        _line("a.error", 3, "error"),
        _line("a.critical", 2, "critical"),
        _line("a.fatal", 2, "FATAL"),
        _line("a.warn", 1, "WARN"),
        _line("an.odd.level", 1, "notice"),  # no level reviewq knows: it could be grave
    )
    res = run_cli("logs", "--level", "warning")
    assert _events(res) == [
        "a.warning",
        "a.error",
        "a.critical",
        "a.fatal",
        "a.warn",
        "an.odd.level",
    ]
    res = run_cli("logs", "--level", "ERROR")
    assert _events(res) == ["a.error", "a.critical", "a.fatal", "an.odd.level"]


def test_the_new_options_combine_with_job_event_and_json(rotated_set, run_cli):
    _write(
        rotated_set / "reviewq.jsonl",
        _line("job.failed", 6, "error", job_id=7),
        _line("job.failed", 5, "error", job_id=8),
        _line("job.created", 4, job_id=7),
        _line("attempt.lost", 3, "warning", job_id=7),
    )
    _write(rotated_set / "reviewq.jsonl.1", _line("job.failed", 9, "error", job_id=7))
    res = run_cli("logs", "--since", "10h", "--level", "warning", "--job", "7", "--json")
    said = [json.loads(x) for x in res.stdout.splitlines()]
    assert [(x["event"], x["job_id"]) for x in said] == [
        ("job.failed", 7),
        ("job.failed", 7),
        ("attempt.lost", 7),
    ]
    res = run_cli("logs", "--since", "8h", "--event", "job.", "--level", "error")
    assert res.stdout.count("job.failed") == 2 and "job.created" not in res.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        # A word a person says: the three forms --since takes, not the one that failed last.
        (
            ("--since", "yesterday"),
            "--since 'yesterday': not a duration (30m, 12h, 7d), a date (2026-11-22) or "
            "a time of day (08:00)",
        ),
        (("--since", "25:00"), "--since '25:00': not a time of day (00:00 to 23:59"),
        (("--until", "20261126"), "--until '20261126': a duration needs its unit"),
        (("--since", "2999-01-01"), "error: --since '2999-01-01': after now"),
        (("--since", "1h", "--until", "2h"), "--until '2h': not after --since '1h'"),
        (("--until", "1h", "-f"), "--until '1h' and --follow: following shows lines"),
        (("--level", "loud"), "--level 'loud': not a level (debug, info, warning, error"),
        (("--level", ""), "--level: empty"),
    ],
)
def test_a_bad_period_or_level_is_one_line_naming_the_option(rotated_set, run_cli, args, said):
    res = run_cli("logs", *args)
    # CONTRACT's exit codes: a value that names no time or level, or options that cannot go
    # together, is bad usage (2); a time after now is readable, and refused (1).
    assert res.exit_code == (1 if "after now" in said else 2) and said in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and res.stdout == ""
    if res.exit_code == 2:  # said as every command's bad usage is
        assert res.stderr.startswith("error: reviewq logs: --"), res.stderr
        assert res.stderr.endswith(" (see reviewq logs --help)\n"), res.stderr


def test_a_bare_time_of_day_is_read_on_this_machines_clock(rotated_set):
    # +05:30, a zone no whole-hour mistake lands on. Read as UTC, "5 h ago on the clock"
    # was in the future, so yesterday's, and every line of the day showed.
    tz = "IST-5:30"
    local = (NOW - timedelta(hours=7)).astimezone(timezone(timedelta(hours=5, minutes=30)))
    root = rotated_set.parent.parent
    res = reviewq_process(
        "--root", str(root), "logs", "--since", local.strftime("%H:%M"), env={"TZ": tz}
    )
    assert res.returncode == 0, res.stderr
    assert _events(res) == ["night", "morning"]
    res = reviewq_process(
        "--root", str(root), "logs", "--since", local.strftime("%Y-%m-%dT%H:%M"), env={"TZ": tz}
    )
    assert _events(res) == ["night", "morning"]


def test_follow_since_shows_the_period_then_new_lines(rotated_set):
    with logs_following(rotated_set.parent.parent, "--since", "10h") as next_event:
        assert [next_event() for _ in range(3)] == ["late.evening", "night", "morning"]
        with open(rotated_set / "reviewq.jsonl", "a") as f:
            f.write(_line("new", 0) + "\n")
        assert next_event() == "new"


def test_damage_is_said_only_in_the_period_and_counted_only_there(rotated_set, run_cli):
    """A damaged line three days back in a rotated copy is not the night's: said with
    `--since 8h`, the morning's look began with the damage of days no one asked about."""
    cut = _line("cut.short", 9.5, job_id=8)[:40]
    _write(rotated_set / "reviewq.jsonl.1", _line("evening", 12), cut, _line("late.evening", 9))
    _write(
        rotated_set / "reviewq.jsonl",
        _line("night", 6, job_id=7),
        json.dumps({"job_id": 8, "event": "cut"})[:25],
        json.dumps({"job_id": 7, "event": "cut"})[:25],
        _line("morning", 1, job_id=7),
    )
    res = run_cli("logs", "--since", "10h")
    assert res.stderr.count("a damaged line passed over") == 3
    res = run_cli("logs", "--since", "8h")
    assert res.stderr.count("a damaged line passed over") == 2
    assert "reviewq.jsonl.1" not in res.stderr
    res = run_cli("logs", "--since", "8h", "--job", "7")
    said = res.stderr.splitlines()
    assert len(said) == 2 and said[0].endswith('{"job_id": 7, "event": "c'), said
    assert "1 damaged line(s) passed over that name no job 7" in said[1]
    assert _events(res) == ["night", "morning"]


def test_a_rotated_copy_damaged_inside_is_said_and_the_rest_read(rotated_set, run_cli):
    gz = rotated_set / "reviewq.jsonl.2.gz"
    whole = bytearray(gz.read_bytes())
    body = whole.index(0, 10) + 1  # after the header and the file name it carries
    whole[body] ^= 0xFF  # the first byte of the compressed body: zlib.error, not OSError
    gz.write_bytes(bytes(whole))
    res = run_cli("logs", "--since", "4d")
    assert res.exit_code == 0 and "reviewq.jsonl.2.gz: cannot read on" in res.stderr
    assert _events(res)[-4:] == ["evening", "late.evening", "night", "morning"]


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="logrotate is not installed")
def test_a_set_rotated_by_logrotate_itself_is_read_back_in_order(kb, run_cli, tmp_path):
    """OPERATIONS §5's rotation (copytruncate, and compress with delaycompress), run by
    logrotate three times over a night: `.3.gz`, `.2.gz`, `.1`, then the log."""
    logs = kb.state / "logs"
    _rotated_by_logrotate(logs / "reviewq.jsonl", tmp_path, "two.days", "yesterday", "evening")
    with open(logs / "reviewq.jsonl", "a") as f:
        f.write(_line("night", 2, "warning") + "\n" + _line("night.info", 2) + "\n")
    assert sorted(p.name for p in logs.iterdir()) == [
        "reviewq.jsonl",
        "reviewq.jsonl.1",
        "reviewq.jsonl.2.gz",
        "reviewq.jsonl.3.gz",
    ]
    res = run_cli("logs", "--since", "30h", "--level", "warning")
    assert res.stderr == "" and _events(res) == ["yesterday", "evening", "night"]
    assert _events(run_cli("logs", "--since", "3d", "--level", "warning"))[0] == "two.days"


def test_a_copy_logrotate_is_compressing_is_read_once(rotated_set, run_cli, monkeypatch):
    """`compress` writes `.1.gz` beside `.1` and removes `.1` once the `.gz` is whole: read
    in between (seconds for a large log), both were read, every line of the copy twice (a
    real logrotate's million-line copy gave two million lines)."""
    from orchestrator import logs

    each_once = ["evening", "late.evening", "night", "morning"]

    one = rotated_set / "reviewq.jsonl.1"
    gz = rotated_set / "reviewq.jsonl.1.gz"
    with gzip.open(gz, "wb") as f:
        f.write(one.read_bytes())
    res = run_cli("logs", "--since", "13h")
    assert res.stderr == "" and _events(res) == each_once
    gz.write_bytes(gz.read_bytes()[:-12])  # its compression still under way
    res = run_cli("logs", "--since", "13h")
    assert res.stderr == "" and _events(res) == each_once
    # Its compression ends between the look at the folder and the read: its lines are the
    # `.gz`'s, not "cannot read on".
    listed = logs.files_for

    def then_compressed(path, wanted):
        found = listed(path, wanted)
        with gzip.open(gz, "wb") as f:
            f.write(one.read_bytes())
        one.unlink()
        return found

    monkeypatch.setattr(logs, "files_for", then_compressed)
    res = run_cli("logs", "--since", "13h")
    assert res.stderr == "" and _events(res) == each_once


_HOURS_AGO = {"two.days": 50, "yesterday": 26, "evening": 10}


def _rotated_by_logrotate(log: Path, tmp_path: Path, *events: str) -> Callable[[], None]:
    """A log rotated by logrotate as OPERATIONS §5 says (copytruncate, and compress with
    delaycompress), once after each of ``events``' lines (a warning and an info line);
    and logrotate's run once more, to call."""
    log.parent.mkdir(parents=True, exist_ok=True)
    rotate = logrotate_of(log, tmp_path, "copytruncate", "compress", "delaycompress")
    for event in events:
        hours = _HOURS_AGO[event]
        with open(log, "a") as f:
            f.write(_line(event, hours, "warning") + "\n" + _line(f"{event}.info", hours) + "\n")
        rotate()
    return rotate


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="logrotate is not installed")
def test_a_set_rotated_under_the_read_is_said(kb, run_cli, tmp_path, monkeypatch):
    """logrotate ran while `logs --since` read the oldest copy: the copy it read next by
    its name held other lines (the log's, copied), the day it had listed was in `.2.gz`,
    and the night passed over it without a word."""
    from orchestrator import logs

    log = kb.state / "logs" / "reviewq.jsonl"
    rotate = _rotated_by_logrotate(log, tmp_path, "two.days", "yesterday")
    with open(log, "a") as f:
        f.write(_line("evening", 10) + "\n")
    reading, rotations = logs._file_lines, []

    def rotated_under_the_read(name, *rest):
        for line in reading(name, *rest):
            yield line
            if not rotations:
                rotations.append(name.name)
                rotate()

    monkeypatch.setattr(logs, "_file_lines", rotated_under_the_read)
    res = run_cli("logs", "--since", "3d")
    assert rotations == ["reviewq.jsonl.2.gz"]
    assert res.exit_code == 0 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr.endswith(
        "reviewq.jsonl: rotated by logrotate while read: lines of the period may be missing "
        "or out of order (`reviewq logs` again reads the set as it is now)\n"
    )
    monkeypatch.setattr(logs, "_file_lines", reading)
    res = run_cli("logs", "--since", "3d")  # again: the set as it is now, whole
    assert res.stderr == "" and _events(res) == [
        "two.days",
        "two.days.info",
        "yesterday",
        "yesterday.info",
        "evening",
    ]


def test_logs_without_a_period_imports_neither_gzip_nor_the_period_parser(rotated_set):
    """`reviewq logs` alone reads the log file alone, as before the period options: gzip
    (1-6 ms a process, for every process that imports the logs module) and the period's
    parser were imported all the same; a period still has both."""
    from tests.test_worker_startup import _passes_in_a_fresh_interpreter

    state = str(rotated_set.parent)
    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from orchestrator.cli import cli\n"
        f"res = CliRunner().invoke(cli, ['--state', {state!r}, 'logs'])\n"
        "assert res.exit_code == 0 and 'morning' in res.output, res.output\n"
        "late = [m for m in ('gzip', 'orchestrator.state.when') if m in sys.modules]\n"
        "assert not late, late\n"
        f"res = CliRunner().invoke(cli, ['--state', {state!r}, 'logs', '--since', '3d'])\n"
        "assert 'three.days' not in res.output and 'two.days' in res.output, res.output\n"
        "assert 'gzip' in sys.modules and 'orchestrator.state.when' in sys.modules\n"
    )
    _passes_in_a_fresh_interpreter(probe)


def test_the_count_of_other_jobs_damage_sends_to_a_command_that_says_each(rotated_set, run_cli):
    """`--since 10h --job 7` counted a damaged line of a rotated copy and sent the operator to
    `reviewq logs` without --job, which reads the log file alone and said none of it."""
    cut = _line("cut.short", 9.5, job_id=8)[:40]
    _write(rotated_set / "reviewq.jsonl.1", _line("evening", 12), cut, _line("late.evening", 9))
    res = run_cli("logs", "--since", "10h", "--job", "7")
    assert res.stderr.endswith(
        "1 damaged line(s) passed over that name no job 7 (the same command without --job "
        "says each)\n"
    ), res.stderr
    res = run_cli("logs", "--since", "10h")
    assert "reviewq.jsonl.1: a damaged line passed over" in res.stderr


def test_copies_compressed_by_another_compresscmd_are_read_or_said(rotated_set, run_cli):
    """logrotate's `compresscmd xz` (or bzip2, zstd) names its copies `.xz`: `logs --since`
    took them for no copy, and the days in them were passed over without a word."""
    import bz2
    import lzma
    import os

    with lzma.open(rotated_set / "reviewq.jsonl.3.xz", "wt") as f:
        f.write(_line("four.days", 96) + "\n")
    with bz2.open(rotated_set / "reviewq.jsonl.4.bz2", "wt") as f:
        f.write(_line("five.days", 120) + "\n")
    for name, days in (("reviewq.jsonl.5.zst", 6), ("reviewq.jsonl.9.zst", 30)):
        (rotated_set / name).write_bytes(b"\x28\xb5\x2f\xfd not read")
        at = (NOW - timedelta(days=days)).timestamp()
        os.utime(rotated_set / name, (at, at))  # as logrotate keeps it: its last line's
    res = run_cli("logs", "--since", "7d")
    assert _events(res) == [
        "five.days",
        "four.days",
        "three.days",
        "two.days",
        "evening",
        "late.evening",
        "night",
        "morning",
    ]
    assert res.stderr.endswith(
        "reviewq.jsonl.5.zst: compressed as reviewq does not read (.zst; .gz, .bz2 and .xz "
        "are read): its lines are not shown\n"
    ), res.stderr
    assert res.stderr.count("\n") == 1  # the copy of a month ago is not the period's
    assert run_cli("logs", "--since", "10h").stderr == ""
