"""``--csa-bench-baseline FILE``: a ``bench`` item per case, which fails when a row is SLOW against FILE.

FILE is an earlier ``csa-conform bench --json --samples S`` document; its samples (read from S) are the
baseline of every row, and its mode, time cap and timer are this run's, so both sides are sampled alike. The
item runs the bench of csa_conform.bench on the case (the conformance check first, then the trusted
launches and the step timed on the same backend and kernels as the device items) and fails when a row
is SLOW (csa_conform.bench.gate: a CI beyond the band, in cycles too, recurring on a re-run), refused
(its timed outputs differ from the conformance run's) or when the case is not conformant (nothing of
it trusted is timed). FAST, SAME and AMBG pass; a row FILE lacks is timed and passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from csa_conform._base.bounded_json import read_text
from csa_conform._base.terminal import shell_join
from csa_conform.bench.gate import SLOW
from csa_conform.bench.measure import REFUSED, BenchOptions, Subject, bench_case
from csa_conform.bench.samples import Policy, Samples
from csa_conform.bench.section import read_baseline
from csa_conform.bench.timers import AUTO, baseline_timer
from csa_conform.check.archived import load_results
from csa_conform.device.backend import Backend
from csa_conform.device.kernels import KernelDirectory
from csa_conform.golden import GoldenFile
from csa_conform.pytest_plugin.outcomes import Outcome, failed, passed

SIDE = "bench"


@dataclass(frozen=True)
class BenchBaseline:
    """The baseline document's samples by (case, row), and the mode, time cap and timer it was sampled with."""

    file: str
    samples: dict[tuple[str, str], Samples]
    mode: str
    time_cap: float
    timer: str = AUTO  # the --timer choice that samples as the baseline did

    @classmethod
    def read(cls, file: str) -> BenchBaseline:
        """Read FILE and its sidecar (a UsageError says what is wrong with either)."""
        document = load_results(read_text(file), file)
        samples = read_baseline(document, file)
        section = document["bench"]
        return cls(file, samples, section["mode"], float(section["policy"]["time_cap_s"]),
                   baseline_timer(AUTO, section.get("timer"), file))

    def options(self) -> BenchOptions:
        return BenchOptions(self.mode, Policy(time_cap=self.time_cap))


    def reproduce(self, golden: str, case: str, kernels: str | None, build: str, backend: str) -> str:
        words = ["csa-conform", "bench", golden, "--case", case, "--mode", self.mode, "--time-cap", str(self.time_cap)]
        words += ["--kernels", kernels] if kernels else []
        words += ["--timer", self.timer] if self.timer != AUTO else []
        return shell_join(words + ["--build", build, "--backend", backend, "--baseline", self.file])


def bench_outcome(golden: str, case: str, baseline: BenchBaseline, kernels: str | None, build: str,
                  backend_name: str, backend: Callable[[], Backend]) -> Outcome:
    """The ``bench`` item's verdict on ``case``: failed (SLOW, refused, not conformant) with the lines
    that say why and a reproduce command, else passed."""
    subject = Subject(KernelDirectory(kernels, build=build), backend, baseline.timer)
    try:
        with GoldenFile(golden) as file:
            bench = bench_case(file, case, [subject], baseline.options(), baseline.samples)
    finally:
        subject.close()
    lines = []
    if not bench.report.passed:
        lines.append(f"{case}: not conformant, so not benchmarked (the [device] items say where it diverges)")
    for row in bench.rows:
        if row.status == REFUSED:
            lines.append(f"{case} {row.name}: refused: {row.message}")
        elif row.judgement is not None and row.judgement.verdict == SLOW:
            lines.append(f"{case} {row.name}: SLOW against {baseline.file}: {row.judgement.reason}")
    if lines:
        return failed(lines + [f"  reproduce: {baseline.reproduce(golden, case, kernels, build, backend_name)}"])
    return passed()
