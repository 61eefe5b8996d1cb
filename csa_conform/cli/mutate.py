"""`csa-conform mutate`: how strong the gate is — the kernels' mutants judged by a chained diff of the goldens.

Presentation only: the mutants are csa_conform.mutate.mutants', the judging
csa_conform.mutate.run's, the score csa_conform.mutate.score's. Progress goes
to stderr, the score, the tables and every survivor to stdout (or the results
document with --json).
"""

from __future__ import annotations

from pathlib import Path

import click

from csa_conform._base.terminal import one_line
from csa_conform.check.results import golden_reference, results_document
from csa_conform.cli.common import argv, boundary, capped_jobs, emit_json
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import (
    DEFAULT_FILE,
    DeviceOptions,
    case_selection,
    device_options,
    devices_option,
    effective_shard,
    golden_file,
    jobs_option,
    quiet_option,
)
from csa_conform.device.backend import CUDA
from csa_conform.device.devices import resolve_devices, visible_device
from csa_conform.device.runner import LAUNCH_TIMEOUT
from csa_conform.device.sanitizer import TOOLS as SANITIZER_TOOLS
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile, write_goldens
from csa_conform.mutate.augment import augment
from csa_conform.mutate.cache import DEFAULT_DIRECTORY, VerdictCache
from csa_conform.mutate.judge import SURVIVED
from csa_conform.mutate.mutants import Mutant
from csa_conform.mutate.operators import OPERATORS
from csa_conform.mutate.run import Gate, MutationRun, Selection, run_mutation, select
from csa_conform.mutate.score import below, mutate_section, percent
from csa_conform.spec import STAGE_NAMES


def _words(value: str | None) -> tuple[str, ...]:
    return tuple(word.strip() for word in (value or "").split(",") if word.strip())


def _min_score(context, param, value):
    """--min-score: a fraction (0.95) or a percentage (95%)."""
    if value is None:
        return None
    text = value.strip()
    try:
        score = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a score (0.95 or 95%)") from None
    if not 0.0 <= score <= 1.0:
        raise click.BadParameter(f"{value!r} is not between 0 and 1 (0% and 100%)")
    return score


def entry(mutant: Mutant, run: MutationRun) -> dict:
    """One mutant in the results document: where, what changed, the source line before and after, the verdict."""
    verdict = run.verdicts[mutant.id]
    before, after = mutant.lines(run.texts[mutant.file])
    return {"id": mutant.id, "file": mutant.file, "line": mutant.line, "column": mutant.column,
            "operator": mutant.operator, "change": mutant.change(), "before": before, "after": after,
            **verdict.to_dict(), "cached": mutant.id in run.cached}


def _table(title: str, groups: dict) -> list[str]:
    width = max([len(title)] + [len(name) for name in groups])
    lines = [f"{title.ljust(width)}  mutants  killed  faults  hangs  survived  no-build  score"]
    for name, counts in groups.items():
        lines.append(f"{name.ljust(width)}  {counts['mutants']:>7}  {counts['killed']:>6}  {counts['faults']:>6}  "
                     f"{counts['hangs']:>5}  {counts['survived']:>8}  {counts['build_failures']:>8}  "
                     f"{percent(counts['score']):>6}")
    return lines


def report_lines(section: dict, kernels: str) -> list[str]:
    """The text report: the score, the tables, then every survivor as its source line with the change."""
    summary = section["summary"]
    lines = [f"score: {percent(summary['score'])} ({summary['killed'] + summary['faults'] + summary['hangs']} killed "
             f"of {summary['judged']} judged: {summary['killed']} diverged, {summary['faults']} faults, "
             f"{summary['hangs']} hangs; {summary['survived']} survived; {summary['build_failures']} did not build)"]
    lines += _table("operator", section["by_operator"]) + [""] + _table("file", section["by_file"])
    survivors = [mutant for mutant in section["mutants"] if mutant["verdict"] == SURVIVED]
    if survivors:
        lines += ["", f"SURVIVORS ({len(survivors)}): the suite passes each of these changes"]
        for mutant in survivors:
            lines += [f"{kernels}/{mutant['file']}:{mutant['line']}:{mutant['column']}  {mutant['operator']}  "
                      f"{mutant['change']}  [{mutant['id']}]",
                      f"  - {mutant['before']}", f"  + {mutant['after']}"]
    augmented = (section.get("augment") or {}).get("survivors", [])
    if augmented:
        lines += ["", f"AUGMENT ({section['augment']['file']}, {section['augment']['budget_s']:g} s of fuzz each)"]
        for result in augmented:
            how = (f"killed at {result['divergence']} by {result['case']}" if result["outcome"] == "killed"
                   else result["outcome"])
            lines.append(f"{result['mutant']}: {how} ({result['valid']} valid cases in {result['seconds']:.0f} s)")
    return [one_line(line) if line else line for line in lines]


