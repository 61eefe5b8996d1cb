"""`diff --invariance`: what the contract says must not change a row's bits, checked device against
device on the host emulation (a batch-size-dependent kernel is caught from B = 1 cases that a plain
diff passes), and the oracle fact `--invariance chunks` rests on: a chunked prefill is bit for bit
the single prefill."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner
from invariance_mutants import SPLIT_BY_BATCH
from mutants import MUTANTS

from csa_conform.check.results import schema
from csa_conform.cli.diff import diff
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile
from csa_conform.golden.edits import Stream, embedded, split, stream_of
from csa_conform.golden.recipes import suite_recipes
from csa_conform.oracle import run_step

ROOT = Path(__file__).resolve().parents[2]
CI_GOLDENS = ROOT / "goldens" / "ci.h5"
KERNELS = ROOT / "kernels"
SINGLE_ROW = ("random.r4-n4-i3-k1", "boundaries.r128-resumed-247-to-257")


def _diff(*args):
    return CliRunner().invoke(diff, [str(CI_GOLDENS), *map(str, args)])


@pytest.mark.usefixtures("emulated_cuda")
@pytest.mark.parametrize("case", SINGLE_ROW)
def test_a_batch_dependent_kernel_is_reported_from_a_case_a_plain_diff_passes(case, tmp_path):
    kernels = SPLIT_BY_BATCH.apply(KERNELS, tmp_path / "kernels")
    plain = _diff("--kernels", kernels, "--case", case, "-q")
    assert plain.exit_code == ExitCode.OK, plain.output
    found = _diff("--kernels", kernels, "--case", case, "-q", "--invariance", "batch")
    assert found.exit_code == ExitCode.DIVERGED
    assert f"{case} step 0: batch-variant: row 0 differs between B=1 and B=5 " \
           "(sparse_sink_softmax_attention/scores: " in found.stdout
    assert f"--case {case} --kernels {kernels} --invariance batch" in found.stdout
    assert found.stdout.splitlines()[0].endswith("0 conformant, 0 diverged, 1 batch-variant")
    document = json.loads(_diff("--kernels", kernels, "--case", case, "--invariance", "batch", "--json").stdout)
    jsonschema.validate(document, schema())
    assert document["options"]["invariance"] == ["batch"]
    assert document["cases"][0]["verdicts"]["sparse_sink_softmax_attention"] == "batch-variant"
    (finding,) = document["cases"][0]["steps"][0]["findings"]
    assert finding["type"] == "batch-variant" and finding["row"] == 0 and finding["tensor"] == "scores"


@pytest.mark.usefixtures("emulated_cuda")
def test_the_builtin_kernels_keep_both_invariances():
    result = _diff("--case", "boundaries.r4-[cp]*", "-q", "--invariance", "batch", "--invariance", "chunks")
    assert result.exit_code == ExitCode.OK, result.output
    assert " 0 diverged" in result.stdout


@pytest.mark.usefixtures("emulated_cuda")
def test_a_kernel_that_reads_past_the_query_is_chunk_variant(tmp_path):
    mutant = next(mutant for mutant in MUTANTS if mutant.name == "dense_window_includes_next_position")
    kernels = mutant.apply(KERNELS, tmp_path / "kernels")
    result = _diff("--kernels", kernels, "--case", "boundaries.r4-prefill-9", "-q", "--invariance", "chunks")
    assert result.exit_code == ExitCode.DIVERGED
    assert "chunk-variant: writeback/Y differs between step 0 in one and in two chunks (4 + 5 tokens)" \
        in result.stdout


def _single_step_prefills():
    for recipe in suite_recipes("ci"):
        if recipe.family == "errors":
            continue
        case = recipe.generate(run_step)
        first = case.steps[0]
        if first.expect_error is None and int(first.inputs["total_sequence_length"]) == first.inputs["query"].shape[1]:
            yield case


def test_the_oracle_gives_a_chunked_prefill_the_bits_of_the_single_prefill():
    checked = set()
    for case in _single_step_prefills():
        stream = Stream(case.attrs, case.output_names, (case.steps[0].inputs,), (frozenset(),))
        count = stream.tokens
        for first in sorted({1, count // 2, count - 1} - {0, count}):
            chunked = split(stream, 0, first).case("chunks", "")
            assert chunked is not None, (case.case_id, first)
            whole, head, rest = case.steps[0].outputs, chunked.steps[0].outputs, chunked.steps[1].outputs
            joined = np.concatenate([head["Y"], rest["Y"]], axis=1)
            assert joined.tobytes() == whole["Y"].tobytes(), (case.case_id, first)
            for name in whole:
                if name.startswith("present_"):
                    assert rest[name].tobytes() == whole[name].tobytes(), (case.case_id, first, name)
            checked.add((case.attrs["compression_ratio"], count))
    assert {ratio for ratio, _ in checked} == {4, 128} and len(checked) >= 8


def test_embedded_rows_keep_the_oracle_bits_of_the_case_rows():
    with GoldenFile(CI_GOLDENS) as golden:
        stream = stream_of(golden, "random.r4-b2n2-i2-k512")
        stored = [golden.read_step("random.r4-b2n2-i2-k512", index) for index in range(2)]
    wide, rows = embedded(stream, 4, np.random.default_rng(0))
    assert wide.batch == 6 and rows == [2, 3]
    case = wide.case("wide", "")
    for step, original in zip(case.steps, stored):
        for name, array in original.outputs.items():
            assert step.outputs[name][rows].tobytes() == array.tobytes(), name
        neighbour = step.inputs["query"][0]
        assert not np.array_equal(neighbour, original.inputs["query"][0])
