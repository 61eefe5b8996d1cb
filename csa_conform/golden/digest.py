"""The digests a golden file carries: sha256 of every dataset, of every case, of the manifest.

Each is sha256 over canonical bytes (little-endian C-order data, or sorted
compact JSON), so a changed byte, attribute or link changes a digest.
"""

from __future__ import annotations

import hashlib
import json
from typing import Iterable, Mapping

import numpy as np

from csa_conform.golden.layout import MANIFEST_DIGEST, TensorEntry


def array_sha256(array: np.ndarray) -> str:
    """sha256 of the raw little-endian C-order bytes (the attribute every dataset carries)."""
    array = little_endian(array)
    return hashlib.sha256(array.reshape(-1).view(np.uint8)).hexdigest()  # the buffer itself, not a copy


def little_endian(array) -> np.ndarray:
    array = np.asarray(array, order="C")
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array


def _canonical_sha256(document) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def case_digest(
    case_id: str,
    attrs: dict,
    output_names: Iterable[str],
    family: str,
    seed: int | None,
    description: str,
    history: TensorEntry | None,
    steps: Iterable[tuple[str | None, tuple[int, int] | None, Iterable[TensorEntry]]],
) -> str:
    """The case_sha256 attribute: everything that defines a case, in canonical JSON.

    Steps are (expect_error, current_kv window rows, tensors); each tensor
    contributes its step-relative path, dtype, shape and data sha256, so a
    changed byte in a dataset, an attribute or a link all change it.
    """
    document = {
        "case": case_id,
        "attrs": attrs,
        "output_names": list(output_names),
        "family": family,
        "seed": seed,
        "description": description,
        "kv_history": None if history is None else history.record(),
        "steps": [
            {
                "expect_error": expect_error,
                "current_kv_rows": None if window is None else list(window),
                "tensors": sorted(entry.record() for entry in tensors),
            }
            for expect_error, window, tensors in steps
        ],
    }
    return _canonical_sha256(document)


def manifest_digest(root_attrs: Mapping[str, str | int | float], cases: Mapping[str, str]) -> str:
    """The manifest_sha256 root attribute: root provenance plus every case's case_sha256."""
    root = {key: value for key, value in root_attrs.items() if key != MANIFEST_DIGEST}
    return _canonical_sha256({"root": root, "cases": dict(cases)})

