"""The control process: attempts opened and ended, dispatch, outcomes, the reaper, reviewer
pauses, and what follows a job (fixes, escalations, audits, the next sequential bundle)."""
