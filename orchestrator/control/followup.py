"""What the control process does after a job ends (CONTRACT §7): fixes and their re-reviews,
escalations, audits of PASS decisions, and the next bundle of a sequential sweep.

:class:`FollowUp` is the ``hooks`` object of :class:`orchestrator.control.control.Control`.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from orchestrator import logs
from orchestrator.config import ConfigError
from orchestrator.control.attempts import fail_job
from orchestrator.cycles import escalations as cycles
from orchestrator.cycles.escalations import DecideError
from orchestrator.cycles.fixes import (
    apply_fix,
    create_fix_job,
    current_failures,
    finish_fix_job,
    open_fix_job,
)
from orchestrator.kb.gates import SelectionError
from orchestrator.kb.notes import KBError, NoteParseError
from orchestrator.review.bundle import missing_named
from orchestrator.review.finalize import (
    FinalizeResult,
    Provenance,
    decided_since,
    finalize,
    texts_taken_at,
)
from orchestrator.review.jobs import clear_job_folder, create_jobs, display_path
from orchestrator.review.selector import SelectError, current_notes, select
from orchestrator.state.files import write_job_files_after_commit
from orchestrator.state.status import findings, redo_call
from orchestrator.state.store import utcnow
from orchestrator.state.workspace import Workspace
from orchestrator.sweeps.producer import SweepRequest, enqueue, start_run

BY_HAND = "when run by hand"  # how a manual path's job fails: at once (CONTRACT §5)


class FollowUp:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.store = ws.store
        self.log = logs.get()

    # --- review and audit jobs --------------------------------------------------------
    def after_completed(
        self, job_id: int, job: sqlite3.Row | None = None, decided: list[dict] | None = None
    ) -> None:
        """``job`` and ``decided``: as :meth:`orchestrator.control.control.Hooks.after_completed`
        says; the follow-ups read none of the fields finalize changed in the job's row."""
        with self._or_logged(job_id, "after a completed job"):
            self._after_completed(job_id, job, decided)

    def after_failed(self, job_id: int, reasons: list[str], *, at_once: str = "") -> None:
        """A job out of attempts: its pairs go to a person with the reason.

        ``at_once`` says how a job failed without using its attempts ("when run by hand",
        "without starting"). A review's pairs are then left free for the next sweep, as
        OPERATIONS says (escalated, each read "the reviewer failed every attempt" though
        none ran). A fix's FAILs and an audit's PASSes still go to a person: they are
        accepted, so no sweep would meet them again. A failed review's notes' pairs held
        for it (:meth:`_fix_or_escalate`) go to a person then: nothing else ends the wait."""
        job = self.job(job_id)
        if not (at_once and job["kind"] == "review"):
            with self._or_logged(job_id, "after a failed job"):
                self._after_failed(job_id, reasons, f"failed {at_once or 'every attempt'}")
        if job["kind"] != "review":
            return
        with self._or_logged(job_id, "escalations held for its review"):
            opts = cycles.run_options(self.store, job)
            for note_path in sorted({p["note_path"] for p in self._pairs(job_id)}):
                if opts.get("fix"):
                    self._fix_or_escalate(job, note_path, opts, None, fix=False)

    @contextmanager
    def _or_logged(self, job_id: int, what: str) -> Iterator[None]:
        """A follow-up that cannot be made (a note renamed, a profile or gate removed
        since the job was queued) is logged and left out, and the outcome it follows is
        kept: raised, it would roll that outcome back, and the control process would
        take the outcome again and again all night. Database errors still raise: the
        transaction itself is in question then."""
        try:
            with self.store.write():  # a savepoint: a half-made follow-up is undone
                yield
        except sqlite3.Error:
            raise
        except Exception as exc:
            self.log.error(
                "followup.failed",
                job_id=job_id,
                follow_up=what,
                error=f"{type(exc).__name__}: {exc}",
            )

    def _after_completed(
        self, job_id: int, job: sqlite3.Row | None = None, decided: list[dict] | None = None
    ) -> None:
        job = job if job is not None else self.job(job_id)
        if job["kind"] == "audit":
            self._after_audit(job)
            return
        if job["kind"] != "review":
            return
        opts = cycles.run_options(self.store, job)
        pairs = decided if decided is not None else self._pairs(job_id)
        fix_notes: set[str] = set()
        waiting: dict[str, list] = {}  # pairs past three by note, for a note unreadable now
        for p in pairs:
            if p["decision"] != "FAIL" or not self._accepted(job, p):
                continue
            n = cycles.count(self.store, job["model_partition"], p["note_path"], p["gate_id"])
            if n >= cycles.ESCALATE_AT and self._about_a_text_gone(job, p):
                # Held by an escalation, the person's edit would wait for someone to
                # decide on findings about the text it replaced: it is reviewed at the
                # next sweep instead, and a FAIL of it is the rejection that escalates.
                said = {"job_id": job_id, "note_path": p["note_path"], "gate_id": p["gate_id"]}
                self.store.after_commit(
                    functools.partial(
                        self.log.info,
                        "escalation.skipped",
                        **said,
                        cycles=n,
                        reason="the note or the gate was edited since the job read them, "
                        "and the pair is stale: the next sweep reviews it as it is",
                    )
                )
            elif n >= cycles.ESCALATE_AT and not opts.get("fix"):
                # Each follow-up in a savepoint of its own: one that cannot be made must not
                # undo the others (a third rejection's escalation above all).
                with self._or_logged(job_id, f"escalation of {p['note_path']} {p['gate_id']}"):
                    self._escalate_pair(
                        job, p, self._rejections_said(job, p, n), opts, cycles.gist(p["rationale"])
                    )
            elif opts.get("fix"):
                fix_notes.add(p["note_path"])
                if n >= cycles.ESCALATE_AT:
                    waiting.setdefault(p["note_path"], []).append(p)
        if opts.get("fix"):
            # A note's PASS too may end the wait of its pairs held for its review.
            for note_path in sorted({p["note_path"] for p in pairs}):
                fix = note_path in fix_notes
                asks = self._asks(job, note_path) if fix else None
                self._fix_or_escalate(job, note_path, opts, asks, waiting.get(note_path), fix=fix)
        with self._or_logged(job_id, "audit"):
            self._audit(job, pairs, opts)
        if opts.get("sequential"):
            self._next_bundle(job, opts)

    def _after_audit(self, job) -> None:
        for p in self._pairs(job["id"]):
            if p["decision"] != "FAIL":
                continue
            original = self.store.conn.execute(
                "SELECT id, rationale FROM review_pairs WHERE job_id = ? AND note_path = ? AND gate_id = ?",
                (job["source_job_id"], p["note_path"], p["gate_id"]),
            ).fetchone()
            review_partition = self.store.conn.execute(
                "SELECT model_partition, reviewer FROM review_jobs WHERE id = ?",
                (job["source_job_id"],),
            ).fetchone()
            if (why := self._audited_pass_replaced(job, p, original, review_partition)) is not None:
                said = {"job_id": job["id"], "note_path": p["note_path"], "gate_id": p["gate_id"]}
                self.store.after_commit(
                    functools.partial(self.log.info, "audit.outdated", **said, reason=why)
                )
                continue
            cycles.escalate(
                self.store,
                self.ws.state_dir,
                self.ws.root,
                partition=review_partition["model_partition"],
                note_path=p["note_path"],
                gate_id=p["gate_id"],
                reason=f"the auditor ({job['reviewer']}) refuted a PASS (audit job {job['id']})",
                reviewer=review_partition["reviewer"],
                fixer=None,
                material=[
                    f"Reviewer's PASS (job {job['source_job_id']}): "
                    + _one_block(original["rationale"] if original else ""),
                    f"Auditor's FAIL (job {job['id']}): " + _one_block(p["rationale"]),
                ],
                recommend=f"the auditor found the failure mode: {cycles.gist(p['rationale'])}",
                job_id=job["id"],
            )

    def _audited_pass_replaced(self, job, p, original, review) -> str | None:  # noqa: ANN001
        """Why the PASS an audit refuted is no longer the pair's word, or None: a newer
        review (of the note edited since) or a person's decision was accepted while the
        audit waited or ran. Escalated, the pair was held about a text no longer on
        record, and a `decide reject` wrote a person's FAIL over the current PASS."""
        acc = self.store.acceptance(review["model_partition"], p["note_path"], p["gate_id"])
        if acc is None or original is None or acc.review_pair_id == original["id"]:
            return None
        by = self.store.conn.execute(
            "SELECT j.id, j.kind FROM review_pairs r JOIN review_jobs j ON j.id = r.job_id "
            "WHERE r.id = ?",
            (acc.review_pair_id,),
        ).fetchone()
        whose = (
            f"review job {by['id']}'s {acc.decision}"
            if by is not None and acc.source not in ("human", "ack")
            else f"a person's {'ack' if acc.source == 'ack' else 'decision'}"
        )
        return (
            f"the PASS it audited (review job {job['source_job_id']}) is no longer the "
            f"pair's accepted review: {whose} replaced it; the auditor's FAIL is kept in "
            "this job, and nothing is escalated"
        )

    def _after_failed(self, job_id: int, reasons: list[str], failed: str) -> None:
        job = self.job(job_id)
        opts = cycles.run_options(self.store, job)
        pairs = self._pairs(job_id)
        # An agent that failed every attempt said nothing about the note: the person is
        # asked to repair it and redo, not to reject the note for it.
        if job["kind"] == "audit":
            # An audit records nothing of its own: the pairs, and a person's decision on
            # them, belong to the reviewed job's partition, not the auditor's. Its PASSes
            # stand, so a redo has nothing to fix (decide refuses it): approve, or repair
            # the auditor and audit again.
            what = f"the auditor ({job['reviewer']})"
            owner, call = self.job(job["source_job_id"]), "approve"
            recommend = (
                "{what} {failed} ({why}); the reviewer's PASS stands unaudited: "
                "approve it, or repair the auditor"
            )
        else:
            what = "the fixer" if job["kind"] == "fix" else "the reviewer"
            owner, call = job, "redo"
            recommend = (
                "{what} {failed} ({why}), which is no judgement of the note; "
                "repair {what}, then redo"
            )
        if job["kind"] == "fix":
            pairs = [*pairs, *self._failures_left(job, {p["gate_id"] for p in pairs})]
            pairs = [p for p in pairs if not self._settled_since(job, p)]
        for p in pairs:
            why = _reasons_of(reasons, p, pairs, job_id)
            reason = f"{what} {failed}: {why}"
            with self._or_logged(job_id, f"escalation of {p['note_path']} {p['gate_id']}"):
                said = recommend.format(what=what, failed=failed, why=why)
                self._escalate_pair(owner, p, reason, opts, said, call=call, by=job_id)

    def _about_a_text_gone(self, job, p) -> bool:  # noqa: ANN001 - rows
        """Whether a review's FAIL is about a text the note no longer has, as far as its
        gate is concerned (a person edited what it watches while the job waited, CONTRACT
        §3): not the FAIL a fix would be given. A note or gate gone is not: no sweep
        reviews the pair again, and only a person can close it."""
        kb = self.ws.kb
        if self.ws.catalog().recorded(kb, p["gate_id"], p["gate_path"]) is None:
            return False
        try:
            note = kb.read_note(kb.check_rel(p["note_path"]))
        except (KBError, NoteParseError, OSError):
            return False
        current = current_failures(
            kb,
            self.store,
            self.ws.catalog(),
            job["model_partition"],
            p["note_path"],
            note,
            include={p["gate_id"]},
        )
        return p["gate_id"] not in {t.gate_id for t in current}

    def _settled_since(self, job, p) -> bool:  # noqa: ANN001
        """Whether a person settled the pair after the fix job read the note: approved it,
        rejected it into their FAIL, or acked a PASS or WARN. Escalated when the fix
        failed, they were sent a redo of a finding they had settled. An acked FAIL is the
        finding still, and nothing but that escalation would get it fixed."""
        who = decided_since(self.store, job, p, texts_taken_at(self.store, job))
        if who is None:
            return False
        acc = self.store.acceptance(job["model_partition"], p["note_path"], p["gate_id"])
        return who != "ack" or acc is None or acc.decision != "FAIL"

    def _failures_left(self, job, covered: set[str]) -> list[dict]:
        """The note's current FAILs a fix job did not carry: they came in while it was
        open (their own fix was skipped for it). Left out when it failed, they stayed
        accepted FAILs that nothing would fix, escalate or review again."""
        fails = self._note_failures(job, job["note_path"]) or []  # None: the next sweep says
        return [p for p in fails if p["gate_id"] not in covered]

    def _note_failures(self, job, note_path: str) -> list[dict] | None:  # noqa: ANN001 - a row
        """The note's current FAILs in the job's partition, as pairs (those a fix is given),
        or None when the note cannot be read (deleted or broken since)."""
        kb = self.ws.kb
        try:
            note = kb.read_note(kb.check_rel(note_path))
        except (KBError, NoteParseError, OSError):
            return None
        return [
            {
                "note_path": note_path,
                "gate_id": t.gate_id,
                "gate_path": t.gate_path,
                "rationale": t.rationale,
            }
            for t in current_failures(
                kb, self.store, self.ws.catalog(), job["model_partition"], note_path, note
            )
        ]

    def _escalate_pair(
        self,
        job,
        p,
        reason: str,
        opts: dict,
        recommend: str,
        call: str = "reject",
        by: int | None = None,
    ) -> None:
        """``by``: the job whose outcome raises it, when not ``job`` (a failed audit
        escalates its source job's pairs)."""
        partition = job["model_partition"]
        material = findings(p["rationale"]) or [reason]
        cycles.escalate(
            self.store,
            self.ws.state_dir,
            self.ws.root,
            partition=partition,
            note_path=p["note_path"],
            gate_id=p["gate_id"],
            reason=reason,
            reviewer=job["review_reviewer"] if job["kind"] == "fix" else job["reviewer"],
            fixer=_fixer(job, opts),
            material=material,
            recommend=recommend,
            call=call,
            job_id=job["id"] if by is None else by,
        )

    # --- fixes ------------------------------------------------------------------------
    def _fixed_too_few(self, job, p) -> bool:  # noqa: ANN001 - rows
        """Whether a pair at its third rejection or more was given to the fixer less than
        twice since its count began: its FAILs came in while fixes of the note's other
        FAILs were open (their own fix skipped), and the re-reviews after those fixes
        counted. Escalated, a person was asked about a finding no fix had tried; it gets
        the fixes the cycle promises first, and the note's other pairs wait for them
        (CONTRACT §7)."""
        given = cycles.fixes_given(self.store, job["model_partition"], p["note_path"], p["gate_id"])
        return given < cycles.ESCALATE_AT - 1

    def _rejections_said(self, job, p, n: int) -> str:  # noqa: ANN001 - rows
        """An escalation's reason: its count, and how many of those rejections followed a
        fix that carried the gate when that is not all but the first review. A count past
        three read "5 consecutive rejections; … fixer fake" in the report's assessment, as
        if the fixer had tried four times at the gate; only its cycle lines said otherwise.
        Not of a run without --fix that no fix had a hand in: "0 of them after fixes" told
        of a fix cycle never on (C110)."""
        given = cycles.fixes_given(self.store, job["model_partition"], p["note_path"], p["gate_id"])
        said = f"{n} consecutive rejections"
        if n - given <= 1 or not (given or cycles.run_options(self.store, job).get("fix")):
            return said
        return f"{said}, {given} of them after fixes that carried it"

    def _fix_or_escalate(
        self,
        job,
        note_path: str,
        opts: dict,
        feedback: str | None,
        waiting: list | None = None,
        *,
        fix: bool = True,
    ) -> None:
        """The note's pairs go to a person together, once none of them is left to fix
        (CONTRACT §7). With ``fix``, a fix of the note's current FAILs is started if one of
        them is under three rejections or was given to the fixer less than twice
        (:meth:`_fixed_too_few`); the pairs due for a person ride along in it. While a fix
        of the note is open or a review of it that may start one is queued or running (a
        lens whose re-review has not come back, :meth:`_still_worked_on`), they wait:
        escalated one at a time, the first was about a text the held-back gate's later
        fixes rewrote ("changed since its FAIL"), and a person was asked about text that
        no longer existed while the note was still being rewritten. Then every pair past three is escalated, on the note's last text: with
        ``fix``, those held back too when no fix could be made (the note grew past the
        limit, is excluded), as no sweep reviews a FAIL of an unchanged note again.
        ``waiting``: the job's own pairs past three, escalated as they stand if the note
        cannot be read now."""
        partition = job["model_partition"]
        if not fix and not cycles.any_past_three(self.store, partition, note_path):
            return  # nothing of the note waits (a read of it for every PASS, spared)
        fails = self._note_failures(job, note_path)
        if fix and any(not self._due(job, p) for p in fails or []):
            with self._or_logged(job["id"], f"fix of {note_path}"):
                self._start_fix(job, note_path, opts, feedback=feedback)
        if self._still_worked_on(job, note_path):
            return
        for p in (
            waiting or []
            if fails is None
            else [p for p in fails if self._due(job, p) or (fix and self._past_three(job, p))]
        ):
            last = cycles.rejections(self.store, partition, note_path, p["gate_id"], 1)
            unchanged = bool(last) and last[-1]["kind"] == "fix-unchanged"
            n = cycles.count(self.store, partition, note_path, p["gate_id"])
            reason, recommend = self._rejections_said(job, p, n), cycles.gist(p["rationale"])
            if unchanged:
                reason += " (the last fix changed nothing)"
                recommend = recommend.rstrip(".") + "; the fixer's last attempt changed nothing"
            with self._or_logged(job["id"], f"escalation of {note_path} {p['gate_id']}"):
                self._escalate_pair(job, p, reason, opts, recommend)

    def _past_three(self, job, p) -> bool:  # noqa: ANN001 - a row
        n = cycles.count(self.store, job["model_partition"], p["note_path"], p["gate_id"])
        return n >= cycles.ESCALATE_AT

    def _due(self, job, p) -> bool:  # noqa: ANN001 - a row
        """Whether the pair is due for a person: three rejections, two fixes that carried it."""
        return self._past_three(job, p) and not self._fixed_too_few(job, p)

    def _still_worked_on(self, job, note_path: str) -> bool:  # noqa: ANN001 - a row
        """Whether a job of the note in the job's partition, other than the job, is queued
        or running whose outcome may still rewrite it and then ends the wait of its pairs:
        a fix, or a review of a run with fixing on (its FAIL starts a fix). Not a fix of
        another partition, whose outcomes follow that partition's pairs alone (C108), nor
        a review of a run without --fix or made by `create-jobs` (no reviewer), which
        starts no fix (C107): held for them, the pairs waited for good."""
        return (
            self.store.conn.execute(
                "SELECT 1 FROM review_jobs WHERE kind = 'fix' AND note_path = ?2 "
                "AND model_partition = ?1 AND status IN ('queued', 'running') AND id != ?3 "
                "UNION ALL SELECT 1 FROM review_jobs j "
                "JOIN review_pairs p ON p.job_id = j.id AND p.note_path = ?2 "
                "JOIN sweep_runs r ON r.id = j.sweep_run_id "
                "WHERE j.kind = 'review' AND j.status IN ('queued', 'running') "
                "AND j.reviewer IS NOT NULL AND j.model_partition = ?1 AND j.id != ?3 "
                "AND json_extract(r.options, '$.fix') LIMIT 1",
                (job["model_partition"], note_path, job["id"]),
            ).fetchone()
            is not None
        )

    def _start_fix(
        self, job, note_path: str, opts: dict, feedback: str | None = None, include=None
    ) -> int | None:
        fixer = opts.get("fixer") or job["reviewer"]
        return create_fix_job(
            self.ws.kb,
            self.ws.catalog(),
            self.store,
            self.ws.state_dir,
            note_path=note_path,
            partition=job["model_partition"],
            fixer=fixer,
            review_reviewer=job["reviewer"] if job["kind"] == "review" else job["review_reviewer"],
            sweep=job["sweep"],
            sweep_run_id=job["sweep_run_id"],
            source_job_id=job["id"],
            feedback=feedback,
            include=include,
        )

    def fix_output(self, job, output: bytes | None) -> str | None:
        """Apply a fixer's output. Returns a reason if the attempt failed, else None."""
        res = apply_fix(
            self.ws.kb, self.store, job, output, git_commit=self.ws.settings.fix.git_commit
        )
        if res.status == "invalid":
            return res.reason
        pairs = self._pairs(job["id"])
        partition = job["model_partition"]
        if res.status in ("stale", "decided"):
            finish_fix_job(
                self.store, self.ws.state_dir, job["id"], "completed", "not-applied", res.reason
            )
            self.log.warning(
                "fix.not_applied", job_id=job["id"], note_path=job["note_path"], reason=res.reason
            )
            if job["feedback"] and self._note_gone(job["note_path"]):
                self._asks_undelivered(job, pairs)
                return None
            # The note's FAILs that are still current get a fix of the note as it is:
            # after a person's edit ("stale"), one it left fresh (a region its gate does
            # not watch), which no sweep meets again (one it made stale is not current,
            # and the next sweep reviews their text); after a person's decision, the
            # other FAILs the fix carried (the person's pair is left out if they approved
            # it; an acked FAIL is the current finding).
            opts = cycles.run_options(self.store, job)
            self._fix_or_escalate(job, job["note_path"], opts, job["feedback"])
            return None
        if res.status == "unchanged":
            # Counts as a rejection with no re-review (CONTRACT §7).
            again = []
            with self.store.write():
                for p in pairs:
                    acc = self.store.acceptance(partition, p["note_path"], p["gate_id"])
                    if acc is None or acc.decision != "FAIL":
                        # A review of a person's text came in while the fix ran, and did
                        # not fail: a fix that changed nothing rejects nothing of it.
                        continue
                    n = cycles.reject(
                        self.store,
                        partition,
                        p["note_path"],
                        p["gate_id"],
                        "fix-unchanged",
                        job["id"],
                        "the fix changed nothing",
                    )
                    again.append((p, n))
                finish_fix_job(
                    self.store, self.ws.state_dir, job["id"], "completed", "unchanged", res.reason
                )
            self.log.warning("fix.unchanged", job_id=job["id"], note_path=job["note_path"])
            opts = cycles.run_options(self.store, job)
            # Another fix of what is left: its pairs under three or given to the fixer
            # once, and the note's FAILs that came in while it was open (their own fix was
            # skipped for it), even when all of its own are due for a person; those go to
            # a person with the note's others once none is left to fix.
            past = [p for p, n in again if n >= cycles.ESCALATE_AT]
            self._fix_or_escalate(job, job["note_path"], opts, job["feedback"], past)
            return None
        # The note is written, logged (fix.applied) and committed once this commits.
        finish_fix_job(self.store, self.ws.state_dir, job["id"], "completed", "applied", "")
        # With the note's FAILs that came in while it ran (their own fix was skipped for
        # it): one of a region the fix did not touch stays fresh, and no sweep meets it.
        left = self._failures_left(job, {p["gate_id"] for p in pairs})
        self._rereview(job, [*pairs, *left], res.new_text)
        return None

    def _note_gone(self, note_path: str) -> bool:
        try:
            return not (self.ws.kb.root / self.ws.kb.check_rel(note_path)).exists()
        except KBError:
            return True

    def _asks_undelivered(self, job, pairs) -> None:  # noqa: ANN001 - rows
        """A person's redo whose note was moved (git mv, a rename) or deleted before its
        fix was applied: their asks reached no note, and the job read "completed" with
        the reason in the log only. Its pairs are escalated again, the asks quoted, so
        `escalations`, `status` and the report say so until a person closes them (only
        reject can: the note is gone). Not carried to the new path by itself: a review
        is of a (path, text), and the fix's findings are of the old one (CONTRACT §3)."""
        # A pair a person approved since (the fix read "decided") has nothing left to
        # ask: escalated again, it reopened what they had just settled.
        partition = job["model_partition"]
        pairs = [
            p
            for p in pairs
            if (acc := self.store.acceptance(partition, p["note_path"], p["gate_id"])) is not None
            and acc.decision == "FAIL"
        ]
        if not pairs:
            return
        moved = self._same_text_now(job)
        where = f"moved to {', '.join(moved)}, the same text," if moved else "moved or deleted"
        asks = " / ".join(line.strip() for line in job["feedback"].splitlines() if line.strip())
        # Its head (to the first ': ') is what `escalations` shows of a reason.
        reason = (
            f"your redo asks were not delivered (the note was {where} before fix job "
            f"{job['id']} was applied): {asks}"
        )
        there = ", ".join(moved) or "its new path"
        opts = cycles.run_options(self.store, job)
        for p in pairs:
            cycles.escalate(
                self.store,
                self.ws.state_dir,
                self.ws.root,
                partition=job["model_partition"],
                note_path=p["note_path"],
                gate_id=p["gate_id"],
                reason=reason,
                reviewer=job["review_reviewer"],
                fixer=_fixer(job, opts),
                material=[f"your asks: {asks}", *findings(p["rationale"])],
                recommend=(
                    f"reject to close it; give your asks again with `reviewq decide … redo` "
                    f"once the review of {there} fails, or edit the note yourself"
                ),
                call="reject",
                job_id=job["id"],
            )
        self.log.warning(
            "fix.asks_undelivered",
            job_id=job["id"],
            note_path=job["note_path"],
            moved_to=moved,
            reason=reason,
        )

    def _same_text_now(self, job) -> list[str]:  # noqa: ANN001 - a review_jobs row
        """The notes whose text is the one the fixer was given: where a note moved."""
        row = self.store.conn.execute(
            "SELECT n.sha256 FROM review_pairs p JOIN snapshots n ON n.id = p.note_snapshot_id "
            "WHERE p.job_id = ? LIMIT 1",
            (job["id"],),
        ).fetchone()
        if row is None:
            return []
        notes = current_notes(self.ws.kb, self.ws.state_dir)
        return sorted(path for path, n in notes.items() if n is not None and n.sha256 == row[0])

    def _rereview(self, job, pairs, new_text: str | None) -> None:
        """Re-review the failing pairs, whether or not the selector would call them stale."""
        reviewer = job["review_reviewer"] or job["reviewer"]
        cat = self.ws.catalog()
        targets = [
            {"note_path": p["note_path"], "gate_id": p["gate_id"], "gate_path": p["gate_path"]}
            for p in pairs
        ]
        batch = create_jobs(
            self.ws.kb,
            cat,
            self.store,
            self.ws.state_dir,
            targets,
            model_partition=job["model_partition"],
            grouping="note",
            reviewer=reviewer,
            sweep=job["sweep"],
            sweep_run_id=job["sweep_run_id"],
            # The fixed note is written once this transaction commits: review that text.
            pending={job["note_path"]: new_text} if new_text is not None else None,
        )
        with self.store.write():
            for j in batch.jobs:
                self.store.conn.execute(
                    "UPDATE review_jobs SET source_job_id = ? WHERE id = ?",
                    (job["id"], j.review_job_id),
                )
        self.log.info(
            "fix.rereview",
            job_id=job["id"],
            jobs=[j.review_job_id for j in batch.jobs],
            skipped=[s.why for s in batch.skipped],
        )

    def decide(
        self,
        ids: list[int],
        note: str | None,
        decision: str,
        feedback: str | None,
        fixer: str | None = None,
        gate: str | None = None,
    ) -> tuple[list[dict], dict[str, int | None], dict[str, list[str]]]:
        """A person's one call on escalations (these ids, and all of a note's, a gate's or
        a note's of a gate): recorded in one transaction; a redo then queues one fix job
        per note carrying every gate's findings and the person's asks, by ``fixer`` if
        given, else the escalation's. Returns the escalations, note → fix job, and note →
        why each pair a redo released is to be reviewed again ("prose/x gate-changed"), as
        ``select`` says it.

        The decisions and the fix jobs commit together: a redo recorded without its fix
        job would close the escalation and lose the person's asks."""
        esc_ids = cycles.resolve(self.store, ids, note, self.ws.root, gate)
        if decision == "redo":
            self._one_partition_per_note(esc_ids)
        jobs: dict[str, int | None] = {}
        released: dict[str, list[str]] = {}
        with self.store.write():
            escs = cycles.decide_many(
                self.store,
                self.ws.state_dir,
                self.ws.kb,
                self.ws.catalog(),
                esc_ids,
                decision,
                feedback,
            )
            if decision == "redo":
                groups: dict[tuple[str, str], list[dict]] = {}
                for e in escs:
                    groups.setdefault((e["note_path"], e["model_partition"]), []).append(e)
                for (note_path, _), group in groups.items():
                    gates = {e["gate_id"] for e in group}
                    job_id = self.redo(group[0], feedback or "", gates, fixer)
                    jobs[note_path] = jobs.get(note_path) or job_id
                for note_path, job_id in jobs.items():
                    mine = [e for e in escs if e["note_path"] == note_path]
                    if job_id is None:
                        released[note_path] = self._check_released(note_path, mine)
                        continue
                    # A gate the fix does not carry (an auditor refuted its PASS) is not
                    # fixed: decided with the others by --note, it was closed as a redo
                    # and never reviewed or escalated again.
                    carried = {
                        g
                        for (g,) in self.store.conn.execute(
                            "SELECT gate_id FROM review_pairs WHERE job_id = ?", (job_id,)
                        )
                    }
                    left = [e for e in mine if e["gate_id"] not in carried]
                    if why := self._check_stale(note_path, left):
                        released[note_path] = why
        return escs, jobs, released

    def _one_partition_per_note(self, esc_ids: list[int]) -> None:
        """A note has one fix job at a time, and a fix job is a partition's: a redo of one
        note's escalations in two partitions made one and closed both, and the other's
        pair stayed an accepted FAIL that no sweep would review or fix again. Only the
        partitions with a FAIL to fix count: a redo where the reviewer failed every attempt
        queues no fix, it releases the pairs for the next sweep, and such a note's redo
        was refused in two partitions, and named twice, for no fix job at all."""
        by_note: dict[str, dict[str, list[tuple[int, str, str]]]] = {}
        for esc_id, note_path, partition, call, gate_id in self.store.conn.execute(
            "SELECT id, note_path, model_partition, call, gate_id FROM escalations "
            "WHERE id IN (SELECT value FROM json_each(?)) ORDER BY id",
            (json.dumps(esc_ids),),
        ):
            by_note.setdefault(note_path, {}).setdefault(partition, []).append(
                (esc_id, call, gate_id)
            )
        for note_path, parts in by_note.items():
            parts = {
                p: escs
                for p, escs in parts.items()
                if self._fails_to_fix(note_path, p, {g for _, _, g in escs})
            }
            if len(parts) > 1:
                calls = "; ".join(
                    f"{p}: "
                    + redo_call(" ".join(str(i) for i, _, _ in escs), [c for _, c, _ in escs])
                    for p, escs in sorted(parts.items())
                )
                raise DecideError(
                    f"{note_path}: its escalations are in {len(parts)} partitions with a FAIL "
                    "to fix, and a note "
                    f"gets one fix job at a time, of one partition; redo one partition now "
                    f"and the other once its fix has ended ({calls})"
                )

    def _fails_to_fix(self, note_path: str, partition: str, gates: set[str]) -> bool:
        """Whether a redo of ``gates`` of the note in ``partition`` would queue a fix job
        (:func:`create_fix_job`'s own test): a FAIL about its current text on record.
        A note that cannot be read is said by the decision's own checks."""
        try:
            note = self.ws.kb.read_note(self.ws.kb.check_rel(note_path))
        except (KBError, NoteParseError, OSError):
            return True
        return bool(
            current_failures(
                self.ws.kb, self.store, self.ws.catalog(), partition, note_path, note, gates
            )
        )

    def _check_released(self, note_path: str, escs: list[dict]) -> list[str]:
        """A redo that queued no fix job is still worth something when it releases stale
        pairs for the next sweep (a job that failed every attempt, CONTRACT §7). Otherwise
        the person's asks would go nowhere, so the whole decision is refused."""
        open_job = open_fix_job(self.store, note_path)
        if open_job is not None:
            raise DecideError(
                f"{note_path}: fix job {open_job} for this note is still open, and your asks "
                f"would not reach it; redo once it has ended (reviewq job {open_job}), or "
                "decide all of the note's escalations in one call (--note)"
            )
        return self._check_stale(note_path, escs)

    def _check_stale(self, note_path: str, escs: list[dict]) -> list[str]:
        """Refuse the decision if a redo of one of ``escs`` would do nothing: no fix for
        it, and its pair fresh, so no sweep would review it either. Else why each is
        stale, as ``select`` says it ("prose/x gate-changed")."""
        why = []
        for e in escs:
            try:
                stale = select(
                    self.ws.kb,
                    self.ws.catalog(),
                    self.store,
                    selectors=(e["gate_id"],),
                    note_paths=(note_path,),
                    model=e["model_partition"],
                    diffs=False,
                ).targets
            except (SelectionError, SelectError, KBError):
                continue  # the gate or the note is gone: nothing left to review
            if not stale:
                raise DecideError(
                    f"escalation {e['id']} ({note_path} {e['gate_id']}): no FAIL is left to "
                    "fix and the pair is fresh (an auditor refuted its PASS, or a review "
                    "passed since), so a redo would do nothing; approve or reject it, or "
                    "edit the note yourself"
                )
            why.append(f"{e['gate_id']} {stale[0].reason}")
        return why

    def redo(
        self, esc: dict, feedback: str, gates: set[str] | None = None, fixer: str | None = None
    ) -> int | None:
        """A person's redo: a fix job carrying their asks verbatim. It belongs to a sweep
        run of its own with fixing on, so the cycle goes on from a fresh count."""
        gates = gates or {esc["gate_id"]}
        fixer = fixer or esc["fixer"] or esc["reviewer"] or "offline"
        if fixer not in self.ws.settings.reviewers:
            # Queued, the fix failed unrun and escalated the pair again with the same
            # fixer, at every redo: a loop with no way out but reject.
            where = self.ws.settings.config_path or "reviewq.toml"
            raise DecideError(
                f"escalation {esc['id']}: its fixer profile {fixer!r} is not configured in "
                f"{where}; name one with --fixer, or approve or reject"
            )
        reviewer = self._rereviewer(esc, fixer)
        self._not_too_large(esc)
        options = {"fix": True, "reviewer": reviewer, "fixer": fixer, "selectors": sorted(gates)}
        # The night's auditor and audit marks go on: without them the fixed note's PASS
        # was "audited" by its own reviewer, or not at all.
        night = self.store.conn.execute(
            # A person's approve or reject is a review job too, of no run: not the night.
            "SELECT j.sweep_run_id FROM review_jobs j JOIN review_pairs p ON p.job_id = j.id "
            "WHERE j.kind = 'review' AND j.model_partition = ? AND p.note_path = ? "
            "AND j.sweep_run_id IS NOT NULL ORDER BY j.id DESC LIMIT 1",
            (esc["model_partition"], esc["note_path"]),
        ).fetchone()
        if night is not None:
            were = cycles.run_options(self.store, night)
            options |= {k: were[k] for k in ("auditor", "audit") if were.get(k)}
        with self.store.write():
            run_id = start_run(self.store, "decide", "decide", options)
        return create_fix_job(
            self.ws.kb,
            self.ws.catalog(),
            self.store,
            self.ws.state_dir,
            note_path=esc["note_path"],
            partition=esc["model_partition"],
            fixer=fixer,
            review_reviewer=reviewer,
            sweep="decide",
            sweep_run_id=run_id,
            source_job_id=None,
            feedback=feedback,
            include=gates,
        )

    def _not_too_large(self, esc: dict) -> None:
        """Refuse a redo of a note grown past [limits] max_note_bytes: its fix was skipped
        (the fixer would be sent it whole), and "fix job queued" waited for nothing."""
        try:
            why = self.ws.kb.note_too_large(self.ws.kb.check_rel(esc["note_path"]))
        except (KBError, OSError):
            return  # said as it always was, by the fix job's own refusal
        if why is not None:
            raise DecideError(
                f"escalation {esc['id']}: {esc['note_path']}: {why}; a fixer would get it "
                "whole: cut the note down (or raise the limit), or approve or reject"
            )

    def _rereviewer(self, esc: dict, fixer: str) -> str:
        """Who reviews the fixed note, in the escalation's partition: its reviewer while
        configured for it, else the fixer. One of another partition or not configured was
        queued anyway (a fixer may be any model), and the review failed unrun at dispatch."""
        partition = esc["model_partition"]
        for name in (esc["reviewer"], fixer):
            profile = self.ws.settings.reviewers.get(name or "")
            if profile is not None and profile.partition == partition:
                return name
        profile = self.ws.settings.reviewers[fixer]
        named = (
            f"its reviewer {esc['reviewer']!r} is not configured for it, and "
            if esc["reviewer"]
            else ""
        )
        raise DecideError(
            f"escalation {esc['id']}: the fixed note is reviewed again in partition "
            f"{partition!r}, but {named}the fixer {fixer!r} writes partition "
            f"{profile.partition!r}; name with --fixer a profile of partition {partition!r}, "
            "or approve or reject"
        )

    # --- audits -----------------------------------------------------------------------
    def _audit(self, job, pairs, opts: dict) -> None:
        marked = {m.strip().strip("/") for m in opts.get("audit") or ()}  # as select reads them
        cat = self.ws.catalog()
        chosen = []
        for p in pairs:
            gate = cat.recorded(self.ws.kb, p["gate_id"], p["gate_path"])
            if (
                p["decision"] == "PASS"
                and self._accepted(job, p)
                and gate is not None
                and (gate.audit or gate.lens in marked or gate.gate_id in marked)
            ):
                chosen.append(p)
        if not chosen:
            return
        auditor = opts.get("auditor") or job["reviewer"]
        if auditor is None:
            # A job made by create-jobs and finished by hand names no reviewer, and no
            # sweep named an auditor: said as such, not as an error about a profile "None".
            self.log.warning(
                "audit.skipped",
                job_id=job["id"],
                reason="the job was made by hand and names no reviewer, so there is no "
                "auditor: its PASSes of audited gates stand unaudited",
            )
            return
        profile = self.ws.settings.reviewers.get(auditor)
        if profile is None:
            self.log.error(
                "audit.skipped", job_id=job["id"], reason=f"no reviewer profile {auditor!r}"
            )
            return
        with self.store.write():
            now = utcnow()
            audit_id = self.store.conn.execute(
                "INSERT INTO review_jobs (kind, status, model_partition, grouping, lens, reviewer, job_dir, sweep, "
                "sweep_run_id, source_job_id, created_at, updated_at) VALUES ('audit', 'queued', ?, 'audit', ?, ?, '', "
                "?, ?, ?, ?, ?) RETURNING id",
                (
                    profile.partition,
                    job["lens"],
                    auditor,
                    job["sweep"],
                    job["sweep_run_id"],
                    job["id"],
                    now,
                    now,
                ),
            ).fetchone()[0]
            folder = clear_job_folder(self.ws.state_dir, audit_id)
            self.store.conn.execute(
                "UPDATE review_jobs SET job_dir = ? WHERE id = ?",
                (display_path(self.ws.state_dir, folder), audit_id),
            )
            for p in chosen:
                self.store.conn.execute(
                    "INSERT INTO review_pairs (job_id, note_path, gate_id, gate_path, lens, note_snapshot_id, "
                    "gate_snapshot_id, note_commit) SELECT ?, note_path, gate_id, gate_path, lens, "
                    "note_snapshot_id, gate_snapshot_id, note_commit FROM review_pairs WHERE id = ?",
                    (audit_id, p["id"]),
                )
            write_job_files_after_commit(self.store, self.ws.state_dir, audit_id)
        source_id = job["id"]
        self.store.after_commit(  # as fix.queued: the outcome's transaction may roll back
            lambda: self.log.info(
                "audit.queued",
                job_id=audit_id,
                source_job_id=source_id,
                reviewer=auditor,
                pairs=len(chosen),
            )
        )

    # --- sequential sweeps ------------------------------------------------------------
    def _next_bundle(self, job, opts: dict) -> None:
        pairs = self._pairs(job["id"])
        notes = {p["note_path"] for p in pairs}
        reviewed = {(p["note_path"], p["gate_id"]) for p in pairs}
        for note_path in sorted(notes):
            req = SweepRequest(
                name=job["sweep"] or "sequential",
                reviewer=opts.get("reviewer") or job["reviewer"],
                selectors=tuple(opts.get("selectors") or ()),
                all_gates=bool(opts.get("all_gates")),
                # ROOT's note: read as given, from the working folder first, a control
                # started in another checkout holding the path read that one instead.
                notes=(str(self.ws.root / note_path),),
                grouping=opts.get("grouping") or "note",
                batch_size=opts.get("batch_size") or 5,
                fix=bool(opts.get("fix")),
                sequential=True,
                fixer=opts.get("fixer") or "",
                auditor=opts.get("auditor") or "",
                audit=tuple(opts.get("audit") or ()),
                trigger="sequential",
            )
            try:
                with self.store.write():
                    enqueue(self.ws, req, run_id=job["sweep_run_id"], just_reviewed=reviewed)
            except KBError as exc:
                # Renamed or deleted since its review: the sweep goes on without it.
                self.log.warning(
                    "sequential.skipped", job_id=job["id"], note_path=note_path, reason=str(exc)
                )
            except (ConfigError, SelectError, SelectionError) as exc:
                # A profile, a gate or a note root gone since: said once per note, and the
                # job's other follow-ups stand.
                self.log.error(
                    "followup.failed",
                    job_id=job["id"],
                    follow_up=f"next bundle of {note_path}",
                    error=f"{type(exc).__name__}: {exc}",
                )

    def _asks(self, job, note_path: str) -> str | None:
        """A person's redo asks stay with the cycle they started: a re-review made after a
        fix carries the asks of that fix on to the next one. A redo that queued no fix (no
        FAIL on record: it released the pair) gives its asks to the first fix of the note
        after it, while the note is the text the person decided on: the released pair's
        next review starts that fix, and without them the person's words reached no one.
        So does a redo whose fix a person's edit dropped (``not-applied``) with no FAIL
        left current to fix then: the review of their text starts the fix its asks go to,
        as a FAIL their edit left current gets them at once (:meth:`fix_output`)."""
        if job["source_job_id"] is not None:
            src = self.job(job["source_job_id"])
            return src["feedback"] if src is not None and src["kind"] == "fix" else None
        rows = self.store.conn.execute(
            "SELECT e.feedback FROM escalations e WHERE e.decision = 'redo' "
            "AND e.note_path = ?1 AND e.model_partition = ?2 AND trim(e.feedback) != '' "
            "AND (EXISTS (SELECT 1 FROM review_pairs p JOIN snapshots n ON n.id = p.note_snapshot_id "
            "WHERE p.job_id = ?3 AND p.note_path = ?1 AND n.sha256 = e.note_sha256) "
            "OR EXISTS (SELECT 1 FROM review_jobs d WHERE d.kind = 'fix' AND d.note_path = ?1 "
            "AND d.created_at >= e.decided_at AND d.result = 'not-applied' AND d.feedback = e.feedback)) "
            "AND NOT EXISTS (SELECT 1 FROM review_jobs f WHERE f.kind = 'fix' "
            "AND f.note_path = ?1 AND f.created_at >= e.decided_at "
            "AND f.result IS NOT 'not-applied') "
            "ORDER BY e.decided_at, e.id",
            (note_path, job["model_partition"], job["id"]),
        ).fetchall()
        asks = list(dict.fromkeys(r[0].strip() for r in rows))  # a --note redo: one per gate
        return "\n\n".join(asks) or None

    # --- helpers ------------------------------------------------------------------------
    def job(self, job_id: int):
        return self.store.conn.execute(
            "SELECT * FROM review_jobs WHERE id = ?", (job_id,)
        ).fetchone()

    def _accepted(self, job, p) -> bool:
        """Whether the pair's verdict is what counts for it now: not one finalize kept
        out because a person decided or acked the pair after the job read it. Finalize's
        own word (``accepted``: it accepted it in this transaction) needs no read."""
        if isinstance(p, dict) and p.get("accepted"):
            return True
        acc = self.store.acceptance(job["model_partition"], p["note_path"], p["gate_id"])
        return acc is not None and acc.review_pair_id == p["id"]

    def _pairs(self, job_id: int):
        return self.store.conn.execute(
            "SELECT * FROM review_pairs WHERE job_id = ? ORDER BY id", (job_id,)
        ).fetchall()


