"""The claim-time gate: factory errors first, then the fixed v1 geometry, then the bias."""

from __future__ import annotations

import numpy as np
import pytest
from contract_steps import PREFIX, UNSUPPORTED, ratio4_step, ratio128_step

from csa_conform.contract import INPUT_NAMES, OUTPUT_NAMES, claim_metadata, unsupported_reason


def _claim(step, shapes=None, dtypes=None, output_names="node"):
    metadata_shapes, metadata_dtypes = claim_metadata(step.inputs)
    shapes = metadata_shapes if shapes is None else shapes
    dtypes = metadata_dtypes if dtypes is None else dtypes
    names = step.output_names if output_names == "node" else output_names
    return unsupported_reason(step.attrs, shapes, dtypes, names)


def _with_shape(step, index, shape):
    shapes, _ = claim_metadata(step.inputs)
    shapes[index] = shape
    return shapes


def _with_dtype(step, index, dtype):
    _, dtypes = claim_metadata(step.inputs)
    dtypes[index] = np.dtype(dtype)
    return dtypes


@pytest.mark.parametrize("make", [ratio4_step, ratio128_step])
def test_minimal_nodes_are_claimed(make):
    assert _claim(make()) is None


def test_fp8_ratio128_node_is_claimed():
    assert _claim(ratio128_step(cache_format="fp8_e4m3_block64")) is None


def test_factory_errors_come_first_with_their_full_message():
    step = ratio4_step()
    step.attrs["sink_mode"] = "sink_tokens"
    step.attrs["index_head_dim"] = 64
    reason = _claim(step)
    assert reason.startswith(UNSUPPORTED + "sink_mode='sink_tokens' is unsupported")
    step = ratio128_step()
    assert _claim(step, output_names=OUTPUT_NAMES[:4]) == (
        UNSUPPORTED + "ratio-128 supports exactly 3 outputs, got 4"
    )
    shapes, dtypes = claim_metadata(step.inputs)
    assert unsupported_reason(step.attrs, shapes[:4], dtypes[:4], ["Y"]) == (
        PREFIX + "frozen v1 requires 11..=20 positional inputs, got 4"
    )


def test_omitted_input_is_none_in_claim_shapes():
    step = ratio4_step()
    shapes = _with_shape(step, 13, None)
    assert _claim(step, shapes=shapes) == (
        PREFIX + "ratio-4 requires all eight positional index inputs (11..=18)"
    )


def test_output_names_default_to_every_output_of_the_ratio():
    assert _claim(ratio4_step(), output_names=None) is None
    assert _claim(ratio128_step(), output_names=None) is None
    assert _claim(ratio4_step(outputs=5), output_names=OUTPUT_NAMES[:4]) == (
        PREFIX + "ratio-4 requires 5 or 6 outputs, got 4"
    )


def test_claim_metadata_must_cover_every_input():
    step = ratio128_step()
    shapes, dtypes = claim_metadata(step.inputs)
    assert unsupported_reason(step.attrs, shapes, dtypes[:10], step.output_names) == (
        PREFIX + "claim metadata must cover all 11 positional inputs (got 11 shapes and 10 dtypes)"
    )


# --- ratio 4 ------------------------------------------------------------------------------


def test_ratio4_claim_requires_index_head_dim_128():
    step = ratio4_step()
    step.attrs["index_head_dim"] = 64
    assert _claim(step) == PREFIX + "ratio-4 requires index_head_dim=128"


@pytest.mark.parametrize("cache_format", ["f32", "fp4_e2m1_block32", None])
def test_ratio4_claim_requires_fp8_cache(cache_format):
    step = ratio4_step()
    if cache_format is None:
        del step.attrs["cache_format"]
    else:
        step.attrs["cache_format"] = cache_format
    assert _claim(step) == (
        PREFIX
        + f"ratio-4 requires cache_format='fp8_e4m3_block64', got '{cache_format or 'f32'}'"
    )


@pytest.mark.parametrize("make, ratio", [(ratio4_step, 4), (ratio128_step, 128)])
def test_claim_requires_head_dim_512(make, ratio):
    step = make()
    step.attrs["head_dim"] = 256
    assert _claim(step) == PREFIX + f"ratio-{ratio} requires head_dim=512"


@pytest.mark.parametrize("make, ratio", [(ratio4_step, 4), (ratio128_step, 128)])
@pytest.mark.parametrize("rope", [32, 0, None])
def test_claim_requires_rope_dim_64(make, ratio, rope):
    step = make()
    if rope is None:
        del step.attrs["qk_rope_head_dim"]
    else:
        step.attrs["qk_rope_head_dim"] = rope
    assert _claim(step) == PREFIX + f"ratio-{ratio} requires qk_rope_head_dim=64"


