"""``csa-conform export``: golden steps as single-node ONNX models for runtimes (csa_conform.bridge.export)."""

from __future__ import annotations

from pathlib import Path

import click

from csa_conform._base.case_glob import matching_cases
from csa_conform._base.terminal import escaped
from csa_conform.bridge.export import FORMATS, NXRT_BRIDGE, export, new_directory
from csa_conform.bridge.model import onnx_module
from csa_conform.cli.common import boundary
from csa_conform.cli.exit_status import exits
from csa_conform.cli.options import case_selection, golden_file, quiet_option
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile


@exits("written")
@click.command("export")
@golden_file()
@case_selection()
@click.option("--format", "layout", type=click.Choice(FORMATS), required=True,
              help="nxrt-bridge: model.onnx and input_K.nxrt per step, as the runtime's conformance runner reads "
              "them; onnx-node-test: model.onnx and test_data_set_0/input_K.pb, output_K.pb (steps the reference "
              "rejects are left out).")
@click.option("-o", "--output", required=True, type=click.Path(), help="The folder to create.")
@click.option("--force", is_flag=True, help="Replace an existing folder.")
@quiet_option("No summary line.")
@boundary
def export_command(file: str, case_glob: str | None, layout: str, output: str, force: bool, quiet: bool) -> ExitCode:
    """Write every step of FILE as a single-node ONNX model and its inputs and golden outputs.

    A stream's later steps take the previous step's golden present_* as their
    past_* inputs, so every step runs alone. The folder appears complete or not
    at all. Needs the onnx package (the onnx extra).

    \b
    Examples:
      csa-conform export goldens/ci.h5 --format nxrt-bridge -o build/bridge
      csa-conform export goldens/ci.h5 --case 'random.*' --format onnx-node-test -o build/node
    """
    onnx_module()
    with GoldenFile(file) as golden:
        case_ids = matching_cases(golden.case_ids(), case_glob, golden.path)
        with new_directory(Path(output), force) as target:
            manifest = export(golden, case_ids, layout, target)
    if not quiet:
        steps = sum(len(case["steps"]) for case in manifest["cases"])
        left_out = manifest["rejected_steps_left_out"]
        click.echo(f"exported {steps} steps of {len(case_ids)} cases ({layout}) to {escaped(output)}"
                   + (f"; {left_out} steps the reference rejects left out (the layout cannot say a step is "
                      "refused)" if left_out and layout != NXRT_BRIDGE else ""))
    return ExitCode.OK
