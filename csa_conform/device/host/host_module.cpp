// Host build of one kernel module (prelude + module source in CSA_SOURCE).
#include <xmmintrin.h>
#include "cuda_host_shim.h"
#include CSA_SOURCE

// --ftz=true on the host: SSE's flush-to-zero and denormals-are-zero bits
// around one launch (the previous MXCSR is returned and put back after).
extern "C" unsigned int csa_host_flush_subnormals(int on)
{
    const unsigned int previous = _mm_getcsr();
    _mm_setcsr(on ? previous | 0x8040u : previous & ~0x8040u);
    return previous;
}

extern "C" void csa_host_restore_mxcsr(unsigned int previous) { _mm_setcsr(previous); }
