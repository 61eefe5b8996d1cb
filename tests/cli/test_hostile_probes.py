"""Hostile probes, round two: what a CI job, a container or another tool can do to a run.

Each probe checks the contract of specs/cli.md: the exit status is the verdict (a lost output
never turns a failure into 0), every refusal is one line with its documented code, nothing
half-written is ever left, and foreign-but-valid files read like the plain file.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import signal
import stat
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
import zlib
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import xmlschema
from click.testing import CliRunner
from foreign_layouts import LAYOUTS, rewrite_layout
from golden_edits import reseal
from work_counts import bytes_read

import csa_conform.golden.writer as golden_writer
from csa_conform._base import atomic
from csa_conform._base.terminal import escaped
from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile, write_goldens
from csa_conform.golden.validation import MAX_GROUP_DEPTH
from csa_conform.oracle.engine import numba_available

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "goldens" / "ci.h5"
SMALL = "boundaries.r4-prefill-3"
JUNIT_XSD = Path(__file__).with_name("junit.xsd")
PROVENANCE = {"suite": "ci", "suite_seed": 0, "selection": SMALL}


def invoke(*args: str, input: bytes | None = None):
    return CliRunner().invoke(main, [str(arg) for arg in args], input=input)


def run(*args: str, stdin=None, stdout=subprocess.PIPE, env: dict | None = None, preexec=None,
        timeout: float = 120, **options) -> subprocess.CompletedProcess:
    """csa-conform in a process of its own (descriptors, limits and signals are per process)."""
    environment = {key: value for key, value in os.environ.items() if key != "CSA_CONFORM_ENGINE"}
    environment.update({"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **(env or {})})
    return subprocess.run([sys.executable, "-m", "csa_conform", *map(str, args)], stdin=stdin, stdout=stdout,
                          stderr=subprocess.PIPE, env=environment, preexec_fn=preexec, timeout=timeout, **options)


def one_error_line(stderr: bytes | str) -> str:
    text = stderr.decode() if isinstance(stderr, bytes) else stderr
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.startswith("csa-conform: error: ")]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """One small case of the committed suite, sealed (all eight stages)."""
    path = tmp_path_factory.mktemp("small") / "small.h5"
    with GoldenFile(COMMITTED) as golden:
        write_goldens(path, [golden.read_case(SMALL)], provenance=PROVENANCE)
    return path


def _flip_output(cases) -> None:
    step = cases[SMALL].steps[0]
    step.outputs["Y"] = step.outputs["Y"].copy()
    step.outputs["Y"].reshape(-1).view(np.uint8)[0] ^= 1


@pytest.fixture(scope="module")
def bad(small, tmp_path_factory) -> Path:
    """The small file resealed with one output bit flipped: only replay can tell (verify exits 1)."""
    path = tmp_path_factory.mktemp("bad") / "bad.h5"
    path.write_bytes(small.read_bytes())
    reseal(path, _flip_output)
    return path


# --- 1. the exit status is the verdict, whatever happens to stdout ---------------------------


def _closed_stdout():
    os.close(1)


@pytest.mark.parametrize("verdict, expected", [("bad", ExitCode.DIVERGED), ("small", ExitCode.ENVIRONMENT)])
@pytest.mark.parametrize("where", ["/dev/full", "closed"])
def test_a_lost_stdout_keeps_a_failure_and_fails_a_pass_with_exit_4(request, verdict, expected, where):
    path = request.getfixturevalue(verdict)
    if where == "closed":
        done = run("verify", path, "--json", stdout=None, preexec=_closed_stdout)
    else:
        with open(where, "w") as full:
            done = run("verify", path, "--json", stdout=full)
    assert done.returncode == expected, done.stderr
    assert "cannot write to stdout" in one_error_line(done.stderr)


@pytest.mark.parametrize("verdict, expected", [("bad", ExitCode.DIVERGED), ("small", ExitCode.OK)])
def test_a_reader_that_goes_away_leaves_the_verdict(request, verdict, expected):
    """`verify --json | true`: the pipe breaks; a failure stays 1, a pass stays 0 (the reader chose to go)."""
    path = request.getfixturevalue(verdict)
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = f"{shlex.quote(sys.executable)} -m csa_conform verify {shlex.quote(str(path))} --json | true; " \
              'exit "${PIPESTATUS[0]}"'
    done = subprocess.run(["bash", "-c", command], env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == expected, done.stderr
    assert "Traceback" not in done.stderr


def test_a_document_redirected_to_a_file_is_whole_or_absent(tmp_path, bad):
    """A file size limit stops the write half-way: the file is cut back to nothing, the verdict stays 1."""
    target = tmp_path / "verify.json"

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))

    with open(target, "w") as handle:
        done = run("verify", bad, "--json", stdout=handle, preexec=small_files)
    assert done.returncode == ExitCode.DIVERGED, done.stderr
    assert "cannot write to stdout" in one_error_line(done.stderr)
    assert target.read_bytes() == b""


# --- 2. foreign files read with the plain file's verdict, in both engines ----------------------


@pytest.fixture(scope="module")
def foreign(small, bad, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("foreign")
    made = {}
    for name, layout in LAYOUTS.items():
        for verdict, source in (("pass", small), ("fail", bad)):
            target = folder / f"{name}-{verdict}.h5"
            rewrite_layout(source, target, layout)
            made[name, verdict] = target
    return made


@pytest.mark.parametrize("engine", ["numpy", "numba"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_foreign_layouts_get_the_plain_files_verdict(foreign, small, bad, layout, engine):
    if engine == "numba" and not numba_available():
        pytest.skip("numba is not installed (the fast extra)")
    for verdict, plain in (("pass", small), ("fail", bad)):
        expected = invoke("verify", plain, "--engine", engine, "--json")
        result = invoke("verify", foreign[layout, verdict], "--engine", engine, "--json")
        assert result.exit_code == expected.exit_code, result.output
        cases = [{key: value for key, value in case.items() if key not in ("time_s", "reproduce")}
                 for case in json.loads(result.stdout)["cases"]]
        plain_cases = [{key: value for key, value in case.items() if key not in ("time_s", "reproduce")}
                       for case in json.loads(expected.stdout)["cases"]]
        assert json.dumps(cases).replace(str(foreign[layout, verdict]), "F") == \
            json.dumps(plain_cases).replace(str(plain), "F")


def test_a_big_endian_file_reads_native_arrays(foreign, small):
    with GoldenFile(foreign["big-endian", "pass"]) as theirs, GoldenFile(small) as ours:
        step, plain = theirs.read_step(SMALL, 0), ours.read_step(SMALL, 0)
    for name, array in step.outputs.items():
        assert array.dtype.isnative and array.dtype == plain.outputs[name].dtype
        assert array.tobytes() == plain.outputs[name].tobytes()


# --- 3. CI containers: read-only package, unwritable HOME, memory limits -----------------------


def test_numba_without_a_writable_cache_folder_compiles_with_a_note(monkeypatch, tmp_path, capsys):
    compile_cache = pytest.importorskip("csa_conform.oracle.compiled.cache")
    compile_cache.kernel_cache.cache_clear()
    monkeypatch.setattr(compile_cache, "_numba_finds_a_place", lambda: False)
    monkeypatch.setattr(compile_cache.tempfile, "gettempdir", lambda: str(tmp_path / "missing" / "deeper"))
    try:
        assert compile_cache.kernel_cache() is False
    finally:
        compile_cache.kernel_cache.cache_clear()
    assert "numba has no writable cache folder" in capsys.readouterr().err


def test_a_cache_folder_that_cannot_take_a_kernel_costs_a_compile_not_the_run(tmp_path, small):
    """An empty cache folder under a 64 KiB file-size limit: every kernel numba saves is too large."""
    if not numba_available():
        pytest.skip("numba is not installed (the fast extra)")

    def small_file_limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    environment = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    done = subprocess.run([sys.executable, "-m", "csa_conform", "verify", str(small), "--engine", "numba"],
                          capture_output=True, text=True, env=environment, preexec_fn=small_file_limit, timeout=300)
    assert done.returncode == ExitCode.OK, done.stderr
    assert not list((tmp_path / "numba").rglob("*.tmp.*"))


def test_numba_cache_goes_to_a_private_folder_when_the_package_and_home_are_read_only(tmp_path, small):
    """A copy of the package on a read-only bind mount, HOME on it too (a CI image), NUMBA_CACHE_DIR unset."""
    if not numba_available():
        pytest.skip("numba is not installed (the fast extra)")
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -m (a private mount namespace) is not permitted here")
    image = tmp_path / "image"
    image.mkdir()
    subprocess.run(["cp", "-r", str(ROOT / "csa_conform"), str(image)], check=True)
    for cached in image.rglob("__pycache__"):
        subprocess.run(["rm", "-rf", str(cached)], check=True)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    script = (f"mount --bind {image} {image} && mount -o remount,ro,bind {image} && "
              f"HOME={image}/home TMPDIR={scratch} PYTHONPATH={image} NUMBA_CACHE_DIR= "
              f"{shlex.quote(sys.executable)} -m csa_conform verify {small} --engine numba")
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME", "CSA_CONFORM_ENGINE")}
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=environment,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == ExitCode.OK, done.stderr
    assert "Traceback" not in done.stderr
    assert list(scratch.glob("csa-conform-numba-*/*")), "the kernels were cached in the private folder"


def _address_space(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def test_under_a_tight_address_space_auto_is_numpy_and_numba_is_refused(small):
    if not numba_available():
        pytest.skip("numba is not installed (the fast extra)")
    assert run("verify", small, "-q", preexec=_address_space(600 << 20)).returncode == ExitCode.OK
    done = run("verify", small, "-q", "--engine", "numba", preexec=_address_space(600 << 20))
    assert done.returncode == ExitCode.ENVIRONMENT
    line = one_error_line(done.stderr)
    assert "needs about 1.00 GiB of address space" in line and "ulimit -v" in line


@pytest.fixture(scope="module")
def huge_declared(small, tmp_path_factory) -> Path:
    """A schema 1 file (no case digests) whose one stage payload declares 1.6 GB in 2 MB of gzip, within
    what the case's geometry (64 index heads) allows."""
    path = tmp_path_factory.mktemp("huge") / "huge.h5"
    path.write_bytes(small.read_bytes())
    chunk, chunks = 1 << 20, 381
    elements = chunks * chunk
    packed = zlib.compress(bytes(4 * chunk), 9)
    with h5py.File(path, "r+") as handle:
        for name in ("manifest_sha256",):
            del handle.attrs[name]
        handle.attrs["schema_version"] = np.int64(1)
        case = handle[f"cases/{SMALL}"]
        del case.attrs["case_sha256"]
        attrs = json.loads(case.attrs["attrs_json"])
        case.attrs["attrs_json"] = json.dumps({**attrs, "index_num_heads": 64})  # a geometry that allows it
        stage = case["steps/0000/stages/index_scoring"]
        name = next(iter(stage))
        del stage[name]
        dataset = stage.create_dataset(name, shape=(elements,), dtype=np.float32, chunks=(chunk,),
                                       compression="gzip")
        for index in range(chunks):
            dataset.id.write_direct_chunk((index * chunk,), packed)
        dataset.attrs["sha256"] = "0" * 64
    assert path.stat().st_size < 4 << 20
    return path


