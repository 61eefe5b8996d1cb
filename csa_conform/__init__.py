"""csa-conform: bit-exact conformance harness for CompressedSparseAttention v1.

The public surface is what this module exports: ``run_step`` (the oracle's
step), the error types a caller catches and ``ExitCode``. Everything else is
internal: the pipeline spec (csa_conform.spec), golden files
(csa_conform.golden), the device runner and its backends (csa_conform.device)
are documented in specs/ and may change between versions.
"""

from typing import Any

from csa_conform.errors import ContractError, CsaConformError
from csa_conform.exitcodes import ExitCode

__version__ = "0.1.0"
ORACLE_VERSION = "1"

__all__ = ["ContractError", "CsaConformError", "ExitCode", "ORACLE_VERSION", "__version__", "run_step"]


def __getattr__(name: str) -> Any:
    """run_step loads lazily: the oracle imports the numerics, which import csa_conform.errors."""
    if name == "run_step":
        from csa_conform.oracle import run_step

        return run_step
    raise AttributeError(name)
