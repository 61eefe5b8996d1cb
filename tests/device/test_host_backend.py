"""--backend host reaches the runner from every command that launches kernels, with no CUDA in the way."""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import csa_conform.device.cuda as cuda
from csa_conform.cli import main
from csa_conform.device.host import GXX
from csa_conform.errors import DeviceUnavailable
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels_mutants"))
from mutants import DIFF_MUTANTS  # noqa: E402

pytestmark = pytest.mark.skipif(GXX is None, reason="the host backend needs g++")
KERNELS = Path(__file__).resolve().parents[2] / "kernels"
MUTANT = DIFF_MUTANTS[0]


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    """Any attempt to reach CUDA fails the command: the host backend must never ask for it."""
    def refuse():
        raise DeviceUnavailable("CUDA was asked for under --backend host")

    monkeypatch.setattr(cuda, "CudaBackend", refuse)


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_diff_on_the_host_backend_passes_the_builtin_kernels_and_reproduces_with_it(device_goldens):
    result = invoke("diff", str(device_goldens), "--backend", "host", "--case", MUTANT.cases, "--json")
    assert result.exit_code == ExitCode.OK, result.output
    document = json.loads(result.stdout)
    assert document["kernels"]["device"]["name"] == "host emulation (g++)"
    assert all(" --backend host" in case["reproduce"] for case in document["cases"])


@pytest.mark.parametrize("command", ["diff", "explain"])
def test_a_mutant_diverges_at_its_stage_on_the_host_backend(command, device_goldens, tmp_path):
    kernels = MUTANT.apply(KERNELS, tmp_path / "kernels")
    result = invoke(command, str(device_goldens), "--backend", "host", "--kernels", str(kernels),
                    "--case", MUTANT.cases, "--json")
    assert result.exit_code == ExitCode.DIVERGED, result.output
    failing = {stage for case in json.loads(result.stdout)["cases"] for stage, verdict in case["verdicts"].items()
               if verdict == "diverged"}
    assert MUTANT.stage in failing


def test_bisect_on_the_host_backend_finds_the_mutants_stage(device_goldens, tmp_path):
    kernels = MUTANT.apply(KERNELS, tmp_path / "kernels")
    case = next(case for case in _case_ids(device_goldens) if fnmatch.fnmatchcase(case, MUTANT.cases))
    result = invoke("bisect", str(device_goldens), "--backend", "host", "--kernels", str(kernels), "--case", case,
                    "--json")
    assert result.exit_code == ExitCode.DIVERGED, result.output
    assert MUTANT.stage in result.stdout


@pytest.mark.parametrize("extra", [["--devices", "0"], ["--sanitize", "memcheck"]])
def test_gpu_only_depth_is_refused_on_the_host_backend(extra, device_goldens):
    result = invoke("diff", str(device_goldens), "--backend", "host", *extra)
    assert result.exit_code == ExitCode.USAGE
    assert "needs GPUs" in result.output


def _case_ids(path) -> list[str]:
    with GoldenFile(path) as golden:
        return golden.case_ids()


def test_a_module_built_with_the_precompiled_headers_is_the_library_built_without(tmp_path):
    """The .gch only saves parsing: g++ uses it (-H marks it '!') and the library is the same byte for byte."""
    import subprocess

    from csa_conform.device.host import emulation
    from csa_conform.device.kernels import KernelDirectory

    module = KernelDirectory(KERNELS).module("csa_ratio4_index_replicate")
    flags, _ = emulation.gxx_flags(module.build.nvrtc_options("host"))
    entry = flags + (f"-DCSA_ENTRY={module.entry}",)
    libraries = {}
    for headers in (flags, None):
        folder = tmp_path / ("precompiled" if headers else "plain")
        folder.mkdir()
        libraries[headers is not None] = Path(emulation._build(module.source, "host_module.cpp", folder, entry,
                                                               headers)._name)
    (header,) = (tmp_path / "precompiled").glob("headers-*.h")
    assert not list((tmp_path / "plain").glob("headers-*"))
    source = next((tmp_path / "precompiled").glob("*.cuh"))
    command = [emulation.GXX, *emulation.GXX_FLAGS, *entry, "-include", str(header), "-H", f"-I{emulation.HERE}",
               f'-DCSA_SOURCE="{source}"', str(emulation.HERE / "host_module.cpp"), "-o", str(tmp_path / "probe.so")]
    listed = subprocess.run(command, capture_output=True, text=True).stderr
    assert f"! {header}.gch" in listed.splitlines()
    assert libraries[True].read_bytes() == libraries[False].read_bytes()
