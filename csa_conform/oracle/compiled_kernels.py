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
    """scores[b, s, h, c] for s in [begin, end): dot(q, row) * scale (+ bias); -inf for empty slots."""
    batch, _, heads, dim = query.shape
    count = rows.shape[-1]
    transposed = np.empty((dim, heads), dtype=np.float32)
    dots = np.empty(heads, dtype=np.float32)
    for b in range(batch):
        for s in range(begin, end):
            for h in range(heads):
                for d in range(dim):
                    transposed[d, h] = query[b, s, h, d]
            for c in range(count):
                row = rows[b, s, c]
                if row == empty_row:
                    for h in range(heads):
                        scores[b, s, h, c] = _MINUS_INFINITY
                    continue
                dots[:] = _ZERO
                for d in range(dim):
                    key = source[b, row, d]
                    for h in range(heads):
                        dots[h] += transposed[d, h] * key
                for h in range(heads):
                    score = dots[h] * scale
                    if has_bias:
                        score += bias[b, h, s, c]
                    scores[b, s, h, c] = score


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
    (fmax: a NaN dot counts as 0). Entries past causal[s] are left as they are.
    """
    batch, _, heads, width = queries.shape
    transposed = np.empty((width, heads), dtype=np.float32)
    dots = np.empty(heads, dtype=np.float32)
    for b in range(batch):
        for s in range(begin, end):
            for h in range(heads):
                for d in range(width):
                    transposed[d, h] = queries[b, s, h, d]
            for c in range(causal[s]):
                dots[:] = _ZERO
                for d in range(width):
                    key = keys[b, c, d]
                    for h in range(heads):
                        dots[h] += transposed[d, h] * key
                total = _ZERO
                for h in range(heads):
                    dot = dots[h]
                    relu = dot if dot > _ZERO else _ZERO
                    total += relu * weights[b, s, h] * weight_scale
                scores[b, s, c] = total


KERNELS = (attention_scores, attention_values, index_scores)
