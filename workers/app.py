"""The two Huey instances (SPEC §6): ``review`` (agents; any number of workers, anywhere)
and ``control`` (finalize and bookkeeping; exactly one consumer, next to state.db).

SQLite files in the state folder by default; ``queue.url = "redis://…"`` puts both on
Redis. Results are off: every outcome travels as a message to the control queue.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from huey import RedisHuey, SqliteHuey
from huey.api import Huey
from huey.signals import SIGNAL_INTERRUPTED
from huey.storage import RedisStorage, SqliteStorage

from orchestrator import logs
from orchestrator.config import Settings

from . import tasks

_MAX_PAUSE = 2.0


@dataclass
class App:
    review: Huey
    control: Huey
    settings: Settings
    wrappers: dict[str, object] = field(default_factory=dict)  # task name -> TaskWrapper


class _PatientReads:
    """A queue that cannot be read (Redis restarting, the queue file locked past its busy
    timeout) is waited out here, with a growing pause and one log line a minute, instead
    of Huey logging a traceback at every poll (tens a second) until it is back."""

    _pause = 0.0
    _said_at = 0.0

    def dequeue(self):  # noqa: ANN201 - Huey's signature
        return self._patiently(super().dequeue, None)  # type: ignore[misc]

    def read_schedule(self, timestamp):  # noqa: ANN001, ANN201 - Huey's signature
        return self._patiently(lambda: super(_PatientReads, self).read_schedule(timestamp), [])  # type: ignore[misc]

    def _patiently(self, read, empty):  # noqa: ANN001, ANN202
        try:
            data = read()
        except tasks.QUEUE_UNAVAILABLE as exc:
            now = time.monotonic()
            if now - self._said_at >= 60:
                self._said_at = now
                logs.get().error(
                    "queue.unavailable", queue=self.name, error=str(exc), retry_s=_MAX_PAUSE
                )
            self._pause = min(_MAX_PAUSE, max(0.1, self._pause * 2))
            time.sleep(self._pause)
            return empty
        if self._pause:
            self._pause = self._said_at = 0.0
            logs.get().info("queue.available", queue=self.name)
        return data


class QueueStorage(_PatientReads, SqliteStorage):
    """Huey's SQLite storage at synchronous=NORMAL: in WAL mode still safe against a
    crashed process (only a power cut can lose the last messages, and the reaper resends
    what state.db says was not done), without an fsync for each of a job's messages."""

    def _create_connection(self):  # noqa: ANN202 - Huey's signature
        conn = super()._create_connection()
        conn.execute("pragma synchronous=1")
        return conn


class RedisQueueStorage(_PatientReads, RedisStorage):
    pass


def _huey(settings: Settings, queue: str) -> Huey:
    url = settings.queue.url
    if url:
        # blocking=True: idle workers wait on BRPOP and see a message at once.
        return RedisHuey(
            f"reviewq-{queue}",
            url=url,
            results=False,
            utc=True,
            blocking=True,
            read_timeout=1,
            storage_class=RedisQueueStorage,
        )
    folder = settings.state_dir / "queue"
    folder.mkdir(parents=True, exist_ok=True)
    return SqliteHuey(
        queue,
        filename=str(folder / f"{queue}.db"),
        results=False,
        utc=True,
        timeout=30,
        storage_class=QueueStorage,
    )


def make_app(settings: Settings) -> App:
    review, control = _huey(settings, "review"), _huey(settings, "control")
    app = App(review, control, settings)
    app.wrappers["run_review"] = review.task(name="run_review")(tasks.run_review)
    for fn in (tasks.deliver_outcome, tasks.attempt_heartbeat, tasks.dispatch, tasks.tick):
        # A control task that fails (state.db locked past its busy timeout, a full disk)
        # rolled its transaction back; Huey runs it again a little later.
        app.wrappers[fn.__name__] = control.task(name=fn.__name__, retries=20, retry_delay=3)(
            tasks.said_on_failure(fn)
        )

    for huey in (review, control):

        def requeue_interrupted(signal: str, task: object, huey: Huey = huey) -> None:
            # A restart (SIGTERM to a consumer) interrupted this task: its transaction was
            # rolled back or its agent killed, so it runs again from the start.
            logs.get().warning("task.interrupted", task=getattr(task, "name", "?"), requeued=True)
            huey.enqueue(task)

        huey.signal(SIGNAL_INTERRUPTED)(requeue_interrupted)
    tasks.install_app(app)
    return app
