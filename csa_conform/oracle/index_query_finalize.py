"""Stage 3, index_query_finalize (ratio 4): bf16, RoPE at the query position,
Hadamard and FP4 round trip of every (b, s, index head) query."""

from __future__ import annotations

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.errors import ContractError
from csa_conform.numerics.index_query import finalize_index_query
from csa_conform.numerics.variant import REFERENCE, Numerics
from csa_conform.oracle.rows import RowFailure

STAGE_RANK = 0


def index_query_finalize(geometry: StepGeometry, index_query: np.ndarray, numerics: Numerics = REFERENCE):
    """Returns ({"transformed": f32[B,S,I,128]}, first RowFailure or None).

    Rows at and after a failing row are NaN: the reference never reaches them.
    """
    rows = index_query.reshape((-1,) + index_query.shape[2:])
    positions = np.tile(geometry.start + np.arange(geometry.sequence), geometry.batch)[:, None]
    try:
        transformed = finalize_index_query(rows, geometry.rope_dim, positions, numerics)
        failure = None
    except ContractError:
        failure = _first_failing_row(rows, positions, geometry.rope_dim, numerics)
        transformed = np.full(rows.shape, np.nan, dtype=np.float32)
        transformed[: failure.row] = finalize_index_query(
            rows[: failure.row], geometry.rope_dim, positions[: failure.row], numerics
        )
    return {"transformed": transformed.reshape(index_query.shape)}, failure


def _first_failing_row(rows, positions, rope_dim, numerics: Numerics) -> RowFailure:
    for row in range(rows.shape[0]):
        try:
            finalize_index_query(rows[row], rope_dim, positions[row], numerics)
        except ContractError as error:
            return RowFailure(row, STAGE_RANK, str(error), error.kind)
    raise AssertionError("vectorised index-query finalization failed but no row does")
