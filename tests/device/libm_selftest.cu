// Device self-test of the prelude's glibc ports: one thread per argument.
extern "C" __global__ void csa_libm_selftest(
    const float* x, const float* y, float* exp_out, float* sin_out, float* cos_out, float* log2_out,
    float* pow_out, long long count)
{
    const long long i = (long long)blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= count) return;
    exp_out[i] = csa_expf(x[i]);
    sin_out[i] = csa_sinf(x[i]);
    cos_out[i] = csa_cosf(x[i]);
    log2_out[i] = csa_log2f(x[i]);
    pow_out[i] = csa_powf(fabsf(x[i]), y[i]);
}
