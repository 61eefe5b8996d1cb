"""Guard bands: a write outside a buffer a launch was given is the kernel's out-of-bounds finding.

The bookkeeping is tested on the host backend's buffers with writes made on purpose; the whole
command on the host emulation of the real kernels, clean and with the planted writes past the end
and before the start of the score scratch (tests/kernels_mutants/mutants.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

from csa_conform.check.results import schema
from csa_conform.cli.diff import diff
from csa_conform.device import determinism
from csa_conform.device.guards import AFTER, BAND_BYTES, BEFORE, GUARD_BYTE, GuardedWrites
from csa_conform.device.host import HostEmulationBackend
from csa_conform.device.host.emulation import GUARD_BYTES, PAGE
from csa_conform.exitcodes import ExitCode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels_mutants"))
from mutants import MUTANTS  # noqa: E402

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
GUARDED = {mutant.name: mutant for mutant in MUTANTS if mutant.caught_by == "guard"}
PARAMETERS = ("source", "out", "count")


def _check(writes, args):
    return writes.check(args, entry="fake", module="fake_module", stages=("index_scoring", "selection"),
                        parameters=PARAMETERS)


@pytest.fixture
def writes(tmp_path):
    return GuardedWrites(HostEmulationBackend(tmp_path))


def test_every_buffer_has_a_band_of_its_own_byte_on_either_side(writes):
    buffers = (writes.empty((2, 3), np.float32), writes.full((5,), -1, np.int32), writes.upload(np.ones(3)),
               writes.empty((PAGE // 4,), np.float32))
    bytes_held = []
    for buffer in buffers:
        before, after, size = writes.guard_bands(buffer)
        assert size == buffer.array.nbytes
        assert before.size == GUARD_BYTES
        assert after.size >= GUARD_BYTES and (GUARD_BYTES + size + after.size) % PAGE == 0, "to the page's end"
        assert len(set(before.tolist()) | set(after.tolist())) == 1
        bytes_held.append(int(before[0]))
        assert buffer.address % GUARD_BYTES == 0
    # the step's buffers in the order it allocated them; an input is not the step's to check
    assert bytes_held == [BAND_BYTES[0], BAND_BYTES[1], GUARD_BYTE, BAND_BYTES[2]]


def test_no_two_buffers_of_a_step_share_a_band_byte(writes):
    held = {int(writes.guard_bands(writes.empty((1,), np.int32))[0][0]) for _ in BAND_BYTES}
    assert held == set(BAND_BYTES)
    assert not held & ({0x00, 0xFF} | set(determinism.POISON))


def test_one_buffers_band_copied_into_anothers_is_a_finding(writes):
    """One thread too many that reads one past the end of its source and writes one past the end of its
    output carries the source's band byte into the output's band: seen because the two bytes differ."""
    shared, out = writes.empty((4,), np.int32), writes.empty((4,), np.int32)
    out.allocation[GUARD_BYTES + 16: GUARD_BYTES + 20] = shared.allocation[GUARD_BYTES + 16: GUARD_BYTES + 20]
    [finding] = _check(writes, (shared, out, np.int32(4)))
    assert (finding.argument, finding.side, finding.changed, finding.first, finding.distance) == (1, AFTER, 4, 16, 4)
    assert _check(writes, (shared, out, np.int32(4))) == [], "restored to the output's own byte"


def test_a_repeat_runs_buffer_has_its_first_runs_band_byte(tmp_path):
    """Under --repeat a kernel reading a band reads the same bytes in every run: not non-deterministic."""
    writes = GuardedWrites(determinism.PoisonedScratch(HostEmulationBackend(tmp_path)))
    writes.empty((3,), np.float32), writes.full((2,), -1, np.int32)
    for index, fresh in enumerate(writes.take_fresh()):
        remade = writes.remake(fresh, determinism.POISON[1])
        before, after, _ = writes.guard_bands(remade)
        assert set(before.tolist()) | set(after.tolist()) == {BAND_BYTES[index]}
        assert (remade.array.view(np.uint8) == (determinism.POISON[1] if fresh.fill is None else 0xFF)).all()


_BEYOND_THE_BANDS = """
import ctypes, sys
import numpy as np
from csa_conform.device.host import HostEmulationBackend
from csa_conform.device.host.emulation import GUARD_BYTES
buffer = HostEmulationBackend(sys.argv[1]).empty((3,), np.float32)
after = buffer.allocation.size - GUARD_BYTES - buffer.array.nbytes
reach = {"after": buffer.address + buffer.array.nbytes + after, "before": buffer.address - GUARD_BYTES - 1,
         "last band byte": buffer.address + buffer.array.nbytes + after - 1}[sys.argv[2]]
ctypes.memset(reach, 0, 1)
print("written")
"""


@pytest.mark.parametrize("where, faults", [("after", True), ("before", True), ("last band byte", False)])
def test_a_write_beyond_the_bands_faults_where_it_is_made(where, faults, tmp_path):
    """Past a band lies an inaccessible page, not the heap: the write faults in the launch that makes it
    instead of corrupting the worker's memory for a later crash no case is blamed for."""
    run = subprocess.run([sys.executable, "-c", _BEYOND_THE_BANDS, str(tmp_path), where], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[2])
    if faults:
        assert run.returncode == -signal.SIGSEGV and "written" not in run.stdout, run.stderr[-2000:]
    else:
        assert run.returncode == 0 and run.stdout == "written\n", run.stderr[-2000:]


def test_an_untouched_band_is_no_finding(writes):
    source, out = writes.upload(np.arange(4, dtype=np.float32)), writes.empty((4,), np.float32)
    out.array[:] = source.array  # every byte of the buffer, none outside
    assert _check(writes, (source, out, np.int32(4))) == []


