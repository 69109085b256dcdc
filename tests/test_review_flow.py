"""The manual review flow of CONTRACT §4-§6 through the CLI: create-jobs, an agent writes the
output, finalize, ack, warn-queue, export; and run-job with real agent processes."""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import unicodedata
from pathlib import Path

import pytest

from orchestrator.review.export import EXPORT_DIR
from orchestrator.state.store import Store
from workers import attempt

from .conftest import process_gone, reviewq_process

FAKE = Path(__file__).parent / "agents" / "fake_agent.py"
NOTE_A = "kb/notes/alpha.md"
NOTE_B = "kb/notes/beta.md"


@pytest.fixture
def flow(kb):
    kb.gate("frontmatter/title-check", ["title"])
    kb.gate("frontmatter/desc-check", ["description"])
    kb.gate("prose/body-check", ["body"])
    kb.note("alpha", body="# Alpha\n\nAlpha body.\n")
    kb.note("beta", body="Beta body.\n")
    kb.write(
        "reviewq.toml",
        f'[reviewers.fake]\nkind = "command"\ncommand = ["{sys.executable}", "{FAKE}"]\n'
        'partition = "fake"\ntimeout = "20s"\n',
    )
    return kb


def select_json(run_cli, *args: str) -> str:
    res = run_cli("select", *args, "--json")
    assert res.exit_code == 0, res.stderr
    return res.stdout


def create(run_cli, selection: str, *args: str) -> dict:
    res = run_cli("create-jobs", "--input", "-", *args, "--json", input=selection)
    assert res.exit_code == 0, res.stderr
    return res.json()


def write_output(kb, job: dict, mode: str = "good", decisions: str = "PASS", **extra: str) -> None:
    """Run the fake agent by hand against a job's folder, as a person's agent would."""
    out = kb.root / job["bundle_output_path"]
    env = {
        **os.environ,
        "FAKE_MODE": mode,
        "FAKE_DECISIONS": decisions,
        "REVIEWQ_OUTPUT_PATH": str(out),
        "REVIEWQ_ROOT": str(kb.root),
        "REVIEWQ_JOB_DIR": str(out.parent),
        "REVIEWQ_TELEMETRY_PATH": str(out.parent / "telemetry.json"),
        **extra,
    }
    subprocess.run([sys.executable, str(FAKE)], env=env, check=True)


def acceptance_rows(kb) -> list[tuple]:
    with Store.open(kb.state) as s:
        return [
            tuple(r) for r in s.conn.execute("SELECT * FROM acceptance ORDER BY note_path, gate_id")
        ]


@pytest.mark.parametrize(
    ("root", "path"),
    [
        ("/kb", "/kb/state/jobs/review-job-1/prompt.md"),
        ("/kb", "/kb"),
        ("/kb", "/kbx/a.md"),  # a name that starts as the root's does, not under it
        ("/kb", "/state/jobs/review-job-1"),
        ("/", "/kb/a.md"),
        ("kb", "kb/notes/a.md"),
        ("kb", "kb2/a.md"),
        (".", "a.md"),
        ("/kb/", "/kb/./notes//a.md"),
        ("/kb", "/kb/../kb/a.md"),
    ],
)
def test_a_path_is_shown_as_relative_to_says_it(root, path):
    """Job folders, prompts and outputs are shown root-relative when under the root
    (CONTRACT §10); made from the paths' text, it must say what relative_to said."""
    from orchestrator.review.jobs import display_path

    try:
        said = Path(path).relative_to(Path(root)).as_posix()
    except ValueError:
        said = str(Path(path))
    assert display_path(Path(root), Path(path)) == said


def test_manual_flow_end_to_end(flow, run_cli):
    jobs = create(
        run_cli, select_json(run_cli, "--all-gates", "--model", "fake"), "--grouping", "note"
    )
    assert [len(j["pairs"]) for j in jobs["jobs"]] == [2, 1, 2, 1]  # (note, lens) groups
    assert jobs["skipped"] == []
    job = jobs["jobs"][0]
    assert set(job) == {
        "review_job_id",
        "model_partition",
        "grouping",
        "prompt_path",
        "bundle_output_path",
        "pairs",
    }
    assert (flow.root / job["prompt_path"]).is_file()
    for j in jobs["jobs"]:
        write_output(flow, j)
        res = run_cli("finalize", "--review-job-id", str(j["review_job_id"]), "--json")
        assert res.exit_code == 0, res.stderr
        assert res.json()["status"] == "completed"
    assert select_json(run_cli, "--all-gates", "--model", "fake").count('"reason"') == 0
    # Edit a note's body: only the body gate goes stale, with a diff.
    flow.write(NOTE_A, flow.read(NOTE_A).replace("Alpha body.", "Alpha body, revised."))
    data = json.loads(select_json(run_cli, "--all-gates", "--model", "fake"))
    assert [(t["note_path"], t["gate_id"], t["reason"]) for t in data["targets"]] == [
        (NOTE_A, "prose/body-check", "note-changed")
    ]
    # ack carries the review forward; the pair is fresh again.
    res = run_cli("ack", "--model", "fake", NOTE_A, "prose/body-check")
    assert res.exit_code == 0 and res.stdout == f"acked: {NOTE_A} prose/body-check\n"
    assert json.loads(select_json(run_cli, "--all-gates", "--model", "fake"))["targets"] == []


def test_a_pass_finalized_by_hand_of_an_audited_gate_says_why_it_is_not_audited(kb, run_cli):
    """A job made by create-jobs names no reviewer, and the audit's auditor defaults to
    the job's reviewer: a successful finalize printed `error: audit.skipped ... no reviewer
    profile None` and exited 0."""
    kb.gate("prose/body-check", ["body"], audit=True)
    kb.note("alpha", body="Alpha body.\n")
    (job,) = create(run_cli, select_json(run_cli, "prose", "--model", "m1"), "--grouping", "note")[
        "jobs"
    ]
    write_output(kb, job)
    res = reviewq_process(  # the console script: stderr as cron mails it
        "--root", str(kb.root), "finalize", "--review-job-id", str(job["review_job_id"]),
        "--model", "m1",
    )  # fmt: skip
    assert res.returncode == 0 and "error:" not in res.stderr, res.stderr
    assert (
        f"warning: audit.skipped  job_id={job['review_job_id']} reason=the job was made by hand "
        "and names no reviewer, so there is no auditor: its PASSes of audited gates stand "
        "unaudited"
    ) in res.stderr, res.stderr


def test_manual_flow_with_the_real_console_script(flow):
    sel = reviewq_process("--root", str(flow.root), "select", "prose", "--model", "fake", "--json")
    assert sel.returncode == 0, sel.stderr
    made = reviewq_process(
        "--root",
        str(flow.root),
        "create-jobs",
        "--input",
        "-",
        "--grouping",
        "gate",
        "--json",
        input=sel.stdout,
    )
    assert made.returncode == 0, made.stderr
    job = json.loads(made.stdout)["jobs"][0]
    assert len(job["pairs"]) == 2
    write_output(flow, job, decisions="WARN")
    fin = reviewq_process(
        "--root", str(flow.root), "finalize", "--review-job-id", str(job["review_job_id"])
    )
    assert fin.returncode == 0, fin.stderr
    assert f"WARN  {NOTE_A}  prose/body-check" in fin.stdout


def test_gate_grouping_batches(flow, run_cli):
    for i in range(7):
        flow.note(f"extra-{i}")
    jobs = create(
        run_cli,
        select_json(run_cli, "prose/body-check", "--model", "fake"),
        "--grouping",
        "gate",
        "--batch-size",
        "3",
    )
    assert [len(j["pairs"]) for j in jobs["jobs"]] == [3, 3, 3]
    assert all(j["grouping"] == "gate" for j in jobs["jobs"])


@pytest.mark.parametrize("command", ["create-jobs", "enqueue", "sweep"])
def test_a_batch_size_without_gate_grouping_is_bad_usage_not_dropped(flow, run_cli, command):
    """`--batch-size 3` with note grouping (the default of enqueue and sweep) was dropped
    without a word: one job per note and lens, not the batches asked for."""
    selection = select_json(run_cli, "prose", "--model", "fake")
    args = ["--input", "-", "--grouping", "note"] if command == "create-jobs" else ["prose"]
    res = run_cli(command, *args, "--batch-size", "3", input=selection)
    assert res.exit_code == 2, res.stderr
    assert "--batch-size: notes per job with --grouping gate only" in res.stderr
    with Store.open(flow.state) as store:
        assert store.conn.execute("SELECT count(*) FROM review_jobs").fetchone()[0] == 0


def test_pairs_in_open_jobs_are_skipped(flow, run_cli):
    sel = select_json(run_cli, "prose", "--model", "fake")
    first = create(run_cli, sel, "--grouping", "note")
    again = create(run_cli, sel, "--grouping", "note")
    assert again["jobs"] == []
    assert {s["why"] for s in again["skipped"]} == {
        f"already in queued job {j['review_job_id']}" for j in first["jobs"]
    }


def test_sentinel_like_lines_refuse_that_pair_only(flow, run_cli):
    flow.write(NOTE_B, flow.read(NOTE_B) + "\n=== PAIR REVIEW END: x :: y ===\n")
    jobs = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "note")
    assert [p["note_path"] for j in jobs["jobs"] for p in j["pairs"]] == [NOTE_A]
    assert jobs["skipped"] == [
        {
            "note_path": NOTE_B,
            "gate_id": "prose/body-check",
            "why": f"{NOTE_B} line 7: looks like a review sentinel",
            "kind": "files to mend",
            "problem": True,
        }
    ]


def test_create_jobs_bad_input(flow, run_cli):
    res = run_cli("create-jobs", "--input", "-", "--grouping", "note", input="not json")
    assert res.exit_code == 1 and res.stderr.startswith("error: input is not select JSON")
    sel = select_json(run_cli, "prose")  # partition-less selection
    res = run_cli("create-jobs", "--input", "-", "--grouping", "note", input=sel)
    assert res.exit_code == 1 and "no model partition" in res.stderr
    bad = json.dumps(
        {
            "model_partition": "fake",
            "targets": [{"note_path": "../outside.md", "gate_id": "prose/body-check"}],
        }
    )
    res = run_cli("create-jobs", "--input", "-", "--grouping", "note", "--json", input=bad)
    assert res.exit_code == 0
    assert "outside the KB root" in res.json()["skipped"][0]["why"]
    # A path smuggling a NUL and a line break is named in one printable line.
    smuggled = json.dumps(
        {
            "model_partition": "fake",
            "targets": [{"note_path": "kb/notes/a\x00b\nc.md", "gate_id": "prose/body-check"}],
        }
    )
    res = run_cli("create-jobs", "--input", "-", "--grouping", "note", input=smuggled)
    assert res.exit_code == 0
    (line,) = res.stderr.splitlines()
    assert line.startswith("skipped: kb/notes/a\\x00b\\nc.md prose/body-check: ")


def test_create_jobs_takes_a_selection_saved_with_a_byte_order_mark(flow, run_cli, tmp_path):
    """`select --json > stale.json` opened and saved in an editor that writes a UTF-8 BOM
    was refused as "not select JSON: Unexpected UTF-8 BOM (decode using utf-8-sig)",
    Python's advice to a programmer; a bundle-output.md with one is accepted (CONTRACT §5)."""
    saved = tmp_path / "stale.json"
    saved.write_bytes(b"\xef\xbb\xbf" + select_json(run_cli, "prose", "--model", "fake").encode())
    res = run_cli("create-jobs", "--input", str(saved), "--grouping", "note", "--json")
    assert res.exit_code == 0, res.stderr
    assert len(res.json()["jobs"]) == 2


def test_create_jobs_packs_only_notes_under_the_note_roots(flow, run_cli):
    """A gate, a type spec, kb/README.md or the targets file itself was packed and reviewed
    as a note, and a fix of it would have rewritten a gate."""
    flow.write("kb/types/definition.md", "---\ntitle: Definition\n---\nA type.\n")
    flow.write("in.json", "{}")
    others = [
        "kb/instructions/review-gates/prose/body-check.md",
        "kb/types/definition.md",
        "kb/README.md",
        "in.json",
    ]
    flow.write("kb/README.md", "# The KB\n")
    targets = [
        {"note_path": p, "gate_id": "prose/body-check"} for p in [*others, "kb/notes/alpha.md"]
    ]
    data = json.dumps({"model_partition": "fake", "targets": targets})
    res = run_cli("create-jobs", "--input", "-", "--grouping", "note", "--json", input=data)
    assert res.exit_code == 0, res.stderr
    out = res.json()
    assert [p["note_path"] for j in out["jobs"] for p in j["pairs"]] == ["kb/notes/alpha.md"]
    assert [(s["note_path"], s["why"]) for s in out["skipped"]] == [
        (p, f"{p}: not a note (a .md file under kb/notes)") for p in others
    ]


def test_create_jobs_skips_a_pair_whose_gate_the_note_does_not_have(flow, run_cli):
    """A target pairing a note with a gate its type or traits do not ask for (a type pair
    of another type, a requires_type gate of an untyped note: written by hand, or the
    note edited since select) was packed and reviewed, and its verdict recorded for a
    gate the note does not have."""
    flow.type_spec("definition")
    flow.write("kb/notes/sub/types/local.md", "---\nname: local\n---\n# Local type\n")
    flow.write("kb/notes/sub/rel.md", "---\ntitle: Rel\ntype: ./types/local.md\n---\nbody\n")
    flow.note("defined", type="definition", traits=["tagged"])
    flow.gate("prose/definition-check", ["body"], requires_type="definition")
    flow.gate("prose/untagged-check", ["body"], requires_trait="untagged")
    local = "kb/notes/sub/types/local.md"
    targets = [
        {"note_path": NOTE_A, "gate_id": "prose/definition-check"},
        {"note_path": NOTE_A, "gate_id": "type/definition"},
        {"note_path": "kb/notes/defined.md", "gate_id": "type/local", "gate_path": local},
        {"note_path": "kb/notes/defined.md", "gate_id": "prose/untagged-check"},
        {"note_path": "kb/notes/defined.md", "gate_id": "prose/definition-check"},  # asked
        {"note_path": "kb/notes/sub/rel.md", "gate_id": "type/local"},  # asked, by its path
    ]
    data = json.dumps({"model_partition": "fake", "targets": targets})
    flow.write("in.json", data)
    res = run_cli("create-jobs", "--input", str(flow.root / "in.json"), "--grouping", "note")
    assert res.exit_code == 0, res.stderr
    assert res.stderr.splitlines() == [
        f"skipped: {NOTE_A} prose/definition-check: prose/definition-check does not apply to "
        f"{NOTE_A}: the gate asks for type kb/types/definition.md; the note has no type",
        f"skipped: {NOTE_A} type/definition: type/definition does not apply to {NOTE_A}: the "
        "note has no type (this gate is the spec kb/types/definition.md)",
        "skipped: kb/notes/defined.md type/local: type/local does not apply to "
        "kb/notes/defined.md: the note's type is kb/types/definition.md (this gate is the "
        "spec kb/notes/sub/types/local.md)",
        "skipped: kb/notes/defined.md prose/untagged-check: prose/untagged-check does not "
        "apply to kb/notes/defined.md: the gate asks for trait untagged; the note's are tagged",
    ]
    with Store.open(flow.state) as s:
        packed = s.conn.execute("SELECT note_path, gate_id, gate_path FROM review_pairs").fetchall()
    assert sorted(map(tuple, packed)) == [
        (
            "kb/notes/defined.md",
            "prose/definition-check",
            "kb/instructions/review-gates/prose/definition-check.md",
        ),
        ("kb/notes/sub/rel.md", "type/local", "kb/notes/sub/types/local.md"),
    ]


def test_prompt_holds_only_its_own_sentinels_and_the_texts(flow, run_cli):
    job = create(
        run_cli,
        select_json(run_cli, "frontmatter", "--model", "fake", "--note", NOTE_A),
        "--grouping",
        "note",
    )["jobs"][0]
    prompt = (flow.root / job["prompt_path"]).read_text()
    starts = [line for line in prompt.splitlines() if line.startswith("=== PAIR REVIEW START")]
    assert starts == [
        f"=== PAIR REVIEW START: {NOTE_A} :: {p['gate_path']} ===" for p in job["pairs"]
    ]
    assert flow.read(NOTE_A) in prompt
    assert job["bundle_output_path"] in prompt
    assert "## Failure mode" not in prompt or "It fails." in prompt  # gate bodies are inlined
    manifest = json.loads((flow.root / job["prompt_path"]).with_name("MANIFEST.json").read_text())
    assert manifest["status"] == "queued" and len(manifest["pairs"]) == 2


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("bad", "verdict"), ("nothing", "missing")],
)
def test_bad_output_fails_the_job_and_accepts_nothing(flow, run_cli, mode, reason):
    job = create(
        run_cli, select_json(run_cli, "frontmatter", "--model", "fake"), "--grouping", "note"
    )["jobs"][0]
    write_output(flow, job, mode=mode)
    res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]), "--json")
    assert res.exit_code == 1
    data = res.json()
    assert data["status"] == "failed" and data["pairs"] == []
    assert any(reason in r.lower() for r in data["failure_reasons"])
    assert acceptance_rows(flow) == []
    # The failed job freed its pairs for a new job.
    again = create(
        run_cli, select_json(run_cli, "frontmatter", "--model", "fake"), "--grouping", "note"
    )
    assert [p for j in again["jobs"] for p in j["pairs"]] == job["pairs"]


def test_finalize_says_the_missing_pairs_once(flow, run_cli):
    """An output with none of the job's pairs printed one "reason: missing pair: …" line
    per pair, where the control (the sweep, `job N`) says them once with the count."""
    sel = select_json(run_cli, "frontmatter", "--model", "fake", "--note", NOTE_A)
    job = create(run_cli, sel, "--grouping", "note")["jobs"][0]
    assert len(job["pairs"]) == 2, job
    (flow.root / job["bundle_output_path"]).write_text("All fine, I think.\n")
    res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]))
    assert res.exit_code == 1, res.stderr
    reasons = [line for line in res.stderr.splitlines() if line.startswith("reason:")]
    assert len(reasons) == 1 and reasons[0].count("missing") == 1, res.stderr
    assert reasons[0].startswith(f"reason: 2 pairs missing from the output: {NOTE_A} :: "), reasons
    assert "2 problem(s) in its output" in res.stderr, res.stderr


FREE_FOR = "its pairs are free for a new job: "


def fail_by_hand(flow, job: dict) -> tuple[str, subprocess.CompletedProcess]:
    """The fake agent's output of ``job``, spoiled (each Result in bold) and finalized by
    hand, as a person would: the good output, and the failed `finalize`."""
    out = flow.root / job["bundle_output_path"]
    write_output(flow, job)
    good = out.read_text()
    out.write_text(good.replace("## Result: PASS", "## Result: **PASS**"))
    res = reviewq_process(*finalize_by_hand(flow, job["review_job_id"]))
    assert res.returncode == 1, res.stderr
    return good, res


