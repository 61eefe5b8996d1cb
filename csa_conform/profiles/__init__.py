"""Numerics profiles: which arithmetic computes a step's stage payloads (the reference, or DeepSeek's
official numerics), chosen by name and recorded in a golden file."""

from csa_conform.profiles.numerics import NUMERICS_PROFILES, OFFICIAL, OFFICIAL_FAST_EXP, REFERENCE

__all__ = ["NUMERICS_PROFILES", "OFFICIAL", "OFFICIAL_FAST_EXP", "REFERENCE"]
