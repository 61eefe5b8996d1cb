"""The node's positional schema: canonical input/output names, arity and presence.

The reference addresses inputs by position; the harness names them, so the name
order here is the ABI. The factory checks this schema before reading any attribute.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from csa_conform.contract.messages import HARNESS
from csa_conform.errors import ContractError, invalid, unsupported

INPUT_NAMES = (
    # 0..10: required by every v1 node
    "query", "current_kv", "compressor_kv", "compressor_gate", "compressor_ape",
    "compressor_norm", "past_compressed_kv", "past_compression_carry", "seqlens_k",
    "total_sequence_length", "head_sink",
    # 11..18: the ratio-4 indexer, required there and refused by ratio 128
    "index_query", "index_weight", "index_compressor_kv", "index_compressor_gate",
    "index_compressor_ape", "index_compressor_norm", "past_index_key", "past_index_carry",
    # 19: optional additive bias
    "attention_bias",
)
OUTPUT_NAMES = (
    "Y", "present_compressed_kv", "present_compression_carry",
    # ratio 4 only; selected_indices is optional
    "present_index_key", "present_index_carry", "selected_indices",
)

REQUIRED_INPUTS = 11
REQUIRED_OUTPUTS = 3
INDEX_INPUTS = range(11, 19)
BIAS_INPUT = 19


def validate_frozen_schema(present: Sequence[bool], output_count: int) -> None:
    if not REQUIRED_INPUTS <= len(present) <= len(INPUT_NAMES):
        raise invalid(f"frozen v1 requires 11..=20 positional inputs, got {len(present)}")
    if not REQUIRED_OUTPUTS <= output_count <= len(OUTPUT_NAMES):
        raise invalid(f"frozen v1 requires 3..=6 outputs, got {output_count}")
    for index in range(REQUIRED_INPUTS):
        if not present[index]:
            raise invalid(f"required frozen-v1 input {index} ('{INPUT_NAMES[index]}') is omitted")


def validate_ratio_schema(ratio: int, present: Sequence[bool], output_count: int) -> None:
    index_present = [index < len(present) and present[index] for index in INDEX_INPUTS]
    if ratio == 4:
        if not all(index_present):
            raise invalid("ratio-4 requires all eight positional index inputs (11..=18)")
        if output_count not in (5, 6):
            raise invalid(f"ratio-4 requires 5 or 6 outputs, got {output_count}")
    else:
        if any(index_present):
            raise unsupported(
                "ratio-4-only inputs (11..=18) are not supported by the ratio-128 stateful path"
            )
        if output_count != REQUIRED_OUTPUTS:
            raise unsupported(f"ratio-128 supports exactly 3 outputs, got {output_count}")


def positional_inputs(inputs: Mapping[str, np.ndarray]) -> list:
    """Inputs by position up to the highest present one; ``None`` marks an omitted input."""
    unknown = sorted(set(inputs) - set(INPUT_NAMES))
    if unknown:
        raise ContractError(
            f"{HARNESS}: unknown input name(s) {unknown}; "
            f"inputs must be named from {list(INPUT_NAMES)}"
        )
    arrays = [
        None if inputs.get(name) is None else np.asarray(inputs[name]) for name in INPUT_NAMES
    ]
    present = [index for index, array in enumerate(arrays) if array is not None]
    return arrays[: present[-1] + 1] if present else []


def checked_output_names(output_names: Sequence[str]) -> tuple[str, ...]:
    names = tuple(output_names)
    if names != OUTPUT_NAMES[: len(names)]:
        raise ContractError(
            f"{HARNESS}: output_names must be a prefix of {list(OUTPUT_NAMES)} in that order, "
            f"got {list(names)}"
        )
    return names
