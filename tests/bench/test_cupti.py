"""The CUPTI timer without a GPU: its record layout against the CUDA header, the rule that turns a repetition's
kernel records into a time (the hold, poison and flush kernels left out), and the fall back to CUDA events."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from csa_conform.bench import cupti
from csa_conform.bench.cupti import ActivityKernel10, KernelRecord, repetition_records, repetition_seconds
from csa_conform.bench.timers import AUTO, CUPTI, EVENTS, HOLD_ENTRY, baseline_timer, cupti_activity
from csa_conform.cli import main
from csa_conform.errors import DeviceUnavailable, UsageError
from csa_conform.exitcodes import ExitCode

HEADER = Path("/usr/local/cuda/include/cupti_activity.h")
HEADERS = [Path("/usr/local/cuda-13.0/include"), HEADER.parent]

HOLD_STREAM, OTHER_STREAM = 13, 7


def _include() -> Path:
    found = next((folder for folder in HEADERS if (folder / "cupti_activity.h").is_file()), None)
    if found is None:
        pytest.skip(f"no cupti_activity.h in {', '.join(map(str, HEADERS))}: the record layout is not checked")
    if shutil.which("gcc") is None:
        pytest.skip("no gcc: the record layout is not checked against the header")
    return found


def test_the_kernel_record_layout_matches_the_header(tmp_path):
    include = _include()
    names = [name for name, _ in ActivityKernel10._fields_]
    lines = [f'printf("{name} %zu %zu\\n", offsetof(CUpti_ActivityKernel10, {name}), '
             f"sizeof(((CUpti_ActivityKernel10*)0)->{name}));" for name in names]
    source = tmp_path / "layout.c"
    source.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <cupti_activity.h>\nint main(void) {\n"
                      + "\n".join(lines)
                      + '\nprintf("kind %d %d\\n", CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,'
                      + " CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);"
                      + "\nreturn 0; }\n")
    program = tmp_path / "layout"
    subprocess.run(["gcc", f"-I{include}", str(source), "-o", str(program)], check=True, capture_output=True)
    printed = subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout.splitlines()
    *fields, constants = [line.split() for line in printed]
    assert {name: (int(offset), int(size)) for name, offset, size in fields} == {
        name: (getattr(ActivityKernel10, name).offset, getattr(ActivityKernel10, name).size) for name in names}
    assert constants[1:] == [str(cupti.KIND_CONCURRENT_KERNEL), str(cupti.FLUSH_FORCED)]


def test_a_record_in_memory_reads_as_its_kernel():
    name = ctypes.create_string_buffer(b"csa_ratio4_index_select")
    raw = ActivityKernel10(kind=cupti.KIND_CONCURRENT_KERNEL, start=1_000, end=4_500, streamId=HOLD_STREAM,
                          correlationId=42, name=ctypes.addressof(name))
    record = KernelRecord.read(ActivityKernel10.from_buffer_copy(bytes(raw)))
    assert record == KernelRecord("csa_ratio4_index_select", 1_000, 4_500, HOLD_STREAM, 42)


def _repetition() -> list[KernelRecord]:
    """One cold repetition as CUPTI reports it: an earlier row's launch, this sample's poison and L2 flush on
    another stream, the hold, then two launches; records come in no particular order."""
    return [
        KernelRecord("csa_ratio4_compress", 10, 90, HOLD_STREAM, 3),  # an earlier row, same stream
        KernelRecord("cupy_copy", 100, 120, OTHER_STREAM, 5),  # the poison
        KernelRecord("cupy_fill", 130, 400, OTHER_STREAM, 6),  # the L2 flush
        KernelRecord("csa_ratio4_index_select", 5_300, 5_900, HOLD_STREAM, 9),
        KernelRecord(HOLD_ENTRY, 500, 5_000, HOLD_STREAM, 7),
        KernelRecord("csa_ratio4_compress", 5_010, 5_250, HOLD_STREAM, 8),
    ]


def test_a_repetition_is_its_own_launches_from_first_start_to_last_end():
    records = _repetition()
    assert [record.correlation for record in repetition_records(records, HOLD_ENTRY)] == [9, 8]
    assert repetition_seconds(records, HOLD_ENTRY, 2) == pytest.approx((5_900 - 5_010) / 1e9, rel=0, abs=0)


def test_a_graphs_kernel_nodes_share_the_launch_correlation():
    records = [KernelRecord(HOLD_ENTRY, 0, 2_000, HOLD_STREAM, 20)] + [
        KernelRecord(f"node{index}", 2_100 + 300 * index, 2_350 + 300 * index, HOLD_STREAM, 21) for index in range(3)]
    assert repetition_seconds(records, HOLD_ENTRY, 3) == pytest.approx((2_950 - 2_100) / 1e9, rel=0, abs=0)


@pytest.mark.parametrize("records, launches, message", [
    (_repetition(), 3, "2 kernel records for a repetition of 3 launches"),
    (_repetition()[:4], 2, "0 records of the hold kernel"),
    (_repetition() + [KernelRecord(HOLD_ENTRY, 6_000, 6_100, HOLD_STREAM, 10)], 2, "2 records of the hold kernel"),
    (_repetition()[:5] + [KernelRecord("csa_ratio4_compress", 0, 0, HOLD_STREAM, 8)], 2, "start 0 ns"),
    (_repetition()[:5] + [KernelRecord("csa_ratio4_compress", 5_100, 5_050, HOLD_STREAM, 8)], 2, "end 5050 ns"),
])
def test_records_that_make_no_time_are_an_error_never_a_time(records, launches, message):
    with pytest.raises(DeviceUnavailable, match=message):
        repetition_seconds(records, HOLD_ENTRY, launches)


def test_without_libcupti_auto_falls_back_with_the_reason_and_cupti_is_refused(tmp_path):
    missing = str(tmp_path / "nowhere" / "libcupti.so")
    activity, reason = cupti_activity("auto", [missing])
    assert activity is None and reason.startswith("CUPTI not found") and missing in reason
    with pytest.raises(DeviceUnavailable, match=r"^--timer cupti: CUPTI not found"):
        cupti_activity(CUPTI, [missing])
    assert cupti_activity(EVENTS, [missing]) == (None, None)


def test_the_host_backend_takes_no_device_timer():
    result = CliRunner().invoke(main, ["bench", "--backend", "host", "--timer", "cupti"])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "--timer cupti times CUDA launches: it needs --backend cuda" in result.output


def test_a_recorded_baseline_is_gated_by_its_own_timer():
    assert baseline_timer(AUTO, "cuda-events", "base.json") == EVENTS
    assert baseline_timer(AUTO, "cupti", "base.json") == CUPTI
    assert baseline_timer(AUTO, "host-perf-counter", "base.json") == AUTO
    assert baseline_timer(EVENTS, "cuda-events", "base.json") == EVENTS
    with pytest.raises(UsageError, match=r"^base.json was timed with cuda-events: --timer cupti would gate"):
        baseline_timer(CUPTI, "cuda-events", "base.json")


def test_only_a_libcupti_whose_kernel_record_was_checked_is_read():
    assert cupti.layout_refusal(130001) is None and cupti.layout_refusal(130200) is None
    assert "CUPTI API version is 28" in cupti.layout_refusal(28)  # CUDA 12.9's: another record version
    assert cupti.layout_refusal(140000) is not None
