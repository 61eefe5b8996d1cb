"""The kernel launches of a device step as plain data: module, entry, ratio, stages, read-back.

Launches run in pipeline order (the CUDA seed's dispatch). Kernels fuse
stages: index select computes stages 3-5, attention stages 6-7; replicate
fans stage 5's selection out. ``read_back`` names how the device runner sets
a launch up and reads its buffers back into stage payloads; the device
package maps each ``ReadBack`` to its function (csa_conform.device.launches).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# What an uninitialised device buffer holds: a fixed non-zero byte, so a plain run is reproducible and
# a kernel that reads scratch it never wrote does not pass by the luck of zeroed memory.
POISON = 0xA5


class ReadBack(Enum):
    """The launch shapes the device runner knows how to set up and read back."""

    COMPRESS = "compress"
    INDEX_SELECT = "index_select"
    REPLICATE = "replicate"
    ATTEND = "attend"


@dataclass(frozen=True)
class Launch:
    """One kernel module of a device step: its entry, the stages it computes, its read-back."""

    module: str
    entry: str
    ratio: int
    stages: tuple[str, ...]
    read_back: ReadBack


LAUNCHES: tuple[Launch, ...] = (
    Launch("csa_ratio128_compression", "csa_ratio128_compress", 128, ("compression_update",), ReadBack.COMPRESS),
    Launch("csa_ratio128_attention", "csa_ratio128_sink_attention", 128,
           ("candidate_assembly", "sparse_sink_softmax_attention"), ReadBack.ATTEND),
    Launch("csa_ratio4_main_compression", "csa_ratio4_main_compress", 4, ("compression_update",), ReadBack.COMPRESS),
    Launch("csa_ratio4_index_compression", "csa_ratio4_index_compress", 4, ("index_key_update",), ReadBack.COMPRESS),
    Launch("csa_ratio4_index_select", "csa_ratio4_index_select", 4,
           ("index_query_finalize", "index_scoring", "selection"), ReadBack.INDEX_SELECT),
    Launch("csa_ratio4_index_replicate", "csa_ratio4_index_replicate", 4, ("selection",), ReadBack.REPLICATE),
    Launch("csa_ratio4_attention", "csa_ratio4_sink_attention", 4,
           ("candidate_assembly", "sparse_sink_softmax_attention"), ReadBack.ATTEND),
)


def launches_for_ratio(ratio: int) -> tuple[Launch, ...]:
    return tuple(launch for launch in LAUNCHES if launch.ratio == ratio)


def launch_of(ratio: int, stage: str) -> Launch | None:
    """The launch that computes a stage with what feeds it (the first, fused one, not a fan-out)."""
    return next((launch for launch in launches_for_ratio(ratio) if stage in launch.stages), None)


def fused(ratio: int, stage: str, upstream: str) -> bool:
    """Whether the launch that computes ``stage`` computes ``upstream`` too: inside one launch a stage reads
    the launch's own value, which no mode can feed from outside, so isolated mode isolates launches, not
    stages (index scoring reads its launch's transformed queries, selection its scores, attention its
    candidates)."""
    own = launch_of(ratio, stage)
    return own is not None and upstream != stage and upstream in own.stages


def kernel_modules() -> dict[str, str]:
    """Module file stem -> extern "C" entry, the ABI a kernel directory provides."""
    return {launch.module: launch.entry for launch in LAUNCHES}
