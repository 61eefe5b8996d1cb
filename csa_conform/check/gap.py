"""How far the official numerics are from the CPU reference: both profiles on the same inputs, stage by stage.

For every step of a golden file, the stored inputs run under the reference
profile and under another one (``official`` by default), chained (the other
profile's stages read its own upstream payloads, as a pipeline of such
kernels would) or isolated (each of its kernel launches reads the reference's
upstream payloads, the stages fused into one launch each other's, so a
launch's difference is its own arithmetic's, as an isolated device run shows
it: selection from its own scores); every stage payload
both produce is compared with csa_conform.compare.errorstats, aggregated over the
file per stage and tensor (writeback repeats other stages' payloads and is
left out). Steps either profile rejects are counted, not compared. A Python provider
(``gap --kernels python:…``, csa_conform.device.provider) can take the actual side, measured against
any profile: how far an implementation of the official numerics sits from the NumPy profile.
"""

from __future__ import annotations

from csa_conform._base.terminal import one_line
from csa_conform.check.options import RunOptions
from csa_conform.compare.errorstats import ISOLATED, Gap
from csa_conform.device.provider import ProviderStageFailed
from csa_conform.errors import ContractError, CsaConformError, UsageError, invalid_case
from csa_conform.golden import GoldenFile
from csa_conform.profiles.numerics import runner
from csa_conform.spec import Mode


class ProviderSteps:
    """A Python provider's steps in a profile runner's shape: each step's stages chained on the provider, or
    (``upstream``, the expected profile's payloads) every stage fed those, as ``gap --mode isolated`` asks."""

    def __init__(self, options: RunOptions):
        self.chained = options.runner(Mode.CHAINED)
        self.isolated = options.runner(Mode.ISOLATED)

    def __call__(self, attrs, inputs, output_names, upstream=None):
        runner = self.chained if upstream is None else self.isolated
        return runner.run_step(attrs, inputs, output_names, reference=upstream)


def measure_file(gap: Gap, path: str, case_ids: list[str] | None = None, engine: str | None = None,
                 actual: ProviderSteps | None = None) -> dict[str, str]:
    """Add every step of every (chosen) case of ``path`` to ``gap``, the oracle run by ``engine``; returns
    the cases that could not be read as golden cases (csa_conform.errors.invalid_case), each with its
    one-line reason, which add nothing. ``actual`` (a provider's steps) replaces the actual profile's."""
    expected_run, actual_run = runner(gap.expected, engine), actual or runner(gap.actual, engine)
    invalid = {}
    with GoldenFile(path) as golden:
        golden_ids = golden.case_ids() if case_ids is None else case_ids
        for case_id in golden_ids:
            case_gap = Gap(gap.expected, gap.actual, gap.mode)
            try:
                _measure_case(case_gap, golden, case_id, expected_run, actual_run)
            except CsaConformError as error:
                if not invalid_case(error):
                    raise
                invalid[case_id] = one_line(str(error))
                continue
            gap.merge(case_gap)
    return invalid


def _measure_case(gap: Gap, golden: GoldenFile, case_id: str, expected_run, actual_run) -> None:
    info = golden.case_info(case_id)
    golden.verify_case_checksums(case_id)
    for index in range(info.step_count):
        step = golden.read_step(case_id, index)
        gap.steps += 1
        outputs = list(info.output_names)
        expected = _run(expected_run, info.attrs, step.inputs, outputs)
        upstream = expected.stages if gap.mode == ISOLATED and expected is not None else None
        actual = _run(actual_run, info.attrs, step.inputs, outputs, upstream)
        if expected is None or actual is None:
            gap.rejected_both += expected is None and actual is None
            gap.rejected_expected_only += expected is None and actual is not None
            gap.rejected_actual_only += actual is None and expected is not None
            continue
        gap.add_step(case_id, index, expected.stages, actual.stages)
    gap.cases.append(case_id)


def _run(run, attrs, inputs, outputs, upstream=None):
    """One step's payloads, or None where the step is rejected (a provider that fails is no rejection)."""
    try:
        return run(attrs, inputs, outputs, upstream=upstream) if upstream is not None else run(attrs, inputs, outputs)
    except ProviderStageFailed as error:
        raise UsageError(f"the provider failed at {error.stage}: {error}") from None
    except ContractError:
        return None


# --- the table -------------------------------------------------------------------------------

COLUMNS = (
    "stage", "tensor", "identical steps", "identical elements",
    "abs max / mean / median / p99 / p99.9", "rel max / mean / median / p99 / p99.9",
    "ulp max / mean / median / p99 / p99.9", "cos dist max", "-inf mask", "sets / argmax",
)


def number(value: float) -> str:
    """Three significant digits; integers (ULPs, counts) up to 1e6 as they are."""
    if value == 0:
        return "0"
    if float(value).is_integer() and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.3g}"


def table_rows(entry: dict) -> list[list[str]]:
    """One row per stage/tensor of a gap entry, cells as COLUMNS names them."""
    rows = []
    for tensor in entry["tensors"]:
        cells = [
            tensor["stage"], tensor["tensor"],
            f"{tensor['steps_identical']}/{tensor['steps']}", f"{tensor['identical']}/{tensor['elements']}",
        ]
        if tensor["kind"] == "float":
            for measure in ("abs", "rel", "ulp"):
                stats = tensor[measure]
                cells.append(" / ".join(number(stats[name]) for name in ("max", "mean", "median", "p99", "p99.9")))
            cells.append(number(tensor["cosine_distance_max"]))
            cells.append("equal" if tensor["neginf_mask_mismatches"] == 0 else f"{tensor['neginf_mask_mismatches']} differ")
        else:
            cells += ["", "", "", "", ""]
        cells.append(_extra(tensor))
        rows.append(cells)
    return rows


def _extra(tensor: dict) -> str:
    if "sets" in tensor:
        sets = tensor["sets"]
        return (f"rows identical {sets['rows_identical']}/{sets['rows']}, overlap min {number(sets['overlap_min'])} "
                f"mean {number(sets['overlap_mean'])}, {sets['rank_changes']} rank changes")
    if "argmax" in tensor:
        argmax = tensor["argmax"]
        return f"argmax same in {argmax['identical']}/{argmax['rows']} rows"
    return ""


def markdown_table(entry: dict) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(entry)]
    return "\n".join(lines)


def headline(entry: dict, path: str) -> str:
    rejected = entry["rejected"]
    counts = ", ".join(f"{count} {who.replace('_', ' ')}" for who, count in rejected.items())
    return (f"gap {entry['expected_profile']} -> {entry['actual_profile']} ({entry['mode']}) on {path}: "
            f"{entry['compared_steps']}/{entry['steps']} steps compared (rejected: {counts})")
