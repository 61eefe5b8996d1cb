"""`csa-conform bench`: time the kernels stage by stage once they pass conformance, and gate on regressions.

Presentation only: measuring, statistics, the gate and the roofline live in csa_conform.bench.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from csa_conform._base.atomic import refuse_special_target, write_atomically
from csa_conform._base.bounded_json import read_text
from csa_conform._base.case_glob import exact_glob, matching_cases
from csa_conform._base.terminal import escaped, one_line, shell_join
from csa_conform.bench.gate import AMBG, SLOW
from csa_conform.bench.devices import devices_section, run_devices
from csa_conform.bench.measure import COLD, MODES, STEP_ROW, BenchOptions, CaseBench
from csa_conform.bench.provider import caveat as provider_caveat
from csa_conform.bench.provider import run_provider
from csa_conform.bench.run import BenchJob, DeviceRun, run_device
from csa_conform.bench.samples import Policy
from csa_conform.bench.section import case_section, dumps, read_baseline, samples_document, verdicts
from csa_conform.bench.timers import AUTO, HOST_CAVEAT, TIMERS, baseline_timer
from csa_conform.check.archived import load_results
from csa_conform.check.results import (
    SLOWER,
    TIMING_REFUSED,
    Failure,
    golden_reference,
    kernel_provenance,
    results_document,
)
from csa_conform.cli.common import argv, boundary, emit_json, progress
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import DEFAULT_FILE, case_selection, devices_option, golden_file, grouped, quiet_option
from csa_conform.device.backend import BACKENDS, CUDA, HOST
from csa_conform.device.devices import resolve_devices
from csa_conform.device.provider import is_provider
from csa_conform.device.kernels import BUILDS, MANIFEST
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile


@dataclass(frozen=True, kw_only=True)
class BenchRun:
    """What is timed and how: --kernels, --build, --backend, --devices, --mode, --timer, --time-cap and
    --time-diverged."""

    kernels: str | None
    profile: str | None
    backend: str
    devices: tuple[int, ...] | None | bool  # False: not given; None: all
    mode: str
    timer: str
    time_cap: float
    time_diverged: bool

    def reproduce(self, file: str, case: str) -> str:
        """The bench command line that times one case again."""
        words = ["csa-conform", "bench", file, "--case", exact_glob(case), "--mode", self.mode]
        words += ["--kernels", self.kernels] if self.kernels else []
        words += ["--build", self.profile] if self.profile else []
        words += ["--backend", self.backend] if self.backend != CUDA else []
        words += ["--timer", self.timer] if self.timer != AUTO else []
        return shell_join(words)


@dataclass(frozen=True, kw_only=True)
class BenchGate:
    """What the rows are gated against: --baseline RESULTS.json or --baseline-kernels DIR, and --strict."""

    baseline: str | None
    baseline_kernels: str | None
    strict: bool


@dataclass(frozen=True, kw_only=True)
class BenchOutput:
    """Where the results go besides stdout: --samples FILE, --markdown FILE, and --json, --quiet."""

    samples_path: Path | None
    markdown_path: Path | None
    as_json: bool
    quiet: bool


def _gate_failures(bench: CaseBench, strict: bool) -> list[tuple[str, str]]:
    failures = []
    for row in bench.rows:
        if row.message and row.status == "refused":
            failures.append((TIMING_REFUSED, f"{row.name}: refused: {row.message}"))
        judgement = row.judgement
        if judgement is not None and (judgement.verdict == SLOW or strict and judgement.verdict == AMBG):
            failures.append((SLOWER, f"{row.name}: {judgement.verdict}: {judgement.reason}"))
    return failures


def _case_entry(bench: CaseBench, reproduce: str, strict: bool) -> dict:
    """The case's conformance verdict, failed too by the gate: its first failure type names every one."""
    entry = bench.report.entry(lambda stage: reproduce)
    fault = bench.report.fault
    if fault is not None and entry.failure is None:
        entry.failure = Failure(fault.problem_type, f"refused, not timed: {fault.problem}", reproduce)
    failures = _gate_failures(bench, strict)
    if failures and entry.failure is None:
        kind, _ = failures[0]
        entry.failure = Failure(kind, "; ".join(message for _, message in failures), reproduce)
    entry.passed = entry.passed and not failures
    return entry.to_json()


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4f}"


