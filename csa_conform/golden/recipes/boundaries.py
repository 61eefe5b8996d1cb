"""Family ``boundaries``: streams that cross every block edge, from 0 or resumed mid-stream.

Off-by-one errors live where a block completes ((pos+1) mod R == 0), where a
chunk straddles an edge, where the carry rotates (ratio 4) or resets
(ratio 128), and where the dense window stops being "all of current_kv" and
becomes the last 128 positions. These recipes put a step on each of those
edges, with current_kv windows shorter than 128, exactly minimal, and longer
than needed. Values are random (as in ``random``) so only the geometry is
special; two index heads keep top-k scores from tying. The small suite
reaches edges past the first block by resuming from a synthesized state;
the larger suites also get there by prefilling from 0.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from csa_conform.golden.recipes.randomized import (
    StreamSpec,
    bias_seed,
    bias_spec,
    describe,
    reset_carry_plan,
    spec_recipe,
)
from csa_conform.golden.recipes.stream import Recipe, StreamPlan

FAMILY = "boundaries"
FULL = (True, True, True, True)


def _r4(chunks, **geometry) -> StreamSpec:
    return StreamSpec(4, tuple(chunks), index_heads=2, index_topk=2, **geometry)


def _r128(chunks, cache_format="fp8_e4m3_block64", **geometry) -> StreamSpec:
    return StreamSpec(128, tuple(chunks), cache_format=cache_format, **geometry)


def masked_plan(spec: StreamSpec, seed: int, weights_seed: int) -> StreamPlan:
    """The full-shape bias case with -inf on every candidate of query 0 (all heads) and of
    head 0 at query 1: those rows have no valid candidate and must come out as zeros.
    Played with the bias cases' seed, it stores only its bias, scores and Y."""
    plan = reset_carry_plan(spec, seed, weights_seed)
    bias = plan.steps[0].fresh["attention_bias"].copy()
    bias[:, :, 0, :] = -np.inf
    bias[:, 0, 1, :] = -np.inf
    plan.steps[0].fresh["attention_bias"] = bias
    return plan


# Prefill lengths just before, on and just after the first two block ends, and a single token.
CI_PREFILLS = (1, 3, 4, 5, 7, 8, 9)
# Streams from 0 sent stale carries (stream.stale_carries), which the contract clears.
CI_STALE = ("r4-prefill-5", "r4-chunks-3-3-6-2")


def _ci_specs() -> dict[str, StreamSpec]:
    """Prefills around the first two ratio-4 block ends, a decode stream across the first
    (the seed's stream decodes through the next three), chunks that end before, start on,
    span two, and stay inside a block, and windows around 128 on both ratios.

    The two ratio-128 streams resume at the same offset (119) of blocks 0 and
    1, so they share the synthesized carry (119 filled slots): one crosses its
    block end inside a chunk, the other ends a chunk on it and decodes on into
    the next block. Two streams from 0 (``CI_STALE``) start from stale carries.
    """
    specs = {f"r4-prefill-{length}": _r4((length,)) for length in CI_PREFILLS}
    specs.update(
        {
            "r4-decode-1-to-5": _r4((1,) * 5),
            "r4-chunks-3-3-6-2": _r4((3, 3, 6, 2)),
            "r4-resumed-126-windows": _r4((2, 1), start=126, windows=("min", "full")),
            "r128-resumed-119-chunks": _r128((10, 1, 2), start=119, windows=("min", "full", 1)),
            "r128-resumed-247-to-257": _r128((9, 1, 1), start=247, cache_format="f32", windows=("min",)),
        }
    )
    specs.update({name: replace(specs[name], stale_carry=1.0) for name in CI_STALE})
    return specs


def _full_specs() -> dict[str, StreamSpec]:
    return {
        "r128-prefill-129-decode-130": _r128((129, 1), cache_format="f32"),
        "r128-prefill-128": _r128((128,)),
        "r128-decode-126-to-131": _r128((126,) + (1,) * 5),
        "r128-decode-254-to-258": _r128((254,) + (1,) * 4, cache_format="f32", windows=("min",)),
        "r128-chunks-across-128-256": _r128((100, 40, 120, 3), windows=("min",)),
        "r4-prefill-window-200": _r4((200,)),
        "r4-decode-to-130": _r4((120,) + (1,) * 10, windows=("min",), batch=2, heads=2),
        "r128-decode-382-to-386": _r128((382,) + (1,) * 4, windows=("min",), heads=2),
        "r4-chunks-127-2": _r4((127, 2, 127, 2), windows=("min",)),
        **{f"r4-prefill-{n}": _r4((n,)) for n in range(1, 10) if n not in CI_PREFILLS},
        "r4-decode-1-to-10": _r4((1,) * 10),
        "r4-chunks-3-to-12": _r4((3,) * 4),
        "r4-chunks-5-7-2-6": _r4((5, 7, 2, 6)),
        "r4-resumed-126-windows-long": _r4(
            (1, 1, 2, 1, 3), start=126, windows=("min", "full", 3, "min", "full")
        ),
        "r128-resumed-255-decodes": _r128((1,) * 3, start=255, cache_format="f32", windows=("min",)),
        # Long decodes on a full dense window: every step after the first has one launch shape, so
        # `diff --replay graph` serves them all from one graph.
        "r4-decode-200-to-216": _r4((200,) + (1,) * 16, windows=("min",)),
        "r128-decode-250-to-266": _r128((250,) + (1,) * 16, windows=("min",)),
    }


def recipes(suite: str, seed: int) -> list[Recipe]:
    specs = _ci_specs()
    if suite != "ci":
        specs.update(_full_specs())
    cases = [spec_recipe(FAMILY, name, spec, seed) for name, spec in specs.items()]
    masked = bias_spec(4, FULL)
    description = describe(masked) + "; -inf bias on every candidate of query 0 and of (query 1, head 0)"
    recipe = spec_recipe(FAMILY, "r4-bias-masks-whole-rows", masked, seed, description, plan=masked_plan)
    cases.append(replace(recipe, seed=bias_seed(seed, 4)))
    return cases
