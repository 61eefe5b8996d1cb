/*
 * Prelude prepended to every CSA device module (specs/kernel-abi.md).
 *
 * Everything here reproduces the CPU reference bit for bit: binary32
 * arithmetic with no contraction (every product that meets a sum is an
 * explicit round-to-nearest multiply, so --fmad=true fuses nothing),
 * bf16 rounding as the `half` crate does it, the E8M0/E4M3/E2M1 block codecs,
 * and glibc 2.36's binary32 expf/sinf/cosf/powf/log2f evaluated in double.
 * The reference runs glibc's x86-64 FMA multiarch variants, so the ports call
 * fma() exactly where that build fuses and round every other operation.
 * It also carries what the modules share: the compressor walk of stages 1-2
 * and the sparse sink attention row of stages 6-7. It is also the prelude a
 * production module directory can use as is: besides the ABI's codecs its
 * names are csa_round_*, csa_glibc_* and the like, never a name a module
 * defines for itself (the CUDA provider's compression module has its own
 * csa_bf16_bits and csa_bf16).
 */

#define CSA_NEG_INF __uint_as_float(0xff800000u)
#define CSA_POS_INF __uint_as_float(0x7f800000u)

/* A product that a sum or difference consumes: __fmul_rn / __dmul_rn, which
 * CUDA never contracts, so the module rounds as the reference under NVRTC's
 * default --fmad=true (the production build) as under --fmad=false.
 * -DCSA_CONTRACTIBLE makes them plain products again, the contraction
 * variant a production build of the unguarded source shows. */
#ifdef CSA_CONTRACTIBLE
#define csa_mul(a, b) ((a) * (b))
#define csa_dmul(a, b) ((a) * (b))
#else
#define csa_mul(a, b) __fmul_rn(a, b)
#define csa_dmul(a, b) __dmul_rn(a, b)
#endif

/* ---- probes (specs/kernel-abi.md, "Probes") ---------------------------
 * CSA_PROBE(name, pointer, count) copies `count` elements of a sub-step's
 * output into the runner's probe log, so explain observes the intermediate
 * instead of inferring it. Without -DCSA_PROBES it is nothing at all; with
 * it, the runner points csa_probe_log at a log before each launch (null: the
 * probe records nothing). The log is 32-bit words: [0] words used, [1] words
 * of room, [2] entries dropped for want of room, [3] the layout version,
 * then the entries, each [0] its words, [1..6] the name (24 bytes, NUL
 * padded), [7] blockIdx.x, [8] threadIdx.x, [9] count, [10] element bytes,
 * then the elements' bytes. A thread's entries appear in its program order. */
#define CSA_PROBE_LOG_HEADER 4
#define CSA_PROBE_ENTRY_HEADER 11
#define CSA_PROBE_NAME_BYTES 24
#ifdef CSA_PROBES
__device__ unsigned int* csa_probe_log;

__device__ void csa_probe_write(const char* name, const void* data, unsigned int count, unsigned int size)
{
    unsigned int* log = csa_probe_log;
    if (log == 0) return;
    const unsigned long long bytes = (unsigned long long)count * size;
    if (bytes > 4ull * log[1]) {  // larger than the whole log (a garbage count): dropped, the cursor untouched
        atomicAdd(&log[2], 1u);
        return;
    }
    const unsigned int words = CSA_PROBE_ENTRY_HEADER + (unsigned int)((bytes + 3u) / 4u);
    const unsigned int at = atomicAdd(&log[0], words);
    if ((unsigned long long)at + words > log[1]) {
        atomicAdd(&log[2], 1u);
        return;
    }
    unsigned int* entry = log + CSA_PROBE_LOG_HEADER + at;
    entry[0] = words;
    unsigned char* label = (unsigned char*)(entry + 1);
    int i = 0;
    for (; i < CSA_PROBE_NAME_BYTES && name[i] != 0; ++i) label[i] = (unsigned char)name[i];
    for (; i < CSA_PROBE_NAME_BYTES; ++i) label[i] = 0;
    entry[7] = blockIdx.x;
    entry[8] = threadIdx.x;
    entry[9] = count;
    entry[10] = size;
    const unsigned char* from = (const unsigned char*)data;
    unsigned char* to = (unsigned char*)(entry + CSA_PROBE_ENTRY_HEADER);
    for (unsigned long long b = 0; b < bytes; ++b) to[b] = from[b];
}
#define CSA_PROBE(name, pointer, count) \
    csa_probe_write(name, pointer, (unsigned int)(count), (unsigned int)sizeof(*(pointer)))
#else
#define CSA_PROBE(name, pointer, count) ((void)0)
#endif

__device__ __forceinline__ unsigned long long csa_double_bits(double x)
{
    return (unsigned long long)__double_as_longlong(x);
}

__device__ __forceinline__ double csa_bits_double(unsigned long long bits)
{
    return __longlong_as_double((long long)bits);
}

/* ---- glibc binary32 libm, FMA build ---------------------------------- */

/* 2^(i/32) as double bits minus i << 47, shared by expf and powf. */
__device__ const unsigned long long csa_exp2_table[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};

