"""Structural diagnosis: what a divergence's pattern says about the bug, before any numeric hypothesis.

A kernel that differs from the reference by an indexing, masking or packing
bug leaves a signature in the payloads a run already has: the device row is
the reference row shifted by one slot, only batch row 1 differs, a carry
still holds the runner's 0xA5 poison, row b holds row 0's data, axes were written in
another order, every FP4 byte has its nibbles
swapped, a scale exponent is one too large exactly where the block's amax is
a power of two, every score is the reference's times 1/sqrt(2). Each
detector (one module per kind, KINDS documents the vocabulary, see
specs/diagnosis.md) looks at one diverged tensor (device against reference)
and returns a ``Finding``: a kind, the evidence (counts, coordinates, the
pattern) and one plain headline. ``diagnose`` runs them over a stage's
diverged tensors, strongest kind first.
"""

from __future__ import annotations

from csa_conform.explain.patterns.detectors import diagnose, stage_findings
from csa_conform.explain.patterns.findings import (
    CONSTANT_FACTOR,
    DECISIVE,
    GUARD_READ,
    INDEX_SHIFT,
    KINDS,
    LAYOUT,
    MIN_SUPPORT,
    NEVER_WRITTEN,
    PERMUTATION,
    RESTRICTED,
    ROUNDING_CONVENTION,
    ROW_ALIASING,
    SCALE_EXPONENT,
    STALE,
    STRUCTURAL,
    SUB_STEP,
    Context,
    Finding,
)

__all__ = ["CONSTANT_FACTOR", "Context", "DECISIVE", "Finding", "GUARD_READ", "INDEX_SHIFT", "KINDS", "LAYOUT",
           "MIN_SUPPORT", "NEVER_WRITTEN", "PERMUTATION", "RESTRICTED", "ROUNDING_CONVENTION", "ROW_ALIASING",
           "SCALE_EXPONENT", "STALE", "STRUCTURAL", "SUB_STEP", "diagnose", "stage_findings"]
