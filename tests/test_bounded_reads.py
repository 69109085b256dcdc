"""Reads whose size an agent, a server or the record decides are bounded: memory stays
flat however large the file, the answer or the table grows."""

from __future__ import annotations

import json
import sqlite3
import threading
import tracemalloc
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.review.export import export
from orchestrator.state.store import ReviewRecord, Store

BIG = 40 * 1024 * 1024


def peak_bytes(fn) -> tuple[object, int]:
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def sqlite_steps(conn: sqlite3.Connection, fn: Callable[[], object]) -> Counter[str]:
    """SQLite's steps (of 100 VM instructions) while ``fn`` runs, by statement: rows read
    show as steps, whatever the time a loaded machine gives them."""
    steps: Counter[str] = Counter()
    statement = [""]

    def tick() -> int:
        steps[statement[0]] += 1
        return 0

    conn.set_trace_callback(lambda sql: statement.__setitem__(0, sql))
    conn.set_progress_handler(tick, 100)
    try:
        fn()
    finally:
        conn.set_progress_handler(None, 0)
        conn.set_trace_callback(None)
    return steps


def answer_and_steps(conn: sqlite3.Connection, fn: Callable[[], object]) -> tuple:
    """What ``fn`` returns, and the SQLite steps it took in all (:func:`sqlite_steps`)."""
    seen: list = []
    steps = sqlite_steps(conn, lambda: seen.append(fn()))
    return seen[0], sum(steps.values())


def a_job(store: Store) -> int:
    """A completed job of a year ago, for the attempts a test adds to hang on."""
    return store.conn.execute(
        "INSERT INTO review_jobs (status, model_partition, grouping, job_dir, created_at, "
        "updated_at) VALUES ('completed', 'm', 'note', 'jobs/j', '2026-01-01T00:00:00Z', "
        "'2026-01-01T00:00:00Z')"
    ).lastrowid


def big_file(path: Path, tail: bytes) -> Path:
    with path.open("wb") as f:
        f.truncate(BIG)  # sparse: costs no disk
        f.seek(BIG)
        f.write(tail)
    return path


def test_the_stderr_tail_reads_only_the_tail(tmp_path):
    from workers.attempt import _tail

    path = big_file(tmp_path / "stderr.log", b"\nfatal: the last line\n")
    text, peak = peak_bytes(lambda: _tail(path))
    assert text == "fatal: the last line"
    assert peak < 1024 * 1024


def test_the_telemetry_file_is_read_only_up_to_its_limit(tmp_path):
    from workers.reviewers.base import telemetry_from_file

    path = big_file(tmp_path / "telemetry.json", b"}")
    t, peak = peak_bytes(lambda: telemetry_from_file(path))
    assert t.num_turns is None
    assert peak < 4 * 1024 * 1024


def _passed(store: Store, notes: int, body: Callable[[int], str]) -> None:
    """``notes`` notes reviewed and passed in partition ``m``, note i's body ``body(i)``."""
    store.record_reviews(
        "m",
        [
            ReviewRecord(
                f"kb/notes/n{i}.md",
                f"---\ntitle: N{i}\n---\n{body(i)}\n",
                "prose/g",
                "kb/instructions/review-gates/prose/g.md",
                "prose",
                "gate",
                "PASS",
                "ok",
            )
            for i in range(notes)
        ],
    )


def test_export_streams_the_acceptance_rows(tmp_path):
    store = Store.open(tmp_path / "state")
    body = "x" * 200_000
    _passed(store, 100, lambda i: f"{body}{i}")
    res, peak = peak_bytes(lambda: export(store, tmp_path, "m"))
    assert res.files == 100
    # 100 notes of 200 kB: holding every row at once would take 20 MB.
    assert peak < 5 * 1024 * 1024
    store.close()


