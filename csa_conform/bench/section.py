"""The ``bench`` section of the results document and the raw-samples sidecar (specs/results-document.md).

The section holds what a reader needs to judge each row (the summary
statistics, the roofline, the gate's verdict and the numbers behind it); the
sidecar holds every kept sample with its SM clock and temperature, so an
earlier run can be a ``--baseline`` and plots can be drawn. The section
names its sidecar; ``read_baseline`` follows that name back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import numpy as np

from csa_conform._base import bounded_json
from csa_conform.bench.gate import AMBG, FAST, SAME, SLOW
from csa_conform.bench.measure import NOT_TIMED, REFUSED, CaseBench, Row
from csa_conform.bench.samples import Samples
from csa_conform.errors import UsageError

SAMPLES_FORMAT = "csa-conform-bench-samples"
SAMPLES_VERSION = 1


def _median(values: Iterable[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return float(np.median(known)) if known else None


def row_entry(row: Row) -> dict:
    entry: dict = {"row": row.name, "stages": list(row.stages), "status": row.status, "message": row.message}
    samples = row.samples
    if samples is not None and samples.times:
        summary = samples.summary()
        entry.update(samples=summary.count, warmup=samples.warmup, throttled=samples.throttled, noisy=samples.noisy,
                     elapsed_s=samples.elapsed_s, median_s=summary.median, iqr_s=summary.iqr, p10_s=summary.p10,
                     p90_s=summary.p90, ci_s=[summary.ci_low, summary.ci_high], noise=summary.noise,
                     clock_mhz=_median(samples.clocks),
                     temperature_c=max((t for t in samples.temperatures if t is not None), default=None))
    entry["repetitions"] = row.repetitions.to_dict() if row.repetitions is not None else None
    entry["roofline"] = row.roofline
    if row.baseline is not None and row.baseline.times:
        base = row.baseline.summary()
        entry["baseline"] = {"samples": base.count, "median_s": base.median, "ci_s": [base.ci_low, base.ci_high]}
    else:
        entry["baseline"] = None
    entry["gate"] = row.judgement.to_dict() if row.judgement is not None else None
    if row.rotation is not None:
        entry["rotation"] = row.rotation.to_dict()
    return entry


def case_section(bench: CaseBench) -> dict:
    return {"case": bench.case, "step": bench.step, "conformance_s": bench.conformance_s,
            "step_vs_sum": bench.step_vs_sum(), "rows": [row_entry(row) for row in bench.rows]}


def verdicts(benches: Iterable[CaseBench]) -> dict[str, int]:
    rows = [row for bench in benches for row in bench.rows]
    counted = {"rows": len(rows), "timed": sum(row.timed for row in rows),
               "not_timed": sum(row.status == NOT_TIMED for row in rows),
               "refused": sum(row.status == REFUSED for row in rows)}
    for verdict in (SLOW, FAST, SAME, AMBG):
        counted[verdict.lower()] = sum(row.judgement is not None and row.judgement.verdict == verdict for row in rows)
    return counted


def samples_document(benches: Iterable[CaseBench]) -> dict:
    """Every kept sample of every timed row (and its interleaved baseline's)."""
    rows = []
    for bench in benches:
        for row in bench.rows:
            if row.samples is not None and row.samples.times:
                rows.append({"case": bench.case, "row": row.name, **row.samples.to_dict(),
                             "baseline": row.baseline.to_dict() if row.baseline is not None else None})
    return {"format": SAMPLES_FORMAT, "version": SAMPLES_VERSION, "rows": rows}


def _samples(entry: dict) -> Samples:
    return Samples(times=[float(t) for t in entry["times_s"]], clocks=list(entry["clocks_mhz"]),
                   temperatures=list(entry["temperatures_c"]), warmup=int(entry["warmup"]),
                   throttled=int(entry["throttled"]), noisy=bool(entry["noisy"]),
                   elapsed_s=float(entry["elapsed_s"]))


def read_samples(path: Path) -> dict:
    """A raw-samples sidecar, checked to be one (its rows are read by the caller)."""
    sidecar = bounded_json.loads(bounded_json.read_text(str(path)), str(path))
    if not isinstance(sidecar, dict) or sidecar.get("format") != SAMPLES_FORMAT \
            or sidecar.get("version") != SAMPLES_VERSION or not isinstance(sidecar.get("rows"), list):
        raise UsageError(f"{path}: not a csa-conform bench samples file of version {SAMPLES_VERSION}")
    return sidecar


def read_baseline(document: dict, origin: str) -> dict[tuple[str, str], Samples]:
    """An earlier bench run's samples by (case, row), read from the sidecar its document names."""
    section = document.get("bench") if document.get("command") == "bench" else None
    if section is None:
        raise UsageError(f"{origin}: not a bench results document (write one with csa-conform bench --json)")
    name = section.get("samples_file")
    if not name:
        raise UsageError(f"{origin}: the run kept no samples; re-run it with --samples FILE to use it as a baseline")
    path = Path(name)
    sidecar = read_samples(path)
    try:
        return {(entry["case"], entry["row"]): _samples(entry) for entry in sidecar["rows"]}
    except (KeyError, TypeError, ValueError) as error:
        raise UsageError(f"{path}: a malformed samples row ({error})") from None


def dumps(document: dict) -> bytes:
    return (json.dumps(document, indent=1, allow_nan=False) + "\n").encode("utf-8")