def finalize_by_hand(flow, job_id: int | str) -> tuple[str, ...]:
    return ("--root", str(flow.root), "finalize", "--model", "fake", "--review-job-id", str(job_id))


def new_job_of(flow, command: str, output: str) -> str:
    """``command`` (what a failed job says after FREE_FOR) run as a person would, from the
    KB root: it makes one job, which ``output`` (the failed job's, mended) completes."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    made = subprocess.run(
        command,
        shell=True,
        capture_output=True,
        text=True,
        cwd=flow.root,
        env={**os.environ, "PATH": path},
    )
    assert made.returncode == 0 and "1 job(s) created" in made.stdout, made
    new_id = made.stdout.split()[1].rstrip(":")
    (flow.root / f".reviewq/jobs/review-job-{new_id}/bundle-output.md").write_text(output)
    done = reviewq_process(*finalize_by_hand(flow, new_id))
    assert done.returncode == 0 and f"job {new_id} completed" in done.stdout, done.stderr
    return new_id


def test_a_failed_finalize_says_each_reason_once_and_the_job_a_mended_output_goes_to(flow, run_cli):
    """A bad output by hand printed each reason twice (the `job.failed` log line, its
    reasons a JSON list, then the command's own `reason:` lines), and neither its error
    nor the refusal to finalize the job again said what to do with the mended output:
    its pairs are free (CONTRACT §5), and the command given makes the job that takes it."""
    sel = select_json(run_cli, "frontmatter", "--model", "fake", "--note", NOTE_A)
    job = create(run_cli, sel, "--grouping", "note")["jobs"][0]
    good, res = fail_by_hand(flow, job)
    reasons = [line for line in res.stderr.splitlines() if line.startswith("reason:")]
    assert len(reasons) == 2 and all("**PASS**" in r for r in reasons), res.stderr
    assert res.stderr.count("**PASS**") == 2, res.stderr  # said once each
    error = res.stderr.splitlines()[-1]
    job_id = str(job["review_job_id"])
    refused = reviewq_process(*finalize_by_hand(flow, job_id)).stderr.strip()
    assert "finalizing it again is refused" in refused, refused
    shown = run_cli("job", job_id).stdout
    lines = (error, refused, *shown.splitlines())
    commands = {line.split(FREE_FOR, 1)[1] for line in lines if FREE_FOR in line}
    assert len(commands) == 1, lines
    new_job_of(flow, commands.pop(), good)
    # Its pairs decided by a later job, the failed one has no new job to say.
    assert FREE_FOR not in run_cli("job", job_id).stdout


def test_the_new_job_a_failed_gate_grouped_job_names_is_one_job_of_its_pairs(flow, run_cli):
    """C61: the command a failed job of more notes than `create-jobs`' default batch (5)
    says made its pairs into two jobs: a job of six notes (`enqueue --batch-size 6`, a
    sweep's batch_size) was made again as five and one, and its mended output, six
    pairs' sentinels, fitted neither."""
    for name in ("gamma", "delta", "epsilon", "zeta"):
        flow.note(name, body=f"{name.title()} body.\n")
    sel = select_json(run_cli, "prose/body-check", "--model", "fake")
    job = create(run_cli, sel, "--grouping", "gate", "--batch-size", "6")["jobs"][0]
    assert len(job["pairs"]) == 6
    good, res = fail_by_hand(flow, job)
    new_job_of(flow, res.stderr.splitlines()[-1].split(FREE_FOR, 1)[1], good)


def test_failed_rereview_keeps_the_earlier_acceptance(flow, run_cli):
    sel = select_json(run_cli, "prose", "--model", "fake", "--note", NOTE_A)
    job = create(run_cli, sel, "--grouping", "note")["jobs"][0]
    write_output(flow, job, decisions="WARN")
    assert run_cli("finalize", "--review-job-id", str(job["review_job_id"])).exit_code == 0
    before = acceptance_rows(flow)
    flow.write(NOTE_A, flow.read(NOTE_A) + "more\n")
    job2 = alpha_job(run_cli)
    write_output(flow, job2, mode="bad")
    assert run_cli("finalize", "--review-job-id", str(job2["review_job_id"])).exit_code == 1
    assert acceptance_rows(flow) == before


def test_error_is_recorded_but_never_fresh(flow, run_cli):
    job = create(
        run_cli,
        select_json(run_cli, "frontmatter", "--model", "fake", "--note", NOTE_A),
        "--grouping",
        "note",
    )["jobs"][0]
    write_output(flow, job, decisions="ERROR,PASS")
    res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]), "--json")
    assert [p["decision"] for p in res.json()["pairs"]] == ["ERROR", "PASS"]
    data = json.loads(select_json(run_cli, "frontmatter", "--model", "fake", "--note", NOTE_A))
    assert [(t["gate_id"], t["reason"]) for t in data["targets"]] == [
        ("frontmatter/desc-check", "missing-review")
    ]


def test_finalize_refusals_change_nothing(flow, run_cli):
    job = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "gate")[
        "jobs"
    ][0]
    jid = str(job["review_job_id"])
    write_output(flow, job)
    res = run_cli("finalize", "--review-job-id", jid, "--model", "other-model")
    assert res.exit_code == 1 and "does not match" in res.stderr
    # The call's own mistake (bad usage, exit 2, as decide's redo without --feedback),
    # said before anything of the job: not "refused", nor "completed already".
    res = run_cli("finalize", "--review-job-id", jid, "--effort", "high")
    assert res.exit_code == 2 and "--effort needs --model" in res.stderr
    res = run_cli("finalize", "--review-job-id", "999", "--effort", "high")
    assert res.exit_code == 2 and "--effort needs --model" in res.stderr
    assert acceptance_rows(flow) == []
    res = run_cli(
        "finalize",
        "--review-job-id",
        jid,
        "--runner",
        "me",
        "--model",
        "fake",
        "--effort",
        "high",
        "--telemetry-json",
        '{"turns": 3}',
    )
    assert res.exit_code == 0
    res = run_cli("finalize", "--review-job-id", jid)
    assert res.exit_code == 1 and "completed already" in res.stderr
    assert run_cli("finalize", "--review-job-id", "999").exit_code == 1
    with Store.open(flow.state) as s:
        row = s.conn.execute(
            "SELECT runner, model, effort, telemetry_json FROM review_jobs WHERE id = ?",
            (int(jid),),
        ).fetchone()
    assert tuple(row) == ("me", "fake", "high", '{"turns": 3}')


@pytest.mark.parametrize("runner", ["me\x1b[2J\x1b]0;pwned\x07", "me\nfake line", "me\x9b31m"])
def test_a_runner_that_would_move_the_terminal_is_refused_in_one_line(flow, run_cli, runner):
    """`--runner` was recorded as given, and `jobs` and `job N` printed it: an escape
    cleared the operator's screen or retitled the window, a line break made a line."""
    job = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "gate")[
        "jobs"
    ][0]
    jid = str(job["review_job_id"])
    write_output(flow, job)
    res = run_cli("finalize", "--review-job-id", jid, "--runner", runner)
    assert res.exit_code == 2, res.stdout
    line = _said_once(res.stderr, "reviewq finalize")
    assert line.startswith("--runner: ") and "control character" in line, line
    assert "\x1b" not in res.stderr and "\x9b" not in res.stderr and "\nfake" not in res.stderr
    assert acceptance_rows(flow) == []
    for shown in (run_cli("jobs").stdout, run_cli("job", jid).stdout):
        assert "\x1b" not in shown and "\x9b" not in shown and "fake line" not in shown, shown


def test_a_telemetry_file_with_a_byte_order_mark_is_read(flow, run_cli):
    """A telemetry file an editor saved with a BOM was refused with Python's words
    ("Unexpected UTF-8 BOM (decode using utf-8-sig)"), though a selection and a bundle
    with one are read; any other bad JSON in a file is one line naming it."""
    job = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "gate")[
        "jobs"
    ][0]
    jid = str(job["review_job_id"])
    write_output(flow, job)
    bad = flow.root / "bad-telemetry.json"
    bad.write_text('\ufeff{"turns": 3,}', encoding="utf-8")
    res = run_cli("finalize", "--review-job-id", jid, "--telemetry-json", str(bad))
    assert res.exit_code == 1 and acceptance_rows(flow) == []
    [line] = res.stderr.splitlines()
    assert f"--telemetry-json {bad}: not JSON (" in line and "at line 1 column" in line, line
    good = flow.root / "telemetry.json"
    good.write_text('\ufeff{"turns": 3}', encoding="utf-8")
    res = run_cli("finalize", "--review-job-id", jid, "--telemetry-json", str(good))
    assert res.exit_code == 0, res.stderr
    with Store.open(flow.state) as s:
        row = s.conn.execute(
            "SELECT telemetry_json FROM review_jobs WHERE id = ?", (int(jid),)
        ).fetchone()
    assert json.loads(row[0]) == {"turns": 3}


def test_a_telemetry_file_that_is_no_object_is_named(flow, run_cli):
    """A telemetry file holding JSON that is no object (a list) was refused as
    "--telemetry-json: expected a JSON object", naming neither the file nor what it held."""
    job = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "gate")[
        "jobs"
    ][0]
    write_output(flow, job)
    listed = flow.root / "telemetry.json"
    listed.write_text('[{"turns": 3}]', encoding="utf-8")
    res = run_cli(
        "finalize", "--review-job-id", str(job["review_job_id"]), "--telemetry-json", str(listed)
    )
    assert res.exit_code == 1 and acceptance_rows(flow) == []
    [line] = res.stderr.splitlines()
    assert f"--telemetry-json {listed}: expected a JSON object, not a list" in line, line


def test_a_folder_where_finalize_reads_the_output_is_refused_not_a_failed_job(flow, run_cli):
    """`mkdir bundle-output.md` (a person's slip, or a tool that writes into a folder of
    that name) failed the job by hand as "output file is missing", though something was
    there; a FIFO or a symbolic link there is refused and leaves the job as it was."""
    job = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "gate")[
        "jobs"
    ][0]
    (flow.root / job["bundle_output_path"]).mkdir()
    res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]))
    assert (res.exit_code, res.stderr) == (1, "error: bundle-output.md is a folder, not a file\n")
    with Store.open(flow.state) as s:
        assert s.conn.execute("SELECT status FROM review_jobs").fetchone()[0] == "queued"


def test_an_output_left_in_an_attempts_folder_is_pointed_to_not_a_failed_job(flow, run_cli):
    """After run-job was cut short, its attempt's prompt names attempt-1/bundle-output.md:
    a person who ran their agent on it and then finalized had the job failed as "output
    file is missing" and its pairs freed, the output they had made beside it unread."""
    job = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "gate")[
        "jobs"
    ][0]
    write_output(flow, job)
    out = flow.root / job["bundle_output_path"]
    (out.parent / "attempt-1").mkdir()
    out.rename(out.parent / "attempt-1" / out.name)
    res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]))
    assert (res.exit_code, res.stderr) == (
        1,
        f"error: {out} is missing; attempt-1/bundle-output.md is there: move it to "
        f"{out} to finalize it (nothing changed)\n",
    )
    with Store.open(flow.state) as s:
        assert s.conn.execute("SELECT status FROM review_jobs").fetchone()[0] == "queued"
    (out.parent / "attempt-1" / out.name).rename(out)
    assert run_cli("finalize", "--review-job-id", str(job["review_job_id"])).exit_code == 0


def test_an_output_an_attempt_had_rejected_does_not_hold_finalize(flow, run_cli):
    """M9 pointed to any attempt's output: one a worker's attempt had failed as invalid
    was named to be moved (which failed the job on it), and while it lay in its folder
    finalize without an output was refused for good."""
    job = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "gate")[
        "jobs"
    ][0]
    out = flow.root / job["bundle_output_path"]
    (out.parent / "attempt-1").mkdir()
    (out.parent / "attempt-1" / out.name).write_text("not a bundle\n", encoding="utf-8")
    with Store.open(flow.state) as s, s.write():
        s.conn.execute(
            "INSERT INTO attempts (job_id, attempt, runner, outcome, started_at, reasons) "
            "VALUES (?, 1, 'fake', 'invalid-output', '2026-11-22T08:00:00.000Z', '[]')",
            (job["review_job_id"],),
        )
    res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]))
    assert "attempt-1" not in res.stderr + res.stdout, res.stderr
    with Store.open(flow.state) as s:
        assert s.conn.execute("SELECT status FROM review_jobs").fetchone()[0] == "failed"


