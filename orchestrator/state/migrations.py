"""Numbered schema migrations for state.db, applied in order and recorded in the database.

Never edit a migration that has shipped: add the next number instead.
"""

from __future__ import annotations

MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "snapshots, jobs, attempts, pairs, acceptance",
        """
        CREATE TABLE snapshots (
            id         INTEGER PRIMARY KEY,
            path       TEXT NOT NULL,
            sha256     TEXT NOT NULL,
            text       TEXT NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (path, sha256)
        );
        CREATE INDEX snapshots_sha ON snapshots (sha256);

        CREATE TABLE review_jobs (
            id              INTEGER PRIMARY KEY,
            kind            TEXT NOT NULL DEFAULT 'review'
                            CHECK (kind IN ('review', 'fix', 'audit')),
            status          TEXT NOT NULL
                            CHECK (status IN ('queued', 'running', 'completed', 'failed', 'split')),
            model_partition TEXT NOT NULL,
            grouping        TEXT NOT NULL,
            lens            TEXT,
            reviewer        TEXT,
            job_dir         TEXT NOT NULL,
            attempt         INTEGER NOT NULL DEFAULT 0,
            parent_job_id   INTEGER REFERENCES review_jobs (id),
            sweep           TEXT,
            failure_reasons TEXT,
            runner          TEXT,
            model           TEXT,
            effort          TEXT,
            telemetry_json  TEXT,
            created_at      TEXT NOT NULL,
            updated_at      TEXT NOT NULL,
            finished_at     TEXT
        );
        CREATE INDEX review_jobs_status ON review_jobs (status);

        CREATE TABLE attempts (
            id             INTEGER PRIMARY KEY,
            job_id         INTEGER NOT NULL REFERENCES review_jobs (id),
            attempt        INTEGER NOT NULL,
            runner         TEXT,
            outcome        TEXT NOT NULL DEFAULT 'running',
            exit_code      INTEGER,
            started_at     TEXT,
            ended_at       TEXT,
            heartbeat_at   TEXT,
            reasons        TEXT,
            num_turns      INTEGER,
            input_tokens   INTEGER,
            output_tokens  INTEGER,
            cost_usd       REAL,
            duration_s     REAL,
            session_id     TEXT,
            error_subtype  TEXT,
            telemetry_json TEXT,
            UNIQUE (job_id, attempt)
        );

        CREATE TABLE review_pairs (
            id               INTEGER PRIMARY KEY,
            job_id           INTEGER NOT NULL REFERENCES review_jobs (id),
            note_path        TEXT NOT NULL,
            gate_id          TEXT NOT NULL,
            gate_path        TEXT NOT NULL,
            lens             TEXT NOT NULL,
            note_snapshot_id INTEGER NOT NULL REFERENCES snapshots (id),
            gate_snapshot_id INTEGER NOT NULL REFERENCES snapshots (id),
            decision         TEXT CHECK (decision IN ('PASS', 'WARN', 'FAIL', 'ERROR')),
            rationale        TEXT,
            decided_at       TEXT,
            UNIQUE (job_id, note_path, gate_id)
        );
        CREATE INDEX review_pairs_key ON review_pairs (note_path, gate_id);

        -- One current row per (note, gate, partition): the evidence that makes it fresh.
        CREATE TABLE acceptance (
            model_partition  TEXT NOT NULL,
            note_path        TEXT NOT NULL,
            gate_id          TEXT NOT NULL,
            review_pair_id   INTEGER NOT NULL REFERENCES review_pairs (id),
            note_snapshot_id INTEGER NOT NULL,
            gate_snapshot_id INTEGER NOT NULL,
            decision         TEXT NOT NULL,
            source           TEXT NOT NULL DEFAULT 'review'
                             CHECK (source IN ('review', 'ack', 'human')),
            accepted_at      TEXT NOT NULL,
            PRIMARY KEY (model_partition, note_path, gate_id)
        ) WITHOUT ROWID;
        CREATE INDEX acceptance_pair ON acceptance (review_pair_id);

        -- A counter every acceptance change bumps, so caches of freshness can tell
        -- that nothing changed without reading every row.
        CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
        INSERT INTO counters VALUES ('acceptance_version', 0);
        CREATE TRIGGER acceptance_ins AFTER INSERT ON acceptance BEGIN
            UPDATE counters SET value = value + 1 WHERE name = 'acceptance_version';
        END;
        CREATE TRIGGER acceptance_upd AFTER UPDATE ON acceptance BEGIN
            UPDATE counters SET value = value + 1 WHERE name = 'acceptance_version';
        END;
        CREATE TRIGGER acceptance_del AFTER DELETE ON acceptance BEGIN
            UPDATE counters SET value = value + 1 WHERE name = 'acceptance_version';
        END;
        """,
    ),
]

