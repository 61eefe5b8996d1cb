"""Execute-time checks of both ratios: dtypes, shapes, cursors, finiteness and carries."""

from __future__ import annotations

import numpy as np
import pytest
from contract_steps import assert_invalid, assert_unsupported, ratio4_step, ratio128_step

from csa_conform.contract import INPUT_NAMES, validate_step

RATIO4_FLOAT_INPUTS = [
    INPUT_NAMES[i] for i in (0, 1, 2, 3, 4, 5, 7, 10, 11, 12, 13, 14, 15, 16, 18)
]
RATIO128_FLOAT_INPUTS = [INPUT_NAMES[i] for i in (0, 1, 2, 3, 4, 5, 7, 10)]
RATIO4_FINITE_INPUTS = [INPUT_NAMES[i] for i in (0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15, 16)]
RATIO128_FINITE_INPUTS = [INPUT_NAMES[i] for i in (0, 1, 2, 3, 4, 5, 10)]


def _accepts(step) -> None:
    validate_step(step.attrs, step.inputs, step.output_names)


def _shape(shape) -> str:
    return "[" + ", ".join(str(extent) for extent in shape) + "]"


# --- dtypes -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", RATIO4_FLOAT_INPUTS)
def test_ratio4_float_input_dtype(name):
    step = ratio4_step()
    step.inputs[name] = step.inputs[name].astype(np.float64)
    assert_invalid(step, f"{name} must have dtype Float32, got Float64")


@pytest.mark.parametrize("name", RATIO128_FLOAT_INPUTS)
def test_ratio128_float_input_dtype(name):
    step = ratio128_step()
    step.inputs[name] = step.inputs[name].astype(np.float16)
    assert_invalid(step, f"{name} must have dtype Float32, got Float16")


@pytest.mark.parametrize(
    "name, dtype, expected, got",
    [
        ("past_compressed_kv", np.int8, "Uint8", "Int8"),
        ("past_index_key", np.float32, "Uint8", "Float32"),
        ("seqlens_k", np.int64, "Int32", "Int64"),
        ("total_sequence_length", np.int32, "Int64", "Int32"),
        ("total_sequence_length", np.uint64, "Int64", "Uint64"),
    ],
)
def test_ratio4_integer_and_byte_dtypes(name, dtype, expected, got):
    step = ratio4_step()
    step.inputs[name] = step.inputs[name].astype(dtype)
    assert_invalid(step, f"{name} must have dtype {expected}, got {got}")


@pytest.mark.parametrize(
    "cache_format, cache_dtype, expected, got",
    [
        ("f32", np.uint8, "Float32", "Uint8"),
        ("fp8_e4m3_block64", np.float32, "Uint8", "Float32"),
        ("fp8_e4m3_block64", np.bool_, "Uint8", "Bool"),
    ],
)
def test_ratio128_cache_dtype_follows_cache_format(cache_format, cache_dtype, expected, got):
    step = ratio128_step(cache_format=cache_format)
    step.inputs["past_compressed_kv"] = step.inputs["past_compressed_kv"].astype(cache_dtype)
    assert_invalid(step, f"past_compressed_kv must have dtype {expected}, got {got}")


@pytest.mark.parametrize(
    "name, dtype, expected, got",
    [
        ("seqlens_k", np.uint32, "Int32", "Uint32"),
        ("total_sequence_length", np.float64, "Int64", "Float64"),
    ],
)
def test_ratio128_cursor_dtypes(name, dtype, expected, got):
    step = ratio128_step()
    step.inputs[name] = step.inputs[name].astype(dtype)
    assert_invalid(step, f"{name} must have dtype {expected}, got {got}")


def test_dtype_checks_precede_shape_checks():
    step = ratio4_step()
    step.inputs["query"] = np.zeros((1, 4, 512), np.float32)
    step.inputs["total_sequence_length"] = np.array(4, np.int16)
    assert_invalid(step, "total_sequence_length must have dtype Int64, got Int16")


# --- query --------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [ratio4_step, ratio128_step])
def test_query_rank(make):
    step = make()
    step.inputs["query"] = np.zeros((1, 4, 512), np.float32)
    assert_invalid(step, "query must be rank 4, got shape [1, 4, 512]")


