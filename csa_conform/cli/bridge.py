"""``csa-conform bridge``: run golden steps through the runtime's conformance runner and judge its outputs.

Presentation only: export, protocol and judging live in csa_conform.bridge.
"""

from __future__ import annotations

import re
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import click

from csa_conform.bridge.export import removed_on_signal
from csa_conform.bridge.model import onnx_module
from csa_conform.bridge.protocol import runner_words, stop_runners
from csa_conform.bridge.replay import (
    DEFAULT_FORCE_HOST_ENV,
    DEFAULT_TIMEOUT_S,
    MODES,
    PLAIN,
    RUNNER_ERROR,
    UNSUPPORTED_FAILURE,
    BridgeCase,
    BridgeOptions,
    judge_case,
)
from csa_conform._base.case_glob import matching_cases
from csa_conform._base.terminal import escaped, one_line
from csa_conform.check.results import golden_reference, results_document
from csa_conform.cli.common import argv, boundary, emit_json, progress
from csa_conform.cli.diff import envelope_lines
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import OutputOptions, case_selection, golden_file, grouped, jobs_option, output_options
from csa_conform.compare.tolerance import Tolerances
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _environment(context, param, values) -> tuple[tuple[str, str], ...]:
    pairs = []
    for value in values:
        key, equals, setting = value.partition("=")
        if not equals or not _NAME.fullmatch(key):
            raise click.BadParameter(f"{value!r} is not K=V with K a variable name")
        pairs.append((key, setting))
    return tuple(pairs)


def _variable(context, param, value: str) -> str:
    if value and not _NAME.fullmatch(value):
        raise click.BadParameter(f"{value!r} is not a variable name (give '' to run each step once, plain)")
    return value


@dataclass(frozen=True)
class RuntimeRunner:
    """How each runner process is started (--runner, --env, --force-host-env, --timeout-s)."""

    runner: str
    environment: tuple[tuple[str, str], ...]
    force_host_env: str
    timeout_s: float


def _cases(golden: GoldenFile, case_ids: list[str], options: BridgeOptions, work: Path, jobs: int,
           quiet: bool, measure: bool) -> list[BridgeCase]:
    """Every case judged, in case-id order; with --jobs each worker thread reads the file through its own handle."""
    local = threading.local()
    opened: list[GoldenFile] = []
    lock = threading.Lock()

    def judge(case_id: str) -> BridgeCase:
        if jobs == 1:
            return judge_case(golden, case_id, options, work, measure)
        if not hasattr(local, "golden"):
            local.golden = GoldenFile(golden.path)
            with lock:
                opened.append(local.golden)
        return judge_case(local.golden, case_id, options, work, measure)

    def describe(done: BridgeCase) -> str:
        return f"{'ok  ' if done.result.passed else 'FAIL'} {done.result.case}"

    try:
        if jobs == 1:
            return list(progress(map(judge, case_ids), len(case_ids), "bridge", describe, quiet))
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(progress(pool.map(judge, case_ids), len(case_ids), "bridge", describe, quiet))
    except BaseException:
        stop_runners()
        raise
    finally:
        for golden in opened:
            golden.close()


def _exit_code(cases: list[BridgeCase], judged: dict | None) -> ExitCode:
    """4 for a runner that failed; else, with --tolerance, the envelope (and every output back) is the gate;
    else bit equality."""
    problems = [run.problem.type for case in cases for runs in case.runs.values() for run in runs if run.problem]
    if RUNNER_ERROR in problems:
        return ExitCode.ENVIRONMENT
    if judged is not None:
        return ExitCode.OK if judged["within"] and all(case.sound for case in cases) else ExitCode.DIVERGED
    return ExitCode.OK if all(case.result.passed for case in cases) else ExitCode.DIVERGED


def _summary(cases: list[BridgeCase], file: str) -> str:
    kinds = {RUNNER_ERROR: 0, UNSUPPORTED_FAILURE: 0}
    for case in cases:
        found = {run.problem.type for runs in case.runs.values() for run in runs if run.problem}
        for kind in kinds:
            kinds[kind] += kind in found
    failed = sum(not case.result.passed for case in cases)
    steps = sum(len(case.result.steps) for case in cases)
    refused = sum(len(case.result.rejected_steps) for case in cases)
    return (f"bridge: {len(cases) - failed}/{len(cases)} cases conformant ({steps} steps, {refused} of them "
            f"rejected by the reference) in {escaped(file)}; {failed} failed"
            f" ({kinds[UNSUPPORTED_FAILURE]} unsupported, {kinds[RUNNER_ERROR]} runner errors)")


@exits("conformant: every output of every step bit-identical, every rejected step refused",
       "a divergence, an unsupported operator or an accepted rejected step")
@click.command("bridge")
@golden_file()
@click.option("--runner", required=True, metavar="'CMD {model} {case_dir}'",
              help="The runtime's conformance runner as a command template; {model} and {case_dir} are replaced "
              "per step (e.g. 'target/release/examples/conformance_runner {model} {case_dir}').")
