"""Accept/reject decisions of the CPU reference, check for check and message for message.

The seed-001 kernel validates a step in three places: the factory (node schema
and attributes), ``execute`` (dtypes, shapes, cursors, finiteness, carries) and
the claim-time gate ``unsupported_reason``. The oracle must refuse exactly the
steps the reference refuses, with the first error the reference would report,
so every check below keeps the reference's order and text. Checks the reference
makes that cannot fail here (runtime arity repeated after creation, output
dtypes and shapes the oracle produces itself, byte-size overflows of arrays that
already exist) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from csa_conform.errors import ContractError
from csa_conform.numerics.rustfmt import rust_display_f32

OP = "CompressedSparseAttention"

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
LAYOUT_VERSION = 1
DENSE_WINDOW = 128
FP8_BLOCK, FP8_BLOCK_BYTES = 64, 65
FP4_BLOCK, FP4_BLOCK_BYTES = 32, 17
CACHE_FORMATS = ("f32", "fp8_e4m3_block64", "fp4_e2m1_block32")
HARNESS = "csa-conform harness check (not a reference message)"

__all__ = [
    "INPUT_NAMES",
    "OUTPUT_NAMES",
    "StepGeometry",
    "attention_bias",
    "claim_metadata",
    "rust_display_f32",
    "stored_record_width",
    "unsupported_reason",
    "validate_step",
]


# --- Rust formatting and error constructors -------------------------------------------


def _debug_shape(shape) -> str:
    """Rust ``{:?}`` of a ``&[usize]`` shape: ``[1, 2, 3]``, ``[]`` for a scalar."""
    return "[" + ", ".join(str(int(extent)) for extent in shape) + "]"


_DTYPE_NAMES = {
    "float16": "Float16",
    "float32": "Float32",
    "float64": "Float64",
    "int8": "Int8",
    "int16": "Int16",
    "int32": "Int32",
    "int64": "Int64",
    "uint8": "Uint8",
    "uint16": "Uint16",
    "uint32": "Uint32",
    "uint64": "Uint64",
    "bool": "Bool",
}


def _dtype_name(dtype) -> str:
    """The reference's ``DataType`` Debug name for a NumPy dtype (``Undefined`` for none)."""
    if dtype is None:
        return "Undefined"
    name = np.dtype(dtype).name
    return _DTYPE_NAMES.get(name) or name[:1].upper() + name[1:]


def _error(message: str) -> ContractError:
    return ContractError(f"{OP}: {message}", "invalid")


def _unsupported(message: str) -> ContractError:
    return ContractError(f"{OP}: Unsupported: {message}", "unsupported")


# --- attributes (factory create) ------------------------------------------------------


def _is_int(value) -> bool:
    """The reference's ``as_int``: an integer attribute; JSON booleans are not integers."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _required_positive_int(attrs: Mapping, name: str) -> int:
    value = attrs.get(name)
    if not _is_int(value):
        raise _error(f"missing required integer attribute {name}")
    if value <= 0:
        raise _error(f"{name} must be positive, got {value}")
    return int(value)


def _optional_int(attrs: Mapping, name: str, default: int) -> int:
    if name not in attrs:
        return default
    if not _is_int(attrs[name]):
        raise _error(f"attribute {name} must be an integer")
    return int(attrs[name])


def _optional_nonnegative_int(attrs: Mapping, name: str) -> int:
    value = _optional_int(attrs, name, 0)
    if value < 0:
        raise _error(f"{name} must be non-negative, got {value}")
    return value


def _require_int_attr(attrs: Mapping, name: str, expected: int) -> None:
    value = _optional_int(attrs, name, expected)
    if value != expected:
        raise _error(f"{name} must be {expected}, got {value}")


def _optional_str(attrs: Mapping, name: str, default: str) -> str:
    if name not in attrs:
        return default
    if not isinstance(attrs[name], str):
        raise _error(f"attribute {name} must be a UTF-8 string")
    return attrs[name]


def _configured_scale(attrs: Mapping) -> np.float32:
    """A non-float ``scale`` reads as absent (0.0), as the reference's ``as_float`` does."""
    value = attrs.get("scale")
    with np.errstate(over="ignore"):
        scale = np.float32(value) if isinstance(value, (float, np.floating)) else np.float32(0)
    if not np.isfinite(scale) or scale < 0:
        raise _error("scale must be finite and non-negative")
    return scale


