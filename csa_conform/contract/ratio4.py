"""The ratio-4 execute path: hybrid FP8 attention records plus the FP4 index-key stream.

Its checks run in the reference's ratio-4 order, which differs from ratio 128's.
"""

from __future__ import annotations

from csa_conform.contract import execute
from csa_conform.contract.attributes import Kernel, stored_record_width
from csa_conform.contract.geometry import StepGeometry, step_geometry
from csa_conform.contract.messages import debug_shape
from csa_conform.contract.schema import INPUT_NAMES
from csa_conform.errors import invalid, unsupported

_RATIO4_FLOAT_INPUTS = (0, 1, 2, 3, 4, 5, 7, 10, 11, 12, 13, 14, 15, 16, 18)
_RATIO4_FINITE_INPUTS = (0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15, 16)


def _ratio4_query(kernel: Kernel, arrays: list) -> tuple[int, int, int, int]:
    batch, sequence, heads, dim = execute.require_rank("query", arrays[0], 4)
    execute.require_frozen_dims(4, dim, kernel)
    if kernel.index_dim != 128:
        raise unsupported(f"ratio-4 index compression is frozen to ID=128, got {kernel.index_dim}")
    if heads != kernel.num_heads or dim != kernel.head_dim or sequence == 0:
        raise invalid(
            f"query must be non-empty and end in [num_heads={kernel.num_heads}, "
            f"head_dim={kernel.head_dim}], got {debug_shape(arrays[0].shape)}"
        )
    return batch, sequence, heads, dim


def _ratio4_sources(kernel: Kernel, arrays: list, batch: int, sequence: int, dim: int) -> None:
    current_kv = execute.require_rank("current_kv", arrays[1], 3)
    if current_kv[0] != batch or current_kv[2] != dim:
        raise invalid(
            f"current_kv must have shape [B,K,D] with B={batch}, D={dim}, "
            f"got {debug_shape(current_kv)}"
        )
    widths = {2: 2 * dim, 3: 2 * dim, 13: 2 * kernel.index_dim, 14: 2 * kernel.index_dim}
    for index, width in widths.items():
        name, expected = INPUT_NAMES[index], (batch, sequence, width)
        if execute.require_rank(name, arrays[index], 3) != expected:
            raise invalid(
                f"{name} must have shape {debug_shape(expected)}, "
                f"got {debug_shape(arrays[index].shape)}"
            )


def _ratio4_state_shapes(
    kernel: Kernel, arrays: list, batch: int, sequence: int, dim: int
) -> None:
    index_heads, index_dim = kernel.index_heads, kernel.index_dim
    expected = {
        4: (4, 2 * dim),
        5: (dim,),
        7: (batch, 8, 2, 2 * dim),
        11: (batch, sequence, index_heads, index_dim),
        12: (batch, sequence, index_heads),
        15: (4, 2 * index_dim),
        16: (index_dim,),
        18: (batch, 8, 2, 2 * index_dim),
    }
    if any(arrays[index].shape != shape for index, shape in expected.items()):
        got = [debug_shape(arrays[index].shape) for index in expected]
        raise invalid(
            "ratio-4 compressor/index tensor shape mismatch: ape={}, norm={}, carry={}, "
            "index_query={}, index_weight={}, index_ape={}, index_norm={}, "
            "index_carry={}".format(*got)
        )


def _ratio4_cursor_and_sink_shapes(arrays: list, batch: int, heads: int) -> None:
    if arrays[8].shape != (batch,) or arrays[9].shape != ():
        raise invalid(
            f"seqlens_k must be [{batch}] and total_sequence_length scalar, got "
            f"{debug_shape(arrays[8].shape)} and {debug_shape(arrays[9].shape)}"
        )
    execute.require_sink_shape(arrays, heads)


def _ratio4_past_widths(
    kernel: Kernel, arrays: list, batch: int, start: int, dim: int
) -> tuple[int, int]:
    stored = stored_record_width(kernel.cache_format, dim, kernel.rope_dim)
    index_stored = stored_record_width("fp4_e2m1_block32", kernel.index_dim, 0)
    past = start // 4
    if (
        execute.require_rank("past_compressed_kv", arrays[6], 3) != (batch, past, stored)
        or execute.require_rank("past_index_key", arrays[17], 3) != (batch, past, index_stored)
    ):
        raise invalid(
            f"ratio-4 past cache shapes must be [{batch},{past},{stored}] and "
            f"[{batch},{past},{index_stored}], got {debug_shape(arrays[6].shape)} and "
            f"{debug_shape(arrays[17].shape)}"
        )
    return stored, index_stored


def execute_ratio4(kernel: Kernel, arrays: list, outputs: tuple[str, ...]) -> StepGeometry:
    if kernel.cache_format != "fp8_e4m3_block64":
        raise unsupported(
            "ratio-4 attention records require hybrid FP8/BF16 cache_format='fp8_e4m3_block64'; "
            "the index-key stream is independently fixed to FP4 E2M1 block-32"
        )
    execute.require_dtypes(
        arrays, _RATIO4_FLOAT_INPUTS, ((6, "Uint8"), (17, "Uint8"), (8, "Int32"), (9, "Int64"))
    )
    batch, sequence, heads, dim = _ratio4_query(kernel, arrays)
    _ratio4_sources(kernel, arrays, batch, sequence, dim)
    _ratio4_state_shapes(kernel, arrays, batch, sequence, dim)
    _ratio4_cursor_and_sink_shapes(arrays, batch, heads)
    cursors = execute.read_cursors(4, arrays, sequence, arrays[1].shape[1])
    stored, index_stored = _ratio4_past_widths(kernel, arrays, batch, cursors.start, dim)
    for index in _RATIO4_FINITE_INPUTS:
        execute.require_finite(INPUT_NAMES[index], arrays[index])
    execute.validate_carry(arrays[7])
    execute.validate_carry(arrays[18])
    return step_geometry(kernel, arrays, outputs, cursors, stored, index_stored)