MIGRATIONS.append(
    (
        2,
        "queue bookkeeping: dispatch, leases, reviewer pauses, sweep runs",
        """
        ALTER TABLE review_jobs ADD COLUMN not_before TEXT;
        ALTER TABLE review_jobs ADD COLUMN sweep_run_id INTEGER;
        ALTER TABLE review_jobs ADD COLUMN launch_failures INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE attempts ADD COLUMN worker TEXT;
        ALTER TABLE attempts ADD COLUMN launched_at TEXT;
        CREATE INDEX attempts_open ON attempts (outcome) WHERE outcome IN ('dispatched', 'running');

        CREATE TABLE reviewer_state (
            name            TEXT PRIMARY KEY,
            launch_failures INTEGER NOT NULL DEFAULT 0,
            paused_until    TEXT,
            updated_at      TEXT NOT NULL
        ) WITHOUT ROWID;

        CREATE TABLE sweep_runs (
            id          INTEGER PRIMARY KEY,
            name        TEXT NOT NULL,
            trigger     TEXT NOT NULL,
            options     TEXT NOT NULL,
            budget_usd  REAL,
            started_at  TEXT NOT NULL,
            finished_at TEXT,
            jobs        INTEGER NOT NULL DEFAULT 0,
            skipped     INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX sweep_runs_name ON sweep_runs (name, started_at);

        CREATE TABLE cron_state (
            name         TEXT PRIMARY KEY,
            last_checked TEXT NOT NULL
        ) WITHOUT ROWID;
        """,
    )
)

MIGRATIONS.append(
    (
        3,
        "rejection cycles, fix and audit jobs, escalations",
        """
        ALTER TABLE review_jobs ADD COLUMN note_path TEXT;
        ALTER TABLE review_jobs ADD COLUMN source_job_id INTEGER;
        ALTER TABLE review_jobs ADD COLUMN feedback TEXT;
        ALTER TABLE review_jobs ADD COLUMN result TEXT;
        ALTER TABLE review_jobs ADD COLUMN review_reviewer TEXT;

        -- Consecutive rejections per (note, gate, partition); reset by PASS, WARN or a
        -- human decision, always in the transaction that records what changed it.
        CREATE TABLE cycles (
            model_partition TEXT NOT NULL,
            note_path       TEXT NOT NULL,
            gate_id         TEXT NOT NULL,
            rejections      INTEGER NOT NULL DEFAULT 0,
            updated_at      TEXT NOT NULL,
            PRIMARY KEY (model_partition, note_path, gate_id)
        ) WITHOUT ROWID;

        CREATE TABLE cycle_events (
            id              INTEGER PRIMARY KEY,
            model_partition TEXT NOT NULL,
            note_path       TEXT NOT NULL,
            gate_id         TEXT NOT NULL,
            rejection       INTEGER NOT NULL,
            kind            TEXT NOT NULL,
            job_id          INTEGER,
            gist            TEXT NOT NULL,
            at              TEXT NOT NULL
        );
        CREATE INDEX cycle_events_pair ON cycle_events (model_partition, note_path, gate_id, id);

        CREATE TABLE escalations (
            id              INTEGER PRIMARY KEY,
            model_partition TEXT NOT NULL,
            note_path       TEXT NOT NULL,
            gate_id         TEXT NOT NULL,
            reason          TEXT NOT NULL,
            cycles          INTEGER NOT NULL,
            reviewer        TEXT,
            fixer           TEXT,
            report_path     TEXT NOT NULL,
            raised_at       TEXT NOT NULL,
            decision        TEXT CHECK (decision IN ('approve', 'redo', 'reject')),
            feedback        TEXT,
            decided_at      TEXT,
            note_sha256     TEXT,
            gate_sha256     TEXT
        );
        CREATE INDEX escalations_open ON escalations (note_path, gate_id) WHERE decision IS NULL;

        -- Note texts reviewq itself wrote (applied fixes), so an agent is not blamed for them.
        CREATE TABLE fix_writes (
            path    TEXT NOT NULL,
            sha256  TEXT NOT NULL,
            job_id  INTEGER NOT NULL,
            at      TEXT NOT NULL,
            PRIMARY KEY (path, sha256)
        ) WITHOUT ROWID;
        """,
    )
)

