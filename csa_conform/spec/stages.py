"""The eight pipeline stages as plain data: what each reads and writes, and what it is made of.

A ``Stage`` holds no code. The oracle registers a function for every stage
(csa_conform.oracle.stage_functions); the device plan and its host fallbacks
(csa_conform.device.plan / step), the state a stream threads from step to
step, the names ``--stage`` accepts, the axis names a diff prints, the
ingredients ``explain`` swaps and the table of specs/stage-payloads.md all
derive from ``PIPELINE``. The kernel launches that compute the stages are
csa_conform.spec.launches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping

from csa_conform.numerics.variant import ACCUMULATE, LOGIT_ACCUMULATE, PAIR_FUSIONS, VALUE_ACCUMULATE

# What a stage reads when it reads the stream's state (past_* inputs) rather than an earlier stage.
PAST_STATE = "past_state"


class Role(Enum):
    """What a stage does with its inputs: computes new values (float or integer arithmetic), assembles
    indices from upstream ones, or writes the operator outputs back from earlier payloads."""

    COMPUTE = "compute"
    ASSEMBLE = "assemble"
    WRITEBACK = "writeback"


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
    """One pipeline stage: where it sits, what it reads and writes, what its arithmetic contains.

    ``reads`` are upstream stages (or PAST_STATE), ``inputs`` the operator
    inputs it reads (the compressors' in the order their kernels take them);
    ``outputs`` the operator outputs its payload carries (writeback copies
    them) and ``state`` the present_* -> past_* pairs a stream threads into
    its next step. ``engine_slot`` names the oracle engine's function for
    the stage's hot loops (None: shared NumPy code); ``libm`` and
    ``fusions`` are the ingredients ``explain`` may swap in it.
    """

    number: int
    name: str
    short: str
    ratios: tuple[int, ...]
    reads: tuple[str, ...]
    writes: tuple[Payload, ...]
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    state: Mapping[str, str] = field(default_factory=dict)
    role: Role = Role.COMPUTE
    engine_slot: str | None = None
    libm: tuple[str, ...] = ()
    fusions: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """The column header of a diff table, and one spelling --stage accepts."""
        return f"{self.number}:{self.short}"

    def payload(self, tensor: str) -> Payload | None:
        return next((payload for payload in self.writes if payload.tensor == tensor), None)


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

# --- the registry ---------------------------------------------------------------------------

BOTH = (4, 128)
RATIO4 = (4,)

PIPELINE: tuple[Stage, ...] = (
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
        inputs=COMPRESSOR_INPUTS["compression_update"], engine_slot="compression_update",
        libm=("expf", "powf", "sinf", "cosf", "log2f"), fusions=(ACCUMULATE, *PAIR_FUSIONS),
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
        inputs=COMPRESSOR_INPUTS["index_key_update"], engine_slot="index_key_update",
        libm=("expf", "powf", "sinf", "cosf", "log2f"), fusions=(ACCUMULATE, *PAIR_FUSIONS),
        outputs=("present_index_key", "present_index_carry"),
        state={"present_index_key": "past_index_key", "present_index_carry": "past_index_carry"},
    ),
    Stage(
        3, "index_query_finalize", "query", RATIO4, (),
        (Payload("transformed", "f32", "[B, S, I, 128]", ("b", "s", "i", "d"),
                 "bf16 → RoPE → Hadamard → FP4 round trip of each index query"),),
        inputs=("index_query",), engine_slot="index_query_finalize",
        libm=("powf", "sinf", "cosf", "log2f"), fusions=PAIR_FUSIONS,
    ),
    Stage(
        4, "index_scoring", "score", RATIO4, ("index_query_finalize", "index_key_update"),
        (Payload("scores", "f32", "[B, S, T/4]", ("b", "s", "c"),
                 "Σ_h relu(q·k)·w·(1/√128/√I); -inf where record ≥ (pos+1)/4"),),
        inputs=("index_weight",), engine_slot="index_scoring", fusions=(ACCUMULATE,),
    ),
    Stage(
        5, "selection", "select", RATIO4, ("index_scoring",),
        (
            Payload("selected", "i32", "[B, S, Kw]", ("b", "s", "k"),
                    "shared top-Kw records, descending score, -1 padded"),
            Payload("selected_indices", "i32", "[B, I, S, Kw]", ("b", "i", "s", "k"),
                    "the operator output: `selected` repeated for every index head"),
        ),
        outputs=("selected_indices",),
    ),
    Stage(
        6, "candidate_assembly", "candidates", BOTH, ("selection",),
        (Payload("candidates", "i32", "[B, S, C]", ("b", "s", "c"),
                 "dense slots: absolute token position; compressed slots: record index; -1 invalid. "
                 "C = dense_candidates + (Kw or T/128)"),),
        role=Role.ASSEMBLE,
    ),
    Stage(
        7, "sparse_sink_softmax_attention", "attention", BOTH, ("compression_update", "candidate_assembly"),
        (
            Payload("scores", "f32", "[B, S, N, C]", ("b", "s", "h", "c"),
                    "q·kv·scale (+ bias) per candidate; -inf where invalid"),
            Payload("Y", "f32", "[B, S, N, 512]", ("b", "s", "h", "d"), "attention output before writeback"),
        ),
        inputs=("query", "current_kv", "head_sink", "attention_bias"),
        engine_slot="sparse_sink_softmax_attention", libm=("expf",),
        fusions=(ACCUMULATE, VALUE_ACCUMULATE, LOGIT_ACCUMULATE),
        outputs=("Y",),
    ),
    Stage(
        8, "writeback", "writeback", BOTH,
        ("compression_update", "index_key_update", "selection", "sparse_sink_softmax_attention"),
        (),
        role=Role.WRITEBACK,
    ),
)

# --- derived views --------------------------------------------------------------------------

STAGE_NAMES: tuple[str, ...] = tuple(stage.name for stage in PIPELINE)
BY_NAME: dict[str, Stage] = {stage.name: stage for stage in PIPELINE}
WRITEBACK: Stage = next(stage for stage in PIPELINE if stage.role is Role.WRITEBACK)

# Operator output -> (stage, tensor) it is written back from.
WRITEBACK_SOURCES: dict[str, tuple[str, str]] = {
    output: (stage.name, output) for stage in PIPELINE for output in stage.outputs
}

# present_* output -> the past_* input it becomes in the next step of a stream.
class Mode(str, Enum):
    """What feeds a device stage: chained, this run's own upstream payloads (production: a stream threads
    its present_* into the next step's past_*); isolated, the oracle's payloads and past_* inputs, so a
    divergence shows at the stage that makes it."""

    CHAINED = "chained"
    ISOLATED = "isolated"


STATE_THREADING: dict[str, str] = {present: past for stage in PIPELINE for present, past in stage.state.items()}

# Payloads that only decode a cache their stage also stores: (stage, tensor) -> that cache. A
# golden step may leave them out (the long suite does: at 2^20 tokens the decoded records are
# 512 MiB a step) and a reader restores them from the stored cache (specs/stage-payloads.md).
DECODED_PAYLOADS: dict[tuple[str, str], str] = {
    ("compression_update", "logical_records"): "present_compressed_kv",
    ("index_key_update", "logical_keys"): "present_index_key",
}

# Stages whose float arithmetic a fused multiply-add can change.
FLOAT_STAGES: tuple[str, ...] = tuple(stage.name for stage in PIPELINE if stage.fusions)


def stages_for_ratio(ratio: int) -> tuple[Stage, ...]:
    return tuple(stage for stage in PIPELINE if ratio in stage.ratios)


def stage_spellings(stage: Stage) -> tuple[str, ...]:
    """Every spelling of a stage --stage accepts: name, short name, number, number:short."""
    return (stage.name, stage.short, str(stage.number), stage.label)


def resolve_stage(spelling: str) -> Stage | None:
    text = spelling.strip()
    return next((stage for stage in PIPELINE if text in stage_spellings(stage)), None)
