"""`csa-conform explain` (and `diff --explain`): the numeric cause of every divergence.

Presentation only: localization, hypotheses and provenance live in csa_conform.explain.
"""

from __future__ import annotations

import time

import click

from csa_conform._base.case_glob import matching_cases
from csa_conform._base.terminal import one_line
from csa_conform.check.conformance import check_case
from csa_conform.check.results import (
    control_run,
    golden_reference,
    invalid_entry,
    kernel_provenance,
    results_document,
)
from csa_conform.cli.common import argv, boundary, emit_json, progress
from csa_conform.cli.exit_status import exits
from csa_conform.cli.explanations import explanation_lines, explanations_section, say_failed
from csa_conform.cli.options import (
    DEFAULT_FILE,
    DeviceOptions,
    OutputOptions,
    case_selection,
    device_options,
    golden_file,
    output_options,
    stage_option,
)
from csa_conform.cli.run_header import control_banner, run_header
from csa_conform.exitcodes import ExitCode, verdicts_code
from csa_conform.explain import explain_report, settle_across_steps
from csa_conform.explain.patterns import stage_findings
from csa_conform.golden import GoldenFile
from csa_conform.spec import Mode


@exits("no divergence", "divergences (explained or not; or a kernel that faulted or hung)", bisect=True)
@click.command("explain")
@golden_file(DEFAULT_FILE)
@stage_option
@case_selection()
@device_options
@output_options
@boundary
def explain_command(file, stages, case_glob, device: DeviceOptions, output: OutputOptions):
    """Name the numeric cause of every divergence: each divergent stage is localized by an isolated
    re-run and re-computed on the host with one ingredient swapped (a libm function correctly rounded
    or the device's own, FMA contraction, flush-to-zero, the block scale's log2f) until one reproduces
    the device payload bit for bit.

    \b
    Examples:
      csa-conform explain --kernels ./my-kernels --build production
      csa-conform explain goldens/ci.h5 --case 'random.r4-*' --stage 7:attention --json > explain.json
      csa-conform explain --nvrtc-option=-DCSA_LIBM_PLATFORM -q
    """
    options = device.run_options(file)
    chained, isolated = options.runner(Mode.CHAINED), options.runner(Mode.ISOLATED)
    entries, explanations = [], []
    with GoldenFile(file) as golden:
        cases = matching_cases(golden.case_ids(), case_glob, golden.path)
        golden_ref = golden_reference(file, golden.schema_version)
        reports = []  # the conformant ones are experiments on the same kernels
        for case in progress(cases, len(cases), "explain", str, output.quiet or output.as_json):
            started = time.perf_counter()
            report = check_case(golden, case, chained, stages, options.ulp, diagnose=stage_findings)
            report.time_s = time.perf_counter() - started
            reports.append(report)
        for report in reports:
            started = time.perf_counter()
            if not report.passed and report.invalid is None and (report.fault is None or report.diverged()):
                explanations += explain_report(golden, report, isolated, stages, options.ulp, reports)
            report.time_s += time.perf_counter() - started
            entries.append(report.entry(lambda stage, case=report.case: options.command(case, stage),
                                        lambda stage, case=report.case: options.fault_command(case, stage)).to_json())
    settle_across_steps(explanations)  # the run's other cases of the same kernel are evidence too
    code = verdicts_code(not all(entry["passed"] for entry in entries), any(map(invalid_entry, entries)))
    if code == ExitCode.USAGE and device.git_bisect:
        code = ExitCode.BISECT_SKIP  # an invalid golden case says nothing about the kernels at this commit
    say_failed(explanations)
    control = control_run(chained.provenance)
    if control:
        click.secho(control_banner(options), err=True, fg="yellow", bold=True)
    if output.as_json:
        emit_json(results_document(
            "explain", argv(), entries, exit_code=code, golden=golden_ref,
            kernels=kernel_provenance(chained.provenance), control=control,
            options={**options.describe(), "stages": list(stages)}, extra=explanations_section(explanations),
        ))
        return code
    if not output.quiet:
        for line in run_header("explain", chained.provenance, options, stages):
            click.echo(one_line(line))
    for entry in filter(invalid_entry, entries):
        click.echo(one_line(f"{entry['case']}: invalid: {entry['failure']['message']}"))
    for report in reports:  # a fault or hang has no numeric cause to explain: it is said as it is
        if report.fault is not None:
            click.echo(one_line(f"{report.case} step {report.fault.step}: {report.fault.problem} — reproduce: "
                                f"{options.fault_command(report.case, report.fault.stage)}"))
    for line in explanation_lines(explanations):
        click.echo(one_line(line))
    return code
