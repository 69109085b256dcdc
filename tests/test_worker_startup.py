"""Start-up mistakes of a worker on a second machine (and of the control it talks to): each is
refused, or named by `doctor --worker`, in one line, instead of being waited on for good as
an outage of the queue or failing every attempt of the profile."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import click
import pytest

from .conftest import dies_with_this_process
from .test_queue_integration import redis_server, redis_url, stalled_redis
from .test_remote_workers import EXE, worker_toml
from .test_vendor_clis import netns

pytestmark = pytest.mark.integration
PASSWORD = "Pw-9f3kQ"
__all__ = ["netns", "redis_url"]  # fixtures, used by name


def _worker_home(tmp_path: Path, url: str) -> tuple[Path, list[str]]:
    home = tmp_path / "remote"
    home.mkdir(exist_ok=True)
    config = worker_toml(home / "worker.toml", url)
    return config, [EXE, "--root", str(home), "--config", str(config), "--state", str(home / "s")]


def _refused(args: list[str], timeout: float = 15) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args[-3:]} started and waited, where it should have refused")


def _worker_refuses(args: list[str], config: Path, url: str, timeout: float = 15) -> str:
    """A worker started with ``args`` refuses its queue ``url`` at once: exit 1 and one
    ``error:`` line naming the file and the URL, which is returned."""
    res = _refused([*args, "worker", "--workers", "1"], timeout)
    assert res.returncode == 1, res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: {config} [queue] url {url}"), line
    return line


def _with_credentials(url: str, userinfo: str) -> str:
    assert url.startswith("unix://")
    return f"unix://{userinfo}@{url.removeprefix('unix://')}"


@pytest.fixture
def redis_with_password(tmp_path):
    with redis_server(tmp_path, "--requirepass", PASSWORD) as url:
        yield url


@pytest.mark.parametrize(
    "userinfo",
    [":not-the-password", f"nobody:{PASSWORD}", ""],
    ids=["wrong-password", "wrong-user", "no-password"],
)
def test_a_redis_that_refuses_the_credentials_is_refused_at_start(
    tmp_path, redis_with_password, userinfo
):
    """A wrong password was retried for good as `queue.unavailable`, once a minute: the
    worker looked like it waited for an outage to end, and never would."""
    url = _with_credentials(redis_with_password, userinfo) if userinfo else redis_with_password
    config, args = _worker_home(tmp_path, url)
    res = _refused([*args, "worker", "--workers", "1"])
    assert res.returncode == 1, res.stderr
    (line,) = res.stderr.splitlines()  # one line, no log lines before it, no traceback
    assert line.startswith(f"error: {config} [queue] url"), line
    assert "refused" in line and "not-the-password" not in line and PASSWORD not in line, line
    doctor = _refused([*args, "doctor", "--worker"])
    assert doctor.returncode == 1
    assert f"problem: queue backend: {config} [queue] url" in doctor.stdout, doctor.stdout
    assert PASSWORD not in doctor.stdout and "not-the-password" not in doctor.stdout


def test_a_control_with_a_wrong_redis_password_is_refused_at_start(kb, redis_with_password):
    url = _with_credentials(redis_with_password, ":not-the-password")
    kb.gate("prose/body-check", ["body"])
    kb.write("reviewq.toml", f'[queue]\nurl = "{url}"\n')
    res = _refused([EXE, "--root", str(kb.root), "control"])
    assert res.returncode == 1
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: {kb.root / 'reviewq.toml'} [queue] url"), line
    assert "not-the-password" not in line


def test_a_password_the_redis_server_stops_taking_mid_run_is_said_at_once_with_the_file(
    kb, redis_with_password
):
    """The Redis password changed under a running control and its workers (a rotation,
    the file not yet mended): their connections closed and every read met "invalid
    username-password pair" for good, said once a minute as a passing outage (or first
    "Connection closed by server.", the refusal a minute later), naming neither the file
    nor what mends it, as the start's refusal does."""
    import redis

    from orchestrator import logs
    from orchestrator.state.workspace import Workspace
    from workers.app import make_app

    from .test_queue_integration import log_lines

    url = _with_credentials(redis_with_password, f":{PASSWORD}")
    kb.write("reviewq.toml", f'[queue]\nurl = "{url}"\n')
    ws = Workspace.open(kb.root)
    logs.configure(ws.state_dir)
    with make_app(ws.settings) as app:
        assert app.review.dequeue() is None  # connected: an empty queue
        socket_path = redis_with_password.removeprefix("unix://")
        with contextlib.closing(
            redis.Redis(unix_socket_path=socket_path, password=PASSWORD)
        ) as admin:
            admin.config_set("requirepass", "rotated")
            admin.client_kill_filter(_type="normal", skipme=True)
        for _ in range(3):  # the reads a consumer makes, each failing
            assert app.review.dequeue() is None
    said = [e for e in log_lines(kb) if e["event"] == "queue.unavailable"]
    refused = [e for e in said if "reason" in e]
    assert refused, said
    (line,) = refused  # said once in the outage, not at each read
    where = f"{kb.root / 'reviewq.toml'} [queue] url unix://:***@"
    assert line["reason"].startswith(where), line
    assert "refused this client" in line["reason"] and "redis://USER:PASSWORD@" in line["reason"]
    assert PASSWORD not in json.dumps(said)
    ws.close()


