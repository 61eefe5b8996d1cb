"""`csa-conform diff`: run the device kernels on golden cases and compare every stage.

Presentation only: the run is csa_conform.check.device_run's, the comparison csa_conform.compare's.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import click

from csa_conform._base.statuses import (
    DIVERGED,
    FAULT,
    HANG,
    IDENTICAL,
    INVALID,
    NONDETERMINISTIC,
    NOT_APPLICABLE,
    OUT_OF_BOUNDS,
    REPLAY_MISMATCH,
)
from csa_conform._base.terminal import escaped, one_line
from csa_conform.check.device_run import run_cases
from csa_conform.check.invariance import KINDS as INVARIANCES
from csa_conform.check.invariance import VARIANT
from csa_conform.check.model import CaseVerdict
from csa_conform.check.options import RunOptions
from csa_conform.check.results import (
    control_run,
    kernel_provenance,
    results_document,
)
from csa_conform.cli.common import argv, boundary, emit_json, print_table, progress
from csa_conform.cli.exit_status import exits
from csa_conform.cli.explanations import explain_reports, explanation_lines, explanations_section, say_failed
from csa_conform.cli.options import (
    DEFAULT_FILE,
    DepthOptions,
    DeviceOptions,
    OutputOptions,
    case_selection,
    compose,
    device_depth_options,
    device_options,
    effective_shard,
    golden_file,
    grouped,
    output_options,
    stage_option,
)
from csa_conform.cli.run_header import control_banner, run_header
from csa_conform.cli.sanitized import sanitized_diff
from csa_conform.compare.tolerance import Tolerances
from csa_conform.device.backend import CUDA
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode, verdicts_code
from csa_conform.explain.patterns import stage_findings
from csa_conform.golden import GoldenFile
from csa_conform.profiles.numerics import REFERENCE, file_profile
from csa_conform.spec import BY_NAME, STAGE_NAMES, Mode


def _cell(report: CaseVerdict, stage: str) -> str:
    verdict = report.stages[stage]
    if verdict.status == INVALID:
        return "INVALID"
    if verdict.status == NOT_APPLICABLE:
        return "-"
    if verdict.status == DIVERGED:
        return "DIFF"
    if verdict.status in (FAULT, HANG):
        return verdict.status.upper()
    if verdict.status == NONDETERMINISTIC:
        return "NDET"
    if verdict.status == REPLAY_MISMATCH:
        return "GRAPH"
    if verdict.status == OUT_OF_BOUNDS:
        return "OOB"
    if verdict.status in VARIANT.values():
        return "VARY"
    if verdict.status == IDENTICAL:
        return "ok" if verdict.placement == "device" else "ok(host)"
    return "."


def _cell_width(stage: str) -> int:
    return max(len(BY_NAME[stage].label), len("ok(host)"))


def _failure_lines(report: CaseVerdict, options: RunOptions) -> list[str]:
    case, lines = escaped(report.case), []
    if report.invalid is not None:
        lines += [f"{case}: invalid: {report.invalid}", f"  reproduce: {options.command(report.case, 'all')}"]
    stopped = report.stopped
    faulted = report.fault
    if faulted is not None:
        lines.append(f"{case} step {faulted.step}: {faulted.problem}")
        lines.append(f"  reproduce: {options.fault_command(report.case, faulted.stage)}")
    elif stopped is not None:
        lines.append(f"{case} step {stopped.step}: the run stopped at {stopped.stage}: {stopped.problem}")
    for finding in report.findings:
        lines.append(f"{case} step {finding.step}: {finding.message}")
        lines.append(f"  reproduce: {options.command(report.case, finding.stages[0])}")
    diverged = report.diverged()
    # Chained, a stage reads what the stages before it wrote: the first divergence is the block, the rest
    # are counted. Isolated, every stage read the oracle's inputs, so each divergence is its own block,
    # but for one that repeats an earlier one's payload bit for bit (writeback/Y is attention/Y).
    repeats = {verdict.stage: origin.stage for verdict in diverged for origin in diverged
               if origin is not verdict and _repeats(verdict, origin)}
    blocks = diverged[:1] if options.mode is Mode.CHAINED else [v for v in diverged if v.stage not in repeats]
    for verdict in blocks:
        where = f"[{verdict.kernel}]" if verdict.kernel else f"({verdict.placement})"
        lines.append(f"{case}: diverges at {BY_NAME[verdict.stage].label} step {verdict.step} {where}")
        if verdict.message:
            lines.append(f"  {verdict.message}")
        lines.extend(f"  {diff.summary()}" for diff in verdict.diffs)
        if verdict.diagnosis:
            lines.append(f"  diagnosis: {verdict.diagnosis[0].kind}: {verdict.diagnosis[0].headline}")
        for diff in verdict.diffs:
            lines.extend(f"    {line}" for line in _decoded(diff))
        lines.append(f"  reproduce: {options.command(report.case, verdict.stage)}")
    later = diverged[1:] if options.mode is Mode.CHAINED else []
    if later:
        stages = ", ".join(f"{BY_NAME[verdict.stage].label} (step {verdict.step})" for verdict in later)
        lines.append(f"  {len(later)} later stage{'s' if len(later) > 1 else ''} diverge after it, reading what "
                     f"it wrote: {stages}")
    for stage, origin in repeats.items() if options.mode is not Mode.CHAINED else ():
        lines.append(f"  {BY_NAME[stage].label} repeats {BY_NAME[origin].label}'s payload bit for bit")
    if stopped is not None and faulted is None and not diverged:
        lines.append(f"  reproduce: {options.command(report.case, 'all')}")
    return [one_line(line) for line in lines]


def _repeats(verdict, origin) -> bool:
    """Whether a later divergent stage's tensors are an earlier one's, same step, same mismatches."""
    if ORDER[verdict.stage] <= ORDER[origin.stage] or verdict.step != origin.step or not verdict.diffs:
        return False
    seen = {(diff.tensor, diff.mismatches, str(diff.first)) for diff in origin.diffs}
    return all((diff.tensor, diff.mismatches, str(diff.first)) in seen for diff in verdict.diffs)


ORDER = {stage: position for position, stage in enumerate(STAGE_NAMES)}


def rejected_only(report: CaseVerdict) -> bool:
    """A case every step of which the oracle rejects as stored: nothing compared, nothing to show in a row."""
    return (report.passed and not report.compared_steps and bool(report.rejected_steps)
            and report.stopped is None and not report.findings)


def table_reports(reports: list[CaseVerdict]) -> tuple[list[CaseVerdict], list[CaseVerdict]]:
    """The reports the table shows and the rejected-only ones one line under it sums up; when the selection
    holds nothing but rejected cases (--case 'errors.*'), the user asked for them: they are the table."""
    rejected = [report for report in reports if rejected_only(report)]
    if len(rejected) == len(reports):
        return reports, []
    return [report for report in reports if not rejected_only(report)], rejected


REJECTED_NAMED = 4


def rejected_line(rejected: list[CaseVerdict]) -> str | None:
    if not rejected:
        return None
    named = ", ".join(escaped(report.case) for report in rejected[:REJECTED_NAMED])
    more = f", and {len(rejected) - REJECTED_NAMED} more" if len(rejected) > REJECTED_NAMED else ""
    return (f"{len(rejected)} oracle-rejected case{'s' if len(rejected) > 1 else ''} not in the table (every step "
            f"rejected as stored, the rejection the oracle's; nothing to compare): {named}{more}")


DECODED = 4  # record bytes and index rows a failure block decodes


def _decoded(diff) -> list[str]:
    """The first differing record bytes (decoded) or index rows (the slots that differ) of a tensor."""
    lines = []
    for entry in (diff.records or {}).get("bytes", [])[:DECODED]:
        part = entry["field"] + (f" of block {entry['block']}" if "block" in entry else "")
        part += f", d={entry['dim']}" if "dim" in entry else (f", d={entry['dims']}" if "dims" in entry else "")
        lines.append(f"{diff.tensor} {entry['record']} byte {entry['byte']} ({part}): expected "
                     f"0x{entry['expected_byte']:02x} = {entry['expected_value']}, actual 0x{entry['actual_byte']:02x}"
                     f" = {entry['actual_value']}")
    for entry in (diff.rows or {}).get("rows", [])[:DECODED]:
        slots = [(k, e, a) for k, (e, a) in enumerate(zip(entry["expected"], entry["actual"])) if e != a]
        shown = "; ".join(f"{diff.axes[-1]}={k}: {e} -> {a}" for k, e, a in slots[:8])
        more = f"; {len(slots) - 8} more" if len(slots) > 8 else ""
        lines.append(f"{diff.tensor} row {entry['row']}: {len(slots)} of {len(entry['expected'])} slots differ "
                     f"(expected -> actual) {shown}{more}")
    return lines


def render_plain(reports: list[CaseVerdict], stages: tuple[str, ...], header: list[str], options: RunOptions,
                 quiet: bool = False) -> None:
    if not quiet:
        for line in header:
            click.echo(one_line(line))
        rows, rejected = table_reports(reports)
        width = max([len("case")] + [len(escaped(report.case)) for report in rows])
        columns = [BY_NAME[stage].label for stage in stages]
        click.echo("  ".join(["case".ljust(width)] + [column.ljust(12) for column in columns]).rstrip())
        for report in rows:
            cells = [_cell(report, stage).ljust(12) for stage in stages]
            click.echo("  ".join([escaped(report.case).ljust(width)] + cells).rstrip())
        if rejected:
            click.echo(rejected_line(rejected))
    failures = [line for report in reports for line in _failure_lines(report, options)]
    click.echo(_summary(reports))
    if failures:
        click.echo("FAILURES")
        for line in failures:
            click.echo(line)


def render_rich(reports: list[CaseVerdict], stages: tuple[str, ...], header: list[str], options: RunOptions,
                console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    for line in header:
        console.print(one_line(line), highlight=False, markup=False)
    table = Table(show_lines=False)
    rows, rejected = table_reports(reports)
    # Case ids are what a user copies into --case: never cut, never folded.
    table.add_column("case", no_wrap=True, min_width=max(len(escaped(report.case)) for report in rows))
    styles = {"DIFF": "bold red", "FAULT": "bold red reverse", "HANG": "bold red reverse", "INVALID": "bold yellow", "NDET": "bold magenta", "GRAPH": "bold magenta", "VARY": "bold magenta", "ok": "green",
              "ok(host)": "cyan", "-": "dim", ".": "dim"}
    for stage in stages:
        table.add_column(BY_NAME[stage].label, justify="center", no_wrap=True, min_width=_cell_width(stage))
    for report in rows:
        cells = [_cell(report, stage) for stage in stages]
        table.add_row(Text(escaped(report.case)), *(f"[{styles[cell]}]{cell}[/]" for cell in cells))
    print_table(console, table)
    if rejected:
        console.print(rejected_line(rejected), highlight=False, markup=False)
    console.print(_summary(reports), highlight=False)
    failures = [line for report in reports for line in _failure_lines(report, options)]
    if failures:
        console.print("[bold red]FAILURES[/]")
        for line in failures:
            console.print(line, highlight=False, markup=False)


def _summary(reports: list[CaseVerdict]) -> str:
    """Counts of cases; a case with a finding of --repeat or --replay counts under the first one's kind, one whose
    kernel faulted or hung as a fault or a hang."""
    failed = sum(not report.passed for report in reports)
    kinds: dict[str, int] = {}
    for report in reports:
        if report.fault is not None and report.invalid is None:
            kinds[report.fault.problem_type] = kinds.get(report.fault.problem_type, 0) + 1
        elif report.findings:
            kinds[report.findings[0].kind] = kinds.get(report.findings[0].kind, 0) + 1
    invalid = sum(report.invalid is not None for report in reports)
    compared = sum(report.compared_steps for report in reports)
    rejected = sum(len(report.rejected_steps) for report in reports)
    return (f"{len(reports)} cases, {compared} steps compared, {rejected} oracle-rejected steps skipped: "
            f"{len(reports) - failed} conformant, {failed - invalid - sum(kinds.values())} diverged"
            + "".join(f", {count} {kind}" for kind, count in kinds.items())
            + (f", {invalid} invalid" if invalid else ""))


@dataclass(frozen=True, kw_only=True)
class DiffChecks:
    """What diff judges besides the bits: --explain, --tolerance FILE and every --invariance kind."""

    explain: bool
    tolerance: str | None
    invariance: tuple[str, ...]


diff_checks = compose(
    grouped("checks", DiffChecks),
    click.option("--explain", "explain", is_flag=True,
                 help="Name the numeric cause of every divergence (as csa-conform explain does)."),
    click.option("--tolerance", "tolerance", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                 help="Also judge every stage against the envelope of a tolerance file (csa-conform calibrate); "
                 "the envelope, not bit equality, is then the gate."),
    click.option("--invariance", "invariance", multiple=True, type=click.Choice(INVARIANCES),
                 help="Also run each case as a variant whose rows must keep their bits by the contract and compare "
                 "device with device: batch (its rows beside 4 random rows), chunks (its first prefill in two "
                 "steps). Repeatable."),
)


@exits("conformant", "a divergence (or a kernel that faulted or hung)", bisect=True)
@click.command("diff")
@golden_file(DEFAULT_FILE)
@stage_option
@click.option("--mode", type=click.Choice([mode.value for mode in Mode]), default=None,
              help="chained: device outputs feed device stages; isolated: every stage reads the oracle's "
              "payloads. Default: chained, or with --tolerance the mode the file was calibrated in.")
@case_selection()
@device_options
@device_depth_options
@output_options
@diff_checks
@boundary
def diff(file, stages, mode, case_glob, device: DeviceOptions, depth: DepthOptions, output: OutputOptions,
         checks: DiffChecks):
    """Run the device kernels on golden cases and compare each stage with the oracle, bit for bit.

    \b
    Examples:
      csa-conform diff --kernels ./my-kernels
      csa-conform diff goldens/ci.h5 --stage 5:select --mode isolated --case 'random.*'
      csa-conform diff --force-host all -q            # control run: no kernel launched
      csa-conform diff --kernels ./my-kernels --build production --explain
      csa-conform diff --repeat 5 --shard 1/4
      csa-conform diff --kernels ./my-kernels --invariance batch --invariance chunks
      csa-conform diff --kernels ./my-kernels --backend host   # no GPU: modules built with g++
      git bisect run csa-conform diff --kernels kernels --git-bisect -q
    """
    tolerance, devices, backend = checks.tolerance, depth.devices, device.backend
    envelope = Tolerances.read(tolerance) if tolerance else None
    mode = envelope.run_mode(tolerance, mode) if envelope is not None else mode or Mode.CHAINED.value
    options = device.run_options(file, mode=Mode(mode), depth=depth, tolerance=tolerance,
                                 invariance=checks.invariance)
    if backend != CUDA and (devices is not False or depth.sanitize):
        raise UsageError(f"--{'devices' if devices is not False else 'sanitize'} needs GPUs: leave out --backend {backend}")
    shard = effective_shard(depth.shard)
    if shard is not None and shard.origin != "--shard":
        click.echo(f"diff: running shard {shard} of the cases ({shard.origin}; --shard 1/1 runs all)", err=True)
    if depth.sanitize:
        if tolerance:
            raise UsageError("--sanitize judges memory errors, not numerics: leave out --tolerance")
        if devices is not False:
            raise UsageError("--sanitize runs one process under compute-sanitizer: leave out --devices")
        return sanitized_diff(depth.sanitize, options, stages, case_glob, shard, output.as_json, device.git_bisect)
    with GoldenFile(file) as golden:
        reports, provenance, golden_ref = run_cases(
            options, golden, stages, case_glob, shard, devices,
            watch=functools.partial(progress, quiet=output.quiet or output.as_json), diagnose=stage_findings)
        explanations = explain_reports(golden, reports, options, stages) if checks.explain else None
        refused = reference_refusals(reports, file_profile(golden.provenance, file)) if envelope is not None else []
    invalid = any(report.invalid for report in reports)
    code = verdicts_code(not all(report.passed for report in reports), invalid)
    judged = envelope.judge_run(tolerance, [report.errors for report in reports]) if envelope is not None else None
    if judged is not None:
        judged["rejected_by_reference"] = refused
        waived = {(entry["case"], entry["step"]) for entry in refused}
        sound = all((report.stopped is None or (report.case, report.stopped.step) in waived) and not report.findings
                    for report in reports)
        code = verdicts_code(not (judged["within"] and sound), invalid)
    if code == ExitCode.USAGE and device.git_bisect:
        code = ExitCode.BISECT_SKIP  # an invalid golden case says nothing about the kernels at this commit
    say_failed(explanations)
    control = control_run(provenance)
    if control and reports:
        click.secho(control_banner(options), err=True, fg="yellow", bold=True)
    if output.as_json:
        emit_json(results_document(
            "diff", argv(),
            [report.entry(lambda stage, case=report.case: options.command(case, stage),
                          lambda stage, case=report.case: options.fault_command(case, stage)).to_json()
             for report in reports],
            exit_code=code, golden=golden_ref, kernels=kernel_provenance(provenance), control=control,
            options={**options.describe(), "stages": list(stages), "explain": checks.explain,
                     **({"shard": str(shard)} if shard else {})},
            extra={**(explanations_section(explanations) if explanations is not None else {}),
                   **({"tolerance": judged} if judged is not None else {})} or None,
        ))
        return code
    header = run_header("diff", provenance, options, stages)
    if sys.stdout.isatty() and not output.quiet and reports:
        render_rich(reports, stages, header, options)
    else:
        render_plain(reports, stages, header, options, output.quiet)
    for line in explanation_lines(explanations) if explanations is not None else ():
        click.echo(line)
    for line in envelope_lines(judged, envelope) if judged is not None else ():
        click.echo(line)
    return code


def reference_refusals(reports: list[CaseVerdict], profile: str) -> list[dict]:
    """The steps a host stage (the reference oracle) refused where the golden file's own profile accepted
    them, as the reference refuses the ties the official profile orders. No envelope compares such a step
    (calibrate counts it rejected by the reference only), so the envelope's gate leaves it out too; a refusal
    of a reference file's step is the oracle disagreeing with its own goldens, and fails."""
    if profile == REFERENCE:
        return []
    return [{"case": report.case, "step": report.stopped.step, "stage": report.stopped.stage,
             "reason": report.stopped.problem}
            for report in reports if report.stopped is not None and report.stopped.stage in BY_NAME]


