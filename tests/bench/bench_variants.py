"""Kernel directories the bench must judge: a stage made slower, and a stage that writes only once.

Each is a one-place patch of a copy of the built-in kernels (also used by build/gpu/bench.sh on the H200).
"""

from __future__ import annotations

import shutil
from pathlib import Path

SCORING_LOOP = "    for (int record_id = (int)threadIdx.x; record_id < limit; record_id += (int)blockDim.x) {"
REPLICATE_GUARD = "    if (element >= count) return;\n"
REPLICATE_ENTRY = 'extern "C" __global__ void csa_ratio4_index_replicate('


def _patched(source: Path, target: Path, file: str, old: str, new: str) -> Path:
    shutil.copytree(source, target)
    path = target / file
    text = path.read_text(encoding="utf-8")
    if text.count(old) != 1:
        raise AssertionError(f"{file}: the patch text occurs {text.count(old)} times")
    path.write_text(text.replace(old, new), encoding="utf-8")
    return target


def slowed(source: Path, target: Path, passes: int = 2) -> Path:
    """Index select scores every record ``passes`` times (the same bytes, more time)."""
    return _patched(source, target, "csa_ratio4_index_select.cu", SCORING_LOOP,
                    f"    for (int pass = 0; pass < {passes}; ++pass)\n" + SCORING_LOOP)


def skip_write(source: Path, target: Path) -> Path:
    """Replicate writes its output on its first launch only: each thread takes a ticket, and tickets past
    the first launch's element count skip the store."""
    target = _patched(source, target, "csa_ratio4_index_replicate.cu", REPLICATE_GUARD,
                      REPLICATE_GUARD + "    if (atomicAdd(&csa_bench_tickets, 1) >= count) return;\n")
    path = target / "csa_ratio4_index_replicate.cu"
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace(REPLICATE_ENTRY, "__device__ int csa_bench_tickets = 0;\n\n" + REPLICATE_ENTRY),
                    encoding="utf-8")
    return target


def spun(source: Path, target: Path, iterations: int = 5_000_000) -> Path:
    """Replicate's first thread spins ``iterations`` times before its store: the same bytes, clearly later."""
    return _patched(source, target, "csa_ratio4_index_replicate.cu", REPLICATE_GUARD,
                    REPLICATE_GUARD + f"    if (element == 0) for (volatile int spin = 0; spin < {iterations}; ++spin) {{}}\n")
