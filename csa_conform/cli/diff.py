"""`csa-conform diff`: run the device kernels on golden cases and compare every stage.

Presentation only: the replay and comparison live in csa_conform.device.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import sys
from dataclasses import dataclass

import click

from csa_conform.cli.build_options import BuildChoice, build_lines, build_options
from csa_conform.cli.common import fail
from csa_conform.cli.explanations import explain_reports, explanation_lines
from csa_conform.device.conformance import DIVERGED, IDENTICAL, NOT_APPLICABLE, CaseReport, check_case
from csa_conform.device.modes import STAGES, Mode, force_host_from_environment, parse_force_host
from csa_conform.device.runner import DeviceRunner
from csa_conform.errors import DeviceUnavailable, GoldenFormatError, UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.goldens import GoldenFile

DEFAULT_FILE = "goldens/ci.h5"
SHORT_NAMES = {
    "compression_update": "1:compress",
    "index_key_update": "2:index-key",
    "index_query_finalize": "3:query",
    "index_scoring": "4:score",
    "selection": "5:select",
    "candidate_assembly": "6:candidates",
    "sparse_sink_softmax_attention": "7:attention",
    "writeback": "8:writeback",
}


@dataclass(frozen=True)
class DiffOptions:
    """Everything that shapes a device run; ``command`` rebuilds a reproducing command line."""

    file: str
    mode: Mode
    force_host: frozenset[str]
    kernels: str | None
    ulp: int
    build: BuildChoice = BuildChoice()

    @property
    def forced(self) -> str:
        """The force-host set as --force-host spells it ('' when empty)."""
        if self.force_host >= set(STAGES):
            return "all"
        return ",".join(stage for stage in STAGES if stage in self.force_host)

    def command(self, case: str, stage: str, mode: Mode | None = None) -> str:
        words = ["csa-conform", "diff", self.file, "--stage", stage, "--mode", (mode or self.mode).value,
                 "--case", case]
        if self.force_host:
            words += ["--force-host", self.forced]
        words += self.build.words()
        if self.ulp:
            words += ["--ulp", str(self.ulp)]
        return shlex.join(words)

    def runner(self) -> DeviceRunner:
        return DeviceRunner(self.build.directory(), mode=self.mode, force_host=self.force_host)


def parse_stages(value: str) -> tuple[str, ...]:
    if value == "all":
        return STAGES
    if value not in STAGES:
        raise click.BadParameter(f"{value!r} is not a stage; choose all or one of {', '.join(STAGES)}")
    return (value,)


def effective_force_host(option: str | None) -> frozenset[str]:
    """--force-host plus the environment switches (CSA_CONFORM_FORCE_HOST, ONNX_GENAI_CSA_FORCE_HOST)."""
    try:
        return parse_force_host(option) | force_host_from_environment()
    except UsageError as error:
        raise click.BadParameter(str(error), param_hint="--force-host") from None


def select_cases(golden: GoldenFile, pattern: str | None) -> list[str]:
    cases = golden.case_ids()
    if pattern is not None:
        cases = [case for case in cases if fnmatch.fnmatchcase(case, pattern)]
    if not cases:
        raise UsageError(f"no case of {golden.path} matches {pattern!r}")
    return cases


def environment_exit(error: Exception, git_bisect: bool, as_json: bool) -> None:
    """Report an environment failure and exit 4 (125 under git bisect run, which skips the commit)."""
    code = ExitCode.BISECT_SKIP if git_bisect else ExitCode.ENVIRONMENT
    if as_json:
        click.echo(json.dumps({"error": str(error), "exit_code": int(code)}, indent=2))
    fail(f"environment: {error}", code)


def usage_exit(error: Exception, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"error": str(error), "exit_code": int(ExitCode.USAGE)}, indent=2))
    fail(str(error), ExitCode.USAGE)


def _cell(report: CaseReport, stage: str) -> str:
    verdict = report.stages[stage]
    if verdict.status == NOT_APPLICABLE:
        return "-"
    if verdict.status == DIVERGED:
        return "DIFF"
    if verdict.status == IDENTICAL:
        return "ok" if verdict.placement == "device" else "ok(host)"
    return "."


def _failure_lines(report: CaseReport, options: DiffOptions) -> list[str]:
    lines = []
    if report.failure is not None:
        failure = report.failure
        lines.append(f"{report.case} step {failure['step']}: the run stopped at {failure['stage']}: "
                     f"{failure['message']}")
    for verdict in report.diverged():
        lines.append(f"{report.case} / {verdict.stage} (step {verdict.step}, {verdict.placement}):")
        if verdict.message:
            lines.append(f"  {verdict.message}")
        lines.extend(f"  {diff.summary()}" for diff in verdict.diffs)
        lines.append(f"  reproduce: {options.command(report.case, verdict.stage)}")
    if report.failure is not None and not report.diverged():
        lines.append(f"  reproduce: {options.command(report.case, 'all')}")
    return lines


def render_plain(reports: list[CaseReport], stages: tuple[str, ...], header: list[str], options: DiffOptions) -> None:
    for line in header:
        click.echo(line)
    width = max([len("case")] + [len(report.case) for report in reports])
    columns = [SHORT_NAMES[stage] for stage in stages]
    click.echo("  ".join(["case".ljust(width)] + [column.ljust(12) for column in columns]).rstrip())
    for report in reports:
        cells = [_cell(report, stage).ljust(12) for stage in stages]
        click.echo("  ".join([report.case.ljust(width)] + cells).rstrip())
    failures = [line for report in reports for line in _failure_lines(report, options)]
    click.echo(_summary(reports))
    if failures:
        click.echo("FAILURES")
        for line in failures:
            click.echo(line)


def render_rich(reports: list[CaseReport], stages: tuple[str, ...], header: list[str], options: DiffOptions) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for line in header:
        console.print(line, highlight=False)
    table = Table(show_lines=False)
    table.add_column("case")
    styles = {"DIFF": "bold red", "ok": "green", "ok(host)": "cyan", "-": "dim", ".": "dim"}
    for stage in stages:
        table.add_column(SHORT_NAMES[stage], justify="center")
    for report in reports:
        cells = [_cell(report, stage) for stage in stages]
        table.add_row(report.case, *(f"[{styles[cell]}]{cell}[/]" for cell in cells))
    console.print(table)
    console.print(_summary(reports), highlight=False)
    failures = [line for report in reports for line in _failure_lines(report, options)]
    if failures:
        console.print("[bold red]FAILURES[/]")
        for line in failures:
            console.print(line, highlight=False, markup=False)


def _summary(reports: list[CaseReport]) -> str:
    diverged = sum(not report.passed for report in reports)
    compared = sum(report.compared_steps for report in reports)
    rejected = sum(len(report.rejected_steps) for report in reports)
    return (f"{len(reports)} cases, {compared} steps compared, {rejected} oracle-rejected steps skipped: "
            f"{len(reports) - diverged} conformant, {diverged} diverged")


def _header(runner: DeviceRunner, options: DiffOptions, stages: tuple[str, ...]) -> list[str]:
    kernels = runner.provenance.kernels
    device = runner.provenance.device
    where = "host only (no device launch)" if device is None else (
        f"{device.name} (sm {device.compute_capability}, CUDA runtime {device.cuda_runtime}, "
        f"driver {device.cuda_driver}, NVRTC {device.nvrtc})"
    )
    forced = options.forced or "none"
    return [
        f"csa-conform diff {options.file}: mode {options.mode.value}, stages "
        f"{'all' if stages == STAGES else ','.join(stages)}, ulp {options.ulp}",
        f"kernels {kernels['path']}{' (builtin)' if kernels['builtin'] else ''}; force-host {forced}; device {where}",
        *build_lines(runner.provenance),
    ]


def run_diff(options: DiffOptions, stages: tuple[str, ...], case_glob: str | None):
    """The reports of every selected case and the runner that produced them."""
    runner = options.runner()
    with GoldenFile(options.file) as golden:
        cases = select_cases(golden, case_glob)
        reports = [check_case(golden, case, runner, stages, options.ulp) for case in cases]
    return reports, runner


@click.command("diff")
@click.argument("file", required=False, default=DEFAULT_FILE, type=click.Path(dir_okay=False))
@click.option("--stage", "stage", default="all", show_default=True,
              help="Stage to compare (all, or one of the eight stage names).")
@click.option("--mode", type=click.Choice([mode.value for mode in Mode]), default=Mode.CHAINED.value,
              show_default=True, help="chained: device outputs feed device stages; isolated: every stage "
              "reads the oracle's payloads.")
@click.option("--force-host", "force_host", default=None, metavar="STAGES",
              help="Comma-separated stages (or all) to run on the host oracle inside the device run; "
              "CSA_CONFORM_FORCE_HOST and ONNX_GENAI_CSA_FORCE_HOST add to it.")
@build_options
@click.option("--case", "case_glob", default=None, metavar="GLOB", help="Only cases whose id matches GLOB.")
@click.option("--ulp", default=0, type=click.IntRange(min=0), show_default=True,
              help="Accept float differences up to N ULP (packed records and indices stay exact).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of the table.")
@click.option("--git-bisect", is_flag=True, help="Exit 125 on environment failures (git bisect run skips).")
@click.option("--explain", "explain", is_flag=True, help="Name the numeric cause of every divergence "
              "(as csa-conform explain does).")
def diff(file, stage, mode, force_host, build, case_glob, ulp, as_json, git_bisect, explain):
    """Run the device kernels on golden cases and compare each stage with the oracle, bit for bit.

    Exit status: 0 conformant, 1 divergence, 2 usage or invalid input, 4 environment
    (no CUDA device, kernel compile error; 125 with --git-bisect).
    """
    stages = parse_stages(stage)
    options = DiffOptions(file, Mode(mode), effective_force_host(force_host), build.kernels, ulp, build)
    try:
        reports, runner = run_diff(options, stages, case_glob)
        explanations = explain_reports(file, reports, runner.kernels, options.force_host, stages, ulp) if explain \
            else None
    except DeviceUnavailable as error:
        environment_exit(error, git_bisect, as_json)
    except (UsageError, GoldenFormatError) as error:
        usage_exit(error, as_json)
    code = ExitCode.OK if all(report.passed for report in reports) else ExitCode.DIVERGED
    if as_json:
        document = {
            "command": "diff",
            "file": options.file,
            "mode": options.mode.value,
            "stages": list(stages),
            "force_host": [name for name in STAGES if name in options.force_host],
            "ulp": options.ulp,
            "cases": [
                {**report.to_dict(),
                 "reproduce": {verdict.stage: options.command(report.case, verdict.stage)
                               for verdict in report.diverged()}}
                for report in reports
            ],
            "summary": _summary(reports),
            "provenance": runner.provenance.to_dict(),
            "exit_code": int(code),
        }
        if explanations is not None:
            document["explanations"] = [explanation.to_dict() for explanation in explanations]
        click.echo(json.dumps(document, indent=2))
    else:
        render = render_rich if sys.stdout.isatty() else render_plain
        render(reports, stages, _header(runner, options, stages), options)
        for line in explanation_lines(explanations) if explanations is not None else ():
            click.echo(line)
    sys.exit(int(code))
