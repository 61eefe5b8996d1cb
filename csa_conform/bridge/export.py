"""Golden steps written out for runtimes to run alone (specs/bridge.md, "Export layouts").

Every step becomes one model and its inputs: the step's stored inputs, so a
stream's later step takes the previous step's golden ``present_*`` as its
``past_*`` wherever the stream threads them, and runs without the steps
before it. Two layouts: ``nxrt-bridge`` (what the runtime's conformance
runner reads: ``input_K.nxrt`` beside ``model.onnx``, the goldens as
``expected_K.nxrt``, a ``step.json`` describing both) and ``onnx-node-test``
(the ONNX backend test layout: ``model.onnx`` and
``test_data_set_0/input_K.pb`` / ``output_K.pb``, which cannot say "this
step is refused", so rejected steps are left out and counted). The whole
directory appears at once or not at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping

import numpy as np

from csa_conform.bridge import nxrt
from csa_conform.bridge.model import onnx_module, step_model
from csa_conform.errors import OutputWriteError, UsageError
from csa_conform.golden import GoldenFile

NXRT_BRIDGE = "nxrt-bridge"
ONNX_NODE_TEST = "onnx-node-test"
FORMATS = (NXRT_BRIDGE, ONNX_NODE_TEST)
MANIFEST = "export.json"
STEP_FILE = "step.json"
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,150}")


@dataclass
class ExportedStep:
    """One step ready to run: its model, its graph inputs in file order, its golden outputs."""

    case: str
    step: int
    model: bytes
    inputs: dict[str, np.ndarray]  # graph inputs, in the order of input_K
    output_names: tuple[str, ...]
    outputs: dict[str, np.ndarray]  # the golden's (empty for a rejected step)
    expect_error: str | None


def case_folder(case_id: str) -> str:
    """A folder name for a case: the id itself when it is a plain name, else a cleaned one with a digest."""
    if _SAFE.fullmatch(case_id) and case_id not in (".", ".."):
        return case_id
    cleaned = re.sub(r"[^A-Za-z0-9._+-]", "_", case_id)[:100].lstrip(".") or "case"
    return f"{cleaned}-{hashlib.sha256(case_id.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"


def step_folder(step: int) -> str:
    return f"step_{step}"


def exported_steps(golden: GoldenFile, case_id: str) -> Iterator[ExportedStep]:
    """Every step of a case as a model and its tensors, in stream order."""
    info = golden.case_info(case_id)
    for index in range(info.step_count):
        step = golden.read_step(case_id, index)
        try:
            model = step_model(case_id, index, info.attrs, step.inputs, info.output_names, step.outputs or None)
        except UsageError as error:
            raise UsageError(f"case {case_id!r} step {index}: {error}") from None
        names = [value.name for value in model.graph.input]
        yield ExportedStep(case_id, index, model.SerializeToString(), {name: step.inputs[name] for name in names},
                           tuple(info.output_names), dict(step.outputs), step.expect_error)


def _tensor_entry(file: str, name: str, array: np.ndarray) -> dict:
    return {"file": file, "name": name, "dtype": str(array.dtype), "shape": list(array.shape),
            "sha256": hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()}


def write_bridge_step(folder: Path, step: ExportedStep, inputs: Mapping[str, np.ndarray] | None = None) -> None:
    """The runner's case directory of a step: model.onnx and input_K.nxrt (``inputs`` replacing the stored
    ones: a chained run's own state), the goldens as expected_K.nxrt and step.json."""
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(step.model)
    arrays = {**step.inputs, **(inputs or {})}
    described_inputs = []
    for index, (name, array) in enumerate(arrays.items()):
        nxrt.write_tensor(folder / f"input_{index}.nxrt", array)
        described_inputs.append(_tensor_entry(f"input_{index}.nxrt", name, array))
    described_outputs = []
    for index, name in enumerate(step.output_names):
        if name in step.outputs:
            nxrt.write_tensor(folder / f"expected_{index}.nxrt", step.outputs[name])
            described_outputs.append(_tensor_entry(f"expected_{index}.nxrt", name, step.outputs[name]))
    description = {"case": step.case, "step": step.step, "expect_error": step.expect_error,
                   "inputs": described_inputs, "outputs": described_outputs,
                   "runner_writes": [f"output_{index}.nxrt" for index in range(len(step.output_names))]}
    (folder / STEP_FILE).write_text(json.dumps(description, indent=1) + "\n")


