"""Outages (CONTRACT §12: "Redis or the queue file briefly unavailable: retried with backoff;
nothing lost"), each against a real control process, real workers and real agents, each
ending with every pair accepted exactly once and a log line that says what happened.

- redis-server frozen (SIGSTOP) or killed for 10 s mid-sweep and started again on the same
  unix socket, with and without an append-only file;
- state.db or a queue file held by another process's ``BEGIN EXCLUSIVE`` past the busy
  timeout while a sweep runs;
- the disk full while the result files of a finalized job are written.

The timed waits here are the outages themselves; everything else is awaited by an event
(an agent writing to a FIFO, a process's "started" line, a sweep returning).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.state.store import parse_timestamp, utcnow

from .harness import (
    Cluster,
    RedisServer,
    StartFifo,
    agent_processes,
    build_kb,
    check,
    kill_agents,
    read_log,
    stale_job_files,
    state_db,
    write_config,
)

pytestmark = pytest.mark.integration

OUTAGE_S = 10.0


def _window(state: Path, start: str, end: str | None = None) -> list[dict]:
    """Log records from ``start`` (to ``end``): ISO UTC timestamps sort as text."""
    events, _ = read_log(state)
    return [e for e in events if e["timestamp"] >= start and (end is None or e["timestamp"] <= end)]


def _await_sweep(sweep, expected, timeout: float) -> float:
    """Seconds until the background sweep ended, having enqueued every expected job."""
    t0 = time.monotonic()
    out, err = sweep.communicate(timeout=timeout)
    drain_s = time.monotonic() - t0
    assert sweep.returncode == 0, err
    assert json.loads(out)["enqueued_jobs"] == len(expected)
    return drain_s


def _await_event(state: Path, name: str, timeout: float) -> dict | None:
    """The first log record named ``name``, awaited by re-reading the log up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in read_log(state)[0] if e["event"] == name]
        if found or time.monotonic() > deadline:
            return found[0] if found else None
        time.sleep(0.1)


def _outage_report(root: Path, expected, start: str, end: str, **facts: object):
    """The check after an outage, and what the log said during it and after; printed
    with ``facts`` (see it with ``pytest -s``)."""
    c = check(root, expected)
    during = _summary(_window(root / ".reviewq", start, end))
    after = _summary(_window(root / ".reviewq", end))
    summary = {"attempts": c.attempts, "during": during, "after": after, "locked": c.locked}
    print(json.dumps({**facts, **summary}, indent=1))
    return c, during, after


def _summary(events: list[dict]) -> dict[str, int]:
    """Event names, Huey's records with the start of their message (what an operator sees)."""
    out: Counter[str] = Counter()
    for e in events:
        if e["level"] not in ("warning", "error", "critical"):
            continue
        name = e["event"]
        if name.startswith("huey"):
            name += ": " + str(e.get("message", ""))[:40]
        out[f"{e['level']} {name}"] += 1
    return dict(out)


def _setup(
    tmp_path: Path,
    *,
    notes: int,
    gates: int,
    queue_url: str = "",
    sleep: float = 1.0,
    workers: int = 1,
    config: dict | None = None,
    **fake_env: str,
):
    root = tmp_path / "kb"
    expected = build_kb(root, notes, gates)
    fifo = StartFifo(tmp_path / "agent-started")
    write_config(
        root,
        queue_url=queue_url,
        fake_sleep=sleep,
        fake_env={"FAKE_NOTIFY_FIFO": str(fifo.path), **fake_env},
        **(config or {}),
    )
    cluster = Cluster(root, workers=workers, threads=2)
    return root, expected, cluster, fifo


def _finish(cluster: Cluster, fifo: StartFifo) -> list:
    """Stop everything; agents of this KB still running afterwards are leaks."""
    with contextlib.suppress(Exception):
        cluster.stop(timeout=30)
    cluster.kill_all()
    left = agent_processes(cluster.root)
    kill_agents(left)
    fifo.close()
    return left