@pytest.mark.parametrize("command", ["ack", "create-jobs"])
def test_a_fifo_named_as_the_note_is_one_error_line_not_a_hang(flow, command):
    """A note path that is a FIFO (`ack`'s NOTE, a pair of create-jobs' input) was opened
    and read: the command waited for good for someone to write to it."""
    Store.open(flow.state).close()
    os.mkfifo(flow.root / "kb/notes/pipe.md")
    root = ("--root", str(flow.root))
    if command == "ack":
        res = reviewq_process(
            *root, "ack", "--model", "fake", "kb/notes/pipe.md", "prose/body-check", timeout=15
        )
        assert (res.returncode, res.stderr) == (
            1,
            "error: kb/notes/pipe.md: not a regular file (a FIFO, socket or device)\n",
        )
    else:
        pair = {"note_path": "kb/notes/pipe.md", "gate_id": "prose/body-check"}
        res = reviewq_process(
            *root, "create-jobs", "--input", "-", "--grouping", "note", "--model", "fake", "--json",
            input=json.dumps({"targets": [pair]}), timeout=15,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        (skipped,) = json.loads(res.stdout)["skipped"]
        assert skipped["why"] == "kb/notes/pipe.md: not a regular file (a FIFO, socket or device)"


def test_ack_is_all_or_nothing(flow, run_cli):
    job = create(
        run_cli,
        select_json(run_cli, "frontmatter", "--model", "fake", "--note", NOTE_A),
        "--grouping",
        "note",
    )["jobs"][0]
    write_output(flow, job)
    run_cli("finalize", "--review-job-id", str(job["review_job_id"]))
    flow.write(NOTE_A, flow.read(NOTE_A).replace("title: Alpha", "title: Alpha two"))
    before = acceptance_rows(flow)
    res = run_cli("ack", "--model", "fake", NOTE_A, "frontmatter/title-check", "prose/body-check")
    assert res.exit_code == 1 and "no completed review" in res.stderr
    assert acceptance_rows(flow) == before
    res = run_cli(
        "ack", "--model", "fake", NOTE_A, "frontmatter/title-check", "frontmatter/desc-check"
    )
    assert res.stdout.splitlines() == [
        f"acked: {NOTE_A} frontmatter/title-check",
        f"acked: {NOTE_A} frontmatter/desc-check",
    ]


def test_warn_queue_and_export_match_the_database(flow, run_cli):
    for j in create(
        run_cli, select_json(run_cli, "--all-gates", "--model", "fake"), "--grouping", "note"
    )["jobs"]:
        write_output(
            flow, j, decisions="WARN" if j["pairs"][0]["gate_id"].startswith("prose") else "PASS"
        )
        assert run_cli("finalize", "--review-job-id", str(j["review_job_id"])).exit_code == 0
    warns = run_cli("warn-queue", "--json").json()["warnings"]
    assert {(w["note_path"], w["gate_id"]) for w in warns} == {
        (NOTE_A, "prose/body-check"),
        (NOTE_B, "prose/body-check"),
    }
    assert all("finding 0 for prose/body-check" in w["rationale"] for w in warns)
    # A note renamed (or deleted) since: its WARN is about no note of the KB now.
    (flow.root / NOTE_B).rename(flow.root / "kb/notes/elsewhere.md")
    warns = run_cli("warn-queue", "--json").json()["warnings"]
    assert {(w["note_path"], w["gate_id"]) for w in warns} == {(NOTE_A, "prose/body-check")}
    (flow.root / "kb/notes/elsewhere.md").rename(flow.root / NOTE_B)
    # A changed gate drops its WARN findings from the queue.
    flow.gate(
        "prose/body-check", ["body"], body="## Failure mode\n\nChanged.\n\n## Test\n\nChanged.\n"
    )
    assert run_cli("warn-queue", "--json").json()["warnings"] == []

    res = run_cli("export", "--model", "fake")
    assert res.exit_code == 0 and "exported 6 review(s)" in res.stdout
    rows = list(csv.DictReader((flow.root / "kb/reports/reviews/csv/gate_reviews.csv").open()))
    db = acceptance_rows(flow)
    assert len(rows) == len(db) == 6
    assert {(r["note_path"], r["gate_id"], r["model_partition"]) for r in rows} == {
        (d[1], d[2], d[0]) for d in db
    }
    path = flow.root / "kb/reports/reviews/gates/kb__notes__alpha.md/prose/body-check.md"
    text = path.read_text()
    assert text.startswith(
        "<!-- GATE-REVIEW\nnote-path: kb/notes/alpha.md\ngate-id: prose/body-check\nmodel-partition: fake\n"
    )
    row = next(r for r in rows if r["note_path"] == NOTE_A and r["gate_id"] == "prose/body-check")
    assert (
        f"gate-hash: {row['gate_hash']}\n" in text
        and f"recorded-at: {row['recorded_at']}\n" in text
    )
    assert "## Result: WARN" in text
    # A note renamed and a gate gone since: their files went on being exported as current.
    (flow.root / NOTE_B).rename(flow.root / "kb/notes/beta-renamed.md")
    gate = next(g for g in {r["gate_id"] for r in rows} if g != "prose/body-check")
    [gate_file] = [
        p
        for p in (flow.root / "kb/instructions/review-gates").rglob("*.md")
        if gate in p.read_text()
    ]
    gate_file.unlink()
    res = run_cli("export", "--model", "fake")
    assert res.exit_code == 0, res.stderr
    now = list(csv.DictReader((flow.root / "kb/reports/reviews/csv/gate_reviews.csv").open()))
    assert now and {r["note_path"] for r in now} == {NOTE_A}
    assert gate not in {r["gate_id"] for r in now}
    assert f"exported {len(now)} review(s)" in res.stdout
    gates = flow.root / "kb/reports/reviews/gates"
    assert not (gates / "kb__notes__beta.md").exists()
    assert not list(gates.rglob(f"{gate.split('/')[1]}.md"))


# --- run-job: real agent processes ---------------------------------------------------------


def alpha_job(run_cli, selector: str = "prose") -> dict:
    """The job create-jobs makes for alpha's stale pairs of ``selector``."""
    sel = select_json(run_cli, selector, "--model", "fake", "--note", NOTE_A)
    return create(run_cli, sel, "--grouping", "note")["jobs"][0]


def one_job(flow, run_cli, selector: str = "prose") -> str:
    return str(alpha_job(run_cli, selector)["review_job_id"])


def job_row(flow, jid: str):
    with Store.open(flow.state) as s:
        job = s.conn.execute("SELECT * FROM review_jobs WHERE id = ?", (int(jid),)).fetchone()
        attempts = s.conn.execute("SELECT * FROM attempts WHERE job_id = ?", (int(jid),)).fetchall()
        return dict(job), [dict(a) for a in attempts]


def test_run_job_good(flow, run_cli, monkeypatch):
    jid = one_job(flow, run_cli)
    monkeypatch.setenv("FAKE_MODE", "good")
    monkeypatch.setenv("FAKE_TURNS", "4")
    res = run_cli("run-job", jid)
    assert res.exit_code == 0, res.stderr
    assert f"PASS  {NOTE_A}  prose/body-check" in res.stdout
    job, attempts = job_row(flow, jid)
    assert job["status"] == "completed"
    assert [(a["attempt"], a["outcome"], a["num_turns"], a["cost_usd"]) for a in attempts] == [
        (1, "finalized", 4, 0.01)
    ]


def test_run_job_hang_kills_the_whole_group_at_the_deadline(flow, run_cli, monkeypatch, tmp_path):
    """The agent and the child it started, in its group, both end at the deadline. Under
    load the agent's start (Python, its imports, the child's) outlasted the 1-s deadline:
    killed before it wrote its pids, the test had none to check. The deadline is judged
    here once the agent has said them (its pids file is a FIFO the watch reads first)."""
    from .test_queue_integration import await_fifo, make_fifo

    flow.write("reviewq.toml", flow.read("reviewq.toml").replace('timeout = "20s"', "timeout = 1"))
    jid = one_job(flow, run_cli)
    pidfile = make_fifo(tmp_path, "pids")
    monkeypatch.setenv("FAKE_MODE", "hang")
    monkeypatch.setenv("FAKE_PIDFILE", str(pidfile))
    pids: list[int] = []
    watch = attempt.wait_for_exit

    def once_the_child_runs(*args, **kwargs):
        if not pids:
            pids.extend(map(int, await_fifo(pidfile).split()))
        return watch(*args, **kwargs)

    monkeypatch.setattr(attempt, "wait_for_exit", once_the_child_runs)
    res = run_cli("run-job", jid)
    assert res.exit_code == 1
    assert "ran out of time or turns" in res.stdout and "deadline" in res.stderr
    assert len(pids) == 2
    for pid in pids:
        assert process_gone(pid), f"process {pid} survived the deadline"
    job, attempts = job_row(flow, jid)
    assert job["status"] == "failed" and attempts[0]["outcome"] == "burned-out"


def test_run_job_touching_the_kb_fails_the_attempt(flow, run_cli, monkeypatch):
    jid = one_job(flow, run_cli)
    monkeypatch.setenv("FAKE_MODE", "touch")
    res = run_cli("run-job", jid)
    assert res.exit_code == 1 and f"the reviewer changed {NOTE_A}" in res.stderr
    job, attempts = job_row(flow, jid)
    assert attempts[0]["outcome"] == "reviewer-touched-kb" and job["status"] == "failed"
    assert acceptance_rows(flow) == []


@pytest.mark.parametrize(
    "mode, moves",
    [("touch", "commit -qam an-agent-s-edit"), ("good", "checkout -q other")],
    ids=["its-edit-committed", "another-branch"],
)
def test_an_agent_that_moves_the_kb_s_head_itself_touched_the_kb(
    flow, run_cli, monkeypatch, mode, moves
):
    """K100 took every file as the commit HEAD moved to holds it for an update of the KB
    (a `git pull`): an agent that committed its own edit, or checked out another branch,
    was excused and its review accepted, the KB left on its commit or branch (C87). Only
    a move git's reflog says is an update is the update's."""
    from .test_fix_commits import git

    git(flow.root, "init", "-q", "-b", "main")
    git(flow.root, "config", "user.name", "A Person")
    git(flow.root, "config", "user.email", "person@example.org")
    git(flow.root, "add", "kb")
    git(flow.root, "commit", "-qm", "the KB")
    git(flow.root, "checkout", "-qb", "other")
    flow.write(NOTE_A, flow.read(NOTE_A) + "Another branch's line.\n")
    git(flow.root, "commit", "-qam", "another branch")
    git(flow.root, "checkout", "-q", "main")
    jid = one_job(flow, run_cli)
    monkeypatch.setenv("FAKE_MODE", mode)
    monkeypatch.setenv("FAKE_GIT", moves)
    res = run_cli("run-job", jid)
    assert res.exit_code == 1 and f"the reviewer changed {NOTE_A}" in res.stderr, res.stderr
    job, attempts = job_row(flow, jid)
    assert attempts[0]["outcome"] == "reviewer-touched-kb" and job["status"] == "failed"
    assert acceptance_rows(flow) == []


def test_run_job_crash_is_a_launch_failure_and_requeues(flow, run_cli, monkeypatch):
    jid = one_job(flow, run_cli)
    monkeypatch.setenv("FAKE_MODE", "crash")
    res = run_cli("run-job", jid)
    assert res.exit_code == 1 and "queued again" in res.stderr
    job, attempts = job_row(flow, jid)
    assert job["status"] == "queued" and attempts[0]["outcome"] == "launch-failure"


def test_run_job_missing_binary_is_a_launch_failure(flow, run_cli):
    flow.write(
        "reviewq.toml",
        '[reviewers.fake]\nkind = "command"\ncommand = ["/nonexistent/agent"]\npartition = "fake"\n',
    )
    jid = one_job(flow, run_cli)
    res = run_cli("run-job", jid)
    assert res.exit_code == 1 and "could not start" in res.stderr
    assert job_row(flow, jid)[0]["status"] == "queued"
    # A program that never ran has no exit code: it said "exit None", Python's word. In
    # words, as `job N` says it: it said "launch-failure (never started, …)", the log's term.
    assert res.stdout == f"job {jid} attempt 1: the agent did not start (0.0 s)\n"
    assert f"error: job {jid} queued again (the agent did not start)\n" in res.stderr


def test_run_job_no_output_after_turns(flow, run_cli, monkeypatch):
    jid = one_job(flow, run_cli)
    monkeypatch.setenv("FAKE_MODE", "nothing")
    monkeypatch.setenv("FAKE_TURNS", "3")
    assert run_cli("run-job", jid).exit_code == 1
    assert job_row(flow, jid)[1][0]["outcome"] == "no-output"


def test_run_job_with_the_offline_reviewer(kb, run_cli):
    kb.gate("frontmatter/desc-check", ["description"])
    kb.note("empty-desc", description="")
    kb.note("full")
    sel = select_json(run_cli, "--all-gates", "--model", "offline")
    for j in create(run_cli, sel, "--grouping", "note")["jobs"]:
        res = run_cli("run-job", str(j["review_job_id"]))
        assert res.exit_code == 0, res.stderr
    decisions = {(r[1], r[2]): r[6] for r in acceptance_rows(kb)}
    assert decisions == {
        ("kb/notes/empty-desc.md", "frontmatter/desc-check"): "FAIL",
        ("kb/notes/full.md", "frontmatter/desc-check"): "PASS",
    }
    result = next((kb.state / "jobs").rglob("kb__notes__empty-desc.md--*.md")).read_text()
    assert "offline reviewer" in result and "description region is empty" in result


def test_a_third_rejection_finalized_by_hand_is_escalated(flow, run_cli):
    """CONTRACT §7 counts rejections however a decision is recorded: the manual path's third
    FAIL goes to a person, as the control process's would."""
    for cycle in (1, 2, 3):
        # A person's edit between the reviews, as a fix's would be: the pair is stale again.
        flow.write(NOTE_A, flow.read(NOTE_A) + f"Edit {cycle}.\n")
        job = alpha_job(run_cli)
        write_output(flow, job, decisions="FAIL")
        res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]))
        assert res.exit_code == 0, res.stderr
        assert ("escalated:" in res.stdout) == (cycle == 3), res.stdout
    assert f"escalated: {NOTE_A} prose/body-check (escalation 1;" in res.stdout
    with Store.open(flow.state) as s:
        escs = s.conn.execute("SELECT note_path, gate_id, cycles FROM escalations").fetchall()
    assert [tuple(e) for e in escs] == [(NOTE_A, "prose/body-check", 3)]
    report = (flow.state / "escalations" / "escalation-1.md").read_text()
    assert report.startswith(f"Gate review: {NOTE_A} — prose/body-check")


def test_run_job_of_a_fix_sweep_starts_the_fix(kb, run_cli):
    """A job of a ``--fix`` sweep run by hand is followed as a worker's would be: its FAIL
    note gets a fix job, queued for the control process."""
    kb.gate("frontmatter/desc-check", ["description"])
    kb.note("empty-desc", description="")
    res = run_cli("enqueue", "--all-gates", "--reviewer", "offline", "--fix", "--json")
    assert res.exit_code == 0, res.stderr
    (job,) = res.json()["jobs"]
    res = run_cli("run-job", str(job["review_job_id"]))
    assert res.exit_code == 0, res.stderr
    with Store.open(kb.state) as s:
        fixes = s.conn.execute(
            "SELECT id, note_path, status, source_job_id FROM review_jobs WHERE kind = 'fix'"
        ).fetchall()
    assert [tuple(f)[1:] for f in fixes] == [
        ("kb/notes/empty-desc.md", "queued", job["review_job_id"])
    ]
    assert f"follow-up: fix job {fixes[0]['id']} queued" in res.stdout
    # No control process runs for the folder: said, or the fix was awaited in vain.
    assert res.stdout.endswith(
        "no control process runs for this state folder: the follow-up waits for one "
        "(reviewq control and a worker, or reviewq sweep, which also runs it)\n"
    ), res.stdout


@pytest.mark.parametrize(
    "args, says",
    [
        (("job", "99999999999999999999999"), "is too large for a job id"),
        (("logs", "--job", "99999999999999999999999"), "is too large for a job id"),
        (("decide", "99999999999999999999999", "approve"), "is too large for an escalation id"),
        (("jobs", "--limit", "99999999999999999999999"), "is too large for a count"),
        (("report", "--run", "99999999999999999999999"), "is too large for a sweep run id"),
        (("worker", "--workers", "100000"), "100000 is not in the range 1<=x<=256"),
        (("sweep", "--workers", "100000"), "100000 is not in the range 0<=x<=256"),
        (("enqueue", "prose", "--budget-usd", "nan"), "nan: a cap in dollars, 0 or more"),
        (("enqueue", "prose", "--budget-usd", "-1"), "-1.0: a cap in dollars, 0 or more"),
        (("create-jobs", "--input", "{bad}", "--grouping", "note"), "bad.json: not UTF-8 text"),
        (("--state", "{file}/state", "worker"), "cannot make the worker's folder"),
        (("export", "--model", "typo"), "--model typo: no review recorded in this partition"),
        (("export", "--model", ""), "--model: empty"),
        (("report", "--since", " "), "--since: empty"),
        (("report", "--sweep", ""), "--sweep: empty"),
        (("--root", "", "status"), "--root: empty"),
        (("--state", " ", "status"), "--state: empty"),
        (("--config", "", "status"), "--config: empty"),
        (("select", "prose", "--model", ""), "--model: empty"),
        # An unset shell variable: `--note ''` swept (and with --fix rewrote) every note.
        (("select", "--all-gates", "--note", ""), "--note: empty"),
        (("sweep", "--fix", "--note", "{note}", "--note", " "), "--note: empty"),
        (("enqueue", "--all-gates", "--reviewer", ""), "--reviewer: empty"),
        (("enqueue", "--fix", "--fixer", ""), "--fixer: empty"),
        (("enqueue", "--auditor", ""), "--auditor: empty"),
        (("enqueue", "--name", ""), "--name: empty"),
        (("run-job", "1", "--reviewer", ""), "--reviewer: empty"),
        (("logs", "--event", ""), "--event: empty"),
        # Said as they are: "is null" for a number; "[Errno 21] Is a directory: '/…'".
        (
            ("create-jobs", "--input", "{num}", "--grouping", "note"),
            "input's model_partition 5: expected a partition name",
        ),
        (("ack", "--model", "fake", "{notes}", "prose/body-check"), "kb/notes: not a note (a .md"),
        # Summed into budgets and reports: a negative or infinite cost was recorded as given.
        (
            ("finalize", "--review-job-id", "1", "--telemetry-json", '{{"cost_usd": -1}}'),
            "--telemetry-json: cost_usd -1: expected a number, 0 or more",
        ),
        (
            ("finalize", "--review-job-id", "1", "--telemetry-json", '{{"cost_usd": Infinity}}'),
            "--telemetry-json: cost_usd inf: expected a number, 0 or more",
        ),
        (("decide", "--note", "", "reject"), "--note: empty"),
        # Unicode digits: '١' decided escalation 1, '²' was an internal error (ValueError).
        (("decide", "\u0661", "reject"), "'\u0661' is not an escalation id"),
        (("decide", "\u00b2", "reject"), "'\u00b2' is not an escalation id"),
        # Bytes that are not UTF-8 (a Latin-1 terminal): UnicodeEncodeError at the store.
        (("decide", "1", "redo", "--feedback", "fix \udcff it"), "fix \\udcff it: not UTF-8"),
        (("decide", "--note", "kb/notes/\udcff.md", "reject"), "--note: kb/notes/\\udcff.md"),
    ],
)
def test_bad_arguments_get_one_clear_line(flow, run_cli, args, says):
    """Each was an internal error (OverflowError, UnicodeDecodeError, PermissionError) or
    was taken silently: NaN stored as no budget at all, a typo'd partition exported as an
    empty index beside the last export's files."""
    Store.open(flow.state).close()  # a state folder in use: the arguments are what is wrong
    bad = flow.root / "bad.json"
    bad.write_bytes(b"\xff\xfe{}")
    num = flow.root / "num.json"
    num.write_text('{"model_partition": 5, "targets": []}')
    (flow.root / "file").write_text("")
    note = flow.root / "kb" / "notes" / "alpha.md"
    file, notes = flow.root / "file", note.parent
    args = tuple(a.format(bad=bad, num=num, file=file, note=note, notes=notes) for a in args)
    res = run_cli(*args)
    assert res.exit_code in (1, 2), res.stdout
    assert says in res.stderr and "internal error" not in res.stderr


def test_run_job_runs_a_fix_job_with_a_fixer_of_another_partition(kb, run_cli):
    """A fix records no decision: the sweep's fixer runs it by hand as on a worker, where
    it was refused for writing another partition than the reviewed job's."""
    kb.gate("frontmatter/desc-check", ["description"])
    kb.note("empty-desc", description="")
    kb.write("reviewq.toml", '[reviewers.fixbot]\nkind = "offline"\npartition = "fixbot"\n')
    res = run_cli("enqueue", "--all-gates", "--fix", "--fixer", "fixbot", "--json")
    (job,) = res.json()["jobs"]
    assert run_cli("run-job", str(job["review_job_id"])).exit_code == 0
    with Store.open(kb.state) as s:
        fix_id, fixer = s.conn.execute(
            "SELECT id, reviewer FROM review_jobs WHERE kind = 'fix'"
        ).fetchone()
    assert fixer == "fixbot"
    res = run_cli("run-job", str(fix_id))
    assert res.exit_code == 0, res.stderr


def test_create_jobs_takes_one_pair_however_its_note_path_is_spelled(flow, run_cli):
    """'./kb/notes/a.md' and 'kb/notes//a.md' are one pair: as two, the second INSERT
    failed a UNIQUE constraint and no job was created, not even for the other targets."""
    spellings = [NOTE_A, f"./{NOTE_A}", NOTE_A.replace("notes/", "notes//"), NOTE_B]
    selection = json.dumps(
        {
            "model_partition": "fake",
            "targets": [{"note_path": p, "gate_id": "prose/body-check"} for p in spellings],
        }
    )
    res = run_cli("create-jobs", "--input", "-", "--grouping", "gate", "--json", input=selection)
    assert res.exit_code == 0, res.stderr
    pairs = [(p["note_path"], p["gate_id"]) for j in res.json()["jobs"] for p in j["pairs"]]
    assert sorted(pairs) == [(NOTE_A, "prose/body-check"), (NOTE_B, "prose/body-check")]


def test_create_jobs_takes_an_absolute_note_path_under_the_root(flow, run_cli, tmp_path):
    """A target edited to the note's absolute path was skipped as 'outside the KB root',
    though the note is in it (ack takes the same path)."""
    outside = tmp_path / "elsewhere.md"
    outside.write_text("# Elsewhere\n")
    targets = [str(flow.root / NOTE_A), NOTE_A, str(outside)]
    selection = json.dumps(
        {
            "model_partition": "fake",
            "targets": [{"note_path": p, "gate_id": "prose/body-check"} for p in targets],
        }
    )
    res = run_cli("create-jobs", "--input", "-", "--grouping", "gate", "--json", input=selection)
    assert res.exit_code == 0, res.stderr
    pairs = [(p["note_path"], p["gate_id"]) for j in res.json()["jobs"] for p in j["pairs"]]
    assert pairs == [(NOTE_A, "prose/body-check")]
    assert [s["why"] for s in res.json()["skipped"]] == [f"{outside}: outside the KB root"]


def test_an_export_that_cannot_be_written_says_where(flow, run_cli):
    # kb/reports made a file: an internal error (NotADirectoryError) before.
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    assert run_cli("run-job", "1").exit_code == 0
    shutil.rmtree(flow.root / "kb" / "reports", ignore_errors=True)
    (flow.root / "kb" / "reports").write_text("a file where the export folder belongs\n")
    res = run_cli("export")
    assert res.exit_code == 1
    assert (
        res.stderr.startswith("error: cannot write the export at ") and res.stderr.count("\n") == 1
    )
    assert "Not a directory" in res.stderr


def test_an_export_that_cannot_be_written_names_the_file_not_its_temp_file(flow, run_cli):
    """The line named the hidden temp file the write went through (`csv/.gate_reviews.csv.
    4242-3.tmp: Is a directory`), a file that never was, not the one in the way."""
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    assert run_cli("run-job", "1").exit_code == 0
    assert run_cli("export").exit_code == 0
    reviews = flow.root / "kb" / "reports" / "reviews"
    index = reviews / "csv" / "gate_reviews.csv"
    index.unlink()
    index.mkdir()
    res = run_cli("export")
    assert res.exit_code == 1
    assert res.stderr == f"error: cannot write the export at {index}: Is a directory\n"
    index.rmdir()
    lens = reviews / "gates" / "kb__notes__alpha.md" / "frontmatter"  # a file there
    shutil.rmtree(lens)
    lens.write_text("")
    res = run_cli("export")
    assert res.exit_code == 1
    assert f"cannot write the export at {lens}/" in res.stderr
    assert ".tmp" not in res.stderr and res.stderr.endswith(".md: Not a directory\n")


