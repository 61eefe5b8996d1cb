"""One operator step on the device kernels, answered in the oracle's shape.

``DeviceRunner.run_step(attrs, inputs, output_names)`` returns a StepResult
like ``csa_conform.oracle.run_step`` does: operator outputs plus the boundary
payload of every stage (CONTRACT.md §2), here read back from the buffers and
scratch the runner owns, so ``diff`` never cares which side it compares.

Launches follow the CUDA seed's dispatch: one thread per batch row for the
compressors, one per (batch, query) for index selection, 256 threads per
(batch, query, head) for attention. Stages the plan puts on the host run the
oracle's stage functions on whatever this run produced upstream (chained) or
on the oracle's own payloads (isolated). Candidate ids are not a kernel
output (attention fuses stages 6 and 7): the device's stage-6 payload is read
off its score scratch — a slot is valid where some head's score is not -inf —
with the dense position or the record id the kernel dereferenced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from csa_conform.contract import StepGeometry, attention_bias, validate_step
from csa_conform.device.kernels import NVRTC_OPTIONS, KernelDirectory
from csa_conform.device.modes import DEVICE, STAGES, Mode, StepPlan, plan_step
from csa_conform.device.provenance import HOST_PATH, NVRTC_PATH, LaunchRecord, RunProvenance
from csa_conform.errors import ContractError, UsageError
from csa_conform.numerics.records import decode_fp4_record, decode_fp8_record
from csa_conform.oracle import StepResult
from csa_conform.oracle.candidate_assembly import candidate_assembly
from csa_conform.oracle.compression_update import compression_update
from csa_conform.oracle.index_key_update import index_key_update
from csa_conform.oracle.index_query_finalize import index_query_finalize
from csa_conform.oracle.index_scoring import causal_mask, index_scoring
from csa_conform.oracle.selection import selection
from csa_conform.oracle.sparse_sink_softmax_attention import sparse_sink_softmax_attention

DENSE_WINDOW = 128
ATTENTION_BLOCK = 256
REPLICATE_BLOCK = 256

# present_* output -> the past_* input it becomes in the next step of a stream.
STATE_THREADING = {
    "present_compressed_kv": "past_compressed_kv",
    "present_compression_carry": "past_compression_carry",
    "present_index_key": "past_index_key",
    "present_index_carry": "past_index_carry",
}


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


class _Tensors:
    """Named step tensors held on the host, the device or both; copies happen on first need."""

    def __init__(self, backend: Callable[[], object]):
        self._backend = backend
        self._host: dict[str, np.ndarray] = {}
        self._device: dict[str, object] = {}

    def put(self, name: str, value) -> None:
        self._host.pop(name, None)
        self._device.pop(name, None)
        if isinstance(value, np.ndarray) or np.isscalar(value):
            self._host[name] = np.asarray(value)
        else:
            self._device[name] = value

    def host(self, name: str) -> np.ndarray:
        if name not in self._host:
            self._host[name] = self._backend().download(self._device[name])
        return self._host[name]

    def device(self, name: str):
        if name not in self._device:
            self._device[name] = self._backend().upload(self._host[name])
        return self._device[name]

    def produced(self, name: str):
        """The tensor where it lives now (device array if it was made or copied there)."""
        return self._device[name] if name in self._device else self._host[name]


class DeviceRunner:
    """Runs steps on one kernel directory under one mode and force-host set."""

    def __init__(
        self,
        kernels: KernelDirectory | None = None,
        *,
        mode: Mode | str = Mode.CHAINED,
        force_host: frozenset[str] | set[str] = frozenset(),
        backend_factory: Callable[[], object] | None = None,
    ):
        self.kernels = kernels if kernels is not None else KernelDirectory()
        self.mode = Mode(mode)
        self.force_host = frozenset(force_host)
        self._backend_factory = backend_factory
        self._backend = None
        self.provenance = RunProvenance(None, self.kernels.fingerprint(), NVRTC_OPTIONS)

    def backend(self):
        """The CUDA backend, created on the first device launch (never for an all-host run)."""
        if self._backend is None:
            if self._backend_factory is None:
                from csa_conform.device.cuda import CudaBackend

                self._backend_factory = CudaBackend
            self._backend = self._backend_factory()
            self.provenance.device = self._backend.info()
            self.provenance.nvrtc_options = tuple(getattr(self._backend, "compile_options", NVRTC_OPTIONS))
        return self._backend

    def plan(self, ratio: int) -> StepPlan:
        return plan_step(ratio, self.mode, self.force_host)

    def run_step(
        self,
        attrs: Mapping,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        reference: Mapping[str, Mapping[str, np.ndarray]] | None = None,
        past: Mapping[str, object] | None = None,
        case: str = "",
        step: int = -1,
    ) -> DeviceStepResult:
        """Run one accepted step; ``reference`` (oracle payloads) is required in isolated mode.

        ``past`` replaces past_* inputs with tensors a previous step produced
        (device arrays stay on the device), which is how a chained stream runs.
        """
        geometry = validate_step(attrs, inputs, output_names)
        plan = self.plan(geometry.ratio)
        if plan.mode is Mode.ISOLATED and reference is None:
            raise UsageError("isolated mode needs the oracle's stage payloads for the step")
        tensors = _Tensors(self.backend)
        for name, value in inputs.items():
            tensors.put(name, value)
        for name, value in (past or {}).items():
            tensors.put(name, value)
        run = _StepRun(self, geometry, plan, tensors, reference or {}, case, step)
        return run.execute()


class _StepRun:
    """The launches and host stages of one step, in pipeline order."""

    def __init__(self, runner: DeviceRunner, geometry: StepGeometry, plan: StepPlan, tensors: _Tensors,
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

    # --- plumbing -----------------------------------------------------------------------

    @property
    def isolated(self) -> bool:
        return self.plan.mode is Mode.ISOLATED

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
            return self.runner.backend().upload(self.reference[stage][tensor])
        return self.t.device(buffer)

    def launch(self, module: str, grid: int, block: int, args: tuple, stages: tuple[str, ...], scratch: dict):
        backend = self.runner.backend()
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

    @staticmethod
    def checked(payload: dict, failure) -> dict:
        """A row-failing stage function's payload, or the reference's rejection it reports."""
        if failure is not None:
            raise ContractError(failure.message, failure.kind)
        return payload

    def device_arrays(self, *names: str) -> tuple:
        return tuple(self.t.device(name) for name in names)

    def total(self):
        return self.t.device("total_sequence_length")

    @staticmethod
    def ints(*values: int) -> tuple:
        return tuple(np.int32(value) for value in values)

    # --- the pipeline ---------------------------------------------------------------------

    def execute(self) -> DeviceStepResult:
        self.compression("compression_update", "compressor", "present_compressed_kv", "present_compression_carry")
        if self.g.ratio == 4:
            self.compression("index_key_update", "index_compressor", "present_index_key", "present_index_carry")
            self.index_selection()
        self.attention()
        self.writeback()
        present = {name: self.t.produced(name) for name in self.g.output_names if name in STATE_THREADING}
        stages = {stage: self.stages[stage] for stage in STAGES if stage in self.stages}
        return DeviceStepResult(outputs=stages["writeback"], stages=stages, present=present, launches=self.launches)

    def compression(self, stage: str, prefix: str, cache_name: str, carry_name: str) -> None:
        sources = [f"{prefix}_{part}" for part in ("kv", "gate", "ape", "norm")]
        past_cache, past_carry = "past" + cache_name[len("present"):], "past" + carry_name[len("present"):]
        index = stage == "index_key_update"
        if not self.on_device(stage):
            update = index_key_update if index else compression_update
            payload = self.host_stage(stage, lambda: update(
                self.g, *(self.t.host(name) for name in sources), self.t.host(past_cache), self.t.host(past_carry)
            ))
            self.t.put(cache_name, payload[cache_name])
            self.t.put(carry_name, payload[carry_name])
            self.stages[stage] = payload
            return
        g = self.g
        backend = self.runner.backend()
        fp8 = index or g.cache_format != "f32"
        width = g.index_stored_width if index else g.stored_width
        past = self.device_arrays(past_cache, past_carry)
        cache = backend.empty((g.batch, g.next_records, width), np.uint8 if fp8 else np.float32)
        carry = backend.empty(tuple(int(extent) for extent in past[1].shape), np.float32)
        kv, gate, ape, norm = self.device_arrays(*sources)
        kept = int(past[0].shape[1])
        if g.ratio == 128:
            module = "csa_ratio128_compression"
            args = (kv, gate, ape, norm, past[1], past[0], carry, cache) + self.ints(
                g.batch, g.sequence, g.dim, kept, g.next_records, int(fp8)) + (self.total(),)
        else:
            module = "csa_ratio4_index_compression" if index else "csa_ratio4_main_compression"
            dim = g.index_dim if index else g.dim
            args = (kv, gate, ape, norm, past[0], past[1], cache, carry) + self.ints(
                g.batch, g.sequence, dim, g.rope_dim, kept, g.next_records) + (self.total(),)
        self.launch(module, g.batch, 1, args, (stage,), {"record_capacity": g.next_records})
        self.t.put(cache_name, cache)
        self.t.put(carry_name, carry)
        present = self.t.host(cache_name)
        if index:
            logical = {"logical_keys": decode_fp4_record(present)}
        else:
            logical = {"logical_records": decode_fp8_record(present) if fp8 else present.copy()}
        self.stages[stage] = {cache_name: present, carry_name: self.t.host(carry_name), **logical}

    def index_selection(self) -> None:
        g = self.g
        if self.launches_module("csa_ratio4_index_select"):
            self.index_select_kernel()
        if not self.on_device("index_query_finalize"):
            self.stages["index_query_finalize"] = self.host_stage("index_query_finalize", lambda: self.checked(
                *index_query_finalize(g, self.t.host("index_query"))
            ))
        if not self.on_device("index_scoring"):
            transformed = self.upstream("index_query_finalize", "transformed")
            keys = self.upstream("index_key_update", "logical_keys")
            self.stages["index_scoring"] = self.host_stage("index_scoring", lambda: self.checked(
                *index_scoring(g, transformed, keys, self.t.host("index_weight"), None)
            ))
        if self.on_device("selection"):
            self.replicate_kernel()
        else:
            scores = self.upstream("index_scoring", "scores")
            live = causal_mask(g, scores.shape[-1], None)
            payload = self.host_stage("selection", lambda: selection(g, scores, live))
            self.stages["selection"] = payload
            self.t.put("selected_indices", payload["selected_indices"])

    def index_select_kernel(self) -> None:
        g = self.g
        backend = self.runner.backend()
        rows = g.batch * g.sequence
        capacity = g.next_records
        key = self.upstream_device("index_key_update", "present_index_key", "present_index_key")
        transformed = backend.empty((rows * g.index_heads * g.index_dim,), np.float32)
        scores = backend.full((rows * capacity,), -np.inf, np.float32)
        selected = backend.full((rows * g.topk_width,), -1, np.int32)
        query, weight = self.device_arrays("index_query", "index_weight")
        args = (query, weight, key, transformed, scores, selected) + self.ints(
            g.batch, g.sequence, g.index_heads, g.index_dim, g.rope_dim, capacity) + (self.total(),) + self.ints(
            g.topk_width)
        stages = ("index_query_finalize", "index_scoring", "selection")
        scratch = {"transformed": int(transformed.size), "scores": int(scores.size), "selected": int(selected.size)}
        self.launch("csa_ratio4_index_select", rows, 1, args, stages, scratch)
        shape = (g.batch, g.sequence)
        if self.on_device("index_query_finalize"):
            self.stages["index_query_finalize"] = {
                "transformed": backend.download(transformed).reshape(shape + (g.index_heads, g.index_dim))
            }
        if self.on_device("index_scoring"):
            self.stages["index_scoring"] = {"scores": backend.download(scores).reshape(shape + (capacity,))}
        self.t.put("selected", selected)

    def replicate_kernel(self) -> None:
        g = self.g
        backend = self.runner.backend()
        shared = self.upstream_device("selection", "selected", "selected")
        out = backend.empty((g.batch, g.index_heads, g.sequence, g.topk_width), np.int32)
        count = out.size
        grid = max(1, -(-count // REPLICATE_BLOCK))
        args = (shared, out) + self.ints(g.batch, g.index_heads, g.sequence, g.topk_width)
        self.launch("csa_ratio4_index_replicate", grid, REPLICATE_BLOCK, args, ("selection",), {})
        self.t.put("selected_indices", out)
        self.stages["selection"] = {
            "selected": self.t.host("selected").reshape(g.batch, g.sequence, g.topk_width),
            "selected_indices": self.t.host("selected_indices"),
        }

    def bias(self):
        g = self.g
        return attention_bias(self.t.host("attention_bias"), (g.batch, g.heads, g.sequence, g.candidate_count))

    def attention(self) -> None:
        g = self.g
        module = "csa_ratio128_attention" if g.ratio == 128 else "csa_ratio4_attention"
        if self.launches_module(module):
            self.attention_kernel(module)
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

    def attention_kernel(self, module: str) -> None:
        g = self.g
        backend = self.runner.backend()
        rows = g.batch * g.sequence * g.heads
        compressed_width = g.topk_width if g.ratio == 4 else g.next_records
        stride = DENSE_WINDOW + compressed_width
        compressed = self.upstream_device("compression_update", "present_compressed_kv", "present_compressed_kv")
        scores = backend.full((rows * stride,), -np.inf, np.float32)
        output = backend.empty((g.batch, g.sequence, g.heads, g.dim), np.float32)
        query, current_kv, sink = self.device_arrays("query", "current_kv", "head_sink")
        if g.has_bias:
            bias = self.t.device("attention_bias")
            shape = (1,) * (4 - bias.ndim) + tuple(int(extent) for extent in bias.shape)
        else:
            bias = backend.full((1,), 0, np.float32)
            shape = (1, 1, 1, 1)
        bias_args = self.ints(int(g.has_bias), *shape) + (np.float32(g.scale),)
        if g.ratio == 128:
            selected = None
            args = (query, current_kv, compressed, sink, bias, output, scores) + self.ints(
                g.batch, g.sequence, g.heads, g.dim, g.current_kv_len) + (self.total(),) + self.ints(
                g.next_records, stride, int(g.cache_format != "f32")) + bias_args
        else:
            selected = self.upstream_device("selection", "selected_indices", "selected_indices")
            args = (query, current_kv, compressed, selected, sink, bias, output, scores) + self.ints(
                g.batch, g.sequence, g.heads, g.dim, g.current_kv_len) + (self.total(),) + self.ints(
                g.next_records, g.index_heads, g.topk_width, stride) + bias_args
        stages = ("candidate_assembly", "sparse_sink_softmax_attention")
        self.launch(module, rows, ATTENTION_BLOCK, args, stages, {"scores": int(scores.size), "stride": stride})
        all_scores = backend.download(scores).reshape(g.batch, g.sequence, g.heads, stride)
        row_scores = all_scores[..., : g.candidate_count]
        if self.on_device("candidate_assembly"):
            kernel_selection = None if selected is None else backend.download(selected)[:, 0]
            self.stages["candidate_assembly"] = {"candidates": self.candidates_read_back(row_scores, kernel_selection)}
        if self.on_device("sparse_sink_softmax_attention"):
            self.t.put("Y", output)
            self.stages["sparse_sink_softmax_attention"] = {"scores": row_scores, "Y": self.t.host("Y")}

    def candidates_read_back(self, scores: np.ndarray, selection_rows: np.ndarray | None) -> np.ndarray:
        """Stage-6 ids the fused kernel attended to: a slot counts where some head scored it.

        Ids are the dense position or the record the kernel dereferenced. Where
        the bias is -inf on every head a slot's validity cannot be observed in
        the scores, so there it is taken from the cursors.
        """
        g = self.g
        positions = g.start + np.arange(g.sequence)
        dense_start = np.maximum(g.current_kv_base, np.maximum(positions + 1 - DENSE_WINDOW, 0))
        dense = dense_start[:, None] + np.arange(g.dense_candidates)[None, :]
        if selection_rows is None:
            compressed = np.broadcast_to(np.arange(g.next_records), (g.sequence, g.next_records))
            ids = np.broadcast_to(np.concatenate([dense, compressed], axis=-1), scores.shape[:2] + (scores.shape[3],))
        else:
            ids = np.concatenate([np.broadcast_to(dense, (g.batch,) + dense.shape), selection_rows], axis=-1)
        valid = (scores != -np.inf).any(axis=2)
        if g.has_bias:
            structural = candidate_assembly(g, selection_rows)["candidates"] >= 0
            valid |= (self.bias() == -np.inf).all(axis=1) & structural
        return np.where(valid, ids, -1).astype(np.int32)

    def writeback(self) -> None:
        """The operator outputs: the buffers this run wrote (chained), or the oracle's payloads
        when isolated, where writeback only assembles what the other stages were compared on."""
        if self.on_device("writeback") and not self.isolated:
            self.stages["writeback"] = {name: self.t.host(name) for name in self.g.output_names}
            return
        sources = {
            "Y": ("sparse_sink_softmax_attention", "Y"),
            "present_compressed_kv": ("compression_update", "present_compressed_kv"),
            "present_compression_carry": ("compression_update", "present_compression_carry"),
            "present_index_key": ("index_key_update", "present_index_key"),
            "present_index_carry": ("index_key_update", "present_index_carry"),
            "selected_indices": ("selection", "selected_indices"),
        }

        def assemble() -> dict:
            return {name: self.upstream(*sources[name]) for name in self.g.output_names}

        on_device = self.on_device("writeback")
        self.stages["writeback"] = assemble() if on_device else self.host_stage("writeback", assemble)
