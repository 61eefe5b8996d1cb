"""A kernel that crashes or never ends is its case's verdict: fault or hang, the other cases judged, the
run's documents written, exit 1 (with --git-bisect too), never a traceback; Ctrl-C and SIGTERM end
the run within a second whatever the kernel is doing.

Each planted kernel directory is the built-in one with a line added at the top of the ratio-128
attention kernel, taken only for batch 2: of the three ``edges.r128-f32-ties-b*`` cases, b2n3 faults
and b1n1, b1n5 are judged as usual.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from csa_conform._base.pool import Worker, WorkerLost
from csa_conform.cli import main
from csa_conform.device.host import GXX
from csa_conform.errors import KernelFault
from csa_conform.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "goldens" / "ci.h5"
CASES = "edges.r128-f32-ties-b*"
FAULTING = "edges.r128-f32-ties-b2n3"
ENTRY_LINE = "    if ((int)blockIdx.x >= batch * sequence * heads) return;\n"
PLANTS = {
    "SIGSEGV": "output[1LL << 40] = 1.0f;",  # far outside every mapping (an illegal address on a GPU)
    "SIGABRT": "__trap();",
    "SIGFPE": "volatile int zero = 0; output[0] = (float)(batch / zero);",
    "loop": "for (;;) { asm volatile(\"\"); }",  # its asm is a side effect: NVRTC may not drop the loop
    "misaligned": "*(float *)((char *)output + 2) = 1.0f;",  # a fault on a GPU only (x86 loads unaligned)
    "past the band": "output[-1024] = 1.0f;",  # 4 KiB before the output: past its 64-byte band, not far off
}

pytestmark = pytest.mark.skipif(GXX is None, reason="the host backend needs g++")


def planted(target: Path, kind: str, when: str = "batch == 2") -> Path:
    shutil.copytree(ROOT / "kernels", target)
    path = target / "csa_ratio128_attention.cu"
    text = path.read_text(encoding="utf-8")
    assert text.count(ENTRY_LINE) == 1
    path.write_text(text.replace(ENTRY_LINE, ENTRY_LINE + f"    if ({when}) {{ {PLANTS[kind]} }}\n"), encoding="utf-8")
    return target


def command(*args) -> list[str]:
    return [sys.executable, "-m", "csa_conform", *map(str, args)]


def environment() -> dict:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def verdicts(document: dict) -> dict[str, set[str]]:
    return {case["case"]: set(case["verdicts"].values()) for case in document["cases"]}


def test_a_segfaulting_kernel_is_its_cases_fault_and_the_run_writes_its_documents(tmp_path):
    kernels = planted(tmp_path / "kernels", "SIGSEGV")
    done = subprocess.run(command("diff", CI, "--backend", "host", "--kernels", kernels, "--case", CASES, "--json",
                                  "--git-bisect"), capture_output=True, text=True, env=environment(), timeout=300)
    assert done.returncode == ExitCode.DIVERGED, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    document = json.loads(done.stdout)
    assert document["exit_code"] == ExitCode.DIVERGED
    found = verdicts(document)
    assert found.pop(FAULTING) >= {"fault"}
    assert len(found) == 2 and all(statuses <= {"identical", "n/a"} for statuses in found.values()), found
    faulted = next(case for case in document["cases"] if case["case"] == FAULTING)
    failure = faulted["steps"][0]["failure"]
    assert failure["type"] == "fault" and "SIGSEGV" in failure["message"]
    assert failure["kernel"] == "csa_ratio128_attention.cu:csa_ratio128_sink_attention"
    assert "grid [" in failure["message"] and "block [" in failure["message"]
    (tmp_path / "diff.json").write_text(done.stdout, encoding="utf-8")
    report = subprocess.run(command("report", tmp_path / "diff.json", "--junit", tmp_path / "junit.xml", "--html",
                                    tmp_path / "report.html"), capture_output=True, text=True, env=environment())
    assert report.returncode == 0, report.stderr
    assert '<failure type="fault"' in (tmp_path / "junit.xml").read_text(encoding="utf-8")


def test_a_write_just_past_a_band_is_its_cases_fault_not_a_corrupted_worker(tmp_path):
    """The host backend's buffers lie between inaccessible pages: a write a little beyond a band faults in
    its launch, where in the heap it corrupted the worker for a crash outside any launch (exit 4, no case)."""
    kernels = planted(tmp_path / "kernels", "past the band")
    result = CliRunner().invoke(main, ["diff", str(CI), "--backend", "host", "--kernels", str(kernels),
                                       "--case", CASES])
    assert result.exit_code == ExitCode.DIVERGED, result.output
    assert "fault: SIGSEGV in csa_ratio128_attention:csa_ratio128_sink_attention" in result.output
    assert "0 diverged, 1 fault" in result.output


@pytest.mark.parametrize("signal_name", ["SIGABRT", "SIGFPE"])
def test_an_aborting_or_dividing_by_zero_kernel_is_a_fault_named_by_its_signal(signal_name, tmp_path):
    kernels = planted(tmp_path / "kernels", signal_name)
    result = CliRunner().invoke(main, ["diff", str(CI), "--backend", "host", "--kernels", str(kernels),
                                       "--case", CASES])
    assert result.exit_code == ExitCode.DIVERGED, result.output
    rows = [line.split() for line in result.output.split("FAILURES")[0].splitlines() if line.startswith("edges.")]
    table = {row[0]: row[1:] for row in rows}
    assert "FAULT" in table[FAULTING] and all("FAULT" not in row for case, row in table.items() if case != FAULTING)
    assert f"fault: {signal_name} in csa_ratio128_attention:csa_ratio128_sink_attention" in result.output
    assert "0 diverged, 1 fault" in result.output


def test_a_kernel_that_never_ends_is_a_hang_after_the_launch_timeout(tmp_path):
    kernels = planted(tmp_path / "kernels", "loop")
    result = CliRunner().invoke(main, ["diff", str(CI), "--backend", "host", "--kernels", str(kernels),
                                       "--case", CASES, "--launch-timeout", "1", "--json"])
    assert result.exit_code == ExitCode.DIVERGED, result.output
    document = json.loads(result.stdout)
    found = verdicts(document)
    assert "hang" in found.pop(FAULTING) and all("hang" not in statuses for statuses in found.values())
    failure = next(case for case in document["cases"] if case["case"] == FAULTING)["steps"][0]["failure"]
    assert failure["type"] == "hang" and "--launch-timeout 1" in failure["reproduce"]


def test_bisect_finds_a_fault_and_bench_refuses_to_time_it(tmp_path):
    kernels = planted(tmp_path / "kernels", "SIGFPE")
    found = CliRunner().invoke(main, ["bisect", str(CI), "--backend", "host", "--kernels", str(kernels),
                                      "--case", FAULTING, "--json", "--git-bisect"])
    assert found.exit_code == ExitCode.DIVERGED, found.output
    failure = json.loads(found.stdout)["cases"][0]["steps"][0]["failure"]
    assert failure["type"] == "fault" and "SIGFPE" in failure["message"]
    timed = CliRunner().invoke(main, ["bench", str(CI), "--backend", "host", "--kernels", str(kernels),
                                      "--case", FAULTING, "--json"])
    assert timed.exit_code == ExitCode.DIVERGED, timed.output
    (case,) = json.loads(timed.stdout)["cases"]
    assert case["failure"]["type"] == "fault" and case["failure"]["message"].startswith("refused, not timed: ")
    assert json.loads(timed.stdout)["bench"]["cases"][0]["rows"] == []


def _worker_of(parent: int, polls: int = 1200) -> int | None:
    children = Path(f"/proc/{parent}/task/{parent}/children")
    for _ in range(polls):
        if children.exists() and children.read_text().split():
            return int(children.read_text().split()[0])
        time.sleep(0.1)
    return None


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rpartition(")")[2].split()[0] != "Z"


def _sees_ctrl_c() -> None:
    """A test run started in the background (a shell's `&`) hands its children SIGINT ignored, which Python
    keeps (no KeyboardInterrupt): the run under test gets the default back, as a terminal's would have."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(("number", "code"), [(signal.SIGTERM, ExitCode.TERMINATED),
                                              (signal.SIGINT, ExitCode.INTERRUPTED),
                                              (signal.SIGKILL, -signal.SIGKILL)])
