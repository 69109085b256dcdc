"""Reads whose size an agent, a server or the record decides are bounded: memory stays
flat however large the file, the answer or the table grows."""

from __future__ import annotations

import json
import threading
import tracemalloc
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


def test_export_streams_the_acceptance_rows(tmp_path):
    store = Store.open(tmp_path / "state")
    body = "x" * 200_000
    store.record_reviews(
        "m",
        [
            ReviewRecord(
                f"kb/notes/n{i}.md",
                f"---\ntitle: N{i}\n---\n{body}{i}\n",
                "prose/g",
                "kb/instructions/review-gates/prose/g.md",
                "prose",
                "gate",
                "PASS",
                "ok",
            )
            for i in range(100)
        ],
    )
    res, peak = peak_bytes(lambda: export(store, tmp_path, "m"))
    assert res.files == 100
    # 100 notes of 200 kB: holding every row at once would take 20 MB.
    assert peak < 5 * 1024 * 1024
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
