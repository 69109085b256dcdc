"""The ``openai`` reviewer as a program: ``python -m workers.openai_agent``.

It sends the prompt at ``REVIEWQ_PROMPT_PATH`` as one user message to
``{REVIEWQ_OPENAI_BASE_URL}/v1/chat/completions`` for ``REVIEWQ_MODEL``, writes the
assistant's answer to ``REVIEWQ_OUTPUT_PATH`` and the ``usage`` to
``REVIEWQ_TELEMETRY_PATH``. The bearer key, if any, is read from the variable named by
``REVIEWQ_OPENAI_API_KEY_ENV`` and is never printed. Arguments ``name=value`` (the
profile's ``args``) add fields to the request, e.g. ``temperature=0`` ``max_tokens=8192``;
values are read as JSON when they parse, else as strings. On any failure it prints one line to
stderr (no traceback), writes ``{"error", "status", "failure"}`` to the telemetry file
(the HTTP status if there was one; ``failure`` when the endpoint was never reached or did
not answer as one) and exits 1, so the attempt is classified from what happened.

The endpoint (or the proxy the environment names for it) must accept a TCP connection
within ``REVIEWQ_OPENAI_CONNECT_TIMEOUT`` seconds: an address that drops packets is then
reported as out of reach, not waited on until the attempt's deadline. While the answer is
awaited, the endpoint is asked for its model list every as many seconds (1 at least): one
that answered and then stops answering that too is a hung server, reported as such, not a
job too big for its time.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import json
import os
import queue
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from datetime import UTC
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# Past this an answer is not a review of a bundle (and would be refused as output anyway).
MAX_ANSWER_BYTES = 32 * 1024 * 1024
# What an error's body may say in a message; read longer, so a key echoed in it is masked
# whole before the cut.
_DETAIL_CHARS = 300
_LONGEST_WAIT_S = 366 * 86400.0  # of a Retry-After: a year (pause_seconds caps it anyway)
_DETAIL_READ = 64 * 1024
# workers.reviewers.base.OUTPUT_LIMIT (the agent imports nothing of reviewq's): the model
# stopped at its output-token limit, so the attempt is burned out and a job of several
# pairs splits.
OUTPUT_LIMIT = "max_output_tokens"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an error to report, not to follow: urllib sends the bearer key on
    to whatever host it names, and turns the POST into a GET that the server refuses
    as a 405, which read as the job's failure. The base_url is to be set where it points."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


class AgentError(Exception):
    """One line for stderr; ``status`` the HTTP status the endpoint answered with, and
    ``failure`` (``unreachable``, ``server``, ``config``) when no model answer could come.
    ``answered``: the server took the request and answered it (an HTTP error about the
    request, an empty message), with ``detail``, what it said without the URL (which may
    hold any word: the kind of failure is read from ``detail`` alone), and ``usage``;
    ``retry_after``: the seconds its ``Retry-After`` header asked the client to wait;
    ``subtype``: :data:`OUTPUT_LIMIT` when the model stopped at its output-token limit."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        failure: str | None = None,
        *,
        answered: bool = False,
        detail: str | None = None,
        usage: object = None,
        retry_after: float | None = None,
        subtype: str | None = None,
    ):
        super().__init__(message)
        self.retry_after = retry_after
        self.subtype = subtype
        self.status = status
        self.failure = failure
        self.answered = answered
        self.detail = detail
        self.usage = usage if isinstance(usage, dict) else {}


def endpoint(base_url: str) -> str:
    """``…/v1/chat/completions`` whether or not ``base_url`` already ends in ``/v1``."""
    base = base_url.strip().rstrip("/")
    if not base:
        raise AgentError("no base_url configured")
    return f"{base}/chat/completions" if base.endswith("/v1") else f"{base}/v1/chat/completions"


