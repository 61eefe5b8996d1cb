"""Never written, read from a guard band, and stale: the device left memory as it found it, or copied what
lies outside a buffer.

The runner hands every kernel fresh buffers filled with 0xA5 bytes
(csa_conform.spec.POISON), so an element a kernel never wrote reads
back as that pattern; it surrounds every buffer with guard bands of a byte
of 0xD0..0xDF (csa_conform.device.guards), so an element that holds one was read
from outside a buffer (at the wrong stride or past the end: a write there is
reported as out of bounds); a present_* tensor whose elements still
equal the past_* input they were copied from was not updated.
"""

from __future__ import annotations

import numpy as np

from csa_conform.device.guards import BAND_BYTES
from csa_conform.explain.patterns.findings import (
    GUARD_READ,
    MIN_SUPPORT,
    NEVER_WRITTEN,
    STALE,
    Context,
    Finding,
    coordinates,
    spans,
)
from csa_conform.numerics.bits import equal_bits
from csa_conform.spec import POISON, STATE_THREADING

RUN = 4  # poison bytes in a row that mark a packed record's bytes as unwritten
# Band bytes in a row that mark them as read from outside a buffer: with sixteen band bytes, four equal codes of
# one in a row are common enough in quantized data (E4M3 -8 to -30); eight are not.
BAND_RUN = 8


def poisoned(device: np.ndarray) -> np.ndarray:
    """Elements whose every byte is the poison; for bytes, runs of at least RUN poison bytes."""
    return _filled(device, (POISON,), RUN)


def guarded(device: np.ndarray) -> np.ndarray:
    """Elements whose every byte is one of the guard bands' bytes; for bytes, runs of at least BAND_RUN of one."""
    return _filled(device, BAND_BYTES, BAND_RUN)


def _filled(device: np.ndarray, fills: tuple[int, ...], run: int) -> np.ndarray:
    fills = np.asarray(fills, np.uint8)
    if device.dtype.itemsize > 1:
        lanes = _lanes(device)
        return np.isin(lanes[..., 0], fills) & (lanes == lanes[..., :1]).all(axis=-1)
    flat = device.reshape(-1, device.shape[-1]) if device.ndim else device.reshape(1, 1)
    marked = np.zeros(flat.shape, bool)
    windows = flat.shape[1] - run + 1
    if windows > 0:
        starts = np.isin(flat[:, :windows], fills)
        for k in range(1, run):
            starts &= flat[:, k: k + windows] == flat[:, :windows]
        for k in range(run):
            marked[:, k: k + windows] |= starts
    return marked.reshape(device.shape)


def _lanes(device: np.ndarray) -> np.ndarray:
    """Each element's bytes along a new last axis."""
    return np.ascontiguousarray(device).view(np.uint8).reshape(device.shape + (device.dtype.itemsize,))


def _bytes_found(device: np.ndarray, marked: np.ndarray) -> str:
    """The fill bytes the marked elements hold (one byte repeated), as the headline names them."""
    return ", ".join(f"0x{int(byte):02X}" for byte in np.unique(_lanes(device)[..., 0][marked]))


def _where(mask: np.ndarray, axes: tuple[str, ...]) -> dict:
    """For each axis except the last, the indices that hold a marked element."""
    found = {}
    for axis, name in enumerate(axes[:-1]):
        others = tuple(i for i in range(mask.ndim) if i != axis)
        hit = np.flatnonzero(mask.any(axis=others))
        if hit.size < mask.shape[axis]:
            found[name] = spans(hit)
    return found


def _marked(mask: np.ndarray, differ: np.ndarray, shape, axes) -> tuple[int, int, str, dict, str] | None:
    """(count, differing, first coordinates, where per axis, where as words) of the differing elements ``mask``
    marks, or None when it marks none."""
    marked = mask & differ
    count = int(np.count_nonzero(marked))
    if not count:
        return None
    where = _where(marked, axes)
    places = "; ".join(f"{axis} {indices}" for axis, indices in where.items())
    first = coordinates(int(np.flatnonzero(marked)[0]), shape, axes)
    return count, int(np.count_nonzero(differ)), first, where, f", at {places}" if places else ""