@dataclass(frozen=True)
class _Kernel:
    """What the reference factory stores on the kernel it creates."""

    num_heads: int
    head_dim: int
    rope_dim: int
    ratio: int
    index_heads: int
    index_dim: int
    index_topk: int
    scale: np.float32
    cache_format: str


def _validate_frozen_schema(present: Sequence[bool], output_count: int) -> None:
    if not REQUIRED_INPUTS <= len(present) <= len(INPUT_NAMES):
        raise _error(f"frozen v1 requires 11..=20 positional inputs, got {len(present)}")
    if not REQUIRED_OUTPUTS <= output_count <= len(OUTPUT_NAMES):
        raise _error(f"frozen v1 requires 3..=6 outputs, got {output_count}")
    for index in range(REQUIRED_INPUTS):
        if not present[index]:
            raise _error(f"required frozen-v1 input {index} ('{INPUT_NAMES[index]}') is omitted")


def _validate_ratio_schema(ratio: int, present: Sequence[bool], output_count: int) -> None:
    index_present = [index < len(present) and present[index] for index in INDEX_INPUTS]
    if ratio == 4:
        if not all(index_present):
            raise _error("ratio-4 requires all eight positional index inputs (11..=18)")
        if output_count not in (5, 6):
            raise _error(f"ratio-4 requires 5 or 6 outputs, got {output_count}")
    else:
        if any(index_present):
            raise _unsupported(
                "ratio-4-only inputs (11..=18) are not supported by the ratio-128 stateful path"
            )
        if output_count != REQUIRED_OUTPUTS:
            raise _unsupported(f"ratio-128 supports exactly 3 outputs, got {output_count}")


def _index_attributes(attrs: Mapping, ratio: int) -> tuple[int, int, int]:
    values = tuple(
        _optional_nonnegative_int(attrs, name)
        for name in ("index_num_heads", "index_head_dim", "index_topk")
    )
    if ratio == 4 and 0 in values:
        raise _error("ratio-4 requires positive index_num_heads, index_head_dim, and index_topk")
    if ratio == 128 and any(values):
        raise _error("ratio-128 requires index_num_heads=index_head_dim=index_topk=0")
    return values


def _cache_format(attrs: Mapping) -> str:
    for name in ("causal", "cache_layout_version", "index_layout_version"):
        _require_int_attr(attrs, name, LAYOUT_VERSION)
    sink_mode = _optional_str(attrs, "sink_mode", "logit_only")
    if sink_mode != "logit_only":
        raise _unsupported(
            f"sink_mode='{sink_mode}' is unsupported for the learned per-head logit input "
            "`head_sink`; v1 requires 'logit_only'. Metadata `sink_tokens` configures retained "
            "prefix tokens and is unrelated"
        )
    cache_format = _optional_str(attrs, "cache_format", "f32")
    if cache_format not in CACHE_FORMATS:
        raise _unsupported(
            f"cache_format='{cache_format}' is unsupported; "
            "expected f32, fp8_e4m3_block64, or fp4_e2m1_block32"
        )
    return cache_format


