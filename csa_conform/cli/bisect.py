"""`csa-conform bisect`: the first divergent step, stage, tensor and element of one stream.

The stream is replayed chained (as production runs it) until a step diverges;
that step is then re-run isolated, which names the stage the divergence
starts in rather than the stages it propagates to.
"""

from __future__ import annotations

import time

import click

from csa_conform._base.statuses import FAULT, HANG
from csa_conform._base.terminal import escaped
from csa_conform.check.conformance import compare_step, first_divergence, replay
from csa_conform.check.model import StepVerdict
from csa_conform.check.options import RunOptions
from csa_conform.check.results import (
    STEP_REJECTED,
    CaseEntry,
    StageEntry,
    Failure,
    StepEntry,
    control_run,
    golden_reference,
    kernel_provenance,
    results_document,
)
from csa_conform.cli.common import argv, boundary, emit_json, progress
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import (
    DEFAULT_FILE,
    DeviceOptions,
    OutputOptions,
    case_selection,
    device_options,
    golden_file,
    output_options,
)
from csa_conform.cli.run_header import control_banner
from csa_conform.device.launches import kernel_of
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile
from csa_conform.spec import STAGE_NAMES, Mode


def _first_divergence(golden: GoldenFile, case: str, options: RunOptions, runner, steps: int,
                      quiet: bool) -> StepVerdict | None:
    outcomes = progress(replay(golden, case, runner), steps, "bisect (chained)",
                        lambda outcome: f"step {outcome.index}", quiet)
    return first_divergence(outcomes, STAGE_NAMES, options.ulp)


def _isolated_stages(golden: GoldenFile, case: str, step: int, options: RunOptions, runner) -> list[str]:
    """Stages that diverge when the divergent step runs with the oracle's inputs everywhere."""
    for outcome in replay(golden, case, runner, upto=step):
        if outcome.index == step and outcome.actual is not None:
            failing = [diff for diff in compare_step(outcome, STAGE_NAMES, options.ulp) if not diff.passed]
            return sorted({diff.stage for diff in failing}, key=STAGE_NAMES.index)
        if outcome.index == step and outcome.failure is not None:
            return [outcome.failure_stage]
    return []


def _kernel(stage: str, ratio, options: RunOptions, tensors=()) -> str:
    """' [module.cu:entry]' of the launch that computed the stage ('' on the host)."""
    if stage in options.force_host or not isinstance(ratio, int):
        return ""
    kernel = options.build.kernels if options.build.provider else kernel_of(stage, ratio, tensors)
    return f" [{kernel}]" if kernel else ""


def _describe(case: str, steps: int, found: StepVerdict, isolated: list[str], options: RunOptions,
              ratio=None) -> list[str]:
    tensors = [diff.tensor for diff in found.diffs]
    lines = [f"case {escaped(case)}: first divergence at step {found.step} of {steps}, stage {found.stage}"
             f"{_kernel(found.stage, ratio, options, tensors)}"]
    if found.problem is not None:
        lines.append(f"  {found.problem}")
    else:
        element = found.element
        ulp = f", {element['ulp']} ulp apart" if "ulp" in element else ""
        lines.append(f"  tensor {found.tensor}, element {element['coords'] or 'scalar'} (flat {element['index']}): "
                     f"oracle {element['expected']} [{element['expected_bits']}], "
                     f"device {element['actual']} [{element['actual_bits']}]{ulp}")
        lines.extend(f"  {diff.summary()}" for diff in found.diffs)
        lines.append(f"  chained run diverges at: {', '.join(found.diverged_stages)}")
    origin = isolated[0] if isolated else None
    if origin:
        lines.append(f"  isolated re-run of step {found.step} diverges at: {', '.join(isolated)} "
                     f"-> the divergence originates in {origin}{_kernel(origin, ratio, options)}")
    else:
        lines.append(f"  isolated re-run of step {found.step} is clean: the divergence comes from "
                     "device state carried in from earlier steps")
    lines.append(f"  reproduce: {_reproduce(found, isolated, options, case)}")
    return lines