def test_a_dataset_larger_than_the_memory_limit_is_the_limit_not_corruption(huge_declared):
    done = run("verify", huge_declared, "-q", preexec=_address_space(1 << 30))
    assert done.returncode == ExitCode.ENVIRONMENT, done.stderr
    line = one_error_line(done.stderr)
    assert "needs 1.49 GiB" in line and "address-space limit" in line, line


# --- 4. report on hostile documents -----------------------------------------------------------


@pytest.fixture(scope="module")
def document(bad) -> dict:
    result = invoke("verify", bad, "--json")
    assert result.exit_code == ExitCode.DIVERGED
    return json.loads(result.stdout)


def _with(document: dict, **changes) -> str:
    edited = json.loads(json.dumps(document))
    for key, value in changes.items():
        edited["options"][key] = value
    return json.dumps(edited)


HOSTILE_TEXTS = {
    "100,000-level nesting": lambda document: "[" * 100_000 + "]" * 100_000,
    "5,000-digit integer": lambda document: '{"format": "csa-conform-results", "version": ' + "9" * 5000 + "}",
    "an integer beyond int64": lambda document: json.dumps(document).replace('"exit_code": 1', '"exit_code": ' + str(2**64)),
    "NaN": lambda document: json.dumps(document).replace('"time_s": ', '"time_s": NaN, "x": ', 1),
    "1e999": lambda document: json.dumps(document).replace('"exit_code": 1', '"exit_code": 1e999'),
    "shard 1/10^12": lambda document: _with(document, shard="1/10^12"),
    "shard 1/1000000000000": lambda document: _with(document, shard="1/1000000000000"),
    "shard with a superscript digit": lambda document: _with(document, shard="\u00b2/2"),
    "shard with Arabic-Indic digits": lambda document: _with(document, shard="\u0661/\u0662"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TEXTS))
