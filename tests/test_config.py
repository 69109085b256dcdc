"""reviewq.toml: every table, key and type is checked when the settings load; a mistake is
one ``error:`` line naming the file, the table.key and the reason."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.config import ConfigError, load_settings

BAD = [
    # (toml text, what the message must name, the reason)
    ("[kbb]\n", "reviewq.toml kbb", "unknown key"),
    ('[kb]\nnote_root = ["kb/x"]\n', "[kb] note_root", "unknown key"),
    ('[state]\ndirectory = "x"\n', "[state] directory", "unknown key"),
    ("[limits]\nmax_output = 10\n", "[limits] max_output", "unknown key"),
    ("[queue]\nlease = 10\n", "[queue] lease", "unknown key"),
    ('[reviewers.x]\nkind = "offline"\nmodle = "m"\n', "[reviewers.x] modle", "unknown key"),
    ("[fix]\ngit_comit = true\n", "[fix] git_comit", "unknown key"),
    ('[fix]\ngit_commit = "yes"\n', "[fix] git_commit", "true or false"),
    ("kb = 1\n", "[kb]", "expected a table"),
    ("fix = 1\n", "[fix]", "expected a table"),
    ('state = "x"\n', "[state]", "expected a table"),
    ("limits = [1]\n", "[limits]", "expected a table"),
    ("queue = 3\n", "[queue]", "expected a table"),
    ("reviewers = 3\n", "[reviewers]", "expected a table"),
    ("[reviewers]\nx = 3\n", "[reviewers.x]", "expected a table"),
    ("[state]\ndir = 3\n", "[state] dir", "expected a string"),
    ("[kb]\nnote_roots = 3\n", "[kb] note_roots", "expected a string or a list of strings"),
    # Each meant more than the notes, or (the empty list) the default in silence.
    ("[kb]\nnote_roots = []\n", "[kb] note_roots", "empty; name the folders of notes"),
    ('[kb]\nnote_roots = ["."]\n', "[kb] note_roots", "'.' names all of ROOT"),
    ('[kb]\nnote_roots = ["kb/notes", " "]\n', "[kb] note_roots", "' ' names all of ROOT"),
    ('[kb]\nnote_roots = ["/srv/kb"]\n', "[kb] note_roots", "/srv/kb: an absolute path"),
    # [kb] exclude: a string (read as a list of one, or as its letters?) and each glob
    # that cannot be one are refused, not taken as excluding nothing in silence.
    ('[kb]\nexclude = "templates/**"\n', "[kb] exclude", "expected a list of globs"),
    ("[kb]\nexclude = [3]\n", "[kb] exclude", "expected a list of globs"),
    ('[kb]\nexclude = ["[ab.md"]\n', "[kb] exclude", "'[ab.md': '[' without its ']'"),
    ('[kb]\nexclude = ["/README.md"]\n', "[kb] exclude", "relative to the note roots"),
    ('[kb]\nexclude = ["a**/x.md"]\n', "[kb] exclude", "'**' only as a whole part"),
    ('[kb]\nexclude = ["../x.md"]\n', "[kb] exclude", "a '..' part"),
    ('[kb]\nexclude = [""]\n', "[kb] exclude", "'': empty"),
    # Written from ROOT (as note_roots are): it matched no note, without a word.
    (
        '[kb]\nexclude = ["kb/notes/**/README.md"]\n',
        "[kb] exclude",
        "starts with the note root 'kb/notes'; globs are relative to the note roots "
        "('**/README.md')",
    ),
    (
        '[kb]\nnote_roots = ["kb/a", "kb/b"]\nexclude = ["kb/b/t.md"]\n',
        "[kb] exclude",
        "starts with the note root 'kb/b'",
    ),
    # A range backwards was a re.error: a traceback at every command.
    ('[kb]\nexclude = ["[z-a].md"]\n', "[kb] exclude", "'[z-a].md': not a glob (bad character"),
    ('[limits]\nmax_output_bytes = "big"\n', "[limits] max_output_bytes", "whole number"),
    # Past what a read can be asked for: finalize ended in an internal error
    # (OverflowError, MemoryError), a worker's attempt in a launch failure.
    (
        "[limits]\nmax_output_bytes = 4611686018427387904\n",
        "[limits] max_output_bytes",
        "to 1073741824",
    ),
    ("[limits]\nmax_note_bytes = 0\n", "[limits] max_note_bytes", "whole number ≥ 1"),
    ("[limits]\nmax_note_bytes = 2147483648\n", "[limits] max_note_bytes", "to 1073741824"),
    # Past SQLite's INTEGER: every dispatch and tick of the control failed, for good.
    ("[queue]\nmax_attempts = 99999999999999999999\n", "[queue] max_attempts", "to 2147483647"),
    (
        '[reviewers.x]\nkind = "offline"\nconcurrency = 99999999999999999999\n',
        "[reviewers.x] concurrency",
        "to 2147483647",
    ),
    ("[queue]\nurl = 6379\n", "[queue] url", "expected a string"),
    ('[reviewers.x]\nkind = "offline"\npartition = 2\n', "[reviewers.x] partition", "string"),
    # Reviews under a partition `select --model` refuses to name, or one that the partition
    # written without the blanks never counted; "" stood for the default in silence.
    (
        '[reviewers.x]\nkind = "command"\ncommand = "r"\npartition = ""\n',
        "[reviewers.x] partition",
        "empty; name one, or leave the key out",
    ),
    ('[reviewers.x]\nkind = "claude"\nmodel = "  "\n', "[reviewers.x] model", "empty"),
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\npartition = "m "\n',
        "[reviewers.x] partition",
        "'m ' has blanks around it",
    ),
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\nexecutable = 2\n',
        "[reviewers.x] executable",
        "string",
    ),
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = ["u"]\n',
        "[reviewers.x] base_url",
        "string",
    ),
    # Taken as it was, it failed every attempt as an endpoint out of reach.
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "not a url"\n',
        "[reviewers.x] base_url",
        "'not a url' is not an http or https URL",
    ),
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "http://h:99999/v1"\n',
        "[reviewers.x] base_url",
        "is not an http or https URL: the port is not a number from 1 to 65535",
    ),
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:abc/v1"\n',
        "[reviewers.x] base_url",
        "is not an http or https URL: the port is not a number from 1 to 65535",
    ),
    # Port 0 passed, and every attempt failed as an endpoint out of reach.
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "http://127.0.0.1:0/v1"\n',
        "[reviewers.x] base_url",
        "is not an http or https URL: the port is not a number from 1 to 65535",
    ),
    # A CLI's flags, or a field reviewq sets: failed at every launch, or reviews recorded
    # under another model than the partition's.
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "http://h/v1"\n'
        'args = ["--temperature", "0"]\n',
        "[reviewers.x] args",
        "'--temperature' is not name=value",
    ),
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "http://h/v1"\n'
        'args = ["model=llama3:70b"]\n',
        "[reviewers.x] args",
        "'model' is a field reviewq sets itself",
    ),
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "http://h/v1"\n'
        'args = ["stream=true"]\n',
        "[reviewers.x] args",
        "'stream' is a field reviewq sets itself: it reads one whole answer, never a stream",
    ),
    # For a stream only: OpenAI and vLLM answer it with a 400, which was read as the
    # model's answer to the job and counted against it, every night.
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "http://h/v1"\n'
        "args = ['stream_options={\"include_usage\": true}']\n",
        "[reviewers.x] args",
        "'stream_options' is for a stream only",
    ),
    # A vendor CLI's flag reviewq sets, given again in args (which come last): another
    # model than the partition names (codex refused the second and failed every launch),
    # or the agent let out of its confinement.
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\nargs = ["--model", "opus"]\n',
        "[reviewers.x] args",
        "'--model' is a flag reviewq sets itself (the model: set the profile's model)",
    ),
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\nargs = ["-m", "o3"]\n',
        "[reviewers.x] args",
        "'-m' is a flag reviewq sets itself",
    ),
    (
        '[reviewers.x]\nkind = "gemini"\nmodel = "m"\nargs = ["--model=pro"]\n',
        "[reviewers.x] args",
        "'--model' is a flag reviewq sets itself",
    ),
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\nargs = ["--dangerously-skip-permissions"]\n',
        "[reviewers.x] args",
        "'--dangerously-skip-permissions' is a flag that lifts reviewq's confinement",
    ),
    (
        '[reviewers.x]\nkind = "gemini"\nmodel = "m"\nargs = ["--yolo"]\n',
        "[reviewers.x] args",
        "'--yolo' is a flag that lifts reviewq's confinement",
    ),
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\nargs = ["--sandbox", "danger-full-access"]\n',
        "[reviewers.x] args",
        "'--sandbox' is a flag that lifts reviewq's confinement",
    ),
    # The CLIs' parsers take a flag in other spellings than the list's: Codex's clap a
    # short flag's value in the same word, Gemini's yargs the camelCase name and a group.
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\nargs = ["-sdanger-full-access"]\n',
        "[reviewers.x] args",
        "'-s' is a flag that lifts reviewq's confinement",
    ),
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\nargs = ["-m=o3"]\n',
        "[reviewers.x] args",
        "'-m' is a flag reviewq sets itself",
    ),
    (
        '[reviewers.x]\nkind = "gemini"\nmodel = "m"\nargs = ["--approvalMode", "yolo"]\n',
        "[reviewers.x] args",
        "'--approvalMode' is a flag that lifts reviewq's confinement",
    ),
    # Claude starts the MCP servers and plugins these name: commands run outside the
    # permission rules (reviewq passes --strict-mcp-config to keep every other one out).
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\nargs = ["--mcp-config", "servers.json"]\n',
        "[reviewers.x] args",
        "'--mcp-config' is a flag that lifts reviewq's confinement",
    ),
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\nargs = ["--plugin-dir=./p"]\n',
        "[reviewers.x] args",
        "'--plugin-dir' is a flag that lifts reviewq's confinement",
    ),
    # Codex applies -c overrides in order, so a later one undoes reviewq's own: a
    # writable root (the KB), a notify program run outside the sandbox.
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\n'
        "args = ['-c', 'sandbox_workspace_write.writable_roots=[\"/kb\"]']\n",
        "[reviewers.x] args",
        "'-c sandbox_workspace_write.writable_roots' is a flag that lifts reviewq's confinement",
    ),
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\nargs = [\'--config=notify=["sh"]\']\n',
        "[reviewers.x] args",
        "'--config notify' is a flag that lifts reviewq's confinement",
    ),
    # ... and hooks, which Codex runs outside its sandbox once a person has trusted them.
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\nargs = ["-c", "features.hooks=true"]\n',
        "[reviewers.x] args",
        "'-c features.hooks' is a flag that lifts reviewq's confinement",
    ),
    # ... and an MCP server turned back on, a command Codex starts outside its sandbox.
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\nargs = ["-c", "mcp_servers.kb.enabled=true"]\n',
        "[reviewers.x] args",
        "'-c mcp_servers.kb.enabled' is a flag that lifts reviewq's confinement",
    ),
    # ... and a project trusted again, whose .codex/config.toml names MCP servers.
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\n'
        'args = ["-c", \'projects={"/kb"={trust_level="trusted"}}\']\n',
        "[reviewers.x] args",
        "'-c projects' is a flag that lifts reviewq's confinement",
    ),
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\nargs = ["--enable", "hooks"]\n',
        "[reviewers.x] args",
        "'--enable hooks' is a flag that lifts reviewq's confinement",
    ),
    # ... and plugins, whose MCP servers it starts outside its sandbox.
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\nargs = ["--enable", "plugins"]\n',
        "[reviewers.x] args",
        "'--enable plugins' is a flag that lifts reviewq's confinement",
    ),
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\nargs = ["-c", "features.plugins=true"]\n',
        "[reviewers.x] args",
        "'-c features.plugins' is a flag that lifts reviewq's confinement",
    ),
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\nargs = ["--enable=hooks"]\n',
        "[reviewers.x] args",
        "'--enable hooks' is a flag that lifts reviewq's confinement",
    ),
    # Codex's writable roots beside its workspace: the KB given, a fixer wrote the note
    # itself, past every check of a fix (the real CLI, C47).
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\nargs = ["--add-dir=/srv/kb"]\n',
        "[reviewers.x] args",
        "'--add-dir' is a flag that lifts reviewq's confinement",
    ),
    # ... and a Codex run that keeps no session log, where reviewq reads a killed run's
    # tokens and the calls Codex refused (a fixer's patch of the KB note went unsaid).
    (
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\nargs = ["--ephemeral"]\n',
        "[reviewers.x] args",
        "'--ephemeral' is a flag that keeps no session log of the run",
    ),
    (
        '[reviewers.x]\nkind = "gemini"\nmodel = "m"\nargs = ["-dy"]\n',
        "[reviewers.x] args",
        "'-y' is a flag that lifts reviewq's confinement",
    ),
    # Gemini's array flags add to reviewq's: a person's MCP server of the name allowed
    # started beside the review and wrote into the KB (the real CLI, B49).
    (
        '[reviewers.x]\nkind = "gemini"\nmodel = "m"\nargs = ["--allowed-mcp-server-names", "kb"]\n',
        "[reviewers.x] args",
        "'--allowed-mcp-server-names' is a flag that lifts reviewq's confinement",
    ),
    (
        '[reviewers.x]\nkind = "gemini"\nmodel = "m"\nargs = ["-e", "kbtools"]\n',
        "[reviewers.x] args",
        "'-e' is a flag that lifts reviewq's confinement",
    ),
    (
        '[reviewers.x]\nkind = "gemini"\nmodel = "m"\nargs = ["--adminPolicy", "/etc/p.toml"]\n',
        "[reviewers.x] args",
        "'--adminPolicy' is a flag that lifts reviewq's confinement",
    ),
    # ... and an output reviewq cannot read: a 401 and a 500 read as "exited 1 with no
    # turns" under a warning, and a review's turns, tokens and cost went unrecorded (B50).
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\nargs = ["--output-format", "text"]\n',
        "[reviewers.x] args",
        "'--output-format' is a flag reviewq sets itself (its output",
    ),
    (
        '[reviewers.x]\nkind = "gemini"\nmodel = "m"\nargs = ["-o", "text"]\n',
        "[reviewers.x] args",
        "'-o' is a flag reviewq sets itself (its output",
    ),
    # No program: every launch failed, said only by doctor ("not on PATH").
    (
        '[reviewers.x]\nkind = "command"\ncommand = ["", "{prompt_path}"]\n',
        "[reviewers.x] command",
        "its first word, the program to run, is empty",
    ),
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\nexecutable = " claude"\n',
        "executable",
        "blanks",
    ),
    ('[reviewers.x]\nkind = "codex"\nmodel = "m"\nexecutable = ""\n', "executable", "empty"),
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "http://h/v1"\napi_key_env = 1\n',
        "[reviewers.x] api_key_env",
        "string",
    ),
    ('[reviewers.x]\nkind = "offline"\nenv = 1\n', "[reviewers.x] env", "table of strings"),
    # Keys its kind never reads, taken in silence: a wrapper command never used, an
    # executable or endpoint the profile did not go to.
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\ncommand = ["wrap.sh"]\n',
        "[reviewers.x] command",
        "not read for kind 'claude' (only command)",
    ),
    (
        '[reviewers.x]\nkind = "command"\ncommand = ["a"]\nexecutable = "b"\n',
        "[reviewers.x] executable",
        "not read for kind 'command' (only claude, codex, gemini)",
    ),
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\nbase_url = "http://h/v1"\n',
        "[reviewers.x] base_url",
        "not read for kind 'claude' (only openai)",
    ),
    # Taken, and no kind but these can tell a dead endpoint from a slow answer: a command
    # that said "Connection refused" ran on to its deadline, burned out (E16).
    (
        '[reviewers.x]\nkind = "command"\ncommand = ["a"]\ntimeout = "4s"\n'
        'connect_timeout = "1s"\n',
        "[reviewers.x] connect_timeout",
        "not read for kind 'command' (only claude, codex, gemini, openai)",
    ),
    (
        '[reviewers.offline]\nkind = "offline"\nconnect_timeout = "1s"\n',
        "[reviewers.offline] connect_timeout",
        "not read for kind 'offline'",
    ),
    # Its agent reads no argument: a `--strict` given it changed nothing, without a word.
    (
        '[reviewers.offline]\nkind = "offline"\nargs = ["--strict"]\n',
        "[reviewers.offline] args",
        "not read for kind 'offline' (only claude, codex, gemini, command, openai)",
    ),
    # Its agent reports one turn and $0: a turn limit or a price (a copy of another
    # profile's) loaded and changed nothing (stop 48 left them).
    *(
        (
            f'[reviewers.offline]\nkind = "offline"\n{key} = 2\n',
            f"[reviewers.offline] {key}",
            "not read for kind 'offline' (only claude, codex, gemini, command, openai)",
        )
        for key in (
            "max_turns",
            "price_input_per_mtok",
            "price_output_per_mtok",
            "price_cached_input_per_mtok",
        )
    ),
    # The kind is judged before the value: told "must be shorter than timeout" (or that
    # a claude profile's base_url is no http URL), a person mended a key that was then
    # refused anyway, for a reason the first line had not said.
    (
        '[reviewers.x]\nkind = "command"\ncommand = ["a"]\ntimeout = "5m"\n'
        'connect_timeout = "10m"\n',
        "[reviewers.x] connect_timeout",
        "not read for kind 'command'",
    ),
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\nbase_url = "localhost:8080"\n',
        "[reviewers.x] base_url",
        "not read for kind 'claude' (only openai)",
    ),
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "http://h/v1"\n'
        'api_key_env = "sk-proj-abcdef123456"\n',
        "[reviewers.x] api_key_env",
        "names the variable that holds the key",
    ),
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\n'
        'env = { ANTHROPIC_API_KEY = "${ANTHROPIC_API_KEY}" }\n',
        "[reviewers.x] env",
        "ANTHROPIC_API_KEY: values are not expanded",
    ),
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\nenv = { PATH = "${PATH}:/opt/bin" }\n',
        "[reviewers.x] env",
        "PATH: values are not expanded",
    ),
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\nenv = { K = "$ANTHROPIC_API_KEY" }\n',
        "[reviewers.x] env",
        "K: values are not expanded",
    ),
    ('[queue]\nurl = "redis://h:6379/0?self=1"\n', "[queue] url", "self: not settings"),
    # Loaded, each failed every attempt as an endpoint out of reach and paused the profile:
    # urllib sends no credentials from a URL (it took "user:pw@h" for the host), and a
    # host or path with a space is no address a request can go to.
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "http://u:pw@h:8000/v1"\n',
        "[reviewers.x] base_url",
        "credentials in the URL (USER:PASSWORD@), which reviewq does not send",
    ),
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "http://my host:8000/v1"\n',
        "[reviewers.x] base_url",
        "a space or a control character",
    ),
    (
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "http://h:8000/my v1"\n',
        "[reviewers.x] base_url",
        "a space or a control character",
    ),
    # Values the OS refuses at launch: the worker's task crashed before the agent started,
    # and the job was "never picked up by a worker" again and again, for good.
    (
        '[reviewers.x]\nkind = "offline"\nenv = { X = "a\\u0000b" }\n',
        "[reviewers.x] env",
        "X: a NUL character",
    ),
    (
        '[reviewers.x]\nkind = "offline"\nenv = { "A=B" = "x" }\n',
        "[reviewers.x] env",
        "'A=B' is no variable name",
    ),
    ('[reviewers.x]\nkind = "offline"\nenv = { "" = "x" }\n', "[reviewers.x] env", "no variable"),
    (
        '[reviewers.x]\nkind = "command"\ncommand = ["a\\u0000b"]\n',
        "[reviewers.x] command",
        "a NUL character",
    ),
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\nargs = ["--x\\u0000"]\n',
        "[reviewers.x] args",
        "a NUL character",
    ),
    (
        '[reviewers.x]\nkind = "claude"\nmodel = "m"\nexecutable = "c\\u0000"\n',
        "[reviewers.x] executable",
        "a NUL character",
    ),
    # Values TOML allows that failed every tick or were silently no limit at all.
    ("[queue]\nreaper_seconds = inf\n", "[queue] reaper_seconds", "at most a year"),
    ("[queue]\nlease_seconds = nan\n", "[queue] lease_seconds", "more than 0 seconds"),
    # "1h30" read as 1 h 30 s: a bare number after a unit is not minutes.
    ('[reviewers.x]\nkind = "offline"\ntimeout = "1h30"\n', "[reviewers.x] timeout", "not a"),
    # Queue URLs whose mistakes surfaced as internal errors, a silent database 0, or a
    # worker waiting for good on "Too many connections".
    ('[queue]\nurl = "redis://localhost:notaport/0"\n', "[queue] url", "port"),
    ('[queue]\nurl = "redis://h:99999/0"\n', "[queue] url", "port"),
    (
        '[queue]\nurl = "redis://localhost:6379/0?foo=bar"\n',
        "[queue] url",
        "query parameter(s) foo: not settings of a Redis connection",
    ),
    ('[queue]\nurl = "redis://localhost:6379/abc"\n', "[queue] url", "database number"),
    ('[queue]\nurl = "redis://"\n', "[queue] url", "no host"),
    ('[queue]\nurl = "unix://"\n', "[queue] url", "no socket path"),
]
# [[sweeps]] entries: each left out, said in one warning line, not an error of the file.
BAD_SWEEPS = [
    ('[[sweeps]]\nname = "n"\ncorn = "* * * * *"\n', "[[sweeps]] 'n' corn", "unknown key"),
    ("sweeps = 3\n", "[[sweeps]]", "expected an array of tables"),
    ("[sweeps]\nname = 'n'\n", "[[sweeps]]", "expected an array of tables"),
    ("sweeps = [1]\n", "[[sweeps]] #1", "expected a table"),
    # `reviewq enqueue`'s default --name: a plain enqueue ran the entry instead.
    ('[[sweeps]]\nname = "cli"\n', "[[sweeps]] #1 name 'cli'", "from the command line"),
    ('[[sweeps]]\nname = "n"\nfix = "no"\n', "[[sweeps]] 'n' fix", "true or false"),
    ('[[sweeps]]\nname = "n"\nsequential = 1\n', "[[sweeps]] 'n' sequential", "true or false"),
    ('[[sweeps]]\nname = "n"\nall_gates = "yes"\n', "[[sweeps]] 'n' all_gates", "true or false"),
    ('[[sweeps]]\nname = "n"\ncurrent = 0\n', "[[sweeps]] 'n' current", "true or false"),
    ('[[sweeps]]\nname = "n"\nreviewer = 1\n', "[[sweeps]] 'n' reviewer", "string"),
    ('[[sweeps]]\nname = "n"\nfixer = []\n', "[[sweeps]] 'n' fixer", "string"),
    ('[[sweeps]]\nname = "n"\nauditor = 2\n', "[[sweeps]] 'n' auditor", "string"),
    ('[[sweeps]]\nname = "n"\ncron = 5\n', "[[sweeps]] 'n' cron", "string"),
    ('[[sweeps]]\nname = "n"\ngrouping = "lens"\n', "[[sweeps]] 'n' grouping", "not one of"),
    # `--note ''` is refused on the command line; here it named ROOT: every note.
    ('[[sweeps]]\nname = "n"\nnotes = [""]\n', "[[sweeps]] 'n' notes", "an empty entry"),
    ('[[sweeps]]\nname = "n"\nselect = ["prose", " "]\n', "[[sweeps]] 'n' select", "an empty"),
    ('[[sweeps]]\nname = "n"\naudit = ""\n', "[[sweeps]] 'n' audit", "an empty entry"),
    # A profile typo failed the cron run every night, said only in the control's log.
    (
        '[[sweeps]]\nname = "n"\ncron = "0 2 * * *"\nreviewer = "claude-sonet"\n',
        "[[sweeps]] 'n' reviewer",
        "no reviewer profile 'claude-sonet' (known: offline)",
    ),
    (
        '[[sweeps]]\nname = "n"\nfix = true\nfixer = "fx"\n',
        "[[sweeps]] 'n' fixer",
        "no reviewer profile 'fx'",
    ),
    (
        '[[sweeps]]\nname = "n"\nauditor = "au"\n',
        "[[sweeps]] 'n' auditor",
        "no reviewer profile 'au'",
    ),
    # Values TOML allows that failed every tick or were silently no limit at all.
    (
        '[[sweeps]]\nname = "n"\ncron = "0 1 31 2 *"\n',
        "[[sweeps]] 'n' cron '0 1 31 2 *'",
        "matches no date (such as 31 February)",
    ),
    # croniter's R drew a new random hour at every check: "once a day" fired 16 times in 48 h.
    ('[[sweeps]]\nname = "n"\ncron = "0 R * * *"\n', "[[sweeps]] 'n' cron", "'R' is not part"),
    ('[[sweeps]]\nname = "n"\ncron = "0 5-1 * * *"\n', "[[sweeps]] 'n' cron", "runs backwards"),
    ('[[sweeps]]\nname = "n"\ncron = "0 1 * * fri-mon"\n', "[[sweeps]] 'n' cron", "backwards"),
    ('[[sweeps]]\nname = "n"\ncron = "0 1 * * 1#2"\n', "[[sweeps]] 'n' cron", "'#' is not part"),
    ('[[sweeps]]\nname = "n"\ncron = "0 1 ? * *"\n', "[[sweeps]] 'n' cron", "'?' is not part"),
    # Which field, and why: it was "not a valid cron expression".
    (
        '[[sweeps]]\nname = "n"\ncron = "0 24 * * *"\n',
        "cron '0 24 * * *'",
        "hour 24 is out of range (0-23)",
    ),
    (
        '[[sweeps]]\nname = "n"\ncron = "60 1 * * *"\n',
        "[[sweeps]] 'n' cron",
        "minute 60 is out of range (0-59)",
    ),
    (
        '[[sweeps]]\nname = "n"\ncron = "0 1 0 * *"\n',
        "[[sweeps]] 'n' cron",
        "day of month 0 is out of range (1-31)",
    ),
    (
        '[[sweeps]]\nname = "n"\ncron = "0 1 * 1-13 *"\n',
        "[[sweeps]] 'n' cron",
        "month 13 is out of range (1-12)",
    ),
    (
        '[[sweeps]]\nname = "n"\ncron = "0 1 * * 8"\n',
        "[[sweeps]] 'n' cron",
        "weekday 8 is out of range (0-7)",
    ),
    (
        '[[sweeps]]\nname = "n"\ncron = "*/0 1 * * *"\n',
        "[[sweeps]] 'n' cron",
        "a step of 0 in the minute field",
    ),
    # cron(5)'s nicknames are taken (@daily); these name no time a sweep could run at.
    ('[[sweeps]]\nname = "n"\ncron = "@reboot"\n', "[[sweeps]] 'n' cron '@reboot'", "not when"),
    ('[[sweeps]]\nname = "n"\ncron = "@nightly"\n', "[[sweeps]] 'n' cron", "(@yearly, @annually"),
    ('[[sweeps]]\nname = "n"\nbudget_usd = nan\n', "[[sweeps]] 'n' budget_usd", "number ≥ 0"),
    ('[[sweeps]]\nname = "n"\nbudget_usd = inf\n', "[[sweeps]] 'n' budget_usd", "number ≥ 0"),
    ('[[sweeps]]\nname = "n"\nreviewer = ""\n', "[[sweeps]] 'n' reviewer", "empty"),
    # Loaded, it failed "nothing to select" at every cron minute, with a green doctor.
    (
        '[[sweeps]]\nname = "n"\ncron = "0 2 * * *"\nall_gates = false\n',
        "[[sweeps]] 'n'",
        "selects nothing: name gates in select, or all_gates = true",
    ),
    # As `--all-gates prose` on the command line: the bundle was silently dropped, every
    # gate reviewed each night.
    (
        '[[sweeps]]\nname = "n"\nall_gates = true\nselect = ["type", "prose"]\n',
        "[[sweeps]] 'n' select",
        "all_gates selects every catalog gate: name no bundle or gate id beside it ('prose')",
    ),
    ('[[sweeps]]\nname = "n"\nfixer = ""\n', "[[sweeps]] 'n' fixer", "empty"),
    ('[[sweeps]]\nname = "n\\u001b]0;T\\u0007"\n', "[[sweeps]] #1 name", "invisible character"),
]


@pytest.mark.parametrize(("text", "names", "reason"), BAD, ids=[b[1] + " " + b[2] for b in BAD])
def test_a_config_mistake_is_one_error_line_naming_file_key_and_reason(
    kb, run_cli, text, names, reason
):
    kb.write("reviewq.toml", text)
    res = run_cli("gates")
    assert res.exit_code == 1
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    line = lines[0]
    assert line.startswith(f"error: {kb.root / 'reviewq.toml'}"), line
    assert names in line and reason in line, line
    assert "Traceback" not in res.stderr


def test_a_base_url_with_a_password_is_refused_without_showing_it(kb, run_cli):
    kb.write(
        "reviewq.toml",
        '[reviewers.x]\nkind = "openai"\nmodel = "m"\nbase_url = "https://bob:Sekr3t@h/v1"\n',
    )
    res = run_cli("gates")
    assert res.exit_code == 1
    assert "Sekr3t" not in res.stderr and "https://bob:***@h/v1" in res.stderr, res.stderr
    assert "api_key_env" in res.stderr  # where a key goes instead


@pytest.mark.parametrize(
    ("text", "names", "reason"), BAD_SWEEPS, ids=[b[1] + " " + b[2] for b in BAD_SWEEPS]
)
def test_a_bad_sweeps_entry_is_one_warning_line_and_every_command_still_runs(
    kb, run_cli, text, names, reason
):
    """One bad [[sweeps]] entry was an error of the whole file: every command stopped,
    `status` at 7 a.m. included, and a control restarted in the night ran nothing. The
    entry is left out, said in one line naming the file, the entry and the reason; the
    other entries load."""
    good = '[[sweeps]]\nname = "good"\ncron = "0 3 * * *"\n'
    kb.write("reviewq.toml", text + good if text.startswith("[[sweeps]]") else text)
    res = run_cli("gates")
    assert res.exit_code == 0, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    line = lines[0]
    assert line.startswith(f"warning: {kb.root / 'reviewq.toml'}"), line
    assert names in line and reason in line, line
    assert line.endswith("(the entry is left out until it is fixed: no cron run, no run by name)")
    expected = ["good"] if text.startswith("[[sweeps]]") else []
    assert list(load_settings(kb.root).sweeps) == expected


def test_a_bad_sweeps_entry_is_refused_by_name_and_a_problem_for_doctor(kb, run_cli):
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.write(
        "reviewq.toml",
        '[[sweeps]]\nname = "n"\ncron = "0 3 * * *"\nreviewer = "claude-sonet"\n'
        '[[sweeps]]\nname = "twice"\n[[sweeps]]\nname = "twice"\nselect = ["prose"]\n',
    )
    cfg = kb.root / "reviewq.toml"
    why = f"{cfg} [[sweeps]] 'n' reviewer: no reviewer profile 'claude-sonet' (known: offline)"
    twice = f"{cfg} [[sweeps]] 'twice': defined twice; neither runs until one is renamed"
    res = run_cli("enqueue", "--name", "n")
    assert res.exit_code == 1
    assert res.stderr.splitlines()[-1] == (
        f"error: {why}; fix the entry, or name gates to run an ad-hoc sweep under its name"
    )
    assert run_cli("enqueue", "--name", "twice").exit_code == 1
    res = run_cli("enqueue", "--name", "n", "prose")  # ad hoc, under its name: runs
    assert res.exit_code == 0, res.stderr
    res = run_cli("doctor")
    assert res.exit_code == 1
    left_out = "(the entry is left out until it is fixed: no cron run, no run by name)"
    problems = [line for line in res.stdout.splitlines() if line.startswith("problem: ")]
    assert problems[:2] == [f"problem: {why} {left_out}", f"problem: {twice} {left_out}"]
    assert load_settings(kb.root).sweeps == {}


def test_a_sweeps_entry_that_reads_a_status_no_note_has_is_a_problem_for_doctor(kb, run_cli):
    """`current = true` on a KB that keeps no status: field selected nothing at every cron
    run, and nothing said so (`select --current` warns of it; the control's run, no one)."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.write("reviewq.toml", '[[sweeps]]\nname = "n"\ncron = "0 3 * * *"\ncurrent = true\n')
    res = run_cli("doctor")
    assert res.exit_code == 1
    assert (
        f"problem: {kb.root / 'reviewq.toml'}: [[sweeps]] 'n' current: no note has a status: "
        "field, which current = true reads (status: current): the entry selects nothing\n"
    ) in res.stdout, res.stdout
    kb.note("beta", status="current")  # one note keeps it: the entry selects that one
    assert "problem:" not in run_cli("doctor").stdout


def test_a_sweeps_batch_size_with_note_grouping_is_one_warning_line_not_dropped(kb, run_cli):
    """The entry's batch_size was ignored without a word (one job per note and lens), as
    --batch-size was on the command line (F38). The entry still runs, as it would
    without the key; an entry with gate grouping uses it."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.write(
        "reviewq.toml",
        '[[sweeps]]\nname = "n"\ncron = "0 3 * * *"\nbatch_size = 20\n'
        '[[sweeps]]\nname = "g"\ngrouping = "gate"\nbatch_size = 20\n',
    )
    said = (
        f"warning: {kb.root / 'reviewq.toml'} [[sweeps]] 'n' batch_size: notes per job with "
        'grouping = "gate" only; grouping "note" makes one job per note and lens, so it is '
        "not used"
    )
    res = run_cli("gates")
    assert (res.exit_code, res.stderr.splitlines()) == (0, [said])
    assert sorted(load_settings(kb.root).sweeps) == ["g", "n"]
    res = run_cli("doctor")
    assert said in res.stdout.splitlines()
    res = run_cli("enqueue", "--name", "n")
    assert res.exit_code == 0 and said in res.stderr.splitlines(), res.stderr


def test_a_config_with_every_documented_key_loads(kb):
    kb.write(
        "reviewq.toml",
        '[kb]\nnote_roots = ["kb/notes", "kb/more"]\n[state]\ndir = "st"\n'
        "[limits]\nmax_output_bytes = 1024\nmax_note_bytes = 2048\n"
        '[queue]\nlease_seconds = "2m"\n'
        '[reviewers.x]\nkind = "command"\ncommand = ["a", "{prompt_path}"]\n'
        '[reviewers.y]\nkind = "claude"\nmodel = "m"\nexecutable = "/opt/claude"\n'
        '[[sweeps]]\nname = "n"\nfix = true\nsequential = false\nreviewer = "x"\n'
        'cron = "0 3 * * *"\n',
    )
    s = load_settings(kb.root)
    assert s.note_roots == ("kb/notes", "kb/more")
    assert s.state_dir == (kb.root / "st").resolve()
    assert s.max_output_bytes == 1024 and s.queue.lease_seconds == 120.0
    assert s.max_note_bytes == 2048
    assert s.sweeps["n"].fix is True and s.sweeps["n"].reviewer == "x"


def test_load_settings_raises_config_error_not_attribute_error(kb):
    kb.write("reviewq.toml", "kb = 1\n")
    with pytest.raises(ConfigError, match=r"\[kb\]: expected a table"):
        load_settings(kb.root)


def test_an_empty_state_folder_name_is_refused(kb):
    # It put state.db, jobs/ and logs/ in the root beside kb/, and the state folder that
    # held the night's escalations dropped out of view.
    kb.write("reviewq.toml", '[state]\ndir = ""\n')
    with pytest.raises(ConfigError, match=r"\[state\] dir: empty"):
        load_settings(kb.root)


def test_a_config_path_that_is_a_folder_is_one_error_line(kb, run_cli):
    (kb.root / "conf").mkdir()
    res = run_cli("--config", str(kb.root / "conf"), "gates")
    assert res.exit_code == 1
    assert res.stderr.splitlines() == [
        f"error: --config {kb.root / 'conf'}: a folder; reviewq reads its settings from a TOML file"
    ]


def test_a_config_path_to_no_file_names_the_option(kb, run_cli):
    """'/missing: no such file' named the file but not where it came from."""
    res = run_cli("--config", str(kb.root / "missing.toml"), "gates")
    assert (res.exit_code, res.stderr) == (
        1,
        f"error: --config {kb.root / 'missing.toml'}: no such file\n",
    )


@pytest.mark.parametrize("option", ["--config", "--root", "--state"])
def test_a_terminal_escape_in_a_path_option_is_shown_escaped_in_its_refusal(kb, run_cli, option):
    """`--config` (or `--root`) with a terminal escape in it printed its refusal with the
    escape raw, recolouring the terminal, where every other refusal shows a name escaped
    (``logs.one_line``). A runner strips a raw escape from what it captures, so its
    escaped form is what is looked for."""
    where = kb.root / "x\x1b[31mred"
    if option == "--state":
        where.write_text("")  # a file where the state folder goes: "not a folder"
    res = run_cli(option, str(where), "status")
    assert res.exit_code == 1
    assert res.stderr.count("\n") == 1 and "x\\x1b[31mred" in res.stderr, res.stderr


@pytest.mark.parametrize("kind", ["fifo", "dangling symlink", "not utf-8"])
def test_a_settings_file_that_cannot_be_read_as_text_is_one_error_line(kb, run_cli, kind):
    """A FIFO as reviewq.toml held every command for good; a symbolic link to nothing was
    taken for no settings at all (a KB swept with the defaults); bytes that are not UTF-8
    gave the codec's own words."""
    import os

    path = kb.root / "reviewq.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling symlink":
        path.symlink_to(kb.root / "gone.toml")
    else:
        path.write_bytes(b"[queue]\npoll_seconds = 1 # \xff\n")
    res = run_cli("status")
    assert res.exit_code == 1
    assert res.stderr.splitlines() == [
        {
            "fifo": f"error: {path}: not a regular file; reviewq reads its settings from a TOML file",
            "dangling symlink": f"error: {path}: a symbolic link to {kb.root / 'gone.toml'}, which does not exist",
            "not utf-8": f"error: {path}: not UTF-8 text (byte 28)",
        }[kind]
    ]


def test_a_settings_file_saved_with_a_byte_order_mark_loads(kb):
    """Editors on Windows save UTF-8 with a BOM: tomllib took it for a statement, and every
    command said "Invalid statement (at line 1, column 1)" of a line that looks right.
    Notes and outputs with one are read as text already."""
    kb.write("reviewq.toml", "\ufeff[queue]\r\nlease_seconds = 300\r\n")
    assert load_settings(kb.root).queue.lease_seconds == 300


@pytest.mark.parametrize("command", ["status", "enqueue"])
def test_a_state_path_that_is_a_file_is_one_error_line(kb, run_cli, command):
    (kb.root / "f").write_text("")
    res = run_cli("--state", str(kb.root / "f"), command)
    assert res.exit_code == 1
    assert res.stderr.splitlines() == [f"error: --state {kb.root / 'f'}: not a folder"]


@pytest.mark.parametrize("given", ["default", "--state", "a folder above it"])
def test_a_state_folder_linked_to_a_disk_not_mounted_starts_no_new_record(
    kb, run_cli, tmp_path, given
):
    """ROOT/.reviewq a link to a folder on a disk that is not mounted (its mount point
    there, empty): the link was resolved and the folder it names made, on the disk under
    the mount point, and `enqueue` started a new record there: every pair queued again
    for agents to be paid for, and the real record hidden until the disk came back."""
    kb.note("alpha")
    kb.gate("prose/body-check", ["body"])
    mount = tmp_path / "mnt"
    mount.mkdir()  # the mount point, the disk not mounted on it
    if given == "a folder above it":
        (tmp_path / "data").symlink_to(mount / "data")
        state, link, option = tmp_path / "data" / "reviewq", tmp_path / "data", ["--state"]
        where = f"--state {state}"
    else:
        kb.state.symlink_to(mount / "reviewq")
        state, link, option = kb.state, kb.state, ["--state"] if given == "--state" else []
        where = f"--state {state}" if option else f"{kb.root / 'reviewq.toml'} [state] dir {state}"
    for command in (("enqueue", "--all-gates"), ("status",), ("doctor",)):
        res = run_cli(*option, *([str(state)] if option else []), *command)
        assert res.exit_code == 1, (command, res.stdout, res.stderr)
        assert res.stderr.splitlines() == [
            f"error: {where}: {link} is a symbolic link to {os.readlink(link)}, which does "
            "not exist (a disk not mounted?); mount or make what it links to"
        ], command
    assert list(mount.iterdir()) == []


def test_a_log_folder_that_cannot_be_made_is_one_error_line(kb, run_cli):
    kb.state.mkdir()
    (kb.state / "logs").write_text("a file where the log folder belongs\n")
    res = run_cli("create-jobs", "--grouping", "note", "--input", "-", input="{}")
    assert res.exit_code == 1
    assert res.stderr.splitlines() == [
        f"error: {kb.state / 'logs'}: cannot open the log: File exists"
    ]


@pytest.mark.parametrize("command", ["status", "select"])
def test_a_root_that_is_not_a_folder_is_one_error_line(tmp_path, run_cli, command):
    # A mistyped --root used to print an empty status, as if the KB had nothing in it.
    missing = tmp_path / "no-such-kb"
    res = run_cli("--root", str(missing), command)
    assert res.exit_code == 1
    assert res.stderr.splitlines() == [f"error: --root {missing}: not a folder"]
    assert not missing.exists()


@pytest.mark.parametrize(
    "args",
    [("enqueue", "prose"), ("report",), ("export",), ("control",), ("decide", "1", "approve")],
)
def test_a_command_run_outside_a_kb_root_says_so_and_makes_nothing(tmp_path, run_cli, args):
    # Each left a .reviewq/ in the folder (`export` a kb/reports/, `report` a page),
    # and `control` ran all night over nothing.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = run_cli("--root", str(elsewhere), *args)
    assert res.exit_code == 1
    assert res.stderr.splitlines() == [
        f"error: {elsewhere}: no kb/ folder here (is --root the folder that holds kb/?)"
    ]
    assert list(elsewhere.iterdir()) == []


def test_a_commands_help_is_printed_anywhere_and_makes_nothing(tmp_path, run_cli):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = run_cli("--root", str(elsewhere), "enqueue", "--help")
    assert res.exit_code == 0 and res.stdout.startswith("Usage: ")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("command", ["enqueue", "sweep"])
def test_the_help_of_name_says_it_runs_a_sweeps_entry(run_cli, command):
    """`--name` alone runs a [[sweeps]] entry now (OPERATIONS §2), where its help said only
    "The sweep's name in logs.": a person looking for how to run tonight's sweep now
    found no option for it."""
    res = run_cli(command, "--help")
    assert "the [[sweeps]] entry of that name" in " ".join(res.stdout.split())


def test_no_commands_help_says_none_of_a_range(run_cli):
    """P72: `--budget-usd`, a number with no bound (its check says "0 or more"), was
    printed by click as "--budget-usd NUMBER  Start no new attempt … reaches it.
    [x<=None]" in `enqueue --help` and `sweep --help`."""
    import click

    from orchestrator.cli import cli

    names = cli.list_commands(click.Context(cli))
    assert "sweep" in names
    said = {name: run_cli(name, "--help").stdout for name in names}
    assert {name: text for name, text in said.items() if "None" in text} == {}


def _immutable(path) -> bool:
    """chattr +i: even root cannot write it (tests run as root, where modes do not stop it)."""
    import shutil
    import subprocess

    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


def test_a_state_folder_that_cannot_be_written_is_named_as_such(kb, run_cli):
    """It read "not a reviewq database" (a folder) or "another process holds it" (the
    file): the first sends an operator to repair the one file they must not lose."""
    import subprocess

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    assert run_cli("enqueue", "prose").exit_code == 0
    for leftover in ("state.db-wal", "state.db-shm"):
        (kb.state / leftover).unlink(missing_ok=True)
    # (`status`, which only reads, reads such a folder: S55.)
    for target, command, says in (
        (kb.state, "resume", "cannot be opened for writing (unable to open database file)"),
        (kb.state / "state.db", "report", "cannot be written here (attempt to write a readonly"),
    ):
        if not _immutable(target):
            pytest.skip("chattr +i is not available on this file system")
        try:
            res = run_cli(command, *(["offline"] if command == "resume" else []))
        finally:
            subprocess.run(["chattr", "-i", str(target)], check=True)
        assert res.exit_code == 1 and says in res.stderr, res.stderr
        assert "not a reviewq database" not in res.stderr


def test_a_log_that_cannot_be_opened_is_one_error_line_and_changes_nothing(kb):
    """The log is opened on its first line: a command past its check printed two
    chained tracebacks and went on (the jobs queued), and the control crashed."""
    from .conftest import reviewq_process

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    assert reviewq_process("--root", str(kb.root), "enqueue", "prose").returncode == 0
    log = kb.state / "logs" / "reviewq.jsonl"
    if not _immutable(log):
        pytest.skip("chattr +i is not available here")
    try:
        for args in (("enqueue", "--all-gates"), ("control",)):
            res = reviewq_process("--root", str(kb.root), *args, timeout=60)
            assert res.returncode == 1, res.stderr
            assert res.stderr.splitlines() == [
                f"error: {log}: cannot open the log: Operation not permitted"
            ], res.stderr
    finally:
        subprocess.run(["chattr", "-i", str(log)], check=True)
    res = reviewq_process("--root", str(kb.root), "jobs", "--json")
    assert len(json.loads(res.stdout)["jobs"]) == 1  # the refused enqueue queued nothing


def test_a_log_that_cannot_be_written_is_said_once_and_the_work_goes_on(kb):
    """A full disk under the log: logging printed a traceback for every line."""
    from .conftest import reviewq_process

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.note("beta")
    log = kb.state / "logs" / "reviewq.jsonl"
    log.parent.mkdir(parents=True)
    log.symlink_to("/dev/full")
    res = reviewq_process("--root", str(kb.root), "enqueue", "prose")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "Logging error" not in res.stderr
    warned = [x for x in res.stderr.splitlines() if "cannot write the log" in x]
    assert warned == [f"warning: {log}: cannot write the log (No space left on device)"]


def test_a_file_another_user_owns_is_one_line_not_an_internal_error():
    """An operator who is not the service user ran `reviewq status`: "internal error:
    PermissionError … (please report it)" for a plain permission problem."""
    import click

    from orchestrator.cli.common import refuse_domain_errors

    @refuse_domain_errors
    def status() -> None:
        raise PermissionError(13, "Permission denied", "/srv/kb/.reviewq/state.db")

    with pytest.raises(click.ClickException) as caught:
        status()
    assert caught.value.format_message() == (
        "/srv/kb/.reviewq/state.db: Permission denied (run reviewq as a user who may read and "
        "write the state folder and the KB)"
    )


def test_output_to_a_full_disk_is_one_line_naming_stdout(kb):
    """From cron, `reviewq report >> morning.txt` on a full disk (here /dev/full): "internal
    error: OSError: [Errno 28] … (please report it)", then Python's "Exception ignored"."""
    import sys

    from .conftest import reviewq_process

    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    assert reviewq_process("--root", str(kb.root), "enqueue", "prose").returncode == 0
    exe = str(Path(sys.executable).parent / "reviewq")
    for args in (
        ["status"],
        ["report"],
        ["report", "--json"],
        ["logs"],
        ["select", "prose", "--json"],
    ):
        with open("/dev/full", "w") as full:
            res = subprocess.run(
                [exe, "--root", str(kb.root), *args],
                stdout=full,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                timeout=60,
            )
        assert res.returncode == 1, (args, res.stderr)
        assert res.stderr.splitlines() == [
            "error: cannot write the output to stdout: No space left on device"
        ], args


def _one_job_for_a_user_bound_by_modes(kb):  # noqa: ANN001, ANN202 - a fixture
    """A KB with one queued job, and a runner of reviewq commands on it as a process
    without CAP_DAC_OVERRIDE, which file modes bind as they bind any user."""
    import sys

    from .conftest import bound_by_file_modes, reviewq_process

    wrap = bound_by_file_modes()
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    assert reviewq_process("--root", str(kb.root), "enqueue", "prose").returncode == 0
    exe = str(Path(sys.executable).parent / "reviewq")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*wrap, exe, "--root", str(kb.root), *args],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )

    return run


