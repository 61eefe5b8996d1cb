"""verify --jobs 1 reads each case while the one before it replays: what each case reports, and
when a case is read ahead at all, stay what verifying the cases one after another gives."""

from __future__ import annotations

import threading

import h5py
import pytest
from click.testing import CliRunner

from csa_conform.check.verify import verify_case
from csa_conform.cli import main
from csa_conform.errors import MemoryShortage
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile
from csa_conform.golden.validation import CheckedFile

FIRST, SECOND = "boundaries.r4-prefill-3", "boundaries.r4-prefill-4"


@pytest.fixture(autouse=True)
def threaded(monkeypatch):
    """These cases are small; read them as a large case is read (on threads, the next one ahead)."""
    monkeypatch.setattr("csa_conform.golden.reader.THREADED_CASE_BYTES", 0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("ahead") / "pair.h5"
    result = CliRunner().invoke(main, ["generate", "--case", "boundaries.r4-prefill-[34]", "-o", str(path), "-q"])
    assert result.exit_code == 0, result.output
    with GoldenFile(path) as golden:
        assert golden.case_ids() == [FIRST, SECOND]
    return path


def read_behind(path, monkeypatch) -> list[str]:
    """The datasets read behind the caller while the first case is verified with the second to follow."""
    names, original = [], CheckedFile.read_unchecked

    def recording(self, entry, dataset):
        if threading.current_thread() is not threading.main_thread():
            names.append(dataset.name)
        return original(self, entry, dataset)

    monkeypatch.setattr(CheckedFile, "read_unchecked", recording)
    with GoldenFile(path) as golden:
        assert verify_case(golden, FIRST, then=SECOND).passed
        return list(names)


def test_the_next_case_is_read_while_the_first_replays_only_when_memory_allows(pair, monkeypatch):
    assert any(f"/cases/{SECOND}/" in name for name in read_behind(pair, monkeypatch))
    monkeypatch.undo()
    monkeypatch.setattr("csa_conform.golden.reader.THREADED_CASE_BYTES", 0)
    monkeypatch.setattr("csa_conform.golden.reader.headroom", lambda: (1 << 10, "a test's limit"))
    assert not any(f"/cases/{SECOND}/" in name for name in read_behind(pair, monkeypatch))


def test_a_small_case_is_read_in_the_callers_thread_and_not_ahead(pair, monkeypatch):
    monkeypatch.undo()
    assert read_behind(pair, monkeypatch) == []


def test_a_damaged_case_read_ahead_is_reported_in_its_turn_and_only_there(pair, tmp_path):
    copy = tmp_path / "copy.h5"
    copy.write_bytes(pair.read_bytes())
    damaged = f"/cases/{SECOND}/steps/0000/inputs/query"
    with h5py.File(copy, "r+") as handle:
        handle[damaged][0, 0, 0, 0] = 9.0
    result = CliRunner().invoke(main, ["verify", str(copy)])
    assert result.exit_code == ExitCode.DIVERGED, result.output
    fails = [line for line in result.stdout.splitlines() if line.startswith("FAIL ")]
    assert len(fails) == 1 and fails[0].startswith(f"FAIL {SECOND}: corrupt dataset {damaged}: sha256 mismatch"), fails
    assert "verified" not in result.stdout and "1/2 cases passed" in result.stdout


def test_a_case_read_ahead_short_of_memory_is_read_again_in_its_turn(pair, monkeypatch):
    """The memory the case before held may be what a read ahead lacked; in its own turn there is room."""
    original, short = CheckedFile.read_unchecked, []

    def failing_ahead(self, entry, dataset):
        if f"/cases/{SECOND}/" in dataset.name and threading.current_thread() is not threading.main_thread():
            short.append(dataset.name)
            raise MemoryShortage(f"{dataset.name} needs more than a test's limit")
        return original(self, entry, dataset)

    monkeypatch.setattr(CheckedFile, "read_unchecked", failing_ahead)
    with GoldenFile(pair) as golden:
        assert verify_case(golden, FIRST, then=SECOND).passed
        assert verify_case(golden, SECOND).passed
    assert short
