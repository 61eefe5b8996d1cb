"""`csa-conform export`: every model passes onnx.checker, every exported tensor reads back as the golden's
bytes (with onnx's own readers for the node-test layout), and the folder appears whole or not at all."""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests

import csa_conform.bridge.export as export_module
from csa_conform.cli import main
from csa_conform.contract.schema import INPUT_NAMES
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile

CI = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"
# Two streams (a past state threaded from step 0 to 1), an omitted input before a present one, attributes
# of the wrong ONNX type (a float num_heads, an integer cache_format), a rejected step.
CASES = ["edges.r4-ties-b1n1-i4", "edges.r128-fp8-n2-b2-past128", "errors.arity-r128-missing-head-sink",
         "errors.attr-num-heads-float", "errors.attr-cache-format-not-string"]
ATTRIBUTE_TYPES = {int: onnx.AttributeProto.INT, float: onnx.AttributeProto.FLOAT, str: onnx.AttributeProto.STRING}


def export(layout: str, target: Path, case: str | None = None, force: bool = False):
    words = ["export", str(CI), "--format", layout, "-o", str(target)] + (["--force"] if force else [])
    return CliRunner().invoke(main, words + (["--case", case] if case else []))


def exported(golden: GoldenFile, layout: str, target: Path, cases: list[str]) -> None:
    """The cases exported as the command exports them (--case takes one glob; these are five ids)."""
    with export_module.new_directory(target, False) as folder:
        export_module.export(golden, cases, layout, folder)


def same_bytes(left: np.ndarray, right: np.ndarray) -> bool:
    return left.dtype == right.dtype and left.shape == right.shape and left.tobytes() == right.tobytes()


def check_model(path: Path, attrs: dict, inputs: dict, outputs: tuple[str, ...]) -> onnx.ModelProto:
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    (node,) = model.graph.node
    assert (node.op_type, node.domain) == ("CompressedSparseAttention", "pkg.nxrt")
    assert {(opset.domain, opset.version) for opset in model.opset_import} == {("", 17), ("pkg.nxrt", 1)}
    assert {attribute.name for attribute in node.attribute} == set(attrs)
    for attribute in node.attribute:
        stored = attrs[attribute.name]
        assert attribute.type == ATTRIBUTE_TYPES[type(stored)]
        value = onnx.helper.get_attribute_value(attribute)
        if isinstance(stored, float):
            assert np.float32(value).tobytes() == np.float32(stored).tobytes()
        else:
            assert value == (stored.encode() if isinstance(stored, str) else stored)
    last = max(INPUT_NAMES.index(name) for name in inputs)
    assert list(node.input) == [name if name in inputs else "" for name in INPUT_NAMES[: last + 1]]
    assert [value.name for value in model.graph.input] == [name for name in INPUT_NAMES if name in inputs]
    assert tuple(node.output) == outputs == tuple(value.name for value in model.graph.output)
    return model


def round_trips_bridge(root: Path, golden: GoldenFile, case: str) -> int:
    info = golden.case_info(case)
    for index in range(info.step_count):
        step = golden.read_step(case, index)
        folder = root / case / f"step_{index}"
        model = check_model(folder / "model.onnx", info.attrs, step.inputs, info.output_names)
        names = [value.name for value in model.graph.input]
        described = json.loads((folder / "step.json").read_text())
        assert described["expect_error"] == step.expect_error
        for number, name in enumerate(names):
            assert same_bytes(export_module.nxrt.read_tensor(folder / f"input_{number}.nxrt"), step.inputs[name])
            assert described["inputs"][number]["name"] == name
        for number, name in enumerate(info.output_names if step.expect_error is None else ()):
            assert same_bytes(export_module.nxrt.read_tensor(folder / f"expected_{number}.nxrt"), step.outputs[name])
        assert not list(folder.glob("output_*"))
    return info.step_count


def round_trips_node_test(root: Path, golden: GoldenFile, case: str) -> int:
    info = golden.case_info(case)
    accepted = [index for index in range(info.step_count) if golden.read_step(case, index).expect_error is None]
    for index in accepted:
        step = golden.read_step(case, index)
        folder = root / f"test_{case}_step_{index}"
        model = check_model(folder / "model.onnx", info.attrs, step.inputs, info.output_names)
        for number, value in enumerate(model.graph.input):
            tensor = onnx.load_tensor(str(folder / "test_data_set_0" / f"input_{number}.pb"))
            assert tensor.name == value.name and same_bytes(numpy_helper.to_array(tensor), step.inputs[value.name])
        for number, name in enumerate(info.output_names):
            tensor = onnx.load_tensor(str(folder / "test_data_set_0" / f"output_{number}.pb"))
            assert tensor.name == name and same_bytes(numpy_helper.to_array(tensor), step.outputs[name])
    return len(accepted)


