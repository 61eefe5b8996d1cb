"""The one entry to execute-time validation, so oracle and device refuse the same steps.

Harness naming errors come first, then the factory, then the ratio's own path.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from csa_conform.contract.attributes import create_kernel
from csa_conform.contract.geometry import StepGeometry
from csa_conform.contract.ratio4 import execute_ratio4
from csa_conform.contract.ratio128 import execute_ratio128
from csa_conform.contract.schema import checked_output_names, positional_inputs


def validate_step(
    attrs: Mapping, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
) -> StepGeometry:
    """Run every reference check from kernel creation to the first computation.

    Raises ContractError with the reference's first message; a name the node
    cannot carry (unknown input, outputs out of order) is a harness error.
    """
    arrays = positional_inputs(inputs)
    outputs = checked_output_names(output_names)
    kernel = create_kernel(attrs, [array is not None for array in arrays], len(outputs))
    if kernel.ratio == 4:
        return execute_ratio4(kernel, arrays, outputs)
    return execute_ratio128(kernel, arrays, outputs)
