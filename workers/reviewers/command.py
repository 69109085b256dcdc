"""The ``command`` kind: any program, from an argv template with placeholders (CONTRACT §8)."""

from __future__ import annotations

import string

from .base import AttemptSpec, Command, Reviewer


class _Strict(string.Formatter):
    def get_value(self, key, args, kwargs):  # noqa: ANN001 - Formatter's signature
        if key not in kwargs:
            raise KeyError(f"unknown placeholder {{{key}}} in command")
        return kwargs[key]


class CommandReviewer(Reviewer):
    kind = "command"

    def command(self, spec: AttemptSpec) -> Command:
        values = spec.placeholders()
        argv = [
            _Strict().format(part, **values) for part in (*self.profile.command, *self.profile.args)
        ]
        return Command(argv=argv, env=dict(self.profile.env), cwd=spec.root)

    def executables(self) -> list[str]:
        return [self.profile.command[0]] if self.profile.command else []
