"""Issue 13: every applied fix can be a git commit of that one note, and nothing else of
the person's work goes into it. Real sweeps, real git repositories."""

from __future__ import annotations

import contextlib
import json
import subprocess

import pytest

from orchestrator.cycles.fixes import write_due_fixes
from orchestrator.state.workspace import Workspace

from .conftest import reviewq_process
from .test_cycles_integration import FAKE, db, profile
from .test_queue_integration import FAST_QUEUE

pytestmark = pytest.mark.integration
NOTE = "kb/notes/alpha.md"
OTHER = "kb/notes/beta.md"
FIXED = "FIXED: the body says more now."


def git(root, *args: str) -> str:
    out = subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=True
    )
    return out.stdout


@pytest.fixture
def repo(kb):
    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", body="Alpha body.\n")
    kb.note("beta", body="Beta body.\n")
    kb.write("scratch.txt", "a person's file\n")
    kb.write(
        "reviewq.toml",
        profile("fake", FAKE_PASS_IF_CONTAINS="FIXED", FAKE_FIX_APPEND=FIXED)
        + FAST_QUEUE
        + "[fix]\ngit_commit = true\n",
    )
    kb.write(".gitignore", ".reviewq/\n")
    git(kb.root, "init", "-q", "-b", "main")
    git(kb.root, "config", "user.name", "A Person")
    git(kb.root, "config", "user.email", "person@example.org")
    git(kb.root, "add", "-A")
    git(kb.root, "commit", "-q", "-m", "the KB")
    return kb


