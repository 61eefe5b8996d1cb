"""Fixture recipes: the streams they build and the edges they are designed to reach.

Checked against the committed goldens/ci.h5 where the oracle's results are
needed (so these tests also fail when that file goes stale), and through
small fake runners where only the stream plumbing matters.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import numpy as np
import pytest

from csa_conform.errors import ContractError
from csa_conform.golden import GoldenFile
from csa_conform.golden.recipes import FAMILIES, SUITES, FixtureError, suite_recipes
from csa_conform.golden.recipes.closed_form import ratio128_plan
from csa_conform.golden.recipes.quant_edge import FP4_DESIGNS, walsh_vector
from csa_conform.golden.recipes.randomized import StreamSpec, Values, bias_name, bias_patterns, random_plan
from csa_conform.golden.recipes.stream import STATE, Recipe, StepPlan, StreamPlan, play
from csa_conform.numerics.fp4 import quantize_fp4_blocks, unpack_nibbles
from csa_conform.numerics.hadamard import hadamard_bf16
from csa_conform.numerics.records import unpack_fp4_record, unpack_fp8_record
from csa_conform.oracle import StepResult

CI = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"


@pytest.fixture(scope="module")
def golden():
    with GoldenFile(CI) as handle:
        yield handle


def test_ci_suite_names_cases_uniquely_in_sorted_order_and_covers_every_family():
    recipes = suite_recipes("ci")
    ids = [recipe.case_id for recipe in recipes]
    assert ids == sorted(ids) and len(ids) == len(set(ids))
    assert {recipe.family for recipe in recipes} == set(SUITES["ci"]) == set(FAMILIES) - {"long"}
    assert all(recipe.description for recipe in recipes)


def test_suite_seed_changes_random_cases_only():
    first = {recipe.case_id: recipe.seed for recipe in suite_recipes("ci", 0)}
    second = {recipe.case_id: recipe.seed for recipe in suite_recipes("ci", 1)}
    assert first.keys() == second.keys()
    changed = {case_id for case_id in first if first[case_id] != second[case_id]}
    assert changed == {case_id for case_id in first if not case_id.startswith("seed-closed-form.")}


def test_case_glob_selects_and_unknown_names_are_usage_errors():
    assert [r.case_id for r in suite_recipes("ci", 0, "seed-closed-form.r4-*")] == [
        "seed-closed-form.r4-prefill-16",
        "seed-closed-form.r4-prefill-8",
        "seed-closed-form.r4-stream-6-to-16",
    ]
    with pytest.raises(Exception, match="no case of suite 'ci' matches"):
        suite_recipes("ci", 0, "nothing-*")
    with pytest.raises(Exception, match="unknown suite 'huge'"):
        suite_recipes("huge")


def test_committed_ci_file_holds_exactly_the_ci_suite(golden):
    assert golden.case_ids() == [recipe.case_id for recipe in suite_recipes("ci")]
    assert golden.provenance["suite"] == "ci" and golden.provenance["suite_seed"] == 0


def test_committed_ci_file_stays_a_few_megabytes():
    """The committed suite's budget, 8.8 MB (the edges family's far RoPE positions take 1.6 MB of it; the three
    ``-signed`` cases, the only ones with negative index dots, 94 kB; the three ``block-end-in-step`` cases, the
    only B > 1 ratio-128 steps where a query reads fewer records than the cache holds, 49 kB; the three
    ``far-gates`` cases, the only pooled dimensions whose scores overflow or underflow exp unshifted, 0.36 MB;
    the four ``near-tie`` cases, the only rows whose top two index scores share the top 24 bits of their
    selection keys, 0.17 MB)."""
    assert CI.stat().st_size < 8.8e6


def test_seed_pinned_record_bytes_at_block_start_128(golden):
    stream = golden.read_step("seed-closed-form.r128-stream-to-257", 4)
    record = stream.outputs["present_compressed_kv"][0, 1]
    assert record[:8].tolist() == [119, 115, 115, 116, 116, 117, 118, 118]
    assert record[583 - 128 :][:8].tolist() == [173, 191, 51, 186, 117, 63, 143, 63]


def test_streaming_equals_full_recompute_in_the_goldens(golden):
    stream = golden.read_case("seed-closed-form.r128-stream-to-257")
    full = golden.read_step("seed-closed-form.r128-full-recompute-257", 1)
    for name in ("present_compressed_kv", "present_compression_carry"):
        assert np.array_equal(stream.steps[-1].outputs[name], full.outputs[name])
    decoded_y = np.concatenate([step.outputs["Y"] for step in stream.steps[2:]], axis=1)
    assert np.array_equal(decoded_y.view(np.uint32), full.outputs["Y"][:, 126:].view(np.uint32))
    ratio4 = golden.read_case("seed-closed-form.r4-stream-6-to-16")
    prefill16 = golden.read_step("seed-closed-form.r4-prefill-16", 0)
    assert np.array_equal(ratio4.steps[-1].outputs["present_index_key"], prefill16.outputs["present_index_key"])
    assert np.array_equal(ratio4.steps[-1].outputs["selected_indices"][:, :, 0], prefill16.outputs["selected_indices"][:, :, 15])


def test_stream_feeds_present_state_forward_and_windows_the_history(golden):
    case = golden.read_case("boundaries.r4-resumed-126-windows")
    for before, after in zip(case.steps, case.steps[1:]):
        for present, past in STATE.items():
            assert np.array_equal(before.outputs[present], after.inputs[past])
    totals = [int(step.inputs["total_sequence_length"]) for step in case.steps]
    assert totals == [128, 129]
    assert [step.inputs["current_kv"].shape[1] for step in case.steps] == [128, 129]
    assert [step.inputs["seqlens_k"].tolist() for step in case.steps] == [[total - 1] for total in totals]


def test_resumed_ratio_128_streams_share_their_synthesized_carry(golden):
    first = golden.read_step("boundaries.r128-resumed-119-chunks", 0).inputs["past_compression_carry"]
    second = golden.read_step("boundaries.r128-resumed-247-to-257", 0).inputs["past_compression_carry"]
    assert np.array_equal(first.view(np.uint32), second.view(np.uint32))
    assert np.isfinite(first[:, :119]).all() and np.isneginf(first[:, 119:, 1]).all()


def test_coarse_values_keep_four_significant_bits_rounded_to_nearest():
    draw = np.random.default_rng(7).standard_normal(4096, dtype=np.float32)
    coarse = Values(7).coarse((4096,))
    assert not (coarse.view(np.uint32) & np.uint32(0xFFFFF)).any()
    half_ulp = np.exp2(np.floor(np.log2(np.abs(draw.astype(np.float64)))) - 4)
    assert (np.abs(coarse - draw.astype(np.float64)) <= half_ulp).all()
    assert len(np.unique(coarse)) > 20


def test_quant_edge_fp8_record_reaches_every_scale_and_code_edge(golden):
    step = golden.read_step("quant-edge.r128-fp8-crafted-record", 0)
    scales, codes, _ = unpack_fp8_record(step.outputs["present_compressed_kv"][0, 0])
    assert scales.tolist() == [127, 124, 128, 105, 105, 126, 147]
    block0 = set(codes[0].tolist())
    assert {0x7E, 0xFE, 0x80, 0x00, 0x01, 0x02, 0x07, 0x08}.issubset(block0)
    assert 0x38 in block0 and 0x3A in block0  # 1.0625 -> 1.0 and 1.1875 -> 1.25 (ties to even)
    assert set(codes[4].tolist()) == {0x00, 0x80}


def test_quant_edge_fp4_designs_hit_ties_floor_and_no_negative_zero(golden):
    step = golden.read_step("quant-edge.r4-crafted-records", 0)
    key_scales, key_packed = unpack_fp4_record(step.outputs["present_index_key"][0, 0])
    assert key_scales.tolist() == [127, 127, 127, 127]
    assert 8 not in set(unpack_nibbles(key_packed).reshape(-1).tolist())
    transformed = step.stages["index_query_finalize"]["transformed"][0, 0]
    for head, design in enumerate(FP4_DESIGNS):
        rotated = hadamard_bf16(walsh_vector(design)).reshape(4, 32)
        scales, packed, dequantized = quantize_fp4_blocks(rotated)
        assert np.array_equal(transformed[head], dequantized.reshape(-1))
        normalized = set((rotated / np.exp2(scales.astype(np.float64) - 127)[:, None]).reshape(-1).tolist())
        if head == 1:
            assert {0.25, 0.75, 1.25, 1.75, -0.25, -0.75, -1.25, -1.75}.issubset(normalized)
        if head == 2:
            assert 1 in scales.tolist()
        assert 8 not in set(unpack_nibbles(packed).reshape(-1).tolist())


def test_every_error_case_ends_in_an_expected_rejection(golden):
    messages = {}
    for case_id in fnmatch.filter(golden.case_ids(), "errors.*"):
        info = golden.case_info(case_id)
        assert info.errors == (info.step_count - 1,)
        message = golden.step_attrs(case_id, info.step_count - 1)["expect_error"]
        assert message.startswith(("CompressedSparseAttention: ", "block dequantization: "))
        messages[case_id] = message
    assert len(messages) >= 90
    assert len(set(messages.values())) >= 80


def test_bias_cases_cover_every_pattern_on_ratio_4_and_each_broadcast_flag_both_ways_on_128(golden):
    ids = set(golden.case_ids())
    every = [bias_name(pattern) for rank in range(5) for pattern in bias_patterns(rank)]
    assert len(every) == 31
    assert {f"random.r4-bias-{name}" for name in every} <= ids
    ratio128 = [case for case in ids if case.startswith("random.r128-bias-")]
    shapes = {golden.read_step(case, 0).inputs["attention_bias"].shape for case in ratio128}
    assert all(len(shape) == 4 for shape in shapes)
    for axis in range(4):
        assert {shape[axis] == 1 for shape in shapes} == {True, False}, f"axis {axis}"
    bias = golden.read_step("random.r4-bias-B1S1", 0).inputs["attention_bias"]
    assert bias.shape == (2, 1, 2, 1)


def test_full_suite_runs_every_bias_pattern_on_both_ratios():
    ids = {recipe.case_id for recipe in suite_recipes("full")}
    every = [bias_name(pattern) for rank in range(5) for pattern in bias_patterns(rank)]
    assert {f"random.r{ratio}-bias-{name}" for ratio in (4, 128) for name in every} <= ids
    assert {recipe.case_id for recipe in suite_recipes("ci")} <= ids


class ScriptedRunner:
    """A fake oracle: present state = a counter, rejections scripted per call."""

    def __init__(self, rejections: dict[int, str] | None = None):
        self.calls = 0
        self.rejections = rejections or {}

    def __call__(self, attrs, inputs, output_names):
        self.calls += 1
        if self.calls in self.rejections:
            raise ContractError(self.rejections[self.calls])
        marker = np.array([self.calls], dtype=np.float32)
        return StepResult(outputs={"Y": marker, "present_compression_carry": marker})


def tiny_plan(expect_error_last: bool = False) -> StreamPlan:
    plan = ratio128_plan(((0, 2, None), (2, 1, None), (3, 1, 2)))
    plan.steps[-1].expect_error = expect_error_last
    return plan


def test_play_assembles_cursors_windows_and_feeds_state():
    plan = tiny_plan()
    steps = play(plan, ScriptedRunner())
    assert [int(step.inputs["total_sequence_length"]) for step in steps] == [2, 3, 4]
    assert np.array_equal(steps[2].inputs["current_kv"], plan.kv_history[:, 2:4])
    assert steps[1].inputs["past_compression_carry"].tolist() == [1.0]
    assert steps[2].inputs["past_compression_carry"].tolist() == [2.0]


def test_play_refuses_surprises_in_either_direction():
    with pytest.raises(FixtureError, match="oracle rejected the step"):
        play(tiny_plan(), ScriptedRunner({2: "CompressedSparseAttention: no"}))
    with pytest.raises(FixtureError, match="accepted a step meant to be rejected"):
        play(tiny_plan(expect_error_last=True), ScriptedRunner())
    steps = play(tiny_plan(expect_error_last=True), ScriptedRunner({3: "CompressedSparseAttention: no"}))
    assert steps[-1].expect_error == "CompressedSparseAttention: no" and steps[-1].outputs == {}


def test_tied_draws_are_redrawn_with_the_next_seed():
    spec = StreamSpec(4, (4,))
    tie = "CompressedSparseAttention: Unsupported: portable top-k tie ordering is unfrozen: equal score 0"
    runner = ScriptedRunner({1: tie, 2: tie})
    recipe = Recipe("t.case", "t", 100, "d", lambda seed: random_plan(spec, seed, 0), redraw_ties=True)
    case = recipe.generate(runner)
    assert case.seed == 102 and runner.calls == 3


def test_a_stream_may_only_fail_at_its_end():
    plan = tiny_plan()
    plan.steps[0].expect_error = True
    with pytest.raises(FixtureError, match="only the last step"):
        play(plan, ScriptedRunner())


def test_step_plan_sequence_and_total():
    step = StepPlan(start=5, fresh={"query": np.zeros((1, 3, 1, 512), np.float32)})
    assert (step.sequence, step.total) == (3, 8)


def test_rows_masked_by_the_bias_come_out_as_zeros(golden):
    y = golden.read_step("boundaries.r4-bias-masks-whole-rows", 0).outputs["Y"]
    assert not y[:, 0].any() and not y[:, 1, 0].any()
    assert y[:, 1, 1].any(axis=-1).all()
