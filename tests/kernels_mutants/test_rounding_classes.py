"""How many committed ci cases reach each rounding class of each record kind (rounding_classes.py):
three or more, or a documented gap pinned at its measured count, so a class the suite loses fails
here and one it gains is moved out of GAPS."""

from __future__ import annotations

from pathlib import Path

import pytest

from rounding_classes import KINDS, cases_per_class

CI_GOLDENS = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"
MINIMUM = 3
UNREACHABLE = "the reference cannot reach it"
CRAFTED = "only the quant-edge crafted case of this ratio plants it (a record kind ci carries once)"
RANDOM_BF16 = ("random and boundary inputs give a binary32 value with its low 16 bits exactly 0x8000 with "
               "odds of 2^-16 per rounding, and no crafted case plants one in a record's bf16 roundings")
# (kind, class) -> (the ci cases reaching it now, why fewer than MINIMUM).
GAPS = {
    **{(kind, "E2M1 -0 code"): (0, UNREACHABLE + ": the E2M1 encoder gives a negative that rounds to zero code 0, "
                                   "never 8") for kind in ("ratio-4 FP4 index key", "ratio-4 index query (bf16, FP4)")},
    **{(kind, "E8M0 amax under the floor"): (0, "the FP4 floor is 6 * 2^-126: a block of f32-subnormal Hadamard "
                                                "outputs, which no fixture plants")
       for kind in ("ratio-4 FP4 index key", "ratio-4 index query (bf16, FP4)")},
    **{(kind, label): (1, CRAFTED) for kind in ("ratio-128 FP8 record", "ratio-4 FP8 main record")
       for label in ("E4M3 subnormal code", "E4M3 -0 code", "E8M0 all-zero block", "E8M0 amax under the floor",
                     "bf16 -0")},
    ("ratio-128 FP8 record", "E8M0 at a power-of-two amax"): (1, CRAFTED),
    ("bf16 RoPE tail of a record", "bf16 -0"): (2, CRAFTED + " (-0 in the tail, one case per ratio)"),
    **{(kind, label): (0, RANDOM_BF16) for kind in ("ratio-128 FP8 record", "ratio-128 f32 record",
                                                    "ratio-4 FP8 main record", "ratio-4 FP4 index key",
                                                    "bf16 RoPE tail of a record")
       for label in ("bf16 tie, to even down", "bf16 tie, to even up")},
    ("ratio-128 f32 record", "bf16 -0"): (0, "no f32-cache case has a -0 record value (the crafted case is FP8)"),
    ("ratio-4 FP4 index key", "bf16 -0"): (0, "no case plants a -0 index-key value"),
    **{("ratio-4 FP4 index key", label): (0, "the crafted FP4 designs steer the index queries, not the keys")
       for label in ("E8M0 at a power-of-two amax", "E8M0 all-zero block")},
    ("ratio-4 index query (bf16, FP4)", "E8M0 all-zero block"): (1, "only the ratio-4 quant-edge crafted case"),
    ("ratio-4 index query (bf16, FP4)", "bf16 -0"): (1, "only the ratio-4 quant-edge crafted case"),
}


@pytest.fixture(scope="module")
def reached():
    return cases_per_class(CI_GOLDENS)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_rounding_class_of_each_record_kind_is_reached_by_several_ci_cases(kind, reached):
    for label in KINDS[kind]:
        count = len(reached.get((kind, label), ()))
        if (kind, label) in GAPS:
            pinned, why = GAPS[(kind, label)]
            assert count >= pinned, f"{kind}: {label}: {count} ci cases, was {pinned} ({why})"
            assert count < MINIMUM, f"{kind}: {label} now reaches {count} ci cases: move it out of GAPS"
        else:
            assert count >= MINIMUM, f"{kind}: {label}: {count} ci cases only"


def test_every_gap_names_a_kind_and_class_the_audit_knows():
    assert all(label in KINDS[kind] for kind, label in GAPS)
