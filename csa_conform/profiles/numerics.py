"""Numerics profiles: which arithmetic computes a step's stage payloads.

`reference` is the CPU reference bit for bit (csa_conform.oracle), the
default everywhere. `official` is DeepSeek-V4's own inference numerics
(csa_conform.profiles.official, specs/official-profile.md) with glibc's expf;
`official-fast-exp` the same with the model of the GPU's fast exponential.
A golden file written under a profile other than the reference names it in
its root attribute ``profile``; a file without it (every file written before
profiles existed, and every reference file, whose bytes stay as they were) is
a reference file. ``verify`` re-runs the profile the file names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from csa_conform.errors import GoldenFormatError, UsageError

REFERENCE = "reference"
OFFICIAL = "official"
OFFICIAL_FAST_EXP = "official-fast-exp"
NUMERICS_PROFILES = (REFERENCE, OFFICIAL, OFFICIAL_FAST_EXP)
PROFILE_ATTR = "profile"


@dataclass(frozen=True)
class ProfileRunner:
    """A picklable ``run_step(attrs, inputs, output_names)`` of one profile (for --jobs workers).

    ``rejects_ties``: the reference refuses a step whose index scores tie; the
    official profile orders ties instead, so a recipe's tie rejection is not
    its expectation.
    """

    profile: str
    engine: str | None = None  # the oracle engine chosen on the command line (None: $CSA_CONFORM_ENGINE, else auto)

    @property
    def rejects_ties(self) -> bool:
        return self.profile == REFERENCE

    def __call__(self, attrs: Mapping, inputs, output_names, engine: str | None = None, upstream=None):
        """One step; ``upstream`` (reference payloads) isolates each launch of a non-reference profile."""
        if self.profile == REFERENCE:
            from csa_conform.oracle import run_step

            return run_step(attrs, inputs, output_names, engine or self.engine)
        from csa_conform.profiles.official import run_official_step

        exp = "fast" if self.profile == OFFICIAL_FAST_EXP else "exact"
        return run_official_step(attrs, inputs, output_names, engine or self.engine, exp, upstream)


def runner(profile: str, engine: str | None = None) -> Callable:
    if profile not in NUMERICS_PROFILES:
        raise UsageError(f"{profile!r} is not a numerics profile: expected one of {', '.join(NUMERICS_PROFILES)}")
    return ProfileRunner(profile, engine)


def file_profile(provenance: Mapping, path: str = "golden file") -> str:
    """The profile a golden file's root names; reference when it names none."""
    value = provenance.get(PROFILE_ATTR, REFERENCE)
    if value not in NUMERICS_PROFILES:
        raise GoldenFormatError(
            f"{path}: root attribute {PROFILE_ATTR}={value!r} is not a numerics profile "
            f"({', '.join(NUMERICS_PROFILES)})"
        )
    return value


def provenance_entry(profile: str) -> dict:
    """The root attribute a generated file carries: none for the reference (its bytes stay unchanged)."""
    return {} if profile == REFERENCE else {PROFILE_ATTR: profile}