def test_report_refuses_hostile_documents_with_one_line(tmp_path, document, name):
    source = tmp_path / "results.json"
    source.write_text(HOSTILE_TEXTS[name](document))
    junit = tmp_path / "junit.xml"
    result = invoke("report", source, "--junit", junit)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    one_error_line(result.stderr)
    assert not junit.exists()


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "folder"])
def test_report_refuses_special_files_without_reading_them(tmp_path, special):
    if special == "fifo":
        os.mkfifo(tmp_path / "fifo")
        special = tmp_path / "fifo"
    elif special == "folder":
        special = tmp_path
    result, read = bytes_read(lambda: invoke("report", special, "--junit", tmp_path / "junit.xml"))
    assert result.exit_code == ExitCode.USAGE
    line = one_error_line(result.stderr)
    assert "not a regular file" in line or "is a directory" in line, line
    assert read < 1 << 20, read  # refused by what it is, not after reading /dev/zero's endless zeros


def test_report_of_stdin_when_stdin_is_closed_is_one_line(tmp_path, document):
    done = run("report", "-", "--junit", tmp_path / "junit.xml", preexec=lambda: os.close(0))
    assert done.returncode == ExitCode.USAGE
    assert "stdin is closed" in one_error_line(done.stderr)


def test_report_of_an_endless_stdin_stops_at_its_bound(tmp_path):
    with open("/dev/zero", "rb") as zeros:
        done = run("report", "-", "--junit", tmp_path / "junit.xml", stdin=zeros, timeout=120)
    assert done.returncode == ExitCode.USAGE
    assert "larger than" in one_error_line(done.stderr)


