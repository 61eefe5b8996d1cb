"""The NumPy oracle: a bit-exact port of the CPU reference, stage by stage.

Every stage of the pipeline spec (csa_conform.spec) has its function in
csa_conform.oracle.stage_functions; csa_conform.oracle.pipeline runs them.
"""

from csa_conform.contract import unsupported_reason
from csa_conform.oracle.pipeline import StepResult, run_step
from csa_conform.spec import STAGE_NAMES

__all__ = ["STAGE_NAMES", "StepResult", "run_step", "unsupported_reason"]