/* (1/c, log2 c) for the 16 subintervals of [0x3f330000, 2 * 0x3f330000). */
__device__ const double csa_log2_table[16][2] = {
    {0x1.661ec79f8f3bep+0, -0x1.efec65b963019p-2}, {0x1.571ed4aaf883dp+0, -0x1.b0b6832d4fca4p-2},
    {0x1.49539f0f010bp+0, -0x1.7418b0a1fb77bp-2},  {0x1.3c995b0b80385p+0, -0x1.39de91a6dcf7bp-2},
    {0x1.30d190c8864a5p+0, -0x1.01d9bf3f2b631p-2}, {0x1.25e227b0b8eap+0, -0x1.97c1d1b3b7afp-3},
    {0x1.1bb4a4a1a343fp+0, -0x1.2f9e393af3c9fp-3}, {0x1.12358f08ae5bap+0, -0x1.960cbbf788d5cp-4},
    {0x1.0953f419900a7p+0, -0x1.a6f9db6475fcep-5}, {0x1p+0, 0x0p+0},
    {0x1.e608cfd9a47acp-1, 0x1.338ca9f24f53dp-4},  {0x1.ca4b31f026aap-1, 0x1.476a9543891bap-3},
    {0x1.b2036576afce6p-1, 0x1.e840b4ac4e4d2p-3},  {0x1.9c2d163a1aa2dp-1, 0x1.40645f0c6651cp-2},
    {0x1.886e6037841edp-1, 0x1.88e9c2c1b9ff8p-2},  {0x1.767dcf5534862p-1, 0x1.ce0a44eb17bccp-2},
};

/* 4/pi, 8 new bits per entry, for the large-argument sincosf reduction. */
__device__ const unsigned int csa_inv_pio4[24] = {
    0xa2u,        0xa2f9u,      0xa2f983u,    0xa2f9836eu, 0xf9836e4eu, 0x836e4e44u,
    0x6e4e4415u,  0x4e441529u,  0x441529fcu,  0x1529fc27u, 0x29fc2757u, 0xfc2757d1u,
    0x2757d1f5u,  0x57d1f534u,  0xd1f534ddu,  0xf534ddc0u, 0x34ddc0dbu, 0xddc0db62u,
    0xc0db6295u,  0xdb629599u,  0x6295993cu,  0x95993c43u, 0x993c4390u, 0x3c439041u,
};

/* 2^(k/32 + r/32) for the already reduced r, with the scale bits of k folded
 * into the table entry; shared tail of expf (scaled polynomial) and powf. */
__device__ __forceinline__ double csa_exp2_tail(
    double r, unsigned long long k, double c0, double c1, double c2)
{
    const double scale = csa_bits_double(csa_exp2_table[k & 31u] + (k << 47));
    const double high = fma(c0, r, c1);
    const double r2 = r * r;
    const double low = fma(c2, r, 1.0);
    return fma(high, r2, low) * scale;
}

__device__ float csa_glibc_expf(float x)
{
    const unsigned int top = (__float_as_uint(x) >> 20) & 0x7ffu;
    if (top >= 0x42bu) {
        if (__float_as_uint(x) == 0xff800000u) return 0.0f;
        if (top >= 0x7f8u) return x + x;
        if (x > 0x1.62e42ep6f) return CSA_POS_INF;
        if (x < -0x1.9fe368p6f) return 0.0f;
        if (x < -0x1.9d1d9ep6f) return __uint_as_float(1u);
    }
    const double inv_ln2_32 = 0x1.71547652b82fep+5;
    const double shift = 0x1.8p+52;
    const double xd = (double)x;
    const double shifted = fma(inv_ln2_32, xd, shift);
    const double k = shifted - shift;
    const double r = fma(inv_ln2_32, xd, -k);
    const double y = csa_exp2_tail(r, csa_double_bits(shifted),
        0x1.c6af84b912394p-20, 0x1.ebfce50fac4f3p-13, 0x1.62e42ff0c52d6p-6);
    return (float)y;
}

__device__ float csa_glibc_log2f(float x)
{
    unsigned int ix = __float_as_uint(x);
    if (ix == 0x3f800000u) return 0.0f;
    if (ix - 0x00800000u >= 0x7f800000u - 0x00800000u) {
        if (ix * 2u == 0u) return CSA_NEG_INF;
        if (ix == 0x7f800000u) return x;
        if ((ix & 0x80000000u) || ix * 2u >= 0xff000000u) return __uint_as_float(0x7fc00000u);
        ix = __float_as_uint(x * 0x1p23f) - (23u << 23);
    }
    const unsigned int offset = ix - 0x3f330000u;
    const int sub = (int)((offset >> 19) & 15u);
    const int k = (int)offset >> 23;
    const double z = (double)__uint_as_float(ix - (offset & 0xff800000u));
    const double r = fma(z, csa_log2_table[sub][0], -1.0);
    const double y0 = csa_log2_table[sub][1] + (double)k;
    const double r2 = r * r;
    double y = fma(-0x1.712b6f70a7e4dp-2, r2, fma(0x1.ecabf496832ep-2, r, -0x1.715479ffae3dep-1));
    const double p = fma(0x1.715475f35c8b8p0, r, y0);
    y = fma(y, r2, p);
    return (float)y;
}

/* log2 of a positive normalised binary32 pattern, powf's 5th-order variant. */
__device__ double csa_powf_log2(unsigned int ix)
{
    const unsigned int offset = ix - 0x3f330000u;
    const int sub = (int)((offset >> 19) & 15u);
    const unsigned int top = offset & 0xff800000u;
    const int k = (int)top >> 23;
    const double z = (double)__uint_as_float(ix - top);
    const double r = fma(z, csa_log2_table[sub][0], -1.0);
    const double y0 = csa_log2_table[sub][1] + (double)k;
    const double y = fma(0x1.27616c9496e0bp-2, r, -0x1.71969a075c67ap-2);
    const double p = fma(0x1.ec70a6ca7baddp-2, r, -0x1.7154748bef6c8p-1);
    const double r2 = r * r;
    double q = fma(0x1.71547652ab82bp0, r, y0);
    const double r4 = r2 * r2;
    q = fma(p, r2, q);
    return fma(y, r4, q);
}

