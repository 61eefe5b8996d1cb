"""Which rounding class of which record kind a golden step reaches, from the oracle's own block and
bf16 inputs (a traced re-run of the record and query stages on the stored inputs and payloads).

Kinds: the attention records of ratio 128 (FP8 or f32 cache) and ratio 4, the ratio-4 index keys,
the index queries, and the RoPE tails every record's last 64 dims go through. Classes: bf16 ties
to even in both directions and -0; for the block formats E4M3 / E2M1 ties, the top code (448 / 6,
where the clamp sits), subnormal codes (E4M3 exponent 0, E2M1's 0.5), the -0 code, and of the
E8M0 scale an amax exactly at a power-of-two multiple of the top code, an all-zero block and an
amax under the quantizer's floor.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from csa_conform.contract import validate_step
from csa_conform.errors import ContractError
from csa_conform.explain.stages import run_stage
from csa_conform.golden import GoldenFile
from csa_conform.numerics.blockscale import block_power
from csa_conform.numerics.e8m0 import power_of_two
from csa_conform.numerics.fp4 import AMAX_FLOOR as FP4_FLOOR, E2M1_MAX, e2m1_decode, e2m1_encode
from csa_conform.numerics.fp8 import AMAX_FLOOR as FP8_FLOOR, E4M3_MAX, e4m3_decode, e4m3_encode
from csa_conform.numerics.variant import Numerics

TRACED = ("compression_update", "index_key_update", "index_query_finalize")
FP8_BLOCKS, FP4_BLOCKS, BF16, ROPE = "FP8 E4M3 block input", "FP4 E2M1 block input", "bf16 input", "rope output"
F32_RECORD = "ratio-128 f32 record"
BF16_CLASSES = ("bf16 tie, to even down", "bf16 tie, to even up", "bf16 -0")


def _midpoints(decode, codes) -> np.ndarray:
    grid = np.unique(np.abs(decode(np.asarray(codes, np.uint8))))
    grid = grid[np.isfinite(grid)]
    return ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(np.float32)


FORMATS = {
    FP8_BLOCKS: ("E4M3", E4M3_MAX, FP8_FLOOR, e4m3_encode, e4m3_decode, _midpoints(e4m3_decode, range(0x7F)),
                 lambda c: ((c & 0x78) == 0) & ((c & 0x07) != 0), 0x80, 0x7F),
    FP4_BLOCKS: ("E2M1", E2M1_MAX, FP4_FLOOR, e2m1_encode, e2m1_decode, _midpoints(e2m1_decode, range(8)),
                 lambda c: (c & 0x7) == 1, 0x8, 0x7),
}


def bf16_classes(values) -> set[str]:
    bits = np.asarray(values, np.float32).reshape(-1).view(np.uint32)
    tie = (bits & np.uint32(0xFFFF)) == np.uint32(0x8000)
    odd = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + odd) >> np.uint32(16)
    hits = set()
    if (tie & (odd == 0)).any():
        hits.add(BF16_CLASSES[0])
    if (tie & (odd == 1)).any():
        hits.add(BF16_CLASSES[1])
    if (rounded == np.uint32(0x8000)).any():
        hits.add(BF16_CLASSES[2])
    return hits


def block_classes(kind: str, blocks) -> set[str]:
    name, top, floor, encode, decode, midpoints, subnormal, negative_zero, magnitude = FORMATS[kind]
    x = np.asarray(blocks, np.float32)
    x = x.reshape(-1, x.shape[-1])
    x = x[np.isfinite(x).all(axis=-1)]
    amax = np.abs(x).max(axis=-1, initial=floor)
    true_amax = np.abs(x).max(axis=-1, initial=0)
    scale = power_of_two(block_power(amax, top))
    normalized = np.clip(x / scale[:, None], -top, top)
    codes = np.asarray(encode(normalized)).astype(np.uint8)
    quotient = true_amax / np.float32(top)
    mantissa, _ = np.frexp(quotient)
    checks = {
        f"{name} tie": np.isin(np.abs(normalized), midpoints).any(),
        f"{name} top code ({top:g}, the clamp)": ((codes & magnitude) == magnitude - 1 if name == "E4M3"
                                                   else (codes & magnitude) == magnitude).any(),
        f"{name} subnormal code": subnormal(codes).any(),
        f"{name} -0 code": (codes == negative_zero).any(),
        "E8M0 at a power-of-two amax": ((true_amax >= floor) & (mantissa == 0.5)
                                        & (quotient * np.float32(top) == true_amax)).any(),
        "E8M0 all-zero block": (true_amax == 0).any(),
        "E8M0 amax under the floor": ((true_amax > 0) & (true_amax < floor)).any(),
    }
    return {label for label, hit in checks.items() if hit}


def record_kind(attrs: dict, stage: str) -> str:
    if stage == "index_key_update":
        return "ratio-4 FP4 index key"
    if stage == "index_query_finalize":
        return "ratio-4 index query (bf16, FP4)"
    if int(attrs["compression_ratio"]) == 4:
        return "ratio-4 FP8 main record"
    return F32_RECORD if attrs.get("cache_format", "f32") == "f32" else "ratio-128 FP8 record"


def step_classes(attrs: dict, stage: str, trace: dict) -> dict[str, set[str]]:
    kind = record_kind(attrs, stage)
    hits: dict[str, set[str]] = defaultdict(set)
    for values in trace.get(BF16, []):
        hits[kind] |= bf16_classes(values)
    for fmt in (FP4_BLOCKS,) if kind == F32_RECORD else (FP8_BLOCKS, FP4_BLOCKS):
        for blocks in trace.get(fmt, []):
            hits[kind] |= block_classes(fmt, blocks)
    for values in trace.get(ROPE, []) if stage != "index_query_finalize" else []:
        hits["bf16 RoPE tail of a record"] |= bf16_classes(values)
    return hits


def cases_per_class(path) -> dict[tuple[str, str], set[str]]:
    """(kind, class) -> the cases of the golden file with a step that reaches it."""
    reached: dict[tuple[str, str], set[str]] = defaultdict(set)
    with GoldenFile(path) as golden:
        for case in golden.case_ids():
            info = golden.case_info(case)
            for index in range(info.step_count):
                step = golden.read_step(case, index)
                if not step.stages:
                    continue
                try:
                    geometry = validate_step(info.attrs, step.inputs, list(info.output_names))
                except ContractError:
                    continue
                for stage in TRACED:
                    if stage not in step.stages:
                        continue
                    trace: dict = {}
                    try:
                        run_stage(stage, geometry, step.inputs, step.stages, Numerics(trace=trace))
                    except ContractError:
                        continue
                    for kind, classes in step_classes(dict(info.attrs), stage, trace).items():
                        for label in classes:
                            reached[(kind, label)].add(case)
    return reached


BLOCK_CLASSES = {
    name: (f"{name} tie", f"{name} top code ({top:g}, the clamp)", f"{name} subnormal code", f"{name} -0 code",
           "E8M0 at a power-of-two amax", "E8M0 all-zero block", "E8M0 amax under the floor")
    for name, top in (("E4M3", 448), ("E2M1", 6))
}
# Every record kind and the rounding classes it can meet.
KINDS = {
    "ratio-128 FP8 record": BF16_CLASSES + BLOCK_CLASSES["E4M3"],
    F32_RECORD: BF16_CLASSES,
    "ratio-4 FP8 main record": BF16_CLASSES + BLOCK_CLASSES["E4M3"],
    "ratio-4 FP4 index key": BF16_CLASSES + BLOCK_CLASSES["E2M1"],
    "ratio-4 index query (bf16, FP4)": BF16_CLASSES + BLOCK_CLASSES["E2M1"],
    "bf16 RoPE tail of a record": BF16_CLASSES,
}
