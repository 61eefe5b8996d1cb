"""The PTX report on real PTX: nvcc -ptx -lineinfo of the built-in kernels and of a module that
calls CUDA's expf/log2f with NVRTC's default options (no GPU needed, only nvcc)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from csa_conform.device.kernels import MODULES, KernelDirectory, ModuleSource
from csa_conform.device.ptx import LIBRARY, OWN, analyse, categories, math_call_lines

NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")

TINY = """extern "C" __global__ void tiny(const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = expf(x[i]);
    float b = log2f(a + 1.0f);
    y[i] = a * b + x[i];
}
"""


def _ptx(module: ModuleSource, tmp_path: Path) -> str:
    unit = tmp_path / module.path.name
    unit.write_text(module.source)
    output = tmp_path / (module.path.name + ".ptx")
    subprocess.run([NVCC, "-arch=sm_90", "-ptx", "-lineinfo", *module.build.options, str(unit), "-o", str(output)],
                   check=True, capture_output=True, text=True)
    return output.read_text()


def _report(module: ModuleSource, tmp_path: Path):
    return analyse(module.module, _ptx(module, tmp_path), module.source, module.locate, module.path.name)


@pytest.mark.parametrize("opcode, expected", [
    ("ex2.approx.ftz.f32", ["ftz", "approx"]), ("lg2.approx.f32", ["approx"]), ("fma.rn.f32", ["fma.f32"]),
    ("fma.rm.f32", ["fma.f32"]), ("mad.rn.f32", ["fma.f32"]), ("mad.lo.s32", []), ("fma.rn.f64", []),
    ("add.ftz.f32", ["ftz"]), ("mul.rn.f32", []),
])
def test_opcode_categories(opcode, expected):
    assert categories(opcode) == expected


def test_math_calls_are_found_through_define_aliases():
    source = "#define my_exp expf\nfloat a = my_exp(x);\nfloat b = csa_glibc_expf(x);\nfloat c = x.expf(1);\n"
    assert math_call_lines(source) == {2}


@needs_nvcc
@pytest.mark.parametrize("module", ["csa_ratio4_attention", "csa_ratio128_compression", "csa_ratio4_index_select"])
def test_strict_builtin_kernels_have_nothing_to_report(module, tmp_path):
    report = _report(KernelDirectory().module(module), tmp_path)
    assert report.flagged == [], report.summary()


@needs_nvcc
@pytest.mark.parametrize("module", sorted(MODULES))
def test_production_build_of_builtin_kernels_fuses_nothing_of_its_own(module, tmp_path):
    """Every product a sum consumes is __fmul_rn/__dmul_rn, which --fmad=true leaves alone."""
    report = _report(KernelDirectory(build="production").module(module), tmp_path)
    assert report.counts["fma.f32"][OWN] == 0, report.summary()
    assert report.total("ftz") == report.total("approx") == 0, report.summary()


@needs_nvcc
def test_production_build_of_plain_products_names_the_contracted_lines(tmp_path):
    """With -DCSA_CONTRACTIBLE --fmad=true fuses the prelude's own a*b+c lines: each is named, and each
    named line multiplies and adds."""
    kernels = KernelDirectory(build="production", nvrtc_options=("-DCSA_CONTRACTIBLE",))
    report = _report(kernels.module("csa_ratio4_attention"), tmp_path)
    assert report.counts["fma.f32"][OWN] > 0 and report.counts["fma.f32"][LIBRARY] == 0
    prelude = (kernels.path / "block_quant.cuh").read_text().splitlines()
    for where in report.own_lines["fma.f32"]:
        file, line = where.split(":")
        assert file == "block_quant.cuh"
        text = prelude[int(line) - 1]
        assert "csa_mul(" in text and "+" in text, f"{where}: {text}"


@needs_nvcc
def test_cuda_libm_bodies_count_as_library_and_own_lines_are_named(tmp_path):
    path = tmp_path / "src" / "tiny.cu"
    module = ModuleSource("tiny", "tiny", path, TINY, KernelDirectory(build="production").build)
    report = _report(module, tmp_path)
    assert report.counts["approx"] == {LIBRARY: report.total("approx"), OWN: 0} and report.total("approx") >= 1
    assert report.counts["ftz"][LIBRARY] >= 1 and report.counts["ftz"][OWN] == 0
    assert report.counts["fma.f32"][LIBRARY] >= 1
    assert dict(report.own_lines["fma.f32"]) == {"tiny.cu:7": report.counts["fma.f32"][OWN]}
    assert report.counts["fma.f32"][OWN] == 1