/* 0 when the pattern is not an integer, 1 for odd, 2 for even integers. */
__device__ __forceinline__ int csa_float_parity(unsigned int iy)
{
    const int e = (int)((iy >> 23) & 0xffu);
    if (e < 0x7f) return 0;
    if (e > 0x7f + 23) return 2;
    if (iy & ((1u << (0x7f + 23 - e)) - 1u)) return 0;
    return (iy & (1u << (0x7f + 23 - e))) ? 1 : 2;
}

__device__ __forceinline__ int csa_zero_inf_nan(unsigned int i)
{
    return 2u * i - 1u >= 2u * 0x7f800000u - 1u;
}

__device__ float csa_glibc_powf(float x, float y)
{
    unsigned int ix = __float_as_uint(x);
    const unsigned int iy = __float_as_uint(y);
    unsigned long long sign_bias = 0u;
    if (ix - 0x00800000u >= 0x7f800000u - 0x00800000u || csa_zero_inf_nan(iy)) {
        if (csa_zero_inf_nan(iy)) {
            if (2u * iy == 0u) return 1.0f;
            if (ix == 0x3f800000u) return 1.0f;
            if (2u * ix > 2u * 0x7f800000u || 2u * iy > 2u * 0x7f800000u) return x + y;
            if (2u * ix == 2u * 0x3f800000u) return 1.0f;
            if ((2u * ix < 2u * 0x3f800000u) == !(iy & 0x80000000u)) return 0.0f;
            return y * y;
        }
        if (csa_zero_inf_nan(ix)) {
            float square = x * x;
            if ((ix & 0x80000000u) && csa_float_parity(iy) == 1) square = -square;
            return (iy & 0x80000000u) ? 1.0f / square : square;
        }
        if (ix & 0x80000000u) {
            const int parity = csa_float_parity(iy);
            if (parity == 0) return __uint_as_float(0x7fc00000u);
            if (parity == 1) sign_bias = 1u << 16;
            ix &= 0x7fffffffu;
        }
        if (ix < 0x00800000u) ix = (__float_as_uint(x * 0x1p23f) & 0x7fffffffu) - (23u << 23);
    }
    const double ylogx = csa_dmul((double)y, csa_powf_log2(ix));
    const float signed_one = sign_bias ? -1.0f : 1.0f;
    if (((csa_double_bits(ylogx) >> 47) & 0xffffu) >= (csa_double_bits(126.0) >> 47)) {
        if (ylogx > 0x1.fffffffd1d571p+6) return signed_one * CSA_POS_INF;
        if (ylogx <= -150.0) return signed_one * 0.0f;
        if (ylogx < -149.0) return signed_one * __uint_as_float(1u);
    }
    const double shift = 0x1.8p+47;
    const double shifted = ylogx + shift;
    const unsigned long long k = csa_double_bits(shifted);
    const double r = ylogx - (shifted - shift);
    const double scale = csa_bits_double(csa_exp2_table[k & 31u] + ((k + sign_bias) << 47));
    const double high = fma(0x1.c6af84b912394p-5, r, 0x1.ebfce50fac4f3p-3);
    const double r2 = r * r;
    const double low = fma(0x1.62e42ff0c52d6p-1, r, 1.0);
    return (float)(fma(high, r2, low) * scale);
}

/* sin (odd quadrant = 0) or cos polynomial on the reduced argument.  `flip`
 * selects the table whose cosine coefficients are negated (quadrants 2, 3). */
__device__ float csa_sincos_poly(double x, double x2, int use_cosine, int flip)
{
    const double sign = flip ? -1.0 : 1.0;
    if (!use_cosine) {
        const double x3 = x * x2;
        const double s23 = fma(x2, -0x1.994eb3774cf24p-13, 0x1.1107605230bc4p-7);
        const double x7 = x2 * x3;
        const double s = fma(x3, -0x1.555545995a603p-3, x);
        return (float)fma(s23, x7, s);
    }
    const double x4 = x2 * x2;
    const double c01 = fma(x2, sign * -0x1.ffffffd0c621cp-2, sign);
    const double c34 = fma(x2, sign * 0x1.99343027bf8c3p-16, sign * -0x1.6c087e89a359dp-10);
    const double x6 = x2 * x4;
    const double c = fma(x4, sign * 0x1.55553e1068f19p-5, c01);
    return (float)fma(c34, x6, c);
}

/* Quadrant n and reduced argument of |x| >= 120 from 4/pi to 192 bits. */
__device__ double csa_reduce_large(unsigned int xi, int* quadrant)
{
    const unsigned int* table = &csa_inv_pio4[(xi >> 26) & 15u];
    const int shift = (int)((xi >> 23) & 7u);
    const unsigned int mantissa = ((xi & 0xffffffu) | 0x800000u) << shift;
    unsigned long long low = (unsigned long long)(unsigned int)(mantissa * table[0]);
    const unsigned long long middle = (unsigned long long)mantissa * table[4];
    const unsigned long long high = (unsigned long long)mantissa * table[8];
    low = ((high >> 32) | (low << 32)) + middle;
    const unsigned long long n = (low + (1ull << 61)) >> 62;
    low -= n << 62;
    *quadrant = (int)n;
    return (double)(long long)low * 0x1.921FB54442D18p-62;
}

