#!/usr/bin/env python3
"""A scripted test agent, driven by environment variables.

FAKE_MODE:   good (default) | bad | nothing | crash | hang | touch | slow | fix | multi-nothing
FAKE_DECISIONS: comma-separated decisions for the pairs in order (default: PASS for all);
             a single value applies to every pair
FAKE_TURNS:  write this num_turns (and a cost) to REVIEWQ_TELEMETRY_PATH
FAKE_SLEEP:  seconds to sleep before acting (slow mode: a random time up to this)
FAKE_PIDFILE: hang mode writes "leader child" pids here so tests can check both died
FAKE_PIDS_DIR: hang mode makes a file named for each of its pids here (the leader's,
             the child's): tests/conftest.py fails a test that leaves one running
FAKE_FIX_APPEND: fix mode appends this line to the note it was given
FAKE_LOG:    append one line per run ("task job attempt") to this file
FAKE_PASS_IF_CONTAINS: review PASS when the note (as the prompt carries it) holds this
             text, FAIL otherwise
FAKE_PAD_BYTES: pad the review output to about this many bytes
FAKE_FAIL_GATES: comma-separated gate ids a review FAILs; it PASSes the others
FAKE_QUOTE:  the name of a variable whose value every review's findings quote
FAKE_AUDIT_DECISION: what an audit (REVIEWQ_TASK=audit) decides for every pair
FAKE_CONTINUE_FIFO: after FAKE_NOTIFY_FIFO, wait until the test writes to this FIFO
A fix task (REVIEWQ_TASK=fix) rewrites the note from the prompt, adding FAKE_FIX_APPEND.
FAKE_MODE_<n>: the mode for attempt n only
FAKE_GIT:    after the mode's edit, run git with these (space-separated) arguments in the
             KB root: an agent that commits its edit, or checks out another branch
FAKE_SIGINT_EXIT: on SIGINT, exit with this status at once, writing nothing (Claude Code exits 0)
FAKE_NOTIFY_FIFO: if this FIFO exists, write "pid ppid attempt" to it on start (blocks
             until the test reads it: the test's way to await "the agent is running")
It reads the job's pairs from MANIFEST.json, as the offline reviewer does.
"""

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from workers.offline_agent import note_from_prompt

env = os.environ


def record(pid: int) -> None:
    """Name ``pid`` in FAKE_PIDS_DIR, for the check that it ends with its test."""
    if env.get("FAKE_PIDS_DIR"):
        with contextlib.suppress(OSError):  # a folder out of reach: unchecked, not failed
            Path(env["FAKE_PIDS_DIR"], str(pid)).touch()


# FAKE_MODE_<n> overrides FAKE_MODE for attempt n (e.g. hang on the first, then behave).
mode = env.get(f"FAKE_MODE_{env.get('REVIEWQ_ATTEMPT', '')}") or env.get("FAKE_MODE", "good")
if env.get("REVIEWQ_TASK") == "fix" and mode in ("good", "slow"):
    mode = "fix"
if env.get("FAKE_SIGINT_EXIT"):  # set before the test is told this agent runs
    signal.signal(signal.SIGINT, lambda *_: os._exit(int(env["FAKE_SIGINT_EXIT"])))
if env.get("FAKE_NOTIFY_FIFO") and os.path.exists(env["FAKE_NOTIFY_FIFO"]):
    # Tell the test this attempt is running: "<agent pid> <parent (worker) pid> <attempt>".
    with open(env["FAKE_NOTIFY_FIFO"], "w") as fifo:
        fifo.write(f"{os.getpid()} {os.getppid()} {env.get('REVIEWQ_ATTEMPT')}\n")
out = Path(env["REVIEWQ_OUTPUT_PATH"])
root = Path(env["REVIEWQ_ROOT"])
if env.get("FAKE_LOG"):
    with open(env["FAKE_LOG"], "a") as f:
        f.write(
            f"{env.get('REVIEWQ_TASK')} {env.get('REVIEWQ_JOB_ID')} {env.get('REVIEWQ_ATTEMPT')}\n"
        )
if env.get("FAKE_TURNS"):
    Path(env["REVIEWQ_TELEMETRY_PATH"]).write_text(
        json.dumps(
            {
                "num_turns": int(env["FAKE_TURNS"]),
                "input_tokens": 1000,
                "output_tokens": 200,
                "cost_usd": 0.01,
            }
        )
    )