@pytest.mark.parametrize("make, ratio", [(ratio4_step, 4), (ratio128_step, 128)])
def test_query_width_is_frozen(make, ratio):
    step = make()
    step.inputs["query"] = np.zeros((1, 4, 1, 256), np.float32)
    assert_unsupported(
        step, f"ratio-{ratio} stateful compression is frozen to D=512 and RD=64, got D=256, RD=64"
    )


def test_ratio4_index_head_dim_is_frozen():
    step = ratio4_step()
    step.attrs["index_head_dim"] = 64
    assert_unsupported(step, "ratio-4 index compression is frozen to ID=128, got 64")


def test_ratio4_query_heads_and_head_dim():
    step = ratio4_step()
    step.inputs["query"] = np.zeros((1, 4, 2, 512), np.float32)
    assert_invalid(
        step, "query must be non-empty and end in [num_heads=1, head_dim=512], got [1, 4, 2, 512]"
    )
    step = ratio4_step()
    step.attrs["head_dim"] = 576
    assert_invalid(
        step, "query must be non-empty and end in [num_heads=1, head_dim=576], got [1, 4, 1, 512]"
    )


def test_ratio4_empty_query_sequence():
    step = ratio4_step()
    step.inputs["query"] = np.zeros((1, 0, 1, 512), np.float32)
    assert_invalid(
        step, "query must be non-empty and end in [num_heads=1, head_dim=512], got [1, 0, 1, 512]"
    )


def test_ratio128_query_heads_and_head_dim():
    step = ratio128_step(heads=2)
    step.attrs["num_heads"] = 3
    assert_invalid(step, "query must end in [num_heads=3, head_dim=512], got [2, 512]")


def test_ratio128_empty_query_sequence():
    step = ratio128_step()
    step.inputs["query"] = np.zeros((1, 0, 1, 512), np.float32)
    assert_invalid(step, "query sequence length must be positive")


# --- ratio 4 tensor shapes ----------------------------------------------------------------


def test_ratio4_current_kv_rank_and_shape():
    step = ratio4_step()
    step.inputs["current_kv"] = np.zeros((4, 512), np.float32)
    assert_invalid(step, "current_kv must be rank 3, got shape [4, 512]")
    step.inputs["current_kv"] = np.zeros((2, 4, 512), np.float32)
    assert_invalid(step, "current_kv must have shape [B,K,D] with B=1, D=512, got [2, 4, 512]")
    step.inputs["current_kv"] = np.zeros((1, 4, 511), np.float32)
    assert_invalid(step, "current_kv must have shape [B,K,D] with B=1, D=512, got [1, 4, 511]")


@pytest.mark.parametrize(
    "name, width",
    [
        ("compressor_kv", 1024),
        ("compressor_gate", 1024),
        ("index_compressor_kv", 256),
        ("index_compressor_gate", 256),
    ],
)
def test_ratio4_compressor_sources(name, width):
    step = ratio4_step()
    step.inputs[name] = np.zeros((1, 4, 1, width), np.float32)
    assert_invalid(step, f"{name} must be rank 3, got shape [1, 4, 1, {width}]")
    step.inputs[name] = np.zeros((1, 4, 512), np.float32)
    assert_invalid(step, f"{name} must have shape [1, 4, {width}], got [1, 4, 512]")
    step.inputs[name] = np.zeros((1, 3, width), np.float32)
    assert_invalid(step, f"{name} must have shape [1, 4, {width}], got [1, 3, {width}]")


@pytest.mark.parametrize(
    "name, bad",
    [
        ("compressor_ape", (128, 1024)),
        ("compressor_norm", (1024,)),
        ("past_compression_carry", (1, 128, 2, 1024)),
        ("index_query", (1, 4, 2, 128)),
        ("index_weight", (1, 4)),
        ("index_compressor_ape", (4, 128)),
        ("index_compressor_norm", (64,)),
        ("past_index_carry", (1, 8, 2, 512)),
    ],
)
def test_ratio4_state_shape_mismatch(name, bad):
    step = ratio4_step()
    step.inputs[name] = np.zeros(bad, np.float32)
    shapes = {key: _shape(step.inputs[key].shape) for key in step.inputs}
    assert_invalid(
        step,
        f"ratio-4 compressor/index tensor shape mismatch: ape={shapes['compressor_ape']}, "
        f"norm={shapes['compressor_norm']}, carry={shapes['past_compression_carry']}, "
        f"index_query={shapes['index_query']}, index_weight={shapes['index_weight']}, "
        f"index_ape={shapes['index_compressor_ape']}, "
        f"index_norm={shapes['index_compressor_norm']}, "
        f"index_carry={shapes['past_index_carry']}",
    )