/* Shared body of sinf (want_cosine = 0) and cosf (want_cosine = 1). */
__device__ float csa_sincosf(float y, int want_cosine)
{
    const unsigned int top = (__float_as_uint(y) >> 20) & 0x7ffu;
    double x = (double)y;
    int n;
    int sign_quadrant;
    if (top < 0x3f4u) {
        if (top < 0x398u) return want_cosine ? 1.0f : y;
        return csa_sincos_poly(x, x * x, want_cosine, 0);
    }
    if (top < 0x42fu) {
        n = ((int)(x * 0x1.45F306DC9C883p+23) + 0x800000) >> 24;
        x = fma(-(double)n, 0x1.921FB54442D18p0, x);
        sign_quadrant = n;
    } else if (top < 0x7f8u) {
        x = csa_reduce_large(__float_as_uint(y), &n);
        sign_quadrant = n + (int)(__float_as_uint(y) >> 31);
    } else {
        return __uint_as_float(0x7fc00000u);
    }
    const double x2 = x * x;
    const int odd = (n ^ want_cosine) & 1;
    const double signed_x = ((sign_quadrant + 1) & 2) ? -x : x;
    return csa_sincos_poly(signed_x, x2, odd, sign_quadrant & 2);
}

__device__ __forceinline__ float csa_glibc_sinf(float x) { return csa_sincosf(x, 0); }
__device__ __forceinline__ float csa_glibc_cosf(float x) { return csa_sincosf(x, 1); }

/* ---- numerics variants (compile-time switches) ------------------------
 * -DCSA_LIBM_PLATFORM: the platform's expf/sinf/cosf/powf/log2f instead of
 * the glibc ports (CUDA's libm on the device). -DCSA_BLOCK_SCALE_PLATFORM_LOG2F:
 * only the E8M0 block scale takes the platform's log2f. --fmad=true and
 * --ftz=true need no switch: they are NVRTC options. The host emulation
 * defines CSA_PLATFORM_LIBM and its own csa_platform_* stand-ins first. */
#ifndef CSA_PLATFORM_LIBM
#define csa_platform_expf expf
#define csa_platform_sinf sinf
#define csa_platform_cosf cosf
#define csa_platform_powf powf
#define csa_platform_log2f log2f
#endif

#ifdef CSA_LIBM_PLATFORM
__device__ __forceinline__ float csa_expf(float x) { return csa_platform_expf(x); }
__device__ __forceinline__ float csa_sinf(float x) { return csa_platform_sinf(x); }
__device__ __forceinline__ float csa_cosf(float x) { return csa_platform_cosf(x); }
__device__ __forceinline__ float csa_powf(float x, float y) { return csa_platform_powf(x, y); }
__device__ __forceinline__ float csa_log2f(float x) { return csa_platform_log2f(x); }
#else
__device__ __forceinline__ float csa_expf(float x) { return csa_glibc_expf(x); }
__device__ __forceinline__ float csa_sinf(float x) { return csa_glibc_sinf(x); }
__device__ __forceinline__ float csa_cosf(float x) { return csa_glibc_cosf(x); }
__device__ __forceinline__ float csa_powf(float x, float y) { return csa_glibc_powf(x, y); }
__device__ __forceinline__ float csa_log2f(float x) { return csa_glibc_log2f(x); }
#endif

#ifdef CSA_BLOCK_SCALE_PLATFORM_LOG2F
#define csa_block_scale_log2f csa_platform_log2f
#else
#define csa_block_scale_log2f csa_log2f
#endif

/* ---- bfloat16 (half crate) -------------------------------------------- */

__device__ __forceinline__ unsigned short csa_round_bf16_bits(float x)
{
    const unsigned int bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((bits >> 16) | 0x40u);
    const unsigned int lsb = (bits >> 16) & 1u;
    return (unsigned short)((bits + 0x7fffu + lsb) >> 16);
}

__device__ __forceinline__ float csa_bf16_from_bits(unsigned short bits)
{
    return __uint_as_float((unsigned int)bits << 16);
}

__device__ __forceinline__ float csa_round_bf16(float x)
{
    return csa_bf16_from_bits(csa_round_bf16_bits(x));
}

/* ---- E8M0 / E4M3FN / E2M1 block codecs -------------------------------- */

__device__ __forceinline__ float e8m0_scale(unsigned char e)
{
    if (e == 0) return __uint_as_float(0x00400000u);
    if (e == 0xff) return __uint_as_float(0x7fc00000u);
    return __uint_as_float((unsigned int)e << 23);
}

__device__ __forceinline__ float decode_e4m3fn(unsigned char code)
{
    const int exponent = (code >> 3) & 15;
    const int mantissa = code & 7;
    if (exponent == 15 && mantissa == 7) return __uint_as_float(0x7fc00000u);
    const float magnitude = exponent == 0
        ? (float)mantissa * 0x1p-9f
        : __uint_as_float((unsigned int)(exponent + 120) << 23 | (unsigned int)mantissa << 20);
    return (code & 0x80) ? -magnitude : magnitude;
}

__device__ __forceinline__ float decode_e2m1(unsigned char code)
{
    const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float value = magnitude[code & 7];
    return (code & 8) ? -value : value;
}

/* E4M3FN code of a value already clamped to [-448, 448]: sign from the sign
 * bit, 2^-9 subnormal steps, round half to even on the binary32 pattern. */
