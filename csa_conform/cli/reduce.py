"""`csa-conform reduce`: shrink a divergent case to a one-case golden file that still diverges.

Presentation only: the search is csa_conform.repro.reduce. Progress goes to stderr,
the outcome to stdout; the file is written only once the reduced case has
been checked against the oracle and the built-in kernels.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import click

from csa_conform.check.model import StepVerdict
from csa_conform.check.options import RunOptions
from csa_conform.check.verify import verify_case
from csa_conform.cli.common import boundary
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import (
    DEFAULT_FILE,
    DeviceOptions,
    case_selection,
    device_options,
    golden_file,
    quiet_option,
)
from csa_conform.device.backend import backend_named
from csa_conform.device.kernels import KernelDirectory
from csa_conform.device.runner import DeviceRunner
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile, write_goldens
from csa_conform.golden.carries import step_start
from csa_conform.golden.edits import Stream, stream_of
from csa_conform.repro.reduce import (
    FILE_CASES,
    Probe,
    ProbedFile,
    Reduction,
    alike_finder,
    describe,
    floor_of,
    reduce_case,
    reduce_file,
)
from csa_conform.spec import Mode


def _sizes(before: dict[str, int], after: dict[str, int]) -> str:
    return ", ".join(f"{key} {before[key]} -> {after[key]}" for key in before)


def _elements(original: Stream, reduced: Stream) -> str:
    """Sizes before and after, and the floor: what the contract fixes for the reduced case's rows
    and position."""
    before, after = original.elements(), reduced.elements()
    first, window = reduced.window_floor()
    fixed = reduced.fixed_elements() + window
    rows = f"{reduced.batch} rows'" if reduced.batch > 1 else "one row's"
    from_zero = step_start(reduced.steps[-1]) == 0
    state = "cursors" if from_zero else "carries, past records and cursors"
    line = (f"input elements: {before:,} -> {after:,} ({after / before:.1%}); the contract fixes {fixed:,} of them "
            f"(compressor ape and norm, {rows} {state}, a current_kv from position {first}"
            + ("; no carries: a step from position 0 may omit them)" if from_zero else ")"))
    if before > fixed:
        line += f"; of the {before - fixed:,} it lets vary, {after - fixed:,} remain ({(after - fixed) / (before - fixed):.1%})"
    return line


def _starting_points(reduction: Reduction) -> str:
    """Which starting point won (another case of the file names itself), and what each reduced to."""
    tried = "; ".join(f"{name} -> {elements:,}" for name, elements in reduction.starts)
    return f"smallest from {reduction.start}; starting points tried: {tried}"


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _floor(reduction: Reduction) -> str:
    """How far the reduction got and what bounds it: the fixed-shape inputs, the window, the rest."""
    floor = floor_of(reduction.reduced)
    after = reduction.reduced.elements()
    fixed = ", ".join(f"{name} {_shape(shape)} ({elements:,})" for name, (shape, elements) in floor.fixed.items())
    if floor.window:
        fixed += f", current_kv from position {floor.window_from} ({floor.window:,})"
    rest = after - floor.fixed_elements
    varying = ", ".join(f"{name} {elements:,}" for name, elements in list(floor.varying.items())[:4])
    bound = ("bound by the contract's fixed-shape inputs" if 2 * rest <= after
             else "bound by what the divergence needs")
    stop = ("a fixed point: no edit reduce knows keeps the divergence with less" if reduction.complete else
            "the budget ran out before a fixed point: a larger --budget-s may reduce it further")
    return (f"floor: {floor.fixed_elements:,} of the {after:,} input elements are fixed by the contract ({fixed}); "
            f"{rest:,} vary ({varying or 'none'}): {bound}; stopped at {stop}")


@exits("the case did not diverge", "the reduced case diverges (reproduced)", bisect=True)
@click.command("reduce")
@golden_file(DEFAULT_FILE)
@case_selection(exact=True, without=f"reduce the file's {FILE_CASES} smallest diverging cases, keep the smallest "
                                    "repro")
@device_options
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="The reduced one-case golden file (default: CASE.reduced.h5, or reduced.h5 without --case).")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option("--budget-s", default=300.0, type=click.FloatRange(min=1), show_default=True,
              help="Stop searching after this many seconds; the smallest case found so far is written.")
@quiet_option("No progress on stderr.")
@boundary
def reduce_command(file, case, device: DeviceOptions, output, force, budget_s, quiet):
    """Shrink a divergent case while its first divergent stage and tensor still diverge.

    Starts the stream at the failing step from its stored past state, then drops batch rows,
    restarts the failing token at position 0, omits the carries of a step from position 0 (the
    contract clears them; the file's readers supply them cleared), drops past records, query
    tokens, heads, index heads, top-k slots, the bias and leading steps. The one-case golden file verifies against the
    oracle, diverges with these kernels and passes with the built-in ones. Without --case, the
    file's smallest diverging cases are reduced and the smallest repro is kept.

    \b
    Examples:
      csa-conform reduce --case random.r4-b2n2-i2-k512 --kernels ./my-kernels -o repro.h5
      csa-conform reduce goldens/ci.h5 --case boundaries.r4-prefill-9 --kernels ./my-kernels --build production
      csa-conform reduce goldens/ci.h5 --kernels ./my-kernels --budget-s 120
    """
    options = device.run_options(file)
    output = Path(output or (f"{case}.reduced.h5" if case else "reduced.h5"))
    if output.exists() and not force:
        raise UsageError(f"{output} exists; pass --force to overwrite it")

    def say(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)

    with tempfile.TemporaryDirectory(prefix="csa-reduce-") as work:
        probe = Probe(options.runner(), Path(work), options.ulp)
        with GoldenFile(file) as golden:
            if case is not None and case not in golden.case_ids():
                raise UsageError(f"{file} has no case {case!r}")
            streams = {case_id: stream_of(golden, case_id) for case_id in golden.case_ids()}
        with ProbedFile(Path(file), probe) as probed:
            if case is None:
                found_file = reduce_file(probed, streams, budget_s, say)
                reduction = None if found_file is None else found_file.best
            else:
                reduction = reduce_case(streams[case], case, probe, budget_s, say,
                                        alike_finder(probed, streams, case, say))
        if reduction is None:
            subject = f"case {case}" if case else f"{file}: no probed case"
            click.echo(f"{subject}: no divergence (chained, every stage): nothing to reduce")
            return ExitCode.OK
        builtin_found: StepVerdict | None | str = BUILTIN_NOT_RUN
        if not probe_on_cpu(options):
            builtin = DeviceRunner(KernelDirectory(), mode=Mode.CHAINED, force_host=options.force_host,
                                   backend_factory=backend_named(options.backend))
            builtin_found = Probe(builtin, Path(work), options.ulp)(reduction.case)
    if case is None:
        case = found_file.case_id
        click.echo(f"smallest repro from {case}: {len(found_file.diverging)} diverging of {found_file.scanned} cases "
                   f"probed (smallest first); reduced " +
                   ", ".join(f"{case_id} {before:,} -> {after:,}" for case_id, before, after in found_file.reduced))
    _report(reduction, case, output, force, budget_s, builtin_found, options)
    return ExitCode.DIVERGED


# What reduce says of the built-in control where it does not run it.
BUILTIN_NOT_RUN = "not run (a python: provider on the CPU; the built-in kernels need a GPU or --backend host)"


def probe_on_cpu(options: RunOptions) -> bool:
    """A CPU provider's reduction: the built-in kernels, CUDA by default, are not the control it can run."""
    return options.build.provider and options.runner().provider.device == "cpu"


def _report(reduction: Reduction, case: str, output: Path, force: bool, budget_s: float,
            builtin_found: StepVerdict | None | str, options: RunOptions) -> None:
    write_goldens(output, [reduction.case], force=force)
    with GoldenFile(output) as written:
        verified = verify_case(written, reduction.case.case_id)
    stop = "a fixed point" if reduction.complete else f"the {budget_s:g} s budget"
    found = reduction.found
    click.echo(f"reduced {case} in {reduction.trials} trials, {reduction.seconds:.1f} s (stopped at {stop}): "
               f"{_sizes(reduction.original.shape(), reduction.reduced.shape())}")
    click.echo(_elements(reduction.original, reduction.reduced))
    click.echo(_starting_points(reduction))
    click.echo(_floor(reduction))
    click.echo(f"still diverges first at {describe(found)} (step {found.step}), as the original")
    click.echo("verified against the oracle: " + ("yes" if verified.passed else "NO (a bug in reduce)"))
    click.echo("built-in kernels: " + ("pass" if builtin_found is None else builtin_found
                                       if isinstance(builtin_found, str) else
                                       f"DIVERGE at {describe(builtin_found)} (not a kernel bug alone)"))
    click.echo(f"wrote {output}")
    reproduce = replace(options, file=str(output))
    click.echo(f"reproduce: {reproduce.command(reduction.case.case_id, 'all')}")
