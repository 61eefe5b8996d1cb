"""Invariances the contract implies, checked on the device against the device itself (diff --invariance).

``batch``: batch rows are independent, so a case's rows embedded in a larger
batch (B + 4, the case's rows at rows 2.., beside neighbour rows whose fresh
inputs are permutations of a case row's) must come out bit for bit as they do
at the case's own B. A kernel that picks its accumulation split or tiling by
batch or token count breaks this even where every case of the suite, run at
its own B, agrees with the oracle.

``chunks``: the reference's chunked prefill equals its single prefill bit for
bit (the compressor walks positions in order, and every query row reads the
same candidates in the same order either way; tests/invariance checks it on
the oracle), so the first step of at least two tokens split into two steps
(its first half, then the rest resumed from the first half's state) must give
the same Y rows and the same present state, and every later step the same
outputs.

Either variant is re-run through the oracle only to be valid input (one the
contract rejects, e.g. a top-k tie among the neighbour rows, is redrawn); the
comparison is device against device, so it holds whether or not the device
agrees with the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from csa_conform.check.conformance import replay
from csa_conform.check.findings import RunFinding
from csa_conform.check.results import BATCH_VARIANT, CHUNK_VARIANT
from csa_conform.device.runner import DeviceRunner
from csa_conform.golden import GoldenCase, GoldenFile, write_goldens
from csa_conform.golden.edits import Stream, embedded, split, stream_of
from csa_conform.spec import PIPELINE

BATCH = "batch"
CHUNKS = "chunks"
KINDS = (BATCH, CHUNKS)
VARIANT = {BATCH: BATCH_VARIANT, CHUNKS: CHUNK_VARIANT}
NEIGHBOURS = 4
REDRAWS = 4
STAGE_ORDER = tuple(stage.name for stage in PIPELINE)


@dataclass
class Variant:
    """A variant case and how to read the original's rows back out of its device payloads."""

    kind: str
    case: GoldenCase
    description: str
    rows: list[int] | None = None      # batch: where the case's rows are
    split_step: int | None = None      # chunks: the original step that became two
    split_at: int | None = None


def accepted(stream: Stream, golden: GoldenFile, case_id: str) -> Stream | None:
    """The case's stream up to its first rejected step (None when it has no accepted step)."""
    rejected = golden.case_info(case_id).errors
    last = min(rejected) - 1 if rejected else len(stream.steps) - 1
    return stream.upto(last) if last >= 0 else None


def batch_variant(stream: Stream, case_id: str, seed: int) -> Variant | None:
    for attempt in range(REDRAWS):
        wide, rows = embedded(stream, NEIGHBOURS, np.random.default_rng([seed, attempt]))
        case = wide.case(f"{case_id}.batch", f"{case_id} at B={wide.batch}")
        if case is not None:
            return Variant(BATCH, case, f"between B={stream.batch} and B={wide.batch}", rows=rows)
    return None


def chunks_variant(stream: Stream, case_id: str) -> Variant | None:
    step = next((index for index, inputs in enumerate(stream.steps) if inputs["query"].shape[1] >= 2), None)
    if step is None:
        return None
    count = int(stream.steps[step]["query"].shape[1])
    first = count // 2
    case = split(stream, step, first).case(f"{case_id}.chunks", f"{case_id} step {step} in two chunks")
    if case is None:
        return None
    return Variant(CHUNKS, case, f"between step {step} in one and in two chunks ({first} + {count - first} "
                   "tokens)", split_step=step, split_at=first)


def device_payloads(golden: GoldenFile, case_id: str, runner: DeviceRunner) -> list[dict] | None:
    """Per step, the device's stage payloads of a chained run (None when the run stopped early)."""
    payloads = []
    for outcome in replay(golden, case_id, runner):
        if outcome.expected_error is not None:
            break
        if outcome.actual is None:
            return None
        payloads.append({stage: {name: np.asarray(array) for name, array in tensors.items()}
                         for stage, tensors in outcome.actual.stages.items()})
    return payloads


