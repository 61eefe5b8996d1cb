"""One step's stages in pipeline order, each on the device or on the host oracle.

A stage the plan keeps on the device is computed by its kernel launch
(csa_conform.device.launches); a stage forced to the host runs the oracle's
stage function on what this run produced upstream (chained) or on the
oracle's own payloads (isolated). Either way its payload lands in the same
place, so the result answers in the oracle's shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping

import numpy as np

from csa_conform.contract import StepGeometry, attention_bias
from csa_conform.device import launches
from csa_conform.device.modes import DEVICE, STAGES, Mode, StepPlan
from csa_conform.device.provenance import HOST_PATH, NVRTC_PATH, LaunchRecord
from csa_conform.device.tensors import StepTensors
from csa_conform.errors import ContractError
from csa_conform.oracle import StepResult
from csa_conform.oracle.candidate_assembly import candidate_assembly
from csa_conform.oracle.compression_update import compression_update
from csa_conform.oracle.index_key_update import index_key_update
from csa_conform.oracle.index_query_finalize import index_query_finalize
from csa_conform.oracle.index_scoring import causal_mask, index_scoring
from csa_conform.oracle.selection import selection
from csa_conform.oracle.sparse_sink_softmax_attention import sparse_sink_softmax_attention

if TYPE_CHECKING:
    from csa_conform.device.runner import DeviceRunner

# present_* output -> the past_* input it becomes in the next step of a stream.
STATE_THREADING = {
    "present_compressed_kv": "past_compressed_kv",
    "present_compression_carry": "past_compression_carry",
    "present_index_key": "past_index_key",
    "present_index_carry": "past_index_carry",
}

# Operator output -> the stage payload it is written back from.
WRITEBACK_SOURCES = {
    "Y": ("sparse_sink_softmax_attention", "Y"),
    "present_compressed_kv": ("compression_update", "present_compressed_kv"),
    "present_compression_carry": ("compression_update", "present_compression_carry"),
    "present_index_key": ("index_key_update", "present_index_key"),
    "present_index_carry": ("index_key_update", "present_index_carry"),
    "selected_indices": ("selection", "selected_indices"),
}


@dataclass(frozen=True)
class CompressorStream:
    """The tensors of one compressor: the main stream (stage 1) or the index stream (stage 2)."""

    stage: str
    sources: tuple[str, str, str, str]
    past_cache: str
    past_carry: str
    cache: str
    carry: str

    @property
    def index(self) -> bool:
        return self.stage == "index_key_update"


MAIN_STREAM = CompressorStream(
    "compression_update", ("compressor_kv", "compressor_gate", "compressor_ape", "compressor_norm"),
    "past_compressed_kv", "past_compression_carry", "present_compressed_kv", "present_compression_carry",
)
INDEX_STREAM = CompressorStream(
    "index_key_update",
    ("index_compressor_kv", "index_compressor_gate", "index_compressor_ape", "index_compressor_norm"),
    "past_index_key", "past_index_carry", "present_index_key", "present_index_carry",
)


@dataclass
class DeviceStepResult(StepResult):
    """StepResult plus the present_* tensors as produced (device arrays where the device made them)."""

    present: dict[str, object] = field(default_factory=dict)
    launches: list[LaunchRecord] = field(default_factory=list)


class HostStageRejected(ContractError):
    """A stage forced to the host refused what this run fed it (e.g. a top-k tie in device scores)."""

    def __init__(self, stage: str, message: str, kind: str = "invalid"):
        super().__init__(message, kind)
        self.stage = stage


def _accepted(payload: dict, failure) -> dict:
    """A row-failing stage function's payload, or the reference's rejection it reports."""
    if failure is not None:
        raise ContractError(failure.message, failure.kind)
    return payload


class StepRun:
    """The launches and host stages of one step, in pipeline order."""

    def __init__(self, runner: DeviceRunner, geometry: StepGeometry, plan: StepPlan, tensors: StepTensors,
                 reference: Mapping[str, Mapping[str, np.ndarray]], case: str, step: int):
        self.runner = runner
        self.g = geometry
        self.plan = plan
        self.t = tensors
        self.reference = reference
        self.case = case
        self.step = step
        self.stages: dict[str, dict[str, np.ndarray]] = {}
        self.launches: list[LaunchRecord] = []

    # --- what a stage reads, and the records of what ran ---------------------------------

    @property
    def isolated(self) -> bool:
        return self.plan.mode is Mode.ISOLATED

    def backend(self):
        return self.runner.backend()

    def on_device(self, stage: str) -> bool:
        return self.plan.placement(stage) == DEVICE

    def launches_module(self, module: str) -> bool:
        return any(launch.module == module for launch in self.plan.launches)

    def upstream(self, stage: str, tensor: str) -> np.ndarray:
        """An earlier stage's payload as this stage sees it: the oracle's when isolated."""
        if self.isolated:
            return self.reference[stage][tensor]
        return self.stages[stage][tensor]

    def upstream_device(self, stage: str, tensor: str, buffer: str):
        """The device buffer a kernel reads for an earlier stage's tensor."""
        if self.isolated:
            return self.backend().upload(self.reference[stage][tensor])
        return self.t.device(buffer)

    def device_arrays(self, *names: str) -> tuple:
        return tuple(self.t.device(name) for name in names)

    def total(self):
        return self.t.device("total_sequence_length")

    def bias(self) -> np.ndarray:
        g = self.g
        return attention_bias(self.t.host("attention_bias"), (g.batch, g.heads, g.sequence, g.candidate_count))

    def launch(self, module: str, grid: int, block: int, args: tuple, stages: tuple[str, ...], scratch: dict):
        backend = self.backend()
        source = self.runner.kernels.module(module)
        function = backend.function(source)
        grid3, block3 = (int(grid), 1, 1), (int(block), 1, 1)
        backend.launch(source.entry, function, grid3, block3, args)
        self.record(LaunchRecord(NVRTC_PATH, stages, module, source.entry, source.sha256, grid3, block3, scratch))

    def record(self, launch: LaunchRecord) -> None:
        launch = LaunchRecord(**{**launch.__dict__, "case": self.case, "step": self.step})
        self.launches.append(launch)
        self.runner.provenance.record(launch)

    def host_stage(self, stage: str, compute: Callable[[], dict]) -> dict:
        try:
            payload = compute()
        except ContractError as error:
            raise HostStageRejected(stage, str(error), error.kind) from None
        self.record(LaunchRecord(HOST_PATH, (stage,), module=f"csa_conform.oracle.{stage}"))
        return payload

    # --- the pipeline ----------------------------------------------------------------------

    def execute(self) -> DeviceStepResult:
        self.compression(MAIN_STREAM)
        if self.g.ratio == 4:
            self.compression(INDEX_STREAM)
            self.index_selection()
        self.attention()
        self.writeback()
        present = {name: self.t.produced(name) for name in self.g.output_names if name in STATE_THREADING}
        stages = {stage: self.stages[stage] for stage in STAGES if stage in self.stages}
        return DeviceStepResult(outputs=stages["writeback"], stages=stages, present=present, launches=self.launches)

    def compression(self, stream: CompressorStream) -> None:
        if self.on_device(stream.stage):
            launches.compress(self, stream)
            return
        update = index_key_update if stream.index else compression_update
        payload = self.host_stage(stream.stage, lambda: update(
            self.g, *(self.t.host(name) for name in stream.sources),
            self.t.host(stream.past_cache), self.t.host(stream.past_carry),
        ))
        self.t.put(stream.cache, payload[stream.cache])
        self.t.put(stream.carry, payload[stream.carry])
        self.stages[stream.stage] = payload

    def index_selection(self) -> None:
        g = self.g
        if self.launches_module("csa_ratio4_index_select"):
            launches.index_select(self)
        if not self.on_device("index_query_finalize"):
            self.stages["index_query_finalize"] = self.host_stage("index_query_finalize", lambda: _accepted(
                *index_query_finalize(g, self.t.host("index_query"))
            ))
        if not self.on_device("index_scoring"):
            transformed = self.upstream("index_query_finalize", "transformed")
            keys = self.upstream("index_key_update", "logical_keys")
            self.stages["index_scoring"] = self.host_stage("index_scoring", lambda: _accepted(
                *index_scoring(g, transformed, keys, self.t.host("index_weight"), None)
            ))
        if self.on_device("selection"):
            launches.replicate(self)
            return
        scores = self.upstream("index_scoring", "scores")
        live = causal_mask(g, scores.shape[-1], None)
        payload = self.host_stage("selection", lambda: selection(g, scores, live))
        self.stages["selection"] = payload
        self.t.put("selected_indices", payload["selected_indices"])

    def attention(self) -> None:
        g = self.g
        module = "csa_ratio128_attention" if g.ratio == 128 else "csa_ratio4_attention"
        if self.launches_module(module):
            launches.attend(self, module)
        if not self.on_device("candidate_assembly"):
            selected = self.upstream("selection", "selected") if g.ratio == 4 else None
            self.stages["candidate_assembly"] = self.host_stage(
                "candidate_assembly", lambda: candidate_assembly(g, selected)
            )
        if not self.on_device("sparse_sink_softmax_attention"):
            records = self.upstream("compression_update", "logical_records")
            candidates = self.upstream("candidate_assembly", "candidates")
            bias = self.bias() if g.has_bias else None
            payload = self.host_stage("sparse_sink_softmax_attention", lambda: sparse_sink_softmax_attention(
                g, self.t.host("query"), self.t.host("current_kv"), records, candidates,
                self.t.host("head_sink"), bias,
            ))
            self.stages["sparse_sink_softmax_attention"] = payload
            self.t.put("Y", payload["Y"])

    def writeback(self) -> None:
        """The operator outputs: the buffers this run wrote (chained), or the oracle's payloads
        when isolated, where writeback only assembles what the other stages were compared on."""
        if self.on_device("writeback") and not self.isolated:
            self.stages["writeback"] = {name: self.t.host(name) for name in self.g.output_names}
            return

        def assemble() -> dict:
            return {name: self.upstream(*WRITEBACK_SOURCES[name]) for name in self.g.output_names}

        self.stages["writeback"] = assemble() if self.on_device("writeback") else self.host_stage("writeback", assemble)