def test_a_state_folder_another_user_owns_is_one_line_in_every_command(kb):
    """The 7 a.m. look as another user than the service's (a state folder of mode 0700):
    `status`, `report`, `escalations`, `decide` said "internal error: PermissionError …
    (please report it)": the group's look for state.db ran outside the commands' guard.
    As root, the process runs without CAP_DAC_OVERRIDE, so the mode holds for it too."""
    as_bound = _one_job_for_a_user_bound_by_modes(kb)
    kb.state.chmod(0)
    try:
        for args in (["status"], ["report"], ["escalations"], ["decide", "1", "approve"]):
            res = as_bound(*args)
            assert res.returncode == 1, (args, res.stderr)
            assert res.stderr.splitlines() == [
                f"error: {kb.state / 'state.db'}: Permission denied (run reviewq as a user "
                "who may read and write the state folder and the KB)"
            ], args
    finally:
        kb.state.chmod(0o700)


def test_the_commands_that_only_read_read_a_state_folder_they_may_not_write(kb):
    """`status` (and `escalations`, `jobs`, `job N`) on a state folder the user may read
    and not write (a read-only mount, a copy of the service's, mode 0555) said "reviewq
    needs write access to the state folder, even to read it": SQLite's WAL wants its -shm
    file, which such a folder cannot take, and reading needs none. As root, the process
    runs without CAP_DAC_OVERRIDE, so the modes hold for it too."""
    as_bound = _one_job_for_a_user_bound_by_modes(kb)
    modes = {p: p.stat().st_mode for p in [kb.state, *kb.state.rglob("*")]}
    for path in modes:
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        for args in (["status"], ["escalations"], ["jobs"], ["job", "1"]):
            res = as_bound(*args)
            assert (res.returncode, res.stderr) == (0, ""), args
        assert "jobs: queued 1" in res.stdout or "job 1: queued" in res.stdout, res.stdout
    finally:
        for path, mode in modes.items():
            path.chmod(mode)
    assert not (kb.state / "state.db-shm").exists()  # nothing was written to it


