// Host build of the prelude alone: batch entry points for its libm ports and
// block codecs, compared against glibc (ctypes) and the NumPy oracle.
#include "cuda_host_shim.h"
#include CSA_SOURCE

extern "C" {
void host_expf(const float* in, float* out, long n) { for (long i = 0; i < n; ++i) out[i] = csa_expf(in[i]); }
void host_sinf(const float* in, float* out, long n) { for (long i = 0; i < n; ++i) out[i] = csa_sinf(in[i]); }
void host_cosf(const float* in, float* out, long n) { for (long i = 0; i < n; ++i) out[i] = csa_cosf(in[i]); }
void host_log2f(const float* in, float* out, long n) { for (long i = 0; i < n; ++i) out[i] = csa_log2f(in[i]); }
void host_powf(const float* x, const float* y, float* out, long n)
{
    for (long i = 0; i < n; ++i) out[i] = csa_powf(x[i], y[i]);
}
void host_bf16(const float* in, unsigned short* out, long n) { for (long i = 0; i < n; ++i) out[i] = csa_round_bf16_bits(in[i]); }
void host_fp8_blocks(const float* in, unsigned char* scale, unsigned char* codes, long blocks)
{
    for (long i = 0; i < blocks; ++i) quantize_fp8_e4m3_block(in + 64 * i, scale + i, codes + 64 * i);
}
void host_fp4_blocks(const float* in, unsigned char* scale, unsigned char* packed, long blocks)
{
    for (long i = 0; i < blocks; ++i) quantize_fp4_e2m1_block(in + 32 * i, scale + i, packed + 16 * i);
}
void host_decode_tables(float* e4m3, float* e2m1, float* e8m0)
{
    for (int c = 0; c < 256; ++c) {
        e4m3[c] = decode_e4m3fn((unsigned char)c);
        e8m0[c] = e8m0_scale((unsigned char)c);
    }
    for (int c = 0; c < 16; ++c) e2m1[c] = decode_e2m1((unsigned char)c);
}
}
