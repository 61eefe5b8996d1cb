"""Numba kernels for the oracle's hot loops, in the reference's arithmetic.

Every product and sum is one binary32 operation in the NumPy engine's
order: dots ascend in d, head sums ascend in head, value sums ascend in
candidate. Vectorisation runs across independent lanes only (heads for
attention's dots, records for the index dots, d for the value sums), so
no reduction is reassociated. The dots and sums of a register block live
in LLVM vectors (lanes.py) for a whole reduction: numba keeps an
accumulator that is an array element in memory, loaded and stored every
few terms, which held these kernels near a third of the no-FMA peak.
fastmath is off and the vector operations carry no fast-math flags: LLVM
then neither reassociates nor contracts a*b+c into a fused multiply-add
(tests/oracle/test_compiled_kernels.py reads the assembly).
No kernel calls a math function: glibc's libm comes from libm_kernels.py.
Kernels release the GIL; the oracle's own thread pool runs query chunks,
or a decode's record, candidate, head and d ranges (independent lanes too).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from csa_conform.numerics.e8m0 import E8M0_TABLE
from csa_conform.numerics.fp8 import E4M3_TABLE, FP8_BLOCK
from csa_conform.numerics.records import FP8_BLOCKS
from csa_conform.oracle.compiled.cache import kernel_cache
from csa_conform.oracle.compiled.lanes import (
    LANES,
    add_lanes,
    add_product,
    load_lanes,
    relu_lanes,
    scale_lanes,
    store_lanes,
    zero_lanes,
)

KERNEL_OPTIONS = {"cache": kernel_cache(), "nogil": True, "fastmath": False, "error_model": "numpy"}

_ZERO = np.float32(0)
_MINUS_INFINITY = np.float32(-np.inf)
# A register block is sixteen vectors: HEAD_BLOCK heads by BLOCK records (the index dots), BLOCK
# heads by four candidates (attention's dots), HEAD_BLOCK heads by BLOCK of d (the value sums). With
# the operands each step reads they fit AVX-512's 32 registers (AVX2 spills a few, correctly); four
# vectors per operand read rather than two: measured on one core, values 39 -> 46 and index dots
# 38 -> 45 G mul-add/s.
HEAD_BLOCK = 4
BLOCK = 4 * LANES
# Candidates whose FP8 records attention decodes at a time.
SCORE_TILE = 64
# Records per index tile: [256, 128] f32 (128 KiB) decoded once for every query and head, stays in L2;
# a prefill streams every query's [heads, 128] once per tile, so larger tiles stream them less.
INDEX_TILE = 256
FP4_BLOCK = 32
# Candidate rows summed per pass over the heads: 64 rows of 512 f32 (128 KiB) stay in L2.
VALUE_TILE = 64


@njit(**KERNEL_OPTIONS)
def decode_fp8_row(record, logical, first, last):
    """records.decode_fp8_record of one record into logical [512], of the FP8 blocks and the bf16 tail
    that meet [first, last): FP8 codes times their E8M0 block scale (one binary32 product of table
    values), then the RoPE tail widened bit for bit. Whole blocks keep the loops' trip counts fixed."""
    for block in range(FP8_BLOCKS):
        begin = block * FP8_BLOCK
        if begin < last and first < begin + FP8_BLOCK:
            at = block * (FP8_BLOCK + 1)
            scale = E8M0_TABLE[record[at]]
            for i in range(FP8_BLOCK):
                logical[begin + i] = E4M3_TABLE[record[at + 1 + i]] * scale
    lead, at = FP8_BLOCKS * FP8_BLOCK, FP8_BLOCKS * (FP8_BLOCK + 1)
    if last > lead:
        bits = logical.view(np.uint32)
        for d in range(logical.size - lead):
            bits[lead + d] = (np.uint32(record[at + 2 * d]) | (np.uint32(record[at + 2 * d + 1]) << 8)) << 16


@njit(**KERNEL_OPTIONS)
def decode_packed(current, packed, b, row, decoded, slot, first, last):
    """Decodes d in [first, last) of row ``row`` of [current_kv | packed] into decoded[slot] when it is
    a packed FP8 record."""
    if row >= current.shape[1] and packed.shape[1] > 0:
        decode_fp8_row(packed[b, row - current.shape[1]], decoded[slot], first, last)