@contextlib.contextmanager
def _answering(reply: bytes, *, read_first: bool):
    """A loopback port whose server sends ``reply`` to every connection (after reading
    the client's first bytes, with ``read_first``), then closes it; its port."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(2)
                if read_first:
                    conn.recv(4096)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        srv.close()


def _not_redis():
    """A loopback port where an HTTP server answers: what `redis://host:8080` meets."""
    return _answering(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", read_first=True)


def test_a_redis_url_to_a_port_where_no_redis_listens_is_refused(tmp_path):
    with _not_redis() as port:
        config, args = _worker_home(tmp_path, f"redis://127.0.0.1:{port}/0")
        res = _refused([*args, "worker", "--workers", "1"])
        doctor = _refused([*args, "doctor", "--worker"])
    assert res.returncode == 1
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: {config} [queue] url redis://127.0.0.1:{port}/0"), line
    assert "not a Redis server" in line and "HTTP/1.1 400" in line, line
    assert doctor.returncode == 1 and "not a Redis server" in doctor.stdout, doctor.stdout


MISTYPED = "redis.mistyped-host.invalid"


def test_a_redis_host_that_does_not_resolve_is_refused_at_start(tmp_path):
    """A host name mistyped in worker.toml was an outage to the worker: it waited, with a
    `queue.unavailable` line a minute, for a server that no name would ever lead to."""
    url = f"redis://{MISTYPED}:6379/0"
    config, args = _worker_home(tmp_path, url)
    line = _worker_refuses(args, config, url)
    assert f"the host '{MISTYPED}' does not resolve (" in line, line
    doctor = _refused([*args, "doctor", "--worker"])
    assert doctor.returncode == 1 and f"'{MISTYPED}' does not resolve" in doctor.stdout, (
        doctor.stdout
    )


def test_a_redis_host_the_resolver_answers_try_again_is_refused_at_start(tmp_path, netns):
    """Where the resolver cannot be reached (a network namespace with only `lo`: the
    machine's DNS server out of reach) a lookup fails with EAI_AGAIN, "Temporary failure in
    name resolution", and the mistyped host was waited for as an outage, for good."""
    url = f"redis://{MISTYPED}:6379/0"
    config, args = _worker_home(tmp_path, url)
    line = _worker_refuses(["ip", "netns", "exec", netns, *args], config, url)
    assert "does not resolve (Temporary failure in name resolution)" in line, line


def test_a_lookup_that_fails_after_a_good_start_is_an_outage_waited_for(tmp_path, netns):
    """The other half of refusing a name that does not resolve: once the worker has
    started, the resolver's temporary failure (EAI_AGAIN) is an outage like any other,
    waited for and said, and the worker goes on once the name resolves again. The name
    is in an /etc/hosts of the worker's own (a mount namespace), taken away and put back."""
    hosts = tmp_path / "hosts"
    named = "127.0.0.1 localhost\n127.0.0.1 redis-box\n"
    hosts.write_text(named)
    port = 16000 + os.getpid() % 1000
    inside = ("ip", "netns", "exec", netns)
    with redis_server(tmp_path, "--port", str(port), "--bind", "127.0.0.1", prefix=inside):
        _, args = _worker_home(tmp_path, f"redis://redis-box:{port}/0")
        home = tmp_path / "remote"
        script = 'mount --bind "$0" /etc/hosts && exec "$@"'
        worker = subprocess.Popen(
            [*inside, "unshare", "--mount", "sh", "-c", script, str(hosts), *args]
            + ["worker", "--workers", "1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _await_event(home, "worker.started", 0)
            seen = len(_worker_log(home))
            hosts.write_text("127.0.0.1 localhost\n")  # the same file: the mount sees it
            subprocess.run(
                [*inside, "redis-cli", "-p", str(port), "CLIENT", "KILL", "TYPE", "normal"],
                check=True,
                capture_output=True,
            )
            _await_event(home, "queue.unavailable", seen)  # its connection cut
            # Its reconnects (0.1 s apart, doubling) meet EAI_AGAIN meanwhile: no event
            # says each, so a few of them are let pass (as for a refused port, above).
            time.sleep(3)
            assert worker.poll() is None  # waiting, not refused
            events = [r["event"] for r in _worker_log(home)[seen:]]
            assert "queue.available" not in events, events
            hosts.write_text(named)
            _await_event(home, "queue.available", seen)
        finally:
            _stop(worker)


def test_a_redis_out_of_reach_at_start_is_still_waited_for(tmp_path, refused_port):
    """Connection refused is an outage (Redis restarting, not up yet): the worker waits.
    It is judged once it says it met the refusal (4 s of sleep could pass, on a loaded
    machine, with the worker still importing), and it still stops as asked."""
    _, args = _worker_home(tmp_path, f"redis://127.0.0.1:{refused_port}/0")
    proc = subprocess.Popen(
        [*args, "worker", "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _await_event(tmp_path / "remote", "queue.unavailable", 0)
        assert proc.poll() is None, proc.stderr.read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr.read()


# --- a worker on another Redis database than the control's -----------------------------------


def _on_db(url: str, db: int) -> str:
    return f"{url}?db={db}"


def _control_home(kb, url: str) -> None:
    kb.gate("prose/body-check", ["body"])
    kb.write("reviewq.toml", f'[queue]\nurl = "{url}"\nreaper_seconds = 0.5\n')


def _start_control(kb, url: str) -> subprocess.Popen:
    _control_home(kb, url)
    return subprocess.Popen(
        [EXE, "--root", str(kb.root), "control"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _start_and_stop_a_worker(args: list[str], home: Path) -> None:
    """A worker started with ``args``, stopped once it has logged ``worker.started``
    (what it says at its start is then in its log)."""
    worker = subprocess.Popen(
        [*args, "worker", "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while not any(r["event"] == "worker.started" for r in _worker_log(home)):
            assert time.monotonic() < deadline and worker.poll() is None
            time.sleep(0.2)
    finally:
        _stop(worker)


def _worker_log(home: Path) -> list[dict]:
    path = home / "s" / "logs" / "reviewq.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_worker_on_another_redis_database_than_the_controls_is_named(kb, tmp_path, redis_url):
    """`redis://host/3` where the control uses /0: doctor --worker said all was well, and
    the worker sat idle for good, its queue one no control process feeds."""
    control = _start_control(kb, _on_db(redis_url, 0))
    try:
        config, args = _worker_home(tmp_path, _on_db(redis_url, 0))
        deadline = time.monotonic() + 30
        while True:  # the control has started and fed its queue once
            same = _refused([*args, "doctor", "--worker"])
            if same.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert same.returncode == 0, same.stdout
        assert any(
            line.startswith("ok: a control process feeds") for line in same.stdout.splitlines()
        )

        config, args = _worker_home(tmp_path, _on_db(redis_url, 3))
        other = _refused([*args, "doctor", "--worker"])
        assert other.returncode == 1, other.stdout
        (problem,) = [line for line in other.stdout.splitlines() if line.startswith("problem:")]
        assert f"{config} [queue] url" in problem and "no control process" in problem, problem
        assert "database" in problem, problem

        _start_and_stop_a_worker(args, tmp_path / "remote")
        said = [r for r in _worker_log(tmp_path / "remote") if r["event"] == "worker.queue_unfed"]
        assert len(said) == 1 and said[0]["level"] == "warning", said
        assert "no control process" in said[0]["reason"]
    finally:
        _stop(control)


def test_doctor_names_the_file_and_url_of_a_queue_out_of_reach(tmp_path):
    """A port mistyped in worker.toml (6397 for 6379) is an outage to the worker, which
    waits for it; doctor said only "problem: queue backend: Error 111 connecting to
    127.0.0.1:6397. Connection refused.", naming neither the file nor its URL."""
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    config, args = _worker_home(tmp_path, f"redis://:{PASSWORD}@127.0.0.1:{port}/0")
    res = _refused([*args, "doctor", "--worker"])
    assert res.returncode == 1 and PASSWORD not in res.stdout + res.stderr, res.stdout
    (problem,) = [x for x in res.stdout.splitlines() if x.startswith("problem:")]
    assert problem.startswith(
        f"problem: queue backend: {config} [queue] url redis://:***@127.0.0.1:{port}/0: "
        "out of reach ("
    ), problem


@pytest.mark.parametrize("over", ["tcp", "unix"])
def test_doctor_says_a_redis_at_its_maxclients_is_up(tmp_path, over):
    """A Redis at its `maxclients` closes every new connection: doctor said it was "out
    of reach" and told the reader to "start Redis there, or put its host and port in the
    URL", of a server up at the right address, over TCP (where the client had read "max
    number of clients reached") and over a unix socket (where its write met the close
    first: "Broken pipe")."""
    import redis

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with redis_server(tmp_path, "--port", str(port), "--maxclients", "1") as sock_url:
        url = f"redis://127.0.0.1:{port}/0" if over == "tcp" else sock_url
        holder = redis.Redis.from_url(url)
        holder.ping()  # the one client it takes
        try:
            config, args = _worker_home(tmp_path, url)
            res = _refused([*args, "doctor", "--worker"], timeout=60)
            assert res.returncode == 1, res.stdout
            (problem,) = [x for x in res.stdout.splitlines() if x.startswith("problem:")]
            assert problem.startswith(f"problem: queue backend: {config} [queue] url {url}: ")
            assert "up but at its `maxclients`" in problem, problem
            assert "start Redis there" not in problem, problem
            holder.ping()  # the holder kept its connection all along
        finally:
            holder.close()


@pytest.mark.parametrize("over", ["tcp", "unix"])
def test_doctor_says_a_redis_that_answers_nothing_is_stalled_and_ends(tmp_path, over):
    """A Redis that takes connections and answers nothing (its process stopped, a `CLIENT
    PAUSE ... ALL`, its one thread held): the queue's connections have no read timeout,
    so that a stall is waited out, and `doctor`, the command an operator runs to ask why
    nothing moves, waited with them for good, over TCP and, since K80, over a unix
    socket (before it, "out of reach … start Redis there", of a server that was up)."""
    with stalled_redis(tmp_path, over) as url:
        config, args = _worker_home(tmp_path, url)
        res = _refused([*args, "doctor", "--worker"], timeout=90)
    assert res.returncode == 1, res.stdout
    (problem,) = [x for x in res.stdout.splitlines() if x.startswith("problem:")]
    assert problem.startswith(f"problem: queue backend: {config} [queue] url {url}: "), problem
    assert "answered nothing" in problem and "start Redis there" not in problem, problem


@pytest.mark.parametrize("side", ["worker", "control"])
def test_doctor_says_a_redis_paused_for_writes_holds_them_and_ends(kb, tmp_path, side):
    """`CLIENT PAUSE ... WRITE`, as a failover's tooling sends, holds every write and
    answers the rest: K81's PING went through, and doctor then waited for good on its
    check of the queue's commands (a move, a write), the queue's connections having no
    read timeout."""
    import redis

    with redis_server(tmp_path) as url:
        if side == "worker":
            config, args = _worker_home(tmp_path, url)
            args = [*args, "doctor", "--worker"]
        else:
            _control_home(kb, url)
            config, args = kb.root / "reviewq.toml", [EXE, "--root", str(kb.root), "doctor"]
        with contextlib.closing(redis.Redis.from_url(url)) as client:
            client.execute_command("CLIENT", "PAUSE", "600000", "WRITE")
            try:
                res = _refused(args, timeout=90)
            finally:
                client.execute_command("CLIENT", "UNPAUSE")
    assert res.returncode == 1, res.stdout
    (problem,) = [x for x in res.stdout.splitlines() if x.startswith("problem: queue backend")]
    assert problem.startswith(f"problem: queue backend: {config} [queue] url {url}: "), problem
    assert "held a write" in problem and "CLIENT PAUSE ... WRITE" in problem, problem


def test_doctor_says_a_redis_loading_its_dataset_is_loading(tmp_path):
    """A Redis restarted with a large dataset answers LOADING while it reads it: doctor
    said it was "out of reach" and told the reader to "start Redis there, or put its host
    and port in the URL", of a server up at the right address."""
    import redis

    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (CI installs it with apt)")
    rdb = tmp_path / "rdb"
    rdb.mkdir()
    with redis_server(tmp_path, "--dir", str(rdb), "--enable-debug-command", "local") as url:
        client = redis.Redis.from_url(url)
        client.execute_command("DEBUG", "POPULATE", "300000")
        client.save()
        client.shutdown(nosave=True)  # its data in rdb/dump.rdb
    sock = tmp_path / "loading.sock"
    # 50 µs a key: some 15 s of LOADING, the time doctor needs to meet it.
    server = subprocess.Popen(
        [*dies_with_this_process(), exe, "--port", "0", "--unixsocket", str(sock)]
        + ["--dir", str(rdb), "--save", "", "--key-load-delay", "50"]
        + ["--loading-process-events-interval-bytes", "1024"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"unix://{sock}"
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:  # bounded: the socket is made as the server starts
            try:
                client.ping()
            except redis.exceptions.BusyLoadingError:
                break
            except redis.exceptions.ConnectionError:
                assert time.monotonic() < deadline, "no loading server"
                time.sleep(0.02)
            else:
                pytest.fail("the server was not loading")
        config, args = _worker_home(tmp_path, url)
        res = _refused([*args, "doctor", "--worker"], timeout=60)
        (problem,) = [x for x in res.stdout.splitlines() if x.startswith("problem:")]
        assert "still loading its dataset" in problem, problem
        assert "start Redis there" not in problem, problem
        with contextlib.suppress(redis.exceptions.ConnectionError):
            client.ping()  # still loading: what doctor met was the load
        client.close()
    finally:
        server.kill()
        server.wait()


def test_doctor_worker_names_an_unset_api_key_variable_and_never_a_key(tmp_path, redis_url):
    """An openai profile whose api_key_env names a variable unset on the worker's machine:
    doctor --worker said all was well, and the worker failed every attempt of it (each
    request went without a key), pausing the profile for every worker."""
    config, args = _worker_home(tmp_path, redis_url)
    with config.open("a", encoding="utf-8") as f:
        f.write(
            '\n[reviewers.local]\nkind = "openai"\nmodel = "m"\n'
            'base_url = "http://127.0.0.1:9"\napi_key_env = "RQ_TEST_LOCAL_KEY"\n'
        )
    env = {k: v for k, v in os.environ.items() if k != "RQ_TEST_LOCAL_KEY"}
    unset = subprocess.run([*args, "doctor", "--worker"], capture_output=True, text=True, env=env)
    assert unset.returncode == 1, unset.stdout
    (line,) = [x for x in unset.stdout.splitlines() if "RQ_TEST_LOCAL_KEY" in x]
    assert line.startswith("problem: reviewer local (openai): RQ_TEST_LOCAL_KEY"), line
    assert "is not set" in line, line
    _start_and_stop_a_worker(args, tmp_path / "remote")  # its log says it too, at its start
    said = [r for r in _worker_log(tmp_path / "remote") if r["event"] == "worker.key_unset"]
    assert [(r["reviewer"], r["level"]) for r in said] == [("local", "error")], said
    key = "sk-test-0123456789abcdef"
    env["RQ_TEST_LOCAL_KEY"] = key
    set_ = subprocess.run([*args, "doctor", "--worker"], capture_output=True, text=True, env=env)
    assert "RQ_TEST_LOCAL_KEY" not in set_.stdout and key not in set_.stdout + set_.stderr
    # What is left is its endpoint, where nothing listens (doctor tries it now).
    (line,) = [x for x in set_.stdout.splitlines() if "reviewer local" in x]
    assert line.startswith("problem: reviewer local (openai): cannot reach http://127.0.0.1:9/")


def _await_event(home: Path, event: str, after: int, timeout: float = 30) -> dict:
    """The first ``event`` line of the worker's log past its first ``after`` lines."""
    deadline = time.monotonic() + timeout
    while True:
        lines = _worker_log(home)[after:]
        found = [r for r in lines if r["event"] == event]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no {event}: {[r['event'] for r in lines]}"
        time.sleep(0.2)


def test_a_worker_says_when_its_queue_becomes_fed_and_when_it_stops_being_fed(
    kb, tmp_path, redis_url
):
    """worker.queue_unfed was said at the start only: a worker started before its control
    kept that warning as the last word all night, and one whose control stopped feeding
    its queue (moved to another database, or stopped) said nothing at all."""
    config, args = _worker_home(tmp_path, redis_url)
    home = tmp_path / "remote"
    worker = subprocess.Popen(
        [*args, "worker", "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    control = None
    try:
        _await_event(home, "worker.started", 0)
        assert [r["event"] for r in _worker_log(home)].count("worker.queue_unfed") == 1
        seen = len(_worker_log(home))
        control = _start_control(kb, redis_url)
        fed = _await_event(home, "worker.queue_fed", seen)
        assert fed["state"] == str(kb.state) and fed["level"] == "info", fed
        seen = len(_worker_log(home))
        _stop(control)  # as a control moved to another database leaves its queue
        control = None
        unfed = _await_event(home, "worker.queue_unfed", seen)
        assert unfed["level"] == "warning" and not unfed["still"], unfed
        assert "no control process has fed this queue for" in unfed["reason"], unfed
        assert f"state folder {kb.state}" in unfed["reason"], unfed
        doctor = _refused([*args, "doctor", "--worker"])  # and doctor says the same
        assert doctor.returncode == 1 and "has fed this queue for" in doctor.stdout, doctor.stdout
        said = [r["event"] for r in _worker_log(home)[seen:]]
        assert said.count("worker.queue_unfed") == 1, said  # said once, not at every look
    finally:
        if control is not None:
            _stop(control)
        _stop(worker)


@pytest.mark.parametrize(
    ("mode", "words"), [("full", "maxmemory"), ("unsaved", "stop-writes-on-bgsave-error")]
)
def test_a_worker_beside_a_full_redis_does_not_say_its_running_control_stopped(
    kb, tmp_path, mode, words
):
    """A Redis filled by another application under `noeviction` refuses every write, the
    control's `reviewq.control` key too: five of its ticks later the worker said "no
    control process has fed this queue ... it stopped, or it now uses another Redis
    database" of a control that ran on, and sent the reader to mend a URL that was right.
    It says the server is full. So does one whose snapshot failed (its disk full): it
    refuses writes (MISCONF) until one succeeds, and the worker logged a traceback at
    each read, ~40 a second, beside the same words."""
    import redis

    from .fault.test_outages import UNSAVED_OPTIONS, _refusing_writes

    rdb = tmp_path / "rdb"
    rdb.mkdir()
    options = ("--maxmemory-policy", "noeviction", "--dir", str(rdb))
    with redis_server(tmp_path, *options, *(UNSAVED_OPTIONS * (mode == "unsaved"))) as url:
        config, args = _worker_home(tmp_path, url)
        home = tmp_path / "remote"
        control = _start_control(kb, url)
        worker = None
        undo = None
        try:
            # The worker starts once the control has fed the queue: its first look finds
            # the control's key and it says nothing of it. Started in a race with the
            # control, it said either nothing or queue_unfed then queue_fed (CI at stop 41).
            with contextlib.closing(redis.Redis.from_url(url)) as client:
                _await_first_mark(client, control)
            worker = subprocess.Popen(
                [*args, "worker", "--workers", "1"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            _await_event(home, "worker.started", 0)
            seen = len(_worker_log(home))
            assert "worker.queue_unfed" not in [r["event"] for r in _worker_log(home)]
            undo = _refusing_writes(url, mode, rdb)
            said = _await_event(home, "worker.queue_full", seen)
            assert control.poll() is None  # the control runs on
            assert "refuses writes" in said["reason"] and words in said["reason"], said
            records = _worker_log(home)[seen:]
            events = [r["event"] for r in records]
            assert "worker.queue_unfed" not in events
            # Huey's errors (a traceback a read); its own start lines (info) may come after
            # `worker.started`, the worker's guard started between them (a busy machine).
            huey = [r for r in records if r["event"].startswith("huey") and r["level"] != "info"]
            assert not huey, huey[:3]
            doctor = _refused([*args, "doctor", "--worker"], timeout=60)  # and doctor alike
            assert "refuses writes" in doctor.stdout and words in doctor.stdout, doctor.stdout
            assert "has fed" not in doctor.stdout, doctor.stdout
            undo, _ = None, undo()  # room made: the control's next tick writes its key
            _await_event(home, "worker.queue_fed", seen)
        finally:
            if undo is not None:  # a Redis that cannot save does not end on SIGTERM
                undo()
            _stop(control)
            if worker is not None:
                _stop(worker)


@pytest.mark.parametrize(
    ("mode", "words"), [("full", "maxmemory"), ("unsaved", "stop-writes-on-bgsave-error")]
)
def test_doctor_on_the_control_s_side_says_a_redis_refuses_writes(kb, tmp_path, mode, words):
    """A Redis that refuses every write (full under `noeviction`, or its last snapshot
    failed: MISCONF) was "ok: queue backend Redis answers" to a plain `reviewq doctor`,
    and nothing else, while nothing could be sent: the operator who asks why no review
    runs was told all is well. It says the server refuses writes, why, and what mends it."""
    from .fault.test_outages import UNSAVED_OPTIONS, _refusing_writes

    rdb = tmp_path / "rdb"
    rdb.mkdir()
    options = ("--maxmemory-policy", "noeviction", "--dir", str(rdb))
    with redis_server(tmp_path, *options, *(UNSAVED_OPTIONS * (mode == "unsaved"))) as url:
        _control_home(kb, url)
        undo = _refusing_writes(url, mode, rdb)
        try:
            doctor = subprocess.run(
                [EXE, "--root", str(kb.root), "doctor"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            undo()
        assert "Traceback" not in doctor.stderr, doctor.stderr
        warned = [line for line in doctor.stdout.splitlines() if "refuses writes" in line]
        assert len(warned) == 1 and words in warned[0], doctor.stdout
        assert warned[0].startswith("warning: "), warned


def _said_a_restart_and_unsaved(client, warned: str, tmp_path: Path) -> None:  # noqa: ANN001 - a redis.Redis
    """What doctor's words say of a Redis 7 under `enable-protected-configs no`, tried."""
    import redis

    # "Redis refuses `CONFIG SET dir` while it runs": so it does.
    assert "refuses `CONFIG SET dir`" in warned and "restart" in warned, warned
    with pytest.raises(redis.exceptions.ResponseError, match="protected config"):
        client.config_set("dir", str(tmp_path))
    # "`CONFIG SET stop-writes-on-bgsave-error no` lets writes through at once but
    # leaves it unsaved": so it does, and the refusal is back with the setting.
    assert "`CONFIG SET stop-writes-on-bgsave-error no`" in warned, warned
    assert "leaves it unsaved" in warned, warned
    client.config_set("stop-writes-on-bgsave-error", "no")
    client.set("taken", "1")
    assert client.info("persistence")["rdb_last_bgsave_status"] == "err"
    client.config_set("stop-writes-on-bgsave-error", "yes")
    with pytest.raises(redis.exceptions.ResponseError, match="MISCONF"):
        client.set("taken", "2")


@pytest.mark.parametrize("protected", ["no", "yes"])
def test_the_words_for_a_redis_whose_snapshot_failed_are_what_mends_it(kb, tmp_path, protected):
    """K74's remedy for a Redis that refuses writes after a failed snapshot said to mend
    what its log says and let a snapshot succeed, no more: a reader whose snapshot folder
    was the trouble reached for `CONFIG SET dir`, which Redis 7 refuses while it runs (a
    protected config), and was not told that only a restart moves it, nor what lets
    writes through at once. K78's words said the refusal of every Redis: one that takes
    `CONFIG SET dir` (`enable-protected-configs yes`, Redis 6.2) was restarted for
    nothing. Each thing the words say is tried on the real server."""
    import redis

    from .fault.test_outages import UNSAVED_OPTIONS, _refusing_writes, _snapshot_said

    rdb = tmp_path / "rdb"
    rdb.mkdir()
    options = ("--dir", str(rdb), "--enable-protected-configs", protected, *UNSAVED_OPTIONS)
    with redis_server(tmp_path, *options) as url:
        _control_home(kb, url)
        undo = _refusing_writes(url, "unsaved", rdb)
        client = redis.Redis.from_url(url)
        try:
            doctor = subprocess.run(
                [EXE, "--root", str(kb.root), "doctor"], capture_output=True, text=True, timeout=60
            )
            (warned,) = [x for x in doctor.stdout.splitlines() if "refuses writes" in x]
            assert "make room on its disk" in warned and "a BGSAVE" in warned, warned
            if protected == "yes":
                # "`CONFIG SET dir FOLDER` moves the snapshot elsewhere, then a BGSAVE".
                assert "`CONFIG SET dir FOLDER` moves the snapshot" in warned, warned
                assert "restart" not in warned, warned
                (tmp_path / "elsewhere").mkdir()
                client.config_set("dir", str(tmp_path / "elsewhere"))
                _snapshot_said(client, "ok")
                client.set("taken", "0")
                client.config_set("dir", str(rdb))  # back, for the undo's own snapshot
            else:
                _said_a_restart_and_unsaved(client, warned, tmp_path)
        finally:
            undo()  # the snapshot's file made writable again, then a BGSAVE
        client.set("taken", "3")  # "then a BGSAVE lets writes through again"
        client.close()


def test_a_queue_that_lost_its_keys_is_not_said_never_fed(tmp_path, redis_url, monkeypatch):
    """Redis restarted without its data loses the control's `reviewq.control` key with the
    messages. A worker that had seen its queue fed a moment before said "no control process
    has ever fed this queue ... give the URL the database and server of the control's"
    until the control's next tick wrote it again: the URL was right all along. It now waits
    as for a control it heard from, and names that control once five of its ticks pass."""
    from orchestrator import logs
    from orchestrator.config import load_settings
    from workers import consumers, queues

    config, _ = _worker_home(tmp_path, redis_url)
    home = tmp_path / "remote"
    settings = load_settings(home, home / "s", config)
    logs.configure(settings.state_dir)
    huey = queues.huey_for(settings, "review")
    queues.mark_fed(huey, Path("/srv/site/.reviewq"), every=60.0)
    watch = consumers.FeedWatch(settings, huey)
    assert watch.look()["state"] == "/srv/site/.reviewq"
    huey.storage.conn.delete(queues.FED_KEY)  # as a Redis restarted empty leaves it
    assert watch.look() == {}
    assert "worker.queue_unfed" not in [r["event"] for r in _worker_log(home)]
    later = queues.queue_clock(huey) + 5 * 60 + 1
    monkeypatch.setattr(consumers, "queue_clock", lambda _huey: later)
    watch.look()
    (said,) = [r for r in _worker_log(home) if r["event"] == "worker.queue_unfed"]
    assert "has fed this queue for" in said["reason"], said
    assert "state folder /srv/site/.reviewq" in said["reason"], said


# --- a --state the worker cannot write -----------------------------------------------------------


def _immutable(path: Path) -> bool:
    """chattr +i: even root cannot write it (tests run as root, where modes do not stop it)."""
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


def test_a_worker_folder_it_cannot_write_is_refused_at_start(tmp_path, redis_url):
    """A --state whose log could be written but not the folder its attempts go in: the
    worker started, then every attempt failed to prepare its folder, a launch failure
    that paused the profile for every worker; doctor --worker said all was well."""
    config, args = _worker_home(tmp_path, redis_url)
    state = tmp_path / "remote" / "s"
    (state / "logs").mkdir(parents=True)
    if not _immutable(state):
        pytest.skip("chattr +i is not available on this file system")
    try:
        res = _refused([*args, "worker", "--workers", "1"])
        doctor = _refused([*args, "doctor", "--worker"])
    finally:
        subprocess.run(["chattr", "-i", str(state)], check=True)
    assert res.returncode == 1, res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: --state {state}: "), line
    assert f"{state / 'attempts'}" in line or f"{state / 'run'}" in line, line
    assert doctor.returncode == 1
    assert f"problem: --state {state}: " in doctor.stdout, doctor.stdout


def test_a_worker_folder_on_a_read_only_mount_is_named_so(tmp_path, redis_url):
    """A --state on a read-only mount was refused as "cannot be written by this user (uid
    0)": root, told its uid could not write, looked for permissions to mend."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount a read-only folder of its own")
    config, args = _worker_home(tmp_path, redis_url)
    state = tmp_path / "remote" / "s"
    state.mkdir()
    ro = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
          f'mount -t tmpfs -o size=1m,ro rq-ro "{state}" && exec "$0" "$@"']  # fmt: skip
    res = _refused([*ro, *args, "worker", "--workers", "1"])
    if "mount" in res.stderr and "--state" not in res.stderr:
        pytest.skip(f"cannot mount a read-only tmpfs here: {res.stderr.strip()}")
    doctor = _refused([*ro, *args, "doctor", "--worker"])
    assert res.returncode == 1, res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: --state {state}: "), line
    assert line.endswith(f"{state} is on a read-only file system"), line
    assert f"{state} is on a read-only file system" in doctor.stdout, doctor.stdout


# --- a worker.toml whose profiles are not the control's ------------------------------------------


def test_a_worker_without_a_profile_the_control_has_is_named_before_it_fails_its_jobs(
    kb, tmp_path, redis_url
):
    """A [reviewers.X] the control has and worker.toml lacks (or writes another partition):
    the worker took X's messages, failed each as a launch failure, and paused X for every
    worker; doctor --worker said all was well."""
    kb.gate("prose/body-check", ["body"])
    kb.write(
        "reviewq.toml",
        f'[queue]\nurl = "{redis_url}"\nreaper_seconds = 0.5\n\n'
        '[reviewers.fake]\nkind = "command"\ncommand = ["x"]\npartition = "fake-v2"\n\n'
        '[reviewers.extra]\nkind = "command"\ncommand = ["x"]\n',
    )
    control = subprocess.Popen(
        [EXE, "--root", str(kb.root), "control"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        config, args = _worker_home(tmp_path, redis_url)  # fake, partition "fake"; no extra
        deadline = time.monotonic() + 30
        while True:
            res = _refused([*args, "doctor", "--worker"])
            if "ok: a control process feeds" in res.stdout or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert res.returncode == 1, res.stdout
        problems = [line for line in res.stdout.splitlines() if line.startswith("problem:")]
        assert len(problems) == 2, res.stdout
        extra = next(p for p in problems if "'extra'" in p)
        assert f"not in {config}" in extra and "pause" in extra, extra
        fake = next(p for p in problems if "'fake'" in p)
        assert "'fake-v2'" in fake and "'fake'" in fake, fake

        _start_and_stop_a_worker(args, tmp_path / "remote")
        said = [
            r for r in _worker_log(tmp_path / "remote") if r["event"] == "worker.profile_unlike"
        ]
        assert sorted(r["reviewer"] for r in said) == ["extra", "fake"], said
        assert all(r["level"] == "error" for r in said), said
    finally:
        _stop(control)


# --- a pause names the host whose agents failed to start ----------------------------------------

ONE_HOST_QUEUE = (
    "[queue]\nlaunch_failures_before_pause = 2\nlaunch_backoff_seconds = 1\nmax_attempts = 3\n"
)


def _control_of_two_jobs(kb):  # noqa: ANN202
    """Two queued one-pair jobs of the offline profile, a control on a clock the test moves,
    and ``answer(host, classification)`` that dispatches and takes that outcome from a
    worker on ``host``."""
    from datetime import UTC, datetime, timedelta

    from orchestrator.control.control import Control
    from orchestrator.control.followup import FollowUp
    from orchestrator.state.workspace import Workspace
    from orchestrator.sweeps.producer import SweepRequest, enqueue

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("beta")
    kb.write("reviewq.toml", ONE_HOST_QUEUE)
    ws = Workspace.open(kb.root)
    enqueue(ws, SweepRequest(name="cli", reviewer="offline", all_gates=True, batch_size=1))
    clock = [datetime.now(UTC)]
    sent: list[dict] = []
    control = Control(ws, send_review=sent.append, now=lambda: clock[0], hooks=FollowUp(ws))

    def answer(host: str, classification: str) -> None:
        clock[0] += timedelta(seconds=400)  # past any job's launch backoff
        assert control.dispatch() >= 1
        msg = sent[-1]
        ran = classification != "launch-failure"
        control.on_outcome(
            {
                "job_id": msg["job_id"],
                "attempt": msg["attempt"],
                "classification": classification,
                "reasons": ["could not start 'agent-cli': No such file or directory"]
                if not ran
                else ["no output file"],
                "exit_code": 1 if ran else None,
                "worker": f"{host}:42",
                "host": host,
                **({"exited_at": 1.0, "started_at": "2026-01-01T00:00:00.000Z"} if ran else {}),
            }
        )

    return ws, control, answer


def test_a_pause_names_the_host_whose_agents_failed_to_start(kb):
    """With workers on several machines, a pause that said only "its agent failed to
    start" left the operator to find which machine lacks the program. The profile is
    paused for every worker (one queue serves them all); its reason names the host."""
    ws, control, answer = _control_of_two_jobs(kb)
    answer("good-host", "no-output")
    answer("bad-host", "launch-failure")
    answer("bad-host", "launch-failure")
    (pause,) = control.paused().values()
    assert pause.reason.startswith("its agent failed to start on bad-host: could not start")
    ws.store.close()


# --- TLS: the scheme that does not match the port, a CA the client does not trust ----------------


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def _openssl(d: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)


def _make_ca(d: Path, name: str, *, strict: bool) -> Path:
    """A CA of the test's own in ``d/NAME.crt`` (key ``NAME.key``): with ``strict`` the
    extensions Python 3.13's strict X.509 checks ask of a CA (OpenSSL's ``req -x509`` here
    leaves out key usage, so 3.13 refused every certificate it signed)."""
    strict_ext = ("-addext", "basicConstraints=critical,CA:TRUE",
                  "-addext", "keyUsage=critical,keyCertSign,cRLSign") if strict else ()  # fmt: skip
    _openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN=reviewq-test-{name}",
             *strict_ext)  # fmt: skip
    return d / f"{name}.crt"


@pytest.fixture
def tls_redis(tmp_path):
    """A redis-server with TLS only on a loopback port, its certificate signed by a CA of
    the test's own: (port, the CA's file)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path / "tls"
    d.mkdir()

    ssl_ = functools.partial(_openssl, d)
    _make_ca(d, "ca", strict=True)
    ssl_("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
         "-subj", "/CN=localhost")  # fmt: skip
    (d / "ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    ssl_("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "ext")  # fmt: skip
    port = _free_port()
    tls = ("--tls-port", str(port), "--tls-cert-file", str(d / "server.crt"),
           "--tls-key-file", str(d / "server.key"), "--tls-ca-cert-file", str(d / "ca.crt"),
           "--tls-auth-clients", "no")  # fmt: skip
    with redis_server(d, *tls):
        yield port, d / "ca.crt"


def test_a_redis_url_without_tls_to_a_tls_port_is_refused(tmp_path, tls_redis):
    """redis:// to a port that speaks only TLS: every read was reset, taken for an outage."""
    port, _ = tls_redis
    url = f"redis://127.0.0.1:{port}/0"
    config, args = _worker_home(tmp_path, url)
    line = _worker_refuses(args, config, url)
    assert "TLS" in line and "rediss://" in line, line


def test_a_tls_certificate_the_client_does_not_trust_is_refused(tmp_path, tls_redis):
    port, ca = tls_redis
    url = f"rediss://127.0.0.1:{port}/0"
    config, args = _worker_home(tmp_path, url)
    line = _worker_refuses(args, config, url)
    assert "certificate" in line and "ssl_ca_certs" in line, line
    _, args = _worker_home(tmp_path, f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}")
    ok = _refused([*args, "doctor", "--worker"])
    assert "ok: queue backend Redis answers" in ok.stdout, ok.stdout


def test_a_ca_file_the_url_names_already_is_not_asked_for_again(tmp_path, tls_redis):
    """A URL whose ssl_ca_certs names another CA than the server's: the line told the
    person to name its CA with ssl_ca_certs, which they had done; it names their file."""
    port, ca = tls_redis
    other = _make_ca(ca.parent, "other", strict=True)
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={other}"
    config, args = _worker_home(tmp_path, url)
    line = _worker_refuses(args, config, url)
    assert f"the CA file ssl_ca_certs names ({other}) does not vouch for it" in line, line
    assert "name the CA that signed the server's certificate" in line, line


def test_a_ca_without_key_usage_is_said_so_where_python_refuses_it(tmp_path):
    """Python 3.13 checks X.509 strictly by default: a CA made with `openssl req -x509`
    alone (no key usage) that 3.11 and 3.12 trust is refused there, and the line said to
    name the CA the URL named already. It says what the CA lacks and how to make one."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path / "tls"
    d.mkdir()
    ca = _make_ca(d, "ca", strict=False)
    _openssl(d, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
             "server.csr", "-subj", "/CN=localhost")  # fmt: skip
    (d / "ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl(d, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "ext")  # fmt: skip
    port = _free_port()
    tls = ("--tls-port", str(port), "--tls-cert-file", str(d / "server.crt"),
           "--tls-key-file", str(d / "server.key"), "--tls-ca-cert-file", str(ca),
           "--tls-auth-clients", "no")  # fmt: skip
    with redis_server(d, *tls):
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}"
        config, args = _worker_home(tmp_path, url)
        res = _refused([*args, "doctor", "--worker"])
        if sys.version_info < (3, 13):
            assert "ok: queue backend Redis answers" in res.stdout, res.stdout
            return
        assert f"the CA file ssl_ca_certs names ({ca}) does not vouch for it" in res.stdout
        assert "keyUsage=critical,keyCertSign,cRLSign" in res.stdout, res.stdout


def test_a_tls_url_to_a_redis_without_tls_is_refused(tmp_path):
    """rediss:// to a plain Redis port: the handshake timed out, taken for an outage."""
    port = _free_port()
    with redis_server(tmp_path, "--port", str(port), "--bind", "127.0.0.1"):
        url = f"rediss://127.0.0.1:{port}/0"
        config, args = _worker_home(tmp_path, url)
        line = _worker_refuses(args, config, url, timeout=30)
    assert "without TLS" in line and "redis://" in line, line


def _protected_mode_redis():
    """A loopback port that answers as a redis-server in protected mode answers a client
    from another machine (no password set): its DENIED line at once, then it closes."""
    return _answering(
        b"-DENIED Redis is running in protected mode because protected mode is enabled and "
        b"no password is set for the default user. In this mode connections are only accepted "
        b"from the loopback interface. If you want to connect from external computers to "
        b"Redis you may adopt one of the following solutions: ...\r\n",
        read_first=False,
    )


def test_a_redis_in_protected_mode_is_refused_in_one_line(tmp_path):
    """A Redis without a password reached from another machine answers DENIED to every
    command: check_queue let redis-py's ResponseError out as a traceback."""
    with _protected_mode_redis() as port:
        config, args = _worker_home(tmp_path, f"redis://127.0.0.1:{port}/0")
        res = _refused([*args, "worker", "--workers", "1"])
        doctor = _refused([*args, "doctor", "--worker"])
    assert res.returncode == 1, res.stderr
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: {config} [queue] url redis://127.0.0.1:{port}/0"), line
    assert "protected mode" in line and "requirepass" in line, line
    assert doctor.returncode == 1 and "protected mode" in doctor.stdout, doctor.stdout


@pytest.mark.parametrize("db", ["99", "99999999999999999999"])
def test_a_redis_database_the_server_does_not_have_is_refused_in_one_line(tmp_path, redis_url, db):
    """A database past the server's `databases` (16 by default): the worker started, read
    nothing and logged nothing, for good; the control said the server refused BLMOVE."""
    url = _on_db(redis_url, int(db))
    config, args = _worker_home(tmp_path, url)
    line = _worker_refuses(args, config, url)
    assert "the Redis server has no such database" in line, line


def test_a_password_in_the_urls_query_is_not_shown(tmp_path, redis_with_password):
    """redis-py takes the password from the query too (?password=...): the refusal, doctor
    and the worker's log printed it whole."""
    config, args = _worker_home(tmp_path, f"{redis_with_password}?password=not-the-password")
    res = _refused([*args, "worker", "--workers", "1"])
    doctor = _refused([*args, "doctor", "--worker"])
    assert res.returncode == 1 and "refused" in res.stderr, res.stderr
    assert "not-the-password" not in res.stderr, res.stderr
    assert doctor.returncode == 1 and "not-the-password" not in doctor.stdout, doctor.stdout
    _, args = _worker_home(tmp_path, f"{redis_with_password}?password={PASSWORD}")
    worker = subprocess.Popen(
        [*args, "worker", "--workers", "1"], stderr=subprocess.PIPE, text=True
    )
    try:
        for line in worker.stderr:
            if "worker.started" in line:
                break
    finally:
        worker.send_signal(signal.SIGINT)
        worker.wait(timeout=30)
    assert "worker.started" in line and PASSWORD not in line, line


def test_processes_on_a_sqlite_queue_leave_redis_unimported_and_a_redis_queue_has_it():
    """Huey's storage module imports redis (~50-90 ms a process) whatever the queue; a
    sweep's processes on SQLite skip it, and the first Redis queue hands it to Huey and to
    the errors a queue is waited out on."""
    probe = (
        "import sys, orchestrator.cli, workers.consumers, workers.sweep, workers.tasks\n"
        "assert 'redis' not in sys.modules, 'redis imported on a SQLite queue'\n"
        "import huey.storage, redis, redis.exceptions\n"
        "from workers import queues\n"
        "queues.RedisQueueStorage('x', url='redis://127.0.0.1:1/0', read_timeout=1)\n"
        "assert huey.storage.Redis is redis.Redis, huey.storage.Redis\n"
        "assert huey.storage.RedisStorage.redis_client is redis.Redis\n"
        "assert redis.exceptions.ConnectionError in queues.QUEUE_UNAVAILABLE\n"
        "assert queues._RedisTimeout is redis.exceptions.TimeoutError\n"
    )
    _passes_in_a_fresh_interpreter(probe)


def test_a_sqlite_queue_starts_where_the_redis_package_is_blocked_as_not_installed(tmp_path):
    """sys.modules['redis'] = None (how a test, or an embedder, says redis is not
    installed) made the import of workers.queues hand Huey the package it could not
    import: every command on a SQLite queue ended in "internal error"."""
    probe = (
        "import sys, pathlib\n"
        "sys.modules['redis'] = None\n"
        "import workers.consumers\n"
        "from orchestrator.config import load_settings\n"
        "from workers import queues\n"
        f"settings = load_settings(pathlib.Path({str(tmp_path)!r}))\n"
        "queues.huey_for(settings, 'control')\n"
        "assert queues.QUEUE_UNAVAILABLE[0] is __import__('sqlite3').OperationalError\n"
    )
    (tmp_path / "kb").mkdir()
    _passes_in_a_fresh_interpreter(probe)


def _passes_in_a_fresh_interpreter(probe: str) -> None:
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_process_that_logs_leaves_rich_unimported_and_the_progress_bar_still_has_it(tmp_path):
    """structlog imports rich (~40 ms a process) for tracebacks reviewq renders plainly; a
    control or worker logs without it, and a sweep's progress bar imports it as before."""
    probe = (
        "import sys, pathlib, orchestrator.cli, workers.consumers\n"
        "from orchestrator import logs\n"
        f"logs.configure(pathlib.Path({str(tmp_path)!r}), process='worker')\n"
        "logs.get().info('probe.line', n=1)\n"
        "assert 'rich' not in sys.modules, 'rich imported by logging'\n"
        "from orchestrator.cli.display import ProgressDisplay\n"
        "import rich.progress\n"
    )
    _passes_in_a_fresh_interpreter(probe)
    assert '"probe.line"' in (tmp_path / "logs" / "reviewq.jsonl").read_text()


def test_a_process_with_no_cron_sweep_leaves_croniter_unimported_and_a_bad_cron_is_refused():
    """croniter (~25 ms a process) is imported where a cron expression is read, so a
    sweep's processes without a configured cron sweep skip it; a bad one is still refused."""
    probe = (
        "import sys, orchestrator.cli, workers.consumers, workers.sweep\n"
        "assert 'croniter' not in sys.modules, 'croniter imported with no cron sweep'\n"
        "from orchestrator.config import ConfigError, check_cron\n"
        "check_cron('0 3 * * 1-5')\n"
        "try:\n"
        "    check_cron('0 3 31 2 *')\n"
        "except ConfigError as exc:\n"
        "    assert 'matches no date' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('31 February taken')\n"
    )
    _passes_in_a_fresh_interpreter(probe)


def test_a_sweep_that_draws_no_progress_bar_leaves_rich_unimported():
    """A sweep with --json, or whose stderr is no terminal, imports rich (~50 ms) for
    nothing; it is imported where a bar or a summary table is drawn."""
    probe = (
        "import sys, orchestrator.cli, workers.sweep\n"
        "from orchestrator.cli.display import ProgressDisplay\n"
        "with ProgressDisplay(enabled=False) as display:\n"
        "    display.update(None)\n"
        "assert 'rich' not in sys.modules, 'rich imported with no bar drawn'\n"
        "with ProgressDisplay(enabled=True):\n"
        "    assert 'rich.progress' in sys.modules\n"
    )
    _passes_in_a_fresh_interpreter(probe)


def test_a_worker_process_leaves_the_controls_and_the_sweeps_modules_unimported():
    """The CLI's one-line errors named every domain error class and its commands' modules
    were all imported, so a worker loaded the control, the cycles and the selector it never
    runs; a command's module is now imported when it is asked for, and the error classes
    are looked for among the modules loaded."""
    probe = (
        "import sys, click\n"
        "from orchestrator.cli import cli\n"
        "with click.Context(cli) as ctx:\n"
        "    assert cli.get_command(ctx, 'worker').name == 'worker'\n"
        "import workers.consumers, workers.attempt\n"
        "control = ('orchestrator.control.control', 'orchestrator.cycles.escalations',\n"
        "           'orchestrator.review.selector', 'orchestrator.sweeps.producer',\n"
        "           'orchestrator.cli.review')\n"
        "loaded = [m for m in control if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "from orchestrator.cli.common import domain_errors\n"
        "from orchestrator.config import ConfigError\n"
        "assert ConfigError in domain_errors()\n"
        "import orchestrator.cycles.escalations as esc\n"
        "assert esc.DecideError in domain_errors()\n"
        "with click.Context(cli) as ctx:\n"
        "    assert set(cli.list_commands(ctx)) >= {'worker', 'control', 'sweep', 'report', 'ack'}\n"
    )
    _passes_in_a_fresh_interpreter(probe)


def test_every_command_is_imported_from_the_module_named_for_it():
    """The group imports a command's module by name: one missing from the map, or named
    with the wrong module, would be an unknown command in a fresh process."""
    from orchestrator.cli.common import COMMANDS, cli

    with click.Context(cli) as ctx:
        names = cli.list_commands(ctx)
        assert sorted(COMMANDS) == sorted(names)
        for name in names:
            assert cli.get_command(ctx, name).callback.__module__ == COMMANDS[name], name


def test_a_sweep_forks_its_children_only_with_no_sqlite_file_open(tmp_path):
    """A child forked with the sweep's SQLite files open shares SQLite's per-file lock
    records with it, and its own connection's locks go when an inherited one is closed: the
    sweep forks only before it opens state.db or a queue, else starts them afresh. Forked
    and never started (a refused enqueue), they end when dismissed."""
    (tmp_path / "kb").mkdir()
    probe = (
        "import os\n"
        "from orchestrator.state.workspace import Workspace\n"
        "from workers import sweep\n"
        f"ws = Workspace.open({str(tmp_path)!r})\n"
        "children = sweep.Children(ws, 1)\n"
        "import sqlite3\n"
        f"other = sqlite3.connect({str(tmp_path / 'queue.sqlite3')!r})\n"
        "other.execute('CREATE TABLE t (x)').connection.commit()\n"
        "assert sweep._sqlite_files_open()  # known by its header, not its name\n"
        "other.close()\n"
        "assert not sweep._sqlite_files_open()\n"
        "ws.store.conn.execute('SELECT 1')\n"
        "assert sweep._sqlite_files_open()\n"
        "children.fork()\n"
        "assert children.waiting == {}, children.waiting\n"
        "ws.close()\n"
        "assert not sweep._sqlite_files_open()\n"
        "children.fork()\n"
        "pids = [pid for pid, _ in children.waiting.values()]\n"
        "assert sorted(children.waiting) == ['control', 'worker'], children.waiting\n"
        "children.stop(at_once=True)\n"
        "assert children.waiting == {}\n"
        "for pid in pids:\n"
        "    try:\n"
        "        os.waitpid(pid, 0)\n"
        "    except ChildProcessError:\n"
        "        pass\n"
        "    else:\n"
        "        raise AssertionError(f'{pid} not reaped')\n"
    )
    _passes_in_a_fresh_interpreter(probe)


def test_a_forked_child_reaped_elsewhere_reads_as_gone_not_as_an_error():
    """A forked child of the sweep is waited for by pid: one reaped already (SIGCHLD
    ignored, another wait) raised ChildProcessError out of the sweep's look at its children,
    where a Popen says it is gone."""
    from workers.sweep import Forked

    pid = os.fork()
    if pid == 0:
        os._exit(3)
    os.waitpid(pid, 0)
    child = Forked(pid, ["x"])
    assert child.poll() == 0 and child.wait(timeout=1) == 0
    child.send_signal(signal.SIGTERM)  # gone: nothing to signal, no error


def test_a_forked_worker_is_named_by_its_own_pid_and_each_child_logs_as_itself(tmp_path):
    """The sweep imports workers.tasks before it forks, and its worker id (host:pid, in
    every heartbeat, attempt row and ``attempt.lost`` line: the process an operator looks
    for) was taken at that import: the forked worker carried the sweep's pid. Each forked
    child's log lines name it (process=control/worker), not the sweep's setup."""
    (tmp_path / "kb").mkdir()
    probe = (
        "import json, os, time\n"
        "from orchestrator import logs\n"
        "from orchestrator.state.workspace import Workspace\n"
        "from workers import sweep\n"
        f"ws = Workspace.open({str(tmp_path)!r})\n"
        "logs.configure(ws.state_dir)\n"
        "children = sweep.Children(ws, 1)\n"
        "children.fork()\n"
        "assert sorted(children.waiting) == ['control', 'worker'], children.waiting\n"
        "children.start()\n"
        "pids = {name: p.pid for name, p in children.procs.items()}\n"
        "paths = [logs.log_path(ws.state_dir), logs.log_path(ws.state_dir / 'worker')]\n"
        "seen = {}\n"
        "try:\n"
        "    for _ in range(600):  # bounded: the two start-up lines, read as written\n"
        "        text = ''.join(p.read_text() for p in paths if p.exists())\n"
        "        for line in text.splitlines():\n"
        "            e = json.loads(line)\n"
        "            if e['event'] in ('worker.started', 'control.started'):\n"
        "                seen[e['event']] = e\n"
        "        if len(seen) == 2:\n"
        "            break\n"
        "        time.sleep(0.05)\n"
        "finally:\n"
        "    children.stop(at_once=True)\n"
        "assert len(seen) == 2, (seen, text)\n"
        "worker, control = seen['worker.started'], seen['control.started']\n"
        "assert worker['process'] == 'worker' and control['process'] == 'control', seen\n"
        "assert control['pid'] == pids['control'], (control, pids)\n"
        "assert worker['worker'].rsplit(':', 1)[1] == str(pids['worker']), (worker, pids, os.getpid())\n"
    )
    _passes_in_a_fresh_interpreter(probe)


def test_a_forked_child_killed_while_it_waits_is_started_afresh(tmp_path):
    """A child forked to wait for the jobs' commit and killed meanwhile (an operator's
    `kill`, the OOM killer) made the sweep's write of its start byte fail: a BrokenPipeError
    out of the commit's callbacks, and the sweep ended in an internal error with its jobs
    recorded. The child is started afresh instead, as a restart is."""
    (tmp_path / "kb").mkdir()
    probe = (
        "import os, signal, subprocess\n"
        "from orchestrator.state.workspace import Workspace\n"
        "from workers import sweep\n"
        f"ws = Workspace.open({str(tmp_path)!r})\n"
        "children = sweep.Children(ws, 1)\n"
        "children.fork()\n"
        "pid = children.waiting['control'][0]\n"
        "os.kill(pid, signal.SIGKILL)\n"
        "os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped\n"
        "try:\n"
        "    children.start()\n"
        "    control = children.procs['control']\n"
        "    assert isinstance(control, subprocess.Popen), control\n"
        "    assert control.pid != pid and control.poll() is None\n"
        "    assert isinstance(children.procs['worker'], sweep.Forked)\n"
        "finally:\n"
        "    children.stop(at_once=True)\n"
        "try:\n"
        "    os.waitpid(pid, os.WNOHANG)\n"
        "except ChildProcessError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError(f'{pid} not reaped')\n"
    )
    _passes_in_a_fresh_interpreter(probe)


ACL_USER = ("--user", "default", "off", "--user")


@pytest.mark.parametrize(
    ("options", "userinfo", "said"),
    [
        (("--replicaof", "127.0.0.1", "1"), "", "a read-only replica: give the URL its master"),
        (
            (*ACL_USER, "app", "on", f">{PASSWORD}", "~reviewq*", "+@all"),
            f"app:{PASSWORD}",
            "its ACL user needs reviewq's commands on the keys huey.* and reviewq.*",
        ),
    ],
    ids=["read-only-replica", "acl-without-hueys-keys"],
)
def test_a_redis_that_refuses_the_queues_writes_is_refused_at_start(
    kb, tmp_path, options, userinfo, said
):
    """A URL naming a read-only replica, or an ACL user whose keys leave out Huey's: the
    server answers PING, and refuses every read of the queue (BRPOP is a write). The
    worker started and logged a traceback at each poll, ~40 a second (1 MB of log in
    8 s), for good; the control and doctor named neither the file nor the URL."""
    with redis_server(tmp_path, *options) as url:
        url = _with_credentials(url, userinfo) if userinfo else url
        config, args = _worker_home(tmp_path, url)
        line = _worker_refuses(args, config, url.replace(PASSWORD, "***"))
        assert said in line and "RPOPLPUSH" in line, line
        assert PASSWORD not in line
        doctor = _refused([*args, "doctor", "--worker"])
        assert doctor.returncode == 1, doctor.stdout
        assert f"problem: queue backend: {config} [queue] url" in doctor.stdout, doctor.stdout
        assert said in doctor.stdout and PASSWORD not in doctor.stdout, doctor.stdout
        kb.gate("prose/body-check", ["body"])
        kb.write("reviewq.toml", f'[queue]\nurl = "{url}"\n')
        control = _refused([EXE, "--root", str(kb.root), "control"])
        assert control.returncode == 1 and said in control.stderr, control.stderr


def test_an_acl_user_on_the_keys_operations_names_runs_a_sweep(kb, tmp_path):
    """The ACL that the refusal above and OPERATIONS §6.6 give is enough for every
    process: a sweep's control and worker run on it to the end."""
    from .test_queue_integration import FAST_QUEUE, fake_profile, rq, small_kb

    acl = (*ACL_USER, "app", "on", f">{PASSWORD}", "~huey.*", "~reviewq.*", "+@all", "-@dangerous")
    with redis_server(tmp_path, *acl) as url:
        small_kb(kb, notes=2)
        url = _with_credentials(url, f"app:{PASSWORD}")
        kb.write("reviewq.toml", fake_profile() + FAST_QUEUE + f'url = "{url}"\n')
        res = rq(kb, "sweep", "--reviewer", "fake", "--json", timeout=90)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["jobs"]["fake"]["completed"] == 4
    log = (kb.state / "logs" / "reviewq.jsonl").read_text()
    assert "queue.unmarked" not in log and "NOPERM" not in log and "No permissions" not in log


def _log_events(k, event: str) -> list[dict]:
    log = k.state / "logs" / "reviewq.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return [json.loads(x) for x in lines if f'"{event}"' in x]


def _await_control_started(k, proc: subprocess.Popen) -> None:
    """Until ``proc``, the control of KB ``k``, logs ``control.started`` (it must not exit)."""
    deadline = time.monotonic() + 30
    while not _log_events(k, "control.started"):
        assert time.monotonic() < deadline and proc.poll() is None, proc.poll()
        time.sleep(0.1)


def _await_first_mark(client, proc: subprocess.Popen) -> None:  # noqa: ANN001 - a redis client
    """Until the control ``proc`` has written its first tick's mark, ``reviewq.control``."""
    deadline = time.monotonic() + 30
    while client.get("reviewq.control") is None:
        assert time.monotonic() < deadline and proc.poll() is None, "never ticked"
        time.sleep(0.1)


def test_a_sweep_on_a_redis_database_another_kbs_control_holds_is_refused_first(
    kb, tmp_path, redis_url
):
    """A sweep of a KB whose Redis database another KB's control holds recorded its jobs,
    started its worker (which took the other KB's review messages, its agents given this
    KB to read) and its control, refused four times before the sweep gave up. It is
    refused before anything, in the control's one line."""
    from tests.conftest import KBBuilder

    other = KBBuilder(tmp_path / "other-kb")
    other.note("alpha")
    _control_home(other, redis_url)
    first = _start_control(kb, redis_url)
    try:
        _await_control_started(kb, first)
        res = _refused(
            [EXE, "--root", str(other.root), "sweep", "--reviewer", "offline", "--workers", "1"],
            timeout=60,
        )
    finally:
        _stop(first)
    assert res.returncode == 1, res.stderr
    (line,) = res.stderr.splitlines()
    assert "another control process runs on this Redis database" in line, line
    assert f"state folder {kb.state}" in line, line
    assert not _log_events(other, "sweep.child_exited")
    with sqlite3.connect(other.state / "state.db") as conn:
        assert conn.execute("SELECT count(*) FROM review_jobs").fetchone()[0] == 0


def test_a_control_whose_acl_refuses_the_claim_runs_unclaimed_and_says_so(kb, tmp_path):
    """The claim of a control's Redis database (WATCH, then SET of `reviewq.control.claim`)
    refused by an ACL stricter than OPERATIONS gives: a traceback at the control's start
    kept it from running at all, where every queue command it needs is allowed."""
    acl = (*ACL_USER, "app", "on", f">{PASSWORD}", "~huey.*", "~reviewq.*", "+@all")
    with redis_server(tmp_path, *acl, "-@dangerous", "-watch") as url:
        url = _with_credentials(url, f"app:{PASSWORD}")
        control = _start_control(kb, url)
        try:
            _await_control_started(kb, control)
        finally:
            _stop(control)
    assert control.returncode == 0
    (said,) = _log_events(kb, "queue.unclaimed")
    assert "NOPERM" in said["error"] or "permission" in said["error"].lower(), said
    assert PASSWORD not in json.dumps(said)


def test_a_control_whose_redis_came_up_late_and_refused_the_claim_says_it_back(kb, tmp_path):
    """A Redis not up at the control's start (a boot that starts the control first) that
    comes up with an ACL refusing the claim (WATCH): the claim's failed try stayed among
    the reads failing now, never tried again, so the control never said `queue.available`
    (its log ended at `queue.unavailable`), and no later outage ran its after-outage claim
    or said its end."""
    folder = tmp_path / "late"
    folder.mkdir()
    url = _with_credentials(f"unix://{folder / 'redis.sock'}", f"app:{PASSWORD}")
    control = _start_control(kb, url)
    try:
        deadline = time.monotonic() + 30
        while not _log_events(kb, "queue.unavailable"):  # its claim met the outage
            assert time.monotonic() < deadline and control.poll() is None, control.poll()
            time.sleep(0.1)
        acl = (*ACL_USER, "app", "on", f">{PASSWORD}", "~huey.*", "~reviewq.*", "+@all")
        with redis_server(folder, *acl, "-@dangerous", "-watch"):
            _await_control_started(kb, control)
            deadline = time.monotonic() + 15
            while not _log_events(kb, "queue.available"):
                assert time.monotonic() < deadline, "the end of the outage never said"
                assert control.poll() is None, control.poll()
                time.sleep(0.1)
    finally:
        _stop(control)
    assert _log_events(kb, "queue.unclaimed")


def test_a_second_control_on_one_redis_database_is_refused_at_once(kb, tmp_path, redis_url):
    """Two KBs (two state folders) given one Redis database: the queue names are fixed, so
    the second control took the first's ticks (the first then said a false
    `control.resumed`), put back on the queue the message the first was running (its start
    restores what a killed control held), and took its outcomes; `queue.shared` came only
    at a later tick. The second is refused before it reads the queue, in one line naming
    the URL and the first; the first goes on, told nothing false; stopped, it gives the
    database up at once."""
    import redis

    from tests.conftest import KBBuilder

    other = KBBuilder(tmp_path / "other-kb")
    (other.root / "kb").mkdir(parents=True)
    first = _start_control(kb, redis_url)
    held = b"the message the first control is running"
    with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
        try:
            _await_first_mark(client, first)
            held_key = "huey.redis.reviewqcontrol.held"
            client.lpush(held_key, held)
            _control_home(other, redis_url)
            res = _refused([EXE, "--root", str(other.root), "control"])
            assert res.returncode == 1, res.stderr
            (line,) = res.stderr.splitlines()
            assert line.startswith(f"error: {other.root / 'reviewq.toml'} [queue] url "), line
            assert f"pid {first.pid}, state folder {kb.state}" in line, line
            assert "its own database" in line, line
            # Not put back; the first control's own tick may be held beside it just then.
            assert held in client.lrange(held_key, 0, -1)
            client.lrem(held_key, 1, held)
            ticks = len(_log_events(kb, "control.started"))
            assert first.poll() is None and ticks == 1
            doctor = _refused([EXE, "--root", str(other.root), "doctor"], timeout=60)
            assert doctor.returncode == 1 and "another control process feeds" in doctor.stdout
        finally:
            _stop(first)
        assert client.get("reviewq.control.claim") is None  # given up as it stopped
        second = _start_control(other, redis_url)
        try:
            _await_control_started(other, second)
        finally:
            _stop(second)
    for event in ("control.resumed", "queue.shared"):
        assert not _log_events(kb, event) and not _log_events(other, event), event


def test_a_kb_copied_with_its_state_db_is_refused_beside_its_original(kb, tmp_path, redis_url):
    """A KB folder copied whole (a staging copy, or a second KB started from a backup of
    state.db) keeps state.db's install id and reviewq.toml's URL: its control took the
    original's claim over as a rollout's, put back on the queue the message the original
    was running, and the two renewed one claim in turn, nothing said until a later tick's
    `queue.shared`. On the same host a claim of another state folder is another's: the
    copy is refused in the one line, and the original's claim is left as it was."""
    import sqlite3

    import redis

    from tests.conftest import KBBuilder

    copy = KBBuilder(tmp_path / "copied-kb")
    (copy.root / "kb").mkdir(parents=True)
    first = _start_control(kb, redis_url)
    held = b"the message the first control is running"
    with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
        try:
            _await_first_mark(client, first)
            copy.state.mkdir(parents=True)
            with (
                contextlib.closing(sqlite3.connect(kb.state / "state.db")) as src,
                contextlib.closing(sqlite3.connect(copy.state / "state.db")) as dst,
            ):
                src.backup(dst)  # as OPERATIONS §7's nightly `.backup`
            held_key = "huey.redis.reviewqcontrol.held"
            client.lpush(held_key, held)
            _control_home(copy, redis_url)
            res = _refused([EXE, "--root", str(copy.root), "control"])
            assert res.returncode == 1, res.stderr
            (line,) = res.stderr.splitlines()
            assert f"pid {first.pid}, state folder {kb.state}" in line, line
            # Not put back; the first control's own tick may be held beside it just then.
            assert held in client.lrange(held_key, 0, -1)
            client.lrem(held_key, 1, held)
            assert json.loads(client.get("reviewq.control.claim"))["pid"] == first.pid
        finally:
            _stop(first)


def test_a_claim_of_this_state_folder_by_another_path_is_its_own(kb, tmp_path, redis_url):
    """S22's rule (on one host, a claim of another state folder is another's) read the
    folder's path as a string: a sweep run through a bind mount or a second path to the
    KB, beside its own control, would be refused as a copy. The same folder is its own;
    a copy's folder is not."""
    import redis

    from orchestrator.config import load_settings
    from workers.queues import claimed_by_another

    _control_home(kb, redis_url)
    settings = load_settings(kb.root)
    install = 7
    (tmp_path / "copy").mkdir()
    kb.state.mkdir(exist_ok=True)
    (tmp_path / "other-path").symlink_to(kb.state)  # resolved by settings; not by a claim
    with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
        for state, foreign in (("other-path", False), ("copy", True)):
            claim = {"install": install, "host": socket.gethostname(), "pid": 1}
            client.set(
                "reviewq.control.claim", json.dumps({**claim, "state": str(tmp_path / state)})
            )
            held = claimed_by_another(settings, install)
            assert (held is not None) == foreign, (state, held)


def test_a_control_started_before_its_redis_is_up_is_refused_once_it_is(kb, tmp_path, redis_url):
    """At a boot the controls start before Redis answers: the claim was skipped ("the first
    tick claims it"), so a second KB's control on the first's database started its
    consumer, whose first read put back on the queue the message the first was running,
    and the two ran on, told by `queue.shared` alone. The claim waits for Redis as a read
    does, and the second control is refused in S18's line once Redis answers."""
    import redis

    from tests.conftest import KBBuilder

    other = KBBuilder(tmp_path / "other-kb")
    (other.root / "kb").mkdir(parents=True)
    first = _start_control(kb, redis_url)
    held = b"the message the first control is running"
    later = tmp_path / "later.sock"  # Redis not up yet: nothing at the socket's path
    second = None
    with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
        try:
            _await_first_mark(client, first)
            held_key = "huey.redis.reviewqcontrol.held"
            client.lpush(held_key, held)
            _control_home(other, f"unix://{later}")
            second = subprocess.Popen(
                [EXE, "--root", str(other.root), "control"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + 30
            while not _log_events(other, "queue.unavailable"):
                assert time.monotonic() < deadline and second.poll() is None, "never waited"
                time.sleep(0.1)
            later.symlink_to(redis_url.removeprefix("unix://"))  # Redis answers
            try:
                _, err = second.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                pytest.fail("the second control ran on beside the first")
            assert second.returncode == 1, err
            assert f"pid {first.pid}, state folder {kb.state}" in err.splitlines()[-1], err
            # Not put back; the first control's own tick may be held beside it just then.
            assert held in client.lrange(held_key, 0, -1)
            client.lrem(held_key, 1, held)
        finally:
            if second is not None and second.poll() is None:
                _stop(second)
            _stop(first)


def test_a_redis_restarted_without_its_data_is_claimed_again_as_the_control_reconnects(
    kb, tmp_path
):
    """Redis restarted without its data lost the claim, and the control wrote it again
    only at its next tick (a minute by default): another KB's control started meanwhile (a
    unit restarting after S18's refusal) took the database, restored what the first held,
    and the two ran on. The control claims again as its read finds Redis back."""
    import redis

    from tests.conftest import KBBuilder

    other = KBBuilder(tmp_path / "other-kb")
    (other.root / "kb").mkdir(parents=True)
    folder = tmp_path / "redis"
    folder.mkdir()
    first = None
    try:
        with redis_server(folder) as url:
            kb.gate("prose/body-check", ["body"])
            kb.write("reviewq.toml", f'[queue]\nurl = "{url}"\nreaper_seconds = 60\n')
            first = subprocess.Popen(
                [EXE, "--root", str(kb.root), "control"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 30
            with contextlib.closing(redis.Redis.from_url(url)) as client:
                while client.get("reviewq.control") is None:  # its first tick: a minute to the next
                    assert time.monotonic() < deadline and first.poll() is None, "never ticked"
                    time.sleep(0.1)
        while not _log_events(kb, "queue.unavailable"):
            assert time.monotonic() < deadline and first.poll() is None, "never missed it"
            time.sleep(0.1)
        with redis_server(folder):  # back, on the same socket, empty
            while not _log_events(kb, "queue.available"):
                assert time.monotonic() < deadline and first.poll() is None, "never back"
                time.sleep(0.1)
            _control_home(other, url)
            res = _refused([EXE, "--root", str(other.root), "control"])
            assert res.returncode == 1, res.stderr
            assert f"pid {first.pid}, state folder {kb.state}" in res.stderr, res.stderr
    finally:
        if first is not None:
            _stop(first)


def test_a_control_restarted_under_another_host_name_is_not_told_of_itself(kb, redis_url):
    """A control replaced on the same state folder by one on another host name (a
    rollout: a new container or pod is a new host name) found the old one's mark, fresh,
    at its first tick, and logged `queue.shared` about its own install, an error, at each
    rollout. The old control never writes again: only a mark written over one's own is
    another control's."""
    import redis

    with contextlib.closing(redis.Redis.from_url(redis_url)) as client:
        secs, micros = client.time()
        old = {"host": "old-pod", "state": str(kb.state), "at": "2026-11-27T00:00:00Z"}
        old |= {"reviewers": {}, "queue_at": secs + micros / 1e6, "every": 0.5}
        client.set("reviewq.control", json.dumps(old))
        control = _start_control(kb, redis_url)
        try:
            deadline = time.monotonic() + 30
            marks = set()
            while len(marks) < 3:  # its own mark, written at three ticks
                assert time.monotonic() < deadline and control.poll() is None, marks
                mark = json.loads(client.get("reviewq.control"))
                if mark["host"] != "old-pod":
                    marks.add(mark["queue_at"])
                time.sleep(0.1)
        finally:
            _stop(control)
    log = (kb.state / "logs" / "reviewq.jsonl").read_text()
    assert "control.started" in log and "queue.shared" not in log, log


def test_doctor_warns_of_a_settings_file_with_a_password_that_others_may_read(
    tmp_path, redis_with_password
):
    """The queue URL's password, or a key in a profile's env, in a file written under
    umask 022 (0644): any user of the machine could read it, and doctor said all was ok."""
    url = _with_credentials(redis_with_password, f":{PASSWORD}")
    config, args = _worker_home(tmp_path, url)
    config.chmod(0o644)
    doctor = _refused([*args, "doctor", "--worker"])  # exit 1: no control has fed it
    assert (
        f"warning: {config} holds [queue] url's password and other users may read it "
        in doctor.stdout
        and f"(mode 0644): chmod 600 {config}" in doctor.stdout
    ), doctor.stdout
    assert PASSWORD not in doctor.stdout
    config.chmod(0o600)
    doctor = _refused([*args, "doctor", "--worker"])
    assert "warning" not in doctor.stdout, doctor.stdout
    config.write_text(
        config.read_text().replace(url, redis_with_password)
        + '\n[reviewers.keyed]\nkind = "offline"\nenv = { OPENAI_API_KEY = "sk-in-the-file-1234" }\n'
    )
    config.chmod(0o640)
    doctor = _refused([*args, "doctor", "--worker"])
    assert f"warning: {config} holds [reviewers.keyed] env OPENAI_API_KEY and other" in (
        doctor.stdout
    ), doctor.stdout


def test_a_tls_keys_passphrase_in_the_urls_query_is_not_shown(tmp_path):
    """rediss:// takes the client key's passphrase as ``ssl_password`` in the query: only
    ``password`` was masked, so every line naming the queue (a refusal, doctor,
    ``worker.started``) printed the passphrase, and the log kept it."""
    secret = "KeyPass-77-secret"
    url = f"rediss://nosuchhost.invalid:6380/0?ssl_password={secret}"
    config, args = _worker_home(tmp_path, url)
    res = _refused([*args, "worker", "--workers", "1"])
    doctor = _refused([*args, "doctor", "--worker"])
    assert res.returncode == 1 and "does not resolve" in res.stderr, res.stderr
    assert "ssl_password=***" in res.stderr and secret not in res.stderr, res.stderr
    assert "ssl_password=***" in doctor.stdout and secret not in doctor.stdout, doctor.stdout


@pytest.mark.parametrize("role", ["control", "worker"])
def test_a_stop_asked_as_the_process_says_it_started_is_a_clean_stop(kb, role):
    """SIGINT the moment `control.started` (`worker.started`) is in the log: Huey sets its
    handlers last in its start, so until then Python's own took it, and the process ended
    with exit 130 (a KeyboardInterrupt) and without its stop's clean-up (`control.stopped`,
    its claim and lock let go; `worker.stopped`). strace holds each new thread's start
    (clone3) for a second, which keeps the process in that window as a loaded machine did."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (CI installs it with apt)")
    _control_home(kb, "")
    # A worker keeps its own log, under its folder in the state folder.
    home = kb if role == "control" else SimpleNamespace(state=kb.state / "worker")
    held = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=clone3"]
    proc = subprocess.Popen(
        [*held, "-e", "inject=clone3:delay_enter=1000000", EXE, "--root", str(kb.root), role],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # strace and the process, killed together on a failure
    )
    try:
        deadline = time.monotonic() + 60
        while not (started := _log_events(home, f"{role}.started")):
            assert time.monotonic() < deadline and proc.poll() is None, proc.poll()
            time.sleep(0.02)
        # The worker's line names it host:pid.
        pid = started[0].get("pid") or int(started[0]["worker"].rsplit(":", 1)[1])
        os.kill(pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert _log_events(home, f"{role}.stopped")
