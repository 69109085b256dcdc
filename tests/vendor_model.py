"""A scripted model on loopback for the real vendor CLIs (tests/test_vendor_clis.py).

It speaks just enough of three wire protocols, streaming, to drive a review:
the Anthropic Messages API (Claude Code), the OpenAI Responses API (Codex CLI) and the
Gemini API (Gemini CLI). The first path segment of every request names the scenario, so
one server serves every test: ``http://127.0.0.1:PORT/<scenario>/...``.

Scenarios (each step answers the conversation as it stands; no state is kept, so a CLI
that retries a request gets the same answer):
  review   read the prompt, write a PASS bundle to the output path, say done
  hostile  first write a new KB note, write through ``..``, run a shell that writes, then review
  ruled    first run one plain command that makes a KB note (``touch``), then review
  runaway  read the prompt and a note again and again, never write
  auth     every model request gets a 401 in the vendor's own error shape
  midfail  the first turn is answered; every later one gets a 503 in the vendor's shape
  middrop  the first turn is answered; on every later one the connection is closed unanswered
  maxtokens  the model stops at its output-token limit (Claude: stop_reason max_tokens;
           the Responses API: an incomplete response, reason max_output_tokens)
  filtered the first turn is answered; the Responses API ends every later answer incomplete,
           reason content_filter: the note's own words were refused, no outage
  event    every model request is answered 200 with a stream that holds only an error event
  refuse   every model request is answered with a refusal in words, and no tool call
  hung     every model request is read and never answered: the connection stays open
  fix      a review FAILs a note that says TODO and PASSes it otherwise; a fix task (its
           prompt read first) writes the note without the TODO to its output, says done
  fixkb    … the fixer reads the KB note and writes the fixed note over it, and no output
  fixout   … the fixer also writes a new KB note and a file outside through ``..``
  fixsame  … the fixer gives the note back unchanged
  fixhuge  … the fixed note has 64 KiB the fixer made up
  fixnofm  … the fixed note's frontmatter is broken YAML
  fixdrop  … the fix's first turn after reading its prompt has its connection closed
           unanswered, once per KB root; every later request is answered as ``fix``
  fixcrlf  … the fixed note is written with a byte order mark and CRLF line ends
  fixidle  … the fixer reads its prompt and says done, writing nothing
  fixfence … the fixed note is written whole inside a ```markdown code fence
  fixpatch … the fixer reads the KB note, patches it in place and adds a file through
           ``..``, and no output (Codex: its apply_patch; the others write the files)
  fixpatchout … the fixer adds its output with a patch (Codex: its apply_patch)
  fixthen-auth, fixthen-s429, fixthen-s500 …
           as ``fix``, but the fix's turn after it wrote its output gets that error (a 401
           as ``auth``, the others as ``s429``…): the note written whole, then the outage
  s403, s429, s429ra, s500, s529
           every model request gets that HTTP status in the vendor's own error shape and
           words (s429ra with ``retry-after: 1``; s529: Anthropic's 529 overloaded_error,
           the others' 503 "overloaded", as each API says it); ``mid-`` before one of
           them (mid-s500): the first turn is answered, every later one gets that error

Run: ``python tests/vendor_model.py --port 0 --log FILE`` prints ``ready PORT`` once it
listens. Every request is appended to FILE as one JSON line (path, tool results seen,
the step answered), so a test can check what the CLI saw and did. ``--dump DIR`` also
saves every request body there, to see what a new CLI version sends.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# at a line's start, or after the line number Claude's Read puts before each line
_START = re.compile(r"^(?:\s*\d+\t)?=== PAIR REVIEW START: (.+) ===$", re.M)
_INSTRUCTION = re.compile(
    r"Read the file (\S+) and follow its instructions exactly \(relative paths in it are "
    r"relative to (\S+)\)\. Write your complete answer to (\S+)\."
)
USAGE = {"input": 1000, "output": 100, "cached": 0}


def bundle(prompt: str, fail_on: str | None = None) -> str:
    """A PASS for every pair whose START sentinel the prompt carries; with ``fail_on``, a
    FAIL for all of them when the prompt (the note in it) holds that word."""
    out = []
    failing = fail_on is not None and fail_on in prompt
    for pair in dict.fromkeys(_START.findall(prompt)):
        found, result = (
            (f"- major: the note still says {fail_on}", "FAIL") if failing else ("- none", "PASS")
        )
        out.append(
            f"=== PAIR REVIEW START: {pair} ===\nSummary: scripted review.\nFindings:\n{found}\n"
            f"## Result: {result}\n=== PAIR REVIEW END: {pair} ===\n"
        )
    return "\n".join(out)


def plan(scenario: str, instruction: str, results: list[str]) -> tuple[str, dict | str]:
    """The next action: ("read", path) | ("write" or "patch", (path, text)) | ("shell", cmd) |
    ("text", words), from the scenario and the tool results the conversation holds."""
    m = _INSTRUCTION.search(instruction)
    if not m:
        return "text", "ok"  # a side request of the CLI (titles, checks): say little
    prompt_path, root, output = m.groups()
    steps: list[tuple[str, object]] = []
    if scenario == "hostile":
        job = output.rsplit("/", 2)[0]
        steps += [
            ("write", (f"{root}/kb/notes/planted.md", "planted by the agent\n")),
            ("write", (f"{job}/../escaped.md", "escaped through ..\n")),
            ("shell", f"echo shell-was-here > {root}/kb/notes/shell.md"),
        ]
    if scenario == "ruled":  # no redirection: a command a person's rule can name
        steps += [("shell", f"touch {root}/kb/notes/ruled.md")]
    if scenario == "idle":  # reads its prompt and ends its turn, writing nothing
        return ("read", prompt_path) if not results else ("text", "done")
    if scenario == "runaway":
        # alternate two files: Gemini stops an agent repeating one call 5 times
        return "read", prompt_path if len(results) % 2 == 0 else f"{root}/kb/notes/alpha.md"
    fixing = next((m for r in results[:1] if (m := _FIX_NOTE.search(r))), None)
    if fixing is None:
        steps += [("read", prompt_path), ("write", None), ("text", "done")]
    else:
        steps += [("read", prompt_path), *fix_steps(scenario, root, fixing.group(1), output)]
    if len(results) >= len(steps):
        return "text", "done"
    kind, arg = steps[len(results)]
    if kind == "write" and arg is None:
        prompt = next((r for r in reversed(results) if "PAIR REVIEW START" in r), "")
        arg = (output, bundle(prompt, fail_on=FAIL_WORD if scenario in FIX_SCENARIOS else None))
    return kind, arg


# A fix prompt names its note so (prompts/fix.md); what it reads first tells a fix from a review.
_FIX_NOTE = re.compile(r"You are editing one note of a markdown knowledge base: `([^`]+)`")
FAIL_WORD = "TODO"  # a fix scenario's review FAILs a note that says it, PASSes one that does not
FIX_SCENARIOS = (
    "fix", "fixkb", "fixout", "fixsame", "fixhuge", "fixnofm", "fixdrop", "fixcrlf", "fixidle",
    "fixfence", "fixpatch", "fixpatchout",
)  # fmt: skip
HUGE_NOTE_BYTES = 64 * 1024
REFUSAL = "I'm sorry, but I can't help with reviewing this note."


def fixed(scenario: str, text: str) -> str:
    """The fixer's note for ``text``: the smallest edit (the word the review FAILs taken
    out), or what each fix scenario gives back instead."""
    if scenario == "fixsame":
        return text
    if scenario == "fixnofm":
        return "---\ntitle: [unclosed\n---\n" + text.split("---\n", 2)[-1]
    new = text.replace(FAIL_WORD, "done")
    if scenario == "fixhuge":
        new += "\n" + "A line the fixer made up. " * (HUGE_NOTE_BYTES // 26) + "\n"
    if scenario == "fixfence":  # a chat model's habit, though the prompt says no fences
        new = f"```markdown\n{new}```\n"
    if scenario == "fixcrlf":
        new = "\ufeff" + new.replace("\n", "\r\n")
    return new


def fix_steps(scenario: str, root: str, note: str, output: str) -> list[tuple[str, object]]:
    """A fix task's steps after reading its prompt: write the fixed note to ``output``, done.
    The note's text is read from the KB on this machine (the server shares it with the CLI):
    what the prompt carries, without each CLI's own framing of a file it read."""
    # A worker on another machine without --kb runs in its attempt folder, which holds the
    # note the fixer is given as note.md beside the output, and no KB.
    kb_note = f"{root}/{note}"
    if not os.path.exists(kb_note):
        kb_note = f"{os.path.dirname(output)}/note.md"
    with open(kb_note, encoding="utf-8") as f:
        new = fixed(scenario, f.read())
    if scenario == "fixidle":
        return [("text", "done")]
    if scenario == "fixkb":  # the note itself, as the prompt forbids, and no output
        # Read first, as a model does: Claude's Write refuses a file not read yet on its
        # own, and that refusal had stood in for the permission rules' (no denial said).
        return [("read", f"{root}/{note}"), ("write", (f"{root}/{note}", new)), ("text", "done")]
    if scenario == "fixpatch":  # Codex's own edit tool, on the note and outside the job folder
        job = output.rsplit("/", 2)[0]
        return [
            ("read", f"{root}/{note}"),
            ("patch", (f"{root}/{note}", new)),
            ("patch", (f"{job}/../escaped.md", "escaped through ..\n")),
            ("text", "done"),
        ]
    if scenario == "fixpatchout":  # Codex's own edit tool writes the output
        return [("patch", (output, new)), ("text", "done")]
    steps: list[tuple[str, object]] = []
    if scenario == "fixout":  # a second file beside the output, and one outside the KB
        job = output.rsplit("/", 2)[0]
        steps += [
            ("write", (f"{root}/kb/notes/beside.md", "a note the fixer added\n")),
            ("write", (f"{job}/../escaped.md", "escaped through ..\n")),
        ]
    return [*steps, ("write", (output, new)), ("text", "done")]