NON_FLOAT_DTYPES = {6: "Uint8", 8: "Int32", 9: "Int64", 17: "Uint8"}
RATIO4_DTYPES = [(index, NON_FLOAT_DTYPES.get(index, "Float32")) for index in range(19)]


@pytest.mark.parametrize("index, expected", RATIO4_DTYPES)
def test_ratio4_claim_dtypes(index, expected):
    step = ratio4_step()
    assert _claim(step, dtypes=_with_dtype(step, index, np.float64)) == (
        PREFIX + f"input {index} ('{INPUT_NAMES[index]}') dtype Float64 unsupported; "
        f"expected {expected}"
    )


@pytest.mark.parametrize(
    "index, shape, reason",
    [
        (0, (1, 4, 512), "rank 3 unsupported; expected 4"),
        (0, (1, 0, 1, 512), "axis 1 must be nonzero"),
        (0, (1, 4, 2, 512), "axis 2 is 2; expected 1"),
        (1, (2, 4, 512), "axis 0 is 2; expected 1"),
        (2, (1, 5, 1024), "axis 1 is 5; expected 4"),
        (3, (1, 4, 512), "axis 2 is 512; expected 1024"),
        (4, (128, 1024), "axis 0 is 128; expected 4"),
        (5, (1024,), "axis 0 is 1024; expected 512"),
        (6, (1, 0, 512), "axis 2 is 512; expected 583"),
        (7, (1, 128, 2, 1024), "axis 1 is 128; expected 8"),
        (8, (2,), "axis 0 is 2; expected 1"),
        (9, (1,), "rank 1 unsupported; expected 0"),
        (10, (2,), "axis 0 is 2; expected 1"),
        (11, (1, 4, 2, 128), "axis 2 is 2; expected 1"),
        (12, (1, 4, 1, 1), "rank 4 unsupported; expected 3"),
        (13, (1, 4, 128), "axis 2 is 128; expected 256"),
        (14, (1, 3, 256), "axis 1 is 3; expected 4"),
        (15, (4, 512), "axis 1 is 512; expected 256"),
        (16, (256,), "axis 0 is 256; expected 128"),
        (17, (1, 0, 583), "axis 2 is 583; expected 68"),
        (18, (1, 8, 1, 256), "axis 2 is 1; expected 2"),
    ],
)
def test_ratio4_claim_shapes(index, shape, reason):
    step = ratio4_step()
    assert _claim(step, shapes=_with_shape(step, index, shape)) == (
        PREFIX + f"input {index} ('{INPUT_NAMES[index]}') {reason}"
    )


def test_claim_accepts_dynamic_extents():
    step = ratio4_step()
    shapes, dtypes = claim_metadata(step.inputs)
    shapes = [
        tuple(None if axis < 2 else extent for axis, extent in enumerate(shape))
        for shape in shapes
    ]
    assert unsupported_reason(step.attrs, shapes, dtypes, step.output_names) is None


def test_same_axis_rule_compares_only_static_extents():
    step = ratio4_step()
    shapes = _with_shape(step, 0, (None, 4, 1, 512))
    shapes[1] = (7, 4, 512)
    assert _claim(step, shapes=shapes) is None
    shapes[0] = (3, 4, 1, 512)
    assert _claim(step, shapes=shapes) == PREFIX + "input 1 ('current_kv') axis 0 is 7; expected 3"


# --- ratio 128 ----------------------------------------------------------------------------


def test_ratio128_claim_rejects_fp4_cache():
    step = ratio128_step()
    step.attrs["cache_format"] = "fp4_e2m1_block32"
    assert _claim(step) == (
        PREFIX
        + "ratio-128 attention-compressor state uses f32 or hybrid FP8/BF16 records, not FP4"
    )


@pytest.mark.parametrize(
    "cache_format, index, dtype, got, expected",
    [
        ("f32", 0, np.float16, "Float16", "Float32"),
        ("f32", 6, np.uint8, "Uint8", "Float32"),
        ("fp8_e4m3_block64", 6, np.float32, "Float32", "Uint8"),
        ("f32", 8, np.int64, "Int64", "Int32"),
        ("f32", 9, np.int32, "Int32", "Int64"),
        ("f32", 10, np.bool_, "Bool", "Float32"),
    ],
)
def test_ratio128_claim_dtypes(cache_format, index, dtype, got, expected):
    step = ratio128_step(cache_format=cache_format)
    assert _claim(step, dtypes=_with_dtype(step, index, dtype)) == (
        PREFIX + f"input {index} ('{INPUT_NAMES[index]}') dtype {got} unsupported; "
        f"expected {expected}"
    )


