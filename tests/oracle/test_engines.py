"""The numba engine reproduces the numpy engine bit for bit: every stage payload,
every output and every rejection message, on every step of goldens/ci.h5 and
of the CPU reference's own sample in tests/reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from engine_pairs import assert_engines_agree, needs_numba
from reference_corpus import case_files, reference_file, step_inputs, step_prefixes

from csa_conform.cli import main
from csa_conform.errors import UsageError
from csa_conform.golden import GoldenFile
from csa_conform.oracle import run_step
from csa_conform.oracle.engine import ENGINE_VARIABLE, resolve_engine

CI_GOLDENS = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"
HOT_STAGES = ("index_scoring/scores", "sparse_sink_softmax_attention/scores", "sparse_sink_softmax_attention/Y")


def _ci_case_ids() -> list[str]:
    with GoldenFile(CI_GOLDENS) as golden:
        return golden.case_ids()


@needs_numba
def test_every_ci_golden_step_is_identical_on_both_engines():
    ran, rejected, hot = 0, 0, set()
    with GoldenFile(CI_GOLDENS) as golden:
        for case_id in golden.case_ids():
            info = golden.case_info(case_id)
            for index in range(info.step_count):
                step = golden.read_step(case_id, index)
                reference = assert_engines_agree(info.attrs, step.inputs, list(info.output_names))
                if reference[0] == "rejected":
                    rejected += 1
                    assert reference[1] == step.expect_error, (case_id, index)
                else:
                    ran += 1
                    hot.update(key for key in HOT_STAGES if key in reference[1])
    assert ran > 50 and rejected > 50 and hot == set(HOT_STAGES)


@needs_numba
@pytest.mark.parametrize("name", case_files())
def test_every_reference_sample_step_is_identical_on_both_engines(name):
    archive = reference_file(name)
    attrs = json.loads(str(archive["attrs_json"]))
    output_names = json.loads(str(archive["output_names_json"]))
    for prefix in step_prefixes(archive):
        assert_engines_agree(attrs, step_inputs(archive, prefix), output_names)


def test_engine_is_chosen_by_argument_then_environment(monkeypatch):
    monkeypatch.setenv(ENGINE_VARIABLE, "numpy")
    assert resolve_engine().name == "numpy"
    assert resolve_engine("auto").name in ("numpy", "numba")
    monkeypatch.delenv(ENGINE_VARIABLE)
    assert resolve_engine().name == ("numba" if _numba_importable() else "numpy")


def test_unknown_engine_is_a_usage_error(monkeypatch):
    with pytest.raises(UsageError, match=r"^engine 'fortran' is not an oracle engine: expected one of auto, numpy, numba$"):
        run_step({}, {}, [], engine="fortran")
    monkeypatch.setenv(ENGINE_VARIABLE, "fast")
    with pytest.raises(UsageError, match=r"^CSA_CONFORM_ENGINE 'fast' is not an oracle engine"):
        resolve_engine()


def test_numba_engine_without_numba_is_a_usage_error(monkeypatch):
    monkeypatch.setattr("csa_conform.oracle.engine.numba_available", lambda: False)
    assert resolve_engine("auto").name == "numpy"
    with pytest.raises(UsageError, match=r"needs the numba package"):
        resolve_engine("numba")


def _numba_importable() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


@needs_numba
def test_generate_writes_the_same_file_with_either_engine(tmp_path, monkeypatch):
    monkeypatch.setenv(ENGINE_VARIABLE, "auto")  # the user's default; --engine overrides it
    written = {}
    for engine in ("numpy", "numba"):
        path = tmp_path / f"{engine}.h5"
        result = CliRunner().invoke(
            main, ["generate", "--suite", "ci", "--case", "random.r4-bias-BNSC", "-o", str(path), "--engine", engine]
        )
        assert result.exit_code == 0, result.output
        written[engine] = path.read_bytes()
    assert written["numpy"] == written["numba"]


@pytest.mark.parametrize("command", ["verify", "gap"])
def test_a_commands_engine_reaches_every_oracle_run_as_an_argument(command, monkeypatch):
    from csa_conform.oracle import pipeline

    monkeypatch.setenv(ENGINE_VARIABLE, "fast")  # read by a run that is not handed the choice: it would fail
    chosen = []
    resolve = pipeline.resolve_engine
    monkeypatch.setattr(pipeline, "resolve_engine", lambda choice=None: chosen.append(choice) or resolve(choice))
    result = CliRunner().invoke(main, [command, str(CI_GOLDENS), "--case", "random.r4-n4-i3-k1", "--engine", "numpy"])
    assert result.exit_code == 0, result.output
    assert chosen and set(chosen) == {"numpy"}
    assert os.environ[ENGINE_VARIABLE] == "fast"


def test_a_bad_engine_variable_is_one_line_and_exit_2(monkeypatch):
    monkeypatch.setenv(ENGINE_VARIABLE, "fast")
    done = subprocess.run(
        [sys.executable, "-m", "csa_conform", "verify", str(CI_GOLDENS), "--case", "random.r4-n4-i3-k1"],
        capture_output=True, text=True,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "csa-conform: error: CSA_CONFORM_ENGINE 'fast' is not an oracle engine: expected one of auto, numpy, numba\n"
    )