def _same(left: np.ndarray, right: np.ndarray) -> bool:
    return left.dtype == right.dtype and left.shape == right.shape and left.tobytes() == right.tobytes()


def _pairs(variant: Variant, original: list[dict], widened: list[dict]):
    """(step, stage, tensor, row or None, original array, variant array) for every comparison."""
    if variant.kind == BATCH:
        for step, (before, after) in enumerate(zip(original, widened)):
            for stage in STAGE_ORDER:
                for name, array in before.get(stage, {}).items():
                    if name in after.get(stage, {}):
                        for row, at in enumerate(variant.rows):
                            yield step, stage, name, row, array[row], after[stage][name][at]
        return
    cut = variant.split_step
    for step, before in enumerate(original):
        if step < cut:
            after = widened[step]
        elif step == cut:
            head, after = widened[cut], widened[cut + 1]
            writeback = before.get("writeback", {})
            for name, array in writeback.items():
                if name == "Y":
                    joined = np.concatenate([head["writeback"]["Y"], after["writeback"]["Y"]], axis=1)
                    yield step, "writeback", name, None, array, joined
                elif name.startswith("present_"):
                    yield step, "writeback", name, None, array, after["writeback"][name]
            continue
        else:
            after = widened[step + 1]
        for stage in STAGE_ORDER:
            for name, array in before.get(stage, {}).items():
                if name in after.get(stage, {}):
                    yield step, stage, name, None, array, after[stage][name]


def findings(variant: Variant, original: list[dict], widened: list[dict]) -> list[RunFinding]:
    """One finding per differing (row of a) tensor, at its first step: the earliest stage first."""
    found: dict[tuple, RunFinding] = {}
    for step, stage, name, row, before, after in _pairs(variant, original, widened):
        key = (row, name, stage)
        if key in found or _same(before, after):
            continue
        differing = int(np.count_nonzero(before.view(np.uint8) != after.view(np.uint8))) \
            if before.shape == after.shape and before.dtype == after.dtype else None
        where = f"row {row} differs" if row is not None else f"{stage}/{name} differs"
        detail = (f"{stage}/{name}: {differing} of {before.nbytes} bytes" if differing is not None
                  else f"{stage}/{name}: shape {before.shape} vs {after.shape}")
        found[key] = RunFinding(VARIANT[variant.kind], step,
                                f"{VARIANT[variant.kind]}: {where} {variant.description} ({detail})",
                                {"stages": [stage], "stage": stage, "tensor": name,
                                 **({"row": row} if row is not None else {})})
    ordered = sorted(found.values(), key=lambda item: (item.step, STAGE_ORDER.index(item.stages[0]),
                                                       item.details.get("row", 0)))
    first_per_row: dict = {}
    for item in ordered:
        first_per_row.setdefault(item.details.get("row"), item)
    return list(first_per_row.values())


def check_invariance(golden: GoldenFile, case_id: str, runner: DeviceRunner, kinds, workdir: Path,
                     seed: int = 0) -> tuple[list[RunFinding], list[str]]:
    """The findings of each invariance for one case, and a note per invariance the case cannot test."""
    stream = accepted(stream_of(golden, case_id), golden, case_id)
    if stream is None:
        return [], [f"{kind}: no accepted step" for kind in kinds]
    notes, results = [], []
    original = None
    for kind in kinds:
        variant = batch_variant(stream, case_id, seed) if kind == BATCH else chunks_variant(stream, case_id)
        if variant is None:
            notes.append(f"{kind}: no valid variant of this case")
            continue
        if original is None:
            original = device_payloads(golden, case_id, runner)
            if original is None:
                return [], ["the device run stopped before the last step: no invariance checked"]
        path = workdir / f"{kind}.h5"
        write_goldens(path, [variant.case], force=True)
        with GoldenFile(path) as variant_file:
            widened = device_payloads(variant_file, variant.case.case_id, runner)
        path.unlink()
        if widened is None:
            notes.append(f"{kind}: the device run of the variant stopped early")
            continue
        results.extend(findings(variant, original, widened))
    return results, notes
