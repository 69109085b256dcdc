"""Reviewer adapters by kind (CONTRACT §8). ``for_profile`` picks the adapter of a profile."""

from __future__ import annotations

from orchestrator.config import ReviewerProfile

from .base import AttemptSpec, Command, Reviewer, Telemetry
from .claude import ClaudeReviewer
from .codex import CodexReviewer
from .command import CommandReviewer
from .gemini import GeminiReviewer
from .offline import OfflineReviewer
from .openai import OpenAIReviewer

ADAPTERS: dict[str, type[Reviewer]] = {
    CommandReviewer.kind: CommandReviewer,
    OfflineReviewer.kind: OfflineReviewer,
    ClaudeReviewer.kind: ClaudeReviewer,
    CodexReviewer.kind: CodexReviewer,
    GeminiReviewer.kind: GeminiReviewer,
    OpenAIReviewer.kind: OpenAIReviewer,
}


class UnsupportedKind(ValueError):
    pass


def for_profile(profile: ReviewerProfile) -> Reviewer:
    try:
        return ADAPTERS[profile.kind](profile)
    except KeyError:
        raise UnsupportedKind(
            f"reviewer {profile.name}: kind {profile.kind!r} has no adapter yet"
        ) from None


__all__ = [
    "ADAPTERS",
    "AttemptSpec",
    "Command",
    "Reviewer",
    "Telemetry",
    "UnsupportedKind",
    "for_profile",
]
