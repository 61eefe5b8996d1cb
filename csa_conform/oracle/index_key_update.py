"""Stage 2, index_key_update (ratio 4): the same 8-slot overlap compressor on
the index tensors, finalized as Hadamard-rotated FP4 index keys."""

from __future__ import annotations

from functools import partial

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.numerics.records import decode_fp4_record
from csa_conform.numerics.variant import REFERENCE, Numerics
from csa_conform.oracle.compressor import pool_and_finalize, stream
from csa_conform.oracle.payloads import StagePayload
from csa_conform.oracle.pooling import finalize_index_records


def index_key_update(
    geometry: StepGeometry,
    index_compressor_kv: np.ndarray,
    index_compressor_gate: np.ndarray,
    index_compressor_ape: np.ndarray,
    index_compressor_norm: np.ndarray,
    past_index_key: np.ndarray,
    past_index_carry: np.ndarray,
    numerics: Numerics = REFERENCE,
) -> dict[str, np.ndarray]:
    candidates, block_starts, carry = stream(
        geometry, index_compressor_kv, index_compressor_gate, index_compressor_ape, past_index_carry, numerics
    )
    logical, packed = index_records(geometry, candidates, block_starts, index_compressor_norm, numerics)
    return present_index_keys(past_index_key, logical, packed, carry)


def index_records(geometry: StepGeometry, candidates, block_starts, index_compressor_norm, numerics: Numerics = REFERENCE):
    """(logical, packed) of every index key the step emits, or the reference's first failure."""

    def finalize(pooled, positions):
        return finalize_index_records(pooled, index_compressor_norm, positions, geometry.rope_dim, numerics)

    return pool_and_finalize(candidates, block_starts, finalize, "ratio-4 ", numerics)


def present_index_keys(past_index_key, logical, packed, carry, decode=decode_fp4_record) -> StagePayload:
    """The stage payload; every logical key is decoded from the present keys (through `decode`, which
    the numba engine compiles) only when read: scoring reads the packed keys."""
    present = np.concatenate([past_index_key, packed], axis=1)
    tensors = {"present_index_key": present, "present_index_carry": carry}
    return StagePayload(tensors, {"logical_keys": partial(decode, present)})
