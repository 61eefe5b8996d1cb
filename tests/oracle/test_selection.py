"""Selection's two routes (a value sort plus a partition for rows far longer than Kw, one argsort
otherwise) give what one stable argsort of every row gives, and refuse the same ties."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from csa_conform.errors import ContractError
from csa_conform.oracle import selection as stage


def _stable_top(scores, live, width):
    order = np.argsort(np.where(live, -scores, np.inf), axis=-1, kind="stable")[..., :width]
    return np.where(np.take_along_axis(live, order, axis=-1), order, -1).astype(np.int32)


def _geometry(width):
    return SimpleNamespace(batch=2, index_heads=3, topk_width=width)


@pytest.fixture(params=["whole", "row by row"])
def chunking(request, monkeypatch):
    """Selection in one chunk, or one query row per chunk over three workers (the rows' offsets show)."""
    from csa_conform.oracle.compiled import parallel

    if request.param == "row by row":
        monkeypatch.setattr(stage, "CHUNK_ELEMENTS", 1)
        monkeypatch.setattr(parallel, "worker_count", lambda: 3)


@pytest.mark.parametrize("records, width, partitioned", [
    (4096, 16, True), (4096, 512, False), (700, 512, False), (40, 8, False), (9, 9, False), (17, 1, True),
])
def test_both_routes_select_what_a_stable_sort_selects(records, width, partitioned, chunking):
    rng = np.random.default_rng(records + width)
    sequence = 6
    distinct = rng.permuted(np.broadcast_to(np.arange(records), (2, sequence, records)), axis=-1)
    scores = (distinct * np.float32(0.37) - np.float32(5)).astype(np.float32)
    reach = np.array([1, width // 2 + 1, width, width + 1, records - 1, records])
    live = np.arange(records)[None, None, :] < np.minimum(reach, records)[None, :, None]
    payload = stage.selection(_geometry(width), scores, live)
    expected = _stable_top(scores, live, width)
    assert payload["selected"].tobytes() == expected.tobytes()
    assert payload["selected_indices"].shape == (2, 3, sequence, width)
    assert (payload["selected_indices"] == expected[:, None]).all()
    assert np.shares_memory(payload["selected_indices"], payload["selected"])  # one copy, not one per index head
    assert (stage.PARTITION_FACTOR * width < records) == partitioned


@pytest.mark.parametrize("records", [4096, 64])
def test_both_routes_name_the_first_tied_pair(records, chunking):
    scores = np.arange(records, dtype=np.float32)[None, None, :].repeat(3, axis=1)
    scores[0, 2, 5] = scores[0, 2, 6]  # a later row's tie never wins
    scores[0, 1, records - 1] = scores[0, 1, 3]
    scores[0, 1, 7] = np.float32(-0.0)
    scores[0, 1, 0] = np.float32(0.0)
    live = np.ones(scores.shape, dtype=bool)
    with pytest.raises(ContractError, match=r"equal score 0 at \[batch=0, query=1\] for compressed records 0 and 7"):
        stage.selection(SimpleNamespace(batch=1, index_heads=1, topk_width=8), scores, live)


@pytest.mark.parametrize("key, expected", [
    (None, [3, 0, 1, 4, 2, -1]),  # the total order: 1.0, 0.5, -0.25, -1.0, -2.0
    ("sign-flipped", [3, 0, 2, 4, 1, -1]),  # positives first, the negatives by magnitude: -2.0 before -0.25
    ("raw-bits", [2, 4, 1, 3, 0, -1]),  # the negatives' set sign bit ranks them above every positive
])
def test_a_sort_key_variant_orders_the_negative_scores_its_way(key, expected):
    """The variants a radix top-k's key conversion makes, by hand on five scores (the sixth record not causal)."""
    scores = np.array([[[0.5, -0.25, -2.0, 1.0, -1.0, 3.0]]], np.float32)
    live = np.array([[[True] * 5 + [False]]])
    selected = stage.selection(_geometry(6), scores, live, key=key)["selected"]
    assert selected[0, 0].tolist() == expected