def test_export_reads_the_jobs_once_not_once_per_review(tmp_path):
    """Export asked, for each acceptance row, which fix wrote its text, with no index to
    answer: every job was read for every review (80 s of CPU for a KB of 1,775 notes).
    SQLite's steps for the export stay the same with 2,000 more jobs recorded."""
    store = Store.open(tmp_path / "state")
    _passed(store, 200, lambda i: f"body {i}")

    def steps() -> int:
        return sum(sqlite_steps(store.conn, lambda: export(store, tmp_path, "m")).values())

    before = steps()
    store.conn.executemany(
        "INSERT INTO review_jobs (status, model_partition, grouping, job_dir, created_at, "
        "updated_at) VALUES ('completed', 'm', 'note', ?, '2026-01-01T00:00:00Z', "
        "'2026-01-01T00:00:00Z')",
        [(f"jobs/review-job-x{i}",) for i in range(2000)],
    )
    after = steps()
    # Read once per row, the 2,000 jobs would be 400,000 more rows: ~40,000 more ticks.
    assert after < before + 500, (before, after)
    store.close()


def test_status_reads_the_open_attempts_alone_through_their_index(tmp_path):
    """status read the whole attempts table six times, a year of nights' worth (2.6
    million rows: 2.2 s of CPU). The agents running and the messages no worker has taken
    are open attempts, which the attempts_open index holds: those two reads stay the same
    with 5,000 more attempts ended."""
    from orchestrator.state.status import workers_heard

    store = Store.open(tmp_path / "state")
    job = store.conn.execute(
        "INSERT INTO review_jobs (status, model_partition, grouping, job_dir, created_at, "
        "updated_at) VALUES ('running', 'm', 'note', 'jobs/j', '2026-01-01T00:00:00Z', "
        "'2026-01-01T00:00:00Z')"
    ).lastrowid
    attempt = (
        "INSERT INTO attempts (job_id, attempt, outcome, worker, started_at, taken_at) "
        "VALUES (?, ?, ?, ?, '2026-01-01T00:00:00Z', NULL)"
    )
    store.conn.execute(attempt, (job, 1, "running", "here:1"))
    store.conn.execute(attempt, (job, 2, "dispatched", None))

    def open_reads() -> dict[str, int]:
        heard: list[dict] = []
        steps = sqlite_steps(store.conn, lambda: heard.append(workers_heard(store)))
        assert heard[0]["agents_running"] == 1 and heard[0]["untaken"] == 1, heard
        return {
            outcome: sum(n for sql, n in steps.items() if f"outcome = '{outcome}'" in sql)
            for outcome in ("running", "dispatched")
        }

    before = open_reads()
    store.conn.executemany(attempt, [(job, n, "completed", "here:1") for n in range(3, 5003)])
    after = open_reads()
    # A scan of the table is ~5,000 rows more: hundreds of steps each.
    assert all(after[o] <= before[o] + 5 for o in after), (before, after)
    store.close()


def test_status_reads_a_year_of_attempts_through_indexes(kb):
    """status read the whole attempts table four times after Z4 (the day's and total
    cost, the last heartbeat and recording, the last agent that did not start): 1.4 s of
    CPU on a year of nights (2.3 million attempts). Each of those reads but the total's
    stays the same with 5,000 more attempts ended; the total is summed from an index's
    pages, not the table's."""
    from orchestrator.state.status import status
    from orchestrator.state.workspace import Workspace

    ws = Workspace.open(kb.root)
    store = ws.store
    job = a_job(store)
    attempt = (
        "INSERT INTO attempts (job_id, attempt, outcome, worker, started_at, heartbeat_at, "
        "recorded_at, cost_usd) VALUES (?, ?, ?, 'here:1', ?, ?, ?, 0.5)"
    )
    old, new = "2026-01-01T00:00:00.000Z", "2099-01-01T00:00:00.000Z"
    store.conn.execute(attempt, (job, 1, "launch-failure", new, new, new))
    store.conn.execute(attempt, (job, 2, "finalized", new, new, new))
    total = "SELECT COALESCE(SUM(cost_usd), 0) FROM attempts"

    def reads() -> dict[str, int]:
        seen: list[dict] = []
        steps = sqlite_steps(store.conn, lambda: seen.append(status(store, ws.settings)))
        assert seen[0]["workers"]["last_launch_failure"]["attempt"] == 1, seen
        return {sql: n for sql, n in steps.items() if "FROM attempts" in sql and sql != total}

    before = reads()
    store.conn.executemany(attempt, [(job, n, "finalized", old, old, old) for n in range(3, 5003)])
    after = reads()
    # A scan of the table is ~5,000 rows more: hundreds of steps each.
    assert all(after[sql] <= before.get(sql, 0) + 5 for sql in after), (before, after)
    plan = " ".join(row[3] for row in store.conn.execute(f"EXPLAIN QUERY PLAN {total}"))
    assert "COVERING INDEX" in plan, plan
    ws.close()