def test_ratio4_cursor_input_shapes():
    step = ratio4_step()
    step.inputs["seqlens_k"] = np.full((2,), 3, np.int32)
    assert_invalid(step, "seqlens_k must be [1] and total_sequence_length scalar, got [2] and []")
    step = ratio4_step()
    step.inputs["total_sequence_length"] = np.array([4], np.int64)
    assert_invalid(step, "seqlens_k must be [1] and total_sequence_length scalar, got [1] and [1]")


@pytest.mark.parametrize("make", [ratio4_step, ratio128_step])
def test_head_sink_shape(make):
    step = make(heads=2)
    step.inputs["head_sink"] = np.zeros((1, 2), np.float32)
    assert_invalid(step, "head_sink must have shape [2], got [1, 2]")


# --- ratio 128 tensor shapes --------------------------------------------------------------


@pytest.mark.parametrize("name", ["current_kv", "compressor_kv", "compressor_gate"])
def test_ratio128_source_ranks(name):
    step = ratio128_step()
    step.inputs[name] = np.zeros((4, 512), np.float32)
    assert_invalid(step, f"{name} must be rank 3, got shape [4, 512]")


@pytest.mark.parametrize(
    "name, bad",
    [
        ("current_kv", (2, 4, 512)),
        ("current_kv", (1, 4, 64)),
        ("compressor_kv", (1, 3, 512)),
        ("compressor_gate", (1, 4, 1024)),
    ],
)
def test_ratio128_sources_shape_mismatch(name, bad):
    step = ratio128_step()
    step.inputs[name] = np.zeros(bad, np.float32)
    names = ("current_kv", "compressor_kv", "compressor_gate")
    shapes = [_shape(step.inputs[name].shape) for name in names]
    assert_invalid(
        step,
        "current/compressor tensors must have current_kv=[B,K,D] and compressor_kv/gate=[B,S,D]; "
        "got {}, {}, {}".format(*shapes),
    )


@pytest.mark.parametrize(
    "name, bad, message",
    [
        ("compressor_ape", (4, 512), "compressor_ape must have shape [128, 512], got [4, 512]"),
        ("compressor_norm", (64,), "compressor_norm must have shape [512], got [64]"),
        (
            INPUT_NAMES[7],
            (1, 8, 2, 512),
            "past_compression_carry must have shape [B,128,2,D]=[1,128,2,512], got [1, 8, 2, 512]",
        ),
    ],
)
def test_ratio128_state_shapes(name, bad, message):
    step = ratio128_step()
    step.inputs[name] = np.zeros(bad, np.float32)
    assert_invalid(step, message)


def test_ratio128_cursor_input_shapes():
    step = ratio128_step()
    step.inputs["seqlens_k"] = np.array(3, np.int32)
    assert_invalid(step, "seqlens_k must have shape [1], got []")
    step = ratio128_step()
    step.inputs["total_sequence_length"] = np.array([4], np.int64)
    assert_invalid(step, "total_sequence_length must be a scalar, got [1]")


# --- cursors ------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [ratio4_step, ratio128_step])
def test_negative_total(make):
    step = make()
    step.inputs["total_sequence_length"] = np.array(-1, np.int64)
    assert_invalid(step, "total_sequence_length must be non-negative and <= isize::MAX, got -1")


@pytest.mark.parametrize("make", [ratio4_step, ratio128_step])
def test_negative_row_length(make):
    step = make()
    step.inputs["seqlens_k"] = np.array([-5], np.int32)
    assert_invalid(step, "seqlens_k[0] + 1 must be non-negative and <= isize::MAX, got -4")


def test_seqlens_are_widened_before_adding_one():
    step = ratio128_step()
    step.inputs["seqlens_k"] = np.array([np.iinfo(np.int32).max], np.int32)
    assert_invalid(
        step,
        "v1 requires equal-length rows and total_sequence_length == seqlens_k[b] + 1; "
        "row 0 gives 2147483648, total is 4",
    )


def test_ratio4_row_total_mismatch():
    step = ratio4_step(batch=2)
    step.inputs["seqlens_k"] = np.array([3, 4], np.int32)
    assert_invalid(
        step, "v1 requires total_sequence_length == seqlens_k[b] + 1; row 1 gives 5, total is 4"
    )


