"""Minimal steps the reference accepts, one per ratio, for tests to break one thing at a time."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from csa_conform.contract import OUTPUT_NAMES, validate_step
from csa_conform.errors import ContractError

PREFIX = "CompressedSparseAttention: "
UNSUPPORTED = PREFIX + "Unsupported: "


@dataclass
class Step:
    attrs: dict
    inputs: dict = field(default_factory=dict)
    output_names: list = field(default_factory=list)


def _carry(batch: int, slots: int, width: int) -> np.ndarray:
    """A reset carry: kv 0, score -inf (what the reference writes at start 0)."""
    carry = np.zeros((batch, slots, 2, width), np.float32)
    carry[:, :, 1, :] = -np.inf
    return carry


def _cursor_inputs(batch: int, total: int) -> dict:
    return {
        "seqlens_k": np.full((batch,), total - 1, np.int32),
        "total_sequence_length": np.array(total, np.int64),
    }


def _filled(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def ratio128_step(
    batch: int = 1,
    sequence: int = 4,
    total: int = 4,
    heads: int = 1,
    kv_len: int | None = None,
    cache_format: str = "f32",
) -> Step:
    """A ratio-128 step (prefill by default: B=1, S=4, T=4); decode when total > sequence."""
    rng = np.random.default_rng(128)
    kv_len = total if kv_len is None else kv_len
    past = max(total - sequence, 0) // 128
    cache = (
        np.zeros((batch, past, 512), np.float32)
        if cache_format == "f32"
        else np.zeros((batch, past, 583), np.uint8)
    )
    inputs = {
        "query": _filled(rng, (batch, sequence, heads, 512)),
        "current_kv": _filled(rng, (batch, kv_len, 512)),
        "compressor_kv": _filled(rng, (batch, sequence, 512)),
        "compressor_gate": _filled(rng, (batch, sequence, 512)),
        "compressor_ape": _filled(rng, (128, 512)),
        "compressor_norm": _filled(rng, (512,)),
        "past_compressed_kv": cache,
        "past_compression_carry": _carry(batch, 128, 512),
        **_cursor_inputs(batch, total),
        "head_sink": _filled(rng, (heads,)),
    }
    attrs = {
        "num_heads": heads,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "compression_ratio": 128,
        "causal": 1,
        "cache_layout_version": 1,
        "index_layout_version": 1,
        "cache_format": cache_format,
    }
    return Step(attrs, inputs, list(OUTPUT_NAMES[:3]))


def ratio4_step(
    batch: int = 1,
    sequence: int = 4,
    total: int = 4,
    heads: int = 1,
    index_heads: int = 1,
    index_topk: int = 2,
    kv_len: int | None = None,
    outputs: int = 6,
) -> Step:
    """A ratio-4 step (prefill by default: B=1, S=4, T=4, I=1, K=2)."""
    rng = np.random.default_rng(4)
    kv_len = total if kv_len is None else kv_len
    past = max(total - sequence, 0) // 4
    inputs = {
        "query": _filled(rng, (batch, sequence, heads, 512)),
        "current_kv": _filled(rng, (batch, kv_len, 512)),
        "compressor_kv": _filled(rng, (batch, sequence, 1024)),
        "compressor_gate": _filled(rng, (batch, sequence, 1024)),
        "compressor_ape": _filled(rng, (4, 1024)),
        "compressor_norm": _filled(rng, (512,)),
        "past_compressed_kv": np.zeros((batch, past, 583), np.uint8),
        "past_compression_carry": _carry(batch, 8, 1024),
        **_cursor_inputs(batch, total),
        "head_sink": _filled(rng, (heads,)),
        "index_query": _filled(rng, (batch, sequence, index_heads, 128)),
        "index_weight": _filled(rng, (batch, sequence, index_heads)),
        "index_compressor_kv": _filled(rng, (batch, sequence, 256)),
        "index_compressor_gate": _filled(rng, (batch, sequence, 256)),
        "index_compressor_ape": _filled(rng, (4, 256)),
        "index_compressor_norm": _filled(rng, (128,)),
        "past_index_key": np.zeros((batch, past, 68), np.uint8),
        "past_index_carry": _carry(batch, 8, 256),
    }
    attrs = {
        "num_heads": heads,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "compression_ratio": 4,
        "causal": 1,
        "cache_layout_version": 1,
        "index_layout_version": 1,
        "cache_format": "fp8_e4m3_block64",
        "index_num_heads": index_heads,
        "index_head_dim": 128,
        "index_topk": index_topk,
    }
    return Step(attrs, inputs, list(OUTPUT_NAMES[:outputs]))


def rejection(step: Step) -> ContractError:
    with pytest.raises(ContractError) as caught:
        validate_step(step.attrs, step.inputs, step.output_names)
    return caught.value


def assert_invalid(step: Step, message: str) -> None:
    error = rejection(step)
    assert (str(error), error.kind) == (PREFIX + message, "invalid")


def assert_unsupported(step: Step, message: str) -> None:
    error = rejection(step)
    assert (str(error), error.kind) == (UNSUPPORTED + message, "unsupported")
