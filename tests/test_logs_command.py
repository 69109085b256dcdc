"""``reviewq logs``: the structured log, readable, and followed across its rotation."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import reviewq_process

EXE = str(Path(sys.executable).parent / "reviewq")


def _line(event: str) -> str:
    return json.dumps({"event": event, "level": "info", "timestamp": "2026-11-23T01:02:03.456Z"})


def logrotate_of(log: Path, tmp_path: Path, *directives: str) -> Callable[[], None]:
    """A run of the real logrotate over ``log`` with ``directives`` (copytruncate,
    compress…), forced, keeping its state in ``tmp_path``: to call."""
    conf = tmp_path / "logrotate.conf"
    conf.write_text(f"{log} {{\n" + "".join(f" {d}\n" for d in directives) + " rotate 5\n}\n")
    state = tmp_path / "logrotate.state"

    def rotate() -> None:
        subprocess.run(
            [shutil.which("logrotate"), "-f", "-s", str(state), str(conf)], check=True, timeout=60
        )

    return rotate


@contextlib.contextmanager
def logs_following(root: Path, *args: str) -> Iterator[Callable[[], str]]:
    """``reviewq logs -f --json ARGS`` running on ROOT's log; the function it gives waits
    (10 s at most) for the event of the next line it prints, and has the process as
    ``.proc``."""
    proc = subprocess.Popen(
        [EXE, "--root", str(root), "logs", "-f", "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: queue.Queue[str] = queue.Queue()
    # A thread reads: poll() on the pipe missed lines already in the reader's buffer.
    reader = threading.Thread(target=lambda: [said.put(x) for x in proc.stdout], daemon=True)
    reader.start()

    def next_line() -> str:
        try:
            return json.loads(said.get(timeout=10))["event"]
        except queue.Empty:
            raise AssertionError("logs -f printed nothing within 10 s") from None

    next_line.proc = proc
    try:
        yield next_line
    finally:
        proc.kill()
        proc.wait(timeout=10)
        reader.join(timeout=10)


@pytest.fixture
def follower(kb):
    """:func:`logs_following` on the KB's log, which holds one line ("first")."""
    log = kb.state / "logs" / "reviewq.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(_line("first") + "\n")
    with logs_following(kb.root) as next_line:
        yield log, next_line


def test_logs_follows_a_log_truncated_in_place(follower):
    # OPERATIONS §5 rotates with copytruncate: the follower kept its old offset, past the
    # end of the emptied file, and printed nothing more.
    log, next_line = follower
    assert next_line() == "first"
    shutil.copy(log, log.with_suffix(".jsonl.1"))
    with open(log, "r+") as f:
        f.truncate(0)
    with open(log, "a") as f:
        # Shorter than what was read: found at any look. A line of the very same length is
        # found only by its mtime, from a look taken before the write, which a loaded
        # machine can miss: this test flaked so.
        f.write(_line("new") + "\n")
    assert next_line() == "new"


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="logrotate is not installed")
@pytest.mark.parametrize("compress", [["compress", "delaycompress"], ["compress"], []])
def test_logs_follow_shows_the_lines_copytruncate_took_into_the_copy(follower, tmp_path, compress):
    # The follower looks every 0.5 s: what the writers wrote since its last look was
    # copied into reviewq.jsonl.1 (or .1.gz) and emptied out of the log, and `logs -f`
    # read on from the start of the emptied file: every rotation passed over those lines
    # in silence (475 of 3,000 lines a writer wrote 4 ms apart, 6 rotations).
    log, next_line = follower
    assert next_line() == "first"
    rotate = logrotate_of(log, tmp_path, "copytruncate", *compress)
    with held(next_line):
        _write(log, "since the last look")
        rotate()
        _write(log, "new")  # shorter than what was read: found at any look
    assert [next_line(), next_line()] == ["since the last look", "new"]


@contextlib.contextmanager
def held(next_line: Callable[[], str]) -> Iterator[None]:
    """The follower held still between two looks (SIGSTOP, as a pager not read holds it
    in its write), let go at the end."""
    os.kill(next_line.proc.pid, signal.SIGSTOP)
    os.waitpid(next_line.proc.pid, os.WUNTRACED)
    try:
        yield
    finally:
        os.kill(next_line.proc.pid, signal.SIGCONT)


def _write(log: Path, *events: str) -> None:
    with open(log, "a") as f:
        f.writelines(_line(e) + "\n" for e in events)


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="logrotate is not installed")
@pytest.mark.parametrize("compress", [["compress"], []])
def test_logs_follow_shows_the_lines_of_two_rotations_between_two_looks(
    follower, tmp_path, compress
):
    # A follower held (a pager not read) across two rotations read the rest of the copy
    # it had been reading (.2) and passed over, in silence, the whole newer one (.1).
    log, next_line = follower
    assert next_line() == "first"
    rotate = logrotate_of(log, tmp_path, "copytruncate", *compress)
    with held(next_line):
        _write(log, "since the last look")
        rotate()
        _write(log, "between the rotations")
        rotate()
        _write(log, "new")
    assert [next_line(), next_line(), next_line()] == [
        "since the last look",
        "between the rotations",
        "new",
    ]


