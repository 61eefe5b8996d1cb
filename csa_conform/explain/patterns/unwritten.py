"""Never written and stale: the device left memory as it found it.

The runner hands every kernel fresh buffers filled with 0xA5 bytes
(csa_conform.spec.POISON), so an element a kernel never wrote reads
back as that pattern; a present_* tensor whose elements still equal the
past_* input they were copied from was not updated.
"""

from __future__ import annotations

import numpy as np

from csa_conform.explain.patterns.findings import NEVER_WRITTEN, STALE, Context, Finding, coordinates, spans
from csa_conform.numerics.bits import equal_bits
from csa_conform.spec import POISON, STATE_THREADING

RUN = 4  # poison bytes in a row that mark a packed record's bytes as unwritten


def _poisoned(device: np.ndarray) -> np.ndarray:
    """Elements whose every byte is the poison; for bytes, runs of at least RUN poison bytes."""
    if device.dtype.itemsize > 1:
        width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[device.dtype.itemsize]
        pattern = int.from_bytes(bytes([POISON]) * device.dtype.itemsize, "little")
        return device.view(width) == pattern
    byte = device == POISON
    flat = byte.reshape(-1, byte.shape[-1]) if byte.ndim else byte.reshape(1, 1)
    marked = np.zeros_like(flat)
    for offset in range(RUN):
        window = np.ones_like(flat)
        for k in range(RUN):
            shifted = np.zeros_like(flat)
            start = k - offset
            if start >= 0:
                shifted[:, : flat.shape[1] - start] = flat[:, start:]
            else:
                shifted[:, -start:] = flat[:, : flat.shape[1] + start]
            window &= shifted
        marked |= window
    return marked.reshape(byte.shape)


def _where(mask: np.ndarray, axes: tuple[str, ...]) -> dict:
    """For each axis except the last, the indices that hold a marked element."""
    found = {}
    for axis, name in enumerate(axes[:-1]):
        others = tuple(i for i in range(mask.ndim) if i != axis)
        hit = np.flatnonzero(mask.any(axis=others))
        if hit.size < mask.shape[axis]:
            found[name] = spans(hit)
    return found


def never_written(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    poisoned = _poisoned(actual) & differ
    count = int(np.count_nonzero(poisoned))
    if not count:
        return None
    differing = int(np.count_nonzero(differ))
    first = int(np.flatnonzero(poisoned)[0])
    where = _where(poisoned, axes)
    places = "; ".join(f"{axis} {indices}" for axis, indices in where.items())
    headline = (f"{tensor} was never written: {count:,} of {differing:,} differing elements still hold the runner's "
                f"0x{POISON:02X} poison (uninitialised memory){', at ' + places if places else ''}; "
                f"first at {coordinates(first, actual.shape, axes)}")
    return Finding(NEVER_WRITTEN, stage, tensor, headline, count, differing,
                   {"pattern": f"0x{POISON:02X}", "poisoned": count, "first": coordinates(first, actual.shape, axes),
                    "where": where})


def stale(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    """A present_* tensor whose differing elements equal its past_* input there (copied, not updated)."""
    past_name = STATE_THREADING.get(tensor)
    past = context.inputs.get(past_name) if past_name else None
    if past is None:
        return None
    past = np.asarray(past)
    if past.dtype != actual.dtype or past.ndim != actual.ndim or past.shape[2:] != actual.shape[2:]:
        return None
    rows = min(past.shape[1], actual.shape[1])
    if rows == 0:
        return None
    window = differ[:, :rows]
    kept = equal_bits(actual[:, :rows], past[:, :rows]) & window & ~equal_bits(expected[:, :rows], past[:, :rows])
    count = int(np.count_nonzero(kept))
    differing = int(np.count_nonzero(differ))
    if count < max(1, differing // 2):
        return None
    where = _where(np.pad(kept, [(0, 0), (0, actual.shape[1] - rows)] + [(0, 0)] * (actual.ndim - 2)), axes)
    places = "; ".join(f"{axis} {indices}" for axis, indices in where.items())
    headline = (f"{tensor} is stale: {count:,} of {differing:,} differing elements still hold {past_name}'s values "
                f"(copied through, never updated){', at ' + places if places else ''}")
    return Finding(STALE, stage, tensor, headline, count, differing, {"source": past_name, "kept": count,
                                                                       "where": where})