def _reproduce(found: StepVerdict, isolated: list[str], options: RunOptions, case: str) -> str:
    origin = isolated[0] if isolated else None
    command = options.fault_command if _faulted(found) else options.command
    return command(case, origin or found.stage, Mode.ISOLATED if origin else None)


def _faulted(found: StepVerdict) -> bool:
    """Whether the first divergence is a launch that faulted or hung (a divergence bisect reports as such)."""
    return found.problem_type in (FAULT, HANG)


def _case(case: str, steps: int, found: StepVerdict | None, isolated: list[str], options: RunOptions,
          seconds: float) -> dict:
    failing = []
    if found is not None:
        reproduce = _reproduce(found, isolated, options, case)
        if found.problem is not None:
            failing.append(StepEntry(found.step, failure=Failure(
                found.problem_type if _faulted(found) else STEP_REJECTED, found.problem, reproduce,
                {"stage": found.stage})))
        else:
            failing.append(StepEntry(found.step, stages=[StageEntry(found.stage, reproduce, found.diffs)]))
    return CaseEntry(
        case, passed=found is None, time_s=seconds, reproduce=options.command(case, "all"),
        steps_total=steps, steps_compared=steps if found is None else found.step + 1, steps=failing,
    ).to_json()


@exits("no divergence", "divergence found (a kernel that faulted or hung too)", bisect=True)
@click.command("bisect")
@golden_file(DEFAULT_FILE)
@case_selection(exact=True)
@device_options
@output_options
@boundary
def bisect(file, case, device: DeviceOptions, output: OutputOptions):
    """Find the first divergent step, stage, tensor and element of a stream (oracle vs device values, ULP).

    \b
    Examples:
      csa-conform bisect --case random.r4-stream-3 --kernels ./my-kernels
      csa-conform bisect goldens/ci.h5 --case random.r4-stream-3 --json > bisect.json
    """
    options = device.run_options(file)
    started = time.perf_counter()
    chained, isolated_runner = options.runner(Mode.CHAINED), options.runner(Mode.ISOLATED)
    with GoldenFile(file) as golden:
        if case not in golden.case_ids():
            raise UsageError(f"{file} has no case {case!r}")
        golden_ref = golden_reference(file, golden.schema_version)
        steps = golden.case_info(case).step_count
        golden_ratio = golden.case_info(case).attrs.get("compression_ratio")
        found = _first_divergence(golden, case, options, chained, steps, output.quiet or output.as_json)
        isolated = _isolated_stages(golden, case, found.step, options, isolated_runner) if found else []
    code = ExitCode.DIVERGED if found else ExitCode.OK
    control = control_run(chained.provenance) and (
        not isolated_runner.provenance.launches or control_run(isolated_runner.provenance))
    if control:
        click.secho(control_banner(options), err=True, fg="yellow", bold=True)
    if output.as_json:
        summary = None
        if found is not None:
            summary = {"step": found.step, "stage": found.stage, "tensor": found.tensor, "element": found.element,
                       "message": found.problem,
                       "chained_divergent_stages": list(found.diverged_stages) or [found.stage]}
        emit_json(results_document(
            "bisect", argv(), [_case(case, steps, found, isolated, options, time.perf_counter() - started)],
            exit_code=code, golden=golden_ref, kernels=kernel_provenance(chained.provenance), control=control,
            options=options.describe(),
            extra={"bisect": {"first_divergence": summary, "isolated_divergent_stages": isolated,
                              "origin": isolated[0] if isolated else None}},
        ))
    elif found:
        for line in _describe(case, steps, found, isolated, options, golden_ratio):
            click.echo(line)
    elif not chained.provenance.launches:
        click.echo(f"case {escaped(case)}: {steps} steps, nothing ran: the reference rejects every step of it, so no stage "
                   "was computed and there is nothing to compare")
    else:
        click.echo(f"case {escaped(case)}: {steps} steps, no divergence (chained, every stage)")
    return code
