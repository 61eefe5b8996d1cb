"""glibc 2.36's binary32 expf, sinf, cosf, powf and log2f, bit for bit, in NumPy.

The reference calls the platform libm, and glibc's results are not correctly
rounded, so the oracle ports the algorithms (ARM optimized-routines, in
sysdeps/ieee754/flt-32). On x86-64 with FMA and AVX2 glibc's ifunc selects the
`-fma` builds of those sources, compiled with -mfma -mavx2: gcc fused most
a*b+c patterns into single-rounding fmas. Each such fma is emulated exactly by
`fma`; every other step is one IEEE double operation, as in the machine code.
Which expressions were fused was read off the disassembly of the selected
variants; the ports matched that libm on every binary32 input of the unary
functions and on 2.5e8 powf pairs (tests/numerics/test_libm.py keeps a sample).
"""

from __future__ import annotations

from math import isqrt

import numpy as np

_F64 = np.float64
_U32 = np.uint32
_U64 = np.uint64
_I64 = np.int64

# Elements per kernel call: 64 KiB double temporaries stay in cache and below
# glibc malloc's 128 KiB mmap threshold (larger ones page-fault on every call).
_CHUNK = 1 << 13


# --- exact fused multiply-add -------------------------------------------------

_VELTKAMP = 134217729.0  # 2^27 + 1: splits a double into two 26-bit halves


def _split(a):
    scaled = a * _VELTKAMP
    high = scaled - (scaled - a)
    return high, a - high


def _two_sum(a, b):
    total = a + b
    virtual = total - a
    return total, (a - (total - virtual)) + (b - virtual)


def _round_to_odd(value, error):
    """Nudge an inexact sum onto its odd neighbour, so a later rounding cannot double-round."""
    bits = value.view(_I64)
    nudge = (error != 0) & ((bits & 1) == 0)
    away = (error > 0) == (value > 0)
    return (bits + np.where(away, 1, -1) * nudge).view(_F64)


def fma(a, b, c) -> np.ndarray:
    """Correctly rounded float64 a*b+c (the single rounding of x86 vfmadd).

    Dekker's exact product, an exact sum with c, and Boldo-Melquiond rounding
    to odd of the low parts. Exact for finite operands whose product's error
    term does not underflow (|a*b| >= 2^-968 or 0) and with |a|, |b| < 2^995.
    """
    a, b, c = (np.asarray(v, dtype=_F64) for v in (a, b, c))
    product = a * b
    a_high, a_low = _split(a)
    b_high, b_low = _split(b)
    product_error = ((a_high * b_high - product) + a_high * b_low + a_low * b_high) + a_low * b_low
    high, low = _two_sum(c, product)
    low_sum, low_error = _two_sum(low, product_error)
    tail = _round_to_odd(np.asarray(low_sum), low_error)
    return np.asarray(np.where(tail == 0, high, high + tail))  # keeps high's signed zero


# --- tables --------------------------------------------------------------------


def _exp2_fraction_table() -> np.ndarray:
    """exp2f_data.tab: bits(2^(i/32) rounded to double) - (i << 47), from the definition."""
    guard = 80
    table = []
    for i in range(32):
        scaled = 1 << (i + 32 * (52 + guard))
        for _ in range(5):
            scaled = isqrt(scaled)  # nested floors of square roots: floor(2^(i/32) * 2^(52+guard))
        mantissa, rest = divmod(scaled, 1 << guard)
        mantissa += rest > (1 << (guard - 1))
        bits = (1023 << 52) + mantissa - (1 << 52)
        table.append((bits - (i << 47)) % (1 << 64))
    return np.array(table, dtype=_U64)


