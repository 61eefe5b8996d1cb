"""Chained bridge runs feed the runtime's own present_* back as the next step's past_* (isolated ones the
golden state), and name the first step that left the goldens."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from csa_conform.bridge.nxrt import encode
from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile

CI = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"
FAKE = Path(__file__).with_name("fake_runner.py")
CASE = "boundaries.r128-resumed-119-chunks"  # three steps, the compressor's carry threaded through them


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("mode", ["chained", "isolated"])
def test_the_runtimes_state_feeds_the_next_step_only_when_chained(tmp_path, mode):
    log = tmp_path / "log.jsonl"
    result = CliRunner().invoke(
        main, ["bridge", str(CI), "--case", CASE, "--mode", mode, "--force-host-env", "", "--json",
               "--runner", f"{sys.executable} {FAKE} perturb-present {{model}} {{case_dir}}"],
        env={"FAKE_LOG": str(log), "FAKE_PERTURB_STEP": "0"})
    assert result.exit_code == ExitCode.DIVERGED, result.output
    document = json.loads(result.stdout)
    (case,) = document["cases"]
    assert [step["step"] for step in case["steps"]] == [0]  # the echoing runtime diverges only where it flips
    assert case["steps"][0]["stages"][0]["tensors"][0]["tensor"] == "present_compression_carry"
    assert document["bridge"]["streams"] == [{"case": CASE, "first_divergence": {"plain": 0},
                                              "leaves_first": "plain"}]
    with GoldenFile(CI) as golden:
        present = bytearray(encode(golden.read_step(CASE, 0).outputs["present_compression_carry"]))
        stored = encode(golden.read_step(CASE, 1).inputs["past_compression_carry"])
    assert bytes(present) == stored  # the golden stream threads the carry
    present[-1] ^= 0x01  # what the runtime returned at step 0
    received = [json.loads(line)["inputs"]["past_compression_carry"] for line in log.read_text().splitlines()]
    assert received[1] == (sha(bytes(present)) if mode == "chained" else sha(stored))