@exits("judged, and the score is at least --min-score (always, without it)",
       "the score is below --min-score", bisect=True,
       own={ExitCode.USAGE: "usage or invalid input, or the unmutated kernels do not pass the golden cases"})
@click.command("mutate")
@golden_file(DEFAULT_FILE)
@case_selection()
@device_options
@click.option("--operators", default=None, metavar="OP,...",
              help=f"Only these mutation operators: {', '.join(OPERATORS)}.")
@click.option("--files", default=None, metavar="FILE,...",
              help="Only mutants of these files of the kernel directory (block_quant.cuh, csa_ratio4_index_select.cu, ...).")
@click.option("--sample", type=click.IntRange(min=1), default=None, metavar="N",
              help="Judge N mutants drawn stratified by operator (each operator an equal share); default: all.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="The sample's seed.")
@jobs_option("Worker processes judging mutants (host: one core each; CUDA: processes sharing the GPU).")
@click.option("--devices", default=None, metavar="0,1,…|all", callback=devices_option,
              help="Spread the workers over these GPUs of this host (each worker on one); default: device 0.")
@click.option("--shard", default=None, metavar="K/N",
              help="Judge only shard K of N of the selected mutants (round robin in id order); `report --merged` "
              "merges the shards' --json documents.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=None, metavar="S",
              help="Seconds one mutant may take before it is judged a hang (its worker killed); default: 3 times "
              "the unmutated kernels' run plus 30 s.")
@click.option("--repeat", default=1, type=click.IntRange(min=1), show_default=True, metavar="N",
              help="Judge each survivor of the plain gate again with diff --repeat N (launches on poisoned scratch, N "
                   "patterns; the later runs in other thread or warp orders).")
@click.option("--sanitize", type=click.Choice(SANITIZER_TOOLS), default=None,
              help="Run each survivor again under compute-sanitizer with this tool; an error it reports kills.")
@click.option("--min-score", "min_score", default=None, callback=_min_score, metavar="SCORE",
              help="Exit 1 when the score (killed / judged, build failures apart) is below SCORE (0.95 or 95%).")
@click.option("--since", default=None, metavar="GIT_REF",
              help="Only mutants of the kernel files changed since this git revision (committed or not).")
@click.option("--augment", "augment_path", default=None, type=click.Path(dir_okay=False, path_type=Path),
              metavar="OUT.h5",
              help="Fuzz each survivor (the mutant under test, the unmutated kernels the control) and write the "
              "shrunk killing cases to this golden file.")
@click.option("--augment-budget", "augment_budget", default=60.0, type=click.FloatRange(min=1), show_default=True,
              metavar="S", help="Seconds of fuzz per survivor (shrinking gets as long again).")
@click.option("--force", is_flag=True, help="Overwrite an existing --augment file.")
@click.option("--cache-dir", "cache_dir", default=DEFAULT_DIRECTORY, show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Where verdicts are kept between runs (keyed by the mutated source, the build and the goldens).")
@click.option("--no-cache", "no_cache", is_flag=True, help="Neither read nor write the verdict cache.")
@click.option("--list", "list_only", is_flag=True, help="List the selected mutants (id and change); judge none.")
@click.option("--json", "as_json", is_flag=True, help="Print one results document (specs/results-document.md).")
@quiet_option("No progress on stderr.")
@boundary
def mutate_command(file, case_glob, device: DeviceOptions, operators, files, sample, seed, jobs, devices, shard, timeout_s,
                   repeat, sanitize, min_score, since, augment_path, augment_budget, force, cache_dir, no_cache,
                   list_only, as_json, quiet):
    """Mutation testing: how many one-token changes to the kernels the golden suite catches.

    Each mutant (a relational or arithmetic operator, an integer constant
    +-1, a logical operator, a deleted statement or barrier, a moved barrier,
    threadIdx for blockIdx, an explicitly rounded product made contractible,
    fmaxf/fminf, ceilf/floorf, a -inf initialiser made 0, rounding made
    truncation, a loop bound +-1, an index without its batch or head offset)
    is judged by a chained diff of the golden cases: killed (the first case,
    stage and tensor that diverge), survived, did not build, fault or hang (a
    fault or hang kills). The score is killed / judged; every survivor is shown
    as its source line before and after the change.

    \b
    Examples:
      csa-conform mutate --backend host --sample 300 --jobs 8
      csa-conform mutate --kernels ./my-kernels --sample 300 --min-score 95% --json > mutate.json
      csa-conform mutate --kernels ./my-kernels --since origin/main --min-score 0.9
      csa-conform mutate --sample 400 --shard 2/4 --json > shard-2.json   # then: report shard-*.json --merged m.json
      csa-conform mutate --backend host --files block_quant.cuh --operators barrier-delete,min-max --list
      csa-conform mutate --backend host --sample 40 --augment found.h5
    """
    if device.force_host:
        raise UsageError("mutate judges the kernels: --force-host would run their stages on the host oracle")
    if device.launch_timeout != LAUNCH_TIMEOUT:
        raise UsageError("mutate bounds a mutant's whole judgement, every launch included, with --timeout; "
                         "--launch-timeout is for diff and the commands that replay cases")
    if sanitize and device.backend != CUDA:
        raise UsageError(f"--sanitize needs GPUs: leave out --backend {device.backend}")
    if augment_path is not None and augment_path.exists() and not force:
        raise UsageError(f"{augment_path} exists; pass --force to overwrite it")
    if devices is not False and device.backend != CUDA:
        raise UsageError(f"--devices needs GPUs: leave out --backend {device.backend}")
    visible = () if devices is False else tuple(visible_device(ordinal) for ordinal in resolve_devices(devices))
    chosen_shard = effective_shard(shard)
    options = device.run_options(file, depth=None)
    gate = Gate(golden=file, case_glob=case_glob, build=options.build, backend=device.backend, stages=STAGE_NAMES,
                ulp=device.ulp, repeat=repeat, sanitize=sanitize, timeout_s=timeout_s, jobs=capped_jobs(jobs),
                devices=visible)
    selection = Selection(operators=_words(operators), files=_words(files), sample=sample, seed=seed,
                          shard=chosen_shard, since=since)
    kernels = _shown(gate.build.directory().path)
    if list_only:
        mutants, texts, total = select(gate, selection)
        for mutant in mutants:
            before, after = mutant.lines(texts[mutant.file])
            click.echo(f"{mutant.id}\t{mutant.change()}\t{after}")
        click.echo(f"{len(mutants)} mutants selected of {total}", err=True)
        return ExitCode.OK

    def say(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)

    done = [0]

    def seen(mutant: Mutant, verdict, cached: bool) -> None:
        done[0] += 1
        if not quiet and not cached:
            where = f" at {verdict.case} {verdict.stage or ''}".rstrip() if verdict.case else ""
            click.echo(f"mutate: [{done[0]}] {mutant.id}: {verdict.verdict}{where} ({verdict.time_s:.1f} s)", err=True)

    cache = VerdictCache(None if no_cache else cache_dir)
    run = run_mutation(gate, selection, cache, say, seen)
    augmented = None
    if augment_path is not None:
        survivors = [mutant for mutant in run.mutants if run.verdicts[mutant.id].verdict == SURVIVED]
        results, cases = augment(survivors, run.texts, gate.build, gate.backend, gate.ulp, augment_budget, seed, say)
        if cases:
            write_goldens(augment_path, cases, force=force)
        augmented = {"file": str(augment_path), "budget_s": augment_budget, "written": len(cases),
                     "survivors": [result.to_dict() for result in results]}
    parameters = {"kernels": kernels, "backend": gate.backend, "operators": list(selection.operators) or list(OPERATORS),
                  "files": list(selection.files) or None, "sample": sample, "seed": seed, "since": since,
                  "total": run.total, "cases": len(run.cases), "jobs": gate.jobs, "timeout_s": round(run.timeout_s, 1),
                  "baseline_s": None if run.baseline_s is None else round(run.baseline_s, 3),
                  "seconds": round(run.seconds, 3), "judged_now": run.judged_now, "min_score": min_score,
                  "workers_started": run.workers_started, **({"augment": augmented} if augmented else {})}
    section = mutate_section([entry(mutant, run) for mutant in run.mutants], parameters)
    code = ExitCode.DIVERGED if below(section) else ExitCode.OK
    if as_json:
        with GoldenFile(file) as golden:
            reference = golden_reference(file, golden.schema_version)
        emit_json(results_document(
            "mutate", argv(), [], exit_code=code, golden=reference, kernels=None, control=None,
            options={**options.describe(), "repeat": repeat, "sanitize": sanitize,
                     **({"shard": str(chosen_shard)} if chosen_shard else {})},
            extra={"mutate": section}))
        return code
    shown = (f"{len(run.mutants)} of its {run.total} mutants, sampled with seed {seed}" if sample
             else f"{len(run.mutants)} of its {run.total} mutants")
    click.echo(f"csa-conform mutate {file}: {kernels} ({shown}{', shard ' + str(chosen_shard) if chosen_shard else ''}), "
               f"backend {gate.backend}, {_count(len(run.cases), 'case')}, {_count(gate.jobs, 'job')}")
    if not run.mutants:
        judged = "no mutant selected" + (f" (no kernel file changed since {since})" if since else "")
    elif run.judged_now:
        judged = f"{run.judged_now} judged now, {len(run.cached)} verdicts from the cache"
    else:
        judged = f"nothing judged again: all {len(run.cached)} verdicts from the cache"
    click.echo(f"{judged}; {_duration(run.seconds)}")
    for line in report_lines(section, kernels):
        click.echo(line)
    if min_score is not None:
        click.echo(f"min-score {percent(min_score)}: {'FAILED' if code else 'passed'}")
    return code


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _shown(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)} min {rest:.0f} s" if minutes else f"{rest:.1f} s"

