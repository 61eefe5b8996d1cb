"""Numba kernels for the oracle's hot loops, in the reference's arithmetic.

Every product and sum is one binary32 operation in the NumPy engine's
order: dots ascend in d, head sums ascend in head, value sums ascend in
candidate. Vectorisation runs across independent lanes only (candidates or
records for the dots, d for the value sums), so no reduction is
reassociated; blocks of heads share loads, never sums. fastmath is
off: LLVM then neither reassociates nor contracts a*b+c into a fused
multiply-add (tests/oracle/test_compiled_kernels.py reads the assembly).
No kernel calls a math function: glibc's libm comes from compiled_libm.py.
Kernels release the GIL; the oracle's own thread pool runs query chunks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from csa_conform.oracle.compile_cache import kernel_cache

KERNEL_OPTIONS = {"cache": kernel_cache(), "nogil": True, "fastmath": False, "error_model": "numpy"}

_ZERO = np.float32(0)
_MINUS_INFINITY = np.float32(-np.inf)
HEAD_BLOCK = 4
# Index keys decoded per tile: [128, 64] f32 (32 KiB) and the dots of 64 heads (16 KiB) stay in L1/L2.
SCORE_TILE = 64
FP4_BLOCK = 32


@njit(**KERNEL_OPTIONS)
def attention_scores(query, source, rows, empty_row, scale, bias, has_bias, begin, end, scores):
    """scores[b, s, h, c] for s in [begin, end): dot(q, row) * scale (+ bias); -inf for empty slots.

    Each query's non-empty candidate rows are gathered transposed, [d, j],
    so the innermost loop runs over candidates: independent lanes, d stays
    sequential. Heads go HEAD_BLOCK at a time to reuse each gathered load.
    """
    batch, _, heads, dim = query.shape
    count = rows.shape[-1]
    buffer = np.empty(dim * count, dtype=np.float32)
    columns = np.empty(count, dtype=np.int64)
    dots = np.empty((HEAD_BLOCK, count), dtype=np.float32)
    for b in range(batch):
        for s in range(begin, end):
            live = 0
            for c in range(count):
                if rows[b, s, c] == empty_row:
                    for h in range(heads):
                        scores[b, s, h, c] = _MINUS_INFINITY
                else:
                    columns[live] = c
                    live += 1
            gathered = buffer[: dim * live].reshape((dim, live))
            for j in range(live):
                row = rows[b, s, columns[j]]
                for d in range(dim):
                    gathered[d, j] = source[b, row, d]
            h = 0
            while h < heads:
                if h + HEAD_BLOCK <= heads:
                    _four_head_dots(query[b, s], h, gathered, live, dots)
                    block = HEAD_BLOCK
                else:
                    _one_head_dots(query[b, s], h, gathered, live, dots)
                    block = 1
                for k in range(block):
                    for j in range(live):
                        c = columns[j]
                        if has_bias:
                            scores[b, s, h + k, c] = dots[k, j] * scale + bias[b, h + k, s, c]
                        else:
                            scores[b, s, h + k, c] = dots[k, j] * scale
                h += block


@njit(**KERNEL_OPTIONS)
def _four_head_dots(query, h, gathered, live, dots):
    """dots[k, j] = dot(query[h + k], gathered column j), ascending in d, for k < 4 and j < live."""
    first, second, third, fourth = dots[0], dots[1], dots[2], dots[3]
    first[:live] = _ZERO
    second[:live] = _ZERO
    third[:live] = _ZERO
    fourth[:live] = _ZERO
    for d in range(gathered.shape[0]):
        w0, w1, w2, w3 = query[h, d], query[h + 1, d], query[h + 2, d], query[h + 3, d]
        column = gathered[d]
        for j in range(live):
            key = column[j]
            first[j] += w0 * key
            second[j] += w1 * key
            third[j] += w2 * key
            fourth[j] += w3 * key


@njit(**KERNEL_OPTIONS)
def _one_head_dots(query, h, gathered, live, dots):
    first = dots[0]
    first[:live] = _ZERO
    for d in range(gathered.shape[0]):
        weight = query[h, d]
        column = gathered[d]
        for j in range(live):
            first[j] += weight * column[j]


@njit(**KERNEL_OPTIONS)
def attention_values(probabilities, source, rows, empty_row, begin, end, output):
    """output[b, s, h] = ascending sum over candidates of p * row, for s in [begin, end).

    probabilities are [C, B, end - begin, N]. An empty slot's row is zeros
    and its probability 0, so its term is +0 and is skipped. Heads go
    HEAD_BLOCK at a time to reuse each row load.
    """
    batch, _, heads, dim = output.shape
    count = rows.shape[-1]
    for b in range(batch):
        for s in range(begin, end):
            h = 0
            while h < heads:
                if h + HEAD_BLOCK <= heads:
                    first, second, third, fourth = output[b, s, h], output[b, s, h + 1], output[b, s, h + 2], output[b, s, h + 3]
                    first[:] = _ZERO
                    second[:] = _ZERO
                    third[:] = _ZERO
                    fourth[:] = _ZERO
                    for c in range(count):
                        row = rows[b, s, c]
                        if row == empty_row:
                            continue
                        p0 = probabilities[c, b, s - begin, h]
                        p1 = probabilities[c, b, s - begin, h + 1]
                        p2 = probabilities[c, b, s - begin, h + 2]
                        p3 = probabilities[c, b, s - begin, h + 3]
                        values = source[b, row]
                        for d in range(dim):
                            value = values[d]
                            first[d] += p0 * value
                            second[d] += p1 * value
                            third[d] += p2 * value
                            fourth[d] += p3 * value
                    h += HEAD_BLOCK
                else:
                    total = output[b, s, h]
                    total[:] = _ZERO
                    for c in range(count):
                        row = rows[b, s, c]
                        if row == empty_row:
                            continue
                        probability = probabilities[c, b, s - begin, h]
                        values = source[b, row]
                        for d in range(dim):
                            total[d] += probability * values[d]
                    h += 1


@njit(**KERNEL_OPTIONS)
def packed_index_scores(queries, keys, e2m1, e8m0, weights, weight_scale, causal, first, last, scores):
    """scores[b, s, c] for records c in [first, last) with c < causal[s], from packed FP4 keys.

    Sum over heads, ascending, of fmax(dot, 0) * weight * weight_scale
    (fmax: a NaN dot counts as 0), dots ascending in d. Keys stay packed
    ([B, records, 68] bytes) and are decoded a tile of records at a time
    (code value times E8M0 scale, one binary32 product, as the NumPy
    decode); the tile, [d, records], is read by every query and every head
    while it is in cache, so each key byte is read once per call. Entries
    past causal[s] are left as they are.
    """
    batch, sequence, heads, width = queries.shape
    key_tile = np.empty((width, SCORE_TILE), dtype=np.float32)
    dots = np.empty((heads, SCORE_TILE), dtype=np.float32)
    total = np.empty(SCORE_TILE, dtype=np.float32)
    blocks = width // FP4_BLOCK
    for b in range(batch):
        for tile in range(first, last, SCORE_TILE):
            count = min(SCORE_TILE, last - tile)
            for c in range(count):
                for block in range(blocks):
                    base = block * (FP4_BLOCK // 2 + 1)
                    scale = e8m0[keys[b, tile + c, base]]
                    for pair in range(FP4_BLOCK // 2):
                        byte = keys[b, tile + c, base + 1 + pair]
                        d = block * FP4_BLOCK + 2 * pair
                        key_tile[d, c] = e2m1[byte & 15] * scale
                        key_tile[d + 1, c] = e2m1[byte >> 4] * scale
            for s in range(sequence):
                live = min(causal[s] - tile, count)
                if live <= 0:
                    continue
                dots[:, :live] = _ZERO
                for d in range(width):
                    for h in range(heads):
                        weight = queries[b, s, h, d]
                        for c in range(live):
                            dots[h, c] += weight * key_tile[d, c]
                total[:live] = _ZERO
                for h in range(heads):
                    head_weight = weights[b, s, h]
                    for c in range(live):
                        dot = dots[h, c]
                        relu = dot if dot > _ZERO else _ZERO
                        total[c] += relu * head_weight * weight_scale
                for c in range(live):
                    scores[b, s, tile + c] = total[c]


KERNELS = (attention_scores, _four_head_dots, _one_head_dots, attention_values, packed_index_scores)
