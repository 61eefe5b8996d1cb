"""Reference message text: the operator prefix, Rust ``{:?}`` renderings, the two error kinds.

A rejection must read byte for byte as the reference's, so the formatting Rust's
Debug derives give it for free is spelled out once here for every check to share.
"""

from __future__ import annotations

import numpy as np

from csa_conform.errors import OP
HARNESS = "csa-conform harness check (not a reference message)"


def debug_shape(shape) -> str:
    """Rust ``{:?}`` of a ``&[usize]`` shape: ``[1, 2, 3]``, ``[]`` for a scalar."""
    return "[" + ", ".join(str(int(extent)) for extent in shape) + "]"


_DTYPE_NAMES = {
    "float16": "Float16",
    "float32": "Float32",
    "float64": "Float64",
    "int8": "Int8",
    "int16": "Int16",
    "int32": "Int32",
    "int64": "Int64",
    "uint8": "Uint8",
    "uint16": "Uint16",
    "uint32": "Uint32",
    "uint64": "Uint64",
    "bool": "Bool",
}


def dtype_name(dtype) -> str:
    """The reference's ``DataType`` Debug name for a NumPy dtype (``Undefined`` for none)."""
    if dtype is None:
        return "Undefined"
    name = np.dtype(dtype).name
    return _DTYPE_NAMES.get(name) or name[:1].upper() + name[1:]


def debug_dims(shape) -> str:
    """Rust ``{:?}`` of an IR shape: ``[Static(2), Symbolic(SymbolId(?))]`` (ids unknown)."""
    return "[" + ", ".join(debug_dim(extent) for extent in shape) + "]"


def debug_dim(extent) -> str:
    return "Symbolic(SymbolId(?))" if extent is None else f"Static({extent})"
