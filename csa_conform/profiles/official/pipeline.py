"""The official profile's step: the reference's stages where the official numerics agree, its own where not.

Stages 1-3 (both compressors and index-query finalization) follow the same
rules in the official code as in the reference (binary32 pooling, bf16
records, RMSNorm, RoPE at the block start, fake FP8 / Hadamard + FP4); the
official code fixes neither their reduction order nor its libm, so the profile
takes the reference's implementation of them. Stage 4 (bf16 einsum scoring),
stage 5 (a fixed tie order instead of a rejection) and stage 7 (block-64 online
softmax) are the official numerics; 6 and 8 carry no arithmetic. A query-row
failure the reference would raise (a non-finite query or score) is raised here
too, at once, since the official profile has no tie rejection to order it
against.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from csa_conform.contract import StepGeometry, attention_bias, validate_step
from csa_conform.errors import ContractError
from csa_conform.oracle.candidate_assembly import candidate_assembly
from csa_conform.oracle.engine import Engine, resolve_engine
from csa_conform.oracle.index_scoring import causal_mask
from csa_conform.oracle.pipeline import StepResult
from csa_conform.oracle.rows import earliest
from csa_conform.profiles.official.attention import official_attention
from csa_conform.profiles.official.index_scoring import official_index_scoring
from csa_conform.profiles.official.selection import official_selection
from csa_conform.spec import fused

COMPRESSION = (
    "compressor_kv", "compressor_gate", "compressor_ape", "compressor_norm",
    "past_compressed_kv", "past_compression_carry",
)
INDEX_COMPRESSION = (
    "index_compressor_kv", "index_compressor_gate", "index_compressor_ape", "index_compressor_norm",
    "past_index_key", "past_index_carry",
)
# Operator output -> the stage payload it is written back from.
WRITEBACK = {
    "Y": "sparse_sink_softmax_attention",
    "present_compressed_kv": "compression_update",
    "present_compression_carry": "compression_update",
    "present_index_key": "index_key_update",
    "present_index_carry": "index_key_update",
    "selected_indices": "selection",
}


def run_official_step(
    attrs: Mapping,
    inputs: Mapping[str, np.ndarray],
    output_names: Sequence[str],
    engine: str | None = None,
    exp: str = "exact",
    upstream: Mapping[str, Mapping[str, np.ndarray]] | None = None,
) -> StepResult:
    """One step under the official numerics; ``engine`` picks the reference engine stages 1-3 run on.

    With ``upstream`` (the reference profile's payloads of the same step) every official stage reads
    the reference's payloads of the stages before it that another kernel launch computes, and its own
    of the stages its launch computes before it (csa_conform.spec.fused: selection its own scores), so
    each launch's difference is its own arithmetic's only: the isolated comparison of gap and calibrate
    measures what an isolated device run can show, where a fused launch cannot be fed in the middle.
    """
    kernels = resolve_engine(engine)
    geometry = validate_step(attrs, inputs, output_names)
    tensors = {name: np.ascontiguousarray(value) for name, value in inputs.items()}
    stages: dict[str, dict[str, np.ndarray]] = {}

    def source(stage: str, upstream_stage: str) -> Mapping[str, np.ndarray]:
        fed = upstream is None or fused(geometry.ratio, stage, upstream_stage)
        return (stages if fed else upstream)[upstream_stage]

    stages["compression_update"] = kernels.compression_update(geometry, *(tensors[n] for n in COMPRESSION))
    selected = None
    if geometry.ratio == 4:
        _index_path(geometry, tensors, kernels, stages, source)
        selected = source("candidate_assembly", "selection")["selected"]
    stages["candidate_assembly"] = candidate_assembly(geometry, selected)
    stages["sparse_sink_softmax_attention"] = official_attention(
        geometry,
        tensors["query"],
        tensors["current_kv"],
        source("sparse_sink_softmax_attention", "compression_update")["present_compressed_kv"],
        source("sparse_sink_softmax_attention", "candidate_assembly")["candidates"],
        tensors["head_sink"],
        _bias(geometry, tensors),
        exp,
    )
    stages["writeback"] = {name: stages[WRITEBACK[name]][name] for name in geometry.output_names}
    return StepResult(outputs=stages["writeback"], stages=stages)


def _index_path(geometry: StepGeometry, tensors, kernels: Engine, stages, source) -> None:
    stages["index_key_update"] = kernels.index_key_update(geometry, *(tensors[n] for n in INDEX_COMPRESSION))
    queries, query_failure = kernels.index_query_finalize(geometry, tensors["index_query"])
    stages["index_query_finalize"] = queries
    row_limit = query_failure.row if query_failure else None
    scores, score_failure = official_index_scoring(
        geometry, source("index_scoring", "index_query_finalize")["transformed"],
        source("index_scoring", "index_key_update")["logical_keys"], tensors["index_weight"], row_limit,
    )
    stages["index_scoring"] = scores
    failure = earliest(query_failure, score_failure)
    if failure is not None:
        raise ContractError(failure.message, failure.kind)
    live = causal_mask(geometry, scores["scores"].shape[-1], None)
    stages["selection"] = official_selection(geometry, source("selection", "index_scoring")["scores"], live)


def _bias(geometry: StepGeometry, tensors) -> np.ndarray | None:
    if not geometry.has_bias:
        return None
    shape = (geometry.batch, geometry.heads, geometry.sequence, geometry.candidate_count)
    return attention_bias(tensors["attention_bias"], shape)