def test_good_queue_urls_and_durations_load(kb):
    for url in (
        "redis://localhost:6379/0",
        "redis://:secret@10.0.0.5/3",
        "rediss://user:pw@redis.example:6380",
        "unix:///run/redis.sock",
        "unix:///run/redis.sock?db=2",
        # TLS with a private CA, a timeout: settings the Redis client takes from the URL.
        "rediss://h:6380/0?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.pem",
        "redis://h:6379/0?socket_timeout=5",
        "redis://h:6379/0?max_connections=10",
    ):
        kb.write("reviewq.toml", f'[queue]\nurl = "{url}"\n')
        assert load_settings(kb.root).queue.url == url
    for text, seconds in (("1h30m", 5400), ("90s", 90), ("90", 90), ("2d", 172800), ("1.5h", 5400)):
        kb.write("reviewq.toml", f'[reviewers.x]\nkind = "offline"\ntimeout = "{text}"\n')
        assert load_settings(kb.root).reviewers["x"].timeout == seconds, text


def test_a_state_folder_under_home_is_read_as_such(kb, monkeypatch, tmp_path):
    """`dir = "~/reviewq-state"` made a folder named `~` inside ROOT."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    kb.write("reviewq.toml", '[state]\ndir = "~/reviewq-state"\n')
    assert load_settings(kb.root).state_dir == tmp_path / "home" / "reviewq-state"


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ('[kb]\nnote_roots = ["kb"]\n', "note root kb: overlaps kb/instructions/review-gates"),
        ('[state]\ndir = "kb/notes/state"\n', "lies in the note root kb/notes"),
        # Beside the notes, in a folder agents must leave alone: every review failed on
        # reviewq's own files (its prompts, outputs, escalation reports).
        ('[state]\ndir = "kb/state"\n', "lies in kb/, which agents must leave alone"),
    ],
    ids=["root-holds-the-gates", "state-in-a-note-root", "state-in-the-kb"],
)
def test_doctor_refuses_the_note_roots_that_select_refuses(kb, run_cli, toml, says):
    """Doctor checked only that the folder is there: ok to a root every sweep refused,
    and to a state folder whose prompts and reports were selected as notes and fixed."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.write("reviewq.toml", toml)
    res = run_cli("doctor")
    assert res.exit_code == 1
    assert any(line.startswith("problem: ") and says in line for line in res.stdout.splitlines())
    for args in (("select", "--all-gates", "--json"), ("enqueue", "--all-gates")):
        res = run_cli(*args)
        assert res.exit_code == 1 and says in res.stderr, res.stderr


