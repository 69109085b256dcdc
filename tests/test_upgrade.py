"""A release installed over a state folder, a queue and processes left by an earlier one."""

from __future__ import annotations

import json
import os
import socket
import subprocess


def test_a_worker_stops_the_agents_a_dead_worker_of_an_earlier_release_left(tmp_path, monkeypatch):
    """Before messages were versioned, workers shared the control's state folder and
    registered their agents in its run/agents/. A worker of that release SIGKILLed before
    the upgrade left its agents running (a fixer among them writes its note in the KB):
    the new worker reaped only its own folder's registry (STATE/worker/run/agents), and
    the old agents ran on, unwatched, beside the attempts the reaper dispatched again."""
    from orchestrator.config import load_settings
    from workers import consumers

    settings = load_settings(tmp_path)
    state = settings.state_dir
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=10)
    agent = subprocess.Popen(
        ["sleep", "120"], env={**os.environ, "REVIEWQ_JOB_ID": "50"}, start_new_session=True
    )
    try:
        registry = state / "run" / "agents"  # where that release's workers wrote it
        registry.mkdir(parents=True)
        entry = {"worker_pid": dead.pid, "pgid": agent.pid, "job_id": 50, "attempt": 1}
        (registry / f"{socket.gethostname()}-{agent.pid}.json").write_text(json.dumps(entry))

        class _Stopped:  # the consumer, stopped at once
            def __init__(self, *args: object, **kwargs: object) -> None:
                pass

            def run(self) -> None:
                pass

        monkeypatch.setattr(consumers, "QueueConsumer", _Stopped)
        consumers.run_worker(settings, 1)
        assert agent.wait(timeout=10) is not None
        assert not list(registry.iterdir())
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(timeout=10)
