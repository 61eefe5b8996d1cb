"""Malformed and tampered golden files: exit 2 (unreadable) or exit 1 (altered, naming the object) from
every command; never a traceback, never a silent pass. What makes the file unreadable is one stderr line;
what makes one case unreadable is that case's `invalid` verdict among the others (verify, diff), its
one-line reason on stdout (tests/cli/test_invalid_cases.py)."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

import csa_conform
from csa_conform.check.verify import stream_break, verify_case, verify_case_in
from csa_conform.cli import main
from csa_conform.errors import GoldenChanged
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenCase, GoldenFile, GoldenStep, write_goldens
from work_counts import bytes_read, lines_run

STREAM = "boundaries.r4-decode-1-to-5"
STEP = f"/cases/{STREAM}/steps/0001"


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def refused(result, code: ExitCode, *fragments: str) -> str:
    """The one stderr line of a refused command (exit ``code``), which must contain ``fragments``."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def invalid(result, command: str, *fragments: str) -> str:
    """The verdict line of a case that cannot be read (exit 2): one stdout line, none on stderr, for the
    commands that judge each case on its own; the one stderr line of ``refused`` for the others."""
    if command not in ("verify", "diff"):
        return refused(result, ExitCode.USAGE, *fragments)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.stderr.strip() == "" or result.stderr.startswith("CONTROL RUN"), result.stderr
    prefix = f"INVALID {STREAM}: " if command == "verify" else f"{STREAM}: invalid: "
    lines = [line for line in result.stdout.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, result.stdout
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def failed(result, *fragments: str) -> str:
    """The FAIL line of a verify run that found an altered object (exit 1)."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == ExitCode.DIVERGED, result.output
    fails = [line for line in result.stdout.splitlines() if line.startswith("FAIL ")]
    assert fails, result.output
    for fragment in fragments:
        assert fragment in fails[0], fails[0]
    return fails[0]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile") / "stream.h5"
    assert invoke("generate", "--case", STREAM, "-o", str(path)).exit_code == 0
    return path


@pytest.fixture
def copy(stream, tmp_path):
    path = tmp_path / "copy.h5"
    path.write_bytes(stream.read_bytes())
    return path


@pytest.fixture(params=["in turn", "on threads"])
def reading(request, monkeypatch):
    """Both ways a case is read: a small one in the caller's thread, a large one on threads."""
    if request.param == "on threads":
        monkeypatch.setattr("csa_conform.golden.reader.THREADED_CASE_BYTES", 0)


def edit(path, change) -> None:
    with h5py.File(path, "r+") as handle:
        change(handle)


def set_attr(obj: str, name: str, value):
    def change(handle):
        handle[obj].attrs[name] = value

    return change


# --- exit 2: the file cannot be read as a golden file ----------------------------------------

UNREADABLE = {
    "attrs_json is a JSON list": (set_attr(f"/cases/{STREAM}", "attrs_json", "[1, 2]"), "attrs_json must be an object"),
    "attrs_json is not UTF-8": (set_attr(f"/cases/{STREAM}", "attrs_json", np.bytes_(b"{\xff}")), "not UTF-8"),
    "attrs_json nested 100k deep": (set_attr(f"/cases/{STREAM}", "attrs_json", "[" * 100_000), "not JSON"),
    "output_names_json is null": (set_attr(f"/cases/{STREAM}", "output_names_json", "null"), "list of strings"),
    "sha256 is not UTF-8": (set_attr(f"{STEP}/inputs/query", "sha256", np.bytes_(b"\xfe" * 64)), "not UTF-8"),
    "sha256 is not a digest": (set_attr(f"{STEP}/inputs/query", "sha256", "abc"), "not a sha256 hex digest"),
    "schema_version '2'": (set_attr("/", "schema_version", "2"), "schema_version '2' is not supported"),
    "schema_version 1.5": (set_attr("/", "schema_version", 1.5), "schema_version 1.5 is not supported"),
    "schema_version True": (set_attr("/", "schema_version", True), "schema_version True is not supported"),
    "window outside the history": (
        set_attr(STEP, "current_kv_rows", np.array([0, 10**6], dtype=np.int64)), "is not a window of kv_history"
    ),
}


def replace_dataset(path: str, **options):
    def change(handle):
        del handle[path]
        handle.create_dataset(path, **options)
        handle[path].attrs["sha256"] = "0" * 64

    return change


def link(kind):
    def change(handle):
        del handle[f"{STEP}/inputs/query"]
        handle[f"{STEP}/inputs/query"] = kind

    return change


def virtual(handle):
    """current_kv as the virtual dataset schema 1 writers made (its mapping is unchecked by HDF5)."""
    layout = h5py.VirtualLayout(shape=(1, 2, 512), dtype=np.float32)
    layout[:] = h5py.VirtualSource(".", f"/cases/{STREAM}/kv_history", shape=(1, 7, 512))[:, 0:2]
    handle[f"{STEP}/inputs"].create_virtual_dataset("current_kv", layout)
    del handle[STEP].attrs["current_kv_rows"]


UNREADABLE.update(
    {
        "dangling soft link": (link(h5py.SoftLink("/nowhere")), "is a soft link"),
        "external link to a missing file": (link(h5py.ExternalLink("missing.h5", "/x")), "is an external link"),
        "external link outside the file": (link(h5py.ExternalLink("/etc/passwd", "/")), "is an external link"),
        "virtual dataset": (virtual, "is a virtual dataset"),
        "never written (10**12,)": (
            replace_dataset(f"{STEP}/inputs/query", shape=(10**12,), dtype=np.uint8, chunks=(1 << 20,)),
            "declares 1000000000000 bytes but stores 0",
        ),
        "1 GiB chunk": (
            replace_dataset(f"{STEP}/inputs/query", shape=(8,), dtype=np.uint8, maxshape=(None,),
                            chunks=(1 << 30,), compression="gzip"),
            "larger than its shape",
        ),
        "string dataset": (replace_dataset(f"{STEP}/inputs/query", data="text"), "golden tensors are numbers"),
        "unknown member": (lambda handle: handle[STEP].create_group("extras"), "unexpected member 'extras'"),
    }
)


@pytest.mark.parametrize("name", sorted(UNREADABLE))
@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_malformed_files_exit_2_with_one_line(copy, name, command):
    change, message = UNREADABLE[name]
    edit(copy, change)
    arguments = [command, str(copy)] + ([STREAM, "--step", "1"] if command == "inspect" else [])
    if name.startswith("schema_version"):
        refused(invoke(*arguments), ExitCode.USAGE, str(copy), message)
    else:
        invalid(invoke(*arguments), command, str(copy), message)


def unsealed(handle):
    """A schema_version 1 file, as other tools write it: no digests to catch a changed shape."""
    handle.attrs["schema_version"] = np.int64(1)
    del handle.attrs["manifest_sha256"]


def test_a_declared_shape_beyond_the_geometry_is_refused_before_reading(copy):
    # 100 MB of zeros deflate to 0.1 MB: possible in the file, impossible for a B=1, N=2, T=2 case.
    with GoldenFile(copy) as golden:
        case = golden.read_case(STREAM)
    write_goldens(copy, [case], force=True)
    edit(copy, unsealed)
    edit(copy, replace_dataset(f"{STEP}/inputs/query", shape=(100 << 20,), dtype=np.uint8,
                               data=np.zeros(100 << 20, np.uint8), compression="gzip"))
    line = invalid(invoke("verify", str(copy)), "verify", f"{STEP}/inputs/query")
    assert "more than the case's geometry allows" in line


@pytest.mark.parametrize(
    "special, message",
    [("fifo", "not a regular file"), ("directory", "is a directory"), ("/dev/null", "not a regular file")],
)
def test_only_regular_files_are_opened(tmp_path, special, message):
    path = tmp_path / "golden.h5"
    if special == "fifo":
        os.mkfifo(path)
    elif special == "directory":
        path.mkdir()
    else:
        path = special
    result, read = bytes_read(lambda: invoke("inspect", str(path)))
    refused(result, ExitCode.USAGE, message)
    assert read < 1 << 20, read  # refused by what the path is, not by reading it


# --- exit 1: readable, but an object no longer matches its digest ------------------------------


ALTERED = {
    "attrs_json key renamed to another whose default is the stored value": (
        lambda handle: handle[f"/cases/{STREAM}"].attrs.__setitem__(
            "attrs_json", handle[f"/cases/{STREAM}"].attrs["attrs_json"].replace('"causal"', '"causaL"')
        ),
        f"corrupt case /cases/{STREAM}: case_sha256 mismatch",
    ),
    "family": (set_attr(f"/cases/{STREAM}", "family", "random"), "case_sha256 mismatch"),
    "description": (set_attr(f"/cases/{STREAM}", "description", "other"), "case_sha256 mismatch"),
    "seed": (set_attr(f"/cases/{STREAM}", "seed", np.int64(3)), "case_sha256 mismatch"),
    "expect_error added": (set_attr(STEP, "expect_error", "no"), "case_sha256 mismatch"),
    "window moved": (set_attr(STEP, "current_kv_rows", np.array([1, 3], dtype=np.int64)), "case_sha256 mismatch"),
    "dataset data": (
        lambda handle: handle[f"{STEP}/inputs/query"].__setitem__((0, 0, 0, 0), 9.0),
        f"corrupt dataset {STEP}/inputs/query: sha256 mismatch",
    ),
    "hard link pointed elsewhere": (
        lambda handle: (
            handle[f"{STEP}/inputs"].__delitem__("head_sink"),
            handle[f"{STEP}/inputs"].__setitem__("head_sink", handle[f"{STEP}/inputs/compressor_norm"]),
        ),
        "case_sha256 mismatch",
    ),
    "steps swapped": (
        lambda handle: (
            handle.move(f"/cases/{STREAM}/steps/0001", f"/cases/{STREAM}/steps/x"),
            handle.move(f"/cases/{STREAM}/steps/0002", f"/cases/{STREAM}/steps/0001"),
            handle.move(f"/cases/{STREAM}/steps/x", f"/cases/{STREAM}/steps/0002"),
        ),
        "case_sha256 mismatch",
    ),
}


@pytest.mark.parametrize("name", sorted(ALTERED))
def test_altered_objects_fail_verification_by_name(copy, name):
    change, message = ALTERED[name]
    edit(copy, change)
    failed(invoke("verify", str(copy)), message)


@pytest.mark.parametrize("name", ["suite provenance", "created_by", "a case removed", "a case added"])
def test_root_changes_fail_the_manifest_digest_before_anything_runs(copy, name):
    changes = {
        "suite provenance": set_attr("/", "suite", "full"),
        "created_by": set_attr("/", "created_by", "someone else"),
        "a case removed": lambda handle: handle.move(f"/cases/{STREAM}", "/moved"),
        "a case added": lambda handle: handle.copy(f"/cases/{STREAM}", "/cases/extra"),
    }
    edit(copy, changes[name])
    for command in ("verify", "inspect"):
        refused(invoke(command, str(copy)), ExitCode.DIVERGED, f"{copy}: /: manifest_sha256 mismatch (stored ")


def test_schema_version_lowered_to_1_on_a_sealed_file_is_caught(copy):
    edit(copy, set_attr("/", "schema_version", np.int64(1)))
    refused(invoke("verify", str(copy)), ExitCode.DIVERGED, "schema_version was altered")


def test_sha256_mismatches_show_both_full_digests(copy):
    edit(copy, ALTERED["dataset data"][0])
    line = failed(invoke("verify", str(copy)))
    digests = line.split("sha256 mismatch (stored ")[1].split(", data ")
    assert len(digests[0]) == 64 and len(digests[1].split(")")[0]) == 64


def test_a_corrupt_dataset_exits_1_in_every_command(copy):
    edit(copy, ALTERED["dataset data"][0])
    runs = {
        "verify": invoke("verify", str(copy)),
        "inspect": invoke("inspect", str(copy), STREAM, "--step", "1"),
        "diff": invoke("diff", str(copy), "--force-host", "all"),
        "bisect": invoke("bisect", str(copy), "--case", STREAM, "--force-host", "all"),
    }
    for command, result in runs.items():
        assert result.exit_code == ExitCode.DIVERGED, (command, result.output)
        assert "Traceback" not in result.output
        assert f"{STEP}/inputs/query" in result.output, (command, result.output)


def test_a_malformed_file_exits_2_in_every_command(copy):
    edit(copy, UNREADABLE["dangling soft link"][0])
    for arguments in (["verify"], ["inspect"], ["diff", "--force-host", "all"],
                      ["bisect", "--case", STREAM, "--force-host", "all"]):
        result = invoke(arguments[0], str(copy), *arguments[1:])
        invalid(result, arguments[0], "is a soft link")


# --- streams -----------------------------------------------------------------------------------


def test_swapped_steps_of_a_resealed_stream_are_not_a_stream(copy):
    with GoldenFile(copy) as golden:
        case = golden.read_case(STREAM)
    case.steps[1], case.steps[2] = case.steps[2], case.steps[1]
    write_goldens(copy, [case], force=True)
    line = failed(invoke("verify", str(copy)), f"FAIL {STREAM} step 1: not a stream: input past_")
    assert "is not the previous step's present_" in line


def test_a_step_after_a_rejected_step_breaks_the_stream():
    rejected = GoldenStep(inputs={}, expect_error="rejected")
    assert "rejected step ends its stream" in stream_break(rejected, GoldenStep(inputs={}))
    carry = np.zeros((1, 8, 2, 256), np.float32)
    before = GoldenStep(inputs={}, outputs={"present_index_carry": carry})
    assert stream_break(before, GoldenStep(inputs={"past_index_carry": carry.copy()})) is None
    assert "past_index_carry" in stream_break(before, GoldenStep(inputs={"past_index_carry": carry + 1}))


def test_verify_work_is_linear_in_the_number_of_steps(tmp_path):
    """Hard-linked steps (every array shared): reading and checking a case costs per step, not per step squared.
    The work is the lines csa-conform and h5py run: linear, each doubling of the steps adds twice what the
    doubling before it added (exactly, fixed costs cancel); any term in steps squared adds more."""

    def work(steps: int) -> int:
        arrays = {"query": np.zeros((1, 1, 2, 512), np.float32), "total_sequence_length": np.array(1, np.int64)}
        case = GoldenCase("long", {"num_heads": 2}, ("Y",),
                          [GoldenStep(inputs=arrays, outputs={"Y": arrays["query"]}) for _ in range(steps)])
        path = tmp_path / f"{steps}.h5"
        write_goldens(path, [case])

        def read() -> None:
            with GoldenFile(path) as golden:
                golden.verify_case_checksums("long")
                for index in range(steps):
                    golden.read_step("long", index)

        return lines_run(read, csa_conform, h5py)

    small, middle, large = work(20), work(40), work(80)
    assert middle - small > 0
    assert large - middle <= 2 * (middle - small), (small, middle, large)


def test_workers_refuse_a_file_that_changed_since_the_run_began(stream):
    with pytest.raises(GoldenChanged, match="changed while it was being verified"):
        verify_case_in(str(stream), "0" * 64, STREAM)


@pytest.mark.parametrize("digest_too", [True, False])
def test_the_first_damaged_dataset_in_file_order_is_reported_though_hashing_lags_reading(copy, reading, digest_too):
    """Digests are checked on a thread behind the reads: an earlier digest mismatch still wins over a
    later dataset that cannot be read at all, which is reported when it is the only damage."""
    first = f"/cases/{STREAM}/steps/0000/inputs/compressor_ape"
    later = f"{STEP}/outputs/Y"

    def change(handle):
        if digest_too:
            handle[first][0, 0] = 9.0
        dataset = handle[later]
        dataset.id.write_direct_chunk((0,) * dataset.ndim, b"not a deflate stream", 0)

    edit(copy, change)
    expected = [f"corrupt dataset {first}: sha256 mismatch"] if digest_too else [": unreadable (", later]
    failed(invoke("verify", str(copy)), *expected)


@pytest.mark.parametrize("step_too", [True, False])
@pytest.mark.parametrize("unreadable", [True, False])
def test_the_kv_history_read_first_is_still_reported_after_the_steps_damage(copy, reading, unreadable, step_too):
    """The kv history is read before the steps' datasets (the first step's current_kv is a window of
    it) but is last in file order: a damaged step dataset is still the one reported, and the history
    when it is the only damage, unreadable or altered."""
    history = f"/cases/{STREAM}/kv_history"
    query = f"{STEP}/inputs/query"

    def change(handle):
        if unreadable:
            dataset = handle[history]
            dataset.id.write_direct_chunk((0,) * dataset.ndim, b"not a deflate stream", 0)
        else:
            handle[history][0, 0, 0] = 9.0
        if step_too:
            handle[query][0, 0, 0, 0] = 9.0

    edit(copy, change)
    if step_too:
        expected = [f"corrupt dataset {query}: sha256 mismatch"]
    else:
        expected = [history, ": unreadable (" if unreadable else ": sha256 mismatch"]
    failed(invoke("verify", str(copy)), *expected)


def test_a_replay_that_fails_gives_way_to_a_damaged_dataset_read_meanwhile(copy, reading, monkeypatch):
    """Steps replay while the datasets after their inputs are still read and hashed: an error of a
    replay itself yields to the damaged dataset that checking every digest first reports."""
    output = f"/cases/{STREAM}/steps/0004/outputs/Y"

    def broken(*_):
        raise RuntimeError("a replay that fails")

    monkeypatch.setattr("csa_conform.check.verify.replay", broken)
    with GoldenFile(copy) as golden, pytest.raises(RuntimeError, match="a replay that fails"):
        verify_case(golden, STREAM)
    edit(copy, lambda handle: handle[output].__setitem__((0, 0, 0, 0), 9.0))
    with GoldenFile(copy) as golden:
        result = verify_case(golden, STREAM)
    assert result.problem.startswith(f"corrupt dataset /cases/{STREAM}/steps/0004/"), result.problem
    assert "sha256 mismatch" in result.problem and not result.steps


@pytest.mark.parametrize("name", ["past_compression_carry", "past_index_carry"])
def test_a_carry_omitted_by_a_step_that_does_not_start_at_position_0_is_refused(copy, name):
    """Only a step from position 0 may omit a carry (the contract clears it there): elsewhere the file
    lacks an input the step reads, which every command refuses in one line naming case, step and input."""
    with GoldenFile(copy) as golden:
        case = golden.read_case(STREAM)
    del case.steps[1].inputs[name]
    write_goldens(copy, [case], force=True)
    for arguments in (["verify"], ["inspect", STREAM], ["diff", "--force-host", "all"],
                      ["bisect", "--case", STREAM, "--force-host", "all"]):
        line = invalid(invoke(arguments[0], str(copy), *arguments[1:]), arguments[0],
                       f"{STEP}: inputs/{name} is omitted, but the step starts at position ")
        assert "not 0 (only a step that starts at position 0 may omit its carries)" in line