@pytest.mark.skipif(shutil.which("logrotate") is None, reason="logrotate is not installed")
def test_logs_follow_finds_a_copytruncate_the_log_has_grown_past_since(follower, tmp_path):
    # Held while the emptied log grew past the place read up to, the follower took it for
    # the same file grown: it read on from that place, in the middle of a line (said as a
    # damaged line), and passed over the copied line and the first ones after it.
    log, next_line = follower
    assert next_line() == "first"
    rotate = logrotate_of(log, tmp_path, "copytruncate")
    with held(next_line):
        _write(log, "since the last look")
        rotate()
        _write(log, "new, longer than what was read", "and more")
    assert [next_line(), next_line(), next_line()] == [
        "since the last look",
        "new, longer than what was read",
        "and more",
    ]


def test_logs_follow_says_lines_copytruncate_took_into_a_copy_it_cannot_read(tmp_path):
    from orchestrator import logs

    log = tmp_path / "reviewq.jsonl"
    log.write_text(_line("first") + "\n")
    looks = []

    def wait() -> None:  # between two looks: a line, then copied as zstd and emptied
        looks.append(1)
        if len(looks) == 1:
            with open(log, "a") as f:
                f.write(_line("since the last look") + "\n")
            (tmp_path / "reviewq.jsonl.1.zst").write_bytes(b"(zstd)")
            with open(log, "r+") as f:
                f.truncate(0)
            log.write_text(_line("new") + "\n")

    said: list[str] = []
    got = logs.entries(log, logs.Wanted(), said.append, follow=True, wait=wait)
    assert [next(got)[0]["event"], next(got)[0]["event"]] == ["first", "new"]
    assert said == [
        f"warning: {log}: emptied in place (logrotate's copytruncate): the lines written "
        "since the last look are in its rotated copy, not found (`reviewq logs --since` "
        "reads the copies)"
    ]


def test_logs_follow_reads_a_copy_being_compressed_once(tmp_path):
    # `compress` writes reviewq.jsonl.1.gz beside reviewq.jsonl.1 and removes the .1 once
    # the .gz is whole: a follower held across two rotations that looked in between read
    # the newer copy twice, each of its lines shown twice.
    from orchestrator import logs

    log = tmp_path / "reviewq.jsonl"
    log.write_text(_line("first") + "\n")

    def rotated() -> Path:  # copytruncate, then compress: the copy not removed yet
        copy, done = tmp_path / "reviewq.jsonl.1", tmp_path / "reviewq.jsonl.1.gz"
        if done.exists():
            done.rename(tmp_path / "reviewq.jsonl.2.gz")
        copy.write_bytes(log.read_bytes())
        with open(log, "r+") as f:
            f.truncate(0)
        done.write_bytes(gzip.compress(copy.read_bytes()))
        return copy

    looks = []

    def wait() -> None:  # held across two rotations, the second one's copy compressing
        looks.append(1)
        if len(looks) == 1:
            _write(log, "since the last look")
            rotated().unlink()  # compressed
            _write(log, "between the rotations")
            rotated()
            _write(log, "new")

    got = logs.entries(log, logs.Wanted(), print, follow=True, wait=wait)
    events = [next(got)[0]["event"] for _ in range(4)]
    assert events == ["first", "since the last look", "between the rotations", "new"]


def test_logs_follows_a_log_replaced_by_a_new_file(follower):
    log, next_line = follower
    assert next_line() == "first"
    os.rename(log, log.with_suffix(".jsonl.1"))
    log.write_text(_line("new file") + "\n")
    assert next_line() == "new file"


def test_a_line_read_while_it_is_written_is_given_once_whole(tmp_path):
    # Before, each half was read as a line of its own: neither parsed, and the line was
    # never shown.
    from orchestrator.logs import lines

    log = tmp_path / "reviewq.jsonl"
    text = _line("halves")
    log.write_text(text[:10])
    looks = []

    def wait() -> None:  # the writer finishes the line while the reader waits
        looks.append(1)
        assert len(looks) < 3, "the reader kept waiting"
        with open(log, "a") as f:
            f.write(text[10:] + "\n")

    assert next(lines(log, follow=True, wait=wait)) == text + "\n"
    assert looks == [1]


