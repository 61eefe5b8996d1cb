"""The claim-time gate: whether the reference would take a node, from metadata alone.

A runtime asks before any tensor exists, so the gate sees shapes (with dynamic
extents) and dtypes; it creates the kernel as the factory would, then applies
the reference's fixed claim contract for the ratio and the optional bias.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from csa_conform.contract.attributes import create_kernel, is_int
from csa_conform.contract.messages import debug_dim, debug_dims, debug_shape, dtype_name
from csa_conform.contract.schema import (
    BIAS_INPUT,
    INPUT_NAMES,
    OUTPUT_NAMES,
    REQUIRED_INPUTS,
    REQUIRED_OUTPUTS,
    positional_inputs,
)
from csa_conform.errors import ContractError, operator_message
from csa_conform.numerics.records import FP4_RECORD_BYTES, FP8_RECORD_BYTES, HEAD_DIM

# Claim axis rules: ANY, NONZERO, an int (that fixed extent) or (input, axis) (same extent).
ANY, NONZERO = "any", "nonzero"


class _ClaimDenied(Exception):
    """A claim-gate reason, before the operator prefix is added."""


def _claim_dtype_rule(index: int, cache_dtype: str) -> str:
    return {6: cache_dtype, 8: "Int32", 9: "Int64", 17: "Uint8"}.get(index, "Float32")


def _ratio4_claim_shapes(heads: int, index_heads: int) -> tuple:
    batch, sequence = (0, 0), (0, 1)
    return (
        (0, (ANY, NONZERO, heads, 512)),
        (1, (batch, ANY, 512)),
        (2, (batch, sequence, 1024)),
        (3, (batch, sequence, 1024)),
        (4, (4, 1024)),
        (5, (512,)),
        (6, (batch, ANY, FP8_RECORD_BYTES)),
        (7, (batch, 8, 2, 1024)),
        (8, (batch,)),
        (9, ()),
        (10, (heads,)),
        (11, (batch, sequence, index_heads, 128)),
        (12, (batch, sequence, index_heads)),
        (13, (batch, sequence, 256)),
        (14, (batch, sequence, 256)),
        (15, (4, 256)),
        (16, (128,)),
        (17, (batch, ANY, FP4_RECORD_BYTES)),
        (18, (batch, 8, 2, 256)),
    )


def _ratio128_claim_shapes(heads: int, stored: int) -> tuple:
    batch, sequence = (0, 0), (0, 1)
    return (
        (0, (ANY, NONZERO, heads, 512)),
        (1, (batch, ANY, 512)),
        (2, (batch, sequence, 512)),
        (3, (batch, sequence, 512)),
        (4, (128, 512)),
        (5, (512,)),
        (6, (batch, ANY, stored)),
        (7, (batch, 128, 2, 512)),
        (8, (batch,)),
        (9, ()),
        (10, (heads,)),
    )


def _claim_dtype(dtypes: Sequence, index: int, expected: str) -> None:
    got = dtype_name(dtypes[index])
    if got != expected:
        raise _ClaimDenied(
            f"input {index} ('{INPUT_NAMES[index]}') dtype {got} unsupported; expected {expected}"
        )


def _claim_axis_mismatch(rule, got, shapes: Sequence) -> str | None:
    if rule == ANY:
        return None
    if rule == NONZERO:
        return "must be nonzero" if got == 0 else None
    expected = rule if isinstance(rule, int) else shapes[rule[0]][rule[1]]
    if got is None or expected is None or got == expected:
        return None
    return f"is {got}; expected {expected}"


def _claim_shape(shapes: Sequence, index: int, contract: tuple) -> None:
    shape, name = shapes[index], INPUT_NAMES[index]
    if len(shape) != len(contract):
        raise _ClaimDenied(
            f"input {index} ('{name}') rank {len(shape)} unsupported; expected {len(contract)}"
        )
    for axis, rule in enumerate(contract):
        mismatch = _claim_axis_mismatch(rule, shape[axis], shapes)
        if mismatch:
            raise _ClaimDenied(f"input {index} ('{name}') axis {axis} {mismatch}")


def _claim_int(attrs: Mapping, name: str) -> int:
    value = attrs.get(name)
    if not is_int(value) or value < 0:
        raise _ClaimDenied(f"missing or invalid integer attribute '{name}'")
    return int(value)


def _fixed_claim_contract(attrs: Mapping, ratio: int) -> None:
    if _claim_int(attrs, "head_dim") != HEAD_DIM:
        raise _ClaimDenied(f"ratio-{ratio} requires head_dim={HEAD_DIM}")
    if attrs.get("qk_rope_head_dim", 0) != 64:
        raise _ClaimDenied(f"ratio-{ratio} requires qk_rope_head_dim=64")


def _ratio4_claim(attrs: Mapping, shapes: Sequence, dtypes: Sequence, cache_format: str) -> None:
    if attrs.get("index_head_dim") != 128:
        raise _ClaimDenied("ratio-4 requires index_head_dim=128")
    if cache_format != "fp8_e4m3_block64":
        raise _ClaimDenied(
            f"ratio-4 requires cache_format='fp8_e4m3_block64', got '{cache_format}'"
        )
    _fixed_claim_contract(attrs, 4)
    for index in range(19):
        _claim_dtype(dtypes, index, _claim_dtype_rule(index, "Uint8"))
    heads, index_heads = _claim_int(attrs, "num_heads"), _claim_int(attrs, "index_num_heads")
    for index, contract in _ratio4_claim_shapes(heads, index_heads):
        _claim_shape(shapes, index, contract)


def _ratio128_claim(attrs: Mapping, shapes: Sequence, dtypes: Sequence, cache_format: str) -> None:
    if cache_format == "fp4_e2m1_block32":
        raise _ClaimDenied(
            "ratio-128 attention-compressor state uses f32 or hybrid FP8/BF16 records, "
            "not FP4"
        )
    _fixed_claim_contract(attrs, 128)
    cache_dtype = "Float32" if cache_format == "f32" else "Uint8"
    for index in range(REQUIRED_INPUTS):
        _claim_dtype(dtypes, index, _claim_dtype_rule(index, cache_dtype))
    heads = _claim_int(attrs, "num_heads")
    stored = HEAD_DIM if cache_format == "f32" else FP8_RECORD_BYTES
    for index, contract in _ratio128_claim_shapes(heads, stored):
        _claim_shape(shapes, index, contract)


def _bias_byte_count_fits(shape) -> bool:
    """usize element product then x4 bytes, overflow-checked step by step, <= isize::MAX."""
    count = 1
    for extent in shape:
        count *= extent
        if count >= 2**64:
            return False
    return count * 4 <= 2**63 - 1


def _attention_bias_claim(attrs: Mapping, shapes: Sequence, dtypes: Sequence) -> None:
    if len(shapes) <= BIAS_INPUT or shapes[BIAS_INPUT] is None:
        return
    _claim_dtype(dtypes, BIAS_INPUT, "Float32")
    bias = shapes[BIAS_INPUT]
    prefix = "input 19 ('attention_bias')"
    if len(bias) > 4:
        raise _ClaimDenied(f"{prefix} rank {len(bias)} unsupported; expected rank <= 4")
    if None not in bias and not _bias_byte_count_fits(bias):
        raise _ClaimDenied(
            f"{prefix} byte count overflow or exceeds isize::MAX for shape {debug_shape(bias)}"
        )
    heads = _claim_int(attrs, "num_heads")
    query = shapes[0]
    target = (query[0], heads, query[1], None)[4 - len(bias):]
    for got, goal in zip(bias, target):
        if got is not None and got != 1 and goal is not None and got != goal:
            raise _ClaimDenied(
                f"{prefix} shape {debug_dims(bias)} is not broadcastable to attention scores "
                f"[{debug_dim(query[0])}, {heads}, {debug_dim(query[1])}, ?]"
            )


def _default_output_count(attrs: Mapping) -> int:
    return len(OUTPUT_NAMES) if attrs.get("compression_ratio") == 4 else REQUIRED_OUTPUTS


def unsupported_reason(
    attrs: Mapping,
    shapes: Sequence,
    dtypes: Sequence,
    output_names: Sequence[str] | None = None,
) -> str | None:
    """The claim-time gate: ``None`` when the reference would take the node, else its reason.

    ``shapes`` has one entry per positional input (``None`` for an omitted one;
    ``None`` inside a shape is a dynamic extent) and ``dtypes`` should match it.
    ``output_names`` defaults to every output the node's ratio can have.
    """
    output_count = _default_output_count(attrs) if output_names is None else len(output_names)
    try:
        kernel = create_kernel(attrs, [shape is not None for shape in shapes], output_count)
    except ContractError as denied:
        return str(denied)
    if len(dtypes) != len(shapes):
        return operator_message(f"claim metadata must cover all {len(shapes)} positional inputs "
                                f"(got {len(shapes)} shapes and {len(dtypes)} dtypes)")
    ratio_claim = _ratio4_claim if kernel.ratio == 4 else _ratio128_claim
    try:
        ratio_claim(attrs, shapes, dtypes, kernel.cache_format)
        _attention_bias_claim(attrs, shapes, dtypes)
    except _ClaimDenied as denied:
        return operator_message(str(denied))
    return None


def claim_metadata(inputs: Mapping[str, np.ndarray]) -> tuple[list, list]:
    """Positional (shapes, dtypes) of concrete inputs, as a runtime hands them to the gate."""
    arrays = positional_inputs(inputs)
    shapes = [None if array is None else tuple(array.shape) for array in arrays]
    dtypes = [None if array is None else array.dtype for array in arrays]
    return shapes, dtypes