def _create_kernel(attrs: Mapping, present: Sequence[bool], output_count: int) -> _Kernel:
    """The factory's ``create``: node schema, then attributes in the reference's order."""
    _validate_frozen_schema(present, output_count)
    num_heads = _required_positive_int(attrs, "num_heads")
    head_dim = _required_positive_int(attrs, "head_dim")
    rope_dim = _optional_nonnegative_int(attrs, "qk_rope_head_dim")
    if rope_dim > head_dim:
        raise _error(f"qk_rope_head_dim {rope_dim} exceeds head_dim {head_dim}")
    ratio = _required_positive_int(attrs, "compression_ratio")
    if ratio not in (4, 128):
        raise _error(f"compression_ratio must be exactly 4 or 128, got {ratio}")
    _validate_ratio_schema(ratio, present, output_count)
    index_heads, index_dim, index_topk = _index_attributes(attrs, ratio)
    cache_format = _cache_format(attrs)
    scale = _configured_scale(attrs)
    return _Kernel(
        num_heads=num_heads,
        head_dim=head_dim,
        rope_dim=rope_dim,
        ratio=ratio,
        index_heads=index_heads,
        index_dim=index_dim,
        index_topk=index_topk,
        scale=scale,
        cache_format=cache_format,
    )


def stored_record_width(cache_format: str, logical_width: int, rope_dim: int) -> int:
    """Width of one stored record: f32 values, FP8 blocks + BF16 RoPE tail, or FP4 blocks."""
    if cache_format == "f32":
        return logical_width
    if cache_format == "fp8_e4m3_block64":
        non_rope = logical_width - rope_dim
        if non_rope < 0:
            raise _error(f"qk_rope_head_dim {rope_dim} exceeds head_dim {logical_width}")
        if non_rope % FP8_BLOCK:
            raise _error(
                f"non-RoPE head dimension {non_rope} must be divisible by FP8 block size "
                f"{FP8_BLOCK}"
            )
        return non_rope // FP8_BLOCK * FP8_BLOCK_BYTES + 2 * rope_dim
    if logical_width % FP4_BLOCK:
        raise _error(f"head_dim {logical_width} must be divisible by FP4 block size {FP4_BLOCK}")
    return logical_width // FP4_BLOCK * FP4_BLOCK_BYTES


# --- execute: the harness view of a node ----------------------------------------------


def _positional_inputs(inputs: Mapping[str, np.ndarray]) -> list:
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


def _checked_output_names(output_names: Sequence[str]) -> tuple[str, ...]:
    names = tuple(output_names)
    if names != OUTPUT_NAMES[: len(names)]:
        raise ContractError(
            f"{HARNESS}: output_names must be a prefix of {list(OUTPUT_NAMES)} in that order, "
            f"got {list(names)}"
        )
    return names


def _require_dtype(name: str, array: np.ndarray, expected: str) -> None:
    got = _dtype_name(array.dtype)
    if got != expected:
        raise _error(f"{name} must have dtype {expected}, got {got}")


def _rank(name: str, array: np.ndarray, rank: int) -> tuple[int, ...]:
    if array.ndim != rank:
        raise _error(f"{name} must be rank {rank}, got shape {_debug_shape(array.shape)}")
    return array.shape


# --- execute: cursors, finiteness, carries (shared by both ratios) ----------------------


def _checked_position(value: int, what: str) -> int:
    if value < 0:
        raise _error(f"{what} must be non-negative and <= isize::MAX, got {value}")
    return value


@dataclass(frozen=True)
class _Cursors:
    total: int
    start: int
    current_kv_base: int