def test_a_last_line_read_while_it_is_written_is_waited_for_without_follow(tmp_path):
    """A line longer than a page is copied into the file page by page: `reviewq logs`
    run meanwhile read half of it, and said it as a damaged line, cut short by a crash.
    One that a crash did cut short is given as it is after a few looks."""
    from orchestrator import logs

    log = tmp_path / "reviewq.jsonl"
    text = _line("halves")
    log.write_text(_line("first") + "\n" + text[:10])
    looks = []

    def wait() -> None:  # the writer's next page
        looks.append(1)
        with open(log, "a") as f:
            f.write(text[10:] + "\n")

    assert list(logs.lines(log, wait=wait)) == [_line("first") + "\n", text + "\n"]
    assert looks == [1]
    looks.clear()
    log.write_text(text[:10])  # cut short for good
    assert list(logs.lines(log, wait=lambda: looks.append(1))) == [text[:10]]
    assert len(looks) == logs._UNFINISHED_LOOKS


def test_a_log_copied_and_emptied_under_a_read_is_said_so_not_as_a_damaged_line(tmp_path):
    """logrotate's `copytruncate` while `reviewq logs` read (a large log takes seconds):
    the half line it had read, whole in the copy, was said as a damaged line, cut short
    by a crash."""
    from orchestrator import logs

    log = tmp_path / "reviewq.jsonl"
    text = _line("halves")
    log.write_text(_line("first") + "\n" + text[:10])
    looks = []

    def wait() -> None:  # the writer ends its line, then logrotate copies and empties
        looks.append(1)
        if len(looks) == 1:
            with open(log, "a") as f:
                f.write(text[10:] + "\n")
            shutil.copy(log, log.with_suffix(".jsonl.1"))
            with open(log, "r+") as f:
                f.truncate(0)

    said: list[str] = []
    got = logs.entries(log, logs.Wanted(), said.append, wait=wait)
    assert [rec["event"] for rec, _ in got] == ["first"]
    assert len(said) == 1 and "damaged" not in said[0], said
    assert said[0].endswith(
        "reviewq.jsonl: emptied while read (logrotate's copytruncate): the lines after the "
        "last one shown are in its rotated copy (`reviewq logs --since` reads it too)"
    )
    assert log.with_suffix(".jsonl.1").read_text().endswith(text + "\n")  # whole there


def test_lines_written_to_a_log_just_before_it_was_renamed_away_are_shown(tmp_path, monkeypatch):
    # The follower read to the end of the file, then found a new file by its name and
    # switched to it: what the writer put in the old one in between was never shown.
    from orchestrator import logs

    log = tmp_path / "reviewq.jsonl"
    log.write_text(_line("first") + "\n")
    real_end_of, rotated = logs._end_of, []

    def end_of(path):  # between the follower's read and its look at the name: a rotation
        if not rotated:
            rotated.append(1)
            with open(log, "a") as f:
                f.write(_line("last in the old file") + "\n")
            os.rename(log, log.with_suffix(".jsonl.1"))
            log.write_text(_line("new file") + "\n")
        return real_end_of(path)

    def wait() -> None:
        raise AssertionError("the reader waited with lines to read")

    monkeypatch.setattr(logs, "_end_of", end_of)
    follow = logs.lines(log, follow=True, wait=wait)
    said = [json.loads(next(follow))["event"] for _ in range(3)]
    assert said == ["first", "last in the old file", "new file"]


def test_a_log_line_that_is_json_but_not_an_object_is_passed_over(kb, run_cli):
    log = kb.state / "logs" / "reviewq.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("[1, 2]\n" + _line("kept") + "\n")
    res = run_cli("logs")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.split()[2] == "kept"


def test_lines_of_odd_shape_are_shown_each_on_one_line(kb, run_cli):
    """A null or list level ended the command in "internal error" and hid every line
    after it; a time with no fraction of a second ended in "ZZ"; a file name holding a
    line break printed a forged log line of its own."""
    log = kb.state / "logs" / "reviewq.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    forged = "x\n2026-11-26T00:00:00.000Z error   job.failed  job_id=7 reason=FORGED\n.md"
    log.write_text(
        json.dumps({"level": None, "event": "odd.level"})
        + "\n"
        + json.dumps({"level": ["a"], "event": "list.level"})
        + "\n"
        + json.dumps({"timestamp": "2026-11-26T04:12:29Z", "level": "info", "event": "whole"})
        + "\n"
        + json.dumps({"level": "warning", "event": "kb.file_skipped", "path": forged})
        + "\n"
        + _line("kept")
        + "\n"
    )
    res = run_cli("logs")
    assert res.exit_code == 0, res.stderr
    out = res.stdout.splitlines()
    assert len(out) == 5, res.stdout
    assert "odd.level" in out[0] and "list.level" in out[1]
    assert out[2].startswith("2026-11-26T04:12:29Z info")
    assert "FORGED" in out[3] and not any(x.startswith("2026-11-26T00:00") for x in out)
    assert out[4].split()[2] == "kept"


