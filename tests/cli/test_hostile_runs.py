"""Hostile runs: signals, a full disk, a target that appears mid-write, absurd --jobs, bad
result documents. Each ends in one line and a defined exit code, with nothing half-written."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from csa_conform.cli import main
from csa_conform.cli.common import exit_code_of, fan_out
from csa_conform.errors import UsageError, WorkerCrashed
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile, write_goldens

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "goldens" / "ci.h5"
SMALL = "boundaries.r4-decode-1-to-5"


def invoke(*args: str, input: bytes | None = None):
    return CliRunner().invoke(main, list(args), input=input)


def command(*args: str, preexec_fn=None, **options) -> subprocess.Popen:
    """The command in a child that sees Ctrl-C even when the test run does not.

    A job a shell starts in the background inherits SIGINT ignored, and Python keeps an inherited
    ignore (no KeyboardInterrupt), so the child restores the default before anything else.
    """
    def child_setup():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if preexec_fn is not None:
            preexec_fn()

    environment = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "csa_conform", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environment, preexec_fn=child_setup, **options)


def unnamed_files(folder: Path, pid: int) -> list[str]:
    """The files a process holds open in ``folder`` without a name (O_TMPFILE: '/folder/#inode (deleted)')."""
    found = []
    for link in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(link)
        except OSError:
            continue
        if target.startswith(f"{folder}/#") and target.endswith(" (deleted)"):
            found.append(target)
    return found


def wait_for_temporary(folder: Path, process: subprocess.Popen) -> None:
    """Until the process has its unnamed output open in ``folder`` (nothing there has a name)."""
    for _ in range(3_000):  # a minute of polls at most: a safety bound, never a verdict on speed
        if unnamed_files(folder, process.pid):
            return
        assert process.poll() is None, process.communicate()
        assert list(folder.iterdir()) == [], "a temporary became visible"
        time.sleep(0.02)
    pytest.fail("generate never started writing")


@pytest.mark.parametrize(
    "number, code, group, jobs",
    [
        (signal.SIGINT, ExitCode.INTERRUPTED, True, "1"),
        (signal.SIGINT, ExitCode.INTERRUPTED, True, "2"),
        (signal.SIGTERM, ExitCode.TERMINATED, False, "1"),
        (signal.SIGTERM, ExitCode.TERMINATED, False, "2"),
    ],
)
def test_a_signal_during_generate_removes_the_temporary_and_exits_128_plus_n(tmp_path, number, code, group, jobs):
    """Ctrl-C reaches the whole process group (workers too); SIGTERM the main process only."""
    process = command("generate", "--suite", "ci", "--jobs", jobs, "-o", str(tmp_path / "ci.h5"),
                      start_new_session=True)
    wait_for_temporary(tmp_path, process)
    time.sleep(0.3)
    (os.killpg if group else os.kill)(process.pid, number)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("csa-conform: error: ")
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    def small_file_limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    process = command("generate", "--case", SMALL, "-o", str(tmp_path / "out.h5"), preexec_fn=small_file_limit)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == ExitCode.ENVIRONMENT, stderr
    lines = [line for line in stderr.splitlines() if not line.startswith("generate [")]
    assert len(lines) == 1 and "cannot write" in lines[0] and "nothing written" in lines[0], stderr
    assert list(tmp_path.iterdir()) == []


def test_generate_without_force_keeps_a_file_that_appeared_meanwhile(tmp_path):
    path = tmp_path / "golden.h5"
    with GoldenFile(ROOT / "goldens" / "ci.h5") as golden:
        case = golden.read_case("errors.attr-causal-0")

    def cases():
        yield case
        path.write_bytes(b"someone else's file")

    with pytest.raises(UsageError, match="appeared while it was being written; pass --force"):
        write_goldens(path, cases())
    assert path.read_bytes() == b"someone else's file"
    assert list(tmp_path.iterdir()) == [path]


def test_jobs_are_capped_with_a_note(tmp_path):
    path = tmp_path / "small.h5"
    assert invoke("generate", "--case", "errors.attr-causal-*", "-o", str(path), "--jobs", "100000").exit_code == 0
    result = invoke("verify", str(path), "--jobs", "100000")
    assert result.exit_code == ExitCode.OK, result.output
    cap = 2 * (os.cpu_count() or 1)
    assert f"csa-conform: note: --jobs 100000 capped at {cap} (2 per core)" in result.stderr


@pytest.fixture(scope="module")
def verify_document(tmp_path_factory) -> dict:
    """A real results document: verify of two cases of the committed suite."""
    result = invoke("verify", str(COMMITTED), "--case", "seed-closed-form.r4-*", "--json")
    assert result.exit_code == ExitCode.OK, result.output
    return json.loads(result.stdout)


def edited(document: dict, edit) -> bytes:
    document = json.loads(json.dumps(document))
    edit(document)
    return json.dumps(document).encode()


def _set(path: str, value):
    def edit(document):
        *parents, last = path.split(".")
        for key in parents:
            document = document[int(key)] if isinstance(document, list) else document[key]
        if value is _DELETE:
            del document[last]
        else:
            document[last] = value
    return edit


_DELETE = object()


@pytest.mark.parametrize(
    "edit, message",
    [
        (_set("summary", _DELETE), "the document: 'summary' is a required property"),
        (_set("summary", [1]), "summary: [1] is not of type 'object'"),
        (_set("summary.cases", "2"), "summary/cases: '2' is not of type 'integer'"),
        (_set("cases", _DELETE), "the document: 'cases' is a required property"),
        (_set("cases", "x"), "cases: 'x' is not of type 'array'"),
        (_set("cases.0.passed", "yes"), "cases/0/passed: 'yes' is not of type 'boolean'"),
        (_set("summary.failed", 1), "summary does not count the cases it lists"),
        (_set("version", 3), "results version 3 was written by a newer csa-conform"),
        (_set("version", 0), "results version 0 is no version a csa-conform wrote"),
        (_set("version", "2"), "results version '2' is no version a csa-conform wrote"),
    ],
)
def test_report_refuses_malformed_result_documents_with_one_line(tmp_path, verify_document, edit, message):
    content = edited(verify_document, edit)
    path = tmp_path / "results.json"
    path.write_bytes(content)
    for source, stdin in ((str(path), None), ("-", content)):
        result = invoke("report", source, "--junit", str(tmp_path / "j.xml"), input=stdin)
        assert result.exit_code == ExitCode.USAGE, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "j.xml").exists()


def test_report_refuses_a_document_that_is_not_utf8(tmp_path):
    content = b'{"format": "csa-conform-results", "version": 2, \xff}'
    path = tmp_path / "results.json"
    path.write_bytes(content)
    for source, stdin in ((str(path), None), ("-", content)):
        result = invoke("report", source, "--junit", str(tmp_path / "j.xml"), input=stdin)
        assert result.exit_code == ExitCode.USAGE, result.output
        assert result.stderr.strip().splitlines() == [f"csa-conform: error: {source}: not UTF-8 text (byte {content.index(0xFF)})"]
    assert not (tmp_path / "j.xml").exists()


def test_a_worker_that_dies_is_one_error_not_a_broken_pool_traceback():
    with pytest.raises(WorkerCrashed, match="a worker process died"):
        list(fan_out(os._exit, [3, 4], 2))
    assert exit_code_of(WorkerCrashed("x")) == ExitCode.ENVIRONMENT


def test_worker_processes_share_the_cores_between_their_threads():
    cores = os.cpu_count() or 1
    assert list(fan_out(_threads, [0, 1, 2], 2)) == [max(1, cores // 2)] * 3
    assert list(fan_out(_threads, [0], 2)) == [cores], "one item runs in this process, on every core"
    assert _threads(0) == cores


def _threads(_item) -> int:
    from csa_conform.oracle.compiled.parallel import worker_count

    return worker_count()
