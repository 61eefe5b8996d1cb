"""Accept/reject decisions of the CPU reference, check for check and message for message.

The seed-001 kernel validates a step in three places: the factory (node schema
and attributes), ``execute`` (dtypes, shapes, cursors, finiteness, carries) and
the claim-time gate ``unsupported_reason``. The oracle must refuse exactly the
steps the reference refuses, with the first error the reference would report,
so every check in this package keeps the reference's order and text. Checks the
reference makes that cannot fail here (runtime arity repeated after creation,
output dtypes and shapes the oracle produces itself, byte-size overflows of
arrays that already exist) are left out.

Each module holds one of those places (or a piece one of them shares); this
module is the public surface the oracle, device, fixtures and CLI import from.
"""

from __future__ import annotations

from csa_conform.contract.attributes import CACHE_FORMATS, LAYOUT_VERSION, stored_record_width
from csa_conform.contract.bias import attention_bias
from csa_conform.contract.claim import ANY, NONZERO, claim_metadata, unsupported_reason
from csa_conform.contract.execute import DENSE_WINDOW
from csa_conform.contract.geometry import StepGeometry
from csa_conform.contract.messages import HARNESS, OP
from csa_conform.contract.schema import (
    BIAS_INPUT,
    INDEX_INPUTS,
    INPUT_NAMES,
    OUTPUT_NAMES,
    REQUIRED_INPUTS,
    REQUIRED_OUTPUTS,
)
from csa_conform.contract.step import validate_step
from csa_conform.numerics.fp4 import FP4_BLOCK
from csa_conform.numerics.fp8 import FP8_BLOCK
from csa_conform.numerics.records import FP4_BLOCK_BYTES, FP8_BLOCK_BYTES
from csa_conform.numerics.rustfmt import rust_display_f32

__all__ = [
    "INPUT_NAMES",
    "OUTPUT_NAMES",
    "StepGeometry",
    "attention_bias",
    "claim_metadata",
    "rust_display_f32",
    "stored_record_width",
    "unsupported_reason",
    "validate_step",
]
