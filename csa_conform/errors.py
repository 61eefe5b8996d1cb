"""Every error csa-conform raises on purpose, each carrying the exit code a command ends with.

``exit_code_of`` is the one mapping every command uses, including what
``--git-bisect`` turns into 125 (skip this commit): a failure of the machine
or of the golden file at that commit says nothing about the kernels being
bisected.
"""

from __future__ import annotations

from typing import Any

from csa_conform.exitcodes import ExitCode

# Every reference message starts with the operator name and a colon.
OP = "CompressedSparseAttention"


class CsaConformError(Exception):
    """Base of every error csa-conform raises on purpose."""

    exit_code = ExitCode.USAGE


class ContractError(CsaConformError, ValueError):
    """The reference kernel would reject this step; ``str(err)`` is its exact message.

    ``kind`` is ``"unsupported"`` for the reference's ``unsupported()`` path
    (message carries ``Unsupported: ``) and ``"invalid"`` for ``error()``.
    """

    def __init__(self, message: str, kind: str = "invalid"):
        super().__init__(message)
        self.kind = kind


def operator_message(message: str, kind: str = "invalid") -> str:
    """The reference's text of a rejection: the operator prefix, and ``Unsupported: `` for that kind."""
    return f"{OP}: Unsupported: {message}" if kind == "unsupported" else f"{OP}: {message}"


def invalid(message: str) -> ContractError:
    """The reference's ``error()`` path."""
    return ContractError(operator_message(message), "invalid")


def unsupported(message: str) -> ContractError:
    """The reference's ``unsupported()`` path."""
    return ContractError(operator_message(message, "unsupported"), "unsupported")


class HostStageRejected(ContractError):
    """A stage forced to the host refused what this run fed it (e.g. a top-k tie in device scores)."""

    def __init__(self, stage: str, message: str, kind: str = "invalid"):
        super().__init__(message, kind)
        self.stage = stage

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        """Rebuilt whole when it crosses from the worker process that ran the step (csa_conform._base.pool)."""
        return type(self), (self.stage, str(self), self.kind)


class GoldenFormatError(CsaConformError):
    """A golden file is missing, unreadable or does not follow specs/golden-file.md (schema, groups)."""


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

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        # Rebuilt from its fields when it crosses a process boundary (verify --jobs).
        return type(self), (self.path, self.obj, self.reason)


class CorruptDataset(GoldenIntegrityError):
    """A dataset's bytes do not match its sha256 attribute.

    ``links`` names every path of the file stored in the same HDF5 object
    (hard links), when the reader knows them; the dataset's own path otherwise.
    """

    def __init__(self, path: str, dataset: str, reason: str, links: tuple[str, ...] = ()):
        super().__init__(path, f"dataset {dataset}", reason)
        self.dataset = dataset
        self.links = links or (dataset,)

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), (self.path, self.dataset, self.reason, self.links)


class GoldenChanged(GoldenFormatError):
    """The golden file was replaced or rewritten while a command was reading it."""


class OutputWriteError(CsaConformError):
    """An output file could not be written (disk full, file size limit, I/O error); nothing was left."""

    exit_code = ExitCode.ENVIRONMENT


class GoldenWriteError(OutputWriteError):
    """A golden file could not be written (disk full, file size limit, I/O error); nothing was left."""


class UsageError(CsaConformError):
    """Bad command-line arguments or recipe names."""


class FixtureError(CsaConformError):
    """A recipe did not behave as designed (a step rejected or accepted unexpectedly): the oracle and
    the recipe disagree, which is a verification failure, not bad input."""

    exit_code = ExitCode.DIVERGED

    def __init__(self, message: str, case_id: str = ""):
        super().__init__(message)
        self.case_id = case_id


class TopKTie(FixtureError):
    """The oracle rejected a random draw for an exact top-k score tie (stage 5 refuses ties)."""


class DeviceUnavailable(CsaConformError):
    """No CUDA device, no CuPy, or a kernel directory that does not compile."""

    exit_code = ExitCode.ENVIRONMENT