def _reasons_of(reasons: list[str], pair, pairs, job_id: int) -> str:  # noqa: ANN001 - rows
    """A failed job's reasons as one of its pairs' escalation says them: those about
    this pair and those about no pair. Each of a bundle's escalations quoted the job's
    reasons whole, so "invalid result line for N :: G1" stood under gate G2 too."""

    def about(reason: str, p) -> bool:  # noqa: ANN001
        named = missing_named(reason)
        if named is not None:
            return (p["note_path"], p["gate_path"]) in named
        return p["note_path"] in reason and p["gate_path"] in reason

    own = [r for r in reasons if about(r, pair) or not any(about(r, q) for q in pairs)]
    if own:
        return "; ".join(own[:3])
    if reasons:
        return f"its output for other pairs of job {job_id} was refused (reviewq job {job_id})"
    return "no reason recorded"


@dataclass
class Followed:
    """What a job's follow-up started: jobs queued (fixes, audits, a next bundle) and
    escalations opened."""

    jobs: list[tuple[int, str]] = field(default_factory=list)  # (id, kind)
    escalations: list[tuple[int, str, str]] = field(default_factory=list)  # (id, note, gate)


def finalize_by_hand(
    ws: Workspace,
    job_id: int,
    output: bytes | None,
    provenance: Provenance,
    attempt: int | None = None,
) -> tuple[FinalizeResult, Followed]:
    """The manual paths' finalize (``reviewq finalize``, ``run-job``): a bad output fails
    the job at once (CONTRACT §5); a good one is followed as the control process follows it,
    by a fix, an audit, the escalation of a third rejection or a sequential sweep's next
    bundle, in the same transaction."""
    store = ws.store
    with store.write():
        since = _last_ids(store)
        res = finalize(
            store,
            ws.state_dir,
            job_id,
            output,
            attempt=attempt,
            provenance=provenance,
            max_bytes=ws.settings.max_output_bytes,
            within=cycles.record_decisions,
        )
        follow = FollowUp(ws)
        if res.ok:
            follow.after_completed(job_id)
        else:
            follow.after_failed(job_id, res.failure_reasons, at_once=BY_HAND)
        _log_end_by_hand(store, res, attempt, provenance.runner)
        return res, _followed_since(store, since)


