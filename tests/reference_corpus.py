"""Loader for the CPU reference kernel's outputs kept in tests/reference (README there)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"


def reference_file(name: str):
    path = REFERENCE_DIR / name
    return np.load(path)


def case_files() -> list[str]:
    return sorted(path.name for path in REFERENCE_DIR.glob("*.npz") if not path.name.startswith("prim_"))


def step_prefixes(archive) -> list[str]:
    if "steps" not in archive.files:
        return [""]
    return [f"step{k:03d}/" for k in range(int(archive["steps"]))]


def step_inputs(archive, prefix: str) -> dict[str, np.ndarray]:
    """Inputs of one step, resolving the stream aliases (kv_history rows, earlier outputs)."""
    names = json.loads(str(archive[prefix + "input_names_json"]))
    absent = set(json.loads(str(archive[prefix + "absent_json"])))
    aliases = json.loads(str(archive[prefix + "alias_json"])) if prefix + "alias_json" in archive.files else {}
    inputs = {}
    for name in names:
        if name in absent:
            continue
        key = "in/" + name
        if prefix + key in archive.files:
            inputs[name] = archive[prefix + key]
        elif key in aliases:
            alias = aliases[key]
            value = archive[alias["key"]]
            if "rows" in alias:
                value = value[:, alias["rows"][0] : alias["rows"][1]]
            inputs[name] = value
    return inputs


def expected_error(archive, prefix: str) -> str | None:
    """The operator's message, without the runtime's `kernel execution failed: ` wrapper."""
    if prefix + "error" not in archive.files:
        return None
    return str(archive[prefix + "error"]).removeprefix("kernel execution failed: ")
