"""specs/golden-file.md describes goldens/ci.h5 as it is: every attribute the file carries is in
the spec's table, and the digests recomputed from the spec's text alone (plain h5py, not the
package's reader) are the ones stored."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "golden-file.md"
CI = ROOT / "goldens" / "ci.h5"


def documented_attributes() -> dict[str, set[str]]:
    rows = re.findall(r"^\| `?([/\w]+)`? \| `(\w+)` \|", SPEC.read_text(), flags=re.MULTILINE)
    table: dict[str, set[str]] = {}
    for kind, name in rows:
        table.setdefault("root" if kind == "/" else kind, set()).add(name)
    return table


def spec_digest(value) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def tensor_record(path: str, dataset: h5py.Dataset) -> list:
    dtype = dataset.dtype.newbyteorder("<") if dataset.dtype.byteorder == ">" else dataset.dtype
    return [path, dtype.str, list(dataset.shape), text(dataset.attrs["sha256"])]


def datasets_by_path(group: h5py.Group, prefix: str = ""):
    """Every (relative path, dataset), a hard-linked dataset once per path (visititems lists it once)."""
    for name, item in group.items():
        if isinstance(item, h5py.Group):
            yield from datasets_by_path(item, f"{prefix}{name}/")
        else:
            yield f"{prefix}{name}", item


def spec_case_digest(case_id: str, group: h5py.Group) -> str:
    steps = []
    for name in sorted(group["steps"]):
        step = group["steps"][name]
        tensors = [tensor_record(path, dataset) for path, dataset in datasets_by_path(step)]
        rows = step.attrs.get("current_kv_rows")
        steps.append({
            "expect_error": text(step.attrs["expect_error"]) if "expect_error" in step.attrs else None,
            "current_kv_rows": None if rows is None else [int(row) for row in rows],
            "tensors": sorted(tensors),
        })
    attrs = group.attrs
    return spec_digest({
        "case": case_id,
        "attrs": json.loads(text(attrs["attrs_json"])),
        "output_names": json.loads(text(attrs["output_names_json"])),
        "family": text(attrs.get("family", "")),
        "seed": int(attrs["seed"]) if "seed" in attrs else None,
        "description": text(attrs.get("description", "")),
        "kv_history": tensor_record("kv_history", group["kv_history"]) if "kv_history" in group else None,
        "steps": steps,
    })


def test_every_attribute_of_the_committed_file_is_documented():
    table = documented_attributes()
    seen: dict[str, set[str]] = {"root": set(), "case": set(), "step": set(), "dataset": set()}
    with h5py.File(CI, "r") as handle:
        seen["root"].update(handle.attrs)
        for case in handle["cases"].values():
            seen["case"].update(case.attrs)
            for step in case["steps"].values():
                seen["step"].update(step.attrs)
        handle.visititems(lambda _, item: seen["dataset"].update(item.attrs) if isinstance(item, h5py.Dataset) else None)
    assert seen == table
    assert "| `/` | `schema_version` | integer | `2` " in SPEC.read_text()


def test_digests_recomputed_from_the_spec_match_the_committed_file():
    with h5py.File(CI, "r") as handle:
        assert int(handle.attrs["schema_version"]) == 2 and isinstance(handle.attrs["schema_version"], np.integer)
        digests = {}
        for case_id, group in handle["cases"].items():
            digests[case_id] = spec_case_digest(case_id, group)
            assert digests[case_id] == text(group.attrs["case_sha256"]), case_id
        root = {}
        for key, value in handle.attrs.items():
            if key != "manifest_sha256":
                root[key] = value.item() if isinstance(value, np.generic) else text(value)
        assert spec_digest({"root": root, "cases": digests}) == text(handle.attrs["manifest_sha256"])


def test_no_link_in_the_committed_file_is_anything_but_hard():
    kinds = set()
    with h5py.File(CI, "r") as handle:
        def visit(group: h5py.Group) -> None:
            for name in group:
                kinds.add(type(group.get(name, getlink=True)).__name__)
                item = group[name]
                if isinstance(item, h5py.Group):
                    visit(item)
                else:
                    assert not item.is_virtual and item.external is None
        visit(handle)
    assert kinds == {"HardLink"}