@pytest.fixture(scope="module")
def golden():
    with GoldenFile(CI) as opened:
        yield opened


def test_the_bridge_layout_round_trips(tmp_path, golden):
    exported(golden, "nxrt-bridge", tmp_path / "out", CASES)
    assert sum(round_trips_bridge(tmp_path / "out", golden, case) for case in CASES) == 7
    manifest = json.loads((tmp_path / "out" / "export.json").read_text())
    assert [case["case"] for case in manifest["cases"]] == CASES


def test_the_node_test_layout_loads_with_onnx_readers(tmp_path, golden):
    exported(golden, "onnx-node-test", tmp_path / "out", CASES)
    assert sum(round_trips_node_test(tmp_path / "out", golden, case) for case in CASES) == 4
    tests = load_model_tests(data_dir=str(tmp_path), kind="out")
    assert sorted(test.name for test in tests) == sorted(
        ["test_edges.r4-ties-b1n1-i4_step_0", "test_edges.r4-ties-b1n1-i4_step_1",
         "test_edges.r128-fp8-n2-b2-past128_step_0", "test_edges.r128-fp8-n2-b2-past128_step_1"])
    assert json.loads((tmp_path / "out" / "export.json").read_text())["rejected_steps_left_out"] == 3


def test_a_threaded_past_is_the_previous_golden_present(tmp_path, golden):
    case = "edges.r128-fp8-n2-b2-past128"
    exported(golden, "nxrt-bridge", tmp_path / "out", [case])
    step_1 = tmp_path / "out" / case / "step_1"
    described = {entry["name"]: entry["file"] for entry in json.loads((step_1 / "step.json").read_text())["inputs"]}
    present = golden.read_step(case, 0).outputs["present_compressed_kv"]
    assert present.shape[1] > 0  # a record to carry
    assert same_bytes(export_module.nxrt.read_tensor(step_1 / described["past_compressed_kv"]), present)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["nxrt-bridge", "onnx-node-test"])
def test_the_whole_ci_suite_round_trips(tmp_path, golden, layout):
    result = export(layout, tmp_path / "out")
    assert result.exit_code == ExitCode.OK, result.output
    check = round_trips_bridge if layout == "nxrt-bridge" else round_trips_node_test
    assert sum(check(tmp_path / "out", golden, case) for case in golden.case_ids()) == (
        247 if layout == "nxrt-bridge" else 145)  # the ci suite's steps; 102 of them the reference rejects
    if layout == "onnx-node-test":
        assert len(load_model_tests(data_dir=str(tmp_path), kind="out")) == 145


def test_an_existing_folder_needs_force(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    result = export("nxrt-bridge", tmp_path / "out", CASES[3])
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.strip().splitlines() == [f"csa-conform: error: {tmp_path / 'out'}: exists; pass --force to "
                                                  "replace it"]
    assert export("nxrt-bridge", tmp_path / "out", CASES[3], force=True).exit_code == ExitCode.OK
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["errors.attr-num-heads-float", "export.json"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]


def test_a_failed_write_leaves_nothing(tmp_path, monkeypatch):
    written = []

    def full_disk(folder, step, inputs=None):
        if written:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(folder)
        folder.mkdir(parents=True)
        (folder / "model.onnx").write_bytes(step.model)

    monkeypatch.setattr(export_module, "write_bridge_step", full_disk)
    result = export("nxrt-bridge", tmp_path / "out", "edges.r4-ties-b1n1-i4")
    assert result.exit_code == ExitCode.ENVIRONMENT
    assert result.stderr.strip().splitlines() == [f"csa-conform: error: {tmp_path / 'out'}: cannot write (No space "
                                                  "left on device); nothing written"]
    assert list(tmp_path.iterdir()) == []


def test_without_onnx_it_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)
    result = export("nxrt-bridge", tmp_path / "out", CASES[3])
    assert result.exit_code == ExitCode.ENVIRONMENT
    assert "pip install 'csa-conform[onnx]'" in result.stderr
    assert list(tmp_path.iterdir()) == []
