"""Value classes at the differing elements: what the reference and the device hold where they differ.

For every differing tensor, each differing element's reference value and
device value get a class (−inf, ±0, subnormal, NaN, the format's saturated
maximum, index −1; per code format the E4M3 zero and subnormal codes, the
E2M1 zero, the E8M0 scale byte) and the pair a relation when one holds
(the sign flipped, a power-of-two ratio, the reference's value rounded to
bf16 to nearest or toward zero, a few units in the last place apart, the
device's value equal to another element of the reference's row, and which
one: these last two stated on at least MIN_SUPPORT elements, since a few
values repeat or land on a bf16 number by coincidence), and, where neither
covers a part, the device holding one magnitude at every differing element
(a clamp or a fill at one value; on at least MIN_SUPPORT elements). Packed
records are split into their parts (scale bytes, codes or nibbles, the bf16
RoPE tail) first.
These are observations: always true, often the bug's name ("the device holds
code 0x00 where the reference holds a subnormal E4M3 code, 14 of 14"). A
statement is made when one pair of classes, or one relation, covers every
differing element of a part; the rest is listed as counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from csa_conform.explain.claims import OBSERVATION, Claim
from csa_conform.explain.patterns.findings import MIN_SUPPORT, comparable
from csa_conform.numerics.bf16 import bf16_round
from csa_conform.numerics.bits import differing_bits
from csa_conform.numerics.fp4 import e2m1_decode
from csa_conform.numerics.fp8 import e4m3_decode
from csa_conform.numerics.records import FP4_RECORD_BYTES, FP8_BLOCK_BYTES, FP8_BLOCKS, FP8_RECORD_BYTES

NORMAL = "a normal value"
FLT_MAX = np.finfo(np.float32).max
MOST_PAIRS = 3  # class pairs listed when none covers a part
# relations, each with its one parameter after the prefix (an exponent step, a power, an offset along the row)
POWER = "scale exponent "
RATIO = "ratio 2^"
SIGN = "sign flipped"
# the device's value is the reference's rounded to bf16: to nearest (ties to even), toward zero, or either (the same)
BF16_NEAREST, BF16_TRUNCATED, BF16_EITHER = "bf16 to nearest", "bf16 toward zero", "bf16 either way"
ELSEWHERE = "elsewhere in the row "
ULPS = "ulps "  # the device's value this many units in the last place from the reference's (same sign, finite)
MOST_ULPS = 8  # a distance stated as rounding-level: at most this many units in the last place
DISTINCT = 0.9  # rows whose values are at least this share distinct say something by holding a value elsewhere
CHUNK = 1 << 22  # row elements compared at once when looking for the device's value elsewhere in the row


@dataclass(frozen=True)
class Part:
    """One part of a tensor, each element of one format: ``f32``, ``e4m3``, ``e2m1``, ``e8m0`` or ``int``."""

    name: str
    form: str
    expected: np.ndarray  # [rows, width]
    actual: np.ndarray


def parts(tensor: str, expected: np.ndarray, actual: np.ndarray) -> list[Part]:
    """The tensor as parts of one format each: a packed record's scale bytes, codes and tail apart."""
    if expected.dtype == np.uint8 and expected.ndim >= 2 and expected.shape[-1] in (FP8_RECORD_BYTES, FP4_RECORD_BYTES):
        lead = expected.shape[:-1]
        if expected.shape[-1] == FP8_RECORD_BYTES:
            head = FP8_BLOCKS * FP8_BLOCK_BYTES

            def split(records):
                blocks = records[..., :head].reshape(lead + (FP8_BLOCKS, FP8_BLOCK_BYTES))
                tail = np.ascontiguousarray(records[..., head:]).view("<u2").astype(np.uint32) << 16
                return blocks[..., 0], blocks[..., 1:], tail.view(np.float32)
            (es, ec, et), (ds, dc, dt) = split(expected), split(actual)
            return [Part(f"{tensor} E8M0 scale bytes", "e8m0", _rows(es), _rows(ds)),
                    Part(f"{tensor} E4M3 codes", "e4m3", _rows(ec), _rows(dc)),
                    Part(f"{tensor} bf16 RoPE tail", "f32", _rows(et), _rows(dt))]

        def nibbles(records):
            blocks = records.reshape(lead + (4, 17))
            packed = blocks[..., 1:]
            return blocks[..., 0], np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(lead + (4, 32))
        (es, ec), (ds, dc) = nibbles(expected), nibbles(actual)
        return [Part(f"{tensor} E8M0 scale bytes", "e8m0", _rows(es), _rows(ds)),
                Part(f"{tensor} E2M1 codes", "e2m1", _rows(ec), _rows(dc))]
    if expected.dtype == np.float32:
        return [Part(tensor, "f32", _rows(expected), _rows(actual))]
    if expected.dtype.kind in "iu":
        return [Part(tensor, "int", _rows(expected), _rows(actual))]
    return []


