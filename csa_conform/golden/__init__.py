"""The HDF5 golden store: one file, many cases, every object covered by a digest (specs/golden-file.md).

``GoldenFile`` reads (csa_conform.golden.reader), ``write_goldens`` writes
(csa_conform.golden.writer); the layout and its values are in
csa_conform.golden.layout, the digests in csa_conform.golden.digest, what a
reader refuses in csa_conform.golden.validation and the per-case index in
csa_conform.golden.streams.
"""

from csa_conform.errors import CorruptDataset
from csa_conform.golden.digest import array_sha256, case_digest, manifest_digest
from csa_conform.golden.layout import (
    CONTRACT,
    FORMAT,
    SCHEMA_VERSION,
    CaseInfo,
    GoldenCase,
    GoldenStep,
    TensorEntry,
)
from csa_conform.golden.reader import GoldenFile
from csa_conform.golden.writer import Compression, write_goldens

__all__ = [
    "CONTRACT",
    "FORMAT",
    "SCHEMA_VERSION",
    "CaseInfo",
    "Compression",
    "CorruptDataset",
    "GoldenCase",
    "GoldenFile",
    "GoldenStep",
    "TensorEntry",
    "array_sha256",
    "case_digest",
    "manifest_digest",
    "write_goldens",
]
