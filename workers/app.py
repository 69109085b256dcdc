"""The reviewq Huey app: both queues of :mod:`workers.queues` with the tasks of
:mod:`workers.tasks` registered on them."""

from __future__ import annotations

import functools

from orchestrator import logs
from orchestrator.config import Settings

from . import tasks
from .queues import SIGNAL_INTERRUPTED, App, Huey, huey_for, install_app


def make_app(settings: Settings) -> App:
    review, control = huey_for(settings, "review"), huey_for(settings, "control")
    app = App(review, control, settings)
    app.wrappers["run_review"] = review.task(name="run_review")(tasks.run_review)
    for fn in (tasks.deliver_outcome, tasks.attempt_heartbeat, tasks.dispatch, tasks.tick):
        # A control task that fails (state.db locked past its busy timeout, a full disk)
        # rolled its transaction back; Huey runs it again a little later.
        app.wrappers[fn.__name__] = control.task(
            name=fn.__name__, retries=20, retry_delay=3, context=True
        )(tasks.said_on_failure(fn))

    for huey in (review, control):

        def requeue_interrupted(signal: str, task: object, huey: Huey = huey) -> None:
            # A restart (SIGTERM to a consumer) interrupted this task: its transaction was
            # rolled back or its agent killed, so it runs again from the start. A control
            # message is still on its queue (held), and runs again from there.
            held = getattr(huey.storage, "holds", False)
            # A review's job and attempt: which ones a restart cut short, on the worker's side.
            args = getattr(task, "args", None) or ({},)
            msg = args[0] if isinstance(args[0], dict) else {}
            ids = {k: msg[k] for k in ("job_id", "attempt") if k in msg}
            # Not one whose outcome went before the stop (its thread was cleaning up):
            # nothing is to run again, and its next run was an agent paid for nothing.
            requeued = not held and not (ids and tasks.outcome_sent(msg))
            logs.get().warning(
                "task.interrupted", task=getattr(task, "name", "?"), requeued=requeued, **ids
            )
            if requeued and ids:
                # Once: the thread of an agent this stop killed may have put it back.
                tasks.put_back(msg, functools.partial(huey.enqueue, task))
            elif requeued:
                huey.enqueue(task)

        huey.signal(SIGNAL_INTERRUPTED)(requeue_interrupted)
    install_app(app)
    return app