def _assert_nothing_lost(root: Path, expected, c=None, allow_locked: bool = False) -> None:
    c = c or check(root, expected)
    problems = [v for v in c.violations() if not (allow_locked and "database is locked" in v)]
    assert not problems, problems
    assert c.accepted == len(expected) and c.losses == [] and c.escalated == 0
    assert c.job_status == {"completed": len(expected)}, c.job_status


# --- Redis ------------------------------------------------------------------------------------


def _sweep_through(cluster, fifo, redis, expected, outage):  # noqa: ANN001, ANN202
    """A sweep of 20 jobs with ``outage`` run mid-way (six agents started; it returns once
    the outage is over, with the time it counts as its end): when the outage began, when
    it ended and the drain after. Everything the sweep started is gone at its end, the
    Redis server too."""
    sweep = None
    try:
        cluster.start()
        sweep = cluster.sweep("--all-gates", background=True)  # enqueues 20 jobs, then waits
        fifo.await_starts(6)  # mid-way: six of the twenty agents have started
        began = utcnow()
        ended = outage()
        drain_s = _await_sweep(sweep, expected, timeout=120)
    finally:
        if sweep is not None and sweep.poll() is None:
            sweep.kill()
        left = _finish(cluster, fifo)
        redis.stop()
    assert left == []
    return began, ended, drain_s


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "mode",
    [
        "sigstop",
        "restart-aof",
        "restart-volatile",
    ],
)
def test_redis_outage_mid_sweep(tmp_path, mode):
    """sigstop: the server frozen (connections hang, nothing lost); restart-aof: killed and
    restarted from its append-only file (fsync always); restart-volatile: killed and
    restarted empty, so every queued message is gone and the reaper must recover them."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (CI installs it with apt)")
    redis = RedisServer(tmp_path / "r.sock", tmp_path / "redis", persist=(mode == "restart-aof"))
    redis.start()
    root, expected, cluster, fifo = _setup(
        tmp_path, notes=5, gates=4, queue_url=redis.url, sleep=1.0
    )

    def outage():  # noqa: ANN202
        if mode == "sigstop":
            redis.pause()
        else:
            redis.kill()
        time.sleep(OUTAGE_S)  # the outage itself
        t_up = utcnow()
        if mode == "sigstop":
            redis.resume()
        else:
            redis.start()
        return t_up

    t_down, t_up, drain_s = _sweep_through(cluster, fifo, redis, expected, outage)
    c, during, after = _outage_report(
        root, expected, t_down, t_up, mode=mode, drain_after_restore_s=round(drain_s, 1)
    )
    _assert_nothing_lost(root, expected, c)
    seen = set(during) | set(after)
    if mode == "sigstop":
        # A frozen server refuses nothing: calls wait for it, nothing is lost or retried.
        assert c.attempts.get("finalized") == len(expected)
    else:
        # A refused connection is said in the log, once a minute, not at every poll: the
        # consumers' reads waited and the sends retried.
        assert "error queue.unavailable" in seen, seen
        assert not any("Error reading" in k for k in seen), seen
        assert any("queue.retrying" in k for k in seen), seen


def _fill(url: str) -> list[str]:
    """Another application's 4 MiB of keys, and `maxmemory` set 1 MiB under what Redis
    then uses (which no write of reviewq's bytes can then pass, however small); the
    keys' names."""
    import redis

    with contextlib.closing(redis.Redis.from_url(url)) as client:
        names = [f"other-app:{i}" for i in range(64)]
        for name in names:
            client.set(name, b"x" * 65536)
        used = client.info("memory")["used_memory"]
        client.config_set("maxmemory", used - 2**20)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("other-app:one-more", b"x")
    return names


# The options a Redis needs for _refusing_writes's ``unsaved``: snapshots, as Redis's own
# default configuration takes them, and writes stopped when one fails (its default too).
UNSAVED_OPTIONS = ("--save", "3600 1", "--stop-writes-on-bgsave-error", "yes")


def _snapshot_said(client, status: str) -> None:  # noqa: ANN001 - a redis.Redis
    """A BGSAVE, and its end awaited: its status ``status`` (``ok`` or ``err``)."""
    client.bgsave()
    deadline = time.monotonic() + 30
    while client.info("persistence")["rdb_last_bgsave_status"] != status:
        assert time.monotonic() < deadline, f"no {status} snapshot"
        time.sleep(0.05)


def _refusing_writes(url: str, mode: str, workdir: Path | None = None) -> Callable[[], None]:
    """Make the Redis at ``url`` refuse every write: ``full`` (another application's keys
    past `maxmemory` under `noeviction`: OOM), ``demoted`` (made a replica of a primary
    that is not there, as a failover leaves the old primary: READONLY, its data kept) or
    ``unsaved`` (a Redis started with :data:`UNSAVED_OPTIONS` in ``workdir`` whose snapshot
    cannot be written, as on a full disk: MISCONF, until a snapshot succeeds again; here
    a folder where its file goes). What undoes it."""
    import redis

    client = redis.Redis.from_url(url)
    if mode == "full":
        others = _fill(url)
        return lambda: client.delete(*others) and client.close()
    if mode == "unsaved":
        assert workdir is not None
        blocker = workdir / "dump.rdb"
        blocker.mkdir()
        _snapshot_said(client, "err")

        def undo() -> None:
            blocker.rmdir()
            _snapshot_said(client, "ok")
            client.close()

        return undo
    client.replicaof("127.0.0.1", "1")
    return lambda: client.replicaof("NO", "ONE") and client.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["full", "demoted", "unsaved"])
