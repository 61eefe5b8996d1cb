"""One stage of the oracle re-run on the inputs a device stage consumed (the isolated run's).

In an isolated run every kernel reads the oracle's upstream payloads, except
from stages computed earlier in its own fused launch (index select: stages
3-5; attention: 6-7), which it computes itself; UPSTREAM_IN_LAUNCH names
those, so the re-run reads the device's payload there. The re-run is the
oracle's stage function, that table comes from the pipeline spec (csa_conform.spec).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.errors import ContractError
from csa_conform.numerics.bits import differing_bits
from csa_conform.numerics.variant import REFERENCE, Numerics
from csa_conform.oracle.engine import Engine, resolve_engine
from csa_conform.oracle.rows import RowFailure
from csa_conform.oracle.stage_functions import STAGE_FUNCTIONS
from csa_conform.spec import BY_NAME, LAUNCHES

Payloads = Mapping[str, Mapping[str, np.ndarray]]

# stage -> the upstream stage it reads that the same fused launch computes on the device
UPSTREAM_IN_LAUNCH = {
    stage: earlier
    for launch in LAUNCHES
    for position, stage in enumerate(launch.stages)
    for earlier in launch.stages[:position]
    if earlier in BY_NAME[stage].reads
}


class _StageRun:
    """What one re-run stage reads: the kernel's inputs and the upstream payloads it consumed.

    A row failure is raised at once: with one stage re-run there is no later
    stage to defer it to, and the device stage's payload cannot be reproduced.
    """

    def __init__(self, geometry: StepGeometry, inputs: Mapping[str, np.ndarray], upstream: Payloads,
                 numerics: Numerics):
        self.geometry = geometry
        self._inputs = inputs
        self._upstream = upstream
        self._numerics = numerics

    @property
    def engine(self) -> Engine:
        """The run's numerics variant decides (a swapped ingredient runs on the numpy engine)."""
        return resolve_engine(numerics=self._numerics)

    def input(self, name: str) -> np.ndarray:
        return self._inputs[name]

    def upstream(self, stage: str, tensor: str) -> np.ndarray:
        return self._upstream[stage][tensor]

    def row_failure(self, stage: str, failure: RowFailure | None) -> None:
        if failure is not None:
            raise ContractError(failure.message, failure.kind)

    def prior_failure(self, stage: str) -> RowFailure | None:
        return None


def run_stage(stage: str, g: StepGeometry, inputs: Mapping[str, np.ndarray], upstream: Payloads,
              numerics: Numerics = REFERENCE) -> dict:
    """The stage's payload under `numerics`; raises ContractError as the oracle does."""
    return STAGE_FUNCTIONS[stage](_StageRun(g, inputs, upstream, numerics))


def consumed_upstream(stage: str, expected: Payloads, actual: Payloads) -> dict:
    """The upstream payloads the device stage read in an isolated run."""
    upstream = dict(expected)
    own = UPSTREAM_IN_LAUNCH.get(stage)
    if own is not None and own in actual:
        upstream[own] = actual[own]
    return upstream


def mismatches(payload: Mapping[str, np.ndarray], target: Mapping[str, np.ndarray]) -> tuple[int, int]:
    """(differing elements, elements) over the tensors both payloads hold, compared bit for bit."""
    differing = total = 0
    for name, array in target.items():
        mine = np.asarray(payload[name])
        array = np.asarray(array)
        total += array.size
        if mine.shape != array.shape or mine.dtype != array.dtype:
            differing += array.size
            continue
        differing += int(np.count_nonzero(differing_bits(mine, array)))
    return differing, total