def shown(url: str) -> str:
    """The URL without any user:password@ part, for messages."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _count(usage: dict, *keys: str) -> int | None:
    for key in keys:  # OpenAI says prompt/completion_tokens; some servers input/output_tokens
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def extra_fields(args: Sequence[str]) -> dict:
    fields: dict = {}
    for arg in args:
        name, sep, value = arg.partition("=")
        if not sep or not name:
            raise AgentError(f"argument {arg!r} is not name=value")
        try:
            fields[name] = json.loads(value)
        except ValueError:
            fields[name] = value
    return fields


def reach(url: str, timeout: float) -> None:
    """A TCP connection to the endpoint, or to the proxy the environment gives for it,
    within ``timeout``; closed at once. The proxy is chosen as urllib's ProxyHandler
    chooses it for the request: ``no_proxy`` is matched against the host *and port*
    (``host:8000`` in it means that port only); matched by the host alone, the check
    tried a proxy the request never uses and reported the endpoint out of reach."""
    parts = urlsplit(url)
    request = urllib.request.Request(url)
    proxy = None
    if not urllib.request.proxy_bypass(request.host):
        proxy = urllib.request.getproxies().get(request.type)
    target = urlsplit(proxy if "//" in proxy else f"//{proxy}") if proxy else parts
    port = target.port or (443 if (target.scheme or parts.scheme) == "https" else 80)
    try:
        socket.create_connection((target.hostname or "", port), timeout=timeout).close()
    except OSError as exc:
        raise AgentError(
            f"cannot reach {shown(proxy or url)}{_why(exc, timeout)}", failure="unreachable"
        ) from None


def probe(base_url: str, timeout: float) -> str | None:
    """Why the endpoint does not answer from here, or None: the TCP connection every
    attempt makes first, then a GET of its model list, each within ``timeout``. Any HTTP
    answer (a 401 to a request without a key, a 404 of a server with no list) is one."""
    try:
        url = endpoint(base_url)
        reach(url, timeout)
    except AgentError as exc:
        return str(exc)
    models = url.removesuffix("/chat/completions") + "/models"
    try:
        with _OPENER.open(urllib.request.Request(models), timeout=timeout) as response:
            response.read(1)
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        return f"no HTTP answer from {shown(models)}{_why(getattr(exc, 'reason', exc), timeout)}"
    return None


def _why(exc: object, timeout: float) -> str:
    """Why a connection or request failed: "within 10 s" only of a wait that ran out, as a
    refused connection comes at once ("within 10 s: Connection refused" read as a timeout)."""
    if isinstance(exc, TimeoutError):
        return f" within {timeout:g} s: timed out"
    return f": {getattr(exc, 'strerror', None) or exc}"


def bearer(key_var: str, key: str) -> str:
    """The key as it can go in a header: the spaces and line ends round it (a CRLF
    ``.env`` file) dropped. One left inside, or a letter outside ASCII, made http.client
    raise with the whole header, key included, in the traceback."""
    key = key.strip()
    if key and not (key.isascii() and key.isprintable() and " " not in key):
        raise AgentError(
            f"the variable {key_var} holds a key with a space, a control character or a "
            "letter outside ASCII; nothing was sent",
            failure="config",
        )
    return key


def _error_detail(exc: urllib.error.HTTPError, key: str) -> str:
    """What the server said with its error, on one line, the key masked; empty if its
    body cannot be read."""
    try:
        said = exc.read(_DETAIL_READ).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return ""  # a body cut off or timed out: the status says enough
    return _one_line(said, key)


def _one_line(said: str, key: str) -> str:
    """What a server said, as a message may show it: one line, cut, the key masked (a
    server that echoes the request) before the cut."""
    if key:
        said = said.replace(key, "***")
    return said.replace("\n", " ").strip()[:_DETAIL_CHARS]


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """The seconds a ``Retry-After`` header asks for (RFC 9110: a number of seconds, or an
    HTTP date), never less than 0; None for no header or one that is neither."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # isdigit alone takes "²", which float refuses
        # Longer than any pause is as long as a pause: a float past 2**63 s is no number
        # the control keeps, and it took the server's wait for none.
        return min(float(value), _LONGEST_WAIT_S)
    try:
        at = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if at.tzinfo is None:  # an HTTP date is GMT
        at = at.replace(tzinfo=UTC)
    return min(max(0.0, at.timestamp() - (time.time() if now is None else now)), _LONGEST_WAIT_S)


def in_band_error(data: object, key: str) -> str | None:
    """The error a 200 answer carries in its body, or None. OpenRouter answers 200 once a
    provider has started, and a failure after that comes as ``finish_reason: "error"``
    with an ``error`` object (``code``, ``message``) in the choice or at the top, and no
    content or a part of it: read as the model's answer, an empty one counted against the
    job and a part of a bundle was judged. An error object beside a whole answer is not
    one: the answer is there."""
    if not isinstance(data, dict):
        return None
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    choice = choice if isinstance(choice, dict) else {}
    error = choice.get("error") or data.get("error")
    message = choice.get("message")
    content = answer_text(message.get("content")) if isinstance(message, dict) else None
    if choice.get("finish_reason") != "error" and not (error and not (content or "").strip()):
        return None
    said = error if isinstance(error, str) else ""
    if isinstance(error, dict):
        said = str(error.get("message") or "")
        if error.get("code") is not None:  # an HTTP status (OpenRouter) or a word
            said = f"code {error['code']}: {said}"
    said = _one_line(said, key)
    return "answered with an error" + (f": {said}" if said else ", with no message")