def test_a_redis_that_refuses_writes_mid_sweep_is_waited_out(tmp_path, mode):
    """full: a Redis shared with another application that filled it to `maxmemory` under
    `noeviction` refuses every write (OOM), BLMOVE and LPUSH alike, until room is made;
    demoted: a failover made it a replica (READONLY) until it is the primary again;
    unsaved: its snapshot failed (a full disk) and it refuses writes (MISCONF) until one
    succeeds. Either way the control's read logged a traceback at every poll (432 in
    10 s), a worker dropped the outcome it could not send (the agent ran again), and
    (full, unsaved) a control or doctor started meanwhile refused the server as one that
    "refused BLMOVE", a mistake of the file."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (CI installs it with apt)")
    redis = RedisServer(
        tmp_path / "r.sock",
        tmp_path / "redis",
        options=("--maxmemory-policy", "noeviction", *(UNSAVED_OPTIONS * (mode == "unsaved"))),
    )
    redis.start()
    root, expected, cluster, fifo = _setup(
        tmp_path, notes=5, gates=4, queue_url=redis.url, sleep=1.0
    )
    doctor = None

    def outage():  # noqa: ANN202
        nonlocal doctor
        undo = _refusing_writes(redis.url, mode, redis.workdir)
        if mode != "demoted":  # a replica is refused at start: a URL to mend (test_worker_startup)
            doctor = cluster.rq("doctor", timeout=60)
        time.sleep(OUTAGE_S)  # the outage itself
        undo()
        return utcnow()

    t_refusing, t_taking, drain_s = _sweep_through(cluster, fifo, redis, expected, outage)
    c, during, after = _outage_report(
        root, expected, t_refusing, t_taking, mode=mode, drain_s=round(drain_s, 1)
    )
    _assert_nothing_lost(root, expected, c)
    seen = set(during) | set(after)
    # Said, as an outage is: by a read that met it, or by the sends that waited and went
    # (a control whose one consumer thread sent all through the outage read nothing).
    assert "error queue.unavailable" in seen or "warning queue.retrying" in seen, seen
    assert not any(k.startswith("error huey") for k in seen), seen
    # Once a minute: the schedule's read, going through a full Redis, made the queue
    # "available" each second, and the outage said again at the next read (11 in 10 s).
    said = Counter(
        (e["process"], e.get("queue"), e["event"])
        for e in _window(root / ".reviewq", t_refusing, t_taking)
        if e["event"] in ("queue.unavailable", "queue.available")
    )
    assert all(n == 1 for n in said.values()), said
    assert not any(event == "queue.available" for _, _, event in said), said
    assert doctor is None or "problem: queue backend" not in doctor.stdout, doctor.stdout


# Past redis-py's default socket timeout (5 s), which a unix socket's connections had.
PAUSE_MS = 8000


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["maxclients", "pause-write", "pause-all", "loading"])
def test_a_redis_that_stalls_or_turns_clients_away_mid_sweep_is_waited_out(tmp_path, mode):
    """maxclients: every connection closed and the server at its `maxclients` (another
    application's clients hold them), so every new one is refused; pause-write and
    pause-all: `CLIENT PAUSE 8000 WRITE` (or ALL), as a failover's tooling does: over a
    unix socket each write Redis held timed out at redis-py's default 5 s, said as an
    outage ("Timeout reading from socket") of a server that refused nothing;
    loading: killed and restarted from its append-only file onto a large dataset (another
    application's 30,000 keys, 500 µs a key), answering LOADING for ~15 s. Each is an
    outage or a stall, waited out: every pair accepted once, no traceback, said once."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (CI installs it with apt)")
    import redis as redis_py

    options = ("--enable-debug-command", "local", "--aof-use-rdb-preamble", "yes")
    if mode == "loading":
        # Few keys, each slept long: a sleep's wake-up waits its turn on a loaded machine, and
        # 300,000 of 50 µs (15 s unloaded) took 145 s under a CPU quota.
        options += ("--key-load-delay", "500", "--loading-process-events-interval-bytes", "1024")
    redis = RedisServer(
        tmp_path / "r.sock", tmp_path / "redis", persist=(mode == "loading"), options=options
    )
    redis.start()
    root, expected, cluster, fifo = _setup(
        tmp_path, notes=5, gates=4, queue_url=redis.url, sleep=1.0
    )
    loaded_s = 0.0

    def outage():  # noqa: ANN202
        nonlocal loaded_s
        client = redis_py.Redis.from_url(redis.url)
        try:
            if mode == "maxclients":
                client.config_set("maxclients", 1)  # this client is the one
                client.client_kill_filter(_type="normal", skipme=True)
                time.sleep(OUTAGE_S)  # the outage itself
                client.config_set("maxclients", 10000)
            elif mode.startswith("pause-"):
                client.execute_command("CLIENT", "PAUSE", PAUSE_MS, mode.removeprefix("pause-"))
                time.sleep(PAUSE_MS / 1000)  # the pause itself: Redis lifts it
            else:
                client.execute_command("DEBUG", "POPULATE", 30_000, "other-app")
                client.bgrewriteaof()  # the keys into the file's RDB part, which loads slowly
                deadline = time.monotonic() + 60
                while (info := client.info("persistence"))["aof_rewrite_in_progress"] or info[
                    "aof_rewrite_scheduled"
                ]:
                    assert time.monotonic() < deadline, "no rewrite"
                    time.sleep(0.05)
                redis.kill()
                t0 = time.monotonic()
                redis.start(timeout=120)  # its "ready" line comes once the dataset is loaded
                loaded_s = time.monotonic() - t0
        finally:
            client.close()
        return utcnow()

    t_down, t_up, drain_s = _sweep_through(cluster, fifo, redis, expected, outage)
    c, during, after = _outage_report(
        root, expected, t_down, t_up, mode=mode, loaded_s=round(loaded_s, 1), drain_s=drain_s
    )
    _assert_nothing_lost(root, expected, c)
    seen = set(during) | set(after)
    assert not any(k.startswith("error huey") for k in seen), seen
    assert not any("Error reading" in k or "Traceback" in k for k in seen), seen
    if mode in ("maxclients", "loading"):
        assert mode != "loading" or loaded_s > 5, loaded_s  # it was met loading
        assert "error queue.unavailable" in seen or "warning queue.retrying" in seen, seen
    _said_once_a_minute(root / ".reviewq", t_down, t_up)
    if mode.startswith("pause-"):
        # A pause is a stall: calls wait for it, nothing refused, nothing run again.
        assert c.attempts.get("finalized") == len(expected), c.attempts
        assert not any("queue.unavailable" in k or "queue.retrying" in k for k in seen), seen


def _said_once_a_minute(state: Path, start: str, end: str) -> None:
    """Each process says its queue out of reach once a minute while it is (workers.queues):
    once in an outage shorter than a minute, which a loaded machine's may not be (Redis
    loading its dataset: ~15 s unloaded, 76-113 s under a CPU quota, said twice)."""
    said = Counter(
        (e["process"], e.get("queue"))
        for e in _window(state, start, end)
        if e["event"] == "queue.unavailable"
    )
    minutes = (parse_timestamp(end) - parse_timestamp(start)).total_seconds() // 60
    assert all(n <= 1 + minutes for n in said.values()), (said, minutes)


# --- SQLite files held by another process --------------------------------------------------------


def _hold_exclusive(path: Path, seconds: float) -> tuple[str, str]:
    """``BEGIN EXCLUSIVE`` on a SQLite file for ``seconds`` (the outage), then release."""
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        start = utcnow()
        time.sleep(seconds)
        conn.execute("COMMIT")
        return start, utcnow()
    finally:
        conn.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("target", ["state.db", "queue/control.db", "queue/review.db"])
def test_sqlite_file_locked_past_the_busy_timeout(tmp_path, target):
    from orchestrator.state.store import BUSY_TIMEOUT_MS
    from workers.app import make_app

    root, expected, cluster, fifo = _setup(tmp_path, notes=5, gates=4, sleep=1.0)
    path = root / ".reviewq" / target
    sweep = None
    try:
        cluster.start()
        if target == "state.db":
            busy_s = BUSY_TIMEOUT_MS / 1000
        else:
            from orchestrator.state.workspace import Workspace

            app = make_app(Workspace.open(root).settings)
            busy_s = app.control.storage._timeout  # what the consumers wait for a lock
        hold = busy_s + 5
        sweep = cluster.sweep("--all-gates", background=True)  # enqueues 20 jobs, then waits
        fifo.await_starts(6)  # mid-sweep: six agents have started
        t_lock, t_free = _hold_exclusive(path, hold)
        drain_s = _await_sweep(sweep, expected, timeout=240)
    finally:
        if sweep is not None and sweep.poll() is None:
            sweep.kill()
        left = _finish(cluster, fifo)
    assert left == []
    c, _, _ = _outage_report(
        root,
        expected,
        t_lock,
        t_free,
        target=target,
        held_s=hold,
        busy_timeout_s=busy_s,
        drain_after_release_s=round(drain_s, 1),
    )
    _assert_nothing_lost(root, expected, c, allow_locked=True)
    said = [e for e in _window(root / ".reviewq", t_lock) if "database is locked" in json.dumps(e)]
    assert said, "nothing in the log says the database was locked"
    if target == "state.db":
        # Said under reviewq's own event, naming what met the lock, not by Huey's bare
        # "Unhandled exception in task" alone (K6): a control task that failed (its ids), or
        # the clearing of a commit's files due, whichever came to the lock first in its
        # window (a task after it waits the lock out).
        ours = {"control.task_failed": "task", "files_due.not_cleared": "table"}
        assert any(e["event"] in ours and e.get(ours[e["event"]]) for e in said), said


@pytest.mark.timeout(180)
def test_a_lost_tick_message_stops_the_reaper(tmp_path):
    """Deterministic form of what restart-volatile above hits when a tick is queued at the
    moment Redis dies. The control's one consumer thread is held inside a heartbeat (state.db
    locked for 2 s, far below its busy timeout) so its ticker's next tick waits in Redis;
    Redis restarts empty; then a worker is SIGKILLed mid-attempt. The reaper must see the
    lost lease and start attempt 2 (lease 2 s): the drain should take seconds."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (CI installs it with apt)")
    redis = RedisServer(tmp_path / "r.sock", tmp_path / "redis", persist=False)
    redis.start()
    root, expected, cluster, fifo = _setup(
        tmp_path, notes=1, gates=1, queue_url=redis.url, FAKE_MODE_1="hang", FAKE_MODE="good"
    )
    try:
        cluster.start()
        assert cluster.rq("enqueue", "--all-gates", "--reviewer", "fake").returncode == 0
        fifo.await_starts(1)  # attempt 1 runs (and hangs): heartbeats every 0.5 s
        conn = sqlite3.connect(root / ".reviewq" / "state.db", timeout=30, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")  # the control blocks in its next heartbeat write
        time.sleep(2)  # four ticker periods: a tick is now queued behind it
        redis.kill()
        redis.start()  # empty: the queued tick is gone
        conn.execute("COMMIT")
        conn.close()
        cluster.kill("worker-0")  # attempt 1 loses its lease
        cluster.restart("worker-0").await_ready()
        res = cluster.drain(timeout=30)
    finally:
        left = _finish(cluster, fifo)
        redis.stop()
    assert res.returncode == 0, res.stderr
    with contextlib.closing(state_db(root)) as db:
        outcomes = [tuple(r) for r in db.execute("SELECT attempt, outcome FROM attempts")]
    assert outcomes == [(1, "lost"), (2, "finalized")] and left == []


# --- a full disk while the result files are written ---------------------------------------------

DISK_FULL_S = 7.0  # longer than two of the control tasks' 3-s retries


def _full_disk_run(
    tmp_path: Path, *, decision: str, fix: bool, full_for: float | None, lease: float
):
    """One one-pair job whose folder sits on a small tmpfs of its own. The agent starts and
    waits at a FIFO while the test fills that disk, leaving one page; it writes its output
    into that page and exits; the control process finalizes and cannot write the result
    files (ENOSPC). ``full_for``: free the disk after that long (None: it stays full until
    the drain ends). Returns what the test looks at."""
    from .harness import ContinueGate, SmallDisk

    gate_path = tmp_path / "agent-continue"
    root, expected, cluster, fifo = _setup(
        tmp_path,
        notes=1,
        gates=1,
        sleep=0,
        config={"lease_seconds": lease},
        FAKE_MODE="good",
        FAKE_DECISIONS=decision,
        FAKE_CONTINUE_FIFO=str(gate_path),
    )
    gate = ContinueGate(gate_path)
    args = ["enqueue", "--all-gates", "--reviewer", "fake"] + (["--fix"] if fix else [])
    enq = cluster.rq(*args)  # no control yet: the job waits, its folder is made
    assert enq.returncode == 0, enq.stderr
    with contextlib.closing(state_db(root)) as db:
        job_dir = root / ".reviewq" / db.execute("SELECT job_dir FROM review_jobs").fetchone()[0]
    disk = SmallDisk(job_dir, "256k")
    try:
        disk.mount()
    except PermissionError as exc:
        gate.close()
        fifo.close()
        pytest.skip(str(exc))
    out = {"root": root, "expected": expected, "job_dir": job_dir}
    try:
        cluster.start()
        fifo.await_starts(1)  # the agent runs and waits at the gate
        filler = disk.fill(leave=4096)  # room for its output, none for the result files
        out["t_full"] = utcnow()
        gate.open_gate()  # this agent and any later one (a fixer) go on
        if full_for is not None:
            time.sleep(full_for)  # the disk stays full this long: the scenario
            filler.unlink()
        out["drain"] = cluster.drain(timeout=150)
        if full_for is not None:
            # The review committed while the disk was full; the control process writes
            # the files at its next tick with room, and says so.
            out["late"] = _await_event(root / ".reviewq", "job.files_written", timeout=30)
        with contextlib.closing(state_db(root)) as db:
            out["stale"] = stale_job_files(root, db)
            out["kinds"] = [r[0] for r in db.execute("SELECT kind FROM review_jobs ORDER BY id")]
        if full_for is None:
            filler.unlink()
        # Can the files be made again from state.db alone? Delete them and regenerate.
        from orchestrator.state.files import write_job_files
        from orchestrator.state.store import Store

        for name in ("MANIFEST.json", "results"):
            p = job_dir / name
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        with Store.open(root / ".reviewq") as store:
            write_job_files(store, job_dir, 1)
        out["manifest_after"] = json.loads((job_dir / "MANIFEST.json").read_text())
        out["results_after"] = [p.read_text() for p in sorted((job_dir / "results").glob("*"))]
        with contextlib.closing(state_db(root)) as db:
            out["stale_after"] = stale_job_files(root, db)
    finally:
        out["left"] = _finish(cluster, fifo)
        gate.close()
        disk.unmount()  # (the folder shows its pre-mount copy again: look before this)
    events = _window(root / ".reviewq", out["t_full"])
    out["enospc"] = [
        e for e in events if e["level"] == "error" and "No space left on device" in json.dumps(e)
    ]
    out["events"] = _summary(events)
    out["finalized"] = [e for e in events if e["event"] == "job.finalized"]
    print(
        json.dumps(
            {
                "decision": decision,
                "full_for_s": full_for,
                "kinds": out["kinds"],
                "stale_job_files": out["stale"],
                "events": out["events"],
                "enospc_lines": [
                    {k: (v[-200:] if isinstance(v, str) else v) for k, v in e.items()}
                    for e in out["enospc"][:2]
                ],
            },
            indent=1,
        )
    )
    return out


@pytest.mark.timeout(240)
def test_disk_full_for_a_moment_at_finalize(tmp_path):
    """The disk is full for 7 s from the moment the agent writes its output. The review
    commits at once; writing its files fails, is logged (ENOSPC) and is tried again at
    every tick until the disk has room: accepted once, files written, nothing lost."""
    out = _full_disk_run(tmp_path, decision="PASS", fix=False, full_for=DISK_FULL_S, lease=120)
    root = out["root"]
    assert out["drain"].returncode == 0, out["drain"].stderr
    assert out["left"] == []
    c = check(root, out["expected"])  # (job files: the tmpfs is gone, checked before)
    c.stale_job_files = []
    _assert_nothing_lost(root, out["expected"], c)
    assert c.attempts == {"finalized": 1}, c.attempts
    assert out["late"] is not None, "the control process never wrote the files again"
    assert out["stale"] == [], "the result files were not written once the disk had room"
    assert out["enospc"], "nothing in the log says the disk was full"
    # The files can be regenerated from state.db.
    assert out["stale_after"] == [] and out["manifest_after"]["status"] == "completed"
    assert [t.rstrip().endswith("## Result: PASS") for t in out["results_after"]] == [True]


@pytest.mark.timeout(240)
def test_disk_full_at_finalize_keeps_the_acceptance_and_its_follow_up(tmp_path):
    """CONTRACT §6: finalize commits, *then* writes the result files, which can be regenerated
    from the DB. A disk that stays full must cost the files, not the review: the FAIL is
    accepted, the fix job starts (its folder is on another disk), ENOSPC is logged."""
    out = _full_disk_run(tmp_path, decision="FAIL", fix=True, full_for=None, lease=2)
    root = out["root"]
    assert out["left"] == []
    assert out["enospc"], "nothing in the log says the disk was full"
    with contextlib.closing(state_db(root)) as db:
        status = db.execute("SELECT status FROM review_jobs WHERE id = 1").fetchone()[0]
        decision = db.execute("SELECT decision FROM acceptance").fetchone()
    assert status == "completed" and decision is not None and decision[0] == "FAIL"
    assert "fix" in out["kinds"] and out["finalized"]


def _await_events(state: Path, name: str, n: int, timeout: float) -> list[dict]:
    """The first ``n`` log records named ``name``, awaited by re-reading the log."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in read_log(state)[0] if e["event"] == name]
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.mark.timeout(300)
def test_disk_full_for_the_follow_ups_of_a_review(tmp_path):
    """Every follow-up of a review meets a full disk: the fix and audit job folders and the
    re-review folders (all of STATE/jobs on a small tmpfs, full for 7 s from the moment the
    first two agents write their output) and the escalation reports (STATE/escalations on
    another tmpfs, full until the drain ends). lens0 FAILs every time, so it is fixed twice,
    re-reviewed twice and escalated; lens1 PASSes, is audited, and the auditor's FAIL
    escalates it. Nothing is rolled back, and once there is room every file is written."""
    from .harness import ContinueGate, SmallDisk

    gate_path = tmp_path / "agent-continue"
    root, expected, cluster, fifo = _setup(
        tmp_path,
        notes=1,
        gates=2,
        sleep=0,
        config={"lease_seconds": 30},
        FAKE_MODE="good",
        FAKE_FAIL_GATES="lens0/check0",
        FAKE_AUDIT_DECISION="FAIL",
        FAKE_FIX_APPEND="Another try.",
        FAKE_CONTINUE_FIFO=str(gate_path),
    )
    audited = root / "kb" / "instructions" / "review-gates" / "lens1" / "check1.md"
    audited.write_text(audited.read_text().replace("lens: lens1\n", "lens: lens1\naudit: true\n"))
    gate = ContinueGate(gate_path)
    # A sweep name of its own keeps this run's jobs apart from the drain below in the log.
    enq = cluster.rq(
        "enqueue", "--all-gates", "--reviewer", "fake", "--fix", "--auditor", "fake",
        "--name", "follow-ups",
    )  # fmt: skip
    assert enq.returncode == 0, enq.stderr
    state = root / ".reviewq"
    (state / "escalations").mkdir()
    jobs_disk, esc_disk = SmallDisk(state / "jobs", "512k"), SmallDisk(state / "escalations", "64k")
    try:
        jobs_disk.mount()
        esc_disk.mount()
    except PermissionError as exc:
        jobs_disk.unmount()
        gate.close()
        fifo.close()
        pytest.skip(str(exc))
    try:
        cluster.start()
        fifo.await_starts(2)  # both reviews run and wait at the gate
        jobs_filler = jobs_disk.fill(leave=2 * 4096)  # room for their two outputs only
        esc_filler = esc_disk.fill()
        t_full = utcnow()
        gate.open_gate()
        time.sleep(DISK_FULL_S)  # the outage itself
        jobs_filler.unlink()
        drain = cluster.drain(timeout=150)
        assert drain.returncode == 0, drain.stderr
        with contextlib.closing(state_db(root)) as db:
            waiting = [r[0] for r in db.execute("SELECT escalation_id FROM escalation_reports_due")]
        esc_filler.unlink()
        written = _await_events(state, "escalation.report_written", 2, timeout=30)
        with contextlib.closing(state_db(root)) as db:
            jobs = [tuple(r) for r in db.execute("SELECT kind, status, result FROM review_jobs")]
            stale = stale_job_files(root, db)
            escalations = db.execute("SELECT gate_id, report_path FROM escalations").fetchall()
            acceptance = dict(db.execute("SELECT gate_id, decision FROM acceptance").fetchall())
            left_due = [
                db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("job_files_due", "escalation_reports_due", "fix_writes_due")
            ]
        reports = {e[0]: (state / e[1]).read_text().splitlines() for e in escalations}
        missing_manifests = [
            p.name for p in (state / "jobs").iterdir() if not (p / "MANIFEST.json").is_file()
        ]
    finally:
        left = _finish(cluster, fifo)
        gate.close()
        esc_disk.unmount()
        jobs_disk.unmount()
    events = _window(state, t_full)
    enospc = [e for e in events if e["level"] == "error" and "No space left" in json.dumps(e)]
    print(
        json.dumps({"jobs": jobs, "waiting_reports": waiting, "events": _summary(events)}, indent=1)
    )
    assert left == []
    assert sorted(jobs) == sorted(
        [("review", "completed", None)] * 4
        + [("fix", "completed", "applied")] * 2
        + [("audit", "completed", None)]
    ), jobs
    assert acceptance == {"lens0/check0": "FAIL", "lens1/check1": "PASS"}
    note = (root / expected[0][0]).read_text()
    assert note.count("Another try.") == 2
    assert sorted(waiting) == [1, 2], "the escalation reports were not on the full disk"
    assert len(written) == 2 and all(e.get("late") for e in written)
    assert sorted(reports) == ["lens0/check0", "lens1/check1"]
    assert all(r[0].startswith("Gate review: ") for r in reports.values())
    assert stale == [] and missing_manifests == [] and left_due == [0, 0, 0]
    said = {e["event"] for e in enospc}
    assert {"job.files_failed", "escalation.report_failed"} <= said, said