def test_sigterm_and_ctrl_c_end_a_run_whose_kernel_never_ends(number, code, tmp_path):
    """The worker spinning in the kernel ends with the run too, even with a run killed outright; a run that
    ends itself (not one killed outright) leaves no build folder behind."""
    kernels = planted(tmp_path / "kernels", "loop", when="1")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    process = subprocess.Popen(command("diff", CI, "--backend", "host", "--kernels", kernels, "--case", FAULTING),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**environment(), "TMPDIR": str(scratch)}, preexec_fn=_sees_ctrl_c)
    try:
        worker = _worker_of(process.pid)
        assert worker is not None, "no worker process was started"
        time.sleep(3)  # the worker builds the modules, then spins in the kernel
        assert process.poll() is None
        process.send_signal(number)
        _, stderr = process.communicate(timeout=30)  # a run that waited for the kernel would never end
        for _ in range(100):  # polls, not a clock: a loaded machine may take a moment to reap the worker
            if not _running(worker):
                break
            time.sleep(0.05)
        assert not _running(worker)
    finally:
        process.kill()
    assert process.returncode == code, stderr
    assert "Traceback" not in stderr, stderr
    left = [path.name for path in scratch.iterdir()]
    assert (left == []) if number != signal.SIGKILL else (len(left) == 1), left


