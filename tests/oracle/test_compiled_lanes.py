"""The register-blocked dot kernels round every lane as one term at a time, at every block edge.

The steps the contract accepts have 512-wide rows and the suites' head
counts, so these tests call the kernels directly with shapes that leave
partial blocks everywhere (heads, candidates, d, a decode's spans of d,
empty slots) and compare bit patterns with NumPy sums taken one term at a
time in the reference's order.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_pairs import needs_numba

from csa_conform.numerics.e8m0 import E8M0_TABLE
from csa_conform.numerics.fp4 import E2M1_TABLE
from csa_conform.numerics.records import FP4_RECORD_BYTES, FP8_RECORD_BYTES, decode_fp4_record, decode_fp8_record

pytestmark = needs_numba
WINDOW = 3


def _bits(array):
    return np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)


def _fp8_records(rng, count):
    """Packed FP8 records with finite codes, scales and bf16 tails."""
    records = rng.integers(0, 0x70, (1, count, FP8_RECORD_BYTES), dtype=np.uint8)
    records[..., ::65][..., :7] = rng.integers(118, 136, (1, count, 7), dtype=np.uint8)
    return records


def _candidates(rng, heads, dim, count, packed):
    """query, current_kv, the cache (f32, or FP8 records with their decode) and rows with empty slots."""
    query = rng.standard_normal((1, 1, heads, dim)).astype(np.float32)
    current = rng.standard_normal((1, WINDOW, dim)).astype(np.float32)
    cache = 40
    if packed:
        records = _fp8_records(rng, cache)
        logical = decode_fp8_record(records)
    else:
        records = logical = rng.standard_normal((1, cache, dim)).astype(np.float32)
    rows = rng.integers(-1, WINDOW + cache, (1, 1, count)).astype(np.int64)
    return query, current, records, np.concatenate([current, logical], axis=1), rows


def _kernel_cache(records, dim):
    """The (records, packed) pair compiled_stages hands the kernels."""
    if records.dtype == np.uint8:
        return np.empty((1, 0, dim), dtype=np.float32), records
    return records, np.empty((1, 0, FP8_RECORD_BYTES), dtype=np.uint8)


@pytest.mark.parametrize(("heads", "dim", "count", "packed"), [
    (1, 512, 5, True), (5, 512, 67, True), (37, 512, 130, False), (3, 40, 9, False), (64, 512, 66, True),
])
def test_attention_scores_and_values_match_one_term_at_a_time(heads, dim, count, packed):
    from csa_conform.oracle.compiled.dots import BLOCK, attention_scores, attention_values

    rng = np.random.default_rng(heads * 1000 + count)
    query, current, records, rows_f32, rows = _candidates(rng, heads, dim, count, packed)
    f32, fp8 = _kernel_cache(records, dim)
    scale = np.float32(0.0625)
    keys = rows_f32[0][np.maximum(rows[0, 0], 0)]  # [count, dim]
    expected = np.zeros((heads, count), dtype=np.float32)
    for d in range(dim):
        expected = expected + query[0, 0, :, d, None] * keys[None, :, d]
    expected = np.where(rows[0, 0] >= 0, expected * scale, np.float32(-np.inf))
    scores = np.empty((1, 1, heads, count), dtype=np.float32)
    no_bias = np.zeros((1, 1, 1, 1), dtype=np.float32)
    for first, last in ((0, count), (0, count // 2), (count // 2, count)):
        attention_scores(query, current, f32, fp8, rows, scale, no_bias, False, 0, 1, first, last, scores)
    np.testing.assert_array_equal(_bits(scores[0, 0]), _bits(expected))

    probabilities = np.where(rows >= 0, rng.random((1, 1, heads, count)), 0).astype(np.float32)
    sums = np.zeros((heads, dim), dtype=np.float32)
    for c in np.flatnonzero(rows[0, 0] >= 0):
        sums = sums + probabilities[0, 0, :, c, None] * keys[c]
    blocks = -(-dim // BLOCK)
    for cut in sorted({1, blocks // 2, blocks}):  # spans of whole blocks, the last one partial
        output = np.full((1, 1, heads, dim), np.nan, dtype=np.float32)
        middle = min(cut * BLOCK, dim)
        for first, last in ((0, middle), (middle, dim)):
            if first < last:
                attention_values(probabilities, current, f32, fp8, rows, 0, 1, first, last, output)
        np.testing.assert_array_equal(_bits(output[0, 0]), _bits(sums), err_msg=f"spans cut at block {cut}")


@pytest.mark.parametrize(("heads", "records"), [(1, 7), (6, 64), (64, 300)])
def test_index_scores_match_one_head_and_one_term_at_a_time(heads, records):
    from csa_conform.oracle.compiled.dots import INDEX_TILE, packed_index_scores

    rng = np.random.default_rng(heads + records)
    sequence = 3
    queries = rng.standard_normal((1, sequence, heads, 128)).astype(np.float32)
    keys = rng.integers(0, 256, (1, records, FP4_RECORD_BYTES), dtype=np.uint8)
    keys[..., ::17] = rng.integers(120, 132, (1, records, 4), dtype=np.uint8)
    weights = rng.standard_normal((1, sequence, heads)).astype(np.float32)
    weight_scale = np.float32(0.01)
    causal = np.array([records, records // 2, 1], dtype=np.int64)
    logical = decode_fp4_record(keys)[0]  # [records, 128]
    expected = np.full((sequence, records), -np.inf, dtype=np.float32)
    for s in range(sequence):
        total = np.zeros(causal[s], dtype=np.float32)
        for h in range(heads):
            dots = np.zeros(causal[s], dtype=np.float32)
            for d in range(128):
                dots = dots + queries[0, s, h, d] * logical[: causal[s], d]
            total = total + np.where(dots > 0, dots, np.float32(0)) * weights[0, s, h] * weight_scale
        expected[s, : causal[s]] = total
    scores = np.full((1, sequence, records), -np.inf, dtype=np.float32)
    middle = min(INDEX_TILE, records)
    for first, last in ((0, middle), (middle, records)):  # a whole tile, then a partial one
        packed_index_scores(queries, keys, E2M1_TABLE, E8M0_TABLE, weights, weight_scale, causal, first, last, scores)
    np.testing.assert_array_equal(_bits(scores[0]), _bits(expected))