@pytest.mark.parametrize(
    "link",
    [
        "kb/reports",
        "kb/reports/reviews/gates",
        "kb/reports/reviews/gates/kb__notes__alpha.md",
        "kb/reports/reviews/gates/kb__notes__alpha.md/prose",  # a lens's folder
    ],
)
def test_an_export_through_a_linked_folder_is_refused_and_removes_nothing(
    flow, run_cli, tmp_path, link
):
    """The export's clean-up walked a linked folder too: with `gates` a link to /etc,
    every file there that this export did not write was removed."""
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    assert run_cli("run-job", "1").exit_code == 0
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "precious.txt").write_text("keep\n")
    (victim / "sub" / "also.md").write_text("keep\n")
    where = flow.root / link
    where.parent.mkdir(parents=True, exist_ok=True)
    where.symlink_to(victim)
    res = run_cli("export")
    assert res.exit_code == 1
    assert res.stderr == (
        f"error: {where}: is a symbolic link; the export writes only in folders of the KB "
        "itself (replace the link with a folder); nothing exported\n"
    )
    assert sorted(p.relative_to(victim).as_posix() for p in victim.rglob("*")) == [
        "precious.txt",
        "sub",
        "sub/also.md",
    ]
    # Nothing written before the refusal either: a lens's folder was found only when
    # its file was to be written, after the notes' files before it were.
    written = [
        Path(top) / name
        for top, _, names in os.walk(flow.root / "kb" / "reports")
        for name in names
        if where not in (Path(top) / name).parents
    ]
    assert written == []


def test_an_export_removes_only_files_an_export_wrote(flow, run_cli):
    """A person's own file beside the exported ones (a README) was removed as a stale
    export."""
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    assert run_cli("run-job", "1").exit_code == 0
    gates = flow.root / "kb" / "reports" / "reviews" / "gates"
    gates.mkdir(parents=True)
    (gates / "README.md").write_text("# What these files are\n")
    assert run_cli("export").exit_code == 0
    assert (gates / "README.md").read_text() == "# What these files are\n"


def test_an_export_leaves_no_file_of_an_earlier_one(flow, run_cli):
    """The export is the view of the reviews now: a file from an earlier export (a note
    since renamed, another partition's) stayed beside the new index and read as current."""
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    for job in (1, 2):
        assert run_cli("run-job", str(job)).exit_code == 0
    gates = flow.root / "kb" / "reports" / "reviews" / "gates"
    old = gates / "kb__notes__renamed.md" / "prose" / "body-check.md"
    old.parent.mkdir(parents=True)
    old.write_text("<!-- GATE-REVIEW\nnote-path: kb/notes/renamed.md\n-->\n")
    res = run_cli("export")
    assert res.exit_code == 0, res.stderr
    exported = {p.relative_to(gates).as_posix() for p in gates.rglob("*") if p.is_file()}
    rows = list(csv.DictReader((gates.parent / "csv" / "gate_reviews.csv").open()))
    assert len(exported) == len(rows) > 0
    assert not (gates / "kb__notes__renamed.md").exists()


def test_an_export_of_an_unchanged_state_writes_no_file(flow, run_cli):
    """Every export replaced every GATE-REVIEW file and the index with the same bytes: on the
    real KB (12,832 files) each run took 7 s and gave every file a new inode and mtime, so
    the KB's `git status` read them all again (stop 46). A file whose bytes differ (a
    person's edit, a link put in its place) is written again, alone."""
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    for job in (1, 2):
        assert run_cli("run-job", str(job)).exit_code == 0
    reviews = flow.root / "kb" / "reports" / "reviews"

    def files() -> dict[Path, tuple[int, int]]:
        return {
            p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in reviews.rglob("*") if p.is_file()
        }

    def export() -> None:
        res = reviewq_process("--root", str(flow.root), "export")
        assert res.returncode == 0, res.stderr

    export()
    before = files()
    assert len(before) > 2
    export()
    assert files() == before
    edited = next(p for p in before if p.suffix == ".md")
    text = edited.read_text()
    edited.write_text(text + "A person's line.\n")
    export()
    after = files()
    assert edited.read_text() == text
    assert {p for p in before if after[p] != before[p]} == {edited}
    # A link there holding the same bytes is not read through: it is replaced by the file.
    outside = flow.root.parent / "same-bytes.md"
    outside.write_text(text)
    edited.unlink()
    edited.symlink_to(outside)
    export()
    assert not edited.is_symlink() and edited.read_text() == text


def git_at(root: Path, *args: str, at: str | None = None) -> str:
    """``git ARGS`` in ``root``, its commits dated ``at`` (else now)."""
    env = {**os.environ, **({"GIT_COMMITTER_DATE": at, "GIT_AUTHOR_DATE": at} if at else {})}
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=30, check=True,
    ).stdout.strip()  # fmt: skip


def test_an_export_is_readable_by_others_as_the_report_page_is(flow, run_cli):
    """Its files were written 0600, the temp file's mode: a view for people and other tools
    that the KB's other users (a team's shared checkout, a site built from it by another
    account) could not read, while the report page is 0644. An earlier export's 0600
    file of the same bytes is given the mode too."""
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    for job in (1, 2):
        assert run_cli("run-job", str(job)).exit_code == 0
    assert run_cli("export").exit_code == 0
    files = [p for p in (flow.root / "kb/reports/reviews").rglob("*") if p.is_file()]
    assert len(files) > 2
    assert {p.stat().st_mode & 0o777 for p in files} == {0o644}
    files[0].chmod(0o600)
    assert run_cli("export").exit_code == 0
    assert files[0].stat().st_mode & 0o777 == 0o644


def test_a_reviews_commit_is_the_one_head_was_at_when_it_was_recorded(tmp_path):
    """Read from HEAD's first-parent line: a commit in the second of the review may have
    come after it, and one dated back was made no earlier than its parent."""
    from orchestrator.review.export import HeadHistory

    assert HeadHistory(tmp_path).at("2026-01-01T00:00:00Z") == ""  # not a repository
    git_at(tmp_path, "init", "-q")
    assert HeadHistory(tmp_path).at("2026-01-01T00:00:00Z") == ""  # no commit yet
    made = {}
    for name, at in (("a", "2026-01-01T00:00:00Z"), ("b", "2026-03-01T00:00:00Z"),
                     ("c", "2026-02-01T00:00:00Z")):  # fmt: skip
        git_at(tmp_path, "commit", "-q", "--allow-empty", "-m", name, at=at)
        made[name] = git_at(tmp_path, "rev-parse", "HEAD")
    head = HeadHistory(tmp_path)
    assert head.at("2025-12-31T23:59:59.999Z") == ""
    assert head.at("2026-01-01T00:00:00.999Z") == ""
    assert head.at("2026-01-01T00:00:01.000Z") == made["a"]
    assert head.at("2026-02-15T00:00:00.000Z") == made["a"]  # c, dated back, came after b
    assert head.at("2026-03-01T00:00:00.500Z") == made["a"]
    assert head.at("2026-03-01T00:00:01.000Z") == made["c"]
    assert head.at("not a time") == ""


def test_an_export_committed_to_the_kb_is_not_changed_by_the_next_export(flow, run_cli):
    """Every file's `recorded-commit` was the KB's HEAD at the export: a KB that commits
    its export (the folder is in it) had all 12,832 files of the real KB changed by each
    next export, and committed again, night after night (stop 46). It is now the commit
    HEAD was at when the review was recorded: what a later commit leaves as it is."""

    def git(*args: str, at: str | None = None) -> str:
        return git_at(flow.root, *args, at=at)

    reviewed_at = reviewed_in_git(flow, run_cli)
    assert set(recorded_commits(flow, run_cli).values()) == {reviewed_at}
    files = exported_files(flow)
    git("add", "-A")
    git("commit", "-qm", "the night's export")  # the second the last review was recorded in
    assert run_cli("export").exit_code == 0
    assert exported_files(flow) == files
    assert git("status", "--porcelain") == ""


def reviewed_in_git(flow, run_cli) -> str:
    """The KB committed to a new repository and its pairs reviewed: the commit."""
    git_at(flow.root, "init", "-q")
    flow.write(".gitignore", ".reviewq/\n")
    git_at(flow.root, "add", "-A")
    git_at(flow.root, "commit", "-qm", "the KB", at="2026-01-01T00:00:00Z")
    assert review_stale(run_cli) == [1, 2, 3, 4]
    return git_at(flow.root, "rev-parse", "HEAD")


def review_stale(run_cli) -> list[int]:
    """Every stale pair reviewed by the offline reviewer, its jobs run: their ids."""
    res = run_cli("enqueue", "--all-gates", "--reviewer", "offline", "--json")
    assert res.exit_code == 0, res.stderr
    jobs = [j["review_job_id"] for j in res.json()["jobs"]]
    for job in jobs:
        assert run_cli("run-job", str(job)).exit_code == 0
    return jobs


def recorded_commits(flow, run_cli) -> dict[str, str]:
    """An export's `recorded_commit` of each pair ("NOTE GATE"), from its index."""
    res = run_cli("export")
    assert res.exit_code == 0, res.stderr
    with open(flow.root / EXPORT_DIR / "csv/gate_reviews.csv", newline="") as f:
        return {f"{r['note_path']} {r['gate_id']}": r["recorded_commit"] for r in csv.DictReader(f)}


def commit_alpha(flow, body: str, at: str | None = None) -> str:
    """alpha's body changed and committed (dated ``at``): the commit."""
    flow.note("alpha", body=body)
    git_at(flow.root, "commit", "-qam", "alpha", at=at)
    return git_at(flow.root, "rev-parse", "HEAD")


ALPHA_BODY = f"{NOTE_A} prose/body-check"


def test_a_review_before_a_rebase_names_the_commit_it_reviewed(flow, run_cli):
    """E84: read by commit times, a review of a local commit rebased afterwards onto
    upstream work (made elsewhere, earlier) named the upstream commit under it, which
    HEAD never held and which has not the reviewed text: the rebased commit is dated
    after the review. The commit is now kept as the job's snapshot of the note is taken."""
    first = reviewed_in_git(flow, run_cli)
    git_at(flow.root, "checkout", "-qb", "upstream")
    flow.write("upstream.txt", "made elsewhere\n")
    git_at(flow.root, "add", "upstream.txt")
    git_at(flow.root, "commit", "-qm", "upstream", at="2026-02-01T00:00:00Z")
    git_at(flow.root, "checkout", "-q", "-")
    local = commit_alpha(
        flow, "# Alpha\n\nAlpha body, rewritten here.\n", at="2026-03-01T00:00:00Z"
    )
    assert review_stale(run_cli) == [5]
    git_at(flow.root, "rebase", "-q", "upstream")
    assert git_at(flow.root, "rev-parse", "HEAD") != local
    assert recorded_commits(flow, run_cli) == {
        **dict.fromkeys(
            [f"{n} {g}" for n in (NOTE_A, NOTE_B) for g in ("frontmatter/desc-check",
             "frontmatter/title-check", "prose/body-check")], first,
        ),
        ALPHA_BODY: local,
    }  # fmt: skip


def test_a_commit_dated_ahead_holds_no_later_review_back(flow, run_cli):
    """E85: read by commit times, a commit of a clock a year fast held every later commit
    back to its date (each made no earlier than its parent): a review of the commit after
    it named the one before both."""
    first = reviewed_in_git(flow, run_cli)
    flow.write("ahead.txt", "a clock a year fast\n")
    git_at(flow.root, "add", "ahead.txt")
    git_at(flow.root, "commit", "-qm", "ahead", at="2027-11-01T00:00:00Z")
    reviewed = commit_alpha(flow, "# Alpha\n\nAlpha body, after it.\n")
    assert review_stale(run_cli) == [5]
    got = recorded_commits(flow, run_cli)
    assert (got[ALPHA_BODY], got[f"{NOTE_B} prose/body-check"]) == (reviewed, first)


def test_an_acks_commit_is_the_one_head_was_at_as_it_read_the_note(flow, run_cli):
    """E85 by `ack`: the text it records is the note as it read it, at the commit HEAD
    was at then, a commit dated ahead or not."""
    first = reviewed_in_git(flow, run_cli)
    ahead = commit_alpha(flow, "# Alpha\n\nAlpha body.\n\n", at="2027-11-01T00:00:00Z")
    res = run_cli("ack", "--model", "offline", NOTE_A, "prose/body-check")
    assert res.exit_code == 0, res.stderr
    got = recorded_commits(flow, run_cli)
    assert (got[ALPHA_BODY], got[f"{NOTE_B} prose/body-check"]) == (ahead, first)


def test_a_review_recorded_in_its_commits_second_names_that_commit(flow, run_cli, monkeypatch):
    """E86: read by commit times, a commit in the second a review was recorded in was not
    taken (it may have come after it): a review recorded in the second of its note's
    commit (a re-review a moment after its fix's commit) named the commit before it."""
    from orchestrator.review import finalize

    first = reviewed_in_git(flow, run_cli)
    reviewed = commit_alpha(flow, "# Alpha\n\nAlpha body, fixed.\n", at="2026-06-01T00:00:00Z")
    monkeypatch.setattr(finalize, "utcnow", lambda: "2026-06-01T00:00:00.500Z")
    assert review_stale(run_cli) == [5]
    got = recorded_commits(flow, run_cli)
    assert (got[ALPHA_BODY], got[f"{NOTE_B} prose/body-check"]) == (reviewed, first)


def exported_files(flow) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in (flow.root / EXPORT_DIR).rglob("*") if p.is_file()}


def test_an_export_git_cannot_read_the_history_of_writes_nothing(flow, run_cli, monkeypatch):
    """A KB git will not read, owned by another user (an export run as root, or by a
    cron of another user, with no `safe.directory`): every `recorded-commit` was written
    empty, as if the KB were outside git, with "exported" and no word of git's refusal.
    A KB that commits its export had every file rewritten, and again by the next export
    git read (E82's own defect), and a tool reading the commit was told there was none.
    Git's history is read only for reviews recorded before their commit was kept
    (migration 26): the others export as they are."""
    reviewed = reviewed_in_git(flow, run_cli)
    assert run_cli("export").exit_code == 0
    files = exported_files(flow)
    if os.geteuid() == 0:
        os.chown(flow.root, 65534, 65534)
    else:  # git's own check, told the owner is another
        monkeypatch.setenv("GIT_TEST_ASSUME_DIFFERENT_OWNER", "1")
    try:
        kept = recorded_commits(flow, run_cli)
        as_release_25(flow)
        res = run_cli("export")
    finally:
        if os.geteuid() == 0:
            os.chown(flow.root, 0, 0)
    assert set(kept.values()) == {reviewed}
    assert res.exit_code == 1, res.stdout
    assert res.stderr == (
        "error: cannot read the KB's git history for recorded-commit: git cannot use the "
        f"KB's repository: fatal: detected dubious ownership in repository at '{flow.root}'; "
        "nothing exported\n"
    )
    assert exported_files(flow) == files


def test_a_jobs_commit_is_read_from_gits_files_in_a_larger_repository(flow, run_cli, monkeypatch):
    """The commit is read as the job's snapshot is taken, with no git process (the
    control makes a re-review's jobs as outcomes arrive): here no git on PATH, the KB a
    folder of a larger repository, its HEAD detached, its refs packed."""
    top = flow.root.parent
    git_at(top, "init", "-q")
    (top / ".gitignore").write_text(".reviewq/\n")
    git_at(top, "add", "-A")
    git_at(top, "commit", "-qm", "the monorepo")
    git_at(top, "commit", "-q", "--allow-empty", "-m", "later")
    git_at(top, "checkout", "-q", "--detach", "HEAD~1")
    git_at(top, "pack-refs", "--all")
    held = git_at(top, "rev-parse", "HEAD")
    monkeypatch.setenv("PATH", str(top / "no-git-here"))
    assert review_stale(run_cli) == [1, 2, 3, 4]
    assert set(recorded_commits(flow, run_cli).values()) == {held}


# What each migration after release 25 adds, taken away again. Each one merged after
# this test was written made it fail on its own statement run twice ("duplicate column
# name: cron_at", 27's indexes before): the next one is named here, or the test says so.
AFTER_RELEASE_25 = {
    26: (
        "ALTER TABLE acceptance DROP COLUMN note_commit",
        "ALTER TABLE review_pairs DROP COLUMN note_commit",
    ),
    27: ("DROP INDEX escalations_pair", "DROP INDEX escalations_job"),
    28: ("ALTER TABLE sweep_runs DROP COLUMN cron_at",),
    29: ("DROP INDEX review_jobs_cycle_queued",),
}


def as_release_25(flow) -> None:
    """state.db made back into one of the release before migration 26, its reviews and
    queued jobs as they are: no commit kept with them."""
    from orchestrator.state.migrations import LATEST

    assert max(AFTER_RELEASE_25) == LATEST, (
        f"migration {LATEST}: name in AFTER_RELEASE_25 what it adds, to be taken away"
    )
    with contextlib.closing(sqlite3.connect(flow.state / "state.db")) as conn, conn:
        for version in sorted(AFTER_RELEASE_25, reverse=True):
            for statement in AFTER_RELEASE_25[version]:
                conn.execute(statement)
        conn.execute("DELETE FROM schema_migrations WHERE version >= 26")


def test_reviews_of_a_state_db_before_migration_26_keep_their_commit_by_times(flow, run_cli):
    """A state.db of the release before: its reviews, and a job it queued and this one
    runs, have no commit kept; export reads theirs from commit times as it did. A review
    of a job this release makes keeps its commit, a commit dated ahead or not."""
    from orchestrator.state.migrations import LATEST

    first = reviewed_in_git(flow, run_cli)
    flow.note("alpha", body="# Alpha\n\nAlpha body, edited.\n")  # uncommitted
    res = run_cli("enqueue", "--all-gates", "--reviewer", "offline")
    assert res.exit_code == 0, res.stderr
    as_release_25(flow)
    assert run_cli("run-job", "5").exit_code == 0  # migrated by it
    with contextlib.closing(sqlite3.connect(flow.state / "state.db")) as conn:
        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (LATEST,)
        assert conn.execute(
            "SELECT count(*) FROM acceptance WHERE note_commit IS NULL"
        ).fetchone() == (6,)
    got = recorded_commits(flow, run_cli)
    assert (got[ALPHA_BODY], got[f"{NOTE_B} prose/body-check"]) == (first, first)
    ahead = commit_alpha(flow, "# Alpha\n\nAlpha body, a year ahead.\n", at="2027-11-01T00:00:00Z")
    assert review_stale(run_cli) == [6]
    got = recorded_commits(flow, run_cli)
    assert (got[ALPHA_BODY], got[f"{NOTE_B} prose/body-check"]) == (ahead, first)


