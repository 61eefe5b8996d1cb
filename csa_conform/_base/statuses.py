"""The verdict of a stage, spelled once: what diff, explain, the results document and the reports print.

A finding of a depth check (``--repeat``, ``--replay graph``) is named by the
status it gives its stages, so the two vocabularies cannot drift apart.
"""

IDENTICAL = "identical"
DIVERGED = "diverged"
NONDETERMINISTIC = "non-deterministic"
REPLAY_MISMATCH = "replay-mismatch"
NOT_APPLICABLE = "n/a"
NOT_COMPARED = "not compared"

__all__ = ["DIVERGED", "IDENTICAL", "NONDETERMINISTIC", "NOT_APPLICABLE", "NOT_COMPARED", "REPLAY_MISMATCH"]
