"""Numba kernels for the oracle's hot loops, in the reference's arithmetic.

Every product and sum is one binary32 operation in the NumPy engine's
order: dots ascend in d, head sums ascend in head, value sums ascend in
candidate. Vectorisation runs across independent lanes only (heads for the
dots, d for the value sums), so no reduction is reassociated. fastmath is
off: LLVM then neither reassociates nor contracts a*b+c into a fused
multiply-add (tests/oracle/test_compiled_kernels.py reads the assembly).
No kernel calls a math function: expf and friends stay glibc's NumPy ports.
Kernels release the GIL; the oracle's own thread pool runs query chunks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

KERNEL_OPTIONS = {"cache": True, "nogil": True, "fastmath": False, "error_model": "numpy"}

_ZERO = np.float32(0)
_MINUS_INFINITY = np.float32(-np.inf)


@njit(**KERNEL_OPTIONS)
def attention_scores(query, source, rows, empty_row, scale, bias, has_bias, begin, end, scores):
    """scores[b, s, h, c] for s in [begin, end): dot(q, row) * scale (+ bias); -inf for empty slots.

    Each query's candidate rows are gathered transposed, [d, c], so the
    innermost loop runs over candidates: independent lanes, d stays sequential.
    """
    batch, _, heads, dim = query.shape
    count = rows.shape[-1]
    gathered = np.empty((dim, count), dtype=np.float32)
    dots = np.empty(count, dtype=np.float32)
    for b in range(batch):
        for s in range(begin, end):
            for c in range(count):
                row = rows[b, s, c]
                for d in range(dim):
                    gathered[d, c] = source[b, row, d]
            for h in range(heads):
                dots[:] = _ZERO
                for d in range(dim):
                    weight = query[b, s, h, d]
                    for c in range(count):
                        dots[c] += weight * gathered[d, c]
                for c in range(count):
                    if rows[b, s, c] == empty_row:
                        scores[b, s, h, c] = _MINUS_INFINITY
                    elif has_bias:
                        scores[b, s, h, c] = dots[c] * scale + bias[b, h, s, c]
                    else:
                        scores[b, s, h, c] = dots[c] * scale


@njit(**KERNEL_OPTIONS)
def attention_values(probabilities, source, rows, empty_row, begin, end, output):
    """output[b, s, h] = ascending sum over candidates of p * row, for s in [begin, end).

    probabilities are [C, B, end - begin, N]. An empty slot's row is zeros
    and its probability 0, so its term is +0 and is skipped.
    """
    batch, _, heads, dim = output.shape
    count = rows.shape[-1]
    for b in range(batch):
        for s in range(begin, end):
            for h in range(heads):
                total = output[b, s, h]
                total[:] = _ZERO
                for c in range(count):
                    row = rows[b, s, c]
                    if row == empty_row:
                        continue
                    probability = probabilities[c, b, s - begin, h]
                    for d in range(dim):
                        total[d] += probability * source[b, row, d]


@njit(**KERNEL_OPTIONS)
def index_scores(queries, keys, weights, weight_scale, causal, begin, end, scores):
    """scores[b, s, c] for causal records c < causal[s], s in [begin, end).

    Sum over heads, ascending, of fmax(dot, 0) * weight * weight_scale
    (fmax: a NaN dot counts as 0). Keys are [B, d, records] so the innermost
    loops run over records. Entries past causal[s] are left as they are.
    """
    batch, _, heads, width = queries.shape
    records = keys.shape[-1]
    dots = np.empty(records, dtype=np.float32)
    total = np.empty(records, dtype=np.float32)
    for b in range(batch):
        for s in range(begin, end):
            live = causal[s]
            total[:live] = _ZERO
            for h in range(heads):
                dots[:live] = _ZERO
                for d in range(width):
                    weight = queries[b, s, h, d]
                    for c in range(live):
                        dots[c] += weight * keys[b, d, c]
                head_weight = weights[b, s, h]
                for c in range(live):
                    dot = dots[c]
                    relu = dot if dot > _ZERO else _ZERO
                    total[c] += relu * head_weight * weight_scale
            for c in range(live):
                scores[b, s, c] = total[c]


KERNELS = (attention_scores, attention_values, index_scores)