@contextlib.contextmanager
def export_behind_a_held_lock(flow, *args: str):
    """``reviewq export ARGS`` started while this test holds the export folder's lock (as
    an export writing it does), once it has said it waits: the process, and the folder.
    The lock is let go when the block ends; the process is killed if the block fails."""
    base = flow.root / "kb/reports/reviews"
    base.mkdir(parents=True)
    exe = str(Path(sys.executable).parent / "reviewq")
    held = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        proc = subprocess.Popen(
            [exe, "--root", str(flow.root), "export", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            said = proc.stderr.readline()
            assert said.startswith(
                "another reviewq export is writing kb/reports/reviews: waiting for it to end"
            ), said
            yield proc, base
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    finally:
        os.close(held)


def test_an_export_waits_for_one_already_writing_and_leaves_a_whole_view(flow, run_cli):
    """Two exports at once (two cron entries, a person's run beside cron's) each removed
    the files the other had written: the folder held parts of both and fewer files than
    its index named, and both said they had exported."""
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    for job in (1, 2):
        assert run_cli("run-job", str(job)).exit_code == 0
    with export_behind_a_held_lock(flow) as (proc, base):
        assert list(base.rglob("*")) == []  # nothing written while the other writes
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    rows = list(csv.DictReader((base / "csv" / "gate_reviews.csv").open()))
    exported = [p for p in (base / "gates").rglob("*.md") if p.is_file()]
    assert len(exported) == len(rows) > 0
    assert out.startswith(f"exported {len(rows)} review(s)")


def test_an_export_reads_the_notes_once_the_other_export_is_done(flow, run_cli):
    """The notes were read before the wait: a note deleted meanwhile still got its
    GATE-REVIEW files, as a review of a note the KB no longer has."""
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    for job in (1, 2, 3, 4):
        assert run_cli("run-job", str(job)).exit_code == 0
    with export_behind_a_held_lock(flow) as (proc, base):
        (flow.root / NOTE_B).unlink()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    notes = {r["note_path"] for r in csv.DictReader((base / "csv" / "gate_reviews.csv").open())}
    assert notes == {NOTE_A}


def test_an_export_waits_for_a_stuck_one_a_bounded_time_and_names_it(flow, run_cli):
    """The wait had no end: an export left holding the folder (stopped, hung on a disk)
    kept every later one waiting, silent, for good."""
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    assert run_cli("run-job", "1").exit_code == 0
    with export_behind_a_held_lock(flow, "--wait", "0.3") as (proc, base):
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and out == ""
    assert err.splitlines() == [
        f"error: kb/reports/reviews: another reviewq export (pid {os.getpid()}) still holds "
        "its lock (flock on that folder) after 0.3 s; nothing exported"
    ]
    assert list(base.rglob("*")) == []


def test_a_retyped_notes_reviews_of_gates_it_no_longer_has_are_not_shown_nor_acked(flow, run_cli):
    """A note whose type changed kept, in export and warn-queue, the reviews of its old
    type's pair and of gates asking for that type, as if current; and ack carried them
    forward to the retyped text."""
    flow.type_spec("definition")
    flow.type_spec("note")
    flow.gate("prose/definition-check", ["body"], requires_type="definition")
    note = flow.note("retyped", type="definition")
    asked = ["type/definition", "prose/definition-check", "prose/body-check"]
    flow.accept("fake", [(note, g) for g in asked], decision="WARN")
    flow.write(note, flow.read(note).replace("type: definition", "type: note"))
    assert run_cli("export").exit_code == 0
    gates = flow.root / "kb/reports/reviews/gates"
    assert sorted(p.relative_to(gates).as_posix() for p in gates.rglob("*.md") if p.is_file()) == [
        "kb__notes__retyped.md/prose/body-check.md"
    ]
    warns = run_cli("warn-queue", "--json").json()["warnings"]
    assert [(w["note_path"], w["gate_id"]) for w in warns] == [(note, "prose/body-check")]
    res = run_cli("ack", "--model", "fake", note, "prose/body-check", "type/definition")
    assert res.exit_code == 1
    assert res.stderr == (
        f"error: type/definition does not apply to {note}: the note's type is "
        "kb/types/note.md (this gate is the spec kb/types/definition.md); nothing acked\n"
    )


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("status", "--json"),
        ("jobs",),
        ("job", "1"),
        ("escalations",),
        ("warn-queue",),
        ("export",),
        ("report",),
        ("decide", "1", "approve"),
        ("ack", "--model", "fake", "kb/notes/alpha.md", "prose/body-check"),
    ],
)
def test_a_read_command_on_a_state_folder_never_used_says_so(flow, run_cli, args):
    """Read as empty, `--state /tmp/typo status` said no job was failed or waiting and no
    escalation open: all clear, over a state folder that was never the night's."""
    typo = flow.root / "typo"
    res = run_cli("--state", str(typo), *args)
    assert res.exit_code == 1 and res.stdout == ""
    assert res.stderr == (
        f"error: {typo}: no state.db here; nothing has run with this state folder yet "
        "(is --state or --root right?)\n"
    )
    assert not typo.exists()  # nor its logs/, nor a state.db a later status would read


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("report", "--since", "soon"), "--since 'soon': not a duration"),
        (("jobs", "--limit", "x"), "--limit: "),
        (("job", "abc"), "JOB_ID: "),
        (("status", "--bogus"), "no such option '--bogus'"),
        (("export", "--bogus"), "no such option '--bogus'"),
        # Options that cannot go together, which the commands checked in their bodies,
        # after the group's look at the state folder (E55).
        (("report", "--since", "1h", "--run", "1"), "--since and --run: choose one"),
        # (A redo without asks is bad usage only of a verdict: said once it is read.)
        (("decide", "1", "redo", "--feedback", " "), "--feedback is empty"),
        (("decide", "approve"), "name escalation ids, --note PATH or --gate GATE_ID"),
        (("decide", "--fixer", "x", "1", "approve"), "--fixer names the fixer of a redo"),
        (("decide", "0", "approve"), "ESCALATION_ID: "),
        # ... and after the settings were read (E56).
        (("select", "--all-gates", "prose"), "--all-gates selects every catalog gate"),
        (("finalize", "--review-job-id", "1", "--effort", "high"), "--effort needs --model"),
        (("logs", "--since", "2h", "--until", "3h"), "--until '3h': not after --since"),
        (("logs", "--until", "1h", "-f"), "--until '1h' and --follow"),
        # enqueue's and sweep's, which select "as select" does, were never checked (E57).
        (("enqueue", "--all-gates", "prose"), "--all-gates selects every catalog gate"),
        (("sweep", "--all-gates", "prose"), "--all-gates selects every catalog gate"),
    ],
)
@pytest.mark.parametrize("where", ["no state.db", "settings that do not parse"])
def test_a_bad_command_line_is_bad_usage_before_any_state_folder_is_looked_at(
    flow, run_cli, tmp_path, args, said, where
):
    """The group looked at the state folder before the command read its options: on a
    folder where nothing had run, `report --since soon` said "no state.db here" (exit 1),
    and only once that was mended said its --since was wrong. CONTRACT: bad usage is
    exit 2, said before the settings, the KB or the state folder are looked at."""
    typo = flow.root / "typo"
    settings = ()
    if where == "settings that do not parse":
        (tmp_path / "bad.toml").write_text("[queue\n")
        settings = ("--config", str(tmp_path / "bad.toml"))
    res = run_cli("--state", str(typo), *settings, *args)
    assert res.exit_code == 2, res.stderr
    assert said in _said_once(res.stderr, f"reviewq {args[0]}"), res.stderr
    assert "bad.toml" not in res.stderr, res.stderr
    assert not typo.exists()


def _commands() -> list[str]:
    """Every command of the group, as `reviewq --help` lists them: a new one is in the
    tests below by itself."""
    import click

    from orchestrator.cli import cli

    return cli.list_commands(click.Context(cli))


def _said_once(stderr: str, where: str) -> str:
    """The one line a bad command line gets: `error: reviewq CMD: …`, naming the
    command's help, no `Usage:` block and no traceback; its reason."""
    (line,) = stderr.splitlines()
    head, tail = f"error: {where}: ", f" (see {where} --help)"
    assert line.startswith(head) and line.endswith(tail), line
    return line[len(head) : -len(tail)]


@pytest.mark.parametrize("command", _commands())
def test_every_commands_bad_usage_is_one_line(flow, command):
    """click said an unknown option (and a missing argument, a bad choice, a bad number) in
    three lines, `Usage:`, `Try '… --help'`, `Error: …`, the reason last and the option
    named only there. The real console script, every command of the group."""
    res = reviewq_process("--root", str(flow.root), command, "--no-such-option", timeout=60)
    assert (res.returncode, res.stdout) == (2, ""), res.stderr
    said = _said_once(res.stderr, f"reviewq {command}")
    assert said == "no such option '--no-such-option'"


def _bad_values(command: str) -> list[tuple[tuple[str, ...], str]]:
    """Command lines of ``command`` each wrong in one parameter the command declares: a
    choice none of its choices, a number given a word, a required argument left out; with
    the option or argument the line must name."""
    import click

    from orchestrator.cli import cli

    cmd = cli.get_command(click.Context(cli), command)
    lines = []
    for p in cmd.params:
        numeric = p.type.name.startswith(("integer", "float", "number"))
        taken = isinstance(p.type, click.Choice) or numeric
        if isinstance(p, click.Option) and taken:
            lines.append(((max(p.opts, key=len), "x"), max(p.opts, key=len)))
    required = [p for p in cmd.params if isinstance(p, click.Argument) and p.required]
    if required:
        lines.append(((), required[0].human_readable_name))
    return lines


@pytest.mark.parametrize("command", _commands())
def test_every_commands_bad_values_are_one_line_naming_the_parameter(flow, run_cli, command):
    for args, named in _bad_values(command):
        res = run_cli(command, *args)
        assert (res.exit_code, res.stdout) == (2, ""), (args, res.stderr)
        said = _said_once(res.stderr, f"reviewq {command}")
        # click's ranges said "'x' is not a valid integer range": a range nobody typed;
        # its plain float type said "'x' is not a valid float" of `--budget-usd x`.
        assert named in said and "range" not in said and "float" not in said, said


@pytest.mark.parametrize("command", _commands())
def test_the_groups_options_after_a_command_say_where_they_go(flow, run_cli, command):
    """`reviewq status --state DIR` said "no such option '--state'" and sent the person to
    `reviewq status --help`, which lists none of the group's options: where they go was
    nowhere in the answer. Each of the group's options after each command that has no
    option of that name (`jobs --state` filters by a job's state)."""
    import click

    from orchestrator.cli import cli

    ctx = click.Context(cli)
    own = {o for p in cli.get_command(ctx, command).params for o in p.opts}
    for p in cli.params:
        name = max(p.opts, key=len)
        if not isinstance(p, click.Option) or name in own:
            continue
        res = run_cli(command, name, "somewhere")
        assert (res.exit_code, res.stdout) == (2, ""), res.stderr
        assert res.stderr == (
            f"error: reviewq {command}: no such option '{name}'; {name} is reviewq's own "
            f"option, given before the command: reviewq {name} … {command} (see reviewq --help)\n"
        )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--no-such-option", "status"), "no such option '--no-such-option'"),
        (("no-such-command",), "no such command 'no-such-command'"),
        (("--root",), "option '--root' requires an argument"),
        (("--root", "", "status"), "--root: empty"),
    ],
)
def test_the_groups_own_bad_usage_is_one_line(flow, args, said):
    res = reviewq_process(*args, cwd=flow.root, timeout=60)
    assert (res.returncode, res.stdout) == (2, ""), res.stderr
    assert _said_once(res.stderr, "reviewq") == said


def test_input_from_a_closed_stdin_is_one_line(flow):
    """`create-jobs --input -` started with stdin closed (cron's `<&-`, a service with no
    stdin) was "internal error: AttributeError: 'NoneType' object has no attribute
    'flush' (please report it)", exit 1: click's file type opened a stdin that is None."""
    res = reviewq_process(
        "--root", str(flow.root), "create-jobs", "--input", "-", "--grouping", "note",
        wrap=["sh", "-c", 'exec "$@" <&-', "sh"], timeout=60,
    )  # fmt: skip
    assert (res.returncode, res.stdout) == (2, ""), res.stderr
    assert _said_once(res.stderr, "reviewq create-jobs").startswith("--input: '-': stdin is closed")


def test_a_file_name_in_a_usage_line_is_shown_escaped(flow):
    """click's file type quotes the name as typed: a control character in it went raw to
    the terminal inside U81's line (a terminal escape; a bidi override, which click does
    not strip off a pipe, turned the rest of the line around), and a line break was read
    as a space, naming a file that is not there (`'/tmp/a b'`)."""
    for name, said in (("a\u202eb", "a\\u202eb"), ("a\nb", "a\\nb")):
        res = reviewq_process(
            "--root", str(flow.root), "create-jobs", "--input", str(flow.root / name),
            "--grouping", "note", timeout=60,
        )  # fmt: skip
        assert (res.returncode, res.stdout) == (2, ""), res.stderr
        line = _said_once(res.stderr, "reviewq create-jobs")
        assert line == f"--input: '{flow.root}/{said}': No such file or directory", line


@pytest.mark.parametrize("placeholder", ["…", " ... "])
def test_a_redo_with_the_placeholder_feedback_is_bad_usage(flow, placeholder):
    """An agent's failed-every-attempt line (E90) gives `reviewq decide 1 2 redo --feedback
    "…"` to run once it is repaired: pasted as it is, the fix jobs were queued with "…" as
    the person's concrete asks, kept verbatim in their prompts."""
    res = reviewq_process(
        "--root", str(flow.root), "decide", "1", "2", "redo", "--feedback", placeholder,
        timeout=60,
    )  # fmt: skip
    assert (res.returncode, res.stdout) == (2, ""), res.stderr
    assert _said_once(res.stderr, "reviewq decide") == (
        f"--feedback {placeholder.strip()!r} is the line's placeholder: write the concrete "
        "asks for the fixer in its place"
    )


def test_reviewq_alone_still_prints_its_help(flow):
    res = reviewq_process(cwd=flow.root, timeout=60)
    assert res.returncode == 2 and res.stderr.startswith("Usage: reviewq "), res.stderr


def test_a_named_pipe_given_to_input_is_opened_once(flow, tmp_path):
    """E53's first reading of the line opened `--input`'s file and closed it at once: a
    named pipe's writer that had written and closed by then took its text with it (the
    second open waited for a writer for good), and one that wrote later met no reader.
    A command with a file option is read once, as click reads it."""
    sel = reviewq_process("--root", str(flow.root), "select", "prose", "--model", "fake", "--json")
    assert sel.returncode == 0, sel.stderr
    fifo = tmp_path / "selection"
    os.mkfifo(fifo)

    def write() -> None:
        with contextlib.suppress(BrokenPipeError), open(fifo, "w") as f:
            f.write(sel.stdout)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        made = reviewq_process(
            "--root", str(flow.root), "create-jobs", "--input", str(fifo), "--grouping", "gate",
            "--json", timeout=30,
        )  # fmt: skip
    finally:
        with contextlib.suppress(OSError):  # a writer still waiting for a reader is let go
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(timeout=10)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["jobs"], made.stdout


def test_a_first_select_reads_no_history_and_makes_no_state_db(flow, run_cli):
    res = run_cli("select", "--all-gates", "--model", "fake", "--json")
    assert res.exit_code == 0, res.stderr
    assert res.json()["targets"] and not (flow.state / "state.db").exists()


def test_a_json_column_edited_by_hand_is_shown_as_it_stands(flow, run_cli):
    """`job N`, the report and the job's MANIFEST ended in "internal error" on a
    failure_reasons, telemetry_json or reasons that was not JSON, or a cost that was text."""
    jobs = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "note")
    job_id = jobs["jobs"][0]["review_job_id"]
    with Store.open(flow.state) as s:
        s.conn.execute(
            "UPDATE review_jobs SET status = 'failed', failure_reasons = '{bad', "
            "telemetry_json = '[oops' WHERE id = ?",
            (job_id,),
        )
        s.conn.execute(
            "INSERT INTO attempts (job_id, attempt, outcome, reasons, cost_usd) "
            "VALUES (?, 1, 'failed', '\"one reason\"', 'abc'), (?, 2, 'failed', '[1, null]', NULL)",
            (job_id, job_id),
        )
    res = run_cli("job", str(job_id))
    assert res.exit_code == 0, res.stderr
    assert "  attempt 2: failed, exit - turns - tokens -/- -\n    1\n    null\n" in res.stdout
    assert "  reason: (not JSON) {bad\n" in res.stdout
    assert "  attempt 1: failed, exit - turns - tokens -/- abc\n    one reason\n" in res.stdout
    data = run_cli("job", str(job_id), "--json").json()
    assert data["telemetry"] == "(not JSON) [oops" and data["attempts"][0]["reasons"] == [
        "one reason"
    ]
    res = run_cli("report", "--json")
    assert res.exit_code == 0, res.stderr
    failed = res.json()["needs_you"]["failed_jobs"]
    assert [(f["id"], f["reasons"]) for f in failed] == [(job_id, ["(not JSON) {bad"])]
    assert run_cli("status").exit_code == 0


def _queued_behind_a_pause(flow, run_cli) -> int:  # noqa: ANN001 - fixtures
    """A queued job of reviewer fake, in a launch failure's backoff, and fake paused for
    'auth' until 2999: the job's id."""
    jobs = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "note")
    job_id = jobs["jobs"][0]["review_job_id"]
    with Store.open(flow.state) as s:
        s.conn.execute(
            "UPDATE review_jobs SET reviewer = 'fake', not_before = '2999-01-01T00:00:00.000Z' "
            "WHERE id = ?",
            (job_id,),
        )
        s.conn.execute(
            "INSERT INTO reviewer_state (name, launch_failures, updated_at, paused_until, "
            "paused_reason) VALUES ('fake', 5, '2026-01-01T00:00:00.000Z', "
            "'2999-01-01T00:00:00.000Z', 'auth')"
        )
    return job_id


def test_status_says_which_waiting_jobs_a_control_alone_would_not_run(flow, run_cli):
    """With every queued job behind a paused reviewer, status said "control: not running;
    N job(s) wait for one (reviewq control)": a person who started it saw nothing run
    until the pause ended."""
    _queued_behind_a_pause(flow, run_cli)
    with Store.open(flow.state) as s:
        (queued,) = s.conn.execute(
            # a job create-jobs made (no reviewer) waits for a run by hand, not a control
            "SELECT count(*) FROM review_jobs WHERE status = 'queued' AND reviewer IS NOT NULL"
        ).fetchone()
        (held,) = s.conn.execute(
            "SELECT count(*) FROM review_jobs WHERE status = 'queued' AND reviewer = 'fake'"
        ).fetchone()
    res = run_cli("status")
    assert res.exit_code == 0, res.stderr
    assert (
        f"control: not running; {queued} job(s) wait for one (reviewq control), {held} of "
        "them for a paused reviewer too (above)\n"
    ) in res.stdout, res.stdout


