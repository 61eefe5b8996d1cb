"""One stage of the oracle re-run on the inputs a device stage consumed (the isolated run's).

In an isolated run every kernel reads the oracle's upstream payloads, except
from stages computed earlier in its own fused launch (index select: stages
3-5; attention: 6-7), which it computes itself; UPSTREAM_IN_LAUNCH names
those, so the re-run reads the device's payload there.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from csa_conform.contract import StepGeometry, attention_bias
from csa_conform.errors import ContractError
from csa_conform.oracle.candidate_assembly import candidate_assembly
from csa_conform.oracle.compression_update import compression_update
from csa_conform.oracle.index_key_update import index_key_update
from csa_conform.oracle.index_query_finalize import index_query_finalize
from csa_conform.oracle.index_scoring import causal_mask, index_scoring
from csa_conform.oracle.selection import selection
from csa_conform.oracle.sparse_sink_softmax_attention import sparse_sink_softmax_attention

Payloads = Mapping[str, Mapping[str, np.ndarray]]

# stage -> the upstream stage it reads that the same fused launch computes on the device
UPSTREAM_IN_LAUNCH = {
    "index_scoring": "index_query_finalize",
    "selection": "index_scoring",
    "sparse_sink_softmax_attention": "candidate_assembly",
}

_SOURCES = {
    "compression_update": ("compressor_kv", "compressor_gate", "compressor_ape", "compressor_norm",
                           "past_compressed_kv", "past_compression_carry"),
    "index_key_update": ("index_compressor_kv", "index_compressor_gate", "index_compressor_ape",
                         "index_compressor_norm", "past_index_key", "past_index_carry"),
}


def _accepted(payload, failure):
    if failure is not None:
        raise ContractError(failure.message, failure.kind)
    return payload


def run_stage(stage: str, g: StepGeometry, inputs: Mapping[str, np.ndarray], upstream: Payloads) -> dict:
    """The stage's payload under the active numerics variant; raises ContractError as the oracle does."""
    if stage in _SOURCES:
        update = compression_update if stage == "compression_update" else index_key_update
        return update(g, *(inputs[name] for name in _SOURCES[stage]))
    if stage == "index_query_finalize":
        return _accepted(*index_query_finalize(g, inputs["index_query"]))
    if stage == "index_scoring":
        return _accepted(*index_scoring(g, upstream["index_query_finalize"]["transformed"],
                                        upstream["index_key_update"]["logical_keys"], inputs["index_weight"], None))
    if stage == "selection":
        scores = upstream["index_scoring"]["scores"]
        return selection(g, scores, causal_mask(g, scores.shape[-1], None))
    if stage == "candidate_assembly":
        return candidate_assembly(g, upstream["selection"]["selected"] if g.ratio == 4 else None)
    if stage == "sparse_sink_softmax_attention":
        bias = None
        if g.has_bias:
            bias = attention_bias(inputs["attention_bias"], (g.batch, g.heads, g.sequence, g.candidate_count))
        return sparse_sink_softmax_attention(
            g, inputs["query"], inputs["current_kv"], upstream["compression_update"]["logical_records"],
            upstream["candidate_assembly"]["candidates"], inputs["head_sink"], bias)
    raise KeyError(stage)


def consumed_upstream(stage: str, expected: Payloads, actual: Payloads) -> dict:
    """The upstream payloads the device stage read in an isolated run."""
    upstream = dict(expected)
    own = UPSTREAM_IN_LAUNCH.get(stage)
    if own is not None and own in actual:
        upstream[own] = actual[own]
    return upstream


def mismatches(payload: Mapping[str, np.ndarray], target: Mapping[str, np.ndarray]) -> tuple[int, int]:
    """(differing elements, elements) over the tensors both payloads hold, compared bit for bit."""
    differing = total = 0
    for name, array in target.items():
        mine = np.asarray(payload[name])
        array = np.asarray(array)
        total += array.size
        if mine.shape != array.shape or mine.dtype != array.dtype:
            differing += array.size
            continue
        width = array.dtype.itemsize
        view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
        differing += int(np.count_nonzero(mine.view(view) != array.view(view)))
    return differing, total
