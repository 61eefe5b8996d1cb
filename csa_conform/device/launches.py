"""The kernel launches of one step: scratch, arguments in the seed's ABI order, payloads read back.

Launch shapes are the CUDA seed's (specs/kernel-abi.md): one thread per batch row
for the compressors, one per (batch, query) for index selection, 256 threads
per (batch, query, head) for attention; a module may declare a wider block for
its entry, which the step's launch uses instead. Each function reads what its kernel
consumes through the step run (the oracle's payloads when isolated) and
stores the payloads of the stages it computes that the plan keeps on the
device; the fused launches also run when only some of their stages are.
``READ_BACKS`` maps each spec ``ReadBack`` (csa_conform.spec.launches) to its
function, which reaches the step only through ``LaunchSite``, so this module imports
nothing from the step or the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

import numpy as np

from csa_conform.contract import DENSE_WINDOW, StepGeometry
from csa_conform.device.candidates import candidates_read_back
from csa_conform.device.tensors import StepTensors
from csa_conform.numerics.records import decode_fp4_record, decode_fp8_record
from csa_conform.spec import BY_NAME, COMPRESSOR_INPUTS, LAUNCHES, Launch, ReadBack

ATTENTION_BLOCK = 256
REPLICATE_BLOCK = 256


class LaunchSite(Protocol):
    """The step a launch runs in (csa_conform.device.step.StepRun)."""

    g: StepGeometry
    t: StepTensors
    stages: dict[str, dict[str, np.ndarray]]
    reference: Mapping[str, Mapping[str, np.ndarray]]

    def backend(self): ...

    def on_device(self, stage: str) -> bool: ...

    def upstream_device(self, stage: str, tensor: str, buffer: str): ...

    def device_arrays(self, *names: str) -> tuple: ...

    def total(self): ...

    @property
    def records(self) -> int: ...

    def bias(self) -> np.ndarray: ...

    def launch(self, launch: Launch, grid: int, block: int, args: tuple, scratch: dict) -> None: ...


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


def _stream(stage: str) -> CompressorStream:
    kv, gate, ape, norm, past_cache, past_carry = COMPRESSOR_INPUTS[stage]
    cache, carry = BY_NAME[stage].outputs
    return CompressorStream(stage, (kv, gate, ape, norm), past_cache, past_carry, cache, carry)


STREAMS = (_stream("compression_update"), _stream("index_key_update"))
RECORD_CACHES = frozenset(name for stream in STREAMS for name in (stream.past_cache, stream.cache))


def reserved_caches(geometry: StepGeometry, capacity: int) -> dict[str, tuple[int, int]]:
    """The record caches a step reserves at ``capacity`` records: name -> (logical records, capacity)."""
    reserved = {}
    for stream in STREAMS:
        reserved[stream.past_cache] = (geometry.past_records, capacity)
        reserved[stream.cache] = (geometry.next_records, capacity)
    return reserved


def kernel_of(stage: str, ratio: int, tensors=()) -> str | None:
    """'module.cu:entry' of the launch that writes the stage's tensors at this ratio (replicate writes
    selection's selected_indices after index select wrote selected); None when no launch computes it."""
    writers = [launch for launch in LAUNCHES if launch.ratio == ratio and stage in launch.stages]
    if not writers:
        return None
    launch = writers[-1] if len(writers) > 1 and "selected_indices" in tensors else writers[0]
    return f"{launch.module}.cu:{launch.entry}"


def _ints(*values: int) -> tuple:
    return tuple(np.int32(value) for value in values)


def compress(run: LaunchSite, launch: Launch) -> None:
    """Stage 1 or 2: the present cache and carry, and the logical records decoded from the cache."""
    g, backend = run.g, run.backend()
    stream = _stream(launch.stages[0])
    fp8 = stream.index or g.cache_format != "f32"
    width = g.index_stored_width if stream.index else g.stored_width
    past_cache, past_carry = run.device_arrays(stream.past_cache, stream.past_carry)
    cache = backend.empty((g.batch, run.records, width), np.uint8 if fp8 else np.float32)
    carry = backend.empty(tuple(int(extent) for extent in past_carry.shape), np.float32)
    kv, gate, ape, norm = run.device_arrays(*stream.sources)
    kept = int(past_cache.shape[1])
    if g.ratio == 128:
        args = (kv, gate, ape, norm, past_carry, past_cache, carry, cache) + _ints(
            g.batch, g.sequence, g.dim, kept, run.records, int(fp8)) + (run.total(),)
    else:
        dim = g.index_dim if stream.index else g.dim
        args = (kv, gate, ape, norm, past_cache, past_carry, cache, carry) + _ints(
            g.batch, g.sequence, dim, g.rope_dim, kept, run.records) + (run.total(),)
    run.launch(launch, g.batch, 1, args, {"record_capacity": run.records})
    run.t.put(stream.cache, cache)
    run.t.put(stream.carry, carry)
    present = run.t.host(stream.cache)
    if stream.index:
        logical = {"logical_keys": decode_fp4_record(present)}
    else:
        logical = {"logical_records": decode_fp8_record(present) if fp8 else present.copy()}
    run.stages[stream.stage] = {stream.cache: present, stream.carry: run.t.host(stream.carry), **logical}