def test_a_write_past_the_end_names_the_argument_side_and_reach_and_the_band_is_restored(writes):
    out = writes.empty((4,), np.float32)
    out.allocation[GUARD_BYTES + 16 + 4: GUARD_BYTES + 16 + 8] = 0  # element 5: bytes 20..23, 4 to 8 past the end
    args = (writes.upload(np.zeros(4, np.float32)), out, np.int32(4))
    [finding] = _check(writes, args)
    assert (finding.argument, finding.name, finding.side, finding.size) == (1, "out", AFTER, 16)
    assert (finding.changed, finding.first, finding.reach, finding.distance) == (4, 20, 23, 8)
    assert finding.kind == "out-of-bounds" and finding.stages == ("index_scoring", "selection")
    assert finding.message == ("out-of-bounds write: fake_module.cu:fake wrote past the end of argument 1 (out), "
                               "a 16-byte buffer: 4 guard bytes changed, reaching 8 bytes past it, the first at "
                               "byte offset 20")
    assert finding.to_dict()["distance"] == 8 and finding.to_dict()["stages"] == ["index_scoring", "selection"]
    assert _check(writes, args) == [], "the band is restored: the next launch is not blamed"


def test_a_write_before_the_start_is_its_own_finding(writes):
    out = writes.full((2,), -1, np.int32)
    out.allocation[GUARD_BYTES - 4: GUARD_BYTES] = 0  # index -1
    out.allocation[GUARD_BYTES + 8] = 7  # and one byte just past the end
    findings = _check(writes, (writes.upload(np.zeros(1)), out, np.int32(2)))
    assert [(f.side, f.changed, f.first, f.reach, f.distance) for f in findings] == [
        (BEFORE, 4, -1, -4, 4), (AFTER, 1, 8, 8, 1)]
    assert "before the start of argument 1 (out)" in findings[0].message


def test_only_the_buffers_this_step_allocated_are_checked(writes, tmp_path):
    """An input (uploaded, on CUDA without a band) or another step's buffer is never read for a band."""
    other = HostEmulationBackend(tmp_path).empty((2,), np.float32)
    other.allocation[-1] = 0
    uploaded = writes.upload(np.zeros(2, np.float32))
    uploaded.allocation[0] = 0
    assert _check(writes, (uploaded, other, np.int32(2))) == []


def test_a_backend_without_bands_checks_nothing():
    class Bare:
        def empty(self, shape, dtype):
            return np.empty(shape, dtype)

    writes = GuardedWrites(Bare())
    assert _check(writes, (writes.empty((2,), np.float32),)) == []


@pytest.mark.usefixtures("emulated_cuda")
def test_the_builtin_kernels_write_inside_their_buffers(device_goldens):
    result = CliRunner().invoke(diff, [str(device_goldens), "--backend", "host", "--json"])
    assert result.exit_code == ExitCode.OK, result.output[-2000:]


@pytest.mark.usefixtures("emulated_cuda")
@pytest.mark.parametrize("name, side, reach", [("index_scores_written_past_the_scratch", AFTER, 4),
                                               ("index_scores_written_before_the_scratch", BEFORE, 4)])
def test_a_planted_write_outside_the_scratch_fails_the_case_with_its_finding(name, side, reach, device_goldens,
                                                                              tmp_path):
    mutant = GUARDED[name]
    kernels = mutant.apply(KERNELS, tmp_path / "kernels")
    args = [str(device_goldens), "--kernels", str(kernels), "--case", mutant.cases]
    result = CliRunner().invoke(diff, args + ["--json"])
    assert result.exit_code == ExitCode.DIVERGED, result.output[-2000:]
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    failing = [case for case in document["cases"] if not case["passed"]]
    assert failing
    for case in failing:
        assert {stage for stage, verdict in case["verdicts"].items() if verdict == "out-of-bounds"} == mutant.isolated
        assert "diverged" not in case["verdicts"].values()
        findings = [finding for step in case["steps"] for finding in step["findings"]]
        assert len(findings) == len(case["steps"]) >= 1, "one finding per step the launch ran in"
        for finding in findings:
            assert finding["type"] == "out-of-bounds" and finding["name"] == "scores" and finding["argument"] == 4
            assert (finding["side"], finding["distance"], finding["changed"]) == (side, reach, 4)
            assert finding["module"] == "csa_ratio4_index_select"
            assert "--stage index_query_finalize" in finding["reproduce"]
    text = CliRunner().invoke(diff, args)
    assert text.exit_code == ExitCode.DIVERGED
    assert " OOB " in text.output and "out-of-bounds write: csa_ratio4_index_select.cu:csa_ratio4_index_select" \
        in text.output


@pytest.mark.usefixtures("emulated_cuda")
def test_a_band_copied_from_the_shared_selection_into_the_replicas_fails_the_case(device_goldens, tmp_path):
    """The replicate kernel's bound off by one: its last thread copies the word past the shared selection (that
    buffer's band) to the word past selected_indices (this one's), where one band byte for all would hide it."""
    mutant = GUARDED["selection_replicated_one_past_the_end"]
    kernels = mutant.apply(KERNELS, tmp_path / "kernels")
    result = CliRunner().invoke(diff, [str(device_goldens), "--kernels", str(kernels), "--case", mutant.cases,
                                       "--json"])
    assert result.exit_code == ExitCode.DIVERGED, result.output[-2000:]
    cases = json.loads(result.stdout)["cases"]
    assert cases and not any(case["passed"] for case in cases)
    for case in cases:
        assert {stage for stage, verdict in case["verdicts"].items() if verdict != "identical"} == mutant.isolated
        [finding] = [finding for step in case["steps"] for finding in step["findings"]]
        assert (finding["name"], finding["argument"], finding["side"], finding["distance"]) == (
            "selected", 1, AFTER, 4)