CONTROLS = "\x00\x07\x1b[31m\x7f\x85\x9b\ud800\ufffe"


def test_junit_stays_well_formed_and_valid_whatever_the_ids_and_messages_hold(tmp_path, document):
    hostile = json.loads(json.dumps(document))
    hostile["cases"][0]["case"] = f"case{CONTROLS}"
    tensor = hostile["cases"][0]["steps"][0]["stages"][0]["tensors"][0]
    tensor["message"] = f"message{CONTROLS}"
    hostile["cases"][0]["time_s"] = 1e308
    hostile["summary"]["time_s"] = 1e308
    (tmp_path / "results.json").write_text(json.dumps(hostile))
    twice = json.loads(json.dumps(hostile))
    twice["golden"]["path"] = "elsewhere.h5"
    (tmp_path / "again.json").write_text(json.dumps(twice))
    junit = tmp_path / "junit.xml"
    result = invoke("report", tmp_path / "results.json", tmp_path / "again.json", "--junit", junit)
    assert result.exit_code == ExitCode.OK, result.output
    tree = ElementTree.parse(junit)
    names = [case.get("name") for case in tree.iter("testcase")]
    assert names[0] == "case\\x00\\x07\\x1b[31m\\x7f\\x85\\x9b\\ud800\\ufffe"
    xmlschema.XMLSchema(JUNIT_XSD).validate(junit)
    assert all(float(suite.get("time")) >= 0 for suite in tree.iter("testsuite"))


