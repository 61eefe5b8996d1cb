"""Searching for what the suite misses: Hypothesis-drawn valid cases, device against oracle.

A drawn case is a random stream of the ``random`` family's kind
(``fixtures.randomized.StreamSpec``) at the edges the suite covers thinly:
both ratios, f32 and FP8 ratio-128 caches, 5 and 6 outputs, every broadcast
shape of attention_bias, streams from position 0 and resumed ones, kv windows
from the dense window's minimum up, B in 1..4 (mostly above 1: the per-row
offsets), N and I in 1..8 (not only powers of two), top-k from 1 to 512, and
head sinks far below, near and far above the row maximum. The draw leans
toward the boundaries the contract defines: starts past the dense window's
fill (then Kc at every offset past its minimum), at power-of-two record counts
and at the block phases that matter (a long ratio-128 carry), and steps that
end at a block end or one past it. The oracle makes its goldens (a
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

from csa_conform.check.model import StepVerdict
from csa_conform.contract import DENSE_WINDOW
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
# B > 1 twice as often as B = 1: the per-row offsets of every input, carry and selection.
BATCHES = (1, 2, 3, 2, 4)
TOPKS = (1, 2, 3, 5, 8, 512)
# Resumed streams start here: inside the first blocks and at or near the ends of later ones.
STARTS = {4: (0, 1, 2, 3, 4, 5, 7, 8, 11, 16, 17), 128: (0, 1, 126, 127, 128, 129, 250, 255, 256)}
# A step's first position inside its block that the contract's edges meet: a block's start, its
# second position, its middle (half a ratio-128 carry), its last two (the next token completes it).
PHASES = {4: (0, 1, 2, 3), 128: (0, 1, 64, 126, 127)}
# Streams resumed where the dense window is full: this many positions past 127, the step's first query
# then seeing a window that current_kv may reach past (every window offset from the minimum up).
PAST_WINDOW = (0, 1, 2, 3, 5, 8, 17, 64, 129)
# Record counts at powers of two: 2^0 .. 2^k records before the step (ratio 4 stops at 64: more
# random FP4 keys tie).
RECORD_POWERS = {4: 6, 128: 3}
# From this position on (16 records at ratio 4), one or two index heads' random FP4 keys tie in most
# draws: three or more are drawn.
MANY_RECORDS = 64
# The longest step a block-end draw makes (longer ratio-128 ones cost seconds a draw; a long carry
# comes from a start late in its block instead).
BLOCK_CHUNK = 9
# Kc past the window's minimum for "window" streams: a window of one extra position up to the full history.
WINDOW_OFFSETS = (1, 2, 3, 64, 127, 128)


@dataclass(frozen=True)
class Draw:
    """One drawn case: its geometry, its value seed and the sink offset."""

    spec: StreamSpec
    values_seed: int
    sink_shift: float

    def describe(self) -> str:
        return f"{describe(self.spec)}; values seed {self.values_seed}; sink shift {self.sink_shift:+g}"


def _start(draw, st, ratio: int) -> int:
    """A thin-edge start (as before, a quarter of the draws), a start past the window fill (half), or
    one at a power-of-two record count (a quarter), each at a block phase the contract distinguishes."""
    kind = draw(st.sampled_from(("thin", "window", "records", "window")))
    if kind == "thin":
        return draw(st.sampled_from(STARTS[ratio]))
    if kind == "window":
        return DENSE_WINDOW - 1 + draw(st.sampled_from(PAST_WINDOW))
    records = 2 ** draw(st.integers(0, RECORD_POWERS[ratio]))
    return records * ratio + draw(st.sampled_from(PHASES[ratio]))


def _chunk(draw, st, ratio: int, position: int, longest: int) -> int:
    """A step length: short, or one that ends exactly at the next block end (a block completed inside
    the step: a long ratio-128 carry pooled) or one past it."""
    to_end = ratio - position % ratio
    kind = draw(st.sampled_from(("short", "short", "block end", "past the block end")))
    if kind == "short" or to_end + 1 > BLOCK_CHUNK:
        return draw(st.integers(1, longest))
    return to_end if kind == "block end" else to_end + 1


def _window(draw, st, start: int) -> str | int:
    """Kc: the whole history, the dense window's minimum, or the minimum plus an offset (only a step
    past position 127 has room for one: its first query's window then starts inside current_kv)."""
    if start < DENSE_WINDOW:
        return draw(st.sampled_from(("full", "min", 1, 3)))
    kind = draw(st.sampled_from(("full", "min", "offset")))
    return kind if kind != "offset" else draw(st.sampled_from(WINDOW_OFFSETS))


def draws():
    """The Hypothesis strategy of ``Draw``s (imported lazily: hypothesis is the fuzz extra)."""
    from hypothesis import strategies as st

    @st.composite
    def draw_case(draw) -> Draw:
        ratio = draw(st.sampled_from((4, 128)))
        start = _start(draw, st, ratio)
        longest = 9 if ratio == 4 else 6
        chunks, position = [], start
        for _ in range(draw(st.integers(1, 3))):
            chunks.append(_chunk(draw, st, ratio, position, longest))
            position += chunks[-1]
        rank = draw(st.integers(0, 5)) - 1  # shrinks to -1: no bias
        bias = () if rank < 0 else (draw(st.sampled_from(bias_patterns(rank))),)
        spec = StreamSpec(
            ratio=ratio,
            chunks=tuple(chunks),
            batch=draw(st.sampled_from(BATCHES)),
            heads=draw(st.sampled_from(COUNTS)),
            cache_format="" if ratio == 4 else draw(st.sampled_from(("f32", "fp8_e4m3_block64"))),
            index_heads=draw(st.sampled_from(COUNTS if start < MANY_RECORDS else COUNTS[2:])) if ratio == 4 else 1,
            index_topk=draw(st.sampled_from(TOPKS)) if ratio == 4 else 2,
            outputs=draw(st.sampled_from((5, 6))),
            scale=draw(st.sampled_from((None, 0.0625, 0.3))),
            windows=(_window(draw, st, start),),
            bias=bias,
            start=start,
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
    divergence: StepVerdict
    size: int


@dataclass
class FuzzRun:
    examples: int = 0
    valid: int = 0
    found: Found | None = None
    seconds: float = 0.0
    first_s: float | None = None  # when the first divergence was found


def fuzz(probe: Callable[[GoldenCase], StepVerdict | None], budget_s: float, seed: int | None, database: Path | None,
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
                say(f"fuzz: case {run.valid} diverges at {found.stage} ({elapsed():.0f} s); shrinking")
                run.first_s = elapsed()
            run.found = Found(drawn, case, found, size)
            say(f"fuzz: smallest diverging case so far: {size:,} input elements: {drawn.describe()}")
        raise AssertionError(f"diverges at {found.stage}")

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
