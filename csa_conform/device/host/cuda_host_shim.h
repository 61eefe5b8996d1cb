// The CUDA builtins the CSA kernels use, mapped onto standard C++, so a
// kernel directory can be built for the host: the prelude's libm ports are
// checked against glibc, and whole modules run under the device runner
// without a GPU. The threads of a block run as fibers (host_module.cpp), one
// at a time in index order: each runs until it reaches __syncthreads() or
// returns, then the next; once every live thread waits at the barrier they
// run on past it, again in index order. __shared__ variables live in one
// section, filled with a poison byte before each block (g++ ignores the
// section inside function templates: those keep the previous block's
// values). Build with
// -ffp-contract=off, the host twin of NVRTC's --fmad=false.
#ifndef CSA_HOST_SHIM_H
#define CSA_HOST_SHIM_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define __device__
#define __forceinline__ inline
#define __global__
#define __shared__ static __attribute__((section("csa_shared")))
#define __constant__

struct csa_host_dim3 {
    unsigned int x, y, z;
};
static csa_host_dim3 blockIdx, threadIdx, blockDim, gridDim;

// The barrier: the running fiber hands control back to the block's scheduler
// (host_module.cpp); with one thread, or outside a launch, there is nothing to wait for.
static void (*csa_host_barrier)() = nullptr;
static inline void __syncthreads()
{
    if (csa_host_barrier != nullptr) csa_host_barrier();
}

// A device-side trap ends the kernel and its context; on the host it ends the process the
// launch runs in (SIGABRT), which the runner judges as that case's fault.
static inline void __trap() { abort(); }

// Fibers never run at once, so every read-modify-write is atomic.
static inline int atomicAdd(int* at, int value) { const int old = *at; *at = old + value; return old; }
static inline unsigned int atomicAdd(unsigned int* at, unsigned int value)
{
    const unsigned int old = *at;
    *at = old + value;
    return old;
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned int __float_as_uint(float x) { unsigned int u; memcpy(&u, &x, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float x; memcpy(&x, &u, 4); return x; }
static inline int __float_as_int(float x) { int u; memcpy(&u, &x, 4); return u; }
static inline float __int_as_float(int u) { float x; memcpy(&x, &u, 4); return x; }
static inline long long __double_as_longlong(double x) { long long u; memcpy(&u, &x, 8); return u; }
static inline double __longlong_as_double(long long u) { double x; memcpy(&x, &u, 8); return x; }

// Round-to-nearest intrinsics a production module may call. CUDA never fuses
// them, even under --fmad=true; out of line, g++ cannot contract them either.
#define CSA_UNFUSED static __attribute__((noinline))
CSA_UNFUSED float __fadd_rn(float a, float b) { return a + b; }
CSA_UNFUSED float __fsub_rn(float a, float b) { return a - b; }
CSA_UNFUSED float __fmul_rn(float a, float b) { return a * b; }
CSA_UNFUSED float __fdiv_rn(float a, float b) { return a / b; }
CSA_UNFUSED float __frcp_rn(float a) { return 1.0f / a; }
CSA_UNFUSED float __fsqrt_rn(float a) { return sqrtf(a); }
CSA_UNFUSED double __dmul_rn(double a, double b) { return a * b; }

// The host's stand-in for the platform libm of the numerics variants: the
// correctly rounded value (float)f((double)x). CUDA's own libm cannot run
// here; host glibc's binary32 functions are the reference itself.
#define CSA_PLATFORM_LIBM
static inline float csa_platform_expf(float x) { return (float)exp((double)x); }
static inline float csa_platform_sinf(float x) { return (float)sin((double)x); }
static inline float csa_platform_cosf(float x) { return (float)cos((double)x); }
static inline float csa_platform_powf(float x, float y) { return (float)pow((double)x, (double)y); }
static inline float csa_platform_log2f(float x) { return (float)log2((double)x); }

#endif