CUDA_FAULTS = {  # plant -> the CUDA error its launch leaves (sticky: the context is dead)
    "SIGSEGV": ("IllegalAddress", "ILLEGAL_ADDRESS"),
    "SIGABRT": ("LaunchFailure", "LAUNCH_FAILED", "IllegalInstruction", "ILLEGAL_INSTRUCTION"),  # __trap()
    "misaligned": ("MisalignedAddress", "MISALIGNED_ADDRESS"),
}


@pytest.mark.cuda
@pytest.mark.parametrize("kind", sorted(CUDA_FAULTS))
def test_a_faulting_launch_on_cuda_is_a_fault_and_the_run_goes_on(kind, tmp_path, cuda_device):
    kernels = planted(tmp_path / "kernels", kind)
    done = subprocess.run(command("diff", CI, "--kernels", kernels, "--case", CASES, "--json", "--git-bisect"),
                          capture_output=True, text=True, env=environment(), timeout=300)
    assert done.returncode == ExitCode.DIVERGED, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    document = json.loads(done.stdout)
    found = verdicts(document)
    assert "fault" in found.pop(FAULTING)
    assert all(statuses <= {"identical", "n/a"} for statuses in found.values()), found
    failure = next(case for case in document["cases"] if case["case"] == FAULTING)["steps"][0]["failure"]
    assert any(name in failure["message"] for name in CUDA_FAULTS[kind]), failure
    assert failure["reproduce"].endswith("--sanitize memcheck")


def _serve(request, note):
    """A stand-in for a runner's step: crashes, spins, raises or answers as asked, noting what it runs."""
    note(request)
    if request == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if request == "spin":
        while True:
            pass
    if request == "raise":
        raise KernelFault("fault", "cudaErrorIllegalAddress", ends_worker=True)
    note(None)
    return os.getpid()


def test_a_worker_lost_to_a_signal_or_a_deadline_is_replaced_and_says_why():
    worker = Worker(_serve, timeout=0.5)
    first = worker.call("answer")
    assert worker.call("answer") == first  # one process serves until it is lost
    with pytest.raises(WorkerLost) as lost:
        worker.call("segfault")
    assert (lost.value.signal, lost.value.note, lost.value.hung) == ("SIGSEGV", "segfault", False)
    second = worker.call("answer")
    assert second != first
    with pytest.raises(WorkerLost) as lost:
        worker.call("spin")
    assert lost.value.hung and lost.value.note == "spin"
    with pytest.raises(KernelFault) as fault:
        worker.call("raise")
    assert fault.value.cause == "cudaErrorIllegalAddress" and not worker.running  # its context is dead
    assert worker.call("answer") not in (first, second)
    worker.stop()
    assert not worker.running


def _echo(request, note):
    """Answers a request with itself, after a pause that lets requests from other threads overlap it."""
    time.sleep(0.005)
    return request


def test_requests_from_several_threads_each_get_their_own_answer():
    """The oracle's query chunks ask the worker for the device's libm from several threads at once."""
    worker = Worker(_echo)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(worker.call, range(64)))
    worker.stop()
    assert answers == list(range(64))


@pytest.mark.parametrize(("message", "name"), [
    ("cudaErrorIllegalAddress: an illegal memory access was encountered", "cudaErrorIllegalAddress"),
    ("CUDA_ERROR_MISALIGNED_ADDRESS: misaligned address", "CUDA_ERROR_MISALIGNED_ADDRESS"),
    ("cudaErrorLaunchFailure: unspecified launch failure", "cudaErrorLaunchFailure"),  # __trap()
    ("cudaErrorAssert: device-side assert triggered", "cudaErrorAssert"),
    ("cudaErrorInvalidValue: invalid argument", None),  # a launch configuration error: the environment's
    ("CUDA_ERROR_OUT_OF_MEMORY: out of memory", None),
])
def test_the_cuda_errors_that_kill_a_context_are_the_kernels_faults(message, name):
    from csa_conform.device.cuda import sticky_error

    assert sticky_error(RuntimeError(message)) == name