def envelope_lines(judged: dict, envelope: Tolerances) -> list[str]:
    calibration = envelope.calibration
    lines = [f"tolerance {judged['file']}: calibrated {calibration.get('expected_profile')} -> "
             f"{calibration.get('actual_profile')} ({calibration.get('mode')}), margin {calibration.get('margin')}, "
             f"{calibration.get('steps')} steps of {', '.join(calibration.get('files', []))}"]
    width = max([len("stage/tensor")] + [len(f"{v['stage']}/{v['tensor']}") for v in judged["stages"]])
    lines.append(f"{'stage/tensor'.ljust(width)}  bit-exact  envelope  statistics")
    for verdict in judged["stages"]:
        stats = ", ".join(
            f"{bound['statistic']} {bound['measured']:.3g} {'<=' if bound['within'] else '>'} {bound['limit']:.3g}"
            for bound in verdict["bounds"])
        lines.append(f"{(verdict['stage'] + '/' + verdict['tensor']).ljust(width)}  "
                     f"{'yes' if verdict['bit_exact'] else 'no':<9}  {'yes' if verdict['within'] else 'NO':<8}  {stats}")
    refused = judged.get("rejected_by_reference", [])
    if refused:
        steps = ", ".join(f"{escaped(entry['case'])} step {entry['step']} ({entry['stage']})"
                          for entry in refused[:REJECTED_NAMED])
        more = f", and {len(refused) - REJECTED_NAMED} more" if len(refused) > REJECTED_NAMED else ""
        lines.append(f"not compared: {len(refused)} step{'s' if len(refused) > 1 else ''} the reference refuses "
                     f"and the golden file's profile accepts (calibrate compares none): {steps}{more}")
    exact = all(verdict["bit_exact"] for verdict in judged["stages"])
    lines.append(f"envelope: {'within' if judged['within'] else 'OUTSIDE'} the calibrated tolerances "
                 f"(bit-exact: {'yes' if exact else 'no'})")
    return lines
