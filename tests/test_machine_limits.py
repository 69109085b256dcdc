"""The limits a machine sets, met for real (stop 38): a low RLIMIT_NOFILE on a sweep's
control and worker (prlimit), a pids cgroup that fails an agent's launch with EAGAIN, a
memory cgroup whose out-of-memory killer ends an agent. Real parts: a sweep's control and
worker (real Huey consumers on a real SQLite file), agents as real subprocesses. A test
that needs what this machine cannot give (prlimit, a writable cgroup) skips saying so."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator.state.words import attempt_words, outcome_words

from .conftest import reviewq_process
from .leftovers import remove_cgroup
from .test_queue_integration import FAST_QUEUE, fake_profile, small_kb

pytestmark = pytest.mark.integration


def _lines(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    # Whole lines: a process killed in its write leaves its last one cut short.
    return [json.loads(x) for x in text.splitlines(keepends=True) if x.endswith("\n")]


def test_a_control_out_of_open_files_names_the_limit_not_a_database_it_cannot_open(kb):
    """Under `prlimit --nofile=20` the sweep's control could not open its queue's SQLite
    file: it said "unable to open database file" every few seconds for as long as it ran
    (SQLite's words for EMFILE), sending the operator to the file and its permissions
    instead of to the limit of open files."""
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is not installed")
    small_kb(kb, notes=2)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    exe = Path(sys.executable).parent / "reviewq"
    proc = subprocess.Popen(
        ["prlimit", "--nofile=20:20", "--", str(exe), "--root", str(kb.root), "sweep"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    log = kb.state / "logs" / "reviewq.jsonl"
    try:
        said = []
        deadline = time.monotonic() + 15
        while not said and time.monotonic() < deadline and proc.poll() is None:
            said = [e for e in _lines(log) if e["event"] == "queue.unavailable"]
            time.sleep(0.1)  # the log has no event to await; bounded by the deadline
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if not said:
        pytest.skip("the control did not run out of descriptors at 20 here")
    assert "RLIMIT_NOFILE" in said[0]["error"] and "20" in said[0]["error"], said[0]
    retried = [e for e in _lines(log) if e["event"] == "queue.retrying"]
    assert all("RLIMIT_NOFILE" in e["error"] for e in retried), retried


_MEMORY_V1 = Path("/sys/fs/cgroup/memory")
_CGROUP_V2 = Path("/sys/fs/cgroup")


def _memory_cgroup(name: str, limit: int) -> Path:
    """A memory cgroup of ``limit`` bytes made for this test (v2, or v1's memory
    controller), or a skip saying why none can be made here."""
    if (_CGROUP_V2 / "cgroup.controllers").exists():
        if "memory" not in (_CGROUP_V2 / "cgroup.subtree_control").read_text().split():
            pytest.skip("cgroup v2 without the memory controller enabled for children")
        group, knob = _CGROUP_V2 / name, "memory.max"
    elif (_MEMORY_V1 / "memory.limit_in_bytes").exists():
        group, knob = _MEMORY_V1 / name, "memory.limit_in_bytes"
    else:
        pytest.skip("no memory cgroup controller mounted at /sys/fs/cgroup")
    try:
        group.mkdir()
        (group / knob).write_text(str(limit))
    except OSError as exc:
        with contextlib.suppress(OSError):
            group.rmdir()
        pytest.skip(f"cannot make a memory cgroup here: {exc}")
    return group


_IN_CGROUP = """
import json, os, sys
from pathlib import Path
Path(sys.argv[1], "cgroup.procs").write_text(str(os.getpid()))
from orchestrator.config import ReviewerProfile
from workers.attempt import run_attempt
from workers.reviewers import AttemptSpec, for_profile
tmp = Path(sys.argv[2])
# Two turns in (its report says so: not a launch that failed), it wants 256 MiB.
script = (
    "import json, os; json.dump(dict(num_turns=2), open(os.environ['REVIEWQ_TELEMETRY_PATH'], 'w'));"
    "x = bytearray(256 << 20); x[::4096] = b'1' * len(x[::4096])"
)
profile = ReviewerProfile(name="c", kind="command", command=(sys.executable, "-c", script))
spec = AttemptSpec("review", 1, 1, tmp / "p", tmp / "o", tmp, tmp / "a", tmp, "m")
out = run_attempt(for_profile(profile), spec, timeout_s=30, max_turns=10)
print(json.dumps({"classification": out.classification, "exit_code": out.exit_code,
                  "reasons": out.reasons}))
"""


def test_an_agent_killed_by_its_memory_cgroup_is_the_machines_failure_not_the_jobs(tmp_path):
    """An agent the out-of-memory killer of the worker's memory cgroup ended (a real
    64 MiB limit, an agent that wants 256 MiB) was a failed attempt of its job: three such
    (the machine short of memory, whatever the note) failed the job and escalated its
    pairs. The cgroup's own count of OOM kills says it was the limit: the attempt is the
    machine's failure, said as memory and naming the limit to raise, as a full disk is."""
    group = _memory_cgroup(f"reviewq-test-{os.getpid()}", 64 << 20)
    out = _in_cgroup(group, _IN_CGROUP, tmp_path)
    assert out["exit_code"] == -signal.SIGKILL, out
    assert out["classification"] == "reviewer-failure", out
    assert out["reasons"][0].startswith("memory: "), out
    assert "out-of-memory" in out["reasons"][0], out
    said = attempt_words(out["classification"], out["reasons"][0])
    assert said.startswith("the worker's memory limit was reached: the out-of-memory"), said
    assert outcome_words(out["classification"], out["reasons"][0]) != "no model answered"


