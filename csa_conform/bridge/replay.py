"""A golden case run through the runtime's runner step by step, its outputs judged bit for bit.

Each step runs in a fresh case directory (csa_conform.bridge.export's
nxrt-bridge layout); the runner's outputs are compared with the golden
outputs by csa_conform.compare.bitwise, as ``diff`` compares stages. Chained, a step's
``past_*`` inputs are the runtime's own ``present_*`` of the step before
wherever the golden stream threads them (bit-identical golden tensors), so
the runtime's state flows through the stream as in production; isolated,
every step reads the golden state. With a force-host variable every step
runs twice, plain and with the variable set to 1 (the CUDA provider's switch
for its host-staged path), each run a stream of its own, and the case says
which of the two leaves the goldens first. A step the reference rejects
must be refused (``ERROR``).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from csa_conform._base.case_glob import exact_glob
from csa_conform._base.terminal import shell_join
from csa_conform.bridge import nxrt
from csa_conform.bridge.export import ExportedStep, case_folder, exported_steps, step_folder, write_bridge_step
from csa_conform.bridge.protocol import ERROR, OK, UNSUPPORTED, RunnerRun, run_runner
from csa_conform.check.gap import Gap
from csa_conform.check.model import CaseVerdict, StepVerdict
from csa_conform.check.results import REJECTION_MISMATCH, RUNNER_ERROR
from csa_conform.check.results import UNSUPPORTED as UNSUPPORTED_FAILURE
from csa_conform.compare.bitwise import TensorDiff, compare_tensor, default_axes
from csa_conform.errors import TensorFileError
from csa_conform.golden import GoldenFile
from csa_conform.numerics.bits import same_bits
from csa_conform.profiles.numerics import REFERENCE
from csa_conform.spec import STATE_THREADING, WRITEBACK_SOURCES

CHAINED = "chained"
ISOLATED = "isolated"
MODES = (CHAINED, ISOLATED)
PLAIN = "plain"
FORCE_HOST = "force-host"
DEFAULT_FORCE_HOST_ENV = "ONNX_GENAI_CSA_FORCE_HOST"
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class BridgeOptions:
    """How the runner is run: its command, its environment, the mode, the force-host variable, the bounds."""

    file: str
    runner: str
    words: tuple[str, ...]
    environment: tuple[tuple[str, str], ...] = ()
    force_host_env: str = DEFAULT_FORCE_HOST_ENV  # "" runs each step once, plain
    mode: str = CHAINED
    ulp: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    tolerance: str | None = None  # --tolerance FILE: the outputs also judged against a calibrated envelope

    @property
    def runs(self) -> tuple[str, ...]:
        return (PLAIN, FORCE_HOST) if self.force_host_env else (PLAIN,)

    def environment_of(self, run: str) -> dict[str, str | None]:
        """The runner's environment on top of this process's: --env, and the force-host variable set to 1
        for the force-host run and removed for the plain one (an inherited value would force it too)."""
        forced: dict[str, str | None] = {self.force_host_env: "1" if run == FORCE_HOST else None}
        return {**dict(self.environment), **(forced if self.force_host_env else {})}

    def label(self, run: str) -> str:
        """The 'stage' a run's output tensors are reported under."""
        return "outputs" if run == PLAIN else "outputs(force-host)"

    def reproduce(self, case: str) -> str:
        words = ["csa-conform", "bridge", self.file, "--case", exact_glob(case), "--runner", self.runner]
        for key, value in self.environment:
            words += ["--env", f"{key}={value}"]
        if self.force_host_env != DEFAULT_FORCE_HOST_ENV:
            words += ["--force-host-env", self.force_host_env]
        words += ["--mode", self.mode] if self.mode != CHAINED else []
        words += ["--ulp", str(self.ulp)] if self.ulp else []
        words += ["--timeout-s", f"{self.timeout_s:g}"] if self.timeout_s != DEFAULT_TIMEOUT_S else []
        words += ["--tolerance", self.tolerance] if self.tolerance else []
        return shell_join(words)

    def describe(self) -> dict:
        return {"mode": self.mode, "ulp": self.ulp, "runner": self.runner, "env": dict(self.environment),
                "force_host_env": self.force_host_env or None, "timeout_s": self.timeout_s}