def test_a_retried_send_keeps_the_jobs_attempt_in_its_log_line(tmp_path):
    """queue.retrying logged its own try count as `attempt`, over the job's attempt the
    task had bound: `reviewq logs --job N` showed attempt 3 during attempt 1."""
    from types import SimpleNamespace

    from orchestrator import logs
    from workers.queues import said_retrying

    logs.configure(tmp_path)
    failed = SimpleNamespace(exception=lambda: ConnectionError("refused"))
    with logs.bound(job_id=1, attempt=1):
        said_retrying(SimpleNamespace(attempt_number=3, outcome=failed))
    [line] = [
        json.loads(x)
        for x in (tmp_path / "logs" / "reviewq.jsonl").read_text().splitlines()
        if '"queue.retrying"' in x
    ]
    assert (line["job_id"], line["attempt"], line["try"]) == (1, 1, 3)


def test_following_the_log_of_a_state_folder_that_is_not_there_is_refused(kb, run_cli):
    res = run_cli("--state", str(kb.root / "typo"), "logs", "-f")
    assert res.exit_code == 1
    assert res.stderr.splitlines() == [
        f"error: {kb.root / 'typo'}: no state folder here (is --state right?)"
    ]


def test_a_dict_list_or_null_value_is_shown_as_json(kb, run_cli):
    """Dicts, lists and nulls were shown as Python wrote them: `counts={'fresh': 0}`,
    `reasons=['exited 3']`, `cost_usd=None`; the log holds JSON, and `jq` recipes (and a
    person) read them as such."""
    log = kb.state / "logs" / "reviewq.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    rec = {
        "timestamp": "2026-11-23T01:02:03.456Z",
        "level": "info",
        "event": "sweep.enqueued",
        "counts": {"missing-review": 3, "fresh": 0},
        "reasons": ["exited 3 after 0.0 s", "it's"],
        "cost_usd": None,
        "fix": True,
        "note_path": "kb/notes/a b.md",
    }
    log.write_text(json.dumps(rec) + "\n")
    res = run_cli("logs")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.split("sweep.enqueued  ", 1)[1] == (
        'counts={"missing-review": 3, "fresh": 0} reasons=["exited 3 after 0.0 s", "it\'s"] '
        "cost_usd=null fix=true note_path=kb/notes/a b.md\n"
    )


def test_a_line_about_another_job_does_not_carry_the_bound_jobs_attempt(tmp_path):
    """A follow-up queued while job 94's attempt 1 was finalized logged `fix.queued
    job_id=104 … attempt=1`: `reviewq logs --job 104` showed an attempt of a job that had
    none yet. The bound attempt belongs to the bound job only."""
    from orchestrator import logs

    logs.configure(tmp_path)
    with logs.bound(job_id=94, attempt=1, reviewer="r"):
        logs.get().info("fix.queued", job_id=104, source_job_id=94)
        logs.get().info("job.finalized")
        logs.get().info("job.created", job_id=105, attempt=0)
    lines = [json.loads(x) for x in (tmp_path / "logs" / "reviewq.jsonl").read_text().splitlines()]
    got = {x["event"]: (x["job_id"], x.get("attempt"), x.get("reviewer")) for x in lines}
    assert got == {
        "fix.queued": (104, None, "r"),
        "job.finalized": (94, 1, "r"),
        "job.created": (105, 0, "r"),
    }


def test_a_commands_stderr_line_keeps_the_level_of_an_error():
    """Off a terminal (cron mail) every log line of a command read `warning:`, an error
    such as followup.failed too: the person reading the mail lost its level."""
    from orchestrator.logs import _warning_line

    line = _warning_line(None, "error", {"event": "followup.failed", "level": "error", "job_id": 3})
    assert line == "error: followup.failed  job_id=3"
    line = _warning_line(None, "warning", {"event": "fix.skipped", "level": "warning"})
    assert line == "warning: fix.skipped"


def test_a_fatal_level_is_critical_on_a_commands_stderr():
    """`fatal` (logging's other name for critical, as a writer of another make spells it)
    was said as a `warning:` line: the cron mail lost the gravest level of all."""
    from orchestrator.logs import _warning_line

    for level in ("FATAL", "fatal", "Critical"):
        line = _warning_line(None, "critical", {"event": "store.lost", "level": level})
        assert line == "error: store.lost"


