"""Stage payloads whose largest tensors are computed only when something reads them.

``logical_records`` and ``logical_keys`` decode the whole present cache: at
2^20 tokens 262,144 records, 640 MiB, of which a decode step reads 512. The
stages that need records decode just those (scoring reads the packed keys,
attention the rows its candidates name), so the payload decodes the cache on
first access instead: a golden file that stores the decoded caches, a diff
and verify read them and get the same bytes, and a long step that never
asks for them never pays for them. Attention's scores of a long prefill
(1.25 GiB at S = 8192, N = 64) are the same kind of tensor: recomputed on
first read, bit for bit, rather than held
(csa_conform.oracle.sparse_sink_softmax_attention.HELD_SCORES_BYTES).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, Iterator

import numpy as np


class StagePayload(Mapping):
    """Tensors by name, in a fixed order; ``deferred`` ones are built by their function on first read."""

    def __init__(self, tensors: dict[str, np.ndarray], deferred: dict[str, Callable[[], np.ndarray]],
                 order: tuple[str, ...] | None = None):
        self._tensors = dict(tensors)
        self._deferred = dict(deferred)
        self._order = order or tuple(tensors) + tuple(deferred)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._tensors:
            build = self._deferred[name]
            self._tensors[name] = build()
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def built(self) -> dict[str, np.ndarray]:
        """The tensors held now: the eager ones and the deferred ones something has read."""
        return dict(self._tensors)