def _stalled_look(store: Store, now: str) -> tuple[list[dict], int]:
    """The report's look for stalled reviewers at ``now``, and the SQLite steps it took."""
    from orchestrator.report.data import _open_jobs, _stalled

    return answer_and_steps(
        store.conn, lambda: _stalled(store, now, _open_jobs(store, now, set()), set())
    )


def test_the_reports_look_for_a_stalled_reviewer_reads_no_more_with_its_history(tmp_path):
    """The report's look for a stalled reviewer read every attempt of the reviewer's
    jobs three times (its last move, its messages never picked up, its last words):
    2.6 s of CPU for three reviewers on a year of nights. With 5,000 more attempts of
    the reviewer from before its stall, the look reads the same, and finds the same."""
    store = Store.open(tmp_path / "state")
    job = (
        "INSERT INTO review_jobs (status, model_partition, grouping, reviewer, job_dir, "
        "attempt, created_at, updated_at) VALUES (?, 'm', 'note', 'r', 'jobs/j', ?, ?, ?)"
    )
    attempt = (
        "INSERT INTO attempts (job_id, attempt, outcome, reasons, worker, started_at, "
        "ended_at, heartbeat_at, recorded_at, launched_at) VALUES (?, ?, ?, ?, 'here:1', "
        "?5, ?5, ?5, ?5, ?5)"
    )
    at = "2026-11-27T01:00:00.000Z"
    done = store.conn.execute(job, ("completed", 1, at, at)).lastrowid
    store.conn.execute(attempt, (done, 1, "launch-failure", '["exited 127: r: not found"]', at))
    store.conn.execute(job, ("queued", 0, at, at))
    now = "2026-11-27T06:00:00.000Z"

    (before, steps_before) = _stalled_look(store, now)
    assert before[0]["last_moved"] == at and before[0]["last_not_run"], before
    old = "2026-01-01T00:00:00.000Z"
    for _ in range(5000):
        j = store.conn.execute(job, ("completed", 1, old, old)).lastrowid
        store.conn.execute(attempt, (j, 1, "finalized", "[]", old))
    (after, steps_after) = _stalled_look(store, now)
    assert after == before
    # Read through the reviewer's jobs, the 5,000 attempts are thousands of steps more.
    assert steps_after < steps_before + 50, (steps_before, steps_after)
    store.close()


