"""The numba engine's record kernels against the NumPy code they replace, beyond what the goldens hold:
every byte value a stored record can have, and index queries from subnormal to overflowing magnitudes."""

from __future__ import annotations

import numpy as np
import pytest
from engine_pairs import needs_numba

from csa_conform import ContractError
from csa_conform.numerics.index_query import finalize_index_query
from csa_conform.numerics.records import FP4_RECORD_BYTES, FP8_RECORD_BYTES, decode_fp4_record, decode_fp8_record

pytestmark = needs_numba


@pytest.mark.parametrize("width", [FP8_RECORD_BYTES, FP4_RECORD_BYTES])
def test_compiled_record_decoding_is_the_numpy_decoding_on_any_bytes(width):
    from csa_conform.oracle.compiled import record_kernels as compiled_records

    records = np.random.default_rng(width).integers(0, 256, (3, 700, width), dtype=np.uint8)
    records[0, :256] = np.arange(256, dtype=np.uint8)[:, None]  # every scale byte and code, NaN ones included
    decode, compiled = {
        FP8_RECORD_BYTES: (decode_fp8_record, compiled_records.decode_fp8_record),
        FP4_RECORD_BYTES: (decode_fp4_record, compiled_records.decode_fp4_record),
    }[width]
    with np.errstate(over="ignore"):  # random scales overflow some products to inf
        expected = decode(records)
    assert np.array_equal(compiled(records).view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("magnitude", [0.0, 1e-42, 1e-30, 1e-3, 1.0, 1e3, 1e30, 3e37, 3e38])
def test_compiled_index_queries_are_the_numpy_ones_exactly_when_numpy_accepts_them(magnitude):
    from csa_conform.oracle.compiled.record_kernels import frequency_table, index_queries

    rng = np.random.default_rng(7)
    with np.errstate(over="ignore"):
        rows = (rng.standard_normal((64, 4, 128)) * magnitude).astype(np.float32)
    rows[0, 0, :8] = [0.0, -0.0, 0.0, -0.0, 1e-45, -1e-45, 0.0, 0.0]
    positions = rng.integers(0, 1 << 20, 64)
    out = np.empty_like(rows)
    settled = index_queries(rows, positions, frequency_table(64), out)
    try:
        expected = finalize_index_query(rows, 64, positions[:, None])
    except ContractError:
        assert not settled
        return
    assert settled
    assert np.array_equal(out.view(np.uint32), expected.view(np.uint32))
