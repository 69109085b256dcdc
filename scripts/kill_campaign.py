#!/usr/bin/env python3
"""The long kill campaign (CONTRACT §6, §12): N seeds of ``tests/fault/harness.py``, each a
fresh KB with >= 200 one-pair jobs, a real control process and real workers SIGKILLed at
random moments and restarted at once, drained with ``reviewq sweep --workers 0``, then
checked from state.db and the log. Prints one table row per seed and a total; exits 1
on any violation (a lost or twice-accepted pair, an acceptance without its evidence, a
job left open, an agent left running, a log line that is not JSON, 'database is locked').

    .venv/bin/python scripts/kill_campaign.py --seeds 20 --jobs 200
    .venv/bin/python scripts/kill_campaign.py --seeds 5 --redis   # the same on redis-server
    .venv/bin/python scripts/kill_campaign.py --seeds 5 --fix     # with fixes and re-reviews
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from tests.fault.harness import (  # noqa: E402
    CampaignConfig,
    RedisServer,
    format_row,
    header,
    run_campaign,
    total_row,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20, help="how many seeds (default 20)")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=200, help="one-pair jobs per seed (>= 200)")
    ap.add_argument("--gates", type=int, default=4, help="gates (one per lens)")
    ap.add_argument("--kills", type=int, default=15, help="SIGKILLs per seed")
    ap.add_argument("--workers", type=int, default=2, help="worker processes")
    ap.add_argument("--threads", type=int, default=2, help="--workers of each worker process")
    ap.add_argument("--fake-sleep", type=float, default=0.3, help="agent time: uniform 0..this")
    ap.add_argument("--min-gap", type=float, default=0.2)
    ap.add_argument("--max-gap", type=float, default=1.5)
    ap.add_argument("--drain-timeout", type=float, default=600)
    ap.add_argument("--redis", action="store_true", help="the queue on a redis-server")
    ap.add_argument(
        "--fix",
        action="store_true",
        help="enqueue with --fix: half the notes FAIL, are fixed and re-reviewed",
    )
    ap.add_argument("--keep", action="store_true", help="keep each seed's folder")
    ap.add_argument("--json", dest="json_out", help="write every row and violation here")
    args = ap.parse_args(argv)
    if args.jobs < 200:
        print(
            "note: fewer than 200 jobs per seed is a short run, not the campaign", file=sys.stderr
        )

    workdir = Path(tempfile.mkdtemp(prefix="kill-campaign-"))
    print(
        f"# kill campaign: {args.seeds} seed(s) x {args.jobs} jobs, {args.kills} kills each, "
        f"{args.workers} worker process(es) x {args.threads}, queue "
        f"{'redis' if args.redis else 'sqlite'}; folders under {workdir}"
    )
    print(header(), flush=True)
    rows, report = [], []
    failed = False
    t0 = time.monotonic()
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        redis = None
        try:
            if args.redis:
                redis = RedisServer(workdir / f"r{seed}.sock", workdir / f"redis-{seed}")
                redis.start()
            cfg = CampaignConfig(
                seed=seed,
                jobs=args.jobs,
                gates=args.gates,
                kills=args.kills,
                workers=args.workers,
                threads=args.threads,
                fake_sleep=args.fake_sleep,
                gap=(args.min_gap, args.max_gap),
                drain_timeout=args.drain_timeout,
                queue_url=redis.url if redis else "",
                fix=args.fix,
            )
            res = run_campaign(cfg, workdir)
        finally:
            if redis is not None:
                redis.stop()
        row = res.row()
        rows.append(row)
        violations = res.violations()
        print(format_row(row), flush=True)
        for v in violations:
            print(f"    seed {seed}: {v}", flush=True)
        failed = failed or bool(violations)
        report.append(
            {
                **row,
                "violations": violations,
                "attempts": res.check.attempts,
                "error_events": res.check.error_events,
                "kills_detail": res.kills,
                "root": str(res.root),
            }
        )
        if not args.keep and not violations:
            shutil.rmtree(res.root, ignore_errors=True)
    print(format_row(total_row(rows)))
    print(
        f"# {len(rows)} seed(s) in {time.monotonic() - t0:.0f} s; "
        f"{'VIOLATIONS FOUND' if failed else 'no violation'}"
    )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    if not args.keep and not failed:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