def test_an_oom_kill_is_seen_in_a_container_without_its_own_cgroup_namespace(tmp_path):
    """A container without a cgroup namespace of its own (Docker's v1 default): its
    /proc/self/cgroup names the container's memory cgroup by its path on the host, and
    the container's /sys/fs/cgroup/memory is that cgroup itself, bind-mounted. The worker
    joined the two and found no counter: an agent the container's memory limit killed
    was a no-output attempt of its job again. Made for real: a 64 MiB memory cgroup bound
    over /sys/fs/cgroup/memory in a mount namespace of the test's own."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    if not (_MEMORY_V1 / "memory.limit_in_bytes").exists():
        pytest.skip("no cgroup v1 memory controller here to bind as a container's")
    group = _memory_cgroup(f"reviewq-test-{os.getpid()}", 64 << 20)
    container = (
        'echo $$ > "$1/cgroup.procs" && mount --bind "$1" /sys/fs/cgroup/memory && '
        'exec "$3" -c "$0" /sys/fs/cgroup/memory "$2"'
    )
    res = _run_then_remove(
        group,
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", container]
        + [_IN_CGROUP, str(group), str(tmp_path), sys.executable],
    )
    if res.returncode != 0 and ("unshare" in res.stderr or "mount:" in res.stderr):
        pytest.skip(f"no mount namespace to bind the cgroup in: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.splitlines()[-1])
    assert out["exit_code"] == -signal.SIGKILL, out
    assert out["classification"] == "reviewer-failure", out
    assert out["reasons"][0].startswith("memory: "), out


def test_an_oom_kill_the_worker_cannot_count_is_said_on_the_attempt(tmp_path):
    """Where the worker finds no counter of its memory cgroup's OOM kills, an agent its
    limit killed can only be a crash of the job's. That was said once, as the worker
    started, in the worker's own log (on another machine, one nobody reads in the
    morning): the job's failure said "killed by SIGKILL" and nothing more. The attempt
    now says the worker could not tell, and where to look. Made for real: a 64 MiB memory
    cgroup joined, then the v1 controller unmounted in a mount namespace of the test's own."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    if not (_MEMORY_V1 / "memory.oom_control").exists():
        pytest.skip("no cgroup v1 memory controller here to take out of the worker's sight")
    group = _memory_cgroup(f"reviewq-test-{os.getpid()}", 64 << 20)
    joined = tmp_path / "joined"  # the script's own join, done by the shell before it
    joined.mkdir()
    unseen = (
        'echo $$ > "$1/cgroup.procs" && umount /sys/fs/cgroup/memory && exec "$3" -c "$0" "$4" "$2"'
    )
    res = _run_then_remove(
        group,
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", unseen]
        + [_IN_CGROUP, str(group), str(tmp_path), sys.executable, str(joined)],
    )
    if res.returncode != 0 and ("unshare" in res.stderr or "umount" in res.stderr):
        pytest.skip(f"no mount namespace to unmount the controller in: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.splitlines()[-1])
    assert out["exit_code"] == -signal.SIGKILL, out
    assert out["classification"] == "no-output", out
    assert any("cannot tell" in r and "doctor --worker" in r for r in out["reasons"]), out


# The worker's memory cgroup out of its sight, as on a machine whose counters it cannot
# find: the v1 memory controller unmounted in a mount namespace of the test's own.
_NO_MEMORY_CGROUP = [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "sh",
    "-c",
    'umount /sys/fs/cgroup/memory && exec "$0" "$@"',
]


def test_a_worker_that_cannot_tell_an_oom_kill_says_so_once(kb):
    """Where the worker finds no counter of its memory cgroup's OOM kills (a v2 machine
    whose memory controller is not enabled for its cgroup, a container whose cgroup files
    it cannot find), an agent the limit killed is a crash of the job's again (L43), and
    nothing said the worker could not tell. Said once: by `doctor --worker` and as the
    worker starts, not in each attempt."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    if not (_MEMORY_V1 / "memory.oom_control").exists():
        pytest.skip("no cgroup v1 memory controller here to take out of the worker's sight")
    small_kb(kb, notes=2)
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    doctor = reviewq_process(
        *("--root", str(kb.root), "doctor", "--worker"), wrap=_NO_MEMORY_CGROUP, timeout=60
    )
    if "umount" in doctor.stderr or "unshare" in doctor.stderr:
        pytest.skip(f"no mount namespace to unmount the controller in: {doctor.stderr.strip()}")
    unseen = [x for x in doctor.stdout.splitlines() if "cannot tell" in x]
    assert unseen == [unseen[0]] and unseen[0].startswith("warning: "), doctor.stdout
    assert "out-of-memory killer" in unseen[0], unseen
    sweep = reviewq_process(
        *("--root", str(kb.root), "sweep", "--reviewer", "fake"), wrap=_NO_MEMORY_CGROUP
    )
    assert sweep.returncode == 0, sweep.stderr
    said = [
        e
        for e in _lines(kb.state / "worker" / "logs" / "reviewq.jsonl")
        if e["event"] == "worker.limits_unseen"
    ]
    assert len(said) == 1 and "out-of-memory killer" in said[0]["reason"], said
    # Where the counter is found (this machine, outside the namespace), nothing is said.
    plain = reviewq_process("--root", str(kb.root), "doctor", "--worker", timeout=60)
    assert "cannot tell" not in plain.stdout, plain.stdout


# A container with a cgroup namespace of its own, its process in a 64 MiB memory cgroup
# ($1): the machine's cgroup mounts kept as they are ("keep": mountinfo gives their root
# as /.., above the namespace's), or its memory controller not mounted ("umount").
_CONTAINER = """
group=$1 how=$2; shift 2
echo $$ > "$group/cgroup.procs" || exit 97
exec unshare --cgroup --mount --propagation private sh -c \\
    '[ "$0" = keep ] || umount /sys/fs/cgroup/memory || exit 98; exec "$@"' "$how" "$@"
"""


@pytest.mark.parametrize("how", ["keep", "umount"])
def test_a_worker_in_a_cgroup_namespace_without_its_counter_says_so(kb, tmp_path, how):
    """In a cgroup namespace of its own (a container's), `/` is the container's cgroup,
    which its memory limit binds. Where the worker cannot see its counter there, an OOM
    kill is a crash of the job's: with the machine's mounts kept it read the counter of
    the machine's root memory cgroup at /sys/fs/cgroup/memory (the old guess, whose
    count the kernel never raises for a kill below it), with the controller not mounted
    it took `memory:/` for the root, where no limit applies; either way nothing said it
    could not tell. `doctor --worker` says it, and to mount the container's cgroups."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    if not (_MEMORY_V1 / "memory.oom_control").exists():
        pytest.skip("no cgroup v1 memory controller here to make a container's cgroup in")
    kb.write("reviewq.toml", fake_profile() + FAST_QUEUE)
    (tmp_path / "container.sh").write_text(_CONTAINER)
    group = _memory_cgroup(f"reviewq-test-{os.getpid()}", 64 << 20)
    try:
        doctor = reviewq_process(
            *("--root", str(kb.root), "doctor", "--worker"),
            wrap=["sh", str(tmp_path / "container.sh"), str(group), how],
            timeout=60,
        )
    finally:
        _removed(group)
    if doctor.returncode in (97, 98) or "unshare:" in doctor.stderr:
        pytest.skip(f"no cgroup or mount namespace here: {doctor.stderr.strip()}")
    unseen = [x for x in doctor.stdout.splitlines() if "cannot tell" in x]
    assert len(unseen) == 1 and "out-of-memory killer" in unseen[0], doctor.stdout
    assert "mount the container's cgroup file system" in unseen[0], unseen


def _doctor_as_nobody(nproc: int) -> list[str]:
    """The lines of `doctor --worker` run as nobody under RLIMIT_NPROC ``nproc`` that say
    the worker cannot tell something, with a state folder nobody may write; or a skip."""
    if shutil.which("setpriv") is None or shutil.which("prlimit") is None:
        pytest.skip("needs setpriv and prlimit (util-linux) to run as nobody under a limit")
    if os.geteuid() != 0:
        pytest.skip("needs root to run a worker as nobody")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    # Permission denied on a folder of its path, or on its shared library in root's home
    # (a pyenv Python: "error while loading shared libraries"): nothing to tell here.
    can = subprocess.run(
        [*as_nobody, sys.executable, "-c", ""], capture_output=True, text=True, timeout=60
    )
    if can.returncode != 0:
        pytest.skip(f"nobody cannot run this Python here: {can.stderr.strip()[-200:]}")
    state = Path(tempfile.mkdtemp(prefix="reviewq-nproc-", dir="/tmp"))  # nobody may enter
    try:
        os.chown(state, 65534, 65534)
        (state / "worker.toml").write_text(fake_profile())
        res = subprocess.run(
            ["prlimit", f"--nproc={nproc}:{nproc}", "--"]
            + as_nobody
            + [sys.executable, str(Path(sys.executable).parent / "reviewq")]
            + ["--config", str(state / "worker.toml"), "--state", str(state / "w")]
            + ["doctor", "--worker"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=state,
            env={**os.environ, "HOME": str(state)},
        )
    finally:
        shutil.rmtree(state)
    if "Permission denied" in res.stderr:  # a module's folder, past the interpreter
        pytest.skip(f"nobody cannot run reviewq here: {res.stderr.strip()[-200:]}")
    return [x for x in res.stdout.splitlines() if "cannot tell" in x]


def test_a_worker_under_rlimit_nproc_says_it_cannot_tell_a_refused_fork():
    """A worker run as a user with RLIMIT_NPROC (not root, whom it does not bind; as
    nobody here, with a state folder nobody may write): an agent whose tool was refused a
    process at it (EAGAIN) exited 1 without output, a failed attempt of its job (shown with
    a real agent as nobody), and the kernel keeps no count that tells it apart. Nothing said so:
    `doctor --worker` and the worker's start do, once."""
    unseen = _doctor_as_nobody(4000)
    assert len(unseen) == 1 and "RLIMIT_NPROC (4000" in unseen[0], unseen


def test_a_worker_under_the_kernels_own_rlimit_nproc_says_nothing_of_it():
    """Every user has an RLIMIT_NPROC: the kernel's own default, half of
    kernel.threads-max, which that bounds machine-wide anyway. A worker run as its own
    user (a systemd unit's User=) said at every start, and `doctor --worker` warned, that
    it could not tell a fork refused at it, a limit no person set and nothing to do."""
    default = int(Path("/proc/sys/kernel/threads-max").read_text()) // 2
    assert _doctor_as_nobody(default) == []
    assert _doctor_as_nobody(default - 1) != []  # one a person lowered is still said


def _pids_cgroup(name: str) -> Path:
    """A pids cgroup made for this test (v2, or v1's pids controller), or a skip."""
    if (_CGROUP_V2 / "cgroup.controllers").exists():
        if "pids" not in (_CGROUP_V2 / "cgroup.subtree_control").read_text().split():
            pytest.skip("cgroup v2 without the pids controller enabled for children")
        group = _CGROUP_V2 / name
    elif (Path("/sys/fs/cgroup/pids") / "cgroup.procs").exists():
        group = Path("/sys/fs/cgroup/pids") / name
    else:
        pytest.skip("no pids cgroup controller mounted at /sys/fs/cgroup")
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a pids cgroup here: {exc}")
    return group


def _removed(group: Path) -> None:
    # What still runs in it (an agent whose worker timed out) killed first: the group was
    # otherwise left, its rmdir refused for 5 s and given up without a word.
    remove_cgroup(group)


def _run_then_remove(group: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """``argv`` run from the project's folder, then ``group`` (a cgroup of the test's own,
    empty once the process has ended) removed, whatever became of it."""
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent.parent
        )
    finally:
        _removed(group)


def _in_cgroup(group: Path, script: str, tmp_path: Path) -> dict:
    """``script`` run by this Python, given ``group`` (a cgroup of the test's own, removed
    after: the process has ended, so it is empty) and ``tmp_path``: what its last line
    says, as JSON."""
    res = _run_then_remove(group, [sys.executable, "-c", script, str(group), str(tmp_path)])
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


_FULL_OF_PIDS = """
import json, os, sys, time
from pathlib import Path
group = Path(sys.argv[1])
(group / "cgroup.procs").write_text(str(os.getpid()))
from orchestrator.config import ReviewerProfile
from workers.attempt import run_attempt
from workers.reviewers import AttemptSpec, for_profile
tmp = Path(sys.argv[2])
profile = ReviewerProfile(name="c", kind="command", command=("true",))
spec = AttemptSpec("review", 1, 1, tmp / "p", tmp / "o", tmp, tmp / "a", tmp, "m")
# Not one process (nor thread) more than this one has: the agent's fork fails, EAGAIN.
(group / "pids.max").write_text((group / "pids.current").read_text())
start = time.monotonic()
out = run_attempt(for_profile(profile), spec, timeout_s=30, max_turns=10)
print(json.dumps({"classification": out.classification, "reasons": out.reasons,
                  "took_s": time.monotonic() - start}))
"""


def test_an_agent_launch_refused_by_a_pids_limit_is_retried_then_said_as_not_started(tmp_path):
    """A real pids cgroup at its pids.max: the agent's fork fails with EAGAIN. It is tried
    again (a moment's shortage passes) and then said as a launch failure, which the
    control never counts against the job (the profile backs off, then pauses)."""
    out = _in_cgroup(_pids_cgroup(f"reviewq-test-{os.getpid()}"), _FULL_OF_PIDS, tmp_path)
    assert out["classification"] == "launch-failure", out
    assert out["reasons"] == ["could not start 'true': Resource temporarily unavailable"], out
    assert out["took_s"] >= 1.0, out  # four tries more, 0.1 s doubling, before it gives up


_AGENT_SHORT_OF_PIDS = """
import json, os, sys, time
from pathlib import Path
group = Path(sys.argv[1])
(group / "cgroup.procs").write_text(str(os.getpid()))
from orchestrator.config import ReviewerProfile
from workers.attempt import run_attempt
from workers.reviewers import AttemptSpec, for_profile
tmp = Path(sys.argv[2])
# Two turns in (not a launch that failed), it starts a tool: a process more than it may.
script = (
    "import json, os, subprocess;"
    "json.dump(dict(num_turns=2), open(os.environ['REVIEWQ_TELEMETRY_PATH'], 'w'));"
    "subprocess.run(['true'])"
)
profile = ReviewerProfile(name="c", kind="command", command=(sys.executable, "-c", script))
spec = AttemptSpec("review", 1, 1, tmp / "p", tmp / "o", tmp, tmp / "a", tmp, "m")
# Room for the agent itself, not for a process it starts.
(group / "pids.max").write_text(str(int((group / "pids.current").read_text()) + 1))
out = run_attempt(for_profile(profile), spec, timeout_s=30, max_turns=10)
print(json.dumps({"classification": out.classification, "reasons": out.reasons}))
"""


def test_an_agent_refused_a_process_by_the_pids_limit_is_the_machines_failure(tmp_path):
    """An agent that ran and then could not start a tool (its fork refused at the real
    pids.max of the worker's cgroup, EAGAIN) exited 1 without output: a failed attempt of
    its job, three of which failed the job and escalated its pairs for want of a process
    on the machine. The cgroup's count of refused forks says so: the machine's failure."""
    out = _in_cgroup(_pids_cgroup(f"reviewq-test-{os.getpid()}"), _AGENT_SHORT_OF_PIDS, tmp_path)
    assert out["classification"] == "reviewer-failure", out
    assert out["reasons"][0].startswith("pids: the worker's pids cgroup refused"), out
    assert "Resource temporarily unavailable" in out["reasons"][0], out
    said = attempt_words(out["classification"], out["reasons"][0])
    assert said.startswith("the worker's limit of processes was reached: "), said


_ANOTHER_REFUSED = """
import json, os, subprocess, sys, threading
from pathlib import Path
group = Path(sys.argv[1])
(group / "cgroup.procs").write_text(str(os.getpid()))
from orchestrator.config import ReviewerProfile
from workers.attempt import run_attempt
from workers.reviewers import AttemptSpec, for_profile
tmp = Path(sys.argv[2])
go = tmp / "go"
os.mkfifo(go)
# Two turns in, it waits for the word, then fails for a reason of its own: no output.
script = (
    "import json, os, sys;"
    "json.dump(dict(num_turns=2), open(os.environ['REVIEWQ_TELEMETRY_PATH'], 'w'));"
    f"open({str(go)!r}).read();"
    "sys.exit('error: the answer was not the bundle asked for')"
)
refused = []
def another_agent():
    # Opened once the agent has opened it: the agent runs. Another agent's process (a
    # tool, a launch) refused at pids.max meanwhile, in the cgroup they share.
    with open(go, "w") as word:
        (group / "pids.max").write_text((group / "pids.current").read_text())
        try:
            subprocess.run(["true"])
        except OSError as exc:
            refused.append(exc.errno)
        (group / "pids.max").write_text("max")
        word.write("go")
helper = threading.Thread(target=another_agent)
helper.start()
profile = ReviewerProfile(name="c", kind="command", command=(sys.executable, "-c", script))
spec = AttemptSpec("review", 1, 1, tmp / "p", tmp / "o", tmp, tmp / "a", tmp, "m")
out = run_attempt(for_profile(profile), spec, timeout_s=30, max_turns=10)
helper.join()
print(json.dumps({"classification": out.classification, "reasons": out.reasons,
                  "refused": refused}))
"""


def test_an_agents_own_failure_while_another_is_refused_a_process_is_the_jobs(tmp_path):
    """L44 took any agent that failed while the cgroup's count of refused forks rose for
    one the pids limit ended. The count is the cgroup's, which the worker's other agents
    and its own launches share: an agent that failed for a reason of its own (its answer
    not the bundle asked for) while another's fork was refused was the machine's failure,
    never counted against its job, and the profile paused over it. The agent must say it
    was refused a process (EAGAIN), as a full disk must be said."""
    out = _in_cgroup(_pids_cgroup(f"reviewq-test-{os.getpid()}"), _ANOTHER_REFUSED, tmp_path)
    assert out["refused"] == [11], out  # EAGAIN: another process was refused meanwhile
    assert out["classification"] == "no-output", out
    assert not out["reasons"][0].startswith("pids: "), out


def test_a_worker_out_of_open_files_at_concurrency_12_loses_no_job_and_names_the_limit(kb):
    """A sweep under `prlimit --nofile=32`, its profile at concurrency 12: the worker ran
    out of descriptors writing its attempts' folders and starting agents. Each attempt
    went back as a launch failure (no job lost, failed or judged, the profile paused), but
    its reason said "Too many open files" of a file in the attempt's folder, naming
    neither the limit nor how to raise it."""
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is not installed")
    small_kb(kb, notes=12)
    profile = fake_profile().replace("concurrency = 2", "concurrency = 12")
    kb.write("reviewq.toml", profile + FAST_QUEUE)
    exe = Path(sys.executable).parent / "reviewq"
    proc = subprocess.Popen(
        ["prlimit", "--nofile=32:32", "--", str(exe), "--root", str(kb.root), "sweep"]
        + ["--reviewer", "fake"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # Its control may run short too, and then waits out its queue (L41): what is
        # judged is what state.db and the log hold when the sweep ends or is stopped.
        # Stopped as an operator stops it, its worker and agents with it: killed with
        # its process group, its worker's kept agents' TMPDIRs stayed behind.
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what a stop left, if it did
        proc.wait()
    with sqlite3.connect(kb.state / "state.db") as conn:
        statuses = {r[0] for r in conn.execute("SELECT status FROM review_jobs")}
        (jobs,) = conn.execute("SELECT count(*) FROM review_jobs").fetchone()
    assert jobs == 24 and statuses <= {"queued", "running", "completed"}, statuses
    control = _lines(kb.state / "logs" / "reviewq.jsonl")
    short = [
        r
        for e in control
        if e["event"] == "attempt.launch_failed"
        for r in e["reasons"]
        if "Too many open files" in r
    ]
    if not short:
        pytest.skip("the worker did not run out of descriptors at 32 here")
    assert all("RLIMIT_NOFILE" in r for r in short), short


_WATCHED = """
import sys
from pathlib import Path
from workers.kbwatch import KBWatch
root = Path(sys.argv[1])
for i in range(30):
    (root / "kb" / "notes" / f"d{i}").mkdir(parents=True, exist_ok=True)
watch = KBWatch()
token = watch.begin(root, ["kb"])
(root / "kb" / "notes" / "d3" / "x.md").write_text("changed while the agent ran")
print(sorted(watch.end(token)))
watch.close()
"""


@pytest.mark.parametrize(
    ("knob", "value", "said"),
    [
        ("max_inotify_instances", 0, "inotify_init failed: Too many open files"),
        ("max_inotify_watches", 5, "fs.inotify.max_user_watches reached"),
    ],
)
def test_the_kb_watch_short_of_inotify_falls_back_on_scans_and_says_so(tmp_path, knob, value, said):
    """The real inotify limits, set in a user namespace of the test's own (where they are
    that namespace's, not the machine's: nothing else running is touched): no instance,
    or five watches for 31 folders. The watch says why and scans instead; the change an
    agent made is still found."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    code = f'echo {value} > /proc/sys/user/{knob} && exec {sys.executable} -c "$0" "$1"'
    res = subprocess.run(
        ["unshare", "--user", "--map-root-user", "sh", "-c", code, _WATCHED, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).parent.parent,
    )
    if res.returncode != 0 and "unshare" in res.stderr:
        pytest.skip(f"no user namespace to set the limit in: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.replace("'", '"')) == ["kb/notes/d3/x.md"]
    assert "kbwatch.unavailable" in res.stderr and said in res.stderr, res.stderr


_READS = """
import os
from workers.attempt import oom_kills
if oom_kills() is None:
    raise SystemExit("no counter")
os.write(2, b"MARK-START\\n")
for _ in range(100):
    oom_kills()
os.write(2, b"MARK-END\\n")
"""


def test_a_counter_read_before_each_attempt_costs_three_system_calls(tmp_path):
    """The memory cgroup's count of OOM kills is read before every attempt (L43): through
    Path.read_text it cost nine system calls (openat, two fstat, ioctl, two lseek, two
    read, close), counted by strace; open, read and close are all it needs."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    trace = tmp_path / "trace"
    res = subprocess.run(
        ["strace", "-f", "-o", str(trace), sys.executable, "-c", _READS],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parent.parent,
    )
    if "no counter" in res.stderr:
        pytest.skip("this process's memory cgroup keeps no count of OOM kills here")
    if res.returncode != 0:
        pytest.skip(f"strace cannot trace here: {res.stderr.strip()[-200:]}")
    lines = trace.read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if "MARK-START" in x)
    end = next(i for i, x in enumerate(lines) if "MARK-END" in x)
    calls = [x.split(None, 1)[1].split("(")[0] for x in lines[start + 1 : end]]
    assert len(calls) <= 3 * 100, sorted(set(calls))
