"""Shrinking a divergent case to a minimal repro: the engine behind ``csa-conform reduce``.

A case's divergence is named by the first divergent step's earliest stage and
tensor (what ``bisect`` reports). Any smaller case whose chained device run
diverges at the same stage and tensor replaces it: first the stream started
at the failing step from its stored past state (earlier steps put back only
when the divergence needs the device's own state from them) with the later
steps dropped, then, greedily, fewer batch rows, fewer query tokens of the
last step, fewer heads, index heads and top-k slots, and fewer leading steps.
Every candidate is a fresh oracle run of the transformed inputs (one the
contract rejects is skipped), so the reduced case verifies by construction;
the search stops at a fixed point or when its time budget is spent.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from csa_conform.device.conformance import first_divergence, replay
from csa_conform.device.modes import STAGES
from csa_conform.device.runner import DeviceRunner
from csa_conform.errors import ContractError
from csa_conform.goldens import GoldenCase, GoldenFile, GoldenStep, write_goldens
from csa_conform.oracle import run_step
from csa_conform.stages import STATE_THREADING

# The axis of each per-row, per-token, per-head and per-index-head input (attention_bias aside).
BATCH_AXIS = dict.fromkeys(
    ("query", "current_kv", "compressor_kv", "compressor_gate", "past_compressed_kv", "past_compression_carry",
     "seqlens_k", "index_query", "index_weight", "index_compressor_kv", "index_compressor_gate", "past_index_key",
     "past_index_carry"), 0)
TOKEN_AXIS = dict.fromkeys(
    ("query", "compressor_kv", "compressor_gate", "index_query", "index_weight", "index_compressor_kv",
     "index_compressor_gate"), 1)
HEAD_AXIS = {"query": 2, "head_sink": 0}
INDEX_HEAD_AXIS = {"index_query": 2, "index_weight": 2}
BIAS = "attention_bias"
# attention_bias broadcasts to [B, N, S, C] from the right: its axis for each of those, by rank.
BIAS_DIMENSION = {"B": 4, "N": 3, "S": 2, "C": 1}
# At most this many single-row / single-head candidates are tried before halves.
SINGLES = 4


@dataclass(frozen=True)
class Stream:
    """A case as the reducer edits it: attributes and each step's inputs; ``threaded[i]`` names the
    past_* inputs of step i that are the previous step's present_* (re-derived by the oracle)."""

    attrs: dict
    output_names: tuple[str, ...]
    steps: tuple[dict[str, np.ndarray], ...]
    threaded: tuple[frozenset[str], ...]

    @property
    def batch(self) -> int:
        return int(self.steps[-1]["query"].shape[0])

    @property
    def tokens(self) -> int:
        return int(self.steps[-1]["query"].shape[1])

    @property
    def heads(self) -> int:
        return int(self.attrs["num_heads"])

    @property
    def index_heads(self) -> int:
        return int(self.attrs.get("index_num_heads", 0))

    @property
    def topk(self) -> int:
        return int(self.attrs.get("index_topk", 0))

    def elements(self) -> int:
        """Input elements over every step: the size the acceptance criteria measure."""
        return sum(int(array.size) for step in self.steps for array in step.values())

    def shape(self) -> dict[str, int]:
        longest = {axis: max(int(step[name].shape[1]) for step in self.steps)
                   for axis, name in (("S", "query"), ("Kc", "current_kv"))}
        shape = {"steps": len(self.steps), "B": self.batch, **longest, "N": self.heads}
        if self.index_heads:
            shape.update(I=self.index_heads, topk=self.topk)
        return shape

    def from_step(self, first: int) -> Stream:
        return replace(self, steps=self.steps[first:], threaded=(frozenset(),) + self.threaded[first + 1:])

    def upto(self, last: int) -> Stream:
        return replace(self, steps=self.steps[: last + 1], threaded=self.threaded[: last + 1])

    def case(self, case_id: str, description: str) -> GoldenCase | None:
        """The oracle's golden case of this stream, None when the contract rejects a step."""
        steps: list[GoldenStep] = []
        for index, stored in enumerate(self.steps):
            inputs = dict(stored)
            if index:
                before = steps[-1].outputs
                inputs.update({past: before[present] for present, past in STATE_THREADING.items()
                               if past in self.threaded[index] and present in before})
            try:
                result = run_step(self.attrs, inputs, list(self.output_names))
            except ContractError:
                return None
            steps.append(GoldenStep(inputs=inputs, outputs=dict(result.outputs), stages=dict(result.stages)))
        return GoldenCase(case_id, dict(self.attrs), self.output_names, steps, family="reduced",
                          description=description)


def stream_of(golden: GoldenFile, case_id: str) -> Stream:
    info = golden.case_info(case_id)
    steps = [golden.read_step(case_id, index) for index in range(info.step_count)]
    threaded = [frozenset()]
    for before, step in zip(steps, steps[1:]):
        threaded.append(frozenset(
            past for present, past in STATE_THREADING.items()
            if past in step.inputs and present in before.outputs
            and before.outputs[present].tobytes() == step.inputs[past].tobytes()
            and before.outputs[present].shape == step.inputs[past].shape))
    return Stream(dict(info.attrs), tuple(info.output_names), tuple(step.inputs for step in steps), tuple(threaded))


