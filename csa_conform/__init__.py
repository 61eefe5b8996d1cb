"""csa-conform: bit-exact conformance harness for CompressedSparseAttention v1."""

from csa_conform.errors import ContractError

__version__ = "0.1.0"
ORACLE_VERSION = "1"

__all__ = ["ContractError", "__version__", "ORACLE_VERSION", "run_step"]


def __getattr__(name):
    """run_step loads lazily: the oracle imports the numerics, which import csa_conform.errors."""
    if name == "run_step":
        from csa_conform.oracle import run_step

        return run_step
    raise AttributeError(name)
