"""Value classes at the differing elements: the relations between what the device and the reference hold."""

from __future__ import annotations

import numpy as np

from csa_conform.explain.values import Part, part_claims, value_classes


def _bf16(values: np.ndarray, nearest: bool) -> np.ndarray:
    """binary32 to bf16 and back by the bits: to nearest with ties to even, or toward zero."""
    bits = values.view(np.uint32).astype(np.uint64)
    if nearest:
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits & 0xFFFF0000).astype(np.uint32).view(np.float32)


def test_a_tensor_written_rounded_to_bf16_says_so_and_which_rounding():
    """Y written as bf16 (a bf16-output habit): every differing element is the reference's value rounded, to
    nearest or toward zero; where both roundings agree on some, the rest still name the one."""
    reference = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    for nearest, how in ((True, "rounded to bf16 (to nearest, ties to even)"),
                         (False, "truncated to bf16 (rounded toward zero)")):
        claims, _ = value_classes({"Y": reference}, {"Y": _bf16(reference, nearest)})
        differing = int(np.count_nonzero(_bf16(reference, nearest) != reference))
        assert [claim.text for claim in claims] == [f"Y: the device holds the reference's value {how}, "
                                                    f"{differing:,} of {differing:,}"]


def test_a_few_values_that_land_on_bf16_numbers_are_no_relation():
    reference = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    device = reference.copy()
    device[0, :3] = _bf16(reference[0, :3], True)
    claims, _ = value_classes({"Y": reference}, {"Y": device})
    assert not any("bf16" in claim.text for claim in claims)


def test_a_clamp_at_one_magnitude_is_stated_with_the_reference_on_one_side():
    """A tensor clamped at ±240 where the reference runs to ±448: every differing device value has one
    magnitude and every reference value there is larger; mixed magnitudes or too few elements say nothing."""
    reference = np.linspace(241, 448, 24, dtype=np.float32) * np.where(np.arange(24) % 2, -1, 1).astype(np.float32)
    base = np.random.default_rng(2).uniform(-200, 200, (2, 64)).astype(np.float32)
    expected, clamped = base.copy(), base.copy()
    expected[0, :24] = reference
    clamped[0, :24] = np.copysign(np.float32(240), reference)
    claims, _ = value_classes({"Y": expected}, {"Y": clamped})
    assert [claim.text for claim in claims] == ["Y: the device holds one magnitude, ±240.0, at every differing "
                                                "element where the reference's are larger, 24 of 24"]
    mixed = clamped.copy()
    mixed[0, 5] = 239
    assert not any("one magnitude" in claim.text for claim in value_classes({"Y": expected}, {"Y": mixed})[0])
    few = expected.copy()
    few[0, :3] = clamped[0, :3]
    assert not any("one magnitude" in claim.text for claim in value_classes({"Y": expected}, {"Y": few})[0])


def test_one_value_of_one_sign_is_stated_without_a_sign_choice():
    expected = np.random.default_rng(3).uniform(1, 2, (1, 32)).astype(np.float32)
    device = expected.copy()
    device[0, :10] = np.float32(-0.5)
    claims, _ = value_classes({"Y": expected}, {"Y": device})
    assert [claim.text for claim in claims] == ["Y: the device holds one magnitude, -0.5, at every differing "
                                                "element where the reference's are larger, 10 of 10"]


def test_e4m3_codes_clamped_at_240_name_the_code_and_its_magnitude():
    reference = (np.arange(64, dtype=np.uint8) % 7 + 0x78) | np.where(np.arange(64) % 2, 0x80, 0).astype(np.uint8)
    device = (np.full(64, 0x77, dtype=np.uint8) | (reference & 0x80)).astype(np.uint8)
    claims, _ = part_claims(Part("codes", "e4m3", reference[None], device[None]))
    assert [claim.text for claim in claims] == ["codes: the device holds one magnitude, code 0x77 (±240), at every "
                                                "differing element where the reference's are larger, 64 of 64"]


def test_values_a_few_units_in_the_last_place_apart_say_so_in_their_format():
    reference = np.random.default_rng(4).uniform(0.5, 2, (2, 32)).astype(np.float32)
    one = (reference.view(np.uint32) + np.uint32(1)).view(np.float32)
    claims, _ = value_classes({"Y": reference}, {"Y": one})
    assert [claim.text for claim in claims] == ["Y: the device's value is the reference's neighbouring binary32 "
                                                "number (one unit in the last place), 64 of 64"]
    bf16 = _bf16(reference, True)
    three_up = ((bf16.view(np.uint32) >> 16) + 3 << 16).astype(np.uint32).view(np.float32)
    claims, _ = value_classes({"Y": bf16}, {"Y": three_up})
    assert [claim.text for claim in claims] == ["Y: the device's value is within 3 units in the last place (bf16) "
                                                "of the reference's, 64 of 64"]
    far = reference * np.float32(1.5)
    assert not any("last place" in claim.text for claim in value_classes({"Y": reference}, {"Y": far})[0])
    smallest = np.zeros((1, 16), dtype=np.float32)
    smallest[0, :8] = np.uint32(0x00010000).view(np.float32)  # the smallest bf16 subnormal, one bf16 unit above 0
    claims, _ = value_classes({"Y": smallest}, {"Y": np.zeros_like(smallest)})
    assert [claim.text for claim in claims] == ["Y: the device holds 0 where the reference holds 9.1835e-41, 8 of 8"]
