"""``csa-conform calibrate``: tolerances per stage and tensor from the measured official-numerics gap."""

from __future__ import annotations

from pathlib import Path

import click

from csa_conform._base.atomic import write_atomically
from csa_conform.check.gap import measure_file
from csa_conform.cli.common import boundary
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import engine_option
from csa_conform.compare.errorstats import ISOLATED, MODES, Gap
from csa_conform.compare.tolerance import MARGIN, Tolerances
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.oracle.engine import chosen_engine
from csa_conform.profiles.numerics import NUMERICS_PROFILES, OFFICIAL, REFERENCE


@exits("written")
@click.command("calibrate")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The tolerance file to write (TOML).")
@click.option("--profile", type=click.Choice([p for p in NUMERICS_PROFILES if p != REFERENCE]), default=OFFICIAL,
              show_default=True, help="The profile whose distance from the reference sets the envelope.")
@click.option("--mode", type=click.Choice(MODES), default=ISOLATED, show_default=True,
              help="isolated: each stage's own arithmetic; chained: differences carried down the pipeline.")
@click.option("--margin", type=click.FloatRange(min=1.0), default=MARGIN, show_default=True,
              help="Factor on every measured statistic.")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@engine_option
@boundary
def calibrate_command(files: tuple[str, ...], output: Path, profile: str, mode: str, margin: float, force: bool,
                      engine: str | None) -> ExitCode:
    """Measure the reference-to-official gap over FILE... and write the envelope diff --tolerance gates with.

    Per stage and tensor: exact when both profiles agree bit for bit on every
    step; otherwise limits at MARGIN times the measured abs.max, abs.p99
    and largest cosine distance (floats, -inf masks exact), share of
    differing rows and worst set overlap (indices), share of differing bytes
    (records). specs/official-profile.md, "Calibrated tolerances".

    \b
    Examples:
      csa-conform calibrate build/full.h5 -o build/tolerances.toml
      csa-conform calibrate goldens/ci.h5 build/full.h5 --margin 3 -o tolerances.toml --force
    """
    engine = chosen_engine(engine)
    if output.exists() and not force:
        raise UsageError(f"{output} exists; pass --force to overwrite it")
    gap = Gap(REFERENCE, profile, mode)
    for path in files:
        measure_file(gap, path, engine=engine)
    tolerances = Tolerances.calibrated(gap, list(files), margin)
    write_atomically(output, tolerances.to_toml().encode("utf-8"), replace=force)
    exact = sum(limits["exact"] for limits in tolerances.limits.values())
    click.echo(f"wrote {output}: {len(tolerances.limits)} stage tensors ({exact} exact), "
               f"{gap.compared} steps of {len(files)} file(s), margin {margin:g}")
    return ExitCode.OK