@pytest.mark.parametrize("option", ["--junit", "--json", "--merged"])
@pytest.mark.parametrize("target", ["fifo", "/dev/null"])
def test_report_refuses_to_write_over_a_special_file(tmp_path, document, option, target):
    (tmp_path / "results.json").write_text(json.dumps(document))
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo")
        target = tmp_path / "fifo"
    result = invoke("report", tmp_path / "results.json", option, target)
    assert result.exit_code == ExitCode.USAGE
    assert "is not a regular file" in one_error_line(result.stderr)
    if target != "/dev/null":
        assert stat.S_ISFIFO(os.stat(target).st_mode)


def test_report_under_a_full_disk_leaves_no_file(tmp_path, document):
    (tmp_path / "results.json").write_text(json.dumps(document))

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))

    done = run("report", tmp_path / "results.json", "--junit", tmp_path / "junit.xml", preexec=small_files)
    assert done.returncode == ExitCode.ENVIRONMENT, done.stderr
    assert "nothing written" in one_error_line(done.stderr)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["results.json"]


# --- 5. case ids: exact reproduce commands, no raw controls, one line per failure --------------


HOSTILE_IDS = {
    "glob": "odd*[id]?",
    "ansi": "x\x1b[2J\x1b[31mred",
    "c1": "csi\x9b31m",
    "newline": "two\nlines",
}


@pytest.fixture(scope="module")
def hostile_ids(small, tmp_path_factory) -> Path:
    """The small case under every hostile id, one output flipped, plus a passing decoy the glob id matches."""
    path = tmp_path_factory.mktemp("ids") / "ids.h5"
    with GoldenFile(small) as golden:
        case = golden.read_case(SMALL)
    cases = []
    for case_id in HOSTILE_IDS.values():
        renamed = replace(case, case_id=case_id, steps=[replace(step, outputs=dict(step.outputs))
                                                        for step in case.steps])
        _flip_output({SMALL: renamed})
        cases.append(renamed)
    cases.append(replace(case, case_id="oddXidY"))
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(golden_writer, "_check_case_id", lambda case_id: None)  # another tool's writer
        write_goldens(path, cases, provenance=PROVENANCE)
    return path


def _words(command: str) -> list[str]:
    """A reproduce command split as bash splits it ($'...' included)."""
    done = subprocess.run(["bash", "-c", f"printf '%s\\0' {command}"], capture_output=True, check=True)
    return done.stdout.decode().split("\0")[:-1]


@pytest.mark.parametrize("name", sorted(HOSTILE_IDS))
def test_a_reproduce_command_selects_exactly_its_case(hostile_ids, name):
    case_id = HOSTILE_IDS[name]
    result = invoke("verify", hostile_ids, "--json")
    assert result.exit_code == ExitCode.DIVERGED
    entry = next(case for case in json.loads(result.stdout)["cases"] if case["case"] == case_id)
    assert entry["reproduce"].isprintable()
    words = _words(entry["reproduce"])
    assert words[:2] == ["csa-conform", "verify"]
    again = invoke(*words[1:], "--json")
    assert again.exit_code == ExitCode.DIVERGED, (words, again.output)
    assert [case["case"] for case in json.loads(again.stdout)["cases"]] == [case_id]


