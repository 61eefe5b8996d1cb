"""One exception hierarchy, so the CLI can map every failure to an exit code."""

from __future__ import annotations

from csa_conform.exitcodes import ExitCode


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
    """A golden file does not follow HARNESS.md §3 (schema, layout or checksum)."""

    exit_code = ExitCode.USAGE


class GoldenIntegrityError(GoldenFormatError):
    """A golden file is readable but an object no longer matches its recorded digest.

    The file was altered after it was written: ``verify`` reports that as a
    verification failure (exit 1), naming the object (``obj``).
    """

    exit_code = ExitCode.DIVERGED

    def __init__(self, path: str, obj: str, reason: str):
        super().__init__(f"{path}: {obj}: {reason}")
        self.path = path
        self.obj = obj
        self.reason = reason

    def __reduce__(self):
        # Rebuilt from its fields when it crosses a process boundary (verify --jobs).
        return type(self), (self.path, self.obj, self.reason)


class CorruptDataset(GoldenIntegrityError):
    """A dataset's bytes do not match its sha256 attribute."""

    def __init__(self, path: str, dataset: str, reason: str):
        super().__init__(path, f"dataset {dataset}", reason)
        self.dataset = dataset

    def __reduce__(self):
        return type(self), (self.path, self.dataset, self.reason)


class GoldenChanged(GoldenFormatError):
    """The golden file was replaced or rewritten while a command was reading it."""


class GoldenWriteError(CsaConformError):
    """A golden file could not be written (disk full, file size limit, I/O error); nothing was left."""

    exit_code = ExitCode.ENVIRONMENT


class UsageError(CsaConformError):
    """Bad command-line arguments or recipe names."""


class DeviceUnavailable(CsaConformError):
    """No CUDA device, no CuPy, or a kernel directory that does not compile."""


class WorkerCrashed(CsaConformError):
    """A worker process of --jobs died (killed, out of memory) before returning its result."""

    exit_code = ExitCode.ENVIRONMENT
