"""generate --profile names the profile in the file's root; verify re-runs the profile the file names."""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest
from click.testing import CliRunner
from golden_edits import reseal

from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile, write_goldens
from csa_conform.profiles.numerics import PROFILE_ATTR

CASES = "seed-closed-form.r4-prefill-8"
TIE_CASE = "errors.topk-tie-zero-weights"


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("profiles")
    made = {}
    for profile in ("reference", "official"):
        path = folder / f"{profile}.h5"
        result = invoke("generate", "--case", CASES, "--profile", profile, "-o", str(path), "-q")
        assert result.exit_code == ExitCode.OK, result.output
        made[profile] = path
    return made


def test_the_root_names_a_profile_other_than_the_reference(files):
    with h5py.File(files["reference"]) as handle:
        assert PROFILE_ATTR not in handle.attrs
    with h5py.File(files["official"]) as handle:
        assert handle.attrs[PROFILE_ATTR] == "official"


def test_both_profiles_share_inputs_and_shared_stages_but_not_attention(files):
    with GoldenFile(files["reference"]) as reference, GoldenFile(files["official"]) as official:
        ref, off = reference.read_step(CASES, 0), official.read_step(CASES, 0)
        for name, value in ref.inputs.items():
            assert off.inputs[name].tobytes() == value.tobytes(), name
        for stage in ("compression_update", "index_key_update", "index_query_finalize"):
            for tensor, value in ref.stages[stage].items():
                assert off.stages[stage][tensor].tobytes() == value.tobytes(), (stage, tensor)
        assert off.outputs["Y"].tobytes() != ref.outputs["Y"].tobytes()


def test_verify_reruns_the_profile_the_file_names(files, tmp_path):
    result = invoke("verify", str(files["official"]), "-q")
    assert result.exit_code == ExitCode.OK, result.output
    # The same file resealed without its profile attribute reads as a reference file, and fails.
    stripped = tmp_path / "stripped.h5"
    stripped.write_bytes(files["official"].read_bytes())
    reseal(stripped, lambda cases: None)
    result = invoke("verify", str(stripped), "-q")
    assert result.exit_code == ExitCode.DIVERGED
    assert "sparse_sink_softmax_attention/Y" in result.output


def test_an_unknown_profile_is_a_malformed_file(files, tmp_path):
    bogus = tmp_path / "bogus.h5"
    with GoldenFile(files["official"]) as golden:
        cases = [golden.read_case(case) for case in golden.case_ids()]
    write_goldens(bogus, cases, provenance={"suite": "ci", PROFILE_ATTR: "fastest"})
    result = invoke("verify", str(bogus))
    assert result.exit_code == ExitCode.USAGE
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "fastest" in line and "Traceback" not in result.output


def test_a_tie_the_reference_rejects_is_stored_with_outputs_under_official(tmp_path):
    path = tmp_path / "tie.h5"
    result = invoke("generate", "--case", TIE_CASE, "--profile", "official", "-o", str(path), "-q")
    assert result.exit_code == ExitCode.OK, result.output
    with GoldenFile(path) as golden:
        step = golden.read_step(TIE_CASE, 0)
    assert step.expect_error is None and "selected_indices" in step.outputs
    assert invoke("verify", str(path), "-q").exit_code == ExitCode.OK
