"""Node attributes as the reference factory reads them into the kernel it creates.

The factory's first failing check is the message, so the readers keep its order
and its coercions (booleans are not integers, a non-float scale reads as absent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from csa_conform.contract.schema import validate_frozen_schema, validate_ratio_schema
from csa_conform.errors import invalid, unsupported
from csa_conform.numerics.fp4 import FP4_BLOCK
from csa_conform.numerics.fp8 import FP8_BLOCK
from csa_conform.numerics.records import FP4_BLOCK_BYTES, FP8_BLOCK_BYTES

LAYOUT_VERSION = 1
CACHE_FORMATS = ("f32", "fp8_e4m3_block64", "fp4_e2m1_block32")
# The attributes the factory reads as floats; every other numeric attribute is an int64.
FLOAT_ATTRIBUTES = frozenset({"scale"})


def is_int(value) -> bool:
    """The reference's ``as_int``: an integer attribute; JSON booleans are not integers."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _required_positive_int(attrs: Mapping, name: str) -> int:
    value = attrs.get(name)
    if not is_int(value):
        raise invalid(f"missing required integer attribute {name}")
    if value <= 0:
        raise invalid(f"{name} must be positive, got {value}")
    return int(value)


def _optional_int(attrs: Mapping, name: str, default: int) -> int:
    if name not in attrs:
        return default
    if not is_int(attrs[name]):
        raise invalid(f"attribute {name} must be an integer")
    return int(attrs[name])


def _optional_nonnegative_int(attrs: Mapping, name: str) -> int:
    value = _optional_int(attrs, name, 0)
    if value < 0:
        raise invalid(f"{name} must be non-negative, got {value}")
    return value


def _require_int_attr(attrs: Mapping, name: str, expected: int) -> None:
    value = _optional_int(attrs, name, expected)
    if value != expected:
        raise invalid(f"{name} must be {expected}, got {value}")


def _optional_str(attrs: Mapping, name: str, default: str) -> str:
    if name not in attrs:
        return default
    if not isinstance(attrs[name], str):
        raise invalid(f"attribute {name} must be a UTF-8 string")
    return attrs[name]


def _configured_scale(attrs: Mapping) -> np.float32:
    """A non-float ``scale`` reads as absent (0.0), as the reference's ``as_float`` does."""
    value = attrs.get("scale")
    with np.errstate(over="ignore"):
        scale = np.float32(value) if isinstance(value, (float, np.floating)) else np.float32(0)
    if not np.isfinite(scale) or scale < 0:
        raise invalid("scale must be finite and non-negative")
    return scale


@dataclass(frozen=True)
class Kernel:
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


def _index_attributes(attrs: Mapping, ratio: int) -> tuple[int, int, int]:
    values = tuple(
        _optional_nonnegative_int(attrs, name)
        for name in ("index_num_heads", "index_head_dim", "index_topk")
    )
    if ratio == 4 and 0 in values:
        raise invalid("ratio-4 requires positive index_num_heads, index_head_dim, and index_topk")
    if ratio == 128 and any(values):
        raise invalid("ratio-128 requires index_num_heads=index_head_dim=index_topk=0")
    return values


def _cache_format(attrs: Mapping) -> str:
    for name in ("causal", "cache_layout_version", "index_layout_version"):
        _require_int_attr(attrs, name, LAYOUT_VERSION)
    sink_mode = _optional_str(attrs, "sink_mode", "logit_only")
    if sink_mode != "logit_only":
        raise unsupported(
            f"sink_mode='{sink_mode}' is unsupported for the learned per-head logit input "
            "`head_sink`; v1 requires 'logit_only'. Metadata `sink_tokens` configures retained "
            "prefix tokens and is unrelated"
        )
    cache_format = _optional_str(attrs, "cache_format", "f32")
    if cache_format not in CACHE_FORMATS:
        raise unsupported(
            f"cache_format='{cache_format}' is unsupported; "
            "expected f32, fp8_e4m3_block64, or fp4_e2m1_block32"
        )
    return cache_format


def create_kernel(attrs: Mapping, present: Sequence[bool], output_count: int) -> Kernel:
    """The factory's ``create``: node schema, then attributes in the reference's order."""
    validate_frozen_schema(present, output_count)
    num_heads = _required_positive_int(attrs, "num_heads")
    head_dim = _required_positive_int(attrs, "head_dim")
    rope_dim = _optional_nonnegative_int(attrs, "qk_rope_head_dim")
    if rope_dim > head_dim:
        raise invalid(f"qk_rope_head_dim {rope_dim} exceeds head_dim {head_dim}")
    ratio = _required_positive_int(attrs, "compression_ratio")
    if ratio not in (4, 128):
        raise invalid(f"compression_ratio must be exactly 4 or 128, got {ratio}")
    validate_ratio_schema(ratio, present, output_count)
    index_heads, index_dim, index_topk = _index_attributes(attrs, ratio)
    cache_format = _cache_format(attrs)
    scale = _configured_scale(attrs)
    return Kernel(
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
            raise invalid(f"qk_rope_head_dim {rope_dim} exceeds head_dim {logical_width}")
        if non_rope % FP8_BLOCK:
            raise invalid(
                f"non-RoPE head dimension {non_rope} must be divisible by FP8 block size "
                f"{FP8_BLOCK}"
            )
        return non_rope // FP8_BLOCK * FP8_BLOCK_BYTES + 2 * rope_dim
    if logical_width % FP4_BLOCK:
        raise invalid(f"head_dim {logical_width} must be divisible by FP4 block size {FP4_BLOCK}")
    return logical_width // FP4_BLOCK * FP4_BLOCK_BYTES
