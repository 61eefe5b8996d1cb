"""The pipeline, declared once: the eight stages and the kernel launches that compute them.

Everything that walks the pipeline derives from ``STAGES`` and ``LAUNCHES``:
the oracle's ``run_step`` (csa_conform.oracle.pipeline), the device plan and
its host fallbacks (csa_conform.device.modes / step), the state a stream
threads from step to step, the names ``--stage`` accepts, the axis names a
diff prints and the table of specs/stage-payloads.md. Adding a stage is one
``Stage`` entry plus its oracle module; adding a kernel module is one
``Launch`` entry plus its read-back function in csa_conform.device.launches.

A stage's ``oracle`` is a small adapter: it takes the stage's inputs and
upstream payloads from a ``StageInputs`` (the oracle's own run, or a device
run's host fallback) and calls the stage function. The ratio-4 selection path
reports row failures rather than raising them, because the reference checks
query rows in order and an early row's failure wins whichever stage it is in
(csa_conform.oracle.rows); ``StageInputs.row_failure`` decides whether a
failure is deferred (the oracle) or raised at once (a host fallback).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

import numpy as np

from csa_conform.contract import StepGeometry, attention_bias
from csa_conform.numerics.records import decode_fp4_record, decode_fp8_record
from csa_conform.oracle.candidate_assembly import candidate_assembly
from csa_conform.oracle.engine import Engine
from csa_conform.oracle.index_scoring import causal_mask
from csa_conform.oracle.rows import RowFailure
from csa_conform.oracle.selection import selection

# What a stage reads when it reads the stream's state (past_* inputs) rather than an earlier stage.
PAST_STATE = "past_state"


class StageInputs(Protocol):
    """What a stage's oracle adapter reads: inputs, earlier payloads, earlier row failures, and the
    oracle engine whose stage functions run the hot loops."""

    geometry: StepGeometry
    engine: Engine

    def input(self, name: str) -> np.ndarray: ...

    def upstream(self, stage: str, tensor: str) -> np.ndarray: ...

    def row_failure(self, stage: str, failure: RowFailure | None) -> None: ...

    def prior_failure(self, stage: str) -> RowFailure | None: ...


@dataclass(frozen=True)
class Payload:
    """One boundary tensor of a stage, as specs/stage-payloads.md documents it."""

    tensor: str
    dtype: str
    shape: str
    axes: tuple[str, ...]
    meaning: str


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: where it sits, what it reads and writes, and its oracle."""

    number: int
    name: str
    short: str
    ratios: tuple[int, ...]
    reads: tuple[str, ...]
    writes: tuple[Payload, ...]
    oracle: Callable[[StageInputs], dict[str, np.ndarray]]
    # operator outputs this stage's payload carries (writeback copies them), and the
    # present_* -> past_* pairs a stream threads into its next step
    outputs: tuple[str, ...] = ()
    state: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The column header of a diff table, and one spelling --stage accepts."""
        return f"{self.number}:{self.short}"

    def payload(self, tensor: str) -> Payload | None:
        return next((payload for payload in self.writes if payload.tensor == tensor), None)


@dataclass(frozen=True)
class Launch:
    """One kernel module of a device step: its entry, the stages it computes, its read-back.

    ``read_back`` names the function in csa_conform.device.launches that sets
    the launch up and reads its buffers back into stage payloads.
    """

    module: str
    entry: str
    ratio: int
    stages: tuple[str, ...]
    read_back: str


# --- oracle adapters ------------------------------------------------------------------------

# The new rows a compressor stage folds into its stream (kv, gate, ape, norm), then its past cache and carry.
COMPRESSOR_INPUTS = {
    "compression_update": (
        "compressor_kv", "compressor_gate", "compressor_ape", "compressor_norm",
        "past_compressed_kv", "past_compression_carry",
    ),
    "index_key_update": (
        "index_compressor_kv", "index_compressor_gate", "index_compressor_ape", "index_compressor_norm",
        "past_index_key", "past_index_carry",
    ),
}


def _compress(run: StageInputs) -> dict:
    inputs = (run.input(name) for name in COMPRESSOR_INPUTS["compression_update"])
    return run.engine.compression_update(run.geometry, *inputs)


def _index_keys(run: StageInputs) -> dict:
    inputs = (run.input(name) for name in COMPRESSOR_INPUTS["index_key_update"])
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
    )


def _assemble_candidates(run: StageInputs) -> dict:
    selected = run.upstream("selection", "selected") if run.geometry.ratio == 4 else None
    return candidate_assembly(run.geometry, selected)


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


# --- the registry ---------------------------------------------------------------------------

BOTH = (4, 128)
RATIO4 = (4,)

STAGES: tuple[Stage, ...] = (
    Stage(
        1, "compression_update", "compress", BOTH, (PAST_STATE,),
        (
            Payload("present_compressed_kv", "u8 / f32", "[B, T/R, 583] / [B, T/R, 512]", ("b", "r", "d"),
                    "the persistent cache after the step (hybrid FP8/BF16 records, or f32)"),
            Payload("present_compression_carry", "f32", "[B, 128, 2, 512] / [B, 8, 2, 1024]",
                    ("b", "slot", "ch", "d"), "kv (channel 0) and score (channel 1) of every carry slot"),
            Payload("logical_records", "f32", "[B, T/R, 512]", ("b", "r", "d"),
                    "every record as attention reads it (dequantized)"),
        ),
        _compress,
        outputs=("present_compressed_kv", "present_compression_carry"),
        state={"present_compressed_kv": "past_compressed_kv", "present_compression_carry": "past_compression_carry"},
    ),
    Stage(
        2, "index_key_update", "index-key", RATIO4, (PAST_STATE,),
        (
            Payload("present_index_key", "u8", "[B, T/4, 68]", ("b", "r", "byte"),
                    "FP4 E2M1 block-32 index keys"),
            Payload("present_index_carry", "f32", "[B, 8, 2, 256]", ("b", "slot", "ch", "d"),
                    "the index compressor's carry"),
            Payload("logical_keys", "f32", "[B, T/4, 128]", ("b", "r", "d"),
                    "every index key as scoring reads it (dequantized)"),
        ),
        _index_keys,
        outputs=("present_index_key", "present_index_carry"),
        state={"present_index_key": "past_index_key", "present_index_carry": "past_index_carry"},
    ),
    Stage(
        3, "index_query_finalize", "query", RATIO4, (),
        (Payload("transformed", "f32", "[B, S, I, 128]", ("b", "s", "i", "d"),
                 "bf16 → RoPE → Hadamard → FP4 round trip of each index query"),),
        _finalize_queries,
    ),
    Stage(
        4, "index_scoring", "score", RATIO4, ("index_query_finalize", "index_key_update"),
        (Payload("scores", "f32", "[B, S, T/4]", ("b", "s", "c"),
                 "Σ_h relu(q·k)·w·(1/√128/√I); -inf where record ≥ (pos+1)/4"),),
        _score,
    ),
    Stage(
        5, "selection", "select", RATIO4, ("index_scoring",),
        (
            Payload("selected", "i32", "[B, S, Kw]", ("b", "s", "k"),
                    "shared top-Kw records, descending score, -1 padded"),
            Payload("selected_indices", "i32", "[B, I, S, Kw]", ("b", "i", "s", "k"),
                    "the operator output: `selected` repeated for every index head"),
        ),
        _select,
        outputs=("selected_indices",),
    ),
    Stage(
        6, "candidate_assembly", "candidates", BOTH, ("selection",),
        (Payload("candidates", "i32", "[B, S, C]", ("b", "s", "c"),
                 "dense slots: absolute token position; compressed slots: record index; -1 invalid. "
                 "C = dense_candidates + (Kw or T/128)"),),
        _assemble_candidates,
    ),
    Stage(
        7, "sparse_sink_softmax_attention", "attention", BOTH, ("compression_update", "candidate_assembly"),
        (
            Payload("scores", "f32", "[B, S, N, C]", ("b", "s", "h", "c"),
                    "q·kv·scale (+ bias) per candidate; -inf where invalid"),
            Payload("Y", "f32", "[B, S, N, 512]", ("b", "s", "h", "d"), "attention output before writeback"),
        ),
        _attend,
        outputs=("Y",),
    ),
    Stage(
        8, "writeback", "writeback", BOTH,
        ("compression_update", "index_key_update", "selection", "sparse_sink_softmax_attention"),
        (),
        _write_back,
    ),
)

# Device launches in pipeline order (the CUDA seed's dispatch). Kernels fuse stages: index
# select computes stages 3-5, attention stages 6-7; replicate fans stage 5's selection out.
LAUNCHES: tuple[Launch, ...] = (
    Launch("csa_ratio128_compression", "csa_ratio128_compress", 128, ("compression_update",), "compress"),
    Launch("csa_ratio128_attention", "csa_ratio128_sink_attention", 128,
           ("candidate_assembly", "sparse_sink_softmax_attention"), "attend"),
    Launch("csa_ratio4_main_compression", "csa_ratio4_main_compress", 4, ("compression_update",), "compress"),
    Launch("csa_ratio4_index_compression", "csa_ratio4_index_compress", 4, ("index_key_update",), "compress"),
    Launch("csa_ratio4_index_select", "csa_ratio4_index_select", 4,
           ("index_query_finalize", "index_scoring", "selection"), "index_select"),
    Launch("csa_ratio4_index_replicate", "csa_ratio4_index_replicate", 4, ("selection",), "replicate"),
    Launch("csa_ratio4_attention", "csa_ratio4_sink_attention", 4,
           ("candidate_assembly", "sparse_sink_softmax_attention"), "attend"),
)

# Operator inputs and outputs: axis names of the tensors that are not stage payloads.
OPERATOR_AXES = {
    "query": ("b", "s", "h", "d"),
    "current_kv": ("b", "k", "d"),
    "compressor_kv": ("b", "s", "d"),
    "compressor_gate": ("b", "s", "d"),
    "compressor_ape": ("slot", "d"),
    "compressor_norm": ("d",),
    "past_compressed_kv": ("b", "r", "d"),
    "past_compression_carry": ("b", "slot", "ch", "d"),
    "seqlens_k": ("b",),
    "total_sequence_length": (),
    "head_sink": ("h",),
    "index_query": ("b", "s", "i", "d"),
    "index_weight": ("b", "s", "i"),
    "index_compressor_kv": ("b", "s", "d"),
    "index_compressor_gate": ("b", "s", "d"),
    "index_compressor_ape": ("slot", "d"),
    "index_compressor_norm": ("d",),
    "past_index_key": ("b", "r", "byte"),
    "past_index_carry": ("b", "slot", "ch", "d"),
    "attention_bias": ("b", "h", "s", "c"),
    "Y": ("b", "s", "h", "d"),
    "present_compressed_kv": ("b", "r", "d"),
    "present_compression_carry": ("b", "slot", "ch", "d"),
    "present_index_key": ("b", "r", "byte"),
    "present_index_carry": ("b", "slot", "ch", "d"),
    "selected_indices": ("b", "i", "s", "k"),
}

# --- derived views --------------------------------------------------------------------------

STAGE_NAMES: tuple[str, ...] = tuple(stage.name for stage in STAGES)
BY_NAME: dict[str, Stage] = {stage.name: stage for stage in STAGES}

# Operator output -> (stage, tensor) it is written back from.
WRITEBACK_SOURCES: dict[str, tuple[str, str]] = {
    output: (stage.name, output) for stage in STAGES for output in stage.outputs
}

# present_* output -> the past_* input it becomes in the next step of a stream.
STATE_THREADING: dict[str, str] = {present: past for stage in STAGES for present, past in stage.state.items()}

# Payloads that only decode a cache their stage also stores: (stage, tensor) -> that cache. A
# golden step may leave them out (the long suite does: at 2^20 tokens the decoded records are
# 512 MiB a step) and a reader restores them from the stored cache (specs/stage-payloads.md).
DECODED_PAYLOADS: dict[tuple[str, str], str] = {
    ("compression_update", "logical_records"): "present_compressed_kv",
    ("index_key_update", "logical_keys"): "present_index_key",
}


def decoded_payload(stage: str, cache: np.ndarray) -> np.ndarray:
    """The logical rows of a stored cache: FP8 hybrid or FP4 records decoded, an f32 cache as it is."""
    if stage == "index_key_update":
        return decode_fp4_record(cache)
    return decode_fp8_record(cache) if cache.dtype == np.uint8 else cache.copy()


def stages_for_ratio(ratio: int) -> tuple[Stage, ...]:
    return tuple(stage for stage in STAGES if ratio in stage.ratios)


def launches_for_ratio(ratio: int) -> tuple[Launch, ...]:
    return tuple(launch for launch in LAUNCHES if launch.ratio == ratio)


def kernel_modules() -> dict[str, str]:
    """Module file stem -> extern "C" entry, the ABI a kernel directory provides."""
    return {launch.module: launch.entry for launch in LAUNCHES}


def stage_spellings(stage: Stage) -> tuple[str, ...]:
    """Every spelling of a stage --stage accepts: name, short name, number, number:short."""
    return (stage.name, stage.short, str(stage.number), stage.label)


def resolve_stage(spelling: str) -> Stage | None:
    text = spelling.strip()
    return next((stage for stage in STAGES if text in stage_spellings(stage)), None)


def payload_axes(stage: str, tensor: str) -> tuple[str, ...] | None:
    """Axis names of a stage payload or operator tensor; None when the registry does not know it."""
    owner = BY_NAME.get(stage)
    payload = owner.payload(tensor) if owner is not None else None
    return payload.axes if payload is not None else OPERATOR_AXES.get(tensor)


def payload_table() -> str:
    """The markdown table of specs/stage-payloads.md, rows in pipeline order."""
    lines = ["| stage | tensor | dtype | shape | meaning |", "|---|---|---|---|---|"]
    for stage in STAGES:
        for payload in stage.writes:
            lines.append(f"| {stage.name} | {payload.tensor} | {payload.dtype} | {payload.shape} | {payload.meaning} |")
        if stage.name == "writeback":
            lines.append("| writeback | *every operator output* | as output | as output | exactly what the operator returns |")
    return "\n".join(lines)


__all__ = [
    "BY_NAME", "COMPRESSOR_INPUTS", "DECODED_PAYLOADS", "LAUNCHES", "OPERATOR_AXES", "PAST_STATE", "STAGES", "STAGE_NAMES",
    "STATE_THREADING", "WRITEBACK_SOURCES", "Launch", "Payload", "Stage", "StageInputs", "decoded_payload", "kernel_modules",
    "launches_for_ratio", "payload_axes", "payload_table", "resolve_stage", "stage_spellings", "stages_for_ratio",
]
