"""The oracle's function for every stage of the pipeline spec, registered against csa_conform.spec.

A stage function is a small adapter: it takes the stage's inputs and
upstream payloads from a ``StageInputs`` (the oracle's own run, a device
run's host fallback, or explain's re-run of one stage) and calls the stage
module. The ratio-4 selection path reports row failures rather than raising
them, because the reference checks query rows in order and an early row's
failure wins whichever stage it is in (csa_conform.oracle.rows);
``StageInputs.row_failure`` decides whether a failure is deferred (the
oracle) or raised at once (a host fallback).
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from csa_conform.contract import StepGeometry, attention_bias
from csa_conform.oracle.candidate_assembly import candidate_assembly
from csa_conform.oracle.engine import Engine
from csa_conform.oracle.index_scoring import causal_mask
from csa_conform.oracle.rows import RowFailure
from csa_conform.oracle.selection import selection
from csa_conform.spec import BY_NAME, STAGE_NAMES, WRITEBACK_SOURCES


class StageInputs(Protocol):
    """What a stage's oracle adapter reads: inputs, earlier payloads, earlier row failures, and the
    oracle engine whose stage functions run the hot loops."""

    geometry: StepGeometry
    engine: Engine

    def input(self, name: str) -> np.ndarray: ...

    def upstream(self, stage: str, tensor: str) -> np.ndarray: ...

    def row_failure(self, stage: str, failure: RowFailure | None) -> None: ...

    def prior_failure(self, stage: str) -> RowFailure | None: ...


StageFunction = Callable[[StageInputs], dict[str, np.ndarray]]


def _compress(run: StageInputs) -> dict:
    inputs = (run.input(name) for name in BY_NAME["compression_update"].inputs)
    return run.engine.compression_update(run.geometry, *inputs)


def _index_keys(run: StageInputs) -> dict:
    inputs = (run.input(name) for name in BY_NAME["index_key_update"].inputs)
    return run.engine.index_key_update(run.geometry, *inputs)


def _finalize_queries(run: StageInputs) -> dict:
    payload, failure = run.engine.index_query_finalize(run.geometry, run.input("index_query"))
    run.row_failure("index_query_finalize", failure)
    return payload


def _row_limit(run: StageInputs) -> int | None:
    """Rows from the first failing query row on are never scored (the reference stopped there)."""
    failure = run.prior_failure("index_query_finalize")
    return failure.row if failure else None


def _score(run: StageInputs) -> dict:
    payload, failure = run.engine.index_scoring(
        run.geometry,
        run.upstream("index_query_finalize", "transformed"),
        run.upstream("index_key_update", "present_index_key"),
        run.input("index_weight"),
        _row_limit(run),
    )
    run.row_failure("index_scoring", failure)
    return payload


def _select(run: StageInputs) -> dict:
    scores = run.upstream("index_scoring", "scores")
    live = causal_mask(run.geometry, scores.shape[-1], _row_limit(run))
    return selection(
        run.geometry, scores, live,
        run.prior_failure("index_query_finalize"), run.prior_failure("index_scoring"),
        pad=run.engine.numerics.selection_pad, over_cache=run.engine.numerics.selection_over_cache,
        key=run.engine.numerics.selection_key,
    )


def _assemble_candidates(run: StageInputs) -> dict:
    selected = run.upstream("selection", "selected") if run.geometry.ratio == 4 else None
    numerics = run.engine.numerics
    return candidate_assembly(run.geometry, selected, numerics.dense_extra, numerics.from_step_start,
                              numerics.dense_strict)


def _attend(run: StageInputs) -> dict:
    g = run.geometry
    bias = None
    if g.has_bias:
        bias = attention_bias(run.input("attention_bias"), (g.batch, g.heads, g.sequence, g.candidate_count))
    return run.engine.sparse_sink_softmax_attention(
        g,
        run.input("query"),
        run.input("current_kv"),
        run.upstream("compression_update", "present_compressed_kv"),
        run.upstream("candidate_assembly", "candidates"),
        run.input("head_sink"),
        bias,
    )


def _write_back(run: StageInputs) -> dict:
    return {name: run.upstream(*WRITEBACK_SOURCES[name]) for name in run.geometry.output_names}


STAGE_FUNCTIONS: dict[str, StageFunction] = {
    "compression_update": _compress,
    "index_key_update": _index_keys,
    "index_query_finalize": _finalize_queries,
    "index_scoring": _score,
    "selection": _select,
    "candidate_assembly": _assemble_candidates,
    "sparse_sink_softmax_attention": _attend,
    "writeback": _write_back,
}
if tuple(STAGE_FUNCTIONS) != STAGE_NAMES:
    raise ImportError("csa_conform.oracle.stage_functions must register one function per spec stage, in order")
