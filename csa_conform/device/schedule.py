"""``diff --repeat`` on CUDA: the repeated runs stagger the warps of every block, so a missing barrier shows.

A GPU runs a block's warps in an order of its own, nearly the same on every
run: a race that goes one way in run 1 goes the same way in run 2, and a plain
``--repeat`` sees nothing (an H100 mutation run found nine deleted or moved
barriers that way). The host backend reverses its threads for the even runs;
the analogue on a GPU is to let the warps leave every barrier at staggered
times. The repeated runs launch a build of the module whose source starts
with a header that turns each ``__syncthreads()`` into the barrier followed
by a wait that grows with the warp's place in the turn's order: runs 2, 4, …
the last warp leaves first (the host backend's reversed order), runs 3, 5, …
the first warp leaves first and the others come late. A kernel whose barriers
are all in place writes the same bytes in every order; one missing a barrier
between a warp's write and another warp's read reads too early in one of the
two orders, and its bytes differ from run 1's (a ``non-deterministic``
finding). Not staggered: the code before a kernel's first barrier (every warp
starts at once), barriers the header does not rename (``__syncthreads_count``
and its kin, cooperative groups, ``bar.sync`` in inline PTX) and devices before
compute capability 7.0 (no ``__nanosleep``); races between the threads of one
warp stay out of reach.
"""

from __future__ import annotations

import dataclasses

from csa_conform.device.kernels import ModuleSource

STAGGER_NS = 2000  # the wait between consecutive warps' departures from a barrier

# Turn 1 (runs 2, 4, …): the last warp first. Turn 2 (runs 3, 5, …): the first warp first.
_HEADER = """\
__device__ __forceinline__ void csa_staggered_departure()
{
    const unsigned int threads = blockDim.x * blockDim.y * blockDim.z;
    const unsigned int warps = (threads + 31u) / 32u;
    const unsigned int warp = (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) / 32u;
    const unsigned int place = %(turn)d == 1 ? warps - 1u - warp : warp;
#if __CUDA_ARCH__ >= 700
    __nanosleep(place * %(step)du);
#endif
}
#define __syncthreads() (__syncthreads(), csa_staggered_departure())
#line 1
"""


def turn(run: int) -> int:
    """The warp order of repeated run ``run`` (0 for the first run, which launches the module as built)."""
    return 0 if run == 0 else 2 - run % 2


def staggered(module: ModuleSource, order: int) -> ModuleSource:
    """The module with its barriers' departures staggered in ``order`` (1 or 2); line numbers unchanged."""
    return dataclasses.replace(module, source=_HEADER % {"turn": order, "step": STAGGER_NS} + module.source)