def test_job_says_when_it_was_made_and_why_a_queued_job_waits(flow, run_cli):
    """A queued job behind a paused reviewer, a launch backoff or a spent budget looked
    like any other queued job: only the log said why nothing ran it, and `job N` showed
    no time at all."""
    job_id = _queued_behind_a_pause(flow, run_cli)
    with Store.open(flow.state) as s:
        created = s.conn.execute(
            "SELECT created_at FROM review_jobs WHERE id = ?", (job_id,)
        ).fetchone()[0]
    res = run_cli("job", str(job_id))
    assert res.exit_code == 0, res.stderr
    assert f"  created {created}\n" in res.stdout
    assert (
        "  waits: reviewer fake is paused until 2999-01-01T00:00:00Z (or until reviewq resume "
        "fake, once the cause is mended): auth\n" in res.stdout
    )
    assert "  waits: not before 2999-01-01T00:00:00.000Z (a launch failure's backoff)\n" in (
        res.stdout
    )
    data = run_cli("job", str(job_id), "--json").json()
    assert len(data["waits"]) == 2
    with Store.open(flow.state) as s:
        s.conn.execute("UPDATE review_jobs SET status = 'completed' WHERE id = ?", (job_id,))
    assert "waits" not in run_cli("job", str(job_id)).stdout


def test_two_notes_whose_paths_flatten_alike_keep_a_file_each(flow, run_cli):
    """'a/b.md' and 'a__b.md' both became 'a__b.md' in a job's results and in the export:
    the note written last was the only one left on disk."""
    flow.write("kb/notes/a/b.md", "---\ntitle: B under a\n---\nNested body.\n")
    flow.write("kb/notes/a__b.md", "---\ntitle: A and B\n---\nFlat body.\n")
    sel = select_json(run_cli, "prose", "--model", "fake", "--note", "kb/notes/a")
    sel2 = select_json(run_cli, "prose", "--model", "fake", "--note", "kb/notes/a__b.md")
    targets = json.loads(sel)["targets"] + json.loads(sel2)["targets"]
    data = json.dumps({"model_partition": "fake", "targets": targets})
    (job,) = create(run_cli, data, "--grouping", "gate")["jobs"]
    assert len(job["pairs"]) == 2
    write_output(flow, job)
    res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]))
    assert res.exit_code == 0, res.stderr
    results = sorted(
        (flow.state / "jobs" / f"review-job-{job['review_job_id']}" / "results").iterdir()
    )
    assert len(results) == 2
    assert {p.read_text().count("kb/notes/a/b.md") > 0 for p in results} == {True, False}
    assert run_cli("export").exit_code == 0
    gates = flow.root / "kb/reports/reviews/gates"
    exported = sorted(p for p in gates.rglob("*.md") if p.is_file())
    assert len(exported) == 2, [str(p.relative_to(flow.root)) for p in exported]


def test_a_note_path_that_would_end_the_comment_is_written_so_it_cannot(flow, run_cli):
    """A note named `a-->b.md` ended the GATE-REVIEW comment in the middle of its own
    header: the rest showed as text and a reader of the header stopped at the name."""
    flow.note("a-->b")
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    for job in run_cli("jobs", "--json").json()["jobs"]:
        assert run_cli("run-job", str(job["id"])).exit_code == 0
    assert run_cli("export").exit_code == 0
    folder = flow.root / "kb/reports/reviews/gates/kb__notes__a-->b.md"
    files = list(folder.rglob("*.md"))
    assert files
    for path in files:
        header, end, _ = path.read_text().partition("\n-->\n")
        assert end and "-->" not in header
        line = next(x for x in header.splitlines() if x.startswith("note-path: "))
        assert json.loads(line.removeprefix("note-path: ")) == "kb/notes/a-->b.md"


def test_jobs_says_how_many_it_left_out(flow, run_cli):
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    total = len(run_cli("jobs", "--json").json()["jobs"])
    assert total > 2
    res = run_cli("jobs", "--limit", "2")
    assert res.exit_code == 0
    assert res.stdout.splitlines()[-1] == f"… {total - 2} older job(s) not shown (--limit N)"
    assert "not shown" not in run_cli("jobs").stdout


def test_jobs_json_says_how_many_there_are_past_its_limit(flow, run_cli):
    """`jobs --json` stopped at --limit (200 by default) with no sign of the rest: a
    script counting a night's failed jobs read 200 of 3,500."""
    assert run_cli("enqueue", "--all-gates", "--reviewer", "offline").exit_code == 0
    total = len(run_cli("jobs", "--json", "--limit", "1000").json()["jobs"])
    assert total > 2
    cut = run_cli("jobs", "--json", "--limit", "2").json()
    assert (len(cut["jobs"]), cut["total"]) == (2, total)
    assert run_cli("jobs", "--json", "--state", "failed").json() == {"jobs": [], "total": 0}


def test_the_offline_reviewer_reads_each_note_from_its_own_section():
    """A note quoting a prompt's section heading with another note's name inside its own
    text: the offline reviewer took that quote for the other note, and PASSed an empty
    body it never read."""
    from orchestrator.review.prompts import PromptGate, PromptPair, render_review
    from workers.offline_agent import review_block

    gate = "kb/instructions/review-gates/prose/body-check.md"
    a = (
        "---\ntitle: A\n---\n# A\n\nHow reviewq prompts look:\n\n"
        "### Note `kb/notes/b.md`\n\n````markdown\n---\ntitle: B\n---\nA fine body.\n````\n"
    )
    b = "---\ntitle: B\n---\n"  # an empty body: the offline reviewer FAILs it
    pairs = [
        PromptPair("kb/notes/a.md", "prose/body-check", gate),
        PromptPair("kb/notes/b.md", "prose/body-check", gate),
    ]
    prompt = render_review(
        1,
        "out.md",
        pairs,
        {"kb/notes/a.md": a, "kb/notes/b.md": b},
        [PromptGate("prose/body-check", gate, "Body", "## Failure mode\n\nx\n\n## Test\n\ny\n")],
    )
    pair = {"note_path": "kb/notes/b.md", "gate_path": gate, "watches": ["body"]}
    assert "## Result: FAIL" in review_block(Path("/nonexistent"), pair, prompt)
    pair_a = {**pair, "note_path": "kb/notes/a.md"}
    assert "## Result: PASS" in review_block(Path("/nonexistent"), pair_a, prompt)


@pytest.mark.parametrize("option", ["--reviewer", "--fixer", "--auditor"])
def test_an_unknown_profile_names_the_option_that_named_it(flow, run_cli, option):
    """ "no reviewer profile 'nope'" did not say which of the three options was wrong."""
    args = ["enqueue", "--all-gates", "--fix", option, "nope"]
    res = run_cli(*args)
    assert res.exit_code == 1
    assert res.stderr.startswith(f"error: {option}: no reviewer profile 'nope' (known: "), (
        res.stderr
    )


# --- the morning commands on escalations -----------------------------------------------------


def escalate_alpha(flow, run_cli, selector: str = "prose") -> list[int]:
    """Three FAILs of alpha's ``selector`` pairs finalized by hand: their escalation ids."""
    for cycle in (1, 2, 3):
        flow.write(NOTE_A, flow.read(NOTE_A) + f"Edit {cycle}.\n")
        job = alpha_job(run_cli, selector)
        write_output(flow, job, decisions="FAIL")
        res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]))
        assert res.exit_code == 0, res.stderr
    return [e["id"] for e in run_cli("escalations", "--json").json()["escalations"]]


def test_a_persons_approval_names_the_commit_head_was_at_as_they_decided(flow, run_cli):
    """E85 by `decide approve`: a person's review of the note as it is, at the commit HEAD
    was at as it was read, a commit dated ahead or not."""
    first = reviewed_in_git(flow, run_cli)
    (esc,) = escalate_alpha(flow, run_cli)
    git_at(flow.root, "commit", "-qam", "alpha's edits", at="2027-11-01T00:00:00Z")
    ahead = git_at(flow.root, "rev-parse", "HEAD")
    assert run_cli("decide", str(esc), "approve").exit_code == 0
    got = recorded_commits(flow, run_cli)
    assert (got[ALPHA_BODY], got[f"{NOTE_B} prose/body-check"]) == (ahead, first)


def escalated_after_a_redo(flow, run_cli) -> tuple[int, int, str]:
    """Alpha escalated, sent back with a redo asking "Cite the source.", and escalated
    again: the first escalation, the second, and when the redo was decided."""
    (esc,) = escalate_alpha(flow, run_cli)
    res = run_cli("decide", str(esc), "redo", "--feedback", "Cite the source.", "--fixer", "fake")
    assert res.exit_code == 0, res.stderr
    (again,) = escalate_alpha(flow, run_cli)
    with Store.open(flow.state) as s:
        (at,) = s.conn.execute("SELECT decided_at FROM escalations WHERE id = ?", (esc,)).fetchone()
    return esc, again, at


def test_an_escalation_after_a_redo_says_so_in_the_terminal(flow, run_cli):
    """A pair the person had sent back with `redo` yesterday escalated again: `reviewq
    escalations` showed it as any new one, and only the page said what they had asked.
    Its lines name the last decision on the pair, when, and the asks."""
    esc, again, at = escalated_after_a_redo(flow, run_cli)
    lines = run_cli("escalations").stdout.splitlines()
    said = f"      after a redo of escalation {esc} at {at[:16]}Z, asking: Cite the source."
    assert lines[lines.index(next(x for x in lines if f"escalation {again}:" in x)) + 2] == said


def test_an_escalation_after_a_redo_says_so_in_its_report(flow, run_cli):
    """U56 said it in `escalations`; the report file it points to (and the page shows)
    listed the new cycles' fixes "changed nothing" with no word that they had carried
    the person's asks: read alone, a second redo with the same asks looked worth a try."""
    esc, again, at = escalated_after_a_redo(flow, run_cli)
    (row,) = [e for e in run_cli("escalations", "--json").json()["escalations"] if e["id"] == again]
    report = (flow.root / row["report_path"]).read_text().splitlines()
    said = f"After a redo of escalation {esc} at {at[:16]}Z, asking: Cite the source."
    assert report[report.index("Material:") - 2] == said, report


def test_a_redo_of_a_note_grown_past_the_size_limit_is_refused_not_a_whole_note_prompt(
    flow, run_cli
):
    """A note grown past [limits] max_note_bytes after its FAILs: `decide … redo` queued a
    fix whose prompt and message carried it whole (60 MB), where no review would."""
    (esc,) = escalate_alpha(flow, run_cli)
    flow.write("reviewq.toml", flow.read("reviewq.toml") + "[limits]\nmax_note_bytes = 2048\n")
    flow.write(NOTE_A, flow.read(NOTE_A) + "A pasted log line.\n" * 200)
    size = (flow.root / NOTE_A).stat().st_size
    res = run_cli("decide", str(esc), "redo", "--feedback", "Say more.", "--fixer", "fake")
    assert (res.exit_code, res.stderr) == (
        1,
        f"error: escalation {esc}: {NOTE_A}: {size} bytes, over [limits] max_note_bytes (2048); "
        "a fixer would get it whole: cut the note down (or raise the limit), or approve or "
        "reject\n",
    )
    with Store.open(flow.state) as s:
        assert (
            s.conn.execute("SELECT count(*) FROM review_jobs WHERE kind = 'fix'").fetchone()[0] == 0
        )


@pytest.mark.parametrize("how", ["git mv", "deleted"])
def test_a_redo_whose_note_moved_before_its_fix_is_escalated_again_with_the_asks(
    flow, run_cli, how
):
    """A person's redo, then the note moved (git mv) or deleted before its fix ran: the
    fix job read "completed", its asks went nowhere and only the log said why. Now its
    pairs are escalated again, quoting the asks and, for a move, where the same text is."""
    from .conftest import reviewq_process

    (esc,) = escalate_alpha(flow, run_cli)
    res = run_cli("decide", str(esc), "redo", "--feedback", "Cite the source.", "--fixer", "fake")
    assert res.exit_code == 0, res.stderr
    fix = next(j["id"] for j in run_cli("jobs", "--json").json()["jobs"] if j["kind"] == "fix")
    moved = "kb/notes/alpha-moved.md"
    if how == "git mv":
        for args in (["init", "-q"], ["add", "-A"], ["mv", NOTE_A, moved]):
            subprocess.run(["git", "-C", str(flow.root), *args], check=True)
    else:
        (flow.root / NOTE_A).unlink()
    ran = reviewq_process("--root", str(flow.root), "run-job", str(fix))
    assert ran.returncode == 0, ran.stderr
    (again,) = run_cli("escalations", "--json").json()["escalations"]
    where = f"moved to {moved}, the same text," if how == "git mv" else "moved or deleted"
    assert again["note_path"] == NOTE_A and again["reason"] == (
        f"your redo asks were not delivered (the note was {where} before fix job {fix} was "
        "applied): Cite the source."
    ), again
    shown = run_cli("escalations").stdout
    assert f"(fake, your redo asks were not delivered (the note was {where}" in shown, shown
    assert "only reject closes it" in shown
    assert "escalations open: 1" in run_cli("status").stdout
    assert run_cli("decide", str(again["id"]), "reject").exit_code == 0


def test_rewrite_files_writes_no_folder_for_a_persons_decision(flow, run_cli):
    """A person's approve is recorded as a job with no folder: `rewrite-files --all` wrote
    its MANIFEST.json, prompt.md and results/ into the state folder itself, each decision
    over the last one's."""
    (esc,) = escalate_alpha(flow, run_cli)
    assert run_cli("decide", str(esc), "approve").exit_code == 0
    res = run_cli("rewrite-files", "--all")
    assert res.exit_code == 0, res.stderr
    assert not {"MANIFEST.json", "prompt.md", "results"} & {p.name for p in flow.state.iterdir()}
    jobs = sorted(p.name for p in (flow.state / "jobs").iterdir())
    assert f"wrote the files of {len(jobs)} job(s) and 1 escalation report(s)" in res.stdout


def test_rewrite_files_that_cannot_write_a_folder_says_so_and_exits_1(flow, run_cli):
    """It said "wrote the files of 0 job(s)" and exited 0, the reason only in a JSON log
    line: the operator who asked for the files back was told all went well."""
    job = alpha_job(run_cli)
    manifest = flow.state / "jobs" / f"review-job-{job['review_job_id']}" / "MANIFEST.json"
    manifest.unlink()
    (manifest / "in-the-way").mkdir(parents=True)  # a folder where the file goes
    res = run_cli("rewrite-files")
    assert res.exit_code == 1, res.stdout
    assert "wrote the files of 0 job(s) and 0 escalation report(s)" in res.stdout
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"error: 1 job folder(s) or report(s) could not be written: review job {job['review_job_id']}: [Errno 21] Is a directory"
    ), res.stderr
    assert "rewrite-files again" in last


def test_rewrite_files_writes_an_ended_jobs_files_that_wait_to_be_written(flow, run_cli):
    """A job's files are written after its finalize commits, so those a write failed are
    mostly an ended job's. doctor said "reviewq rewrite-files writes them at once", and
    `rewrite-files` wrote queued and running jobs' only: "wrote the files of 0 job(s)",
    exit 0, and doctor's problem stayed (rewrite-files --all's own refusal sent a person
    to the same plain command)."""
    job = alpha_job(run_cli)
    jid = str(job["review_job_id"])
    write_output(flow, job, decisions="PASS")
    manifest = flow.state / "jobs" / f"review-job-{jid}" / "MANIFEST.json"
    manifest.unlink()
    (manifest / "in-the-way").mkdir(parents=True)  # a folder where the file goes
    run_cli("finalize", "--review-job-id", jid)
    said = run_cli("doctor").stdout
    assert "problem: 1 job(s) whose MANIFEST.json and results wait to be written" in said, said
    assert "reviewq rewrite-files writes them at once" in said, said
    shutil.rmtree(manifest)  # the cause mended
    res = run_cli("rewrite-files")
    assert (res.exit_code, res.stdout) == (
        0,
        "wrote the files of 1 job(s) and 0 escalation report(s)\n",
    ), res.stderr
    assert json.loads(manifest.read_text())["status"] == "completed"
    assert "wait to be written" not in run_cli("doctor").stdout


def test_job_files_rewrite_files_cannot_write_are_one_line_and_doctor_names_no_control(
    flow, run_cli
):
    """`rewrite-files` of jobs whose files it could not write printed a `job.files_failed`
    line on its stderr for each job (49 on a read-only jobs/) before its own one-line
    refusal, which says them all; and doctor said "the control process tries again at
    each tick" with no control process running, so nothing would."""
    sel = select_json(run_cli, "prose", "--model", "fake")
    jobs = create(run_cli, sel, "--grouping", "note")["jobs"]
    assert len(jobs) == 2, jobs
    for job in jobs:  # a folder where each job's MANIFEST.json goes
        manifest = flow.state / "jobs" / f"review-job-{job['review_job_id']}" / "MANIFEST.json"
        manifest.unlink()
        (manifest / "in-the-way").mkdir(parents=True)
    res = reviewq_process("--root", str(flow.root), "rewrite-files", "--all")
    assert res.returncode == 1, res.stderr
    [line] = res.stderr.splitlines()
    assert line.startswith("error: 2 job folder(s) or report(s) could not be written: "), line
    assert "job.files_failed" in (flow.state / "logs" / "reviewq.jsonl").read_text()
    said = run_cli("doctor").stdout
    assert (
        "wait to be written ([Errno 21] Is a directory: "
        f"'{flow.state / 'jobs' / 'review-job-1' / 'MANIFEST.json'}'); mend the cause; no "
        "control process runs for this state folder: reviewq rewrite-files writes them at once"
    ) in said, said


def test_a_jobs_folder_linked_to_a_disk_not_mounted_is_named_with_the_way_out(
    flow, run_cli, tmp_path
):
    """STATE/jobs a link to a folder on a disk that is not mounted (transcripts are big):
    every job's files failed with "[Errno 17] File exists: '.../jobs'", in the control's
    log, in rewrite-files and in doctor's "mend the cause", none saying it was a link to
    nothing, so the jobs stayed queued and undispatched for good."""
    job = alpha_job(run_cli)
    jobs = flow.state / "jobs"
    shutil.rmtree(jobs)
    jobs.symlink_to(tmp_path / "unmounted" / "jobs")
    said = (
        f"{jobs}: not a folder (a link to {tmp_path / 'unmounted' / 'jobs'}, which is not "
        "there); reviewq keeps its job folders in it: mount or make what it links to, or "
        "move it aside"
    )
    res = run_cli("rewrite-files")
    assert res.exit_code == 1, res.stdout
    assert f"review job {job['review_job_id']}: {said}" in res.stderr, res.stderr
    res = run_cli("doctor")
    assert f"wait to be written ({said})" in res.stdout, res.stdout
    assert not (tmp_path / "unmounted").exists()