def _take(array: np.ndarray, axis: int, keep) -> np.ndarray:
    return np.ascontiguousarray(np.take(array, keep, axis=axis))


def _bias_axis(array: np.ndarray, dimension: str) -> int | None:
    axis = array.ndim - BIAS_DIMENSION[dimension]
    return axis if axis >= 0 and array.shape[axis] != 1 else None


def _select(stream: Stream, axes: dict[str, int], bias: str, keep, attrs: dict | None = None) -> Stream:
    steps = []
    for inputs in stream.steps:
        edited = {}
        for name, array in inputs.items():
            axis = _bias_axis(array, bias) if name == BIAS else axes.get(name)
            edited[name] = array if axis is None else _take(array, axis, keep)
        steps.append(edited)
    return replace(stream, steps=tuple(steps), attrs={**stream.attrs, **(attrs or {})})


def rows(stream: Stream, keep) -> Stream:
    return _select(stream, BATCH_AXIS, "B", keep)


def heads(stream: Stream, keep) -> Stream:
    return _select(stream, HEAD_AXIS, "N", keep, {"num_heads": len(keep)})


def index_heads(stream: Stream, keep) -> Stream:
    steps = tuple({name: _take(array, INDEX_HEAD_AXIS[name], keep) if name in INDEX_HEAD_AXIS else array
                   for name, array in inputs.items()} for inputs in stream.steps)
    return replace(stream, steps=steps, attrs={**stream.attrs, "index_num_heads": len(keep)})


def topk(stream: Stream, k: int) -> Stream:
    """index_topk = k; a bias with a candidate axis loses the dropped top-k slots at its end."""
    dropped = stream.topk - k
    steps = []
    for inputs in stream.steps:
        edited = dict(inputs)
        if BIAS in inputs and (axis := _bias_axis(inputs[BIAS], "C")) is not None:
            edited[BIAS] = _take(inputs[BIAS], axis, range(inputs[BIAS].shape[axis] - dropped))
        steps.append(edited)
    return replace(stream, steps=tuple(steps), attrs={**stream.attrs, "index_topk": k})


def tokens(stream: Stream, count: int) -> Stream:
    """The last step's first ``count`` query tokens: the cursors and current_kv end ``dropped`` earlier."""
    inputs = stream.steps[-1]
    dropped = int(inputs["query"].shape[1]) - count
    edited = {}
    for name, array in inputs.items():
        axis = _bias_axis(array, "S") if name == BIAS else TOKEN_AXIS.get(name)
        edited[name] = array if axis is None else _take(array, axis, range(count))
    edited["current_kv"] = np.ascontiguousarray(inputs["current_kv"][:, : inputs["current_kv"].shape[1] - dropped])
    edited["seqlens_k"] = (inputs["seqlens_k"] - dropped).astype(inputs["seqlens_k"].dtype)
    edited["total_sequence_length"] = np.array(int(inputs["total_sequence_length"]) - dropped, np.int64)
    return replace(stream, steps=stream.steps[:-1] + (edited,))


def kv_window(stream: Stream, rows: int) -> Stream:
    """The last step's current_kv cut to its last ``rows`` positions (Kc = rows)."""
    inputs = dict(stream.steps[-1])
    inputs["current_kv"] = np.ascontiguousarray(inputs["current_kv"][:, -rows:])
    return replace(stream, steps=stream.steps[:-1] + (inputs,))


def later_tokens(stream: Stream, first: int) -> Stream | None:
    """The last step's tokens from ``first`` on, alone: a resumed step whose past_* inputs are the
    oracle's state after the tokens before ``first`` (None when the contract rejects that prefix)."""
    inputs = stream.steps[-1]
    count = int(inputs["query"].shape[1])
    prefix = tokens(stream, first)
    case = prefix.case("prefix", "")
    if case is None:
        return None
    state = case.steps[-1].outputs
    rest = {}
    for name, array in inputs.items():
        axis = _bias_axis(array, "S") if name == BIAS else TOKEN_AXIS.get(name)
        rest[name] = array if axis is None else _take(array, axis, range(first, count))
    rest.update({past: state[present] for present, past in STATE_THREADING.items() if past in inputs})
    return replace(stream, steps=(rest,), threaded=(frozenset(),))


def _subsets(count: int, first: int | None) -> list[list[int]]:
    """Single members (``first`` first, then the ends), then each half: the reductions to try."""
    if count <= 1:
        return []
    singles = list(dict.fromkeys(member for member in (first, 0, count - 1, 1) if member is not None
                                 and 0 <= member < count))[:SINGLES]
    half = count // 2
    halves = [list(range(half)), list(range(half, count))] if count > 2 else []
    return [[member] for member in singles] + halves


