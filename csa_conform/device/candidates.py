"""The device's stage-6 payload, read off the fused attention kernel's score scratch.

Candidate ids are not a kernel output: the attention modules assemble and
score candidates in one launch (stages 6 and 7). A slot is one the kernel
attended to where some head's score is not -inf, and its id is the dense
position or the record id the kernel dereferenced, so a wrong candidate shows
up at stage 6 rather than only as a different Y.
"""

from __future__ import annotations

import numpy as np

from csa_conform.contract import DENSE_WINDOW, StepGeometry
from csa_conform.oracle.candidate_assembly import candidate_assembly


def candidates_read_back(
    g: StepGeometry, scores: np.ndarray, selection_rows: np.ndarray | None, bias: np.ndarray | None
) -> np.ndarray:
    """Candidate ids i32[B,S,C] from scores f32[B,S,N,C] and the selection the kernel read (ratio 4).

    Where the bias is -inf on every head a slot's validity cannot be observed
    in the scores, so there it is taken from the cursors.
    """
    positions = g.start + np.arange(g.sequence)
    dense_start = np.maximum(g.current_kv_base, np.maximum(positions + 1 - DENSE_WINDOW, 0))
    dense = dense_start[:, None] + np.arange(g.dense_candidates)[None, :]
    if selection_rows is None:
        compressed = np.broadcast_to(np.arange(g.next_records), (g.sequence, g.next_records))
        ids = np.broadcast_to(np.concatenate([dense, compressed], axis=-1), scores.shape[:2] + (scores.shape[3],))
    else:
        ids = np.concatenate([np.broadcast_to(dense, (g.batch,) + dense.shape), selection_rows], axis=-1)
    valid = (scores != -np.inf).any(axis=2)
    if bias is not None:
        structural = candidate_assembly(g, selection_rows)["candidates"] >= 0
        valid |= (bias == -np.inf).all(axis=1) & structural
    return np.where(valid, ids, -1).astype(np.int32)