def test_the_look_for_a_reviewer_never_launched_reads_no_more_with_the_others_history(tmp_path):
    """The look walks the attempts by time from the newest until one of the reviewer's
    own: for one that has attempts but none launched (a new reviewer no worker serves,
    each message of its never picked up: the stall the look is for) or none recorded yet
    (its first agent still running), each walk read every attempt of every reviewer, a
    year's 2.3 million, at each report. With 5,000 more attempts of another reviewer, the
    look reads the same, and finds the same."""
    store = Store.open(tmp_path / "state")
    job = (
        "INSERT INTO review_jobs (status, model_partition, grouping, reviewer, job_dir, "
        "attempt, created_at, updated_at) VALUES (?, 'm', 'note', ?, 'jobs/j', 1, ?3, ?3)"
    )
    at = "2026-11-27T01:00:00.000Z"
    lost = store.conn.execute(job, ("queued", "new", at)).lastrowid
    store.conn.execute(
        "INSERT INTO attempts (job_id, attempt, outcome, reasons, started_at, ended_at, "
        "recorded_at) VALUES (?, 1, 'lost', '[\"never picked up by a worker within 10 min\"]', "
        "?2, ?2, ?2)",
        (lost, at),
    )
    running = store.conn.execute(job, ("running", "first", at)).lastrowid
    store.conn.execute(
        "INSERT INTO attempts (job_id, attempt, outcome, worker, started_at, heartbeat_at, "
        "launched_at) VALUES (?, 1, 'running', 'here:1', ?2, ?2, ?2)",
        (running, at),
    )
    now = "2026-11-27T06:00:00.000Z"

    (before, steps_before) = _stalled_look(store, now)
    assert [(r["reviewer"], r["last_moved"], r["never_picked_up"]) for r in before] == [
        ("first", at, 0),
        ("new", None, 1),
    ], before
    other = store.conn.execute(job, ("completed", "other", at)).lastrowid
    store.conn.executemany(
        "INSERT INTO attempts (job_id, attempt, outcome, reasons, worker, started_at, "
        "ended_at, heartbeat_at, recorded_at, launched_at) VALUES (?, ?, 'finalized', '[]', "
        "'here:1', ?3, ?3, ?3, ?3, ?3)",
        [(other, n, "2026-11-26T01:00:00.000Z") for n in range(1, 5001)],
    )
    (after, steps_after) = _stalled_look(store, now)
    assert after == before
    # Walked, the other reviewer's 5,000 attempts are thousands of steps more.
    assert steps_after < steps_before + 50, (steps_before, steps_after)
    store.close()


def test_doctors_worker_of_this_host_reads_no_more_with_the_attempts_since_the_control_began(
    tmp_path,
):
    """`doctor` on a Redis queue asks which worker of this host took an attempt since the
    control started (its lock's time): with migration 23, SQLite read every attempt since
    then through `attempts_started` and sorted them by id, 0.64 s of CPU for a control
    that started a year of nights ago, where the scan from the newest stopped at the first.
    With 5,000 more attempts since, it reads the same, and finds the same."""
    from orchestrator.state.status import worker_of_host

    store = Store.open(tmp_path / "state")
    job = a_job(store)
    attempt = (
        "INSERT INTO attempts (id, job_id, attempt, outcome, worker, started_at) "
        "VALUES (?1, ?2, ?1, 'finalized', ?3, ?4)"
    )
    store.conn.execute(attempt, (10_000, job, "here:2", "2026-11-27T01:00:00.000Z"))
    since = "2026-01-01T00:00:00.000Z"

    def look() -> tuple[str | None, int]:
        return answer_and_steps(store.conn, lambda: worker_of_host(store, "here", since))

    before, steps_before = look()
    store.conn.executemany(
        attempt, [(n, job, "here:1", "2026-06-01T00:00:00.000Z") for n in range(1, 5001)]
    )
    after, steps_after = look()
    assert before == after == "here:2"
    # Read and sorted, the 5,000 attempts since are thousands of steps more.
    assert steps_after < steps_before + 50, (steps_before, steps_after)
    store.close()


def test_the_report_finds_the_windows_jobs_without_reading_every_job(tmp_path):
    """The report found its jobs by an OR over their times and, for what attempts cost,
    an EXISTS over each job's attempts: every job and attempt ever recorded was read,
    1.4 s of CPU on a year of nights for two of its reads. With 2,000 jobs (and their
    attempts) from months before, the report reads the same, and says the same."""
    from orchestrator.report.data import gather
    from orchestrator.report.period import Period

    store = Store.open(tmp_path / "state")
    job = (
        "INSERT INTO review_jobs (status, model_partition, grouping, reviewer, job_dir, "
        "attempt, created_at, updated_at, finished_at) VALUES "
        "('completed', 'm', 'note', 'r', 'jobs/j', 1, ?1, ?1, ?1)"
    )
    attempt = (
        "INSERT INTO attempts (job_id, attempt, outcome, worker, started_at, ended_at, "
        "recorded_at, launched_at, cost_usd) VALUES (?1, 1, 'finalized', 'here:1', ?2, ?2, "
        "?2, ?2, 0.25)"
    )
    at = "2026-11-27T01:00:00.000Z"
    for _ in range(3):
        store.conn.execute(attempt, (store.conn.execute(job, (at,)).lastrowid, at))
    night = Period("2026-11-27T00:00:00.000Z", "2026-11-27T06:00:00.000Z", "the night")

    def report() -> tuple[dict, int]:
        data, steps = answer_and_steps(
            store.conn, lambda: gather(store, tmp_path, night, now=night.until)
        )
        data.pop("generated_at")
        return data, steps

    before, steps_before = report()
    assert before["reviewed"]["cost_usd"] == 0.75, before["reviewed"]
    old = "2026-06-01T00:00:00.000Z"
    for _ in range(2000):
        store.conn.execute(attempt, (store.conn.execute(job, (old,)).lastrowid, old))
    after, steps_after = report()
    assert after == before
    # Read in full, the 2,000 jobs and their attempts are thousands of steps more.
    assert steps_after < steps_before + 100, (steps_before, steps_after)
    store.close()