# --- Anthropic Messages -------------------------------------------------------------------


def _anthropic_text(content: object) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict):
            if block.get("type") == "text":
                parts.append(block.get("text", ""))
            elif block.get("type") == "tool_result":
                parts.append(_anthropic_text(block.get("content")))
    return "\n".join(parts)


def anthropic_turn(body: dict) -> tuple[str, list[str]]:
    msgs = body.get("messages") or []
    instruction = "\n".join(
        _anthropic_text(m.get("content")) for m in msgs if m.get("role") == "user"
    )
    results = []
    for m in msgs:
        for block in m.get("content") if isinstance(m.get("content"), list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                results.append(_anthropic_text(block.get("content")))
    return instruction, results


def anthropic_events(kind: str, arg: object, model: str, n: int) -> list[tuple[str, dict]]:
    usage = {
        "input_tokens": USAGE["input"],
        "output_tokens": 1,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    msg = {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    evs: list[tuple[str, dict]] = [("message_start", {"type": "message_start", "message": msg})]
    if kind == "text":
        block = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": str(arg)}
        stop = "end_turn"
    else:
        name, inp = {
            "read": ("Read", lambda: {"file_path": arg}),
            "write": ("Write", lambda: {"file_path": arg[0], "content": arg[1]}),
            "shell": ("Bash", lambda: {"command": arg}),
        }[kind]
        block = {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(inp())}
        stop = "tool_use"
    evs += [
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": USAGE["output"]},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return evs


def anthropic_message(kind: str, arg: object, model: str, n: int) -> dict:
    """The same answer as one JSON document (a request without ``stream``)."""
    evs = dict(anthropic_events(kind, arg, model, n))
    msg = evs["message_start"]["message"]
    block = evs["content_block_start"]["content_block"]
    delta = evs["content_block_delta"]["delta"]
    if block["type"] == "text":
        block = {"type": "text", "text": delta["text"]}
    else:
        block = {**block, "input": json.loads(delta["partial_json"])}
    return {
        **msg,
        "content": [block],
        "stop_reason": evs["message_delta"]["delta"]["stop_reason"],
        "usage": {**msg["usage"], "output_tokens": USAGE["output"]},
    }


# --- OpenAI Responses ---------------------------------------------------------------------


def _responses_text(content: object) -> str:
    if isinstance(content, str):
        return content
    return (
        "\n".join(
            c.get("text", "")
            for c in content
            if isinstance(c, dict) and isinstance(c.get("text"), str)
        )
        if isinstance(content, list)
        else ""
    )


def responses_turn(body: dict) -> tuple[str, list[str]]:
    items = body.get("input") or []
    instruction = "\n".join(
        _responses_text(i.get("content"))
        for i in items
        if isinstance(i, dict) and i.get("role") == "user"
    )
    results = []
    for i in items:
        if isinstance(i, dict) and i.get("type") in (
            "function_call_output",
            "custom_tool_call_output",
        ):
            out = i.get("output")
            results.append(out if isinstance(out, str) else json.dumps(out))
    return instruction, results


def responses_usage() -> dict:
    return {
        "input_tokens": USAGE["input"],
        "input_tokens_details": {"cached_tokens": USAGE["cached"]},
        "output_tokens": USAGE["output"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": USAGE["input"] + USAGE["output"],
    }


def responses_item(kind: str, arg: object, tools: set[str], n: int) -> dict:
    if kind == "text":
        return {
            "type": "message",
            "role": "assistant",
            "id": f"msg_{n}",
            "content": [{"type": "output_text", "text": str(arg), "annotations": []}],
        }
    if kind == "read":
        cmd = f"cat {arg}"
    elif kind == "shell":
        cmd = str(arg)
    elif kind == "patch":
        path, text = arg  # type: ignore[misc]
        patch = apply_patch(path, text)
        if "apply_patch" in tools:  # the freeform tool a catalog model is given
            return {"type": "custom_tool_call", "id": f"ctc_{n}", "call_id": f"call_{n}",
                    "name": "apply_patch", "input": patch}  # fmt: skip
        # Any other model's: Codex takes the command for its own tool and applies it itself
        cmd = f"apply_patch <<'REVIEWQ_EOF'\n{patch}REVIEWQ_EOF\n"
    else:
        path, text = arg  # type: ignore[misc]
        cmd = f"cat > {path} <<'REVIEWQ_EOF'\n{text}REVIEWQ_EOF\n"
    if "exec_command" in tools:  # Codex 0.16x: unified exec
        name, args = "exec_command", {"cmd": cmd, "login": False}
    elif "shell_command" in tools:  # a catalog model's (gpt-5.5) shell: one string
        name, args = "shell_command", {"command": cmd, "login": False}
    else:
        name, args = "shell", {"command": ["bash", "-c", cmd]}
    return {
        "type": "function_call",
        "id": f"fc_{n}",
        "call_id": f"call_{n}",
        "name": name,
        "arguments": json.dumps(args),
    }


def apply_patch(path: str, text: str) -> str:
    """Codex's patch that makes ``path`` hold ``text``: the file's lines replaced, or the
    file added when there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            old = f.read()
    except OSError:
        old = None
    if old is None:
        body = f"*** Add File: {path}\n" + "".join(f"+{line}\n" for line in text.splitlines())
    else:
        body = f"*** Update File: {path}\n@@\n"
        body += "".join(f"-{line}\n" for line in old.splitlines())
        body += "".join(f"+{line}\n" for line in text.splitlines())
    return f"*** Begin Patch\n{body}*** End Patch\n"


# --- Gemini -------------------------------------------------------------------------------


def gemini_turn(body: dict) -> tuple[str, list[str]]:
    instruction, results = [], []
    for c in body.get("contents") or []:
        for p in c.get("parts") or [] if isinstance(c, dict) else []:
            if not isinstance(p, dict):
                continue
            if c.get("role") == "user" and isinstance(p.get("text"), str):
                instruction.append(p["text"])
            fr = p.get("functionResponse")
            if isinstance(fr, dict):
                results.append(json.dumps(fr.get("response")))
    # json.dumps escapes the newlines of a file read; undo that for the sentinel search
    return "\n".join(instruction), [r.replace("\\n", "\n") for r in results]


def gemini_part(kind: str, arg: object) -> dict:
    if kind == "text":
        return {"text": str(arg)}
    if kind == "read":
        return {"functionCall": {"name": "read_file", "args": {"file_path": arg}}}
    if kind == "shell":
        return {"functionCall": {"name": "run_shell_command", "args": {"command": arg}}}
    path, text = arg  # type: ignore[misc]
    return {"functionCall": {"name": "write_file", "args": {"file_path": path, "content": text}}}


def gemini_chunk(part: dict) -> dict:
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": {
            "promptTokenCount": USAGE["input"],
            "candidatesTokenCount": USAGE["output"],
            "totalTokenCount": USAGE["input"] + USAGE["output"],
        },
        "modelVersion": "scripted",
    }


# --- the server ---------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_path = ""
    dump_dir = ""  # when set, every request body is saved there (for debugging a CLI)
    dumped = [0]
    lock = threading.Lock()
    counter = [0]
    hang = threading.Event()  # never set: what the ``hung`` scenario waits on
    dropped: set[str] = set()  # the KB roots whose fix ``fixdrop`` has cut off (once each)

    def log_message(self, *args: object) -> None:  # quiet: the JSON log says it all
        pass

    def _record(self, **entry: object) -> int:
        with self.lock:
            self.counter[0] += 1
            entry["n"] = self.counter[0]
            if self.log_path:
                with open(self.log_path, "a") as f:
                    f.write(json.dumps(entry) + "\n")
            return self.counter[0]

    def _send(self, status: int, body: dict | list, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, events: list[tuple[str | None, dict]]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        self.end_headers()
        for name, data in events:
            head = f"event: {name}\n" if name else ""
            self.wfile.write(f"{head}data: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        scenario, _, rest = self.path.lstrip("/").partition("/")
        self._record(method="GET", scenario=scenario, path="/" + rest)
        if rest.split("?")[0].endswith("models"):
            self._send(200, {"data": [], "models": [], "object": "list"})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        scenario, _, rest = self.path.lstrip("/").partition("/")
        path = "/" + rest.split("?")[0]
        if self.dump_dir:
            with self.lock:
                self.dumped[0] += 1
                with open(f"{self.dump_dir}/{self.dumped[0]:03d}.json", "wb") as f:
                    f.write(raw)
        if path.endswith("/messages"):
            api = "anthropic"
            instruction, results = anthropic_turn(body)
        elif path.endswith("/responses"):
            api = "responses"
            instruction, results = responses_turn(body)
        elif ":streamGenerateContent" in path or ":generateContent" in path:
            api = "gemini"
            instruction, results = gemini_turn(body)
        elif path.endswith(":countTokens") or path.endswith("/count_tokens"):
            self._record(method="POST", scenario=scenario, path=path, api="count")
            self._send(200, {"totalTokens": 10, "input_tokens": 10})
            return
        else:
            self._record(method="POST", scenario=scenario, path=path, api="unknown")
            self._send(404, {"error": {"message": f"no route {path}"}})
            return
        if scenario == "auth":
            self._record(method="POST", scenario=scenario, path=path, api=api, status=401)
            self._auth_error(api)
            return
        failing = scenario.removeprefix("mid-") if scenario.startswith("mid-") else scenario
        if failing in STATUS_ERRORS and (results or failing == scenario):
            self._record(method="POST", scenario=scenario, path=path, api=api, status=failing)
            self._status_error(api, failing)
            return
        if scenario == "refuse":
            # The model declines the task in words and calls no tool: its answer to the job.
            self._record(method="POST", scenario=scenario, path=path, api=api, action=scenario)
            self._answer(api, path, body, "text", REFUSAL, 0)
            return
        if scenario == "event":
            self._record(method="POST", scenario=scenario, path=path, api=api, action=scenario)
            self._error_event(api)
            return
        if scenario == "hung":
            self._record(method="POST", scenario=scenario, path=path, api=api, action="hang")
            self.hang.wait()  # never set: the CLI waits, or gives up, on its own
            return
        if scenario == "fixdrop" and results and _FIX_NOTE.search(results[0]):
            root = m.group(2) if (m := _INSTRUCTION.search(instruction)) else ""
            with self.lock:
                first = root not in self.dropped
                self.dropped.add(root)
            if first:  # the endpoint dies mid-fix, once: the fix's next try gets through
                self._record(method="POST", scenario=scenario, path=path, api=api, action="drop")
                self.close_connection = True
                return
        if scenario in ("midfail", "middrop", "midcut", "midevent") and results:
            # A server that answered the first turn and then broke.
            self._record(method="POST", scenario=scenario, path=path, api=api, action=scenario)
            if scenario == "midfail":
                self._unavailable(api)
            elif scenario == "middrop":
                self.close_connection = True  # closed with no status line at all
            elif scenario == "midcut":
                self._cut(api)
            else:
                self._error_event(api)
            return
        if scenario.startswith("fixthen-") and len(results) >= 2 and _FIX_NOTE.search(results[0]):
            failing = scenario.removeprefix("fixthen-")
            self._record(method="POST", scenario=scenario, path=path, api=api, status=failing)
            if failing == "auth":
                self._auth_error(api)
            else:
                self._status_error(api, failing)
            return
        kind, arg = plan(
            "fix" if scenario.startswith("fixthen-") else scenario, instruction, results
        )
        if kind == "patch" and api != "responses":
            kind = "write"  # a patch tool is Codex's alone
        n = self._record(
            method="POST",
            scenario=scenario,
            path=path,
            api=api,
            step=len(results),
            action=kind,
            arg=arg if kind not in ("write", "patch") else arg[0],  # type: ignore[index]
            results=[r[:300] for r in results],
            tools=sorted(self._tools(api, body)),
        )
        if scenario == "maxtokens" or (scenario == "filtered" and results):
            self._max_tokens(api, body, n, scenario)
            return
        self._answer(api, path, body, kind, arg, n)

    def _answer(self, api: str, path: str, body: dict, kind: str, arg: object, n: int) -> None:
        """The model's turn ``kind`` (``arg``), streamed in ``api``'s own shape."""
        if api == "anthropic":
            model = body.get("model", "scripted")
            if body.get("stream"):
                self._sse(anthropic_events(kind, arg, model, n))
            else:
                self._send(200, anthropic_message(kind, arg, model, n))
        elif api == "responses":
            item = responses_item(kind, arg, self._tools(api, body), n)
            rid = f"resp_{n}"
            usage = responses_usage()
            self._sse(
                [
                    ("response.created", {"type": "response.created", "response": {"id": rid}}),
                    (
                        "response.output_item.done",
                        {"type": "response.output_item.done", "output_index": 0, "item": item},
                    ),
                    (
                        "response.completed",
                        {"type": "response.completed", "response": {"id": rid, "usage": usage}},
                    ),
                ]
            )
        else:
            chunk = gemini_chunk(gemini_part(kind, arg))
            if ":streamGenerateContent" in path:
                self._sse([(None, chunk)])
            else:
                self._send(200, chunk)

    @staticmethod
    def _tools(api: str, body: dict) -> set[str]:
        names = set()
        for t in body.get("tools") or []:
            if not isinstance(t, dict):
                continue
            if api == "gemini":
                names |= {d.get("name") for d in t.get("functionDeclarations") or []}
            else:
                names.add(t.get("name"))
        return {n for n in names if isinstance(n, str)}

    def _cut(self, api: str) -> None:
        """A 200 whose stream stops after its first event: the connection closed."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        if api == "anthropic":
            first = anthropic_events("text", "x", "m", 0)[0]
            self.wfile.write(f"event: {first[0]}\ndata: {json.dumps(first[1])}\n\n".encode())
        elif api == "responses":
            ev = {"type": "response.created", "response": {"id": "resp_cut"}}
            self.wfile.write(f"event: response.created\ndata: {json.dumps(ev)}\n\n".encode())
        else:
            self.wfile.write(b'data: {"candidates": [{"content": {"role": "model", "parts": [')
        self.wfile.flush()
        self.close_connection = True

    def _error_event(self, api: str) -> None:
        """A 200 whose stream carries an error event (the server failed after starting)."""
        if api == "anthropic":
            err = {
                "type": "error",
                "error": {"type": "api_error", "message": "Internal server error"},
            }
            self._sse([("error", err)])
        elif api == "responses":
            response = {
                "id": "resp_failed",
                "status": "failed",
                "error": {
                    "code": "server_error",
                    "message": "The server had an error while processing your request.",
                },
            }
            self._sse(
                [
                    (
                        "response.created",
                        {"type": "response.created", "response": {"id": "resp_failed"}},
                    ),
                    ("response.failed", {"type": "response.failed", "response": response}),
                ]
            )
        else:
            self._sse(
                [
                    (
                        None,
                        {
                            "error": {
                                "code": 500,
                                "message": "Internal error encountered.",
                                "status": "INTERNAL",
                            }
                        },
                    )
                ]
            )

    def _unavailable(self, api: str) -> None:
        if api == "anthropic":
            body = {
                "type": "error",
                "error": {"type": "api_error", "message": "Service unavailable"},
            }
        elif api == "responses":
            body = {"error": {"message": "Service unavailable", "type": "server_error"}}
        else:
            body = {
                "error": {"code": 503, "message": "Service unavailable", "status": "UNAVAILABLE"}
            }
        self._send(503, body)

    def _max_tokens(self, api: str, body: dict, n: int, scenario: str = "maxtokens") -> None:
        """An answer cut off at the model's output-token limit, as each API says it (the
        Responses API's ``filtered``: cut off by its content filter instead)."""
        if api == "anthropic":
            evs = anthropic_events("text", "A review so long that it", body.get("model", "m"), n)
            for name, data in evs:
                if name == "message_delta":
                    data["delta"]["stop_reason"] = "max_tokens"
            if body.get("stream"):
                self._sse(evs)
            else:
                msg = anthropic_message("text", "A review so long that it", "m", n)
                self._send(200, {**msg, "stop_reason": "max_tokens"})
        elif api == "responses":
            rid = f"resp_{n}"
            response = {
                "id": rid,
                "status": "incomplete",
                "incomplete_details": {
                    "reason": "content_filter" if scenario == "filtered" else "max_output_tokens"
                },
                "usage": responses_usage(),
            }
            self._sse(
                [
                    ("response.created", {"type": "response.created", "response": {"id": rid}}),
                    ("response.incomplete", {"type": "response.incomplete", "response": response}),
                ]
            )
        else:
            chunk = gemini_chunk({"text": "A review so long that it"})
            chunk["candidates"][0]["finishReason"] = "MAX_TOKENS"
            self._sse([(None, chunk)])

    def _status_error(self, api: str, scenario: str) -> None:
        status, headers, bodies = STATUS_ERRORS[scenario]
        if api == "anthropic" and scenario == "s529":
            status = 529
        elif scenario == "s529":
            status = 503
        self._send(status, bodies[api], headers)

    def _auth_error(self, api: str) -> None:
        if api == "anthropic":
            body = {
                "type": "error",
                "error": {"type": "authentication_error", "message": "invalid x-api-key"},
            }
        elif api == "responses":
            body = {
                "error": {
                    "message": "Incorrect API key provided: sk-expired.",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            }
        else:
            body = {
                "error": {
                    "code": 401,
                    "message": "API key expired. Please renew the API key.",
                    "status": "UNAUTHENTICATED",
                }
            }
        self._send(401, body)


def _anthropic_error(kind: str, message: str) -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _gemini_error(code: int, message: str, status: str) -> dict:
    return {"error": {"code": code, "message": message, "status": status}}


_RATE = {
    "anthropic": _anthropic_error(
        "rate_limit_error",
        "Number of request tokens has exceeded your per-minute rate limit",
    ),
    "responses": {
        "error": {
            "message": "Rate limit reached for scripted-codex on tokens per min (TPM): "
            "Limit 30000, Used 30000, Requested 1000.",
            "type": "tokens",
            "code": "rate_limit_exceeded",
        }
    },
    "gemini": _gemini_error(
        429, "Resource has been exhausted (e.g. check quota).", "RESOURCE_EXHAUSTED"
    ),
}
# scenario -> (status, headers, the body each API answers with)
STATUS_ERRORS: dict[str, tuple[int, dict, dict[str, dict]]] = {
    "s403": (
        403,
        {},
        {
            "anthropic": _anthropic_error(
                "permission_error",
                "Your API key does not have permission to use the specified resource.",
            ),
            "responses": {
                "error": {
                    "message": "Project does not have access to model scripted-codex",
                    "type": "invalid_request_error",
                    "code": "model_not_found",
                }
            },
            "gemini": _gemini_error(
                403, "Permission denied: Consumer has been suspended.", "PERMISSION_DENIED"
            ),
        },
    ),
    "s429": (429, {}, _RATE),
    "s429ra": (429, {"retry-after": "1"}, _RATE),
    "s500": (
        500,
        {},
        {
            "anthropic": _anthropic_error("api_error", "Internal server error"),
            "responses": {
                "error": {
                    "message": "The server had an error processing your request.",
                    "type": "server_error",
                }
            },
            "gemini": _gemini_error(500, "An internal error has occurred.", "INTERNAL"),
        },
    ),
    "s529": (
        503,
        {},
        {
            "anthropic": _anthropic_error("overloaded_error", "Overloaded"),
            "responses": {
                "error": {
                    "message": "The engine is currently overloaded, please try again later",
                    "type": "server_error",
                }
            },
            "gemini": _gemini_error(
                503, "The model is overloaded. Please try again later.", "UNAVAILABLE"
            ),
        },
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log", default="")
    ap.add_argument("--dump", default="")
    a = ap.parse_args()
    Handler.log_path = a.log
    Handler.dump_dir = a.dump
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    print(f"ready {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
