"""How a sweep looks to a person: a progress bar while it runs, a summary table after."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.kb.notes import capped, excluded_words
from orchestrator.review.jobs import skipped_count
from orchestrator.state.status import FAILED_SHOWN, UNWRITTEN_SHOWN, more_failed, more_unwritten
from orchestrator.state.words import outcome_words

# rich (~50 ms) is imported where a bar or a table is drawn: a sweep with --json draws
# neither, and one whose stderr is no terminal only its summary tables, once it ends.
if TYPE_CHECKING:
    from rich.progress import Progress


class ProgressDisplay:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> ProgressDisplay:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]sweep"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("jobs", total=None, detail="")
        return self

    def update(self, p) -> None:  # p: orchestrator.state.status.Progress
        if self._progress is None:
            return
        detail = f"running {p.by_status.get('running', 0)}, queued {p.by_status.get('queued', 0)}"
        if p.waiting_paused:
            detail += f", {p.waiting_paused} wait on a paused reviewer"
        self._progress.update(self._task, total=max(p.total, 1), completed=p.done, detail=detail)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)


_NOTES_SHOWN = 20  # escalated notes listed with their decide command; the rest counted


def render_summary(out, only_reject, pauses: Sequence[str] = (), store=None) -> None:  # noqa: ANN001
    """``only_reject(note, gate)``: why an escalation can now only be rejected, or None.
    ``pauses``: each paused reviewer, as status says it. ``store``: state.db, for the
    calls that answer a note's escalations in several partitions (``decide_calls``)."""
    # Stored text as it is: every line carries some (an agent's stderr in a failed job's
    # reasons, a note's name). As markup, "[/INST]" made the summary an internal error;
    # as emoji codes, "a:fire:b.md" in a decide line was no longer the note's name.
    from rich.console import Console
    from rich.table import Table

    console = Console(markup=False, emoji=False, highlight=False)
    s = out.summary
    jobs = Table(title="Jobs", show_edge=False)
    jobs.add_column("reviewer")
    for col in ("queued", "running", "completed", "failed", "split"):
        jobs.add_column(col, justify="right")
    for reviewer, counts in sorted(s["jobs"].items()):
        jobs.add_row(
            reviewer,
            *(
                f"{counts.get(c, 0):,}"
                for c in ("queued", "running", "completed", "failed", "split")
            ),
        )
    console.print(jobs)
    decisions = Table(title="Decisions", show_edge=False)
    for d in ("PASS", "WARN", "FAIL", "ERROR"):
        decisions.add_column(d, justify="right")
    decisions.add_row(*(f"{s['decisions'].get(d, 0):,}" for d in ("PASS", "WARN", "FAIL", "ERROR")))
    console.print(decisions)
    if s.get("audits"):
        a = s["audits"]
        console.print(
            f"audits of PASS decisions: {a.get('PASS', 0):,} upheld, {a.get('FAIL', 0):,} refuted"
            + (f", {a.get('ERROR', 0):,} not judged" if a.get("ERROR") else ""),
            soft_wrap=True,
        )
    attempts = Table(title="Attempts", show_edge=False)
    attempts.add_column("outcome")
    attempts.add_column("count", justify="right")
    for outcome, n in sorted(s["attempts"].items()):
        attempts.add_row(outcome_words(outcome), f"{n:,}")
    console.print(attempts)
    enq = out.enqueued
    # soft_wrap on every sentence: a line keeps its words together however narrow the
    # console (cron mails what it prints at 80 columns: "skipped 9 (5 …, 4" on one line
    # and "waiting for a person); cost $0.39" on the next).
    console.print(
        f"enqueued {len(enq.jobs):,} job(s) ({sum(len(j.pairs) for j in enq.jobs):,} pairs), "
        f"{skipped_count(enq.skipped)}{enq.taken_over_words()}; "
        f"cost ${s['cost_usd']:,.4f}",
        soft_wrap=True,
    )
    if enq.problems:
        # Said on stderr before the summary, and so lost to a summary kept alone (cron mail
        # of stdout, a redirect): a note over [limits] max_note_bytes was never reviewed.
        console.print(f"{len(enq.problems):,} file(s) left out of the sweep:", soft_wrap=True)
        # As the warnings: a few a reason, the rest counted (the log names each).
        for line in capped(enq.problems, "  "):
            console.print(line, soft_wrap=True)
    if enq.excluded:
        console.print(excluded_words(enq.excluded), soft_wrap=True)
    # A few, the rest counted: a night whose reviewer crashed printed 165 lines of one
    # reason before the first escalation to decide.
    for f in s["failed"][:FAILED_SHOWN]:
        console.print(f"failed job {f['job_id']}: " + "; ".join(f["reasons"]), soft_wrap=True)
    if more := more_failed(len(s["failed"])):
        console.print(more, soft_wrap=True)
    if s.get("escalations"):
        # A note's escalations are one decision: one line a note (a partition, when they
        # are in several), with the command.
        from orchestrator.state.status import by_note, decide_calls, raised_by_agents

        notes = by_note(
            s["escalations"], lambda e: e["note_path"], lambda e: e["call"]
        )  # as the report has them
        # Another model's are open too, not this sweep's: unlabelled, a line of partition q
        # under a sweep of p read as raised by it. Each is labelled, and counted apart.
        ours = enq.model_partition
        others = sorted({e["model_partition"] for e in s["escalations"]} - {ours})
        elsewhere = sum(e["model_partition"] != ours for e in s["escalations"])
        # Those an agent raised counted apart, as the report and status count them: the
        # mail of a night whose reviewer crashed read "556 escalation(s)" as verdicts.
        agents = s.get("agents_failed", [])
        console.print(
            f"{len(s['escalations']):,} escalation(s) on {len(notes):,} note(s)"
            + raised_by_agents(agents)
            + " wait for a person "
            + (f"({elsewhere:,} of other partitions: {', '.join(others)}) " if others else "")
            + "(reviewq escalations):",
            soft_wrap=True,
        )
        for a in agents:
            console.print(f"  {a['says']}", soft_wrap=True)
        for note_path, escs in notes[:_NOTES_SHOWN]:
            calls = decide_calls(note_path, [(e["id"], e["model_partition"]) for e in escs], store)
            for partition, target in calls.items():
                gates = [e["gate_id"] for e in escs if partition in (None, e["model_partition"])]
                why = next(filter(None, (only_reject(note_path, g) for g in gates)), None)
                answers = f"reject ({why}: only reject closes it)" if why else "approve|redo|reject"
                if partition is None and escs[0]["model_partition"] != ours:
                    partition = escs[0]["model_partition"]
                console.print(
                    f"  {note_path}{f' [{partition}]' if partition else ''}: {len(gates)} gate(s) "
                    f"({', '.join(gates)}); reviewq decide {target} {answers}",
                    soft_wrap=True,
                )
        if len(notes) > _NOTES_SHOWN:
            console.print(
                f"  … and {len(notes) - _NOTES_SHOWN:,} more note(s): reviewq escalations lists all",
                soft_wrap=True,
            )
    unwritten = s.get("fixes_unwritten", [])
    for f in unwritten[:UNWRITTEN_SHOWN]:
        console.print(
            f"fix job {f['job_id']} is not written to {f['note_path']}: {f['error']}",
            soft_wrap=True,
        )
    if more := more_unwritten(len(unwritten)):
        console.print(more, soft_wrap=True)
    for line in pauses:
        console.print(line, soft_wrap=True)