MIGRATIONS.append(
    (
        4,
        "dispatch reads only the next jobs of each reviewer",
        """
        CREATE INDEX review_jobs_dispatch ON review_jobs (reviewer, status, id);
        """,
    )
)

MIGRATIONS.append(
    (
        5,
        "jobs whose files could not be written wait to be written again",
        """
        CREATE TABLE job_files_due (
            job_id  INTEGER PRIMARY KEY REFERENCES review_jobs (id),
            since   TEXT NOT NULL,
            error   TEXT NOT NULL
        );
        """,
    )
)

MIGRATIONS.append(
    (
        6,
        "fix commits and the morning report",
        """
        -- What an applied fix wrote, and the git commit that holds it (or why there is none).
        ALTER TABLE review_jobs ADD COLUMN fixed_snapshot_id INTEGER;
        ALTER TABLE review_jobs ADD COLUMN fix_commit TEXT;
        ALTER TABLE review_jobs ADD COLUMN fix_no_commit TEXT;

        -- Reports a person was shown, so the next one starts where this one ended.
        CREATE TABLE report_runs (
            id         INTEGER PRIMARY KEY,
            since      TEXT NOT NULL,
            until      TEXT NOT NULL,
            html_path  TEXT,
            made_at    TEXT NOT NULL
        );
        """,
    )
)

MIGRATIONS.append(
    (
        7,
        "a paused reviewer says why",
        """
        ALTER TABLE reviewer_state ADD COLUMN paused_reason TEXT;
        """,
    )
)

MIGRATIONS.append(
    (
        8,
        "escalation reports and applied fixes are written after their transaction commits",
        """
        -- What an escalation's report quotes, so the report can be written again from here.
        ALTER TABLE escalations ADD COLUMN material TEXT;
        ALTER TABLE escalations ADD COLUMN recommend TEXT;

        CREATE TABLE escalation_reports_due (
            escalation_id  INTEGER PRIMARY KEY REFERENCES escalations (id),
            since          TEXT NOT NULL,
            error          TEXT NOT NULL
        );

        -- A fix decided as applied whose note is not yet written: the new text is the
        -- snapshot (path, new_sha256); it is written only over the text the fixer was given.
        CREATE TABLE fix_writes_due (
            job_id      INTEGER PRIMARY KEY REFERENCES review_jobs (id),
            path        TEXT NOT NULL,
            old_sha256  TEXT NOT NULL,
            new_sha256  TEXT NOT NULL,
            since       TEXT NOT NULL,
            error       TEXT NOT NULL
        );
        """,
    )
)

MIGRATIONS.append(
    (
        9,
        "an escalation recommends a call: reject after rejections, redo or approve after failures",
        """
        -- 'reject' (the note failed its gate again and again), 'redo' (the reviewer or the
        -- fixer failed every attempt: no judgement of the note, so nothing to reject) or
        -- 'approve' (the auditor failed every attempt: the reviewer's PASS stands unaudited).
        ALTER TABLE escalations ADD COLUMN call TEXT NOT NULL DEFAULT 'reject'
            CHECK (call IN ('reject', 'redo', 'approve'));
        """,
    )
)

MIGRATIONS.append(
    (
        10,
        "a due fix remembers that its note was written",
        """
        -- 1 once reviewq has written the note: a note that then holds the old text again
        -- is a person's revert, not a write still to do.
        ALTER TABLE fix_writes_due ADD COLUMN written INTEGER NOT NULL DEFAULT 0;
        """,
    )
)

MIGRATIONS.append(
    (
        11,
        "a job's due files know which decision they must show",
        """
        -- Bumped by every transaction that marks the job due again: a writer that rendered
        -- an older state clears the row only if no decision came after the one it read.
        ALTER TABLE job_files_due ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
        """,
    )
)

MIGRATIONS.append(
    (
        12,
        "a note's fix jobs are found by the note",
        """
        -- The morning report shows each escalated note's last fixes: without it, a scan of
        -- every job per note (30 s for 2,000 notes over 200,000 jobs).
        CREATE INDEX review_jobs_fix_note ON review_jobs (note_path, id) WHERE kind = 'fix';
        """,
    )
)

