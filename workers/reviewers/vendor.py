"""Helpers shared by the vendor CLI adapters (claude, codex, gemini): the one-line
instruction that points an agent at its prompt file, and tolerant readers of their JSON
output."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .base import UNREADABLE, AttemptSpec, Reviewer, Telemetry, _num, bounded

_MAX_LOG_BYTES = 8 * 1024 * 1024
_MAX_FIRST_LINE_BYTES = 64 * 1024  # a session's first event is a few ids


def instruction(spec: AttemptSpec) -> str:
    """What goes on the command line instead of the prompt: prompts carry whole notes and
    easily pass Linux's 128 KiB limit for one argument, and stdin is closed, so the agent
    reads the prompt file itself. Paths are absolute because some CLIs run elsewhere."""
    return (
        f"Read the file {spec.prompt_path} and follow its instructions exactly "
        f"(relative paths in it are relative to {spec.root}). "
        f"Write your complete answer to {spec.output_path}. "
        "Do not create or change any other file."
    )


def remove_tree(folder: Path) -> None:
    """A folder a CLI kept for one attempt, gone; one it cannot remove (another user's, a
    link: rmtree follows none) is left as it is, the outcome already sent."""
    shutil.rmtree(folder, ignore_errors=True)


def json_objects(path: Path) -> Iterator[dict]:
    """Every JSON object in a stdout log, whether it holds one document (a JSON object or
    array) or one per line; anything unreadable is skipped, never raised."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - _MAX_LOG_BYTES))  # a huge log: its end has the result
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return
    try:
        whole = json.loads(text)
    except UNREADABLE:
        whole = None
        for line in text.splitlines():
            try:
                item = json.loads(line)
            except UNREADABLE:
                continue
            if isinstance(item, dict):
                yield item
    for item in whole if isinstance(whole, list) else [whole]:
        if isinstance(item, dict):
            yield item


def first_json_object(path: Path) -> dict | None:
    """The first line of a stdout log as a JSON object, or None: where a CLI names its
    session (Codex's thread.started), which :func:`json_objects` no longer reads once the
    log is past its bound."""
    try:
        with path.open("rb") as f:
            line = f.readline(_MAX_FIRST_LINE_BYTES)
    except OSError:
        return None
    try:
        item = json.loads(line.decode("utf-8", "replace"))
    except UNREADABLE:
        return None
    return item if isinstance(item, dict) else None


def add_counts(t: Telemetry, attr: str, *values: object) -> None:
    """Add the numbers among ``values`` to a count of ``t``; a count nothing reported
    stays None rather than becoming a misleading 0."""
    for v in values:
        n = _num(v, int)
        if n is not None:
            setattr(t, attr, (getattr(t, attr) or 0) + n)


def refused_said(calls: list[str], by: str) -> str | None:
    """The tool calls an agent's CLI refused it, said in one line ("the agent's Write to
    kb/notes/a.md refused by Claude Code's permissions"); None if none. An agent that
    wrote no output for it reads as "exited 0 without writing …" alone otherwise: a
    fixer's write over the KB note was only in the CLI's own log."""
    said = list(dict.fromkeys(calls))  # a model that tries the same write again
    if not said:
        return None
    return bounded("the agent's " + ", ".join(said) + f" refused by {by}")


# --- the CLIs' own errors -----------------------------------------------------------------
# An attempt whose CLI never got an answer from a model says nothing about the note: an
# expired key, a rate limit, a spent quota or an endpoint out of reach is the reviewer's
# failure. Each adapter finds its CLI's structured error; these helpers name the kind.

_STATUS = re.compile(r"\b(?:status|code)[ :=]*(\d{3})\b", re.I)
# Failed tries in a row (API retries, reconnects) before connect_timeout may end a CLI that
# has not reached its model: after one that went through, silence is the model thinking.
RETRIES_TO_END = 2
_KINDS = (
    (
        "quota",
        # LiteLLM's proxy says a spent budget with a 400: "Budget has been exceeded!",
        # "ExceededBudget: End User=x over budget".
        re.compile(
            r"quota|billing|credit balance|usage limit|insufficient_quota|"
            r"budget.?(?:has been )?exceeded|exceeded.?budget|over budget",
            re.I,
        ),
    ),
    (
        "rate-limit",
        re.compile(r"rate.?limit|too many requests|resource.?exhausted|overloaded", re.I),
    ),
    (
        "auth",
        re.compile(
            r"api.?key|unauthori[sz]ed|unauthenticated|authentication|permission denied|"
            r"forbidden|/login|not logged in|oauth token",
            re.I,
        ),
    ),
    (
        "unreachable",
        re.compile(
            r"connection (?:refused|reset|failed|error)|econnrefused|econnreset|enotfound|"
            r"eai_again|etimedout|ehostunreach|enetunreach|fetch failed|error sending request|"
            r"reconnecting|network|timed? ?out|dns|unable to connect|socket hang up",
            re.I,
        ),
    ),
)


