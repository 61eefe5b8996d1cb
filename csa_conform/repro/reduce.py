"""Shrinking a divergent case to a minimal repro: the engine behind ``csa-conform reduce``.

A case's divergence is named by the first divergent step's earliest stage and
tensor (what ``bisect`` reports). Any smaller case whose chained device run
diverges at the same stage and tensor replaces it. The search starts from
each of: the stream from its first step with the later steps dropped, the
failing step from its stored past state (earlier steps put back only when the
divergence needs the device's own state from them), and the file's smallest
case diverging alike; the smallest result (input elements, then bytes) wins,
and the case as given competes too, so the output is never larger. From each
start, greedily: fewer batch rows, the failing token (or the
step) restarted as a prefill from position 0 (no past records, cleared
carries, a current_kv of just its own positions), the failing token restarted
from position 0 after the positions before it in its block (a record still ends
there) or before it at all (RoPE and the dense window see its position), the
carries of a stream that starts at position 0 omitted (a reader supplies the cleared carries the
contract would make of any: a kernel that reads what it should have cleared
keeps them), fewer past records (the stream moved back a block per record),
fewer query tokens of the last step (a prefix, or a suffix from a block end or the
divergent token resumed from the oracle's state), a shorter current_kv, fewer heads, index
heads and top-k slots, no or a more broadcast attention_bias, no
selected_indices output, and fewer leading steps. What the contract fixes (the
compressors' ape and norm, the cursors, one row's carries and the past records
its position holds where the step does not start at position 0) never shrinks:
``Stream.fixed_elements`` is that floor.
Every candidate is a fresh oracle run of the transformed inputs (one the
contract rejects is skipped), so the reduced case verifies by construction;
the search stops at a fixed point or when its time budget is spent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from csa_conform._base.statuses import FAULT, HANG
from csa_conform.check.conformance import first_divergence, replay
from csa_conform.check.model import StepVerdict
from csa_conform.device.runner import DeviceRunner
from csa_conform.golden import GoldenCase, GoldenFile, write_goldens
from csa_conform.golden.edits import (
    Stream,
    bias_axes,
    bias_broadcast,
    fitted,
    heads,
    index_heads,
    kv_window,
    later_tokens,
    past_records,
    restarted,
    rows,
    tokens,
    topk,
    without_bias,
    without_carries,
    without_output,
)
from csa_conform.spec import STAGE_NAMES

BIAS = "attention_bias"
SELECTED = "selected_indices"
OMITTED = "carries omitted (the contract clears them at position 0)"
# At most this many single-row / single-head candidates are tried before halves.
SINGLES = 4


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
    """Smaller streams, the biggest reductions first, each with what it changed; none stores more input
    elements (a suffix resumed from a stream whose carries were omitted would store them again)."""
    size = stream.elements()
    for change, candidate in _edits(stream, element):
        if (candidate := fitted(candidate)).elements() <= size:
            yield change, candidate


def _block_token(stream: Stream, element: dict[str, int]) -> int:
    """The token whose block position matters: the divergent element's, else the step's first block end."""
    if "s" in element:
        return min(element["s"], stream.tokens - 1)
    ends = [token for token in range(stream.tokens) if (stream.start + token + 1) % stream.ratio == 0]
    return ends[0] if ends else stream.tokens - 1


def _suffixes(stream: Stream, element: dict[str, int]) -> list[int]:
    """First tokens of the suffixes to try, the shortest suffix first: the last token or two, the
    divergent token (and the one before it), each block end in the step (and the token before it, a
    query that sees the record its block completes), then the halving ones."""
    ends = [token for token in range(stream.tokens) if (stream.start + token + 1) % stream.ratio == 0]
    hints = [stream.tokens - 1, stream.tokens - 2]
    if "s" in element:
        hints += [element["s"], element["s"] - 1]
    for end in ends:
        hints += [end, end - 1]
    hints += _smaller(stream.tokens, element.get("s"))
    return sorted({first for first in hints if 0 < first < stream.tokens}, reverse=True)


def _edits(stream: Stream, element: dict[str, int]) -> Iterator[tuple[str, Stream]]:
    for keep in _subsets(stream.batch, element.get("b")):
        yield f"B {stream.batch} -> {len(keep)} (rows {keep})", rows(stream, keep)
    if len(stream.steps) == 1 and (stream.start or stream.tokens > 1):
        token = min(element.get("s", 0), stream.tokens - 1)
        yield f"token {token} alone as a prefill from position 0", restarted(stream, token, 1)
        if stream.start and stream.tokens > 1:
            yield f"the step's {stream.tokens} tokens as a prefill from position 0", restarted(stream, 0, stream.tokens)
    if len(stream.steps) == 1 and stream.start:
        token = _block_token(stream, element)
        position = stream.start + token
        # its block's phase kept (a record), or its position (RoPE, the dense window); the carries the
        # restart clears are omitted too, since only then can it be smaller
        for before, kept in {position % stream.ratio: "phase", position: "position"}.items():
            if before:
                restart = restarted(stream, token - before, before + 1)
                yield (f"token {token} and the {before} positions before it as a prefill from position 0 (its {kept} "
                       "kept), carries omitted"), without_carries(restart) or restart
    if (omitted := without_carries(stream)) is not None:
        yield OMITTED, omitted
    records = int(stream.steps[0]["past_compressed_kv"].shape[1])
    for remaining in [0, *_smaller(records)]:
        if remaining < records and (candidate := past_records(stream, remaining)) is not None:
            yield (f"past records {records} -> {remaining} (start {stream.start} -> "
                   f"{stream.start - (records - remaining) * stream.ratio})"), candidate
    hint = element["s"] + 1 if "s" in element else None
    for count in _smaller(stream.tokens, hint):
        yield f"S {stream.tokens} -> {count}", tokens(stream, count)
    for first in _suffixes(stream, element):
        later = later_tokens(stream, first)
        if later is not None:
            yield (f"S {stream.tokens} -> {stream.tokens - first} (tokens {first}.. resumed from the oracle's "
                   "state)"), later
    window = int(stream.steps[-1]["current_kv"].shape[1])
    for count in _smaller(window):
        yield f"Kc {window} -> {count}", kv_window(stream, count)
    for keep in _subsets(stream.heads, element.get("h")):
        yield f"N {stream.heads} -> {len(keep)} (heads {keep})", heads(stream, keep)
    for keep in _subsets(stream.index_heads, element.get("i")):
        yield f"I {stream.index_heads} -> {len(keep)} (index heads {keep})", index_heads(stream, keep)
    for k in _smaller(stream.topk):
        yield f"top-k {stream.topk} -> {k}", topk(stream, k)
    axes = bias_axes(stream)
    if any(BIAS in step for step in stream.steps):
        yield "no attention_bias", without_bias(stream)
    for dimension in axes:
        yield f"attention_bias broadcast along {dimension}", bias_broadcast(stream, dimension)
    if SELECTED in stream.output_names:
        yield f"outputs {len(stream.output_names)} -> {len(stream.output_names) - 1} (no {SELECTED})", \
            without_output(stream, SELECTED)
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

    def __call__(self, case: GoldenCase) -> StepVerdict | None:
        self.runs += 1
        path = self.workdir / f"probe-{self.runs}.h5"
        write_goldens(path, [case])
        try:
            with GoldenFile(path) as golden:
                return first_divergence(replay(golden, case.case_id, self.runner), STAGE_NAMES, self.ulp)
        finally:
            path.unlink()


def signature(found: StepVerdict | None) -> tuple[str, str | None] | None:
    """What a smaller case must keep: the stage and tensor of the first divergence, or the stage of the launch
    that faulted or hung and which of the two (a fault is a divergence to keep, whatever its signal)."""
    return None if found is None else (found.stage, found.tensor or _fault_kind(found))


def describe(found: StepVerdict) -> str:
    """'stage/tensor', 'stage (fault)', or the stage alone when the device run refused the step."""
    kind = _fault_kind(found)
    return found.stage + (f"/{found.tensor}" if found.tensor else f" ({kind})" if kind else "")


def _fault_kind(found: StepVerdict) -> str | None:
    return found.problem_type if found.problem_type in (FAULT, HANG) else None


@dataclass
class Reduction:
    original: Stream
    reduced: Stream
    case: GoldenCase
    found: StepVerdict
    trials: int
    kept: list[str]
    seconds: float
    complete: bool  # False when the budget ran out before a fixed point
    start: str = ""  # the starting point the reduced case came from
    starts: list[tuple[str, int]] = field(default_factory=list)  # each starting point: elements it reduced to
    source: str = ""  # the case it came from (another case of the file when that one reduced smaller)


# The starting points a reduction tries (the smallest that keeps the divergence wins).
FROM_ZERO = "the stream from its first step, later steps dropped"
FAILING_STEP = "the failing step from its stored state"
ALIKE = "the file's smallest case diverging alike"
AS_GIVEN = "the case as given"


def _starts(stream: Stream, step: int, probe_keeps: Callable[[str, Stream], StepVerdict | None]
            ) -> list[tuple[str, Stream, dict]]:
    """The stream up to the failing step, and that step from its stored state (else the latest
    earlier step that keeps the divergence), each with its divergence; the first always keeps it."""
    upto = stream.upto(step)
    starts = []
    for first in range(step, 0, -1):
        name = FAILING_STEP if first == step else f"the stream from step {first} from its stored state"
        found = probe_keeps(f"start at step {first} from its stored state", upto.from_step(first))
        if found is not None:
            starts.append((name, upto.from_step(first), found))
            break
    return starts


def _shrink(current: Stream, current_found: StepVerdict, attempt: Callable[[str, Stream], StepVerdict | None],
            deadline: float) -> tuple[Stream, dict, list[str], bool]:
    """Greedy: the first candidate that keeps the divergence replaces the stream, until none does (a
    fixed point, True) or the deadline passes (False)."""
    kept: list[str] = []
    while time.perf_counter() < deadline:
        for change, candidate in candidates(current, coordinates(current_found.element)):
            if time.perf_counter() >= deadline:
                return current, current_found, kept, False
            result = attempt(change, candidate)
            if result is not None:
                current, current_found = candidate, result
                kept.append(change)
                break
        else:
            return current, current_found, kept, True
    return current, current_found, kept, False


def reduce_case(stream: Stream, case_id: str, probe: Probe, budget_s: float,
                say: Callable[[str], None],
                alike: Callable[[tuple[str, str | None], float], tuple[str, Stream] | None] | None = None
                ) -> Reduction | None:
    """The smallest stream found whose first divergence is the original's; None if it has none.

    Each starting point (the stream from its first step with the later steps dropped, the failing
    step from its stored state, and the smallest case ``alike`` finds diverging the same way, given
    the divergence and a time limit) is shrunk in an equal share of the budget; the smallest result
    in (elements, bytes) is kept, never one larger than ``stream`` itself."""
    description = f"reduced from {case_id}"
    reduced_id = f"{case_id}.reduced"
    found = probe(stream.case(reduced_id, description))
    if found is None:
        return None
    started = time.perf_counter()  # the budget is the search's: the first run (and its build) is not
    target = signature(found)
    say(f"reduce: {case_id} diverges first at step {found.step}, {describe(found)}")
    trials = 0

    def attempt(change: str, candidate: Stream) -> StepVerdict | None:
        nonlocal trials
        trials += 1
        case = candidate.case(reduced_id, description)
        result = None if case is None else probe(case)
        same = result is not None and signature(result) == target
        verdict = "kept" if same else ("rejected by the contract" if case is None else "lost the divergence")
        say(f"reduce: trial {trials}: {change}: {verdict}")
        return result if same else None

    step = found.step
    starts = [(FROM_ZERO, stream.upto(step), found, case_id)]
    starts += [(name, start, result, case_id) for name, start, result in _starts(stream, step, attempt)]
    if alike is not None:
        other = alike(target, budget_s / 4)
        if other is not None:
            other_id, other_stream = other
            other_found = probe(other_stream.case(reduced_id, description))
            if other_found is not None and signature(other_found) == target:
                say(f"reduce: {other_id} diverges alike ({other_stream.elements():,} input elements)")
                starts.append((f"{ALIKE} ({other_id})", other_stream.upto(other_found.step), other_found,
                               other_id))
    starts.sort(key=lambda entry: entry[1].size())
    results = []
    tried: list[tuple[str, int]] = []
    for position, (name, start, start_found, source) in enumerate(starts):
        share = (budget_s - (time.perf_counter() - started)) / (len(starts) - position)
        say(f"reduce: from {name}: {start.elements():,} input elements")
        reduced, reduced_found, kept, complete = _shrink(start, start_found, attempt,
                                                         time.perf_counter() + max(share, 1.0))
        tried.append((name, reduced.elements()))
        results.append((reduced.size(), position, reduced, reduced_found, kept, complete, name, source))
    # the case as given competes too (last, so a tie goes to a reduction): the output is never larger
    results.append((stream.size(), len(starts), stream, found, [], True, AS_GIVEN, case_id))
    # of equal sizes, one from the case as given (it is the case the user asked about), then the first
    _, _, reduced, reduced_found, kept, _, name, source = min(
        results, key=lambda entry: (entry[0], entry[7] != case_id, entry[1]))
    case = reduced.case(reduced_id, f"reduced from {source}")
    return Reduction(stream, reduced, case, reduced_found, trials, kept, time.perf_counter() - started,
                     all(entry[5] for entry in results), name, tried, source)


class ProbedFile:
    """The golden file whose cases are probed, opened at the first probe and closed (``close``) before a
    reduction's trials: h5py walks every dataset handle alive in the process at each file close, an
    indexed case holds its datasets open, and each trial writes and reads a file, so the file held open
    over the trials would cost each of its closes about 6 ms at the ci suite's size."""

    def __init__(self, path: Path, probe: Probe):
        self.path, self.probe = path, probe
        self._golden: GoldenFile | None = None

    def first_divergence(self, case_id: str) -> StepVerdict | None:
        if self._golden is None:
            self._golden = GoldenFile(self.path)
        return first_divergence(replay(self._golden, case_id, self.probe.runner), STAGE_NAMES, self.probe.ulp)

    def close(self) -> None:
        if self._golden is not None:
            self._golden.close()
            self._golden = None

    def __enter__(self) -> ProbedFile:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def alike_finder(probed: ProbedFile, streams: dict[str, Stream], case_id: str,
                 say: Callable[[str], None]) -> Callable[[tuple[str, str | None], float], tuple[str, Stream] | None]:
    """``reduce_case``'s ``alike``: the file's smallest case (smaller than ``case_id``, same ratio) whose
    chained run first diverges at the given (stage, tensor), probed smallest first within the time limit."""
    ratio = streams[case_id].attrs.get("compression_ratio")
    ceiling = streams[case_id].size()
    order = sorted((other for other in streams if other != case_id and streams[other].size() < ceiling
                    and streams[other].attrs.get("compression_ratio") == ratio),
                   key=lambda other: streams[other].size())

    def find(target: tuple[str, str | None], limit_s: float) -> tuple[str, Stream] | None:
        deadline = time.perf_counter() + limit_s
        try:
            for count, other in enumerate(order):
                if time.perf_counter() >= deadline:
                    say(f"reduce: {count} smaller cases probed for one diverging alike: none in the time allowed")
                    return None
                if signature(probed.first_divergence(other)) == target:
                    return other, streams[other]
            return None
        finally:
            probed.close()

    return find