@dataclass
class RunProblem:
    type: str
    message: str


@dataclass
class StepRun:
    """One step of one run: what the runner said and, when it ran, the output comparison."""

    step: int
    run: str
    runner: RunnerRun
    diffs: list[TensorDiff] = field(default_factory=list)
    problem: RunProblem | None = None
    outputs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def compared(self) -> bool:
        return bool(self.diffs)

    @property
    def passed(self) -> bool:
        return self.problem is None and all(diff.passed for diff in self.diffs)

    def record(self, case: str) -> dict:
        return {"case": case, "step": self.step, "run": self.run, **self.runner.to_dict()}


@dataclass
class BridgeCase:
    """A case's runs and the verdict they make: the CaseVerdict of the document, per run the first step
    that left the goldens; ``errors``, with --tolerance, the outputs' error statistics (under the stages
    that compute them)."""

    result: CaseVerdict
    runs: dict[str, list[StepRun]]
    errors: Gap | None = None

    @property
    def sound(self) -> bool:
        """Every step ran and every output came back with the golden's dtype and shape: only numbers can differ."""
        return all(run.problem is None and not any(diff.problem for diff in run.diffs)
                   for runs in self.runs.values() for run in runs)

    def first_divergence(self, run: str) -> int | None:
        return next((step.step for step in self.runs.get(run, []) if not step.passed), None)

    def differential(self) -> dict:
        firsts = {run: self.first_divergence(run) for run in self.runs}
        known = {run: step for run, step in firsts.items() if step is not None}
        if not known:
            first = "neither"
        elif len(known) == 2 and len(set(known.values())) == 1:
            first = "both"
        else:
            first = min(known, key=lambda run: known[run])
        return {"case": self.result.case, "first_divergence": firsts, "leaves_first": first}

    def differential_line(self) -> str | None:
        """One line when a run left the goldens: which one first, at which step."""
        entry = self.differential()
        firsts = entry["first_divergence"]
        if entry["leaves_first"] == "neither":
            return None
        said = ", ".join(f"{run} at step {step}" if step is not None else f"{run} never" for run, step in firsts.items())
        first = entry["leaves_first"]
        verdict = "both at the same step" if first == "both" else f"{first} first"
        return f"{self.result.case}: leaves the goldens: {said}" + (f" ({verdict})" if len(firsts) > 1 else "")


def _threaded(step: ExportedStep, before: tuple[ExportedStep, StepRun] | None) -> dict[str, np.ndarray]:
    """The runtime's own present_* of the step before, for every past_* the golden stream threads."""
    if before is None:
        return {}
    golden, ran = before
    return {past: ran.outputs[present] for present, past in STATE_THREADING.items()
            if past in step.inputs and present in ran.outputs and present in golden.outputs
            and same_bits(golden.outputs[present], step.inputs[past])}


def _read_outputs(folder: Path, step: ExportedStep, run: StepRun, label: str, ulp: int) -> None:
    for index, name in enumerate(step.output_names):
        path = folder / f"output_{index}.nxrt"
        expected = step.outputs[name]
        if not path.exists():
            run.diffs.append(TensorDiff(label, name, tuple(expected.shape), str(expected.dtype),
                                        default_axes(label, name, expected.shape, expected.dtype), passed=False,
                                        total=int(expected.size),
                                        problem=f"missing: the runner wrote no output_{index}.nxrt"))
            continue
        try:
            actual = nxrt.read_tensor(path)
        except TensorFileError as error:
            run.problem = RunProblem(RUNNER_ERROR, f"{label}/{name}: {error}".replace(str(folder) + "/", ""))
            return
        run.outputs[name] = actual
        run.diffs.append(compare_tensor(expected, actual, stage=label, tensor=name, ulp=ulp))