def test_a_hidden_state_folder_in_a_note_root_is_no_problem(kb, run_cli):
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.write("reviewq.toml", '[state]\ndir = "kb/notes/.reviewq"\n')
    assert run_cli("select", "--all-gates", "--json").exit_code == 0


def test_a_redis_queue_without_the_redis_package_is_one_line_before_anything(kb):
    """Installed without [redis], control, worker and enqueue ended in "internal error:
    ConfigurationError", an enqueue after recording its jobs."""
    import sys

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    kb.write("reviewq.toml", '[queue]\nurl = "redis://127.0.0.1:1/0"\n')
    without = (
        "import sys; sys.modules['redis'] = None; from orchestrator.cli import main; "
        f"sys.argv = ['reviewq', '--root', {str(kb.root)!r}, 'enqueue', '--all-gates']; main()"
    )
    res = subprocess.run([sys.executable, "-c", without], capture_output=True, text=True)
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        f"error: {kb.root / 'reviewq.toml'} [queue] url: a Redis queue needs the redis "
        "package: pip install 'reviewq[redis]'"
    ], res.stderr
    assert not (kb.state / "state.db").exists()


def test_doctor_names_what_in_the_state_folder_cannot_be_written(kb, run_cli):
    """Doctor said all was well of a state folder whose lock and job folders the user
    could not write; the control then crashed at its start."""
    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    assert run_cli("enqueue", "prose").exit_code == 0
    (kb.state / "control.lock").write_text("")
    (kb.state / "run").mkdir()  # run-job's registry of the agents it runs
    targets = [kb.state / "jobs", kb.state / "control.lock", kb.state / "run"]
    if not all(_immutable(t) for t in targets):
        pytest.skip("chattr +i is not available here")
    try:
        res = run_cli("doctor")
    finally:
        for t in targets:
            subprocess.run(["chattr", "-i", str(t)], check=True)
    assert res.exit_code == 1
    for t in targets:
        assert f"problem: {t} cannot be written by this user" in res.stdout, res.stdout


