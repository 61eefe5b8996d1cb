"""StepGeometry: what the pipeline derives from an accepted step, derived once.

Stages read cursors, widths and candidate counts from here instead of re-deriving
them, so oracle and device agree on one geometry per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from csa_conform.contract.attributes import Kernel
from csa_conform.contract.execute import DENSE_WINDOW, Cursors
from csa_conform.contract.schema import BIAS_INPUT


@dataclass(frozen=True)
class StepGeometry:
    """Everything the pipeline derives from a step the reference accepted.

    Ratio-128 steps carry zeros in the index fields. ``topk_width`` is
    min(index_topk, next_records) for ratio 4; ``candidate_count`` is
    dense_candidates plus topk_width (ratio 4) or next_records (ratio 128).
    """

    ratio: int
    batch: int
    sequence: int
    heads: int
    dim: int
    rope_dim: int
    index_heads: int
    index_dim: int
    index_topk: int
    topk_width: int
    scale: np.float32
    cache_format: str
    total: int
    start: int
    past_records: int
    next_records: int
    emitted: int
    current_kv_len: int
    current_kv_base: int
    dense_candidates: int
    candidate_count: int
    stored_width: int
    index_stored_width: int
    carry_slots: int
    compressor_width: int
    index_compressor_width: int
    has_bias: bool
    output_names: tuple[str, ...]


def _resolved_scale(kernel: Kernel, dim: int) -> np.float32:
    """0 means 1/sqrt(D), evaluated in f32 as the reference's attention does."""
    if kernel.scale != 0:
        return kernel.scale
    return np.float32(1) / np.sqrt(np.float32(dim))


def step_geometry(
    kernel: Kernel,
    arrays: list,
    outputs: tuple[str, ...],
    cursors: Cursors,
    stored: int,
    index_stored: int,
) -> StepGeometry:
    batch, sequence, heads, dim = arrays[0].shape
    ratio = kernel.ratio
    past_records, next_records = cursors.start // ratio, cursors.total // ratio
    current_kv_len = arrays[1].shape[1]
    dense = min(current_kv_len, DENSE_WINDOW) if cursors.start == 0 else DENSE_WINDOW
    topk_width = min(kernel.index_topk, next_records) if ratio == 4 else 0
    return StepGeometry(
        ratio=ratio,
        batch=batch,
        sequence=sequence,
        heads=heads,
        dim=dim,
        rope_dim=kernel.rope_dim,
        index_heads=kernel.index_heads,
        index_dim=kernel.index_dim,
        index_topk=kernel.index_topk,
        topk_width=topk_width,
        scale=_resolved_scale(kernel, dim),
        cache_format=kernel.cache_format,
        total=cursors.total,
        start=cursors.start,
        past_records=past_records,
        next_records=next_records,
        emitted=next_records - past_records,
        current_kv_len=current_kv_len,
        current_kv_base=cursors.current_kv_base,
        dense_candidates=dense,
        candidate_count=dense + (topk_width if ratio == 4 else next_records),
        stored_width=stored,
        index_stored_width=index_stored,
        carry_slots=8 if ratio == 4 else 128,
        compressor_width=2 * dim if ratio == 4 else dim,
        index_compressor_width=2 * kernel.index_dim,
        has_bias=len(arrays) > BIAS_INPUT and arrays[BIAS_INPUT] is not None,
        output_names=outputs,
    )
