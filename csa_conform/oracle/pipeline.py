"""The eight stages composed as the reference runs them.

Ratio 4: compress the main stream, then the index stream, then finalize
queries, score and select (row by row, so the earliest row's failure wins),
then build the bias, assemble candidates and attend. Ratio 128 skips stages
2-5. The reference rejects a step at its first failure, so stages run in that
order and a ContractError stops the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from csa_conform.contract import StepGeometry, attention_bias, validate_step
from csa_conform.oracle.candidate_assembly import candidate_assembly
from csa_conform.oracle.compression_update import compression_update
from csa_conform.oracle.engine import Engine, resolve_engine
from csa_conform.oracle.index_key_update import index_key_update
from csa_conform.oracle.index_query_finalize import index_query_finalize
from csa_conform.oracle.index_scoring import causal_mask
from csa_conform.oracle.selection import selection

STAGES = (
    "compression_update",
    "index_key_update",
    "index_query_finalize",
    "index_scoring",
    "selection",
    "candidate_assembly",
    "sparse_sink_softmax_attention",
    "writeback",
)
RATIO4_ONLY_STAGES = STAGES[1:5]


@dataclass
class StepResult:
    """Operator outputs and the boundary payload of every stage that ran."""

    outputs: dict[str, np.ndarray]
    stages: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


def run_step(
    attrs: Mapping, inputs: Mapping[str, np.ndarray], output_names: Sequence[str], engine: str | None = None
) -> StepResult:
    """One step; `engine` is numpy, numba or auto (default: $CSA_CONFORM_ENGINE, else auto)."""
    kernels = resolve_engine(engine)
    geometry = validate_step(attrs, inputs, output_names)
    tensors = {name: _as_stored(value) for name, value in inputs.items()}
    stages: dict[str, dict[str, np.ndarray]] = {}
    stages["compression_update"] = compression_update(
        geometry,
        *(tensors[name] for name in (
            "compressor_kv", "compressor_gate", "compressor_ape", "compressor_norm",
            "past_compressed_kv", "past_compression_carry",
        )),
    )
    selected = None
    if geometry.ratio == 4:
        stages.update(_select_records(geometry, tensors, kernels))
        selected = stages["selection"]["selected"]
    bias = None
    if geometry.has_bias:
        target = (geometry.batch, geometry.heads, geometry.sequence, geometry.candidate_count)
        bias = attention_bias(tensors["attention_bias"], target)
    stages["candidate_assembly"] = candidate_assembly(geometry, selected)
    stages["sparse_sink_softmax_attention"] = kernels.sparse_sink_softmax_attention(
        geometry,
        tensors["query"],
        tensors["current_kv"],
        stages["compression_update"]["logical_records"],
        stages["candidate_assembly"]["candidates"],
        tensors["head_sink"],
        bias,
    )
    outputs = _writeback(geometry, stages)
    stages["writeback"] = outputs
    return StepResult(outputs=outputs, stages=stages)


def _select_records(geometry: StepGeometry, tensors, kernels: Engine) -> dict[str, dict[str, np.ndarray]]:
    keys = index_key_update(
        geometry,
        *(tensors[name] for name in (
            "index_compressor_kv", "index_compressor_gate", "index_compressor_ape",
            "index_compressor_norm", "past_index_key", "past_index_carry",
        )),
    )
    queries, query_failure = index_query_finalize(geometry, tensors["index_query"])
    row_limit = query_failure.row if query_failure else None
    scoring, score_failure = kernels.index_scoring(
        geometry, queries["transformed"], keys["logical_keys"], tensors["index_weight"], row_limit
    )
    live = causal_mask(geometry, scoring["scores"].shape[-1], row_limit)
    chosen = selection(geometry, scoring["scores"], live, query_failure, score_failure)
    return {
        "index_key_update": keys,
        "index_query_finalize": queries,
        "index_scoring": scoring,
        "selection": chosen,
    }


def _writeback(geometry: StepGeometry, stages) -> dict[str, np.ndarray]:
    compression = stages["compression_update"]
    produced = {
        "Y": stages["sparse_sink_softmax_attention"]["Y"],
        "present_compressed_kv": compression["present_compressed_kv"],
        "present_compression_carry": compression["present_compression_carry"],
    }
    if geometry.ratio == 4:
        produced["present_index_key"] = stages["index_key_update"]["present_index_key"]
        produced["present_index_carry"] = stages["index_key_update"]["present_index_carry"]
        produced["selected_indices"] = stages["selection"]["selected_indices"]
    return {name: produced[name] for name in geometry.output_names}


def _as_stored(value) -> np.ndarray:
    """C-contiguous in the tensor's own dtype; stages never write to their inputs."""
    return np.ascontiguousarray(value)