def test_an_env_value_with_a_dollar_sign_of_its_own_loads(kb):
    """A literal password such as "$ecret99" was refused as an unexpanded $NAME."""
    kb.write("reviewq.toml", '[reviewers.x]\nkind = "offline"\nenv = { PW = "$ecret99" }\n')
    assert load_settings(kb.root).reviewers["x"].env == {"PW": "$ecret99"}


def test_a_log_that_cannot_be_created_is_one_line_too(kb):
    """The check opened only an existing log: with the logs folder made read-only and no
    log yet, enqueue committed its jobs and then failed; a dangling link as the log gave
    two tracebacks."""
    from .conftest import reviewq_process

    kb.gate("prose/clarity", ["body"])
    kb.note("alpha")
    logs_dir = kb.state / "logs"
    logs_dir.mkdir(parents=True)
    if not _immutable(logs_dir):
        pytest.skip("chattr +i is not available here")
    try:
        res = reviewq_process("--root", str(kb.root), "enqueue", "--all-gates")
    finally:
        subprocess.run(["chattr", "-i", str(logs_dir)], check=True)
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        f"error: {logs_dir / 'reviewq.jsonl'}: cannot open the log: cannot be created here"
    ], res.stderr
    assert not (kb.state / "state.db").exists()
    (logs_dir / "reviewq.jsonl").symlink_to("/nonexistent/reviewq.jsonl")
    res = reviewq_process("--root", str(kb.root), "enqueue", "--all-gates")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.splitlines() == [
        f"error: {logs_dir / 'reviewq.jsonl'}: cannot open the log: No such file or directory"
    ], res.stderr
    assert not (kb.state / "state.db").exists()


