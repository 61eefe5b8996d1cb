"""Stage 5 under the official numerics: top-Kw with a fixed tie order.

The official code calls torch's topk (largest first, sorted), whose order
among equal scores is unspecified; bf16 scores tie often. This profile fixes
it: descending score, equal scores (+0 and -0 are equal) in ascending record
index. Non-causal records never count, so a row with fewer causal records than
Kw is padded with -1 as in the reference. Ties are not an error here.
"""

from __future__ import annotations

import numpy as np

from csa_conform.contract import StepGeometry


def official_selection(geometry: StepGeometry, scores: np.ndarray, live: np.ndarray) -> dict[str, np.ndarray]:
    width = geometry.topk_width
    with np.errstate(invalid="ignore"):
        keys = np.where(live, -scores, np.inf)
    order = np.argsort(keys, axis=-1, kind="stable")[..., :width]
    chosen = np.take_along_axis(live, order, axis=-1)
    selected = np.where(chosen, order, -1).astype(np.int32)
    replicated = np.broadcast_to(selected[:, None], (geometry.batch, geometry.index_heads) + selected.shape[1:])
    return {"selected": selected, "selected_indices": np.ascontiguousarray(replicated)}
