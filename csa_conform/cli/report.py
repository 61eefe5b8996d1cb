"""``csa-conform report``: CI artefacts (JUnit XML, JSON) from results documents."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from csa_conform.cli.common import boundary
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.html_report import render_html
from csa_conform.report import junit_xml, merge_shards, merged_summary
from csa_conform.results import load_results


@click.command("report")
@click.argument("results", nargs=-1, required=True, type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), help="Write JUnit XML here.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the merged JSON summary here.")
@click.option("--merged", "merged_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the one results document the shards of one run (--shard K/N) merge into.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write one self-contained HTML page: verdict matrix, error histograms, heatmaps, gap tables.")
@click.option("-q", "--quiet", is_flag=True, help="Do not print the one-line summary.")
@boundary
def report_command(results: tuple[str, ...], junit: Path | None, json_path: Path | None, merged_path: Path | None,
                   html_path: Path | None, quiet: bool) -> ExitCode:
    """Turn RESULTS (documents written by verify, diff, bisect, explain or gap with --json;
    '-' reads stdin) into CI artefacts: one JUnit file and one JSON summary, however
    many documents are given. The shards of one run (diff --shard K/N) are first
    merged into the document the unsharded run writes. Exits 0 once written,
    whatever the results say: the run's own exit code is the gate.

    \b
    Examples:
      csa-conform diff --json > diff.json; csa-conform report diff.json --junit junit.xml
      csa-conform report shard-*.json --junit junit.xml --json summary.json
      csa-conform report shard-*.json --merged diff.json
      csa-conform report verify.json gap.json --html report.html
    """
    if junit is None and json_path is None and merged_path is None and html_path is None:
        raise UsageError("nothing to write: give --junit FILE, --json FILE, --merged FILE and/or --html FILE")
    documents = merge_shards([load_results(_read(source), source) for source in results])
    if merged_path is not None and len(documents) != 1:
        raise UsageError(f"--merged writes one run, but the documents given are {len(documents)} runs "
                         "(only the shards of one run merge)")
    if junit is not None:
        junit.write_text(junit_xml(documents))
    if json_path is not None:
        json_path.write_text(json.dumps(merged_summary(documents), indent=2) + "\n")
    if merged_path is not None:
        merged_path.write_text(json.dumps(documents[0], indent=2) + "\n")
    if html_path is not None:
        html_path.write_text(render_html(documents), encoding="utf-8")
    if not quiet:
        total = sum(document["summary"]["cases"] for document in documents)
        failed = sum(document["summary"]["failed"] for document in documents)
        click.echo(f"report: {len(documents)} runs, {total} cases, {failed} failed")
    return ExitCode.OK


def _read(source: str) -> str:
    raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"{source}: not UTF-8 text (byte {error.start})") from None
