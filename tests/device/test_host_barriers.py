"""The host backend's threads wait at __syncthreads() for each other (specs/host-backend.md): a shared-memory
tree reduction computes what a GPU computes, and a missing barrier shows the value a GPU race can show."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from device_fixtures import pick

from csa_conform.check.conformance import check_case
from csa_conform.device import DeviceRunner, KernelDirectory
from csa_conform.device.host import GXX, HostEmulationBackend
from csa_conform.device.kernels import ModuleSource
from csa_conform.golden import GoldenFile
from csa_conform.spec import STAGE_NAMES

pytestmark = pytest.mark.skipif(GXX is None, reason="the host backend needs g++")
KERNELS = Path(__file__).resolve().parents[2] / "kernels"

THREADS = 256

# Every block sums its 256 inputs by halving: thread t adds what thread t + stride wrote.
TREE_REDUCTION = """
extern "C" __global__ void tree_sum(const float* in, float* out, int guarded)
{
    __shared__ float partial[256];
    const int t = (int)threadIdx.x;
    partial[t] = in[blockIdx.x * blockDim.x + t];
    if (guarded) __syncthreads();
    for (int stride = (int)blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) partial[t] = partial[t] + partial[t + stride];
        if (guarded) __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = partial[0];
}
"""

# Thread t reads what thread t + 1 wrote: right after a barrier, the shared poison (0xA5 bytes) without one.
NEIGHBOUR = """
extern "C" __global__ void neighbour(int* out, int guarded)
{
    __shared__ int slot[256];
    const int t = (int)threadIdx.x;
    slot[t] = 1000 * (int)blockIdx.x + t;
    if (guarded) __syncthreads();
    out[blockIdx.x * blockDim.x + t] = slot[(t + 1) % (int)blockDim.x];
}
"""


def _tree_sum(values: np.ndarray) -> np.float32:
    """The reduction's own order: pairs (t, t + stride), halving."""
    partial = values.astype(np.float32).copy()
    stride = partial.size // 2
    while stride:
        partial[:stride] = partial[:stride] + partial[stride : 2 * stride]
        stride //= 2
    return partial[0]


def test_a_shared_memory_tree_reduction_matches_its_order():
    values = np.random.default_rng(7).standard_normal((3, THREADS)).astype(np.float32)
    backend = HostEmulationBackend()
    inputs, out = backend.upload(values.ravel()), backend.empty((3,), np.float32)
    module = ModuleSource("tree_sum", "tree_sum", Path("tree_sum.cu"), TREE_REDUCTION)
    backend.launch("tree_sum", backend.function(module), (3, 1, 1), (THREADS, 1, 1), (inputs, out, np.int32(1)))
    expected = np.array([_tree_sum(row) for row in values], dtype=np.float32)
    assert backend.download(out).view(np.uint32).tolist() == expected.view(np.uint32).tolist()
    # Threads in order with no barrier: every level reads partial sums not yet updated by higher threads.
    backend.launch("tree_sum", backend.function(module), (3, 1, 1), (THREADS, 1, 1), (inputs, out, np.int32(0)))
    assert not np.array_equal(backend.download(out), expected)


def test_a_missing_barrier_reads_the_shared_poison_a_barrier_publishes_the_neighbour():
    backend = HostEmulationBackend()
    module = ModuleSource("neighbour", "neighbour", Path("neighbour.cu"), NEIGHBOUR)
    function = backend.function(module)
    expected = np.array([[1000 * b + (t + 1) % THREADS for t in range(THREADS)] for b in range(2)], np.int32)
    out = backend.empty((2 * THREADS,), np.int32)
    backend.launch("neighbour", function, (2, 1, 1), (THREADS, 1, 1), (out, np.int32(1)))
    assert backend.download(out).reshape(2, THREADS).tolist() == expected.tolist()
    backend.launch("neighbour", function, (2, 1, 1), (THREADS, 1, 1), (out, np.int32(0)))
    raced = backend.download(out).reshape(2, THREADS)
    poison = np.frombuffer(b"\xa5" * 4, np.int32)[0]
    # Each thread but the last runs before its neighbour writes: it reads the block's fresh poison, never
    # the previous block's value; the last thread reads thread 0's, written before it ran.
    assert (raced[:, :-1] == poison).all() and raced[:, -1].tolist() == [0, 1000]


