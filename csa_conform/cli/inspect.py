"""``csa-conform inspect``: browse a golden file — cases, steps, tensors, decoded records."""

from __future__ import annotations

import difflib

import click
import numpy as np
from rich.table import Table
from rich.text import Text

from csa_conform._base.terminal import escaped, one_line
from csa_conform.cli.common import boundary, console, emit_json, print_table, stdout_is_terminal
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import OneStage
from csa_conform.compare.bitwise import default_axes
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile, array_sha256
from csa_conform.numerics.bf16 import bf16_to_f32
from csa_conform.numerics.e8m0 import e8m0_decode
from csa_conform.numerics.records import (
    FP4_RECORD_BYTES,
    FP8_RECORD_BYTES,
    decode_fp4_record,
    decode_fp8_record,
    unpack_fp4_record,
    unpack_fp8_record,
)

PREVIEW = 6
OMITTED = "omitted: read as the cleared carry (kv 0, score -inf), since the step starts at position 0"


@exits("listed")
@click.command("inspect")
@click.argument("file", type=click.Path(dir_okay=False))
@click.argument("case", required=False)
@click.option("--step", type=click.IntRange(min=0), help="Show the tensors of step K.")
@click.option("--stage", type=OneStage(("inputs", "outputs")), metavar="S",
              help="Only this stage (as diff --stage spells it) or 'inputs' / 'outputs'.")
