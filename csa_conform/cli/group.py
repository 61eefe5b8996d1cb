"""The ``csa-conform`` group: every command (one module each) registered on it, and its exit table."""

from __future__ import annotations

import click

from csa_conform import __version__
from csa_conform.cli.bench import bench_command
from csa_conform.cli.bisect import bisect as bisect_command
from csa_conform.cli.bridge import bridge_command
from csa_conform.cli.calibrate import calibrate_command
from csa_conform.cli.common import OneLineErrors
from csa_conform.cli.diff import diff as diff_command
from csa_conform.cli.exit_status import exits
from csa_conform.cli.explain import explain_command
from csa_conform.cli.export import export_command
from csa_conform.cli.fuzz import fuzz_command
from csa_conform.cli.gap import gap_command
from csa_conform.cli.generate import generate_command
from csa_conform.cli.inspect import inspect_command
from csa_conform.cli.mutate import mutate_command
from csa_conform.cli.reduce import reduce_command
from csa_conform.cli.report import report_command
from csa_conform.cli.verify import verify_command


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="csa-conform")
def main() -> None:
    """Bit-exact conformance harness for CompressedSparseAttention v1.

    \b
    Examples:
      csa-conform verify goldens/ci.h5
      csa-conform diff --kernels ./my-kernels --json > diff.json
      csa-conform report diff.json --junit junit.xml
    """


COMMANDS = (generate_command, verify_command, diff_command, bisect_command, reduce_command, fuzz_command,
            explain_command, mutate_command, inspect_command, report_command, gap_command, calibrate_command, bench_command, export_command,
            bridge_command)
for command in COMMANDS:
    main.add_command(command)
exits("verified, conformant or written", "a divergence or a verification failure", bisect=True)(main)