@njit(**KERNEL_OPTIONS)
def candidate_row(current, records, packed, decoded, b, row, slot):
    """Row ``row`` (>= 0) of batch b where it lies: current_kv's row, else the cache's record, read
    from an f32 ``records`` in place or, when ``packed`` holds FP8 records, from decoded[slot]
    (decode_packed wrote it): neither cache is copied or decoded whole."""
    if row < current.shape[1]:
        return current[b, row]
    if packed.shape[1] > 0:
        return decoded[slot]
    return records[b, row - current.shape[1]]


@njit(**KERNEL_OPTIONS)
def weighted_relu_totals(queries, head_weights, weight_scale, tile, blocks, totals):
    """totals[j] = the sum over heads, ascending, of fmax(dot, 0) * head_weights[h] * weight_scale, dots
    of queries[h] and candidate j of ``tile`` ascending in d, for the first ``blocks`` blocks of
    BLOCK candidates; tile[block, d, lane] holds candidate block * BLOCK + lane.

    HEAD_BLOCK heads by BLOCK candidates are sixteen vectors of dots
    (lanes.py) that stay in registers over all of d, one product and
    one sum per term, (((0 + q_0 k_0) + q_1 k_1) + ...), the order of one
    term at a time; the block's vectors of totals take the heads in
    ascending order as they finish. Lanes past a tile's last candidate hold
    whatever the tile holds there; callers read only their candidates.
    """
    heads, dim = queries.shape
    for block in range(blocks):
        s0 = s1 = s2 = s3 = zero_lanes()
        h = 0
        while h < heads:
            group = HEAD_BLOCK if h + HEAD_BLOCK <= heads else 1
            a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = c0 = c1 = c2 = c3 = e0 = e1 = e2 = e3 = zero_lanes()
            if group == 1:
                for d in range(dim):
                    w = queries[h, d]
                    a0, a1 = add_product(a0, w, load_lanes(tile, (block, d, 0))), add_product(a1, w, load_lanes(tile, (block, d, LANES)))
                    a2 = add_product(a2, w, load_lanes(tile, (block, d, 2 * LANES)))
                    a3 = add_product(a3, w, load_lanes(tile, (block, d, 3 * LANES)))
            else:
                for d in range(dim):
                    k0, k1 = load_lanes(tile, (block, d, 0)), load_lanes(tile, (block, d, LANES))
                    k2, k3 = load_lanes(tile, (block, d, 2 * LANES)), load_lanes(tile, (block, d, 3 * LANES))
                    w = queries[h, d]
                    a0, a1, a2, a3 = add_product(a0, w, k0), add_product(a1, w, k1), add_product(a2, w, k2), add_product(a3, w, k3)
                    w = queries[h + 1, d]
                    b0, b1, b2, b3 = add_product(b0, w, k0), add_product(b1, w, k1), add_product(b2, w, k2), add_product(b3, w, k3)
                    w = queries[h + 2, d]
                    c0, c1, c2, c3 = add_product(c0, w, k0), add_product(c1, w, k1), add_product(c2, w, k2), add_product(c3, w, k3)
                    w = queries[h + 3, d]
                    e0, e1, e2, e3 = add_product(e0, w, k0), add_product(e1, w, k1), add_product(e2, w, k2), add_product(e3, w, k3)
            for k, (t0, t1, t2, t3) in enumerate(((a0, a1, a2, a3), (b0, b1, b2, b3), (c0, c1, c2, c3), (e0, e1, e2, e3))):
                if k < group:
                    weight = head_weights[h + k]
                    s0 = add_lanes(s0, scale_lanes(scale_lanes(relu_lanes(t0), weight), weight_scale))
                    s1 = add_lanes(s1, scale_lanes(scale_lanes(relu_lanes(t1), weight), weight_scale))
                    s2 = add_lanes(s2, scale_lanes(scale_lanes(relu_lanes(t2), weight), weight_scale))
                    s3 = add_lanes(s3, scale_lanes(scale_lanes(relu_lanes(t3), weight), weight_scale))
            h += group
        j = block * BLOCK
        store_lanes(totals, j, s0)
        store_lanes(totals, j + LANES, s1)
        store_lanes(totals, j + 2 * LANES, s2)
        store_lanes(totals, j + 3 * LANES, s3)


