"""The HDF5 golden store: round trip, checksums, schema, atomic writes, foreign files."""

from __future__ import annotations

import errno
import gc
import json
import os

import h5py
import numpy as np
import pytest
from reference_corpus import expected_error, reference_file, step_inputs, step_prefixes

from csa_conform.check.verify import verify_case
from csa_conform.errors import GoldenFormatError, GoldenWriteError, UsageError
from csa_conform.golden import (
    SCHEMA_VERSION,
    Compression,
    CorruptDataset,
    GoldenCase,
    GoldenFile,
    GoldenStep,
    array_sha256,
    write_goldens,
    writer,
)
from csa_conform.golden.validation import CheckedFile


def sample_case(case_id: str = "sample.case", steps: int = 2) -> GoldenCase:
    rng = np.random.default_rng(7)
    history = rng.standard_normal((1, 6, 512), dtype=np.float32)
    built = []
    for index in range(steps):
        total = 4 + index
        built.append(
            GoldenStep(
                inputs={
                    "query": rng.standard_normal((1, 1, 2, 512), dtype=np.float32),
                    "current_kv": history[:, total - 3 : total],
                    "past_compressed_kv": np.arange(583, dtype=np.uint8).reshape(1, 1, 583),
                    "seqlens_k": np.array([total - 1], dtype=np.int32),
                    "total_sequence_length": np.array(total, dtype=np.int64),
                    "attention_bias": np.array([[True, False]]),
                    "wide": np.array([1.5, -0.0], dtype=">f8"),
                },
                outputs={"Y": rng.standard_normal((1, 1, 2, 512), dtype=np.float32)},
                stages={"selection": {"selected": np.array([[[0, -1]]], dtype=np.int32)}},
            )
        )
    built.append(GoldenStep(inputs={"query": np.full((1, 0, 2, 512), 0.5, np.float32)}, expect_error="nope: rejected"))
    return GoldenCase(case_id, {"num_heads": 2, "scale": float("nan")}, ("Y",), built, "family", 12, "why", history)


def assert_same_step(read: GoldenStep, written: GoldenStep) -> None:
    assert read.expect_error == written.expect_error
    for group in ("inputs", "outputs"):
        left, right = getattr(read, group), getattr(written, group)
        assert list(left) == list(right)
        for name in left:
            assert left[name].shape == right[name].shape
            assert array_sha256(left[name]) == array_sha256(right[name])
    assert {s: list(p) for s, p in read.stages.items()} == {s: list(p) for s, p in written.stages.items()}


def test_round_trip_keeps_every_array_bit_for_bit(tmp_path):
    case = sample_case()
    path = tmp_path / "g.h5"
    assert write_goldens(path, [case], provenance={"suite": "unit"}) == 1
    with GoldenFile(path) as golden:
        assert golden.case_ids() == ["sample.case"]
        assert golden.provenance["schema_version"] == SCHEMA_VERSION
        assert golden.provenance["suite"] == "unit"
        info = golden.case_info("sample.case")
        assert info.family == "family" and info.seed == 12 and info.description == "why"
        assert info.output_names == ("Y",) and info.errors == (2,)
        assert np.isnan(info.attrs["scale"]) and info.attrs["num_heads"] == 2
        read = golden.read_case("sample.case")
        assert golden.verify_case_checksums("sample.case") > 0
    for read_step, written_step in zip(read.steps, case.steps):
        assert_same_step(read_step, written_step)
    assert read.steps[0].inputs["wide"].dtype == np.dtype("<f8")
    assert read.steps[0].inputs["total_sequence_length"].shape == ()


def test_identical_arrays_are_stored_once_and_windows_are_views(tmp_path):
    path = tmp_path / "g.h5"
    write_goldens(path, [sample_case("a"), sample_case("b")])
    with h5py.File(path, "r") as handle:
        first = handle["cases/a/steps/0000/inputs/past_compressed_kv"]
        second = handle["cases/b/steps/0001/inputs/past_compressed_kv"]
        assert h5py.h5o.get_info(first.id).addr == h5py.h5o.get_info(second.id).addr
        step = handle["cases/a/steps/0001"]
        assert "current_kv" not in step["inputs"]
        assert step.attrs["current_kv_rows"].tolist() == [2, 5]
        history = handle["cases/a/kv_history"][()]
    with GoldenFile(path) as golden:
        assert golden.read_step("a", 1).inputs["current_kv"].tobytes() == history[:, 2:5].tobytes()
        assert list(golden.read_step("a", 1).inputs)[:2] == ["query", "current_kv"]


def tamper(path, dataset: str, edit) -> None:
    with h5py.File(path, "r+") as handle:
        values = handle[dataset][()]
        edit(values)
        handle[dataset][...] = values


