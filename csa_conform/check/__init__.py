"""Replaying golden cases through a runner and judging each stage: verify (the oracle or another
numerics profile), conformance (a device runner), gap (two profiles) and invariance (edited cases)."""

from csa_conform.check.conformance import check_case
from csa_conform.check.model import CaseVerdict
from csa_conform.check.options import BuildChoice, RunOptions

__all__ = ["BuildChoice", "CaseVerdict", "RunOptions", "check_case"]
