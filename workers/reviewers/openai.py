"""The ``openai`` kind: one POST to an OpenAI-compatible ``/v1/chat/completions`` (ollama,
llama.cpp, vLLM), made by ``python -m workers.openai_agent`` as a subprocess so deadlines,
process-group kills and classification work exactly as for every other kind (CONTRACT §8)."""

from __future__ import annotations

import os

from orchestrator.config import ReviewerProfile

from .base import (
    FAILURES,
    AttemptSpec,
    Command,
    Reviewer,
    Telemetry,
    _num,
    python_module,
    telemetry_from_file,
)
from .vendor import bounded, failure_kind


class OpenAIReviewer(Reviewer):
    kind = "openai"

    def command(self, spec: AttemptSpec) -> Command:
        env = {
            **self.profile.env,
            "REVIEWQ_OPENAI_BASE_URL": self.profile.base_url,
            # The *name* of the variable holding the key: the key itself never goes through
            # reviewq's argv, logs or telemetry; the agent reads it from its environment.
            "REVIEWQ_OPENAI_API_KEY_ENV": self.profile.api_key_env,
            "REVIEWQ_OPENAI_TIMEOUT": str(self.profile.timeout),
            "REVIEWQ_OPENAI_CONNECT_TIMEOUT": str(
                self.profile.connect_timeout or min(30.0, self.profile.timeout)
            ),
        }
        return Command(
            # profile args are name=value fields added to the request (see the agent)
            argv=[*python_module("workers.openai_agent"), *self.profile.args],
            env=env,
            cwd=spec.root,
        )

    def telemetry(self, spec: AttemptSpec) -> Telemetry:
        """The usage of an answer, or the agent's account of why there was none: an HTTP
        error by its status, an endpoint out of reach or not answering as one (CONTRACT §8)."""
        t = telemetry_from_file(spec.telemetry_path)
        raw = t.raw or {}
        if isinstance(raw.get("error"), str):
            t.error = bounded(raw["error"])
            hint = raw.get("failure") if raw.get("failure") in FAILURES else None
            # The server's own words, not the message with the URL in it: a base_url
            # holding "auth" or "quota" made every error look like one. An answer the
            # agent found to be the server's failure (an error in a 200) stays one.
            if isinstance(raw.get("detail"), str):
                t.failure = failure_kind(raw["detail"], _num(raw.get("status"), int)) or hint
            elif hint is None:  # no answer at all: classified by the status alone
                t.failure = failure_kind("", _num(raw.get("status"), int))
            else:
                t.failure = hint
        return t


def key_problem(profile: ReviewerProfile) -> str | None:
    """Why the key variable the profile's ``api_key_env`` names is no use here (unset,
    blank), or None; never the value. Its agents see this environment plus the profile's
    ``env``, so either may hold it."""
    var = profile.api_key_env
    if not var:
        return None
    key = profile.env.get(var, os.environ.get(var, ""))
    if key.strip():
        return None
    said = "is empty" if var in profile.env or var in os.environ else "is not set"
    return (
        f"{var} (its api_key_env) {said} in this environment: each request would go without "
        "a key and fail, pausing the profile; set it for the user that runs the worker"
    )


# doctor waits at most this long for an endpoint: an address that drops packets would
# otherwise hold it for the profile's connect_timeout (up to 30 s) or timeout.
PROBE_SECONDS = 5.0


def endpoint_problem(profile: ReviewerProfile) -> str | None:
    """Why the profile's ``base_url`` does not answer from this machine, or None: doctor
    said "ok" of a profile whose every attempt would find nothing listening there."""
    from workers.openai_agent import probe

    return probe(profile.base_url, min(PROBE_SECONDS, profile.connect_timeout or PROBE_SECONDS))
