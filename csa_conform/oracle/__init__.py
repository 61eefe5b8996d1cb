"""The NumPy oracle: a bit-exact port of the CPU reference, stage by stage.

The pipeline loads on first use: it is composed from csa_conform.stages,
which imports this package's stage modules.
"""

from csa_conform.contract import unsupported_reason

__all__ = ["STAGES", "StepResult", "run_step", "unsupported_reason"]


def __getattr__(name):
    if name in ("STAGES", "StepResult", "run_step"):
        from csa_conform.oracle import pipeline

        return getattr(pipeline, name)
    raise AttributeError(name)
