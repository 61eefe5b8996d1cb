"""The oracle's numba kernels and what they need: lane vectors without fast-math, the cache stamp
that sees every kernel source, and the thread split of independent rows. Optional: numpy runs
without them."""
