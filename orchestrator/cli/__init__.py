"""``reviewq``: a thin click CLI over the core. Commands parse, call one core function,
print, and turn domain errors into one ``error:`` line with exit code 1.

The commands live in :mod:`.review`, :mod:`.queue` and :mod:`.report`; the group of
:mod:`.common` imports the one a command is in when it is asked for, which registers it."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import signal
import sys

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
    except Exception as exc:  # a bug: one line for the person, the traceback for the log
        logs.get().error("internal.error", exc_info=True)
        click.echo(
            f"error: internal error: {type(exc).__name__}: {exc} (please report it)", err=True
        )
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