def _rows(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    return array.reshape(-1, array.shape[-1]) if array.ndim else array.reshape(1, 1)


def classes(values: np.ndarray, form: str) -> np.ndarray:
    """The class of each value, as words."""
    out = np.full(values.shape, NORMAL, dtype=object)
    if form == "f32":
        bits = values.view(np.uint32)
        magnitude = bits & 0x7FFFFFFF
        out[(magnitude < 0x00800000) & (magnitude > 0)] = "a subnormal binary32"
        out[np.abs(values) == FLT_MAX] = "the binary32 maximum"
        out[bits == 0] = "0"
        out[bits == 0x80000000] = "-0"
        out[values == np.inf] = "inf"
        out[values == -np.inf] = "-inf"
        out[np.isnan(values)] = "NaN"
    elif form == "e4m3":
        magnitude = values & 0x7F
        out[:] = "a normal E4M3 code"
        out[(magnitude >> 3) == 0] = "a subnormal E4M3 code"
        out[magnitude == 0x7E] = "the saturated E4M3 maximum (±448)"
        out[magnitude == 0x7F] = "an E4M3 NaN code"
        out[magnitude == 0] = "a zero E4M3 code (0x00 or 0x80)"
    elif form == "e2m1":
        magnitude = values & 0x7
        out[:] = "an E2M1 code"
        out[magnitude == 1] = "an E2M1 subnormal code (±0.5)"
        out[magnitude == 7] = "the E2M1 maximum (±6)"
        out[magnitude == 0] = "an E2M1 zero"
    elif form == "e8m0":
        out[:] = "a scale byte"
    else:
        out[:] = "an index" if values.dtype.kind == "i" else "a value"
        out[values == 0] = "0"
        if values.dtype.kind == "i":
            out[values == -1] = "-1"
    return out


def relations(part: Part, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """The relation of each differing (device, reference) pair, '' where none holds."""
    e, d = part.expected[rows, cols], part.actual[rows, cols]
    out = np.full(e.shape, "", dtype=object)
    if part.form == "e8m0":
        steps = d.astype(np.int64) - e.astype(np.int64)
        for step in np.unique(steps):
            out[steps == step] = f"{POWER}{int(step):+d}"
        return out
    if part.form == "f32":
        with np.errstate(all="ignore"):
            fe, me = np.frexp(e.astype(np.float64))
            fd, md = np.frexp(d.astype(np.float64))
            finite = np.isfinite(e) & np.isfinite(d) & (e != 0) & (d != 0)
            power = finite & (fe == fd) & (me != md)
            out[power] = [f"{RATIO}{int(k)}" for k in (md - me)[power]]
            out[finite & (fe == -fd) & (me == md)] = SIGN
        nearest = bf16_round(e).view(np.uint32) == d.view(np.uint32)
        truncated = (e.view(np.uint32) & 0xFFFF0000) == d.view(np.uint32)
        free = out == ""
        out[free & nearest] = BF16_NEAREST
        out[free & truncated & ~nearest] = BF16_TRUNCATED
        out[free & nearest & truncated] = BF16_EITHER
        _label_ulps(out, e, d)
    elif part.form in ("e4m3", "e2m1"):
        sign = 0x80 if part.form == "e4m3" else 0x8
        out[(d == (e ^ sign)) & ((e & (sign - 1)) != 0)] = SIGN
    # the device's value is another element of the reference's row (which one, when one offset covers all): only
    # where the rows' values are distinct, since a row of codes or of quantized values holds every common value
    left = (out == "") & (part.form in ("f32", "int"))
    if left.any() and _distinct(part.expected[np.unique(rows[left])]) >= DISTINCT:
        row_values = part.expected[rows[left]]
        where = _found_at(row_values, d[left], cols[left], part.form)
        labels = np.full(where.shape, "", dtype=object)
        hit = where >= 0
        offsets = where[hit] - cols[left][hit]
        labels[hit] = [f"{ELSEWHERE}{int(k):+d}" for k in offsets]
        out[left] = labels
    return out


def _label_ulps(out: np.ndarray, e: np.ndarray, d: np.ndarray) -> None:
    """Label the pairs still without a relation that are a few units in the last place apart: in bf16 where both
    values are bf16 numbers (their low half zero), else in binary32; a zero is a class of its own."""
    eb, db = e.view(np.uint32), d.view(np.uint32)
    free = (out == "") & np.isfinite(e) & np.isfinite(d) & (e != 0) & (d != 0) & ((eb >> 31) == (db >> 31))
    bf16 = ((eb | db) & 0xFFFF) == 0
    distance = np.abs(eb.astype(np.int64) - db.astype(np.int64)) >> np.where(bf16, 16, 0)
    near = free & (distance <= MOST_ULPS)
    out[near] = [f"{ULPS}{'bf16' if wide else 'f32'} {int(k)}" for wide, k in zip(bf16[near], distance[near])]


def _distinct(rows: np.ndarray) -> float:
    """The mean share of distinct values in the rows."""
    if not rows.size:
        return 0.0
    ordered = np.sort(rows.view(np.uint32) if rows.dtype == np.float32 else rows, axis=-1)
    distinct = 1 + (ordered[:, 1:] != ordered[:, :-1]).sum(axis=-1)
    return float((distinct / rows.shape[-1]).mean())


def _found_at(rows: np.ndarray, values: np.ndarray, own: np.ndarray, form: str) -> np.ndarray:
    """For each value, the nearest other column of its row that holds it bit for bit (-1: none)."""
    chunk = max(1, CHUNK // max(1, rows.shape[1]))
    if len(values) > chunk:
        return np.concatenate([_found_at(rows[i:i + chunk], values[i:i + chunk], own[i:i + chunk], form)
                               for i in range(0, len(values), chunk)])
    if form == "f32":
        rows, values = rows.view(np.uint32), values.view(np.uint32)
    match = rows == values[:, None]
    match[np.arange(len(own)), own] = False
    fillers = {"int": (0, -1), "e4m3": (0, 0x80), "e2m1": (0, 8), "f32": (0, 0x80000000, 0xFF800000)}
    if form in fillers:  # zeros, -1 and -inf fill rows: their repeating proves nothing
        match &= ~np.isin(values, np.array(fillers[form]).astype(values.dtype))[:, None]
    distance = np.abs(np.arange(rows.shape[1])[None, :] - own[:, None]).astype(np.float64)
    distance[~match] = np.inf
    nearest = np.argmin(distance, axis=1)
    return np.where(np.isfinite(distance[np.arange(len(own)), nearest]), nearest, -1)


def _named(values: np.ndarray, labels: np.ndarray, form: str) -> str:
    """The class of a group of values, or the value itself when they are all one."""
    label = labels[0]
    if label in ("0", "-0", "inf", "-inf", "NaN", "-1"):
        return label
    if np.unique(values.view(np.uint32) if form == "f32" else values).size == 1:
        value = values[0]
        shown = _f32_text(value) if form == "f32" else (
            f"code 0x{int(value):02X}" if form in ("e4m3", "e8m0") else f"code {int(value)}" if form == "e2m1"
            else str(int(value)))
        return f"{shown} ({label})" if form in ("e4m3", "e2m1", "e8m0") and not label.startswith("a zero") else shown
    return label


def _f32_text(value) -> str:
    """A binary32 value as its shortest repr ("0.9375", "-2.8735182e-16")."""
    return f"{np.float32(value)!r}".replace("np.float32(", "").rstrip(")")


def _trivial(reference: str, device: str) -> bool:
    """A pair that says nothing: an ordinary value where the reference holds one of the same class."""
    return reference == device and reference in (NORMAL, "a normal E4M3 code", "an E2M1 code", "a scale byte",
                                                 "an index", "a value")


def _relation(related: np.ndarray) -> str:
    """The one relation every differing element has (its parameter spanned when it varies), '' when none."""
    if not related.size or not all(related):
        return ""
    for prefix, one, several in (
            (POWER, "the scale exponent is the reference's {}", "the scale exponent is the reference's {}"),
            (RATIO, "device = reference × 2^{}", "device = reference × a power of two (2^{})"),
            (ELSEWHERE, "the device holds the reference's value {} places along the row",
             "the device holds a value the reference holds elsewhere in the row ({} places along it)")):
        if all(label.startswith(prefix) for label in related):
            values = sorted({int(label[len(prefix):]) for label in related})
            if len(values) == 1:
                return one.format(f"{values[0]:+d}" if prefix != RATIO else values[0])
            return several.format(", ".join(f"{v:+d}" for v in values[:6]) + (", ..." if len(values) > 6 else ""))
    if all(label.startswith(ULPS) for label in related):
        distances = [label.split() for label in related]  # "ulps", its format, its distance
        formats = {format_ for _, format_, _ in distances}
        if len(formats) > 1:
            return ""
        unit, most = ("bf16" if formats == {"bf16"} else "binary32"), max(int(k) for _, _, k in distances)
        return (f"the device's value is the reference's neighbouring {unit} number (one unit in the last place)"
                if most == 1 else f"the device's value is within {most} units in the last place ({unit}) of the "
                "reference's")
    if all(label == SIGN for label in related):
        return "the device holds the reference's value with its sign flipped"
    if all(label in (BF16_NEAREST, BF16_EITHER) for label in related) and BF16_NEAREST in related:
        return "the device holds the reference's value rounded to bf16 (to nearest, ties to even)"
    if all(label in (BF16_TRUNCATED, BF16_EITHER) for label in related) and BF16_TRUNCATED in related:
        return "the device holds the reference's value truncated to bf16 (rounded toward zero)"
    return ""


def _one_magnitude(e: np.ndarray, d: np.ndarray, form: str) -> str:
    """'the device holds one magnitude, code 0x77 (±240), where the reference's are larger' when every differing
    device value has one magnitude (a clamp or a fill; its sign too where every one has the same), '' otherwise;
    zeros, infinities and NaNs are classes."""
    if form == "f32":
        magnitude = d.view(np.uint32) & 0x7FFFFFFF
        theirs = e.view(np.uint32) & 0x7FFFFFFF
        if magnitude[0] == 0 or magnitude[0] >= 0x7F800000:
            return ""
        same_sign = np.all(d.view(np.uint32) == d.view(np.uint32)[0])
        shown = _f32_text(d[0]) if same_sign else f"±{_f32_text(np.abs(d[0]))}"
    elif form in ("e4m3", "e2m1"):
        mask, decode = (0x7F, e4m3_decode) if form == "e4m3" else (0x7, e2m1_decode)
        magnitude, theirs = d & mask, e & mask
        if magnitude[0] == 0 or (form == "e4m3" and magnitude[0] == 0x7F):
            return ""
        same_sign = np.all(d == d[0])
        code = int(d[0]) if same_sign else int(magnitude[0])
        shown = f"code 0x{code:02X} ({'' if same_sign else '±'}{float(decode(np.uint8(code))):g})"
    else:
        return ""
    if np.any(magnitude != magnitude[0]):
        return ""
    nan = 0x7F800000 if form == "f32" else 0x7E if form == "e4m3" else 0x7  # magnitudes above it are NaNs
    ordered = not np.any(theirs > nan)  # a NaN has no order
    larger = ordered and np.all(theirs > magnitude[0])
    smaller = ordered and np.all(theirs < magnitude[0])
    where = " where the reference's are larger" if larger else " where the reference's are smaller" if smaller else ""
    return f"the device holds one magnitude, {shown}, at every differing element{where}"


def part_claims(part: Part) -> tuple[list[Claim], list[str]]:
    """(the covering statements as observation claims, the counts of the other class pairs as lines)."""
    differ = differing_bits(part.expected, part.actual)
    rows, cols = np.nonzero(differ)
    n = rows.size
    if not n:
        return [], []
    e, d = part.expected[rows, cols], part.actual[rows, cols]
    ce, cd = classes(e, part.form), classes(d, part.form)
    related = relations(part, rows, cols)
    claims: list[Claim] = []
    pairs: dict[tuple[str, str], int] = {}
    for pair in zip(ce, cd):
        pairs[pair] = pairs.get(pair, 0) + 1
    if len(pairs) == 1:
        (reference, device), = pairs
        if not _trivial(reference, device):
            claims.append(Claim(f"{part.name}: the device holds {_named(d, cd, part.form)} where the reference holds "
                                f"{_named(e, ce, part.form)}, {n:,} of {n:,}", OBSERVATION, n,
                                {"part": part.name, "reference": reference, "device": device, "elements": n}))
    relation = _relation(related)
    if relation and (n >= MIN_SUPPORT or not related[0].startswith((ELSEWHERE, "bf16"))):  # a few: coincidence
        claims.append(Claim(f"{part.name}: {relation}, {n:,} of {n:,}", OBSERVATION, n,
                            {"part": part.name, "relation": relation, "elements": n}))
    one = _one_magnitude(e, d, part.form) if not claims and n >= MIN_SUPPORT else ""
    if one:
        claims.append(Claim(f"{part.name}: {one}, {n:,} of {n:,}", OBSERVATION, n,
                            {"part": part.name, "relation": one, "elements": n}))
    lines = []
    if not claims and not all(_trivial(*pair) for pair in pairs):
        ranked = sorted(pairs.items(), key=lambda item: -item[1])[:MOST_PAIRS]
        lines.append(f"{part.name}: " + "; ".join(f"{count:,} of {n:,} hold {device} where the reference holds "
                                                  f"{reference}" for (reference, device), count in ranked))
    return claims, lines


def value_classes(expected: dict, actual: dict) -> tuple[list[Claim], list[str]]:
    """The value-class observations of every differing tensor of a stage (reference and device payloads)."""
    claims: list[Claim] = []
    lines: list[str] = []
    for tensor, reference, device in comparable(expected, actual):
        for part in parts(tensor, reference, device):
            found, more = part_claims(part)
            claims += found
            lines += more
    return claims, lines