_QUOTA_HINT = re.compile(r"\(e\.g\. check quota\)", re.I)


# A URL in an error says where the request went, never what went wrong: Codex ends its
# messages with ", url: https://…", and a gateway whose address held "network", "quota" or
# "/login" made a job's own 400 the reviewer's failure. The openai agent keeps the URL out
# of the server's words (``detail``) it is judged by; here it is taken out of any message.
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S*", re.I)


def _without_urls(message: str) -> str:
    """``message`` with every URL in it taken out: the words an error is judged by."""
    return _URL.sub(" ", message)


def failure_kind(message: str, status: int | None = None) -> str | None:
    """``auth``, ``quota``, ``rate-limit``, ``unreachable``, ``server`` or ``not-found``
    when an error says the model was never (or no longer) reachable; None for anything
    that may be the job's doing (a prompt too long, a refusal) or that nobody recognises.
    The words are judged, never the URLs among them (:func:`_without_urls`)."""
    message = _without_urls(message)
    if status is None:
        m = _STATUS.search(message)
        status = int(m.group(1)) if m else None
    if status in (401, 403, 407):
        return "auth"
    if status == 402:
        return "quota"
    if status == 429:
        # Google says every 429 as "Resource has been exhausted (e.g. check quota).", a
        # per-minute limit too: the hint is no word that a quota is spent ("You exceeded
        # your current quota…" is), and named quota, it sent the operator to billing.
        said = _QUOTA_HINT.sub(" ", message)
        return "quota" if _KINDS[0][1].search(said) else "rate-limit"
    if status == 404:
        return "not-found"  # no such endpoint or model: a profile to fix, not a note
    if status == 405 or (status is not None and 300 <= status < 400):
        return "config"  # a base_url that redirects (http for https), or not the endpoint
    if status is not None and (status >= 500 or status == 408):
        return "server"  # 408: the server (or a proxy) gave up waiting, as a 504 does
    for kind, pattern in _KINDS:
        if pattern.search(message):
            return kind
    return None


def unwrap(message: str) -> tuple[str, int | None]:
    """A message that is itself an API error document (Gemini puts the response body in
    its error's message): its inner message and status code."""
    try:
        doc = json.loads(message)
    except UNREADABLE:
        return message, None
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        code = _num(err.get("code"), int)
        return err["message"], code
    return message, None


def last_document(path: Path) -> dict | None:
    """The last JSON object in a log that mixes text and pretty-printed JSON (Gemini's
    stderr: warnings, a stack trace, then its error document)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - _MAX_LOG_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    decoder = json.JSONDecoder()
    found = None
    for m in re.finditer(r"(?m)^\{", text):
        try:
            doc, _ = decoder.raw_decode(text, m.start())
        except UNREADABLE:
            continue
        if isinstance(doc, dict):
            found = doc
    return found


def text_head(path: Path, limit: int) -> str:
    """The first ``limit`` bytes of a CLI's log as text, where it says what it refused
    and what it retried; empty when there is none."""
    try:
        with path.open("rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


# A frame of a Node stack trace ("at async main (file:///…/gemini.js:17457:5)"): where an
# error was raised, never what it was. Gemini ends its stderr with its critical error's stack.
_STACK_FRAME = re.compile(r"^at (?:[^()]+ )?\(?(?:file://|node:|/)[^()]*:\d+:\d+\)?$")


def last_line(path: Path, skip: re.Pattern[str] | None = None) -> str | None:
    """The last line of a log that says something: not blank, not JSON punctuation, not a
    stack frame, not matching ``skip`` (a CLI's chatter such as Codex's "Reading
    additional input")."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64 * 1024))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        # As it will be shown: a line of escape sequences only (a window title) says nothing.
        text = bounded(line)
        if (
            not text
            or re.fullmatch(r"[\[\]{}(),]+", text)
            or _STACK_FRAME.match(text)
            or (skip and skip.search(text))
        ):
            continue
        return text
    return None


