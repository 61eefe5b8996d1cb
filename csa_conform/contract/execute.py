"""Execute-time checks both ratios share: dtypes, ranks, cursors, finiteness, carries.

Each ratio's execute path calls them in its own order; the messages are the reference's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from csa_conform.contract.attributes import Kernel
from csa_conform.contract.messages import debug_shape, dtype_name
from csa_conform.contract.schema import INPUT_NAMES
from csa_conform.errors import invalid, unsupported
from csa_conform.numerics.records import HEAD_DIM, ROPE_DIM
from csa_conform.numerics.rustfmt import rust_display_f32

DENSE_WINDOW = 128


def require_dtype(name: str, array: np.ndarray, expected: str) -> None:
    got = dtype_name(array.dtype)
    if got != expected:
        raise invalid(f"{name} must have dtype {expected}, got {got}")


def require_rank(name: str, array: np.ndarray, rank: int) -> tuple[int, ...]:
    if array.ndim != rank:
        raise invalid(f"{name} must be rank {rank}, got shape {debug_shape(array.shape)}")
    return array.shape


def _checked_position(value: int, what: str) -> int:
    if value < 0:
        raise invalid(f"{what} must be non-negative and <= isize::MAX, got {value}")
    return value


@dataclass(frozen=True)
class Cursors:
    total: int
    start: int
    current_kv_base: int


def read_cursors(ratio: int, arrays: list, sequence: int, current_kv_len: int) -> Cursors:
    """T, start and the current_kv window; v1 rows must all end at T-1."""
    total = _checked_position(int(arrays[9].reshape(-1)[0]), "total_sequence_length")
    rule = "v1 requires" if ratio == 4 else "v1 requires equal-length rows and"
    for row, seqlen in enumerate(arrays[8].astype(np.int64).tolist()):
        row_total = _checked_position(seqlen + 1, f"seqlens_k[{row}] + 1")
        if row_total != total:
            raise invalid(
                f"{rule} total_sequence_length == seqlens_k[b] + 1; "
                f"row {row} gives {row_total}, total is {total}"
            )
    if total < sequence:
        raise invalid("total_sequence_length is shorter than the current query sequence")
    if total < current_kv_len:
        raise invalid("current_kv length exceeds total_sequence_length")
    start, base = total - sequence, total - current_kv_len
    earliest_needed = max(start + 1 - DENSE_WINDOW, 0)
    if base > earliest_needed:
        where = f"{base}" if ratio == 4 else f"absolute position {base}"
        raise invalid(
            f"current_kv starts at {where}, but the earliest query needs dense-window "
            f"position {earliest_needed}"
        )
    return Cursors(total, start, base)


def require_finite(name: str, array: np.ndarray) -> None:
    flat = array.reshape(-1)
    bad = ~np.isfinite(flat)
    if bad.any():
        index = int(np.argmax(bad))
        raise invalid(f"{name}[{index}] must be finite, got {rust_display_f32(flat[index])}")


def validate_carry(carry: np.ndarray) -> None:
    """Carry [B, slots, 2, W]: kv finite, score finite or -inf, first bad (b, slot, d) wins.

    The reference names every carry ``past_compression_carry``, the index carry too.
    """
    kv, score = carry[:, :, 0, :], carry[:, :, 1, :]
    bad_kv = ~np.isfinite(kv)
    bad = bad_kv | np.isnan(score) | (score == np.inf)
    if bad.any():
        b, slot, d = np.unravel_index(int(np.argmax(bad.reshape(-1))), bad.shape)
        if bad_kv[b, slot, d]:
            raise invalid(f"past_compression_carry kv_state[{b},{slot},{d}] must be finite")
        raise invalid(
            f"past_compression_carry score_state[{b},{slot},{d}] must be finite or -inf"
        )


def require_dtypes(arrays: list, float_inputs: Sequence[int], others: Sequence[tuple]) -> None:
    for index in float_inputs:
        require_dtype(INPUT_NAMES[index], arrays[index], "Float32")
    for index, expected in others:
        require_dtype(INPUT_NAMES[index], arrays[index], expected)


def require_frozen_dims(ratio: int, dim: int, kernel: Kernel) -> None:
    if dim != HEAD_DIM or kernel.rope_dim != ROPE_DIM:
        raise unsupported(
            f"ratio-{ratio} stateful compression is frozen to D={HEAD_DIM} and RD={ROPE_DIM}, "
            f"got D={dim}, RD={kernel.rope_dim}"
        )


def require_sink_shape(arrays: list, heads: int) -> None:
    if arrays[10].shape != (heads,):
        raise invalid(
            f"head_sink must have shape [{heads}], got {debug_shape(arrays[10].shape)}"
        )
