"""Survivors made into cases: fuzz each surviving mutant until a drawn case kills it, and keep that case.

For each survivor, ``fuzz`` (csa_conform.repro.fuzz) draws valid cases with
the mutant as the kernels under test, shrinks the first that diverges, and
the unmutated kernels (the control) must pass the shrunk case, so the case
kills the mutant and not the kernels. The cases go into one golden file with
the suite's own provenance, which ``diff`` then runs beside the suite: the
suite grows exactly where a survivor shows it is thin. A survivor the budget
cannot kill is reported "probably equivalent", with the budget spent. Each
search runs in a child process, so a drawn case that crashes the mutant costs
that search, not the run.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from csa_conform.check.options import BuildChoice
from csa_conform.device.backend import backend_named
from csa_conform.device.runner import DeviceRunner
from csa_conform.golden import GoldenCase
from csa_conform.mutate.judge import MutantDirectory
from csa_conform.mutate.mutants import Mutant
from csa_conform.repro.reduce import Probe, describe

FAMILY = "mutate"


@dataclass
class Augmented:
    """What the search made of one survivor."""

    mutant: str  # its id
    outcome: str  # "killed", "probably equivalent", "control fails" (the case fails the unmutated kernels too),
    # "crashed" (a drawn case crashed the search's process)
    budget_s: float
    seconds: float = 0.0
    examples: int = 0
    valid: int = 0
    case: str | None = None  # the case id written
    divergence: str | None = None  # stage/tensor where it kills

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def case_id(mutant: Mutant) -> str:
    return f"{FAMILY}.{Path(mutant.file).stem}-l{mutant.line}-{mutant.operator}-{mutant.digest}"


def _search(build: BuildChoice, backend: str, ulp: int, mutant: Mutant, text: str, budget_s: float, seed: int,
            connection) -> None:
    from csa_conform.repro.fuzz import fuzz

    base = build.directory()
    with tempfile.TemporaryDirectory(prefix="csa-augment-") as work:
        mutated = DeviceRunner(MutantDirectory(base, mutant.file, text), backend_factory=backend_named(backend))
        run = fuzz(Probe(mutated, Path(work), ulp), budget_s, seed, None, lambda line: None)
        result = Augmented(mutant.id, "probably equivalent", budget_s, run.seconds, run.examples, run.valid)
        case = None
        if run.found is not None:
            control = Probe(DeviceRunner(base, backend_factory=backend_named(backend)), Path(work), ulp)
            if control(run.found.case) is not None:
                result.outcome = "control fails"
            else:
                case = dataclasses.replace(run.found.case, case_id=case_id(mutant), family=FAMILY,
                                           description=f"kills mutant {mutant.id}: {run.found.draw.describe()}")
                result.outcome, result.case = "killed", case.case_id
                result.divergence = describe(run.found.divergence)
    connection.send((result, case))


def augment(survivors: list[Mutant], texts: dict[str, str], build: BuildChoice, backend: str, ulp: int,
            budget_s: float, seed: int, say: Callable[[str], None]) -> tuple[list[Augmented], list[GoldenCase]]:
    """One fuzz search per survivor, ``budget_s`` each (shrinking gets as long again): what each found, and
    the killing cases."""
    context = multiprocessing.get_context("fork")
    results, cases = [], []
    for mutant in survivors:
        started = time.monotonic()
        parent, child = context.Pipe(duplex=False)
        process = context.Process(target=_search, daemon=True, args=(
            build, backend, ulp, mutant, mutant.apply(texts[mutant.file]), budget_s, seed, child))
        process.start()
        child.close()
        limit = 2 * budget_s + 120
        answer = parent.recv() if parent.poll(limit) else None
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)
        if answer is None:
            results.append(Augmented(mutant.id, "crashed", budget_s, time.monotonic() - started))
        else:
            result, case = answer
            results.append(result)
            if case is not None:
                cases.append(case)
        say(f"mutate --augment: {mutant.id}: {results[-1].outcome} ({results[-1].valid} valid cases, "
            f"{results[-1].seconds:.0f} s)")
    return results, cases
