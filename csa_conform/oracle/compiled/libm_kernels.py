"""glibc's expf, sinf, cosf and log2f for the numba engine: the NumPy ports, one element at a time.

Each function follows csa_conform.numerics.libm operation for operation in
plain double arithmetic, and where that port emulates one of libm's fused
multiply-adds with `libm.fma` (Dekker product, two-sums, rounding to odd),
`fma` here runs the same emulation: never a hardware fma, fastmath off. The
results are the NumPy ports' bits by construction, and
tests/oracle/test_compiled_libm.py compares them on millions of inputs.
Integer work runs in uint64 with explicit masks: numba widens uint32
arithmetic, and mixing signed with unsigned would turn it into floats.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from csa_conform.numerics import libm
from csa_conform.oracle.compiled.dots import KERNEL_OPTIONS

_U64 = np.uint64


@intrinsic
def float64_bits(typingctx, value):
    def codegen(context, builder, signature, arguments):
        return builder.bitcast(arguments[0], ir.IntType(64))

    return types.uint64(types.float64), codegen


@intrinsic
def float64_from_bits(typingctx, bits):
    def codegen(context, builder, signature, arguments):
        return builder.bitcast(arguments[0], ir.DoubleType())

    return types.float64(types.uint64), codegen


@intrinsic
def float32_bits(typingctx, value):
    """The binary32 pattern, zero-extended to uint64."""

    def codegen(context, builder, signature, arguments):
        return builder.zext(builder.bitcast(arguments[0], ir.IntType(32)), ir.IntType(64))

    return types.uint64(types.float32), codegen


@intrinsic
def float32_from_bits(typingctx, bits):
    """The binary32 whose pattern is the low 32 bits."""

    def codegen(context, builder, signature, arguments):
        return builder.bitcast(builder.trunc(arguments[0], ir.IntType(32)), ir.FloatType())

    return types.float32(types.uint64), codegen


# --- exact fused multiply-add (libm.fma) ---------------------------------------------------

_VELTKAMP = libm._VELTKAMP


@njit(**KERNEL_OPTIONS)
def fma(a, b, c):
    """libm.fma of three doubles: the same Dekker product, two-sums and rounding to odd."""
    product = a * b
    scaled = a * _VELTKAMP
    a_high = scaled - (scaled - a)
    a_low = a - a_high
    scaled = b * _VELTKAMP
    b_high = scaled - (scaled - b)
    b_low = b - b_high
    product_error = ((a_high * b_high - product) + a_high * b_low + a_low * b_high) + a_low * b_low
    high = c + product
    virtual = high - c
    low = (c - (high - virtual)) + (product - virtual)
    low_sum = low + product_error
    virtual = low_sum - low
    low_error = (low - (low_sum - virtual)) + (product_error - virtual)
    bits = float64_bits(low_sum)
    if low_error != 0 and (bits & _U64(1)) == 0:
        bits = bits + _U64(1) if (low_error > 0) == (low_sum > 0) else bits - _U64(1)
    tail = float64_from_bits(bits)
    return high if tail == 0 else high + tail


_QUIET = _U64(libm._QUIET)
_DEFAULT_NAN = _U64(libm._DEFAULT_NAN)
_ABS = _U64(0x7FFFFFFF)
_EXPONENT_ONES = _U64(0x7F800000)


@njit(**KERNEL_OPTIONS)
def _invalid(bits):
    """libm._invalid: the quieted NaN itself, else the default NaN."""
    if (bits & _ABS) > _EXPONENT_ONES:
        return float32_from_bits(bits | _QUIET)
    return float32_from_bits(_DEFAULT_NAN)


# --- expf ----------------------------------------------------------------------------------

_C0, _C1, _C2 = libm._EXPF_POLY
_FRACTION_MASK = _U64(31)
_EXPONENT_SHIFT = _U64(47)
_DROPPED = libm._NORMAL_DROPPED
_DROPPED_MASK = _U64((1 << _DROPPED) - 1)
_LOWEST_NEAR = _U64((1 << (_DROPPED - 1)) - libm._MIDPOINT_ULPS + 1)
_NEAR_WIDTH = _U64(2 * libm._MIDPOINT_ULPS - 1)
_TINY = np.float32(2.0**-149)
_INFINITY = np.float32(np.inf)
_ZERO = np.float32(0)
_EXP2F_TAB = libm.EXP2F_TAB


@njit(**KERNEL_OPTIONS)
def _near_binary32_midpoint(y):
    """libm._near_binary32_midpoint of one positive double."""
    bits = float64_bits(y)
    if y >= libm._LOWEST_NORMAL:
        return ((bits - _LOWEST_NEAR) & _DROPPED_MASK) < _NEAR_WIDTH
    exponent = np.int64(bits >> _U64(52)) - 1023
    dropped = min(max(_DROPPED - 126 - exponent, _DROPPED), 52)
    low = np.int64(bits & ((_U64(1) << _U64(dropped)) - _U64(1)))
    return abs(low - (np.int64(1) << (dropped - 1))) < libm._MIDPOINT_ULPS or exponent < -149


@njit(**KERNEL_OPTIONS)
def expf(x):
    """libm.expf of one binary32: the plain reduction and polynomial, fused ones where they could differ."""
    if not (x <= libm._EXPF_OVERFLOW and x >= libm._EXPF_MAY_UNDERFLOW):
        if x != x:
            return float32_from_bits(float32_bits(x) | _QUIET)
        if x > libm._EXPF_OVERFLOW:
            return _INFINITY
        return _ZERO if x < libm._EXPF_UNDERFLOW else _TINY
    wide = np.float64(x)
    product = wide * libm._INVLN2N_HIGH
    shifted = product + libm._SHIFT
    head = product - (shifted - libm._SHIFT)
    reduced = head + wide * libm._INVLN2N_LOW
    if abs(head) >= libm._TIE_MARGIN:
        shifted = fma(libm._INVLN2N, wide, libm._SHIFT)
        reduced = fma(libm._INVLN2N, wide, -(shifted - libm._SHIFT))
    ki = float64_bits(shifted)
    scale = float64_from_bits(_EXP2F_TAB[ki & _FRACTION_MASK] + (ki << _EXPONENT_SHIFT))
    y = ((_C0 * reduced + _C1) * (reduced * reduced) + (_C2 * reduced + 1.0)) * scale
    if _near_binary32_midpoint(y):
        y = fma(fma(_C0, reduced, _C1), reduced * reduced, fma(_C2, reduced, 1.0)) * scale
    return np.float32(y)


# --- sinf / cosf ---------------------------------------------------------------------------

_S1, _S2, _S3 = libm._SIN_POLY
_K0, _K1, _K2, _K3, _K4 = libm._COS_POLY
_INV_PIO4 = libm.INV_PIO4
_LOW32 = _U64(0xFFFFFFFF)
_HALF_TURN = _U64(1 << 61)


@njit(**KERNEL_OPTIONS)
def _sin_poly(x, x2):
    x3 = x * x2
    head = fma(x2, _S3, _S2)
    x7 = x3 * x2
    return fma(head, x7, fma(x3, _S1, x))


@njit(**KERNEL_OPTIONS)
def _cos_poly(x2):
    x4 = x2 * x2
    low = fma(x2, _K1, _K0)
    high = fma(x2, _K4, _K3)
    x6 = x4 * x2
    return fma(high, x6, fma(x4, _K2, low))


@njit(**KERNEL_OPTIONS)
def _quadrant_result(r, n, signed_quadrant, want_cosine):
    r2 = r * r
    if ((n & 1) == 1) == want_cosine:
        sign = 1.0 if ((signed_quadrant + 1) & 2) == 0 else -1.0
        return _sin_poly(r * sign, r2)
    cosine = _cos_poly(r2)
    return -cosine if (signed_quadrant & 2) != 0 else cosine


@njit(**KERNEL_OPTIONS)
def _sincosf(x, want_cosine):
    """libm._sincos_kernel of one binary32."""
    bits = float32_bits(x)
    abstop = (bits >> _U64(20)) & _U64(0x7FF)
    if abstop < libm._TOP12_2M12:
        return np.float32(1) if want_cosine else x
    wide = np.float64(x)
    if abstop < libm._TOP12_PIO4:
        y = _cos_poly(wide * wide) if want_cosine else _sin_poly(wide, wide * wide)
    elif abstop < libm._TOP12_120:
        n = (np.int64(np.int32(wide * libm._HPI_INV)) + 0x800000) >> 24
        y = _quadrant_result(fma(-np.float64(n), libm._HPI, wide), n, n, want_cosine)
    elif abstop < libm._TOP12_INF:
        index = (bits >> _U64(26)) & _U64(15)
        mantissa = ((bits & _U64(0xFFFFFF)) | _U64(0x800000)) << ((bits >> _U64(23)) & _U64(7))
        top = (mantissa * _INV_PIO4[index]) & _LOW32
        middle = mantissa * _INV_PIO4[index + _U64(4)]
        bottom = mantissa * _INV_PIO4[index + _U64(8)]
        fixed = ((bottom >> _U64(32)) | (top << _U64(32))) + middle
        quadrant = (fixed + _HALF_TURN) >> _U64(62)
        fixed = fixed - (quadrant << _U64(62))
        n = np.int64(quadrant)
        r = np.float64(np.int64(fixed)) * libm._PI63
        y = _quadrant_result(r, n, n + np.int64(bits >> _U64(31)), want_cosine)
    else:
        return _invalid(bits)
    return np.float32(y)


@njit(**KERNEL_OPTIONS)
def sinf(x):
    """libm.sinf of one binary32."""
    return _sincosf(x, False)


@njit(**KERNEL_OPTIONS)
def cosf(x):
    """libm.cosf of one binary32."""
    return _sincosf(x, True)


# --- log2f ---------------------------------------------------------------------------------

_A0, _A1, _A2, _A3 = libm._LOG2F_POLY
_LOG2_TAB = libm._LOG2_TAB
_LOG2_OFF = _U64(libm._LOG2_OFF)
_LOWEST_NORMAL_BITS = _U64(0x00800000)
_SPECIAL_SPAN = _U64(0x7F800000 - 0x00800000)
_TOP_MASK = _U64(0xFF800000)
_SUBNORMAL_SCALE = np.float32(2.0**23)
_SUBNORMAL_BIAS = _U64(23 << 23)


@njit(**KERNEL_OPTIONS)
def log2f(x):
    """libm.log2f of one binary32."""
    ix = float32_bits(x)
    if ((ix - _LOWEST_NORMAL_BITS) & _LOW32) >= _SPECIAL_SPAN:
        if ix != 0 and ix < _LOWEST_NORMAL_BITS:
            ix = (float32_bits(x * _SUBNORMAL_SCALE) - _SUBNORMAL_BIAS) & _LOW32
        elif (ix << _U64(1)) & _LOW32 == 0:
            return -_INFINITY
        elif ix == _EXPONENT_ONES:
            return _INFINITY
        else:
            return _invalid(ix)
    tmp = (ix - _LOG2_OFF) & _LOW32
    index = (tmp >> _U64(19)) & _U64(15)
    top = tmp & _TOP_MASK
    z = np.float64(float32_from_bits(ix - top))
    k = np.float64(np.int32(np.uint32(top)) >> 23)
    r = fma(z, _LOG2_TAB[index, 0], -1.0)
    y0 = _LOG2_TAB[index, 1] + k
    r2 = r * r
    y = fma(_A0, r2, fma(_A1, r, _A2))
    return np.float32(fma(y, r2, fma(_A3, r, y0)))


KERNELS = (
    fma, _invalid, _near_binary32_midpoint, expf, _sin_poly, _cos_poly, _quadrant_result, _sincosf, sinf, cosf, log2f,
)