class KernelFault(CsaConformError):
    """A kernel under test that faulted (``kind`` "fault": a signal on the host, a sticky CUDA error) or never
    ended (``kind`` "hang"): the verdict of the case it ran for, never the run's error. ``cause`` names the
    signal or the CUDA error, ``launch`` (a csa_conform.device.provenance.LaunchRecord) the launch;
    ``ends_worker``: the process it ran in cannot launch again (a dead CUDA context)."""

    exit_code = ExitCode.DIVERGED

    def __init__(self, kind: str, cause: str, launch: Any = None, ends_worker: bool = False):
        super().__init__(cause)
        self.kind, self.cause, self.launch, self.ends_worker = kind, cause, launch, ends_worker

    def __str__(self) -> str:
        launch = self.launch
        if launch is None:
            return f"{self.kind}: {self.cause}"
        return (f"{self.kind}: {self.cause} in {launch.module}:{launch.entry} (grid {list(launch.grid)}, "
                f"block {list(launch.block)}), stage {'+'.join(launch.stages)}, step {launch.step}")

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), (self.kind, self.cause, self.launch, self.ends_worker)


class MemoryShortage(CsaConformError):
    """The run needs more memory than a limit (ulimit -v, a cgroup, the machine) leaves it."""

    exit_code = ExitCode.ENVIRONMENT


class MissingExtra(CsaConformError):
    """A command needs an optional dependency that is not installed (fuzz: hypothesis)."""

    exit_code = ExitCode.ENVIRONMENT


class TensorFileError(CsaConformError):
    """A ``.nxrt`` tensor file (the runtime bridge's interchange) that does not follow its layout."""


class WorkerCrashed(CsaConformError):
    """A worker process of --jobs died (killed, out of memory) before returning its result."""

    exit_code = ExitCode.ENVIRONMENT


class CorruptedWorker(WorkerCrashed):
    """The worker process that runs kernels in its own memory (the host backend) raised an error no code path
    expects after kernel code ran there: an out-of-bounds write of a kernel can leave that process's memory
    corrupt, so the error is no evidence of a bug of csa-conform's; the worker is replaced."""

    ends_worker = True

    def __init__(self, error: str):
        super().__init__(f"the worker process that runs the kernels failed after kernel code ran in it ({error}): a "
                         "kernel may have written outside its buffers into that process's memory; --backend cuda, "
                         "or the case alone under a memory checker, shows which")
        self.error = error

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return type(self), (self.error,)


class InternalError(CsaConformError):
    """csa-conform itself failed (an exception no code path expects): its bug, reported as such, never a
    verdict on the kernels; ``of(error)`` names the error and where it was raised in one line."""

    exit_code = ExitCode.INTERNAL

    @classmethod
    def of(cls, error: BaseException) -> InternalError:
        return cls(f"internal error in csa-conform: {error_line(error)}; please report it")


def error_line(error: BaseException) -> str:
    """An error in one line: its type, message and the file and line that raised it."""
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    where = "" if traceback is None else (
        f" at {traceback.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{traceback.tb_lineno}")
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}{where}"


class SanitizedRunFailed(CsaConformError):
    """The diff run under compute-sanitizer stopped with an error of its own; its exit code is kept."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = ExitCode(exit_code)


def exit_code_of(error: BaseException, *, git_bisect: bool = False) -> ExitCode:
    """The exit code a command ends with for ``error`` (an OSError is invalid input)."""
    code = ExitCode(getattr(error, "exit_code", ExitCode.USAGE))
    if git_bisect and (code in (ExitCode.ENVIRONMENT, ExitCode.INTERNAL) or isinstance(error, GoldenFormatError)):
        return ExitCode.BISECT_SKIP
    return code


def invalid_case(error: BaseException) -> bool:
    """True for what makes one case of a golden file unjudgeable (an attribute out of bounds, a tensor that
    cannot be read), which is that case's ``invalid`` verdict: not a damaged dataset (a failure, exit 1)
    and not a file that changed under the run (the whole run's)."""
    return isinstance(error, GoldenFormatError) and not isinstance(error, (GoldenIntegrityError, GoldenChanged))