def _row_line(case: str, entry: dict) -> str:
    cells = [escaped(case), entry["row"], entry["status"]]
    if "median_s" in entry:
        low, high = entry["ci_s"]
        cells.append(f"median {_ms(entry['median_s'])} ms [{_ms(low)}, {_ms(high)}] n={entry['samples']}"
                     + (" noisy" if entry["noisy"] else "")
                     + (f" throttled={entry['throttled']}" if entry["throttled"] else ""))
    roof = entry.get("roofline")
    if roof:
        for label in ("nominal", "measured"):
            if roof[label]:
                cells.append(f"{roof[label]['percent']:.1f}% of {label} {roof[label]['bound']} peak")
    if entry.get("gate"):
        cells.append(f"{entry['gate']['verdict']} x{entry['gate']['ratio']:.3f}")
    if entry.get("message"):
        cells.append(entry["message"])
    return one_line("  ".join(cells))


def markdown(section: dict) -> str:
    """A Markdown summary of the bench section for a CI job's page."""
    lines = ["# csa-conform bench", ""]
    if section["caveat"]:
        lines += [f"**{section['caveat']}**", ""]
    lines += [f"timer `{section['timer']}`, mode `{section['mode']}`"
              + (f", baseline `{section['baseline']['path']}`" if section["baseline"] else ""), "",
              *([f"not timed with CUPTI: {section['timer_fallback']}", ""] if section.get("timer_fallback") else []),
              "| case | row | status | median ms | 95% CI ms | n | % peak (bound) | gate |", "|---|---|---|---|---|---|---|---|"]
    for case in section["cases"]:
        for row in case["rows"]:
            ci = f"{_ms(row['ci_s'][0])} – {_ms(row['ci_s'][1])}" if "ci_s" in row else "-"
            roof = (row.get("roofline") or {}).get("measured") or (row.get("roofline") or {}).get("nominal")
            peak = f"{roof['percent']:.1f}% ({roof['bound']})" if roof else "-"
            gate = f"{row['gate']['verdict']} ×{row['gate']['ratio']:.3f}" if row.get("gate") else "-"
            lines.append(f"| `{case['case']}` | {row['row']} | {row['status']} | {_ms(row.get('median_s'))} | {ci} | "
                         f"{row.get('samples', 0)} | {peak} | {gate} |")
    counts = section["summary"]
    lines += ["", ", ".join(f"{count} {name.replace('_', ' ')}" for name, count in counts.items())]
    if "devices" in section:
        found = section["devices"]
        lines += ["", f"The rows above are device {found['runs'][0]['device']}'s of "
                  + ", ".join(f"{run['device']} ({run['name']})" for run in found["runs"]) + "; outlier rule: "
                  + found["rule"] + "."]
        lines += [f"- **outlier GPU {outlier['device']}**: {outlier['reason']}" for outlier in found["outliers"]]
    return "\n".join(lines) + "\n"


@exits("conformant and no row SLOW", "a divergence, or a row refused (its timed outputs differ from the "
       "conformance run)", own={ExitCode.SLOW: "a row SLOW against the baseline (or AMBG with --strict)"})
@click.command("bench")
@golden_file(DEFAULT_FILE)
@click.option("--kernels", default=None, type=click.Path(file_okay=False),
              help=f"Kernel directory (block_quant.cuh + one .cu per module, optionally {MANIFEST}), or a Python "
              "provider python:MODULE:OBJECT (specs/providers.md); default: the built-in kernels.")
