"""The .nxrt tensor file: its bytes as the runtime's runner lays them out, and every malformed file refused."""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform.bridge.nxrt import DTYPES, decode, encode, read_tensor, write_tensor
from csa_conform.errors import TensorFileError

# float32 [[1.0, -2.0]]: magic, code 1, rank 2 (u32), dims 1 and 2 (u64), 8 payload bytes (u64), payload.
TWO_FLOATS = (b"NXRTCF01" + b"\x01" + b"\x02\x00\x00\x00" + b"\x01" + b"\x00" * 7 + b"\x02" + b"\x00" * 7
              + b"\x08" + b"\x00" * 7 + bytes.fromhex("0000803f000000c0"))


def test_the_layout_is_the_runners():
    assert encode(np.array([[1.0, -2.0]], dtype=np.float32)) == TWO_FLOATS
    found = decode(TWO_FLOATS, "t")
    assert found.dtype == np.float32 and found.shape == (1, 2) and found.tobytes() == bytes.fromhex("0000803f000000c0")


def test_a_scalar_has_rank_zero():
    assert encode(np.array(7, dtype=np.int64)) == (b"NXRTCF01\x07" + b"\x00" * 4 + b"\x08" + b"\x00" * 7
                                                   + b"\x07" + b"\x00" * 7)


@pytest.mark.parametrize("code", sorted(DTYPES))
@pytest.mark.parametrize("shape", [(), (0, 3), (2, 3, 1)])
def test_every_carried_dtype_round_trips_bit_for_bit(code, shape):
    dtype = DTYPES[code]
    raw = np.random.default_rng(code).integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    array = (raw.astype(bool) if dtype == np.bool_ else raw.view(dtype)).reshape(shape)
    found = decode(encode(array), "t")
    assert found.dtype == array.dtype and found.shape == shape and found.tobytes() == array.tobytes()
    assert found.flags.writeable


def test_a_file_round_trips(tmp_path):
    array = np.arange(12, dtype=np.uint8).reshape(3, 4)
    write_tensor(tmp_path / "t.nxrt", array)
    assert read_tensor(tmp_path / "t.nxrt").tobytes() == array.tobytes()


@pytest.mark.parametrize("data, said", [
    (b"NXRTCF02" + TWO_FLOATS[8:], "not a .nxrt tensor (no NXRTCF01 magic)"),
    (b"NXRT", "not a .nxrt tensor"),
    (TWO_FLOATS[:8] + b"\x08" + TWO_FLOATS[9:], "unsupported tensor dtype code 8"),
    (TWO_FLOATS[:8] + b"\x10" + TWO_FLOATS[9:], "unsupported tensor dtype code 16"),
    (TWO_FLOATS[:20], "ends inside its header"),
    (TWO_FLOATS[:29] + b"\x09" + TWO_FLOATS[30:] + b"\x00", "payload length 9 is not 8 for float32[1, 2]"),
    (TWO_FLOATS[:-1], "ends inside its payload: 7 payload bytes, 8 declared"),
    (TWO_FLOATS + b"\x00", "trailing bytes: 9 payload bytes, 8 declared"),
])
def test_a_malformed_file_is_one_line_naming_it(data, said):
    with pytest.raises(TensorFileError) as raised:
        decode(data, "case/output_0.nxrt")
    assert str(raised.value).startswith("case/output_0.nxrt: ") and said in str(raised.value)


def test_a_missing_file_and_an_uncarried_dtype_are_refused(tmp_path):
    with pytest.raises(TensorFileError, match="cannot read"):
        read_tensor(tmp_path / "absent.nxrt")
    with pytest.raises(TensorFileError, match="carries no complex64"):
        encode(np.zeros(2, dtype=np.complex64))