__device__ __forceinline__ unsigned char csa_encode_e4m3fn(float value)
{
    const unsigned int bits = __float_as_uint(value);
    const unsigned int sign = (bits >> 24) & 0x80u;
    const float magnitude = fabsf(value);
    unsigned int code;
    if (magnitude < 0x1p-6f) {
        code = (unsigned int)rintf(magnitude * 512.0f);
    } else {
        const unsigned int mbits = __float_as_uint(magnitude);
        code = ((mbits + 0x7ffffu + ((mbits >> 20) & 1u)) >> 20) - (120u << 3);
    }
    return (unsigned char)(sign | code);
}

/* E2M1 code: nearest table value, midpoints to the even code, and zero
 * magnitudes always as code 0 (the reference's first match), never -0. */
__device__ __forceinline__ unsigned char csa_encode_e2m1(float value)
{
    const float magnitude = fabsf(value);
    unsigned int code = 0;
    code += magnitude > 0.25f;
    code += magnitude >= 0.75f;
    code += magnitude > 1.25f;
    code += magnitude >= 1.75f;
    code += magnitude > 2.5f;
    code += magnitude >= 3.5f;
    code += magnitude > 5.0f;
    if (code != 0 && (__float_as_uint(value) & 0x80000000u)) code |= 8u;
    return (unsigned char)code;
}

/* E8M0 exponent ceil(log2f(amax / target)), amax floored as the reference does. */
__device__ __forceinline__ int csa_block_power(const float* in, int count, float floor_amax, float target)
{
    float amax = floor_amax;
    for (int i = 0; i < count; ++i) amax = fmaxf(amax, fabsf(in[i]));
    return (int)ceilf(csa_block_scale_log2f(amax / target));
}

__device__ __forceinline__ float csa_power_of_two(int power)
{
    return __uint_as_float((unsigned int)(power + 127) << 23);
}

__device__ void quantize_fp8_e4m3_block(const float* in, unsigned char* scale, unsigned char* packed)
{
    const int power = csa_block_power(in, 64, 1.0e-4f, 448.0f);
    const float block_scale = csa_power_of_two(power);
    *scale = (unsigned char)(power + 127);
    for (int i = 0; i < 64; ++i)
        packed[i] = csa_encode_e4m3fn(fminf(fmaxf(in[i] / block_scale, -448.0f), 448.0f));
    CSA_PROBE("fp8_scale", scale, 1);
    CSA_PROBE("fp8_codes", packed, 64);
}

__device__ void quantize_fp4_e2m1_block(const float* in, unsigned char* scale, unsigned char* packed)
{
    const int power = csa_block_power(in, 32, 6.0f * 0x1p-126f, 6.0f);
    const float block_scale = csa_power_of_two(power);
    *scale = (unsigned char)(power + 127);
    for (int i = 0; i < 16; ++i) {
        const unsigned char low = csa_encode_e2m1(fminf(fmaxf(in[2 * i] / block_scale, -6.0f), 6.0f));
        const unsigned char high = csa_encode_e2m1(fminf(fmaxf(in[2 * i + 1] / block_scale, -6.0f), 6.0f));
        packed[i] = (unsigned char)(low | (high << 4));
    }
    CSA_PROBE("fp4_scale", scale, 1);
    CSA_PROBE("fp4_codes", packed, 16);
}

/* ---- record finalization shared by the compressor modules ------------- */

/* Compressed RoPE of the reference: base 160000, ramp over pairs 15..25,
 * factor 16, angle f32(position) * frequency, each rotated value bf16. */
__device__ void csa_compressed_rope(float* tail, int rope_dim, long long position)
{
    const float where = (float)position;
    for (int pair = 0; 2 * pair < rope_dim; ++pair) {
        const float ramp = fminf(fmaxf(((float)pair - 15.0f) / 10.0f, 0.0f), 1.0f);
        const float base = csa_powf(160000.0f, -(float)(2 * pair) / (float)rope_dim);
        const float frequency = csa_mul(base, 1.0f - ramp) + csa_mul(base / 16.0f, ramp);
        const float angle = where * frequency;
        const float sine = csa_sinf(angle);
        const float cosine = csa_cosf(angle);
        const float real = tail[2 * pair];
        const float imaginary = tail[2 * pair + 1];
        tail[2 * pair] = csa_round_bf16(csa_mul(real, cosine) - csa_mul(imaginary, sine));
        tail[2 * pair + 1] = csa_round_bf16(csa_mul(real, sine) + csa_mul(imaginary, cosine));
    }
    CSA_PROBE("rope", tail, rope_dim);
}

/* bf16, sequential square sum, inv = 1/sqrt(sum/dim + 1e-6), bf16(x*inv*w). */
__device__ void csa_rms_normalize(float* record, const float* norm, int dim)
{
    float squares = 0.0f;
    for (int i = 0; i < dim; ++i) {
        record[i] = csa_round_bf16(record[i]);
        squares = squares + csa_mul(record[i], record[i]);
    }
    CSA_PROBE("bf16", record, dim);
    const float inverse_rms = 1.0f / sqrtf(squares / (float)dim + 1.0e-6f);
    for (int i = 0; i < dim; ++i) record[i] = csa_round_bf16(record[i] * inverse_rms * norm[i]);
    CSA_PROBE("rmsnorm", record, dim);
}

