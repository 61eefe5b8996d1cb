"""``--case GLOB``: the one matcher every command selects cases with, and the glob of exactly one id.

A reproduce command names one case through the same option, so a case id
holding glob metacharacters (``*``, ``?``, ``[``) is written with each of
them in brackets (``[*]``), which matches that character alone: the glob
then selects exactly that case, whatever else the file holds.
"""

from __future__ import annotations

import fnmatch
from typing import Sequence

from csa_conform.errors import UsageError

__all__ = ["exact_glob", "matching_cases"]

_METACHARACTERS = "*?["


def exact_glob(case_id: str) -> str:
    """A glob that matches ``case_id`` and nothing else."""
    return "".join(f"[{character}]" if character in _METACHARACTERS else character for character in case_id)


def matching_cases(case_ids: Sequence[str], glob: str | None, where: str) -> list[str]:
    """The ids ``glob`` matches (all without one), in the order given; none is a usage error."""
    chosen = list(case_ids) if glob is None else [case for case in case_ids if fnmatch.fnmatchcase(case, glob)]
    if not chosen:
        raise UsageError(f"no case of {where} matches {glob!r}")
    return chosen