def test_doctor_names_a_queued_jobs_missing_prompt_and_rewrite_files_brings_it_back(flow, run_cli):
    """A queued job's prompt.md (a rendering of state.db, OPERATIONS §6.4) deleted by hand:
    doctor, which names the renderings missing that a person still reads, said "ok" and
    nothing of it, as it looked at MANIFEST.json alone."""
    job = alpha_job(run_cli)
    prompt = flow.state / "jobs" / f"review-job-{job['review_job_id']}" / "prompt.md"
    text = prompt.read_bytes()
    prompt.unlink()
    res = run_cli("doctor")
    assert res.exit_code == 1, res.stdout
    assert (
        "problem: 1 queued or running job folder(s) and 0 open escalation report(s) are "
        "missing their files; reviewq rewrite-files writes them again from state.db\n"
    ) in res.stdout
    assert run_cli("rewrite-files").exit_code == 0
    assert prompt.read_bytes() == text
    assert "missing their files" not in run_cli("doctor").stdout


@pytest.mark.parametrize("how", ["--note", "ids"])
def test_a_refused_approve_of_a_gone_notes_escalations_names_the_call_that_closes_them(
    flow, run_cli, how
):
    """The refusal named `reviewq decide 1 reject`, the first escalation only: the person
    who ran it found the note's other escalations still open, and was refused again."""
    flow.gate("prose/second-check", ["body"])
    ids = escalate_alpha(flow, run_cli)
    assert len(ids) == 2
    (flow.root / NOTE_A).rename(flow.root / "kb/notes/alpha-renamed.md")
    chosen = ["--note", NOTE_A] if how == "--note" else [str(i) for i in ids]
    res = run_cli("decide", *chosen, "approve")
    assert res.exit_code == 1
    call = f"reviewq decide {' '.join(map(str, ids))} reject"
    assert res.stderr.strip().endswith(f"(to close them as they are: {call})"), res.stderr
    res = run_cli(*call.split()[1:])
    assert res.exit_code == 0, res.stderr
    assert run_cli("escalations", "--json").json()["escalations"] == []


def test_paths_in_job_and_report_json_are_relative_to_the_root(flow, run_cli):
    """CONTRACT §10: paths in JSON are relative to ROOT when they lie under it, as
    `escalations --json` gives report_path. `job --json` gave job_dir and `report --json`
    report_path relative to STATE: a script that opened them from ROOT found nothing."""
    (esc,) = escalate_alpha(flow, run_cli)
    job = run_cli("job", "1", "--json").json()
    assert job["job_dir"] == ".reviewq/jobs/review-job-1"
    assert (flow.root / job["job_dir"] / "MANIFEST.json").is_file()
    (listed,) = run_cli("escalations", "--json").json()["escalations"]
    assert listed["report_path"] == ".reviewq/escalations/escalation-1.md"
    rep = run_cli("report", "--json").json()
    (note,) = rep["needs_you"]["escalations"]
    assert [e["report_path"] for e in note["escalations"]] == [listed["report_path"]]


@pytest.mark.parametrize(
    "args, says",
    [
        (("1", "aprove"), "DECISION: 'aprove' is not approve, redo or reject"),
        (("approve",), "name escalation ids, --note PATH or --gate GATE_ID"),
        (("one", "approve"), "ESCALATION_ID: 'one' is not an escalation id"),
        (("--", "-1", "reject"), "'-1' is not an escalation id"),
        # As `job 0` and `logs --job 0`: bad usage, not a refusal ("no escalation 0").
        (("0", "approve"), "'0' is not an escalation id (a whole number, 1 or more)"),
        (("2", "x", "reject"), "'x' is not an escalation id (a whole number, 1 or more)"),
        (("1", "approve", "--fixer", "offline"), "--fixer names the fixer of a redo"),
        (("1", "redo"), "redo needs --feedback with the concrete asks for the fixer"),
        (("1", "redo", "--feedback", "  "), "--feedback is empty"),
    ],
)
def test_decide_called_wrongly_is_bad_usage(flow, run_cli, args, says):
    """Exit 2 is bad usage (CONTRACT §10), as `jobs --state bogus` or `job abc` answer: a
    mistyped decision exited 1, which a script reads as "refused" (decided already, a
    note gone), not as its own mistake."""
    escalate_alpha(flow, run_cli)
    res = run_cli("decide", *args)
    assert res.exit_code == 2, res.stderr
    assert says in _said_once(res.stderr, "reviewq decide")
    assert run_cli("escalations", "--json").json()["escalations"][0]["id"] == 1  # still open


def test_job_of_a_split_job_names_the_jobs_it_became(flow, run_cli):
    """A burned-out job is split into one-pair jobs: `job N` showed its pairs undecided
    and one burned-out attempt, and nothing said where its pairs went (only the log's
    job.split line did)."""
    from orchestrator.review.jobs import split_job

    job = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "gate")
    (made,) = job["jobs"]
    assert len(made["pairs"]) == 2
    with Store.open(flow.state) as s:
        parts = split_job(s, flow.state, flow.root, made["review_job_id"])
    res = run_cli("job", str(made["review_job_id"]))
    assert res.exit_code == 0, res.stderr
    assert f"  split into job(s) {parts[0]}, {parts[1]}\n" in res.stdout
    assert run_cli("job", str(made["review_job_id"]), "--json").json()["split_into"] == parts
    res = run_cli("job", str(parts[0]))
    assert f"  split from job {made['review_job_id']}\n" in res.stdout


def test_finalize_and_run_job_of_a_split_job_name_the_jobs_it_became(flow, run_cli):
    """A person with an output for a job the control had split was told "job 5 is split
    already; finalizing it again is refused" (nobody had finalized it), and run-job "only
    queued or running jobs run": neither said where its pairs went."""
    from orchestrator.review.jobs import split_job

    job = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "gate")
    (made,) = job["jobs"]
    job_id = made["review_job_id"]
    with Store.open(flow.state) as s:
        a, b = split_job(s, flow.state, flow.root, job_id)
    said = f"error: job {job_id} was split into job(s) {a}, {b}: finalize or run-job those\n"
    res = run_cli("finalize", "--review-job-id", str(job_id))
    assert (res.exit_code, res.stderr) == (1, said)
    res = run_cli("run-job", str(job_id), "--reviewer", "offline")
    assert (res.exit_code, res.stderr) == (1, said)


def test_job_json_of_a_persons_decision_names_no_folder(flow, run_cli):
    """A person's decision is a job with no folder (job_dir ''): made root-relative, it
    became the state folder itself, which a script pruning job folders would remove."""
    (esc,) = escalate_alpha(flow, run_cli)
    assert run_cli("decide", str(esc), "approve").exit_code == 0
    store = Store(flow.state / "state.db")
    (human,) = store.conn.execute("SELECT id FROM review_jobs WHERE grouping = 'human'").fetchone()
    store.close()
    assert run_cli("job", str(human), "--json").json()["job_dir"] == ""
    assert run_cli("job", "1", "--json").json()["job_dir"] == ".reviewq/jobs/review-job-1"


def test_a_type_spec_named_relative_to_its_notes_is_acked_warned_and_exported(flow, run_cli):
    """A type spec a note names as ``./types/x.md`` is not in kb/types/: select and
    create-jobs find it, and so must the commands that look its reviews up by gate id. They
    answered 'no such gate' (ack) and left its WARNs and GATE-REVIEW files out, without a
    word, though state.db holds them."""
    flow.write("kb/notes/types/claim.md", "---\nname: claim\n---\n# Claim\n\nA claim.\n")
    note = flow.note("gamma", body="# Gamma\n\nGamma body.\n", type="./types/claim.md")
    jobs = create(
        run_cli,
        select_json(run_cli, "type", "--model", "fake", "--note", note),
        "--grouping",
        "note",
    )["jobs"]
    assert [p["gate_id"] for j in jobs for p in j["pairs"]] == ["type/claim"]
    write_output(flow, jobs[0], decisions="WARN")
    res = run_cli("finalize", "--review-job-id", str(jobs[0]["review_job_id"]))
    assert res.exit_code == 0, res.stderr

    warns = run_cli("warn-queue", "--json").json()["warnings"]
    assert [(w["note_path"], w["gate_id"]) for w in warns] == [(note, "type/claim")]

    res = run_cli("export", "--model", "fake")
    assert res.exit_code == 0 and "exported 1 review(s)" in res.stdout, res.stdout
    exported = flow.root / "kb/reports/reviews/gates/kb__notes__gamma.md/type/claim.md"
    assert "## Result: WARN" in exported.read_text()

    flow.write(note, flow.read(note) + "\nOne more line.\n")
    res = run_cli("ack", "--model", "fake", note, "type/claim")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines() == [f"acked: {note} type/claim"]
    assert (
        "missing-review: 0, gate-changed: 0, note-changed: 0, fresh: 1"
        in run_cli("select", "type", "--model", "fake", "--note", note).stdout
    )

    # Its spec changed: gate-changed, as for a spec under kb/types/.
    flow.write("kb/notes/types/claim.md", "---\nname: claim\n---\n# Claim\n\nA sharper claim.\n")
    assert run_cli("warn-queue", "--json").json()["warnings"] == []


def test_a_name_too_long_for_the_file_system_is_one_error_line(flow, run_cli):
    """A path argument with a component over 255 bytes (or a long inline JSON with a typo,
    which --telemetry-json then looked up as a file) was 'internal error: OSError: [Errno
    36] File name too long ... (please report it)'."""
    long_name = "a" * 300
    job = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "gate")
    jid = str(job["jobs"][0]["review_job_id"])
    telemetry = '{"num_turns": 3, "note": "' + "x" * 300 + '",}'
    cases = [
        (("ack", "--model", "fake", f"kb/notes/{long_name}.md", "prose/body-check"), "File name too long"),
        (("select", "prose", "--note", f"kb/notes/{long_name}.md"), "File name too long"),
        (("finalize", "--review-job-id", jid, "--telemetry-json", telemetry), "line 1 column"),
        (("--state", long_name, "status"), "File name too long"),
    ]  # fmt: skip
    for args, said in cases:
        res = run_cli(*args)
        assert res.exit_code == 1, (args, res.stderr)
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: "), res.stderr
        assert "internal error" not in res.stderr and said in res.stderr, res.stderr
    res = run_cli("status", root=flow.root / long_name)
    assert res.exit_code == 1 and "internal error" not in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and "not a folder" in res.stderr
    with Store.open(flow.state) as s:  # the refused finalize left the job as it was
        assert (
            s.conn.execute("SELECT status FROM review_jobs WHERE id = ?", (jid,)).fetchone()[0]
            == "queued"
        )


def test_a_job_finalized_or_failed_by_hand_is_in_the_log(flow, run_cli):
    """finalize and run-job logged nothing of the job's end: `reviewq logs --job N` and the
    operator tailing the log saw job.created and then nothing, while state.db had the job
    completed (or failed) with its decisions."""
    from .test_queue_integration import log_lines

    jobs = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "gate")
    good = jobs["jobs"][0]
    write_output(flow, good, decisions="WARN")
    assert (
        run_cli(
            "finalize", "--review-job-id", str(good["review_job_id"]), "--runner", "me"
        ).exit_code
        == 0
    )
    again = create(
        run_cli, select_json(run_cli, "frontmatter", "--model", "fake"), "--grouping", "gate"
    )
    bad = again["jobs"][0]
    assert run_cli("finalize", "--review-job-id", str(bad["review_job_id"])).exit_code == 1
    ends = [
        (e["event"], e["job_id"])
        for e in log_lines(flow)
        if e["event"] in ("job.finalized", "job.failed")
    ]
    assert ends == [
        ("job.finalized", good["review_job_id"]),
        ("job.failed", bad["review_job_id"]),
    ]
    finalized = next(e for e in log_lines(flow) if e["event"] == "job.finalized")
    assert finalized["decisions"] == {"WARN": 2} and finalized["runner"] == "me"


def test_job_names_the_escalation_its_third_rejection_raised(flow, run_cli):
    escalate_alpha(flow, run_cli)
    last = max(j["id"] for j in run_cli("jobs", "--json").json()["jobs"])
    res = run_cli("job", str(last))
    assert (
        f"  escalated: {NOTE_A} prose/body-check (escalation 1, open; reviewq escalations)\n"
        in res.stdout
    ), res.stdout
    assert [e["id"] for e in run_cli("job", str(last), "--json").json()["escalations"]] == [1]
    assert "escalat" not in run_cli("job", "1").stdout  # the first FAIL raised none


def test_job_of_a_persons_decision_reads_as_one(flow, run_cli):
    """`job N` of a decide outcome read as a completed review by reviewer "-": nothing
    said a person decided it, nor on which escalation."""
    (esc,) = escalate_alpha(flow, run_cli)
    assert run_cli("decide", str(esc), "approve").exit_code == 0
    with Store.open(flow.state) as s:
        (human, at) = s.conn.execute(
            "SELECT id, created_at FROM review_jobs WHERE grouping = 'human'"
        ).fetchone()
    res = run_cli("job", str(human))
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines()[:3] == [
        f"job {human}: a person's decision: approve (escalation {esc}, fake)",
        f"  decided {at}",
        f"  PASS  {NOTE_A}  prose/body-check",
    ]
    assert "reviewer -" not in res.stdout and "attempt" not in res.stdout
    assert run_cli("job", str(human), "--json").json()["decides_escalation"] == esc
    assert run_cli("job", "1", "--json").json()["decides_escalation"] is None


def test_job_held_by_a_spent_budget_says_so_of_itself(flow, run_cli):
    """`job N` said "1 job(s) of sweep 'x' (run 1) wait: …" of the one job it shows: the
    sweep's count, in the words of the sweep's summary."""
    jobs = create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "note")
    job_id = jobs["jobs"][0]["review_job_id"]
    with Store.open(flow.state) as s:
        run = s.conn.execute(
            "INSERT INTO sweep_runs (name, trigger, options, budget_usd, started_at) "
            "VALUES ('adhoc', 'sweep', '{}', 0, '2026-01-01T00:00:00.000Z') RETURNING id"
        ).fetchone()[0]
        s.conn.execute("UPDATE review_jobs SET sweep_run_id = ? WHERE id = ?", (run, job_id))
    res = run_cli("job", str(job_id))
    assert res.exit_code == 0, res.stderr
    assert [x for x in res.stdout.splitlines() if "waits" in x] == [
        f"  waits: sweep 'adhoc' (run {run}) has spent its budget of $0; a run of that sweep "
        "with the same options takes this job over (with a new --budget-usd)"
    ], res.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("job", "abc"), "JOB_ID: 'abc' is not a job id (a whole number, 1 or more)"),
        (("job", "0"), "JOB_ID: '0' is not a job id (a whole number, 1 or more)"),
        (("job", "1e3"), "JOB_ID: '1e3' is not a job id (a whole number, 1 or more)"),
        (("job", str(2**63)), f"JOB_ID: '{2**63}' is too large for a job id"),
        (("logs", "--job", "x"), "--job: 'x' is not a job id (a whole number, 1 or more)"),
        (("run-job", "x"), "JOB_ID: 'x' is not a job id (a whole number, 1 or more)"),
        (("jobs", "--limit", "0"), "--limit: '0' is not a count (a whole number, 1 or more)"),
        (("report", "--run", "r"), "--run: 'r' is not a sweep run id (a whole number, 1 or more)"),
        (("export", "--wait", "nan"), "--wait: nan is not a number"),
        # Read as options, they were "No such option '-1'".
        (("job", "-1"), "JOB_ID: '-1' is not a job id (a whole number, 1 or more)"),
        (("run-job", "-3"), "JOB_ID: '-3' is not a job id (a whole number, 1 or more)"),
        (("decide", "2", "-1", "reject"), "ESCALATION_ID: '-1' is not an escalation id (a whole number, 1 or more)"),
    ],
)  # fmt: skip
def test_a_number_that_is_not_one_is_named_in_one_clear_line(flow, run_cli, args, said):
    """`job abc` said "'abc' is not a valid integer range": click's words for its type,
    not what the argument is."""
    create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "note")
    res = run_cli(*args)
    assert res.exit_code == 2
    assert _said_once(res.stderr, f"reviewq {args[0]}") == said


@pytest.mark.parametrize("control", [False, True])
def test_a_redo_with_no_control_running_says_its_fix_waits_for_one(flow, run_cli, control):
    """`decide … redo` said "fix job N queued" and nothing more with no control process
    for the state folder: the operator waited for a fix that nothing would run."""
    import fcntl

    (esc,) = escalate_alpha(flow, run_cli)
    fd = os.open(flow.state / "control.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if control:  # a control process holds the folder, as it does while it runs
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        res = run_cli("decide", str(esc), "redo", "--feedback", "Say more.", "--fixer", "fake")
    finally:
        os.close(fd)
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("redo: fix job "), res.stdout
    assert lines[1:] == (
        []
        if control
        else [
            "no control process runs for this state folder: the fix waits for one "
            "(reviewq control and a worker, or reviewq sweep, which also runs it)"
        ]
    )


def test_job_of_a_redo_fix_shows_the_persons_asks(flow, run_cli):
    """A redo's fix job read as any fix: the asks the person gave it (all the fixer was
    told beyond the findings) were in --json only."""
    (esc,) = escalate_alpha(flow, run_cli)
    res = run_cli(
        "decide", str(esc), "redo", "--feedback", "Say more.\nAnd cite it.", "--fixer", "fake"
    )
    assert res.exit_code == 0, res.stderr
    fix = int(res.stdout.split()[3])
    shown = run_cli("job", str(fix)).stdout
    assert "  asks (decide redo): Say more.\\nAnd cite it.\n" in shown, shown


def test_status_says_its_today_is_the_utc_day(flow, run_cli):
    """`cost: today $X` was the UTC day's, read at 7 a.m. by a person on local time (and
    cron times are local): from 16:00 yesterday in California. The line says which day."""
    create(run_cli, select_json(run_cli, "prose", "--model", "fake"), "--grouping", "note")
    res = run_cli("status")
    assert res.exit_code == 0, res.stderr
    assert "cost: today (UTC) $0.0000, total $0.0000\n" in res.stdout, res.stdout


def test_a_finalize_of_a_note_renamed_since_its_job_was_made_says_so(flow, run_cli):
    """The PASS was printed as any other: nothing said that it is recorded under a path
    where no note is now, and that the note under its new name is not reviewed by it."""
    job = alpha_job(run_cli)
    write_output(flow, job)
    (flow.root / NOTE_A).rename(flow.root / "kb/notes/alpha-renamed.md")
    res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]))
    assert res.exit_code == 0, res.stderr
    assert f"PASS  {NOTE_A}  prose/body-check" in res.stdout.splitlines()
    assert res.stderr.splitlines() == [
        f"warning: {NOTE_A} is no longer there (renamed or deleted since job "
        f"{job['review_job_id']} was made): its verdict is recorded under that path, for no "
        "note of the KB; a note renamed is missing-review at its new path"
    ]


