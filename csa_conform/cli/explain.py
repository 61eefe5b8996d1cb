"""`csa-conform explain` (and `diff --explain`): the numeric cause of every divergence.

Presentation only: localization, hypotheses and provenance live in csa_conform.explain.
"""

from __future__ import annotations

import json
import sys

import click

from csa_conform.cli.build_options import build_options
from csa_conform.cli.diff import (
    DEFAULT_FILE,
    effective_force_host,
    environment_exit,
    parse_stages,
    select_cases,
    usage_exit,
)
from csa_conform.cli.explanations import explanation_lines, tally
from csa_conform.device.kernels import KernelDirectory
from csa_conform.errors import DeviceUnavailable, GoldenFormatError, UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.explain import explain_case
from csa_conform.goldens import GoldenFile


@click.command("explain")
@click.argument("file", required=False, default=DEFAULT_FILE, type=click.Path(dir_okay=False))
@click.option("--case", "case_glob", default=None, metavar="GLOB", help="Only cases whose id matches GLOB.")
@click.option("--stage", "stage", default="all", show_default=True,
              help="Stage to explain (all, or one of the eight stage names).")
@click.option("--force-host", "force_host", default=None, metavar="STAGES",
              help="Comma-separated stages (or all) to run on the host oracle inside the device run.")
@build_options
@click.option("--ulp", default=0, type=click.IntRange(min=0), show_default=True,
              help="Accept float differences up to N ULP (as diff does).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def explain_command(file, case_glob, stage, force_host, build, ulp, as_json):
    """Name the numeric cause of every divergence: each divergent stage is localized by an isolated
    re-run and re-computed on the host with one ingredient swapped (a libm function correctly rounded
    or the device's own, FMA contraction, flush-to-zero, the block scale's log2f) until one reproduces
    the device payload bit for bit.

    Exit status: 0 no divergence, 1 divergences (explained or not), 2 usage, 4 environment.
    """
    stages = parse_stages(stage)
    forced = effective_force_host(force_host)
    try:
        kernels = build.directory()
        with GoldenFile(file) as golden:
            cases = select_cases(golden, case_glob)
            explanations = [e for case in cases for e in explain_case(golden, case, kernels, forced, stages, ulp)]
    except DeviceUnavailable as error:
        environment_exit(error, False, as_json)
    except (UsageError, GoldenFormatError) as error:
        usage_exit(error, as_json)
    code = ExitCode.DIVERGED if explanations else ExitCode.OK
    if as_json:
        click.echo(json.dumps({
            "command": "explain", "file": file, "cases": cases, "stages": list(stages),
            "build": kernels.build.to_dict(), "explanations": [e.to_dict() for e in explanations],
            "summary": tally(explanations), "exit_code": int(code),
        }, indent=2))
    else:
        click.echo(f"csa-conform explain {file}: kernels {kernels.path}; {build_lines_text(kernels)}")
        for line in explanation_lines(explanations):
            click.echo(line)
    sys.exit(int(code))


def build_lines_text(kernels: KernelDirectory) -> str:
    build = kernels.build
    return f"build {build.profile} ({build.origin}): {' '.join(build.options) or 'no options'}"
