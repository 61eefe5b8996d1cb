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
from csa_conform.contract.bias import attention_bias
from csa_conform.device.candidates import hidden_by_bias
from csa_conform.errors import ContractError
from csa_conform.numerics.bits import differing_bits
from csa_conform.numerics.variant import REFERENCE, Numerics
from csa_conform.oracle.engine import Engine, resolve_engine
from csa_conform.oracle.rows import RowFailure
from csa_conform.oracle.stage_functions import STAGE_FUNCTIONS
from csa_conform.spec import BY_NAME, LAUNCHES

Payloads = Mapping[str, Mapping[str, np.ndarray]]

# explain's oracle re-runs (a stage, an ablated step, the host stages of a probed or ablated device run) run
# on the numpy engine: the same bytes as the compiled one, which every swapped ingredient needs anyway and which
# runs ci-sized steps no slower; the compiled engine would first compile its kernels where numba's cache is
# cold (about 20 s of a whole-ci explain).
ORACLE_ENGINE = "numpy"

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
        return resolve_engine(ORACLE_ENGINE, numerics=self._numerics)

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
    """The stage's payload under `numerics`; raises ContractError as the oracle does, and for candidate ids
    (the device's, read back) that name no row the stage could read."""
    if stage == "sparse_sink_softmax_attention":
        cache = upstream.get("compression_update", {}).get("present_compressed_kv")
        _readable_candidates(g, upstream["candidate_assembly"]["candidates"],
                             g.next_records if cache is None else int(np.shape(cache)[1]))
    payload = STAGE_FUNCTIONS[stage](_StageRun(g, inputs, upstream, numerics))
    if stage == "candidate_assembly":
        payload = _as_read_back(g, inputs, payload, upstream.get(stage, {}).get("candidates"))
    return payload


def _as_read_back(g: StepGeometry, inputs: Mapping[str, np.ndarray], payload: dict, reference) -> dict:
    """Candidate ids as the runner reads them back off the kernel's scores (csa_conform.device.candidates): where
    the bias is -inf on every head no score shows whether the kernel took a slot, so the runner reports the
    reference's id there, and a re-run is held to the same (a window that leaves the query's own position out
    is not refuted by a row the bias masks whole)."""
    if not g.has_bias or reference is None or np.shape(reference) != np.shape(payload["candidates"]):
        return payload
    hidden = hidden_by_bias(attention_bias(inputs["attention_bias"], (g.batch, g.heads, g.sequence, g.candidate_count)))
    return {**payload, "candidates": np.where(hidden, reference, payload["candidates"]).astype(np.int32)}


def _readable_candidates(g: StepGeometry, candidates: np.ndarray, records_held: int) -> None:
    """Every dense id a current_kv position and every record id a record of the cache: a device that
    assembled others (a window one too long reads past current_kv) has no payload the reference computes."""
    candidates = np.asarray(candidates)
    dense, records = candidates[..., : g.dense_candidates], candidates[..., g.dense_candidates:]
    live = dense[dense >= 0]
    if live.size and (live.min() < g.current_kv_base or live.max() >= g.current_kv_base + g.current_kv_len):
        raise ContractError(f"the candidates name dense positions {int(live.min())}..{int(live.max())} outside "
                            f"current_kv ({g.current_kv_base}..{g.current_kv_base + g.current_kv_len - 1})", "invalid")
    live = records[records >= 0]
    if live.size and live.max() >= records_held:
        raise ContractError(f"the candidates name record {int(live.max())} of {records_held}", "invalid")


# In an isolated run the replicate launch repeats the oracle's `selected` as selected_indices: where the index
# select launch's `selected` diverges, selected_indices says nothing of that launch.
ISOLATED_COPIES = {"selection": {"selected_indices": "selected"}}


def judged_tensors(stage: str, target: Mapping[str, np.ndarray], diverged) -> dict:
    """The device payload's tensors a hypothesis about the diverged launch is judged on: all but the copies
    another launch made of the oracle's version of a diverged tensor."""
    copies = ISOLATED_COPIES.get(stage, {})
    return {name: array for name, array in target.items() if copies.get(name) not in diverged}


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
