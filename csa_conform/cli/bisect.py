"""`csa-conform bisect`: the first divergent step, stage, tensor and element of one stream.

The stream is replayed chained (as production runs it) until a step diverges;
that step is then re-run isolated, which names the stage the divergence
starts in rather than the stages it propagates to.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import click

from csa_conform.cli.build_options import build_options
from csa_conform.cli.diff import (
    DEFAULT_FILE,
    DiffOptions,
    effective_force_host,
    environment_exit,
    usage_exit,
)
from csa_conform.device.conformance import compare_step, replay
from csa_conform.device.modes import STAGES, Mode
from csa_conform.errors import DeviceUnavailable, GoldenFormatError, UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.goldens import GoldenFile


def _first_divergence(golden: GoldenFile, case: str, options: DiffOptions) -> dict | None:
    runner = dataclasses.replace(options, mode=Mode.CHAINED).runner()
    for outcome in replay(golden, case, runner):
        if outcome.expected_error is not None:
            continue
        if outcome.failure is not None:
            return {"step": outcome.index, "stage": outcome.failure_stage, "message": outcome.failure}
        failing = [diff for diff in compare_step(outcome, STAGES, options.ulp) if not diff.passed]
        if failing:
            first = min(failing, key=lambda diff: STAGES.index(diff.stage))
            same_stage = [diff for diff in failing if diff.stage == first.stage]
            return {
                "step": outcome.index,
                "stage": first.stage,
                "tensor": first.tensor,
                "element": first.first,
                "diff": first.to_dict(),
                "stage_tensors": [diff.summary() for diff in same_stage],
                "diverged_stages": sorted({diff.stage for diff in failing}, key=STAGES.index),
            }
    return None


def _isolated_stages(golden: GoldenFile, case: str, step: int, options: DiffOptions) -> list[str]:
    """Stages that diverge when the divergent step runs with the oracle's inputs everywhere."""
    runner = dataclasses.replace(options, mode=Mode.ISOLATED).runner()
    for outcome in replay(golden, case, runner, upto=step):
        if outcome.index == step and outcome.actual is not None:
            failing = [diff for diff in compare_step(outcome, STAGES, options.ulp) if not diff.passed]
            return sorted({diff.stage for diff in failing}, key=STAGES.index)
        if outcome.index == step and outcome.failure is not None:
            return [outcome.failure_stage]
    return []


def _describe(case: str, steps: int, found: dict, isolated: list[str], options: DiffOptions) -> list[str]:
    lines = [f"case {case}: first divergence at step {found['step']} of {steps}, stage {found['stage']}"]
    if "message" in found:
        lines.append(f"  {found['message']}")
    else:
        element = found["element"]
        ulp = f", {element['ulp']} ulp apart" if "ulp" in element else ""
        lines.append(f"  tensor {found['tensor']}, element {element['coords'] or 'scalar'} (flat {element['index']}): "
                     f"oracle {element['expected']} [{element['expected_bits']}], "
                     f"device {element['actual']} [{element['actual_bits']}]{ulp}")
        lines.extend(f"  {summary}" for summary in found["stage_tensors"])
        lines.append(f"  chained run diverges at: {', '.join(found['diverged_stages'])}")
    origin = isolated[0] if isolated else None
    if origin:
        lines.append(f"  isolated re-run of step {found['step']} diverges at: {', '.join(isolated)} "
                     f"-> the divergence originates in {origin}")
    else:
        lines.append(f"  isolated re-run of step {found['step']} is clean: the divergence comes from "
                     "device state carried in from earlier steps")
    lines.append(f"  reproduce: {options.command(case, origin or found['stage'], Mode.ISOLATED if origin else None)}")
    return lines


@click.command("bisect")
@click.argument("file", required=False, default=DEFAULT_FILE, type=click.Path(dir_okay=False))
@click.option("--case", "case", required=True, help="Case id of the stream to bisect.")
@click.option("--force-host", "force_host", default=None, metavar="STAGES",
              help="Comma-separated stages (or all) to run on the host oracle.")
@build_options
@click.option("--ulp", default=0, type=click.IntRange(min=0), show_default=True,
              help="Accept float differences up to N ULP.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--git-bisect", is_flag=True, help="Exit 125 on environment failures.")
def bisect(file, case, force_host, build, ulp, as_json, git_bisect):
    """Find the first divergent step, stage, tensor and element of a stream (oracle vs device values, ULP).

    Exit status: 0 no divergence, 1 divergence found, 2 usage, 4 environment (125 with --git-bisect).
    """
    options = DiffOptions(file, Mode.CHAINED, effective_force_host(force_host), build.kernels, ulp, build)
    try:
        with GoldenFile(file) as golden:
            if case not in golden.case_ids():
                raise UsageError(f"{file} has no case {case!r}")
            info = golden.case_info(case)
            found = _first_divergence(golden, case, options)
            isolated = _isolated_stages(golden, case, found["step"], options) if found else []
    except DeviceUnavailable as error:
        environment_exit(error, git_bisect, as_json)
    except (UsageError, GoldenFormatError) as error:
        usage_exit(error, as_json)
    code = ExitCode.DIVERGED if found else ExitCode.OK
    if as_json:
        click.echo(json.dumps({
            "command": "bisect", "file": file, "case": case, "steps": info.step_count,
            "divergence": found, "isolated_divergent_stages": isolated,
            "origin": isolated[0] if isolated else None, "exit_code": int(code),
        }, indent=2))
    elif found:
        for line in _describe(case, info.step_count, found, isolated, options):
            click.echo(line)
    else:
        click.echo(f"case {case}: {info.step_count} steps, no divergence (chained, every stage)")
    sys.exit(int(code))
