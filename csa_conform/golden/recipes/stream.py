"""Streams of steps as a runtime feeds them: prefill, then decodes, state fed back.

A recipe describes only what is new at each step (queries, compressor rows,
index rows, a bias); ``play`` assembles full operator inputs the way a
runtime would — the cursors from the stream position, ``current_kv`` as the
last Kc rows of the case's kv history ending at T-1, every ``past_*`` from
the previous step's ``present_*`` — and runs the oracle step by step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from csa_conform.contract import INPUT_NAMES
from csa_conform.errors import ContractError, FixtureError, TopKTie
from csa_conform.golden import GoldenCase, GoldenStep
from csa_conform.numerics.records import FP4_RECORD_BYTES, FP8_RECORD_BYTES, HEAD_DIM, INDEX_DIM
from csa_conform.spec import DECODED_PAYLOADS, STATE_THREADING

# present_* output -> the past_* input it becomes at the next step.
STATE = STATE_THREADING

RATIO4_OUTPUTS_5 = (
    "Y",
    "present_compressed_kv",
    "present_compression_carry",
    "present_index_key",
    "present_index_carry",
)
RATIO4_OUTPUTS_6 = RATIO4_OUTPUTS_5 + ("selected_indices",)
RATIO128_OUTPUTS = RATIO4_OUTPUTS_5[:3]

Runner = Callable[[Mapping, Mapping[str, np.ndarray], list], object]


@dataclass
class StepPlan:
    """What is new at one step.

    ``fresh`` holds the per-token inputs (query, compressor rows, index rows,
    attention_bias). ``kv_window`` is Kc (None: the whole history up to T).
    ``replace`` substitutes assembled inputs after the fact — a crafted carry,
    a poisoned tensor, a wrong cursor — and a ``None`` value removes one.
    """

    start: int
    fresh: dict[str, np.ndarray]
    kv_window: int | None = None
    replace: dict[str, np.ndarray | None] = field(default_factory=dict)
    expect_error: bool = False

    @property
    def sequence(self) -> int:
        return int(self.fresh["query"].shape[1])

    @property
    def total(self) -> int:
        return self.start + self.sequence


@dataclass
class StreamPlan:
    """A whole case: node attributes, shared constants, kv history, initial state and steps.

    ``kv_history`` row 0 is position ``history_origin``: a stream resumed at a
    million tokens holds only the rows its kv windows reach (a golden file
    then stores each step's current_kv itself). Without ``decoded_payloads``
    its steps leave out the payloads that only decode a stored cache
    (``DECODED_PAYLOADS``), which readers restore.
    """

    attrs: dict
    output_names: tuple[str, ...]
    constants: dict[str, np.ndarray]
    kv_history: np.ndarray
    initial_state: dict[str, np.ndarray]
    steps: list[StepPlan]
    history_origin: int = 0
    decoded_payloads: bool = True


def initial_carry(batch: int, slots: int, width: int) -> np.ndarray:
    """The reset carry: kv 0, score -inf (what the reference writes when it resets)."""
    carry = np.zeros((batch, slots, 2, width), dtype=np.float32)
    carry[:, :, 1, :] = -np.inf
    return carry


def stale_carries(state: Mapping[str, np.ndarray], kv: float, first_row: int = 0) -> dict[str, np.ndarray]:
    """``state`` with every carry stale from batch row ``first_row`` on: kv ``kv`` and score 0 in every slot.

    What a runtime that reuses its state buffers sends at a new sequence's
    position 0, where the contract clears the carry first: the outputs are
    the cleared carry's, while a kernel that skips the clear pools the stale
    slots into its first ratio-4 record and hands them on in its present
    carry. Constant, it costs the file a few hundred bytes.
    """
    stale = dict(state)
    for name, carry in state.items():
        if name.endswith("_carry"):
            stale[name] = carry.copy()
            stale[name][first_row:, :, 0, :] = np.float32(kv)
            stale[name][first_row:, :, 1, :] = np.float32(0.0)
    return stale


def empty_state(attrs: Mapping, batch: int) -> dict[str, np.ndarray]:
    """past_* inputs of a stream that starts at position 0: no records, reset carries."""
    ratio = attrs["compression_ratio"]
    packed = attrs.get("cache_format", "f32") != "f32"
    cache = (
        np.zeros((batch, 0, FP8_RECORD_BYTES), dtype=np.uint8)
        if packed
        else np.zeros((batch, 0, HEAD_DIM), dtype=np.float32)
    )
    if ratio == 128:
        return {
            "past_compressed_kv": cache,
            "past_compression_carry": initial_carry(batch, 128, HEAD_DIM),
        }
    return {
        "past_compressed_kv": cache,
        "past_compression_carry": initial_carry(batch, 8, 2 * HEAD_DIM),
        "past_index_key": np.zeros((batch, 0, FP4_RECORD_BYTES), dtype=np.uint8),
        "past_index_carry": initial_carry(batch, 8, 2 * INDEX_DIM),
    }


def assemble(plan: StreamPlan, step: StepPlan, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Full operator inputs of one step, in positional order."""
    batch = plan.kv_history.shape[0]
    total = step.total
    window = total if step.kv_window is None else step.kv_window
    origin = plan.history_origin
    if window > total or total - window < origin or total > origin + plan.kv_history.shape[1]:
        raise FixtureError(
            f"kv window {window} / total {total} exceeds the kv history of positions "
            f"{origin}..{origin + plan.kv_history.shape[1]}"
        )
    inputs = dict(plan.constants)
    inputs.update(state)
    inputs.update(step.fresh)
    inputs["current_kv"] = np.ascontiguousarray(plan.kv_history[:, total - window - origin : total - origin])
    inputs["seqlens_k"] = np.full(batch, total - 1, dtype=np.int32)
    inputs["total_sequence_length"] = np.array(total, dtype=np.int64)
    for name, value in step.replace.items():
        if value is None:
            inputs.pop(name, None)
        else:
            inputs[name] = value
    return {name: inputs[name] for name in INPUT_NAMES if name in inputs}


def play(plan: StreamPlan, run_step: Runner, case_id: str = "") -> list[GoldenStep]:
    """Run every step through the oracle, feeding each step's present_* forward.

    A runner whose ``rejects_ties`` is false (the official profile orders tied
    index scores rather than refusing them) stores a step the recipe meant the
    reference to reject, if it accepts it, with its outputs.
    """
    state = dict(plan.initial_state)
    steps = []
    for index, step in enumerate(plan.steps):
        if step.expect_error and index != len(plan.steps) - 1:
            raise FixtureError(f"{case_id}: only the last step of a stream may be rejected", case_id)
        inputs = assemble(plan, step, state)
        try:
            result = run_step(plan.attrs, inputs, list(plan.output_names))
        except ContractError as rejection:
            if not step.expect_error:
                kind = TopKTie if TIE_MESSAGE in str(rejection) else FixtureError
                raise kind(f"{case_id} step {index}: oracle rejected the step: {rejection}", case_id) from None
            steps.append(GoldenStep(inputs=inputs, expect_error=str(rejection)))
            break
        if step.expect_error and getattr(run_step, "rejects_ties", True):
            message = f"{case_id} step {index}: the oracle accepted a step meant to be rejected"
            raise FixtureError(message, case_id)
        steps.append(GoldenStep(inputs=inputs, outputs=dict(result.outputs), stages=stored_stages(plan, result.stages)))
        state.update({STATE[name]: value for name, value in result.outputs.items() if name in STATE})
    return steps


def stored_stages(plan: StreamPlan, stages: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
    """The stage payloads a golden step keeps: all of them, or all but the decoded caches."""
    if plan.decoded_payloads:
        return dict(stages)
    return {
        stage: {tensor: array for tensor, array in payload.items() if (stage, tensor) not in DECODED_PAYLOADS}
        for stage, payload in stages.items()
    }


# A draw whose index scores tie exactly is redrawn this many times at most.
MAX_REDRAWS = 8
TIE_MESSAGE = "top-k tie ordering is unfrozen"


@dataclass(frozen=True)
class Recipe:
    """A named, seeded, documented case.

    ``build(seed)`` is a picklable plan factory. Random draws whose index scores
    tie exactly (FP4 lattices make that likely with one index head) are not
    what a random case means to test, so with ``redraw_ties`` the case moves to
    seed+1, seed+2, ... and records the seed it finally used. ``weight`` is
    the rough work of making the case, relative to the suite's others
    (generate --jobs starts the heaviest first; the file's order is the ids').
    """

    case_id: str
    family: str
    seed: int | None
    description: str
    build: Callable[[int | None], StreamPlan]
    redraw_ties: bool = False
    weight: float = 1.0

    def generate(self, run_step: Runner, replay: Runner | None = None) -> GoldenCase:
        """The case under ``run_step`` (the reference oracle); with ``replay`` (another numerics
        profile) the same draw is played again under it, so both profiles' files hold the same inputs."""
        attempt = 0
        while True:
            seed = None if self.seed is None else self.seed + attempt
            plan = self.build(seed)
            try:
                steps = play(plan, run_step, self.case_id)
                break
            except TopKTie:
                attempt += 1
                if not self.redraw_ties or attempt == MAX_REDRAWS:
                    raise
        if replay is not None:
            steps = play(plan, replay, self.case_id)
        return GoldenCase(
            case_id=self.case_id,
            attrs=dict(plan.attrs),
            output_names=tuple(plan.output_names),
            steps=steps,
            family=self.family,
            seed=seed,
            description=self.description,
            kv_history=plan.kv_history if plan.history_origin == 0 else None,
        )


def base_attrs(ratio: int, heads: int, *, cache_format: str | None = None, **extra) -> dict:
    """Node attributes as the reference corpus writes them (all frozen values explicit)."""
    attrs = {
        "num_heads": heads,
        "head_dim": HEAD_DIM,
        "qk_rope_head_dim": 64,
        "compression_ratio": ratio,
        "causal": 1,
        "cache_layout_version": 1,
        "index_layout_version": 1,
        "cache_format": cache_format or ("fp8_e4m3_block64" if ratio == 4 else "f32"),
    }
    attrs.update(extra)
    return attrs
