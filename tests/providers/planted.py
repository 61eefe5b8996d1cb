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


class RmsNormWeightOff(NumpyOracle):
    """Compression whose RMSNorm weighs dimension 4 twice: probed, the first divergent sub-step is RMSNorm."""

    name = "planted-rmsnorm"

    def compression_update(self, geometry, compressor_kv, compressor_gate, compressor_ape, compressor_norm,
                           past_compressed_kv, past_compression_carry, probe=None):
        norm = compressor_norm.copy()
        norm[4] *= np.float32(2)
        return super().compression_update(geometry, compressor_kv, compressor_gate, compressor_ape, norm,
                                          past_compressed_kv, past_compression_carry, probe=probe)


class RmsNormWeightOffUnprobed(RmsNormWeightOff):
    """The same bug in a method that takes no ``probe``: its probed re-run shows nothing."""

    name = "planted-rmsnorm-unprobed"

    def compression_update(self, geometry, compressor_kv, compressor_gate, compressor_ape, compressor_norm,
                           past_compressed_kv, past_compression_carry):
        return super().compression_update(geometry, compressor_kv, compressor_gate, compressor_ape,
                                          compressor_norm, past_compressed_kv, past_compression_carry)


class ProbesAmiss(RmsNormWeightOff):
    """The RMSNorm bug, whose probed call shows RMSNorm without its batch axis, and a name compression has no
    probe of, a name that is no string and what is no array: each a defect, the other probes compared."""

    name = "probes-amiss"

    def compression_update(self, geometry, compressor_kv, compressor_gate, compressor_ape, compressor_norm,
                           past_compressed_kv, past_compression_carry, probe=None):
        def amiss(name, array):
            probe(name, array[0] if name == "rmsnorm" else array)

        payload = super().compression_update(geometry, compressor_kv, compressor_gate, compressor_ape,
                                             compressor_norm, past_compressed_kv, past_compression_carry,
                                             probe=None if probe is None else amiss)
        if probe is not None:
            probe("hadamard", payload["logical_records"])
            probe(7, payload["logical_records"])
            probe("softmax_max", object())
        return payload


class ProbingMovesBytes(RmsNormWeightOff):
    """The RMSNorm bug, whose probed call also flips a bit of its records: probes not to be trusted."""

    name = "probing-moves"

    def compression_update(self, geometry, compressor_kv, compressor_gate, compressor_ape, compressor_norm,
                           past_compressed_kv, past_compression_carry, probe=None):
        payload = super().compression_update(geometry, compressor_kv, compressor_gate, compressor_ape,
                                             compressor_norm, past_compressed_kv, past_compression_carry,
                                             probe=probe)
        if probe is None:
            return payload
        records = payload["logical_records"].copy()
        records.view(np.uint32).reshape(-1)[0] ^= 1
        return {**payload, "logical_records": records}
