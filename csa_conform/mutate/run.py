"""One mutation-testing run: pick the mutants, take what the cache knows, judge the rest, keep the verdicts.

The unmutated directory is judged first (the baseline): it must pass every
selected case, or no mutant's verdict would mean anything, and its per-case
times order the cases and set the default timeout. Then the mutants go to the
workers, each task carrying the case order of the moment (the cases that
killed most so far first), and each verdict is stored in the cache as it
comes.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from csa_conform._base.case_glob import matching_cases
from csa_conform._base.shards import Shard
from csa_conform.check.options import BuildChoice
from csa_conform.errors import DeviceUnavailable, UsageError
from csa_conform.golden import GoldenFile
from csa_conform.mutate.cache import VerdictCache, source_digests, verdict_key
from csa_conform.mutate.judge import BUILD_FAILED, SURVIVED, Judged, Setup, Task, Verdict, Workers, ordered_cases
from csa_conform.mutate.mutants import Mutant, changed_since, directory_files, mutants_of, sample

# The default timeout of one mutant: this many times the baseline's whole run, plus the margin.
TIMEOUT_FACTOR = 3.0
TIMEOUT_MARGIN_S = 30.0


class BaselineFails(UsageError):
    """The unmutated kernels do not pass the selected cases: mutants cannot be judged against them."""


@dataclass(frozen=True, kw_only=True)
class Selection:
    """Which mutants: operators, files, the sample, the shard, the files changed since a git revision."""

    operators: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    sample: int | None = None
    seed: int = 0
    shard: Shard | None = None
    since: str | None = None


@dataclass(frozen=True, kw_only=True)
class Gate:
    """How each mutant is judged: the golden file and cases, the kernels' build, the backend and depth."""

    golden: str
    case_glob: str | None
    build: BuildChoice
    backend: str
    stages: tuple[str, ...]
    ulp: int = 0
    repeat: int = 1
    sanitize: str | None = None
    timeout_s: float | None = None
    jobs: int = 1
    devices: tuple[str, ...] = ()  # CUDA_VISIBLE_DEVICES entries the workers spread over (empty: the default GPU)


@dataclass
class MutationRun:
    """What a run found: the mutants (of the sample and shard), their sources' texts and verdicts."""

    mutants: list[Mutant]
    texts: dict[str, str]
    total: int  # mutants the operators made (before --since, --sample and --shard)
    cases: list[str]
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    cached: set[str] = field(default_factory=set)
    baseline_s: float | None = None
    baseline_cached: bool = False
    timeout_s: float = 0.0
    seconds: float = 0.0
    workers_started: int = 0
    kills: dict[str, int] = field(default_factory=dict)

    @property
    def judged_now(self) -> int:
        return len(self.verdicts) - len(self.cached)


def select(gate: Gate, selection: Selection) -> tuple[list[Mutant], dict[str, str], int]:
    kernels = gate.build.directory()
    mutants, texts = mutants_of(kernels, selection.files or None, selection.operators or None)
    total = len(mutants)
    if selection.since is not None:
        changed = changed_since(kernels.path, selection.since)
        mutants = [mutant for mutant in mutants if mutant.file in changed]
    if selection.sample is not None:
        mutants = sample(mutants, selection.sample, selection.seed)
    else:
        mutants = sorted(mutants, key=lambda mutant: mutant.id)
    if selection.shard is not None:
        mutants = selection.shard.select(mutants)
    return mutants, texts, total


