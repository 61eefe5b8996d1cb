"""The verdict of a stage, spelled once: what diff, explain, the results document and the reports print.

A finding of a depth check (``--repeat``, ``--replay graph``) or of the guard
bands every run checks is named by the status it gives its stages, so the two
vocabularies cannot drift apart.
"""

IDENTICAL = "identical"
DIVERGED = "diverged"
NONDETERMINISTIC = "non-deterministic"
REPLAY_MISMATCH = "replay-mismatch"
OUT_OF_BOUNDS = "out-of-bounds"
NOT_APPLICABLE = "n/a"
NOT_COMPARED = "not compared"
# A case that cannot be judged (an attribute out of bounds, an unreadable tensor): its own verdict, never
# the whole file's; it ranks above a divergence when a command picks its exit code (specs/cli.md).
INVALID = "invalid"
# A kernel that faulted (a signal on the host, a sticky CUDA error) or never ended (--launch-timeout): the
# verdict of the stage its launch computes, a failure of the kernels like a divergence, never the run's error.
FAULT = "fault"
HANG = "hang"

__all__ = ["DIVERGED", "FAULT", "HANG", "IDENTICAL", "INVALID", "NONDETERMINISTIC", "NOT_APPLICABLE", "NOT_COMPARED",
           "OUT_OF_BOUNDS",
           "REPLAY_MISMATCH"]
