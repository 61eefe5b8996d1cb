"""``csa-conform gap``: how far the official numerics are from the CPU reference, per stage and tensor."""

from __future__ import annotations

import time

import click
from rich.table import Table

from csa_conform._base.case_glob import exact_glob, matching_cases
from csa_conform._base.terminal import one_line, shell_join
from csa_conform.check.gap import COLUMNS, ProviderSteps, headline, markdown_table, measure_file, table_rows
from csa_conform.check.model import CaseVerdict
from csa_conform.check.options import BuildChoice, RunOptions
from csa_conform.device.provider import is_provider
from csa_conform.errors import UsageError
from csa_conform.spec import Mode
from csa_conform.check.results import golden_reference, results_document
from csa_conform.cli.common import argv, boundary, console, emit_json, print_table, stdout_is_terminal
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import DEFAULT_FILE, case_selection, engine_option, golden_file
from csa_conform.compare.errorstats import CHAINED, MODES, Gap
from csa_conform.exitcodes import ExitCode, verdicts_code
from csa_conform.golden import GoldenFile
from csa_conform.oracle.engine import chosen_engine
from csa_conform.profiles.numerics import NUMERICS_PROFILES, OFFICIAL, REFERENCE


@exits("measured (the gap is a measurement, not a gate)")
@click.command("gap")
@golden_file(DEFAULT_FILE)
@case_selection()
@click.option("--profile", type=click.Choice(list(NUMERICS_PROFILES)), default=OFFICIAL,
              show_default=True, help="The profile compared with the reference (with --kernels: the profile the "
              "provider is compared with).")
@click.option("--kernels", default=None, metavar="python:MODULE:OBJECT",
              help="A Python stage provider (specs/providers.md) measured against --profile, instead of the "
              "profile against the reference.")
@click.option("--mode", type=click.Choice(MODES), default=CHAINED, show_default=True,
              help="chained: the profile's stages read its own payloads; isolated: each reads the reference's.")
@click.option("--markdown", is_flag=True, help="Print the table as markdown (as specs/official-profile.md records it).")
@click.option("--json", "as_json", is_flag=True, help="Print the results document (its gap field holds the statistics).")
@engine_option
@boundary
def gap_command(file: str, case_glob: str | None, profile: str, kernels: str | None, mode: str, markdown: bool,
                as_json: bool, engine: str | None) -> ExitCode:
    """Run the reference and another numerics profile on the same inputs; error statistics per stage.

    Every step of FILE (default: the packaged ci suite) runs under both
    profiles; per stage and tensor: steps and elements identical bit for bit,
    max / mean / median / p99 / p99.9 of absolute, relative and ULP error,
    the largest cosine distance of a step, -inf mask agreement, top-k set
    overlap and rank changes, per-row argmax identity of Y.

    \b
    Examples:
      csa-conform gap
      csa-conform gap build/full.h5 --markdown
      csa-conform gap build/full.h5 --mode isolated
      csa-conform gap goldens/ci.h5 --case 'random.*' --json > gap.json
      csa-conform gap build/official.h5 --kernels python:examples/providers/torch_official.py:TorchOfficial
    """
    engine = chosen_engine(engine)
    started = time.monotonic()
    actual = None
    if kernels is not None:
        if not is_provider(kernels):
            raise UsageError(f"--kernels {kernels}: gap measures a python: provider (python:MODULE:OBJECT), "
                             "not a kernel directory")
        actual = ProviderSteps(RunOptions(file=file, mode=Mode(mode), force_host=frozenset(), ulp=0,
                                          build=BuildChoice(kernels=kernels)))
    elif profile == REFERENCE:
        raise UsageError("--profile reference is the reference: give another profile, or --kernels python:…")
    gap = Gap(profile, kernels, mode) if actual else Gap(REFERENCE, profile, mode)
    with GoldenFile(file) as golden:
        case_ids = matching_cases(golden.case_ids(), case_glob, golden.path)
        schema_version = golden.schema_version
    invalid = measure_file(gap, file, case_ids, engine, actual)
    code = verdicts_code(bool(invalid), bool(invalid))
    entry = gap.entry()
    if as_json:
        elapsed = time.monotonic() - started
        cases = [_case_entry(case_id, file, elapsed / max(1, len(case_ids)), invalid.get(case_id))
                 for case_id in case_ids]
        emit_json(results_document("gap", argv(), cases, exit_code=code,
                                   golden=golden_reference(file, schema_version),
                                   options={"profile": profile, "mode": mode,
                                            **({"kernels": kernels} if kernels else {})},
                                   extra={"gap": entry}))
    elif markdown:
        click.echo(markdown_table(entry))
    elif stdout_is_terminal():
        table = Table(title=headline(entry, file))
        for column in COLUMNS:
            table.add_column(column, overflow="fold")
        for cells in table_rows(entry):
            table.add_row(*cells)
        print_table(console(), table)
    else:
        click.echo(headline(entry, file))
        click.echo("\t".join(COLUMNS))
        for cells in table_rows(entry):
            click.echo("\t".join(cells))
    for case_id, reason in invalid.items() if not as_json else ():
        click.echo(one_line(f"{case_id}: invalid, not measured: {reason}"), err=markdown)
    return code


def _case_entry(case_id: str, file: str, time_s: float, invalid: str | None) -> dict:
    reproduce = shell_join(["csa-conform", "gap", file, "--case", exact_glob(case_id)])
    verdict = CaseVerdict(case_id, reproduce, family=case_id.split(".", 1)[0], invalid=invalid, time_s=time_s)
    return verdict.entry().to_json()
