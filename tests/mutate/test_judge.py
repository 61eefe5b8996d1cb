"""Classifying mutants on the host backend: killed (case, stage, tensor), survived, did not build, fault (a
segfault kills the worker, which is replaced) and hang (the timeout kills it), each judged by the ordinary
chained diff of one small case, with hand-made mutants of the replicate module (a quick g++ build); the
workers' GPU assignment and the sanitized re-run of a survivor, whose tools need a GPU, with fakes."""

from pathlib import Path

import pytest

from csa_conform._base.resources import ci_goldens
from csa_conform.check.model import CaseVerdict, StageVerdict
from csa_conform.check.options import BuildChoice
from csa_conform.device.host.emulation import GXX
from csa_conform.device.kernels import KernelDirectory
from csa_conform.errors import DeviceUnavailable
from csa_conform.mutate.judge import (
    BUILD_FAILED,
    FAULT,
    HANG,
    KILLED,
    SURVIVED,
    Judge,
    Setup,
    Task,
    Workers,
    classify,
    ordered_cases,
)
from csa_conform.mutate.mutants import Mutant
from csa_conform.spec import STAGE_NAMES

pytestmark = pytest.mark.skipif(GXX is None, reason="the host backend needs g++")

FILE = "csa_ratio4_index_replicate.cu"
CASE = "random.r4-n4-i3-k1"
STORE = "selected[element] = shared[(b * sequence + s) * topk_width + slot];"


def hand_made(name: str, original: str, replacement: str) -> Mutant:
    text = KernelDirectory().read(FILE)
    start = text.index(original)
    return Mutant(FILE, text.count("\n", 0, start) + 1, 1, name, start, start + len(original), original, replacement,
                  name)


MUTANTS = {
    KILLED: hand_made("killed", STORE, ";"),
    SURVIVED: hand_made("survived", "if (element >= count) return;", "if (count <= element) return;"),
    BUILD_FAILED: hand_made("no-build", STORE, "selected[element] = no_such_name;"),
    FAULT: hand_made("fault", STORE, "*(volatile int*)16 = 1;"),
    HANG: hand_made("hang", STORE, "for (volatile int spin = 1; spin;) {}"),
}


def test_each_outcome_is_its_verdict(tmp_path):
    setup = Setup(str(ci_goldens()), BuildChoice(), "host", 0, 1, STAGE_NAMES, str(tmp_path))
    text = KernelDirectory().read(FILE)
    order = ordered_cases([CASE], {}, {})
    tasks = [(expected, Task(mutant, mutant.apply(text), order)) for expected, mutant in MUTANTS.items()]
    with Workers(setup, jobs=1) as workers:
        # generous for the first task, which builds the case's modules; short for the hang, built by then
        verdicts = {expected: judged.verdict for expected, judged in workers.run(iter(tasks[:-1]), timeout_s=120)}
        verdicts.update((expected, judged.verdict) for expected, judged in workers.run(iter(tasks[-1:]), timeout_s=4))
        started = workers.started
    assert {expected: verdict.verdict for expected, verdict in verdicts.items()} == {name: name for name in MUTANTS}
    killed = verdicts[KILLED]
    assert (killed.case, killed.stage, killed.tensor, killed.step) == (CASE, "selection", "selected_indices", 0)
    assert "g++ cannot build" in verdicts[BUILD_FAILED].detail
    assert "SIGSEGV" in verdicts[FAULT].detail
    assert "timeout" in verdicts[HANG].detail
    # the first worker judged three mutants, then died on the fourth: that one was judged again in a fresh
    # worker (a used one may die of what an earlier mutant wrote), which died too (fault), and the hang
    # ran in a third
    assert started == 3


def test_classify_is_the_one_mapping():
    assert classify(error=DeviceUnavailable("NVRTC cannot compile k.cu (prelude + module): x")).verdict == BUILD_FAILED
    launch = classify("c", error=DeviceUnavailable("launch of e (grid (1,1,1), block (1,1,1)) failed: illegal address"))
    assert (launch.verdict, launch.case) == (FAULT, "c")
    assert classify(exit_code=-11).detail.endswith("(killed by SIGSEGV)")
    assert classify(timed_out=True).verdict == HANG
    faulted = CaseVerdict("c", stages={"selection": StageVerdict("selection", "device", FAULT, step=1, message="x")})
    assert (classify("c", faulted).verdict, classify("c", faulted).stage) == (FAULT, "selection")