MIGRATIONS.append(
    (
        13,
        "an attempt knows when its outcome and cost were recorded",
        """
        -- The morning report counts an attempt's cost and outcome in the window in which
        -- they were recorded. By its start and end times (the worker's clock), an outcome
        -- the control took in after a report (it was down; a lost agent's late cost) was
        -- in neither that report nor the next.
        ALTER TABLE attempts ADD COLUMN recorded_at TEXT;
        UPDATE attempts SET recorded_at = ended_at
            WHERE outcome NOT IN ('dispatched', 'running');
        CREATE TRIGGER attempts_recorded AFTER UPDATE OF outcome, cost_usd ON attempts
            WHEN NEW.outcome NOT IN ('dispatched', 'running')
            AND (OLD.outcome IS NOT NEW.outcome OR OLD.cost_usd IS NOT NEW.cost_usd)
        BEGIN
            UPDATE attempts SET recorded_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
                WHERE id = NEW.id;
        END;
        """,
    )
)

MIGRATIONS.append(
    (
        14,
        "acceptance changes also draw a random epoch",
        """
        -- The counter alone repeats across copies of state.db: restored from a backup and
        -- changed as often as the lost copy was, it named another history, and select's
        -- memo served that history's answer. The epoch is drawn anew at every change.
        INSERT INTO counters VALUES ('acceptance_epoch', 0);
        DROP TRIGGER acceptance_ins;
        DROP TRIGGER acceptance_upd;
        DROP TRIGGER acceptance_del;
        CREATE TRIGGER acceptance_ins AFTER INSERT ON acceptance BEGIN
            UPDATE counters SET value = CASE name WHEN 'acceptance_version' THEN value + 1
                ELSE random() END WHERE name IN ('acceptance_version', 'acceptance_epoch');
        END;
        CREATE TRIGGER acceptance_upd AFTER UPDATE ON acceptance BEGIN
            UPDATE counters SET value = CASE name WHEN 'acceptance_version' THEN value + 1
                ELSE random() END WHERE name IN ('acceptance_version', 'acceptance_epoch');
        END;
        CREATE TRIGGER acceptance_del AFTER DELETE ON acceptance BEGIN
            UPDATE counters SET value = CASE name WHEN 'acceptance_version' THEN value + 1
                ELSE random() END WHERE name IN ('acceptance_version', 'acceptance_epoch');
        END;
        """,
    )
)

MIGRATIONS.append(
    (
        15,
        "open escalations of an agent's failure made before calls recommend redo or approve",
        """
        -- Migration 9 gave every open escalation 'reject', those of a reviewer, fixer or
        -- auditor that failed every attempt too: the report then told a person to reject a
        -- note nobody had judged. Their reasons say what they are; their report files are
        -- written again (the control process writes due reports at its next tick).
        UPDATE escalations
            SET call = CASE WHEN reason LIKE 'the auditor (%' THEN 'approve' ELSE 'redo' END
            WHERE call = 'reject' AND decision IS NULL
            AND (reason LIKE 'the reviewer failed every attempt: %'
                OR reason LIKE 'the fixer failed every attempt: %'
                OR reason LIKE 'the auditor (%) failed every attempt: %');
        INSERT OR REPLACE INTO escalation_reports_due
            SELECT id, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), 'not written yet'
            FROM escalations WHERE decision IS NULL AND call != 'reject'
            AND reason LIKE '% failed every attempt: %';
        """,
    )
)

MIGRATIONS.append(
    (
        16,
        "index of jobs by sweep run",
        """
        -- A run's spend (budgets) and its jobs (the report, a sweep's summary) are read by
        -- run: without it each read scanned every job ever recorded.
        CREATE INDEX review_jobs_run ON review_jobs (sweep_run_id);
        """,
    )
)

MIGRATIONS.append(
    (
        17,
        "when a worker took an attempt's message",
        """
        -- A worker no longer says it launched an agent at once: a quick agent's outcome
        -- says it. Set by the control process when it finds an attempt's message gone from
        -- the review queue (or a worker says it holds it): from then on the attempt is a
        -- worker's, and lost after a lease without a word, not after lease + timeout.
        ALTER TABLE attempts ADD COLUMN taken_at TEXT;
        """,
    )
)

MIGRATIONS.append(
    (
        18,
        "the job whose outcome raised an escalation",
        """
        -- `reviewq job N` of a failed job (or of the review whose third FAIL escalated)
        -- names the escalations it raised; none was linked to a job. Unknown (NULL) for
        -- those raised before.
        ALTER TABLE escalations ADD COLUMN job_id INTEGER;
        """,
    )
)

