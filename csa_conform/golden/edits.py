"""A golden case as a stream of editable step inputs, and the edits that shrink or widen it.

``reduce`` shrinks a divergent case with these edits and ``diff --invariance``
widens one; either way the edited stream is re-run through the oracle
(``Stream.case``), so what comes out verifies by construction. Every edit
keeps the contract's geometry: per-row inputs lose rows on axis 0, per-token
inputs tokens on axis 1 (with the cursors and current_kv moved to match),
attention_bias only on the broadcast axes it really has.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from csa_conform.errors import ContractError
from csa_conform.golden import GoldenCase, GoldenFile, GoldenStep
from csa_conform.golden.carries import cleared_carry, omitted_carries, step_start
from csa_conform.oracle import run_step
from csa_conform.spec import STATE_THREADING

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
# Inputs whose shape the contract fixes whatever B, S, N, I, Kc and the position: per step, and per row
# (the carries only for a step that does not start at position 0: one that does may omit them).
FIXED_INPUTS = ("compressor_ape", "compressor_norm", "index_compressor_ape", "index_compressor_norm",
                "total_sequence_length")
CARRIES = ("past_compression_carry", "past_index_carry")
FIXED_ROW_INPUTS = ("seqlens_k",)
PAST_RECORDS = ("past_compressed_kv", "past_index_key")
DENSE_WINDOW = 128


@dataclass(frozen=True)
class Stream:
    """A case as the reducer edits it: attributes and each step's inputs; ``threaded[i]`` names the
    past_* inputs of step i that are the previous step's present_* (re-derived by the oracle).
    ``carries_omitted``: a step that starts at position 0 is written without its carries, and runs
    with the cleared ones a reader hands out in their place."""

    attrs: dict
    output_names: tuple[str, ...]
    steps: tuple[dict[str, np.ndarray], ...]
    threaded: tuple[frozenset[str], ...]
    carries_omitted: bool = False

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

    @property
    def ratio(self) -> int:
        return int(self.attrs["compression_ratio"])

    @property
    def start(self) -> int:
        """The first step's first position."""
        first = self.steps[0]
        return int(first["total_sequence_length"]) - int(first["query"].shape[1])

    def stored(self, index: int) -> dict[str, np.ndarray]:
        """Step ``index``'s inputs as a golden file stores them: without its carries when they are
        omitted and the step starts at position 0."""
        inputs = self.steps[index]
        if not self.carries_omitted or step_start(inputs) != 0:
            return inputs
        return {name: array for name, array in inputs.items() if name not in CARRIES}

    def elements(self) -> int:
        """Stored input elements over every step (omitted carries count none): the size the
        acceptance criteria measure."""
        return sum(int(array.size) for index in range(len(self.steps)) for array in self.stored(index).values())

    def nbytes(self) -> int:
        """Stored input bytes over every step: what breaks a tie in elements (a cursor of int64 weighs two
        f32 values)."""
        return sum(int(array.nbytes) for index in range(len(self.steps)) for array in self.stored(index).values())

    def size(self) -> tuple[int, int]:
        """(elements, bytes): the order in which reduce ranks repros, smaller first."""
        return self.elements(), self.nbytes()

    def fixed_inputs(self) -> dict[str, tuple[tuple[int, ...], int]]:
        """Each input whose shape the contract fixes for a one-step case of this stream's ratio, rows and
        position, with that shape and its elements over the rows (``fixed_elements`` is their sum)."""
        step = self.steps[-1]
        per_row = FIXED_ROW_INPUTS + (CARRIES + PAST_RECORDS if step_start(step) else ())
        fixed = {name: (tuple(step[name].shape), int(step[name].size)) for name in FIXED_INPUTS if name in step}
        fixed.update({name: (tuple(step[name].shape), int(step[name].size)) for name in per_row if name in step})
        return fixed

    def fixed_elements(self) -> int:
        """The input elements the contract fixes for a one-step case of this stream's ratio, rows and
        position: the compressors' ape and norm, the cursors, and unless the step starts at position 0
        each row's carries and the start // ratio past records (and index keys) its position holds."""
        return sum(elements for _, elements in self.fixed_inputs().values())

    def window_floor(self) -> tuple[int, int]:
        """(the first raw position the last step's current_kv must hold, its elements over the rows):
        the first query's dense window reaches back to max(0, start + 1 - 128)."""
        step = self.steps[-1]
        total = int(step["total_sequence_length"])
        first = max(0, total - int(step["query"].shape[1]) + 1 - DENSE_WINDOW)
        return first, (total - first) * int(step["current_kv"].shape[2]) * self.batch

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
        for index in range(len(self.steps)):
            inputs = dict(self.stored(index))
            if index:
                before = steps[-1].outputs
                inputs.update({past: before[present] for present, past in STATE_THREADING.items()
                               if past in self.threaded[index] and present in before})
            try:
                result = run_step(self.attrs, {**inputs, **omitted_carries(self.attrs, inputs)},
                                  list(self.output_names))
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
    # a file that omits a position-0 step's carries (a reduced one) is counted as it stores them
    omitted = info.step_count > 0 and bool(golden.cleared_carries(case_id, 0))
    return Stream(dict(info.attrs), tuple(info.output_names), tuple(step.inputs for step in steps), tuple(threaded),
                  omitted)


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


