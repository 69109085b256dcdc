"""What review messages cost now that they carry the prompt: ``--jobs`` one-pair jobs are
enqueued (untimed), then the control process's dispatch opens an attempt for each and
sends its message to the review queue (timed), on the SQLite queue or on redis-server.

Reported: dispatch time per message (open the attempt, render and write its prompt,
build and send the message), the mean message as stored (Huey's pickle), and the queue's
size afterwards (the SQLite file, or Redis's ``used_memory``). It runs against whatever
``orchestrator``/``workers`` Python imports, so the old code can be measured beside the
new one with ``PYTHONPATH=OLD_CHECKOUT``.

    .venv/bin/python bench/messages.py --jobs 10000
    .venv/bin/python bench/messages.py --jobs 10000 --redis

With ``--passes K`` it times instead the dispatch pass an outcome runs beside a long
queue: the reviewer at concurrency 1, its slots full, K times one open attempt ended (in
SQL, untimed) and ``dispatch`` timed as it reads the queued jobs and opens the next.
``--without-index NAME`` drops that index after the enqueue, to show what it saves.

    .venv/bin/python bench/messages.py --jobs 20000 --passes 200
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NOTE = (
    "---\ntitle: Note {i}\ndescription: About hive inspection {i}.\n---\n\n# Note {i}\n\n"
    "Inspect the hive every {d} days in spring.\n"
    "Look for eggs, larvae and capped brood; note the temper of the colony.\n"
)
GATE = (
    "---\ngate_id: prose/body-check\nname: Body check\nlens: prose\nwatches: [body]\n---\n\n"
    "## Failure mode\n\nThe body is empty.\n\n## Test\n\nRead the body.\n"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--redis", action="store_true", help="the queues on a redis-server")
    ap.add_argument("--passes", type=int, default=0, help="time K outcome-sized passes")
    ap.add_argument("--without-index", metavar="NAME", help="drop this index first")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-messages-"))
    redis = None
    try:
        root = base / "kb"
        gate = root / "kb/instructions/review-gates/prose/body-check.md"
        gate.parent.mkdir(parents=True)
        gate.write_text(GATE)
        for i in range(args.jobs):
            folder = root / f"kb/notes/g{i % 20:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"n{i:05d}.md").write_text(NOTE.format(i=i, d=i % 9 + 5))
        config = (
            '[reviewers.instant]\nkind = "command"\ncommand = ["true"]\npartition = "instant"\n'
            # dispatch opens every job at once; or one slot, one pass an outcome
            f"concurrency = {1 if args.passes else args.jobs}\n"
        )
        if args.redis:
            sock = base / "redis.sock"
            redis = subprocess.Popen(
                ["redis-server", "--port", "0", "--unixsocket", str(sock), "--save", "",
                 "--appendonly", "no"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
            for line in redis.stdout:
                if "ready to accept connections" in line.lower():
                    break
            config += f'[queue]\nurl = "unix://{sock}"\n'
        (root / "reviewq.toml").write_text(config)

        from orchestrator.control.control import Control
        from orchestrator.control.followup import FollowUp
        from orchestrator.state.workspace import Workspace
        from orchestrator.sweeps.producer import SweepRequest, enqueue
        from workers.app import make_app
        from workers.queues import send

        ws = Workspace.open(root)
        t0 = time.perf_counter()
        jobs = enqueue(ws, SweepRequest(name="bench", reviewer="instant", all_gates=True)).jobs
        t_enqueue = time.perf_counter() - t0
        app = make_app(ws.settings)
        sizes: list[int] = []

        def send_review(msg: dict) -> None:
            if len(sizes) < 200:  # the stored form of a sample of messages
                task = app.wrappers["run_review"].s(msg)
                sizes.append(len(app.review.serialize_task(task)))
            send("run_review", msg)

        control = Control(ws, send_review=send_review, hooks=FollowUp(ws))
        if args.without_index:
            ws.store.conn.execute(f"DROP INDEX {args.without_index}")
        if args.passes:
            return outcome_passes(ws, control, len(jobs), args)
        t0 = time.perf_counter()
        sent = 0
        while True:
            n = control.dispatch()
            if n == 0:
                break
            sent += n
        t_dispatch = time.perf_counter() - t0
        if args.redis:
            import redis as redis_lib

            used = redis_lib.Redis(unix_socket_path=str(sock)).info("memory")["used_memory"]
            queue_bytes = used
        else:
            queue_bytes = sum(p.stat().st_size for p in (ws.state_dir / "queue").glob("review.db*"))
        ws.close()
        print(
            json.dumps(
                {
                    "jobs": len(jobs),
                    "messages": sent,
                    "queue": "redis" if args.redis else "sqlite",
                    "enqueue_s": round(t_enqueue, 2),
                    "dispatch_s": round(t_dispatch, 2),
                    "dispatch_ms_per_message": round(1000 * t_dispatch / max(1, sent), 3),
                    "mean_message_bytes": round(sum(sizes) / max(1, len(sizes))),
                    "queue_bytes_after": queue_bytes,
                },
                indent=1,
            )
        )
        return 0 if sent == len(jobs) else 1
    finally:
        if redis is not None:
            redis.terminate()
            redis.wait(timeout=10)
        shutil.rmtree(base, ignore_errors=True)


def outcome_passes(ws, control, jobs: int, args) -> int:  # noqa: ANN001 - bench objects
    """Time ``args.passes`` dispatch passes, each after one open attempt ended: what the
    pass of each outcome costs beside ``jobs`` queued jobs."""
    control.dispatch()  # the slots filled, untimed
    times = []
    for _ in range(args.passes):
        with ws.store.write():
            job_id, attempt = ws.store.conn.execute(
                "SELECT job_id, attempt FROM attempts WHERE outcome IN ('dispatched', 'running') "
                "ORDER BY id LIMIT 1"
            ).fetchone()
            ws.store.conn.execute(
                "UPDATE attempts SET outcome = 'finalized' WHERE job_id = ? AND attempt = ?",
                (job_id, attempt),
            )
            ws.store.conn.execute(
                "UPDATE review_jobs SET status = 'completed' WHERE id = ?", (job_id,)
            )
        t0 = time.perf_counter()
        opened = control.dispatch()
        times.append(time.perf_counter() - t0)
        if opened != 1:
            break
    ws.close()
    if opened != 1:
        print(f"a pass opened {opened} attempt(s), not 1", file=sys.stderr)
        return 1
    times.sort()
    print(
        json.dumps(
            {
                "jobs_queued": jobs,
                "passes": len(times),
                "without_index": args.without_index,
                "pass_ms_median": round(1000 * times[len(times) // 2], 3),
                "pass_ms_min": round(1000 * times[0], 3),
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
