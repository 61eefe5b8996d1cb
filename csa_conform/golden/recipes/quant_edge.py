"""Family ``quant-edge``: FP8/FP4 block scales and codes at their edges, through the pipeline.

The trick is to make the pooled record a value we choose. A stream that
begins at a block end (position R-1) with a crafted state — no records and
the reset carry, every score -inf — pools exactly one candidate, the new
row, with weight exp(0) = 1. If that row is 2^10 in every dim, RMSNorm's
inverse is exactly 2^-10, so the finalized record is bf16(norm weight): the
norm weights *are* the values the quantizer sees (block start 0 makes the
RoPE tail an identity). The decodes that follow attend and score the record.

* FP8 (attention records): seven 64-wide blocks with amax on a power-of-two
  boundary (448 * 2^k), just above one, below the 1e-4 amax floor, all
  zeros and -0, negative amax, and 2^20-scaled; inside them RNE ties,
  subnormal codes, and negatives that round to zero (code 0x80).
* FP4 (index keys and queries): the Hadamard transform is steered with
  Walsh components of 11.3125 = bf16 nearest sqrt(128), which makes
  bf16(H(y)/sqrt(128)) exactly the signed sum of the components; the four
  designs below then give amax exactly 6 * 2^k, every RNE tie (0.25 ... 5,
  both signs), -0.25 and -0.125 encoding as code 0 (never 8) and an all-zero
  block at the E8M0 floor (byte 1).

The last cases drive the same path over the edge: quantizer inputs that
overflow or are non-finite, which the reference rejects.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np

from csa_conform.golden.recipes.randomized import StreamSpec, case_seed, random_plan, spec_recipe
from csa_conform.golden.recipes.stream import HEAD_DIM, INDEX_DIM, Recipe, StreamPlan, empty_state

FAMILY = "quant-edge"
UNIT_ROW = np.float32(2.0**10)
WALSH_UNIT = np.float32(11.3125)

# One 64-wide FP8 block at scale 1: the amax (448), ties between E4M3 neighbours
# (1.0625, 1.1875, 3.125, 232, 432), subnormals and their ties (2^-9 .. 15*2^-10),
# the smallest normal, and negatives and zeros that must encode as 0x80 / 0x00.
_FP8_PATTERN = np.array(
    [448.0, -448.0, 1.0625, 1.1875, 3.125, 232.0, 432.0, 240.0, 224.0, 416.0]
    + [2.0**-9, 3 * 2.0**-10, 2.0**-10, 5 * 2.0**-10, 15 * 2.0**-10, 7 * 2.0**-9, 2.0**-6]
    + [-(2.0**-11), -0.0, -(2.0**-10), -3 * 2.0**-10, 2.0**-12, 0.0, -1.0625, -(2.0**-9)]
    + [float(k) / 8.0 for k in range(1, 40)],
    dtype=np.float32,
)
_FP8_SCALES = (
    ("amax 448: power 0", 1.0),
    ("amax 56: power -3", 2.0**-3),
    ("amax 450: just above 448, power 1", None),
    ("below the 1e-4 amax floor", 2.0**-23),
    ("zeros and -0", 0.0),
    ("negative amax -224: power -1", -0.5),
    ("amax 448 * 2^20: power 20", 2.0**20),
)
# The RoPE tail passes as bf16: -0, a bf16 subnormal, the smallest normal, plain values.
_TAIL = np.array([-0.0, 2.0**-133, -(2.0**-126), 1.5, -2.25, 0.0] * 10 + [0.5] * 4, dtype=np.float32)

# Walsh designs {index: coefficient}; index 32 flips sign between 32-blocks.
FP4_DESIGNS = (
    {0: 4.0, 32: -0.5, 1: 2.0, 2: 0.5},  # amax exactly 6 (byte 127), ties 5 -> 4 and 3.5 -> 4
    {0: 2.0, 32: 0.5, 1: 2.0, 2: 1.0, 4: 0.25},  # every tie 0.25..1.75 of both signs, -0.25 -> 0
    {0: 2.0, 32: 2.0},  # blocks of 4 and all-zero blocks (E8M0 floor, byte 1)
    {0: 2.0, 32: 0.5, 1: 2.0, 2: 0.5, 4: 0.125},  # -0.125 encodes as code 0, not 8
)


def fp8_norm_weights() -> np.ndarray:
    """compressor_norm = the record the FP8 quantizer will see (dims 0..447) + its bf16 tail."""
    blocks = []
    for _, factor in _FP8_SCALES:
        if factor is None:
            block = _FP8_PATTERN * np.float32(2.0)
            block[0] = np.float32(450.0)
        elif factor == 0.0:
            block = np.where(np.arange(64) % 2 == 0, np.float32(0.0), np.float32(-0.0))
        else:
            block = _FP8_PATTERN * np.float32(factor)
        blocks.append(block.astype(np.float32))
    return np.concatenate(blocks + [_TAIL])


def walsh_vector(design: dict[int, float]) -> np.ndarray:
    vector = np.zeros(INDEX_DIM, dtype=np.float32)
    for index, coefficient in design.items():
        vector[index] = np.float32(coefficient) * WALSH_UNIT
    return vector


def _crafted_fresh(fresh: dict, ratio: int) -> dict:
    """Rows of the crafted block end: 2^10 everywhere the new position is pooled from."""
    crafted = dict(fresh)
    crafted["compressor_kv"] = np.full_like(fresh["compressor_kv"], UNIT_ROW)
    if ratio == 4:
        crafted["index_compressor_kv"] = np.full_like(fresh["index_compressor_kv"], UNIT_ROW)
        heads = fresh["index_query"].shape[2]
        designs = np.stack([walsh_vector(FP4_DESIGNS[h % len(FP4_DESIGNS)]) for h in range(heads)])
        crafted["index_query"] = np.broadcast_to(designs, fresh["index_query"].shape).copy()
    return crafted


def crafted_plan(spec: StreamSpec, seed: int, weights_seed: int) -> StreamPlan:
    """A random stream from a block end whose first step pools the crafted row.

    The dense kv rows are zeros: every Y row is then the decoded record times
    its attention weight, so the crafted codes reach the output undiluted
    (and the 128 rows a ratio-128 block end needs cost the file nothing).
    """
    plan = random_plan(spec, seed, weights_seed)
    plan.kv_history = np.zeros_like(plan.kv_history)
    plan.initial_state = empty_state(plan.attrs, spec.batch)
    plan.constants["compressor_norm"] = fp8_norm_weights()
    if spec.ratio == 4:
        plan.constants["index_compressor_norm"] = walsh_vector(FP4_DESIGNS[1])
    plan.steps[0].fresh = _crafted_fresh(plan.steps[0].fresh, spec.ratio)
    return plan


def overflow_plan(target: str, spec: StreamSpec, seed: int, weights_seed: int) -> StreamPlan:
    """The crafted block end pushed past binary32: the reference refuses to quantize it.

    ``fp8-overflow``: a norm weight at bf16's largest value makes the FP8 block
    scale 2^120 and its top code 256 * 2^120 = inf. ``fp8-nonfinite``: one
    pooled dim 8x the others lifts x * inv_rms above 1, so that weight
    overflows to inf before quantization. ``fp4-nonfinite``: two index norm
    weights at 3e38 overflow the Hadamard butterfly.
    """
    plan = crafted_plan(spec, seed, weights_seed)
    step = plan.steps[0]
    largest = np.float32(3.3895314e38)
    norm = plan.constants["compressor_norm"]
    if target == "fp8-overflow":
        norm[64 * 6] = largest
    elif target == "fp8-nonfinite":
        norm[3] = largest
        kv = step.fresh["compressor_kv"]
        kv[..., kv.shape[-1] - HEAD_DIM + 3] *= np.float32(8.0)
    else:
        index_norm = np.zeros(INDEX_DIM, dtype=np.float32)
        index_norm[[0, 1]] = np.float32(3.0e38)
        plan.constants["index_compressor_norm"] = index_norm
    step.expect_error = True
    plan.steps = [step]
    return plan


R128_SPEC = StreamSpec(128, (1, 1), cache_format="fp8_e4m3_block64", start=127)
R4_SPEC = StreamSpec(4, (1, 1), heads=2, index_heads=4, index_topk=2, start=3)

CASES = {
    "r128-fp8-crafted-record": (
        R128_SPEC,
        crafted_plan,
        "ratio 128 fp8 from position 127 with a crafted state: the block end pools one 2^10 row, "
        "so record 0 is the FP8 edge pattern of compressor_norm; decode 128 attends it",
    ),
    "r4-crafted-records": (
        R4_SPEC,
        crafted_plan,
        "ratio 4, I=4, from position 3 with crafted states: record 0 is the FP8 edge pattern, "
        "index key 0 and the four index queries are the FP4 Walsh designs; decode 4 scores "
        "against it",
    ),
    "r128-fp8-overflow": (
        R128_SPEC,
        partial(overflow_plan, "fp8-overflow"),
        "ratio 128 fp8: crafted record with a bf16-max value: FP8 code 256 at scale 2^120 overflows",
    ),
    "r4-fp8-nonfinite": (
        R4_SPEC,
        partial(overflow_plan, "fp8-nonfinite"),
        "ratio 4: crafted record whose normalized value times a bf16-max weight is inf",
    ),
    "r4-fp4-nonfinite": (
        R4_SPEC,
        partial(overflow_plan, "fp4-nonfinite"),
        "ratio 4: index norm weights of 3e38 overflow the Hadamard butterfly before FP4",
    ),
}


def recipes(suite: str, seed: int) -> list[Recipe]:
    """Cases of one ratio share their seed: the overflow steps store only the weights they change."""
    cases = []
    for name, (spec, plan, description) in CASES.items():
        recipe = spec_recipe(FAMILY, name, spec, seed, description, plan=plan)
        cases.append(replace(recipe, seed=case_seed(seed, f"{FAMILY}.r{spec.ratio}")))
    return cases