def test_failure_lines_are_one_line_each_with_controls_escaped(hostile_ids):
    result = invoke("verify", hostile_ids)
    assert result.exit_code == ExitCode.DIVERGED
    lines = result.stdout.splitlines()
    failing = [line for line in lines if line.startswith("FAIL ")]
    assert len(failing) == len(HOSTILE_IDS)
    for case_id in HOSTILE_IDS.values():
        assert sum(line.startswith(f"FAIL {escaped(case_id)} ") and " — reproduce: " in line for line in failing) == 1
    assert not any(character in result.stdout for character in "\x1b\x9b")
    listing = invoke("inspect", hostile_ids)
    assert listing.exit_code == ExitCode.OK
    assert not any(character in listing.stdout for character in "\x1b\x9b")
    assert len(listing.stdout.splitlines()) == 3 + len(HOSTILE_IDS) + 1


# --- 6. semantics and structure -----------------------------------------------------------------


def _attrs(**changes):
    def edit(cases):
        for case in cases.values():
            case.attrs = {**case.attrs, **changes}
    return edit


def _description(text: str):
    def edit(cases):
        for case in cases.values():
            case.description = text
    return edit


INVALID_INPUT = {
    "index_topk 2^63": (_attrs(index_topk=2**63), "outside int64"),
    "index_topk -2^63-1": (_attrs(index_topk=-(2**63) - 1), "outside int64"),
    "index_topk 1e30": (_attrs(index_topk=1e30), "outside int64"),
    "description 1.4 MB of UTF-8": (_description("\u00e9" * 700_000), "longer than 1048576 bytes"),
}


@pytest.mark.parametrize("name", sorted(INVALID_INPUT))
def test_attributes_outside_their_bounds_are_invalid_input(tmp_path, small, name):
    edit, message = INVALID_INPUT[name]
    path = tmp_path / "edited.h5"
    path.write_bytes(small.read_bytes())
    reseal(path, edit)
    result = invoke("inspect", path, SMALL)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert message in one_error_line(result.stderr)
    # verify judges each case on its own: this one is `invalid`, with the reason, among the verdicts
    result = invoke("verify", path)
    assert result.exit_code == ExitCode.USAGE and result.stderr == "", result.output
    invalid = [line for line in result.stdout.splitlines() if line.startswith(f"INVALID {SMALL}: ")]
    assert len(invalid) == 1 and message in invalid[0]


def test_a_nan_attribute_is_the_references_rejection_and_inspect_json_stays_standard(tmp_path, small):
    path = tmp_path / "nan.h5"
    path.write_bytes(small.read_bytes())
    reseal(path, _attrs(scale=float("nan")))
    verified = invoke("verify", path, "-q")
    assert verified.exit_code == ExitCode.DIVERGED and "scale must be finite" in verified.stdout
    for args in ((path,), (path, SMALL)):
        shown = invoke("inspect", *args, "--json")
        assert shown.exit_code == ExitCode.OK
        json.loads(shown.stdout, parse_constant=lambda name: pytest.fail(f"{name} is not standard JSON"))


def objects_opened(call):
    """What ``call`` returned and how many HDF5 objects it opened meanwhile (h5py.h5o.open, which every
    walk of a file's groups goes through): the work of a walk, counted."""
    real, opened = h5py.h5o.open, 0

    def counting(*args, **kwargs):
        nonlocal opened
        opened += 1
        return real(*args, **kwargs)

    h5py.h5o.open = counting
    try:
        return call(), opened
    finally:
        h5py.h5o.open = real


