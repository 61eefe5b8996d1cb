"""One flipped byte anywhere in a small golden file: `verify` exits 1 naming the object, or 2 with
one line naming the file (or the case it made invalid and the object), or exits 0 only when nothing a
reader can see changed — and never crashes.

The sample is fixed (seeded): most flips land in HDF5 metadata (headers,
heaps, B-trees, attributes), where damage used to escape as tracebacks and
segfaults, the rest in raw data. CSA_CONFORM_FLIPS=N samples N offsets,
CSA_CONFORM_FLIPS=all tries every metadata byte (minutes).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from click.testing import CliRunner

from csa_conform.cli import main

STREAM = "boundaries.r4-decode-1-to-5"
WORKER = Path(__file__).with_name("flip_worker.py")
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FLIPS = 240
DATA_SHARE = 0.15


def raw_data_bytes(path: Path) -> set[int]:
    """Offsets that hold dataset values (contiguous data and chunks), as opposed to metadata."""
    offsets: set[int] = set()
    with h5py.File(path, "r") as handle:
        def visit(_, item):
            if not isinstance(item, h5py.Dataset):
                return
            if item.chunks is None:
                start = item.id.get_offset()
                if start is not None:
                    offsets.update(range(start, start + item.id.get_storage_size()))
                return
            for index in range(item.id.get_num_chunks()):
                chunk = item.id.get_chunk_info(index)
                offsets.update(range(chunk.byte_offset, chunk.byte_offset + chunk.size))

        handle.visititems(visit)
    return offsets


def sample(path: Path) -> list[tuple[int, int]]:
    size = path.stat().st_size
    data = raw_data_bytes(path)
    metadata = [offset for offset in range(size) if offset not in data]
    rng = random.Random(9)
    wanted = os.environ.get("CSA_CONFORM_FLIPS", str(DEFAULT_FLIPS))
    if wanted == "all":
        offsets = metadata
    else:
        count = int(wanted)
        in_data = min(int(count * DATA_SHARE), len(data))
        offsets = rng.sample(metadata, min(count - in_data, len(metadata))) + rng.sample(sorted(data), in_data)
    return [(offset, rng.randrange(1, 256)) for offset in sorted(offsets)]


def run_worker(golden: Path, work: Path, flips: list[tuple[int, int]]) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(golden), str(work), json.dumps(flips)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment,
    )


def problems_of(report: dict) -> list[str]:
    where = f"offset {report['offset']} ^ {report['mask']:#04x}"
    if report["exception"]:
        return [f"{where}: escaped the boundary: {report['exception']}"]
    code, stderr = report["exit"], report["stderr"]
    if "Traceback" in stderr:
        return [f"{where}: traceback on stderr"]
    if code == 0:
        return [] if report["same_contents"] else [f"{where}: exit 0 although the file reads differently"]
    if code == 1:
        fails, lines = report["fail_lines"], stderr.strip().splitlines()
        named = fails and all("/cases/" in line or "step " in line for line in fails)
        root = not fails and len(lines) == 1 and ".h5: /: " in lines[0]
        return [] if named or root else [f"{where}: exit 1 without naming the object: {fails or stderr}"]
    if code == 2:
        lines = stderr.strip().splitlines()
        if len(lines) == 1 and lines[0].startswith("csa-conform: error: ") and "h5" in lines[0]:
            return []
        invalid = report["invalid_lines"]
        if not lines and invalid and all(".h5: /cases/" in line for line in invalid):
            return []
        return [f"{where}: exit 2 without one line naming the file or the case's object: {stderr or invalid!r}"]
    return [f"{where}: exit {code}"]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("flips") / "small.h5"
    result = CliRunner().invoke(main, ["generate", "--case", STREAM, "-o", str(path)])
    assert result.exit_code == 0, result.output
    return path


def test_every_sampled_flip_is_caught_or_harmless_and_nothing_crashes(small, tmp_path):
    flips = sample(small)
    halves = [flips[0::2], flips[1::2]]
    workers = [run_worker(small, tmp_path / f"work{i}.h5", half) for i, half in enumerate(halves)]
    problems, reports = [], []
    for worker, half in zip(workers, halves):
        out, err = worker.communicate(timeout=1200)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        reports += [line for line in lines if "exit" in line]
        if worker.returncode != 0:
            started = [line for line in lines if "start" in line]
            last = started[-1] if started else {"start": "?", "mask": 0}
            problems.append(f"worker died (status {worker.returncode}) at offset {last['start']} "
                            f"^ {last['mask']:#04x}: {err[-400:]}")
    for report in reports:
        problems += problems_of(report)
    assert len(reports) == len(flips) or problems
    assert problems == [], "\n".join(problems[:20])
    caught = sum(report["exit"] != 0 for report in reports)
    assert caught > len(flips) // 2, f"only {caught} of {len(flips)} flips were noticed"