@pytest.mark.parametrize(
    "linked", ["note", "folder"], ids=["the note made a link", "its folder made a link"]
)
def test_a_finalize_of_a_note_made_a_symlink_out_of_the_kb_says_so(flow, run_cli, tmp_path, linked):
    """A note replaced by a symlink to a file outside the KB between the job's making and
    its finalize was said "no longer there (renamed or deleted …)": the person looked for
    a rename, where the note is there, a link that select leaves out (stop 46). Its
    folder made the link, the note is no link: said so (C41)."""
    job = alpha_job(run_cli)
    write_output(flow, job)
    note = flow.root / NOTE_A
    link = note if linked == "note" else note.parent
    outside = tmp_path / "elsewhere" / (note.name if linked == "note" else "")
    if linked == "note":
        outside.parent.mkdir()
        outside.write_bytes(note.read_bytes())
        note.unlink()
    else:
        shutil.move(note.parent, outside)
    link.symlink_to(outside)
    res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]))
    assert res.exit_code == 0, res.stderr
    how = (
        "has become a symlink out of the KB"
        if linked == "note"
        else "now leads out of the KB through a folder made a symlink"
    )
    assert res.stderr.splitlines() == [
        f"warning: {NOTE_A} {how} since job "
        f"{job['review_job_id']} was made: its verdict is recorded under that path, for no "
        "note of the KB; no sweep reviews a note outside the KB"
    ]


def test_a_finalize_of_a_note_edited_since_its_job_was_made_says_so(flow, run_cli):
    """A person who edits a note while its review runs by hand read "PASS kb/notes/…"
    as a verdict on the text in front of them: it is one on the text the job read, and
    `select` lists the pair again. run-job says it too."""
    job = alpha_job(run_cli)
    write_output(flow, job)
    note = flow.root / NOTE_A
    note.write_text(note.read_text() + "\nA line the person added.\n")
    res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]))
    assert res.exit_code == 0, res.stderr
    assert f"PASS  {NOTE_A}  prose/body-check" in res.stdout.splitlines()
    assert res.stderr.splitlines() == [
        f"warning: {NOTE_A} changed since job {job['review_job_id']} read it: its verdict is "
        "of the text the job read, not of the note as it is now (`reviewq select` lists "
        "the pair again where a gate watches what changed)"
    ]
    again = json.loads(select_json(run_cli, "prose", "--model", "fake", "--note", NOTE_A))
    assert [(t["note_path"], t["reason"]) for t in again["targets"]] == [
        (NOTE_A, "note-changed")
    ], again


def test_a_finalize_of_a_note_grown_over_the_limit_says_no_sweep_reviews_it(flow, run_cli):
    """A note grown past [limits] max_note_bytes since its job was made was read whole to
    be hashed (a 512 MiB one: 0.56 GB held by finalize), and said as one `select` lists
    again, where no sweep reviews it now."""
    flow.write("reviewq.toml", flow.read("reviewq.toml") + "\n[limits]\nmax_note_bytes = 2048\n")
    job = alpha_job(run_cli)
    write_output(flow, job)
    note = flow.root / NOTE_A
    note.write_text(note.read_text() + "x" * 4096 + "\n")
    size = note.stat().st_size
    res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]))
    assert res.exit_code == 0, res.stderr
    assert res.stderr.splitlines() == [
        f"warning: {NOTE_A} changed since job {job['review_job_id']} read it: its verdict is "
        "of the text the job read, not of the note as it is now (it is now "
        f"{size} bytes, over [limits] max_note_bytes (2048), and no sweep reviews it)"
    ]


@pytest.mark.parametrize(
    "saved",
    [
        lambda data: b"\xef\xbb\xbf" + data,  # an editor's save with a byte-order mark
        lambda data: data.replace(b"title: Alpha", b"title: 'Alpha'"),  # the YAML re-quoted
    ],
    ids=["bom", "requoted"],
)
def test_a_finalize_of_a_note_saved_alike_since_its_job_was_made_says_nothing(flow, run_cli, saved):
    """E65 compared bytes: a note saved again with a byte-order mark, or its frontmatter
    re-quoted, was "changed since job N read it: its verdict is of the text the job read,
    not of the note as it is now", of a note that reads as it did (select finds the pair
    fresh)."""
    job = alpha_job(run_cli)
    write_output(flow, job)
    note = flow.root / NOTE_A
    note.write_bytes(saved(note.read_bytes()))
    res = run_cli("finalize", "--review-job-id", str(job["review_job_id"]))
    assert res.exit_code == 0, res.stderr
    assert res.stderr == ""
    again = json.loads(select_json(run_cli, "prose", "--model", "fake", "--note", NOTE_A))
    assert again["targets"] == [], again


def test_a_redo_approved_since_and_then_deleted_is_not_escalated_again(flow, run_cli):
    """A redo, then the pair failed three times more by hand and a person approved it,
    then the note was deleted before the fix ran: the fix read "decided" (the approve
    stands) yet its pairs were escalated again as undelivered asks, a new escalation on
    the pair the person had just approved."""
    from .conftest import reviewq_process

    (esc,) = escalate_alpha(flow, run_cli)
    res = run_cli("decide", str(esc), "redo", "--feedback", "Cite the source.", "--fixer", "fake")
    assert res.exit_code == 0, res.stderr
    fix = next(j["id"] for j in run_cli("jobs", "--json").json()["jobs"] if j["kind"] == "fix")
    (again,) = escalate_alpha(flow, run_cli)
    assert run_cli("decide", str(again), "approve").exit_code == 0
    (flow.root / NOTE_A).unlink()
    ran = reviewq_process("--root", str(flow.root), "run-job", str(fix))
    assert ran.returncode == 0, ran.stderr
    assert run_cli("escalations", "--json").json()["escalations"] == [], ran.stdout


def test_a_symlinked_note_kept_elsewhere_is_acked_and_selected_under_its_own_name(flow, run_cli):
    """A note that is a link to a file kept elsewhere in the root is reviewed under the
    link's name; `ack` and `--note` resolved the link, and looked its pairs up under the
    file's name, which none has: "no completed review", "not under the note roots"."""
    flow.write("shared/borrowed.md", "---\ntitle: Borrowed\n---\nBorrowed body.\n")
    link = "kb/notes/borrowed.md"
    (flow.root / link).symlink_to("../../shared/borrowed.md")
    flow.accept("fake", [(link, "prose/body-check")], decision="WARN")
    with (flow.root / "shared/borrowed.md").open("a") as f:
        f.write("A line the gate should not mind.\n")
    res = run_cli("select", "prose", "--model", "fake", "--note", link, "--json")
    assert res.exit_code == 0, res.stderr
    assert [(t["note_path"], t["reason"]) for t in res.json()["targets"]] == [
        (link, "note-changed")
    ]
    res = run_cli("ack", "--model", "fake", str(flow.root / link), "prose/body-check")
    assert (res.exit_code, res.stdout) == (0, f"acked: {link} prose/body-check\n"), res.stderr
    res = run_cli("select", "prose", "--model", "fake", "--note", link, "--json")
    assert res.json()["targets"] == []


def test_a_second_link_to_a_note_kept_elsewhere_names_the_first_one(flow, run_cli):
    """Two links to one file kept elsewhere: the scan reviews it under the first name and
    skips the second. `--note` of the second (or of a link to it) kept that name, and
    selected the text again under a name of its own: reviewed, and fixed, twice."""
    flow.write("shared/borrowed.md", "---\ntitle: Borrowed\n---\nBorrowed body.\n")
    first, second, chained = "kb/notes/a.md", "kb/notes/b.md", "kb/notes/c.md"
    (flow.root / first).symlink_to("../../shared/borrowed.md")
    (flow.root / second).symlink_to("../../shared/borrowed.md")
    (flow.root / chained).symlink_to("b.md")
    flow.accept("fake", [(first, "prose/body-check")], decision="WARN")
    with (flow.root / "shared/borrowed.md").open("a") as f:
        f.write("A line the gate should not mind.\n")
    for name in (second, chained):
        res = run_cli("select", "prose", "--model", "fake", "--note", name, "--json")
        assert res.exit_code == 0, res.stderr
        assert [(t["note_path"], t["reason"]) for t in res.json()["targets"]] == [
            (first, "note-changed")
        ]
    res = run_cli("ack", "--model", "fake", second, "prose/body-check")
    assert (res.exit_code, res.stdout) == (0, f"acked: {first} prose/body-check\n"), res.stderr


def test_a_note_named_decomposed_is_found_by_its_name_typed_composed(flow, run_cli):
    """A KB synced from a Mac keeps its names decomposed (NFD); a name typed is composed
    (NFC): `ack` and `--note` of `café.md` said "No such file or directory" beside the
    `café.md` that ls shows."""
    on_disk = "kb/notes/" + unicodedata.normalize("NFD", "café.md")
    typed = "kb/notes/" + unicodedata.normalize("NFC", "café.md")
    flow.write(on_disk, "---\ntitle: Café\n---\nBody.\n")
    flow.accept("fake", [(on_disk, "prose/body-check")])
    flow.write(on_disk, "---\ntitle: Café\n---\nBody, mended.\n")
    res = run_cli("select", "prose", "--model", "fake", "--note", typed, "--json")
    assert res.exit_code == 0, res.stderr
    assert [t["note_path"] for t in res.json()["targets"]] == [on_disk]
    res = run_cli("ack", "--model", "fake", typed, "prose/body-check")
    assert (res.exit_code, res.stdout) == (0, f"acked: {on_disk} prose/body-check\n"), res.stderr


def test_a_gate_made_invalid_is_said_by_ack_and_warn_queue_not_taken_for_none(flow, run_cli):
    """A gate file broken while a person edits it: `ack` said "no such gate" of a file
    that is there, and `warn-queue` dropped its WARN findings without a word (CONTRACT §10: a
    file skipped is a warning line)."""
    flow.accept("fake", [(NOTE_A, "prose/body-check")], decision="WARN")
    gate = "kb/instructions/review-gates/prose/body-check.md"
    flow.write(gate, flow.read(gate).replace("name: Body Check\n", ""))
    res = run_cli("ack", "--model", "fake", NOTE_A, "prose/body-check")
    assert (res.exit_code, res.stderr) == (
        1,
        f"error: prose/body-check: its gate file is invalid ({gate}: missing name); "
        "nothing acked\n",
    )
    res = run_cli("warn-queue")
    assert (res.exit_code, res.stdout) == (0, "0 warning(s)\n")
    assert res.stderr == f"warning: {gate}: missing name\n"
    res = run_cli("ack", "--model", "fake", NOTE_A, "prose/no-such")
    assert res.stderr == "error: prose/no-such: no such gate; nothing acked\n"


def test_ack_in_a_partition_with_no_review_at_all_says_so(flow, run_cli):
    """`ack --model claud` (a typo) said "no completed review in partition claud", as of
    a pair never reviewed; select warns of such a partition, naming those there are."""
    flow.accept("fake", [(NOTE_A, "prose/body-check")])
    res = run_cli("ack", "--model", "claud", NOTE_A, "prose/body-check")
    assert res.stderr == (
        f"error: {NOTE_A} prose/body-check: no completed review in partition claud (it holds "
        "no review at all; known: fake); nothing acked\n"
    )
    res = run_cli("ack", "--model", "fake", NOTE_B, "prose/body-check")
    assert res.stderr == (
        f"error: {NOTE_B} prose/body-check: no completed review in partition fake; nothing acked\n"
    )


@pytest.mark.parametrize(
    "given",
    ["prose/body-check", "kb/instructions/review-gates/prose/body-check.md", "kb/notes/alpha"],
)
def test_ack_of_what_is_no_note_says_so(flow, run_cli, given):
    """A gate's path, or the gate id first (the arguments swapped), was told "no completed
    review" or "No such file or directory"."""
    Store.open(flow.state).close()
    res = run_cli("ack", "--model", "fake", given, NOTE_A)
    assert (res.exit_code, res.stderr) == (
        1,
        f"error: {given}: not a note (a .md file under the note roots: kb/notes); the note "
        "comes first: reviewq ack --model P NOTE GATE_ID...\n",
    )


def test_an_ack_is_a_line_of_the_log(flow, run_cli):
    """An ack changes the acceptance by a person's hand, as a decision does, and the log
    had no word of it: why a pair the night would have reviewed was fresh was nowhere."""
    flow.accept("fake", [(NOTE_A, "prose/body-check")], decision="WARN")
    flow.write(NOTE_A, flow.read(NOTE_A) + "A typo fixed.\n")
    assert run_cli("ack", "--model", "fake", NOTE_A, "prose/body-check").exit_code == 0
    res = run_cli("logs", "--event", "acceptance.acked", "--json")
    (line,) = [json.loads(x) for x in res.stdout.splitlines()]
    assert {k: line[k] for k in ("note_path", "gate_id", "model_partition", "decision")} == {
        "note_path": NOTE_A,
        "gate_id": "prose/body-check",
        "model_partition": "fake",
        "decision": "WARN",
    }


def test_an_export_with_a_gate_made_invalid_names_its_file(flow, run_cli):
    """A gate file broken while a person edits it (a region misspelt in `watches`): the
    export removed every GATE-REVIEW file of the gate and its rows of the index with exit 0
    and not a word, where `warn-queue` names the file (found on a real KB: 329 files gone)."""
    flow.accept("fake", [(NOTE_A, "prose/body-check")], decision="WARN")
    exported = flow.root / "kb/reports/reviews/gates/kb__notes__alpha.md/prose/body-check.md"
    assert run_cli("export").exit_code == 0
    assert exported.is_file()
    gate = "kb/instructions/review-gates/prose/body-check.md"
    flow.write(gate, flow.read(gate).replace("watches:\n- body\n", "watches:\n- bodyy\n"))
    res = run_cli("export")
    assert res.exit_code == 0
    assert res.stderr == (
        f"warning: {gate}: watches ['bodyy']: regions are title, description, frontmatter, body\n"
    )
    assert not exported.exists()


def test_export_and_warn_queue_refuse_notes_select_cannot_read(flow, run_cli, tmp_path):
    """ROOT's `kb/` a link to a folder outside it: `select` refuses its note root, but
    `export` read it as a KB of no notes, removed every GATE-REVIEW file and wrote an empty
    index ("exported 0 review(s)", exit 0), and `warn-queue` said "0 warning(s)"."""
    flow.accept("fake", [(NOTE_A, "prose/body-check")], decision="WARN")
    assert run_cli("export").exit_code == 0
    elsewhere = tmp_path / "elsewhere"
    (flow.root / "kb").rename(elsewhere)
    (flow.root / "kb").symlink_to(elsewhere)
    refused = f"error: note root kb/notes: outside the KB root {flow.root}\n"
    for command in ("export", "warn-queue"):
        res = run_cli(command)
        assert (res.exit_code, res.stdout, res.stderr) == (1, "", refused), command
    exported = elsewhere / "reports/reviews"
    assert (exported / "gates/kb__notes__alpha.md/prose/body-check.md").is_file()
    assert len((exported / "csv/gate_reviews.csv").read_text().splitlines()) == 2


def test_an_earlier_exports_file_that_cannot_be_removed_is_said_as_such(flow, tmp_path):
    """A folder of an earlier export the person made read-only: the export said "cannot
    write the export at …/x.md" of the file it was removing, and the person looked for why
    a review of this export could not be written (found on a real KB, stop 46)."""
    from .conftest import bound_by_file_modes, reviewq_process

    flow.accept("fake", [(NOTE_A, "prose/body-check")])
    lens = flow.root / "kb/reports/reviews/gates/kb__notes__gone.md/prose"
    lens.mkdir(parents=True)
    (lens / "body-check.md").write_text("<!-- GATE-REVIEW\nnote-path: kb/notes/gone.md\n-->\n")
    lens.chmod(0o555)
    try:
        res = reviewq_process("--root", str(flow.root), "export", wrap=bound_by_file_modes())
    finally:
        lens.chmod(0o755)
    assert (res.returncode, res.stderr) == (
        1,
        f"error: cannot remove {lens}/body-check.md, left by an earlier export: Permission "
        "denied (this export's files and index are written)\n",
    )
    index = flow.root / "kb/reports/reviews/csv/gate_reviews.csv"
    assert NOTE_A in index.read_text()


def test_warn_queue_shows_a_warn_of_the_gate_as_it_is_beside_a_later_one_of_its_old_text(
    flow, run_cli
):
    """Partition `b` WARNed of the gate as it is; partition `a`'s later WARN was of its old
    text (a job made before the edit, finished after it). The latest WARN was skipped as
    gate-changed and took `b`'s with it: no finding listed for a pair one stands for."""
    gate = "kb/instructions/review-gates/prose/body-check.md"
    old = flow.read(gate)
    flow.write(gate, old.replace("Check it.", "Check it twice."))
    flow.accept("b", [(NOTE_A, "prose/body-check")], decision="WARN")
    now = flow.read(gate)
    flow.write(gate, old)
    flow.accept("a", [(NOTE_A, "prose/body-check")], decision="WARN")
    flow.write(gate, now)
    res = run_cli("warn-queue", "--json")
    assert res.exit_code == 0, res.stderr
    assert [(w["note_path"], w["model_partition"]) for w in res.json()["warnings"]] == [
        (NOTE_A, "b")
    ]


def test_ack_of_a_pair_its_review_answered_error_says_so(flow, run_cli):
    """A pair whose one review answered ERROR: `ack` said "no completed review", and
    `reviewq jobs` lists that job as completed (a real KB's reviewer that could not judge)."""
    job = flow.accept("fake", [(NOTE_A, "prose/body-check")], decision="ERROR")
    res = run_cli("ack", "--model", "fake", NOTE_A, "prose/body-check")
    assert (res.exit_code, res.stderr) == (
        1,
        f"error: {NOTE_A} prose/body-check: no completed review in partition fake (job {job} "
        "answered ERROR, which is never accepted nor carried forward); nothing acked\n",
    )
    assert acceptance_rows(flow) == []


@pytest.mark.parametrize("bundle", ["prose", "type"])
def test_ack_of_a_bundle_says_it_takes_gate_ids(flow, run_cli, bundle):
    """`ack NOTE prose` after a trivial edit (the bundle `select` and `enqueue` take) was
    "prose: no such gate" of a lens `reviewq gates` lists."""
    flow.accept("fake", [(NOTE_A, "prose/body-check")])
    res = run_cli("ack", "--model", "fake", NOTE_A, bundle)
    assert (res.exit_code, res.stderr) == (
        1,
        f"error: {bundle}: a bundle, not a gate id: ack names each gate ({bundle}/NAME, as "
        "`reviewq gates` lists them); nothing acked\n",
    )