def _night_whose_job_failed(kb) -> None:  # noqa: ANN001 - a KBBuilder
    """A real sweep's night of one note whose agent writes nothing: its job failed."""
    from .test_cycles_integration import profile
    from .test_queue_integration import FAST_QUEUE

    kb.gate("frontmatter/has-description", ["description"])
    kb.note("a")
    kb.write("reviewq.toml", profile("fake", FAKE_MODE="nothing") + FAST_QUEUE)
    sweep = subprocess.run(
        [EXE, "--root", str(kb.root), "sweep", "--all-gates", "--reviewer", "fake"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sweep.returncode == 1 and "failed job" in sweep.stdout, sweep.stderr


def test_the_went_wrong_recipe_shows_why_a_job_failed(kb):
    """OPERATIONS' "everything that went wrong tonight" jq recipe picked `reason` only: a
    job that failed its attempts, a retry and a reviewer failure log `reasons`, so each
    such line read `"reason": null`, a failure with no why."""
    jq = shutil.which("jq")
    if jq is None:
        pytest.skip("jq is not installed")
    _night_whose_job_failed(kb)
    docs = (Path(__file__).parents[1] / "docs" / "OPERATIONS.md").read_text().splitlines()
    recipe = docs[docs.index("# everything that went wrong tonight") + 1]
    assert recipe.startswith("jq ") and recipe.endswith(" $L"), recipe
    res = subprocess.run(
        [jq, *shlex.split(recipe)[1:-1], str(kb.state / "logs" / "reviewq.jsonl")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    rows = [json.loads(x) for x in res.stdout.splitlines()]
    failed = [r for r in rows if r["event"] in ("job.failed", "job.retrying")]
    assert failed, rows
    for r in failed:
        assert "without writing bundle-output.md" in json.dumps(r), r


def test_an_event_is_matched_in_any_case_and_by_its_dotted_words(kb, run_cli):
    """`logs --event JOB.FAILED`, and `--event attempt` (every attempt's lines, as a person
    says it), showed nothing and exited 0 after a night whose jobs failed: matched exactly,
    case and dot included. A real sweep's log, its crashing agent failing the job."""
    _night_whose_job_failed(kb)

    def events(*args: str) -> list[str]:
        res = run_cli("logs", "--json", *args)
        assert res.exit_code == 0, res.stderr
        return [json.loads(x)["event"] for x in res.stdout.splitlines()]

    night = events()
    failed = [e for e in night if e == "job.failed"]
    attempts = [e for e in night if e.startswith("attempt.")]
    assert failed and len(set(attempts)) > 1, night
    for given, expected in (
        ("job.failed", failed),
        ("JOB.FAILED", failed),
        ("Job.Failed", failed),
        ("attempt.", attempts),
        ("attempt", attempts),
        ("ATTEMPT", attempts),
        # The help's own words for them ("each attempt.* event"), typed as a shell's glob:
        # matched as text, they showed nothing, exit 0.
        ("attempt.*", attempts),
        ("*", night),
    ):
        assert events("--event", given) == expected, given
    # Dotted words, not any text an event begins with: a name of no event (U95).
    res = run_cli("logs", "--event", "attempt.start")
    assert res.exit_code == 2 and "did you mean attempt.started" in res.stderr, res.stderr


def test_an_event_that_matched_nothing_is_said_in_one_line(kb, run_cli):
    """A `logs --event` of an event reviewq writes that showed nothing exited 0 in
    silence, a quiet night or a name misspelt alike. One line says which it was: an event
    no line of the log is, or one the other filters left out."""
    _night_whose_job_failed(kb)

    def said(*args: str) -> str:
        res = run_cli("logs", "--event", *args)
        assert (res.exit_code, res.stdout, res.stderr.count("\n")) == (0, "", 1), res
        return res.stderr

    assert said("fix.applied").startswith(
        "warning: --event fix.applied: no line of the log read is that event ("
    )
    assert said("job.failed", "--level", "critical") == (
        "warning: --event job.failed: no line of that event matched the other filters\n"
    )
    shown = run_cli("logs", "--event", "job.failed")
    assert shown.stdout and not shown.stderr


def test_an_event_reviewq_does_not_write_is_bad_usage_naming_the_nearest(kb, run_cli):
    """A misspelt `logs --event escalation.raisd` was a warning and exit 0, a quiet night
    to a script, and `-f` waited for good on it; the one place listing the events was
    docs/OPERATIONS.md, which an installed reviewq does not have. A name reviewq does not
    write and no line of the log (its rotated copies too) is, is bad usage: exit 2 at
    once, naming the nearest events, or their families. A line of such a name (another
    release's event) is shown."""
    _night_whose_job_failed(kb)
    usage = "error: reviewq logs: --event {!r}: reviewq writes no such event and no line of the log is one ({}) (see reviewq logs --help)\n"  # noqa: E501
    res = run_cli("logs", "--event", "escalation.raisd")
    assert (res.exit_code, res.stdout) == (2, ""), res
    assert res.stderr == usage.format(
        "escalation.raisd",
        "did you mean escalation.raised, escalation.skipped, escalation.report_failed?",
    )
    res = run_cli("logs", "--event", "zzz")
    assert res.exit_code == 2 and "(its events are under acceptance., attempt., " in res.stderr
    # Following, it is said at once rather than waited on for good.
    follow = reviewq_process(
        "--root", str(kb.root), "logs", "-f", "--event", "job.faild", timeout=30
    )
    assert follow.returncode == 2 and "did you mean job.failed" in follow.stderr, follow.stderr
    # An event of another release, in a rotated copy only: shown there, as U94 has it.
    copy = kb.state / "logs" / "reviewq.jsonl.1"
    copy.write_text(_line("queue.renamed_since") + "\n")
    res = run_cli("logs", "--event", "queue.renamed_since")
    assert res.exit_code == 0 and "logrotate left 1 older copy" in res.stderr, res.stderr
    res = run_cli("logs", "--event", "queue.renamed_since", "--since", "2026-11-22")
    assert res.exit_code == 0 and "queue.renamed_since" in res.stdout, res


def test_a_split_jobs_log_begins_with_the_split_that_made_it(kb, run_cli):
    """`reviewq logs --job 44` of a job a split made began with its first dispatch, from
    nowhere: the job.split line naming it (`into=[44, 45]`) was only job 43's, while a fix
    job's log begins with the fix.queued that made it."""
    from orchestrator import logs

    logs.configure(kb.state)
    reasons = ["deadline of 3 s reached with no output; the process group was killed"]
    logs.get().warning("job.split", job_id=43, attempt=1, into=[44, 45], reasons=reasons)
    logs.get().info("attempt.dispatched", job_id=44, attempt=1, reviewer="slow")
    logs.get().info("attempt.dispatched", job_id=45, attempt=1, reviewer="slow")
    for job, split in ((44, True), (45, True), (43, True), (46, False)):
        shown = run_cli("logs", "--job", str(job))
        assert shown.exit_code == 0, shown.stderr
        assert ("job.split " in shown.stdout) is split, (job, shown.stdout)
    assert "job_id=45" not in run_cli("logs", "--job", "44").stdout


def test_a_rereview_jobs_log_holds_the_lines_that_made_and_withdrew_it(kb, run_cli):
    """`reviewq logs --job 107` of a re-review that the morning shows failed ("withdrawn:
    it re-reviews fix job 94, which was not written to the KB…") left out the one line
    saying so, `fix.rereview_withdrawn` (`jobs=[107]`), and the `fix.rereview` that made
    it; a count named `jobs` (a sweep's) is no job's."""
    from orchestrator import logs

    logs.configure(kb.state)
    logs.get().info("fix.rereview", job_id=94, jobs=[107, 108], skipped=[])
    logs.get().info("fix.rereview_withdrawn", job_id=94, note_path="kb/notes/a.md", jobs=[107])
    logs.get().info("sweep.enqueued", sweep="nightly", jobs=107, pairs=300)
    shown = run_cli("logs", "--job", "107")
    assert shown.exit_code == 0, shown.stderr
    events = [line.split()[2] for line in shown.stdout.splitlines()]
    assert events == ["fix.rereview", "fix.rereview_withdrawn"], shown.stdout
    assert "fix.rereview_withdrawn" not in run_cli("logs", "--job", "108").stdout


def test_a_hot_path_line_skips_structlogs_chain_and_reads_as_the_chain_writes_it(
    tmp_path, monkeypatch
):
    """The control process's lines went through structlog's bound logger, the stdlib
    record and the formatter's copy of it, several a job: written directly while the set-up
    is reviewq's own, each line is the one the chain writes, and capture_logs (or any
    other handler on the root logger) still gets every line the chain's way."""
    import logging

    import structlog
    from structlog.testing import capture_logs

    from orchestrator import logs

    logs.configure(tmp_path, process="control", stderr_level="WARNING")
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, "_reviewq", False)]
    formatted = []
    chain = structlog.stdlib.ProcessorFormatter.format
    monkeypatch.setattr(
        structlog.stdlib.ProcessorFormatter,
        "format",
        lambda self, record: formatted.append(record) or chain(self, record),
    )
    monkeypatch.setenv("HOT_PATH_TOKEN", "s3cr3t-value")

    def say() -> None:
        with logs.bound(job_id=7, attempt=2, reviewer="r"):
            logs.get().info("attempt.dispatched", job_id=7, note="é s3cr3t-value", d={"a": [1]})
            logs.get().info("fix.queued", job_id=8)
            logs.get().warning("job.retrying", reasons=["x"], cost_usd=None)

    others = [h for h in root.handlers if h not in ours]  # pytest's
    say()  # the chain's way: pytest's handlers are on the root logger
    assert formatted
    formatted.clear()
    monkeypatch.setattr(root, "handlers", ours)
    say()
    assert formatted == []
    log = [json.loads(x) for x in (tmp_path / "logs" / "reviewq.jsonl").read_text().splitlines()]
    for line in log:
        line.pop("timestamp")
    assert log[:3] == log[3:]
    assert [list(x) for x in log[:3]] == [list(x) for x in log[3:]]  # the keys' order too
    assert log[0]["note"] == "é [redacted]" and log[0]["process"] == "control"
    assert log[1] == {
        "job_id": 8,
        "reviewer": "r",
        "event": "fix.queued",
        "level": "info",
        "process": "control",
    }
    with capture_logs() as captured:
        logs.get().info("job.finalized", job_id=9)
    assert [c["event"] for c in captured] == ["job.finalized"]
    assert "job.finalized" not in (tmp_path / "logs" / "reviewq.jsonl").read_text()
    assert others  # the first pass went through pytest's handlers, as every test's lines do


def test_a_hot_path_line_reaches_the_log_file_without_a_record_and_a_full_disk_is_said_once(
    tmp_path, monkeypatch, capsys
):
    """A line written directly still made a stdlib record for the file's handler, a
    third of what was left of its cost: the file takes the rendered line itself, and a
    write that fails is said once on stderr (as a record's was) until one goes through."""
    import errno
    import io
    import logging

    from orchestrator import logs

    logs.configure(tmp_path, process="control", stderr_level="WARNING")
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, "_reviewq", False)]
    monkeypatch.setattr(root, "handlers", ours)
    records = []
    real = logging.LogRecord
    monkeypatch.setattr(logging, "LogRecord", lambda *a, **k: records.append(a) or real(*a, **k))
    logs.get().info("attempt.started", job_id=1, attempt=1)
    assert records == []
    [fh] = [h for h in ours if isinstance(h, logs._LogFile)]
    working = fh.stream

    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    fh.stream = Full()
    logs.get().info("attempt.ended", job_id=1, attempt=1)
    logs.get().info("job.finalized", job_id=1, attempt=1)
    fh.stream = working
    logs.get().info("attempt.started", job_id=2, attempt=1)
    fh.stream = Full()
    logs.get().info("attempt.ended", job_id=2, attempt=1)
    fh.stream = working
    said = [x for x in capsys.readouterr().err.splitlines() if "cannot write the log" in x]
    assert (
        said == [f"warning: {fh.baseFilename}: cannot write the log (No space left on device)"] * 2
    )
    events = [
        json.loads(x)["event"]
        for x in (tmp_path / "logs" / "reviewq.jsonl").read_text().splitlines()
    ]
    assert events == ["attempt.started", "attempt.started"]


