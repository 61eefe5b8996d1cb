"""The baseline kernels' conformance check reads a case as the new kernels' check did: once from the file,
read-only, so neither check can change what the other compares with."""

from __future__ import annotations

from pathlib import Path

import pytest

from csa_conform.bench.measure import SharedReads
from csa_conform.golden import GoldenFile
from csa_conform.numerics.bits import same_bits

CI = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"
CASE = "random.r4-5out-i4-k3"


def test_each_step_is_read_once_and_handed_out_read_only(monkeypatch):
    with GoldenFile(str(CI)) as golden:
        reads = SharedReads(golden)
        counted = []
        read_step = golden.read_step
        monkeypatch.setattr(golden, "read_step", lambda case, index: counted.append(index) or read_step(case, index))
        first, again = reads.read_step(CASE, 0), reads.read_step(CASE, 0)
        assert again is first and counted == [0]
        assert reads.case_info(CASE).step_count == golden.case_info(CASE).step_count
        fresh = read_step(CASE, 0)
        assert first.inputs.keys() == fresh.inputs.keys()
        assert all(same_bits(array, fresh.inputs[name]) for name, array in first.inputs.items())
        arrays = [*first.inputs.values(), *first.outputs.values(),
                  *(array for payload in first.stages.values() for array in payload.values())]
        assert arrays and not any(array.flags.writeable for array in arrays)
        with pytest.raises(ValueError):
            arrays[0][...] = 0