@njit(**KERNEL_OPTIONS)
def head_dots(transposed, h, row0, row1, row2, row3, dots, j):
    """dots[j + k, h:h + BLOCK] = the dots of rows k = 0..3 with BLOCK heads' queries, ascending in d;
    transposed[d, h] holds query h's weight d.

    Four vectors of heads by four candidates are sixteen vectors of sums
    (lanes.py) that stay in registers over all of d, one product
    and one sum per term, (((0 + q_0 k_0) + q_1 k_1) + ...), the order of
    one term at a time; each key element is read once, in place.
    """
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = c0 = c1 = c2 = c3 = e0 = e1 = e2 = e3 = zero_lanes()
    for d in range(transposed.shape[0]):
        q0, q1 = load_lanes(transposed, (d, h)), load_lanes(transposed, (d, h + LANES))
        q2, q3 = load_lanes(transposed, (d, h + 2 * LANES)), load_lanes(transposed, (d, h + 3 * LANES))
        k = row0[d]
        a0, a1, a2, a3 = add_product(a0, k, q0), add_product(a1, k, q1), add_product(a2, k, q2), add_product(a3, k, q3)
        k = row1[d]
        b0, b1, b2, b3 = add_product(b0, k, q0), add_product(b1, k, q1), add_product(b2, k, q2), add_product(b3, k, q3)
        k = row2[d]
        c0, c1, c2, c3 = add_product(c0, k, q0), add_product(c1, k, q1), add_product(c2, k, q2), add_product(c3, k, q3)
        k = row3[d]
        e0, e1, e2, e3 = add_product(e0, k, q0), add_product(e1, k, q1), add_product(e2, k, q2), add_product(e3, k, q3)
    for row, (t0, t1, t2, t3) in enumerate(((a0, a1, a2, a3), (b0, b1, b2, b3), (c0, c1, c2, c3), (e0, e1, e2, e3))):
        store_lanes(dots, (j + row, h), t0)
        store_lanes(dots, (j + row, h + LANES), t1)
        store_lanes(dots, (j + row, h + 2 * LANES), t2)
        store_lanes(dots, (j + row, h + 3 * LANES), t3)