def test_a_damaged_line_is_said_and_the_line_written_after_it_is_shown(kb, run_cli):
    """A line cut short (a writer killed in its write, a full disk) had the next
    writer's whole line appended to it, and a power loss leaves NULs before the first
    line after the boot: both lines were passed over in silence, with the damage."""
    log = kb.state / "logs" / "reviewq.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(
        _line("first")
        + "\n"
        + _line("cut short")[:30]
        + _line("after the cut")
        + "\nnot json\n"
        + "\0" * 100
        + _line("after the power loss")
        + "\n"
        + "\0" * 50
    )
    res = run_cli("logs")
    assert res.exit_code == 0, res.stderr
    said = [line.split()[2] for line in res.stdout.splitlines()]
    assert said == ["first", "after", "after"], res.stdout
    assert "after the cut" in res.stdout and "after the power loss" in res.stdout
    warnings = res.stderr.splitlines()
    assert len(warnings) == 4 and all("a damaged line passed over" in w for w in warnings)
    assert "not json" in warnings[1] and "100 NUL bytes" in warnings[2]
    res = run_cli("logs", "--json")
    assert [json.loads(x)["event"] for x in res.stdout.splitlines()][1:] == [
        "after the cut",
        "after the power loss",
    ]


def test_a_line_of_garbage_neither_ends_the_command_nor_holds_it_for_minutes(
    kb, run_cli, monkeypatch
):
    """Garbage nested deeper than Python's recursion limit ended `reviewq logs` in
    "internal error", every line after it unseen; and each `{"` of a damaged line was
    tried on a copy of the rest of it: 12 s for 1.5 MB of `x{"`, 127 s for 3 MB. The
    reads are counted, not timed: only a `{"key":` is tried."""
    from orchestrator import logs

    log = kb.state / "logs" / "reviewq.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text('{"a":' * 5000 + "\n" + '{"a": ' * 5000 + _line("after") + "\n")
    res = run_cli("logs")
    assert res.exit_code == 0, res.stderr
    assert [line.split()[2] for line in res.stdout.splitlines()] == ["after"]
    assert len(res.stderr.splitlines()) == 2 and "internal error" not in res.stderr
    tried, whole = [], logs._whole
    monkeypatch.setattr(logs, "_whole", lambda text, at: tried.append(at) or whole(text, at))
    garbage = 'x{"' * 500_000 + _line("after")
    assert logs.record(garbage) == (json.loads(_line("after")), _line("after"))
    assert tried == [0, len(garbage) - len(_line("after"))]  # not each of its 500,000 `{"`