def test_job_n_finds_the_jobs_that_followed_it_without_reading_every_job(kb):
    """`job N` asked which jobs followed it (source_job_id) and which it was split into
    (parent_job_id) with no index to answer: every job was read twice, 0.11 s of CPU on a
    year of nights. With 2,000 more jobs, it reads the same, and says the same."""
    from orchestrator.state.status import job
    from orchestrator.state.workspace import Workspace

    ws = Workspace.open(kb.root)
    store = ws.store
    new = (
        "INSERT INTO review_jobs (kind, status, model_partition, grouping, job_dir, "
        "source_job_id, parent_job_id, created_at, updated_at) VALUES (?, ?, 'm', 'note', "
        "'jobs/j', ?, ?, '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z')"
    )
    first = store.conn.execute(new, ("review", "split", None, None)).lastrowid
    store.conn.execute(new, ("review", "completed", None, first))
    store.conn.execute(new, ("fix", "completed", first, None))

    def look() -> tuple[dict, int]:
        return answer_and_steps(store.conn, lambda: job(store, first, ws.settings))

    before, steps_before = look()
    store.conn.executemany(new, [("review", "completed", None, None)] * 2000)
    after, steps_after = look()
    assert after == before
    # Read in full, the 2,000 jobs are hundreds of steps more for each of the two reads.
    assert steps_after < steps_before + 50, (steps_before, steps_after)
    ws.close()


def test_a_sweep_waiting_for_its_first_worker_reads_no_more_with_a_year_of_attempts(tmp_path):
    """`sweep --workers 0` looks every 5 s for a worker heard from since it began until
    one is, or its attempts wait: while nothing was sent yet (a paused reviewer, a spent
    budget) each look read every attempt ever recorded, a year of nights' 2.3 million.
    With 5,000 more attempts ended before the sweep began, a look reads the same."""
    from workers.sweep import NoWorker

    store = Store.open(tmp_path / "state")
    job = a_job(store)
    watch = NoWorker(store, watching=True)

    def look() -> int:
        watch.next = watch.EVERY_S = 0.0
        steps = sqlite_steps(store.conn, watch.check)
        assert watch.watching  # nothing heard, nothing waiting: it goes on looking
        return sum(steps.values())

    before = look()
    old = "2026-01-01T00:00:00.000Z"
    store.conn.executemany(
        "INSERT INTO attempts (job_id, attempt, outcome, worker, started_at, ended_at, "
        "heartbeat_at, recorded_at) VALUES (?, ?, 'finalized', 'here:1', ?3, ?3, ?3, ?3)",
        [(job, n, old) for n in range(1, 5001)],
    )
    after = look()
    # A scan of the table is ~5,000 rows more: hundreds of steps.
    assert after < before + 5, (before, after)
    store.close()