def test_note_roots_are_normalised():
    """`./wiki/` was kept as written: the folder watched while agents ran was `.`, all of
    ROOT, and with a state folder there every review failed on its own output."""
    import tempfile
    from pathlib import Path

    from orchestrator.config import load_settings

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "reviewq.toml").write_text('[kb]\nnote_roots = ["kb/notes", "./wiki/"]\n')
        assert load_settings(Path(d)).note_roots == ("kb/notes", "wiki")


def test_a_codex_profile_with_the_operations_provider_args_loads(kb, run_cli):
    """OPERATIONS' own -c overrides (another provider, no analytics) are not reviewq's."""
    kb.write(
        "reviewq.toml",
        '[reviewers.x]\nkind = "codex"\nmodel = "m"\n'
        "args = ['-c', 'model_provider=\"mine\"', '-c', "
        '\'model_providers.mine={name="mine", base_url="https://h/v1"}\', '
        "'-c', 'analytics.enabled=false', '--config=otel.metrics_exporter=\"none\"']\n",
    )
    res = run_cli("gates")
    assert res.exit_code == 0, res.stderr


@pytest.mark.parametrize(
    ("glob", "path", "matches"),
    [
        # '[!]a]' (any letter but ']' and 'a') was the regex '[^/]a]': a class, then "a]".
        ("[!]a].md", "b.md", True),
        ("[!]a].md", "a.md", False),
        ("[]a].md", "].md", True),
        # '[' and '&&' in a class are letters, not a nested set or a set operation.
        ("[[].md", "[.md", True),
        ("[a&&b].md", "&.md", True),
        ("[^a].md", "^.md", True),
        ("[^a].md", "b.md", False),
        ("[!a-c].md", "d.md", True),
        ("x?.md", "x/.md", False),
        # A name with a newline in it is under templates/ too.
        ("templates/**", "templates/a\nb.md", True),
    ],
)
def test_an_exclude_glob_matches_as_documented(glob, path, matches):
    """[kb] exclude's classes are a glob's, whatever letters they hold (OPERATIONS §2)."""
    import warnings

    from orchestrator.config import glob_regex

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 'Possible nested set' was printed at every command
        assert bool(glob_regex(glob).fullmatch(path)) is matches


