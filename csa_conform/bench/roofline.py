"""Each timed row against the device's limits: the bytes it must move and the operations it must do.

The work of a launch is counted from the step's contract geometry and the
oracle's valid counts (causal records per query row, candidates, the dense
window), never from what a kernel happens to do: a compressor reads its
inputs and past state and writes its cache and carry; index select reads the
queries, weights and each row's causal index keys (once per batch row), and
writes the transformed queries, the causal scores and the selection, doing
two operations (multiply, add) per key element per index head and eight per
score for a four-pass radix selection; replicate moves the selection; sink
attention reads each query row's candidates (a ratio-128 row reads every
causal record once per batch row, a ratio-4 row its own top-k) and writes Y
and the scores, with two operations per candidate element for the scores and
two for the weighted sum. A step's work is the sum of its launches'.

The limits are the device's nominal peaks (NOMINAL, from the vendor's data
sheet; FP32 counts an FMA as two operations, so a kernel built without FMA
contraction reaches half of it at most) and the peaks the bench measures on
the spot (a copy kernel, an FMA kernel). A row is memory-bound when its
operations per byte are below the ridge point (peak operations / peak
bandwidth) and compute-bound above it; its % of peak is the bound's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.device.recorder import RecordedLaunch
from csa_conform.spec import LAUNCHES, ReadBack

READ_BACK = {launch.entry: launch.read_back for launch in LAUNCHES}
FLOAT = 4

# NVIDIA H200 (SXM) data sheet: HBM3e 4.8 TB/s; FP32 67 TFLOPS.
NOMINAL = {"H200": {"bandwidth_bytes_per_s": 4.8e12, "ops_per_s": 67e12,
                    "source": "NVIDIA H200 data sheet: HBM3e 4.8 TB/s, FP32 67 TFLOPS (an FMA counts 2)"}}


@dataclass(frozen=True)
class Work:
    bytes: float
    ops: float

    def __add__(self, other: Work) -> Work:
        return Work(self.bytes + other.bytes, self.ops + other.ops)


def _size(buffer) -> int:
    return int(np.prod(buffer.shape, dtype=np.int64)) * np.dtype(buffer.dtype).itemsize


def _causal(g: StepGeometry, ratio: int) -> np.ndarray:
    """Records each query row of the step may read (causal, capped at the records that exist)."""
    positions = g.total - g.sequence + np.arange(g.sequence, dtype=np.int64)
    return np.minimum((positions + 1) // ratio, g.next_records)


def _record_bytes(g: StepGeometry) -> int:
    return g.stored_width * (1 if g.cache_format != "f32" else FLOAT)


def launch_work(launch: RecordedLaunch, g: StepGeometry) -> Work:
    """The bytes and operations the launch's stages need on this step."""
    kind = READ_BACK[launch.entry]
    rows = g.batch * g.sequence
    if kind is ReadBack.COMPRESS:
        moved = sum(_size(arg) for arg in launch.args if hasattr(arg, "shape"))
        index = launch.module.endswith("index_compression")
        width = g.index_compressor_width if index else g.compressor_width
        dim = g.index_dim if index else g.dim
        return Work(moved, 4 * rows * width + 8 * g.batch * g.emitted * dim)
    if kind is ReadBack.INDEX_SELECT:
        causal = _causal(g, 4)
        key_bytes = g.batch * int(causal.max(initial=0)) * g.index_stored_width
        query = rows * g.index_heads * g.index_dim * FLOAT
        scores = g.batch * int(causal.sum()) * FLOAT
        moved = 2 * query + rows * g.index_heads * FLOAT + key_bytes + scores + rows * g.topk_width * FLOAT
        ops = 2 * g.batch * int(causal.sum()) * g.index_heads * g.index_dim + 8 * g.batch * int(causal.sum())
        return Work(moved, ops)
    if kind is ReadBack.REPLICATE:
        return Work(rows * g.topk_width * FLOAT * (1 + g.index_heads), 0)
    window = g.dense_candidates
    if g.ratio == 4:
        candidates = np.full(g.sequence, window + g.topk_width, dtype=np.int64)
        record_bytes = rows * g.topk_width * _record_bytes(g)
    else:
        causal = _causal(g, 128)
        candidates = window + causal
        record_bytes = g.batch * int(causal.max(initial=0)) * _record_bytes(g)
    query_rows = g.batch * g.heads * int(candidates.sum())
    kv = g.batch * g.current_kv_len * g.dim * FLOAT
    moved = 2 * rows * g.heads * g.dim * FLOAT + kv + record_bytes + query_rows * FLOAT
    return Work(moved, 4 * query_rows * g.dim)


def nominal_peaks(device_name: str | None) -> dict | None:
    for key, peaks in NOMINAL.items():
        if device_name and key in device_name:
            return peaks
    return None


def roofline(work: Work, seconds: float, nominal: dict | None, measured: dict | None) -> dict:
    """The row's bytes, operations, achieved rates, bound and % of the nominal and measured peaks."""
    entry: dict = {"bytes": work.bytes, "ops": work.ops,
                   "ops_per_byte": work.ops / work.bytes if work.bytes else None,
                   "bytes_per_s": work.bytes / seconds if seconds > 0 else None,
                   "ops_per_s": work.ops / seconds if seconds > 0 else None}
    for label, peaks in (("nominal", nominal), ("measured", measured)):
        if peaks is None or seconds <= 0:
            entry[label] = None
            continue
        ridge = peaks["ops_per_s"] / peaks["bandwidth_bytes_per_s"]
        memory = bool(work.bytes) and (not work.ops or work.ops / work.bytes < ridge)
        achieved = work.bytes / seconds if memory else work.ops / seconds
        peak = peaks["bandwidth_bytes_per_s"] if memory else peaks["ops_per_s"]
        entry[label] = {"bound": "memory" if memory else "compute", "percent": 100 * achieved / peak}
    return entry