def test_ratio128_row_total_mismatch():
    step = ratio128_step(batch=3)
    step.inputs["seqlens_k"] = np.array([3, 3, 2], np.int32)
    assert_invalid(
        step,
        "v1 requires equal-length rows and total_sequence_length == seqlens_k[b] + 1; "
        "row 2 gives 3, total is 4",
    )


@pytest.mark.parametrize("make", [ratio4_step, ratio128_step])
def test_total_shorter_than_query(make):
    step = make(sequence=4, total=3, kv_len=3)
    assert_invalid(step, "total_sequence_length is shorter than the current query sequence")


@pytest.mark.parametrize("make", [ratio4_step, ratio128_step])
def test_current_kv_longer_than_total(make):
    step = make(kv_len=5)
    assert_invalid(step, "current_kv length exceeds total_sequence_length")


def test_ratio4_current_kv_too_short():
    step = ratio4_step(sequence=1, total=200, kv_len=127)
    assert_invalid(
        step, "current_kv starts at 73, but the earliest query needs dense-window position 72"
    )
    _accepts(ratio4_step(sequence=1, total=200, kv_len=128))


def test_ratio128_current_kv_too_short():
    step = ratio128_step(kv_len=3)
    assert_invalid(
        step,
        "current_kv starts at absolute position 1, but the earliest query needs dense-window "
        "position 0",
    )


def test_current_kv_must_reach_the_dense_window_start():
    step = ratio128_step(sequence=1, total=129, kv_len=128)
    _accepts(step)
    step = ratio128_step(sequence=1, total=129, kv_len=127)
    assert_invalid(
        step,
        "current_kv starts at absolute position 2, but the earliest query needs dense-window "
        "position 1",
    )


# --- past caches --------------------------------------------------------------------------


def test_ratio4_past_cache_shapes():
    step = ratio4_step(sequence=1, total=9)
    _accepts(step)
    step.inputs["past_compressed_kv"] = np.zeros((1, 1, 583), np.uint8)
    assert_invalid(
        step,
        "ratio-4 past cache shapes must be [1,2,583] and [1,2,68], got [1, 1, 583] and [1, 2, 68]",
    )
    step = ratio4_step(sequence=1, total=9)
    step.inputs["past_index_key"] = np.zeros((1, 2, 583), np.uint8)
    assert_invalid(
        step,
        "ratio-4 past cache shapes must be [1,2,583] and [1,2,68], got [1, 2, 583] and [1, 2, 583]",
    )


def test_ratio4_past_cache_ranks():
    step = ratio4_step()
    step.inputs["past_compressed_kv"] = np.zeros((1, 0), np.uint8)
    assert_invalid(step, "past_compressed_kv must be rank 3, got shape [1, 0]")
    step = ratio4_step()
    step.inputs["past_index_key"] = np.zeros((1, 0, 4, 17), np.uint8)
    assert_invalid(step, "past_index_key must be rank 3, got shape [1, 0, 4, 17]")


def test_ratio4_past_index_key_rank_is_not_checked_after_a_cache_mismatch():
    step = ratio4_step()
    step.inputs["past_compressed_kv"] = np.zeros((1, 1, 583), np.uint8)
    step.inputs["past_index_key"] = np.zeros((1,), np.uint8)
    assert_invalid(
        step,
        "ratio-4 past cache shapes must be [1,0,583] and [1,0,68], got [1, 1, 583] and [1]",
    )


@pytest.mark.parametrize("cache_format, width", [("f32", 512), ("fp8_e4m3_block64", 583)])
def test_ratio128_past_cache_shape(cache_format, width):
    step = ratio128_step(sequence=2, total=300, kv_len=200, cache_format=cache_format)
    _accepts(step)
    dtype = step.inputs["past_compressed_kv"].dtype
    step.inputs["past_compressed_kv"] = np.zeros((1, 1, width), dtype)
    assert_invalid(
        step,
        f"past_compressed_kv must have shape [1,2,{width}] at start position 298, "
        f"got [1, 1, {width}]",
    )
    step.inputs["past_compressed_kv"] = np.zeros((2, width), dtype)
    assert_invalid(step, f"past_compressed_kv must be rank 3, got shape [2, {width}]")


# --- finiteness ---------------------------------------------------------------------------