@case_selection()
@click.option("--env", "environment", multiple=True, metavar="K=V", callback=_environment,
              help="Set K=V in the runner's environment (repeatable).")
@click.option("--force-host-env", default=DEFAULT_FORCE_HOST_ENV, show_default=True, metavar="NAME",
              callback=_variable,
              help="Run every step twice, plain (NAME unset) and with NAME=1, and say which leaves the goldens "
              "first; '' runs each step once, plain.")
@click.option("--mode", type=click.Choice(MODES), default=None,
              help="chained: the runtime's own present_* feed the next step's past_*; isolated: every step reads "
              f"the golden state. Default: {MODES[0]}, or with --tolerance the mode the file was calibrated in.")
@click.option("--ulp", default=0, type=click.IntRange(min=0), show_default=True,
              help="Accept float differences up to N ULP (packed records and indices stay exact).")
@click.option("--timeout-s", default=DEFAULT_TIMEOUT_S, type=click.FloatRange(min=0, min_open=True),
              show_default=True, help="Seconds one runner process may take before it is killed.")
@click.option("--tolerance", "tolerance", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Also judge every output against the envelope a tolerance file (csa-conform calibrate) gives "
              "the stage computing it; the envelope, not bit equality, is then the gate.")
@jobs_option("Cases run at once (each a stream of runner processes).")
@output_options
@grouped("runtime", RuntimeRunner)
@boundary
def bridge_command(file: str, runtime: RuntimeRunner, case_glob: str | None, mode: str, ulp: int,
                   tolerance: str | None, jobs: int, output: OutputOptions) -> ExitCode:
    """Run every step of FILE through the runtime's conformance runner and compare its outputs bit for bit.

    Each step is exported as a single-node model with its .nxrt inputs (as
    csa-conform export --format nxrt-bridge writes it) into a temporary
    folder; the runner prints OK, UNSUPPORTED_OP (exit 2) or ERROR (exit 3).
    A runner that errs on a step that should run, crashes, hangs past
    --timeout-s, prints no status or writes an unreadable output is exit 4.
    Needs the onnx package (the onnx extra).

    \b
    Examples:
      csa-conform bridge goldens/ci.h5 --runner 'conformance_runner {model} {case_dir}'
      csa-conform bridge goldens/ci.h5 --runner 'python -m csa_conform.bridge.stand_in {model} {case_dir}' -q
      csa-conform bridge goldens/ci.h5 --case 'random.*' --runner './runner {model} {case_dir}' --env RUST_LOG=warn --json
    """
    envelope = Tolerances.read(tolerance) if tolerance else None
    mode = envelope.run_mode(tolerance, mode) if envelope is not None else mode or MODES[0]
    options = BridgeOptions(file, runtime.runner, tuple(runner_words(runtime.runner)), runtime.environment,
                            runtime.force_host_env, mode, ulp, runtime.timeout_s, tolerance)
    onnx_module()
    with GoldenFile(file) as golden:
        case_ids = matching_cases(golden.case_ids(), case_glob, golden.path)
        schema_version = golden.schema_version
        with tempfile.TemporaryDirectory(prefix="csa-conform-bridge-") as work:
            with removed_on_signal(Path(work), stop_runners):
                cases = _cases(golden, case_ids, options, Path(work), jobs, output.quiet or output.as_json,
                               envelope is not None)
    # diff's dual verdict over the cases' error statistics (each output under the stage computing it)
    judged = envelope.judge_run(str(tolerance), [case.errors for case in cases]) if envelope is not None else None
    code = _exit_code(cases, judged)
    if output.as_json:
        emit_json(results_document(
            "bridge", argv(), [case.result.entry().to_json() for case in cases], exit_code=code,
            golden=golden_reference(file, schema_version),
            options={"mode": mode, "ulp": ulp, **({"tolerance": tolerance} if tolerance else {})},
            extra={"bridge": {**options.describe(), "runs": list(options.runs),
                              "streams": [case.differential() for case in cases],
                              "statuses": [run.record(case.result.case) for case in cases
                                           for runs in case.runs.values() for run in runs]},
                   **({"tolerance": judged} if judged is not None else {})}))
        return code
    if not output.quiet:
        runs = "plain and force-host" + f" ({options.force_host_env}=1)" if options.force_host_env else PLAIN
        click.echo(one_line(f"csa-conform bridge {file}: runner {options.runner}, mode {mode}, runs {runs}, "
                            f"at most {options.timeout_s:g} s a step"))
    for case in cases:
        for line in case.result.failure_lines():
            click.echo(line)
        differential = case.differential_line()
        if differential is not None:
            click.echo(one_line(differential))
    click.echo(_summary(cases, file))
    if judged is not None and envelope is not None:
        for line in envelope_lines(judged, envelope):
            click.echo(line)
    return code
