"""The mutation score and the ``mutate`` section of the results document, for one run or its shards merged.

score = killed / judged, where a fault or a hang kills (the gate saw the
mutant break something) and judged leaves out the mutants that did not build
(the compiler, not the suite, caught them). It is given per operator and per
file, and every survivor is listed with its source line before and after the
change, as a coverage report lists an unexecuted line.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from csa_conform.mutate.judge import BUILD_FAILED, FAULT, HANG, KILLED, SURVIVED

COUNTED = (KILLED, FAULT, HANG, SURVIVED, BUILD_FAILED)


def tally(entries: Iterable[dict]) -> dict[str, Any]:
    """Counts of each verdict over mutant entries, with ``judged`` and ``score`` (null when none was judged)."""
    counts = dict.fromkeys(COUNTED, 0)
    for entry in entries:
        counts[entry["verdict"]] += 1
    killing = counts[KILLED] + counts[FAULT] + counts[HANG]
    judged = killing + counts[SURVIVED]
    return {"mutants": sum(counts.values()), "killed": counts[KILLED], "faults": counts[FAULT],
            "hangs": counts[HANG], "survived": counts[SURVIVED], "build_failures": counts[BUILD_FAILED],
            "judged": judged, "score": round(killing / judged, 6) if judged else None}


def grouped(entries: Sequence[dict], field: str) -> dict[str, dict[str, Any]]:
    keys = sorted({entry[field] for entry in entries})
    return {key: tally(entry for entry in entries if entry[field] == key) for key in keys}


def mutate_section(entries: list[dict], run: dict[str, Any]) -> dict[str, Any]:
    """The document's ``mutate`` object: the run's parameters (``run``), the totals, the tables and the
    mutants (in id order, so shards merge back into the unsharded run's list)."""
    entries = sorted(entries, key=lambda entry: entry["id"])
    return {**run, "summary": {**tally(entries), "cached": sum(1 for entry in entries if entry.get("cached"))},
            "by_operator": grouped(entries, "operator"), "by_file": grouped(entries, "file"), "mutants": entries}


def below(section: dict[str, Any]) -> bool:
    """Whether the score misses the run's --min-score. A run that judged nothing (``--since`` on a change that
    touches no kernel file) has nothing to gate and passes."""
    minimum, score = section.get("min_score"), section["summary"]["score"]
    return minimum is not None and score is not None and score < minimum


def merge_sections(sections: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Shards' sections as the unsharded run's: the mutants together, totals recounted, times summed."""
    first = sections[0]
    run = {key: value for key, value in first.items() if key not in ("summary", "by_operator", "by_file", "mutants")}
    run["seconds"] = round(sum(section.get("seconds", 0.0) for section in sections), 3)
    run["judged_now"] = sum(section.get("judged_now", 0) for section in sections)
    augments = [section["augment"] for section in sections if section.get("augment")]
    if augments:
        run["augment"] = {**augments[0], "survivors": [entry for augment in augments for entry in augment["survivors"]]}
    return mutate_section([entry for section in sections for entry in section["mutants"]], run)


def percent(score: float | None) -> str:
    return "n/a" if score is None else f"{100 * score:.1f}%"