def _by_source(outputs: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Outputs as the payloads of the stages that compute them, the keys a tolerance file has."""
    stages: dict[str, dict[str, np.ndarray]] = {}
    for name, array in outputs.items():
        stage, tensor = WRITEBACK_SOURCES[name]
        stages.setdefault(stage, {})[tensor] = array
    return stages


def run_step(options: BridgeOptions, step: ExportedStep, run: str, folder: Path,
             before: tuple[ExportedStep, StepRun] | None, errors: Gap | None = None) -> StepRun:
    """One step of one run: its case directory written, the runner run on it, its outputs judged."""
    inputs = _threaded(step, before) if options.mode == CHAINED else {}
    write_bridge_step(folder, step, inputs)
    said = run_runner(list(options.words), folder / "model.onnx", folder, options.environment_of(run),
                      options.timeout_s)
    ran = StepRun(step.step, run, said)
    label = options.label(run)
    if step.expect_error is not None:
        if said.status == OK:
            ran.problem = RunProblem(REJECTION_MISMATCH, f"{run} run: the runtime accepted a step the reference "
                                     f"rejects ({step.expect_error})")
        elif said.status != ERROR:
            ran.problem = _runner_problem(run, said)
    elif said.status == OK:
        _read_outputs(folder, step, ran, label, options.ulp)
        if errors is not None:
            errors.steps += 1
            errors.add_step(step.case, step.step, _by_source(step.outputs), _by_source(ran.outputs))
    else:
        ran.problem = _runner_problem(run, said)
    shutil.rmtree(folder, ignore_errors=True)
    return ran


def _runner_problem(run: str, said: RunnerRun) -> RunProblem:
    kind = UNSUPPORTED_FAILURE if said.status == UNSUPPORTED else RUNNER_ERROR
    return RunProblem(kind, f"{run} run: {said.line}")


def _run_stream(golden: GoldenFile, case_id: str, options: BridgeOptions, run: str, work: Path,
                errors: Gap | None) -> list[StepRun]:
    """One run of a case's stream, read step by step; it stops at its first step the runner failed (nothing
    is left to chain). Only the step before keeps the runtime's outputs."""
    count = golden.step_count(case_id)
    done: list[StepRun] = []
    before: tuple[ExportedStep, StepRun] | None = None
    for step in exported_steps(golden, case_id):
        ran = run_step(options, step, run, work / run / case_folder(case_id) / step_folder(step.step), before,
                       errors)
        done.append(ran)
        if before is not None:
            before[1].outputs.clear()
        if ran.problem is not None and ran.problem.type != REJECTION_MISMATCH:
            if step.step + 1 < count:
                ran.problem.message += f" (steps {step.step + 1}..{count - 1} of this run not run)"
            break
        before = (step, ran) if step.expect_error is None else None
    return done


def judge_case(golden: GoldenFile, case_id: str, options: BridgeOptions, work: Path,
               measure: bool = False) -> BridgeCase:
    """Every run of a case, and the case's verdict: each step judged across the runs; ``measure`` also
    gathers the outputs' error statistics (--tolerance)."""
    started = time.perf_counter()
    errors = Gap(REFERENCE, "runtime") if measure else None
    runs = {run: _run_stream(golden, case_id, options, run, work, errors) for run in options.runs}
    info = golden.case_info(case_id)
    result = CaseVerdict(case_id, options.reproduce(case_id), family=info.family, step_count=info.step_count)
    for index in range(info.step_count):
        ran = [found for run in options.runs for found in runs[run] if found.step == index]
        problems = [found.problem for found in ran if found.problem is not None]
        result.steps.append(StepVerdict(
            index, passed=all(found.passed for found in ran), compared=any(found.compared for found in ran),
            expect_error=golden.step_attrs(case_id, index).get("expect_error"),
            problem="; ".join(problem.message for problem in problems) or None,
            problem_type=problems[0].type if problems else REJECTION_MISMATCH,
            diffs=[diff for found in ran for diff in found.diffs if not diff.passed]))
    result.time_s = time.perf_counter() - started
    return BridgeCase(result, runs, errors)
