"""Searching for what the suite misses: Hypothesis-drawn valid cases, device against oracle.

A drawn case is a random stream of the ``random`` family's kind
(``fixtures.randomized.StreamSpec``) at the edges the suite covers thinly:
both ratios, f32 and FP8 ratio-128 caches, 5 and 6 outputs, every broadcast
shape of attention_bias, streams from position 0 and resumed ones (near
block ends too), kv windows from the dense window's minimum up, B, N and I
in 1..8 (not only powers of two), top-k from 1 to 512, and head sinks far
below, near and far above the row maximum. The oracle makes its goldens (a
draw the contract rejects, or whose index scores tie, is discarded); the
device run must agree with them bit for bit. On a divergence Hypothesis
shrinks the draw (fewer steps, tokens, rows, heads, smaller seeds) while it
still diverges; the smallest diverging case seen is the result. A seed makes
a run repeat draw for draw (Hypothesis then leaves its database alone); without
one the draws are new each run and the example database replays the failures
of earlier runs first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from csa_conform.errors import FixtureError, TopKTie
from csa_conform.golden import GoldenCase
from csa_conform.golden.recipes.randomized import StreamSpec, bias_patterns, describe, random_plan
from csa_conform.golden.recipes.stream import play
from csa_conform.oracle import run_step

FAMILY = "fuzz"
WEIGHTS_SEED = 17
# Head sink offsets: far below every score, near them, far above (the sink then dominates the max).
SINK_SHIFTS = (0.0, -30.0, 30.0)
COUNTS = (1, 2, 3, 5, 8)
TOPKS = (1, 2, 3, 5, 8, 512)
# Resumed streams start here: inside the first blocks and at or near the ends of later ones.
STARTS = {4: (0, 1, 2, 3, 4, 5, 7, 8, 11, 16, 17), 128: (0, 1, 126, 127, 128, 129, 250, 255, 256)}


@dataclass(frozen=True)
class Draw:
    """One drawn case: its geometry, its value seed and the sink offset."""

    spec: StreamSpec
    values_seed: int
    sink_shift: float

    def describe(self) -> str:
        return f"{describe(self.spec)}; values seed {self.values_seed}; sink shift {self.sink_shift:+g}"


def draws():
    """The Hypothesis strategy of ``Draw``s (imported lazily: hypothesis is the fuzz extra)."""
    from hypothesis import strategies as st

    @st.composite
    def draw_case(draw) -> Draw:
        ratio = draw(st.sampled_from((4, 128)))
        steps = draw(st.integers(1, 3))
        longest = 9 if ratio == 4 else 6
        chunks = tuple(draw(st.integers(1, longest)) for _ in range(steps))
        rank = draw(st.integers(0, 5)) - 1  # shrinks to -1: no bias
        bias = () if rank < 0 else (draw(st.sampled_from(bias_patterns(rank))),)
        spec = StreamSpec(
            ratio=ratio,
            chunks=chunks,
            batch=draw(st.sampled_from(COUNTS[:3])),
            heads=draw(st.sampled_from(COUNTS)),
            cache_format="" if ratio == 4 else draw(st.sampled_from(("f32", "fp8_e4m3_block64"))),
            index_heads=draw(st.sampled_from(COUNTS)) if ratio == 4 else 1,
            index_topk=draw(st.sampled_from(TOPKS)) if ratio == 4 else 2,
            outputs=draw(st.sampled_from((5, 6))),
            scale=draw(st.sampled_from((None, 0.0625, 0.3))),
            windows=(draw(st.sampled_from(("full", "min", 1, 3))),),
            bias=bias,
            start=draw(st.sampled_from(STARTS[ratio])),
        )
        return Draw(spec, draw(st.integers(0, 2**16)), draw(st.sampled_from(SINK_SHIFTS)))

    return draw_case()


def build(drawn: Draw) -> GoldenCase | None:
    """The oracle's golden case of a draw, None when the contract rejects it or its scores tie."""
    plan = random_plan(drawn.spec, drawn.values_seed, WEIGHTS_SEED)
    plan.constants["head_sink"] = (plan.constants["head_sink"] + np.float32(drawn.sink_shift)).astype(np.float32)
    try:
        steps = play(plan, run_step, FAMILY)
    except (FixtureError, TopKTie):
        return None
    return GoldenCase(f"{FAMILY}.case", dict(plan.attrs), tuple(plan.output_names), steps, family=FAMILY,
                      seed=drawn.values_seed, description=drawn.describe())


def elements(case: GoldenCase) -> int:
    return sum(int(array.size) for step in case.steps for array in step.inputs.values())


class BudgetSpent(BaseException):
    """Raised through Hypothesis (which only catches Exception) to end the search."""


@dataclass
class Found:
    draw: Draw
    case: GoldenCase
    divergence: dict
    size: int


@dataclass
class FuzzRun:
    examples: int = 0
    valid: int = 0
    found: Found | None = None
    seconds: float = 0.0


def fuzz(probe: Callable[[GoldenCase], dict | None], budget_s: float, seed: int | None, database: Path | None,
         say: Callable[[str], None]) -> FuzzRun:
    """Draw, build and probe cases until one diverges and is shrunk, or the budget is spent.

    Shrinking gets as long again as the budget; the smallest diverging case seen is kept.
    """
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.database import DirectoryBasedExampleDatabase

    run = FuzzRun()
    started = time.perf_counter()

    def elapsed() -> float:
        return time.perf_counter() - started

    def check(drawn: Draw) -> None:
        limit = budget_s if run.found is None else 2 * budget_s
        if elapsed() > limit:
            raise BudgetSpent
        run.examples += 1
        case = build(drawn)
        if case is None:
            return
        run.valid += 1
        found = probe(case)
        if found is None:
            if run.found is None and run.valid % 25 == 0:
                say(f"fuzz: {run.valid} valid cases of {run.examples} drawn, none diverged ({elapsed():.0f} s)")
            return
        size = elements(case)
        if run.found is None or size < run.found.size:
            if run.found is None:
                say(f"fuzz: case {run.valid} diverges at {found['stage']}; shrinking")
            run.found = Found(drawn, case, found, size)
            say(f"fuzz: smallest diverging case so far: {size:,} input elements: {drawn.describe()}")
        raise AssertionError(f"diverges at {found['stage']}")

    options = settings(
        max_examples=10**6, deadline=None, verbosity=Verbosity.quiet, print_blob=False,
        suppress_health_check=list(HealthCheck), derandomize=False,
        database=DirectoryBasedExampleDatabase(str(database)) if database is not None else None,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
    )
    test = options(given(draws())(check))
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    try:
        test()
    except (BudgetSpent, AssertionError):
        pass
    run.seconds = elapsed()
    return run