@pytest.mark.parametrize("value, text", [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "-inf")])
@pytest.mark.parametrize("name", RATIO4_FINITE_INPUTS)
def test_ratio4_inputs_must_be_finite(name, value, text):
    step = ratio4_step()
    array = step.inputs[name].copy()
    flat = array.reshape(-1)
    index = flat.size - 1
    flat[index] = value
    step.inputs[name] = array
    assert_invalid(step, f"{name}[{index}] must be finite, got {text}")


@pytest.mark.parametrize("name", RATIO128_FINITE_INPUTS)
def test_ratio128_inputs_must_be_finite(name):
    step = ratio128_step()
    array = step.inputs[name].copy()
    array.reshape(-1)[0] = -np.inf
    step.inputs[name] = array
    assert_invalid(step, f"{name}[0] must be finite, got -inf")


def test_first_non_finite_element_in_c_order_is_reported():
    step = ratio128_step()
    query = step.inputs["query"].copy()
    query[0, 3, 0, 1] = np.inf
    query[0, 2, 0, 7] = np.nan
    step.inputs["query"] = query
    assert_invalid(step, f"query[{2 * 512 + 7}] must be finite, got NaN")


def test_finiteness_follows_reference_order():
    step = ratio4_step()
    for name in ("index_weight", "head_sink"):
        array = step.inputs[name].copy()
        array.reshape(-1)[0] = np.nan
        step.inputs[name] = array
    assert_invalid(step, "head_sink[0] must be finite, got NaN")


def test_past_caches_are_not_checked_for_finiteness_here():
    step = ratio128_step(sequence=1, total=129, kv_len=128)
    step.inputs["past_compressed_kv"] = np.full((1, 1, 512), np.nan, np.float32)
    _accepts(step)


# --- carries ------------------------------------------------------------------------------


def _break_carry(step, name, index, value):
    carry = step.inputs[name].copy()
    carry[index] = value
    step.inputs[name] = carry


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_ratio128_carry_kv_must_be_finite(value):
    step = ratio128_step(batch=2)
    _break_carry(step, "past_compression_carry", (1, 5, 0, 7), value)
    assert_invalid(step, "past_compression_carry kv_state[1,5,7] must be finite")


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_ratio128_carry_score_must_be_finite_or_minus_inf(value):
    step = ratio128_step()
    _break_carry(step, "past_compression_carry", (0, 127, 1, 511), value)
    assert_invalid(step, "past_compression_carry score_state[0,127,511] must be finite or -inf")


def test_carry_reports_the_first_bad_slot_and_kv_before_score():
    step = ratio4_step()
    _break_carry(step, "past_compression_carry", (0, 3, 1, 9), np.nan)
    _break_carry(step, "past_compression_carry", (0, 3, 0, 9), np.nan)
    _break_carry(step, "past_compression_carry", (0, 4, 0, 0), np.nan)
    assert_invalid(step, "past_compression_carry kv_state[0,3,9] must be finite")
    step = ratio4_step()
    _break_carry(step, "past_compression_carry", (0, 2, 1, 1000), np.inf)
    _break_carry(step, "past_compression_carry", (0, 2, 0, 1001), np.nan)
    assert_invalid(step, "past_compression_carry score_state[0,2,1000] must be finite or -inf")


def test_ratio4_index_carry_uses_the_same_message():
    step = ratio4_step()
    _break_carry(step, "past_index_carry", (0, 7, 1, 255), np.nan)
    assert_invalid(step, "past_compression_carry score_state[0,7,255] must be finite or -inf")
    step = ratio4_step()
    _break_carry(step, "past_index_carry", (0, 0, 0, 0), np.inf)
    _break_carry(step, "past_compression_carry", (0, 7, 0, 3), np.inf)
    assert_invalid(step, "past_compression_carry kv_state[0,7,3] must be finite")


def test_finite_inputs_are_checked_before_carries():
    step = ratio4_step()
    _break_carry(step, "past_compression_carry", (0, 0, 0, 0), np.nan)
    _break_carry(step, "index_compressor_norm", (127,), np.inf)
    assert_invalid(step, "index_compressor_norm[127] must be finite, got inf")


def test_carry_with_minus_inf_scores_and_finite_values_is_accepted():
    step = ratio4_step(sequence=1, total=6)
    carry = step.inputs["past_compression_carry"].copy()
    carry[:, :, 1, :] = 3.0
    carry[0, 0, 1, 0] = -np.inf
    step.inputs["past_compression_carry"] = carry
    _accepts(step)
