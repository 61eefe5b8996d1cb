"""Factory-time checks, seed-test twins, geometry and the reference kernel's recorded answers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from reference_corpus import REFERENCE_DIR as REFERENCE
from reference_corpus import case_files, expected_error, step_inputs, step_prefixes
from contract_steps import (
    PREFIX,
    UNSUPPORTED,
    assert_invalid,
    assert_unsupported,
    ratio4_step,
    ratio128_step,
    rejection,
)

from csa_conform.contract import (
    INPUT_NAMES,
    OUTPUT_NAMES,
    attention_bias,
    claim_metadata,
    rust_display_f32,
    stored_record_width,
    unsupported_reason,
    validate_step,
)
from csa_conform.errors import ContractError

POSITIVE_INDEX_ATTRIBUTES = (
    "ratio-4 requires positive index_num_heads, index_head_dim, and index_topk"
)


def test_canonical_names():
    assert len(INPUT_NAMES) == 20 and INPUT_NAMES[0] == "query"
    assert INPUT_NAMES[10:12] == ("head_sink", "index_query")
    assert INPUT_NAMES[19] == "attention_bias"
    assert OUTPUT_NAMES[:3] == ("Y", "present_compressed_kv", "present_compression_carry")
    assert OUTPUT_NAMES[3:] == ("present_index_key", "present_index_carry", "selected_indices")


@pytest.mark.parametrize("make", [ratio4_step, ratio128_step])
def test_minimal_steps_are_accepted(make):
    step = make()
    geometry = validate_step(step.attrs, step.inputs, step.output_names)
    assert geometry.output_names == tuple(step.output_names)


# --- seed-test twins ----------------------------------------------------------------------


def test_sink_mode_error_distinguishes_learned_logit_sink_from_sink_tokens():
    step = ratio128_step()
    step.attrs["sink_mode"] = "sink_tokens"
    message = str(rejection(step))
    assert "learned per-head logit input `head_sink`" in message
    assert "Metadata `sink_tokens`" in message
    assert "retained prefix tokens" in message
    assert "unrelated" in message
    assert_unsupported(
        step,
        "sink_mode='sink_tokens' is unsupported for the learned per-head logit input "
        "`head_sink`; v1 requires 'logit_only'. Metadata `sink_tokens` configures retained "
        "prefix tokens and is unrelated",
    )


def test_stateful_claim_gate_rejects_ratio_specific_arity():
    ratio4 = ratio4_step(outputs=5)
    for name in INPUT_NAMES[11:19]:
        del ratio4.inputs[name]
    assert_invalid(ratio4, "ratio-4 requires all eight positional index inputs (11..=18)")

    ratio128_outputs = ratio128_step()
    ratio128_outputs.output_names = list(OUTPUT_NAMES[:4])
    assert_unsupported(ratio128_outputs, "ratio-128 supports exactly 3 outputs, got 4")

    ratio128_index_input = ratio128_step()
    ratio128_index_input.inputs["index_query"] = np.zeros((1, 4, 1, 128), np.float32)
    assert_unsupported(
        ratio128_index_input,
        "ratio-4-only inputs (11..=18) are not supported by the "
        "ratio-128 stateful path",
    )


def test_attention_bias_rejects_unsupported_dtype_rank_and_broadcast():
    with pytest.raises(ContractError) as caught:
        attention_bias(np.array([True]), (1, 1, 1, 1))
    assert (str(caught.value), caught.value.kind) == (
        UNSUPPORTED + "boolean attention_bias semantics are deferred; use additive f32 bias",
        "unsupported",
    )
    with pytest.raises(ContractError) as caught:
        attention_bias(np.zeros((1, 1, 1, 1, 1), np.float32), (1, 1, 1, 1))
    assert str(caught.value) == PREFIX + "attention_bias rank must be <= 4, got [1, 1, 1, 1, 1]"
    with pytest.raises(ContractError) as caught:
        attention_bias(np.zeros((2, 2), np.float32), (1, 1, 1, 2))
    assert str(caught.value) == (
        PREFIX + "attention_bias shape [2, 2] is not broadcastable to [1, 1, 1, 2]"
    )
    assert caught.value.kind == "invalid"


def test_packed_cache_formats_reject_invalid_block_widths():
    with pytest.raises(ContractError) as caught:
        stored_record_width("fp8_e4m3_block64", 65, 0)
    assert str(caught.value) == (
        PREFIX + "non-RoPE head dimension 65 must be divisible by FP8 block size 64"
    )
    with pytest.raises(ContractError) as caught:
        stored_record_width("fp4_e2m1_block32", 33, 0)
    assert str(caught.value) == PREFIX + "head_dim 33 must be divisible by FP4 block size 32"
    with pytest.raises(ContractError) as caught:
        stored_record_width("fp8_e4m3_block64", 64, 65)
    assert str(caught.value) == PREFIX + "qk_rope_head_dim 65 exceeds head_dim 64"
    assert stored_record_width("fp8_e4m3_block64", 512, 64) == 583
    assert stored_record_width("fp4_e2m1_block32", 128, 0) == 68
    assert stored_record_width("f32", 512, 64) == 512


def test_packed_cache_formats_reject_invalid_block_widths_in_the_stateful_kernel():
    """The stateful analogue: the record geometry is frozen, so widths fail as Unsupported."""
    narrow = ratio128_step(cache_format="fp8_e4m3_block64")
    narrow.inputs["query"] = np.zeros((1, 4, 1, 520), np.float32)
    narrow.attrs["head_dim"] = 520
    assert_unsupported(
        narrow, "ratio-128 stateful compression is frozen to D=512 and RD=64, got D=520, RD=64"
    )
    short_rope = ratio4_step()
    short_rope.attrs["qk_rope_head_dim"] = 32
    assert_unsupported(
        short_rope, "ratio-4 stateful compression is frozen to D=512 and RD=64, got D=512, RD=32"
    )
    fp4_cache = ratio128_step()
    fp4_cache.attrs["cache_format"] = "fp4_e2m1_block32"
    assert_unsupported(
        fp4_cache, "ratio-128 attention-compressor state uses hybrid FP8/BF16 records, not FP4"
    )
    f32_ratio4 = ratio4_step()
    f32_ratio4.attrs["cache_format"] = "f32"
    assert_unsupported(
        f32_ratio4,
        "ratio-4 attention records require hybrid FP8/BF16 cache_format='fp8_e4m3_block64'; "
        "the index-key stream is independently fixed to FP4 E2M1 block-32",
    )


def test_public_v1_rejects_phase1_reference_arity():
    step = ratio128_step()
    step.attrs.update(num_heads=2, head_dim=2)
    step.inputs = {name: step.inputs[name] for name in INPUT_NAMES[:4]}
    step.output_names = ["Y"]
    message = str(rejection(step))
    assert "frozen v1 requires 11..=20 positional inputs" in message
    assert message == PREFIX + "frozen v1 requires 11..=20 positional inputs, got 4"


# --- harness-level checks -------------------------------------------------------------


def test_unknown_input_name_is_a_harness_error():
    step = ratio128_step()
    step.inputs["key_cache"] = np.zeros(1, np.float32)
    message = str(rejection(step))
    assert "harness" in message and "'key_cache'" in message
    assert not message.startswith(PREFIX)


@pytest.mark.parametrize(
    "names", [["Y", "present_compression_carry", "present_compressed_kv"], ["Y", "Z", "W"]]
)
def test_output_names_out_of_order_are_a_harness_error(names):
    step = ratio128_step()
    step.output_names = names
    message = str(rejection(step))
    assert "harness" in message and "prefix" in message


def test_input_named_with_none_is_omitted():
    step = ratio128_step()
    step.inputs["attention_bias"] = None
    assert not validate_step(step.attrs, step.inputs, step.output_names).has_bias


# --- node schema --------------------------------------------------------------------------


@pytest.mark.parametrize("make", [ratio4_step, ratio128_step])
def test_output_count_below_three(make):
    step = make()
    step.output_names = ["Y", "present_compressed_kv"]
    assert_invalid(step, "frozen v1 requires 3..=6 outputs, got 2")


@pytest.mark.parametrize("make", [ratio4_step, ratio128_step])
def test_required_input_omitted(make):
    step = make()
    del step.inputs["past_compressed_kv"]
    assert_invalid(step, "required frozen-v1 input 6 ('past_compressed_kv') is omitted")


def test_ratio4_with_three_outputs():
    step = ratio4_step(outputs=3)
    assert_invalid(step, "ratio-4 requires 5 or 6 outputs, got 3")


def test_ratio4_with_one_index_input_omitted():
    step = ratio4_step()
    del step.inputs["index_compressor_ape"]
    assert_invalid(step, "ratio-4 requires all eight positional index inputs (11..=18)")


def test_schema_is_checked_before_attributes():
    step = ratio128_step()
    del step.inputs["seqlens_k"]
    step.attrs.pop("num_heads")
    assert_invalid(step, "required frozen-v1 input 8 ('seqlens_k') is omitted")


def test_positional_inputs_end_at_the_highest_present_one():
    """An omitted trailing input shortens the node, as an ONNX node without it would be."""
    step = ratio128_step()
    del step.inputs["head_sink"]
    assert_invalid(step, "frozen v1 requires 11..=20 positional inputs, got 10")
    step.inputs["attention_bias"] = np.zeros((1,), np.float32)
    assert_invalid(step, "required frozen-v1 input 10 ('head_sink') is omitted")


# --- attributes ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["num_heads", "head_dim", "compression_ratio"])
@pytest.mark.parametrize("value", [None, 512.0, "512", True])
def test_required_integer_attribute_missing_or_mistyped(name, value):
    step = ratio128_step()
    if value is None:
        del step.attrs[name]
    else:
        step.attrs[name] = value
    assert_invalid(step, f"missing required integer attribute {name}")


@pytest.mark.parametrize("name", ["num_heads", "head_dim", "compression_ratio"])
@pytest.mark.parametrize("value", [0, -3])
def test_required_integer_attribute_not_positive(name, value):
    step = ratio4_step()
    step.attrs[name] = value
    assert_invalid(step, f"{name} must be positive, got {value}")


@pytest.mark.parametrize(
    "name", ["qk_rope_head_dim", "index_num_heads", "index_head_dim", "index_topk"]
)
def test_optional_integer_attribute_mistyped_or_negative(name):
    step = ratio4_step()
    step.attrs[name] = 1.5
    assert_invalid(step, f"attribute {name} must be an integer")
    step.attrs[name] = -2
    assert_invalid(step, f"{name} must be non-negative, got -2")


def test_rope_dim_defaults_to_zero_and_may_not_exceed_head_dim():
    step = ratio128_step()
    step.attrs["qk_rope_head_dim"] = 600
    assert_invalid(step, "qk_rope_head_dim 600 exceeds head_dim 512")
    del step.attrs["qk_rope_head_dim"]
    assert_unsupported(
        step, "ratio-128 stateful compression is frozen to D=512 and RD=64, got D=512, RD=0"
    )


@pytest.mark.parametrize("ratio", [1, 8, 64, 256])
def test_compression_ratio_must_be_4_or_128(ratio):
    step = ratio128_step()
    step.attrs["compression_ratio"] = ratio
    assert_invalid(step, f"compression_ratio must be exactly 4 or 128, got {ratio}")


@pytest.mark.parametrize("name", ["index_num_heads", "index_head_dim", "index_topk"])
def test_ratio4_index_attributes_must_be_positive(name):
    step = ratio4_step()
    step.attrs[name] = 0
    assert_invalid(step, POSITIVE_INDEX_ATTRIBUTES)
    del step.attrs[name]
    assert_invalid(step, POSITIVE_INDEX_ATTRIBUTES)


@pytest.mark.parametrize("name", ["index_num_heads", "index_head_dim", "index_topk"])
def test_ratio128_index_attributes_must_be_zero(name):
    step = ratio128_step()
    step.attrs[name] = 1
    assert_invalid(step, "ratio-128 requires index_num_heads=index_head_dim=index_topk=0")
    step.attrs[name] = 0
    validate_step(step.attrs, step.inputs, step.output_names)


@pytest.mark.parametrize("name", ["causal", "cache_layout_version", "index_layout_version"])
def test_fixed_integer_attributes(name):
    step = ratio4_step()
    step.attrs[name] = 2
    assert_invalid(step, f"{name} must be 1, got 2")
    step.attrs[name] = "1"
    assert_invalid(step, f"attribute {name} must be an integer")
    del step.attrs[name]
    validate_step(step.attrs, step.inputs, step.output_names)


def test_causal_zero_is_rejected():
    step = ratio128_step()
    step.attrs["causal"] = 0
    assert_invalid(step, "causal must be 1, got 0")


@pytest.mark.parametrize("name", ["sink_mode", "cache_format"])
def test_string_attributes_must_be_strings(name):
    step = ratio128_step()
    step.attrs[name] = 1
    assert_invalid(step, f"attribute {name} must be a UTF-8 string")


def test_sink_mode_logit_only_is_the_default():
    step = ratio4_step()
    step.attrs["sink_mode"] = "logit_only"
    validate_step(step.attrs, step.inputs, step.output_names)
    step.attrs["sink_mode"] = "none"
    assert_unsupported(
        step,
        "sink_mode='none' is unsupported for the learned per-head logit input `head_sink`; "
        "v1 requires 'logit_only'. Metadata `sink_tokens` configures retained prefix tokens "
        "and is unrelated",
    )


def test_unknown_cache_format():
    step = ratio4_step()
    step.attrs["cache_format"] = "bf16"
    assert_unsupported(
        step,
        "cache_format='bf16' is unsupported; expected f32, fp8_e4m3_block64, or fp4_e2m1_block32",
    )


def test_cache_format_defaults_to_f32():
    step = ratio128_step()
    del step.attrs["cache_format"]
    assert validate_step(step.attrs, step.inputs, step.output_names).cache_format == "f32"


@pytest.mark.parametrize("scale", [-0.5, float("nan"), float("inf"), 1e39])
def test_scale_must_be_finite_and_non_negative(scale):
    step = ratio4_step()
    step.attrs["scale"] = scale
    assert_invalid(step, "scale must be finite and non-negative")


def test_attribute_order_follows_the_factory():
    step = ratio4_step()
    step.attrs.update(scale=-1.0, cache_format="bad", sink_mode="x", causal=0, index_topk=0)
    assert_invalid(step, POSITIVE_INDEX_ATTRIBUTES)
    step.attrs["index_topk"] = 2
    assert_invalid(step, "causal must be 1, got 0")
    step.attrs["causal"] = 1
    assert rejection(step).kind == "unsupported" and "sink_mode='x'" in str(rejection(step))
    step.attrs["sink_mode"] = "logit_only"
    assert "cache_format='bad'" in str(rejection(step))
    step.attrs["cache_format"] = "fp8_e4m3_block64"
    assert_invalid(step, "scale must be finite and non-negative")


# --- geometry -----------------------------------------------------------------------------


def _bits(value) -> int:
    return int(np.asarray(value, np.float32).view(np.uint32))


def test_default_scale_is_f32_reciprocal_square_root():
    step = ratio128_step()
    assert _bits(validate_step(step.attrs, step.inputs, step.output_names).scale) == 0x3D3504F3
    step.attrs["scale"] = 0.3
    assert _bits(validate_step(step.attrs, step.inputs, step.output_names).scale) == 0x3E99999A
    step.attrs["scale"] = 0.0
    assert _bits(validate_step(step.attrs, step.inputs, step.output_names).scale) == 0x3D3504F3


def test_integer_scale_reads_as_absent():
    """The reference reads ``scale`` with ``as_float``: an integer attribute is ignored."""
    step = ratio128_step()
    step.attrs["scale"] = 2
    assert _bits(validate_step(step.attrs, step.inputs, step.output_names).scale) == 0x3D3504F3


def test_ratio128_prefill_geometry():
    step = ratio128_step(batch=2, sequence=4, total=4, heads=3, cache_format="fp8_e4m3_block64")
    g = validate_step(step.attrs, step.inputs, step.output_names)
    assert (g.ratio, g.batch, g.sequence, g.heads, g.dim, g.rope_dim) == (128, 2, 4, 3, 512, 64)
    assert (g.total, g.start, g.past_records, g.next_records, g.emitted) == (4, 0, 0, 0, 0)
    assert (g.current_kv_len, g.current_kv_base, g.dense_candidates, g.candidate_count) == (
        4, 0, 4, 4,
    )
    assert (g.stored_width, g.carry_slots, g.compressor_width) == (583, 128, 512)
    assert (g.index_heads, g.index_dim, g.index_topk, g.topk_width) == (0, 0, 0, 0)
    assert (g.index_stored_width, g.index_compressor_width) == (0, 0)
    assert g.cache_format == "fp8_e4m3_block64" and not g.has_bias


def test_ratio128_decode_geometry():
    step = ratio128_step(sequence=1, total=257, kv_len=130)
    g = validate_step(step.attrs, step.inputs, step.output_names)
    assert (g.start, g.past_records, g.next_records, g.emitted) == (256, 2, 2, 0)
    assert (g.current_kv_base, g.dense_candidates, g.candidate_count) == (127, 128, 130)
    assert (g.stored_width, g.cache_format) == (512, "f32")


def test_ratio4_geometry():
    step = ratio4_step(batch=2, sequence=3, total=11, heads=2, index_heads=3, index_topk=5)
    step.inputs["attention_bias"] = np.zeros((1,), np.float32)
    g = validate_step(step.attrs, step.inputs, step.output_names)
    assert (g.start, g.past_records, g.next_records, g.emitted) == (8, 2, 2, 0)
    assert (g.topk_width, g.dense_candidates, g.candidate_count) == (2, 128, 130)
    assert (g.index_heads, g.index_dim, g.index_topk) == (3, 128, 5)
    assert (g.stored_width, g.index_stored_width) == (583, 68)
    assert (g.carry_slots, g.compressor_width, g.index_compressor_width) == (8, 1024, 256)
    assert g.has_bias


def test_ratio4_prefill_dense_candidates_follow_current_kv():
    step = ratio4_step(sequence=8, total=8, index_topk=1)
    g = validate_step(step.attrs, step.inputs, step.output_names)
    assert (g.next_records, g.topk_width, g.dense_candidates, g.candidate_count) == (2, 1, 8, 9)


def test_geometry_is_frozen():
    step = ratio4_step()
    g = validate_step(step.attrs, step.inputs, step.output_names)
    with pytest.raises(AttributeError):
        g.start = 1


# --- attention bias -----------------------------------------------------------------------


def test_attention_bias_broadcasts_from_the_left():
    bias = np.arange(6, dtype=np.float32).reshape(2, 3)
    view = attention_bias(bias, (2, 4, 2, 3))
    assert view.shape == (2, 4, 2, 3) and view.dtype == np.float32
    assert np.array_equal(view[1, 3], bias)
    assert attention_bias(np.float32(5.0), (1, 2, 3, 4)).shape == (1, 2, 3, 4)


def test_attention_bias_rejects_other_dtypes():
    with pytest.raises(ContractError) as caught:
        attention_bias(np.zeros((2,), np.float64), (1, 1, 1, 2))
    assert (str(caught.value), caught.value.kind) == (
        PREFIX + "attention_bias must have dtype Float32, got Float64",
        "invalid",
    )


def test_attention_bias_axis_must_match_or_be_one():
    with pytest.raises(ContractError) as caught:
        attention_bias(np.zeros((3, 1, 1), np.float32), (1, 2, 3, 10))
    assert str(caught.value) == (
        PREFIX + "attention_bias shape [3, 1, 1] is not broadcastable to [1, 2, 3, 10]"
    )


# --- Rust formatting ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, text",
    [
        (np.nan, "NaN"),
        (-np.nan, "NaN"),
        (np.inf, "inf"),
        (-np.inf, "-inf"),
        (0.0, "0"),
        (-0.0, "-0"),
        (1.0, "1"),
        (0.1, "0.1"),
        (-2.5, "-2.5"),
        (123456789.0, "123456790"),
        (1e20, "100000000000000000000"),
        (1e-45, "0.000000000000000000000000000000000000000000001"),
        (3.4028235e38, "340282350000000000000000000000000000000"),
    ],
)
def test_rust_display_f32(value, text):
    assert rust_display_f32(value) == text


# --- the reference kernel's recorded answers ----------------------------------------------


def _reference_steps():
    for name in case_files():
        archive = np.load(REFERENCE / name)
        for prefix in step_prefixes(archive):
            yield pytest.param(REFERENCE / name, prefix, id=f"{name[:-4]}:{prefix or 'single'}")


def _claim(archive, prefix: str) -> str | None:
    claim = str(archive[prefix + "claim"]).removeprefix("kernel execution failed: ")
    return claim or None


VALIDATION_PASSES_THEN_COMPUTATION_FAILS = {"err_r4_topk_tie_zero_weights"}


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="reference npz files not available")
@pytest.mark.parametrize("path, prefix", list(_reference_steps()))
def test_reference_kernel_decisions(path, prefix):
    archive = np.load(path)
    attrs = json.loads(str(archive["attrs_json"]))
    output_names = json.loads(str(archive["output_names_json"]))
    inputs = step_inputs(archive, prefix)
    shapes, dtypes = claim_metadata(inputs)
    assert unsupported_reason(attrs, shapes, dtypes, output_names) == _claim(archive, prefix)
    expected = expected_error(archive, prefix)
    if expected is None or path.stem in VALIDATION_PASSES_THEN_COMPUTATION_FAILS:
        validate_step(attrs, inputs, output_names)
        return
    with pytest.raises(ContractError) as caught:
        validate_step(attrs, inputs, output_names)
    assert str(caught.value) == expected
    assert caught.value.kind == ("unsupported" if "Unsupported: " in expected else "invalid")