@click.option("--build", "profile", type=click.Choice(list(BUILDS)), default=None,
              help="Build profile (as diff's --build); default: strict for the built-in kernels, else the "
              "directory's manifest, else production.")
@case_selection()
@click.option("--mode", type=click.Choice(MODES), default=COLD, show_default=True,
              help="cold: each launch alone, L2 flushed before every sample; hot: no flush; step: only the whole "
              "step, as one CUDA graph.")
@click.option("--timer", type=click.Choice(TIMERS), default=AUTO, show_default=True,
              help="auto: CUPTI's kernel activity records where libcupti loads and starts, else CUDA events (the "
              "results say why; with --baseline RESULTS.json: the baseline's timer); cupti: CUPTI or exit 4; "
              "events: CUDA events. The cuda backend only.")
@click.option("--baseline", "baseline", type=click.Path(dir_okay=False), default=None, metavar="RESULTS.json",
              help="Gate every row against an earlier `bench --json --samples FILE` run.")
@click.option("--baseline-kernels", "baseline_kernels", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="Gate every row against this kernel directory, sampled interleaved in the same process.")
@click.option("--backend", type=click.Choice(BACKENDS), default=CUDA, show_default=True,
              help=f"cuda (device 0), or host (the g++ emulation; every time is labelled '{HOST_CAVEAT}').")
@click.option("--devices", default=None, metavar="0,1,…|all", callback=devices_option,
              help="Benchmark every case on each of these GPUs, one worker process each, and flag a GPU whose "
              "step times stand out (with --backend host: that many emulation workers).")
@click.option("--strict", is_flag=True, help="An AMBG row fails the run too (exit 3).")
@click.option("--time-diverged", is_flag=True,
              help="Time launches whose stages diverged anyway, marked untrusted (the run still exits 1).")
@click.option("--time-cap", "time_cap", type=click.FloatRange(min=0.01), default=2.0, show_default=True,
              metavar="SECONDS", help="Sampling time per row; a row not settled by then is marked noisy.")
