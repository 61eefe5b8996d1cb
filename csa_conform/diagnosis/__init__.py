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

from typing import Mapping

import numpy as np

from csa_conform.diagnosis.findings import (
    CONSTANT_FACTOR,
    Context,
    DECISIVE,
    Finding,
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
    differing_mask,
)


def diagnose(stage: str, expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
             axes: Mapping[str, tuple[str, ...]], context: Context) -> list[Finding]:
    """Every finding on the stage's diverged tensors, strongest kind first, payload order within a kind."""
    from csa_conform.diagnosis import factor, layout, permutation, quantization, restriction, shift, unwritten

    detectors = (unwritten.never_written, unwritten.stale, layout.layout, layout.aliased, permutation.permuted,
                 shift.index_shift,
                 quantization.scale_exponent, factor.constant_factor, restriction.restricted)
    findings: list[Finding] = []
    for position, (tensor, reference) in enumerate(expected.items()):
        device = actual.get(tensor)
        if device is None:
            continue
        reference, device = np.asarray(reference), np.asarray(device)
        if reference.shape != device.shape or reference.dtype != device.dtype or not reference.size:
            continue
        differ = differing_mask(reference, device)
        if not differ.any():
            continue
        names = tuple(axes.get(tensor, ())) or tuple(f"a{axis}" for axis in range(reference.ndim))
        for detector in detectors:
            found = detector(stage, tensor, reference, device, differ, names, context)
            if found is not None:
                findings.append(found)
    order = {kind: rank for rank, kind in enumerate(KINDS)}
    tensors = list(expected)
    findings.sort(key=lambda finding: (not finding.decisive, order[finding.kind], tensors.index(finding.tensor)))
    return findings


__all__ = ["CONSTANT_FACTOR", "Context", "DECISIVE", "Finding", "INDEX_SHIFT", "KINDS", "LAYOUT", "MIN_SUPPORT",
           "NEVER_WRITTEN", "PERMUTATION", "RESTRICTED", "ROUNDING_CONVENTION", "ROW_ALIASING", "SCALE_EXPONENT",
           "STALE", "STRUCTURAL", "SUB_STEP", "diagnose"]
