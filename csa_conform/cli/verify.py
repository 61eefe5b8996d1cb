"""``csa-conform verify``: replay a golden file through the oracle, bit for bit."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from functools import partial
from typing import Callable

import click
from rich.table import Table
from rich.text import Text

from csa_conform._base.case_glob import matching_cases
from csa_conform._base.memory import small_pages
from csa_conform._base.terminal import escaped, one_line
from csa_conform.check.model import CaseVerdict
from csa_conform.check.results import file_sha256, golden_reference, results_document
from csa_conform.check.verify import verify_case, verify_case_in
from csa_conform.cli.common import (
    argv,
    boundary,
    capped_jobs,
    console,
    emit_json,
    fan_out,
    print_table,
    progress,
    stdout_is_terminal,
)
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import (
    OutputOptions,
    case_selection,
    engine_option,
    golden_file,
    jobs_option,
    output_options,
)
from csa_conform.errors import CsaConformError, GoldenChanged
from csa_conform.exitcodes import ExitCode, verdicts_code
from csa_conform.golden import GoldenFile
from csa_conform.oracle.engine import chosen_engine
from csa_conform.profiles.numerics import file_profile


def hashed_ahead(path: str) -> Future:
    """The file's sha256 (for the results document), computed on a daemon thread while the cases are
    replayed. --jobs 1 only: with this thread running while the workers were forked, a Ctrl-C'd
    ``verify --jobs 2`` hung in about half the signal probes (tests/cli/test_hostile_probes.py)."""
    digest: Future = Future()
    threading.Thread(target=lambda: digest.set_result(file_sha256(path)), name="file-sha256", daemon=True).start()
    return digest


def verify_in_turn(golden: GoldenFile, following: dict[str, str], engine: str | None, case_id: str) -> CaseVerdict:
    """``verify_case`` of one case of a run that verifies ``following[case_id]`` next."""
    return verify_case(golden, case_id, engine=engine, then=following.get(case_id))


def case_weight(golden: GoldenFile, case_id: str) -> int:
    """The bytes a case holds, so --jobs workers start the heaviest first (prod's r4 case came last);
    0 for a case that cannot be indexed, which its worker then reports."""
    try:
        return golden.case_bytes(case_id)
    except CsaConformError:
        return 0


def timed_case(verify: Callable[[str], CaseVerdict], case_id: str) -> CaseVerdict:
    """One case and how long it took (module level so worker processes can receive it)."""
    started = time.perf_counter()
    result = verify(case_id)
    result.time_s = time.perf_counter() - started
    return result


@exits("verified: every stage and output bit-identical", "a verification failure or a corrupt dataset")
@click.command("verify")
@golden_file()
@case_selection()
@output_options
@jobs_option()
@engine_option
@boundary
def verify_command(
    file: str, case_glob: str | None, output: OutputOptions, jobs: int, engine: str | None
) -> ExitCode:
    """Re-run the oracle on every case of FILE and require bit-identical stages and outputs.

    The oracle runs the numerics profile the file's root names (reference when
    it names none; see generate --profile).

    Works on any file that follows the golden layout. A tampered object fails
    its digest and is named; each failure line ends with the command that
    reproduces just that case.

    \b
    Examples:
      csa-conform verify goldens/ci.h5
      csa-conform verify goldens/ci.h5 --case 'random.*' --jobs 4 -q
      csa-conform verify goldens/ci.h5 --json > verify.json
    """
    engine = chosen_engine(engine)
    jobs = capped_jobs(jobs)
    small_pages()
    with GoldenFile(file) as golden:
        digest = hashed_ahead(file) if jobs == 1 else None
        case_ids = matching_cases(golden.case_ids(), case_glob, golden.path)
        file_profile(golden.provenance, file)
        schema_version = golden.schema_version
        # One handle for the whole run; worker processes open the file once each and
        # refuse it unless its manifest digest is the one this handle read.
        following = dict(zip(case_ids, case_ids[1:]))  # --jobs 1 reads each case while the last one replays
        work = (partial(verify_in_turn, golden, following, engine) if jobs == 1
                else partial(verify_case_in, file, golden.manifest, engine=engine))
        results = list(
            progress(
                fan_out(partial(timed_case, work), case_ids, jobs,
                        [case_weight(golden, case_id) for case_id in case_ids] if jobs > 1 else None),
                len(case_ids),
                "verify",
                lambda result: f"{'ok  ' if result.passed else 'FAIL'} {result.case}",
                output.quiet,
            )
        )
    if jobs > 1:
        with GoldenFile(file) as after:
            if after.manifest != golden.manifest:
                raise GoldenChanged(f"{file}: the file changed while it was being verified")
    code = verdicts_code(not all(result.passed for result in results), any(result.invalid for result in results))
    document = results_document(
        "verify", argv(), [result.entry().to_json() for result in results],
        exit_code=code, golden=golden_reference(file, schema_version, digest.result() if digest else None),
    )
    if output.as_json:
        emit_json(document)
    elif stdout_is_terminal() and not output.quiet:
        _table(results, document, file)
    else:
        _lines(results, document, file)
    return code


def _lines(results: list[CaseVerdict], document: dict, file: str) -> None:
    for result in results:
        for line in result.failure_lines():
            click.echo(line)
    click.echo(_summary(document, file))


def _summary(document: dict, file: str) -> str:
    summary = document["summary"]
    verdict = "verified" if document["passed"] else "FAILED"
    invalid = f", {summary['invalid']} invalid" if summary["invalid"] else ""
    return (f"{verdict}: {summary['passed']}/{summary['cases']} cases passed{invalid} ({summary['steps']} steps) "
            f"in {escaped(file)}")


def _table(results: list[CaseVerdict], document: dict, file: str) -> None:
    out = console()
    failing = [result for result in results if not result.passed]
    if failing:
        table = Table(title="divergences", show_lines=False)
        table.add_column("case", no_wrap=True, min_width=max(len(escaped(result.case)) for result in failing))
        for column in ("step", "where", "first divergence"):
            table.add_column(column, overflow="fold")
        for result in failing:
            for line in result.failure_lines():
                out.print(line, markup=False)
            if result.invalid:
                table.add_row(Text(escaped(result.case)), "", "invalid", Text(result.invalid))
            if result.problem:
                table.add_row(Text(escaped(result.case)), "", "", Text(one_line(result.problem)))
            for step in result.steps:
                if step.problem:
                    table.add_row(Text(escaped(result.case)), str(step.step), "", Text(one_line(step.problem)))
                for diff in step.diffs:
                    first = diff.first or {}
                    where = f"{first.get('coords', '')}: {first.get('expected')} vs {first.get('actual')}"
                    table.add_row(
                        Text(escaped(result.case)),
                        str(step.step),
                        Text(escaped(f"{diff.stage}/{diff.tensor}")),
                        Text(one_line(diff.problem or where)),
                    )
        print_table(out, table)
    style = "green" if document["passed"] else "bold red"
    out.print(_summary(document, file), style=style, markup=False)
