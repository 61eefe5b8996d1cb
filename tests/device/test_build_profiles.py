"""Build profiles and kernel manifests: which options a module is compiled with, and how a
directory declares it (csa-kernels.toml); the run header and JSON say so per module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from csa_conform.check.results import schema
from csa_conform.cli import main
from csa_conform.cli.diff import diff
from csa_conform.device.kernels import LINE_INFO, MANIFEST, STRICT_OPTIONS, KernelDirectory
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode

KERNELS = Path(__file__).resolve().parents[2] / "kernels"


def _copy(tmp_path: Path, manifest: str | None = None) -> Path:
    target = Path(shutil.copytree(KERNELS, tmp_path / "kernels"))
    if manifest is not None:
        (target / MANIFEST).write_text(manifest)
    return target


def test_builtin_kernels_default_to_strict_and_other_directories_to_production(tmp_path):
    assert KernelDirectory().build.options == STRICT_OPTIONS
    assert KernelDirectory().build.origin == "default for the built-in kernels"
    production = KernelDirectory(_copy(tmp_path)).build
    assert (production.name, production.options) == ("production", ())
    assert production.nvrtc_options("compute_90") == ("--gpu-architecture=compute_90", LINE_INFO)


def test_manifest_declares_profile_options_includes_and_file_names(tmp_path):
    kernels = _copy(tmp_path, 'build = "strict"\nnvrtc-options = ["-DMY_SWITCH=1"]\ninclude-paths = ["inc"]\n'
                              '[modules]\ncsa_ratio4_attention = "attention4.cu"\n')
    (kernels / "csa_ratio4_attention.cu").rename(kernels / "attention4.cu")
    directory = KernelDirectory(kernels)
    assert directory.build.options == STRICT_OPTIONS + ("-DMY_SWITCH=1",)
    assert directory.build.origin == MANIFEST
    assert directory.build.nvrtc_options("compute_90")[-3:] == (
        f"--include-path={(kernels / 'inc').resolve()}", "--gpu-architecture=compute_90", LINE_INFO)
    module = directory.module("csa_ratio4_attention")
    assert module.path.name == "attention4.cu" and module.entry == "csa_ratio4_sink_attention"
    assert MANIFEST in directory.fingerprint()["files"]
    overridden = KernelDirectory(kernels, build="production", nvrtc_options=("--ftz=true",)).build
    assert overridden.options == ("-DMY_SWITCH=1", "--ftz=true") and overridden.origin == "--build"


@pytest.mark.parametrize("manifest, message", [
    ("build = [", "not valid TOML"),
    ('build = "fast"', "build must be one of strict, production"),
    ('nvrtc-options = "-DX"', "nvrtc-options must be a list of strings"),
    ('flags = ["-DX"]', "unknown key 'flags'"),
    ('[modules]\nattention = "a.cu"', "maps the module names"),
])
def test_bad_manifests_are_usage_errors(tmp_path, manifest, message):
    with pytest.raises(UsageError, match=message):
        KernelDirectory(_copy(tmp_path, manifest))


def test_a_bad_manifest_exits_2_with_one_line(tmp_path, device_goldens):
    kernels = _copy(tmp_path, 'build = "fast"')
    result = CliRunner().invoke(diff, [str(device_goldens), "--kernels", str(kernels)])
    assert result.exit_code == ExitCode.USAGE
    assert result.output.count("\n") == 1 and "csa-kernels.toml: build must be one of" in result.output


def test_help_names_the_default_kernels_and_the_build_options():
    for command in ("diff", "bisect", "explain"):
        text = " ".join(CliRunner().invoke(main, [command, "--help"]).output.split())
        assert "default: the built-in kernels shipped with csa-conform" in text
        for option in ("--build [strict|production]", "--nvrtc-option OPT", "--strict-ptx"):
            assert option in text


@pytest.mark.usefixtures("emulated_cuda")
def test_header_and_json_carry_the_build_of_every_module(device_goldens):
    args = [str(device_goldens), "--case", "boundaries.r4-prefill-5", "--nvrtc-option=-DCSA_UNUSED_SWITCH"]
    text = CliRunner().invoke(diff, args).output
    assert "build strict (default for the built-in kernels): --fmad=false --prec-div=true --prec-sqrt=true " \
           "--ftz=false -DCSA_UNUSED_SWITCH" in text
    assert "  csa_ratio4_attention: --fmad=false" in text and "ptx: no PTX (host emulation)" in text
    assert text.count("  csa_ratio4_attention: ") == 1
    document = json.loads(CliRunner().invoke(diff, args + ["--json"]).stdout)
    jsonschema.validate(document, schema())
    modules = document["kernels"]["modules"]
    assert set(modules) == {"csa_ratio4_main_compression", "csa_ratio4_index_compression",
                            "csa_ratio4_index_select", "csa_ratio4_index_replicate", "csa_ratio4_attention"}
    assert all(module["options"][-3] == "-DCSA_UNUSED_SWITCH" for module in modules.values())
    assert document["kernels"]["kernels"]["build"]["profile"] == "strict"
    assert document["options"]["nvrtc_options"] == ["-DCSA_UNUSED_SWITCH"]


CI_GOLDENS = KERNELS.parent / "goldens" / "ci.h5"


@pytest.mark.usefixtures("emulated_cuda")
def test_an_unchanged_copy_passes_the_ci_suite_under_the_production_build(tmp_path):
    """The built-ins round every product a sum consumes explicitly (__fmul_rn), so a kernel team's
    copy judged under NVRTC's defaults (the emulation: -ffp-contract=fast -mfma) is still exact;
    the same copy with plain products (-DCSA_CONTRACTIBLE) is not."""
    kernels = _copy(tmp_path)
    exact = CliRunner().invoke(diff, [str(CI_GOLDENS), "--kernels", str(kernels), "--build", "production", "-q"])
    assert exact.exit_code == ExitCode.OK, exact.output
    assert " conformant, 0 diverged" in exact.output
    plain = CliRunner().invoke(diff, [str(CI_GOLDENS), "--kernels", str(kernels), "--build", "production",
                                      "--nvrtc-option=-DCSA_CONTRACTIBLE", "-q", "--case", "random.r4-*"])
    assert plain.exit_code == ExitCode.DIVERGED and " diverged" in plain.output
