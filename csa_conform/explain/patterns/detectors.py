"""Running every detector over a stage's diverged tensors, strongest kind first."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from csa_conform.compare.bitwise import default_axes
from csa_conform.contract import validate_step
from csa_conform.errors import ContractError
from csa_conform.explain.patterns.findings import KINDS, Context, Finding, comparable
from csa_conform.numerics.bits import differing_bits


def diagnose(stage: str, expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
             axes: Mapping[str, tuple[str, ...]], context: Context) -> list[Finding]:
    """Every finding on the stage's diverged tensors, strongest kind first, payload order within a kind."""
    from csa_conform.explain.patterns import factor, layout, permutation, quantization, restriction, shift, unwritten

    detectors = (unwritten.never_written, unwritten.guard_read, unwritten.stale, layout.layout, layout.aliased,
                 permutation.permuted, shift.index_shift,
                 quantization.scale_exponent, quantization.query_scale_exponent, factor.constant_factor, restriction.restricted)
    findings: list[Finding] = []
    for tensor, reference, device in comparable(expected, actual):
        differ = differing_bits(reference, device)
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


def stage_findings(info, outcome, stage: str) -> list[Finding]:
    """The structural findings on a stage's first divergent step (without the oracle's trace): the
    ``diagnose`` that csa_conform.check.conformance.check_case takes. A detector that raises costs the gate
    its diagnosis line, never its verdict: explain re-diagnoses the stage and reports the failure there."""
    try:
        return _stage_findings(info, outcome, stage)
    except Exception:  # noqa: BLE001 - a bug of csa-conform's diagnosis must not become the gate's verdict
        return []


def _stage_findings(info, outcome, stage: str) -> list[Finding]:
    expected, actual = outcome.expected.get(stage, {}), outcome.actual.stages.get(stage, {})
    try:
        geometry = validate_step(info.attrs, outcome.inputs or {}, info.output_names)
    except (ContractError, KeyError):
        geometry = None
    axes = {tensor: default_axes(stage, tensor, np.shape(array), np.asarray(array).dtype)
            for tensor, array in expected.items()}

    def tracer() -> dict:  # the oracle's intermediates of the stage, re-run only when a detector asks
        from csa_conform.explain.stages import run_stage
        from csa_conform.numerics.variant import Numerics

        trace: dict = {}
        if geometry is not None:
            try:
                run_stage(stage, geometry, outcome.inputs or {}, outcome.expected, Numerics(trace=trace))
            except (ContractError, KeyError):
                return {}
        return trace

    return diagnose(stage, expected, actual, axes,
                    Context(stage, geometry, outcome.inputs or {}, outcome.expected, tracer))