@click.option("--samples", "samples_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", help="Write every kept sample (with its SM clock and temperature) to FILE (JSON).")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", help="Write a Markdown summary for a CI job's page.")
@click.option("--json", "as_json", is_flag=True, help="Print one results document (specs/results-document.md).")
@quiet_option("No header or rows: failures and the summary only.")
@grouped("run", BenchRun)
@grouped("gate", BenchGate)
@grouped("output", BenchOutput)
@boundary
def bench_command(file: str, case_glob: str | None, run: BenchRun, gate: BenchGate, output: BenchOutput) -> ExitCode:
    """Time each kernel launch and the whole step, once it passes conformance, against the roofline and a baseline.

    \b
    Examples:
      csa-conform generate --suite bench -o build/bench.h5
      csa-conform bench build/bench.h5 --kernels ./my-kernels --json --samples build/samples.json > base.json
      csa-conform bench build/bench.h5 --kernels ./my-kernels --baseline base.json
      csa-conform bench build/bench.h5 --kernels ./new --baseline-kernels ./old --markdown build/bench.md
      csa-conform bench --backend host --case 'random.*' --time-cap 0.5   # the gate logic, no GPU
    """
    baseline, baseline_kernels, strict = gate.baseline, gate.baseline_kernels, gate.strict
    samples_path, markdown_path = output.samples_path, output.markdown_path
    backend, devices, mode, time_cap = run.backend, run.devices, run.mode, run.time_cap
    if baseline and baseline_kernels:
        raise UsageError("give --baseline or --baseline-kernels, not both")
    if run.timer != AUTO and backend != CUDA:
        raise UsageError(f"--timer {run.timer} times CUDA launches: it needs --backend cuda")
    if devices is None and backend != CUDA:
        raise UsageError(f"--devices all counts GPUs: give ordinals (0,1,…) with --backend {backend}")
    for path in (samples_path, markdown_path):
        if path is not None:
            refuse_special_target(path)
    provider = is_provider(run.kernels)
    if provider:
        _refuse_for_provider(run, gate)
    recorded, timer = None, run.timer
    if baseline:
        document = load_results(read_text(baseline), baseline)
        recorded = read_baseline(document, baseline)
        timer = baseline_timer(run.timer, document["bench"].get("timer"), baseline)
    options = BenchOptions(mode, Policy(time_cap=time_cap), run.time_diverged)
    with GoldenFile(file) as golden:
        cases = matching_cases(golden.case_ids(), case_glob, golden.path)
        golden_ref = golden_reference(file, golden.schema_version)
    job = BenchJob(file, tuple(cases), run.kernels, run.profile, backend, options, baseline_kernels, recorded, timer)
    caveat = HOST_CAVEAT if backend == HOST else None
    if provider:
        runs = [run_provider(file, tuple(cases), run.kernels, options,
                             lambda benches: progress(benches, len(cases), "bench", lambda done: done.case,
                                                      output.quiet or output.as_json))]
        caveat = provider_caveat(runs[0].provenance.kernels["provider"]["device"])
    elif devices is False:
        runs = [run_device(job, lambda benches: progress(benches, len(cases), "bench", lambda done: done.case,
                                                          output.quiet or output.as_json))]
    else:
        runs = run_devices(resolve_devices(devices), job)
    parts = [_device_part(run) for run in runs]
    section = {
        "timer": parts[0]["timer"], "timer_fallback": parts[0]["timer_fallback"], "caveat": caveat, "mode": mode,
        "policy": {"time_cap_s": time_cap, "min_samples": options.policy.min_samples,
                   "target_noise": options.policy.target_noise},
        "strict": strict, "time_diverged": run.time_diverged,
        "baseline": ({"kind": "kernels", "path": baseline_kernels} if baseline_kernels
                     else {"kind": "results", "path": baseline} if baseline else None),
        "samples_file": str(samples_path.resolve()) if samples_path is not None else None,
        **{key: parts[0][key] for key in ("persisting_l2", "peaks", "summary", "cases")},
    }
    if devices is not False:
        section["devices"] = devices_section(runs, parts)
    reproduce = [run.reproduce(file, case) for case in cases]
    entries = _entries(runs, reproduce, strict)
    code = _exit_code([bench for run in runs for bench in run.benches], strict)
    if samples_path is not None:
        kept = samples_document(runs[0].benches)
        if devices is not False:
            kept["devices"] = [{"device": run.device, "rows": samples_document(run.benches)["rows"]} for run in runs]
        write_atomically(samples_path, dumps(kept))
    if markdown_path is not None:
        write_atomically(markdown_path, markdown(section).encode("utf-8"))
    provenance = runs[0].provenance
    if output.as_json:
        emit_json(results_document(
            "bench", argv(), entries, exit_code=code, golden=golden_ref, kernels=kernel_provenance(provenance),
            control=False, options={"mode": mode, "kernels": run.kernels, "build": run.profile, "backend": backend,
                                    "baseline": baseline, "baseline_kernels": baseline_kernels, "strict": strict,
                                    "time_diverged": run.time_diverged, "time_cap_s": time_cap, "timer": run.timer,
                                    **({"devices": [run.device for run in runs]} if devices is not False else {})},
            extra={"bench": section}))
        return code
    _print(section, entries, provenance, output.quiet)
    return code


def _refuse_for_provider(run: BenchRun, gate: BenchGate) -> None:
    """What times a kernel directory's launches and cannot apply to a python: provider's calls, in one line."""
    given = [word for word, set_ in (
        ("--build", run.profile), ("--backend host", run.backend != CUDA), ("--devices", run.devices is not False),
        (f"--timer {run.timer}", run.timer != AUTO), (f"--mode {run.mode}", run.mode != COLD),
        ("--baseline", gate.baseline), ("--baseline-kernels", gate.baseline_kernels)) if set_]
    if given:
        raise UsageError(f"{', '.join(given)}: bench times a python: provider's calls as they are (host timers on "
                         "the CPU, CUDA events on the GPU), one process, no baseline gate")


