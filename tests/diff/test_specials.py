"""The one-pass special-value scan: both engines count what NumPy's predicates count, and a changed
special value (a NaN payload, an infinity's sign, -0 for +0) is still a divergence in diff and verify."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from golden_edits import rewrite

import csa_conform.compare.specials as specials
from csa_conform.cli import main
from csa_conform.compare.bitwise import compare_tensor
from csa_conform.compare.specials import scan
from csa_conform.exitcodes import ExitCode
from csa_conform.oracle.engine import numba_available

ENGINES = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(not numba_available(), reason="numba not installed"))]
UNSIGNED = {np.float16: np.uint16, np.float32: np.uint32, np.float64: np.uint64}
SMALL = "boundaries.r4-prefill-3"
COMMITTED = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"


def crafted(dtype) -> np.ndarray:
    """Every class of bit pattern: NaN payloads (quiet, signalling, both signs), ±inf, ±0, subnormals,
    the largest finite values, then random patterns (which land in every class)."""
    unsigned = UNSIGNED[dtype]
    width = 8 * np.dtype(dtype).itemsize
    sign = 1 << (width - 1)
    infinity = int(np.array(np.inf, dtype).view(unsigned))
    quiet = 1 << (np.finfo(dtype).nmant - 1)
    patterns = [
        infinity | quiet, infinity | quiet | 1, infinity | 1, infinity | (sign - 1 - infinity),  # NaN payloads
        sign | infinity | quiet, sign | infinity | 1,
        infinity, sign | infinity, 0, sign, 1, sign | 1, quiet - 1, sign | (quiet - 1),  # ±inf, ±0, subnormals
        infinity - 1, sign | (infinity - 1),  # ±largest finite
    ]
    rng = np.random.default_rng(width)
    random = rng.integers(0, 1 << width, 4096, dtype=np.uint64, endpoint=False) if width < 64 else \
        rng.integers(0, np.iinfo(np.uint64).max, 4096, dtype=np.uint64, endpoint=True)
    return np.concatenate([np.array(patterns, dtype=np.uint64), random]).astype(unsigned).view(dtype)


def predicates(array: np.ndarray) -> tuple[int, int, int, int]:
    return (
        int(np.count_nonzero(np.isnan(array))),
        int(np.count_nonzero(np.isposinf(array))),
        int(np.count_nonzero(np.isneginf(array))),
        int(np.count_nonzero((array == 0) & np.signbit(array))),
    )


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_the_scan_counts_what_numpy_predicates_count(engine, dtype):
    values = crafted(dtype)
    found = scan(values, values.copy(), engine=engine)
    assert found.equal
    assert (found.nan, found.inf, found.negative_inf, found.negative_zero) == predicates(values)
    assert found.nan >= 6 and found.inf >= 1 and found.negative_inf >= 1 and found.negative_zero >= 1


@pytest.mark.parametrize("engine", ENGINES)
def test_the_numpy_shortcut_without_nan_or_infinity_still_counts_negative_zero(engine):
    values = np.array([0.0, -0.0, -1e-45, 3.0, -0.0], dtype=np.float32)  # no exponent of all ones
    assert scan(values, engine=engine) == specials.Scan(True, 0, 0, 0, 2)
    empty = np.zeros((0, 3), dtype=np.float32)
    assert scan(empty, empty, engine=engine) == specials.Scan(True, 0, 0, 0, 0)
    assert scan(np.float32(-0.0), engine=engine) == specials.Scan(True, 0, 0, 0, 1)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("index", range(16))
def test_one_changed_bit_of_any_special_value_is_unequal(engine, index):
    values = crafted(np.float32)
    changed = values.copy()
    bits = changed.view(np.uint32)
    bits[index] ^= np.uint32(1 if index % 2 else 1 << 31)  # a payload / fraction bit, or the sign
    assert not scan(values, changed, engine=engine).equal
    assert scan(values, changed, engine=engine).nan == predicates(values)[0]


@pytest.mark.parametrize("engine", ENGINES)
def test_diff_fails_a_nan_payload_an_infinity_sign_and_minus_zero(engine, monkeypatch):
    monkeypatch.setattr(specials, "scan_engine", lambda: engine)
    quiet = np.array([0x7FC00000], dtype=np.uint32).view(np.float32)
    payload = np.array([0x7FC00001], dtype=np.uint32).view(np.float32)
    for expected, actual in ((quiet, payload), (np.float32([np.inf]), np.float32([-np.inf])),
                             (np.float32([0.0]), np.float32([-0.0]))):
        diff = compare_tensor(expected, actual, stage="outputs", tensor="Y")
        assert not diff.passed and diff.mismatches == 1, (expected.view(np.uint32), actual.view(np.uint32))
    same = compare_tensor(crafted(np.float32), crafted(np.float32), stage="outputs", tensor="Y")
    nan, positive, negative, zero = predicates(crafted(np.float32))
    assert same.passed and same.ulp["nan_pairs"] == nan
    assert same.specials["expected"] == same.specials["actual"] == {"nan": nan, "inf": positive, "-inf": negative,
                                                                     "-0": zero}


def test_both_engines_make_the_same_diff_documents(monkeypatch):
    if not numba_available():
        pytest.skip("numba not installed")
    values = crafted(np.float32).reshape(2, -1)
    moved = values.copy()
    moved[1, 40] = np.float32(7.0)
    documents = []
    for engine in ("numpy", "numba"):
        monkeypatch.setattr(specials, "scan_engine", lambda engine=engine: engine)
        documents.append([compare_tensor(values, other, stage="outputs", tensor="Y").to_dict()
                          for other in (values.copy(), moved)])
    assert documents[0] == documents[1]


@pytest.mark.parametrize("edit", ["-inf to +inf", "+0 to -0", "a NaN"])
def test_verify_fails_a_file_whose_special_values_were_changed(tmp_path, edit):
    path = tmp_path / "edited.h5"
    shutil.copyfile(COMMITTED, path)
    dataset, old, new = {
        "-inf to +inf": ("stages/sparse_sink_softmax_attention/scores", -np.inf, np.inf),
        "+0 to -0": ("stages/index_query_finalize/transformed", 0.0, -0.0),
        "a NaN": ("outputs/Y", None, np.nan),
    }[edit]

    def change(values):
        flat = values.reshape(-1)
        where = 0 if old is None else int(np.flatnonzero((flat == old) & (np.signbit(flat) == np.signbit(old)))[0])
        flat[where] = new

    rewrite(path, f"cases/{SMALL}/steps/0000/{dataset}", change)
    result = CliRunner().invoke(main, ["verify", str(path), "--case", SMALL])
    assert result.exit_code == ExitCode.DIVERGED, result.output
    assert dataset.split("/")[-1] in result.output
