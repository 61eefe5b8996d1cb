"""``csa-conform verify``: replay a golden file through the oracle, bit for bit."""

from __future__ import annotations

import fnmatch
from functools import partial

import click
from rich.table import Table
from rich.text import Text

from csa_conform.cli.common import (
    boundary,
    command_line,
    console,
    emit_json,
    fan_out,
    progress,
    stdout_is_terminal,
)
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.goldens import GoldenFile
from csa_conform.oracle.engine import ENGINE_CHOICES, use_engine
from csa_conform.report import CaseResult, run_document
from csa_conform.verify import verify_case


def selected_cases(path: str, case_glob: str | None) -> list[str]:
    """Case ids of a golden file, filtered by a glob (which must match something)."""
    with GoldenFile(path) as golden:
        ids = golden.case_ids()
    if case_glob is None:
        return ids
    chosen = [case_id for case_id in ids if fnmatch.fnmatchcase(case_id, case_glob)]
    if not chosen:
        raise UsageError(f"no case of {path} matches {case_glob!r}")
    return chosen


@click.command("verify")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--case", "case_glob", metavar="GLOB", help="Only cases whose id matches GLOB.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as one JSON document.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Worker processes.")
@click.option("--engine", type=click.Choice(ENGINE_CHOICES), default=None,
              help="Oracle engine, same bytes either way [default: $CSA_CONFORM_ENGINE, else auto].")
@boundary
def verify_command(file: str, case_glob: str | None, as_json: bool, jobs: int, engine: str | None) -> ExitCode:
    """Re-run the oracle on every case of FILE and require bit-identical stages and outputs.

    Works on any file that follows the golden layout. A tampered dataset fails
    its sha256 check and is named; each failure line ends with the command
    that reproduces just that case.
    """
    use_engine(engine)
    case_ids = selected_cases(file, case_glob)
    results = list(
        progress(
            fan_out(partial(verify_case, file), case_ids, jobs),
            len(case_ids),
            "verify",
            lambda result: f"{'ok  ' if result.passed else 'FAIL'} {result.case_id}",
        )
    )
    document = run_document("verify", file, command_line(), results)
    if as_json:
        emit_json(document)
    elif stdout_is_terminal():
        _table(results, document)
    else:
        _lines(results, document)
    return ExitCode.OK if document["passed"] else ExitCode.DIVERGED


def _lines(results: list[CaseResult], document: dict) -> None:
    for result in results:
        for line in result.failure_lines():
            click.echo(line)
    click.echo(_summary(document))


def _summary(document: dict) -> str:
    summary = document["summary"]
    verdict = "verified" if document["passed"] else "FAILED"
    return (
        f"{verdict}: {summary['passed']}/{summary['cases']} cases passed "
        f"({summary['steps']} steps) in {document['file']}"
    )


def _table(results: list[CaseResult], document: dict) -> None:
    out = console()
    failing = [result for result in results if not result.passed]
    if failing:
        table = Table(title="divergences", show_lines=False)
        for column in ("case", "step", "where", "first divergence"):
            table.add_column(column, overflow="fold")
        for result in failing:
            for line in result.failure_lines():
                out.print(line, markup=False)
            if result.problem:
                table.add_row(Text(result.case_id), "", "", Text(result.problem))
            for step in result.steps:
                if step.problem:
                    table.add_row(Text(result.case_id), str(step.step), "", Text(step.problem))
                for diff in step.diffs:
                    first = diff.first or {}
                    where = f"{first.get('coords', '')}: {first.get('expected')} vs {first.get('actual')}"
                    table.add_row(
                        Text(result.case_id),
                        str(step.step),
                        Text(f"{diff.stage}/{diff.tensor}"),
                        Text(diff.problem or where),
                    )
        out.print(table)
    style = "green" if document["passed"] else "bold red"
    out.print(_summary(document), style=style, markup=False)