def _log_end_by_hand(
    store,  # noqa: ANN001 - a Store
    res: FinalizeResult,
    attempt: int | None,
    runner: str | None,
) -> None:
    """job.finalized or job.failed of a job ended by hand (``finalize``, ``run-job``), as
    the control process logs a queued job's, once the transaction that ends it commits:
    without them the log had the job created and never ended."""
    log = logs.get()
    if res.ok:
        counts: dict[str, int] = {}
        for p in res.pairs:
            counts[p["decision"]] = counts.get(p["decision"], 0) + 1
        store.after_commit(
            lambda: log.info(
                "job.finalized",
                job_id=res.review_job_id,
                attempt=attempt,
                runner=runner,
                by_hand=True,
                decisions=counts,
            )
        )
    elif res.status == "failed":
        store.after_commit(
            lambda: log.error(
                "job.failed",
                job_id=res.review_job_id,
                attempt=attempt,
                runner=runner,
                by_hand=True,
                reasons=res.failure_reasons[:10],
            )
        )


def fail_by_hand(
    ws: Workspace, job_id: int, reasons: list[str], runner: str | None = None
) -> Followed:
    """A manual path's failed job (``run-job``, its profile ``runner``): failed at once
    (CONTRACT §5), and followed as :meth:`FollowUp.after_failed` says of a job failed at once."""
    store = ws.store
    with store.write():
        since = _last_ids(store)
        fail_job(store, ws.state_dir, job_id, reasons, runner)
        FollowUp(ws).after_failed(job_id, reasons, at_once=BY_HAND)
        _log_end_by_hand(store, FinalizeResult(job_id, "failed", reasons), None, None)
        return _followed_since(store, since)


