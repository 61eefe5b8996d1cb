"""Fixture recipes: named, seeded, documented families of whole streams, grouped in suites.

Families (one module each): ``seed-closed-form`` (the seed tests' formulas),
``random`` (default_rng draws at realistic scales), ``boundaries`` (block
edges and kv windows), ``quant-edge`` (FP8/FP4 scale and code edges) and
``errors`` (one rejected step per validation rule) and ``long`` (tie-free streams
resumed at 2^16 .. 2^20 + 3 tokens).

Suites: ``ci`` — every family at small shapes, committed as goldens/ci.h5;
``full`` — larger shapes and more seeds; ``prod`` — production geometry
(N=64, I=64, index_topk=512, S up to 1024), generated on demand; ``long`` — production
geometry resumed at up to 2^20 + 3 tokens, generated on demand; ``bench`` — the production
shapes ``csa-conform bench`` times (decodes at T = 4K, 64K, 1M, prefills of 1K and 8K, both
ratios), generated on demand.
"""

from csa_conform.errors import FixtureError
from csa_conform.golden.recipes.stream import Recipe, StepPlan, StreamPlan, play
from csa_conform.golden.recipes.suites import FAMILIES, SUITES, suite_recipes

__all__ = [
    "FAMILIES",
    "SUITES",
    "FixtureError",
    "Recipe",
    "StepPlan",
    "StreamPlan",
    "play",
    "suite_recipes",
]