def complete(url: str, body: dict, key: str, timeout: float) -> tuple[str, dict]:
    """The assistant's message and the whole answer (for ``usage``)."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    payload = json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=payload, headers=headers, method="POST")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            raw = response.read(MAX_ANSWER_BYTES + 1)
            # http.client returns what came of a body the server cut short, no error: read
            # as JSON, it was "did not answer with a chat completion" of a server that did.
            short = response.length if len(raw) <= MAX_ANSWER_BYTES else None
    except urllib.error.HTTPError as exc:
        detail = _error_detail(exc, key)
        if 300 <= exc.code < 400:
            where = exc.headers.get("Location") or "elsewhere"
            detail = f"redirects to {shown(where)}; set base_url to the address it names"
        raise AgentError(
            f"HTTP {exc.code} from {shown(url)}: {detail or exc.reason}",
            status=exc.code,
            answered=True,
            detail=detail or str(exc.reason),
            retry_after=retry_after(exc.headers.get("Retry-After")),
        ) from None
    except http.client.IncompleteRead:
        # A chunked body whose connection closed before its last chunk (a Content-Length
        # one cut short comes back as bytes, below): the server was reached and answered,
        # and "cannot reach" sent the operator to the network.
        said = "cut its answer off before the end of its chunked body"
        raise AgentError(f"{shown(url)} {said}", failure="server", detail=said) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AgentError(f"cannot reach {shown(url)}: {reason}", failure="unreachable") from None
    if short:
        said = f"cut its answer off after {len(raw)} of {len(raw) + short} bytes"
        raise AgentError(f"{shown(url)} {said}", failure="server", detail=said)
    if len(raw) > MAX_ANSWER_BYTES:
        said = f"answered with more than {MAX_ANSWER_BYTES} bytes"
        raise AgentError(f"{shown(url)} {said}", answered=True, detail=said)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    if (said := in_band_error(data, key)) is not None:
        # The server's failure, however it is worded: its words may name a kind.
        raise AgentError(
            f"{shown(url)} {said}",
            failure="server",
            answered=True,
            detail=said,
            usage=data.get("usage"),  # a dict: it holds the error
        )
    try:
        message = data["choices"][0]["message"]  # None (not JSON) raises TypeError
        if not isinstance(message, dict):
            raise TypeError(message)
    except (LookupError, TypeError):
        raise AgentError(
            f"{shown(url)} did not answer with a chat completion", failure="server"
        ) from None
    # A message with no "content" is an empty answer (mlx-lm leaves it out when the model
    # stopped inside its reasoning): taken for a broken server, it paused the profile.
    content = answer_text(message.get("content"))
    refusal = message.get("refusal")
    if (not content or not content.strip()) and isinstance(refusal, str) and refusal.strip():
        # OpenAI says a refusal apart from the content, which is null: "an empty message"
        # lost its words. The model's words are shown, never judged for a kind of outage
        # (``detail``): a refusal that spoke of a quota was the job's all the same.
        raise AgentError(
            f"{shown(url)} refused: {_one_line(refusal, key)}",
            answered=True,
            detail="refused",
            usage=data.get("usage"),
        )
    if finish_reason(data) == "content_filter":
        # The provider's filter stopped the answer: what came before it is no bundle to
        # judge ("unterminated block", an END to remember), and the person the job is
        # escalated to reads that a filter stopped it. The job's, as Codex's is (F32).
        said = "its provider's content filter stopped its answer" + (
            f" after {len(content)} characters" if content else ""
        )
        said += " (finish_reason content_filter)"
        raise AgentError(
            f"{shown(url)} {said}", answered=True, detail=said, usage=data.get("usage")
        )
    if not isinstance(content, str) or not content.strip():
        finish = finish_reason(data)
        said = "answered with an empty message" + (f" (finish_reason {finish})" if finish else "")
        raise AgentError(
            f"{shown(url)} {said}",
            answered=True,
            detail=said,
            usage=data.get("usage"),
            subtype=OUTPUT_LIMIT if finish == "length" else None,
        )
    return content, data


# Looks at the model list that found no answer in a row before the server is called hung:
# one may be a blip of a loaded server.
SILENT_LOOKS = 2
# A look's wait, and the time between looks, at least: a TCP connection is the kernel's
# work, an HTTP answer the server's process's, which a loaded machine schedules late. A
# connect_timeout sized for the first (0.05 s on loopback) called a busy server hung, and
# asked it for its model list 20 times a second.
LOOK_S = 1.0


def watched(url: str, body: dict, key: str, timeout: float, every: float) -> tuple[str, dict]:
    """:func:`complete`, while the endpoint is asked for its model list every ``every``
    seconds on a connection of its own. A non-streamed answer comes whole at the end, so a
    server that took the request and then hung (a stuck model load, a proxy holding the
    connection) looked like a model still writing: the deadline took it for a job too big
    for its time, split the job and counted its parts' attempts. A server that answers
    the look is busy with the job, and the deadline stays the job's; one that answered a
    look and then answers neither is an outage. Silence alone says nothing: a server that
    answers one request at a time (http.server's, as mlx_lm.server's was), or whose list
    waits for the model (llama-cpp-python's takes the lock its completion holds), or that
    closes a GET it does not serve, never answers a look while it writes, and was called
    hung of every job longer than two looks."""
    every = max(every, LOOK_S)
    # Both threads report here, so an answer that comes during a slow look is taken at once.
    news: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()

    def call() -> None:
        try:
            news.put(("answer", complete(url, body, key, timeout)))
        except BaseException as exc:  # noqa: BLE001 - raised again by the waiting thread
            news.put(("answer", exc))

    def look() -> None:
        news.put(("look", probe(url.removesuffix("/chat/completions"), every)))

    threading.Thread(target=call, daemon=True).start()  # the exit ends what still waits
    looking, heard, silent = False, False, 0
    while True:
        try:
            kind, value = news.get(timeout=None if looking else every)
        except queue.Empty:
            threading.Thread(target=look, daemon=True).start()
            looking = True
            continue
        if kind == "answer":
            if isinstance(value, BaseException):
                raise value
            return value  # type: ignore[return-value]
        looking, heard = False, heard or value is None
        silent = silent + 1 if value and heard else 0
        if silent >= SILENT_LOOKS:
            said = f"took the request, then stopped answering: {value}"
            raise AgentError(f"{shown(url)} {said}", failure="server", detail=said)


def finish_reason(data: dict) -> str | None:
    """Why the model stopped, as the answer's first choice says (``stop``, ``length``…)."""
    choice = data["choices"][0]
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    return finish if isinstance(finish, str) else None


def answer_text(content: object) -> str | None:
    """The text of a message's ``content``: a string, or the text parts of a list of
    parts (Mistral's reasoning models answer ``[{"type": "thinking", ...}, {"type":
    "text", "text": ...}]``), which was read as an empty answer and counted against the
    job. The thinking is no part of the answer."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    return "".join(
        part["text"]
        for part in content
        if isinstance(part, dict)
        and part.get("type") == "text"
        and isinstance(part.get("text"), str)
    )


def run(env: Mapping[str, str], args: Sequence[str] = ()) -> None:
    url = endpoint(env.get("REVIEWQ_OPENAI_BASE_URL", ""))
    key_var = env.get("REVIEWQ_OPENAI_API_KEY_ENV", "")
    key = bearer(key_var, env.get(key_var, "")) if key_var else ""
    try:
        # As written: read as text, a CRLF note reached the model as LF, and a fixer that
        # gave it back unchanged rewrote every line end of the note.
        prompt = Path(env["REVIEWQ_PROMPT_PATH"]).read_bytes().decode("utf-8")
    except (KeyError, OSError, UnicodeDecodeError) as exc:
        raise AgentError(f"cannot read the prompt: {exc}") from None
    try:
        timeout = float(env.get("REVIEWQ_OPENAI_TIMEOUT") or 1800)
        connect_timeout = float(env.get("REVIEWQ_OPENAI_CONNECT_TIMEOUT") or min(30, timeout))
    except ValueError:
        raise AgentError("REVIEWQ_OPENAI_*TIMEOUT is not a number of seconds") from None
    body = {
        "model": env.get("REVIEWQ_MODEL", ""),
        "messages": [{"role": "user", "content": prompt}],
        "stream": False,
        **extra_fields(args),
    }
    reach(url, connect_timeout)
    content, data = watched(url, body, key, timeout, connect_timeout)
    if env.get("REVIEWQ_TASK") == "fix":
        content = unwrapped_note(content, _given_note(env))
    telemetry = _turn(data.get("usage"))
    if isinstance(data.get("id"), str):
        telemetry["session_id"] = data["id"]
    if env.get("REVIEWQ_TELEMETRY_PATH"):  # first: what the answer used counts, whatever follows
        Path(env["REVIEWQ_TELEMETRY_PATH"]).write_text(
            json.dumps({k: v for k, v in telemetry.items() if v is not None}), encoding="utf-8"
        )
    output = Path(env["REVIEWQ_OUTPUT_PATH"])
    tmp = output.with_name(output.name + ".part")
    try:
        # A lone surrogate (an emoji cut in two) is kept as the bytes it stands for: not
        # UTF-8, so the output is refused as such, as any agent's would be.
        tmp.write_bytes(content.encode("utf-8", "surrogatepass"))
        tmp.replace(output)  # the output appears whole or not at all
    finally:
        tmp.unlink(missing_ok=True)
    if finish_reason(data) == "length":
        # Written all the same: a bundle whole before the cut is the job's output (the
        # worker judges it); one cut short is no invalid output ("unterminated block", an
        # END to remember three times over) but a job too big for one answer.
        said = (
            f"stopped at its output-token limit after {len(content)} characters "
            "(finish_reason length)"
        )
        raise AgentError(
            f"{shown(url)} {said}",
            answered=True,
            detail=said,
            usage=data.get("usage"),
            subtype=OUTPUT_LIMIT,
        )


_FENCE = re.compile(r"(`{3,}|~{3,})\s*(markdown|md)?\s*")


def _given_note(env: Mapping[str, str]) -> str | None:
    """The text the fixer was given (``REVIEWQ_NOTE_FILE``), or None."""
    try:
        return Path(env["REVIEWQ_NOTE_FILE"]).read_bytes().decode("utf-8")
    except (KeyError, OSError, UnicodeDecodeError):
        return None


def _starts_with_frontmatter(text: str) -> bool:
    return text.lstrip("\ufeff \t\r\n").startswith("---")


def unwrapped_note(answer: str, given: str | None) -> str:
    """A fixer's answer is the note's new text. A chat model wraps it all the same
    ("Here is the corrected note:", a fenced block, a remark): written as it came, the
    chatter became the note. For a ``given`` note that starts with frontmatter, an answer
    that does not is unwrapped: the fenced block that holds a note starting with
    frontmatter is taken. Anything else is left for the fix's checks: a note without
    frontmatter may quote an example note in a block of its own."""
    if given is None or not _starts_with_frontmatter(given) or _starts_with_frontmatter(answer):
        return answer
    lines = answer.splitlines(keepends=True)
    for i, line in enumerate(lines):
        opener = _FENCE.fullmatch(line.rstrip("\r\n"))
        if opener is None:
            continue
        fence = opener.group(1)
        # The last line that closes it: the note's own code blocks use shorter fences,
        # or the same ones in pairs, inside.
        closes = [j for j in range(len(lines) - 1, i, -1) if lines[j].strip() == fence]
        inner = "".join(lines[i + 1 : closes[0]]) if closes else ""
        return inner if inner.startswith("---") else answer
    return answer


def _turn(usage: object) -> dict:
    """One turn's telemetry: the model was asked and answered (well or not). Of the prompt
    tokens, those read from a prompt cache (OpenAI, vLLM: ``prompt_tokens_details``) are
    counted apart, so the profile's cached price applies to them, not the full one."""
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    return {
        "num_turns": 1,
        "input_tokens": _count(usage, "prompt_tokens", "input_tokens"),
        "output_tokens": _count(usage, "completion_tokens", "output_tokens"),
        "cached_input_tokens": _count(details, "cached_tokens"),
    }


def main() -> int:
    try:
        run(os.environ, sys.argv[1:])
    except AgentError as exc:
        return _said(exc)
    except OSError as exc:  # writing the output or telemetry
        print(f"openai reviewer: cannot write: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback that may quote the key
        return _said(AgentError(f"failed: {type(exc).__name__}", failure="server"))
    return 0


def _said(exc: AgentError) -> int:
    """The failure on one line of stderr and in the telemetry file; the exit status."""
    print(f"openai reviewer: {exc}", file=sys.stderr)
    if os.environ.get("REVIEWQ_TELEMETRY_PATH"):
        report = {"error": str(exc), "status": exc.status, "failure": exc.failure}
        if exc.answered:
            # A turn: however fast it came, not a launch failure, and what it used counts.
            report |= {k: v for k, v in _turn(exc.usage).items() if v is not None}
            report["detail"] = exc.detail
            if exc.retry_after is not None:  # the pause the server asked for
                report["retry_after_s"] = exc.retry_after
            if exc.subtype is not None:
                report["error_subtype"] = exc.subtype
        with contextlib.suppress(OSError):  # stderr has said it
            Path(os.environ["REVIEWQ_TELEMETRY_PATH"]).write_text(json.dumps(report))
    return 1


if __name__ == "__main__":
    sys.exit(main())