def fix_output_by_hand(
    ws: Workspace, job_id: int, output: bytes | None
) -> tuple[str | None, Followed]:
    """A manual path's fixer output (``run-job`` of a fix job), applied as the control
    process applies it: the reason it is unusable, or None; and what followed it (the
    re-review of an applied fix, the next fix or the escalation after one that changed
    nothing), said as :func:`finalize_by_hand` says a review's follow-ups."""
    store = ws.store
    with store.write():
        since = _last_ids(store)
        follow = FollowUp(ws)
        problem = follow.fix_output(follow.job(job_id), output)
        return problem, _followed_since(store, since)


def _last_ids(store) -> tuple[int, int]:  # noqa: ANN001 - a Store
    return store.conn.execute(
        "SELECT (SELECT coalesce(max(id), 0) FROM review_jobs), "
        "(SELECT coalesce(max(id), 0) FROM escalations)"
    ).fetchone()


def _followed_since(store, since: tuple[int, int]) -> Followed:  # noqa: ANN001 - a Store
    """The jobs and escalations made after :func:`_last_ids` said ``since``."""
    last_job, last_esc = since
    return Followed(
        jobs=[
            tuple(r)
            for r in store.conn.execute(
                "SELECT id, kind FROM review_jobs WHERE id > ? ORDER BY id", (last_job,)
            )
        ],
        escalations=[
            tuple(r)
            for r in store.conn.execute(
                "SELECT id, note_path, gate_id FROM escalations WHERE id > ? ORDER BY id",
                (last_esc,),
            )
        ],
    )


def _one_block(text: str | None, limit: int = 600) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _fixer(job, opts: dict) -> str | None:  # noqa: ANN001 - a row
    """The fixer of the run a job belongs to, or None when it fixed nothing: a run without
    --fix named its reviewer the fixer of escalations no fixer had touched. A fix job is
    its own fixer."""
    if job["kind"] == "fix":
        return job["reviewer"]
    if not opts.get("fix") and not opts.get("fixer"):
        return None
    return opts.get("fixer") or opts.get("reviewer") or job["reviewer"]
