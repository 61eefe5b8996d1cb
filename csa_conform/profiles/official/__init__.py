"""The `official` numerics profile: DeepSeek-V4's own inference numerics at the CSA operator boundary.

The reference profile (csa_conform.oracle) is the CPU reference bit for bit
and stays the default everywhere. This package is a second, deterministic
NumPy model of what DeepSeek's inference code computes inside the same span,
with the same stage names and payload names, so both profiles can run on the
same inputs and be compared stage by stage (specs/official-profile.md).
"""

from csa_conform.profiles.official.pipeline import run_official_step

__all__ = ["run_official_step"]