def test_the_nuls_after_a_line_cut_short_by_a_power_loss_are_counted(kb, run_cli):
    """A power loss leaves NULs from the middle of a line on, where the blocks after the
    last one written were: the warning quoted them, 60 `\\x00`s, not their count."""
    log = kb.state / "logs" / "reviewq.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(_line("cut short")[:30] + "\0" * 4000 + _line("after the boot") + "\n")
    res = run_cli("logs")
    assert res.exit_code == 0 and "after the boot" in res.stdout
    (said,) = res.stderr.splitlines()
    assert said.endswith(f": {_line('cut short')[:30]}, then 4000 NUL bytes (a power loss)")


def test_a_blank_line_is_passed_over_without_a_word(kb, run_cli):
    """It was said as a damaged line of "0 NUL bytes (a power loss)": nothing was lost
    in it, and no power loss left it."""
    log = kb.state / "logs" / "reviewq.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(_line("first") + "\n\n  \n" + _line("second") + "\n")
    res = run_cli("logs")
    assert res.exit_code == 0 and res.stderr == ""
    assert [line.split()[2] for line in res.stdout.splitlines()] == ["first", "second"]


@pytest.mark.parametrize(
    ("name", "value", "known"),
    [
        ("REVIEWQ_STDERR_LEVEL", "verbose", "DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("REVIEWQ_LOG_FORMAT", "text", "json, console"),
    ],
)
def test_a_log_setting_that_names_nothing_known_is_said_once(
    monkeypatch, capsys, tmp_path, name, value, known
):
    """Ignored in silence: a mistyped level left every info line on the journal, a
    mistyped format printed JSON, and nothing said why."""
    from orchestrator import logs

    monkeypatch.setenv(name, value)
    monkeypatch.delitem(logs._configured, f"said {name}", raising=False)
    logs.configure(tmp_path, process="test")
    logs.configure(tmp_path, stderr_level="ERROR", process="test")
    said = capsys.readouterr().err.splitlines()
    assert said == [f"warning: {name}={value} is none of {known}: ignored"]


def test_warn_is_a_stderr_level_and_a_format_is_read_in_any_case(monkeypatch, tmp_path):
    import logging

    from orchestrator import logs

    monkeypatch.setenv("REVIEWQ_STDERR_LEVEL", "warn")
    monkeypatch.setenv("REVIEWQ_LOG_FORMAT", "Console")
    logs.configure(tmp_path, stderr_level="INFO", process="test")
    (stderr,) = [
        h for h in logging.getLogger().handlers if getattr(h, "stream", None) is sys.stderr
    ]
    assert stderr.level == logging.WARNING
    assert "ConsoleRenderer" in repr(stderr.formatter.processors)


def test_job_says_only_the_damaged_lines_that_name_the_job_and_counts_the_others(kb, run_cli):
    """`--job 7` said every damaged line of the file, other jobs' and the NULs of a power
    loss: a morning's look at one job read as a file full of its damage."""
    log = kb.state / "logs" / "reviewq.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)

    def about(job: int, event: str, **more: object) -> str:
        at = {"timestamp": "2026-11-23T01:02:03.456Z", **more}
        return json.dumps({"job_id": job, "event": event, "level": "info", **at})

    log.write_text(
        about(7, "job.created")
        + "\n"
        + about(8, "attempt.started", timestamp="2026-11-07T07:07:07.777Z")[:70]
        + "\n"
        + about(7, "attempt.started")[:30]
        + about(7, "attempt.ended")
        + "\n"
        + json.dumps({"event": "fix.rereview", "jobs": [5, 7, 9]})[:40]
        + "\n"
        + "\0" * 40
        + about(8, "job.finalized")
        + "\n"
    )
    res = run_cli("logs", "--job", "7")
    assert res.exit_code == 0
    assert [line.split()[2] for line in res.stdout.splitlines()] == [
        "job.created",
        "attempt.ended",
    ]
    warnings = res.stderr.splitlines()
    assert len(warnings) == 3, res.stderr
    assert '{"job_id": 7, "event": "attemp' in warnings[0]
    assert '"jobs": [5, 7' in warnings[1]
    assert warnings[2].endswith(
        "reviewq.jsonl: 2 damaged line(s) passed over that name no job 7 "
        "(the same command without --job says each)"
    )
    assert len(run_cli("logs").stderr.splitlines()) == 4  # without --job, each


def test_a_job_the_record_does_not_hold_is_refused_not_shown_as_a_quiet_one(kb, run_cli):
    """`logs --job 99999`, a number mistyped at 7 a.m., printed nothing and exited 0, as a
    job with nothing logged would: CONTRACT refuses a job that does not exist (exit 1)."""
    from orchestrator.state.store import Store

    log = kb.state / "logs" / "reviewq.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text(json.dumps({**json.loads(_line("job.created")), "job_id": 3}) + "\n")
    Store.open(kb.state).close()  # a record that holds no job (put back from a backup)
    res = run_cli("logs", "--job", "7")
    assert (res.exit_code, res.stdout) == (1, "")
    assert res.stderr == f"error: --job 7: no review job 7 in {kb.state / 'state.db'}\n"
    # Lines of a job the record lost are still shown, and -f may wait for one to come.
    assert run_cli("logs", "--job", "3").stdout.count("job.created") == 1
    (kb.state / "state.db").unlink()  # a worker's own folder: no record to ask
    assert run_cli("logs", "--job", "7").exit_code == 0
