"""`diff --repeat N`: every launch re-run on fresh buffers poisoned with a different byte per run.

The bookkeeping is tested on a NumPy backend with launches that misbehave on purpose; the
whole command on the host emulation of the real kernels, clean and with a planted read of
never-written memory that a plain diff cannot see.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

from csa_conform.check.results import schema
from csa_conform.cli.diff import diff
from csa_conform.cli.report import report_command
from csa_conform.device.determinism import POISON, PoisonedScratch, repeat_launch
from csa_conform.device.host import HostEmulationBackend
from csa_conform.exitcodes import ExitCode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels_mutants"))
from mutants import MUTANTS  # noqa: E402

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
UNWRITTEN = next(mutant for mutant in MUTANTS if mutant.name == "output_blends_unwritten_contents")


def _scratch(tmp_path):
    return PoisonedScratch(HostEmulationBackend(tmp_path))


def _run(backend, body, runs, parameters=("source", "out", "count")):
    """One launch of ``body(source, out, count)`` (NumPy arrays) repeated ``runs`` times."""
    source = backend.upload(np.arange(8, dtype=np.float32))
    out = backend.empty((2, 4), np.float32)
    args = (source, out, np.int32(8))
    calls = []

    def launch(arguments):
        calls.append(arguments)
        body(arguments[0].array, arguments[1].array, int(arguments[2]))

    findings = repeat_launch(backend, launch, args, runs, entry="fake", module="fake_module", stages=("selection",),
                             parameters=parameters)
    return findings, calls, out


def test_a_deterministic_launch_has_no_finding_and_the_first_run_is_kept(tmp_path):
    def copy(source, out, count):
        out.reshape(-1)[:count] = source[:count]

    findings, calls, out = _run(_scratch(tmp_path), copy, 4)
    assert findings == [] and len(calls) == 4
    assert calls[0][1] is out and all(call[1] is not out for call in calls[1:])
    assert all(call[0] is calls[0][0] for call in calls), "inputs are not remade"
    assert out.array.reshape(-1).tolist() == list(range(8))


def test_every_run_gets_fresh_buffers_poisoned_with_its_own_byte(tmp_path):
    seen = []

    def look(source, out, count):
        seen.append(out.reshape(-1).view(np.uint8)[0])

    _run(_scratch(tmp_path), look, 5)
    assert seen == list(POISON[:5]) and 0 not in seen


def test_a_read_of_unwritten_memory_is_named_by_argument_and_first_element(tmp_path):
    def half(source, out, count):
        out.reshape(-1)[:5] = source[:5]

    findings, _, _ = _run(_scratch(tmp_path), half, 3)
    assert len(findings) == 1
    finding = findings[0]
    assert (finding.argument, finding.name, finding.runs, finding.differing_runs) == (1, "out", 3, 2)
    assert (finding.first_run, finding.element, finding.coords) == (2, 5, (1, 1))
    assert (finding.first_bits, finding.other_bits) == ("0xa5a5a5a5", "0xffffffff")
    assert finding.message == (
        "non-deterministic: 2 of 3 runs differ from run 1 in argument 1 (out) of fake; first at run 2, "
        "element 5 [1, 1]: run 1 0xa5a5a5a5, run 2 0xffffffff"
    )


def test_a_race_that_differs_in_one_run_only_is_counted_as_one(tmp_path):
    runs = iter(range(10))

    def racy(source, out, count):
        out.reshape(-1)[:] = source
        if next(runs) == 2:
            out.reshape(-1)[6] = -1.0

    findings, _, _ = _run(_scratch(tmp_path), racy, 5, parameters=())
    assert [(f.differing_runs, f.first_run, f.element, f.name) for f in findings] == [(1, 3, 6, "")]


def test_pre_filled_buffers_are_refilled_not_poisoned(tmp_path):
    backend = _scratch(tmp_path)
    filled = backend.full((4,), -np.inf, np.float32)
    seen = []

    def launch(arguments):
        seen.append(arguments[0].array.copy())

    assert repeat_launch(backend, launch, (filled,), 3, entry="e", module="m", stages=("selection",),
                         parameters=("scores",)) == []
    assert all(np.isneginf(array).all() for array in seen)


@pytest.mark.usefixtures("emulated_cuda")
def test_the_builtin_kernels_are_deterministic(device_goldens):
    result = CliRunner().invoke(diff, [str(device_goldens), "--repeat", "3", "--case", "boundaries.r*", "--json"])
    assert result.exit_code == ExitCode.OK, result.output[-3000:]
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    assert document["options"]["repeat"] == 3
    assert all(case["passed"] and not case["steps"] for case in document["cases"])


@pytest.mark.usefixtures("emulated_cuda")
def test_a_read_of_never_written_memory_is_its_own_verdict(device_goldens, tmp_path):
    kernels = UNWRITTEN.apply(KERNELS, tmp_path / "kernels")
    plain = CliRunner().invoke(diff, [str(device_goldens), "--kernels", str(kernels), "--case", UNWRITTEN.cases])
    assert plain.exit_code == ExitCode.OK, plain.output[-3000:]
    args = [str(device_goldens), "--kernels", str(kernels), "--case", UNWRITTEN.cases, "--repeat", "3"]
    table = CliRunner().invoke(diff, args)
    assert table.exit_code == ExitCode.DIVERGED
    assert "NDET" in table.output and "DIFF" not in table.output
    assert "ulp 0, every launch run 3 times" in table.output
    assert "non-deterministic: 1 of 3 runs differ from run 1 in argument 6 (output) of csa_ratio4_sink_attention" \
        in table.output
    assert "--repeat 3" in table.output
    result = CliRunner().invoke(diff, args + ["--json"])
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    case = document["cases"][0]
    assert case["verdicts"]["sparse_sink_softmax_attention"] == "non-deterministic"
    finding = case["steps"][0]["findings"][0]
    assert finding["type"] == "non-deterministic" and finding["name"] == "output" and finding["argument"] == 6
    assert finding["first_bits"] != finding["other_bits"] and "--repeat 3" in finding["reproduce"]
    (tmp_path / "ndet.json").write_text(result.stdout)
    junit = tmp_path / "junit.xml"
    CliRunner().invoke(report_command, [str(tmp_path / "ndet.json"), "--junit", str(junit)])
    assert 'type="non-deterministic"' in junit.read_text()

