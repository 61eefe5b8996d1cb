"""The ``csa-conform`` command line (specs/cli.md): presentation only, no numerics.

Each command lives in its own module, registered on the group in csa_conform.cli.group.
"""

from csa_conform.cli.group import main

__all__ = ["main"]
