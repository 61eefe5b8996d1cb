"""Provenance of one divergent element: the upstream values the reference computed it from.

For Y[b,s,h,d] (and the attention scores): the query position, the valid
candidates (dense position or record id), their scores and softmax weights.
For a compressed record or index key: the positions pooled into it, whether
the dimension is in the RoPE tail (then the block-start position and the
angle), and for a quantized dimension or byte its FP8/FP4 block: amax, scale
exponent, the value before rounding and whether it was a round-half-to-even
tie. The values come from a reference re-run with tracing on.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.numerics import libm
from csa_conform.numerics.fp4 import E2M1_TABLE, FP4_BLOCK
from csa_conform.numerics.fp8 import E4M3_TABLE, FP8_BLOCK
from csa_conform.numerics.records import FP4_BLOCK_BYTES, FP8_BLOCK_BYTES, FP8_SCALED_BYTES
from csa_conform.numerics.rope import rope_frequencies

LISTED_CANDIDATES = 6


def _float(value) -> float:
    return float(np.float32(value))


def _attention(g: StepGeometry, coords: tuple, inputs, expected) -> dict:
    b, s, h = coords[:3]
    candidates = expected["candidate_assembly"]["candidates"][b, s]
    scores = expected["sparse_sink_softmax_attention"]["scores"][b, s, h]
    valid = (candidates >= 0) & (scores != -np.inf)
    found = {"position": g.start + s, "valid_candidates": int(valid.sum())}
    if not valid.any():
        return found
    maximum = np.float32(scores[valid].max())
    weights = np.zeros(scores.shape, dtype=np.float32)
    weights[valid] = libm.expf(scores[valid] - maximum)
    denominator = np.float32(0)
    for weight in weights[valid]:
        denominator = np.float32(denominator + weight)
    sink = np.float32(inputs["head_sink"][h])
    denominator = np.float32(denominator + libm.expf(np.float32(sink - maximum)))
    probabilities = weights / denominator
    order = [int(c) for c in np.argsort(-probabilities, kind="stable") if valid[c]][:LISTED_CANDIDATES]
    found.update(maximum=_float(maximum), sink=_float(sink), denominator=_float(denominator), candidates=[
        {"slot": c, "kind": "dense position" if c < g.dense_candidates else "record", "id": int(candidates[c]),
         "score": _float(scores[c]), "weight": _float(probabilities[c])} for c in order])
    return found


def _tie(value: float, table: np.ndarray) -> dict:
    magnitudes = np.unique(np.abs(table[np.isfinite(table)]).astype(np.float64))
    v = abs(value)
    lower = magnitudes[magnitudes <= v].max()
    upper = magnitudes[magnitudes >= v].min() if v <= magnitudes.max() else lower
    return {"between": [float(lower), float(upper)], "rne_tie": bool(lower != upper and v - lower == upper - v)}


def _block(trace: Mapping, key: str, where: tuple, index: int, table: np.ndarray, target: float) -> dict | None:
    blocks = trace.get(key)
    if not blocks:
        return None
    x = blocks[0][where]
    amax = np.float32(np.abs(x[np.isfinite(x)]).max(initial=0))
    floor = np.float32(1.0e-4) if table is E4M3_TABLE else np.float32(6.0 * 2.0**-126)
    quotient = np.float32(max(amax, floor) / np.float32(target))
    exponent = int(np.ceil(libm.log2f(np.array([quotient], dtype=np.float32))[0]))
    scale = np.float32(2.0**exponent)
    value = float(np.float32(x[index] / scale))
    return {"block_amax": _float(amax), "log2f_argument": _float(quotient),
            "log2f": _float(libm.log2f(np.array([quotient], dtype=np.float32))[0]), "scale_exponent": exponent,
            "input": _float(x[index]), "pre_rounding": value, **_tie(value, table)}


def _record(g: StepGeometry, stage: str, tensor: str, coords: tuple, inputs, trace) -> dict:
    index_stream = stage == "index_key_update"
    b, r = coords[:2]
    width = g.index_dim if index_stream else g.dim
    past = int(inputs["past_index_key" if index_stream else "past_compressed_kv"].shape[1])
    start = r * g.ratio
    pooled = [start, start + g.ratio - 1] if g.ratio == 128 else [max(start - 4, 0), start + 3]
    found = {"record": r, "block_start": start, "pooled_positions": pooled}
    if r < past:
        found["note"] = "a past record, copied from past_* (not computed in this step)"
        return found
    if tensor.startswith("present_") and tensor.endswith(("kv", "key")):
        byte = coords[2]
        if index_stream:
            block, offset = divmod(byte, FP4_BLOCK_BYTES)
            d = None if offset == 0 else block * FP4_BLOCK + 2 * (offset - 1)
            found.update(byte=byte, fp4_block=block, part="scale byte" if offset == 0 else f"codes of d={d},{d + 1}")
        elif byte < FP8_SCALED_BYTES:
            block, offset = divmod(byte, FP8_BLOCK_BYTES)
            d = None if offset == 0 else block * FP8_BLOCK + offset - 1
            found.update(byte=byte, fp8_block=block, part="scale byte" if offset == 0 else f"code of d={d}")
        else:
            d = width - g.rope_dim + (byte - FP8_SCALED_BYTES) // 2
            found.update(byte=byte, part=f"bf16 {'low' if (byte - FP8_SCALED_BYTES) % 2 == 0 else 'high'} byte of d={d}")
    else:
        d = coords[2]
    if d is None:
        d = (found.get("fp4_block", found.get("fp8_block", 0))) * (FP4_BLOCK if index_stream else FP8_BLOCK)
    tail = width - g.rope_dim
    found["d"] = d
    found["rope_tail"] = bool(d >= tail)
    if d >= tail:
        pair = (d - tail) // 2
        angle = np.float32(start) * rope_frequencies(g.rope_dim)[pair]
        found.update(position=start, rope_pair=pair, angle=_float(angle))
        if index_stream:
            found["note"] = "the Hadamard rotation after RoPE mixes every dimension into every FP4 code"
    new = r - past
    if index_stream:
        block = _block(trace, "FP4 E2M1 block input", (b, new, d // FP4_BLOCK), d % FP4_BLOCK, E2M1_TABLE, 6.0)
    elif d < tail:
        block = _block(trace, "FP8 E4M3 block input", (b, new, d // FP8_BLOCK), d % FP8_BLOCK, E4M3_TABLE, 448.0)
    else:
        block = None
    if block:
        found["block"] = block
    return found


def _index_query(g: StepGeometry, coords: tuple, trace) -> dict:
    b, s, i, d = coords
    found = {"position": g.start + s, "index_head": i, "d": d,
             "note": "RoPE of the last rope_dim dimensions, then a Hadamard rotation mixing every dimension"}
    block = _block(trace, "FP4 E2M1 block input", (b * g.sequence + s, i, d // FP4_BLOCK), d % FP4_BLOCK,
                   E2M1_TABLE, 6.0)
    if block:
        found["block"] = block
    return found


def element_provenance(stage: str, tensor: str, coords: tuple[int, ...], g: StepGeometry,
                       inputs: Mapping, expected: Mapping, trace: Mapping) -> dict:
    """What fed the element at `coords` of the stage's `tensor` (empty for stages without a story)."""
    if stage == "sparse_sink_softmax_attention":
        return _attention(g, coords, inputs, expected)
    if stage in ("compression_update", "index_key_update") and "carry" not in tensor:
        return _record(g, stage, tensor, coords, inputs, trace)
    if stage == "index_query_finalize":
        return _index_query(g, coords, trace)
    if stage == "index_scoring":
        b, s, c = coords
        return {"position": g.start + s, "record": c, "causal_records": (g.start + s + 1) // 4}
    return {}