/* Unnormalised butterfly (spans 1, 2, 4, ...) then bf16(x * (1/sqrt(n))). */
__device__ void csa_hadamard_bf16(float* values, int width)
{
    for (int span = 1; span < width; span *= 2)
        for (int first = 0; first < width; first += 2 * span)
            for (int lane = first; lane < first + span; ++lane) {
                const float a = values[lane];
                const float b = values[lane + span];
                values[lane] = a + b;
                values[lane + span] = a - b;
            }
    const float normalizer = 1.0f / sqrtf((float)width);
    for (int i = 0; i < width; ++i) values[i] = csa_round_bf16(values[i] * normalizer);
    CSA_PROBE("hadamard", values, width);
}

/* One softmax-pooled output dimension: f32::max over the candidate scores,
 * then ascending sums of glibc-expf weights, skipping -inf candidates. */
__device__ float csa_pool_dimension(const float* scores, const float* values, int candidates, long long stride)
{
    float maximum = CSA_NEG_INF;
    for (int c = 0; c < candidates; ++c) maximum = fmaxf(maximum, scores[c * stride]);
    float numerator = 0.0f;
    float denominator = 0.0f;
    for (int c = 0; c < candidates; ++c) {
        const float score = scores[c * stride];
        if (score == CSA_NEG_INF) continue;
        const float weight = csa_expf(score - maximum);
        numerator = numerator + csa_mul(weight, values[c * stride]);
        denominator = denominator + weight;
    }
    return numerator / denominator;
}

/* The 583-byte hybrid record; the head of `record` becomes its dequantized
 * (logical) value, which is what attention reads. */
__device__ void csa_store_fp8_record(float* record, int dim, int rope_dim, unsigned char* out)
{
    const int blocks = (dim - rope_dim) / 64;
    for (int block = 0; block < blocks; ++block) {
        unsigned char* dst = out + 65 * block;
        quantize_fp8_e4m3_block(record + 64 * block, dst, dst + 1);
        const float block_scale = e8m0_scale(dst[0]);
        for (int i = 0; i < 64; ++i) record[64 * block + i] = decode_e4m3fn(dst[1 + i]) * block_scale;
    }
    unsigned char* tail = out + 65 * blocks;
    for (int i = 0; i < rope_dim; ++i) {
        const unsigned short bits = csa_round_bf16_bits(record[dim - rope_dim + i]);
        tail[2 * i] = (unsigned char)(bits & 0xffu);
        tail[2 * i + 1] = (unsigned char)(bits >> 8);
    }
}

/* Logical value of dimension d of a packed 583-byte hybrid record. */
__device__ __forceinline__ float csa_fp8_record_value(const unsigned char* packed, int d)
{
    if (d < 7 * 64) {
        const unsigned char* block = packed + 65 * (d / 64);
        return decode_e4m3fn(block[1 + d % 64]) * e8m0_scale(block[0]);
    }
    const int i = d - 448;
    return csa_bf16_from_bits((unsigned short)(packed[455 + 2 * i] | (packed[456 + 2 * i] << 8)));
}

/* ---- the compressor walk shared by the compression modules ------------ */

/* A carry slot is [kv | score], `width` floats each (carry f32[B,slots,2,W]);
 * a cleared slot holds kv 0 and score -inf, so it takes no softmax mass. */
__device__ void csa_clear_slots(float* slots, long long count, int width)
{
    for (long long i = 0; i < count; ++i) slots[i] = (i / width) % 2 ? CSA_NEG_INF : 0.0f;
}

/* The past records into the present cache, spread over the block's threads
 * (a declared wider block, or the seed's single thread): 153 MB at 2^20
 * tokens, so 8 bytes at a time where both rows are 8-byte aligned (row 0
 * always is), then the odd bytes. */
__device__ void csa_copy_bytes(unsigned char* to, const unsigned char* from, long long count)
{
    const long long thread = (long long)threadIdx.x;
    const long long threads = (long long)blockDim.x;
    long long copied = 0;
    if ((((unsigned long long)to | (unsigned long long)from) & 7ULL) == 0) {
        const unsigned long long* source = (const unsigned long long*)from;
        unsigned long long* target = (unsigned long long*)to;
        for (long long word = thread; word < count / 8; word += threads) target[word] = source[word];
        copied = count / 8 * 8;
    }
    for (long long i = copied + thread; i < count; i += threads) to[i] = from[i];
}

/* Stages 1 and 2 for one batch row: the block's threads copy the complete
 * past records, then thread 0 walks the step in the reference's order.
 * The past carry and the past records are copied to the present
 * buffers (a stream's first step starts from a cleared carry); position p
 * writes slot p mod 128 (ratio 128) or 4 + p mod 4 of the 8-slot overlap
 * carry, whose kv holds two channels of `dim` (ratio 4), with score
 * gate + ape.  At a block end every dimension is softmax-pooled over the
 * carry (ratio 4: slots 0..3 channel 0, the previous block, then slots 4..7
 * channel 1), `finalize(pooled, record, block_start)` turns the pooled vector
 * into the block's record, and the carry is cleared (ratio 128) or slots
 * 4..7 rotate into 0..3 and are cleared (ratio 4). */