@njit(**KERNEL_OPTIONS)
def attention_scores(query, current, records, packed, rows, scale, bias, has_bias, begin, end, first, last, scores):
    """scores[b, s, h, c] for s in [begin, end) and candidates c in [first, last): dot(q, row) * scale
    (+ bias); -inf for empty slots (row -1; rows index [current_kv | the cache], candidate_row).

    The vector lanes run over heads (independent), d stays sequential
    (head_dots): each query is transposed once into [d, heads] (zero heads
    pad it to whole BLOCKs; their dots are never read), and its candidates'
    rows are read where they lie, four at a time, so no row is copied (a
    packed FP8 record is decoded once, SCORE_TILE of them at a time). A
    tile's last group of four repeats its last row. The transposed query,
    decoded rows and dots are this kernel's own arrays. Candidate ranges are
    independent, so a decode's one query splits over the cores by range.
    """
    batch, _, heads, dim = query.shape
    padded = -(-heads // BLOCK) * BLOCK
    columns = np.empty(last - first, dtype=np.int64)
    transposed = np.zeros((dim, padded), dtype=np.float32)
    dots = np.empty((SCORE_TILE, padded), dtype=np.float32)
    decoded = np.empty((SCORE_TILE, dim), dtype=np.float32)
    for b in range(batch):
        for s in range(begin, end):
            live = 0
            for c in range(first, last):
                if rows[b, s, c] < 0:
                    for h in range(heads):
                        scores[b, s, h, c] = _MINUS_INFINITY
                else:
                    columns[live] = c
                    live += 1
            for h in range(heads):
                for d in range(dim):
                    transposed[d, h] = query[b, s, h, d]
            for start in range(0, live, SCORE_TILE):
                count = min(SCORE_TILE, live - start)
                for j in range(count):
                    decode_packed(current, packed, b, rows[b, s, columns[start + j]], decoded, j, 0, dim)
                for j in range(0, count, 4):
                    last_row = min(j + 3, count - 1)
                    row0 = candidate_row(current, records, packed, decoded, b, rows[b, s, columns[start + j]], j)
                    row1 = candidate_row(current, records, packed, decoded, b, rows[b, s, columns[start + min(j + 1, last_row)]], min(j + 1, last_row))
                    row2 = candidate_row(current, records, packed, decoded, b, rows[b, s, columns[start + min(j + 2, last_row)]], min(j + 2, last_row))
                    row3 = candidate_row(current, records, packed, decoded, b, rows[b, s, columns[start + last_row]], last_row)
                    for h in range(0, padded, BLOCK):
                        head_dots(transposed, h, row0, row1, row2, row3, dots, j)
                for h in range(heads):
                    for j in range(count):
                        c = columns[start + j]
                        if has_bias:
                            scores[b, s, h, c] = dots[j, h] * scale + bias[b, h, s, c]
                        else:
                            scores[b, s, h, c] = dots[j, h] * scale


@njit(**KERNEL_OPTIONS)
def sum_block(sums, value_tile, weight_tile, block, size, h, d, heads):
    """sums[h:h + heads, d:d + BLOCK] += the tile's candidates in ascending order, p * row, for
    ``heads`` of 1 or HEAD_BLOCK: sixteen vectors of sums (four for one head) that stay in registers
    over the tile, one product and one sum per term; the tile is as in attention_values."""
    a0, a1 = load_lanes(sums, (h, d)), load_lanes(sums, (h, d + LANES))
    a2, a3 = load_lanes(sums, (h, d + 2 * LANES)), load_lanes(sums, (h, d + 3 * LANES))
    if heads == 1:
        for j in range(size):
            p = weight_tile[j, h]
            a0, a1 = add_product(a0, p, load_lanes(value_tile, (block, j, 0))), add_product(a1, p, load_lanes(value_tile, (block, j, LANES)))
            a2, a3 = add_product(a2, p, load_lanes(value_tile, (block, j, 2 * LANES))), add_product(a3, p, load_lanes(value_tile, (block, j, 3 * LANES)))
    else:
        b0, b1 = load_lanes(sums, (h + 1, d)), load_lanes(sums, (h + 1, d + LANES))
        b2, b3 = load_lanes(sums, (h + 1, d + 2 * LANES)), load_lanes(sums, (h + 1, d + 3 * LANES))
        c0, c1 = load_lanes(sums, (h + 2, d)), load_lanes(sums, (h + 2, d + LANES))
        c2, c3 = load_lanes(sums, (h + 2, d + 2 * LANES)), load_lanes(sums, (h + 2, d + 3 * LANES))
        e0, e1 = load_lanes(sums, (h + 3, d)), load_lanes(sums, (h + 3, d + LANES))
        e2, e3 = load_lanes(sums, (h + 3, d + 2 * LANES)), load_lanes(sums, (h + 3, d + 3 * LANES))
        for j in range(size):
            v0, v1 = load_lanes(value_tile, (block, j, 0)), load_lanes(value_tile, (block, j, LANES))
            v2, v3 = load_lanes(value_tile, (block, j, 2 * LANES)), load_lanes(value_tile, (block, j, 3 * LANES))
            p = weight_tile[j, h]
            a0, a1, a2, a3 = add_product(a0, p, v0), add_product(a1, p, v1), add_product(a2, p, v2), add_product(a3, p, v3)
            p = weight_tile[j, h + 1]
            b0, b1, b2, b3 = add_product(b0, p, v0), add_product(b1, p, v1), add_product(b2, p, v2), add_product(b3, p, v3)
            p = weight_tile[j, h + 2]
            c0, c1, c2, c3 = add_product(c0, p, v0), add_product(c1, p, v1), add_product(c2, p, v2), add_product(c3, p, v3)
            p = weight_tile[j, h + 3]
            e0, e1, e2, e3 = add_product(e0, p, v0), add_product(e1, p, v1), add_product(e2, p, v2), add_product(e3, p, v3)
        for row, (t0, t1, t2, t3) in enumerate(((b0, b1, b2, b3), (c0, c1, c2, c3), (e0, e1, e2, e3))):
            store_lanes(sums, (h + 1 + row, d), t0)
            store_lanes(sums, (h + 1 + row, d + LANES), t1)
            store_lanes(sums, (h + 1 + row, d + 2 * LANES), t2)
            store_lanes(sums, (h + 1 + row, d + 3 * LANES), t3)
    store_lanes(sums, (h, d), a0)
    store_lanes(sums, (h, d + LANES), a1)
    store_lanes(sums, (h, d + 2 * LANES), a2)
    store_lanes(sums, (h, d + 3 * LANES), a3)


@njit(**KERNEL_OPTIONS)
def attention_values(probabilities, current, records, packed, rows, begin, end, first, last, output):
    """output[b, s, :, first:last] = ascending sum over candidates of p * row[first:last], for s in
    [begin, end) and every head.

    probabilities are [B, end - begin, N, C]; rows as in attention_scores.
    An empty slot's probability is 0, so its term is +0 and is skipped (a
    sum that starts at +0 never becomes -0, so adding +0 changes no bit).
    VALUE_TILE candidates at a time are gathered (a packed FP8 record's
    span decoded once) with their probabilities, so their rows are read
    from memory once for every head; the tile is [d // BLOCK, candidate,
    lane], so a block of d of every candidate is one contiguous run (rows
    2 KiB apart would share a few L1 sets). HEAD_BLOCK heads by BLOCK of d
    at a time are summed in registers (sum_block) over the tile's
    candidates, in ascending candidate order; d past the last whole BLOCK
    goes one lane at a time. Ranges of d are independent, so a decode's one query splits
    over the cores by d, and each core reads only its span of each row.
    """
    batch, _, heads, dim = output.shape
    count = rows.shape[-1]
    whole, tail = (last - first) // BLOCK, first + (last - first) // BLOCK * BLOCK
    columns = np.empty(count, dtype=np.int64)
    value_tile = np.empty((-(-(last - first) // BLOCK), VALUE_TILE, BLOCK), dtype=np.float32)
    weight_tile = np.empty((VALUE_TILE, heads), dtype=np.float32)
    decoded = np.empty((1, dim), dtype=np.float32)
    for b in range(batch):
        for s in range(begin, end):
            live = 0
            for c in range(count):
                if rows[b, s, c] >= 0:
                    columns[live] = c
                    live += 1
            output[b, s, :, first:last] = _ZERO
            weights = probabilities[b, s - begin]
            sums = output[b, s]
            for start in range(0, live, VALUE_TILE):
                size = min(live, start + VALUE_TILE) - start
                for j in range(size):
                    row_id = rows[b, s, columns[start + j]]
                    decode_packed(current, packed, b, row_id, decoded, 0, first, last)
                    row = candidate_row(current, records, packed, decoded, b, row_id, 0)
                    for block in range(whole):
                        for lane in range(0, BLOCK, LANES):
                            store_lanes(value_tile, (block, j, lane), load_lanes(row, first + block * BLOCK + lane))
                    for d in range(tail, last):
                        value_tile[whole, j, d - tail] = row[d]
                for h in range(heads):
                    for j in range(size):
                        weight_tile[j, h] = weights[h, columns[start + j]]
                for block in range(whole):
                    d = first + block * BLOCK
                    h = 0
                    while h + HEAD_BLOCK <= heads:
                        sum_block(sums, value_tile, weight_tile, block, size, h, d, HEAD_BLOCK)
                        h += HEAD_BLOCK
                    while h < heads:
                        sum_block(sums, value_tile, weight_tile, block, size, h, d, 1)
                        h += 1
                for d in range(tail, last):
                    for h in range(heads):
                        for j in range(size):
                            sums[h, d] += weight_tile[j, h] * value_tile[whole, j, d - tail]


@njit(**KERNEL_OPTIONS)
def packed_index_scores(queries, keys, e2m1, e8m0, weights, weight_scale, causal, first, last, scores):
    """scores[b, s, c] for records c in [first, last) with c < causal[s], from packed FP4 keys.

    Sum over heads, ascending, of fmax(dot, 0) * weight * weight_scale
    (fmax: a NaN dot counts as 0), dots ascending in d (weighted_relu_totals). Keys
    stay packed ([B, records, 68] bytes) and are decoded a tile of records
    at a time (code value times E8M0 scale, one binary32 product, as the
    NumPy decode); the tile is read by every query and every head while it
    is in cache, so each key byte is read once per call. Entries past
    causal[s] are left as they are.
    """
    batch, sequence, heads, width = queries.shape
    key_tile = np.zeros((INDEX_TILE // BLOCK, width, BLOCK), dtype=np.float32)
    total = np.empty(INDEX_TILE, dtype=np.float32)
    blocks = width // FP4_BLOCK
    for b in range(batch):
        for tile in range(first, last, INDEX_TILE):
            count = min(INDEX_TILE, last - tile)
            for c in range(count):
                for block in range(blocks):
                    base = block * (FP4_BLOCK // 2 + 1)
                    scale = e8m0[keys[b, tile + c, base]]
                    for pair in range(FP4_BLOCK // 2):
                        byte = keys[b, tile + c, base + 1 + pair]
                        d = block * FP4_BLOCK + 2 * pair
                        key_tile[c // BLOCK, d, c % BLOCK] = e2m1[byte & 15] * scale
                        key_tile[c // BLOCK, d + 1, c % BLOCK] = e2m1[byte >> 4] * scale
            for s in range(sequence):
                live = min(causal[s] - tile, count)
                if live <= 0:
                    continue
                weighted_relu_totals(queries[b, s], weights[b, s], weight_scale, key_tile, -(-live // BLOCK), total)
                for c in range(live):
                    scores[b, s, tile + c] = total[c]


KERNELS = (decode_fp8_row, decode_packed, candidate_row, weighted_relu_totals, head_dots, sum_block, attention_scores, attention_values,
           packed_index_scores)