MIGRATIONS.append(
    (
        19,
        "an escalation a later review passed is closed",
        """
        -- A review of the pair made after an escalation was raised (by hand: sweeps hold
        -- the pair) that PASSes or WARNs it answers it: the escalation stayed open, the
        -- person was asked about a text already mended, and sweeps held the pair. It is
        -- closed as 'superseded', naming that job. SQLite changes no CHECK in place: the
        -- table is made again, its report rows kept aside while the old one goes.
        CREATE TABLE escalations_v19 (
            id              INTEGER PRIMARY KEY,
            model_partition TEXT NOT NULL,
            note_path       TEXT NOT NULL,
            gate_id         TEXT NOT NULL,
            reason          TEXT NOT NULL,
            cycles          INTEGER NOT NULL,
            reviewer        TEXT,
            fixer           TEXT,
            report_path     TEXT NOT NULL,
            raised_at       TEXT NOT NULL,
            decision        TEXT CHECK (decision IN ('approve', 'redo', 'reject', 'superseded')),
            feedback        TEXT,
            decided_at      TEXT,
            note_sha256     TEXT,
            gate_sha256     TEXT,
            material        TEXT,
            recommend       TEXT,
            call            TEXT NOT NULL DEFAULT 'reject' CHECK (call IN ('reject', 'redo', 'approve')),
            job_id          INTEGER,
            closed_by_job   INTEGER
        );
        INSERT INTO escalations_v19 (id, model_partition, note_path, gate_id, reason, cycles,
            reviewer, fixer, report_path, raised_at, decision, feedback, decided_at,
            note_sha256, gate_sha256, material, recommend, call, job_id)
            SELECT id, model_partition, note_path, gate_id, reason, cycles, reviewer, fixer,
            report_path, raised_at, decision, feedback, decided_at, note_sha256, gate_sha256,
            material, recommend, call, job_id FROM escalations;
        CREATE TEMP TABLE reports_due_v19 AS SELECT * FROM escalation_reports_due;
        DELETE FROM escalation_reports_due;
        DROP TABLE escalations;
        ALTER TABLE escalations_v19 RENAME TO escalations;
        INSERT INTO escalation_reports_due SELECT * FROM temp.reports_due_v19;
        DROP TABLE temp.reports_due_v19;
        CREATE INDEX escalations_open ON escalations (note_path, gate_id) WHERE decision IS NULL;
        """,
    )
)

MIGRATIONS.append(
    (
        20,
        "when a reviewer was paused",
        """
        -- status, doctor, job N, the report and a sweep's summary say since when a
        -- profile is paused, beside until when and why. Unknown (NULL) for a pause from
        -- before: they leave the start out.
        ALTER TABLE reviewer_state ADD COLUMN paused_at TEXT;
        """,
    )
)

MIGRATIONS.append(
    (
        21,
        "the sweep runs of queued jobs, from an index",
        """
        -- Dispatch (per outcome) and a sweep's progress (five times a second) ask which
        -- runs have queued jobs: without this index each asking read every queued job.
        CREATE INDEX review_jobs_queued_runs ON review_jobs (status, sweep_run_id);
        """,
    )
)

MIGRATIONS.append(
    (
        22,
        "why a cron sweep's last time ran nothing",
        """
        -- A cron sweep missed (no control looked at its minute) or failed for good was said
        -- in the log alone: status at 7 a.m. showed a quiet night. JSON (event, at,
        -- reason), kept until a run of the sweep starts after it; NULL for none.
        ALTER TABLE cron_state ADD COLUMN not_run TEXT;
        """,
    )
)

MIGRATIONS.append(
    (
        23,
        "attempts and jobs read by their times, from indexes",
        """
        -- status (the day's and total cost, the last heartbeat and recording, the last
        -- agent that did not start) and the report (a window's jobs and attempts, the
        -- nights' cost, each reviewer's last move) read every attempt and job ever
        -- recorded without these: 1.4 s of CPU for status and 5 s for the report on a
        -- year of nights (2.3 million attempts, 657,000 jobs). The total cost is summed
        -- from attempts_started alone, a tenth of the table's pages.
        CREATE INDEX attempts_started ON attempts (started_at, cost_usd);
        CREATE INDEX attempts_ended ON attempts (ended_at);
        CREATE INDEX attempts_recorded ON attempts (recorded_at);
        CREATE INDEX attempts_heartbeat ON attempts (heartbeat_at);
        CREATE INDEX attempts_launch_failures ON attempts (recorded_at)
            WHERE outcome = 'launch-failure';
        CREATE INDEX review_jobs_created ON review_jobs (created_at);
        CREATE INDEX review_jobs_finished ON review_jobs (finished_at);
        CREATE INDEX review_jobs_updated ON review_jobs (updated_at);
        -- `job N` names the jobs that followed it (a fix, an audit, a re-review) and those
        -- it was split into: each read every job without these.
        CREATE INDEX review_jobs_source ON review_jobs (source_job_id)
            WHERE source_job_id IS NOT NULL;
        CREATE INDEX review_jobs_parent ON review_jobs (parent_job_id)
            WHERE parent_job_id IS NOT NULL;
        """,
    )
)