def _without(barrier: str, tmp_path: Path) -> Path:
    """The built-in kernels with one barrier line of index select deleted."""
    kernels = tmp_path / "kernels"
    shutil.copytree(KERNELS, kernels)
    module = kernels / "csa_ratio4_index_select.cu"
    text = module.read_text()
    assert text.count(barrier) == 1
    module.write_text(text.replace(barrier, ""))
    return kernels


@pytest.mark.usefixtures("emulated_cuda")
def test_the_builtin_index_select_without_its_query_barrier_diverges_on_the_host(device_goldens, tmp_path):
    """Each thread finalizes some heads' queries and scores records with all of them: without the barrier,
    thread 0 scores before the higher threads have finalized their heads."""
    barrier = "    __syncthreads();  // every head's query is final\n"
    kernels = _without(barrier, tmp_path)
    with GoldenFile(device_goldens) as golden:
        case = pick(golden.case_ids(), "random.r4-5out*")
        assert check_case(golden, case, DeviceRunner(), STAGE_NAMES).passed
        report = check_case(golden, case, DeviceRunner(KernelDirectory(kernels)), STAGE_NAMES)
    assert [verdict.stage for verdict in report.diverged()][:1] == ["index_scoring"]


def test_the_reversed_schedule_runs_the_last_thread_first_and_the_blocks_from_the_last():
    """Thread t reads thread t + 1's slot: in reverse, t + 1 has run (its value), but the first thread of the
    block's turn, the last one, reads thread 0's slot still poisoned; block order shows in nothing shared."""
    backend = HostEmulationBackend()
    function = backend.function(ModuleSource("neighbour", "neighbour", Path("neighbour.cu"), NEIGHBOUR))
    out = backend.empty((2 * THREADS,), np.int32)
    backend.schedule(1)
    backend.launch("neighbour", function, (2, 1, 1), (THREADS, 1, 1), (out, np.int32(0)))
    raced = backend.download(out).reshape(2, THREADS)
    poison = np.frombuffer(b"\xa5" * 4, np.int32)[0]
    assert raced[:, :-1].tolist() == [[1000 * b + t + 1 for t in range(THREADS - 1)] for b in range(2)]
    assert raced[:, -1].tolist() == [poison, poison]
    backend.schedule(0)
    backend.launch("neighbour", function, (2, 1, 1), (THREADS, 1, 1), (out, np.int32(0)))
    assert (backend.download(out).reshape(2, THREADS)[:, :-1] == poison).all()


@pytest.mark.usefixtures("emulated_cuda")
def test_a_barrier_only_a_later_thread_running_first_shows_is_non_deterministic_under_repeat(device_goldens,
                                                                                             tmp_path):
    """Without the barrier after thread 0 publishes the radix digit, the other threads clear the histogram
    for the next digit while thread 0 still reads it. In index order thread 0 reads first: a plain diff
    passes; --repeat 2's second run goes in reverse, and the selection differs between the runs."""
    barrier = "        __syncthreads();  // thread 0 has published the digit and is done with the histogram\n"
    kernels = _without(barrier, tmp_path)
    with GoldenFile(device_goldens) as golden:
        case = pick(golden.case_ids(), "boundaries.r4-chunks-*")
        assert check_case(golden, case, DeviceRunner(KernelDirectory(kernels)), STAGE_NAMES).passed
        repeated = check_case(golden, case, DeviceRunner(KernelDirectory(kernels), repeat=2), STAGE_NAMES)
        builtin = check_case(golden, case, DeviceRunner(repeat=2), STAGE_NAMES)
    assert builtin.passed, "the built-in kernels are the same in either order"
    assert {finding.kind for finding in repeated.findings} == {"non-deterministic"}
    assert {finding.details["name"] for finding in repeated.findings} == {"selected"}
