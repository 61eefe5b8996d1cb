"""Providers the tests plant bugs in: the NumPy example with one stage changed, or with parts missing."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "providers"))
from numpy_oracle import NumpyOracle  # noqa: E402


class ScoresOneUlpHigh(NumpyOracle):
    """Index scoring whose first finite score of every row is one ULP high: caught at stage 4."""

    name = "planted-score"

    def index_scoring(self, geometry, transformed, present_index_key, index_weight):
        payload = super().index_scoring(geometry, transformed, present_index_key, index_weight)
        scores = payload["scores"].copy()
        finite = np.isfinite(scores)
        first = finite & (np.cumsum(finite, axis=-1) == 1)
        scores.view(np.uint32)[first] += 1
        return {"scores": scores}


class AttentionOnly(NumpyOracle):
    """Only stage 7 provided: every other stage runs on the host oracle."""

    name = "attention-only"
    compression_update = index_key_update = index_query_finalize = index_scoring = None
    selection = candidate_assembly = writeback = None


class FusedIndexSelect(AttentionOnly):
    """Stages 3-5 as one call, as the built-in index-select launch computes them."""

    name = "fused-index-select"

    def index_select(self, geometry, index_query, index_weight, present_index_key):
        query = NumpyOracle.index_query_finalize(self, geometry, index_query)
        scores = NumpyOracle.index_scoring(self, geometry, query["transformed"], present_index_key, index_weight)
        return {**query, **scores, **NumpyOracle.selection(self, geometry, scores["scores"])}


class FlakyAttention(NumpyOracle):
    """Every other call of attention writes a different Y: caught by --repeat, not by a plain run's first call."""

    name = "flaky"
    calls = 0

    def sparse_sink_softmax_attention(self, geometry, query, current_kv, head_sink, attention_bias,
                                      present_compressed_kv, candidates):
        payload = super().sparse_sink_softmax_attention(geometry, query, current_kv, head_sink, attention_bias,
                                                        present_compressed_kv, candidates)
        FlakyAttention.calls += 1
        if FlakyAttention.calls % 2 == 0:
            payload = {**payload, "Y": payload["Y"] + np.float32(1)}
        return payload


class Raising(NumpyOracle):
    name = "raising"

    def selection(self, geometry, scores):
        raise RuntimeError("out of shared memory")


class Undeclared:
    name = "no-version"
    device = "cpu"

    def selection(self, scores):
        return {}


class BatchVariantAttention(NumpyOracle):
    """Attention one ULP off in Y whenever the batch holds more than one row: only --invariance batch sees it."""

    name = "batch-variant"

    def sparse_sink_softmax_attention(self, geometry, query, current_kv, head_sink, attention_bias,
                                      present_compressed_kv, candidates):
        payload = super().sparse_sink_softmax_attention(geometry, query, current_kv, head_sink, attention_bias,
                                                        present_compressed_kv, candidates)
        if geometry.batch > 1:
            y = payload["Y"].copy()
            y.view(np.uint32)[..., 0] += 1
            payload = {**payload, "Y": y}
        return payload