def _cursors(ratio: int, arrays: list, sequence: int, current_kv_len: int) -> _Cursors:
    """T, start and the current_kv window; v1 rows must all end at T-1."""
    total = _checked_position(int(arrays[9].reshape(-1)[0]), "total_sequence_length")
    rule = "v1 requires" if ratio == 4 else "v1 requires equal-length rows and"
    for row, seqlen in enumerate(arrays[8].astype(np.int64).tolist()):
        row_total = _checked_position(seqlen + 1, f"seqlens_k[{row}] + 1")
        if row_total != total:
            raise _error(
                f"{rule} total_sequence_length == seqlens_k[b] + 1; "
                f"row {row} gives {row_total}, total is {total}"
            )
    if total < sequence:
        raise _error("total_sequence_length is shorter than the current query sequence")
    if total < current_kv_len:
        raise _error("current_kv length exceeds total_sequence_length")
    start, base = total - sequence, total - current_kv_len
    earliest_needed = max(start + 1 - DENSE_WINDOW, 0)
    if base > earliest_needed:
        where = f"{base}" if ratio == 4 else f"absolute position {base}"
        raise _error(
            f"current_kv starts at {where}, but the earliest query needs dense-window "
            f"position {earliest_needed}"
        )
    return _Cursors(total, start, base)


def _require_finite(name: str, array: np.ndarray) -> None:
    flat = array.reshape(-1)
    bad = ~np.isfinite(flat)
    if bad.any():
        index = int(np.argmax(bad))
        raise _error(f"{name}[{index}] must be finite, got {rust_display_f32(flat[index])}")


def _validate_carry(carry: np.ndarray) -> None:
    """Carry [B, slots, 2, W]: kv finite, score finite or -inf, first bad (b, slot, d) wins.

    The reference names every carry ``past_compression_carry``, the index carry too.
    """
    kv, score = carry[:, :, 0, :], carry[:, :, 1, :]
    bad_kv = ~np.isfinite(kv)
    bad = bad_kv | np.isnan(score) | (score == np.inf)
    if bad.any():
        b, slot, d = np.unravel_index(int(np.argmax(bad.reshape(-1))), bad.shape)
        if bad_kv[b, slot, d]:
            raise _error(f"past_compression_carry kv_state[{b},{slot},{d}] must be finite")
        raise _error(
            f"past_compression_carry score_state[{b},{slot},{d}] must be finite or -inf"
        )


def _require_dtypes(arrays: list, float_inputs: Sequence[int], others: Sequence[tuple]) -> None:
    for index in float_inputs:
        _require_dtype(INPUT_NAMES[index], arrays[index], "Float32")
    for index, expected in others:
        _require_dtype(INPUT_NAMES[index], arrays[index], expected)


def _require_frozen_dims(ratio: int, dim: int, kernel: _Kernel) -> None:
    if dim != 512 or kernel.rope_dim != 64:
        raise _unsupported(
            f"ratio-{ratio} stateful compression is frozen to D=512 and RD=64, "
            f"got D={dim}, RD={kernel.rope_dim}"
        )


def _require_sink_shape(arrays: list, heads: int) -> None:
    if arrays[10].shape != (heads,):
        raise _error(
            f"head_sink must have shape [{heads}], got {_debug_shape(arrays[10].shape)}"
        )


# --- execute: ratio 4 -------------------------------------------------------------------

_RATIO4_FLOAT_INPUTS = (0, 1, 2, 3, 4, 5, 7, 10, 11, 12, 13, 14, 15, 16, 18)
_RATIO4_FINITE_INPUTS = (0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15, 16)


def _ratio4_query(kernel: _Kernel, arrays: list) -> tuple[int, int, int, int]:
    batch, sequence, heads, dim = _rank("query", arrays[0], 4)
    _require_frozen_dims(4, dim, kernel)
    if kernel.index_dim != 128:
        raise _unsupported(f"ratio-4 index compression is frozen to ID=128, got {kernel.index_dim}")
    if heads != kernel.num_heads or dim != kernel.head_dim or sequence == 0:
        raise _error(
            f"query must be non-empty and end in [num_heads={kernel.num_heads}, "
            f"head_dim={kernel.head_dim}], got {_debug_shape(arrays[0].shape)}"
        )
    return batch, sequence, heads, dim


