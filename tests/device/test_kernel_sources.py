"""The kernel directory: the seed's ABI, and every module compiling the way the runner compiles it."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from csa_conform.device.kernels import MODULES, NVCC_OPTIONS, PRELUDE, STRICT_OPTIONS, KernelDirectory
from csa_conform.errors import DeviceUnavailable

NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None)

# specs/kernel-abi.md: entry arguments, in order.
ABI = {
    "csa_ratio128_compress": "kv gate ape norm past_carry past_cache carry cache batch sequence dim "
    "past_row_records cache_row_records cache_fp8 total_ptr",
    "csa_ratio4_main_compress": "kv gate ape norm past_cache past_carry cache carry batch sequence dim rope_dim "
    "past_row_records cache_row_records total_ptr",
    "csa_ratio4_index_compress": "kv gate ape norm past_key past_carry key carry batch sequence dim rope_dim "
    "past_row_records key_row_records total_ptr",
    "csa_ratio4_index_select": "index_query index_weight index_key transformed scores selected batch sequence "
    "index_heads index_dim rope_dim record_capacity total_ptr topk_width",
    "csa_ratio4_index_replicate": "shared selected batch index_heads sequence topk_width",
    "csa_ratio128_sink_attention": "query current_kv compressed sink bias output scores batch sequence heads dim "
    "current_kv_len total_ptr compressed_capacity scratch_stride cache_fp8 bias_present bias_b bias_h bias_s "
    "bias_k scale",
    "csa_ratio4_sink_attention": "query current_kv compressed selected sink bias output scores batch sequence "
    "heads dim current_kv_len total_ptr compressed_capacity index_heads topk_width scratch_stride bias_present "
    "bias_b bias_h bias_s bias_k scale",
}
POINTER_TYPES = {"total_ptr": "const long long*", "scale": "float"}


def _parameters(source: str, entry: str) -> list[tuple[str, str]]:
    match = re.search(r'extern "C" __global__ void ' + entry + r"\s*\(([^)]*)\)", source)
    assert match, f"{entry} is not an extern \"C\" __global__ entry"
    parameters = []
    for declaration in match.group(1).split(","):
        words = declaration.strip().rsplit(None, 1)
        parameters.append((words[0].replace(" *", "*"), words[1].lstrip("*")))
    return parameters


@pytest.mark.parametrize("module, entry", sorted(MODULES.items()))
def test_entry_names_and_argument_order_are_the_seeds(module, entry):
    source = KernelDirectory().module(module).source
    parameters = _parameters(source, entry)
    assert [name for _, name in parameters] == ABI[entry].split()
    for kind, name in parameters:
        if name in POINTER_TYPES:
            assert kind == POINTER_TYPES[name]
        elif "*" not in kind:
            assert kind == "int", f"{entry}: scalar {name} must be int, got {kind}"


def test_module_source_is_prelude_then_module():
    kernels = KernelDirectory()
    module = kernels.module("csa_ratio4_attention")
    prelude = (kernels.path / PRELUDE).read_text()
    body = (kernels.path / "csa_ratio4_attention.cu").read_text()
    assert module.source == prelude + "\n" + body
    assert module.sha256 == hashlib.sha256(module.source.encode()).hexdigest()
    assert module.entry == "csa_ratio4_sink_attention"


def test_fingerprint_lists_every_file():
    fingerprint = KernelDirectory().fingerprint()
    assert fingerprint["builtin"] is True
    assert set(fingerprint["files"]) == {PRELUDE} | {stem + ".cu" for stem in MODULES}


def test_missing_directory_and_missing_module_are_environment_errors(tmp_path):
    with pytest.raises(DeviceUnavailable, match="does not exist"):
        KernelDirectory(tmp_path / "nowhere")
    (tmp_path / PRELUDE).write_text("// prelude\n")
    kernels = KernelDirectory(tmp_path)
    with pytest.raises(DeviceUnavailable, match="csa_ratio4_attention.cu"):
        kernels.module("csa_ratio4_attention")


def test_compile_options_forbid_contraction_and_approximation():
    assert NVCC_OPTIONS == STRICT_OPTIONS
    assert {"--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false"} <= set(STRICT_OPTIONS)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_compiles_for_sm90_without_contraction(module, tmp_path):
    """prelude + module through nvcc with the runner's flags; the PTX must hold no f32 fma/mad
    (every binary32 operation rounds on its own) and no approximate or flush-to-zero instruction."""
    source = KernelDirectory().module(module)
    unit = tmp_path / f"{module}.cu"
    unit.write_text(source.source)
    ptx = tmp_path / f"{module}.ptx"
    result = subprocess.run(
        [NVCC, "-arch=sm_90", *NVCC_OPTIONS, "--ptx", str(unit), "-o", str(ptx)],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    text = ptx.read_text()
    assert f".entry {source.entry}(" in text
    for forbidden in ("fma.rn.f32", "mad.f32", "mad.rn.f32", ".approx.", ".ftz."):
        assert forbidden not in text, f"{module}: PTX contains {forbidden}"
