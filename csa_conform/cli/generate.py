"""``csa-conform generate``: build a suite's fixtures, run the oracle, write goldens."""

from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Iterator

import click

from csa_conform._base.case_glob import exact_glob
from csa_conform._base.memory import small_pages
from csa_conform._base.terminal import shell_join
from csa_conform.cli.common import boundary, capped_jobs, fan_out, progress
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import case_selection, engine_option, grouped, jobs_option, quiet_option
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import Compression, GoldenCase, write_goldens
from csa_conform.golden.chunks import StoredCase, store_case
from csa_conform.golden.recipes import SUITES, FixtureError, Recipe, suite_recipes
from csa_conform.oracle.engine import chosen_engine
from csa_conform.profiles.numerics import NUMERICS_PROFILES, REFERENCE, provenance_entry, runner


def generate_case(recipe: Recipe, profile: str = REFERENCE, engine: str | None = None) -> GoldenCase:
    """One case, oracle included, run by ``engine`` (module level so worker processes can receive it).

    Another profile replays the reference's draw (the seed its tie redraws settled on)."""
    reference = runner(REFERENCE, engine)
    if profile == REFERENCE:
        return recipe.generate(reference)
    return recipe.generate(reference, replay=runner(profile, engine))


def stored_case(recipe: Recipe, profile: str = REFERENCE, engine: str | None = None) -> StoredCase:
    """One case generated and then hashed and compressed where it was made (a --jobs worker), so the
    process writing the file only copies its chunks in and the pipe carries compressed bytes."""
    return store_case(generate_case(recipe, profile=profile, engine=engine), Compression())


def overlapped(make: Callable, store: Callable, items: Iterable, depth: int = 2) -> Iterator:
    """``store(make(item))`` for each item, in order, with ``make`` on one thread and ``store`` on
    another: --jobs 1 on both cores. Case k+1 is made (draws, the oracle) while case k is hashed and
    compressed (its lzf chunks on every core) and the caller writes case k-1; at most ``depth`` cases
    are in flight besides the one being written. A failure surfaces at its case, in order."""
    with ThreadPoolExecutor(1, thread_name_prefix="make") as making, \
            ThreadPoolExecutor(1, thread_name_prefix="store") as storing:
        pending: deque = deque()
        try:
            for item in items:
                made = making.submit(make, item)
                pending.append(storing.submit(lambda made=made: store(made.result())))
                if len(pending) >= depth:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


@dataclass(frozen=True)
class SuiteSelection:
    """Which recipes to build (--suite, --seed, --case): what the file's provenance and a reproducer name."""

    suite: str
    seed: int
    case_glob: str | None

    def recipes(self) -> list[Recipe]:
        return suite_recipes(self.suite, self.seed, self.case_glob)

    def provenance(self) -> dict:
        return {"suite": self.suite, "suite_seed": self.seed, "selection": self.case_glob or "*"}


@exits("written")
@click.command("generate")
@click.option("--suite", type=click.Choice(sorted(SUITES)), default="ci", show_default=True,
              help="Which suite of recipes to build.")
@case_selection()
@click.option("--seed", type=click.IntRange(min=0, max=2**31 - 1), default=0, show_default=True,
              help="Suite seed every case seed derives from.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Golden file to write [default: SUITE.h5].")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@jobs_option("Worker processes (the file is identical for any value).")
@engine_option
@click.option("--profile", type=click.Choice(NUMERICS_PROFILES), default=REFERENCE, show_default=True,
              help="Numerics profile the payloads are computed under (the file's root names it).")
@quiet_option("No progress bar.")
@grouped("selection", SuiteSelection)
@boundary
def generate_command(
    selection: SuiteSelection, output: Path | None, force: bool, jobs: int, engine: str | None, profile: str,
    quiet: bool,
) -> ExitCode:
    """Build deterministic fixtures, run the oracle on every step and write goldens.

    The file appears only when complete: an error, a full disk, Ctrl-C or
    SIGTERM leaves nothing behind, and without --force a file that appeared
    meanwhile is kept.

    \b
    Examples:
      csa-conform generate --suite ci -o build/ci.h5 --force --jobs 4
      csa-conform generate --case 'random.r4-*' --seed 7 -o random.h5
      csa-conform generate --suite full --profile official -o build/full-official.h5
    """
    engine = chosen_engine(engine)
    small_pages()
    output = output or Path(f"{selection.suite}.h5")
    jobs = capped_jobs(jobs)
    recipes = selection.recipes()
    if output.exists() and not force:
        raise click.UsageError(f"{output} exists; pass --force to overwrite it")
    started = time.monotonic()
    counted = {"steps": 0}

    def counting(cases):
        for case in cases:
            counted["steps"] += len(case.steps)
            yield case

    def describe(case: StoredCase) -> str:
        return f"{case.case_id} ({len(case.steps)} steps)"

    if jobs == 1:
        made = overlapped(partial(generate_case, profile=profile, engine=engine),
                          partial(store_case, compression=Compression()), recipes)
    else:
        made = fan_out(partial(stored_case, profile=profile, engine=engine), recipes, jobs,
                       [recipe.weight for recipe in recipes])
    cases = progress(counting(made), len(recipes), "generate", describe, quiet)
    provenance = {**selection.provenance(), **provenance_entry(profile)}
    try:
        written = write_goldens(output, cases, force=force, provenance=provenance)
    except FixtureError as error:
        case = exact_glob(error.case_id) if error.case_id else "*"
        chosen = [] if profile == REFERENCE else ["--profile", profile]
        reproduce = shell_join(["csa-conform", "generate", "--suite", selection.suite, "--seed", str(selection.seed),
                                *chosen, "--case", case, "-o", "case.h5"])
        click.echo(f"csa-conform: error: generation failed: {error} — reproduce: {reproduce}", err=True)
        return error.exit_code
    size = os.path.getsize(output) / 1e6
    click.echo(
        f"wrote {output}: {written} cases, {counted['steps']} steps, {size:.2f} MB "
        f"in {time.monotonic() - started:.1f} s"
    )
    return ExitCode.OK
