"""A step from position 0 may omit its carries (the contract clears them there): readers hand out the
cleared carry in its positional place, so every consumer sees the inputs a stored cleared carry gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from csa_conform.check.verify import verify_case
from csa_conform.cli import main
from csa_conform.golden import GoldenFile, GoldenStep, write_goldens
from csa_conform.oracle import run_step

CI_GOLDENS = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"
CARRIES = ("past_compression_carry", "past_index_carry")


def _without_carries(case_id: str, names: tuple[str, ...], path: Path):
    """The ci case (a prefill from position 0, whose stored carries are cleared) rewritten without ``names``."""
    with GoldenFile(CI_GOLDENS) as golden:
        case = golden.read_case(case_id)
    stored = case.steps[0]
    case.steps[0] = GoldenStep({name: array for name, array in stored.inputs.items() if name not in names},
                               stored.outputs, stored.stages)
    write_goldens(path, [case])
    return stored


@pytest.mark.parametrize("case_id, names", [
    ("boundaries.r4-prefill-9", CARRIES),
    ("boundaries.r4-prefill-9", ("past_index_carry",)),
    ("seed-closed-form.r128-full-recompute-257", ("past_compression_carry",)),
])
def test_omitted_carries_read_back_cleared_in_their_place_and_verify(tmp_path, case_id, names):
    path = tmp_path / "omitted.h5"
    stored = _without_carries(case_id, names, path)
    for name in names:  # what a generated file stores at position 0: kv 0, score -inf
        assert (stored.inputs[name][:, :, 0] == 0).all() and (stored.inputs[name][:, :, 1] == -np.inf).all()
    with GoldenFile(path) as golden:
        assert golden.cleared_carries(case_id, 0) == names
        assert not {f"inputs/{name}" for name in names} & {path for path, _ in golden.dataset_entries(case_id, 0)}
        read = golden.read_step(case_id, 0)
        assert list(read.inputs) == list(stored.inputs)  # positional order, the carries in their place
        for name, array in stored.inputs.items():
            assert read.inputs[name].dtype == array.dtype and read.inputs[name].tobytes() == array.tobytes(), name
        assert verify_case(golden, case_id).passed
        result = run_step(golden.case_info(case_id).attrs, read.inputs, list(golden.case_info(case_id).output_names))
    for name, array in stored.outputs.items():
        assert result.outputs[name].tobytes() == array.tobytes(), name


def test_inspect_says_the_carries_are_omitted_and_read_cleared(tmp_path):
    path = tmp_path / "omitted.h5"
    _without_carries("boundaries.r4-prefill-9", CARRIES, path)
    said = "omitted: read as the cleared carry (kv 0, score -inf), since the step starts at position 0"
    result = CliRunner().invoke(main, ["inspect", str(path), "boundaries.r4-prefill-9"])
    assert result.exit_code == 0 and f"step 0: past_compression_carry, past_index_carry {said}" in result.stdout
    result = CliRunner().invoke(main, ["inspect", str(path), "boundaries.r4-prefill-9", "--step", "0"])
    assert result.exit_code == 0
    assert f"inputs/past_compression_carry: {said}" in result.stdout
    assert f"inputs/past_index_carry: {said}" in result.stdout
    result = CliRunner().invoke(main, ["inspect", str(CI_GOLDENS), "boundaries.r4-prefill-9", "--step", "0"])
    assert result.exit_code == 0 and "omitted" not in result.stdout


def test_a_rejected_step_keeps_the_inputs_it_lacks(tmp_path):
    """A missing input may be what the reference rejects: a rejected step's absent carry is not supplied."""
    with GoldenFile(CI_GOLDENS) as golden:
        case = golden.read_case("boundaries.r4-prefill-9")
    inputs = {name: array for name, array in case.steps[0].inputs.items() if name != "past_index_carry"}
    case.steps[0] = GoldenStep(inputs, expect_error="InvalidArgument: 18 inputs")
    write_goldens(tmp_path / "rejected.h5", [case])
    with GoldenFile(tmp_path / "rejected.h5") as golden:
        assert golden.cleared_carries(case.case_id, 0) == ()
        assert "past_index_carry" not in golden.read_step(case.case_id, 0).inputs