def write_node_test_step(folder: Path, step: ExportedStep) -> None:
    """The ONNX backend test layout of an accepted step."""
    numpy_helper = onnx_module().numpy_helper
    data = folder / "test_data_set_0"
    data.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(step.model)
    for index, (name, array) in enumerate(step.inputs.items()):
        (data / f"input_{index}.pb").write_bytes(numpy_helper.from_array(array, name).SerializeToString())
    for index, name in enumerate(step.output_names):
        (data / f"output_{index}.pb").write_bytes(
            numpy_helper.from_array(step.outputs[name], name).SerializeToString())


def export(golden: GoldenFile, case_ids: list[str], layout: str, target: Path) -> dict:
    """Write every step of ``case_ids`` into the (new, empty) folder ``target``; returns the manifest."""
    cases = []
    skipped = 0
    for case_id in case_ids:
        steps = []
        for step in exported_steps(golden, case_id):
            if layout == NXRT_BRIDGE:
                where = Path(case_folder(case_id)) / step_folder(step.step)
                write_bridge_step(target / where, step)
            elif step.expect_error is not None:
                skipped += 1
                continue
            else:
                where = Path(f"test_{case_folder(case_id)}_{step_folder(step.step)}")
                write_node_test_step(target / where, step)
            steps.append({"step": step.step, "folder": str(where), "expect_error": step.expect_error})
        cases.append({"case": case_id, "steps": steps})
    manifest = {"format": layout, "golden": golden.path, "cases": cases, "rejected_steps_left_out": skipped}
    (target / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


@contextmanager
def new_directory(target: Path, force: bool) -> Iterator[Path]:
    """A folder to fill that appears as ``target`` only once complete (replacing it with ``force``).

    It is filled under a hidden name beside the target; an error, SIGINT or SIGTERM removes it.
    """
    target = Path(target)
    if target.exists() or target.is_symlink():
        if not target.is_dir() or target.is_symlink():
            raise UsageError(f"{target}: exists and is not a folder; refusing to replace it (even with --force)")
        if not force:
            raise UsageError(f"{target}: exists; pass --force to replace it")
    if not target.parent.is_dir():
        raise UsageError(f"{target.parent}: no such folder")
    partial = target.parent / f".{target.name[:100]}.csa-conform-{os.getpid()}-{secrets.token_hex(4)}.partial"
    try:
        partial.mkdir()
    except OSError as error:
        raise OutputWriteError(f"{target}: cannot write ({error.strerror}); nothing written") from None
    with removed_on_signal(partial):
        try:
            yield partial
            if target.exists():
                retired = partial.with_suffix(".old")
                os.rename(target, retired)
                os.rename(partial, target)
                shutil.rmtree(retired, ignore_errors=True)
            else:
                os.rename(partial, target)
        except OSError as error:
            shutil.rmtree(partial, ignore_errors=True)
            raise OutputWriteError(f"{target}: cannot write ({error.strerror or type(error).__name__}); "
                                   "nothing written") from None
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise


@contextmanager
def removed_on_signal(folder: Path, stop: Callable[[], None] | None = None) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM call ``stop``, remove ``folder`` and exit with 128 + the signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def remove_and_exit(number, _frame) -> None:
        if stop is not None:
            stop()
        shutil.rmtree(folder, ignore_errors=True)
        name = "interrupted" if number == signal.SIGINT else "terminated"
        try:
            os.write(sys.stderr.fileno(), f"csa-conform: error: {name}; nothing written\n".encode())
        except (OSError, ValueError):
            pass
        os._exit(128 + number)

    previous = {number: signal.signal(number, remove_and_exit) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
