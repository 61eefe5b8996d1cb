"""`diff --replay graph`: each step's launches replayed on a graph captured once per stream.

The host emulation has no CUDA graph; its backend stands in with what a graph does (the
captured launches re-issued with their captured arguments on the graph's own buffers), so the
capture, fit, in-place update, comparison and explanation are all tested here. The real
CuPy stream capture runs on a GPU (-m cuda).
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
from csa_conform.device.guards import BAND_BYTES, GUARD_BYTE, GuardedWrites
from csa_conform.device.host import HostEmulationBackend
from csa_conform.device.host.emulation import GUARD_BYTES
from csa_conform.device.recorder import LaunchRecorder
from csa_conform.device.replay import Replayer, fits
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import write_goldens
from csa_conform.golden.recipes import suite_recipes
from csa_conform.oracle import run_step

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels_mutants"))
from mutants import HOST_PATCHES, MUTANTS  # noqa: E402

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
BY_VALUE = next(mutant for mutant in MUTANTS if mutant.name == "r128_decode_length_by_value")


class DecodeBackend(HostEmulationBackend):
    """A backend whose one kernel, ``decode(cursor, out, length)``, writes out[i] = cursor[0] + i for i < length."""

    def launch(self, entry, function, grid, block, args) -> None:
        cursor, out, length = args
        out.array[:] = 0
        out.array[: int(length)] = cursor.array[0] + np.arange(int(length), dtype=np.float32)


class PeekBackend(HostEmulationBackend):
    """A backend whose one kernel, ``peek(source, out)``, copies the word just past the end of ``source``."""

    def launch(self, entry, function, grid, block, args) -> None:
        source, out = args
        end = GUARD_BYTES + source.array.nbytes
        out.array[:] = source.allocation[end: end + 4].view(np.float32)


def _decode_step(recorder: LaunchRecorder, cursor: float, length: int):
    """One step: the cursor uploaded, the output allocated, the kernel launched; the eager output."""
    cursor_buffer = recorder.upload(np.array([cursor], np.float32))
    out = recorder.empty((4,), np.float32)
    recorder.launch("decode", None, (1, 1, 1), (1, 1, 1), (cursor_buffer, out, np.int32(length)))
    return out


@pytest.fixture
def recorder(tmp_path):
    return LaunchRecorder(DecodeBackend(tmp_path))


def _replayer():
    return Replayer(lambda: {"decode": ("cursor", "out", "length")}, {"decode": ("sparse_sink_softmax_attention",)})


def test_a_device_cursor_replays_exactly_with_inputs_updated_in_place(recorder):
    replayer = _replayer()
    _decode_step(recorder, 10.0, 2)
    assert replayer.step(recorder, "case", 0) == []
    for step, cursor in enumerate((11.0, 12.0), start=1):
        _decode_step(recorder, cursor, 2)
        assert replayer.step(recorder, "case", step) == []
    assert replayer.describe() == {"mode": "graph", "captures": 1, "replayed_steps": 2}


def test_a_graphs_buffers_hold_the_eager_buffers_band_bytes(tmp_path):
    """A kernel reading past an end reads its buffer's own band byte (not the first one's) eagerly, and the
    same in the replay: no replay mismatch from the graph's own buffers."""
    recorder = LaunchRecorder(PeekBackend(tmp_path))
    replayer = Replayer(lambda: {"peek": ("source", "out")}, {"peek": ("selection",)})
    for step in range(2):
        writes = GuardedWrites(recorder)
        out, source = writes.empty((1,), np.float32), writes.full((2,), 1.0, np.float32)
        writes.launch("peek", None, (1, 1, 1), (1, 1, 1), (source, out))
        assert out.array.view(np.uint8).tolist() == [BAND_BYTES[1]] * 4 != [GUARD_BYTE] * 4
        assert replayer.step(recorder, "case", step) == []
    assert replayer.replayed_steps == 1


def test_a_by_value_length_is_named_as_frozen_at_capture(recorder):
    replayer = _replayer()
    _decode_step(recorder, 10.0, 2)
    replayer.step(recorder, "case", 0)
    _decode_step(recorder, 11.0, 3)
    [mismatch] = replayer.step(recorder, "case", 1)
    assert (mismatch.entry, mismatch.argument, mismatch.name, mismatch.element) == ("decode", 1, "out", 2)
    assert mismatch.message == (
        "replay differs from eager in argument 1 (out) of decode, first at element 2: eager 0x41500000, "
        "replay 0x00000000; argument 2 of decode (length) is passed by value and was frozen at capture "
        "(step 0: 2, this step: 3)"
    )


