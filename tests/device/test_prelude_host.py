"""The prelude's glibc ports and block codecs, built for the host, against glibc, the NumPy
oracle and the reference's own primitive outputs. Same C source as the device modules."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from pathlib import Path

import numpy as np
import pytest

from csa_conform.numerics import libm
from csa_conform.numerics.bf16 import bf16_bits
from csa_conform.numerics.fp4 import quantize_fp4_blocks
from csa_conform.numerics.fp8 import quantize_fp8_blocks
from csa_conform.device.host import GXX, build_prelude
from reference_corpus import reference_file
pytestmark = pytest.mark.skipif(GXX is None, reason="g++ is not installed")

_float_p = ctypes.POINTER(ctypes.c_float)


def _cpu_has_fma() -> bool:
    try:
        return " fma " in Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        return False


# The reference ran glibc 2.36's FMA multiarch variants; only that libm is an oracle for them.
REFERENCE_LIBM = platform.libc_ver() == ("glibc", "2.36") and _cpu_has_fma()


@pytest.fixture(scope="module")
def prelude(tmp_path_factory):
    return build_prelude(tmp_path_factory.mktemp("prelude"))


def _unary(library, name: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    getattr(library, name)(x.ctypes.data_as(_float_p), out.ctypes.data_as(_float_p), ctypes.c_long(x.size))
    return out


def _glibc(name: str, x: np.ndarray) -> np.ndarray:
    libm_so = ctypes.CDLL(ctypes.util.find_library("m"))
    function = getattr(libm_so, name)
    function.restype, function.argtypes = ctypes.c_float, [ctypes.c_float]
    return np.array([function(float(v)) for v in x], dtype=np.float32)


def _samples(name: str, count: int) -> np.ndarray:
    """Arguments the operator produces, plus raw bit patterns for the special paths."""
    rng = np.random.default_rng(2036)
    raw = rng.integers(0, 2**32, count // 4, dtype=np.uint64).astype(np.uint32).view(np.float32)
    if name == "expf":
        typical = -rng.exponential(8.0, count).astype(np.float32)
        edges = np.linspace(-110.0, 90.0, count // 4, dtype=np.float32)
        return np.concatenate([typical, edges, raw])
    if name in ("sinf", "cosf"):
        positions = rng.integers(0, 1 << 20, count).astype(np.float32)
        frequencies = libm.powf(np.float32(160000.0), -(2 * rng.integers(0, 32, count)).astype(np.float32) / 64)
        return np.concatenate([positions * frequencies.astype(np.float32), raw])
    quotient = np.abs(rng.standard_normal(count).astype(np.float32) * 10.0 ** rng.integers(-30, 30, count)) / 448
    return np.concatenate([quotient.astype(np.float32), np.abs(raw)])


def _same(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    return (actual.view(np.uint32) == expected.view(np.uint32)) | (np.isnan(actual) & np.isnan(expected))


@pytest.mark.parametrize("name", ["expf", "sinf", "cosf", "log2f"])
def test_port_matches_the_numpy_oracle(prelude, name):
    x = _samples(name, 400_000)
    actual = _unary(prelude, f"host_{name}", x)
    expected = getattr(libm, name)(x)
    bad = ~_same(actual, expected)
    assert not bad.any(), f"{name}: {bad.sum()} differ, first x={x[bad][0]!r}"


@pytest.mark.skipif(not REFERENCE_LIBM, reason="needs glibc 2.36 on an FMA CPU (the reference's libm)")
@pytest.mark.parametrize("name", ["expf", "sinf", "cosf", "log2f"])
def test_port_matches_the_reference_libm(prelude, name):
    x = _samples(name, 40_000)
    actual = _unary(prelude, f"host_{name}", x)
    expected = _glibc(name, x)
    bad = ~_same(actual, expected)
    assert not bad.any(), f"{name}: {bad.sum()} differ from glibc, first x={x[bad][0]!r}"


def test_powf_on_the_rope_exponents_and_beyond(prelude):
    rng = np.random.default_rng(7)
    y = np.concatenate([-(2 * np.arange(32, dtype=np.float32)) / np.float32(64),
                        rng.uniform(-40, 40, 20_000).astype(np.float32)])
    x = np.concatenate([np.full(32, 160000.0, np.float32), np.abs(rng.standard_normal(20_000)).astype(np.float32)])
    out = np.empty_like(x)
    prelude.host_powf(x.ctypes.data_as(_float_p), y.ctypes.data_as(_float_p), out.ctypes.data_as(_float_p),
                      ctypes.c_long(x.size))
    assert _same(out, libm.powf(x, y)).all()
    if REFERENCE_LIBM:
        glibc = ctypes.CDLL(ctypes.util.find_library("m")).powf
        glibc.restype, glibc.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
        expected = np.array([glibc(float(a), float(b)) for a, b in zip(x, y)], dtype=np.float32)
        assert _same(out, expected).all()


def _bf16(prelude, values: np.ndarray) -> np.ndarray:
    values = np.ascontiguousarray(values, dtype=np.float32)
    out = np.empty(values.size, dtype=np.uint16)
    prelude.host_bf16(values.ctypes.data_as(_float_p), out.ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)),
                      ctypes.c_long(values.size))
    return out


def test_bf16_keeps_nan_payloads_and_rounds_to_even(prelude):
    bits = np.array([0x7FC00000, 0xFFA00001, 0x7F800001, 0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x80000000],
                    dtype=np.uint32)
    assert (_bf16(prelude, bits.view(np.float32)) == bf16_bits(bits.view(np.float32))).all()


def test_bf16_matches_the_reference_samples(prelude):
    data = reference_file("prim_bf16.npz")
    assert (_bf16(prelude, data["in/values"]) == data["out/bits"]).all()


def test_decode_tables_match_the_reference(prelude):
    e4m3, e2m1, e8m0 = np.empty(256, np.float32), np.empty(16, np.float32), np.empty(256, np.float32)
    prelude.host_decode_tables(*(a.ctypes.data_as(_float_p) for a in (e4m3, e2m1, e8m0)))
    tables = reference_file("prim_decode_tables.npz")
    for name, ours in (("decode_e4m3", e4m3), ("decode_e2m1", e2m1), ("decode_e8m0", e8m0)):
        assert _same(ours, tables[f"out/{name}"]).all(), name


def _quantize(prelude, entry: str, blocks: np.ndarray, width: int):
    blocks = np.ascontiguousarray(blocks, dtype=np.float32)
    scales = np.empty(blocks.shape[0], np.uint8)
    packed = np.empty((blocks.shape[0], width), np.uint8)
    u8 = ctypes.POINTER(ctypes.c_uint8)
    getattr(prelude, entry)(blocks.ctypes.data_as(_float_p), scales.ctypes.data_as(u8), packed.ctypes.data_as(u8),
                            ctypes.c_long(blocks.shape[0]))
    return scales, packed


def _edge_blocks(width: int, count: int) -> np.ndarray:
    rng = np.random.default_rng(width)
    magnitudes = 2.0 ** rng.integers(-40, 40, (count, 1))
    blocks = (rng.standard_normal((count, width)) * magnitudes).astype(np.float32)
    blocks[::7] = np.round(blocks[::7] * 4) / 4
    blocks[1::11, 0] = -0.0
    blocks[2::13] = 0
    return blocks


def test_fp4_blocks_match_the_reference_samples(prelude):
    data = reference_file("prim_fp4block.npz")
    ok = data["out/ok"].astype(bool)
    scales, packed = _quantize(prelude, "host_fp4_blocks", data["in/blocks"][ok], 16)
    assert (scales == data["out/scale_e8m0"][ok]).all()
    assert (packed == data["out/codes"][ok]).all()


def test_fp4_and_fp8_blocks_match_the_oracle(prelude):
    blocks = _edge_blocks(32, 4000)
    scales, packed = _quantize(prelude, "host_fp4_blocks", blocks, 16)
    expected_scales, expected_packed, _ = quantize_fp4_blocks(blocks)
    assert (scales == expected_scales).all() and (packed == expected_packed).all()
    blocks = _edge_blocks(64, 4000)
    scales, codes = _quantize(prelude, "host_fp8_blocks", blocks, 64)
    expected_scales, expected_codes, _ = quantize_fp8_blocks(blocks)
    assert (scales == expected_scales).all() and (codes == expected_codes).all()
