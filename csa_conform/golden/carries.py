"""The carries a step from position 0 never reads, which a golden file may omit (specs/golden-file.md).

The contract clears a compressor's carry before a step that starts at
position 0 (specs/contract.md, stage 1), so such a step's past carries are not
inputs of the step: a reduced golden file leaves them out, and a reader hands
out the cleared carry in their place, so every consumer sees the full inputs.
"""

from __future__ import annotations

import numpy as np

from csa_conform.oracle.compressor import reset_carry

# Each carry and the step input whose [B, S, width] shape gives its batch and width.
CARRY_WIDTH_SOURCE = {"past_compression_carry": "compressor_kv", "past_index_carry": "index_compressor_kv"}
OVERLAP_RATIO = 4
OVERLAP_SLOTS = 8
BLOCK_RATIO = 128


def carry_slots(name: str, ratio: int) -> int:
    return OVERLAP_SLOTS if name == "past_index_carry" or ratio == OVERLAP_RATIO else BLOCK_RATIO


def carries_of(attrs: dict) -> tuple[str, ...]:
    """The carries the contract requires of a case with these node attributes (none for an unknown ratio)."""
    ratio = attrs.get("compression_ratio")
    if ratio == OVERLAP_RATIO:
        return tuple(CARRY_WIDTH_SOURCE)
    return ("past_compression_carry",) if ratio == BLOCK_RATIO else ()


def cleared_carry(shape: tuple[int, ...]) -> np.ndarray:
    """A [B, slots, 2, width] carry as the contract clears it: kv (channel 0) 0, score (channel 1) -inf."""
    carry = np.empty(shape, dtype=np.float32)
    reset_carry(carry)
    return carry


def cleared_shape(name: str, ratio: int, source_shape: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """[B, slots, 2, width] of an omitted carry, from its width source's [B, S, width] (None if not that rank)."""
    if len(source_shape) != 3:
        return None
    return (source_shape[0], carry_slots(name, ratio), 2, source_shape[2])


def omitted_carries(attrs: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The cleared carries of a position-0 step whose stored inputs lack them."""
    ratio = attrs.get("compression_ratio")
    supplied = {}
    for name in carries_of(attrs):
        source = inputs.get(CARRY_WIDTH_SOURCE[name])
        shape = None if source is None else cleared_shape(name, ratio, source.shape)
        if name not in inputs and shape is not None:
            supplied[name] = cleared_carry(shape)
    return supplied


def step_start(inputs: dict[str, np.ndarray]) -> int:
    """The step's first position, total_sequence_length - S."""
    return int(inputs["total_sequence_length"]) - int(inputs["query"].shape[1])
