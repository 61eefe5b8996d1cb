"""Run one step on both oracle engines and compare what they give, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform import ContractError
from csa_conform.oracle import run_step
from csa_conform.oracle.engine import numba_available

needs_numba = pytest.mark.skipif(
    not numba_available(), reason="numba is not installed (pip install -e '.[fast]'); only the numpy engine runs"
)


def outcome(attrs, inputs, output_names, engine: str):
    """("rejected", message, kind) or ("ran", {stage/tensor: (dtype, shape, bytes)})."""
    try:
        result = run_step(attrs, inputs, output_names, engine=engine)
    except ContractError as error:
        return ("rejected", str(error), error.kind)
    payloads = {f"outputs/{name}": value for name, value in result.outputs.items()}
    for stage, tensors in result.stages.items():
        payloads.update({f"{stage}/{name}": value for name, value in tensors.items()})
    return ("ran", {key: _fingerprint(value) for key, value in payloads.items()})


def _fingerprint(array):
    array = np.asarray(array)
    return str(array.dtype), array.shape, np.ascontiguousarray(array).tobytes()


def assert_engines_agree(attrs, inputs, output_names) -> tuple:
    """Both engines' outcomes, asserted identical; returns the numpy one."""
    reference = outcome(attrs, inputs, output_names, "numpy")
    compiled = outcome(attrs, inputs, output_names, "numba")
    assert compiled[0] == reference[0], (reference[:2], compiled[:2])
    if reference[0] == "rejected":
        assert compiled == reference
        return reference
    assert compiled[1].keys() == reference[1].keys()
    for key, expected in reference[1].items():
        assert compiled[1][key] == expected, f"{key} differs between the numpy and numba engines"
    return reference
