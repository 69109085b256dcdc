"""Rejection cycles (CONTRACT §7): counting consecutive FAILs, escalations to a person and
their decisions, and fix jobs whose output rewrites a note."""