def test_a_queue_password_is_redacted_as_the_file_writes_it_and_as_redis_gets_it(kb):
    """A password with a character a URL must escape (``@``, ``/``, ``+``) is written
    ``%40``…: the user part's was taken as written and the query's as decoded, so an agent
    quoting the settings file (it reads the KB root) or a client printing what it sent
    left the other form in clear."""
    from orchestrator import logs

    kb.write(
        "reviewq.toml",
        '[queue]\nurl = "redis://rq:u%40ser-Secret-81@127.0.0.1:1/0?password=q%2Fuery-Secret-82"\n',
    )
    load_settings(kb.root)
    for form in ("u%40ser-Secret-81", "u@ser-Secret-81", "q%2Fuery-Secret-82", "q/uery-Secret-82"):
        assert logs.redact(f"said {form}.") == "said [redacted].", form


@pytest.mark.parametrize(
    "url",
    [
        "redis://:Hunter?2-secret@127.0.0.1:6379/0",
        "redis://rq:Hunter/2-secret@127.0.0.1:6379/0",
        "rediss://rq:Hunter#2-secret@127.0.0.1:6379/0",
        "redis://rq:1234/Hunter-secret@127.0.0.1:6379/0",
        "redis://:Hunter?x=2-secret@127.0.0.1:6379/0",
        "unix://rq:Hunter/2-secret@/run/redis/redis.sock",
        "unix://:1234/Hunter-secret@/run/redis/redis.sock",
        "unix://:Hunter#2-secret@/run/redis/redis.sock",
    ],
    ids=[
        "question-mark",
        "slash",
        "hash",
        "digits-then-slash",
        "question-mark-then-equals",
        "socket-slash",
        "socket-digits-then-slash",
        "socket-hash",
    ],
)
def test_a_password_a_url_must_escape_is_refused_without_any_of_it(kb, run_cli, url):
    """A password holding ``/``, ``?`` or ``#`` as it is ends the URL's host part there:
    the refusal quoted its head as a port ("cast to integer value as 'Hunter'"), or the
    URL went on and every line about the queue printed it whole (the host "rq")."""
    kb.gate("prose/clarity", ["body"])
    kb.write("reviewq.toml", f'[queue]\nurl = "{url}"\n')
    res = run_cli("status")
    assert res.exit_code == 1
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: {kb.root / 'reviewq.toml'} [queue] url: "), line
    assert "%2F" in line and "Hunter" not in line and "secret" not in line, line