def _candidates(inputs: dict[str, np.ndarray], attrs: dict) -> int:
    """C of the step's scores [B, N, S, C]: the dense slots, then top-k width or every record."""
    total, count = int(inputs["total_sequence_length"]), int(inputs["query"].shape[1])
    window = int(inputs["current_kv"].shape[1])
    dense = min(window, DENSE_WINDOW) if total == count else DENSE_WINDOW
    ratio = int(attrs["compression_ratio"])
    records = total // ratio
    return dense + (min(int(attrs.get("index_topk", 0)), records) if ratio == 4 else records)


def _fitted_bias(inputs: dict[str, np.ndarray], attrs: dict) -> np.ndarray:
    bias = inputs[BIAS]
    axis = _bias_axis(bias, "C")
    goal = _candidates(inputs, attrs)
    if axis is None or bias.shape[axis] == goal:
        return bias
    return _take(bias, axis, np.arange(goal) % bias.shape[axis])


def fitted(stream: Stream) -> Stream:
    """The stream with each step's attention_bias candidate axis (if it has one) cut or cycled to the
    step's C, so an edit that changes the candidate count keeps a bias the contract accepts."""
    return replace(stream, steps=tuple({**step, BIAS: _fitted_bias(step, stream.attrs)} if BIAS in step else step
                                       for step in stream.steps))


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


def kv_window(stream: Stream, count: int) -> Stream:
    """The last step's current_kv cut to its last ``count`` positions (Kc = count)."""
    inputs = dict(stream.steps[-1])
    inputs["current_kv"] = np.ascontiguousarray(inputs["current_kv"][:, -count:])
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


def _shifted(inputs: dict[str, np.ndarray], by: int) -> dict[str, np.ndarray]:
    """The step's cursors ``by`` positions earlier, current_kv cut so it stays inside 0..T-1."""
    total = int(inputs["total_sequence_length"]) - by
    edited = dict(inputs)
    edited["total_sequence_length"] = np.array(total, np.int64)
    edited["seqlens_k"] = (inputs["seqlens_k"] - by).astype(inputs["seqlens_k"].dtype)
    edited["current_kv"] = np.ascontiguousarray(inputs["current_kv"][:, max(0, inputs["current_kv"].shape[1] - total):])
    return edited


def past_records(stream: Stream, keep: int) -> Stream | None:
    """The stream started ``ratio`` positions earlier per dropped past record: the first step keeps
    only its last ``keep`` stored records (and index keys), every later step moves with it (None
    when a later step's past state is stored rather than threaded, or the carry's phase would move)."""
    first = stream.steps[0]
    dropped = int(first["past_compressed_kv"].shape[1]) - keep
    if dropped <= 0 or any(
            past in step and past not in threaded
            for step, threaded in zip(stream.steps[1:], stream.threaded[1:]) for past in (*PAST_RECORDS, *CARRIES)):
        return None
    by = dropped * stream.ratio
    steps = [_shifted(step, by) for step in stream.steps]
    for name in PAST_RECORDS:
        if name in first:
            steps[0][name] = np.ascontiguousarray(first[name][:, first[name].shape[1] - keep:])
    return replace(stream, steps=tuple(steps))