MIGRATIONS.append(
    (
        24,
        "the budget a cron run started with, once its entry's lowered it",
        """
        -- A budget lowered mid-run holds the open cron run (sweeps.follow_budgets); put
        -- back, the run was held at the lowered one for the night, the budget it started
        -- with lost. NULL: never lowered (or lowered before this was kept).
        ALTER TABLE sweep_runs ADD COLUMN budget_started REAL;
        """,
    )
)

MIGRATIONS.append(
    (
        25,
        "the cron runs of nothing a release before this kept",
        """
        -- A cron run that enqueued nothing and took nothing over is deleted by its
        -- sweep's next (sweeps.forget_empty_runs); those kept before, a row a minute of a
        -- `* * * * *` entry, go at once. The last run of each sweep stays: status and the
        -- report read it.
        DELETE FROM sweep_runs WHERE trigger = 'cron' AND jobs = 0
            AND id NOT IN (SELECT max(id) FROM sweep_runs GROUP BY name)
            AND NOT EXISTS (SELECT 1 FROM review_jobs j WHERE j.sweep_run_id = sweep_runs.id);
        """,
    )
)

MIGRATIONS.append(
    (
        26,
        "the commit a review's note text was taken at",
        """
        -- The commit the KB's HEAD was at when a job's snapshot of the note was taken (its
        -- prompt's text, what the review judged), kept with the pair and with the
        -- acceptance made of it; export's recorded-commit. Read afterwards from commit
        -- times, a rebase, a commit dated ahead or one in the review's own second named
        -- a commit HEAD never held or the one before. '' outside git or before the first
        -- commit; NULL unknown (kept before this): export reads it from commit times.
        ALTER TABLE review_pairs ADD COLUMN note_commit TEXT;
        ALTER TABLE acceptance ADD COLUMN note_commit TEXT;
        """,
    )
)

MIGRATIONS.append(
    (
        27,
        "escalations read by their pair and by the job that raised them",
        """
        -- The report asks of each FAIL of its period whether it was escalated (report.data's
        -- FAIL_THEN), and of each failed job whether it raised an escalation: with only the
        -- open ones indexed (escalations_open), each question read every escalation ever
        -- decided. A night's report of 10,000 jobs took 59 s beside 20,000 decided
        -- escalations, 3 s without them.
        CREATE INDEX escalations_pair ON escalations (note_path, gate_id, model_partition, raised_at);
        CREATE INDEX escalations_job ON escalations (job_id);
        """,
    )
)

MIGRATIONS.append(
    (
        28,
        "the cron minute a run by its clock stands for",
        """
        -- A control back at 03:07 runs the 03:00 entry late; `status` said its start,
        -- a time no cron names. NULL: a run by hand, or one recorded before this.
        ALTER TABLE sweep_runs ADD COLUMN cron_at TEXT;
        """,
    )
)

MIGRATIONS.append(
    (
        29,
        "the queued jobs of the feedback cycle, from an index",
        """
        -- Dispatch takes a reviewer's queued fixes and re-reviews before its first reviews
        -- (control.CYCLE_SQL, whose term this is word for word): without this index each
        -- dispatch (per outcome) read every queued job of the reviewer to find them, 20,000
        -- on a big night. Its columns are review_jobs_dispatch's, so that the planner,
        -- given no statistics, takes this one, the smaller, for the query that may use it.
        CREATE INDEX review_jobs_cycle_queued ON review_jobs (reviewer, status, id)
            WHERE status = 'queued'
            AND (kind = 'fix' OR (kind = 'review' AND source_job_id IS NOT NULL));
        """,
    )
)

LATEST = MIGRATIONS[-1][0]
