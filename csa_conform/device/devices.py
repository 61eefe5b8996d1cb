"""``diff --devices 0,1,…|all``: the cases of one run spread over the GPUs of one host.

One worker process per GPU, each seeing only its GPU (CUDA_VISIBLE_DEVICES is
set in the worker before anything there touches CUDA), runs its share of the
cases (round robin, as csa_conform._base.shards splits them over machines). The
parent merges the reports in case order and the launch records case by case,
so the results document is the one a single GPU writes, timings aside.
Workers are forked, which keeps what the parent set up; the parent itself
never initialises CUDA (for ``all`` it counts the GPUs in a child process),
because a CUDA context does not survive a fork. A process that already has
one (a test session that used the device) spawns its workers instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Callable, Sequence, TypeVar

from csa_conform._base.pool import ordered_map
from csa_conform._base.shards import Shard, interleave
from csa_conform.device import cuda
from csa_conform.device.provenance import RunProvenance
from csa_conform.errors import DeviceUnavailable, UsageError

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
ALL = "all"
# No host has more GPUs than this; ordinals are ASCII digits (str.isdigit also takes '²').
MAX_ORDINAL = 1023
_ORDINAL = re.compile(r"[0-9]{1,4}")

Report = TypeVar("Report")
Work = Callable[[Sequence[str]], tuple[list[Report], RunProvenance]]


def parse_devices(text: str) -> tuple[int, ...] | None:
    """'0,1,…' (distinct ordinals) or 'all' (None: every GPU the host shows)."""
    text = str(text).strip()
    if text == ALL:
        return None
    words = [word.strip() for word in text.split(",")]
    ordinals = [int(word) for word in words if _ORDINAL.fullmatch(word) and int(word) <= MAX_ORDINAL]
    if not words or len(ordinals) != len(words) or len(set(ordinals)) != len(ordinals):
        raise UsageError(f"--devices: {text!r} is not 'all' or distinct device ordinals like 0,1 "
                         f"(at most {MAX_ORDINAL})")
    return tuple(ordinals)


def device_count() -> int:
    """GPUs visible to this process, counted in a child so this one stays free of CUDA."""
    probe = "import cupy; print(cupy.cuda.runtime.getDeviceCount())"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip().isdigit():
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise DeviceUnavailable(f"--devices all: cannot count the CUDA devices ({reason})")
    return int(done.stdout.strip())


def resolve_devices(devices: tuple[int, ...] | None) -> tuple[int, ...]:
    chosen = tuple(range(device_count())) if devices is None else devices
    if not chosen:
        raise DeviceUnavailable("--devices all: no CUDA device is visible")
    return chosen


def visible_device(ordinal: int) -> str:
    """The CUDA_VISIBLE_DEVICES entry of ordinal (counted within the parent's own CUDA_VISIBLE_DEVICES)."""
    inherited = [entry.strip() for entry in os.environ.get(VISIBLE_ENV, "").split(",") if entry.strip()]
    if not inherited:
        return str(ordinal)
    if ordinal >= len(inherited):
        raise UsageError(f"--devices: device {ordinal} is not among {VISIBLE_ENV}={os.environ[VISIBLE_ENV]}")
    return inherited[ordinal]


def own_device(visible: str) -> None:
    """Make this worker process see only ``visible`` (a CUDA_VISIBLE_DEVICES entry), before CUDA starts in it."""
    os.environ[VISIBLE_ENV] = visible


def _worker(share: tuple[str, Work, Sequence[str]]):
    visible, work, cases = share
    own_device(visible)
    return work(cases)


def spread(devices: Sequence[int], work: Work, cases: Sequence[str]) -> tuple[list[Report], RunProvenance]:
    """``work(cases)`` split over one forked worker per device; reports and launches merged in case order."""
    visible = [visible_device(ordinal) for ordinal in devices]
    shards = [Shard(index + 1, len(devices)).select(cases) for index in range(len(devices))]
    method = "spawn" if cuda.initialised else "fork"
    done = list(ordered_map(_worker, list(zip(visible, [work] * len(devices), shards)), len(devices), method=method,
                            crashed="a --devices worker process died before finishing; rerun without --devices"))
    reports = interleave([reports for reports, _ in done])
    provenances = [provenance for _, provenance in done]
    merged = provenances[0]
    merged.device = next((provenance.device for provenance in provenances if provenance.device), None)
    for provenance in provenances[1:]:
        for module, build in provenance.modules.items():
            merged.modules.setdefault(module, build)  # each worker compiled with the same options
    replays = [provenance.replay for provenance in provenances if provenance.replay]
    if replays:
        merged.replay = {**replays[0], **{key: sum(replay[key] for replay in replays)
                                          for key in ("captures", "replayed_steps")}}
    merged.launches = [launch for case in interleave(shards) for provenance in provenances
                       for launch in provenance.for_case(case)]
    return reports, merged