template <typename Finalize>
__device__ void csa_compress_row(const float* kv, const float* gate, const float* ape,
    const float* past_carry, const unsigned char* past_cache, float* carry, unsigned char* cache,
    int batch, int sequence, int dim, int ratio, long long record_bytes,
    int past_row_records, int cache_row_records, const long long* total_ptr, Finalize finalize)
{
    const int b = (int)blockIdx.x;
    if (b >= batch) return;
    const bool overlap = ratio == 4;
    const int width = overlap ? 2 * dim : dim;
    const int slots = overlap ? 2 * ratio : ratio;
    const long long slot_stride = 2LL * width;
    const long long block_floats = ratio * slot_stride;
    const long long carry_floats = slots * slot_stride;
    const long long first_position = *total_ptr - (long long)sequence;
    int written = (int)(first_position / ratio);
    float* state = carry + (long long)b * carry_floats;
    unsigned char* records = cache + (long long)b * cache_row_records * record_bytes;
    const float* past_state = past_carry + (long long)b * carry_floats;
    const unsigned char* past_records = past_cache + (long long)b * past_row_records * record_bytes;
    csa_copy_bytes(records, past_records, written * record_bytes);
    if (threadIdx.x != 0) return;  // the walk writes records from `written` on, none the copy writes
    for (long long i = 0; i < carry_floats; ++i) state[i] = past_state[i];
    if (first_position == 0) csa_clear_slots(state, carry_floats, width);

    float* current = overlap ? state + block_floats : state;
    for (int token = 0; token < sequence; ++token) {
        const long long position = first_position + token;
        const int phase = (int)(position % ratio);
        const long long row = (long long)b * sequence + token;
        for (int d = 0; d < width; ++d) {
            current[phase * slot_stride + d] = kv[row * width + d];
            current[phase * slot_stride + width + d] = gate[row * width + d] + ape[(long long)phase * width + d];
        }
        if ((position + 1) % ratio != 0) continue;

        for (int c = 0; c < slots; ++c)  // each candidate slot's gate + APE scores, as the pool reads them
            CSA_PROBE("pool_scores", state + c * slot_stride + width + (overlap && c >= ratio ? dim : 0), dim);
        float pooled[512];
        for (int i = 0; i < dim; ++i) {
            float scores[128];
            float values[128];
            for (int c = 0; c < slots; ++c) {
                const long long at = c * slot_stride + (overlap && c >= ratio ? dim + i : i);
                values[c] = state[at];
                scores[c] = state[at + width];
            }
            pooled[i] = csa_pool_dimension(scores, values, slots, 1);
        }
        CSA_PROBE("pooled", pooled, dim);
        finalize(pooled, records + (long long)written * record_bytes, position + 1 - ratio);
        ++written;
        if (overlap)
            for (long long i = 0; i < block_floats; ++i) state[i] = state[block_floats + i];
        csa_clear_slots(current, block_floats, width);
    }
}

/* ---- sparse sink attention shared by the attention modules ------------ */

/* One attention launch's tensors and sizes, as the entry received them. */
struct CsaAttention {
    const float* query;
    const float* current_kv;
    const unsigned char* compressed;
    const float* sink;
    const float* bias;
    float* output;
    float* scores;
    int sequence, heads, dim, current_kv_len;
    const long long* total_ptr;
    int compressed_capacity, scratch_stride, cache_fp8;
    int bias_present, bias_b, bias_h, bias_s, bias_k;
    float scale;
};

/* The (batch, query, head) row of block `row`, with its dense window: the
 * last 128 positions up to the query, or the whole current_kv (at most 128)
 * on a stream's first step, never before current_kv's first position. */
struct CsaAttentionRow {
    int row, b, s, head, dense;
    long long position, kv_base, dense_start;
};

__device__ CsaAttentionRow csa_attention_row(const CsaAttention& a, int row)
{
    CsaAttentionRow r;
    r.row = row;
    r.head = row % a.heads;
    r.s = (row / a.heads) % a.sequence;
    r.b = row / (a.heads * a.sequence);
    const long long total = a.total_ptr[0];
    const long long first_position = total - (long long)a.sequence;
    r.position = first_position + r.s;
    r.kv_base = total - (long long)a.current_kv_len;
    r.dense = first_position == 0 ? min(a.current_kv_len, 128) : 128;
    const long long window = r.position + 1 - 128 > 0 ? r.position + 1 - 128 : 0;
    r.dense_start = r.kv_base > window ? r.kv_base : window;
    return r;
}

/* Where a candidate slot's values live: a current_kv row, else a compressed record. */
struct CsaCandidate {
    long long dense_row, record_row;
};

/* Dense slot c: valid at or before the query's position and inside current_kv. */
__device__ bool csa_dense_candidate(const CsaAttention& a, const CsaAttentionRow& r, int c, CsaCandidate* where)
{
    const long long absolute = r.dense_start + c;
    if (absolute > r.position || absolute - r.kv_base >= a.current_kv_len) return false;
    where->dense_row = (long long)r.b * a.current_kv_len + (absolute - r.kv_base);
    return true;
}

__device__ __forceinline__ float csa_candidate_value(const CsaAttention& a, const CsaCandidate& where, int d)
{
    if (where.dense_row >= 0) return a.current_kv[where.dense_row * a.dim + d];
    if (a.cache_fp8) return csa_fp8_record_value(a.compressed + where.record_row * 583, d);
    return ((const float*)a.compressed)[where.record_row * a.dim + d];
}

/* Stages 6-7 of one row, with `locate(c, &where)` naming candidate slot c's
 * values or rejecting the slot (-inf in the row's scratch).  The block's
 * threads score the slots (each dot ascending, times scale, plus the
 * broadcast bias); the row maximum is f32::max over them, whose value no
 * order changes (a +0/-0 pick leaves every x - max, hence every weight, as
 * it is).  The glibc-expf weights are computed a tile at a time by the
 * threads and summed in ascending slot order by thread 0, plus the
 * logit-only sink; the probabilities of a tile are computed once, and each
 * thread accumulates its output dimensions over the slots in order.  No
 * valid slot: zeros. */
