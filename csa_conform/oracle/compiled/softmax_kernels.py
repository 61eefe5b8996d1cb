"""The numba engine's attention softmax with sink: softmax_with_sink of
csa_conform.oracle.sparse_sink_softmax_attention, one (b, s, h) row at a time.

Per row, in the NumPy function's binary32 operations and order: the max of
the scores ignoring NaN (np.fmax.reduce from -inf), weights expf(score - max)
(glibc's, compiled_libm's port) for every score that is not -inf, their
ascending sum plus expf(sink - max), and each weight over that sum. A row
with no score above -inf is all zeros. Any NaN that reaches a weight makes
that row's denominator invalid, and an invalid row rejects the step, so the
probabilities of accepted steps never carry a NaN payload. The
probabilities are laid out [B, S, N, C], each row contiguous as it is
written (the NumPy function's [C, B, S, N] put each write on its own cache
line: 5x slower in an 8K prefill).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from csa_conform.oracle.compiled.dots import KERNEL_OPTIONS
from csa_conform.oracle.compiled.libm_kernels import expf

_ZERO = np.float32(0)
_MINUS_INFINITY = np.float32(-np.inf)


@njit(**KERNEL_OPTIONS)
def softmax_with_sink(scores, head_sink, begin, end, first_head, last_head, probabilities):
    """probabilities [B, end - begin, N, C] of scores[:, begin:end, first_head:last_head] (other heads
    untouched); returns the first (b, s, h) in C order whose denominator is zero or non-finite, or (-1, -1, -1)."""
    batch, _, _, count = scores.shape
    first_invalid = (-1, -1, -1)
    for b in range(batch):
        for s in range(begin, end):
            for h in range(first_head, last_head):
                row = scores[b, s, h]
                weights = probabilities[b, s - begin, h]
                maximum = _MINUS_INFINITY
                for c in range(count):
                    if row[c] > maximum:
                        maximum = row[c]
                if maximum == _MINUS_INFINITY:
                    weights[:] = _ZERO
                    continue
                denominator = _ZERO
                for c in range(count):
                    weight = _ZERO if row[c] == _MINUS_INFINITY else expf(row[c] - maximum)
                    weights[c] = weight
                    denominator += weight
                denominator += expf(head_sink[h] - maximum)
                if (denominator == 0 or not np.isfinite(denominator)) and first_invalid[0] < 0:
                    first_invalid = (b, s, h)
                for c in range(count):
                    weights[c] = weights[c] / denominator
    return first_invalid


KERNELS = (softmax_with_sink,)
