"""``reviewq``: a thin click CLI over the core. Commands parse, call one core function,
print, and turn domain errors into one ``error:`` line with exit code 1.

The commands live in :mod:`.review`, :mod:`.queue` and :mod:`.report`; the group of
:mod:`.common` imports the one a command is in when it is asked for, which registers it."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import os
import signal
import sys
from typing import NoReturn

import click

from orchestrator import logs
from orchestrator.cli.common import cli

__all__ = ["cli", "main"]


def _stacks_on_request() -> None:
    """`kill -USR1 PID` writes the stack of each of the process's threads to its stderr,
    and it runs on: a process that will not stop (a sweep's child past its END_S, a
    sweep after a second Ctrl-C) then says where it waits."""
    if hasattr(signal, "SIGUSR1"):
        with contextlib.suppress(ValueError, OSError, RuntimeError):  # no stderr to write to
            faulthandler.register(signal.SIGUSR1, all_threads=True)


def main() -> None:
    _stacks_on_request()
    # The interpreter's last collection walks every object left (the imports alone are
    # ~40k): ~55 ms at each exit, paid in turn by a sweep's children and the sweep at its
    # end. Frozen, they are left to the exit: what nothing else holds is still freed as
    # the modules go, and the other atexit handlers (logging's flush) still run.
    atexit.register(gc.freeze)
    # Not click's standalone mode: it turns Ctrl-C into "Aborted!" and exit code 1, where
    # the contract says 130.
    try:
        code = cli.main(prog_name="reviewq", standalone_mode=False)
    except (KeyboardInterrupt, click.exceptions.Abort):
        click.echo("error: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:  # bad usage (2), or a command's refusal (1)
        exc.show()
        sys.exit(exc.exit_code)
    except OSError as exc:
        if (why := _unwritable_stdout(exc)) is None:
            _exit_internal_error(exc)
        click.echo(f"error: cannot write the output to stdout: {why}", err=True)
        sys.exit(1)
    except Exception as exc:
        _exit_internal_error(exc)
    sys.exit(code if isinstance(code, int) else 0)


def _exit_internal_error(exc: BaseException) -> NoReturn:
    """A bug: one line for the person, the traceback for the log; exit 1."""
    logs.get().error("internal.error", exc_info=exc)
    # Redacted as the log's traceback is: an exception may quote a value (a KeyError's key).
    said = logs.redact(f"{type(exc).__name__}: {exc}")
    click.echo(f"error: internal error: {said} (please report it)", err=True)
    sys.exit(1)


def _unwritable_stdout(exc: OSError) -> str | None:
    """Why stdout takes no more output (a file on a full disk, a terminal hung up), when
    a write or flush of it is what failed: from cron, `reviewq report >> morning.txt` on
    a full disk said "internal error … (please report it)", then Python's "Exception
    ignored" at the exit. What could not be written goes to /dev/null, so the exit's
    flush says nothing more."""
    out = sys.stdout
    streams = {id(out), id(getattr(out, "buffer", None)), id(sys.__stdout__)}
    tb = exc.__traceback__
    while tb is not None:
        # A stream itself (click.echo's, emit_json's), or a rich Console writing to it.
        held = tb.tb_frame.f_locals.values()
        if any(id(v) in streams or id(_file_of(v)) in streams for v in held):
            break
        tb = tb.tb_next
    else:
        return None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        os.close(devnull)
    return exc.strerror or str(exc)


def _file_of(value: object) -> object:
    try:
        return value.file if type(value).__name__ == "Console" else None
    except Exception:  # noqa: BLE001 - any object, any property
        return None