def _inv_pio4_table() -> np.ndarray:
    """__inv_pio4: entry i = bits 8i+1 .. 8i+32 after the binary point of 2/pi."""
    width = 320
    pi_fixed = _pi_fixed(width)
    table = [((1 << (8 * i + 9 + width)) // pi_fixed) % (1 << 32) for i in range(24)]
    return np.array(table, dtype=_U64)


def _pi_fixed(width: int) -> int:
    """floor-ish pi * 2^width by Machin's formula, with guard bits dropped at the end."""
    guard = 32
    one = 1 << (width + guard)

    def arctan_inverse(n: int) -> int:
        total, power, k, sign = 0, one // n, 1, 1
        while power:
            total += sign * (power // k)
            power //= n * n
            k += 2
            sign = -sign
        return total

    return (16 * arctan_inverse(5) - 4 * arctan_inverse(239)) >> guard


EXP2F_TAB = _exp2_fraction_table()
INV_PIO4 = _inv_pio4_table()

_hex = float.fromhex


def _hexes(*texts: str) -> tuple[float, ...]:
    return tuple(map(_hex, texts))


# e_exp2f_data.c (TOINT_INTRINSICS == 0)
_EXP2F_POLY = _hexes("0x1.c6af84b912394p-5", "0x1.ebfce50fac4f3p-3", "0x1.62e42ff0c52d6p-1")
_EXPF_POLY = (_EXP2F_POLY[0] / 32**3, _EXP2F_POLY[1] / 32**2, _EXP2F_POLY[2] / 32)
_SHIFT = _hex("0x1.8p+52")
_SHIFT_SCALED = _SHIFT / 32
_INVLN2N = _hex("0x1.71547652b82fep+0") * 32
# the same constant cut into 29 + 24 significant bits: both products with a binary32 are exact
_INVLN2N_HIGH = float((np.float64(_INVLN2N).view(_U64) & _U64(2**64 - 2**24)).view(_F64))
_INVLN2N_LOW = _INVLN2N - _INVLN2N_HIGH

# s_sincosf_data.c, first entry (the second one only negates the cosine polynomial)
_HPI_INV = _hex("0x1.45F306DC9C883p+23")
_HPI = _hex("0x1.921FB54442D18p0")
_PI63 = _hex("0x1.921FB54442D18p-62")
_COS_POLY = _hexes(
    "0x1p0", "-0x1.ffffffd0c621cp-2", "0x1.55553e1068f19p-5", "-0x1.6c087e89a359dp-10", "0x1.99343027bf8c3p-16"
)
_SIN_POLY = _hexes("-0x1.555545995a603p-3", "0x1.1107605230bc4p-7", "-0x1.994eb3774cf24p-13")

# e_log2f_data.c; e_powf_log2_data.c shares the table (POWF_SCALE == 1): (invc, logc) rows
_LOG2_TAB = np.array(
    [
        _hexes("0x1.661ec79f8f3bep+0", "-0x1.efec65b963019p-2"),
        _hexes("0x1.571ed4aaf883dp+0", "-0x1.b0b6832d4fca4p-2"),
        _hexes("0x1.49539f0f010bp+0", "-0x1.7418b0a1fb77bp-2"),
        _hexes("0x1.3c995b0b80385p+0", "-0x1.39de91a6dcf7bp-2"),
        _hexes("0x1.30d190c8864a5p+0", "-0x1.01d9bf3f2b631p-2"),
        _hexes("0x1.25e227b0b8eap+0", "-0x1.97c1d1b3b7afp-3"),
        _hexes("0x1.1bb4a4a1a343fp+0", "-0x1.2f9e393af3c9fp-3"),
        _hexes("0x1.12358f08ae5bap+0", "-0x1.960cbbf788d5cp-4"),
        _hexes("0x1.0953f419900a7p+0", "-0x1.a6f9db6475fcep-5"),
        _hexes("0x1p+0", "0x0p+0"),
        _hexes("0x1.e608cfd9a47acp-1", "0x1.338ca9f24f53dp-4"),
        _hexes("0x1.ca4b31f026aap-1", "0x1.476a9543891bap-3"),
        _hexes("0x1.b2036576afce6p-1", "0x1.e840b4ac4e4d2p-3"),
        _hexes("0x1.9c2d163a1aa2dp-1", "0x1.40645f0c6651cp-2"),
        _hexes("0x1.886e6037841edp-1", "0x1.88e9c2c1b9ff8p-2"),
        _hexes("0x1.767dcf5534862p-1", "0x1.ce0a44eb17bccp-2"),
    ]
)
_LOG2F_POLY = _hexes("-0x1.712b6f70a7e4dp-2", "0x1.ecabf496832ep-2", "-0x1.715479ffae3dep-1", "0x1.715475f35c8b8p0")
_POWF_LOG2_POLY = _hexes(
    "0x1.27616c9496e0bp-2",
    "-0x1.71969a075c67ap-2",
    "0x1.ec70a6ca7baddp-2",
    "-0x1.7154748bef6c8p-1",
    "0x1.71547652ab82bp0",
)

_LOG2_OFF = 0x3F330000
_SIGN = 0x80000000
_QUIET = 0x00400000
_DEFAULT_NAN = 0xFFC00000  # x86's "real indefinite", what inf - inf gives


# --- shared helpers ------------------------------------------------------------


def _elementwise(kernel, x) -> np.ndarray:
    """Run a 1-D kernel over _CHUNK-sized pieces of the flattened input."""
    x = np.asarray(x, dtype=np.float32)
    flat = x.ravel()
    out = np.empty(flat.shape, dtype=np.float32)
    with np.errstate(all="ignore"):  # NaN, inf and underflow are results here, not faults
        for start in range(0, flat.size, _CHUNK):
            out[start : start + _CHUNK] = kernel(flat[start : start + _CHUNK])
    return out.reshape(x.shape)


def _f32_from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=_U32).view(np.float32)


def _quiet(bits) -> np.ndarray:
    """A NaN as an SSE operation returns it: same sign and payload, quiet bit set."""
    return _f32_from_bits(np.asarray(bits, dtype=_U32) | _U32(_QUIET))


def _is_nan(bits):
    return (bits & _U32(0x7FFFFFFF)) > _U32(0x7F800000)


def _invalid(bits) -> np.ndarray:
    """__math_invalidf: (x - x) / (x - x) -- the quieted NaN itself, else the default NaN."""
    bits = np.asarray(bits, dtype=_U32)
    return _f32_from_bits(np.where(_is_nan(bits), bits | _U32(_QUIET), _U32(_DEFAULT_NAN)))


def _exp2_scale(ki, sign_bias=None):
    """asdouble(T[ki % 32] + ((ki + sign_bias) << 47)): 2^(k/32) from the shifted k's bits."""
    fraction = EXP2F_TAB.take((ki & _U64(31)).view(_I64), mode="clip")
    if sign_bias is not None:
        ki = ki + sign_bias
    return (fraction + (ki << _U64(47))).view(_F64)


# --- expf ----------------------------------------------------------------------

_EXPF_OVERFLOW = np.float32(_hex("0x1.62e42ep6"))
_EXPF_UNDERFLOW = np.float32(-_hex("0x1.9fe368p6"))
_EXPF_MAY_UNDERFLOW = np.float32(-_hex("0x1.9d1d9ep6"))
_TIE_MARGIN = 0.5 - 2.0**-14
# The unfused polynomial below and libm's fused one differ by a few double ulps;
# a double farther than this from every binary32 rounding midpoint rounds to
# the same binary32 either way.
_MIDPOINT_ULPS = 1 << 10
_NORMAL_DROPPED = 29  # double mantissa bits below a normal binary32's last bit
_LOWEST_NORMAL = 2.0**-126


def _expf_reduce_exact(xd):
    """e_expf-fma: kd = fma(InvLn2N, x, Shift), r = fma(InvLn2N, x, -kd)."""
    shifted = fma(_INVLN2N, xd, _SHIFT)
    kd = shifted - _SHIFT
    return shifted.view(_U64), fma(_INVLN2N, xd, -kd)


def _expf_poly_exact(r, scale):
    c0, c1, c2 = _EXPF_POLY
    z = fma(c0, r, c1)
    y = fma(c2, r, 1.0)
    return fma(z, r * r, y) * scale


def _expf_exact(xd):
    ki, r = _expf_reduce_exact(xd)
    return _expf_poly_exact(r, _exp2_scale(ki))


def _near_binary32_midpoint(y):
    """Doubles within _MIDPOINT_ULPS of a binary32 rounding midpoint (or below 2^-149)."""
    bits = y.view(_U64)
    low = _U64((1 << _NORMAL_DROPPED) - 1)
    lowest_near = _U64((1 << (_NORMAL_DROPPED - 1)) - _MIDPOINT_ULPS + 1)
    near = ((bits - lowest_near) & low) < _U64(2 * _MIDPOINT_ULPS - 1)
    subnormal = np.flatnonzero(y < _LOWEST_NORMAL)
    if subnormal.size:
        near[subnormal] = _near_subnormal_midpoint(bits[subnormal])
    return np.flatnonzero(near)


def _near_subnormal_midpoint(bits):
    """The same test where the binary32 result is subnormal and drops more bits."""
    exponent = (bits >> _U64(52)).astype(_I64) - 1023
    dropped = np.clip(_NORMAL_DROPPED - 126 - exponent, _NORMAL_DROPPED, 52).astype(_U64)
    low = bits & ((_U64(1) << dropped) - _U64(1))
    distance = np.abs(low.view(_I64) - (_I64(1) << (dropped.view(_I64) - 1)))
    return (distance < _MIDPOINT_ULPS) | (exponent < -149)


def _expf_reduce(xd):
    """_expf_reduce_exact at the cost of plain operations.

    x*InvLn2N = p + q exactly (InvLn2N cut in two), so r = (p - kd) + q is the
    fused r whenever kd = round(p) is also round(p + q); only |p - kd| near 1/2
    can tell them apart, and those elements redo the reduction with `fma`.
    """
    p = xd * _INVLN2N_HIGH
    shifted = p + _SHIFT
    ki = shifted.view(_U64)
    head = p - (shifted - _SHIFT)
    r = head + xd * _INVLN2N_LOW
    near_tie = np.flatnonzero(np.abs(head) >= _TIE_MARGIN)
    if near_tie.size:
        ki[near_tie], r[near_tie] = _expf_reduce_exact(xd[near_tie])
    return ki, r


def _expf_fast(xd):
    """_expf_exact, with the polynomial unfused wherever the fusion provably cannot show.

    Where the double result lies too close to a binary32 rounding midpoint,
    the polynomial is redone with fmas.
    """
    c0, c1, c2 = _EXPF_POLY
    ki, r = _expf_reduce(xd)
    scale = _exp2_scale(ki)
    y = ((c0 * r + c1) * (r * r) + (c2 * r + 1.0)) * scale
    hard = _near_binary32_midpoint(y)
    if hard.size:
        y[hard] = _expf_poly_exact(r[hard], scale[hard])
    return y


def _expf_special(x):
    """Outside [log 2^-149, log 2^128]: NaN, overflow, underflow to 0 or to 2^-149 (errno cases)."""
    tiny = np.where(x < _EXPF_UNDERFLOW, np.float32(0.0), np.float32(2.0**-149))
    out = np.where(x > _EXPF_OVERFLOW, np.float32(np.inf), tiny)
    nan = np.isnan(x)
    out[nan] = _quiet(x[nan].view(_U32))
    return out


def _expf_kernel(x):
    regular = (x <= _EXPF_OVERFLOW) & (x >= _EXPF_MAY_UNDERFLOW)
    if regular.all():
        return _expf_fast(x.astype(_F64)).astype(np.float32)
    out = np.empty_like(x)
    inside = np.flatnonzero(regular)
    outside = np.flatnonzero(~regular)
    out[inside] = _expf_fast(x[inside].astype(_F64)).astype(np.float32)
    out[outside] = _expf_special(x[outside])
    return out


def expf(x) -> np.ndarray:
    """glibc expf (e_expf-fma) of binary32 values, elementwise."""
    return _elementwise(_expf_kernel, x)


# --- exp2f (never the reference's: what a fast-math expf, exp2f(x * log2 e), calls) -----

_EXP2F_BIG = _U32(0x43000000)  # |x| >= 128: e_exp2f's special-case branch
_EXP2F_UNDERFLOW = np.float32(-150.0)


def _exp2f_kernel(x):
    """e_exp2f-fma: x = k/32 + r, 2^(k/32) from the table times the fused cubic in r."""
    xd = x.astype(_F64)
    shifted = xd + _SHIFT_SCALED
    r = xd - (shifted - _SHIFT_SCALED)
    c0, c1, c2 = _EXP2F_POLY
    out = (fma(fma(c0, r, c1), r * r, fma(c2, r, 1.0)) * _exp2_scale(shifted.view(_U64))).astype(np.float32)
    bits = x.view(_U32)
    big = (bits & _U32(0x7FFFFFFF)) >= _EXP2F_BIG
    out[big & (x > 0)] = np.inf
    out[big & (x <= _EXP2F_UNDERFLOW)] = 0.0
    nan = _is_nan(bits)
    out[nan] = _quiet(bits[nan])
    return out


def exp2f(x) -> np.ndarray:
    """glibc exp2f (e_exp2f-fma) of binary32 values, elementwise."""
    return _elementwise(_exp2f_kernel, x)


# --- sinf / cosf ---------------------------------------------------------------

_TOP12_2M12 = 0x398  # abstop12(0x1p-12f)
_TOP12_PIO4 = 0x3F4  # abstop12(0x1.921FB6p-1f)
_TOP12_120 = 0x42F  # abstop12(120.0f)
_TOP12_INF = 0x7F8


def _sin_poly(x, x2):
    """sinf_poly, even quadrant, as fused in the -fma build."""
    s1, s2, s3 = _SIN_POLY
    x3 = x * x2
    head = fma(x2, s3, s2)
    x7 = x3 * x2
    return fma(head, x7, fma(x3, s1, x))


def _cos_poly(x2):
    """sinf_poly, odd quadrant (the cosine), as fused in the -fma build."""
    c0, c1, c2, c3, c4 = _COS_POLY
    x4 = x2 * x2
    low = fma(x2, c1, c0)
    high = fma(x2, c4, c3)
    x6 = x4 * x2
    return fma(high, x6, fma(x4, c2, low))


def _reduce_fast(xd):
    """reduce_fast for |x| < 120: quadrant from a truncated scaled product, r = fma(-n, pi/2, x)."""
    n = ((xd * _HPI_INV).astype(np.int32) + 0x800000) >> 24
    return fma(-n.astype(_F64), _HPI, xd), n.astype(_I64)


def _reduce_large(bits):
    """reduce_large: exact 32x96-bit product with 4/pi for |x| >= 120, in 2.62 fixed point."""
    xi = bits.astype(_U64)
    index = (xi >> _U64(26)) & _U64(15)
    mantissa = ((xi & _U64(0xFFFFFF)) | _U64(0x800000)) << ((xi >> _U64(23)) & _U64(7))
    top = (mantissa * INV_PIO4[index]) & _U64(0xFFFFFFFF)
    middle = mantissa * INV_PIO4[index + _U64(4)]
    bottom = mantissa * INV_PIO4[index + _U64(8)]
    fixed = ((bottom >> _U64(32)) | (top << _U64(32))) + middle
    n = (fixed + _U64(1 << 61)) >> _U64(62)
    fixed = fixed - (n << _U64(62))
    return fixed.view(_I64).astype(_F64) * _PI63, n.astype(_I64)


def _quadrant_result(r, n, signed_quadrant, want_cosine):
    """The polynomial quadrant n selects; sign[] and the negated cosine table go by
    `signed_quadrant`, which reduce_large's callers bump by one for negative x."""
    use_cos = ((n & 1) == 1) != want_cosine
    sign = np.where(((signed_quadrant + 1) & 2) == 0, 1.0, -1.0)
    negate_cos = (signed_quadrant & 2) != 0
    r2 = r * r
    out = np.empty(r.shape, dtype=_F64)
    sin_idx = np.flatnonzero(~use_cos)
    cos_idx = np.flatnonzero(use_cos)
    out[sin_idx] = _sin_poly(r[sin_idx] * sign[sin_idx], r2[sin_idx])
    cos = _cos_poly(r2[cos_idx])
    out[cos_idx] = np.where(negate_cos[cos_idx], -cos, cos)
    return out


def _sincos_kernel(x, want_cosine):
    bits = x.view(_U32)
    abstop = (bits >> _U32(20)) & _U32(0x7FF)
    xd = x.astype(_F64)
    out = np.empty(x.shape, dtype=_F64)

    tiny = abstop < _TOP12_2M12
    out[tiny] = 1.0 if want_cosine else xd[tiny]

    small = np.flatnonzero(~tiny & (abstop < _TOP12_PIO4))
    xs = xd[small]
    out[small] = _cos_poly(xs * xs) if want_cosine else _sin_poly(xs, xs * xs)

    medium = np.flatnonzero((abstop >= _TOP12_PIO4) & (abstop < _TOP12_120))
    r, n = _reduce_fast(xd[medium])
    out[medium] = _quadrant_result(r, n, n, want_cosine)

    large = np.flatnonzero((abstop >= _TOP12_120) & (abstop < _TOP12_INF))
    r, n = _reduce_large(bits[large])
    sign = (bits[large] >> _U32(31)).astype(_I64)
    out[large] = _quadrant_result(r, n, n + sign, want_cosine)

    result = out.astype(np.float32)
    non_finite = abstop >= _TOP12_INF
    result[non_finite] = _invalid(bits[non_finite])
    return result


def sinf(x) -> np.ndarray:
    """glibc sinf (s_sinf-fma) of binary32 values, elementwise."""
    return _elementwise(lambda block: _sincos_kernel(block, want_cosine=False), x)


def cosf(x) -> np.ndarray:
    """glibc cosf (s_cosf-fma) of binary32 values, elementwise."""
    return _elementwise(lambda block: _sincos_kernel(block, want_cosine=True), x)


# --- log2f ---------------------------------------------------------------------


def _log2_split(ix):
    """x = 2^k z with z in [OFF, 2 OFF): table index, exact z (as double) and k, from the bits."""
    tmp = ix - _U32(_LOG2_OFF)
    index = (tmp >> _U32(19)) & _U32(15)
    top = tmp & _U32(0xFF800000)
    z = (ix - top).view(np.float32).astype(_F64)
    k = (top.view(np.int32) >> 23).astype(_F64)
    return _LOG2_TAB[index, 0], _LOG2_TAB[index, 1], z, k


def _log2f_regular(ix):
    a0, a1, a2, a3 = _LOG2F_POLY
    invc, logc, z, k = _log2_split(ix)
    r = fma(z, invc, -1.0)
    y0 = logc + k
    r2 = r * r
    y = fma(a0, r2, fma(a1, r, a2))
    return fma(y, r2, fma(a3, r, y0))


def _log2f_kernel(x):
    ix = x.view(_U32).copy()
    special = (ix - _U32(0x00800000)) >= _U32(0x7F800000 - 0x00800000)
    subnormal = special & (ix != 0) & (ix < _U32(0x00800000))
    ix[subnormal] = (x[subnormal] * np.float32(2.0**23)).view(_U32) - _U32(23 << 23)
    regular = ~special | subnormal
    out = np.empty(x.shape, dtype=np.float32)
    out[regular] = _log2f_regular(ix[regular]).astype(np.float32)
    rest = special & ~subnormal
    bits = ix[rest]
    out[rest] = np.select(
        [(bits << _U32(1)) == 0, bits == _U32(0x7F800000)],
        [np.float32(-np.inf), np.float32(np.inf)],
        _invalid(bits),
    )
    return out


def log2f(x) -> np.ndarray:
    """glibc log2f (e_log2f-fma) of binary32 values, elementwise."""
    return _elementwise(_log2f_kernel, x)


# --- powf ----------------------------------------------------------------------

_POWF_SIGN_BIAS = 1 << 16  # moves the sign into bit 63 of the scale (EXP2F_TABLE_BITS + 11)
_POWF_OVERFLOW = _hex("0x1.fffffffd1d571p+6")
_POWF_BIG = int(np.float64(126.0).view(_U64)) >> 47


def _powf_log2(ix):
    """log2_inline of e_powf-fma, every a*b+c fused."""
    a0, a1, a2, a3, a4 = _POWF_LOG2_POLY
    invc, logc, z, k = _log2_split(ix)
    r = fma(z, invc, -1.0)
    y0 = logc + k
    r2 = r * r
    y = fma(a0, r, a1)
    p = fma(a2, r, a3)
    r4 = r2 * r2
    q = fma(p, r2, fma(a4, r, y0))
    return fma(y, r4, q)


def _powf_exp2(xd, sign_bias):
    """exp2_inline: plain shift-and-subtract reduction, fused polynomial."""
    c0, c1, c2 = _EXP2F_POLY
    shifted = xd + _SHIFT_SCALED
    ki = shifted.view(_U64)
    r = xd - (shifted - _SHIFT_SCALED)
    scale = _exp2_scale(ki, sign_bias)
    return fma(fma(c0, r, c1), r * r, fma(c2, r, 1.0)) * scale


def _checkint(iy):
    """0: not an integer, 1: odd integer, 2: even integer (iy: non-zero finite bits)."""
    e = ((iy >> _U32(23)) & _U32(0xFF)).astype(np.int64)
    shift = np.clip(0x7F + 23 - e, 0, 31).astype(_U32)
    fraction = (iy & ((_U32(1) << shift) - _U32(1))) != 0
    odd = (iy & (_U32(1) << shift)) != 0
    in_range = (e >= 0x7F) & (e <= 0x7F + 23)
    return np.where(e < 0x7F, 0, np.where(~in_range, 2, np.where(fraction, 0, np.where(odd, 1, 2))))


def _zeroinfnan(bits):
    return (bits * _U32(2) - _U32(1)) >= _U32(2 * 0x7F800000 - 1)


def _is_signaling(bits):
    return ((bits ^ _U32(_QUIET)) * _U32(2)) > _U32(2 * 0x7FC00000)


def _nan_sum(ix, iy):
    """x + y with a NaN operand, as SSE does it: the first NaN operand, quieted."""
    return _quiet(np.where(_is_nan(ix), ix, iy))


def _powf_y_special(ix, iy):
    """y is 0, inf or NaN."""
    two_x = ix * _U32(2)
    two_y = iy * _U32(2)
    y = iy.view(np.float32)
    below_one = two_x < _U32(2 * 0x3F800000)
    return np.select(
        [
            two_y == 0,
            ix == _U32(0x3F800000),
            (two_x > _U32(2 * 0x7F800000)) | (two_y > _U32(2 * 0x7F800000)),
            two_x == _U32(2 * 0x3F800000),
            below_one == ((iy & _U32(_SIGN)) == 0),
        ],
        [
            np.where(_is_signaling(ix), _nan_sum(ix, iy), np.float32(1.0)),
            np.where(_is_signaling(iy), _nan_sum(ix, iy), np.float32(1.0)),
            _nan_sum(ix, iy),
            np.float32(1.0),
            np.float32(0.0),
        ],
        y * y,
    )


def _powf_x_special(ix, iy):
    """x is 0, inf or NaN (y finite and non-zero)."""
    x = ix.view(np.float32)
    square = x * x
    odd_negative = ((ix & _U32(_SIGN)) != 0) & (_checkint(iy) == 1)
    square = np.where(odd_negative, -square, square)
    negative_y = (iy & _U32(_SIGN)) != 0
    return np.where(negative_y, np.float32(1.0) / square, square)


def _powf_regular(ix, y, sign_bias):
    """x finite positive (bits normalised, negative biased exponent for subnormals), y finite non-zero."""
    ylogx = y.astype(_F64) * _powf_log2(ix)
    out = _powf_exp2(ylogx, sign_bias)
    big = ((ylogx.view(_U64) >> _U64(47)) & _U64(0xFFFF)) >= _U64(_POWF_BIG)
    if big.any():
        sign = np.where(sign_bias != 0, -1.0, 1.0)
        out = np.select(
            [big & (ylogx > _POWF_OVERFLOW), big & (ylogx <= -150.0), big & (ylogx < -149.0)],
            [sign * np.inf, sign * 0.0, sign * 2.0**-149],
            out,
        )
    return out.astype(np.float32)


def _powf_flat(x, y):
    ix = x.view(_U32).copy()
    iy = y.view(_U32)
    out = np.empty(x.shape, dtype=np.float32)
    y_special = _zeroinfnan(iy)
    x_special = _zeroinfnan(ix) & ~y_special
    out[y_special] = _powf_y_special(ix[y_special], iy[y_special])
    out[x_special] = _powf_x_special(ix[x_special], iy[x_special])
    finite = ~(y_special | x_special)
    negative = finite & (ix >= _U32(_SIGN))
    yint = _checkint(iy)
    invalid = negative & (yint == 0)
    out[invalid] = _f32_from_bits(_DEFAULT_NAN)
    sign_bias = np.where(negative & (yint == 1), _U64(_POWF_SIGN_BIAS), _U64(0))
    ix[negative] &= _U32(0x7FFFFFFF)
    subnormal = finite & (ix < _U32(0x00800000))
    ix[subnormal] = ((ix[subnormal].view(np.float32) * np.float32(2.0**23)).view(_U32)) - _U32(23 << 23)
    regular = finite & ~invalid
    out[regular] = _powf_regular(ix[regular], y[regular], sign_bias[regular])
    return out


def powf(x, y) -> np.ndarray:
    """glibc powf (e_powf-fma) of binary32 values, elementwise with broadcasting."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.float32))
    with np.errstate(all="ignore"):
        flat = _powf_flat(x.ravel(), y.ravel())
    return flat.reshape(x.shape)