def run_mutation(gate: Gate, selection: Selection, cache: VerdictCache,
                 say: Callable[[str], None], seen: Callable[[Mutant, Verdict, bool], None]) -> MutationRun:
    """Judge the selected mutants (``seen`` is told each verdict as it comes, and whether the cache had it)."""
    started = time.perf_counter()
    mutants, texts, total = select(gate, selection)
    with GoldenFile(gate.golden) as golden:
        cases = matching_cases(golden.case_ids(), gate.case_glob, golden.path)
        manifest = golden.manifest
    kernels = gate.build.directory()
    all_texts = {name: kernels.read(name) for name in directory_files(kernels)}
    texts = {**all_texts, **texts}
    digests = source_digests(all_texts)
    context = {"build": {key: value for key, value in kernels.build.to_dict().items() if key != "origin"},
               "golden": manifest, "backend": gate.backend, "stages": list(gate.stages), "cases": cases,
               "ulp": gate.ulp, "repeat": gate.repeat, "sanitize": gate.sanitize, "timeout_s": gate.timeout_s}
    run = MutationRun(mutants, texts, total, cases)
    run.kills = cache.kills(manifest)
    keys = {mutant.id: verdict_key(context, {**digests, mutant.file: source_digests(
        {mutant.file: mutant.apply(texts[mutant.file])})[mutant.file]}) for mutant in mutants}
    for mutant in mutants:
        entry = cache.get(keys[mutant.id])
        if entry is not None:
            run.verdicts[mutant.id] = Verdict.from_dict(entry)
            run.cached.add(mutant.id)
            seen(mutant, run.verdicts[mutant.id], True)
    todo = [mutant for mutant in mutants if mutant.id not in run.verdicts]
    if not todo:
        run.seconds = time.perf_counter() - started
        return run
    with tempfile.TemporaryDirectory(prefix="csa-mutate-") as build_dir:
        setup = Setup(gate.golden, gate.build, gate.backend, gate.ulp, gate.repeat, gate.stages, build_dir,
                      gate.sanitize, gate.case_glob)
        with Workers(setup, gate.jobs, gate.devices) as workers:
            run.workers_started = _judge(workers, gate, cache, context, digests, cases, todo, keys, run, say, seen)
    cache.keep_kills(manifest, run.kills)
    run.seconds = time.perf_counter() - started
    return run


def _judge(workers: Workers, gate: Gate, cache: VerdictCache, context: dict, digests: dict[str, str],
           cases: list[str], todo: list[Mutant], keys: dict[str, str], run: MutationRun,
           say: Callable[[str], None], seen: Callable[[Mutant, Verdict, bool], None]) -> int:
    """The baseline, then every mutant not cached; returns how many worker processes were started."""
    baseline_key = verdict_key({**context, "baseline": True}, digests)
    times = _baseline(workers, cache, baseline_key, cases, run, say)
    run.timeout_s = gate.timeout_s or TIMEOUT_FACTOR * (run.baseline_s or 0.0) + TIMEOUT_MARGIN_S

    def tasks() -> Iterator[tuple[Mutant, Task]]:
        for mutant in todo:
            yield mutant, Task(mutant, mutant.apply(run.texts[mutant.file]), ordered_cases(cases, run.kills, times))

    for mutant, judged in workers.run(tasks(), run.timeout_s):
        verdict = judged.verdict
        run.verdicts[mutant.id] = verdict
        if verdict.verdict != SURVIVED and verdict.case is not None:
            run.kills[verdict.case] = run.kills.get(verdict.case, 0) + 1
        cache.put(keys[mutant.id], verdict.to_dict())
        seen(mutant, verdict, False)
    return workers.started


def _baseline(workers: Workers, cache: VerdictCache, key: str, cases: Sequence[str], run: MutationRun,
              say: Callable[[str], None]) -> dict[str, float]:
    """The unmutated kernels over every case (cached like a mutant): their per-case times; BaselineFails
    when they do not pass."""
    entry = cache.get(key)
    if entry is not None:
        run.baseline_s, run.baseline_cached = entry["time_s"], True
        return dict(entry["case_times"])
    say(f"mutate: judging the unmutated kernels on {len(cases)} cases (the baseline)")
    answers: list[Judged] = [judged for _, judged in workers.run(iter([(None, Task(None, "", tuple(cases)))]),
                                                                   24 * 3600.0)]
    judged = answers[0]
    verdict = judged.verdict
    if verdict.verdict == BUILD_FAILED:
        raise DeviceUnavailable(f"the unmutated kernels do not build: {verdict.detail}")
    if verdict.verdict != SURVIVED:
        where = f"{verdict.case}: {verdict.stage or ''} {verdict.tensor or ''}".strip() if verdict.case else ""
        raise BaselineFails(f"the unmutated kernels do not pass the golden cases ({verdict.verdict}"
                            f"{': ' + where if where else ''}{'; ' + verdict.detail if verdict.detail else ''}); "
                            "mutants can only be judged against kernels that pass (run diff first)")
    run.baseline_s = verdict.time_s
    cache.put(key, {"time_s": verdict.time_s, "case_times": judged.case_times})
    return judged.case_times
