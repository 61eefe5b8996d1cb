"""A conformance runner that speaks the runtime's protocol with csa-conform's own operator (specs/bridge.md).

``python -m csa_conform.bridge.stand_in MODEL CASE_DIR`` reads the model's
node and ``input_K.nxrt``, runs the step, writes ``output_K.nxrt`` and prints
one status line, as the runtime's ``conformance_runner`` does: ``OK`` (exit
0), ``ERROR`` (exit 3) for a step the contract refuses or a file it cannot
read. By default the oracle computes the step; ``--backend host`` runs the
built-in kernels through the host backend (g++, no GPU), every stage on the
host oracle when ``ONNX_GENAI_CSA_FORCE_HOST`` is set, as the CUDA provider
reads it. ``--perturb CASE@STEP:OUTPUT`` flips the lowest bit of that
output's first element at that step (for tests of the bridge itself), only
while ``--perturb-when NAME`` is set in the environment if given.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from csa_conform.bridge import nxrt
from csa_conform.bridge.model import read_node

ORACLE = "oracle"
HOST = "host"
USAGE_EXIT = 64


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m csa_conform.bridge.stand_in",
                                     description="A conformance runner that computes the step with csa-conform.")
    parser.add_argument("model", type=Path)
    parser.add_argument("case_dir", type=Path)
    parser.add_argument("--backend", choices=(ORACLE, HOST), default=ORACLE)
    parser.add_argument("--perturb", metavar="CASE@STEP:OUTPUT", default=None)
    parser.add_argument("--perturb-when", metavar="NAME", default=None)
    try:
        return parser.parse_args(argv)
    except SystemExit as done:
        sys.exit(USAGE_EXIT if done.code else 0)


def _perturbation(spec: str | None) -> tuple[str, int, str] | None:
    if spec is None:
        return None
    where, colon, output = spec.rpartition(":")
    case, at, step = where.rpartition("@")
    if not (colon and at and step.isdigit() and output):
        print(f"usage: --perturb CASE@STEP:OUTPUT, got {spec!r}", file=sys.stderr)
        sys.exit(USAGE_EXIT)
    return case, int(step), output


def _compute(backend: str, attrs: dict, inputs: dict, output_names: tuple[str, ...]) -> dict[str, np.ndarray]:
    if backend == ORACLE:
        from csa_conform.oracle import run_step

        return run_step(attrs, inputs, output_names).outputs
    from csa_conform.device.backend import HOST as HOST_BACKEND
    from csa_conform.device.backend import backend_named
    from csa_conform.device.plan import force_host_from_environment
    from csa_conform.device.runner import DeviceRunner

    runner = DeviceRunner(force_host=force_host_from_environment(), backend_factory=backend_named(HOST_BACKEND))
    return {name: np.asarray(value) for name, value in runner.run_step(attrs, inputs, output_names).outputs.items()}


def run(argv: list[str]) -> tuple[str, int]:
    """The status line and exit code of one step."""
    arguments = _arguments(argv)
    perturb = _perturbation(arguments.perturb)
    from csa_conform.bridge.model import onnx_module

    try:
        node = read_node(onnx_module().load(str(arguments.model)))
    except Exception as error:  # the runtime's loader reports any model it cannot load the same way
        return f"ERROR\tfailed to load model {arguments.model}: {' '.join(str(error).split())}", 3
    inputs = {}
    for index, name in enumerate(node.inputs):
        path = arguments.case_dir / f"input_{index}.nxrt"
        try:
            inputs[name] = nxrt.read_tensor(path)
        except Exception as error:
            return f"ERROR\tfailed to read input {name!r} from {path}: {error}", 3
    try:
        outputs = _compute(arguments.backend, node.attrs, inputs, node.outputs)
    except Exception as error:  # a refused step, as the session reports it
        return f"ERROR\t{' '.join(str(error).split())}", 3
    forced = arguments.perturb_when is None or os.environ.get(arguments.perturb_when, "") not in ("", "0")
    for index, name in enumerate(node.outputs):
        array = np.ascontiguousarray(outputs[name]).copy()
        if perturb == (node.case, node.step, name) and forced and array.size:
            array.reshape(-1).view(np.uint8)[0] ^= 1
        nxrt.write_tensor(arguments.case_dir / f"output_{index}.nxrt", array)
    return f"OK\t{len(node.outputs)} outputs", 0


def main() -> None:
    line, code = run(sys.argv[1:])
    print(line)
    sys.exit(code)


if __name__ == "__main__":
    main()