def test_a_sibling_runs_in_its_runners_worker():
    """explain's probed and ablated re-runs go to the worker that ran the step: its modules and context are
    made once (a worker per re-run built them again each time, minutes over a whole suite on CUDA)."""
    from csa_conform.device import DeviceRunner, KernelDirectory
    from csa_conform.device.backend import HOST, backend_named
    from csa_conform.golden import GoldenFile
    from csa_conform.spec import Mode

    runner = DeviceRunner(KernelDirectory(), mode=Mode.ISOLATED, backend_factory=backend_named(HOST), isolate=True)
    with GoldenFile(CI) as golden:
        info, step = golden.case_info("boundaries.r4-prefill-4"), golden.read_step("boundaries.r4-prefill-4", 0)
    plain = runner.run_step(info.attrs, step.inputs, info.output_names, reference=step.stages)
    pid = runner.worker.child.pid
    sibling = runner.sibling(frozenset(), probes=True)
    probed = sibling.run_step(info.attrs, step.inputs, info.output_names, reference=step.stages)
    assert sibling.worker is runner.worker and runner.worker.child.pid == pid
    assert probed.probes and not plain.probes
    for stage, tensors in plain.stages.items():
        for name, array in tensors.items():
            assert bytes(memoryview(probed.stages[stage][name])) == bytes(memoryview(array)), f"{stage}/{name}"
    runner.worker.child.stop()


def test_a_process_that_initialised_cuda_launches_in_itself(monkeypatch):
    """A forked child cannot use a CUDA context its parent made (a pytest session whose other tests used the
    GPU): the runner launches in its own process then, where a fault still is the case's verdict."""
    import csa_conform.device.cuda as cuda
    from csa_conform.device import DeviceRunner
    from csa_conform.device.backend import CUDA, HOST, backend_named

    monkeypatch.setattr(cuda, "initialised", True)
    assert DeviceRunner(backend_factory=backend_named(CUDA), isolate=True).worker is None
    assert DeviceRunner(backend_factory=backend_named(HOST), isolate=True).worker is not None


def test_an_error_after_kernel_code_ran_in_the_workers_own_memory_is_a_corrupted_worker(monkeypatch):
    """On the host backend kernels run in the worker's memory: an out-of-bounds write can make the worker's own
    Python raise anything later (a heap-corrupting kernel once made NumPy report negative dimensions). Such an
    error is the worker's, replaced, exit 4, never csa-conform's internal error; before any launch, or on a
    backend whose kernels cannot touch that memory, it stays what it is."""
    from types import SimpleNamespace

    import csa_conform.device.runner as runner_module
    from csa_conform.device.kernels import KernelDirectory
    from csa_conform.device.runner import DeviceRunner
    from csa_conform.errors import CorruptedWorker

    def failing(request, herald):
        if request == "launch":
            herald(("a launch", None))
            herald(None)
        raise ValueError("negative dimensions are not allowed")

    runner = DeviceRunner(KernelDirectory(ROOT / "kernels"), isolate=False)
    monkeypatch.setattr(runner, "_answer", failing)
    monkeypatch.setattr(runner_module, "_KERNEL_CODE_RAN", False)
    runner._backend = SimpleNamespace(in_process=True)
    with pytest.raises(ValueError):  # no kernel ran here yet: a bug of csa-conform's, reported as such
        runner._serve("step", lambda note: None)
    with pytest.raises(CorruptedWorker) as raised:
        runner._serve("launch", lambda note: None)
    assert raised.value.exit_code == ExitCode.ENVIRONMENT and raised.value.ends_worker
    crossed = pickle.loads(pickle.dumps(raised.value))  # it crosses the worker's pipe as itself
    assert type(crossed) is CorruptedWorker and str(crossed) == str(raised.value)
    assert str(raised.value).startswith("the worker process that runs the kernels failed after kernel code ran in "
                                        "it (ValueError: negative dimensions are not allowed at ")
    runner._backend = SimpleNamespace(in_process=False)  # CUDA: the kernels' writes land on the device
    with pytest.raises(ValueError):
        runner._serve("step", lambda note: None)