def index_select(run: LaunchSite, launch: Launch) -> None:
    """Stages 3-5 fused: transformed queries, scores (-inf pre-filled) and the shared selection."""
    g, backend = run.g, run.backend()
    rows = g.batch * g.sequence
    capacity = run.records
    key = run.upstream_device("index_key_update", "present_index_key", "present_index_key")
    transformed = backend.empty((rows * g.index_heads * g.index_dim,), np.float32)
    scores = backend.full((rows * capacity,), -np.inf, np.float32)
    selected = backend.full((rows * g.topk_width,), -1, np.int32)
    query, weight = run.device_arrays("index_query", "index_weight")
    args = (query, weight, key, transformed, scores, selected) + _ints(
        g.batch, g.sequence, g.index_heads, g.index_dim, g.rope_dim, capacity) + (run.total(),) + _ints(
        g.topk_width)
    scratch = {"transformed": int(transformed.size), "scores": int(scores.size), "selected": int(selected.size)}
    run.launch(launch, rows, 1, args, scratch)
    shape = (g.batch, g.sequence)
    if run.on_device("index_query_finalize"):
        run.stages["index_query_finalize"] = {
            "transformed": backend.download(transformed).reshape(shape + (g.index_heads, g.index_dim))
        }
    if run.on_device("index_scoring"):
        scores = backend.download(scores).reshape(shape + (capacity,))[..., : g.next_records]
        run.stages["index_scoring"] = {"scores": np.ascontiguousarray(scores)}
    run.t.put("selected", selected)


def replicate(run: LaunchSite, launch: Launch) -> None:
    """Stage 5's second tensor: every index head repeats the shared selection."""
    g, backend = run.g, run.backend()
    shared = run.upstream_device("selection", "selected", "selected")
    out = backend.empty((g.batch, g.index_heads, g.sequence, g.topk_width), np.int32)
    grid = max(1, -(-out.size // REPLICATE_BLOCK))
    args = (shared, out) + _ints(g.batch, g.index_heads, g.sequence, g.topk_width)
    run.launch(launch, grid, REPLICATE_BLOCK, args, {})
    run.t.put("selected_indices", out)
    run.stages["selection"] = {
        "selected": run.t.host("selected").reshape(g.batch, g.sequence, g.topk_width),
        "selected_indices": run.t.host("selected_indices"),
    }


def _bias_arguments(run: LaunchSite) -> tuple:
    """The bias buffer and its broadcast extents [B,N,S,C] (a dummy and 1s when there is none)."""
    g = run.g
    if g.has_bias:
        bias = run.t.device("attention_bias")
        shape = (1,) * (4 - bias.ndim) + tuple(int(extent) for extent in bias.shape)
    else:
        bias = run.backend().full((1,), 0, np.float32)
        shape = (1, 1, 1, 1)
    return bias, _ints(int(g.has_bias), *shape) + (np.float32(g.scale),)


def attend(run: LaunchSite, launch: Launch) -> None:
    """Stages 6-7 fused: candidate ids read off the score scratch, the scores and Y."""
    g, backend = run.g, run.backend()
    rows = g.batch * g.sequence * g.heads
    stride = DENSE_WINDOW + (g.topk_width if g.ratio == 4 else run.records)
    compressed = run.upstream_device("compression_update", "present_compressed_kv", "present_compressed_kv")
    scores = backend.full((rows * stride,), -np.inf, np.float32)
    output = backend.empty((g.batch, g.sequence, g.heads, g.dim), np.float32)
    query, current_kv, sink = run.device_arrays("query", "current_kv", "head_sink")
    bias, bias_args = _bias_arguments(run)
    sizes = _ints(g.batch, g.sequence, g.heads, g.dim, g.current_kv_len) + (run.total(),)
    if g.ratio == 128:
        selected = None
        args = (query, current_kv, compressed, sink, bias, output, scores) + sizes + _ints(
            run.records, stride, int(g.cache_format != "f32")) + bias_args
    else:
        selected = run.upstream_device("selection", "selected_indices", "selected_indices")
        args = (query, current_kv, compressed, selected, sink, bias, output, scores) + sizes + _ints(
            run.records, g.index_heads, g.topk_width, stride) + bias_args
    run.launch(launch, rows, ATTENTION_BLOCK, args, {"scores": int(scores.size), "stride": stride})
    row_scores = backend.download(scores).reshape(g.batch, g.sequence, g.heads, stride)[..., : g.candidate_count]
    if run.on_device("candidate_assembly"):
        selection_rows = None if selected is None else backend.download(selected)[:, 0]
        run.stages["candidate_assembly"] = {
            "candidates": candidates_read_back(g, row_scores, selection_rows, run.bias() if g.has_bias else None,
                                               run.reference, run.t.host("query"), run.t.host("current_kv"))
        }
    if run.on_device("sparse_sink_softmax_attention"):
        run.t.put("Y", output)
        run.stages["sparse_sink_softmax_attention"] = {"scores": row_scores, "Y": run.t.host("Y")}


READ_BACKS: dict[ReadBack, Callable[[LaunchSite, Launch], None]] = {
    ReadBack.COMPRESS: compress,
    ReadBack.INDEX_SELECT: index_select,
    ReadBack.REPLICATE: replicate,
    ReadBack.ATTEND: attend,
}
