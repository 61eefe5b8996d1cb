"""The pipeline spec: stages, payloads and kernel launches as plain data, declared once.

No code of the oracle or the device lives here and nothing here imports
them; they, explain, the CLI, the plugin and the spec tables derive from it.
A new stage or launch starts as an entry here (CONTRIBUTING.md lists the rest).
"""

from csa_conform.spec.axes import OPERATOR_AXES, payload_axes
from csa_conform.spec.launches import (
    LAUNCHES,
    POISON,
    Launch,
    ReadBack,
    fused,
    kernel_modules,
    launch_of,
    launches_for_ratio,
)
from csa_conform.spec.stages import (
    BY_NAME,
    COMPRESSOR_INPUTS,
    DECODED_PAYLOADS,
    FLOAT_STAGES,
    PAST_STATE,
    PIPELINE,
    STAGE_NAMES,
    STATE_THREADING,
    WRITEBACK,
    WRITEBACK_SOURCES,
    Mode,
    Payload,
    Role,
    Stage,
    resolve_stage,
    stage_spellings,
    stages_for_ratio,
)
from csa_conform.spec.table import payload_table

__all__ = [
    "BY_NAME", "COMPRESSOR_INPUTS", "DECODED_PAYLOADS", "FLOAT_STAGES", "LAUNCHES", "Mode", "OPERATOR_AXES", "PAST_STATE", "PIPELINE", "POISON",
    "STAGE_NAMES", "STATE_THREADING", "WRITEBACK", "WRITEBACK_SOURCES", "Launch", "Payload", "ReadBack", "Role",
    "Stage", "fused", "kernel_modules", "launch_of", "launches_for_ratio", "payload_axes", "payload_table", "resolve_stage",
    "stage_spellings", "stages_for_ratio",
]