if mode == "slow":
    time.sleep(random.random() * float(env.get("FAKE_SLEEP", "0.2")))
elif env.get("FAKE_SLEEP"):
    time.sleep(float(env["FAKE_SLEEP"]))

if mode == "crash":
    print("fake agent: crashing on purpose", file=sys.stderr)
    sys.exit(3)
if mode == "nothing":
    sys.exit(0)
if mode == "hang":
    record(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    record(child.pid)
    if env.get("FAKE_PIDFILE"):
        Path(env["FAKE_PIDFILE"]).write_text(f"{os.getpid()} {child.pid}")
    time.sleep(3600)
if env.get("FAKE_CONTINUE_FIFO"):
    with open(env["FAKE_CONTINUE_FIFO"]) as fifo:  # wait until the test says go
        fifo.read()
if mode == "fix":
    note = root / env["REVIEWQ_NOTE_PATH"]
    # The fixer works from the text in its prompt, as a real agent would.
    prompt = Path(env["REVIEWQ_PROMPT_PATH"]).read_text()
    text = prompt.rsplit("## The note as it is now", 1)[1].split("\n", 2)[2]  # the last section
    fence = text.split("\n", 1)[0].rstrip("markdown")
    text = text.split("\n", 1)[1].rsplit(fence, 1)[0]
    if env.get("FAKE_FIX_APPEND"):
        text = text.rstrip("\n") + "\n" + env["FAKE_FIX_APPEND"] + "\n"
    out.write_text(text)
    sys.exit(0)

pairs = json.loads((Path(env["REVIEWQ_JOB_DIR"]) / "MANIFEST.json").read_text())["pairs"]
if mode == "multi-nothing" and len(pairs) > 1:
    sys.exit(0)  # gives up on jobs of several pairs, reviews one-pair jobs
if mode == "touch":
    note = root / pairs[0]["note_path"]
    note.write_text(note.read_text() + "\nedited by the reviewer\n")
if env.get("FAKE_GIT"):
    subprocess.run(["git", *env["FAKE_GIT"].split()], cwd=root, check=True, capture_output=True)
decisions = env.get("FAKE_DECISIONS", "PASS").split(",")
marker = env.get("FAKE_PASS_IF_CONTAINS")
blocks = []
for i, p in enumerate(pairs):
    d = decisions[i] if len(decisions) > 1 else decisions[0]
    if marker is not None:
        # The note as the prompt carries it, as a real agent reads it (a worker may have no KB).
        given = env.get("REVIEWQ_PROMPT_PATH")  # a person running it by hand may not say
        text = note_from_prompt(Path(given).read_text(), p["note_path"]) if given else None
        if text is None:
            text = (root / p["note_path"]).read_text()
        d = "PASS" if marker in text else "FAIL"
    if env.get("FAKE_FAIL_GATES") is not None:
        d = "FAIL" if p["gate_id"] in env["FAKE_FAIL_GATES"].split(",") else "PASS"
    if env.get("REVIEWQ_TASK") == "audit" and env.get("FAKE_AUDIT_DECISION"):
        d = env["FAKE_AUDIT_DECISION"]
    s = f"{p['note_path']} :: {p['gate_path']}"
    body = f"Summary: fake review {i}.\nFindings:\n- low: finding {i} for {p['gate_id']}\n"
    if env.get("FAKE_QUOTE"):
        body += f"- low: my {env['FAKE_QUOTE']} is {env.get(env['FAKE_QUOTE'])}\n"
    if mode == "bad" and i == 0:
        blocks.append(
            f"=== PAIR REVIEW START: {s} ===\n{body}Verdict: {d}\n=== PAIR REVIEW END: {s} ===\n"
        )
    else:
        blocks.append(
            f"=== PAIR REVIEW START: {s} ===\n{body}## Result: {d}\n=== PAIR REVIEW END: {s} ===\n"
        )
text = "Preamble text is ignored.\n\n" + "\n".join(blocks)
if env.get("FAKE_PAD_BYTES"):  # an output of about this size: the preamble grows
    pad = int(env["FAKE_PAD_BYTES"]) - len(text.encode())
    text = "Preamble " + "p" * max(0, pad - 10) + "\n" + text
out.write_text(text)
