"""The NumPy oracle: a bit-exact port of the CPU reference, stage by stage."""

from csa_conform.contract import unsupported_reason
from csa_conform.oracle.pipeline import STAGES, StepResult, run_step

__all__ = ["STAGES", "StepResult", "run_step", "unsupported_reason"]