def test_a_group_20000_levels_deep_is_refused_at_once(tmp_path, small):
    with h5py.File(small) as handle:
        small_objects = 0

        def count(name, item):
            nonlocal small_objects
            small_objects += 1

        handle.visititems(count)
    path = tmp_path / "deep.h5"
    path.write_bytes(small.read_bytes())
    with h5py.File(path, "r+") as handle:
        group = handle.create_group("unused")
        for _ in range(20_000):
            group = group.create_group("g")
    for command in ("verify", "inspect"):
        result, opened = objects_opened(lambda: invoke(command, path))
        assert result.exit_code == ExitCode.USAGE
        assert "nested deeper than" in one_error_line(result.stderr)
        assert opened <= small_objects + MAX_GROUP_DEPTH + 1, opened  # the chain walked to the bound only


def test_a_sparse_hole_to_one_tebibyte_is_refused_at_once(tmp_path, small):
    path = tmp_path / "hole.h5"
    path.write_bytes(small.read_bytes())
    os.truncate(path, 1 << 40)
    for command in ("verify", "inspect"):
        result, read = bytes_read(lambda: invoke(command, path))
        assert result.exit_code == ExitCode.USAGE
        assert "follow the end of its HDF5 data" in one_error_line(result.stderr)
        assert read < 64 << 20, read  # not the tebibyte of zeros


# --- 7. nothing half-written, even after SIGKILL ------------------------------------------------


