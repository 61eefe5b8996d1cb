"""The ratio-128 execute path: f32 or hybrid FP8 attention records, no indexer.

Its checks run in the reference's ratio-128 order, which differs from ratio 4's.
"""

from __future__ import annotations

from csa_conform.contract import execute
from csa_conform.contract.attributes import Kernel, stored_record_width
from csa_conform.contract.geometry import StepGeometry, step_geometry
from csa_conform.contract.messages import debug_shape
from csa_conform.contract.schema import INPUT_NAMES
from csa_conform.errors import invalid, unsupported

_RATIO128_FLOAT_INPUTS = (0, 1, 2, 3, 4, 5, 7, 10)
_RATIO128_FINITE_INPUTS = (0, 1, 2, 3, 4, 5, 10)


def _ratio128_query(kernel: Kernel, arrays: list) -> tuple[int, int, int, int]:
    batch, sequence, heads, dim = execute.require_rank("query", arrays[0], 4)
    execute.require_frozen_dims(128, dim, kernel)
    if heads != kernel.num_heads or dim != kernel.head_dim:
        raise invalid(
            f"query must end in [num_heads={kernel.num_heads}, head_dim={kernel.head_dim}], "
            f"got [{heads}, {dim}]"
        )
    if sequence == 0:
        raise invalid("query sequence length must be positive")
    return batch, sequence, heads, dim


def _ratio128_sources(arrays: list, batch: int, sequence: int, dim: int) -> None:
    current_kv = execute.require_rank("current_kv", arrays[1], 3)
    compressor_kv = execute.require_rank("compressor_kv", arrays[2], 3)
    compressor_gate = execute.require_rank("compressor_gate", arrays[3], 3)
    if (
        current_kv[0] != batch
        or current_kv[2] != dim
        or compressor_kv != (batch, sequence, dim)
        or compressor_gate != (batch, sequence, dim)
    ):
        raise invalid(
            "current/compressor tensors must have current_kv=[B,K,D] and "
            "compressor_kv/gate=[B,S,D]; "
            f"got {debug_shape(current_kv)}, {debug_shape(compressor_kv)}, "
            f"{debug_shape(compressor_gate)}"
        )


def _ratio128_state_shapes(arrays: list, batch: int, heads: int, dim: int) -> None:
    if arrays[4].shape != (128, dim):
        raise invalid(
            f"compressor_ape must have shape [128, {dim}], got {debug_shape(arrays[4].shape)}"
        )
    if arrays[5].shape != (dim,):
        raise invalid(
            f"compressor_norm must have shape [{dim}], got {debug_shape(arrays[5].shape)}"
        )
    if arrays[7].shape != (batch, 128, 2, dim):
        raise invalid(
            f"past_compression_carry must have shape [B,128,2,D]=[{batch},128,2,{dim}], "
            f"got {debug_shape(arrays[7].shape)}"
        )
    if arrays[8].shape != (batch,):
        raise invalid(f"seqlens_k must have shape [{batch}], got {debug_shape(arrays[8].shape)}")
    if arrays[9].shape != ():
        raise invalid(
            f"total_sequence_length must be a scalar, got {debug_shape(arrays[9].shape)}"
        )
    execute.require_sink_shape(arrays, heads)


def _ratio128_past_width(kernel: Kernel, arrays: list, batch: int, start: int, dim: int) -> int:
    stored = stored_record_width(kernel.cache_format, dim, kernel.rope_dim)
    past = start // 128
    if execute.require_rank("past_compressed_kv", arrays[6], 3) != (batch, past, stored):
        raise invalid(
            f"past_compressed_kv must have shape [{batch},{past},{stored}] at start position "
            f"{start}, got {debug_shape(arrays[6].shape)}"
        )
    return stored


def execute_ratio128(kernel: Kernel, arrays: list, outputs: tuple[str, ...]) -> StepGeometry:
    if kernel.cache_format == "fp4_e2m1_block32":
        raise unsupported(
            "ratio-128 attention-compressor state uses hybrid FP8/BF16 records, not FP4"
        )
    cache_dtype = "Float32" if kernel.cache_format == "f32" else "Uint8"
    execute.require_dtypes(
        arrays, _RATIO128_FLOAT_INPUTS, ((6, cache_dtype), (8, "Int32"), (9, "Int64"))
    )
    batch, sequence, heads, dim = _ratio128_query(kernel, arrays)
    _ratio128_sources(arrays, batch, sequence, dim)
    _ratio128_state_shapes(arrays, batch, heads, dim)
    cursors = execute.read_cursors(128, arrays, sequence, arrays[1].shape[1])
    stored = _ratio128_past_width(kernel, arrays, batch, cursors.start, dim)
    for index in _RATIO128_FINITE_INPUTS:
        execute.require_finite(INPUT_NAMES[index], arrays[index])
    execute.validate_carry(arrays[7])
    return step_geometry(kernel, arrays, outputs, cursors, stored, 0)