#define CSA_ATTENTION_TILE 256
#define CSA_ATTENTION_DIMS 4
#define CSA_MAX_BLOCK 1024

template <typename Locate>
__device__ void csa_sink_attention(const CsaAttention& a, const CsaAttentionRow& r, int slots, Locate locate)
{
    const float* q = a.query + (long long)r.row * a.dim;
    float* slot_scores = a.scores + (long long)r.row * a.scratch_stride;
    const int thread = (int)threadIdx.x;
    const int threads = (int)blockDim.x;
    __shared__ float thread_maximum[CSA_MAX_BLOCK];
    __shared__ float tile_weight[CSA_ATTENTION_TILE];
    __shared__ CsaCandidate tile_where[CSA_ATTENTION_TILE];
    __shared__ bool tile_valid[CSA_ATTENTION_TILE];
    __shared__ float shared_maximum;
    __shared__ float shared_denominator;
    if (threadIdx.x == 0u)
        for (int c = 0; c < a.scratch_stride; ++c) slot_scores[c] = CSA_NEG_INF;
    __syncthreads();  // the scratch is cleared before any slot's logit lands in it

    float maximum = CSA_NEG_INF;
    for (int c = thread; c < slots; c += threads) {
        CsaCandidate where = {-1, -1};
        if (!locate(c, &where)) continue;
        float dot = 0.0f;
        for (int i = 0; i < a.dim; ++i) dot = dot + csa_mul(q[i], csa_candidate_value(a, where, i));
        float score = csa_mul(dot, a.scale);
        if (a.bias_present != 0) {
            const long long at = (((long long)(a.bias_b == 1 ? 0 : r.b) * a.bias_h + (a.bias_h == 1 ? 0 : r.head))
                * a.bias_s + (a.bias_s == 1 ? 0 : r.s)) * a.bias_k + (a.bias_k == 1 ? 0 : c);
            score = score + a.bias[at];
        }
        slot_scores[c] = score;
        maximum = fmaxf(score, maximum);
    }
    thread_maximum[thread] = maximum;
    __syncthreads();  // every slot's logit is written, every thread's maximum published
    if (threadIdx.x == 0u) {
        for (int t = 1; t < threads; ++t) maximum = fmaxf(thread_maximum[t], maximum);
        shared_maximum = maximum;
        CSA_PROBE("softmax_max", &shared_maximum, 1);
    }
    __syncthreads();  // thread 0 has published the row maximum
    maximum = shared_maximum;

    float denominator = 0.0f;
    if (maximum != CSA_NEG_INF) {
        for (int first = 0; first < slots; first += CSA_ATTENTION_TILE) {
            const int count = min(CSA_ATTENTION_TILE, slots - first);
            for (int j = thread; j < count; j += threads) {
                const float logit = slot_scores[first + j];
                tile_weight[j] = logit == CSA_NEG_INF ? 0.0f : csa_expf(logit - maximum);
            }
            __syncthreads();  // the tile's weights are in
            if (threadIdx.x == 0u)
                for (int j = 0; j < count; ++j)
                    if (slot_scores[first + j] != CSA_NEG_INF) denominator = denominator + tile_weight[j];
            __syncthreads();  // thread 0 has added the tile before it is overwritten
        }
        if (threadIdx.x == 0u)
            denominator = denominator + csa_expf(a.sink[r.head] - maximum);
    }
    if (threadIdx.x == 0u) {
        shared_denominator = denominator;
        CSA_PROBE("softmax_denominator", &shared_denominator, 1);
    }
    __syncthreads();  // thread 0 has published the denominator
    denominator = shared_denominator;

    for (int pass = 0; pass * threads * CSA_ATTENTION_DIMS < a.dim; ++pass) {  // every thread, for the barriers
        const int base = thread + pass * threads * CSA_ATTENTION_DIMS;
        float sums[CSA_ATTENTION_DIMS] = {};
        if (maximum != CSA_NEG_INF) {
            for (int first = 0; first < slots; first += CSA_ATTENTION_TILE) {
                const int count = min(CSA_ATTENTION_TILE, slots - first);
                __syncthreads();  // the previous tile is no longer read
                for (int j = thread; j < count; j += threads) {
                    const int c = first + j;
                    const float logit = slot_scores[c];
                    CsaCandidate where = {-1, -1};
                    tile_valid[j] = logit != CSA_NEG_INF && locate(c, &where);
                    tile_where[j] = where;
                    if (tile_valid[j]) {
                        const float probability = csa_expf(logit - maximum) / denominator;
                        tile_weight[j] = probability;
                        if (pass == 0) CSA_PROBE("softmax_probabilities", &probability, 1);
                    }
                }
                __syncthreads();  // the tile's probabilities and candidates are in
                for (int k = 0; k < CSA_ATTENTION_DIMS; ++k) {
                    const int d = base + k * threads;
                    if (d >= a.dim) break;
                    float accumulated = sums[k];
                    for (int j = 0; j < count; ++j) {
                        if (!tile_valid[j]) continue;
                        const float probability = tile_weight[j];
                        const CsaCandidate where = tile_where[j];
                        accumulated = accumulated + csa_mul(probability, csa_candidate_value(a, where, d));
                    }
                    sums[k] = accumulated;
                }
            }
        }
        for (int k = 0; k < CSA_ATTENTION_DIMS; ++k) {
            const int d = base + k * threads;
            if (d >= a.dim) break;
            const float accumulated = sums[k];
            a.output[(long long)r.row * a.dim + d] = accumulated;
        }
    }
}
