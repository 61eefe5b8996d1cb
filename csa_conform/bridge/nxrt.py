"""The ``.nxrt`` tensor file the runtime's conformance runner reads and writes (specs/bridge.md).

Eight bytes of magic ``NXRTCF01``, the ONNX data type as one byte, the rank
as a little-endian u32, each dimension as a u64, the payload length as a
u64, then the payload: the elements in C order, little-endian, nothing after
it. The runner refuses anything else, and so does this reader: a file a
runtime wrote is judged only once it has exactly that shape.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

from csa_conform.errors import TensorFileError

MAGIC = b"NXRTCF01"
HEADER = struct.Struct("<8sBI")  # magic, dtype code, rank
DIMENSION = struct.Struct("<Q")

# ONNX TensorProto.DataType codes the runner exchanges, with their numpy dtypes (bfloat16, 16, has none).
DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"), 2: np.dtype("u1"), 3: np.dtype("i1"), 4: np.dtype("<u2"), 5: np.dtype("<i2"),
    6: np.dtype("<i4"), 7: np.dtype("<i8"), 9: np.dtype("?"), 10: np.dtype("<f2"), 11: np.dtype("<f8"),
    12: np.dtype("<u4"), 13: np.dtype("<u8"),
}
CODES = {dtype: code for code, dtype in DTYPES.items()}

__all__ = ["CODES", "DTYPES", "MAGIC", "decode", "encode", "read_tensor", "write_tensor"]


def dtype_code(dtype) -> int:
    """The ONNX code of a numpy dtype the interchange carries."""
    code = CODES.get(np.dtype(dtype).newbyteorder("<"))
    if code is None:
        raise TensorFileError(f"the .nxrt interchange carries no {np.dtype(dtype)} tensor")
    return code


def encode(array: np.ndarray) -> bytes:
    """The file's bytes for ``array``."""
    array = np.asarray(array)
    code = dtype_code(array.dtype)
    payload = np.ascontiguousarray(array, dtype=DTYPES[code]).tobytes()
    dims = b"".join(DIMENSION.pack(extent) for extent in array.shape)
    return HEADER.pack(MAGIC, code, array.ndim) + dims + DIMENSION.pack(len(payload)) + payload


def decode(data: bytes, where: str) -> np.ndarray:
    """The tensor a file's bytes hold; ``where`` names the file in the one-line error."""
    if len(data) < HEADER.size or data[:8] != MAGIC:
        raise TensorFileError(f"{where}: not a .nxrt tensor (no {MAGIC.decode()} magic)")
    _, code, rank = HEADER.unpack_from(data)
    if code not in DTYPES:
        raise TensorFileError(f"{where}: unsupported tensor dtype code {code}")
    offset = HEADER.size
    if len(data) < offset + DIMENSION.size * (rank + 1):
        raise TensorFileError(f"{where}: ends inside its header ({len(data)} bytes, rank {rank})")
    shape = tuple(DIMENSION.unpack_from(data, offset + DIMENSION.size * axis)[0] for axis in range(rank))
    offset += DIMENSION.size * rank
    (length,) = DIMENSION.unpack_from(data, offset)
    offset += DIMENSION.size
    dtype = DTYPES[code]
    expected = math.prod(shape) * dtype.itemsize
    if length != expected:
        raise TensorFileError(f"{where}: payload length {length} is not {expected} for {dtype.name}{list(shape)}")
    if len(data) - offset != length:
        found = len(data) - offset
        raise TensorFileError(f"{where}: {'ends inside its payload' if found < length else 'trailing bytes'}: "
                              f"{found} payload bytes, {length} declared")
    return np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape).copy()


def read_tensor(path: Path) -> np.ndarray:
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise TensorFileError(f"{path}: cannot read ({error.strerror or type(error).__name__})") from None
    return decode(data, str(path))


def write_tensor(path: Path, array: np.ndarray) -> None:
    Path(path).write_bytes(encode(array))
