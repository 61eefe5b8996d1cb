"""``csa-conform bench``: conformance-gated kernel timing per stage, against the roofline, with a regression gate.

A launch is timed only after the conformance check passed on the very
inputs it is timed on (csa_conform.bench.measure), its outputs poisoned
before every repetition and compared bit for bit afterwards
(csa_conform.bench.trust). Timers (csa_conform.bench.timers), the sampling
policy (csa_conform.bench.samples), the statistics (csa_conform.bench.stats),
the gate (csa_conform.bench.gate), the roofline (csa_conform.bench.roofline)
and the rotated inputs of hot samples (csa_conform.bench.rotation) are one
module each; csa_conform.bench.run benchmarks every case on one device,
csa_conform.bench.devices on several GPUs at once (and flags an outlier), and
csa_conform.bench.section writes the results document's ``bench`` section and
the raw-samples sidecar.
"""