def _device_part(run: DeviceRun) -> dict:
    """What differs from device to device in the bench section: the timer, the peaks, the rows."""
    nominal, measured = run.peaks
    return {"timer": run.timer, "timer_fallback": run.timer_fallback, "persisting_l2": run.persisting_l2,
            "peaks": {"nominal": nominal, "measured": measured},
            "summary": verdicts(run.benches), "cases": [case_section(bench) for bench in run.benches]}


def _entries(runs: list[DeviceRun], reproduce: list[str], strict: bool) -> list[dict]:
    """Each case's results entry: the first device's, unless the case fails on another (that device's, named)."""
    entries = []
    for index, line in enumerate(reproduce):
        found = [(run.device, _case_entry(run.benches[index], line, strict)) for run in runs]
        device, entry = next(((device, entry) for device, entry in found if not entry["passed"]), found[0])
        if len(runs) > 1 and not entry["passed"] and entry.get("failure"):
            entry["failure"]["message"] = f"device {device}: {entry['failure']['message']}"
        entries.append(entry)
    return entries


def _exit_code(benches: list[CaseBench], strict: bool) -> ExitCode:
    if not all(bench.passed for bench in benches):
        return ExitCode.DIVERGED
    verdicts_seen = {row.judgement.verdict for bench in benches for row in bench.rows if row.judgement is not None}
    if SLOW in verdicts_seen or strict and AMBG in verdicts_seen:
        return ExitCode.SLOW
    return ExitCode.OK


def _print(section: dict, entries: list[dict], provenance, quiet: bool) -> None:
    device = provenance.device
    if not quiet:
        where = device.name if device is not None else "no device launch"
        click.echo(one_line(f"csa-conform bench: timer {section['timer']}, mode {section['mode']}, device {where}, "
                            f"kernels {provenance.kernels['path']}"))
        if section["caveat"]:
            click.echo(section["caveat"].upper())
        if section["timer_fallback"]:
            click.echo(one_line(f"not timed with CUPTI: {section['timer_fallback']}"))
        runs = section["devices"]["runs"] if "devices" in section else [section]
        for part in runs:
            if "device" in part:
                click.echo(one_line(f"device {part['device']} ({part['name']}):"))
            _print_part(part)
        for outlier in section.get("devices", {}).get("outliers", []):
            click.echo(one_line(f"OUTLIER GPU {outlier['device']}: {outlier['reason']}"))
    for entry in entries:
        if not entry["passed"]:
            failure = entry.get("failure") or {}
            message = failure.get("message") or "diverged from the oracle: " + ", ".join(
                stage for stage, verdict in entry["verdicts"].items() if verdict == "diverged")
            click.echo(one_line(f"FAIL {escaped(entry['case'])}: {message} — reproduce: {entry['reproduce']}"))
    counts = section["summary"]
    click.echo(f"{len(entries)} cases, " + ", ".join(f"{count} {name.replace('_', ' ')}" for name, count in counts.items())
               + (f" ({section['caveat']})" if section["caveat"] else ""))


def _print_part(part: dict) -> None:
    """One device's peaks and rows."""
    for label, peaks in part["peaks"].items():
        if peaks:
            click.echo(f"{label} peak: {peaks['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, "
                       f"{peaks['ops_per_s'] / 1e9:.1f} Gops/s")
    for case in part["cases"]:
        for row in case["rows"]:
            click.echo(_row_line(case["case"], row))
        if case["step_vs_sum"] is not None:
            click.echo(one_line(f"{escaped(case['case'])}  {STEP_ROW} / sum of launches: {case['step_vs_sum']:.3f}"))
