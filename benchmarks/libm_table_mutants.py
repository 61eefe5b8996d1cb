"""Are the libm table mutants that survive `mutate` equivalent? Exhaustive checks against the oracle's glibc port.

    python benchmarks/libm_table_mutants.py

A mutant that changes the last bit of an exp2 table entry or of a 4/pi word survives the golden suite when no
argument the operator passes changes its binary32 result; the suite cannot show that, an enumeration can. With
one entry patched at a time in `csa_conform.numerics.libm` (bit-exact with glibc, so with the kernels' port):
every binary32 argument of expf's regular range whose table index is that entry, and the 32 RoPE bases
powf(160000, -j/32), which share the exp2 table; for a 4/pi word, every binary32 angle in [120, 2^21], the
large-reduction range of every angle a position up to 2^20 + 3 and a frequency up to 1 make. Prints how many
results differ (0: equivalent). The entries are those of benchmarks/mutation_survivors.md; about 2 minutes on
2 cores. Run by hand.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from csa_conform.numerics import libm

LN2_OVER_32 = np.log(2) / 32
EXP2_ENTRIES = ((14, +1), (16, -1), (19, +1), (26, +1))  # (index, last-bit change) of the seed-7 survivors
INV_PIO4_ENTRIES = ((9, +1), (18, -1))
ROPE_BASE = np.float32(160000.0)
ROPE_EXPONENTS = -np.arange(32, dtype=np.float32) / np.float32(32)


@contextmanager
def patched(table: np.ndarray, index: int, change: int):
    saved = table[index].copy()
    table[index] = np.uint64(int(saved) + change)
    try:
        yield
    finally:
        table[index] = saved


def floats_between(low: float, high: float) -> np.ndarray:
    """Every binary32 value from float32(low) to float32(high), in order (through the sign-magnitude keys)."""
    def key(value: float) -> int:
        bits = int(np.array(value, np.float32).view(np.uint32))
        return -(bits & 0x7FFFFFFF) if bits & 0x80000000 else bits
    keys = np.arange(key(low), key(high) + 1, dtype=np.int64)
    return np.where(keys < 0, (-keys) | 0x80000000, keys).astype(np.uint32).view(np.float32)


def expf_arguments(index: int) -> np.ndarray:
    """expf's regular-range arguments x = k ln2/32 + r whose k is index (mod 32)."""
    parts = [floats_between((k - 0.5) * LN2_OVER_32, (k + 0.5) * LN2_OVER_32)
             for k in range(-4800, 4100) if k % 32 == index]
    x = np.concatenate(parts)
    return x[(x > -103.98) & (x < 88.73)]


def bits_of(values: np.ndarray) -> np.ndarray:
    return values.view(np.uint32)


def main() -> None:
    for index, change in EXP2_ENTRIES:
        x = expf_arguments(index)
        bases = np.full(32, ROPE_BASE)
        before, rope_before = bits_of(libm.expf(x)), bits_of(libm.powf(bases, ROPE_EXPONENTS))
        with patched(libm.EXP2F_TAB, index, change):
            after, rope_after = bits_of(libm.expf(x)), bits_of(libm.powf(bases, ROPE_EXPONENTS))
        print(f"exp2 table entry {index} {change:+d}: {x.size:,} expf arguments with k = {index} (mod 32): "
              f"{int((before != after).sum())} results differ; RoPE powf bases differing: "
              f"{int((rope_before != rope_after).sum())}", flush=True)
    angles = floats_between(120.0, 2.0 ** 21)
    reference = bits_of(libm.sinf(angles)), bits_of(libm.cosf(angles))
    for index, change in INV_PIO4_ENTRIES:
        with patched(libm.INV_PIO4, index, change):
            sines, cosines = bits_of(libm.sinf(angles)), bits_of(libm.cosf(angles))
        print(f"inv_pio4 entry {index} {change:+d}: {angles.size:,} angles in [120, 2^21]: sinf differs at "
              f"{int((sines != reference[0]).sum())}, cosf at {int((cosines != reference[1]).sum())}", flush=True)


if __name__ == "__main__":
    main()