def _ratio4_sources(kernel: _Kernel, arrays: list, batch: int, sequence: int, dim: int) -> None:
    current_kv = _rank("current_kv", arrays[1], 3)
    if current_kv[0] != batch or current_kv[2] != dim:
        raise _error(
            f"current_kv must have shape [B,K,D] with B={batch}, D={dim}, "
            f"got {_debug_shape(current_kv)}"
        )
    widths = {2: 2 * dim, 3: 2 * dim, 13: 2 * kernel.index_dim, 14: 2 * kernel.index_dim}
    for index, width in widths.items():
        name, expected = INPUT_NAMES[index], (batch, sequence, width)
        if _rank(name, arrays[index], 3) != expected:
            raise _error(
                f"{name} must have shape {_debug_shape(expected)}, "
                f"got {_debug_shape(arrays[index].shape)}"
            )


def _ratio4_state_shapes(
    kernel: _Kernel, arrays: list, batch: int, sequence: int, dim: int
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
        got = [_debug_shape(arrays[index].shape) for index in expected]
        raise _error(
            "ratio-4 compressor/index tensor shape mismatch: ape={}, norm={}, carry={}, "
            "index_query={}, index_weight={}, index_ape={}, index_norm={}, "
            "index_carry={}".format(*got)
        )


def _ratio4_cursor_and_sink_shapes(arrays: list, batch: int, heads: int) -> None:
    if arrays[8].shape != (batch,) or arrays[9].shape != ():
        raise _error(
            f"seqlens_k must be [{batch}] and total_sequence_length scalar, got "
            f"{_debug_shape(arrays[8].shape)} and {_debug_shape(arrays[9].shape)}"
        )
    _require_sink_shape(arrays, heads)


def _ratio4_past_widths(
    kernel: _Kernel, arrays: list, batch: int, start: int, dim: int
) -> tuple[int, int]:
    stored = stored_record_width(kernel.cache_format, dim, kernel.rope_dim)
    index_stored = stored_record_width("fp4_e2m1_block32", kernel.index_dim, 0)
    past = start // 4
    if (
        _rank("past_compressed_kv", arrays[6], 3) != (batch, past, stored)
        or _rank("past_index_key", arrays[17], 3) != (batch, past, index_stored)
    ):
        raise _error(
            f"ratio-4 past cache shapes must be [{batch},{past},{stored}] and "
            f"[{batch},{past},{index_stored}], got {_debug_shape(arrays[6].shape)} and "
            f"{_debug_shape(arrays[17].shape)}"
        )
    return stored, index_stored


def _execute_ratio4(kernel: _Kernel, arrays: list, outputs: tuple[str, ...]) -> StepGeometry:
    if kernel.cache_format != "fp8_e4m3_block64":
        raise _unsupported(
            "ratio-4 attention records require hybrid FP8/BF16 cache_format='fp8_e4m3_block64'; "
            "the index-key stream is independently fixed to FP4 E2M1 block-32"
        )
    _require_dtypes(
        arrays, _RATIO4_FLOAT_INPUTS, ((6, "Uint8"), (17, "Uint8"), (8, "Int32"), (9, "Int64"))
    )
    batch, sequence, heads, dim = _ratio4_query(kernel, arrays)
    _ratio4_sources(kernel, arrays, batch, sequence, dim)
    _ratio4_state_shapes(kernel, arrays, batch, sequence, dim)
    _ratio4_cursor_and_sink_shapes(arrays, batch, heads)
    cursors = _cursors(4, arrays, sequence, arrays[1].shape[1])
    stored, index_stored = _ratio4_past_widths(kernel, arrays, batch, cursors.start, dim)
    for index in _RATIO4_FINITE_INPUTS:
        _require_finite(INPUT_NAMES[index], arrays[index])
    _validate_carry(arrays[7])
    _validate_carry(arrays[18])
    return _geometry(kernel, arrays, outputs, cursors, stored, index_stored)


# --- execute: ratio 128 -----------------------------------------------------------------

_RATIO128_FLOAT_INPUTS = (0, 1, 2, 3, 4, 5, 7, 10)
_RATIO128_FINITE_INPUTS = (0, 1, 2, 3, 4, 5, 10)


def _ratio128_query(kernel: _Kernel, arrays: list) -> tuple[int, int, int, int]:
    batch, sequence, heads, dim = _rank("query", arrays[0], 4)
    _require_frozen_dims(128, dim, kernel)
    if heads != kernel.num_heads or dim != kernel.head_dim:
        raise _error(
            f"query must end in [num_heads={kernel.num_heads}, head_dim={kernel.head_dim}], "
            f"got [{heads}, {dim}]"
        )
    if sequence == 0:
        raise _error("query sequence length must be positive")
    return batch, sequence, heads, dim


def _ratio128_sources(arrays: list, batch: int, sequence: int, dim: int) -> None:
    current_kv = _rank("current_kv", arrays[1], 3)
    compressor_kv = _rank("compressor_kv", arrays[2], 3)
    compressor_gate = _rank("compressor_gate", arrays[3], 3)
    if (
        current_kv[0] != batch
        or current_kv[2] != dim
        or compressor_kv != (batch, sequence, dim)
        or compressor_gate != (batch, sequence, dim)
    ):
        raise _error(
            "current/compressor tensors must have current_kv=[B,K,D] and "
            "compressor_kv/gate=[B,S,D]; "
            f"got {_debug_shape(current_kv)}, {_debug_shape(compressor_kv)}, "
            f"{_debug_shape(compressor_gate)}"
        )


def _ratio128_state_shapes(arrays: list, batch: int, heads: int, dim: int) -> None:
    if arrays[4].shape != (128, dim):
        raise _error(
            f"compressor_ape must have shape [128, {dim}], got {_debug_shape(arrays[4].shape)}"
        )
    if arrays[5].shape != (dim,):
        raise _error(
            f"compressor_norm must have shape [{dim}], got {_debug_shape(arrays[5].shape)}"
        )
    if arrays[7].shape != (batch, 128, 2, dim):
        raise _error(
            f"past_compression_carry must have shape [B,128,2,D]=[{batch},128,2,{dim}], "
            f"got {_debug_shape(arrays[7].shape)}"
        )
    if arrays[8].shape != (batch,):
        raise _error(f"seqlens_k must have shape [{batch}], got {_debug_shape(arrays[8].shape)}")
    if arrays[9].shape != ():
        raise _error(
            f"total_sequence_length must be a scalar, got {_debug_shape(arrays[9].shape)}"
        )
    _require_sink_shape(arrays, heads)


def _ratio128_past_width(kernel: _Kernel, arrays: list, batch: int, start: int, dim: int) -> int:
    stored = stored_record_width(kernel.cache_format, dim, kernel.rope_dim)
    past = start // 128
    if _rank("past_compressed_kv", arrays[6], 3) != (batch, past, stored):
        raise _error(
            f"past_compressed_kv must have shape [{batch},{past},{stored}] at start position "
            f"{start}, got {_debug_shape(arrays[6].shape)}"
        )
    return stored


def _execute_ratio128(kernel: _Kernel, arrays: list, outputs: tuple[str, ...]) -> StepGeometry:
    if kernel.cache_format == "fp4_e2m1_block32":
        raise _unsupported(
            "ratio-128 attention-compressor state uses hybrid FP8/BF16 records, not FP4"
        )
    cache_dtype = "Float32" if kernel.cache_format == "f32" else "Uint8"
    _require_dtypes(
        arrays, _RATIO128_FLOAT_INPUTS, ((6, cache_dtype), (8, "Int32"), (9, "Int64"))
    )
    batch, sequence, heads, dim = _ratio128_query(kernel, arrays)
    _ratio128_sources(arrays, batch, sequence, dim)
    _ratio128_state_shapes(arrays, batch, heads, dim)
    cursors = _cursors(128, arrays, sequence, arrays[1].shape[1])
    stored = _ratio128_past_width(kernel, arrays, batch, cursors.start, dim)
    for index in _RATIO128_FINITE_INPUTS:
        _require_finite(INPUT_NAMES[index], arrays[index])
    _validate_carry(arrays[7])
    return _geometry(kernel, arrays, outputs, cursors, stored, 0)


# --- the validated step -----------------------------------------------------------------


@dataclass(frozen=True)
class StepGeometry:
    """Everything the pipeline derives from a step the reference accepted.

    Ratio-128 steps carry zeros in the index fields. ``topk_width`` is
    min(index_topk, next_records) for ratio 4; ``candidate_count`` is
    dense_candidates plus topk_width (ratio 4) or next_records (ratio 128).
    """

    ratio: int
    batch: int
    sequence: int
    heads: int
    dim: int
    rope_dim: int
    index_heads: int
    index_dim: int
    index_topk: int
    topk_width: int
    scale: np.float32
    cache_format: str
    total: int
    start: int
    past_records: int
    next_records: int
    emitted: int
    current_kv_len: int
    current_kv_base: int
    dense_candidates: int
    candidate_count: int
    stored_width: int
    index_stored_width: int
    carry_slots: int
    compressor_width: int
    index_compressor_width: int
    has_bias: bool
    output_names: tuple[str, ...]


def _resolved_scale(kernel: _Kernel, dim: int) -> np.float32:
    """0 means 1/sqrt(D), evaluated in f32 as the reference's attention does."""
    if kernel.scale != 0:
        return kernel.scale
    return np.float32(1) / np.sqrt(np.float32(dim))


def _geometry(
    kernel: _Kernel,
    arrays: list,
    outputs: tuple[str, ...],
    cursors: _Cursors,
    stored: int,
    index_stored: int,
) -> StepGeometry:
    batch, sequence, heads, dim = arrays[0].shape
    ratio = kernel.ratio
    past_records, next_records = cursors.start // ratio, cursors.total // ratio
    current_kv_len = arrays[1].shape[1]
    dense = min(current_kv_len, DENSE_WINDOW) if cursors.start == 0 else DENSE_WINDOW
    topk_width = min(kernel.index_topk, next_records) if ratio == 4 else 0
    return StepGeometry(
        ratio=ratio,
        batch=batch,
        sequence=sequence,
        heads=heads,
        dim=dim,
        rope_dim=kernel.rope_dim,
        index_heads=kernel.index_heads,
        index_dim=kernel.index_dim,
        index_topk=kernel.index_topk,
        topk_width=topk_width,
        scale=_resolved_scale(kernel, dim),
        cache_format=kernel.cache_format,
        total=cursors.total,
        start=cursors.start,
        past_records=past_records,
        next_records=next_records,
        emitted=next_records - past_records,
        current_kv_len=current_kv_len,
        current_kv_base=cursors.current_kv_base,
        dense_candidates=dense,
        candidate_count=dense + (topk_width if ratio == 4 else next_records),
        stored_width=stored,
        index_stored_width=index_stored,
        carry_slots=8 if ratio == 4 else 128,
        compressor_width=2 * dim if ratio == 4 else dim,
        index_compressor_width=2 * kernel.index_dim,
        has_bias=len(arrays) > BIAS_INPUT and arrays[BIAS_INPUT] is not None,
        output_names=outputs,
    )


def validate_step(
    attrs: Mapping, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
) -> StepGeometry:
    """Run every reference check from kernel creation to the first computation.

    Raises ContractError with the reference's first message; a name the node
    cannot carry (unknown input, outputs out of order) is a harness error.
    """
    arrays = _positional_inputs(inputs)
    outputs = _checked_output_names(output_names)
    kernel = _create_kernel(attrs, [array is not None for array in arrays], len(outputs))
    if kernel.ratio == 4:
        return _execute_ratio4(kernel, arrays, outputs)
    return _execute_ratio128(kernel, arrays, outputs)


def attention_bias(bias: np.ndarray, target: tuple[int, int, int, int]) -> np.ndarray:
    """The reference's additive bias: f32, rank <= 4, broadcast to scores [B, N, S, C].

    Checked only once the candidates are known, after the compression stages.
    """
    bias = np.asarray(bias)
    if bias.dtype == np.bool_:
        raise _unsupported("boolean attention_bias semantics are deferred; use additive f32 bias")
    _require_dtype("attention_bias", bias, "Float32")
    if bias.ndim > 4:
        raise _error(f"attention_bias rank must be <= 4, got {_debug_shape(bias.shape)}")
    padded = (1,) * (4 - bias.ndim) + bias.shape
    if any(extent not in (1, goal) for extent, goal in zip(padded, target)):
        raise _error(
            f"attention_bias shape {_debug_shape(bias.shape)} is not broadcastable to "
            f"{_debug_shape(target)}"
        )
    return np.broadcast_to(bias.reshape(padded), tuple(target))


# --- claim-time gate --------------------------------------------------------------------

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
        (6, (batch, ANY, 583)),
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
        (17, (batch, ANY, 68)),
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
    got = _dtype_name(dtypes[index])
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
    if not _is_int(value) or value < 0:
        raise _ClaimDenied(f"missing or invalid integer attribute '{name}'")
    return int(value)


def _fixed_claim_contract(attrs: Mapping, ratio: int) -> None:
    if _claim_int(attrs, "head_dim") != 512:
        raise _ClaimDenied(f"ratio-{ratio} requires head_dim=512")
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
    stored = 512 if cache_format == "f32" else 583
    for index, contract in _ratio128_claim_shapes(heads, stored):
        _claim_shape(shapes, index, contract)


def _debug_dims(shape) -> str:
    """Rust ``{:?}`` of an IR shape: ``[Static(2), Symbolic(SymbolId(?))]`` (ids unknown)."""
    return "[" + ", ".join(_debug_dim(extent) for extent in shape) + "]"


def _debug_dim(extent) -> str:
    return "Symbolic(SymbolId(?))" if extent is None else f"Static({extent})"


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
            f"{prefix} byte count overflow or exceeds isize::MAX for shape {_debug_shape(bias)}"
        )
    heads = _claim_int(attrs, "num_heads")
    query = shapes[0]
    target = (query[0], heads, query[1], None)[4 - len(bias):]
    for got, goal in zip(bias, target):
        if got is not None and got != 1 and goal is not None and got != goal:
            raise _ClaimDenied(
                f"{prefix} shape {_debug_dims(bias)} is not broadcastable to attention scores "
                f"[{_debug_dim(query[0])}, {heads}, {_debug_dim(query[1])}, ?]"
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
        kernel = _create_kernel(attrs, [shape is not None for shape in shapes], output_count)
    except ContractError as denied:
        return str(denied)
    if len(dtypes) != len(shapes):
        return (
            f"{OP}: claim metadata must cover all {len(shapes)} positional inputs "
            f"(got {len(shapes)} shapes and {len(dtypes)} dtypes)"
        )
    ratio_claim = _ratio4_claim if kernel.ratio == 4 else _ratio128_claim
    try:
        ratio_claim(attrs, shapes, dtypes, kernel.cache_format)
        _attention_bias_claim(attrs, shapes, dtypes)
    except _ClaimDenied as denied:
        return f"{OP}: {denied}"
    return None


def claim_metadata(inputs: Mapping[str, np.ndarray]) -> tuple[list, list]:
    """Positional (shapes, dtypes) of concrete inputs, as a runtime hands them to the gate."""
    arrays = _positional_inputs(inputs)
    shapes = [None if array is None else tuple(array.shape) for array in arrays]
    dtypes = [None if array is None else array.dtype for array in arrays]
    return shapes, dtypes
