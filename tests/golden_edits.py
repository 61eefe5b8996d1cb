"""Edits of a golden file that keep it valid (digests resealed), as another tool writing goldens would.

Only a replay can then tell the stored payload from the oracle's.
"""

from __future__ import annotations

from pathlib import Path

from csa_conform.golden import GoldenFile, write_goldens


def reseal(path: Path, edit) -> None:
    """Edit the cases of a file and write it anew, digests and all, as a tool making valid goldens would."""
    with GoldenFile(path) as golden:
        cases = {case: golden.read_case(case) for case in golden.case_ids()}
        provenance = {key: golden.provenance[key] for key in ("suite", "suite_seed", "selection")}
    edit(cases)
    write_goldens(path, cases.values(), force=True, provenance=provenance)


def rewrite(path: Path, dataset: str, edit) -> None:
    """Change one tensor and reseal the file, so only replay can tell."""
    _, case_id, _, step, tensor = dataset.split("/", 4)
    group, name = tensor.rsplit("/", 1)

    def change(cases):
        changed = cases[case_id].steps[int(step)]
        arrays = {"outputs": changed.outputs, "inputs": changed.inputs}.get(group) or changed.stages[group.split("/")[1]]
        arrays[name] = arrays[name].copy()
        edit(arrays[name])

    reseal(path, change)