def test_a_verified_case_replays_from_the_arrays_its_checksums_read(tmp_path, monkeypatch):
    """read_step serves the arrays verify_case_checksums read and checked (read-only), not a second read."""
    path = tmp_path / "g.h5"
    written = sample_case(steps=3)
    write_goldens(path, [written])
    reads = []
    original = CheckedFile.read
    monkeypatch.setattr(CheckedFile, "read", lambda self, entry, dataset: reads.append(dataset.name)
                        or original(self, entry, dataset))
    with GoldenFile(path) as golden:
        golden.verify_case_checksums(written.case_id)
        verified = list(reads)
        steps = [golden.read_step(written.case_id, index) for index in range(3)]
    assert reads == verified, "replaying a verified case read a dataset again"
    for read, step in zip(steps, written.steps):
        assert_same_step(read, step)
    assert not steps[0].outputs["Y"].flags.writeable


def test_prod_sized_datasets_use_lzf_and_the_ci_sized_ones_gzip():
    """gzip dominated `generate --suite prod`; the ci suite's largest dataset is 1 MiB, so its bytes stay."""
    compression = Compression()
    large = np.zeros(compression.large_bytes // 4, np.float32)
    ci_largest = np.zeros((1 << 20) // 4, np.float32)
    assert compression.options(large)["compression"] == "lzf" and "compression_opts" not in compression.options(large)
    assert (compression.options(ci_largest)["compression"], compression.options(ci_largest)["compression_opts"]) == (
        "gzip", 4)


def test_changed_dataset_fails_its_checksum_by_name(tmp_path):
    path = tmp_path / "g.h5"
    write_goldens(path, [sample_case()])
    name = "/cases/sample.case/steps/0001/outputs/Y"
    tamper(path, name, lambda values: values.reshape(-1).view(np.uint8).__setitem__(3, 0x55))
    with GoldenFile(path) as golden:
        with pytest.raises(CorruptDataset, match="sha256 mismatch") as raised:
            golden.read_step("sample.case", 1)
    assert raised.value.dataset == name


def test_flipped_byte_on_disk_is_caught(tmp_path):
    path = tmp_path / "g.h5"
    write_goldens(path, [sample_case()], compression=Compression(codec=None))
    name = "/cases/sample.case/steps/0000/inputs/query"
    with h5py.File(path, "r") as handle:
        offset = handle[name].id.get_offset()
    with open(path, "r+b") as raw:
        raw.seek(offset + 100)
        byte = raw.read(1)
        raw.seek(offset + 100)
        raw.write(bytes([byte[0] ^ 0x20]))
    with GoldenFile(path) as golden:
        result = verify_case(golden, "sample.case")
    assert not result.passed and name in result.problem


def test_kv_history_rows_outside_every_window_are_checked_too(tmp_path):
    path = tmp_path / "g.h5"
    write_goldens(path, [sample_case()])
    tamper(path, "/cases/sample.case/kv_history", lambda values: values.__setitem__((0, 0, 0), 7.0))
    with GoldenFile(path) as golden:
        with pytest.raises(CorruptDataset, match="kv_history"):
            golden.verify_case_checksums("sample.case")
        with pytest.raises(CorruptDataset, match="kv_history"):
            golden.read_step("sample.case", 0)


def test_other_schema_versions_are_refused_with_a_clear_message(tmp_path):
    path = tmp_path / "g.h5"
    write_goldens(path, [sample_case()])
    with h5py.File(path, "r+") as handle:
        handle.attrs["schema_version"] = 3
    with pytest.raises(GoldenFormatError, match="schema_version 3 is not supported; this csa-conform reads schema_version 2"):
        GoldenFile(path)


@pytest.mark.parametrize("content", [b"", b"not an hdf5 file at all"])
def test_non_hdf5_and_missing_files_are_format_errors(tmp_path, content):
    path = tmp_path / "junk.h5"
    path.write_bytes(content)
    with pytest.raises(GoldenFormatError, match="not an HDF5 file"):
        GoldenFile(path)
    with pytest.raises(GoldenFormatError, match="no such file"):
        GoldenFile(tmp_path / "absent.h5")


def test_hdf5_without_the_format_attribute_is_refused(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as handle:
        handle.create_dataset("x", data=[1])
    with pytest.raises(GoldenFormatError, match="not a csa-conform golden file"):
        GoldenFile(path)


def test_refuses_to_overwrite_without_force(tmp_path):
    path = tmp_path / "g.h5"
    path.write_bytes(b"keep me")
    with pytest.raises(UsageError, match="--force"):
        write_goldens(path, [sample_case()])
    assert path.read_bytes() == b"keep me"
    write_goldens(path, [sample_case()], force=True)
    assert GoldenFile(path).case_ids() == ["sample.case"]


@pytest.mark.parametrize("interruption", [RuntimeError("boom"), KeyboardInterrupt()])
def test_an_interrupted_write_leaves_nothing_behind(tmp_path, interruption):
    def cases():
        yield sample_case("first")
        raise interruption

    path = tmp_path / "g.h5"
    with pytest.raises(type(interruption)):
        write_goldens(path, cases())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("writes_before_failing", [0, 3, 40])
def test_a_write_that_fails_midway_is_one_error_and_leaves_nothing(tmp_path, monkeypatch, writes_before_failing):
    """HDF5 never sees the failure (its close would crash after one): the writer stops at the next
    case and reports it, and the unnamed file is never linked."""
    written = []

    def full_disk(descriptor, data, offset):
        if len(written) >= writes_before_failing:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(offset)
        return os.pwrite(descriptor, data, offset)

    monkeypatch.setattr(writer.os, "pwrite", full_disk)
    path = tmp_path / "g.h5"
    with pytest.raises(GoldenWriteError, match=r"g\.h5: cannot write \(\[Errno 28\] No space left on device\); nothing written$"):
        write_goldens(path, [sample_case("first"), sample_case("second")])
    assert list(tmp_path.iterdir()) == []


def test_written_file_gets_the_usual_permissions(tmp_path):
    path = tmp_path / "g.h5"
    write_goldens(path, [sample_case()])
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def write_foreign(path, archive_names: list[str]) -> None:
    """A file another tool could write: the layout, inputs and outputs only, no stages."""
    with h5py.File(path, "w") as handle:
        handle.attrs["format"] = "csa-conform-goldens"
        handle.attrs["schema_version"] = 1
        for name in archive_names:
            archive = reference_file(name)
            case = handle.create_group(f"cases/{name.removesuffix('.npz')}")
            case.attrs["attrs_json"] = str(archive["attrs_json"])
            case.attrs["output_names_json"] = str(archive["output_names_json"])
            for index, prefix in enumerate(step_prefixes(archive)):
                step = case.create_group(f"steps/{index:04d}")
                for input_name, value in step_inputs(archive, prefix).items():
                    step[f"inputs/{input_name}"] = value
                    step[f"inputs/{input_name}"].attrs["sha256"] = array_sha256(value)
                message = expected_error(archive, prefix)
                if message is not None:
                    step.attrs["expect_error"] = message
                    continue
                for output in json.loads(str(archive["output_names_json"])):
                    value = archive[f"{prefix}out/{output}"]
                    step[f"outputs/{output}"] = value
                    step[f"outputs/{output}"].attrs["sha256"] = array_sha256(value)


def test_foreign_file_with_inputs_and_outputs_only_verifies(tmp_path):
    path = tmp_path / "foreign.h5"
    names = ["r4_fp8_6out_stream_6_to_12.npz", "r128_f32_prefill_S7_B2_H2.npz", "err_query_nan.npz"]
    write_foreign(path, names)
    with GoldenFile(path) as golden:
        info = golden.case_info("r4_fp8_6out_stream_6_to_12")
        assert info.family == "" and info.seed is None and info.step_count == 7
        assert golden.read_step("r4_fp8_6out_stream_6_to_12", 0).stages == {}
        case_ids = golden.case_ids()
        for case_id in case_ids:
            result = verify_case(golden, case_id)
            assert result.passed, result.failure_lines()


def test_missing_checksum_attribute_is_a_format_error(tmp_path):
    path = tmp_path / "foreign.h5"
    write_foreign(path, ["r128_f32_prefill_S7_B2_H2.npz"])
    with h5py.File(path, "r+") as handle:
        del handle["cases/r128_f32_prefill_S7_B2_H2/steps/0000/outputs/Y"].attrs["sha256"]
    with GoldenFile(path) as golden:
        with pytest.raises(GoldenFormatError, match="has no sha256 attribute"):
            golden.read_step("r128_f32_prefill_S7_B2_H2", 0)


def test_a_malformed_layout_is_a_format_error_not_a_crash(tmp_path):
    path = tmp_path / "g.h5"
    write_goldens(path, [sample_case()])
    with h5py.File(path, "r+") as handle:
        del handle["cases/sample.case/steps/0000/stages"]
        handle["cases/sample.case/steps/0000/stages"] = np.zeros(3)
    with GoldenFile(path) as golden:
        with pytest.raises(GoldenFormatError, match="stages should be a group"):
            golden.read_step("sample.case", 0)
        with pytest.raises(GoldenFormatError, match="stages should be a group"):
            golden.dataset_entries("sample.case", 0)


def test_a_closed_file_held_by_its_caller_keeps_no_dataset_handle(tmp_path):
    """h5py walks every live handle of the process at each file close: a closed GoldenFile that a caller's
    variable still holds must not keep its index's datasets alive (each later close would pay for them)."""
    def datasets_alive() -> int:
        gc.collect()
        # type(), not isinstance(): isinstance on a dead weakproxy raises ReferenceError
        return sum(type(item) is h5py.Dataset for item in gc.get_objects())

    path = tmp_path / "two.h5"
    write_goldens(path, [sample_case("sample.one"), sample_case("sample.two")])
    before = datasets_alive()
    golden = GoldenFile(path)
    for case_id in golden.case_ids():
        golden.read_step(case_id, 1)
    assert datasets_alive() > before
    golden.close()
    assert datasets_alive() == before
