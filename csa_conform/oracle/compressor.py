"""The two carry-state compressors the reference streams positions through.

Ratio 128 writes position p into slot p mod 128 and, at each block end,
pools all 128 slots and resets them. Ratio 4 writes into slot 4 + p mod 4 of
an 8-slot, two-channel carry; at each block end it pools slots 0..3 (channel
0, the previous block) with slots 4..7 (channel 1, this block), then rotates
4..7 into 0..3 and clears 4..7. Positions are sequential, so the loop runs
over the step's positions and is vectorised over batch and width; pooling and
finalization then run over every emitted record at once.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from csa_conform.errors import ContractError
from csa_conform.numerics.variant import REFERENCE, Numerics
from csa_conform.oracle.pooling import pool_failure, softmax_pool

OVERLAP_RATIO = 4


def reset_carry(carry: np.ndarray) -> None:
    carry[:, :, 0] = 0
    carry[:, :, 1] = -np.inf


def stream_block_compressor(carry, kv, scores, start, ratio):
    """Ratio-128 carry walk. Returns (candidate values, candidate scores, block starts).

    Candidates are [B, records, ratio, W]; ``carry`` is updated in place.
    """
    snapshots, block_starts = [], []
    for s in range(kv.shape[1]):
        position = start + s
        slot = position % ratio
        carry[:, slot, 0] = kv[:, s]
        carry[:, slot, 1] = scores[:, s]
        if (position + 1) % ratio == 0:
            snapshots.append(carry.copy())
            block_starts.append(position + 1 - ratio)
            reset_carry(carry)
    return _stacked(snapshots, carry), np.asarray(block_starts, dtype=np.int64)


def stream_overlap_compressor(carry, kv, scores, start, boundary: int = 0):
    """Ratio-4 carry walk over the 8-slot, two-channel carry (updated in place); slots before
    OVERLAP_RATIO + ``boundary`` are pooled from the first half of the width (a variant's boundary: 0 is the
    reference's)."""
    width = kv.shape[-1] // 2
    snapshots, block_starts = [], []
    for s in range(kv.shape[1]):
        position = start + s
        slot = OVERLAP_RATIO + position % OVERLAP_RATIO
        carry[:, slot, 0] = kv[:, s]
        carry[:, slot, 1] = scores[:, s]
        if (position + 1) % OVERLAP_RATIO == 0:
            split = OVERLAP_RATIO + boundary
            previous = carry[:, :split, :, :width]
            current = carry[:, split:, :, width:]
            snapshots.append(np.concatenate([previous, current], axis=1))
            block_starts.append(position + 1 - OVERLAP_RATIO)
            carry[:, :OVERLAP_RATIO] = carry[:, OVERLAP_RATIO:]
            reset_carry(carry[:, OVERLAP_RATIO:])
    return _stacked(snapshots, carry[..., :width]), np.asarray(block_starts, dtype=np.int64)


def _stacked(snapshots, template):
    """[B, records, slots, 2, W] of the carry snapshots taken at block ends."""
    if not snapshots:
        return np.zeros((template.shape[0], 0) + template.shape[1:], dtype=np.float32)
    return np.stack(snapshots, axis=1)


def stream(geometry, kv, gate, ape, past_carry, numerics: Numerics = REFERENCE):
    """Stream the step's positions through a copy of the carry; returns (candidates, block starts, carry).

    At start == 0 the reference resets the carry first, whatever it held.
    """
    carry = np.array(past_carry, dtype=np.float32)
    if geometry.start == 0:
        reset_carry(carry)
    ape_rows = (geometry.start + np.arange(geometry.sequence)) % ape.shape[0]
    with np.errstate(over="ignore"):
        scores = gate + ape[ape_rows]
    if geometry.ratio == OVERLAP_RATIO:
        candidates, block_starts = stream_overlap_compressor(carry, kv, scores, geometry.start,
                                                             numerics.overlap_boundary)
    else:
        candidates, block_starts = stream_block_compressor(carry, kv, scores, geometry.start, geometry.ratio)
    return candidates, block_starts, carry


def pool_and_finalize(candidates, block_starts, finalize: Callable, prefix: str, numerics: Numerics = REFERENCE):
    """Pool every record, then finalize; raise the reference's first failure in (batch, record) order."""
    values, scores = candidates[:, :, :, 0], candidates[:, :, :, 1]
    numerics.probe("pool_scores", scores)
    pooled, no_finite, invalid = softmax_pool(values, scores, numerics)
    numerics.probe("pooled", pooled)
    if not (no_finite | invalid).any():
        try:
            return finalize(pooled, block_starts[None, :])
        except ContractError:
            pass
    for b, record in np.ndindex(pooled.shape[:2]):
        message = pool_failure(no_finite[b, record], invalid[b, record], prefix)
        if message:
            raise ContractError(message)
        finalize(pooled[b, record], block_starts[record])
    return finalize(pooled, block_starts[None, :])
