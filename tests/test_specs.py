"""specs/stage-payloads.md documents exactly the payloads the oracle emits."""

from __future__ import annotations

import re
from pathlib import Path

from csa_conform.fixtures.closed_form import ratio4_plan, ratio128_plan
from csa_conform.fixtures.stream import play
from csa_conform.oracle import STAGES, run_step

SPEC = Path(__file__).resolve().parents[1] / "specs" / "stage-payloads.md"


def documented() -> set[tuple[str, str]]:
    rows = re.findall(r"^\| (\w+) \| ([\w*][^|]*?) \|", SPEC.read_text(), flags=re.MULTILINE)
    return {(stage, tensor) for stage, tensor in rows if stage != "stage"}


def emitted(plan) -> set[tuple[str, str]]:
    golden = play(plan, run_step)[-1]
    return {
        (stage, "*every operator output*" if stage == "writeback" else tensor)
        for stage, payload in golden.stages.items()
        for tensor in payload
    }


def test_spec_lists_every_payload_of_both_ratios():
    produced = emitted(ratio4_plan(((0, 8),))) | emitted(ratio128_plan(((0, 128, None),)))
    assert produced == documented()
    assert {stage for stage, _ in produced} == set(STAGES)
