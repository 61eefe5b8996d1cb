"""Bit-exact comparison of two payload sets (oracle vs golden, device vs oracle).

Equality is equality of bit patterns, never a tolerance: a -0 for +0, a NaN
payload or one code step of an FP8 byte is a divergence. ``ulp=N`` relaxes
float tensors only; packed records and integer indices stay exact because one
code step there is a different quantized value or a different record.
Every result is a plain dataclass with ``to_dict()`` so ``--json`` output and
CI artefacts come for free.
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np

from csa_conform.compare.placement import log2_histogram, mismatch_heatmap
from csa_conform.compare.specials import Scan, scan
from csa_conform.numerics.bf16 import bf16_to_f32
from csa_conform.numerics.bits import ordered, ulp_distance, unsigned
from csa_conform.numerics.e8m0 import e8m0_decode
from csa_conform.numerics.fp4 import FP4_BLOCK, e2m1_decode
from csa_conform.numerics.fp8 import FP8_BLOCK, e4m3_decode
from csa_conform.numerics.records import FP4_RECORD_BYTES, FP8_BLOCKS, FP8_RECORD_BYTES
from csa_conform.spec import payload_axes

__all__ = ["TensorDiff", "compare_payloads", "compare_tensor", "default_axes"]

# How many differing bytes / rows a diff lists: enough to see a pattern,
# small enough for a terminal and a JSON artefact.
LISTED = 16

def default_axes(stage: str, tensor: str, shape: tuple, dtype) -> tuple[str, ...]:
    """Axis names of a payload tensor (the registry's), generic a0.. when unknown.

    The attention bias broadcasts from the right onto [b, h, s, c], so its
    names are the trailing ones; a packed u8 record's last axis is a byte.
    """
    names = payload_axes(stage, tensor)
    rank = len(shape)
    if tensor == "attention_bias" and names and rank <= len(names):
        return names[len(names) - rank :]
    if names is None or len(names) != rank:
        return tuple(f"a{axis}" for axis in range(rank))
    if np.dtype(dtype) == np.uint8 and names[-1] == "d":
        return names[:-1] + ("byte",)
    return names


@dataclass
class TensorDiff:
    """The comparison of one tensor; ``passed`` is the verdict, the rest explains it."""

    stage: str
    tensor: str
    shape: tuple[int, ...]
    dtype: str
    axes: tuple[str, ...]
    passed: bool
    total: int = 0
    mismatches: int = 0
    failures: int = 0
    ulp_tolerance: int = 0
    problem: str | None = None
    first: dict | None = None
    ulp: dict | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    specials: dict | None = None
    records: dict | None = None
    rows: dict | None = None
    heatmap: dict | None = None  # where the mismatches sit (csa_conform.compare.placement), for report --html
    histogram: dict | None = None  # log2 histogram of the ULP distances of differing floats

    def to_dict(self) -> dict:
        return {
            "stage": self.stage,
            "tensor": self.tensor,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "axes": list(self.axes),
            "passed": self.passed,
            "total": self.total,
            "mismatches": self.mismatches,
            "failures": self.failures,
            "ulp_tolerance": self.ulp_tolerance,
            "problem": self.problem,
            "first": self.first,
            "ulp": self.ulp,
            "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error,
            "specials": self.specials,
            "records": self.records,
            "rows": self.rows,
            "heatmap": self.heatmap,
            "histogram": self.histogram,
        }

    def summary(self) -> str:
        """One line naming the tensor, how much differs and the first differing element."""
        where = f"{self.stage}/{self.tensor}"
        if self.problem:
            return f"{where}: {self.problem}"
        if not self.mismatches:
            return f"{where}: identical ({self.total} elements)"
        text = f"{where}: {self.failures}/{self.total} elements differ"
        if self.failures != self.mismatches:
            text = (
                f"{where}: {self.failures}/{self.total} elements beyond {self.ulp_tolerance} ulp "
                f"({self.mismatches} differ in bits)"
            )
        if self.ulp:
            text += f" (max {self.ulp['max']} ulp)"
        first = self.first
        text += (
            f"; first at {first['coords'] or 'scalar'}: expected {first['expected']} "
            f"[{first['expected_bits']}], actual {first['actual']} [{first['actual_bits']}]"
        )
        return text


def compare_tensor(
    expected,
    actual,
    *,
    stage: str,
    tensor: str,
    axes: tuple[str, ...] | None = None,
    ulp: int = 0,
) -> TensorDiff:
    """Compare two arrays bit for bit; ``ulp`` relaxes float tensors only."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if axes is None:
        axes = default_axes(stage, tensor, expected.shape, expected.dtype)
    result = TensorDiff(
        stage=stage,
        tensor=tensor,
        shape=tuple(int(extent) for extent in expected.shape),
        dtype=str(expected.dtype),
        axes=tuple(axes),
        passed=False,
        total=int(expected.size),
        ulp_tolerance=int(ulp) if expected.dtype.kind == "f" else 0,
    )
    if expected.dtype != actual.dtype:
        result.problem = f"dtype differs: expected {expected.dtype}, actual {actual.dtype}"
        return result
    if expected.shape != actual.shape:
        result.problem = f"shape differs: expected {list(expected.shape)}, actual {list(actual.shape)}"
        return result
    if expected.dtype.kind == "f":
        scanned = scan(expected, actual)  # equality and special values in one pass
        if scanned.equal:
            return _identical(result, scanned)
    expected_bits, actual_bits = unsigned(expected), unsigned(actual)
    if expected.dtype.kind != "f" and np.array_equal(expected_bits, actual_bits):
        return _identical(result, None)
    differ = expected_bits != actual_bits
    failing = differ
    if expected.dtype.kind == "f":
        distance = ulp_distance(expected_bits, actual_bits)
        unordered = np.isnan(expected) | np.isnan(actual)
        if result.ulp_tolerance:
            failing = differ & (unordered | (distance > result.ulp_tolerance))
        _float_statistics(result, expected, actual, distance, unordered)
        result.histogram = log2_histogram(distance[differ & ~unordered])
    result.mismatches = int(np.count_nonzero(differ))
    result.failures = int(np.count_nonzero(failing))
    result.passed = result.failures == 0
    if not result.mismatches:
        return result
    result.heatmap = mismatch_heatmap(differ, result.axes, expected.dtype)
    flat = int(np.flatnonzero(failing if result.failures else differ)[0])
    result.first = _element(expected, actual, expected_bits, actual_bits, flat, result.axes)
    if expected.dtype == np.uint8 and expected.ndim and expected.shape[-1] in _RECORD_FORMATS:
        result.records = _record_bytes(expected, actual, differ, result.axes)
    elif expected.dtype.kind in "iu" and expected.ndim:
        result.rows = _int_rows(expected, actual, differ, result.axes)
    return result


def compare_payloads(
    expected: Mapping[str, Mapping[str, np.ndarray]],
    actual: Mapping[str, Mapping[str, np.ndarray]],
    *,
    ulp: int = 0,
) -> list[TensorDiff]:
    """Compare stage -> tensor -> array maps; a tensor present on one side only diverges.

    A stage payload is often the very array of a later stage and of an output on both sides (Y is
    attention's, writeback's and the output's): a pair of arrays found identical is compared once.
    """
    diffs = []
    identical: dict[tuple[int, int], TensorDiff] = {}
    stages = list(expected) + [stage for stage in actual if stage not in expected]
    for stage in stages:
        left, right = expected.get(stage, {}), actual.get(stage, {})
        tensors = list(left) + [name for name in right if name not in left]
        for name in tensors:
            if name not in right or name not in left:
                diffs.append(_missing(stage, name, left.get(name), right.get(name)))
                continue
            pair = (id(left[name]), id(right[name]))
            earlier = identical.get(pair)
            if earlier is not None and earlier.axes == default_axes(stage, name, np.shape(left[name]),
                                                                   np.asarray(left[name]).dtype):
                diffs.append(replace(earlier, stage=stage, tensor=name, specials=deepcopy(earlier.specials),
                                     ulp=deepcopy(earlier.ulp)))
                continue
            diff = compare_tensor(left[name], right[name], stage=stage, tensor=name, ulp=ulp)
            if diff.passed and not diff.mismatches:
                identical[pair] = diff
            diffs.append(diff)
    return diffs


# --- bit patterns and ULP --------------------------------------------------------------

def _identical(result: TensorDiff, scanned: Scan | None) -> TensorDiff:
    """The statistics of bit-identical tensors, without distances (what verify sees almost always).

    They are what ``_float_statistics`` gives when nothing differs: every
    ordered pair 0 ULP apart, NaN pairs counted, no error. ``scanned`` is the
    float tensors' scan (None for other dtypes).
    """
    result.passed = True
    if scanned is not None:
        nan_pairs = scanned.nan
        result.ulp = {"max": 0, "0": result.total - nan_pairs, "1": 0, "2": 0, ">2": 0, "nan_pairs": nan_pairs}
        result.max_abs_error = 0.0
        result.max_rel_error = 0.0
        specials = scanned.specials()
        result.specials = {"expected": specials, "actual": dict(specials)}
    return result


def _float_statistics(result, expected, actual, distance, unordered) -> None:
    ordered = distance[~unordered]
    result.ulp = {
        "max": int(ordered.max()) if ordered.size else 0,
        "0": int(np.count_nonzero(ordered == 0)),
        "1": int(np.count_nonzero(ordered == 1)),
        "2": int(np.count_nonzero(ordered == 2)),
        ">2": int(np.count_nonzero(ordered > 2)),
        "nan_pairs": int(np.count_nonzero(unordered)),
    }
    finite = np.isfinite(expected) & np.isfinite(actual)
    error = np.abs(expected[finite].astype(np.float64) - actual[finite].astype(np.float64))
    reference = np.abs(expected[finite].astype(np.float64))
    result.max_abs_error = float(error.max()) if error.size else 0.0
    relative = error[reference > 0] / reference[reference > 0]
    result.max_rel_error = float(relative.max()) if relative.size else 0.0
    result.specials = {"expected": scan(expected).specials(), "actual": scan(actual).specials()}


# --- describing elements -----------------------------------------------------------------


def _coords(flat: int, shape: tuple, axes: tuple[str, ...]) -> str:
    index = np.unravel_index(flat, shape) if shape else ()
    return " ".join(f"{name}={int(i)}" for name, i in zip(axes, index))


def _value(scalar) -> float | int | str:
    """A JSON-safe value: ints and finite floats as numbers (shortest digits), specials as strings."""
    if isinstance(scalar, (np.floating, float)):
        scalar = np.asarray(scalar)[()]
        if np.isnan(scalar):
            return "nan"
        if np.isinf(scalar):
            return "inf" if scalar > 0 else "-inf"
        return float(np.format_float_positional(scalar, unique=True, trim="-"))
    return int(scalar)


def _hex(bits) -> str:
    width = 2 * np.asarray(bits).dtype.itemsize
    return f"0x{int(bits):0{width}x}"


def _element(expected, actual, expected_bits, actual_bits, flat, axes) -> dict:
    e_bits, a_bits = expected_bits.reshape(-1)[flat], actual_bits.reshape(-1)[flat]
    element = {
        "index": flat,
        "coords": _coords(flat, expected.shape, axes),
        "expected": _value(expected.reshape(-1)[flat]),
        "actual": _value(actual.reshape(-1)[flat]),
        "expected_bits": _hex(e_bits),
        "actual_bits": _hex(a_bits),
    }
    if expected.dtype.kind == "f":
        pair = np.array([e_bits, a_bits])
        element["ulp"] = int(abs(np.diff(ordered(pair))[0]))
    return element


def _missing(stage: str, name: str, expected, actual) -> TensorDiff:
    present = expected if expected is not None else actual
    present = np.asarray(present)
    side = "actual" if expected is not None else "expected"
    return TensorDiff(
        stage=stage,
        tensor=name,
        shape=tuple(int(extent) for extent in present.shape),
        dtype=str(present.dtype),
        axes=default_axes(stage, name, present.shape, present.dtype),
        passed=False,
        total=int(present.size),
        problem=f"missing in {side}",
    )


# --- packed records --------------------------------------------------------------------

_FP8_BLOCK_BYTES = FP8_BLOCK + 1
_FP8_TAIL = _FP8_BLOCK_BYTES * FP8_BLOCKS
_FP4_BLOCK_BYTES = FP4_BLOCK // 2 + 1
_RECORD_FORMATS = {FP8_RECORD_BYTES: "fp8_e4m3_block64", FP4_RECORD_BYTES: "fp4_e2m1_block32"}


def _record_bytes(expected, actual, differ, axes) -> dict:
    """Mismatching bytes of 583-byte FP8 hybrid or 68-byte FP4 records, decoded."""
    width = expected.shape[-1]
    lead_axes = axes[:-1]
    records_expected = expected.reshape(-1, width)
    records_actual = actual.reshape(-1, width)
    differ_rows = differ.reshape(-1, width)
    decode = _fp8_byte if width == FP8_RECORD_BYTES else _fp4_byte
    listed = []
    for flat in np.flatnonzero(differ_rows)[:LISTED]:
        record, offset = divmod(int(flat), width)
        entry = {"record": _coords(record, expected.shape[:-1], lead_axes), "byte": offset}
        entry.update(decode(records_expected[record], records_actual[record], offset))
        listed.append(entry)
    return {
        "format": _RECORD_FORMATS[width],
        "records_differing": int(np.count_nonzero(differ_rows.any(axis=1))),
        "bytes_differing": int(np.count_nonzero(differ_rows)),
        "bytes": listed,
    }


def _code_steps(expected_code: int, actual_code: int, sign_bit: int) -> int:
    """Distance in representable values between two sign-magnitude codes."""

    def ordered(code: int) -> int:
        magnitude = code & (sign_bit - 1)
        return -magnitude - 1 if code & sign_bit else magnitude

    return abs(ordered(expected_code) - ordered(actual_code))


def _fp8_byte(expected: np.ndarray, actual: np.ndarray, offset: int) -> dict:
    if offset >= _FP8_TAIL:
        pair = (offset - _FP8_TAIL) // 2
        start = _FP8_TAIL + 2 * pair
        values = [
            bf16_to_f32(record[start : start + 2].view("<u2").astype(np.uint16))[0]
            for record in (expected, actual)
        ]
        return {
            "field": "rope_bf16",
            "dim": FP8_BLOCKS * FP8_BLOCK + pair,
            "expected_byte": int(expected[offset]),
            "actual_byte": int(actual[offset]),
            "expected_value": _value(values[0]),
            "actual_value": _value(values[1]),
        }
    block, within = divmod(offset, _FP8_BLOCK_BYTES)
    scale_offset = block * _FP8_BLOCK_BYTES
    e_scale, a_scale = (e8m0_decode(record[scale_offset]) for record in (expected, actual))
    e_byte, a_byte = int(expected[offset]), int(actual[offset])
    if within == 0:
        return {
            "field": "scale",
            "block": block,
            "expected_byte": e_byte,
            "actual_byte": a_byte,
            "expected_value": _value(e_scale),
            "actual_value": _value(a_scale),
            "power_steps": abs(e_byte - a_byte),
        }
    with np.errstate(over="ignore", invalid="ignore"):
        e_value = np.float32(e4m3_decode(e_byte) * e_scale)
        a_value = np.float32(e4m3_decode(a_byte) * a_scale)
    return {
        "field": "code",
        "block": block,
        "dim": block * 64 + within - 1,
        "expected_byte": e_byte,
        "actual_byte": a_byte,
        "expected_value": _value(e_value),
        "actual_value": _value(a_value),
        "code_steps": _code_steps(e_byte, a_byte, 0x80),
    }


def _fp4_byte(expected: np.ndarray, actual: np.ndarray, offset: int) -> dict:
    block, within = divmod(offset, _FP4_BLOCK_BYTES)
    scale_offset = block * _FP4_BLOCK_BYTES
    e_scale, a_scale = (e8m0_decode(record[scale_offset]) for record in (expected, actual))
    e_byte, a_byte = int(expected[offset]), int(actual[offset])
    if within == 0:
        return {
            "field": "scale",
            "block": block,
            "expected_byte": e_byte,
            "actual_byte": a_byte,
            "expected_value": _value(e_scale),
            "actual_value": _value(a_scale),
            "power_steps": abs(e_byte - a_byte),
        }

    def nibbles(byte: int, scale) -> list:
        codes = (byte & 0x0F, byte >> 4)
        with np.errstate(over="ignore", invalid="ignore"):
            return [_value(np.float32(e2m1_decode(code) * scale)) for code in codes]

    low_dim = block * 32 + 2 * (within - 1)
    return {
        "field": "codes",
        "block": block,
        "dims": [low_dim, low_dim + 1],
        "expected_byte": e_byte,
        "actual_byte": a_byte,
        "expected_value": nibbles(e_byte, e_scale),
        "actual_value": nibbles(a_byte, a_scale),
        "code_steps": [
            _code_steps(e_byte & 0x0F, a_byte & 0x0F, 0x8),
            _code_steps(e_byte >> 4, a_byte >> 4, 0x8),
        ],
    }


# --- integer indices -------------------------------------------------------------------


def _int_rows(expected, actual, differ, axes) -> dict:
    """Differing rows (last axis) of an index tensor: a selection or candidate list."""
    width = expected.shape[-1]
    rows_expected = expected.reshape(-1, width)
    rows_actual = actual.reshape(-1, width)
    differing = np.flatnonzero(differ.reshape(-1, width).any(axis=1))
    listed = [
        {
            "row": _coords(int(row), expected.shape[:-1], axes[:-1]),
            "expected": rows_expected[row].tolist(),
            "actual": rows_actual[row].tolist(),
        }
        for row in differing[:LISTED]
    ]
    return {"rows_differing": int(differing.size), "rows": listed}