# --- the CLIs' versions -------------------------------------------------------------------
# An operator has whatever npm gave the day it was installed. Each vendor kind names the
# versions tests/test_vendor_clis.py has run end to end (docs/OPERATIONS.md §1): an older
# CLI may lack a flag or tool reviewq gives it (Claude 2.0 has no dontAsk permission mode,
# Gemini 0.30 no write_file in headless mode), a newer one may have changed its output.

# "v2.1.332" too, as a wrapper script or a release may print it
_X_Y_Z = re.compile(r"\bv?(\d+\.\d+\.\d+)\b")


def _environ(env: dict[str, str] | None) -> dict[str, str]:
    """The environment a profile's CLI runs with: this process's, and the profile's env."""
    return {**os.environ, **(env or {})}


def _tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


VERSION_TIMEOUT_S = 30.0  # Gemini CLI 0.30 took 21 s to say its version on a loaded machine


def cli_version(
    executable: str, package: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[str | None, str]:
    """(x.y.z, "") of the CLI ``executable`` names, or (None, why none was said). From
    the package.json of the npm ``package`` the program is a link into, when it is one:
    no CLI started (Gemini CLI takes 7-21 s to say its version on a loaded machine, and
    leaves two ``projects.json.*.tmp`` in ``~/.gemini`` each time); else what ``executable
    --version`` says (:func:`version_run`). ``cwd``: where a relative ``executable`` is."""
    installed = _npm_package(executable, package, env, cwd)
    if installed is not None and installed[1] is not None and _interpreter_found(installed[2], env):
        return installed[1], ""
    return version_run(executable, env, cwd)


def _interpreter_found(program: Path, env: dict[str, str] | None) -> bool:
    """Whether the interpreter ``program``'s #! line names is there (``/usr/bin/env node``:
    node on the PATH it gets). A node only an interactive shell's PATH has (nvm's) left
    every attempt "exited 127", and its version read from package.json said nothing."""
    try:
        with program.open("rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    if not first.startswith(b"#!"):
        return True  # a native program (Claude Code's claude.exe)
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return False
    if os.path.basename(words[0]) == "env":  # its first word that is no flag nor NAME=value
        name = next((w for w in words[1:] if not w.startswith("-") and "=" not in w), None)
        return name is not None and shutil.which(name, path=_environ(env).get("PATH")) is not None
    return os.access(words[0], os.X_OK)


def _npm_package(
    executable: str, package: str, env: dict[str, str] | None, cwd: Path | None
) -> tuple[Path, str | None, Path] | None:
    """(the folder, the x.y.z, the file) of the npm ``package`` the program ``executable``
    names is a link into; None for another program (a wrapper script, a native install)."""
    if os.sep in executable:
        found: str | None = str(Path(cwd or ".", executable))
    else:
        found = shutil.which(executable, path=_environ(env).get("PATH"))
    if found is None:
        return None
    # node_modules/.bin/gemini -> ../@google/gemini-cli/bundle/gemini.js: the package
    # folder is one or two above the file the link names (and its dist/ may hold a
    # package.json of the same name: Gemini CLI 0.30).
    program = Path(os.path.realpath(found))
    for folder in program.parents[:3]:
        if folder.parts[-len(package.split("/")) :] != tuple(package.split("/")):
            continue
        try:
            doc = json.loads((folder / "package.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("name") != package:
            continue
        version = doc.get("version")
        m = _X_Y_Z.match(version) if isinstance(version, str) else None
        return folder, m.group(1) if m else None, program
    return None


def _install(package: str, version: str, folder: Path | None) -> str:
    """The npm command that puts ``package@version`` where the CLI at ``folder`` is: a
    profile's executable in a prefix of its own (/opt/clis/node_modules/.bin/claude) kept
    its old version after the `npm install -g` doctor said to run."""
    modules = folder.parents[package.count("/")] if folder is not None else None
    if modules is None or modules.name != "node_modules" or modules.parent.name == "lib":
        return f"npm install -g {package}@{version}"  # global: PREFIX/lib/node_modules
    return f"npm install --prefix {modules.parent} {package}@{version}"


def version_run(
    executable: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[str | None, str]:
    """(the x.y.z ``executable --version`` says, "") or (None, why it said none: it failed
    to start, exited non-zero, printed no version or took over VERSION_TIMEOUT_S). ``cwd``:
    where a relative ``executable`` (tools/claude) is, the KB root its agents start in."""
    try:
        proc = subprocess.Popen(
            [executable, "--version"],
            env=_environ(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        return None, f"could not start: {exc.strerror or exc}"
    with proc:
        try:
            out, err = proc.communicate(timeout=VERSION_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # Its whole group: a wrapper script's node, or Gemini's relaunch of itself,
            # outlived the CLI killed alone, and each doctor run from cron left one more.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None, f"did not answer within {VERSION_TIMEOUT_S:g} s"
    if proc.returncode != 0:
        lines = [x.strip() for x in (err or out).splitlines() if x.strip()]
        return None, f"exited {proc.returncode}" + (f": {bounded(lines[-1])}" if lines else "")
    m = _X_Y_Z.search(out)
    return (m.group(1), "") if m else (None, "said no version")


def known_span(known: tuple[str, str]) -> str:
    """The versions of ``known`` (oldest, newest) in words: one alone when they are one
    (Gemini's range), not "0.61.0 to 0.61.0"."""
    oldest, newest = known
    return oldest if oldest == newest else f"{oldest} to {newest}"


def version_verdict(
    cli: str,
    version: str | None,
    known: tuple[str, str],
    package: str,
    why: str = "said no version",
    folder: Path | None = None,
) -> tuple[bool | None, str]:
    """What to say of ``cli`` at ``version`` against the ``known`` (oldest, newest) versions
    reviewq has run: (True, …) one within them; (False, …) an older one, which may lack
    what reviewq asks of it; (None, …) a newer or unreadable one, not known either way.
    ``folder``: the npm package folder the CLI is in, if any."""
    oldest, newest = known
    span = f"the versions reviewq is known to work with ({known_span(known)})"
    install = _install(package, newest, folder)
    if version is None:
        return (
            None,
            f"`{cli} --version` {why}; reviewq is known to work with {known_span(known)}",
        )
    if _tuple(version) < _tuple(oldest):
        return False, f"{cli} {version} is older than {span}: upgrade it ({install})"
    if _tuple(version) > _tuple(newest):
        return None, (
            f"{cli} {version} is newer than {span}; if its attempts fail to start or "
            f"write no output, {install}"
        )
    return True, f"{cli} {version}, one of {span}"


_Run = tuple[str, tuple[tuple[str, str], ...]]  # a CLI: its executable and its env


def _cli(adapter: Reviewer) -> _Run:
    [exe] = adapter.executables()
    return exe, tuple(sorted(adapter.profile.env.items()))


def versions_run(adapters: list[Reviewer], root: Path) -> dict[_Run, tuple[str | None, str]]:
    """:func:`cli_version` of each distinct vendor CLI among ``adapters``, side by side:
    run one after another, once per profile, a doctor with two Gemini profiles and a
    Claude waited ~20 s more on a loaded machine than its slowest CLI (Gemini's ~10 s)."""
    clis = {_cli(a): a.package for a in adapters if a.known_versions is not None and a.package}
    if not clis:
        return {}
    with ThreadPoolExecutor(max_workers=min(len(clis), 8)) as pool:
        runs = {
            cli: pool.submit(cli_version, cli[0], package, dict(cli[1]), root)
            for cli, package in clis.items()
        }
    return {cli: run.result() for cli, run in runs.items()}


def version_said(
    adapter: Reviewer, root: Path, runs: dict[_Run, tuple[str | None, str]] | None = None
) -> tuple[bool | None, str] | None:
    """:func:`version_verdict` of the CLI ``adapter``'s profile runs from the KB ``root``
    (its version taken from ``runs`` when there); None for a kind with no known versions
    (no vendor CLI)."""
    if adapter.known_versions is None or adapter.package is None:
        return None
    exe, env = cli = _cli(adapter)
    version, why = (runs or {}).get(cli) or cli_version(exe, adapter.package, dict(env), root)
    installed = _npm_package(exe, adapter.package, dict(env), root)
    folder = installed[0] if installed is not None else None
    return version_verdict(exe, version, adapter.known_versions, adapter.package, why, folder)
