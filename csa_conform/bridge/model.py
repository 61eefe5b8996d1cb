"""One golden step as a single-node ONNX model of ``pkg.nxrt::CompressedSparseAttention`` (specs/bridge.md).

The node carries the case's attributes as stored (an integer stays an INT,
a float a FLOAT, a string a STRING, so a case that feeds the factory a float
``num_heads`` exports one and the runtime must refuse it too), its inputs by
the contract's names and positions (an omitted optional input is the empty
name ONNX gives it) and its outputs in the contract's order. Graph inputs
are the present inputs in positional order, which is the order the runner
reads ``input_K.nxrt`` in. The ``onnx`` package is an optional extra: only
exporting and reading models needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from csa_conform.contract.schema import INPUT_NAMES, OUTPUT_NAMES
from csa_conform.errors import OP, MissingExtra, UsageError

DOMAIN = "pkg.nxrt"
OPSET = 1
DEFAULT_OPSET = 17
IR_VERSION = 9  # what the runtime's own conformance models use
CASE_KEY = "csa_conform.case"  # metadata_props naming the golden step a model came from
STEP_KEY = "csa_conform.step"

# Output dtypes and ranks by the contract, for a step the reference rejects (no golden outputs to type them).
OUTPUT_RANKS = {"Y": 4, "present_compressed_kv": 3, "present_compression_carry": 4, "present_index_key": 3,
                "present_index_carry": 4, "selected_indices": 4}


def onnx_module():
    """The ``onnx`` package, or one line saying how to install it."""
    try:
        import onnx
    except ImportError as error:
        raise MissingExtra(f"reading and writing ONNX models needs the onnx package ({error}): "
                           "pip install 'csa-conform[onnx]'") from None
    return onnx


def _contract_dtype(name: str, attrs: Mapping) -> np.dtype:
    if name == "present_compressed_kv" and attrs.get("cache_format") == "f32":
        return np.dtype(np.float32)
    return np.dtype({"present_compressed_kv": np.uint8, "present_index_key": np.uint8,
                     "selected_indices": np.int32}.get(name, np.float32))


def _attribute(onnx, name: str, value):
    if isinstance(value, (bool, np.bool_)) or value is None:
        raise UsageError(f"attribute {name} is {value!r}, which an ONNX attribute cannot carry")
    return onnx.helper.make_attribute(name, value.item() if isinstance(value, np.generic) else value)


def step_model(case_id: str, step: int, attrs: Mapping, inputs: Mapping[str, np.ndarray],
               output_names: Sequence[str], outputs: Mapping[str, np.ndarray] | None = None):
    """The model of one step; ``outputs`` (the golden's) give the outputs' exact types when the step runs."""
    onnx = onnx_module()
    helper = onnx.helper
    unknown = sorted(set(inputs) - set(INPUT_NAMES))
    if unknown or tuple(output_names) != OUTPUT_NAMES[: len(output_names)]:
        raise UsageError(f"case {case_id!r} step {step}: inputs {unknown} or outputs {list(output_names)} "
                         "are not the contract's")
    present = [index for index, name in enumerate(INPUT_NAMES) if name in inputs]
    node_inputs = [name if name in inputs else "" for name in INPUT_NAMES[: present[-1] + 1]] if present else []
    node = helper.make_node(OP, node_inputs, list(output_names), name=OP, domain=DOMAIN)
    node.attribute.extend(_attribute(onnx, name, value) for name, value in sorted(attrs.items()))

    def typed(name: str, dtype, shape) -> object:
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)

    graph_inputs = [typed(name, inputs[name].dtype, list(inputs[name].shape)) for name in node_inputs if name]
    graph_outputs = []
    for name in output_names:
        if outputs is not None and name in outputs:
            graph_outputs.append(typed(name, outputs[name].dtype, list(outputs[name].shape)))
        else:
            graph_outputs.append(typed(name, _contract_dtype(name, attrs),
                                       [f"{name}_{axis}" for axis in range(OUTPUT_RANKS[name])]))
    graph = helper.make_graph([node], "csa_step", graph_inputs, graph_outputs)
    model = helper.make_model(graph, producer_name="csa-conform", ir_version=IR_VERSION,
                              opset_imports=[helper.make_opsetid("", DEFAULT_OPSET),
                                             helper.make_opsetid(DOMAIN, OPSET)])
    helper.set_model_props(model, {CASE_KEY: case_id, STEP_KEY: str(step)})
    onnx.checker.check_model(model, full_check=True)
    return model


@dataclass(frozen=True)
class StepNode:
    """What a runtime reads off an exported model: the node's attributes, graph inputs and outputs."""

    attrs: dict
    inputs: tuple[str, ...]  # graph inputs, in the order of input_K.nxrt
    outputs: tuple[str, ...]
    case: str
    step: int


def read_node(model) -> StepNode:
    """The node of a model this module wrote (any other single-node CSA model reads the same)."""
    helper = onnx_module().helper
    nodes = list(model.graph.node)
    if len(nodes) != 1 or nodes[0].op_type != OP or nodes[0].domain != DOMAIN:
        raise UsageError(f"not a single-node {DOMAIN}::{OP} model")
    attrs = {}
    for attribute in nodes[0].attribute:
        value = helper.get_attribute_value(attribute)
        attrs[attribute.name] = value.decode("utf-8") if isinstance(value, bytes) else value
    props = {entry.key: entry.value for entry in model.metadata_props}
    return StepNode(attrs, tuple(value.name for value in model.graph.input),
                    tuple(value.name for value in model.graph.output), props.get(CASE_KEY, ""),
                    int(props.get(STEP_KEY, "-1")))
