"""The stages composed as the reference runs them, in the order csa_conform.spec declares.

Ratio 4 runs all eight stages; ratio 128 skips stages 2-5. The reference
rejects a step at its first failure, so stages run in pipeline order and a
ContractError stops the step; the ratio-4 selection path defers its row
failures to selection, which raises the earliest row's (the reference checks
query rows one at a time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from csa_conform.contract import StepGeometry, validate_step
from csa_conform.oracle.engine import Engine, resolve_engine
from csa_conform.oracle.rows import RowFailure
from csa_conform.oracle.stage_functions import STAGE_FUNCTIONS
from csa_conform.spec import WRITEBACK, stages_for_ratio


@dataclass
class StepResult:
    """Operator outputs and the boundary payload of every stage that ran."""

    outputs: dict[str, np.ndarray]
    stages: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)


class _OracleRun:
    """The stage inputs of the oracle's own run: stored inputs, this run's payloads, deferred row failures."""

    def __init__(self, geometry: StepGeometry, inputs: Mapping[str, np.ndarray], engine: Engine):
        self.geometry = geometry
        self.engine = engine
        self.tensors = {name: np.ascontiguousarray(value) for name, value in inputs.items()}
        self.stages: dict[str, dict[str, np.ndarray]] = {}
        self.failures: dict[str, RowFailure] = {}

    def input(self, name: str) -> np.ndarray:
        return self.tensors[name]

    def upstream(self, stage: str, tensor: str) -> np.ndarray:
        return self.stages[stage][tensor]

    def row_failure(self, stage: str, failure: RowFailure | None) -> None:
        if failure is not None:
            self.failures[stage] = failure

    def prior_failure(self, stage: str) -> RowFailure | None:
        return self.failures.get(stage)


def run_step(
    attrs: Mapping, inputs: Mapping[str, np.ndarray], output_names: Sequence[str], engine: str | None = None
) -> StepResult:
    """One step; ``engine`` is numpy, numba or auto (default: $CSA_CONFORM_ENGINE, else auto)."""
    kernels = resolve_engine(engine)
    geometry = validate_step(attrs, inputs, output_names)
    run = _OracleRun(geometry, inputs, kernels)
    for stage in stages_for_ratio(geometry.ratio):
        run.stages[stage.name] = STAGE_FUNCTIONS[stage.name](run)
    return StepResult(outputs=run.stages[WRITEBACK.name], stages=run.stages)