def _smaller(count: int, hint: int | None = None) -> list[int]:
    return sorted({value for value in (1, hint, count // 4, count // 2, count - 1) if value and 0 < value < count})


def candidates(stream: Stream, element: dict[str, int]) -> Iterator[tuple[str, Stream]]:
    """Smaller streams, the biggest reductions first, each with what it changed."""
    for keep in _subsets(stream.batch, element.get("b")):
        yield f"B {stream.batch} -> {len(keep)} (rows {keep})", rows(stream, keep)
    hint = element["s"] + 1 if "s" in element else None
    for count in _smaller(stream.tokens, hint):
        yield f"S {stream.tokens} -> {count}", tokens(stream, count)
    for first in _smaller(stream.tokens, element.get("s")):
        later = later_tokens(stream, first)
        if later is not None:
            yield f"S {stream.tokens} -> {stream.tokens - first} (tokens {first}.. resumed from the oracle's state)", later
    window = int(stream.steps[-1]["current_kv"].shape[1])
    for count in _smaller(window):
        yield f"Kc {window} -> {count}", kv_window(stream, count)
    for keep in _subsets(stream.heads, element.get("h")):
        yield f"N {stream.heads} -> {len(keep)} (heads {keep})", heads(stream, keep)
    for keep in _subsets(stream.index_heads, element.get("i")):
        yield f"I {stream.index_heads} -> {len(keep)} (index heads {keep})", index_heads(stream, keep)
    for k in _smaller(stream.topk):
        yield f"top-k {stream.topk} -> {k}", topk(stream, k)
    for first in range(1, len(stream.steps)):
        yield f"steps {len(stream.steps)} -> {len(stream.steps) - first}", stream.from_step(first)


def coordinates(element: dict | None) -> dict[str, int]:
    """'b=0 s=3 h=1 d=7' as {'b': 0, 's': 3, 'h': 1, 'd': 7}."""
    words = (element or {}).get("coords") or ""
    return {key: int(value) for key, _, value in (word.partition("=") for word in words.split()) if value.isdigit()}


@dataclass
class Probe:
    """Runs a stream chained on one runner and names its first divergence."""

    runner: DeviceRunner
    workdir: Path
    ulp: int = 0
    runs: int = 0

    def __call__(self, case: GoldenCase) -> dict | None:
        self.runs += 1
        path = self.workdir / f"probe-{self.runs}.h5"
        write_goldens(path, [case])
        try:
            with GoldenFile(path) as golden:
                return first_divergence(replay(golden, case.case_id, self.runner), STAGES, self.ulp)
        finally:
            path.unlink()


def signature(found: dict | None) -> tuple[str, str | None] | None:
    return None if found is None else (found["stage"], found.get("tensor"))


def describe(found: dict) -> str:
    """'stage/tensor', or the stage alone when the device run refused the step."""
    return found["stage"] + (f"/{found['tensor']}" if found.get("tensor") else "")


@dataclass
class Reduction:
    original: Stream
    reduced: Stream
    case: GoldenCase
    found: dict
    trials: int
    kept: list[str]
    seconds: float
    complete: bool  # False when the budget ran out before a fixed point


def reduce_case(stream: Stream, case_id: str, probe: Probe, budget_s: float,
                say: Callable[[str], None]) -> Reduction | None:
    """The smallest stream found whose first divergence is the original's; None if it has none."""
    started = time.perf_counter()
    description = f"reduced from {case_id}"
    reduced_id = f"{case_id}.reduced"
    found = probe(stream.case(reduced_id, description))
    if found is None:
        return None
    target = signature(found)
    say(f"reduce: {case_id} diverges first at step {found['step']}, {describe(found)}")
    trials = 0
    kept: list[str] = []

    def attempt(change: str, candidate: Stream) -> dict | None:
        nonlocal trials
        trials += 1
        case = candidate.case(reduced_id, description)
        result = None if case is None else probe(case)
        same = result is not None and signature(result) == target
        verdict = "kept" if same else ("rejected by the contract" if case is None else "lost the divergence")
        say(f"reduce: trial {trials}: {change}: {verdict}")
        return result if same else None

    current, current_found = stream.upto(found["step"]), found
    last = found["step"]
    for first in range(last, 0, -1):
        result = attempt(f"start at step {first} from its stored state", current.from_step(first))
        if result is not None:
            current, current_found = current.from_step(first), result
            kept.append(f"start at step {first}")
            break
    complete = False
    while time.perf_counter() - started < budget_s:
        for change, candidate in candidates(current, coordinates(current_found.get("element"))):
            if time.perf_counter() - started >= budget_s:
                break
            result = attempt(change, candidate)
            if result is not None:
                current, current_found = candidate, result
                kept.append(change)
                break
        else:
            complete = True
            break
    case = current.case(reduced_id, description)
    return Reduction(stream, current, case, current_found, trials, kept, time.perf_counter() - started, complete)