def sweep(kb) -> dict:
    # Only alpha: beta carries the person's staged edit, which must not be reviewed or fixed.
    res = reviewq_process(
        "--root", str(kb.root), "sweep", "--reviewer", "fake", "--fix", "--json", "--note", NOTE,
        timeout=180,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def fix_job(kb):
    with db(kb) as conn:
        return conn.execute("SELECT * FROM review_jobs WHERE kind = 'fix'").fetchone()


def report(kb) -> dict:
    res = reviewq_process("--root", str(kb.root), "report", "--json", "--since", "1h")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def log_events(kb, event: str) -> list[dict]:
    lines = (kb.state / "logs" / "reviewq.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == event]


def test_a_fix_is_one_commit_of_one_note_with_trailers(repo):
    # A person's work in progress: a staged edit to another note, an unstaged one elsewhere.
    repo.write(OTHER, repo.read(OTHER) + "A staged line.\n")
    git(repo.root, "add", OTHER)
    repo.write("scratch.txt", "a person's file\nan unstaged line\n")
    head_before = git(repo.root, "rev-parse", "HEAD").strip()

    sweep(repo)

    job = fix_job(repo)
    assert job["result"] == "applied" and job["fix_no_commit"] is None
    sha = job["fix_commit"]
    assert git(repo.root, "rev-parse", "HEAD").strip() == sha
    assert git(repo.root, "rev-parse", "HEAD~1").strip() == head_before
    assert git(repo.root, "show", "--name-only", "--format=", sha).split() == [NOTE]
    body = git(repo.root, "log", "-1", "--format=%B", sha)
    assert body.startswith(f"reviewq fix: {NOTE} (prose/body-check)\n")
    trailers = git(repo.root, "log", "-1", "--format=%(trailers:only,unfold)", sha).split("\n")
    assert f"Reviewq-Job: {job['id']}" in trailers
    assert "Reviewq-Gate: prose/body-check" in trailers
    assert "Reviewq-Reviewer: fake" in trailers
    assert FIXED in git(repo.root, "show", f"{sha}:{NOTE}")
    # The person's changes are where they left them: staged, and unstaged.
    assert git(repo.root, "diff", "--cached", "--name-only").split() == [OTHER]
    assert git(repo.root, "diff", "--name-only").split() == ["scratch.txt"]
    assert "A staged line." in git(repo.root, "show", f":{OTHER}")
    assert [e["commit"] for e in log_events(repo, "fix.applied")] == [sha]
    shown_job = reviewq_process("--root", str(repo.root), "job", str(job["id"])).stdout
    assert f"  fix: applied; commit {sha}\n" in shown_job
    [shown] = report(repo)["kb_changes"]["fixes"]
    assert (shown["id"], shown["fix_commit"], shown["note_path"]) == (job["id"], sha, NOTE)
    # Undoing the fix is a plain revert (once the person's work in progress is put aside).
    git(repo.root, "stash", "-q")
    git(repo.root, "revert", "--no-edit", sha)
    assert FIXED not in repo.read(NOTE)

    # reviewq export shows the commit of the fix behind the accepted text.
    res = reviewq_process("--root", str(repo.root), "export", "--model", "fake")
    assert res.returncode == 0, res.stderr
    exported = repo.root / "kb/reports/reviews/gates/kb__notes__alpha.md/prose/body-check.md"
    assert f"fix-commit: {sha}\n" in exported.read_text()


def test_the_rereview_of_a_committed_fix_names_the_fix_commit(repo):
    """E87: the re-review's job is made, and HEAD read, in the transaction that decides
    the fix, before the fixed note is written and committed: kept as read, its
    `recorded-commit` was the commit before the fix, whose text it never judged. The
    fix's commit is its, once made; an uncommitted fix's re-review keeps HEAD (the text
    is the work tree's, as a person's uncommitted edit)."""
    head_before = git(repo.root, "rev-parse", "HEAD").strip()
    sweep(repo)
    job = fix_job(repo)
    sha = job["fix_commit"]
    assert sha and sha != head_before
    with db(repo) as conn:
        kept = conn.execute(
            "SELECT p.note_commit, a.note_commit FROM review_pairs p JOIN review_jobs j "
            "ON j.id = p.job_id JOIN acceptance a ON a.review_pair_id = p.id "
            "WHERE j.source_job_id = ? AND j.kind = 'review'",
            (job["id"],),
        ).fetchall()
    assert [tuple(r) for r in kept] == [(sha, sha)]
    res = reviewq_process("--root", str(repo.root), "export", "--model", "fake")
    assert res.returncode == 0, res.stderr
    exported = repo.root / "kb/reports/reviews/gates/kb__notes__alpha.md/prose/body-check.md"
    assert f"recorded-commit: {sha}\n" in exported.read_text()


def test_a_note_with_uncommitted_edits_gets_no_commit_and_keeps_them(repo):
    repo.write(NOTE, repo.read(NOTE) + "A person's unfinished sentence\n")
    head_before = git(repo.root, "rev-parse", "HEAD").strip()

    sweep(repo)

    job = fix_job(repo)
    assert job["result"] == "applied" and job["fix_commit"] is None
    assert "uncommitted edits" in job["fix_no_commit"]
    assert git(repo.root, "rev-parse", "HEAD").strip() == head_before
    text = repo.read(NOTE)
    assert "A person's unfinished sentence" in text and FIXED in text
    shown_job = reviewq_process("--root", str(repo.root), "job", str(job["id"])).stdout
    assert "  fix: applied; no commit: the note had uncommitted edits" in shown_job
    [warned] = log_events(repo, "fix.uncommitted")
    assert warned["job_id"] == job["id"] and "uncommitted edits" in warned["reason"]
    [shown] = report(repo)["kb_changes"]["fixes"]
    assert shown["fix_commit"] is None and shown["fix_no_commit"] == job["fix_no_commit"]


def test_a_kb_that_is_no_repository_is_fixed_as_before(kb):
    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", body="Alpha body.\n")
    kb.write(
        "reviewq.toml",
        profile("fake", FAKE_PASS_IF_CONTAINS="FIXED", FAKE_FIX_APPEND=FIXED)
        + FAST_QUEUE
        + "[fix]\ngit_commit = true\n",
    )
    out = sweep(kb)
    assert out["escalations"] == []
    job = fix_job(kb)
    assert job["result"] == "applied" and job["fix_commit"] is None
    assert job["fix_no_commit"] == "the KB is not in a git repository"
    assert FIXED in kb.read(NOTE)


def test_unknown_fix_keys_are_refused(kb):
    kb.write("reviewq.toml", "[fix]\ngit_comit = true\n")
    res = reviewq_process("--root", str(kb.root), "status")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        f"error: {kb.root / 'reviewq.toml'} [fix] git_comit: unknown key (known: git_commit)"
    ]


def _tick(kb) -> None:
    """What the control process's tick does for fixes whose file or commit is still due."""
    ws = Workspace.open(kb.root)
    try:
        write_due_fixes(ws.kb, ws.store, git_commit=True)
    finally:
        ws.close()


def test_a_commit_an_index_lock_refused_is_made_at_a_tick_once_the_lock_is_gone(repo):
    """A person's git that crashed leaves .git/index.lock behind. The first refusal was
    final: the fix stayed uncommitted for good, and every later fix of the note was
    refused for the 'uncommitted edits' it left."""
    lock = repo.root / ".git" / "index.lock"
    lock.write_text("")
    head_before = git(repo.root, "rev-parse", "HEAD").strip()

    sweep(repo)

    job = fix_job(repo)
    assert job["result"] == "applied" and FIXED in repo.read(NOTE)
    assert (job["fix_commit"], job["fix_no_commit"]) == (None, None)  # not given up
    [deferred] = log_events(repo, "fix.commit_deferred")  # once, though each tick tried
    assert deferred["job_id"] == job["id"] and "index.lock" in deferred["reason"]
    assert deferred["note_path"] == NOTE  # the one line the operator gets names the note
    [shown] = report(repo)["kb_changes"]["fixes"]
    assert "index.lock" in shown["commit_pending"] and shown["fix_no_commit"] is None
    _tick(repo)  # still held
    assert (
        fix_job(repo)["fix_commit"] is None
        and git(repo.root, "rev-parse", "HEAD").strip() == head_before
    )

    lock.unlink()  # the person removes it
    _tick(repo)

    sha = fix_job(repo)["fix_commit"]
    assert sha == git(repo.root, "rev-parse", "HEAD").strip()
    assert git(repo.root, "rev-parse", "HEAD~1").strip() == head_before
    assert git(repo.root, "show", "--name-only", "--format=", sha).split() == [NOTE]
    [shown] = report(repo)["kb_changes"]["fixes"]
    assert (shown["fix_commit"], shown["commit_pending"]) == (sha, None)
    with db(repo) as conn:
        assert conn.execute("SELECT count(*) FROM fix_writes_due").fetchone()[0] == 0


def test_a_commit_refused_for_a_day_is_given_up_with_the_reason(repo):
    (repo.root / ".git" / "index.lock").write_text("")
    sweep(repo)
    with db(repo) as conn:
        conn.execute("UPDATE fix_writes_due SET since = '2000-01-01T00:00:00.000000Z'")
    _tick(repo)
    job = fix_job(repo)
    assert job["fix_commit"] is None
    assert "index.lock" in job["fix_no_commit"] and job["fix_no_commit"].endswith(
        "(tried for a day)"
    )
    with db(repo) as conn:
        assert conn.execute("SELECT count(*) FROM fix_writes_due").fetchone()[0] == 0


def test_an_agent_that_puts_an_earlier_fixs_text_back_is_not_excused(repo):
    """Any fix ever written excused a change to its text: a reviewer that ran `git checkout`
    over a person's later edit of a fixed note was judged on its output, and the person's
    edit was gone without a word. Only a fix written while the attempt ran excuses it."""
    from orchestrator.cycles.fixes import changes_not_the_agents
    from orchestrator.state.store import Store, utcnow

    from .test_kbwatch import _attempt

    sweep(repo)
    assert fix_job(repo)["result"] == "applied"
    fixed = (repo.root / NOTE).read_text()
    (repo.root / NOTE).write_text(fixed + "A person's new paragraph.\n")
    with contextlib.closing(Store(repo.state / "state.db")) as store:
        review = store.conn.execute("SELECT id FROM review_jobs WHERE kind = 'review'").fetchone()[
            0
        ]
        with store.write():  # the attempt that now runs, opened after the fix
            store.conn.execute(
                "INSERT INTO attempts (job_id, attempt, outcome, started_at) "
                "VALUES (?, 99, 'running', ?)",
                (review, utcnow()),
            )
        out = _attempt(repo.root, f"git checkout -- {NOTE}", guarded=(NOTE,), trees=("kb",))
        assert out.classification == "reviewer-touched-kb" and out.touched == [NOTE]
        assert not changes_not_the_agents(
            store, repo.root, review, 99, out.touched, out.touched_hashes
        )


def test_a_fix_commit_says_what_the_review_found(repo):
    """`git log` next year: the message named the note and the gate ("to meet
    prose/body-check") but not what the reviewer found wrong, the reason the text changed."""
    sweep(repo)
    sha = fix_job(repo)["fix_commit"]
    body = git(repo.root, "log", "-1", "--format=%B", sha)
    assert "The review found:\n- prose/body-check: low: finding 0 for prose/body-check\n" in body
    assert body.index("The review found:") < body.index("Undo with `git revert`")


def test_a_fix_commit_says_how_many_findings_it_leaves_out(repo):
    """A review with more than ten findings for a gate: the message quoted ten and said
    nothing of the rest (the first ten were all it counted), so `git log` read as if the
    reviewer had found no more, while the fixer was given every one."""
    many = "\n".join(f"- low: extra finding {n}" for n in range(24))
    repo.write(
        "reviewq.toml",
        profile(
            "fake", FAKE_PASS_IF_CONTAINS="FIXED", FAKE_FIX_APPEND=FIXED, FAKE_QUOTE="MANY"
        ).replace("env = {", f"env = {{ MANY = {json.dumps('list:' + chr(10) + many)},", 1)
        + FAST_QUEUE
        + "[fix]\ngit_commit = true\n",
    )
    git(repo.root, "commit", "-qam", "config")
    sweep(repo)
    body = git(repo.root, "log", "-1", "--format=%B", fix_job(repo)["fix_commit"])
    quoted = [ln for ln in body.splitlines() if ln.startswith("- prose/body-check: ")]
    assert len(quoted) == 20 and quoted[-1].endswith("extra finding 17"), quoted
    assert "\n- … and 6 more\n" in body  # 26 in all: the fake's own two, and 24


def test_a_fix_that_adds_a_nul_or_a_terminal_escape_to_the_note_is_not_written(repo):
    """A fixer's text was applied whatever bytes it held: a NUL made git take the note for
    a binary file (`git show` of the fix said only "Binary files differ", so nobody could
    read the change), and an escape sequence acted on the terminal of whoever printed
    the note or the diff. A fixed note that adds a control character is invalid output."""
    fixer = repo.root / "fixer.py"
    fixer.write_text(
        "import os, sys\n"
        "if os.environ['REVIEWQ_TASK'] != 'fix':\n"
        f"    os.execv(sys.executable, [sys.executable, {str(FAKE)!r}])\n"
        "text = open(os.environ['REVIEWQ_NOTE_FILE'], encoding='utf-8').read()\n"
        "with open(os.environ['REVIEWQ_OUTPUT_PATH'], 'w', encoding='utf-8') as out:\n"
        "    out.write(text + 'FIXED: more\\x00 \\x1b]0;pwned\\x07\\n')\n"
    )
    repo.write(
        "reviewq.toml",
        profile("fake", fixer, FAKE_PASS_IF_CONTAINS="FIXED")
        + FAST_QUEUE.replace("[queue]\n", "[queue]\nmax_attempts = 1\n")
        + "[fix]\ngit_commit = true\n",
    )
    before = repo.read(NOTE)
    res = reviewq_process(
        "--root", str(repo.root), "sweep", "--reviewer", "fake", "--fix", "--note", NOTE,
        timeout=180,
    )  # fmt: skip
    assert repo.read(NOTE) == before
    assert git(repo.root, "rev-list", "--count", "HEAD").strip() == "1"  # no fix commit
    job = fix_job(repo)
    assert job["status"] == "failed", res.stdout
    with db(repo) as conn:
        (reason,) = conn.execute(
            "SELECT reasons FROM attempts WHERE job_id = ?", (job["id"],)
        ).fetchone()
    assert json.loads(reason) == [
        "the fixed note holds control character(s) the note it was given did not hold "
        "('\\x00', '\\x1b', '\\x07'): no markdown needs them"
    ]