@pytest.mark.parametrize(
    "cache_format, index, shape, reason",
    [
        ("f32", 0, (1, 0, 1, 512), "axis 1 must be nonzero"),
        ("f32", 2, (1, 4, 1024), "axis 2 is 1024; expected 512"),
        ("f32", 4, (4, 512), "axis 0 is 4; expected 128"),
        ("f32", 6, (1, 0, 583), "axis 2 is 583; expected 512"),
        ("fp8_e4m3_block64", 6, (1, 0, 512), "axis 2 is 512; expected 583"),
        ("f32", 7, (1, 8, 2, 512), "axis 1 is 8; expected 128"),
        ("f32", 9, (1, 1), "rank 2 unsupported; expected 0"),
    ],
)
def test_ratio128_claim_shapes(cache_format, index, shape, reason):
    step = ratio128_step(cache_format=cache_format)
    assert _claim(step, shapes=_with_shape(step, index, shape)) == (
        PREFIX + f"input {index} ('{INPUT_NAMES[index]}') {reason}"
    )


def test_claim_checks_geometry_before_dtypes():
    step = ratio128_step()
    step.attrs["qk_rope_head_dim"] = 0
    assert _claim(step, dtypes=_with_dtype(step, 0, np.float64)) == (
        PREFIX + "ratio-128 requires qk_rope_head_dim=64"
    )


# --- attention bias -----------------------------------------------------------------------


def _with_bias(step, shape, dtype=np.float32):
    step.inputs["attention_bias"] = np.zeros((1,) * len(shape), dtype)
    return _with_shape(step, 19, shape)


@pytest.mark.parametrize("make", [ratio4_step, ratio128_step])
def test_broadcastable_bias_is_claimed(make):
    step = make(heads=2)
    assert _claim(step, shapes=_with_bias(step, (1, 2, 4, 33))) is None
    assert _claim(step, shapes=_with_bias(step, (4, 1))) is None
    assert _claim(step, shapes=_with_bias(step, ())) is None


def test_bias_dtype():
    step = ratio4_step()
    shapes = _with_bias(step, (1, 1), np.bool_)
    assert _claim(step, shapes=shapes) == (
        PREFIX + "input 19 ('attention_bias') dtype Bool unsupported; expected Float32"
    )


def test_bias_rank():
    step = ratio128_step()
    assert _claim(step, shapes=_with_bias(step, (1, 1, 1, 1, 1))) == (
        PREFIX + "input 19 ('attention_bias') rank 5 unsupported; expected rank <= 4"
    )


@pytest.mark.parametrize("shape", [(2**61, 2), (2**32, 2**32, 0)])
def test_bias_byte_count(shape):
    """Overflow is checked axis by axis, so a later zero extent does not rescue it."""
    step = ratio128_step()
    assert _claim(step, shapes=_with_bias(step, shape)) == (
        PREFIX + "input 19 ('attention_bias') byte count overflow or exceeds isize::MAX for "
        f"shape [{', '.join(str(extent) for extent in shape)}]"
    )


def test_bias_byte_count_ignores_shapes_with_dynamic_extents():
    step = ratio128_step()
    assert _claim(step, shapes=_with_bias(step, (None, 2**62))) is None


@pytest.mark.parametrize(
    "bias",
    [(3, 1, 1, 1), (1, 3, 1, 1), (2, 1, 5, 1), (5, 1)],
)
def test_bias_not_broadcastable(bias):
    step = ratio4_step(heads=2)
    dims = ", ".join(f"Static({extent})" for extent in bias)
    assert _claim(step, shapes=_with_bias(step, bias)) == (
        PREFIX + f"input 19 ('attention_bias') shape [{dims}] is not broadcastable to "
        "attention scores [Static(1), 2, Static(4), ?]"
    )


def test_bias_broadcast_against_dynamic_query_extents():
    step = ratio128_step()
    shapes = _with_bias(step, (None, 3, 1, 9))
    shapes[0] = (None, None, 1, 512)
    assert _claim(step, shapes=shapes) == (
        PREFIX + "input 19 ('attention_bias') shape [Symbolic(SymbolId(?)), Static(3), Static(1), "
        "Static(9)] is not broadcastable to attention scores "
        "[Symbolic(SymbolId(?)), 1, Symbolic(SymbolId(?)), ?]"
    )
    shapes[19] = (5, 1, 7, 9)
    assert _claim(step, shapes=shapes) is None