def restarted(stream: Stream, first: int, count: int) -> Stream:
    """The last step's tokens ``first .. first+count-1`` alone, as a prefill from position 0: no past
    records, cleared carries, current_kv the raw positions of just those tokens. Tokens before the
    step's own (``first`` < 0) take its first token's inputs and the kv rows current_kv holds for
    their positions (its first row where it holds none)."""
    inputs = stream.steps[-1]
    window, length = int(inputs["current_kv"].shape[1]), int(inputs["query"].shape[1])
    wanted = np.arange(first, first + count)
    step = {}
    for name, array in inputs.items():
        axis = _bias_axis(array, "S") if name == BIAS else TOKEN_AXIS.get(name)
        step[name] = array if axis is None else _take(array, axis, np.clip(wanted, 0, length - 1))
    step["current_kv"] = _take(inputs["current_kv"], 1, np.clip(window - length + wanted, 0, window - 1))
    step["total_sequence_length"] = np.array(count, np.int64)
    step["seqlens_k"] = np.full_like(inputs["seqlens_k"], count - 1)
    for name in PAST_RECORDS:
        if name in inputs:
            step[name] = np.ascontiguousarray(inputs[name][:, :0])
    for name in CARRIES:
        if name in inputs:
            step[name] = cleared_carry(inputs[name].shape)
    return replace(stream, steps=(step,), threaded=(frozenset(),))


def without_carries(stream: Stream) -> Stream | None:
    """The stream written without the first step's carries, which then runs with the cleared ones a
    reader supplies (None unless it starts at position 0 with its carries stored)."""
    if stream.carries_omitted or stream.start != 0 or not any(name in stream.steps[0] for name in CARRIES):
        return None
    return replace(stream, carries_omitted=True)


def without_bias(stream: Stream) -> Stream:
    return replace(stream, steps=tuple({name: array for name, array in step.items() if name != BIAS}
                                       for step in stream.steps))


def bias_broadcast(stream: Stream, dimension: str) -> Stream:
    """attention_bias broadcast along ``dimension`` (its first slice there kept, extent 1)."""
    steps = []
    for step in stream.steps:
        edited = dict(step)
        if BIAS in step and (axis := _bias_axis(step[BIAS], dimension)) is not None:
            edited[BIAS] = _take(step[BIAS], axis, [0])
        steps.append(edited)
    return replace(stream, steps=tuple(steps))


def bias_axes(stream: Stream) -> list[str]:
    """The [B, N, S, C] dimensions along which some step's attention_bias is not broadcast."""
    return [dimension for dimension in BIAS_DIMENSION
            if any(BIAS in step and _bias_axis(step[BIAS], dimension) is not None for step in stream.steps)]


def without_output(stream: Stream, name: str) -> Stream:
    return replace(stream, output_names=tuple(output for output in stream.output_names if output != name))


# Per-row inputs a random neighbour row draws afresh (a permutation of its source row's own values);
# the other per-row inputs (past state, cursors) it copies, so the neighbour is as valid as its source.
FRESH = ("query", "current_kv", "compressor_kv", "compressor_gate", "index_query", "index_weight",
         "index_compressor_kv", "index_compressor_gate", BIAS)


def embedded(stream: Stream, extra: int, rng: np.random.Generator) -> tuple[Stream, list[int]]:
    """The stream with its B rows at rows 2.. of a batch of B + extra, beside neighbour rows whose
    fresh inputs are permutations of a case row's and whose past state is that row's; also the
    rows the case's rows landed on."""
    batch = stream.batch
    wide = batch + extra
    placed = list(range(2, 2 + batch)) if extra >= 2 else list(range(batch))
    source = [placed.index(row) if row in placed else row % batch for row in range(wide)]
    steps = []
    for inputs in stream.steps:
        edited = {}
        for name, array in inputs.items():
            axis = _bias_axis(array, "B") if name == BIAS else BATCH_AXIS.get(name)
            if axis is None:
                edited[name] = array
                continue
            rows_out = []
            for row, origin in enumerate(source):
                value = array[origin]
                if row not in placed and name in FRESH:
                    value = rng.permutation(value.reshape(-1)).reshape(value.shape)
                rows_out.append(value)
            edited[name] = np.ascontiguousarray(np.stack(rows_out))
        steps.append(edited)
    return replace(stream, steps=tuple(steps)), placed


def split(stream: Stream, step: int, first: int) -> Stream:
    """Step ``step`` as two steps: its first ``first`` tokens, then the rest resumed from their state
    (the second's past_* inputs are threaded from the first's present_* by the oracle)."""
    inputs = stream.steps[step]
    count = int(inputs["query"].shape[1])
    head = tokens(replace(stream, steps=stream.steps[: step + 1], threaded=stream.threaded[: step + 1]), first)
    rest = {}
    for name, array in inputs.items():
        axis = _bias_axis(array, "S") if name == BIAS else TOKEN_AXIS.get(name)
        rest[name] = array if axis is None else _take(array, axis, range(first, count))
    threads = frozenset(past for past in STATE_THREADING.values() if past in inputs)
    return replace(stream, steps=head.steps + (rest,) + stream.steps[step + 1:],
                   threaded=stream.threaded[: step + 1] + (threads,) + stream.threaded[step + 1:])