@click.option("--decode", is_flag=True, help="Decode packed FP8/FP4 records (first record of each tensor).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@boundary
def inspect_command(
    file: str, case: str | None, step: int | None, stage: str | None, decode: bool, as_json: bool
) -> ExitCode:
    """List the cases of FILE, the steps of CASE, or the tensors of one step.

    \b
    Examples:
      csa-conform inspect goldens/ci.h5
      csa-conform inspect goldens/ci.h5 seed-closed-form.r4-prefill-8
      csa-conform inspect goldens/ci.h5 seed-closed-form.r4-prefill-8 --step 0 --stage 5 --decode
    """
    if case is None and (step is not None or stage or decode):
        raise UsageError("--step, --stage and --decode need a CASE")
    with GoldenFile(file) as golden:
        if case is None:
            document = _file_listing(golden)
        elif step is None:
            document = _case_listing(golden, _known_case(golden, case))
        else:
            document = _step_listing(golden, _known_case(golden, case), step, stage, decode)
    if as_json:
        emit_json(document)
    else:
        _render(document)
    return ExitCode.OK


def _known_case(golden: GoldenFile, case: str) -> str:
    ids = golden.case_ids()
    if case not in ids:
        close = difflib.get_close_matches(case, ids, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UsageError(f"{golden.path} has no case {case!r}{hint}")
    return case


def _file_listing(golden: GoldenFile) -> dict:
    cases = []
    for case_id in golden.case_ids():
        info = golden.case_info(case_id)
        cases.append(
            {
                "case": case_id,
                "family": info.family,
                "ratio": info.attrs.get("compression_ratio"),
                "cache_format": info.attrs.get("cache_format", "f32"),
                "steps": info.step_count,
                "rejected_steps": list(info.errors),
            }
        )
    return {"file": golden.path, "provenance": golden.provenance, "cases": cases}


def _case_listing(golden: GoldenFile, case_id: str) -> dict:
    info = golden.case_info(case_id)
    steps = []
    for index in range(info.step_count):
        entries = dict(golden.dataset_entries(case_id, index))
        total = entries.get("inputs/total_sequence_length")
        query = entries.get("inputs/query")
        current = entries.get("inputs/current_kv")
        node = golden.step_attrs(case_id, index)
        steps.append(
            {
                "step": index,
                "T": None if total is None or total.shape != () else int(
                    golden.read_dataset(case_id, index, "inputs/total_sequence_length")
                ),
                "S": None if query is None or query.ndim < 2 else int(query.shape[1]),
                "Kc": None if current is None or current.ndim < 2 else int(current.shape[1]),
                "stages": sorted({name.split("/")[1] for name in entries if name.startswith("stages/")}),
                "expect_error": node.get("expect_error"),
                "omitted_carries": list(golden.cleared_carries(case_id, index)),
            }
        )
    return {
        "file": golden.path,
        "case": case_id,
        "family": info.family,
        "seed": info.seed,
        "description": info.description,
        "attrs": info.attrs,
        "output_names": list(info.output_names),
        "steps": steps,
    }


def _step_listing(golden: GoldenFile, case_id: str, index: int, stage: str | None, decode: bool) -> dict:
    count = golden.step_count(case_id)
    if index >= count:
        raise UsageError(f"case {case_id!r} has {count} steps; no step {index}")
    tensors = []
    groups = set()
    for name, _ in golden.dataset_entries(case_id, index):
        group = name.split("/")[1] if name.startswith("stages/") else name.split("/")[0]
        groups.add(group)
        if stage is not None and group != stage:
            continue
        array = golden.read_dataset(case_id, index, name)
        tensor = name.rsplit("/", 1)[1]
        entry = {
            "tensor": name,
            "shape": list(array.shape),
            "dtype": str(array.dtype),
            "axes": list(default_axes(group, tensor, array.shape, array.dtype)),
            "sha256": array_sha256(array),
            "values": _preview(array),
        }
        if decode and array.dtype == np.uint8 and array.ndim and array.size:
            entry["decoded"] = _decoded_record(array)
        tensors.append(entry)
    if stage is not None and stage not in groups:
        present = ", ".join(sorted(groups))
        raise UsageError(f"step {index} of {case_id!r} has no stage {stage!r}; it has {present}")
    return {
        "file": golden.path,
        "case": case_id,
        "step": index,
        "expect_error": golden.step_attrs(case_id, index).get("expect_error"),
        "tensors": tensors,
        "omitted_carries": list(golden.cleared_carries(case_id, index)) if stage in (None, "inputs") else [],
    }


def _plain(value):
    """JSON-friendly scalar: shortest digits for floats, strings for nan/inf."""
    if isinstance(value, np.floating):
        if not np.isfinite(value):
            return str(value)
        return float(np.format_float_positional(value, unique=True, trim="-"))
    return value.item() if isinstance(value, np.generic) else value


def _preview(array: np.ndarray) -> list:
    flat = array.reshape(-1)[:PREVIEW]
    return [_plain(value) for value in flat]


def _decoded_record(array: np.ndarray) -> dict | None:
    """Scale bytes, their values and the first decoded values of the first record."""
    record = array.reshape(-1, array.shape[-1])[0]
    if array.shape[-1] == FP8_RECORD_BYTES:
        scales, _, tail = unpack_fp8_record(record)
        values = decode_fp8_record(record)
        return {
            "format": "fp8_e4m3_block64",
            "scale_bytes": scales.tolist(),
            "scales": [_plain(value) for value in e8m0_decode(scales)],
            "values": [_plain(value) for value in values[:PREVIEW]],
            "rope_tail": [_plain(value) for value in bf16_to_f32(tail)[:PREVIEW]],
        }
    if array.shape[-1] == FP4_RECORD_BYTES:
        scales, _ = unpack_fp4_record(record)
        values = decode_fp4_record(record)
        return {
            "format": "fp4_e2m1_block32",
            "scale_bytes": scales.tolist(),
            "scales": [_plain(value) for value in e8m0_decode(scales)],
            "values": [_plain(value) for value in values[:PREVIEW]],
        }
    return None


def _render(document: dict) -> None:
    if "tensors" in document:
        rows = [
            (
                entry["tensor"],
                "x".join(map(str, entry["shape"])) or "scalar",
                entry["dtype"],
                entry["sha256"][:12],
                " ".join(map(str, entry["values"])),
            )
            for entry in document["tensors"]
        ]
        title = f"{document['case']} step {document['step']}"
        if document["expect_error"]:
            title += f" (expect_error: {document['expect_error']})"
        _emit(title, ("tensor", "shape", "dtype", "sha256", "first values"), rows)
        for entry in document["tensors"]:
            if entry.get("decoded"):
                click.echo(one_line(f"{entry['tensor']} record 0: {entry['decoded']}"))
        for name in document["omitted_carries"]:
            click.echo(f"inputs/{name}: {OMITTED}")
    elif "steps" in document:
        heading = f"{document['case']} [{document['family']}] seed={document['seed']}"
        click.echo(one_line(f"{heading}: {document['description']}"))
        click.echo(one_line(f"attrs: {document['attrs']}"))
        rows = [
            (step["step"], step["T"], step["S"], step["Kc"], len(step["stages"]), step["expect_error"] or "")
            for step in document["steps"]
        ]
        _emit(document["case"], ("step", "T", "S", "Kc", "stages", "expect_error"), rows)
        for step in document["steps"]:
            if step["omitted_carries"]:
                names = ", ".join(step["omitted_carries"])
                click.echo(f"step {step['step']}: {names} {OMITTED}")
    else:
        provenance = document["provenance"]
        click.echo(one_line(" ".join(f"{key}={value}" for key, value in provenance.items())))
        rows = [
            (c["case"], c["family"], str(c["ratio"]), c["cache_format"], str(c["steps"]),
             ",".join(map(str, c["rejected_steps"])))
            for c in document["cases"]
        ]
        _emit(document["file"], ("case", "family", "ratio", "cache", "steps", "rejected"), rows)


def _emit(title: str, columns: tuple[str, ...], rows: list[tuple]) -> None:
    if stdout_is_terminal():
        table = Table(title=title)
        # The first column holds what a user copies into the next command (case ids, tensor names).
        widest = max([len(escaped(str(row[0]))) for row in rows] + [1])
        table.add_column(columns[0], no_wrap=True, min_width=widest)
        for column in columns[1:]:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(Text(escaped(str(cell))) for cell in row))
        print_table(console(), table)
        return
    click.echo(one_line(title))
    click.echo("\t".join(columns))
    for row in rows:
        click.echo("\t".join(escaped(str(cell)) for cell in row))
