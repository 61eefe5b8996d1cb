"""`csa-conform fuzz`: Hypothesis-drawn valid cases, device against oracle, the first divergence shrunk.

Presentation only: the search is csa_conform.repro.fuzz. Progress goes to stderr,
the outcome to stdout; the found case is written as a one-case golden file.
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

import click

from csa_conform.cli.common import boundary
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import DeviceOptions, device_options, quiet_option
from csa_conform.errors import MissingExtra, UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import write_goldens
from csa_conform.repro.reduce import Probe, describe


@exits("the budget ran out without a divergence", "a divergence was found (and written)", bisect=True)
@click.command("fuzz")
@device_options
@click.option("--budget-s", default=120.0, type=click.FloatRange(min=1), show_default=True,
              help="Seconds to search; a divergence found is then shrunk for at most as long again.")
@click.option("--seed", default=None, type=click.IntRange(min=0),
              help="Hypothesis's seed: the same seed draws the same cases in the same order (the database is "
              "then not used). Default: new draws each run.")
@click.option("--database", default=".hypothesis/examples", type=click.Path(file_okay=False), show_default=True,
              help="Hypothesis's example database (runs without --seed): failures found before are replayed "
              "first.")
@click.option("-o", "--output", default="fuzz-found.h5", type=click.Path(dir_okay=False), show_default=True,
              help="The one-case golden file the diverging case is written to.")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@quiet_option("No progress on stderr.")
@boundary
def fuzz_command(device: DeviceOptions, budget_s, seed, database, output, force, quiet):
    """Draw valid cases at the suite's thin edges until the kernels diverge from the oracle; shrink it.

    Both ratios, f32/FP8 caches, 5/6 outputs, every bias shape, streams and resumed streams, block
    edges, every kv window offset, N and I in 1..8, sinks above and below the row max.

    \b
    Examples:
      csa-conform fuzz --kernels ./my-kernels --budget-s 120 -o found.h5
      csa-conform fuzz --kernels ./my-kernels --seed 3        # the same draws every time
    """
    try:
        from csa_conform.repro.fuzz import fuzz
    except ImportError as error:
        raise MissingExtra(f"fuzz needs hypothesis ({error}): pip install 'csa-conform[fuzz]'") from None
    output = Path(output)
    if output.exists() and not force:
        raise UsageError(f"{output} exists; pass --force to overwrite it")
    options = device.run_options(str(output))

    def say(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)

    with tempfile.TemporaryDirectory(prefix="csa-fuzz-") as work:
        run = fuzz(Probe(options.runner(), Path(work), options.ulp), budget_s, seed, Path(database), say)
    replay = ["csa-conform", "fuzz", *options.device_words(), "--budget-s", f"{budget_s:g}"]
    replay += ["--seed", str(seed)] if seed is not None else ["--database", database]
    drawn = f"seed {seed}" if seed is not None else f"database {database}"
    if run.found is None:
        click.echo(f"fuzz: no divergence in {run.valid} valid cases ({run.examples} drawn) in {run.seconds:.0f} s; "
                   f"{drawn}")
        return ExitCode.OK
    found = run.found
    write_goldens(output, [found.case], force=force)
    click.echo(f"fuzz: divergence at {describe(found.divergence)} (step {found.divergence.step}) after "
               f"{run.valid} valid cases ({run.examples} drawn) in {run.seconds:.0f} s (the first diverging one "
               f"in {run.first_s:.0f} s)")
    click.echo(f"  case: {found.draw.describe()}")
    click.echo(f"  input elements: {found.size:,}")
    click.echo(f"wrote {output}")
    click.echo(f"reproduce: {options.command(found.case.case_id, 'all')}")
    click.echo(f"replay the search: {shlex.join(replay)}")
    return ExitCode.DIVERGED
