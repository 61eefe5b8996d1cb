"""Set-up the explain tests share: step 0 of a committed ci case, a stage payload explained as if the
device had written it, and a rival hypothesis added to the search."""

from __future__ import annotations

from pathlib import Path

import csa_conform.explain.search as search
from csa_conform.compare.bitwise import compare_payloads
from csa_conform.contract import validate_step
from csa_conform.explain import Divergence, explain_step
from csa_conform.explain.hypotheses import Hypothesis
from csa_conform.golden import GoldenFile

ROOT = Path(__file__).resolve().parents[2]
CI_GOLDENS = ROOT / "goldens" / "ci.h5"


def first_step(case: str):
    """The geometry, inputs and oracle stage payloads of the case's step 0."""
    with GoldenFile(CI_GOLDENS) as golden:
        info, step = golden.case_info(case), golden.read_step(case, 0)
    return validate_step(info.attrs, step.inputs, info.output_names), step.inputs, step.stages


def explain_payload(stage, g, inputs, expected, payload, witnesses=None):
    """Explain ``payload`` as the device's ``stage`` (every other stage the oracle's); it must diverge."""
    device = dict(expected, **{stage: payload})
    diffs = [diff for diff in compare_payloads({stage: expected[stage]}, {stage: payload}) if not diff.passed]
    assert diffs
    return explain_step(Divergence("case", 0, stage, g, inputs, expected, device, diffs), None, {}, witnesses)


def add_rival(monkeypatch, rival: Hypothesis) -> None:
    """Search ``rival`` besides the stage's own hypotheses."""
    stock = search.stage_hypotheses
    monkeypatch.setattr(search, "stage_hypotheses", lambda *args: stock(*args) + [rival])
