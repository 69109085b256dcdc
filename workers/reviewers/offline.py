"""The ``offline`` kind: the deterministic reviewer of ``workers.offline_agent``, run as a
subprocess like any agent, so the whole pipeline works with no model at all."""

from __future__ import annotations

from .base import AttemptSpec, Command, Reviewer, python_module


class OfflineReviewer(Reviewer):
    kind = "offline"

    def command(self, spec: AttemptSpec) -> Command:
        return Command(
            argv=python_module("workers.offline_agent"),
            env=dict(self.profile.env),
            cwd=spec.root,
        )