def test_cases_that_killed_most_run_first_then_the_quickest():
    assert ordered_cases(["a", "b", "c", "d"], {"c": 3, "b": 1}, {"a": 2.0, "d": 0.5}) == ("c", "b", "d", "a")


def test_workers_spread_over_the_gpus_given(tmp_path):
    """--devices: each new worker takes the GPU the fewest live workers use (set before CUDA starts in it)."""
    setup = Setup(str(ci_goldens()), BuildChoice(), "host", 0, 1, STAGE_NAMES, str(tmp_path))
    with Workers(setup, jobs=3, devices=("0", "1")) as workers:
        for _ in range(3):
            workers.slots.append(workers._start())
        assert [slot.device for slot in workers.slots] == ["0", "1", "0"]
        workers._replace(workers.slots[1])
        workers.slots.append(workers._start())
        assert [slot.device for slot in workers.slots] == ["0", "0", "1"]


def test_a_survivor_the_sanitizer_flags_is_killed(tmp_path, monkeypatch):
    """--sanitize: the survivor's directory is written out and diffed under compute-sanitizer (faked here: the
    tool needs a GPU); an error it reports kills the mutant, at stage 'sanitizer'."""
    from csa_conform.device import sanitizer

    seen = {}

    def fake(tool, words, sanitizer_path=None):
        kernels = words[words.index("--kernels") + 1]
        seen.update(tool=tool, words=list(words), text=(Path(kernels) / FILE).read_text())
        finding = sanitizer.SanitizerFinding(tool, "race", "Race reported between Write access and Read access")
        return sanitizer.SanitizedRun([], 1, "{}", "", [finding], 1)

    monkeypatch.setattr(sanitizer, "run_sanitized", fake)
    setup = Setup(str(ci_goldens()), BuildChoice(), "host", 0, 1, STAGE_NAMES, str(tmp_path), "racecheck", CASE)
    mutant = MUTANTS[SURVIVED]
    verdict = Judge(setup)._sanitized(Task(mutant, mutant.apply(KernelDirectory().read(FILE)), (CASE,)))
    assert (verdict.verdict, verdict.stage, verdict.tensor) == (KILLED, "sanitizer", "race")
    assert seen["tool"] == "racecheck" and "if (count <= element) return;" in seen["text"]
    assert seen["words"][seen["words"].index("--build") + 1] == "strict"  # the built-ins' build, not production
    assert seen["words"][-2:] == ["--case", CASE]


def test_repeat_judges_only_survivors_again(tmp_path):
    """--repeat N: the plain gate first; a mutant it kills is not run again, a survivor is, and the host
    backend's reversed second run sees the barrier whose deletion the plain gate passes."""
    select = "csa_ratio4_index_select.cu"
    text = KernelDirectory().read(select)
    barrier = "__syncthreads();  // thread 0 has published the digit and is done with the histogram"
    start = text.index(barrier)
    deleted = Mutant(select, text.count("\n", 0, start) + 1, 9, "barrier-delete", start,
                     start + len("__syncthreads();"), "__syncthreads();", ";", "digit-published")
    case = "random.r4-n4-i3-k1"

    def judged(repeat: int, mutant: Mutant, file_text: str, order: tuple[str, ...]):
        setup = Setup(str(ci_goldens()), BuildChoice(), "host", 0, repeat, STAGE_NAMES, str(tmp_path))
        return Judge(setup).judge(Task(mutant, mutant.apply(file_text), order)).verdict

    plain = judged(1, deleted, text, (case,))
    assert (plain.verdict, plain.cases_run) == (SURVIVED, 1)
    repeated = judged(2, deleted, text, (case,))
    assert (repeated.verdict, repeated.case, repeated.cases_run) == (KILLED, case, 2)
    killed = judged(2, MUTANTS[KILLED], KernelDirectory().read(FILE), (CASE,))
    assert (killed.verdict, killed.cases_run) == (KILLED, 1)