@pytest.mark.parametrize(
    "url",
    [
        "rediss://h:6380/0?ssl_ca_certs=/etc/a@b/ca.crt",
        "unix:///run/a@b/redis.sock?db=1",
        "unix://:pw@/run/a@b/redis.sock",
        "redis://[::1]:6379/0",
    ],
)
def test_an_at_sign_in_a_query_value_is_no_password_cut_short(kb, url):
    kb.write("reviewq.toml", f'[queue]\nurl = "{url}"\n')
    assert load_settings(kb.root).queue.url == url


@pytest.mark.parametrize(
    ("table", "where"),
    [
        (
            '[reviewers."ev\\u001b]0;PWNED\\u0007il"]\nkind = "offline"\n',
            "[reviewers.'ev\\x1b]0;PWNED\\x07il']",
        ),
        ('[reviewers.r]\nkind = "offline"\npartition = "p\\u202eq"\n', "[reviewers.r] partition"),
        (
            '[reviewers.r]\nkind = "command"\ncommand = ["x"]\nmodel = "m\\u009b2J"\n',
            "[reviewers.r] model",
        ),
    ],
)
def test_a_name_that_would_move_the_terminal_is_refused_where_it_is_written(kb, table, where):
    """A reviewer's name, partition or model (and a sweep's name: BAD_SWEEPS) is shown by doctor,
    status, jobs, escalations and the report as they are: written with an escape in
    reviewq.toml (TOML's \\u001b), `doctor` retitled the operator's window (OSC 0), and a
    right-to-left override turned the line around it. Refused as `--runner` is (M18)."""
    from .conftest import reviewq_process

    kb.write("reviewq.toml", table)
    res = reviewq_process("--root", str(kb.root), "doctor", timeout=60)
    assert "\x1b" not in res.stdout + res.stderr
    assert res.returncode == 1, res.stdout
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: {kb.root / 'reviewq.toml'} {where}: "), line
    assert "a control or invisible character" in line, line


def test_a_name_in_any_script_is_taken_as_it_is_written(kb):
    """The refusal of a name that moves the terminal took every character Python calls
    unprintable: a Persian reviewer's name holds a zero-width non-joiner (its half-space),
    an emoji a zero-width joiner, a French one a no-break space before its colon, so a
    reviewq.toml that named them stopped loading. Only what a reader cannot see as writing
    is refused (the test above); these load, under the names they were given."""
    names = ["بازبین‌ارشد", "👩‍💻", "🩷", "revisión", "审阅者", "note\u00a0: relue", "סוקר‏"]
    kb.write(
        "reviewq.toml",
        "".join(f'[reviewers."{n}"]\nkind = "offline"\npartition = "{n}"\n' for n in names)
        + '[[sweeps]]\nname = "مرور‌ها"\nall_gates = true\n',
    )
    settings = load_settings(kb.root)
    assert [settings.reviewers[n].partition for n in names] == names
    assert list(settings.sweeps) == ["مرور‌ها"], settings.sweeps_left_out