@dataclass(frozen=True)
class Floor:
    """What bounds a reduced case: the inputs whose shape the contract fixes for its ratio, rows and
    position, the current_kv its first query's window must reach, and what else remains."""

    fixed: dict[str, tuple[tuple[int, ...], int]]  # input -> (shape, elements)
    window_from: int  # the first position current_kv must hold
    window: int  # its elements
    varying: dict[str, int]  # every other stored input's elements, the largest first

    @property
    def fixed_elements(self) -> int:
        return sum(elements for _, elements in self.fixed.values()) + self.window


def floor_of(stream: Stream) -> Floor:
    fixed = stream.fixed_inputs()
    window_from, window = stream.window_floor()
    varying: dict[str, int] = {}
    for index in range(len(stream.steps)):
        for name, array in stream.stored(index).items():
            if index != len(stream.steps) - 1 or name not in fixed:
                varying[name] = varying.get(name, 0) + int(array.size)
    varying["current_kv"] = varying.get("current_kv", 0) - window
    return Floor(fixed, window_from, window,
                 dict(sorted(((name, size) for name, size in varying.items() if size), key=lambda item: -item[1])))


# Without --case: at most this many of a file's diverging cases are reduced (the smallest first).
FILE_CASES = 3


@dataclass
class FileReduction:
    """The smallest repro of a file: the best of its smallest diverging cases' reductions."""

    best: Reduction
    case_id: str
    diverging: list[str]  # the cases found diverging, smallest first
    scanned: int
    reduced: list[tuple[str, int, int]]  # (case, elements before, after) per reduction made


