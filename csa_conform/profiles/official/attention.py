"""Stage 7 under the official numerics: block-64 online softmax with the sink after the loop.

Per (b, s, h), candidates in their assembled order (dense window, then
compressed), in blocks of BLOCK:

    l_j  = dot(bf16 q, bf16 kv_j) * scale (+ bias)    binary32 sum ascending in d; -inf when invalid
    m'   = max(m, max_j l_j);  r = exp(m - m')         r = 0 while both are -inf
    p_j  = exp(l_j - m')                               binary32
    Z    = Z * r + (sum_j p_j)                         block sum ascending in j, from 0
    O    = O * r + (sum_j bf16(p_j) * kv_j)            block sum ascending in j, from 0
    after the last block:  Z = Z + exp(sink[h] - m);   Y = bf16(O / Z)

The sink adds denominator mass only and never enters the max. The order of
the sums inside a block is this profile's choice (the official kernel's MMA
order is not specified), which is why a GPU kernel that follows the official
code is close to this profile but not bit-identical to it. A row with no
valid candidate is zeros; an invalid denominator of an active row is the
reference's own error.
"""

from __future__ import annotations

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.numerics.bf16 import bf16_round
from csa_conform.oracle.compiled.parallel import map_chunks, query_chunks
from csa_conform.oracle.sparse_sink_softmax_attention import candidate_rows, raise_first_invalid
from csa_conform.profiles.official.exp import official_exp

BLOCK = 64


def official_attention(
    geometry: StepGeometry,
    query: np.ndarray,
    current_kv: np.ndarray,
    present_compressed_kv: np.ndarray,
    candidates: np.ndarray,
    head_sink: np.ndarray,
    bias: np.ndarray | None,
    exp: str = "exact",
) -> dict[str, np.ndarray]:
    batch, sequence, heads, dim = query.shape
    source, rows = candidate_rows(geometry, current_kv, present_compressed_kv, candidates)
    source = bf16_round(source)
    empty_row = source.shape[1] - 1
    count = candidates.shape[-1]
    scores = np.empty((batch, sequence, heads, count), dtype=np.float32)
    output = np.empty(query.shape, dtype=np.float32)
    batch_index = np.arange(batch)[:, None, None]
    exponential = official_exp(exp)

    def attend(chunk: slice):
        row_ids = rows[:, chunk]
        values = source[batch_index, row_ids]  # [B, s, C, D]
        queries = bf16_round(query[:, chunk])
        logits = block_logits(queries, values, geometry.scale)
        if bias is not None:
            logits += bias[:, :, chunk].transpose(0, 2, 1, 3)
        logits[np.broadcast_to((row_ids == empty_row)[:, :, None, :], logits.shape)] = -np.inf
        scores[:, chunk] = logits
        y, failure = online_softmax(logits, values, head_sink, exponential, chunk.start)
        output[:, chunk] = y
        return failure

    per_query = max(count * batch * heads, count * batch * dim // 16)
    raise_first_invalid(geometry, map_chunks(attend, query_chunks(sequence, per_query)))
    return {"scores": scores, "Y": output}


def block_logits(queries: np.ndarray, values: np.ndarray, scale: np.float32) -> np.ndarray:
    """[B,s,N,C] = (sum over d ascending of q_d * kv_d) * scale; bf16 products are exact in binary32."""
    keys = np.moveaxis(values, -1, 0)  # [D, B, s, C]
    q = np.moveaxis(queries, -1, 0)  # [D, B, s, N]
    dots = np.zeros(q.shape[1:] + keys.shape[-1:], dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for d in range(q.shape[0]):
            dots += q[d][..., None] * keys[d][:, :, None, :]
        dots *= scale
    return dots


def online_softmax(logits, values, head_sink, exponential, first_query: int):
    """Y [B,s,N,D] of logits [B,s,N,C] over values [B,s,C,D], and the first invalid (b, s, h)."""
    shape = logits.shape[:3]
    maximum = np.full(shape, -np.inf, dtype=np.float32)
    denominator = np.zeros(shape, dtype=np.float32)
    numerator = np.zeros(shape + values.shape[-1:], dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for begin in range(0, logits.shape[-1], BLOCK):
            block = logits[..., begin : begin + BLOCK]
            block_max = np.fmax(maximum, np.fmax.reduce(block, axis=-1, initial=-np.inf))
            live = block_max != -np.inf
            rescale = np.where(live, exponential(maximum - block_max), np.float32(0))
            p = np.where(block != -np.inf, exponential(block - block_max[..., None]), np.float32(0))
            p_sum = np.zeros(shape, dtype=np.float32)
            v_sum = np.zeros_like(numerator)
            p_bf16 = bf16_round(p)
            for j in range(block.shape[-1]):
                p_sum += p[..., j]
                v_sum += p_bf16[..., j, None] * values[:, :, None, begin + j, :]
            denominator = denominator * rescale + p_sum
            numerator = numerator * rescale[..., None] + v_sum
            maximum = block_max
        active = maximum != -np.inf
        denominator = denominator + np.where(active, exponential(head_sink - maximum), np.float32(0))
        invalid = active & ((denominator == 0) | ~np.isfinite(denominator))
        y = np.where(active[..., None], bf16_round(numerator / denominator[..., None]), np.float32(0))
    if invalid.any():
        b, s, h = np.argwhere(invalid)[0]
        return y, (int(b), first_query + int(s), int(h))
    return y, None
