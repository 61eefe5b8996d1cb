"""One run split over CI machines (``--shard K/N``) and the shards' results documents merged back.

Case i of the selected cases, in case-id order, belongs to shard ``i mod N + 1``:
round robin, so every shard gets its share of each case family (ids sort by
family) and of the large cases, and the split depends on nothing but the
case list. Merging therefore needs no golden file: the j-th case of shard K
was case ``j*N + K-1``, so the merged document lists the cases exactly as the
unsharded run does, and its summary, exit code and launch counts are the
unsharded run's.

CI systems announce parallel jobs in the environment. GitHub Actions has no
standard variable (a matrix names its own), so a workflow sets
``CSA_CONFORM_SHARD=K/N``; GitLab's ``parallel: N`` sets ``CI_NODE_INDEX``
(1-based) and ``CI_NODE_TOTAL``, which are read when ``CSA_CONFORM_SHARD`` is
not set. ``--shard`` overrides both; ``--shard 1/1`` runs everything.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence, TypeVar

from csa_conform.errors import UsageError

Item = TypeVar("Item")

SHARD_ENV = "CSA_CONFORM_SHARD"
NODE_INDEX_ENV = "CI_NODE_INDEX"
NODE_TOTAL_ENV = "CI_NODE_TOTAL"
SHARD_OPTION = "shard"
# More shards than this is no CI matrix; the bound keeps merging (which lists every index) small.
MAX_SHARDS = 4096
_SHARD = re.compile(r"([0-9]{1,5})/([0-9]{1,5})")


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based, as CI systems count
    total: int
    origin: str = field(default="--shard", compare=False)  # the option or the variables it came from

    def __str__(self) -> str:
        return f"{self.index}/{self.total}"

    def select(self, items: Sequence[Item]) -> list[Item]:
        return list(items[self.index - 1 :: self.total])


def parse_shard(text: str, origin: str = "--shard") -> Shard:
    """'K/N' with 1 <= K <= N <= MAX_SHARDS, in ASCII digits (int() would also take '²' or '١')."""
    found = _SHARD.fullmatch(str(text).strip())
    if found is None or not 1 <= int(found[1]) <= int(found[2]) <= MAX_SHARDS:
        raise UsageError(f"{origin}: {str(text)[:40]!r} is not a shard K/N with 1 <= K <= N <= {MAX_SHARDS}")
    return Shard(int(found[1]), int(found[2]), origin)


def shard_from_environment(environ: Mapping[str, str] | None = None) -> Shard | None:
    """CSA_CONFORM_SHARD=K/N, else GitLab's CI_NODE_INDEX/CI_NODE_TOTAL, else none."""
    environ = os.environ if environ is None else environ
    if environ.get(SHARD_ENV):
        return parse_shard(environ[SHARD_ENV], SHARD_ENV)
    if environ.get(NODE_INDEX_ENV) and environ.get(NODE_TOTAL_ENV):
        origin = f"{NODE_INDEX_ENV}/{NODE_TOTAL_ENV}"
        return parse_shard(f"{environ[NODE_INDEX_ENV]}/{environ[NODE_TOTAL_ENV]}", origin)
    return None


def interleave(parts: Sequence[Sequence[Item]]) -> list[Item]:
    """The inverse of ``Shard.select``: ``parts[k]`` is shard k+1's items, in order."""
    total = len(parts)
    merged: list[Item] = []
    for position in range(max((len(part) for part in parts), default=0)):
        merged.extend(parts[k][position] for k in range(total) if position < len(parts[k]))
    return merged


def without_shard(argv: Sequence[str]) -> list[str]:
    """A command line with its --shard option removed: the unsharded run's."""
    words, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == "--shard":
            skip = True
        elif not word.startswith("--shard="):
            words.append(word)
    return words
