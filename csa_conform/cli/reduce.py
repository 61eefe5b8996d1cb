"""`csa-conform reduce`: shrink a divergent case to a one-case golden file that still diverges.

Presentation only: the search is csa_conform.reduce. Progress goes to stderr,
the outcome to stdout; the file is written only once the reduced case has
been checked against the oracle and the built-in kernels.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from csa_conform.cli.common import boundary
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import (
    DEFAULT_FILE,
    case_selection,
    device_options,
    effective_force_host,
    golden_file,
    quiet_option,
)
from csa_conform.device.backend import backend_named
from csa_conform.device.kernels import KernelDirectory
from csa_conform.device.modes import Mode
from csa_conform.device.runner import DeviceRunner
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile, write_goldens
from csa_conform.reduce import Probe, describe, reduce_case
from csa_conform.run import RunOptions
from csa_conform.streams import stream_of
from csa_conform.verify import verify_case


def _sizes(before: dict[str, int], after: dict[str, int]) -> str:
    return ", ".join(f"{key} {before[key]} -> {after[key]}" for key in before)


@exits("the case did not diverge", "the reduced case diverges (reproduced)", bisect=True)
@click.command("reduce")
@golden_file(DEFAULT_FILE)
@case_selection(exact=True)
@device_options
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="The reduced one-case golden file (default: CASE.reduced.h5).")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@click.option("--budget-s", default=300.0, type=click.FloatRange(min=1), show_default=True,
              help="Stop searching after this many seconds; the smallest case found so far is written.")
@quiet_option("No progress on stderr.")
@boundary
def reduce_command(file, case, force_host, build, backend, ulp, git_bisect, output, force, budget_s, quiet):
    """Shrink a divergent case while its first divergent stage and tensor still diverge.

    Starts the stream at the failing step from its stored past state, then drops batch rows,
    query tokens, heads, index heads, top-k slots and leading steps. The one-case golden file
    verifies against the oracle, diverges with these kernels and passes with the built-in ones.

    \b
    Examples:
      csa-conform reduce --case random.r4-b2n2-i2-k512 --kernels ./my-kernels -o repro.h5
      csa-conform reduce goldens/ci.h5 --case boundaries.r4-prefill-9 --kernels ./my-kernels --build production
    """
    options = RunOptions(file, Mode.CHAINED, effective_force_host(force_host), ulp, build, backend=backend)
    output = Path(output or f"{case}.reduced.h5")
    if output.exists() and not force:
        raise UsageError(f"{output} exists; pass --force to overwrite it")
    with GoldenFile(file) as golden:
        if case not in golden.case_ids():
            raise UsageError(f"{file} has no case {case!r}")
        stream = stream_of(golden, case)

    def say(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)

    with tempfile.TemporaryDirectory(prefix="csa-reduce-") as work:
        reduction = reduce_case(stream, case, Probe(options.runner(), Path(work), ulp), budget_s, say)
        if reduction is None:
            click.echo(f"case {case}: no divergence (chained, every stage): nothing to reduce")
            return ExitCode.OK
        builtin = DeviceRunner(KernelDirectory(), mode=Mode.CHAINED, force_host=options.force_host,
                               backend_factory=backend_named(backend))
        builtin_found = Probe(builtin, Path(work), ulp)(reduction.case)
    write_goldens(output, [reduction.case], force=force)
    with GoldenFile(output) as written:
        verified = verify_case(written, reduction.case.case_id)
    before, after = reduction.original.elements(), reduction.reduced.elements()
    stop = "a fixed point" if reduction.complete else f"the {budget_s:g} s budget"
    found = reduction.found
    click.echo(f"reduced {case} in {reduction.trials} trials, {reduction.seconds:.1f} s (stopped at {stop}): "
               f"{_sizes(reduction.original.shape(), reduction.reduced.shape())}")
    click.echo(f"input elements: {before:,} -> {after:,} ({after / before:.1%})")
    click.echo(f"still diverges first at {describe(found)} (step {found['step']}), as the original")
    click.echo("verified against the oracle: " + ("yes" if verified.passed else "NO (a bug in reduce)"))
    click.echo("built-in kernels: " + ("pass" if builtin_found is None else
                                       f"DIVERGE at {describe(builtin_found)} (not a kernel bug alone)"))
    click.echo(f"wrote {output}")
    reproduce = RunOptions(str(output), Mode.CHAINED, options.force_host, ulp, build, backend=backend)
    click.echo(f"reproduce: {reproduce.command(reduction.case.case_id, 'all')}")
    return ExitCode.DIVERGED
