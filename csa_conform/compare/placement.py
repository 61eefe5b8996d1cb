"""Where mismatches sit and how large they are, small enough to travel in a results document.

``mismatch_heatmap`` counts differing elements over two axes of a tensor
(query × head for Y, record × byte for packed records, row × k for
selections), pooled into at most MAX_BINS bins per axis, for the heatmaps of
``report --html``; ``log2_histogram`` counts ULP distances (or any positive
errors) in powers of two.
"""

from __future__ import annotations

import numpy as np

MAX_BINS = 48


def heatmap_axes(axes: tuple[str, ...], dtype: np.dtype) -> tuple[int, int] | None:
    """The two axes a heatmap spans: a float tensor's last two before d, else its last two."""
    ndim = len(axes)
    if ndim < 2:
        return None
    if np.dtype(dtype).kind == "f" and axes[-1] == "d" and ndim >= 3:
        return ndim - 3, ndim - 2
    return ndim - 2, ndim - 1


def mismatch_heatmap(differ: np.ndarray, axes: tuple[str, ...], dtype) -> dict | None:
    """Counts of ``differ`` summed over every other axis, pooled to at most MAX_BINS per axis."""
    spans = heatmap_axes(tuple(axes), dtype)
    if spans is None or differ.size == 0:
        return None
    rows_axis, cols_axis = spans
    others = tuple(axis for axis in range(differ.ndim) if axis not in spans)
    counts = differ.sum(axis=others) if others else differ.astype(np.int64)
    extent = counts.shape
    bins = tuple(min(MAX_BINS, size) for size in extent)
    pooled = np.zeros(bins, dtype=np.int64)
    row_bin = np.arange(extent[0]) * bins[0] // extent[0]
    col_bin = np.arange(extent[1]) * bins[1] // extent[1]
    np.add.at(pooled, (row_bin[:, None], col_bin[None, :]), counts)
    return {"axes": [axes[rows_axis], axes[cols_axis]], "extent": list(extent), "bins": list(bins),
            "counts": pooled.tolist()}


def log2_histogram(values: np.ndarray) -> dict:
    """Counts of zero and of positive values v with 2^k <= v < 2^(k+1), k from the smallest present."""
    values = np.asarray(values, dtype=np.float64).ravel()
    zero = int(np.count_nonzero(values == 0))
    positive = values[values > 0]
    if positive.size == 0:
        return {"zero": zero, "first_power": 0, "counts": []}
    powers = np.floor(np.log2(positive)).astype(np.int64)
    first = int(powers.min())
    counts = np.bincount(powers - first)
    return {"zero": zero, "first_power": first, "counts": counts.tolist()}
