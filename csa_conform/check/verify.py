"""Replay a golden file through the oracle: the regression gate behind ``csa-conform verify``.

Every case of any conforming file (ours or another tool's) is checked in
three passes: its layout and case digest (opening it), every dataset of the
case against its sha256, then every step re-run with its inputs exactly as
stored, requiring bit-identical outputs and stage payloads (only the stages
the file holds) — or, for a step with ``expect_error``, exactly that
rejection message. A stream is also required to be one: each step's past_*
inputs are the previous step's present_* outputs, as a runtime feeds them.
The passes overlap on threads (a step replays once its inputs are checked,
while the rest of its case and the next case are read and hashed), and what
is reported is what running them in turn reports.
"""

from __future__ import annotations

from functools import lru_cache

from csa_conform._base.case_glob import exact_glob
from csa_conform._base.terminal import one_line, shell_join
from csa_conform.check.model import CaseVerdict, StepVerdict
from csa_conform.check.results import REJECTION_MISMATCH
from csa_conform.compare.bitwise import compare_payloads
from csa_conform.errors import ContractError, CsaConformError, GoldenChanged, GoldenIntegrityError, invalid_case
from csa_conform.golden import GoldenFile, GoldenStep
from csa_conform.golden.recipes.stream import STATE
from csa_conform.oracle import run_step
from csa_conform.profiles.numerics import file_profile, runner

__all__ = ["reproduce_command", "stream_break", "verify_case", "verify_case_in"]


def reproduce_command(path: str, case_id: str) -> str:
    """The command that verifies exactly this case (its id as a glob matching it alone), printable."""
    return shell_join(["csa-conform", "verify", path, "--case", exact_glob(case_id)])


def replay(attrs: dict, output_names, inputs: dict, run=run_step):
    """What ``run`` (the file's numerics profile; the reference by default) makes of a step's inputs:
    its result, or the ContractError it rejects them with."""
    try:
        return run(attrs, inputs, list(output_names))
    except ContractError as rejection:
        return rejection


def judge_step(index: int, step: GoldenStep, replayed) -> StepVerdict:
    """The stored step against its replay (``replay``'s result or rejection)."""
    if isinstance(replayed, ContractError):
        message = str(replayed)
        if step.expect_error is None:
            return StepVerdict(index, False, problem=f"oracle rejected the stored step: {message}")
        if message != step.expect_error:
            return StepVerdict(
                index,
                False,
                expect_error=step.expect_error,
                problem=f"expected rejection {step.expect_error!r}, oracle said {message!r}",
                problem_type=REJECTION_MISMATCH,
            )
        return StepVerdict(index, True, expect_error=step.expect_error)
    if step.expect_error is not None:
        return StepVerdict(
            index,
            False,
            expect_error=step.expect_error,
            problem=f"expected rejection {step.expect_error!r}, but the oracle accepted the step",
            problem_type=REJECTION_MISMATCH,
        )
    expected = {"outputs": step.outputs, **step.stages}
    actual = {"outputs": replayed.outputs}
    actual.update({stage: replayed.stages[stage] for stage in step.stages if stage in replayed.stages})
    diffs = compare_payloads(expected, actual)
    failing = [diff for diff in diffs if not diff.passed]
    return StepVerdict(index, not failing, compared=bool(diffs), diffs=failing)


def stream_break(previous: GoldenStep, step: GoldenStep) -> str | None:
    """Why ``step`` cannot follow ``previous`` in one stream (None when it can).

    The first step's past_* inputs are the recorded initial state; every later
    one must be bit-identical to the present_* output it is fed from.
    """
    if previous.expect_error is not None:
        return "follows a step the oracle rejects; a rejected step ends its stream"
    for present, past in STATE.items():
        if past not in step.inputs or present not in previous.outputs:
            continue
        before, now = previous.outputs[present], step.inputs[past]
        if before.dtype != now.dtype or before.shape != now.shape or before.tobytes() != now.tobytes():
            return f"input {past} is not the previous step's {present} (steps out of order or altered)"
    return None


def verify_case(golden: GoldenFile, case_id: str, engine: str | None = None, then: str | None = None) -> CaseVerdict:
    """Digests first (a tampered file is reported as such, naming the object), then replay under the
    numerics profile the file names, the oracle run by ``engine`` (None: $CSA_CONFORM_ENGINE, else auto).

    The datasets are read and hashed on threads while the steps whose inputs are checked replay,
    and the case verified ``then`` is read behind them, so both cores work; what is reported is
    what checking every digest before any replay reports: the first damaged dataset in file
    order, else what the replays found.
    """
    reproduce = reproduce_command(golden.path, case_id)
    result = CaseVerdict(case_id, reproduce)
    run = runner(file_profile(golden.provenance, golden.path), engine)
    try:
        info = golden.case_info(case_id)
        result.family = info.family
        with golden.checking_case(case_id, what=f"{golden.path}: case {case_id!r}") as checks:
            if then is not None:
                golden.read_ahead(then, after=case_id)
            try:
                result.steps = _replayed_steps(golden, case_id, info, run)
            except Exception:
                checks.wait()  # a damaged dataset is what checking the digests first would have reported
                raise
            checks.wait()
    except GoldenIntegrityError as corrupt:
        result.steps = []
        result.problem = f"corrupt {corrupt.obj}: {corrupt.reason}"
    except CsaConformError as error:
        if not invalid_case(error):
            raise
        result.steps = []
        result.invalid = one_line(str(error))
    result.step_count = len(result.steps)
    return result


def _replayed_steps(golden: GoldenFile, case_id: str, info, run) -> list[StepVerdict]:
    """Each step replayed once its inputs are checked (its outputs and stages may still be read meanwhile)."""
    steps, previous = [], None
    for index in range(info.step_count):
        inputs = golden.read_inputs(case_id, index)
        broken = None if previous is None else stream_break(previous, GoldenStep(inputs=inputs))
        replayed = None if broken is not None else replay(info.attrs, info.output_names, inputs, run)
        step = golden.read_step(case_id, index)
        if broken is not None:
            steps.append(StepVerdict(index, False, problem=f"not a stream: {broken}"))
        else:
            steps.append(judge_step(index, step, replayed))
        previous = step
    return steps


def verify_case_in(path: str, manifest: str, case_id: str, engine: str | None = None) -> CaseVerdict:
    """``verify_case`` in a worker process, on the same file the parent opened (same manifest)."""
    return verify_case(_opened(path, manifest), case_id, engine)


@lru_cache(maxsize=1)
def _opened(path: str, manifest: str) -> GoldenFile:
    golden = GoldenFile(path)
    if golden.manifest != manifest:
        raise GoldenChanged(f"{path}: the file changed while it was being verified")
    return golden