def _repro_rank(reduction: Reduction) -> tuple[int, bool]:
    """Smaller repros first; of equal ones, one at most a quarter of the case it came from."""
    after = reduction.reduced.elements()
    return after, 4 * after > reduction.original.elements()


def reduce_file(probed: ProbedFile, streams: dict[str, Stream], budget_s: float,
                say: Callable[[str], None]) -> FileReduction | None:
    """Probe the file's cases smallest first (chained, these kernels) until ``FILE_CASES`` diverge or
    half the budget is spent, reduce each of those in an equal share of what is left, and keep the
    smallest reduced case (of equal ones, one that is at most a quarter of its case, looked for among
    up to ``FILE_CASES`` more diverging cases of four times its size when none is); None when none of
    the probed cases diverges."""
    started = time.perf_counter()
    order = sorted(streams, key=lambda case: streams[case].elements())
    diverging: list[str] = []
    scanned = 0
    for case_id in order:
        if len(diverging) == FILE_CASES or time.perf_counter() - started >= budget_s / 2:
            break
        scanned += 1
        if probed.first_divergence(case_id) is not None:
            diverging.append(case_id)
            say(f"reduce: {case_id} diverges ({streams[case_id].elements():,} input elements)")
    probed.close()
    say(f"reduce: {len(diverging)} diverging of {scanned} cases probed (smallest first, of {len(order)})")
    best: tuple[Reduction, str] | None = None
    reduced = []
    for position, case_id in enumerate(diverging):
        share = (budget_s - (time.perf_counter() - started)) / (len(diverging) - position)
        reduction = reduce_case(streams[case_id], case_id, probed.probe, max(share, 1.0), say)
        if reduction is None:
            continue
        reduced.append((case_id, reduction.original.elements(), reduction.reduced.elements()))
        if best is None or _repro_rank(reduction) < _repro_rank(best[0]):
            best = (reduction, case_id)
    probed.close()
    if best is None:
        return None
    # A repro over a quarter of its case: the smallest diverging cases four times its size, in what is
    # left of the budget, replace it if one reduces as small.
    goal = 4 * best[0].reduced.elements()
    larger = iter([case for case in order if streams[case].elements() >= goal and case not in diverging])
    extra = 0
    while _repro_rank(best[0])[1] and extra < FILE_CASES and budget_s - (time.perf_counter() - started) >= 1:
        case_id = next(larger, None)
        if case_id is None:
            break
        scanned += 1
        if probed.first_divergence(case_id) is None:
            continue
        probed.close()
        extra += 1
        diverging.append(case_id)
        say(f"reduce: {case_id} diverges ({streams[case_id].elements():,} input elements, at least four times "
            "the smallest repro)")
        share = (budget_s - (time.perf_counter() - started)) / (FILE_CASES - extra + 1)
        reduction = reduce_case(streams[case_id], case_id, probed.probe, max(share, 1.0), say)
        if reduction is None:
            continue
        reduced.append((case_id, reduction.original.elements(), reduction.reduced.elements()))
        if _repro_rank(reduction) < _repro_rank(best[0]):
            best = (reduction, case_id)
    return FileReduction(best[0], best[1], diverging, scanned, reduced)
