"""The golden file's layout (specs/golden-file.md, schema_version 2) and the values it holds::

    /                                   format, schema_version, created_by, oracle_version,
                                        numpy_version, contract (generate adds suite,
                                        suite_seed, selection), manifest_sha256
    /cases/<case_id>                    attrs_json, output_names_json, family, seed,
                                        description, case_sha256
    /cases/<case_id>/kv_history         (optional) the rows current_kv windows are taken from
    /cases/<case_id>/steps/<kkkk>       expect_error on a step the oracle rejects;
                                        current_kv_rows [start, stop] on a windowed step
    /cases/<case_id>/steps/<kkkk>/inputs/<name>
    /cases/<case_id>/steps/<kkkk>/stages/<stage>/<name>
    /cases/<case_id>/steps/<kkkk>/outputs/<name>

Files are byte-reproducible: cases are written in the order given with a
fixed attribute order and no timestamps. Identical arrays are stored once
and hard-linked. Readers open every object through ``GoldenFile``, which
turns whatever HDF5 says about a damaged file into one ``GoldenFormatError``
naming the file and the object; schema_version 1 files (the layout without
digests, as other tools write it) are still read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FORMAT = "csa-conform-goldens"
SCHEMA_VERSION = 2
# schema_version 1: the same layout without case and manifest digests or windows.
READABLE_SCHEMAS = (1, SCHEMA_VERSION)
CONTRACT = "pkg.nxrt::CompressedSparseAttention v1"
# HDF5 1.10 object headers and chunk indexes: a quarter smaller than the
# 1.8-compatible default for files of many small datasets; needs HDF5 >= 1.10.
LIBVER = ("v110", "v110")
KV_HISTORY = "kv_history"
CASE_DIGEST = "case_sha256"
MANIFEST_DIGEST = "manifest_sha256"
WINDOW = "current_kv_rows"
STEP_GROUPS = ("inputs", "stages", "outputs")


@dataclass
class GoldenStep:
    """One operator invocation: what went in, what came out, and the stage payloads."""

    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    stages: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    expect_error: str | None = None


@dataclass
class GoldenCase:
    """A named stream of steps sharing node attributes.

    ``kv_history`` (optional) is the kv row of every position; a step whose
    current_kv is a window of it is stored as the window's rows, not a copy.
    """

    case_id: str
    attrs: dict
    output_names: tuple[str, ...]
    steps: list[GoldenStep]
    family: str = ""
    seed: int | None = None
    description: str = ""
    kv_history: np.ndarray | None = None


@dataclass(frozen=True)
class CaseInfo:
    """A case's attributes without its arrays (cheap listing for inspect/verify)."""

    case_id: str
    attrs: dict
    output_names: tuple[str, ...]
    family: str
    seed: int | None
    description: str
    step_count: int
    errors: tuple[int, ...]


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a step as the file declares it, unread.

    ``sha256`` is None for a current_kv window (its rows are checked as part
    of the kv history).
    """

    path: str
    dtype: np.dtype
    shape: tuple[int, ...]
    sha256: str | None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=object)) * self.dtype.itemsize

    def record(self) -> list:
        return [self.path, self.dtype.str, list(self.shape), self.sha256]