def test_sigkill_mid_write_leaves_nothing_visible(tmp_path):
    from test_hostile_runs import command, wait_for_temporary

    process = command("generate", "--suite", "ci", "-o", str(tmp_path / "ci.h5"), start_new_session=True)
    wait_for_temporary(tmp_path, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    assert list(tmp_path.iterdir()) == []


def test_without_o_tmpfile_a_killed_writers_temporary_is_removed_by_the_next_write(tmp_path, monkeypatch):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"{atomic.TEMPORARY_PREFIX}{dead.pid}-0badf00d.tmp"
    stale.write_bytes(b"half")
    someone_elses = tmp_path / ".other.tmp"
    someone_elses.write_bytes(b"theirs")
    monkeypatch.delattr(atomic.os, "O_TMPFILE", raising=False)
    atomic.write_atomically(tmp_path / "out.json", b"{}\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == [".other.tmp", "out.json"]


@pytest.mark.parametrize("replace", [False, True])
def test_a_253_character_target_name_is_written(tmp_path, replace):
    target = tmp_path / ("n" * 248 + ".json")
    if replace:
        target.write_bytes(b"old")
    atomic.write_atomically(target, b"new", replace=replace)
    assert target.read_bytes() == b"new"
    assert sorted(tmp_path.iterdir()) == [target]


@pytest.mark.parametrize("target", ["fifo", "/dev/null"])
def test_generate_refuses_a_special_target_even_with_force(tmp_path, target):
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo")
        target = tmp_path / "fifo"
    result = invoke("generate", "--case", "errors.attr-causal-0", "-o", target, "--force")
    assert result.exit_code == ExitCode.USAGE
    assert "is not a regular file" in one_error_line(result.stderr)


@pytest.mark.parametrize(
    "args, environment",
    [
        (["--shard", "\u00b2/2"], {}),
        (["--shard", "1/" + "9" * 5000], {}),
        ([], {"CSA_CONFORM_SHARD": "\u00b2/2"}),
        ([], {"CI_NODE_INDEX": "\u0661", "CI_NODE_TOTAL": "2"}),
        (["--devices", "\u00b2"], {}),
        (["--devices", "0," + "9" * 5000], {}),
    ],
)
def test_non_ascii_or_huge_shards_and_devices_are_usage_errors(small, monkeypatch, args, environment):
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    result = invoke("diff", small, "--force-host", "all", *args)
    assert result.exit_code == ExitCode.USAGE, result.output
    one_error_line(result.stderr)


def _children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


@pytest.mark.parametrize("number, code, group", [(signal.SIGINT, ExitCode.INTERRUPTED, True),
                                                  (signal.SIGTERM, ExitCode.TERMINATED, False)])
@pytest.mark.parametrize("delay", [0.0, 1.0])
def test_a_signal_during_verify_jobs_is_one_line_and_128_plus_n(number, code, group, delay):
    """As the workers start (the first one forked) or once they are busy: no worker prints a traceback."""
    from test_hostile_runs import command

    process = command("verify", str(COMMITTED), "--jobs", "2", "-q", start_new_session=True)
    for _ in range(12_000):  # a minute of polls at most: a safety bound, never a verdict on speed
        if _children(process.pid):
            break
        assert process.poll() is None, process.communicate()
        time.sleep(0.005)
    else:
        pytest.fail("verify --jobs 2 started no worker")
    time.sleep(delay)
    (os.killpg if group else os.kill)(process.pid, number)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == code, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert [line for line in stderr.splitlines() if line.strip()] == \
        [f"csa-conform: error: {'interrupted' if number == signal.SIGINT else 'terminated'}"]


def test_a_remembered_ctrl_c_that_python_swallowed_is_not_printed_but_anything_else_is(monkeypatch):
    """A Ctrl-C landing in a weakref callback as the --jobs pool shuts down is printed by Python as
    "Exception ignored ... Traceback" (the flake of the test above); the run's own line says it already."""
    import csa_conform.__main__ as entry

    printed = []
    monkeypatch.setattr(sys, "__unraisablehook__", printed.append)
    monkeypatch.setattr(entry._interrupted, "remembered", [])
    swallowed = SimpleNamespace(exc_type=KeyboardInterrupt)
    entry._unraisable(swallowed)
    assert printed == [swallowed]  # a KeyboardInterrupt no handler saw is still printed
    monkeypatch.setattr(entry._interrupted, "remembered", [signal.SIGINT])
    entry._unraisable(swallowed)
    other = SimpleNamespace(exc_type=ValueError)
    entry._unraisable(other)
    assert printed == [swallowed, other]


def test_jobs_are_capped_by_the_memory_the_workers_share(monkeypatch, capsys):
    from csa_conform.cli import common

    monkeypatch.setattr(common, "shared_headroom", lambda: (3 * common.WORKER_BYTES // 2, "cgroup memory limit of 1 GiB"))
    assert common.capped_jobs(2) == 1
    assert "--jobs 2 capped at 1: each worker is budgeted 512.0 MiB and the cgroup memory limit" in \
        capsys.readouterr().err
    monkeypatch.setattr(common, "shared_headroom", lambda: None)
    assert common.capped_jobs(2) == 2


@pytest.mark.parametrize("megabytes", [40, 100, 170, 260, 420])
def test_any_address_space_limit_is_a_verdict_or_exit_4_never_a_crash(small, megabytes):
    """From too small to load numpy to enough for the numpy engine: 0, or exit 4 with one line."""
    done = run("verify", small, "-q", preexec=_address_space(megabytes << 20))
    assert done.returncode in (ExitCode.OK, ExitCode.ENVIRONMENT), done.stderr
    if done.returncode == ExitCode.ENVIRONMENT:
        line = one_error_line(done.stderr)
        assert "ulimit -v" in line, line


def test_a_file_name_with_controls_is_escaped_in_text_and_exact_in_json(tmp_path, bad):
    path = tmp_path / "golden\x1b[31m\x9b.h5"
    path.write_bytes(bad.read_bytes())
    text = invoke("verify", path)
    assert text.exit_code == ExitCode.DIVERGED
    assert not any(character in text.output for character in "\x1b\x9b")
    document = json.loads(invoke("verify", path, "--json").stdout)
    assert document["golden"]["path"] == str(path)
    assert _words(document["cases"][0]["reproduce"])[2] == str(path)
