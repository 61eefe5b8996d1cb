"""One exception hierarchy, so the CLI can map every failure to an exit code."""

from __future__ import annotations


class CsaConformError(Exception):
    """Base of every error csa-conform raises on purpose."""


class ContractError(CsaConformError, ValueError):
    """The reference kernel would reject this step; ``str(err)`` is its exact message.

    ``kind`` is ``"unsupported"`` for the reference's ``unsupported()`` path
    (message carries ``Unsupported: ``) and ``"invalid"`` for ``error()``.
    """

    def __init__(self, message: str, kind: str = "invalid"):
        super().__init__(message)
        self.kind = kind


class GoldenFormatError(CsaConformError):
    """A golden file does not follow specs/golden-file.md (schema, layout or checksum)."""


class UsageError(CsaConformError):
    """Bad command-line arguments or recipe names."""


class DeviceUnavailable(CsaConformError):
    """No CUDA device, no CuPy, or a kernel directory that does not compile."""
