"""Stage 6, candidate_assembly: each query's dense window followed by its
compressed records.

Dense slot c is absolute position dense_start + c, skipped when it lies after
the query or outside current_kv; dense_start = max(T - Kc, pos + 1 - 128).
Ratio 4 appends the selected records, ratio 128 every record, valid only
below (pos + 1) / 128. Ids: absolute position (dense), record index
(compressed), -1 for an invalid slot.
"""

from __future__ import annotations

import numpy as np

from csa_conform.contract import DENSE_WINDOW, StepGeometry


def candidate_assembly(geometry: StepGeometry, selected: np.ndarray | None, dense_extra: int = 0,
                       from_step_start: frozenset[str] = frozenset(), dense_strict: bool = False
                       ) -> dict[str, np.ndarray]:
    """``dense_extra``: slots a variant's dense window takes beyond the contract's (its record slots move up
    as many places, the last ones dropped); ``from_step_start``: what a variant computes from the step's first
    position for every query ("dense window": its start; "causal records": the ratio-128 records a query may
    attend); ``dense_strict``: a variant whose dense window's causal bound is strict (a query's own position left
    out). 0, none and False are the reference."""
    positions = geometry.start + np.arange(geometry.sequence)
    first = np.full_like(positions, geometry.start)
    window_from = first if "dense window" in from_step_start else positions
    dense_start = np.maximum(geometry.current_kv_base, np.maximum(window_from + 1 - DENSE_WINDOW, 0))
    absolute = dense_start[:, None] + np.arange(geometry.dense_candidates + dense_extra)[None, :]
    causal = absolute < positions[:, None] if dense_strict else absolute <= positions[:, None]
    in_window = causal & (absolute - geometry.current_kv_base < geometry.current_kv_len)
    dense = np.where(in_window, absolute, -1)
    if selected is None:
        records = np.arange(geometry.next_records)[None, :]
        causal_from = first if "causal records" in from_step_start else positions
        compressed = np.where(records < ((causal_from + 1) // geometry.ratio)[:, None], records, -1)
        compressed = np.broadcast_to(compressed, (geometry.batch,) + compressed.shape)
    else:
        compressed = selected
    dense = np.broadcast_to(dense, (geometry.batch,) + dense.shape)
    width = geometry.dense_candidates + compressed.shape[-1]
    return {"candidates": np.concatenate([dense, compressed], axis=-1)[..., :width].astype(np.int32)}
