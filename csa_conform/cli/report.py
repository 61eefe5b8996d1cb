"""``csa-conform report``: CI artefacts (JUnit XML, JSON) from results documents."""

from __future__ import annotations

import json
from pathlib import Path

import click

from csa_conform._base.atomic import refuse_special_target, write_atomically
from csa_conform._base.bounded_json import read_text
from csa_conform.check.archived import load_results
from csa_conform.cli.common import boundary
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import quiet_option
from csa_conform.cli.output import stdin_closed
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.report.bench_plots import bench_samples
from csa_conform.report.html import render_html
from csa_conform.report.merge import junit_xml, merge_shards, merged_summary


@exits("written, whatever the results say (the run's own exit code is the gate)")
@click.command("report")
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), help="Write JUnit XML here.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the merged JSON summary here.")
@click.option("--merged", "merged_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the one results document the shards of one run (--shard K/N) merge into.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write one self-contained HTML page: a summary of why each case fails, the verdict matrix, "
              "explanations, diagnoses, error histograms, heatmaps, gap tables, a bench run's roofline bars, "
              "baseline vs new and samples against the SM clock (from the samples file the run names), and a "
              "mutate run's score with every survivor's line before and after its change.")
@quiet_option("Do not print the one-line summary.")
@boundary
def report_command(results: tuple[str, ...], junit: Path | None, json_path: Path | None, merged_path: Path | None,
                   html_path: Path | None, quiet: bool) -> ExitCode:
    """Turn RESULTS (documents written by verify, diff, bisect, explain, gap, bench or mutate with --json;
    '-' reads stdin) into CI artefacts: one JUnit file and one JSON summary, however
    many documents are given. The shards of one run (diff or mutate --shard K/N) are first
    merged into the document the unsharded run writes.

    \b
    Examples:
      csa-conform diff --json > diff.json; csa-conform report diff.json --junit junit.xml
      csa-conform report shard-*.json --junit junit.xml --json summary.json
      csa-conform report shard-*.json --merged diff.json
      csa-conform report verify.json gap.json --html report.html
    """
    if junit is None and json_path is None and merged_path is None and html_path is None:
        raise UsageError("nothing to write: give --junit FILE, --json FILE, --merged FILE and/or --html FILE")
    outputs = [path for path in (junit, json_path, merged_path, html_path) if path is not None]
    for path in outputs:
        refuse_special_target(path)
    documents = merge_shards([load_results(read_text(source, stdin_closed=stdin_closed()), source)
                              for source in results])
    if merged_path is not None and len(documents) != 1:
        raise UsageError(f"--merged writes one run, but the documents given are {len(documents)} runs "
                         "(only the shards of one run merge)")
    if junit is not None:
        write_atomically(junit, junit_xml(documents).encode("utf-8"))
    if json_path is not None:
        write_atomically(json_path, (json.dumps(merged_summary(documents), indent=2) + "\n").encode("utf-8"))
    if merged_path is not None:
        write_atomically(merged_path, (json.dumps(documents[0], indent=2) + "\n").encode("utf-8"))
    if html_path is not None:
        samples = [bench_samples(document) for document in documents]
        write_atomically(html_path, render_html(documents, samples=samples).encode("utf-8"))
    if not quiet:
        total = sum(document["summary"]["cases"] for document in documents)
        failed = sum(document["summary"]["failed"] for document in documents)
        click.echo(f"report: {len(documents)} runs, {total} cases, {failed} failed")
    return ExitCode.OK