def test_a_new_stream_or_other_extents_capture_again(recorder):
    replayer = _replayer()
    _decode_step(recorder, 10.0, 2)
    replayer.step(recorder, "first", 0)
    _decode_step(recorder, 10.0, 2)
    replayer.step(recorder, "second", 0)
    assert replayer.describe()["captures"] == 2
    launches, _ = recorder.take_step()
    assert launches == []
    cursor = recorder.upload(np.array([1.0], np.float32))
    recorder.launch("decode", None, (1, 1, 1), (1, 1, 1), (cursor, recorder.empty((5,), np.float32), np.int32(1)))
    wider, _ = recorder.take_step()
    _decode_step(recorder, 1.0, 1)
    narrow, _ = recorder.take_step()
    assert not fits(wider, narrow) and fits(narrow, narrow)


def test_a_stream_keeps_one_graph_per_launch_shape(recorder):
    replayer = _replayer()
    for step, length in enumerate((2, 2, 3, 2, 3)):
        cursor = recorder.upload(np.array([float(step)], np.float32))
        out = recorder.empty((4 + length % 2,), np.float32)
        recorder.launch("decode", None, (1, 1, 1), (1, 1, 1), (cursor, out, np.int32(length)))
        assert replayer.step(recorder, "case", step) == []
    assert replayer.describe() == {"mode": "graph", "captures": 2, "replayed_steps": 3}


@pytest.fixture(scope="module")
def long_decodes(tmp_path_factory):
    """Two full-suite streams that decode 16 steps past a prefill on a full dense window."""
    recipes = {recipe.case_id: recipe for recipe in suite_recipes("full", case_glob="boundaries.*-decode-2*")}
    chosen = ("boundaries.r128-decode-250-to-266", "boundaries.r4-decode-200-to-216")
    path = tmp_path_factory.mktemp("long-decodes") / "decodes.h5"
    write_goldens(path, (recipes[case].generate(run_step) for case in chosen))
    return path


@pytest.mark.usefixtures("emulated_cuda")
def test_reserved_caches_let_one_graph_serve_every_decode_of_a_stream(long_decodes):
    """The record caches grow every 4 (or 128) tokens; reserved at the stream's capacity, they
    keep every extent the kernels get, so only the prefill and the first decode capture."""
    for mode in ("chained", "isolated"):  # isolated: every past cache comes from the file, padded
        result = CliRunner().invoke(diff, [str(long_decodes), "--replay", "graph", "--mode", mode, "--json"])
        assert result.exit_code == ExitCode.OK, result.output[-3000:]
        document = json.loads(result.stdout)
        assert document["kernels"]["replay"] == {"mode": "graph", "captures": 4, "replayed_steps": 30}
        [r128, r4] = document["cases"]
        assert r128["verdicts"]["compression_update"] == r4["verdicts"]["index_scoring"] == "identical"


@pytest.mark.usefixtures("emulated_cuda")
def test_the_builtin_kernels_replay_like_they_run(device_goldens):
    result = CliRunner().invoke(diff, [str(device_goldens), "--replay", "graph", "--json"])
    assert result.exit_code == ExitCode.OK, result.output[-3000:]
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    assert document["options"]["replay"] == "graph"
    replay = document["kernels"]["replay"]
    assert replay["mode"] == "graph" and replay["replayed_steps"] >= 1 and replay["captures"] >= 1


@pytest.mark.usefixtures("emulated_cuda")
def test_a_length_passed_by_value_is_caught_and_explained_by_replay_only(device_goldens, tmp_path, monkeypatch):
    kernels = BY_VALUE.apply(KERNELS, tmp_path / "kernels")
    HOST_PATCHES[BY_VALUE.host](monkeypatch)
    args = [str(device_goldens), "--kernels", str(kernels), "--case", BY_VALUE.cases]
    assert CliRunner().invoke(diff, args).exit_code == ExitCode.OK
    assert CliRunner().invoke(diff, args + ["--repeat", "3"]).exit_code == ExitCode.OK
    table = CliRunner().invoke(diff, args + ["--replay", "graph"])
    assert table.exit_code == ExitCode.DIVERGED
    assert "GRAPH" in table.output and "DIFF" not in table.output
    assert "ulp 0, replayed on a CUDA graph" in table.output
    assert ("argument 14 of csa_ratio128_compress (total_value) is passed by value and was frozen at capture "
            "(step 1: 257, this step: 258)") in table.output
    document = json.loads(CliRunner().invoke(diff, args + ["--replay", "graph", "--json"]).stdout)
    jsonschema.validate(document, schema())
    [case] = document["cases"]
    assert case["verdicts"]["compression_update"] == "replay-mismatch"
    [step] = case["steps"]
    assert step["step"] == 2 and {finding["type"] for finding in step["findings"]} == {"replay-mismatch"}
    assert step["findings"][0]["frozen"] == [{"entry": "csa_ratio128_compress", "argument": 14,
                                              "name": "total_value", "captured": 257, "current": 258}]


def test_repeat_and_replay_are_separate_runs(device_goldens):
    result = CliRunner().invoke(diff, [str(device_goldens), "--repeat", "2", "--replay", "graph"])
    assert result.exit_code == ExitCode.USAGE and "run them separately" in result.output