def test_the_openai_agent_refuses_an_answer_past_its_limit(monkeypatch):
    from workers import openai_agent

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers["Content-Length"]))
            data = json.dumps(
                {"choices": [{"message": {"role": "assistant", "content": "y" * 5000}}]}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(openai_agent, "MAX_ANSWER_BYTES", 1000)
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1/chat/completions"
        with pytest.raises(openai_agent.AgentError, match="more than 1000 bytes"):
            openai_agent.complete(url, {"model": "m"}, "", 10)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_negative_count_or_cost_in_the_telemetry_file_is_none(tmp_path):
    """A negative cost lowered the run's spend against its budget."""
    from workers.reviewers.base import telemetry_from_file

    path = tmp_path / "telemetry.json"
    path.write_text(json.dumps({"cost_usd": -0.6, "input_tokens": -1, "output_tokens": 3}))
    t = telemetry_from_file(path)
    assert (t.cost_usd, t.input_tokens, t.output_tokens) == (None, None, 3)


def test_the_reports_reads_of_escalations_grow_not_with_those_decided_long_ago(tmp_path):
    """The report asks of each FAIL of its period what came of it (escalated?) and of each
    failed job whether it raised an escalation: escalations_open holds only the open ones,
    so each question read every escalation ever decided. A night's report (10,000 jobs,
    2,005 FAILs, 293 failed jobs) took 59 s beside 20,000 decided escalations, 3 s
    without. With 5,000 more decided escalations of other notes, each statement of the
    report that reads escalations reads the same, and the report says the same."""
    from orchestrator.report import data, period

    state = tmp_path / "state"
    store = Store.open(state)
    now = "2099-01-01T12:00:00.000Z"
    job = (
        "INSERT INTO review_jobs (kind, status, model_partition, grouping, lens, reviewer, "
        "job_dir, created_at, updated_at, finished_at) VALUES ('review', ?, 'm', 'note', "
        "'prose', 'r', 'jobs/j', ?, ?, ?) RETURNING id"
    )
    pair = (
        "INSERT INTO review_pairs (job_id, note_path, gate_id, gate_path, lens, decision, "
        "rationale, decided_at, note_snapshot_id, gate_snapshot_id) "
        "VALUES (?, ?, 'prose/g', 'g.md', 'prose', ?, '- high: x', ?, 1, 1)"
    )
    with store.write():
        store.conn.execute(
            "INSERT INTO snapshots (path, sha256, text, created_at) VALUES ('n.md', 's', 't', ?)",
            (now,),
        )
        done = store.conn.execute(job, ("completed", now, now, now)).fetchone()[0]
        failed = store.conn.execute(job, ("failed", now, now, now)).fetchone()[0]
        for n in range(20):
            store.conn.execute(pair, (done, f"kb/notes/f{n}.md", "FAIL", now))
        store.conn.execute(  # each FAIL the pair's latest review: nothing came of it yet
            "INSERT INTO acceptance SELECT 'm', note_path, gate_id, id, 1, 1, decision, "
            "'review', decided_at, NULL FROM review_pairs WHERE decision IS NOT NULL"
        )
        store.conn.execute(pair, (failed, "kb/notes/x.md", None, None))

    def reads() -> tuple[dict, dict[str, int]]:
        with store.settled_read("2099-01-01T13:00:00.000Z") as at:
            per = period.resolve(store, since="2099-01-01T00:00:00Z", sweep=None, run=None, now=at)
            seen: list[dict] = []
            steps = sqlite_steps(
                store.conn, lambda: seen.append(data.gather(store, state, per, now=at))
            )
        said = (seen[0]["reviewed"]["fails_left_total"], seen[0]["needs_you"]["failed_total"])
        return said, {sql: n for sql, n in steps.items() if "escalations e" in sql}

    said, before = reads()
    assert said == (20, 1) and before
    escalation = (
        "INSERT INTO escalations (model_partition, note_path, gate_id, reason, cycles, "
        "report_path, raised_at, decision, decided_at, job_id) VALUES ('m', ?, 'prose/g', 'r', 3, "
        "'e.md', '2098-01-01T00:00:00Z', 'reject', '2098-01-02T00:00:00Z', ?)"
    )
    with store.write():
        store.conn.executemany(
            escalation, [(f"kb/notes/old{n}.md", 100_000 + n) for n in range(5000)]
        )
    again, after = reads()
    # A scan of the table is 5,000 rows more for each FAIL or failed job asked about.
    assert again == said and all(after[sql] <= before[sql] + 5 for sql in after), (before, after)
    store.close()
