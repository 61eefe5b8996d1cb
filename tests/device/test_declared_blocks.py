"""A module may declare a wider block for its entry (specs/kernel-abi.md, csa_block_<entry>); without the
declaration the seed's launch shape is used, and the built-in index select's block-parallel top-k keeps the
selection's order (descending total order, lower record first on equal keys) on any block width."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from device_fixtures import pick

from csa_conform.check.conformance import check_case
from csa_conform.device import DeviceRunner, KernelDirectory
from csa_conform.device.host import HostEmulationBackend
from csa_conform.device.kernels import ModuleSource
from csa_conform.errors import DeviceUnavailable
from csa_conform.golden import GoldenFile
from csa_conform.spec import STAGE_NAMES

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
DECLARATION = re.compile(r"__constant__ int csa_block_(\w+) = (\w+);\n")


def _copy(tmp_path: Path, block: str | None) -> Path:
    """The built-in kernels with every block declaration removed (None) or set to ``block``."""
    target = tmp_path / "kernels"
    shutil.copytree(KERNELS, target)
    for module in target.glob("*.cu"):
        text = module.read_text()
        replacement = "" if block is None else rf"__constant__ int csa_block_\1 = {block};\n"
        module.write_text(DECLARATION.sub(replacement, text))
    return target


def _run(goldens: Path, kernels: Path, pattern: str):
    runner = DeviceRunner(kernels=KernelDirectory(kernels))
    with GoldenFile(goldens) as golden:
        report = check_case(golden, pick(golden.case_ids(), pattern), runner, STAGE_NAMES)
    return report, {launch.module: launch.block[0] for launch in runner.provenance.launches}


def test_the_builtin_kernels_declare_their_wider_blocks():
    declared = {name: value for module in KERNELS.glob("*.cu") for name, value in DECLARATION.findall(module.read_text())}
    assert declared == {"csa_ratio4_index_select": "CSA_SELECT_THREADS", "csa_ratio4_main_compress": "256",
                        "csa_ratio4_index_compress": "256", "csa_ratio128_compress": "256"}


@pytest.mark.usefixtures("emulated_cuda")
@pytest.mark.parametrize("pattern", ["random.r4-5out*", "random.r128-*"])
def test_without_declarations_the_seed_shapes_run_and_conform(pattern, device_goldens, tmp_path):
    report, blocks = _run(device_goldens, _copy(tmp_path, None), pattern)
    assert report.passed, report.failure
    seed = {"csa_ratio4_main_compression": 1, "csa_ratio4_index_compression": 1, "csa_ratio4_index_select": 1,
            "csa_ratio4_index_replicate": 256, "csa_ratio4_attention": 256,
            "csa_ratio128_compression": 1, "csa_ratio128_attention": 256}
    assert blocks == {module: seed[module] for module in blocks}


@pytest.mark.usefixtures("emulated_cuda")
@pytest.mark.parametrize("block", ["0", "2048"])
def test_a_declared_block_outside_1_to_1024_threads_is_refused(block, device_goldens, tmp_path):
    with pytest.raises(DeviceUnavailable, match=rf"csa_ratio4_main_compression.cu: csa_block_csa_ratio4_main_compress"
                                                rf" = {block} is not a block size"):
        _run(device_goldens, _copy(tmp_path, block), "random.r4-5out*")


SELECT_PROBE = """
extern "C" __global__ void select_probe(const float* scores, int candidates, int k, int* selected)
{
    csa_select_top(scores, candidates, k, selected);
}
"""


def _expected_order(scores: np.ndarray, k: int) -> list[int]:
    """f32::total_cmp descending, lower record first on equal keys."""
    bits = scores.view(np.int32).astype(np.int64)
    keys = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return np.lexsort((np.arange(scores.size), -keys))[:k].tolist()


def _scores(rng, candidates: int, tied: bool) -> np.ndarray:
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45], np.float32)
    if tied:
        values = rng.choice(np.concatenate([specials, np.float32([1.5, 2.25, -3.0])]), candidates)
    else:
        values = rng.standard_normal(candidates).astype(np.float32)
        values[rng.integers(0, candidates, 3)] = specials[rng.integers(0, specials.size, 3)]
    return values.astype(np.float32)


@pytest.mark.parametrize("threads", [1, 96, 512])
def test_the_block_parallel_top_k_keeps_the_selection_order(threads, tmp_path):
    backend = HostEmulationBackend(tmp_path)
    select = KernelDirectory().module("csa_ratio4_index_select")
    probe = ModuleSource("select_probe", "select_probe", Path("select_probe.cu"), select.source + SELECT_PROBE)
    function = backend.function(probe)
    rng = np.random.default_rng(18)
    for candidates, k, tied in [(1, 1, False), (7, 7, True), (600, 512, False), (600, 512, True),
                                (1500, 700, True), (1500, 1, True), (300, 129, False), (2000, 2000, True)]:
        scores = _scores(rng, candidates, tied)
        selected = backend.full((k,), -7, np.int32)
        args = (backend.upload(scores), np.int32(candidates), np.int32(k), selected)
        backend.launch("select_probe", function, (1, 1, 1), (threads, 1, 1), args)
        assert backend.download(selected).tolist() == _expected_order(scores, k), (candidates, k, tied)