def never_written(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    found = _marked(poisoned(actual), differ, actual.shape, axes)
    if found is None:
        return None
    count, differing, first, where, at = found
    # poison in an output is memory no launch wrote: these elements, or a place the kernel copied them from
    headline = (f"{tensor}: {count:,} of {differing:,} differing elements hold the runner's 0x{POISON:02X} poison "
                f"(uninitialised memory: never written, or copied from memory never written){at}; first at {first}")
    return Finding(NEVER_WRITTEN, stage, tensor, headline, count, differing,
                   {"pattern": f"0x{POISON:02X}", "poisoned": count, "first": first, "where": where})


def guard_read(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    """Differing elements that hold a guard band's byte: read from outside a buffer (copied, or a sum that a
    guard value of -2.8e10 or less absorbed)."""
    banded = guarded(actual)
    found = _marked(banded, differ, actual.shape, axes)
    if found is None:
        return None
    count, differing, first, where, at = found
    pattern = _bytes_found(actual, banded & differ)
    headline = (f"{tensor} holds the runner's guard-band bytes ({pattern}) in {count:,} of {differing:,} "
                f"differing elements{at}: the kernel read them from outside a buffer (at a wrong offset or past an "
                f"end); first at {first}")
    return Finding(GUARD_READ, stage, tensor, headline, count, differing,
                   {"pattern": pattern, "copied": count, "first": first, "where": where})


def stale(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    """A present_* tensor whose differing rows are, whole and bit for bit, its past_* input's (copied, not
    updated): claimed only when the copy reproduces every element of those rows, rests on at least MIN_SUPPORT
    elements, and the kept values are not ones the reference computes in that tensor too (a carry written from
    the wrong slot holds past values by coincidence)."""
    past_name = STATE_THREADING.get(tensor)
    past = context.inputs.get(past_name) if past_name else None
    if past is None:
        return None
    past = np.asarray(past)
    if past.dtype != actual.dtype or past.ndim != actual.ndim or past.ndim < 2 or past.shape[2:] != actual.shape[2:] \
            or past.shape[0] != actual.shape[0]:
        return None
    rows = min(past.shape[1], actual.shape[1])
    if rows == 0:
        return None
    window = differ[:, :rows]
    same_as_past = equal_bits(actual[:, :rows], past[:, :rows])
    kept = same_as_past & window & ~equal_bits(expected[:, :rows], past[:, :rows])
    count = int(np.count_nonzero(kept))
    differing = int(np.count_nonzero(differ))
    if count < max(MIN_SUPPORT, differing // 2):
        return None
    # the copy reproduces its rows whole: every element of a (b, slot) row holding a kept value is past's
    trailing = tuple(range(2, kept.ndim))
    touched = kept.any(axis=trailing) if trailing else kept
    whole = same_as_past.all(axis=trailing) if trailing else same_as_past
    if not whole[touched].all():
        return None
    if _computed_elsewhere(expected, actual, kept) * 2 >= count:
        return None
    where = _where(np.pad(kept, [(0, 0), (0, actual.shape[1] - rows)] + [(0, 0)] * (actual.ndim - 2)), axes)
    places = "; ".join(f"{axis} {indices}" for axis, indices in where.items())
    headline = (f"{tensor} is stale: {count:,} of {differing:,} differing elements still hold {past_name}'s values, "
                f"their rows whole and bit for bit (this step's update is not there: left as they were, or rewritten "
                f"from {past_name}){', at ' + places if places else ''}")
    return Finding(STALE, stage, tensor, headline, count, differing, {"source": past_name, "kept": count,
                                                                       "where": where})


def _computed_elsewhere(expected: np.ndarray, actual: np.ndarray, kept: np.ndarray) -> int:
    """Kept elements whose value the reference computes at another slot of the same batch row and trailing
    place: a write from the wrong slot, as likely as no write at all."""
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[expected.dtype.itemsize]
    columns = np.moveaxis(np.ascontiguousarray(expected).view(width), 1, -1)  # [b, ..., slot]
    device = np.ascontiguousarray(actual[:, :kept.shape[1]]).view(width)
    index = np.nonzero(kept)
    values = device[index]
    owner = (index[0],) + tuple(index[2:])
    found = 0
    for start in range(0, values.size, 4096):
        chunk = slice(start, start + 4096)
        lines = columns[tuple(axis[chunk] for axis in owner)]  # [n, slots]
        same = lines == values[chunk, None]
        same[np.arange(same.shape[0]), index[1][chunk]] = False
        found += int(same.any(axis=-1).sum())
    return found
