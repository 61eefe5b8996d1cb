"""The numeric search: every single-ingredient hypothesis, then combinations, under stated caps.

Every single is tried (a first hit does not end the search: a rival that
also reproduces must be seen); then, only when no single reproduces,
combinations of two, three and four distinct ingredients among those that
moved the result, at most COMBINATION_CAP of them, or STALLED_CAP when no
single came closer than the reference's own arithmetic (the document says
when a cap was hit), and the smallest reproducing size is kept. Trials are
screened on the rows that differ (csa_conform.explain.rows) and every
reproducing trial and ``closest`` are re-run on the whole stage.
"""

from __future__ import annotations

import itertools

from csa_conform.explain.hypotheses import BINARY64_VALUES, Hypothesis, stage_hypotheses
from csa_conform.explain.rows import Rerun
from csa_conform.explain.trial import Trial
from csa_conform.numerics.variant import PAIR_FUSIONS

COMBINED_FROM = 6  # combinations are formed from this many closest ingredients
MOST_COMBINED = 4  # of at most this many ingredients
COMBINATION_CAP = 64  # combinations tried at most per divergence, smallest first
STALLED_CAP = 15  # ... when no single came closer: every pair of the six closest ingredients (untied)
ROPE_LIBM = ("powf", "sinf", "cosf")  # called only in the compressed RoPE


def ingredient(hypothesis: Hypothesis) -> str:
    """What a hypothesis swaps: a libm function (expf also for attention's P·V weights alone), the block
    scale, a fusion kind, ftz, or its sub-step's convention (a structural re-run); variants of one ingredient
    are no rivals of each other."""
    if hypothesis.libm:
        return "+".join(sorted(name for name, _ in hypothesis.libm))
    if hypothesis.weights_exp is not None:  # a variant of the stage's expf: where the denominators do not
        return "expf"  # tell them apart, both compute the same payload
    if hypothesis.block_scale is not None:
        return "block scale"
    if hypothesis.fused:
        return "pairs" if hypothesis.fused & set(PAIR_FUSIONS) else "accumulate"
    if hypothesis.ftz:
        return "ftz"
    if hypothesis.scale_folding:
        return "weight scale"
    if hypothesis.key.startswith(BINARY64_VALUES):  # the tile is a variant: where no row spans two, all agree
        return BINARY64_VALUES
    return hypothesis.key


def acts_only_in_rope(hypothesis: Hypothesis) -> bool:
    """powf, sinf, cosf and the pair contractions appear only in the compressed RoPE."""
    if hypothesis.libm:
        return hypothesis.libm[0][0] in ROPE_LIBM
    return bool(hypothesis.fused) and hypothesis.fused <= set(PAIR_FUSIONS)


def _combinations(singles: list[Hypothesis], trials: list[Trial]) -> list[list[Hypothesis]]:
    """Groups of 2..MOST_COMBINED distinct ingredients, smallest first, from the COMBINED_FROM ingredients
    whose best single comes closest; an ingredient contributes each of its variants that tie for best with a
    payload of their own (variants that computed the same payload are one)."""
    best: dict[str, list[tuple[Hypothesis, int, str]]] = {}
    for hypothesis, trial in zip(singles, trials):
        if trial.rejected is not None or not any(changed for changed, _ in trial.changed.values()):
            continue
        variants = best.setdefault(ingredient(hypothesis), [])
        if not variants or trial.mismatches < variants[0][1]:
            variants[:] = [(hypothesis, trial.mismatches, trial.digest)]
        elif trial.mismatches == variants[0][1] and all(trial.digest != digest for *_, digest in variants):
            variants.append((hypothesis, trial.mismatches, trial.digest))
    ranked = sorted(best.values(), key=lambda variants: variants[0][1])[:COMBINED_FROM]
    found = []
    for size in range(2, MOST_COMBINED + 1):
        for ingredients in itertools.combinations(ranked, size):
            for choice in itertools.product(*ingredients):
                found.append([hypothesis for hypothesis, *_ in choice])
    return found


def search(rerun: Rerun, device_libm, baseline: int, rope_exact: bool = False,
           combine: bool = True) -> tuple[list[tuple[Hypothesis, Trial]], Trial | None, list[Trial], dict]:
    """(every reproducing hypothesis and its trial, closest, every trial, how the search ran) of the stage
    ``rerun`` re-runs: all singles,
    then the smallest combinations of the closest ingredients (a kernel may swap several at once, e.g.
    CUDA's powf, sinf and cosf together) when no single reproduces and ``combine``, at most COMBINATION_CAP of
    them (STALLED_CAP when no single moved the result closer to the device's). Trials are screened on the
    rows that differ; every reproducing trial and ``closest`` (the trial with fewest mismatches among those
    with fewer than ``baseline``, the reference's own) are re-run on the whole stage, a screened trial that
    does not reproduce there is no cause, and ``closest`` is None unless it has fewer than ``baseline`` there."""
    singles = [hypothesis for hypothesis in stage_hypotheses(rerun.stage, device_libm)
               if not (rope_exact and acts_only_in_rope(hypothesis))]
    trials = [rerun.confirmed(hypothesis, rerun.trial(hypothesis)) for hypothesis in singles]
    hypotheses = list(singles)
    groups = _combinations(singles, trials) if combine and not any(trial.reproduces for trial in trials) else []
    progress = any(trial.rejected is None and trial.mismatches < baseline for trial in trials)
    cap = COMBINATION_CAP if progress else STALLED_CAP
    tried = 0
    for members in groups[:cap]:
        if tried and len(members) > len(groups[tried - 1]) and any(trial.reproduces for trial in trials):
            break  # the smallest reproducing size is complete
        combined = members[0]
        for other in members[1:]:
            combined = combined.combine(other)
        trials.append(rerun.confirmed(combined, rerun.trial(combined)))
        hypotheses.append(combined)
        tried += 1
    reproducing = [(hypothesis, trial) for hypothesis, trial in zip(hypotheses, trials) if trial.reproduces]
    summary = {"singles": len(singles), "combinations": tried, "cap": cap,
               "capped": tried == cap and len(groups) > cap and not reproducing,
               "untried": len(groups) - tried, "screened_rows": rerun.screened}
    measured = [trial for trial in trials if trial.rejected is None and trial.mismatches < baseline]
    closest = min(measured, key=lambda trial: trial.mismatches) if measured else None
    if closest is not None and rerun.screened is not None:
        # screened, it was counted on the differing rows alone: on the whole stage it may also break rows the
        # device has right, and is closer than the reference only if it still has fewer mismatches there
        closest = rerun.whole(closest)
        closest = closest if closest.mismatches < baseline else None
    return reproducing, closest, trials, summary
